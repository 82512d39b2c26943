//! The identity of the files a table reads. A location (a path, a `file://` URL, a directory, a
//! glob) is resolved to the set of files its provider may read: canonical paths (symbolic links,
//! `..`, `.`, doubled and trailing slashes resolved) plus device and inode, so that a hard link
//! or a case variant on a case-insensitive file system is the same file. A directory holds every
//! file below it, now and later. Two sets intersect when they may read a common file; an analyst
//! registration whose set intersects a private table's is refused (crate::owner::Protection).
//!
//! An entry that cannot be resolved (a dangling link, a loop, a target whose canonical path is
//! too long for `realpath`) is an error, never skipped: what cannot be named cannot be checked.
//! What DataFusion then reads goes through [`store::PinnedFs`], which opens without following
//! links and compares what it opened with what was pinned at registration.
//!
//! The sets are a superset of what DataFusion's listing reads (hidden files, other extensions
//! and subdirectories all count): on this side, a refusal too many is safe, a read too many is
//! not.
use std::path::{Component, Path, PathBuf};

pub mod csv_total;
pub mod parquet_total;
pub mod store;
pub use csv_total::CsvDialect;
pub use store::{PinId, PinnedFs};

/// The most files one location may name (a larger walk is refused).
pub const MAX_FILES: usize = 100_000;
/// The deepest directory walk.
pub const MAX_DEPTH: usize = 64;

/// One file or directory: canonical path plus device and inode (0, 0 off unix: then only the
/// path counts).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    fn of(path: PathBuf, m: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Self {
                path,
                dev: m.dev(),
                ino: m.ino(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = m;
            Self {
                path,
                dev: 0,
                ino: 0,
            }
        }
    }

    fn same_inode(&self, o: &FileId) -> bool {
        self.ino != 0 && self.dev == o.dev && self.ino == o.ino
    }
}

/// What a location names.
#[derive(Clone, Debug)]
pub struct FileSet {
    /// The location as given.
    pub location: String,
    /// The canonical path of the longest glob-free prefix (a file or a directory).
    pub root: PathBuf,
    /// The root is a directory: every file below it, now or later, belongs to the set.
    pub root_is_dir: bool,
    /// The glob pattern (the canonical root joined with the remaining components).
    pub glob: Option<String>,
    /// The regular files the set holds now, canonical, sorted by path.
    pub files: Vec<FileId>,
    /// The directories below the root (the root included when it is one), canonical.
    pub dirs: Vec<FileId>,
}

/// Why a location cannot be resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error(
        "'{0}' is not a local file: only a path or a file:// URL can be registered (no \
         s3://, http:// or other object store)"
    )]
    NotLocal(String),
    #[error("'{0}': a file:// URL must name this machine (file:///path or file://localhost/path)")]
    RemoteHost(String),
    #[error("'{location}' cannot be read: {source}")]
    Io {
        location: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "'{location}': the entry {entry} cannot be resolved ({source}); a dangling or looping \
         link, or one whose target cannot be named, is refused, never skipped"
    )]
    Unresolvable {
        location: String,
        entry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("'{0}' is not a valid glob pattern")]
    BadGlob(String),
    #[error("'{0}' names more than {MAX_FILES} files or is more than {MAX_DEPTH} levels deep")]
    TooMany(String),
}

fn io(location: &str) -> impl Fn(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        location: location.to_string(),
        source,
    }
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '[', ']', '{', '}'])
}

