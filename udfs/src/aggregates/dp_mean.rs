//! `dp_mean(value, lower, upper, epsilon[, delta[, neighbours]])`: a bounded mean, always within
//! [lower, upper].
//!
//! # `add_remove` and `replace`: noisy sum over noisy count
//! Centre c = (lower + upper)/2 (on the fixed-point grid; see [`super::exact`]). Two Gaussian
//! releases share the call's μ = gaussian_mu(ε, δ) by μ_s² + μ_c² = μ², so the pair is μ-GDP
//! (Dong, Roth, Su 2019) and the call (ε, δ)-DP:
//! - S̃ = Σ (clamp(v) − c) + N(0, σ_s²), σ_s = Δ_s/μ_s, with Δ_s = (upper − lower)/2 under
//!   `add_remove` and upper − lower under `replace` (a value moves across the whole range);
//! - C̃ = n + N(0, σ_c²), σ_c = 1/μ_c (one row in or out, or one value turning NULL).
//!
//! The result is c + S̃ / max(C̃, 1), clamped to [lower, upper] (Google's bounded mean; all
//! post-processing of the two releases).
//!
//! Split of μ (minimax): to first order in the noise, the error of the mean is
//! (Z_s − (m − c)·Z_c)/n with m the true mean, so its variance is (σ_s² + (m − c)²σ_c²)/n².
//! Over all data (|m − c| ≤ h = (upper − lower)/2) the worst case is (Δ_s²/μ_s² + h²/μ_c²)/n².
//! Minimising a ↦ Δ_s²/a + h²/(μ² − a) (a = μ_s²) gives Δ_s²/a² = h²/b², i.e.
//! μ_s² : μ_c² = Δ_s : h. Under `add_remove` (Δ_s = h) this is μ_s = μ_c = μ/√2; under
//! `replace` (Δ_s = 2h) it is μ_s² = 2μ²/3, μ_c² = μ²/3.
//!
//! # `replace_private_keys`: the `replace` calibration, which covers a move between groups
//! Under `replace_private_keys` the changed row can leave group a and join group b, changing
//! both groups' (centred sum, count) pairs; the call uses the `replace` split and sensitivities,
//! with one more grid step of rounding slack on the sum (σ_s = (Δ_s + 2g)/μ_s).
//!
//! *Proof that this stays within μ.* All releases of all groups are Gaussian, so the call is
//! μ'-GDP with μ'² = Σ over released coordinates of (change/σ)² (Dong, Roth, Su 2019, Cor. 3.3,
//! applied to the vector of releases). Write h = (upper − lower)/2 (the largest |v − c|), so
//! Δ_s = 2h, σ_s = (2h + 2g)/μ_s, σ_c ≥ (1 + g_c)/μ_c, and each rounded coordinate moves by at
//! most its change plus one grid step. (i) The row stays in its group: the sum moves by ≤ 2h
//! and the count by 0, or (to/from NULL) the sum by ≤ h and the count by 1, so
//! μ'² ≤ max(μ_s², μ_s²/4 + μ_c²) ≤ μ_s² + μ_c². (ii) The row moves from a to b: each of the two
//! sums moves by ≤ h (+ g) and each count by 1 (+ g_c, or 0 if the row is NULL on that side),
//! so μ'² ≤ 2·((h + g)/σ_s)² + 2·((1 + g_c)/σ_c)² ≤ 2·(μ_s/2)² + 2·μ_c² = μ_s²/2 + 2μ_c².
//! With the `replace` split μ_s² = 2μ²/3, μ_c² = μ²/3 this is μ²/3 + 2μ²/3 = μ² (both shares
//! shrunk by [`SPLIT_SHRINK`], so it is at most μ² after rounding). Both cases are within the
//! call's μ = gaussian_mu(ε, δ): the charge `Gaussian { μ }` is unchanged and the noise is the
//! `replace` noise (up to the one grid step, ≤ 2^−20 relative).
//!
//! # `replace_public_n`: noisy sum over the public n
//! The session sets this mode only when the number n of rows reaching the aggregate is public
//! (replace neighbours, no filter between scan and aggregate, public group keys). All of μ goes
//! to S̃ = Σ (clamp(v) − c) + N(0, σ²), σ = (upper − lower)/μ, and the result is c + S̃/n,
//! clamped. NULL and NaN values are imputed with the centre c (they contribute 0 to the centred
//! sum): a `replace` neighbour may turn a value into NULL, and skipping NULLs would make the
//! divisor (the non-NULL count) private again. With n = 0 (possible only through a FILTER
//! clause) the result is NULL, which reveals nothing since n is public.
//! Example (ε = 0.5, δ = 1e-6, bounds [0, 1e6], n = 10,000): the std of the mean is
//! 1e6/(μ·n) = 805.76.
//!
//! lower = upper: every clamped value equals the bound, and the bound is returned exactly.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::{Finalise, Partial, Shape};
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::exact::{FixedPoint, pow2, release_exact};
use super::interval::{DpCiUdaf, Interval, Noise, mean_intervals};
use super::laplace::LaplaceMean;
use super::params::{MeanParams, Mechanism, Neighbours, representable};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::{PrivacyError, gaussian_mu};

