//! The accumulators shared by the DP aggregates.
//!
//! Every function keeps the same kind of exact, un-noised partial state per group (a subset of:
//! an `i128` fixed-point sum, a count of non-NULL non-NaN values, a count of rows), updated by
//! vectorised loops over the Arrow buffers. `state` and `merge_batch` move those exact partials
//! between plan stages; noise is drawn only in `evaluate`, by the function's [`Finalise`], from
//! the accumulator's own CSPRNG. A partitioned plan therefore releases one noisy value per
//! group, computed from the same exact totals as a single-partition plan. Under an insecure test
//! seed only, the GROUP BY accumulator gives each group its own generator, seeded from the seed
//! and the group's exact partial ([`seeded_per_group`]), so a seeded group's release does not
//! follow the order in which groups arrive; the OS-seeded path draws every release from one
//! CSPRNG stream.
//!
//! State layout (fields in this order, each present when the function's [`Shape`] says so):
//! - `sum`: `Decimal128(38, 0)`, the sum of fixed-point integers (see [`crate::mechanisms::exact`]);
//! - `sum_sq`: `Decimal128(38, 0)`, the sum of the squared centred integers on their own grid
//!   ([`crate::mechanisms::exact::SquareGrid`]; `dp_variance`, `dp_stddev`);
//! - `count`: `Int64`, the number of non-NULL, non-NaN values;
//! - `rows`: `Int64`, the number of rows that reached the aggregate (after its FILTER).
use std::fmt::Debug;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Decimal128Array, Float64Array, Int64Array,
};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Field, FieldRef, Float16Type, Float32Type, Int64Type,
};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, EmitTo, GroupsAccumulator};

use crate::mechanisms::exact::{FixedPoint, SquareGrid, count_nan};
use crate::noise::SecureRng;

/// Precision and scale of the `sum` state field.
const SUM_PRECISION: u8 = 38;

/// Rows whose quantised values may be pending in one `i64` partial: |x| ≤ 2⁴⁰, so at most
/// 2⁶² in magnitude (no overflow).
const PENDING_MAX: usize = 1 << 22;

/// Which partial fields a function keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub sum: bool,
    /// The sum of squared centred values ([`SquareGrid`]); needs `sum`'s grid.
    pub sum_sq: bool,
    pub count: bool,
    pub rows: bool,
}

impl Shape {
    /// The state fields, named with `format_state_name`.
    pub fn state_fields(&self, name: &str) -> Vec<FieldRef> {
        let mut f = Vec::with_capacity(4);
        if self.sum {
            f.push(Arc::new(Field::new(
                format_state_name(name, "sum"),
                DataType::Decimal128(SUM_PRECISION, 0),
                true,
            )));
        }
        if self.sum_sq {
            f.push(Arc::new(Field::new(
                format_state_name(name, "sum_sq"),
                DataType::Decimal128(SUM_PRECISION, 0),
                true,
            )));
        }
        if self.count {
            f.push(Arc::new(Field::new(
                format_state_name(name, "count"),
                DataType::Int64,
                true,
            )));
        }
        if self.rows {
            f.push(Arc::new(Field::new(
                format_state_name(name, "rows"),
                DataType::Int64,
                true,
            )));
        }
        f
    }
}

/// The exact partial aggregate of one group. Fields the function does not keep are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    /// Sum of fixed-point integers x = round(clamp(v)/q).
    pub sum: i128,
    /// Sum of the squared centred integers s = round((2x − lo − hi)²/2^shift) ([`SquareGrid`]).
    pub sum_sq: i128,
    /// Number of non-NULL, non-NaN values.
    pub count: i64,
    /// Number of rows (after the FILTER clause), NULLs included.
    pub rows: i64,
}

/// Turns exact partials into released values: the only place where noise is drawn.
pub(crate) trait Finalise: Debug + Send + Sync {
    fn shape(&self) -> Shape;
    /// The fixed-point grid of the `sum` field (required when `shape().sum`).
    fn fixed_point(&self) -> Option<FixedPoint>;
    /// The grid of the `sum_sq` field (required when `shape().sum_sq`).
    fn square_grid(&self) -> Option<SquareGrid> {
        None
    }
    /// One release per partial, in order, as an array of the function's return type.
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef>;
    /// The noise each release gets, in the units of the released statistic (EXPLAIN PRIVACY),
    /// e.g. `Gaussian σ = 5.302`. Public: a function of the literals alone.
    fn noise(&self) -> Option<String> {
        None
    }
    /// What [`Self::finalise`] releases, drawn identically (the same noise from the same RNG
    /// state, so the same values), together with each release's confidence interval at level
    /// `confidence` ∈ (0, 1): post-processing of the noisy quantities the release draws and of
    /// its public calibration ([`super::interval`]). `None` for a NULL release. Functions
    /// without a `_ci` variant keep this default, an internal error.
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<crate::mechanisms::Interval>>)> {
        let _ = (rng, partials, confidence);
        Err(DataFusionError::Internal(
            "this DP aggregate has no confidence interval".into(),
        ))
    }
}

/// The rows of a batch that pass the FILTER clause (`None` = all rows).
fn filter_selection(opt_filter: Option<&BooleanArray>) -> Option<BooleanBuffer> {
    opt_filter.map(|f| match f.nulls() {
        Some(n) => f.values() & n.inner(),
        None => f.values().clone(),
    })
}

