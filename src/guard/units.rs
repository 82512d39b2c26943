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
//!   Projection  unit, g, totals, __dpfusion_rn, the sampled columns under their own names
//!     Unnest  __dpfusion_sample (list, then struct)              (only if a call reads rows)
//!       Projection  unit, __dpfusion_kept.c0 AS g, …, totals, sample
//!         Unnest  __dpfusion_kept (list, then struct)
//!           Aggregate  GROUP BY unit AS __dpfusion_unit,
//!                      CASE WHEN unit IS NULL THEN h END AS __dpfusion_no_unit:
//!                      __dpfusion_unit_groups(K, C, h, g…, value…, x…) AS __dpfusion_kept
//!                      (h = __dpfusion_unit_group_key(unit, g…); value… the dp_sum values
//!                      under their FILTERs; x… the columns the row-level calls read)
//!             the private region (scan, WHERE, projections, joins), the unit column carried up
//! ```
//!
//! Without GROUP BY (one group: K = 1 holds with no choice) the aggregate by unit is `GROUP BY
//! unit AS __dpfusion_unit` of `__dpfusion_unit_total(value) AS __dpfusion_total_i` (per dp_sum
//! value, FILTER and grid: [`UnitTotal`]) and `__dpfusion_unit_sample(C, x…) AS
//! __dpfusion_sample` ([`Sample`], if a call reads rows), and the projection over its unnest is
//! not needed.
//!
//! Nothing sorts, and there is one aggregate: DataFusion's hash aggregate by unit (parallel,
//! spilling to disk under the memory pool) with a state of at most K entries of totals and C rows
//! per unit ([`TopGroups`], a `GroupsAccumulator` that drops a group as soon as it cannot be among
//! the unit's K; `top.rs`).
//!
//! - **L0** (Wilson et al., "Differentially Private SQL with Bounded User Contribution", PoPETs
//!   2020, §3 "contribution bounding"; the per-unit sampling of PipelineDP and ZetaSQL): each
//!   unit keeps at most K of its groups, chosen uniformly at random per query: each (unit,
//!   group) gets a keyed hash ([`GroupKey`], a PRF under a secret per-query key from the
//!   CSPRNG), and a unit keeps its K groups of smallest hash ([`TopGroups`]: never more than K;
//!   rows without a unit are each their own group there, all kept).
//! - **L∞** per call, by what the call needs:
//!   - [`Contribution::Rows`] (`dp_count`, `dp_mean`, …): at most C rows of each (unit, group),
//!     a uniform sample ([`Sample`]) carried through the aggregate and unnested
//!     (`__dpfusion_rn <= C`);
//!   - [`Contribution::Total`] (`dp_sum`): the unit's total per group, one value (the exact sum
//!     of the (unit, group)'s values on the grid of the call's bounds, [`Grid`]), which `dp_sum`
//!     clamps to [lower, upper] like any value: the per-unit pre-aggregation of ZetaSQL's
//!     `ANON_SUM`;
//!   - [`Contribution::Once`] (`dp_count_distinct`, partition selection): one per (unit, group)
//!     (`__dpfusion_rn = 1`);
//!   - [`Contribution::PerUnit`] (the models): every row, with the unit key passed to the
//!     model, which clips each unit's summed gradient (McMahan et al. 2018). A model reads no
//!     bounded rows: without GROUP BY and alone in its query, its input is the private region's
//!     rows as they stream with the unit key (`Projection unit AS __dpfusion_unit, 1 AS
//!     __dpfusion_rn` over the region), and no state here holds them ([`Bounding::plan`]);
//!     other forms are refused.
//!
//! The final audit (checked.rs) accepts exactly these shapes, pinned to the owner's policy (the
//! unit column traced to the scan, K and C in the literals of the aggregate by unit).
//!
//! Each selection depends only on the unit's own rows, the key and randomness, so after it one
//! unit changes at most K groups, and each by at most C rows (or one value): the sensitivity
//! bounds of `units:K:C` hold for every data set. What a unit's rows present to the calls is a
//! function of those rows too, not of the order in which they, or the partial states that hold
//! them, arrive (round 48, review "topgroups"): a kept entry's group key is canonical (a float
//! key's −0.0 stored as 0.0, [`canonical_key`], so its rows read one value whichever came first),
//! and its totals are exact sums ([`Grid`]: a float sum in arrival order let cancelling values
//! chosen through CASE make a total 0 or 5 by thread timing that another unit's volume steered).
//! Rows whose unit is NULL belong to no unit: every call's FILTER leaves them out (they stay in
//! the plan only so that the NULL-extended row of a public key set keeps its group, join.rs).
//! Any number of calls on any columns share the one aggregate (calls on the same value, FILTER
//! and grid share one total).
//!
//! Below a join of two private tables on their unit (join.rs, `unit_join`) each side is bounded
//! per unit before the join too ([`join_prebound`], round 48): at most M = K·C rows of each unit
//! (K as declared or set, even without GROUP BY; M ≤ [`MAX_JOIN_ROWS`]), by the same row sample
//! under a key of each side's own, so the join pairs at most M² rows of a unit. That pre-bound is
//! a function of one unit's own rows (with the key and randomness), so the argument above holds
//! for the joined rows unchanged; it only limits the work of one unit's rows.
use std::sync::Arc;

use std::hash::Hasher;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, UInt64Array, new_empty_array,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Column, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, Aggregate, AggregateUDF, AggregateUDFImpl, ColumnarValue, EmitTo, Expr, Filter,
    GroupsAccumulator, Join, LogicalPlan, LogicalPlanBuilder, Projection, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, SubqueryAlias, TableScanBuilder, Volatility, cast, col,
    lit, when,
};
use dpfusion_udfs::noise::rng::SecureRng;

use super::{GuardOptions, TableInfo, bare_column, refuse};
use crate::accounting::PrivacyUnit;

mod top;
pub(super) use top::TOP_GROUPS_FN;
pub(super) use top::TopGroups;
use top::{Layout, list_of, row_key, sample_fields, struct_list};

/// The unit-level count of distinct units.
pub const COUNT_DISTINCT: &str = "dp_count_distinct";

pub(super) const UNIT: &str = "__dpfusion_unit";
pub(super) const RN: &str = "__dpfusion_rn";
pub(super) const TOTAL: &str = "__dpfusion_total_";
pub(super) const SAMPLE: &str = "__dpfusion_sample";
/// The keyed hash of (unit, group) ([`GroupKey`]).
pub(super) const GROUP_KEY_FN: &str = "__dpfusion_unit_group_key";
/// The row sample of a (unit, group) ([`Sample`]).
pub(super) const SAMPLE_FN: &str = "__dpfusion_unit_sample";
/// The kept (unit, group) rows of a unit ([`TopGroups`]).
pub(super) const KEPT: &str = "__dpfusion_kept";
/// A unit's exact total of a dp_sum value without GROUP BY ([`UnitTotal`]).
pub(super) const TOTAL_FN: &str = "__dpfusion_unit_total";
/// The second key of the per-unit aggregate: NULL for a unit, the (unit, group)'s hash for the
/// rows without a unit (each its own group: they are all kept).
pub(super) const NO_UNIT: &str = "__dpfusion_no_unit";

/// The unit key of one side of a unit join after its pre-bound ([`join_prebound`], round 48).
pub(super) const JOIN_UNIT: &str = "__dpfusion_join_unit";
/// One side of a unit join: its sample of at most M rows of each unit ([`join_prebound`]).
pub(super) const JOIN_SAMPLE: &str = "__dpfusion_join_sample";
/// The most rows of one unit each side of a join of two private tables keeps (M = K·C may not be
/// more: a unit's pairs are then at most M² = 1,048,576; [`join_prebound`], round 48).
pub const MAX_JOIN_ROWS: u64 = 1024;

/// Whether a function is one of the bounding's own (they hold per-query state, such as the
/// secret group key, that no codec carries: the distributed path refuses plans with them).
#[cfg_attr(not(feature = "distributed"), allow(dead_code))]
pub(crate) fn is_bounding_fn(name: &str) -> bool {
    name == GROUP_KEY_FN || name == SAMPLE_FN || name == TOP_GROUPS_FN || name == TOTAL_FN
}

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

