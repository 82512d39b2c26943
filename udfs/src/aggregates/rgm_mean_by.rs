//! `rgm_mean_by(value, by, max_ratio, epsilon[, delta[, min_group_size]])`: the mean of `value`
//! per group of the public column `by`, each released with noise proportional to the group's own
//! mean — the relative Gaussian mechanism (RGM) of Hendrikx, Mangold and Bellet (AISTATS 2024),
//! in the setting of their salary example (derivation: [`crate::mechanisms::rgm`]).
//!
//! # Why
//! `dp_mean(salary, 0, U, ε)` per job adds noise of a fixed size, set by the global bound U: a
//! job paid U/10 gets ten times the relative error of a job paid U. RGM scales the noise to each
//! group's mean, so the relative error is about the same for every group (σ·γ_g, which depends
//! only on the public group size). `docs/rgm_fairness.png` measures it on the demo table.
//!
//! # What it requires (checked by the dpfusion guard before anything runs)
//! The relative sensitivity of a group mean depends on the group size n_g, so n_g must be public
//! and fixed between neighbours: the table is registered with `replace` neighbours (a neighbour
//! changes one person's values, the number of rows is public), `by` is a public column, and no
//! WHERE filter or FILTER clause stands between the scan and the aggregate. The guard then sets
//! the hidden `neighbours` argument to `'replace_public_n'`; with any other value the call is
//! refused at planning (a plain DataFusion context can pass `'replace_public_n'` itself, which is
//! the caller's claim). An outer GROUP BY is allowed: its keys are then public too (the guard
//! sets `'replace_public_n'` only in that case), every person is in one outer group and one group
//! of `by`, and each outer group gets its own list.
//!
//! # The declared contract (a domain restriction, docs/research/rgm.md §7(a) "Requirement")
//! Every value is non-NULL, finite and > 0, and inside each group of `by` the largest value is at
//! most `max_ratio` = K times the smallest. It cannot be enforced by clipping without a public
//! per-group anchor, and cannot be tested privately; it is checked during execution, and a
//! violation fails the query with one fixed message that names no group and no value, before any
//! noise is drawn (nothing is released; the charge stands, PRIVACY.md). NULL and NaN values are
//! violations, not skipped: under `replace` neighbours a value may turn NULL (params.rs,
//! [`super::Neighbours::Replace`]), so skipping it would make the group sizes private again
//! (`dp_mean` imputes its midpoint instead, which has no analogue without bounds). Rows whose
//! `by` is NULL are skipped: `by` is public.
//!
//! # The release (docs/research/rgm.md §7(a) "Calibration"; mechanism: [`crate::mechanisms::rgm`])
//! For a group of n_g ≥ `min_group_size` rows with exact mean m_g:
//! - γ_g = (K² − 1)/(K(n_g − 1) + 1), A = 0 (docs/research/rgm.md §7(a), tight), plus rounding slack
//!   ([`noise_gamma`], [`accounted_gamma`]);
//! - one σ for all groups, the smallest meeting (ε, δ) for the worst admissible group,
//!   n = `min_group_size` (γ decreases with n), by the accountant's conversion
//!   ([`calibrate_rgm_sigma`]); so the cost is known before execution and never depends on data;
//! - the release m_g + σ·γ_g·m_g·Z, sampled exactly ([`release_relative`]); output
//!   `{group, mean, n}` with n = n_g (public).
//!
//! Groups smaller than `min_group_size` are left out (their sizes are public, so leaving them out
//! reveals nothing; n_g = 1 has unbounded relative sensitivity). Parallel composition: a
//! neighbour changes one value in one group and every other group's output has the same
//! distribution, so the call's RDP curve is the maximum over groups (docs/research/rgm.md §7(a) "Total cost"),
//! reached by the smallest admissible group. Recorded cost:
//! `Rgm { sigma: σ, gamma: γ*(min_group_size), dims: 1, steps: 1 }`.
//!
//! Infeasible targets (RGM has an ε floor, docs/research/rgm.md §3) fail at planning with the floor and the
//! smallest `min_group_size` that would work.
//!
//! # State
//! Per group of `by`: the number of rows, the exact sum of the values (a wide integer in units of
//! 2^−1074, [`ExactSum`]: the same total whatever the partitioning), the minimum, the maximum and
//! a violation flag. The state is one `List<Struct<key, rows, sum, min, max, violated>>` per
//! accumulator, merged exactly; noise is drawn only in `evaluate`.
//!
//! # Result type
//! `List<Struct<group T, mean Float64, n Int64>>` where T is the type of `by` (a dictionary is
//! unpacked to its value type; a NULL literal becomes Utf8), sorted by group (Arrow's sort order),
//! empty (not NULL) when no group is large enough.
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Float64Array, Int64Array, ListArray,
    StructArray, new_empty_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::{SortOptions, sort_to_indices};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Float64Type, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::{AggregateOrderSensitivity, format_state_name};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Signature, Volatility,
};

