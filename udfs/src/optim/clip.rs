//! Per-example clipping of a gradient into exact integers ([`Clipper`]) and the rounding it uses
//! ([`round_i64`]): shared by the DP-GD kernels ([`super::linreg`], [`super::kernel`]) and DP-SGD
//! ([`super::sgd`]). The proof that Σ out² ≤ c_int² whatever the inputs is beside
//! [`Clipper::contribution`]; the fixed-point grid is the one of the module docs of
//! [`super::linreg`] ("Exact sums").
//!
//! Two helpers every model fit uses, one declaration each (round 52, review "unsafe", F1–F2):
//! [`l2_norm`], the float norm that clipping and the kernels' range arguments read (it cannot
//! underflow to 0 for a vector that is not 0, and it is never below maxⱼ|xⱼ|), and [`norm2_int`],
//! the exact squared norm of an integer vector, saturating instead of overflowing, which every
//! exact integer check compares with its bound.
use crate::mechanisms::exact::{floor_log2, pow2};

/// ‖x‖ (or ‖(x, 1)‖ when `one`: the intercept's constant feature) computed without underflow
/// or overflow, as `hypot` does: scaled by the power of two 2^k that brings m = maxⱼ|xⱼ| into
/// [1, 2), squared and summed in order (then the 1), square-rooted and scaled back, and never
/// below m (round 52, review "unsafe", F1–F2). Scaling by a power of two is exact, so wherever
/// `(Σⱼ xⱼ² + 1).sqrt()` neither underflows nor overflows this returns the same bits; where it
/// did, it gave 0 for |xⱼ| ≤ 2⁻⁵³⁸ (so a clip never clipped and the kernels' "|f·xⱼ/q| < 2⁵¹"
/// was false) or ∞ for |xⱼ| ≥ 2⁵¹². Here the result is 0 only for x = 0 (without `one`), ∞ only
/// when the norm exceeds `f64::MAX` or some |xⱼ| is ∞, NaN when some xⱼ is NaN, and always
/// ≥ |xⱼ| for every j: what the range arguments of [`super::kernel`] need (a larger norm only
/// clips more, so a clip by it stays within its bound).
pub fn l2_norm(x: &[f64], one: bool) -> f64 {
    let mut m: f64 = if one { 1.0 } else { 0.0 };
    for &v in x {
        let a = v.abs();
        if a.is_nan() {
            return f64::NAN;
        }
        m = m.max(a);
    }
    if m == 0.0 || m.is_infinite() {
        return m;
    }
    // m = 2^e·(1 + frac), e ∈ [−1074, 1023]; the scale 2^−e as two factors of at most 2^537
    // each (2^1074 is not an f64). Each product below is exact unless it is negligible
    // (below 2⁻⁵¹¹ against a sum ≥ 1) or a final result past f64::MAX.
    let e = floor_log2(m);
    let (s1, s2) = (pow2(-e / 2), pow2(-e - (-e / 2)));
    let mut sum: f64 = x
        .iter()
        .map(|&v| {
            let t = v * s1 * s2;
            t * t
        })
        .sum();
    if one {
        let t = s1 * s2;
        sum += t * t;
    }
    (sum.sqrt() / s1 / s2).max(m)
}

/// Σⱼ vⱼ² of an integer vector, exact below `u128::MAX` and saturating there (round 52, review
/// "unsafe", F2: an `i128` sum of squares overflowed for two coordinates at `i64::MIN`, wrapped
/// negative in a release build and passed the check). Every exact integer check of the model
/// fits compares this with its bound squared.
#[inline]
pub fn norm2_int<T: Copy + Into<i128>>(v: &[T]) -> u128 {
    v.iter()
        .map(|&x| {
            let a = x.into().unsigned_abs();
            a.saturating_mul(a)
        })
        .fold(0u128, u128::saturating_add)
}

/// x rounded to the nearest integer (ties away from zero), saturating at the i64 range; NaN
/// gives 0. Native instructions only (`f64::round` is a libm call on baseline x86-64).
#[inline]
pub(crate) fn round_i64(x: f64) -> i64 {
    let t = x as i64; // truncation toward zero, saturating
    let r = x - t as f64;
    // Branch-free: the comparisons are unpredictable in the kernels' loops.
    t.saturating_add(i64::from(r >= 0.5))
        .saturating_sub(i64::from(r <= -0.5))
}

