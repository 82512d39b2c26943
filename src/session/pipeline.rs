//! The one path every statement takes: the statements answered before parsing (`EXPLAIN
//! PRIVACY`, `SHOW BUDGET`, `SHOW TABLES`, `HELP`), parsing (with the BigQuery clause and named
//! arguments), planning, the guard, the physical plan of exactly the checked plan, admission (the
//! durable charge) and execution of that physical plan. A checked query the physical planner
//! cannot plan is refused before admission, with nothing charged ([`UNPLANNABLE`], round 49). The
//! server's bounded run ([`super::kind`]) shares its front and its physical planning. A failure
//! after admission is the one fixed message [`EXECUTION_FAILED`]; a panic anywhere,
//! [`STATEMENT_PANICKED`].
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{CopyToSource, DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::dialect::GenericDialect;

use super::limits::check_complexity;
use super::{ANALYST, PrivateSession, QueryResult, STATEMENT_L0};
use crate::accounting::{PrivacyUnit, Receipt, TableCharge};
use crate::error::refused;
use crate::guard::{self, DpCall};
use crate::statements::{self, named_args::resolve_named_arguments};

impl PrivateSession {
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

    pub(super) async fn sql_statement(&self, sql: &str) -> Result<QueryResult> {
        let one = |batch: datafusion::arrow::array::RecordBatch| {
            Ok(QueryResult::of(vec![batch.clone()], batch.schema()))
        };
        let sql = match front(sql)? {
            Front::ExplainPrivacy(rest) => return self.explain_privacy(rest).await,
            Front::ShowBudget => {
                // The next ε at this session's default δ (round 47, review "newuser2", A).
                let rows = self.accountant.served_budget_rows_at(self.default_delta());
                return one(statements::budget_batch(&rows)?);
            }
            Front::ShowTables => return one(statements::tables_batch(&self.policies())?),
            // `HELP [function]`: the DP aggregates' documentation (statements::help).
            Front::Help(name) => return one(statements::help::help_batch(name)?),
            Front::Sql(sql) => sql,
        };
        match self.parse(sql)? {
            DFStatement::CreateExternalTable(c) => self.create_external_table(c).await,
            DFStatement::Reset(_) => refused!("{}", super::ddl::RESET_REFUSED),
            stmt => {
                // One snapshot of the session's state serves the statement from planning to
                // execution: the plan that is checked is planned, and runs, under the same
                // settings and functions (and each snapshot copies the function registries),
                // in the statement's own memory pool and spill files (round 48).
                let state = self.statement_state()?;
                let plan = state.statement_to_plan(stmt).await?;
                self.run_plan(sql, &state, plan).await
            }
        }
    }

    pub(super) fn parse(&self, sql: &str) -> Result<DFStatement> {
        let clause = statements::bigquery::strip_dp_clause(sql)?;
        let sql = clause.as_ref().map_or(sql, |(s, _)| s.as_str());
        let mut stmts = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
        if stmts.len() != 1 {
            return plan_err!(
                "expected exactly one SQL statement, got {}; run statements one at a time",
                stmts.len()
            );
        }
        let mut stmt = stmts.pop_front().expect("one");
        refuse_describe_of_a_query(&stmt)?;
        // A SET DataFusion cannot plan gets dpfusion's SET refusal, not its debug dump (round 50).
        super::ddl::check_set_statement(&stmt)?;
        if let Some((_, c)) = &clause {
            self.apply_dp_clause(&mut stmt, c)?;
        }
        let delta = self.default_delta();
        resolve_df_statement(&mut stmt, delta).map_err(DataFusionError::Plan)?;
        super::limits::check_table_function_args(&stmt)?;
        super::limits::check_cte_uses(&stmt)?;
        Ok(stmt)
    }

    /// Plans and checks a query without running it or charging anything: the [`guard::CheckedPlan`]
    /// that would run (with the guard's rewrites, its joins' public sides settled) and the DP
    /// calls it would make.
    pub async fn check(&self, sql: &str) -> Result<guard::CheckedPlan> {
        let state = self
            .statement_state()
            .map_err(crate::error::Error::classify)?;
        let run = async { self.plan_query(&state, text(sql)?).await };
        STATEMENT_L0
            .scope(std::cell::Cell::new(None), run)
            .await
            .map_err(crate::error::Error::classify)
    }

    /// Plans and checks a query without running it.
    pub(super) async fn plan_query(
        &self,
        state: &SessionState,
        sql: &str,
    ) -> Result<guard::CheckedPlan> {
        let stmt = self.parse(sql)?;
        let plan = state.statement_to_plan(stmt).await?;
        self.check_policies(&plan)?;
        guard::check(state, &plan, self.guard_options()).await
    }

    /// Refuses a statement that reads a table whose ledger policy changed since this session
    /// registered it (another process recorded another: round 46), or a public table whose
    /// files the ledger now holds as a private table's, before the guard reads anything (a
    /// join's public side is read while the plan is checked). Admission checks the same tables
    /// again under the ledger's lock ([`Self::admit`]).
    pub(super) fn check_policies(&self, plan: &LogicalPlan) -> Result<()> {
        self.accountant
            .check_planned(&guard::checked::planned_policies(plan))
            .map_err(crate::error::Error::from_accounting)
    }

    /// Runs a planned statement: DDL, DML and other statements through [`Self::run_ddl`]
    /// (`ddl`), `DESCRIBE` from the pinned schema, `COPY` to a checked target, and every query
    /// through the guard and [`Self::execute_guarded`].
    pub(super) async fn run_plan(
        &self,
        sql: &str,
        state: &SessionState,
        plan: LogicalPlan,
    ) -> Result<QueryResult> {
        self.check_policies(&plan)?;
        match &plan {
            LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Statement(_) => {
                return self.run_ddl(sql, state, plan).await;
            }
            // `DESCRIBE t`: the table's columns from its (pinned) schema; no row is read and
            // nothing is charged, so it works for private tables too (issue 33).
            LogicalPlan::DescribeTable(d) => {
                let batch = statements::describe_batch(&d.schema)?;
                return Ok(QueryResult::of(vec![batch.clone()], batch.schema()));
            }
            LogicalPlan::Copy(c) => {
                if !c.partition_by.is_empty() {
                    return refused!(
                        "dpfusion refused the query: COPY ... PARTITIONED BY writes directories; \
                         write one file"
                    );
                }
                let target = crate::owner::copy_target(
                    &c.output_url,
                    &self.fs,
                    &self.protection,
                    &self.table_keys(),
                )?;
                let checked = guard::check_copy(state, c, target, self.guard_options()).await?;
                return self.execute_guarded(sql, state, checked).await;
            }
            _ => {}
        }
        if matches!(plan, LogicalPlan::Explain(_)) && guard::reads_private(&plan) {
            let t = guard::private_tables(&plan).join("', '");
            return Err(guard::explain_refusal(&t));
        }
        let checked = guard::check(state, &plan, self.guard_options()).await?;
        self.execute_guarded(sql, state, checked).await
    }

    /// Plans, admits (charges durably) and runs a checked plan, the only kind of plan a query
    /// runs as. Its physical plan is built first, from the checked plan under the statement's
    /// state ([`Self::planned`]): a plan the physical planner refuses is refused with nothing
    /// charged (round 49, review "physical" F2). Once a query that reads a private table is
    /// admitted, any error or panic of its execution reaches the analyst as the one fixed message
    /// [`EXECUTION_FAILED`]: it may depend on the data (docs/PRIVACY.md).
    pub(super) async fn execute_guarded(
        &self,
        sql: &str,
        state: &SessionState,
        checked: guard::CheckedPlan,
    ) -> Result<QueryResult> {
        // On a cluster, a plan that cannot cross Ballista's codec as checked is refused before
        // anything is charged (crate::distributed).
        #[cfg(feature = "distributed")]
        if self.options.cluster.is_some() {
            crate::distributed::admissible(&checked)?;
        }
        // The physical plan first, then the charge: only a plan that was built is admitted
        // (round 49, review "physical" F2). Planning reads no row ([`Self::physical_plan`]), so
        // a statement its budgets then refuse has read nothing either.
        let physical = self.planned(state, &checked).await?;
        let receipt = self.admit(sql, &checked)?;
        #[cfg(feature = "distributed")]
        if self.options.cluster.is_some() {
            crate::distributed::record_submitted(checked.plan())?;
        }
        let private = checked.reads_private();
        let schema = checked.schema();
        let run = datafusion::physical_plan::collect(physical, state.task_ctx());
        let batches = sanitise(private, run).await?;
        Ok(QueryResult {
            schema,
            batches,
            receipt,
            tables: checked.tables().to_vec(),
        })
    }

    /// [`Self::physical_plan`] of a query about to be admitted: built before admission (round
    /// 49, review "physical" F2: it was built after, so a placeholder left in the released
    /// columns, `SELECT dp_count(salary, 1.0) AS n, $1 AS p FROM salaries`, was charged and then
    /// failed). When the plan reads a private table, an error is the refusal [`UNPLANNABLE`],
    /// nothing charged: planning reads no private row (see [`Self::physical_plan`]), so the
    /// refusal depends on the query and the owner's tables, not on their rows; the planner's
    /// own message is not shown (it can name the owner's files). A public plan's error is
    /// DataFusion's, as before.
    async fn planned(
        &self,
        state: &SessionState,
        checked: &guard::CheckedPlan,
    ) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        match self.physical_plan(state, checked).await {
            Err(_) if checked.reads_private() => Err(crate::error::Error::refused(UNPLANNABLE)),
            planned => planned,
        }
    }

    /// The physical plan of exactly the checked plan: the one way a checked plan becomes
    /// executable (here and in the server's bounded run, [`super::kind`]). The literal
    /// parameters of the DP calls served by the exact-partials accumulator are then bound into
    /// their function instances ([`dpfusion_udfs::aggregates::bind`]): the same calls with the
    /// same literals, without DataFusion filling one array per parameter and batch; and the
    /// statement's cancellation flag (`CANCEL`, set by the server for the whole statement, so
    /// it is in scope here, before admission) into its model fits.
    ///
    /// It runs before admission ([`Self::planned`]) and reads no private row (round 49): the
    /// physical planner only calls each table's `scan`, and a private table's
    /// (`GuardedTable::scan`) lists its files and wraps its reader, with no filter and no limit
    /// (DataFusion's `ListingTable` reads no file footer or statistics, `collect_statistics`
    /// being off, and a CSV table's schema is pinned, never inferred); the reader is a sealed
    /// `PrivateScanExec` with no statistics and no ordering, and the physical optimizer's rules
    /// read plan properties and statistics, never rows. No plan is executed here: scalar
    /// subqueries run in `ScalarSubqueryExec` when the plan runs, and a Ballista plan is
    /// submitted to the cluster when it is executed. The rows of a join's public side were read
    /// while the plan was checked (public rows).
    pub(super) async fn physical_plan(
        &self,
        state: &SessionState,
        checked: &guard::CheckedPlan,
    ) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        // Over private rows, no physical rule may move an expression across the guard's
        // boundaries: DataFusion's `FilterPushdown` merges a filter written on released values
        // into the partition selection's filter (so it ran on groups not released: one private
        // row made `WHERE v0 > 0` over a string fail; fuzzer seed 4646, round 46) and pushes a
        // filter on group keys below the DP aggregate, into the private region, unwrapped.
        // The filters stay where the checked plan has them.
        // First of all, on the physical planner's plan, the sorts of released rows are pinned
        // (guard::release_order): DataFusion's `EnsureRequirements` removed the guard's sort of
        // a release under a window, an inner ORDER BY … LIMIT or an aggregate, which then saw
        // the groups in the order the private rows set (round 47, review "fuzzgaps" F1). After
        // DataFusion's rules, the path from the root to the sort that orders the output is kept
        // in that sort's one partition: a round-robin repartition under a computing projection
        // above it gave the rows in the order the threads finished (round 49, review "physical"
        // F1).
        let sealed;
        let state = if checked.reads_private() {
            let rules = guard::release_order::with_release_order(
                state
                    .physical_optimizers()
                    .iter()
                    .filter(|r| !r.name().starts_with("FilterPushdown"))
                    .cloned(),
            );
            sealed = datafusion::execution::SessionStateBuilder::new_from_existing(state.clone())
                .with_physical_optimizer_rules(rules)
                .build();
            &sealed
        } else {
            state
        };
        let mut plan = state
            .query_planner()
            .create_physical_plan(checked.plan(), state)
            .await?;
        if checked.reads_private() {
            // Locally `CompactOutput` did it (the last rule above); a cluster query's client
            // plan is planned by Ballista without the session's rules (round 51).
            plan = guard::release_order::compacted(plan)?;
        }
        let plan = dpfusion_udfs::aggregates::bind::bind_literal_parameters(plan)?;
        match super::CANCEL.try_with(Arc::clone) {
            Ok(token) => dpfusion_udfs::aggregates::bind::bind_cancellation(plan, &token),
            Err(_) => Ok(plan),
        }
    }

    /// Admission: one atomic, durable step in the accountant. Nothing runs before it returns.
    /// Every table the statement reads or charges must still have, in the ledger, the policy
    /// this session registered it with (checked under the lock; round 46), a join's public side
    /// too, which the checked plan holds as the rows it read before admission (its tables'
    /// policies were collected before: [`guard::CheckedPlan::policies`]; round 46, F6 of the
    /// review of its fixes).
    pub(super) fn admit(&self, sql: &str, checked: &guard::CheckedPlan) -> Result<Option<Receipt>> {
        let calls = checked.calls();
        let planned = checked.policies();
        let charges = charges_of(calls);
        if charges.is_empty() {
            self.accountant
                .check_planned(planned)
                .map_err(crate::error::Error::from_accounting)?;
            return Ok(None);
        }
        let analyst = ANALYST.try_with(Arc::clone).ok();
        let receipt = self
            .accountant
            .admit_planned(
                sql,
                &charges,
                &requests_of(calls),
                analyst.as_deref(),
                planned,
                self.default_delta(),
            )
            .map_err(crate::error::Error::from_accounting)?;
        *self.last_receipt.lock().expect("lock") = Some(receipt.clone());
        Ok(Some(receipt))
    }

    pub(super) async fn explain_privacy(&self, sql: &str) -> Result<QueryResult> {
        let checked = self.plan_query(&self.statement_state()?, sql).await?;
        let charges = charges_of(checked.calls());
        let preview = self
            .accountant
            .preview_at(&charges, self.default_delta())
            .map_err(crate::error::Error::from_accounting)?;
        let batch = statements::explain_privacy_batch(checked.calls(), &preview)?;
        let mut r = QueryResult::of(vec![batch.clone()], batch.schema());
        r.tables = checked.tables().to_vec();
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
    pub(super) fn apply_dp_clause(
        &self,
        stmt: &mut DFStatement,
        c: &statements::bigquery::DpClause,
    ) -> Result<()> {
        use datafusion::sql::sqlparser::ast::visit_relations;
        let refuse = |m: String| DataFusionError::from(statements::bigquery::refusal(m));
        let inner: &mut datafusion::sql::sqlparser::ast::Statement = match stmt {
            DFStatement::Statement(s) => s.as_mut(),
            DFStatement::Explain(e) => match e.statement.as_mut() {
                DFStatement::Statement(s) => s.as_mut(),
                _ => return Err(refuse("the clause opens a SELECT".into())),
            },
            _ => return Err(refuse("the clause opens a SELECT".into())),
        };
        let mut names: Vec<String> = Vec::new();
        // The table's name as DataFusion resolves it: the identifier's value, however quoted
        // (round 46: the printed name kept a backtick-quoted table out of the checks).
        let _ = visit_relations(&*inner, |r| {
            if let Some(last) = r.0.last().and_then(|p| p.as_ident()) {
                names.push(last.value.to_ascii_lowercase());
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
        Ok(statements::bigquery::rewrite_dp_select(inner, c)?)
    }
}

/// The one message of a failed execution of a query that reads a private table. It names no
/// value, no row and no error class: any of them could depend on the data.
pub const EXECUTION_FAILED: &str = "dpfusion: the query failed while it ran. Its charge stands (a \
failure can depend on the data, so it is not refunded), and the error is not shown because it \
could reveal private values. Check the query's types and functions against docs/SQL.md; a query \
that needs more memory than the data owner's memory_limit fails too: fewer groups or columns, or \
ask the owner.";

/// The refusal of a checked query that reads a private table and that the physical planner
/// could not plan (round 49): nothing was charged. It names no cause: the planner's message can
/// name the data owner's files.
pub(crate) const UNPLANNABLE: &str = "dpfusion refused the query: it passed the privacy checks, \
but it could not be planned for execution. Nothing was charged and no private row was read. The \
planner's error is not shown, as it can name the data owner's files. A common cause is a \
parameter ($1 or ?) left without a value: give every parameter a value, or write the value in \
the query. Otherwise simplify what the query computes from its DP results (docs/SQL.md).";

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

/// A statement's text, trimmed of blanks and a final `;`, within the limits
/// ([`check_complexity`]).
pub(super) fn text(sql: &str) -> Result<&str> {
    let trimmed = sql.trim().trim_end_matches(';').trim();
    check_complexity(trimmed)?;
    Ok(trimmed)
}

/// What answers a statement: dpfusion itself, before any parsing, or the planner.
pub(super) enum Front<'a> {
    /// `EXPLAIN PRIVACY <query>`.
    ExplainPrivacy(&'a str),
    /// `SHOW BUDGET`.
    ShowBudget,
    /// `SHOW TABLES`.
    ShowTables,
    /// `HELP [function]`.
    Help(&'a str),
    /// Anything else: SQL to parse and plan (trimmed).
    Sql(&'a str),
}

/// The front of every statement ([`PrivateSession::sql`], [`PrivateSession::statement_kind`]):
/// its text within the limits, and what answers it.
pub(super) fn front(sql: &str) -> Result<Front<'_>> {
    let trimmed = text(sql)?;
    let whole = |words: &[&str]| strip_prefix_ci(trimmed, words).is_some_and(|r| r.is_empty());
    Ok(
        if let Some(rest) = strip_prefix_ci(trimmed, &["EXPLAIN", "PRIVACY"]) {
            Front::ExplainPrivacy(rest)
        } else if whole(&["SHOW", "BUDGET"]) {
            Front::ShowBudget
        } else if whole(&["SHOW", "TABLES"]) {
            Front::ShowTables
        } else if let Some(name) = strip_prefix_ci(trimmed, &["HELP"]) {
            Front::Help(name)
        } else {
            Front::Sql(trimmed)
        },
    )
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

/// Default-deny for `DESCRIBE` (round 47, owner review F2): only `DESCRIBE <table>` (sqlparser's
/// `ExplainTable`, the table's pinned schema) is answered. DataFusion would plan `DESCRIBE
/// <query>` (`Explain` with a DESCRIBE alias) into the same `DescribeTable` node, with the
/// query's result schema, and no guard sees that plan; it is refused here, before planning, so
/// the local session, `EXPLAIN PRIVACY` and the server's statement kinds all refuse it.
fn refuse_describe_of_a_query(stmt: &DFStatement) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{DescribeAlias, Statement};
    let s = match stmt {
        DFStatement::Statement(s) => s.as_ref(),
        DFStatement::Explain(e) => return refuse_describe_of_a_query(&e.statement),
        _ => return Ok(()),
    };
    match s {
        Statement::Explain {
            describe_alias: DescribeAlias::Describe | DescribeAlias::Desc,
            ..
        } => refused!(
            "dpfusion refused the query: DESCRIBE takes a table name (`DESCRIBE salaries`, or \
             `\\d salaries` in the REPL), not a query; describe the tables the query reads"
        ),
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

    /// Review r45: the server's time limit answered the client, but a model fit (one synchronous
    /// `evaluate`, sized by the analyst's literals) kept its thread until it ended. Under a
    /// statement's cancellation flag, set here after 300 ms, the fit stops at its next
    /// iteration: the statement ends with the fixed message, long before the fit would have.
    #[cfg(feature = "serve")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statements_flag_stops_its_model_fit() {
        let dir = crate::testdir::test_dir("cancel-fit");
        let s = PrivateSession::open(
            crate::SessionOptions::default()
                .with_ledger(dir.join("ledger.jsonl"))
                .with_default_budget(1e6, 1e-3),
        )
        .await
        .unwrap();
        let people = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/people.csv");
        let rdp = crate::accounting::FilterKind::Rdp { order: None };
        s.register_csv("people", people, crate::Registration::private().filter(rdp))
            .await
            .unwrap();
        let token = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&token);
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let started = std::time::Instant::now();
        let r = super::super::with_cancel(
            token,
            s.sql(
                "SELECT dp_mlp_sgd(CASE WHEN remote THEN 1 ELSE 0 END, [age, salary], 100.0, \
                 1e-6, hidden => 2048, sample_rate => 1, steps => 100000) FROM people",
            ),
        )
        .await;
        let e = r.expect_err("stopped").to_string();
        assert!(e.contains(crate::session::EXECUTION_FAILED), "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
    }

    /// Review r45: the physical optimizer pushed a WHERE on a bare boolean column into a private
    /// Parquet reader (row-group pruning: one row made a query take twice as long), and a join's
    /// dynamic filter into the other side's reader. A private scan is now a sealed leaf: no
    /// predicate and no dynamic filter reaches it, while the public table's reader still gets
    /// its filter.
    #[tokio::test]
    async fn no_predicate_or_dynamic_filter_reaches_a_private_reader() {
        use datafusion::physical_plan::displayable;
        let dir = crate::testdir::test_dir("sealed-scan");
        let file = dir.join("t.parquet");
        let plain = datafusion::prelude::SessionContext::new();
        plain
            .sql(&format!(
                "COPY (SELECT CAST(value AS BIGINT) AS id, value % 7 = 0 AS flag, \
                 CAST(value AS DOUBLE) AS s FROM range(1000)) TO '{}' STORED AS PARQUET",
                file.display()
            ))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let public = dir.join("p.parquet");
        std::fs::copy(&file, &public).unwrap();
        let s = PrivateSession::open(
            crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
        )
        .await
        .unwrap();
        s.register_parquet("t", &file, crate::Registration::private())
            .await
            .unwrap();
        s.register_parquet("p", &public, crate::Registration::public())
            .await
            .unwrap();
        let state = s.ctx.state();
        for sql in [
            "SELECT dp_count(s, 1.0) FROM t WHERE flag",
            "SELECT dp_count(t.s, 1.0) FROM t JOIN (VALUES (5)) v(k) ON t.id = v.k",
            "SELECT dp_count(t.s, 1.0) FROM t JOIN p ON t.id = p.id WHERE p.flag",
        ] {
            let checked = s.plan_query(&state, sql).await.unwrap();
            let physical = s.physical_plan(&state, &checked).await.unwrap();
            let text = displayable(physical.as_ref()).indent(true).to_string();
            let private: Vec<&str> = text.lines().filter(|l| l.contains("t.parquet")).collect();
            assert_eq!(private.len(), 1, "{sql}\n{text}");
            assert!(private[0].contains("PrivateScanExec"), "{sql}\n{text}");
            assert!(
                !private[0].contains("predicate") && !private[0].contains("DynamicFilter"),
                "{sql}\n{text}"
            );
        }
        let options = state.config().options();
        assert!(!options.optimizer.enable_join_dynamic_filter_pushdown);
        // A filter on released values is not merged into the partition selection's filter
        // (round 46). (`r.flag`, a filter on a key, is pushed below the aggregate by the
        // logical optimizer, before the guard, which checks it there.)
        let checked = s
            .plan_query(
                &state,
                "SELECT * FROM (SELECT flag, CASE WHEN dp_count(s, epsilon => 0.1) > 0 THEN \
                 'big' END v0 FROM t GROUP BY flag) r WHERE r.v0 > 0 AND r.flag",
            )
            .await
            .unwrap();
        let physical = s.physical_plan(&state, &checked).await.unwrap();
        let text = displayable(physical.as_ref()).indent(true).to_string();
        for line in text.lines().filter(|l| l.contains("FilterExec")) {
            assert!(
                !(line.contains("__dpfusion_partition_select") && line.contains("AND")),
                "{text}"
            );
        }

        assert!(!options.optimizer.enable_topk_dynamic_filter_pushdown);
        assert!(!options.optimizer.enable_aggregate_dynamic_filter_pushdown);
    }

    /// Round 49 (review "physical" F1): the review's shape, a projection that computes over
    /// the query's own ORDER BY of a release beside 200,000 rows, at 16 partitions. DataFusion
    /// put a round-robin repartition under the projection, and the root had 16 partitions,
    /// merged in the order the threads finished; the session's rules keep it in one.
    #[tokio::test]
    async fn an_ordered_release_is_one_partition_at_the_root_of_the_sessions_plan() {
        use datafusion::physical_plan::{ExecutionPlanProperties, displayable};
        let dir = crate::testdir::test_dir("ordered-root");
        let people = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/people.csv");
        let s = PrivateSession::open(
            crate::SessionOptions::default()
                .with_ledger(dir.join("ledger.jsonl"))
                .with_target_partitions(16),
        )
        .await
        .unwrap();
        s.register_csv("people", people, crate::Registration::private())
            .await
            .unwrap();
        let sql = "SELECT n, value * 2 AS w, upper(lower(concat(CAST(value AS VARCHAR), 'abc'))) \
                   AS h FROM (SELECT r.n, v.value FROM (SELECT dp_count(salary, 0.001) AS n \
                   FROM people) r CROSS JOIN range(200000) v ORDER BY v.value) s";
        let state = s.statement_state().unwrap();
        let checked = s.plan_query(&state, sql).await.unwrap();
        let physical = s.physical_plan(&state, &checked).await.unwrap();
        let text = displayable(physical.as_ref()).indent(true).to_string();
        assert_eq!(
            physical.output_partitioning().partition_count(),
            1,
            "{text}"
        );
        assert!(text.contains("PinnedSortExec"), "{text}");
        assert!(s.ledger().unwrap().is_empty(), "planned, not run");
    }

    /// Round 46, F6 of the review of its fixes: a join's public side is run and replaced by its
    /// rows while the plan is checked, before admission; another process that made its table
    /// private in between was not seen at admission (only the settled rows were in the plan).
    /// The checked plan carries the policies read before the settlement, and admission refuses.
    #[tokio::test]
    async fn a_joins_settled_public_side_is_checked_again_at_admission() {
        let dir = crate::testdir::test_dir("settled-policy");
        let people = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/people.csv");
        let depts = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/depts.csv");
        let open = || {
            PrivateSession::open(
                crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
            )
        };
        let (a, b) = (open().await.unwrap(), open().await.unwrap());
        a.register_csv("people", people, crate::Registration::private())
            .await
            .unwrap();
        a.register_csv("depts", depts, crate::Registration::public())
            .await
            .unwrap();
        let sql = "SELECT dp_count(p.salary, 0.5) AS n FROM people p JOIN depts d \
                   ON p.dept = d.dept";
        let state = a.ctx.state();
        let checked = a.plan_query(&state, sql).await.unwrap();
        assert!(
            checked
                .policies()
                .iter()
                .any(|p| p.name == "depts" && p.visibility == crate::accounting::Visibility::Public),
            "{:?}",
            checked.policies()
        );
        // Between the check and admission, the other process makes depts private.
        b.register_csv("depts", depts, crate::Registration::private())
            .await
            .unwrap();
        let e = a
            .execute_guarded(sql, &state, checked)
            .await
            .expect_err("depts is private now");
        assert!(e.to_string().contains("visibility public → private"), "{e}");
        assert!(a.ledger().unwrap().is_empty(), "nothing charged");
    }

    /// Round 46, F2 of the review of its fixes: one key read under two names, each with the
    /// policy it was planned with; the stale one is seen whichever the plan visits first (only
    /// the first policy per key was kept, so a row-level count beside a unit one was charged
    /// under the unit policy). Two such names cannot be registered in one session any more
    /// (`register_table_beside`): here the second is installed as a stale one would be.
    #[tokio::test]
    async fn every_policy_a_statement_reads_is_checked_not_the_first_per_key() {
        let dir = crate::testdir::test_dir("two-policies");
        let people = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/people.csv");
        let s = PrivateSession::open(
            crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
        )
        .await
        .unwrap();
        s.register_csv("t1", people, crate::Registration::private())
            .await
            .unwrap();
        // t2: the same provider and key under a unit policy the ledger does not hold.
        let t1 = s.tables.lock().expect("lock").get("t1").cloned().unwrap();
        let stale = crate::accounting::TablePolicy {
            name: "t2".into(),
            unit: Some(crate::accounting::PrivacyUnit::new("id", "t")),
            ..t1.policy().cloned().unwrap()
        };
        let mut info = t1.info().clone();
        info.name = "t2".into();
        let t2 = guard::GuardedTable::new(Arc::clone(t1.inner()), info).with_policy(stale);
        s.ctx.register_table("t2", Arc::new(t2)).unwrap();
        for sql in [
            "SELECT (SELECT dp_count(salary, 0.5) FROM t1) AS a, \
             (SELECT dp_count(salary, 0.5) FROM t2) AS b",
            "SELECT (SELECT dp_count(salary, 0.5) FROM t2) AS a, \
             (SELECT dp_count(salary, 0.5) FROM t1) AS b",
        ] {
            let e = s.sql(sql).await.expect_err(sql);
            assert!(e.to_string().contains("policy of table 't2'"), "{sql}: {e}");
        }
        assert!(s.ledger().unwrap().is_empty(), "nothing charged");
    }
}
