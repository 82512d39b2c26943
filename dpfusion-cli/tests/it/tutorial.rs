//! The tutorial (docs/tutorial.py, issue 33) executed: a `dpfusion serve` on a fresh copy of the
//! example catalog (examples/catalog, its own empty ledger), the script run in the venv of
//! `scripts/setup-venv-serve.sh` with the server's URL and an analyst's token; it must exit 0
//! and write its budget plot.

use std::path::Path;
use std::process::Command;

use dpfusion::serve::auth::TokenHash;

const TOKEN: &str = "tutorial-0123456789abcdef0123456789abcdef";

/// Copies `from` (a directory of files) to `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tutorial_runs_from_the_example_catalog_to_a_budget_plot() {
    let Some(python) = crate::serve::python_or_skip("the tutorial") else {
        return;
    };
    let root = crate::common::repo_root();
    let example = root.join("examples/catalog");
    // The example catalog as the owner wrote it, beside copies of its files, with a fresh
    // ledger, one analyst and a free loopback port.
    let dir = crate::common::temp_dir("tutorial");
    copy_dir(&example.join("data"), &dir.join("data"));
    copy_dir(&example.join("public"), &dir.join("public"));
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let text = std::fs::read_to_string(example.join("dpfusion.toml")).unwrap();
    assert!(
        text.contains("ledger = \".dpfusion/ledger.jsonl\""),
        "{text}"
    );
    let catalog = dir.join("dpfusion.toml");
    std::fs::write(
        &catalog,
        format!(
            "{text}\n[[analyst]]\nname = \"tutor\"\ntoken_hash = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:0\"\n",
            TokenHash::new(TOKEN)
        ),
    )
    .unwrap();
    let bound = dpfusion::serve::cmd::bind_catalog(&catalog, None)
        .await
        .unwrap();
    let addr = bound.addr();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));

    let plot = dir.join("budget.svg");
    let mut cmd = Command::new("timeout");
    cmd.arg("120")
        .arg(&python)
        .arg(root.join("docs/tutorial.py"))
        .current_dir(&dir)
        .env("DPFUSION_URL", format!("grpc://{addr}"))
        .env("DPFUSION_TOKEN", TOKEN)
        .env("DPFUSION_TUTORIAL_PLOT", &plot);
    let stdout = crate::serve::run_python(&mut cmd, "tutorial");
    assert!(stdout.contains("tutorial done"), "{stdout}");
    assert!(stdout.contains("refused after"), "{stdout}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{svg}"
    );
    assert!(svg.contains("<rect") && svg.contains("<polyline"), "{svg}");
    assert!(
        svg.contains("salaries") && svg.contains("purchases"),
        "{svg}"
    );
    // Every release was charged first: the fresh ledger verifies.
    dpfusion::accounting::verify(&dir.join(".dpfusion/ledger.jsonl")).unwrap();
}
