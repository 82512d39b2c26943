//! DP-SGD: the kernels of `dp_linreg_sgd`, `dp_logreg_sgd` and `dp_mlp_sgd` (networks in
//! [`super::mlp`]).
//!
//! # `noise => 'independent'` (default): Poisson-subsampled DP-SGD
//! Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016), Algorithm 1, with the
//! Poisson sampling its accountant assumes (seed 001 §3.4 "From GD to SGD"; seed 003 §1.3,
//! amplification by subsampling). The model shape, the step count T and the sample rate q are
//! fixed by the call's literals (and the feature count) before any row is read. Each step t:
//! 1. **Sampling.** Every unit (a row, or a privacy unit under `units:K:C`) joins the batch Bₜ
//!    independently with probability q, drawn from the crate's CSPRNG ([`SecureRng`]). The
//!    draw is index sampling, not a scan: the gaps between sampled indices are i.i.d.
//!    geometric, G = ⌊ln(1−U)/ln(1−q)⌋ (Devroye, *Non-Uniform Random Variate Generation*, 1986,
//!    §X.2), so a step reads q·n rows on average.
//! 2. **Per-example clipping of the whole vector** (all layers): each row's gradient gᵢ is
//!    clipped to ‖·‖ ≤ c_g; under units the unit's sum of clipped row gradients is clipped
//!    again to c_g (McMahan et al., ICLR 2018, §3). The unit's vector is vᵤ = (clip(gᵤ), κ),
//!    a last coordinate κ that counts the unit, with c_g² + κ² ≤ clip²: ‖vᵤ‖ ≤ clip whatever
//!    the unit's rows (κ = 0.3·clip, c_g = √(1 − 0.09)·clip ≈ 0.954·clip).
//! 3. **Noise once per step** on the sum: S̃ₜ = Σ_{u∈Bₜ} vᵤ + N(0, σ²I), σ = z·clip, z the
//!    noise multiplier (step 5). The sum is exact (integers on the mechanism's power-of-two
//!    grid, as in [`super::linreg`], "Exact sums") and the noise is the discrete Gaussian on the
//!    same grid ([`release_exact`]).
//! 4. **Step.** The last coordinate of S̃ₜ divided by κ is a noisy batch size b̃ₜ; the running
//!    mean of b̃₁…b̃ₜ, floored at max(1, 3 standard deviations of that mean), is the divisor
//!    (post-processing: no n is needed, public or private). θ ← θ − η·S̃ₜ[..p]/divisor. The
//!    output is the average of the iterates of the second half (post-processing).
//! 5. **Accounting.** Adding or removing one unit changes one term vᵤ of a step's sum (L2 ≤
//!    clip, sensitivity Δ = clip) and, by Poisson sampling, is in each batch with probability
//!    q: each step is the Poisson-subsampled Gaussian mechanism with noise multiplier z, and T
//!    adaptive steps compose ([`crate::privacy::sgd`]; Mironov, Talwar, Zhang 2019). z is the
//!    smallest value for which `sgd::epsilon(q, z, K·T, δ) ≤ ε` (calibration rounded toward
//!    more noise), times C under `units:K:C` (a unit in K groups takes part in K·T steps of
//!    the same kind; C only adds noise). The ledger records
//!    `SubsampledGaussian { q, z/C, K·T }`. Replace neighbours are refused: the subsampling
//!    bound used here is the add/remove one.
//!
//! # `noise => 'mf'`: one pass with correlated noise (matrix factorisation)
//! Seed 001 §4; Denisov, McMahan, Rush, Smith, Thakurta, "Improved Differential Privacy for
//! SGD via Optimal Private Linear Operators on Adaptive Streams" (NeurIPS 2022); the
//! square-root factorisation of Fichtenberger, Henzinger and Upadhyay, "Constant Matters:
//! Fine-grained Error Bound on Differentially Private Continual Observation" (ICML 2023):
//! the prefix-sum matrix A (lower-triangular ones, T×T) is A = C·C with C lower-triangular
//! Toeplitz, C_{ts} = c_{t−s}, c_k = binom(2k, k)/4^k (the series of (1 − x)^{−1/2}); C⁻¹ is
//! Toeplitz with the series of (1 − x)^{1/2}: d₀ = 1, d_k = d_{k−1}·(2k − 3)/(2k).
//! 1. Each unit is put in one of T batches uniformly at random, independently of the others
//!    (so each unit is in exactly one batch: single participation, one pass).
//! 2. Step t computes Gₜ = Σ_{u∈batch t} vᵤ (clipped as above, exact), releases
//!    Yₜ = round((Ĉ·G)ₜ) + Zₜ (Z discrete Gaussian on the grid; Ĉ is C with its coefficients on
//!    a 2⁻⁴⁸ grid, below) and steps with g̃ₜ = (C⁻¹Y)ₜ = Gₜ + noise correlated across steps
//!    (post-processing of Y: floats are fine there).
//! 3. **Privacy.** Conditioned on the batch assignment (independent per unit, so the same law
//!    for the other units whether a unit is added or removed), adding or removing a unit
//!    changes one Gₜ by ≤ clip in L2, so Ĉ·G moves by ≤ clip·‖Ĉ e_t‖ ≤ clip·‖Ĉ e₁‖ (the first
//!    column is the longest of a lower-triangular Toeplitz matrix; [`max_column_norm`] bounds it
//!    from the exact integers). For adaptively chosen Gₜ
//!    this is still a Gaussian mechanism of that sensitivity (Denisov et al. 2022, Thm. 2.1,
//!    single participation). Rounding Ĉ·G to the grid adds at most one grid step per released
//!    coordinate: slack √(T·(p+1)) grid steps in L2 ([`GaussianMechanism::from_mu_with_slack`]).
//!
//!    **Exact correlated sum.** The bound above is about the value Ĉ·G itself, so that value is
//!    computed exactly ([`correlated_sum_exact`]), as the Poisson path's sums are: the Gₛ are
//!    exact integers on the noise grid, the coefficients are the integers m_k = round(c_k·2⁴⁸)
//!    (Ĉ = m/2⁴⁸ is the public matrix the mechanism applies and whose column norm calibrates the
//!    noise), and Σₛ m_{t−s}·Gₛ is formed in 190-bit integer arithmetic and rounded to the grid
//!    once. A floating-point sum would not do: a recursive sum of n terms errs by up to
//!    (n−1)·u·Σ|xᵢ| + O(u²) (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
//!    §4.2), and here Σ|xᵢ| = Σₛ c_{t−s}|Gₛ| is the mass of every other row of the batches, so the
//!    error of two neighbours' computed sums is not bounded by clip nor by any slack fixed from
//!    the literals (a row's change could move the computed release by thousands of grid steps
//!    when the other rows' sum is large).
//!    So the whole fit is μ-GDP with μ = gaussian_mu(ε, δ) (a mixture over the assignment keeps
//!    the bound: joint convexity of the hockey-stick divergence), recorded as `Gaussian { μ }`,
//!    which composes in every filter. Replace neighbours double Δ; units use μ/(√K·C).
//!    Cost O(T²·p) for the two convolutions (T ≤ [`MF_MAX_STEPS`]).
use datafusion::common::{DataFusionError, Result};

