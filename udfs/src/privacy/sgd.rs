//! Accounting of DP-SGD: `steps` Poisson-subsampled Gaussian steps (docs/ACCOUNTING.md, "DP-SGD
//! accounting").
//!
//! - [`epsilon`]: the standalone (ε, δ) of one fit by the privacy-loss-distribution accountant
//!   of [`super::pld`] (pessimistic connect-the-dots discretisation, FFT composition; tested
//!   against Google `dp_accounting`'s PLD accountant: never below it, at most 3% above).
//! - [`noise_multiplier`]: its inverse by bisection, rounded toward more noise.
//! - [`rdp`]: the Rényi-DP curve of one step (Mironov, Talwar, Zhang 2019), which the ledger's
//!   [`super::Event::SubsampledGaussian`] uses for the table filters.
use super::cks::cks_epsilon;
use super::error::{PrivacyError, check_delta, check_positive};
use super::grid::ORDERS;
use super::pld;

/// The largest number of steps accepted (the step count enters the FFT exponent and the
/// ledger's arithmetic exactly up to here).
pub const MAX_STEPS: u64 = 1_000_000_000_000_000;

/// Orders above this use the Gaussian bound α/(2σ²) instead of the binomial sum (whose cost is
/// linear in α); the bound is valid at every order (see [`rdp`]).
const MAX_BINOMIAL_ORDER: f64 = 1000.0;

fn check_rate(q: f64) -> Result<f64, PrivacyError> {
    if q.is_finite() && q > 0.0 && q <= 1.0 {
        Ok(q)
    } else {
        Err(PrivacyError::invalid(
            "sample_rate",
            q,
            "a number in (0, 1] (the Poisson sampling probability of each row)",
        ))
    }
}

fn check_steps(steps: u64) -> Result<u64, PrivacyError> {
    if (1..=MAX_STEPS).contains(&steps) {
        Ok(steps)
    } else {
        Err(PrivacyError::invalid(
            "steps",
            steps,
            "a whole number between 1 and 1e15",
        ))
    }
}

/// Standalone ε of `steps` Poisson-subsampled Gaussian steps with sampling rate `sample_rate` and
/// noise multiplier σ/clip, at `delta` (PLD accountant; never below the true ε).
///
/// When the discretised distributions would not fit [`pld::MAX_LEN`] even at a grid step of 1
/// (extremely small noise), the RDP curve's conversion (Canonne, Kamath, Steinke 2020) is used:
/// also an upper bound, only looser.
pub fn epsilon(
    sample_rate: f64,
    noise_multiplier: f64,
    steps: u64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    let q = check_rate(sample_rate)?;
    let z = check_positive("noise_multiplier", noise_multiplier)?;
    let t = check_steps(steps)?;
    let d = check_delta("delta", delta)?;
    Ok(epsilon_from(q, z, t, d, pld::DISCRETISATION))
}

/// [`epsilon`] of checked arguments with the PLD grid step starting at `h0`.
fn epsilon_from(q: f64, z: f64, t: u64, d: f64, h0: f64) -> f64 {
    if let Some(e) = pld::composed_epsilon_from(q, z, t, d, h0) {
        return e;
    }
    let curve: Vec<f64> = ORDERS.iter().map(|&a| t as f64 * rdp(q, z, a)).collect();
    cks_epsilon(&curve, d).0 * (1.0 + 1e-12)
}

/// The smallest noise multiplier (rounded toward more noise) whose `epsilon(...)` is ≤ `epsilon`.
///
/// First located with the accountant on a 10× coarser grid (to a relative width of 1e-3), then
/// with [`epsilon`] itself: a bracket [lo, hi] with ε(lo) > target ≥ ε(hi) (ε decreases as σ
/// grows) around the coarse answer, narrowed by regula falsi on ln ε against ln σ with the
/// Illinois modification (Dowell and Jarratt 1971) and a bisection fallback, to a relative width
/// of 1e-5. The returned value is the bracket's upper end, whose [`epsilon`] was computed and is
/// ≤ `epsilon`.
pub fn noise_multiplier(
    sample_rate: f64,
    steps: u64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    let q = check_rate(sample_rate)?;
    let t = check_steps(steps)?;
    let target = super::error::check_epsilon("epsilon", epsilon)?;
    let d = check_delta("delta", delta)?;
    let infeasible = || {
        PrivacyError::Infeasible(format!(
            "no noise multiplier up to 1e8 gives ε ≤ {target} at δ = {d:e} with sample_rate {q} \
             and {t} steps"
        ))
    };
    // g(σ) = ln ε(σ) − ln target: > 0 fails, ≤ 0 satisfies.
    // A NaN ε (never expected) fails the target: more noise, never less.
    let g_at = |h0: f64| {
        move |z: f64| {
            let e = epsilon_from(q, z, t, d, h0);
            if e.is_nan() {
                f64::INFINITY
            } else {
                e.max(1e-300).ln() - target.ln()
            }
        }
    };
    let coarse = g_at(10.0 * pld::DISCRETISATION);
    let start = match bracket(&coarse, 1.0, 2.0).ok_or_else(infeasible)? {
        Bracket::Done(z) => z,
        Bracket::Found(b) => narrow(&coarse, b, 1e-3),
    };
    let fine = g_at(pld::DISCRETISATION);
    // The two grids agree to about 0.3% on σ (measured on the calibration vectors).
    match bracket(&fine, start, 1.003).ok_or_else(infeasible)? {
        Bracket::Done(z) => Ok(z),
        Bracket::Found(b) => Ok(narrow(&fine, b, 1e-5)),
    }
}

