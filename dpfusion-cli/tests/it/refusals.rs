//! Refusals are typed where they are decided (issue 31): a refusal from each place that decides
//! one reaches an embedder as `dpfusion::Error::Refused` (never recovered from its text),
//! invalid SQL as `Invalid` and a spent budget as `BudgetExceeded`; none of them charges anything.
//! `serve::refusal_kinds_have_their_wire_codes` sends the same errors through the server's
//! mapping to wire codes.
use datafusion::error::DataFusionError;
use dpfusion::{Error, PrivateSession, Registration, SessionOptions};

use crate::common::{people_csv, temp_dir};

/// The kind of a statement's error, as an embedder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Refused,
    Invalid,
    Budget,
}

/// Statements refused (or invalid) at each place that decides, with the kind each must have.
fn cases() -> Vec<(String, Kind)> {
    // The complexity limits, before parsing: more joins than `MAX_CHAIN`.
    let joins: String = (1..=dpfusion::session::MAX_CHAIN + 1)
        .map(|i| format!(" JOIN people t{i} ON true"))
        .collect();
    let mut cases = vec![(format!("SELECT 1 FROM people t0{joins}"), Kind::Refused)];
    cases.extend(CASES.iter().map(|(s, k)| (s.to_string(), *k)));
    cases
}

const CASES: &[(&str, Kind)] = &[
    // The guard.
    ("SELECT * FROM people", Kind::Refused),
    (
        "EXPLAIN SELECT dp_count(age, 1.0) FROM people",
        Kind::Refused,
    ),
    // DDL, DML and other statements.
    ("CREATE VIEW v AS SELECT 1", Kind::Refused),
    (
        "INSERT INTO people VALUES (1, 2, 'x', 3.0, false)",
        Kind::Refused,
    ),
    ("DROP TABLE people", Kind::Refused),
    ("SET datafusion.execution.batch_size = 10", Kind::Refused),
    ("RESET datafusion.execution.batch_size", Kind::Refused),
    ("START TRANSACTION", Kind::Refused),
    ("COMMIT", Kind::Refused),
    ("ROLLBACK", Kind::Refused),
    // Analyst files and COPY targets (beside the owner's protection code).
    (
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION 'x.csv' OPTIONS ('dp.visibility' 'public')",
        Kind::Refused,
    ),
    (
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION 'x.csv'",
        Kind::Refused,
    ),
    ("COPY (SELECT 1 AS x) TO '../x.csv'", Kind::Refused),
    ("COPY (SELECT 1 AS x) TO 'sub/x.csv'", Kind::Refused),
    // The BigQuery clause: its own refusals, and the session's check of its unit options.
    (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (delta = 1e-6) COUNT(*) FROM people",
        Kind::Refused,
    ),
    (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, privacy_unit_column = id) \
         COUNT(*) FROM people",
        Kind::Refused,
    ),
    // Not refusals: invalid input, and a budget that does not suffice.
    ("SELECT dp_count(nope, 1.0) FROM people", Kind::Invalid),
    ("SELEC 1", Kind::Invalid),
    ("SELECT dp_count(age, 50.0) FROM people", Kind::Budget),
];

/// A session over `people` (private, ε 1) with an output directory, and each case's error.
pub async fn refusals() -> Vec<(String, Kind, DataFusionError)> {
    let dir = temp_dir("refusals");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(1.0, 1e-6)
            .with_output_dir(&out),
    )
    .await
    .unwrap();
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let mut errors = Vec::new();
    for (sql, kind) in cases() {
        let e = s.sql(&sql).await.expect_err(&sql);
        errors.push((sql, kind, e));
    }
    assert!(
        s.ledger().unwrap().is_empty(),
        "a refusal charged something"
    );
    assert_eq!(s.scans("people"), 0, "a refusal read the table");
    errors
}

fn kind_of(e: &DataFusionError) -> Option<Kind> {
    match Error::of(e)? {
        Error::Refused(_) => Some(Kind::Refused),
        Error::Invalid(_) => Some(Kind::Invalid),
        Error::BudgetExceeded { .. } => Some(Kind::Budget),
        _ => None,
    }
}

#[tokio::test]
async fn every_refusal_is_typed_where_it_is_decided() {
    let mut wrong = Vec::new();
    for (sql, kind, e) in refusals().await {
        if kind_of(&e) != Some(kind) {
            wrong.push(format!("{sql}: want {kind:?}, got {e}"));
            continue;
        }
        let m = e.to_string();
        if kind == Kind::Refused {
            assert!(m.contains("dpfusion refused"), "{sql}: {m}");
            // Typed at the site, never a planner error re-wrapped.
            assert!(!m.contains("Error during planning"), "{sql}: {m}");
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn rollback_says_that_nothing_is_undone() {
    let dir = temp_dir("rollback");
    let s = PrivateSession::open(SessionOptions::default().with_ledger(dir.join("ledger.jsonl")))
        .await
        .unwrap();
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    s.sql("SELECT dp_count(age, 0.1) FROM people")
        .await
        .unwrap();
    let e = s.sql("ROLLBACK").await.unwrap_err();
    assert!(
        matches!(Error::of(&e), Some(Error::Refused(m)) if m == dpfusion::session::ROLLBACK_REFUSED),
        "{e}"
    );
    assert!(e.to_string().contains("nothing can be undone"), "{e}");
    // The charge before it stands.
    assert_eq!(s.ledger().unwrap().len(), 1);
}
