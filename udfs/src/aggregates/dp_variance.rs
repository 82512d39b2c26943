//! `dp_variance(value, lower, upper, epsilon[, delta[, neighbours]])` and `dp_stddev(…)`: the
//! (population) variance and standard deviation of the values clamped to [lower, upper], always
//! within [0, (upper − lower)²/4] (resp. [0, (upper − lower)/2]).
//!
//! # Estimator
//! Google's differential-privacy library, `BoundedVariance` (cc/algorithms/bounded-variance.h):
//! release a noisy count, a noisy sum of the centred values and a noisy sum of their squares;
//! the variance is (mean of squares) − (mean)², clamped to [0, (upper − lower)²/4]. Centring at
//! c = (lower + upper)/2 (as `dp_mean` does) makes every centred value lie in [−h, h],
//! h = (upper − lower)/2, so the square sum moves by at most h² per row instead of
//! max(lower², upper²), and the variance is unchanged by the shift.
//!
//! # Exact partials
//! A value's fixed-point integer x ∈ [lo, hi] ([`super::exact::FixedPoint`], step q) is centred in
//! half-units, y = 2x − (lo + hi) ∈ [−w, w] (w = [`FixedPoint::width`], the real centred value is
//! y·q/2). Per group the accumulator keeps, exactly and independently of the partitioning:
//! - S₁ = Σ y (computed as 2·Σx − (lo + hi)·n from the `sum` field, as `dp_mean` does);
//! - S₂ = Σ s(y), s(y) = round(y²/2^shift) ∈ [0, M] on its own grid ([`SquareGrid`]: M ≤ 2^40 + 1;
//!   k rows sum to less than k·2^41 < 2^105 in the `i128` partials, no overflow);
//! - n, the number of non-NULL, non-NaN values.
//!
//! # Noise: three Gaussian releases sharing one μ
//! μ = gaussian_mu(ε, δ). The releases S̃₁ = S₁ + N(0, σ₁²), S̃₂ = S₂ + N(0, σ₂²),
//! ñ = n + N(0, σ_c²) with σ₁ = Δ₁/μ₁, σ₂ = M/μ₂, σ_c = 1/μ_c (plus one grid step of rounding slack
//! each) and μ₁² + μ₂² + μ_c² ≤ μ² are together μ-GDP: Gaussian releases compose exactly,
//! μ'² = Σ (change/σ)² over the released coordinates (Dong, Roth, Su 2019, "Gaussian
//! Differential Privacy", Cor. 3.3), so the call is (ε, δ)-DP. Sensitivities (integer units):
//! - `add_remove` (and `units:K:C`, with μ/(√K·C): [`super::params::Neighbours::calibration_mu`]): a row in or
//!   out moves S₁ by ≤ w, S₂ by ≤ M, n by 1: Δ₁ = w, μ'² ≤ μ₁² + μ₂² + μ_c²;
//! - `replace`, `replace_public_n` (calibrated as `replace`: the public n is not used): a value
//!   change moves S₁ by ≤ 2w and S₂ by ≤ M (n fixed), a change to/from NULL moves them by ≤ w,
//!   ≤ M and 1: Δ₁ = 2w, μ'² ≤ max(μ₁² + μ₂², μ₁²/4 + μ₂² + μ_c²) ≤ μ²;
//! - `replace_private_keys`: as `replace`, plus a row moving from group a to group b, which moves
//!   each group's S₁ by ≤ w, S₂ by ≤ M, n by 1 (two groups): with Δ₁ = 2w and two grid steps of
//!   slack on S₁ (σ₁ = (2w + 2g₁)/μ₁), μ'² ≤ 2(μ₁/2)² + 2μ₂² + 2μ_c² = μ₁²/2 + 2μ₂² + 2μ_c², which
//!   with the `replace` split below (μ₁² = 4μ²/6, μ₂² = μ_c² = μ²/6) is exactly μ².
//!
//! # Split of μ (minimax, derived here)
//! In normalised units (values y/w ∈ [−1, 1]; m₁ = S₁/(wn), m₂ = S₂·2^shift/(w²n)) the estimate
//! is v = m₂ − m₁². To first order its error is (Z₂ − 2m₁Z₁ − (m₂ − 2m₁²)Z_c)/n (Zᵢ the noises in
//! normalised units), of variance (σ₂'² + 4m₁²σ₁'² + (m₂ − 2m₁²)²σ_c²)/n². All values at one
//! bound (m₁ = ±1, m₂ = 1) maximises the three coefficients at once, so the worst case over data
//! is (a₂/μ₂² + a₁/μ₁² + a_c/μ_c²)/n² with a₂ = 1, a₁ = 4(Δ₁/w)², a_c = 1. Minimising Σ aᵢ/μᵢ²
//! subject to Σ μᵢ² = μ² (Lagrange: aᵢ/μᵢ⁴ constant) gives μᵢ² ∝ √aᵢ:
//! μ₂² : μ₁² : μ_c² = 1 : 2 : 1 under `add_remove` (Δ₁ = w) and 1 : 4 : 1 under the replace modes
//! (Δ₁ = 2w). Each share is shrunk by 1 − 10⁻¹² so that the sum stays ≤ μ² after rounding.
//!
//! # Post-processing
//! ñ' = max(ñ, 1); m̃₁ = clamp(S̃₁/(w·ñ'), −1, 1); m̃₂ = clamp(S̃₂·2^shift/(w²·ñ'), 0, 1);
//! v = clamp(m̃₂ − m̃₁², 0, 1); variance = v·(w·q/2)², at most (upper − lower)²/4 (and at most
//! `f64::MAX`: bounds wider than about ±6.7e153 would saturate there, so an upper − lower above
//! 2^511 ≈ 6.7e153 is refused at planning, [`MAX_WIDTH`]); stddev = √v·(w·q/2), at most
//! (upper − lower)/2. All of it is post-processing of the three releases.
//!
//! Error: with all three noises of order σ ≈ (upper − lower)²/(4μᵢ) in value units, the error of
//! the variance is of order (upper − lower)²/(μ·n) (and O(√(variance)·(upper − lower)/(μn)) for
//! m̃₁), so for n ≫ 1/μ it falls as 1/n at fixed ε.
//!
//! lower = upper: every clamped value is the same, and 0 is returned without noise.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::{DataArg, Fin};
use super::exact::{FixedPoint, SquareGrid, pow2, release_exact};
use super::interval::{DpCiUdaf, Interval, Noise, variance_intervals};
use super::laplace::LaplaceVariance;
use super::params::{MeanParams, Mechanism, representable};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// `dp_variance(value, lower, upper, epsilon, delta, neighbours)`: the parameters of `dp_mean`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VarianceParams(pub MeanParams);

