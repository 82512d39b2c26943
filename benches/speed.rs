//! Speed of the DP aggregates against DataFusion's own aggregates, measured in the same process
//! (issues 8, 19, 32). Run: `cargo bench --bench speed` (release profile). Prints Markdown
//! tables of best-of-5 wall times, DP and baseline run as interleaved pairs, and the ratio
//! DP / baseline for each pair.
//!
//! Flags: `--sizes 1,10,50` (millions of rows; default 1 and 10), `--reps N` (default 5),
//! `--count` (adds `dp_count` vs `count`), `--quick` (1M rows, no ledger part), `--ledger` (the
//! ledger part alone), `--session` (the whole statement through the session alone; `--sizes`
//! default 1).
//!
//! - Kernels alone (10M values, or the largest size if smaller; one thread): Arrow's float `sum` against the exact fixed-point
//!   sum on each build (baseline, AVX2, AVX-512), the per-row conversion, and the GROUP BY
//!   scatter loops of `avg` and of the DP aggregates: where the per-row time goes.
//! - Pairs (same data, same plan shape, same partitions): `dp_mean(x, 0, 1000, 1.0)` vs
//!   `avg(x)` and `dp_sum` vs `sum`, without GROUP BY and with GROUP BY over 1,000 groups
//!   (public keys: no partition selection, the aggregate alone is measured), in memory (as many
//!   MemTable partitions as target partitions) and from one Parquet file, at
//!   `target_partitions` 2 and 16 (16 is emulated on a machine with fewer cores).
//! - The fixed cost of a query on tiny inputs (planning, accumulators, noise).
//! - Through the session (`--session` runs this part alone): the whole statement as an analyst
//!   runs it, `PrivateSession::sql` (parse, plan, guard, admission with its durable charge,
//!   execution, the release) against plain DataFusion's `ctx.sql(..).collect()` on the same
//!   data, with the ledger on disk (one fsync per charge) and on tmpfs (fsync free), and the
//!   guard's part alone (`PrivateSession::check`: parse, plan, check; nothing charged).
//! - The ledger (the accountant directly): opening a 10,000-entry ledger (from its checkpoint)
//!   against a 10-entry one; admission with 10,000 entries present (the check, and the check
//!   with its fsync'd append); admission with its fsync (on disk) and without (tmpfs).
mod common;

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
    (
        "dp_mean, 6 parameters written in the SQL (a session adds them after optimizing)",
        "dp_mean(x, 0, 1000, 1.0, 1e-6, 'gaussian', 'add_remove')",
        "avg(x)",
    ),
    (
        "dp_mean, parameters as arguments (not bound: before issue 32)",
        "/*unbound*/ dp_mean(x, 0, 1000, 1.0, 1e-6, 'gaussian', 'add_remove')",
        "avg(x)",
    ),
    ("dp_count", "dp_count(x, 1.0)", "count(x)"),
];

/// Best-of-`reps` wall times of two queries, run interleaved (a, b, a, b, …) after one warm-up
/// each, so that a change of machine load hits both alike.
async fn pair(ctx: &SessionContext, a: &str, b: &str, reps: usize) -> (Duration, Duration) {
    let (mut ba, mut bb) = (Duration::MAX, Duration::MAX);
    for k in 0..reps + 1 {
        for (sql, best) in [(a, &mut ba), (b, &mut bb)] {
            let t = Instant::now();
            std::hint::black_box(run(ctx, sql).await);
            if k > 0 {
                *best = (*best).min(t.elapsed());
            }
        }
    }
    (ba, bb)
}

/// Runs `sql` as the session does ([`common::collect_as_session`]), unless the query contains
/// `/*unbound*/` (the calls as written, for comparison).
async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    common::collect_as_session(ctx, sql, !sql.contains("/*unbound*/")).await
}

