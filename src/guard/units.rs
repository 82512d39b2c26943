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
//!       Projection  unit, __dpfusion_kept.c0 AS g, …             (L0; only with GROUP BY)
//!         Unnest  __dpfusion_kept (list, then struct)
//!           Aggregate  GROUP BY __dpfusion_unit,
//!                      CASE WHEN __dpfusion_unit IS NULL THEN h END AS __dpfusion_no_unit:
//!                      __dpfusion_unit_groups(K, h, g, totals, sample) AS __dpfusion_kept
//!                      (h = __dpfusion_unit_group_key(__dpfusion_unit, g))
//!             Aggregate  GROUP BY unit AS __dpfusion_unit, g:
//!                        sum(value) AS __dpfusion_total_i         (per dp_sum value and FILTER)
//!                        __dpfusion_unit_sample(C, x…) AS __dpfusion_sample (if a call reads rows)
//!               the private region (scan, WHERE, projections, joins), the unit column carried up
//! ```
//!
//! Nothing sorts: both steps are DataFusion's hash aggregate (parallel, spilling to disk under the
//! memory pool), the second over the (unit, group) rows, with a state of at most K rows per unit
//! ([`TopGroups`], a `GroupsAccumulator`).
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
//!   - [`Contribution::Total`] (`dp_sum`): the unit's total per group, one value (`sum(value)`
//!     of the (unit, group)), which `dp_sum` clamps to [lower, upper] like any value: the
//!     per-unit pre-aggregation of ZetaSQL's `ANON_SUM`;
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
//! unit column traced to the scan, C in the sample's literal, K in the limit over the ranking).
//!
//! Each selection depends only on the unit's own rows, the key and randomness, so after it one
//! unit changes at most K groups, and each by at most C rows (or one value): the sensitivity
//! bounds of `units:K:C` hold for every data set. Rows whose unit is NULL belong to no unit:
//! every call's FILTER leaves them out (they stay in the plan only so that the NULL-extended
//! row of a public key set keeps its group, join.rs). Any number of calls on any columns share
//! the one aggregate (calls on the same value and FILTER share one total).
use std::sync::Arc;

use std::hash::Hasher;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, StructArray, UInt64Array, new_empty_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Column, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, Aggregate, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, Filter, Join,
    LogicalPlan, LogicalPlanBuilder, Projection, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, SubqueryAlias, TableScanBuilder, Volatility, cast, col, lit, when,
};
use dpfusion_udfs::noise::rng::SecureRng;

use super::{TableInfo, bare_column, refuse};

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
/// Each unit's K groups of smallest keyed hash ([`TopGroups`]).
pub(super) const TOP_GROUPS_FN: &str = "__dpfusion_unit_groups";
/// The kept (unit, group) rows of a unit ([`TopGroups`]).
pub(super) const KEPT: &str = "__dpfusion_kept";
/// The second key of the per-unit aggregate: NULL for a unit, the (unit, group)'s hash for the
/// rows without a unit (each its own group: they are all kept).
pub(super) const NO_UNIT: &str = "__dpfusion_no_unit";

