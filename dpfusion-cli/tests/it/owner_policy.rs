//! Round 52 (review operator): the data owner changing a catalog over months, through the real
//! binary. F1: a private table's file moved to a new path is refused under its charged name
//! unless relaxed (a new budget, recorded); F2: a `relax` left in the catalog approves no later
//! change; F3: after a public period the guarantee shown is none (`SHOW BUDGET`'s `epsilon` is
//! +∞, `ledger verify` says since which line); F6: renaming a table with a privacy unit keeps its
//! budget and unit domain. `dpfusion ledger verify` lists every relaxation.
use std::path::Path;
use std::process::{Command, Output};

use crate::common::{TestPath, test_dir};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dpfusion")
}

/// `dpfusion --catalog c.toml ARGS` (or `dpfusion ledger verify --catalog c.toml` with
/// `verify`) in `dir`.
fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(["--catalog", "c.toml"])
        .args(args)
        .current_dir(dir)
        .env("DPFUSION_HISTORY", dir.join("history"))
        .output()
        .expect("run dpfusion")
}

fn verify(dir: &Path) -> String {
    let out = Command::new(bin())
        .args(["ledger", "verify", "--catalog", "c.toml"])
        .current_dir(dir)
        .output()
        .expect("run dpfusion ledger verify");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

fn refused(dir: &Path, needles: &[&str]) -> String {
    let before = ledger(dir);
    let out = run(dir, &["-c", "SELECT 1"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    for n in needles {
        assert!(t.contains(n), "{n:?} in {t}");
    }
    assert_eq!(ledger(dir), before, "nothing recorded");
    t
}

fn ledger(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ledger/ledger.jsonl")).unwrap()
}

/// Writes the catalog: table `salaries` over `path` with `extra` lines.
fn catalog(dir: &Path, name: &str, path: &str, extra: &str) {
    std::fs::write(
        dir.join("c.toml"),
        format!(
            "[session]\nledger = \"ledger/ledger.jsonl\"\n\n[[table]]\nname = \"{name}\"\n\
             path = \"{path}\"\n{extra}\n"
        ),
    )
    .unwrap();
}

/// A directory with `data/people.csv`.
fn setup(tag: &str) -> TestPath {
    let d = test_dir(&format!("owner-policy-{tag}"));
    std::fs::create_dir_all(d.join("data")).unwrap();
    std::fs::copy(crate::common::people_csv(), d.join("data/people.csv")).unwrap();
    d
}

/// `SHOW BUDGET`'s `epsilon` of the one table, as `\format csv` prints it.
fn shown_epsilon(dir: &Path) -> String {
    let out = ok(
        dir,
        &["--format", "csv", "-c", "SELECT epsilon FROM dp_budget()"],
    );
    out.lines()
        .nth(1)
        .unwrap_or_else(|| panic!("{out}"))
        .to_string()
}

/// F1 and F2: the file moved to another path; the owner's reason starts a new budget; a reason
/// left in the catalog approves no later change (a new one does); `ledger verify` lists both.
#[test]
fn a_moved_file_and_a_standing_relax_need_the_owners_new_reason() {
    let d = setup("move");
    let budget = "epsilon = 1.0\ndelta = 1e-6\npublic_columns = [\"dept\"]";
    catalog(&d, "salaries", "data/people.csv", budget);
    ok(
        &d,
        &[
            "-c",
            "SELECT dp_count(salary, epsilon => 0.5) FROM salaries",
        ],
    );
    // F1: moved, the catalog pointed at the new path.
    std::fs::create_dir(d.join("data2")).unwrap();
    std::fs::rename(d.join("data/people.csv"), d.join("data2/people.csv")).unwrap();
    catalog(&d, "salaries", "data2/people.csv", budget);
    refused(
        &d,
        &[
            "table 'salaries' was registered from ",
            "data/people.csv with charges (",
            "data2/people.csv would start a new budget",
            "relax = \"<reason>\"",
        ],
    );
    let moved = "relax = \"moved to the new disk for good\"";
    catalog(
        &d,
        "salaries",
        "data2/people.csv",
        &format!("{budget}\n{moved}"),
    );
    ok(&d, &["-c", "SELECT 1"]);
    // Left in the catalog: the same registration is kept.
    let before = ledger(&d);
    ok(&d, &["-c", "SELECT 1"]);
    assert_eq!(ledger(&d), before);
    // F2: a slip under the standing reason is refused, naming the line it was recorded at.
    let slip = "epsilon = 50.0\ndelta = 1e-6\npublic_columns = [\"dept\", \"salary\"]";
    catalog(
        &d,
        "salaries",
        "data2/people.csv",
        &format!("{slip}\n{moved}"),
    );
    refused(
        &d,
        &[
            "the reason 'moved to the new disk for good' was recorded for an earlier change at line",
            "write a new reason for this one ([budget ε 1 → 50; public columns [dept] → [dept, salary]])",
        ],
    );
    catalog(
        &d,
        "salaries",
        "data2/people.csv",
        &format!("{slip}\nrelax = \"the board approved the open salary column\""),
    );
    ok(&d, &["-c", "SELECT 1"]);
    let v = verify(&d);
    assert!(
        v.contains("the owner relaxed its policy at line 4: moved to the new disk for good [a new budget for table 'salaries'")
            && v.contains("the owner relaxed its policy at line 5: the board approved the open salary column [budget ε 1 → 50"),
        "{v}"
    );
}

/// F3 and F6: a table renamed keeps its budget and unit domain; made public and private again,
/// it shows no guarantee (`inf`), and `ledger verify` says since which line; what is left is
/// still shown and bounds the next query.
#[test]
fn a_rename_keeps_the_budget_and_a_public_period_leaves_no_guarantee() {
    let d = setup("public");
    let unit = "epsilon = 1.0\ndelta = 1e-6\nprivacy_unit = \"id\"";
    catalog(&d, "purchases", "data/people.csv", unit);
    ok(
        &d,
        &[
            "-c",
            "SELECT dp_count(salary, epsilon => 0.5) FROM purchases",
        ],
    );
    // F6: renamed, nothing recorded, the same budget.
    let before = ledger(&d);
    catalog(&d, "orders", "data/people.csv", unit);
    let out = ok(&d, &["-c", "SHOW BUDGET"]);
    assert!(out.contains("orders") && out.contains("23.5"), "{out}");
    assert_eq!(ledger(&d), before);
    assert_eq!(shown_epsilon(&d), "1.0");
    // F3: public for a while, then private again (stricter: no reason needed).
    catalog(
        &d,
        "orders",
        "data/people.csv",
        "visibility = \"public\"\nrelax = \"open data release\"",
    );
    ok(&d, &["-c", "SELECT count(*) FROM orders"]);
    let public_at = ledger(&d).lines().count();
    catalog(&d, "orders", "data/people.csv", unit);
    assert_eq!(shown_epsilon(&d), "inf");
    let out = ok(
        &d,
        &["-c", "SELECT dp_count(salary, epsilon => 0.1) FROM orders"],
    );
    assert!(out.contains("charged orders"), "{out}");
    let v = verify(&d);
    assert!(
        v.contains(&format!(
            "guarantee: none since line {public_at} (the table was made public"
        )) && v.contains("ε=∞ δ=1e-6"),
        "{v}"
    );
    // `\d` says so in words, not "budget ε inf".
    let out = ok(&d, &["-c", "\\d orders"]);
    assert!(
        out.contains(&format!(
            "private, no DP guarantee since ledger line {public_at} (the table was made public"
        )) && !out.contains("budget ε inf"),
        "{out}"
    );
}
