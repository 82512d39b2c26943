//! `dp_mean(value, lower, upper, epsilon[, delta[, neighbours]])`: a bounded mean, always within
//! [lower, upper].
//!
//! # `add_remove` and `replace`: noisy sum over noisy count
//! Centre c = (lower + upper)/2 (on the fixed-point grid; see [`crate::mechanisms::exact`]). Two Gaussian
//! releases share the call's μ = gaussian_mu(ε, δ) by μ_s² + μ_c² = μ², so the pair is μ-GDP
//! (Dong, Roth, Su 2019) and the call (ε, δ)-DP:
//! - S̃ = Σ (clamp(v) − c) + N(0, σ_s²), σ_s = Δ_s/μ_s, with Δ_s = (upper − lower)/2 under
//!   `add_remove` and upper − lower under `replace` (a value moves across the whole range);
//! - C̃ = n + N(0, σ_c²), σ_c = 1/μ_c (one row in or out, or one value turning NULL).
//!
//! The result is c + S̃ / max(C̃, 1), clamped to [lower, upper] (Google's bounded mean; all
//! post-processing of the two releases).
//!
//! Split of μ (minimax): to first order in the noise, the error of the mean is
//! (Z_s − (m − c)·Z_c)/n with m the true mean, so its variance is (σ_s² + (m − c)²σ_c²)/n².
//! Over all data (|m − c| ≤ h = (upper − lower)/2) the worst case is (Δ_s²/μ_s² + h²/μ_c²)/n².
//! Minimising a ↦ Δ_s²/a + h²/(μ² − a) (a = μ_s²) gives Δ_s²/a² = h²/b², i.e.
//! μ_s² : μ_c² = Δ_s : h. Under `add_remove` (Δ_s = h) this is μ_s = μ_c = μ/√2; under
//! `replace` (Δ_s = 2h) it is μ_s² = 2μ²/3, μ_c² = μ²/3.
//!
//! # `replace_private_keys`: the `replace` calibration, which covers a move between groups
//! Under `replace_private_keys` the changed row can leave group a and join group b, changing
//! both groups' (centred sum, count) pairs; the call uses the `replace` split and sensitivities,
//! with one more grid step of rounding slack on the sum (σ_s = (Δ_s + 2g)/μ_s).
//!
//! *Proof that this stays within μ.* All releases of all groups are Gaussian, so the call is
//! μ'-GDP with μ'² = Σ over released coordinates of (change/σ)² (Dong, Roth, Su 2019, Cor. 3.3,
//! applied to the vector of releases). Write h = (upper − lower)/2 (the largest |v − c|), so
//! Δ_s = 2h, σ_s = (2h + 2g)/μ_s, σ_c ≥ (1 + g_c)/μ_c, and each rounded coordinate moves by at
//! most its change plus one grid step. (i) The row stays in its group: the sum moves by ≤ 2h
//! and the count by 0, or (to/from NULL) the sum by ≤ h and the count by 1, so
//! μ'² ≤ max(μ_s², μ_s²/4 + μ_c²) ≤ μ_s² + μ_c². (ii) The row moves from a to b: each of the two
//! sums moves by ≤ h (+ g) and each count by 1 (+ g_c, or 0 if the row is NULL on that side),
//! so μ'² ≤ 2·((h + g)/σ_s)² + 2·((1 + g_c)/σ_c)² ≤ 2·(μ_s/2)² + 2·μ_c² = μ_s²/2 + 2μ_c².
//! With the `replace` split μ_s² = 2μ²/3, μ_c² = μ²/3 this is μ²/3 + 2μ²/3 = μ² (both shares
//! shrunk by [`SPLIT_SHRINK`], so it is at most μ² after rounding). Both cases are within the
//! call's μ = gaussian_mu(ε, δ): the charge `Gaussian { μ }` is unchanged and the noise is the
//! `replace` noise (up to the one grid step, ≤ 2^−20 relative).
//!
//! # `replace_public_n`: noisy sum over the public n
//! The session sets this mode only when the number n of rows reaching the aggregate is public
//! (replace neighbours, no filter between scan and aggregate, public group keys). All of μ goes
//! to S̃ = Σ (clamp(v) − c) + N(0, σ²), σ = (upper − lower)/μ, and the result is c + S̃/n,
//! clamped. NULL and NaN values are imputed with the centre c (they contribute 0 to the centred
//! sum): a `replace` neighbour may turn a value into NULL, and skipping NULLs would make the
//! divisor (the non-NULL count) private again. With n = 0 (possible only through a FILTER
//! clause) the result is NULL, which reveals nothing since n is public.
//! Example (ε = 0.5, δ = 1e-6, bounds [0, 1e6], n = 10,000): the std of the mean is
//! 1e6/(μ·n) = 805.76.
//!
//! lower = upper: every clamped value equals the bound, and the bound is returned exactly.
//!
//! # Laplace (`mechanism => 'laplace'`): L1 sensitivity
//! Released with the exact discrete Laplace (Canonne, Kamath, Steinke 2020, Algorithm 2) so
//! that the call is pure ε-DP (δ = 0), charged as `Event::PureDp { ε }`
//! ([`super::params::Mechanism`] gives the scale b = (Δ₁ + slack·g)/ε and why not
//! `Event::Laplace`). One changed row (or unit) changes:
//! - `dp_mean`: the centred sum S (half-units, |y| ≤ w) and the count n, with ε split
//!   ε_s + ε_c = ε (basic composition of pure DP). Sensitivities as `dp_mean`'s Gaussian ones
//!   ([`super::dp_mean`]) but in L1: `add_remove` Δ_s = w, Δ_c = 1; `replace`: Δ_s = 2w (a value
//!   change), Δ_c = 1 (a change to/from NULL moves S by ≤ w and n by 1:
//!   w/b_s + 1/b_c ≤ ε_s/2 + ε_c ≤ ε); `replace_private_keys`: Δ_s = 2w (w in each of two groups,
//!   slack 2g), Δ_c = 2 (slack 2); `units:K:C`: K·C times the `add_remove` ones.
//!   Split (minimax, derived as `dp_mean`'s): the first-order error variance of the mean is
//!   (2b_s² + (m − c)²·2b_c²)/n², worst at |m − c| = w (half-units); minimising
//!   Δ_s²/ε_s² + w²Δ_c'²/ε_c² over ε_s + ε_c = ε (Lagrange: Δ_s²/ε_s³ = w²/ε_c³ for Δ_c' = 1)
//!   gives ε_s : ε_c = Δ_s^{2/3} : w^{2/3}: ε/2 each under `add_remove` and `units`, and
//!   2^{2/3} : 1 (ε_s ≈ 0.613ε) under the replace modes. `replace_public_n` puts all of ε on S
//!   (Δ_s = 2w) and divides by the public n, as the Gaussian release does.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::declaration::{
    self, Aggregate, DELTA, EPSILON, LOWER, MECHANISM, NEIGHBOURS, UPPER, UnitRule, VALUE,
};
use super::dp_sum::{bounds_text, finite_sensitivity};
use super::interval::{fieller, laplace_ratio_set, laplace_sum_quantile, pow2_neg18};
use super::params::{Mechanism, Neighbours, Params, representable};
use crate::mechanisms::exact::{FixedPoint, pow2};
use crate::mechanisms::{GaussianMechanism, Interval, LaplaceMechanism, Noise};
use crate::noise::SecureRng;
use crate::privacy::normal::phi_inv;
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// `dp_mean(value, lower, upper, epsilon, delta, neighbours)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanParams {
    pub lower: f64,
    pub upper: f64,
    pub epsilon: f64,
    pub delta: f64,
    pub mechanism: Mechanism,
    pub neighbours: Neighbours,
}

