//! `mechanism => 'laplace'` for `dp_count`, `dp_sum` and `dp_mean`: the same exact partials as
//! the Gaussian releases ([`super::accumulator`]), released with the exact discrete Laplace
//! (Canonne, Kamath, Steinke 2020, Algorithm 2; [`crate::mechanisms::LaplaceMechanism`]) so
//! that the call is pure ε-DP (δ = 0). Charged as `Event::PureDp { ε }` (params.rs,
//! `laplace_cost`, says why not `Event::Laplace`).
//!
//! # When to choose it
//! Laplace noise has standard deviation √2·Δ₁/ε; the Gaussian's is about Δ₂·√(2 ln(1.25/δ))/ε
//! for one release, but Gaussian releases compose with a privacy loss growing as √k over k
//! releases, Laplace's as k. So: a few releases at a small ε → Laplace (e.g. one count at ε = 0.1,
//! δ = 1e-7: Laplace sd 14, Gaussian σ ≈ 47); many releases on one budget → Gaussian.
//!
//! # L1 sensitivities (derived here) and the scale b = (Δ₁ + slack·g)/ε
//! The discrete Laplace of scale b on the grid g is ε-DP for any vector of per-group statistics
//! whose L1 change (after rounding each coordinate to g) is at most b·ε (independent noises:
//! log-likelihood ratios add over coordinates). One changed row (or unit) changes:
//! - `dp_count`: one group's count by 1 (`add_remove`, `replace`, `replace_public_n`: a value
//!   turning NULL); two groups' counts by 1 each under `replace_private_keys` (L1 = 2, not the
//!   √2 of L2); under `units:K:C` up to C rows in each of K groups: L1 = K·C (not √K·C).
//! - `dp_sum` (grid units, [`FixedPoint`]): `add_remove` m = max(|lo|, |hi|); `replace`,
//!   `replace_public_n` max(hi − lo, m); `replace_private_keys` max(hi − lo, 2m) (|x| + |x'| when
//!   the row moves between groups), rounding slack 2g; `units:K:C` K·C·m with slack K·C
//!   (per group C·m + g ≤ C·(m + g), summed over K groups).
//! - `dp_mean`: the centred sum S (half-units, |y| ≤ w) and the count n, with ε split
//!   ε_s + ε_c = ε (basic composition of pure DP). Sensitivities as `dp_mean`'s Gaussian ones
//!   ([`super::dp_mean`]) but in L1: `add_remove` Δ_s = w, Δ_c = 1; `replace`: Δ_s = 2w (a value
//!   change), Δ_c = 1 (a change to/from NULL moves S by ≤ w and n by 1:
//!   w/b_s + 1/b_c ≤ ε_s/2 + ε_c ≤ ε); `replace_private_keys`: Δ_s = 2w (w in each of two groups,
//!   slack 2g), Δ_c = 2 (slack 2); `units:K:C`: K·C times the `add_remove` ones.
//!   Split (minimax, derived as `dp_mean`'s): the first-order error variance of the mean is
//!   (2b_s² + (m − c)²·2b_c²)/n², worst at |m − c| = w (half-units); minimising
//!   Δ_s²/ε_s² + w²Δ_c'²/ε_c² over ε_s + ε_c = ε (Lagrange: Δ_s²/ε_s³ = w²/ε_c³ for Δ_c' = 1)
//!   gives ε_s : ε_c = Δ_s^{2/3} : w^{2/3}: ε/2 each under `add_remove` and `units`, and
//!   2^{2/3} : 1 (ε_s ≈ 0.613ε) under the replace modes. `replace_public_n` puts all of ε on S
//!   (Δ_s = 2w) and divides by the public n, as the Gaussian release does.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array};
use datafusion::common::Result;

use super::accumulator::{Finalise, Partial, Shape};
use super::exact::{FixedPoint, pow2, release_exact_laplace};
use super::interval::{Interval, Noise, count_intervals, mean_intervals, sum_intervals};
use super::params::{CountParams, MeanParams, Neighbours, SumParams, representable};
use crate::mechanisms::LaplaceMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;

