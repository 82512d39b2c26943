//! Round 49 (review composition, F3 and F4): what the command line shows of the budget when one
//! file is registered under two names, and of a statement that failed after its admission,
//! through the real binary (`-c`, `-f` and the REPL in a pseudo-terminal) and the local backend.
use std::path::Path;
use std::process::{Command, Output};

use crate::common::{TestPath, test_dir};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dpfusion")
}

/// A directory with a catalog: `a` and `a2` name one file (one table, one budget), `b` another;
/// every statement gets `memory_limit` bytes (a private GROUP BY over every id fails at 1,000,
/// after its admission; a count without GROUP BY runs).
fn catalog(tag: &str) -> TestPath {
    let d = test_dir(&format!("receipts-{tag}"));
    std::fs::create_dir_all(d.join("data")).unwrap();
    let people = crate::common::people_csv();
    std::fs::copy(&people, d.join("data/people.csv")).unwrap();
    std::fs::copy(&people, d.join("data/b.csv")).unwrap();
    let table = |name: &str, path: &str| {
        format!("[[table]]\nname = \"{name}\"\npath = \"{path}\"\nepsilon = 3.0\ndelta = 1e-6\n\n")
    };
    std::fs::write(
        d.join("c.toml"),
        format!(
            "[session]\nledger = \"ledger/ledger.jsonl\"\nmemory_limit = 1000\n\n{}{}{}",
            table("a", "data/people.csv"),
            table("a2", "data/people.csv"),
            table("b", "data/b.csv"),
        ),
    )
    .unwrap();
    d
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(["--catalog", "c.toml"])
        .args(args)
        .current_dir(dir)
        .env("DPFUSION_HISTORY", dir.join("history"))
        .output()
        .expect("run dpfusion")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

const FAILS: &str = "SELECT id, dp_count(age, epsilon => 0.3) AS n FROM a2 GROUP BY id";

/// F3: a query on `a` prints `charged a` (not `charged a2`, the name registered last), and
/// `SHOW BUDGET` and `dp_budget('a')` show `a`, marked as one budget with `a2`. F4: a statement
/// that fails after its admission prints the one fixed message, then its receipt (what was
/// charged, the share used, what is left), and exits 1; `-q` leaves the receipt out; a statement
/// marked `-- @expect-error` prints both on stdout, and the script goes on.
#[test]
fn r49_the_cli_names_tables_as_written_and_shows_a_failed_statements_charge() {
    let d = catalog("cli");
    let o = run(
        &d,
        &[
            "--format",
            "csv",
            "-c",
            "SELECT dp_count(age, epsilon => 0.1) AS n FROM a",
            "-c",
            "SELECT \"table\", used_pct, same_budget_as FROM dp_budget()",
            "-c",
            "SELECT \"table\", same_budget_as FROM dp_budget('a')",
        ],
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        err.starts_with("charged a: dp_count(ε 0.1, δ 1e-7, gaussian) cost 0.1476% of the budget"),
        "{err}"
    );
    assert!(!err.contains("a2"), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&"a,0.1476,a2")
            && lines.contains(&"a2,0.1476,a")
            && lines.contains(&"b,0.0,"),
        "{out}"
    );
    assert_eq!(lines.last(), Some(&"a,a2"), "{out}");

    let o = run(&d, &["-c", FAILS, "-c", "SELECT 'never' AS x"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(!out.contains("never"), "{out}");
    let fixed = err
        .find(dpfusion::session::EXECUTION_FAILED)
        .unwrap_or_else(|| panic!("the fixed message, unchanged: {err}"));
    let receipt = err
        .find("charged a2: dp_count(ε 0.3, δ 1e-7, gaussian), partition_selection(ε 0.3")
        .unwrap_or_else(|| panic!("the receipt: {err}"));
    assert!(
        fixed < receipt,
        "the error, then what it was charged: {err}"
    );
    assert!(
        err[receipt..].contains("% left, one more query could use ε ≤ "),
        "{err}"
    );
    // Its numbers are the budget's now.
    let o = run(
        &d,
        &[
            "--format",
            "csv",
            "-c",
            "SELECT left_pct FROM dp_budget('a2')",
        ],
    );
    let left = text(&o.stdout).lines().nth(1).unwrap().to_string();
    assert!(
        err[receipt..].contains(&format!("; {left}% left")),
        "{left}: {err}"
    );

    // -q: no receipt, as for a finished statement.
    let o = run(&d, &["-q", "-c", FAILS]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains(dpfusion::session::EXECUTION_FAILED) && !err.contains("charged"),
        "{err}"
    );

    // -- @expect-error: the block (error and receipt) on stdout, and the script goes on.
    let f = d.join("s.sql");
    std::fs::write(
        &f,
        format!("-- @expect-error\n{FAILS};\nSELECT 'after' AS x;\n"),
    )
    .unwrap();
    let o = run(&d, &["-f", f.to_str().unwrap()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", text(&o.stderr));
    assert!(
        out.contains(dpfusion::session::EXECUTION_FAILED)
            && out.contains("charged a2: dp_count(")
            && out.contains("after"),
        "{out}"
    );
}

/// F3 and F4 through the local backend (what the REPL and the scripts run on): a statement that
/// fails after its admission is `Outcome::Failed` with its receipt line and tables, and one
/// refused before admission is a plain error; `\d` and the prompt's rows show `a`'s budget, and
/// say it is one with `a2`'s.
#[tokio::test]
async fn r49_the_local_backend_reports_a_failed_statements_charge() {
    use dpfusion_cli::repl::local::{Local, describe};
    use dpfusion_cli::repl::{Backend, Outcome};
    let d = catalog("local");
    let cat = dpfusion::catalog::Catalog::load(d.join("c.toml")).unwrap();
    let session = cat.open().await.unwrap();
    let table = describe(&session, "").unwrap();
    let a = table
        .lines()
        .find(|l| l.trim_start().starts_with("a "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        a.contains("private, budget ε 3 at δ 1e-6 (one budget with a2: the same file);"),
        "{a}"
    );
    assert!(
        describe(&session, "a").unwrap().contains("100% left"),
        "{table}"
    );
    let mut local = Local::new(session);
    match local.sql_interruptible(FAILS).await {
        Outcome::Failed(e, charged) => {
            assert_eq!(e, dpfusion::session::EXECUTION_FAILED);
            assert!(
                charged.receipt.starts_with("charged a2: dp_count("),
                "{}",
                charged.receipt
            );
            assert_eq!(charged.tables, ["a2"]);
        }
        _ => panic!("not a failure after admission"),
    }
    match local.sql_outcome(FAILS).await {
        Outcome::Failed(_, charged) => assert_eq!(charged.tables, ["a2"]),
        _ => panic!("not a failure after admission"),
    }
    match local.sql_outcome("SELECT age FROM a").await {
        Outcome::Done(Err(e)) => assert!(e.contains("refused"), "{e}"),
        _ => panic!("not refused before admission"),
    }
    let rows = local.budget().await;
    let a = rows.iter().find(|r| r.name == "a").expect("a's budget");
    let a2 = rows.iter().find(|r| r.name == "a2").expect("a2's budget");
    assert_eq!(a.left_share, a2.left_share);
    assert!(a.left_share < dpfusion::accounting::display::SHARE_SCALE);
}

/// The REPL in a pseudo-terminal (Python's `pty`, as tests/pty/repl_session.py): after a
/// statement that failed after its admission, the error, its receipt, and the prompt on its
/// table; a query on `a` is `charged a` and the prompt shows `a`'s budget; `\d` lists `a` with
/// its budget.
#[test]
fn r49_the_repl_prompt_follows_a_failed_statement_and_every_name() {
    let d = catalog("pty");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/pty/failed_receipt_session.py"
    );
    let o = Command::new("python3")
        .args([script, bin(), d.to_str().unwrap()])
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}
