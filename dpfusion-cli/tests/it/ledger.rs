//! The ledger cannot be silently truncated, edited or refunded (issue 15): every tampering is
//! refused on open with an error naming the line, leaves the files byte for byte as they were,
//! and makes `dpfusion ledger verify` exit 1. Only a last line without its newline (a torn
//! write) is cut, and the charges before it stand.
use std::path::Path;
use std::process::{Command, Output};

use dpfusion::accounting::{
    Accountant, AccountingError, TableCharge, TableKey, TablePolicy, checkpoint_path, head_path,
};
use dpfusion::dpfusion_udfs::privacy::Event;

use crate::common::*;
use dpfusion::accounting::display::{self, SHARE_SCALE};

/// Built from JSON, as the ledger stores it, so that fields added to `TablePolicy` later (with
/// their serde defaults, which old ledgers need anyway) do not break this test.
fn policy(epsilon: f64) -> TablePolicy {
    serde_json::from_value(serde_json::json!({
        "key": "demo:t",
        "name": "t",
        "visibility": "private",
        "neighbours": "add_remove",
        "public_columns": [],
        "budget": { "epsilon": epsilon, "delta": 1e-6 },
    }))
    .unwrap()
}

fn charge(mu: f64) -> Vec<TableCharge> {
    vec![TableCharge {
        key: TableKey::from("demo:t"),
        events: vec![Event::Gaussian { mu }],
    }]
}

/// A ledger of 5 lines: header, policy, 3 charges. Returns its path and the ε spent.
fn ledger(tag: &str) -> (crate::common::TestPath, f64) {
    let path = crate::common::test_file(&format!("test-{tag}"), "ledger.jsonl");
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(policy(10.0)).unwrap();
    for i in 0..3 {
        acc.admit(&format!("q{i}"), &charge(0.2)).unwrap();
    }
    let spent = acc.budget_rows()[0].spent;
    assert_eq!(lines(&path).len(), 5);
    (path, spent)
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn snapshot(path: &Path) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    (
        std::fs::read(path).ok(),
        std::fs::read(head_path(path)).ok(),
    )
}

fn verify_cli(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "verify", path.to_str().unwrap()])
        .output()
        .unwrap()
}

/// Opening is refused with an error whose text contains every `needles`; the ledger and its
/// sidecar are unchanged; `dpfusion ledger verify` exits 1 with the same error. Returns the error.
fn refused(path: &Path, needles: &[&str]) -> AccountingError {
    let before = snapshot(path);
    let err = Accountant::open(path).expect_err("a tampered ledger must not open");
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "{n:?} not in: {msg}");
    }
    assert!(msg.contains("backup"), "says what to do: {msg}");
    assert_eq!(snapshot(path), before, "a refused open changes nothing");
    let out = verify_cli(path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("FAILED") && stderr.contains(&msg),
        "{stderr}"
    );
    assert_eq!(snapshot(path), before, "verify changes nothing");
    err
}

fn corrupt_line(err: &AccountingError) -> u64 {
    match err {
        AccountingError::Corrupt { line, .. } => *line,
        e => panic!("not a line error: {e}"),
    }
}

#[test]
fn intact_ledger_verifies_with_a_summary() {
    let (path, spent) = ledger("ok");
    let out = verify_cli(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("OK"), "{stdout}");
    assert!(
        stdout.contains("5 lines (1 header, 1 policy, 0 owner, 3 charge, 0 checkpoint)"),
        "{stdout}"
    );
    assert!(stdout.contains("tables: 1"), "{stdout}");
    let r = dpfusion::accounting::verify(&path).unwrap();
    assert_eq!(r.tables[0].spent, spent);
    assert_eq!(r.tables[0].charges, 3);
    // The share used, as SHOW BUDGET shows it; no "spent ε" (round 47).
    let used = r.tables[0].budget_row.as_ref().unwrap().native.used_share;
    assert!(used > 0);
    assert!(stdout.contains(&display::percent(used)), "{stdout}");
    assert!(!stdout.contains("spent ε"), "{stdout}");
}

#[test]
fn truncation_to_a_prefix_is_detected() {
    let (path, _) = ledger("prefix");
    let l = lines(&path);
    write_lines(&path, &l[..3]);
    let e = refused(&path, &["ends after 3 complete lines", "recorded 5"]);
    assert_eq!(corrupt_line(&e), 4);
}

#[test]
fn truncation_to_empty_is_detected() {
    let (path, _) = ledger("empty");
    std::fs::write(&path, b"").unwrap();
    refused(&path, &["no complete line", "emptied or replaced"]);
    // Also when only the header is left (a valid, shorter ledger).
    let (path, _) = ledger("header-only");
    let l = lines(&path);
    write_lines(&path, &l[..1]);
    assert_eq!(corrupt_line(&refused(&path, &["ends after 1"])), 2);
}

#[test]
fn deleted_ledger_with_its_sidecar_left_is_not_a_new_ledger() {
    let (path, _) = ledger("deleted");
    std::fs::remove_file(&path).unwrap();
    let e = Accountant::open(&path).unwrap_err().to_string();
    assert!(e.contains("does not exist but its sidecar"), "{e}");
    assert!(!path.exists(), "nothing created");
}

#[test]
fn deleting_a_middle_line_is_detected() {
    let (path, _) = ledger("middle");
    let mut l = lines(&path);
    l.remove(2);
    write_lines(&path, &l);
    let e = refused(&path, &["line 3", "`prev` is not the hash of line 2"]);
    assert_eq!(corrupt_line(&e), 3);
}

