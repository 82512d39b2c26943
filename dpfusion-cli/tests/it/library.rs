//! The library an embedder depends on (`dpfusion` with its default features) compiles no terminal
//! or gRPC stack (issue 31): the REPL is this crate's, `dpfusion serve` behind the library's
//! feature `serve`. `.ci/run` checks the same with `cargo tree`; this test runs it when cargo can
//! answer (it is skipped, saying why, without cargo or when the package cache stays locked by
//! another build for a minute).
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The package names `cargo tree -e normal` lists for `package` (default features), or why not.
fn normal_dependencies(package: &str) -> Result<Vec<String>, String> {
    let mut child = Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--offline", "--color", "never"])
        .current_dir(crate::common::repo_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("cargo tree did not answer within a minute".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader.join().expect("reader");
    if !status.success() {
        return Err(format!("cargo tree failed ({status})"));
    }
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

#[test]
fn the_library_has_no_terminal_or_grpc_dependency() {
    let (library, cli) = match (
        normal_dependencies("dpfusion"),
        normal_dependencies("dpfusion-cli"),
    ) {
        (Ok(l), Ok(c)) => (l, c),
        (Err(why), _) | (_, Err(why)) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    assert!(library.iter().any(|n| n == "datafusion"), "{library:?}");
    for name in ["rustyline", "tonic", "arrow-flight", "prost"] {
        assert!(
            !library.iter().any(|n| n == name),
            "the library depends on {name}"
        );
        // The same listing sees them where they belong: the check can fail.
        assert!(
            cli.iter().any(|n| n == name),
            "dpfusion-cli lists no {name}"
        );
    }
}
