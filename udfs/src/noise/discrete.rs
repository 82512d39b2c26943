//! Exact discrete Gaussian and discrete Laplace samplers (Canonne, Kamath, Steinke, NeurIPS 2020,
//! "The Discrete Gaussian for Differential Privacy", Algorithms 1–3), in integer arithmetic only:
//! every Bernoulli(exp(−n/d)) is decided by comparing uniform integers, so no floating-point
//! value ever influences which integer is drawn.
use super::grid::granularity_for;
use super::rng::SecureRng;

/// Bernoulli(n/d), 0 ≤ n ≤ d, d > 0.
fn bernoulli_ratio(rng: &mut SecureRng, n: u128, d: u128) -> bool {
    rng.uniform_below(d) < n
}

/// Bernoulli(exp(−n/d)) for n ≥ 0, d > 0 (CKS 2020, Algorithm 1).
pub fn bernoulli_exp(rng: &mut SecureRng, n: u128, d: u128) -> bool {
    if n <= d {
        // γ = n/d ∈ [0, 1]: K = 1; while Bernoulli(γ/K) { K += 1 }; return K odd.
        let mut k: u128 = 1;
        loop {
            let Some(dk) = d.checked_mul(k) else {
                // K so large has probability < 1/K!; treat as the end of the loop.
                return k % 2 == 1;
            };
            if !bernoulli_ratio(rng, n, dk) {
                return k % 2 == 1;
            }
            k += 1;
        }
    } else {
        // γ > 1: ⌊γ⌋ independent Bernoulli(e^{-1}) must all succeed, then Bernoulli(e^{-frac}).
        for _ in 0..(n / d) {
            if !bernoulli_exp(rng, 1, 1) {
                return false;
            }
        }
        bernoulli_exp(rng, n % d, d)
    }
}

/// Y with P(Y = y) ∝ exp(−|y|/t), t ≥ 1 an integer (CKS 2020, Algorithm 2 with s = 1).
pub fn discrete_laplace_int(rng: &mut SecureRng, t: u128) -> i128 {
    assert!(t >= 1);
    loop {
        let u = rng.uniform_below(t);
        if !bernoulli_exp(rng, u, t) {
            continue;
        }
        let mut v: u128 = 0;
        while bernoulli_exp(rng, 1, 1) {
            v += 1;
        }
        let x = u + t * v;
        let negative = rng.coin();
        if negative && x == 0 {
            continue;
        }
        return if negative { -(x as i128) } else { x as i128 };
    }
}

/// Y ~ N_Z(0, s²), the discrete Gaussian with integer scale s ≥ 1 (CKS 2020, Algorithm 3 with
/// σ² = s²): t = s + 1; draw Y discrete Laplace(t) and accept with probability
/// exp(−(|Y| − σ²/t)²/(2σ²)) = exp(−(|Y|·t − s²)²/(2 s² t²)).
///
/// s < 2^28 keeps the arithmetic exact in u128: the denominator is < 2^115, and the squared
/// numerator overflows only when |Y| > 2^64/t ≥ 2^8·s, whose acceptance probability is below
/// exp(−2^14); such a draw is rejected (an exact rejection of an event that practically never
/// happens, which changes the distribution by less than e^{−16000}).
pub fn discrete_gaussian_int(rng: &mut SecureRng, s: u128) -> i128 {
    assert!(
        (1..(1u128 << 28)).contains(&s),
        "discrete Gaussian scale {s}"
    );
    let t = s + 1;
    let s2 = s * s;
    let den = 2 * s2 * t * t;
    loop {
        let y = discrete_laplace_int(rng, t);
        let a = y.unsigned_abs();
        let diff = (a * t).abs_diff(s2);
        let Some(num) = diff.checked_mul(diff) else {
            continue; // acceptance probability below exp(−2^40): reject
        };
        if bernoulli_exp(rng, num, den) {
            return y;
        }
    }
}

/// The integer number of grid steps for a noise scale: ⌈scale/g⌉ (never less noise than asked).
pub fn steps_for(scale: f64, granularity: f64) -> u128 {
    (scale / granularity).ceil() as u128
}

/// A sample of g·Y with Y ~ N_Z(0, ⌈σ/g⌉²), g = `granularity` (a power of two). The standard
/// deviation used is ⌈σ/g⌉·g ≥ σ.
pub fn sample_discrete_gaussian(rng: &mut SecureRng, sigma: f64, granularity: f64) -> f64 {
    discrete_gaussian_int(rng, steps_for(sigma, granularity)) as f64 * granularity
}

