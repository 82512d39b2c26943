//! `dp_sum(value, lower, upper, epsilon[, delta[, neighbours]])`: a Gaussian-noised sum of values
//! clamped to [lower, upper].
//!
//! Mechanism: values are clamped and mapped to fixed-point integers on a power-of-two grid q
//! ([`super::exact`]); the exact integer sum S is released once, in `evaluate`, by the Gaussian
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
//! ([`SumRelease::new`]); no charge is made.
//!
//! When lower = upper = 0 every clamped value is 0, the sum is identically 0, and 0 is returned
//! without noise (a constant is private).
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::exact::{FixedPoint, release_exact};
use super::interval::{DpCiUdaf, Interval, Noise, sum_intervals};
use super::laplace::LaplaceSum;
use super::params::{Mechanism, Neighbours, SQRT_2_UP, SumParams, representable};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::{PrivacyError, gaussian_mu};

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
        Ok(match p.mechanism {
            Mechanism::Laplace => Arc::new(LaplaceSum::new(&p)?),
            Mechanism::Gaussian => Arc::new(SumRelease::new(&p)?),
        })
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

/// The release of a `dp_sum` call.
#[derive(Debug, Clone)]
pub(crate) struct SumRelease {
    pub fp: FixedPoint,
    /// `None` when the sensitivity is 0 (lower = upper = 0).
    pub mech: Option<GaussianMechanism>,
}

/// ⌈√2·m⌉ for m ≥ 0, exactly: the smallest k with k² ≥ 2m² (integer square root; m ≤ 2^40, so
/// 2m² ≤ 2^81 fits in `u128`).
pub(crate) fn ceil_sqrt2_times(m: i64) -> i64 {
    let t = 2 * (m.unsigned_abs() as u128).pow(2);
    let k = t.isqrt();
    (if k * k < t { k + 1 } else { k }) as i64
}

impl SumRelease {
    /// The calibration (module docs); also called by [`SumParams::cost`], so the accountant
    /// refuses exactly what the planner refuses.
    pub fn new(p: &SumParams) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        // Sensitivity in grid units (module docs) and the rounding slack in grid steps.
        let (units, slack) = match p.neighbours {
            Neighbours::AddRemove | Neighbours::Units { .. } => (fp.max_abs(), 1.0),
            Neighbours::Replace | Neighbours::ReplacePublicN => (fp.width().max(fp.max_abs()), 1.0),
            Neighbours::ReplacePrivateKeys => {
                (fp.width().max(ceil_sqrt2_times(fp.max_abs())), SQRT_2_UP)
            }
        };
        if units == 0 {
            return Ok(Self { fp, mech: None });
        }
        // units ≤ 2^41 and q = 2^e: the product is exact, or +∞ (refused by the mechanism).
        let sensitivity = units as f64 * fp.step();
        let build = |epsilon: f64| {
            // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
            let mu = p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?);
            GaussianMechanism::from_mu_with_slack(mu, sensitivity, slack)
        };
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        let mech = representable(p.epsilon, ("upper", &bounds), build)?;
        Ok(Self {
            fp,
            mech: Some(mech),
        })
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
            .map(|p| match &self.mech {
                Some(m) => release_exact(m, rng, p.sum, self.fp.exp),
                None => Ok(0.0),
            })
            .collect::<Result<Vec<f64>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match &self.mech {
            Some(m) => format!("Gaussian σ = {}", super::accumulator::short(m.sigma)),
            None => "none (lower = upper = 0)".into(),
        })
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let exp = self.fp.exp;
        let release = |rng: &mut SecureRng, s: i128| match &self.mech {
            Some(m) => release_exact(m, rng, s, exp),
            None => Ok(0.0),
        };
        let noise = self.mech.map(Noise::Gaussian);
        sum_intervals(noise, release, rng, partials, confidence)
    }
}

impl super::interval::DpInterval for SumParams {
    const CI_NAME: &'static str = "dp_sum_ci";
}

/// The `dp_sum_ci` UDAF ([`super::interval`]).
pub type DpSumCi = DpCiUdaf<SumParams>;

/// `dp_sum_ci` as an [`AggregateUDF`].
pub fn dp_sum_ci_udaf() -> AggregateUDF {
    DpSumCi::udaf()
}
