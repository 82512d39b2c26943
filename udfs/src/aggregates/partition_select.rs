//! `dp_partition_select(value, epsilon[, delta[, neighbours]])` → Boolean: Gaussian partition
//! selection.
//! Internal: the session's GROUP BY rewrite keeps a group only when this is true, so that the
//! set of released groups is itself differentially private (PRIVACY.md, "What may be released").
//!
//! # Mechanism
//! For each group, the number c of rows reaching the aggregate (after its FILTER; NULL values
//! included: `value` only gives the aggregate an argument) is released as c̃ = c + noise by the
//! Gaussian mechanism of sensitivity 1 and μ = gaussian_mu(ε, δ/2) (actual σ ≥ 1/μ), and the group
//! is kept iff c̃ ≥ τ with
//!
//! τ = 1 + σ·Φ⁻¹(1 − δ/2) + 3g,
//!
//! g the mechanism's power-of-two grid (g ≈ σ·2^−20). This is the Gaussian thresholding of
//! Desfontaines, Voss, Gipson and Mandayam, "Differentially private partition selection"
//! (PoPETs 2022), as in Google's ZetaSQL/differential-privacy libraries.
//!
//! # Cost: `[Gaussian { μ }, Delta { δ/2 }]`
//! Let D' = D plus one row r (add/remove neighbours; removal is symmetric), r in group k.
//! - If k exists in D, only c_k changes, by 1: the vector of noisy counts is a μ-GDP release,
//!   and the kept set with its decisions is post-processing of it.
//! - If k is new (c_k = 1 in D', absent from D), every other group has the same count in both,
//!   so the outputs differ only through the event "k is kept", whose probability is at most δ/2:
//!   with the continuous Gaussian, P[1 + σZ ≥ 1 + σΦ⁻¹(1 − δ/2)] = Φ(−Φ⁻¹(1 − δ/2)) = δ/2.
//!
//! So the selection is (ε', δ' + δ/2)-DP for every (ε', δ') on the μ-GDP curve: the profile is the
//! Gaussian event plus an additive δ/2, and at δ the call is (ε, δ)-DP since μ is calibrated at δ/2.
//!
//! The noise is discrete (g·Y, Y a discrete Gaussian of parameter s = σ/g, and c is rounded to the
//! grid first, which moves it by at most g/2), so the δ/2 bound uses the tail bound
//! P[Y ≥ m] ≤ P[N(0, s²) ≥ m − 1] for integers m ≥ 1 (Canonne, Kamath, Steinke 2020): the
//! numerator Σ_{y≥m} e^{−y²/2s²} ≤ ∫_{m−1}^∞ e^{−x²/2s²} dx since the density decreases on
//! [y − 1, y], and the normaliser Σ_{y∈ℤ} e^{−y²/2s²} = s√(2π)·Σ_k e^{−2π²s²k²} ≥ s√(2π) (Poisson
//! summation). Hence P[keep | c = 1] ≤ Φ(−(τ − 1 − 3g/2)/σ) ≤ δ/2; the remaining 1.5g ≫ the
//! floating-point error of τ.
//!
//! Under `replace` and `replace_public_n` the changed row stays in its group (the session sets
//! these modes only with public GROUP BY keys): no count changes, and the `add_remove`
//! calibration above is used unchanged.
//!
//! # `replace_private_keys`: sensitivity √2 and a tail of δ/4, same cost
//! With a private GROUP BY key, D' replaces row r (group a) by r' (group b ≠ a; a = b changes no
//! count). Then c_a drops by 1 and c_b rises by 1, so a group can vanish (c_a = 1) and another
//! appear (c_b = 0 in D) in the same step. The calibration: μ = gaussian_mu(ε, δ/2) as before,
//! the noisy counts with L2 sensitivity √2 (σ = (√2 + √2·g)/μ: two counts move by 1 each, plus
//! one grid step each), and
//!
//! τ = 1 + σ·Φ⁻¹(1 − δ/4) + 3g,
//!
//! so that a group of one row is kept with probability q ≤ δ/4 (same tail bound as above).
//! Proof that the recorded cost `[Gaussian { μ }, Delta { δ/2 }]` still holds. Let V be the noisy
//! counts of the groups present in both D and D' (all groups but a vanishing a or an appearing b),
//! h the thresholding of V, and (ε', δ') any point of the μ-GDP curve.
//! - If a and b exist in both, only V changes, in two coordinates by 1: ‖Δ‖₂ = √2, calibrated:
//!   μ-GDP.
//! - Otherwise V changes in at most one coordinate by 1 (≤ √2), so
//!   P[h(V_D) ∈ S] ≤ e^ε'·P[h(V_D') ∈ S] + δ'; the outputs differ besides only by the decisions
//!   on a vanishing a (in D) and an appearing b (in D'), each a group of one row, kept with
//!   probability ≤ q independently of V. With x = P[h(V_D') ∈ S]:
//!   P[M(D) ∈ S] ≤ q + min(1, e^ε'·x + δ') and P[M(D') ∈ S] ≥ (1 − q)·x. If e^ε'·x ≤ 1, then
//!   P[M(D) ∈ S] − e^ε'·P[M(D') ∈ S] ≤ q + δ' + q·e^ε'·x ≤ 2q + δ'; otherwise it is
//!   ≤ q + 1 − (1 − q) = 2q. The same holds with D and D' swapped.
//!
//! So the selection is (ε', δ' + 2q)-DP with 2q ≤ δ/2, for every (ε', δ') on the μ-GDP curve: the
//! same profile as under `add_remove`, at the price of √2 more noise and a threshold at the δ/4
//! tail (test `partition_select_private_keys_tail`).
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::declaration::{self, Aggregate, DELTA, EPSILON, NEIGHBOURS, ROWS, UnitRule};
use super::params::{Neighbours, Params, SQRT_2_UP, representable};
use crate::mechanisms::GaussianMechanism;
use crate::mechanisms::exact::{FixedPoint, release_exact};
use crate::noise::SecureRng;
use crate::privacy::normal::phi_inv;
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// `dp_partition_select(value, epsilon, delta, neighbours)`: internal, used by the session's
/// GROUP BY rewrite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionSelectParams {
    pub epsilon: f64,
    pub delta: f64,
    /// `replace_private_keys` changes the calibration (sensitivity √2, tail δ/4); the other
    /// modes calibrate as `add_remove` (a replaced row that stays in its group changes no count).
    pub neighbours: Neighbours,
}