fn and(a: Option<BooleanBuffer>, b: Option<BooleanBuffer>) -> Option<BooleanBuffer> {
    match (a, b) {
        (Some(a), Some(b)) => Some(&a & &b),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Not-NaN mask of a floating-point array (`None` for other types or when nothing is NaN).
fn not_nan(arr: &dyn Array) -> Option<BooleanBuffer> {
    fn mask<T: Copy>(vals: &[T], is_nan: impl Fn(T) -> bool) -> Option<BooleanBuffer> {
        vals.iter()
            .any(|&v| is_nan(v))
            .then(|| BooleanBuffer::collect_bool(vals.len(), |i| !is_nan(vals[i])))
    }
    match arr.data_type() {
        DataType::Float64 => mask(
            arr.as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                .values(),
            f64::is_nan,
        ),
        DataType::Float32 => mask(arr.as_primitive::<Float32Type>().values(), f32::is_nan),
        DataType::Float16 => mask(arr.as_primitive::<Float16Type>().values(), |v| v.is_nan()),
        _ => None,
    }
}

/// Calls `f(row)` for every row selected by `sel` (all rows when `None`).
#[inline]
fn for_each_selected(len: usize, sel: &Option<BooleanBuffer>, mut f: impl FnMut(usize)) {
    match sel {
        None => (0..len).for_each(&mut f),
        Some(s) => s.set_indices().for_each(&mut f),
    }
}

fn as_f64(arr: &ArrayRef) -> Result<&Float64Array> {
    arr.as_primitive_opt().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "DP aggregate expected Float64 values after coercion, got {}",
            arr.data_type()
        ))
    })
}

fn state_i128(arr: &ArrayRef) -> Result<&Decimal128Array> {
    arr.as_primitive_opt::<Decimal128Type>().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "DP aggregate: bad sum state type {}",
            arr.data_type()
        ))
    })
}

fn state_i64(arr: &ArrayRef) -> Result<&Int64Array> {
    arr.as_primitive_opt::<Int64Type>().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "DP aggregate: bad count state type {}",
            arr.data_type()
        ))
    })
}

fn sum_array(v: Vec<i128>) -> Result<ArrayRef> {
    Ok(Arc::new(
        Decimal128Array::from(v).with_precision_and_scale(SUM_PRECISION, 0)?,
    ))
}

/// The GROUP BY accumulator of every DP aggregate.
#[derive(Debug)]
pub(crate) struct DpGroups {
    fin: Arc<dyn Finalise>,
    shape: Shape,
    fp: Option<FixedPoint>,
    sq: Option<SquareGrid>,
    sums: Vec<i128>,
    sums_sq: Vec<i128>,
    counts: Vec<i64>,
    rows: Vec<i64>,
    /// Pending `i64` partial sums per group ([`Self::update_fused`]); all zero after
    /// [`Self::flush`].
    part: Vec<i64>,
    /// Pending per-group row counts ([`Self::update_fused`]); all zero after [`Self::flush`].
    part_n: Vec<i64>,
    /// Rows added to `part` since the last flush (at most [`PENDING_MAX`]).
    pending: usize,
    insecure_seed: Option<u64>,
    rng: Option<SecureRng>,
}

impl DpGroups {
    pub fn new(fin: Arc<dyn Finalise>, insecure_seed: Option<u64>) -> Result<Self> {
        let shape = fin.shape();
        let fp = fin.fixed_point();
        let sq = fin.square_grid();
        if (shape.sum || shape.sum_sq) && fp.is_none() {
            return Err(DataFusionError::Internal(
                "sum state without a fixed-point grid".into(),
            ));
        }
        if shape.sum_sq && sq.is_none() {
            return Err(DataFusionError::Internal(
                "sum_sq state without a square grid".into(),
            ));
        }
        Ok(Self {
            fin,
            shape,
            fp,
            sq,
            sums: vec![],
            sums_sq: vec![],
            counts: vec![],
            rows: vec![],
            part: vec![],
            part_n: vec![],
            pending: 0,
            insecure_seed,
            rng: None,
        })
    }

    fn resize(&mut self, n: usize) {
        if self.shape.sum && self.sums.len() < n {
            self.sums.resize(n, 0);
        }
        if self.shape.sum_sq && self.sums_sq.len() < n {
            self.sums_sq.resize(n, 0);
        }
        if self.shape.count && self.counts.len() < n {
            self.counts.resize(n, 0);
        }
        if self.shape.rows && self.rows.len() < n {
            self.rows.resize(n, 0);
        }
    }

    fn rng(&mut self) -> &mut SecureRng {
        let seed = self.insecure_seed;
        self.rng.get_or_insert_with(|| match seed {
            Some(s) => SecureRng::insecure_from_seed(s),
            None => SecureRng::from_os_entropy(),
        })
    }

    /// The partial of group `g` (not consumed). Only on a flushed state (the no-GROUP-BY
    /// accumulator and merges never leave rows pending).
    fn partial(&self, g: usize) -> Partial {
        debug_assert_eq!(self.pending, 0, "read of a state with pending partials");
        Partial {
            sum: self.sums.get(g).copied().unwrap_or(0),
            sum_sq: self.sums_sq.get(g).copied().unwrap_or(0),
            count: self.counts.get(g).copied().unwrap_or(0),
            rows: self.rows.get(g).copied().unwrap_or(0),
        }
    }

