//! `dp_mean(value, lower, upper, epsilon[, delta[, neighbours]])`: a bounded mean, always within
//! [lower, upper].
//!
//! # `add_remove` and `replace`: noisy sum over noisy count
//! Centre c = (lower + upper)/2 (on the fixed-point grid; see [`super::exact`]). Two Gaussian
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
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, Signature,
};

use super::accumulator::{DpAccumulator, DpGroups, Finalise, Partial, Shape};
use super::common::{DOC_SECTION_DP, DataArg, Fin, call_literals, coerce_args, dp_signature};
use super::exact::{FixedPoint, pow2, release_exact};
use super::params::{MeanParams, Neighbours, plan_error};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;

const SHAPE: Shape = Shape {
    sum: true,
    count: true,
    rows: true,
};

/// The `dp_mean` UDAF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpMean {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl Default for DpMean {
    fn default() -> Self {
        Self::new()
    }
}

impl DpMean {
    pub const NAME: &'static str = "dp_mean";

    pub fn new() -> Self {
        Self {
            signature: dp_signature(&MeanParams::NAMES),
            insecure_seed: None,
        }
    }

    /// INSECURE: noise from a fixed seed, for reproducible tests. Never register this in a
    /// session that serves real queries.
    pub fn with_insecure_seed(seed: u64) -> Self {
        Self {
            insecure_seed: Some(seed),
            ..Self::new()
        }
    }

    fn finaliser(&self, args: &AccumulatorArgs) -> Result<Fin> {
        let lits = call_literals(Self::NAME, &MeanParams::NAMES, args)?;
        let p = MeanParams::from_literals(&lits).map_err(|e| plan_error(Self::NAME, e))?;
        Ok(Arc::new(
            MeanRelease::new(&p).map_err(|e| plan_error(Self::NAME, e))?,
        ))
    }
}

/// `dp_mean` as an [`AggregateUDF`].
pub fn dp_mean_udaf() -> AggregateUDF {
    AggregateUDF::from(DpMean::new())
}

/// Calibrations are rounded outward: the split μ's are shrunk by this factor so that
/// μ_s² + μ_c² ≤ μ² despite floating-point rounding.
const SPLIT_SHRINK: f64 = 1.0 - 1e-12;

/// The release of a `dp_mean` call.
#[derive(Debug, Clone)]
pub(crate) struct MeanRelease {
    pub fp: FixedPoint,
    pub neighbours: Neighbours,
    /// Release of the centred sum, in units of q/2. `None` when lower = upper.
    pub sum_mech: Option<GaussianMechanism>,
    /// Release of the count. `None` under `replace_public_n` or when lower = upper.
    pub count_mech: Option<GaussianMechanism>,
}

impl MeanRelease {
    pub fn new(p: &MeanParams) -> Result<Self, PrivacyError> {
        let mu = p.mu()?;
        let fp = FixedPoint::new(p.lower, p.upper);
        // Centred values 2x − (lo + hi) in half-units q/2 lie in [−w, w].
        let w = fp.width();
        let half_unit = pow2(fp.exp - 1);
        let (mut sum_mech, mut count_mech) = (None, None);
        if w > 0 {
            let h = w as f64; // worst |m − c|, half-units
            match p.neighbours {
                Neighbours::ReplacePublicN => {
                    sum_mech = Some(GaussianMechanism::from_mu(mu, 2.0 * h * half_unit)?);
                }
                nb => {
                    let ds = if nb == Neighbours::Replace {
                        2.0 * h
                    } else {
                        h
                    };
                    let mu_s = mu * (ds / (ds + h)).sqrt() * SPLIT_SHRINK;
                    let mu_c = mu * (h / (ds + h)).sqrt() * SPLIT_SHRINK;
                    sum_mech = Some(GaussianMechanism::from_mu(mu_s, ds * half_unit)?);
                    count_mech = Some(GaussianMechanism::from_mu(mu_c, 1.0)?);
                }
            }
        }
        Ok(Self {
            fp,
            neighbours: p.neighbours,
            sum_mech,
            count_mech,
        })
    }

