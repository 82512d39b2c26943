//! The Gaussian mechanism on a power-of-two grid.
use crate::noise::discrete::{discrete_gaussian_int, steps_for};
use crate::noise::{SecureRng, granularity_for_mechanism, round_to_grid};
use crate::privacy::PrivacyError;
use crate::privacy::error::check_positive;

/// Releases round_g(x) + g·Y, Y ~ N_Z(0, S²) the discrete Gaussian of Canonne, Kamath and
/// Steinke (2020), S = ⌈σ/g⌉.
///
/// Why it is μ-GDP with μ as calibrated: in grid units the released integer round(x/g) has
/// sensitivity at most Δ/g + 1 (rounding moves each of two neighbours by ≤ ½). We set
/// σ = (Δ + g)/μ so that (Δ/g + 1)/S ≤ μ, with g ≤ 2^-20·Δ (see
/// [`granularity_for_mechanism`]), so σ exceeds Δ/μ by at most 2^-20 relative (plus one step). The discrete Gaussian with integer sensitivity
/// Δ' and scale S is ½(Δ'/S)²-zCDP (CKS 2020, Thm. 4) and its privacy curve equals the
/// continuous Gaussian's up to factors 1 ± O(e^{−2π²S²}) from Poisson summation (CKS 2020, §2.2
/// and Prop. 5); with S ≥ 2^20 that is below any floating-point resolution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianMechanism {
    /// The noise standard deviation actually used, S·g (after grid inflation and rounding up).
    pub sigma: f64,
    /// The grid step g (a power of two).
    pub granularity: f64,
}

impl GaussianMechanism {
    /// For a release of sensitivity Δ that must be μ-GDP.
    pub fn from_mu(mu: f64, sensitivity: f64) -> Result<Self, PrivacyError> {
        check_positive("mu", mu)?;
        check_positive("sensitivity", sensitivity)?;
        let g = granularity_for_mechanism(sensitivity / mu, sensitivity);
        let sigma = (sensitivity + g) / mu;
        let s = steps_for(sigma, g);
        if s >= 1u128 << 28 {
            return Err(PrivacyError::Infeasible(format!(
                "noise scale {sigma} overflows its grid"
            )));
        }
        Ok(GaussianMechanism {
            sigma: s as f64 * g,
            granularity: g,
        })
    }

    /// The release of `value` (finite). Outputs are multiples of the grid step.
    pub fn release(&self, rng: &mut SecureRng, value: f64) -> f64 {
        let s = steps_for(self.sigma, self.granularity);
        round_to_grid(value, self.granularity)
            + discrete_gaussian_int(rng, s) as f64 * self.granularity
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
        let xs: Vec<f64> = (0..n).map(|_| m.release(&mut rng, 1000.0)).collect();
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
