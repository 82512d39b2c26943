//! The neighbour relation of a call ([`Neighbours`]): what "one person's data" means for the
//! call, beside the privacy-loss profiles it parameterises ([`super::profile`]). Set by the
//! session from the table's registration (`dp.neighbours`) and the plan, never by users; the
//! SQL argument is the hidden trailing `neighbours` string, read by [`std::str::FromStr`] and
//! written by [`std::fmt::Display`] (one spelling, both ways).
use super::PrivacyError;

/// The neighbour relation a call is calibrated for. Set by the session from the table's
/// registration (`dp.neighbours`) and the plan, never typed by users; the SQL argument is the
/// hidden trailing `neighbours` string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Neighbours {
    /// `'add_remove'`: datasets differ by adding or removing one row (the default; sizes private).
    #[default]
    AddRemove,
    /// `'replace'`: datasets differ by changing one row's values, NULL-ness included. The row
    /// stays in its group: the session sets this mode only when every GROUP BY key is public
    /// (or there is no GROUP BY).
    Replace,
    /// `'replace_public_n'`: `replace`, and the number of rows reaching the aggregate is public.
    /// The session sets it only when no filter stands between the scan and the aggregate and the
    /// group keys are public; `dp_mean` then divides by the exact row count.
    ReplacePublicN,
    /// `'replace_private_keys'`: `replace` on a table whose GROUP BY key is not public, so the
    /// changed row can move from one group to another and change **two** groups' results (one
    /// loses a row, the other gains one). Per-group statistics are then calibrated to the L2
    /// sensitivity over both groups: √2 for counts, max(U − L, √2·max(|L|, |U|)) for sums (see
    /// each function's module docs); partition selection pays two tail events.
    ReplacePrivateKeys,
    /// `'units:K:C'`: the table declares a privacy unit (e.g. a customer id); neighbouring
    /// datasets differ by **all** the rows of one unit (add/remove a unit). The session bounds
    /// contributions before the aggregate (docs/PRIVACY.md, "Privacy units"): each unit reaches
    /// at most `groups` = K groups (L0) and, in each, at most `rows` = C of the call's rows (L∞),
    /// or one pre-aggregated value (then the session passes C = 1).
    ///
    /// Every add_remove calibration then holds at the unit level with μ replaced by
    /// μ / (√K·C) ([`Neighbours::calibration_mu`]): the call's per-group statistics change by at
    /// most C times their one-row change in each of at most K groups, so the L2 norm of the
    /// change of the vector of per-group statistics (grid rounding included: C·Δ + g ≤ C·(Δ + g))
    /// is at most √K·C times the one-row bound the add_remove calibration covers. This is the
    /// L0/L∞ sensitivity bound of Wilson et al., "Differentially Private SQL with Bounded User
    /// Contribution" (PoPETs 2020), §3 (Gaussian: Δ₂ = √L0·L∞). Partition selection counts units
    /// (C = 1) and gives each of the K groups a unit can create a tail of δ/(2K) (union bound;
    /// PipelineDP's and Privacy on Beam's Gaussian thresholding with max_partitions_contributed).
    Units { groups: u32, rows: u32 },
}

impl Neighbours {
    /// The accepted spellings, for error messages.
    pub const ACCEPTED: &'static str = "one of 'add_remove', 'replace', 'replace_public_n', \
         'replace_private_keys', 'units:K:C' (K, C integers ≥ 1)";
    /// The largest K or C a call accepts (a larger bound only adds noise).
    pub const MAX_BOUND: u32 = 1_000_000;

    pub fn parse(s: &str) -> Result<Self, PrivacyError> {
        match s {
            "add_remove" => Ok(Neighbours::AddRemove),
            "replace" => Ok(Neighbours::Replace),
            "replace_public_n" => Ok(Neighbours::ReplacePublicN),
            "replace_private_keys" => Ok(Neighbours::ReplacePrivateKeys),
            other if other.starts_with("units:") => {
                let mut it = other["units:".len()..].split(':');
                let bound = |x: Option<&str>| {
                    x.and_then(|v| v.parse::<u32>().ok())
                        .filter(|v| (1..=Self::MAX_BOUND).contains(v))
                };
                match (bound(it.next()), bound(it.next()), it.next()) {
                    (Some(groups), Some(rows), None) => Ok(Neighbours::Units { groups, rows }),
                    _ => Err(PrivacyError::invalid(
                        "neighbours",
                        format!("'{other}'"),
                        "'units:K:C' with integers 1 ≤ K, C ≤ 1000000",
                    )),
                }
            }
            other => Err(PrivacyError::invalid(
                "neighbours",
                format!("'{other}'"),
                Self::ACCEPTED,
            )),
        }
    }