/// Whether a function is one of the bounding's own (they hold per-query state, such as the
/// secret group key, that no codec carries: the distributed path refuses plans with them).
#[cfg_attr(not(feature = "distributed"), allow(dead_code))]
pub(crate) fn is_bounding_fn(name: &str) -> bool {
    name == GROUP_KEY_FN || name == SAMPLE_FN || name == TOP_GROUPS_FN
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
    /// The per-(unit, group) totals of the `dp_sum` calls, with their column names.
    totals: Vec<(Expr, String)>,
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

    /// The GROUP BY key `i` as the DP aggregate reads it: the column the per-(unit, group)
    /// aggregate outputs for it.
    pub fn group_ref(&self, i: usize) -> Expr {
        match &self.groups[i] {
            c @ Expr::Column(_) => c.clone(),
            g => Expr::Column(Column::from_name(g.schema_name().to_string())),
        }
    }

    fn group_refs(&self) -> Vec<Expr> {
        (0..self.groups.len()).map(|i| self.group_ref(i)).collect()
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
                let total = datafusion::functions_aggregate::expr_fn::sum(value);
                // Calls on the same value and FILTER (dp_sum beside dp_sum_ci, say) share one
                // total: each call draws its own noise.
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
        // 1. one row per (unit, group): DataFusion's hash aggregate (parallel, spills).
        let mut group = vec![self.unit.clone().alias(UNIT)];
        group.extend(self.groups.iter().cloned());
        let mut aggr: Vec<Expr> = self
            .totals
            .iter()
            .map(|(e, name)| e.clone().alias(name))
            .collect();
        let cap = u64::from(self.bounds.rows);
        if self.rows {
            let mut args = vec![lit(cap)];
            args.extend(self.sampled.iter().cloned().map(Expr::Column));
            aggr.push(sample_udaf(cap, self.key).call(args).alias(SAMPLE));
        }
        let mut plan = LogicalPlan::Aggregate(Aggregate::try_new(
            Arc::new(self.region.clone()),
            group,
            aggr,
        )?);
        // 2. L0: each unit keeps its K groups of smallest keyed hash (only with GROUP BY): an
        //    aggregate by unit over the (unit, group) rows whose state per unit is the K rows of
        //    smallest hash (no sort; it spills like any aggregate), unnested back into rows.
        if !self.groups.is_empty() {
            let carried: Vec<Column> = plan
                .schema()
                .columns()
                .into_iter()
                .filter(|c| c.name != UNIT)
                .collect();
            let mut keyed = vec![col(UNIT)];
            keyed.extend(self.group_refs());
            let hash = ScalarUDF::from(GroupKey::new(self.key)).call(keyed);
            let mut args = vec![lit(u64::from(self.bounds.groups)), hash.clone()];
            args.extend(carried.iter().cloned().map(Expr::Column));
            // Rows without a unit are kept, each (group) its own (they reach no call; see `new`).
            let no_unit = when(col(UNIT).is_null(), hash).end()?.alias(NO_UNIT);
            plan = LogicalPlan::Aggregate(Aggregate::try_new(
                Arc::new(plan),
                vec![col(UNIT), no_unit],
                vec![top_groups_udaf().call(args).alias(KEPT)],
            )?);
            plan = LogicalPlanBuilder::from(plan)
                .unnest_column(Column::from_name(KEPT))?
                .unnest_column(Column::from_name(KEPT))?
                .build()?;
            let mut cols = vec![col(UNIT)];
            for (j, c) in carried.iter().enumerate() {
                cols.push(
                    Expr::Column(Column::from_name(format!("{KEPT}.c{j}")))
                        .alias_qualified(c.relation.clone(), &c.name),
                );
            }
            plan = LogicalPlan::Projection(Projection::try_new(cols, Arc::new(plan))?);
        }
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

// ---- the group choice: a keyed hash of (unit, group) ---------------------------------------------

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
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
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
/// row's values and its position among the rows its accumulator met: to anyone without the key,
/// the keys of distinct (row, position) pairs are independent and uniform, so the C smallest are
/// a uniform sample without replacement, whatever the partitioning (partial states keep their C
/// smallest; merging keeps the C smallest of the union: only two equal rows at the same position
/// of two partial accumulators share a key, and they are the same values). Under a fixed seed
/// the sample is a function of the data and its partitioning into batches: a unit query is
/// reproducible. Privacy does not rest on the keys (any choice that reads only the unit's own
/// rows keeps the bounds), only the absence of bias does.
#[derive(PartialEq, Eq, Hash)]
pub(super) struct Sample {
    cap: u64,
    key: [u64; 2],
    signature: Signature,
}

impl std::fmt::Debug for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sample {{ cap: {}, key: <secret> }}", self.cap)
    }
}

