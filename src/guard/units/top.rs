//! `__dpfusion_unit_groups`: with GROUP BY, the whole contribution bounding of a unit in one
//! hash aggregate by unit (units.rs, module docs). Each unit keeps its K groups of smallest keyed
//! hash and, for each kept group, what the calls need: the unit's totals (`dp_sum`) and a sample
//! of at most C of its rows (row-level calls).
//!
//! A group whose hash is larger than a unit's K-th smallest so far can never be among its K
//! smallest, so it is dropped at once with everything it holds: the state per unit is O(K·C)
//! whatever the unit's rows, and no (unit, group) aggregate comes first (the previous design's
//! first hash aggregate had about as many groups as the table has rows). A kept group is never
//! dropped on the way: in any partial state it has fewer smaller hashes than in the whole, so its
//! totals and sample are complete; merging keeps the K smallest of the union. The choice is
//! therefore exactly the one of `row_number() OVER (PARTITION BY unit ORDER BY hash) <= K` over
//! the (unit, group)s, whatever the order, the partitioning or the spilling.
//!
//! Two groups of one unit are told apart by their hash (a 64-bit PRF, [`super::GroupKey`]):
//! two groups of one unit with the same hash (probability about g²/2⁶⁵ for a unit with g groups)
//! would share one entry, the group of the first met; the bounds hold all the same (still K
//! entries, each at most C rows or one total), only that unit's rows of the second group count
//! under the first.
//!
//! What an entry holds is a function of its unit's rows, not of the order they or the partial
//! states arrive in (round 48, review "topgroups"): its group keys are stored canonical
//! ([`super::canonical_key`], F1: the first row's −0.0 or 0.0 was kept, and every row of the
//! entry read it), and its totals are exact `i128` sums on the grid of their `dp_sum`
//! ([`super::Grid`], F2: a float sum in arrival order let cancelling values make a total 0 or 5
//! by thread timing), carried exactly in a partial state (16 bytes, little-endian).
use std::hash::Hasher;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, Float64Array, ListArray,
    StructArray, UInt64Array, new_empty_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Float64Type, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

use super::Grid;

/// Each unit's K groups of smallest keyed hash, with their totals and samples ([`TopGroups`]).
pub(in crate::guard) const TOP_GROUPS_FN: &str = "__dpfusion_unit_groups";

/// What follows `(K, C, hash)` in a call: `groups` GROUP BY keys, `totals` Float64 values (one
/// per `dp_sum` total: the value under its FILTER, NULL where it does not count; summed exactly
/// on its grid, [`TopGroups::grids`]), `sampled`
/// columns; `rows`: each kept (unit, group) keeps a sample of at most C of its rows (also with no
/// sampled column: `dp_count(*)` counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::guard) struct Layout {
    pub groups: usize,
    pub totals: usize,
    pub sampled: usize,
    pub rows: bool,
}

impl Layout {
    fn arity(&self) -> usize {
        3 + self.groups + self.totals + self.sampled
    }

    /// Where the group keys, the totals and the sampled columns stand among the arguments.
    fn args(&self) -> [std::ops::Range<usize>; 3] {
        let (g, t) = (3 + self.groups, 3 + self.groups + self.totals);
        [3..g, g..t, t..self.arity()]
    }
}

/// SipHash-2-4 (the PRF of [`super::GroupKey`]) under `key` of a sampled row's encoded values
/// (none with no sampled column: `dp_count(*)`) and its id, one no other row of the query has
/// ([`super::RowIds`]): the row sample's key, the C smallest of a (unit, group) kept
/// ([`super::Sample`]).
pub(super) fn row_key(key: [u64; 2], row: Option<&[u8]>, id: u64) -> u64 {
    #[allow(deprecated)] // SipHash-2-4 with a key: the PRF wanted, in std.
    let mut h = std::hash::SipHasher::new_with_keys(key[0], key[1]);
    if let Some(row) = row {
        h.write(row);
    }
    h.write_u64(id);
    h.finish()
}

/// A list array of `lengths` lists over the struct rows (`fields`, `columns`).
pub(super) fn struct_list(
    fields: Fields,
    columns: Vec<ArrayRef>,
    lengths: impl IntoIterator<Item = usize>,
) -> Result<ArrayRef> {
    let values = StructArray::try_new(fields.clone(), columns, None)?;
    Ok(Arc::new(ListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Struct(fields), true)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(values),
        None,
    )?))
}

/// `__dpfusion_unit_groups(K, C, hash, g…, t…, s…)`, aggregated by unit over the private rows:
/// a list per unit of its kept (unit, group)s, each a struct `{c0 … (the group keys), c… (the
/// totals), sample}` where `sample` is a list of `{pos, c0, …}` (the sampled rows, `pos` = 1, 2, …
/// in key order, as [`super::Sample`] gives them). A row's sample key is SipHash-2-4 under the
/// query's row-sample key of the row's sampled values and its id among the query's rows
/// ([`super::Sample`]'s rule). A
/// [`GroupsAccumulator`]: one state for all units.
#[derive(PartialEq, Eq, Hash)]
pub(in crate::guard) struct TopGroups {
    pub(in crate::guard) layout: Layout,
    /// The grid of each total (its `dp_sum`'s bounds': the precision of the total, public).
    grids: Vec<Grid>,
    key: [u64; 2],
    /// The query's row ids, shared by every accumulator of this aggregate (round 46).
    ids: super::RowIds,
    signature: Signature,
}

impl std::fmt::Debug for TopGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TopGroups {{ layout: {:?}, grids: {:?}, key: <secret> }}",
            self.layout, self.grids
        )
    }
}

/// The aggregate for `layout`, its totals on `grids`, its row sample keyed by `sample_key` (the
/// query's, derived).
pub(in crate::guard) fn top_groups_udaf(
    layout: Layout,
    grids: Vec<Grid>,
    sample_key: [u64; 2],
) -> AggregateUDF {
    AggregateUDF::from(TopGroups {
        layout,
        grids,
        key: sample_key,
        ids: super::RowIds::default(),
        signature: Signature::variadic_any(Volatility::Volatile),
    })
}

/// The struct of a sample's rows: `first` (`pos` or `key`), then `c0, c1, …` of `types`.
pub(super) fn sample_fields(first: &str, types: &[DataType]) -> Fields {
    std::iter::once(Field::new(first, DataType::UInt64, true))
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(j, t)| Field::new(format!("c{j}"), t.clone(), true)),
        )
        .collect()
}

pub(super) fn list_of(fields: Fields) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(
        DataType::Struct(fields),
        true,
    )))
}

/// The struct of a kept (unit, group): `hash` first in a state; `c0 …` the group keys then the
/// totals (Float64 out, the exact sums in a state: [`super::sum_type`]); `sample` if rows are
/// sampled (its rows' first field `key` in a state, `pos` out).
fn kept_fields(layout: &Layout, groups: &[DataType], sampled: &[DataType], state: bool) -> Fields {
    let mut f: Vec<Field> = vec![];
    if state {
        f.push(Field::new("hash", DataType::UInt64, true));
    }
    let total = if state {
        super::sum_type()
    } else {
        DataType::Float64
    };
    let totals = std::iter::repeat_n(total, layout.totals);
    for (j, t) in groups.iter().cloned().chain(totals).enumerate() {
        f.push(Field::new(format!("c{j}"), t, true));
    }
    if layout.rows {
        let first = if state { "key" } else { "pos" };
        f.push(Field::new(
            "sample",
            list_of(sample_fields(first, sampled)),
            true,
        ));
    }
    f.into()
}

