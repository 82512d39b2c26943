//! [`PrivateSession`]: the embedding API. It wraps a DataFusion `SessionContext` that is never
//! handed out, and runs every statement through the flow of ARCHITECTURE.md: parse, resolve named
//! arguments, plan, optimize, guard, admit and charge durably, then execute exactly the checked
//! plan.
//!
//! One file per job:
//! - this file: the session itself (opening it, its state, what it reports: tables, budget,
//!   ledger);
//! - `options`: [`SessionOptions`], [`AnalystFiles`] and [`Registration`], how a session is
//!   opened and a table registered;
//! - `register`: the data owner's registrations and their checks (columns, types, units, ratio
//!   bounds);
//! - `pipeline`: the one path every statement takes (parse, plan, guard, admit, execute), with
//!   the fixed messages of a failed or panicking statement;
//! - `ddl`: what analyst SQL may change (`CREATE TABLE AS`, `CREATE EXTERNAL TABLE`, `DROP`,
//!   `SET`) and what it may not (views, DML, transactions);
//! - `limits`: the complexity limits of a statement's text, checked before parsing;
//! - `kind`: what a statement is, from its plan, and a run with a bounded result (the server);
//! - `runtime`: the runtime each statement runs in, a memory pool and spill files of its own
//!   (round 48).
//!
//! Where a file may be read or written (`CREATE EXTERNAL TABLE`, `COPY … TO`) is decided beside
//! the data owner's protection code ([`crate::owner`]).
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;

pub use crate::accounting::FilterKind;
pub use crate::accounting::PrivacyUnit;
use crate::accounting::{Accountant, BudgetRow, LedgerEntry, Receipt, TablePolicy};
pub use crate::guard::table::RatioBound;
use crate::guard::{self, GuardedTable, TableInfo};
pub use crate::owner::CsvFormat;
use crate::owner::{Protection, Role};
use crate::statements;

mod ddl;
mod kind;
pub(crate) mod limits;
mod options;
mod pipeline;
mod register;
mod runtime;

pub use ddl::{ROLLBACK_REFUSED, is_plain_name};
pub use kind::StatementKind;
pub use limits::{MAX_CHAIN, MAX_DEPTH, MAX_SQL_BYTES};
pub use options::{AnalystFiles, Registration, SessionOptions};
pub use pipeline::{EXECUTION_FAILED, STATEMENT_PANICKED};
pub use runtime::DEFAULT_MAX_SPILL_BYTES;
pub(crate) use runtime::SpillLimit;

/// The default memory limit of one statement (4 GiB).
pub const DEFAULT_MEMORY_LIMIT: usize = 4 << 30;

/// The default `delta` of a DP call that gives none (SQL.md: 1e-7 unless changed).
pub const DEFAULT_CALL_DELTA: f64 = 1e-7;

/// The default bound on the bytes of one value read from a private table (64 KiB; round 48:
/// [`SessionOptions::max_value_bytes`]).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 64 << 10;

/// The values the owner may give `max_value_bytes`: 1 KiB to 256 MiB (round 48).
pub const MAX_VALUE_BYTES_RANGE: std::ops::RangeInclusive<usize> = (1 << 10)..=(256 << 20);

