//! The Gaussian mechanism on a power-of-two grid.
use crate::noise::discrete::{discrete_gaussian_int, steps_for};
use crate::noise::grid::MAX_STEPS_LOG2;
use crate::noise::{SecureRng, granularity_for_mechanism, round_to_grid};
use crate::privacy::PrivacyError;
use crate::privacy::error::check_positive;

/// log₂ of the largest noise scale a release may use: σ ≤ 2^1000 ≈ 1.07e301. Above it the noise
/// itself (tails of 40σ and more), and the released value plus noise, would no longer be finite
/// `f64` values: the release would have to cap them, which bounds the noise and voids the
/// calibration. A call that needs more noise is refused at planning ([`noise_scale_problem`]).
pub const MAX_SIGMA_LOG2: i32 = 1000;

/// log₂ of the smallest noise scale a release may use: σ ≥ 2^−990. The grid g is at least
/// σ·2^−28 (below [`MAX_STEPS_LOG2`] steps) and at most 2^−20·σ, so σ ≥ 2^−990 keeps g ≥ 2^−1018,
/// a normal `f64` power of two: every multiple of g that a release forms is exact.
pub const MIN_SIGMA_LOG2: i32 = -990;

/// Calibrations round outward (PRIVACY.md, "Numbers on a computer": σ up): the unrounded σ is
/// raised by 4 ulps before it is rounded up to whole grid steps, which covers the rounding of the
/// one division and one addition that compute it.
const OUTWARD: f64 = 1.0 + 4.0 * f64::EPSILON;

/// Why a noise scale `sigma` (what the calibration asks for, before the grid) cannot be
/// released exactly, or `None` when it can: it must be finite and within
/// [2^[`MIN_SIGMA_LOG2`], 2^[`MAX_SIGMA_LOG2`]]. The release constructors (which the accountant's
/// cost functions also call, see `aggregates::params`) check it before any sampler sees σ.
pub fn noise_scale_problem(sigma: f64) -> Option<String> {
    let max = crate::mechanisms::exact::pow2(MAX_SIGMA_LOG2);
    let min = crate::mechanisms::exact::pow2(MIN_SIGMA_LOG2);
    if sigma.is_nan() || sigma > max {
        Some(format!(
            "the noise σ = {sigma:e} exceeds the largest representable noise scale \
             2^{MAX_SIGMA_LOG2} ≈ {max:.3e}"
        ))
    } else if sigma < min {
        Some(format!(
            "the noise σ = {sigma:e} is below the smallest noise scale whose grid is exactly \
             representable, 2^{MIN_SIGMA_LOG2} ≈ {min:.3e}"
        ))
    } else {
        None
    }
}

/// Releases round_g(x) + g·Y, Y ~ N_Z(0, S²) the discrete Gaussian of Canonne, Kamath and
/// Steinke (2020), S = ⌈σ/g⌉.
///
/// Why it is μ-GDP with μ as calibrated: in grid units the released integer round(x/g) has
/// sensitivity at most Δ/g + 1 (rounding moves each of two neighbours by ≤ ½). We set
/// σ = (Δ + g)/μ so that (Δ/g + 1)/S ≤ μ, with g ≤ 2^-20·Δ (see
/// [`granularity_for_mechanism`]), so σ exceeds Δ/μ by at most 2^-20 relative (plus one step).
/// The discrete Gaussian with integer sensitivity
/// Δ' and scale S is ½(Δ'/S)²-zCDP (CKS 2020, Thm. 4) and its privacy curve equals the
/// continuous Gaussian's up to factors 1 ± O(e^{−2π²S²}) from Poisson summation (CKS 2020, §2.2
/// and Prop. 5); with S ≥ 2^20 that is below any floating-point resolution.
///
/// A release of a vector whose neighbours differ in k coordinates (L2 sensitivity Δ) is rounded
/// coordinatewise: each changed coordinate moves by at most one more grid step, so the rounded
/// vectors differ by at most Δ + √k·g in L2 (triangle inequality), and σ = (Δ + √k·g)/μ
/// ([`Self::from_mu_with_slack`] with slack ≥ √k).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianMechanism {
    /// The noise standard deviation actually used, S·g (after grid inflation and rounding up).
    pub sigma: f64,
    /// The grid step g (a power of two).
    pub granularity: f64,
}

impl GaussianMechanism {
    /// For a release of sensitivity Δ that must be μ-GDP (one coordinate changes).
    pub fn from_mu(mu: f64, sensitivity: f64) -> Result<Self, PrivacyError> {
        Self::from_mu_with_slack(mu, sensitivity, 1.0)
    }