impl MeanParams {
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        Self::read(&Params::new(&DP_MEAN, args)?)
    }

    /// From the literals of `dp_mean` or of a function declaring the same parameters
    /// (`dp_variance`, `dp_stddev`; one without `mechanism` is Gaussian).
    pub(crate) fn read(p: &Params) -> Result<Self, PrivacyError> {
        let (lower, upper) = p.bounds()?;
        Ok(Self {
            lower,
            upper,
            epsilon: p.epsilon()?,
            delta: p.delta()?,
            mechanism: p.mechanism()?,
            neighbours: p.neighbours()?,
        })
    }
    /// μ of the whole call; the sum and count releases share it (μ_s² + μ_c² = μ²).
    pub fn mu(&self) -> Result<f64, PrivacyError> {
        gaussian_mu(self.epsilon, self.delta)
    }
    /// Builds the release too (as [`CountParams::cost`]).
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        MeanRelease::new(self)?;
        self.mechanism.cost(self.epsilon, self.delta)
    }
}

/// The `dp_mean` UDAF.
pub type DpMean = DpUdaf<MeanParams>;

/// `dp_mean` as an [`AggregateUDF`].
pub fn dp_mean_udaf() -> AggregateUDF {
    DpMean::udaf()
}

impl DpFunction for MeanParams {
    const NAME: &'static str = "dp_mean";
    fn spec() -> &'static Spec {
        &SPEC
    }
    fn declaration() -> &'static Aggregate {
        &DP_MEAN
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Numeric,
    returns: DataType::Float64,
    shape: Shape {
        sum: true,
        sum_sq: false,
        count: true,
        rows: true,
    },
    release: |lits| {
        let p = MeanParams::from_literals(lits)?;
        Ok(Arc::new(MeanRelease::new(&p)?))
    },
    description: "Differentially private mean of the values clamped to [lower, upper]; the result \
         is always within [lower, upper]. Under add/remove (default) and replace neighbours: a \
         noisy sum of (clamped value − midpoint) over a noisy count of non-NULL values, the two \
         Gaussian releases sharing the call's μ = gaussian_mu(epsilon, delta) so that the call is \
         (epsilon, delta)-DP; result = midpoint + sum / max(count, 1), clamped. Under \
         'replace_public_n' (public row count n, set by the session): all of μ on the sum \
         (sensitivity upper − lower), NULL/NaN imputed with the midpoint, result = sum / n (NULL \
         when n = 0). Under 'replace_private_keys' (a changed row can move between groups) the \
         replace calibration is used: it covers both groups' changes within μ. NULL and NaN values \
         are skipped otherwise; ±infinity is clamped. Bounds or an epsilon whose noise is not \
         representable fail at planning with the range that works.",
    example: "SELECT job, dp_mean(salary, 0, 1000000, 0.5, 1e-6) FROM salaries GROUP BY job;",
    related: &["dp_sum", "dp_count"],
};