    /// The rows whose value counts (filter ∧ non-NULL ∧ non-NaN; only computed when the shape
    /// reads values), and the rows that pass the filter.
    fn selections(
        &self,
        values: &ArrayRef,
        opt_filter: Option<&BooleanArray>,
    ) -> (Option<BooleanBuffer>, Option<BooleanBuffer>) {
        let filter = filter_selection(opt_filter);
        if !(self.shape.sum || self.shape.sum_sq || self.shape.count) {
            return (None, filter);
        }
        let valid = and(
            and(
                filter.clone(),
                values.logical_nulls().map(|n| n.into_inner()),
            ),
            not_nan(values.as_ref()),
        );
        (valid, filter)
    }

    /// The exact state of one partial, as scalars in the state-field order.
    fn scalars(&self, p: Partial) -> Vec<ScalarValue> {
        let mut out = Vec::with_capacity(4);
        if self.shape.sum {
            out.push(ScalarValue::Decimal128(Some(p.sum), SUM_PRECISION, 0));
        }
        if self.shape.sum_sq {
            out.push(ScalarValue::Decimal128(Some(p.sum_sq), SUM_PRECISION, 0));
        }
        if self.shape.count {
            out.push(ScalarValue::Int64(Some(p.count)));
        }
        if self.shape.rows {
            out.push(ScalarValue::Int64(Some(p.rows)));
        }
        out
    }

    /// [`GroupsAccumulator::update_batch`] when every row counts (no FILTER, NULL or NaN) and
    /// the shape is `sum` with or without `count` and `rows` (`dp_sum`, `dp_mean`). One scatter
    /// pass over the rows, as `avg`'s: each value is quantised in the loop (branch-free,
    /// [`FixedPoint::quantise_select`]; measured faster than a separate vectorised conversion
    /// pass, the scatter being the bound) and summed per group in an `i64` partial, and the rows
    /// are counted per group once (here count = rows: every row counts). The partials are added
    /// to the exact state by [`Self::flush`] only before [`PENDING_MAX`] rows could overflow
    /// them (|x| ≤ 2⁴⁰, so 2²² values stay below 2⁶²) and before any read of the state, not
    /// after every batch (a flush costs O(groups)). Integer sums: the same totals as the
    /// per-field passes, in any order.
    fn update_fused(&mut self, fp: &FixedPoint, v: &[f64], gi: &[usize], groups: usize) {
        if self.part.len() < groups {
            self.part.resize(groups, 0);
        }
        let (count, rows) = (self.shape.count, self.shape.rows);
        if (count || rows) && self.part_n.len() < groups {
            self.part_n.resize(groups, 0);
        }
        for (v, gi) in v.chunks(PENDING_MAX).zip(gi.chunks(PENDING_MAX)) {
            if self.pending + v.len() > PENDING_MAX {
                self.flush();
            }
            self.pending += v.len();
            let part = &mut self.part[..groups];
            if count || rows {
                let n = &mut self.part_n[..groups];
                for (&x, &g) in v.iter().zip(gi) {
                    part[g] += fp.quantise_select(x);
                    n[g] += 1;
                }
            } else {
                for (&x, &g) in v.iter().zip(gi) {
                    part[g] += fp.quantise_select(x);
                }
            }
        }
    }

    /// Adds the pending `i64` partials of [`Self::update_fused`] to the exact state and zeroes
    /// them. Called before every read of the state (`evaluate`, `state`, [`Self::partial`]).
    fn flush(&mut self) {
        if self.pending == 0 {
            return;
        }
        for (s, p) in self.sums.iter_mut().zip(self.part.iter_mut()) {
            *s = s.saturating_add(*p as i128);
            *p = 0;
        }
        for (dst, keep) in [
            (&mut self.counts, self.shape.count),
            (&mut self.rows, self.shape.rows),
        ] {
            if keep {
                for (c, &k) in dst.iter_mut().zip(self.part_n.iter()) {
                    *c += k;
                }
            }
        }
        self.part_n.fill(0);
        self.pending = 0;
    }

    fn memory(&self) -> usize {
        size_of::<Self>()
            + (self.sums.capacity() + self.sums_sq.capacity()) * size_of::<i128>()
            + (self.counts.capacity()
                + self.rows.capacity()
                + self.part.capacity()
                + self.part_n.capacity())
                * size_of::<i64>()
    }
}

