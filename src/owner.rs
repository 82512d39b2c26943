//! What belongs to the data owner (docs/PRIVACY.md, "Who decides what"): how the owner's files
//! are read (format options, pinned schema), and which files analyst SQL may never register,
//! read or write: the files of every private table the ledger knows, the ledger's directory and
//! the owner's own files (the catalog).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};

use crate::accounting::{Accountant, PinnedColumn};
use crate::error::refused;
use crate::files::{self, FileSet, PinnedFs};
use crate::session::AnalystFiles;

/// How the owner's CSV files are read. Analysts never choose these for a private table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CsvFormat {
    /// The first line holds the column names (default true).
    pub has_header: bool,
    /// The field delimiter (default `,`).
    pub delimiter: u8,
    /// The quote character (default `"`).
    pub quote: u8,
    /// The escape character (default none).
    pub escape: Option<u8>,
    /// Lines starting with this character are skipped (default none).
    pub comment: Option<u8>,
    /// Values matching this regular expression read as NULL (default: only empty values).
    pub null_regex: Option<String>,
}

impl Default for CsvFormat {
    fn default() -> Self {
        Self {
            has_header: true,
            delimiter: b',',
            quote: b'"',
            escape: None,
            comment: None,
            null_regex: None,
        }
    }
}

fn ch(c: Option<u8>) -> String {
    c.map_or("none".to_string(), |c| format!("{:?}", c as char))
}

/// Builders, so that code outside this crate (the struct is `#[non_exhaustive]`) starts from
/// [`CsvFormat::default`] and changes what differs.
impl CsvFormat {
    /// Whether the first line holds the column names.
    pub fn with_header(mut self, has_header: bool) -> Self {
        self.has_header = has_header;
        self
    }
    /// The field delimiter.
    pub fn with_delimiter(mut self, delimiter: u8) -> Self {
        self.delimiter = delimiter;
        self
    }
    /// The quote character.
    pub fn with_quote(mut self, quote: u8) -> Self {
        self.quote = quote;
        self
    }
    /// The escape character (None: none).
    pub fn with_escape(mut self, escape: Option<u8>) -> Self {
        self.escape = escape;
        self
    }
    /// Lines starting with this character are skipped (None: none).
    pub fn with_comment(mut self, comment: Option<u8>) -> Self {
        self.comment = comment;
        self
    }
    /// Values matching this regular expression read as NULL (None: only empty values).
    pub fn with_null_regex(mut self, null_regex: Option<String>) -> Self {
        self.null_regex = null_regex;
        self
    }

    /// The text the ledger records (a change of any option is a change of the table).
    pub fn describe(&self) -> String {
        format!(
            "csv(has_header={}, delimiter={}, quote={}, escape={}, comment={}, null_regex={})",
            self.has_header,
            ch(Some(self.delimiter)),
            ch(Some(self.quote)),
            ch(self.escape),
            ch(self.comment),
            self.null_regex
                .as_ref()
                .map_or("none".to_string(), |r| format!("{r:?}")),
        )
    }
}

/// Whether a path holds Parquet: a `.parquet` file, or a directory with a `.parquet` file below
/// it (else CSV).
pub fn is_parquet(path: &Path) -> bool {
    if !path.is_dir() {
        return path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("parquet"));
    }
    crate::files::resolve(&path.to_string_lossy(), Path::new("."))
        .map(|set| {
            set.files.iter().any(|f| {
                f.path
                    .extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("parquet"))
            })
        })
        .unwrap_or(false)
}

/// The pinned form of a schema.
pub fn pin(schema: &Schema) -> Vec<PinnedColumn> {
    schema
        .fields()
        .iter()
        .map(|f| PinnedColumn {
            name: f.name().clone(),
            data_type: f.data_type().to_string(),
            nullable: f.is_nullable(),
        })
        .collect()
}

