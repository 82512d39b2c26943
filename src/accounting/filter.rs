//! Privacy filters: the admission rule of a private table (docs/ACCOUNTING.md).
//!
//! The analyst chooses each query after seeing earlier answers, so the privacy parameters of the
//! k-th release are themselves random (fully adaptive composition). A *privacy filter* is a
//! stopping rule that keeps the whole interaction (ε_B, δ_B)-DP in that setting. Each table's
//! policy fixes, at registration, one filter kind and a split of δ_B:
//!
//! - δ_sel = s·δ_B pays for the additive δ of partition selection ([`Event::Delta`]): admitted
//!   while Σδ_add ≤ δ_sel. Basic composition of δ is a valid filter (Rogers, Roth, Ullman,
//!   Vadhan 2016, "Privacy odometers and filters: pay-as-you-go composition", NeurIPS, Thm 3.6;
//!   Whitehouse, Ramdas, Rogers, Wu 2023, "Fully-adaptive composition in differential privacy",
//!   ICML, Thm 4.3 for approximate zCDP with an added δ).
//! - δ_g = (1 − s)·δ_B is the δ at which the filter's ε part is converted to (ε_B, δ_g).
//!
//! Admission compares *sums against fixed budgets only* (a rectangle): one sum of the filter's
//! currency (μ², ρ or ε(α*)) against a budget derived from (ε_B, δ_g) once, and Σδ_add against
//! δ_sel. Nothing path-dependent (no minimum over orders or over conversions) enters admission;
//! docs/ACCOUNTING.md shows a two-query strategy that the old "min of conversions" rule admitted
//! on every answer path and whose hockey-stick divergence at ε_B is about 2·δ_B.
//!
//! Every sum is rounded outward (up) and every budget inward (down).
use std::fmt;
use std::str::FromStr;

use dpfusion_udfs::privacy::cks::cks_term;
use dpfusion_udfs::privacy::gdp::gdp_epsilon;
use dpfusion_udfs::privacy::grid::ORDERS;
use dpfusion_udfs::privacy::{Event, gaussian_mu, zcdp_epsilon, zcdp_rho};
use serde::{Deserialize, Serialize};

use super::Budget;

/// How many private GROUP BYs the δ reserved for partition selection pays for by default: a
/// selection's additive δ is at most δ_sel / [`DEFAULT_SELECTIONS`] unless its calls name a
/// smaller δ (docs/ACCOUNTING.md, "Partition selection").
pub const DEFAULT_SELECTIONS: f64 = 1000.0;

/// The share of δ_B reserved for partition selection when the owner does not say.
pub const DEFAULT_DELTA_SHARE: f64 = 0.5;

pub(super) fn default_delta_share() -> f64 {
    DEFAULT_DELTA_SHARE
}

/// Which filter a table's admissions follow (fixed at registration; docs/ACCOUNTING.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FilterKind {
    /// Gaussian events only: Σμ² ≤ μ_B² (Smith and Thakurta 2022).
    #[default]
    Gdp,
    /// Gaussian, zCDP, Laplace and pure-DP events: Σρ ≤ ρ_B (Feldman and Zrnic 2021).
    Zcdp,
    /// Every event with an RDP curve, at one fixed order α*: Σε(α*) ≤ b(α*) (Feldman and
    /// Zrnic 2021). `order: None` asks for the default order, chosen from the budget alone when
    /// the table is first registered; the ledger always stores the order in force.
    Rdp {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<f64>,
    },
}

impl FilterKind {
    /// `gdp`, `zcdp` or `rdp` (without the order).
    pub fn name(&self) -> &'static str {
        match self {
            FilterKind::Gdp => "gdp",
            FilterKind::Zcdp => "zcdp",
            FilterKind::Rdp { .. } => "rdp",
        }
    }

    /// Same kind (the order of `rdp` aside).
    pub fn same_kind(&self, other: &FilterKind) -> bool {
        self.name() == other.name()
    }
}

impl fmt::Display for FilterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Six significant digits (`rdp:6.37032`); parsing snaps such a number back to the
            // grid order it names.
            FilterKind::Rdp { order: Some(a) } => write!(f, "rdp:{}", super::display::n6(*a)),
            k => f.write_str(k.name()),
        }
    }
}

impl FromStr for FilterKind {
    type Err = String;
    /// `gdp`, `zcdp`, `rdp` or `rdp:ORDER` (ORDER a number > 1), case-insensitive.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            format!(
                "a privacy filter is 'gdp', 'zcdp', 'rdp' or 'rdp:ORDER' with ORDER > 1, got '{s}'"
            )
        };
        match t.as_str() {
            "gdp" => Ok(FilterKind::Gdp),
            "zcdp" => Ok(FilterKind::Zcdp),
            "rdp" => Ok(FilterKind::Rdp { order: None }),
            _ => {
                let order = t
                    .strip_prefix("rdp:")
                    .and_then(|o| o.trim().parse::<f64>().ok())
                    .ok_or_else(bad)?;
                if !(order.is_finite() && order > 1.0) {
                    return Err(bad());
                }
                // A grid order as printed (six significant digits) names that grid order.
                let order = ORDERS
                    .iter()
                    .copied()
                    .find(|g| (g / order - 1.0).abs() < 5e-6)
                    .unwrap_or(order);
                Ok(FilterKind::Rdp { order: Some(order) })
            }
        }
    }
}

