//! The relative Gaussian mechanism (RGM) of Hendrikx, Mangold and Bellet (AISTATS 2024,
//! arXiv 2308.15250): calibration of its noise multiplier σ, the relative sensitivity of a group
//! mean, and a release that is safe on a computer.
//!
//! Sources: the paper's printed constants are lost; the project's research notes reconstruct and
//! derive them (section numbers below refer to those notes; the results are stated here), and
//! `scripts/rgm_accountant.py` is the pure-Python reference accountant.
//!
//! # The mechanism (docs/research/rgm.md §2, Definition 3)
//! RGM_{σ,A,γ}(x) = f(x) + N(0, σ²(A + γ‖f(x)‖)² I_d). For a group mean (d = 1, A = 0) that is
//! m + σ·γ·m·Z with Z standard normal: the noise is proportional to the released value.
//!
//! # Its privacy (docs/research/rgm.md §3, Theorem 1, eq. (5*))
//! If ‖f(x) − f(y)‖ ≤ A + γ·min(‖f(x)‖, ‖f(y)‖) for all neighbours, then with u = γ(2 + γ) and
//! 1 < α < 1 + 1/u, ε(α) = α/(2σ²(1 − (α−1)u)) + d·[−ln(1+γ) − ln(1 − (α−1)u)/(2(α−1))], and
//! +∞ beyond (no finite RDP at large orders). This is [`crate::privacy::profile::rgm_rdp`],
//! recorded in the ledger as [`Event::Rgm`]. The proof uses exactly two facts about a release:
//! (i) the noise scales s(x) of two neighbours are within a factor 1 + γ of each other, and
//! (ii) their centres differ by at most min(s(x), s(y))/σ (Lemma 1 and the first term of (5*)).
//! The curve is increasing in γ, so any upper bound on γ gives a valid (larger) curve.
//!
//! # Relative sensitivity of a group mean (docs/research/rgm.md §7(a))
//! Replace one of n values, all > 0 and within a factor K of each other (before and after):
//! γ = (K² − 1)/(K(n − 1) + 1), A = 0, tight ([`mean_sensitivity`]).
//!
//! # Calibration: CKS on our order grid, not Mironov on the reference's
//! [`calibrate_rgm_sigma`] returns the smallest σ (bisection, rounded up) whose profile meets
//! (ε, δ) under *our* conversion: `Profile::from_event(&Event::Rgm { .. }).epsilon(δ)`, i.e. the
//! RDP → (ε, δ) conversion of Canonne, Kamath and Steinke (2020, Prop. 12) minimised over the
//! project's order grid (`privacy::grid`), the same conversion the accountant uses for the
//! charge. The reference `rgm_accountant.py` converts with Mironov (2017, Prop. 3),
//! ε = min_α ε(α) + ln(1/δ)/(α − 1), on its own order list. At every order the CKS bound is
//! smaller by ln(α/(α−1)) + ln(α)/(α−1) > 0, so our σ is smaller for the same target (e.g.
//! K = 1.2, n = 100, ε = 1, δ = 1e-6: σ = 4.91 here against 5.97 in the reference, measured in
//! `udfs/tests/it/rgm.rs`), and the ε floor is lower. [`reference`] ports the Python exactly
//! (conversion, order list and bisection) so that tests can compare numbers to 1e-6.
//!
//! Infeasibility: ε(σ) decreases to a floor > 0 as σ → ∞ (the α cap and the σ-free
//! "privacy-loss" term, docs/research/rgm.md §3 "Practical floor"). A target is called infeasible, as in the
//! reference, when even σ = [`MAX_SIGMA`] = 10⁶ does not meet it.
//!
//! # Release on a computer ([`release_relative`])
//! The continuous mechanism cannot be sampled in floating point (Mironov 2012), and the noise
//! scale s = σγm depends on the data, so the usual remedy (a discrete Gaussian on a power-of-two
//! grid g chosen from the noise scale, [`super::gaussian`]) would be unsafe here: outputs would
//! lie on gℤ with g a function of m, and two neighbours whose scales straddle a power of two
//! would have different supports (an observed odd multiple of the finer grid identifies the
//! dataset). Instead the output is the correctly rounded `f64` of an exact dyadic number whose
//! distribution is the continuous RGM's up to factors below floating-point resolution:
//!
//! o = m̂ + g·(Y + 2^−24·(W + U)),   g = 2^⌊log2 s⌋ · 2^−26,
//!
//! - Y ~ N_Z(0, S²), S = ⌈s/g⌉ + 1 ∈ [2^26, 2^27]: the exact discrete Gaussian of CKS 2020
//!   (`noise::discrete`), in units of g;
//! - W ~ N_Z(0, T²), T = 8·2^24: a second discrete Gaussian on the 2^24 times finer lattice,
//!   with standard deviation τ = 8 units of g. By Poisson summation (CKS 2020, §2.2), the sum of a
//!   discrete Gaussian on gℤ and one of standard deviation τg on a refinement of gℤ has, on the
//!   fine lattice, the probabilities of the discrete Gaussian of variance (S² + τ²)g² up to a
//!   factor 1 ± 4e^{−2π²τ²} (= 1 ± 10^{−548});
//! - U uniform on [−½, ½) with 128-bit resolution: it spreads each fine lattice point over its
//!   cell, so the density is piecewise constant and within a factor exp(±(|t| + 1)·2^{−51}) of
//!   the continuous Gaussian's at t standard deviations (cells are 2^−50 of a standard deviation
//!   wide);
//! - the sum is formed exactly in wide integers ([`wide`]) and rounded once to the nearest `f64`.
//!   The set of `f64` values does not depend on the data, so rounding is post-processing; where an
//!   `f64` rounding cell is wider than the lattice step (g·2^−152) the probability of the cell is
//!   the integral of the piecewise-constant density (dyadic cells and lattice align). The
//!   exception is |o| < g·2^−98 (lattice coarser than the `f64` spacing), an event of
//!   probability below 2^−120.
//!
//! Rounding and scaling slack, all folded into γ (rounded outward, PRIVACY.md): the contract is
//! checked as max ≤ fl(K·min), which implies max ≤ K(1 + 2^−50)·min exactly; the mean m̂ is the
//! correctly rounded exact mean (relative error ≤ 2^−53); the noise standard deviation is
//! g·√(S² + τ²) ∈ [s, s(1 + 2^−24)]. So a release with noise multiplier c = σ·γ₁
//! ([`noise_gamma`]) satisfies (ii) with γ₁ and (i) with γ* = γ₁ + 2^−24(1 + γ₁)
//! ([`accounted_gamma`]), which is what is calibrated and charged. This is the same standard as
//! the Gaussian mechanism's documentation: the privacy curve is the continuous mechanism's, up to
//! factors far below floating-point resolution.
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use crate::noise::SecureRng;
use crate::noise::discrete::discrete_gaussian_int;
use crate::privacy::error::{check_delta, check_epsilon};
use crate::privacy::{Event, PrivacyError, Profile};

