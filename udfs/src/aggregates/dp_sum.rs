//! `dp_sum(value, lower, upper, epsilon[, delta[, neighbours]])`: a Gaussian-noised sum of values
//! clamped to [lower, upper].
//!
//! Mechanism: values are clamped and mapped to fixed-point integers on a power-of-two grid q
//! ([`crate::mechanisms::exact`]); the exact integer sum S is released once, in `evaluate`, by the Gaussian
//! mechanism with μ = gaussian_mu(ε, δ), so the call is (ε, δ)-DP. Sensitivity (exact, in grid
//! units, times q):
//! - `add_remove`: max(|lo|, |hi|) ≈ max(|lower|, |upper|) (one row in or out);
//! - `replace`, `replace_public_n`: max(hi − lo, |lo|, |hi|) (a value changes anywhere in the
//!   range, or to/from NULL);
//! - `replace_private_keys`: max(hi − lo, ⌈√2·max(|lo|, |hi|)⌉), the L2 sensitivity of the vector
//!   of per-group sums. The changed row either stays in its group (|x − x'| ≤ hi − lo, or
//!   |x| ≤ max(|lo|, |hi|) to/from NULL) or leaves group a with x and joins group b with x'
//!   (‖Δ‖₂ = √(x² + x'²) ≤ √2·max(|lo|, |hi|)). ⌈√2·m⌉ is computed exactly in integers
//!   ([`ceil_sqrt2_times`]). Rounding to the noise grid can add a step to each of the two sums,
//!   so σ = (Δ + √2·g)/μ ([`GaussianMechanism`], type docs).
//!
//! A call whose noise is not representable (σ = Δ/μ above 2^1000, e.g. bounds ±1e308, or below
//! 2^−990, e.g. bounds ±1e-300 at a large ε) is refused at planning with an error naming the
//! argument to change, by the same constructor that the accountant's cost uses
//! ([`SumRelease::new`]); no charge is made. Bounds whose sensitivity overflows `f64` (near
//! ±`f64::MAX`) are refused the same way, naming `upper` (round 52).
//!
//! When lower = upper = 0 every clamped value is 0, the sum is identically 0, and 0 is returned
//! without noise (a constant is private).
//!
//! # Laplace (`mechanism => 'laplace'`): L1 sensitivity
//! Released with the exact discrete Laplace (Canonne, Kamath, Steinke 2020, Algorithm 2) so
//! that the call is pure ε-DP (δ = 0), charged as `Event::PureDp { ε }`
//! ([`super::params::Mechanism`] gives the scale b = (Δ₁ + slack·g)/ε and why not
//! `Event::Laplace`). One changed row (or unit) changes:
//! - `dp_sum` (grid units, [`FixedPoint`]): `add_remove` m = max(|lo|, |hi|); `replace`,
//!   `replace_public_n` max(hi − lo, m); `replace_private_keys` max(hi − lo, 2m) (|x| + |x'| when
//!   the row moves between groups), rounding slack 2g; `units:K:C` K·C·m with slack K·C
//!   (per group C·m + g ≤ C·(m + g), summed over K groups).
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
use super::params::{Mechanism, Neighbours, Params, SQRT_2_UP, representable};
use crate::mechanisms::exact::FixedPoint;
use crate::mechanisms::{GaussianMechanism, Interval, LaplaceMechanism, Noise};
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// `dp_sum(value, lower, upper, epsilon, delta, neighbours)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SumParams {
    pub lower: f64,
    pub upper: f64,
    pub epsilon: f64,
    pub delta: f64,
    pub mechanism: Mechanism,
    pub neighbours: Neighbours,
}

impl SumParams {
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = Params::new(&DP_SUM, args)?;
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
    pub fn mu(&self) -> Result<f64, PrivacyError> {
        gaussian_mu(self.epsilon, self.delta)
    }
    /// Builds the release too (as [`CountParams::cost`]).
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        SumRelease::new(self)?;
        self.mechanism.cost(self.epsilon, self.delta)
    }
}

/// The `dp_sum` UDAF.
pub type DpSum = DpUdaf<SumParams>;

/// `dp_sum` as an [`AggregateUDF`].
pub fn dp_sum_udaf() -> AggregateUDF {
    DpSum::udaf()
}