/// K and C in force for a table's unit: the session's (or the statement's) where it sets them,
/// else the data owner's.
pub(super) fn bounds_in_force(unit: &PrivacyUnit, opts: &GuardOptions) -> (u32, u32) {
    (
        opts.max_groups_contributed
            .unwrap_or(unit.max_groups_contributed),
        opts.max_rows_contributed
            .unwrap_or(unit.max_rows_contributed),
    )
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

/// How a unit contributes to the call `name`, or why the call is refused on a unit-level table:
/// the rule its declaration states (`Aggregate::units`; a `_ci` variant's is its base's).
pub fn contribution(
    name: &str,
    data: &[Expr],
    has_filter: bool,
    input: &LogicalPlan,
    table: &TableInfo,
) -> Result<Contribution> {
    use dpfusion_udfs::aggregates::registry::{self, UnitRule};
    let unit = table.unit.as_ref().map(|u| u.column.as_str()).unwrap_or("");
    // The guard's internal aggregates are not for analysts' calls.
    let Some(a) = registry::get(name).filter(|a| !a.internal) else {
        return Err(refuse(format!(
            "{name} is not supported on table '{}', which protects privacy units",
            table.name
        )));
    };
    // Messages name the base function (`dp_count_distinct` for `dp_count_distinct_ci`).
    let name = registry::base_of(name).map_or(a.name, |b| b.name);
    match a.units {
        UnitRule::Rows => Ok(Contribution::Rows),
        UnitRule::Total => Ok(Contribution::Total),
        UnitRule::PerUnit => Ok(Contribution::PerUnit),
        UnitRule::Once => {
            let arg = data.first().and_then(|e| bare_column(e, input));
            if arg.as_deref() != Some(unit) {
                return Err(refuse(format!(
                    "{name} counts the privacy units of table '{}': its argument must be the \
                     unit column '{unit}' itself, e.g. {name}({unit}, epsilon => 1). To count \
                     the distinct values of another column, GROUP BY it and count units per \
                     group.",
                    table.name
                )));
            }
            if has_filter {
                return Err(refuse(format!(
                    "{name} with a FILTER clause is not supported; put the condition in WHERE"
                )));
            }
            Ok(Contribution::Once)
        }
        UnitRule::Refused {
            needs,
            why,
            instead,
        } => Err(refuse(format!(
            "{name} needs {needs}, but table '{}' protects privacy units (column '{unit}'): \
             {why}. {instead}",
            table.name
        ))),
    }
}

/// The model aggregates: on a unit-level table they read every row of a unit with its unit key
/// and clip the unit's summed gradient ([`Contribution::PerUnit`]).
pub(super) fn is_model(name: &str) -> bool {
    use dpfusion_udfs::aggregates::registry::{self, UnitRule};
    registry::get(name).is_some_and(|a| a.units == UnitRule::PerUnit)
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

/// `__dpfusion_rn = 1` of a row with a unit: the first row of each (unit, group) (partition
/// selection counts these: one per unit and group).
pub fn first_row_of_unit() -> Expr {
    has_unit().and(col(RN).eq(lit(1u64)))
}

/// The row belongs to a unit (its unit column is not NULL).
fn has_unit() -> Expr {
    col(UNIT).is_not_null()
}

/// The bounding plan being built for one DP aggregate (module docs).
pub struct Bounding {
    /// The checked region with the unit column carried up to its output.
    region: LogicalPlan,
    /// The expression that reads the unit in `region`.
    unit: Expr,
    /// The GROUP BY keys over `region` (made total).
    groups: Vec<Expr>,
    bounds: Bounds,
    /// The values the `dp_sum` calls total per (unit, group) (each under its FILTER, NULL where
    /// it does not count), with the grid of each total and their column names.
    totals: Vec<(Expr, Grid, String)>,
    /// The columns of `region` that row-level calls read (their arguments and FILTERs).
    sampled: Vec<Column>,
    /// Does a call read rows (then each (unit, group) keeps a sample of its rows)?
    rows: bool,
    /// Does a call read every row of its unit (a model)?
    every_row: bool,
    /// Does a call read the bounded (unit, group) rows (any call but a model)?
    bounded_calls: bool,
    /// The per-query secret key of the group choice.
    key: [u64; 2],
}

impl Bounding {
    /// Starts from the checked private region `input` (what stands below the aggregate); `key`
    /// is the query's secret key ([`query_key`]).
    pub fn new(
        bounds: &Bounds,
        input: &LogicalPlan,
        group_expr: &[Expr],
        table: &TableInfo,
        key: [u64; 2],
    ) -> Result<Self> {
        // Rows whose unit is NULL stay in the plan (a group of a public key set may consist of
        // the NULL-extended row alone) but reach no DP call: every call's FILTER requires a unit.
        let (region, unit) = expose(input, &bounds.column, table)?;
        let groups = group_expr
            .iter()
            .map(|g| super::total::wrap(g.clone(), input.schema()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            region,
            unit,
            groups,
            bounds: bounds.clone(),
            totals: vec![],
            sampled: vec![],
            rows: false,
            every_row: false,
            bounded_calls: false,
            key,
        })
    }

    /// The unit key, as the models read it.
    pub fn unit_expr(&self) -> Expr {
        col(UNIT)
    }

    /// The GROUP BY key `i` as the DP aggregate reads it: the column the bounding outputs for it
    /// (the projection over the unnested kept entries).
    pub fn group_ref(&self, i: usize) -> Expr {
        match &self.groups[i] {
            c @ Expr::Column(_) => c.clone(),
            g => Expr::Column(Column::from_name(g.schema_name().to_string())),
        }
    }

    /// Row-level calls read these expressions' columns: carried in the sample.
    fn sample(&mut self, exprs: &[Expr], filter: Option<&Expr>) {
        self.rows = true;
        for e in exprs.iter().chain(filter) {
            for c in e.column_refs() {
                if !self.sampled.contains(c) {
                    self.sampled.push(c.clone());
                }
            }
        }
    }

    /// A call's data arguments and FILTER, bounded as `how` says; `name` and `params` are the
    /// call's function and literal parameters (a total's grid is its bounds', [`Grid`]).
    pub fn bound_call(
        &mut self,
        how: Contribution,
        (name, params): (&str, &[ScalarValue]),
        args: Vec<Expr>,
        filter: Option<Expr>,
    ) -> Result<(Vec<Expr>, Option<Expr>)> {
        let and = |cond: Expr, f: Option<Expr>| match f {
            Some(f) => has_unit().and(cond).and(f),
            None => has_unit().and(cond),
        };
        if how != Contribution::PerUnit {
            self.bounded_calls = true;
        }
        Ok(match how {
            Contribution::Rows => {
                self.sample(&args, filter.as_ref());
                let cond = col(RN).lt_eq(lit(self.bounds.rows as u64));
                (args, Some(and(cond, filter)))
            }
            Contribution::Total => {
                // The unit's total per group of the rows its FILTER keeps: an exact sum on the
                // grid of the call's bounds ([`Grid`]; NaN is skipped, ±infinity clamped), the
                // same whatever order the rows and partial states arrive in (round 48, review
                // "topgroups" F2).
                let grid = Grid::of_call(name, params)?;
                let value = cast(
                    args.into_iter().next().unwrap_or(lit(0.0)),
                    DataType::Float64,
                );
                let value = match filter {
                    Some(f) => when(f, value).end()?,
                    None => value,
                };
                // Calls on the same value, FILTER and grid (dp_sum beside dp_sum_ci with the same
                // bounds, say) share one total: each call draws its own noise.
                let name = match self
                    .totals
                    .iter()
                    .find(|(e, g, _)| e == &value && *g == grid)
                {
                    Some((_, _, name)) => name.clone(),
                    None => {
                        let name = format!("{TOTAL}{}", self.totals.len());
                        self.totals.push((value, grid, name.clone()));
                        name
                    }
                };
                (vec![col(name)], Some(first_row_of_unit()))
            }
            // One per (unit, group): the unit key itself (never NULL under the FILTER).
            Contribution::Once => (vec![col(UNIT)], Some(first_row_of_unit())),
            // Every row of the unit, streamed (`plan`): the model clips the unit's sum.
            Contribution::PerUnit => {
                self.every_row = true;
                (args, Some(and(lit(true), filter)))
            }
        })
    }

    /// The bounded input of the DP aggregate (module docs).
    pub fn plan(self) -> Result<LogicalPlan> {
        if self.every_row {
            return self.model_rows();
        }
        let cap = u64::from(self.bounds.rows);
        let plan = if self.groups.is_empty() {
            // 1. Without GROUP BY (one group: K = 1 holds with no choice), one row per unit:
            //    DataFusion's hash aggregate (parallel, spills), its exact totals ([`UnitTotal`],
            //    not DataFusion's float `sum`, whose result follows the order of its partial
            //    states: round 48, review "topgroups" F2) and its row sample.
            let mut aggr: Vec<Expr> = self
                .totals
                .iter()
                .map(|(v, grid, name)| unit_total_udaf(*grid).call(vec![v.clone()]).alias(name))
                .collect();
            if self.rows {
                let mut args = vec![lit(cap)];
                args.extend(self.sampled.iter().cloned().map(Expr::Column));
                aggr.push(sample_udaf(cap, self.key).call(args).alias(SAMPLE));
            }
            LogicalPlan::Aggregate(Aggregate::try_new(
                Arc::new(self.region.clone()),
                vec![self.unit.clone().alias(UNIT)],
                aggr,
            )?)
        } else {
            // 2. With GROUP BY, L0 and L∞ in one aggregate by unit over the rows: each unit keeps
            //    its K groups of smallest keyed hash, with their totals and row samples
            //    ([`TopGroups`]: no sort, no per-(unit, group) aggregate; it spills like any
            //    aggregate), unnested back into one row per kept (unit, group).
            let mut keyed = vec![self.unit.clone()];
            keyed.extend(self.groups.iter().cloned());
            let hash = ScalarUDF::from(GroupKey::new(self.key)).call(keyed);
            let layout = Layout {
                groups: self.groups.len(),
                totals: self.totals.len(),
                sampled: self.sampled.len(),
                rows: self.rows,
            };
            let mut args = vec![lit(u64::from(self.bounds.groups)), lit(cap), hash.clone()];
            args.extend(self.groups.iter().cloned());
            args.extend(self.totals.iter().map(|(v, _, _)| v.clone()));
            args.extend(self.sampled.iter().cloned().map(Expr::Column));
            // Rows without a unit are kept, each (group) its own (they reach no call; see `new`).
            let no_unit = when(self.unit.clone().is_null(), hash)
                .end()?
                .alias(NO_UNIT);
            let grids = self.totals.iter().map(|(_, g, _)| *g).collect();
            let kept = top::top_groups_udaf(layout, grids, sample_key(self.key))
                .call(args)
                .alias(KEPT);
            let plan = LogicalPlan::Aggregate(Aggregate::try_new(
                Arc::new(self.region.clone()),
                vec![self.unit.clone().alias(UNIT), no_unit],
                vec![kept],
            )?);
            let plan = LogicalPlanBuilder::from(plan)
                .unnest_column(Column::from_name(KEPT))?
                .unnest_column(Column::from_name(KEPT))?
                .build()?;
            let field = |j: String| Expr::Column(Column::from_name(format!("{KEPT}.{j}")));
            let mut cols = vec![col(UNIT)];
            for (j, g) in self.groups.iter().enumerate() {
                cols.push(match g {
                    Expr::Column(c) => {
                        field(format!("c{j}")).alias_qualified(c.relation.clone(), &c.name)
                    }
                    g => field(format!("c{j}")).alias(g.schema_name().to_string()),
                });
            }
            for (j, (_, _, name)) in self.totals.iter().enumerate() {
                cols.push(field(format!("c{}", self.groups.len() + j)).alias(name));
            }
            if self.rows {
                cols.push(field("sample".into()).alias(SAMPLE));
            }
            LogicalPlan::Projection(Projection::try_new(cols, Arc::new(plan))?)
        };
        // 3. the sampled rows back as rows (at most C of each (unit, group), or every row for a
        //    model), under their own names; `__dpfusion_rn` numbers them from 1.
        let mut cols: Vec<Expr> = plan
            .schema()
            .columns()
            .into_iter()
            .filter(|c| c.name != SAMPLE)
            .map(Expr::Column)
            .collect();
        if !self.rows {
            cols.push(lit(1u64).alias(RN));
            return Ok(LogicalPlan::Projection(Projection::try_new(
                cols,
                Arc::new(plan),
            )?));
        }
        let plan = LogicalPlanBuilder::from(plan)
            .unnest_column(Column::from_name(SAMPLE))?
            .unnest_column(Column::from_name(SAMPLE))?
            .build()?;
        let field = |name: &str| Expr::Column(Column::from_name(format!("{SAMPLE}.{name}")));
        cols.push(field("pos").alias(RN));
        let outputs: Vec<Expr> = cols.clone();
        for (j, c) in self.sampled.iter().enumerate() {
            // A sampled column that is also a GROUP BY key is that key's column already.
            if outputs
                .iter()
                .any(|o| matches!(o, Expr::Column(x) if x == c))
            {
                continue;
            }
            cols.push(field(&format!("c{j}")).alias_qualified(c.relation.clone(), &c.name));
        }
        Ok(LogicalPlan::Projection(Projection::try_new(
            cols,
            Arc::new(plan),
        )?))
    }
}

impl Bounding {
    /// The input of model calls (module docs): the region's rows as they stream, each with its
    /// unit key, no state held here (the model buffers its rows, docs/PRIVACY.md). Only without
    /// GROUP BY (one group: K = 1 holds with no choice) and with models alone: the other calls
    /// read the bounded (unit, group) rows, a different input.
    fn model_rows(self) -> Result<LogicalPlan> {
        if self.bounded_calls {
            return Err(refuse(
                "on a unit-level table a model is fit in a query of its own: it reads every row \
                 of each unit, the other DP aggregates read the bounded rows; run them in \
                 separate queries",
            ));
        }
        if !self.groups.is_empty() {
            return Err(refuse(
                "a model on a unit-level table is fit without GROUP BY (each unit's summed \
                 gradient is clipped once per query); fit one model per group with WHERE",
            ));
        }
        let mut cols: Vec<Expr> = self
            .region
            .schema()
            .columns()
            .into_iter()
            .filter(|c| c.name != UNIT)
            .map(Expr::Column)
            .collect();
        cols.push(self.unit.clone().alias(UNIT));
        cols.push(lit(1u64).alias(RN));
        Ok(LogicalPlan::Projection(Projection::try_new(
            cols,
            Arc::new(self.region),
        )?))
    }
}

/// The secret key of one query's group choice: two words of the CSPRNG (seeded by the operating
/// system, or by the session's insecure test seed, then the same for every query).
pub fn query_key(insecure_seed: Option<u64>) -> [u64; 2] {
    let mut rng = match insecure_seed {
        Some(seed) => SecureRng::insecure_from_seed(seed),
        None => SecureRng::from_os_entropy(),
    };
    [rng.next_u64(), rng.next_u64()]
}

// ---- the pre-bound of a unit join's sides (round 48) ---------------------------------------------

/// A side of a join of two private tables on their unit ([`join_prebound`]): each samples under a
/// key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JoinSide {
    Left,
    Right,
}

/// One side of a join of two private tables on their privacy unit (join.rs, `unit_join`),
/// bounded per unit before the join (round 48, review "resources", finding 1): of each unit it
/// keeps at most `rows` (M = K·C) of its rows, a uniform sample without replacement drawn by the
/// bounding's keyed, order-independent row sample ([`Sample`]) under a key derived from the
/// query's key for this side alone (independent of the other side's and of the group choice's),
/// so the join pairs at most M² rows of a unit whatever its rows in either table. Rows whose unit
/// is NULL are dropped (an `=` join never matches them). The shape, as the final audit
/// (checked.rs) requires it on both sides of a private join:
///
/// ```text
/// Projection  the side's columns under their own names: __dpfusion_join_unit AS <unit>,
///             __dpfusion_join_sample.cJ AS <column J>
///   Unnest  __dpfusion_join_sample (list, then struct)
///     Aggregate  GROUP BY <unit> AS __dpfusion_join_unit:
///                __dpfusion_unit_sample(M, <the other columns>…) AS __dpfusion_join_sample
///       Filter  <unit> IS NOT NULL
///         the side (its private region)
/// ```
///
/// DataFusion's hash aggregate by unit (parallel, spills to disk), as [`Bounding::plan`] without
/// GROUP BY. The sample is a function of one unit's own rows, the key and randomness: adding or
/// removing a unit changes only its own rows on either side, so the contribution bounding above
/// the join, and the sensitivities it gives, are as before.
pub(super) fn join_prebound(
    side: LogicalPlan,
    unit: &Column,
    rows: u64,
    query_key: [u64; 2],
    which: JoinSide,
) -> Result<LogicalPlan> {
    let key = derive_key(
        query_key,
        match which {
            JoinSide::Left => b"dpfusion unit join sample, left side",
            JoinSide::Right => b"dpfusion unit join sample, right side",
        },
    );
    let schema = side.schema().clone();
    let at = schema.index_of_column(unit)?;
    let columns = schema.columns();
    let sampled: Vec<&Column> = columns
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .map(|(_, c)| c)
        .collect();
    let unit = Expr::Column(unit.clone());
    let side = Filter::try_new(unit.clone().is_not_null(), Arc::new(side))?;
    let mut args = vec![lit(rows)];
    args.extend(sampled.iter().map(|c| Expr::Column((*c).clone())));
    let plan = LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::new(LogicalPlan::Filter(side)),
        vec![unit.alias(JOIN_UNIT)],
        vec![keyed_sample_udaf(rows, key).call(args).alias(JOIN_SAMPLE)],
    )?);
    let plan = LogicalPlanBuilder::from(plan)
        .unnest_column(Column::from_name(JOIN_SAMPLE))?
        .unnest_column(Column::from_name(JOIN_SAMPLE))?
        .build()?;
    let exprs = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let from = match i.cmp(&at) {
                std::cmp::Ordering::Equal => JOIN_UNIT.to_string(),
                std::cmp::Ordering::Less => format!("{JOIN_SAMPLE}.c{i}"),
                std::cmp::Ordering::Greater => format!("{JOIN_SAMPLE}.c{}", i - 1),
            };
            Expr::Column(Column::from_name(from)).alias_qualified(c.relation.clone(), &c.name)
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(plan),
    )?))
}