/// A sample of g·Y with P(Y = y) ∝ exp(−|y|/⌈b/g⌉), the discrete Laplace of scale ⌈b/g⌉·g ≥ b.
pub fn sample_discrete_laplace(rng: &mut SecureRng, scale: f64, granularity: f64) -> f64 {
    discrete_laplace_int(rng, steps_for(scale, granularity)) as f64 * granularity
}

/// The grid a sampler would choose for `scale` (see [`granularity_for`]).
pub fn default_granularity(scale: f64) -> f64 {
    granularity_for(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample variance of n draws and the tolerance: the sample variance of n i.i.d. draws has
    /// relative standard deviation √((κ − 1)/n) with κ the kurtosis (3 Gaussian, 6 Laplace);
    /// we accept 5 standard deviations. At n = 200 000 that is 1.6% (Gaussian) and 2.5%
    /// (Laplace), while a noise scale 10% off moves the variance by ≥ 19%.
    fn check_variance(draws: &[f64], want_var: f64, kurtosis: f64) {
        let n = draws.len() as f64;
        let mean = draws.iter().sum::<f64>() / n;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let tol = 5.0 * ((kurtosis - 1.0) / n).sqrt();
        assert!(
            (var / want_var - 1.0).abs() < tol,
            "var {var} want {want_var} tol {tol}"
        );
        // The mean: sd √(var/n); 5 sd.
        assert!(mean.abs() < 5.0 * (want_var / n).sqrt(), "mean {mean}");
        // The test would fail for a 10% scale error:
        assert!((1.1f64.powi(2) - 1.0) > tol && (1.0 - 0.9f64.powi(2)) > tol);
    }

    #[test]
    fn bernoulli_exp_rates() {
        // 100 000 draws of Bernoulli(e^{-γ}); binomial sd ≤ 0.0016; tolerance 5 sd = 0.008.
        let mut rng = SecureRng::insecure_from_seed(3);
        for (n, d) in [(1u128, 2u128), (1, 1), (5, 2), (0, 1)] {
            let p = (-(n as f64) / d as f64).exp();
            let hits = (0..100_000)
                .filter(|_| bernoulli_exp(&mut rng, n, d))
                .count();
            let got = hits as f64 / 100_000.0;
            assert!((got - p).abs() < 0.008, "{n}/{d}: {got} vs {p}");
        }
    }

    #[test]
    fn discrete_gaussian_variance_200k() {
        // Large scale (the grid regime: s ≈ 2^20): Var N_Z(0, s²) = s²(1 − O(e^{−2π²s²})).
        let mut rng = SecureRng::insecure_from_seed(42);
        let sigma = 3.7;
        let g = granularity_for(sigma);
        let draws: Vec<f64> = (0..200_000)
            .map(|_| sample_discrete_gaussian(&mut rng, sigma, g))
            .collect();
        assert!(draws.iter().all(|x| (x / g).fract() == 0.0), "on the grid");
        let s = steps_for(sigma, g) as f64 * g;
        check_variance(&draws, s * s, 3.0);
    }

    #[test]
    fn discrete_gaussian_small_scale_exact_pmf() {
        // s = 2: compare frequencies of 0, ±1, ±2 with the exact pmf ∝ exp(−y²/8) over 100 000
        // draws (binomial sd ≤ 0.0016; tolerance 0.008).
        let mut rng = SecureRng::insecure_from_seed(5);
        let z: f64 = (-60..=60).map(|y: i32| (-(y * y) as f64 / 8.0).exp()).sum();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            *counts
                .entry(discrete_gaussian_int(&mut rng, 2))
                .or_insert(0u32) += 1;
        }
        for y in -2i128..=2 {
            let p = (-(y * y) as f64 / 8.0).exp() / z;
            let got = *counts.get(&y).unwrap_or(&0) as f64 / 100_000.0;
            assert!((got - p).abs() < 0.008, "{y}: {got} vs {p}");
        }
    }

    #[test]
    fn discrete_laplace_variance_200k() {
        // Discrete Laplace with large integer scale t: variance ≈ 2t² (continuous limit; the
        // exact value 2e^{-1/t}/(1−e^{-1/t})² differs by O(1/t²) relative).
        let mut rng = SecureRng::insecure_from_seed(43);
        let b = 12.5;
        let g = granularity_for(b);
        let draws: Vec<f64> = (0..200_000)
            .map(|_| sample_discrete_laplace(&mut rng, b, g))
            .collect();
        let t = steps_for(b, g) as f64;
        let q = (-1.0 / t).exp();
        let var_units = 2.0 * q / (1.0 - q).powi(2);
        check_variance(&draws, var_units * g * g, 6.0);
    }
}
