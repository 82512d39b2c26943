//! The guard: what may touch private rows, checked on the optimized logical plan before anything
//! runs, and the rewrites that make DP aggregates safe (the neighbour argument, partition
//! selection). It also collects every DP call with its literal parameters and its cost.
//!
//! Rules (../shared/spec/PRIVACY.md, "What may be released"):
//! - a scan of a private table may only be reached through a DP aggregate;
//! - between the scan and the DP aggregate only row-wise operations may stand: projection, filter
//!   (without subqueries), aliases; no join, union, window, DISTINCT, LIMIT/OFFSET, ORDER BY,
//!   UNNEST, subquery or second aggregation;
//! - an aggregate over private rows must consist of DP aggregates only, without DISTINCT;
//! - every parameter after the data columns must be a literal, so the cost is known before any
//!   row is read and never depends on the data;
//! - GROUP BY releases the set of groups: unless the table has `replace` neighbours and every
//!   grouping column is public, a noisy-count threshold (partition selection) is added and
//!   charged;
//! - anything above the DP aggregates is post-processing and free.
pub mod table;

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, Filter, LogicalPlan, Projection, col, lit};
use dpfusion_udfs::aggregates::{dp_aggregate_data_args, dp_call_cost, dp_call_cost_with_data};
use dpfusion_udfs::privacy::Event;

use crate::accounting::Neighbours;
pub use table::{GuardedTable, TableInfo};

/// The name of the internal partition-selection aggregate.
pub const PARTITION_SELECT: &str = "dp_partition_select";
const SELECT_ALIAS: &str = "__dpfusion_partition_select";

/// One DP release the query makes, with what it costs.
#[derive(Debug, Clone)]
pub struct DpCall {
    /// The function (`dp_mean`, or `dp_partition_select` for the selection of GROUP BY keys).
    pub function: String,
    /// The call as it appears in the plan.
    pub display: String,
    /// The private table it reads.
    pub table: TableInfo,
    /// Its literal `epsilon`, for display.
    pub epsilon: f64,
    /// Its literal `delta`, for display.
    pub delta: f64,
    /// Its privacy-loss events.
    pub events: Vec<Event>,
}

/// A checked plan, ready to run, and the DP calls it makes.
#[derive(Debug)]
pub struct Guarded {
    pub plan: LogicalPlan,
    pub calls: Vec<DpCall>,
}

fn refuse(msg: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(format!("dpfusion refused the query: {}", msg.into()))
}

/// Checks `plan` (already optimized) and rewrites its DP aggregates.
pub fn guard(plan: LogicalPlan) -> Result<Guarded> {
    let mut calls = Vec::new();
    let plan = visit(plan, &mut calls)?;
    Ok(Guarded { plan, calls })
}

