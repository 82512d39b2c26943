//! `dp_quantile(value, lower, upper, q, epsilon)`, `dp_median(value, lower, upper, epsilon)` and
//! `dp_quantiles(value, lower, upper, [q1, q2, …], epsilon)`: quantiles of the values clamped to
//! [lower, upper] by the exponential mechanism; pure ε-DP (`Event::PureDp { ε }`).
//!
//! # State: a fixed histogram (bounded memory, exact merges)
//! Each non-NULL, non-NaN value is clamped and put on the fixed-point grid
//! ([`crate::mechanisms::exact::FixedPoint`]: x ∈ [lo, hi]), then into one of B equal bins (the literal
//! `bins`, a power of two in [[`MIN_BINS`], [`MAX_BINS`]], default [`BINS`] = 1024),
//! b(x) = ⌊(x − lo)·B/(hi − lo)⌋ (at most B − 1; integer arithmetic, so a value's bin is a
//! function of the value alone). Per group the state is the B counts (`u64`): 8·B bytes per group
//! (8 KiB at 1024, 64 KiB at 8192) whatever the number of rows, merged by exact integer
//! addition, so the release is the same for every partitioning of the plan. Buffering the values
//! would give the exact interval form (Smith 2011) but memory growing with the group; the
//! histogram bounds memory at the cost of a resolution of (upper − lower)/B (the released value
//! is the chosen bin's midpoint). B is public (a literal): the score, its sensitivity and the
//! exponent below do not depend on it, so neither does the cost.
//!
//! # Score and sensitivity (derived here)
//! Let r_b = #{values in bins < b} (r_0 = 0, r_B = n). A point inside bin b can have any rank in
//! [r_b, r_{b+1}] as far as the histogram knows; the score of bin b is minus the distance from
//! the target rank q·n to that interval (the score of the best point of the bin, as in Smith's
//! interval form, "Privacy-preserving statistical estimation with optimal convergence rates",
//! STOC 2011, §3, and OpenDP's `make_quantile_score_candidates`):
//!   u_b = −dist(q·n, [r_b, r_{b+1}]) = −max(0, r_b − q·n, q·n − r_{b+1}).
//! Sensitivity: adding (removing) one value raises (lowers) each r_j by 0 or 1 and q·n by q, so
//! each of r_b − q·n and q·n − r_{b+1} moves by 1 − q or −q, at most max(q, 1 − q) in absolute
//! value, and so does their maximum with 0: Δu = max(q, 1 − q) under add/remove (1/2 for the
//! median; the same constant as OpenDP's unknown-size `make_quantile_score_candidates`, whose
//! score |(1 − α)·#{x < c} − α·#{x > c}| has sensitivity max(α, 1 − α)). Replacing one value
//! (n fixed) moves each r_j by at most 1 and q·n not at all: Δu = 1 under `replace` and
//! `replace_public_n` (a value turning NULL is a removal, max(q, 1 − q) ≤ 1). The exponential
//! mechanism P(b) ∝ exp(ε·u_b/(2Δu)) is ε-DP (McSherry and Talwar 2007, Theorem 6), and so is
//! permute-and-flip with the same exponent, which is what is sampled (below).
//!
//! Neighbour modes: one group's release is ε'-DP for a change of its score by Δu. Under
//! `replace_private_keys` a row can leave group a and join group b (each changed as by
//! add/remove, Δu = max(q, 1 − q)): two ε'-DP releases, so ε' = ε/2; a row that stays in its
//! group changes only that group's score, by ≤ 1 ≤ 2·max(q, 1 − q), which the exponent
//! ε/2·u_b/(2·max(q, 1 − q)) also covers (ε/2·1/max(q, 1 − q) ≤ ε). Under `units:K:C` a unit
//! changes up to C rows in each of at most K groups: Δu = C·max(q, 1 − q) in each, and K
//! releases compose, so each group uses ε/K, i.e. the exponent ε/(K·C)·u_b/(2·max(q, 1 − q))
//! ([`super::params::Neighbours::pure_factor`], split by [`groups_and_rows`] into the ε/K of a
//! group and the C of its Δu). `dp_quantiles` uses the largest max(q, 1 − q) of its quantiles
//! for all of them (one rate; valid for each).
//!
//! EXPLAIN PRIVACY states what runs ([`noise_of`], round 50): the ε' of each draw in each group
//! (ε/k, over K groups on a unit table, over 2 under `replace_private_keys`), Δu with its value
//! for this q and these neighbours (C·max(q, 1 − q) on a unit table, 1 under `replace`) and the
//! exponent ε'/(2Δu) read back from the sampler's rate, e.g. for `dp_median(x, 0, 100, 1)` on a
//! unit table with K = 4, C = 2: `ε = 0.25 in each of K = 4 groups, score sensitivity
//! Δ = C·max(q, 1 − q) = 1 (C = 2), exponent ε/(2Δ) = 0.125`.
//!
//! `dp_quantiles` with k quantiles draws k independent selections from the same
//! histogram, each at ε/k (basic composition of pure DP: total ε); the released values are then
//! sorted so that they are non-decreasing in q (post-processing). The joint exponential
//! mechanism of Gillenwater, Joseph, Kulesza ("Differentially Private Quantiles", ICML 2021) is
//! more accurate for many quantiles but needs a sampler over increasing tuples; not done here.
//!
//! # Exact sampling
//! q is rounded to Q/2^20 (a public literal: the rounding changes the target, not the privacy)
//! and u_b·2^20 = −D_b with the integer D_b = max(0, 2^20·r_b − Q·n, Q·n − 2^20·r_{b+1}), of
//! sensitivity Δ_D = 2^20·Δu: max(Q, 2^20 − Q) under add/remove (exactly, for the rounded Q),
//! 2^20 under replace. The exponent is then (ε'/(2Δ_D))·D_b, whose rate is rounded **down** to a
//! dyadic A/2^60
//! ([`rate_down`]: less ε used than charged, never more), and the bin is drawn by
//! permute-and-flip ([`sample_permute_and_flip`], McKenna and Sheldon 2020: the bins in a
//! uniformly random order, each accepted by an exact Bernoulli(exp(−A·(D_b − D_min)/2^60))
//! trial, no floating-point exponential; all B trials are run whichever is accepted first, so the
//! number of trials says nothing of the data (round 48), and B losses to compute: O(B) time per
//! release). It is ε-DP at the
//! exponential mechanism's calibration and its expected loss is never larger (ibid., Theorems 1
//! and 2); OpenDP's quantile (report-noisy-max with exponential noise) is the same mechanism.
//! It is markedly more accurate when a few bins are close to the target: docs/UTILITY.md,
//! "Against the peers".
//!
//! # Error
//! By McSherry and Talwar's utility bound for the exponential mechanism (permute-and-flip's
//! expected loss is never larger), with probability ≥ 1 − e^{−t} the chosen bin's
//! distance to rank q·n is at most 2Δu(ln B + t)/ε' (≈ (13.9 + 2t)·Δu/ε' ranks at B = 1024),
//! i.e. a rank error of order 1/(εn) relative to n, independent of n in absolute ranks; plus
//! half a bin, (upper − lower)/(2B), in value. With ε = 1 and n = 10,000 the median's rank error is below
//! 0.12% of n with probability 0.99 (0.23% for q near 0 or 1, or under `replace`).
//!
//! lower = upper: every clamped value equals the bound, and it is returned exactly.
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, ListArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::{AggregateOrderSensitivity, format_state_name};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Signature, Volatility,
};

