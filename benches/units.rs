//! Privacy units at engine speed (issue 28): a unit-level query against the same query without a
//! unit, on the same data, in the same process. Run:
//!
//! ```text
//! DPFUSION_BENCH_ROWS=1000000,10000000 DPFUSION_BENCH_PARTITIONS=2,16 cargo bench --bench units
//! ```
//!
//! (defaults: 200,000 rows, 2 partitions, in memory, best of 1 after no warm-up, the session's
//! default 4 GiB memory pool; `DPFUSION_BENCH_SOURCE=memory,parquet` also reads both sides from
//! one Parquet file of the same rows (the form issue 28 measured), `DPFUSION_BENCH_REPS` sets the
//! repetitions, `DPFUSION_BENCH_MEMORY_MIB` the DP session's pool; `DPFUSION_BENCH_ONLY=dp_sum`
//! (or `dp_mean`) runs the unit `dp_sum` (or `dp_mean`) alone, e.g. under `perf record`, and
//! prints its time). Data: n rows of (g, unit, x), 1,000 groups, n/6 units, each unit's rows
//! spread over groups. Pairs, each printed with its ratio:
//! - `SELECT g, dp_sum(x, 0, 100, …) FROM t GROUP BY g` on a unit-level table (K = 4, C = 3: the
//!   aggregate by unit with its keyed choice of groups and their totals, partition selection) vs
//!   `SELECT g, sum(x) FROM t GROUP BY g` in plain DataFusion;
//! - the same with `dp_mean` (each kept (unit, group) carries a sample of C rows) vs `avg`;
//! - `SELECT dp_count_distinct(unit, …) FROM t` vs `SELECT count(DISTINCT unit) FROM t`, and
//!   the unit `dp_sum` as a multiple of that `count(DISTINCT unit)` (the least a per-unit
//!   computation does: one lookup per row in a state per unit);
//! - a floor for a per-unit bounding built from DataFusion's aggregates, in plain DataFusion:
//!   `SELECT g, sum(s) FROM (SELECT unit, g, sum(x) AS s FROM t GROUP BY unit, g) GROUP BY g` (one
//!   row per (unit, group) first: about n of them here) against the plain `sum` (and the unit
//!   `dp_sum` as a multiple of it), and the same with a ranking window added (`row_number() OVER
//!   (PARTITION BY unit ORDER BY g)` over the (unit, group) rows, `rn <= 4`: the first design).
//!
//! The DP side runs through `PrivateSession::sql`: the guard, admission (a ledger append with its
//! fsync) and the release are included.
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use dpfusion::{PrivateSession, Registration, SessionOptions};

fn data(n: usize) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Int64, false),
        Field::new("unit", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let units = (n / 6).max(1) as u64;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 11
    };
    let mut out = vec![];
    let mut i = 0;
    while i < n {
        let m = 65_536.min(n - i);
        let (mut g, mut u, mut x) = (vec![], vec![], vec![]);
        for _ in 0..m {
            g.push((next() % 1000) as i64);
            u.push((next() % units) as i64);
            x.push((next() % 1000) as f64 / 10.0);
        }
        out.push(
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(g)) as ArrayRef,
                    Arc::new(Int64Array::from(u)),
                    Arc::new(Float64Array::from(x)),
                ],
            )
            .unwrap(),
        );
        i += m;
    }
    out
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("a comma-separated list of integers")
        })
        .collect()
}

async fn best<F, Fut>(reps: usize, mut run: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut best = Duration::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        run().await;
        best = best.min(t.elapsed());
    }
    best
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

/// The session's memory pool: `DPFUSION_BENCH_MEMORY_MIB` if set, else the default (4 GiB).
fn memory(o: SessionOptions) -> SessionOptions {
    match std::env::var("DPFUSION_BENCH_MEMORY_MIB") {
        Ok(m) => o.with_memory_limit(m.parse::<usize>().expect("MiB") << 20),
        Err(_) => o,
    }
}

