//! The runtime a statement runs in (round 48, review "server48", findings 1–3): a memory pool of
//! its own, of the data owner's `memory_limit` bytes, and spill files of its own, at most
//! `max_spill_bytes` in all, below the owner's `spill_dir`. The session's object store registry
//! (the pins of [`crate::files::store`]) and its cache manager are the session runtime's own
//! `Arc`s, shared, so a statement reads every file through the same pins.
//!
//! Before round 48 one pool served the whole session: on the server every analyst's queries ran
//! in it beside every analyst's held results and uploads, so an analyst's holdings set, to the
//! byte, the headroom a charged DP query ran in (whether it failed then depended on private row
//! and group counts), and a memory error quoted the pool's top consumers (other analysts' names
//! and sizes). Spills went to the OS temporary directory under DataFusion's default cap of
//! 100 GiB, shared by every statement. Now:
//! - each statement gets a fresh `FairSpillPool` (no consumer tracker: nothing lists its
//!   consumers, and its errors reach no one as they are: [`crate::error::Error::classify`]);
//! - each statement gets a disk manager of its own whose files go into the session's spill
//!   directory ([`Spills`]: `<spill_dir>/dpfusion-spill-XXXXXX`, mode 0700, made at the first
//!   spill and removed with the session) and together hold at most `max_spill_bytes`; past that
//!   the write fails with [`SpillLimit`], which names the setting. `max_spill_bytes = 0` turns
//!   spilling off (an operator past its memory share then fails as out of memory).
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::disk_manager::{DiskManager, DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SpillFile, SpillWriter, TempFileFactory};

/// The default bound on the bytes one statement may spill to disk (16 GiB; round 48,
/// [`super::SessionOptions::max_spill_bytes`]). Fixed rather than a multiple of `memory_limit`:
/// what a statement spills grows with its input, not with its memory, and a lower memory limit
/// (which makes more statements spill) should not also shrink the room they spill into.
pub const DEFAULT_MAX_SPILL_BYTES: u64 = 16 << 30;

/// A statement's spill files would pass the owner's `max_spill_bytes` (round 48): the typed
/// error of the write that would pass it, inside the `std::io::Error` DataFusion's spill writer
/// returns. Its text is what the analyst reads of a query that reads no private table
/// ([`crate::error::Error::classify`]); a private one gets the fixed message.
#[derive(Debug, thiserror::Error)]
#[error(
    "dpfusion: the statement stopped: its spill files would take more than {max} bytes, the most \
     one statement may write to disk (the data owner's [session] max_spill_bytes). Select fewer \
     rows or columns, aggregate before sorting or joining, or ask the data owner for a larger \
     max_spill_bytes"
)]
pub(crate) struct SpillLimit {
    pub max: u64,
}

/// Where a session's statements spill (round 48): the session's own directory below the
/// owner's `spill_dir`, named when the session opens (so it is among the owner's protected
/// paths from then on), made with mode 0700 at the first spill (refused if it exists), and
/// removed with the session.
#[derive(Debug)]
pub(super) struct Spills {
    dir: PathBuf,
    /// The most bytes one statement's spill files hold at once.
    max: u64,
    /// DataFusion's disk manager over `dir`, made at the first spill; it writes each file
    /// ([`CappedFile`] counts them per statement).
    manager: Mutex<Option<Arc<DiskManager>>>,
}

