//! The blocked row pass of `dp_linreg_gd`'s `'gaussian'` kernel (issue 19), with runtime CPU
//! dispatch; and the blocked pieces of `dp_logreg_agd`'s row passes (section "dp_logreg_agd"
//! below: [`dot_block`], [`ln_1p_unit`], [`ScoreGrid`]).
//!
//! [`super::linreg::GaussianGd`] sums, per iteration, the clipped per-example gradients of every
//! row as exact integers ([`super::clip::Clipper::contribution`]; module docs of
//! [`super::linreg`], "Exact sums"). This module computes **the same integers** faster:
//!
//! - **Residuals in blocks of [`BLOCK`] rows.** rᵢ = θ·x̃ᵢ − yᵢ is evaluated with exactly the
//!   floating-point operations of the row-at-a-time code (start at θ_d (intercept) or 0, then
//!   `s += θⱼ·xᵢⱼ` for j = 0, 1, …, d − 1, then `s − yᵢ`; no reassociation, no fused
//!   multiply-add: Rust never contracts `a * b + c`), but the [`BLOCK`] rows' chains are
//!   independent, so they pipeline instead of waiting on one add latency per feature.
//! - **Vectorisable conversion and check.** The rounding `round_i64(f·xⱼ/q)` (ties away from
//!   zero) is computed as t = trunc(y), t ± 1 from the remainder, then the float integer is
//!   read as an `i64` through the magic constant 1.5·2⁵² (exact for |t| < 2⁵¹); the integer
//!   check Σⱼ vⱼ² ≤ c² becomes max |vⱼ| ≤ c and Σ vⱼ² ≤ c² without an early exit (equivalent:
//!   the scalar check stops at the first prefix that exceeds, and prefixes of non-negative
//!   terms only grow), and the row is added under a mask. A row is taken by this fast path
//!   only when |f/q|·‖x̃ᵢ‖ ≤ 2⁵⁰ (so every |f·xⱼ/q| < 2⁵¹, since the norm the fit computes is
//!   never below maxⱼ|x̃ᵢⱼ|: [`super::clip::l2_norm`], round 52; the sum of squares it replaced
//!   underflowed to 0 for features ≤ 2⁻⁵³⁸) and f/q is finite; any other row (huge residuals,
//!   non-finite norms) goes through `Clipper::contribution` itself. The integer check itself
//!   does not rely on that range: on every build it rejects any integer the rounding can give
//!   outside it (`Pass::add_rows_lanes_avx2`).
//! - **Runtime dispatch.** The same source is compiled three times: for baseline x86-64, inside
//!   a `#[target_feature(enable = "avx2")]` function, and inside one with AVX-512 (F, DQ, VL,
//!   BW), chosen with `is_x86_feature_detected!` at each pass (the widest the CPU has). No
//!   `-C target-cpu` is needed. No fused multiply-add is ever formed (Rust does not contract
//!   `a * b + c`, whatever the target features): the residual rounds after each multiply, as
//!   the scalar code does.
//!
//! - **Rows in lanes (AVX-512 and AVX2, issue 32).** When the CPU has AVX-512 or AVX2, the fit
//!   keeps a second copy of the features transposed in blocks of [`BLOCK`] rows
//!   ([`transpose_blocks`]: within a block, feature j of the 8 rows is one 64-byte vector), and
//!   each block runs with one row per lane (`Pass::add_rows_lanes_avx512`; with AVX2,
//!   `Pass::add_rows_lanes_avx2`, two halves of 4 lanes): the residuals, the clipping factor,
//!   the rounding, the integer check and the sums are vertical vector operations, with no
//!   per-row horizontal reduction and no per-row branch. Per lane they are the operations of
//!   the row path, in the same order; the rounding is the truncation (`cvttpd2qq`, or the magic
//!   constant with AVX2, both exact for |y| < 2⁵¹) plus or minus one from the remainder, which
//!   is `round_i64`'s definition. A lane whose integer check fails is added and then taken back
//!   out (its contribution recomputed); a block with any row outside the fast path's range runs
//!   row by row. On the 2-core test VM (`examples/kernel_speed.rs`, one thread, n = 1M,
//!   d = 16) the data pass went from 22.0 to 9.5–11.0 ns per row with AVX-512 and from 24.7
//!   to 11.6–12.3 with AVX2; the two-thread fit from 14.2 to 6.0–7.9 ns per row and
//!   iteration, near the machine's read bandwidth (24.5 GB/s: 5.9 ns for 144 bytes per row).
//!   The copy costs 8·d bytes per row during the fit
//!   ([`super::linreg::GaussianGd::working_bytes`], counted in the accumulator's size).
//!
//! **Exactness.** Every per-row integer vector equals the one `Clipper::contribution` computes
//! for the same row (the residual is bit-identical; the rounding and the check are equivalent
//! for the rows the fast path takes, as argued above), so the sums equal the row-at-a-time sums
//! bit for bit, on every path, for every partitioning: the released values and the sensitivity
//! argument are unchanged. The tests `lanes_equal_the_reference_when_the_integer_check_fails`
//! (here: unaligned ranges, failing lanes, blocks that leave the fast path) and
//! `tests/it/kernels.rs` (`blocked_pass_equals_reference_on_random_data`, …) compare the paths
//! on random data, including the forced portable fallback.
//!
//! The fast path needs c = ⌊clip/q⌋ < 2²⁹ and p ≤ 32 (so that Σ vⱼ² < 2⁶³ in `u64` whenever
//! every |vⱼ| ≤ c); the grid makes c ≈ 2²⁰–2²¹ in practice. Otherwise the caller keeps the
//! row-at-a-time pass ([`eligible`]).
use super::clip::Clipper;

/// Rows per block: independent residual chains.
pub const BLOCK: usize = 8;
/// Largest p (features + intercept) the fast path handles.
pub const MAX_P: usize = 32;
/// The fast path's bound on c = ⌊clip/q⌋.
const MAX_C: u64 = 1 << 29;
/// Rows taken by the fast path have |f/q|·‖x̃‖ ≤ this.
const FAST_LIMIT: f64 = (1u64 << 50) as f64;
/// 1.5·2⁵²: t + MAGIC for an integer |t| < 2⁵¹ has the bits of MAGIC plus t.
const MAGIC: f64 = 6_755_399_441_055_744.0;
/// Rows per `i64` partial sum: |v| < 2²⁹, so 2³⁰ rows stay below 2⁵⁹.
pub const FLUSH_ROWS: usize = 1 << 30;

/// Which implementation a row pass uses (the result is the same integers on every one; the
/// choice exists for the exactness tests and the benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPath {
    /// The blocked pass, in its AVX-512 or AVX2 build when the CPU has them (what the fits use).
    Auto,
    /// The blocked pass compiled for baseline x86-64 (the dispatch fallback), forced.
    Portable,
    /// The blocked pass in its AVX2 build, forced (the baseline build on a CPU without AVX2):
    /// for the exactness tests on a CPU where `Auto` runs the AVX-512 build.
    Avx2,
    /// The row-at-a-time pass (`Clipper::contribution` per row): the reference.
    Reference,
}