    /// The centre c on the grid: (lo + hi)·q/2.
    pub fn centre(&self) -> f64 {
        (self.fp.lo + self.fp.hi) as f64 * pow2(self.fp.exp - 1)
    }

    fn release_one(&self, rng: &mut SecureRng, p: &Partial) -> Result<Option<f64>> {
        let public_n = self.neighbours == Neighbours::ReplacePublicN;
        if public_n && p.rows == 0 {
            return Ok(None);
        }
        let (lower, upper) = (self.fp.lower, self.fp.upper);
        let c = self.centre();
        let Some(sum_mech) = &self.sum_mech else {
            return Ok(Some(c.clamp(lower, upper)));
        };
        let mid = (self.fp.lo + self.fp.hi) as i128;
        let centred = p
            .sum
            .saturating_mul(2)
            .saturating_sub(mid.saturating_mul(p.count as i128));
        let s = release_exact(sum_mech, rng, centred, self.fp.exp - 1)?;
        let denom = match &self.count_mech {
            Some(m) => release_exact(m, rng, p.count as i128, 0)?.max(1.0),
            None => p.rows as f64,
        };
        Ok(Some((c + s / denom).clamp(lower, upper)))
    }
}

impl Finalise for MeanRelease {
    fn shape(&self) -> Shape {
        SHAPE
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| self.release_one(rng, p))
            .collect::<Result<Vec<Option<f64>>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
}

impl AggregateUDFImpl for DpMean {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_args(
            Self::NAME,
            DataArg::Numeric,
            &MeanParams::NAMES,
            3,
            arg_types,
        )
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(DpAccumulator::new(
            self.finaliser(&args)?,
            self.insecure_seed,
        )?))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(SHAPE.state_fields(args.name))
    }
    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        !args.is_distinct
    }
    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(DpGroups::new(
            self.finaliser(&args)?,
            self.insecure_seed,
        )?))
    }
    /// The result does not depend on row order (exact integer partials).
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOC)
    }
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        DOC_SECTION_DP,
        "Differentially private mean of the values clamped to [lower, upper]; the result is \
         always within [lower, upper]. Under add/remove (default) and replace neighbours: a \
         noisy sum of (clamped value − midpoint) over a noisy count of non-NULL values, the two \
         Gaussian releases sharing the call's μ = gaussian_mu(epsilon, delta) so that the call \
         is (epsilon, delta)-DP; result = midpoint + sum / max(count, 1), clamped. Under \
         'replace_public_n' (public row count n, set by the session): all of μ on the sum \
         (sensitivity upper − lower), NULL/NaN imputed with the midpoint, result = sum / n \
         (NULL when n = 0). NULL and NaN values are skipped otherwise; ±infinity is clamped.",
        "dp_mean(value, lower, upper, epsilon[, delta])",
    )
    .with_argument(
        "value",
        "Numeric column (integers, floats, decimals; cast to Float64).",
    )
    .with_argument(
        "lower",
        "Finite literal, lower clamping bound (lower ≤ upper).",
    )
    .with_argument("upper", "Finite literal, upper clamping bound.")
    .with_argument("epsilon", "Literal ε > 0 (finite).")
    .with_argument(
        "delta",
        "Literal δ in (0, 1); defaults to the session's dpfusion.default_delta (1e-7).",
    )
    .with_argument(
        "neighbours",
        "Hidden: 'add_remove' (default), 'replace' or 'replace_public_n'. Set by the dpfusion \
         session from the table's registration; users never write it.",
    )
    .with_sql_example(
        "SELECT job, dp_mean(salary, 0, 1000000, 0.5, 1e-6) FROM salaries GROUP BY job;",
    )
    .with_related_udf("dp_sum")
    .with_related_udf("dp_count")
    .build()
});
