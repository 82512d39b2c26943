//! `dp_count(value, epsilon[, delta[, neighbours]])`: a Gaussian-noised count of the non-NULL
//! (and, for floating-point columns, non-NaN) values.
//!
//! Mechanism: the exact count is released once, in `evaluate`, by the Gaussian mechanism with
//! sensitivity 1 and μ = gaussian_mu(ε, δ) (one row in or out, or one value turning NULL under
//! `replace`, moves the count by 1), then rounded to the nearest integer and clamped at 0
//! (post-processing). The result is Int64 and never negative.
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, Int64Array};
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
use super::params::{CountParams, plan_error};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;

const SHAPE: Shape = Shape {
    sum: false,
    count: true,
    rows: false,
};

/// The `dp_count` UDAF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpCount {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl Default for DpCount {
    fn default() -> Self {
        Self::new()
    }
}

impl DpCount {
    pub const NAME: &'static str = "dp_count";

    pub fn new() -> Self {
        Self {
            signature: dp_signature(&CountParams::NAMES),
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
        let lits = call_literals(Self::NAME, &CountParams::NAMES, args)?;
        let p = CountParams::from_literals(&lits).map_err(|e| plan_error(Self::NAME, e))?;
        Ok(Arc::new(
            CountRelease::new(&p).map_err(|e| plan_error(Self::NAME, e))?,
        ))
    }
}

/// `dp_count` as an [`AggregateUDF`].
pub fn dp_count_udaf() -> AggregateUDF {
    AggregateUDF::from(DpCount::new())
}

/// The release of a `dp_count` call.
#[derive(Debug, Clone)]
pub(crate) struct CountRelease {
    pub mech: GaussianMechanism,
}

impl CountRelease {
    pub fn new(p: &CountParams) -> Result<Self, PrivacyError> {
        Ok(Self {
            mech: GaussianMechanism::from_mu(p.mu()?, 1.0)?,
        })
    }
}

impl Finalise for CountRelease {
    fn shape(&self) -> Shape {
        SHAPE
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        None
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| {
                let noisy = release_exact(&self.mech, rng, p.count as i128, 0)?;
                Ok(noisy.round().max(0.0) as i64) // `as` saturates
            })
            .collect::<Result<Vec<i64>>>()?;
        Ok(Arc::new(Int64Array::from(out)))
    }
}

impl AggregateUDFImpl for DpCount {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_args(Self::NAME, DataArg::Any, &CountParams::NAMES, 1, arg_types)
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
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
        "Differentially private count of the non-NULL values of `value` (NaN counts as NULL). \
         The exact count is released once with discrete Gaussian noise of sensitivity 1, \
         calibrated so that the call is (epsilon, delta)-DP (μ = gaussian_mu(epsilon, delta)), \
         then rounded to an integer and clamped at 0. Returns Int64, never negative.",
        "dp_count(value, epsilon[, delta])",
    )
    .with_argument(
        "value",
        "Column of any type; only NULL-ness (and NaN) is read.",
    )
    .with_argument("epsilon", "Literal ε > 0 (finite).")
    .with_argument(
        "delta",
        "Literal δ in (0, 1); defaults to the session's dpfusion.default_delta (1e-7).",
    )
    .with_argument(
        "neighbours",
        "Hidden: 'add_remove' (default), 'replace' or 'replace_public_n'; sensitivity is 1 in \
         every case. Set by the dpfusion session; users never write it.",
    )
    .with_sql_example(
        "SELECT job, dp_count(salary, 0.3) FROM salaries GROUP BY job;\n\
         SELECT dp_count(value => salary, epsilon => 0.3, delta => 1e-6) FROM salaries;",
    )
    .with_related_udf("dp_sum")
    .with_related_udf("dp_mean")
    .build()
});