impl RowPath {
    /// Whether `Auto` runs the AVX-512 build (AVX-512 F, DQ, VL and BW) on this CPU.
    pub fn avx512_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Whether the AVX2 variant is the one `Auto` runs on this CPU.
    pub fn avx2_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// Whether the fit's passes run with rows in lanes (AVX-512 or AVX2, and the blocked pass
/// applies: [`eligible`]), reading the transposed features ([`transpose_blocks`]).
pub fn lanes(clipper: &Clipper, p: usize) -> bool {
    eligible(clipper, p) && (RowPath::avx512_available() || RowPath::avx2_available())
}

/// Whether the blocked pass applies to this clipper and p (module docs).
pub fn eligible(clipper: &Clipper, p: usize) -> bool {
    clipper.c_int < MAX_C && p <= MAX_P
}

/// The row-major n×d features `x` of the first ⌊n/[`BLOCK`]⌋·[`BLOCK`] rows, in blocks of
/// [`BLOCK`] rows, feature-major within a block: element (i, j) at
/// (i/BLOCK)·BLOCK·d + j·BLOCK + i mod BLOCK ([`Pass::xt`]). Built once per fit.
pub fn transpose_blocks(x: &[f64], d: usize) -> Vec<f64> {
    if d == 0 {
        return Vec::new();
    }
    let whole = x.len() / d / BLOCK * BLOCK;
    let mut out = vec![0.0; whole * d];
    for (src, dst) in x[..whole * d]
        .chunks_exact(BLOCK * d)
        .zip(out.chunks_exact_mut(BLOCK * d))
    {
        for (b, row) in src.chunks_exact(d).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                dst[j * BLOCK + b] = v;
            }
        }
    }
    out
}

/// What one row pass reads.
pub struct Pass<'a> {
    pub d: usize,
    pub intercept: bool,
    /// Row-major n×d features (clamped).
    pub x: &'a [f64],
    /// Labels (clamped).
    pub y: &'a [f64],
    /// The same features in blocks of [`BLOCK`] rows, feature-major within a block
    /// ([`transpose_blocks`]): the rows' lanes of the blocked pass. Empty: the blocked pass
    /// reads `x` row by row instead.
    pub xt: &'a [f64],
    /// ‖x̃ᵢ‖, computed once per fit.
    pub norms: &'a [f64],
    pub theta: &'a [f64],
    pub clipper: &'a Clipper,
}