pub mod wide;

use wide::{SignedWide, Wide};

/// The largest noise multiplier searched; a target that σ = 10⁶ cannot meet is infeasible (the
/// reference accountant's upper bracket, `rgm_accountant.py`, `calibrate_sigma(hi=1e6)`).
pub const MAX_SIGMA: f64 = 1e6;

/// The relative slack of the noise scale: the standard deviation actually used is within
/// [s, s(1 + 2^−24)] (module docs).
pub const SCALE_SLACK: f64 = 1.0 / (1u64 << 24) as f64;

/// τ of the smoothing discrete Gaussian, in units of the coarse grid g (module docs).
const SMOOTHING_TAU: u128 = 8;
/// log2 of the refinement of the smoothing lattice.
const FINE_BITS: u64 = 24;
/// Bits of resolution of the uniform dither.
const DITHER_BITS: u64 = 128;
/// s/g ∈ [2^26, 2^27).
const SCALE_BITS: i64 = 26;

/// The relative L2 sensitivity γ of the mean of `n` values, all > 0 and within a factor
/// `max_ratio` = K of each other, under replacement of one value (docs/research/rgm.md §7(a)):
/// γ = (K² − 1)/(K(n − 1) + 1). Computed with K(1 + 2^−50) (the contract is checked in floating
/// point, module docs) and rounded up. `n` ≥ 2; K ≥ 1 finite.
pub fn mean_sensitivity(max_ratio: f64, n: u64) -> f64 {
    debug_assert!(n >= 2 && max_ratio >= 1.0 && max_ratio.is_finite());
    let k = max_ratio * (1.0 + 2f64.powi(-50));
    // (K − 1)(K + 1) / (K(n − 1) + 1): six roundings of ≤ 2^−53 each, covered by 2^−48.
    let g = (k - 1.0) * (k + 1.0) / (k * (n - 1) as f64 + 1.0);
    g * (1.0 + 2f64.powi(-48))
}