fn sample_udaf(cap: u64, query_key: [u64; 2]) -> AggregateUDF {
    // A key of its own (domain-separated from the group choice's): SipHash of the query key.
    let derive = |i: u64| {
        #[allow(deprecated)] // SipHash-2-4 with a key: the PRF wanted, in std.
        let mut h = std::hash::SipHasher::new_with_keys(query_key[0], query_key[1]);
        h.write(b"dpfusion unit row sample");
        h.write_u64(i);
        h.finish()
    };
    AggregateUDF::from(Sample {
        cap,
        key: [derive(0), derive(1)],
        signature: Signature::variadic_any(Volatility::Volatile),
    })
}

/// The struct of a sample's rows: `first` (`pos` or `key`), then `c0, c1, …` of `types`.
fn sample_fields(first: &str, types: &[DataType]) -> Fields {
    std::iter::once(Field::new(first, DataType::UInt64, true))
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(j, t)| Field::new(format!("c{j}"), t.clone(), true)),
        )
        .collect()
}

fn list_of(fields: Fields) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(
        DataType::Struct(fields),
        true,
    )))
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
        Ok(Box::new(SampleAccumulator::new(self.cap, self.key, types)?))
    }
}

struct SampleAccumulator {
    /// C.
    cap: usize,
    /// The row keys' secret PRF key.
    key: [u64; 2],
    /// The rows met so far (a row's position).
    seen: u64,
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
    fn new(cap: u64, key: [u64; 2], types: Vec<DataType>) -> Result<Self> {
        let encoder = RowConverter::new(types.iter().cloned().map(SortField::new).collect())?;
        Ok(Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX).max(1),
            key,
            seen: 0,
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
        let values = StructArray::try_new(fields.clone(), arrays, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(fields), true));
        let list = ListArray::try_new(
            field,
            OffsetBuffer::from_lengths([values.len()]),
            Arc::new(values),
            None,
        )?;
        Ok(ScalarValue::List(Arc::new(list)))
    }
}

impl Accumulator for SampleAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let n = values.first().map_or(0, |a| a.len());
        // (With no sampled column, `dp_count(*)`, a row is its position.)
        let encoded = self.encoder.convert_columns(&values[1..])?;
        for i in 0..n {
            #[allow(deprecated)] // SipHash-2-4 with a key: the PRF wanted, in std.
            let mut h = std::hash::SipHasher::new_with_keys(self.key[0], self.key[1]);
            if encoded.num_rows() == n {
                h.write(encoded.row(i).as_ref());
            }
            h.write_u64(self.seen);
            self.seen += 1;
            let key = h.finish();
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

// ---- the group choice without sorting: each unit's K groups of smallest keyed hash -------------

/// `__dpfusion_unit_groups(K, hash, c0, c1, …)`, aggregated by unit over the per-(unit, group)
/// rows: the K rows of smallest `hash` ([`GroupKey`] of the (unit, group)) with their columns, as
/// a list of structs `{c0, c1, …}`. State per unit: at most K (hash, row) entries, the row a
/// reference into the input arrays held (no allocation per entry; `TopGroupsAccumulator`); a new
/// row with a smaller hash than the largest kept evicts it; merging keeps the K smallest of the
/// union. Which rows are kept depends only on the hashes (the
/// (unit, group) values and the secret key), never on the order or the partitioning: the same
/// choice as `row_number() OVER (PARTITION BY unit ORDER BY hash) <= K`, without the sort. A
/// [`GroupsAccumulator`](datafusion::logical_expr::GroupsAccumulator): one state vector for all
/// units (the per-unit `Accumulator` of DataFusion's adapter is slow at millions of units).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct TopGroups {
    signature: Signature,
}

pub(super) fn top_groups_udaf() -> AggregateUDF {
    AggregateUDF::from(TopGroups {
        signature: Signature::variadic_any(Volatility::Immutable),
    })
}

