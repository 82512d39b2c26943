//! The data owner's catalog: a TOML file (`dpfusion --catalog dpfusion.toml`) that declares the
//! session (ledger, output directory, which files analysts may register) and every table (path,
//! format and its options, schema, visibility, neighbours, public columns, budget, filter, ratio
//! bounds). docs/CATALOG.md documents every key; `examples/catalog/dpfusion.toml` is a complete
//! example.
//!
//! Relative paths are relative to the catalog file's directory. Unknown keys are errors (a typo
//! must never silently leave a default in force). A catalog that another user could replace or
//! write (its directory, one on the way, or the file itself) is refused when loaded: it chooses
//! the ledger and the budgets (round 46; docs/CATALOG.md, "Who must own what"). A catalog whose
//! ledger does not exist yet while a witness it may have kept does is refused when opened, before
//! anything is created: an edited `ledger` never starts every budget at zero silently (round 52;
//! [`Catalog::check_ledger_continues`], docs/CATALOG.md, "Moving the ledger").
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use serde::Deserialize;

use crate::accounting::{FilterKind, Neighbours, PinnedColumn, TablePolicy, Visibility};
use crate::owner::CsvFormat;
use crate::session::{AnalystFiles, PrivateSession, Registration, SessionOptions};

/// A parsed catalog.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// The catalog file (canonical).
    pub path: PathBuf,
    pub session: SessionSection,
    pub tables: Vec<TableSection>,
    /// `[[analyst]]`: who may connect to `dpfusion serve` (crate::serve).
    pub analysts: Vec<AnalystSection>,
    /// `[server]`: `dpfusion serve`'s settings.
    pub server: ServerSection,
}

/// One `[[analyst]]`: a name (recorded with every charge the analyst makes over the server) and
/// the salted hash of their bearer token (`dpfusion token` prints one). The name is the analyst's
/// identity in the ledger (`dp_ledger()` shows an analyst the SQL recorded under it), so it is
/// never given to another person; `dpfusion serve` reads the analysts when it starts, so a
/// revoked or rotated token takes effect at its restart (round 52; docs/CATALOG.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalystSection {
    pub name: String,
    /// `sha256:<salt hex>:<SHA-256(salt ‖ token) hex>`.
    pub token_hash: String,
}

/// `[server]` (every key optional; `dpfusion serve`'s flags override them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// The address to listen on (default `127.0.0.1:50051`).
    pub listen: Option<String>,
    /// A statement's time limit in seconds, admission and execution (default 300).
    pub query_timeout_secs: Option<f64>,
    /// How many statements run at once; more wait their turn (default: the number of cores, at
    /// least 2; 1 is refused with two analysts or more: round 52).
    pub max_concurrent_queries: Option<usize>,
    /// The longest SQL text accepted, in bytes (default 1 MiB).
    pub max_sql_bytes: Option<usize>,
    /// On SIGTERM, how long statements under way may take to finish before they are cancelled,
    /// in seconds (default 10).
    pub shutdown_grace_secs: Option<f64>,
    /// How many statements (and prepares) of one analyst run at once (default: half of
    /// `max_concurrent_queries`, rounded up; with two analysts or more, at most all the turns
    /// but one, whatever is set: round 52).
    pub max_queries_per_analyst: Option<usize>,
    /// How many calls of one analyst may be in flight, running or waiting for a turn (default:
    /// twice `max_queries_per_analyst`, at least 16; round 46).
    pub max_calls_per_analyst: Option<usize>,
    /// How many results of one analyst may wait to be fetched, statements under way included;
    /// checked before admission (default 64).
    pub max_pending_results: Option<usize>,
    /// How many bytes of one analyst's results may wait to be fetched (default 1 GiB).
    pub max_pending_bytes: Option<usize>,
    /// The largest result of one statement, in bytes (default 256 MiB).
    pub max_result_bytes: Option<usize>,
    /// The bytes of the tables one analyst may ingest over Flight SQL into their own schema
    /// `mine` (default 256 MiB).
    pub max_ingest_bytes_per_analyst: Option<usize>,
    /// The most bytes the server holds for all analysts together, results waiting to be
    /// fetched and uploads (default: the analysts' shares' sum; round 48:
    /// `serve::ServeOptions::max_held_bytes`).
    pub max_held_bytes: Option<usize>,
    /// How long a result waits to be fetched before it is dropped, in seconds (default 600).
    pub result_ttl_secs: Option<f64>,
    /// How many connections may be open at once (default 256).
    pub max_connections: Option<usize>,
    /// How long a new connection may take to make its first authenticated call, in seconds
    /// (default 10).
    pub handshake_timeout_secs: Option<f64>,
    /// How long a connection may go without an authenticated call, in seconds (default 600).
    pub idle_timeout_secs: Option<f64>,
    /// Serve over TLS: the certificate chain and the private key (PEM; relative to the
    /// catalog). Both or neither.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// `[session]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSection {
    /// The ledger (default `.dpfusion/ledger.jsonl` beside the catalog): where every table's
    /// budget lives, so one dataset has one ledger (docs/CATALOG.md, "One dataset, one ledger").
    pub ledger: Option<PathBuf>,
    /// The ledger's witness (docs/LEDGER.md), outside the ledger's directory. Default:
    /// `<catalog file>.witness` beside the catalog; when that is the ledger's directory, the
    /// default without a catalog (`<ledger dir>.witness/<ledger file>.witness`).
    pub ledger_witness: Option<PathBuf>,
    /// The only directory `COPY ... TO` may write into (default none: COPY is refused).
    pub output_dir: Option<PathBuf>,
    /// Directories whose files analyst SQL may register as public tables (default none).
    #[serde(default)]
    pub analyst_read_dirs: Vec<PathBuf>,
    /// The `delta` of a DP call that gives none (default 1e-7).
    pub default_delta: Option<f64>,
    /// The memory one statement may use, in bytes (default 4 GiB), each statement a pool of
    /// its own (round 48).
    pub memory_limit: Option<usize>,
    /// Where statements spill to disk (default: the OS temporary directory; round 48:
    /// [`SessionOptions::spill_dir`]).
    pub spill_dir: Option<PathBuf>,
    /// The most bytes one statement may spill (default 16 GiB; 0: never; round 48:
    /// [`SessionOptions::max_spill_bytes`]).
    pub max_spill_bytes: Option<u64>,
    /// DataFusion's target partitions (default: the number of cores).
    pub target_partitions: Option<usize>,
    /// The most bytes one value of a private table may take when read (default 64 KiB; round
    /// 48: [`SessionOptions::max_value_bytes`]).
    pub max_value_bytes: Option<usize>,
}

