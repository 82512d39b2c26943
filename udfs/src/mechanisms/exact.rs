//! Exact, sensitivity-safe arithmetic for the DP aggregates.
//!
//! # Why
//! A sum of clamped `f64` values can move by more than the nominal bound when one row changes:
//! floating-point addition rounds, and the rounding depends on the order of the additions (so on
//! the partitioning of the plan). Casacuberta, Shoemate, Vadhan and Wagaman ("Widespread
//! underestimation of sensitivity in differentially private libraries and how to fix it",
//! ACM CCS 2022) turn this into attacks on several libraries. PRIVACY.md, "Numbers on a
//! computer", requires a proven sensitivity, the same whatever the partitioning.
//!
//! # Fixed point ([`FixedPoint`])
//! For bounds [L, U] let B = max(|L|, |U|) and q = 2^e the power of two with B/q ≤ 2^40 < 2B/q
//! (e is clamped to [−1023, 984] so that 1/q is a finite `f64`, which only coarsens the grid for
//! bounds below 2^−983; when B = 0, q = 1). Each value is
//! mapped to the integer x = round(clamp(v, L, U)/q) (to nearest, ties to even; see
//! [`FixedPoint::quantise`]). Every step of that map (clamp, the exact scaling by the power of
//! two 1/q, round-to-nearest, reading the integer off the bits) is monotone, so
//! x ∈ [lo, hi] with lo = round(L/q), hi = round(U/q), |lo|, |hi| ≤ 2^40.
//!
//! Partial sums are `i128` sums of these integers. Addition of integers is exact and associative,
//! so the total is the same for any order and any partitioning of the rows: a plain function of
//! the multiset of per-row integers. Hence, exactly (in grid units q):
//! - adding or removing a row changes the sum by at most max(|lo|, |hi|);
//! - replacing a row's value (NULL-ness included) changes it by at most max(hi − lo, |lo|, |hi|).
//!
//! The sensitivities used for calibration are these integers, raised where needed to
//! ceil(B/q) (resp. ceil((U − L)/q)), times q: never below the nominal bound, and above it by
//! less than q ≤ B·2^−40.
//! Saturation: a sum of k rows has |sum| ≤ k·2^40, and DataFusion counts rows in `usize`
//! (k < 2^64), so |sum| < 2^104 and the saturating `i128` additions never saturate; they are
//! there only so that no input can make the arithmetic panic or wrap.
//!
//! # Release ([`release_exact`])
//! [`GaussianMechanism::release`] returns round_g(x) + g·Y for a power-of-two grid g and a
//! discrete Gaussian Y. Converting the exact integer sum to `f64` before that would round again
//! (when the sum exceeds 2^53 grid units) and reintroduce the problem above. So the release is
//! computed in integers: the noise g·Y is drawn as `release(0.0)` (round_g(0) = 0, so this is
//! exactly g·Y), the sum u·2^k (k the unit exponent) is rounded to the nearest multiple of g in
//! integer arithmetic, and the integer R = round(u·2^k/g) + Y is formed exactly. The result is
//! R·g converted to `f64` once, a function of R alone (post-processing). Rounding each of two
//! neighbouring sums to the nearest multiple of g moves their difference by at most g, which is
//! the slack the mechanism already adds to the sensitivity ("rounding to the grid adds at most g");
//! so this is exactly the mechanism's release of u·2^k, without any floating-point step before
//! the noise.
use datafusion::common::{DataFusionError, Result};

use crate::mechanisms::{GaussianMechanism, LaplaceMechanism};
use crate::noise::SecureRng;

/// Bits of fixed-point resolution below the bound: B/q ≤ 2^40.
pub const FIXED_POINT_BITS: i32 = 40;

/// Which build of the vectorised fixed-point sum runs ([`FixedPoint::sum_quantised`]). Every
/// build computes the same integers; forcing one exists for the exactness tests and the
/// benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumPath {
    /// The widest build the CPU supports (what the aggregates use).
    Auto,
    /// Baseline x86-64 (SSE2), the dispatch fallback.
    Portable,
    /// The AVX2 build (falls back to `Portable` on a CPU without AVX2).
    Avx2,
    /// The AVX-512 (F, DQ, VL, BW) build (falls back to `Avx2`, then `Portable`).
    Avx512,
}