use super::clip::Clipper;
use super::mlp::{Net, Scratch};
use super::rows::Rows;
use super::units::Units;
use crate::mechanisms::exact::{exact_log2, release_exact};
use crate::mechanisms::gaussian::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::Neighbours;
use crate::privacy::{Event, PrivacyError, gaussian_mu, sgd};

/// The count coordinate κ as a share of `clip` (module docs, step 2).
pub const COUNT_WEIGHT: f64 = 0.3;
/// The divisor's floor in standard deviations of the running mean of noisy batch sizes.
pub const COUNT_FLOOR_SIGMAS: f64 = 3.0;
/// Largest T for `noise => 'mf'` (the convolutions cost O(T²·p)).
pub const MF_MAX_STEPS: u64 = 5_000;
/// Largest T for Poisson DP-SGD.
pub const MAX_STEPS: u64 = 1_000_000;

/// Which noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoiseKind {
    /// Poisson subsampling, independent noise per step.
    Independent,
    /// One pass, noise correlated by the square-root factorisation.
    Mf,
}

impl NoiseKind {
    pub const ACCEPTED: &'static str = "'independent' (the default) or 'mf'";
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "independent" => Some(NoiseKind::Independent),
            "mf" => Some(NoiseKind::Mf),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            NoiseKind::Independent => "independent",
            NoiseKind::Mf => "mf",
        }
    }
}

/// The network family; the feature count d comes from the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Linear,
    Logistic,
    Mlp { hidden: usize, classes: usize },
}

impl Family {
    pub fn net(self, d: usize) -> Net {
        match self {
            Family::Linear => Net::Linear { d },
            Family::Logistic => Net::Logistic { d },
            Family::Mlp { hidden, classes } => Net::Mlp { d, hidden, classes },
        }
    }
}

/// Coefficients c_k of the square-root factor C (module docs), k < t.
pub fn sqrt_factor(t: usize) -> Vec<f64> {
    let mut c = Vec::with_capacity(t);
    for k in 0..t {
        c.push(if k == 0 {
            1.0
        } else {
            c[k - 1] * (2 * k - 1) as f64 / (2 * k) as f64
        });
    }
    c
}

/// Coefficients d_k of C⁻¹, k < t.
pub fn sqrt_factor_inverse(t: usize) -> Vec<f64> {
    let mut d = Vec::with_capacity(t);
    for k in 0..t {
        d.push(if k == 0 {
            1.0
        } else {
            d[k - 1] * (2.0 * k as f64 - 3.0) / (2 * k) as f64
        });
    }
    d
}

/// Fractional bits of the fixed-point coefficients of the released factor Ĉ (module docs,
/// "Exact correlated sum").
pub const MF_COEF_BITS: u32 = 48;

