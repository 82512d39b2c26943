//! How a session is opened ([`SessionOptions`]), which files analyst SQL may register
//! ([`AnalystFiles`]) and how the data owner registers a table ([`Registration`]). Plain data with
//! builders: the structs are `#[non_exhaustive]`, so code outside this crate starts from
//! `Default::default()`, [`Registration::private`] or [`Registration::public`] and sets the rest
//! with the `with_*`/builder methods.
use std::path::PathBuf;

use datafusion::arrow::datatypes::SchemaRef;

use super::{
    DEFAULT_CALL_DELTA, DEFAULT_MAX_SPILL_BYTES, DEFAULT_MAX_VALUE_BYTES, DEFAULT_MEMORY_LIMIT,
};
use crate::accounting::{Budget, FilterKind, Neighbours, PrivacyUnit, Visibility};
use crate::guard::table::RatioBound;
use crate::owner::CsvFormat;

/// How a session is opened.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The ledger file (default `./.dpfusion/ledger.jsonl`).
    pub ledger_path: PathBuf,
    /// The budget a private table gets when its registration names none.
    pub default_budget: Budget,
    /// The `delta` of a DP call that gives none.
    pub default_delta: f64,
    /// DataFusion's target partitions (None: the number of cores).
    pub target_partitions: Option<usize>,
    /// The memory one statement may use (default 4 GiB): each statement runs in a memory pool
    /// of its own of this size (round 48), so what other statements, or the server's held
    /// results and uploads, hold never changes it. A statement over its limit fails (with the
    /// fixed message when it reads a private table) instead of taking the process down; the
    /// process may use this much for each statement running at once.
    pub memory_limit: usize,
    /// Where statements spill to disk (round 48): the session makes a directory of its own in
    /// it (`dpfusion-spill-XXXX`, mode 0700) at the first spill and removes it when it closes.
    /// It must be a directory no other user controls (the ledger directory's rule); made, mode
    /// 0700, if missing. None (the default): the OS temporary directory. Analyst SQL can
    /// never read or write the session's spill directory.
    pub spill_dir: Option<PathBuf>,
    /// The most bytes one statement's spill files may hold at once (default 16 GiB,
    /// [`super::DEFAULT_MAX_SPILL_BYTES`]; round 48): each statement has its own bound, so
    /// one analyst's spills never take another's room; past it the statement fails (naming
    /// this setting when it reads no private table, else with the fixed message). 0: never
    /// spill (a statement past its memory fails as out of memory).
    pub max_spill_bytes: u64,
    /// The most bytes one value of a private table may take when it is read (default 64 KiB,
    /// [`DEFAULT_MAX_VALUE_BYTES`]; 1 KiB to 256 MiB, [`super::MAX_VALUE_BYTES_RANGE`]): a
    /// larger value (a string's or binary's bytes, a list's items' …) reads as NULL, or, in a
    /// column declared NOT NULL, as its type's default (round 48). So one row's values, and
    /// what an expression copies of them, are bounded whatever the data; raise it for a table
    /// whose values are legitimately larger. The analyst cannot change it.
    pub max_value_bytes: usize,
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
    pub(crate) insecure_noise_seed: Option<u64>,
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
            spill_dir: None,
            max_spill_bytes: DEFAULT_MAX_SPILL_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
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
    /// The memory limit of one statement, in bytes ([`SessionOptions::memory_limit`]).
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }
    /// The directory statements spill into ([`SessionOptions::spill_dir`]; checked when the
    /// session opens).
    pub fn with_spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }
    /// The most bytes one statement may spill ([`SessionOptions::max_spill_bytes`]; 0: never
    /// spill).
    pub fn with_max_spill_bytes(mut self, bytes: u64) -> Self {
        self.max_spill_bytes = bytes;
        self
    }
    /// The most bytes one value of a private table may take when it is read
    /// ([`SessionOptions::max_value_bytes`]; checked when the session opens).
    pub fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes;
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
#[non_exhaustive]
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
#[non_exhaustive]
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