/// The aggregate and the top projection of a unit join side's pre-bound ([`join_prebound`]) if
/// `plan` is one, recognised by its internal names (the final audit checks the whole shape).
fn prebound_parts(plan: &LogicalPlan) -> Option<(&Aggregate, &Projection)> {
    let LogicalPlan::Projection(p) = plan else {
        return None;
    };
    let sample = |u: &datafusion::logical_expr::Unnest| {
        u.exec_columns
            .iter()
            .all(|c| c.relation.is_none() && c.name == JOIN_SAMPLE)
            && !u.exec_columns.is_empty()
    };
    let LogicalPlan::Unnest(u1) = p.input.as_ref() else {
        return None;
    };
    let LogicalPlan::Unnest(u2) = u1.input.as_ref() else {
        return None;
    };
    let LogicalPlan::Aggregate(a) = u2.input.as_ref() else {
        return None;
    };
    let unit_key = matches!(a.group_expr.as_slice(), [Expr::Alias(g)] if g.name == JOIN_UNIT);
    (sample(u1) && sample(u2) && unit_key).then_some((a, p))
}

/// Is `e` the pre-bound's unit as its projection passes it on (`__dpfusion_join_unit AS u`)?
fn is_prebound_unit(e: &Expr) -> bool {
    matches!(e, Expr::Alias(a) if matches!(a.expr.as_ref(),
        Expr::Column(c) if c.relation.is_none() && c.name == JOIN_UNIT))
}

