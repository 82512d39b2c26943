//! `dp_count(value, epsilon[, delta[, neighbours]])`: a Gaussian-noised count of the non-NULL
//! (and, for floating-point columns, non-NaN) values.
//!
//! Mechanism: the exact count is released once, in `evaluate`, by the Gaussian mechanism with
//! μ = gaussian_mu(ε, δ), then rounded to the nearest integer and clamped at 0
//! (post-processing). The result is Int64 and never negative. L2 sensitivity of the vector of
//! per-group counts:
//! - `add_remove`, `replace`, `replace_public_n`: 1 (one row in or out, or one value turning
//!   NULL under `replace`, moves one group's count by 1);
//! - `replace_private_keys`: √2 (the changed row can leave group a and join group b: c_a − 1 and
//!   c_b + 1, so ‖Δc‖₂ = √(1² + 1²)). Rounding to the noise grid can then add a step to each of
//!   the two counts, so σ = (√2 + √2·g)/μ ([`GaussianMechanism`], type docs). σ is √2 times the
//!   `add_remove` one (test `replace_private_keys_sigma_ratios`).
//!
//! A call whose noise is not representable (σ above 2^1000 or its grid below 2^−1018: only for
//! a δ so small that no Gaussian noise level meets it) is refused at planning, by the same
//! constructor that the accountant's cost uses ([`CountRelease::new`]).
//!
//! # Laplace (`mechanism => 'laplace'`): L1 sensitivity
//! Released with the exact discrete Laplace (Canonne, Kamath, Steinke 2020, Algorithm 2) so
//! that the call is pure ε-DP (δ = 0), charged as `Event::PureDp { ε }`
//! ([`super::params::Mechanism`] gives the scale b = (Δ₁ + slack·g)/ε and why not
//! `Event::Laplace`). One changed row (or unit) changes:
//! - `dp_count`: one group's count by 1 (`add_remove`, `replace`, `replace_public_n`: a value
//!   turning NULL); two groups' counts by 1 each under `replace_private_keys` (L1 = 2, not the
//!   √2 of L2); under `units:K:C` up to C rows in each of K groups: L1 = K·C (not √K·C).
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::declaration::{
    self, Aggregate, COUNTED, DELTA, EPSILON, MECHANISM, NEIGHBOURS, UnitRule,
};
use super::params::{Mechanism, Neighbours, Params, SQRT_2_UP, representable};
use crate::mechanisms::exact::FixedPoint;
use crate::mechanisms::{GaussianMechanism, Interval, LaplaceMechanism, Noise};
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// `dp_count(value, epsilon, delta, neighbours)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CountParams {
    pub epsilon: f64,
    pub delta: f64,
    pub mechanism: Mechanism,
    pub neighbours: Neighbours,
}

impl CountParams {
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        Self::read(&Params::new(&DP_COUNT, args)?)
    }

    /// From the literals of `dp_count` or of a function declaring a subset of its parameters
    /// (`dp_count_distinct`: no `mechanism`, so Gaussian).
    pub(crate) fn read(p: &Params) -> Result<Self, PrivacyError> {
        Ok(Self {
            epsilon: p.epsilon()?,
            delta: p.delta()?,
            mechanism: p.mechanism()?,
            neighbours: p.neighbours()?,
        })
    }
    /// The Gaussian-DP parameter of the whole call.
    pub fn mu(&self) -> Result<f64, PrivacyError> {
        gaussian_mu(self.epsilon, self.delta)
    }
    /// Builds the release too (the one constructor the planner uses), so that the accountant
    /// refuses exactly the calls that execution would refuse.
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        CountRelease::new(self)?;
        self.mechanism.cost(self.epsilon, self.delta)
    }
}

/// The `dp_count` UDAF.
pub type DpCount = DpUdaf<CountParams>;

/// `dp_count` as an [`AggregateUDF`].
pub fn dp_count_udaf() -> AggregateUDF {
    DpCount::udaf()
}

impl DpFunction for CountParams {
    const NAME: &'static str = "dp_count";
    fn spec() -> &'static Spec {
        &SPEC
    }
    fn declaration() -> &'static Aggregate {
        &DP_COUNT
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Any,
    returns: DataType::Int64,
    shape: Shape {
        sum: false,
        sum_sq: false,
        count: true,
        rows: false,
    },
    release: |lits| {
        let p = CountParams::from_literals(lits)?;
        Ok(Arc::new(CountRelease::new(&p)?))
    },
    description: "Differentially private count of the non-NULL values of `value` (NaN counts as \
         NULL). The exact count is released once with discrete Gaussian noise of sensitivity 1 (√2 \
         under 'replace_private_keys', where one changed row can leave one group and join \
         another), calibrated so that the call is (epsilon, delta)-DP (μ = gaussian_mu(epsilon, \
         delta)), then rounded to an integer and clamped at 0. Returns Int64, never negative.",
    example: "SELECT job, dp_count(salary, 0.3) FROM salaries GROUP BY job;\n\
         SELECT dp_count(value => salary, epsilon => 0.3, delta => 1e-6) FROM salaries;",
    related: &["dp_sum", "dp_mean"],
};

