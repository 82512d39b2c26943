//! dpfusion on Apache DataFusion Ballista (feature `distributed`, issue 9): the same queries run in
//! this process and on an in-process Ballista cluster (loopback only) are admitted and charged
//! identically and release statistically equivalent values, and noise is drawn once per release,
//! at the final aggregation, not once per partition. What a cluster cannot run as it was checked
//! (the guard's per-query functions, a condition on released values, a plan its scheduler cannot
//! plan) is refused before admission, nothing charged (round 49).
//!
//! Sessions draw noise from the OS (no seed reaches a session), so the checks are statistical:
//! a GROUP BY over G = 2000 groups with identical data gives 2000 independent releases of the
//! same value in one query, and every tolerance below is derived from the sampling distribution
//! of the statistic it bounds, at z = 6 (a false failure has probability below 1e-8 per check).
#![cfg(feature = "distributed")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::parquet::arrow::ArrowWriter;
use dpfusion::distributed::start_local_cluster;
use dpfusion::dpfusion_udfs::aggregates::SumParams;
use dpfusion::dpfusion_udfs::mechanisms::GaussianMechanism;
use dpfusion::dpfusion_udfs::mechanisms::exact::FixedPoint;
use dpfusion::{PrivateSession, QueryResult, Registration, SessionOptions};

/// Groups, files (= scan partitions) and rows per group in each file.
const G: i64 = 2000;
const FILES: usize = 4;
const ROWS_PER_GROUP_PER_FILE: usize = 2;
/// Every value is 0.5, so each group's exact sum is 0.5 · 2 · 4 = 4.
const VALUE: f64 = 0.5;
const TRUE_SUM: f64 = VALUE * (ROWS_PER_GROUP_PER_FILE * FILES) as f64;
/// Tolerances are z standard errors of the statistic they bound.
const Z: f64 = 6.0;

const SUM_SQL: &str =
    "SELECT g, dp_sum(v, 0, 1, epsilon => 1.0, delta => 1e-6) AS s FROM t GROUP BY g";
const MEAN_SQL: &str =
    "SELECT g, dp_mean(v, 0, 1, epsilon => 4.0, delta => 1e-6) AS m FROM t GROUP BY g";
const COUNT_SQL: &str = "SELECT k, dp_count(v, epsilon => 1.0) AS n FROM u GROUP BY k ORDER BY k";
const TOTAL_SQL: &str = "SELECT dp_count(v, epsilon => 0.5) AS n, \
     dp_mean(v, 0, 1, epsilon => 0.5) AS m FROM t";

#[path = "../src/testdir.rs"]
mod testdir;
use testdir::{TestPath, test_dir};

fn write_parquet(path: &Path, batch: &RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Table `t`: FILES Parquet files, each holding ROWS_PER_GROUP_PER_FILE rows of every group
/// g = 0..G with v = 0.5, so every group is spread over all FILES scan partitions.
fn write_groups_table(dir: &Path) -> PathBuf {
    let out = dir.join("t");
    std::fs::create_dir_all(&out).unwrap();
    for f in 0..FILES {
        let g: Vec<i64> = (0..G)
            .flat_map(|g| std::iter::repeat_n(g, ROWS_PER_GROUP_PER_FILE))
            .collect();
        let v = vec![VALUE; g.len()];
        let batch = RecordBatch::try_from_iter(vec![
            ("g", Arc::new(Int64Array::from(g)) as ArrayRef),
            ("v", Arc::new(Float64Array::from(v)) as ArrayRef),
        ])
        .unwrap();
        write_parquet(&out.join(format!("part-{f}.parquet")), &batch);
    }
    out
}

/// Table `u`: 10 private groups k of 400 rows each, over FILES files (GROUP BY a private column:
/// partition selection runs on the cluster too).
fn write_private_groups_table(dir: &Path) -> PathBuf {
    let out = dir.join("u");
    std::fs::create_dir_all(&out).unwrap();
    for f in 0..FILES {
        let k: Vec<i64> = (0..10).flat_map(|k| std::iter::repeat_n(k, 100)).collect();
        let v = vec![1.0; k.len()];
        let batch = RecordBatch::try_from_iter(vec![
            ("k", Arc::new(Int64Array::from(k)) as ArrayRef),
            ("v", Arc::new(Float64Array::from(v)) as ArrayRef),
        ])
        .unwrap();
        write_parquet(&out.join(format!("part-{f}.parquet")), &batch);
    }
    out
}

/// A session with its own ledger `ledger`, on the tables `t` and `u` under `dir/data`.
async fn open(dir: &Path, ledger: &str, options: SessionOptions) -> PrivateSession {
    let s = PrivateSession::open(
        options
            .with_ledger(dir.join(ledger))
            .with_target_partitions(FILES),
    )
    .await
    .unwrap();
    let t = dir.join("data").join("t");
    let u = dir.join("data").join("u");
    s.register_parquet(
        "t",
        &t,
        Registration::private()
            .replace()
            .public_columns(["g"])
            .budget(50.0, 1e-5),
    )
    .await
    .unwrap();
    s.register_parquet("u", &u, Registration::private().budget(50.0, 1e-5))
        .await
        .unwrap();
    s
}

fn data_dir(tag: &str) -> TestPath {
    let dir = test_dir(&format!("ballista-{tag}"));
    let data = dir.join("data");
    write_groups_table(&data);
    write_private_groups_table(&data);
    dir
}

/// Column `i` of a result as f64 (Float64 or Int64).
fn column(r: &QueryResult, i: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for b in &r.batches {
        let c = b.column(i);
        if let Some(a) = c.as_any().downcast_ref::<Float64Array>() {
            out.extend((0..a.len()).map(|j| a.value(j)));
        } else if let Some(a) = c.as_any().downcast_ref::<Int64Array>() {
            out.extend((0..a.len()).map(|j| a.value(j) as f64));
        } else {
            panic!("column {i} is {}", c.data_type());
        }
    }
    out
}

fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let v = x.iter().map(|y| (y - m) * (y - m)).sum::<f64>() / (n - 1.0);
    (m, v)
}