/// Which side of the rectangle binds (or why the filter cannot account for a charge).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Limit {
    /// The filter's ε part: Σμ² > μ_B² (gdp), Σρ > ρ_B (zcdp) or Σε(α*) > b(α*) (rdp).
    Epsilon,
    /// The δ reserved for partition selection: Σδ_add > s·δ_B.
    Delta,
    /// A mechanism the table's filter does not accept. `earlier`: the ledger already holds such
    /// a charge (written under an earlier rule), so nothing more can be admitted.
    Mechanism { mechanism: String, earlier: bool },
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Epsilon => f.write_str("epsilon"),
            Limit::Delta => f.write_str("delta for partition selection"),
            Limit::Mechanism { mechanism, .. } => write!(f, "mechanism not accepted: {mechanism}"),
        }
    }
}

/// The sums of a sequence of events under one filter (the running totals the ledger's state
/// keeps per table and [`Currency`], exactly: a checkpoint stores them bit for bit).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Σμ² (gdp), Σρ (zcdp) or Σε(α*) (rdp), rounded up; +∞ for a parameter that is NaN or
    /// negative, or an RDP curve that is infinite at α*.
    #[serde(with = "bits")]
    pub main: f64,
    /// Σδ of [`Event::Delta`], rounded up.
    #[serde(with = "bits")]
    pub delta: f64,
    /// The same Σδ exactly, as a nonoverlapping expansion (Shewchuk 1997, "Adaptive precision
    /// floating-point arithmetic and fast robust geometric predicates", Grow-Expansion):
    /// admission compares it with δ_sel exactly, so no charge is refused by a rounding error.
    #[serde(with = "bits_vec")]
    pub delta_exact: Vec<f64>,
    /// The first event kind the filter does not accept.
    pub refused: Option<String>,
}

/// A float serialised as its bit pattern (an integer): exact, and +∞ (an unbounded sum) reads
/// back as +∞ (JSON has no infinity; serde_json would write `null`).
mod bits {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(x.to_bits())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        u64::deserialize(d).map(f64::from_bits)
    }
}

/// [`bits`] for each float of a vector.
mod bits_vec {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| x.to_bits()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<u64>::deserialize(d).map(|v| v.into_iter().map(f64::from_bits).collect())
    }
}

/// a + b = s + e exactly (Knuth's Two-Sum; Shewchuk 1997, Thm 7).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bv = s - a;
    let av = s - bv;
    (s, (a - av) + (b - bv))
}

/// Adds `b` to the expansion `e` (components in increasing magnitude, zeros dropped): exact
/// while no sum overflows (Shewchuk 1997, Grow-Expansion with zero elimination).
fn grow(e: &[f64], b: f64) -> Vec<f64> {
    let mut q = b;
    let mut h = Vec::with_capacity(e.len() + 1);
    for &x in e {
        let (s, err) = two_sum(q, x);
        if err != 0.0 {
            h.push(err);
        }
        q = s;
    }
    if q != 0.0 || h.is_empty() {
        h.push(q);
    }
    h
}

/// Whether the exact sum of the expansion `e` is ≤ `bound` (the sign of a nonoverlapping
/// expansion is the sign of its largest component). Non-finite parts compare as +∞.
fn exact_le(e: &[f64], bound: f64) -> bool {
    if e.iter().any(|x| !x.is_finite()) {
        return false;
    }
    let d = grow(e, -bound);
    d.iter().rev().find(|x| **x != 0.0).is_none_or(|x| *x < 0.0)
}

impl Usage {
    /// The sums of `self` then `other` (rounded up).
    pub fn plus(&self, other: &Usage) -> Usage {
        let mut exact = self.delta_exact.clone();
        for &d in &other.delta_exact {
            exact = grow(&exact, d);
        }
        Usage {
            main: add_up(self.main, other.main),
            delta: add_up(self.delta, other.delta),
            delta_exact: exact,
            refused: self.refused.clone().or_else(|| other.refused.clone()),
        }
    }
}

/// x + y, then one ulp up (the sum of two non-negative floats is rounded by at most half an ulp).
fn add_up(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        return y;
    }
    if y == 0.0 {
        return x;
    }
    let s = x + y;
    if s == 0.0 || !s.is_finite() {
        s
    } else {
        s.next_up()
    }
}

/// A product or quotient of exact inputs, rounded up by one ulp.
fn up(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else if x == 0.0 || x.is_infinite() {
        x
    } else {
        x.next_up()
    }
}

fn down(x: f64) -> f64 {
    if x > 0.0 && x.is_finite() {
        x.next_down()
    } else {
        x
    }
}