/// The L1 factor and rounding slack of a one-row (`add_remove`) calibration under `units:K:C`:
/// (K·C, K·C); (1, 1) otherwise.
fn units_factor(nb: Neighbours) -> f64 {
    if nb.is_units() { nb.pure_factor() } else { 1.0 }
}

/// `dp_count(…, mechanism => 'laplace')`.
#[derive(Debug, Clone)]
pub(crate) struct LaplaceCount {
    pub mech: LaplaceMechanism,
}

impl LaplaceCount {
    pub fn new(p: &CountParams) -> Result<Self, PrivacyError> {
        // L1: 1, 2 (private keys), K·C (units); slack the same number of grid steps.
        let f = p.neighbours.pure_factor();
        let build = |epsilon: f64| LaplaceMechanism::from_epsilon_with_slack(epsilon, f, f);
        let bound = f.to_string();
        Ok(Self {
            mech: representable(p.epsilon, ("neighbours", &bound), build)?,
        })
    }
}

impl Finalise for LaplaceCount {
    fn shape(&self) -> Shape {
        Shape {
            sum: false,
            sum_sq: false,
            count: true,
            rows: false,
        }
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        None
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| {
                let noisy = release_exact_laplace(&self.mech, rng, p.count as i128, 0)?;
                Ok(noisy.round().max(0.0) as i64)
            })
            .collect::<Result<Vec<i64>>>()?;
        Ok(Arc::new(Int64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(format!(
            "Laplace b = {}",
            super::accumulator::short(self.mech.scale)
        ))
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let release = |rng: &mut SecureRng, c: i128| release_exact_laplace(&self.mech, rng, c, 0);
        count_intervals(
            Noise::Laplace(self.mech),
            release,
            rng,
            partials,
            confidence,
        )
    }
}

/// `dp_sum(…, mechanism => 'laplace')`.
#[derive(Debug, Clone)]
pub(crate) struct LaplaceSum {
    pub fp: FixedPoint,
    /// `None` when the sensitivity is 0 (lower = upper = 0).
    pub mech: Option<LaplaceMechanism>,
}

impl LaplaceSum {
    pub fn new(p: &SumParams) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let m = fp.max_abs();
        // L1 sensitivity in grid units and rounding slack in grid steps (module docs).
        let (units, slack) = match p.neighbours {
            Neighbours::AddRemove | Neighbours::Units { .. } => (m as f64, 1.0),
            Neighbours::Replace | Neighbours::ReplacePublicN => (fp.width().max(m) as f64, 1.0),
            Neighbours::ReplacePrivateKeys => (fp.width().max(2 * m) as f64, 2.0),
        };
        if units == 0.0 {
            return Ok(Self { fp, mech: None });
        }
        let f = units_factor(p.neighbours);
        // units ≤ 2^42, K·C ≤ 10^12, q = 2^e: products exact or rounded up by one ulp at most.
        let sensitivity = (f * units * fp.step()).next_up();
        let build = |epsilon: f64| {
            LaplaceMechanism::from_epsilon_with_slack(epsilon, sensitivity, f * slack)
        };
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        Ok(Self {
            fp,
            mech: Some(representable(p.epsilon, ("upper", &bounds), build)?),
        })
    }
}

impl Finalise for LaplaceSum {
    fn shape(&self) -> Shape {
        Shape {
            sum: true,
            sum_sq: false,
            count: false,
            rows: false,
        }
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| match &self.mech {
                Some(m) => release_exact_laplace(m, rng, p.sum, self.fp.exp),
                None => Ok(0.0),
            })
            .collect::<Result<Vec<f64>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match &self.mech {
            Some(m) => format!("Laplace b = {}", super::accumulator::short(m.scale)),
            None => "none (lower = upper = 0)".into(),
        })
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let exp = self.fp.exp;
        let release = |rng: &mut SecureRng, s: i128| match &self.mech {
            Some(m) => release_exact_laplace(m, rng, s, exp),
            None => Ok(0.0),
        };
        let noise = self.mech.map(Noise::Laplace);
        sum_intervals(noise, release, rng, partials, confidence)
    }
}