/// The owner's session settings no session may open with: a `default_delta` outside (0, 1) (the
/// δ every call without one would carry: `SET dpfusion.default_delta` refuses it), a
/// `memory_limit` of 0 bytes, `target_partitions` of 0, or a `max_value_bytes` outside
/// [`MAX_VALUE_BYTES_RANGE`] (round 48). `Err` names the setting, what was given and the valid
/// range. One rule for a catalog's `[session]` ([`crate::catalog`]) and for
/// [`SessionOptions`] built through the Rust API ([`PrivateSession::open`]): before round 47
/// neither checked them, and a bad value reached the analyst as refusals of a δ they never
/// wrote.
pub(crate) fn check_settings(
    default_delta: Option<f64>,
    memory_limit: Option<usize>,
    target_partitions: Option<usize>,
    max_value_bytes: Option<usize>,
) -> std::result::Result<(), String> {
    if let Some(d) = default_delta
        && dpfusion_udfs::privacy::error::check_delta("default_delta", d).is_err()
    {
        return Err(format!(
            "default_delta must be a number in the open interval (0, 1), got {d}: it is the δ of \
             every DP call that names none (default 1e-7); give e.g. 1e-7, or leave it out"
        ));
    }
    if memory_limit == Some(0) {
        return Err(format!(
            "memory_limit must be at least 1 byte, got 0: it is the memory one statement may use \
             (default 4 GiB, {DEFAULT_MEMORY_LIMIT}); give a number of bytes, or leave it out"
        ));
    }
    if target_partitions == Some(0) {
        let msg = "target_partitions must be at least 1, got 0: it is how many partitions \
                   DataFusion splits a query into (default: the number of cores); give a whole \
                   number ≥ 1, or leave it out";
        return Err(msg.to_string());
    }
    if let Some(n) = max_value_bytes
        && !MAX_VALUE_BYTES_RANGE.contains(&n)
    {
        return Err(format!(
            "max_value_bytes must be from {} (1 KiB) to {} (256 MiB), got {n}: it is the most \
             bytes one value of a private table may take when it is read (a larger value reads \
             as NULL, or as its type's default in a column declared NOT NULL; default 64 KiB, \
             {DEFAULT_MAX_VALUE_BYTES}); give a number of bytes in that range, or leave it out",
            MAX_VALUE_BYTES_RANGE.start(),
            MAX_VALUE_BYTES_RANGE.end()
        ));
    }
    Ok(())
}

tokio::task_local! {
    /// The analyst a statement runs for ([`PrivateSession::sql_as`]); admission runs in the
    /// statement's own task, so the charge it writes can name them.
    static ANALYST: Arc<str>;
    /// The L0 bound a statement's BigQuery DIFFERENTIAL_PRIVACY clause set
    /// ([`statements::bigquery`]): read by [`PrivateSession::guard_options`] while the
    /// statement runs.
    static STATEMENT_L0: std::cell::Cell<Option<u32>>;
    /// The cancellation flag of the statement that runs in this task ([`with_cancel`]): bound
    /// into its model fits at physical planning, so a fit stops at its next iteration once it
    /// is set.
    static CANCEL: Arc<std::sync::atomic::AtomicBool>;
}

/// Runs `work` (a statement) with `token` as its cancellation flag: the server sets it at the
/// statement's time limit, and a model fit inside stops at its next iteration
/// (`dpfusion_udfs::aggregates::bind::bind_cancellation`).
#[cfg(feature = "serve")]
pub(crate) async fn with_cancel<F: std::future::Future>(
    token: Arc<std::sync::atomic::AtomicBool>,
    work: F,
) -> F::Output {
    CANCEL.scope(token, work).await
}

/// The analyst the current statement runs for ([`PrivateSession::sql_as`]); None for the data
/// owner's own statements (the CLI, the Rust API).
pub(crate) fn current_analyst() -> Option<Arc<str>> {
    ANALYST.try_with(Arc::clone).ok()
}

/// The result of one statement.
#[derive(Debug, Clone)]
pub struct QueryResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// What was charged, per table (None when nothing was).
    pub receipt: Option<Receipt>,
    /// The private tables the statement used (for the REPL's prompt).
    pub tables: Vec<String>,
}

impl QueryResult {
    fn of(batches: Vec<RecordBatch>, schema: SchemaRef) -> Self {
        Self {
            schema,
            batches,
            receipt: None,
            tables: vec![],
        }
    }
    fn empty() -> Self {
        Self::of(vec![], Arc::new(Schema::empty()))
    }
}