/// The `dp_mean` UDAF.
pub type DpMean = DpUdaf<MeanParams>;

/// `dp_mean` as an [`AggregateUDF`].
pub fn dp_mean_udaf() -> AggregateUDF {
    DpMean::udaf()
}

impl DpFunction for MeanParams {
    const NAME: &'static str = "dp_mean";
    fn spec() -> &'static Spec {
        &SPEC
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Numeric,
    returns: DataType::Float64,
    shape: Shape {
        sum: true,
        sum_sq: false,
        count: true,
        rows: true,
    },
    release: |lits| {
        let p = MeanParams::from_literals(lits)?;
        Ok(match p.mechanism {
            Mechanism::Laplace => Arc::new(LaplaceMean::new(&p)?),
            Mechanism::Gaussian => Arc::new(MeanRelease::new(&p)?),
        })
    },
    description: "Differentially private mean of the values clamped to [lower, upper]; the result \
         is always within [lower, upper]. Under add/remove (default) and replace neighbours: a \
         noisy sum of (clamped value − midpoint) over a noisy count of non-NULL values, the two \
         Gaussian releases sharing the call's μ = gaussian_mu(epsilon, delta) so that the call is \
         (epsilon, delta)-DP; result = midpoint + sum / max(count, 1), clamped. Under \
         'replace_public_n' (public row count n, set by the session): all of μ on the sum \
         (sensitivity upper − lower), NULL/NaN imputed with the midpoint, result = sum / n (NULL \
         when n = 0). Under 'replace_private_keys' (a changed row can move between groups) the \
         replace calibration is used: it covers both groups' changes within μ. NULL and NaN values \
         are skipped otherwise; ±infinity is clamped. Bounds or an epsilon whose noise is not \
         representable fail at planning with the range that works.",
    example: "SELECT job, dp_mean(salary, 0, 1000000, 0.5, 1e-6) FROM salaries GROUP BY job;",
    related: &["dp_sum", "dp_count"],
};

/// Calibrations are rounded outward: the split μ's are shrunk by this factor so that
/// μ_s² + μ_c² ≤ μ² despite floating-point rounding.
const SPLIT_SHRINK: f64 = 1.0 - 1e-12;

/// The release of a `dp_mean` call.
#[derive(Debug, Clone)]
pub(crate) struct MeanRelease {
    pub fp: FixedPoint,
    pub neighbours: Neighbours,
    /// Release of the centred sum, in units of q/2. `None` when lower = upper.
    pub sum_mech: Option<GaussianMechanism>,
    /// Release of the count. `None` under `replace_public_n` or when lower = upper.
    pub count_mech: Option<GaussianMechanism>,
}

impl MeanRelease {
    /// The calibration (module docs); also called by [`MeanParams::cost`], so the accountant
    /// refuses exactly what the planner refuses. A noise that is not representable fails with
    /// the range of epsilon (or of the bounds) that works.
    pub fn new(p: &MeanParams) -> Result<Self, PrivacyError> {
        let bounds = format!("{} (lower {})", p.upper, p.lower);
        representable(p.epsilon, ("upper", &bounds), |epsilon| {
            // Under `units:K:C`: μ/(√K·C) (Neighbours::Units).
            Self::at(
                p,
                p.neighbours.calibration_mu(gaussian_mu(epsilon, p.delta)?),
            )
        })
    }

    fn at(p: &MeanParams, mu: f64) -> Result<Self, PrivacyError> {
        let fp = FixedPoint::new(p.lower, p.upper);
        // Centred values 2x − (lo + hi) in half-units q/2 lie in [−w, w].
        let w = fp.width();
        let half_unit = pow2(fp.exp - 1);
        let (mut sum_mech, mut count_mech) = (None, None);
        if w > 0 {
            let h = w as f64; // worst |m − c|, half-units
            match p.neighbours {
                Neighbours::ReplacePublicN => {
                    sum_mech = Some(GaussianMechanism::from_mu(mu, 2.0 * h * half_unit)?);
                }
                nb => {
                    // Δ_s = h (add/remove) or 2h (replace modes), in half-units (module docs).
                    let ds = if nb.is_replace() { 2.0 * h } else { h };
                    // Minimax split μ_s² : μ_c² = Δ_s : h (module docs), rounded down.
                    let mu_s = mu * (ds / (ds + h)).sqrt() * SPLIT_SHRINK;
                    let mu_c = mu * (h / (ds + h)).sqrt() * SPLIT_SHRINK;
                    // Rounding slack: one grid step, two when a row can move between groups
                    // (σ_s = (2h + 2g)/μ_s, module docs, proof (ii)).
                    let slack = if nb.moves_between_groups() { 2.0 } else { 1.0 };
                    sum_mech = Some(GaussianMechanism::from_mu_with_slack(
                        mu_s,
                        ds * half_unit,
                        slack,
                    )?);
                    count_mech = Some(GaussianMechanism::from_mu(mu_c, 1.0)?);
                }
            }
        }
        Ok(Self {
            fp,
            neighbours: p.neighbours,
            sum_mech,
            count_mech,
        })
    }