/// γ₁, the relative scale of the noise: γ plus the rounding of the mean to `f64` (the released
/// centre m̂ has relative error ≤ 2^−53, module docs), rounded up:
/// γ₁ = γ(1 + 2^−50) + 2^−50.
pub fn noise_gamma(max_ratio: f64, n: u64) -> f64 {
    (mean_sensitivity(max_ratio, n) * (1.0 + 2f64.powi(-50)) + 2f64.powi(-50))
        * (1.0 + 2f64.powi(-52))
}

/// γ*, what is calibrated and charged: the ratio of two neighbours' noise scales is at most
/// (1 + γ₁)(1 + 2^−24) = 1 + γ* (module docs).
pub fn accounted_gamma(max_ratio: f64, n: u64) -> f64 {
    let g1 = noise_gamma(max_ratio, n);
    (g1 + SCALE_SLACK * (1.0 + g1)) * (1.0 + 2f64.powi(-52))
}

/// ε at δ of `steps` RGM releases of dimension `dims` with noise multiplier σ and relative
/// sensitivity γ, by the accountant's own conversion (CKS 2020 on the order grid).
pub fn rgm_epsilon(sigma: f64, gamma: f64, dims: u32, steps: u32, delta: f64) -> f64 {
    Profile::from_event(&Event::Rgm {
        sigma,
        gamma,
        dims,
        steps,
    })
    .epsilon(delta)
}

/// The ε floor: the limit of [`rgm_epsilon`] as σ → ∞ (docs/research/rgm.md §3, "Practical floor").
pub fn rgm_epsilon_floor(gamma: f64, dims: u32, steps: u32, delta: f64) -> f64 {
    rgm_epsilon(f64::INFINITY, gamma, dims, steps, delta)
}

type CacheKey = (u64, u64, u64, u32, u32);
static CALIBRATIONS: LazyLock<Mutex<HashMap<CacheKey, Result<f64, PrivacyError>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The smallest noise multiplier σ (rounded up) such that `steps` RGM releases of dimension
/// `dims` and relative sensitivity γ are (ε, δ)-DP by [`rgm_epsilon`]. Geometric bisection on
/// [10⁻⁹, [`MAX_SIGMA`]] (ε(σ) is non-increasing in σ: every order's term is), to a relative
/// width of 10⁻¹³; the returned σ satisfies the target. Infeasible (even σ = 10⁶ does not
/// meet it): `PrivacyError::Infeasible` with the floor. Results are cached (planning calls this
/// once per accumulator).
pub fn calibrate_rgm_sigma(
    epsilon: f64,
    delta: f64,
    gamma: f64,
    dims: u32,
    steps: u32,
) -> Result<f64, PrivacyError> {
    check_epsilon("epsilon", epsilon)?;
    check_delta("delta", delta)?;
    if !(gamma.is_finite() && gamma >= 0.0) || dims == 0 || steps == 0 {
        return Err(PrivacyError::invalid(
            "gamma",
            gamma,
            "a finite number >= 0 (with dims, steps >= 1)",
        ));
    }
    let key = (
        epsilon.to_bits(),
        delta.to_bits(),
        gamma.to_bits(),
        dims,
        steps,
    );
    if let Some(r) = CALIBRATIONS.lock().expect("lock").get(&key) {
        return r.clone();
    }
    let r = calibrate_uncached(epsilon, delta, gamma, dims, steps);
    let mut cache = CALIBRATIONS.lock().expect("lock");
    if cache.len() > 4096 {
        cache.clear();
    }
    cache.insert(key, r.clone());
    r
}