/// `dp_mean(…, mechanism => 'laplace')`.
#[derive(Debug, Clone)]
pub(crate) struct LaplaceMean {
    pub fp: FixedPoint,
    pub neighbours: Neighbours,
    /// The centred sum, in half-units (unit exponent exp − 1). `None` when lower = upper.
    pub sum_mech: Option<LaplaceMechanism>,
    /// The count; `None` under `replace_public_n` or when lower = upper.
    pub count_mech: Option<LaplaceMechanism>,
}

/// 2^{2/3}: the replace split ε_s : ε_c (module docs), rounded (any split with ε_s + ε_c ≤ ε
/// is private; the rounding only moves it off the optimum by an ulp).
const CBRT_4: f64 = 1.587_401_051_968_199_4;

impl LaplaceMean {
    pub fn new(p: &MeanParams) -> Result<Self, PrivacyError> {
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        representable(p.epsilon, ("upper", &bounds), |epsilon| {
            Self::at(p, epsilon)
        })
    }

    fn at(p: &MeanParams, epsilon: f64) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let w = fp.width() as f64;
        let half_unit = pow2(fp.exp - 1);
        let nb = p.neighbours;
        let (mut sum_mech, mut count_mech) = (None, None);
        if w > 0.0 {
            if nb == Neighbours::ReplacePublicN {
                sum_mech = Some(LaplaceMechanism::from_epsilon_with_slack(
                    epsilon,
                    2.0 * w * half_unit,
                    1.0,
                )?);
            } else {
                let f = units_factor(nb);
                // (Δ_s, slack_s, Δ_c, slack_c) in half-units / rows (module docs).
                let (ds, ss, dc, sc) = match nb {
                    Neighbours::ReplacePrivateKeys => (2.0 * w, 2.0, 2.0, 2.0),
                    Neighbours::Replace => (2.0 * w, 1.0, 1.0, 1.0),
                    _ => (f * w, f, f, f),
                };
                let share_s = if nb.is_replace() {
                    CBRT_4 / (CBRT_4 + 1.0)
                } else {
                    0.5
                };
                // ε_s + ε_c ≤ ε: each share lowered by an ulp.
                let eps_s = (epsilon * share_s).next_down();
                let eps_c = (epsilon - eps_s).next_down();
                sum_mech = Some(LaplaceMechanism::from_epsilon_with_slack(
                    eps_s,
                    (ds * half_unit).next_up(),
                    ss,
                )?);
                count_mech = Some(LaplaceMechanism::from_epsilon_with_slack(eps_c, dc, sc)?);
            }
        }
        Ok(Self {
            fp,
            neighbours: nb,
            sum_mech,
            count_mech,
        })
    }

    fn release_one(&self, rng: &mut SecureRng, p: &Partial) -> Result<Option<f64>> {
        super::dp_mean::mean_of(
            &self.fp,
            self.neighbours,
            (self.sum_mech.as_ref(), self.count_mech.as_ref()),
            release_exact_laplace,
            rng,
            p,
        )
    }
}

impl Finalise for LaplaceMean {
    fn shape(&self) -> Shape {
        Shape {
            sum: true,
            sum_sq: false,
            count: true,
            rows: true,
        }
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| self.release_one(rng, p))
            .collect::<Result<Vec<Option<f64>>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        let s = super::accumulator::short;
        Some(match (&self.sum_mech, &self.count_mech) {
            (Some(a), Some(b)) => format!(
                "Laplace b = {} on the sum of (value − midpoint), b = {} on the count",
                s(a.scale),
                s(b.scale)
            ),
            (Some(a), None) => format!("Laplace b = {} on the sum (public row count)", s(a.scale)),
            _ => "none (lower = upper)".into(),
        })
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let mechs = (self.sum_mech.as_ref(), self.count_mech.as_ref());
        let draw = |rng: &mut SecureRng, p: &Partial| {
            super::dp_mean::draw_mean(
                &self.fp,
                self.neighbours,
                mechs,
                release_exact_laplace,
                rng,
                p,
            )
        };
        let noises = (
            self.sum_mech.map(Noise::Laplace),
            self.count_mech.map(Noise::Laplace),
        );
        mean_intervals(&self.fp, noises, draw, rng, partials, confidence)
    }
}
