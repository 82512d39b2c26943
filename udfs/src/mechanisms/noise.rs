//! [`Noise`]: the noise of one release, whichever kind a call chose (`mechanism => 'gaussian' |
//! 'laplace'`), as one value with the three things every DP aggregate needs from it:
//! - [`Noise::release`]: the one drawing path, the exact statistic u·2^e plus noise on the grid
//!   ([`crate::mechanisms::exact::release_exact`], [`crate::mechanisms::exact::release_exact_laplace`]);
//! - [`Noise::describe`]: what EXPLAIN PRIVACY shows (`Gaussian σ = 5.302`, `Laplace b = 2`);
//! - [`Noise::interval`] (and [`Noise::half_steps`], [`Noise::stddev`]): the half-width that
//!   covers the exact statistic at a confidence level, the base of every `_ci` interval
//!   ([`crate::aggregates::interval`], "Formulas", gives the derivations).
//!
//! A `_ci` function's value is its base function's value by construction: both call the same
//! release code, which draws through [`Noise::release`]; the interval is computed afterwards
//! from the drawn value and this public calibration (post-processing).
//!
//! Adding a noise kind (e.g. a discrete staircase) means one variant here, its calibration in
//! each function file beside the others, and its tail bound in [`Noise::half_steps`].
use datafusion::common::Result;

use super::{GaussianMechanism, LaplaceMechanism};
use crate::noise::SecureRng;
use crate::noise::discrete::steps_for;
use crate::privacy::normal::phi_inv;

/// The noise of one release on its power-of-two grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Noise {
    /// Discrete Gaussian N_Z(0, S²) times the grid g: (ε, δ)-DP through μ-GDP.
    Gaussian(GaussianMechanism),
    /// Discrete Laplace of integer scale t times g: pure ε-DP.
    Laplace(LaplaceMechanism),
}

/// One release's confidence interval and noise standard deviation, in the statistic's units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub lower: f64,
    pub upper: f64,
    pub stddev: f64,
}

impl Noise {
    /// The release of the exact value `units`·2^`unit_exp`: one draw of noise from `rng`, added
    /// in integers on the grid (no floating-point rounding before the noise). The only place a
    /// DP aggregate built on exact partials draws.
    pub fn release(&self, rng: &mut SecureRng, units: i128, unit_exp: i32) -> Result<f64> {
        use crate::mechanisms::exact::{release_exact, release_exact_laplace};
        match self {
            Noise::Gaussian(m) => release_exact(m, rng, units, unit_exp),
            Noise::Laplace(m) => release_exact_laplace(m, rng, units, unit_exp),
        }
    }

    /// What EXPLAIN PRIVACY shows: the kind and its scale in the statistic's units.
    pub fn describe(&self) -> String {
        format!("{} {}", self.kind(), self.scale_text())
    }