/// The column `c` of `plan`'s output, when `plan` is a unit join side's pre-bound and `c` its
/// unit: the unit key below the pre-bound (over the aggregate's input) and that input. How the
/// guard's and the audit's tracing of a unit column go through the pre-bound (`pairs_units`,
/// `expose`, the audit's `column_source`).
pub(super) fn through_join_prebound<'a>(
    c: &Column,
    plan: &'a LogicalPlan,
) -> Option<(&'a Expr, &'a LogicalPlan)> {
    let (a, p) = prebound_parts(plan)?;
    let i = p.schema.index_of_column(c).ok()?;
    if !is_prebound_unit(&p.expr[i]) {
        return None;
    }
    let [Expr::Alias(g)] = a.group_expr.as_slice() else {
        return None;
    };
    Some((g.expr.as_ref(), a.input.as_ref()))
}

/// The output column that carries the unit of a unit join side's pre-bound, if `plan` is one.
fn prebound_unit_column(plan: &LogicalPlan) -> Option<Column> {
    let (_, p) = prebound_parts(plan)?;
    let i = p.expr.iter().position(is_prebound_unit)?;
    let (q, f) = p.schema.qualified_field(i);
    Some(Column::new(q.cloned(), f.name()))
}

// ---- the group choice: a keyed hash of (unit, group) ---------------------------------------------

/// A group key column (or the unit's) as the bounding hashes and stores it: a top-level float
/// (Float16/32/64) −0.0 made 0.0, the one value DataFusion's GROUP BY folds (`GroupValuesRows`
/// normalises with this very function, the primitive group values canonicalise alike), so that
/// the keyed hash ([`GroupKey`]) and the key a kept entry stores ([`TopGroups`]) see one value.
/// Round 46 folded ±0 in the hash only: unfolded, a unit's K groups could all be one released
/// group, K·C rows in it. Round 48 (review "topgroups" F1) stores the folded value too: the entry
/// kept the key of its first row (or first merged state), which the DP aggregate grouped by and
/// every row-level call of the entry read in place of its own value, so whether a FILTER on
/// `CAST(x AS VARCHAR) = '-0.0'` counted a unit depended on row order, across partitions on
/// thread timing that another unit's volume steered. NaN payloads stay apart in both (two
/// entries, each stored as met, so each entry's rows read one value); floats nested in structs or
/// lists and dictionaries of floats are folded by neither DataFusion's GROUP BY nor the hash
/// (row format, by value), so ±0 there are two groups and two entries, each again one value.
///
/// Round 49 (review "types", L1): a NULL struct's fields are made NULL too, at every depth
/// ([`null_hidden_fields`]). The row format, and so the hash and DataFusion's grouping, sees
/// every NULL struct as one value whatever its fields hold, while `get_field` reads the fields
/// without the struct's NULL: an entry stored with the first row's hidden fields would let a
/// row-level call read the first row's value. Nulling them changes no group (the row format
/// never saw them), so the folding above stays DataFusion's.
pub(super) fn canonical_key(column: &ArrayRef) -> ArrayRef {
    null_hidden_fields(&datafusion::common::utils::normalize_float_zero(column))
}

/// `a` with the fields under each NULL struct made NULL, through structs, lists and maps at every
/// depth; `a` itself (the same buffers) when no struct in it hides a value.
fn null_hidden_fields(a: &ArrayRef) -> ArrayRef {
    use datafusion::arrow::array::{
        FixedSizeListArray, LargeListArray, ListArray, MapArray, StructArray, make_array,
    };
    use datafusion::arrow::buffer::NullBuffer;
    match a.data_type() {
        DataType::Struct(fields) => {
            let s = a.as_struct();
            let parent = s.nulls();
            let columns: Vec<ArrayRef> = s
                .columns()
                .iter()
                .map(|c| {
                    // The struct's NULLs first, then the field's own fields: a field nulled here
                    // hides its own fields in turn (the review of round 49's fixes: recursing
                    // first left a NULL grandparent's grandchildren as they were).
                    let nulls = NullBuffer::union(parent, c.nulls());
                    let c = if parent.is_none()
                        || matches!(c.data_type(), DataType::Null)
                        || nulls.as_ref().map(NullBuffer::null_count)
                            == c.nulls().map(NullBuffer::null_count)
                    {
                        Arc::clone(c)
                    } else {
                        match c.to_data().into_builder().nulls(nulls).build() {
                            Ok(d) => make_array(d),
                            Err(_) => Arc::clone(c),
                        }
                    };
                    null_hidden_fields(&c)
                })
                .collect();
            Arc::new(StructArray::new(fields.clone(), columns, parent.cloned()))
        }
        DataType::List(f) => {
            let l = a.as_list::<i32>();
            Arc::new(ListArray::new(
                f.clone(),
                l.offsets().clone(),
                null_hidden_fields(l.values()),
                l.nulls().cloned(),
            ))
        }
        DataType::LargeList(f) => {
            let l = a.as_list::<i64>();
            Arc::new(LargeListArray::new(
                f.clone(),
                l.offsets().clone(),
                null_hidden_fields(l.values()),
                l.nulls().cloned(),
            ))
        }
        DataType::FixedSizeList(f, k) => {
            let l = a.as_fixed_size_list();
            Arc::new(FixedSizeListArray::new(
                f.clone(),
                *k,
                null_hidden_fields(l.values()),
                l.nulls().cloned(),
            ))
        }
        DataType::Map(f, sorted) => {
            let m = a.as_map();
            let entries = null_hidden_fields(&(Arc::new(m.entries().clone()) as ArrayRef));
            Arc::new(MapArray::new(
                f.clone(),
                m.offsets().clone(),
                entries.as_struct().clone(),
                m.nulls().cloned(),
                *sorted,
            ))
        }
        _ => Arc::clone(a),
    }
}

/// `__dpfusion_unit_group_key(unit, g…)`: SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast
/// short-input PRF", INDOCRYPT 2012) under the query's secret key of the row encoding of (unit,
/// g…). A PRF: to anyone without the key the values of distinct (unit, group) pairs are
/// independent and uniform, so a unit's K smallest are a uniform choice of K of its groups. The
/// key is held here and never printed (not in the expression's name nor its `Debug`).
#[derive(PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    key: [u64; 2],
    signature: Signature,
}