fn calibrate_uncached(
    epsilon: f64,
    delta: f64,
    gamma: f64,
    dims: u32,
    steps: u32,
) -> Result<f64, PrivacyError> {
    let eps = |s: f64| rgm_epsilon(s, gamma, dims, steps, delta);
    if eps(MAX_SIGMA) > epsilon {
        return Err(PrivacyError::Infeasible(format!(
            "the relative Gaussian mechanism with relative sensitivity {gamma:.6} cannot reach \
             epsilon = {epsilon} at delta = {delta}: its epsilon floor (noise multiplier → ∞) is \
             {:.6}",
            rgm_epsilon_floor(gamma, dims, steps, delta)
        )));
    }
    let (mut lo, mut hi) = (1e-9f64, MAX_SIGMA);
    if eps(lo) <= epsilon {
        return Ok(lo);
    }
    for _ in 0..200 {
        if hi / lo <= 1.0 + 1e-13 {
            break;
        }
        let mid = (lo * hi).sqrt();
        if eps(mid) <= epsilon {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// Whether a group mean with `max_ratio` and groups of at least `n` rows can meet (ε, δ).
fn feasible(max_ratio: f64, n: u64, epsilon: f64, delta: f64) -> bool {
    rgm_epsilon(MAX_SIGMA, accounted_gamma(max_ratio, n), 1, 1, delta) <= epsilon
}

/// The smallest group size n ≥ `from` for which `rgm_mean_by` with this `max_ratio` can meet
/// (ε, δ) (γ decreases with n); `None` if none below 2^62 can.
pub fn smallest_feasible_group_size(
    max_ratio: f64,
    epsilon: f64,
    delta: f64,
    from: u64,
) -> Option<u64> {
    let from = from.max(2);
    if feasible(max_ratio, from, epsilon, delta) {
        return Some(from);
    }
    let (mut lo, mut hi) = (from, from);
    loop {
        if hi >= 1 << 62 {
            return None;
        }
        hi = hi.saturating_mul(2).min(1 << 62);
        if feasible(max_ratio, hi, epsilon, delta) {
            break;
        }
        lo = hi;
    }
    // lo infeasible, hi feasible
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if feasible(max_ratio, mid, epsilon, delta) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// How one relative release is drawn (module docs): the grid exponent and the integer scale.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ReleasePlan {
    /// g = 2^eg.
    eg: i64,
    /// S = ⌈s/g⌉ + 1 ∈ (2^26, 2^27 + 2].
    steps: u128,
}

/// (M, e) with v = M·2^e, M < 2^53 an integer, for a positive finite v (IEEE 754 binary64).
fn decompose(v: f64) -> (u64, i64) {
    let bits = v.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64;
    let frac = bits & ((1u64 << 52) - 1);
    if e == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), e - 1075)
    }
}

/// ⌊log2 x⌋ for a positive finite x.
fn floor_log2(x: f64) -> i64 {
    let (m, e) = decompose(x);
    e + 63 - m.leading_zeros() as i64
}

fn plan(value: f64, c: f64) -> ReleasePlan {
    // value = mv·2^ev with mv ∈ [1, 2) (exact: M/2^k with M < 2^53); t = mv·c; s = t·2^ev.
    let (m, e) = decompose(value);
    let ev = e + 63 - m.leading_zeros() as i64;
    let mv = m as f64 / 2f64.powi((ev - e) as i32);
    let t = mv * c;
    let et = floor_log2(t);
    // x = s/g = t·2^(26 − et) ∈ [2^26, 2^27); fl(t) ≥ (1 − 2^−53)·(mv·c), so ⌈x⌉ + 1 > s/g.
    let x = t * 2f64.powi((SCALE_BITS - et) as i32);
    ReleasePlan {
        eg: ev + et - SCALE_BITS,
        steps: x.ceil() as u128 + 1,
    }
}

/// The standard deviation of [`release_relative`]'s noise for `value` and multiplier `c`:
/// g·√(S² + τ²) ∈ [c·value, c·value·(1 + 2^−24)] (tests).
pub fn relative_noise_std(value: f64, c: f64) -> f64 {
    let p = plan(value, c);
    let s = p.steps as f64;
    let tau = SMOOTHING_TAU as f64;
    (s * s + tau * tau).sqrt() * 2f64.powi(p.eg as i32)
}