impl TopGroups {
    /// The group keys' and the sampled columns' types, from the call's argument types.
    fn types(&self, args: &[DataType]) -> Result<(Vec<DataType>, Vec<DataType>)> {
        let l = &self.layout;
        if args.len() != l.arity() {
            return Err(DataFusionError::Internal(format!(
                "{TOP_GROUPS_FN}: {} arguments for a layout of {}",
                args.len(),
                l.arity()
            )));
        }
        let [g, _, s] = l.args();
        Ok((args[g].to_vec(), args[s].to_vec()))
    }
}

impl AggregateUDFImpl for TopGroups {
    fn name(&self) -> &str {
        TOP_GROUPS_FN
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let (g, s) = self.types(arg_types)?;
        Ok(list_of(kept_fields(&self.layout, &g, &s, false)))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let types: Vec<DataType> = args
            .input_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let (g, s) = self.types(&types)?;
        Ok(vec![Arc::new(Field::new(
            format!("{}[kept]", args.name),
            list_of(kept_fields(&self.layout, &g, &s, true)),
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
    ) -> Result<Box<dyn GroupsAccumulator>> {
        let literal = |i: usize| match args
            .exprs
            .get(i)
            .and_then(|e| e.downcast_ref::<datafusion::physical_expr::expressions::Literal>())
            .map(|l| l.value())
        {
            Some(ScalarValue::UInt64(Some(v))) if *v > 0 => {
                Ok(usize::try_from(*v).unwrap_or(usize::MAX))
            }
            _ => Err(DataFusionError::Internal(format!(
                "{TOP_GROUPS_FN}: K and C must be positive UInt64 literals"
            ))),
        };
        let (k, c) = (literal(0)?, literal(1)?);
        let types = args
            .exprs
            .iter()
            .map(|e| e.data_type(args.schema))
            .collect::<Result<Vec<_>>>()?;
        let (g, s) = self.types(&types)?;
        if types[self.layout.args()[1].clone()]
            .iter()
            .any(|t| t != &DataType::Float64)
            || self.grids.len() != self.layout.totals
        {
            return Err(DataFusionError::Internal(format!(
                "{TOP_GROUPS_FN}: totals must be Float64, each with its grid"
            )));
        }
        Ok(Box::new(TopGroupsAccumulator::new(
            (k, c),
            self.layout,
            self.grids.clone(),
            self.key,
            self.ids.clone(),
            g,
            s,
        )?))
    }
}

/// No entry (the end of a chain).
const NONE: u32 = u32::MAX;

/// A row of a [`Store`]: (batch, row in it).
type Ref = (u32, u32);

/// A kept (unit, group) (its hash is in `hashes`): its group keys' row, and its sample: a chain
/// of [`Drawn`] whose first `slen` are its rows (the chain may be longer: the rest is reused
/// when the entry is, after an eviction).
#[derive(Clone, Copy, Debug)]
struct Slot {
    row: Ref,
    shead: u32,
    slen: u32,
}

/// Entries per block: a unit's entries are blocks of B = min(K, this) consecutive slots, so
/// that looking up a unit reads one run of hashes (32 bytes for B = 4: one or two cache lines).
const BLOCK: usize = 4;

/// A sampled row: its key, its row, the next of its chain.
#[derive(Clone, Copy, Debug)]
struct Drawn {
    key: u64,
    row: Ref,
    next: u32,
}

/// Input arrays that kept entries point into (no copy per row): compacted to the rows still
/// pointed to once it holds more than twice them (plus [`COMPACT_SLACK`]), so the rows held stay
/// O(entries) and each input row is copied O(1) times (amortised).
struct Store {
    types: Vec<DataType>,
    batches: Vec<Vec<ArrayRef>>,
    /// Rows in `batches`.
    held: usize,
    /// The arrays' memory.
    bytes: usize,
}

/// Rows a store may hold beyond twice the rows pointed to before it is compacted.
const COMPACT_SLACK: usize = 16_384;

impl Store {
    fn new(types: Vec<DataType>) -> Self {
        Self {
            types,
            batches: vec![],
            held: 0,
            bytes: 0,
        }
    }

    /// The index the next batch gets.
    fn next_batch(&self) -> Result<u32> {
        u32::try_from(self.batches.len())
            .map_err(|_| DataFusionError::Internal(format!("{TOP_GROUPS_FN}: too many batches")))
    }

    fn push(&mut self, columns: &[ArrayRef], rows: usize) {
        self.held += rows;
        self.bytes += columns
            .iter()
            .map(|c| c.get_array_memory_size())
            .sum::<usize>();
        self.batches.push(columns.to_vec());
    }

    /// The rows `refs` (in order), gathered into arrays (arrow's `interleave`: any type).
    fn gather(&self, refs: &[Ref]) -> Result<Vec<ArrayRef>> {
        let indices: Vec<(usize, usize)> = refs
            .iter()
            .map(|&(b, r)| (b as usize, r as usize))
            .collect();
        (0..self.types.len())
            .map(|c| {
                if indices.is_empty() {
                    return Ok(new_empty_array(&self.types[c]));
                }
                let arrays: Vec<&dyn Array> =
                    self.batches.iter().map(|cols| cols[c].as_ref()).collect();
                Ok(datafusion::arrow::compute::interleave(&arrays, &indices)?)
            })
            .collect()
    }

    /// Keeps only the rows `refs` (then batch 0, rows 0, 1, … in order).
    fn compact(&mut self, refs: &[Ref]) -> Result<()> {
        let columns = self.gather(refs)?;
        self.batches.clear();
        self.held = 0;
        self.bytes = 0;
        self.push(&columns, refs.len());
        Ok(())
    }

    fn clear(&mut self) {
        self.batches = vec![];
        self.held = 0;
        self.bytes = 0;
    }

    fn size(&self) -> usize {
        self.batches.capacity() * std::mem::size_of::<Vec<ArrayRef>>() + self.bytes
    }
}

/// The state of [`TopGroups`] for all units of one aggregate, without an allocation per entry:
/// unit `u`'s kept entries (`units[u].1` ≤ K of them) fill a chain of blocks of B slots from
/// `units[u].0` (slot i of block b is entry b·B + i: its hash in `hashes`, its row and sample in
/// `slots`, its totals (exact sums, [`Grid`]) at `totals[entry·T ..]`), their samples chains of
/// [`Drawn`]; group keys (canonical, [`super::canonical_key`]) and
/// sampled values stay in the input arrays ([`Store`]). A batch's rows are added in about unit
/// order ([`by_unit`]) with the state of the unit [`AHEAD`] rows on prefetched, and the arenas grow
/// by an eighth ([`room`]), so that what the memory pool counts is what is held.
struct TopGroupsAccumulator {
    k: usize,
    c: usize,
    layout: Layout,
    /// The grid of each total.
    grids: Vec<Grid>,
    /// The row sample's PRF key.
    key: [u64; 2],
    /// B.
    b: usize,
    /// Per unit: its first block and how many entries it keeps (together: one read per row).
    units: Vec<(u32, u32)>,
    /// Per block: the next block of its unit.
    next_block: Vec<u32>,
    hashes: Vec<u64>,
    slots: Vec<Slot>,
    /// Entries kept, over all units.
    live: usize,
    /// Σ q(v) of each entry's totals (wrapping: a function of the multiset of values).
    totals: Vec<i128>,
    valid: Vec<bool>,
    drawn: Vec<Drawn>,
    /// Sampled rows kept (the first `slen` of every chain).
    drawn_live: usize,
    groups: Store,
    sampled: Store,
    /// Encodes a row's sampled values for its key (None without sampled columns).
    encoder: Option<RowConverter>,
    /// The query's row ids (for a row's sample key: no two rows of the query share one).
    ids: super::RowIds,
}

impl std::fmt::Debug for TopGroupsAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TopGroupsAccumulator {{ k: {}, c: {}, units: {}, entries: {} }}",
            self.k,
            self.c,
            self.units.len(),
            self.live
        )
    }
}

impl TopGroupsAccumulator {
    /// For K and C, `layout`, the totals' `grids`, the sample's `key` and the query's
    /// row `ids`, the group keys' and sampled columns' types.
    fn new(
        (k, c): (usize, usize),
        layout: Layout,
        grids: Vec<Grid>,
        key: [u64; 2],
        ids: super::RowIds,
        groups: Vec<DataType>,
        sampled: Vec<DataType>,
    ) -> Result<Self> {
        let encoder = if sampled.is_empty() {
            None
        } else {
            Some(RowConverter::new(
                sampled.iter().cloned().map(SortField::new).collect(),
            )?)
        };
        Ok(Self {
            k: k.max(1),
            c: c.max(1),
            layout,
            grids,
            key,
            b: k.clamp(1, BLOCK),
            units: vec![],
            next_block: vec![],
            hashes: vec![],
            slots: vec![],
            live: 0,
            totals: vec![],
            valid: vec![],
            drawn: vec![],
            drawn_live: 0,
            groups: Store::new(groups),
            sampled: Store::new(sampled),
            encoder,
            ids,
        })
    }

