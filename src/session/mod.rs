//! [`PrivateSession`]: the embedding API. It wraps a DataFusion `SessionContext` that is never
//! handed out, and runs every statement through the flow of ARCHITECTURE.md: parse, resolve named
//! arguments, plan, optimize, guard, admit and charge durably, then execute exactly the checked
//! plan.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::{CopyToSource, DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::dialect::GenericDialect;

pub use crate::accounting::FilterKind;
pub use crate::accounting::PrivacyUnit;
use crate::accounting::{
    Accountant, Budget, BudgetRow, LedgerEntry, Neighbours, Receipt, TableCharge, TableKey,
    TablePolicy, Visibility,
};
use crate::accounting::{DEFAULT_DELTA_SHARE, FilterChoice};
pub use crate::guard::table::RatioBound;
use crate::guard::{self, DpCall, GuardedTable, TableInfo};
pub use crate::owner::CsvFormat;
use crate::owner::{Protection, Role};
use crate::statements::{self, named_args::resolve_named_arguments};

/// The default memory limit of a query (4 GiB).
pub const DEFAULT_MEMORY_LIMIT: usize = 4 << 30;

/// The default `delta` of a DP call that gives none (SQL.md: 1e-7 unless changed).
pub const DEFAULT_CALL_DELTA: f64 = 1e-7;

mod kind;
pub use kind::StatementKind;

tokio::task_local! {
    /// The analyst a statement runs for ([`PrivateSession::sql_as`]); admission runs in the
    /// statement's own task, so the charge it writes can name them.
    static ANALYST: Arc<str>;
    /// The L0 bound a statement's BigQuery DIFFERENTIAL_PRIVACY clause set
    /// ([`statements::bigquery`]): read by [`PrivateSession::guard_options`] while the
    /// statement runs.
    static STATEMENT_L0: std::cell::Cell<Option<u32>>;
}

/// The analyst the current statement runs for ([`PrivateSession::sql_as`]); None for the data
/// owner's own statements (the CLI, the Rust API).
pub(crate) fn current_analyst() -> Option<Arc<str>> {
    ANALYST.try_with(Arc::clone).ok()
}

/// How a session is opened.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The ledger file (default `./.dpfusion/ledger.jsonl`).
    pub ledger_path: PathBuf,
    /// The budget a private table gets when its registration names none.
    pub default_budget: Budget,
    /// The `delta` of a DP call that gives none.
    pub default_delta: f64,
    /// DataFusion's target partitions (None: the number of cores).
    pub target_partitions: Option<usize>,
    /// The memory a query may use (DataFusion's memory pool; default 4 GiB). A query over its
    /// limit fails (with the fixed message when it reads a private table) instead of taking the
    /// process down.
    pub memory_limit: usize,
    /// The only directory `COPY ... TO` may write into (None, the default: COPY is refused). Set
    /// by the data owner; never the ledger's directory or a table's.
    pub output_dir: Option<PathBuf>,
    /// Which files analyst SQL (`CREATE EXTERNAL TABLE`) may register, always as public tables
    /// and never over a private table's files. Default: none (the data owner allows some).
    pub analyst_files: AnalystFiles,
    /// The data owner's own files (the catalog): analyst SQL never reads or writes them, like
    /// the ledger's directory.
    pub owner_paths: Vec<PathBuf>,
    /// Run queries on this Ballista cluster instead of in this process (feature `distributed`;
    /// the guard, accountant and ledger stay here). See `crate::distributed`.
    #[cfg(feature = "distributed")]
    pub cluster: Option<crate::distributed::Cluster>,
    /// The ledger's witness file (docs/LEDGER.md, "The witness"), outside the ledger's
    /// directory. None: `<ledger dir>.witness/<ledger file>.witness`
    /// ([`crate::accounting::default_witness`]); a catalog sets it beside itself.
    pub ledger_witness: Option<PathBuf>,
    /// INSECURE, tests only: a fixed seed for every DP function's noise
    /// ([`SessionOptions::with_insecure_noise_seed`]). Private: only the Rust API sets it.
    insecure_noise_seed: Option<u64>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            ledger_path: PathBuf::from(".dpfusion/ledger.jsonl"),
            default_budget: Budget {
                epsilon: 1.0,
                delta: 1e-6,
            },
            default_delta: DEFAULT_CALL_DELTA,
            target_partitions: None,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            output_dir: None,
            analyst_files: AnalystFiles::None,
            owner_paths: vec![],
            #[cfg(feature = "distributed")]
            cluster: None,
            ledger_witness: None,
            insecure_noise_seed: None,
        }
    }
}

impl SessionOptions {
    /// The ledger. A witness set before (e.g. a catalog's, beside the catalog) belonged to the
    /// previous ledger and is dropped: the new ledger gets the default witness unless one is set
    /// after this.
    pub fn with_ledger(mut self, path: impl Into<PathBuf>) -> Self {
        self.ledger_path = path.into();
        self.ledger_witness = None;
        self
    }
    pub fn with_default_budget(mut self, epsilon: f64, delta: f64) -> Self {
        self.default_budget = Budget { epsilon, delta };
        self
    }
    pub fn with_target_partitions(mut self, n: usize) -> Self {
        self.target_partitions = Some(n);
        self
    }
    /// The memory limit of a query, in bytes.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }
    /// The directory `COPY ... TO` may write into.
    pub fn with_output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output_dir = Some(dir.into());
        self
    }
    /// Which files analyst SQL may register as public tables.
    pub fn with_analyst_files(mut self, files: AnalystFiles) -> Self {
        self.analyst_files = files;
        self
    }
    /// INSECURE, for reproducible tests only (the differential fuzzer, tests/it/fuzz.rs): every DP
    /// function of the session draws its noise from a generator seeded with `seed`, so the noise
    /// is known to whoever knows the seed and the releases are not private. Never set this in a
    /// session that serves real queries; SQL, the CLI, the catalog and the server cannot set it.
    /// (Partition selection the guard inserts keeps OS-seeded noise.)
    pub fn with_insecure_noise_seed(mut self, seed: u64) -> Self {
        self.insecure_noise_seed = Some(seed);
        self
    }
}

/// Which files analyst SQL may register (`CREATE EXTERNAL TABLE`): always as public tables, and
/// never a file of a private table, the ledger's directory or the owner's files, under any
/// spelling (crate::files).
#[derive(Debug, Clone, PartialEq)]
pub enum AnalystFiles {
    /// None: `CREATE EXTERNAL TABLE` is refused (the default, and a catalog's unless it lists
    /// directories).
    None,
    /// Files below these directories only (a catalog's `analyst_read_dirs`).
    Under(Vec<PathBuf>),
    /// Any file the process can read (single-user mode: the person at the keyboard is the owner
    /// and can read the files anyway).
    Anywhere,
}

/// How a table is registered: private (the default) or public, its neighbour relation, its
/// public columns and its budget.
#[derive(Debug, Clone)]
pub struct Registration {
    pub visibility: Visibility,
    pub neighbours: Neighbours,
    pub public_columns: Vec<String>,
    pub budget: Option<Budget>,
    /// Ratio bounds of value columns per public column (`rgm_mean_by`'s contract), checked on
    /// the data when the table is registered.
    pub ratio_bounds: Vec<RatioBound>,
    /// The privacy filter (docs/ACCOUNTING.md). `None`: the ledger's when the table is already
    /// registered there, else `gdp`.
    pub filter: Option<FilterKind>,
    /// The share of δ reserved for partition selection. `None`: the ledger's when the table is
    /// already registered there, else 0.5.
    pub delta_share: Option<f64>,
    /// The schema to read the files with. `None`: the schema pinned in the ledger when the table
    /// is already registered there, else the one inferred now (which is then pinned).
    pub schema: Option<SchemaRef>,
    /// How CSV files are read (ignored for Parquet).
    pub csv: CsvFormat,
    /// The owner's reason to relax (weaken or change) the policy recorded in the ledger; without
    /// it such a registration is refused with the difference.
    pub relax: Option<String>,
    /// The privacy unit column and the default contribution bounds (docs/PRIVACY.md, "Privacy
    /// units"). None: the unit is one row.
    pub unit: Option<PrivacyUnit>,
}

