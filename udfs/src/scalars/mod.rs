//! Scalar functions: planning helpers (read no data, cost nothing) and post-processing.
pub mod compact;
pub mod planning;
pub mod predict;

use datafusion::logical_expr::ScalarUDF;
use planning::{HelperKind, PlanningHelper};
use predict::{MlpPredict, Predict, PredictKind};

/// Every dpfusion scalar function an analyst may call. The guard's own `__dpfusion_compact`
/// ([`compact::Compact`]) is not among them: the guard puts it in the plans it checks, and only
/// a Ballista scheduler and executor, which decode those plans by name, register it.
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
    ]
}