/// The local path a location names: a path (relative to `base`) or a `file:` URL.
fn local_path(location: &str, base: &Path) -> Result<PathBuf, FileError> {
    let lower = location.to_ascii_lowercase();
    if let Some(scheme_end) = location.find("://") {
        let scheme = &lower[..scheme_end];
        let is_scheme = !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if is_scheme {
            if scheme != "file" {
                return Err(FileError::NotLocal(location.to_string()));
            }
            let rest = &location[scheme_end + 3..];
            let (host, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            if !(host.is_empty() || host.eq_ignore_ascii_case("localhost")) {
                return Err(FileError::RemoteHost(location.to_string()));
            }
            let decoded = percent_encoding::percent_decode_str(path)
                .decode_utf8()
                .map_err(|_| FileError::NotLocal(location.to_string()))?;
            return Ok(PathBuf::from(decoded.as_ref()));
        }
    }
    if lower.starts_with("file:") {
        // `file:/p` (one slash) is a URL too.
        let decoded = percent_encoding::percent_decode_str(&location[5..])
            .decode_utf8()
            .map_err(|_| FileError::NotLocal(location.to_string()))?;
        return Ok(PathBuf::from(decoded.as_ref()));
    }
    let p = PathBuf::from(location);
    Ok(if p.is_absolute() { p } else { base.join(p) })
}

/// Splits a path into its glob-free prefix and the rest (None when there is no glob).
fn split_glob(p: &Path) -> (PathBuf, Option<PathBuf>) {
    let mut prefix = PathBuf::new();
    let mut comps = p.components();
    for c in comps.by_ref() {
        if let Component::Normal(s) = c
            && is_glob(&s.to_string_lossy())
        {
            let mut rest = PathBuf::from(s);
            rest.extend(comps);
            return (prefix, Some(rest));
        }
        prefix.push(c);
    }
    (prefix, None)
}

/// The canonical path a location names, without walking it: the canonical root, or for a glob
/// the canonical root joined with the glob's remaining components.
pub fn canonical_location(location: &str, base: &Path) -> Result<PathBuf, FileError> {
    let p = local_path(location, base)?;
    let (prefix, rest) = split_glob(&p);
    let root = std::fs::canonicalize(&prefix).map_err(io(location))?;
    Ok(match rest {
        Some(r) => root.join(r),
        None => root,
    })
}

/// The first symbolic link on the way to `location` (or the location itself) that a user other
/// than this process's could have placed or may replace, with why: a link in a directory where
/// another user could replace it (the rule: [`others_control`]). The data owner's registrations
/// are refused through such a link: a table's identity (its ledger key) is the path the links
/// lead to, so whoever can repoint the link can choose a table's files and its budget (review
/// r45: a private file renamed and a link put in its place gave the table a fresh budget; a
/// public table's link repointed to the owner's TLS key printed it).
pub fn link_others_control(location: &str, base: &Path) -> Option<String> {
    let p = local_path(location, base).ok()?;
    let (prefix, _) = split_glob(&p);
    let c = path_link_others_control(&prefix)?;
    Some(format!(
        "'{}' is a symbolic link in {}, a directory {} (mode {:o}): whoever can replace the link \
         chooses the table's files. Name the file the link leads to, or keep the link in a \
         directory only you can write ({})",
        c.entry.display(),
        c.dir.display(),
        c.what(),
        c.mode,
        c.fix()
    ))
}

/// The first symbolic link on the way to `path` (relative: to the current directory; the path
/// itself included) that sits in a directory where another user could replace it (the rule of
/// [`others_control`]). [`link_others_control`] words it for a table; `dpfusion ledger report`
/// refuses an output directory reached through such a link (round 46).
pub fn path_link_others_control(path: &Path) -> Option<OthersControl> {
    walk_others_control(&absolute(path)?, Walk::Links)
}

/// The first directory on the way to `path` (every directory from `/` down to the one that
/// holds `path`, symbolic links followed) in which another user could remove, rename or replace
/// the next entry: the rule of [`others_control`]. A component that does not exist yet counts
/// as an entry this process will create. The ledger and its witness are refused in such a place
/// (round 46: whoever can write the ledger's parent moves the ledger and its witness aside, and
/// the next session starts a new ledger, every budget at zero), and so is the catalog, which
/// chooses the ledger (round 46, review of the fixes: crate::catalog::Catalog::load).
pub fn path_others_control(path: &Path) -> Option<OthersControl> {
    walk_others_control(&absolute(path)?, Walk::Every)
}

/// `path`, joined to the current directory when relative (`getcwd`: already physical).
fn absolute(path: &Path) -> Option<PathBuf> {
    if path.is_absolute() {
        Some(path.to_path_buf())
    } else {
        Some(std::env::current_dir().ok()?.join(path))
    }
}

/// A directory in which a user other than this process's may replace an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OthersControl {
    /// The entry that could be replaced (a link, a directory or a file on the way).
    pub entry: PathBuf,
    /// The directory that holds it.
    pub dir: PathBuf,
    /// Why others control `dir`.
    pub why: Control,
    /// `dir`'s permission bits.
    pub mode: u32,
}