/// The RGM release of `value` (finite, > 0) with noise standard deviation c·value, c > 0
/// finite: the correctly rounded `f64` of m + g·(Y + 2^−24(W + U)) (module docs). Secure: every
/// random choice is an exact integer sampler on the [`SecureRng`]; the only rounding is the final
/// one, to a data-independent set.
pub fn release_relative(rng: &mut SecureRng, value: f64, c: f64) -> f64 {
    assert!(value.is_finite() && value > 0.0, "RGM value {value}");
    assert!(
        c.is_finite() && c > 0.0 && c < 1e300,
        "RGM noise multiplier {c}"
    );
    let p = plan(value, c);
    let y = discrete_gaussian_int(rng, p.steps);
    let w = discrete_gaussian_int(rng, SMOOTHING_TAU << FINE_BITS);
    let u = ((rng.next_u64() as u128) << 64) | rng.next_u64() as u128;
    // Exact value in units of 2^lat: the lattice of the noise is g·2^−(24+128).
    let lat = p.eg - (FINE_BITS + DITHER_BITS) as i64;
    let (m, em) = decompose(value);
    let base = lat.min(em);
    let up = |k: i64| (k - base) as u64;
    let centre = SignedWide::positive(Wide::from_u128(m as u128).shl(up(em)));
    let noise = SignedWide::from_i128_shifted(y, up(lat) + FINE_BITS + DITHER_BITS)
        .plus(SignedWide::from_i128_shifted(w, up(lat) + DITHER_BITS))
        .plus(SignedWide::positive(Wide::from_u128(u).shl(up(lat))))
        .plus(SignedWide {
            negative: true,
            magnitude: Wide::from_u128(1u128 << (DITHER_BITS - 1)).shl(up(lat)),
        });
    centre.plus(noise).to_f64(base)
}

/// An exact port of the reference accountant `scripts/rgm_accountant.py`: its RDP formula, its
/// order list, its Mironov (2017,
/// Prop. 3) conversion and its bisection. Used only to test this crate against the Python's
/// numbers; the accountant and [`super::calibrate_rgm_sigma`] use CKS on the project's grid.
pub mod reference {
    use std::sync::LazyLock;

    /// `ALPHAS`: 1.01 … 1.99 (step 0.01), 2.0 … 100.9 (step 0.1), 101 … 1000 (step 1).
    pub static ALPHAS: LazyLock<Vec<f64>> = LazyLock::new(|| {
        let mut v: Vec<f64> = (1..100).map(|i| 1.0 + 0.01 * i as f64).collect();
        v.extend((0..990).map(|i| 2.0 + 0.1 * i as f64));
        v.extend((0..900).map(|i| 101.0 + i as f64));
        v
    });

    /// `h_loss`: the per-dimension privacy-loss term at the worse of the two variance ratios
    /// (1+γ)^{±2} (docs/research/rgm.md §3, Lemma 2 in variance-ratio form).
    pub fn h_loss(alpha: f64, gamma: f64) -> f64 {
        let u = gamma * (2.0 + gamma);
        if (alpha - 1.0) * u >= 1.0 {
            return f64::INFINITY;
        }
        let h =
            |rho: f64| -0.5 * rho.ln() - (alpha - (alpha - 1.0) * rho).ln() / (2.0 * (alpha - 1.0));
        h((1.0 + gamma).powi(2)).max(h((1.0 + gamma).powi(-2)))
    }

    /// `rgm_rdp`: eq. (5*) of docs/research/rgm.md §3.
    pub fn rgm_rdp(alpha: f64, sigma: f64, gamma: f64, d: f64) -> f64 {
        let u = gamma * (2.0 + gamma);
        if alpha <= 1.0 || (alpha - 1.0) * u >= 1.0 {
            return f64::INFINITY;
        }
        alpha / (2.0 * sigma.powi(2) * (1.0 - (alpha - 1.0) * u)) + d * h_loss(alpha, gamma)
    }

    /// `rdp_to_dp`: Mironov (2017, Prop. 3), ε = min over [`ALPHAS`] of
    /// ε(α) + ln(1/δ)/(α − 1); returns (ε, α) ((∞, NaN) when every order is infinite).
    pub fn rdp_to_dp(curve: impl Fn(f64) -> f64, delta: f64) -> (f64, f64) {
        let mut best = (f64::INFINITY, f64::NAN);
        for &a in ALPHAS.iter() {
            let e = curve(a);
            if e.is_finite() {
                let v = e + (1.0 / delta).ln() / (a - 1.0);
                if v < best.0 {
                    best = (v, a);
                }
            }
        }
        best
    }

