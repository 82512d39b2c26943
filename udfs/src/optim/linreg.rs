//! DP gradient descent for linear regression: the kernels of `dp_linreg_gd`.
//!
//! Both kernels run over rows buffered by [`super::rows::RowBuffer`] (a row-major `f64` matrix),
//! with no per-row allocation; a fit costs O(T·n·p) with p = d (+1 with an intercept). They start
//! at θ₀ = 0 and draw all their noise through [`GaussianMechanism`] on a power-of-two grid
//! (PRIVACY.md, "Noise"), one draw per coordinate per iteration.
//!
//! # `'gaussian'`: per-example clipping ([`GaussianGd`])
//! DP-GD of seed 000 (Lecture 4, §2.2 "Algorithm: DP-Gradient Descent", and §2.5 for the
//! sensitivity) and seed 003 (Lecture 13, Algorithm 2 "Noisy Projected Gradient Descent" and
//! Lemma 1.1), on the squared loss ℓ(θ; x, y) = ½(θ·x̃ − y)², x̃ = (x, 1) with an intercept:
//! 1. per-example gradients gᵢ = (θ·x̃ᵢ − yᵢ)·x̃ᵢ, each clipped to L2 norm `clip`
//!    ([`Clipper`]; seed 000 §2.2 CLIP);
//! 2. S̃ₜ = Σᵢ clip(gᵢ) + N(0, σ²I) (Gaussian mechanism, L2 sensitivity Δ = clip under
//!    add/remove, 2·clip under replace: seed 000 §2.5, seed 003 Lemma 1.1 "2G");
//! 3. θ ← θ − η·(S̃ₜ/ñ + λ·θ_w), with ñ = max(1, 3σ_c, n + N(0, σ_c²)) a noisy count released
//!    once (sensitivity 1), or the public n under `replace_public_n`; λ·θ_w is the gradient of
//!    (λ/2)‖w‖² on the coefficients (not the intercept): exact post-processing. The floor 3σ_c
//!    (σ_c public) changes nothing when n ≫ σ_c, and when n is comparable to σ_c it keeps a count
//!    that fell near 1 from multiplying the step by up to n (on 309 rows at ε = 0.1, δ = 1e-6,
//!    σ_c ≈ 178, the old floor of 1 gave test R² of −10⁵ in some runs; docs/UTILITY.md).
//!
//! **Privacy.** Every release is a Gaussian mechanism; T gradient releases with μ_g each and the
//! count with μ_c compose exactly under Gaussian DP (Dong, Roth, Su 2019, Cor. 3.3; seed 003
//! Lemma 1.1 "what matters is the overall ℓ2 sensitivity of the collection of queries"; seed
//! 001 on tight accounting for DP-GD) to μ = √(T·μ_g² + μ_c²). We set μ = gaussian_mu(ε, δ)
//! (the exact GDP calibration) and split it as μ_c² = μ²/20, T·μ_g² = 19μ²/20 (all of μ² to the
//! gradients under `replace_public_n`). Why 1/20: the count only rescales the step (ñ/n ≈ 1 ± σ_c/n)
//! and does not move the fixed point of the iteration, so it needs little accuracy, while the
//! gradient noise sets the error of the fit; 1/20 inflates the gradient noise by
//! 1/√0.95 − 1 = 2.6% and gives a count error of 4.5/μ rows (19 rows at ε = 1, δ = 1e-6).
//! Adaptivity (θₜ depends on earlier noisy releases) is covered by adaptive composition (seed
//! 000 §1.1). The ledger records `Gaussian { μ }`.
//!
//! *Rows that move between groups* (`replace_private_keys`, a private GROUP BY key): the
//! calibration is the `replace` one (gradient sensitivity 2·clip, count sensitivity 1), and it
//! covers this case. The changed row leaves group a and joins group b: in each iteration each of
//! the two gradient sums moves by ≤ clip (an exact integer vector on the gradient grid, so no
//! rounding slack), and each of the two counts by 1 (plus at most one grid step, which σ_c
//! already includes). Composing all releases of both groups, μ'² ≤ T·2·(clip/σ_g)² +
//! 2·(1/σ_c)² ≤ T·μ_g²/2 + 2μ_c² = μ²·(19/40 + 2/20) = 0.575·μ² ≤ μ² (σ_g ≥ 2·clip/μ_g,
//! σ_c ≥ 1/μ_c). Within a group, as under `replace`: μ'² ≤ max(T·μ_g², T·μ_g²/4 + μ_c²) ≤ μ².
//!
//! # Privacy units (`units:K:C`): per-unit clipping ([`GaussianGd::new_units`], [`GaussianGd::fit_units`])
//! When the table declares a privacy unit, neighbouring datasets differ by **all** the rows of
//! one unit (add/remove a unit), and the call carries the unit key after `neighbours`. The fit
//! is then the user-level DP-SGD of McMahan, Ramage, Talwar, Zhang, "Learning Differentially
//! Private Recurrent Language Models" (ICLR 2018), §3 and Algorithm 1 (each user's update
//! clipped to L2 norm S before the noisy sum), with every unit taking part in every iteration
//! (no sampling) and the rows grouped by the unit key ([`super::units`]):
//! 1. each row's contribution vᵢ = round(clip(gᵢ)/q) exactly as at the row level (below,
//!    "Exact sums"), so ‖vᵢ‖ ≤ c = ⌊clip/q⌋;
//! 2. each unit's exact sum V_u = Σ_{i∈u} vᵢ is clipped **in integers** to ‖clip_c(V_u)‖ ≤ c
//!    ([`super::units::clip_int`]; McMahan et al. 2018, §3, "clip each user's update");
//! 3. S̃ₜ = (Σ_u clip_c(V_u) + Y)·q, the same discrete Gaussian Y as at the row level;
//! 4. ñ = a noisy count of the **units** (not rows), released once, floored as in step 3.
//!
//! *Privacy.* Adding or removing a unit u* adds or removes the one term clip_c(V_{u*}) of each
//! gradient sum and leaves every other term unchanged (a unit's term depends only on its own
//! rows and on θₜ, itself post-processing of earlier releases), so each gradient sum moves by
//! at most c·q ≤ clip in L2 whatever the unit's number of rows, and the count of units by 1.
//! These are the one-row add/remove sensitivities, so the proof above ("Privacy") holds with
//! "row" read as "unit": the T gradient releases and the count compose (Gaussian mechanism;
//! Dong, Roth, Su 2019, Cor. 3.3) to the calibration μ. That calibration is
//! `neighbours.calibration_mu(μ)` = μ/(√K·C), μ = gaussian_mu(ε, δ): with a GROUP BY the session
//! lets a unit reach at most K groups, each group's fit is a separate mechanism that is
//! (μ/√K)-GDP in that unit, and the K fits compose to √(K·μ²/K) = μ (Dong, Roth, Su 2019,
//! Cor. 3.3). The row bound C is not needed here (per-unit clipping bounds a unit's
//! contribution whatever its rows); the session passes C = 1 for models, and a larger C only
//! adds noise. The ledger records the call's `Gaussian { μ }`: the noise grows by √K·C, not the
//! charge. Units are told apart by the exact bytes of their key (arrow's row format), never by
//! a hash: two units merged into one term could move it by up to 2·clip. `'rgm'` is refused
//! under units (it needs a public row count). Without units (every row its own unit), the
//! unit-level kernel with K = C = 1 is exactly the add/remove kernel (test
//! `singleton_units_are_the_row_level_fit`).
//!
//! **Exact sums** (PRIVACY.md, "Numbers on a computer"; Casacuberta et al., CCS 2022). The
//! gradient mechanism's grid step q = 2^e (a power of two, ≤ 2⁻²⁰·Δ, chosen from the literal
//! parameters only) is also the fixed-point unit: each clipped gradient is mapped to integers
//! vᵢ = round(clip(gᵢ)/q) and the check Σⱼ vᵢⱼ² ≤ ⌊clip/q⌋² is made **in integers** (a row
//! that fails it, which float rounding could cause only in principle, contributes 0). The
//! clipping reads ‖x̃ᵢ‖ from [`super::clip::l2_norm`], which never underflows to 0 for x̃ᵢ ≠ 0
//! and is never below maxⱼ|x̃ᵢⱼ|, and the check holds on every input on every build of
//! [`super::kernel`] (round 52, review "unsafe", F1: features ≤ 2⁻⁵³⁸ made the norm 0, so no
//! row was clipped, and the AVX2 lanes accepted a rounded integer of i64::MIN). The sums
//! Σᵢ vᵢ are exact `i128` sums, independent of row order and partitioning, so the L2 sensitivity
//! is exactly ⌊clip/q⌋·q ≤ clip (2·clip under replace); the integer sum is released as
//! (Σᵢ vᵢ + Y)·q with Y a discrete Gaussian vector on the same grid, with no rounding step
//! ([`crate::mechanisms::exact::release_exact`]). The vector of per-coordinate discrete
//! Gaussians N_Z(0, S²) (S ≥ 2²⁰ grid steps) has the privacy curve of the continuous Gaussian
//! up to factors 1 ± O(e^{−2π²S²}) (Canonne, Kamath, Steinke 2020, §2.2 and Thm. 15).
//!
//! **Bad values.** Features and labels are clamped to ±[`VALUE_CLAMP`] (±∞ included) before
//! anything else: a fixed per-row map, so the sensitivity argument is unchanged. The clamp is
//! applied where `dp_linreg_gd`'s row buffer stores the rows
//! ([`super::rows::RowBuffer::with_feature_limit`], [`super::rows::RowBuffer::with_label_limit`];
//! every path, merged partitions and the regrouping by unit included), and the kernels read the
//! buffered rows in place (round 48, follow-up of review "agd", finding 2: `Design` used to copy
//! the whole feature matrix, and the labels, when one value was beyond the clamp, so one private
//! value added 8·n·d bytes outside the memory pool). The values the kernels see are the ones the
//! copy held (the same map, applied once; a clamped value is its own clamp), so every per-row
//! integer vector, and with it "Exact sums" below, is unchanged bit for bit. Rows given to the
//! kernels from Rust should be clamped the same way ([`super::rows::clamp_features`]); any other
//! value still gives each row's integers within ⌊clip/q⌋ (the integer check holds whatever the
//! inputs: [`Clipper::contribution`]), only not the clamped value's. A row whose residual is NaN
//! (overflow of θ·x) contributes 0 to that iteration.
//!
//! **Output.** The average of the iterates θ_{T/2+1}, …, θ_T (tail averaging: post-processing
//! that cuts the stationary noise of constant-step GD; chosen by measurement, see the README).
//!
//! # `'rgm'`: relative Gaussian mechanism on the ridge objective ([`RgmGd`])
//! Hendrikx, Mangold, Bellet (AISTATS 2024), as reconstructed in docs/research/rgm.md §7(b):
//! 1. rows clipped: x̃ᵢ = (xᵢ·min(1, C_x/‖xᵢ‖), 1) (the constant 1 with an intercept), so
//!    ‖x̃ᵢ‖ ≤ C := √(C_x² + 1) (or C_x), and ỹᵢ = clamp(yᵢ, ±C_y);
//! 2. the full gradient of f(θ) = (1/2n)Σᵢ(θ·x̃ᵢ − ỹᵢ)² + (λ/2)‖θ‖² (intercept included in the
//!    penalty, which makes the Hessian H ⪰ λI: docs/research/rgm.md eq. (9)) is
//!    gₜ = (1/n)Σᵢ x̃ᵢ(x̃ᵢ·θₜ − ỹᵢ) + λθₜ, with n the public row count;
//! 3. g̃ₜ = gₜ + N(0, σ²(A + γ‖gₜ‖)² I), with the data-independent relative-sensitivity
//!    constants of docs/research/rgm.md §7(b) step 2 (from eqs. (10)–(11)):
//!    γ = 2C²/(nλ),  A = (2C/n)(C·R + C_y),  R = min(C·C_y/λ, C_y/√λ) ≥ ‖θ*‖;
//!    docs/research/rgm.md uses R = C·C_y/λ, i.e. A = (2C·C_y/n)(1 + C²/λ); the second bound C_y/√λ is ours
//!    (from optimality, see [`RgmGd::radius`]) and cuts A by up to √λ/C;
//! 4. θ ← Π(θ − η'·g̃ₜ), Π the projection on the ball ‖θ‖ ≤ R, which holds the ridge solution
//!    (seed 003 Algorithm 2 projects the same way), and
//!    η' = η/(1 + 2pσ²γ²) (docs/research/rgm.md §5 Theorem 2* / §7(b) step 3; see [`RgmGd::step`]).
//!
//! **Privacy.** Each iteration is an RGM with (σ, A, γ) on a replace-one neighbour relation with
//! n public: its RDP curve is docs/research/rgm.md eq. (5*) ([`crate::privacy::profile::rgm_rdp`]), and T
//! iterations compose by adding curves (Mironov 2017, Prop. 1; docs/research/rgm.md §7(b) step 4). σ is the
//! smallest noise multiplier whose composed curve converts (CKS 2020) to ≤ ε at δ, found by
//! bisection ([`rgm_sigma`]). The curve is increasing in γ, and γ decreases with n, so the cost
//! is fixed at planning with γ at the smallest accepted row count `min_rows` (a literal); a group
//! with fewer rows (n is public) gets a NULL model.
//!
//! **Exactness.** The gradient is computed from exact integer sums on a grid q (a power of two
//! chosen from public quantities only: σ, A, n, θₜ). Its rounding (≤ √p·q/2 per row) enters
//! the absolute term: A_e = A + √p·q·(γ(n+1)/(2n) + 1/n) (derivation in [`RgmGd`]). The noise is
//! a per-coordinate discrete Gaussian on the same grid for both neighbours, with S = ⌈s·n/q⌉
//! steps, S ≥ 2^k; the integer rounding of S and float rounding of s move the ratio of the two
//! neighbours' noise scales by at most a factor (1 + 2⁻⁴⁰) and an additive 2^{−k}, so the
//! accountant uses γ_acc = (1 + γ)(1 + 2⁻⁴⁰) + 2^{−k} − 1 ≥ the true ratio bound − 1.
use datafusion::common::{DataFusionError, Result};