impl GroupKey {
    fn new(key: [u64; 2]) -> Self {
        Self {
            key,
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupKey { key: <secret> }")
    }
}

impl ScalarUDFImpl for GroupKey {
    fn name(&self) -> &str {
        GROUP_KEY_FN
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // The values as the bounding stores them ([`canonical_key`], round 46).
        let arrays: Vec<_> = ColumnarValue::values_to_arrays(&args.args)?
            .iter()
            .map(canonical_key)
            .collect();
        let fields = arrays
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect();
        let rows = RowConverter::new(fields)?.convert_columns(&arrays)?;
        let out: UInt64Array = (0..args.number_rows)
            .map(|i| {
                #[allow(deprecated)] // SipHash-2-4 with a key: the PRF wanted, in std.
                let mut h = std::hash::SipHasher::new_with_keys(self.key[0], self.key[1]);
                h.write(rows.row(i).as_ref());
                h.finish()
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

// ---- the row sample: at most C rows of each (unit, group) ----------------------------------------

/// `__dpfusion_unit_sample(C, x…)`: at most C of the rows (x…) of its group, each row given a
/// 64-bit key and the C smallest kept, as a list of structs `{pos, c0, c1, …}` with `pos` = 1, 2,
/// … in key order. A row's key is SipHash-2-4 ([`GroupKey`]'s PRF) under a secret per-query key
/// (derived from the query's key, so from the CSPRNG or the session's insecure test seed) of the
/// row's values and its row id, a number no other row of the query gets ([`RowIds`]): to anyone
/// without the key, the keys of the query's rows are independent and uniform, so the C smallest
/// of a (unit, group) are a uniform sample without replacement of that unit's rows, independent
/// of every other unit's, whatever the partitioning (partial states keep their C smallest;
/// merging keeps the C smallest of the union). The sensitivity argument rests on that
/// independence: until round 46 a row's number was its position among the rows its own
/// accumulator met, so equal rows at one position of two partitions (or, without GROUP BY, of
/// two units' accumulators) shared a key, and where positions fell, which other units' rows
/// decided, changed every unit's sample (a new unit's row at the top of a file moved a count
/// by 900 with σ = 0.25). Under a fixed seed the keys are fixed, but which row gets which id
/// depends on the order partitions reach the counter.
#[derive(PartialEq, Eq, Hash)]
pub(super) struct Sample {
    cap: u64,
    key: [u64; 2],
    ids: RowIds,
    signature: Signature,
}

/// The query's row ids: one counter shared by every accumulator of one sampling aggregate (its
/// partitions, its groups, its spills), so that no two rows of the query get one id.
#[derive(Clone, Default)]
pub(super) struct RowIds(Arc<std::sync::atomic::AtomicU64>);

impl RowIds {
    /// The first of `n` fresh ids.
    pub(super) fn take(&self, n: usize) -> u64 {
        self.0
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed)
    }
}

/// One counter is one aggregate's: equal when shared.
impl PartialEq for RowIds {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RowIds {}

impl std::hash::Hash for RowIds {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

impl std::fmt::Debug for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sample {{ cap: {}, key: <secret> }}", self.cap)
    }
}

impl Sample {
    /// The most rows it keeps of a group (what runs: the final audit checks it).
    pub(super) fn cap(&self) -> u64 {
        self.cap
    }
}

/// The row sample of the bounding, under the query's key ([`sample_key`]).
fn sample_udaf(cap: u64, query_key: [u64; 2]) -> AggregateUDF {
    keyed_sample_udaf(cap, sample_key(query_key))
}

/// A row sample of at most `cap` rows under its own (derived) PRF key.
fn keyed_sample_udaf(cap: u64, key: [u64; 2]) -> AggregateUDF {
    AggregateUDF::from(Sample {
        cap,
        key,
        ids: RowIds::default(),
        signature: Signature::variadic_any(Volatility::Volatile),
    })
}

/// The row sample's key: its own, domain-separated from the group choice's (SipHash of the
/// query key).
fn sample_key(query_key: [u64; 2]) -> [u64; 2] {
    derive_key(query_key, b"dpfusion unit row sample")
}

/// A key of its own for `domain`, derived from the query's key (SipHash of the domain under it):
/// to anyone without the query key, the keys of distinct domains are independent.
fn derive_key(query_key: [u64; 2], domain: &[u8]) -> [u64; 2] {
    let derive = |i: u64| {
        #[allow(deprecated)] // SipHash-2-4 with a key: the PRF wanted, in std.
        let mut h = std::hash::SipHasher::new_with_keys(query_key[0], query_key[1]);
        h.write(domain);
        h.write_u64(i);
        h.finish()
    };
    [derive(0), derive(1)]
}

impl AggregateUDFImpl for Sample {
    fn name(&self) -> &str {
        SAMPLE_FN
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(list_of(sample_fields("pos", &arg_types[1..])))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let types: Vec<DataType> = args.input_fields[1..]
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        Ok(vec![Arc::new(Field::new(
            format!("{}[sample]", args.name),
            list_of(sample_fields("key", &types)),
            true,
        ))])
    }
    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let types = acc_args.exprs[1..]
            .iter()
            .map(|e| e.data_type(acc_args.schema))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(SampleAccumulator::new(
            self.cap,
            self.key,
            self.ids.clone(),
            types,
        )?))
    }
}

struct SampleAccumulator {
    /// C.
    cap: usize,
    /// The row keys' secret PRF key.
    key: [u64; 2],
    /// The query's row ids.
    ids: RowIds,
    /// Encodes a row's values for its key.
    encoder: RowConverter,
    types: Vec<DataType>,
    /// (key, row) pairs: the C smallest keys seen (up to 2C between trims).
    rows: Vec<(u64, Vec<ScalarValue>)>,
    /// The rows' heap size (approximate).
    bytes: usize,
    /// The largest kept key once C rows are kept (a larger key is never kept).
    threshold: u64,
}

impl std::fmt::Debug for SampleAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SampleAccumulator {{ cap: {}, rows: {} }}",
            self.cap,
            self.rows.len()
        )
    }
}

impl SampleAccumulator {
    fn new(cap: u64, key: [u64; 2], ids: RowIds, types: Vec<DataType>) -> Result<Self> {
        let encoder = RowConverter::new(types.iter().cloned().map(SortField::new).collect())?;
        Ok(Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX).max(1),
            key,
            ids,
            encoder,
            types,
            rows: vec![],
            bytes: 0,
            threshold: u64::MAX,
        })
    }

    fn push(&mut self, key: u64, row: Vec<ScalarValue>) {
        self.bytes += row.iter().map(ScalarValue::size).sum::<usize>();
        self.rows.push((key, row));
        if self.rows.len() >= 2 * self.cap.max(8) {
            self.trim();
        }
    }

    /// Keeps the C smallest keys.
    fn trim(&mut self) {
        if self.rows.len() > self.cap {
            self.rows.select_nth_unstable_by_key(self.cap, |r| r.0);
            self.rows.truncate(self.cap);
            self.threshold = self.rows.iter().map(|r| r.0).max().unwrap_or(u64::MAX);
            self.bytes = self
                .rows
                .iter()
                .flat_map(|r| &r.1)
                .map(ScalarValue::size)
                .sum();
        }
    }

    /// The rows as a one-element list of structs (`first` then the columns).
    fn to_list(
        &self,
        first: &str,
        firsts: Vec<u64>,
        rows: &[&Vec<ScalarValue>],
    ) -> Result<ScalarValue> {
        let fields = sample_fields(first, &self.types);
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from(firsts))];
        for (j, t) in self.types.iter().enumerate() {
            arrays.push(if rows.is_empty() {
                new_empty_array(t)
            } else {
                ScalarValue::iter_to_array(rows.iter().map(|r| r[j].clone()))?
            });
        }
        let list = struct_list(fields, arrays, [rows.len()])?;
        Ok(ScalarValue::List(Arc::new(list.as_list::<i32>().clone())))
    }
}