    /// `calibrate_sigma(target_eps, delta, gamma, d, T)`: 100 geometric bisection steps on
    /// [10⁻³, 10⁶]; +∞ when σ = 10⁶ does not meet the target.
    pub fn calibrate_sigma(target_eps: f64, delta: f64, gamma: f64, d: f64, steps: f64) -> f64 {
        let f = |s: f64| rdp_to_dp(|a| steps * rgm_rdp(a, s, gamma, d), delta).0;
        let (mut lo, mut hi) = (1e-3f64, 1e6f64);
        if f(hi) > target_eps {
            return f64::INFINITY;
        }
        for _ in 0..100 {
            let mid = (lo * hi).sqrt();
            if f(mid) <= target_eps {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gammas_are_ordered_and_tight() {
        // K = 1.2, n = 100: γ = 0.44/119.8 (docs/research/rgm.md §7(a) table: 0.0037).
        let g = mean_sensitivity(1.2, 100);
        let exact = 0.44 / 119.8;
        assert!(g >= exact && g <= exact * (1.0 + 1e-12), "{g}");
        let (g1, gs) = (noise_gamma(1.2, 100), accounted_gamma(1.2, 100));
        assert!(g < g1 && g1 < gs && gs < g * (1.0 + 1e-4), "{g} {g1} {gs}");
        // K = 1: values equal within each group; γ is only the rounding slack.
        assert!(mean_sensitivity(1.0, 2) > 0.0 && mean_sensitivity(1.0, 2) < 1e-14);
        // decreasing in n
        assert!(accounted_gamma(1.5, 10) > accounted_gamma(1.5, 11));
    }

    #[test]
    fn calibration_meets_the_target_tightly() {
        for (k, n, eps, delta) in [(1.2, 100u64, 1.0, 1e-6), (1.5, 500, 0.5, 1e-7)] {
            let g = accounted_gamma(k, n);
            let s = calibrate_rgm_sigma(eps, delta, g, 1, 1).unwrap();
            assert!(rgm_epsilon(s, g, 1, 1, delta) <= eps);
            assert!(rgm_epsilon(s * (1.0 - 1e-9), g, 1, 1, delta) > eps * (1.0 - 1e-6));
            // cached: same value
            assert_eq!(calibrate_rgm_sigma(eps, delta, g, 1, 1).unwrap(), s);
        }
        let e = calibrate_rgm_sigma(0.5, 1e-6, accounted_gamma(2.0, 10), 1, 1).unwrap_err();
        assert!(e.to_string().contains("floor"), "{e}");
        assert!(calibrate_rgm_sigma(0.0, 1e-6, 0.1, 1, 1).is_err());
    }

    #[test]
    fn smallest_group_size_is_the_threshold() {
        let (k, eps, delta) = (1.5, 1.0, 1e-6);
        let n = smallest_feasible_group_size(k, eps, delta, 2).unwrap();
        assert!(n > 2);
        assert!(feasible(k, n, eps, delta) && !feasible(k, n - 1, eps, delta));
        assert_eq!(
            smallest_feasible_group_size(k, eps, delta, n + 5),
            Some(n + 5)
        );
    }

    #[test]
    fn release_scale_and_support() {
        for (v, c) in [
            (1.0, 0.01),
            (24_000.0, 0.0093),
            (3.7e-300, 0.5),
            (1e300, 1e-9),
            (5e-324, 0.1),
        ] {
            let sd = relative_noise_std(v, c);
            let s = v * c;
            assert!(
                sd >= s * (1.0 - 1e-15) && sd <= s * (1.0 + SCALE_SLACK),
                "{v} {c}: {sd} vs {s}"
            );
        }
        // The output is a full-precision f64, not a point of a data-dependent grid: the low bits
        // of the mantissa are spread (a grid 2^20 below the noise scale would leave them 0).
        let mut rng = SecureRng::insecure_from_seed(17);
        let odd = (0..200)
            .filter(|_| release_relative(&mut rng, 1000.0, 0.01).to_bits() & 1 == 1)
            .count();
        assert!((60..140).contains(&odd), "{odd}");
    }

    #[test]
    fn release_moments() {
        // 4 000 draws: relative std c within 5·√(1/(2(n−1))) = 5.6%; mean within 5 se. (The
        // per-group statistics of rgm_mean_by test the same release with 18 000 draws.)
        let mut rng = SecureRng::insecure_from_seed(23);
        let (v, c, n) = (37.5, 0.2, 4_000);
        let xs: Vec<f64> = (0..n).map(|_| release_relative(&mut rng, v, c)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
        let sd = var.sqrt() / v;
        assert!(
            (sd / c - 1.0).abs() < 5.0 / (2.0 * (n as f64 - 1.0)).sqrt(),
            "{sd}"
        );
        assert!((mean - v).abs() < 5.0 * c * v / (n as f64).sqrt(), "{mean}");
    }
}