/// A readable name for an event kind, with its ledger tag.
pub fn mechanism_name(e: &Event) -> String {
    match e {
        Event::Gaussian { .. } => "Gaussian (gaussian)".into(),
        Event::Zcdp { .. } => "zCDP (zcdp, e.g. dp_logreg_agd)".into(),
        Event::Laplace { .. } => "Laplace (laplace)".into(),
        Event::PureDp { .. } => "pure DP (pure_dp)".into(),
        Event::Rgm { .. } => "relative Gaussian mechanism (rgm, rgm_mean_by)".into(),
        Event::SubsampledGaussian { .. } => {
            "Poisson-subsampled Gaussian (subsampled_gaussian, DP-SGD)".into()
        }
        Event::Delta { .. } => "partition selection δ (delta)".into(),
    }
}

/// The filter's fixed budget in its own currency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MainBudget {
    /// μ_B²: the largest μ with δ_GDP(ε_B; μ) ≤ δ_g, squared, rounded down.
    Gdp { mu_sq: f64 },
    /// ρ_B: the largest ρ whose CKS conversion at δ_g is ≤ ε_B, rounded down.
    Zcdp { rho: f64 },
    /// At order α*, b(α*) = ε_B − c(α*), where c(α) = (ln(1/δ_g) + (α−1) ln(1−1/α) − ln α)/(α−1)
    /// is the CKS conversion term: Σε(α*) ≤ b(α*) ⟺ CKS(Σε, α*, δ_g) ≤ ε_B. Rounded down.
    Rdp { order: f64, budget: f64 },
}

/// A table's filter, compiled from its policy: the two fixed budgets of the rectangle.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// The kind, with the rdp order resolved.
    pub kind: FilterKind,
    pub budget: Budget,
    pub delta_share: f64,
    /// δ_g = (1 − s)·δ_B: the δ of the ε part.
    pub delta_g: f64,
    /// s·δ_B: the additive δ partition selection may spend (δ_g + δ_sel ≤ δ_B in floats).
    pub delta_sel: f64,
    pub main: MainBudget,
}

/// The CKS conversion term at order α and δ (Canonne, Kamath, Steinke 2020, Prop. 12):
/// ε = ε(α) + c(α).
fn cks_constant(alpha: f64, delta: f64) -> f64 {
    cks_term(0.0, alpha, delta)
}

/// The default order of the rdp filter for (ε_B, δ_g): the grid order maximising b(α)/α, i.e. the
/// order at which a workload whose RDP curve is linear in α (Gaussian, zCDP) gets the most; a
/// function of the budget only, never of the queries.
pub fn default_rdp_order(epsilon: f64, delta_g: f64) -> Option<f64> {
    let mut best: Option<(f64, f64)> = None;
    for &a in ORDERS.iter() {
        let b = epsilon - cks_constant(a, delta_g);
        if b > 0.0 && best.is_none_or(|(r, _)| b / a > r) {
            best = Some((b / a, a));
        }
    }
    best.map(|(_, a)| a)
}

/// Checks the δ share: a number in the open interval (0, 1).
pub fn check_delta_share(s: f64) -> Result<(), String> {
    if s.is_finite() && s > 0.0 && s < 1.0 {
        Ok(())
    } else {
        Err(format!(
            "delta_share (the part of the table's δ reserved for partition selection) must be in \
             the open interval (0, 1), got {s}"
        ))
    }
}

/// The currency of a filter's ε part: μ² (gdp), ρ (zcdp) or ε(α*) at one Rényi order (rdp).
/// The cost of an event depends on the currency only (not on the budget), so the ledger's state
/// keeps one running [`Usage`] per table and currency, and a filter's sums are the usage of its
/// currency ([`Filter::usage`] is [`Currency::fold`] from zero).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Currency {
    Gdp,
    Zcdp,
    Rdp { order: f64 },
}

