//! `mechanism => 'laplace'` for `dp_count`, `dp_sum`, `dp_mean`, `dp_variance` and `dp_stddev`
//! ([`LaplaceVariance`] has its own sensitivities and split): the same exact partials as
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

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::common::Result;

use super::accumulator::{Finalise, Partial, Shape};
use super::dp_variance::{centred_sum, normalised_variance, variance_output};
use super::exact::{FixedPoint, SquareGrid, pow2, release_exact_laplace};
use super::interval::{Interval, Noise, mean_intervals, variance_intervals};
use super::params::{MeanParams, Neighbours, representable};
use crate::mechanisms::LaplaceMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;

/// The L1 factor and rounding slack of a one-row (`add_remove`) calibration under `units:K:C`:
/// (K·C, K·C); (1, 1) otherwise.
fn units_factor(nb: Neighbours) -> f64 {
    if nb.is_units() { nb.pure_factor() } else { 1.0 }
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
        let s = crate::mechanisms::noise::short;
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

/// 16^{1/3} = 2.5198…: the `replace` weight of S₁ in the variance split (module docs of
/// [`LaplaceVariance`]), rounded (any split with ε₁ + ε₂ + ε_c ≤ ε is private).
const CBRT_16: f64 = 2.519_842_099_789_746_3;

/// The three releases of a Laplace `dp_variance` / `dp_stddev` call.
#[derive(Debug, Clone)]
pub(crate) struct LaplaceVarianceMechs {
    /// S₁ = Σ y, in half-units.
    pub sum: LaplaceMechanism,
    /// S₂ = Σ s(y), in square-grid units.
    pub sum_sq: LaplaceMechanism,
    /// n.
    pub count: LaplaceMechanism,
}

/// `dp_variance(…, mechanism => 'laplace')` and `dp_stddev(…, mechanism => 'laplace')`: the
/// Gaussian release's exact partials and post-processing ([`super::dp_variance`]: the centred
/// sum S₁ ∈ [−w, w] per row in half-units, the square sum S₂ ∈ [0, M] per row on its grid, the
/// count n; variance = mean of squares − mean², clamped), with three discrete Laplace noises
/// whose ε's add up to the call's ε (basic composition of pure DP, Dwork and Roth 2014,
/// Theorem 3.16), so the call is pure ε-DP, charged as `Event::PureDp { ε }`.
///
/// # L1 sensitivities (derived here; integer units, as the Gaussian's)
/// - `add_remove`: a row in or out moves S₁ by ≤ w, S₂ by ≤ M, n by 1: (Δ₁, Δ₂, Δ_c) = (w, M, 1);
///   `units:K:C`: K·C times each (up to C rows in each of K groups), slack K·C grid steps.
/// - `replace`, `replace_public_n` (calibrated as `replace`, the public n is not used): a value
///   change moves S₁ by ≤ 2w and S₂ by ≤ M, n not at all; a change to or from NULL moves S₁ by
///   ≤ w, S₂ by ≤ M, n by 1: with (2w, M, 1) the loss is ≤ max(ε₁ + ε₂, ε₁/2 + ε₂ + ε_c) ≤ ε.
/// - `replace_private_keys`: also a row moving from group a to group b, which moves each of the
///   two groups' S₁ by ≤ w, S₂ by ≤ M, n by 1: (2w, 2M, 2) with two grid steps of slack each
///   covers both that (2w/(2w/ε₁) + 2M/(2M/ε₂) + 2/(2/ε_c) = ε) and a change within a group.
///
/// # Split of ε (minimax, derived as the Gaussian's)
/// To first order the error of the normalised variance is (Z₂ − 2m₁Z₁ − (m₂ − 2m₁²)Z_c)/n, of
/// variance 2(b₂'² + 4m₁²b₁'² + (m₂ − 2m₁²)²b_c²)/n² (Laplace variance 2b²; b' in normalised
/// units), worst over data at m₁ = ±1, m₂ = 1: weights a = (1, 4, 1) on (Z₂, Z₁, Z_c). Minimising
/// Σ aᵢΔᵢ'²/εᵢ² subject to Σ εᵢ = ε (Lagrange: aᵢΔᵢ'²/εᵢ³ constant) gives εᵢ ∝ (aᵢΔᵢ'²)^{1/3}
/// with the normalised sensitivities Δ' = Δ/(M, w, 1): ε₂ : ε₁ : ε_c = 1 : 4^{1/3} : 1 under
/// `add_remove`, `units` and `replace_private_keys` (Δ' = (1, 1, 1), or all ×2, or all ×K·C),
/// and 1 : 16^{1/3} : 1 under `replace` (Δ₁' = 2). E.g. add_remove: ε₂ = ε/3.587, so the
/// error of the variance is about 3.587·(upper − lower)²/(4εn) = 0.90·(upper − lower)²/(εn)
/// when the data sit near the middle of the bounds (m₁ ≈ 0).
#[derive(Debug, Clone)]
pub(crate) struct LaplaceVariance {
    pub fp: FixedPoint,
    pub sq: SquareGrid,
    /// `None` when lower = upper.
    pub mechs: Option<LaplaceVarianceMechs>,
    /// √ of the variance (`dp_stddev`).
    pub stddev: bool,
}

impl LaplaceVariance {
    pub fn new(p: &MeanParams, stddev: bool) -> Result<Self, PrivacyError> {
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        representable(p.epsilon, ("upper", &bounds), |epsilon| {
            Self::at(p, epsilon, stddev)
        })
    }

    fn at(p: &MeanParams, epsilon: f64, stddev: bool) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        let sq = SquareGrid::new(&fp);
        let (w, m) = (fp.width() as f64, sq.max as f64);
        let nb = p.neighbours;
        let mut mechs = None;
        if w > 0.0 {
            // (scale factor of all three Δ's, slack, S₁'s extra factor, S₁'s split weight)
            let (f, slack, d1, r1) = match nb {
                Neighbours::Replace | Neighbours::ReplacePublicN => (1.0, 1.0, 2.0, CBRT_16),
                Neighbours::ReplacePrivateKeys => (2.0, 2.0, 1.0, CBRT_4),
                _ => (units_factor(nb), units_factor(nb), 1.0, CBRT_4),
            };
            // ε₁ + ε₂ + ε_c ≤ ε: each share lowered by an ulp.
            let eps1 = (epsilon * r1 / (r1 + 2.0)).next_down();
            let eps2 = ((epsilon - eps1) / 2.0).next_down();
            let build = |eps: f64, delta: f64| {
                LaplaceMechanism::from_epsilon_with_slack(eps, delta.next_up(), slack)
            };
            mechs = Some(LaplaceVarianceMechs {
                sum: build(eps1, f * d1 * w)?,
                sum_sq: build(eps2, f * m)?,
                count: build(eps2, f)?,
            });
        }
        Ok(Self {
            fp,
            sq,
            mechs,
            stddev,
        })
    }

    fn release_one(&self, rng: &mut SecureRng, p: &Partial) -> Result<f64> {
        let Some(m) = &self.mechs else {
            return Ok(0.0);
        };
        let (s1, s2, n) = self.draws(m, rng, p)?;
        let v = normalised_variance(&self.fp, &self.sq, s1, s2, n);
        Ok(variance_output(&self.fp, v, self.stddev))
    }

    /// The three draws (S̃₁, S̃₂, ñ), in the order the release makes them.
    fn draws(
        &self,
        m: &LaplaceVarianceMechs,
        rng: &mut SecureRng,
        p: &Partial,
    ) -> Result<(f64, f64, f64)> {
        let s1 = release_exact_laplace(&m.sum, rng, centred_sum(&self.sq, p), 0)?;
        let s2 = release_exact_laplace(&m.sum_sq, rng, p.sum_sq, 0)?;
        let n = release_exact_laplace(&m.count, rng, p.count as i128, 0)?;
        Ok((s1, s2, n))
    }
}