/// One `[[table]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSection {
    pub name: String,
    /// A file or a directory (every file below it, now and later, belongs to the table).
    pub path: PathBuf,
    /// `csv` or `parquet` (default: from the extension; a directory is `parquet` when it holds
    /// `.parquet` files, else `csv`).
    pub format: Option<String>,
    /// `private` (default) or `public`.
    pub visibility: Option<String>,
    /// `add_remove` (default) or `replace`.
    pub neighbours: Option<String>,
    #[serde(default)]
    pub public_columns: Vec<String>,
    /// The budget of a private table (required for private tables).
    pub epsilon: Option<f64>,
    pub delta: Option<f64>,
    /// `gdp` (default), `zcdp`, `rdp` or `rdp:ORDER`.
    pub filter: Option<String>,
    /// The share of δ reserved for partition selection (default 0.5).
    pub delta_share: Option<f64>,
    /// The owner's reason to relax the policy the ledger holds (recorded there).
    pub relax: Option<String>,
    /// CSV reading options.
    pub csv: Option<CsvSection>,
    /// The schema, pinned (default: inferred at the first registration, then pinned).
    pub columns: Option<Vec<ColumnSection>>,
    #[serde(default)]
    pub ratio_bounds: Vec<RatioBoundSection>,
    /// The privacy unit column (docs/PRIVACY.md, "Privacy units"): neighbouring datasets differ
    /// by all the rows of one unit. Default: none (the unit is one row).
    pub privacy_unit: Option<String>,
    /// The unit domain shared by private tables that may be joined on their unit columns
    /// (default: the table's name).
    pub unit_domain: Option<String>,
    /// The default L0 bound of a query: groups per unit (default 1).
    pub max_groups_contributed: Option<u64>,
    /// The default L∞ bound of a query: rows per unit and group (default 1).
    pub max_rows_contributed: Option<u64>,
}

/// `[table.csv]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvSection {
    pub has_header: Option<bool>,
    pub delimiter: Option<String>,
    pub quote: Option<String>,
    pub escape: Option<String>,
    pub comment: Option<String>,
    pub null_regex: Option<String>,
}

/// One `[[table.columns]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSection {
    pub name: String,
    /// An Arrow type as Arrow prints it: `Int64`, `Float64`, `Utf8`, `Boolean`, `Date32`, …
    #[serde(rename = "type")]
    pub data_type: String,
    #[serde(default = "yes")]
    pub nullable: bool,
}

fn yes() -> bool {
    true
}

/// One `[[table.ratio_bounds]]` (`rgm_mean_by`'s contract).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioBoundSection {
    pub value: String,
    pub by: String,
    pub max_ratio: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    session: SessionSection,
    #[serde(default, rename = "table")]
    tables: Vec<TableSection>,
    #[serde(default, rename = "analyst")]
    analysts: Vec<AnalystSection>,
    #[serde(default)]
    server: ServerSection,
}

fn err(path: &Path, msg: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Plan(format!("catalog {}: {msg}", path.display()))
}

/// Why a catalog others could replace or write is refused.
const OWNERS_ALONE: &str = "the catalog chooses the ledger (a new one starts every budget at \
                            zero), the budgets and the analysts' tokens, so dpfusion refuses to \
                            load it";

/// Refuses a catalog that a user other than this process's, or root, could replace (round 46,
/// review of the fixes: whoever could write the catalog's directory swapped the catalog for one
/// naming a fresh ledger, every budget at zero; the same swap could relax a budget or add their
/// own analyst token). The rule is the ledger's ([`crate::files::path_others_control`]: no
/// directory on the way that others can write without a sticky bit protecting the owner's
/// entry, or that another user owns). Checked before the file is opened (a FIFO put there by
/// someone else would block the open).
fn check_location(path: &Path) -> Result<()> {
    if let Some(c) = crate::files::path_others_control(path) {
        return Err(err(
            path,
            format!(
                "it lies below {}, a directory {} (mode {:o}): whoever can write it can replace \
                 {}, and {OWNERS_ALONE}. Keep the catalog in a directory that only the data owner (or \
                 root) owns and can write, below directories that are the same or sticky like \
                 /tmp ({})",
                c.dir.display(),
                c.what(),
                c.mode,
                c.entry.display(),
                c.fix()
            ),
        ));
    }
    Ok(())
}