/// σ of `dp_sum(v, 0, 1, epsilon => 1.0, delta => 1e-6)` on `t` (replace neighbours, public
/// group key, no filter: the guard sets 'replace_public_n'), by the mechanism's own calibration:
/// sensitivity max(hi − lo, |lo|, |hi|) grid units of the fixed-point grid of [0, 1].
fn sum_sigma() -> f64 {
    let p = SumParams {
        lower: 0.0,
        upper: 1.0,
        epsilon: 1.0,
        delta: 1e-6,
        neighbours: dpfusion::dpfusion_udfs::aggregates::Neighbours::ReplacePublicN,
        mechanism: dpfusion::dpfusion_udfs::aggregates::Mechanism::Gaussian,
    };
    let fp = FixedPoint::new(p.lower, p.upper);
    let units = fp.width().max(fp.max_abs());
    GaussianMechanism::from_mu(p.mu().unwrap(), units as f64 * fp.step())
        .unwrap()
        .sigma
}

/// The G releases of SUM_SQL have mean TRUE_SUM and variance σ² (not FILES·σ², as they would if
/// every partition's partial sum were noised): sample variance s² of G draws has
/// (G − 1)s²/σ² ~ χ²(G − 1), so s²/σ² has standard error sqrt(2/(G − 1)) ≈ 0.032 and the
/// acceptance band 1 ± 6·0.032 = [0.81, 1.19] excludes 4 (and 2) by far.
fn check_sum_releases(label: &str, r: &QueryResult) -> (f64, f64) {
    let s = column(r, 1);
    assert_eq!(s.len() as i64, G, "{label}: one release per group");
    let sigma = sum_sigma();
    let (m, v) = mean_var(&s);
    let ratio = v / (sigma * sigma);
    let ratio_tol = Z * (2.0 / (G as f64 - 1.0)).sqrt();
    eprintln!(
        "{label}: {G} releases, mean {m:.4} (exact {TRUE_SUM}), variance {v:.4} = {ratio:.4} σ² \
         (σ = {sigma:.4}; accepted: 1 ± {ratio_tol:.3}; per-partition noise would give {FILES})"
    );
    assert!(
        (ratio - 1.0).abs() <= ratio_tol,
        "{label}: variance of a release is {ratio:.3} σ², expected 1 ± {ratio_tol:.3} (noise once \
         per release, at the final aggregation)"
    );
    let mean_tol = Z * sigma / (G as f64).sqrt();
    assert!(
        (m - TRUE_SUM).abs() <= mean_tol,
        "{label}: mean release {m} vs exact sum {TRUE_SUM} ± {mean_tol}"
    );
    (m, v)
}