use super::clip::{Clipper, SMALL_INT, l2_norm, round_i64};
use super::kernel::{self, RowPath};
use super::rows::clamp_features;
use super::units::{Units, clip_int};
use crate::mechanisms::GaussianMechanism;
use crate::mechanisms::exact::{exact_log2, floor_log2, pow2, release_exact};
use crate::noise::SecureRng;
use crate::privacy::{Event, PrivacyError, Profile};
use crate::progress;

/// Features and labels are clamped to ±1e150 (squares and products of two stay finite), where
/// `dp_linreg_gd`'s row buffer stores them (module docs, "Bad values"; round 48).
pub const VALUE_CLAMP: f64 = 1e150;

/// The progress name.
const PROGRESS: &str = "dp_linreg_gd";

/// The design matrix as the kernels see it: the buffered rows in place, never copied (features
/// and labels within ±[`VALUE_CLAMP`], clamped by the row buffer: module docs, "Bad values";
/// round 48), and p = d (+1 for the intercept, stored implicitly).
struct Design<'a> {
    d: usize,
    intercept: bool,
    x: &'a [f64],
    y: &'a [f64],
    /// The features transposed in blocks for the blocked pass ([`kernel::transpose_blocks`]),
    /// built by [`Self::with_blocks`]; empty otherwise.
    xt: Vec<f64>,
}