/// Refuses a catalog file (`opened`: the `fstat` of the file as opened) that is not a regular
/// file owned by this process's user or root that neither its group nor others can write
/// ([`crate::files::others_can_write`]; round 46, as [`check_location`]).
fn check_file(path: &Path, opened: &std::fs::Metadata) -> Result<()> {
    if !opened.is_file() {
        return Err(err(
            path,
            "it is not a regular file; give the path of the catalog's TOML file",
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if let Some(why) = crate::files::others_can_write(path, opened, me) {
        use std::os::unix::fs::MetadataExt;
        return Err(err(
            path,
            format!(
                "it is a file {} (owner uid {}, mode {:o}), and {OWNERS_ALONE}. The catalog is the data \
                 owner's alone, mode 0600 ({})",
                why.what(),
                opened.uid(),
                opened.mode() & 0o7777,
                why.fix(path)
            ),
        ));
    }
    Ok(())
}

/// The ledger a witness file names, for a message: its path and id as the witness recorded
/// them (docs/LEDGER.md, "The witness"), or what it is when it is no witness.
fn witnessed(w: &Path) -> String {
    let read = std::fs::symlink_metadata(w)
        .ok()
        .filter(|m| m.is_file() && m.len() <= 64 * 1024)
        .and_then(|_| std::fs::read(w).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    match read
        .as_ref()
        .and_then(|v| Some((v.get("ledger")?.as_str()?, v.get("ledger_id")?.as_str()?)))
    {
        Some((ledger, id)) => format!("the ledger {ledger} (id {id})"),
        None => "a ledger (the file is not a readable witness)".to_string(),
    }
}

fn one_byte(path: &Path, table: &str, key: &str, s: &str) -> Result<u8> {
    match s.as_bytes() {
        [b] => Ok(*b),
        _ => Err(err(
            path,
            format!("table '{table}': csv.{key} must be one ASCII character, got {s:?}"),
        )),
    }
}

impl Catalog {
    /// Reads and checks a catalog file. Its location is checked first, then the file as opened
    /// ([`check_location`], [`check_file`]): the catalog chooses the ledger, the budgets and the
    /// analysts, so only the data owner may be able to replace or write it.
    pub fn load(path: impl AsRef<Path>) -> Result<Catalog> {
        use std::io::Read;
        let path = path.as_ref();
        check_location(path)?;
        let mut file = std::fs::File::open(path).map_err(|e| err(path, e))?;
        check_file(path, &file.metadata().map_err(|e| err(path, e))?)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| err(path, e))?;
        let path = std::fs::canonicalize(path).map_err(|e| err(path, e))?;
        Self::parse(&text, &path)
    }

    /// Parses catalog text; `path` names the file (relative paths are relative to its
    /// directory).
    pub fn parse(text: &str, path: &Path) -> Result<Catalog> {
        let f: File = toml::from_str(text).map_err(|e| err(path, e))?;
        let mut names = std::collections::HashSet::new();
        for t in &f.tables {
            if !names.insert(t.name.to_ascii_lowercase()) {
                return Err(err(path, format!("table '{}' is declared twice", t.name)));
            }
        }
        let mut analysts = std::collections::HashSet::new();
        for a in &f.analysts {
            if !analysts.insert(a.name.as_str()) {
                return Err(err(path, format!("analyst '{}' is declared twice", a.name)));
            }
            crate::auth::TokenHash::parse(&a.token_hash)
                .map_err(|e| err(path, format!("analyst '{}': {e}", a.name)))?;
        }
        // Round 47 (owner review, F1): a bad `[session]` value is the owner's error, refused
        // here, never left for the analyst to meet query by query.
        let s = &f.session;
        crate::session::check_settings(
            s.default_delta,
            s.memory_limit,
            s.target_partitions,
            s.max_value_bytes,
        )
        .map_err(|e| err(path, format!("[session] {e}")))?;
        let c = Catalog {
            path: path.to_path_buf(),
            session: f.session,
            tables: f.tables,
            analysts: f.analysts,
            server: f.server,
        };
        for t in &c.tables {
            c.registration(t)?;
        }
        Ok(c)
    }

    fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// `<catalog file>.witness` beside the catalog: the default witness of a ledger outside the
    /// catalog's own directory.
    fn witness_beside(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".witness");
        self.dir().join(name)
    }

    /// Refuses to start a new ledger while a witness this catalog has kept names another one
    /// (round 52, review "operator", F4). Changing `[session] ledger` to a path in the catalog's
    /// own directory moved the default witness too (`<catalog>.witness` is never in the
    /// ledger's directory), so the new, empty ledger met no witness and started every budget
    /// at zero, silently, where the same edit to any other path was refused. So, when the
    /// ledger `options` name does not exist yet (or is empty), every witness the catalog may
    /// have kept is looked at: the one it uses now, `<catalog>.witness` beside it, and, unless
    /// `ledger_witness` names one, the default witnesses of ledgers directly in the catalog's
    /// directory (`<catalog dir>.witness/*.witness`). Any of them existing refuses the open,
    /// before anything is created (the ledger's directory included). [`Catalog::open`] checks
    /// it; an embedder that opens a session on [`Catalog::session_options`] itself calls it
    /// first.
    pub fn check_ledger_continues(&self, options: &SessionOptions) -> Result<()> {
        let ledger = &options.ledger_path;
        match std::fs::metadata(ledger) {
            Ok(m) if m.len() > 0 => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Not ours to judge: the ledger's own open reports it.
            Err(_) => return Ok(()),
        }
        let in_use = match &options.ledger_witness {
            Some(w) => Some(w.clone()),
            None => crate::accounting::default_witness(ledger).ok(),
        };
        let mut kept: Vec<(PathBuf, bool)> = in_use
            .into_iter()
            .chain([self.witness_beside()])
            .map(|w| (w, false))
            .collect();
        if self.session.ledger_witness.is_none()
            && let Ok(w) = crate::accounting::default_witness(&self.dir().join("ledger"))
            && let Some(Ok(entries)) = w.parent().map(std::fs::read_dir)
        {
            let mut shared: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "witness"))
                .collect();
            shared.sort();
            kept.extend(shared.into_iter().map(|w| (w, true)));
        }
        for (w, shared) in kept {
            if std::fs::symlink_metadata(&w).is_err() {
                continue;
            }
            let other = if shared {
                " If it is the witness of another catalog's ledger in this directory, name this \
                 catalog's own witness with `ledger_witness` in [session]."
            } else {
                ""
            };
            return Err(err(
                &self.path,
                format!(
                    "its ledger {} does not exist (or is empty), but {} does: the witness of {}. \
                     The catalog's `ledger` was changed, or the ledger was deleted or moved; \
                     opening it would start a new ledger, every table's budget at zero, so \
                     nothing was opened or created. Point `ledger` back at the ledger the \
                     witness names, or restore that ledger with its .head sidecar from a backup \
                     (to move a ledger, see docs/CATALOG.md, \"Moving the ledger\"). Only if the \
                     data owner decides to start a new ledger, with new budgets for every table \
                     (the charges recorded so far no longer count), move {} aside first.{other}",
                    ledger.display(),
                    w.display(),
                    witnessed(&w),
                    w.display(),
                ),
            ));
        }
        Ok(())
    }

    /// A path of the catalog, relative to its directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir().join(p)
        }
    }

    /// The session options the catalog sets.
    pub fn session_options(&self) -> SessionOptions {
        let s = &self.session;
        let mut o = SessionOptions::default().with_ledger(
            self.resolve(
                s.ledger
                    .as_deref()
                    .unwrap_or(Path::new(".dpfusion/ledger.jsonl")),
            ),
        );
        o.ledger_witness = match &s.ledger_witness {
            Some(w) => Some(self.resolve(w)),
            None => {
                let beside = self.witness_beside();
                let dir = |p: &Path| {
                    std::path::absolute(p.parent().unwrap_or(Path::new("."))).unwrap_or_default()
                };
                // Never in the ledger's own directory: then the default without a catalog.
                (dir(&beside) != dir(&o.ledger_path)).then_some(beside)
            }
        };
        if let Some(d) = &s.output_dir {
            o = o.with_output_dir(self.resolve(d));
        }
        o.analyst_files = if s.analyst_read_dirs.is_empty() {
            AnalystFiles::None
        } else {
            AnalystFiles::Under(
                s.analyst_read_dirs
                    .iter()
                    .map(|d| self.resolve(d))
                    .collect(),
            )
        };
        if let Some(d) = s.default_delta {
            o.default_delta = d;
        }
        if let Some(m) = s.memory_limit {
            o = o.with_memory_limit(m);
        }
        if let Some(d) = &s.spill_dir {
            o = o.with_spill_dir(self.resolve(d));
        }
        if let Some(n) = s.max_spill_bytes {
            o = o.with_max_spill_bytes(n);
        }
        if let Some(n) = s.target_partitions {
            o = o.with_target_partitions(n);
        }
        if let Some(n) = s.max_value_bytes {
            o = o.with_max_value_bytes(n);
        }
        // The catalog and the server's TLS certificate and key: no table, the owner's or an
        // analyst's, may read them (review r45).
        o.owner_paths = std::iter::once(self.path.clone())
            .chain(
                [&self.server.tls_cert, &self.server.tls_key]
                    .into_iter()
                    .flatten()
                    .map(|p| self.resolve(p)),
            )
            .collect();
        o
    }

    /// The registration a table section declares.
    pub fn registration(&self, t: &TableSection) -> Result<Registration> {
        let p = &self.path;
        let name = &t.name;
        let visibility = match t.visibility.as_deref().unwrap_or("private") {
            "private" => Visibility::Private,
            "public" => Visibility::Public,
            o => {
                return Err(err(
                    p,
                    format!("table '{name}': visibility must be private or public, got '{o}'"),
                ));
            }
        };
        let mut reg = match visibility {
            Visibility::Private => Registration::private(),
            Visibility::Public => Registration::public(),
        };
        reg.neighbours = match t.neighbours.as_deref().unwrap_or("add_remove") {
            "add_remove" => Neighbours::AddRemove,
            "replace" => Neighbours::Replace,
            o => {
                return Err(err(
                    p,
                    format!("table '{name}': neighbours must be add_remove or replace, got '{o}'"),
                ));
            }
        };
        reg = reg.public_columns(t.public_columns.iter().cloned());
        match (visibility, t.epsilon, t.delta) {
            (Visibility::Private, Some(e), Some(d)) => reg = reg.budget(e, d),
            (Visibility::Private, _, _) => {
                return Err(err(
                    p,
                    format!(
                        "private table '{name}' needs its budget: epsilon = … and delta = … \
                         (e.g. epsilon = 3.0, delta = 1e-6)"
                    ),
                ));
            }
            (Visibility::Public, None, None) => {}
            (Visibility::Public, _, _) => {
                return Err(err(
                    p,
                    format!("public table '{name}' has no budget; remove epsilon and delta"),
                ));
            }
        }
        if let Some(f) = &t.filter {
            let k: FilterKind = f
                .parse()
                .map_err(|e| err(p, format!("table '{name}': filter: {e}")))?;
            reg = reg.filter(k);
        }
        if let Some(s) = t.delta_share {
            crate::accounting::filter::check_delta_share(s)
                .map_err(|e| err(p, format!("table '{name}': delta_share: {e}")))?;
            reg = reg.delta_share(s);
        }
        if let Some(r) = &t.relax {
            reg = reg.relax(r.clone());
        }
        match &t.privacy_unit {
            Some(col) => {
                reg = reg.privacy_unit(col.clone());
                if let Some(d) = &t.unit_domain {
                    reg = reg.unit_domain(d.clone());
                }
                let bound = |what: &str, v: Option<u64>| {
                    crate::accounting::PrivacyUnit::check_bound(what, v.unwrap_or(1))
                        .map_err(|e| err(p, format!("table '{name}': {e}")))
                };
                let k = bound("max_groups_contributed", t.max_groups_contributed)?;
                let c = bound("max_rows_contributed", t.max_rows_contributed)?;
                reg = reg.contribution_bounds(k, c);
            }
            None if t.unit_domain.is_some()
                || t.max_groups_contributed.is_some()
                || t.max_rows_contributed.is_some() =>
            {
                return Err(err(
                    p,
                    format!(
                        "table '{name}': unit_domain, max_groups_contributed and \
                         max_rows_contributed need privacy_unit = \"<column>\""
                    ),
                ));
            }
            None => {}
        }
        if let Some(c) = &t.csv {
            let mut f = CsvFormat::default();
            if let Some(h) = c.has_header {
                f.has_header = h;
            }
            if let Some(d) = &c.delimiter {
                f.delimiter = one_byte(p, name, "delimiter", d)?;
            }
            if let Some(q) = &c.quote {
                f.quote = one_byte(p, name, "quote", q)?;
            }
            if let Some(e) = &c.escape {
                f.escape = Some(one_byte(p, name, "escape", e)?);
            }
            if let Some(x) = &c.comment {
                f.comment = Some(one_byte(p, name, "comment", x)?);
            }
            f.null_regex = c.null_regex.clone();
            reg = reg.csv(f);
        }
        if let Some(cols) = &t.columns {
            let pinned: Vec<PinnedColumn> = cols
                .iter()
                .map(|c| PinnedColumn {
                    name: c.name.clone(),
                    data_type: c.data_type.clone(),
                    nullable: c.nullable,
                })
                .collect();
            let schema: SchemaRef =
                crate::owner::unpin(&pinned).map_err(|e| err(p, format!("table '{name}': {e}")))?;
            reg = reg.schema(Arc::clone(&schema));
        }
        for b in &t.ratio_bounds {
            reg = reg.ratio_bound(b.value.clone(), b.by.clone(), b.max_ratio);
        }
        Ok(reg)
    }

    fn is_parquet(&self, t: &TableSection, path: &Path) -> Result<bool> {
        match t.format.as_deref() {
            Some("csv") => Ok(false),
            Some("parquet") => Ok(true),
            Some(o) => Err(err(
                &self.path,
                format!(
                    "table '{}': format must be csv or parquet, got '{o}'",
                    t.name
                ),
            )),
            None => Ok(crate::owner::is_parquet(path)),
        }
    }

    /// Registers every table of the catalog in `session` (the owner's registrations); returns
    /// the policies in force.
    pub async fn register(&self, session: &PrivateSession) -> Result<Vec<TablePolicy>> {
        let mut out = Vec::new();
        for t in &self.tables {
            let reg = self.registration(t)?;
            let path = self.resolve(&t.path);
            let r = if self.is_parquet(t, &path)? {
                session.register_parquet(&t.name, &path, reg).await
            } else {
                session.register_csv(&t.name, &path, reg).await
            };
            out.push(r.map_err(|e| err(&self.path, format!("table '{}': {e}", t.name)))?);
        }
        Ok(out)
    }

    /// Opens a session on the catalog: its options, then every table registered.
    pub async fn open(&self) -> Result<PrivateSession> {
        self.open_protecting(&[]).await
    }

    /// [`Catalog::open`], with `also` among the owner's files no table may read (the server's
    /// TLS certificate and key given on its command line).
    pub async fn open_protecting(&self, also: &[PathBuf]) -> Result<PrivateSession> {
        let mut options = self.session_options();
        options.owner_paths.extend(also.iter().cloned());
        self.check_ledger_continues(&options)?;
        let session = PrivateSession::open(options).await?;
        self.register(&session).await?;
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Catalog> {
        Catalog::parse(text, Path::new("/srv/owner/dpfusion.toml"))
    }

    #[test]
    fn a_complete_catalog_parses_with_paths_relative_to_it() {
        let c = parse(
            r#"
            [session]
            ledger = "ledger/l.jsonl"
            output_dir = "/srv/out"
            analyst_read_dirs = ["public"]
            default_delta = 1e-8

            [[table]]
            name = "salaries"
            path = "data/salaries.csv"
            neighbours = "replace"
            public_columns = ["job"]
            epsilon = 5.0
            delta = 1e-6
            filter = "rdp"
            csv = { has_header = true, delimiter = ";", null_regex = "^NA$" }
            columns = [
              { name = "job", type = "Utf8", nullable = false },
              { name = "salary", type = "Float64" },
            ]
            ratio_bounds = [{ value = "salary", by = "job", max_ratio = 1.5 }]

            [[table]]
            name = "jobs"
            path = "/srv/public/jobs.csv"
            visibility = "public"
            "#,
        )
        .unwrap();
        let o = c.session_options();
        assert_eq!(o.ledger_path, Path::new("/srv/owner/ledger/l.jsonl"));
        assert_eq!(o.output_dir.as_deref(), Some(Path::new("/srv/out")));
        assert_eq!(
            o.analyst_files,
            AnalystFiles::Under(vec![PathBuf::from("/srv/owner/public")])
        );
        assert_eq!(o.default_delta, 1e-8);
        assert_eq!(
            o.owner_paths,
            vec![PathBuf::from("/srv/owner/dpfusion.toml")]
        );
        // The witness: beside the catalog by default, never in the ledger's directory, or
        // where the owner says.
        assert_eq!(
            o.ledger_witness.as_deref(),
            Some(Path::new("/srv/owner/dpfusion.toml.witness"))
        );
        let beside = parse("[session]\nledger = \"l.jsonl\"").unwrap();
        assert_eq!(beside.session_options().ledger_witness, None);
        let named = parse("[session]\nledger_witness = \"/srv/w/l.witness\"").unwrap();
        assert_eq!(
            named.session_options().ledger_witness.as_deref(),
            Some(Path::new("/srv/w/l.witness"))
        );
        let r = c.registration(&c.tables[0]).unwrap();
        assert_eq!(r.neighbours, Neighbours::Replace);
        assert_eq!(r.csv.delimiter, b';');
        assert_eq!(r.csv.null_regex.as_deref(), Some("^NA$"));
        let s = r.schema.unwrap();
        assert_eq!(s.field(0).name(), "job");
        assert!(!s.field(0).is_nullable());
        assert_eq!(r.ratio_bounds.len(), 1);
        let r = c.registration(&c.tables[1]).unwrap();
        assert_eq!(r.visibility, Visibility::Public);
        // No analyst_read_dirs: analysts register no file.
        let c = parse("").unwrap();
        assert_eq!(c.session_options().analyst_files, AnalystFiles::None);
        assert_eq!(c.session_options().output_dir, None);
    }

    #[test]
    fn mistakes_are_errors_that_say_what_to_do() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        // A typo never leaves a default in force.
        let e = err("[[table]]\nname = \"t\"\npath = \"t.csv\"\nepsilom = 1.0\ndelta = 1e-6");
        assert!(e.contains("epsilom"), "{e}");
        let e = err("[session]\nledgr = \"x\"");
        assert!(e.contains("ledgr"), "{e}");
        let e = err("[[table]]\nname = \"t\"\npath = \"t.csv\"");
        assert!(e.contains("needs its budget"), "{e}");
        let e = err(
            "[[table]]\nname = \"t\"\npath = \"t.csv\"\nvisibility = \"public\"\nepsilon = 1.0",
        );
        assert!(e.contains("has no budget"), "{e}");
        let two = "[[table]]\nname = \"t\"\npath = \"a.csv\"\nvisibility = \"public\"\n";
        let e = err(&format!("{two}{}", two.replace("a.csv", "b.csv")));
        assert!(e.contains("declared twice"), "{e}");
        let e = err(
            "[[table]]\nname = \"t\"\npath = \"t.csv\"\nepsilon = 1.0\ndelta = 1e-6\nneighbours = \"swap\"",
        );
        assert!(e.contains("add_remove or replace"), "{e}");
        let e = err(
            "[[table]]\nname = \"t\"\npath = \"t.csv\"\nepsilon = 1.0\ndelta = 1e-6\ncolumns = [{ name = \"a\", type = \"Integer\" }]",
        );
        assert!(e.contains("not an Arrow type"), "{e}");
        let e = err(
            "[[table]]\nname = \"t\"\npath = \"t.csv\"\nepsilon = 1.0\ndelta = 1e-6\ncsv = { delimiter = \";;\" }",
        );
        assert!(e.contains("one ASCII character"), "{e}");
        let e = err(
            "[[table]]\nname = \"t\"\npath = \"t.csv\"\nepsilon = 1.0\ndelta = 1e-6\nfilter = \"pld\"",
        );
        assert!(e.contains("filter"), "{e}");
    }

    /// Round 47 (review newuser, 9): docs/CATALOG.md's list of the functions
    /// `max_rows_contributed` bounds is the code's: every aggregate that takes up to C rows of
    /// a unit per group (`UnitRule::Rows`; the `_ci` variants follow their base).
    #[test]
    fn the_catalog_doc_lists_the_functions_max_rows_contributed_bounds() {
        use dpfusion_udfs::aggregates::declaration::UnitRule;
        let doc = include_str!("../docs/CATALOG.md");
        let line = doc
            .lines()
            .find(|l| l.starts_with("| `table.max_rows_contributed`"))
            .expect("the key's row");
        for a in dpfusion_udfs::aggregates::registry::AGGREGATES {
            let listed = line.contains(&format!("`{}`", a.name));
            let rows = a.units == UnitRule::Rows && !a.internal && !a.name.ends_with("_ci");
            assert!(
                !rows || listed,
                "{} bounds rows by C but is not listed: {line}",
                a.name
            );
        }
    }

    /// Round 47 (owner review, F1): `[session] default_delta = nan` (or 0.9, -1), a
    /// `memory_limit` or `target_partitions` of 0 opened a session whose analysts then met
    /// refusals of a δ they never wrote. Each is refused when the catalog is parsed, with the
    /// key, the value and the valid range; a value in range parses.
    #[test]
    fn session_settings_out_of_range_are_refused() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        for bad in ["nan", "inf", "0.9e1", "1.0", "0.0", "-1.0"] {
            let e = err(&format!("[session]\ndefault_delta = {bad}"));
            assert!(
                e.contains("[session] default_delta must be a number in the open interval (0, 1)"),
                "{e}"
            );
            assert!(e.contains("catalog /srv/owner/dpfusion.toml"), "{e}");
        }
        let e = err("[session]\nmemory_limit = 0");
        assert!(
            e.contains("[session] memory_limit must be at least 1 byte, got 0"),
            "{e}"
        );
        let e = err("[session]\ntarget_partitions = 0");
        assert!(
            e.contains("[session] target_partitions must be at least 1, got 0"),
            "{e}"
        );
        let ok =
            parse("[session]\ndefault_delta = 0.9\nmemory_limit = 1048576\ntarget_partitions = 1")
                .unwrap();
        let o = ok.session_options();
        assert_eq!(
            (o.default_delta, o.memory_limit, o.target_partitions),
            (0.9, 1 << 20, Some(1))
        );
    }

    /// Round 48 (review "server48" F3): `[session] spill_dir` (relative to the catalog) and
    /// `max_spill_bytes` reach the session's options; left out, the OS temporary directory and
    /// 16 GiB. `[server] max_held_bytes` is read (the server checks it at start).
    #[test]
    fn spill_dir_and_max_spill_bytes_are_the_sessions() {
        let c = parse(
            "[session]\nspill_dir = \"spill\"\nmax_spill_bytes = 0\n[server]\nmax_held_bytes = 1",
        )
        .unwrap();
        let o = c.session_options();
        assert_eq!(o.spill_dir.as_deref(), Some(Path::new("/srv/owner/spill")));
        assert_eq!(o.max_spill_bytes, 0);
        assert_eq!(c.server.max_held_bytes, Some(1));
        let o = parse("[session]").unwrap().session_options();
        assert_eq!(o.spill_dir, None);
        assert_eq!(o.max_spill_bytes, crate::session::DEFAULT_MAX_SPILL_BYTES);
        let e = parse("[session]\nmax_spill_bytes = -1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_spill_bytes"), "{e}");
    }

    /// Round 48 (review "resources" §2): `[session] max_value_bytes` is the owner's bound on a
    /// private value read; outside 1 KiB to 256 MiB the catalog is refused, with the key, the
    /// value and the range; within, it reaches the session's options; left out, the default.
    #[test]
    fn max_value_bytes_is_set_in_the_session_section_within_its_range() {
        for bad in ["0", "1023", "268435457"] {
            let e = parse(&format!("[session]\nmax_value_bytes = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "[session] max_value_bytes must be from 1024 (1 KiB) to 268435456 (256 \
                     MiB), got {bad}"
                )),
                "{e}"
            );
        }
        let o = parse("[session]\nmax_value_bytes = 1048576")
            .unwrap()
            .session_options();
        assert_eq!(o.max_value_bytes, 1 << 20);
        let o = parse("[session]").unwrap().session_options();
        assert_eq!(o.max_value_bytes, crate::session::DEFAULT_MAX_VALUE_BYTES);
        assert_eq!(crate::session::DEFAULT_MAX_VALUE_BYTES, 65_536);
    }

    /// Round 46, review of the fixes (F5): whoever could write the catalog's directory swapped
    /// it for one naming a fresh ledger (every budget at zero). A catalog another user could
    /// replace or write is refused when loaded, with what to do; the owner's own loads.
    #[test]
    fn a_catalog_others_could_replace_or_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = crate::testdir::test_dir("catalog-location");
        let shared = d.join("shared");
        std::fs::create_dir(&shared).unwrap();
        let path = shared.join("c.toml");
        std::fs::write(&path, "[session]\nledger = \"l/ledger.jsonl\"\n").unwrap();
        let chmod = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        chmod(&path, 0o600).unwrap();
        let load = || Catalog::load(&path).map(|_| ()).map_err(|e| e.to_string());
        load().unwrap();
        for (mode, what) in [
            (0o777, "others can write"),
            (0o775, "others can write through its group"),
        ] {
            chmod(&shared, mode).unwrap();
            let e = load().unwrap_err();
            assert!(
                e.contains(&format!("a directory {what} (mode {mode:o})")),
                "{e}"
            );
            assert!(e.contains("every budget at zero"), "{e}");
            assert!(e.contains(&shared.display().to_string()), "{e}");
        }
        let e = load().unwrap_err();
        assert!(
            e.contains(&format!("`chmod g-w {}`", shared.display())),
            "{e}"
        );
        // Sticky, like /tmp: the owner's entry stays the owner's.
        chmod(&shared, 0o1777).unwrap();
        load().unwrap();
        chmod(&shared, 0o755).unwrap();
        // The file itself, writable by its group or by others.
        for (mode, fix) in [(0o620, "chmod g-w"), (0o602, "chmod go-w")] {
            chmod(&path, mode).unwrap();
            let e = load().unwrap_err();
            assert!(e.contains("it is a file others can write"), "{e}");
            assert!(e.contains(&format!("`{fix} {}`", path.display())), "{e}");
        }
        chmod(&path, 0o644).unwrap();
        load().unwrap();
        // A directory where the catalog should be.
        let e = Catalog::load(&shared).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Another user's catalog, or a directory on the way another user owns (as root only:
        // chown).
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::ffi::OsStrExt;
            let chown = |p: &Path, uid: u32| {
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, uid) }, 0);
            };
            chown(&path, 4242);
            let e = load().unwrap_err();
            assert!(
                e.contains("it is a file another user owns (owner uid 4242"),
                "{e}"
            );
            chown(&path, 0);
            chown(&shared, 4242);
            let e = load().unwrap_err();
            assert!(e.contains("a directory another user owns"), "{e}");
            chown(&shared, 0);
            load().unwrap();
        }
    }

    /// Round 52 (review "operator", F4): `[session] ledger` edited to a path in the catalog's own
    /// directory moved the default witness with it, and the new, empty ledger started every
    /// budget at zero, silently (the same edit to another path was refused). A new ledger is
    /// refused while any witness the catalog may have kept exists, whichever way the ledger
    /// moved, an empty ledger file included; an existing ledger, or a deliberately named witness
    /// of its own, is not.
    #[test]
    fn a_new_ledger_is_refused_while_a_witness_the_catalog_kept_exists() {
        let d = crate::testdir::test_dir("catalog-new-ledger");
        let path = d.join("c.toml");
        let check = |session: &str| {
            std::fs::write(&path, format!("[session]\n{session}\n")).unwrap();
            let c = Catalog::load(&path).unwrap();
            c.check_ledger_continues(&c.session_options())
                .map_err(|e| e.to_string())
        };
        let witness = |p: &Path, ledger: &Path| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(
                p,
                format!(
                    r#"{{"format":2,"ledger":"{}","ledger_id":"abc123","lines":3,"bytes":9,"hash":"00"}}"#,
                    ledger.display()
                ),
            )
            .unwrap();
        };
        // A catalog's first session: nothing kept, nothing refused.
        check("ledger = \".dpfusion/ledger.jsonl\"").unwrap();
        check("ledger = \"ledger.jsonl\"").unwrap();
        // The catalog's witness names .dpfusion/ledger.jsonl; `ledger` now names another path,
        // in the catalog's directory (the review's step) or below it.
        let beside = d.join("c.toml.witness");
        let old = d.join(".dpfusion/ledger.jsonl");
        witness(&beside, &old);
        for ledger in [
            "ledger.jsonl",
            "elsewhere/ledger.jsonl",
            ".dpfusion/ledger.jsonl",
        ] {
            let e = check(&format!("ledger = \"{ledger}\"")).unwrap_err();
            for needle in [
                format!("its ledger {} does not exist", d.join(ledger).display()),
                format!(
                    "but {} does: the witness of the ledger {} (id abc123)",
                    beside.display(),
                    old.display()
                ),
                "every table's budget at zero".to_string(),
                "Point `ledger` back".to_string(),
                format!("move {} aside first", beside.display()),
            ] {
                assert!(e.contains(&needle), "{ledger}: {needle} not in: {e}");
            }
            assert!(!e.contains("another catalog's ledger"), "{e}");
        }
        assert!(!d.join("elsewhere").exists(), "nothing created");
        // An empty ledger file is no ledger.
        std::fs::write(d.join("empty.jsonl"), "").unwrap();
        check("ledger = \"empty.jsonl\"").unwrap_err();
        // The ledger the witness names, or any existing one, opens as before.
        std::fs::create_dir_all(d.join(".dpfusion")).unwrap();
        std::fs::write(&old, "{}\n").unwrap();
        check("ledger = \".dpfusion/ledger.jsonl\"").unwrap();
        // The other way: the ledger was in the catalog's directory, so its witness is
        // <dir>.witness/ledger.jsonl.witness, and `ledger` now names .dpfusion/new.jsonl.
        std::fs::remove_file(&beside).unwrap();
        let in_dir = d.join("ledger.jsonl");
        let shared = crate::accounting::default_witness(&in_dir).unwrap();
        witness(&shared, &in_dir);
        let e = check("ledger = \".dpfusion/new.jsonl\"").unwrap_err();
        assert!(e.contains(&format!("but {} does", shared.display())), "{e}");
        assert!(
            e.contains("name this catalog's own witness with `ledger_witness`"),
            "{e}"
        );
        // A witness the catalog names is the catalog's: the default places are not searched.
        check("ledger = \".dpfusion/new.jsonl\"\nledger_witness = \"w/new.witness\"").unwrap();
        // ... but <catalog>.witness still is.
        witness(&beside, &old);
        check("ledger = \".dpfusion/new.jsonl\"\nledger_witness = \"w/new.witness\"").unwrap_err();
    }
}