impl Currency {
    /// What one event costs in this currency; `Err` for a kind the filter refuses.
    fn cost(&self, e: &Event) -> Result<f64, ()> {
        let bad = |x: f64| x.is_nan() || x < 0.0;
        let checked = |x: f64, v: f64| if bad(x) { f64::INFINITY } else { up(v) };
        match (*self, e.clone()) {
            (_, Event::Delta { .. }) => Ok(0.0),
            // Smith and Thakurta 2022: the currency of the GDP filter is μ².
            (Currency::Gdp, Event::Gaussian { mu }) => Ok(checked(mu, mu * mu)),
            // A μ-GDP Gaussian mechanism is μ²/2-zCDP, exactly (Bun and Steinke 2016, Prop. 1.6).
            (Currency::Zcdp, Event::Gaussian { mu }) => Ok(checked(mu, mu * mu / 2.0)),
            // Recorded as is (no arithmetic, nothing to round).
            (Currency::Zcdp, Event::Zcdp { rho }) => Ok(if bad(rho) { f64::INFINITY } else { rho }),
            // ε-DP ⇒ ε²/2-zCDP (Bun and Steinke 2016, Prop. 1.4); Laplace(Δ/ε) is ε-DP.
            (Currency::Zcdp, Event::Laplace { epsilon })
            | (Currency::Zcdp, Event::PureDp { epsilon }) => {
                Ok(checked(epsilon, epsilon * epsilon / 2.0))
            }
            // No finite zCDP bound (its RDP curve is infinite beyond a finite order).
            (Currency::Zcdp, Event::Rgm { .. }) => Err(()),
            // No finite zCDP bound is proven here for the subsampled Gaussian (its RDP curve is
            // not linear in α): refused; the owner's options are an `rdp` table, or `noise =>
            // 'mf'` (a Gaussian event).
            (Currency::Zcdp, Event::SubsampledGaussian { .. }) => Err(()),
            // The GDP filter takes Gaussian events only (and δ): the rest is refused, named.
            (Currency::Gdp, _) => Err(()),
            // The event's RDP curve (profile.rs, `Event::rdp`, with its sources) at α*, rounded
            // outward.
            (Currency::Rdp { order: a }, ev) => Ok(up(ev.rdp(a))),
        }
    }

    /// The sums of `start`'s events followed by `events`: the same left fold, event by event,
    /// as the sums of all of them from zero, so a running total kept across charges is bit for
    /// bit the total a replay of every event computes.
    pub fn fold<'a>(&self, start: Usage, events: impl IntoIterator<Item = &'a Event>) -> Usage {
        let mut u = start;
        for e in events {
            if let Event::Delta { delta } = *e {
                let d = if delta.is_nan() || delta < 0.0 {
                    f64::INFINITY
                } else {
                    delta
                };
                u.delta = add_up(u.delta, d);
                u.delta_exact = grow(&u.delta_exact, d);
            }
            match self.cost(e) {
                Ok(c) => u.main = add_up(u.main, c),
                Err(()) => {
                    u.main = f64::INFINITY;
                    u.refused.get_or_insert_with(|| mechanism_name(e));
                }
            }
        }
        u
    }
}

impl Filter {
    /// Compiles a policy's filter. `Err` says why the budget cannot support it.
    pub fn new(budget: &Budget, kind: FilterKind, delta_share: f64) -> Result<Filter, String> {
        check_delta_share(delta_share)?;
        // δ_g + δ_sel ≤ δ_B: the split is computed in floating point and, when the float sum
        // exceeds δ_B, δ_g is lowered by an ulp (for s = 0.5 both halves are exact).
        let delta_sel = delta_share * budget.delta;
        let mut delta_g = (1.0 - delta_share) * budget.delta;
        while delta_g + delta_sel > budget.delta {
            delta_g = delta_g.next_down();
        }
        let main = match kind {
            // Dong, Roth, Su 2019, Cor. 2.13; gaussian_mu rounds μ down.
            FilterKind::Gdp => {
                let mu = gaussian_mu(budget.epsilon, delta_g).map_err(|e| e.to_string())?;
                MainBudget::Gdp {
                    mu_sq: down(mu * mu),
                }
            }
            // Inverse of the grid CKS conversion by bisection, whose result satisfies the
            // condition (calibrate.rs): already rounded down.
            FilterKind::Zcdp => MainBudget::Zcdp {
                rho: zcdp_rho(budget.epsilon, delta_g).map_err(|e| e.to_string())?,
            },
            FilterKind::Rdp { order } => {
                let order = match order {
                    Some(a) => a,
                    None => default_rdp_order(budget.epsilon, delta_g).ok_or_else(|| {
                        format!(
                            "no Rényi order supports ε = {} at δ = {delta_g:e}",
                            budget.epsilon
                        )
                    })?,
                };
                if !(order.is_finite() && order > 1.0) {
                    return Err(format!("the rdp filter's order must be > 1, got {order}"));
                }
                let c = up(cks_constant(order, delta_g));
                let b = down(budget.epsilon - c);
                if b.is_nan() || b <= 0.0 {
                    return Err(format!(
                        "at Rényi order {order} the conversion to δ = {delta_g:e} alone costs \
                         ε = {c:.4}, more than the budget ε = {}; choose a larger order or 'rdp' \
                         for the default",
                        budget.epsilon
                    ));
                }
                MainBudget::Rdp { order, budget: b }
            }
        };
        let kind = match main {
            MainBudget::Rdp { order, .. } => FilterKind::Rdp { order: Some(order) },
            _ => kind,
        };
        Ok(Filter {
            kind,
            budget: *budget,
            delta_share,
            delta_g,
            delta_sel,
            main,
        })
    }