    /// `Gaussian` or `Laplace`.
    pub fn kind(&self) -> &'static str {
        match self {
            Noise::Gaussian(_) => "Gaussian",
            Noise::Laplace(_) => "Laplace",
        }
    }

    /// `σ = 5.302` or `b = 2`: the scale alone, for descriptions of several releases.
    pub fn scale_text(&self) -> String {
        match self {
            Noise::Gaussian(m) => format!("σ = {}", short(m.sigma)),
            Noise::Laplace(m) => format!("b = {}", short(m.scale)),
        }
    }

    /// The Gaussian mechanism, if this is Gaussian noise.
    pub fn gaussian(&self) -> Option<GaussianMechanism> {
        match self {
            Noise::Gaussian(m) => Some(*m),
            Noise::Laplace(_) => None,
        }
    }

    /// The Laplace mechanism, if this is Laplace noise.
    pub fn laplace(&self) -> Option<LaplaceMechanism> {
        match self {
            Noise::Laplace(m) => Some(*m),
            Noise::Gaussian(_) => None,
        }
    }

    /// `σ = …` or `b = …` with the scale multiplied by `unit` (a release in units of `unit`,
    /// described in value units).
    pub fn scale_text_in(&self, unit: f64) -> String {
        match self {
            Noise::Gaussian(m) => format!("σ = {}", short(m.sigma * unit)),
            Noise::Laplace(m) => format!("b = {}", short(m.scale * unit)),
        }
    }

    /// The grid step g.
    pub fn granularity(&self) -> f64 {
        match self {
            Noise::Gaussian(m) => m.granularity,
            Noise::Laplace(m) => m.granularity,
        }
    }

    /// S (Gaussian) or t (Laplace): the integer scale the sampler uses.
    fn steps(&self) -> u128 {
        match self {
            Noise::Gaussian(m) => steps_for(m.sigma, m.granularity),
            Noise::Laplace(m) => steps_for(m.scale, m.granularity),
        }
    }

    /// The smallest k ≥ 0 (grid steps) with P(|Y| ≤ k) ≥ `level` (for the Gaussian, for the
    /// provable bound; [`crate::aggregates::interval`], "Formulas").
    ///
    /// `u128::MAX` stands for "no finite k": a level that is not below 1 (a Bonferroni share of
    /// a confidence just below 1 rounds to 1 in f64), or a k beyond u128. Rounded outward, never
    /// to a narrower interval (an `as` cast would give 0 for NaN).
    pub fn half_steps(&self, level: f64) -> u128 {
        let s = self.steps() as f64;
        if level.is_nan() || level >= 1.0 {
            return u128::MAX;
        }
        let k = match self {
            Noise::Gaussian(_) => {
                // z = Φ⁻¹((1 + level)/2) = −Φ⁻¹((1 − level)/2), accurate for level near 1.
                let z = -phi_inv((1.0 - level) / 2.0) * (1.0 + 1e-9);
                (z * s).ceil()
            }
            Noise::Laplace(_) => {
                // k + 1 ≥ t·ln(2/((1 − level)(1 + a))), a = e^{−1/t}.
                let a = (-1.0 / s).exp();
                let x = s * (std::f64::consts::LN_2 - (1.0 - level).ln() - a.ln_1p());
                (x * (1.0 + 1e-12)).ceil() - 1.0
            }
        };
        // NaN checked before the clamp at 0 (`f64::max` would turn it into 0).
        if k.is_nan() || k >= u128::MAX as f64 {
            u128::MAX
        } else {
            k.max(0.0) as u128
        }
    }

    /// The half-width, in value units, of an interval around the raw release that covers the
    /// exact statistic (before or after its rounding to the grid): (k + 1)·g; infinite where
    /// no finite k covers the level ([`Noise::half_steps`]).
    pub fn half_width(&self, level: f64) -> f64 {
        match self.half_steps(level) {
            u128::MAX => f64::INFINITY,
            k => (k + 1) as f64 * self.granularity(),
        }
    }

    /// The integer half-width W of an integer statistic released rounded to an integer:
    /// ⌈(k + 1)·g − ½⌉.
    pub fn integer_half_width(&self, level: f64) -> f64 {
        (self.half_width(level) - 0.5).ceil().max(0.0)
    }

    /// The interval around the raw (not post-processed) release `raw` that covers the exact
    /// statistic with probability ≥ `confidence`: raw ± (k + 1)·g, with the noise's stddev.
    pub fn interval(&self, raw: f64, confidence: f64) -> Interval {
        let w = self.half_width(confidence);
        Interval {
            lower: raw - w,
            upper: raw + w,
            stddev: self.stddev(),
        }
    }

    /// The noise's standard deviation (value units): σ, or g·√(2a)/(1 − a) for the discrete
    /// Laplace with a = e^{−1/t}.
    pub fn stddev(&self) -> f64 {
        match self {
            Noise::Gaussian(m) => m.sigma,
            Noise::Laplace(m) => {
                let t = self.steps() as f64;
                let a = (-1.0 / t).exp();
                m.granularity * (2.0 * a).sqrt() / -(-1.0 / t).exp_m1()
            }
        }
    }
}

/// `x` with 4 significant digits (noise scales in EXPLAIN PRIVACY).
pub fn short(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-3..6).contains(&mag) {
        return format!("{x:.3e}");
    }
    let decimals = (3 - mag).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
