//! Contribution bounding on unit-level tables (docs/PRIVACY.md, "Privacy units").
//!
//! A table with a privacy unit column protects all the rows of one unit (a customer, a patient):
//! neighbouring datasets differ by adding or removing one unit with every row it has. Before any
//! noise, the guard rewrites the plan between the private region and the DP aggregate so that
//! each unit's contribution is bounded, whatever the data, then calibrates every call to those
//! bounds (the udfs mode `units:K:C`, `Neighbours::Units`):
//!
//! ```text
//! Aggregate  GROUP BY g: the DP calls, each with the FILTER of its contribution kind
//!   Filter   __dpfusion_gr <= K                                  (L0; only with GROUP BY)
//!     Window dense_rank() OVER (PARTITION BY unit ORDER BY __dpfusion_gk, g) AS __dpfusion_gr
//!       Window row_number() OVER (PARTITION BY unit, g ORDER BY __dpfusion_r1) AS __dpfusion_rn,
//!              first_value(__dpfusion_r2) OVER (same) AS __dpfusion_gk,
//!              sum(value) OVER (PARTITION BY unit, g) AS __dpfusion_total_i   (per dp_sum call)
//!         Projection  *, unit AS __dpfusion_unit, random() AS __dpfusion_r1, random() AS __dpfusion_r2
//!           the private region (scan, WHERE, projections, joins), the unit column carried up
//! ```
//!
//! - **L0** (Wilson et al., "Differentially Private SQL with Bounded User Contribution", PoPETs
//!   2020, §3 "contribution bounding"): each unit keeps at most K of its groups, chosen
//!   uniformly at random per query: every (unit, group) gets a uniform key (`__dpfusion_gk`, the
//!   second random number of a row that is first in an independent random order, so independent
//!   of the group's size), and a unit keeps its K groups of smallest key (ties broken by the
//!   group value, so never more than K).
//! - **L∞** per call, by what the call needs:
//!   - [`Contribution::Rows`] (`dp_count`, `dp_mean`): at most C rows of each (unit, group), the
//!     first C in a uniformly random order (`__dpfusion_rn <= C`);
//!   - [`Contribution::Total`] (`dp_sum`): the unit's total per group, one value (`SUM(value)
//!     OVER (PARTITION BY unit, g)` on the unit's first row), which `dp_sum` clamps to [lower,
//!     upper] like any value: the per-unit pre-aggregation of ZetaSQL's `ANON_SUM`;
//!   - [`Contribution::Once`] (`dp_count_distinct`, partition selection): one per (unit, group);
//!   - [`Contribution::PerUnit`] (the models): every row, with the unit key passed to the model,
//!     which clips each unit's summed gradient (McMahan et al. 2018).
//!
//! Each selection depends only on the unit's own rows and on randomness, so after it one unit
//! changes at most K groups, and each by at most C rows (or one value): the sensitivity bounds of
//! `units:K:C` hold for every data set. Rows whose unit is NULL belong to no unit: every call's
//! FILTER leaves them out (they stay in the plan only so that the NULL-extended row of a public
//! key set keeps its group, join.rs). The random numbers come from DataFusion's `random()`, a per-thread ChaCha generator seeded
//! by the operating system; privacy does not rest on them (any selection rule that reads only the
//! unit's own rows keeps the bounds), only the absence of bias does.
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DataFusionError, Result};
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    Expr, ExprFunctionExt, Filter, Join, LogicalPlan, LogicalPlanBuilder, Projection,
    SubqueryAlias, TableScanBuilder, WindowFunctionDefinition, cast, col, lit, when,
};

use super::{TableInfo, bare_column, refuse};

/// The unit-level count of distinct units.
pub const COUNT_DISTINCT: &str = "dp_count_distinct";

pub(super) const UNIT: &str = "__dpfusion_unit";
pub(super) const R1: &str = "__dpfusion_r1";
pub(super) const R2: &str = "__dpfusion_r2";
pub(super) const RN: &str = "__dpfusion_rn";
pub(super) const GK: &str = "__dpfusion_gk";
pub(super) const GR: &str = "__dpfusion_gr";
pub(super) const TOTAL: &str = "__dpfusion_total_";

/// The bounds in force for one query on a unit-level table.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// The unit column.
    pub column: String,
    /// K: groups per unit (1 without GROUP BY: there is one group).
    pub groups: u32,
    /// C: rows per unit and group, for row-level statistics.
    pub rows: u32,
    /// K as the owner or the session set it (shown even without GROUP BY).
    pub declared_groups: u32,
}