    /// The largest additive δ one partition selection spends by default: δ_sel/1000 rounded
    /// down to six significant digits (5e-10 for the default budget), lowered further in the
    /// rare case that 1,000 of them would not fit δ_sel in exact arithmetic. The selection is
    /// calibrated for twice this (its additive δ is half its δ: `PartitionSelectParams::cost`).
    pub fn selection_delta(&self) -> f64 {
        let exact = self.delta_sel / DEFAULT_SELECTIONS;
        let mut d: f64 = super::display::num(exact, super::display::Round::Down)
            .parse()
            .unwrap_or(exact);
        let fits = |d: f64| {
            let mut sum = Vec::new();
            for _ in 0..DEFAULT_SELECTIONS as usize {
                sum = grow(&sum, d);
            }
            exact_le(&sum, self.delta_sel)
        };
        while d > 0.0 && !fits(d) {
            d = d.next_down();
        }
        d
    }

    /// The fixed budget of the ε part, in the filter's currency.
    pub fn main_budget(&self) -> f64 {
        match self.main {
            MainBudget::Gdp { mu_sq } => mu_sq,
            MainBudget::Zcdp { rho } => rho,
            MainBudget::Rdp { budget, .. } => budget,
        }
    }

    /// The name of the filter's currency: `μ²` (gdp), `ρ` (zcdp), `RDP ε(α=…)` (rdp, at α*).
    pub fn unit(&self) -> String {
        match self.main {
            MainBudget::Gdp { .. } => "μ²".to_string(),
            MainBudget::Zcdp { .. } => "ρ".to_string(),
            MainBudget::Rdp { order, .. } => {
                format!("RDP ε(α={})", super::display::n6(order))
            }
        }
    }

    /// The share of the ε part `u` uses, in millionths of the budget, rounded up.
    pub fn share(&self, u: &Usage) -> u64 {
        super::display::share_used(u.main, self.main_budget())
    }