impl Pass<'_> {
    /// Adds Σᵢ vᵢ over `rows` to `part` (p = d + intercept entries), vᵢ the clipped integer
    /// contribution of row i. Requires [`eligible`] and at most [`FLUSH_ROWS`] rows (then no
    /// `i64` overflow). Returns the number of rows that contributed.
    pub fn add_rows(&self, rows: std::ops::Range<usize>, part: &mut [i64], path: RowPath) -> u64 {
        let p = self.d + usize::from(self.intercept);
        assert!(eligible(self.clipper, p) && part.len() == p && rows.len() <= FLUSH_ROWS);
        assert!(rows.end <= self.y.len() && self.x.len() == self.y.len() * self.d);
        assert!(self.norms.len() == self.y.len() && self.theta.len() == p);
        assert!(self.xt.is_empty() || self.xt.len() == self.y.len() / BLOCK * BLOCK * self.d);
        match path {
            RowPath::Auto => self.add_rows_auto(rows, part),
            RowPath::Portable => self.add_rows_generic::<false>(rows, part),
            RowPath::Avx2 => {
                #[cfg(target_arch = "x86_64")]
                if RowPath::avx2_available() {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { self.add_rows_avx2_any(rows, part) };
                }
                self.add_rows_generic::<false>(rows, part)
            }
            RowPath::Reference => self.add_rows_reference(rows, part),
        }
    }

    /// The AVX-512 build, else the AVX2 build, when the CPU has them; else the baseline build.
    fn add_rows_auto(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            if RowPath::avx512_available() {
                // SAFETY: the CPU supports these AVX-512 subsets (checked just above).
                return unsafe {
                    if self.xt.is_empty() {
                        self.add_rows_avx512(rows, part)
                    } else {
                        self.add_rows_lanes_avx512(rows, part)
                    }
                };
            }
            if RowPath::avx2_available() {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { self.add_rows_avx2_any(rows, part) };
            }
        }
        self.add_rows_generic::<false>(rows, part)
    }

    /// The AVX2 pass with rows in lanes when the transposed features are there, else row by
    /// row. Requires AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_rows_avx2_any(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            if self.xt.is_empty() {
                self.add_rows_avx2(rows, part)
            } else {
                self.add_rows_lanes_avx2(rows, part)
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw")]
    unsafe fn add_rows_avx512(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        self.add_rows_generic::<true>(rows, part)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_rows_avx2(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        self.add_rows_generic::<true>(rows, part)
    }

    /// The row-at-a-time reference (what the kernel did before this module).
    fn add_rows_reference(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        let (d, p) = (self.d, part.len());
        let mut v = [0i64; MAX_P];
        let mut used = 0;
        for i in rows {
            let x = &self.x[i * d..(i + 1) * d];
            let mut s = if self.intercept { self.theta[d] } else { 0.0 };
            for (t, xj) in self.theta[..d].iter().zip(x) {
                s += t * xj;
            }
            let r = s - self.y[i];
            if self
                .clipper
                .contribution(x, self.intercept, r, self.norms[i], &mut v[..p])
            {
                for (a, &b) in part.iter_mut().zip(&v[..p]) {
                    *a += b;
                }
                used += 1;
            }
        }
        used
    }

    /// The blocked pass; `HW`: use the hardware `trunc` (SSE4.1 `roundpd`, present with AVX2)
    /// and the float rounding that vectorises; else `round_i64` (same integers).
    #[inline(always)]
    fn add_rows_generic<const HW: bool>(
        &self,
        rows: std::ops::Range<usize>,
        part: &mut [i64],
    ) -> u64 {
        let d = self.d;
        let theta = self.theta;
        let base = if self.intercept { theta[d] } else { 0.0 };
        let mut used = 0;
        let mut i = rows.start;
        while i + BLOCK <= rows.end {
            let xb = &self.x[i * d..(i + BLOCK) * d];
            let mut r = [base; BLOCK];
            for (j, &t) in theta[..d].iter().enumerate() {
                for (b, rb) in r.iter_mut().enumerate() {
                    // SAFETY: b < BLOCK and j < d, so b·d + j < BLOCK·d = xb.len().
                    *rb += t * unsafe { *xb.get_unchecked(b * d + j) };
                }
            }
            for (b, &rb) in r.iter().enumerate() {
                used += self.add_row::<HW>(i + b, rb - self.y[i + b], part);
            }
            i += BLOCK;
        }
        for i in i..rows.end {
            let x = &self.x[i * d..(i + 1) * d];
            let mut s = base;
            for (t, xj) in theta[..d].iter().zip(x) {
                s += t * xj;
            }
            used += self.add_row::<HW>(i, s - self.y[i], part);
        }
        used
    }

    /// The rows `first..last` of `rows` that make whole blocks of the transposed features (the
    /// rows before and after them run row by row), checked against `xt`'s length.
    fn whole_blocks(&self, rows: &std::ops::Range<usize>, p: usize) -> (usize, usize) {
        let first = rows.start.next_multiple_of(BLOCK).min(rows.end);
        let last = (rows.end / BLOCK * BLOCK).max(first);
        assert!(
            (first == last || last * self.d <= self.xt.len())
                && p <= MAX_P
                && self.theta.len() == p
        );
        (first, last)
    }

    /// The AVX-512 pass with one row per lane, over the transposed features `xt`: each whole
    /// block of [`BLOCK`] rows (i a multiple of [`BLOCK`]) is one vector per feature. Each lane
    /// does the floating-point operations of [`Self::add_row`] for its row, in the same order
    /// (the residual from θ_d or 0, then `+ θⱼ·xᵢⱼ` for j = 0, 1, …, each multiply rounded, no
    /// fused multiply-add; then `− yᵢ`; the clipping factor; the rounding
    /// trunc(y) + [y − trunc(y) ≥ ½] − [y − trunc(y) ≤ −½], which is `round_i64`; the check), so
    /// each row's integers are those of the reference. Contributions go into one accumulator per
    /// coordinate and lane unconditionally; a lane whose integer check fails has its
    /// contribution, recomputed by the same operations, taken back out. A block with any row
    /// outside the fast path's range (a NaN residual, a non-finite or huge f/q, a non-finite
    /// norm) runs row by row through [`Self::add_row`]; so do the rows before the first whole
    /// block and after the last.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw")]
    unsafe fn add_rows_lanes_avx512(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        use std::arch::x86_64::*;
        let (d, p) = (self.d, part.len());
        let (first, last) = self.whole_blocks(&rows, p);
        let mut used = self.add_rows_generic::<true>(rows.start..first, part);
        let c = self.clipper;
        let target = _mm512_set1_pd(c.target());
        let inv_q = _mm512_set1_pd(c.inv_q());
        let limit = _mm512_set1_pd(FAST_LIMIT);
        let (zero, inf) = (_mm512_setzero_pd(), _mm512_set1_pd(f64::INFINITY));
        let sign = _mm512_set1_pd(-0.0);
        let cap = _mm512_set1_epi64(c.c_int as i64);
        let cap2 = _mm512_set1_epi64((c.c_int * c.c_int) as i64);
        let base = _mm512_set1_pd(if self.intercept { self.theta[d] } else { 0.0 });
        let mut acc = [_mm512_setzero_si512(); MAX_P];
        for i in (first..last).step_by(BLOCK) {
            // SAFETY: i + BLOCK ≤ last, so the block's d·BLOCK values lie within `xt`
            // (asserted above), and its labels and norms within `y` and `norms` (n ≥ last).
            let xb = unsafe { self.xt.as_ptr().add(i * d) };
            let col = |j: usize| unsafe { _mm512_loadu_pd(xb.add(j * BLOCK)) };
            let mut r = base;
            for (j, &t) in self.theta[..d].iter().enumerate() {
                r = _mm512_add_pd(r, _mm512_mul_pd(_mm512_set1_pd(t), col(j)));
            }
            r = _mm512_sub_pd(r, unsafe { _mm512_loadu_pd(self.y[i..i + BLOCK].as_ptr()) });
            let n = unsafe { _mm512_loadu_pd(self.norms[i..i + BLOCK].as_ptr()) };
            // f = r if |r|·‖x̃‖ ≤ target; else sign(r)·(target/‖x̃‖) if 0 < ‖x̃‖ < ∞; else 0.
            let inside =
                _mm512_cmp_pd_mask::<_CMP_LE_OQ>(_mm512_mul_pd(_mm512_abs_pd(r), n), target);
            let n_ok = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(n, zero)
                & _mm512_cmp_pd_mask::<_CMP_LT_OQ>(n, inf);
            // r.signum()·(target/n) is ±(target/n) exactly: the quotient with r's sign.
            let q = _mm512_div_pd(target, n);
            let scaled = _mm512_or_pd(_mm512_andnot_pd(sign, q), _mm512_and_pd(sign, r));
            let f = _mm512_mask_blend_pd(inside, _mm512_maskz_mov_pd(n_ok, scaled), r);
            let fq = _mm512_mul_pd(f, inv_q);
            let a = _mm512_abs_pd(fq);
            let mut fast = _mm512_cmp_pd_mask::<_CMP_LE_OQ>(_mm512_mul_pd(a, n), limit)
                & _mm512_cmp_pd_mask::<_CMP_ORD_Q>(r, r);
            if self.intercept {
                fast &= _mm512_cmp_pd_mask::<_CMP_LE_OQ>(a, limit);
            }
            if fast != 0xFF {
                let mut rs = [0.0f64; BLOCK];
                unsafe { _mm512_storeu_pd(rs.as_mut_ptr(), r) };
                for (b, &rb) in rs.iter().enumerate() {
                    used += self.add_row::<true>(i + b, rb, part);
                }
                continue;
            }
            // Row i's integer for coordinate j: round_i64(f/q·xᵢⱼ), or round_i64(f/q) for the
            // intercept (j = d).
            let v = |j: usize| {
                let y = if j < d { _mm512_mul_pd(fq, col(j)) } else { fq };
                round_lanes(y)
            };
            let mut max = _mm512_setzero_si512();
            let mut sq = _mm512_setzero_si512();
            for (j, a) in acc[..p].iter_mut().enumerate() {
                let vj = v(j);
                *a = _mm512_add_epi64(*a, vj);
                let m = _mm512_abs_epi64(vj);
                max = _mm512_max_epu64(max, m);
                // As in `add_row`: the square of the low 32 bits, m² when m < 2³².
                sq = _mm512_add_epi64(sq, _mm512_mul_epu32(m, m));
            }
            let ok = _mm512_cmple_epu64_mask(max, cap) & _mm512_cmple_epu64_mask(sq, cap2);
            if ok != 0xFF {
                // Rare (the float target keeps the integer norm within c).
                for (j, a) in acc[..p].iter_mut().enumerate() {
                    *a = _mm512_mask_sub_epi64(*a, !ok, *a, v(j));
                }
            }
            used += u64::from(ok.count_ones());
        }
        for (s, a) in part.iter_mut().zip(&acc[..p]) {
            // At most FLUSH_ROWS rows of |v| < 2²⁹ in all: no lane, and no sum, overflows.
            *s += _mm512_reduce_add_epi64(*a);
        }
        used + self.add_rows_generic::<true>(last..rows.end, part)
    }

    /// [`Self::add_rows_lanes_avx512`] for AVX2: each block of [`BLOCK`] rows as two halves of
    /// 4 lanes, with the same per-lane operations. AVX2 has no `f64` → `i64` conversion, no
    /// 64-bit absolute value or maximum and no unsigned comparison: the truncation is read
    /// through the magic constant 1.5·2⁵² (exact for |t| < 2⁵¹, as in `round_fast`), |v| is
    /// (v ⊕ s) − s with s the sign mask, the maximum a signed compare and blend, and the checks
    /// signed compares (every |v| < 2⁵¹ and, when max ≤ c < 2²⁹, Σ v² < 32·2⁵⁸ = 2⁶³; when
    /// max > c the row fails whatever Σ v² reads). The check holds on every input, not only on
    /// the fast path's range: outside it the magic constant gives some integer of magnitude
    /// ≥ 2⁵¹, above c, so the lane fails, or, for t = −3·2⁵², i64::MIN, whose |v| wraps to
    /// itself and is negative; a lane with a negative |v| fails too (round 52, review "unsafe",
    /// F1: it used to pass, one row adding 2⁶³ grid units).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_rows_lanes_avx2(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        use std::arch::x86_64::*;
        const HALF: usize = BLOCK / 2;
        let (d, p) = (self.d, part.len());
        let (first, last) = self.whole_blocks(&rows, p);
        let mut used = self.add_rows_generic::<true>(rows.start..first, part);
        let c = self.clipper;
        let target = _mm256_set1_pd(c.target());
        let inv_q = _mm256_set1_pd(c.inv_q());
        let limit = _mm256_set1_pd(FAST_LIMIT);
        let (zero, inf) = (_mm256_setzero_pd(), _mm256_set1_pd(f64::INFINITY));
        let sign = _mm256_set1_pd(-0.0);
        let (half, mhalf) = (_mm256_set1_pd(0.5), _mm256_set1_pd(-0.5));
        let magic = _mm256_set1_pd(MAGIC);
        let magic_bits = _mm256_castpd_si256(magic);
        let zero_i = _mm256_setzero_si256();
        let cap = _mm256_set1_epi64x(c.c_int as i64);
        let cap2 = _mm256_set1_epi64x((c.c_int * c.c_int) as i64);
        let base = _mm256_set1_pd(if self.intercept { self.theta[d] } else { 0.0 });
        let mut acc = [[_mm256_setzero_si256(); 2]; MAX_P];
        // round_i64(y) per lane for |y| < 2⁵¹: trunc(y) through the magic constant, then +1 if
        // y − trunc(y) ≥ ½ and −1 if ≤ −½ (a true comparison is the all-ones mask, −1).
        let round = |y: __m256d| {
            let t = _mm256_round_pd::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let rem = _mm256_sub_pd(y, t);
            let v = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(t, magic)), magic_bits);
            let up = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_GE_OQ>(rem, half));
            let down = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_LE_OQ>(rem, mhalf));
            _mm256_add_epi64(_mm256_sub_epi64(v, up), down)
        };
        for i in (first..last).step_by(BLOCK) {
            for h in 0..2 {
                let i = i + h * HALF;
                // SAFETY: the block of rows i − h·4 … lies within `xt` (asserted above); lane
                // group h of feature j is at offset j·BLOCK + h·4 of the block.
                let xb = unsafe { self.xt.as_ptr().add((i - h * HALF) * d + h * HALF) };
                let col = |j: usize| unsafe { _mm256_loadu_pd(xb.add(j * BLOCK)) };
                let mut r = base;
                for (j, &t) in self.theta[..d].iter().enumerate() {
                    r = _mm256_add_pd(r, _mm256_mul_pd(_mm256_set1_pd(t), col(j)));
                }
                r = _mm256_sub_pd(r, unsafe { _mm256_loadu_pd(self.y[i..i + HALF].as_ptr()) });
                let n = unsafe { _mm256_loadu_pd(self.norms[i..i + HALF].as_ptr()) };
                let norm = _mm256_mul_pd(_mm256_andnot_pd(sign, r), n);
                let inside = _mm256_cmp_pd::<_CMP_LE_OQ>(norm, target);
                let n_ok = _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GT_OQ>(n, zero),
                    _mm256_cmp_pd::<_CMP_LT_OQ>(n, inf),
                );
                let q = _mm256_div_pd(target, n);
                let scaled = _mm256_or_pd(_mm256_andnot_pd(sign, q), _mm256_and_pd(sign, r));
                let f = _mm256_blendv_pd(_mm256_and_pd(n_ok, scaled), r, inside);
                let fq = _mm256_mul_pd(f, inv_q);
                let a = _mm256_andnot_pd(sign, fq);
                let mut fast = _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_LE_OQ>(_mm256_mul_pd(a, n), limit),
                    _mm256_cmp_pd::<_CMP_ORD_Q>(r, r),
                );
                if self.intercept {
                    fast = _mm256_and_pd(fast, _mm256_cmp_pd::<_CMP_LE_OQ>(a, limit));
                }
                if _mm256_movemask_pd(fast) != 0xF {
                    let mut rs = [0.0f64; HALF];
                    unsafe { _mm256_storeu_pd(rs.as_mut_ptr(), r) };
                    for (b, &rb) in rs.iter().enumerate() {
                        used += self.add_row::<true>(i + b, rb, part);
                    }
                    continue;
                }
                let v = |j: usize| round(if j < d { _mm256_mul_pd(fq, col(j)) } else { fq });
                let mut max = zero_i;
                let mut sq = zero_i;
                // The OR of every |vⱼ| of the lane: its sign bit is set iff some |vⱼ| is
                // negative, which happens for vⱼ = i64::MIN alone (|i64::MIN| wraps to itself).
                let mut neg = zero_i;
                for (j, a) in acc[..p].iter_mut().enumerate() {
                    let vj = v(j);
                    a[h] = _mm256_add_epi64(a[h], vj);
                    let s = _mm256_cmpgt_epi64(zero_i, vj);
                    let m = _mm256_sub_epi64(_mm256_xor_si256(vj, s), s);
                    neg = _mm256_or_si256(neg, m);
                    max = _mm256_blendv_epi8(max, m, _mm256_cmpgt_epi64(m, max));
                    sq = _mm256_add_epi64(sq, _mm256_mul_epu32(m, m));
                }
                // A lane with a negative |vⱼ| fails (round 52, review "unsafe", F1: the signed
                // maximum skipped it and its low 32 bits squared to 0, so a row whose integer
                // was i64::MIN passed the check; the AVX-512 build compares unsigned).
                let bad = _mm256_or_si256(
                    _mm256_or_si256(_mm256_cmpgt_epi64(max, cap), _mm256_cmpgt_epi64(sq, cap2)),
                    _mm256_cmpgt_epi64(zero_i, neg),
                );
                let bad_lanes = _mm256_movemask_pd(_mm256_castsi256_pd(bad));
                if bad_lanes != 0 {
                    // Rare (the float target keeps the integer norm within c).
                    for (j, a) in acc[..p].iter_mut().enumerate() {
                        a[h] = _mm256_sub_epi64(a[h], _mm256_and_si256(v(j), bad));
                    }
                }
                used += u64::from(HALF as u32 - bad_lanes.count_ones());
            }
        }
        for (s, a) in part.iter_mut().zip(&acc[..p]) {
            let mut lanes = [0i64; 2 * HALF];
            unsafe {
                _mm256_storeu_si256(lanes.as_mut_ptr().cast(), a[0]);
                _mm256_storeu_si256(lanes.as_mut_ptr().add(HALF).cast(), a[1]);
            }
            // At most FLUSH_ROWS rows of |v| < 2²⁹ in all: no lane, and no sum, overflows.
            *s += lanes.iter().sum::<i64>();
        }
        used + self.add_rows_generic::<true>(last..rows.end, part)
    }

    /// Adds row i's contribution at residual `r` to `part`; 1 if it contributed.
    #[inline(always)]
    fn add_row<const HW: bool>(&self, i: usize, r: f64, part: &mut [i64]) -> u64 {
        let c = self.clipper;
        let d = self.d;
        let p = part.len();
        let x = &self.x[i * d..(i + 1) * d];
        let nx = self.norms[i];
        // The same clipping factor as `Clipper::contribution`.
        let norm = r.abs() * nx;
        let f = if norm <= c.target() {
            r
        } else if nx > 0.0 && nx.is_finite() {
            r.signum() * (c.target() / nx)
        } else {
            0.0
        };
        let fq = f * c.inv_q();
        if !fq.is_finite() {
            return 0; // `contribution` returns false: the row contributes 0
        }
        let a = fq.abs();
        let fast = a * nx <= FAST_LIMIT && (!self.intercept || a <= FAST_LIMIT);
        if !fast {
            // Outside the fast path's range: the reference code for this row.
            let mut v = [0i64; MAX_P];
            if c.contribution(x, self.intercept, r, nx, &mut v[..p]) {
                for (s, &b) in part.iter_mut().zip(&v[..p]) {
                    *s += b;
                }
                return 1;
            }
            return 0;
        }
        let mut v = [0i64; MAX_P];
        for (o, &xj) in v[..d].iter_mut().zip(x) {
            *o = round_fast::<HW>(fq * xj);
        }
        if self.intercept {
            v[d] = round_fast::<HW>(fq);
        }
        let mut max = 0u64;
        let mut sq = 0u64;
        for &vj in &v[..p] {
            let m = vj.unsigned_abs();
            max = max.max(m);
            // The square of the low 32 bits (one 32×32→64 multiply per lane): equal to m² when
            // m < 2³², which the check below requires (max ≤ c < 2²⁹).
            let m32 = u64::from(m as u32);
            sq = sq.wrapping_add(m32 * m32);
        }
        // max ≤ c < 2²⁹ and p ≤ 32 make sq exact (< 2⁶³); otherwise the row fails anyway.
        let ok = max <= c.c_int && sq <= c.c_int * c.c_int;
        let mask = -i64::from(ok);
        for (s, &vj) in part.iter_mut().zip(&v[..p]) {
            *s += vj & mask;
        }
        u64::from(ok)
    }
}

