//! [`PinnedFs`]: the one door between DataFusion and the local file system (issue 27, "open what
//! was registered"). It is registered for the `file://` scheme in every context a session builds
//! (in place of DataFusion's `LocalFileSystem`), so every file a scan, a schema inference, a
//! listing or a `COPY` touches goes through it:
//!
//! - **Reads** are allowed only below a location the data owner or an allowed analyst
//!   registration pinned ([`PinnedFs::pin`]). Each path is opened component by component from
//!   `/` with `openat(…, O_NOFOLLOW)` (no `..`, no `.`, no symbolic link at any step), the opened
//!   file is `fstat`ed, and its `(device, inode)` is compared with what was pinned: a file table
//!   reads its one pinned file; a directory table reads regular files below its pinned directory,
//!   never a hard link that was not there when it was registered, and never a file pinned by
//!   another private table. No private table's files are pinned by another of the owner's
//!   tables at all, whichever was registered first ([`PinnedFs::pin`]): the store knows which
//!   path is read, not which table reads it. The data is then served from the very descriptor
//!   that was checked, so there is no window between check and use; a symbolic link, a swapped
//!   file or directory or an unresolvable entry is refused, never skipped or followed.
//! - **A private CSV table's files** ([`PinnedFs::read_csv_as`]) are served whole, never a byte
//!   range, and normalised record by record in the table's dialect ([`super::csv_total`]): a
//!   record DataFusion's reader could not split into the table's fields reads as a row of NULLs
//!   instead of failing the read (round 47, review "readers"). A file is read 1 MiB at a time
//!   and its normalised bytes given in chunks of about 1 MiB (review "fix-readers" F2).
//! - **Writes** (`COPY … TO`) create one new file directly in the owner's output directory
//!   ([`PinnedFs::set_output_dir`]): the directory is opened without following links and must
//!   still be the one pinned (same device and inode, not writable by group or others), and the
//!   file is created relative to that descriptor with `O_CREAT | O_EXCL | O_NOFOLLOW`. Nothing
//!   is renamed, copied or deleted through the store.
use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::object_store::path::Path as ObjPath;
use datafusion::object_store::{
    self, Attributes, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, UploadPart,
};
use futures::StreamExt;
use futures::stream::BoxStream;

use super::csv_total::{CsvDialect, Normaliser};
use super::{FileSet, MAX_DEPTH, MAX_FILES};

/// A file's identity: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
}

impl Ident {
    pub fn of(m: &Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// The handle of one pinned location ([`PinnedFs::unpin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PinId(u64);

/// One pinned location: what a table may read.
#[derive(Debug, Clone)]
struct Pin {
    id: PinId,
    table: String,
    /// Canonical path of the file or directory.
    root: PathBuf,
    root_ident: Ident,
    is_dir: bool,
    private: bool,
    /// An analyst's registration, whose files are checked again before every scan
    /// ([`crate::owner::analyst_file_set`]).
    rechecked: bool,
    /// The regular files below a directory when it was pinned.
    files: HashSet<Ident>,
    /// A private CSV table's dialect: its files are read normalised ([`PinnedFs::read_csv_as`]).
    csv: Option<CsvDialect>,
}

impl Pin {
    fn covers(&self, p: &Path) -> bool {
        p == self.root || (self.is_dir && p.starts_with(&self.root))
    }

    /// May this pin and one at `(root, ident, is_dir)` holding `files` read a common file: one
    /// lies below the other, or they share an identity (a hard link, the same directory)?
    fn overlaps(
        &self,
        (root, ident, is_dir): (&PathBuf, Ident, bool),
        files: &HashSet<Ident>,
    ) -> bool {
        self.covers(root)
            || (is_dir && self.root.starts_with(root))
            || self.root_ident == ident
            || self.files.contains(&ident)
            || files.contains(&self.root_ident)
            || !self.files.is_disjoint(files)
    }
}

/// The output directory, pinned.
#[derive(Debug, Clone)]
struct OutputDir {
    path: PathBuf,
    ident: Ident,
}

#[derive(Debug, Default)]
struct Pins {
    next: u64,
    pins: Vec<Pin>,
    output: Option<OutputDir>,
}

impl Pins {
    /// The private pin (other than at `root`) that holds `id`, if any.
    fn private_elsewhere(&self, id: Ident, root: &Path) -> Option<&Pin> {
        self.pins
            .iter()
            .find(|p| p.private && p.root != root && (p.root_ident == id || p.files.contains(&id)))
    }
}

/// Why the store refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    #[error(
        "dpfusion refused to read '{0}': no table registered in this session reads it (only the \
         files the data owner registered, and those an allowed analyst registration named, can \
         be read)"
    )]
    NotRegistered(String),
    #[error(
        "dpfusion refused to read '{path}' for table '{table}': {why}. The file must be the one \
         registered, reached without symbolic links; the data owner re-registers a table whose \
         files were replaced"
    )]
    Changed {
        path: String,
        table: String,
        why: String,
    },
    #[error("dpfusion refused to write '{path}': {why}")]
    Write { path: String, why: String },
    #[error(
        "dpfusion refused the file operation '{0}' (only reads and new output files are allowed)"
    )]
    Operation(String),
    #[error(
        "dpfusion refused to read part of '{0}': a private table's CSV file is read whole, \
         record by record"
    )]
    Whole(String),
}

