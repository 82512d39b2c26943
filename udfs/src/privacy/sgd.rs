//! Accounting of DP-SGD: `steps` Poisson-subsampled Gaussian steps (docs/ACCOUNTING.md, "DP-SGD
//! accounting").
//!
//! - [`epsilon`]: the standalone (ε, δ) of one fit by the privacy-loss-distribution accountant
//!   of [`super::pld`] (pessimistic connect-the-dots discretisation, FFT composition; tested
//!   against Google `dp_accounting`'s PLD accountant: never below it, at most 3% above), or the
//!   RDP curve's conversion where that is smaller (round 52: tiny δ, huge σ, no PLD grid).
//! - [`noise_multiplier`]: its inverse by bisection, rounded toward more noise.
//! - [`rdp`]: the Rényi-DP curve of one step (Mironov, Talwar, Zhang 2019), never below the
//!   exact value at any sample rate (round 47), which the ledger's
//!   [`super::Event::SubsampledGaussian`] uses for the table filters.
use super::error::{PrivacyError, check_delta, check_positive};
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
/// noise multiplier σ/clip, at `delta` (never below the true ε).
///
/// The smaller of two upper bounds (round 52, review "pld" F2): the PLD accountant's, and the
/// RDP curve's ([`rdp`]) conversion (Canonne, Kamath, Steinke 2020). The PLD is the tighter one
/// for ordinary parameters; the RDP bound is the answer when the PLD has none (its grid would not
/// fit [`pld::MAX_LEN`] even at a grid step of 1, or σ² overflows) or only +∞ (δ at or below the
/// 10⁻¹⁵ the PLD composition puts at +∞).
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

/// [`epsilon`] of checked arguments with the PLD grid step starting at `h0`: min(PLD, RDP), both
/// valid upper bounds (a NaN PLD value, never expected, counts as none).
fn epsilon_from(q: f64, z: f64, t: u64, d: f64, h0: f64) -> f64 {
    let by_rdp = rdp_epsilon(q, z, t, d);
    match pld::composed_epsilon_from(q, z, t, d, h0) {
        Some(e) if !e.is_nan() => e.min(by_rdp),
        _ => by_rdp,
    }
}