impl<'a> Design<'a> {
    fn new(rows: &'a super::rows::Rows, intercept: bool) -> Self {
        Design {
            d: rows.d,
            intercept,
            x: &rows.x,
            y: &rows.labels,
            xt: Vec::new(),
        }
    }
    /// With the transposed copy of the features that the passes with rows in lanes read, when
    /// they run ([`kernel::lanes`]; n·d more values held during the fit).
    fn with_blocks(mut self, clipper: &Clipper) -> Self {
        if kernel::lanes(clipper, self.p()) {
            self.xt = kernel::transpose_blocks(self.x, self.d);
        }
        self
    }
    fn n(&self) -> usize {
        self.y.len()
    }
    fn p(&self) -> usize {
        self.d + usize::from(self.intercept)
    }
    #[inline]
    fn row(&self, i: usize) -> &[f64] {
        &self.x[i * self.d..(i + 1) * self.d]
    }
    /// ‖x̃ᵢ‖, never below maxⱼ|x̃ᵢⱼ| and never 0 for x̃ᵢ ≠ 0 ([`super::clip::l2_norm`]; round 52:
    /// the sum of squares underflowed to 0 for features ≤ 2⁻⁵³⁸, so the clip never clipped and
    /// the blocked pass's range argument failed).
    fn norm(&self, i: usize) -> f64 {
        l2_norm(self.row(i), self.intercept)
    }
    /// θ·x̃ᵢ.
    #[inline]
    fn dot(&self, theta: &[f64], i: usize) -> f64 {
        let x = self.row(i);
        let mut s = if self.intercept { theta[self.d] } else { 0.0 };
        for j in 0..self.d {
            s += theta[j] * x[j];
        }
        s
    }
}

/// How the gradient sum is turned into a mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Divisor {
    /// A noisy count of the rows used, released once with this mechanism.
    NoisyCount(GaussianMechanism),
    /// The public row count (`replace_public_n`).
    Public,
}

/// The `'gaussian'` kernel (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct GaussianGd {
    pub iterations: u32,
    pub learning_rate: f64,
    pub l2: f64,
    pub fit_intercept: bool,
    /// The gradient-sum release (sensitivity clip or 2·clip, μ_g each).
    pub grad_mech: GaussianMechanism,
    pub divisor: Divisor,
    pub clip: f64,
    /// Output the average of the iterates from this one on (1-based; T = last iterate only).
    pub average_from: u32,
    /// Unit-level (`units:K:C`, module docs "Privacy units"): calibrated at
    /// μ/(√K·C) by [`Self::new_units`]; fits only through [`Self::fit_units`], which clips each
    /// unit's summed contribution and divides by a noisy count of units.
    pub unit_level: bool,
}

/// Calibrations round outward: split μ's are shrunk by this factor (as `dp_mean` does).
const SPLIT_SHRINK: f64 = 1.0 - 1e-12;

/// Share of μ² given to the count under `add_remove` / `replace` (module docs).
pub const COUNT_SHARE: f64 = 1.0 / 20.0;

// The `replace_private_keys` argument (module docs, "Privacy") needs 2·share + (1 − share)/2 ≤ 1,
// i.e. share ≤ 1/3.
const _: () = assert!(COUNT_SHARE <= 1.0 / 3.0);

/// The noisy count that divides the gradient sums is floored at this many of its standard
/// deviations (module docs, step 3).
pub const COUNT_FLOOR_SIGMAS: f64 = 3.0;