use super::common::{DOC_SECTION_DP, coerce_param, is_number};
use super::declaration::{self, Aggregate, DELTA, EPSILON, NEIGHBOURS, UnitRule};
use super::params::{Neighbours, Params, literal_params, plan_error};
use crate::mechanisms::rgm::wide::ExactSum;
use crate::mechanisms::rgm::{
    accounted_gamma, calibrate_rgm_sigma, noise_gamma, release_relative, rgm_epsilon_floor,
    smallest_feasible_group_size,
};
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError};

/// The one error of a contract violation: it names no group and no value.
pub const CONTRACT_VIOLATION: &str = "rgm_mean_by: the data do not satisfy the declared contract \
     (every value non-NULL, finite and at least 2.2e-308 (no subnormal), and within a factor \
     max_ratio of each other inside each group of `by`); nothing was released. The charge for this query stands (a failure can \
     depend on the data). If the spread inside a group can be larger, declare a larger max_ratio; \
     NULL or non-positive values must be removed from the registered table (a WHERE clause would \
     make the group sizes private)";

/// `rgm_mean_by(value, by, max_ratio, epsilon, delta, min_group_size, neighbours)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RgmMeanParams {
    /// K ≥ 1: within each group, max ≤ K·min.
    pub max_ratio: f64,
    pub epsilon: f64,
    pub delta: f64,
    /// Groups with fewer rows are left out; σ is calibrated for groups of this size.
    pub min_group_size: u64,
    pub neighbours: Neighbours,
}

/// σ and the charged γ of a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RgmCalibration {
    /// The noise multiplier shared by all groups.
    pub sigma: f64,
    /// γ*(min_group_size), the worst admissible group's accounted relative sensitivity.
    pub gamma: f64,
}