/// Noise once per release on the cluster: `t` is 4 Parquet files (4 scan partitions, partial
/// aggregates on the executors, merged after the shuffle) and the variance of each group's
/// release is the calibrated σ², not 4σ².
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noise_is_drawn_once_per_release_on_the_cluster() {
    let dir = data_dir("once");
    let cluster = open(
        &dir,
        "cluster.jsonl",
        SessionOptions::default().with_ballista_standalone(),
    )
    .await;
    let r = cluster.sql(SUM_SQL).await.unwrap();
    assert!(r.receipt.is_some(), "charged");
    check_sum_releases("ballista standalone", &r);

    // EXPLAIN of a plan that reads a private table is refused (it would show statistics and
    // file ranges of the data) ...
    let e = cluster
        .sql(&format!("EXPLAIN {SUM_SQL}"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("EXPLAIN PRIVACY"), "{e}");
    // ... so the plan's shape is shown on a public copy of the same files: Ballista's own
    // EXPLAIN shows where the noise is drawn. Stage 1 scans the 4 files as 4 partitions and runs
    // the partial aggregate (exact state) before the shuffle; the final aggregation, whose
    // `evaluate` adds the noise, runs after it.
    let public = write_groups_table(&dir.join("public"));
    cluster
        .register_parquet("tpub", &public, Registration::public())
        .await
        .unwrap();
    let plan = cluster
        .sql(&format!(
            "EXPLAIN {}",
            SUM_SQL.replace("FROM t ", "FROM tpub ")
        ))
        .await
        .unwrap();
    assert!(plan.receipt.is_none(), "EXPLAIN is not charged");
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    let distributed = text
        .split("distributed_plan")
        .nth(1)
        .unwrap_or_else(|| panic!("no distributed plan in:\n{text}"));
    let partial = distributed.find("mode=Partial").expect("partial aggregate");
    let shuffle = distributed.find("UnresolvedShuffleExec").expect("shuffle");
    let last = distributed
        .find("mode=FinalPartitioned")
        .expect("final aggregate");
    assert!(
        distributed.contains(&format!("stage_id=1.0, partitions={FILES}")),
        "{text}"
    );
    assert!(distributed.contains(&format!("file_groups={{{FILES} groups")));
    assert!(partial < last && last < shuffle, "{distributed}");
}

fn spent(s: &PrivateSession, table: &str) -> f64 {
    s.budget()
        .into_iter()
        .find(|b| b.name == table)
        .map(|b| b.spent)
        .unwrap()
}

/// The same queries locally and on a scheduler with two executors (in this process, loopback):
/// both admitted, charged identically, statistically equivalent releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_cluster_runs_agree() {
    let dir = data_dir("agree");
    let cluster_info = start_local_cluster(2, 2).await.unwrap();
    let local = open(&dir, "local.jsonl", SessionOptions::default()).await;
    let cluster = open(
        &dir,
        "cluster.jsonl",
        SessionOptions::default().with_ballista_remote(cluster_info.url()),
    )
    .await;

    // 1. dp_sum over 2000 groups: each path on its own, then against each other.
    let (ml, vl) = check_sum_releases("local", &local.sql(SUM_SQL).await.unwrap());
    let scans_before = cluster.scans("t");
    let (mc, vc) = check_sum_releases("ballista", &cluster.sql(SUM_SQL).await.unwrap());
    assert_eq!(
        cluster.scans("t"),
        scans_before + 1,
        "submitted to the cluster"
    );
    let g = G as f64;
    let tol = Z * ((vl + vc) / g).sqrt();
    assert!((ml - mc).abs() <= tol, "sum means {ml} vs {mc} ± {tol}");
    // log(s1²/s2²) has standard error sqrt(2·2/(G − 1)).
    let tol = Z * (4.0 / (g - 1.0)).sqrt();
    assert!(
        (vl / vc).ln().abs() <= tol,
        "sum variances {vl} vs {vc}: |log ratio| ≤ {tol}"
    );

    // 2. dp_mean over 2000 groups (exact public n under 'replace_public_n').
    let a = column(&local.sql(MEAN_SQL).await.unwrap(), 1);
    let b = column(&cluster.sql(MEAN_SQL).await.unwrap(), 1);
    assert_eq!(a.len(), b.len());
    let ((ma, va), (mb, vb)) = (mean_var(&a), mean_var(&b));
    let tol = Z * ((va + vb) / g).sqrt();
    eprintln!("dp_mean: local {ma:.4} (var {va:.5}), ballista {mb:.4} (var {vb:.5}), ± {tol:.4}");
    assert!((ma - mb).abs() <= tol, "mean releases {ma} vs {mb} ± {tol}");
    assert!(a.iter().chain(&b).all(|m| (0.0..=1.0).contains(m)));

    // 3. GROUP BY a private column: partition selection (a dpfusion aggregate the guard adds)
    //    runs on the executors too; all 10 groups of 400 rows pass its threshold.
    let a = column(&local.sql(COUNT_SQL).await.unwrap(), 1);
    let b = column(&cluster.sql(COUNT_SQL).await.unwrap(), 1);
    assert_eq!((a.len(), b.len()), (10, 10), "every group kept");
    // σ of dp_count at ε = 1, δ = 1e-7 is about 5: 50 is 10σ.
    assert!(
        a.iter().chain(&b).all(|n| (n - 400.0).abs() <= 50.0),
        "{a:?} {b:?}"
    );

    // 4. Ungrouped, two calls in one query.
    let r = cluster.sql(TOTAL_SQL).await.unwrap();
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    local.sql(TOTAL_SQL).await.unwrap();

    // Charged identically: the same ledger entries (query, tables, ε, events), the same spent ε.
    let (la, lb) = (local.ledger().unwrap(), cluster.ledger().unwrap());
    assert_eq!(la.len(), 4);
    assert_eq!(la.len(), lb.len());
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!(x.query, y.query);
        assert_eq!(x.tables, y.tables, "charge of {}", x.query);
    }
    for t in ["t", "u"] {
        assert_eq!(spent(&local, t), spent(&cluster, t), "spent ε of {t}");
    }

    // Refusals on a cluster session are the client's: nothing is submitted or charged.
    let scans = cluster.scans("t");
    let err = cluster.sql("SELECT * FROM t").await.unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    let err = cluster
        .sql("SELECT dp_count(v, epsilon => 1000) FROM t")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(cluster.scans("t"), scans, "a refused query reads nothing");
    assert_eq!(cluster.ledger().unwrap().len(), lb.len(), "nothing charged");

    // SHOW BUDGET, dp_ledger() and EXPLAIN PRIVACY stay in the client.
    cluster.sql("SHOW BUDGET").await.unwrap();
    let r = cluster.sql("SELECT * FROM dp_ledger()").await.unwrap();
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 4);
    cluster
        .sql(&format!("EXPLAIN PRIVACY {SUM_SQL}"))
        .await
        .unwrap();
}