    fn release_one(&self, rng: &mut SecureRng, p: &Partial) -> Result<Option<f64>> {
        mean_of(
            &self.fp,
            self.neighbours,
            (self.sum_mech.as_ref(), self.count_mech.as_ref()),
            release_exact,
            rng,
            p,
        )
    }
}

/// The centre c on the grid: (lo + hi)·q/2.
pub(crate) fn centre(fp: &FixedPoint) -> f64 {
    (fp.lo + fp.hi) as f64 * pow2(fp.exp - 1)
}

/// The noisy quantities behind one group's mean ([`draw_mean`]), before post-processing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MeanDraw {
    /// `replace_public_n` with n = 0: NULL.
    Null,
    /// lower = upper: the bound, exactly (no noise).
    Exact(f64),
    /// The centre c, the raw noisy centred sum S̃ (value units), and the divisor: the raw noisy
    /// count C̃ (`Some`, before `max(·, 1)`) or the public row count n (`None`, `rows`).
    Noisy {
        c: f64,
        s: f64,
        count: Option<f64>,
        rows: i64,
    },
}

impl MeanDraw {
    /// The released mean: c + S̃ / max(C̃, 1) (or S̃/n), clamped to [lower, upper].
    pub fn value(&self, lower: f64, upper: f64) -> Option<f64> {
        match *self {
            MeanDraw::Null => None,
            MeanDraw::Exact(v) => Some(v),
            MeanDraw::Noisy { c, s, count, rows } => {
                Some((c + s / Self::divisor(count, rows)).clamp(lower, upper))
            }
        }
    }

    /// max(C̃, 1), or the public n.
    pub fn divisor(count: Option<f64>, rows: i64) -> f64 {
        match count {
            Some(c) => c.max(1.0),
            None => rows as f64,
        }
    }
}

/// One group's mean from its exact partials, with the noise of `release` (the Gaussian or the
/// Laplace sampler on the grid; the module docs give the calibration): the midpoint plus the
/// noisy centred sum Σ(x − c) over the noisy count, at least 1 (or the public row count under
/// `replace_public_n`, NULL when it is 0), clamped to [lower, upper]. Without a sum mechanism
/// (lower = upper) the midpoint.
pub(crate) fn mean_of<M>(
    fp: &FixedPoint,
    neighbours: Neighbours,
    mechs: (Option<&M>, Option<&M>),
    release: fn(&M, &mut SecureRng, i128, i32) -> Result<f64>,
    rng: &mut SecureRng,
    p: &Partial,
) -> Result<Option<f64>> {
    Ok(draw_mean(fp, neighbours, mechs, release, rng, p)?.value(fp.lower, fp.upper))
}

/// The noisy releases behind [`mean_of`], drawn in its order (the sum, then the count).
pub(crate) fn draw_mean<M>(
    fp: &FixedPoint,
    neighbours: Neighbours,
    (sum_mech, count_mech): (Option<&M>, Option<&M>),
    release: fn(&M, &mut SecureRng, i128, i32) -> Result<f64>,
    rng: &mut SecureRng,
    p: &Partial,
) -> Result<MeanDraw> {
    let public_n = neighbours == Neighbours::ReplacePublicN;
    if public_n && p.rows == 0 {
        return Ok(MeanDraw::Null);
    }
    let (lower, upper) = (fp.lower, fp.upper);
    let c = centre(fp);
    let Some(sum_mech) = sum_mech else {
        return Ok(MeanDraw::Exact(c.clamp(lower, upper)));
    };
    let mid = (fp.lo + fp.hi) as i128;
    let centred = p
        .sum
        .saturating_mul(2)
        .saturating_sub(mid.saturating_mul(p.count as i128));
    let s = release(sum_mech, rng, centred, fp.exp - 1)?;
    let count = match count_mech {
        Some(m) => Some(release(m, rng, p.count as i128, 0)?),
        None => None,
    };
    Ok(MeanDraw::Noisy {
        c,
        s,
        count,
        rows: p.rows,
    })
}

impl Finalise for MeanRelease {
    fn shape(&self) -> Shape {
        SPEC.shape
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
                "Gaussian σ = {} on the sum of (value − midpoint), σ = {} on the count",
                s(a.sigma),
                s(b.sigma)
            ),
            (Some(a), None) => format!("Gaussian σ = {} on the sum (public row count)", s(a.sigma)),
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
            draw_mean(&self.fp, self.neighbours, mechs, release_exact, rng, p)
        };
        let noises = (
            self.sum_mech.map(Noise::Gaussian),
            self.count_mech.map(Noise::Gaussian),
        );
        mean_intervals(&self.fp, noises, draw, rng, partials, confidence)
    }
}

impl super::interval::DpInterval for MeanParams {
    const CI_NAME: &'static str = "dp_mean_ci";
}

/// The `dp_mean_ci` UDAF ([`super::interval`]).
pub type DpMeanCi = DpCiUdaf<MeanParams>;

/// `dp_mean_ci` as an [`AggregateUDF`].
pub fn dp_mean_ci_udaf() -> AggregateUDF {
    DpMeanCi::udaf()
}