impl GroupsAccumulator for DpGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let arr = &values[0];
        let n = group_indices.len();
        if opt_filter.is_none()
            && arr.logical_null_count() == 0
            && self.shape.sum
            && !self.shape.sum_sq
        {
            // No FILTER, no NULL and (one vectorised count) no NaN: every row counts (the
            // common case).
            let v = as_f64(arr)?.values();
            if count_nan(v) == 0 {
                let fp = self.fp.expect("checked in new");
                self.update_fused(&fp, v, group_indices, total_num_groups);
                return Ok(());
            }
        }
        let (valid, filter) = self.selections(arr, opt_filter);
        if self.shape.rows {
            let rows = &mut self.rows;
            for_each_selected(n, &filter, |i| rows[group_indices[i]] += 1);
        }
        if self.shape.sum {
            let fp = self.fp.expect("checked in new");
            let v = as_f64(arr)?.values();
            let sums = &mut self.sums;
            for_each_selected(n, &valid, |i| {
                let g = group_indices[i];
                sums[g] = sums[g].saturating_add(fp.quantise(v[i]) as i128);
            });
        }
        if self.shape.sum_sq {
            let (fp, sq) = (
                self.fp.expect("checked in new"),
                self.sq.expect("checked in new"),
            );
            let v = as_f64(arr)?.values();
            let sums_sq = &mut self.sums_sq;
            for_each_selected(n, &valid, |i| {
                let g = group_indices[i];
                sums_sq[g] = sums_sq[g].saturating_add(sq.square(fp.quantise(v[i])) as i128);
            });
        }
        if self.shape.count {
            let counts = &mut self.counts;
            for_each_selected(n, &valid, |i| counts[group_indices[i]] += 1);
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let mut k = 0;
        for (keep, vec) in [
            (self.shape.sum, &mut self.sums),
            (self.shape.sum_sq, &mut self.sums_sq),
        ] {
            if keep {
                let s = state_i128(&values[k])?;
                for (i, &g) in group_indices.iter().enumerate() {
                    if s.is_valid(i) {
                        vec[g] = vec[g].saturating_add(s.value(i));
                    }
                }
                k += 1;
            }
        }
        for (keep, vec) in [
            (self.shape.count, &mut self.counts),
            (self.shape.rows, &mut self.rows),
        ] {
            if keep {
                let c = state_i64(&values[k])?;
                for (i, &g) in group_indices.iter().enumerate() {
                    if c.is_valid(i) {
                        vec[g] = vec[g].saturating_add(c.value(i));
                    }
                }
                k += 1;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.flush();
        let n = match emit_to {
            EmitTo::All => self
                .sums
                .len()
                .max(self.sums_sq.len())
                .max(self.counts.len())
                .max(self.rows.len()),
            EmitTo::First(n) => n,
        };
        self.resize(n);
        let sums = if self.shape.sum {
            emit_to.take_needed(&mut self.sums)
        } else {
            vec![]
        };
        let sums_sq = if self.shape.sum_sq {
            emit_to.take_needed(&mut self.sums_sq)
        } else {
            vec![]
        };
        let counts = if self.shape.count {
            emit_to.take_needed(&mut self.counts)
        } else {
            vec![]
        };
        let rows = if self.shape.rows {
            emit_to.take_needed(&mut self.rows)
        } else {
            vec![]
        };
        let partials: Vec<Partial> = (0..n)
            .map(|g| Partial {
                sum: sums.get(g).copied().unwrap_or(0),
                sum_sq: sums_sq.get(g).copied().unwrap_or(0),
                count: counts.get(g).copied().unwrap_or(0),
                rows: rows.get(g).copied().unwrap_or(0),
            })
            .collect();
        let fin = Arc::clone(&self.fin);
        match self.insecure_seed {
            None => fin.finalise(self.rng(), &partials),
            Some(seed) => seeded_per_group(fin.as_ref(), seed, &partials),
        }
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.flush();
        let mut out: Vec<ArrayRef> = Vec::with_capacity(4);
        if self.shape.sum {
            out.push(sum_array(emit_to.take_needed(&mut self.sums))?);
        }
        if self.shape.sum_sq {
            out.push(sum_array(emit_to.take_needed(&mut self.sums_sq))?);
        }
        if self.shape.count {
            out.push(Arc::new(Int64Array::from(
                emit_to.take_needed(&mut self.counts),
            )));
        }
        if self.shape.rows {
            out.push(Arc::new(Int64Array::from(
                emit_to.take_needed(&mut self.rows),
            )));
        }
        Ok(out)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let arr = &values[0];
        let n = arr.len();
        let (valid, filter) = self.selections(arr, opt_filter);
        let is = |sel: &Option<BooleanBuffer>, i: usize| sel.as_ref().is_none_or(|s| s.value(i));
        let mut out: Vec<ArrayRef> = Vec::with_capacity(4);
        if self.shape.sum {
            let fp = self.fp.expect("checked in new");
            let v = as_f64(arr)?.values();
            let sums = (0..n)
                .map(|i| {
                    if is(&valid, i) {
                        fp.quantise(v[i]) as i128
                    } else {
                        0
                    }
                })
                .collect();
            out.push(sum_array(sums)?);
        }
        if self.shape.sum_sq {
            let (fp, sq) = (
                self.fp.expect("checked in new"),
                self.sq.expect("checked in new"),
            );
            let v = as_f64(arr)?.values();
            let sums = (0..n)
                .map(|i| {
                    if is(&valid, i) {
                        sq.square(fp.quantise(v[i])) as i128
                    } else {
                        0
                    }
                })
                .collect();
            out.push(sum_array(sums)?);
        }
        if self.shape.count {
            out.push(Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| is(&valid, i) as i64),
            )));
        }
        if self.shape.rows {
            out.push(Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| is(&filter, i) as i64),
            )));
        }
        Ok(out)
    }

    fn size(&self) -> usize {
        self.memory()
    }
}

/// INSECURE seeded path only (`with_insecure_seed`, for reproducible tests): each group's release
/// from its own generator, seeded by [`group_seed`] from the seed, the group's exact partial and
/// its rank among the groups of this emission with the same partial. The exact partials are the
/// same for every partitioning, batch size and row order (module docs), so a group's release no
/// longer depends on the order in which the final aggregate meets its groups, nor on which final
/// partition holds it (one stream in group-index order did, and every partition restarted it).
/// Not the group key: an accumulator does not see it. What remains order-dependent: groups with
/// identical partials in one emission take ranks 0, 1, … in their order (their releases may be
/// exchanged), and such groups split across final partitions share ranks (the same noise, as
/// every partition's stream did before). The OS-seeded path is untouched: one CSPRNG stream.
fn seeded_per_group(fin: &dyn Finalise, seed: u64, partials: &[Partial]) -> Result<ArrayRef> {
    if partials.is_empty() {
        return fin.finalise(&mut SecureRng::insecure_from_seed(seed), partials);
    }
    let mut seen: std::collections::HashMap<Partial, u64> = std::collections::HashMap::new();
    let arrays = partials
        .iter()
        .map(|p| {
            let rank = seen.entry(*p).or_insert(0);
            let mut rng = SecureRng::insecure_from_seed(group_seed(seed, p, *rank));
            *rank += 1;
            fin.finalise(&mut rng, std::slice::from_ref(p))
        })
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
    Ok(datafusion::arrow::compute::concat(&refs)?)
}