use super::common::{DOC_SECTION_DP, DataArg, call_literals, coerce_args};
use super::declaration::Default as ParamDefault;
use super::declaration::{
    self, Aggregate, LOWER, NEIGHBOURS, PURE_EPSILON, UPPER, UnitRule, VALUE,
};
use super::params::{Neighbours, Params, plan_error};
use crate::mechanisms::exact::FixedPoint;
use crate::mechanisms::exponential::{EXP_BITS, rate_down, sample_permute_and_flip};
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError};

/// Bins of the histogram by default (module docs); a call's `bins` may ask for any power of two
/// in [[`MIN_BINS`], [`MAX_BINS`]].
pub const BINS: usize = 1024;
/// The fewest bins a call may ask for.
pub const MIN_BINS: usize = 2;
/// The most bins a call may ask for: 64 KiB of `u64` counts per group. The state is allocated
/// per group, so its size is bounded by a constant (8× the default's), never by a number the
/// analyst picks freely: a larger cap would let one literal multiply a GROUP BY's memory.
pub const MAX_BINS: usize = 8192;
/// q is rounded to a multiple of 2^−Q_BITS.
const Q_BITS: u32 = 20;
/// The most quantiles one `dp_quantiles` call may ask for.
pub const MAX_QUANTILES: usize = 100;

/// Which of the three functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantileKind {
    Quantile,
    Median,
    Quantiles,
}

impl QuantileKind {
    /// Its declaration ([`DP_QUANTILE`], [`DP_MEDIAN`], [`DP_QUANTILES`]).
    pub fn declaration(self) -> &'static Aggregate {
        match self {
            QuantileKind::Quantile => &DP_QUANTILE,
            QuantileKind::Median => &DP_MEDIAN,
            QuantileKind::Quantiles => &DP_QUANTILES,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            QuantileKind::Quantile => "dp_quantile",
            QuantileKind::Median => "dp_median",
            QuantileKind::Quantiles => "dp_quantiles",
        }
    }
}

/// The literal parameters of a quantile call.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileParams {
    pub kind: QuantileKind,
    pub lower: f64,
    pub upper: f64,
    /// The quantiles asked for, each in [0, 1] (0.5 for `dp_median`).
    pub qs: Vec<f64>,
    pub epsilon: f64,
    /// The histogram's bins: a power of two in [`MIN_BINS`, `MAX_BINS`] (public: it changes the
    /// resolution and the state's size, not the cost).
    pub bins: usize,
    pub neighbours: Neighbours,
}

/// The `bins` literal: a power of two in [`MIN_BINS`, `MAX_BINS`], [`BINS`] when absent.
fn bins(p: &Params) -> Result<usize, PrivacyError> {
    let expected = format!("a power of two in [{MIN_BINS}, {MAX_BINS}], e.g. 1024 or 8192");
    match p.number("bins")? {
        None => Ok(BINS),
        Some(b)
            if b.fract() == 0.0
                && (MIN_BINS as f64..=MAX_BINS as f64).contains(&b)
                && (b as usize).is_power_of_two() =>
        {
            Ok(b as usize)
        }
        Some(b) => Err(PrivacyError::invalid("bins", b, &expected)),
    }
}