/// In-memory tables live in the client: their queries run there, even on a cluster session; a
/// query that reads both a file table and an in-memory table is refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_tables_run_in_the_client() {
    let dir = data_dir("memory");
    let cluster = open(
        &dir,
        "ledger.jsonl",
        SessionOptions::default().with_ballista_standalone(),
    )
    .await;
    let batch = RecordBatch::try_from_iter(vec![(
        "x",
        Arc::new(Float64Array::from(vec![1.0; 1000])) as ArrayRef,
    )])
    .unwrap();
    cluster
        .register_batches("m", vec![batch.clone()], Registration::private())
        .unwrap();
    let r = cluster
        .sql("SELECT dp_count(x, epsilon => 0.5) AS n FROM m")
        .await
        .unwrap();
    assert!(r.receipt.is_some());
    let public_file = dir.join("public.parquet");
    write_parquet(&public_file, &batch);
    cluster
        .register_batches("pm", vec![batch], Registration::public())
        .unwrap();
    cluster
        .register_parquet("pf", &public_file, Registration::public())
        .await
        .unwrap();
    let err = cluster
        .sql("SELECT count(*) FROM pf CROSS JOIN pm")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot read both"), "{err}");
}

/// A checked plan runs on a cluster exactly as it was checked, or not at all (issue 26): the
/// guard's total-evaluation wrapper (an expression over private rows that could fail on a row)
/// cannot cross Ballista's codec, so such a query is refused on a cluster before admission:
/// nothing read, nothing charged. It runs in a session without a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_that_cannot_cross_as_checked_is_refused_on_a_cluster() {
    let dir = data_dir("crossing");
    let cluster = open(
        &dir,
        "ledger.jsonl",
        SessionOptions::default().with_ballista_standalone(),
    )
    .await;
    let sql = "SELECT dp_sum(v * 2, 0, 1, epsilon => 1.0) AS s FROM t";
    let scans = cluster.scans("t");
    let err = cluster.sql(sql).await.unwrap_err();
    assert!(
        err.to_string().contains("cannot cross Ballista's codec"),
        "{err}"
    );
    assert_eq!(cluster.scans("t"), scans, "a refused query reads nothing");
    assert!(cluster.ledger().unwrap().is_empty(), "nothing charged");
    let local = open(&dir, "local.jsonl", SessionOptions::default()).await;
    assert!(local.sql(sql).await.unwrap().receipt.is_some());

    // A table with a privacy unit: its bounding's functions (the keyed group choice, the row
    // sample) hold per-query state no codec carries, so it is refused the same way.
    let units = Registration::private()
        .privacy_unit("k")
        .contribution_bounds(1, 10)
        .budget(50.0, 1e-5);
    // A copy of `u`'s files: a file is one table, with one policy, in a session (round 46).
    let u = dir.join("data").join("pu");
    std::fs::create_dir_all(&u).unwrap();
    for f in std::fs::read_dir(dir.join("data").join("u")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, u.join(f.file_name().unwrap())).unwrap();
    }
    cluster
        .register_parquet("pu", &u, units.clone())
        .await
        .unwrap();
    let sql = "SELECT dp_count(v, 1.0) AS n FROM pu";
    let err = cluster.sql(sql).await.unwrap_err();
    assert!(err.to_string().contains("privacy unit"), "{err}");
    assert_eq!(cluster.scans("pu"), 0, "a refused query reads nothing");
    assert!(cluster.ledger().unwrap().is_empty(), "nothing charged");
    // Round 49 (review "distributed" F4): an ungrouped dp_sum's bounding sums each unit's rows
    // exactly in `__dpfusion_unit_total` (round 48), so it no longer crosses either; an ungrouped
    // dp_count_distinct keeps one row per unit with no function of the bounding's, and runs on
    // the cluster.
    let sum = "SELECT dp_sum(v, 0, 1, epsilon => 1.0) AS s FROM pu";
    let err = cluster.sql(sum).await.unwrap_err();
    assert!(err.to_string().contains("privacy unit"), "{err}");
    assert!(cluster.ledger().unwrap().is_empty(), "nothing charged");
    let distinct = "SELECT dp_count_distinct(k, epsilon => 1.0) AS n FROM pu";
    let r = cluster.sql(distinct).await.unwrap();
    assert!(r.receipt.is_some(), "charged");
    assert_eq!(column(&r, 0).len(), 1);
    assert_eq!(cluster.scans("pu"), 1, "submitted to the cluster");
    local.register_parquet("pu", &u, units).await.unwrap();
    assert!(local.sql(sql).await.unwrap().receipt.is_some());
    assert!(local.sql(sum).await.unwrap().receipt.is_some());

    // Round 49 (review "distributed" F4): a LIKE or regular-expression match over private rows
    // is always made total (its matcher is built inside the guard's wrapper), so it is refused
    // on a cluster too.
    let jobs = write_jobs_table(&dir.join("data"), false);
    let private = Registration::private().budget(50.0, 1e-5);
    for s in [&cluster, &local] {
        s.register_parquet("jobs", &jobs, private.clone())
            .await
            .unwrap();
    }
    for sql in [
        "SELECT dp_count(salary, 1.0) AS n FROM jobs WHERE job LIKE 'j1%'",
        "SELECT dp_count(salary, 1.0) AS n FROM jobs WHERE regexp_like(job, '^j1')",
    ] {
        let err = cluster.sql(sql).await.unwrap_err();
        assert!(
            err.to_string().contains("cannot cross Ballista's codec"),
            "{sql}: {err}"
        );
        assert!(local.sql(sql).await.unwrap().receipt.is_some(), "{sql}");
    }
    assert_eq!(cluster.scans("jobs"), 0, "a refused query reads nothing");
    assert_eq!(
        cluster.ledger().unwrap().len(),
        1,
        "only dp_count_distinct charged"
    );
}