/// Calibrations are rounded outward: the split μ's are shrunk by this factor so that
/// μ_s² + μ_c² ≤ μ² despite floating-point rounding.
const SPLIT_SHRINK: f64 = 1.0 - 1e-12;

/// The release of a `dp_mean` call: two [`Noise`]s, on the centred sum and on the count,
/// calibrated per noise kind side by side ([`MeanRelease::gaussian`], [`MeanRelease::laplace`]).
#[derive(Debug, Clone)]
pub(crate) struct MeanRelease {
    pub fp: FixedPoint,
    pub neighbours: Neighbours,
    /// Release of the centred sum, in units of q/2. `None` when lower = upper.
    pub sum_noise: Option<Noise>,
    /// Release of the count. `None` under `replace_public_n` or when lower = upper.
    pub count_noise: Option<Noise>,
}

/// 2^{2/3}: the Laplace replace split ε_s : ε_c (module docs, "Laplace"), rounded (any split
/// with ε_s + ε_c ≤ ε is private; the rounding only moves it off the optimum by an ulp).
pub(crate) const CBRT_4: f64 = 1.587_401_051_968_199_4;

impl MeanRelease {
    /// The calibration (module docs); also called by [`MeanParams::cost`], so the accountant
    /// refuses exactly what the planner refuses. A noise that is not representable fails with
    /// the range of epsilon (or of the bounds) that works.
    pub fn new(p: &MeanParams) -> Result<Self, PrivacyError> {
        let bounds = bounds_text(p.lower, p.upper);
        representable(p.epsilon, ("upper", &bounds), |epsilon| match p.mechanism {
            // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
            Mechanism::Gaussian => Self::gaussian(
                p,
                p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?),
            ),
            Mechanism::Laplace => Self::laplace(p, epsilon),
        })
    }

    /// The Gaussian calibration at μ (module docs).
    fn gaussian(p: &MeanParams, mu: f64) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        // Centred values 2x − (lo + hi) in half-units q/2 lie in [−w, w].
        let w = fp.width();
        let half_unit = pow2(fp.exp - 1);
        let (mut sum_mech, mut count_mech) = (None, None);
        if w > 0 {
            let h = w as f64; // worst |m − c|, half-units
            match p.neighbours {
                Neighbours::ReplacePublicN => {
                    let sensitivity =
                        finite_sensitivity(2.0 * h * half_unit, &bounds_text(p.lower, p.upper))?;
                    sum_mech = Some(GaussianMechanism::from_mu(mu, sensitivity)?);
                }
                nb => {
                    // Δ_s = h (add/remove) or 2h (replace modes), in half-units (module docs).
                    let ds = if nb.is_replace() { 2.0 * h } else { h };
                    // Minimax split μ_s² : μ_c² = Δ_s : h (module docs), rounded down.
                    let mu_s = mu * (ds / (ds + h)).sqrt() * SPLIT_SHRINK;
                    let mu_c = mu * (h / (ds + h)).sqrt() * SPLIT_SHRINK;
                    // Rounding slack: one grid step, two when a row can move between groups
                    // (σ_s = (2h + 2g)/μ_s, module docs, proof (ii)).
                    let slack = if nb.moves_between_groups() { 2.0 } else { 1.0 };
                    sum_mech = Some(GaussianMechanism::from_mu_with_slack(
                        mu_s,
                        finite_sensitivity(ds * half_unit, &bounds_text(p.lower, p.upper))?,
                        slack,
                    )?);
                    count_mech = Some(GaussianMechanism::from_mu(mu_c, 1.0)?);
                }
            }
        }
        Ok(Self {
            fp,
            neighbours: p.neighbours,
            sum_noise: sum_mech.map(Noise::Gaussian),
            count_noise: count_mech.map(Noise::Gaussian),
        })
    }

    /// The Laplace calibration at ε (module docs, "Laplace").
    fn laplace(p: &MeanParams, epsilon: f64) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let w = fp.width() as f64;
        let half_unit = pow2(fp.exp - 1);
        let nb = p.neighbours;
        let (mut sum_mech, mut count_mech) = (None, None);
        if w > 0.0 {
            if nb == Neighbours::ReplacePublicN {
                sum_mech = Some(LaplaceMechanism::from_epsilon_with_slack(
                    epsilon,
                    finite_sensitivity(2.0 * w * half_unit, &bounds_text(p.lower, p.upper))?,
                    1.0,
                )?);
            } else {
                // K·C under `units:K:C`, 1 otherwise.
                let f = nb.unit_l1_factor();
                // (Δ_s, slack_s, Δ_c, slack_c) in half-units / rows (module docs).
                let (ds, ss, dc, sc) = match nb {
                    Neighbours::ReplacePrivateKeys => (2.0 * w, 2.0, 2.0, 2.0),
                    Neighbours::Replace => (2.0 * w, 1.0, 1.0, 1.0),
                    _ => (f * w, f, f, f),
                };
                let share_s = if nb.is_replace() {
                    CBRT_4 / (CBRT_4 + 1.0)
                } else {
                    0.5
                };
                // ε_s + ε_c ≤ ε: each share lowered by an ulp.
                let eps_s = (epsilon * share_s).next_down();
                let eps_c = (epsilon - eps_s).next_down();
                sum_mech = Some(LaplaceMechanism::from_epsilon_with_slack(
                    eps_s,
                    finite_sensitivity((ds * half_unit).next_up(), &bounds_text(p.lower, p.upper))?,
                    ss,
                )?);
                count_mech = Some(LaplaceMechanism::from_epsilon_with_slack(eps_c, dc, sc)?);
            }
        }
        Ok(Self {
            fp,
            neighbours: nb,
            sum_noise: sum_mech.map(Noise::Laplace),
            count_noise: count_mech.map(Noise::Laplace),
        })
    }

    /// The noisy releases behind one group's mean, drawn in this order: the centred sum, then
    /// the count. [`MeanDraw::value`] post-processes them; `finalise` and
    /// `finalise_with_intervals` both call this, so a `_ci` value is the base value.
    fn draw(&self, rng: &mut SecureRng, p: &Partial) -> Result<MeanDraw> {
        let fp = &self.fp;
        let public_n = self.neighbours == Neighbours::ReplacePublicN;
        if public_n && p.rows == 0 {
            return Ok(MeanDraw::Null);
        }
        let (lower, upper) = (fp.lower, fp.upper);
        let c = centre(fp);
        let Some(sum_noise) = &self.sum_noise else {
            return Ok(MeanDraw::Exact(c.clamp(lower, upper)));
        };
        let mid = (fp.lo + fp.hi) as i128;
        let centred = p
            .sum
            .saturating_mul(2)
            .saturating_sub(mid.saturating_mul(p.count as i128));
        let s = sum_noise.release(rng, centred, fp.exp - 1)?;
        let count = match &self.count_noise {
            Some(m) => Some(m.release(rng, p.count as i128, 0)?),
            None => None,
        };
        Ok(MeanDraw::Noisy {
            c,
            s,
            count,
            rows: p.rows,
        })
    }
}

