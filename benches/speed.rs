//! Speed of the DP aggregates against DataFusion's own aggregates, measured in the same process
//! (issue 8). Run: `cargo bench --bench speed` (release profile). Prints a Markdown table of
//! best-of-5 wall times and the ratio DP / baseline for each pair; `--quick` uses 1M rows;
//! `--ledger` runs the ledger part alone.
//!
//! Pairs (same data, same plan shape, same partitions):
//! - `dp_mean(x, 0, 1000, 1.0)` vs `avg(x)`; `dp_sum` vs `sum`; `dp_count` vs `count`;
//!   without GROUP BY and with GROUP BY over 1,000 groups (public keys: no partition selection,
//!   the aggregate alone is measured); in memory and from Parquet.
//! - The ledger (the accountant directly): opening a 10,000-entry ledger (from its checkpoint)
//!   against a 10-entry one; admission with 10,000 entries present (the check, and the check
//!   with its fsync'd append); admission with its fsync (on disk) and without (tmpfs).
//! - Growth with n (1e5, 1e6, 1e7) and with partitions (1, 2).
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use dpfusion::accounting::{Accountant, Budget, Neighbours, TableCharge, TablePolicy, Visibility};
use dpfusion_udfs::privacy::Event;

fn data(n: usize, groups: i64, batch: usize) -> (Arc<Schema>, Vec<RecordBatch>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let mut out = Vec::new();
    let mut state = 0x1234_5678_u64;
    let mut i = 0;
    while i < n {
        let m = batch.min(n - i);
        let mut g = Vec::with_capacity(m);
        let mut x = Vec::with_capacity(m);
        for k in 0..m {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            g.push(((i + k) as i64) % groups);
            x.push((state >> 11) as f64 / (1u64 << 53) as f64 * 1000.0);
        }
        out.push(
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(g)) as ArrayRef,
                    Arc::new(Float64Array::from(x)),
                ],
            )
            .unwrap(),
        );
        i += m;
    }
    (schema, out)
}

async fn best_of(ctx: &SessionContext, sql: &str, reps: usize) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..reps + 1 {
        let t = Instant::now();
        let r = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        std::hint::black_box(r);
        best = best.min(t.elapsed());
    }
    best
}

/// A ledger in `dir` with one private table and `n` charges; returns its path.
fn filled_ledger(dir: &std::path::Path, n: usize, charge: &[TableCharge]) -> std::path::PathBuf {
    let ledger = dir.join("ledger.jsonl");
    let acc = Accountant::open(&ledger).unwrap();
    acc.register_table(TablePolicy {
        key: charge[0].key.clone(),
        name: "t".into(),
        visibility: Visibility::Private,
        neighbours: Neighbours::AddRemove,
        public_columns: vec![],
        budget: Budget {
            epsilon: 1e6,
            delta: 1e-6,
        },
        filter: dpfusion::accounting::FilterKind::Gdp,
        delta_share: dpfusion::accounting::DEFAULT_DELTA_SHARE,
        schema: None,
        format: None,
        relaxed: None,
        unit: None,
    })
    .unwrap();
    for _ in 0..n {
        acc.admit("SELECT dp_count(x, 0.01) FROM t", charge)
            .unwrap();
    }
    ledger
}

/// Best of 20 opens of the ledger (a session's start: replay from the checkpoint, or line 1).
fn best_open(ledger: &std::path::Path) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        std::hint::black_box(Accountant::open(ledger).unwrap());
        best = best.min(t.elapsed());
    }
    best
}

fn ctx_with(partitions: usize) -> SessionContext {
    let ctx =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(partitions));
    dpfusion_udfs::register_all(&ctx);
    ctx
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