/// A private CSV table is read in the client, whole and record by record (round 47), so its
/// queries run there on a cluster session; a query that also reads a file table the cluster
/// scans is refused before admission with what the CSV table is and what to do (before, the
/// message spoke of in-memory tables). Nothing is charged for the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_csv_table_runs_in_the_client() {
    let dir = data_dir("csv");
    let cluster = open(
        &dir,
        "ledger.jsonl",
        SessionOptions::default().with_ballista_standalone(),
    )
    .await;
    let csv = dir.join("c.csv");
    let rows: String = (0..1000).map(|i| format!("{}\n", i % 10)).collect();
    std::fs::write(&csv, format!("x\n{rows}zz\n")).unwrap();
    cluster
        .register_csv("c", &csv, Registration::private().budget(50.0, 1e-5))
        .await
        .unwrap();
    let r = cluster
        .sql("SELECT dp_count(x, epsilon => 0.5) AS n FROM c")
        .await
        .unwrap();
    assert!(r.receipt.is_some());
    let charged = cluster.ledger().unwrap().len();
    let err = cluster
        .sql(
            "SELECT dp_count(x, epsilon => 0.5) AS n FROM c \
             UNION ALL SELECT dp_count(v, epsilon => 0.5) AS n FROM t",
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("private CSV tables (c)") && err.contains("as Parquet"),
        "{err}"
    );
    assert!(!err.contains("in-memory"), "{err}");
    assert_eq!(cluster.ledger().unwrap().len(), charged, "nothing charged");
}

/// Table `jobs` under `dir`: 200 jobs of 100 rows each, all released, in one Parquet file, and,
/// when `target`, one more row, of job 'target' (never released: one row is far below partition
/// selection's threshold). The final aggregation's batches then hold many groups each, most of
/// them released.
fn write_jobs_table(dir: &Path, target: bool) -> PathBuf {
    let out = dir.join(if target { "jobs-target" } else { "jobs" });
    std::fs::create_dir_all(&out).unwrap();
    let mut job: Vec<String> = (0..200)
        .flat_map(|j| std::iter::repeat_n(format!("j{j}"), 100))
        .collect();
    if target {
        job.push("target".into());
    }
    write_job_rows(out, job)
}

