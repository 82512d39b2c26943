//! [`CheckedPlan`]: the only plan dpfusion executes (issue 26, "check the plan that runs, not the
//! plan that was written"; docs/PRIVACY.md, "Where the checked plan is built").
//!
//! [`check`] (and [`check_copy`] for `COPY … TO`) is its only constructor. It takes the plan as
//! the SQL planner made it and does, in this order, everything that happens to it before it runs:
//!
//! 1. the optimizer (DataFusion's rules, with the session's settings);
//! 2. the guard's walk and rewrites ([`super::visit`]: the fragment, total evaluation, neighbour
//!    modes, partition selection, unit bounding, the DP calls and their costs);
//! 3. the final audit ([`audit`], below) of the guard's plan, so that a query it refuses runs
//!    nothing at all; then the settlement of the public sides of joins ([`settle`]): each is run
//!    only after this module has checked that it, and the join keys evaluated on it, read no
//!    private table (their subqueries included), so nothing of the analyst's runs before
//!    admission unless it is public work, and its errors (and a duplicated key's value) are
//!    public;
//! 4. the final audit ([`audit`]) again, on the settled plan: an independent walk over exactly the
//!    plan that will run, every node's every expression and every subquery.
//!
//! Only if all of them pass is a `CheckedPlan` made. Its fields are private and it has no method
//! that changes them, so no code after the check can rewrite the plan: execution (local, on a
//! Ballista cluster, `EXPLAIN PRIVACY`'s dry run, the server) takes a `CheckedPlan` and reads it.
//!
//! ```compile_fail,E0451
//! // A CheckedPlan cannot be built outside the guard: its fields are private.
//! use dpfusion::datafusion::logical_expr::LogicalPlan;
//! fn forge(plan: LogicalPlan) -> dpfusion::guard::CheckedPlan {
//!     dpfusion::guard::CheckedPlan {
//!         plan, calls: vec![], tables: vec![], private: false, read: vec![],
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0616
//! // Nor changed after the check: there is no mutable access to its plan.
//! use dpfusion::datafusion::logical_expr::LogicalPlan;
//! fn rewrite(checked: &mut dpfusion::guard::CheckedPlan, other: LogicalPlan) {
//!     checked.plan = other;
//! }
//! ```
//!
//! ```
//! // What the rest of the crate can do: read it.
//! use dpfusion::datafusion::logical_expr::LogicalPlan;
//! fn read(checked: &dpfusion::guard::CheckedPlan) -> (&LogicalPlan, usize) {
//!     (checked.plan(), checked.calls().len())
//! }
//! ```
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DataFusionError, Result};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::SessionState;
use datafusion::logical_expr::dml::CopyTo;
use datafusion::logical_expr::{
    Aggregate, Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Projection, col, lit,
};

use super::fragment::Bytes;
use super::join::PublicSide;
use super::table::{GuardedTable, TableInfo};
use super::units::{
    GROUP_KEY_FN, GroupKey, KEPT, NO_UNIT, SAMPLE, SAMPLE_FN, Sample, TOP_GROUPS_FN, TOTAL,
    TOTAL_FN, TopGroups, UNIT, UnitTotal,
};
use super::{
    DpCall, GuardOptions, PARTITION_SELECT, aggregate_function, any_private_table, construct_name,
    explain_refusal, fragment, is_dp_aggregate, is_dp_function, is_statement_node,
    raw_private_table, refuse, table_info, total, unknown_table,
};

/// A plan the guard checked, with the DP calls it makes: the only thing dpfusion executes. Built
/// only by [`check`] and [`check_copy`], from the final plan after every rewrite; read-only.
#[derive(Debug)]
pub struct CheckedPlan {
    plan: LogicalPlan,
    calls: Vec<DpCall>,
    /// The private tables charged (sorted, without duplicates).
    tables: Vec<String>,
    /// Does the plan read a private table (then any failure after admission is the one fixed
    /// message)?
    private: bool,
    /// The policies of the registered tables the statement reads ([`planned_policies`]),
    /// collected before its joins' public sides were settled (run and replaced by rows): what
    /// admission checks under the ledger's lock (round 46, F6 of the review of its fixes).
    read: Vec<crate::accounting::TablePolicy>,
}

impl CheckedPlan {
    /// The plan that runs, exactly as it was audited.
    pub fn plan(&self) -> &LogicalPlan {
        &self.plan
    }

    /// The DP releases it makes, with their costs (what admission charges).
    pub fn calls(&self) -> &[DpCall] {
        &self.calls
    }

    /// The private tables it charges, sorted.
    pub fn tables(&self) -> &[String] {
        &self.tables
    }

    /// Does it read a private table (through its DP calls)?
    pub fn reads_private(&self) -> bool {
        self.private
    }

    /// The policies the registered tables it reads were planned under, a join's settled public
    /// side included.
    pub fn policies(&self) -> &[crate::accounting::TablePolicy] {
        &self.read
    }

    /// The schema of its result.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.plan.schema().as_arrow().clone())
    }

    /// `written`: the plan as the SQL planner made it, before the optimizer and the settlement.
    fn new(plan: LogicalPlan, calls: Vec<DpCall>, written: &LogicalPlan) -> Self {
        let mut tables: Vec<String> = calls.iter().map(|c| c.table.name.clone()).collect();
        tables.sort();
        tables.dedup();
        let private = !calls.is_empty() || any_private_table(&plan).is_some();
        let read = planned_policies(written);
        Self {
            plan,
            calls,
            tables,
            private,
            read,
        }
    }
}