const PAIRS: &[(&str, &str, &str)] = &[
    ("dp_mean", "dp_mean(x, 0, 1000, 1.0)", "avg(x)"),
    ("dp_sum", "dp_sum(x, 0, 1000, 1.0)", "sum(x)"),
    ("dp_count", "dp_count(x, 1.0)", "count(x)"),
];

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--ledger") {
        let dir = std::env::temp_dir().join(format!("dpfusion-bench-{}", std::process::id()));
        ledger_bench(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let n = if quick { 1_000_000 } else { 10_000_000 };
    let reps = 5;
    let partitions = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(2);
    println!("# dpfusion speed benchmark\n");
    println!(
        "n = {n} rows, {partitions} partitions, best of {reps} after one warm-up; ratio = DP / DataFusion baseline\n"
    );
    let (schema, batches) = data(n, 1000, 65_536);
    let ctx = ctx_with(partitions);
    // Spread batches over partitions.
    let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions];
    for (i, b) in batches.iter().enumerate() {
        parts[i % partitions].push(b.clone());
    }
    ctx.register_table(
        "t",
        Arc::new(MemTable::try_new(schema.clone(), parts).unwrap()),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("dpfusion-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pq = dir.join("t.parquet");
    ctx.sql(&format!("COPY t TO '{}' STORED AS PARQUET", pq.display()))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    ctx.register_parquet("p", pq.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    println!("| function | source | GROUP BY | DP (ms) | baseline (ms) | ratio |");
    println!("|---|---|---|---|---|---|");
    for (name, dp, base) in PAIRS {
        for table in ["t", "p"] {
            for grouped in [false, true] {
                let (sel, tail) = if grouped {
                    ("g, ", " GROUP BY g")
                } else {
                    ("", "")
                };
                let a = best_of(&ctx, &format!("SELECT {sel}{dp} FROM {table}{tail}"), reps).await;
                let b = best_of(
                    &ctx,
                    &format!("SELECT {sel}{base} FROM {table}{tail}"),
                    reps,
                )
                .await;
                println!(
                    "| {name} | {} | {} | {} | {} | {:.2} |",
                    if table == "t" { "memory" } else { "Parquet" },
                    if grouped { "1,000 groups" } else { "none" },
                    ms(a),
                    ms(b),
                    a.as_secs_f64() / b.as_secs_f64()
                );
            }
        }
    }

    // Growth with n and partitions (dp_mean vs avg, in memory, no GROUP BY).
    println!("\n## Growth with n and partitions (dp_mean vs avg, memory)\n");
    println!("| n | partitions | dp_mean (ms) | avg (ms) | ratio |");
    println!("|---|---|---|---|---|");
    let sizes: &[usize] = if quick {
        &[100_000, 1_000_000]
    } else {
        &[100_000, 1_000_000, 10_000_000]
    };
    for &m in sizes {
        for p in [1usize, 2] {
            let c = ctx_with(p);
            let (s, b) = data(m, 1000, 65_536);
            let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; p];
            for (i, bb) in b.into_iter().enumerate() {
                parts[i % p].push(bb);
            }
            c.register_table("t", Arc::new(MemTable::try_new(s, parts).unwrap()))
                .unwrap();
            let a = best_of(&c, "SELECT dp_mean(x, 0, 1000, 1.0) FROM t", reps).await;
            let bl = best_of(&c, "SELECT avg(x) FROM t", reps).await;
            println!(
                "| {m} | {p} | {} | {} | {:.2} |",
                ms(a),
                ms(bl),
                a.as_secs_f64() / bl.as_secs_f64()
            );
        }
    }

    ledger_bench(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Admission and opening (the ledger: docs/LEDGER.md, "Checkpoints", "One fsync per charge").
/// `--ledger` runs this part alone.
fn ledger_bench(dir: &std::path::Path) {
    println!("\n## Ledger: opening and admission\n");
    let charge = [TableCharge {
        key: dpfusion::accounting::TableKey::from("bench:t".to_string()),
        events: vec![Event::Gaussian { mu: 1e-3 }],
    }];
    let small = filled_ledger(&dir.join("small"), 10, &charge);
    let t = Instant::now();
    let large = filled_ledger(&dir.join("large"), 10_000, &charge);
    let fill = t.elapsed();
    // The first open after the 10,000 charges replays them all and writes the checkpoint.
    let t = Instant::now();
    drop(Accountant::open(&large).unwrap());
    let first = t.elapsed();
    let open_small = best_open(&small);
    let open_large = best_open(&large);
    let acc = Accountant::open(&large).unwrap();
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        acc.admit("SELECT dp_count(x, 0.01) FROM t", &charge)
            .unwrap();
        best = best.min(t.elapsed());
    }
    let mut best_preview = Duration::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        std::hint::black_box(acc.preview(&charge).unwrap());
        best_preview = best_preview.min(t.elapsed());
    }
    drop(acc);
    // Without fsync: the same ledger on tmpfs (/dev/shm), where fsync returns at once.
    let shm =
        std::path::Path::new("/dev/shm").join(format!("dpfusion-bench-{}", std::process::id()));
    let no_fsync = std::path::Path::new("/dev/shm").is_dir().then(|| {
        let l = filled_ledger(&shm, 10, &charge);
        let acc = Accountant::open(&l).unwrap();
        let mut best = Duration::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            acc.admit("SELECT dp_count(x, 0.01) FROM t", &charge)
                .unwrap();
            best = best.min(t.elapsed());
        }
        best
    });
    let _ = std::fs::remove_dir_all(&shm);
    let with_fsync = {
        let acc = Accountant::open(&small).unwrap();
        let mut best = Duration::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            acc.admit("SELECT dp_count(x, 0.01) FROM t", &charge)
                .unwrap();
            best = best.min(t.elapsed());
        }
        best
    };
    let ms3 = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
    println!("| step | time |");
    println!("|---|---|");
    println!(
        "| 10,000 admissions (each fsync'd once) | {} ms total, {:.3} ms each |",
        ms(fill),
        fill.as_secs_f64() * 1e3 / 1e4
    );
    println!(
        "| first open after them (replay of 10,000 charges, writes the checkpoint) | {} ms |",
        ms3(first)
    );
    println!(
        "| open, 10-entry ledger (best of 20) | {} ms |",
        ms3(open_small)
    );
    println!(
        "| open, 10,000-entry ledger with its checkpoint (best of 20) | {} ms (+{} ms) |",
        ms3(open_large),
        ms3(open_large.saturating_sub(open_small))
    );
    println!(
        "| admission check + durable charge, 10,000 entries present (best of 20) | {} ms |",
        ms3(best)
    );
    println!(
        "| admission check alone (EXPLAIN PRIVACY's preview, best of 20) | {} ms |",
        ms3(best_preview)
    );
    println!(
        "| admission, 10 entries, ledger on disk (one fsync; best of 20) | {} ms |",
        ms3(with_fsync)
    );
    match no_fsync {
        Some(d) => println!(
            "| admission, 10 entries, ledger on tmpfs (fsync free; best of 20) | {} ms (fsync: +{} ms) |",
            ms3(d),
            ms3(with_fsync.saturating_sub(d))
        ),
        None => println!("| admission on tmpfs | /dev/shm missing |"),
    }
}