/// One Parquet file `out/part-0.parquet` of the rows (job, salary 1.0).
fn write_job_rows(out: PathBuf, job: Vec<String>) -> PathBuf {
    let salary = vec![1.0; job.len()];
    let batch = RecordBatch::try_from_iter(vec![
        (
            "job",
            Arc::new(datafusion::arrow::array::StringArray::from(job)) as ArrayRef,
        ),
        ("salary", Arc::new(Float64Array::from(salary)) as ArrayRef),
    ])
    .unwrap();
    write_parquet(&out.join("part-0.parquet"), &batch);
    out
}

/// Round 49, review "distributed" F1: a condition on released values that fails only on a group
/// that was not released. The guard leaves it above the release; a scheduler that optimized the
/// plan again merged it into the partition selection's filter, where it ran on the group
/// 'target' too: on the standalone cluster the query failed (charged) exactly when a row of job
/// 'target' existed, and returned the 200 released groups when none did.
const CONDITION_ON_RELEASES: &str = "SELECT * FROM (SELECT job, dp_count(salary, 1.0) AS n \
     FROM jobs GROUP BY job) r \
     WHERE r.job <> 'target' OR 1 / (character_length(r.job) - 6) = 5 OR r.n < -1e300";

fn rows(r: &QueryResult) -> usize {
    r.batches.iter().map(|b| b.num_rows()).sum()
}

/// On a cluster, a WHERE, HAVING or JOIN condition above a DP release is refused before
/// admission (nothing read, nothing charged), with what to do: the DP query alone, then the
/// condition on its result in this client, or no cluster. Without a cluster the query runs, and
/// the condition sees released groups only, with or without the row of 'target'. What stays above
/// a release on a cluster (an aggregate, a sort and a limit) runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_on_released_values_is_refused_on_a_cluster() {
    let dir = data_dir("released");
    let private = Registration::private().budget(50.0, 1e-5);
    for target in [false, true] {
        let jobs = write_jobs_table(&dir.join("data"), target);
        let cluster = open(
            &dir,
            &format!("cluster-{target}.jsonl"),
            SessionOptions::default().with_ballista_standalone(),
        )
        .await;
        cluster
            .register_parquet("jobs", &jobs, private.clone())
            .await
            .unwrap();
        let join = "SELECT r.job, r.n, s.m FROM \
             (SELECT job, dp_count(salary, 1.0) AS n FROM jobs GROUP BY job) r JOIN \
             (SELECT job, dp_count(salary, 1.0) AS m FROM jobs GROUP BY job) s \
             ON r.job = s.job AND (r.job <> 'target' OR 1 / (character_length(s.job) - 6) = 5)";
        let having = "SELECT job, dp_count(salary, 1.0) AS n FROM jobs GROUP BY job \
             HAVING job <> 'target' OR 1 / (character_length(job) - 6) = 5 OR n < -1e300";
        for (sql, what) in [
            (CONDITION_ON_RELEASES, "a WHERE or HAVING condition"),
            (having, "a WHERE or HAVING condition"),
            (join, "a JOIN's keys or condition"),
        ] {
            let err = cluster.sql(sql).await.unwrap_err().to_string();
            assert!(
                err.contains(&format!("{what} applies to the results of a DP aggregate"))
                    && err.contains("CREATE TABLE r AS")
                    && err.contains("Nothing was charged"),
                "{sql}: {err}"
            );
        }
        assert_eq!(cluster.scans("jobs"), 0, "a refused query reads nothing");
        assert!(cluster.ledger().unwrap().is_empty(), "nothing charged");

        // What the refusal says to do: the DP query alone on the cluster, then the condition on
        // its result in this client.
        cluster
            .sql("CREATE TABLE r AS SELECT job, dp_count(salary, 1.0) AS n FROM jobs GROUP BY job")
            .await
            .unwrap();
        assert_eq!(cluster.scans("jobs"), 1, "the release ran on the cluster");
        let r = cluster
            .sql("SELECT * FROM r WHERE r.job <> 'target' OR 1 / (character_length(r.job) - 6) = 5")
            .await
            .unwrap();
        assert_eq!(rows(&r), 200, "target = {target}");
        // An aggregate, a sort and a limit above a release run on the cluster.
        let r = cluster
            .sql(
                "SELECT count(*) AS groups, max(n) AS most FROM (SELECT job, \
                 dp_count(salary, 1.0) AS n FROM jobs GROUP BY job ORDER BY n DESC LIMIT 150) r",
            )
            .await
            .unwrap();
        assert!(r.receipt.is_some());
        assert_eq!(column(&r, 0), vec![150.0]);
        assert_eq!(cluster.scans("jobs"), 2);

        let local = open(
            &dir,
            &format!("local-{target}.jsonl"),
            SessionOptions::default(),
        )
        .await;
        local
            .register_parquet("jobs", &jobs, private.clone())
            .await
            .unwrap();
        let r = local.sql(CONDITION_ON_RELEASES).await.unwrap();
        assert!(r.receipt.is_some());
        assert_eq!(rows(&r), 200, "target = {target}");
    }
}