#[tokio::main]
async fn main() {
    let rows = env_list("DPFUSION_BENCH_ROWS", "200000");
    let partitions = env_list("DPFUSION_BENCH_PARTITIONS", "2");
    let reps = env_list("DPFUSION_BENCH_REPS", "1")[0].max(1);
    let only = std::env::var("DPFUSION_BENCH_ONLY").ok();
    let sources: Vec<String> = std::env::var("DPFUSION_BENCH_SOURCE")
        .unwrap_or_else(|_| "memory".into())
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    assert!(
        sources.iter().all(|s| s == "memory" || s == "parquet"),
        "DPFUSION_BENCH_SOURCE: memory, parquet or both"
    );
    println!("# dpfusion privacy-units benchmark (best of {reps}; ms)\n");
    println!(
        "| rows | partitions | source | unit dp_sum per group | plain sum per group | ratio | floor: sum \
         by (unit, g) then g | floor ratio | unit dp_sum / floor | floor + ranking window | ratio | \
         unit dp_mean per group | plain avg per group | ratio | dp_count_distinct | \
         count(DISTINCT) | ratio | unit dp_sum / count(DISTINCT) |"
    );
    println!(
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let files = std::env::temp_dir().join(format!("dpfusion-bench-units-{}", std::process::id()));
    std::fs::create_dir_all(&files).unwrap();
    for &n in &rows {
        let batches = data(n);
        let pq = files.join(format!("t{n}.parquet"));
        if sources.iter().any(|s| s == "parquet") {
            let ctx = SessionContext::new();
            let mem = MemTable::try_new(batches[0].schema(), vec![batches.clone()]).unwrap();
            ctx.register_table("t", Arc::new(mem)).unwrap();
            let copy = format!("COPY t TO '{}' STORED AS PARQUET", pq.display());
            ctx.sql(&copy).await.unwrap().collect().await.unwrap();
        }
        for (&p, source) in partitions
            .iter()
            .flat_map(|p| sources.iter().map(move |s| (p, s.as_str())))
        {
            // Inside `files`, which is removed at the end with the ledgers' witnesses (beside
            // each ledger's directory, docs/LEDGER.md).
            let dir = files.join(format!("session-{n}-{p}-{source}"));
            std::fs::create_dir_all(&dir).unwrap();
            let s = PrivateSession::open(memory(
                SessionOptions::default()
                    .with_ledger(dir.join("ledger.jsonl"))
                    .with_target_partitions(p),
            ))
            .await
            .unwrap();
            let reg = Registration::private()
                .privacy_unit("unit")
                .contribution_bounds(4, 3)
                .budget(1e6, 1e-3);
            let ctx =
                SessionContext::new_with_config(SessionConfig::new().with_target_partitions(p));
            if source == "parquet" {
                s.register_parquet("t", &pq, reg).await.unwrap();
                ctx.register_parquet("t", pq.to_str().unwrap(), ParquetReadOptions::default())
                    .await
                    .unwrap();
            } else {
                s.register_batches("t", batches.clone(), reg).unwrap();
                let mem = MemTable::try_new(batches[0].schema(), vec![batches.clone()]).unwrap();
                ctx.register_table("t", Arc::new(mem)).unwrap();
            }
            let dp = |sql: &'static str| {
                let s = &s;
                move || async move {
                    std::hint::black_box(s.sql(sql).await.unwrap());
                }
            };
            let plain = |sql: &'static str| {
                let ctx = &ctx;
                move || async move {
                    let r = ctx.sql(sql).await.unwrap().collect().await.unwrap();
                    std::hint::black_box(r);
                }
            };
            if only.as_deref() == Some("dp_mean") {
                let q =
                    "SELECT g, dp_mean(x, 0, 100, epsilon => 1, delta => 1e-7) FROM t GROUP BY g";
                println!("| {n} | {p} | {source} | {} |", ms(best(reps, dp(q)).await));
                drop(s);
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let dp_sum = best(
                reps,
                dp("SELECT g, dp_sum(x, 0, 100, epsilon => 1, delta => 1e-7) FROM t GROUP BY g"),
            )
            .await;
            if only.as_deref() == Some("dp_sum") {
                println!("| {n} | {p} | {source} | {} |", ms(dp_sum));
                drop(s);
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let sum = best(reps, plain("SELECT g, sum(x) FROM t GROUP BY g")).await;
            let dp_mean = best(
                reps,
                dp("SELECT g, dp_mean(x, 0, 100, epsilon => 1, delta => 1e-7) FROM t GROUP BY g"),
            )
            .await;
            let avg = best(reps, plain("SELECT g, avg(x) FROM t GROUP BY g")).await;
            let dp_cd = best(
                reps,
                dp("SELECT dp_count_distinct(unit, epsilon => 1, delta => 1e-7) FROM t"),
            )
            .await;
            let cd = best(reps, plain("SELECT count(DISTINCT unit) FROM t")).await;
            let floor = best(
                reps,
                plain(
                    "SELECT g, sum(s) FROM (SELECT unit, g, sum(x) AS s FROM t GROUP BY unit, g) \
                     GROUP BY g",
                ),
            )
            .await;
            let ranked = best(
                reps,
                plain(
                    "SELECT g, sum(s) FROM (SELECT g, s, row_number() OVER (PARTITION BY unit \
                     ORDER BY g) AS rn FROM (SELECT unit, g, sum(x) AS s FROM t GROUP BY unit, g)) \
                     WHERE rn <= 4 GROUP BY g",
                ),
            )
            .await;
            let r = |a: Duration| a.as_secs_f64() / sum.as_secs_f64();
            println!(
                "| {n} | {p} | {source} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {} | {:.1} | {} | {} | {:.1} | {} \
                 | {} | {:.1} | {:.1} |",
                ms(dp_sum),
                ms(sum),
                r(dp_sum),
                ms(floor),
                r(floor),
                dp_sum.as_secs_f64() / floor.as_secs_f64(),
                ms(ranked),
                r(ranked),
                ms(dp_mean),
                ms(avg),
                dp_mean.as_secs_f64() / avg.as_secs_f64(),
                ms(dp_cd),
                ms(cd),
                dp_cd.as_secs_f64() / cd.as_secs_f64(),
                dp_sum.as_secs_f64() / cd.as_secs_f64()
            );
            drop(s);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let _ = std::fs::remove_file(&pq);
    }
    let _ = std::fs::remove_dir_all(&files);
}