impl OthersControl {
    /// Why, in words: `another user owns`, `others can write` (with how, for a group or an ACL).
    pub fn what(&self) -> &'static str {
        self.why.what()
    }

    /// What the data owner does about it, as a command on [`OthersControl::dir`].
    pub fn fix(&self) -> String {
        self.why.fix(&self.dir)
    }
}

/// How a user other than this process's can write a file or directory (or replace an entry in
/// it): the rule of [`others_can_write`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Another user (not this process's, not root) owns it.
    Foreign,
    /// Its mode lets every user write it.
    Others,
    /// Its mode lets its group write it, whatever the group: a user's same-numbered group can
    /// have other members (round 46, review of the fixes).
    Group,
    /// Its POSIX access ACL may let other users or groups write it (an ACL mask with write, or
    /// an ACL that cannot be read or understood).
    Acl,
}

impl Control {
    /// In words, to follow "a directory" or "a file": `another user owns`, `others can write`…
    pub fn what(self) -> &'static str {
        match self {
            Control::Foreign => "another user owns",
            Control::Others => "others can write",
            Control::Group => "others can write through its group",
            Control::Acl => "others can write through an ACL",
        }
    }

    /// The command that takes the control away, for `path`.
    pub fn fix(self, path: &Path) -> String {
        let p = path.display();
        match self {
            Control::Foreign => format!("use a place you own instead of {p}"),
            Control::Others => format!("`chmod go-w {p}`"),
            Control::Group => format!(
                "`chmod g-w {p}`; a tree made under umask 002 needs `chmod -R g-w` on its top"
            ),
            Control::Acl => format!(
                "`chmod g-w {p}`, which takes write from the ACL's mask, or `setfacl -b {p}`"
            ),
        }
    }
}

/// Whether a user other than this process's (`me`) or root can write the file or directory at
/// `path` (`m`: its metadata, links followed), and how. Another user owns it; or its mode lets
/// others or its group write it (any group: round 46, review of the fixes, a same-numbered
/// group can have members too); or its POSIX access ACL has a mask that allows write (with an
/// ACL, the mode's group bits are the mask, so this is also `g+w`: the ACL is read first, to
/// name the cause, and in case a file system says otherwise), or cannot be read or understood.
/// A named ACL entry whose write the mask withholds grants none (only the owner can change the
/// mask), so an ACL such as `u:www-data:x` on a home directory passes. Only POSIX ACLs on Linux
/// are read; NFSv4 and other ACL models are not inspected (docs/LEDGER.md, "Who owns the
/// ledger").
pub fn others_can_write(path: &Path, m: &std::fs::Metadata, me: u32) -> Option<Control> {
    use std::os::unix::fs::MetadataExt;
    if m.uid() != me && m.uid() != 0 {
        Some(Control::Foreign)
    } else if m.mode() & 0o002 != 0 {
        Some(Control::Others)
    } else if acl_may_write(path) {
        Some(Control::Acl)
    } else if m.mode() & 0o020 != 0 {
        Some(Control::Group)
    } else {
        None
    }
}