#[test]
fn editing_a_number_in_a_charge_is_detected() {
    let (path, _) = ledger("edit");
    let mut l = lines(&path);
    assert!(l[2].contains(r#""mu":0.2"#), "{}", l[2]);
    l[2] = l[2].replace(r#""mu":0.2"#, r#""mu":0.02"#);
    write_lines(&path, &l);
    assert_eq!(corrupt_line(&refused(&path, &["line 4", "edited"])), 4);
    // The last line has no successor: the sidecar's hash catches it.
    let (path, _) = ledger("edit-last");
    let mut l = lines(&path);
    l[4] = l[4].replace(r#""mu":0.2"#, r#""mu":0.02"#);
    write_lines(&path, &l);
    assert_eq!(corrupt_line(&refused(&path, &["sidecar", "edited"])), 5);
}

#[test]
fn a_forged_owner_record_is_detected() {
    let (path, _) = ledger("forged");
    let mut l = lines(&path);
    // Valid JSON, a valid owner record raising the budget, but not chained to the last line.
    let forged = lines(&path)[1]
        .replace(r#""record":"policy""#, r#""record":"owner""#)
        .replace(r#""epsilon":10.0"#, r#""epsilon":1000.0"#);
    assert!(forged.contains(r#""record":"owner""#) && forged.contains("1000.0"));
    l.push(forged);
    write_lines(&path, &l);
    assert_eq!(corrupt_line(&refused(&path, &["line 6"])), 6);
    // Without any `prev` (what COPY ... STORED AS JSON would write).
    let (path, _) = ledger("forged-copy");
    let mut l = lines(&path);
    l.push(
        r#"{"record":"owner","key":"demo:t","name":"t","visibility":"public","neighbours":"add_remove","public_columns":[],"budget":{"epsilon":1.0,"delta":1e-6}}"#
            .to_string(),
    );
    write_lines(&path, &l);
    assert_eq!(corrupt_line(&refused(&path, &["not a ledger record"])), 6);
}

#[test]
fn a_replaced_ledger_is_detected() {
    // What `COPY (SELECT 1 AS a) TO '<ledger>' STORED AS JSON` leaves.
    let (path, _) = ledger("copy");
    std::fs::write(&path, "{\"a\":1}\n").unwrap();
    assert_eq!(corrupt_line(&refused(&path, &["line 1"])), 1);
    // Another ledger's files moved over this one's ledger only.
    let (path, _) = ledger("other-a");
    let (other, _) = ledger("other-b");
    std::fs::copy(&other, &path).unwrap();
    refused(&path, &["belongs to another ledger"]);
    // The sidecar overwritten (emptied) while the ledger is intact.
    let (path, _) = ledger("head");
    std::fs::write(head_path(&path), b"").unwrap();
    refused(&path, &["not a valid ledger head"]);
}

#[test]
fn reordering_lines_is_detected() {
    let (path, _) = ledger("reorder");
    let mut l = lines(&path);
    l.swap(2, 3);
    write_lines(&path, &l);
    assert_eq!(corrupt_line(&refused(&path, &["line 3"])), 3);
}

#[test]
fn a_complete_unparsable_last_line_is_an_error_and_kept() {
    let (path, _) = ledger("unparsable");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"record\":\"charge\",\"seq\":3,\"ti\n");
    std::fs::write(&path, &bytes).unwrap();
    let e = refused(&path, &["line 6", "never a torn write"]);
    assert_eq!(corrupt_line(&e), 6);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "not deleted");
}

#[test]
fn a_torn_last_line_without_newline_is_cut_and_the_charges_before_it_stand() {
    let (path, spent) = ledger("torn");
    let good = std::fs::read(&path).unwrap();
    let head = std::fs::read(head_path(&path)).unwrap();
    let mut bytes = good.clone();
    bytes.extend_from_slice(br#"{"record":"charge","seq":3,"time":"2026-"#);
    std::fs::write(&path, &bytes).unwrap();
    // verify reports it and changes nothing.
    let out = verify_cli(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("without its newline"), "{stdout}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // A session cuts it; the three charges stand.
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), good);
    assert_eq!(std::fs::read(head_path(&path)).unwrap(), head);
    assert_eq!(acc.ledger_entries().unwrap().len(), 3);
    assert_eq!(acc.budget_rows()[0].spent, spent);
    acc.admit("q3", &charge(0.2)).unwrap();
    drop(acc);
    assert!(verify_cli(&path).status.success());
}

#[test]
fn a_sidecar_behind_the_ledger_is_brought_up_to_date() {
    // A session died after its fsync'd append, before replacing the sidecar.
    let (path, _) = ledger("behind");
    let old_head = std::fs::read(head_path(&path)).unwrap();
    let acc = Accountant::open(&path).unwrap();
    acc.admit("q3", &charge(0.2)).unwrap();
    drop(acc);
    std::fs::write(head_path(&path), &old_head).unwrap();
    let out = verify_cli(&path);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("sidecar recorded 5 lines of 6"));
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.ledger_entries().unwrap().len(), 4);
    assert_ne!(std::fs::read(head_path(&path)).unwrap(), old_head);
}

#[test]
fn a_missing_sidecar_is_refused_until_the_owner_reseals() {
    let (path, _) = ledger("reseal");
    std::fs::remove_file(head_path(&path)).unwrap();
    refused(&path, &["sidecar", "is missing", "dpfusion ledger reseal"]);
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "reseal", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        Accountant::open(&path)
            .unwrap()
            .ledger_entries()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn ledger_subcommand_usage() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(args)
            .output()
            .unwrap()
    };
    let help = run(&["ledger", "--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("verify") && text.contains("migrate") && text.contains("reseal"));
    assert_eq!(run(&["ledger", "bogus"]).status.code(), Some(2));
    assert_eq!(run(&["ledger", "migrate"]).status.code(), Some(2));
    let missing = run(&["ledger", "verify", "/nonexistent/ledger.jsonl"]);
    assert_eq!(missing.status.code(), Some(1));
    // migrate from the command line: a format-1 ledger becomes one that verifies.
    let dir = temp_dir("migrate");
    let path = dir.join("old.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"record":"policy","key":"demo:t","name":"t","visibility":"private","#,
            r#""neighbours":"add_remove","public_columns":[],"budget":{"epsilon":5.0,"delta":1e-6}}"#,
            "\n"
        ),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    assert_eq!(run(&["ledger", "verify", p]).status.code(), Some(1));
    let m = run(&["ledger", "migrate", p]);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    assert!(run(&["ledger", "verify", p]).status.success());
    assert!(dir.join("old.jsonl.v1.bak").exists());
}

/// `ledger report -o FILE` writes a new file of the owner's (mode 0600) beside FILE and renames
/// it over FILE: whatever FILE was (a link, a hard link, a FIFO, another user's file) is
/// replaced, never opened for writing, and never one of the ledger's own files (round 46: a link
/// planted at the report's path made the report overwrite the ledger; review of the fixes: a
/// file another user owned kept their mode and received everyone's SQL, a FIFO hung the command,
/// a link in a directory on the way was followed). A refusal leaves no file behind.
#[test]
fn the_report_is_never_written_through_a_link_or_over_the_ledger() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (path, _) = ledger("report-link");
    let dir = path.parent().unwrap().to_path_buf();
    let before = snapshot(&path);
    // Run with a deadline: a FIFO opened for writing would block forever.
    let report = |out: &Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(["ledger", "report", path.to_str().unwrap(), "-o"])
            .arg(out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("ledger report -o {} hung", out.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    };
    let entries = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let is_report = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_file(), "{}", p.display());
        assert_eq!(
            m.mode() & 0o7777,
            0o600,
            "{}: the owner's alone",
            p.display()
        );
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(m.uid(), unsafe { libc::geteuid() }, "{}", p.display());
        assert_eq!(m.nlink(), 1, "{}", p.display());
        let html = std::fs::read_to_string(p).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..40]);
    };
    // The ledger's own files, by any name: refused, nothing written, nothing left.
    let link = dir.join("report.html");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let head = dir.join("head-link.html");
    std::os::unix::fs::symlink(head_path(&path), &head).unwrap();
    let hard = dir.join("hard.html");
    std::fs::hard_link(&path, &hard).unwrap();
    let listed = entries(&dir);
    for out in [
        link.clone(),
        head.clone(),
        hard.clone(),
        head_path(&path),
        path.to_path_buf(),
        // A name the ledger's files take (`<ledger>.<suffix>`), even before it exists.
        dir.join("ledger.jsonl.html"),
    ] {
        let o = report(&out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", out.display());
        assert!(
            err.contains("the ledger's own files"),
            "{}: {err}",
            out.display()
        );
        assert_eq!(snapshot(&path), before, "{}", out.display());
        assert_eq!(entries(&dir), listed, "{}: no file left", out.display());
    }
    // What sits at FILE is replaced, never written: a link to another file, a hard link, a
    // FIFO, an older report of the owner's, readable by others.
    let other = dir.join("other.txt");
    std::fs::write(&other, "someone else's").unwrap();
    let to_other = dir.join("to-other.html");
    std::os::unix::fs::symlink(&other, &to_other).unwrap();
    let hard_other = dir.join("hard-other.html");
    std::fs::hard_link(&other, &hard_other).unwrap();
    let fifo = dir.join("fifo.html");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let older = dir.join("older.html");
    std::fs::write(&older, "an older report, longer than nothing").unwrap();
    std::fs::set_permissions(&older, std::fs::Permissions::from_mode(0o644)).unwrap();
    let new = dir.join("new.html");
    for out in [&to_other, &hard_other, &fifo, &older, &new] {
        let o = report(out);
        assert!(
            o.status.success(),
            "{}: {}",
            out.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        is_report(out);
    }
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "someone else's");
    // Twice in place.
    assert!(report(&new).status.success());
    is_report(&new);
    assert!(
        !entries(&dir).iter().any(|e| e.ends_with(".tmp")),
        "{:?}",
        entries(&dir)
    );
    // A directory reached through a link that others could replace: refused, nothing made.
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mine = dir.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::os::unix::fs::symlink(&mine, shared.join("reports")).unwrap();
    let o = report(&shared.join("reports/r.html"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("symbolic link") && err.contains("chmod go-w"),
        "{err}"
    );
    assert!(entries(&mine).is_empty(), "{:?}", entries(&mine));
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(report(&shared.join("reports/r.html")).status.success());
    is_report(&mine.join("r.html"));
    // Another user's file at FILE (as root only: chown): replaced by the owner's own, theirs
    // left as it was under its other name.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = dir.join("theirs.html");
        std::fs::write(&theirs, "the analyst's").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
        let c = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 4242, 4242) }, 0);
        let kept = dir.join("kept-by-them");
        std::fs::hard_link(&theirs, &kept).unwrap();
        let o = report(&theirs);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        is_report(&theirs);
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the analyst's");
        assert_eq!(std::fs::metadata(&kept).unwrap().uid(), 4242);
    }
    assert_eq!(snapshot(&path), before);
}