impl RgmMeanParams {
    pub const DEFAULT_MIN_GROUP_SIZE: u64 = 2;

    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = Params::new(&RGM_MEAN_BY, args)?;
        let max_ratio = p.required("max_ratio", "a finite number >= 1")?;
        if !(max_ratio.is_finite() && max_ratio >= 1.0) {
            return Err(PrivacyError::invalid(
                "max_ratio",
                max_ratio,
                "a finite number >= 1 (inside each group, largest value <= max_ratio × smallest)",
            ));
        }
        let epsilon = p.epsilon()?;
        let delta = p.delta()?;
        let m = p
            .number("min_group_size")?
            .unwrap_or(Self::DEFAULT_MIN_GROUP_SIZE as f64);
        if !(m.is_finite() && m >= 2.0 && m.fract() == 0.0 && m <= 2f64.powi(53)) {
            return Err(PrivacyError::invalid(
                "min_group_size",
                m,
                "an integer >= 2 (a group of one row has unbounded relative sensitivity)",
            ));
        }
        let neighbours = p.neighbours()?;
        Ok(Self {
            max_ratio,
            epsilon,
            delta,
            min_group_size: m as u64,
            neighbours,
        })
    }

    /// σ for the worst admissible group (n = `min_group_size`), or why not: the neighbour
    /// relation does not make group sizes public, or the target is below RGM's ε floor.
    pub fn calibration(&self) -> Result<RgmCalibration, PrivacyError> {
        if self.neighbours != Neighbours::ReplacePublicN {
            return Err(PrivacyError::invalid(
                "neighbours",
                format!("'{}'", self.neighbours.as_str()),
                "'replace_public_n': rgm_mean_by needs public group sizes (a table registered \
                 with replace neighbours, `by` public, no WHERE filter or FILTER clause); the \
                 dpfusion session sets it",
            ));
        }
        let gamma = accounted_gamma(self.max_ratio, self.min_group_size);
        match calibrate_rgm_sigma(self.epsilon, self.delta, gamma, 1, 1) {
            Ok(sigma) => Ok(RgmCalibration { sigma, gamma }),
            Err(PrivacyError::Infeasible(_)) => {
                let floor = rgm_epsilon_floor(gamma, 1, 1, self.delta);
                let hint = match smallest_feasible_group_size(
                    self.max_ratio,
                    self.epsilon,
                    self.delta,
                    self.min_group_size,
                ) {
                    Some(n) => format!("the smallest min_group_size that reaches it is {n}"),
                    None => "no group size reaches it".to_string(),
                };
                Err(PrivacyError::Infeasible(format!(
                    "rgm_mean_by cannot reach epsilon = {} at delta = {} with max_ratio = {} and \
                     min_group_size = {}: for groups of {} rows the relative Gaussian \
                     mechanism's epsilon floor (as noise → ∞) is {floor:.4}; {hint} (or raise \
                     epsilon, or declare a smaller max_ratio)",
                    self.epsilon,
                    self.delta,
                    self.max_ratio,
                    self.min_group_size,
                    self.min_group_size
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// `[Rgm { σ, γ*(min_group_size), 1, 1 }]` (module docs).
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        let c = self.calibration()?;
        Ok(vec![Event::Rgm {
            sigma: c.sigma,
            gamma: c.gamma,
            dims: 1,
            steps: 1,
        }])
    }
}

/// What EXPLAIN PRIVACY shows as an `rgm_mean_by` call's noise, from its literals alone: the
/// relative noise σ·γ_g of a group of `min_group_size` rows (the largest; module docs).
pub fn rgm_noise(params: &[ScalarValue]) -> Option<String> {
    let p = RgmMeanParams::from_literals(params).ok()?;
    let c = p.calibration().ok()?;
    let g = crate::mechanisms::rgm::noise_gamma(p.max_ratio, p.min_group_size);
    Some(format!(
        "relative Gaussian: sd = {} × the group's mean for a group of {} rows (σ = {}; less for \
         larger groups)",
        crate::mechanisms::noise::short(c.sigma * g),
        p.min_group_size,
        crate::mechanisms::noise::short(c.sigma)
    ))
}

/// The `rgm_mean_by` UDAF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RgmMeanBy {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl Default for RgmMeanBy {
    fn default() -> Self {
        Self::new()
    }
}

impl RgmMeanBy {
    pub const NAME: &'static str = "rgm_mean_by";

    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Volatile)
                .with_parameter_names(RGM_MEAN_BY.argument_names())
                .expect("user-defined signatures accept parameter names"),
            insecure_seed: None,
        }
    }

    /// INSECURE: noise from a fixed seed, for reproducible tests. Never register this in a
    /// session that serves real queries.
    pub fn with_insecure_seed(seed: u64) -> Self {
        Self {
            insecure_seed: Some(seed),
            ..Self::new()
        }
    }

    fn release(&self, args: &AccumulatorArgs) -> Result<Arc<RgmRelease>> {
        if args.is_distinct {
            return plan_err!("{} does not support DISTINCT", Self::NAME);
        }
        let lits = literal_params(&RGM_MEAN_BY, args.exprs)?;
        let params = RgmMeanParams::from_literals(&lits).map_err(|e| plan_error(Self::NAME, e))?;
        let calibration = params
            .calibration()
            .map_err(|e| plan_error(Self::NAME, e))?;
        Ok(Arc::new(RgmRelease {
            params,
            calibration,
        }))
    }
}