impl PartitionSelectParams {
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = Params::new(&DP_PARTITION_SELECT, args)?;
        Ok(Self {
            epsilon: p.epsilon()?,
            delta: p.delta()?,
            neighbours: p.neighbours()?,
        })
    }
    /// μ of the noisy counts: gaussian_mu(ε, δ/2) (the other δ/2 pays for groups that appear or
    /// vanish), in every mode.
    pub fn mu(&self) -> Result<f64, PrivacyError> {
        gaussian_mu(self.epsilon, self.delta / 2.0)
    }
    /// The keep probability allowed for a group of one row (one unit): δ/2, δ/4 under
    /// `replace_private_keys` (two such events per neighbour: see [`super::partition_select`]),
    /// δ/(2K) under `units:K:C`.
    pub fn tail(&self) -> f64 {
        if self.neighbours.moves_between_groups() {
            self.delta / 4.0
        } else {
            // Under `units:K:C` one unit can create K groups: δ/(2K) each (union bound).
            self.delta / 2.0 / self.neighbours.groups_per_unit() as f64
        }
    }
    /// `[Gaussian { μ }, Delta { δ/2 }]` in every mode; see [`super::partition_select`] for the
    /// argument. Builds the release too (as [`CountParams::cost`]).
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        SelectRelease::new(self)?;
        Ok(vec![
            Event::Gaussian { mu: self.mu()? },
            Event::Delta {
                delta: self.delta / 2.0,
            },
        ])
    }
}

/// The `dp_partition_select` UDAF (internal).
pub type DpPartitionSelect = DpUdaf<PartitionSelectParams>;

/// `dp_partition_select` as an [`AggregateUDF`].
pub fn dp_partition_select_udaf() -> AggregateUDF {
    DpPartitionSelect::udaf()
}