/// Whether `path`'s POSIX access ACL (`system.posix_acl_access`, links followed) may let a
/// user other than its owner write it beyond the mode's `other` bits: see [`acl_lets_write`].
/// No ACL (or none supported) is `false`; an error reading it is `true`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn acl_may_write(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    let name = c"system.posix_acl_access";
    let get = |buf: &mut [u8]| {
        // SAFETY: NUL-terminated path and name; `buf` is valid for `buf.len()` bytes (a null
        // pointer with size 0 asks for the size).
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                if buf.is_empty() {
                    std::ptr::null_mut()
                } else {
                    buf.as_mut_ptr().cast()
                },
                buf.len(),
            )
        };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error().raw_os_error())
    };
    match get(&mut []) {
        Ok(size) => {
            let mut buf = vec![0u8; size];
            match get(&mut buf) {
                Ok(n) => acl_lets_write(&buf[..n.min(size)]),
                Err(_) => true,
            }
        }
        Err(Some(libc::ENODATA | libc::ENOTSUP)) => false,
        Err(_) => true,
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn acl_may_write(_path: &Path) -> bool {
    false
}

/// Whether a Linux POSIX ACL value (`system.posix_acl_access`: a version 2 header, then entries
/// of tag, permissions and id, little-endian) may let a user other than the owner write: its
/// mask has write (every named user, named group and the owning group is limited by the mask),
/// or it has named entries and no mask, or it is not such a value.
fn acl_lets_write(v: &[u8]) -> bool {
    const USER: u16 = 0x02;
    const GROUP: u16 = 0x08;
    const MASK: u16 = 0x10;
    const BASE: [u16; 3] = [0x01, 0x04, 0x20];
    const WRITE: u16 = 0x02;
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) || v[..4] != 2u32.to_le_bytes() {
        return true;
    }
    let (mut named, mut mask) = (false, None);
    for e in v[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        match tag {
            USER | GROUP => named = true,
            MASK => mask = Some(perm & WRITE != 0),
            t if BASE.contains(&t) => {}
            _ => return true,
        }
    }
    mask.unwrap_or(named)
}

/// The rule (round 45, shared with the ledger's location and the catalog's in round 46): a
/// directory lets a user other than this process's replace an entry when [`others_can_write`]
/// it, unless it is not another user's and its sticky bit keeps everyone but the entry's owner
/// (this process's user, `entry_uid`) from replacing it.
fn others_control(dir: &Path, m: &std::fs::Metadata, entry_uid: u32, me: u32) -> Option<Control> {
    use std::os::unix::fs::MetadataExt;
    let why = others_can_write(dir, m, me)?;
    let sticky_mine = m.mode() & 0o1000 != 0 && entry_uid == me;
    (why == Control::Foreign || !sticky_mine).then_some(why)
}

/// Which directories [`walk_others_control`] checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Only those that hold a symbolic link on the way.
    Links,
    /// Every directory on the way.
    Every,
}

/// Walks `p` from `/`, following symbolic links (at most 40), and returns the first directory
/// [`others_control`] (of those `walk` checks). `..` is resolved where it is met (after the links
/// before it). With [`Walk::Links`] the walk ends without a finding where a component is
/// missing; with [`Walk::Every`] the directory that would hold it is checked first.
fn walk_others_control(p: &Path, walk: Walk) -> Option<OthersControl> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    // The components still to walk, the next last (names and `..`).
    let reversed = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .rev()
            .collect()
    };
    let finding = |dir: &Path, entry: &Path, entry_uid: u32| -> Option<OthersControl> {
        let m = std::fs::metadata(dir).ok()?;
        others_control(dir, &m, entry_uid, me).map(|why| OthersControl {
            entry: entry.to_path_buf(),
            dir: dir.to_path_buf(),
            why,
            mode: m.mode() & 0o7777,
        })
    };
    let mut rest = reversed(p);
    while let Some(c) = rest.pop() {
        if c == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        let m = match std::fs::symlink_metadata(&next) {
            Ok(m) => m,
            // Created later by this process: whoever controls its directory controls it.
            Err(e) if walk == Walk::Every && e.kind() == std::io::ErrorKind::NotFound => {
                return finding(&cur, &next, me);
            }
            Err(_) => return None,
        };
        let link = m.file_type().is_symlink();
        if (walk == Walk::Every || link)
            && let Some(f) = finding(&cur, &next, m.uid())
        {
            return Some(f);
        }
        if !link {
            cur = next;
            continue;
        }
        hops += 1;
        if hops > 40 {
            return None;
        }
        // Follow it: its target's components replace it.
        let target = std::fs::read_link(&next).ok()?;
        if target.is_absolute() {
            cur = PathBuf::from("/");
        }
        rest.extend(reversed(&target));
    }
    None
}

