//! Integration tests of the private session over real CSV and Parquet files: admission until the
//! budget is exhausted, refusals that read nothing, restart on the same ledger, the guard.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array, Int64Array};
use dpfusion::{PrivateSession, Registration, SessionOptions};

use crate::common::{TestPath, people_csv, temp_dir};

/// Writes the people CSV as a Parquet file (with a plain DataFusion context).
async fn people_parquet(dir: &Path) -> PathBuf {
    let out = dir.join("people.parquet");
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_csv(
        "p",
        &people_csv().to_string_lossy(),
        datafusion::prelude::CsvReadOptions::new(),
    )
    .await
    .unwrap();
    ctx.sql(&format!(
        "COPY (SELECT * FROM p) TO '{}' STORED AS PARQUET",
        out.display()
    ))
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    out
}

async fn session(dir: &Path, eps: f64) -> PrivateSession {
    PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(eps, 1e-6)
            .with_target_partitions(2),
    )
    .await
    .unwrap()
}

fn f64_value(r: &dpfusion::QueryResult) -> f64 {
    let c = r.batches[0].column(0);
    if let Some(a) = c.as_any().downcast_ref::<Float64Array>() {
        return a.value(0);
    }
    c.as_any().downcast_ref::<Int64Array>().unwrap().value(0) as f64
}

/// Runs `q` until the first refusal; returns how many were admitted.
async fn run_until_refused(s: &PrivateSession, q: &str) -> (usize, String) {
    for i in 0..50 {
        match s.sql(q).await {
            Ok(r) => {
                let m = f64_value(&r);
                assert!((0.0..=100.0).contains(&m), "{m}");
            }
            Err(e) => return (i, e.to_string()),
        }
    }
    panic!("never refused: {q}");
}

async fn exhaust_then_refuse(s: &PrivateSession, table: &str) {
    // Budget ε = 1 at δ = 1e-6; each dp_mean is (0.3, 1e-6)-DP on its own, a Gaussian release of
    // μ ≈ 0.063. The table's gdp filter admits while Σμ² ≤ μ_B², μ_B the μ of (ε = 1,
    // δ_g = 5e-7) (half of δ is reserved for partition selection; docs/ACCOUNTING.md): 8 fit,
    // the 9th would not. Basic composition would allow only 3.
    let q = format!("SELECT dp_mean(age, 0, 100, 0.3, 1e-6) FROM {table}");
    let scans_before_all = s.scans(table);
    let (admitted, err) = run_until_refused(s, &q).await;
    assert_eq!(admitted, 8, "admitted");
    assert_eq!(
        s.scans(table) - scans_before_all,
        admitted as u64,
        "one scan per admitted query, none for the refused one"
    );
    assert!(err.contains("budget exceeded for table '"), "{err}");
    assert!(err.contains(table), "{err}");
    // The request as written, the shares, and the fix with its number (issue 29).
    assert!(
        err.contains("asked: dp_mean(ε 0.3, δ 1e-6, gaussian)") && err.contains("at δ = 5e-7)"),
        "{err}"
    );
    assert!(
        err.contains("% of the budget") && err.contains("% is left"),
        "{err}"
    );
    assert!(err.contains("Lower `epsilon =>` to at most 0.2"), "{err}");
    let spent = s.budget()[0].spent;
    assert!(spent <= 1.0 && spent > 0.9, "{spent}");
    // Refused again, and still nothing read.
    let before = s.scans(table);
    assert!(s.sql(&q).await.is_err());
    assert_eq!(s.scans(table), before, "a refused query must read nothing");
}