/// `dp_stddev(value, lower, upper, epsilon, delta, neighbours)`: the parameters of `dp_mean`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StddevParams(pub MeanParams);

/// The widest `upper − lower` whose variance bound (upper − lower)²/4 is a finite `f64` with
/// room to spare: 2^511 ≈ 6.7e153 ((2^511)²/4 = 2^1020 < `f64::MAX` ≈ 2^1024). Wider bounds would
/// release a variance saturated at `f64::MAX` (or 0 after rounding) whatever the data: a
/// meaningless release, refused at planning with this range (issue 33).
pub const MAX_WIDTH: f64 = 6.703903964971299e153;

/// `MeanParams::from_literals` plus the width check ([`MAX_WIDTH`]) of `dp_variance`,
/// `dp_stddev` and their `_ci` variants.
fn variance_literals(args: &[ScalarValue]) -> Result<MeanParams, PrivacyError> {
    let p = MeanParams::from_literals(args)?;
    if p.upper - p.lower > MAX_WIDTH {
        return Err(PrivacyError::invalid(
            "upper",
            format!("{:e} (lower {:e})", p.upper, p.lower),
            "upper − lower ≤ 2^511 ≈ 6.7e153, so that the variance's range (upper − lower)²/4 \
             is a finite number (wider bounds release f64::MAX or 0 whatever the data); give \
             bounds that enclose the values closely: the noise grows with upper − lower",
        ));
    }
    Ok(p)
}