/// How one unit contributes to a call after bounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contribution {
    /// At most C rows of each (unit, group).
    Rows,
    /// One value per (unit, group): the unit's total, clamped by the call.
    Total,
    /// Once per (unit, group).
    Once,
    /// Every row; the call clips the unit's summed gradient.
    PerUnit,
}

impl Bounds {
    /// The udfs neighbour mode a call is calibrated for: `units:K:C`, with C = 1 unless the call
    /// reads up to C rows of each (unit, group).
    pub fn mode(&self, how: Contribution) -> String {
        let c = if how == Contribution::Rows {
            self.rows
        } else {
            1
        };
        format!("units:{}:{c}", self.groups)
    }

    /// The bounds as EXPLAIN PRIVACY shows them.
    pub fn describe(&self, how: Contribution) -> String {
        let groups = if self.groups == 1 && self.declared_groups != 1 {
            "1 group (no GROUP BY)".to_string()
        } else {
            format!("≤ {} group(s)", self.groups)
        };
        let within = match how {
            Contribution::Rows => format!("≤ {} row(s) per group", self.rows),
            Contribution::Total => "its total per group, clamped".to_string(),
            Contribution::Once => "counted once per group".to_string(),
            Contribution::PerUnit => "its summed gradient clipped".to_string(),
        };
        format!("unit {}: {groups}, {within}", self.column)
    }
}

/// How a unit contributes to the call `name`, or why the call is refused on a unit-level table.
pub fn contribution(
    name: &str,
    data: &[Expr],
    has_filter: bool,
    input: &LogicalPlan,
    table: &TableInfo,
) -> Result<Contribution> {
    let unit = table.unit.as_ref().map(|u| u.column.as_str()).unwrap_or("");
    // A `_ci` variant contributes as its base function (`dp_mean_ci` as `dp_mean`).
    let name = dpfusion_udfs::aggregates::registry::base_of(name).map_or(name, |a| a.name);
    match name {
        "dp_count" | "dp_mean" | "dp_variance" | "dp_stddev" | "dp_quantile" | "dp_median"
        | "dp_quantiles" => Ok(Contribution::Rows),
        "dp_sum" => Ok(Contribution::Total),
        "dp_linreg_gd" | "dp_logreg_agd" | "dp_linreg_sgd" | "dp_logreg_sgd" | "dp_mlp_sgd" => {
            Ok(Contribution::PerUnit)
        }
        COUNT_DISTINCT => {
            let arg = data.first().and_then(|e| bare_column(e, input));
            if arg.as_deref() != Some(unit) {
                return Err(refuse(format!(
                    "dp_count_distinct counts the privacy units of table '{}': its argument must \
                     be the unit column '{unit}' itself, e.g. dp_count_distinct({unit}, epsilon \
                     => 1). To count the distinct values of another column, GROUP BY it and count \
                     units per group.",
                    table.name
                )));
            }
            if has_filter {
                return Err(refuse(
                    "dp_count_distinct with a FILTER clause is not supported; put the condition \
                     in WHERE",
                ));
            }
            Ok(Contribution::Once)
        }
        "rgm_mean_by" => Err(refuse(format!(
            "rgm_mean_by needs public group sizes, but table '{}' protects privacy units \
             (column '{unit}'): a unit's number of rows, and so every group's size, is private. \
             Use dp_mean per group instead.",
            table.name
        ))),
        other => Err(refuse(format!(
            "{other} is not supported on table '{}', which protects privacy units",
            table.name
        ))),
    }
}

/// The refusal of `dp_count_distinct` on a table whose unit is one row.
pub fn count_distinct_needs_unit(table: &TableInfo) -> DataFusionError {
    refuse(format!(
        "dp_count_distinct counts privacy units, and table '{}' declares none (each row is its \
         own unit): use dp_count instead. The data owner declares a unit column with \
         privacy_unit = \"<column>\" in the catalog.",
        table.name
    ))
}

/// `__dpfusion_rn = 1` of a row with a unit: the first row of each (unit, group) in the random
/// order (partition selection counts these: one per unit and group).
pub fn first_row_of_unit() -> Expr {
    has_unit().and(col(RN).eq(lit(1u64)))
}

/// The row belongs to a unit (its unit column is not NULL).
fn has_unit() -> Expr {
    col(UNIT).is_not_null()
}