/// The Arrow schema of a pinned one.
pub fn unpin(cols: &[PinnedColumn]) -> Result<SchemaRef> {
    let mut fields = Vec::with_capacity(cols.len());
    for c in cols {
        let t: DataType = c.data_type.parse().map_err(|e| {
            DataFusionError::Plan(format!(
                "column '{}': '{}' is not an Arrow type ({e}); write types as Arrow prints them, \
                 e.g. Int64, Float64, Utf8, Boolean, Date32",
                c.name, c.data_type
            ))
        })?;
        fields.push(Field::new(&c.name, t, c.nullable));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The owner's CSV provider (built in `tmp`, a context whose files go through the session's
/// pins, crate::files::store): read with `format`, with the pinned `schema` when there is one
/// (no inference), else with the schema inferred now (the owner's registration; it is then
/// pinned).
pub async fn csv_provider(
    tmp: &SessionContext,
    root: &Path,
    format: &CsvFormat,
    schema: Option<&Schema>,
) -> Result<Arc<dyn TableProvider>> {
    let ext = if root.is_dir() {
        ".csv".to_string()
    } else {
        root.extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default()
    };
    let mut opts = CsvReadOptions::new()
        .has_header(format.has_header)
        .delimiter(format.delimiter)
        .quote(format.quote)
        .file_extension(&ext);
    opts.escape = format.escape;
    opts.comment = format.comment;
    opts.null_regex = format.null_regex.clone();
    if let Some(s) = schema {
        opts = opts.schema(s);
    }
    tmp.register_csv("t", &root.to_string_lossy(), opts).await?;
    let provider = tmp.table_provider("t").await;
    tmp.deregister_table("t")?;
    provider
}

/// The owner's Parquet provider (a file, or a directory of `.parquet` files), with the pinned
/// schema when there is one.
pub async fn parquet_provider(
    tmp: &SessionContext,
    root: &Path,
    schema: Option<&Schema>,
) -> Result<Arc<dyn TableProvider>> {
    let ext = if root.is_dir() {
        ".parquet".to_string()
    } else {
        root.extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default()
    };
    let mut opts = ParquetReadOptions::default().file_extension(&ext);
    if let Some(s) = schema {
        opts = opts.schema(s);
    }
    tmp.register_parquet("t", &root.to_string_lossy(), opts)
        .await?;
    let provider = tmp.table_provider("t").await;
    tmp.deregister_table("t")?;
    provider
}

/// The files analyst SQL may never register, read or write.
#[derive(Debug)]
pub struct Protection {
    accountant: Arc<Accountant>,
    /// The owner's own files: the ledger, its sidecar, the catalog.
    owner_files: Vec<PathBuf>,
    /// The ledger's directory (no file may be written directly in it).
    ledger_dir: Option<PathBuf>,
    /// The ledger's canonical path: it and every `<ledger>.<suffix>` are the ledger's (`.head`,
    /// `.checkpoint`, their temporaries, `ledger migrate`'s `.v1.bak`).
    ledger_files: PathBuf,
}

/// Who registers (both are refused the ledger, its sidecar and the catalog; the role names the
/// caller in messages and leaves room for rules that differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Owner,
    Analyst,
}

impl Protection {
    pub fn new(accountant: Arc<Accountant>, owner_paths: Vec<PathBuf>) -> Self {
        let mut files: Vec<PathBuf> = owner_paths
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        let ledger = accountant.path();
        let ledger = std::fs::canonicalize(ledger).unwrap_or_else(|_| ledger.to_path_buf());
        let mut head = ledger.clone().into_os_string();
        head.push(".head");
        files.push(PathBuf::from(head));
        let ledger_dir = ledger.parent().map(Path::to_path_buf);
        let ledger_files = ledger.clone();
        files.push(ledger);
        Self {
            accountant,
            owner_files: files,
            ledger_dir,
            ledger_files,
        }
    }

    /// The file sets of the private tables the ledger knows (re-resolved now, so new files and
    /// links count), and of the owner's files.
    /// Each with the ledger key of the private table it belongs to (None: the owner's files).
    fn protected(&self, role: Role) -> Vec<(String, Option<String>, FileSet)> {
        let mut out = Vec::new();
        for p in self.accountant.policies() {
            // Gone or unreadable now: its path still counts.
            let Some(set) = p.private_files() else {
                continue;
            };
            let what = format!("private table '{}' ({})", p.name, p.key);
            out.push((what, Some(p.key.as_str().to_string()), set));
        }
        let _ = role;
        for path in &self.owner_files {
            let what = format!("the data owner's {}", path.display());
            match files::resolve(&path.to_string_lossy(), Path::new("/")) {
                Ok(set) => out.push((what, None, set)),
                Err(_) => out.push((what, None, FileSet::path_only(path))),
            }
        }
        out
    }

    /// Refuses a file set that may read a protected file; `except_key` is the ledger key of the
    /// table being registered (its own files are not another table's). Compared as keys, not as
    /// the files a key resolves to now: when a private table's path has become a link to
    /// another file, that file is still the first table's, and registering it under its own
    /// path (a new key, a fresh budget) is refused (review r45).
    pub fn check_read(&self, set: &FileSet, except_key: Option<&str>, role: Role) -> Result<()> {
        for (what, key, p) in self.protected(role) {
            if except_key.is_some() && key.as_deref() == except_key {
                continue;
            }
            if set.intersects(&p) {
                return refused!(
                    "dpfusion refused the registration: '{}' names files of {what}. Analyst SQL \
                     can never register, re-register or re-format a file that holds private \
                     data, under any path, URL, glob, directory or link; query the table by its \
                     name, through the DP functions.",
                    set.location
                );
            }
        }
        // The ledger's own files, whatever their suffix (review r45: `ledger migrate`'s backup,
        // which holds every analyst's SQL in clear, could be registered from an
        // analyst_read_dirs that holds the ledger's directory).
        let prefix = self.ledger_files.as_os_str().as_encoded_bytes();
        let ledgers = |p: &Path| {
            let b = p.as_os_str().as_encoded_bytes();
            b.starts_with(prefix) && b.get(prefix.len()).is_none_or(|&c| c == b'.')
        };
        if (set.glob.is_none() && ledgers(&set.root)) || set.files.iter().any(|f| ledgers(&f.path))
        {
            return refused!(
                "dpfusion refused the registration: '{}' names files of the data owner's ledger \
                 ({}). Query the budget with SHOW BUDGET or dp_budget(), and the charges with \
                 dp_ledger()",
                set.location,
                self.ledger_files.display()
            );
        }
        Ok(())
    }

    /// Refuses a write target that is protected, or any file directly in the ledger's directory
    /// (where the ledger keeps its sidecar and temporaries).
    pub fn check_write(&self, target: &Path) -> Result<()> {
        let parent = target
            .parent()
            .map(|p| std::fs::canonicalize(p).unwrap_or(p.to_path_buf()));
        if parent.is_some() && parent == self.ledger_dir {
            return refused!(
                "dpfusion refused the query: COPY ... TO '{}' would write into the ledger's \
                 directory",
                target.display()
            );
        }
        for (what, _, p) in self.protected(Role::Analyst) {
            if p.contains_path(target) {
                return refused!(
                    "dpfusion refused the query: COPY ... TO '{}' would write into {what}",
                    target.display()
                );
            }
        }
        Ok(())
    }
}

/// Where a `COPY … TO` may write (`table_keys`: the ledger keys of the tables registered in the
/// session): only a new file, by a plain file name, directly in the
/// output directory the data owner configured ([`crate::SessionOptions`]'s `output_dir`, pinned when
/// the session opened). The checks here give the messages; the write itself goes through
/// [`crate::files::PinnedFs::create_output`], which opens the pinned directory without
/// following links and creates the file with `O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing
/// swapped in after these checks can redirect it.
pub(crate) fn copy_target(
    url: &str,
    fs: &PinnedFs,
    protection: &Protection,
    table_keys: &[String],
) -> Result<String> {
    let Some(dir) = fs.output_dir() else {
        return refused!(
            "dpfusion refused the query: COPY ... TO writes files, and this session has no \
             output directory (the data owner sets one with --output-dir, or \
             SessionOptions::with_output_dir). Use CREATE TABLE name AS SELECT ... to keep \
             results in the session, or --format csv|json to save printed results."
        );
    };
    let rel = Path::new(url);
    let plain = !url.contains("://")
        && !url.contains(['*', '?', '[', '{'])
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    let has_extension = rel.extension().is_some();
    if !plain || url.ends_with('/') || !has_extension {
        return refused!(
            "dpfusion refused the query: COPY ... TO '{url}': the target must be a relative \
             file name inside the output directory {} (no '..', no absolute path, no URL, \
             no glob, no directory; a file name with an extension)",
            dir.display()
        );
    }
    fs.check_output()
        .map_err(|e| crate::error::Error::refused(format!("dpfusion refused the query: {e}")))?;
    let target = dir.join(rel);
    // No symbolic link on the way (the message; the write refuses them anyway).
    let mut p = dir.clone();
    for c in rel.components() {
        p.push(c);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            return refused!(
                "dpfusion refused the query: COPY ... TO '{url}' goes through a symbolic link"
            );
        }
    }
    if rel.components().count() != 1 {
        return refused!(
            "dpfusion refused the query: COPY ... TO '{url}': COPY writes one new file \
             directly in the output directory {} (no sub-directory)",
            dir.display()
        );
    }
    // Never the ledger's directory, the owner's files or a private table's files (any the
    // ledger knows), nor a file of a table registered in this session.
    protection.check_write(&target)?;
    let taken = table_keys.iter().any(|k| {
        k.strip_prefix("analyst:")
            .unwrap_or(k)
            .split(',')
            .map(Path::new)
            .any(|k| k.is_absolute() && (target.starts_with(k) || k.starts_with(&target)))
    });
    if taken {
        return refused!(
            "dpfusion refused the query: COPY ... TO '{url}' would write over a registered \
             table's file"
        );
    }
    match std::fs::symlink_metadata(&target) {
        Ok(m) if !m.is_file() => {
            return refused!(
                "dpfusion refused the query: COPY ... TO '{url}' is not a regular file"
            );
        }
        Ok(_) => {
            return refused!(
                "dpfusion refused the query: COPY ... TO '{url}': the file exists; COPY only \
                 creates new files (choose a new name)"
            );
        }
        Err(_) => {}
    }
    Ok(target.to_string_lossy().to_string())
}