// ---- Issue 27: the witness, the replaced-file check, the capped SQL, dp_ledger() per analyst ----

use dpfusion::{PrivateSession, Registration, SessionOptions};

/// A session on `dir/ledger/ledger.jsonl` (the default witness: `dir/ledger.witness/…`) with
/// the private `people` table.
async fn people_session(dir: &Path) -> PrivateSession {
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger").join("ledger.jsonl"))
            .with_default_budget(100.0, 1e-6)
            .with_target_partitions(2),
    )
    .await
    .unwrap();
    s.register_csv("people", &people_csv(), Registration::private())
        .await
        .unwrap();
    s
}

const DP: &str = "SELECT dp_count(id, 0.1) AS n FROM people";

#[tokio::test]
async fn a_ledger_rolled_back_with_its_sidecar_is_refused_by_the_witness() {
    let dir = temp_dir("witness");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let s = people_session(&dir).await;
    s.sql(DP).await.unwrap();
    // What an analyst who can write the ledger's directory keeps: a consistent older pair.
    let old = snapshot(&ledger);
    s.sql(DP).await.unwrap();
    s.sql(DP).await.unwrap();
    drop(s);
    std::fs::write(&ledger, old.0.unwrap()).unwrap();
    std::fs::write(head_path(&ledger), old.1.unwrap()).unwrap();
    // The pair alone verifies (the sidecar cannot tell)…
    assert!(dpfusion::accounting::verify(&ledger).is_ok());
    // …but the witness can: the session refuses to open, and so does `ledger verify` (with
    // the default witness, as the session used).
    let err = PrivateSession::open(SessionOptions::default().with_ledger(&ledger))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("but its witness") && err.contains("rolled back"),
        "{err}"
    );
    let out = verify_cli(&ledger);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("witness"), "{stderr}");
    let witness = dpfusion::accounting::default_witness(&ledger).unwrap();
    assert!(witness.starts_with(std::fs::canonicalize(&dir).unwrap().join("ledger.witness")));
    assert!(!witness.starts_with(std::fs::canonicalize(dir.join("ledger")).unwrap()));
}

/// Review r45: the same rollback with the sidecar deleted was reported only as a missing
/// sidecar, whose message suggests `ledger reseal`, and the reseal overwrote the witness: the
/// rolled-back charges were refunded. The witness is now checked first, and a reseal refuses
/// while the witness recorded more than the ledger holds.
#[tokio::test]
async fn a_rollback_with_the_sidecar_deleted_is_a_rollback_and_cannot_be_resealed() {
    let dir = temp_dir("witness-reseal");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let s = people_session(&dir).await;
    s.sql(DP).await.unwrap();
    let old = snapshot(&ledger);
    s.sql(DP).await.unwrap();
    drop(s);
    std::fs::write(&ledger, old.0.unwrap()).unwrap();
    std::fs::remove_file(head_path(&ledger)).unwrap();
    let err = PrivateSession::open(SessionOptions::default().with_ledger(&ledger))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("but its witness"), "{err}");
    assert!(!err.contains("ledger reseal"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "reseal", ledger.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("witness"), "{stderr}");
    assert!(!head_path(&ledger).exists(), "nothing written");
}

