//! No import circle inside `aggregates/` and `optim/`: the arrows run from the functions to the
//! shared pieces (declaration, adapter, interval, accumulator, noise), never back
//! (scripts/import_cycles.rs builds the graph).
use std::path::Path;

#[path = "../../../scripts/import_cycles.rs"]
mod import_cycles;

/// Circles accepted for now: none (`Clipper` and `round_i64` moved from `optim::linreg` to
/// `optim::clip`, which both the kernel and linreg use). This list may only shrink.
const KNOWN: &[&[&str]] = &[];

#[test]
fn no_import_circle_inside_aggregates_and_optim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = import_cycles::graph(&root, &["aggregates", "optim"]);
    // The graph is read: the registry lists the functions, the functions use the adapter.
    assert!(g["aggregates::registry"].contains("aggregates::dp_count"));
    assert!(g["aggregates::dp_count"].contains("aggregates::adapter"));
    let found = import_cycles::cycles(&g);
    let known: Vec<Vec<String>> = KNOWN
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(
        found, known,
        "import circles (strongly connected components)"
    );
}

/// The checker finds a planted circle, also one through a re-exporting parent module.
#[test]
fn the_checker_finds_a_planted_circle() {
    let dir = std::env::temp_dir().join(format!("import_cycles_{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "pub mod x;\npub mod y;\npub mod z;\npub use z::Zed;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/x.rs"), "use super::y::{self, Why};\n").unwrap();
    // A comment naming super::x is not an arrow.
    std::fs::write(
        src.join("a/y.rs"),
        "// super::x::X\nuse crate::a::{x::X};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/z.rs"),
        "use super::Zed as _;\npub struct Zed;\n",
    )
    .unwrap();
    let g = import_cycles::graph(&src, &["a"]);
    let found = import_cycles::cycles(&g);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        found,
        vec![
            vec!["a".to_string(), "a::z".to_string()],
            vec!["a::x".to_string(), "a::y".to_string()],
        ]
    );
}
