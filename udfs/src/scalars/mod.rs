//! Scalar functions: planning helpers (read no data, cost nothing) and post-processing.
pub mod compact;
pub mod planning;
pub mod predict;

use compact::Compact;
use datafusion::logical_expr::ScalarUDF;
use planning::{HelperKind, PlanningHelper};
use predict::{MlpPredict, Predict, PredictKind};

/// Every dpfusion scalar function.
pub fn all_scalar_udfs() -> Vec<ScalarUDF> {
    vec![
        PlanningHelper::udf(HelperKind::GaussianSigma),
        PlanningHelper::udf(HelperKind::GaussianEpsilon),
        PlanningHelper::udf(HelperKind::ZcdpEpsilon),
        PlanningHelper::udf(HelperKind::SgdEpsilon),
        PlanningHelper::udf(HelperKind::SgdSigma),
        Predict::udf(PredictKind::Linear),
        Predict::udf(PredictKind::LogisticProba),
        MlpPredict::udf(true),
        MlpPredict::udf(false),
        Compact::udf(),
    ]
}