#[tokio::test]
async fn a_replaced_ledger_path_stops_admission() {
    let dir = temp_dir("replaced");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let s = people_session(&dir).await;
    s.sql(DP).await.unwrap();
    // Replaced by a copy (same bytes, another file): charges written now would go nowhere the
    // next process reads.
    let copy = ledger.with_file_name("copy");
    std::fs::copy(&ledger, &copy).unwrap();
    std::fs::rename(&copy, &ledger).unwrap();
    let before = snapshot(&ledger);
    let err = s.sql(DP).await.unwrap_err().to_string();
    assert!(err.contains("was replaced"), "{err}");
    assert!(s.sql(DP).await.is_err(), "for good");
    assert_eq!(snapshot(&ledger), before, "nothing was charged");
}

#[tokio::test]
async fn a_1_mib_comment_adds_at_most_4_4_kib_to_the_ledger() {
    let dir = temp_dir("cap");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let s = people_session(&dir).await;
    let len = || std::fs::metadata(&ledger).unwrap().len();
    // The same charge with a short text: what a charge costs besides its text (the table's
    // key is this checkout's path, so it is measured, not assumed).
    let before = len();
    s.sql("SELECT dp_count(id, 0.01) AS n FROM people")
        .await
        .unwrap();
    let short = len() - before;
    // 1 MiB (the session's limit on a statement) of ESC characters: 6 bytes each in JSON.
    let q = format!(
        "SELECT dp_count(id, 0.01) AS n FROM people -- {}",
        "\u{1b}".repeat((1 << 20) - 100)
    );
    let before = len();
    s.sql(&q).await.unwrap();
    let added = len() - before;
    let cap = dpfusion::accounting::QUERY_CAP as u64;
    assert!(
        added <= short + cap + 16,
        "{added} bytes, {short} for a short text"
    );
    assert!(added - short <= 4300, "{added} - {short}");
    let e = s.ledger().unwrap().pop().unwrap();
    assert!(e.query.len() <= dpfusion::accounting::QUERY_CAP);
    assert_eq!(e.query_bytes, Some(q.len() as u64));
    assert!(dpfusion::accounting::verify(&ledger).is_ok());
}

#[tokio::test]
async fn dp_ledger_shows_an_analyst_their_own_sql_and_nothing_of_others() {
    use datafusion::arrow::array::{Array, AsArray};
    let dir = temp_dir("visibility");
    let s = people_session(&dir).await;
    let alice_q = "SELECT dp_count(id, 0.1) AS n FROM people -- alice's secret";
    let bob_q = "SELECT dp_count(id, 0.1) AS n FROM people -- bob's secret";
    s.sql_as("alice", alice_q).await.unwrap();
    s.sql_as("bob", bob_q).await.unwrap();
    s.sql("SELECT dp_count(id, 0.1) AS n FROM people -- the owner's")
        .await
        .unwrap();
    let view = |r: dpfusion::QueryResult| -> Vec<(Option<String>, Option<String>)> {
        let mut out = Vec::new();
        for b in &r.batches {
            let q = b.column_by_name("query").unwrap().as_string::<i32>();
            let h = b.column_by_name("query_sha256").unwrap().as_string::<i32>();
            for i in 0..b.num_rows() {
                out.push((
                    q.is_valid(i).then(|| q.value(i).to_string()),
                    h.is_valid(i).then(|| h.value(i).to_string()),
                ));
            }
        }
        out
    };
    let sha = |t: &str| {
        use sha2::Digest;
        hex_of(&sha2::Sha256::digest(t.as_bytes()))
    };
    const LEDGER: &str = "SELECT query, query_sha256 FROM dp_ledger() ORDER BY seq";
    let alice = view(s.sql_as("alice", LEDGER).await.unwrap());
    assert_eq!(alice.len(), 3);
    assert_eq!(alice[0], (Some(alice_q.to_string()), Some(sha(alice_q))));
    // Not even an unsalted hash of another's query, which would confirm a guess at it (round
    // 46): the hash of bob's query is not in what alice sees, nor the owner's.
    assert_eq!(alice[1], (None, None));
    assert_eq!(alice[2], (None, None));
    let bob = view(s.sql_as("bob", LEDGER).await.unwrap());
    assert_eq!(bob[0], (None, None));
    assert_eq!(bob[1], (Some(bob_q.to_string()), Some(sha(bob_q))));
    // The owner's own view (no analyst) shows every text and hash.
    let owner = view(s.sql(LEDGER).await.unwrap());
    assert!(owner.iter().all(|(q, h)| q.is_some() && h.is_some()));
    assert_eq!(owner[1], (Some(bob_q.to_string()), Some(sha(bob_q))));
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A ledger long enough for a checkpoint (docs/LEDGER.md, "Checkpoints"), kept with `witness`.
fn checkpointed(path: &Path, witness: &Path) {
    let acc = Accountant::open_witnessed(path, witness).unwrap();
    acc.register_table(policy(1e6)).unwrap();
    for i in 0..300 {
        acc.admit(&format!("q{i}"), &charge(0.01)).unwrap();
    }
    drop(acc);
    // The next session replays it from line 1 and writes the checkpoint.
    drop(Accountant::open_witnessed(path, witness).unwrap());
    assert!(checkpoint_path(path).exists());
}

#[test]
fn the_witness_still_detects_a_rolled_back_or_replaced_ledger_with_a_checkpoint() {
    let dir = temp_dir("cp-witness");
    let path = dir.join("l").join("ledger.jsonl");
    let wp = dir.join("w").join("ledger.jsonl.witness");
    checkpointed(&path, &wp);
    let files = [path.clone(), head_path(&path), checkpoint_path(&path)];
    let old: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    let spent = acc.budget_rows()[0].spent;
    acc.admit("later", &charge(0.01)).unwrap();
    drop(acc);
    // Started from the checkpoint: the same budget as the session that replayed everything.
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    assert!(acc.budget_rows()[0].spent > spent);
    assert_eq!(acc.ledger_entries().unwrap().len(), 301);
    drop(acc);
    // Rolled back with its sidecar and its checkpoint to a consistent older triple: refused.
    for (f, b) in files.iter().zip(&old) {
        std::fs::write(f, b).unwrap();
    }
    let err = Accountant::open_witnessed(&path, &wp)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("but its witness") && err.contains("rolled back"),
        "{err}"
    );
    // Replaced by another ledger with its own checkpoint: refused.
    let other = dir.join("o").join("ledger.jsonl");
    checkpointed(&other, &dir.join("ow").join("x.witness"));
    for (f, o) in files
        .iter()
        .zip([other.clone(), head_path(&other), checkpoint_path(&other)])
    {
        std::fs::copy(o, f).unwrap();
    }
    let err = Accountant::open_witnessed(&path, &wp)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("belongs to another ledger"), "{err}");
}