/// The argument after `flag`, if given.
fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The exact-sum kernels alone on `n` in-memory values (no DataFusion): Arrow's float `sum`
/// (what `avg`/`sum` run), the fixed-point sum and the per-row conversion on each build, and the
/// GROUP BY scatter of `avg` against the DP one. Best of `reps`, ns per value, one thread.
fn kernels(n: usize, reps: usize) {
    use datafusion::arrow::compute::sum;
    use dpfusion_udfs::mechanisms::exact::{FixedPoint, SumPath, count_nan};
    let (_, batches) = data(n, 1000, n);
    let x = batches[0]
        .column(1)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap()
        .clone();
    let g: Vec<usize> = (0..n).map(|i| i % 1000).collect();
    let fp = FixedPoint::new(0.0, 1000.0);
    let ns = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e9 / n as f64);
    let best = |f: &mut dyn FnMut()| {
        let mut b = Duration::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            f();
            b = b.min(t.elapsed());
        }
        b
    };
    println!(
        "\n## Kernels alone ({n} values in memory, one thread, best of {reps}; ns per value)\n"
    );
    println!("| kernel | ns/value |");
    println!("|---|---|");
    let d = best(&mut || {
        std::hint::black_box(sum(&x));
    });
    println!("| Arrow `sum` of f64 (the baseline's kernel) | {} |", ns(d));
    for path in [SumPath::Portable, SumPath::Avx2, SumPath::Avx512] {
        if path.resolve() != path {
            println!("| exact sum, {path:?} build | not on this CPU |");
            continue;
        }
        let d = best(&mut || {
            std::hint::black_box(fp.sum_quantised_on(x.values(), path));
        });
        println!(
            "| exact sum (clamp, round to the grid, i64 lanes), {path:?} build | {} |",
            ns(d)
        );
    }
    let d = best(&mut || {
        std::hint::black_box(count_nan(x.values()));
    });
    println!(
        "| NaN count (`count_nan`, the GROUP BY fast path's check) | {} |",
        ns(d)
    );
    let (mut s, mut c) = (vec![0f64; 1000], vec![0i64; 1000]);
    let d = best(&mut || {
        for (&v, &k) in x.values().iter().zip(&g) {
            s[k] += v;
            c[k] += 1;
        }
        std::hint::black_box((&s, &c));
    });
    println!(
        "| scatter f64 sum + count into 1,000 groups (`avg`'s loop) | {} |",
        ns(d)
    );
    // The DP GROUP BY loop (`DpGroups::update_fused`): NaN count, then the value quantised
    // inside the scatter into i64 partials and one count per group, flushed once at the end.
    let (mut si, mut ci) = (vec![0i64; 1000], vec![0i64; 1000]);
    let d = best(&mut || {
        for (v, gc) in x.values().chunks(8192).zip(g.chunks(8192)) {
            if count_nan(v) != 0 {
                continue;
            }
            for (&y, &k) in v.iter().zip(gc) {
                si[k] += fp.quantise_select(y);
                ci[k] += 1;
            }
        }
        std::hint::black_box((&si, &ci));
    });
    println!(
        "| NaN count, then quantise inside the scatter, i64 sum + count into 1,000 groups (DP's loop) | {} |",
        ns(d)
    );
    // Before issue 32: an early-exit NaN scan, sum + count + rows per row, and the i64
    // partials flushed into i128 sums after every batch.
    let (mut ri, mut sw, mut part) = (vec![0i64; 1000], vec![0i128; 1000], vec![0i64; 1000]);
    let d = best(&mut || {
        for (v, gc) in x.values().chunks(8192).zip(g.chunks(8192)) {
            if v.iter().any(|y| y.is_nan()) {
                continue;
            }
            for (&y, &k) in v.iter().zip(gc) {
                part[k] += fp.quantise_select(y);
                ci[k] += 1;
                ri[k] += 1;
            }
            for (s, p) in sw.iter_mut().zip(part.iter_mut()) {
                *s = s.saturating_add(*p as i128);
                *p = 0;
            }
        }
        std::hint::black_box((&sw, &ci, &ri));
    });
    println!(
        "| before issue 32: NaN scan, sum + count + rows per row, flush after every batch | {} |",
        ns(d)
    );
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--session") {
        let sizes: Vec<usize> = arg("--sizes").map_or(vec![1_000_000], |s| {
            s.split(',')
                .map(|m| (m.trim().parse::<f64>().unwrap() * 1e6) as usize)
                .collect()
        });
        let reps: usize = arg("--reps").map_or(5, |r| r.parse().unwrap());
        session_bench(&sizes, reps).await;
        return;
    }
    if std::env::args().any(|a| a == "--ledger") {
        let dir = std::env::temp_dir().join(format!("dpfusion-bench-{}", std::process::id()));
        ledger_bench(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // Sizes in millions of rows: `--sizes 1,10,50`; default 1 and 10 (`--quick`: 1).
    let sizes: Vec<usize> = match arg("--sizes") {
        Some(s) => s
            .split(',')
            .map(|m| (m.trim().parse::<f64>().unwrap() * 1e6) as usize)
            .collect(),
        None if quick => vec![1_000_000],
        None => vec![1_000_000, 10_000_000],
    };
    let reps: usize = arg("--reps").map_or(5, |r| r.parse().unwrap());
    let with_count = std::env::args().any(|a| a == "--count");
    let cores = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(2);
    println!("# dpfusion speed benchmark\n");
    // Other work on the machine moves every time here: say how much there was.
    if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
        let l: Vec<&str> = l.split_whitespace().take(3).collect();
        println!(
            "load average at the start (1, 5, 15 min): {}\n",
            l.join(" ")
        );
    }
    println!(
        "{cores} cores; target_partitions 2 and 16 (16 is emulated when the machine has fewer \
         cores); best of {reps} interleaved pairs after one warm-up each; ratio = DP / DataFusion \
         baseline; batches of 8,192 rows\n"
    );
    kernels(
        sizes.iter().copied().max().unwrap_or(1).min(10_000_000),
        reps,
    );
    let dir = std::env::temp_dir().join(format!("dpfusion-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pairs: Vec<_> = PAIRS
        .iter()
        .filter(|(name, _, _)| with_count || *name != "dp_count")
        .collect();
    println!("\n## Aggregates against DataFusion\n");
    println!(
        "| rows | target_partitions | function | source | GROUP BY | DP (ms) | baseline (ms) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let (schema, batches) = data(n, 1000, 8192);
        let pq = dir.join(format!("t{n}.parquet"));
        for partitions in [2usize, 16] {
            let ctx = ctx_with(partitions);
            let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions];
            for (i, b) in batches.iter().enumerate() {
                parts[i % partitions].push(b.clone());
            }
            ctx.register_table(
                "t",
                Arc::new(MemTable::try_new(schema.clone(), parts).unwrap()),
            )
            .unwrap();
            if !pq.exists() {
                ctx.sql(&format!("COPY t TO '{}' STORED AS PARQUET", pq.display()))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
            }
            ctx.register_parquet("p", pq.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap();
            for (name, dp, base) in &pairs {
                for table in ["t", "p"] {
                    for grouped in [false, true] {
                        let (sel, tail) = if grouped {
                            ("g, ", " GROUP BY g")
                        } else {
                            ("", "")
                        };
                        let (a, b) = pair(
                            &ctx,
                            &format!("SELECT {sel}{dp} FROM {table}{tail}"),
                            &format!("SELECT {sel}{base} FROM {table}{tail}"),
                            reps,
                        )
                        .await;
                        println!(
                            "| {n} | {partitions} | {name} | {} | {} | {} | {} | {:.2} |",
                            if table == "t" { "memory" } else { "Parquet" },
                            if grouped { "1,000 groups" } else { "none" },
                            ms(a),
                            ms(b),
                            a.as_secs_f64() / b.as_secs_f64()
                        );
                    }
                }
            }
        }
        let _ = std::fs::remove_file(&pq);
    }

    // The fixed cost of a query (planning, accumulators, the release's noise), on 1 row and on
    // 1,000 groups of 1 row.
    println!("\n## Fixed cost per query (tiny inputs)\n");
    println!(
        "The call's arguments as written; on 1 row, the same call with float literals (no cast \
         for the analyzer to add and the simplifier to fold), with the six parameters a session \
         passes written in the SQL (a session adds them after optimizing: see \"Through the \
         session\"), and those not bound.\n"
    );
    println!("| target_partitions | input | call | dp_mean (ms) | avg (ms) | difference (ms) |");
    println!("|---|---|---|---|---|---|");
    for partitions in [2usize, 16] {
        for (rows, label) in [
            (1usize, "1 row, no GROUP BY"),
            (1000, "1,000 rows, 1,000 groups"),
        ] {
            let ctx = ctx_with(partitions);
            let (s, b) = data(rows, 1000, 8192);
            ctx.register_table("t", Arc::new(MemTable::try_new(s, vec![b]).unwrap()))
                .unwrap();
            let tail = if rows > 1 { " GROUP BY g" } else { "" };
            let calls: &[&str] = if rows > 1 {
                &["dp_mean(x, 0, 1000, 1.0)"]
            } else {
                &[
                    "dp_mean(x, 0, 1000, 1.0)",
                    "dp_mean(x, 0.0, 1000.0, 1.0)",
                    "dp_mean(x, 0, 1000, 1.0, 1e-6, 'gaussian', 'add_remove')",
                    "dp_mean(x, 0.0, 1000.0, 1.0, 1e-6, 'gaussian', 'add_remove')",
                    "/*unbound*/ dp_mean(x, 0, 1000, 1.0, 1e-6, 'gaussian', 'add_remove')",
                ]
            };
            for call in calls {
                let (a, bl) = pair(
                    &ctx,
                    &format!("SELECT {call} FROM t{tail}"),
                    &format!("SELECT avg(x) FROM t{tail}"),
                    reps.max(10),
                )
                .await;
                println!(
                    "| {partitions} | {label} | `{call}` | {:.3} | {:.3} | {:.3} |",
                    a.as_secs_f64() * 1e3,
                    bl.as_secs_f64() * 1e3,
                    (a.as_secs_f64() - bl.as_secs_f64()) * 1e3
                );
            }
        }
    }

    session_bench(&sizes, reps).await;
    if !quick {
        ledger_bench(&dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole statement through [`PrivateSession::sql`] against plain DataFusion on the same
/// table (same partitions, or the same Parquet file): on 1 row (the fixed cost) and at each of
/// `sizes`, ledger on disk and on tmpfs. Best of `reps` interleaved pairs after one warm-up.
async fn session_bench(sizes: &[usize], reps: usize) {
    use dpfusion::accounting::TableKey;
    use dpfusion::{PrivateSession, Registration, SessionOptions};
    println!("\n## Through the session: the whole statement\n");
    println!(
        "`SELECT dp_mean(x, 0, 1000, 1.0) FROM t` through `PrivateSession::sql` (parse, plan, \
         guard, admission, execution, release; δ from the session) against `SELECT avg(x) FROM t` \
         through plain DataFusion's `ctx.sql(..).collect()`; \"check\" is \
         `PrivateSession::check` alone (parse, plan, guard; nothing charged or run). Best of \
         {reps} interleaved pairs (at least 50 up to 1M rows).\n"
    );
    println!(
        "| rows | target_partitions | source | ledger | session dp_mean (ms) | of which check (ms) \
         | DataFusion avg (ms) | difference (ms) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let disk = std::env::temp_dir().join(format!("dpfusion-bench-session-{}", std::process::id()));
    let shm = std::path::Path::new("/dev/shm");
    let shm = shm
        .is_dir()
        .then(|| shm.join(format!("dpfusion-bench-session-{}", std::process::id())));
    let q = "SELECT dp_mean(x, 0, 1000, 1.0) FROM t";
    let mut cells: Vec<usize> = vec![1];
    cells.extend(sizes);
    for &n in &cells {
        let (schema, batches) = data(n, 1000, 8192);
        let pq = disk.join(format!("t{n}.parquet"));
        for partitions in [2usize, 16] {
            let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions];
            for (i, b) in batches.iter().enumerate() {
                parts[i % partitions].push(b.clone());
            }
            let mem = || Arc::new(MemTable::try_new(schema.clone(), parts.clone()).unwrap());
            let ctx = ctx_with(partitions);
            ctx.register_table("t", mem()).unwrap();
            if !pq.exists() {
                std::fs::create_dir_all(&disk).unwrap();
                let copy = format!("COPY t TO '{}' STORED AS PARQUET", pq.display());
                ctx.sql(&copy).await.unwrap().collect().await.unwrap();
            }
            let ledgers = [("disk", Some(disk.clone())), ("tmpfs", shm.clone())];
            for source in ["memory", "Parquet"] {
                let ctx = ctx_with(partitions);
                if source == "memory" {
                    ctx.register_table("t", mem()).unwrap();
                } else {
                    ctx.register_parquet("t", pq.to_str().unwrap(), ParquetReadOptions::default())
                        .await
                        .unwrap();
                }
                for (ledger, root) in &ledgers {
                    let Some(root) = root else {
                        println!("| {n} | {partitions} | {source} | {ledger} | /dev/shm missing |");
                        continue;
                    };
                    // The witness lies beside the ledger's directory: both inside `root`.
                    let l = root
                        .join(format!("{n}-{partitions}-{source}"))
                        .join("ledger.jsonl");
                    let s = PrivateSession::open(
                        SessionOptions::default()
                            .with_ledger(&l)
                            .with_target_partitions(partitions),
                    )
                    .await
                    .unwrap();
                    let reg = Registration::private().budget(1e6, 1e-3);
                    if source == "memory" {
                        s.register_provider("t", mem(), TableKey::from("mem:t".to_string()), reg)
                            .unwrap();
                    } else {
                        s.register_parquet("t", &pq, reg).await.unwrap();
                    }
                    let (mut dp, mut base, mut check) =
                        (Duration::MAX, Duration::MAX, Duration::MAX);
                    // Small cells are a fraction of a millisecond: more pairs to find their best.
                    let pairs = if n <= 1_000_000 { reps.max(50) } else { reps };
                    for k in 0..pairs + 1 {
                        let t = Instant::now();
                        std::hint::black_box(s.sql(q).await.unwrap());
                        let a = t.elapsed();
                        let t = Instant::now();
                        std::hint::black_box(s.check(q).await.unwrap());
                        let c = t.elapsed();
                        let t = Instant::now();
                        let r = ctx.sql("SELECT avg(x) FROM t").await.unwrap();
                        std::hint::black_box(r.collect().await.unwrap());
                        let b = t.elapsed();
                        if k > 0 {
                            (dp, check, base) = (dp.min(a), check.min(c), base.min(b));
                        }
                    }
                    println!(
                        "| {n} | {partitions} | {source} | {ledger} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
                        dp.as_secs_f64() * 1e3,
                        check.as_secs_f64() * 1e3,
                        base.as_secs_f64() * 1e3,
                        (dp.as_secs_f64() - base.as_secs_f64()) * 1e3,
                        dp.as_secs_f64() / base.as_secs_f64()
                    );
                }
            }
        }
        let _ = std::fs::remove_file(&pq);
    }
    let _ = std::fs::remove_dir_all(&disk);
    if let Some(shm) = shm {
        let _ = std::fs::remove_dir_all(shm);
    }
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
