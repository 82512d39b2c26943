//! The data owner and the analyst (issue 15): analyst SQL can never register, re-register,
//! re-format or write the owner's files (a private table's files, the ledger, its sidecar, the
//! ledger's directory), under any spelling; policy options are the owner's; the owner's
//! re-registrations keep, tighten, or are refused with the difference unless relaxed with a
//! reason; a tampered ledger does not open. Every refusal leaves the ledger byte for byte as it
//! was and reads nothing.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use dpfusion::accounting::head_path;
use dpfusion::owner::CsvFormat;
use dpfusion::{AnalystFiles, PrivateSession, QueryResult, Registration, SessionOptions};

use crate::common::*;

/// The columns of people.csv, in order.
const PEOPLE_COLUMNS: [&str; 5] = ["id", "age", "dept", "salary", "remote"];

/// A test's files: `dir/ledger/ledger.jsonl`, the private file `dir/d/p.csv` (a copy of
/// people.csv), an empty `dir/other`.
struct Setup {
    dir: crate::common::TestPath,
    ledger: PathBuf,
    d: PathBuf,
    p: PathBuf,
}

fn setup(tag: &str) -> Setup {
    let dir = temp_dir(tag);
    for sub in ["ledger", "d", "other"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let d = dir.join("d");
    let p = d.join("p.csv");
    std::fs::copy(people_csv(), &p).unwrap();
    Setup {
        ledger: dir.join("ledger/ledger.jsonl"),
        dir,
        d,
        p,
    }
}

fn options(st: &Setup, analyst: AnalystFiles) -> SessionOptions {
    SessionOptions::default()
        .with_ledger(&st.ledger)
        .with_default_budget(1.0, 1e-6)
        .with_target_partitions(2)
        .with_analyst_files(analyst)
}

async fn open(st: &Setup, analyst: AnalystFiles) -> PrivateSession {
    PrivateSession::open(options(st, analyst)).await.unwrap()
}

/// A session in which the owner registered `p` private (ε = 10).
async fn owner_session(st: &Setup, analyst: AnalystFiles) -> PrivateSession {
    let s = open(st, analyst).await;
    s.register_csv("p", &st.p, Registration::private().budget(10.0, 1e-6))
        .await
        .unwrap();
    s
}

/// The ledger and its sidecar, byte for byte.
fn snapshot(ledger: &Path) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    (
        std::fs::read(ledger).ok(),
        std::fs::read(head_path(ledger)).ok(),
    )
}

/// Runs `sql`, which must fail with an error containing `needle` and leave the ledger unchanged.
async fn refused(s: &PrivateSession, ledger: &Path, sql: &str, needle: &str) -> String {
    let before = snapshot(ledger);
    let e = match s.sql(sql).await {
        Ok(_) => panic!("not refused: {sql}"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(needle), "{sql}\n  expected {needle:?} in: {e}");
    assert_eq!(snapshot(ledger), before, "{sql} changed the ledger");
    e
}

async fn ok(s: &PrivateSession, sql: &str) -> QueryResult {
    s.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql} failed: {e}"))
}

/// The rows of a result, each column as text.
fn rows(r: &QueryResult) -> Vec<HashMap<String, String>> {
    let mut out = Vec::new();
    for b in &r.batches {
        for i in 0..b.num_rows() {
            let mut row = HashMap::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                row.insert(f.name().clone(), array_value_to_string(c, i).unwrap());
            }
            out.push(row);
        }
    }
    out
}

/// The pinned schema of people.csv as `SHOW TABLES` prints it.
const PEOPLE_SCHEMA: &str = "(id Int64, age Int64, dept Utf8, salary Float64, remote Boolean)";

/// The column names a table is read with in the session, after checking that `SHOW TABLES`
/// shows the same pinned schema (read through the API and `SHOW TABLES`; `DESCRIBE` shows it
/// too, dpfusion-cli/tests/it/onboard.rs).
async fn columns(s: &PrivateSession, table: &str) -> Vec<String> {
    let names: Vec<String> = s
        .tables()
        .into_iter()
        .find(|(n, _, _)| n == table)
        .unwrap_or_else(|| panic!("no table {table}"))
        .2
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let shown = show_table(s, table).await["schema"].clone();
    for n in &names {
        assert!(shown.contains(&format!("{n} ")), "{n} not in {shown}");
    }
    names
}

/// The `SHOW TABLES` row of `table`.
async fn show_table(s: &PrivateSession, table: &str) -> HashMap<String, String> {
    let r = ok(s, "SHOW TABLES").await;
    rows(&r)
        .into_iter()
        .find(|r| r["table"] == table)
        .unwrap_or_else(|| panic!("SHOW TABLES has no row for {table}"))
}