/// The temporary files of the sidecar, the witness and the checkpoint are created with
/// `O_CREAT | O_EXCL | O_NOFOLLOW` after removing what is at their name: a symbolic link
/// planted there (e.g. to a file of the data owner's) is never written through.
#[cfg(unix)]
#[test]
fn a_symlink_planted_at_a_temporary_file_is_not_written_through() {
    let dir = temp_dir("tmp-nofollow");
    let path = dir.join("l").join("ledger.jsonl");
    let wp = dir.join("w").join("ledger.jsonl.witness");
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    acc.register_table(policy(1e6)).unwrap();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "the owner's file\n").unwrap();
    let tmps = [
        dir.join("l").join("ledger.jsonl.head.tmp"),
        dir.join("w").join("ledger.jsonl.witness.tmp"),
        dir.join("l").join("ledger.jsonl.checkpoint.tmp"),
    ];
    for t in &tmps {
        std::os::unix::fs::symlink(&victim, t).unwrap();
    }
    for i in 0..300 {
        acc.admit(&format!("q{i}"), &charge(0.01)).unwrap();
    }
    drop(acc);
    // The next session writes the checkpoint (through its temporary file).
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    assert!(checkpoint_path(&path).exists());
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "the owner's file\n"
    );
    for t in &tmps {
        assert!(std::fs::symlink_metadata(t).is_err(), "{}", t.display());
    }
    assert_eq!(acc.ledger_entries().unwrap().len(), 300);
    assert!(
        !std::fs::symlink_metadata(head_path(&path))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A session started from a checkpoint lists the charges before it by reading the ledger; when
/// that part does not verify (a line before the checkpoint edited), the listing (and
/// `dp_ledger()`) is an error naming the line, never the shorter list since the checkpoint.
#[tokio::test]
async fn dp_ledger_fails_loudly_when_the_part_before_the_checkpoint_does_not_verify() {
    let dir = temp_dir("cp-prefix");
    let path = dir.join("l").join("ledger.jsonl");
    let wp = dir.join("w").join("ledger.jsonl.witness");
    checkpointed(&path, &wp);
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    assert_eq!(acc.ledger_entries().unwrap().len(), 300);
    drop(acc);
    // Edit the text of a charge before the checkpoint, same length (its chain no longer holds).
    let mut l = lines(&path);
    let at = l
        .iter()
        .position(|x| x.contains("\"query\":\"q17\""))
        .unwrap();
    l[at] = l[at].replace("\"query\":\"q17\"", "\"query\":\"q71\"");
    write_lines(&path, &l);
    let acc = Accountant::open_witnessed(&path, &wp).unwrap();
    // Admission and SHOW BUDGET go on from the checkpoint (the lines since it verify)…
    assert!(acc.budget_rows()[0].spent > 0.0);
    // …the listing does not.
    let err = acc.ledger_entries().unwrap_err();
    assert!(
        matches!(err, AccountingError::Corrupt { line, .. } if line as usize == at + 2),
        "{err}"
    );
    drop(acc);
    // Through SQL too.
    let s = PrivateSession::open(SessionOptions::default().with_ledger(path.clone()))
        .await
        .unwrap();
    let err = s
        .sql("SELECT * FROM dp_ledger()")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("is corrupt at line {}", at + 2)),
        "{err}"
    );
    assert!(s.ledger().is_err());
    // `dpfusion ledger verify` refuses the ledger, naming the edited line.
    assert!(dpfusion::accounting::verify(&path).is_err());
}

/// Round 46, F2: a single-user run in a directory that others can write (the default ledger is
/// `./.dpfusion/ledger.jsonl`, its witness `./.dpfusion.witness/…`): whoever can write it moves
/// both aside and the next run started a new ledger, every budget at zero. The binary refuses to
/// open a ledger there, creates nothing, and says why and what to do; a sticky directory (like
/// /tmp) or one only the owner can write is fine.
#[cfg(unix)]
#[test]
fn a_ledger_in_a_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = temp_dir("ledger-shared-dir");
    let shared = root.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let chmod = |m| std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(m)).unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(["-c", "SHOW BUDGET"])
            .current_dir(&shared)
            .env("DPFUSION_HISTORY", root.join("history"))
            .output()
            .unwrap()
    };
    chmod(0o777);
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("others can write"), "{stderr}");
    assert!(stderr.contains("every budget at zero"), "{stderr}");
    assert!(stderr.contains("chmod go-w"), "says what to do: {stderr}");
    assert!(!shared.join(".dpfusion").exists(), "nothing created");
    assert!(
        !shared.join(".dpfusion.witness").exists(),
        "nothing created"
    );
    chmod(0o1777);
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    chmod(0o755);
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shared.join(".dpfusion/ledger.jsonl").exists());
}

/// Round 46, F1 of the review of its fixes, with two processes of the owner on one ledger: a
/// REPL serves a directory as public; another run registers a file inside it as private (its
/// own key: accepted). The REPL's next statement on the directory is refused instead of
/// printing that file's rows.
#[test]
fn a_running_repl_stops_serving_a_directory_once_another_process_makes_a_file_in_it_private() {
    use std::io::{BufRead, Write};
    let root = temp_dir("files-now-private-cli");
    let data = root.join("data");
    std::fs::create_dir(&data).unwrap();
    for (f, rows) in [("a.csv", "1,11\n2,17\n3,21\n"), ("b.csv", "7,70\n")] {
        std::fs::write(data.join(f), format!("uid,x\n{rows}")).unwrap();
    }
    let ledger = root.join("m/ledger.jsonl");
    let dpfusion = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dpfusion"));
        c.arg("--ledger")
            .arg(&ledger)
            .args(args)
            .current_dir(&root)
            .env("DPFUSION_HISTORY", root.join("history"));
        c
    };
    let mut repl = dpfusion(&["--public", "d=data"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = repl.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = repl.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(what) => return,
                Ok(_) => {}
                Err(e) => panic!("the REPL did not print {what:?}: {e}"),
            }
        }
    };
    writeln!(stdin, "SELECT x FROM d WHERE uid = 2;").unwrap();
    wait_for("17");
    let out = dpfusion(&["--private", "a=data/a.csv", "-c", "SHOW TABLES"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "another key: accepted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    writeln!(stdin, "SELECT x FROM d WHERE uid = 2;").unwrap();
    writeln!(stdin, "\\q").unwrap();
    drop(stdin);
    let out = repl.wait_with_output().unwrap();
    let seen: Vec<String> = rx.iter().collect();
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "public table 'd' reads files that the ledger now holds as files of private table 'a'"
        ),
        "{stderr}\n{seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("17")),
        "a.csv's rows are not printed again: {seen:?}"
    );
}