    fn grow(&mut self, total: usize) {
        if self.units.len() < total {
            let extra = total - self.units.len();
            room(&mut self.units, extra);
            self.units.resize(total, (NONE, 0));
        }
    }

    /// The sample keys of `n` rows with sampled columns `columns`: SipHash-2-4 of the row's
    /// values and its id.
    fn row_keys(&self, columns: &[ArrayRef], n: usize) -> Result<Vec<u64>> {
        let start = self.ids.take(n);
        let encoded = match &self.encoder {
            Some(e) => Some(e.convert_columns(columns)?),
            None => None,
        };
        Ok((0..n)
            .map(|i| {
                let row = encoded.as_ref().map(|rows| rows.row(i));
                row_key(self.key, row.as_ref().map(|r| r.as_ref()), start + i as u64)
            })
            .collect())
    }

    /// The entry of unit `u` that (hash, row) goes to: the unit's own if it keeps that hash, else
    /// a new one or the evicted one of largest hash (reset to it), or None if the hash is not
    /// among the unit's K smallest.
    fn slot_for(&mut self, u: usize, hash: u64, row: Ref) -> Result<Option<usize>> {
        let (head, n) = self.units[u];
        let (n, bs) = (n as usize, self.b);
        let (mut block, mut last, mut seen) = (head, NONE, 0);
        let mut max: Option<usize> = None;
        while seen < n {
            let base = block as usize * bs;
            let m = bs.min(n - seen);
            for i in base..base + m {
                let h = self.hashes[i];
                if h == hash {
                    return Ok(Some(i));
                }
                if max.is_none_or(|x| h > self.hashes[x]) {
                    max = Some(i);
                }
            }
            seen += m;
            last = block;
            block = self.next_block[block as usize];
        }
        let t = self.layout.totals;
        if n < self.k {
            // Entry n: in the last block, or in a new one linked after it.
            let target = if n % bs == 0 {
                let id = u32::try_from(self.next_block.len())
                    .ok()
                    .filter(|&i| i != NONE && (i as usize + 1) * bs < u32::MAX as usize)
                    .ok_or_else(|| {
                        DataFusionError::Internal(format!("{TOP_GROUPS_FN}: too many entries"))
                    })?;
                room(&mut self.next_block, 1);
                self.next_block.push(NONE);
                let slots = self.hashes.len() + bs;
                room(&mut self.hashes, bs);
                room(&mut self.slots, bs);
                room(&mut self.totals, bs * t);
                room(&mut self.valid, bs * t);
                self.hashes.resize(slots, 0);
                self.slots.resize(
                    slots,
                    Slot {
                        row: (0, 0),
                        shead: NONE,
                        slen: 0,
                    },
                );
                self.totals.resize(slots * t, 0);
                self.valid.resize(slots * t, false);
                if last == NONE {
                    self.units[u].0 = id;
                } else {
                    self.next_block[last as usize] = id;
                }
                id
            } else {
                last
            };
            let i = target as usize * bs + n % bs;
            self.hashes[i] = hash;
            self.slots[i].row = row;
            self.units[u].1 += 1;
            self.live += 1;
            return Ok(Some(i));
        }
        let Some(m) = max.filter(|&m| hash < self.hashes[m]) else {
            return Ok(None);
        };
        self.hashes[m] = hash;
        let slot = &mut self.slots[m];
        slot.row = row;
        self.drawn_live -= slot.slen as usize;
        slot.slen = 0;
        self.totals[m * t..(m + 1) * t].fill(0);
        self.valid[m * t..(m + 1) * t].fill(false);
        Ok(Some(m))
    }

    /// Prefetches for the rows of the units `order` lists: at row `p`, unit `p + 2·AHEAD`'s
    /// place in `units`, and unit `p + AHEAD`'s first block of hashes, of slots and of totals (the
    /// line of its first element: a block may straddle two, and prefetching the second as well
    /// measured alike, PERFORMANCE.md round 43).
    #[inline(always)]
    fn prefetch(&self, order: &[(usize, usize)], p: usize) {
        if let Some(&(u, _)) = order.get(p + 2 * AHEAD) {
            prefetch(self.units.as_ptr().wrapping_add(u));
        }
        if let Some(&(u, _)) = order.get(p + AHEAD) {
            let head = self.units[u].0;
            if head != NONE {
                let e = head as usize * self.b;
                prefetch(self.hashes.as_ptr().wrapping_add(e));
                prefetch(self.slots.as_ptr().wrapping_add(e));
                let t = self.layout.totals;
                if t > 0 {
                    prefetch(self.totals.as_ptr().wrapping_add(e * t));
                    prefetch(self.valid.as_ptr().wrapping_add(e * t));
                }
            }
        }
    }

    /// Adds row `i` of the totals' columns (values) to entry `slot`: q(v) on each total's grid,
    /// NULL and NaN skipped.
    fn add_totals(&mut self, slot: usize, columns: &[&Float64Array], i: usize) {
        for (j, c) in columns.iter().enumerate() {
            if c.is_valid(i) {
                self.add_sum(slot, j, self.grids[j].quantise(c.value(i)));
            }
        }
    }

