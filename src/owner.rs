//! What belongs to the data owner (docs/PRIVACY.md, "Who decides what"): how the owner's files
//! are read (format options, pinned schema), and which files analyst SQL may never register,
//! read or write: the files of every private table the ledger knows, the ledger's directory and
//! the owner's own files (the catalog).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::context::SessionContext;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};

use crate::accounting::{Accountant, PinnedColumn, Visibility};
use crate::files::{self, FileSet};

/// How the owner's CSV files are read. Analysts never choose these for a private table.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl CsvFormat {
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
        files.push(ledger);
        Self {
            accountant,
            owner_files: files,
            ledger_dir,
        }
    }

    /// The file sets of the private tables the ledger knows (re-resolved now, so new files and
    /// links count), and of the owner's files.
    fn protected(&self, role: Role) -> Vec<(String, FileSet)> {
        let mut out = Vec::new();
        for p in self.accountant.policies() {
            if p.visibility != Visibility::Private || !p.key.as_str().starts_with('/') {
                continue;
            }
            let what = format!("private table '{}' ({})", p.name, p.key);
            match files::resolve(p.key.as_str(), Path::new("/")) {
                Ok(set) => out.push((what, set)),
                // Gone or unreadable now: its path still counts.
                Err(_) => out.push((what, FileSet::path_only(Path::new(p.key.as_str())))),
            }
        }
        let _ = role;
        for path in &self.owner_files {
            let what = format!("the data owner's {}", path.display());
            match files::resolve(&path.to_string_lossy(), Path::new("/")) {
                Ok(set) => out.push((what, set)),
                Err(_) => out.push((what, FileSet::path_only(path))),
            }
        }
        out
    }

    /// Refuses a file set that may read a protected file; `except_key` is the table being
    /// registered (its own files are not another table's).
    pub fn check_read(&self, set: &FileSet, except_key: Option<&str>, role: Role) -> Result<()> {
        for (what, p) in self.protected(role) {
            if except_key.is_some_and(|k| p.root.as_os_str() == k) {
                continue;
            }
            if set.intersects(&p) {
                return plan_err!(
                    "dpfusion refused the registration: '{}' names files of {what}. Analyst SQL \
                     can never register, re-register or re-format a file that holds private \
                     data, under any path, URL, glob, directory or link; query the table by its \
                     name, through the DP functions.",
                    set.location
                );
            }
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
            return plan_err!(
                "dpfusion refused the query: COPY ... TO '{}' would write into the ledger's \
                 directory",
                target.display()
            );
        }
        for (what, p) in self.protected(Role::Analyst) {
            if p.contains_path(target) {
                return plan_err!(
                    "dpfusion refused the query: COPY ... TO '{}' would write into {what}",
                    target.display()
                );
            }
        }
        Ok(())
    }
}