/// `rgm_mean_by` as an [`AggregateUDF`].
pub fn rgm_mean_by_udaf() -> AggregateUDF {
    AggregateUDF::from(RgmMeanBy::new())
}

/// The result's list element: `Struct<group T, mean Float64, n Int64>`.
pub fn result_struct_fields(by: &DataType) -> Fields {
    Fields::from(vec![
        Field::new("group", by.clone(), true),
        Field::new("mean", DataType::Float64, false),
        Field::new("n", DataType::Int64, false),
    ])
}

/// The return type for a `by` of type `by` (after coercion).
pub fn result_type(by: &DataType) -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(result_struct_fields(by)),
        true,
    )))
}

fn state_struct_fields(by: &DataType) -> Fields {
    Fields::from(vec![
        Field::new("key", by.clone(), true),
        Field::new("rows", DataType::Int64, false),
        Field::new("sum", DataType::Binary, false),
        Field::new("min", DataType::Float64, false),
        Field::new("max", DataType::Float64, false),
        Field::new("violated", DataType::Boolean, false),
    ])
}

fn state_type(by: &DataType) -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(state_struct_fields(by)),
        true,
    )))
}

/// What `by` may be: any non-nested type; dictionaries are unpacked, NULL becomes Utf8.
fn coerce_by(t: &DataType) -> Result<DataType> {
    Ok(match t {
        DataType::Dictionary(_, v) => coerce_by(v)?,
        DataType::Null => DataType::Utf8,
        t if t.is_nested() => {
            return plan_err!(
                "rgm_mean_by: `by` must be a column of a scalar type (string, integer, date, \
                 boolean, ...), got {t}"
            );
        }
        t => t.clone(),
    })
}

/// Immutable per-call data shared by the accumulators of a call.
#[derive(Debug)]
struct RgmRelease {
    params: RgmMeanParams,
    calibration: RgmCalibration,
}

/// The exact partial of one group of `by`.
#[derive(Debug, Clone)]
struct GroupState {
    rows: i64,
    sum: ExactSum,
    min: f64,
    max: f64,
    violated: bool,
}

impl Default for GroupState {
    fn default() -> Self {
        GroupState {
            rows: 0,
            sum: ExactSum::new(),
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            violated: false,
        }
    }
}

impl GroupState {
    fn add(&mut self, v: Option<f64>) {
        self.rows = self.rows.saturating_add(1);
        match v {
            // Normal numbers only: the ratio check max ≤ fl(K·min) implies the γ of
            // mechanisms/rgm.rs (max ≤ K(1 + 2⁻⁵⁰)·min) only where K·min rounds relatively,
            // not among subnormals (fl(1.5·2⁻¹⁰⁷⁴) = 2·2⁻¹⁰⁷⁴; review r45).
            Some(v) if v.is_finite() && v >= f64::MIN_POSITIVE => {
                self.sum.add_value(v);
                self.min = self.min.min(v);
                self.max = self.max.max(v);
            }
            _ => self.violated = true,
        }
    }

    fn merge(&mut self, o: &GroupState) {
        self.rows = self.rows.saturating_add(o.rows);
        self.sum.merge(&o.sum);
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.violated |= o.violated;
    }

    /// The contract of the module docs: all values valid and max ≤ fl(K·min) (which implies
    /// max ≤ K(1 + 2^−50)·min exactly, the K used by [`crate::mechanisms::rgm::mean_sensitivity`]).
    fn satisfies(&self, max_ratio: f64) -> bool {
        !self.violated && self.rows > 0 && self.max <= max_ratio * self.min
    }
}

/// The accumulator: one map from `by` to exact partials (module docs, "State").
#[derive(Debug)]
struct RgmAccumulator {
    release: Arc<RgmRelease>,
    by_type: DataType,
    groups: HashMap<ScalarValue, GroupState>,
    insecure_seed: Option<u64>,
    rng: Option<SecureRng>,
}

impl RgmAccumulator {
    fn new(release: Arc<RgmRelease>, by_type: DataType, insecure_seed: Option<u64>) -> Self {
        Self {
            release,
            by_type,
            groups: HashMap::new(),
            insecure_seed,
            rng: None,
        }
    }