/// The bounding plan being built for one DP aggregate.
pub struct Bounding {
    /// The region with the unit carried up, NULL units left out, and the random numbers.
    plan: LogicalPlan,
    groups: Vec<Expr>,
    bounds: Bounds,
    grouped: bool,
    /// The per-(unit, group) totals of the `dp_sum` calls, with their column names.
    totals: Vec<(Expr, String)>,
}

impl Bounding {
    /// Starts from the checked private region `input` (what stands below the aggregate).
    pub fn new(
        bounds: &Bounds,
        input: &LogicalPlan,
        group_expr: &[Expr],
        table: &TableInfo,
    ) -> Result<Self> {
        // Rows whose unit is NULL stay in the plan (a group of a public key set may consist of
        // the NULL-extended row alone) but reach no DP call: every call's FILTER requires a unit.
        let (plan, unit) = expose(input, &bounds.column, table)?;
        let mut exprs: Vec<Expr> = plan
            .schema()
            .columns()
            .into_iter()
            .filter(|c| c.name != UNIT)
            .map(Expr::Column)
            .collect();
        exprs.push(unit.alias(UNIT));
        exprs.push(datafusion::functions::math::expr_fn::random().alias(R1));
        exprs.push(datafusion::functions::math::expr_fn::random().alias(R2));
        let plan = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(plan))?);
        let groups = group_expr
            .iter()
            .map(|g| super::total::wrap(g.clone(), input.schema()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            plan,
            grouped: !groups.is_empty(),
            groups,
            bounds: bounds.clone(),
            totals: vec![],
        })
    }

    /// The unit key, as the models read it.
    pub fn unit_expr(&self) -> Expr {
        col(UNIT)
    }

    fn unit_and_groups(&self) -> Vec<Expr> {
        let mut v = vec![col(UNIT)];
        v.extend(self.groups.iter().cloned());
        v
    }

    /// A call's data arguments and FILTER, bounded as `how` says.
    pub fn bound_call(
        &mut self,
        how: Contribution,
        args: Vec<Expr>,
        filter: Option<Expr>,
    ) -> Result<(Vec<Expr>, Option<Expr>)> {
        let and = |cond: Expr, f: Option<Expr>| match f {
            Some(f) => has_unit().and(cond).and(f),
            None => has_unit().and(cond),
        };
        Ok(match how {
            Contribution::Rows => {
                let cond = col(RN).lt_eq(lit(self.bounds.rows as u64));
                (args, Some(and(cond, filter)))
            }
            Contribution::Total => {
                // The unit's total per group of the rows its FILTER keeps, summed in Float64 (no
                // overflow error: ±infinity is clamped by dp_sum, NaN is skipped).
                let value = cast(
                    args.into_iter().next().unwrap_or(lit(0.0)),
                    DataType::Float64,
                );
                let value = match filter {
                    Some(f) => when(f, value).end()?,
                    None => value,
                };
                let total = Expr::WindowFunction(Box::new(WindowFunction::new(
                    WindowFunctionDefinition::AggregateUDF(
                        datafusion::functions_aggregate::sum::sum_udaf(),
                    ),
                    vec![value],
                )))
                .partition_by(self.unit_and_groups())
                .build()?;
                // Calls on the same value and FILTER (dp_sum beside dp_sum_ci, say) share one
                // window: the same per-unit totals, each call drawing its own noise. (A window
                // plan refuses two expressions of the same name.)
                let name = match self.totals.iter().find(|(e, _)| e == &total) {
                    Some((_, name)) => name.clone(),
                    None => {
                        let name = format!("{TOTAL}{}", self.totals.len());
                        self.totals.push((total, name.clone()));
                        name
                    }
                };
                (vec![col(name)], Some(first_row_of_unit()))
            }
            Contribution::Once => (args, Some(first_row_of_unit())),
            Contribution::PerUnit => (args, Some(and(lit(true), filter))),
        })
    }

    /// The bounded input of the DP aggregate.
    pub fn plan(self) -> Result<LogicalPlan> {
        use datafusion::functions_window::expr_fn::{dense_rank, first_value, row_number};
        let order = vec![col(R1).sort(true, false)];
        let mut w1 = vec![(
            row_number()
                .partition_by(self.unit_and_groups())
                .order_by(order.clone())
                .build()?,
            RN.to_string(),
        )];
        if self.grouped {
            w1.push((
                first_value(col(R2))
                    .partition_by(self.unit_and_groups())
                    .order_by(order)
                    .build()?,
                GK.to_string(),
            ));
        }
        w1.extend(self.totals);
        let plan = windowed(self.plan, w1)?;
        if !self.grouped {
            return Ok(plan);
        }
        let mut by = vec![col(GK).sort(true, false)];
        by.extend(self.groups.iter().map(|g| g.clone().sort(true, false)));
        let rank = dense_rank()
            .partition_by(vec![col(UNIT)])
            .order_by(by)
            .build()?;
        let plan = windowed(plan, vec![(rank, GR.to_string())])?;
        // Rows without a unit are kept (they reach no call; see `new`).
        Ok(LogicalPlan::Filter(Filter::try_new(
            col(GR)
                .lt_eq(lit(self.bounds.groups as u64))
                .or(col(UNIT).is_null()),
            Arc::new(plan),
        )?))
    }
}