/// round_i64(y) in each lane, for |y| < 2⁵¹: trunc(y), plus 1 if y − trunc(y) ≥ ½, minus 1
/// if it is ≤ −½ (`round_i64`'s definition; `cvttpd2qq` is the truncation, exact here).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw")]
fn round_lanes(y: std::arch::x86_64::__m512d) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let t = _mm512_roundscale_pd::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
    let rem = _mm512_sub_pd(y, t);
    let one = _mm512_set1_epi64(1);
    let v = _mm512_cvttpd_epi64(y);
    let v = _mm512_mask_add_epi64(
        v,
        _mm512_cmp_pd_mask::<_CMP_GE_OQ>(rem, _mm512_set1_pd(0.5)),
        v,
        one,
    );
    _mm512_mask_sub_epi64(
        v,
        _mm512_cmp_pd_mask::<_CMP_LE_OQ>(rem, _mm512_set1_pd(-0.5)),
        v,
        one,
    )
}

/// round_i64(y) (ties away from zero) for |y| < 2⁵¹ (module docs).
#[inline(always)]
fn round_fast<const HW: bool>(y: f64) -> i64 {
    if HW {
        let t = y.trunc();
        let r = y - t;
        let up = if r >= 0.5 { 1.0 } else { 0.0 };
        let down = if r <= -0.5 { 1.0 } else { 0.0 };
        let v = t + up - down;
        ((v + MAGIC).to_bits() as i64).wrapping_sub(MAGIC.to_bits() as i64)
    } else {
        super::clip::round_i64(y)
    }
}