/// Round 46, F2 of the review of its fixes: the same file under two names, the second with a
/// privacy unit. The run is refused at the second registration, saying what to do, and the
/// ledger records nothing of the unit; under one policy the two names run together.
#[test]
fn one_file_under_two_names_with_two_policies_is_refused_at_registration() {
    let root = temp_dir("two-names-cli");
    let people = crate::common::people_csv();
    let (t1, t2) = (
        format!("t1={}", people.display()),
        format!("t2={}", people.display()),
    );
    let ledger = root.join("ledger.jsonl");
    let dpfusion = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .arg("--ledger")
            .arg(&ledger)
            .args(args)
            .current_dir(&root)
            .env("DPFUSION_HISTORY", root.join("history"))
            .output()
            .unwrap()
    };
    let q = "SELECT (SELECT dp_count(salary, 0.5) FROM t2) AS a, \
             (SELECT dp_count(salary, 0.5) FROM t1) AS b";
    let out = dpfusion(&[
        "--private",
        &t1,
        "--private",
        &t2,
        "--privacy-unit",
        "t2=id",
        "-c",
        q,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("as table 't1'"), "{stderr}");
    assert!(stderr.contains("privacy unit: row → id"), "{stderr}");
    assert!(
        stderr.contains("Register the file under one name"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&ledger).unwrap();
    assert!(!text.contains("\"unit\""), "no unit recorded: {text}");
    assert!(
        !text.contains("\"record\":\"charge\""),
        "nothing charged: {text}"
    );
    let out = dpfusion(&["--private", &t1, "--private", &t2, "-c", q]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- Round 47 (review "newuser", findings 1-3): the owner's tools show SHOW BUDGET's numbers ----

/// One table's numbers as `SHOW BUDGET` gives them.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    epsilon: f64,
    delta: f64,
    filter: String,
    used_pct: f64,
    left_pct: f64,
    remaining_epsilon: f64,
    spent_delta: f64,
    remaining_delta: f64,
    queries: u64,
}

/// `SHOW BUDGET`'s rows by table name.
async fn show_budget(s: &PrivateSession) -> std::collections::BTreeMap<String, Shown> {
    use datafusion::arrow::util::display::array_value_to_string;
    let r = s.sql("SHOW BUDGET").await.unwrap();
    let mut out = std::collections::BTreeMap::new();
    for b in &r.batches {
        let col = |name: &str, i: usize| {
            array_value_to_string(b.column_by_name(name).unwrap(), i).unwrap()
        };
        for i in 0..b.num_rows() {
            let f = |name: &str| col(name, i).parse::<f64>().unwrap();
            out.insert(
                col("table", i),
                Shown {
                    epsilon: f("epsilon"),
                    delta: f("delta"),
                    filter: col("filter", i),
                    used_pct: f("used_pct"),
                    left_pct: f("left_pct"),
                    remaining_epsilon: f("remaining_epsilon"),
                    spent_delta: f("spent_delta"),
                    remaining_delta: f("remaining_delta"),
                    queries: col("queries", i).parse().unwrap(),
                },
            );
        }
    }
    out
}

/// A percentage as the tools print it (`3.9266%`, `< 0.0001%` is 0) in millionths.
fn millionths(pct: &str) -> u64 {
    let p = pct.trim().trim_end_matches('%');
    if p.starts_with('<') {
        return 0;
    }
    let (whole, frac) = p.split_once('.').unwrap_or((p, ""));
    whole.parse::<u64>().unwrap() * 10_000 + format!("{frac:0<4}").parse::<u64>().unwrap()
}

/// The text of each `<td>` of the first row of `html` after `from` (tags removed).
fn cells_after(html: &str, from: &str) -> Vec<String> {
    let start = html
        .find(from)
        .unwrap_or_else(|| panic!("{from} not in the report"));
    let row = &html[start..];
    let row = &row[..row.find("</tr>").unwrap()];
    row.split("<td")
        .skip(1)
        .map(|c| {
            let c = &c[c.find('>').unwrap() + 1..];
            let c = &c[..c.rfind("</td>").unwrap_or(c.len())];
            // Tags out; text kept.
            let mut text = String::new();
            let mut in_tag = false;
            for ch in c.chars() {
                match ch {
                    '<' => in_tag = true,
                    '>' => in_tag = false,
                    c if !in_tag => text.push(c),
                    _ => {}
                }
            }
            text
        })
        .collect()
}

/// Round 47 (review "newuser", findings 1-3): `dpfusion ledger verify` and `ledger report`
/// showed an "ε spent" (the filter's conversion of the running sum, not a guarantee) that
/// disagreed with SHOW BUDGET by large factors, summed per-charge ε by analyst (6.67 on a budget
/// of 5), showed a lowered budget as the table's guarantee, rounded ε to nearest and gave public
/// tables a budget. A quickstart-like sequence on a gdp, a zcdp and an rdp table (Gaussian,
/// Laplace, partition selection, two analysts), one budget lowered by the owner: both tools show,
/// for every table, exactly the numbers SHOW BUDGET and `PrivateSession::budget()` show; the
/// lowered table's guarantee is the larger budget; the shares by analyst and of the charges add
/// up to the share used.
#[tokio::test]
async fn ledger_verify_and_report_show_the_numbers_show_budget_shows() {
    use dpfusion::accounting::FilterKind;
    let dir = temp_dir("r47-numbers");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for t in ["g", "z", "r"] {
        std::fs::copy(people_csv(), data.join(format!("{t}.csv"))).unwrap();
    }
    let open = || async {
        PrivateSession::open(
            SessionOptions::default()
                .with_ledger(&ledger)
                .with_target_partitions(2),
        )
        .await
        .unwrap()
    };
    let csv = |t: &str| data.join(format!("{t}.csv"));
    let gdp = |eps: f64| {
        Registration::private()
            .filter(FilterKind::Gdp)
            .budget(eps, 1e-6)
    };
    // z and r, as each session registers them.
    async fn z_and_r(s: &PrivateSession, data: &std::path::Path) {
        s.register_csv(
            "z",
            data.join("z.csv"),
            Registration::private()
                .filter(FilterKind::Zcdp)
                .budget(5.0, 1e-6),
        )
        .await
        .unwrap();
        s.register_csv(
            "r",
            data.join("r.csv"),
            Registration::private()
                .replace()
                .public_columns(["dept"])
                .filter(FilterKind::Rdp { order: None })
                .budget(5.0, 1e-6),
        )
        .await
        .unwrap();
    }
    let s = open().await;
    s.register_csv("g", &csv("g"), gdp(5.0)).await.unwrap();
    z_and_r(&s, &data).await;
    s.register_csv("depts", &depts_csv(), Registration::public())
        .await
        .unwrap();
    for (who, q) in [
        (
            "alice",
            "SELECT dp_count(id, epsilon => 0.25) AS n, \
             dp_mean(salary, lower => 0, upper => 300000, epsilon => 0.5) AS m FROM g",
        ),
        (
            "bob",
            "SELECT dp_sum(salary, 0, 300000, 1.0) AS total FROM g",
        ),
        (
            "alice",
            "SELECT dept, dp_mean(salary, 0, 300000, 0.5) AS m FROM z GROUP BY dept",
        ),
        (
            "bob",
            "SELECT dp_count(id, epsilon => 0.3, mechanism => 'laplace') AS n FROM z",
        ),
        (
            "alice",
            "SELECT dept, dp_mean(salary, 0, 300000, 0.5) AS m FROM r GROUP BY dept",
        ),
        (
            "bob",
            "SELECT dp_count(salary, 0.25) AS n, dp_count(id, epsilon => 0.0001) AS tiny FROM r",
        ),
    ] {
        s.sql_as(who, q)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    drop(s);
    // The owner lowers g's budget (stricter: recorded without a relaxation); one more charge.
    // z and r are registered again as they were: SHOW BUDGET shows the tables a session serves
    // (round 49).
    let s = open().await;
    s.register_csv("g", &csv("g"), gdp(2.0)).await.unwrap();
    z_and_r(&s, &data).await;
    s.sql_as("bob", "SELECT dp_count(id, 0.1) AS n FROM g")
        .await
        .unwrap();
    let shown = show_budget(&s).await;
    let rows = s.budget();
    drop(s);
    assert_eq!(shown.len(), 3, "{shown:?}");
    // SHOW BUDGET's guarantee for g is the larger budget, what is left against the lower one.
    assert_eq!(shown["g"].epsilon, 5.0);
    assert!(shown["g"].used_pct > 0.0 && shown["z"].spent_delta > 0.0);

    // The library's verify: the same rows as PrivateSession::budget().
    let r = dpfusion::accounting::verify(&ledger).unwrap();
    for row in &rows {
        let t = r.tables.iter().find(|t| t.key == row.key).unwrap();
        let b = t
            .budget_row
            .as_ref()
            .expect("a private table has its budget row");
        assert_eq!(
            (b.epsilon, b.delta, b.remaining, b.delta_spent, b.delta_left),
            (
                row.epsilon,
                row.delta,
                row.remaining,
                row.delta_spent,
                row.delta_left
            ),
            "{}",
            row.name
        );
        assert_eq!(b.native, row.native, "{}", row.name);
        assert_eq!((b.queries, b.filter), (row.queries, row.filter));
    }
    let depts = r.tables.iter().find(|t| t.name == "depts").unwrap();
    assert!(depts.budget_row.is_none(), "a public table has no budget");

    // `dpfusion ledger verify`: its columns against SHOW BUDGET's.
    let out = verify_cli(&ledger);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains("spent ε"), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("  table "))
        .unwrap();
    let cols: Vec<&str> = lines[header]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let verify_rows: std::collections::BTreeMap<String, Vec<String>> = lines[header + 1..]
        .iter()
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let c: Vec<String> = l
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            assert_eq!(c.len(), cols.len(), "{l}");
            (c[0].clone(), c)
        })
        .collect();
    let at =
        |row: &[String], name: &str| row[cols.iter().position(|c| *c == name).unwrap()].clone();
    for (name, b) in &shown {
        let v = &verify_rows[name];
        assert_eq!(at(v, "filter"), b.filter, "{name}");
        assert_eq!(
            at(v, "guarantee"),
            format!(
                "ε={} δ={}",
                display::budget(b.epsilon),
                display::budget(b.delta)
            ),
            "{name}: the guarantee is SHOW BUDGET's epsilon and delta, as the owner wrote them"
        );
        assert_eq!(
            millionths(&at(v, "used")) as f64 / 1e4,
            b.used_pct,
            "{name}"
        );
        assert_eq!(
            millionths(&at(v, "left")) as f64 / 1e4,
            b.left_pct,
            "{name}"
        );
        assert_eq!(
            at(v, "next ε").parse::<f64>().unwrap(),
            b.remaining_epsilon,
            "{name}"
        );
        assert_eq!(
            at(v, "δ sel. spent").parse::<f64>().unwrap(),
            b.spent_delta,
            "{name}"
        );
        assert_eq!(
            at(v, "δ sel. left").parse::<f64>().unwrap(),
            b.remaining_delta,
            "{name}"
        );
        assert_eq!(at(v, "charges"), b.queries.to_string(), "{name}");
    }
    // The lowered budget: the guarantee 5, the budget in force 2.
    assert_eq!(at(&verify_rows["g"], "guarantee"), "ε=5 δ=1e-6");
    assert_eq!(at(&verify_rows["g"], "in force"), "ε=2 δ=1e-6");
    // A public table shows no budget.
    let d = &verify_rows["depts"];
    assert_eq!(at(d, "visibility"), "public");
    for c in ["filter", "guarantee", "in force", "used", "left", "next ε"] {
        assert_eq!(at(d, c), "-", "{c}: {stdout}");
    }

    // `dpfusion ledger report`: the summary row of each table, its charges and the shares by
    // analyst against SHOW BUDGET's.
    let html_path = dir.join("out").join("report.html");
    std::fs::create_dir_all(html_path.parent().unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "report", ledger.to_str().unwrap(), "-o"])
        .arg(&html_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(
        !html.contains("spent ε") && !html.contains("ε of"),
        "no ε per charge or spent"
    );
    assert!(!html.contains(">depts<"), "a public table has no section");
    for (name, b) in &shown {
        let row = rows.iter().find(|r| &r.name == name).unwrap();
        let anchor = format!("\">{name}</a></td>");
        let c = cells_after(&html, &anchor);
        // guarantee ε, guarantee δ, in force, filter, used, left, next ε, δ spent, δ left, charges
        assert_eq!(c[0].parse::<f64>().unwrap(), b.epsilon, "{name}: {c:?}");
        assert_eq!(c[1].parse::<f64>().unwrap(), b.delta, "{name}: {c:?}");
        assert_eq!(c[3], b.filter, "{name}");
        assert_eq!(millionths(&c[4]) as f64 / 1e4, b.used_pct, "{name}");
        assert_eq!(millionths(&c[5]) as f64 / 1e4, b.left_pct, "{name}");
        assert_eq!(c[6].parse::<f64>().unwrap(), b.remaining_epsilon, "{name}");
        assert_eq!(c[7].parse::<f64>().unwrap(), b.spent_delta, "{name}");
        assert_eq!(c[8].parse::<f64>().unwrap(), b.remaining_delta, "{name}");
        assert_eq!(c[9], b.queries.to_string(), "{name}");
        // The table's section: the shares of its charges, and by analyst, add up to its share
        // used (sums of shares of the filter's budget, never of per-charge ε).
        let section = &html[html.find(&format!(">Table {name}</h2>")).unwrap()..];
        let section = &section[..section[1..].find("<h2").map_or(section.len(), |i| i + 1)];
        let used = row.native.used_share;
        let by_analyst: u64 = ["alice", "bob"]
            .iter()
            .filter(|a| section.contains(&format!("<tr><td>{a}</td>")))
            .map(|a| millionths(&cells_after(section, &format!("<tr><td>{a}</td>"))[3]))
            .sum();
        assert_eq!(by_analyst, used, "{name}: by analyst");
        let charges = &section[section.find("<h3>Charges</h3>").unwrap()..];
        let shares: u64 = charges
            .split("<tr><td class=\"n\">")
            .skip(1)
            .map(|r| millionths(&cells_after(&format!("<tr><td>{r}"), "<tr>")[5]))
            .sum();
        assert_eq!(shares, used, "{name}: the charges' shares");
        assert!(used <= SHARE_SCALE);
    }
    // The lowered budget: the guarantee 5, the budget in force 2.
    let g = &html[html.find(">Table g</h2>").unwrap()..];
    assert!(
        g.contains("budget ε 5 at δ 1e-6 (the guarantee") && g.contains("in force now ε 2, δ 1e-6"),
        "{}",
        &g[..g.find("</p>").unwrap()]
    );
}