impl Accumulator for SampleAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let n = values.first().map_or(0, |a| a.len());
        // (With no sampled column, `dp_count(*)`, a row is its id.)
        let encoded = self.encoder.convert_columns(&values[1..])?;
        let first = self.ids.take(n);
        for i in 0..n {
            let row = (encoded.num_rows() == n).then(|| encoded.row(i));
            let key = row_key(self.key, row.as_ref().map(|r| r.as_ref()), first + i as u64);
            // Not among the C smallest keys already kept.
            if key >= self.threshold {
                continue;
            }
            let row = values[1..]
                .iter()
                .map(|a| ScalarValue::try_from_array(a, i))
                .collect::<Result<Vec<_>>>()?;
            self.push(key, row);
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        for i in 0..lists.len() {
            if lists.is_null(i) {
                continue;
            }
            let value = lists.value(i);
            let s = value.as_struct();
            let keys = s.column(0).as_primitive::<UInt64Type>();
            for r in 0..s.len() {
                if keys.value(r) >= self.threshold {
                    continue;
                }
                let row = s.columns()[1..]
                    .iter()
                    .map(|a| ScalarValue::try_from_array(a, r))
                    .collect::<Result<Vec<_>>>()?;
                self.push(keys.value(r), row);
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.trim();
        let keys = self.rows.iter().map(|r| r.0).collect();
        let rows: Vec<&Vec<ScalarValue>> = self.rows.iter().map(|r| &r.1).collect();
        Ok(vec![self.to_list("key", keys, &rows)?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.trim();
        self.rows.sort_unstable_by_key(|r| r.0);
        let pos = (1..=self.rows.len() as u64).collect();
        let rows: Vec<&Vec<ScalarValue>> = self.rows.iter().map(|r| &r.1).collect();
        self.to_list("pos", pos, &rows)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.rows.capacity() * std::mem::size_of::<(u64, Vec<ScalarValue>)>()
            + self.bytes
    }
}

// ---- a unit's exact total (round 48) ----------------------------------------------------------

/// The grid of a unit's total for one `dp_sum` (round 48, review "topgroups" F2). A unit's total
/// per group was a float sum in the order its rows and partial states arrived (per row and per
/// merged state in [`TopGroups`], DataFusion's Float64 `sum` without GROUP BY): with values the
/// analyst chooses through CASE (1e300, −1e300, 5) a total was 0 or 5 by the order of the
/// partitions' states, which another unit's volume steered (a release moved by 1,500 with
/// sensitivity 10). Now a total is Σ q(v) over the unit's non-NULL, non-NaN values, in `i128`
/// with wrapping addition (associative and commutative: a function of the multiset of values
/// alone, whatever the order, partitioning or spilling; exact unless more than 2^46 values reach
/// the extreme), where
///
/// - g = 2^e with e = ⌈log2 u⌉ − 40, u = max(|lower|, |upper|) of the call (the grid `dp_sum`
///   quantises its values on, `FixedPoint`: e clamped to [−1023, 984], e = 0 when u = 0), and
/// - q(v) = round(clamp(v/g, −2^80, 2^80)) (to nearest, ties to even; ±∞ clamp to ±2^80), so the
///   values are clamped to ±R = ±2^80·g ≥ ±2^40·u.
///
/// The total the call reads is (Σ q)·g as `f64` ([`Grid::total`]), which `dp_sum` clamps to
/// [lower, upper] as any value: a total within ±2^53·g is exact on the call's own grid. Calls
/// share a total only on one value, FILTER and grid. The grid depends on the call's literals
/// only, so it is public; it decides the precision of a total, never whether it is a function of
/// the unit's rows alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Grid {
    /// e: the grid is 2^e.
    exp: i32,
}

/// The largest |q(v)|: values are clamped to ±2^80 grid steps (2^40 times the bound).
const GRID_REACH: i32 = 80;

impl Grid {
    /// The grid of values bounded by [lower, upper] (finite, lower ≤ upper).
    pub(super) fn for_bounds(lower: f64, upper: f64) -> Self {
        let exp = dpfusion_udfs::mechanisms::exact::FixedPoint::new(lower, upper).exp;
        Self { exp }
    }

    /// The grid of the call `name` with literal parameters `params` (its `lower` and `upper`).
    fn of_call(name: &str, params: &[ScalarValue]) -> Result<Self> {
        use dpfusion_udfs::aggregates::{params::Params, registry};
        let bounds = registry::get(name)
            .filter(|a| a.position("lower").is_some() && a.position("upper").is_some())
            .ok_or_else(|| {
                DataFusionError::Internal(format!("{name} totals a unit's values without bounds"))
            })
            .and_then(|a| {
                Params::new(a, params)
                    .and_then(|p| p.bounds())
                    .map_err(|e| DataFusionError::Plan(format!("{name}: {e}")))
            })?;
        Ok(Self::for_bounds(bounds.0, bounds.1))
    }

    /// q(v) of a value, `None` for NaN (skipped like NULL).
    pub(super) fn quantise(self, v: f64) -> Option<i128> {
        use dpfusion_udfs::mechanisms::exact::pow2;
        if v.is_nan() {
            return None;
        }
        // −e ∈ [−984, 1023]: 2^−e is a finite power of two, and the product is v/g exactly
        // (or ±∞ or a rounded tiny value past the range: a function of v all the same).
        let reach = pow2(GRID_REACH);
        let y = (v * pow2(-self.exp)).clamp(-reach, reach);
        Some(y.round_ties_even() as i128)
    }

    /// The total of a sum of q(v): (Σ q)·g, rounded once to `f64`.
    pub(super) fn total(self, sum: i128) -> f64 {
        sum as f64 * dpfusion_udfs::mechanisms::exact::pow2(self.exp)
    }
}

/// Bytes of a sum of q(v) in a partial state: the `i128`, little-endian (exact).
const SUM_BYTES: i32 = 16;

/// The type of a sum of q(v) in a partial state.
pub(super) fn sum_type() -> DataType {
    DataType::FixedSizeBinary(SUM_BYTES)
}

/// Sums of q(v) as a partial state's column (NULL: no value counted).
pub(super) fn sums_array(sums: impl IntoIterator<Item = Option<i128>>) -> Result<ArrayRef> {
    use datafusion::arrow::array::FixedSizeBinaryArray;
    let bytes = sums.into_iter().map(|s| s.map(i128::to_le_bytes));
    Ok(Arc::new(
        FixedSizeBinaryArray::try_from_sparse_iter_with_size(bytes, SUM_BYTES)?,
    ))
}

/// Row `i` of a partial state's column of sums ([`sums_array`]).
pub(super) fn sum_at(
    column: &datafusion::arrow::array::FixedSizeBinaryArray,
    i: usize,
) -> Option<i128> {
    column
        .is_valid(i)
        .then(|| i128::from_le_bytes(column.value(i).try_into().unwrap_or([0; 16])))
}

/// `__dpfusion_unit_total(value)`: a unit's exact total of a `dp_sum` value without GROUP BY
/// (aggregated by unit; with GROUP BY [`TopGroups`] keeps the same sums per entry): Σ q(v) on its
/// [`Grid`], NULL when no value counts. A [`GroupsAccumulator`] (one state for all units, as
/// DataFusion's `sum` it replaces) whose partial state is the exact `i128` sum.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct UnitTotal {
    grid: Grid,
    signature: Signature,
}

fn unit_total_udaf(grid: Grid) -> AggregateUDF {
    AggregateUDF::from(UnitTotal {
        grid,
        signature: Signature::exact(vec![DataType::Float64], Volatility::Immutable),
    })
}

impl AggregateUDFImpl for UnitTotal {
    fn name(&self) -> &str {
        TOTAL_FN
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}[sum]", args.name),
            sum_type(),
            true,
        ))])
    }
    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(UnitTotalAccumulator::new(self.grid)))
    }
    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }
    fn create_groups_accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(UnitTotalAccumulator::new(self.grid)))
    }
}

/// The sums of [`UnitTotal`]: per group, Σ q(v) (wrapping) and whether any value counted.
#[derive(Debug)]
struct UnitTotalAccumulator {
    grid: Grid,
    sums: Vec<i128>,
    valid: Vec<bool>,
}

impl UnitTotalAccumulator {
    fn new(grid: Grid) -> Self {
        Self {
            grid,
            sums: vec![],
            valid: vec![],
        }
    }

    fn grow(&mut self, groups: usize) {
        if self.sums.len() < groups {
            self.sums.resize(groups, 0);
            self.valid.resize(groups, false);
        }
    }

    fn add(&mut self, group: usize, sum: Option<i128>) {
        if let Some(s) = sum {
            self.sums[group] = self.sums[group].wrapping_add(s);
            self.valid[group] = true;
        }
    }

    /// The groups `emit_to` takes: their sums, NULL where no value counted.
    fn take(&mut self, emit_to: EmitTo) -> Vec<Option<i128>> {
        let sums = emit_to.take_needed(&mut self.sums);
        let valid = emit_to.take_needed(&mut self.valid);
        sums.into_iter()
            .zip(valid)
            .map(|(s, v)| v.then_some(s))
            .collect()
    }
}