    /// The mode's kind (`units` for every `units:K:C`); [`std::fmt::Display`] gives the whole
    /// spelling that [`Neighbours::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Neighbours::AddRemove => "add_remove",
            Neighbours::Replace => "replace",
            Neighbours::ReplacePublicN => "replace_public_n",
            Neighbours::ReplacePrivateKeys => "replace_private_keys",
            Neighbours::Units { .. } => "units",
        }
    }

    /// √K·C under `units:K:C` (1 otherwise), rounded up: the factor by which the L2 sensitivity
    /// of a call's per-group statistics grows when one unit, not one row, changes (variant
    /// docs; Wilson et al. 2020, §3).
    pub fn unit_factor(self) -> f64 {
        match self {
            Neighbours::Units { groups, rows } => {
                let f = sqrt_up(groups) * rows as f64;
                // Exact for a perfect square (an integer below 2^53); else round up.
                if f.fract() == 0.0 { f } else { f.next_up() }
            }
            _ => 1.0,
        }
    }

    /// The μ to calibrate the one-row (add_remove) noise with so that the call is μ-GDP at the
    /// unit level: μ / (√K·C), rounded down (σ = Δ/μ then rounds up). `mu` itself otherwise.
    pub fn calibration_mu(self, mu: f64) -> f64 {
        let f = self.unit_factor();
        if f == 1.0 { mu } else { (mu / f).next_down() }
    }

    /// The factor by which the **L1** sensitivity (pure ε-DP mechanisms: Laplace, the
    /// exponential mechanism) of a call's vector of per-group statistics grows over the one-row
    /// `add_remove` bound: K·C under `units:K:C` (a unit changes each of at most K groups by at
    /// most C times the one-row change, and L1 norms add: Σ over K groups of C·Δ = K·C·Δ; Wilson
    /// et al. 2020, §3, Laplace: Δ₁ = L0·L∞), 2 under `replace_private_keys` (a row leaving
    /// group a and joining group b changes two groups by at most Δ each: L1 ≤ 2Δ, where L2 gives
    /// √2Δ), 1 otherwise. Exact (an integer ≤ 10^12, exact in `f64`).
    pub fn pure_factor(self) -> f64 {
        match self {
            Neighbours::Units { groups, rows } => groups as f64 * rows as f64,
            Neighbours::ReplacePrivateKeys => 2.0,
            _ => 1.0,
        }
    }

    /// The factor K·C under `units:K:C`, 1 in every other mode: what multiplies the one-row
    /// `add_remove` **L1** sensitivity *and* the grid-rounding slack of a call's vector of
    /// per-group statistics when one unit, not one row, changes. Proof: the unit changes at most
    /// K groups, each by at most C of its rows, so each group's statistic moves by at most C·Δ₁
    /// (its rounded value by C·Δ₁ + g ≤ C·(Δ₁ + g) for the slack g), and L1 norms add over the
    /// groups: ≤ K·C·(Δ₁ + g) (Wilson et al., "Differentially Private SQL with Bounded User
    /// Contribution", PoPETs 2020, §3, Laplace: Δ₁ = L0·L∞). Unlike [`Self::pure_factor`] it is 1
    /// under `replace_private_keys`, whose two-group change each function bounds itself (its
    /// L1 sensitivity is not a multiple of the add_remove one). The Gaussian (L2) analogue is
    /// [`Self::calibration_mu`]. Exact (an integer ≤ 10^12, exact in `f64`).
    pub fn unit_l1_factor(self) -> f64 {
        match self {
            Neighbours::Units { .. } => self.pure_factor(),
            _ => 1.0,
        }
    }

    /// The number of groups one unit may reach (K under `units:K:C`, 1 otherwise).
    pub fn groups_per_unit(self) -> u32 {
        match self {
            Neighbours::Units { groups, .. } => groups,
            _ => 1,
        }
    }

    /// Any of the replace modes (`replace`, `replace_public_n`, `replace_private_keys`).
    pub fn is_replace(self) -> bool {
        matches!(
            self,
            Neighbours::Replace | Neighbours::ReplacePublicN | Neighbours::ReplacePrivateKeys
        )
    }

    /// Unit-level: `units:K:C`.
    pub fn is_units(self) -> bool {
        matches!(self, Neighbours::Units { .. })
    }

    /// `replace_private_keys`: one change can move a row between two groups.
    pub fn moves_between_groups(self) -> bool {
        matches!(self, Neighbours::ReplacePrivateKeys)
    }
}

impl std::str::FromStr for Neighbours {
    type Err = PrivacyError;
    fn from_str(s: &str) -> Result<Self, PrivacyError> {
        Neighbours::parse(s)
    }
}

impl std::fmt::Display for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Neighbours::Units { groups, rows } => write!(f, "units:{groups}:{rows}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// √k rounded up: exact for perfect squares, else the next float above the correctly rounded
/// root (so never below the real √k).
pub fn sqrt_up(k: u32) -> f64 {
    let s = (k as f64).sqrt();
    let r = s as u64;
    if r * r == k as u64 { s } else { s.next_up() }
}

#[cfg(test)]
mod tests {
    use super::Neighbours;

    /// K·C under `units:K:C` (e.g. 3·4 = 12), 1 in every other mode, `replace_private_keys`
    /// included (its factor 2 is [`Neighbours::pure_factor`]'s, not this one's).
    #[test]
    fn unit_l1_factor_is_k_times_c_under_units_only() {
        let units = |k, c| Neighbours::Units { groups: k, rows: c };
        assert_eq!(units(3, 4).unit_l1_factor(), 12.0);
        assert_eq!(units(1, 1).unit_l1_factor(), 1.0);
        assert_eq!(units(1_000_000, 1_000_000).unit_l1_factor(), 1e12);
        for nb in [
            Neighbours::AddRemove,
            Neighbours::Replace,
            Neighbours::ReplacePublicN,
            Neighbours::ReplacePrivateKeys,
        ] {
            assert_eq!(nb.unit_l1_factor(), 1.0, "{nb}");
        }
        assert_eq!(Neighbours::ReplacePrivateKeys.pure_factor(), 2.0);
    }
}
