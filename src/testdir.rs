//! Test-only: paths under a fresh temporary directory that is removed, with everything in it,
//! when the last handle to it is dropped (also when a test fails). A ledger `…/d/ledger.jsonl`
//! keeps its witness beside its directory (`…/d.witness`, docs/LEDGER.md), so every path here is
//! one level below the root: the witness is removed with the rest.
//!
//! The unit tests use it as `crate::testdir`; the integration tests include this file with
//! `#[path]` (one declaration).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A path under a temporary root that lives as long as any clone of this handle.
#[derive(Clone, Debug)]
pub struct TestPath {
    path: PathBuf,
    _root: Arc<tempfile::TempDir>,
}

impl std::ops::Deref for TestPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TestPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TestPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// A fresh, empty directory `<temp>/dpfusion-<tag>-XXXXXX/d` (canonical: no symbolic link in its
/// path).
pub fn test_dir(tag: &str) -> TestPath {
    // The system's temporary directory, even where a test points tempfile's elsewhere
    // (tests/it/units.rs).
    test_dir_in(&std::env::temp_dir(), tag)
}

/// [`test_dir`] under `base`.
pub fn test_dir_in(base: &Path, tag: &str) -> TestPath {
    let root = tempfile::Builder::new()
        .prefix(&format!("dpfusion-{tag}-"))
        .tempdir_in(base)
        .expect("a temporary directory");
    let path = root.path().join("d");
    // The owner's alone whatever the umask (tempfile's root is 0700 too): a ledger below a
    // directory its group can write is refused (docs/LEDGER.md).
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .expect("a temporary directory");
    }
    TestPath {
        path: std::fs::canonicalize(path).expect("a temporary directory"),
        _root: Arc::new(root),
    }
}

/// `rel` (not created) in a fresh [`test_dir`].
pub fn test_file(tag: &str, rel: &str) -> TestPath {
    let dir = test_dir(tag);
    TestPath {
        path: dir.path.join(rel),
        _root: dir._root,
    }
}
