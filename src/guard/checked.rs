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
//!     dpfusion::guard::CheckedPlan { plan, calls: vec![], tables: vec![], private: false }
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
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Projection, col, lit,
};

use super::join::PublicSide;
use super::table::{GuardedTable, TableInfo};
use super::units::{GROUP_KEY_FN, GroupKey, SAMPLE, SAMPLE_FN, Sample, TOTAL, UNIT};
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

    /// The schema of its result.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.plan.schema().as_arrow().clone())
    }

    fn new(plan: LogicalPlan, calls: Vec<DpCall>) -> Self {
        let mut tables: Vec<String> = calls.iter().map(|c| c.table.name.clone()).collect();
        tables.sort();
        tables.dedup();
        let private = !calls.is_empty() || any_private_table(&plan).is_some();
        Self {
            plan,
            calls,
            tables,
            private,
        }
    }
}

/// Checks `plan` (as the SQL planner made it): optimizes it, guards and rewrites it, settles the
/// public sides of its joins, audits the result; the checked plan, or why it is refused. Nothing
/// of the analyst's runs here except the public sides of joins, each after it was checked public.
pub async fn check(
    state: &SessionState,
    plan: &LogicalPlan,
    opts: GuardOptions,
) -> Result<CheckedPlan> {
    let (plan, calls) = check_query(state, plan, opts).await?;
    Ok(CheckedPlan::new(plan, calls))
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
    Ok(CheckedPlan::new(plan, calls))
}