/// The struct of the kept rows: `c0, c1, …` of `types` (after `first`, if any: the hash).
fn kept_fields(first: Option<&str>, types: &[DataType]) -> Fields {
    first
        .map(|f| Field::new(f, DataType::UInt64, true))
        .into_iter()
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(j, t)| Field::new(format!("c{j}"), t.clone(), true)),
        )
        .collect()
}

impl AggregateUDFImpl for TopGroups {
    fn name(&self) -> &str {
        TOP_GROUPS_FN
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(list_of(kept_fields(None, &arg_types[2..])))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let types: Vec<DataType> = args.input_fields[2..]
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        Ok(vec![Arc::new(Field::new(
            format!("{}[kept]", args.name),
            list_of(kept_fields(Some("hash"), &types)),
            true,
        ))])
    }
    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Err(DataFusionError::Internal(format!(
            "{TOP_GROUPS_FN} runs as a groups accumulator only"
        )))
    }
    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }
    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn datafusion::logical_expr::GroupsAccumulator>> {
        let k = match args
            .exprs
            .first()
            .and_then(|e| e.downcast_ref::<datafusion::physical_expr::expressions::Literal>())
        {
            Some(l) => match l.value() {
                ScalarValue::UInt64(Some(k)) => *k,
                _ => 0,
            },
            None => 0,
        };
        if k == 0 {
            return Err(DataFusionError::Internal(format!(
                "{TOP_GROUPS_FN}: K must be a positive UInt64 literal"
            )));
        }
        let types = args.exprs[2..]
            .iter()
            .map(|e| e.data_type(args.schema))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(TopGroupsAccumulator::new(
            usize::try_from(k).unwrap_or(usize::MAX),
            types,
        )))
    }
}

/// The state of [`TopGroups`] for all units of one aggregate, without an allocation per entry:
/// each unit (group index `u`) owns S = min(K, [`INLINE`]) slots `u·S .. u·S + S` and, only if
/// K > S, a vector for its entries beyond S; its first `counts[u]` entries are kept, each a hash
/// and a reference to its row in `store`, the input arrays (update or merge batches) that a kept
/// entry still points into. Evicted rows stay in `store` until it holds more than twice the kept
/// entries (plus [`COMPACT_SLACK`]): then the kept rows are gathered into one batch (arrow's
/// `interleave`, any type) and the rest dropped, so the rows held stay O(entries) and each input
/// row is copied O(1) times (amortised).
struct TopGroupsAccumulator {
    k: usize,
    /// S: inline slots per unit.
    s: usize,
    types: Vec<DataType>,
    /// Per unit: how many entries it keeps (≤ K).
    counts: Vec<u32>,
    /// Per inline slot: the entry's keyed hash and its row, (batch of `store`, row in it).
    slots: Vec<Entry>,
    /// Per unit, if K > S: its entries beyond the S inline ones.
    more: Vec<Vec<Entry>>,
    /// The batches that kept rows point into: (rows, the columns).
    store: Vec<(usize, Vec<ArrayRef>)>,
    /// The rows of `store`.
    held: usize,
    /// The arrays' memory in `store`.
    store_bytes: usize,
    /// The entries kept, over all units.
    entries: usize,
    /// The entries in `more`.
    more_entries: usize,
}

/// A kept entry: its keyed hash, and its row as (batch of the store, row in it).
type Entry = (u64, (u32, u32));

/// Inline slots per unit (K is at most this in the usual policies).
const INLINE: usize = 8;

/// Rows the store may hold beyond twice the kept entries before it is compacted.
const COMPACT_SLACK: usize = 16_384;

impl std::fmt::Debug for TopGroupsAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TopGroupsAccumulator {{ k: {}, units: {} }}",
            self.k,
            self.counts.len()
        )
    }
}

impl TopGroupsAccumulator {
    fn new(k: usize, types: Vec<DataType>) -> Self {
        Self {
            k,
            s: k.min(INLINE),
            types,
            counts: vec![],
            slots: vec![],
            more: vec![],
            store: vec![],
            held: 0,
            store_bytes: 0,
            entries: 0,
            more_entries: 0,
        }
    }