impl Default for Registration {
    fn default() -> Self {
        Self::private()
    }
}

impl Registration {
    /// A private table with `add_remove` neighbours, no public column, the session's budget.
    pub fn private() -> Self {
        Self {
            visibility: Visibility::Private,
            neighbours: Neighbours::AddRemove,
            public_columns: vec![],
            budget: None,
            ratio_bounds: vec![],
            filter: None,
            delta_share: None,
            schema: None,
            csv: CsvFormat::default(),
            relax: None,
            unit: None,
        }
    }
    /// A public table: no protection, no budget.
    pub fn public() -> Self {
        Self {
            visibility: Visibility::Public,
            ..Self::private()
        }
    }
    /// `replace` neighbours: a neighbour differs in the private columns of one row; the row
    /// count and the public columns are public.
    pub fn replace(mut self) -> Self {
        self.neighbours = Neighbours::Replace;
        self
    }
    pub fn public_columns<S: Into<String>>(mut self, cols: impl IntoIterator<Item = S>) -> Self {
        // Exact, case-sensitive names (a private column "JOB" is not the public column "job").
        self.public_columns = cols
            .into_iter()
            .map(|c| c.into().trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        self
    }
    /// Declares that in every group of the public column `by`, the values of `value` are > 0
    /// and within a factor `max_ratio` of each other: the contract `rgm_mean_by(value, by, …)`
    /// relies on. Checked on the data at registration (a registration that violates it fails,
    /// naming the groups: the data owner may see them); the analyst can then only call
    /// `rgm_mean_by` on this bare column, never on an expression.
    pub fn ratio_bound(
        mut self,
        value: impl Into<String>,
        by: impl Into<String>,
        max_ratio: f64,
    ) -> Self {
        self.ratio_bounds.push(RatioBound {
            value: value.into(),
            by: by.into(),
            max_ratio,
        });
        self
    }
    pub fn budget(mut self, epsilon: f64, delta: f64) -> Self {
        self.budget = Some(Budget { epsilon, delta });
        self
    }
    /// The privacy filter admissions follow, fixed when the table is first registered in the
    /// ledger: `gdp` (Gaussian mechanisms only, the tightest for them), `zcdp` (also zCDP,
    /// Laplace, pure DP) or `rdp` at one order (every mechanism, rgm_mean_by included).
    pub fn filter(mut self, filter: FilterKind) -> Self {
        self.filter = Some(filter);
        self
    }
    /// The share s ∈ (0, 1) of the table's δ reserved for partition selection (GROUP BY over
    /// private columns); the filter converts its ε at (1 − s)·δ.
    pub fn delta_share(mut self, share: f64) -> Self {
        self.delta_share = Some(share);
        self
    }
    /// The schema the files are read with (pinned in the ledger).
    pub fn schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }
    /// How CSV files are read.
    pub fn csv(mut self, csv: CsvFormat) -> Self {
        self.csv = csv;
        self
    }
    /// Declares the privacy unit: neighbouring datasets differ by all the rows whose `column`
    /// holds the same value (one customer, one patient). Queries bound each unit's contribution
    /// before any noise (at most `max_groups_contributed` groups, default 1, and
    /// `max_rows_contributed` rows per group, default 1: [`Registration::contribution_bounds`]).
    /// Needs `add_remove` neighbours.
    pub fn privacy_unit(mut self, column: impl Into<String>) -> Self {
        let column = column.into();
        self.unit = Some(match self.unit.take() {
            Some(u) => PrivacyUnit { column, ..u },
            None => PrivacyUnit {
                column,
                domain: String::new(),
                max_groups_contributed: 1,
                max_rows_contributed: 1,
            },
        });
        self
    }
    /// The unit domain: private tables of one domain hold rows of the same units and may be
    /// joined on their unit columns (default: the table's own name, shared with no other).
    pub fn unit_domain(mut self, domain: impl Into<String>) -> Self {
        if let Some(u) = &mut self.unit {
            u.domain = domain.into();
        }
        self
    }
    /// The default contribution bounds of a query on this table (a query may set others with
    /// `SET dpfusion.max_groups_contributed` / `dpfusion.max_rows_contributed`). Needs
    /// [`Registration::privacy_unit`] first.
    pub fn contribution_bounds(mut self, max_groups: u32, max_rows: u32) -> Self {
        if let Some(u) = &mut self.unit {
            u.max_groups_contributed = max_groups;
            u.max_rows_contributed = max_rows;
        }
        self
    }
    /// An explicit owner action: register even if this weakens or changes the policy the ledger
    /// holds; `reason` is recorded in the ledger with the changes.
    pub fn relax(mut self, reason: impl Into<String>) -> Self {
        self.relax = Some(reason.into());
        self
    }
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
    default_delta: RwLock<f64>,
    /// `SET dpfusion.max_groups_contributed` / `max_rows_contributed` (None: the tables').
    bounds: RwLock<guard::GuardOptions>,
    tables: Mutex<HashMap<String, Arc<GuardedTable>>>,
    /// The names of the tables the data owner registered (analyst SQL cannot drop or shadow
    /// them).
    owned: Mutex<std::collections::HashSet<String>>,
    protection: Arc<Protection>,
    /// The file system door: what each table may read, and the output directory.
    fs: Arc<crate::files::PinnedFs>,
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
        let witness = match &options.ledger_witness {
            Some(w) => w.clone(),
            None => crate::accounting::default_witness(&options.ledger_path).map_err(external)?,
        };
        let accountant =
            Arc::new(Accountant::open_witnessed(&options.ledger_path, &witness).map_err(external)?);
        let mut config = SessionConfig::new().with_information_schema(false);
        if let Some(n) = options.target_partitions {
            config = config.with_target_partitions(n);
        }
        // Nothing data-dependent may be pushed below the guard's checks at execution time.
        config
            .options_mut()
            .optimizer
            .enable_dynamic_filter_pushdown = false;
        // A fair pool: with many partitions each spilling operator (hash aggregates, sorts) gets
        // its share and spills there, instead of the first ones taking all (a greedy pool fails
        // a query that could spill: issue 28). The merge reserve of each sort is a share too.
        let partitions = config.target_partitions().max(1);
        let reserve = options.memory_limit / (8 * partitions);
        let execution = &mut config.options_mut().execution;
        execution.sort_spill_reservation_bytes =
            execution.sort_spill_reservation_bytes.min(reserve);
        let pool = datafusion::execution::memory_pool::TrackConsumersPool::new(
            datafusion::execution::memory_pool::FairSpillPool::new(options.memory_limit),
            std::num::NonZeroUsize::new(5).expect("5 > 0"),
        );
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(pool))
            .build_arc()?;
        // Every file the context reads or writes goes through the pins (crate::files::store):
        // opened without following links and compared with what was registered.
        let fs = crate::files::PinnedFs::new();
        fs.install(&runtime);
        #[cfg(feature = "distributed")]
        let ctx = match &options.cluster {
            Some(cluster) => crate::distributed::connect(cluster, config).await?,
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
        let protection = Arc::new(Protection::new(
            accountant.clone(),
            // The witness is the owner's too.
            options
                .owner_paths
                .iter()
                .cloned()
                .chain([witness])
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
            default_delta: RwLock::new(options.default_delta),
            bounds: RwLock::new(guard::GuardOptions {
                insecure_seed: options.insecure_noise_seed,
                ..guard::GuardOptions::default()
            }),
            options,
            tables: Mutex::new(HashMap::new()),
            owned: Mutex::new(Default::default()),
            protection,
            fs,
            last_receipt: Mutex::new(None),
        };
        statements::register_table_functions(&session.ctx, session.accountant.clone());
        Ok(session)
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

    /// The data owner registers a CSV file, or a directory of `.csv` files, as a table: read
    /// with `reg.csv`, with the schema pinned in the ledger (or `reg.schema`, or, at the first
    /// registration, the one inferred now, which is then pinned).
    pub async fn register_csv(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_file(name, path.as_ref(), reg, FileFormat::Csv)
            .await
    }

    /// The data owner registers a Parquet file, or a directory of `.parquet` files, as a table
    /// (schema pinned as for [`PrivateSession::register_csv`]).
    pub async fn register_parquet(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_file(name, path.as_ref(), reg, FileFormat::Parquet)
            .await
    }

    async fn register_file(
        &self,
        name: &str,
        path: &Path,
        mut reg: Registration,
        format: FileFormat,
    ) -> Result<TablePolicy> {
        let location = path.to_string_lossy().to_string();
        let set = crate::files::resolve(&location, Path::new("."))
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
        if set.glob.is_some() {
            return plan_err!(
                "table '{name}': '{location}' is a glob; a table is one file or one directory \
                 (every file below it, now and later, belongs to the table)"
            );
        }
        let key = TableKey::from(set.root.to_string_lossy().to_string());
        // No other private table may share a file with this one (hard links, nested
        // directories), and no table may read the ledger's directory or the owner's files.
        self.protection
            .check_read(&set, Some(key.as_str()), Role::Owner)
            .map_err(|e| {
                DataFusionError::Plan(format!(
                    "table '{name}': '{location}' shares files with another private table, the \
                     ledger or the catalog; a file belongs to one table ({e})"
                ))
            })?;
        // The output directory (where analysts' COPY writes) holds no table's file, and lies
        // in no table's directory.
        if let Some(out) = self.fs.output_dir()
            && set.intersects(&crate::files::FileSet::path_only(&out))
        {
            return plan_err!(
                "table '{name}': '{location}' and the output directory {} overlap; analysts' \
                 COPY writes there, so no table's file may lie in it (choose another output \
                 directory, or move the table's files)",
                out.display()
            );
        }
        // Pinned now: from here on the table reads these files only (crate::files::store).
        let table = name.to_ascii_lowercase();
        let pin = self
            .fs
            .pin(&table, &set, reg.visibility == Visibility::Private)
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
        let registered = async {
            let pinned = self.accountant.policy(&key).and_then(|p| p.schema);
            let schema = match (&reg.schema, &pinned) {
                (Some(s), _) => Some(s.clone()),
                (None, Some(p)) => Some(crate::owner::unpin(p)?),
                (None, None) => None,
            };
            let scratch = self.fs.scratch_context()?;
            let provider = match format {
                FileFormat::Csv => {
                    crate::owner::csv_provider(&scratch, &set.root, &reg.csv, schema.as_deref())
                        .await?
                }
                FileFormat::Parquet => {
                    crate::owner::parquet_provider(&scratch, &set.root, schema.as_deref()).await?
                }
            };
            if provider.schema().fields().is_empty() {
                return plan_err!(
                    "table '{name}': '{location}' has no columns (an empty file?). A CSV file \
                     needs a header line, or declare the columns in the catalog \
                     ([[table.columns]])"
                );
            }
            reg.schema = Some(provider.schema());
            let format_text = match format {
                FileFormat::Csv => reg.csv.describe(),
                FileFormat::Parquet => "parquet".to_string(),
            };
            self.register_owned(name, provider, key, reg, Some(format_text))
        }
        .await;
        match &registered {
            Ok(_) => self.fs.retain_table(&table, &[pin]),
            Err(_) => self.fs.unpin(pin),
        }
        registered
    }

    /// Registers in-memory batches as a table (ledger identity `mem:<name>`).
    pub fn register_batches(
        &self,
        name: &str,
        batches: Vec<RecordBatch>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return plan_err!("register_batches('{name}'): give at least one batch");
        };
        let provider = Arc::new(MemTable::try_new(schema, vec![batches])?);
        self.register_provider(name, provider, TableKey::from(format!("mem:{name}")), reg)
    }

    /// The data owner registers any provider under `key` (its identity in the ledger). A
    /// provider that reads local files through the session's `file://` object store reads only
    /// files pinned by a registration ([`crate::files::PinnedFs`]): register files with
    /// [`PrivateSession::register_csv`] or [`PrivateSession::register_parquet`].
    pub fn register_provider(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_owned(name, provider, key, reg, None)
    }

    fn register_owned(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
        format: Option<String>,
    ) -> Result<TablePolicy> {
        let policy = self.install(name, provider, key, reg, format, None)?;
        self.owned
            .lock()
            .expect("lock")
            .insert(name.to_ascii_lowercase());
        Ok(policy)
    }

    /// Records the policy (owner registrations) and registers the guarded provider.
    fn install(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
        format: Option<String>,
        recheck: Option<crate::guard::table::Recheck>,
    ) -> Result<TablePolicy> {
        let name = name.to_ascii_lowercase();
        let schema = provider.schema();
        check_typed(&name, &schema)?;
        for c in &reg.public_columns {
            check_column(&name, &schema, c, "public column")?;
        }
        check_ratio_bounds(&name, &provider, &reg, &self.fs)?;
        let unit = check_unit(&name, &schema, &reg)?;
        let policy = TablePolicy {
            key: key.clone(),
            name: name.clone(),
            visibility: reg.visibility,
            neighbours: reg.neighbours,
            public_columns: reg.public_columns.clone(),
            budget: reg.budget.unwrap_or(self.options.default_budget),
            filter: reg.filter.unwrap_or_default(),
            delta_share: reg.delta_share.unwrap_or(DEFAULT_DELTA_SHARE),
            schema: Some(crate::owner::pin(&schema)),
            format,
            relaxed: None,
            unit,
        };
        crate::accounting::check_budget(&policy.budget)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let stated = FilterChoice {
            kind: reg.filter.is_some(),
            delta_share: reg.delta_share.is_some(),
            budget: reg.budget.is_some(),
        };
        let policy = self
            .accountant
            .register_table_with(policy, stated, reg.relax.as_deref())
            .map_err(crate::error::Error::from_accounting)?;
        let info = TableInfo {
            name: name.clone(),
            key,
            private: policy.visibility == Visibility::Private,
            neighbours: policy.neighbours,
            public_columns: policy.public_columns.clone(),
            ratio_bounds: reg.ratio_bounds.clone(),
            unit: policy.unit.clone(),
            selection_delta: (policy.visibility == Visibility::Private)
                .then(|| policy.compiled_filter().ok().map(|f| f.selection_delta()))
                .flatten(),
        };
        let mut guarded = GuardedTable::new(provider, info);
        if let Some(r) = recheck {
            guarded = guarded.with_recheck(r);
        }
        let guarded = Arc::new(guarded);
        let _ = self.ctx.deregister_table(name.as_str())?;
        self.ctx.register_table(name.as_str(), guarded.clone())?;
        self.tables
            .lock()
            .expect("lock")
            .insert(name.clone(), guarded);
        Ok(policy)
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
        self.accountant.budget_rows()
    }

    /// Takes the receipt of the latest charge this session admitted (None: none since the last
    /// take). A front end that cancels a running statement reads it to show what the statement
    /// was charged: clear it before the statement, take it after the cancellation.
    pub fn take_last_receipt(&self) -> Option<Receipt> {
        self.last_receipt.lock().expect("lock").take()
    }

    /// Every charge, oldest first.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.accountant.ledger_entries()
    }

    /// Runs one SQL statement. Errors that dpfusion decides are typed: [`crate::Error::of`]
    /// tells a refusal, a budget refusal, invalid input and a failed execution apart.
    /// A panic anywhere in the statement never leaves this call: after admission it is the one
    /// fixed message [`EXECUTION_FAILED`], elsewhere [`STATEMENT_PANICKED`].
    pub async fn sql(&self, sql: &str) -> Result<QueryResult> {
        use futures::FutureExt;
        let statement = STATEMENT_L0.scope(std::cell::Cell::new(None), self.sql_statement(sql));
        match std::panic::AssertUnwindSafe(statement).catch_unwind().await {
            Ok(r) => r.map_err(crate::error::Error::classify),
            Err(_) => Err(DataFusionError::Execution(STATEMENT_PANICKED.to_string())),
        }
    }

    /// [`PrivateSession::sql`] on behalf of a named analyst (`dpfusion serve`): the ledger's
    /// charge records who spent it.
    pub async fn sql_as(&self, analyst: &str, sql: &str) -> Result<QueryResult> {
        ANALYST.scope(Arc::from(analyst), self.sql(sql)).await
    }

    async fn sql_statement(&self, sql: &str) -> Result<QueryResult> {
        let trimmed = sql.trim().trim_end_matches(';').trim();
        check_complexity(trimmed)?;
        if let Some(rest) = strip_prefix_ci(trimmed, &["EXPLAIN", "PRIVACY"]) {
            return self.explain_privacy(rest).await;
        }
        if strip_prefix_ci(trimmed, &["SHOW", "BUDGET"]).is_some_and(|r| r.is_empty()) {
            let batch = statements::budget_batch(&self.accountant.budget_rows())?;
            return Ok(QueryResult::of(vec![batch.clone()], batch.schema()));
        }
        if strip_prefix_ci(trimmed, &["SHOW", "TABLES"]).is_some_and(|r| r.is_empty()) {
            let batch = statements::tables_batch(&self.policies())?;
            return Ok(QueryResult::of(vec![batch.clone()], batch.schema()));
        }
        // `HELP [function]`: the DP aggregates' documentation (statements::help).
        if let Some(name) = strip_prefix_ci(trimmed, &["HELP"]) {
            let batch = statements::help::help_batch(name)?;
            return Ok(QueryResult::of(vec![batch.clone()], batch.schema()));
        }
        let stmt = self.parse(trimmed)?;
        match stmt {
            DFStatement::CreateExternalTable(c) => self.create_external_table(c).await,
            DFStatement::Reset(_) => plan_err!("dpfusion refused the query: RESET is not allowed"),
            stmt => {
                let plan = self.ctx.state().statement_to_plan(stmt).await?;
                self.run_plan(trimmed, plan).await
            }
        }
    }

    fn parse(&self, sql: &str) -> Result<DFStatement> {
        let clause = statements::bigquery::strip_dp_clause(sql).map_err(DataFusionError::Plan)?;
        let sql = clause.as_ref().map_or(sql, |(s, _)| s.as_str());
        let mut stmts = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
        if stmts.len() != 1 {
            return plan_err!(
                "expected exactly one SQL statement, got {}; run statements one at a time",
                stmts.len()
            );
        }
        let mut stmt = stmts.pop_front().expect("one");
        if let Some((_, c)) = &clause {
            self.apply_dp_clause(&mut stmt, c)?;
        }
        let delta = self.default_delta();
        resolve_df_statement(&mut stmt, delta).map_err(DataFusionError::Plan)?;
        Ok(stmt)
    }

    /// Plans and checks a query without running it or charging anything: the [`guard::CheckedPlan`]
    /// that would run (with the guard's rewrites, its joins' public sides settled) and the DP
    /// calls it would make.
    pub async fn check(&self, sql: &str) -> Result<guard::CheckedPlan> {
        let trimmed = sql.trim().trim_end_matches(';').trim();
        let run = async {
            check_complexity(trimmed)?;
            self.plan_query(trimmed).await
        };
        STATEMENT_L0
            .scope(std::cell::Cell::new(None), run)
            .await
            .map_err(crate::error::Error::classify)
    }

    /// Plans and checks a query without running it.
    async fn plan_query(&self, sql: &str) -> Result<guard::CheckedPlan> {
        let stmt = self.parse(sql)?;
        let state = self.ctx.state();
        let plan = state.statement_to_plan(stmt).await?;
        guard::check(&state, &plan, self.guard_options()).await
    }

    async fn run_plan(&self, sql: &str, plan: LogicalPlan) -> Result<QueryResult> {
        match &plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) => {
                self.check_not_owned(c.name.table(), "CREATE TABLE")?;
                return self.create_table_as(sql, c.name.table(), &c.input).await;
            }
            LogicalPlan::Ddl(DdlStatement::CreateView(v)) => {
                return plan_err!(
                    "dpfusion refused the query: CREATE VIEW '{}' is not supported: a view would \
                     stand between the guard and the tables it reads. Write the query with a CTE \
                     (WITH name AS (...) SELECT ...) instead.",
                    v.name
                );
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(d)) => {
                let name = d.name.table().to_ascii_lowercase();
                self.check_not_owned(&name, "DROP TABLE")?;
                self.ctx.execute_logical_plan(plan).await?;
                self.tables.lock().expect("lock").remove(&name);
                return Ok(QueryResult::empty());
            }
            LogicalPlan::Ddl(DdlStatement::DropView(_)) => {
                self.ctx.execute_logical_plan(plan).await?;
                return Ok(QueryResult::empty());
            }
            LogicalPlan::Ddl(other) => {
                return plan_err!(
                    "dpfusion refused the query: {} is not allowed; register tables with CREATE \
                     EXTERNAL TABLE ... OPTIONS ('dp.visibility' ...)",
                    other.name()
                );
            }
            LogicalPlan::Dml(d) => {
                return plan_err!(
                    "dpfusion refused the query: {} into '{}' is not allowed: dpfusion tables are \
                     read-only (writing rows could change a private table's contents under its \
                     budget). Use CREATE TABLE name AS SELECT <DP query> to keep DP results.",
                    d.op,
                    d.table_name
                );
            }
            LogicalPlan::Statement(s) => {
                return self.statement(s);
            }
            // `DESCRIBE t`: the table's columns from its (pinned) schema; no row is read and
            // nothing is charged, so it works for private tables too (issue 33).
            LogicalPlan::DescribeTable(d) => {
                let batch = statements::describe_batch(&d.schema)?;
                return Ok(QueryResult::of(vec![batch.clone()], batch.schema()));
            }
            LogicalPlan::Copy(c) => {
                if !c.partition_by.is_empty() {
                    return plan_err!(
                        "dpfusion refused the query: COPY ... PARTITIONED BY writes directories; \
                         write one file"
                    );
                }
                let target = self.output_target(&c.output_url)?;
                let state = self.ctx.state();
                let checked = guard::check_copy(&state, c, target, self.guard_options()).await?;
                return self.execute_guarded(sql, checked).await;
            }
            _ => {}
        }
        if matches!(plan, LogicalPlan::Explain(_)) && guard::reads_private(&plan) {
            let t = guard::private_tables(&plan).join("', '");
            return Err(guard::explain_refusal(&t));
        }
        let state = self.ctx.state();
        let checked = guard::check(&state, &plan, self.guard_options()).await?;
        self.execute_guarded(sql, checked).await
    }

    /// Admits (charges durably) and runs a checked plan, the only kind of plan a query runs as.
    /// Once a query that reads a private table is admitted, any error or panic of its planning or
    /// execution reaches the analyst as the one fixed message [`EXECUTION_FAILED`]: it may depend
    /// on the data (docs/PRIVACY.md).
    async fn execute_guarded(&self, sql: &str, checked: guard::CheckedPlan) -> Result<QueryResult> {
        // On a cluster, a plan that cannot cross Ballista's codec as checked is refused before
        // anything is charged (crate::distributed).
        #[cfg(feature = "distributed")]
        if self.options.cluster.is_some() {
            crate::distributed::admissible(&checked)?;
        }
        let receipt = self.admit(sql, checked.calls())?;
        let private = checked.reads_private();
        let schema = checked.schema();
        let state = self.ctx.state();
        let task = self.ctx.task_ctx();
        let run = async {
            let physical = state
                .query_planner()
                .create_physical_plan(checked.plan(), &state)
                .await?;
            datafusion::physical_plan::collect(physical, task).await
        };
        let batches = sanitise(private, run).await?;
        Ok(QueryResult {
            schema,
            batches,
            receipt,
            tables: checked.tables().to_vec(),
        })
    }

    /// Where a `COPY … TO` may write: only a new file, by a plain file name, directly in the
    /// output directory the data owner configured ([`SessionOptions::output_dir`], pinned when
    /// the session opened). The checks here give the messages; the write itself goes through
    /// [`crate::files::PinnedFs::create_output`], which opens the pinned directory without
    /// following links and creates the file with `O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing
    /// swapped in after these checks can redirect it.
    fn output_target(&self, url: &str) -> Result<String> {
        let Some(dir) = self.fs.output_dir() else {
            return plan_err!(
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
            return plan_err!(
                "dpfusion refused the query: COPY ... TO '{url}': the target must be a relative \
                 file name inside the output directory {} (no '..', no absolute path, no URL, \
                 no glob, no directory; a file name with an extension)",
                dir.display()
            );
        }
        self.fs
            .check_output()
            .map_err(|e| DataFusionError::Plan(format!("dpfusion refused the query: {e}")))?;
        let target = dir.join(rel);
        // No symbolic link on the way (the message; the write refuses them anyway).
        let mut p = dir.clone();
        for c in rel.components() {
            p.push(c);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return plan_err!(
                    "dpfusion refused the query: COPY ... TO '{url}' goes through a symbolic link"
                );
            }
        }
        if rel.components().count() != 1 {
            return plan_err!(
                "dpfusion refused the query: COPY ... TO '{url}': COPY writes one new file \
                 directly in the output directory {} (no sub-directory)",
                dir.display()
            );
        }
        // Never the ledger's directory, the owner's files or a private table's files (any the
        // ledger knows), nor a file of a table registered in this session.
        self.protection.check_write(&target)?;
        let taken = self.tables.lock().expect("lock").values().any(|t| {
            let k = t.info().key.as_str();
            k.strip_prefix("analyst:")
                .unwrap_or(k)
                .split(',')
                .map(Path::new)
                .any(|k| k.is_absolute() && (target.starts_with(k) || k.starts_with(&target)))
        });
        if taken {
            return plan_err!(
                "dpfusion refused the query: COPY ... TO '{url}' would write over a registered \
                 table's file"
            );
        }
        match std::fs::symlink_metadata(&target) {
            Ok(m) if !m.is_file() => {
                return plan_err!(
                    "dpfusion refused the query: COPY ... TO '{url}' is not a regular file"
                );
            }
            Ok(_) => {
                return plan_err!(
                    "dpfusion refused the query: COPY ... TO '{url}': the file exists; COPY only \
                     creates new files (choose a new name)"
                );
            }
            Err(_) => {}
        }
        Ok(target.to_string_lossy().to_string())
    }

    /// Admission: one atomic, durable step in the accountant. Nothing runs before it returns.
    fn admit(&self, sql: &str, calls: &[DpCall]) -> Result<Option<Receipt>> {
        let charges = charges_of(calls);
        if charges.is_empty() {
            return Ok(None);
        }
        let analyst = ANALYST.try_with(Arc::clone).ok();
        let receipt = self
            .accountant
            .admit_requests(sql, &charges, &requests_of(calls), analyst.as_deref())
            .map_err(crate::error::Error::from_accounting)?;
        *self.last_receipt.lock().expect("lock") = Some(receipt.clone());
        Ok(Some(receipt))
    }

    async fn explain_privacy(&self, sql: &str) -> Result<QueryResult> {
        let checked = self.plan_query(sql).await?;
        let charges = charges_of(checked.calls());
        let preview = self
            .accountant
            .preview(&charges)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let batch = statements::explain_privacy_batch(checked.calls(), &preview)?;
        let mut r = QueryResult::of(vec![batch.clone()], batch.schema());
        r.tables = checked.tables().to_vec();
        Ok(r)
    }

    async fn create_table_as(
        &self,
        sql: &str,
        name: &str,
        input: &LogicalPlan,
    ) -> Result<QueryResult> {
        let state = self.ctx.state();
        let checked = guard::check(&state, input, self.guard_options()).await?;
        let result = self.execute_guarded(sql, checked).await?;
        let receipt = result.receipt;
        let provider = Arc::new(MemTable::try_new(result.schema, vec![result.batches])?);
        // The result of a DP query is public (post-processing).
        self.install(
            name,
            provider,
            TableKey::from(format!("result:{}", name.to_ascii_lowercase())),
            Registration::public(),
            None,
            None,
        )?;
        let mut r = QueryResult::empty();
        r.receipt = receipt;
        r.tables = result.tables;
        Ok(r)
    }

    /// The query-level settings the guard applies (contribution bounds).
    pub fn guard_options(&self) -> guard::GuardOptions {
        let mut o = *self.bounds.read().expect("lock");
        o.default_delta_bits = Some(self.default_delta().to_bits());
        if let Ok(Some(k)) = STATEMENT_L0.try_with(|c| c.get()) {
            o.max_groups_contributed = Some(k);
        }
        o
    }

    /// Rewrites the SELECT of a BigQuery DIFFERENTIAL_PRIVACY clause to dp_* calls
    /// ([`statements::bigquery`]) after checking that its unit options keep the data owner's
    /// policy: `privacy_unit_column` must be the registered unit column, `max_groups_contributed`
    /// at most the registered (or `SET`) bound, of every table with a unit the statement reads.
    /// A tighter bound applies to this statement only.
    fn apply_dp_clause(
        &self,
        stmt: &mut DFStatement,
        c: &statements::bigquery::DpClause,
    ) -> Result<()> {
        use datafusion::sql::sqlparser::ast::visit_relations;
        let refuse = |m: String| {
            DataFusionError::Plan(format!(
                "dpfusion refused the query: WITH DIFFERENTIAL_PRIVACY: {m}"
            ))
        };
        let inner: &mut datafusion::sql::sqlparser::ast::Statement = match stmt {
            DFStatement::Statement(s) => s.as_mut(),
            DFStatement::Explain(e) => match e.statement.as_mut() {
                DFStatement::Statement(s) => s.as_mut(),
                _ => return Err(refuse("the clause opens a SELECT".into())),
            },
            _ => return Err(refuse("the clause opens a SELECT".into())),
        };
        let mut names: Vec<String> = Vec::new();
        let _ = visit_relations(&*inner, |r| {
            if let Some(last) = r.0.last() {
                names.push(last.to_string().trim_matches('"').to_ascii_lowercase());
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        let session_l0 = self.bounds.read().expect("lock").max_groups_contributed;
        let units: Vec<(String, PrivacyUnit)> = {
            let tables = self.tables.lock().expect("lock");
            names
                .iter()
                .filter_map(|n| {
                    let t = tables.get(n)?;
                    Some((n.clone(), t.info().unit.clone()?))
                })
                .collect()
        };
        if let Some(col) = &c.privacy_unit_column {
            if units.is_empty() {
                return Err(refuse(format!(
                    "privacy_unit_column = {col}: no table of the query has a privacy unit \
                     column; the data owner declares units (privacy_unit in the catalog); drop \
                     the option"
                )));
            }
            for (t, u) in &units {
                if &u.column != col {
                    return Err(refuse(format!(
                        "privacy_unit_column = {col}, but table '{t}' has the privacy unit \
                         column '{}', set by its data owner; drop the option or name '{}'",
                        u.column, u.column
                    )));
                }
            }
        }
        if let Some(k) = c.max_groups_contributed {
            for (t, u) in &units {
                let bound = session_l0.unwrap_or(u.max_groups_contributed);
                if k > bound {
                    return Err(refuse(format!(
                        "max_groups_contributed = {k} is larger than the bound {bound} of table \
                         '{t}' (its data owner's policy); use max_groups_contributed <= {bound} \
                         or omit it"
                    )));
                }
            }
            // Only tables with a unit bound groups per unit; elsewhere a unit is one row.
            if !units.is_empty() {
                let _ = STATEMENT_L0.try_with(|cell| cell.set(Some(k)));
            }
        }
        statements::bigquery::rewrite_dp_select(inner, c).map_err(DataFusionError::Plan)
    }

    fn statement(&self, s: &datafusion::logical_expr::Statement) -> Result<QueryResult> {
        use datafusion::logical_expr::Statement as S;
        if let S::SetVariable(v) = s {
            let var = v.variable.to_ascii_lowercase();
            if var == "dpfusion.max_groups_contributed" || var == "dpfusion.max_rows_contributed" {
                let value = v.value.trim().trim_matches('\'');
                let bound = if value.eq_ignore_ascii_case("default") {
                    None
                } else {
                    let n: u64 = value.parse().map_err(|_| {
                        DataFusionError::Plan(format!(
                            "{var} must be an integer from 1 to {} (or DEFAULT for the tables' \
                             own), got {}",
                            PrivacyUnit::MAX_BOUND,
                            v.value
                        ))
                    })?;
                    Some(PrivacyUnit::check_bound(&var, n).map_err(DataFusionError::Plan)?)
                };
                let mut b = self.bounds.write().expect("lock");
                if var == "dpfusion.max_groups_contributed" {
                    b.max_groups_contributed = bound;
                } else {
                    b.max_rows_contributed = bound;
                }
                return Ok(QueryResult::empty());
            }
            if v.variable.eq_ignore_ascii_case("dpfusion.default_delta") {
                let d: f64 = v.value.trim().trim_matches('\'').parse().map_err(|_| {
                    DataFusionError::Plan(format!(
                        "dpfusion.default_delta must be a number in (0, 1), got {}",
                        v.value
                    ))
                })?;
                dpfusion_udfs::privacy::error::check_delta("dpfusion.default_delta", d)
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                *self.default_delta.write().expect("lock") = d;
                return Ok(QueryResult::empty());
            }
            return plan_err!(
                "dpfusion refused the query: SET {} is not allowed; the settings are \
                 dpfusion.default_delta, dpfusion.max_groups_contributed and \
                 dpfusion.max_rows_contributed",
                v.variable
            );
        }
        plan_err!("dpfusion refused the query: {} is not allowed", s.name())
    }

    /// Analyst SQL's `CREATE EXTERNAL TABLE`: a public table over files the data owner lets
    /// analysts read ([`AnalystFiles`]), never over a private table's files, the ledger's
    /// directory or the owner's files, under any spelling. Policy options (`dp.*`) are the
    /// owner's: refused.
    async fn create_external_table(
        &self,
        c: datafusion::sql::parser::CreateExternalTable,
    ) -> Result<QueryResult> {
        use datafusion::sql::sqlparser::ast::ObjectNamePart;
        let bare = match c.name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] => Some(i.value.to_ascii_lowercase()),
            _ => None,
        };
        let Some(name) = bare else {
            return plan_err!(
                "dpfusion refused the statement: CREATE EXTERNAL TABLE {}: give a bare table name \
                 (no catalog or schema)",
                c.name
            );
        };
        if let Some((k, _)) = c
            .options
            .iter()
            .find(|(k, _)| k.to_ascii_lowercase().starts_with("dp."))
        {
            return plan_err!(
                "dpfusion refused the statement: '{k}' is a policy option, and policy (visibility, \
                 budget, neighbours, public columns, filter) is the data owner's, never SQL's. \
                 The data owner declares private and public tables in the catalog (dpfusion \
                 --catalog FILE; docs/CATALOG.md), with --private/--public in single-user mode, \
                 or with the Rust API. CREATE EXTERNAL TABLE registers public tables of the \
                 analyst's own files only, without dp.* options."
            );
        }
        self.check_not_owned(&name, "CREATE EXTERNAL TABLE")?;
        let mut sets = Vec::new();
        for location in &c.locations {
            sets.push(self.analyst_file_set(location)?);
        }
        // DataFusion reads the canonical spelling the pins know (crate::files::store), and
        // only what is pinned now.
        let mut c = c;
        for location in c.locations.iter_mut() {
            let canon =
                crate::files::canonical_location(location, Path::new(".")).map_err(|e| {
                    DataFusionError::Plan(format!("dpfusion refused the registration: {e}"))
                })?;
            *location = canon.to_string_lossy().to_string();
        }
        let mut pins = Vec::new();
        for set in &sets {
            match self.fs.pin(&name, set, false) {
                Ok(p) => pins.push(p),
                Err(e) => {
                    pins.iter().for_each(|p| self.fs.unpin(*p));
                    return plan_err!("dpfusion refused the registration: {e}");
                }
            }
        }
        let registered = async {
            let tmp = self.fs.scratch_context()?;
            let plan = tmp
                .state()
                .statement_to_plan(DFStatement::CreateExternalTable(c.clone()))
                .await?;
            tmp.execute_logical_plan(plan).await?;
            let provider = tmp.table_provider(name.as_str()).await?;
            // The provider lists its files again at every scan: check them again then, so a
            // file that appears later under the location cannot be a private one.
            let protection = self.protection.clone();
            let allowed = self.options.analyst_files.clone();
            let locations = c.locations.clone();
            let recheck: crate::guard::table::Recheck = Arc::new(move || {
                for location in &locations {
                    analyst_file_set(location, &allowed, &protection)?;
                }
                Ok(())
            });
            let key = TableKey::from(format!(
                "analyst:{}",
                sets.iter()
                    .map(|s| s.root.to_string_lossy().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            self.install(
                &name,
                provider,
                key,
                Registration::public(),
                None,
                Some(recheck),
            )
        }
        .await;
        match &registered {
            Ok(_) => self.fs.retain_table(&name, &pins),
            Err(_) => pins.iter().for_each(|p| self.fs.unpin(*p)),
        }
        let policy = registered?;
        let batch = statements::registration_batch(&policy)?;
        Ok(QueryResult::of(vec![batch.clone()], batch.schema()))
    }

    /// The file set of a location analyst SQL names, if the owner allows its files and none is
    /// protected. Outside the allowed directories nothing is resolved in the message: whether a
    /// path exists there is not the analyst's to learn.
    fn analyst_file_set(&self, location: &str) -> Result<crate::files::FileSet> {
        analyst_file_set(location, &self.options.analyst_files, &self.protection)
    }
}

/// [`PrivateSession::analyst_file_set`], for the check before every scan too.
fn analyst_file_set(
    location: &str,
    analyst_files: &AnalystFiles,
    protection: &Protection,
) -> Result<crate::files::FileSet> {
    {
        let resolve = || {
            crate::files::resolve(location, Path::new(".")).map_err(|e| {
                DataFusionError::Plan(format!("dpfusion refused the registration: {e}"))
            })
        };
        let set = match analyst_files {
            AnalystFiles::None => {
                return plan_err!(
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
                    plan_err!(
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

impl PrivateSession {
    /// Analyst SQL cannot replace, shadow or drop a table the data owner registered.
    fn check_not_owned(&self, name: &str, what: &str) -> Result<()> {
        if self
            .owned
            .lock()
            .expect("lock")
            .contains(&name.to_ascii_lowercase())
        {
            return plan_err!(
                "dpfusion refused the statement: {what} '{name}': '{name}' is a table of the \
                 data owner, which analyst SQL cannot replace, shadow or drop. Choose another \
                 name."
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum FileFormat {
    Csv,
    Parquet,
}

/// `column` must name a column of `schema` exactly (names are case-sensitive); a name that only
/// matches another spelling is refused with the exact name, so that no declaration is ambiguous.
/// The privacy unit of a registration, checked: a private table with `add_remove` neighbours, an
/// existing column, bounds in range; the domain defaults to the table's name.
fn check_unit(name: &str, schema: &Schema, reg: &Registration) -> Result<Option<PrivacyUnit>> {
    let Some(u) = &reg.unit else {
        return Ok(None);
    };
    if reg.visibility != Visibility::Private {
        return plan_err!(
            "table '{name}': a privacy unit is declared on a private table; a public table has \
             none"
        );
    }
    if reg.neighbours != Neighbours::AddRemove {
        return plan_err!(
            "table '{name}': a privacy unit means neighbouring datasets differ by adding or \
             removing all the rows of one unit; it cannot be combined with replace neighbours \
             (remove neighbours = \"replace\", or the unit)"
        );
    }
    check_column(name, schema, &u.column, "privacy unit column")?;
    if reg.public_columns.contains(&u.column) {
        return plan_err!(
            "table '{name}': the privacy unit column '{}' cannot also be a public column: who a \
             row belongs to is what the unit protects",
            u.column
        );
    }
    for (what, v) in [
        ("max_groups_contributed", u.max_groups_contributed),
        ("max_rows_contributed", u.max_rows_contributed),
    ] {
        PrivacyUnit::check_bound(what, v as u64)
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
    }
    let domain = if u.domain.trim().is_empty() {
        name.to_string()
    } else {
        u.domain.trim().to_string()
    };
    Ok(Some(PrivacyUnit {
        domain,
        ..u.clone()
    }))
}

fn check_column(table: &str, schema: &Schema, column: &str, what: &str) -> Result<()> {
    if schema.fields().iter().any(|f| f.name() == column) {
        return Ok(());
    }
    let near: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|f| f.eq_ignore_ascii_case(column))
        .collect();
    if !near.is_empty() {
        return plan_err!(
            "{what} '{column}' is not a column of table '{table}': column names are \
             case-sensitive, and the table has {}. Declare the exact name.",
            near.iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    plan_err!(
        "{what} '{column}' is not a column of table '{table}' (columns: {})",
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Every column of a table has a type: a column of Arrow type `Null` (a CSV file with a header
/// and no data row infers one per column) would be pinned in the ledger for good, read every
/// later row as NULL and let DP calls charge for nothing. Refused at registration, with what to
/// declare instead (issue 33).
fn check_typed(table: &str, schema: &Schema) -> Result<()> {
    let untyped: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| f.data_type().is_null())
        .map(|f| f.name().as_str())
        .collect();
    if untyped.is_empty() {
        return Ok(());
    }
    let example = untyped
        .iter()
        .map(|c| format!("{{ name = \"{c}\", type = \"Float64\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    plan_err!(
        "table '{table}': no type could be inferred for column(s) '{}' (a file with a header \
         and no data rows, or only empty values). Declare the columns' types: in the catalog, \
         columns = [{example}] in the table's [[table]] section (docs/CATALOG.md); in the Rust \
         API, Registration::schema; in CREATE EXTERNAL TABLE, a column list (name TYPE, ...)",
        untyped.join("', '")
    )
}

/// Checks the declared ratio bounds on the data (the owner's registration; the errors may name
/// groups). Runs on its own thread and runtime, so it can be called from sync and async code.
fn check_ratio_bounds(
    table: &str,
    provider: &Arc<dyn TableProvider>,
    reg: &Registration,
    fs: &Arc<crate::files::PinnedFs>,
) -> Result<()> {
    if reg.ratio_bounds.is_empty() {
        return Ok(());
    }
    let schema = provider.schema();
    for b in &reg.ratio_bounds {
        check_column(table, &schema, &b.value, "ratio-bound column")?;
        check_column(table, &schema, &b.by, "ratio-bound `by` column")?;
        if !reg.public_columns.contains(&b.by) {
            return plan_err!(
                "the ratio bound of '{}' by '{}' needs '{}' to be a public column of table \
                 '{table}'",
                b.value,
                b.by,
                b.by
            );
        }
        if !(b.max_ratio.is_finite() && b.max_ratio >= 1.0) {
            return plan_err!(
                "the ratio bound of '{}' by '{}' must be a finite number >= 1, got {}",
                b.value,
                b.by,
                b.max_ratio
            );
        }
    }
    let provider = provider.clone();
    let bounds = reg.ratio_bounds.clone();
    let table = table.to_string();
    let fs = Arc::clone(fs);
    let run = move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        rt.block_on(async move {
            // The files are read through the session's pins, as every scan.
            let ctx = fs.scratch_context()?;
            ctx.register_table("t", provider)?;
            for b in &bounds {
                let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
                let (v, by) = (q(&b.value), q(&b.by));
                let sql = format!(
                    "SELECT CAST({by} AS VARCHAR) AS g, min(CAST({v} AS DOUBLE)) AS lo, \
                     max(CAST({v} AS DOUBLE)) AS hi, count(*) - count({v}) AS nulls \
                     FROM t GROUP BY 1 ORDER BY 1"
                );
                let batches = ctx.sql(&sql).await?.collect().await?;
                let mut bad = Vec::new();
                for batch in &batches {
                    use datafusion::arrow::array::{Array, AsArray};
                    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
                    let g = datafusion::arrow::compute::cast(
                        batch.column(0),
                        &datafusion::arrow::datatypes::DataType::Utf8,
                    )?;
                    let g = g.as_string::<i32>();
                    let lo = batch.column(1).as_primitive::<Float64Type>();
                    let hi = batch.column(2).as_primitive::<Float64Type>();
                    let nulls = batch.column(3).as_primitive::<Int64Type>();
                    for i in 0..batch.num_rows() {
                        let (l, h) = (lo.value(i), hi.value(i));
                        let ok = nulls.value(i) == 0
                            && !lo.is_null(i)
                            && l > 0.0
                            && l.is_finite()
                            && h <= b.max_ratio * l;
                        if !ok {
                            bad.push(format!(
                                "{} (min {l}, max {h}, {} NULL)",
                                if g.is_null(i) { "NULL" } else { g.value(i) },
                                nulls.value(i)
                            ));
                        }
                    }
                }
                if !bad.is_empty() {
                    return plan_err!(
                        "table '{table}': the data do not satisfy the declared ratio bound of \
                         '{}' by '{}' (every value > 0, no NULL, max <= {} x min in each group); \
                         groups that fail: {}",
                        b.value,
                        b.by,
                        b.max_ratio,
                        bad.join("; ")
                    );
                }
            }
            Ok(())
        })
    };
    std::thread::scope(|s| {
        s.spawn(run)
            .join()
            .unwrap_or_else(|_| plan_err!("checking the ratio bounds of '{}' failed", "table"))
    })
}

/// The one message of a failed execution of a query that reads a private table. It names no
/// value, no row and no error class: any of them could depend on the data.
pub const EXECUTION_FAILED: &str = "dpfusion: the query failed while it ran. Its charge stands (a \
failure can depend on the data, so it is not refunded), and the error is not shown because it \
could reveal private values. Check the query's types and functions against docs/SQL.md.";

/// Runs `fut`; when `private`, any error or panic becomes [`EXECUTION_FAILED`]. A panic never
/// leaves it (a panic of a query must not take down an embedding process or the server): on a
/// query that reads no private table it becomes an error naming the panic (public work).
async fn sanitise<T>(
    private: bool,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    use futures::FutureExt;
    let out = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
    match out {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if !private => Err(e),
        Err(panic) if !private => Err(DataFusionError::Execution(format!(
            "the query stopped on an internal error (a panic: {})",
            panic_text(panic.as_ref())
        ))),
        _ => Err(DataFusionError::External(Box::new(
            crate::error::Error::ExecutionFailed,
        ))),
    }
}

/// The text of a panic's payload (a `&str` or `String`, else a placeholder).
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// The message of a statement that panicked outside [`sanitise`] (parsing, planning, the guard,
/// admission). It shows nothing of the panic, which could come from anywhere.
pub const STATEMENT_PANICKED: &str = "dpfusion: the statement stopped on an internal error (a \
panic) before or around its execution; the error is not shown because it could reveal private \
values. If the statement was admitted, its charge stands (see SHOW BUDGET). Please report it.";

/// Limits on one statement's text, checked before parsing: a statement that could exhaust the
/// stack while it is parsed, planned, evaluated or dropped is refused with a message, never a
/// crash. Expressions become deep trees through chains of operators (`a + b + c …` is
/// left-deep), casts (`x::INT::INT …`) and parentheses, so the check estimates the depth of the
/// tree the statement parses to: along every path of parentheses, the number of operators
/// chained at each level (a comma or clause keyword starts a new expression), plus the nesting
/// itself. The bound keeps a debug build's planning within a 2 MiB thread stack (tokio's
/// default), so embedders calling `sql()` from any task are safe.
pub const MAX_SQL_BYTES: usize = 1 << 20;
/// The largest estimated expression depth.
pub const MAX_DEPTH: usize = 128;
/// The most set operations (UNION, INTERSECT, EXCEPT) and joins in one statement.
pub const MAX_CHAIN: usize = 64;

fn check_complexity(sql: &str) -> Result<()> {
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if sql.len() > MAX_SQL_BYTES {
        return plan_err!(
            "dpfusion refused the query: the statement has {} bytes, more than {MAX_SQL_BYTES}",
            sql.len()
        );
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| DataFusionError::Plan(format!("SQL error: {e}")))?;
    // Operators chained at each open level of parentheses (the last entry is the innermost).
    let mut levels: Vec<usize> = vec![0];
    let (mut depth, mut chains) = (0usize, 0usize);
    for t in &tokens {
        let op = match t {
            Token::Whitespace(_) | Token::SemiColon | Token::Period => continue,
            Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::Placeholder(_) => continue,
            Token::LParen | Token::LBracket | Token::LBrace => {
                levels.push(0);
                false
            }
            Token::RParen | Token::RBracket | Token::RBrace => {
                if levels.len() > 1 {
                    levels.pop();
                }
                continue;
            }
            Token::Comma => {
                *levels.last_mut().expect("one level") = 0;
                continue;
            }
            Token::Word(w) => match w.keyword {
                Keyword::SELECT
                | Keyword::FROM
                | Keyword::WHERE
                | Keyword::GROUP
                | Keyword::HAVING
                | Keyword::ORDER
                | Keyword::LIMIT
                | Keyword::OFFSET
                | Keyword::ON
                | Keyword::USING
                | Keyword::WHEN
                | Keyword::THEN
                | Keyword::ELSE
                | Keyword::AS
                | Keyword::WITH => {
                    *levels.last_mut().expect("one level") = 0;
                    continue;
                }
                // A CASE opens a level like a parenthesis (its branches may nest further).
                Keyword::CASE => {
                    levels.push(0);
                    false
                }
                Keyword::END => {
                    if levels.len() > 1 {
                        levels.pop();
                    }
                    continue;
                }
                Keyword::UNION | Keyword::INTERSECT | Keyword::EXCEPT | Keyword::JOIN => {
                    chains += 1;
                    continue;
                }
                Keyword::AND
                | Keyword::OR
                | Keyword::XOR
                | Keyword::NOT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::ILIKE
                | Keyword::SIMILAR
                | Keyword::REGEXP
                | Keyword::RLIKE
                | Keyword::BETWEEN
                | Keyword::IN
                | Keyword::COLLATE
                | Keyword::AT
                | Keyword::DIV
                | Keyword::CAST
                | Keyword::INTERVAL => true,
                // Identifiers and other keywords (types, names, DISTINCT …).
                _ => continue,
            },
            // Every other symbol is an operator: arithmetic, comparison, ||, ::, ~, ->, @> …
            _ => true,
        };
        if op {
            *levels.last_mut().expect("one level") += 1;
        }
        depth = depth.max(levels.iter().sum::<usize>() + levels.len());
    }
    if depth > MAX_DEPTH || chains > MAX_CHAIN {
        return plan_err!(
            "dpfusion refused the query: the statement is too complex (an expression about \
             {depth} levels deep, {chains} joins or set operations; the limits are {MAX_DEPTH} \
             and {MAX_CHAIN}). Use IN (...) lists instead of long OR chains, split long sums, or \
             split the statement."
        );
    }
    Ok(())
}

fn strip_prefix_ci<'a>(s: &'a str, words: &[&str]) -> Option<&'a str> {
    let mut rest = s;
    for w in words {
        rest = rest.trim_start();
        if rest.len() < w.len() || !rest[..w.len()].eq_ignore_ascii_case(w) {
            return None;
        }
        let after = &rest[w.len()..];
        if !(after.is_empty() || after.starts_with(char::is_whitespace)) {
            return None;
        }
        rest = after;
    }
    Some(rest.trim())
}

fn resolve_df_statement(stmt: &mut DFStatement, delta: f64) -> std::result::Result<(), String> {
    use statements::readable_names::name_dp_columns;
    match stmt {
        DFStatement::Statement(s) => {
            name_dp_columns(s.as_mut());
            resolve_named_arguments(s.as_mut(), delta)
        }
        DFStatement::Explain(e) => resolve_df_statement(&mut e.statement, delta),
        DFStatement::CopyTo(c) => match &mut c.source {
            CopyToSource::Query(q) => {
                name_dp_columns(q.as_mut());
                resolve_named_arguments(q.as_mut(), delta)
            }
            CopyToSource::Relation(_) => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The calls as written, for the ledger, receipts and refusals (docs/ACCOUNTING.md).
fn requests_of(calls: &[DpCall]) -> Vec<crate::accounting::CallRequest> {
    calls
        .iter()
        .map(|c| crate::accounting::CallRequest {
            key: c.table.key.clone(),
            function: if c.function == guard::PARTITION_SELECT {
                "partition_selection".to_string()
            } else {
                c.function.clone()
            },
            epsilon: c.epsilon.is_finite().then_some(c.epsilon),
            delta: c.delta.is_finite().then_some(c.delta),
            mechanism: crate::accounting::mechanism_of(&c.events),
        })
        .collect()
}

fn charges_of(calls: &[DpCall]) -> Vec<TableCharge> {
    let mut out: Vec<TableCharge> = Vec::new();
    for c in calls {
        match out.iter_mut().find(|t| t.key == c.table.key) {
            Some(t) => t.events.extend(c.events.iter().cloned()),
            None => out.push(TableCharge {
                key: c.table.key.clone(),
                events: c.events.clone(),
            }),
        }
    }
    out
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<PrivateSession>();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Class 5 of issue 26's review: a panic of an admitted query is caught (the fixed message,
    /// nothing of the panic); a public query's panic becomes an error, never an unwind into the
    /// embedding process.
    #[tokio::test]
    async fn a_panic_never_leaves_sanitise() {
        let private = sanitise::<()>(true, async { panic!("salary 98024.77") })
            .await
            .unwrap_err();
        assert!(
            matches!(
                crate::error::Error::of(&private),
                Some(crate::error::Error::ExecutionFailed)
            ),
            "{private}"
        );
        assert!(!private.to_string().contains("98024"), "{private}");
        let public = sanitise::<()>(false, async { panic!("public boom") })
            .await
            .unwrap_err();
        assert!(public.to_string().contains("public boom"), "{public}");
    }
}