impl SumPath {
    /// The build that actually runs for this request on this CPU.
    pub fn resolve(self) -> SumPath {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = || {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            };
            let avx2 = || std::arch::is_x86_feature_detected!("avx2");
            match self {
                SumPath::Portable => SumPath::Portable,
                SumPath::Auto | SumPath::Avx512 if avx512() => SumPath::Avx512,
                SumPath::Auto | SumPath::Avx512 | SumPath::Avx2 if avx2() => SumPath::Avx2,
                _ => SumPath::Portable,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            SumPath::Portable
        }
    }
}

/// The number of NaN values, branch-free (the loop vectorises; no early exit): whether a batch
/// can take the aggregates' fast paths, which need every value to count.
pub fn count_nan(values: &[f64]) -> usize {
    values
        .iter()
        .fold(0usize, |k, v| k + usize::from(v.is_nan()))
}

/// 2^e as an `f64`, exact for e ∈ [−1074, 1023]; 0 below, +∞ above.
pub fn pow2(e: i32) -> f64 {
    if e > 1023 {
        f64::INFINITY
    } else if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else if e >= -1074 {
        f64::from_bits(1u64 << (e + 1074))
    } else {
        0.0
    }
}

/// ⌊log₂ x⌋ for finite x > 0, normal or subnormal, exactly: from the exponent bits, so that
/// `pow2(floor_log2(x))` is the largest power of two ≤ x (round 52, review "extremes", F1: the
/// AGD grids used a `pow2_floor` built on `2f64.powi(e)`, which is 1/2^|e| = 0 for e < −1023, so
/// every x < 2⁻¹⁰²² gave 0 and the grid loop of `optim::agd::AgdPlan::new` never ended).
pub fn floor_log2(x: f64) -> i32 {
    debug_assert!(x.is_finite() && x > 0.0, "{x}");
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal: x = bits·2⁻¹⁰⁷⁴, its highest set bit gives the power.
        63 - bits.leading_zeros() as i32 - 1074
    } else {
        exp - 1023
    }
}

/// e when x = 2^e exactly (x a positive power of two, normal or subnormal), else `None`.
pub fn exact_log2(x: f64) -> Option<i32> {
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let mant = bits & ((1u64 << 52) - 1);
    if exp == 0 {
        // subnormal: mant · 2^−1074
        mant.is_power_of_two()
            .then(|| mant.trailing_zeros() as i32 - 1074)
    } else {
        (mant == 0).then_some(exp - 1023)
    }
}

/// The smallest k with b ≤ 2^k, for finite b > 0.
fn ceil_log2(b: f64) -> i32 {
    let bits = b.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let mant = bits & ((1u64 << 52) - 1);
    if exp == 0 {
        // subnormal: b = mant · 2^−1074, mant ≥ 1
        let bits_needed = 64 - (mant - 1).leading_zeros() as i32; // ceil(log2 mant)
        bits_needed - 1074
    } else if mant == 0 {
        exp - 1023
    } else {
        exp - 1023 + 1
    }
}

/// Clamping bounds mapped to a power-of-two fixed-point grid (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedPoint {
    pub lower: f64,
    pub upper: f64,
    /// q = 2^exp, the grid step.
    pub exp: i32,
    /// 1/q.
    inv_q: f64,
    /// round(lower/q).
    pub lo: i64,
    /// round(upper/q).
    pub hi: i64,
}

impl FixedPoint {
    /// For finite lower ≤ upper (checked by the parameter structs).
    pub fn new(lower: f64, upper: f64) -> Self {
        debug_assert!(lower.is_finite() && upper.is_finite() && lower <= upper);
        let b = lower.abs().max(upper.abs());
        let exp = if b > 0.0 {
            (ceil_log2(b) - FIXED_POINT_BITS).clamp(-1023, 984)
        } else {
            0
        };
        let mut fp = FixedPoint {
            lower,
            upper,
            exp,
            inv_q: pow2(-exp),
            lo: 0,
            hi: 0,
        };
        fp.lo = fp.quantise(lower);
        fp.hi = fp.quantise(upper);
        fp
    }