/// The coefficients of Ĉ, the factor the `'mf'` release applies: m_k = round(c_k·2⁴⁸), so
/// ĉ_k = m_k/2⁴⁸ exactly (c₀ = 1 gives 2⁴⁸; every c_k ∈ (0, 1]). Ĉ is public (fixed by T): its
/// exact entries, not C's, are what the sensitivity is taken of.
pub fn sqrt_factor_fixed(t: usize) -> Vec<i64> {
    let scale = (1u64 << MF_COEF_BITS) as f64;
    sqrt_factor(t)
        .into_iter()
        .map(|c| (c * scale).round() as i64)
        .collect()
}

/// An upper bound on the largest column norm of the released factor Ĉ, ‖Ĉ e₁‖ = √(Σ_{k<T} m_k²)/2⁴⁸
/// (the first column is the longest of a lower-triangular Toeplitz matrix): the sum of squares
/// exactly in integers, its square root rounded up to an integer and then to an `f64` above it;
/// never below the float norm of C itself (so it bounds both).
pub fn max_column_norm(t: usize) -> f64 {
    let sq = sqrt_factor_fixed(t)
        .iter()
        .map(|&m| (m.unsigned_abs() as u128) * (m.unsigned_abs() as u128))
        .fold(0u128, u128::saturating_add);
    let mut r = sq.isqrt();
    if r * r < sq {
        r += 1; // ⌈√sq⌉
    }
    let mut f = r as f64;
    if (f as u128) < r {
        f = f.next_up();
    }
    let exact = f * crate::mechanisms::exact::pow2(-(MF_COEF_BITS as i32));
    let float: f64 = sqrt_factor(t).iter().map(|c| c * c).sum();
    exact.max(float.sqrt() * (1.0 + 1e-12))
}

/// The `'mf'` release's value before noise at step t, in grid units, computed exactly
/// (module docs, "Exact correlated sum"): `out[j]` = round((Ĉ·G)ₜ[j]) = round(Σ_{s≤t} m_{t−s}·Gₛ[j]
/// / 2⁴⁸) (ties toward +∞), clamped to the `i128` range. `hist[s]` is the exact integer sum Gₛ
/// of batch s on the noise grid and `m` is [`sqrt_factor_fixed`] (at least t + 1 long).
///
/// Each Gₛ[j] is split as h·2⁶⁴ + l (h = Gₛ[j] ≫ 64 ∈ i64, l ∈ [0, 2⁶⁴)); with 0 ≤ m_k ≤ 2⁴⁸ and
/// t < 2¹³ terms ([`MF_MAX_STEPS`]) the two running sums Σm·h (|·| < 2¹²⁴) and Σm·l (< 2¹²⁵) fit in
/// `i128`, so the 190-bit total H·2⁶⁴ + L is exact. After moving L's bits above 2⁶⁴ into H,
/// round(total/2⁴⁸) = H·2¹⁶ + ⌊(L + 2⁴⁷)/2⁴⁸⌋ with the second term in [0, 2¹⁶]; when H·2¹⁶ leaves
/// the `i128` range the result is the range's end (a clamp of the exact value: 1-Lipschitz, so the
/// sensitivity argument is unchanged).
pub fn correlated_sum_exact(m: &[i64], hist: &[Vec<i128>], t: usize, out: &mut [i128]) {
    debug_assert!(t < hist.len() && t < m.len() && t < (1 << 13));
    let mut hi = vec![0i128; out.len()];
    let mut lo = vec![0i128; out.len()];
    for (s, g) in hist[..=t].iter().enumerate() {
        let w = m[t - s] as i128;
        for ((h, l), &x) in hi.iter_mut().zip(lo.iter_mut()).zip(g) {
            *h += w * (x >> 64);
            *l += w * ((x as u64) as i128);
        }
    }
    for ((o, &h), &l) in out.iter_mut().zip(&hi).zip(&lo) {
        let h = h + (l >> 64);
        let l = l & ((1i128 << 64) - 1);
        let frac = (l + (1i128 << (MF_COEF_BITS - 1))) >> MF_COEF_BITS;
        *o = match h.checked_mul(1i128 << (64 - MF_COEF_BITS)) {
            Some(a) => a.saturating_add(frac),
            None if h < 0 => i128::MIN,
            None => i128::MAX,
        };
    }
}

/// A planned fit: everything fixed from the literals.
#[derive(Debug, Clone, PartialEq)]
pub struct SgdPlan {
    pub family: Family,
    pub noise: NoiseKind,
    /// Poisson q (`independent` only).
    pub sample_rate: f64,
    pub steps: u64,
    pub clip: f64,
    pub learning_rate: f64,
    /// `independent`: z with σ = z·clip per step. `mf`: the call's calibration μ (after units).
    pub noise_multiplier: f64,
    /// L2 sensitivity of one unit's change of one step's sum: clip, or 2·clip under replace.
    pub sensitivity: f64,
    /// The Poisson mechanism (σ = z·clip on the grid); for `mf` the planning-time mechanism
    /// without rounding slack (the fit rebuilds it with the slack of its p).
    pub mech: GaussianMechanism,
    /// The ledger events of the call.
    pub events: Vec<Event>,
}