impl DpFunction for PartitionSelectParams {
    const NAME: &'static str = "dp_partition_select";
    fn spec() -> &'static Spec {
        &SPEC
    }
    fn declaration() -> &'static Aggregate {
        &DP_PARTITION_SELECT
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Any,
    returns: DataType::Boolean,
    shape: Shape {
        sum: false,
        sum_sq: false,
        count: false,
        rows: true,
    },
    release: |lits| {
        Ok(Arc::new(SelectRelease::new(
            &PartitionSelectParams::from_literals(lits)?,
        )?))
    },
    description: "Internal (used by the dpfusion session's GROUP BY rewrite): Gaussian partition \
         selection. True iff the group's row count plus discrete Gaussian noise (σ = 1/μ, μ = \
         gaussian_mu(epsilon, delta/2)) reaches 1 + σ·Φ⁻¹(1 − delta/2) (plus three grid steps), so \
         that a group made of a single row is released with probability at most delta/2 \
         (Desfontaines et al., PoPETs 2022). Under 'replace_private_keys' (a changed row can leave \
         one group and join another) the noise has sensitivity √2 and the threshold uses Φ⁻¹(1 − \
         delta/4): a group can vanish and another appear in one step. Cost in every mode: μ-GDP \
         plus an additive delta/2; (epsilon, delta)-DP in total.",
    example: "SELECT job, dp_count(job, 0.5) FROM salaries GROUP BY job \
         HAVING dp_partition_select(job, 0.5, 1e-6);",
    related: &[],
};

/// The release of a `dp_partition_select` call.
#[derive(Debug, Clone)]
pub(crate) struct SelectRelease {
    pub mech: GaussianMechanism,
    /// τ: keep iff the noisy count is ≥ τ.
    pub threshold: f64,
}

/// τ = 1 + σ·Φ⁻¹(1 − tail) + 3g (module docs), tail = δ/2 or δ/4
/// ([`PartitionSelectParams::tail`]). Φ⁻¹(1 − tail) is computed as −Φ⁻¹(tail), which keeps full
/// precision for small δ.
pub(crate) fn threshold(sigma: f64, granularity: f64, tail: f64) -> f64 {
    1.0 + sigma * -phi_inv(tail) + 3.0 * granularity
}

impl SelectRelease {
    /// The calibration (module docs); also called by [`PartitionSelectParams::cost`], so the
    /// accountant refuses exactly what the planner refuses.
    pub fn new(p: &PartitionSelectParams) -> Result<Self, PrivacyError> {
        let build = |epsilon: f64| {
            // μ at δ/2 in every mode (module docs).
            // Under `units:K:1` (units counted once per group): μ/√K (Neighbours::Units).
            let mu = p
                .neighbours
                .calibration_mu(gaussian_mu(epsilon, p.delta / 2.0)?);
            if p.neighbours.moves_between_groups() {
                // Two counts move by 1: ‖Δ‖₂ = √2, rounding slack √2 steps (module docs).
                GaussianMechanism::from_mu_with_slack(mu, SQRT_2_UP, SQRT_2_UP)
            } else {
                GaussianMechanism::from_mu(mu, 1.0)
            }
        };
        let delta = p.delta.to_string();
        let mech = representable(p.epsilon, ("delta", &delta), build)?;
        Ok(Self {
            threshold: threshold(mech.sigma, mech.granularity, p.tail()),
            mech,
        })
    }
}

impl Finalise for SelectRelease {
    fn shape(&self) -> Shape {
        SPEC.shape
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        None
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| Ok(release_exact(&self.mech, rng, p.rows as i128, 0)? >= self.threshold))
            .collect::<Result<Vec<bool>>>()?;
        Ok(Arc::new(BooleanArray::from(out)))
    }
    fn noise(&self) -> Option<String> {
        let s = crate::mechanisms::noise::short;
        Some(format!(
            "Gaussian σ = {} on the count, kept when ≥ {}",
            s(self.mech.sigma),
            s(self.threshold)
        ))
    }
}

/// The declaration of `dp_partition_select` (listed in [`super::registry::AGGREGATES`]).
pub const DP_PARTITION_SELECT: Aggregate = Aggregate {
    name: "dp_partition_select",
    summary: "internal: keeps a GROUP BY group only if its noisy row count passes a threshold",
    data: &[ROWS],
    params: &[EPSILON, DELTA, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Once,
    replaces: &[],
    internal: true,
    udaf: dp_partition_select_udaf,
    seeded: |seed| super::partition_select::DpPartitionSelect::with_insecure_seed(seed).into(),
    cost: |_, p| {
        declaration::no_data(
            PartitionSelectParams::from_literals,
            PartitionSelectParams::cost,
            p,
        )
    },
    noise: super::adapter::spec_noise::<PartitionSelectParams>,
};
