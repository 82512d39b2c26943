//! What the benches share: running a query as the dpfusion session runs a checked plan.
use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;

/// Plans and runs `sql` as the session runs a checked plan: the physical plan with the DP
/// calls' literal parameters bound and model features spread
/// ([`dpfusion_udfs::aggregates::bind`]); with `bind` false, the calls as written (for
/// comparison).
pub async fn collect_as_session(ctx: &SessionContext, sql: &str, bind: bool) -> Vec<RecordBatch> {
    let mut plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    if bind {
        plan = dpfusion_udfs::aggregates::bind::bind_literal_parameters(plan).unwrap();
    }
    datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .unwrap()
}
