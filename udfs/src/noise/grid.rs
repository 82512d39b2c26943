//! The power-of-two grid on which noise and released values live.
//!
//! A release is round_g(x) + g·Y with Y an integer and g a power of two; every such value is
//! exactly representable, so the output carries no floating-point artefacts of the noise
//! (Mironov 2012's attack reads them off the low bits of x + Laplace noise). g is chosen
//! 2^20 to 2^21 times smaller than the noise scale, so the grid is far below the noise.

/// Bits of noise-scale resolution: scale/g ∈ [2^20, 2^21).
pub const GRID_BITS: i32 = 20;

/// The grid step for a noise scale s > 0: the power of two g with s/g in [2^20, 2^21).
pub fn granularity_for(scale: f64) -> f64 {
    assert!(scale.is_finite() && scale > 0.0, "noise scale {scale}");
    let mut e = scale.log2().floor() as i32;
    // Correct a possible off-by-one of log2 near powers of two.
    while 2f64.powi(e) > scale {
        e -= 1;
    }
    while 2f64.powi(e + 1) <= scale {
        e += 1;
    }
    2f64.powi(e - GRID_BITS)
}

/// The largest ratio scale/g any sampler accepts (the discrete Gaussian's integer arithmetic
/// stays exact below it; see `discrete::discrete_gaussian_int`).
pub const MAX_STEPS_LOG2: i32 = 28;

/// The grid step for a mechanism with noise scale `scale` and sensitivity Δ: at least 2^20
/// times finer than both (so that rounding to the grid adds at most Δ·2^-20 to the
/// sensitivity), but never finer than scale·2^-27 (so that scale/g < 2^28).
pub fn granularity_for_mechanism(scale: f64, sensitivity: f64) -> f64 {
    let base = sensitivity
        .min(scale)
        .max(scale * 2f64.powi(GRID_BITS + 1 - MAX_STEPS_LOG2));
    granularity_for(base)
}

/// x rounded to the nearest multiple of g (a power of two), ties away from zero: exact in f64
/// (x/g and the product are exact scalings by a power of two; `round` is exact).
pub fn round_to_grid(x: f64, g: f64) -> f64 {
    (x / g).round() * g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_step() {
        for s in [1e-9, 0.3, 1.0, 2.0, 3.0, 1024.0, 1e12, 805.76] {
            let g = granularity_for(s);
            assert_eq!(g.log2().fract(), 0.0);
            let r = s / g;
            assert!((1048576.0..2097152.0).contains(&r), "{s}: {r}");
        }
        assert_eq!(granularity_for(1.0), 2f64.powi(-20));
        assert_eq!(round_to_grid(0.3, 0.25), 0.25);
        // Mechanism grid: finer than Δ when the noise is large, capped at 2^28 steps.
        assert_eq!(granularity_for_mechanism(10.0, 1.0), 2f64.powi(-20));
        assert_eq!(granularity_for_mechanism(0.5, 1.0), 2f64.powi(-21));
        assert!(1e9 / granularity_for_mechanism(1e9, 1.0) < 2f64.powi(28));
        assert_eq!(round_to_grid(-0.375, 0.25), -0.5);
        assert_eq!(round_to_grid(1e300, 0.25), 1e300);
    }
}