impl SgdPlan {
    /// Calibrates a fit (module docs).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        family: Family,
        noise: NoiseKind,
        epsilon: f64,
        delta: f64,
        sample_rate: f64,
        steps: u64,
        clip: f64,
        learning_rate: f64,
        neighbours: Neighbours,
    ) -> Result<Self, PrivacyError> {
        match noise {
            NoiseKind::Independent => {
                if neighbours.is_replace() {
                    return Err(PrivacyError::Infeasible(format!(
                        "Poisson-subsampled DP-SGD (noise => 'independent') is accounted under \
                         add/remove neighbours (or privacy units), and this table declares \
                         '{neighbours}' neighbours: use noise => 'mf' (one pass, correlated \
                         noise), or dp_logreg_agd / dp_linreg_gd"
                    )));
                }
                let (k, c) = match neighbours {
                    Neighbours::Units { groups, rows } => (groups as u64, rows as f64),
                    _ => (1, 1.0),
                };
                let z_acc = sgd::noise_multiplier(sample_rate, k * steps, epsilon, delta)?;
                let z = z_acc * c;
                let mech = GaussianMechanism::from_mu(1.0 / z, clip)?;
                Ok(SgdPlan {
                    family,
                    noise,
                    sample_rate,
                    steps,
                    clip,
                    learning_rate,
                    noise_multiplier: z,
                    sensitivity: clip,
                    mech,
                    events: vec![Event::SubsampledGaussian {
                        sample_rate,
                        noise_multiplier: z_acc,
                        steps: k * steps,
                    }],
                })
            }
            NoiseKind::Mf => {
                if steps > MF_MAX_STEPS {
                    return Err(PrivacyError::invalid(
                        "steps",
                        steps,
                        &format!("at most {MF_MAX_STEPS} with noise => 'mf'"),
                    ));
                }
                let mu = gaussian_mu(epsilon, delta)?;
                let mu_cal = neighbours.calibration_mu(mu);
                let sensitivity = if neighbours.is_replace() {
                    2.0 * clip
                } else {
                    clip
                };
                let mech = GaussianMechanism::from_mu(
                    mu_cal,
                    sensitivity * max_column_norm(steps as usize),
                )?;
                Ok(SgdPlan {
                    family,
                    noise,
                    sample_rate: 1.0 / steps as f64,
                    steps,
                    clip,
                    learning_rate,
                    noise_multiplier: mu_cal,
                    sensitivity,
                    mech,
                    events: vec![Event::Gaussian { mu }],
                })
            }
        }
    }

    /// The most bytes [`Self::fit`] allocates in proportion to the rows beyond the buffer and
    /// its grouping, for a fit on `n` rows (so on at most n units): under `'mf'` the batches
    /// ([`Batches::bytes`]), 0 under `'independent'` (its sampling holds no per-unit state). A
    /// model accumulator counts it in its size, so that the session's memory pool bounds it
    /// before `evaluate` (round 51, review "sgd", F1: it was allocated outside the pool).
    pub fn rows_bytes(&self, n: usize) -> usize {
        match self.noise {
            NoiseKind::Independent => 0,
            NoiseKind::Mf => Batches::bytes(n, self.steps as usize),
        }
    }

    /// The per-coordinate noise σ of one step's release (Poisson: z·clip; mf: of Y).
    pub fn sigma(&self) -> f64 {
        self.mech.sigma
    }

    /// The mechanism of a fit with p parameters: for `mf` with the rounding slack
    /// √(T·(p+1)) grid steps (module docs).
    fn mechanism(&self, p: usize) -> Result<GaussianMechanism> {
        match self.noise {
            NoiseKind::Independent => Ok(self.mech),
            NoiseKind::Mf => {
                let slack = ((self.steps as f64) * (p + 1) as f64).sqrt().max(1.0);
                GaussianMechanism::from_mu_with_slack(
                    self.noise_multiplier,
                    self.sensitivity * max_column_norm(self.steps as usize),
                    slack,
                )
                .map_err(|e| DataFusionError::Execution(e.to_string()))
            }
        }
    }
}

/// A finished fit.
#[derive(Debug, Clone, PartialEq)]
pub struct SgdFit {
    /// θ in the layout of [`Net`].
    pub theta: Vec<f64>,
    pub net: Net,
    pub steps: u64,
    pub cancelled: bool,
}

/// The `'mf'` batches (module docs, step 1): each of n units in one of T batches drawn
/// uniformly and independently, held as one flat vector of unit indices grouped by batch
/// (ascending within a batch) and T + 1 offsets, built by a counting sort with exact
/// capacities (as [`Units::group`] groups rows, but keeping empty batches). Round 51, review
/// "sgd", F1: T vectors grown by `push` were allocated outside the memory pool.
#[derive(Debug, Default)]
struct Batches {
    units: Vec<u32>,
    /// Batch t holds `units[starts[t]..starts[t + 1]]`.
    starts: Vec<usize>,
}