    /// Unit `u`'s kept entries, mutable: its inline slots then the rest.
    fn entries_mut(&mut self, u: usize) -> impl Iterator<Item = &mut Entry> {
        let n = self.counts[u] as usize;
        let inline = &mut self.slots[u * self.s..u * self.s + n.min(self.s)];
        let more = self.more.get_mut(u).map(|v| v.iter_mut());
        inline.iter_mut().chain(more.into_iter().flatten())
    }

    /// Offers the entry (hash, row) to unit `unit`; true if kept.
    fn insert(&mut self, unit: usize, hash: u64, row: (u32, u32)) -> bool {
        let n = self.counts[unit] as usize;
        if n < self.k {
            if n < self.s {
                self.slots[unit * self.s + n] = (hash, row);
            } else {
                self.more[unit].push((hash, row));
                self.more_entries += 1;
            }
            self.counts[unit] += 1;
            self.entries += 1;
            return true;
        }
        // The largest kept hash; ties keep the entry already there (equal hashes are the same
        // (unit, group) under the PRF but for a negligible collision).
        let mut max: Option<&mut Entry> = None;
        for e in self.entries_mut(unit) {
            if max.as_ref().is_none_or(|m| e.0 > m.0) {
                max = Some(e);
            }
        }
        match max {
            Some(m) if hash < m.0 => {
                *m = (hash, row);
                true
            }
            _ => false,
        }
    }

    fn add_rows(
        &mut self,
        hashes: &UInt64Array,
        columns: &[ArrayRef],
        units: &[usize],
        filter: Option<&datafusion::arrow::array::BooleanArray>,
        total: usize,
    ) -> Result<()> {
        if self.counts.len() < total {
            self.counts.resize(total, 0);
            self.slots.resize(total * self.s, (0, (0, 0)));
            if self.k > self.s {
                self.more.resize_with(total, Vec::new);
            }
        }
        let batch = u32::try_from(self.store.len())
            .map_err(|_| DataFusionError::Internal(format!("{TOP_GROUPS_FN}: too many batches")))?;
        let mut used = false;
        for (i, &u) in units.iter().enumerate() {
            if filter.is_some_and(|f| !f.is_valid(i) || !f.value(i)) {
                continue;
            }
            // A NULL hash never happens (the hash of any value is a value); skip it if it did.
            if hashes.is_null(i) {
                continue;
            }
            let row = u32::try_from(i).map_err(|_| {
                DataFusionError::Internal(format!("{TOP_GROUPS_FN}: batch too large"))
            })?;
            used |= self.insert(u, hashes.value(i), (batch, row));
        }
        if used {
            self.held += units.len();
            self.store_bytes += columns
                .iter()
                .map(|c| c.get_array_memory_size())
                .sum::<usize>();
            self.store.push((units.len(), columns.to_vec()));
            if self.held > 2 * self.entries + COMPACT_SLACK {
                self.compact()?;
            }
        }
        Ok(())
    }

    /// The kept entries of units `0..n`, in unit order.
    fn kept(&mut self, n: usize) -> Vec<Entry> {
        let mut out = Vec::with_capacity(self.entries);
        for u in 0..n {
            out.extend(self.entries_mut(u).map(|e| *e));
        }
        out
    }

    /// The rows of `entries` (in order), gathered into arrays of `types`.
    fn gather(&self, entries: &[Entry]) -> Result<Vec<ArrayRef>> {
        let indices: Vec<(usize, usize)> = entries
            .iter()
            .map(|&(_, (b, r))| (b as usize, r as usize))
            .collect();
        (0..self.types.len())
            .map(|c| {
                if indices.is_empty() {
                    return Ok(new_empty_array(&self.types[c]));
                }
                let arrays: Vec<&dyn Array> = self
                    .store
                    .iter()
                    .map(|(_, cols)| cols[c].as_ref())
                    .collect();
                Ok(datafusion::arrow::compute::interleave(&arrays, &indices)?)
            })
            .collect()
    }