/// The centre c on the grid: (lo + hi)·q/2.
pub(crate) fn centre(fp: &FixedPoint) -> f64 {
    (fp.lo + fp.hi) as f64 * pow2(fp.exp - 1)
}

/// The noisy quantities behind one group's mean ([`draw_mean`]), before post-processing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MeanDraw {
    /// `replace_public_n` with n = 0: NULL.
    Null,
    /// lower = upper: the bound, exactly (no noise).
    Exact(f64),
    /// The centre c, the raw noisy centred sum S̃ (value units), and the divisor: the raw noisy
    /// count C̃ (`Some`, before `max(·, 1)`) or the public row count n (`None`, `rows`).
    Noisy {
        c: f64,
        s: f64,
        count: Option<f64>,
        rows: i64,
    },
}

impl MeanDraw {
    /// The released mean: c + S̃ / max(C̃, 1) (or S̃/n), clamped to [lower, upper].
    pub fn value(&self, lower: f64, upper: f64) -> Option<f64> {
        match *self {
            MeanDraw::Null => None,
            MeanDraw::Exact(v) => Some(v),
            MeanDraw::Noisy { c, s, count, rows } => {
                Some((c + s / Self::divisor(count, rows)).clamp(lower, upper))
            }
        }
    }

    /// max(C̃, 1), or the public n.
    pub fn divisor(count: Option<f64>, rows: i64) -> f64 {
        match count {
            Some(c) => c.max(1.0),
            None => rows as f64,
        }
    }
}