impl Batches {
    /// Draws the batch of each unit `0..n` in order (one `uniform_below(t)` each) and groups them.
    fn draw(n: usize, t: usize, rng: &mut SecureRng) -> Self {
        let bin: Vec<u32> = (0..n)
            .map(|_| rng.uniform_below(t as u128) as u32)
            .collect();
        // Counts, then inclusive prefix sums (ends); placing units from the last down leaves
        // each entry at its batch's start and each batch ascending.
        let mut starts = vec![0usize; t + 1];
        for &b in &bin {
            starts[b as usize] += 1;
        }
        let mut acc = 0;
        for s in starts.iter_mut() {
            acc += *s;
            *s = acc;
        }
        let mut units = vec![0u32; n];
        for (u, &b) in bin.iter().enumerate().rev() {
            let slot = &mut starts[b as usize];
            *slot -= 1;
            units[*slot] = u as u32;
        }
        Batches { units, starts }
    }

    /// The units of batch `t`.
    fn batch(&self, t: usize) -> &[u32] {
        &self.units[self.starts[t]..self.starts[t + 1]]
    }

    /// The most bytes [`Self::draw`] holds at once for n units in t batches: the drawn batch of
    /// each unit and the grouped indices (4 bytes a unit each), and the t + 1 offsets.
    fn bytes(n: usize, t: usize) -> usize {
        2 * n * size_of::<u32>() + (t + 1) * size_of::<usize>()
    }
}

/// The clipping and exact-sum machinery of one fit.
struct Contrib<'a> {
    net: Net,
    rows: &'a Rows,
    units: Option<&'a Units>,
    clipper: Clipper,
    /// c_g on the float side (target norm of the gradient part).
    grad_target: f64,
    /// κ/q as an integer.
    kappa_int: i64,
    q: f64,
    inv_q: f64,
}

impl<'a> Contrib<'a> {
    fn new(
        net: Net,
        rows: &'a Rows,
        units: Option<&'a Units>,
        mech: &GaussianMechanism,
        clip: f64,
    ) -> Result<Self> {
        let exp = exact_log2(mech.granularity).ok_or_else(|| {
            DataFusionError::Internal("gradient grid is not a power of two".into())
        })?;
        let pp = net.params() + 1;
        let clipper = Clipper::new(clip, exp, pp);
        let target = clipper.target();
        let kappa = COUNT_WEIGHT * target;
        let q = mech.granularity;
        Ok(Contrib {
            net,
            rows,
            units,
            grad_target: (target * target - kappa * kappa).max(0.0).sqrt(),
            kappa_int: (kappa / q).floor() as i64,
            inv_q: clipper.inv_q(),
            clipper,
            q,
        })
    }

    fn n_units(&self) -> usize {
        match self.units {
            Some(u) => u.count(),
            None => self.rows.n(),
        }
    }

    fn range(&self, u: usize) -> std::ops::Range<usize> {
        match self.units {
            Some(units) => units.range(u),
            None => u..u + 1,
        }
    }

    /// Adds unit u's integer vector (gradient part, then the count) to `acc`.
    fn add(&self, u: usize, theta: &[f64], w: &mut Work, acc: &mut [i128]) {
        let Work { s, g, sum, v } = w;
        let p = g.len();
        sum.fill(0.0);
        let mut any = false;
        for i in self.range(u) {
            if self
                .net
                .gradient(theta, self.rows.row(i), self.rows.labels[i], s, g)
            {
                scale_to(g, self.grad_target);
                sum.iter_mut().zip(g.iter()).for_each(|(a, b)| *a += b);
                any = true;
            }
        }
        if !any {
            return; // an unusable unit contributes nothing (as if absent)
        }
        scale_to(sum, self.grad_target);
        for (o, &x) in v[..p].iter_mut().zip(sum.iter()) {
            *o = super::clip::round_i64(x * self.inv_q);
        }
        v[p] = self.kappa_int;
        // The integer check (the float clipping leaves room; a failure contributes 0).
        let c = self.clipper.c_int as u128;
        if super::clip::norm2_int(v) > c * c {
            return;
        }
        for (a, &x) in acc.iter_mut().zip(v.iter()) {
            *a += x as i128;
        }
    }
}

/// Reused buffers of one fit's row pass.
struct Work {
    s: Scratch,
    g: Vec<f64>,
    sum: Vec<f64>,
    v: Vec<i64>,
}

impl Work {
    fn new(p: usize) -> Self {
        Work {
            s: Scratch::default(),
            g: vec![0.0; p],
            sum: vec![0.0; p],
            v: vec![0i64; p + 1],
        }
    }
}

