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
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionConfig};
use datafusion::sql::parser::{CopyToSource, DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::Value;
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::accounting::{
    Accountant, Budget, BudgetRow, LedgerEntry, Neighbours, Receipt, TableCharge, TableKey,
    TablePolicy, Visibility,
};
use crate::guard::{self, DpCall, GuardedTable, TableInfo};
use crate::statements::{self, named_args::resolve_named_arguments};

/// The default `delta` of a DP call that gives none (SQL.md: 1e-7 unless changed).
pub const DEFAULT_CALL_DELTA: f64 = 1e-7;

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
    /// Run queries on this Ballista cluster instead of in this process (feature `distributed`;
    /// the guard, accountant and ledger stay here). See `crate::distributed`.
    #[cfg(feature = "distributed")]
    pub cluster: Option<crate::distributed::Cluster>,
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
            #[cfg(feature = "distributed")]
            cluster: None,
        }
    }
}

impl SessionOptions {
    pub fn with_ledger(mut self, path: impl Into<PathBuf>) -> Self {
        self.ledger_path = path.into();
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
}

/// How a table is registered: private (the default) or public, its neighbour relation, its
/// public columns and its budget.
#[derive(Debug, Clone)]
pub struct Registration {
    pub visibility: Visibility,
    pub neighbours: Neighbours,
    pub public_columns: Vec<String>,
    pub budget: Option<Budget>,
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
        self.public_columns = cols
            .into_iter()
            .map(|c| c.into().trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        self
    }
    pub fn budget(mut self, epsilon: f64, delta: f64) -> Self {
        self.budget = Some(Budget { epsilon, delta });
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
    tables: Mutex<HashMap<String, Arc<GuardedTable>>>,
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
        crate::accounting::check_budget(&options.default_budget)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let accountant = Arc::new(Accountant::open(&options.ledger_path).map_err(external)?);
        let mut config = SessionConfig::new().with_information_schema(false);
        if let Some(n) = options.target_partitions {
            config = config.with_target_partitions(n);
        }
        #[cfg(feature = "distributed")]
        let ctx = match &options.cluster {
            Some(cluster) => crate::distributed::connect(cluster, config).await?,
            None => SessionContext::new_with_config(config),
        };
        #[cfg(not(feature = "distributed"))]
        let ctx = SessionContext::new_with_config(config);
        dpfusion_udfs::register_all(&ctx);
        let session = Self {
            ctx,
            accountant,
            default_delta: RwLock::new(options.default_delta),
            options,
            tables: Mutex::new(HashMap::new()),
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

    /// Registers a CSV file (with a header line) as a table.
    pub async fn register_csv(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        let path = path.as_ref();
        let tmp = SessionContext::new();
        tmp.register_csv(name, &path.to_string_lossy(), CsvReadOptions::new())
            .await?;
        let provider = tmp.table_provider(name).await?;
        self.register_provider(name, provider, file_key(&path.to_string_lossy()), reg)
    }

    /// Registers a Parquet file or directory as a table.
    pub async fn register_parquet(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        let path = path.as_ref();
        let tmp = SessionContext::new();
        tmp.register_parquet(name, &path.to_string_lossy(), ParquetReadOptions::default())
            .await?;
        let provider = tmp.table_provider(name).await?;
        self.register_provider(name, provider, file_key(&path.to_string_lossy()), reg)
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

    /// Registers any provider under `key` (its identity in the ledger).
    pub fn register_provider(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
    ) -> Result<TablePolicy> {
        let name = name.to_ascii_lowercase();
        let schema = provider.schema();
        for c in &reg.public_columns {
            if schema
                .fields()
                .iter()
                .all(|f| f.name().to_ascii_lowercase() != *c)
            {
                return plan_err!(
                    "public column '{c}' is not a column of table '{name}' (columns: {})",
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        let policy = TablePolicy {
            key: key.clone(),
            name: name.clone(),
            visibility: reg.visibility,
            neighbours: reg.neighbours,
            public_columns: reg.public_columns.clone(),
            budget: reg.budget.unwrap_or(self.options.default_budget),
        };
        crate::accounting::check_budget(&policy.budget)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let policy = self
            .accountant
            .register_table(policy)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let info = TableInfo {
            name: name.clone(),
            key,
            private: policy.visibility == Visibility::Private,
            neighbours: policy.neighbours,
            public_columns: policy.public_columns.clone(),
        };
        let guarded = Arc::new(GuardedTable::new(provider, info));
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

    /// Per private table: budget, spent, remaining, number of charged queries.
    pub fn budget(&self) -> Vec<BudgetRow> {
        self.accountant.budget_rows()
    }

    /// Every charge, oldest first.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.accountant.ledger_entries()
    }

    /// Runs one SQL statement.
    pub async fn sql(&self, sql: &str) -> Result<QueryResult> {
        let trimmed = sql.trim().trim_end_matches(';').trim();
        if let Some(rest) = strip_prefix_ci(trimmed, &["EXPLAIN", "PRIVACY"]) {
            return self.explain_privacy(rest).await;
        }
        if strip_prefix_ci(trimmed, &["SHOW", "BUDGET"]).is_some_and(|r| r.is_empty()) {
            let batch = statements::budget_batch(&self.accountant.budget_rows())?;
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
        let mut stmts = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
        if stmts.len() != 1 {
            return plan_err!(
                "expected exactly one SQL statement, got {}; run statements one at a time",
                stmts.len()
            );
        }
        let mut stmt = stmts.pop_front().expect("one");
        let delta = self.default_delta();
        resolve_df_statement(&mut stmt, delta).map_err(DataFusionError::Plan)?;
        Ok(stmt)
    }

    /// Plans (and optimizes and guards) a query without running it.
    async fn plan_query(&self, sql: &str) -> Result<(guard::Guarded, SchemaRef)> {
        let stmt = self.parse(sql)?;
        let plan = self.ctx.state().statement_to_plan(stmt).await?;
        let state = self.ctx.state();
        let optimized = state.optimize(&plan)?;
        let schema: SchemaRef = Arc::new(optimized.schema().as_arrow().clone());
        Ok((guard::guard(optimized)?, schema))
    }

    async fn run_plan(&self, sql: &str, plan: LogicalPlan) -> Result<QueryResult> {
        match &plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) => {
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
            _ => {}
        }
        let explain_only = matches!(plan, LogicalPlan::Explain(_));
        let state = self.ctx.state();
        let optimized = state.optimize(&plan)?;
        let guarded = guard::guard(optimized)?;
        let receipt = if explain_only {
            None
        } else {
            self.admit(sql, &guarded.calls)?
        };
        let tables = tables_of(&guarded.calls);
        let schema: SchemaRef = Arc::new(guarded.plan.schema().as_arrow().clone());
        let physical = state
            .query_planner()
            .create_physical_plan(&guarded.plan, &state)
            .await?;
        let batches = datafusion::physical_plan::collect(physical, self.ctx.task_ctx()).await?;
        Ok(QueryResult {
            schema,
            batches,
            receipt,
            tables,
        })
    }

    /// Admission: one atomic, durable step in the accountant. Nothing runs before it returns.
    fn admit(&self, sql: &str, calls: &[DpCall]) -> Result<Option<Receipt>> {
        let charges = charges_of(calls);
        if charges.is_empty() {
            return Ok(None);
        }
        let receipt = self
            .accountant
            .admit(sql, &charges)
            .map_err(|e| DataFusionError::Plan(format!("dpfusion refused the query: {e}")))?;
        Ok(Some(receipt))
    }

    async fn explain_privacy(&self, sql: &str) -> Result<QueryResult> {
        let (guarded, _) = self.plan_query(sql).await?;
        let charges = charges_of(&guarded.calls);
        let preview = self
            .accountant
            .preview(&charges)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let batch = statements::explain_privacy_batch(&guarded.calls, &preview)?;
        let mut r = QueryResult::of(vec![batch.clone()], batch.schema());
        r.tables = tables_of(&guarded.calls);
        Ok(r)
    }

    async fn create_table_as(
        &self,
        sql: &str,
        name: &str,
        input: &LogicalPlan,
    ) -> Result<QueryResult> {
        let state = self.ctx.state();
        let optimized = state.optimize(input)?;
        let guarded = guard::guard(optimized)?;
        let receipt = self.admit(sql, &guarded.calls)?;
        let physical = state
            .query_planner()
            .create_physical_plan(&guarded.plan, &state)
            .await?;
        let schema = physical.schema();
        let batches = datafusion::physical_plan::collect(physical, self.ctx.task_ctx()).await?;
        let provider = Arc::new(MemTable::try_new(schema, vec![batches])?);
        // The result of a DP query is public (post-processing).
        self.register_provider(
            name,
            provider,
            TableKey::from(format!("result:{}", name.to_ascii_lowercase())),
            Registration::public(),
        )?;
        let mut r = QueryResult::empty();
        r.receipt = receipt;
        r.tables = tables_of(&guarded.calls);
        Ok(r)
    }

    fn statement(&self, s: &datafusion::logical_expr::Statement) -> Result<QueryResult> {
        use datafusion::logical_expr::Statement as S;
        if let S::SetVariable(v) = s {
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
                "dpfusion refused the query: SET {} is not allowed; the only setting is \
                 dpfusion.default_delta",
                v.variable
            );
        }
        plan_err!("dpfusion refused the query: {} is not allowed", s.name())
    }

    async fn create_external_table(
        &self,
        mut c: datafusion::sql::parser::CreateExternalTable,
    ) -> Result<QueryResult> {
        let mut reg = Registration::private();
        let mut rest = Vec::new();
        for (k, v) in std::mem::take(&mut c.options) {
            let key = k.to_ascii_lowercase();
            let text = option_text(&v);
            match key.as_str() {
                "dp.visibility" => {
                    reg.visibility = match text.to_ascii_lowercase().as_str() {
                        "private" => Visibility::Private,
                        "public" => Visibility::Public,
                        other => {
                            return plan_err!(
                                "option 'dp.visibility' must be 'private' or 'public', got '{other}'"
                            );
                        }
                    }
                }
                "dp.neighbours" | "dp.neighbors" => {
                    reg.neighbours = match text.to_ascii_lowercase().as_str() {
                        "add_remove" => Neighbours::AddRemove,
                        "replace" => Neighbours::Replace,
                        other => {
                            return plan_err!(
                                "option 'dp.neighbours' must be 'add_remove' or 'replace', got '{other}'"
                            );
                        }
                    }
                }
                "dp.public_columns" => {
                    reg = reg.public_columns(text.split(','));
                }
                "dp.epsilon" | "dp.delta" => {
                    let x: f64 = text.parse().map_err(|_| {
                        DataFusionError::Plan(format!(
                            "option '{key}' must be a number, got '{text}'"
                        ))
                    })?;
                    let b = reg.budget.get_or_insert(self.options.default_budget);
                    if key == "dp.epsilon" {
                        b.epsilon = x;
                    } else {
                        b.delta = x;
                    }
                }
                k if k.starts_with("dp.") => {
                    return plan_err!(
                        "unknown option '{k}'; dpfusion options are dp.visibility, dp.neighbours, \
                         dp.public_columns, dp.epsilon, dp.delta"
                    );
                }
                _ => rest.push((k, v)),
            }
        }
        c.options = rest;
        let name = c.name.to_string();
        let location = c.locations.first().cloned().unwrap_or_default();
        let tmp = SessionContext::new();
        let plan = tmp
            .state()
            .statement_to_plan(DFStatement::CreateExternalTable(c))
            .await?;
        tmp.execute_logical_plan(plan).await?;
        let provider = tmp.table_provider(name.as_str()).await?;
        let policy = self.register_provider(&name, provider, file_key(&location), reg)?;
        let batch = statements::registration_batch(&policy)?;
        Ok(QueryResult::of(vec![batch.clone()], batch.schema()))
    }
}

fn option_text(v: &Value) -> String {
    match v {
        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
        Value::Number(n, _) => n.to_string(),
        Value::Boolean(b) => b.to_string(),
        other => other.to_string().trim_matches('\'').to_string(),
    }
}

/// The ledger identity of a file or directory: its canonical absolute path.
pub fn file_key(location: &str) -> TableKey {
    let p = Path::new(location);
    let canon = std::fs::canonicalize(p)
        .map(|c| c.to_string_lossy().to_string())
        .unwrap_or_else(|_| location.to_string());
    TableKey::from(canon)
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
    match stmt {
        DFStatement::Statement(s) => resolve_named_arguments(s.as_mut(), delta),
        DFStatement::Explain(e) => resolve_df_statement(&mut e.statement, delta),
        DFStatement::CopyTo(c) => match &mut c.source {
            CopyToSource::Query(q) => resolve_named_arguments(q.as_mut(), delta),
            CopyToSource::Relation(_) => Ok(()),
        },
        _ => Ok(()),
    }
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

fn tables_of(calls: &[DpCall]) -> Vec<String> {
    let mut v: Vec<String> = calls.iter().map(|c| c.table.name.clone()).collect();
    v.sort();
    v.dedup();
    v
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<PrivateSession>();
}