/// Per-example clipping into integers (the module docs of [`super::linreg`], "Exact sums").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clipper {
    /// The L2 bound on each contribution.
    pub clip: f64,
    /// The fixed-point unit q = 2^exp.
    pub exp: i32,
    /// ⌊clip/q⌋: the exact integer bound on ‖vᵢ‖.
    pub c_int: u64,
    /// The float target norm, clip − (√p + 1)·q (so that rounding to the grid stays within
    /// c_int).
    target: f64,
    inv_q: f64,
}

impl Clipper {
    /// The float target norm (see the field).
    #[inline]
    pub(crate) fn target(&self) -> f64 {
        self.target
    }

    /// 1/q = 2^−exp.
    #[inline]
    pub(crate) fn inv_q(&self) -> f64 {
        self.inv_q
    }

    /// This clipper with another float target norm: a target above `clip` makes the integer
    /// check fail for some rows (tests of the path that takes a failing row back out).
    #[cfg(test)]
    pub(crate) fn with_target(self, target: f64) -> Self {
        Clipper { target, ..self }
    }

    /// For a bound `clip` > 0, a grid 2^exp ≤ 2⁻¹⁰·clip and p coordinates.
    pub fn new(clip: f64, exp: i32, p: usize) -> Self {
        let q = pow2(exp);
        let c_int = (clip / q).floor() as u64;
        Clipper {
            clip,
            exp,
            c_int,
            // ‖round(g/q)‖ ≤ ‖g‖/q + √p/2 and c_int ≥ clip/q − 1: a float norm ≤ target keeps
            // the integer norm ≤ c_int with room for float error.
            target: (clip * (1.0 - 1e-12) - ((p as f64).sqrt() + 1.0) * q).max(0.0),
            inv_q: pow2(-exp),
        }
    }

    /// The contribution of one example: `out` = round(clip(r·x̃)/q) with x̃ = (x, 1) if
    /// `intercept`, and `nx` = ‖x̃‖. Returns false (and zeros `out`) when r is NaN or when the
    /// integer check Σ out² ≤ c_int² fails; then the row contributes 0. Whatever the inputs,
    /// on return Σ out² ≤ c_int².
    pub fn contribution(
        &self,
        x: &[f64],
        intercept: bool,
        r: f64,
        nx: f64,
        out: &mut [i64],
    ) -> bool {
        let norm = r.abs() * nx;
        // g = r·x̃ scaled to norm ≤ target: factor = r if ‖g‖ ≤ target, else sign(r)·target/nx.
        let f = if norm <= self.target {
            r
        } else if nx > 0.0 && nx.is_finite() {
            r.signum() * (self.target / nx)
        } else {
            0.0
        };
        let fq = f * self.inv_q;
        if !fq.is_finite() {
            out.fill(0);
            return false;
        }
        let d = x.len();
        for (o, &v) in out[..d].iter_mut().zip(x) {
            *o = round_i64(fq * v);
        }
        if intercept {
            out[d] = round_i64(fq);
        }
        let c = self.c_int;
        let ok = if c < SMALL_INT {
            // |v| ≤ c < 2^31: every square and the running sum (stopped at c²) fit in u64.
            let lim = c * c;
            let mut sq = 0u64;
            out.iter().all(|&v| {
                let a = v.unsigned_abs();
                a <= c && {
                    sq += a * a;
                    sq <= lim
                }
            })
        } else {
            norm2_int(out) <= (c as u128) * (c as u128)
        };
        if !ok {
            out.fill(0);
            return false;
        }
        true
    }
}