/// A DataFusion session in which private tables can only be read through DP functions, every
/// release is charged to a durable ledger before any row is read, and queries are refused once a
/// table's budget would be exceeded. Safe to share between tasks (`Arc<PrivateSession>`).
pub struct PrivateSession {
    ctx: SessionContext,
    accountant: Arc<Accountant>,
    options: SessionOptions,
    default_delta: Arc<RwLock<f64>>,
    /// `SET dpfusion.max_groups_contributed` / `max_rows_contributed` (None: the tables').
    bounds: RwLock<guard::GuardOptions>,
    tables: Mutex<HashMap<String, Arc<GuardedTable>>>,
    /// The names of the tables the data owner registered (analyst SQL cannot drop or shadow
    /// them).
    owned: Mutex<std::collections::HashSet<String>>,
    protection: Arc<Protection>,
    /// The file system door: what each table may read, and the output directory.
    fs: Arc<crate::files::PinnedFs>,
    /// Where statements spill, and how much each may (None: spilling off; round 48).
    spills: Option<Arc<runtime::Spills>>,
    /// The receipt of the latest charge this session admitted: the REPL prints it for a query
    /// cancelled after its charge (the charge stands; issue 33).
    last_receipt: Mutex<Option<Receipt>>,
}

impl std::fmt::Debug for PrivateSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateSession")
            .field("options", &self.options)
            .finish()
    }
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl PrivateSession {
    /// Opens a session on the ledger named in `options` (replaying it).
    pub async fn open(options: SessionOptions) -> Result<Self> {
        crate::accounting::check_new_budget(&options.default_budget)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        check_settings(
            Some(options.default_delta),
            Some(options.memory_limit),
            options.target_partitions,
            Some(options.max_value_bytes),
        )
        .map_err(|e| DataFusionError::Plan(format!("SessionOptions: {e}")))?;
        let witness = match &options.ledger_witness {
            Some(w) => w.clone(),
            None => crate::accounting::default_witness(&options.ledger_path).map_err(external)?,
        };
        let accountant =
            Arc::new(Accountant::open_witnessed(&options.ledger_path, &witness).map_err(external)?);
        // The bound on a private value, read by every private scan (round 48); an extension,
        // which no SQL statement can set.
        let mut config = SessionConfig::new()
            .with_information_schema(false)
            .with_extension(Arc::new(guard::table::MaxValueBytes(
                options.max_value_bytes,
            )));
        if let Some(n) = options.target_partitions {
            config = config.with_target_partitions(n);
        }
        // Nothing data-dependent may be pushed below the guard's checks at execution time. The
        // first flag is only an umbrella that `ConfigOptions::set` copies to the three the
        // operators read (datafusion-common's config.rs), so each is set (review r45). Private
        // scans are also leaves the physical optimizer cannot push into (guard/table.rs).
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.enable_dynamic_filter_pushdown = false;
        optimizer.enable_topk_dynamic_filter_pushdown = false;
        optimizer.enable_join_dynamic_filter_pushdown = false;
        optimizer.enable_aggregate_dynamic_filter_pushdown = false;
        // A fair pool: with many partitions each spilling operator (hash aggregates, sorts) gets
        // its share and spills there, instead of the first ones taking all (a greedy pool fails
        // a query that could spill: issue 28). The merge reserve of each sort is a share too.
        let partitions = config.target_partitions().max(1);
        let reserve = options.memory_limit / (8 * partitions);
        let execution = &mut config.options_mut().execution;
        execution.sort_spill_reservation_bytes =
            execution.sort_spill_reservation_bytes.min(reserve);
        // No file statistics: a table's scan reads them from the session (DataFusion 55's
        // ListingTable), and the scan of a private file would then take a column its statistics
        // show constant (or missing, or all NULL) as a literal, unread: work, and a NOT NULL
        // column's failure, that the file's values decide (round 47). Public tables lose the
        // plans their statistics would allow (COUNT(*) from metadata, join order by size).
        execution.collect_statistics = false;
        // Each statement runs in a runtime of its own, derived from this one (round 48:
        // `statement_state`): a memory pool of `memory_limit` bytes (no consumer tracker, whose
        // error listed every holder of the one pool the session had, other analysts' results
        // included) and spill files of its own, in the session's spill directory. This runtime
        // is the same kind, for what runs outside a statement.
        let spills = runtime::Spills::open(options.spill_dir.as_deref(), options.max_spill_bytes)
            .map_err(|e| DataFusionError::Plan(format!("SessionOptions: {e}")))?
            .map(Arc::new);
        let plain = datafusion::execution::runtime_env::RuntimeEnvBuilder::new().build()?;
        let runtime = runtime::runtime(&plain, options.memory_limit, spills.as_ref())?;
        // Every file the context reads or writes goes through the pins (crate::files::store):
        // opened without following links and compared with what was registered. A statement's
        // runtime shares this one's object store registry, so the pins hold there too.
        let fs = crate::files::PinnedFs::new();
        fs.install(&runtime);
        #[cfg(feature = "distributed")]
        let ctx = match &options.cluster {
            Some(cluster) => crate::distributed::connect(cluster, config, runtime).await?,
            None => SessionContext::new_with_config_rt(config, runtime),
        };
        #[cfg(not(feature = "distributed"))]
        let ctx = SessionContext::new_with_config_rt(config, runtime);
        dpfusion_udfs::register_all(&ctx);
        if let Some(seed) = options.insecure_noise_seed {
            for udaf in dpfusion_udfs::aggregates::all_udafs_insecure_seeded(seed) {
                ctx.register_udaf(udaf);
            }
        }
        // The witness is the owner's too.
        let owner_paths: Vec<_> = options
            .owner_paths
            .iter()
            .cloned()
            .chain([witness])
            .collect();
        if let Some(s) = &spills {
            // The spill directory holds private rows in clear: it may not lie in a private
            // table's files, the ledger or the catalog (round 48), and from now on it is the
            // owner's (no table, the owner's or an analyst's, reads it; COPY never writes there).
            let set = crate::files::FileSet::path_only(s.dir());
            Protection::new(accountant.clone(), owner_paths.clone())
                .check_read(&set, None, Role::Analyst)
                .map_err(|_| {
                    DataFusionError::Plan(format!(
                        "the spill directory {} lies inside a private table's files, the \
                         ledger or the catalog; choose a spill_dir of its own",
                        s.dir().display()
                    ))
                })?;
        }
        let protection = Arc::new(Protection::new(
            accountant.clone(),
            owner_paths
                .into_iter()
                .chain(spills.as_ref().map(|s| s.dir().to_path_buf()))
                .collect(),
        ));
        if let Some(dir) = &options.output_dir {
            // The output directory must hold no private file and none of the owner's, and be
            // writable by its owner only; it is pinned now (COPY writes only directly in it).
            let set =
                crate::files::resolve(&dir.to_string_lossy(), Path::new(".")).map_err(|e| {
                    DataFusionError::Plan(format!(
                        "the output directory {} cannot be used: {e}",
                        dir.display()
                    ))
                })?;
            protection
                .check_read(&set, None, Role::Analyst)
                .map_err(|_| {
                    DataFusionError::Plan(format!(
                        "the output directory {} holds or lies inside a private table's files, the \
                     ledger or the catalog; choose a directory of its own",
                        dir.display()
                    ))
                })?;
            fs.set_output_dir(dir).map_err(|e| {
                DataFusionError::Plan(format!("the output directory cannot be used: {e}"))
            })?;
        }
        let session = Self {
            ctx,
            accountant,
            default_delta: Arc::new(RwLock::new(options.default_delta)),
            bounds: RwLock::new(guard::GuardOptions {
                insecure_seed: options.insecure_noise_seed,
                ..guard::GuardOptions::default()
            }),
            options,
            tables: Mutex::new(HashMap::new()),
            owned: Mutex::new(Default::default()),
            protection,
            fs,
            spills,
            last_receipt: Mutex::new(None),
        };
        statements::register_table_functions(
            &session.ctx,
            session.accountant.clone(),
            Arc::clone(&session.default_delta),
        );
        Ok(session)
    }

    /// The state one statement runs in, from planning to its last row (round 48): a snapshot
    /// of the session's state (`SessionContext::state`: settings and functions copied, catalogs
    /// shared) with a runtime of its own ([`runtime::runtime`]): a memory pool of
    /// `memory_limit` bytes that no other statement, and none of the server's held results or
    /// uploads, takes from, and spill files of its own, at most `max_spill_bytes`; the object
    /// stores (the pins) and caches are the session's. Every path of a statement plans, checks
    /// (a join's public sides run there), admits and runs under it: `sql`, `sql_as`, `check`,
    /// `EXPLAIN PRIVACY`, the server's bounded run, `CREATE TABLE AS` and `COPY`. On a Ballista
    /// cluster (feature `distributed`) the session's state as it is: the cluster's executors
    /// have their own runtimes.
    pub(super) fn statement_state(&self) -> Result<datafusion::execution::SessionState> {
        let state = self.ctx.state();
        #[cfg(feature = "distributed")]
        if self.options.cluster.is_some() {
            return Ok(state);
        }
        let runtime = runtime::runtime(
            state.runtime_env(),
            self.options.memory_limit,
            self.spills.as_ref(),
        )?;
        let id = state.session_id().to_string();
        Ok(
            datafusion::execution::SessionStateBuilder::new_from_existing(state)
                .with_session_id(id)
                .with_runtime_env(runtime)
                .build(),
        )
    }

    /// The accountant (budgets, ledger).
    pub fn accountant(&self) -> &Arc<Accountant> {
        &self.accountant
    }

    /// The options the session was opened with.
    pub fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// The `delta` of DP calls that give none.
    pub fn default_delta(&self) -> f64 {
        *self.default_delta.read().expect("lock")
    }
    /// How many scans of a table were planned for execution (tests prove with it that a refused
    /// query read nothing).
    pub fn scans(&self, table: &str) -> u64 {
        self.tables
            .lock()
            .expect("lock")
            .get(&table.to_ascii_lowercase())
            .map(|t| t.scans())
            .unwrap_or(0)
    }

    /// The registered tables: name and policy view.
    pub fn tables(&self) -> Vec<(String, TableInfo, SchemaRef)> {
        let mut v: Vec<_> = self
            .tables
            .lock()
            .expect("lock")
            .iter()
            .map(|(n, t)| (n.clone(), t.info().clone(), t.schema()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Per registered table, sorted by name: the policy in force and who registered it
    /// (`owner`, `analyst` or `result`; `SHOW TABLES`).
    pub fn policies(&self) -> Vec<(TablePolicy, String)> {
        let owned = self.owned.lock().expect("lock").clone();
        self.tables()
            .into_iter()
            .filter_map(|(name, info, _)| {
                let mut p = self.accountant.policy(&info.key)?;
                p.name = name.clone();
                let by = if owned.contains(&name) {
                    "owner"
                } else if info.key.as_str().starts_with("result:") {
                    "result"
                } else {
                    "analyst"
                };
                Some((p, by.to_string()))
            })
            .collect()
    }

    /// Per private table: budget, spent, remaining, number of charged queries.
    pub fn budget(&self) -> Vec<BudgetRow> {
        // The tables this session serves (round 49); the ledger may hold another of the same
        // name (an owner who pointed the name at another file: two keys), which is not shown.
        // Those registered in this session come first all the same, so that whatever looks a
        // table up by name (the REPL's prompt and `\d`, a client's) finds it (review r45).
        let current: std::collections::HashSet<_> = self
            .tables()
            .into_iter()
            .map(|(_, info, _)| info.key)
            .collect();
        // Next ε at the session's own default δ, as SHOW BUDGET computes it (round 47).
        let mut rows = self.accountant.served_budget_rows_at(self.default_delta());
        rows.sort_by_key(|r| !current.contains(&r.key));
        rows
    }

    /// Takes the receipt of the latest charge this session admitted (None: none since the last
    /// take). A front end that cancels a running statement reads it to show what the statement
    /// was charged: clear it before the statement, take it after the cancellation.
    pub fn take_last_receipt(&self) -> Option<Receipt> {
        self.last_receipt.lock().expect("lock").take()
    }

    /// Every charge, oldest first; an error when the ledger cannot be read or does not verify
    /// (never a shorter list).
    pub fn ledger(&self) -> Result<Vec<LedgerEntry>> {
        self.accountant.ledger_entries().map_err(external)
    }

    /// The ledger keys of the tables registered in this session (`COPY … TO` writes over none of
    /// their files: [`crate::owner::copy_target`]).
    fn table_keys(&self) -> Vec<String> {
        let tables = self.tables.lock().expect("lock");
        tables
            .values()
            .map(|t| t.info().key.as_str().to_string())
            .collect()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<PrivateSession>();
}
