//! Gaussian differential privacy (Dong, Roth, Su 2019): the exact (ε, δ) curve of μ-GDP.
use super::normal::log_phi;

/// δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) for μ-GDP (Dong, Roth, Su 2019, Cor. 2.13; the same
/// curve is Balle and Wang 2018, Thm. 8, for the Gaussian mechanism with μ = Δ/σ).
///
/// Computed as Φ(a)·(1 − exp(ε + ln Φ(b) − ln Φ(a))) with logs of Φ, so that neither e^ε
/// overflows nor the difference cancels when δ is tiny.
pub fn gdp_delta(epsilon: f64, mu: f64) -> f64 {
    if mu <= 0.0 {
        return 0.0;
    }
    if mu.is_infinite() {
        return 1.0;
    }
    let a = -epsilon / mu + mu / 2.0;
    let b = -epsilon / mu - mu / 2.0;
    let la = log_phi(a);
    if la == f64::NEG_INFINITY {
        return 0.0; // Φ(a) = 0: the first term, and so δ, is 0.
    }
    let lb = epsilon + log_phi(b);
    let d = la.exp() * -(lb - la).exp_m1();
    d.clamp(0.0, 1.0)
}

/// The smallest ε ≥ 0 with gdp_delta(ε, μ) ≤ δ, by bisection on a doubling bracket, rounded up
/// (the returned ε is the upper end of the final bracket, so gdp_delta(ε) ≤ δ holds for it).
/// +∞ when δ ≤ 0 (and μ > 0).
pub fn gdp_epsilon(mu: f64, delta: f64) -> f64 {
    if mu <= 0.0 {
        return 0.0;
    }
    if delta <= 0.0 || !mu.is_finite() {
        return f64::INFINITY;
    }
    if gdp_delta(0.0, mu) <= delta {
        return 0.0;
    }
    // δ(ε) is strictly decreasing in ε: find hi with δ(hi) ≤ δ.
    let mut lo = 0.0;
    let mut hi = 1.0f64.max(mu * mu);
    while gdp_delta(hi, mu) > delta {
        lo = hi;
        hi *= 2.0;
        if !hi.is_finite() {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if gdp_delta(mid, mu) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::test_vectors as vectors;

    #[test]
    fn matches_dp_accounting_exact_gdp() {
        // reference/accounting_vectors.json, gaussian_composition: μ = √T / z; tolerance 1e-6 rel.
        for v in vectors()["gaussian_composition"].as_array().unwrap() {
            let z = v["noise_multiplier"].as_f64().unwrap();
            let t = v["steps"].as_f64().unwrap();
            let delta = v["delta"].as_f64().unwrap();
            let want = v["eps_exact_gdp"].as_f64().unwrap();
            let got = gdp_epsilon(t.sqrt() / z, delta);
            assert!(
                (got / want - 1.0).abs() < 1e-6,
                "z={z} T={t}: {got} vs {want}"
            );
            assert!(gdp_delta(got, t.sqrt() / z) <= delta);
        }
    }

    #[test]
    fn closed_form_at_zero() {
        // δ(0) = Φ(μ/2) − Φ(−μ/2) = 2Φ(μ/2) − 1: for μ = 1, 0.38292492254802624.
        assert!((gdp_delta(0.0, 1.0) - 0.382_924_922_548_026_24).abs() < 1e-14);
        assert_eq!(gdp_epsilon(1e-9, 1e-6), 0.0);
        assert_eq!(gdp_epsilon(1.0, 0.0), f64::INFINITY);
        // Far tail stays finite and monotone.
        assert!(gdp_delta(500.0, 1.0) >= 0.0);
        assert!(gdp_epsilon(1.0, 1e-300).is_finite());
    }
}