/// Scales `g` to L2 norm ≤ `target`, the norm by [`super::clip::l2_norm`] (round 52: a sum of
/// squares underflowed to 0 for entries ≤ 2⁻⁵³⁸, and then `g` was not scaled).
fn scale_to(g: &mut [f64], target: f64) {
    let n = super::clip::l2_norm(g, false);
    if n > target && n > 0.0 {
        let f = target / n;
        g.iter_mut().for_each(|x| *x *= f);
    }
}

/// Gap to the next Poisson-sampled index (module docs, step 1).
fn geometric(rng: &mut SecureRng, ln_1mq: f64) -> usize {
    if ln_1mq == f64::NEG_INFINITY {
        return 0; // q = 1
    }
    let u = rng.uniform_f64();
    let g = ((-u).ln_1p() / ln_1mq).floor();
    if g.is_finite() && g < (usize::MAX / 4) as f64 {
        g as usize
    } else {
        usize::MAX / 4
    }
}

/// A standard normal from the CSPRNG by Box–Muller (initial weights only, never privacy noise).
fn normal(rng: &mut SecureRng) -> f64 {
    let u1 = 1.0 - rng.uniform_f64();
    let u2 = rng.uniform_f64();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl SgdPlan {
    /// One Poisson step's release at θ, for statistical tests: (the exact sampled sum in the
    /// gradient's units, the noisy release), both of length p + 1 (the count last).
    pub fn poisson_step(
        &self,
        rows: &Rows,
        units: Option<&Units>,
        theta: &[f64],
        rng: &mut SecureRng,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let net = self.family.net(rows.d);
        let ctx = Contrib::new(net, rows, units, &self.mech, self.clip)?;
        let p = net.params();
        let mut acc = vec![0i128; p + 1];
        self.sample_sum(&ctx, theta, rng, &mut acc);
        let exp = exact_log2(self.mech.granularity).unwrap_or(0);
        let exact = acc.iter().map(|&a| a as f64 * ctx.q).collect();
        let noisy = acc
            .iter()
            .map(|&a| release_exact(&self.mech, rng, a, exp))
            .collect::<Result<_>>()?;
        Ok((exact, noisy))
    }

    fn sample_sum(&self, ctx: &Contrib, theta: &[f64], rng: &mut SecureRng, acc: &mut [i128]) {
        let mut w = Work::new(theta.len());
        let ln_1mq = (-self.sample_rate).ln_1p();
        let n = ctx.n_units();
        let mut u = geometric(rng, ln_1mq);
        while u < n {
            ctx.add(u, theta, &mut w, acc);
            u = u.saturating_add(1 + geometric(rng, ln_1mq));
        }
    }

    /// Fits on `rows` (grouped by `units` under `units:K:C`). `function` names the progress
    /// reports.
    pub fn fit(
        &self,
        rows: &Rows,
        units: Option<&Units>,
        rng: &mut SecureRng,
        function: &'static str,
    ) -> Result<SgdFit> {
        let net = self.family.net(rows.d);
        let p = net.params();
        let mech = self.mechanism(p)?;
        let ctx = Contrib::new(net, rows, units, &mech, self.clip)?;
        let exp = exact_log2(mech.granularity).unwrap_or(0);
        let kappa = ctx.kappa_int as f64 * ctx.q;
        let mut theta = net.init(|| normal(rng));
        let t_total = self.steps as usize;
        let mut avg = vec![0.0; p];
        let mut averaged = 0u64;
        let average_from = t_total / 2;
        let mut count_sum = 0.0;
        // mf: the batches (each unit in one, uniformly at random) and the release histories.
        let (c, dinv, bins) = if self.noise == NoiseKind::Mf {
            (
                sqrt_factor_fixed(t_total),
                sqrt_factor_inverse(t_total),
                Batches::draw(ctx.n_units(), t_total, rng),
            )
        } else {
            (Vec::new(), Vec::new(), Batches::default())
        };
        let mut hist_g: Vec<Vec<i128>> = Vec::new();
        let mut centre = vec![0i128; p + 1];
        let mut hist_y: Vec<Vec<f64>> = Vec::new();
        // Standard deviation of one step's noisy count (mf: Y's count noise through C⁻¹,
        // √Σd_k² ≤ 1.3 of it).
        let count_sd = mech.sigma / kappa
            * if self.noise == NoiseKind::Mf {
                1.3
            } else {
                1.0
            };
        let started = crate::progress::generation();
        let mut w = Work::new(p);
        let mut acc = vec![0i128; p + 1];
        for t in 0..t_total {
            if crate::progress::cancelled(started) {
                return Ok(SgdFit {
                    theta,
                    net,
                    steps: t as u64,
                    cancelled: true,
                });
            }
            acc.fill(0);
            let noisy: Vec<f64> = match self.noise {
                NoiseKind::Independent => {
                    self.sample_sum(&ctx, &theta, rng, &mut acc);
                    acc.iter()
                        .map(|&a| release_exact(&mech, rng, a, exp))
                        .collect::<Result<_>>()?
                }
                NoiseKind::Mf => {
                    for &u in bins.batch(t) {
                        ctx.add(u as usize, &theta, &mut w, &mut acc);
                    }
                    hist_g.push(acc.clone());
                    // Yₜ = round((Ĉ·G)ₜ) + Zₜ, the sum exact in integers (module docs).
                    correlated_sum_exact(&c, &hist_g, t, &mut centre);
                    let y = centre
                        .iter()
                        .map(|&a| release_exact(&mech, rng, a, exp))
                        .collect::<Result<Vec<_>>>()?;
                    hist_y.push(y);
                    // g̃ₜ = (C⁻¹Y)ₜ.
                    let mut out = vec![0.0; p + 1];
                    for (s_, ys) in hist_y.iter().enumerate() {
                        let w = dinv[t - s_];
                        out.iter_mut().zip(ys).for_each(|(a, b)| *a += w * b);
                    }
                    out
                }
            };
            count_sum += noisy[p] / kappa;
            let k = (t + 1) as f64;
            let floor = (COUNT_FLOOR_SIGMAS * count_sd / k.sqrt()).max(1.0);
            let divisor = (count_sum / k).max(floor);
            let step = self.learning_rate / divisor;
            for (th, n) in theta.iter_mut().zip(&noisy[..p]) {
                *th -= step * n;
            }
            if t >= average_from {
                averaged += 1;
                avg.iter_mut().zip(&theta).for_each(|(a, b)| *a += b);
            }
            crate::progress::report(function, t as u64 + 1, self.steps);
        }
        if averaged > 0 {
            avg.iter_mut().for_each(|a| *a /= averaged as f64);
            theta = avg;
        }
        Ok(SgdFit {
            theta,
            net,
            steps: self.steps,
            cancelled: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round 51, review "sgd", F1: the 'mf' batches are built with exact capacities (n unit
    /// indices, T + 1 offsets) and are the batches the former per-batch vectors held, from the
    /// same draws (each unit once, ascending within its batch; empty batches kept).
    #[test]
    fn mf_batches_are_exact_and_draw_as_before() {
        for (n, t) in [(0usize, 1usize), (1, 1), (7, 50), (1000, 1), (5000, 37)] {
            let b = Batches::draw(n, t, &mut SecureRng::insecure_from_seed(9));
            assert_eq!((b.units.capacity(), b.starts.capacity()), (n, t + 1));
            let mut rng = SecureRng::insecure_from_seed(9);
            let mut bins = vec![Vec::new(); t];
            for u in 0..n {
                bins[rng.uniform_below(t as u128) as usize].push(u as u32);
            }
            for (k, bin) in bins.iter().enumerate() {
                assert_eq!(b.batch(k), bin.as_slice(), "{n} units, batch {k} of {t}");
            }
            assert_eq!(Batches::bytes(n, t), 8 * n + 8 * (t + 1));
        }
    }

    #[test]
    fn square_root_factor_squares_to_the_prefix_sum_matrix() {
        let t = 50;
        let c = sqrt_factor(t);
        let d = sqrt_factor_inverse(t);
        for n in 0..t {
            // (C·C)_{n,0} = Σ_k c_k c_{n−k} = 1 (A = C²), and (C·C⁻¹)_{n,0} = [n = 0].
            let a: f64 = (0..=n).map(|k| c[k] * c[n - k]).sum();
            let e: f64 = (0..=n).map(|k| c[k] * d[n - k]).sum();
            assert!((a - 1.0).abs() < 1e-12, "{n}: {a}");
            assert!((e - f64::from(n == 0)).abs() < 1e-12, "{n}: {e}");
        }
        // ‖C e₁‖² = Σ_{k<T} (binom(2k, k)/4^k)², from the binomials directly: 2.3099 at T = 50
        // (Fichtenberger et al. 2023: it grows like 1 + ln(T)/π).
        let binom = |n: u64, k: u64| (1..=k).fold(1.0f64, |b, i| b * (n - k + i) as f64 / i as f64);
        let direct: f64 = (0..t as u64)
            .map(|k| (binom(2 * k, k) / 4f64.powi(k as i32)).powi(2))
            .sum();
        let m = max_column_norm(t);
        assert!(
            m * m >= direct && (m * m - direct).abs() < 1e-9,
            "{} {direct}",
            m * m
        );
        assert!((direct - 2.3099).abs() < 1e-4, "{direct}");
    }

    /// The 'mf' release's value before noise is exact: c₀..c₂ = 1, 1/2, 3/8 are on the 2⁻⁴⁸ grid,
    /// so with G₀ = 2⁶⁰ + 1, G₁ = 3, G₂ = −2⁶⁰ (grid units) the correlated sum at t = 2 is, by
    /// hand, (3/8)(2⁶⁰ + 1) + (1/2)·3 − 2⁶⁰ = −5·2⁵⁷ + 15/8, which rounds to −5·2⁵⁷ + 2. The
    /// former float recursion loses the low bits (−5·2⁵⁷: two grid steps off, and by an amount
    /// that grows with the other rows' mass, not bounded by clip).
    #[test]
    fn correlated_sum_is_exact() {
        let m = sqrt_factor_fixed(3);
        assert_eq!(m, vec![1 << 48, 1 << 47, 3 << 45]);
        let big = 1i128 << 60;
        let hist = vec![vec![big + 1, -7], vec![3, 0], vec![-big, 5]];
        let mut out = vec![0i128; 2];
        correlated_sum_exact(&m, &hist, 2, &mut out);
        // Second coordinate: (3/8)(−7) + 0 + 5 = 2.375 → 2.
        assert_eq!(out, vec![-5 * (1i128 << 57) + 2, 2]);
        let c = sqrt_factor(3);
        let float = c[2] * (big + 1) as f64 + c[1] * 3.0 + c[0] * (-big) as f64;
        assert_eq!(float, -5.0 * 2f64.powi(57), "the float sum this replaces");
        // t = 0 and t = 1, and negative halves (x >> 64 = −1 for small negatives).
        correlated_sum_exact(&m, &hist, 0, &mut out);
        assert_eq!(out, vec![big + 1, -7]);
        correlated_sum_exact(&m, &hist, 1, &mut out);
        // (1/2)(2⁶⁰ + 1) + 3 = 2⁵⁹ + 3.5 → 2⁵⁹ + 4 (ties up); (1/2)(−7) + 0 = −3.5 → −3.
        assert_eq!(out, vec![(1i128 << 59) + 4, -3]);
        // Beyond the i128 range: clamped, never wrapped.
        let huge = [vec![i128::MAX], vec![i128::MAX]];
        correlated_sum_exact(&m, &huge[..2], 1, &mut out[..1]);
        assert_eq!(out[0], i128::MAX);
        let neg = vec![vec![i128::MIN], vec![i128::MIN]];
        correlated_sum_exact(&m, &neg, 1, &mut out[..1]);
        assert_eq!(out[0], i128::MIN);
    }

    /// The sensitivity the 'mf' noise is calibrated to holds for the computed values: two
    /// neighbours (one unit vector of norm c_int = 1000 added to batch 3) beside a huge mass of
    /// other rows (about 2⁷⁰ grid units per coordinate, where an f64 ulp is 2¹⁸ grid units) have
    /// computed releases within c_int·‖Ĉe₁‖ + √(T·(p+1)) grid steps in L2 over all T steps. The
    /// float recursion it replaces moves by whole ulps there (batch 3's first coordinate sits
    /// 300 below a rounding boundary of f64).
    #[test]
    fn correlated_sums_of_neighbours_stay_within_the_sensitivity() {
        let (t_total, c_int) = (40usize, 1000i128);
        let m = sqrt_factor_fixed(t_total);
        let other: Vec<Vec<i128>> = (0..t_total)
            .map(|s| {
                vec![
                    (1i128 << 70) + (1 << 17) - 300,
                    -(1i128 << 70) - 7 * s as i128,
                ]
            })
            .collect();
        let mut with = other.clone();
        with[3][0] += c_int * 3 / 5;
        with[3][1] += c_int * 4 / 5;
        let (mut a, mut b) = (vec![0i128; 2], vec![0i128; 2]);
        let mut d2 = 0f64;
        for t in 0..t_total {
            correlated_sum_exact(&m, &other, t, &mut a);
            correlated_sum_exact(&m, &with, t, &mut b);
            d2 += a
                .iter()
                .zip(&b)
                .map(|(x, y)| ((x - y) as f64).powi(2))
                .sum::<f64>();
        }
        let bound = c_int as f64 * max_column_norm(t_total) + ((t_total * 2) as f64).sqrt();
        assert!(d2.sqrt() <= bound, "{} > {bound}", d2.sqrt());
        // The float recursion on the same data breaks it.
        let c = sqrt_factor(t_total);
        let float = |h: &[Vec<i128>], t: usize, j: usize| -> f64 {
            (0..=t)
                .map(|s| c[t - s] * h[s][j] as f64)
                .sum::<f64>()
                .round()
        };
        let f2: f64 = (0..t_total)
            .flat_map(|t| (0..2).map(move |j| (t, j)))
            .map(|(t, j)| (float(&with, t, j) - float(&other, t, j)).powi(2))
            .sum();
        assert!(f2.sqrt() > bound, "float: {} ≤ {bound}", f2.sqrt());
    }

    #[test]
    fn geometric_gaps_sample_at_rate_q() {
        let mut rng = SecureRng::insecure_from_seed(3);
        let q: f64 = 0.01;
        let n = 1_000_000usize;
        let ln = (-q).ln_1p();
        let mut count = 0usize;
        let mut u = geometric(&mut rng, ln);
        while u < n {
            count += 1;
            u += 1 + geometric(&mut rng, ln);
        }
        // Binomial(10⁶, 0.01): mean 10⁴, sd 99.5.
        assert!((count as f64 - 1e4).abs() < 500.0, "{count}");
    }
}