    /// Gathers the kept rows into one batch and drops the rest.
    fn compact(&mut self) -> Result<()> {
        let kept = self.kept(self.counts.len());
        let columns = self.gather(&kept)?;
        let mut next = 0u32;
        for u in 0..self.counts.len() {
            for e in self.entries_mut(u) {
                e.1 = (0, next);
                // At most u32::MAX rows in one array (the batch the aggregate emits).
                next = next.checked_add(1).ok_or_else(|| {
                    DataFusionError::Internal(format!("{TOP_GROUPS_FN}: too many entries"))
                })?;
            }
        }
        self.held = kept.len();
        self.store_bytes = columns.iter().map(|c| c.get_array_memory_size()).sum();
        self.store = vec![(kept.len(), columns)];
        Ok(())
    }

    /// The entries of the units `emit_to` takes, as a list of structs per unit (`hash` first if
    /// `with_hash`).
    fn emit(
        &mut self,
        emit_to: datafusion::logical_expr::EmitTo,
        with_hash: bool,
    ) -> Result<ArrayRef> {
        let n = match emit_to {
            datafusion::logical_expr::EmitTo::All => self.counts.len(),
            datafusion::logical_expr::EmitTo::First(n) => n.min(self.counts.len()),
        };
        let kept = self.kept(n);
        let columns = self.gather(&kept)?;
        let mut arrays: Vec<ArrayRef> = vec![];
        if with_hash {
            arrays.push(Arc::new(UInt64Array::from_iter_values(
                kept.iter().map(|e| e.0),
            )));
        }
        arrays.extend(columns);
        let lengths: Vec<usize> = self.counts[..n].iter().map(|&c| c as usize).collect();
        self.counts.drain(..n);
        self.slots.drain(..n * self.s);
        if self.k > self.s {
            self.more_entries -= self.more.drain(..n).map(|v| v.len()).sum::<usize>();
        }
        self.entries -= kept.len();
        if self.counts.is_empty() {
            self.store.clear();
            self.held = 0;
            self.store_bytes = 0;
        } else if self.held > 2 * self.entries + COMPACT_SLACK {
            self.compact()?;
        }
        let fields = kept_fields(with_hash.then_some("hash"), &self.types);
        let values = StructArray::try_new(fields.clone(), arrays, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(fields), true));
        Ok(Arc::new(ListArray::try_new(
            field,
            OffsetBuffer::from_lengths(lengths),
            Arc::new(values),
            None,
        )?))
    }
}