#[tokio::test]
async fn csv_budget_is_exhausted_then_refused_and_nothing_is_read() {
    let dir = temp_dir("csv");
    let s = session(&dir, 1.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    exhaust_then_refuse(&s, "people").await;
}

#[tokio::test]
async fn parquet_budget_is_exhausted_then_refused_and_nothing_is_read() {
    let dir = temp_dir("parquet");
    let file = people_parquet(&dir).await;
    let s = session(&dir, 1.0).await;
    s.register_parquet("people", &file, Registration::private())
        .await
        .unwrap();
    exhaust_then_refuse(&s, "people").await;
}

#[tokio::test]
async fn restart_on_the_same_ledger_refuses_what_the_old_session_would() {
    let dir = temp_dir("restart");
    {
        let s = session(&dir, 1.0).await;
        s.register_csv("people", people_csv(), Registration::private())
            .await
            .unwrap();
        let (admitted, _) =
            run_until_refused(&s, "SELECT dp_mean(age, 0, 100, 0.3, 1e-6) FROM people").await;
        assert!(admitted >= 3);
    }
    let s = session(&dir, 1.0).await;
    // Registered under another name, same file: same key, same spent budget.
    s.register_csv("again", people_csv(), Registration::private())
        .await
        .unwrap();
    let err = s
        .sql("SELECT dp_mean(age, 0, 100, 0.3, 1e-6) FROM again")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget exceeded"), "{err}");
    assert_eq!(s.scans("again"), 0);
    // A smaller query still fits.
    s.sql("SELECT dp_count(age, 0.05, 1e-6) FROM again")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_private_file_cannot_be_re_registered_as_public() {
    let dir = temp_dir("policy");
    let s = session(&dir, 1.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let err = s
        .register_csv("leak", people_csv(), Registration::public())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("private"), "{err}");
    let err = s
        .sql(&format!(
            "CREATE EXTERNAL TABLE leak2 STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true', 'dp.visibility' 'public')",
            people_csv().display()
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("private"), "{err}");
}

async fn guard_session() -> (PrivateSession, TestPath) {
    let dir = temp_dir("guard");
    let s = session(&dir, 100.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    s.register_csv(
        "staff",
        people_csv_copy(&dir),
        Registration::private().replace().public_columns(["dept"]),
    )
    .await
    .unwrap();
    s.register_batches(
        "depts",
        vec![
            datafusion::arrow::array::RecordBatch::try_from_iter(vec![(
                "dept",
                Arc::new(datafusion::arrow::array::StringArray::from(vec![
                    "eng", "ops", "sales", "hr",
                ])) as _,
            )])
            .unwrap(),
        ],
        Registration::public(),
    )
    .unwrap();
    (s, dir)
}

fn people_csv_copy(dir: &Path) -> PathBuf {
    let p = dir.join("staff.csv");
    std::fs::copy(people_csv(), &p).unwrap();
    p
}

#[tokio::test]
async fn guard_refuses_non_private_queries_with_a_message() {
    let (s, _dir) = guard_session().await;
    let cases: &[(&str, &str)] = &[
        ("SELECT * FROM people", "raw rows of private table 'people'"),
        (
            "SELECT age FROM people WHERE id = 1",
            "raw rows of private table 'people'",
        ),
        (
            "SELECT COUNT(*) FROM people",
            "COUNT on private table 'people' is not differentially private; use dp_count",
        ),
        (
            "SELECT SUM(salary) FROM people",
            "SUM on private table 'people'",
        ),
        (
            "SELECT AVG(age) FROM people",
            "AVG on private table 'people'",
        ),
        (
            "SELECT MAX(age) FROM people",
            "MAX on private table 'people'",
        ),
        (
            "SELECT MIN(age) FROM people",
            "MIN on private table 'people'",
        ),
        (
            "SELECT dept, COUNT(*) FROM people GROUP BY dept",
            "COUNT on private table 'people'",
        ),
        (
            "SELECT dp_count(age, 1.0), COUNT(*) FROM people",
            "COUNT is computed together with DP aggregates",
        ),
        ("SELECT DISTINCT dept FROM people", "private table 'people'"),
        (
            "SELECT dept FROM people GROUP BY dept",
            "private table 'people'",
        ),
        (
            "SELECT * FROM (SELECT age FROM people) t",
            "raw rows of private table 'people'",
        ),
        (
            "WITH t AS (SELECT age FROM people) SELECT * FROM t",
            "raw rows of private table 'people'",
        ),
        (
            "SELECT dp_count(a.age, 1.0) FROM people a JOIN people b ON a.id = b.id",
            "a JOIN of two private tables",
        ),
        (
            "SELECT dp_count(p.age, 1.0) FROM people p JOIN depts d ON p.dept < d.dept",
            "a JOIN without equality keys",
        ),
        (
            "SELECT dp_count(age, 1.0) FROM (SELECT age FROM people UNION ALL SELECT age FROM people) t",
            "a UNION between private table 'people'",
        ),
        (
            "SELECT dp_count(age, 1.0) FROM (SELECT age FROM people LIMIT 10) t",
            "LIMIT",
        ),
        (
            "SELECT dp_count(age, 1.0) FROM (SELECT DISTINCT age FROM people) t",
            "private table 'people'",
        ),
        (
            "SELECT dp_sum(c, 0, 100, 1.0) FROM (SELECT dept, COUNT(*) AS c FROM people GROUP BY dept) t",
            "a second aggregation",
        ),
        (
            "SELECT dp_count(r, 1.0) FROM (SELECT ROW_NUMBER() OVER () AS r FROM people) t",
            "a window function",
        ),
        (
            "SELECT age, ROW_NUMBER() OVER (ORDER BY age) FROM people",
            "window functions on private table 'people'",
        ),
        ("SELECT dp_count(age, 1.0) OVER () FROM people", "window"),
        (
            "SELECT dp_count(age, 1.0) FROM people WHERE age > (SELECT AVG(age) FROM people)",
            "private table 'people'",
        ),
        (
            "SELECT dp_count(age, 1.0) FROM people WHERE id IN (SELECT id FROM people WHERE age > 60)",
            "private table 'people'",
        ),
        (
            "SELECT dp_count(DISTINCT age, 1.0) FROM people",
            "DISTINCT inside dp_count",
        ),
        (
            "SELECT dp_mean(age, 0, 100, age) FROM people",
            "must be a literal",
        ),
        (
            "SELECT dp_mean(age, 0, id, 1.0) FROM people",
            "must be a literal",
        ),
        (
            "EXPLAIN ANALYZE SELECT dp_count(age, 1.0) FROM people",
            "EXPLAIN ANALYZE",
        ),
        (
            "INSERT INTO people VALUES (1, 2, 'x', 3.0, true)",
            "read-only",
        ),
        (
            "CREATE TABLE leak AS SELECT * FROM people",
            "raw rows of private table 'people'",
        ),
        (
            "COPY people TO '/tmp/dpfusion-leak.csv'",
            "COPY ... TO writes files",
        ),
        (
            "COPY (SELECT age FROM people) TO '/tmp/dpfusion-leak.csv'",
            "COPY ... TO writes files",
        ),
        ("SELECT dp_mean(age, 10, 0, 1.0) FROM people", "lower"),
        ("SELECT dp_mean(age, 0, 100, -1) FROM people", "epsilon"),
        ("SELECT dp_mean(age, 0, 100, 1, 2) FROM people", "delta"),
        (
            "SELECT dp_mean(age, 0, 100) FROM people",
            "missing required argument 'epsilon'",
        ),
        ("SET datafusion.execution.target_partitions = 1", "SET"),
        (
            "SELECT dp_count(age, 1.0) FROM people GROUP BY ROLLUP(dept)",
            "ROLLUP",
        ),
    ];
    assert!(cases.len() >= 25);
    for (sql, needle) in cases {
        let before = s.scans("people");
        match s.sql(sql).await {
            Ok(_) => panic!("admitted: {sql}"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains(needle),
                    "{sql}\n  got: {e}\n  expected to contain: {needle}"
                );
            }
        }
        assert_eq!(s.scans("people"), before, "refused query read data: {sql}");
    }
    // Nothing was charged by any of them.
    assert!(
        s.budget().iter().all(|r| r.queries == 0),
        "{:?}",
        s.budget()
    );
}

#[tokio::test]
async fn guard_admits_legitimate_shapes() {
    let (s, _dir) = guard_session().await;
    let cases = [
        "SELECT dp_count(age, 0.1) FROM people",
        "SELECT dp_mean(age, 0, 100, 0.1) FROM people WHERE dept = 'eng'",
        "SELECT dp_sum(CASE WHEN remote THEN 1 ELSE 0 END, 0, 1, 0.1) FROM people",
        "SELECT dp_mean(CAST(age AS DOUBLE) / 10, 0, 10, epsilon => 0.1) FROM people",
        "SELECT 2 * dp_mean(age, 0, 100, 0.1) + 1 AS scaled FROM people",
        "SELECT dp_count(age, 0.1), dp_sum(salary, 0, 200000, 0.1), dp_mean(age, 0, 100, 0.1) FROM people",
        "SELECT dept, dp_count(age, 0.1) FROM people GROUP BY dept",
        "SELECT dept, dp_mean(salary, 0, 200000, 0.1) FROM staff GROUP BY dept ORDER BY dept",
        "SELECT * FROM (SELECT dept, dp_count(age, 0.1) AS n FROM people GROUP BY dept) t WHERE n > 5",
        "SELECT dp_count(age, 0.1) FILTER (WHERE age > 30) FROM people",
        "SELECT dp_mean(age, upper => 100, lower => 0, epsilon => 0.1, delta => 1e-7) FROM people",
        "WITH young AS (SELECT age FROM people WHERE age < 40) SELECT dp_count(age, 0.1) FROM young",
        "SELECT d.dept, t.n FROM depts d LEFT JOIN (SELECT dept, dp_count(age, 0.1) AS n FROM staff GROUP BY dept) t ON d.dept = t.dept",
        "SELECT * FROM depts",
        "EXPLAIN PRIVACY SELECT dp_count(age, 0.1) FROM people",
    ];
    for sql in cases {
        s.sql(sql)
            .await
            .unwrap_or_else(|e| panic!("refused: {sql}\n  {e}"));
    }
}

#[tokio::test]
async fn group_by_private_keys_charges_partition_selection() {
    let (s, _dir) = guard_session().await;
    // people is add_remove: GROUP BY dept needs partition selection, charged in addition.
    let r = s
        .sql("EXPLAIN PRIVACY SELECT dept, dp_count(age, 0.5, 1e-6) FROM people GROUP BY dept")
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    assert!(text.contains("partition selection"), "{text}");
    // staff is replace with dept public: no selection.
    let r = s
        .sql("EXPLAIN PRIVACY SELECT dept, dp_count(age, 0.5, 1e-6) FROM staff GROUP BY dept")
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string();
    assert!(!text.contains("partition selection"), "{text}");
    // The selected groups are real groups.
    let r = s
        .sql("SELECT dept, dp_count(age, 5.0, 1e-6) AS n FROM people GROUP BY dept ORDER BY dept")
        .await
        .unwrap();
    let n: usize = r.batches.iter().map(|b| b.num_rows()).sum();
    assert!(n <= 4);
}

/// Every kind of dpfusion error can be matched without reading its text.
#[tokio::test]
async fn errors_are_typed() {
    use dpfusion::Error;
    let dir = temp_dir("typed");
    let s = session(&dir, 1.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let kind = |e: &datafusion::error::DataFusionError| match Error::of(e) {
        Some(Error::Refused(_)) => "refused",
        Some(Error::BudgetExceeded { .. }) => "budget",
        Some(Error::Invalid(_)) => "invalid",
        Some(Error::Policy(_)) => "policy",
        Some(Error::ExecutionFailed) => "failed",
        // `dpfusion::Error` is non-exhaustive: a kind added later.
        Some(_) => "other",
        None => "untyped",
    };
    let e = s.sql("SELECT * FROM people").await.unwrap_err();
    assert_eq!(kind(&e), "refused", "{e}");
    let e = s
        .sql("SELECT dp_count(age, epsilon => 5.0) FROM people")
        .await
        .unwrap_err();
    assert_eq!(kind(&e), "budget", "{e}");
    match Error::of(&e) {
        Some(Error::BudgetExceeded {
            table,
            budget,
            limit,
            ..
        }) => {
            assert_eq!(table, "people");
            assert_eq!(budget.epsilon, 1.0);
            assert_eq!(*limit, dpfusion::accounting::Limit::Epsilon);
        }
        other => panic!("{other:?}"),
    }
    let e = s
        .sql("SELECT dp_count(nope, 0.1) FROM people")
        .await
        .unwrap_err();
    assert_eq!(kind(&e), "invalid", "{e}");
    let e = s
        .sql("SELECT dp_mean(age, 10, 0, 0.1) FROM people")
        .await
        .unwrap_err();
    assert_eq!(kind(&e), "invalid", "{e}");
    let e = s
        .register_csv("p2", people_csv(), Registration::public())
        .await
        .unwrap_err();
    assert_eq!(kind(&e), "policy", "{e}");
}

/// A directory of CSV files is CSV; an empty file is refused with what to do.
#[tokio::test]
async fn csv_directories_and_empty_files() {
    let dir = temp_dir("csvdir");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(people_csv(), data.join("a.csv")).unwrap();
    assert!(!dpfusion::owner::is_parquet(&data));
    let s = session(&dir, 1.0).await;
    s.register_csv("d", &data, Registration::private())
        .await
        .unwrap();
    s.sql("SELECT dp_count(age, 0.1) FROM d").await.unwrap();
    let empty = dir.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let e = s
        .register_csv("e", &empty, Registration::private())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no columns"), "{e}");
}

/// Error bars (`_ci` variants): the charge in the ledger is the base call's, GROUP BY with
/// partition selection and field access above the aggregate pass the guard, and the value lies
/// in its interval.
#[tokio::test]
async fn ci_variants_cost_the_base_call_and_read_fields() {
    let (s, _dir) = guard_session().await;
    let charge = |s: &PrivateSession| {
        let l = s.ledger().unwrap();
        let t = &l.last().unwrap().tables[0];
        (t.epsilon, t.delta, t.events.clone())
    };
    for (base, ci) in [
        (
            "SELECT dp_mean(age, 0, 100, 0.5) FROM people",
            "SELECT dp_mean_ci(age, 0, 100, 0.5, confidence => 0.9)['lower'] FROM people",
        ),
        (
            "SELECT dp_count(age, 0.3, 1e-6) FROM people",
            "SELECT r['upper'] - r['lower'] FROM (SELECT dp_count_ci(age, 0.3, 1e-6) AS r FROM people)",
        ),
        (
            "SELECT dept, dp_sum(salary, 0, 200000, 0.5) FROM people GROUP BY dept",
            "SELECT dept, dp_sum_ci(salary, 0, 200000, 0.5)['value'] FROM people GROUP BY dept",
        ),
        (
            "SELECT dept, dp_mean(salary, 0, 200000, 0.5) FROM staff GROUP BY dept",
            "SELECT dept, dp_mean_ci(salary, 0, 200000, 0.5) AS r FROM staff GROUP BY dept",
        ),
    ] {
        s.sql(base).await.unwrap_or_else(|e| panic!("{base}: {e}"));
        let b = charge(&s);
        s.sql(ci).await.unwrap_or_else(|e| panic!("{ci}: {e}"));
        assert_eq!(charge(&s), b, "{ci}");
    }
    // lower ≤ value ≤ upper for a mean, whose value is clamped into [lower, upper] as well.
    let r = s
        .sql(
            "SELECT r['lower'], r['value'], r['upper'], r['stddev'] \
             FROM (SELECT dp_mean_ci(age, 0, 100, 1.0) AS r FROM people)",
        )
        .await
        .unwrap();
    let col = |i: usize| {
        r.batches[0]
            .column(i)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap()
            .value(0)
    };
    assert!(0.0 <= col(0) && col(0) <= col(1) && col(1) <= col(2) && col(2) <= 100.0);
    assert!(col(3) > 0.0);
}

/// Round 46, F1: a session planned with the policy it registered, while another process (here
/// a second session on the same ledger) recorded a stricter one: public → private, row → unit,
/// fewer public columns. The old session's next statement that reads the table is refused:
/// nothing charged, no scan (also of a join's public side, read while the plan is checked). A
/// fresh session gets the new policy.
#[tokio::test]
async fn a_policy_changed_by_another_session_refuses_the_old_sessions_statements() {
    let dir = temp_dir("stale-policy");
    let data = temp_dir("stale-policy-data");
    for t in ["t", "u", "v", "w"] {
        std::fs::copy(people_csv(), data.join(format!("{t}.csv"))).unwrap();
    }
    let csv = |t: &str| data.join(format!("{t}.csv"));
    let a = session(&dir, 10.0).await;
    let b = session(&dir, 10.0).await;
    a.register_csv("t", csv("t"), Registration::public())
        .await
        .unwrap();
    a.register_csv("u", csv("u"), Registration::private())
        .await
        .unwrap();
    a.register_csv(
        "v",
        csv("v"),
        Registration::private().public_columns(["dept", "remote"]),
    )
    .await
    .unwrap();
    a.register_csv("w", csv("w"), Registration::private())
        .await
        .unwrap();
    a.sql("SELECT id FROM t LIMIT 1").await.unwrap();
    let t_scans = a.scans("t");
    // The other session records stricter policies (no relaxation needed: nothing is charged).
    b.register_csv("t", csv("t"), Registration::private())
        .await
        .unwrap();
    b.register_csv("u", csv("u"), Registration::private().privacy_unit("id"))
        .await
        .unwrap();
    b.register_csv(
        "v",
        csv("v"),
        Registration::private().public_columns(["dept"]),
    )
    .await
    .unwrap();
    let refused = |r: datafusion::common::Result<dpfusion::QueryResult>, what: &str| {
        let e = r.expect_err(what);
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{what}: {e}"
        );
        let m = e.to_string();
        assert!(m.contains("changed by another process"), "{what}: {m}");
        assert!(m.contains("Nothing was charged"), "{what}: {m}");
        assert!(m.contains("restart the session"), "{what}: {m}");
        m
    };
    let m = refused(a.sql("SELECT id, salary FROM t LIMIT 3").await, "raw rows");
    assert!(m.contains("visibility public → private"), "{m}");
    refused(
        a.sql("SELECT dp_count(w.salary, 0.5) AS n FROM w JOIN t ON w.id = t.id")
            .await,
        "a join's public side",
    );
    assert_eq!(a.scans("t"), t_scans, "t was not read");
    let m = refused(
        a.sql("SELECT dp_count(salary, 0.5) AS n FROM u").await,
        "row → unit",
    );
    assert!(m.contains("privacy unit: row → id"), "{m}");
    let m = refused(
        a.sql("SELECT remote, dp_count(salary, 0.5) AS n FROM v GROUP BY remote")
            .await,
        "fewer public columns",
    );
    assert!(m.contains("public columns [dept, remote] → [dept]"), "{m}");
    refused(
        a.sql("EXPLAIN PRIVACY SELECT dp_count(salary, 0.5) FROM u")
            .await,
        "explain",
    );
    assert_eq!(
        a.scans("u") + a.scans("v") + a.scans("w"),
        0,
        "nothing read"
    );
    assert!(a.ledger().unwrap().is_empty(), "nothing charged");
    // What the change does not touch still runs in the old session.
    a.sql("SELECT dp_count(salary, 0.5) AS n FROM w")
        .await
        .unwrap();
    // A fresh session gets the new policies: the old ones are refused as weaker.
    let c = session(&dir, 10.0).await;
    assert!(
        c.register_csv("u", csv("u"), Registration::private())
            .await
            .is_err(),
        "u has a unit now"
    );
    let p = c
        .register_csv("u", csv("u"), Registration::private().privacy_unit("id"))
        .await
        .unwrap();
    assert_eq!(p.unit.map(|u| u.column), Some("id".to_string()));
    let r = c
        .sql("SELECT dp_count(salary, 0.5) AS n FROM u")
        .await
        .unwrap();
    assert!(r.receipt.is_some());
    assert!(
        c.register_csv("t", csv("t"), Registration::public())
            .await
            .is_err(),
        "t is private now"
    );
}

/// Round 46, F4: the charge's line is durable and the sidecar cannot be written after it: the
/// statement gets the fixed message of a failed admitted query (its charge stands, no path),
/// and the charge is in the ledger.
#[tokio::test]
async fn a_seal_that_fails_after_the_charge_reaches_the_analyst_as_a_fixed_message() {
    let dir = temp_dir("unsealed");
    let s = session(&dir, 10.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let ledger = dir.join("ledger.jsonl");
    let blocker = dir.join("ledger.jsonl.head.tmp");
    std::fs::create_dir_all(blocker.join("x")).unwrap();
    let e = s
        .sql_as("alice", "SELECT dp_count(salary, 0.5) AS n FROM people")
        .await
        .expect_err("the sidecar cannot be written");
    assert!(
        matches!(
            dpfusion::Error::of(&e),
            Some(dpfusion::Error::ExecutionFailed)
        ),
        "{e}"
    );
    let m = e.to_string();
    assert!(m.contains("charge stands"), "{m}");
    assert!(!m.contains(&*dir.to_string_lossy()), "no path: {m}");
    assert!(!m.contains("ledger.jsonl"), "no path: {m}");
    std::fs::remove_dir_all(&blocker).unwrap();
    drop(s);
    let again = session(&dir, 10.0).await;
    let charges = again.ledger().unwrap();
    assert_eq!(charges.len(), 1, "the charge stands");
    assert_eq!(charges[0].analyst.as_deref(), Some("alice"));
    assert!(ledger.exists());
}

/// Round 46, F1 of the review of its fixes: a session serves a directory as public; another
/// process of the owner (here a second session on the same ledger) registers a file inside it
/// as private under its own key, which its registration accepts (it does not know the public
/// table). The first session kept printing that file's rows; now the public table is refused at
/// its next statement, for the owner and for an analyst, naming tables and no path, with
/// nothing read.
#[tokio::test]
async fn a_public_directory_is_refused_once_another_process_makes_a_file_in_it_private() {
    let dir = temp_dir("files-now-private");
    let data = temp_dir("files-now-private-data");
    for t in ["a", "b"] {
        std::fs::copy(people_csv(), data.join(format!("{t}.csv"))).unwrap();
    }
    let a = session(&dir, 10.0).await;
    let b = session(&dir, 10.0).await;
    a.register_csv("d", &*data, Registration::public())
        .await
        .unwrap();
    let r = a.sql("SELECT count(*) AS n FROM d").await.unwrap();
    assert_eq!(f64_value(&r), 400.0);
    b.register_csv("a", data.join("a.csv"), Registration::private())
        .await
        .expect("another key: accepted");
    let scans = a.scans("d");
    for r in [
        a.sql("SELECT id, salary FROM d LIMIT 3").await,
        a.sql_as("alice", "SELECT count(*) FROM d").await,
    ] {
        let e = r.expect_err("d holds a private file now");
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains(
                "public table 'd' reads files that the ledger now holds as files of \
                 private table 'a'"
            ),
            "{m}"
        );
        assert!(m.contains("by another process"), "{m}");
        assert!(m.contains("Nothing was charged"), "{m}");
        assert!(!m.contains(&*data.to_string_lossy()), "no path: {m}");
    }
    assert_eq!(a.scans("d"), scans, "d was not read");
    // A fresh session refuses the public registration, as before.
    let c = session(&dir, 10.0).await;
    assert!(
        c.register_csv("d", &*data, Registration::public())
            .await
            .is_err()
    );
}

/// Round 46, F2 of the review of its fixes: one file under two names, the second with a
/// privacy unit (a tightening the ledger records) while the first kept planning row-level
/// counts; a statement reading both was charged under the unit policy only. The second
/// registration is refused now, nothing recorded, saying what to do; under one policy the two
/// names are one table and run together.
#[tokio::test]
async fn one_file_under_two_names_has_one_policy_in_a_session() {
    let dir = temp_dir("two-names");
    let s = session(&dir, 10.0).await;
    s.register_csv("t1", people_csv(), Registration::private())
        .await
        .unwrap();
    let e = s
        .register_csv(
            "t2",
            people_csv(),
            Registration::private().privacy_unit("id"),
        )
        .await
        .expect_err("t1 serves the file row-level");
    assert!(
        matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Policy(_))),
        "{e}"
    );
    let m = e.to_string();
    assert!(m.contains("as table 't1'"), "{m}");
    assert!(m.contains("privacy unit: row → id"), "{m}");
    assert!(m.contains("Register the file under one name"), "{m}");
    // Nothing recorded: a fresh session registers the file row-level as before.
    let fresh = session(&dir, 10.0).await;
    let p = fresh
        .register_csv("t1", people_csv(), Registration::private())
        .await
        .unwrap();
    assert!(p.unit.is_none());
    drop(fresh);
    s.register_csv("t2", people_csv(), Registration::private())
        .await
        .unwrap();
    let r = s
        .sql(
            "SELECT (SELECT dp_count(salary, 0.5) FROM t2) AS a, \
             (SELECT dp_count(salary, 0.5) FROM t1) AS b",
        )
        .await
        .unwrap();
    assert!(r.receipt.is_some());
}

/// Round 46, F7 of the review of its fixes: the ledger moved away under a running session
/// (public statements check it too since round 46). An analyst's statement gets one fixed
/// message without the owner's paths, whatever it is (public, private, EXPLAIN PRIVACY,
/// dp_ledger()); the owner's own statement keeps the detail.
#[tokio::test]
async fn a_ledger_error_reaches_an_analyst_without_the_owners_paths() {
    let dir = temp_dir("ledger-unavailable");
    let s = session(&dir, 10.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let public = dir.join("public.csv");
    std::fs::copy(people_csv(), &public).unwrap();
    s.register_csv("pub", &public, Registration::public())
        .await
        .unwrap();
    s.sql_as("alice", "SELECT count(*) FROM pub").await.unwrap();
    let ledger = dir.join("ledger.jsonl");
    std::fs::rename(&ledger, dir.join("moved.jsonl")).unwrap();
    for q in [
        "SELECT count(*) FROM pub",
        "SELECT dp_count(salary, 0.5) AS n FROM people",
        "EXPLAIN PRIVACY SELECT dp_count(salary, 0.5) AS n FROM people",
        "SELECT * FROM dp_ledger()",
    ] {
        let e = s.sql_as("alice", q).await.expect_err(q);
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{q}: {e}"
        );
        let m = e.to_string();
        assert!(m.contains(dpfusion::error::LEDGER_UNAVAILABLE), "{q}: {m}");
        assert!(!m.contains(&*dir.to_string_lossy()), "{q}: {m}");
        assert!(!m.contains("ledger.jsonl"), "{q}: {m}");
    }
    // The owner's own process (the command line, the Rust API) gets the detail.
    let e = s
        .sql("SELECT count(*) FROM pub")
        .await
        .expect_err("the ledger is gone");
    let m = e.to_string();
    assert!(m.contains("replaced, moved or deleted"), "{m}");
    assert!(m.contains("ledger.jsonl"), "{m}");
    assert!(s.ledger().is_err());
}

/// Round 47 (owner review, F1): `SessionOptions` built through the Rust API cannot carry a
/// `default_delta` outside (0, 1), a memory limit or target partitions of 0: the session does
/// not open, and the error names the setting, the value and the valid range.
#[tokio::test]
async fn session_options_out_of_range_are_refused_when_opened() {
    let dir = temp_dir("bad-options");
    let base = || SessionOptions::default().with_ledger(dir.join("ledger.jsonl"));
    let mut cases = Vec::new();
    for d in [f64::NAN, -1.0, 0.0, 1.0, f64::INFINITY] {
        let mut o = base();
        o.default_delta = d;
        cases.push((
            o,
            "SessionOptions: default_delta must be a number in the open interval (0, 1)",
        ));
    }
    cases.push((
        base().with_memory_limit(0),
        "SessionOptions: memory_limit must be at least 1 byte, got 0",
    ));
    cases.push((
        base().with_target_partitions(0),
        "SessionOptions: target_partitions must be at least 1, got 0",
    ));
    for (o, want) in cases {
        let e = PrivateSession::open(o).await.unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let mut o = base().with_memory_limit(1 << 20).with_target_partitions(1);
    o.default_delta = 1e-8;
    PrivateSession::open(o).await.unwrap();
}

/// Round 47 (owner review, F2): default-deny for DESCRIBE. `DESCRIBE <query>` was answered
/// with the query's result schema, private columns and a non-DP aggregate included, without the
/// guard; it is refused, typed `Refused`, saying to describe a table. `DESCRIBE <table>` works
/// on a private table as before, and neither charges anything.
#[tokio::test]
async fn describe_takes_a_table_and_refuses_a_query() {
    let (s, _dir) = guard_session().await;
    for q in [
        "DESCRIBE SELECT salary, dept, (SELECT max(salary) FROM people) AS m FROM people \
         WHERE salary > 100000",
        "desc select age from people",
        "DESCRIBE WITH x AS (SELECT salary FROM people) SELECT * FROM x",
        "DESCRIBE SELECT 1",
        "EXPLAIN PRIVACY DESCRIBE SELECT salary FROM people",
    ] {
        let e = s.sql(q).await.expect_err(q);
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{q}: {e}"
        );
        let m = e.to_string();
        assert!(m.contains("DESCRIBE takes a table name"), "{q}: {m}");
    }
    for q in ["DESCRIBE people", "DESC people", "describe depts"] {
        let r = s.sql(q).await.expect(q);
        assert!(r.receipt.is_none(), "{q}");
        assert!(
            r.batches.iter().map(|b| b.num_rows()).sum::<usize>() >= 1,
            "{q}"
        );
    }
    assert!(s.ledger().unwrap().is_empty());
}

/// The backticked `name => value` of a refusal's fix (the first after "Fix:").
fn suggested_argument(message: &str) -> String {
    let fix = &message[message.find("Fix:").expect("a fix")..];
    fix.split('`')
        .skip(1)
        .step_by(2)
        .find(|s| s.contains("=>"))
        .unwrap_or_else(|| panic!("no argument in {message}"))
        .to_string()
}

/// Round 47 (review newuser, 5): a table whose filter refuses a call's mechanism names, as the
/// analyst's fix, an argument the refused function has. Followed as written it is admitted:
/// independent DP-SGD on a zcdp and a gdp table (`noise => 'mf'`, never `mechanism`, which
/// DP-SGD does not have), a Laplace count on a gdp table (`mechanism => 'gaussian'`).
#[tokio::test]
async fn a_mechanism_refusals_fix_is_an_argument_the_function_has_and_works() {
    let dir = temp_dir("mechanism-fix");
    let s = session(&dir, 100.0).await;
    for (name, filter) in [
        ("pz", dpfusion::session::FilterKind::Zcdp),
        ("pg", dpfusion::session::FilterKind::Gdp),
    ] {
        let file = dir.join(format!("{name}.csv"));
        std::fs::copy(people_csv(), &file).unwrap();
        s.register_csv(name, &file, Registration::private().filter(filter))
            .await
            .unwrap();
    }
    let cases = [
        (
            "pz",
            "dp_linreg_sgd(salary, [age], epsilon => 1",
            "noise => 'mf'",
        ),
        (
            "pg",
            "dp_linreg_sgd(salary, [age], epsilon => 1",
            "noise => 'mf'",
        ),
        (
            "pg",
            "dp_count(id, epsilon => 0.5, mechanism => 'laplace'",
            "mechanism => 'gaussian'",
        ),
    ];
    for (table, call, want) in cases {
        let q = |c: String| format!("SELECT {c}) AS r FROM {table}");
        let e = s.sql(&q(call.to_string())).await.expect_err(call);
        let m = e.to_string();
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{m}"
        );
        let arg = suggested_argument(&m);
        assert_eq!(arg, want, "{m}");
        // Followed as written: the refused argument replaced, or the suggested one added.
        let fixed = match call.find(", mechanism =>") {
            Some(i) => format!("{}, {arg}", &call[..i]),
            None => format!("{call}, {arg}"),
        };
        let r = s.sql(&q(fixed.clone())).await.expect(&fixed);
        let receipt = r.receipt.expect("charged");
        assert!(
            receipt.tables[0].requests[0].mechanism.contains("gaussian"),
            "{fixed}: {:?}",
            receipt.tables[0].requests
        );
    }
}