/// Resolves a location into its file set.
pub fn resolve(location: &str, base: &Path) -> Result<FileSet, FileError> {
    let p = local_path(location, base)?;
    let (prefix, rest) = split_glob(&p);
    let root = std::fs::canonicalize(&prefix).map_err(io(location))?;
    let meta = std::fs::metadata(&root).map_err(io(location))?;
    let pattern = match &rest {
        Some(r) => {
            let text = format!(
                "{}/{}",
                glob::Pattern::escape(&root.to_string_lossy()),
                r.to_string_lossy()
            );
            Some(glob::Pattern::new(&text).map_err(|_| FileError::BadGlob(location.to_string()))?)
        }
        None => None,
    };
    let mut set = FileSet {
        location: location.to_string(),
        root: root.clone(),
        root_is_dir: meta.is_dir(),
        glob: pattern.as_ref().map(|p| p.as_str().to_string()),
        files: vec![],
        dirs: vec![],
    };
    if !meta.is_dir() {
        set.files.push(FileId::of(root, &meta));
        return Ok(set);
    }
    // Walk the directory: every entry, symbolic links followed to their canonical target (an
    // entry that cannot be resolved is refused), each directory visited once.
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(root.clone(), root.clone(), 0usize)];
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: false,
        require_literal_leading_dot: false,
    };
    while let Some((dir, shown, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(FileError::TooMany(location.to_string()));
        }
        let m = std::fs::metadata(&dir).map_err(io(location))?;
        let id = FileId::of(dir.clone(), &m);
        if !seen.insert((id.dev, id.ino, id.path.clone())) {
            continue;
        }
        set.dirs.push(id);
        for entry in std::fs::read_dir(&dir).map_err(io(location))? {
            let entry = entry.map_err(io(location))?;
            // The path as the listing would see it (for glob matching), and its target.
            let listed = shown.join(entry.file_name());
            let unresolvable = |source| FileError::Unresolvable {
                location: location.to_string(),
                entry: entry.path().display().to_string(),
                source,
            };
            let target = std::fs::canonicalize(entry.path()).map_err(unresolvable)?;
            let tm = std::fs::metadata(&target).map_err(unresolvable)?;
            if tm.is_dir() {
                stack.push((target, listed, depth + 1));
            } else {
                let matches = pattern
                    .as_ref()
                    .is_none_or(|p| p.matches_path_with(&listed, opts));
                if matches {
                    set.files.push(FileId::of(target, &tm));
                }
            }
            if set.files.len() + set.dirs.len() > MAX_FILES {
                return Err(FileError::TooMany(location.to_string()));
            }
        }
    }
    // With a glob, only the files it matches count, and no directory grows the set.
    if pattern.is_some() {
        set.root_is_dir = false;
        set.dirs.clear();
    }
    set.files.sort_by(|a, b| a.path.cmp(&b.path));
    set.files.dedup();
    Ok(set)
}

impl FileSet {
    /// A set known only by its path (a private table whose files cannot be read now): treated
    /// as a directory, so anything at or below the path counts.
    pub fn path_only(path: &Path) -> FileSet {
        FileSet {
            location: path.to_string_lossy().to_string(),
            root: path.to_path_buf(),
            root_is_dir: true,
            glob: None,
            files: vec![],
            dirs: vec![],
        }
    }

    fn covers(&self, path: &Path) -> bool {
        path == self.root || (self.root_is_dir && path.starts_with(&self.root))
    }