/// Below this bound on |vᵢⱼ| the integer arithmetic runs in 64 bits.
pub(crate) const SMALL_INT: u64 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::SecureRng;

    /// (Σ xⱼ² + 1).sqrt() as every fit computed it before round 52.
    fn naive(x: &[f64], one: bool) -> f64 {
        let s: f64 = x.iter().map(|v| v * v).sum();
        (s + if one { 1.0 } else { 0.0 }).sqrt()
    }

    /// Round 52, review "unsafe", F1–F2: the norm of features 2⁻⁵³⁸ (whose squares round to 0),
    /// 2⁻¹⁰⁷⁴ (the least subnormal), 1e308 (whose squares overflow) and mixtures is neither 0
    /// nor ∞, and never below maxⱼ|xⱼ|.
    #[test]
    fn l2_norm_neither_underflows_nor_overflows() {
        let tiny = pow2(-538);
        let least = pow2(-1074);
        assert_eq!(naive(&[tiny], false), 0.0); // what the fits read before
        assert_eq!(l2_norm(&[tiny], false), tiny);
        assert_eq!(l2_norm(&[-tiny], false), tiny);
        assert_eq!(
            l2_norm(&[tiny, tiny], false),
            tiny * std::f64::consts::SQRT_2
        );
        assert_eq!(l2_norm(&[tiny, -tiny, tiny, tiny], false), 2.0 * tiny);
        assert_eq!(l2_norm(&[least], false), least);
        // √2·2⁻¹⁰⁷⁴ rounds to 2⁻¹⁰⁷⁴ among subnormals; never below the largest entry.
        assert!(l2_norm(&[least, least], false) >= least);
        assert_eq!(l2_norm(&[3.0 * least, 4.0 * least], false), 5.0 * least);
        assert_eq!(l2_norm(&[tiny, least, 0.0], false), tiny);
        // With the intercept's 1, tiny features leave 1.
        assert_eq!(l2_norm(&[tiny, least], true), 1.0);
        assert_eq!(naive(&[1e308, 1e308], false), f64::INFINITY);
        assert_eq!(l2_norm(&[1e308], false), 1e308);
        let two = l2_norm(&[1e308, -1e308], false);
        assert!(
            (two / 1e308 - std::f64::consts::SQRT_2).abs() < 1e-15,
            "{two}"
        );
        let five = l2_norm(&[3e307, 4e307], true);
        assert!((five / 5e307 - 1.0).abs() < 1e-15, "{five}");
        // Past f64::MAX the norm is ∞ (then a row contributes only what a non-finite norm gives).
        assert_eq!(l2_norm(&[f64::MAX, f64::MAX], false), f64::INFINITY);
        assert_eq!(l2_norm(&[1e308, tiny, least, -2.0], true), 1e308);
        assert_eq!(l2_norm(&[], false), 0.0);
        assert_eq!(l2_norm(&[], true), 1.0);
        assert_eq!(l2_norm(&[0.0, -0.0], false), 0.0);
        assert_eq!(l2_norm(&[1.0, f64::NEG_INFINITY], false), f64::INFINITY);
        assert!(l2_norm(&[1.0, f64::NAN, f64::INFINITY], false).is_nan());
        assert!(l2_norm(&[f64::INFINITY, f64::NAN], true).is_nan());
    }

    /// Where the sum of squares neither underflows nor overflows, the same bits as before (the
    /// power-of-two scaling is exact), so every fit on ordinary data is unchanged; on every
    /// input the result is at least maxⱼ|xⱼ| and within a few ulps of the true norm.
    #[test]
    fn l2_norm_keeps_the_bits_of_ordinary_data() {
        let mut rng = SecureRng::insecure_from_seed(52);
        for trial in 0..20_000 {
            let d = rng.uniform_below(12) as usize;
            let one = trial % 2 == 0;
            // Magnitudes 2^−500 … 2^500: no square leaves the normal range.
            let e = rng.uniform_below(1000) as i32 - 500;
            let x: Vec<f64> = (0..d)
                .map(|_| {
                    let sign = if rng.coin() { 1.0 } else { -1.0 };
                    let mag = 0.5 + 0.5 * rng.uniform_f64();
                    sign * mag * pow2(e - rng.uniform_below(8) as i32)
                })
                .collect();
            let got = l2_norm(&x, one);
            assert_eq!(got.to_bits(), naive(&x, one).to_bits(), "{x:?} {one}");
            // Any magnitude at all: never below the largest entry, near the true norm.
            let wide: Vec<f64> = (0..d.max(1))
                .map(|_| (rng.uniform_f64() - 0.5) * pow2(rng.uniform_below(2090) as i32 - 1070))
                .collect();
            let n = l2_norm(&wide, one);
            let m = wide
                .iter()
                .fold(f64::from(u8::from(one)), |m, v| m.max(v.abs()));
            // (+ 2⁻¹⁰⁷⁴: a subnormal result rounds to a multiple of it.)
            let most = m * (wide.len() as f64 + 1.0).sqrt() * 1.000_001 + pow2(-1074);
            assert!(n >= m && n <= most, "{wide:?}");
        }
    }

    /// Round 52, review "unsafe", F2: two coordinates at i64::MIN square to 2¹²⁷, past i128;
    /// the saturating sum is exact there and saturates beyond.
    #[test]
    fn norm2_int_saturates() {
        assert_eq!(norm2_int(&[3i64, -4]), 25);
        assert_eq!(norm2_int(&[i64::MIN]), 1u128 << 126);
        assert_eq!(norm2_int(&[i64::MIN, i64::MIN]), 1u128 << 127);
        assert_eq!(norm2_int(&[i64::MIN; 5]), u128::MAX);
        assert_eq!(norm2_int(&[i128::MIN, 1]), u128::MAX);
        assert_eq!(norm2_int::<i64>(&[]), 0);
    }
}