    /// Adds entry `e` of a state's totals (exact sums) to entry `slot`.
    fn merge_totals(&mut self, slot: usize, columns: &[&FixedSizeBinaryArray], e: usize) {
        for (j, c) in columns.iter().enumerate() {
            self.add_sum(slot, j, super::sum_at(c, e));
        }
    }

    /// Adds a sum of q(v) (none: nothing counted) to total `j` of entry `slot`: wrapping `i128`
    /// addition, associative and commutative, so the total is the same for any order of rows and
    /// states (round 48, review "topgroups" F2).
    fn add_sum(&mut self, slot: usize, j: usize, sum: Option<i128>) {
        if let Some(s) = sum {
            let at = slot * self.layout.totals + j;
            self.totals[at] = self.totals[at].wrapping_add(s);
            self.valid[at] = true;
        }
    }

    /// Offers a sampled row (key, row) to entry `slot`; true if kept.
    fn draw(&mut self, slot: usize, key: u64, row: Ref) -> bool {
        let Slot { shead, slen, .. } = self.slots[slot];
        if (slen as usize) < self.c {
            // The chain's entry at `slen`, reused, or a new one at its end.
            let (mut prev, mut e) = (NONE, shead);
            for _ in 0..slen {
                prev = e;
                e = self.drawn[e as usize].next;
            }
            if e == NONE {
                let id = self.drawn.len() as u32;
                room(&mut self.drawn, 1);
                self.drawn.push(Drawn {
                    key,
                    row,
                    next: NONE,
                });
                if prev == NONE {
                    self.slots[slot].shead = id;
                } else {
                    self.drawn[prev as usize].next = id;
                }
            } else {
                self.drawn[e as usize].key = key;
                self.drawn[e as usize].row = row;
            }
            self.slots[slot].slen += 1;
            self.drawn_live += 1;
            return true;
        }
        // Full: the largest key goes if this one is smaller.
        let (mut e, mut max) = (shead, shead);
        for _ in 0..slen {
            if self.drawn[e as usize].key > self.drawn[max as usize].key {
                max = e;
            }
            e = self.drawn[e as usize].next;
        }
        let d = &mut self.drawn[max as usize];
        if key < d.key {
            d.key = key;
            d.row = row;
            true
        } else {
            false
        }
    }

    /// Entry `slot`'s sampled rows (key, row).
    fn samples(&self, slot: usize) -> impl Iterator<Item = (u64, Ref)> + '_ {
        let Slot { shead, slen, .. } = self.slots[slot];
        let mut e = shead;
        (0..slen).map(move |_| {
            let d = self.drawn[e as usize];
            e = d.next;
            (d.key, d.row)
        })
    }

    /// Unit `u`'s entries.
    fn entries(&self, u: usize) -> impl Iterator<Item = usize> + '_ {
        let (mut block, n) = self.units[u];
        let (n, bs) = (n as usize, self.b);
        (0..n).map(move |j| {
            if j > 0 && j % bs == 0 {
                block = self.next_block[block as usize];
            }
            block as usize * bs + j % bs
        })
    }

    /// Compacts the stores that hold more than twice the rows kept.
    fn maybe_compact(&mut self) -> Result<()> {
        let units = self.units.len();
        if self.groups.held > 2 * self.live + COMPACT_SLACK {
            let ids: Vec<usize> = (0..units).flat_map(|u| self.entries(u)).collect();
            let refs: Vec<Ref> = ids.iter().map(|&i| self.slots[i].row).collect();
            self.groups.compact(&refs)?;
            for (j, &i) in ids.iter().enumerate() {
                self.slots[i].row = (0, j as u32);
            }
        }
        if self.sampled.held > 2 * self.drawn_live + COMPACT_SLACK {
            let ids: Vec<usize> = (0..units).flat_map(|u| self.entries(u)).collect();
            let mut refs = Vec::with_capacity(self.drawn_live);
            for slot in ids {
                let Slot { shead, slen, .. } = self.slots[slot];
                let mut e = shead;
                for _ in 0..slen {
                    let d = &mut self.drawn[e as usize];
                    refs.push(d.row);
                    d.row = (0, (refs.len() - 1) as u32);
                    e = d.next;
                }
            }
            self.sampled.compact(&refs)?;
        }
        Ok(())
    }

    /// Units `n..` only (after `EmitTo::First(n)`): their entries copied into fresh arenas.
    fn retain_from(&mut self, n: usize) -> Result<()> {
        let t = self.layout.totals;
        let mut next = Self::new(
            (self.k, self.c),
            self.layout,
            self.grids.clone(),
            self.key,
            self.ids.clone(),
            self.groups.types.clone(),
            self.sampled.types.clone(),
        )?;
        next.grow(self.units.len() - n);
        for u in n..self.units.len() {
            let entries: Vec<usize> = self.entries(u).collect();
            for s in entries {
                let Some(i) = next.slot_for(u - n, self.hashes[s], self.slots[s].row)? else {
                    continue;
                };
                next.totals[i * t..(i + 1) * t].copy_from_slice(&self.totals[s * t..(s + 1) * t]);
                next.valid[i * t..(i + 1) * t].copy_from_slice(&self.valid[s * t..(s + 1) * t]);
                for (key, row) in self.samples(s).collect::<Vec<_>>() {
                    next.draw(i, key, row);
                }
            }
        }
        next.groups = std::mem::replace(&mut self.groups, Store::new(vec![]));
        next.sampled = std::mem::replace(&mut self.sampled, Store::new(vec![]));
        *self = next;
        self.maybe_compact()
    }

    /// The entries of the units `emit_to` takes, as a list of structs per unit (a state's if
    /// `state`).
    fn emit(&mut self, emit_to: EmitTo, state: bool) -> Result<ArrayRef> {
        let n = match emit_to {
            EmitTo::All => self.units.len(),
            EmitTo::First(n) => n.min(self.units.len()),
        };
        let t = self.layout.totals;
        let mut ids = Vec::with_capacity(self.live);
        let mut lengths = Vec::with_capacity(n);
        for u in 0..n {
            let before = ids.len();
            ids.extend(self.entries(u));
            lengths.push(ids.len() - before);
        }
        let mut arrays: Vec<ArrayRef> = vec![];
        if state {
            arrays.push(Arc::new(UInt64Array::from_iter_values(
                ids.iter().map(|&s| self.hashes[s]),
            )));
        }
        let rows: Vec<Ref> = ids.iter().map(|&s| self.slots[s].row).collect();
        arrays.extend(self.groups.gather(&rows)?);
        for j in 0..t {
            let sums = ids
                .iter()
                .map(|&s| self.valid[s * t + j].then_some(self.totals[s * t + j]));
            arrays.push(if state {
                super::sums_array(sums)?
            } else {
                let grid = self.grids[j];
                Arc::new(Float64Array::from_iter(
                    sums.map(|s| s.map(|s| grid.total(s))),
                ))
            });
        }
        if self.layout.rows {
            let (mut firsts, mut refs, mut lens) = (vec![], vec![], vec![]);
            for &s in &ids {
                let mut mine: Vec<(u64, Ref)> = self.samples(s).collect();
                mine.sort_unstable_by_key(|d| d.0);
                lens.push(mine.len());
                for (p, (key, row)) in mine.into_iter().enumerate() {
                    firsts.push(if state { key } else { p as u64 + 1 });
                    refs.push(row);
                }
            }
            let fields = sample_fields(if state { "key" } else { "pos" }, &self.sampled.types);
            let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from(firsts))];
            columns.extend(self.sampled.gather(&refs)?);
            arrays.push(struct_list(fields, columns, lens)?);
        }
        if n == self.units.len() {
            // Memory released, not kept as capacity: after a spill (which emits all) DataFusion
            // shrinks the aggregate's reservation to what `size` then says.
            self.units = vec![];
            self.next_block = vec![];
            self.hashes = vec![];
            self.slots = vec![];
            self.live = 0;
            self.totals = vec![];
            self.valid = vec![];
            self.drawn = vec![];
            self.drawn_live = 0;
            self.groups.clear();
            self.sampled.clear();
        } else {
            self.retain_from(n)?;
        }
        let fields = kept_fields(&self.layout, &self.groups.types, &self.sampled.types, state);
        struct_list(fields, arrays, lengths)
    }
}