/// Round 47 (review newuser, 6): the δ refusal of a GROUP BY's partition selection suggests a
/// `delta =>` that, written, gets the selection δ the message describes. With 5e-8 left the
/// largest is 1e-7, the session's default, which counts as not written (the selection would
/// drop to the table's default cap, 1e-9); the fix is just below it, and the selection runs at
/// it.
#[tokio::test]
async fn the_delta_refusals_fix_gets_the_selection_it_describes() {
    let dir = temp_dir("delta-fix");
    let s = session(&dir, 100.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let q = |d: &str| {
        format!(
            "SELECT dept, dp_count(id, epsilon => 1, delta => {d}) AS n FROM people GROUP BY dept"
        )
    };
    // δ_sel = 5e-7: a selection at δ 9e-7 spends 4.5e-7 of it.
    s.sql(&q("9e-7")).await.unwrap();
    let m = s.sql(&q("2e-7")).await.expect_err("5e-8 left").to_string();
    assert!(m.contains("just below the default 1e-7"), "{m}");
    let d = m
        .split("lower `delta =>` to ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .unwrap_or_else(|| panic!("no delta in {m}"));
    assert_eq!(d, "9.99999e-8", "{m}");
    let r = s.sql(&q(d)).await.unwrap();
    let receipt = r.receipt.expect("charged");
    let sel = receipt.tables[0]
        .requests
        .iter()
        .find(|r| r.function == "partition_selection")
        .expect("a selection");
    assert_eq!(sel.delta, Some(9.99999e-8), "{sel:?}");
}

/// Round 49 (review "physical", F2): physical planning ran after admission, so a checked query
/// the physical planner rejects (a placeholder in the released columns, which the guard lets
/// through as post-processing) was charged and then failed with the fixed message ("Its charge
/// stands"). It is planned before admission now: refused, typed, with what to do, and nothing
/// charged (ledger, spent ε, query count); a query that plans is still charged once and
/// released.
#[tokio::test]
async fn a_checked_query_the_physical_planner_refuses_is_refused_and_charges_nothing() {
    use dpfusion::Error;
    let dir = temp_dir("unplannable");
    let s = session(&dir, 10.0).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let spent = |s: &PrivateSession| {
        let row = s.budget().into_iter().find(|r| r.name == "people").unwrap();
        (row.spent, row.queries, row.native.used)
    };
    let before = spent(&s);
    for sql in [
        "SELECT dp_count(salary, 1.0) AS n, $1 AS p FROM people",
        "SELECT dept, dp_count(salary, 1.0) AS n, $1 AS p FROM people GROUP BY dept",
    ] {
        // The guard passes it: it plans and checks.
        s.check(sql).await.expect(sql);
        let e = s.sql(sql).await.expect_err(sql);
        assert!(
            matches!(Error::of(&e), Some(Error::Refused(_))),
            "{sql}: {e}"
        );
        let m = e.to_string();
        assert!(m.contains("could not be planned"), "{m}");
        assert!(m.contains("Nothing was charged"), "{m}");
        assert!(m.contains("give every parameter a value"), "{m}");
        assert!(!m.contains("charge stands"), "{m}");
        assert!(s.ledger().unwrap().is_empty(), "{sql}: nothing charged");
        assert_eq!(spent(&s), before, "{sql}: nothing spent");
    }
    let r = s
        .sql("SELECT dp_count(salary, 1.0) AS n, 1 AS p FROM people")
        .await
        .unwrap();
    assert!(r.receipt.is_some(), "charged");
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(s.ledger().unwrap().len(), 1, "charged once");
    assert_eq!(spent(&s).1, before.1 + 1);
}

/// Round 49 (review "physical", F1): at `target_partitions = 16`, a projection that computes
/// over the query's own ORDER BY (kept by the guard below it, and pinned) got a round-robin
/// repartition under it, and the rows came back in the order the threads finished (descents at
/// batch boundaries, another order in another run). They come back in the ORDER BY's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_by_below_a_computing_projection_orders_the_output_at_16_partitions() {
    let dir = temp_dir("order-16");
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(10.0, 1e-6)
            .with_target_partitions(16),
    )
    .await
    .unwrap();
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let sql = "SELECT n, value * 2 AS w, upper(lower(upper(lower(concat(CAST(value AS VARCHAR), \
               'abcdefghijklmnopqrstuvwxyz'))))) AS h \
               FROM (SELECT r.n, v.value \
                     FROM (SELECT dp_count(salary, 0.001) AS n FROM people) r \
                     CROSS JOIN range(200000) v \
                     ORDER BY v.value) s";
    for _ in 0..2 {
        let r = s.sql(sql).await.unwrap();
        let w: Vec<i64> = r
            .batches
            .iter()
            .flat_map(|b| {
                b.column(1)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        // Compared by position, not printed whole (200,000 values).
        let out_of_place = w
            .iter()
            .zip((0..200_000).map(|v| v * 2))
            .position(|(got, want)| *got != want);
        assert_eq!((w.len(), out_of_place), (200_000, None));
    }
}

/// What has been charged so far: the ledger's charges and `people`'s spent ε and query count
/// (SHOW BUDGET's row).
fn charged(s: &PrivateSession) -> (usize, f64, u64) {
    let row = s.budget().into_iter().find(|r| r.name == "people").unwrap();
    (s.ledger().unwrap().len(), row.spent, row.queries)
}

/// The names of the session's tables (SHOW TABLES, `\d`).
fn table_names(s: &PrivateSession) -> Vec<String> {
    s.tables().into_iter().map(|(n, _, _)| n).collect()
}

fn assert_refused(e: &datafusion::error::DataFusionError, sql: &str) -> String {
    assert!(
        matches!(dpfusion::Error::of(e), Some(dpfusion::Error::Refused(_))),
        "{sql}: {e}"
    );
    e.to_string()
}

/// A session over `people` (private, ε = 10) whose analyst may register the files below
/// `dir/pub`, which holds `depts.csv`.
async fn ddl_session(tag: &str) -> (PrivateSession, TestPath) {
    let dir = temp_dir(tag);
    let public = dir.join("pub");
    std::fs::create_dir_all(&public).unwrap();
    std::fs::write(public.join("depts.csv"), "dept,floor\neng,1\nops,2\n").unwrap();
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(10.0, 1e-6)
            .with_target_partitions(2)
            .with_analyst_files(dpfusion::AnalystFiles::Under(vec![public])),
    )
    .await
    .unwrap();
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    (s, dir)
}

/// Round 50 (review "settings" F1): `CREATE TABLE … AS <DP query>` was charged, and only then
/// was its table refused (a NULL-typed column, with the owner's message about files and the
/// catalog) or installed unreadable (two columns `n`: every later query failed). Both are
/// checked on the checked plan's schema before admission: refused, worded for the statement,
/// nothing charged, no table; written as the message says, it is charged once and readable.
#[tokio::test]
async fn r50_ctas_checks_its_table_before_the_charge() {
    let (s, _dir) = ddl_session("r50-ctas-checks").await;
    let before = charged(&s);
    for (sql, says) in [
        (
            "CREATE TABLE r AS SELECT dp_count(salary, epsilon => 1) AS n, NULL AS z FROM people",
            "give column z a type: CAST(NULL AS DOUBLE)",
        ),
        (
            "CREATE TABLE r AS SELECT a.n, b.n FROM (SELECT dp_count(salary, epsilon => 1) AS n \
             FROM people) a CROSS JOIN (SELECT 1 AS n) b",
            "name the columns apart: … AS n2",
        ),
        (
            "CREATE TABLE r AS WITH p AS (SELECT 'eng' AS dept) SELECT s.dept, p.dept, \
             dp_count(s.salary, epsilon => 1) AS n FROM people s JOIN p ON s.dept = p.dept \
             GROUP BY s.dept, p.dept",
            "name the columns apart: … AS dept2",
        ),
    ] {
        let e = s.sql(sql).await.expect_err(sql);
        let m = assert_refused(&e, sql);
        assert!(m.contains(says), "{sql}: {m}");
        assert!(m.contains("Nothing was charged"), "{sql}: {m}");
        assert!(!m.contains("catalog"), "{sql}: {m}");
        assert_eq!(charged(&s), before, "{sql}: nothing charged");
        assert!(!table_names(&s).contains(&"r".to_string()), "{sql}");
        s.sql("SELECT * FROM r").await.expect_err("no table r");
    }
    let r = s
        .sql(
            "CREATE TABLE r AS SELECT dp_count(salary, epsilon => 1) AS n, \
             CAST(NULL AS DOUBLE) AS z FROM people",
        )
        .await
        .unwrap();
    assert!(r.receipt.is_some(), "charged");
    assert_eq!(charged(&s).0, before.0 + 1, "charged once");
    let r = s.sql("SELECT n, z FROM r").await.unwrap();
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
}

/// Round 50 (review "settings" F2): `CREATE TABLE IF NOT EXISTS r AS <DP query>` over an
/// existing `r` ran and charged the query again and replaced `r`, and a plain `CREATE TABLE r
/// AS …` did the same. Now IF NOT EXISTS does nothing (nothing planned, read or charged), a
/// plain CREATE is refused with what to write (nothing charged), OR REPLACE replaces (charged).
/// CREATE EXTERNAL TABLE follows the same rules.
#[tokio::test]
async fn r50_create_table_if_not_exists_charges_nothing_when_it_exists() {
    let (s, dir) = ddl_session("r50-ctas-exists").await;
    let q = "SELECT dp_count(salary, epsilon => 0.5) AS n FROM people";
    s.sql(&format!("CREATE TABLE r AS {q}")).await.unwrap();
    let once = charged(&s);
    assert_eq!(once.0, 1);
    let kept = f64_value(&s.sql("SELECT n FROM r").await.unwrap());

    let r = s
        .sql(&format!("CREATE TABLE IF NOT EXISTS r AS {q}"))
        .await
        .unwrap();
    assert!(r.receipt.is_none(), "nothing charged");
    assert_eq!(charged(&s), once, "IF NOT EXISTS over r: nothing charged");
    assert_eq!(s.scans("people"), 1, "nor read");
    assert_eq!(f64_value(&s.sql("SELECT n FROM r").await.unwrap()), kept);

    let sql = format!("CREATE TABLE r AS {q}");
    let m = assert_refused(&s.sql(&sql).await.expect_err(&sql), &sql);
    assert!(m.contains("DROP TABLE r"), "{m}");
    assert!(m.contains("CREATE OR REPLACE TABLE r"), "{m}");
    assert!(m.contains("Nothing was charged"), "{m}");
    assert_eq!(charged(&s), once, "a refused CREATE TABLE: nothing charged");
    assert_eq!(f64_value(&s.sql("SELECT n FROM r").await.unwrap()), kept);

    let r = s
        .sql(
            "CREATE OR REPLACE TABLE r AS SELECT dp_count(salary, epsilon => 0.5) AS m FROM people",
        )
        .await
        .unwrap();
    assert!(r.receipt.is_some());
    assert_eq!(charged(&s).0, 2, "OR REPLACE: charged and replaced");
    s.sql("SELECT m FROM r").await.unwrap();

    // Public data: the first table is kept.
    s.sql("CREATE TABLE IF NOT EXISTS r2 AS SELECT 1 AS a")
        .await
        .unwrap();
    s.sql("CREATE TABLE IF NOT EXISTS r2 AS SELECT 2 AS a")
        .await
        .unwrap();
    assert_eq!(f64_value(&s.sql("SELECT a FROM r2").await.unwrap()), 1.0);

    // CREATE EXTERNAL TABLE: the same rules, and a CTAS over an external table too.
    let location = dir.join("pub").join("depts.csv");
    let ext = |how: &str| {
        format!(
            "CREATE {how} STORED AS CSV LOCATION '{}'",
            location.display()
        )
    };
    s.sql(&ext("EXTERNAL TABLE e")).await.unwrap();
    let sql = ext("EXTERNAL TABLE e");
    let m = assert_refused(&s.sql(&sql).await.expect_err(&sql), &sql);
    assert!(m.contains("DROP TABLE e"), "{m}");
    assert!(m.contains("CREATE OR REPLACE EXTERNAL TABLE e"), "{m}");
    let r = s.sql(&ext("EXTERNAL TABLE IF NOT EXISTS e")).await.unwrap();
    assert!(
        r.batches.is_empty(),
        "IF NOT EXISTS over e: nothing registered"
    );
    s.sql(&ext("OR REPLACE EXTERNAL TABLE e")).await.unwrap();
    s.sql(&format!("CREATE TABLE IF NOT EXISTS e AS {q}"))
        .await
        .unwrap();
    assert_eq!(
        f64_value(&s.sql("SELECT count(*) FROM e").await.unwrap()),
        2.0
    );
    assert_eq!(charged(&s).0, 2, "nothing charged over e");
}

/// Round 50 (review "settings" F3): `DROP TABLE IF EXISTS nosuch.r` dropped nothing in
/// DataFusion, but the session forgot `r` (SHOW TABLES, COPY's check of registered files) while
/// queries still read it. A qualified name is refused, as in CREATE EXTERNAL TABLE (and in
/// CREATE TABLE, which installed `x.r` as `r`); a DROP forgets a table only when it was dropped.
#[tokio::test]
async fn r50_drop_table_takes_a_bare_name() {
    let (s, dir) = ddl_session("r50-drop-bare").await;
    s.sql("CREATE TABLE r AS SELECT dp_count(salary, epsilon => 0.1) AS n FROM people")
        .await
        .unwrap();
    let once = charged(&s);
    for sql in [
        "DROP TABLE IF EXISTS nosuch.r",
        "DROP TABLE public.r",
        "DROP TABLE datafusion.public.r",
        "CREATE TABLE nosuch.r2 AS SELECT 1 AS a",
        "CREATE TABLE public.r2 AS SELECT dp_count(salary, epsilon => 0.1) AS n FROM people",
    ] {
        let m = assert_refused(&s.sql(sql).await.expect_err(sql), sql);
        assert!(m.contains("give a bare table name"), "{sql}: {m}");
        assert!(
            table_names(&s).contains(&"r".to_string()),
            "{sql}: r is kept"
        );
        assert!(!table_names(&s).contains(&"r2".to_string()), "{sql}");
        s.sql("SELECT n FROM r").await.expect(sql);
        assert_eq!(charged(&s), once, "{sql}: nothing charged");
    }
    s.sql("DROP TABLE r").await.unwrap();
    assert!(!table_names(&s).contains(&"r".to_string()));
    s.sql("SELECT n FROM r").await.expect_err("dropped");
    s.sql("DROP TABLE IF EXISTS r").await.unwrap();
    s.sql("DROP TABLE r").await.expect_err("no table r");

    // An external table dropped: gone from the session, and registered again from scratch.
    let location = dir.join("pub").join("depts.csv");
    let create = format!(
        "CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '{}'",
        location.display()
    );
    s.sql(&create).await.unwrap();
    s.sql("DROP TABLE e").await.unwrap();
    assert!(!table_names(&s).contains(&"e".to_string()));
    s.sql(&create).await.unwrap();
    assert_eq!(
        f64_value(&s.sql("SELECT count(*) FROM e").await.unwrap()),
        2.0
    );
    assert_eq!(charged(&s), once, "nothing charged by any DROP");
}

/// Round 50 (review "settings", naming): `CREATE TABLE "R4" AS …` was installed as `r4`, and
/// `SELECT * FROM "R4"` then found no table. Every table is named in lower case (the data
/// owner's too), so a quoted name that is not is refused, nothing charged, with the name to
/// write; unquoted, `R4` is `r4`.
#[tokio::test]
async fn r50_a_quoted_table_name_that_is_not_lower_case_is_refused() {
    let (s, dir) = ddl_session("r50-quoted-name").await;
    let before = charged(&s);
    let location = dir.join("pub").join("depts.csv");
    for sql in [
        "CREATE TABLE \"R4\" AS SELECT dp_count(salary, epsilon => 1) AS n FROM people".to_string(),
        "CREATE TABLE \"r4X\" AS SELECT 1 AS a".to_string(),
        format!(
            "CREATE EXTERNAL TABLE \"E4\" STORED AS CSV LOCATION '{}'",
            location.display()
        ),
        "DROP TABLE IF EXISTS \"R4\"".to_string(),
    ] {
        let m = assert_refused(&s.sql(&sql).await.expect_err(&sql), &sql);
        assert!(m.contains("lower case"), "{sql}: {m}");
        assert_eq!(charged(&s), before, "{sql}: nothing charged");
        assert_eq!(table_names(&s), vec!["people".to_string()], "{sql}");
    }
    s.sql("CREATE TABLE R4 AS SELECT dp_count(salary, epsilon => 1) AS n FROM people")
        .await
        .unwrap();
    for sql in [
        "SELECT n FROM r4",
        "SELECT n FROM R4",
        "SELECT n FROM \"r4\"",
    ] {
        s.sql(sql).await.expect(sql);
    }
    s.sql("CREATE EXTERNAL TABLE \"e4\" STORED AS CSV LOCATION 'x.csv'")
        .await
        .expect_err("not an allowed file");
    assert_eq!(charged(&s).0, before.0 + 1);
}

/// Round 50 (review "settings", minor): `SET TIME ZONE 'UTC'` answered with DataFusion's debug
/// dump of the statement; every SET variant gets dpfusion's one SET refusal, nothing charged.
/// `SET dpfusion.default_delta = DEFAULT` restores the session's opening δ (it was refused),
/// as DEFAULT restores the tables' own bounds.
#[tokio::test]
async fn r50_every_set_variant_gets_the_one_set_refusal() {
    let (s, _dir) = ddl_session("r50-set").await;
    let before = charged(&s);
    for sql in [
        "SET TIME ZONE 'UTC'",
        "SET ROLE analyst",
        "SET NAMES 'utf8'",
        "SET a = 1, b = 2",
        "SET timezone = 'UTC'",
        "SET datafusion.execution.batch_size = 1 + 1",
    ] {
        let m = assert_refused(&s.sql(sql).await.expect_err(sql), sql);
        assert!(
            m.contains("is not allowed; the settings are dpfusion.default_delta"),
            "{sql}: {m}"
        );
        assert!(
            !m.contains("Span") && !m.contains("not implemented"),
            "{sql}: {m}"
        );
    }
    let m = assert_refused(
        &s.sql("RESET dpfusion.default_delta").await.unwrap_err(),
        "RESET",
    );
    assert!(m.contains("SET dpfusion.default_delta = DEFAULT"), "{m}");
    let opening = s.default_delta();
    s.sql("SET dpfusion.default_delta = 1e-9").await.unwrap();
    assert_eq!(s.default_delta(), 1e-9);
    s.sql("SET dpfusion.default_delta = DEFAULT").await.unwrap();
    assert_eq!(s.default_delta(), opening);
    let e = s
        .sql("SET dpfusion.default_delta = 'none'")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("or DEFAULT"), "{e}");
    assert_eq!(charged(&s), before, "nothing charged");
}