fn counts(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

impl GroupsAccumulator for UnitTotalAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let v = values[0].as_primitive::<Float64Type>();
        for (i, &g) in group_indices.iter().enumerate() {
            if counts(opt_filter, i) && v.is_valid(i) {
                self.add(g, self.grid.quantise(v.value(i)));
            }
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let sums = values[0].as_fixed_size_binary();
        for (i, &g) in group_indices.iter().enumerate() {
            self.add(g, sum_at(sums, i));
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let grid = self.grid;
        let totals: Float64Array = self
            .take(emit_to)
            .into_iter()
            .map(|s| s.map(|s| grid.total(s)))
            .collect();
        Ok(Arc::new(totals))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![sums_array(self.take(emit_to))?])
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let v = values[0].as_primitive::<Float64Type>();
        let sums = (0..v.len()).map(|i| {
            (counts(opt_filter, i) && v.is_valid(i))
                .then(|| self.grid.quantise(v.value(i)))
                .flatten()
        });
        Ok(vec![sums_array(sums)?])
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.sums.capacity() * std::mem::size_of::<i128>()
            + self.valid.capacity()
    }
}

/// One group (DataFusion asks for a plain accumulator where it runs no groups accumulator).
impl Accumulator for UnitTotalAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        GroupsAccumulator::update_batch(self, values, &vec![0; values[0].len()], None, 1)
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        GroupsAccumulator::merge_batch(self, states, &vec![0; states[0].len()], 1)
    }
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.grow(1);
        let sum = self.valid[0].then_some(self.sums[0]);
        Ok(vec![ScalarValue::FixedSizeBinary(
            SUM_BYTES,
            sum.map(|s| s.to_le_bytes().to_vec()),
        )])
    }
    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.grow(1);
        let total = self.valid[0].then(|| self.grid.total(self.sums[0]));
        Ok(ScalarValue::Float64(total))
    }
    fn size(&self) -> usize {
        GroupsAccumulator::size(self)
    }
}

