//! Scalar functions: planning helpers (read no data, cost nothing) and post-processing.
pub mod planning;

use datafusion::logical_expr::ScalarUDF;
use planning::{HelperKind, PlanningHelper};

/// Every dpfusion scalar function.
pub fn all_scalar_udfs() -> Vec<ScalarUDF> {
    vec![
        PlanningHelper::udf(HelperKind::GaussianSigma),
        PlanningHelper::udf(HelperKind::GaussianEpsilon),
        PlanningHelper::udf(HelperKind::ZcdpEpsilon),
    ]
}