/// `plan` with the window functions `exprs` added as columns of the given names.
fn windowed(plan: LogicalPlan, exprs: Vec<(Expr, String)>) -> Result<LogicalPlan> {
    let mut cols: Vec<Expr> = plan
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    for (e, name) in &exprs {
        cols.push(Expr::Column(Column::from_name(e.schema_name().to_string())).alias(name));
    }
    let plan = LogicalPlanBuilder::window_plan(plan, exprs.into_iter().map(|(e, _)| e))?;
    Ok(LogicalPlan::Projection(Projection::try_new(
        cols,
        Arc::new(plan),
    )?))
}

/// `plan` (a checked private region) with the unit column carried up to its output, and the
/// expression that reads it there.
fn expose(plan: &LogicalPlan, column: &str, table: &TableInfo) -> Result<(LogicalPlan, Expr)> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let schema = scan.source.schema();
            let idx = schema.index_of(column).map_err(|_| {
                refuse(format!(
                    "table '{}' declares privacy unit column '{column}', which it does not have",
                    table.name
                ))
            })?;
            let projection = scan.projection.clone().map(|mut p| {
                if !p.contains(&idx) {
                    p.push(idx);
                }
                p
            });
            let new = TableScanBuilder::new(scan.table_name.clone(), scan.source.clone())
                .with_projection(projection)
                .with_filters(scan.filters.clone())
                .with_fetch(scan.fetch)
                .build()?;
            let unit = Expr::Column(Column::new(Some(scan.table_name.clone()), column));
            Ok((LogicalPlan::TableScan(new), unit))
        }
        LogicalPlan::Filter(f) => {
            let (input, unit) = expose(&f.input, column, table)?;
            let new = Filter::try_new(f.predicate.clone(), Arc::new(input))?;
            Ok((LogicalPlan::Filter(new), unit))
        }
        LogicalPlan::Projection(p) => {
            let (input, unit) = expose(&p.input, column, table)?;
            let mut exprs = p.expr.clone();
            exprs.push(match &unit {
                Expr::Column(c) if c.name == UNIT => unit.clone(),
                u => u.clone().alias(UNIT),
            });
            let new = Projection::try_new(exprs, Arc::new(input))?;
            Ok((LogicalPlan::Projection(new), col(UNIT)))
        }
        LogicalPlan::SubqueryAlias(s) => {
            let (input, unit) = expose(&s.input, column, table)?;
            let name = match &unit {
                Expr::Column(c) => c.name.clone(),
                _ => UNIT.to_string(),
            };
            let new = SubqueryAlias::try_new(Arc::new(input), s.alias.clone())?;
            let unit = Expr::Column(Column::new(Some(new.alias.clone()), name));
            Ok((LogicalPlan::SubqueryAlias(new), unit))
        }
        LogicalPlan::Join(j) => {
            let left = super::join::private_is_left(j);
            let private = if left { &j.left } else { &j.right };
            let (input, unit) = expose(private, column, table)?;
            let (l, r) = if left {
                (Arc::new(input), j.right.clone())
            } else {
                (j.left.clone(), Arc::new(input))
            };
            let new = Join::try_new(
                l,
                r,
                j.on.clone(),
                j.filter.clone(),
                j.join_type,
                j.join_constraint,
                j.null_equality,
                j.null_aware,
            )?;
            Ok((LogicalPlan::Join(new), unit))
        }
        other => Err(refuse(format!(
            "{} between unit-level table '{}' and a DP aggregate is not supported",
            super::construct_name(other),
            table.name
        ))),
    }
}
