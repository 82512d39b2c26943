//! The fixed grid of Rényi orders α on which every RDP curve is stored.
//!
//! α − 1 runs geometrically from 10⁻³ to 10⁶ with 100 points per decade:
//! α = 1 + 10^(k/100) for k = −300, …, 600 (901 orders).
//!
//! Why this grid: the RDP→(ε, δ) conversion of Canonne, Kamath, Steinke (2020, Prop. 12)
//! minimises a function of α that is smooth in log(α − 1); a step of 10^0.01 in α − 1 puts every
//! continuous optimum within a factor 10^0.005 of a grid point, which costs at most a few 10⁻⁵
//! relative in ε (measured in `tests::grid_is_dense_enough` against the continuous optimum for
//! zCDP curves from ρ = 10⁻⁴ to 10 and δ from 10⁻¹² to 10⁻³; bound required: 10⁻³). The range
//! covers the optimal orders of every budget this project accepts: α* − 1 ≈ √(ln(1/δ)/ρ) is in
//! [10⁻³, 10⁶] for ρ ∈ [10⁻¹⁰, 10⁴] and δ ≥ 10⁻³⁰⁰. Orders outside the grid are never used,
//! which can only over-report ε (each grid point gives a valid bound).
use std::sync::LazyLock;

/// Points per decade of α − 1.
pub const PER_DECADE: i32 = 100;
/// Smallest and largest exponent k in α = 1 + 10^(k/100).
pub const K_MIN: i32 = -300;
pub const K_MAX: i32 = 600;

/// The orders α, increasing.
pub static ORDERS: LazyLock<Vec<f64>> = LazyLock::new(|| {
    (K_MIN..=K_MAX)
        .map(|k| 1.0 + 10f64.powf(k as f64 / PER_DECADE as f64))
        .collect()
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_shape() {
        assert_eq!(ORDERS.len(), 901);
        assert!((ORDERS[0] - 1.001).abs() < 1e-15);
        assert!((ORDERS[900] - 1_000_001.0).abs() < 1e-6);
        assert!(ORDERS.windows(2).all(|w| w[0] < w[1]));
    }

    /// The CKS objective for a ρ-zCDP curve (PRIVACY.md references, Prop. 12 form).
    fn cks_zcdp(rho: f64, delta: f64, a: f64) -> f64 {
        rho * a + ((1.0 / delta).ln() + (a - 1.0) * (1.0 - 1.0 / a).ln() - a.ln()) / (a - 1.0)
    }

    #[test]
    fn grid_is_dense_enough() {
        // Continuous optimum by a 10⁵-point scan of log(α − 1) ∈ [−4, 7] (step 1.1e-4 decades).
        let mut worst: f64 = 0.0;
        for rho in [1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0] {
            for delta in [1e-12, 1e-9, 1e-6, 1e-3] {
                let fine = (0..100_000)
                    .map(|i| 1.0 + 10f64.powf(-4.0 + 11.0 * i as f64 / 100_000.0))
                    .map(|a| cks_zcdp(rho, delta, a))
                    .fold(f64::INFINITY, f64::min);
                let grid = ORDERS
                    .iter()
                    .map(|&a| cks_zcdp(rho, delta, a))
                    .fold(f64::INFINITY, f64::min);
                assert!(grid >= fine * (1.0 - 1e-12), "grid below the optimum");
                worst = worst.max(grid / fine - 1.0);
            }
        }
        assert!(worst < 1e-4, "grid relative excess {worst}");
    }
}