/// The private table read by a raw (non-DP) path below `plan`, if any: DP aggregates are not
/// descended into.
fn raw_private_table(plan: &LogicalPlan) -> Option<TableInfo> {
    let mut found = None;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Aggregate(a) = node
            && is_dp_aggregate(a)
        {
            return Ok(TreeNodeRecursion::Jump);
        }
        if let LogicalPlan::TableScan(s) = node {
            match table_info(s) {
                Some(info) if info.private => {
                    found = Some(info);
                    return Ok(TreeNodeRecursion::Stop);
                }
                None => {
                    found = Some(unknown_table(&s.table_name.to_string()));
                    return Ok(TreeNodeRecursion::Stop);
                }
                _ => {}
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn unknown_table(name: &str) -> TableInfo {
    TableInfo {
        name: name.to_string(),
        key: crate::accounting::TableKey::from(format!("unknown:{name}")),
        private: true,
        neighbours: Neighbours::AddRemove,
        public_columns: vec![],
    }
}

fn table_info(scan: &datafusion::logical_expr::TableScan) -> Option<TableInfo> {
    let provider = source_as_provider(&scan.source).ok()?;
    provider
        .downcast_ref::<GuardedTable>()
        .map(|g| g.info().clone())
}

fn aggregate_function(e: &Expr) -> Option<&AggregateFunction> {
    match e {
        Expr::AggregateFunction(f) => Some(f),
        Expr::Alias(a) => aggregate_function(&a.expr),
        _ => None,
    }
}

fn is_dp_function(name: &str) -> bool {
    dp_aggregate_data_args(name).is_some()
}

fn is_dp_aggregate(a: &Aggregate) -> bool {
    a.aggr_expr.iter().any(|e| {
        aggregate_function(e)
            .map(|f| is_dp_function(f.func.name()))
            .unwrap_or(false)
    })
}

fn dp_alternative(name: &str) -> &'static str {
    match name.to_ascii_lowercase().as_str() {
        "count" => "use dp_count(value, epsilon) instead",
        "sum" => "use dp_sum(value, lower, upper, epsilon) instead",
        "avg" | "mean" => "use dp_mean(value, lower, upper, epsilon) instead",
        _ => "use one of the DP aggregates (dp_count, dp_sum, dp_mean, ...) instead",
    }
}

fn visit(plan: LogicalPlan, calls: &mut Vec<DpCall>) -> Result<LogicalPlan> {
    match &plan {
        LogicalPlan::Aggregate(agg) if is_dp_aggregate(agg) => {
            return rewrite_dp_aggregate(agg, calls);
        }
        LogicalPlan::Aggregate(agg) => {
            if let Some(t) = raw_private_table(&agg.input) {
                let name = agg
                    .aggr_expr
                    .iter()
                    .find_map(|e| aggregate_function(e).map(|f| f.func.name().to_string()))
                    .map(|n| n.to_uppercase());
                return Err(match name {
                    Some(n) => refuse(format!(
                        "the aggregate {n} on private table '{}' is not differentially private; {}.",
                        t.name,
                        dp_alternative(&n)
                    )),
                    None => refuse(format!(
                        "GROUP BY/DISTINCT without a DP aggregate on private table '{}' would release \
                         its raw values; group inside a DP aggregate query, e.g. SELECT key, \
                         dp_count(key, 1.0) FROM {} GROUP BY key.",
                        t.name, t.name
                    )),
                });
            }
        }
        LogicalPlan::TableScan(scan) => {
            let info =
                table_info(scan).unwrap_or_else(|| unknown_table(&scan.table_name.to_string()));
            if info.private {
                return Err(refuse(format!(
                    "reading raw rows of private table '{}' is not allowed. Only DP aggregates may \
                     read a private table, e.g. SELECT dp_count(col, 1.0) or dp_mean(col, lower, \
                     upper, epsilon) FROM {}.",
                    info.name, info.name
                )));
            }
        }
        LogicalPlan::Window(w) => {
            let dp_window = w.window_expr.iter().any(|e| {
                let mut found = false;
                let _ = e.apply(|x| {
                    if let Expr::WindowFunction(wf) = x
                        && is_dp_function(wf.fun.name())
                    {
                        found = true;
                    }
                    Ok(TreeNodeRecursion::Continue)
                });
                found
            });
            if let Some(t) = raw_private_table(&w.input) {
                return Err(refuse(format!(
                    "window functions on private table '{}' are not allowed: a window releases a \
                     value per row{}. Use GROUP BY with DP aggregates instead.",
                    t.name,
                    if dp_window {
                        ", and a DP aggregate evaluated as a window would release many noisy copies of the same data"
                    } else {
                        ""
                    }
                )));
            }
        }
        LogicalPlan::Analyze(_) => {
            return Err(refuse(
                "EXPLAIN ANALYZE runs the query and prints exact row counts; use EXPLAIN PRIVACY <query> to see what a query would cost.",
            ));
        }
        _ => {}
    }
    let plan = plan
        .map_subqueries(|sub| visit(sub, calls).map(Transformed::yes))?
        .data;
    Ok(plan
        .map_children(|child| visit(child, calls).map(Transformed::yes))?
        .data)
}

/// What stands between a DP aggregate and its scan.
#[derive(Debug, Default)]
struct RowLocal {
    table: Option<TableInfo>,
    filtered: bool,
}

fn construct_name(plan: &LogicalPlan) -> &'static str {
    match plan {
        LogicalPlan::Join(_) => "a JOIN",
        LogicalPlan::Union(_) => "a UNION",
        LogicalPlan::Window(_) => "a window function",
        LogicalPlan::Aggregate(_) => {
            "a second aggregation (GROUP BY or an aggregate in a subquery)"
        }
        LogicalPlan::Distinct(_) => "DISTINCT",
        LogicalPlan::Limit(_) => "LIMIT/OFFSET",
        LogicalPlan::Sort(_) => "ORDER BY",
        LogicalPlan::Unnest(_) => "UNNEST",
        LogicalPlan::RecursiveQuery(_) => "a recursive query",
        LogicalPlan::Subquery(_) => "a subquery",
        LogicalPlan::Repartition(_) => "a repartition",
        LogicalPlan::Extension(_) => "an extension node",
        _ => "this operation",
    }
}

fn has_subquery(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if matches!(
            x,
            Expr::ScalarSubquery(_)
                | Expr::InSubquery(_)
                | Expr::Exists(_)
                | Expr::SetComparison(_)
        ) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn has_nested_aggregate_or_window(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if matches!(x, Expr::AggregateFunction(_) | Expr::WindowFunction(_)) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn any_private_name(plan: &LogicalPlan) -> String {
    let mut name = None;
    let _ = plan.apply_with_subqueries(|n| {
        if let LogicalPlan::TableScan(s) = n {
            let info = table_info(s).unwrap_or_else(|| unknown_table(&s.table_name.to_string()));
            if info.private {
                name = Some(info.name);
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    name.unwrap_or_else(|| "?".to_string())
}

fn check_row_local(plan: &LogicalPlan, out: &mut RowLocal) -> Result<()> {
    let not_row_local = |what: &str, plan: &LogicalPlan| {
        refuse(format!(
            "{what} between private table '{}' and a DP aggregate is not allowed: only row-wise \
             operations (projection, filter, CAST, CASE, scalar functions) may stand between a \
             private scan and a DP function, since anything else can make one row count more than \
             once or leak its presence. Aggregate each table with DP functions first, then combine \
             the results.",
            any_private_name(plan)
        ))
    };
    match plan {
        LogicalPlan::TableScan(scan) => {
            let info =
                table_info(scan).unwrap_or_else(|| unknown_table(&scan.table_name.to_string()));
            if scan.fetch.is_some() {
                return Err(not_row_local("LIMIT", plan));
            }
            if !scan.filters.is_empty() {
                out.filtered = true;
            }
            if info.private {
                if let Some(prev) = &out.table
                    && prev.key != info.key
                {
                    return Err(not_row_local("reading two tables", plan));
                }
                out.table = Some(info);
            }
            Ok(())
        }
        LogicalPlan::Projection(p) => {
            for e in &p.expr {
                if has_subquery(e) {
                    return Err(not_row_local("a subquery", plan));
                }
                if has_nested_aggregate_or_window(e) {
                    return Err(not_row_local("an aggregate or window function", plan));
                }
            }
            check_row_local(&p.input, out)
        }
        LogicalPlan::Filter(f) => {
            if has_subquery(&f.predicate) {
                return Err(not_row_local("a subquery in WHERE", plan));
            }
            out.filtered = true;
            check_row_local(&f.input, out)
        }
        LogicalPlan::SubqueryAlias(s) => check_row_local(&s.input, out),
        LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => Ok(()),
        other => {
            if raw_private_table(other).is_none() && !plan_reads_private(other) {
                // A public relation (e.g. VALUES joined with a public table): harmless.
                return Ok(());
            }
            Err(not_row_local(construct_name(other), other))
        }
    }
}

fn plan_reads_private(plan: &LogicalPlan) -> bool {
    plan.exists(|n| {
        Ok(matches!(n, LogicalPlan::TableScan(s)
            if table_info(s).map(|i| i.private).unwrap_or(true)))
    })
    .unwrap_or(true)
}

/// The base-table columns an expression over `plan`'s output depends on, traced through
/// projections and aliases. None when it cannot be traced (treated as private).
fn base_columns(expr: &Expr, plan: &LogicalPlan) -> Option<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for c in expr.column_refs() {
        out.extend(trace_column(c, plan)?);
    }
    Some(out)
}

fn trace_column(c: &Column, plan: &LogicalPlan) -> Option<BTreeSet<String>> {
    match plan {
        LogicalPlan::TableScan(_) => Some(BTreeSet::from([c.name.to_ascii_lowercase()])),
        LogicalPlan::Projection(p) => {
            let idx = p.schema.index_of_column(c).ok()?;
            let e = &p.expr[idx];
            let inner = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                e => e,
            };
            base_columns(inner, &p.input)
        }
        LogicalPlan::Filter(f) => trace_column(c, &f.input),
        LogicalPlan::SubqueryAlias(s) => {
            let idx = s.schema.index_of_column(c).ok()?;
            let (q, f) = s.input.schema().qualified_field(idx);
            trace_column(&Column::new(q.cloned(), f.name()), &s.input)
        }
        _ => None,
    }
}

/// A literal parameter, through the casts and negations the planner may leave around it.
fn literal(e: &Expr) -> Option<ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Alias(a) => literal(&a.expr),
        Expr::Cast(c) => literal(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => literal(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::Negative(inner) => literal(inner)?.arithmetic_negate().ok(),
        _ => None,
    }
}

fn as_f64(v: &ScalarValue) -> f64 {
    match v.cast_to(&datafusion::arrow::datatypes::DataType::Float64) {
        Ok(ScalarValue::Float64(Some(x))) => x,
        _ => f64::NAN,
    }
}

fn neighbours_literal(mode: &str) -> Expr {
    lit(mode)
}

fn rewrite_dp_aggregate(agg: &Aggregate, calls: &mut Vec<DpCall>) -> Result<LogicalPlan> {
    // 1. every aggregate over these rows must be a DP aggregate
    for e in &agg.aggr_expr {
        let Some(f) = aggregate_function(e) else {
            return Err(refuse(format!("unsupported aggregate expression {e}")));
        };
        let name = f.func.name();
        if !is_dp_function(name) {
            let t = any_private_name(&agg.input);
            return Err(refuse(format!(
                "the aggregate {} is computed together with DP aggregates over private table '{t}' \
                 but is not differentially private; {}.",
                name.to_uppercase(),
                dp_alternative(name)
            )));
        }
        if f.params.distinct {
            return Err(refuse(format!(
                "DISTINCT inside {name} is not supported: it changes how much one row can \
                 contribute. Remove DISTINCT."
            )));
        }
        if let Some(filter) = &f.params.filter
            && has_subquery(filter)
        {
            return Err(refuse(format!(
                "a subquery in the FILTER clause of {name} is not allowed"
            )));
        }
    }
    // 2. what stands between the aggregate and the scan
    let mut below = RowLocal::default();
    check_row_local(&agg.input, &mut below)?;
    let Some(table) = below.table.clone() else {
        // Only public data below: nothing to protect or charge.
        return Ok(LogicalPlan::Aggregate(agg.clone()));
    };
    // 3. grouping keys
    let mut keys_public = true;
    for g in &agg.group_expr {
        if matches!(g, Expr::GroupingSet(_)) {
            return Err(refuse(format!(
                "GROUPING SETS, ROLLUP and CUBE on private table '{}' are not supported: run one \
                 GROUP BY per grouping.",
                table.name
            )));
        }
        if has_subquery(g) {
            return Err(refuse("a subquery in GROUP BY is not allowed"));
        }
        match base_columns(g, &agg.input) {
            Some(cols) if cols.iter().all(|c| table.is_public_column(c)) => {}
            _ => keys_public = false,
        }
    }
    let grouped = !agg.group_expr.is_empty();
    let has_filter_clause = agg.aggr_expr.iter().any(|e| {
        aggregate_function(e)
            .map(|f| f.params.filter.is_some())
            .unwrap_or(false)
    });
    let mode = match table.neighbours {
        Neighbours::AddRemove => "add_remove",
        Neighbours::Replace => {
            if !below.filtered && !has_filter_clause && keys_public {
                "replace_public_n"
            } else {
                "replace"
            }
        }
    };
    let needs_selection = grouped && !(table.neighbours == Neighbours::Replace && keys_public);

    // 4. parameters, costs, and the rewritten calls
    let n_group = agg.group_expr.len();
    let mut new_aggr = Vec::with_capacity(agg.aggr_expr.len() + 1);
    let mut min_call: Option<(f64, f64)> = None;
    for (i, e) in agg.aggr_expr.iter().enumerate() {
        let f = aggregate_function(e).expect("checked above");
        let name = f.func.name().to_string();
        let data_args = dp_aggregate_data_args(&name).unwrap_or(1);
        // rgm_mean_by (issue 5): the group sizes must be public (see `check_rgm_mean_by`).
        if name == dpfusion_udfs::aggregates::RgmMeanBy::NAME {
            check_rgm_mean_by(
                &table,
                &below,
                has_filter_clause,
                keys_public,
                &f.params.args,
                &agg.input,
            )?;
        }
        let mut params = Vec::new();
        for (j, a) in f.params.args.iter().enumerate().skip(data_args) {
            match literal(a) {
                Some(v) => params.push(v),
                None => {
                    return Err(refuse(format!(
                        "argument {} of {name} must be a literal number written in the query \
                         (got {a}): a query's cost may not depend on the data.",
                        j + 1
                    )));
                }
            }
        }
        // The neighbour relation is the table's, never the user's.
        let mut with_mode = params.clone();
        // The user-facing parameters end with epsilon, delta; the session always fills delta.
        with_mode.push(ScalarValue::Utf8(Some(mode.to_string())));
        // The data arguments' shape as written (e.g. a feature list's length), never data.
        let events = match dp_call_cost_with_data(&name, &f.params.args[..data_args], &with_mode) {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => return Err(DataFusionError::Plan(format!("{name}: {e}"))),
            None => return Err(refuse(format!("{name} is not a DP aggregate"))),
        };
        let (eps, delta) = epsilon_delta(&name, &params);
        if min_call.map(|(e0, _)| eps < e0).unwrap_or(true) {
            min_call = Some((eps, delta));
        }
        calls.push(DpCall {
            function: name.clone(),
            display: display_call(&name, &f.params.args[..data_args], &params),
            table: table.clone(),
            epsilon: eps,
            delta,
            events,
        });
        let mut args = f.params.args[..data_args].to_vec();
        args.extend(params.into_iter().map(|v| Expr::Literal(v, None)));
        args.push(neighbours_literal(mode));
        let mut nf = f.clone();
        nf.params.args = args;
        let (q, field) = agg.schema.qualified_field(n_group + i);
        new_aggr.push(Expr::AggregateFunction(nf).alias_qualified(q.cloned(), field.name()));
    }
    if !needs_selection {
        let new = Aggregate::try_new(agg.input.clone(), agg.group_expr.clone(), new_aggr)?;
        return Ok(LogicalPlan::Aggregate(new));
    }
    // 5. partition selection: keep a group only if its noisy count passes a threshold.
    let (eps, delta) = min_call.expect("at least one DP call");
    let sel_params = vec![
        ScalarValue::Float64(Some(eps)),
        ScalarValue::Float64(Some(delta)),
    ];
    let events = match dp_call_cost(PARTITION_SELECT, &sel_params) {
        Some(Ok(ev)) => ev,
        Some(Err(e)) => return Err(DataFusionError::Plan(format!("partition selection: {e}"))),
        None => {
            return Err(DataFusionError::Internal(
                "dp_partition_select missing".into(),
            ));
        }
    };
    let udaf = dpfusion_udfs::aggregates::all_udafs()
        .into_iter()
        .find(|u| u.name() == PARTITION_SELECT)
        .ok_or_else(|| DataFusionError::Internal("dp_partition_select missing".into()))?;
    let sel = Expr::AggregateFunction(AggregateFunction::new_udf(
        Arc::new(udaf),
        vec![lit(1i64), lit(eps), lit(delta)],
        false,
        None,
        vec![],
        None,
    ))
    .alias(SELECT_ALIAS);
    calls.push(DpCall {
        function: PARTITION_SELECT.to_string(),
        display: format!(
            "partition selection of the GROUP BY keys (noisy count ≥ threshold, ε = {eps}, δ = {delta})"
        ),
        table,
        epsilon: eps,
        delta,
        events,
    });
    let mut aggr = new_aggr;
    aggr.push(sel);
    let new = Aggregate::try_new(agg.input.clone(), agg.group_expr.clone(), aggr)?;
    let filter = Filter::try_new(col(SELECT_ALIAS), Arc::new(LogicalPlan::Aggregate(new)))?;
    let cols: Vec<Expr> = agg
        .schema
        .iter()
        .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
        .collect();
    let proj = Projection::try_new(cols, Arc::new(LogicalPlan::Filter(filter)))?;
    Ok(LogicalPlan::Projection(proj))
}

/// A DP call as the user would write it: `dp_mean(age, lower => 0, upper => 100, epsilon => 0.5,
/// delta => 1e-7)` (column names unqualified, every parameter named, defaults filled in).
fn display_call(name: &str, data: &[Expr], params: &[ScalarValue]) -> String {
    let spec = crate::statements::named_args::dp_function_params(name).unwrap_or(&[]);
    let mut parts: Vec<String> = data
        .iter()
        .map(|e| match e {
            Expr::Column(c) => c.name.clone(),
            e => e.to_string(),
        })
        .collect();
    for (i, v) in params.iter().enumerate() {
        let value = match v {
            ScalarValue::Utf8(Some(s)) => format!("'{s}'"),
            ScalarValue::Boolean(Some(b)) => b.to_string(),
            v => {
                let x = as_f64(v);
                if x.is_finite() {
                    format!("{x}")
                } else {
                    v.to_string()
                }
            }
        };
        match spec.get(data.len() + i) {
            Some(p) => parts.push(format!("{} => {value}", p.name)),
            None => parts.push(value),
        }
    }
    format!("{name}({})", parts.join(", "))
}

/// The (epsilon, delta) literals of a DP call, by the user-facing parameter list.
fn epsilon_delta(name: &str, params: &[ScalarValue]) -> (f64, f64) {
    let Some(spec) = crate::statements::named_args::dp_function_params(name) else {
        return (f64::NAN, f64::NAN);
    };
    let data = dp_aggregate_data_args(name).unwrap_or(1);
    let pos = |p: &str| spec.iter().position(|x| x.name == p).map(|i| i - data);
    let get = |p: &str| {
        pos(p)
            .and_then(|i| params.get(i))
            .map(as_f64)
            .unwrap_or(f64::NAN)
    };
    (get("epsilon"), get("delta"))
}

// ---- rgm_mean_by (issue 5) ----------------------------------------------------------------------

/// `rgm_mean_by` calibrates its noise to each group's size, so the sizes must be public and the
/// same in every neighbouring dataset: a `replace` table, `by` and every GROUP BY key public, no
/// WHERE filter below the aggregate and no FILTER clause (exactly the case where the guard sets
/// 'replace_public_n'). Refuses otherwise, naming the table and every reason.
fn check_rgm_mean_by(
    table: &TableInfo,
    below: &RowLocal,
    has_filter_clause: bool,
    keys_public: bool,
    args: &[Expr],
    input: &LogicalPlan,
) -> Result<()> {
    let by = args.get(1);
    let by_name = by
        .map(|e| match e {
            Expr::Column(c) => c.name.clone(),
            e => e.to_string(),
        })
        .unwrap_or_default();
    let by_public = by
        .and_then(|e| base_columns(e, input))
        .is_some_and(|cols| cols.iter().all(|c| table.is_public_column(c)));
    let mut why: Vec<String> = Vec::new();
    if table.neighbours != Neighbours::Replace {
        why.push(
            "it is registered with add_remove neighbours (its number of rows, hence every group's \
             size, is private)"
                .into(),
        );
    }
    if !by_public {
        why.push(format!("`by` ({by_name}) is not a public column of it"));
    }
    if below.filtered {
        why.push(
            "a WHERE filter stands between the table and rgm_mean_by (the filtered group sizes \
             depend on private values)"
                .into(),
        );
    }
    if has_filter_clause {
        why.push("an aggregate of the query has a FILTER clause".into());
    }
    if !keys_public {
        why.push("GROUP BY uses a column that is not public".into());
    }
    if why.is_empty() {
        return Ok(());
    }
    Err(refuse(format!(
        "rgm_mean_by on table '{}' needs public group sizes (the relative Gaussian mechanism \
         calibrates its noise to each group's size), but {}. Register the table with OPTIONS \
         ('dp.neighbours' 'replace', 'dp.public_columns' '{by_name}'), group only by public \
         columns, and do not filter the rows (filter the released list instead).",
        table.name,
        why.join("; and ")
    )))
}
