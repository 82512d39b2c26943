//! Per-example clipping of a gradient into exact integers ([`Clipper`]) and the rounding it uses
//! ([`round_i64`]): shared by the DP-GD kernels ([`super::linreg`], [`super::kernel`]) and DP-SGD
//! ([`super::sgd`]). The proof that Σ out² ≤ c_int² whatever the inputs is beside
//! [`Clipper::contribution`]; the fixed-point grid is the one of the module docs of
//! [`super::linreg`] ("Exact sums").
use crate::mechanisms::exact::pow2;

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
            let sq: u128 = out
                .iter()
                .map(|&v| (v.unsigned_abs() as u128) * (v.unsigned_abs() as u128))
                .fold(0u128, |a, b| a.saturating_add(b));
            sq <= (c as u128) * (c as u128)
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
