//! Calibration: from a target (ε, δ) to the mechanism's noise, and back.
use super::cks::cks_term;
use super::error::{PrivacyError, check_delta, check_epsilon, check_positive};
use super::gdp::{gdp_delta, gdp_epsilon};
use super::grid::ORDERS;

/// The largest per-call epsilon a Gaussian mechanism accepts.
pub const MAX_EPSILON: f64 = 1e7;

/// The largest μ whose μ-GDP curve meets (ε, δ): gdp_delta(ε, μ) ≤ δ (Dong, Roth, Su 2019,
/// Cor. 2.13, which for one Gaussian release is the analytic Gaussian condition of Balle and
/// Wang 2018, Thm. 8). Found by bisection; rounded down (the returned μ satisfies the condition).
///
/// Remembered per (ε, δ) (a pure function of its arguments: the cache returns the value the
/// bisection returned): planning and every partition's accumulator ask for the same pair, and
/// the bisection (about 60 evaluations of two `erfc`) was most of a query's fixed cost
/// (issue 32). Errors are not remembered.
pub fn gaussian_mu(epsilon: f64, delta: f64) -> Result<f64, PrivacyError> {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    static MEMO: LazyLock<Mutex<HashMap<(u64, u64), f64>>> = LazyLock::new(Default::default);
    let key = (epsilon.to_bits(), delta.to_bits());
    let cached = MEMO.lock().ok().and_then(|m| m.get(&key).copied());
    if let Some(mu) = cached {
        return Ok(mu);
    }
    let mu = gaussian_mu_bisect(epsilon, delta)?;
    if let Ok(mut m) = MEMO.lock() {
        if m.len() >= 4096 {
            m.clear();
        }
        m.insert(key, mu);
    }
    Ok(mu)
}