    /// True when the two sets may read a common file.
    pub fn intersects(&self, other: &FileSet) -> bool {
        let points = |s: &FileSet| -> Vec<PathBuf> {
            let mut v = vec![];
            if s.glob.is_none() {
                v.push(s.root.clone());
            }
            v.extend(s.files.iter().map(|f| f.path.clone()));
            v.extend(s.dirs.iter().map(|f| f.path.clone()));
            v
        };
        if points(other).iter().any(|p| self.covers(p))
            || points(self).iter().any(|p| other.covers(p))
        {
            return true;
        }
        let ids = |s: &FileSet| -> Vec<FileId> { s.files.iter().chain(&s.dirs).cloned().collect() };
        let (a, b) = (ids(self), ids(other));
        a.iter()
            .any(|x| b.iter().any(|y| x.same_inode(y) || x.path == y.path))
    }

    /// True when `path` (canonicalised as far as it exists) is this set's root, lies below a
    /// directory root, or is one of its files (by path or device and inode).
    pub fn contains_path(&self, path: &Path) -> bool {
        let canon = canonical_prefix(path);
        if self.covers(&canon) || self.files.iter().any(|f| f.path == canon) {
            return true;
        }
        match std::fs::metadata(&canon) {
            Ok(m) => {
                let id = FileId::of(canon, &m);
                self.files
                    .iter()
                    .chain(&self.dirs)
                    .any(|f| f.same_inode(&id))
            }
            Err(_) => false,
        }
    }
}