impl DpFunction for SumParams {
    const NAME: &'static str = "dp_sum";
    fn spec() -> &'static Spec {
        &SPEC
    }
    fn declaration() -> &'static Aggregate {
        &DP_SUM
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Numeric,
    returns: DataType::Float64,
    shape: Shape {
        sum: true,
        sum_sq: false,
        count: false,
        rows: false,
    },
    release: |lits| {
        let p = SumParams::from_literals(lits)?;
        Ok(Arc::new(SumRelease::new(&p)?))
    },
    description: "Differentially private sum. Each non-NULL, non-NaN value is clamped to [lower, \
         upper] (±infinity included) and mapped to a fixed-point integer on a power-of-two grid, \
         so the exact sum does not depend on row order or partitioning. The sum is released once \
         with discrete Gaussian noise calibrated so that the call is (epsilon, delta)-DP (one \
         μ-GDP release, μ = gaussian_mu(epsilon, delta)). Sensitivity: max(|lower|, |upper|) under \
         add/remove neighbours; max(upper − lower, |lower|, |upper|) under replace neighbours; \
         max(upper − lower, √2·max(|lower|, |upper|)) under replace neighbours with a private \
         GROUP BY key (a changed row can leave one group and join another). Bounds or an epsilon \
         whose noise is not representable (σ above 2^1000 or below 2^-990) fail at planning with \
         the range that works. Returns Float64; an empty input releases noise around 0.",
    example: "SELECT dp_sum(salary, 0, 200000, 0.5) FROM salaries;\n\
         SELECT dp_sum(value => salary, lower => 0, upper => 200000, epsilon => 0.5, \
         delta => 1e-6) FROM salaries;",
    related: &["dp_count", "dp_mean"],
};

/// The release of a `dp_sum` call: the exact fixed-point sum plus one [`Noise`], calibrated per
/// noise kind side by side.
#[derive(Debug, Clone)]
pub(crate) struct SumRelease {
    pub fp: FixedPoint,
    /// `None` when the sensitivity is 0 (lower = upper = 0).
    pub noise: Option<Noise>,
}

/// ⌈√2·m⌉ for m ≥ 0, exactly: the smallest k with k² ≥ 2m² (integer square root; m ≤ 2^40, so
/// 2m² ≤ 2^81 fits in `u128`).
pub(crate) fn ceil_sqrt2_times(m: i64) -> i64 {
    let t = 2 * (m.unsigned_abs() as u128).pow(2);
    let k = t.isqrt();
    (if k * k < t { k + 1 } else { k }) as i64
}

/// The bounds as a refusal names them (the argument `upper`), in exponent form: `{}` printed
/// ±1e308 with 309 digits (round 52, review "extremes").
pub(crate) fn bounds_text(lower: f64, upper: f64) -> String {
    format!("{upper:e} (lower {lower:e})")
}

/// The sensitivity in value units, refused at planning when it overflows `f64` (bounds near
/// ±`f64::MAX`, or a width or unit factor that takes them there), naming the analyst's
/// arguments (round 52, review "extremes": the mechanism's own check answered "invalid argument
/// 'sensitivity': got inf", an argument `dp_sum` does not have).
pub(crate) fn finite_sensitivity(sensitivity: f64, bounds: &str) -> Result<f64, PrivacyError> {
    if sensitivity.is_finite() {
        Ok(sensitivity)
    } else {
        Err(PrivacyError::invalid(
            "upper",
            bounds,
            "bounds whose sensitivity (max(|lower|, |upper|), or upper − lower when a row may be \
             replaced, times the privacy unit's factor) is a finite number: at these bounds it \
             overflows f64 (above 1.8e308); give lower and upper that enclose the values \
             closely, e.g. within ±1e300 (the noise grows with them)",
        ))
    }
}

impl SumRelease {
    /// The calibration (module docs; Laplace: module docs, "Laplace"); also
    /// called by [`SumParams::cost`], so the accountant refuses exactly what the planner
    /// refuses.
    pub fn new(p: &SumParams) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let m = fp.max_abs();
        let bounds = bounds_text(p.lower, p.upper);
        let noise = match p.mechanism {
            Mechanism::Gaussian => {
                // L2 sensitivity in grid units (module docs) and the rounding slack in steps.
                let (units, slack) = match p.neighbours {
                    Neighbours::AddRemove | Neighbours::Units { .. } => (m, 1.0),
                    Neighbours::Replace | Neighbours::ReplacePublicN => (fp.width().max(m), 1.0),
                    Neighbours::ReplacePrivateKeys => {
                        (fp.width().max(ceil_sqrt2_times(m)), SQRT_2_UP)
                    }
                };
                if units == 0 {
                    return Ok(Self { fp, noise: None });
                }
                // units ≤ 2^41 and q = 2^e: the product is exact, or +∞ (refused by the
                // mechanism).
                let sensitivity = finite_sensitivity(units as f64 * fp.step(), &bounds)?;
                let build = |epsilon: f64| {
                    // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
                    let mu = p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?);
                    GaussianMechanism::from_mu_with_slack(mu, sensitivity, slack)
                };
                Noise::Gaussian(representable(p.epsilon, ("upper", &bounds), build)?)
            }
            Mechanism::Laplace => {
                // L1 sensitivity in grid units and rounding slack in grid steps.
                let (units, slack) = match p.neighbours {
                    Neighbours::AddRemove | Neighbours::Units { .. } => (m as f64, 1.0),
                    Neighbours::Replace | Neighbours::ReplacePublicN => {
                        (fp.width().max(m) as f64, 1.0)
                    }
                    Neighbours::ReplacePrivateKeys => (fp.width().max(2 * m) as f64, 2.0),
                };
                if units == 0.0 {
                    return Ok(Self { fp, noise: None });
                }
                // K·C under `units:K:C` (1 otherwise), on the sensitivity and the slack.
                let f = p.neighbours.unit_l1_factor();
                // units ≤ 2^42, K·C ≤ 10^12, q = 2^e: products exact or rounded up by one ulp.
                let sensitivity = finite_sensitivity((f * units * fp.step()).next_up(), &bounds)?;
                let build = |epsilon: f64| {
                    LaplaceMechanism::from_epsilon_with_slack(epsilon, sensitivity, f * slack)
                };
                Noise::Laplace(representable(p.epsilon, ("upper", &bounds), build)?)
            }
        };
        Ok(Self {
            fp,
            noise: Some(noise),
        })
    }

    /// One group's release: the exact sum plus one draw (0 without noise).
    fn draw(&self, rng: &mut SecureRng, p: &Partial) -> Result<f64> {
        match &self.noise {
            Some(n) => n.release(rng, p.sum, self.fp.exp),
            None => Ok(0.0),
        }
    }
}