/// [`gaussian_mu`] without the cache.
fn gaussian_mu_bisect(epsilon: f64, delta: f64) -> Result<f64, PrivacyError> {
    check_epsilon("epsilon", epsilon)?;
    if epsilon > MAX_EPSILON {
        return Err(PrivacyError::invalid(
            "epsilon",
            epsilon,
            "at most 1e7 (a larger epsilon protects nothing and its noise is not representable)",
        ));
    }
    check_delta("delta", delta)?;
    // δ(ε, μ) is increasing in μ. Bracket [lo, hi] with δ(lo) ≤ δ < δ(hi).
    let mut lo = 0.0f64;
    let mut hi = 1.0f64;
    while gdp_delta(epsilon, hi) <= delta {
        lo = hi;
        hi *= 2.0;
        if hi > 1e12 {
            return Err(PrivacyError::Infeasible(format!(
                "no Gaussian noise level found for epsilon = {epsilon}, delta = {delta}"
            )));
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if gdp_delta(epsilon, mid) <= delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo <= 0.0 {
        return Err(PrivacyError::Infeasible(format!(
            "epsilon = {epsilon} and delta = {delta} are too small for any Gaussian noise"
        )));
    }
    Ok(lo)
}

/// σ of the analytic Gaussian mechanism (Balle and Wang 2018, Thm. 8) = Δ/μ with μ from
/// [`gaussian_mu`]. Rounded up (μ is rounded down).
pub fn analytic_gaussian_sigma(
    epsilon: f64,
    delta: f64,
    sensitivity: f64,
) -> Result<f64, PrivacyError> {
    check_positive("sensitivity", sensitivity)?;
    Ok(sensitivity / gaussian_mu(epsilon, delta)?)
}

/// σ for `steps` Gaussian releases of sensitivity Δ each that compose exactly to (ε, δ) under
/// GDP: T releases of μ₁-GDP compose to √T·μ₁-GDP (Dong, Roth, Su 2019, Cor. 3.3), so
/// σ = Δ·√T/μ. Rounded up.
pub fn gaussian_sigma_for_steps(
    epsilon: f64,
    delta: f64,
    sensitivity: f64,
    steps: u64,
) -> Result<f64, PrivacyError> {
    check_positive("sensitivity", sensitivity)?;
    if steps == 0 {
        return Err(PrivacyError::invalid("steps", steps, "an integer >= 1"));
    }
    let mu = gaussian_mu(epsilon, delta)?;
    Ok(sensitivity * (steps as f64).sqrt() / mu)
}

/// ε of `steps` Gaussian releases with noise multiplier z = σ/Δ at δ: exact GDP with
/// μ = √T/z (Dong, Roth, Su 2019, Cor. 3.3 and 2.13). Rounded up.
pub fn gaussian_epsilon(
    noise_multiplier: f64,
    steps: u64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    check_positive("noise_multiplier", noise_multiplier)?;
    check_delta("delta", delta)?;
    if steps == 0 {
        return Err(PrivacyError::invalid("steps", steps, "an integer >= 1"));
    }
    Ok(gdp_epsilon((steps as f64).sqrt() / noise_multiplier, delta))
}

/// ε of ρ-zCDP at δ by CKS 2020 (Prop. 12) applied to the RDP curve ρα (Bun and Steinke 2016,
/// Def. 1.1), minimised over α: first on the order grid, then refined by golden-section search
/// between the neighbours of the best grid order (the objective is closed-form here, so the
/// refinement is exact arithmetic on a valid bound at every α it visits). Rounded up by 1e-12
/// relative.
pub fn zcdp_epsilon(rho: f64, delta: f64) -> Result<f64, PrivacyError> {
    check_positive("rho", rho)?;
    check_delta("delta", delta)?;
    Ok(zcdp_epsilon_unchecked(rho, delta))
}

fn zcdp_epsilon_unchecked(rho: f64, delta: f64) -> f64 {
    let f = |a: f64| cks_term(rho * a, a, delta);
    let (mut best_i, mut best) = (0usize, f64::INFINITY);
    for (i, &a) in ORDERS.iter().enumerate() {
        let v = f(a);
        if v < best {
            best = v;
            best_i = i;
        }
    }
    let mut lo = ORDERS[best_i.saturating_sub(1)];
    let mut hi = ORDERS[(best_i + 1).min(ORDERS.len() - 1)];
    let r = 0.5 * (5f64.sqrt() - 1.0);
    for _ in 0..100 {
        let x1 = hi - r * (hi - lo);
        let x2 = lo + r * (hi - lo);
        let (f1, f2) = (f(x1), f(x2));
        best = best.min(f1).min(f2);
        if f1 < f2 {
            hi = x2;
        } else {
            lo = x1;
        }
    }
    best.max(0.0) * (1.0 + 1e-12)
}

/// The largest ρ whose ρ-zCDP curve the accountant converts to at most ε at δ: the inverse of the
/// CKS conversion (Canonne, Kamath, Steinke 2020, Prop. 12) minimised over the same order grid
/// as [`Profile::epsilon`](super::Profile::epsilon), by bisection, rounded down. Inverting the
/// accountant's own arithmetic (rather than the continuous optimum of [`zcdp_epsilon`], which is
/// up to 1e-4 relative smaller) makes a call with parameters (ε, δ) charge at most ε, not ε plus
/// the grid's error.
pub fn zcdp_rho(epsilon: f64, delta: f64) -> Result<f64, PrivacyError> {
    check_epsilon("epsilon", epsilon)?;
    check_delta("delta", delta)?;
    let charged = |rho: f64| super::Profile::from_event(&super::Event::Zcdp { rho }).epsilon(delta);
    let mut lo = 0.0f64;
    let mut hi = epsilon.max(1.0);
    while charged(hi) <= epsilon {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if charged(mid) <= epsilon {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo <= 0.0 {
        return Err(PrivacyError::Infeasible(format!(
            "no rho > 0 meets epsilon = {} at delta = {}",
            super::error::literal_text(epsilon),
            super::error::literal_text(delta)
        )));
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    /// The cache returns what the bisection returns, for repeated and new pairs, and errors
    /// stay errors.
    #[test]
    fn gaussian_mu_cache_returns_the_bisection() {
        for (e, d) in [
            (1.0, 1e-6),
            (0.1, 1e-9),
            (1.0, 1e-6),
            (3.7, 1e-5),
            (0.1, 1e-9),
        ] {
            assert_eq!(
                super::gaussian_mu(e, d).unwrap(),
                super::gaussian_mu_bisect(e, d).unwrap()
            );
        }
        for _ in 0..2 {
            assert!(super::gaussian_mu(-1.0, 1e-6).is_err());
        }
    }

    use super::*;
    use crate::privacy::test_vectors as vectors;

    #[test]
    fn analytic_gaussian_matches_dp_accounting() {
        // reference vectors (dp-accounting), tolerance 1e-6 relative, and never below.
        for v in vectors()["analytic_gaussian"].as_array().unwrap() {
            let e = v["epsilon"].as_f64().unwrap();
            let d = v["delta"].as_f64().unwrap();
            let s = v["sensitivity"].as_f64().unwrap();
            let want = v["sigma"].as_f64().unwrap();
            let got = analytic_gaussian_sigma(e, d, s).unwrap();
            assert!(
                (got / want - 1.0).abs() < 1e-6,
                "{e} {d} {s}: {got} vs {want}"
            );
            assert!(got >= want * (1.0 - 1e-9), "σ must round up");
        }
    }

    #[test]
    fn gaussian_composition_matches_dp_accounting() {
        for v in vectors()["gaussian_composition"].as_array().unwrap() {
            let z = v["noise_multiplier"].as_f64().unwrap();
            let t = v["steps"].as_u64().unwrap();
            let d = v["delta"].as_f64().unwrap();
            let want = v["eps_exact_gdp"].as_f64().unwrap();
            let got = gaussian_epsilon(z, t, d).unwrap();
            assert!((got / want - 1.0).abs() < 1e-6, "{got} vs {want}");
            // Round trip: σ for T steps at that ε gives back z (to 1e-6).
            let s = gaussian_sigma_for_steps(got, d, 1.0, t).unwrap();
            assert!((s / z - 1.0).abs() < 1e-6, "{s} vs {z}");
        }
    }

    #[test]
    fn zcdp_matches_dp_accounting() {
        for v in vectors()["zcdp_to_approx"].as_array().unwrap() {
            let rho = v["rho"].as_f64().unwrap();
            let d = v["delta"].as_f64().unwrap();
            let want = v["eps_cks2020"].as_f64().unwrap();
            let got = zcdp_epsilon(rho, d).unwrap();
            assert!((got / want - 1.0).abs() < 1e-6, "{got} vs {want}");
            assert!(got >= want * (1.0 - 1e-9));
            // CKS is tighter than Bun–Steinke's ρ + 2√(ρ ln(1/δ)).
            assert!(got <= v["eps_bun_steinke"].as_f64().unwrap());
            // The inverse uses the accountant's grid, within 1e-4 relative of the continuous
            // optimum (grid.rs), and never charges more than it was asked for.
            let back = zcdp_rho(got, d).unwrap();
            assert!(back <= rho * (1.0 + 1e-12), "{back} vs {rho}");
            assert!((back / rho - 1.0).abs() < 2e-4, "{back} vs {rho}");
            assert!(zcdp_epsilon(back, d).unwrap() <= got);
            let charged =
                crate::privacy::Profile::from_event(&crate::privacy::Event::Zcdp { rho: back })
                    .epsilon(d);
            assert!(charged <= got, "{charged} > {got}");
        }
    }

    #[test]
    fn bad_arguments_name_themselves() {
        let e = analytic_gaussian_sigma(0.0, 1e-6, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'epsilon'"), "{e}");
        let e = analytic_gaussian_sigma(1.0, 1.5, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'delta'"), "{e}");
        let e = analytic_gaussian_sigma(1.0, 1e-6, -1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'sensitivity'"), "{e}");
        assert!(gaussian_epsilon(1.0, 0, 1e-6).is_err());
        assert!(zcdp_epsilon(f64::NAN, 1e-6).is_err());
    }
}