/// `path` as a relative path from the current directory (`../../…/path`), whatever it is.
fn relative_from_cwd(path: &Path) -> String {
    let cwd = std::fs::canonicalize(std::env::current_dir().unwrap()).unwrap();
    let ups = cwd.components().count() - 1;
    let abs = path.to_string_lossy();
    format!("{}{}", "../".repeat(ups), abs.trim_start_matches('/'))
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 1. Every spelling of a private file, with every reading option, is refused.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn every_spelling_of_a_private_file_is_refused_with_every_option() {
    let st = setup("spellings");
    let s = owner_session(&st, AnalystFiles::Anywhere).await;
    let (dir, d, p) = (
        st.dir.to_string_lossy().to_string(),
        st.d.to_string_lossy().to_string(),
        st.p.to_string_lossy().to_string(),
    );
    // Other names of the same file or directory.
    let other = st.dir.join("other");
    symlink(&st.p, &other.join("link.csv"));
    symlink(&st.d, &other.join("dirlink"));
    std::fs::create_dir_all(st.dir.join("hard")).unwrap();
    std::fs::hard_link(&st.p, st.dir.join("hard/h.csv")).unwrap();
    // On Linux an upper-case name is another name: only device and inode tell it is the file.
    std::fs::create_dir_all(st.dir.join("upper")).unwrap();
    std::fs::hard_link(&st.p, st.dir.join("upper/P.CSV")).unwrap();
    let spellings = vec![
        p.clone(),
        format!("file://{p}"),
        format!("FILE://{p}"),
        format!("file://localhost{p}"),
        format!("file:{p}"),
        format!("file://{d}/p%2Ecsv"),
        format!("file://{d}/%70.csv"),
        d.clone(),
        format!("{d}/"),
        format!("{d}//"),
        format!("{d}///"),
        format!("{dir}//d//p.csv"),
        format!("{d}/*.csv"),
        format!("{d}/*"),
        format!("{d}/p.cs?"),
        format!("{d}/[p]*.csv"),
        format!("{dir}/**/p.csv"),
        format!("{dir}/*/p.csv"),
        format!("{d}/../d/p.csv"),
        format!("{dir}/other/../d/p.csv"),
        format!("{dir}/./d/./p.csv"),
        relative_from_cwd(&st.p),
        format!("./{}", relative_from_cwd(&st.p)),
        relative_from_cwd(&st.d) + "/",
        format!("{dir}/other/link.csv"),
        format!("{dir}/other/dirlink"),
        format!("{dir}/other/dirlink/"),
        format!("{dir}/other/dirlink/p.csv"),
        format!("{dir}/other"),
        format!("{dir}/hard/h.csv"),
        format!("{dir}/hard"),
        format!("{dir}/upper/P.CSV"),
        format!("{dir}/upper/*.CSV"),
        format!("{dir}/upper/"),
        dir.clone(),
        format!("{dir}/"),
    ];
    let options = [
        "",
        "OPTIONS ('format.has_header' 'false')",
        "OPTIONS ('format.delimiter' ';')",
        "OPTIONS ('format.comment' 'i')",
        "OPTIONS ('format.null_regex' '^[0-9]+$')",
        "OPTIONS ('schema_infer_max_rec' '1')",
        "OPTIONS ('format.has_header' 'true', 'format.quote' '''')",
    ];
    let before = snapshot(&st.ledger);
    for spelling in &spellings {
        for opts in options {
            let sql = format!("CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{spelling}' {opts}");
            refused(&s, &st.ledger, &sql, "names files of").await;
        }
        // A declared column list (the analyst's own schema over the owner's file).
        let sql = format!("CREATE EXTERNAL TABLE x (a INT) STORED AS CSV LOCATION '{spelling}'");
        refused(&s, &st.ledger, &sql, "names files of").await;
        // Another format over the same bytes.
        let sql = format!("CREATE EXTERNAL TABLE x STORED AS JSON LOCATION '{spelling}'");
        refused(&s, &st.ledger, &sql, "names files of").await;
    }
    // Spellings that name no file: refused too, whatever the reason (a trailing slash after a
    // file name cannot be read; braces are no glob for DataFusion, which finds no file).
    for spelling in [format!("{p}/"), format!("{d}/{{p,q}}.csv")] {
        let sql = format!("CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{spelling}'");
        refused(&s, &st.ledger, &sql, "").await;
    }
    // The ledger, its sidecar and its directory, under any spelling.
    let ledger = st.ledger.to_string_lossy().to_string();
    let ledger_dir = st.ledger.parent().unwrap().to_string_lossy().to_string();
    for spelling in [
        ledger.clone(),
        format!("{ledger}.head"),
        format!("file://{ledger}"),
        ledger_dir.clone(),
        format!("{ledger_dir}/"),
        format!("{ledger_dir}/*.head"),
        format!("{ledger_dir}/../ledger/ledger.jsonl"),
    ] {
        for format in ["CSV", "JSON"] {
            let sql = format!("CREATE EXTERNAL TABLE x STORED AS {format} LOCATION '{spelling}'");
            let e = refused(&s, &st.ledger, &sql, "names files of").await;
            assert!(e.contains("the data owner's"), "{e}");
        }
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("p"), 0, "no refusal read the private table");
    assert!(
        s.tables().iter().all(|(n, _, _)| n != "x"),
        "x never exists"
    );
    // The pinned schema is still the owner's.
    assert_eq!(columns(&s, "p").await, PEOPLE_COLUMNS);
    assert_eq!(show_table(&s, "p").await["schema"], PEOPLE_SCHEMA);
    assert_eq!(show_table(&s, "p").await["visibility"], "private");
    // The refusals are not blanket: a file that is no private table's registers (as public).
    ok(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE depts STORED AS CSV LOCATION '{}'",
            depts_csv().display()
        ),
    )
    .await;
    assert_eq!(show_table(&s, "depts").await["set_by"], "analyst");
    assert_eq!(
        snapshot(&st.ledger),
        before,
        "an analyst table is not in the ledger"
    );
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[tokio::test]
async fn a_new_file_in_a_private_directory_belongs_to_it() {
    let st = setup("private-dir");
    let s = owner_session(&st, AnalystFiles::Anywhere).await;
    let e = st.dir.join("e");
    std::fs::create_dir_all(&e).unwrap();
    std::fs::copy(people_csv(), e.join("q.csv")).unwrap();
    s.register_csv("q", &e, Registration::private().budget(5.0, 1e-6))
        .await
        .unwrap();
    let before = snapshot(&st.ledger);
    // Files written after the registration: a glob that matches only them is refused.
    std::fs::copy(depts_csv(), e.join("new.csv")).unwrap();
    std::fs::create_dir_all(e.join("sub")).unwrap();
    std::fs::copy(depts_csv(), e.join("sub/deeper.csv")).unwrap();
    let es = e.to_string_lossy();
    for location in [
        format!("{es}/new*.csv"),
        format!("{es}/new.csv"),
        format!("{es}/sub/deeper.csv"),
        format!("{es}/sub/"),
        format!("file://{es}/sub/*.csv"),
    ] {
        let sql = format!("CREATE EXTERNAL TABLE y STORED AS CSV LOCATION '{location}'");
        let msg = refused(&s, &st.ledger, &sql, "names files of").await;
        assert!(msg.contains("private table 'q'"), "{msg}");
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("q"), 0);
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 2. Which files analyst SQL may register.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn by_default_analyst_sql_registers_no_file() {
    let st = setup("analyst-none");
    let s = owner_session(&st, AnalystFiles::None).await;
    let before = snapshot(&st.ledger);
    for location in [depts_csv(), st.p.clone(), st.dir.join("no-such-file.csv")] {
        let sql = format!(
            "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{}'",
            location.display()
        );
        let e = refused(&s, &st.ledger, &sql, "analyst_read_dirs").await;
        assert!(e.contains("register no file"), "{e}");
        // Whether the file exists is not the analyst's to learn.
        assert!(!e.contains("No such file"), "{e}");
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("p"), 0);
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[tokio::test]
async fn analyst_files_under_allowed_directories_only_and_rechecked_before_every_scan() {
    let st = setup("analyst-under");
    let public = st.dir.join("public");
    std::fs::create_dir_all(&public).unwrap();
    std::fs::copy(depts_csv(), public.join("depts.csv")).unwrap();
    std::fs::copy(depts_csv(), st.dir.join("other/outside.csv")).unwrap();
    let s = owner_session(&st, AnalystFiles::Under(vec![public.clone()])).await;
    let before = snapshot(&st.ledger);

    // Inside: a public table of the analyst.
    let pubs = public.to_string_lossy();
    ok(
        &s,
        &format!("CREATE EXTERNAL TABLE depts STORED AS CSV LOCATION '{pubs}/depts.csv'"),
    )
    .await;
    let row = show_table(&s, "depts").await;
    assert_eq!(row["set_by"], "analyst");
    assert_eq!(row["visibility"], "public");
    assert_eq!(show_table(&s, "p").await["set_by"], "owner");
    let r = ok(&s, "SELECT count(*) AS c FROM depts").await;
    assert_eq!(rows(&r)[0]["c"], "4");

    // Outside: refused, also through a link inside the directory that leads outside.
    let outside = st.dir.join("other/outside.csv");
    symlink(&outside, &public.join("link-out.csv"));
    for location in [
        outside.to_string_lossy().to_string(),
        format!("{pubs}/../other/outside.csv"),
        format!("{pubs}/link-out.csv"),
        format!("file://{}", outside.display()),
        st.p.to_string_lossy().to_string(),
    ] {
        let sql = format!("CREATE EXTERNAL TABLE o STORED AS CSV LOCATION '{location}'");
        let e = refused(&s, &st.ledger, &sql, "only below").await;
        // Nothing outside the allowed directories is resolved in the message.
        assert!(
            location.contains("outside") || !e.contains("outside.csv"),
            "a link's target is not shown: {e}"
        );
    }

    // A directory that holds such a link is refused as a whole; without it, an analyst table
    // over the whole directory reads freely…
    refused(
        &s,
        &st.ledger,
        &format!("CREATE EXTERNAL TABLE a STORED AS CSV LOCATION '{pubs}/'"),
        "only below",
    )
    .await;
    std::fs::remove_file(public.join("link-out.csv")).unwrap();
    ok(
        &s,
        &format!("CREATE EXTERNAL TABLE a STORED AS CSV LOCATION '{pubs}/'"),
    )
    .await;
    let r = ok(&s, "SELECT count(*) AS c FROM a").await;
    assert_eq!(rows(&r)[0]["c"], "4");
    // …until a hard link to the private file appears in it: the next scan is refused.
    std::fs::hard_link(&st.p, public.join("h.csv")).unwrap();
    refused(
        &s,
        &st.ledger,
        "SELECT count(*) AS c FROM a",
        "names files of",
    )
    .await;
    refused(&s, &st.ledger, "SELECT * FROM a", "names files of").await;
    // A new registration over it is refused too.
    refused(
        &s,
        &st.ledger,
        &format!("CREATE EXTERNAL TABLE a2 STORED AS CSV LOCATION '{pubs}/'"),
        "names files of",
    )
    .await;
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("p"), 0, "the private table was never read");
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 3. Policy options and the owner's table names are not SQL's.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn policy_options_and_owner_table_names_are_refused() {
    let st = setup("dp-options");
    let s = owner_session(&st, AnalystFiles::Anywhere).await;
    let before = snapshot(&st.ledger);
    let depts = depts_csv().to_string_lossy().to_string();
    for (k, v) in [
        ("dp.visibility", "private"),
        ("dp.visibility", "public"),
        ("dp.epsilon", "1000"),
        ("dp.delta", "1e-3"),
        ("dp.neighbours", "replace"),
        ("dp.public_columns", "dept,floor"),
        ("dp.filter", "zcdp"),
        ("dp.delta_share", "0.1"),
        ("DP.Epsilon", "1000"),
        ("Dp.VISIBILITY", "private"),
        ("dp.anything", "x"),
    ] {
        for location in [depts.as_str(), &st.p.to_string_lossy()] {
            let sql = format!(
                "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{location}' \
                 OPTIONS ('format.has_header' 'true', '{k}' '{v}')"
            );
            let e = refused(&s, &st.ledger, &sql, "is a policy option").await;
            assert!(e.contains("catalog"), "says what to do: {e}");
        }
    }
    // The owner's table names cannot be reused, replaced or dropped, in any case.
    for sql in [
        format!("CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '{depts}'"),
        format!("CREATE EXTERNAL TABLE P STORED AS CSV LOCATION '{depts}'"),
        format!("CREATE EXTERNAL TABLE IF NOT EXISTS p STORED AS CSV LOCATION '{depts}'"),
        "CREATE TABLE p AS SELECT 1 AS id".to_string(),
        "CREATE OR REPLACE TABLE p AS SELECT 1 AS id".to_string(),
        "CREATE TABLE IF NOT EXISTS P AS SELECT 1 AS id".to_string(),
        "DROP TABLE p".to_string(),
        "DROP TABLE IF EXISTS P".to_string(),
    ] {
        refused(&s, &st.ledger, &sql, "cannot replace, shadow or drop").await;
    }
    // Nor through a name DataFusion would read again as `schema.table` or trim (round 46:
    // `CREATE TABLE "public.p" AS …` replaced the owner's table): an analyst's table names are
    // plain.
    for sql in [
        "CREATE TABLE \"public.p\" AS SELECT 1 AS id".to_string(),
        "CREATE TABLE \" p\" AS SELECT 1 AS id".to_string(),
        "CREATE TABLE \"datafusion.public.p\" AS SELECT 1 AS id".to_string(),
        format!("CREATE EXTERNAL TABLE \"public.p\" STORED AS CSV LOCATION '{depts}'"),
        "DROP TABLE \"public.p\"".to_string(),
    ] {
        refused(&s, &st.ledger, &sql, "must be letters, digits and '_'").await;
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("p"), 0);
    // The owner's table is still there, private, with its budget.
    let row = show_table(&s, "p").await;
    assert_eq!(
        (row["visibility"].as_str(), row["budget_epsilon"].as_str()),
        ("private", "10.0")
    );
    assert_eq!(columns(&s, "p").await, PEOPLE_COLUMNS);
    assert_eq!(show_table(&s, "p").await["schema"], PEOPLE_SCHEMA);
    ok(&s, "SELECT dp_count(id, 0.5) AS n FROM p").await;
    assert_eq!(s.scans("p"), 1);
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 4. COPY ... TO never writes where it must not.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn copy_to_every_forbidden_place_is_refused() {
    let st = setup("copy");
    let out = st.dir.join("out");
    std::fs::create_dir_all(out.join("sub")).unwrap();
    std::fs::create_dir_all(out.join("sub.d")).unwrap();
    let s = PrivateSession::open(options(&st, AnalystFiles::None).with_output_dir(&out))
        .await
        .unwrap();
    s.register_csv("p", &st.p, Registration::private().budget(10.0, 1e-6))
        .await
        .unwrap();
    // Links inside the output directory that lead to the owner's files.
    symlink(&st.ledger, &out.join("l.jsonl"));
    symlink(&head_path(&st.ledger), &out.join("h.head"));
    symlink(&st.d, &out.join("pd"));
    symlink(st.ledger.parent().unwrap(), &out.join("ld"));
    symlink(&st.p, &out.join("p-link.csv"));
    std::fs::hard_link(&st.p, out.join("hard.csv")).unwrap();
    std::fs::hard_link(&st.ledger, out.join("hard-ledger.jsonl")).unwrap();
    let private_bytes = std::fs::read(&st.p).unwrap();
    let before = snapshot(&st.ledger);
    let ledger = st.ledger.to_string_lossy().to_string();
    let ledger_dir = st.ledger.parent().unwrap().to_string_lossy().to_string();
    let (d, p) = (st.d.to_string_lossy(), st.p.to_string_lossy());
    let outs = out.to_string_lossy();
    // Each target, and what the refusal says.
    let rel = "relative file name inside the output directory";
    let targets = [
        (ledger.clone(), rel),
        ("../ledger/ledger.jsonl".to_string(), rel),
        (format!("{ledger}.head"), rel),
        ("../ledger/ledger.jsonl.head".to_string(), rel),
        (format!("{ledger_dir}/new.csv"), rel),
        ("../ledger/new.csv".to_string(), rel),
        (p.to_string(), rel),
        ("../d/p.csv".to_string(), rel),
        (d.to_string(), rel),
        (format!("{d}/"), rel),
        (format!("{d}/new.csv"), rel),
        ("l.jsonl".to_string(), "symbolic link"),
        ("h.head".to_string(), "symbolic link"),
        ("pd/p.csv".to_string(), "symbolic link"),
        ("pd/new.csv".to_string(), "symbolic link"),
        ("ld/new.csv".to_string(), "symbolic link"),
        ("ld/ledger.jsonl".to_string(), "symbolic link"),
        ("p-link.csv".to_string(), "symbolic link"),
        ("hard.csv".to_string(), "would write into"),
        ("hard-ledger.jsonl".to_string(), "would write into"),
        (format!("file://{ledger}"), rel),
        (format!("file://{outs}/x.csv"), rel),
        ("*.csv".to_string(), rel),
        ("x?.csv".to_string(), rel),
        ("[h]ard.csv".to_string(), rel),
        (format!("{outs}/x.csv"), rel),
        ("./x.csv".to_string(), rel),
        ("sub/../x.csv".to_string(), rel),
        ("sub".to_string(), rel),
        ("sub/".to_string(), rel),
        ("sub.d".to_string(), "not a regular file"),
        ("new-dir/".to_string(), rel),
        ("noextension".to_string(), rel),
    ];
    for source in ["(SELECT dp_count(id, 1.0) AS n FROM p)", "(SELECT 1 AS a)"] {
        for (target, needle) in &targets {
            let sql = format!("COPY {source} TO '{target}' STORED AS CSV");
            let e = refused(&s, &st.ledger, &sql, needle).await;
            assert!(e.contains("dpfusion refused the query"), "{e}");
            assert_eq!(std::fs::read(&st.p).unwrap(), private_bytes, "{sql}");
        }
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(
        std::fs::read(out.join("hard.csv")).unwrap(),
        private_bytes,
        "the hard link was not truncated"
    );
    assert_eq!(s.scans("p"), 0, "no refused COPY read the private table");
    assert!(!out.join("x.csv").exists() && !st.ledger.with_file_name("new.csv").exists());
    // A plain file name inside the output directory is written.
    ok(&s, "COPY (SELECT 1 AS a) TO 'ok.csv' STORED AS CSV").await;
    assert!(out.join("ok.csv").is_file());
    assert_eq!(snapshot(&st.ledger), before);

    // The ledger knows the private file even in a session that does not register it (the link
    // appears after the session opened: an output directory that holds one does not open).
    let out2 = st.dir.join("out2");
    std::fs::create_dir_all(&out2).unwrap();
    let s3 = PrivateSession::open(options(&st, AnalystFiles::None).with_output_dir(&out2))
        .await
        .unwrap();
    std::fs::hard_link(&st.p, out2.join("hard.csv")).unwrap();
    refused(
        &s3,
        &st.ledger,
        "COPY (SELECT 1 AS a) TO 'hard.csv' STORED AS CSV",
        "would write into private table 'p'",
    )
    .await;
    assert_eq!(std::fs::read(out2.join("hard.csv")).unwrap(), private_bytes);

    // Without an output directory, COPY is refused.
    let s2 = open(&st, AnalystFiles::None).await;
    let e = refused(
        &s2,
        &st.ledger,
        "COPY (SELECT 1 AS a) TO 'ok2.csv' STORED AS CSV",
        "no output directory",
    )
    .await;
    assert!(e.contains("CREATE TABLE"), "says what to do: {e}");

    // An output directory that holds a private file or the ledger (also through a link, as
    // `out` and `out2` now do), or lies inside them, is refused when the session opens.
    for bad in [
        st.d.clone(),
        st.dir.to_path_buf(),
        st.ledger.parent().unwrap().to_path_buf(),
        out.join("pd"),
        out.clone(),
        out2.clone(),
    ] {
        let e = PrivateSession::open(options(&st, AnalystFiles::None).with_output_dir(&bad))
            .await
            .expect_err("an output directory over the owner's files must not open")
            .to_string();
        assert!(
            e.contains("choose a directory of its own"),
            "{}: {e}",
            bad.display()
        );
    }
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(std::fs::read(&st.p).unwrap(), private_bytes);
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 5. The policy in the ledger: the owner's re-registrations.
// ---------------------------------------------------------------------------------------------

/// A new session on the same ledger in which the owner registers `p` with `reg`.
async fn reregister(
    st: &Setup,
    reg: Registration,
) -> (PrivateSession, datafusion::error::Result<()>) {
    let s = open(st, AnalystFiles::None).await;
    let r = s.register_csv("p", &st.p, reg).await.map(|_| ());
    (s, r)
}

/// The owner's registration is refused with `needles` in the message, registers nothing and
/// leaves the ledger unchanged.
async fn reregister_refused(st: &Setup, reg: Registration, needles: &[&str]) {
    let before = snapshot(&st.ledger);
    let (s, r) = reregister(st, reg).await;
    let e = r.expect_err("must be refused").to_string();
    assert!(e.contains("would weaken or change"), "{e}");
    for n in needles {
        assert!(e.contains(n), "{n:?} not in: {e}");
    }
    assert!(e.contains("relax"), "says what to do: {e}");
    assert_eq!(snapshot(&st.ledger), before, "a refused registration wrote");
    assert!(
        s.tables().iter().all(|(n, _, _)| n != "p"),
        "nothing registered"
    );
    assert_eq!(s.scans("p"), 0);
}

fn budget_epsilon(s: &PrivateSession, table: &str) -> f64 {
    s.budget()
        .into_iter()
        .find(|r| r.name == table)
        .unwrap()
        .epsilon
}

#[tokio::test]
async fn owner_re_registrations_keep_tighten_or_are_refused_unless_relaxed() {
    let st = setup("policy");
    let (_s, r) = reregister(&st, Registration::private().budget(1.0, 1e-6)).await;
    r.unwrap();
    let after_first = snapshot(&st.ledger);

    // The same: kept, nothing written.
    let (s, r) = reregister(&st, Registration::private().budget(1.0, 1e-6)).await;
    r.unwrap();
    assert_eq!(snapshot(&st.ledger), after_first);
    assert_eq!(budget_epsilon(&s, "p"), 1.0);
    // Without a budget: the recorded one, nothing written.
    let (_s, r) = reregister(&st, Registration::private()).await;
    r.unwrap();
    assert_eq!(snapshot(&st.ledger), after_first);

    // Stricter: recorded.
    let (s, r) = reregister(&st, Registration::private().budget(0.5, 1e-6)).await;
    r.unwrap();
    let first_lines = String::from_utf8_lossy(after_first.0.as_ref().unwrap())
        .lines()
        .count();
    assert_eq!(lines(&st.ledger).len(), first_lines + 1, "one policy line");
    let r = ok(&s, "SHOW BUDGET").await;
    let row = rows(&r).into_iter().find(|r| r["table"] == "p").unwrap();
    // SHOW BUDGET's epsilon is the guarantee: the largest budget in force so far (admissions
    // before the change were checked against it); the lower budget caps what is left.
    assert_eq!(row["epsilon"].parse::<f64>().unwrap(), 1.0);
    // What is left is measured against the lower budget: one default query could use about
    // what a fresh table of ε = 0.5 offers (at δ 1e-7, a little more than 0.5), far below 1.
    assert!(row["remaining_epsilon"].parse::<f64>().unwrap() <= 0.6);
    let (s, r) = reregister(&st, Registration::private()).await;
    r.unwrap();
    let in_force = s
        .accountant()
        .policy(&s.tables()[0].1.key)
        .unwrap()
        .budget
        .epsilon;
    assert_eq!(in_force, 0.5, "a later session reads it");
    assert_eq!(budget_epsilon(&s, "p"), 1.0);

    // Weaker: refused with the difference.
    reregister_refused(
        &st,
        Registration::private().budget(2.0, 1e-6),
        &["budget ε 0.5 → 2"],
    )
    .await;
    reregister_refused(
        &st,
        Registration::private().budget(0.5, 1e-5),
        &["budget δ 1e-6 → 1e-5"],
    )
    .await;
    // A blank reason is no reason.
    reregister_refused(
        &st,
        Registration::private().budget(2.0, 1e-6).relax("  "),
        &["budget ε 0.5 → 2"],
    )
    .await;
    // Relaxed by the owner with a reason: recorded, with the reason and the change.
    let before = snapshot(&st.ledger);
    let (s, r) = reregister(
        &st,
        Registration::private()
            .budget(2.0, 1e-6)
            .relax("board approval"),
    )
    .await;
    r.unwrap();
    assert_ne!(snapshot(&st.ledger), before);
    let last = lines(&st.ledger).pop().unwrap();
    assert!(
        last.contains("board approval") && last.contains("budget ε 0.5 → 2"),
        "{last}"
    );
    assert_eq!(budget_epsilon(&s, "p"), 2.0);

    // Every other weakening or change is refused.
    reregister_refused(
        &st,
        Registration::public(),
        &["visibility private → public"],
    )
    .await;
    reregister_refused(
        &st,
        Registration::private().public_columns(["dept"]),
        &["public columns [] → [dept]"],
    )
    .await;
    reregister_refused(
        &st,
        Registration::private().replace(),
        &["neighbours add_remove → replace"],
    )
    .await;
    reregister_refused(
        &st,
        Registration::private().filter(dpfusion::session::FilterKind::Zcdp),
        &["privacy filter"],
    )
    .await;
    reregister_refused(&st, Registration::private().delta_share(0.25), &["δ share"]).await;
    for csv in [
        CsvFormat::default().with_header(false),
        CsvFormat::default().with_delimiter(b';'),
        CsvFormat::default().with_comment(Some(b'#')),
        CsvFormat::default().with_null_regex(Some("^NA$".to_string())),
    ] {
        reregister_refused(&st, Registration::private().csv(csv), &["file format csv("]).await;
    }
    let other_schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("age", DataType::Utf8, true),
        Field::new("dept", DataType::Utf8, true),
        Field::new("salary", DataType::Float64, true),
        Field::new("remote", DataType::Boolean, true),
    ]));
    reregister_refused(
        &st,
        Registration::private().schema(other_schema),
        &["pinned schema ("],
    )
    .await;
    // Several changes at once: every one is listed.
    reregister_refused(
        &st,
        Registration::private()
            .budget(1000.0, 1e-6)
            .replace()
            .public_columns(["dept", "age"]),
        &[
            "budget ε 2 → 1000",
            "neighbours add_remove → replace",
            "public columns [] → [dept, age]",
        ],
    )
    .await;

    // A registration without a schema reads with the pinned one: change the header of the file,
    // and nothing is re-inferred.
    let text = std::fs::read_to_string(&st.p).unwrap();
    let body = text.split_once('\n').unwrap().1;
    std::fs::write(&st.p, format!("a,b,c,d,e\n{body}")).unwrap();
    let before = snapshot(&st.ledger);
    let (s, r) = reregister(&st, Registration::private()).await;
    r.unwrap();
    assert_eq!(
        snapshot(&st.ledger),
        before,
        "same policy, same pinned schema: kept"
    );
    assert_eq!(columns(&s, "p").await, PEOPLE_COLUMNS);
    assert_eq!(show_table(&s, "p").await["schema"], PEOPLE_SCHEMA);
    refused(
        &s,
        &st.ledger,
        "SELECT dp_count(a, 0.1) AS n FROM p",
        "No field named a",
    )
    .await;
    let r = ok(&s, "SELECT dp_count(id, 0.1) AS n FROM p").await;
    assert!(!r.batches.is_empty());
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 6. The review's finding 3: who registers first no longer decides the policy.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn analyst_sql_cannot_register_first_and_a_weak_earlier_policy_is_never_silently_kept() {
    // Analyst SQL first, with the policy options of the attack: refused, nothing in the ledger.
    let st = setup("finding3");
    let s = open(&st, AnalystFiles::Anywhere).await;
    let before = snapshot(&st.ledger);
    let p = st.p.to_string_lossy();
    let attack = format!(
        "CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '{p}' OPTIONS ('dp.visibility' \
         'private', 'dp.epsilon' '1000', 'dp.neighbours' 'replace', 'dp.public_columns' \
         'id,age,dept,salary,remote')"
    );
    refused(&s, &st.ledger, &attack, "is a policy option").await;
    assert_eq!(snapshot(&st.ledger), before);
    // Without the options it would be a public analyst table, kept only in this session.
    ok(
        &s,
        &format!("CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '{p}'"),
    )
    .await;
    let d = st.d.to_string_lossy();
    ok(
        &s,
        &format!("CREATE EXTERNAL TABLE early STORED AS CSV LOCATION '{d}/'"),
    )
    .await;
    let r = ok(&s, "SELECT count(*) AS c FROM early").await;
    assert_eq!(rows(&r)[0]["c"], "200");
    assert_eq!(
        snapshot(&st.ledger),
        before,
        "an analyst table is never in the ledger"
    );
    // The owner then registers it private, at the flag-level budget: the owner's policy is in
    // force, and the analyst's table is gone from the name.
    s.register_csv("p", &st.p, Registration::private().budget(1.0, 1e-6))
        .await
        .unwrap();
    let row = show_table(&s, "p").await;
    assert_eq!(row["visibility"], "private");
    assert_eq!(row["set_by"], "owner");
    assert_eq!(row["budget_epsilon"], "1.0");
    assert_eq!(row["neighbours"], "add_remove");
    assert_eq!(row["public_columns"], "");
    refused(&s, &st.ledger, "SELECT * FROM p", "refused").await;
    // The analyst table registered before over the same files is refused at its next scan.
    refused(
        &s,
        &st.ledger,
        "SELECT count(*) AS c FROM early",
        "names files of",
    )
    .await;
    refused(&s, &st.ledger, "SELECT * FROM early", "names files of").await;
    // A second analyst table over the file is now refused, at registration and at its scans.
    refused(
        &s,
        &st.ledger,
        &format!("CREATE EXTERNAL TABLE p2 STORED AS CSV LOCATION '{p}'"),
        "names files of",
    )
    .await;

    // An earlier owner registration with a weak policy (ε = 1000, replace, every column public),
    // then the flag-level one: never silently the earlier one. It is stricter in every part, so
    // it is recorded and in force…
    let st = setup("finding3-owner");
    let (_s, r) = reregister(
        &st,
        Registration::private()
            .budget(1000.0, 1e-6)
            .replace()
            .public_columns(PEOPLE_COLUMNS),
    )
    .await;
    r.unwrap();
    let before = snapshot(&st.ledger);
    let (s, r) = reregister(&st, Registration::private().budget(1.0, 1e-6)).await;
    r.unwrap();
    assert_ne!(
        snapshot(&st.ledger),
        before,
        "the stricter policy is recorded"
    );
    let row = show_table(&s, "p").await;
    assert_eq!(
        (
            row["budget_epsilon"].as_str(),
            row["neighbours"].as_str(),
            row["public_columns"].as_str()
        ),
        ("1.0", "add_remove", "")
    );
    refused(&s, &st.ledger, "SELECT dept FROM p", "refused").await;
    // …and going back to the weak policy is refused with every difference.
    reregister_refused(
        &st,
        Registration::private()
            .budget(1000.0, 1e-6)
            .replace()
            .public_columns(PEOPLE_COLUMNS),
        &[
            "budget ε 1 → 1000",
            "neighbours add_remove → replace",
            "public columns [] → [id, age, dept, salary, remote]",
        ],
    )
    .await;
    // In the opposite order (the flag-level policy first), the weak one is refused too.
    let st = setup("finding3-order");
    let (_s, r) = reregister(&st, Registration::private().budget(1.0, 1e-6)).await;
    r.unwrap();
    reregister_refused(
        &st,
        Registration::private()
            .budget(1000.0, 1e-6)
            .replace()
            .public_columns(PEOPLE_COLUMNS),
        &["budget ε 1 → 1000"],
    )
    .await;
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 7. A tampered ledger does not open a session.
// ---------------------------------------------------------------------------------------------

/// A ledger with `p` registered (ε = 1) and one charge.
async fn charged_ledger(tag: &str) -> Setup {
    let st = setup(tag);
    let s = open(&st, AnalystFiles::None).await;
    s.register_csv("p", &st.p, Registration::private().budget(1.0, 1e-6))
        .await
        .unwrap();
    ok(&s, "SELECT dp_count(id, 0.5) AS n FROM p").await;
    assert_eq!(lines(&st.ledger).len(), 3, "header, policy, charge");
    st
}

async fn open_refused(st: &Setup, needles: &[&str]) {
    let before = snapshot(&st.ledger);
    let e = PrivateSession::open(options(st, AnalystFiles::None))
        .await
        .expect_err("a tampered ledger must not open a session")
        .to_string();
    for n in needles {
        assert!(e.contains(n), "{n:?} not in: {e}");
    }
    assert!(e.contains("backup"), "says what to do: {e}");
    assert_eq!(
        snapshot(&st.ledger),
        before,
        "a refused open changes nothing"
    );
}

#[tokio::test]
async fn a_truncated_ledger_does_not_open_a_session() {
    let st = charged_ledger("truncated").await;
    let mut l = lines(&st.ledger);
    l.pop();
    std::fs::write(&st.ledger, l.join("\n") + "\n").unwrap();
    open_refused(&st, &["ends after 2 complete lines"]).await;
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[tokio::test]
async fn a_forged_budget_in_a_policy_line_does_not_open_a_session() {
    let st = charged_ledger("forged").await;
    let mut l = lines(&st.ledger);
    let policy = &l[1];
    let forged = policy.replacen("\"epsilon\":1.0", "\"epsilon\":100.0", 1);
    assert_ne!(
        &forged, policy,
        "the policy line holds the budget: {policy}"
    );
    l[1] = forged;
    std::fs::write(&st.ledger, l.join("\n") + "\n").unwrap();
    open_refused(&st, &["line 2"]).await;
    let _ = std::fs::remove_dir_all(&st.dir);
}

// ---------------------------------------------------------------------------------------------
// 7. Issue 27: open what was registered. Every file DataFusion reads or writes goes through the
//    session's pins (src/files/store.rs): opened without following links, its device and inode
//    compared with what was registered; COPY creates a new file directly in the output
//    directory, or nothing.
// ---------------------------------------------------------------------------------------------

/// A private value of people.csv (row 1's salary): never in any result or message below.
const PRIVATE_VALUE: &str = "85857.76";

/// A private file of depts.csv's shape (dept, floor): 4 rows of secrets.
fn shaped_rows() -> &'static str {
    "dept,floor\nSECRET-a,1\nSECRET-b,2\nSECRET-c,3\nSECRET-d,4\n"
}

/// Replaces `path` atomically (rename) with a symbolic link to `target`; returns the original,
/// kept aside under `path.orig`.
fn swap_for_link(path: &Path, target: &Path) -> PathBuf {
    let orig = path.with_extension("orig");
    std::fs::rename(path, &orig).unwrap();
    let tmp = path.with_extension("swap");
    let _ = std::fs::remove_file(&tmp);
    symlink(target, &tmp);
    std::fs::rename(&tmp, path).unwrap();
    orig
}

/// Undoes [`swap_for_link`]: the very same file (same inode) is back.
fn swap_back(path: &Path, orig: &Path) {
    std::fs::rename(orig, path).unwrap();
}

/// `sql` fails, and neither its message nor anything else shows a private value.
async fn refused_no_data(s: &PrivateSession, ledger: &Path, sql: &str, needle: &str) {
    let e = refused(s, ledger, sql, needle).await;
    assert!(
        !e.contains(PRIVATE_VALUE) && !e.contains("SECRET"),
        "{sql}: {e}"
    );
    assert!(!e.contains("sha256:"), "{sql}: {e}");
}

/// A directory whose canonical path is longer than PATH_MAX, built through short links, and a
/// link (`target` of at most 4,095 bytes) that reaches `leaf` through it: the kernel follows it,
/// `realpath` fails with ENAMETOOLONG.
fn too_long_for_realpath(base: &Path, link: &Path, leaf: &Path) {
    let a = "a".repeat(250);
    let level = |n: usize| vec![a.as_str(); n].join("/");
    let deep = base.join("deep");
    std::fs::create_dir_all(deep.join(level(8))).unwrap();
    let s1 = base.join("s1");
    symlink(&deep.join(level(8)), &s1);
    std::fs::create_dir_all(s1.join(level(8))).unwrap();
    let s2 = base.join("s2");
    symlink(&s1.join(level(8)), &s2);
    std::fs::create_dir_all(s2.join(level(2))).unwrap();
    // Level 18 holds `x` → leaf; level 16 holds `y` → two levels down to `x`.
    symlink(leaf, &s2.join(level(2)).join("x"));
    std::os::unix::fs::symlink(format!("{}/x", level(2)), s2.join("y")).unwrap();
    // `link` → ../deep/<16 levels>/y (relative to the link's directory, one below `base`).
    let rel = format!("../deep/{}/y", level(16));
    assert!(rel.len() < 4096, "{}", rel.len());
    std::os::unix::fs::symlink(&rel, link).unwrap();
    let e = std::fs::canonicalize(link).expect_err("realpath must fail");
    assert_eq!(e.raw_os_error(), Some(36), "ENAMETOOLONG expected: {e}");
    assert_eq!(
        std::fs::read(link).unwrap(),
        std::fs::read(leaf).unwrap(),
        "the kernel follows the link"
    );
}

#[tokio::test]
async fn links_that_cannot_be_resolved_are_refused_never_skipped() {
    let st = setup("unresolvable");
    let public = st.dir.join("public");
    std::fs::create_dir_all(&public).unwrap();
    std::fs::copy(depts_csv(), public.join("depts.csv")).unwrap();
    let s = owner_session(&st, AnalystFiles::Under(vec![public.clone()])).await;
    let before = snapshot(&st.ledger);
    let pubs = public.to_string_lossy().to_string();
    let long = public.join("long.csv");
    too_long_for_realpath(&st.dir, &long, &st.p);
    let dangling = public.join("dangling.csv");
    symlink(&st.dir.join("no-such-file.csv"), &dangling);
    // A loop: public/loop1.csv → other/loop2.csv → public/loop1.csv.
    let (l1, l2) = (public.join("loop1.csv"), st.dir.join("other/loop2.csv"));
    symlink(&l2, &l1);
    symlink(&l1, &l2);
    let all = [long.clone(), dangling.clone(), l1.clone()];
    // Each bad link alone, then all of them: the directory and the link are refused.
    for bad in &all {
        for other in all.iter().filter(|o| *o != bad) {
            let _ = std::fs::rename(other, other.with_extension("off"));
        }
        for location in [format!("{pubs}/"), bad.to_string_lossy().to_string()] {
            let sql = format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{location}'");
            refused_no_data(&s, &st.ledger, &sql, "refused").await;
        }
        for other in all.iter().filter(|o| *o != bad) {
            let _ = std::fs::rename(other.with_extension("off"), other);
        }
    }
    // Without them the directory registers; when one appears later, the next scan is refused
    // (by the check before every scan, and by the store, which follows no link).
    let moved: Vec<PathBuf> = all
        .iter()
        .map(|b| {
            let to = st.dir.join("other").join(b.file_name().unwrap());
            std::fs::rename(b, &to).unwrap();
            to
        })
        .collect();
    ok(
        &s,
        &format!("CREATE EXTERNAL TABLE a STORED AS CSV LOCATION '{pubs}/'"),
    )
    .await;
    assert_eq!(
        rows(&ok(&s, "SELECT count(*) AS c FROM a").await)[0]["c"],
        "4"
    );
    for (b, m) in all.iter().zip(&moved) {
        std::fs::rename(m, b).unwrap();
        for sql in ["SELECT count(*) AS c FROM a", "SELECT * FROM a"] {
            refused_no_data(&s, &st.ledger, sql, "refused").await;
        }
        std::fs::rename(b, m).unwrap();
    }
    assert_eq!(
        rows(&ok(&s, "SELECT count(*) AS c FROM a").await)[0]["c"],
        "4"
    );
    assert_eq!(snapshot(&st.ledger), before);
    assert_eq!(s.scans("p"), 0);
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[tokio::test]
async fn a_public_file_swapped_for_a_link_or_another_file_is_refused() {
    let st = setup("swap-public");
    let public = st.dir.join("public");
    std::fs::create_dir_all(&public).unwrap();
    let jobs = public.join("jobs.csv");
    let mine = public.join("mine.csv");
    std::fs::copy(depts_csv(), &jobs).unwrap();
    std::fs::copy(depts_csv(), &mine).unwrap();
    // The owner's catalog, with an analyst's token hash in it.
    let catalog = st.dir.join("dpfusion.toml");
    std::fs::write(
        &catalog,
        "[[analyst]]\nname = \"ann\"\ntoken_hash = \"sha256:00:11\"\n",
    )
    .unwrap();
    let mut o = options(&st, AnalystFiles::Under(vec![public.clone()]));
    o.owner_paths = vec![catalog.clone()];
    let s = PrivateSession::open(o).await.unwrap();
    s.register_csv("p", &st.p, Registration::private().budget(10.0, 1e-6))
        .await
        .unwrap();
    let shaped = st.d.join("shaped.csv");
    std::fs::write(&shaped, shaped_rows()).unwrap();
    s.register_csv("shaped", &shaped, Registration::private())
        .await
        .unwrap();
    // The owner's public table, in a directory analysts may write (as the example catalog's
    // `jobs`), and an analyst's public table.
    s.register_csv("jobs", &jobs, Registration::public())
        .await
        .unwrap();
    ok(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE mine STORED AS CSV LOCATION '{}'",
            mine.display()
        ),
    )
    .await;
    for table in ["jobs", "mine"] {
        let file = public.join(format!("{table}.csv"));
        let count = format!("SELECT count(*) AS c FROM {table}");
        let all = format!("SELECT * FROM {table}");
        assert_eq!(rows(&ok(&s, &count).await)[0]["c"], "4");
        // A symbolic link to the private file, the catalog, the ledger or its sidecar.
        for target in [
            st.p.clone(),
            shaped.clone(),
            catalog.clone(),
            st.ledger.clone(),
            head_path(&st.ledger),
        ] {
            let orig = swap_for_link(&file, &target);
            for sql in [&count, &all] {
                refused_no_data(&s, &st.ledger, sql, "refused").await;
            }
            std::fs::remove_file(&file).unwrap();
            swap_back(&file, &orig);
            assert_eq!(rows(&ok(&s, &count).await)[0]["c"], "4", "{table} is back");
        }
        // A hard link to the private file, and a new copy of the same rows: not the file
        // that was registered.
        for replacement in [&st.p, &shaped, &depts_csv()] {
            let orig = file.with_extension("orig");
            std::fs::rename(&file, &orig).unwrap();
            let tmp = file.with_extension("new");
            if replacement != &depts_csv() {
                std::fs::hard_link(replacement, &tmp).unwrap();
            } else {
                std::fs::copy(replacement, &tmp).unwrap();
            }
            std::fs::rename(&tmp, &file).unwrap();
            // (An analyst's table is refused by the check before every scan when the file
            // is a private one's, by the store otherwise.)
            let needle = if replacement != &depts_csv() && table == "mine" {
                "refused"
            } else {
                "not the file or directory that was registered"
            };
            for sql in [&count, &all] {
                refused_no_data(&s, &st.ledger, sql, needle).await;
            }
            std::fs::remove_file(&file).unwrap();
            swap_back(&file, &orig);
        }
        assert_eq!(rows(&ok(&s, &count).await)[0]["c"], "4");
    }
    // A private table's file swapped for a link to another file is refused too (with the
    // fixed message of a private read once admitted, or before).
    let orig = swap_for_link(&st.p, &jobs);
    let e = s
        .sql("SELECT dp_count(id, 1.0) AS n FROM p")
        .await
        .expect_err("a swapped private file is refused");
    assert!(!e.to_string().contains(PRIVATE_VALUE));
    std::fs::remove_file(&st.p).unwrap();
    swap_back(&st.p, &orig);
    ok(&s, "SELECT dp_count(id, 1.0) AS n FROM p").await;
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[tokio::test]
async fn an_output_directory_writable_by_others_or_holding_the_owner_s_files_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let st = setup("out-rules");
    let out = st.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let catalog = st.dir.join("other/dpfusion.toml");
    std::fs::write(&catalog, "").unwrap();
    let open_with = |dir: &Path| {
        let mut o = options(&st, AnalystFiles::None).with_output_dir(dir);
        o.owner_paths = vec![catalog.clone()];
        PrivateSession::open(o)
    };
    for mode in [0o777, 0o1777, 0o757] {
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = open_with(&out)
            .await
            .expect_err("writable by others")
            .to_string();
        assert!(e.contains("writable by others"), "{mode:o}: {e}");
    }
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The ledger's directory, the catalog's: refused.
    for bad in [st.ledger.parent().unwrap(), catalog.parent().unwrap()] {
        let e = open_with(bad).await.expect_err("owner's files").to_string();
        assert!(e.contains("choose a directory of its own"), "{e}");
    }
    // No table's file, private or public, may lie in the output directory.
    let s = open_with(&out).await.unwrap();
    std::fs::copy(depts_csv(), out.join("pub.csv")).unwrap();
    std::fs::copy(people_csv(), out.join("priv.csv")).unwrap();
    for (name, reg) in [
        ("pubt", Registration::public()),
        ("privt", Registration::private()),
    ] {
        let file = out.join(if name == "pubt" {
            "pub.csv"
        } else {
            "priv.csv"
        });
        let e = s
            .register_csv(name, &file, reg)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlap"), "{e}");
    }
    let e = s
        .register_csv("outdir", &out, Registration::public())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("overlap"), "{e}");
    // A directory that became writable by others after the session opened: COPY refuses.
    ok(&s, "COPY (SELECT 1 AS a) TO 'one.csv' STORED AS CSV").await;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        &s,
        &st.ledger,
        "COPY (SELECT 1 AS a) TO 'two.csv' STORED AS CSV",
        "writable by others",
    )
    .await;
    assert!(!out.join("two.csv").exists());
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    // COPY creates new files only.
    refused(
        &s,
        &st.ledger,
        "COPY (SELECT 1 AS a) TO 'one.csv' STORED AS CSV",
        "creates new files",
    )
    .await;
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[test]
fn copy_racing_a_swapper_never_writes_outside_the_output_directory() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let st = setup("copy-race");
    let out = st.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let ledger_dir = st.ledger.parent().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = PrivateSession::open(options(&st, AnalystFiles::None).with_output_dir(&out))
            .await
            .unwrap();
        s.register_csv("p", &st.p, Registration::private().budget(10.0, 1e-6))
            .await
            .unwrap();
        s
    });
    let before = snapshot(&st.ledger);
    let listing = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let ledger_files = listing(&ledger_dir);
    let stop = Arc::new(AtomicBool::new(false));
    // The swapper: `out/sub` a real directory, then a link to the ledger's directory; the
    // target name a link to the ledger's directory and to the ledger; the output directory
    // itself swapped for a link to the ledger's directory and back.
    let swapper = {
        let (stop, out, ledger_dir, ledger) = (
            stop.clone(),
            out.clone(),
            ledger_dir.clone(),
            st.ledger.clone(),
        );
        std::thread::spawn(move || {
            let aside = out.with_extension("aside");
            let (mut i, mut recreated) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let sub = out.join("sub");
                let _ = std::fs::remove_dir_all(&sub);
                let _ = std::fs::remove_file(&sub);
                let _ = std::fs::create_dir(&sub);
                std::thread::yield_now();
                let _ = std::fs::remove_dir(&sub);
                let _ = std::os::unix::fs::symlink(&ledger_dir, &sub);
                for name in ["race.csv", "ledger.jsonl"] {
                    let t = out.join(name);
                    let _ = std::fs::remove_file(&t);
                    let to = if i.is_multiple_of(2) {
                        ledger.clone()
                    } else {
                        ledger_dir.join(name)
                    };
                    let _ = std::os::unix::fs::symlink(&to, &t);
                    std::thread::yield_now();
                    let _ = std::fs::remove_file(&t);
                }
                if i.is_multiple_of(8) && std::fs::rename(&out, &aside).is_ok() {
                    let _ = std::os::unix::fs::symlink(&ledger_dir, &out);
                    std::thread::yield_now();
                    let _ = std::fs::remove_file(&out);
                    if std::fs::rename(&aside, &out).is_err() {
                        // Something created `out` while it was swapped away: a write that did
                        // not go through the pinned directory.
                        let _ = std::fs::remove_dir_all(&out);
                        std::fs::rename(&aside, &out).unwrap();
                        recreated += 1;
                    }
                }
            }
            recreated
        })
    };
    let started = std::time::Instant::now();
    let (mut tries, mut written) = (0, 0);
    rt.block_on(async {
        while started.elapsed() < std::time::Duration::from_secs(3) && tries < 4000 {
            for target in ["sub/ledger.jsonl", "race.csv", "ledger.jsonl"] {
                tries += 1;
                let sql = format!("COPY (SELECT 1 AS a) TO '{target}' STORED AS CSV");
                if s.sql(&sql).await.is_ok() {
                    written += 1;
                }
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let recreated = swapper.join().unwrap();
    println!("{tries} COPYs raced the swapper, {written} wrote a file into the output directory");
    assert_eq!(
        recreated, 0,
        "a COPY created the output directory while it was swapped away"
    );
    assert_eq!(
        snapshot(&st.ledger),
        before,
        "the ledger and its sidecar are intact"
    );
    assert_eq!(
        listing(&ledger_dir),
        ledger_files,
        "nothing new in the ledger's directory"
    );
    assert!(out.is_dir() && !out.is_symlink());
    let _ = std::fs::remove_dir_all(&st.dir);
}

#[test]
fn reads_racing_a_swapper_never_see_a_private_row() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let st = setup("read-race");
    let public = st.dir.join("public");
    let pubd = public.join("d");
    std::fs::create_dir_all(&pubd).unwrap();
    let jobs = public.join("jobs.csv");
    std::fs::copy(depts_csv(), &jobs).unwrap();
    std::fs::copy(depts_csv(), pubd.join("one.csv")).unwrap();
    // A private table of the public tables' shape: read through a followed link, its rows
    // would fit their schema.
    let shaped = st.d.join("shaped.csv");
    std::fs::write(&shaped, shaped_rows()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = owner_session(&st, AnalystFiles::None).await;
        s.register_csv("shaped", &shaped, Registration::private())
            .await
            .unwrap();
        s.register_csv("jobs", &jobs, Registration::public())
            .await
            .unwrap();
        s.register_csv("pubd", &pubd, Registration::public())
            .await
            .unwrap();
        s
    });
    // The swapper keeps each original (a hard link aside) and flips the name between it and a
    // link to the private file, as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, files, private) = (
            stop.clone(),
            vec![jobs.clone(), pubd.join("one.csv")],
            shaped.clone(),
        );
        std::thread::spawn(move || {
            for f in &files {
                std::fs::hard_link(f, f.with_extension("keep")).unwrap();
            }
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for f in &files {
                    let tmp = f.with_extension("tmp");
                    let _ = std::fs::remove_file(&tmp);
                    std::os::unix::fs::symlink(&private, &tmp).unwrap();
                    std::fs::rename(&tmp, f).unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    std::fs::hard_link(f.with_extension("keep"), &tmp).unwrap();
                    std::fs::rename(&tmp, f).unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    flips += 1;
                }
            }
            flips
        })
    };
    let started = std::time::Instant::now();
    let (mut answered, mut refused) = (0, 0);
    rt.block_on(async {
        while started.elapsed() < std::time::Duration::from_secs(2) {
            for sql in ["SELECT * FROM jobs", "SELECT * FROM pubd"] {
                match s.sql(sql).await {
                    Ok(r) => {
                        let rs = rows(&r);
                        assert_eq!(rs.len(), 4, "{sql}: {rs:?}");
                        for row in &rs {
                            assert!(row.contains_key("dept") && row.contains_key("floor"));
                            assert!(!row.values().any(|v| v.contains("SECRET")), "{row:?}");
                        }
                        answered += 1;
                    }
                    Err(e) => {
                        assert!(!e.to_string().contains("SECRET"), "{sql}: {e}");
                        refused += 1;
                    }
                }
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let flips = swapper.join().unwrap();
    println!("{answered} reads answered with the public rows, {refused} refused, {flips} swaps");
    assert!(flips > 0);
    assert_eq!(s.scans("shaped"), 0);
    let _ = std::fs::remove_dir_all(&st.dir);
}