/// The file set of a location analyst SQL names (`CREATE EXTERNAL TABLE`), if the owner allows
/// its files ([`AnalystFiles`]) and none is protected; checked at registration and again before
/// every scan. Outside the allowed directories nothing is resolved in the message: whether a
/// path exists there is not the analyst's to learn.
pub(crate) fn analyst_file_set(
    location: &str,
    analyst_files: &AnalystFiles,
    protection: &Protection,
) -> Result<crate::files::FileSet> {
    {
        let resolve = || {
            crate::files::resolve(location, Path::new(".")).map_err(|e| {
                crate::error::Error::refused(format!("dpfusion refused the registration: {e}"))
            })
        };
        let set = match analyst_files {
            AnalystFiles::None => {
                return refused!(
                    "dpfusion refused the registration of '{location}': in this session the data \
                     owner lets analyst SQL register no file. Query the tables the owner \
                     declared (SHOW TABLES, \\d), or ask the owner to add the file to the \
                     catalog, or to list its directory in analyst_read_dirs."
                );
            }
            AnalystFiles::Under(dirs) => {
                let dirs: Vec<PathBuf> = dirs
                    .iter()
                    .filter_map(|d| std::fs::canonicalize(d).ok())
                    .collect();
                let outside = || {
                    refused!(
                        "dpfusion refused the registration of '{location}': analyst SQL may \
                         register existing files only below {}",
                        dirs.iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                let Ok(set) = resolve() else {
                    return outside();
                };
                let inside = |p: &Path| dirs.iter().any(|d| p.starts_with(d));
                let all_inside = inside(&set.root)
                    && set.files.iter().all(|f| inside(&f.path))
                    && set.dirs.iter().all(|f| inside(&f.path));
                if !all_inside {
                    return outside();
                }
                set
            }
            AnalystFiles::Anywhere => resolve()?,
        };
        protection.check_read(&set, None, Role::Analyst)?;
        Ok(set)
    }
}