// ---------------------------------------------------------------------------------------------
// dp_logreg_agd (issue 19): blocked dot products and the selection pass's candidate losses.
//
// [`super::agd`]'s two row passes, the gradient pass and the selection pass (21 candidate
// losses per row), use the pieces below. Every row's integer contribution is a function of that
// row alone, computed by the same floating-point operations on every path (lanes of a block are
// independent; no fused multiply-add; no libm call whose result could depend on the build), so
// the integer sums are the same for any split of the rows and on the AVX2 and baseline builds.

/// Rows per block of the AGD passes: independent dot-product chains, and the lanes of the
/// candidate-loss kernel.
pub const LANES: usize = 8;

/// w·x̃ for the [`LANES`] rows of `xb` (row-major, `d` features each), x̃ = (1, x) when
/// `intercept` (w₀ first): per row, the floating-point operations of `agd`'s row-at-a-time
/// `dot`, `w₀ + (((−0 + w₁x₀) + w₂x₁) + …)` (`Iterator::sum` folds from −0.0), in the same
/// order, so the bits are equal; the rows' chains are independent, so they pipeline.
#[inline(always)]
pub(crate) fn dot_block(w: &[f64], xb: &[f64], d: usize, intercept: bool) -> [f64; LANES] {
    let off = usize::from(intercept);
    assert!(xb.len() == LANES * d && w.len() == d + off);
    let mut acc = [-0.0f64; LANES];
    for j in 0..d {
        let t = w[off + j];
        for (b, a) in acc.iter_mut().enumerate() {
            // SAFETY: b < LANES and j < d, so b·d + j < LANES·d = xb.len() (asserted).
            *a += t * unsafe { *xb.get_unchecked(b * d + j) };
        }
    }
    if intercept {
        for a in &mut acc {
            *a += w[0]; // = w₀ + a (IEEE addition commutes)
        }
    }
    acc
}

/// Which build of the AGD kernels runs: `Auto` takes the AVX-512 build, else the AVX2 build,
/// when the CPU has them; `Portable` (and a CPU without either) the baseline x86-64 build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    Avx512,
    Avx2,
    Baseline,
}

#[inline]
pub(crate) fn simd(path: RowPath) -> Simd {
    if path == RowPath::Avx2 && RowPath::avx2_available() {
        Simd::Avx2
    } else if path != RowPath::Auto {
        Simd::Baseline
    } else if RowPath::avx512_available() {
        Simd::Avx512
    } else if RowPath::avx2_available() {
        Simd::Avx2
    } else {
        Simd::Baseline
    }
}

/// 2⁵²: y + 2⁵² − 2⁵² rounds 0 ≤ y < 2⁵² to an integer, exactly.
const TWO52: f64 = 4_503_599_627_370_496.0;

/// ⌊y⌋ for 0 ≤ y < 2⁵² (NaN-free), in operations that vectorise on baseline x86-64: r = the
/// nearest integer (y + 2⁵² − 2⁵², exact), minus 1 if it is above y.
#[inline(always)]
fn floor_small(y: f64) -> f64 {
    let r = (y + TWO52) - TWO52;
    if r > y { r - 1.0 } else { r }
}

