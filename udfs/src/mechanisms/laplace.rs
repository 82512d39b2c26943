//! The Laplace mechanism on a power-of-two grid.
use crate::noise::discrete::{discrete_laplace_int, steps_for};
use crate::noise::{SecureRng, granularity_for_mechanism, round_to_grid};
use crate::privacy::PrivacyError;
use crate::privacy::error::{check_epsilon, check_positive};

/// Releases round_g(x) + g·Y, Y discrete Laplace (CKS 2020, Algorithm 2) with integer scale
/// t = ⌈b/g⌉, b = (Δ + g)/ε. In grid units the sensitivity is ≤ Δ/g + 1, and the discrete
/// Laplace with scale t is ((Δ/g + 1)/t)-DP ≤ ε (Ghosh, Roughgarden, Sundararajan 2009, the
/// geometric mechanism).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaplaceMechanism {
    /// The scale actually used, t·g.
    pub scale: f64,
    pub granularity: f64,
}

impl LaplaceMechanism {
    pub fn from_epsilon(epsilon: f64, sensitivity: f64) -> Result<Self, PrivacyError> {
        check_epsilon("epsilon", epsilon)?;
        check_positive("sensitivity", sensitivity)?;
        let g = granularity_for_mechanism(sensitivity / epsilon, sensitivity);
        let b = (sensitivity + g) / epsilon;
        Ok(LaplaceMechanism {
            scale: steps_for(b, g) as f64 * g,
            granularity: g,
        })
    }

    /// For a release (of one or several coordinates) of **L1** sensitivity Δ that must be ε-DP,
    /// when rounding each coordinate to the grid can add up to `slack` grid steps to the L1
    /// distance of two neighbours (1 for one coordinate; k when k coordinates change): the
    /// discrete Laplace of scale b = (Δ + slack·g)/ε, rounded outward, is ε-DP (in grid units
    /// the L1 distance is at most Δ/g + slack and the geometric mechanism of scale t ≥ that/ε
    /// is ε-DP, Ghosh, Roughgarden, Sundararajan 2009; coordinates' independent noises multiply
    /// their likelihood ratios, so L1 distances add). Fails, naming the scale, when b is not
    /// representable ([`crate::mechanisms::gaussian::noise_scale_problem`]).
    pub fn from_epsilon_with_slack(
        epsilon: f64,
        sensitivity: f64,
        slack: f64,
    ) -> Result<Self, PrivacyError> {
        check_epsilon("epsilon", epsilon)?;
        check_positive("sensitivity", sensitivity)?;
        debug_assert!(slack >= 1.0 && slack.is_finite());
        let base = sensitivity / epsilon;
        if let Some(why) = crate::mechanisms::gaussian::noise_scale_problem(base) {
            return Err(PrivacyError::Infeasible(why.replace("σ", "Laplace scale")));
        }
        let g = granularity_for_mechanism(base, sensitivity);
        // Outward: 4 ulps over the one addition and one division (as the Gaussian's σ).
        let b = (sensitivity + slack * g) / epsilon * (1.0 + 4.0 * f64::EPSILON);
        if let Some(why) = crate::mechanisms::gaussian::noise_scale_problem(b) {
            return Err(PrivacyError::Infeasible(why.replace("σ", "Laplace scale")));
        }
        Ok(LaplaceMechanism {
            scale: steps_for(b, g) as f64 * g,
            granularity: g,
        })
    }

    /// g·Y, Y discrete Laplace of integer scale ⌈scale/g⌉: the noise alone (exact in `f64`).
    pub fn noise(&self, rng: &mut SecureRng) -> f64 {
        discrete_laplace_int(rng, steps_for(self.scale, self.granularity)) as f64 * self.granularity
    }

    pub fn release(&self, rng: &mut SecureRng, value: f64) -> f64 {
        let t = steps_for(self.scale, self.granularity);
        round_to_grid(value, self.granularity)
            + discrete_laplace_int(rng, t) as f64 * self.granularity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laplace_scale_and_variance() {
        // b ≥ Δ/ε; 200 000 draws: variance 2b² within 5·√(5/n) = 2.5% (fails at 10% scale).
        let m = LaplaceMechanism::from_epsilon(0.5, 2.0).unwrap();
        assert!(m.scale >= 4.0 && m.scale < 4.0 * (1.0 + 4e-6));
        let mut rng = SecureRng::insecure_from_seed(10);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| m.release(&mut rng, -3.0)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
        let want = 2.0 * m.scale * m.scale;
        assert!(
            (var / want - 1.0).abs() < 5.0 * (5.0 / n as f64).sqrt(),
            "{var} {want}"
        );
        assert!((mean + 3.0).abs() < 5.0 * (want / n as f64).sqrt());
    }
}