    fn rng(&mut self) -> &mut SecureRng {
        let seed = self.insecure_seed;
        self.rng.get_or_insert_with(|| match seed {
            Some(s) => SecureRng::insecure_from_seed(s),
            None => SecureRng::from_os_entropy(),
        })
    }

    fn keys_array(&self, keys: &[&ScalarValue]) -> Result<ArrayRef> {
        if keys.is_empty() {
            return Ok(new_empty_array(&self.by_type));
        }
        ScalarValue::iter_to_array(keys.iter().map(|k| (*k).clone()))
    }

    /// The groups in Arrow's sort order of their keys.
    fn sorted(&self) -> Result<Vec<(&ScalarValue, &GroupState)>> {
        let entries: Vec<(&ScalarValue, &GroupState)> = self.groups.iter().collect();
        let keys: Vec<&ScalarValue> = entries.iter().map(|(k, _)| *k).collect();
        let arr = self.keys_array(&keys)?;
        let idx = sort_to_indices(
            &arr,
            Some(SortOptions {
                descending: false,
                nulls_first: true,
            }),
            None,
        )?;
        Ok(idx.values().iter().map(|&i| entries[i as usize]).collect())
    }
}

fn internal(what: &str) -> DataFusionError {
    DataFusionError::Internal(format!("rgm_mean_by: bad state ({what})"))
}

impl Accumulator for RgmAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let vals = values[0]
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(|| internal("value column is not Float64"))?;
        let by = &values[1];
        for i in 0..by.len() {
            if by.is_null(i) {
                continue; // `by` is public: rows without a group are left out
            }
            let key = ScalarValue::try_from_array(by, i)?;
            let v = vals.is_valid(i).then(|| vals.value(i));
            self.groups.entry(key).or_default().add(v);
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0]
            .as_list_opt::<i32>()
            .ok_or_else(|| internal("state is not a list"))?;
        for r in 0..lists.len() {
            if lists.is_null(r) {
                continue;
            }
            let item = lists.value(r);
            let s = item
                .as_struct_opt()
                .ok_or_else(|| internal("not a struct"))?;
            let key = s.column(0);
            let rows = s
                .column(1)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| internal("rows"))?;
            let sums = s
                .column(2)
                .as_binary_opt::<i32>()
                .ok_or_else(|| internal("sum"))?;
            let mins = s
                .column(3)
                .as_primitive_opt::<Float64Type>()
                .ok_or_else(|| internal("min"))?;
            let maxs = s
                .column(4)
                .as_primitive_opt::<Float64Type>()
                .ok_or_else(|| internal("max"))?;
            let bad = s
                .column(5)
                .as_boolean_opt()
                .ok_or_else(|| internal("violated"))?;
            for j in 0..s.len() {
                let part = GroupState {
                    rows: rows.value(j),
                    sum: ExactSum::from_bytes(sums.value(j)).ok_or_else(|| internal("sum"))?,
                    min: mins.value(j),
                    max: maxs.value(j),
                    violated: bad.value(j),
                };
                let k = ScalarValue::try_from_array(key, j)?;
                self.groups.entry(k).or_default().merge(&part);
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let entries: Vec<(&ScalarValue, &GroupState)> = self.groups.iter().collect();
        let keys: Vec<&ScalarValue> = entries.iter().map(|(k, _)| *k).collect();
        let cols: Vec<ArrayRef> = vec![
            self.keys_array(&keys)?,
            Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|(_, g)| g.rows),
            )),
            Arc::new(BinaryArray::from_iter_values(
                entries.iter().map(|(_, g)| g.sum.to_bytes()),
            )),
            Arc::new(Float64Array::from_iter_values(
                entries.iter().map(|(_, g)| g.min),
            )),
            Arc::new(Float64Array::from_iter_values(
                entries.iter().map(|(_, g)| g.max),
            )),
            Arc::new(BooleanArray::from(
                entries.iter().map(|(_, g)| g.violated).collect::<Vec<_>>(),
            )),
        ];
        let s = StructArray::try_new(state_struct_fields(&self.by_type), cols, None)?;
        Ok(vec![ScalarValue::List(Arc::new(one_row_list(
            &state_type(&self.by_type),
            Arc::new(s),
        )?))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let p = self.release.params;
        // 1. The contract, over every group (left-out ones included), before any noise.
        if self.groups.values().any(|g| !g.satisfies(p.max_ratio)) {
            return Err(DataFusionError::Execution(CONTRACT_VIOLATION.to_string()));
        }
        // 2. The groups large enough, sorted by key; exact means.
        let sigma = self.release.calibration.sigma;
        let chosen: Vec<(ScalarValue, f64, i64)> = self
            .sorted()?
            .into_iter()
            .filter(|(_, g)| g.rows as u64 >= p.min_group_size)
            .map(|(k, g)| (k.clone(), g.sum.mean(g.rows as u64), g.rows))
            .collect();
        // 3. One RGM release per group: m + σ·γ₁(n)·m·Z (noise multiplier rounded up).
        let mut means = Vec::with_capacity(chosen.len());
        for (_, m, n) in &chosen {
            let c = sigma * noise_gamma(p.max_ratio, *n as u64) * (1.0 + 2f64.powi(-51));
            means.push(release_relative(self.rng(), *m, c));
        }
        let keys: Vec<&ScalarValue> = chosen.iter().map(|(k, _, _)| k).collect();
        let s = StructArray::try_new(
            result_struct_fields(&self.by_type),
            vec![
                self.keys_array(&keys)?,
                Arc::new(Float64Array::from(means)),
                Arc::new(Int64Array::from_iter_values(chosen.iter().map(|c| c.2))),
            ],
            None,
        )?;
        Ok(ScalarValue::List(Arc::new(one_row_list(
            &result_type(&self.by_type),
            Arc::new(s),
        )?)))
    }

    fn size(&self) -> usize {
        size_of::<Self>()
            + self
                .groups
                .iter()
                .map(|(k, g)| k.size() + size_of::<GroupState>() + g.sum.to_bytes().len())
                .sum::<usize>()
    }
}