/// The integer value of an integral 0 ≤ v < 2⁵², through its bits (v + 2⁵² has the bits of
/// 2⁵² plus v).
#[inline(always)]
fn small_to_u64(v: f64) -> u64 {
    (v + TWO52).to_bits().wrapping_sub(TWO52.to_bits())
}

// fdlibm's s_log1p.c (Sun Microsystems, 1993; the algorithm of glibc's `log1p`): constants by
// their bits.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
const LP1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
const LP2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
const LP3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
const LP4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
const LP5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
const LP6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
const LP7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
/// fdlibm's switch between f = x (below) and the reduction of u = 1 + x (above): 0.41422….
const LOG1P_SMALL: f64 = f64::from_bits(0x3fda_827a_0000_0000);

/// ln(1 + v) for 0 ≤ v ≤ 1.5 (the candidate losses need v = e^{−|s|} ∈ (0, 1], a little
/// above 1 through rounding), branch-free: fdlibm's `log1p` (s_log1p.c; error < 1 ulp) restricted to this range,
/// every branch computed and selected, so that it vectorises. On [0, 1.5], with its branches:
///
/// - v < 2⁻²⁹: v − v²/2 (fdlibm's tiny-argument branch);
/// - v < 0.41422: f = v, k = 0, no correction;
/// - else u = 1 + v ∈ [1.414, 2.5], k = 1, f = u/2 − 1 ∈ [−0.293, 0.25] (exact), and the rounding
///   error of u as the correction c = (x − (u − 1))/u for u < 2, (1 − (u − x))/u for u ≥ 2;
///   when |f| < 2⁻²⁰ (u ∈ [2 − 3·2⁻²⁰, 2 + 2⁻¹⁹), fdlibm's test of the high word), the short
///   form R = f²/2·(1 − 2f/3);
/// - otherwise s = f/(2 + f), R(s²) the degree-7 polynomial (evaluated as glibc does), and
///   ln(1 + v) = k·ln2_hi − ((f²/2 − (s·(f²/2 + R) + (k·ln2_lo + c))) − f).
///
/// Only +, −, ×, ÷ and comparisons: the AVX2 and baseline builds give the same bits.
#[inline(always)]
pub(crate) fn ln_1p_unit(v: f64) -> f64 {
    let small = v < LOG1P_SMALL;
    let u = 1.0 + v;
    let m = 0.5 * u;
    let c_raw = if u < 2.0 {
        v - (u - 1.0)
    } else {
        1.0 - (u - v)
    };
    let f = if small { v } else { m - 1.0 };
    let k = if small { 0.0 } else { 1.0 };
    let c = if small { 0.0 } else { c_raw / u };
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let z2 = z * z;
    let z4 = z2 * z2;
    let z6 = z4 * z2;
    let r = z * LP1 + z2 * (LP2 + z * LP3) + z4 * (LP4 + z * LP5) + z6 * (LP6 + z * LP7);
    let general = if small {
        f - (hfsq - s * (hfsq + r))
    } else {
        k * LN2_HI - ((hfsq - (s * (hfsq + r) + (k * LN2_LO + c))) - f)
    };
    // fdlibm's |f| < 2⁻²⁰ branch (k = 1 here: u/2 ∈ [1, 1 + 2⁻²⁰)).
    let short_r = hfsq * (1.0 - (2.0 / 3.0) * f); // fdlibm: 0.66666666666666666, the same f64
    let short = LN2_HI - ((short_r - (LN2_LO + c)) - f);
    // fdlibm tests the high word of the normalised u: zero for u/2 ∈ [1, 1 + 2⁻²⁰), and, after
    // its shift (0x100000 − hu) >> 2, for u ∈ [2 − 3·2⁻²⁰, 2).
    let tiny_f = !small
        && if u < 2.0 {
            u >= 2.0 - 3.0 / 1_048_576.0
        } else {
            f < 1.0 / 1_048_576.0
        };
    let tiny_v = v < 1.0 / 536_870_912.0; // 2⁻²⁹
    let tiny = v - v * v * 0.5;
    if tiny_v {
        tiny
    } else if tiny_f {
        short
    } else {
        general
    }
}

/// The candidate grid of one selection pass and the score grid (see `agd`'s module docs,
/// "Scores"): candidates αₖ = `steps[k]` = k·`h`, losses clipped to `c` = C_obj, floored to
/// the grid `q` = q_o (a power of two), at most `cap` = U units.
pub(crate) struct ScoreGrid<'a> {
    steps: &'a [f64],
    h: f64,
    c: f64,
    q: f64,
    cap: u64,
    /// 1/q when q is a power of two whose inverse is a normal number: then y·(1/q) and y/q
    /// are roundings of the same real number, so equal, and the multiply is used.
    inv_q: Option<f64>,
}

/// |s| up to which e^s is formed by the recurrence (far from overflow and underflow): the
/// bound of `agd`'s `score_row_recurrence`.
pub const RECURRENCE_RANGE: f64 = 600.0;

/// Rows per `u64` partial score of one lane before it is flushed: a row adds ≤ U < 2³³.
pub const SCORE_FLUSH_ROWS: usize = 1 << 30;

impl<'a> ScoreGrid<'a> {
    pub(crate) fn new(steps: &'a [f64], h: f64, c: f64, q: f64, cap: u64) -> Self {
        let inv = 1.0 / q;
        let pow2 = q.is_normal() && q.to_bits() & ((1u64 << 52) - 1) == 0;
        let inv_q = (pow2 && inv.is_normal()).then_some(inv);
        Self {
            steps,
            h,
            c,
            q,
            cap,
            inv_q,
        }
    }

    /// [`Self::lanes`], with y/q as a multiply when that is exact.
    #[inline(always)]
    pub(crate) fn add_lanes(
        &self,
        z: &[f64; LANES],
        b: &[f64; LANES],
        pos: &[bool; LANES],
        live: &[bool; LANES],
        acc: &mut [[u64; LANES]],
    ) -> [bool; LANES] {
        match self.inv_q {
            Some(inv) => self.lanes(z, b, pos, live, acc, |y| y * inv),
            None => self.lanes(z, b, pos, live, acc, |y| y / self.q),
        }
    }