    /// The grid step q.
    pub fn step(&self) -> f64 {
        pow2(self.exp)
    }

    /// round(clamp(v)/q) for a non-NaN v (±∞ are clamped), to nearest with ties to even. Always
    /// in [lo, hi].
    ///
    /// Branch-free and vectorisable (no libm `round`, no float→int conversion): y = clamp(v)/q is
    /// exact (q a power of two) with |y| ≤ 2^40, so y + M with M = 1.5·2^52 lies in [2^52, 2^53),
    /// where the spacing of `f64` is 1: the addition rounds y to the nearest integer (ties to
    /// even, IEEE 754 default rounding), and inside that binade the bit pattern is linear in the
    /// value, so bits(y + M) − bits(M) is that integer. Each step is monotone, as the module docs
    /// require.
    #[inline]
    pub fn quantise(&self, v: f64) -> i64 {
        /// 1.5·2^52.
        const M: f64 = 6_755_399_441_055_744.0;
        let y = v.max(self.lower).min(self.upper) * self.inv_q;
        (y + M).to_bits() as i64 - M.to_bits() as i64
    }

    /// (Σ quantise(vᵢ), number of NaN values) over `values`, in one pass. The sum is exact and
    /// meaningful only when there is no NaN (a NaN quantises to `lo` here; callers that find NaN
    /// must skip those rows and sum again). Summed in `i64` over chunks of 2^20 values
    /// (|chunk sum| ≤ 2^60: no overflow), then in `i128`, so the loop vectorises without a
    /// per-value branch; the result equals the `i128` sum of the quantised values in any order.
    ///
    /// Runtime dispatch (issues 19, 32): the loop is compiled for baseline x86-64 and inside
    /// `#[target_feature]` functions for AVX2 and AVX-512 (chosen by
    /// `is_x86_feature_detected!`, the widest the CPU has; no `-C target-cpu`). Integer sums are
    /// exact, so every build gives the same result ([`SumPath`] forces one, for the tests).
    pub fn sum_quantised(&self, values: &[f64]) -> (i128, usize) {
        self.sum_quantised_on(values, SumPath::Auto)
    }