/// A one-row `ListArray` of type `list_type` holding `values`.
fn one_row_list(list_type: &DataType, values: ArrayRef) -> Result<ListArray> {
    let DataType::List(field) = list_type else {
        return Err(internal("list type"));
    };
    Ok(ListArray::try_new(
        field.clone(),
        OffsetBuffer::from_lengths([values.len()]),
        values,
        None,
    )?)
}

impl AggregateUDFImpl for RgmMeanBy {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let n = arg_types.len();
        if !(4..=7).contains(&n) {
            return plan_err!(
                "rgm_mean_by takes 4 to 6 arguments: rgm_mean_by(value, by, max_ratio, epsilon\
                 [, delta][, min_group_size]), got {n}"
            );
        }
        if !is_number(&arg_types[0]) {
            return plan_err!(
                "rgm_mean_by: `value` must be numeric (integer, float or decimal; cast to \
                 Float64), got {}",
                arg_types[0]
            );
        }
        let mut out = vec![DataType::Float64, coerce_by(&arg_types[1])?];
        for (p, t) in RGM_MEAN_BY.params.iter().zip(&arg_types[2..]) {
            out.push(coerce_param("rgm_mean_by", p, t)?);
        }
        Ok(out)
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let by = arg_types
            .get(1)
            .ok_or_else(|| DataFusionError::Plan("rgm_mean_by(value, by, ...)".into()))?;
        Ok(result_type(&coerce_by(by)?))
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let release = self.release(&args)?;
        let by_type = coerce_by(args.expr_fields[1].data_type())?;
        Ok(Box::new(RgmAccumulator::new(
            release,
            by_type,
            self.insecure_seed,
        )))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let by = coerce_by(args.input_fields[1].data_type())?;
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "groups"),
            state_type(&by),
            true,
        ))])
    }
    /// The result does not depend on row order (exact partials).
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOC)
    }
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        DOC_SECTION_DP,
        "Differentially private mean of `value` for each group of the public column `by`, by the \
         relative Gaussian mechanism (Hendrikx, Mangold, Bellet, AISTATS 2024): each group's \
         mean m_g is released as m_g + sigma·gamma_g·m_g·Z, noise proportional to the group's own \
         mean, so groups of very different scales get about the same relative error. \
         gamma_g = (K² − 1)/(K(n_g − 1) + 1) with K = max_ratio and n_g the group's row count; \
         one sigma for all groups, calibrated for the worst admissible group \
         (n_g = min_group_size) so that the call is (epsilon, delta)-DP; groups with fewer rows \
         are left out. Requires a table registered with 'replace' neighbours and `by` declared \
         public, and no WHERE filter or FILTER clause (group sizes must be public); otherwise \
         refused at planning. Declared contract, checked during execution: every value is \
         non-NULL, finite and > 0, and inside each group the largest value is at most max_ratio \
         times the smallest; a violation fails the query and releases nothing. Rows with a NULL \
         `by` are skipped. An outer GROUP BY on public columns gives one list per group. \
         Infeasible targets (RGM has an epsilon floor) fail at planning with the floor and the \
         smallest min_group_size that works.",
        "rgm_mean_by(value, by, max_ratio, epsilon[, delta[, min_group_size]])",
    )
    .with_argument(
        "value",
        "Numeric column (integers, floats, decimals; cast to Float64); every value > 0.",
    )
    .with_argument(
        "by",
        "Public grouping column (any scalar type; the result's `group` has its type, \
         dictionaries unpacked).",
    )
    .with_argument(
        "max_ratio",
        "Literal K >= 1: inside each group, largest value <= K × smallest (checked).",
    )
    .with_argument("epsilon", "Literal ε > 0 (finite).")
    .with_argument(
        "delta",
        "Literal δ in (0, 1); defaults to the session's dpfusion.default_delta (1e-7).",
    )
    .with_argument(
        "min_group_size",
        "Literal integer >= 2 (default 2): smaller groups are left out, and the noise is \
         calibrated for groups of this size.",
    )
    .with_argument(
        "neighbours",
        "Hidden: must be 'replace_public_n', set by the dpfusion session when the group sizes are \
         public; users never write it.",
    )
    .with_sql_example(
        "SELECT rgm_mean_by(salary, job, 1.5, 1.0, 1e-6, 500) FROM salaries;\n\
         -- one row: [{group: accountant, mean: 73324.3, n: 1510}, ...]",
    )
    .with_related_udf("dp_mean")
    .build()
});