fn store_err(e: Refused) -> object_store::Error {
    object_store::Error::Generic {
        store: "dpfusion",
        source: Box::new(e),
    }
}

/// What an `openat` without following links says about a path, in words.
fn why(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) => "it is, or goes through, a symbolic link".to_string(),
        Some(libc::ENOTDIR) => "a component on its way is not a directory".to_string(),
        Some(libc::ENOENT) => "it does not exist (any more)".to_string(),
        _ => e.to_string(),
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`; `name` is one component.
fn open_at(
    dir: &OwnedFd,
    name: &OsStr,
    flags: libc::c_int,
    mode: libc::c_uint,
) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `c` is a valid NUL-terminated string, `dir` an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_root() -> io::Result<OwnedFd> {
    let c = cstr(OsStr::new("/"))?;
    // SAFETY: as in `open_at`.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as in `open_at`.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The components of an absolute path: only normal names (no `.`, `..` or prefix).
fn names(path: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = vec![];
    let mut comps = path.components();
    if comps.next() != Some(Component::RootDir) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for c in comps {
        match c {
            Component::Normal(n) => out.push(n),
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
    }
    Ok(out)
}

/// Opens `rel` (normal names) below `dir`: every directory on the way and the last component
/// without following a symbolic link. The last one is opened read-only and non-blocking (a FIFO
/// put in a file's place cannot hang the read).
fn walk(mut fd: OwnedFd, rel: &[&OsStr]) -> io::Result<OwnedFd> {
    for (i, n) in rel.iter().enumerate() {
        let last = i + 1 == rel.len();
        let flags = if last {
            libc::O_RDONLY | libc::O_NONBLOCK
        } else {
            libc::O_RDONLY | libc::O_DIRECTORY
        };
        fd = open_at(&fd, n, flags, 0)?;
    }
    Ok(fd)
}

/// Opens an absolute path from `/` without following any symbolic link; returns the open file
/// and its `fstat`.
pub fn open_nofollow(path: &Path) -> io::Result<(File, Metadata)> {
    let fd = walk(open_root()?, &names(path)?)?;
    let f = File::from(fd);
    let m = f.metadata()?;
    Ok((f, m))
}

#[cfg(any(target_os = "linux", target_os = "android"))]
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: the calling thread's errno.
    unsafe { libc::__errno_location() }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: the calling thread's errno.
    unsafe { libc::__error() }
}

/// The entries of an open directory (without `.` and `..`).
fn read_dir_fd(dir: &File) -> io::Result<Vec<OsString>> {
    // SAFETY: `dup` of an open descriptor; `fdopendir` takes ownership of the duplicate, and
    // `closedir` releases it; `readdir`'s entries are copied before the next call.
    unsafe {
        let dup = libc::dup(dir.as_raw_fd());
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        let d = libc::fdopendir(dup);
        if d.is_null() {
            let e = io::Error::last_os_error();
            libc::close(dup);
            return Err(e);
        }
        libc::rewinddir(d);
        let mut out = vec![];
        loop {
            *errno() = 0;
            let ent = libc::readdir(d);
            if ent.is_null() {
                let err = *errno();
                libc::closedir(d);
                if err != 0 {
                    return Err(io::Error::from_raw_os_error(err));
                }
                break;
            }
            let name = std::ffi::CStr::from_ptr((*ent).d_name.as_ptr());
            let b = name.to_bytes();
            if b != b"." && b != b".." {
                out.push(OsStr::from_bytes(b).to_os_string());
            }
        }
        Ok(out)
    }
}

/// The file system, through pins. See the module documentation.
#[derive(Debug, Default)]
pub struct PinnedFs {
    pins: RwLock<Pins>,
}

impl std::fmt::Display for PinnedFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dpfusion::PinnedFs")
    }
}

/// Why a location cannot be pinned or the output directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("'{path}' {why}")]
pub struct PinError {
    pub path: String,
    pub why: String,
}

impl PinnedFs {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Pins the files of `set` (resolved just now, canonical) for `table`: the root as opened
    /// now without following links (it must still be the file or directory `set` resolved),
    /// and, for a directory, the identities of the files it holds now.
    pub fn pin(&self, table: &str, set: &FileSet, private: bool) -> Result<PinId, PinError> {
        self.pin_as(table, set, private, false)
    }

    /// [`PinnedFs::pin`] for an analyst's registration (public; its files are checked again
    /// before every scan).
    pub fn pin_rechecked(&self, table: &str, set: &FileSet) -> Result<PinId, PinError> {
        self.pin_as(table, set, false, true)
    }

    fn pin_as(
        &self,
        table: &str,
        set: &FileSet,
        private: bool,
        rechecked: bool,
    ) -> Result<PinId, PinError> {
        let err = |why: String| PinError {
            path: set.root.display().to_string(),
            why,
        };
        let (_, m) = open_nofollow(&set.root).map_err(|e| {
            err(format!(
                "cannot be opened without following links: {}",
                why(&e)
            ))
        })?;
        let ident = Ident::of(&m);
        let is_dir = m.is_dir();
        if !is_dir && !m.is_file() {
            return Err(err("is not a regular file or a directory".into()));
        }
        let expected = set
            .files
            .iter()
            .chain(&set.dirs)
            .any(|f| f.path == set.root && f.dev == ident.dev && f.ino == ident.ino);
        if !expected && (set.glob.is_none() || !is_dir) {
            return Err(err(
                "changed while it was being registered; register it again".into(),
            ));
        }
        let files = if is_dir {
            set.files
                .iter()
                .map(|f| Ident {
                    dev: f.dev,
                    ino: f.ino,
                })
                .collect()
        } else {
            HashSet::new()
        };
        let mut pins = self.pins.write().expect("lock");
        // A private table's files are pinned by no other of the owner's tables, whichever was
        // registered first (review r45: a public directory registered before a private file
        // inside it read that file, since a read is checked against the pins, not against the
        // reading table). The same path under two names is one table to the ledger (one key,
        // one budget, one visibility: the session refuses a private registration of a path it
        // serves as public, `PrivateSession::register_file`). An analyst's registration is
        // checked again before each of its scans.
        let root = (&set.root, ident, is_dir);
        let same_table = |p: &Pin| p.root == set.root;
        if let Some(other) = pins.pins.iter().find(|p| {
            !(rechecked || p.rechecked || p.table == table || same_table(p))
                && (private || p.private)
                && p.overlaps(root, &files)
        }) {
            return Err(err(format!(
                "shares files with table '{}', and a private table's files belong to that table \
                 alone",
                other.table
            )));
        }
        pins.next += 1;
        let id = PinId(pins.next);
        pins.pins.push(Pin {
            id,
            table: table.to_string(),
            root: set.root.clone(),
            root_ident: ident,
            is_dir,
            private,
            rechecked,
            files,
            csv: None,
        });
        Ok(id)
    }

    /// Serves the files of pin `id` (a private CSV table's) normalised in `dialect`
    /// ([`super::csv_total`]), whole; called again once the table's number of columns is known.
    pub fn read_csv_as(&self, id: PinId, dialect: CsvDialect) {
        let mut pins = self.pins.write().expect("lock");
        if let Some(p) = pins.pins.iter_mut().find(|p| p.id == id) {
            p.csv = Some(dialect);
        }
    }

    /// Removes a pin (a registration that failed after pinning).
    pub fn unpin(&self, id: PinId) {
        self.pins.write().expect("lock").pins.retain(|p| p.id != id);
    }

    /// Keeps, of `table`'s pins, only `keep` (a table registered again reads its new files
    /// only).
    pub fn retain_table(&self, table: &str, keep: &[PinId]) {
        self.pins
            .write()
            .expect("lock")
            .pins
            .retain(|p| p.table != table || keep.contains(&p.id));
    }

    /// Pins the output directory: an existing directory (symbolic links in the owner's
    /// spelling are resolved once, now), not writable by group or others.
    pub fn set_output_dir(&self, dir: &Path) -> Result<PathBuf, PinError> {
        let err = |why: String| PinError {
            path: dir.display().to_string(),
            why,
        };
        let canon = std::fs::canonicalize(dir).map_err(|e| err(format!("cannot be used: {e}")))?;
        let (_, m) =
            open_nofollow(&canon).map_err(|e| err(format!("cannot be opened: {}", why(&e))))?;
        check_output_dir(&m).map_err(err)?;
        self.pins.write().expect("lock").output = Some(OutputDir {
            path: canon.clone(),
            ident: Ident::of(&m),
        });
        Ok(canon)
    }

    /// The pinned output directory.
    pub fn output_dir(&self) -> Option<PathBuf> {
        self.pins
            .read()
            .expect("lock")
            .output
            .as_ref()
            .map(|o| o.path.clone())
    }

    /// Opens a file for reading, checked against the pins (see the module documentation).
    pub fn open_read(&self, path: &Path) -> Result<(File, Metadata), Refused> {
        self.open_read_as(path).map(|(f, m, _)| (f, m))
    }

    /// [`PinnedFs::open_read`], with the CSV dialect the file is read in when it is a private
    /// CSV table's.
    fn open_read_as(&self, path: &Path) -> Result<(File, Metadata, Option<CsvDialect>), Refused> {
        let pins = self.pins.read().expect("lock");
        let mut covering: Vec<&Pin> = pins.pins.iter().filter(|p| p.covers(path)).collect();
        if covering.is_empty() {
            return Err(Refused::NotRegistered(path.display().to_string()));
        }
        // A file registered as a table is read as that file only: when the path is a pinned
        // file, the pins of directories above it do not count.
        if covering.iter().any(|p| p.root == path) {
            covering.retain(|p| p.root == path);
        }
        covering.sort_by_key(|p| std::cmp::Reverse(p.root.as_os_str().len()));
        let mut first = None;
        for pin in covering {
            match open_pinned(&pins, pin, path) {
                Ok((f, m)) => return Ok((f, m, pin.csv)),
                Err(why) => {
                    first.get_or_insert(Refused::Changed {
                        path: path.display().to_string(),
                        table: pin.table.clone(),
                        why,
                    });
                }
            }
        }
        Err(first.expect("one pin covers the path"))
    }

    /// Lists the regular files below `dir` (pinned), without following links: a symbolic link
    /// or an entry that is neither a file nor a directory is refused, never skipped.
    fn list_dir(
        &self,
        dir: &Path,
        recursive: bool,
    ) -> Result<(Vec<ObjectMeta>, Vec<ObjPath>), Refused> {
        let pins = self.pins.read().expect("lock");
        let Some(pin) = pins.pins.iter().find(|p| p.is_dir && p.covers(dir)) else {
            return Err(Refused::NotRegistered(dir.display().to_string()));
        };
        let changed = |why: String| Refused::Changed {
            path: dir.display().to_string(),
            table: pin.table.clone(),
            why,
        };
        let (root, m) = open_nofollow(&pin.root).map_err(|e| changed(why(&e)))?;
        if Ident::of(&m) != pin.root_ident {
            return Err(changed("the registered directory was replaced".into()));
        }
        let rel = names(dir)
            .map_err(|_| changed("not a plain path".into()))?
            .split_off(names(&pin.root).map(|n| n.len()).unwrap_or(0));
        let fd = walk(OwnedFd::from(root), &rel).map_err(|e| changed(why(&e)))?;
        let start = File::from(fd);
        let mut objects = vec![];
        let mut prefixes = vec![];
        let mut stack = vec![(start, dir.to_path_buf(), 0usize)];
        while let Some((d, at, depth)) = stack.pop() {
            if depth > MAX_DEPTH {
                return Err(changed(format!("more than {MAX_DEPTH} levels deep")));
            }
            let entries = read_dir_fd(&d).map_err(|e| changed(e.to_string()))?;
            let dfd = OwnedFd::from(d);
            for name in entries {
                let p = at.join(&name);
                let shown = || p.display().to_string();
                let fd =
                    open_at(&dfd, &name, libc::O_RDONLY | libc::O_NONBLOCK, 0).map_err(|e| {
                        Refused::Changed {
                            path: shown(),
                            table: pin.table.clone(),
                            why: why(&e),
                        }
                    })?;
                let f = File::from(fd);
                let m = f.metadata().map_err(|e| changed(e.to_string()))?;
                if m.is_dir() {
                    prefixes.push(obj_path(&p)?);
                    if recursive {
                        stack.push((f, p, depth + 1));
                    }
                } else if m.is_file() {
                    objects.push(meta(obj_path(&p)?, &m));
                } else {
                    return Err(Refused::Changed {
                        path: shown(),
                        table: pin.table.clone(),
                        why: "not a regular file or a directory".into(),
                    });
                }
                if objects.len() + prefixes.len() > MAX_FILES {
                    return Err(changed(format!("more than {MAX_FILES} files")));
                }
            }
        }
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok((objects, prefixes))
    }

    /// Checks the output directory now (for the message before a `COPY` runs; the write checks
    /// again on what it opens).
    pub fn check_output(&self) -> Result<(), Refused> {
        let Some(out) = self.pins.read().expect("lock").output.clone() else {
            return Ok(());
        };
        open_output(&out).map(|_| ()).map_err(|why| Refused::Write {
            path: out.path.display().to_string(),
            why,
        })
    }

    /// Creates a new file for `COPY`: directly in the pinned output directory, opened without
    /// following links, with `O_CREAT | O_EXCL | O_NOFOLLOW`.
    pub fn create_output(&self, path: &Path) -> Result<OutputFile, Refused> {
        let refuse = |why: &str| Refused::Write {
            path: path.display().to_string(),
            why: why.to_string(),
        };
        let Some(out) = self.pins.read().expect("lock").output.clone() else {
            return Err(refuse("this session has no output directory"));
        };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(refuse("not a file name"));
        };
        if parent != out.path {
            return Err(refuse(&format!(
                "COPY writes one new file directly in the output directory {} (no \
                 sub-directory)",
                out.path.display()
            )));
        }
        let dir = open_output(&out).map_err(|w| refuse(&w))?;
        let fd = open_at(
            &dir,
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => refuse(
                "the file exists (or a link stands in its place); COPY only creates new files",
            ),
            _ => refuse(&why(&e)),
        })?;
        Ok(OutputFile {
            file: Arc::new(File::from(fd)),
            dir: Arc::new(dir),
            name: name.to_os_string(),
            offset: 0,
        })
    }
}

/// Opens the pinned output directory without following links and checks it is still the one
/// pinned, writable by its owner only.
fn open_output(out: &OutputDir) -> Result<OwnedFd, String> {
    let (dir, m) =
        open_nofollow(&out.path).map_err(|e| format!("the output directory: {}", why(&e)))?;
    if !m.is_dir() || Ident::of(&m) != out.ident {
        return Err("the output directory was replaced since the session opened".into());
    }
    check_output_dir(&m).map_err(|w| format!("the output directory {w}"))?;
    Ok(OwnedFd::from(dir))
}

/// An output directory must be a directory that neither group nor others can write (anyone
/// who can write it could swap its entries).
fn check_output_dir(m: &Metadata) -> Result<(), String> {
    if !m.is_dir() {
        return Err("is not a directory".into());
    }
    // Group-writable is accepted for a user-private group only (its id is the owner's user
    // id, as `useradd` makes them), where the group holds nobody else.
    let others = m.mode() & 0o002 != 0;
    let group = m.mode() & 0o020 != 0 && m.gid() != m.uid();
    if others || group {
        return Err(format!(
            "is writable by {} (mode {:o}); COPY needs a directory only its owner can write \
             (chmod go-w)",
            if others { "others" } else { "its group" },
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Opens `path` through `pin` and checks what was opened.
fn open_pinned(pins: &Pins, pin: &Pin, path: &Path) -> Result<(File, Metadata), String> {
    let (root, m) = open_nofollow(&pin.root).map_err(|e| why(&e))?;
    if Ident::of(&m) != pin.root_ident {
        return Err("it is not the file or directory that was registered (replaced since)".into());
    }
    let (f, m) = if path == pin.root {
        (root, m)
    } else {
        let all = names(path).map_err(|_| "not a plain path".to_string())?;
        let skip = names(&pin.root).map(|n| n.len()).unwrap_or(0);
        let fd = walk(OwnedFd::from(root), &all[skip..]).map_err(|e| why(&e))?;
        let f = File::from(fd);
        let m = f.metadata().map_err(|e| e.to_string())?;
        (f, m)
    };
    if !m.is_file() {
        return Err("it is not a regular file".into());
    }
    let id = Ident::of(&m);
    if pin.is_dir && !pin.files.contains(&id) && m.nlink() > 1 {
        return Err(
            "it is a hard link that was not there when the table was registered".to_string(),
        );
    }
    if let Some(other) = pins.private_elsewhere(id, &pin.root) {
        return Err(format!("it is a file of private table '{}'", other.table));
    }
    Ok((f, m))
}

fn fs_path(location: &ObjPath) -> PathBuf {
    PathBuf::from(format!("/{}", location.as_ref()))
}

/// The object store path of an absolute file system path (no `realpath`: the path is already
/// canonical below its pin).
fn obj_path(p: &Path) -> Result<ObjPath, Refused> {
    let parts = names(p).map_err(|_| Refused::NotRegistered(p.display().to_string()))?;
    Ok(ObjPath::from_iter(
        parts.iter().map(|n| n.to_string_lossy().into_owned()),
    ))
}

fn meta(location: ObjPath, m: &Metadata) -> ObjectMeta {
    let mtime = m.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    let micros = mtime
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    ObjectMeta {
        location,
        last_modified: chrono::DateTime::<chrono::Utc>::from(mtime),
        size: m.len(),
        // As LocalFileSystem's: inode, modification time, size.
        e_tag: Some(format!("{:x}-{:x}-{:x}", m.ino(), micros, m.len())),
        version: None,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> object_store::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| object_store::Error::JoinError { source: e })?
}

fn read_exact_at(file: &File, range: Range<u64>, path: &Path) -> object_store::Result<Bytes> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    file.read_exact_at(&mut buf, range.start)
        .map_err(|e| object_store::Error::Generic {
            store: "dpfusion",
            source: format!("reading {} bytes {range:?}: {e}", path.display()).into(),
        })?;
    Ok(Bytes::from(buf))
}

/// How much of a private CSV file is read at a time, and about how much normalised output is
/// given at a time (a piece's output can be many times its input: a 2-byte malformed line
/// becomes a row of the table's width; round 47, review "fix-readers" F2).
const PIECE: usize = 1 << 20;

/// A private CSV file being normalised: where it is read, the normaliser, and the piece read
/// last (`buf[lo..hi]` not yet normalised).
struct Normalising {
    file: File,
    offset: u64,
    n: Normaliser,
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
}

/// The bytes of `file`, normalised in `dialect` ([`super::csv_total`]), read lazily piece by
/// piece and given in chunks of about [`PIECE`] bytes at most (one record more).
fn normalised(
    file: File,
    dialect: CsvDialect,
    path: PathBuf,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    let start = Some(Normalising {
        file,
        offset: 0,
        n: Normaliser::new(dialect),
        buf: vec![0u8; PIECE],
        lo: 0,
        hi: 0,
    });
    futures::stream::try_unfold(start, move |state| {
        let path = path.clone();
        async move {
            let Some(mut s) = state else {
                return Ok(None);
            };
            blocking(move || {
                let mut out = Vec::new();
                loop {
                    if s.lo == s.hi {
                        let k = match s.file.read_at(&mut s.buf, s.offset) {
                            Ok(k) => k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => {
                                return Err(object_store::Error::Generic {
                                    store: "dpfusion",
                                    source: format!(
                                        "reading {} at {}: {e}",
                                        path.display(),
                                        s.offset
                                    )
                                    .into(),
                                });
                            }
                        };
                        if k == 0 {
                            s.n.finish(&mut out);
                            return Ok((!out.is_empty()).then(|| (Bytes::from(out), None)));
                        }
                        s.offset += k as u64;
                        (s.lo, s.hi) = (0, k);
                    }
                    s.lo += s.n.feed_until(&s.buf[s.lo..s.hi], &mut out, PIECE);
                    if !out.is_empty() {
                        return Ok(Some((Bytes::from(out), Some(s))));
                    }
                }
            })
            .await
        }
    })
    .boxed()
}

#[async_trait]
impl ObjectStore for PinnedFs {
    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let mut up = self.create_output(&fs_path(location)).map_err(store_err)?;
        let r = async {
            up.put_part(payload).await?;
            up.complete().await
        }
        .await;
        if r.is_err() {
            let _ = up.abort().await;
        }
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let up = self.create_output(&fs_path(location)).map_err(store_err)?;
        Ok(Box::new(up))
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let path = fs_path(location);
        let (file, m, csv) = self.open_read_as(&path).map_err(store_err)?;
        let meta = meta(location.clone(), &m);
        options.check_preconditions(&meta)?;
        if let Some(dialect) = csv {
            if options.range.is_some() {
                return Err(store_err(Refused::Whole(path.display().to_string())));
            }
            return Ok(GetResult {
                payload: GetResultPayload::Stream(normalised(file, dialect, path)),
                attributes: Attributes::default(),
                range: 0..meta.size,
                meta,
            });
        }
        let range = match &options.range {
            Some(r) => r
                .as_range(meta.size)
                .map_err(|e| object_store::Error::Generic {
                    store: "dpfusion",
                    source: Box::new(e),
                })?,
            None => 0..meta.size,
        };
        Ok(GetResult {
            payload: GetResultPayload::File(file, path),
            attributes: Attributes::default(),
            range,
            meta,
        })
    }

    async fn get_ranges(
        &self,
        location: &ObjPath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let path = fs_path(location);
        let (file, _, csv) = self.open_read_as(&path).map_err(store_err)?;
        if csv.is_some() {
            return Err(store_err(Refused::Whole(path.display().to_string())));
        }
        let ranges = ranges.to_vec();
        blocking(move || {
            ranges
                .into_iter()
                .map(|r| read_exact_at(&file, r, &path))
                .collect()
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        locations
            .map(|l| {
                let l = l?;
                Err(store_err(Refused::Operation(format!("delete {l}"))))
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&ObjPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let dir = prefix.map(fs_path).unwrap_or_else(|| PathBuf::from("/"));
        let r = self.list_dir(&dir, true).map_err(store_err);
        match r {
            Ok((objects, _)) => futures::stream::iter(objects.into_iter().map(Ok)).boxed(),
            Err(e) => futures::stream::once(async { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjPath>,
    ) -> object_store::Result<ListResult> {
        let dir = prefix.map(fs_path).unwrap_or_else(|| PathBuf::from("/"));
        let (objects, common_prefixes) = self.list_dir(&dir, false).map_err(store_err)?;
        Ok(ListResult {
            common_prefixes,
            objects,
        })
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(store_err(Refused::Operation(format!(
            "copy {from} to {to}"
        ))))
    }
}

/// A new output file being written ([`PinnedFs::create_output`]): parts are written in the
/// order they are given, at their offsets, into the descriptor that was created.
#[derive(Debug)]
pub struct OutputFile {
    file: Arc<File>,
    dir: Arc<OwnedFd>,
    name: OsString,
    offset: u64,
}

#[async_trait]
impl MultipartUpload for OutputFile {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let at = self.offset;
        self.offset += data.content_length() as u64;
        let file = Arc::clone(&self.file);
        Box::pin(blocking(move || {
            let mut off = at;
            for b in data.iter() {
                file.write_all_at(b, off)
                    .map_err(|e| object_store::Error::Generic {
                        store: "dpfusion",
                        source: Box::new(e),
                    })?;
                off += b.len() as u64;
            }
            Ok(())
        }))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let file = Arc::clone(&self.file);
        blocking(move || {
            file.sync_all().map_err(|e| object_store::Error::Generic {
                store: "dpfusion",
                source: Box::new(e),
            })
        })
        .await?;
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        // The file this upload created, by name in the pinned directory it was created in.
        let c = cstr(&self.name).map_err(|e| object_store::Error::Generic {
            store: "dpfusion",
            source: Box::new(e),
        })?;
        // SAFETY: valid descriptor and NUL-terminated name.
        unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) };
        Ok(())
    }
}

impl PinnedFs {
    /// Makes `self` the `file://` store of `runtime` (in place of DataFusion's
    /// `LocalFileSystem`).
    pub fn install(self: &Arc<Self>, runtime: &datafusion::execution::runtime_env::RuntimeEnv) {
        let url = datafusion::execution::object_store::ObjectStoreUrl::local_filesystem();
        let store: Arc<dyn ObjectStore> = Arc::clone(self) as _;
        runtime.register_object_store(url.as_ref(), store);
    }

    /// A plain context whose files go through `self` (registration-time schema inference and
    /// checks).
    pub fn scratch_context(
        self: &Arc<Self>,
    ) -> datafusion::common::Result<datafusion::execution::context::SessionContext> {
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new().build_arc()?;
        self.install(&runtime);
        Ok(
            datafusion::execution::context::SessionContext::new_with_config_rt(
                datafusion::prelude::SessionConfig::new(),
                runtime,
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp(tag: &str) -> crate::testdir::TestPath {
        let d = crate::testdir::test_dir(&format!("store-{tag}"));
        std::fs::create_dir_all(d.join("pub/sub")).unwrap();
        std::fs::create_dir_all(d.join("priv")).unwrap();
        std::fs::write(d.join("pub/a.csv"), "a\n1\n").unwrap();
        std::fs::write(d.join("pub/sub/b.csv"), "a\n2\n").unwrap();
        std::fs::write(d.join("priv/p.csv"), "a\n3\n").unwrap();
        d
    }

    fn pinned(d: &Path) -> Arc<PinnedFs> {
        let fs = PinnedFs::new();
        let set = |p: &Path| super::super::resolve(&p.to_string_lossy(), Path::new("/")).unwrap();
        fs.pin("pub", &set(&d.join("pub")), false).unwrap();
        fs.pin("p", &set(&d.join("priv/p.csv")), true).unwrap();
        fs
    }

    #[test]
    fn no_link_is_followed_anywhere_on_the_way() {
        let d = tmp("nofollow");
        symlink(d.join("priv"), d.join("pub/dirlink")).unwrap();
        symlink(d.join("priv/p.csv"), d.join("pub/filelink.csv")).unwrap();
        assert!(open_nofollow(&d.join("pub/a.csv")).is_ok());
        for p in ["pub/dirlink/p.csv", "pub/filelink.csv", "pub/../priv/p.csv"] {
            assert!(open_nofollow(&d.join(p)).is_err(), "{p}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn reads_check_what_was_opened_against_the_pins() {
        let d = tmp("reads");
        let fs = pinned(&d);
        assert!(fs.open_read(&d.join("pub/a.csv")).is_ok());
        assert!(fs.open_read(&d.join("pub/sub/b.csv")).is_ok());
        assert!(fs.open_read(&d.join("priv/p.csv")).is_ok());
        // Not registered.
        std::fs::write(d.join("other.csv"), "x").unwrap();
        assert!(matches!(
            fs.open_read(&d.join("other.csv")),
            Err(Refused::NotRegistered(_))
        ));
        // A hard link to the private file in the public directory.
        std::fs::hard_link(d.join("priv/p.csv"), d.join("pub/h.csv")).unwrap();
        let e = fs.open_read(&d.join("pub/h.csv")).unwrap_err().to_string();
        assert!(e.contains("hard link"), "{e}");
        // The private file swapped for a link, then for another file.
        std::fs::rename(d.join("priv/p.csv"), d.join("priv/p.orig")).unwrap();
        symlink(d.join("pub/a.csv"), d.join("priv/p.csv")).unwrap();
        let e = fs.open_read(&d.join("priv/p.csv")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_file(d.join("priv/p.csv")).unwrap();
        std::fs::write(d.join("priv/p.csv"), "a\n3\n").unwrap();
        let e = fs.open_read(&d.join("priv/p.csv")).unwrap_err().to_string();
        assert!(
            e.contains("not the file or directory that was registered"),
            "{e}"
        );
        // The public directory swapped for another directory.
        std::fs::rename(d.join("pub"), d.join("pub.orig")).unwrap();
        std::fs::create_dir(d.join("pub")).unwrap();
        std::fs::write(d.join("pub/a.csv"), "a\n1\n").unwrap();
        assert!(fs.open_read(&d.join("pub/a.csv")).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_private_tables_files_are_pinned_by_no_other_table_in_either_order() {
        let d = tmp("overlap");
        let set = |p: &Path| super::super::resolve(&p.to_string_lossy(), Path::new("/")).unwrap();
        // A public directory first, then a private file inside it (review r45), and the reverse.
        let fs = PinnedFs::new();
        fs.pin("pubdir", &set(&d.join("pub")), false).unwrap();
        let e = fs.pin("secret", &set(&d.join("pub/sub/b.csv")), true);
        assert!(e.unwrap_err().to_string().contains("table 'pubdir'"));
        let fs = PinnedFs::new();
        fs.pin("secret", &set(&d.join("pub/sub/b.csv")), true)
            .unwrap();
        assert!(fs.pin("pubdir", &set(&d.join("pub")), false).is_err());
        // A hard link elsewhere is the same file.
        std::fs::hard_link(d.join("pub/sub/b.csv"), d.join("priv/h.csv")).unwrap();
        assert!(fs.pin("other", &set(&d.join("priv/h.csv")), false).is_err());
        // Public tables may share files; a table re-registered replaces its own pins.
        let fs = PinnedFs::new();
        fs.pin("a", &set(&d.join("pub")), false).unwrap();
        fs.pin("b", &set(&d.join("pub/a.csv")), false).unwrap();
        fs.pin("a", &set(&d.join("pub")), true).unwrap_err();
        fs.pin("c", &set(&d.join("priv/p.csv")), true).unwrap();
        fs.pin("c", &set(&d.join("priv/p.csv")), true).unwrap();
        // One path under two names is one table to the ledger (its policy decides; the session
        // refuses a private registration of a path it serves as public).
        fs.pin("c2", &set(&d.join("priv/p.csv")), true).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A private CSV table's file is served whole and normalised (round 47): a record of
    /// another width reads as empty fields, and a byte range is refused.
    #[tokio::test]
    async fn a_private_csv_file_is_served_whole_and_normalised() {
        use datafusion::object_store::ObjectStoreExt;
        let d = tmp("csv");
        std::fs::write(d.join("priv/p.csv"), "a,b\n1,2\n3,4,5\n").unwrap();
        let fs = PinnedFs::new();
        let set =
            super::super::resolve(&d.join("priv/p.csv").to_string_lossy(), Path::new("/")).unwrap();
        let id = fs.pin("p", &set, true).unwrap();
        let location = obj_path(&set.root).unwrap();
        let raw = fs.get(&location).await.unwrap().bytes().await.unwrap();
        assert_eq!(&raw[..], b"a,b\n1,2\n3,4,5\n", "not a CSV table's pin yet");
        fs.read_csv_as(id, crate::owner::CsvFormat::default().dialect(Some(2)));
        let out = fs.get(&location).await.unwrap().bytes().await.unwrap();
        assert_eq!(&out[..], b"a,b\n1,2\n,\n");
        let e = fs.get_range(&location, 0..4).await.unwrap_err().to_string();
        assert!(e.contains("read whole"), "{e}");
        assert!(fs.get_ranges(&location, &[0..2, 2..4]).await.is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Round 47 (review "fix-readers" F2): a piece of short malformed lines under a wide table
    /// (2,000 lines `x`, 1,000 columns: 2 MB of rows from 4 kB) is served in chunks of about
    /// [`PIECE`] bytes, not one chunk per piece read.
    #[tokio::test]
    async fn a_private_csv_file_is_served_in_bounded_chunks() {
        use datafusion::object_store::ObjectStoreExt;
        use futures::StreamExt;
        let d = tmp("csv-chunks");
        std::fs::write(d.join("priv/p.csv"), "x\n".repeat(2000)).unwrap();
        let fs = PinnedFs::new();
        let set =
            super::super::resolve(&d.join("priv/p.csv").to_string_lossy(), Path::new("/")).unwrap();
        let id = fs.pin("p", &set, true).unwrap();
        fs.read_csv_as(id, crate::owner::CsvFormat::default().dialect(Some(1000)));
        let location = obj_path(&set.root).unwrap();
        let mut chunks = fs.get(&location).await.unwrap().into_stream();
        let (mut n, mut total) = (0, 0);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.unwrap();
            assert!(chunk.len() < PIECE + 1000, "{}", chunk.len());
            n += 1;
            total += chunk.len();
        }
        assert_eq!(total, 2000 * 1000);
        assert!(n >= 2, "{n}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn listing_refuses_a_link_instead_of_skipping_it() {
        let d = tmp("list");
        let fs = pinned(&d);
        let (objects, prefixes) = fs.list_dir(&d.join("pub"), true).unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(prefixes.len(), 1);
        symlink(d.join("nowhere"), d.join("pub/sub/dangling.csv")).unwrap();
        assert!(fs.list_dir(&d.join("pub"), true).is_err());
        assert!(
            fs.list_dir(&d.join("priv"), true).is_err(),
            "not a pinned directory"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn output_files_are_new_and_directly_in_the_pinned_directory() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp("out");
        let out = d.join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        let fs = PinnedFs::new();
        assert!(
            fs.create_output(&out.join("x.csv")).is_err(),
            "no output directory"
        );
        fs.set_output_dir(&out).unwrap();
        assert!(fs.create_output(&out.join("x.csv")).is_ok());
        for bad in ["x.csv", "sub/y.csv"] {
            assert!(fs.create_output(&out.join(bad)).is_err(), "{bad}");
        }
        assert!(fs.create_output(&d.join("z.csv")).is_err());
        symlink(d.join("priv/p.csv"), out.join("l.csv")).unwrap();
        assert!(fs.create_output(&out.join("l.csv")).is_err());
        assert_eq!(std::fs::read(d.join("priv/p.csv")).unwrap(), b"a\n3\n");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(fs.create_output(&out.join("w.csv")).is_err());
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
        let other = PinnedFs::new();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o757)).unwrap();
        assert!(other.set_output_dir(&out).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