fn check_q(name: &str, q: f64) -> Result<f64, PrivacyError> {
    if (0.0..=1.0).contains(&q) {
        Ok(q)
    } else {
        Err(PrivacyError::invalid(name, q, "a number in [0, 1]"))
    }
}

/// A list literal of numbers (`None` when absent).
fn number_list(p: &Params, name: &'static str) -> Result<Vec<f64>, PrivacyError> {
    let expected = "a non-empty list of numbers in [0, 1], e.g. [0.25, 0.5, 0.75]";
    let Some(v) = p.value(name) else {
        return Err(PrivacyError::invalid(name, "nothing (missing)", expected));
    };
    let bad = || PrivacyError::invalid(name, format!("{v} ({})", v.data_type()), expected);
    let values: ArrayRef = match v {
        ScalarValue::List(a) if a.len() == 1 && a.is_valid(0) => a.value(0),
        ScalarValue::LargeList(a) if a.len() == 1 && a.is_valid(0) => a.value(0),
        ScalarValue::FixedSizeList(a) if a.len() == 1 && a.is_valid(0) => a.value(0),
        _ => return Err(bad()),
    };
    if !values.data_type().is_numeric() || values.null_count() > 0 {
        return Err(bad());
    }
    let f = datafusion::arrow::compute::cast(&values, &DataType::Float64).map_err(|_| bad())?;
    let qs: Vec<f64> = f.as_primitive::<Float64Type>().values().to_vec();
    if qs.is_empty() || qs.len() > MAX_QUANTILES {
        return Err(PrivacyError::invalid(
            name,
            format!("a list of {} numbers", qs.len()),
            &format!("between 1 and {MAX_QUANTILES} quantiles"),
        ));
    }
    qs.into_iter().map(|q| check_q(name, q)).collect()
}

impl QuantileParams {
    pub fn from_literals(kind: QuantileKind, args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = Params::new(kind.declaration(), args)?;
        let (lower, upper) = p.bounds()?;
        let qs = match kind {
            QuantileKind::Median => vec![0.5],
            QuantileKind::Quantile => vec![check_q("q", p.required("q", "[0, 1]")?)?],
            QuantileKind::Quantiles => number_list(&p, "quantiles")?,
        };
        Ok(Self {
            kind,
            lower,
            upper,
            qs,
            epsilon: p.epsilon()?,
            bins: bins(&p)?,
            neighbours: p.neighbours()?,
        })
    }

    /// One pure ε-DP release (module docs). Builds the release too, so the accountant refuses
    /// exactly what the planner refuses.
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        QuantileRelease::new(self)?;
        Ok(vec![Event::PureDp {
            epsilon: self.epsilon,
        }])
    }
}

/// The calibrated release of a quantile call.
#[derive(Debug, Clone)]
pub(crate) struct QuantileRelease {
    pub fp: FixedPoint,
    pub kind: QuantileKind,
    pub lower: f64,
    pub upper: f64,
    /// Q = round(q·2^20) per quantile.
    pub q_fixed: Vec<u128>,
    /// ε' of each quantile's draw in each group, rounded down: ε/k, divided by the groups one
    /// change reaches ([`groups_and_rows`]: K, or 2 under `replace_private_keys`).
    pub epsilon_each: f64,
    /// The score's sensitivity Δ_D = 2^20·Δu of the rounded q's (module docs, "Exact
    /// sampling"): 2^20 under `replace`, max(Q, 2^20 − Q) otherwise (the largest over the
    /// call's quantiles), times C under `units:K:C`.
    pub delta_d: u128,
    /// The exponential mechanism's rate A (exponent A·D_b/2^60), per quantile: ε'/(2·Δ_D)
    /// rounded down.
    pub rate: u128,
    /// The histogram's bins (a power of two).
    pub bins: usize,
}

impl QuantileRelease {
    pub fn new(p: &QuantileParams) -> Result<Self, PrivacyError> {
        let k = p.qs.len() as f64;
        let q_fixed: Vec<u128> =
            p.qs.iter()
                .map(|&q| (q * (1u64 << Q_BITS) as f64).round() as u128)
                .collect();
        // ε' = ε/k/groups, each division lowered by one ulp (never more ε than charged); the
        // exponent per unit of D is ε'/(2·Δ_D) (module docs, "Score and sensitivity"), rounded
        // down: Δ_D = 2^20 under `replace`/`replace_public_n`, max(Q, 2^20 − Q) otherwise (the
        // largest over the call's quantiles: one rate for all of them), times the rows C one
        // unit has in a group. EXPLAIN PRIVACY prints these three (round 50: [`noise_of`]).
        let (groups, rows) = groups_and_rows(p.neighbours);
        let epsilon_each = ((p.epsilon / k).next_down() / groups as f64).next_down();
        let delta_d = rows as u128
            * match p.neighbours {
                Neighbours::Replace | Neighbours::ReplacePublicN => 1u128 << Q_BITS,
                _ => q_fixed
                    .iter()
                    .map(|&q| q.max((1u128 << Q_BITS) - q))
                    .max()
                    .unwrap_or(1u128 << Q_BITS),
            };
        // Δ_D ≤ 2^20·10^6 < 2^40 is exact in f64; the division rounds to nearest, hence
        // next_down.
        let rate = rate_down((epsilon_each / (2.0 * delta_d as f64)).next_down());
        Ok(Self {
            fp: FixedPoint::new(p.lower, p.upper),
            kind: p.kind,
            lower: p.lower,
            upper: p.upper,
            q_fixed,
            epsilon_each,
            delta_d,
            rate,
            bins: p.bins,
        })
    }