/// The declaration of `rgm_mean_by` (listed in [`super::registry::AGGREGATES`]).
pub const RGM_MEAN_BY: Aggregate = Aggregate {
    name: "rgm_mean_by",
    summary: "per group of a public column, the mean with noise relative to it (RGM)",
    data: &[
        declaration::DataArg {
            name: "value",
            doc: "a bare column with a ratio bound declared by the data owner",
        },
        declaration::DataArg {
            name: "by",
            doc: "a bare public column",
        },
    ],
    params: &[
        declaration::number(
            "max_ratio",
            declaration::Default::Required,
            "K ≥ the declared bound: in each group max ≤ K × min",
        ),
        EPSILON,
        DELTA,
        declaration::number(
            "min_group_size",
            declaration::Default::Number("2"),
            "groups smaller than this are left out; σ is calibrated for this size",
        ),
        NEIGHBOURS,
    ],
    requirements: &[
        declaration::Requirement::PublicGroupSizes,
        declaration::Requirement::DeclaredRatio,
    ],
    units: UnitRule::Refused {
        needs: "public group sizes",
        why: "a unit's number of rows, and so every group's size, is private",
        instead: "Use dp_mean per group instead.",
    },
    replaces: &[],
    internal: false,
    udaf: rgm_mean_by_udaf,
    seeded: |seed| super::rgm_mean_by::RgmMeanBy::with_insecure_seed(seed).into(),
    cost: |_, p| declaration::no_data(RgmMeanParams::from_literals, RgmMeanParams::cost, p),
    noise: rgm_noise,
};

#[cfg(test)]
mod tests;