/// The seed of one group's generator in the insecure seeded path: the seed, the partial's fields
/// and the rank folded through SplitMix64's finaliser (Steele, Lea and Flood, "Fast Splittable
/// Pseudorandom Number Generators", OOPSLA 2014), a fixed bijective mixer, so the value is the
/// same on every platform and run.
fn group_seed(seed: u64, p: &Partial, rank: u64) -> u64 {
    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    [
        p.sum as u64,
        (p.sum >> 64) as u64,
        p.sum_sq as u64,
        (p.sum_sq >> 64) as u64,
        p.count as u64,
        p.rows as u64,
        rank,
    ]
    .into_iter()
    .fold(mix(seed), |h, w| mix(h ^ w))
}

/// The no-GROUP-BY accumulator: one group of a [`DpGroups`]. `evaluate` does not reset the
/// state and draws fresh noise on every call.
#[derive(Debug)]
pub(crate) struct DpAccumulator {
    inner: DpGroups,
    /// Group index 0 for every row of a batch; grown to the largest batch, then reused.
    zeros: Vec<usize>,
}

impl DpAccumulator {
    pub fn new(fin: Arc<dyn Finalise>, insecure_seed: Option<u64>) -> Result<Self> {
        let mut inner = DpGroups::new(fin, insecure_seed)?;
        inner.resize(1);
        Ok(Self {
            inner,
            zeros: vec![],
        })
    }

    fn zeros(&mut self, n: usize) {
        if self.zeros.len() < n {
            self.zeros.resize(n, 0);
        }
    }

    /// The exact partial (tests).
    #[cfg(test)]
    pub fn partial(&self) -> Partial {
        self.inner.partial(0)
    }
}

impl Accumulator for DpAccumulator {
    /// The one-group case of [`DpGroups::update_batch`] without group indices: the same exact
    /// integers. When there is no NULL, the sum and the NaN check are one vectorised pass
    /// ([`FixedPoint::sum_quantised`]); only a batch that holds NaN builds the row mask.
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let g = &mut self.inner;
        let arr = &values[0];
        let n = arr.len();
        if g.shape.rows {
            g.rows[0] += n as i64;
        }
        if g.shape.sum && !g.shape.sum_sq && arr.logical_null_count() == 0 {
            let fp = g.fp.expect("checked in new");
            let (s, nans) = fp.sum_quantised(as_f64(arr)?.values());
            if nans == 0 {
                g.sums[0] = g.sums[0].saturating_add(s);
                if g.shape.count {
                    g.counts[0] += n as i64;
                }
                return Ok(());
            }
        }
        let (valid, _) = g.selections(arr, None);
        if g.shape.sum {
            let fp = g.fp.expect("checked in new");
            let v = as_f64(arr)?.values();
            let s = match &valid {
                None => fp.sum_quantised(v).0,
                Some(sel) => sel
                    .set_indices()
                    .map(|i| fp.quantise(v[i]) as i128)
                    .fold(0i128, i128::saturating_add),
            };
            g.sums[0] = g.sums[0].saturating_add(s);
        }
        if g.shape.sum_sq {
            let (fp, sq) = (g.fp.expect("checked in new"), g.sq.expect("checked in new"));
            let v = as_f64(arr)?.values();
            let square = |i: usize| sq.square(fp.quantise(v[i])) as i128;
            let s = match &valid {
                None => (0..n).map(square).fold(0i128, i128::saturating_add),
                Some(sel) => sel
                    .set_indices()
                    .map(square)
                    .fold(0i128, i128::saturating_add),
            };
            g.sums_sq[0] = g.sums_sq[0].saturating_add(s);
        }
        if g.shape.count {
            g.counts[0] += valid.as_ref().map_or(n, |sel| sel.count_set_bits()) as i64;
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let n = states.first().map_or(0, |s| s.len());
        self.zeros(n);
        self.inner.merge_batch(states, &self.zeros[..n], 1)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(self.inner.scalars(self.inner.partial(0)))
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let p = self.inner.partial(0);
        let fin = Arc::clone(&self.inner.fin);
        let arr = fin.finalise(self.inner.rng(), &[p])?;
        ScalarValue::try_from_array(&arr, 0)
    }

