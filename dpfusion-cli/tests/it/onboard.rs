//! A new user's bad input (issue 33): a header-only CSV, `DESCRIBE`, wrong argument types,
//! advice that names only surfaces that exist, and `HELP`.

use std::sync::Arc;

use crate::common::{people_csv, temp_dir};
use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::{PrivateSession, Registration, SessionOptions};

async fn session(dir: &std::path::Path) -> PrivateSession {
    PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(5.0, 1e-6)
            .with_target_partitions(2),
    )
    .await
    .unwrap()
}

/// The strings of column `col` of a result.
fn column(r: &dpfusion::QueryResult, col: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in &r.batches {
        let a = b
            .column_by_name(col)
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for i in 0..a.len() {
            out.push(a.value(i).to_string());
        }
    }
    out
}

#[tokio::test]
async fn a_header_only_csv_is_refused_until_its_columns_are_declared() {
    let d = temp_dir("header-only");
    let csv = d.join("h.csv");
    std::fs::write(&csv, "age,income\n").unwrap();
    let s = session(&d).await;
    let e = s
        .register_csv("h", &csv, Registration::private())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no type could be inferred for column(s) 'age', 'income'")
            && e.contains("columns = [{ name = \"age\"")
            && e.contains("Registration::schema"),
        "{e}"
    );
    // Nothing was pinned: the same ledger takes the declared schema, and rows appended later
    // read with their types.
    assert!(s.ledger().unwrap().is_empty());
    let schema = Arc::new(Schema::new(vec![
        Field::new("age", DataType::Int64, true),
        Field::new("income", DataType::Float64, true),
    ]));
    s.register_csv("h", &csv, Registration::private().schema(schema))
        .await
        .unwrap();
    let r = s.sql("DESCRIBE h").await.unwrap();
    assert_eq!(column(&r, "data_type"), ["Int64", "Float64"]);
}

#[tokio::test]
async fn describe_shows_the_pinned_schema_of_every_table_and_charges_nothing() {
    let d = temp_dir("describe");
    let s = session(&d).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    s.register_csv("depts", crate::common::depts_csv(), Registration::public())
        .await
        .unwrap();
    let r = s.sql("DESCRIBE people").await.unwrap();
    assert_eq!(
        column(&r, "column_name"),
        ["id", "age", "dept", "salary", "remote"]
    );
    assert_eq!(column(&r, "is_nullable").len(), 5);
    assert!(r.receipt.is_none());
    let r = s.sql("describe depts;").await.unwrap();
    assert_eq!(column(&r, "column_name"), ["dept", "floor"]);
    assert!(s.ledger().unwrap().is_empty());
    assert!(s.sql("DESCRIBE nosuch").await.is_err());
}

#[tokio::test]
async fn a_wrong_argument_type_is_one_sentence_naming_the_argument() {
    let d = temp_dir("argtype");
    let s = session(&d).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    for (sql, arg) in [
        (
            "SELECT dp_mean(salary, 'a', 10, 1.0) FROM people",
            "`lower`",
        ),
        ("SELECT dp_sum(dept, 0, 10, 1.0) FROM people", "`value`"),
        ("SELECT dp_count(age, 'x') FROM people", "`epsilon`"),
    ] {
        let e = s.sql(sql).await.unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Invalid(_))),
            "{m}"
        );
        assert!(m.contains(arg) && m.contains("Usage: dp_"), "{m}");
        for wrapper in [
            "coercion",
            "Error during planning",
            "Execution error",
            "Candidate",
            "neighbours",
        ] {
            assert!(!m.contains(wrapper), "{wrapper} in: {m}");
        }
    }
    assert!(s.ledger().unwrap().is_empty());
}

#[tokio::test]
async fn a_variance_whose_range_overflows_is_refused_with_the_range_that_works() {
    let d = temp_dir("wide");
    let s = session(&d).await;
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    for f in ["dp_variance", "dp_stddev", "dp_variance_ci", "dp_stddev_ci"] {
        let e = s
            .sql(&format!("SELECT {f}(salary, 0, 1e300, 1.0) FROM people"))
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Invalid(_))),
            "{m}"
        );
        assert!(m.contains("upper") && m.contains("6.7e153"), "{f}: {m}");
    }
    assert!(s.ledger().unwrap().is_empty());
    s.sql("SELECT dp_variance(salary, 0, 1e150, 1.0) FROM people")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_mechanism_refusal_advises_the_catalog_key_not_sql() {
    let d = temp_dir("advice");
    let s = session(&d).await;
    // The default filter, gdp, accepts Gaussian mechanisms only; DP-AGD is zCDP.
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    let m = s
        .sql("SELECT dp_logreg_agd(remote, [age], epsilon => 0.5) FROM people")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("filter = \"zcdp\"") && m.contains("--filter zcdp") && !m.contains("dp.filter"),
        "{m}"
    );
}