impl Finalise for LaplaceVariance {
    fn shape(&self) -> Shape {
        super::dp_variance::SHAPE
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        Some(self.fp)
    }
    fn square_grid(&self) -> Option<SquareGrid> {
        Some(self.sq)
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| self.release_one(rng, p))
            .collect::<Result<Vec<f64>>>()?;
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn noise(&self) -> Option<String> {
        Some(match &self.mechs {
            Some(m) => format!(
                "Laplace b = {} on the count (and on the sums of the centred values and their \
                 squares, splitting ε)",
                crate::mechanisms::noise::short(m.count.scale)
            ),
            None => "none (lower = upper)".into(),
        })
    }
    fn finalise_with_intervals(
        &self,
        rng: &mut SecureRng,
        partials: &[Partial],
        confidence: f64,
    ) -> Result<(ArrayRef, Vec<Option<Interval>>)> {
        let noises = self.mechs.as_ref().map(|m| {
            [
                Noise::Laplace(m.sum),
                Noise::Laplace(m.sum_sq),
                Noise::Laplace(m.count),
            ]
        });
        let draw = |rng: &mut SecureRng, p: &Partial| match &self.mechs {
            Some(m) => self.draws(m, rng, p),
            None => Ok((0.0, 0.0, 0.0)),
        };
        variance_intervals(
            (&self.fp, &self.sq),
            noises,
            draw,
            self.stddev,
            rng,
            partials,
            confidence,
        )
    }
}