/// Every distinct policy (the same key may be read under several names, each with the policy
/// it was registered with) of the registered tables `plan` reads, subqueries included: what the
/// session planned the statement under (round 46).
pub fn planned_policies(plan: &LogicalPlan) -> Vec<crate::accounting::TablePolicy> {
    use datafusion::catalog::default_table_source::source_as_provider;
    let mut out: Vec<crate::accounting::TablePolicy> = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(provider) = source_as_provider(&scan.source)
            && let Some(p) = provider
                .downcast_ref::<GuardedTable>()
                .and_then(GuardedTable::policy)
            && !out.contains(p)
        {
            out.push(p.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// Checks `plan` (as the SQL planner made it): optimizes it, guards and rewrites it, settles the
/// public sides of its joins, audits the result; the checked plan, or why it is refused. Nothing
/// of the analyst's runs here except the public sides of joins, each after it was checked public.
pub async fn check(
    state: &SessionState,
    plan: &LogicalPlan,
    opts: GuardOptions,
) -> Result<CheckedPlan> {
    let (checked, calls) = check_query(state, plan, opts).await?;
    Ok(CheckedPlan::new(checked, calls, plan))
}

/// [`check`] for `COPY (query) TO target`: the query is checked as any other, then written to
/// `target`, the file the session validated in the data owner's output directory (never the
/// analyst's URL).
pub async fn check_copy(
    state: &SessionState,
    copy: &CopyTo,
    target: String,
    opts: GuardOptions,
) -> Result<CheckedPlan> {
    if !copy.partition_by.is_empty() {
        return Err(refuse(
            "COPY ... PARTITIONED BY writes directories; write one file",
        ));
    }
    let (input, calls) = check_query(state, &copy.input, opts).await?;
    let plan = LogicalPlan::Copy(CopyTo {
        input: Arc::new(input),
        output_url: target,
        partition_by: vec![],
        file_type: copy.file_type.clone(),
        options: copy.options.clone(),
        output_schema: copy.output_schema.clone(),
    });
    Ok(CheckedPlan::new(plan, calls, &copy.input))
}

async fn check_query(
    state: &SessionState,
    plan: &LogicalPlan,
    opts: GuardOptions,
) -> Result<(LogicalPlan, Vec<DpCall>)> {
    refuse_reserved_names(plan)?;
    crate::session::limits::check_calibrations(plan)?;
    // On the plan as written, before type coercion hides what was written, and before the
    // optimizer evaluates constants (allocating them in full).
    super::fragment::check_written_sizes(plan)?;
    super::fragment::check_feature_lists(plan)?;
    // Every call outside the private fragment bounded by what it writes (sized.rs), before the
    // optimizer evaluates constant calls.
    let budget = super::sized::budget(state.runtime_env().memory_pool.memory_limit());
    let plan = super::sized::wrap(plan.clone(), budget)?;
    let optimized = state.optimize(&plan)?;
    let dropped = dp_call_count(&plan).saturating_sub(dp_call_count(&optimized));
    let guarded = super::guard_with(optimized, opts).map_err(|e| dropped_calls(e, dropped))?;
    // Audited before the public sides run too, so a refused query runs nothing at all.
    audit(&guarded.plan, &opts)?;
    let plan = settle(state, guarded.plan, &guarded.public_sides).await?;
    audit(&plan, &opts)?;
    Ok((plan, guarded.calls))
}

/// The prefix of the names of the columns, tables and aliases the guard and the session add to
/// a plan (`__dpfusion_unit`, `__dpfusion_partition_select`, `__dpfusion_public_0`, …).
pub const RESERVED_PREFIX: &str = "__dpfusion_";

/// Is `name` reserved ([`RESERVED_PREFIX`], in any case)?
pub fn is_reserved(name: &str) -> bool {
    name.get(..RESERVED_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
}

/// Refuses a query as written that names a column, alias, table or subquery with the
/// [`RESERVED_PREFIX`] (round 51, review "names" F3: an analyst's alias beside a column the
/// guard adds failed with DataFusion's "ambiguous" error naming the guard's columns). Owners'
/// tables and columns cannot have such names (`session::register`), so only the analyst's own
/// names are refused here, before anything is planned further.
fn refuse_reserved_names(plan: &LogicalPlan) -> Result<()> {
    let mut found: Option<String> = None;
    let mut note = |name: &str| {
        if found.is_none() && is_reserved(name) {
            found = Some(name.to_string());
        }
    };
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::SubqueryAlias(a) => note(a.alias.table()),
            LogicalPlan::TableScan(t) => note(t.table_name.table()),
            _ => {}
        }
        node.apply_expressions(|e| {
            e.apply(|x| {
                match x {
                    Expr::Alias(a) => note(&a.name),
                    Expr::Column(c) => {
                        note(&c.name);
                        if let Some(r) = &c.relation {
                            note(r.table());
                        }
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        for f in node.schema().fields() {
            note(f.name());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match found {
        Some(name) => Err(refuse(format!(
            "the name '{name}' is reserved: names that start with {RESERVED_PREFIX} are those of \
             the columns and tables dpfusion adds to a query. Rename it (e.g. drop the prefix)."
        ))),
        None => Ok(()),
    }
}

/// How many DP calls `plan` makes (its subqueries' included).
fn dp_call_count(plan: &LogicalPlan) -> usize {
    let mut n = 0;
    let _ = plan.apply_with_subqueries(|p| {
        for e in p.expressions() {
            let _ = e.apply(|x| {
                if let Expr::AggregateFunction(f) = x
                    && is_dp_function(f.func.name())
                {
                    n += 1;
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    n
}

/// A refusal of a plan from which DataFusion's optimizer removed `dropped` DP calls whose results
/// the query does not use (`SELECT g FROM (SELECT g, dp_count(…) AS n … GROUP BY g)`): what is
/// left reads the private table as plain SQL, and the guard's reason ("GROUP BY … without a DP
/// aggregate") would name a query the analyst did not write. The refusal says so and what to
/// write instead; other errors pass unchanged.
fn dropped_calls(e: DataFusionError, dropped: usize) -> DataFusionError {
    let why = match crate::error::Error::of(&e) {
        Some(crate::error::Error::Refused(why)) if dropped > 0 => why,
        _ => return e,
    };
    refuse(format!(
        "the query does not use the result of {dropped} of its DP calls, and DataFusion's \
         optimizer removes a call whose result is not used; without it, what is left reads the \
         private table as plain SQL ({}). Use every DP call's result, e.g. SELECT g, n FROM \
         (SELECT g, dp_count(x, 1.0) AS n FROM t GROUP BY g), or count(n) to count the \
         released groups.",
        why.trim_start_matches("dpfusion refused the query: ")
    ))
}

// ---- settlement of the public sides of joins -----------------------------------------------------

/// The private table a subquery of `e` reads, if any.
fn subquery_reading_private(e: &Expr) -> Option<TableInfo> {
    let mut found = None;
    let _ = e.apply(|x| {
        let plan = match x {
            Expr::ScalarSubquery(s) => Some(&s.subquery),
            Expr::Exists(s) => Some(&s.subquery.subquery),
            Expr::InSubquery(s) => Some(&s.subquery.subquery),
            Expr::SetComparison(s) => Some(&s.subquery.subquery),
            _ => None,
        };
        if let Some(t) = plan.and_then(|p| any_private_table(p)) {
            found = Some(t);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The count of a public side's rows per join key, in [`settle`]: a reserved name, so that no key
/// of the analyst's shares it (round 51, review "names" F2: a key column `n` made every join with
/// it fail as "ambiguous").
const DUPLICATES: &str = "__dpfusion_duplicates";

/// The public sides of joins in private regions (join.rs), settled: each is checked to read no
/// private table (its plan and the join keys evaluated on it, subqueries included), then run
/// (public data only), its join keys checked unique, and the plan given the very rows that were
/// checked, so a public file that changes before execution cannot add a second match. A
/// duplicated key is refused naming it (public). Runs before admission.
async fn settle(
    state: &SessionState,
    plan: LogicalPlan,
    sides: &[PublicSide],
) -> Result<LogicalPlan> {
    if sides.is_empty() {
        return Ok(plan);
    }
    // First every side is checked; only then does any of them run.
    for side in sides {
        let private = any_private_table(&side.plan)
            .or_else(|| side.keys.iter().find_map(subquery_reading_private));
        if let Some(t) = private {
            return Err(refuse(format!(
                "the public side of a join with private table '{}' (or its join key) reads \
                 private table '{}'; a join's public side and its keys may read public tables \
                 only",
                side.private_table, t.name
            )));
        }
    }
    let mut replacements: Vec<(LogicalPlan, LogicalPlan)> = vec![];
    for (i, side) in sides.iter().enumerate() {
        let physical = state
            .query_planner()
            .create_physical_plan(&side.plan, state)
            .await?;
        let batches = datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        // The rows under plain column names, then the side's own (qualified) names on top.
        let schema = side.plan.schema();
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(j, f)| {
                Field::new(format!("c{j}"), f.data_type().clone(), f.is_nullable())
                    .with_metadata(f.metadata().clone())
            })
            .collect();
        let arrow_schema = Arc::new(Schema::new(fields));
        let batches = batches
            .into_iter()
            .map(|b| RecordBatch::try_new(arrow_schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // Each column's largest value, which the audit counts wherever private rows copy it
        // (fragment::column_bytes): a public side may hold a value the query made large.
        let widest: Vec<u64> = (0..arrow_schema.fields().len())
            .map(|c| {
                batches.iter().fold(0u64, |w, b| {
                    let per_row = super::table::value_bytes_per_row(b.column(c));
                    per_row.into_iter().fold(w, u64::max)
                })
            })
            .collect();
        let name = format!("__dpfusion_public_{i}");
        let mem = MemTable::try_new(arrow_schema, vec![batches])?;
        // A public table for the guard and the audit (its rows are the public side's).
        let info = TableInfo {
            name: name.clone(),
            key: crate::accounting::TableKey::from(format!("settled:{name}")),
            private: false,
            ..unknown_table(&name)
        };
        let table = Arc::new(GuardedTable::new(Arc::new(mem), info).with_widest(widest));
        let scan =
            LogicalPlanBuilder::scan(name.as_str(), provider_as_source(table), None)?.build()?;
        let exprs: Vec<Expr> = schema
            .iter()
            .enumerate()
            .map(|(j, (q, f))| {
                Expr::Column(Column::new(Some(name.as_str()), format!("c{j}")))
                    .alias_qualified(q.cloned(), f.name())
            })
            .collect();
        let rows = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(scan))?);
        // With `=` a NULL key matches nothing: public rows with one are no duplicates (round
        // 50, review "fixes" F2: they were refused as the key `()`).
        let matching = match side
            .keys
            .iter()
            .cloned()
            .map(Expr::is_not_null)
            .reduce(Expr::and)
        {
            Some(not_null) if !side.nulls_match => {
                LogicalPlanBuilder::from(rows.clone()).filter(not_null)?
            }
            _ => LogicalPlanBuilder::from(rows.clone()),
        };
        let counted = matching
            .aggregate(
                side.keys.clone(),
                vec![datafusion::functions_aggregate::expr_fn::count(lit(1)).alias(DUPLICATES)],
            )?
            .filter(col(DUPLICATES).gt(lit(1i64)))?;
        // The smallest duplicated key, so that the refusal names the same one on every run (the
        // first one the threads met varied: round 50, the fuzzer), in the order the releases'
        // keys are sorted in (structs by their fields); keys of a type nothing sorts are left in
        // the aggregate's order (public rows either way), and a sort of no key is no sort
        // (round 50, review "fixes" F1: DataFusion refuses it).
        let order = super::sort_exprs(counted.schema(), side.keys.len());
        let counted = if order.is_empty() {
            counted
        } else {
            counted.sort(order)?
        };
        let dup = counted.limit(0, Some(1))?.build()?;
        let keys: Vec<String> = side.keys.iter().map(|k| k.to_string()).collect();
        let physical = state.create_physical_plan(&dup).await?;
        let found = datafusion::physical_plan::collect(physical, state.task_ctx())
            .await
            .map_err(|e| key_cast_refusal(e, &keys, &side.private_table))?;
        if let Some(b) = found.iter().find(|b| b.num_rows() > 0) {
            let show = |k: usize| {
                datafusion::arrow::util::display::array_value_to_string(b.column(k), 0)
                    .unwrap_or_default()
            };
            // The keys' columns, then the count (the aggregate keeps a key written twice once).
            let n = b.num_columns() - 1;
            let values: Vec<String> = (0..n).map(show).collect();
            return Err(refuse(format!(
                "the join key ({}) is not unique in the public side joined with private table \
                 '{}': ({}) appears {} times, so a private row would count once per match. Join \
                 on a key that is unique in the public table (or make it unique first, e.g. with \
                 SELECT DISTINCT or GROUP BY in a subquery).",
                keys.join(", "),
                side.private_table,
                values.join(", "),
                show(n)
            )));
        }
        replacements.push((side.plan.clone(), rows));
    }
    Ok(plan
        .transform_down_with_subqueries(|node| {
            for (from, to) in &replacements {
                if &node == from {
                    return Ok(Transformed::new(to.clone(), true, TreeNodeRecursion::Jump));
                }
            }
            Ok(Transformed::no(node))
        })?
        .data)
}

/// A public side's join key that DataFusion cannot cast: the join compares two types and
/// DataFusion's coercion casts one side's key to the other's type, which fails on a public value
/// (`ON t.store = s.region`, a number against 'north'). Only public rows were read and nothing
/// is charged; the refusal says what to write instead of the raw Arrow text alone. Any other
/// error is passed on as it is.
fn key_cast_refusal(e: DataFusionError, keys: &[String], private_table: &str) -> DataFusionError {
    use datafusion::arrow::error::ArrowError;
    match e.find_root() {
        DataFusionError::ArrowError(a, _) if matches!(a.as_ref(), ArrowError::CastError(_)) => {
            refuse(format!(
                "the join key ({}) of the public side joined with private table '{}' cannot be \
                 compared with the private side's key: the two have different types and a \
                 public value does not convert ({a}). Join on columns of one type, or cast both \
                 sides to the type you mean (e.g. CAST(… AS VARCHAR) on each side).",
                keys.join(", "),
                private_table
            ))
        }
        _ => e,
    }
}

// ---- the final audit ---------------------------------------------------------------------------

fn audit_refusal(what: impl std::fmt::Display) -> DataFusionError {
    refuse(format!(
        "{what}. (The final check of the plan that would run found it; only the private fragment \
         of docs/PRIVACY.md may stand between a private table and a DP aggregate.)"
    ))
}

/// The final audit of the plan that will run (after the guard's rewrites and the settlement of
/// joins), written independently of the guard's walk: every node, every expression of every node
/// and every subquery.
/// (a) A private scan is reachable only as the input of a DP aggregate, through the private
///     fragment.
/// (b) A subquery that reads a private table stands nowhere in a private region (between a scan
///     and its DP aggregate, the aggregate's own arguments, FILTER and GROUP BY included, the
///     bounding windows included) nor in any join's keys or condition.
/// (c) Between a private scan and its DP aggregate stand only the fragment's nodes and the exact
///     aggregate, window, unnest, projection and filter shapes the guard generates (unit
///     bounding, marked by their internal column names and functions), every expression in the typed fragment (`fragment::check_expr_typed`) or a
///     guard-generated total-evaluation wrapper of such an expression.
/// (d) Over a unit-level table, a join that keeps a public side's unmatched rows (a public key
///     set) joins every public row a second time as a copy that matches nothing, so that no
///     public group can vanish in the contribution bounding ([`audit_copies`]; round 48).
/// (e) Every node over private rows (the DP aggregate, the region's projections, filters, joins
///     and bounding aggregates) holds at most 64 times a row plus 64 KiB per row at once, its
///     values summed ([`audit_node_bytes`]; round 48).
pub(super) fn audit(plan: &LogicalPlan, opts: &GuardOptions) -> Result<()> {
    if let Some(f) = super::sized::unwrapped(plan) {
        return Err(audit_refusal(format_args!(
            "a call of {f}() not bounded by what it writes"
        )));
    }
    audit_node(plan, opts)
}

/// A node outside any private region (post-processing of releases, or public work).
fn audit_node(plan: &LogicalPlan, opts: &GuardOptions) -> Result<()> {
    match plan {
        LogicalPlan::Aggregate(a)
            if is_dp_aggregate(a) && raw_private_table(&a.input).is_some() =>
        {
            audit_dp_aggregate(a, opts)?;
            return audit_node_bytes(plan);
        }
        LogicalPlan::TableScan(scan) => {
            let info =
                table_info(scan).unwrap_or_else(|| unknown_table(&scan.table_name.to_string()));
            if info.private {
                return Err(audit_refusal(format_args!(
                    "raw rows of private table '{}' are read outside a DP aggregate",
                    info.name
                )));
            }
        }
        LogicalPlan::Window(w) if w.window_expr.iter().any(super::uses_dp_function) => {
            return Err(audit_refusal(
                "a DP aggregate evaluated as a window function",
            ));
        }
        LogicalPlan::Explain(_) | LogicalPlan::Analyze(_) => {
            if let Some(t) = any_private_table(plan) {
                return Err(explain_refusal(&t.name));
            }
        }
        LogicalPlan::RecursiveQuery(_) => {
            if let Some(t) = any_private_table(plan) {
                return Err(audit_refusal(format_args!(
                    "a recursive query reads private table '{}'",
                    t.name
                )));
            }
        }
        p if is_statement_node(p) => {
            return Err(audit_refusal(format_args!(
                "{} inside a query",
                plan.display()
            )));
        }
        LogicalPlan::Join(j) => audit_join_exprs_public(j)?,
        _ => {}
    }
    audit_subqueries_of(plan, opts)?;
    for child in plan.inputs() {
        audit_node(child, opts)?;
    }
    Ok(())
}

/// The subqueries in `plan`'s own expressions, each audited as a query of its own.
fn audit_subqueries_of(plan: &LogicalPlan, opts: &GuardOptions) -> Result<()> {
    let mut subs: Vec<LogicalPlan> = vec![];
    plan.apply_expressions(|e| {
        e.apply(|x| {
            match x {
                Expr::ScalarSubquery(s) => subs.push(s.subquery.as_ref().clone()),
                Expr::Exists(s) => subs.push(s.subquery.subquery.as_ref().clone()),
                Expr::InSubquery(s) => subs.push(s.subquery.subquery.as_ref().clone()),
                Expr::SetComparison(s) => subs.push(s.subquery.subquery.as_ref().clone()),
                _ => {}
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    for s in &subs {
        audit_node(s, opts)?;
    }
    Ok(())
}

/// (b) for a join outside private regions: its keys and condition hold no subquery that reads a
/// private table (a release there would decide which rows meet).
fn audit_join_exprs_public(j: &Join) -> Result<()> {
    for e in
        j.on.iter()
            .flat_map(|(l, r)| [l, r])
            .chain(j.filter.as_ref())
    {
        if let Some(t) = subquery_reading_private(e) {
            return Err(audit_refusal(format_args!(
                "a subquery that reads private table '{}' in a join's keys or condition",
                t.name
            )));
        }
    }
    Ok(())
}

/// An expression that stands over private rows, in `place`: no subquery reading a private table
/// ((b)); in the fragment once the guard's total-evaluation wrappers are looked through ((c)).
fn region_expr(
    e: &Expr,
    schema: &DFSchema,
    cols: &[Bytes],
    place: &str,
    opts: &GuardOptions,
) -> Result<()> {
    if let Some(t) = subquery_reading_private(e) {
        return Err(audit_refusal(format_args!(
            "a subquery that reads private table '{}' in {place}, over private rows",
            t.name
        )));
    }
    // Subqueries over public tables only: audited as queries of their own.
    let mut subs = vec![];
    let _ = e.apply(|x| {
        if let Expr::ScalarSubquery(s) = x {
            subs.push(s.subquery.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    for s in subs {
        audit_node(&s, opts)?;
    }
    let inner = total::unwrap(e.clone())?;
    match fragment::check_expr_typed(&inner, schema, cols) {
        None => Ok(()),
        Some(why) => Err(audit_refusal(format_args!("{why} in {place}"))),
    }
}

/// A DP aggregate over private rows: its calls, arguments, FILTER and GROUP BY, then its region.
fn audit_dp_aggregate(a: &Aggregate, opts: &GuardOptions) -> Result<()> {
    let cols = fragment::column_bytes(&a.input);
    for g in &a.group_expr {
        region_expr(g, a.input.schema(), &cols, "GROUP BY", opts)?;
        if let Some(why) = super::unsortable_key(g, a.input.schema()) {
            return Err(audit_refusal(why));
        }
    }
    for e in &a.aggr_expr {
        let Some(f) = aggregate_function(e) else {
            return Err(audit_refusal(format_args!(
                "the aggregate expression {e} over private rows"
            )));
        };
        let name = f.func.name();
        if !(is_dp_function(name) || name == PARTITION_SELECT) {
            return Err(audit_refusal(format_args!(
                "the aggregate {name} over private rows is not differentially private"
            )));
        }
        if f.params.distinct || !f.params.order_by.is_empty() || f.params.null_treatment.is_some() {
            return Err(audit_refusal(format_args!(
                "DISTINCT, ORDER BY or IGNORE NULLS inside {name}"
            )));
        }
        let place = format!("the arguments of {name}");
        for arg in &f.params.args {
            region_expr(arg, a.input.schema(), &cols, &place, opts)?;
        }
        if let Some(filter) = &f.params.filter {
            region_expr(
                filter,
                a.input.schema(),
                &cols,
                &format!("the FILTER clause of {name}"),
                opts,
            )?;
        }
    }
    let mut cx = Region {
        opts,
        unit: unit_table_in(&a.input).map(|table| UnitAudit {
            table,
            grouped: !a.group_expr.is_empty(),
            bounded: false,
        }),
        private_joins: 0,
    };
    audit_region(&a.input, &mut cx)?;
    match cx.unit {
        Some(u) if !u.bounded && (u.grouped || !models_clipping_units(a)) => {
            Err(audit_refusal(format_args!(
                "a DP aggregate over unit-level table '{}' without its contribution bounding",
                u.table
            )))
        }
        _ => Ok(()),
    }
}

/// Without GROUP BY, models alone bound a unit themselves (units.rs, `model_rows`): every call
/// is a model calibrated for `units:1:1` whose last argument, the unit key it clips by, reads
/// the privacy unit column of a unit-level table.
fn models_clipping_units(a: &Aggregate) -> bool {
    use datafusion::common::ScalarValue;
    a.aggr_expr.iter().all(|e| {
        let Some(f) = aggregate_function(e) else {
            return false;
        };
        let [.., Expr::Literal(ScalarValue::Utf8(Some(mode)), _), key] = f.params.args.as_slice()
        else {
            return false;
        };
        super::units::is_model(f.func.name())
            && mode == "units:1:1"
            && match column_source(key, &a.input) {
                Some((info, column)) => {
                    info.private && info.unit.is_some_and(|u| u.column == column)
                }
                None => false,
            }
    })
}

/// The audit's context in one private region.
struct Region<'a> {
    opts: &'a GuardOptions,
    /// The region reads a unit-level table: its bounding must stand in it, exactly once.
    unit: Option<UnitAudit>,
    /// Joins of two private sides met so far: at most one. Each multiplies a unit's rows (n rows
    /// joined k times make n^k), so a chain would make the work a power of a private count.
    private_joins: u32,
}

struct UnitAudit {
    /// The unit-level table read (for messages).
    table: String,
    /// Does the DP aggregate GROUP BY (then each unit keeps at most K groups)?
    grouped: bool,
    /// Has the audit met the bounding (the aggregate by unit with its pinned unit column, C, and
    /// with GROUP BY, K)?
    bounded: bool,
}

/// The name of a unit-level private table read in the region below a DP aggregate.
fn unit_table_in(plan: &LogicalPlan) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Aggregate(a) = node
            && is_dp_aggregate(a)
        {
            return Ok(TreeNodeRecursion::Jump);
        }
        if let LogicalPlan::TableScan(s) = node
            && let Some(info) = table_info(s)
            && info.private
            && info.unit.is_some()
        {
            found = Some(info.name);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The private region below a DP aggregate: the fragment's nodes, the guard's bounding shapes,
/// joins of the allowed forms ([`audit_region_node`]); then, once the region below is audited,
/// what each node holds at once ([`audit_node_bytes`]).
fn audit_region(plan: &LogicalPlan, cx: &mut Region) -> Result<()> {
    audit_region_node(plan, cx)?;
    audit_node_bytes(plan)
}

/// (e) What one node over private rows holds per row at once, the values it computes and those
/// it passes on summed ([`fragment::check_node_bytes`]): each expression is bounded alone (c),
/// but a node's batch holds them all together, outside the memory pool (round 48, review
/// "resources", finding 3: 300 GROUP BY keys of 32 copies each of a 100-byte string aborted
/// `dpfusion serve` at 7.8 GB over an ordinary 10,000-row table).
fn audit_node_bytes(plan: &LogicalPlan) -> Result<()> {
    let what = match plan {
        LogicalPlan::Projection(_) => "a SELECT list (projection)",
        LogicalPlan::Filter(_) => "a WHERE clause (filter)",
        LogicalPlan::Join(_) => "a JOIN (both sides' values, its keys and its condition)",
        LogicalPlan::Aggregate(a) if is_dp_aggregate(a) => {
            "a DP aggregate (its GROUP BY keys and its calls' arguments)"
        }
        LogicalPlan::Aggregate(_) => {
            "an aggregate of the unit bounding (its GROUP BY keys and the values it keeps)"
        }
        _ => return Ok(()),
    };
    match fragment::check_node_bytes(plan, what) {
        None => Ok(()),
        Some(why) => Err(audit_refusal(why)),
    }
}

/// One node of a private region ([`audit_region`]).
fn audit_region_node(plan: &LogicalPlan, cx: &mut Region) -> Result<()> {
    let opts = cx.opts;
    match plan {
        LogicalPlan::TableScan(scan) => {
            let info =
                table_info(scan).unwrap_or_else(|| unknown_table(&scan.table_name.to_string()));
            if !info.private {
                return Err(audit_refusal(format_args!(
                    "a public table ('{}') read in a private region outside a join",
                    info.name
                )));
            }
            if scan.fetch.is_some() || !scan.filters.is_empty() {
                return Err(audit_refusal(format_args!(
                    "a LIMIT or filter pushed into the scan of private table '{}'",
                    info.name
                )));
            }
            Ok(())
        }
        LogicalPlan::Projection(p) => {
            let cols = fragment::column_bytes(&p.input);
            for e in &p.expr {
                region_expr(e, p.input.schema(), &cols, "SELECT", opts)?;
            }
            audit_region(&p.input, cx)
        }
        // Without GROUP BY, the aggregate by unit of totals and samples (one group: K = 1).
        LogicalPlan::Aggregate(a) if cx.unit.as_ref().is_some_and(|u| !u.grouped) => {
            audit_bounding_aggregate(a, cx)?;
            audit_region(&a.input, cx)
        }
        // With GROUP BY: each unit's K groups, their totals and samples, in one aggregate by unit.
        LogicalPlan::Aggregate(a) if cx.unit.as_ref().is_some_and(|u| u.grouped) => {
            audit_unit_groups(a, cx)?;
            audit_region(&a.input, cx)
        }
        // The unit bounding's sample of rows back as rows (units.rs), and nothing else.
        LogicalPlan::Unnest(u)
            if u.exec_columns
                .iter()
                .all(|c| c.name == SAMPLE || c.name == KEPT) =>
        {
            audit_region(&u.input, cx)
        }
        LogicalPlan::Filter(f) => {
            let cols = fragment::column_bytes(&f.input);
            region_expr(&f.predicate, f.input.schema(), &cols, "WHERE", opts)?;
            audit_region(&f.input, cx)
        }
        LogicalPlan::SubqueryAlias(s) => audit_region(&s.input, cx),
        LogicalPlan::Join(j) => audit_region_join(j, cx),
        other => Err(audit_refusal(format_args!(
            "{} between a private table and a DP aggregate",
            construct_name(other)
        ))),
    }
}

/// A join inside a private region: one private side (a region) and one public side (no private
/// table anywhere in it), or two private sides (a join on the unit columns); equality keys; no
/// FULL join; keys and condition over private rows.
fn audit_region_join(j: &Join, cx: &mut Region) -> Result<()> {
    let opts = cx.opts;
    if j.on.is_empty() {
        return Err(audit_refusal(
            "a JOIN without equality keys in a private region",
        ));
    }
    if matches!(
        j.join_type,
        JoinType::Full | JoinType::LeftMark | JoinType::RightMark
    ) {
        return Err(audit_refusal(format_args!(
            "a {} JOIN in a private region",
            j.join_type
        )));
    }
    let (left_cols, right_cols) = (
        fragment::column_bytes(&j.left),
        fragment::column_bytes(&j.right),
    );
    for (l, r) in &j.on {
        region_expr(l, j.left.schema(), &left_cols, "the JOIN keys", opts)?;
        region_expr(r, j.right.schema(), &right_cols, "the JOIN keys", opts)?;
    }
    if let Some(f) = &j.filter {
        // The condition sees both sides' columns, also where the join's output has one side's
        // (a semi or anti join).
        let cols: Vec<Bytes> = left_cols.iter().chain(&right_cols).copied().collect();
        let both = match j.schema.fields().len() == cols.len() {
            true => None,
            false => Some(j.left.schema().join(j.right.schema())?),
        };
        let schema = both.as_ref().unwrap_or(&j.schema);
        region_expr(f, schema, &cols, "the JOIN condition", opts)?;
    }
    let (left_table, right_table) = (any_private_table(&j.left), any_private_table(&j.right));
    match (left_table.is_some(), right_table.is_some()) {
        (true, true) => {
            // A join of two private tables only as the guard's unit join makes it (join.rs):
            // INNER, both with a unit of one domain, the unit columns paired as they are, of one
            // type (round 46: the audit had accepted any equality join of two private tables).
            let (lt, rt) = (left_table.expect("left"), right_table.expect("right"));
            let paired = match (&lt.unit, &rt.unit) {
                (Some(lu), Some(ru)) => {
                    lu.domain == ru.domain && super::join::pairs_units(j, &lu.column, &ru.column)
                }
                _ => false,
            };
            if j.join_type != JoinType::Inner || !paired {
                return Err(audit_refusal(format_args!(
                    "a {} JOIN of private tables '{}' and '{}' that is not an INNER join on \
                     their privacy unit columns of one domain and type",
                    j.join_type, lt.name, rt.name
                )));
            }
            if j.null_equality == datafusion::common::NullEquality::NullEqualsNull {
                return Err(audit_refusal(
                    "a join of private tables whose keys match NULL with NULL (IS NOT DISTINCT \
                     FROM)",
                ));
            }
            cx.private_joins += 1;
            if cx.private_joins > 1 {
                return Err(audit_refusal(super::join::PRIVATE_JOIN_CHAIN));
            }
            // Each side bounded per unit before the join, at M = K·C rows of a unit (round 48),
            // K and C those in force for the left table, whose unit the bounding above reads.
            let (k, c) = super::units::bounds_in_force(lt.unit.as_ref().expect("paired"), opts);
            let rows = u64::from(k) * u64::from(c);
            audit_join_prebound(&j.left, rows, cx)?;
            audit_join_prebound(&j.right, rows, cx)
        }
        (true, false) => {
            audit_copies(j, true, cx)?;
            audit_region(&j.left, cx)?;
            audit_node(&j.right, opts)
        }
        (false, true) => {
            audit_copies(j, false, cx)?;
            audit_node(&j.left, opts)?;
            audit_region(&j.right, cx)
        }
        (false, false) => Err(audit_refusal(
            "a JOIN that reads no private table in a private region",
        )),
    }
}

/// A side of a join of two private tables (round 48, review "resources", finding 1): exactly the
/// guard's pre-bound ([`super::units::join_prebound`]) over a private region, so that a unit's
/// pairs are at most `rows`² whatever its rows. A projection of columns over the unnested
/// (`__dpfusion_join_sample`, list then struct) aggregate GROUP BY `u AS __dpfusion_join_unit` of
/// `__dpfusion_unit_sample(M, columns…) AS __dpfusion_join_sample` alone, where `u` reads the
/// privacy unit column of a unit-level table, M = `rows` (K·C in force) and at most
/// [`super::units::MAX_JOIN_ROWS`]; then the region below it.
fn audit_join_prebound(side: &LogicalPlan, rows: u64, cx: &mut Region) -> Result<()> {
    use super::units::{JOIN_SAMPLE, JOIN_UNIT, MAX_JOIN_ROWS};
    use datafusion::common::ScalarValue;
    let opts = cx.opts;
    let unbounded = || {
        audit_refusal(
            "a side of a join of private tables that is not bounded per unit before the join \
             (one unit's rows on both sides would make every pair: work that grows as the \
             square of a private count)",
        )
    };
    let LogicalPlan::Projection(p) = side else {
        return Err(unbounded());
    };
    let sample = |u: &datafusion::logical_expr::Unnest| {
        matches!(u.exec_columns.as_slice(),
            [c] if c.relation.is_none() && c.name == JOIN_SAMPLE)
    };
    let LogicalPlan::Unnest(structs) = p.input.as_ref() else {
        return Err(unbounded());
    };
    let LogicalPlan::Unnest(lists) = structs.input.as_ref() else {
        return Err(unbounded());
    };
    let LogicalPlan::Aggregate(a) = lists.input.as_ref() else {
        return Err(unbounded());
    };
    if !sample(structs) || !sample(lists) {
        return Err(unbounded());
    }
    let [Expr::Alias(unit)] = a.group_expr.as_slice() else {
        return Err(unbounded());
    };
    let [Expr::Alias(al)] = a.aggr_expr.as_slice() else {
        return Err(unbounded());
    };
    let Expr::AggregateFunction(f) = al.expr.as_ref() else {
        return Err(unbounded());
    };
    let q = &f.params;
    // The sample's own cap (what runs) and its literal (what the plan shows) alike.
    let cap = (f.func.inner().as_ref() as &dyn std::any::Any)
        .downcast_ref::<Sample>()
        .map(Sample::cap);
    let [Expr::Literal(ScalarValue::UInt64(Some(m)), _), cols @ ..] = q.args.as_slice() else {
        return Err(unbounded());
    };
    if unit.name != JOIN_UNIT
        || al.name != JOIN_SAMPLE
        || f.func.name() != SAMPLE_FN
        || cap.is_none()
        || q.distinct
        || q.filter.is_some()
        || !q.order_by.is_empty()
        || q.null_treatment.is_some()
        || !cols.iter().all(|c| matches!(c, Expr::Column(_)))
    {
        return Err(unbounded());
    }
    // The unit key is the owner's unit column of a unit-level table.
    match column_source(&unit.expr, &a.input) {
        Some((info, column))
            if info.private && info.unit.as_ref().is_some_and(|u| u.column == column) => {}
        _ => {
            return Err(audit_refusal(format_args!(
                "a side of a join of private tables bounded by {}, which is not a table's \
                 privacy unit column",
                unit.expr
            )));
        }
    }
    if cap != Some(*m) {
        return Err(audit_refusal(format_args!(
            "a side of a join of private tables whose sample keeps {} row(s) of each unit while \
             its plan shows {m}",
            cap.unwrap_or_default()
        )));
    }
    if *m != rows || *m > MAX_JOIN_ROWS {
        return Err(audit_refusal(format_args!(
            "a side of a join of private tables keeps {m} row(s) of each unit, but the bounds \
             in force say {rows} (max_groups_contributed × max_rows_contributed, at most \
             {MAX_JOIN_ROWS})"
        )));
    }
    let cols_below = fragment::column_bytes(&a.input);
    let below = a.input.schema();
    region_expr(
        &unit.expr,
        below,
        &cols_below,
        "the unit key of a join's pre-bound",
        opts,
    )?;
    for c in cols {
        region_expr(
            c,
            below,
            &cols_below,
            "the rows a join's pre-bound samples",
            opts,
        )?;
    }
    let cols_above = fragment::column_bytes(&p.input);
    for e in &p.expr {
        region_expr(e, p.input.schema(), &cols_above, "SELECT", opts)?;
    }
    audit_region(&a.input, cx)
}

/// A join of a private region (the left side if `private_left`) with a public side that keeps
/// the public side's unmatched rows (a public key set, join.rs) over a unit-level table: every
/// public row must also reach the contribution bounding unmatched, or a group whose every
/// matching unit kept K other groups would vanish (round 48, review "units", finding 1). So the
/// public side is the public plan `CROSS JOIN` exactly the guard's two copies
/// ([`super::join::copies_plan`]), and one equality key pairs its copy column with the private
/// side's `0 AS __dpfusion_copy0`, a literal of the projection right below the join: copy 1
/// matches nothing.
fn audit_copies(j: &Join, private_left: bool, cx: &Region) -> Result<()> {
    use super::join::{COPY, COPY_ZERO, copies_plan};
    use datafusion::common::ScalarValue;
    let keeps_public = matches!(
        (j.join_type, private_left),
        (JoinType::Right, true) | (JoinType::Left, false)
    );
    let Some(unit) = cx.unit.as_ref().filter(|_| keeps_public) else {
        return Ok(());
    };
    let (private, public) = if private_left {
        (&j.left, &j.right)
    } else {
        (&j.right, &j.left)
    };
    let copies = copies_plan()?;
    let crossed = matches!(
        public.as_ref(),
        LogicalPlan::Join(c) if c.join_type == JoinType::Inner
            && c.on.is_empty()
            && c.filter.is_none()
            && c.right.as_ref() == &copies
    );
    // The private key: the column `__dpfusion_copy0` of the projection below the join, the
    // literal 0 there.
    let zero = |e: &Expr| {
        let (Expr::Column(c), LogicalPlan::Projection(p)) = (e, private.as_ref()) else {
            return false;
        };
        c.name == COPY_ZERO
            && p.schema.index_of_column(c).is_ok_and(|i| {
                matches!(&p.expr[i], Expr::Alias(a) if a.name == COPY_ZERO
                    && matches!(a.expr.as_ref(), Expr::Literal(ScalarValue::Int64(Some(0)), _)))
            })
    };
    let copy = |e: &Expr| matches!(e, Expr::Column(c) if c.relation.is_none() && c.name == COPY);
    let keyed = j.on.iter().any(|(l, r)| {
        let (p, q) = if private_left { (l, r) } else { (r, l) };
        zero(p) && copy(q)
    });
    if crossed && keyed {
        return Ok(());
    }
    Err(audit_refusal(format_args!(
        "a {} JOIN that keeps the rows of a public side over unit-level table '{}' without a \
         second, unmatched copy of every public row (the contribution bounding could drop a \
         public group by the units that matched it)",
        j.join_type.to_string().to_uppercase(),
        unit.table
    )))
}

/// With GROUP BY, the unit bounding (units.rs) as one shape: the aggregate over the private
/// region GROUP BY `u AS __dpfusion_unit`, `CASE WHEN u IS NULL THEN h END AS
/// __dpfusion_no_unit` of `__dpfusion_unit_groups(K, C, h, g…, t…, s…) AS __dpfusion_kept`, where
/// `u` reads the privacy-unit column of a unit-level table, `h` =
/// `__dpfusion_unit_group_key(u, g…)` with the same g… as the call's, K and C are the owner's (or
/// the session's) of that table, the call's layout ([`TopGroups`]) says how many g…, t… and s…
/// follow, each in the fragment over the private rows (a total `CASE WHEN filter THEN value END`
/// or a value; s… columns).
fn audit_unit_groups(a: &Aggregate, cx: &mut Region) -> Result<()> {
    use datafusion::common::ScalarValue;
    let opts = cx.opts;
    let schema = a.input.schema();
    let cols = fragment::column_bytes(&a.input);
    let shape = || audit_refusal("a unit bounding of an unexpected shape over private rows");
    let (declared_k, declared_c) = audit_unit_key(a, cx)?;
    let [Expr::Alias(u), Expr::Alias(no_unit)] = a.group_expr.as_slice() else {
        return Err(shape());
    };
    let unit = u.expr.as_ref();
    // The keyed hash of (u, g…).
    let hash_of = |e: &Expr| -> Option<Vec<Expr>> {
        match e {
            Expr::ScalarFunction(f)
                if f.name() == GROUP_KEY_FN
                    && (f.func.inner().as_ref() as &dyn std::any::Any).is::<GroupKey>()
                    && f.args.first() == Some(unit)
                    && f.args.len() > 1 =>
            {
                Some(f.args[1..].to_vec())
            }
            _ => None,
        }
    };
    let groups = match no_unit.expr.as_ref() {
        Expr::Case(c)
            if no_unit.name == NO_UNIT
                && c.expr.is_none()
                && c.else_expr.is_none()
                && c.when_then_expr.len() == 1
                && matches!(c.when_then_expr[0].0.as_ref(), Expr::IsNull(x) if x.as_ref() == unit) =>
        {
            hash_of(&c.when_then_expr[0].1).ok_or_else(shape)?
        }
        _ => return Err(shape()),
    };
    let [Expr::Alias(al)] = a.aggr_expr.as_slice() else {
        return Err(shape());
    };
    let Expr::AggregateFunction(f) = al.expr.as_ref() else {
        return Err(shape());
    };
    let p = &f.params;
    let Some(top) = (f.func.inner().as_ref() as &dyn std::any::Any).downcast_ref::<TopGroups>()
    else {
        return Err(shape());
    };
    if al.name != KEPT
        || f.func.name() != TOP_GROUPS_FN
        || p.distinct
        || p.filter.is_some()
        || !p.order_by.is_empty()
        || p.null_treatment.is_some()
    {
        return Err(shape());
    }
    let l = top.layout;
    let [
        Expr::Literal(ScalarValue::UInt64(Some(k)), _),
        Expr::Literal(ScalarValue::UInt64(Some(c)), _),
        hash,
        rest @ ..,
    ] = p.args.as_slice()
    else {
        return Err(shape());
    };
    if hash_of(hash).as_deref() != Some(groups.as_slice())
        || rest.len() != l.groups + l.totals + l.sampled
        || rest[..l.groups] != groups[..]
    {
        return Err(shape());
    }
    if *k != u64::from(declared_k) {
        return Err(audit_refusal(format_args!(
            "the unit bounding keeps {k} group(s) per unit, but the table's policy says {declared_k}"
        )));
    }
    if *c != u64::from(declared_c) {
        return Err(audit_refusal(format_args!(
            "the unit bounding samples {c} row(s) per unit and group, but the table's policy \
             says {declared_c}"
        )));
    }
    for g in &groups {
        region_expr(
            g,
            schema,
            &cols,
            "the GROUP BY keys of the unit bounding",
            opts,
        )?;
    }
    for t in &rest[l.groups..l.groups + l.totals] {
        audit_total(t, schema, &cols, opts)?;
    }
    for s in &rest[l.groups + l.totals..] {
        if !matches!(s, Expr::Column(_)) {
            return Err(shape());
        }
        region_expr(
            s,
            schema,
            &cols,
            "the rows sampled by the unit bounding",
            opts,
        )?;
    }
    Ok(())
}

/// A `dp_sum`'s value in the unit bounding: `CASE WHEN filter THEN value END` or the value, both
/// in the fragment (checked apart, as the guard checked the call's argument and FILTER apart).
fn audit_total(v: &Expr, schema: &DFSchema, cols: &[Bytes], opts: &GuardOptions) -> Result<()> {
    match v {
        Expr::Case(c) if c.expr.is_none() && c.else_expr.is_none() => {
            for (w, t) in &c.when_then_expr {
                region_expr(
                    w,
                    schema,
                    cols,
                    "the FILTER clause of dp_sum (unit bounding)",
                    opts,
                )?;
                region_expr(
                    t,
                    schema,
                    cols,
                    "the argument of dp_sum (unit bounding)",
                    opts,
                )?;
            }
            Ok(())
        }
        v => region_expr(
            v,
            schema,
            cols,
            "the argument of dp_sum (unit bounding)",
            opts,
        ),
    }
}

/// The table and column a column reference of `plan`'s output reads, through projections that
/// pass a column on (renamed or not), filters, aliases and the joins of a private region.
fn column_source(e: &Expr, plan: &LogicalPlan) -> Option<(TableInfo, String)> {
    let Expr::Column(c) = e else {
        return None;
    };
    // A unit join's side bounded per unit (round 48) passes its unit key on.
    if let Some((unit, below)) = super::units::through_join_prebound(c, plan) {
        return column_source(unit, below);
    }
    match plan {
        LogicalPlan::TableScan(scan) => {
            scan.projected_schema.has_column(c).then_some(())?;
            Some((table_info(scan)?, c.name.clone()))
        }
        LogicalPlan::Projection(p) => {
            let idx = p.schema.index_of_column(c).ok()?;
            let inner = match &p.expr[idx] {
                Expr::Alias(al) => al.expr.as_ref(),
                e => e,
            };
            column_source(inner, &p.input)
        }
        LogicalPlan::Filter(f) => column_source(e, &f.input),
        LogicalPlan::SubqueryAlias(s) => {
            let idx = s.schema.index_of_column(c).ok()?;
            let (q, f) = s.input.schema().qualified_field(idx);
            column_source(&Expr::Column(Column::new(q.cloned(), f.name())), &s.input)
        }
        LogicalPlan::Join(j) => match (
            j.left.schema().has_column(c),
            j.right.schema().has_column(c),
        ) {
            (true, false) => column_source(e, &j.left),
            (false, true) => column_source(e, &j.right),
            _ => None,
        },
        _ => None,
    }
}

/// The unit key of a unit bounding aggregate (its first GROUP BY key, `u AS __dpfusion_unit`,
/// `u` reading the privacy-unit column of a unit-level table), once per region; returns the
/// table's (K, C), the session's where it sets them.
fn audit_unit_key(a: &Aggregate, cx: &mut Region) -> Result<(u32, u32)> {
    let opts = cx.opts;
    let Some(unit) = cx.unit.as_mut() else {
        return Err(audit_refusal(
            "an aggregate (other than a DP aggregate) between a private table and a DP aggregate",
        ));
    };
    if unit.bounded {
        return Err(audit_refusal(
            "a second unit bounding aggregate in one private region",
        ));
    }
    let Some(Expr::Alias(al)) = a.group_expr.first() else {
        return Err(audit_refusal(
            "an aggregate (other than a DP aggregate) between a private table and a DP aggregate",
        ));
    };
    // The unit key is the owner's unit column of a unit-level table, not any column.
    let policy = match column_source(&al.expr, &a.input) {
        Some((info, column)) if al.name == UNIT && info.private => match info.unit {
            Some(u) if u.column == column => u,
            _ => None.ok_or_else(|| {
                audit_refusal(format_args!(
                    "the unit bounding groups by column '{column}' of table '{}', which is not \
                     its privacy unit column",
                    info.name
                ))
            })?,
        },
        _ => {
            return Err(audit_refusal(format_args!(
                "the unit bounding groups by {}, which is not a table's privacy unit column",
                al.expr
            )));
        }
    };
    region_expr(
        &al.expr,
        a.input.schema(),
        &fragment::column_bytes(&a.input),
        "the GROUP BY keys of the unit bounding",
        opts,
    )?;
    unit.bounded = true;
    Ok((
        opts.max_groups_contributed
            .unwrap_or(policy.max_groups_contributed),
        opts.max_rows_contributed
            .unwrap_or(policy.max_rows_contributed),
    ))
}

/// Without GROUP BY, the unit bounding (units.rs) as one shape: the aggregate GROUP BY `u AS
/// __dpfusion_unit` alone ([`audit_unit_key`]); each aggregate either `__dpfusion_unit_total(v)
/// AS __dpfusion_total_i` (the exact total, units.rs `UnitTotal`, round 48; `v` a dp_sum call's
/// argument, under its FILTER, in the fragment) or
/// `__dpfusion_unit_sample(C, columns…) AS __dpfusion_sample` with C the owner's (or the
/// session's) C of that table.
fn audit_bounding_aggregate(a: &Aggregate, cx: &mut Region) -> Result<()> {
    let opts = cx.opts;
    let schema = a.input.schema();
    let input_cols = fragment::column_bytes(&a.input);
    let (_, c) = audit_unit_key(a, cx)?;
    if a.group_expr.len() != 1 {
        return Err(audit_refusal(
            "a unit bounding of an unexpected shape over private rows",
        ));
    }
    for e in &a.aggr_expr {
        let bad = || audit_refusal(format_args!("the aggregate {e} in the unit bounding"));
        let Expr::Alias(al) = e else {
            return Err(bad());
        };
        let Expr::AggregateFunction(f) = al.expr.as_ref() else {
            return Err(bad());
        };
        let p = &f.params;
        if p.distinct || p.filter.is_some() || !p.order_by.is_empty() || p.null_treatment.is_some()
        {
            return Err(bad());
        }
        match (f.func.name(), p.args.as_slice()) {
            (TOTAL_FN, [v])
                if al.name.starts_with(TOTAL)
                    && (f.func.inner().as_ref() as &dyn std::any::Any).is::<UnitTotal>() =>
            {
                audit_total(v, schema, &input_cols, opts)?
            }
            (SAMPLE_FN, [Expr::Literal(cap, _), cols @ ..])
                if al.name == SAMPLE
                    && (f.func.inner().as_ref() as &dyn std::any::Any).is::<Sample>()
                    && cols.iter().all(|c| matches!(c, Expr::Column(_))) =>
            {
                if cap != &datafusion::common::ScalarValue::UInt64(Some(u64::from(c))) {
                    return Err(audit_refusal(format_args!(
                        "the unit bounding samples {cap} row(s) per unit and group, but the \
                         table's policy says {c}"
                    )));
                }
                for col in cols {
                    region_expr(
                        col,
                        schema,
                        &input_cols,
                        "the rows sampled by the unit bounding",
                        opts,
                    )?;
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{LogicalPlanBuilder, lit};

    #[test]
    fn the_audit_refuses_a_raw_private_scan_anywhere() {
        let info = TableInfo {
            key: crate::accounting::TableKey::from("mem:p"),
            ..unknown_table("p")
        };
        let schema = Arc::new(Schema::new(vec![Field::new(
            "x",
            datafusion::arrow::datatypes::DataType::Int64,
            true,
        )]));
        let mem = MemTable::try_new(schema, vec![vec![]]).unwrap();
        let table = Arc::new(GuardedTable::new(Arc::new(mem), info));
        let scan = LogicalPlanBuilder::scan("p", provider_as_source(table), None)
            .unwrap()
            .build()
            .unwrap();
        assert!(audit(&scan, &GuardOptions::default()).is_err());
        // Behind a projection of a public VALUES join, too.
        let p = LogicalPlanBuilder::from(scan)
            .project(vec![col("x") + lit(1)])
            .unwrap()
            .build()
            .unwrap();
        let m = audit(&p, &GuardOptions::default()).unwrap_err().to_string();
        assert!(m.contains("raw rows of private table 'p'"), "{m}");
        let values = LogicalPlanBuilder::values(vec![vec![lit(1)]])
            .unwrap()
            .build()
            .unwrap();
        assert!(audit(&values, &GuardOptions::default()).is_ok());
    }

    /// A unit-level table t(g, unit, other, amount) with K = 2, C = 3, a public table k(g, name)
    /// with g unique, and the checked plan of `sql` over them.
    async fn unit_plan(sql: &str) -> LogicalPlan {
        use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array};
        use datafusion::arrow::datatypes::DataType;
        let dir = crate::testdir::test_dir("audit-units");
        let s = crate::PrivateSession::open(
            crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
        )
        .await
        .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("unit", DataType::Int64, false),
            Field::new("other", DataType::Int64, false),
            Field::new("amount", DataType::Float64, false),
        ]));
        let ints = |f: fn(i64) -> i64| Arc::new(Int64Array::from_iter_values((0..60).map(f)));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                ints(|i| i % 3) as ArrayRef,
                ints(|i| i % 20),
                ints(|i| i % 7),
                Arc::new(Float64Array::from_iter_values((0..60).map(|i| i as f64))),
            ],
        )
        .unwrap();
        s.register_batches(
            "t",
            vec![batch],
            crate::Registration::private()
                .privacy_unit("unit")
                .contribution_bounds(2, 3)
                .budget(10.0, 1e-5),
        )
        .unwrap();
        // A public key table g → name (round 48's key-set test).
        let keys = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("g", DataType::Int64, false),
                Field::new("name", DataType::Utf8, false),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![0, 1, 2])) as ArrayRef,
                Arc::new(datafusion::arrow::array::StringArray::from(vec![
                    "a", "b", "c",
                ])),
            ],
        )
        .unwrap();
        s.register_batches("k", vec![keys], crate::Registration::public())
            .unwrap();
        let plan = s.check(sql).await.unwrap().plan().clone();
        let _ = std::fs::remove_dir_all(&dir);
        plan
    }

    /// `plan` with every expression `e` of every node replaced by `f(e)` where it gives one.
    fn rewrite(plan: &LogicalPlan, f: impl Fn(&Expr) -> Option<Expr>) -> LogicalPlan {
        plan.clone()
            .transform_up(|node| {
                node.map_expressions(|e| {
                    e.transform_down(|x| {
                        Ok(match f(&x) {
                            Some(y) => Transformed::yes(y),
                            None => Transformed::no(x),
                        })
                    })
                })?
                .map_data(|n| n.recompute_schema())
            })
            .unwrap()
            .data
    }

    /// Review finding (issue 28): the audit pins the unit bounding to the owner's policy: the
    /// unit column (not any column), C in the row sample, K in the per-unit choice of groups,
    /// and the choice itself. A plan changed in any of them is refused.
    #[tokio::test]
    async fn the_audit_refuses_a_unit_bounding_with_another_unit_c_or_k() {
        use datafusion::common::ScalarValue;
        let opts = GuardOptions::default();
        let plan = unit_plan(
            "SELECT g, dp_mean(amount, 0, 10, epsilon => 1) AS m, \
             dp_sum(amount, 0, 10, epsilon => 1) AS s FROM t GROUP BY g",
        )
        .await;
        audit(&plan, &opts).unwrap();
        let refused = |p: &LogicalPlan, what: &str| {
            let m = audit(p, &opts).unwrap_err().to_string();
            assert!(m.contains(what), "{what}: {m}");
        };
        // Another column as the unit (the group key: read by the scan).
        let other = rewrite(&plan, |e| match e {
            Expr::Alias(al) if al.name == UNIT => match al.expr.as_ref() {
                Expr::Column(c) if c.name == "unit" => {
                    Some(Expr::Column(Column::new(c.relation.clone(), "g")).alias(UNIT))
                }
                _ => None,
            },
            _ => None,
        });
        refused(&other, "not its privacy unit column");
        // `p` with argument `i` of the aggregate `name` set to the literal `v`.
        let with_literal = |p: &LogicalPlan, name: &str, i: usize, v: u64| {
            rewrite(p, |e| match e {
                Expr::AggregateFunction(f) if f.func.name() == name => {
                    let mut f = f.clone();
                    f.params.args[i] = Expr::Literal(ScalarValue::UInt64(Some(v)), None);
                    Some(Expr::AggregateFunction(f))
                }
                _ => None,
            })
        };
        // Another C in the row sample (with GROUP BY, the second argument of the aggregate by
        // unit; without, the sample's first).
        let c4 = with_literal(&plan, TOP_GROUPS_FN, 1, 4);
        refused(&c4, "samples 4 row(s) per unit and group");
        let ungrouped_rows =
            unit_plan("SELECT dp_mean(amount, 0, 10, epsilon => 1) AS m FROM t").await;
        audit(&ungrouped_rows, &opts).unwrap();
        let c4 = with_literal(&ungrouped_rows, SAMPLE_FN, 0, 4);
        refused(&c4, "samples 4 row(s) per unit and group");
        // Another K in the per-unit choice.
        let k3 = with_literal(&plan, TOP_GROUPS_FN, 0, 3);
        refused(
            &k3,
            "keeps 3 group(s) per unit, but the table's policy says 2",
        );
        // The plan as it is, under a session K of 3: refused too (the audit reads the options).
        let m = audit(
            &plan,
            &GuardOptions {
                max_groups_contributed: Some(3),
                ..opts
            },
        )
        .unwrap_err()
        .to_string();
        assert!(m.contains("policy says 3"), "{m}");
        // No bounding: the private rows straight under the DP aggregate (the unnests and the
        // aggregate by unit taken out), refused.
        let unlimited = plan
            .clone()
            .transform_up(|node| match &node {
                LogicalPlan::Projection(p) => match p.input.as_ref() {
                    LogicalPlan::Unnest(u) if u.exec_columns.iter().any(|c| c.name == KEPT) => {
                        let mut below = u.input.as_ref();
                        while let LogicalPlan::Unnest(v) = below {
                            below = v.input.as_ref();
                        }
                        let LogicalPlan::Aggregate(a) = below else {
                            panic!("the aggregate by unit")
                        };
                        Ok(Transformed::yes(a.input.as_ref().clone()))
                    }
                    _ => Ok(Transformed::no(node)),
                },
                _ => Ok(Transformed::no(node)),
            })
            .unwrap()
            .data;
        refused(&unlimited, "without its contribution bounding");
        // No bounding at all: the DP aggregate straight over the rows.
        let ungrouped = unit_plan("SELECT dp_sum(amount, 0, 10, epsilon => 1) AS s FROM t").await;
        audit(&ungrouped, &opts).unwrap();
        let bare = ungrouped
            .transform_up(|node| match node {
                LogicalPlan::Aggregate(a) if !is_dp_aggregate(&a) => {
                    Ok(Transformed::yes(a.input.as_ref().clone()))
                }
                n => Ok(Transformed::no(n)),
            })
            .unwrap()
            .data;
        // (Its calls now read columns the bare rows lack, or it has no bounding: refused.)
        assert!(audit(&bare, &opts).is_err());
    }

    /// Round 48 (review "units", finding 1): a public key set over a unit-level table joins every
    /// public row a second time, as a copy that matches nothing, so that no group can vanish in
    /// the contribution bounding. The audit refuses the join without the copy key, with a
    /// private copy that is not 0, or with other copies on the public side.
    #[tokio::test]
    async fn the_audit_refuses_a_unit_key_set_without_its_unmatched_copy() {
        use super::super::join::{COPY, COPY_ZERO};
        use datafusion::logical_expr::{LogicalPlan::Values, logical_plan::Values as V};
        let opts = GuardOptions::default();
        let plan = unit_plan(
            "SELECT k.name, dp_count(t.amount, epsilon => 1) AS n FROM t RIGHT JOIN k \
             ON t.g = k.g GROUP BY k.name",
        )
        .await;
        audit(&plan, &opts).unwrap();
        let refused = |p: &LogicalPlan| {
            let m = audit(p, &opts).unwrap_err().to_string();
            assert!(
                m.contains("over unit-level table 't' without a second, unmatched copy"),
                "{m}"
            );
        };
        // Without the copy key: copy 1 matches as copy 0 does.
        let unkeyed = plan
            .clone()
            .transform_up(|node| match node {
                LogicalPlan::Join(j) if j.on.len() > 1 => {
                    let on =
                        j.on.iter()
                            .filter(|(_, r)| !matches!(r, Expr::Column(c) if c.name == COPY))
                            .cloned()
                            .collect();
                    Ok(Transformed::yes(LogicalPlan::Join(Join::try_new(
                        j.left,
                        j.right,
                        on,
                        j.filter,
                        j.join_type,
                        j.join_constraint,
                        j.null_equality,
                        j.null_aware,
                    )?)))
                }
                n => Ok(Transformed::no(n)),
            })
            .unwrap()
            .data;
        refused(&unkeyed);
        // The private side's copy 1: every public row's copy 1 matches.
        let one = rewrite(&plan, |e| match e {
            Expr::Alias(a) if a.name == COPY_ZERO => Some(lit(1i64).alias(COPY_ZERO)),
            _ => None,
        });
        refused(&one);
        // Copies 0 and 0 on the public side: no copy is left unmatched.
        let zeros = plan
            .clone()
            .transform_up(|node| match node {
                Values(v) => Ok(Transformed::yes(Values(V {
                    schema: v.schema,
                    values: vec![vec![lit(0i64)], vec![lit(0i64)]],
                }))),
                n => Ok(Transformed::no(n)),
            })
            .unwrap()
            .data;
        refused(&zeros);
    }

    /// Round 48 (review "resources", finding 3): the final audit bounds what one node holds at
    /// once, its values summed. The reviewer's attack B scaled down (a private table with a string
    /// column; 300 distinct GROUP BY keys of 32 copies each, every one within the bound of an
    /// expression) and attack A (16 such keys) are refused at planning, nothing read or charged;
    /// two such keys are admitted.
    #[tokio::test]
    async fn the_audit_refuses_a_node_that_holds_too_many_copies_at_once() {
        use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
        use datafusion::arrow::datatypes::DataType;
        let dir = crate::testdir::test_dir("audit-node-bytes");
        let s = crate::PrivateSession::open(
            crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
        )
        .await
        .unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("s", DataType::Utf8, true),
                Field::new("x", DataType::Int64, true),
            ])),
            vec![
                Arc::new(StringArray::from_iter_values(
                    (0..100).map(|i| format!("{:03}{}", i % 20, "y".repeat(97))),
                )) as ArrayRef,
                Arc::new(Int64Array::from_iter_values((0..100).map(|i| i % 7))),
            ],
        )
        .unwrap();
        s.register_batches(
            "t",
            vec![batch],
            crate::Registration::private().budget(1000.0, 1e-3),
        )
        .unwrap();
        // The reviewer's queries (resources-repro.py): n keys, each '<i>' || s || … (32 copies),
        // or each s || … (32 copies), one value that common-subexpression elimination computes
        // once, named n times (copied apart by the aggregate's group keys).
        let keyed = |n: usize, distinct: bool| {
            let k = vec!["s"; 32].join(" || ");
            let keys: Vec<String> = (0..n)
                .map(|i| match distinct {
                    true => format!("'{i}' || {k} AS k{i}"),
                    false => format!("{k} AS k{i}"),
                })
                .collect();
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            format!(
                "SELECT length(k0) AS l, dp_count(x, epsilon => 1) AS n FROM (SELECT {}, x FROM t) \
                 GROUP BY {}",
                keys.join(", "),
                names.join(", ")
            )
        };
        let query = |n: usize| keyed(n, true);
        assert!(
            s.check(&keyed(16, false))
                .await
                .unwrap_err()
                .to_string()
                .contains("holds values of up to 512 times a row")
        );
        for (n, rows) in [(300, 9600), (16, 512)] {
            let m = s.check(&query(n)).await.unwrap_err().to_string();
            assert!(
                m.contains(&format!("holds values of up to {rows} times a row")),
                "{m}"
            );
            assert!(m.contains("split the query"), "{m}");
            let m = s.sql(&query(n)).await.unwrap_err().to_string();
            assert!(m.contains("holds values of up to"), "{m}");
        }
        assert_eq!(s.scans("t"), 0, "nothing read");
        assert!(s.ledger().unwrap().is_empty(), "nothing charged");
        s.check(&query(2)).await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Round 48 (review "resources", finding 1): each side of a join of two private tables is
    /// bounded per unit before the join, at M = K·C rows of a unit (units.rs, `join_prebound`).
    /// The audit passes the guard's plan, grouped or not, and refuses a side without its
    /// pre-bound (one unit's rows on both sides would make every pair), and a pre-bound that
    /// keeps another number of rows than the K·C in force.
    #[tokio::test]
    async fn the_audit_refuses_a_unit_join_side_without_its_prebound() {
        use super::super::units::JOIN_SAMPLE;
        use datafusion::common::ScalarValue;
        let opts = GuardOptions::default();
        let ungrouped = unit_plan(
            "SELECT dp_mean(t.amount, 0, 10, epsilon => 1) AS m FROM t JOIN t AS t2 \
             ON t.unit = t2.unit",
        )
        .await;
        audit(&ungrouped, &opts).unwrap();
        let plan = unit_plan(
            "SELECT t.g, dp_count(t2.amount, epsilon => 1) AS n FROM t JOIN t AS t2 \
             ON t.unit = t2.unit GROUP BY t.g",
        )
        .await;
        audit(&plan, &opts).unwrap();
        let refused = |p: &LogicalPlan, what: &str| {
            let m = audit(p, &opts).unwrap_err().to_string();
            assert!(m.contains(what), "{what}: {m}");
        };
        // `p` with argument `i` of every call of the aggregate `name` set to `v`. With GROUP BY
        // only the pre-bounds sample with SAMPLE_FN: K·C = 2 × 3 = 6 rows there (the literal;
        // the sample that runs keeps its own).
        let with_literal = |p: &LogicalPlan, name: &str, i: usize, v: u64| {
            rewrite(p, |e| match e {
                Expr::AggregateFunction(f) if f.func.name() == name => {
                    let mut f = f.clone();
                    f.params.args[i] = Expr::Literal(ScalarValue::UInt64(Some(v)), None);
                    Some(Expr::AggregateFunction(f))
                }
                _ => None,
            })
        };
        // The literal is checked against the sample that runs.
        refused(
            &with_literal(&plan, SAMPLE_FN, 0, 7),
            "whose sample keeps 6 row(s) of each unit while its plan shows 7",
        );
        // Under a session C of 4, K·C = 8 is in force: the bounding with C = 4 and the
        // pre-bounds of 6 rows are refused.
        let c4 = GuardOptions {
            max_rows_contributed: Some(4),
            ..opts
        };
        let bounding_c4 = with_literal(&plan, TOP_GROUPS_FN, 1, 4);
        let m = audit(&bounding_c4, &c4).unwrap_err().to_string();
        assert!(
            m.contains("keeps 6 row(s) of each unit, but the bounds in force say 8"),
            "{m}"
        );
        // A side without its pre-bound (the first `strip` sides met replaced by the rows below
        // the pre-bound): refused.
        let without = |strip: usize| {
            let left = std::cell::Cell::new(strip);
            plan.clone()
                .transform_up(|node| match &node {
                    LogicalPlan::Projection(p) if left.get() > 0 => match p.input.as_ref() {
                        LogicalPlan::Unnest(u)
                            if u.exec_columns.iter().any(|c| c.name == JOIN_SAMPLE) =>
                        {
                            let LogicalPlan::Unnest(v) = u.input.as_ref() else {
                                panic!("the list's unnest")
                            };
                            let LogicalPlan::Aggregate(a) = v.input.as_ref() else {
                                panic!("the aggregate by unit")
                            };
                            let LogicalPlan::Filter(f) = a.input.as_ref() else {
                                panic!("the filter on the unit")
                            };
                            left.set(left.get() - 1);
                            Ok(Transformed::yes(f.input.as_ref().clone()))
                        }
                        _ => Ok(Transformed::no(node)),
                    },
                    _ => Ok(Transformed::no(node)),
                })
                .unwrap()
                .data
        };
        let what =
            "a side of a join of private tables that is not bounded per unit before the join";
        refused(&without(1), what);
        refused(&without(2), what);
    }

    /// Round 48: over a unit-level table the bounding keeps copies of its arguments in structs
    /// and unnests them back; each unnested column holds what its own argument held, so a group
    /// key of 32 copies with two string columns sampled beside it is within the node bound at
    /// every node, and three such keys are not.
    #[tokio::test]
    async fn the_node_bound_follows_the_unit_bounding_field_by_field() {
        use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
        use datafusion::arrow::datatypes::DataType;
        let dir = crate::testdir::test_dir("audit-node-bytes-units");
        let s = crate::PrivateSession::open(
            crate::SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
        )
        .await
        .unwrap();
        let strings = |f: fn(i64) -> String| {
            Arc::new(StringArray::from_iter_values((0..60).map(f))) as ArrayRef
        };
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("u", DataType::Int64, false),
                Field::new("s", DataType::Utf8, true),
                Field::new("s2", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from_iter_values((0..60).map(|i| i % 20))) as ArrayRef,
                strings(|i| format!("s{}", i % 3)),
                strings(|i| format!("t{}", i % 5)),
            ],
        )
        .unwrap();
        s.register_batches(
            "t",
            vec![batch],
            crate::Registration::private()
                .privacy_unit("u")
                .contribution_bounds(2, 3)
                .budget(1000.0, 1e-3),
        )
        .unwrap();
        let k = vec!["s"; 32].join(" || ");
        let keys = |n: usize| {
            let cols: Vec<String> = (0..n).map(|i| format!("'{i}' || {k} AS k{i}")).collect();
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            format!(
                "SELECT dp_count(s, epsilon => 1) AS a, dp_count(s2, epsilon => 1) AS b FROM \
                 (SELECT {}, s, s2, u FROM t) GROUP BY {}",
                cols.join(", "),
                names.join(", ")
            )
        };
        s.check(&keys(1)).await.unwrap();
        let m = s.check(&keys(3)).await.unwrap_err().to_string();
        assert!(m.contains("holds values of up to 96 times a row"), "{m}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