impl Spills {
    /// The spill directory of a new session below `base` (None: the OS temporary directory,
    /// `std::env::temp_dir`), each statement's files at most `max` bytes; None when `max` is 0 (no
    /// spilling). `base` must be a directory (an owner's one is made, mode 0700, if missing)
    /// that no other user controls, the rule of the ledger's directory
    /// ([`crate::files::path_others_control`]). `Err` says what to do.
    pub(super) fn open(base: Option<&Path>, max: u64) -> std::result::Result<Option<Self>, String> {
        use rand::RngCore;
        use std::os::unix::fs::DirBuilderExt;
        if max == 0 {
            return Ok(None);
        }
        let base = match base {
            Some(b) => {
                if !b.exists() {
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .recursive(true)
                        .create(b)
                        .map_err(|e| {
                            format!(
                                "spill_dir {} cannot be made: {e}; give a directory the server's \
                                 account can write",
                                b.display()
                            )
                        })?;
                }
                b.to_path_buf()
            }
            None => std::env::temp_dir(),
        };
        let base = std::fs::canonicalize(&base)
            .ok()
            .filter(|b| b.is_dir())
            .ok_or_else(|| {
                format!(
                    "spill_dir {} is not a directory; give a directory, or max_spill_bytes = 0 \
                     to never spill",
                    base.display()
                )
            })?;
        // The directory itself is checked too: the session's own is made in it.
        if let Some(c) = crate::files::path_others_control(&base.join("dpfusion-spill")) {
            return Err(format!(
                "spill_dir {} lies at or below {}, a directory {} (mode {:o}): whoever can write \
                 it can replace the session's spill directory, which holds private rows in \
                 clear. Give a directory that only the data owner (or root) owns and can write, \
                 below directories that are the same or sticky like /tmp ({})",
                base.display(),
                c.dir.display(),
                c.what(),
                c.mode,
                c.fix()
            ));
        }
        let mut suffix = [0u8; 8];
        rand::rng().fill_bytes(&mut suffix);
        let name: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Some(Self {
            dir: base.join(format!("dpfusion-spill-{name}")),
            max,
            manager: Mutex::new(None),
        }))
    }

    /// The session's spill directory (it may not exist yet).
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The disk manager over the session's directory, made at the first call.
    fn manager(&self) -> Result<Arc<DiskManager>> {
        use std::os::unix::fs::DirBuilderExt;
        let mut m = self.manager.lock().expect("lock");
        if let Some(m) = &*m {
            return Ok(Arc::clone(m));
        }
        // Made here, by this process, with mode 0700; an entry already there (not ours) is an
        // error, never used.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.dir)
            .map_err(DataFusionError::IoError)?;
        // Each statement's own bound is [`Capped`]'s; the manager's is none.
        let made = DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::Directories(vec![self.dir.clone()]))
            .with_max_temp_directory_size(u64::MAX)
            .build()?;
        let made = Arc::new(made);
        *m = Some(Arc::clone(&made));
        Ok(made)
    }
}