    /// The candidate losses of the [`LANES`] rows of a block (zᵢ = w·x̃ᵢ, bᵢ = u·x̃ᵢ, label
    /// `pos`; lanes with `live` false are padding), added as integers in [0, U] into
    /// `acc[k][lane]`. Per row, the arithmetic of `agd`'s `score_row_recurrence`, with
    /// [`ln_1p_unit`] in place of libm's `ln_1p`: sₖ = ±(zᵢ − αₖ·bᵢ), e^{sₖ} from one `exp`
    /// and the running product by e^{∓h·bᵢ}, loss max(sₖ, 0) + ln(1 + e^{−|sₖ|}), then
    /// ⌊min(loss, C)/q⌋ ∧ U (U when sₖ ≥ C). Returns which lanes were done; the others (padding,
    /// or |s| > [`RECURRENCE_RANGE`] at either end of the grid, or non-finite) added nothing and
    /// are left to the caller's direct code.
    #[inline(always)]
    fn lanes(
        &self,
        z: &[f64; LANES],
        b: &[f64; LANES],
        pos: &[bool; LANES],
        live: &[bool; LANES],
        acc: &mut [[u64; LANES]],
        per_q: impl Fn(f64) -> f64,
    ) -> [bool; LANES] {
        let steps = self.steps;
        let m = steps.len() - 1;
        assert!(m >= 1 && acc.len() == steps.len());
        let c = self.c;
        let capf = self.cap as f64;
        let mut inside = [false; LANES];
        let mut e = [1.0f64; LANES];
        let mut ratio = [1.0f64; LANES];
        let mut mask = [0u64; LANES];
        for l in 0..LANES {
            let arg = |a: f64| {
                let t = z[l] - a * b[l];
                if pos[l] { -t } else { t }
            };
            let (s0, s1) = (arg(steps[0]), arg(steps[m]));
            inside[l] = live[l] && s0.abs() <= RECURRENCE_RANGE && s1.abs() <= RECURRENCE_RANGE;
            if inside[l] {
                let hb = self.h * b[l];
                ratio[l] = (if pos[l] { hb } else { -hb }).exp();
                e[l] = s0.exp();
                mask[l] = u64::MAX;
            }
        }
        for (&a, acck) in steps.iter().zip(acc.iter_mut()) {
            for l in 0..LANES {
                let t = z[l] - a * b[l];
                let s = if pos[l] { -t } else { t };
                let ek = e[l];
                let above = s > 0.0;
                let v = if above { 1.0 / ek } else { ek };
                let lp = ln_1p_unit(v);
                let loss = if above { s + lp } else { lp };
                let lc = loss.min(c);
                let y = per_q(lc);
                let units = if s >= c || lc.is_nan() || lc < 0.0 {
                    capf
                } else {
                    floor_small(y).min(capf)
                };
                acck[l] += small_to_u64(units) & mask[l];
                e[l] = ek * ratio[l];
            }
        }
        inside
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::SecureRng;

    /// The rows-in-lanes blocks (`xt`) give the row-at-a-time reference's integers and count,
    /// for every range (aligned or not), with a target norm above the bound so that the integer
    /// check fails for some rows (their contributions are taken back out of the lanes), and with
    /// rows that leave the fast path (a block of them runs row by row).
    #[test]
    fn lanes_equal_the_reference_when_the_integer_check_fails() {
        let mut rng = SecureRng::insecure_from_seed(41);
        let mut u = || 2.0 * rng.uniform_f64() - 1.0;
        for (d, intercept) in [(16, true), (5, false), (31, true), (1, false)] {
            let n = 203;
            let mut x: Vec<f64> = (0..n * d).map(|_| 2.0 * u()).collect();
            let y: Vec<f64> = (0..n).map(|_| 3.0 * u()).collect();
            x[17 * d] = f64::INFINITY; // a non-finite norm: its block runs row by row
            let norms: Vec<f64> = (0..n)
                .map(|i| super::super::clip::l2_norm(&x[i * d..(i + 1) * d], intercept))
                .collect();
            let p = d + usize::from(intercept);
            let theta: Vec<f64> = (0..p).map(|_| u()).collect();
            let xt = transpose_blocks(&x, d);
            for target in [None, Some(1.4)] {
                let mut clipper = Clipper::new(1.0, -20, p);
                if let Some(t) = target {
                    clipper = clipper.with_target(t);
                }
                let pass = |xt: &[f64], rows: std::ops::Range<usize>, path: RowPath| {
                    let pass = Pass {
                        d,
                        intercept,
                        x: &x,
                        xt,
                        y: &y,
                        norms: &norms,
                        theta: &theta,
                        clipper: &clipper,
                    };
                    let mut part = vec![0i64; p];
                    let used = pass.add_rows(rows, &mut part, path);
                    (part, used)
                };
                for rows in [0..n, 3..n, 0..11, 5..7, 8..16, 13..200] {
                    let reference = pass(&[], rows.clone(), RowPath::Reference);
                    let used = reference.1 as usize;
                    if rows == (0..n) {
                        assert!(used > 0 && (target.is_none() || used + 20 < n), "{used}");
                    }
                    for path in [RowPath::Auto, RowPath::Avx2, RowPath::Portable] {
                        assert_eq!(
                            pass(&xt, rows.clone(), path),
                            reference,
                            "{path:?} {rows:?}"
                        );
                        assert_eq!(
                            pass(&[], rows.clone(), path),
                            reference,
                            "{path:?} {rows:?}"
                        );
                    }
                }
            }
        }
    }

    /// Round 52, review "unsafe", F1: a row whose rounded integer is i64::MIN (features 2⁻⁵³⁸,
    /// no intercept, clip 2⁻⁸⁰ so q = 2⁻¹⁰⁰, θ = 0 and label 3·2⁴⁹⁰, so f·xⱼ/q = −3·2⁵² and the
    /// magic-constant rounding reads i64::MIN). With the norm the fits used to compute (0: the
    /// squares underflow) the row takes the fast path; the AVX2 lanes accepted it (|i64::MIN| is
    /// negative, its low 32 bits square to 0) and added 2⁶³ grid units. Every path must give
    /// the reference's integers: with that norm (the check alone guards), and with the norm of
    /// `clip::l2_norm` (the row is clipped to ⌊clip/q⌋). `RowPath::Avx2` runs the AVX2 build
    /// with rows in lanes on a CPU with AVX2 (this machine), whatever `Auto` picks.
    #[test]
    fn a_row_whose_integer_is_i64_min_fails_on_every_path() {
        use super::super::clip::l2_norm;
        let tiny = crate::mechanisms::exact::pow2(-538);
        let label = 3.0 * crate::mechanisms::exact::pow2(490);
        let clipper = Clipper::new(crate::mechanisms::exact::pow2(-80), -100, 3);
        assert_eq!(-label * clipper.inv_q() * tiny, -3.0 * TWO52);
        for d in [1usize, 3] {
            let n = 24;
            // Attack rows at 3 and 12..16 (several in one half-block) and 21; the rest zero.
            let hit = |i: usize| i == 3 || (12..16).contains(&i) || i == 21;
            let x: Vec<f64> = (0..n * d)
                .map(|k| if hit(k / d) { tiny } else { 0.0 })
                .collect();
            let y: Vec<f64> = (0..n).map(|i| if hit(i) { label } else { 0.0 }).collect();
            let theta = vec![0.0; d];
            let xt = transpose_blocks(&x, d);
            let underflowed = vec![0.0; n];
            let robust: Vec<f64> = (0..n)
                .map(|i| l2_norm(&x[i * d..(i + 1) * d], false))
                .collect();
            assert!(robust.iter().enumerate().all(|(i, &v)| (v > 0.0) == hit(i)));
            for (norms, clipped) in [(&underflowed, false), (&robust, true)] {
                let run = |xt: &[f64], rows: std::ops::Range<usize>, path: RowPath| {
                    let pass = Pass {
                        d,
                        intercept: false,
                        x: &x,
                        xt,
                        y: &y,
                        norms,
                        theta: &theta,
                        clipper: &clipper,
                    };
                    let mut part = vec![0i64; d];
                    let used = pass.add_rows(rows, &mut part, path);
                    (part, used)
                };
                for rows in [0..n, 0..8, 8..16, 3..4, 13..23] {
                    let reference = run(&[], rows.clone(), RowPath::Reference);
                    let hits = rows.clone().filter(|&i| hit(i)).count() as i64;
                    // Zero rows count; an attack row counts only when clipped, by ≤ c each.
                    let zeros = rows.len() as u64 - hits as u64;
                    if clipped {
                        assert_eq!(reference.1, rows.len() as u64);
                        let c = clipper.c_int as i64;
                        for &v in &reference.0 {
                            assert!(v <= 0 && v >= -hits * c && (hits == 0 || v < -hits * c / 2));
                        }
                    } else {
                        assert_eq!(reference, (vec![0; d], zeros), "{rows:?}");
                    }
                    for path in [RowPath::Avx2, RowPath::Auto, RowPath::Portable] {
                        assert_eq!(run(&xt, rows.clone(), path), reference, "{path:?} {rows:?}");
                        assert_eq!(run(&[], rows.clone(), path), reference, "{path:?} {rows:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn transposed_blocks_hold_each_row_in_its_lane() {
        let (n, d) = (19, 3);
        let x: Vec<f64> = (0..n * d).map(|v| v as f64).collect();
        let xt = transpose_blocks(&x, d);
        assert_eq!(xt.len(), 16 * d);
        for i in 0..16 {
            for j in 0..d {
                assert_eq!(
                    xt[(i / BLOCK) * BLOCK * d + j * BLOCK + i % BLOCK],
                    x[i * d + j]
                );
            }
        }
        assert!(transpose_blocks(&x[..7 * d], d).is_empty());
    }

    #[test]
    fn round_fast_matches_round_i64() {
        let mut rng = SecureRng::insecure_from_seed(7);
        let mut vals = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            0.49999999999999994,
            -0.49999999999999994,
            4503599627370495.5,
            -4503599627370495.5,
            2251799813685247.5,
            (1u64 << 50) as f64 + 0.5,
        ];
        for _ in 0..200_000 {
            let e = (rng.uniform_below(52) as i32) - 2;
            let u = rng.uniform_below(1 << 53) as f64 / (1u64 << 53) as f64;
            let s = if rng.uniform_below(2) == 0 { 1.0 } else { -1.0 };
            vals.push(s * u * 2f64.powi(e));
            vals.push(s * ((u * 2f64.powi(e)).floor() + 0.5));
        }
        for y in vals {
            if y.abs() < 2f64.powi(51) {
                assert_eq!(
                    round_fast::<true>(y),
                    super::super::clip::round_i64(y),
                    "{y}"
                );
                assert_eq!(
                    round_fast::<false>(y),
                    super::super::clip::round_i64(y),
                    "{y}"
                );
            }
        }
    }

    /// ln_1p_unit against libm's `ln_1p` on [0, 1.5]: within 1 ulp everywhere (both are
    /// < 1 ulp from ln(1 + v)), and equal almost always (the same algorithm, fdlibm's).
    #[test]
    fn ln_1p_unit_matches_libm() {
        let mut rng = SecureRng::insecure_from_seed(11);
        let mut vals: Vec<f64> = vec![
            0.0,
            f64::MIN_POSITIVE,
            1e-300,
            2f64.powi(-54),
            2f64.powi(-29),
            2f64.powi(-29) * (1.0 - f64::EPSILON),
            LOG1P_SMALL,
            f64::from_bits(LOG1P_SMALL.to_bits() - 1),
            std::f64::consts::SQRT_2 - 1.0,
            0.5,
            1.0,
            1.0 - f64::EPSILON,
            1.0 + f64::EPSILON,
            1.0 + 2f64.powi(-20),
            1.0 - 3.0 * 2f64.powi(-21),
            1.0 - 3.5 * 2f64.powi(-21),
            1.5,
        ];
        for _ in 0..400_000 {
            let u = rng.uniform_f64();
            vals.push(1.5 * u);
            vals.push(u * 2f64.powi(-(rng.uniform_below(60) as i32))); // every magnitude
            vals.push(1.0 + (u - 0.5) * 2f64.powi(-(rng.uniform_below(40) as i32))); // near u = 2
        }
        let mut differ = 0usize;
        for &v in &vals {
            if !(0.0..=1.5).contains(&v) {
                continue;
            }
            let (a, b) = (ln_1p_unit(v), v.ln_1p());
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
            assert!(ulps <= 1, "v = {v:e}: {a:e} vs {b:e}");
            differ += usize::from(ulps != 0);
        }
        assert!(differ * 1000 < vals.len(), "{differ} of {}", vals.len());
    }

    #[test]
    fn floor_small_is_floor() {
        let mut rng = SecureRng::insecure_from_seed(12);
        let mut vals = vec![0.0, 0.5, 1.0, 1.5, 2.5, 2f64.powi(33), 2f64.powi(52) - 1.0];
        vals.push(2f64.powi(52) - 0.5);
        for _ in 0..200_000 {
            let u = rng.uniform_f64();
            vals.push(u * 2f64.powi(rng.uniform_below(52) as i32));
            vals.push((u * 2f64.powi(rng.uniform_below(40) as i32)).floor() + 0.5);
        }
        for y in vals {
            if y < TWO52 {
                assert_eq!(floor_small(y), y.floor(), "{y}");
                assert_eq!(small_to_u64(y.floor()), y.floor() as u64, "{y}");
            }
        }
    }

    /// The blocked dot products have the bits of `agd`'s `dot` (its expression, copied),
    /// zeros of either sign and non-finite values included.
    #[test]
    fn dot_block_is_bit_identical() {
        fn dot(w: &[f64], x: &[f64], intercept: bool) -> f64 {
            if intercept {
                w[0] + w[1..].iter().zip(x).map(|(a, b)| a * b).sum::<f64>()
            } else {
                w.iter().zip(x).map(|(a, b)| a * b).sum::<f64>()
            }
        }
        let mut rng = SecureRng::insecure_from_seed(13);
        let special = [0.0, -0.0, 1e300, -1e300, f64::INFINITY, 1e-320, 3.0];
        for d in [0usize, 1, 2, 5, 16, 17] {
            for intercept in [true, false] {
                for _ in 0..300 {
                    let mut pick = || {
                        if rng.uniform_below(4) == 0 {
                            special[rng.uniform_below(special.len() as u128) as usize]
                        } else {
                            rng.uniform_f64() - 0.5
                        }
                    };
                    let w: Vec<f64> = (0..d + usize::from(intercept)).map(|_| pick()).collect();
                    let x: Vec<f64> = (0..LANES * d).map(|_| pick()).collect();
                    let got = dot_block(&w, &x, d, intercept);
                    for (b, g) in got.iter().enumerate() {
                        let want = dot(&w, &x[b * d..(b + 1) * d], intercept);
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{g} {want}"
                        );
                    }
                }
            }
        }
    }
}