#[tokio::test]
async fn help_documents_a_function_from_its_declaration() {
    let d = temp_dir("help");
    let s = session(&d).await;
    let r = s.sql("HELP dp_mean").await.unwrap();
    let text = column(&r, "help").join("\n");
    assert!(
        text.starts_with("dp_mean: ")
            && text.contains("dp_mean(value, lower, upper, epsilon[, delta][, mechanism])")
            && !text.contains("neighbour mode"),
        "{text}"
    );
    let all = column(&s.sql("help;").await.unwrap(), "help").join("\n");
    assert!(
        all.contains("dp_quantile") && all.contains("dp_linreg_gd"),
        "{all}"
    );
    assert_eq!(
        s.statement_kind("HELP dp_mean").await.unwrap(),
        dpfusion::session::StatementKind::Describe
    );
}

/// Checks that `html` is well-formed XML (after its doctype): every element closed in order,
/// attributes quoted, `&` only in entities, and returns the element names in document order.
fn well_formed(html: &str) -> Vec<String> {
    let body = html
        .strip_prefix("<!DOCTYPE html>")
        .expect("a doctype first");
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut rest = body;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        for (i, _) in text.match_indices('&') {
            let ent = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].contains(&ent),
                "bare & in text: {ent}"
            );
        }
        assert!(!text.contains('>'), "bare > in text: {text}");
        let gt = rest[lt..].find('>').expect("an unclosed tag") + lt;
        let tag = &rest[lt + 1..gt];
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "misnested </{name}>");
        } else {
            let name = tag
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap()
                .to_string();
            names.push(name.clone());
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &rest[gt + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    names
}

#[tokio::test]
async fn ledger_report_is_one_self_contained_well_formed_page() {
    let d = temp_dir("report");
    let ledger = d.join("ledger.jsonl");
    {
        let s = session(&d).await;
        s.register_csv("people", people_csv(), Registration::private())
            .await
            .unwrap();
        s.sql_as("alice", "SELECT dp_count(id, 0.5) FROM people")
            .await
            .unwrap();
        s.sql_as(
            "bob <b>",
            "SELECT dept, dp_mean(salary, 0, 200000, 0.5) FROM people WHERE age < 40 GROUP BY dept",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = d.join("report.html");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "report"])
        .arg(&ledger)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let html = std::fs::read_to_string(&out).unwrap();
    let names = well_formed(&html);
    for want in ["html", "table", "svg", "path", "circle"] {
        assert!(names.iter().any(|n| n == want), "no <{want}>");
    }
    // Self-contained: nothing is fetched, nothing runs.
    for bad in ["<script", "<link", "<img", "http://", "https://"] {
        let found = html
            .match_indices(bad)
            .any(|(i, _)| !html[..i].ends_with("xmlns=\""));
        assert!(!found, "{bad} in the page");
    }
    // Per table: the budget, the analysts (escaped), the functions, every charge's SQL.
    assert!(html.contains("Table people") && html.contains("budget ε 5 "));
    assert!(html.contains("alice") && html.contains("bob &lt;b&gt;"));
    assert!(html.contains("dp_count") && html.contains("dp_mean"));
    assert!(html.contains("WHERE age &lt; 40"));
    // A ledger that does not verify gets no report.
    let mut text = std::fs::read_to_string(&ledger).unwrap();
    text = text.replacen("alice", "mallory", 1);
    std::fs::write(&ledger, text).unwrap();
    let bad = d.join("bad.html");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "report"])
        .arg(&ledger)
        .args(["-o", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(!bad.exists());
}

/// The README's runnable shell blocks run as written, on the dev binary, and its recorded outputs
/// still match (numbers masked): scripts/readme_check.py.
#[test]
fn readme_examples_run_as_written() {
    let root = crate::common::repo_root().display();
    let o = std::process::Command::new("python3")
        .arg(format!("{root}/scripts/readme_check.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_dpfusion")])
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("block(s) ran"));
}