impl Drop for Spills {
    fn drop(&mut self) {
        if let Ok(m) = self.manager.get_mut()
            && m.take().is_some()
        {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A runtime for one statement, or for the session itself: a `FairSpillPool` of
/// `memory_limit` bytes of its own, a disk manager of its own (its files in `spills`, at most
/// `spills.max` bytes at once; spilling off without `spills`), and the rest (object stores,
/// caches) `base`'s, the same `Arc`s.
pub(super) fn runtime(
    base: &RuntimeEnv,
    memory_limit: usize,
    spills: Option<&Arc<Spills>>,
) -> Result<Arc<RuntimeEnv>> {
    let disk = match spills {
        Some(s) => DiskManagerBuilder::default().with_temp_file_factory(Arc::new(Capped {
            spills: Arc::clone(s),
            used: Arc::new(AtomicU64::new(0)),
        })),
        None => DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
    };
    let mut builder = RuntimeEnvBuilder::from_runtime_env(base)
        .with_memory_pool(Arc::new(FairSpillPool::new(memory_limit)));
    builder.disk_manager = Some(Arc::new(disk.build()?));
    let mut made = builder.build()?;
    // `from_runtime_env` copies the caches into a new manager: share the manager itself.
    made.cache_manager = Arc::clone(&base.cache_manager);
    Ok(Arc::new(made))
}

/// One runtime's spill files ([`runtime`]): made by the session's disk manager, at most
/// `spills.max` bytes at once in all.
struct Capped {
    spills: Arc<Spills>,
    /// The bytes this runtime's files hold now.
    used: Arc<AtomicU64>,
}

impl TempFileFactory for Capped {
    fn create_temp_file(&self, description: &str) -> Result<Arc<dyn SpillFile>> {
        let file = self.spills.manager()?.create_tmp_file(description)?;
        Ok(Arc::new(CappedFile {
            file,
            written: Arc::new(AtomicU64::new(0)),
            used: Arc::clone(&self.used),
            max: self.spills.max,
        }))
    }
}

/// A spill file whose bytes count in its runtime's bound until it is dropped (deleted).
struct CappedFile {
    file: Arc<dyn SpillFile>,
    written: Arc<AtomicU64>,
    used: Arc<AtomicU64>,
    max: u64,
}

impl Drop for CappedFile {
    fn drop(&mut self) {
        let n = self.written.load(Ordering::Relaxed);
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

impl SpillFile for CappedFile {
    fn path(&self) -> Option<&Path> {
        self.file.path()
    }

    fn size(&self) -> Option<u64> {
        self.file.size()
    }

    fn read_stream(
        &self,
    ) -> Result<std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes>> + Send>>> {
        self.file.read_stream()
    }

    fn open_writer(&self) -> Result<Box<dyn SpillWriter>> {
        Ok(Box::new(CappedWriter {
            inner: self.file.open_writer()?,
            written: Arc::clone(&self.written),
            used: Arc::clone(&self.used),
            max: self.max,
        }))
    }
}

/// A spill file's writer that refuses a write past its runtime's bound with [`SpillLimit`].
struct CappedWriter {
    inner: Box<dyn SpillWriter>,
    written: Arc<AtomicU64>,
    used: Arc<AtomicU64>,
    max: u64,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len() as u64;
        // Counted before the write, so concurrent writers of one statement never pass the bound
        // together.
        let total = self
            .used
            .fetch_add(len, Ordering::Relaxed)
            .saturating_add(len);
        if total > self.max {
            self.used.fetch_sub(len, Ordering::Relaxed);
            return Err(std::io::Error::other(SpillLimit { max: self.max }));
        }
        match self.inner.write(buf) {
            Ok(n) => {
                self.used.fetch_sub(len - n as u64, Ordering::Relaxed);
                self.written.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Err(e) => {
                self.used.fetch_sub(len, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl SpillWriter for CappedWriter {
    fn finish(&mut self) -> Result<()> {
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{PrivateSession, SessionOptions};
    use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};

    async fn open(dir: &Path, o: SessionOptions) -> PrivateSession {
        PrivateSession::open(o.with_ledger(dir.join("ledger.jsonl")))
            .await
            .unwrap()
    }

    /// The session's spill directories below `base` (`dpfusion-spill-*`).
    fn made(base: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(base)
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.to_string_lossy().contains("dpfusion-spill-"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Round 48 (review "server48" F1): two statements run in two pools, each of
    /// `memory_limit` bytes (what one holds leaves the other whole), with disk managers of
    /// their own, and with the session's object stores (the very `PinnedFs` of its pins) and
    /// caches. (A private CSV table read through the pins by a statement: tests/it/readers.rs.)
    #[tokio::test]
    async fn each_statement_has_a_pool_of_its_own_and_the_sessions_pins() {
        let dir = crate::testdir::test_dir("statement-runtime");
        let s = open(&dir, SessionOptions::default().with_memory_limit(8 << 20)).await;
        let (a, b) = (s.statement_state().unwrap(), s.statement_state().unwrap());
        let (ra, rb) = (a.runtime_env(), b.runtime_env());
        assert!(!Arc::ptr_eq(&ra.memory_pool, &rb.memory_pool));
        for pool in [&ra.memory_pool, &rb.memory_pool] {
            assert!(matches!(pool.memory_limit(), MemoryLimit::Finite(n) if n == 8 << 20));
        }
        let one = MemoryConsumer::new("one").register(&ra.memory_pool);
        one.try_grow(6 << 20).unwrap();
        let two = MemoryConsumer::new("two").register(&rb.memory_pool);
        two.try_grow(6 << 20)
            .expect("the other statement's 6 MiB are not in this pool");
        assert_eq!(rb.memory_pool.reserved(), 6 << 20);
        assert!(!Arc::ptr_eq(&ra.disk_manager, &rb.disk_manager));
        let session = s.ctx.runtime_env();
        assert!(!Arc::ptr_eq(&ra.memory_pool, &session.memory_pool));
        assert!(Arc::ptr_eq(
            &ra.object_store_registry,
            &session.object_store_registry
        ));
        assert!(Arc::ptr_eq(&ra.cache_manager, &session.cache_manager));
        let url = datafusion::execution::object_store::ObjectStoreUrl::local_filesystem();
        let store = ra.object_store(&url).unwrap();
        assert!(
            std::ptr::addr_eq(Arc::as_ptr(&store), Arc::as_ptr(&s.fs)),
            "a statement's file:// store is the session's pins"
        );
    }

    /// A public sort of 1,000,000 rows (16 MB) in 16 MiB over two partitions: it spills.
    const SORT: &str = "SELECT v, random() AS r FROM generate_series(1, 1000000) t(v) ORDER BY r";

    /// Round 48 (review "server48" F3): a statement spills into the session's own directory
    /// below the owner's `spill_dir` (mode 0700, made at the first spill, removed with the
    /// session), never the OS temporary directory; past `max_spill_bytes` a public statement
    /// fails with one text naming the setting.
    #[tokio::test]
    async fn spills_go_below_spill_dir_within_max_spill_bytes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::testdir::test_dir("spill-dir");
        let spill = dir.join("spill");
        let o = SessionOptions::default()
            .with_memory_limit(16 << 20)
            .with_target_partitions(2)
            .with_spill_dir(&spill);
        let anywhere = o.clone().with_analyst_files(crate::AnalystFiles::Anywhere);
        let s = open(&dir, anywhere).await;
        assert_eq!(
            std::fs::metadata(&spill).unwrap().permissions().mode() & 0o777,
            0o700,
            "made for the owner alone"
        );
        assert!(made(&spill).is_empty(), "nothing before the first spill");
        let r = s.sql(SORT).await.unwrap();
        assert_eq!(
            r.batches.iter().map(|b| b.num_rows()).sum::<usize>(),
            1_000_000
        );
        let mine = made(&spill);
        assert_eq!(mine.len(), 1, "the statement spilled below spill_dir");
        assert_eq!(
            std::fs::metadata(&mine[0]).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // Analyst SQL never reads the spill directory, even where it may read any file.
        for location in [
            format!("{}/", mine[0].display()),
            format!("{}/", spill.display()),
        ] {
            let e = s
                .sql(&format!(
                    "CREATE EXTERNAL TABLE x STORED AS ARROW LOCATION '{location}'"
                ))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("the data owner's"), "{e}");
        }
        drop(s);
        assert!(made(&spill).is_empty(), "removed with the session");

        let s = open(&dir, o.with_max_spill_bytes(64 << 10)).await;
        let e = s.sql(SORT).await.unwrap_err();
        assert!(
            matches!(crate::Error::of(&e), Some(crate::Error::ResourceLimit(_))),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("max_spill_bytes") && text.contains("65536"),
            "{text}"
        );
        assert!(!text.contains("datafusion"), "{text}");
    }

    /// A private statement past `max_spill_bytes` gets the one fixed message (its charge
    /// stands); with room it spills and succeeds.
    #[tokio::test]
    async fn a_private_statement_past_max_spill_bytes_gets_the_fixed_message() {
        use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
        let dir = crate::testdir::test_dir("spill-private");
        let spill = dir.join("spill");
        let sql = "SELECT k, dp_count(x, epsilon => 1.0) AS n FROM t GROUP BY k";
        let mut out = vec![];
        for max in [DEFAULT_MAX_SPILL_BYTES, 64 << 10] {
            let o = SessionOptions::default()
                .with_memory_limit(8 << 20)
                .with_target_partitions(2)
                .with_spill_dir(&spill)
                .with_max_spill_bytes(max)
                .with_default_budget(1e6, 1e-3);
            let s = open(&dir, o).await;
            let batches = (0..30)
                .map(|i| {
                    let k: Vec<i64> = (i * 8192..(i + 1) * 8192).collect();
                    RecordBatch::try_from_iter(vec![
                        ("k", Arc::new(Int64Array::from(k)) as ArrayRef),
                        (
                            "x",
                            Arc::new(Float64Array::from(vec![1.0; 8192])) as ArrayRef,
                        ),
                    ])
                    .unwrap()
                })
                .collect();
            s.register_batches("t", batches, crate::Registration::private())
                .unwrap();
            out.push((
                s.sql(sql).await.map_err(|e| e.to_string()),
                made(&spill).len(),
            ));
        }
        assert!(out[0].0.is_ok(), "{:?}", out[0].0);
        assert_eq!(out[0].1, 1, "it spilled");
        let e = out[1].0.as_ref().unwrap_err();
        assert!(e.contains(crate::session::EXECUTION_FAILED), "{e}");
    }
}