impl Finalise for SumRelease {
    fn shape(&self) -> Shape {
        SPEC.shape
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| self.draw(rng, p))
            .collect::<Result<Vec<f64>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match &self.noise {
            Some(n) => n.describe(),
            None => "none (lower = upper = 0)".into(),
        })
    }
    /// The same draws as [`Self::finalise`], each with raw ± (k + 1)·g ([`Noise::interval`]:
    /// the release is not post-processed, so neither is the interval); [0, 0] without noise.
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let mut values = Vec::with_capacity(partials.len());
        let mut out = Vec::with_capacity(partials.len());
        for p in partials {
            let raw = self.draw(rng, p)?;
            values.push(raw);
            out.push(Some(match &self.noise {
                Some(n) => n.interval(raw, confidence),
                None => Interval {
                    lower: 0.0,
                    upper: 0.0,
                    stddev: 0.0,
                },
            }));
        }
        Ok((Arc::new(Float64Array::from(values)), out))
    }
}

/// The declaration of `dp_sum` (listed in [`super::registry::AGGREGATES`]).
pub const DP_SUM: Aggregate = Aggregate {
    name: "dp_sum",
    summary: "noisy sum of the values clamped to [lower, upper]",
    data: &[VALUE],
    params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Total,
    replaces: &["sum"],
    internal: false,
    udaf: dp_sum_udaf,
    seeded: |seed| super::dp_sum::DpSum::with_insecure_seed(seed).into(),
    cost: |_, p| declaration::no_data(SumParams::from_literals, SumParams::cost, p),
    noise: super::adapter::spec_noise::<SumParams>,
};

super::interval::ci_variant!(SumParams, DP_SUM => DP_SUM_CI, "dp_sum_ci",
    DpSumCi, dp_sum_ci_udaf,
    "dp_sum's release with its confidence interval");

#[cfg(test)]
mod tests {
    use super::*;

    fn params(lower: f64, upper: f64, mechanism: Mechanism, neighbours: Neighbours) -> SumParams {
        SumParams {
            lower,
            upper,
            epsilon: 1.0,
            delta: 1e-6,
            mechanism,
            neighbours,
        }
    }

    /// Bounds at ±f64::MAX (and ±1e308 when a row may be replaced: upper − lower overflows)
    /// are refused naming `upper`, with the bounds in exponent form and what to do, never as
    /// an argument 'sensitivity' the function does not have (round 52, review "extremes").
    #[test]
    fn overflowing_sensitivity_names_the_bounds() {
        let max = f64::MAX;
        for (lower, upper, neighbours) in [
            (-max, max, Neighbours::AddRemove),
            (0.0, max, Neighbours::AddRemove),
            (-1e308, 1e308, Neighbours::Replace),
        ] {
            for mechanism in [Mechanism::Gaussian, Mechanism::Laplace] {
                let err = SumRelease::new(&params(lower, upper, mechanism, neighbours))
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("'upper'"), "{err}");
                assert!(!err.contains("sensitivity'"), "{err}");
                assert!(err.contains("e308 (lower "), "{err}");
                assert!(err.contains("enclose the values"), "{err}");
                assert!(err.len() < 600, "{err}");
            }
        }
        // Wide but finite: a release (or a refusal about epsilon, never about 'sensitivity').
        let ok = SumRelease::new(&params(
            -1e300,
            1e300,
            Mechanism::Gaussian,
            Neighbours::AddRemove,
        ));
        assert!(ok.is_ok(), "{ok:?}");
    }
}