    /// The score's sensitivity Δ in ranks (Δ_D/2^20), as sampled.
    pub fn sensitivity(&self) -> f64 {
        self.delta_d as f64 / (1u64 << Q_BITS) as f64
    }

    /// The exponent per rank of score the sampler uses, ε'/(2Δ) rounded down: its rate A per
    /// unit of D = 2^20·u is A/2^60, so A·2^20/2^60 per rank.
    pub fn exponent(&self) -> f64 {
        self.rate as f64 / (1u64 << (EXP_BITS - Q_BITS)) as f64
    }

    /// The bin of a fixed-point integer x ∈ [lo, hi].
    #[inline]
    pub fn bin(&self, x: i64) -> usize {
        let w = (self.fp.hi - self.fp.lo) as i128;
        if w <= 0 {
            return 0;
        }
        (((x - self.fp.lo) as i128 * self.bins as i128 / w) as usize).min(self.bins - 1)
    }

    /// The losses D_b of the B = `bins` bins for the target Q (module docs).
    pub fn losses(counts: &[u64], q: u128, bins: usize) -> Vec<u128> {
        let n: u128 = counts.iter().map(|&c| c as u128).sum();
        let target = q * n; // ≤ 2^20·2^64
        let mut below: u128 = 0;
        let mut out = Vec::with_capacity(bins);
        for b in 0..bins {
            let c = counts.get(b).copied().unwrap_or(0) as u128;
            let lo = below << Q_BITS;
            let hi = (below + c) << Q_BITS;
            out.push(lo.saturating_sub(target).max(target.saturating_sub(hi)));
            below += c;
        }
        out
    }

    /// The midpoint of bin b, within [lower, upper].
    pub fn midpoint(&self, b: usize) -> f64 {
        let t = (b as f64 + 0.5) / self.bins as f64;
        (self.lower * (1.0 - t) + self.upper * t).clamp(self.lower, self.upper)
    }

    /// The released quantiles, in the order of the q's asked for, non-decreasing in q.
    pub fn release(&self, rng: &mut SecureRng, counts: &[u64]) -> Vec<f64> {
        if self.lower == self.upper {
            return vec![self.lower; self.q_fixed.len()];
        }
        let mut vals: Vec<f64> = self
            .q_fixed
            .iter()
            .map(|&q| {
                self.midpoint(sample_permute_and_flip(
                    rng,
                    &Self::losses(counts, q, self.bins),
                    self.rate,
                ))
            })
            .collect();
        // Sorted so that the releases are monotone in q (post-processing).
        vals.sort_by(f64::total_cmp);
        let mut order: Vec<usize> = (0..self.q_fixed.len()).collect();
        order.sort_by_key(|&i| self.q_fixed[i]);
        let mut out = vec![0.0; vals.len()];
        for (v, i) in vals.into_iter().zip(order) {
            out[i] = v;
        }
        out
    }
}

/// The UDAF of `dp_quantile`, `dp_median` and `dp_quantiles`.
#[derive(Debug)]
pub struct DpQuantileUdaf {
    kind: QuantileKind,
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl PartialEq for DpQuantileUdaf {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.insecure_seed == other.insecure_seed
    }
}
impl Eq for DpQuantileUdaf {}
impl Hash for DpQuantileUdaf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.insecure_seed.hash(state);
    }
}

impl DpQuantileUdaf {
    pub fn new(kind: QuantileKind) -> Self {
        let a = kind.declaration();
        let names = a
            .data
            .iter()
            .map(|d| d.name)
            .chain(a.params.iter().map(|p| p.name))
            .collect();
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Volatile)
                .with_parameter_names(names)
                .expect("user-defined signatures accept parameter names"),
            insecure_seed: None,
        }
    }

    /// INSECURE: noise from a fixed seed, for reproducible tests only.
    pub fn with_insecure_seed(kind: QuantileKind, seed: u64) -> Self {
        Self {
            insecure_seed: Some(seed),
            ..Self::new(kind)
        }
    }
}

/// `dp_quantile` as an [`AggregateUDF`].
pub fn dp_quantile_udaf() -> AggregateUDF {
    AggregateUDF::from(DpQuantileUdaf::new(QuantileKind::Quantile))
}
/// `dp_median` as an [`AggregateUDF`].
pub fn dp_median_udaf() -> AggregateUDF {
    AggregateUDF::from(DpQuantileUdaf::new(QuantileKind::Median))
}
/// `dp_quantiles` as an [`AggregateUDF`].
pub fn dp_quantiles_udaf() -> AggregateUDF {
    AggregateUDF::from(DpQuantileUdaf::new(QuantileKind::Quantiles))
}

const HOW: &str = "Differentially private quantile(s) of the values clamped to [lower, upper], by \
     the exponential mechanism's calibration over `bins` equal bins of [lower, upper] (a power \
     of two in [2, 8192], default 1024; public: it does not change the cost; the state is \
     8·bins bytes per group) (score: \
     minus the distance from the target rank q·n to the ranks the bin covers, sensitivity \
     max(q, 1 − q), 1 on replace tables, C·max(q, 1 − q) at ε/K per group on tables with a \
     privacy unit; McSherry and Talwar 2007, Smith 2011), drawn by \
     permute-and-flip (McKenna and Sheldon 2020), exactly (no floating-point exponential). Pure epsilon-DP (no \
     delta). The result is the chosen bin's midpoint: resolution (upper − lower)/bins. \
     dp_quantiles spends epsilon/k on each of its k quantiles and returns them sorted. NULL and \
     NaN values are skipped; ±infinity is clamped. On a table whose privacy filter is 'gdp' the \
     call is refused (choose 'zcdp' or 'rdp').";

fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))
}

fn documentation(kind: QuantileKind) -> Documentation {
    let a = kind.declaration();
    let mut b = Documentation::builder(DOC_SECTION_DP, HOW, a.usage());
    for d in a.data {
        b = b.with_argument(
            d.name,
            format!(
                "Numeric column (integers, floats, decimals; cast to Float64): {}.",
                d.doc
            ),
        );
    }
    for p in a.params {
        let text = match p.default {
            ParamDefault::Hidden => format!("Hidden: {}; users never write it.", p.doc),
            _ => format!("Literal: {}.", p.doc),
        };
        b = b.with_argument(p.name, text);
    }
    b = b.with_sql_example(match kind {
        QuantileKind::Quantile => "SELECT dp_quantile(salary, 0, 200000, 0.9, 1.0) FROM salaries;",
        QuantileKind::Median => {
            "SELECT job, dp_median(salary, 0, 200000, 1.0) FROM salaries GROUP BY job;"
        }
        QuantileKind::Quantiles => {
            "SELECT dp_quantiles(salary, 0, 200000, [0.25, 0.5, 0.75], 1.0) FROM salaries;"
        }
    });
    for r in ["dp_quantile", "dp_median", "dp_quantiles"] {
        if r != kind.name() {
            b = b.with_related_udf(r);
        }
    }
    b.build()
}

static DOCS: LazyLock<[Documentation; 3]> = LazyLock::new(|| {
    [
        documentation(QuantileKind::Quantile),
        documentation(QuantileKind::Median),
        documentation(QuantileKind::Quantiles),
    ]
});

impl AggregateUDFImpl for DpQuantileUdaf {
    fn name(&self) -> &str {
        self.kind.name()
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_args(self.kind.declaration(), DataArg::Numeric, arg_types)
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            QuantileKind::Quantiles => list_type(),
            _ => DataType::Float64,
        })
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let name = self.kind.name();
        let lits = call_literals(self.kind.declaration(), &args)?;
        let p = QuantileParams::from_literals(self.kind, &lits).map_err(|e| plan_error(name, e))?;
        let rel = QuantileRelease::new(&p).map_err(|e| plan_error(name, e))?;
        Ok(Box::new(QuantileAccumulator {
            rel,
            counts: vec![],
            insecure_seed: self.insecure_seed,
            rng: None,
        }))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "histogram"),
            DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
            true,
        ))])
    }
    /// Exact integer counts: the result does not depend on row order.
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOCS[self.kind as usize])
    }
}

/// One group's histogram (`bins` counts, allocated at the first value).
#[derive(Debug)]
pub(crate) struct QuantileAccumulator {
    pub rel: QuantileRelease,
    pub counts: Vec<u64>,
    pub insecure_seed: Option<u64>,
    rng: Option<SecureRng>,
}

impl QuantileAccumulator {
    #[cfg(test)]
    pub fn for_tests(rel: QuantileRelease, seed: u64) -> Self {
        Self {
            rel,
            counts: vec![],
            insecure_seed: Some(seed),
            rng: None,
        }
    }

    fn counts_mut(&mut self) -> &mut Vec<u64> {
        if self.counts.is_empty() {
            self.counts = vec![0; self.rel.bins];
        }
        &mut self.counts
    }
}