impl VarianceParams {
    pub const NAMES: [&'static str; 6] = MeanParams::NAMES;
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        variance_literals(args).map(Self)
    }
    /// One μ-GDP release (module docs), or one pure ε-DP release under `mechanism => 'laplace'`
    /// ([`super::laplace::LaplaceVariance`]). Builds the release too, so the accountant refuses
    /// exactly what the planner refuses.
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        if self.0.mechanism == Mechanism::Laplace {
            LaplaceVariance::new(&self.0, false)?;
            return Ok(vec![Event::PureDp {
                epsilon: self.0.epsilon,
            }]);
        }
        VarianceRelease::new(&self.0, false)?;
        Ok(vec![Event::Gaussian {
            mu: gaussian_mu(self.0.epsilon, self.0.delta)?,
        }])
    }
}

impl StddevParams {
    pub const NAMES: [&'static str; 6] = MeanParams::NAMES;
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        variance_literals(args).map(Self)
    }
    /// As [`VarianceParams::cost`]: the square root is post-processing.
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        VarianceParams(self.0).cost()
    }
}

/// The `dp_variance` UDAF.
pub type DpVariance = DpUdaf<VarianceParams>;
/// The `dp_stddev` UDAF.
pub type DpStddev = DpUdaf<StddevParams>;

/// `dp_variance` as an [`AggregateUDF`].
pub fn dp_variance_udaf() -> AggregateUDF {
    DpVariance::udaf()
}

/// `dp_stddev` as an [`AggregateUDF`].
pub fn dp_stddev_udaf() -> AggregateUDF {
    DpStddev::udaf()
}

impl DpFunction for VarianceParams {
    const NAME: &'static str = "dp_variance";
    fn spec() -> &'static Spec {
        &VARIANCE_SPEC
    }
}

impl DpFunction for StddevParams {
    const NAME: &'static str = "dp_stddev";
    fn spec() -> &'static Spec {
        &STDDEV_SPEC
    }
}

pub(crate) const SHAPE: Shape = Shape {
    sum: true,
    sum_sq: true,
    count: true,
    rows: false,
};

const HOW: &str = "From three Gaussian releases sharing the call's μ = gaussian_mu(epsilon, delta) \
     (one μ-GDP release, so the call is (epsilon, delta)-DP): a noisy count of the non-NULL \
     values, a noisy sum of (clamped value − midpoint) and a noisy sum of its squares, on exact \
     fixed-point grids (the same result for any partitioning). variance = mean of squares − \
     mean², clamped to [0, (upper − lower)²/4] (Google's BoundedVariance). With mechanism => \
     'laplace': the same three sums with discrete Laplace noise splitting epsilon (pure \
     epsilon-DP, delta unused). NULL and NaN values are skipped; ±infinity is clamped. Bounds or an epsilon whose noise is not representable \
     fail at planning with the range that works.";

static VARIANCE_SPEC: Spec = Spec {
    data: DataArg::Numeric,
    returns: DataType::Float64,
    shape: SHAPE,
    release: |lits| release(&VarianceParams::from_literals(lits)?.0, false),
    description: HOW,
    example: "SELECT job, dp_variance(salary, 0, 200000, 1.0, 1e-6) FROM salaries GROUP BY job;",
    related: &["dp_stddev", "dp_mean"],
};

static STDDEV_SPEC: Spec = Spec {
    data: DataArg::Numeric,
    returns: DataType::Float64,
    shape: SHAPE,
    release: |lits| release(&StddevParams::from_literals(lits)?.0, true),
    description: HOW,
    example: "SELECT job, dp_stddev(salary, 0, 200000, 1.0, 1e-6) FROM salaries GROUP BY job;",
    related: &["dp_variance", "dp_mean"],
};

/// The release of one call: Gaussian (module docs) or, under `mechanism => 'laplace'`,
/// [`LaplaceVariance`].
fn release(p: &MeanParams, stddev: bool) -> Result<Fin, PrivacyError> {
    Ok(match p.mechanism {
        Mechanism::Laplace => Arc::new(LaplaceVariance::new(p, stddev)?),
        Mechanism::Gaussian => Arc::new(VarianceRelease::new(p, stddev)?),
    })
}

/// Calibrations are rounded outward: each μ share is shrunk by this factor so that
/// μ₁² + μ₂² + μ_c² ≤ μ² despite floating-point rounding.
const SPLIT_SHRINK: f64 = 1.0 - 1e-12;