/// `path` with its longest existing prefix canonicalised and the rest appended.
fn canonical_prefix(path: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(path) {
        return c;
    }
    let mut rest = Vec::new();
    let mut p = path.to_path_buf();
    while let Some(name) = p.file_name().map(|n| n.to_os_string()) {
        p.pop();
        rest.push(name);
        if let Ok(c) = std::fs::canonicalize(&p) {
            let mut out = c;
            for n in rest.iter().rev() {
                out.push(n);
            }
            return out;
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> crate::testdir::TestPath {
        let d = crate::testdir::test_dir("files");
        std::fs::create_dir_all(d.join("d/sub")).unwrap();
        std::fs::create_dir_all(d.join("other")).unwrap();
        std::fs::write(d.join("d/p.csv"), "a\n1\n").unwrap();
        std::fs::write(d.join("d/q.csv"), "a\n2\n").unwrap();
        std::fs::write(d.join("other/r.csv"), "a\n3\n").unwrap();
        d
    }

    /// Review r45: a link in a directory others can write lets them choose a table's files
    /// (and, by repointing a renamed private file, a fresh budget). Such a link is named;
    /// a link in a directory only its owner writes, or one of ours under a sticky bit, is not.
    #[test]
    fn a_link_others_can_replace_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp();
        let shared = d.join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("real.csv"), "a\n1\n").unwrap();
        std::os::unix::fs::symlink("real.csv", shared.join("link.csv")).unwrap();
        std::os::unix::fs::symlink(&shared, d.join("d/to-shared")).unwrap();
        let chmod = |m| std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(m));
        let at = |p: &str| link_others_control(&d.join(p).to_string_lossy(), Path::new("/"));
        chmod(0o777).unwrap();
        let why = at("shared/link.csv").expect("a link in a world-writable directory");
        assert!(why.contains("others can write"), "{why}");
        // Through a link elsewhere, into the shared directory: the link inside is still met.
        assert!(at("d/to-shared/link.csv").is_some());
        assert!(at("shared/real.csv").is_none(), "no link on the way");
        chmod(0o1777).unwrap();
        assert!(at("shared/link.csv").is_none(), "ours, under a sticky bit");
        chmod(0o755).unwrap();
        assert!(at("shared/link.csv").is_none());
        assert!(at("d/to-shared/link.csv").is_none());
        // Group-writable, whatever the group (round 46, review of the fixes): the message says
        // what to do.
        chmod(0o775).unwrap();
        let why = at("shared/link.csv").expect("a link in a group-writable directory");
        assert!(why.contains("through its group"), "{why}");
        assert!(
            why.contains(&format!("`chmod g-w {}`", shared.display())),
            "{why}"
        );
    }

    /// Round 46, review of the fixes (F3): a directory its group can write counts as others',
    /// whatever the group (the owner's same-numbered group can have other members), and so does
    /// one whose POSIX ACL lets a named user or group write (`setfacl -m u:someone:rwx`); a
    /// sticky one still protects the owner's entries, and an ACL whose mask withholds write
    /// grants none.
    #[test]
    fn a_directory_its_group_or_an_acl_can_write_is_others_control() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmp();
        let shared = d.join("shared");
        std::fs::create_dir(&shared).unwrap();
        let ledger = shared.join("dp/ledger.jsonl");
        let chmod = |m| std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(m));
        chmod(0o775).unwrap();
        let c = path_others_control(&ledger).expect("group-writable");
        assert_eq!(
            (c.why, c.dir.as_path(), c.mode),
            (Control::Group, &*shared, 0o775)
        );
        assert!(
            c.fix()
                .starts_with(&format!("`chmod g-w {}`", shared.display()))
        );
        chmod(0o1775).unwrap();
        assert_eq!(
            path_others_control(&ledger),
            None,
            "sticky: our entry is ours"
        );
        chmod(0o755).unwrap();
        assert_eq!(path_others_control(&ledger), None);
        // An ACL as `setfacl -m u:4242:rwx` writes it (version 2; user::rwx, user:4242:rwx,
        // group::r-x, mask::rwx, other::---), where the file system keeps ACLs.
        let acl = |entries: &[(u16, u16, u32)]| -> Vec<u8> {
            let mut v = 2u32.to_le_bytes().to_vec();
            for (tag, perm, id) in entries {
                v.extend(tag.to_le_bytes());
                v.extend(perm.to_le_bytes());
                v.extend(id.to_le_bytes());
            }
            v
        };
        const ANY: u32 = u32::MAX;
        let writes = acl(&[
            (0x01, 7, ANY),
            (0x02, 7, 4242),
            (0x04, 5, ANY),
            (0x10, 7, ANY),
            (0x20, 0, ANY),
        ]);
        let reads = acl(&[
            (0x01, 7, ANY),
            (0x02, 7, 4242),
            (0x04, 5, ANY),
            (0x10, 5, ANY),
            (0x20, 0, ANY),
        ]);
        assert!(acl_lets_write(&writes));
        assert!(!acl_lets_write(&reads), "the mask withholds write");
        assert!(!acl_lets_write(&acl(&[
            (0x01, 7, ANY),
            (0x04, 5, ANY),
            (0x20, 5, ANY)
        ])));
        assert!(
            acl_lets_write(&acl(&[(0x01, 7, ANY), (0x08, 7, 4242)])),
            "no mask"
        );
        assert!(acl_lets_write(&writes[..9]), "cut");
        assert!(acl_lets_write(&[1, 0, 0, 0]), "another version");
        assert!(acl_lets_write(&acl(&[(0x40, 0, ANY)])), "an unknown tag");
        use std::os::unix::ffi::OsStrExt;
        let set = |v: &[u8]| {
            let c = std::ffi::CString::new(shared.as_os_str().as_bytes()).unwrap();
            // SAFETY: NUL-terminated path and name, `v` valid for its length.
            unsafe {
                libc::setxattr(
                    c.as_ptr(),
                    c"system.posix_acl_access".as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    0,
                )
            }
        };
        chmod(0o750).unwrap();
        if set(&writes) == 0 {
            let c = path_others_control(&ledger).expect("an ACL that lets a user write");
            assert_eq!(c.why, Control::Acl, "{c:?}");
            assert_eq!(c.mode, 0o770, "the kernel shows the mask as the group bits");
            assert!(c.fix().contains("chmod g-w"), "{}", c.fix());
            assert!(acl_may_write(&shared));
            // `chmod g-w` takes write from the mask: the named entry no longer writes.
            chmod(0o755).unwrap();
            assert!(!acl_may_write(&shared));
            assert_eq!(path_others_control(&ledger), None);
            assert_eq!(set(&reads), 0);
            assert!(!acl_may_write(&shared));
            assert_eq!(path_others_control(&ledger), None, "read-only named entry");
        }
        assert!(!acl_may_write(&d.join("d")), "no ACL");
    }

    #[test]
    fn every_spelling_of_a_private_file_intersects_it() {
        let d = tmp();
        let root = Path::new("/");
        let p = resolve(&d.join("d/p.csv").to_string_lossy(), root).unwrap();
        let ds = d.to_string_lossy().to_string();
        std::os::unix::fs::symlink(d.join("d/p.csv"), d.join("other/link.csv")).unwrap();
        std::os::unix::fs::symlink(d.join("d"), d.join("other/dirlink")).unwrap();
        std::fs::hard_link(d.join("d/p.csv"), d.join("other/hard.csv")).unwrap();
        for spelling in [
            format!("file://{ds}/d/p.csv"),
            format!("FILE://localhost{ds}/d/p.csv"),
            format!("file://{ds}/d/p%2Ecsv"),
            format!("file:{ds}/d/p.csv"),
            format!("{ds}/d"),
            format!("{ds}/d/"),
            format!("{ds}//d//"),
            format!("{ds}/d/*.csv"),
            format!("{ds}/d/p.cs?"),
            format!("{ds}/d/[p]*.csv"),
            format!("{ds}/**/p.csv"),
            format!("{ds}/d/../d/p.csv"),
            format!("{ds}/./d/./p.csv"),
            format!("{ds}/other/link.csv"),
            format!("{ds}/other/dirlink/p.csv"),
            format!("{ds}/other/dirlink"),
            format!("{ds}/other/hard.csv"),
            format!("{ds}/other"),
            ds.clone(),
        ] {
            let s = resolve(&spelling, root).unwrap_or_else(|e| panic!("{spelling}: {e}"));
            assert!(s.intersects(&p), "{spelling} does not intersect");
            assert!(p.intersects(&s), "{spelling} (reversed) does not intersect");
        }
        // Relative to a base directory.
        let s = resolve("d/p.csv", &d).unwrap();
        assert!(s.intersects(&p));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn other_files_do_not_intersect() {
        let d = tmp();
        let root = Path::new("/");
        let ds = d.to_string_lossy().to_string();
        let p = resolve(&format!("{ds}/d/p.csv"), root).unwrap();
        let r = resolve(&format!("{ds}/other/r.csv"), root).unwrap();
        assert!(!r.intersects(&p));
        let q = resolve(&format!("{ds}/d/q*.csv"), root).unwrap();
        assert_eq!(q.files.len(), 1);
        assert!(!q.intersects(&p), "a glob that misses the private file");
        // …but a private directory owns every file below it.
        let dir = resolve(&format!("{ds}/d"), root).unwrap();
        assert!(q.intersects(&dir));
        assert!(dir.contains_path(&d.join("d/new.csv")));
        assert!(dir.contains_path(&d.join("d/sub/deeper/x.csv")));
        assert!(!dir.contains_path(&d.join("other/x.csv")));
        assert!(p.contains_path(&d.join("other/../d/p.csv")));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn remote_and_missing_locations_are_errors() {
        let root = Path::new("/");
        assert!(matches!(
            resolve("s3://bucket/x.csv", root),
            Err(FileError::NotLocal(_))
        ));
        assert!(matches!(
            resolve("http://host/x.csv", root),
            Err(FileError::NotLocal(_))
        ));
        assert!(matches!(
            resolve("file://otherhost/x.csv", root),
            Err(FileError::RemoteHost(_))
        ));
        assert!(matches!(
            resolve("/no/such/dpfusion/file.csv", root),
            Err(FileError::Io { .. })
        ));
    }
}