impl Accumulator for QuantileAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let arr = values[0]
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "dp quantile expected Float64 values, got {}",
                    values[0].data_type()
                ))
            })?
            .clone();
        if arr.len() == arr.null_count() {
            return Ok(());
        }
        let (fp, rel) = (self.rel.fp, self.rel.clone());
        let counts = self.counts_mut();
        for (i, v) in arr.values().iter().enumerate() {
            if arr.is_valid(i) && !v.is_nan() {
                counts[rel.bin(fp.quantise(*v))] += 1;
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists: &ListArray = states[0]
            .as_list_opt::<i32>()
            .ok_or_else(|| DataFusionError::Internal("dp quantile: bad histogram state".into()))?;
        for i in 0..lists.len() {
            if !lists.is_valid(i) {
                continue;
            }
            let v = lists.value(i);
            let c = v.as_primitive_opt::<Int64Type>().ok_or_else(|| {
                DataFusionError::Internal("dp quantile: bad histogram counts".into())
            })?;
            if c.is_empty() {
                continue;
            }
            if c.len() != self.rel.bins {
                return Err(DataFusionError::Internal(format!(
                    "dp quantile: histogram of {} bins, expected {}",
                    c.len(),
                    self.rel.bins
                )));
            }
            let counts = self.counts_mut();
            for (dst, &src) in counts.iter_mut().zip(c.values()) {
                *dst = dst.saturating_add(src.max(0) as u64);
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let arr = Int64Array::from_iter_values(self.counts.iter().map(|&c| c as i64));
        Ok(vec![ScalarValue::List(Arc::new(
            datafusion::common::utils::SingleRowListArrayBuilder::new(Arc::new(arr))
                .with_nullable(true)
                .build_list_array(),
        ))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let seed = self.insecure_seed;
        let rng = self.rng.get_or_insert_with(|| match seed {
            Some(s) => SecureRng::insecure_from_seed(s),
            None => SecureRng::from_os_entropy(),
        });
        let vals = self.rel.release(rng, &self.counts);
        Ok(match self.rel.kind {
            QuantileKind::Quantiles => {
                let arr = Float64Array::from(vals);
                ScalarValue::List(Arc::new(
                    datafusion::common::utils::SingleRowListArrayBuilder::new(Arc::new(arr))
                        .with_nullable(true)
                        .build_list_array(),
                ))
            }
            _ => ScalarValue::Float64(Some(vals[0])),
        })
    }

    fn size(&self) -> usize {
        size_of::<Self>()
            + self.counts.capacity() * size_of::<u64>()
            + self.rel.q_fixed.capacity() * size_of::<u128>()
    }
}

/// Refuses a call shape the UDAF cannot serve (used by the registry's cost).
pub fn cost_of(kind: QuantileKind, params: &[ScalarValue]) -> Result<Vec<Event>, PrivacyError> {
    QuantileParams::from_literals(kind, params)?.cost()
}

/// How one change splits over a call's releases (module docs, "Neighbour modes"): the groups
/// whose releases it reaches (each draw gets ε/groups) and the rows it changes in each (the
/// score's sensitivity is rows·max(q, 1 − q)). Their product is [`Neighbours::pure_factor`].
fn groups_and_rows(n: Neighbours) -> (u32, u32) {
    match n {
        Neighbours::Units { groups, rows } => (groups, rows),
        Neighbours::ReplacePrivateKeys => (2, 1),
        _ => (1, 1),
    }
}

/// What EXPLAIN PRIVACY shows as a quantile call's noise, from its literals alone: the
/// exponential mechanism's bins, the ε' of each draw, the score's sensitivity Δ and the
/// exponent ε'/(2Δ), all three read from the release the sampler uses (round 50: the text
/// said "sensitivity 1" whatever q and the neighbours, and showed ε/(K·C) as the ε on unit
/// tables), e.g. `…, ε = 1, score sensitivity Δ = max(q, 1 − q) = 0.5, exponent ε/(2Δ) = 1`.
pub fn noise_of(kind: QuantileKind, params: &[ScalarValue]) -> Option<String> {
    let p = QuantileParams::from_literals(kind, params).ok()?;
    let short = crate::mechanisms::noise::short;
    if p.lower == p.upper {
        return Some("none (lower = upper)".into());
    }
    let rel = QuantileRelease::new(&p).ok()?;
    let k = p.qs.len();
    let (groups, rows) = groups_and_rows(p.neighbours);
    let mut each = String::new();
    if k > 1 {
        each += &format!(" for each of {k} quantiles");
    }
    match p.neighbours {
        Neighbours::Units { .. } if groups > 1 => {
            each += &format!(" in each of K = {groups} groups")
        }
        Neighbours::ReplacePrivateKeys => each += " in each of the 2 groups a row may change",
        _ => {}
    }
    let largest = if k > 1 {
        "; the largest over the quantiles"
    } else {
        ""
    };
    let delta = short(rel.sensitivity());
    let delta = match p.neighbours {
        Neighbours::Replace | Neighbours::ReplacePublicN => format!("{delta} (replace)"),
        Neighbours::Units { .. } => format!("C·max(q, 1 − q) = {delta} (C = {rows}{largest})"),
        _ if k > 1 => format!("max(q, 1 − q) = {delta} (the largest over the quantiles)"),
        _ => format!("max(q, 1 − q) = {delta}"),
    };
    Some(format!(
        "exponential mechanism over {} bins of width {}, ε = {}{each}, score sensitivity \
         Δ = {delta}, exponent ε/(2Δ) = {}",
        p.bins,
        short((p.upper - p.lower) / p.bins as f64),
        short(rel.epsilon_each),
        short(rel.exponent())
    ))
}

/// The declaration of `dp_quantile` (listed in [`super::registry::AGGREGATES`]).
pub const DP_QUANTILE: Aggregate = Aggregate {
    name: "dp_quantile",
    summary: "noisy q-quantile of the values clamped to [lower, upper] (exponential \
              mechanism, pure ε-DP)",
    data: &[VALUE],
    params: &[
        LOWER,
        UPPER,
        declaration::number(
            "q",
            declaration::Default::Required,
            "the quantile, in [0, 1]",
        ),
        PURE_EPSILON,
        declaration::BINS,
        NEIGHBOURS,
    ],
    requirements: &[],
    units: UnitRule::Rows,
    replaces: &[
        "percentile_cont",
        "approx_percentile_cont",
        "approx_percentile_cont_with_weight",
    ],
    internal: false,
    udaf: dp_quantile_udaf,
    seeded: |seed| {
        super::dp_quantile::DpQuantileUdaf::with_insecure_seed(QuantileKind::Quantile, seed).into()
    },
    cost: |_, p| cost_of(QuantileKind::Quantile, p),
    noise: |p| noise_of(QuantileKind::Quantile, p),
};

/// The declaration of `dp_median` (listed in [`super::registry::AGGREGATES`]).
pub const DP_MEDIAN: Aggregate = Aggregate {
    name: "dp_median",
    summary: "noisy median of the values clamped to [lower, upper] (exponential mechanism, \
              pure ε-DP)",
    data: &[VALUE],
    params: &[LOWER, UPPER, PURE_EPSILON, declaration::BINS, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Rows,
    replaces: &["median", "approx_median"],
    internal: false,
    udaf: dp_median_udaf,
    seeded: |seed| {
        super::dp_quantile::DpQuantileUdaf::with_insecure_seed(QuantileKind::Median, seed).into()
    },
    cost: |_, p| cost_of(QuantileKind::Median, p),
    noise: |p| noise_of(QuantileKind::Median, p),
};

/// The declaration of `dp_quantiles` (listed in [`super::registry::AGGREGATES`]).
pub const DP_QUANTILES: Aggregate = Aggregate {
    name: "dp_quantiles",
    summary: "noisy quantiles (a list) of the values clamped to [lower, upper], ε/k each, \
              sorted",
    data: &[VALUE],
    params: &[
        LOWER,
        UPPER,
        declaration::Param {
            name: "quantiles",
            kind: declaration::Kind::NumberList,
            default: declaration::Default::Required,
            doc: "a list of 1 to 100 quantiles in [0, 1], e.g. [0.25, 0.5, 0.75]",
        },
        PURE_EPSILON,
        declaration::BINS,
        NEIGHBOURS,
    ],
    requirements: &[],
    units: UnitRule::Rows,
    replaces: &[],
    internal: false,
    udaf: dp_quantiles_udaf,
    seeded: |seed| {
        super::dp_quantile::DpQuantileUdaf::with_insecure_seed(QuantileKind::Quantiles, seed).into()
    },
    cost: |_, p| cost_of(QuantileKind::Quantiles, p),
    noise: |p| noise_of(QuantileKind::Quantiles, p),
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanisms::noise::short;

    fn f(v: f64) -> ScalarValue {
        ScalarValue::Float64(Some(v))
    }

    /// A call's literals on [0, 100] with 2 bins under `neighbours`.
    fn literals(
        kind: QuantileKind,
        qs: &[f64],
        epsilon: f64,
        neighbours: &str,
    ) -> Vec<ScalarValue> {
        let mut l = vec![f(0.0), f(100.0)];
        match kind {
            QuantileKind::Median => {}
            QuantileKind::Quantile => l.push(f(qs[0])),
            QuantileKind::Quantiles => l.push(ScalarValue::List(ScalarValue::new_list_nullable(
                &qs.iter().map(|&q| f(q)).collect::<Vec<_>>(),
                &DataType::Float64,
            ))),
        }
        l.extend([
            f(epsilon),
            f(2.0),
            ScalarValue::Utf8(Some(neighbours.into())),
        ]);
        l
    }

    /// The text between `label` and the next ',' or ' ' of EXPLAIN PRIVACY's noise.
    fn field<'a>(text: &'a str, label: &str) -> &'a str {
        let at = text
            .find(label)
            .unwrap_or_else(|| panic!("{label} in {text}"))
            + label.len();
        let rest = &text[at..];
        &rest[..rest.find([',', ' ']).unwrap_or(rest.len())]
    }

    /// (round 50) EXPLAIN PRIVACY's quantile noise states what runs: for q = 0.5 and 0.9 (and
    /// both in one `dp_quantiles`), under add/remove, `replace`, `replace_public_n`,
    /// `replace_private_keys` and on unit tables, the printed ε, Δ and exponent are the closed
    /// forms ε/k/groups, rows·max(q, 1 − q) (1 under replace) and their ε/(2Δ) (the rounded
    /// q's: 0.9 is 943718/2^20), and the exponent printed is the sampler's (its rate read back,
    /// within 1e-10 of the closed form). It was "sensitivity 1" whatever q, with ε/(K·C) as ε.
    #[test]
    fn explained_exponent_is_the_samplers() {
        let q09 = 943_718.0 / 1_048_576.0;
        // (neighbours, groups the ε is split over, rows C, replace)
        let modes = [
            ("add_remove", 1.0, 1.0, false),
            ("replace", 1.0, 1.0, true),
            ("replace_public_n", 1.0, 1.0, true),
            ("replace_private_keys", 2.0, 1.0, false),
            ("units:4:2", 4.0, 2.0, false),
            ("units:1:3", 1.0, 3.0, false),
        ];
        let calls: [(QuantileKind, &[f64], f64); 4] = [
            (QuantileKind::Median, &[0.5], 0.5),
            (QuantileKind::Quantile, &[0.5], 0.5),
            (QuantileKind::Quantile, &[0.9], q09),
            (QuantileKind::Quantiles, &[0.5, 0.9], q09),
        ];
        for (nb, groups, rows, replace) in modes {
            for (kind, qs, max_q) in calls {
                let epsilon = 3.0;
                let lits = literals(kind, qs, epsilon, nb);
                let text = noise_of(kind, &lits).unwrap();
                let rel =
                    QuantileRelease::new(&QuantileParams::from_literals(kind, &lits).unwrap())
                        .unwrap();
                let eps = epsilon / qs.len() as f64 / groups;
                let delta = if replace { 1.0 } else { rows * max_q };
                let exponent = eps / (2.0 * delta);
                let case = format!("{nb} {kind:?} {qs:?}: {text}");
                // The sampler's rate is the closed form, rounded down.
                let used = rel.exponent();
                assert!(
                    used <= exponent && used > exponent * (1.0 - 1e-10),
                    "{case}: {used}"
                );
                assert_eq!(field(&text, "ε = "), short(eps), "{case}");
                assert_eq!(field(&text, "ε/(2Δ) = "), short(used), "{case}");
                assert_eq!(field(&text, "ε/(2Δ) = "), short(exponent), "{case}");
                let shown_delta = if replace {
                    field(&text, "Δ = ")
                } else {
                    field(&text, "1 − q) = ")
                };
                assert_eq!(shown_delta, short(delta), "{case}");
                assert!(!text.contains("sensitivity 1)"), "{case}");
            }
        }
        // The texts, whole: row level, replace, a unit table, several quantiles.
        let noise = |kind, qs: &[f64], nb| noise_of(kind, &literals(kind, qs, 1.0, nb)).unwrap();
        assert_eq!(
            noise(QuantileKind::Median, &[], "add_remove"),
            "exponential mechanism over 2 bins of width 50, ε = 1, score sensitivity \
             Δ = max(q, 1 − q) = 0.5, exponent ε/(2Δ) = 1"
        );
        assert_eq!(
            noise(QuantileKind::Quantile, &[0.9], "replace"),
            "exponential mechanism over 2 bins of width 50, ε = 1, score sensitivity \
             Δ = 1 (replace), exponent ε/(2Δ) = 0.5"
        );
        assert_eq!(
            noise(QuantileKind::Median, &[], "units:4:2"),
            "exponential mechanism over 2 bins of width 50, ε = 0.25 in each of K = 4 groups, \
             score sensitivity Δ = C·max(q, 1 − q) = 1 (C = 2), exponent ε/(2Δ) = 0.125"
        );
        assert_eq!(
            noise(QuantileKind::Quantiles, &[0.5, 0.9], "add_remove"),
            "exponential mechanism over 2 bins of width 50, ε = 0.5 for each of 2 quantiles, \
             score sensitivity Δ = max(q, 1 − q) = 0.9 (the largest over the quantiles), \
             exponent ε/(2Δ) = 0.2778"
        );
        assert_eq!(
            noise(QuantileKind::Quantiles, &[0.5, 0.9], "units:2:3"),
            "exponential mechanism over 2 bins of width 50, ε = 0.25 for each of 2 quantiles in \
             each of K = 2 groups, score sensitivity Δ = C·max(q, 1 − q) = 2.7 (C = 3; the \
             largest over the quantiles), exponent ε/(2Δ) = 0.0463"
        );
        // The split of a mode's L1 factor multiplies back to it.
        for nb in modes.map(|m| Neighbours::parse(m.0).unwrap()) {
            let (g, r) = groups_and_rows(nb);
            assert_eq!(g as f64 * r as f64, nb.pure_factor(), "{nb}");
        }
    }

    /// Seeded, statistical: the sampler draws at the printed exponent. On the review's
    /// neighbouring dataset (2 bins of [0, 100]: 6 values in bin 0, 5 in bin 1; the median's
    /// target 5.5 lies in bin 0, bin 1 is 0.5 ranks away; q = 0.9's target 9.9 lies in bin 1,
    /// bin 0 is 3.9 away), permute-and-flip picks the worse bin with probability
    /// ½·exp(−x·loss) for the exponent x read from EXPLAIN PRIVACY's text. 20,000 draws each:
    /// within 5 binomial sd; the former "sensitivity 1" reading (x = ε/2 at the median, row
    /// level) lies outside.
    #[test]
    fn sampler_draws_at_the_explained_exponent() {
        let counts = [6u64, 5];
        let n = 20_000;
        let cases: [(QuantileKind, &[f64], f64, &str, u64); 6] = [
            (QuantileKind::Median, &[], 1.0, "add_remove", 1),
            (QuantileKind::Median, &[], 1.0, "replace", 2),
            (QuantileKind::Quantile, &[0.9], 1.0, "add_remove", 3),
            (QuantileKind::Quantile, &[0.9], 1.0, "replace", 4),
            (QuantileKind::Median, &[], 8.0, "units:4:2", 5),
            (QuantileKind::Quantile, &[0.9], 8.0, "units:4:2", 6),
        ];
        for (kind, qs, epsilon, nb, seed) in cases {
            let lits = literals(kind, qs, epsilon, nb);
            let text = noise_of(kind, &lits).unwrap();
            let x: f64 = field(&text, "ε/(2Δ) = ").parse().unwrap();
            let rel =
                QuantileRelease::new(&QuantileParams::from_literals(kind, &lits).unwrap()).unwrap();
            let losses = QuantileRelease::losses(&counts, rel.q_fixed[0], 2);
            let worse = if losses[0] > losses[1] { 0 } else { 1 };
            let gap = losses[0].abs_diff(losses[1]) as f64 / (1u64 << Q_BITS) as f64;
            let want = 0.5 * (-x * gap).exp();
            let mut rng = SecureRng::insecure_from_seed(seed);
            let hits = (0..n)
                .filter(|_| rel.release(&mut rng, &counts)[0] == rel.midpoint(worse))
                .count();
            let got = hits as f64 / n as f64;
            let tol = 5.0 * (want * (1.0 - want) / n as f64).sqrt();
            assert!(
                (got - want).abs() <= tol,
                "{nb} {kind:?}: {got} vs {want} ± {tol} ({text})"
            );
            if nb == "add_remove" && kind == QuantileKind::Median {
                let old = 0.5 * (-epsilon / 2.0 * gap).exp();
                assert!((got - old).abs() > tol, "cannot tell {want} from {old}");
            }
        }
    }
}