impl GaussianGd {
    /// The kernel for a call whose whole fit is μ-GDP: μ from gaussian_mu(ε, δ); `replace`
    /// doubles the gradient sensitivity; `public_n` drops the count release.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mu: f64,
        iterations: u32,
        clip: f64,
        learning_rate: f64,
        l2: f64,
        fit_intercept: bool,
        replace: bool,
        public_n: bool,
    ) -> Result<Self, PrivacyError> {
        let t = iterations as f64;
        let (mu_g, divisor) = if public_n {
            (mu / t.sqrt() * SPLIT_SHRINK, Divisor::Public)
        } else {
            let mu_c = mu * COUNT_SHARE.sqrt() * SPLIT_SHRINK;
            let mu_g = mu * ((1.0 - COUNT_SHARE) / t).sqrt() * SPLIT_SHRINK;
            (
                mu_g,
                Divisor::NoisyCount(GaussianMechanism::from_mu(mu_c, 1.0)?),
            )
        };
        let sensitivity = if replace { 2.0 * clip } else { clip };
        if !sensitivity.is_finite() {
            // 2·clip overflows: no noise is representable (the caller names `clip`).
            return Err(PrivacyError::Infeasible(format!(
                "the gradient sensitivity 2·clip = {sensitivity} is not a finite number"
            )));
        }
        let grad_mech = GaussianMechanism::from_mu(mu_g, sensitivity)?;
        Ok(GaussianGd {
            iterations,
            learning_rate,
            l2,
            fit_intercept,
            grad_mech,
            divisor,
            clip,
            average_from: iterations / 2 + 1,
            unit_level: false,
        })
    }

    /// The unit-level kernel (module docs, "Privacy units") for a call whose whole fit is μ-GDP
    /// at the unit level under `neighbours` = `units:K:C`: the add/remove calibration at
    /// `neighbours.calibration_mu(μ)` = μ/(√K·C) (rounded down; C = 1 for models, a larger C
    /// only adds noise). Gradient sensitivity `clip` (one unit's clipped sum), count sensitivity
    /// 1 (one unit), no public n.
    #[allow(clippy::too_many_arguments)]
    pub fn new_units(
        mu: f64,
        neighbours: crate::privacy::Neighbours,
        iterations: u32,
        clip: f64,
        learning_rate: f64,
        l2: f64,
        fit_intercept: bool,
    ) -> Result<Self, PrivacyError> {
        if !neighbours.is_units() {
            return Err(PrivacyError::invalid(
                "neighbours",
                format!("'{neighbours}'"),
                "'units:K:C' for the unit-level kernel",
            ));
        }
        let mut k = Self::new(
            neighbours.calibration_mu(mu),
            iterations,
            clip,
            learning_rate,
            l2,
            fit_intercept,
            false,
            false,
        )?;
        k.unit_level = true;
        Ok(k)
    }

    /// The clipper on the mechanism's grid.
    pub fn clipper(&self, p: usize) -> Result<Clipper> {
        let exp = exact_log2(self.grad_mech.granularity).ok_or_else(|| {
            DataFusionError::Internal("gradient grid is not a power of two".into())
        })?;
        Ok(Clipper::new(self.clip, exp, p))
    }

    /// The integer contribution of one example (x, y) at θ, computed exactly as in
    /// `dp_linreg_gd`'s fit (the row buffer's clamp to ±[`VALUE_CLAMP`], then residual, norm,
    /// clipping): for tests of the clipping bound.
    /// Also returns whether the row contributed (false: NaN residual or a failed integer check).
    pub fn example_contribution(
        &self,
        x: &[f64],
        y: f64,
        theta: &[f64],
    ) -> Result<(Vec<i64>, bool)> {
        let mut rows = super::rows::Rows {
            d: x.len(),
            labels: vec![y],
            x: x.to_vec(),
        };
        clamp_features(&mut rows.x, VALUE_CLAMP);
        clamp_features(&mut rows.labels, VALUE_CLAMP);
        let design = Design::new(&rows, self.fit_intercept);
        let p = design.p();
        let clipper = self.clipper(p)?;
        let mut v = vec![0i64; p];
        let r = design.dot(theta, 0) - design.y[0];
        let used =
            clipper.contribution(design.row(0), self.fit_intercept, r, design.norm(0), &mut v);
        Ok((v, used))
    }

    /// Fits on `rows` (read in place, as `dp_linreg_gd`'s buffer stores them: within
    /// ±[`VALUE_CLAMP`], module docs "Bad values"); `public_n` is the public row count (used
    /// only with [`Divisor::Public`]). Returns θ (p values; the intercept last), or `None` when
    /// the public n is 0. A unit-level kernel refuses (it needs [`Self::fit_units`]).
    pub fn fit(
        &self,
        rows: &super::rows::Rows,
        public_n: u64,
        rng: &mut SecureRng,
    ) -> Result<Option<Vec<f64>>> {
        if self.unit_level {
            return Err(DataFusionError::Internal(
                "dp_linreg_gd: a unit-level kernel fits only with the rows' units".into(),
            ));
        }
        self.fit_inner(rows, public_n, None, rng)
    }

    /// Fits a unit-level kernel ([`Self::new_units`]) on `rows` grouped by `units` (unit u owns
    /// the rows `units.range(u)`; module docs, "Privacy units"): each iteration releases
    /// Σ_units clip(Σ_{rows of u} clip(gᵢ)) + noise, divided by a noisy count of the units.
    pub fn fit_units(
        &self,
        rows: &super::rows::Rows,
        units: &Units,
        rng: &mut SecureRng,
    ) -> Result<Option<Vec<f64>>> {
        if !self.unit_level || units.rows() != rows.n() {
            return Err(DataFusionError::Internal(
                "dp_linreg_gd: units given to a row-level kernel, or not covering the rows".into(),
            ));
        }
        self.fit_inner(rows, 0, Some(units), rng)
    }

    /// The exact gradient sum of one iteration at `theta`, in grid units (multiply by
    /// [`Self::grid`] for the gradient's units), before noise: Σᵢ clip(gᵢ) without `units`,
    /// Σ_u clip(Σ_{i∈u} clip(gᵢ)) with them. The quantity the Gaussian mechanism releases in
    /// [`Self::fit`] / [`Self::fit_units`] (the same code), for sensitivity tests.
    pub fn gradient_sum(
        &self,
        rows: &super::rows::Rows,
        units: Option<&Units>,
        theta: &[f64],
    ) -> Result<Vec<i128>> {
        self.gradient_sum_with(rows, units, theta, RowPath::Auto)
    }

    /// [`Self::gradient_sum`] through a chosen implementation of the row pass
    /// ([`super::kernel`]): every [`RowPath`] gives the same integers (exactness tests).
    pub fn gradient_sum_with(
        &self,
        rows: &super::rows::Rows,
        units: Option<&Units>,
        theta: &[f64],
        path: RowPath,
    ) -> Result<Vec<i128>> {
        let design = Design::new(rows, self.fit_intercept);
        let clipper = self.clipper(design.p())?;
        let design = design.with_blocks(&clipper);
        let norms: Vec<f64> = (0..design.n()).map(|i| design.norm(i)).collect();
        Ok(self.sums(&design, &norms, &clipper, theta, units, path))
    }

    /// One noisy gradient release at `theta`, as each iteration of the fit draws it: the
    /// [`Self::gradient_sum`] plus the discrete Gaussian noise of `grad_mech`, in the gradient's
    /// units. For statistical tests of the noise scale.
    pub fn noisy_gradient_sum(
        &self,
        rows: &super::rows::Rows,
        units: Option<&Units>,
        theta: &[f64],
        rng: &mut SecureRng,
    ) -> Result<Vec<f64>> {
        let sums = self.gradient_sum(rows, units, theta)?;
        let exp = self.clipper(theta.len())?.exp;
        sums.iter()
            .map(|&s| release_exact(&self.grad_mech, rng, s, exp))
            .collect()
    }

    /// The bytes a fit over n rows of d features holds beyond the buffered rows: ‖x̃ᵢ‖ per row,
    /// and the transposed features of the passes with rows in lanes when they apply
    /// ([`Design::with_blocks`]); the rows themselves are read in place, never copied (module
    /// docs, "Bad values"; round 48). The accumulator counts them in its size, so that the
    /// session's memory limit bounds the fit's working set as well as the buffer. A function of
    /// n, d and the call's literals only.
    pub fn working_bytes(&self, n: usize, d: usize) -> usize {
        let p = d + usize::from(self.fit_intercept);
        let blocks = if self.clipper(p).is_ok_and(|c| kernel::lanes(&c, p)) {
            n * d
        } else {
            0
        };
        (n + blocks) * size_of::<f64>()
    }

    /// The fixed-point unit q of the gradient sums (a power of two).
    pub fn grid(&self) -> f64 {
        self.grad_mech.granularity
    }

    /// The exact (integer) gradient sums at θ over all rows, or over all units.
    fn sums(
        &self,
        design: &Design,
        norms: &[f64],
        clipper: &Clipper,
        theta: &[f64],
        units: Option<&Units>,
        path: RowPath,
    ) -> Vec<i128> {
        let p = design.p();
        let mut sums = vec![0i128; p];
        // Exact integer sums, on several threads for large n (the same integers in any split:
        // `super::par_ranges`); by units, each thread takes whole units.
        let parts = if kernel::eligible(clipper, p) {
            // The blocked pass (`super::kernel`): the same integers as the row-at-a-time code.
            let pass = kernel::Pass {
                d: design.d,
                intercept: self.fit_intercept,
                x: design.x,
                xt: &design.xt,
                y: design.y,
                norms,
                theta,
                clipper,
            };
            match units {
                None => super::par_ranges(design.n(), |rows| {
                    let mut out = vec![0i128; p];
                    let mut part = vec![0i64; p];
                    let mut start = rows.start;
                    while start < rows.end {
                        let end = rows.end.min(start + kernel::FLUSH_ROWS);
                        pass.add_rows(start..end, &mut part, path);
                        for (o, a) in out.iter_mut().zip(part.iter_mut()) {
                            *o += *a as i128;
                            *a = 0;
                        }
                        start = end;
                    }
                    out
                }),
                Some(u) => super::par_ranges(u.count(), |us| {
                    let mut out = vec![0i128; p];
                    let mut unit = vec![0i128; p];
                    let mut part = vec![0i64; p];
                    for k in us {
                        unit.iter_mut().for_each(|a| *a = 0);
                        let rows = u.range(k);
                        let mut start = rows.start;
                        while start < rows.end {
                            let end = rows.end.min(start + kernel::FLUSH_ROWS);
                            pass.add_rows(start..end, &mut part, path);
                            for (o, a) in unit.iter_mut().zip(part.iter_mut()) {
                                *o += *a as i128;
                                *a = 0;
                            }
                            start = end;
                        }
                        // Per-unit clipping, as in `unit_gradient_sums`.
                        clip_int(&mut unit, clipper.c_int);
                        for (o, &a) in out.iter_mut().zip(&unit) {
                            *o += a;
                        }
                    }
                    out
                }),
            }
        } else {
            match units {
                None => super::par_ranges(design.n(), |rows| {
                    self.gradient_sums(design, norms, clipper, theta, rows)
                }),
                Some(u) => super::par_ranges(u.count(), |us| {
                    self.unit_gradient_sums(design, norms, clipper, theta, u, us)
                }),
            }
        };
        for part in parts {
            for (s, v) in sums.iter_mut().zip(part) {
                *s += v;
            }
        }
        sums
    }

    fn fit_inner(
        &self,
        rows: &super::rows::Rows,
        public_n: u64,
        units: Option<&Units>,
        rng: &mut SecureRng,
    ) -> Result<Option<Vec<f64>>> {
        let design = Design::new(rows, self.fit_intercept);
        let (n, d, p) = (design.n(), design.d, design.p());
        let clipper = self.clipper(p)?;
        let design = design.with_blocks(&clipper);
        // What the noisy count counts: rows, or units (sensitivity 1 either way).
        let counted = units.map_or(n, Units::count);
        let denom = match &self.divisor {
            Divisor::Public => {
                if public_n == 0 {
                    return Ok(None);
                }
                public_n as f64
            }
            // Post-processing of the released count with its public σ (module docs, step 3).
            Divisor::NoisyCount(m) => release_exact(m, rng, counted as i128, 0)?
                .max(COUNT_FLOOR_SIGMAS * m.sigma)
                .max(1.0),
        };
        // ‖x̃ᵢ‖ once: it does not change across iterations.
        let norms: Vec<f64> = (0..n).map(|i| design.norm(i)).collect();
        let mut theta = vec![0.0; p];
        let mut avg = vec![0.0; p];
        let mut n_avg = 0u32;
        let t_total = self.iterations;
        let started = progress::generation();
        for t in 1..=t_total {
            if progress::cancelled(started) {
                return Err(progress::cancelled_error(PROGRESS));
            }
            let sums = self.sums(&design, &norms, &clipper, &theta, units, RowPath::Auto);
            for j in 0..p {
                let noisy = release_exact(&self.grad_mech, rng, sums[j], clipper.exp)?;
                let reg = if j < d { self.l2 * theta[j] } else { 0.0 };
                theta[j] -= self.learning_rate * (noisy / denom + reg);
            }
            if t >= self.average_from {
                n_avg += 1;
                let k = n_avg as f64;
                for (a, &x) in avg.iter_mut().zip(&theta) {
                    *a += (x - *a) / k;
                }
            }
            progress::report(PROGRESS, t as u64, t_total as u64);
        }
        Ok(Some(if n_avg > 0 { avg } else { theta }))
    }

    /// Σ over the units `us` of clip(Σ_{i∈u} vᵢ), vᵢ the clipped integer contribution of row i
    /// (as in [`Self::gradient_sums`]); each unit's sum is clipped to ⌊clip/q⌋ in integers
    /// ([`clip_int`]; module docs, "Privacy units").
    fn unit_gradient_sums(
        &self,
        design: &Design,
        norms: &[f64],
        clipper: &Clipper,
        theta: &[f64],
        units: &Units,
        us: std::ops::Range<usize>,
    ) -> Vec<i128> {
        let p = design.p();
        let mut sums = vec![0i128; p];
        let mut unit = vec![0i128; p];
        let mut v = vec![0i64; p];
        for u in us {
            unit.iter_mut().for_each(|a| *a = 0);
            for i in units.range(u) {
                let r = design.dot(theta, i) - design.y[i];
                if clipper.contribution(design.row(i), self.fit_intercept, r, norms[i], &mut v) {
                    for (a, &b) in unit.iter_mut().zip(&v) {
                        // |b| ≤ c_int < 2^63 and at most 2^63 rows: no overflow in i128.
                        *a += b as i128;
                    }
                }
            }
            // Per-unit clipping to c = ⌊clip/q⌋ (McMahan et al. 2018, §3, per-user clipping;
            // module docs, "Privacy units"): one unit moves the sum by ≤ c·q ≤ clip.
            clip_int(&mut unit, clipper.c_int);
            for (s, &a) in sums.iter_mut().zip(&unit) {
                *s += a;
            }
        }
        sums
    }

    /// Σ over `rows` of the clipped per-example gradients at `theta`, as exact integers in grid
    /// units (module docs, "Exact sums"): `i64` partial sums of at most 2^31 rows of |v| < 2^31
    /// (no overflow), flushed into `i128`; plain `i128` when the grid is finer than that.
    fn gradient_sums(
        &self,
        design: &Design,
        norms: &[f64],
        clipper: &Clipper,
        theta: &[f64],
        rows: std::ops::Range<usize>,
    ) -> Vec<i128> {
        let p = design.p();
        let small = clipper.c_int < SMALL_INT;
        let mut sums = vec![0i128; p];
        let mut part = vec![0i64; p];
        let mut v = vec![0i64; p];
        let mut pending = 0u64;
        for i in rows {
            let r = design.dot(theta, i) - design.y[i];
            if clipper.contribution(design.row(i), self.fit_intercept, r, norms[i], &mut v) {
                if small {
                    for (a, &b) in part.iter_mut().zip(&v) {
                        *a += b;
                    }
                    pending += 1;
                    if pending == 1 << 31 {
                        for (s, a) in sums.iter_mut().zip(part.iter_mut()) {
                            *s += *a as i128;
                            *a = 0;
                        }
                        pending = 0;
                    }
                } else {
                    for (s, &b) in sums.iter_mut().zip(&v) {
                        *s += b as i128;
                    }
                }
            }
        }
        for (s, &a) in sums.iter_mut().zip(&part) {
            *s += a as i128;
        }
        sums
    }
}