impl datafusion::logical_expr::GroupsAccumulator for TopGroupsAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&datafusion::arrow::array::BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        let hashes = values[1].as_primitive::<UInt64Type>().clone();
        self.add_rows(
            &hashes,
            &values[2..],
            group_indices,
            opt_filter,
            total_num_groups,
        )
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        let lists = values[0].as_list::<i32>();
        // Every entry of row i's list belongs to unit group_indices[i].
        let mut units = Vec::with_capacity(lists.values().len());
        let mut keep = Vec::with_capacity(lists.values().len());
        for (i, &u) in group_indices.iter().enumerate() {
            let on = !lists.is_null(i);
            let range = lists.value_offsets()[i] as usize..lists.value_offsets()[i + 1] as usize;
            for _ in range {
                units.push(u);
                keep.push(on);
            }
        }
        let start = lists.value_offsets()[0] as usize;
        let end = lists.value_offsets()[lists.len()] as usize;
        let entries = lists.values().slice(start, end - start);
        let entries = entries.as_struct();
        let hashes = entries.column(0).as_primitive::<UInt64Type>().clone();
        let filter = datafusion::arrow::array::BooleanArray::from(keep);
        self.add_rows(
            &hashes,
            &entries.columns()[1..],
            &units,
            Some(&filter),
            total_num_groups,
        )
    }

    fn evaluate(&mut self, emit_to: datafusion::logical_expr::EmitTo) -> Result<ArrayRef> {
        self.emit(emit_to, false)
    }

    /// DataFusion's partial aggregate stops grouping and calls this when it sees about as many
    /// units as rows (`skip_partial_aggregation_probe_*`, the usual case at millions of units):
    /// each input row becomes its own partial state, a list holding its one (hash, columns)
    /// entry, or an empty list where the FILTER is false or the hash NULL (what `update_batch`
    /// skips). `merge_batch` then keeps each unit's K smallest exactly as from grouped states.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&datafusion::arrow::array::BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        use datafusion::arrow::compute::filter;
        let hashes = values[1].as_primitive::<UInt64Type>();
        let keep: datafusion::arrow::array::BooleanArray = (0..hashes.len())
            .map(|i| {
                Some(!hashes.is_null(i) && opt_filter.is_none_or(|f| f.is_valid(i) && f.value(i)))
            })
            .collect();
        let mut arrays: Vec<ArrayRef> = vec![filter(hashes, &keep)?];
        for c in &values[2..] {
            arrays.push(filter(c.as_ref(), &keep)?);
        }
        let fields = kept_fields(Some("hash"), &self.types);
        let entries = StructArray::try_new(fields.clone(), arrays, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(fields), true));
        let lengths = keep.values().iter().map(usize::from);
        Ok(vec![Arc::new(ListArray::try_new(
            field,
            OffsetBuffer::from_lengths(lengths),
            Arc::new(entries),
            None,
        )?)])
    }

    fn state(&mut self, emit_to: datafusion::logical_expr::EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to, true)?])
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.counts.capacity() * std::mem::size_of::<u32>()
            + self.slots.capacity() * std::mem::size_of::<Entry>()
            + self.more.capacity() * std::mem::size_of::<Vec<Entry>>()
            + self.more_entries * std::mem::size_of::<Entry>()
            + self.store.capacity() * std::mem::size_of::<(usize, Vec<ArrayRef>)>()
            + self.store_bytes
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

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
        let new = || SampleAccumulator::new(3, [1, 2], vec![DataType::Int64]).unwrap();
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
            let mut a = SampleAccumulator::new(3, key, vec![DataType::Int64]).unwrap();
            a.update_batch(&values).unwrap();
            let ScalarValue::List(list) = a.evaluate().unwrap() else {
                panic!("a list")
            };
            let rows = list.value(0);
            rows.as_struct()
                .column(1)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        };
        assert_eq!(sample([1, 2]), sample([1, 2]));
        assert_ne!(sample([1, 2]), sample([3, 4]));
        let mut none = SampleAccumulator::new(3, [1, 2], vec![]).unwrap();
        none.update_batch(&values[..1]).unwrap();
        let ScalarValue::List(list) = none.evaluate().unwrap() else {
            panic!("a list")
        };
        assert_eq!(list.value(0).len(), 3);
    }

    /// Each unit keeps exactly its K rows of smallest hash, whatever the order and the split into
    /// partial states (merged), with their columns: K within the inline slots and beyond them,
    /// and with enough batches that the store is compacted on the way.
    #[test]
    fn the_top_groups_keep_the_k_smallest_hashes_of_each_unit() {
        for (k, per_unit, batch_rows) in [(3, 40, 80), (INLINE + 5, 40, 7), (3, 30_000, 512)] {
            top_groups_case(k, per_unit, batch_rows);
        }
    }

    /// Two units, `per_unit` rows each (row r: unit r mod 2, hash (37 r) mod n, value r), fed in
    /// batches of `batch_rows`.
    fn top_groups_case(k: usize, per_unit: usize, batch_rows: usize) {
        use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
        let new = || TopGroupsAccumulator::new(k, vec![DataType::Int64]);
        let n = 2 * per_unit;
        let rows: Vec<(usize, u64, i64)> = (0..n)
            .map(|r| (r % 2, (37 * r as u64) % n as u64, r as i64))
            .collect();
        let batch = |rows: &[(usize, u64, i64)]| -> (Vec<ArrayRef>, Vec<usize>) {
            (
                vec![
                    Arc::new(UInt64Array::from(vec![k as u64; rows.len()])) as ArrayRef,
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                ],
                rows.iter().map(|r| r.0).collect(),
            )
        };
        let feed = |a: &mut TopGroupsAccumulator, rows: &[(usize, u64, i64)]| {
            for chunk in rows.chunks(batch_rows) {
                let (v, g) = batch(chunk);
                a.update_batch(&v, &g, None, 2).unwrap();
            }
        };
        let values = |list: &ArrayRef| -> Vec<Vec<i64>> {
            let list = list.as_list::<i32>();
            (0..list.len())
                .map(|i| {
                    let v = list.value(i);
                    let s = v.as_struct();
                    let mut v = s
                        .column(s.num_columns() - 1)
                        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                        .values()
                        .to_vec();
                    v.sort_unstable();
                    v
                })
                .collect()
        };
        let kept = |a: &mut TopGroupsAccumulator| values(&a.evaluate(EmitTo::All).unwrap());
        let mut whole = new();
        feed(&mut whole, &rows);
        // The rows held stay bounded by the entries kept (the store is compacted).
        assert!(whole.held <= 2 * whole.entries + COMPACT_SLACK + batch_rows);
        // The expected: per unit, the values of its K smallest hashes.
        let expected: Vec<Vec<i64>> = (0..2)
            .map(|u| {
                let mut mine: Vec<_> = rows.iter().filter(|r| r.0 == u).collect();
                mine.sort_by_key(|r| r.1);
                let mut v: Vec<i64> = mine[..k.min(mine.len())].iter().map(|r| r.2).collect();
                v.sort_unstable();
                v
            })
            .collect();
        assert_eq!(kept(&mut whole), expected, "k = {k}");
        assert_eq!(
            (whole.entries, whole.held),
            (0, 0),
            "emptied by EmitTo::All"
        );
        // Reversed and split in two partial states, merged.
        let mut rev = rows.clone();
        rev.reverse();
        let (mut a, mut b, mut merged) = (new(), new(), new());
        feed(&mut a, &rev[..n / 3]);
        feed(&mut b, &rev[n / 3..]);
        for part in [&mut a, &mut b] {
            let state = part.state(EmitTo::All).unwrap();
            merged.merge_batch(&state, &[0, 1], 2).unwrap();
        }
        assert_eq!(kept(&mut merged), expected);
        // Emitted one unit at a time (EmitTo::First): the same.
        let mut first = new();
        feed(&mut first, &rev);
        let one = values(&first.evaluate(EmitTo::First(1)).unwrap());
        let two = values(&first.evaluate(EmitTo::First(1)).unwrap());
        assert_eq!([one, two].concat(), expected);
        // When the partial aggregate skips grouping (as many units as rows), every row is
        // converted to its own state (a FILTER-false row to an empty one) and merged: the same.
        let (v, g) = batch(&rev);
        let off: datafusion::arrow::array::BooleanArray =
            (0..rev.len()).map(|i| Some(i != 7)).collect();
        let mut converted = new();
        let state = converted.convert_to_state(&v, None).unwrap();
        converted.merge_batch(&state, &g, 2).unwrap();
        assert_eq!(kept(&mut converted), expected);
        let mut filtered = new();
        let state = filtered.convert_to_state(&v, Some(&off)).unwrap();
        assert_eq!(state[0].as_list::<i32>().value(7).len(), 0);
        filtered.merge_batch(&state, &g, 2).unwrap();
        let mut whole_filtered = new();
        whole_filtered.update_batch(&v, &g, Some(&off), 2).unwrap();
        assert_eq!(kept(&mut filtered), kept(&mut whole_filtered));
    }
}