/// Round 49, review "distributed" F1, the second layer: a dpfusion scheduler plans the checked
/// plan as it is. Its session runs no logical optimizer rule, no physical FilterPushdown, no
/// dynamic filter, no file statistics and not Ballista's adaptive planner, whatever the job's
/// settings; so the condition of the review's query stays above the partition selection there,
/// where Ballista's default session moved it into the selection's filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpfusion_scheduler_plans_the_checked_plan_as_it_is() {
    use ballista::prelude::SessionConfigExt;
    use datafusion::prelude::SessionConfig;
    let mut asked = SessionConfig::new_with_ballista().with_ballista_adaptive_query_planner(true);
    asked.options_mut().execution.collect_statistics = true;
    asked.options_mut().optimizer.enable_dynamic_filter_pushdown = true;
    asked
        .options_mut()
        .optimizer
        .enable_topk_dynamic_filter_pushdown = true;
    let state = dpfusion::distributed::scheduler_state(asked).unwrap();
    assert!(state.optimizers().is_empty(), "no logical optimizer rule");
    assert!(
        !state
            .physical_optimizers()
            .iter()
            .any(|r| r.name().starts_with("FilterPushdown"))
    );
    let config = state.config();
    assert!(!config.ballista_adaptive_query_planner_enabled());
    let options = config.options();
    assert!(!options.execution.collect_statistics);
    assert!(!options.optimizer.enable_dynamic_filter_pushdown);
    assert!(!options.optimizer.enable_topk_dynamic_filter_pushdown);
    assert!(!options.optimizer.enable_join_dynamic_filter_pushdown);
    assert!(!options.optimizer.enable_aggregate_dynamic_filter_pushdown);
    // The dpfusion functions are there: the scheduler resolves them by name.
    assert!(state.aggregate_functions().contains_key("dp_count"));

    // The review's plan, checked (in a session without a cluster, which admits it).
    let dir = data_dir("scheduler");
    let jobs = write_jobs_table(&dir.join("data"), true);
    let local = open(&dir, "local.jsonl", SessionOptions::default()).await;
    local
        .register_parquet("jobs", &jobs, Registration::private().budget(50.0, 1e-5))
        .await
        .unwrap();
    let checked = local.check(CONDITION_ON_RELEASES).await.unwrap();
    let written = checked.plan().display_indent().to_string();
    let merged = |text: &str| {
        text.lines()
            .any(|l| l.contains("Filter: __dpfusion_partition_select AND"))
    };
    assert!(!merged(&written), "{written}");
    let kept = state.optimize(checked.plan()).unwrap();
    assert_eq!(kept.display_indent().to_string(), written);
    // Ballista's default session (before round 49, the session of every dpfusion scheduler)
    // merged the condition into the selection's filter.
    let ballista = dpfusion::distributed::function_state(SessionConfig::new_with_ballista())
        .unwrap()
        .optimize(checked.plan())
        .unwrap()
        .display_indent()
        .to_string();
    assert!(merged(&ballista), "{ballista}");
}

/// Round 49, review "distributed" F2: on a cluster the physical plan in the client is lazy (the
/// plan is encoded, sent and planned by the scheduler when it runs, after admission), so a query
/// the scheduler cannot plan was charged, then failed. The client now plans it as the scheduler
/// will, and encodes it, before admission: refused, nothing charged, nothing read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_the_cluster_cannot_plan_is_refused_before_admission() {
    let dir = data_dir("unplannable");
    let jobs = write_jobs_table(&dir.join("data"), false);
    let cluster = open(
        &dir,
        "cluster.jsonl",
        SessionOptions::default().with_ballista_standalone(),
    )
    .await;
    cluster
        .register_parquet("jobs", &jobs, Registration::private().budget(50.0, 1e-5))
        .await
        .unwrap();
    let err = cluster
        .sql("SELECT dp_count(salary, 1.0) AS n, $1 AS p FROM jobs")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("could not be planned") && err.contains("Nothing was charged"),
        "{err}"
    );
    assert!(!err.contains(&dir.to_string_lossy().to_string()), "{err}");
    assert!(cluster.ledger().unwrap().is_empty(), "nothing charged");
    assert_eq!(cluster.scans("jobs"), 0, "nothing read");
    // The same session runs a plannable query.
    let r = cluster
        .sql("SELECT dp_count(salary, 1.0) AS n FROM jobs")
        .await
        .unwrap();
    assert!(r.receipt.is_some());
    assert_eq!(cluster.ledger().unwrap().len(), 1);
}