/// The rows of a batch as (unit, row), by unit: one counting-sort pass on the unit index's top 8
/// bits, so that the units' state is read in about the order it was laid out (units get their
/// entries in the order they are first met) in 256 runs rather than at random, which at millions
/// of units is most of the time of a lookup (cache and TLB misses). Which entries are kept does
/// not depend on the order.
fn by_unit(group_indices: &[usize]) -> Vec<(usize, usize)> {
    let top = group_indices.iter().max().map_or(0, |&m| m + 1);
    // u < top ≤ 2^bits, so u >> (bits − 8) < 256.
    let shift = (usize::BITS - top.leading_zeros()).saturating_sub(8);
    let mut starts = [0usize; 257];
    for &u in group_indices {
        starts[(u >> shift) + 1] += 1;
    }
    for b in 1..257 {
        starts[b] += starts[b - 1];
    }
    let mut order = vec![(0, 0); group_indices.len()];
    for (i, &u) in group_indices.iter().enumerate() {
        let b = u >> shift;
        order[starts[b]] = (u, i);
        starts[b] += 1;
    }
    order
}

/// How many rows ahead of the one being added [`TopGroupsAccumulator::prefetch`] asks for a
/// unit's state: its place in `units` at twice this distance, its first block of hashes, slots
/// and totals at this distance, so that the cache misses of a lookup (one per row at millions of
/// units) overlap rather than follow one another (8 and 16 measured alike, PERFORMANCE.md).
const AHEAD: usize = 16;

/// Asks the CPU to bring the cache line of `p` in (no effect on the program's meaning: a
/// prefetch never faults and reads nothing the program sees).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it does not dereference `p` in the program's sense and
    // does not fault on any address; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Makes room in `v` for `extra` more elements, growing it by an eighth (at least 1,024) rather
/// than doubling: the arenas are most of the state's memory, which the memory pool counts by
/// capacity, and a doubled arena holds up to half of it unused. Growth stays geometric (each
/// element is copied about 8 times over a run where a reallocation copies; with glibc, one
/// above its mmap threshold, up to 32 MiB, remaps pages instead).
fn room<T>(v: &mut Vec<T>, extra: usize) {
    if v.capacity() - v.len() < extra {
        v.reserve_exact(extra.max(v.len() / 8).max(1024));
    }
}

/// Rows `from..to` of `columns`, copied into buffers of their own.
fn owned(columns: &[ArrayRef], from: usize, to: usize) -> Result<Vec<ArrayRef>> {
    let indices = datafusion::arrow::array::UInt32Array::from_iter_values(from as u32..to as u32);
    columns
        .iter()
        .map(|c| {
            Ok(datafusion::arrow::compute::take(
                c.as_ref(),
                &indices,
                None,
            )?)
        })
        .collect()
}

fn f64s(columns: &[ArrayRef]) -> Vec<&Float64Array> {
    columns
        .iter()
        .map(|c| c.as_primitive::<Float64Type>())
        .collect()
}

/// Group key columns as an entry stores them ([`super::canonical_key`], round 48).
fn canonical(columns: &[ArrayRef]) -> Vec<ArrayRef> {
    columns.iter().map(super::canonical_key).collect()
}