/// (lo, g(lo), hi, g(hi)) with g(lo) > 0 ≥ g(hi).
type Ends = (f64, f64, f64, f64);

enum Bracket {
    Found(Ends),
    /// Even σ below 1e-6 meets the target: the answer.
    Done(f64),
}

/// A bracket of the root of the decreasing `g`, from `start` outward by `factor`, the factor
/// squared at each step; None when σ = 1e8 does not meet the target.
fn bracket(g: &impl Fn(f64) -> f64, start: f64, mut factor: f64) -> Option<Bracket> {
    let (mut hi, mut g_hi) = (start, g(start));
    if g_hi <= 0.0 {
        loop {
            let lo = hi / factor;
            if lo < 1e-6 {
                return Some(Bracket::Done(hi));
            }
            let v = g(lo);
            if v > 0.0 {
                return Some(Bracket::Found((lo, v, hi, g_hi)));
            }
            (hi, g_hi) = (lo, v);
            factor *= factor;
        }
    }
    loop {
        let (lo, g_lo) = (hi, g_hi);
        hi *= factor;
        if hi > 1e8 {
            return None;
        }
        g_hi = g(hi);
        if g_hi <= 0.0 {
            return Some(Bracket::Found((lo, g_lo, hi, g_hi)));
        }
        factor *= factor;
    }
}

/// Narrows a bracket to a relative width `tol` (Illinois regula falsi in ln σ, bisection after
/// 20 steps or on non-finite values); returns its upper end.
fn narrow(g: &impl Fn(f64) -> f64, (mut lo, mut g_lo, mut hi, mut g_hi): Ends, tol: f64) -> f64 {
    let mut side = 0i8;
    let mut iterations = 0;
    while hi - lo > tol * hi {
        iterations += 1;
        let (a, b) = (lo.ln(), hi.ln());
        let guard = tol / 4.0;
        let secant = if iterations <= 20 && g_lo.is_finite() && g_hi.is_finite() && g_lo > g_hi {
            a + (b - a) * g_lo / (g_lo - g_hi)
        } else {
            0.5 * (a + b)
        };
        // Keep the probe strictly inside, so that every step narrows the bracket (clamp needs
        // min ≤ max: when the guard band is empty, bisect).
        let x = if a + guard < b - guard {
            secant.clamp(a + guard, b - guard)
        } else {
            0.5 * (a + b)
        };
        let z = x.exp();
        let v = g(z);
        if v <= 0.0 {
            (hi, g_hi) = (z, v);
            if side == -1 {
                g_lo /= 2.0;
            }
            side = -1;
        } else {
            (lo, g_lo) = (z, v);
            if side == 1 {
                g_hi /= 2.0;
            }
            side = 1;
        }
    }
    hi
}