/// A private Parquet table `longjobs` whose job names are longer than the 12 bytes a string view
/// holds inline, so a released job's bytes sit in the view column's data buffers.
fn write_long_jobs_table(dir: &Path) -> PathBuf {
    let out = dir.join("longjobs");
    std::fs::create_dir_all(&out).unwrap();
    let job: Vec<String> = (0..200)
        .flat_map(|j| std::iter::repeat_n(format!("a-long-job-name-{j:04}"), 100))
        .collect();
    write_job_rows(out, job)
}

/// Round 51, review "cluster":
/// - F2: the client's plan of a cluster query is Ballista's, planned with no physical rule, so
///   `CompactOutput` did not wrap it, and the decoded batches carried the executors' buffers as
///   they were (the view bytes of released keys in the order the aggregate met them). Now the
///   bytes of every released view lie in row order, in one buffer per batch.
/// - F3: the guard's `__dpfusion_compact` was in the client's registry; analysts cannot call it.
/// - F1: a call the session bounds (`Sized`, crossing Ballista's codec by name as DataFusion's
///   own function) is refused before admission.
/// - F2/F4: `COPY` of a query the cluster runs is refused (the executors would write the file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round51_what_a_cluster_query_returns_and_calls_is_what_the_client_checked() {
    let dir = data_dir("round51");
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let cluster = open(
        &dir,
        "cluster.jsonl",
        SessionOptions::default()
            .with_ballista_standalone()
            .with_output_dir(dir.join("out")),
    )
    .await;
    let jobs = write_long_jobs_table(&dir.join("data"));
    cluster
        .register_parquet(
            "longjobs",
            &jobs,
            Registration::private().budget(50.0, 1e-5),
        )
        .await
        .unwrap();

    let r = cluster
        .sql(
            "SELECT job, dp_count(salary, 1.0) AS n FROM longjobs GROUP BY job \
             ORDER BY job DESC",
        )
        .await
        .unwrap();
    assert!(rows(&r) > 150, "most groups released: {}", rows(&r));
    for b in &r.batches {
        let col = b.column(0);
        let Some(v) = col
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringViewArray>()
        else {
            continue;
        };
        assert!(v.data_buffers().len() <= 1, "one buffer per batch");
        let mut next = 0u32;
        let mut long = 0usize;
        for view in v.views().iter() {
            let len = *view as u32;
            if len <= 12 {
                continue;
            }
            let offset = (*view >> 96) as u32;
            assert_eq!(offset, next, "the bytes of released rows lie in row order");
            next += len;
            long += len as usize;
        }
        let held: usize = v.data_buffers().iter().map(|b| b.len()).sum();
        assert_eq!(held, long, "no byte but the released keys'");
    }

    let charged = cluster.ledger().unwrap().len();
    let err = cluster
        .sql("SELECT __dpfusion_compact(job) AS j, n FROM (SELECT job, dp_count(salary, 1.0) AS n FROM longjobs GROUP BY job)")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("__dpfusion_compact"), "{err}");
    let err = cluster
        .sql("SELECT repeat(job, 2) AS j, n FROM (SELECT job, dp_count(salary, 1.0) AS n FROM longjobs GROUP BY job)")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("repeat()") && err.contains("cannot cross Ballista's codec"),
        "{err}"
    );
    // The public side of a join runs while the query is checked: on the cluster it would run
    // without its bound too, so it is refused there, before anything runs (review "fixes" F1).
    let public = dir.join("data").join("pubjobs");
    std::fs::create_dir_all(&public).unwrap();
    let names: Vec<String> = (0..200)
        .map(|j| format!("a-long-job-name-{j:04}"))
        .collect();
    let pubs = RecordBatch::try_from_iter(vec![
        (
            "job",
            Arc::new(datafusion::arrow::array::StringArray::from(names)) as ArrayRef,
        ),
        ("n", Arc::new(Int64Array::from(vec![2i64; 200])) as ArrayRef),
    ])
    .unwrap();
    write_parquet(&public.join("part-0.parquet"), &pubs);
    cluster
        .register_parquet("pubjobs", &public, Registration::public())
        .await
        .unwrap();
    let err = cluster
        .sql(
            "SELECT dp_count(s.salary, 1.0) AS c FROM longjobs s JOIN (SELECT job, \
             repeat(job, n) AS pad FROM pubjobs) p ON s.job = p.job WHERE p.pad <> ''",
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("repeat()") && err.contains("cannot cross Ballista's codec"),
        "{err}"
    );
    assert_eq!(cluster.scans("pubjobs"), 0, "the public side did not run");
    let err = cluster
        .sql("COPY (SELECT dp_count(salary, 1.0) AS n FROM longjobs) TO 'n.parquet'")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("COPY of a query over file tables"), "{err}");
    assert_eq!(cluster.ledger().unwrap().len(), charged, "nothing charged");
}
