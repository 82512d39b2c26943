//! The blocked row pass of `dp_linreg_gd`'s `'gaussian'` kernel (issue 19), with runtime CPU
//! dispatch.
//!
//! [`super::linreg::GaussianGd`] sums, per iteration, the clipped per-example gradients of every
//! row as exact integers ([`super::linreg::Clipper::contribution`]; module docs of
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
//!   only when |f/q|·‖x̃ᵢ‖ ≤ 2⁵⁰ (so every |f·xⱼ/q| < 2⁵¹) and f/q is finite; any other row
//!   (huge residuals, non-finite norms) goes through `Clipper::contribution` itself.
//! - **Runtime dispatch.** The same source is compiled twice: once for baseline x86-64 and once
//!   inside a `#[target_feature(enable = "avx2")]` function, chosen with
//!   `is_x86_feature_detected!("avx2")` at each pass. No `-C target-cpu` is needed. FMA is
//!   deliberately not enabled: the residual must round after each multiply, as the scalar code
//!   does.
//!
//! **Exactness.** Every per-row integer vector equals the one `Clipper::contribution` computes
//! for the same row (the residual is bit-identical; the rounding and the check are equivalent
//! for the rows the fast path takes, as argued above), so the sums equal the row-at-a-time sums
//! bit for bit, on every path, for every partitioning: the released values and the sensitivity
//! argument are unchanged. The tests `blocked_pass_equals_reference` (here) and
//! `tests/kernels.rs` compare the paths on random data, including the forced portable fallback.
//!
//! The fast path needs c = ⌊clip/q⌋ < 2²⁹ and p ≤ 32 (so that Σ vⱼ² < 2⁶³ in `u64` whenever
//! every |vⱼ| ≤ c); the grid makes c ≈ 2²⁰–2²¹ in practice. Otherwise the caller keeps the
//! row-at-a-time pass ([`eligible`]).
use super::linreg::Clipper;

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
    /// The blocked pass, AVX2 when the CPU has it (what the fits use).
    Auto,
    /// The blocked pass compiled for baseline x86-64 (the dispatch fallback), forced.
    Portable,
    /// The row-at-a-time pass (`Clipper::contribution` per row): the reference.
    Reference,
}

impl RowPath {
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

/// Whether the blocked pass applies to this clipper and p (module docs).
pub fn eligible(clipper: &Clipper, p: usize) -> bool {
    clipper.c_int < MAX_C && p <= MAX_P
}

/// What one row pass reads.
pub struct Pass<'a> {
    pub d: usize,
    pub intercept: bool,
    /// Row-major n×d features (clamped).
    pub x: &'a [f64],
    /// Labels (clamped).
    pub y: &'a [f64],
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
        match path {
            RowPath::Auto => self.add_rows_auto(rows, part),
            RowPath::Portable => self.add_rows_generic::<false>(rows, part),
            RowPath::Reference => self.add_rows_reference(rows, part),
        }
    }

    /// The AVX2 build when the CPU has AVX2, else the baseline build.
    fn add_rows_auto(&self, rows: std::ops::Range<usize>, part: &mut [i64]) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            if RowPath::avx2_available() {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { self.add_rows_avx2(rows, part) };
            }
        }
        self.add_rows_generic::<false>(rows, part)
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
            sq = sq.wrapping_add(m.wrapping_mul(m));
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
        super::linreg::round_i64(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::SecureRng;

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
                    super::super::linreg::round_i64(y),
                    "{y}"
                );
                assert_eq!(
                    round_fast::<false>(y),
                    super::super::linreg::round_i64(y),
                    "{y}"
                );
            }
        }
    }
}