/// `plan` (a checked private region) with the unit column carried up to its output, and the
/// expression that reads it there.
fn expose(plan: &LogicalPlan, column: &str, table: &TableInfo) -> Result<(LogicalPlan, Expr)> {
    // A unit join's side, bounded per unit before the join, passes its unit on (round 48).
    if let Some(unit) = prebound_unit_column(plan) {
        return Ok((plan.clone(), Expr::Column(unit)));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    /// Round 49 (review "types", L1): a NULL struct's hidden fields are NULL in the key a unit's
    /// entry stores, so no row-level call reads the first row's hidden value; visible values,
    /// and NULL structs inside lists, are canonical alike.
    #[test]
    fn a_null_structs_hidden_fields_are_null_in_the_stored_key() {
        use datafusion::arrow::array::{AsArray, StructArray};
        use datafusion::arrow::buffer::NullBuffer;
        let fields = vec![Arc::new(Field::new("a", DataType::Int64, true))];
        let child: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
        let s: ArrayRef = Arc::new(StructArray::new(
            fields.into(),
            vec![child],
            Some(NullBuffer::from(vec![true, false, true])),
        ));
        let got = canonical_key(&s);
        let a = got
            .as_struct()
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![Some(1), None, Some(3)]);
        assert!(got.is_null(1) && got.is_valid(0));
        // The same inside a list: the item's hidden field is NULL too.
        let offsets = datafusion::arrow::buffer::OffsetBuffer::new(vec![0i32, 3].into());
        let item = Arc::new(Field::new("item", s.data_type().clone(), true));
        let list: ArrayRef = Arc::new(datafusion::arrow::array::ListArray::new(
            item, offsets, s, None,
        ));
        let got = canonical_key(&list);
        let items = got.as_list::<i32>().values().as_struct().column(0).clone();
        assert!(items.is_null(1) && items.is_valid(0));
        // A struct in a NULL struct: its field is NULL too (every depth).
        let inner_fields = vec![Arc::new(Field::new("a", DataType::Int64, true))];
        let inner: ArrayRef = Arc::new(StructArray::new(
            inner_fields.into(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef],
            None,
        ));
        let outer: ArrayRef = Arc::new(StructArray::new(
            vec![Arc::new(Field::new("s", inner.data_type().clone(), true))].into(),
            vec![inner],
            Some(NullBuffer::from(vec![true, false, true])),
        ));
        let got = canonical_key(&outer);
        let leaf = got.as_struct().column(0).as_struct().column(0).clone();
        assert!(leaf.is_null(1) && leaf.is_valid(0) && leaf.is_valid(2));
        // Nothing hidden: the same array back.
        let plain: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        assert!(Arc::ptr_eq(&canonical_key(&plain), &plain) || canonical_key(&plain) == plain);
    }

    #[test]
    fn the_group_key_is_never_printed() {
        let key = [0x0123_4567_89ab_cdef_u64, 0x0fed_cba9_8765_4321];
        let f = ScalarUDF::from(GroupKey::new(key));
        let e = f.call(vec![col(UNIT), col("g")]);
        let shown = format!("{e} {e:?} {f:?} {}", e.schema_name());
        for k in key {
            assert!(!shown.contains(&k.to_string()), "{shown}");
            assert!(!shown.contains(&format!("{k:x}")), "{shown}");
        }
    }

    #[test]
    fn the_group_key_is_a_keyed_function_of_the_values() {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 1, 2])),
            Arc::new(Int64Array::from(vec![7, 7, 7])),
        ];
        let hash = |key| {
            let args = ScalarFunctionArgs {
                args: arrays.iter().cloned().map(ColumnarValue::Array).collect(),
                arg_fields: (0..2)
                    .map(|_| Arc::new(Field::new("a", DataType::Int64, false)))
                    .collect(),
                number_rows: 3,
                return_field: Arc::new(Field::new("h", DataType::UInt64, false)),
                config_options: Arc::new(Default::default()),
            };
            let ColumnarValue::Array(a) = GroupKey::new(key).invoke_with_args(args).unwrap() else {
                panic!("an array")
            };
            a.as_primitive::<UInt64Type>().values().to_vec()
        };
        let h = hash([1, 2]);
        assert_eq!(h[0], h[1], "the same (unit, group): the same hash");
        assert_ne!(h[0], h[2]);
        assert_eq!(h, hash([1, 2]), "deterministic under a key");
        assert_ne!(h, hash([3, 4]), "another key, other hashes");
    }

    #[test]
    fn the_sample_keeps_at_most_c_rows_and_merges_to_c() {
        let ids = RowIds::default();
        let new = || SampleAccumulator::new(3, [1, 2], ids.clone(), vec![DataType::Int64]).unwrap();
        let batch = |lo: i64| -> Vec<ArrayRef> {
            vec![
                Arc::new(UInt64Array::from(vec![3u64; 500])),
                Arc::new(Int64Array::from_iter_values(lo..lo + 500)),
            ]
        };
        let (mut a, mut b) = (new(), new());
        a.update_batch(&batch(0)).unwrap();
        b.update_batch(&batch(1000)).unwrap();
        let state = b.state().unwrap()[0].to_array().unwrap();
        a.merge_batch(&[state]).unwrap();
        let ScalarValue::List(list) = a.evaluate().unwrap() else {
            panic!("a list")
        };
        let rows = list.value(0);
        let rows = rows.as_struct();
        assert_eq!(rows.len(), 3);
        let pos = rows.column(0).as_primitive::<UInt64Type>();
        assert_eq!(pos.values().to_vec(), vec![1, 2, 3]);
        // Every row is a row of one of the two inputs, none twice.
        let mut v = rows
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .values()
            .to_vec();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), 3);
        assert!(
            v.iter()
                .all(|x| (0..500).contains(x) || (1000..1500).contains(x))
        );
    }

    /// The row sample draws from the query's key: the same key and rows give the same sample
    /// (an insecure test seed reproduces a unit query), another key another one; with no
    /// sampled column (`dp_count(*)`) it still keeps C rows.
    #[test]
    fn the_sample_is_a_function_of_the_query_key() {
        let values: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(vec![3u64; 200])),
            Arc::new(Int64Array::from_iter_values(0..200)),
        ];
        let sample = |key: [u64; 2]| {
            let mut a =
                SampleAccumulator::new(3, key, RowIds::default(), vec![DataType::Int64]).unwrap();
            a.update_batch(&values).unwrap();
            sampled(&mut a)
        };
        assert_eq!(sample([1, 2]), sample([1, 2]));
        assert_ne!(sample([1, 2]), sample([3, 4]));
        let mut none = SampleAccumulator::new(3, [1, 2], RowIds::default(), vec![]).unwrap();
        none.update_batch(&values[..1]).unwrap();
        let ScalarValue::List(list) = none.evaluate().unwrap() else {
            panic!("a list")
        };
        assert_eq!(list.value(0).len(), 3);
    }

    /// The values of an Int64 sample's rows, in key order.
    fn sampled(a: &mut SampleAccumulator) -> Vec<i64> {
        let ScalarValue::List(list) = a.evaluate().unwrap() else {
            panic!("a list")
        };
        let rows = list.value(0);
        rows.as_struct()
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .values()
            .to_vec()
    }

    /// Round 48, review "topgroups" F2: a total's grid is its `dp_sum`'s (2^(⌈log2 u⌉ − 40),
    /// u = max(|lower|, |upper|)); q clamps ±∞ (and values past ±2^40·u) to ±2^80 steps, skips
    /// NaN, is odd, and a total within the bounds comes back exactly.
    #[test]
    fn a_totals_grid_is_its_bounds_and_q_is_exact_within_them() {
        use dpfusion_udfs::mechanisms::exact::{FixedPoint, pow2};
        for (lower, upper) in [(0.0, 10.0), (-3.0, 1e6), (0.0, pow2(-1000)), (-1e300, 0.0)] {
            let grid = Grid::for_bounds(lower, upper);
            let step = FixedPoint::new(lower, upper).step();
            assert_eq!(grid.total(1), step, "[{lower}, {upper}]");
            let reach = 1i128 << 80;
            assert_eq!(grid.quantise(f64::INFINITY), Some(reach));
            assert_eq!(grid.quantise(f64::NEG_INFINITY), Some(-reach));
            // Past R = 2^80 steps (≥ 2^40·u), values clamp to it.
            assert_eq!(grid.quantise(grid.total(reach) * 2.0), Some(reach));
            assert_eq!(grid.quantise(f64::NAN), None);
            for v in [lower, upper, upper / 3.0, 0.1 * upper] {
                let q = grid.quantise(v).unwrap();
                assert_eq!(grid.quantise(-v), Some(-q));
                // On the grid and within the bounds, a value's total is the value.
                assert_eq!(
                    grid.total(grid.quantise(grid.total(q)).unwrap()),
                    grid.total(q)
                );
            }
            // (These bounds are on their grid: 2^−1000's is the floor 2^−1023, as dp_sum's.)
            assert_eq!(grid.total(grid.quantise(upper).unwrap()), upper);
        }
        // No bound (lower = upper = 0, dp_sum releases 0): a grid all the same.
        assert_eq!(Grid::for_bounds(0.0, 0.0).total(1), 1.0);
    }

    /// The no-GROUP-BY totals ([`UnitTotal`]): three partial states of two units' values that
    /// cancel in floating point, merged in all 6 orders, give one total per unit, bit for bit:
    /// the exact sum on the grid of [0, 10] (5 and −2.5; a float `sum` gave 0 or 5 by the order,
    /// round 48, review "topgroups" F2). Also from the rows in any order, converted row by row,
    /// or through the one-group accumulator; a unit with only NULL or NaN values has no total.
    #[test]
    fn a_units_total_without_group_by_is_one_value_in_all_6_orders_of_3_partial_states() {
        let grid = Grid::for_bounds(0.0, 10.0);
        // (unit, value): unit 2's values are all NULL or NaN.
        let parts: [&[(usize, Option<f64>)]; 3] = [
            &[(0, Some(1e300)), (1, Some(-1e300)), (2, None)],
            &[(0, Some(-1e300)), (1, Some(1e300)), (2, Some(f64::NAN))],
            &[(0, Some(5.0)), (1, Some(-2.5)), (0, Some(1e-30))],
        ];
        let input = |rows: &[(usize, Option<f64>)]| -> (Vec<ArrayRef>, Vec<usize>) {
            let v = Float64Array::from_iter(rows.iter().map(|r| r.1));
            (vec![Arc::new(v)], rows.iter().map(|r| r.0).collect())
        };
        let totals = |a: &mut UnitTotalAccumulator| -> Vec<Option<u64>> {
            let t = GroupsAccumulator::evaluate(a, EmitTo::All).unwrap();
            let t = t.as_primitive::<Float64Type>();
            (0..t.len())
                .map(|i| t.is_valid(i).then(|| t.value(i).to_bits()))
                .collect()
        };
        let states: Vec<Vec<ArrayRef>> = parts
            .iter()
            .map(|rows| {
                let mut a = UnitTotalAccumulator::new(grid);
                let (v, g) = input(rows);
                GroupsAccumulator::update_batch(&mut a, &v, &g, None, 3).unwrap();
                GroupsAccumulator::state(&mut a, EmitTo::All).unwrap()
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let mut orders = vec![];
        for a in 0..3 {
            for b in (0..3).filter(|&b| b != a) {
                orders.push([a, b, 3 - a - b]);
            }
        }
        assert_eq!(orders.len(), 6);
        for order in orders {
            let mut merged = UnitTotalAccumulator::new(grid);
            for i in order {
                GroupsAccumulator::merge_batch(&mut merged, &states[i], &[0, 1, 2], 3).unwrap();
            }
            seen.insert(totals(&mut merged));
            let rows: Vec<(usize, Option<f64>)> = order
                .iter()
                .flat_map(|&i| parts[i].iter().copied())
                .collect();
            let (v, g) = input(&rows);
            let mut updated = UnitTotalAccumulator::new(grid);
            GroupsAccumulator::update_batch(&mut updated, &v, &g, None, 3).unwrap();
            seen.insert(totals(&mut updated));
            let mut converted = UnitTotalAccumulator::new(grid);
            let state = converted.convert_to_state(&v, None).unwrap();
            GroupsAccumulator::merge_batch(&mut converted, &state, &g, 3).unwrap();
            seen.insert(totals(&mut converted));
            // Unit 0 alone through the one-group accumulator, its states merged in this order.
            let mut one = UnitTotalAccumulator::new(grid);
            for i in order {
                let mut part = UnitTotalAccumulator::new(grid);
                let mine: Vec<Option<f64>> =
                    parts[i].iter().filter(|r| r.0 == 0).map(|r| r.1).collect();
                Accumulator::update_batch(&mut part, &[Arc::new(Float64Array::from(mine))])
                    .unwrap();
                let state = Accumulator::state(&mut part).unwrap();
                let state: Vec<ArrayRef> = state.iter().map(|s| s.to_array().unwrap()).collect();
                Accumulator::merge_batch(&mut one, &state).unwrap();
            }
            let ScalarValue::Float64(Some(t)) = Accumulator::evaluate(&mut one).unwrap() else {
                panic!("a total")
            };
            assert_eq!(t, 5.0);
        }
        let expected = vec![Some(5.0f64.to_bits()), Some((-2.5f64).to_bits()), None];
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![expected]);
    }

    /// Round 46: a unit's rows {a, a, b} with C = 1 keep `a` with probability 2/3 whether they
    /// reach one accumulator or two (`a` in one, `a, b` in the other): every row of the query
    /// has its own id. (With a row's position as its id, the split gave 1/2: equal rows at one
    /// position of two partitions shared a key.) Over 6,000 query keys; 2/3 ± 0.025 is over 4
    /// standard deviations.
    #[test]
    fn a_units_sample_is_uniform_however_its_rows_are_split() {
        let rows = |v: &[i64]| -> Vec<ArrayRef> {
            vec![
                Arc::new(UInt64Array::from(vec![1u64; v.len()])),
                Arc::new(Int64Array::from(v.to_vec())),
            ]
        };
        let kept = |a: &mut SampleAccumulator| sampled(a)[0];
        let (mut whole, mut split) = (0u32, 0u32);
        let n = 6_000u64;
        for seed in 0..n {
            let key = [seed, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)];
            let ids = RowIds::default();
            let new = || SampleAccumulator::new(1, key, ids.clone(), vec![DataType::Int64]);
            let mut one = new().unwrap();
            one.update_batch(&rows(&[7, 7, 9])).unwrap();
            whole += u32::from(kept(&mut one) == 7);
            let ids = RowIds::default();
            let new = || SampleAccumulator::new(1, key, ids.clone(), vec![DataType::Int64]);
            let (mut first, mut second) = (new().unwrap(), new().unwrap());
            first.update_batch(&rows(&[7])).unwrap();
            second.update_batch(&rows(&[7, 9])).unwrap();
            let state = second.state().unwrap()[0].to_array().unwrap();
            first.merge_batch(&[state]).unwrap();
            split += u32::from(kept(&mut first) == 7);
        }
        for (what, count) in [("whole", whole), ("split", split)] {
            let p = f64::from(count) / n as f64;
            assert!((p - 2.0 / 3.0).abs() < 0.025, "{what}: P(a) = {p}");
        }
    }
}
