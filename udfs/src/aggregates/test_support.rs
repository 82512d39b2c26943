//! Test data shared by the model functions' unit tests: a fixed LCG (test data, never noise) and
//! a session over a table split into partitions.
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::AggregateUDF;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::scalar::ScalarValue;

/// Uniform numbers in [0, 1) from a 64-bit LCG seeded with `seed` (Knuth's MMIX constants).
pub fn lcg(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A session with `udaf` registered and the table `name` of `columns`, split into `parts`
/// partitions of about equal rows, read in batches of `batch_size` rows.
pub fn session_over(
    name: &str,
    schema: Arc<Schema>,
    columns: Vec<ArrayRef>,
    parts: usize,
    batch_size: usize,
    udaf: AggregateUDF,
) -> SessionContext {
    let all = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    let n = all.num_rows();
    let chunk = n.div_ceil(parts).max(1);
    let batches = (0..n)
        .step_by(chunk)
        .map(|at| vec![all.slice(at, chunk.min(n - at))])
        .collect();
    let ctx = SessionContext::new_with_config(
        SessionConfig::new()
            .with_target_partitions(parts)
            .with_batch_size(batch_size),
    );
    ctx.register_udaf(udaf);
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, batches).unwrap()))
        .unwrap();
    ctx
}

/// The model a one-row query returns, as its scalar.
pub async fn one_model(ctx: &SessionContext, sql: &str) -> ScalarValue {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    ScalarValue::try_from_array(batches[0].column(0), 0).unwrap()
}