impl Finalise for MeanRelease {
    fn shape(&self) -> Shape {
        SPEC.shape
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let (lower, upper) = (self.fp.lower, self.fp.upper);
        let out = partials
            .iter()
            .map(|p| Ok(self.draw(rng, p)?.value(lower, upper)))
            .collect::<Result<Vec<Option<f64>>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match (&self.sum_noise, &self.count_noise) {
            (Some(a), Some(b)) => format!(
                "{} on the sum of (value − midpoint), {} on the count",
                a.describe(),
                b.scale_text()
            ),
            (Some(a), None) => format!("{} on the sum (public row count)", a.describe()),
            _ => "none (lower = upper)".into(),
        })
    }
    /// The same draws as [`Self::finalise`] ([`Self::draw`]), then the interval
    /// ([`super::interval`], "Formulas").
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let fp = &self.fp;
        let (lower, upper) = (fp.lower, fp.upper);
        let mut values = Vec::with_capacity(partials.len());
        let mut out = Vec::with_capacity(partials.len());
        for p in partials {
            let d = self.draw(rng, p)?;
            let value = d.value(lower, upper);
            values.push(value);
            out.push(match (d, value, self.sum_noise) {
                (MeanDraw::Noisy { c, s, count, rows }, Some(v), Some(sn)) => Some(mean_interval(
                    (c, s, count, rows),
                    v,
                    (sn, self.count_noise),
                    confidence,
                    fp,
                )),
                (_, Some(v), _) => Some(Interval {
                    lower: v,
                    upper: v,
                    stddev: 0.0,
                }),
                _ => None,
            });
        }
        Ok((Arc::new(Float64Array::from(values)), out))
    }
}

