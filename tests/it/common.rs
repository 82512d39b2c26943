//! Helpers shared by the integration tests of both crates: `dpfusion`'s (tests/it) and
//! `dpfusion-cli`'s (dpfusion-cli/tests/it includes this file with `#[path]`).
#![allow(dead_code)]
use std::path::{Path, PathBuf};

#[path = "../../src/testdir.rs"]
mod testdir;
#[allow(unused_imports)]
pub use testdir::{TestPath, test_dir, test_dir_in, test_file};

/// The repository's root (the workspace: tests/data, examples/, docs/, scripts/), from either
/// crate's tests.
pub fn repo_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if here.join("Cargo.lock").exists() {
        here
    } else {
        here.parent()
            .expect("dpfusion-cli lies inside the workspace")
    }
}

/// A fresh directory under the system's temp dir, removed when dropped ([`test_dir`]).
pub fn temp_dir(tag: &str) -> TestPath {
    test_dir(&format!("test-{tag}"))
}

/// The 200-row private test table: id, age, dept, salary, remote.
pub fn people_csv() -> PathBuf {
    repo_root().join("tests/data/people.csv")
}

/// The public departments table: dept, floor.
pub fn depts_csv() -> PathBuf {
    repo_root().join("tests/data/depts.csv")
}

/// The lines of a text file (a ledger).
pub fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The unit-level test table (customer, store, amount): 669 purchases of customers.
pub fn purchases_csv() -> PathBuf {
    repo_root().join("tests/data/purchases.csv")
}

/// The address a `dpfusion serve` child prints on its first line (`… grpc://ADDR …`), waited for
/// at most `wait`; its stdout stays drained. Kills the child and panics (with its stderr when
/// piped) if it does not start.
pub fn server_address(
    child: &mut std::process::Child,
    wait: std::time::Duration,
) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Read};
    let stdout = child.stdout.take().expect("the server's stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {} // keep the pipe drained
    });
    let Ok(line) = rx.recv_timeout(wait) else {
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("the server did not start: {err}");
    };
    line.split("://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .parse()
        .unwrap()
}