/// RDP ε(α) of ONE Poisson-subsampled Gaussian step (Mironov, Talwar, Zhang 2019), an upper bound.
///
/// At an integer order α (Mironov, Talwar, Zhang 2019, "Rényi differential privacy of the
/// sampled Gaussian mechanism", the quantity A_α, and their proof that the other direction is no larger):
/// ε(α) = ln A_α/(α−1), A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}, summed in
/// the log domain. Between integers n < α < n+1, (α−1)·ε(α) is convex in α (van Erven and
/// Harremoës 2014, "Rényi divergence and Kullback-Leibler divergence", Cor. 2), so it is at most
/// the chord: ε(α) ≤ ((n+1−α)·ln A_n + (α−n)·ln A_{n+1})/(α−1), with ln A_1 = 0. Every order
/// is also bounded by the unsampled Gaussian's α/(2σ²) (subsampling is a post-processing of
/// the pair, and mixing with a common component does not increase the divergence); above order
/// 1000 only that bound is used. Rounded outward by 1e-10 relative (float error of the sum).
/// Parameters outside their ranges give +∞.
pub fn rdp(sample_rate: f64, noise_multiplier: f64, alpha: f64) -> f64 {
    let (q, z) = (sample_rate, noise_multiplier);
    if !(q.is_finite() && q > 0.0 && q <= 1.0 && z.is_finite() && z > 0.0) || alpha.is_nan() {
        return f64::INFINITY;
    }
    if alpha <= 1.0 {
        // Orders ≤ 1 are not used by the accountant; the KL divergence is below ε(α) for α > 1.
        return if alpha.is_finite() {
            rdp(q, z, 1.0 + 1e-9)
        } else {
            f64::INFINITY
        };
    }
    let gaussian = alpha / (2.0 * z * z);
    if alpha > MAX_BINOMIAL_ORDER || q == 1.0 {
        return gaussian;
    }
    let n = alpha.floor();
    let chord = if n == alpha {
        log_a(q, z, n as u64) / (alpha - 1.0)
    } else {
        let lo = if n >= 2.0 { log_a(q, z, n as u64) } else { 0.0 };
        let hi = log_a(q, z, n as u64 + 1);
        ((n + 1.0 - alpha) * lo + (alpha - n) * hi) / (alpha - 1.0)
    };
    let v = chord.max(0.0) * (1.0 + 1e-10);
    v.min(gaussian)
}

/// ln A_n = ln Σ_{k=0}^{n} C(n,k)(1−q)^{n−k} q^k e^{(k²−k)/(2σ²)} (integer n ≥ 2).
fn log_a(q: f64, z: f64, n: u64) -> f64 {
    let (lq, l1q) = (q.ln(), (-q).ln_1p());
    let nf = n as f64;
    let mut log_binom = 0.0f64; // ln C(n, 0)
    let mut terms = Vec::with_capacity(n as usize + 1);
    for k in 0..=n {
        let kf = k as f64;
        if k > 0 {
            log_binom += ((nf - kf + 1.0) / kf).ln();
        }
        terms.push(log_binom + (nf - kf) * l1q + kf * lq + (kf * kf - kf) / (2.0 * z * z));
    }
    let m = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_batch_is_the_gaussian_mechanism() {
        // q = 1: T Gaussian steps with σ/Δ = z compose to (√T/z)-GDP exactly (Dong, Roth, Su
        // 2019); the PLD accountant is above it by its discretisation only.
        let exact = super::super::gaussian_epsilon(2.0, 50, 1e-8).unwrap();
        let got = epsilon(1.0, 2.0, 50, 1e-8).unwrap();
        assert!(got >= exact && got <= exact * 1.003, "{got} vs {exact}");
        assert!((rdp(1.0, 2.0, 3.0) - 3.0 / 8.0).abs() < 1e-15);
    }

    #[test]
    fn rdp_integer_order_two_closed_form() {
        // α = 2: A_2 = (1−q)² + 2q(1−q) + q² e^{1/σ²} = 1 + q²(e^{1/σ²} − 1).
        let (q, z) = (0.01f64, 1.2f64);
        let want = (q * q * (1.0 / (z * z)).exp_m1()).ln_1p();
        let got = rdp(q, z, 2.0);
        assert!(got >= want && (got / want - 1.0) < 1e-9, "{got} vs {want}");
        // Chord between 2 and 3, below the Gaussian bound, monotone.
        let mid = rdp(q, z, 2.5);
        assert!(mid >= rdp(q, z, 2.0) && mid <= rdp(q, z, 3.0));
        assert!(rdp(q, z, 1500.0) == 1500.0 / (2.0 * z * z));
        assert_eq!(rdp(0.0, 1.0, 2.0), f64::INFINITY);
        assert_eq!(rdp(0.5, f64::NAN, 2.0), f64::INFINITY);
    }

    #[test]
    fn invalid_arguments_name_the_argument() {
        for (r, name) in [
            (epsilon(0.0, 1.0, 10, 1e-5), "sample_rate"),
            (epsilon(1.5, 1.0, 10, 1e-5), "sample_rate"),
            (epsilon(0.1, 0.0, 10, 1e-5), "noise_multiplier"),
            (epsilon(0.1, 1.0, 0, 1e-5), "steps"),
            (epsilon(0.1, 1.0, 10, 1.0), "delta"),
            (noise_multiplier(0.1, 10, 0.0, 1e-5), "epsilon"),
        ] {
            let e = r.expect_err(name).to_string();
            assert!(e.contains(name), "{e}");
        }
    }
}