async fn check_query(
    state: &SessionState,
    plan: &LogicalPlan,
    opts: GuardOptions,
) -> Result<(LogicalPlan, Vec<DpCall>)> {
    let optimized = state.optimize(plan)?;
    let guarded = super::guard_with(optimized, opts)?;
    // Audited before the public sides run too, so a refused query runs nothing at all.
    audit(&guarded.plan)?;
    let plan = settle(state, guarded.plan, &guarded.public_sides).await?;
    audit(&plan)?;
    Ok((plan, guarded.calls))
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
        let name = format!("__dpfusion_public_{i}");
        let mem = MemTable::try_new(arrow_schema, vec![batches])?;
        // A public table for the guard and the audit (its rows are the public side's).
        let info = TableInfo {
            name: name.clone(),
            key: crate::accounting::TableKey::from(format!("settled:{name}")),
            private: false,
            ..unknown_table(&name)
        };
        let table = Arc::new(GuardedTable::new(Arc::new(mem), info));
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
        let dup = LogicalPlanBuilder::from(rows.clone())
            .aggregate(
                side.keys.clone(),
                vec![datafusion::functions_aggregate::expr_fn::count(lit(1)).alias("n")],
            )?
            .filter(col("n").gt(lit(1i64)))?
            .limit(0, Some(1))?
            .build()?;
        let physical = state.create_physical_plan(&dup).await?;
        let found = datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        if let Some(b) = found.iter().find(|b| b.num_rows() > 0) {
            let show = |k: usize| {
                datafusion::arrow::util::display::array_value_to_string(b.column(k), 0)
                    .unwrap_or_default()
            };
            // The keys' columns, then the count (the aggregate keeps a key written twice once).
            let n = b.num_columns() - 1;
            let keys: Vec<String> = side.keys.iter().map(|k| k.to_string()).collect();
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
pub(super) fn audit(plan: &LogicalPlan) -> Result<()> {
    audit_node(plan)
}

/// A node outside any private region (post-processing of releases, or public work).
fn audit_node(plan: &LogicalPlan) -> Result<()> {
    match plan {
        LogicalPlan::Aggregate(a)
            if is_dp_aggregate(a) && raw_private_table(&a.input).is_some() =>
        {
            return audit_dp_aggregate(a);
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
    audit_subqueries_of(plan)?;
    for child in plan.inputs() {
        audit_node(child)?;
    }
    Ok(())
}

/// The subqueries in `plan`'s own expressions, each audited as a query of its own.
fn audit_subqueries_of(plan: &LogicalPlan) -> Result<()> {
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
        audit_node(s)?;
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
fn region_expr(e: &Expr, schema: &DFSchema, place: &str) -> Result<()> {
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
        audit_node(&s)?;
    }
    let inner = total::unwrap(e.clone())?;
    match fragment::check_expr_typed(&inner, schema) {
        None => Ok(()),
        Some(why) => Err(audit_refusal(format_args!("{why} in {place}"))),
    }
}

/// A DP aggregate over private rows: its calls, arguments, FILTER and GROUP BY, then its region.
fn audit_dp_aggregate(a: &Aggregate) -> Result<()> {
    for g in &a.group_expr {
        region_expr(g, a.input.schema(), "GROUP BY")?;
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
            region_expr(arg, a.input.schema(), &place)?;
        }
        if let Some(filter) = &f.params.filter {
            region_expr(
                filter,
                a.input.schema(),
                &format!("the FILTER clause of {name}"),
            )?;
        }
    }
    audit_region(&a.input)
}

/// The private region below a DP aggregate: the fragment's nodes, the guard's bounding shapes,
/// joins of the allowed forms.
fn audit_region(plan: &LogicalPlan) -> Result<()> {
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
            for e in &p.expr {
                region_expr(e, p.input.schema(), "SELECT")?;
            }
            audit_region(&p.input)
        }
        LogicalPlan::Aggregate(a) => {
            audit_bounding_aggregate(a)?;
            audit_region(&a.input)
        }
        // The unit bounding's sample of rows back as rows (units.rs), and nothing else.
        LogicalPlan::Unnest(u) if u.exec_columns.iter().all(|c| c.name == SAMPLE) => {
            audit_region(&u.input)
        }
        LogicalPlan::Filter(f) => {
            region_expr(&f.predicate, f.input.schema(), "WHERE")?;
            audit_region(&f.input)
        }
        LogicalPlan::SubqueryAlias(s) => audit_region(&s.input),
        LogicalPlan::Window(w) => {
            for e in &w.window_expr {
                audit_bounding_window(e, w.input.schema())?;
            }
            audit_region(&w.input)
        }
        LogicalPlan::Join(j) => audit_region_join(j),
        other => Err(audit_refusal(format_args!(
            "{} between a private table and a DP aggregate",
            construct_name(other)
        ))),
    }
}

/// A join inside a private region: one private side (a region) and one public side (no private
/// table anywhere in it), or two private sides (a join on the unit columns); equality keys; no
/// FULL join; keys and condition over private rows.
fn audit_region_join(j: &Join) -> Result<()> {
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
    for (l, r) in &j.on {
        region_expr(l, j.left.schema(), "the JOIN keys")?;
        region_expr(r, j.right.schema(), "the JOIN keys")?;
    }
    if let Some(f) = &j.filter {
        region_expr(f, &j.schema, "the JOIN condition")?;
    }
    let left = any_private_table(&j.left).is_some();
    let right = any_private_table(&j.right).is_some();
    match (left, right) {
        (true, true) => {
            audit_region(&j.left)?;
            audit_region(&j.right)
        }
        (true, false) => {
            audit_region(&j.left)?;
            audit_node(&j.right)
        }
        (false, true) => {
            audit_node(&j.left)?;
            audit_region(&j.right)
        }
        (false, false) => Err(audit_refusal(
            "a JOIN that reads no private table in a private region",
        )),
    }
}

/// A window over private rows: only unit bounding's group choice (units.rs) over the (unit,
/// group) rows, `row_number() OVER (PARTITION BY __dpfusion_unit ORDER BY
/// __dpfusion_unit_group_key(__dpfusion_unit, g…))`, the keys in the fragment.
fn audit_bounding_window(e: &Expr, schema: &DFSchema) -> Result<()> {
    let bad = || audit_refusal(format_args!("the window function {e} over private rows"));
    let Expr::WindowFunction(w) = e else {
        return Err(bad());
    };
    let WindowFunction { fun, params } = w.as_ref();
    if params.filter.is_some()
        || params.null_treatment.is_some()
        || params.distinct
        || fun.name() != "row_number"
        || !params.args.is_empty()
        || params.partition_by.len() != 1
        || !is_col(&params.partition_by[0], UNIT)
        || params.order_by.len() != 1
    {
        return Err(bad());
    }
    match &params.order_by[0].expr {
        Expr::ScalarFunction(f)
            if f.name() == GROUP_KEY_FN
                && (f.func.inner().as_ref() as &dyn std::any::Any).is::<GroupKey>()
                && f.args.first().is_some_and(|a| is_col(a, UNIT)) =>
        {
            for g in &f.args[1..] {
                region_expr(g, schema, "the GROUP BY keys of the unit bounding")?;
            }
            Ok(())
        }
        _ => Err(bad()),
    }
}

fn is_col(x: &Expr, name: &str) -> bool {
    matches!(x, Expr::Column(c) if c.name == name)
}

/// An aggregate over private rows below a DP aggregate: only unit bounding's per-(unit, group)
/// aggregate (units.rs): GROUP BY `unit AS __dpfusion_unit`, g…; each aggregate either
/// `sum(v) AS __dpfusion_total_i` (`v` a dp_sum call's argument, under its FILTER, in the
/// fragment) or `__dpfusion_unit_sample(C, columns…) AS __dpfusion_sample`.
fn audit_bounding_aggregate(a: &Aggregate) -> Result<()> {
    let schema = a.input.schema();
    let unit_first = matches!(a.group_expr.first(), Some(Expr::Alias(al)) if al.name == UNIT);
    if !unit_first {
        return Err(audit_refusal(
            "an aggregate (other than a DP aggregate) between a private table and a DP aggregate",
        ));
    }
    for (i, g) in a.group_expr.iter().enumerate() {
        let g = match g {
            Expr::Alias(al) if i == 0 => al.expr.as_ref(),
            g => g,
        };
        region_expr(g, schema, "the GROUP BY keys of the unit bounding")?;
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
            ("sum", [v]) if al.name.starts_with(TOTAL) => match v {
                // CASE WHEN filter THEN value END, both in the fragment (checked apart, as the
                // guard checked the call's argument and FILTER apart).
                Expr::Case(c) if c.expr.is_none() && c.else_expr.is_none() => {
                    for (w, t) in &c.when_then_expr {
                        region_expr(w, schema, "the FILTER clause of dp_sum (unit bounding)")?;
                        region_expr(t, schema, "the argument of dp_sum (unit bounding)")?;
                    }
                }
                v => region_expr(v, schema, "the argument of dp_sum (unit bounding)")?,
            },
            (SAMPLE_FN, [Expr::Literal(..), cols @ ..])
                if al.name == SAMPLE
                    && (f.func.inner().as_ref() as &dyn std::any::Any).is::<Sample>()
                    && cols.iter().all(|c| matches!(c, Expr::Column(_))) =>
            {
                for c in cols {
                    region_expr(c, schema, "the rows sampled by the unit bounding")?;
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
        assert!(audit(&scan).is_err());
        // Behind a projection of a public VALUES join, too.
        let p = LogicalPlanBuilder::from(scan)
            .project(vec![col("x") + lit(1)])
            .unwrap()
            .build()
            .unwrap();
        let m = audit(&p).unwrap_err().to_string();
        assert!(m.contains("raw rows of private table 'p'"), "{m}");
        let values = LogicalPlanBuilder::values(vec![vec![lit(1)]])
            .unwrap()
            .build()
            .unwrap();
        assert!(audit(&values).is_ok());
    }
}