/// The release of a `dp_count` call: the exact count plus one [`Noise`], calibrated per noise
/// kind side by side.
#[derive(Debug, Clone)]
pub(crate) struct CountRelease {
    pub noise: Noise,
}

impl CountRelease {
    /// The calibration (module docs); also called by [`CountParams::cost`], so the accountant
    /// refuses exactly what the planner refuses.
    pub fn new(p: &CountParams) -> Result<Self, PrivacyError> {
        let noise = match p.mechanism {
            Mechanism::Gaussian => {
                let build = |epsilon: f64| {
                    // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
                    let mu = p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?);
                    if p.neighbours.moves_between_groups() {
                        // ‖Δc‖₂ = √2, rounding slack √2 grid steps (module docs).
                        GaussianMechanism::from_mu_with_slack(mu, SQRT_2_UP, SQRT_2_UP)
                    } else {
                        GaussianMechanism::from_mu(mu, 1.0) // |Δc| = 1
                    }
                };
                let delta = p.delta.to_string();
                Noise::Gaussian(representable(p.epsilon, ("delta", &delta), build)?)
            }
            Mechanism::Laplace => {
                // L1: 1, 2 (private keys), K·C (units); slack the same number of grid steps
                // (module docs, "Laplace").
                let f = p.neighbours.pure_factor();
                let build = |epsilon: f64| LaplaceMechanism::from_epsilon_with_slack(epsilon, f, f);
                let bound = f.to_string();
                Noise::Laplace(representable(p.epsilon, ("neighbours", &bound), build)?)
            }
        };
        Ok(Self { noise })
    }

    /// One group's release before clamping: round(c + g·Y), one draw.
    fn draw(&self, rng: &mut SecureRng, p: &Partial) -> Result<f64> {
        Ok(self.noise.release(rng, p.count as i128, 0)?.round())
    }
}

impl Finalise for CountRelease {
    fn shape(&self) -> Shape {
        SPEC.shape
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        None
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| Ok(self.draw(rng, p)?.max(0.0) as i64)) // `as` saturates
            .collect::<Result<Vec<i64>>>()?;
        Ok(Arc::new(Int64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(self.noise.describe())
    }
    /// The same draws as [`Self::finalise`] ([`Self::draw`]), then the interval
    /// ([`super::interval`], "Formulas"): for the integer count c, |r − c| ≤ W whenever
    /// |g·Y| < W + ½, W = ⌈(k + 1)·g − ½⌉; [max(r − W, 0), max(r + W, 0)] from the unclamped r.
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let w = self.noise.integer_half_width(confidence);
        let stddev = self.noise.stddev();
        let mut values = Vec::with_capacity(partials.len());
        let mut out = Vec::with_capacity(partials.len());
        for p in partials {
            let r = self.draw(rng, p)?;
            values.push(r.max(0.0) as i64); // as `finalise`; `as` saturates
            out.push(Some(Interval {
                lower: (r - w).max(0.0),
                upper: (r + w).max(0.0),
                stddev,
            }));
        }
        Ok((Arc::new(Int64Array::from(values)), out))
    }
}

/// The declaration of `dp_count` (listed in [`super::registry::AGGREGATES`]).
pub const DP_COUNT: Aggregate = Aggregate {
    name: "dp_count",
    summary: "noisy count of the non-NULL values (Int64, never negative)",
    data: &[COUNTED],
    params: &[EPSILON, DELTA, MECHANISM, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Rows,
    replaces: &["count"],
    internal: false,
    udaf: dp_count_udaf,
    seeded: |seed| super::dp_count::DpCount::with_insecure_seed(seed).into(),
    cost: |_, p| declaration::no_data(CountParams::from_literals, CountParams::cost, p),
    noise: super::adapter::spec_noise::<CountParams>,
};

super::interval::ci_variant!(CountParams, DP_COUNT => DP_COUNT_CI, "dp_count_ci",
    DpCountCi, dp_count_ci_udaf,
    "dp_count's release with its confidence interval: \
     Struct{value, lower, upper, confidence, stddev}");