    /// For a release of L2 sensitivity Δ that must be μ-GDP, when rounding to the grid can add up
    /// to `slack` grid steps to the L2 distance of two neighbours (1 when one coordinate
    /// changes; ≥ √2 when two can: type docs). Fails, naming the noise scale, when σ or its grid
    /// is not representable ([`noise_scale_problem`]) or needs 2^28 grid steps or more.
    pub fn from_mu_with_slack(mu: f64, sensitivity: f64, slack: f64) -> Result<Self, PrivacyError> {
        check_positive("mu", mu)?;
        check_positive("sensitivity", sensitivity)?;
        debug_assert!(slack >= 1.0 && slack.is_finite());
        // Δ/μ, the scale the grid is chosen for; checked before anything uses it.
        let base = sensitivity / mu;
        if let Some(why) = noise_scale_problem(base) {
            return Err(PrivacyError::Infeasible(why));
        }
        let g = granularity_for_mechanism(base, sensitivity);
        // σ = (Δ + slack·g)/μ (type docs), rounded outward.
        let sigma = (sensitivity + slack * g) / mu * OUTWARD;
        if let Some(why) = noise_scale_problem(sigma) {
            return Err(PrivacyError::Infeasible(why));
        }
        let s = steps_for(sigma, g);
        if s >= 1u128 << MAX_STEPS_LOG2 {
            return Err(PrivacyError::Infeasible(format!(
                "the noise σ = {sigma:e} needs {s} grid steps of {g:e}, more than the sampler's \
                 2^{MAX_STEPS_LOG2} (the sensitivity {sensitivity:e} is far below the noise)"
            )));
        }
        let m = GaussianMechanism {
            sigma: s as f64 * g,
            granularity: g,
        };
        m.steps()?;
        Ok(m)
    }

    /// S = σ/g, the sampler's integer scale, checked: σ and g finite and positive, g ≥ 2^−1022,
    /// 1 ≤ S < 2^28. A mechanism built by [`Self::from_mu`] always passes; the check keeps a
    /// hand-built one (or a bug) from handing a non-finite scale to the sampler, as an error
    /// rather than a panic.
    pub fn steps(&self) -> Result<u128, PrivacyError> {
        let (sigma, g) = (self.sigma, self.granularity);
        let ok = sigma.is_finite()
            && g.is_finite()
            && g >= f64::MIN_POSITIVE
            && sigma >= g
            && sigma / g < crate::mechanisms::exact::pow2(MAX_STEPS_LOG2);
        debug_assert!(ok, "Gaussian noise scale {sigma} on grid {g}");
        if !ok {
            return Err(PrivacyError::Infeasible(format!(
                "Gaussian noise scale {sigma:e} on grid {g:e} is outside the sampler's range"
            )));
        }
        Ok(steps_for(sigma, g))
    }

    /// The release of `value` (finite). Outputs are multiples of the grid step. Fails (never
    /// panics) when the mechanism's scale is outside the sampler's range ([`Self::steps`]).
    pub fn release(&self, rng: &mut SecureRng, value: f64) -> Result<f64, PrivacyError> {
        let s = self.steps()?;
        Ok(round_to_grid(value, self.granularity)
            + discrete_gaussian_int(rng, s) as f64 * self.granularity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::gaussian_mu;

    #[test]
    fn calibration_and_noise_scale() {
        // σ ≥ Δ/μ, and within 2^-19 relative of it.
        let mu = gaussian_mu(0.5, 1e-6).unwrap();
        let m = GaussianMechanism::from_mu(mu, 100.0).unwrap();
        assert!(m.sigma >= 100.0 / mu);
        assert!(
            m.sigma <= 100.0 / mu * (1.0 + 4e-6),
            "{} vs {}",
            m.sigma,
            100.0 / mu
        );
        // σ matches dp-accounting's analytic σ = 805.7618480725032 (vectors file) to 1e-5.
        assert!((m.sigma / 805.7618480725032 - 1.0).abs() < 1e-5);
        // 200 000 releases of 1000: variance within 5·√(2/n) = 1.6% of σ² (fails at 10% scale).
        let mut rng = SecureRng::insecure_from_seed(9);
        let n = 200_000;
        let xs: Vec<f64> = (0..n)
            .map(|_| m.release(&mut rng, 1000.0).unwrap())
            .collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
        assert!((var / (m.sigma * m.sigma) - 1.0).abs() < 5.0 * (2.0 / n as f64).sqrt());
        assert!((mean - 1000.0).abs() < 5.0 * m.sigma / (n as f64).sqrt());
        assert!(xs.iter().all(|x| (x / m.granularity).fract() == 0.0));
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(GaussianMechanism::from_mu(0.0, 1.0).is_err());
        assert!(GaussianMechanism::from_mu(1.0, f64::NAN).is_err());
    }
}