/// The three releases of a `dp_variance` / `dp_stddev` call (`None` when lower = upper).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mechs {
    /// S₁ = Σ y, in half-units.
    pub sum: GaussianMechanism,
    /// S₂ = Σ s(y), in square-grid units.
    pub sum_sq: GaussianMechanism,
    /// n.
    pub count: GaussianMechanism,
}

/// The release of a `dp_variance` or `dp_stddev` call.
#[derive(Debug, Clone)]
pub(crate) struct VarianceRelease {
    pub fp: FixedPoint,
    pub sq: SquareGrid,
    pub mechs: Option<Mechs>,
    /// √ of the variance (`dp_stddev`).
    pub stddev: bool,
}

impl VarianceRelease {
    /// The calibration (module docs); also called by the parameter structs' `cost`.
    pub fn new(p: &MeanParams, stddev: bool) -> Result<Self, PrivacyError> {
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        representable(p.epsilon, ("upper", &bounds), |epsilon| {
            // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
            Self::at(
                p,
                p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?),
                stddev,
            )
        })
    }

    fn at(p: &MeanParams, mu: f64, stddev: bool) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let sq = SquareGrid::new(&fp);
        let w = fp.width();
        let mut mechs = None;
        if w > 0 {
            let nb = p.neighbours;
            // Δ₁ = w (add_remove, units) or 2w (replace modes); weights √aᵢ (module docs).
            let (d1, r1) = if nb.is_replace() {
                (2.0 * w as f64, 4.0)
            } else {
                (w as f64, 2.0)
            };
            let total = r1 + 2.0;
            let share = |r: f64| mu * (r / total).sqrt() * SPLIT_SHRINK;
            // Rounding slack: two grid steps on S₁ when a row can move between groups.
            let slack = if nb.moves_between_groups() { 2.0 } else { 1.0 };
            mechs = Some(Mechs {
                sum: GaussianMechanism::from_mu_with_slack(share(r1), d1, slack)?,
                sum_sq: GaussianMechanism::from_mu(share(1.0), sq.max as f64)?,
                count: GaussianMechanism::from_mu(share(1.0), 1.0)?,
            });
        }
        Ok(Self {
            fp,
            sq,
            mechs,
            stddev,
        })
    }

    /// The normalised variance v ∈ [0, 1] of one group (module docs, "Post-processing").
    fn normalised(&self, m: &Mechs, rng: &mut SecureRng, p: &Partial) -> Result<f64> {
        let (s1, s2, n) = self.draws(m, rng, p)?;
        Ok(normalised_variance(&self.fp, &self.sq, s1, s2, n))
    }

    fn release_one(&self, rng: &mut SecureRng, p: &Partial) -> Result<f64> {
        let Some(m) = &self.mechs else {
            return Ok(0.0);
        };
        let v = self.normalised(m, rng, p)?;
        Ok(variance_output(&self.fp, v, self.stddev))
    }

    /// The three draws (S̃₁, S̃₂, ñ), in the order [`Self::normalised`] makes them.
    fn draws(&self, m: &Mechs, rng: &mut SecureRng, p: &Partial) -> Result<(f64, f64, f64)> {
        let s1 = release_exact(&m.sum, rng, centred_sum(&self.sq, p), 0)?;
        let s2 = release_exact(&m.sum_sq, rng, p.sum_sq, 0)?;
        let n = release_exact(&m.count, rng, p.count as i128, 0)?;
        Ok((s1, s2, n))
    }
}

/// S₁ = Σ y = 2·Σx − (lo + hi)·n, in half-units (module docs, "Exact partials").
pub(crate) fn centred_sum(sq: &SquareGrid, p: &Partial) -> i128 {
    let mid = sq.mid as i128;
    p.sum
        .saturating_mul(2)
        .saturating_sub(mid.saturating_mul(p.count as i128))
}

/// v ∈ [0, 1] from the noisy S̃₁ (half-units), S̃₂ (square-grid units) and ñ (module docs,
/// "Post-processing"; post-processing of the releases, whichever noise they carry).
pub(crate) fn normalised_variance(
    fp: &FixedPoint,
    sq: &SquareGrid,
    s1: f64,
    s2: f64,
    n: f64,
) -> f64 {
    let w = fp.width() as f64;
    let n = n.max(1.0);
    let m1 = (s1 / w / n).clamp(-1.0, 1.0);
    let m2 = (s2 * pow2(sq.shift as i32) / w / w / n).clamp(0.0, 1.0);
    (m2 - m1 * m1).clamp(0.0, 1.0)
}

