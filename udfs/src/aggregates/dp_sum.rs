//! `dp_sum(value, lower, upper, epsilon[, delta[, neighbours]])`: a Gaussian-noised sum of values
//! clamped to [lower, upper].
//!
//! Mechanism: values are clamped and mapped to fixed-point integers on a power-of-two grid q
//! ([`super::exact`]); the exact integer sum S is released once, in `evaluate`, by the Gaussian
//! mechanism with μ = gaussian_mu(ε, δ), so the call is (ε, δ)-DP. Sensitivity (exact, in grid
//! units, times q):
//! - `add_remove`: max(|lo|, |hi|) ≈ max(|lower|, |upper|) (one row in or out);
//! - `replace`, `replace_public_n`: max(hi − lo, |lo|, |hi|) (a value changes anywhere in the
//!   range, or to/from NULL).
//!
//! When lower = upper = 0 every clamped value is 0, the sum is identically 0, and 0 is returned
//! without noise (a constant is private).
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
use super::exact::{FixedPoint, release_exact};
use super::params::{SumParams, plan_error};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;

const SHAPE: Shape = Shape {
    sum: true,
    count: false,
    rows: false,
};

/// The `dp_sum` UDAF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpSum {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl Default for DpSum {
    fn default() -> Self {
        Self::new()
    }
}

impl DpSum {
    pub const NAME: &'static str = "dp_sum";

    pub fn new() -> Self {
        Self {
            signature: dp_signature(&SumParams::NAMES),
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
        let lits = call_literals(Self::NAME, &SumParams::NAMES, args)?;
        let p = SumParams::from_literals(&lits).map_err(|e| plan_error(Self::NAME, e))?;
        Ok(Arc::new(
            SumRelease::new(&p).map_err(|e| plan_error(Self::NAME, e))?,
        ))
    }
}

/// `dp_sum` as an [`AggregateUDF`].
pub fn dp_sum_udaf() -> AggregateUDF {
    AggregateUDF::from(DpSum::new())
}

/// The release of a `dp_sum` call.
#[derive(Debug, Clone)]
pub(crate) struct SumRelease {
    pub fp: FixedPoint,
    /// `None` when the sensitivity is 0 (lower = upper = 0).
    pub mech: Option<GaussianMechanism>,
}

impl SumRelease {
    pub fn new(p: &SumParams) -> Result<Self, PrivacyError> {
        let mu = p.mu()?;
        let fp = FixedPoint::new(p.lower, p.upper);
        let units = if p.neighbours.is_replace() {
            fp.width().max(fp.max_abs())
        } else {
            fp.max_abs()
        };
        let mech = if units == 0 {
            None
        } else {
            Some(GaussianMechanism::from_mu(mu, units as f64 * fp.step())?)
        };
        Ok(Self { fp, mech })
    }
}

impl Finalise for SumRelease {
    fn shape(&self) -> Shape {
        SHAPE
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
}

impl AggregateUDFImpl for DpSum {
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
            &SumParams::NAMES,
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
        "Differentially private sum. Each non-NULL, non-NaN value is clamped to [lower, upper] \
         (±infinity included) and mapped to a fixed-point integer on a power-of-two grid, so the \
         exact sum does not depend on row order or partitioning. The sum is released once with \
         discrete Gaussian noise calibrated so that the call is (epsilon, delta)-DP (one μ-GDP \
         release, μ = gaussian_mu(epsilon, delta)). Sensitivity: max(|lower|, |upper|) under \
         add/remove neighbours; max(upper − lower, |lower|, |upper|) under replace neighbours. \
         Returns Float64; an empty input releases noise around 0.",
        "dp_sum(value, lower, upper, epsilon[, delta])",
    )
    .with_argument("value", "Numeric column (integers, floats, decimals; cast to Float64).")
    .with_argument("lower", "Finite literal, lower clamping bound (lower ≤ upper).")
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
        "SELECT dp_sum(salary, 0, 200000, 0.5) FROM salaries;\n\
         SELECT dp_sum(value => salary, lower => 0, upper => 200000, epsilon => 0.5, delta => 1e-6) FROM salaries;",
    )
    .with_related_udf("dp_count")
    .with_related_udf("dp_mean")
    .build()
});