/// One group's interval from its draws (c, S̃, C̃ or the public n) and the released `value`
/// ([`super::interval`], "Formulas": Fieller for Gaussian noise, the exact Laplace pivot for
/// Laplace noise, exact with a public n).
fn mean_interval(
    (c, s, count, rows): (f64, f64, Option<f64>, i64),
    value: f64,
    (sum_noise, count_noise): (Noise, Option<Noise>),
    level: f64,
    fp: &FixedPoint,
) -> Interval {
    let (lower, upper) = (fp.lower, fp.upper);
    let clamp = |lo: f64, hi: f64| (lo.clamp(lower, upper), hi.clamp(lower, upper));
    let d_hat = value - c;
    let denom = MeanDraw::divisor(count, rows);
    let (Some(noisy_count), Some(cn)) = (count, count_noise) else {
        // Public n: exact.
        let w = sum_noise.half_width(level) / denom;
        let centre = c + s / denom;
        let (lo, hi) = clamp(centre - w, centre + w);
        return Interval {
            lower: lo,
            upper: hi,
            stddev: sum_noise.stddev() / denom,
        };
    };
    let (ss, sc) = (sum_noise.stddev(), cn.stddev());
    let stddev = (ss * ss + d_hat * d_hat * sc * sc).sqrt() / denom;
    let (lo, hi) = match sum_noise {
        Noise::Gaussian(_) => {
            let z = -phi_inv((1.0 - level) / 2.0) * (1.0 + pow2_neg18());
            match fieller(s, noisy_count, ss, sc, z) {
                Some((dlo, dhi)) => clamp(c + dlo, c + dhi),
                None => (lower, upper),
            }
        }
        Noise::Laplace(m) => {
            let bc = match cn {
                Noise::Laplace(l) => l.scale,
                Noise::Gaussian(g) => g.sigma,
            };
            let x_of = |dmax: f64| {
                laplace_sum_quantile(m.scale, dmax * bc, level) * (1.0 + pow2_neg18())
                    + m.granularity
            };
            match laplace_ratio_set(s, noisy_count, (lower - c, upper - c), x_of) {
                Some((dlo, dhi)) => clamp(c + dlo, c + dhi),
                None => (lower, upper),
            }
        }
    };
    // The release is always inside its interval (widening only raises coverage).
    let (lo, hi) = (lo.min(value), hi.max(value));
    Interval {
        lower: lo,
        upper: hi,
        stddev,
    }
}

/// The declaration of `dp_mean` (listed in [`super::registry::AGGREGATES`]).
pub const DP_MEAN: Aggregate = Aggregate {
    name: "dp_mean",
    summary: "noisy mean of the values clamped to [lower, upper], within [lower, upper]",
    data: &[VALUE],
    params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Rows,
    replaces: &["avg", "mean"],
    internal: false,
    udaf: dp_mean_udaf,
    seeded: |seed| super::dp_mean::DpMean::with_insecure_seed(seed).into(),
    cost: |_, p| declaration::no_data(MeanParams::from_literals, MeanParams::cost, p),
    noise: super::adapter::spec_noise::<MeanParams>,
};

super::interval::ci_variant!(MeanParams, DP_MEAN => DP_MEAN_CI, "dp_mean_ci",
    DpMeanCi, dp_mean_ci_udaf,
    "dp_mean's release with its confidence interval");

#[cfg(test)]
mod tests {
    use super::*;

    /// Round 52 (review "extremes"): bounds whose sensitivity overflows f64 are refused naming
    /// `upper` and the bounds in exponent form, as `dp_sum` refuses them, not as "invalid
    /// argument 'sensitivity': got inf" (an argument dp_mean does not have).
    #[test]
    fn overflowing_sensitivity_names_the_bounds() {
        let max = f64::MAX;
        for (lower, upper, neighbours) in [
            (-max, max, Neighbours::AddRemove),
            (-1e308, 1e308, Neighbours::Replace),
            (-max, max, Neighbours::ReplacePublicN),
        ] {
            for mechanism in [Mechanism::Gaussian, Mechanism::Laplace] {
                let p = MeanParams {
                    lower,
                    upper,
                    epsilon: 1.0,
                    delta: 1e-6,
                    mechanism,
                    neighbours,
                };
                let err = MeanRelease::new(&p).map(|_| ()).unwrap_err().to_string();
                assert!(err.contains("'upper'"), "{err}");
                assert!(!err.contains("sensitivity'"), "{err}");
                assert!(err.contains("e308 (lower "), "{err}");
                assert!(err.len() < 600, "{err}");
            }
        }
    }
}