/// Round 47, review "newuser2": B, a table charged up to the advertised next ε never shows
/// `used` at or above its budget while something is left (`2.81392 of 2.81391`); C, a budget
/// nobody lowered shows the same guarantee and budget in force, as the owner wrote it
/// (`1.0000001`, not `1.00001` and `1`); A, `verify` says at which δ its next ε is; G, a table
/// made public after it was charged keeps its charges, SQL and guarantee in `ledger report`.
#[tokio::test]
async fn ledger_tools_show_budgets_as_written_and_keep_a_table_made_public() {
    let dir = temp_dir("r47-newuser2");
    let ledger = dir.join("ledger").join("ledger.jsonl");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for t in ["s", "p"] {
        std::fs::copy(people_csv(), data.join(format!("{t}.csv"))).unwrap();
    }
    let open = || async {
        PrivateSession::open(
            SessionOptions::default()
                .with_ledger(&ledger)
                .with_target_partitions(2),
        )
        .await
        .unwrap()
    };
    let s = open().await;
    s.register_csv(
        "s",
        &data.join("s.csv"),
        Registration::private().budget(1.0000001, 1.0000001e-6),
    )
    .await
    .unwrap();
    s.register_csv(
        "p",
        &data.join("p.csv"),
        Registration::private().budget(5.0, 1e-6),
    )
    .await
    .unwrap();
    // Spend s up to the next ε SHOW BUDGET advertises, then once more: as close to the budget
    // as admission goes.
    for _ in 0..2 {
        let next = show_budget(&s).await["s"].remaining_epsilon;
        if next == 0.0 {
            break;
        }
        s.sql(&format!(
            "SELECT dp_count(id, epsilon => {next}) AS n FROM s"
        ))
        .await
        .unwrap();
    }
    s.sql("SELECT dp_count(id, epsilon => 1) AS n FROM p")
        .await
        .unwrap();
    let row = s.budget().into_iter().find(|r| r.name == "s").unwrap();
    drop(s);
    // The owner publishes p.
    let s = open().await;
    s.register_csv(
        "p",
        &data.join("p.csv"),
        Registration::public().relax("published"),
    )
    .await
    .unwrap();
    drop(s);

    let out = verify_cli(&ledger);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    let s_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("s "))
        .unwrap();
    assert_eq!(
        s_line.matches("ε=1.0000001 δ=1.0000001e-6").count(),
        2,
        "guarantee and budget in force as written, equal: {s_line}"
    );
    assert!(
        stdout.contains("next ε: the largest ε of one more Gaussian call at δ 1e-7"),
        "{stdout}"
    );

    let html_path = dir.join("out").join("report.html");
    std::fs::create_dir_all(html_path.parent().unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "report", ledger.to_str().unwrap(), "-o"])
        .arg(&html_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&html_path).unwrap();
    let section = &html[html.find(">Table s</h2>").unwrap()..];
    let para = &section[..section.find("</p>").unwrap()];
    assert!(
        para.contains("budget ε 1.0000001 at δ 1.0000001e-6")
            && para.contains("in force now ε 1.0000001, δ 1.0000001e-6"),
        "{para}"
    );
    // "used <unit> X of Y": X < Y while the true amount used is below the budget.
    let used = &para[para.find(" filter: used ").unwrap() + " filter: used ".len()..];
    let mut words = used.split_whitespace().skip(1);
    let x: f64 = words.next().unwrap().parse().unwrap();
    assert_eq!(words.next(), Some("of"));
    let y: f64 = words.next().unwrap().parse().unwrap();
    assert!(row.native.used < row.native.budget, "{row:?}");
    assert!(
        row.native.used <= x && x < y && y <= row.native.budget,
        "{x} of {y}: {para}"
    );
    assert!(
        !para.contains("(100% used") && !para.contains(" 0% left"),
        "{para}"
    );
    // p, now public, keeps its charge, its SQL and its guarantee.
    let p = &html[html.find(">Table p</h2>").expect("p's section stays")..];
    let p = &p[..p[1..].find("<h2").map_or(p.len(), |i| i + 1)];
    assert!(
        p.contains("now public") && p.contains("ε 5 at δ 1e-6"),
        "{p}"
    );
    assert!(
        p.contains("dp_count(id, epsilon =&gt; 1)") || p.contains("dp_count(id, epsilon => 1)"),
        "{p}"
    );
}