/// The CKS conversion at `d` of `t` × the one-step RDP curve on the order grid: the ledger
/// event's profile ([`super::Profile::epsilon`], rounded outward there).
fn rdp_epsilon(q: f64, z: f64, t: u64, d: f64) -> f64 {
    super::Profile::from_event(&super::Event::SubsampledGaussian {
        sample_rate: q,
        noise_multiplier: z,
        steps: t,
    })
    .epsilon(d)
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
/// sampled Gaussian mechanism", the quantity A_α, and their proof that the other direction is no
/// larger): ε(α) = ln A_α/(α−1), A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)},
/// computed as ln1p(A_α − 1) from the terms k ≥ 2 (see `log_a`: the loss is in A_α's
/// O(q²) tail, which 1 + αq + … in floating point would round away (round 47)). Between
/// integers n < α < n+1, (α−1)·ε(α) is convex in α (van Erven and Harremoës 2014, "Rényi
/// divergence and Kullback-Leibler divergence", Cor. 2), so it is at most the chord:
/// ε(α) ≤ ((n+1−α)·ln A_n + (α−n)·ln A_{n+1})/(α−1), with ln A_1 = 0 (no fractional-order
/// series is evaluated). Every order is also bounded by the unsampled Gaussian's α/(2σ²)
/// (subsampling is a post-processing of the pair, and mixing with a common component does not
/// increase the divergence); above order 1000, and for σ outside [1e-100, 1e100] (where 2σ² or
/// the exponents leave the normal floating-point range), only that bound is used.
///
/// Never below the exact value (round 47): `log_a` returns an upper bound of ln A_n (its
/// terms' float error is bounded and added), the chord is rounded outward by 1e-10 relative (it
/// covers the few roundings after that bound), the Gaussian bound by 4 ulps, and a value under
/// 1e-300 is reported as 1e-300 (the exact value is then below it: this keeps every step's
/// charge positive, as the exact one is). Parameters outside their ranges give +∞.
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
    // α/(2σ²): three roundings, ≤ 1.5 ulp.
    let gaussian = (alpha / (2.0 * z * z) * (1.0 + 4.0 * f64::EPSILON)).max(RDP_FLOOR);
    if alpha > MAX_BINOMIAL_ORDER || q == 1.0 || !(1e-100..=1e100).contains(&z) {
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
    (chord * (1.0 + 1e-10)).max(RDP_FLOOR).min(gaussian)
}

/// The smallest value [`rdp`] reports: every exact value below it is reported as it (round 47).
const RDP_FLOOR: f64 = 1e-300;

/// ln(e^x − 1) for x > 0, to a few ulps: ln(expm1(x)) for x ≤ 1 (expm1 keeps the relative
/// precision of small x), x + ln1p(−e^{−x}) above (no overflow for large x).
fn ln_expm1(x: f64) -> f64 {
    if x <= 1.0 {
        x.exp_m1().ln()
    } else {
        x + (-(-x).exp()).ln_1p()
    }
}

/// An upper bound of ln A_n, A_n = Σ_{k=0}^{n} C(n,k)(1−q)^{n−k} q^k e^{(k²−k)/(2σ²)} (integer
/// 2 ≤ n ≤ 1000, 0 < q < 1, σ ∈ [1e-100, 1e100]), to within a few ulps of rounding that the
/// caller's 1e-10 outward factor covers.
///
/// Computed as ln1p(A_n − 1) (round 47; review "maths" F1): the k = 0, 1 terms have exponent 0
/// and the binomial weights sum to 1, so
/// A_n − 1 = Σ_{k=2}^{n} C(n,k)(1−q)^{n−k} q^k · expm1((k²−k)/(2σ²)),
/// every term ≥ 0, summed in the log domain: L = logsumexp_k t_k with
/// t_k = ln C(n,k) + (n−k)·ln1p(−q) + k·ln q + ln expm1((k²−k)/(2σ²)), then
/// ln A_n = ln1p(e^L) (or L + ln1p(e^{−L}) for L > 0). The former sum 1 + nq + O(q²) lost
/// everything below ~1e-16 absolute, and rounded a fit at q = 2⁻³⁰ down to a charge of 0.
///
/// Outward: each t_k is raised by a bound of its float error (with u = f64::EPSILON, twice the
/// unit roundoff: the running sum ln C(n,k) of ln((n−j+1)/j) gains ≤ u(1 + |step| + |sum|) per
/// step; the other parts and their sum ≤ 4u(Σ|parts| + x + 2), x/(1−e^{−x}) ≤ 1 + x carrying
/// the relative error of x = (k²−k)/(2σ²) into ln expm1), and L by the logsumexp's own error
/// 2u(n + 10 + |max t_k|) (the sum of ≤ n terms in [0, 1] has relative error ≤ (n+1)u); raising
/// L raises ln1p(e^L), and d ln1p(e^L)/dL ≤ ln1p(e^L) keeps that relative. L is floored at −690,
/// so ln A_n is never reported below ~3e-300 (the exact ln A_n ≤ A_n − 1 = e^L).
fn log_a(q: f64, z: f64, n: u64) -> f64 {
    const U: f64 = f64::EPSILON;
    let (lq, l1q) = (q.ln(), (-q).ln_1p());
    let (nf, two_z2) = (n as f64, 2.0 * z * z);
    let mut log_binom = 0.0f64; // ln C(n, k)
    let mut binom_err = 0.0f64; // a bound of its float error
    let mut terms = Vec::with_capacity(n as usize);
    for k in 1..=n {
        let kf = k as f64;
        let step = ((nf - kf + 1.0) / kf).ln();
        log_binom += step;
        binom_err += U * (1.0 + step.abs() + log_binom.abs());
        if k < 2 {
            continue;
        }
        let x = (kf * kf - kf) / two_z2;
        let parts = [log_binom, (nf - kf) * l1q, kf * lq, ln_expm1(x)];
        let size: f64 = parts.iter().map(|p| p.abs()).sum();
        terms.push(parts.iter().sum::<f64>() + binom_err + 4.0 * U * (size + x + 2.0));
    }
    let m = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = terms.iter().map(|t| (t - m).exp()).sum();
    let l = (m + s.ln() + 2.0 * U * (nf + 10.0 + m.abs())).max(-690.0);
    if l > 0.0 {
        l + (-l).exp().ln_1p()
    } else {
        l.exp().ln_1p()
    }
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
        let g = 1500.0 / (2.0 * z * z);
        assert!(rdp(q, z, 1500.0) >= g && rdp(q, z, 1500.0) <= g * (1.0 + 1e-15));
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

    /// ε(α) by an independent route (round 47): A_n − 1 summed directly in f64 (binomials as
    /// products, powers by `powi`, no logarithms), then ln1p and the chord. Its terms are all
    /// ≥ 0, so it is accurate to ~n ulps where nothing overflows (x ≤ 700).
    fn direct_rdp(q: f64, z: f64, alpha: f64) -> f64 {
        let a_minus_1 = |n: u64| {
            let mut binom = 1.0f64;
            let mut sum = 0.0f64;
            for k in 1..=n {
                binom = binom * (n - k + 1) as f64 / k as f64;
                if k >= 2 {
                    let x = (k * k - k) as f64 / (2.0 * z * z);
                    sum += binom * (1.0 - q).powi((n - k) as i32) * q.powi(k as i32) * x.exp_m1();
                }
            }
            sum
        };
        let n = alpha.floor();
        let ln_a = |n: f64| {
            if n < 2.0 {
                0.0
            } else {
                a_minus_1(n as u64).ln_1p()
            }
        };
        if n == alpha {
            ln_a(n) / (alpha - 1.0)
        } else {
            ((n + 1.0 - alpha) * ln_a(n) + (alpha - n) * ln_a(n + 1.0)) / (alpha - 1.0)
        }
    }

    #[test]
    fn rdp_at_a_tiny_sample_rate_is_positive_and_never_below_the_exact_value() {
        // Round 47, review "maths" F1: q = 2⁻³⁰, z = 3.391, α = 23.3872 was charged 0. Exact
        // chord: 9.21957156634535174397e-19, the full binomial sum from k = 0 in 100-digit
        // Python `decimal` (the review's mt/loga.py `log_a_exact`, at the f64 inputs' exact
        // binary values), written here as the next f64 above it (so every check is strict);
        // dp_accounting 0.6 gives 9.06e-19 (order 23) and 9.46e-19 (order 24) per step.
        let (q, z, a) = (2f64.powi(-30), 3.391, 23.3872);
        let exact = 9.219571566345354e-19;
        let got = rdp(q, z, a);
        assert!(
            got >= exact && got <= exact * (1.0 + 1e-9),
            "{got} vs {exact}"
        );
        let direct = direct_rdp(q, z, a);
        assert!((direct / exact - 1.0).abs() < 1e-12, "{direct}");
        assert!(got >= direct * (1.0 + 1e-11), "{got} vs {direct}");
    }

    #[test]
    fn rdp_review_table_within_1e9_and_never_below() {
        // Round 47, review "maths" F1's table (q, z, α, exact chord, 100-digit `decimal` as
        // above, the next f64 above it); the old code was below the first five (by 58% to
        // 1.3e-4) and gave 0 at q = 2⁻³⁰.
        for (q, z, a, exact) in [
            (1e-7, 10.0, 3.0, 1.507525064145372e-16),
            (1e-7, 2.0, 3.0, 4.260381382777988e-15),
            (1e-6, 5.0, 2.0, 4.081077419238739e-14),
            (1e-6, 5.0, 1.5, 4.081077419238739e-14),
            (1e-5, 10.0, 2.0, 1.0050167084163008e-12),
            (0.05, 6.37032, 6.37032, 0.00020107808668887777),
            (2f64.powi(-30), 30.0, 32.0, 1.542833394074071e-20),
            (2f64.powi(-30), 1.0, 1000.0, 479.18476935255427),
        ] {
            let got = rdp(q, z, a);
            assert!(
                got >= exact && got <= exact * (1.0 + 1e-9),
                "q={q} z={z} α={a}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn rdp_matches_the_direct_sum_and_the_identity_of_a_minus_1() {
        // Never below the direct f64 sum of A − 1 (round 47), at most 1e-9 above it.
        for q in [2f64.powi(-30), 1e-9, 1e-7, 1e-5, 1e-3, 0.05, 0.3, 0.9] {
            for z in [0.8, 1.0, 3.0, 10.0, 100.0] {
                for a in [1.5, 2.0, 3.0, 4.7, 10.0, 23.3872, 32.0] {
                    let (got, want) = (rdp(q, z, a), direct_rdp(q, z, a));
                    if !want.is_finite() {
                        continue; // e^x overflowed in the direct sum (x > 709)
                    }
                    let cap = a / (2.0 * z * z);
                    let ok = if want < cap * (1.0 - 1e-9) {
                        got >= want * (1.0 + 1e-11) && got <= want * (1.0 + 1e-9)
                    } else {
                        // At the Gaussian bound: that bound.
                        got >= want.min(cap) && got <= cap * (1.0 + 1e-15)
                    };
                    assert!(ok, "q={q} z={z} α={a}: {got} vs {want} (cap {cap})");
                }
            }
        }
        // The identity A_n − 1 = Σ_{k≥2} …: at q = 0.3 the full sum from k = 0 has no
        // cancellation, and agrees.
        let (q, z, n) = (0.3f64, 1.5f64, 12u64);
        let mut binom = 1.0f64;
        let mut full = (1.0 - q).powi(n as i32);
        for k in 1..=n {
            binom = binom * (n - k + 1) as f64 / k as f64;
            let x = (k * k - k) as f64 / (2.0 * z * z);
            full += binom * (1.0 - q).powi((n - k) as i32) * q.powi(k as i32) * x.exp();
        }
        let want = full.ln() / (n as f64 - 1.0);
        let got = rdp(q, z, n as f64);
        assert!(got >= want && got <= want * (1.0 + 1e-9), "{got} vs {want}");
    }

    #[test]
    fn the_review_attack_fit_is_charged_a_positive_amount() {
        // Round 47: the fit of review "maths" F1 (steps 1e6, q = 2⁻³⁰, σ = 3.391) at the rdp
        // filter's order 23.3872 cost 0 and was admitted on a spent budget. The rdp filter
        // charges `Event::rdp` at its order: now ≥ the exact 1e6 × 9.2196e-19.
        let ev = super::super::Event::SubsampledGaussian {
            sample_rate: 9.313225746154785e-10,
            noise_multiplier: 3.391,
            steps: 1_000_000,
        };
        let charge = ev.rdp(23.3872);
        assert!(
            (9.219571566345352e-13..=9.22e-13).contains(&charge),
            "{charge}"
        );
        let p = super::super::Profile::from_event(&ev);
        assert!(p.rdp().iter().all(|&v| v > 0.0));
        assert!(p.epsilon(1e-12) > 0.0);
    }

    #[test]
    fn rdp_at_extreme_parameters_is_positive() {
        // Round 47: the exact value is > 0 for every q > 0 and finite σ; below 1e-300 it is
        // reported as 1e-300, never 0; σ too small for the binomial sum gives the Gaussian bound.
        for (q, z, a) in [
            (1e-300, 1.0, 2.0),
            (5e-324, 0.5, 30.0),
            (2f64.powi(-30), 1e160, 3.0),
            (1.0, 1e160, 3.0),
            (0.5, 1e101, 2.5),
        ] {
            let v = rdp(q, z, a);
            assert!(v >= RDP_FLOOR && v.is_finite(), "q={q} z={z} α={a}: {v}");
        }
        assert!(rdp(0.5, 1e-120, 3.0) >= 3.0 / (2.0 * 1e-240));
        // Close to q = 1 the curve meets the Gaussian bound from below.
        let (z, a) = (2.0, 3.0);
        let near = rdp(1.0 - 1e-12, z, a);
        assert!(near <= rdp(1.0, z, a) && near > a / (2.0 * z * z) * (1.0 - 1e-9));
    }
}