    fn size(&self) -> usize {
        self.inner.memory() + self.zeros.capacity() * size_of::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanisms::exact::SumPath;

    /// A release that only carries the shape and the grid (the tests read the exact partials).
    #[derive(Debug)]
    struct Exact(Shape, FixedPoint);

    impl Finalise for Exact {
        fn shape(&self) -> Shape {
            self.0
        }
        fn fixed_point(&self) -> Option<FixedPoint> {
            Some(self.1)
        }
        fn finalise(&self, _: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
            Ok(Arc::new(Float64Array::from(vec![
                None::<f64>;
                partials.len()
            ])))
        }
    }

    const SUM: Shape = Shape {
        sum: true,
        sum_sq: false,
        count: false,
        rows: false,
    };
    const MEAN: Shape = Shape {
        sum: true,
        sum_sq: false,
        count: true,
        rows: true,
    };

    /// Values at the edges (±0, subnormals, the clamp bounds and their neighbours, ±∞, huge
    /// magnitudes) and random values of every magnitude; NaN and NULL only when asked.
    fn values(n: usize, lower: f64, upper: f64, nan_and_null: bool) -> Vec<Option<f64>> {
        let edges = [
            0.0,
            -0.0,
            f64::from_bits(1),
            -f64::from_bits(1),
            f64::MIN_POSITIVE / 2.0,
            -f64::MIN_POSITIVE,
            lower,
            upper,
            lower.next_down(),
            upper.next_up(),
            lower.next_up(),
            upper.next_down(),
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
            -1e300,
            f64::MAX,
        ];
        let mut rng = SecureRng::insecure_from_seed(11);
        (0..n)
            .map(|i| match i % 29 {
                0 if nan_and_null => None,
                1 if nan_and_null => Some(f64::NAN),
                k if k < edges.len() + 2 && k >= 2 => Some(edges[k - 2]),
                _ => {
                    let m = [1e-9, 1e-3, 1.0, 1e3, 1e7][i % 5];
                    Some((rng.uniform_f64() - 0.3) * m)
                }
            })
            .collect()
    }

    /// The reference: per group, the `i128` sum of `quantise` (the scalar form) over the non-NULL
    /// non-NaN values, their number and the number of rows, row by row.
    fn reference(fp: &FixedPoint, xs: &[Option<f64>], groups: usize) -> Vec<Partial> {
        let mut out = vec![Partial::default(); groups];
        for (i, x) in xs.iter().enumerate() {
            let p = &mut out[i % groups];
            p.rows += 1;
            if let Some(v) = x.filter(|v| !v.is_nan()) {
                p.sum += fp.quantise(v) as i128;
                p.count += 1;
            }
        }
        out
    }

    /// The exact partials of every group after a partitioned plan: `parts` partial
    /// accumulators fed round-robin with batches of `batch` rows, their states merged by a
    /// final one (what DataFusion's Partial/Final plan does).
    fn grouped(
        shape: Shape,
        fp: FixedPoint,
        xs: &[Option<f64>],
        groups: usize,
        parts: usize,
        batch: usize,
    ) -> Vec<Partial> {
        let fin: Arc<dyn Finalise> = Arc::new(Exact(shape, fp));
        let mut partial: Vec<DpGroups> = (0..parts)
            .map(|_| DpGroups::new(Arc::clone(&fin), Some(1)).unwrap())
            .collect();
        for (k, c) in xs.chunks(batch).enumerate() {
            let start = k * batch;
            let gi: Vec<usize> = (start..start + c.len()).map(|i| i % groups).collect();
            let arr: ArrayRef = Arc::new(Float64Array::from(c.to_vec()));
            partial[k % parts]
                .update_batch(&[arr], &gi, None, groups)
                .unwrap();
        }
        let mut fin_acc = DpGroups::new(Arc::clone(&fin), Some(1)).unwrap();
        for mut p in partial {
            let state = p.state(EmitTo::All).unwrap();
            let n = state[0].len();
            let gi: Vec<usize> = (0..n).collect();
            fin_acc.merge_batch(&state, &gi, groups).unwrap();
        }
        (0..groups).map(|g| fin_acc.partial(g)).collect()
    }

    /// The same with the no-GROUP-BY accumulator (one group).
    fn ungrouped(
        shape: Shape,
        fp: FixedPoint,
        xs: &[Option<f64>],
        parts: usize,
        batch: usize,
    ) -> Partial {
        let fin: Arc<dyn Finalise> = Arc::new(Exact(shape, fp));
        let mut partial: Vec<DpAccumulator> = (0..parts)
            .map(|_| DpAccumulator::new(Arc::clone(&fin), Some(1)).unwrap())
            .collect();
        for (k, c) in xs.chunks(batch).enumerate() {
            let arr: ArrayRef = Arc::new(Float64Array::from(c.to_vec()));
            partial[k % parts].update_batch(&[arr]).unwrap();
        }
        let mut fin_acc = DpAccumulator::new(Arc::clone(&fin), Some(1)).unwrap();
        for mut p in partial {
            let state: Vec<ArrayRef> = p
                .state()
                .unwrap()
                .into_iter()
                .map(|s| s.to_array().unwrap())
                .collect();
            fin_acc.merge_batch(&state).unwrap();
        }
        fin_acc.partial()
    }

    /// Keeps only the fields `shape` has.
    fn masked(shape: Shape, p: Partial) -> Partial {
        Partial {
            sum: if shape.sum { p.sum } else { 0 },
            sum_sq: 0,
            count: if shape.count { p.count } else { 0 },
            rows: if shape.rows { p.rows } else { 0 },
        }
    }

    /// Issue 32: the exact partials (so the releases) are identical for 1, 2, 16 and 64
    /// partitions and batches of 1, 7 and 8,192 rows, grouped and ungrouped, for `dp_sum`'s and
    /// `dp_mean`'s shapes, on the vectorised path (no NULL, no NaN: `count_nan`,
    /// `sum_quantised` and the fused scatter) and on the masked scalar path (NULL and NaN
    /// present), and equal to a row-by-row `i128` sum of the scalar `quantise`.
    #[test]
    fn partials_are_identical_for_every_partitioning_and_batch_size() {
        let groups = 5;
        for (lower, upper) in [(-1000.0, 1000.0), (0.0, 1024.0), (-3.0, 1e6)] {
            let fp = FixedPoint::new(lower, upper);
            for nan_and_null in [false, true] {
                let xs = values(6000, lower, upper, nan_and_null);
                let want = reference(&fp, &xs, groups);
                let want_all = want.iter().fold(Partial::default(), |a, p| Partial {
                    sum: a.sum + p.sum,
                    sum_sq: 0,
                    count: a.count + p.count,
                    rows: a.rows + p.rows,
                });
                for shape in [SUM, MEAN] {
                    for parts in [1, 2, 16, 64] {
                        for batch in [1, 7, 8192] {
                            let what = format!(
                                "[{lower}, {upper}] nan/null {nan_and_null} {shape:?} \
                                 {parts} partitions, batches of {batch}"
                            );
                            let got = grouped(shape, fp, &xs, groups, parts, batch);
                            for g in 0..groups {
                                assert_eq!(got[g], masked(shape, want[g]), "group {g}, {what}");
                            }
                            let got = ungrouped(shape, fp, &xs, parts, batch);
                            assert_eq!(got, masked(shape, want_all), "ungrouped, {what}");
                        }
                    }
                }
            }
        }
    }

    /// Many groups (more than the rows of a batch: the direct `i128` branch of the fused pass)
    /// and a FILTER give the row-by-row totals too.
    #[test]
    fn many_groups_and_filters_give_the_reference_totals() {
        let fp = FixedPoint::new(-1000.0, 1000.0);
        let xs = values(6000, -1000.0, 1000.0, false);
        for groups in [1, 3000, 6000] {
            let want = reference(&fp, &xs, groups);
            for batch in [7, 8192] {
                let got = grouped(MEAN, fp, &xs, groups, 3, batch);
                assert_eq!(got, want, "{groups} groups, batches of {batch}");
            }
        }
        // FILTER: every other row.
        let fin: Arc<dyn Finalise> = Arc::new(Exact(MEAN, fp));
        let mut acc = DpGroups::new(fin, Some(1)).unwrap();
        let arr: ArrayRef = Arc::new(Float64Array::from(xs.clone()));
        let filter = BooleanArray::from((0..xs.len()).map(|i| i % 2 == 0).collect::<Vec<_>>());
        let gi = vec![0usize; xs.len()];
        acc.update_batch(&[arr], &gi, Some(&filter), 1).unwrap();
        let kept: Vec<Option<f64>> = xs.iter().step_by(2).copied().collect();
        assert_eq!(acc.partial(0), reference(&fp, &kept, 1)[0]);
    }

    /// Row `i` of a `dp_mean`-shaped state (sum, count, rows).
    fn from_state(st: &[ArrayRef], i: usize) -> Partial {
        Partial {
            sum: st[0].as_primitive::<Decimal128Type>().value(i),
            sum_sq: 0,
            count: st[1].as_primitive::<Int64Type>().value(i),
            rows: st[2].as_primitive::<Int64Type>().value(i),
        }
    }

    /// Pending `i64` partials are flushed before every read: states emitted in pieces
    /// (`EmitTo::First`, as DataFusion does under memory pressure) between updates add up to
    /// the row-by-row totals.
    #[test]
    fn emitting_in_pieces_flushes_pending_partials() {
        let fp = FixedPoint::new(-1000.0, 1000.0);
        let xs = values(5000, -1000.0, 1000.0, false);
        let groups = 10;
        let want = reference(&fp, &xs, groups);
        let fin: Arc<dyn Finalise> = Arc::new(Exact(MEAN, fp));
        let mut acc = DpGroups::new(fin, Some(1)).unwrap();
        let mut got = vec![Partial::default(); groups];
        let mut base = 0; // groups already emitted
        for (k, c) in xs.chunks(1000).enumerate() {
            let start = k * 1000;
            let gi: Vec<usize> = (start..start + c.len())
                .map(|i| (i % groups).saturating_sub(base))
                .collect();
            // rows of emitted groups are not fed again (their group is gone): skip them
            let keep: Vec<usize> = (0..c.len())
                .filter(|&i| (start + i) % groups >= base)
                .collect();
            let vals: Vec<Option<f64>> = keep.iter().map(|&i| c[i]).collect();
            let gi: Vec<usize> = keep.iter().map(|&i| gi[i]).collect();
            let arr: ArrayRef = Arc::new(Float64Array::from(vals));
            acc.update_batch(&[arr], &gi, None, groups - base).unwrap();
            if k == 1 {
                let st = acc.state(EmitTo::First(3)).unwrap();
                for (g, p) in got.iter_mut().enumerate().take(3) {
                    *p = from_state(&st, g);
                }
                base = 3;
            }
        }
        let st = acc.state(EmitTo::All).unwrap();
        for (g, p) in got.iter_mut().enumerate().skip(base) {
            *p = from_state(&st, g - base);
        }
        // The emitted groups saw only the first two batches.
        let early = reference(&fp, &xs[..2000], groups);
        assert_eq!(&got[..3], &early[..3]);
        assert_eq!(&got[3..], &want[3..]);
    }

    /// Every build of the vectorised exact sum (baseline, AVX2, AVX-512 where the CPU has them)
    /// sums the scalar `quantise` integers exactly, for lengths around the vector widths (the
    /// tails) and edge values; NaN is counted (by the sum and by `count_nan`), not summed.
    #[test]
    fn vectorised_builds_equal_the_scalar_conversion() {
        for (lower, upper) in [(-1000.0, 1000.0), (0.0, 1024.0), (-1e-300, 0.0), (5.0, 5.0)] {
            let fp = FixedPoint::new(lower, upper);
            let all: Vec<f64> = values(3000, lower, upper, false)
                .into_iter()
                .map(Option::unwrap)
                .collect();
            for len in (0..20).chain([1000, 3000]) {
                let vals = &all[..len];
                let want: i128 = vals.iter().map(|&v| fp.quantise(v) as i128).sum();
                for path in [
                    SumPath::Auto,
                    SumPath::Portable,
                    SumPath::Avx2,
                    SumPath::Avx512,
                ] {
                    assert_eq!(fp.sum_quantised_on(vals, path), (want, 0), "{path:?}");
                }
                assert_eq!(count_nan(vals), 0);
                if len > 0 {
                    let mut with_nan = vals.to_vec();
                    with_nan[len / 2] = f64::NAN;
                    assert_eq!(count_nan(&with_nan), 1);
                    for path in [SumPath::Portable, SumPath::Auto, SumPath::Avx512] {
                        assert_eq!(fp.sum_quantised_on(&with_nan, path).1, 1);
                    }
                }
            }
        }
    }

    /// Issue (review): under an insecure test seed, a group's release does not depend on the
    /// order in which the final aggregate meets its groups. The same seeded GROUP BY query at
    /// `target_partitions` 1 and 4, over batches of 7 and of 5,000 rows, with the rows in order
    /// and reversed, releases the same values for every group whose exact partial is its own
    /// (each group's generator comes from the seed and its exact partial, which every
    /// partitioning computes identically). Groups 23 and 24 hold identical rows: they still get
    /// different noise (ranks 0 and 1) when one final partition holds both, but which of them
    /// gets which may follow the order, and across partitions they share rank 0 (the accumulator
    /// cannot see the key that would tell them apart; [`seeded_per_group`]).
    #[tokio::test]
    async fn seeded_groups_release_the_same_whatever_the_order() {
        use datafusion::arrow::array::RecordBatch;
        use datafusion::arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::{SessionConfig, SessionContext};
        // Group g < 23 has 100 + 3g rows (distinct counts and sums); 23 and 24 the same 50 rows.
        let mut rows: Vec<(i64, f64)> = (0..23i64)
            .flat_map(|g| (0..100 + 3 * g).map(move |j| (g, ((j * 31 + g * 7) % 97) as f64 / 10.0)))
            .chain((0..100).map(|j| (23 + j % 2, (j / 2 % 10) as f64)))
            .collect();
        // A fixed shuffle, so that groups arrive interleaved.
        let n = rows.len();
        for i in 0..n {
            rows.swap(i, (i * 7919 + 13) % n);
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ]));
        let mut runs = vec![];
        for (partitions, chunk, reversed) in [
            (1, 5000, false),
            (4, 7, false),
            (4, 5000, true),
            (1, 7, true),
        ] {
            let mut rows = rows.clone();
            if reversed {
                rows.reverse();
            }
            let batches: Vec<RecordBatch> = rows
                .chunks(chunk)
                .map(|c| {
                    RecordBatch::try_new(
                        Arc::clone(&schema),
                        vec![
                            Arc::new(Int64Array::from_iter_values(c.iter().map(|r| r.0))),
                            Arc::new(Float64Array::from_iter_values(c.iter().map(|r| r.1))),
                        ],
                    )
                    .unwrap()
                })
                .collect();
            // Spread over the partitions round-robin, as a scan of several files would be.
            let mut parts = vec![vec![]; partitions];
            for (i, b) in batches.into_iter().enumerate() {
                parts[i % partitions].push(b);
            }
            let ctx = SessionContext::new_with_config(
                SessionConfig::new().with_target_partitions(partitions),
            );
            for u in crate::aggregates::all_udafs_insecure_seeded(17) {
                ctx.register_udaf(u);
            }
            ctx.register_table(
                "t",
                Arc::new(MemTable::try_new(Arc::clone(&schema), parts).unwrap()),
            )
            .unwrap();
            let out = ctx
                .sql(
                    "SELECT g, dp_sum(x, 0, 10, 1.0, 1e-6), dp_count(x, 1.0, 1e-6), \
                     dp_mean(x, 0, 10, 1.0, 1e-6) FROM t GROUP BY g ORDER BY g",
                )
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            let col = |i: usize| -> Vec<f64> {
                out.iter()
                    .flat_map(|b| {
                        let c = datafusion::arrow::compute::cast(b.column(i), &DataType::Float64)
                            .unwrap();
                        c.as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                            .values()
                            .to_vec()
                    })
                    .collect()
            };
            let (sums, counts, means) = (col(1), col(2), col(3));
            assert_eq!(sums.len(), 25);
            if partitions == 1 {
                // In one emission; split across final partitions both take rank 0.
                assert_ne!(sums[23], sums[24], "identical groups, independent noise");
            }
            runs.push((
                sums[..23].to_vec(),
                counts[..23].to_vec(),
                means[..23].to_vec(),
            ));
        }
        for r in &runs[1..] {
            assert_eq!(&runs[0], r);
        }
    }
}
