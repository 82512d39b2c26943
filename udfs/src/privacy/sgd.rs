//! Accounting of the Poisson-subsampled Gaussian mechanism (DP-SGD): one step releases
//! Σ_{i∈B} clip(gᵢ) + N(0, σ²I), B a Poisson sample (each row independently with probability
//! q), noise multiplier z = σ/Δ.
//!
//! PLACEHOLDER (conservative): the RDP curve of one step is the exact integer-order formula of
//! Mironov, Talwar and Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism"
//! (2019), §3.3 (add/remove neighbours):
//!   A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k exp((k² − k)/(2z²)),  ε(α) = ln A_α/(α − 1),
//! taken at ⌈α⌉ for a fractional order (an RDP curve is non-decreasing in α: Mironov 2017,
//! Prop. 9), and never above the non-subsampled Gaussian's α/(2z²) (Mironov 2017, Prop. 7).
//! T steps compose by adding curves (Mironov 2017, Prop. 1) and (ε, δ) is read by the
//! Canonne–Kamath–Steinke conversion ([`super::cks`]), an upper bound on the PLD ε.
//! The PLD accountant of issue 30 replaces this file; its signatures are fixed.
use super::PrivacyError;
use super::cks::cks_term;

/// Largest integer order evaluated by the binomial sum; above it the Gaussian bound is used.
const MAX_BINOMIAL_ORDER: u64 = 1024;

fn check(sample_rate: f64, noise_multiplier: Option<f64>, delta: f64) -> Result<(), PrivacyError> {
    if !(sample_rate > 0.0 && sample_rate <= 1.0) {
        return Err(PrivacyError::invalid(
            "sample_rate",
            sample_rate,
            "a number in (0, 1]",
        ));
    }
    if let Some(z) = noise_multiplier
        && !(z.is_finite() && z > 0.0)
    {
        return Err(PrivacyError::invalid(
            "noise_multiplier",
            z,
            "a finite number > 0",
        ));
    }
    if !(delta > 0.0 && delta < 1.0) {
        return Err(PrivacyError::invalid("delta", delta, "a number in (0, 1)"));
    }
    Ok(())
}

/// ln A_α at integer α ≥ 2 (module docs), by log-sum-exp.
fn log_a(q: f64, z: f64, alpha: u64) -> f64 {
    if q >= 1.0 {
        return alpha as f64 * (alpha as f64 - 1.0) / (2.0 * z * z);
    }
    let (lq, l1q) = (q.ln(), (-q).ln_1p());
    let a = alpha as f64;
    let mut terms = Vec::with_capacity(alpha as usize + 1);
    let mut lbinom = 0.0; // ln C(α, k)
    for k in 0..=alpha {
        let kf = k as f64;
        if k > 0 {
            lbinom += ((a - kf + 1.0) / kf).ln();
        }
        terms.push(lbinom + (a - kf) * l1q + kf * lq + (kf * kf - kf) / (2.0 * z * z));
    }
    let m = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()
}

/// RDP ε(α) of ONE step at order α > 1 (module docs); +∞ for invalid parameters.
pub fn rdp(sample_rate: f64, noise_multiplier: f64, alpha: f64) -> f64 {
    let (q, z) = (sample_rate, noise_multiplier);
    if !(q > 0.0 && q <= 1.0 && z.is_finite() && z > 0.0 && alpha > 1.0) {
        return f64::INFINITY;
    }
    let gaussian = alpha / (2.0 * z * z);
    let a = alpha.ceil().max(2.0);
    if a > MAX_BINOMIAL_ORDER as f64 {
        return gaussian;
    }
    let v = log_a(q, z, a as u64) / (a - 1.0);
    // Round outward (float error of the sum).
    let v = v.max(0.0) * (1.0 + 1e-9);
    if v.is_nan() {
        gaussian
    } else {
        v.min(gaussian)
    }
}

/// The standalone ε at δ of `steps` subsampled Gaussian steps.
pub fn epsilon(
    sample_rate: f64,
    noise_multiplier: f64,
    steps: u64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    check(sample_rate, Some(noise_multiplier), delta)?;
    if steps == 0 {
        return Ok(0.0);
    }
    let t = steps as f64;
    let mut best = f64::INFINITY;
    for a in 2..=256u64 {
        let e = cks_term(
            t * rdp(sample_rate, noise_multiplier, a as f64),
            a as f64,
            delta,
        );
        best = best.min(e);
    }
    for a in [384.0, 512.0, 768.0, 1024.0, 4096.0, 16384.0, 65536.0] {
        best = best.min(cks_term(
            t * rdp(sample_rate, noise_multiplier, a),
            a,
            delta,
        ));
    }
    Ok(best.max(0.0))
}

/// The smallest noise multiplier (on a bisection grid, rounded toward more noise) for which
/// `steps` steps are (ε, δ)-DP by [`epsilon`].
pub fn noise_multiplier(
    sample_rate: f64,
    steps: u64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    check(sample_rate, None, delta)?;
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(PrivacyError::invalid(
            "epsilon",
            epsilon,
            "a finite number > 0",
        ));
    }
    if steps == 0 {
        return Err(PrivacyError::invalid("steps", steps, "an integer ≥ 1"));
    }
    let eps = |z: f64| self::epsilon(sample_rate, z, steps, delta);
    let (mut lo, mut hi) = (1e-3, 1.0);
    while eps(hi)? > epsilon {
        lo = hi;
        hi *= 2.0;
        if hi > 1e9 {
            return Err(PrivacyError::Infeasible(format!(
                "no noise multiplier up to 1e9 reaches ε = {epsilon} at δ = {delta}"
            )));
        }
    }
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if eps(mid)? > epsilon {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-6 * hi {
            break;
        }
    }
    Ok(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_sampling_is_the_gaussian_curve_and_subsampling_lowers_it() {
        for a in [2.0, 3.0, 10.0] {
            assert!((rdp(1.0, 2.0, a) - a / 8.0).abs() < 1e-9);
            assert!(rdp(0.01, 2.0, a) < rdp(1.0, 2.0, a));
        }
        // Order 2, closed form: A₂ = (1−q)² + 2q(1−q) + q²e^{1/z²}, so ε(2) =
        // ln(1 + q²(e^{1/z²} − 1)) (Mironov et al. 2019, §3.3, α = 2).
        let (q, z) = (0.1, 1.5f64);
        let exact = (q * q * (1.0 / (z * z)).exp_m1()).ln_1p();
        assert!((rdp(q, z, 2.0) - exact).abs() < 1e-8 * exact);
    }

    #[test]
    fn calibration_inverts_epsilon() {
        let z = noise_multiplier(0.01, 1000, 1.0, 1e-6).unwrap();
        let e = epsilon(0.01, z, 1000, 1e-6).unwrap();
        assert!(e <= 1.0 && e > 0.99, "{z} {e}");
        assert!(epsilon(0.01, z * 0.99, 1000, 1e-6).unwrap() > 1.0);
    }
}