/// Bits of the RGM noise grid: S ≥ 2^k steps at the smallest noise level; the accountant's γ
/// slack is 2^{−k} (module docs). k is lowered (down to [`RGM_MIN_GRID_BITS`]) only when the
/// largest noise level would exceed the sampler's 2^28 steps.
pub const RGM_GRID_BITS: i32 = 20;
pub const RGM_MIN_GRID_BITS: i32 = 12;

/// The RDP orders' accountant slack on γ (module docs, "Exactness").
pub fn rgm_gamma_acc(gamma: f64, grid_bits: i32) -> f64 {
    (1.0 + gamma) * (1.0 + pow2(-40)) + pow2(-grid_bits) - 1.0
}

/// ε at δ of T compositions of the RGM with (σ, γ, dims) (the accountant's own conversion).
pub fn rgm_epsilon(sigma: f64, gamma: f64, dims: u32, steps: u32, delta: f64) -> f64 {
    Profile::from_event(&Event::Rgm {
        sigma,
        gamma,
        dims,
        steps,
    })
    .epsilon(delta)
}

/// The smallest σ (to a relative 1e-9, rounded up) such that `steps` compositions of the RGM
/// with relative sensitivity γ in `dims` dimensions are (ε, δ)-DP by the accountant's
/// conversion. Infeasible when even σ = ∞ gives more than ε: the message names the floor.
pub fn rgm_sigma(
    epsilon: f64,
    delta: f64,
    gamma: f64,
    dims: u32,
    steps: u32,
) -> Result<f64, PrivacyError> {
    let floor = rgm_epsilon(f64::INFINITY, gamma, dims, steps, delta);
    if floor.is_nan() || floor >= epsilon {
        return Err(PrivacyError::Infeasible(format!(
            "the relative Gaussian mechanism cannot reach epsilon = {epsilon} at delta = {delta} \
             with {steps} iterations in {dims} dimensions: its epsilon floor (infinite noise) is \
             {floor:.4} for relative sensitivity gamma = {gamma:.3e} = 2·C²/(min_rows·l2); raise \
             min_rows or l2, lower feature_bound or iterations, or raise epsilon"
        )));
    }
    let ok = |s: f64| rgm_epsilon(s, gamma, dims, steps, delta) <= epsilon;
    let (mut lo, mut hi) = (1e-6f64, 1.0f64);
    while !ok(hi) {
        lo = hi;
        hi *= 2.0;
        if hi > 1e15 {
            return Err(PrivacyError::Infeasible(format!(
                "no RGM noise level reaches epsilon = {epsilon} (floor {floor:.4})"
            )));
        }
    }
    if ok(lo) {
        return Ok(lo);
    }
    while hi / lo > 1.0 + 1e-9 {
        let mid = (lo * hi).sqrt();
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// The `'rgm'` kernel (module docs).
///
/// Rounding argument behind A_e (module docs, "Exactness"): the released mean is
/// ĝ = F·q/n with F = Σᵢ round(x̃ᵢ(x̃ᵢ·θ − ỹᵢ)/q) + round(nλθ/q) exact integers, so ĝ = g + E
/// with ‖E‖ ≤ √p·q/2·(1 + 1/n), and E − E′ comes from the replaced row only: ‖E − E′‖ ≤ √p·q/n
/// (the λθ term is the same for both neighbours). With ‖g − g′‖ ≤ A + γ‖g‖ (docs/research/rgm.md eq. (10)),
/// ‖ĝ − ĝ′‖ ≤ A + γ(‖ĝ‖ + ‖E‖) + √p·q/n ≤ A_e + γ‖ĝ‖. The noise std is
/// σ·s with s ≥ A_e + γ‖ĝ‖ (rounded up), which is the RGM's requirement (docs/research/rgm.md Definition 2,
/// Lemma 1, in its min-form by symmetry).
#[derive(Debug, Clone, PartialEq)]
pub struct RgmGd {
    pub iterations: u32,
    pub learning_rate: f64,
    pub l2: f64,
    pub fit_intercept: bool,
    pub feature_bound: f64,
    pub label_bound: f64,
    /// The noise multiplier σ (calibrated for γ at `min_rows`).
    pub sigma: f64,
    /// The smallest accepted public n.
    pub min_rows: u64,
    /// k: the noise grid keeps S ≥ 2^k steps.
    pub grid_bits: i32,
    /// Number of features d (p = d + intercept).
    pub dims: u32,
}

impl RgmGd {
    /// C = √(C_x² + 1) with an intercept, else C_x.
    pub fn c(&self) -> f64 {
        if self.fit_intercept {
            (self.feature_bound * self.feature_bound + 1.0).sqrt()
        } else {
            self.feature_bound
        }
    }
    pub fn p(&self) -> u32 {
        self.dims + u32::from(self.fit_intercept)
    }
    /// γ = 2C²/(nλ) (docs/research/rgm.md §7(b) step 2).
    pub fn gamma(&self, n: u64) -> f64 {
        let c = self.c();
        2.0 * c * c / (n as f64 * self.l2)
    }
    /// A = (2C/n)(C·R + C_y) with R = min(C·C_y/λ, C_y/√λ) the bound on ‖θ*‖ ([`Self::radius`]):
    /// docs/research/rgm.md §7(b) step 2 (A = sup‖∇f′(θ*)‖ ≤ (2/n)·C·(C‖θ*‖ + C_y)), which with rgm.md's
    /// ‖θ*‖ ≤ C·C_y/λ is (2C·C_y/n)(1 + C²/λ).
    pub fn a(&self, n: u64) -> f64 {
        let c = self.c();
        2.0 * c / n as f64 * (c * self.radius() + self.label_bound)
    }
    /// R = min(C·C_y/λ, C_y/√λ), a data-independent bound on the ridge solution ‖θ*‖:
    /// ‖θ*‖ = ‖H⁻¹b‖ ≤ ‖b‖/λ ≤ C·C_y/λ (docs/research/rgm.md §7(b) step 2), and, ours, from optimality
    /// (λ/2)‖θ*‖² ≤ f(θ*) ≤ f(0) = (1/2n)Σỹᵢ² ≤ C_y²/2, so ‖θ*‖ ≤ C_y/√λ (smaller whenever
    /// λ < C²; e.g. 10× smaller at C² = 11, λ = 0.1). Also the projection radius.
    pub fn radius(&self) -> f64 {
        let cy = self.label_bound;
        (self.c() * cy / self.l2).min(cy / self.l2.sqrt())
    }
    /// An upper bound on the ratio of the largest to the smallest noise level over all
    /// iterations (public: n cancels in γ/A), for the sampler's range.
    pub fn ratio_bound(&self) -> f64 {
        let c = self.c();
        let r = self.radius();
        let p = self.p() as f64;
        // ‖g‖ ≤ C(C·R + C_y) + λR (θ stays in the ball of radius R); γ/A does not depend on n;
        // the rounding term adds γ·√p·q(1 + 1/n) with q ≤ σ·A·n·2^{−k}, i.e. a ratio
        // ≤ 2γn·√p·σ·2^{−k} = 4√p·σ·C²·2^{−k}/λ.
        let g = c * (c * r + self.label_bound) + self.l2 * r;
        let rel = self.gamma(1) / self.a(1);
        (1.0 + rel * g + 4.0 * p.sqrt() * self.sigma * c * c * pow2(-self.grid_bits) / self.l2)
            * 1.01
    }
    /// The planned cost: T compositions at γ_acc(min_rows).
    pub fn event(&self) -> Event {
        Event::Rgm {
            sigma: self.sigma,
            gamma: rgm_gamma_acc(self.gamma(self.min_rows), self.grid_bits),
            dims: self.p(),
            steps: self.iterations,
        }
    }
    /// The step size actually used: η/(1 + 2pσ²γ²). docs/research/rgm.md §5 Theorem 2* (and §7(b) step 3)
    /// takes η ≤ 1/(L(1 + 2pσ²γ²)): the relative part of the noise, whose variance grows with
    /// ‖g‖², shrinks the stable step by that factor. The smoothness part 1/L is left to
    /// `learning_rate`, as for 'gaussian' (the data-independent bound L ≤ C² + λ is far above
    /// the usual λ_max(H) and made convergence several times slower in our measurements).
    pub fn step(&self, n: u64) -> f64 {
        let g = self.gamma(n);
        self.learning_rate / (1.0 + 2.0 * self.p() as f64 * self.sigma * self.sigma * g * g)
    }

    /// The bytes a fit over n rows holds beyond the buffered rows (read in place: module docs,
    /// "Bad values"; round 48): the clipped rows x̃ᵢ (p values each) and the clamped labels, in
    /// [`Self::fit`]. The accumulator counts them in its size, as `'gaussian'`'s
    /// ([`GaussianGd::working_bytes`]). A function of n and the call's literals only.
    pub fn working_bytes(&self, n: usize) -> usize {
        n.saturating_mul(self.p() as usize + 1)
            .saturating_mul(size_of::<f64>())
    }

    /// Fits on `rows` (read in place, within ±[`VALUE_CLAMP`] as `dp_linreg_gd`'s buffer stores
    /// them) with public row count `n` (rows skipped for NULL/NaN count in n and
    /// contribute 0). `None` when n < min_rows.
    pub fn fit(
        &self,
        rows: &super::rows::Rows,
        n: u64,
        rng: &mut SecureRng,
    ) -> Result<Option<Vec<f64>>> {
        if n < self.min_rows.max(1) {
            return Ok(None);
        }
        let design = Design::new(rows, self.fit_intercept);
        let (m, d, p) = (design.n(), design.d, design.p());
        if p != self.p() as usize {
            return Err(DataFusionError::Execution(format!(
                "features: expected {} values per row, got {d}",
                self.dims
            )));
        }
        // 1. clip rows into a p-column matrix (x̃ with the constant 1) and clamp labels.
        let cx = self.feature_bound * (1.0 - 1e-12);
        let mut xt = vec![0.0; m * p];
        let mut yt = vec![0.0; m];
        for i in 0..m {
            let x = design.row(i);
            let nrm = l2_norm(x, false);
            let s = if nrm > cx { cx / nrm } else { 1.0 };
            let out = &mut xt[i * p..(i + 1) * p];
            for (o, v) in out[..d].iter_mut().zip(x) {
                *o = v * s;
            }
            if self.fit_intercept {
                out[d] = 1.0;
            }
            yt[i] = design.y[i].clamp(-self.label_bound, self.label_bound);
        }
        let nf = n as f64;
        let gamma = self.gamma(n);
        let a = self.a(n);
        let radius = self.radius();
        let eta = self.step(n);
        let mut theta = vec![0.0; p];
        let mut avg = vec![0.0; p];
        let mut n_avg = 0u32;
        let average_from = self.iterations / 2 + 1;
        let mut sums = vec![0i128; p];
        let sqrt_p = (p as f64).sqrt();
        let started = progress::generation();
        for t in 1..=self.iterations {
            if progress::cancelled(started) {
                return Err(progress::cancelled_error(PROGRESS));
            }
            // The grid: S ≥ 2^k at the smallest noise level σ·A (public: σ, A, n).
            let e = floor_log2(self.sigma * a * nf * pow2(-self.grid_bits));
            let q = pow2(e);
            let inv_q = pow2(-e);
            let a_e = a + sqrt_p * q * (gamma * (nf + 1.0) / (2.0 * nf) + 1.0 / nf);
            // F = Σ round(x̃(x̃·θ − ỹ)/q) + round(nλθ/q), exact.
            sums.iter_mut().for_each(|s| *s = 0);
            for i in 0..m {
                let xr = &xt[i * p..(i + 1) * p];
                let r: f64 = xr.iter().zip(&theta).map(|(a, b)| a * b).sum::<f64>() - yt[i];
                let rq = r * inv_q;
                for (s, &v) in sums.iter_mut().zip(xr) {
                    *s += round_i64(rq * v) as i128;
                }
            }
            for (s, &th) in sums.iter_mut().zip(&theta) {
                *s += (nf * self.l2 * th * inv_q).round() as i128;
            }
            // ‖ĝ‖ by `l2_norm` (round 52: Σ ĝⱼ² underflowed to 0 for |ĝⱼ| ≤ 2⁻⁵³⁸, which dropped
            // the γ‖ĝ‖ term from the noise scale; the same bits wherever it did not underflow).
            let g: Vec<f64> = sums.iter().map(|&s| s as f64 * q / nf).collect();
            let g_norm = l2_norm(&g, false);
            // std in sum units (of q): ⌈σ(A_e + γ'‖ĝ‖)·n/q⌉, rounded outward.
            let s_mean =
                self.sigma * (a_e + gamma * (1.0 + pow2(-48)) * g_norm) * (1.0 + pow2(-45));
            let steps = (s_mean * nf * inv_q).ceil();
            if !(steps.is_finite() && steps >= pow2(self.grid_bits) && steps < pow2(28)) {
                return Err(DataFusionError::Internal(format!(
                    "rgm: noise scale of {steps} grid steps outside [2^{}, 2^28)",
                    self.grid_bits
                )));
            }
            let mech = GaussianMechanism {
                sigma: steps * q,
                granularity: q,
            };
            let mut norm2 = 0.0;
            for j in 0..p {
                let noisy = release_exact(&mech, rng, sums[j], e)?;
                theta[j] -= eta * noisy / nf;
                norm2 += theta[j] * theta[j];
            }
            // Projection on the ball ‖θ‖ ≤ R (post-processing).
            let norm = norm2.sqrt();
            if norm > radius {
                let s = radius / norm;
                theta.iter_mut().for_each(|v| *v *= s);
            }
            if t >= average_from {
                n_avg += 1;
                let k = n_avg as f64;
                for (av, &x) in avg.iter_mut().zip(&theta) {
                    *av += (x - *av) / k;
                }
            }
            progress::report(PROGRESS, t as u64, self.iterations as u64);
        }
        Ok(Some(if n_avg > 0 { avg } else { theta }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        for (x, want) in [
            (0.5, 1),
            (-0.5, -1),
            (0.49999999999999994, 0),
            (2.5, 3),
            (-2.4, -2),
            (1e300, i64::MAX),
            (-1e300, i64::MIN),
            (f64::NAN, 0),
            (4503599627370497.0, 4503599627370497),
        ] {
            assert_eq!(round_i64(x), want, "{x}");
            if x.abs() < 1e18 {
                assert_eq!(round_i64(x), x.round() as i64, "{x}");
            }
        }
    }

    #[test]
    fn clipper_bounds_integer_norm() {
        let c = Clipper::new(1.0, -20, 3);
        let mut out = vec![0i64; 3];
        assert!(c.contribution(&[3.0, 4.0], true, 10.0, 26f64.sqrt(), &mut out));
        let sq: u128 = out.iter().map(|&v| (v * v) as u128).sum();
        assert!(sq <= (c.c_int as u128).pow(2));
        // NaN residual: nothing.
        assert!(!c.contribution(&[1.0, 1.0], true, f64::NAN, 3f64.sqrt(), &mut out));
        assert_eq!(out, vec![0, 0, 0]);
    }

    /// Unit level with every row its own unit and K = C = 1 is the row-level add/remove fit
    /// (same calibration, same sums: the count of singleton units is the row count).
    #[test]
    fn singleton_units_are_the_row_level_fit() {
        use crate::privacy::Neighbours;
        let rows = super::super::rows::Rows {
            d: 2,
            labels: (0..50).map(|i| (i % 7) as f64 - 3.0).collect(),
            x: (0..100)
                .map(|i| ((i * 13) % 11) as f64 / 5.0 - 1.0)
                .collect(),
        };
        let mu = 0.8;
        let a = GaussianGd::new(mu, 12, 0.5, 0.5, 0.0, true, false, false).unwrap();
        let b = GaussianGd::new_units(
            mu,
            Neighbours::Units { groups: 1, rows: 1 },
            12,
            0.5,
            0.5,
            0.0,
            true,
        )
        .unwrap();
        assert_eq!(a.grad_mech, b.grad_mech);
        let ta = a
            .fit(&rows, 50, &mut SecureRng::insecure_from_seed(3))
            .unwrap();
        let tb = b
            .fit_units(
                &rows,
                &Units::singletons(50),
                &mut SecureRng::insecure_from_seed(3),
            )
            .unwrap();
        assert_eq!(ta, tb);
        // The kernels refuse the other path.
        assert!(
            b.fit(&rows, 50, &mut SecureRng::insecure_from_seed(3))
                .is_err()
        );
        assert!(
            a.fit_units(
                &rows,
                &Units::singletons(50),
                &mut SecureRng::insecure_from_seed(3)
            )
            .is_err()
        );
        // K = 9: σ three times the K = 1 kernel's (up to the grid's rounding).
        let c = GaussianGd::new_units(
            mu,
            Neighbours::Units { groups: 9, rows: 1 },
            12,
            0.5,
            0.5,
            0.0,
            true,
        )
        .unwrap();
        let r = c.grad_mech.sigma / b.grad_mech.sigma;
        assert!((r - 3.0).abs() < 1e-5, "{r}");
        assert!(GaussianGd::new_units(mu, Neighbours::AddRemove, 12, 0.5, 0.5, 0.0, true).is_err());
    }

    /// Round 48, follow-up of review "agd", finding 2: `Design` reads the rows in place (a
    /// reference to the buffer's features and labels, never a copy, whatever the values:
    /// out-of-range ones included), and the kernels see the values the old copy held when the
    /// rows come clamped as `dp_linreg_gd`'s buffer stores them: the exact gradient sums of rows
    /// with 1e300 and ±∞ clamped by `clamp_features` are those of rows written at ±1e150, and
    /// `example_contribution` clamps as the buffer does.
    #[test]
    fn design_reads_rows_in_place() {
        let mut rows = super::super::rows::Rows::synthetic(300, 3, false, 4);
        rows.x[4] = f64::INFINITY;
        rows.x[7] = -1e300;
        rows.labels[9] = f64::NEG_INFINITY;
        let design = Design::new(&rows, true);
        assert!(std::ptr::eq(design.x, rows.x.as_slice()));
        assert!(std::ptr::eq(design.y, rows.labels.as_slice()));
        let k = GaussianGd::new(0.8, 5, 0.5, 0.5, 0.0, true, false, false).unwrap();
        let mut clamped = rows.clone();
        clamp_features(&mut clamped.x, VALUE_CLAMP);
        clamp_features(&mut clamped.labels, VALUE_CLAMP);
        let mut written = rows.clone();
        (written.x[4], written.x[7], written.labels[9]) = (1e150, -1e150, -1e150);
        assert_eq!(clamped, written);
        for theta in [[0.0; 4], [0.3, -0.2, 1.5, 0.1], [1e-140; 4]] {
            let a = k.gradient_sum(&clamped, None, &theta).unwrap();
            assert_eq!(a, k.gradient_sum(&written, None, &theta).unwrap());
            for path in [RowPath::Portable, RowPath::Reference] {
                assert_eq!(
                    a,
                    k.gradient_sum_with(&clamped, None, &theta, path).unwrap()
                );
            }
        }
        let theta = [0.1, 0.2];
        for (x, y) in [([f64::INFINITY], -1e300), ([-1e300], f64::INFINITY)] {
            let at = [x[0].clamp(-VALUE_CLAMP, VALUE_CLAMP)];
            assert_eq!(
                k.example_contribution(&x, y, &theta).unwrap(),
                k.example_contribution(&at, y.clamp(-VALUE_CLAMP, VALUE_CLAMP), &theta)
                    .unwrap()
            );
        }
    }
}