/// The variance (or, with `stddev`, its square root) in value units from v.
pub(crate) fn variance_output(fp: &FixedPoint, v: f64, stddev: bool) -> f64 {
    // h = w·q/2 ≥ (upper − lower)/2; the results are clamped to the nominal bounds.
    let half = pow2(fp.exp - 1);
    let w = fp.width() as f64;
    let h_nominal = fp.upper / 2.0 - fp.lower / 2.0;
    let sd = (v.sqrt() * w * half).min(h_nominal);
    if stddev { sd } else { (sd * sd).min(f64::MAX) }
}

impl Finalise for VarianceRelease {
    fn shape(&self) -> Shape {
        SHAPE
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn square_grid(&self) -> Option<SquareGrid> {
        Some(self.sq)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| self.release_one(rng, p))
            .collect::<Result<Vec<f64>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match &self.mechs {
            Some(m) => {
                // In value units: S₁ is in half-units q/2, S₂ in units 2^shift·(q/2)².
                let half = pow2(self.fp.exp - 1);
                let sq_unit = pow2(self.sq.shift as i32) * half * half;
                let s = crate::mechanisms::noise::short;
                format!(
                    "Gaussian σ = {} on the count, σ = {} on the sum of (value − midpoint), \
                     σ = {} on the sum of its squares",
                    s(m.count.sigma),
                    s(m.sum.sigma * half),
                    s(m.sum_sq.sigma * sq_unit)
                )
            }
            None => "none (lower = upper)".into(),
        })
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let noises = self.mechs.map(|m| {
            [
                Noise::Gaussian(m.sum),
                Noise::Gaussian(m.sum_sq),
                Noise::Gaussian(m.count),
            ]
        });
        let draw = |rng: &mut SecureRng, p: &Partial| match &self.mechs {
            Some(m) => self.draws(m, rng, p),
            None => Ok((0.0, 0.0, 0.0)),
        };
        variance_intervals(
            (&self.fp, &self.sq),
            noises,
            draw,
            self.stddev,
            rng,
            partials,
            confidence,
        )
    }
}

impl super::interval::DpInterval for VarianceParams {
    const CI_NAME: &'static str = "dp_variance_ci";
}

impl super::interval::DpInterval for StddevParams {
    const CI_NAME: &'static str = "dp_stddev_ci";
}

/// The `dp_variance_ci` UDAF ([`super::interval`]).
pub type DpVarianceCi = DpCiUdaf<VarianceParams>;
/// The `dp_stddev_ci` UDAF ([`super::interval`]).
pub type DpStddevCi = DpCiUdaf<StddevParams>;

/// `dp_variance_ci` as an [`AggregateUDF`].
pub fn dp_variance_ci_udaf() -> AggregateUDF {
    DpVarianceCi::udaf()
}

/// `dp_stddev_ci` as an [`AggregateUDF`].
pub fn dp_stddev_ci_udaf() -> AggregateUDF {
    DpStddevCi::udaf()
}

#[cfg(test)]
mod width_tests {
    use super::*;

    #[test]
    fn bounds_too_wide_for_a_finite_variance_are_refused_with_the_range() {
        let f = |x: f64| ScalarValue::Float64(Some(x));
        let args = |u: f64| [f(0.0), f(u), f(1.0), f(1e-6)];
        // (2^511)²/4 = 2^1020 is finite: the widest range admitted.
        assert!((MAX_WIDTH / 2.0).powi(2).is_finite());
        assert_eq!(MAX_WIDTH, pow2(511));
        assert!(VarianceParams::from_literals(&args(MAX_WIDTH)).is_ok());
        assert!(StddevParams::from_literals(&args(1e150)).is_ok());
        for u in [MAX_WIDTH.next_up(), 1e200, 1e300] {
            for e in [
                VarianceParams::from_literals(&args(u)).unwrap_err(),
                StddevParams::from_literals(&args(u)).unwrap_err(),
            ] {
                let m = e.to_string();
                assert!(m.contains("upper") && m.contains("6.7e153"), "{m}");
            }
        }
    }
}