    /// The largest ε one default query could still use after `used`: one Gaussian release at
    /// `delta` (dp_mean's default mechanism and the session's default δ) admitted by this
    /// filter, found by bisection on the admission rule itself ([`Filter::check`]), so a query
    /// at the number shown (rounded down) is admitted. 0 when even a tiny one is refused or the
    /// δ side is exhausted.
    pub fn next_epsilon(&self, used: &Usage, delta: f64) -> f64 {
        let fits = |eps: f64| {
            gaussian_mu(eps, delta).is_ok_and(|mu| {
                self.check(used, &self.usage(&[Event::Gaussian { mu }]))
                    .is_none()
            })
        };
        if used.refused.is_some() || !fits(1e-9) {
            return 0.0;
        }
        // Closed form first: a Gaussian of μ costs c·μ² in every currency (c = 1 for gdp, 1/2 for
        // zcdp, α*/2 for rdp: profile.rs), so the largest μ that fits is √(room/c), and the
        // largest ε for it at `delta` is ε_GDP(μ; δ) (Dong, Roth, Su 2019, Cor. 2.13); then
        // inward until the admission rule itself agrees (outward rounding of the sums).
        let c = match self.main {
            MainBudget::Gdp { .. } => 1.0,
            MainBudget::Zcdp { .. } => 0.5,
            MainBudget::Rdp { order, .. } => order / 2.0,
        };
        let room = self.main_budget() - used.main;
        let mut e = gdp_epsilon((room / c).sqrt(), delta).min(1e6);
        if e.is_finite() && e > 0.0 {
            for _ in 0..100 {
                if fits(e) {
                    return e * (1.0 - 1e-9);
                }
                e *= 1.0 - 1e-7;
            }
        }
        // Otherwise by bisection on the admission rule.
        let (mut lo, mut hi) = (0.0f64, self.budget.epsilon.max(1e-12));
        lo = lo.max(1e-9);
        // A call at a smaller δ than δ_g may use more than ε_B: widen until refused.
        while fits(hi) {
            lo = hi;
            hi *= 2.0;
            if hi > 1e6 {
                return lo;
            }
        }
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo <= lo * 1e-9 {
                break;
            }
        }
        // Inward by a part in 1e9, so that the number shown (rounded down) is admitted.
        lo * (1.0 - 1e-9)
    }

    /// The currency of this filter's ε part: what its sums are kept in.
    pub fn currency(&self) -> Currency {
        match self.main {
            MainBudget::Gdp { .. } => Currency::Gdp,
            MainBudget::Zcdp { .. } => Currency::Zcdp,
            MainBudget::Rdp { order, .. } => Currency::Rdp { order },
        }
    }

    /// The sums of `events` under this filter.
    pub fn usage<'a>(&self, events: impl IntoIterator<Item = &'a Event>) -> Usage {
        self.currency().fold(Usage::default(), events)
    }

    /// Admission of `before` + `charge`: `None` when the rectangle holds, else the binding limit.
    pub fn check(&self, before: &Usage, charge: &Usage) -> Option<Limit> {
        if let Some(m) = &before.refused {
            return Some(Limit::Mechanism {
                mechanism: m.clone(),
                earlier: true,
            });
        }
        if let Some(m) = &charge.refused {
            return Some(Limit::Mechanism {
                mechanism: m.clone(),
                earlier: false,
            });
        }
        let after = before.plus(charge);
        // The ε part: a strict comparison of a rounded-up sum with a rounded-down budget.
        if after.main.is_nan() || after.main > self.main_budget() {
            return Some(Limit::Epsilon);
        }
        // Σδ in exact arithmetic: a thousand selections of δ_sel/1000 fit exactly.
        if after.delta.is_nan() || !exact_le(&after.delta_exact, self.delta_sel) {
            return Some(Limit::Delta);
        }
        None
    }

    /// The ε reported for a usage: the filter's own conversion of its sum at δ_g, rounded up.
    /// Never a minimum over conversions (docs/ACCOUNTING.md); 0 when nothing was spent; +∞ for
    /// an unbounded sum.
    pub fn epsilon(&self, u: &Usage) -> f64 {
        let m = u.main;
        if m == 0.0 {
            return 0.0;
        }
        if !m.is_finite() {
            return f64::INFINITY;
        }
        match self.main {
            // Dong, Roth, Su 2019, Cor. 2.13 (gdp_epsilon rounds up). √ rounded up.
            MainBudget::Gdp { .. } => gdp_epsilon(up(m.sqrt()), self.delta_g),
            // CKS 2020 Prop. 12 minimised over α for the fixed curve Σρ·α (rounded up).
            MainBudget::Zcdp { .. } => zcdp_epsilon(m, self.delta_g).unwrap_or(f64::INFINITY),
            // CKS 2020 Prop. 12 at the filter's order α*.
            MainBudget::Rdp { order, .. } => up(cks_term(m, order, self.delta_g).max(0.0)),
        }
    }

    /// A one-line description: kind, budget in its currency, δ split.
    pub fn describe(&self) -> String {
        let main = match self.main {
            MainBudget::Gdp { mu_sq } => format!("Σμ² ≤ {mu_sq:.6}"),
            MainBudget::Zcdp { rho } => format!("Σρ ≤ {rho:.6}"),
            MainBudget::Rdp { order, budget } => format!("Σε(α={order:.4}) ≤ {budget:.6}"),
        };
        format!(
            "{} filter: {main} (→ ε ≤ {} at δ = {:e}), Σδ of partition selection ≤ {:e}",
            self.kind.name(),
            self.budget.epsilon,
            self.delta_g,
            self.delta_sel
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpfusion_udfs::privacy::gdp::gdp_delta;

    fn vectors() -> serde_json::Value {
        serde_json::from_str(include_str!(
            "../../udfs/tests/data/accounting_vectors.json"
        ))
        .expect("accounting_vectors.json")
    }

    fn budget(epsilon: f64, delta: f64) -> Budget {
        Budget { epsilon, delta }
    }

    #[test]
    fn parse_and_display_filter_kinds() {
        assert_eq!("gdp".parse::<FilterKind>().unwrap(), FilterKind::Gdp);
        assert_eq!(" ZCDP ".parse::<FilterKind>().unwrap(), FilterKind::Zcdp);
        assert_eq!(
            "rdp".parse::<FilterKind>().unwrap(),
            FilterKind::Rdp { order: None }
        );
        assert_eq!(
            "rdp:8".parse::<FilterKind>().unwrap(),
            FilterKind::Rdp { order: Some(8.0) }
        );
        for bad in ["", "pld", "rdp:1", "rdp:x", "rdp:inf", "rdp:0.5"] {
            assert!(bad.parse::<FilterKind>().is_err(), "{bad}");
        }
        assert_eq!(FilterKind::Rdp { order: Some(8.0) }.to_string(), "rdp:8");
        let json = serde_json::to_string(&FilterKind::Rdp { order: Some(8.0) }).unwrap();
        assert_eq!(json, r#"{"kind":"rdp","order":8.0}"#);
        assert_eq!(
            serde_json::from_str::<FilterKind>(r#"{"kind":"gdp"}"#).unwrap(),
            FilterKind::Gdp
        );
        assert!(check_delta_share(0.0).is_err() && check_delta_share(1.0).is_err());
        assert!(check_delta_share(0.5).is_ok());
    }

    /// μ_B for (ε, δ_g) against independent numbers: the analytic Gaussian vectors of
    /// dp-accounting give σ for Δ = 1, so μ_B = 1/σ.
    #[test]
    fn gdp_budget_matches_analytic_gaussian_vectors() {
        for v in vectors()["analytic_gaussian"].as_array().unwrap() {
            let e = v["epsilon"].as_f64().unwrap();
            let d = v["delta"].as_f64().unwrap();
            let mu_ref = v["sensitivity"].as_f64().unwrap() / v["sigma"].as_f64().unwrap();
            // δ_B = 2d with share 0.5 puts δ_g = d.
            let f = Filter::new(&budget(e, 2.0 * d), FilterKind::Gdp, 0.5).unwrap();
            assert_eq!(f.delta_g, d);
            let MainBudget::Gdp { mu_sq } = f.main else {
                panic!()
            };
            let mu = mu_sq.sqrt();
            assert!(
                (mu / mu_ref - 1.0).abs() < 1e-6,
                "{e} {d}: {mu} vs {mu_ref}"
            );
            assert!(mu <= mu_ref * (1.0 + 1e-9), "μ_B rounds down");
            assert!(gdp_delta(e, mu) <= f.delta_g);
        }
        // A closed form: ε = 1, δ_g = 1e-6. δ_GDP(1; μ) = Φ(−1/μ + μ/2) − e Φ(−1/μ − μ/2); at
        // μ_B the curve passes through 1e-6 and just above it exceeds it.
        let f = Filter::new(&budget(1.0, 2e-6), FilterKind::Gdp, 0.5).unwrap();
        let mu = f.main_budget().sqrt();
        assert!(gdp_delta(1.0, mu) <= 1e-6 && gdp_delta(1.0, mu * (1.0 + 1e-6)) > 1e-6);
        // 1/σ of dp-accounting's (ε = 1, δ = 1e-5) vector is 0.268051...: check the other
        // closed-form relation, ε(μ_B) = ε_B.
        assert!(
            (f.epsilon(&Usage {
                main: mu * mu,
                ..Default::default()
            }) - 1.0)
                .abs()
                < 1e-6
        );
    }

    /// ε reported by the gdp filter against dp-accounting's exact GDP composition vectors.
    #[test]
    fn gdp_epsilon_matches_composition_vectors() {
        for v in vectors()["gaussian_composition"].as_array().unwrap() {
            let z = v["noise_multiplier"].as_f64().unwrap();
            let t = v["steps"].as_u64().unwrap() as usize;
            let d = v["delta"].as_f64().unwrap();
            let want = v["eps_exact_gdp"].as_f64().unwrap();
            // Budget large enough; δ_g = d.
            let f = Filter::new(&budget(1e3, 2.0 * d), FilterKind::Gdp, 0.5).unwrap();
            let ev = Event::Gaussian { mu: 1.0 / z };
            let u = f.usage(std::iter::repeat_n(&ev, t));
            let got = f.epsilon(&u);
            assert!(
                (got / want - 1.0).abs() < 1e-6,
                "z={z} T={t}: {got} vs {want}"
            );
        }
    }

    /// ρ_B and the reported ε of the zcdp filter against dp-accounting's CKS vectors.
    #[test]
    fn zcdp_filter_matches_cks_vectors() {
        for v in vectors()["zcdp_to_approx"].as_array().unwrap() {
            let rho = v["rho"].as_f64().unwrap();
            let d = v["delta"].as_f64().unwrap();
            let eps = v["eps_cks2020"].as_f64().unwrap();
            let f = Filter::new(&budget(eps, 2.0 * d), FilterKind::Zcdp, 0.5).unwrap();
            let rb = f.main_budget();
            // The grid inverse is within 2e-4 below the continuous one, never above.
            assert!(
                rb <= rho * (1.0 + 1e-12) && rb > rho * (1.0 - 2e-4),
                "{rb} vs {rho}"
            );
            let shown = f.epsilon(&f.usage(&[Event::Zcdp { rho }]));
            assert!((shown / eps - 1.0).abs() < 1e-6, "{shown} vs {eps}");
            assert!(shown >= eps * (1.0 - 1e-9));
            // Admission at the boundary.
            let at = f.usage(&[Event::Zcdp { rho: rb }]);
            assert_eq!(f.check(&Usage::default(), &at), None);
            let over = f.usage(&[Event::Zcdp { rho: rb * 1.001 }]);
            assert_eq!(f.check(&Usage::default(), &over), Some(Limit::Epsilon));
        }
        // Gaussian counts μ²/2 and Laplace ε²/2; rgm is refused.
        let f = Filter::new(&budget(5.0, 1e-6), FilterKind::Zcdp, 0.5).unwrap();
        let u = f.usage(&[Event::Gaussian { mu: 0.5 }, Event::Laplace { epsilon: 0.2 }]);
        assert!((u.main - (0.125 + 0.02)).abs() < 1e-15);
        let rgm = Event::Rgm {
            sigma: 1.0,
            gamma: 0.1,
            dims: 1,
            steps: 1,
        };
        assert!(matches!(
            f.check(&Usage::default(), &f.usage(&[rgm])),
            Some(Limit::Mechanism { earlier: false, .. })
        ));
    }

    #[test]
    fn rdp_filter_at_fixed_order() {
        let b = budget(5.0, 1e-6);
        let f = Filter::new(&b, FilterKind::Rdp { order: None }, 0.5).unwrap();
        let MainBudget::Rdp { order, budget: bud } = f.main else {
            panic!()
        };
        // b(α) = ε_B − c(α), and b/α is maximal over the grid at α*.
        let c = |a: f64| {
            ((1.0 / f.delta_g).ln() + (a - 1.0) * (1.0 - 1.0 / a).ln() - a.ln()) / (a - 1.0)
        };
        assert!((bud - (5.0 - c(order))).abs() < 1e-12);
        for &a in ORDERS.iter() {
            assert!((5.0 - c(a)) / a <= bud / order * (1.0 + 1e-12));
        }
        // A stated order is kept; the kind records the order in force.
        let g = Filter::new(&b, FilterKind::Rdp { order: Some(8.0) }, 0.5).unwrap();
        assert_eq!(g.kind, FilterKind::Rdp { order: Some(8.0) });
        assert!(Filter::new(&b, FilterKind::Rdp { order: Some(1.01) }, 0.5).is_err());
        // Reported ε at the budget is ε_B; zero usage reports 0.
        let full = Usage {
            main: bud,
            ..Default::default()
        };
        assert!((f.epsilon(&full) - 5.0).abs() < 1e-9 && f.epsilon(&full) <= 5.0 + 1e-9);
        assert_eq!(f.epsilon(&Usage::default()), 0.0);
        // The mixed vector: 20 Laplace(0.1) + 30 Gaussian(z = 3) have ε(α) ≤ their CKS at
        // any fixed order, which is ≥ dp-accounting's optimised 10.836 at δ = 1e-6.
        let m = &vectors()["mixed_laplace_gaussian"];
        let mut events = vec![Event::Laplace { epsilon: 0.1 }; 20];
        events.extend(vec![Event::Gaussian { mu: 1.0 / 3.0 }; 30]);
        let f = Filter::new(
            &budget(50.0, 2e-6),
            FilterKind::Rdp { order: Some(4.0) },
            0.5,
        )
        .unwrap();
        let got = f.epsilon(&f.usage(&events));
        assert!(
            got >= m["eps_rdp_dp_accounting"].as_f64().unwrap() * (1.0 - 1e-9),
            "{got}"
        );
    }

    #[test]
    fn gdp_refuses_other_kinds_and_delta_has_its_own_side() {
        let f = Filter::new(&budget(1.0, 1e-6), FilterKind::Gdp, 0.5).unwrap();
        assert_eq!(f.delta_sel, 5e-7);
        assert_eq!(f.delta_g, 5e-7);
        let z = f.usage(&[Event::Zcdp { rho: 1e-6 }]);
        match f.check(&Usage::default(), &z) {
            Some(Limit::Mechanism { mechanism, earlier }) => {
                assert!(mechanism.contains("zCDP") && !earlier)
            }
            l => panic!("{l:?}"),
        }
        // Earlier refused events (an old ledger) block every later charge.
        let g = f.usage(&[Event::Gaussian { mu: 0.01 }]);
        assert!(matches!(
            f.check(&z, &g),
            Some(Limit::Mechanism { earlier: true, .. })
        ));
        let d = f.usage(&[Event::Gaussian { mu: 0.01 }, Event::Delta { delta: 3e-7 }]);
        assert_eq!(f.check(&Usage::default(), &d), None);
        assert_eq!(f.check(&d, &d), Some(Limit::Delta));
        assert!(f.epsilon(&d).is_finite());
        assert_eq!(
            f.usage(&[Event::Gaussian { mu: f64::NAN }]).main,
            f64::INFINITY
        );
    }
    /// DP-SGD (issue 30): the rdp filter charges the amplified curve at α*; gdp and zcdp charge
    /// the unamplified Gaussian (μ² = steps/z², ρ = steps/(2z²)), never less.
    #[test]
    fn subsampled_gaussian_in_each_filter() {
        let b = budget(5.0, 1e-6);
        let ev = Event::SubsampledGaussian {
            sample_rate: 0.01,
            noise_multiplier: 2.0,
            steps: 100,
        };
        let rdp = Filter::new(&b, FilterKind::Rdp { order: None }, 0.5).unwrap();
        let MainBudget::Rdp { order, .. } = rdp.main else {
            panic!()
        };
        let u = rdp.usage(std::slice::from_ref(&ev));
        assert!(u.main >= ev.rdp(order) && u.main <= ev.rdp(order) * (1.0 + 1e-12));
        assert!(
            u.main < 100.0 * order / 8.0,
            "amplified below the Gaussian curve"
        );
        // The gdp and zcdp filters refuse it (no GDP or zCDP bound credits the sampling, and
        // the unamplified bound would charge a calibrated fit many times a budget): the owner's
        // options are an rdp table, or the analyst's `noise => 'mf'` (a Gaussian event).
        let gdp = Filter::new(&b, FilterKind::Gdp, 0.5).unwrap();
        assert!(gdp.usage(std::slice::from_ref(&ev)).refused.is_some());
        let zcdp = Filter::new(&b, FilterKind::Zcdp, 0.5).unwrap();
        assert!(zcdp.usage(std::slice::from_ref(&ev)).refused.is_some());
        let bad = Event::SubsampledGaussian {
            sample_rate: f64::NAN,
            noise_multiplier: 2.0,
            steps: 1,
        };
        assert_eq!(rdp.usage(&[bad]).main, f64::INFINITY);
    }
}