    /// [`Self::sum_quantised`] on the build `path` names (tests, benchmarks).
    pub fn sum_quantised_on(&self, values: &[f64], path: SumPath) -> (i128, usize) {
        #[cfg(target_arch = "x86_64")]
        match path.resolve() {
            // SAFETY: `resolve` returns a SIMD path only when the CPU supports it.
            SumPath::Avx512 => return unsafe { self.sum_quantised_avx512(values) },
            // SAFETY: as above.
            SumPath::Avx2 => return unsafe { self.sum_quantised_avx2(values) },
            _ => {}
        }
        let _ = path;
        self.sum_quantised_generic(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw")]
    unsafe fn sum_quantised_avx512(&self, values: &[f64]) -> (i128, usize) {
        self.sum_quantised_generic(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_quantised_avx2(&self, values: &[f64]) -> (i128, usize) {
        self.sum_quantised_generic(values)
    }

    /// [`Self::sum_quantised`] on the baseline build (the dispatch fallback; tests). One `i64`
    /// accumulator per chunk: LLVM vectorises and interleaves it by itself (explicit lane arrays
    /// measured slower, up to 20× in the AVX-512 build, where they were not vectorised).
    #[inline(always)]
    pub fn sum_quantised_generic(&self, values: &[f64]) -> (i128, usize) {
        const CHUNK: usize = 1 << 20;
        let (mut total, mut nans) = (0i128, 0usize);
        for c in values.chunks(CHUNK) {
            let (mut s, mut k) = (0i64, 0i64);
            for &v in c {
                s = s.wrapping_add(self.quantise_select(v));
                k += i64::from(v.is_nan());
            }
            total = total.saturating_add(s as i128);
            nans += k as usize;
        }
        (total, nans)
    }

    /// [`Self::quantise`] with the clamp written as comparisons (`v > lower ? v : lower`, then
    /// `y < upper ? y : upper`), which compile to single `maxpd`/`minpd` instructions where
    /// `f64::max`/`min` need extra NaN fix-ups on baseline x86-64. The same integer for every
    /// non-NaN v (the clamped value is the same number; ±0 both give 0); a NaN gives `lo`, as
    /// in [`Self::quantise`].
    #[inline(always)]
    pub fn quantise_select(&self, v: f64) -> i64 {
        /// 1.5·2^52.
        const M: f64 = 6_755_399_441_055_744.0;
        let a = if v > self.lower { v } else { self.lower };
        let b = if a < self.upper { a } else { self.upper };
        let y = b * self.inv_q;
        (y + M).to_bits() as i64 - M.to_bits() as i64
    }

    /// The add/remove sensitivity of the sum, in grid units: max(|lo|, |hi|) (exact: every
    /// quantised value lies in [lo, hi]), raised to ceil(max(|lower|, |upper|)/q) so that times q
    /// it is never below the nominal bound.
    pub fn max_abs(&self) -> i64 {
        let nominal = (self.lower.abs().max(self.upper.abs()) * self.inv_q).ceil() as i64;
        self.lo.abs().max(self.hi.abs()).max(nominal)
    }

    /// The largest change of one value, in grid units: hi − lo (exact), raised to
    /// ceil((upper − lower)/q).
    pub fn width(&self) -> i64 {
        let nominal = (self.upper * self.inv_q - self.lower * self.inv_q).ceil() as i64;
        (self.hi - self.lo).max(nominal)
    }
}

/// Bits of resolution of the squared grid: every per-row square is at most 2^40 (+1) units.
pub const SQUARE_BITS: u32 = 40;

/// The fixed-point grid of squared centred values (`dp_variance`, `dp_stddev`).
///
/// A value's fixed-point integer x ∈ [lo, hi] ([`FixedPoint`]) is centred in half-units:
/// y = 2x − (lo + hi), so |y| ≤ hi − lo ≤ w = [`FixedPoint::width`] ≤ 2^41 (exact `i64`). Its
/// square y² ≤ 2^82 is exact in `i128`, and is stored as s = round(y²/2^shift) (to nearest, ties
/// up: (y² + 2^(shift−1)) >> shift) with shift = max(0, 2·⌈log2 w⌉ − 40), so that
/// 0 ≤ s ≤ [`SquareGrid::max`] ≤ 2^40 + 1. Every step is monotone in |y|, so s ∈ [0, max]
/// exactly, and one row changes the sum of the s by at most `max`, whatever the other rows.
///
/// Overflow bound: a sum of k rows is at most k·(2^40 + 1) < 2^105 for k < 2^64 (DataFusion
/// counts rows in `usize`), far below i128::MAX ≈ 2^127; the accumulator's saturating additions
/// therefore never saturate. One unit of s is 2^shift·(q/2)² in the value's squared units; the
/// relative resolution of a square is 2^−40 of the largest one, (upper − lower)².
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SquareGrid {
    /// lo + hi: the centre in half-units is (lo + hi)/2·q, i.e. y = 2x − mid.
    pub mid: i64,
    /// s = round(y²/2^shift).
    pub shift: u32,
    /// The largest s: round(w²/2^shift).
    pub max: i64,
}

impl SquareGrid {
    pub fn new(fp: &FixedPoint) -> Self {
        let w = fp.width().max(0) as u128;
        let bits = 128 - w.saturating_sub(1).leading_zeros(); // ⌈log2 w⌉ for w ≥ 1 (0 for w ≤ 1)
        let shift = (2 * bits).saturating_sub(SQUARE_BITS);
        let mut g = SquareGrid {
            mid: fp.lo + fp.hi,
            shift,
            max: 0,
        };
        g.max = g.round(w * w);
        g
    }

    fn round(&self, y2: u128) -> i64 {
        let s = if self.shift == 0 {
            y2
        } else {
            (y2 + (1u128 << (self.shift - 1))) >> self.shift
        };
        s as i64
    }

    /// s for the fixed-point integer x (x in [lo, hi], as [`FixedPoint::quantise`] returns).
    #[inline]
    pub fn square(&self, x: i64) -> i64 {
        let y = 2 * x as i128 - self.mid as i128;
        self.round(y.unsigned_abs() * y.unsigned_abs())
    }
}

/// round(u · 2^s) to the nearest integer (ties away from zero), saturating.
fn scale_round(u: i128, s: i32) -> i128 {
    if s >= 0 {
        if u == 0 {
            0
        } else if s >= 127 {
            if u > 0 { i128::MAX } else { i128::MIN }
        } else {
            u.saturating_mul(1i128 << s)
        }
    } else {
        let k = -s;
        if k >= 127 {
            return 0;
        }
        let mag = u.unsigned_abs();
        let r = ((mag + (1u128 << (k - 1))) >> k) as i128; // ≤ 2^127 >> 1: fits
        if u < 0 { -r } else { r }
    }
}

/// The Gaussian mechanism's release of the exact value u·2^unit_exp (module docs): one draw of
/// noise, no floating-point rounding before the noise is added.
pub fn release_exact(
    mech: &GaussianMechanism,
    rng: &mut SecureRng,
    units: i128,
    unit_exp: i32,
) -> Result<f64> {
    // Fails (never panics) when the scale is outside the sampler's range; the release
    // constructors refuse such a scale at planning, so this is a second line of defence.
    let noise = mech
        .release(rng, 0.0)
        .map_err(|e| DataFusionError::Internal(e.to_string()))?;
    add_grid_noise(noise, mech.granularity, units, unit_exp)
}

/// The Laplace mechanism's release of the exact value u·2^unit_exp, as [`release_exact`]: the
/// discrete Laplace noise g·Y is drawn alone, the exact integer is rounded to the grid g in
/// integers, and the sum R·g is converted to `f64` once (rounding to the grid moves two
/// neighbours' difference by at most g: the slack in the mechanism's scale).
pub fn release_exact_laplace(
    mech: &LaplaceMechanism,
    rng: &mut SecureRng,
    units: i128,
    unit_exp: i32,
) -> Result<f64> {
    add_grid_noise(mech.noise(rng), mech.granularity, units, unit_exp)
}

/// round_g(u·2^unit_exp) + noise, for noise = g·Y on the power-of-two grid g, in integers.
fn add_grid_noise(noise: f64, granularity: f64, units: i128, unit_exp: i32) -> Result<f64> {
    let Some(g_exp) = exact_log2(granularity) else {
        return Err(DataFusionError::Internal(format!(
            "noise grid {granularity} is not a power of two"
        )));
    };
    let y = noise / granularity; // exact: noise = g·Y
    if !(y.is_finite() && y.fract() == 0.0) {
        return Err(DataFusionError::Internal(format!(
            "noise {noise} is not on its grid {granularity}"
        )));
    }
    let total = scale_round(units, unit_exp - g_exp).saturating_add(y as i128);
    let out = total as f64 * pow2(g_exp);
    Ok(out.clamp(f64::MIN, f64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round 52, review "extremes", F1: the largest power of two ≤ x, pow2(floor_log2(x)), is
    /// exact for every power of two and its neighbours, subnormals included (the `powi` one gave
    /// 0 below 2⁻¹⁰²²).
    #[test]
    fn floor_log2_is_exact_on_subnormals() {
        let pow2_floor = |x: f64| pow2(floor_log2(x));
        for e in -1074..=1023 {
            let x = pow2(e);
            assert!(x > 0.0 && x.is_finite(), "{e}");
            assert_eq!(floor_log2(x), e);
            assert_eq!(pow2_floor(x), x);
            if e < 1023 {
                assert_eq!(floor_log2(pow2(e + 1).next_down()), e);
            }
            if e > -1074 {
                assert_eq!(floor_log2(x.next_down()), e - 1);
                assert_eq!(pow2_floor(x * 1.5), x, "{e}");
            }
        }
        assert_eq!(pow2_floor(f64::from_bits(1)), f64::from_bits(1));
        assert_eq!(pow2_floor(5e-324), 5e-324);
        assert_eq!(floor_log2(f64::MAX), 1023);
        assert_eq!(floor_log2(f64::MIN_POSITIVE), -1022);
        assert_eq!(floor_log2(f64::MIN_POSITIVE.next_down()), -1023);
        for x in [1e-310, 3e-320, 1e-308, 2.5e-315] {
            let p = pow2_floor(x);
            assert!(p > 0.0 && p <= x && x < 2.0 * p, "{x}: {p}");
        }
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(pow2(0), 1.0);
        assert_eq!(pow2(-1), 0.5);
        assert_eq!(pow2(1023), 2f64.powi(1023));
        assert_eq!(pow2(-1074), f64::from_bits(1));
        assert_eq!(pow2(-1022), f64::MIN_POSITIVE);
        for e in [-1074, -1060, -1022, -3, 0, 7, 1023] {
            assert_eq!(exact_log2(pow2(e)), Some(e));
        }
        assert_eq!(exact_log2(3.0), None);
        assert_eq!(exact_log2(0.0), None);
        assert_eq!(ceil_log2(1.0), 0);
        assert_eq!(ceil_log2(1.5), 1);
        assert_eq!(ceil_log2(1e6), 20);
        assert_eq!(ceil_log2(f64::from_bits(1)), -1074);
        assert_eq!(ceil_log2(f64::from_bits(3)), -1072);
        assert_eq!(ceil_log2(f64::MAX), 1024);
    }

    #[test]
    fn fixed_point_grid() {
        let fp = FixedPoint::new(0.0, 1e6);
        assert_eq!(fp.exp, 20 - 40);
        assert_eq!(fp.lo, 0);
        assert_eq!(fp.hi, 1_000_000 << 20);
        assert_eq!(fp.quantise(f64::INFINITY), fp.hi);
        assert_eq!(fp.quantise(f64::NEG_INFINITY), fp.lo);
        let fp = FixedPoint::new(-3.0, 2.0);
        assert_eq!(fp.exp, 2 - 40);
        assert_eq!(fp.lo, -3 << 38);
        assert_eq!(fp.max_abs(), 3 << 38);
        assert_eq!(fp.width(), 5 << 38);
        assert!(fp.max_abs() as f64 * fp.step() >= 3.0);
        // degenerate and extreme bounds: no panic, units within 2^40
        let fp = FixedPoint::new(0.0, 0.0);
        assert_eq!((fp.lo, fp.hi, fp.exp), (0, 0, 0));
        for (l, u) in [
            (-f64::MAX, f64::MAX),
            (-1e-300, 1e-300),
            (5.0, 5.0),
            (-1e-290, 0.0),
            (0.1, 0.3),
            (-1.0 / 3.0, 2.0 / 3.0),
        ] {
            let fp = FixedPoint::new(l, u);
            assert!(fp.max_abs() <= 1 << 40, "{l} {u}");
            assert!(
                fp.max_abs() as f64 * fp.step() >= l.abs().max(u.abs()),
                "{l} {u}"
            );
            assert!(fp.max_abs() >= fp.lo.abs().max(fp.hi.abs()));
            assert!(fp.width() >= fp.hi - fp.lo && fp.width() <= 1 << 41);
            assert!(fp.width() as f64 * fp.step() >= u - l, "{l} {u}");
            assert!(fp.lo <= fp.hi);
        }
        // Below 2^-983 the grid cannot get finer (1/q must stay finite): values round towards 0,
        // which only coarsens the sum; the sensitivity is still computed on the integers.
        let fp = FixedPoint::new(0.0, 1e-310);
        assert_eq!((fp.exp, fp.lo, fp.hi), (-1023, 0, 0));
    }

    #[test]
    fn sums_do_not_depend_on_order() {
        // Values whose f64 sum depends on the order; the fixed-point sum does not.
        let fp = FixedPoint::new(-1e16, 1e16);
        let vals = [1e16, 1.0, -1e16, 1.0, 0.1, 3.3, -7.7, 1e15];
        let fwd: i128 = vals.iter().map(|&v| fp.quantise(v) as i128).sum();
        let rev: i128 = vals.iter().rev().map(|&v| fp.quantise(v) as i128).sum();
        assert_eq!(fwd, rev);
        let f_fwd: f64 = vals.iter().sum();
        let f_rev: f64 = vals.iter().rev().sum();
        assert_ne!(
            f_fwd, f_rev,
            "the example should show float non-associativity"
        );
    }

    /// The branch-free rounding agrees with round-half-even on grid points, halves and random
    /// values of every magnitude up to the bound, and the chunked sum with an `i128` sum.
    #[test]
    fn quantise_rounds_to_nearest_even_and_sums_exactly() {
        let fp = FixedPoint::new(-3.0, 1e6);
        let q = fp.step();
        for k in [-5i64, -2, -1, 0, 1, 2, 3, 1 << 30, fp.hi - 1] {
            assert_eq!(fp.quantise(k as f64 * q), k);
            let half = (k as f64 + 0.5) * q;
            if half <= 1e6 {
                assert_eq!(fp.quantise(half), (k as f64 + 0.5).round_ties_even() as i64);
            }
        }
        let mut rng = crate::noise::SecureRng::insecure_from_seed(3);
        let vals: Vec<f64> = (0..300_000)
            .map(|i| {
                let m = [1e-9, 1e-3, 1.0, 1e3, 1e7][i % 5];
                (rng.uniform_f64() - 0.2) * m
            })
            .collect();
        let mut want = 0i128;
        for &v in &vals {
            let y = v.clamp(fp.lower, fp.upper) / q;
            let r = y.round_ties_even() as i64;
            assert_eq!(fp.quantise(v), r, "{v}");
            assert!((fp.lo..=fp.hi).contains(&r));
            want += r as i128;
        }
        assert_eq!(fp.sum_quantised(&vals), (want, 0));
        assert_eq!(fp.sum_quantised_generic(&vals), (want, 0));
        let mut with_nan = vals.clone();
        with_nan[7] = f64::NAN;
        assert_eq!(fp.sum_quantised(&with_nan).1, 1);
        assert_eq!(fp.sum_quantised_generic(&with_nan).1, 1);
    }

    /// The clamp by comparisons (the vectorised sums' form) gives `quantise`'s integer for
    /// every value, the bounds, ±0, ±∞ and NaN (→ lo) included; the dispatched (AVX2) sum and
    /// the baseline build agree.
    #[test]
    fn quantise_select_equals_quantise() {
        let mut rng = crate::noise::SecureRng::insecure_from_seed(4);
        for (lower, upper) in [
            (-3.0, 1e6),
            (0.0, 1000.0),
            (-1e-300, 0.0),
            (-0.0, 0.0),
            (5.0, 5.0),
        ] {
            let fp = FixedPoint::new(lower, upper);
            let mut vals = vec![
                0.0,
                -0.0,
                lower,
                upper,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::MIN_POSITIVE,
                -f64::MIN_POSITIVE,
            ];
            for i in 0..50_000 {
                let m = [1e-300, 1e-9, 1.0, 1e3, 1e7, 1e300][i % 6];
                vals.push((rng.uniform_f64() - 0.3) * m);
            }
            for &v in &vals {
                assert_eq!(
                    fp.quantise_select(v),
                    fp.quantise(v),
                    "{v} in [{lower}, {upper}]"
                );
            }
            assert_eq!(fp.quantise_select(f64::NAN), fp.lo);
            assert_eq!(fp.sum_quantised(&vals), fp.sum_quantised_generic(&vals));
        }
    }

    #[test]
    fn rounding_shifts() {
        assert_eq!(scale_round(5, 0), 5);
        assert_eq!(scale_round(5, 2), 20);
        assert_eq!(scale_round(5, -1), 3);
        assert_eq!(scale_round(-5, -1), -3);
        assert_eq!(scale_round(4, -1), 2);
        assert_eq!(scale_round(6, -2), 2);
        assert_eq!(scale_round(1, -200), 0);
        assert_eq!(scale_round(i128::MAX, -1), 1i128 << 126);
        assert_eq!(scale_round(3, 200), i128::MAX);
        assert_eq!(scale_round(-3, 126), i128::MIN);
        assert_eq!(scale_round(1, 126), 1i128 << 126);
    }
}