impl GroupsAccumulator for TopGroupsAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let l = self.layout;
        let n = group_indices.len();
        let hashes = values[2].as_primitive::<UInt64Type>().clone();
        let [g, t, s] = l.args();
        // Canonical before they are stored: every row of an entry reads one key (F1).
        let group_cols = &canonical(&values[g]);
        let totals = f64s(&values[t]);
        let sampled = &values[s];
        let keys = if l.rows {
            Some(self.row_keys(sampled, n)?)
        } else {
            None
        };
        let (gb, sb) = (self.groups.next_batch()?, self.sampled.next_batch()?);
        let (mut g_used, mut s_used) = (false, false);
        let order = by_unit(group_indices);
        for (p, &(u, i)) in order.iter().enumerate() {
            self.prefetch(&order, p);
            if opt_filter.is_some_and(|f| !f.is_valid(i) || !f.value(i)) || hashes.is_null(i) {
                continue;
            }
            let row = (gb, i as u32);
            let Some(slot) = self.slot_for(u, hashes.value(i), row)? else {
                continue;
            };
            g_used |= self.slots[slot].row == row;
            self.add_totals(slot, &totals, i);
            if let Some(keys) = &keys {
                s_used |= self.draw(slot, keys[i], (sb, i as u32));
            }
        }
        if g_used {
            self.groups.push(group_cols, n);
        }
        if s_used {
            self.sampled.push(sampled, n);
        }
        self.maybe_compact()
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let l = self.layout;
        let lists = values[0].as_list::<i32>();
        let entries = lists.values().as_struct();
        let hashes = entries.column(0).as_primitive::<UInt64Type>().clone();
        // The state's struct: hash, then the group keys and totals as in the arguments (after
        // K, C and the hash: 2 places further on), then the sample.
        let [g, t, s] = l.args().map(|r| r.start - 2..r.end - 2);
        let group_cols = &entries.columns()[g];
        let totals: Vec<&FixedSizeBinaryArray> = entries.columns()[t]
            .iter()
            .map(|c| c.as_fixed_size_binary())
            .collect();
        let sample = l.rows.then(|| entries.column(s.start).as_list::<i32>());
        let (gb, sb) = (self.groups.next_batch()?, self.sampled.next_batch()?);
        let (mut g_used, mut s_used) = (false, false);
        let offsets = lists.value_offsets();
        // The entries (and sampled rows) of this batch: a range of the arrays, which are often a
        // slice of a partial aggregate's whole state. Kept rows point into a copy of the range
        // (stored below), not into the whole buffers (held and counted once per slice).
        let e0 = offsets[0] as usize;
        let e1 = offsets[lists.len()] as usize;
        let (s0, s1) = sample.map_or((0, 0), |x| {
            let so = x.value_offsets();
            (so[e0] as usize, so[e1] as usize)
        });
        let order = by_unit(group_indices);
        for (p, &(u, i)) in order.iter().enumerate() {
            self.prefetch(&order, p);
            if lists.is_null(i) {
                continue;
            }
            for e in offsets[i] as usize..offsets[i + 1] as usize {
                if hashes.is_null(e) {
                    continue;
                }
                let row = (gb, (e - e0) as u32);
                let Some(slot) = self.slot_for(u, hashes.value(e), row)? else {
                    continue;
                };
                g_used |= self.slots[slot].row == row;
                self.merge_totals(slot, &totals, e);
                if let Some(sample) = sample {
                    let keys = sample.values().as_struct().column(0);
                    let keys = keys.as_primitive::<UInt64Type>();
                    let so = sample.value_offsets();
                    for r in so[e] as usize..so[e + 1] as usize {
                        s_used |= self.draw(slot, keys.value(r), (sb, (r - s0) as u32));
                    }
                }
            }
        }
        if g_used {
            // (A state's keys are canonical already; made so again, as every key stored.)
            let keys = canonical(&owned(group_cols, e0, e1)?);
            self.groups.push(&keys, e1 - e0);
        }
        if s_used && let Some(sample) = sample {
            let values = sample.values().as_struct();
            self.sampled
                .push(&owned(&values.columns()[1..], s0, s1)?, s1 - s0);
        }
        self.maybe_compact()
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.emit(emit_to, false)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to, true)?])
    }

    /// DataFusion's partial aggregate stops grouping and calls this when it sees about as many
    /// units as rows (`skip_partial_aggregation_probe_*`, the usual case at millions of units):
    /// each input row becomes its own partial state, a list of its one entry (with its one
    /// sampled row), or an empty list where the FILTER is false or the hash NULL (what
    /// `update_batch` skips). `merge_batch` then keeps each unit's K smallest exactly as from
    /// grouped states.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        use datafusion::arrow::compute::filter;
        let l = self.layout;
        let hashes = values[2].as_primitive::<UInt64Type>();
        let n = hashes.len();
        let keep: BooleanArray = (0..n)
            .map(|i| {
                Some(!hashes.is_null(i) && opt_filter.is_none_or(|f| f.is_valid(i) && f.value(i)))
            })
            .collect();
        let mut arrays: Vec<ArrayRef> = vec![filter(hashes, &keep)?];
        let [g, t, s] = l.args();
        for c in canonical(&values[g]) {
            arrays.push(filter(c.as_ref(), &keep)?);
        }
        // Each kept row's totals as the exact sums of its one value.
        for (c, grid) in f64s(&values[t]).into_iter().zip(&self.grids) {
            let sums = (0..n)
                .filter(|&i| keep.value(i))
                .map(|i| c.is_valid(i).then(|| grid.quantise(c.value(i))).flatten());
            arrays.push(super::sums_array(sums)?);
        }
        if l.rows {
            let sampled = &values[s];
            let keys = UInt64Array::from(self.row_keys(sampled, n)?);
            let mut columns = vec![filter(&keys, &keep)?];
            for c in sampled {
                columns.push(filter(c.as_ref(), &keep)?);
            }
            let fields = sample_fields("key", &self.sampled.types);
            let ones = std::iter::repeat_n(1, keep.true_count());
            arrays.push(struct_list(fields, columns, ones)?);
        }
        let fields = kept_fields(&l, &self.groups.types, &self.sampled.types, true);
        let lengths = keep.values().iter().map(usize::from);
        Ok(vec![struct_list(fields, arrays, lengths)?])
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.units.capacity() * std::mem::size_of::<(u32, u32)>()
            + self.next_block.capacity() * std::mem::size_of::<u32>()
            + self.hashes.capacity() * std::mem::size_of::<u64>()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.totals.capacity() * std::mem::size_of::<i128>()
            + self.valid.capacity()
            + self.drawn.capacity() * std::mem::size_of::<Drawn>()
            + self.groups.size()
            + self.sampled.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::Int64Type;
    use std::collections::BTreeMap;

    /// Per (unit, group): the total, and the sampled values (sorted) with their `pos`.
    type Kept = BTreeMap<(usize, i64), (Option<f64>, Vec<i64>, Vec<u64>)>;

    /// One row: (unit, group, hash of the group, total value or NULL, sampled value).
    type Row = (usize, i64, u64, Option<f64>, i64);

    /// Two units over `groups` groups each, `n` rows: row r is unit r mod 2, group (r / 2) mod
    /// `groups` (so many rows per (unit, group)), an injective hash of (unit, group), the value r
    /// (NULL when r mod 5 = 0) and the sampled value r.
    fn rows(n: usize, groups: usize) -> Vec<Row> {
        (0..n)
            .map(|r| {
                let (u, g) = (r % 2, ((r / 2) % groups) as i64);
                let hash = (g as u64 * 7919 + u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (u, g, hash, (r % 5 != 0).then_some(r as f64), r as i64)
            })
            .collect()
    }

    fn layout() -> Layout {
        Layout {
            groups: 1,
            totals: 1,
            sampled: 1,
            rows: true,
        }
    }

    /// The grid of the tests' totals: values up to 2^20 (integers here: their sums are exact as
    /// `f64` too).
    fn grid() -> Grid {
        Grid::for_bounds(0.0, (1 << 20) as f64)
    }

    fn accumulator(k: usize, c: usize) -> TopGroupsAccumulator {
        TopGroupsAccumulator::new(
            (k, c),
            layout(),
            vec![grid()],
            [1, 2],
            super::super::RowIds::default(),
            vec![DataType::Int64],
            vec![DataType::Int64],
        )
        .unwrap()
    }

    fn batch(rows: &[Row], k: usize, c: usize) -> (Vec<ArrayRef>, Vec<usize>) {
        let n = rows.len();
        (
            vec![
                Arc::new(UInt64Array::from(vec![k as u64; n])) as ArrayRef,
                Arc::new(UInt64Array::from(vec![c as u64; n])),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.3))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.4))),
            ],
            rows.iter().map(|r| r.0).collect(),
        )
    }

    /// The evaluated lists, unit by unit (`first` the unit of the first list).
    fn kept(list: &ArrayRef, first: usize) -> Kept {
        let list = list.as_list::<i32>();
        let mut out = Kept::new();
        for i in 0..list.len() {
            let v = list.value(i);
            let s = v.as_struct();
            let groups = s.column(0).as_primitive::<Int64Type>();
            let totals = s.column(1).as_primitive::<Float64Type>();
            let samples = s.column(2).as_list::<i32>();
            for e in 0..s.len() {
                let sample = samples.value(e);
                let sample = sample.as_struct();
                let pos = sample
                    .column(0)
                    .as_primitive::<UInt64Type>()
                    .values()
                    .to_vec();
                let mut values = sample
                    .column(1)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec();
                values.sort_unstable();
                let total = totals.is_valid(e).then(|| totals.value(e));
                out.insert((first + i, groups.value(e)), (total, values, pos));
            }
        }
        out
    }

    /// Each unit keeps exactly its K groups of smallest hash, each with its whole total and a
    /// sample of min(C, its rows) of its own rows numbered 1, 2, …, whatever the order, the split
    /// into partial states (merged), the emission one unit at a time, or the conversion of every
    /// row to its own state; the store is compacted on the way.
    #[test]
    fn each_unit_keeps_its_k_smallest_groups_with_their_totals_and_samples() {
        for (k, c, n, groups, batch_rows) in [
            (3, 2, 400, 10, 64),
            (12, 3, 300, 20, 7),
            (4, 3, 120_000, 5_000, 4096),
        ] {
            let rows = rows(n, groups);
            // The expected: per unit, its K groups of smallest hash with their totals.
            let mut expected: BTreeMap<(usize, i64), (Option<f64>, Vec<i64>)> = BTreeMap::new();
            for u in 0..2 {
                let mut hashes: Vec<(u64, i64)> = rows
                    .iter()
                    .filter(|r| r.0 == u)
                    .map(|r| (r.2, r.1))
                    .collect();
                hashes.sort_unstable();
                hashes.dedup();
                for &(_, g) in hashes.iter().take(k) {
                    let mine: Vec<&Row> = rows.iter().filter(|r| r.0 == u && r.1 == g).collect();
                    let total = mine.iter().filter_map(|r| r.3).reduce(|a, b| a + b);
                    expected.insert((u, g), (total, mine.iter().map(|r| r.4).collect()));
                }
            }
            let check = |got: &Kept, how: &str| {
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    expected.keys().collect::<Vec<_>>(),
                    "{how}: k = {k}"
                );
                for (key, (total, sample, pos)) in got {
                    let (t, mine) = &expected[key];
                    assert_eq!(total, t, "{how}: the total of {key:?}");
                    assert_eq!(sample.len(), c.min(mine.len()), "{how}: {key:?}");
                    assert!(sample.iter().all(|v| mine.contains(v)), "{how}: {key:?}");
                    let one_to: Vec<u64> = (1..=sample.len() as u64).collect();
                    assert_eq!(pos, &one_to, "{how}: {key:?}");
                }
            };
            let feed = |a: &mut TopGroupsAccumulator, rows: &[Row]| {
                for chunk in rows.chunks(batch_rows) {
                    let (v, g) = batch(chunk, k, c);
                    a.update_batch(&v, &g, None, 2).unwrap();
                }
            };
            let mut whole = accumulator(k, c);
            feed(&mut whole, &rows);
            assert!(whole.groups.held <= 2 * whole.live + COMPACT_SLACK + batch_rows);
            assert!(whole.sampled.held <= 2 * whole.drawn_live + COMPACT_SLACK + batch_rows);
            check(&kept(&whole.evaluate(EmitTo::All).unwrap(), 0), "whole");
            assert_eq!((whole.live, whole.groups.held), (0, 0), "emptied");
            // Reversed and split in two partial states, merged.
            let mut rev = rows.clone();
            rev.reverse();
            let (mut a, mut b, mut merged) =
                (accumulator(k, c), accumulator(k, c), accumulator(k, c));
            feed(&mut a, &rev[..n / 3]);
            feed(&mut b, &rev[n / 3..]);
            for part in [&mut a, &mut b] {
                let state = part.state(EmitTo::All).unwrap();
                merged.merge_batch(&state, &[0, 1], 2).unwrap();
            }
            check(&kept(&merged.evaluate(EmitTo::All).unwrap(), 0), "merged");
            // Emitted one unit at a time (EmitTo::First): the same.
            let mut first = accumulator(k, c);
            feed(&mut first, &rev);
            let mut one = kept(&first.evaluate(EmitTo::First(1)).unwrap(), 0);
            one.extend(kept(&first.evaluate(EmitTo::First(1)).unwrap(), 1));
            check(&one, "first");
            // Every row converted to its own state, then merged: the same.
            let (v, g) = batch(&rev, k, c);
            let mut converted = accumulator(k, c);
            let state = converted.convert_to_state(&v, None).unwrap();
            converted.merge_batch(&state, &g, 2).unwrap();
            check(
                &kept(&converted.evaluate(EmitTo::All).unwrap(), 0),
                "converted",
            );
        }
    }

    /// The arenas grow by an eighth (at least 1,024 elements), not by doubling: what the pool
    /// counts (capacity) stays within 1/8 + 1,024 of what is held, also when the number of units
    /// grows with each batch as DataFusion feeds it; and with many units (the prefetching of
    /// `update_batch` and `merge_batch` at work), partial states merged keep what one
    /// accumulator keeps.
    #[test]
    fn an_arena_grows_by_an_eighth() {
        let within = |cap: usize, len: usize, step: usize| cap <= len + len / 8 + 1024 + step;
        let mut v: Vec<u64> = vec![];
        for i in 0..1_000_000 {
            room(&mut v, 3);
            v.extend([i, i, i]);
            assert!(within(v.capacity(), v.len(), 3), "at {}", v.len());
        }
        // 200,000 units met in order, 3 groups (one row each) per unit.
        let units = 200_000;
        let rows: Vec<Row> = (0..units * 3)
            .map(|r| {
                let hash = (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (r / 3, (r % 3) as i64, hash, Some(1.0), r as i64)
            })
            .collect();
        let mut a = accumulator(4, 3);
        for chunk in rows.chunks(8192) {
            let (v, g) = batch(chunk, 4, 3);
            let total = g.iter().max().unwrap() + 1;
            a.update_batch(&v, &g, None, total).unwrap();
            for (what, cap, len, step) in [
                ("units", a.units.capacity(), a.units.len(), 8192),
                ("next_block", a.next_block.capacity(), a.next_block.len(), 1),
                ("hashes", a.hashes.capacity(), a.hashes.len(), 4),
                ("slots", a.slots.capacity(), a.slots.len(), 4),
                ("totals", a.totals.capacity(), a.totals.len(), 4),
                ("valid", a.valid.capacity(), a.valid.len(), 4),
                ("drawn", a.drawn.capacity(), a.drawn.len(), 1),
            ] {
                assert!(within(cap, len, step), "{what}: {cap} for {len}");
            }
        }
        assert_eq!(a.live, units * 3);
        // The same rows in two partial states, merged: the same entries, totals and samples.
        let mut parts = [accumulator(4, 3), accumulator(4, 3)];
        for (j, chunk) in rows.chunks(8192).enumerate() {
            let (v, g) = batch(chunk, 4, 3);
            parts[j % 2].update_batch(&v, &g, None, units).unwrap();
        }
        let mut merged = accumulator(4, 3);
        let all: Vec<usize> = (0..units).collect();
        for part in &mut parts {
            let state = part.state(EmitTo::All).unwrap();
            merged.merge_batch(&state, &all, units).unwrap();
        }
        let (one, two) = (
            kept(&a.evaluate(EmitTo::All).unwrap(), 0),
            kept(&merged.evaluate(EmitTo::All).unwrap(), 0),
        );
        assert_eq!(one.len(), units * 3);
        assert_eq!(one, two);
    }

    /// A FILTER-false row is skipped by `update_batch` and converted to an empty state.
    #[test]
    fn a_filtered_row_is_skipped_and_converted_to_an_empty_state() {
        let rows = rows(200, 7);
        let (v, g) = batch(&rows, 2, 2);
        let off: BooleanArray = (0..rows.len()).map(|i| Some(i % 3 != 0)).collect();
        let converted = accumulator(2, 2);
        let state = converted.convert_to_state(&v, Some(&off)).unwrap();
        assert_eq!(state[0].as_list::<i32>().value(3).len(), 0);
        let mut merged = accumulator(2, 2);
        merged.merge_batch(&state, &g, 2).unwrap();
        let mut updated = accumulator(2, 2);
        updated.update_batch(&v, &g, Some(&off), 2).unwrap();
        let totals = |a: &mut TopGroupsAccumulator| -> BTreeMap<(usize, i64), Option<f64>> {
            kept(&a.evaluate(EmitTo::All).unwrap(), 0)
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        };
        assert_eq!(totals(&mut merged), totals(&mut updated));
    }

    /// The permutations of `0..n` (n ≤ 4 here).
    fn orders(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = vec![];
        for rest in orders(n - 1) {
            for at in 0..=rest.len() {
                let mut o = rest.clone();
                o.insert(at, n - 1);
                out.push(o);
            }
        }
        out
    }

    /// An accumulator over one Float64 group key, one total on `grid` and the key sampled.
    fn float_keyed(grid: Grid) -> TopGroupsAccumulator {
        TopGroupsAccumulator::new(
            (1, 1),
            layout(),
            vec![grid],
            [1, 2],
            super::super::RowIds::default(),
            vec![DataType::Float64],
            vec![DataType::Float64],
        )
        .unwrap()
    }

    /// One unit's rows (group key x, total value v), all of one entry (one hash: the group hash
    /// folds ±0, `GroupKey`), with x sampled too.
    fn float_rows(rows: &[(f64, f64)]) -> Vec<ArrayRef> {
        let n = rows.len();
        vec![
            Arc::new(UInt64Array::from(vec![1u64; n])) as ArrayRef,
            Arc::new(UInt64Array::from(vec![1u64; n])),
            Arc::new(UInt64Array::from(vec![42u64; n])),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.0))),
        ]
    }

    /// The one entry's key and total of an evaluated list, as bits.
    fn key_and_total(list: &ArrayRef) -> (u64, u64) {
        let list = list.as_list::<i32>();
        assert_eq!(list.len(), 1);
        let v = list.value(0);
        let s = v.as_struct();
        assert_eq!(s.len(), 1, "one entry");
        let key = s.column(0).as_primitive::<Float64Type>().value(0);
        let total = s.column(1).as_primitive::<Float64Type>().value(0);
        (key.to_bits(), total.to_bits())
    }

    /// Round 48, review "topgroups" F1: a unit's entry stores its group key canonical (0.0 for a
    /// −0.0 or 0.0 key, which the group hash folds into one entry): partial states of the rows
    /// (x = −0.0) and (x = 0.0) merged in either order, the rows updated in either order, or
    /// converted row by row, emit the key 0.0, bit for bit. (Before, the first row's or the
    /// first merged state's key was kept: −0.0 or 0.0 by arrival order.)
    #[test]
    fn an_entrys_float_key_is_canonical_whatever_arrives_first() {
        let grid = Grid::for_bounds(0.0, 10.0);
        let (neg, pos) = ((-0.0, 1.0), (0.0, 2.0));
        let mut seen = vec![];
        for (a, b) in [(neg, pos), (pos, neg)] {
            let mut merged = float_keyed(grid);
            for row in [a, b] {
                let mut part = float_keyed(grid);
                part.update_batch(&float_rows(&[row]), &[0], None, 1)
                    .unwrap();
                let state = part.state(EmitTo::All).unwrap();
                merged.merge_batch(&state, &[0], 1).unwrap();
            }
            seen.push(key_and_total(&merged.evaluate(EmitTo::All).unwrap()));
            let mut updated = float_keyed(grid);
            updated
                .update_batch(&float_rows(&[a, b]), &[0, 0], None, 1)
                .unwrap();
            seen.push(key_and_total(&updated.evaluate(EmitTo::All).unwrap()));
            let mut converted = float_keyed(grid);
            let state = converted
                .convert_to_state(&float_rows(&[a, b]), None)
                .unwrap();
            converted.merge_batch(&state, &[0, 0], 1).unwrap();
            seen.push(key_and_total(&converted.evaluate(EmitTo::All).unwrap()));
        }
        assert!(
            seen.iter()
                .all(|&(key, total)| key == 0.0f64.to_bits() && total == 3.0f64.to_bits()),
            "{seen:x?}"
        );
    }

    /// Round 48, review "topgroups" F2: an entry's total is one value whatever order its partial
    /// states merge in: three states of one (unit, group) holding values that cancel in floating
    /// point (1e300 and −1e300 beside 5, 0.1 beside −0.1, a tiny 1e−30), merged in all 6 orders,
    /// give one total, bit for bit, and it is the exact sum on the grid of [0, 10]: 5 (1e300 and
    /// −1e300 clamp to ±2^80 steps and cancel; −0.1 is the negation of 0.1 on the grid; 1e−30 is
    /// below half a step). A float sum in arrival order gave 0 or 5 by the order. Also when the
    /// same values come as rows in any order, or converted row by row.
    #[test]
    fn an_entrys_total_is_one_value_in_all_6_orders_of_3_partial_states() {
        let grid = Grid::for_bounds(0.0, 10.0);
        let parts: [&[(f64, f64)]; 3] = [
            &[(1.5, 1e300), (1.5, 0.1)],
            &[(1.5, -1e300), (1.5, 1e-30)],
            &[(1.5, 5.0), (1.5, -0.1)],
        ];
        let states: Vec<Vec<ArrayRef>> = parts
            .iter()
            .map(|rows| {
                let mut a = float_keyed(grid);
                let n = rows.len();
                a.update_batch(&float_rows(rows), &vec![0; n], None, 1)
                    .unwrap();
                a.state(EmitTo::All).unwrap()
            })
            .collect();
        let mut totals = std::collections::BTreeSet::new();
        for order in orders(3) {
            let mut merged = float_keyed(grid);
            for &i in &order {
                merged.merge_batch(&states[i], &[0], 1).unwrap();
            }
            totals.insert(key_and_total(&merged.evaluate(EmitTo::All).unwrap()).1);
            // The same values as rows, in this order of the parts, and each part's rows reversed.
            let rows: Vec<(f64, f64)> = order
                .iter()
                .flat_map(|&i| parts[i].iter().rev().copied())
                .collect();
            let mut updated = float_keyed(grid);
            updated
                .update_batch(&float_rows(&rows), &vec![0; rows.len()], None, 1)
                .unwrap();
            totals.insert(key_and_total(&updated.evaluate(EmitTo::All).unwrap()).1);
            let mut converted = float_keyed(grid);
            let state = converted
                .convert_to_state(&float_rows(&rows), None)
                .unwrap();
            converted
                .merge_batch(&state, &vec![0; rows.len()], 1)
                .unwrap();
            totals.insert(key_and_total(&converted.evaluate(EmitTo::All).unwrap()).1);
        }
        let totals: Vec<f64> = totals.into_iter().map(f64::from_bits).collect();
        assert_eq!(totals, vec![5.0]);
    }

    /// The key is never printed.
    #[test]
    fn the_sample_key_is_never_printed() {
        let key = [0x0123_4567_89ab_cdef_u64, 0x0fed_cba9_8765_4321];
        let f = top_groups_udaf(layout(), vec![grid()], key);
        let shown = format!("{f:?}");
        for k in key {
            assert!(!shown.contains(&k.to_string()), "{shown}");
            assert!(!shown.contains(&format!("{k:x}")), "{shown}");
        }
    }
}
