//! Privacy-loss distributions (PLD) of the Poisson-subsampled Gaussian mechanism: pessimistic
//! connect-the-dots discretisation and composition by FFT (docs/ACCOUNTING.md, "DP-SGD
//! accounting").
//!
//! One step releases (Σ clipped gradients of a Poisson sample of rate q) + N(0, σ²·clip²). With
//! sensitivity 1 and σ = the noise multiplier, the two neighbouring relations of add/remove give
//! two pairs of one-dimensional distributions (Koskela, Jälkö, Honkela 2020, "Computing tight
//! differential privacy guarantees using FFT", AISTATS; Zhu, Dong, Wang 2022, "Optimal
//! accounting of differential privacy via characteristic function", AISTATS: these pairs are
//! dominating pairs of the subsampled Gaussian, which composition preserves):
//!
//! - remove: P = (1−q)·N(0, σ²) + q·N(−1, σ²) against Q = N(0, σ²);
//! - add: P = N(0, σ²) against Q = (1−q)·N(0, σ²) + q·N(1, σ²).
//!
//! For each pair the privacy loss L = ln(P/Q)(X), X ~ P, is monotone in X, so its hockey-stick
//! curve δ(ε) = E[(1 − e^{ε−L})₊] has the closed form of [`Direction::delta`]. The curve is
//! evaluated on the grid ε_i = i·h and turned into a discrete PLD on that grid whose curve is
//! the piecewise-linear interpolation of the points (e^{ε_i}, δ(ε_i)) — above the true convex
//! curve, hence pessimistic ("connect the dots", Doroshenko, Ghazi, Kamath, Kumar, Manurangsi
//! 2022, PETS, Algorithm 1; the fixed-gap formulas of Google's `dp_accounting`,
//! `pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap`). The noise tails beyond
//! `e^{-50}/2` each side become losses at the grid ends, and the mass above the top at +∞.
//! T steps compose by the T-th convolution power, computed by FFT on a window whose outside mass
//! is at most 10⁻¹⁵ by a Chernoff bound (`dp_accounting`, `common.compute_self_convolve_bounds`);
//! that 10⁻¹⁵ is added to the mass at +∞ (aliased mass can only add). ε at δ is the smallest ε
//! whose δ(ε) of the composed PLD is at most δ, for each direction; the larger one is reported.
//!
//! Extremes (round 52, review "pld" F1): where e^ε overflows or Φ underflows, remove's δ(ε) is
//! computed in logs; a point that cannot be computed at all (σ² overflows) gives no PLD (None:
//! the caller, `sgd::epsilon`, uses the RDP bound), never δ = 0, which would move loss mass
//! below its true loss.
use super::normal::{log_phi, phi, phi_inv};

/// The grid step h of the privacy loss (dp_accounting's PLD accountant's default).
pub const DISCRETISATION: f64 = 1e-4;
/// ln of the noise mass cut from the tails before discretising (each side e^{-50}/2), as in
/// dp_accounting's `GaussianPrivacyLoss(log_mass_truncation_bound = -50)`.
const LOG_MASS_TRUNCATION: f64 = -50.0;
/// Mass of a composition allowed outside its FFT window; moved to +∞.
const TAIL_MASS_TRUNCATION: f64 = 1e-15;
/// The largest single-step grid or FFT length; beyond it the grid step is doubled (coarser is
/// still pessimistic, only looser). Bounds time and memory: 2¹⁷ points (2 MiB of complex numbers). A composition that needs
/// a wider window has a wide privacy-loss distribution (large ε), where a coarser grid costs
/// little: the connect-the-dots error is of second order in h (measured against dp_accounting
/// at h = 1e-4 over the grid of `udfs/tests/it/sgd_accounting.rs`: within 3%, docs/ACCOUNTING.md).
pub const MAX_LEN: usize = 1 << 17;
/// Below this x*/σ, remove's δ(ε) is computed in logs ([`Direction::delta`]): Φ(−37) ≈ 6e-300
/// is still a normal f64, below it Φ underflows toward 0 (round 52).
const LOG_BRANCH: f64 = -37.0;
/// The float error allowance added to ε (relative): FFT round-off is about 1e-13 of ε here.
const FLOAT_SLACK: f64 = 1e-9;

/// Which neighbouring pair (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Remove,
    Add,
}

/// ln(e^a + e^b) for a, b possibly −∞.
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if hi == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

impl Direction {
    /// The privacy loss ln(P/Q)(x) (decreasing in x for remove, decreasing for add as well:
    /// add's loss is −remove's at −x).
    fn loss(self, q: f64, sigma: f64, x: f64) -> f64 {
        // Remove: ln((1−q) + q·e^{(−1/2 − x)/σ²}).
        let remove = |x: f64| log_add((-q).ln_1p(), q.ln() + (-0.5 - x) / (sigma * sigma));
        match self {
            Direction::Remove => remove(x),
            Direction::Add => -remove(-x),
        }
    }

    /// The hockey-stick divergence δ(ε) = sup_S P(S) − e^ε Q(S) of one step, in closed form:
    /// the supremum is attained at S = {x ≤ x*}, x* the point where the loss equals ε.
    ///
    /// NaN when it cannot be computed (a non-finite intermediate: σ² or σ²·ln(…) overflows);
    /// the caller then gives up the PLD (round 52, review "pld" F1: an overflow that came out as
    /// δ = 0 moved every loss above ≈ 705 down to ≈ 705). Never 0 by overflow.
    pub fn delta(self, q: f64, sigma: f64, eps: f64) -> f64 {
        let s2 = sigma * sigma;
        if !s2.is_finite() || s2 == 0.0 || eps.is_nan() {
            return f64::NAN;
        }
        let d = match self {
            Direction::Remove => {
                // Loss ≥ ln(1−q) everywhere: below it, δ = 1 − e^ε.
                if eps <= (-q).ln_1p() {
                    return -eps.exp_m1();
                }
                // x* = −1/2 − σ² ℓ with ℓ = ln(1 + (e^ε − 1)/q);
                // δ = (1−q)Φ(x*/σ) + qΦ((x*+1)/σ) − e^ε Φ(x*/σ)
                //   = qΦ((x*+1)/σ) − (e^ε − 1 + q)Φ(x*/σ) = q[Φ((x*+1)/σ) − e^ℓ Φ(x*/σ)],
                // since e^ε − 1 + q = q(1 + (e^ε − 1)/q) = q e^ℓ.
                let r = eps.exp_m1() / q;
                let l = if r.is_finite() {
                    r.ln_1p()
                } else {
                    // Round 52 (review "pld" F1): (e^ε − 1)/q overflows for ε > 709.78 + ln q.
                    // 1 + (e^ε − 1)/q = e^ε(1 − (1−q)e^{−ε})/q and
                    // 1 − (1−q)e^{−ε} = q e^{−ε} − expm1(−ε), a sum of two terms ≥ 0 (ε > 0
                    // here), so ℓ = ε − ln q + ln(q e^{−ε} − expm1(−ε)) has no cancellation.
                    eps - q.ln() + (q * (-eps).exp() - (-eps).exp_m1()).ln()
                };
                let x = -0.5 - s2 * l;
                if !(l.is_finite() && x.is_finite()) {
                    return f64::NAN;
                }
                if r.is_finite() && x / sigma >= LOG_BRANCH {
                    q * phi((x + 1.0) / sigma) - (eps.exp_m1() + q) * phi(x / sigma)
                } else {
                    // e^ℓ overflows or Φ(x*/σ) leaves the normal range (round 52): in logs,
                    // δ = q Φ((x*+1)/σ)·(1 − exp(ℓ + ln Φ(x*/σ) − ln Φ((x*+1)/σ))). The exponent
                    // is lowered by a bound of its error, which only raises δ: 1e-12 for the
                    // asymptotic series of ln Φ (normal.rs, A&S 26.2.12 truncated: < 1e-12
                    // relative in Φ), and 8 ulps of each of the three terms' magnitude (each
                    // is computed to a few ulps of its size).
                    let lp1 = log_phi((x + 1.0) / sigma);
                    let lp0 = log_phi(x / sigma);
                    let err = 1e-12 + 8.0 * f64::EPSILON * (l.abs() + lp0.abs() + lp1.abs());
                    q * lp1.exp() * -(l + lp0 - lp1 - err).exp_m1()
                }
            }
            Direction::Add => {
                // Loss ≤ −ln(1−q) everywhere: above it, δ = 0.
                if eps >= -(-q).ln_1p() {
                    return 0.0;
                }
                // x* = 1/2 + σ² ln(1 + (e^{−ε} − 1)/q);
                // δ = Φ(x*/σ) − e^ε[(1−q)Φ(x*/σ) + qΦ((x*−1)/σ)]
                //   = (q e^ε − (e^ε − 1))Φ(x*/σ) − q e^ε Φ((x*−1)/σ).
                // (x* = +∞ for ε ≪ 0 is a true limit: both Φ are 1 and the coefficients are
                // finite below −ln(1−q), giving 1 − e^ε.)
                let x = 0.5 + s2 * ((-eps).exp_m1() / q).ln_1p();
                let e = eps.exp();
                (q * e - eps.exp_m1()) * phi(x / sigma) - q * e * phi((x - 1.0) / sigma)
            }
        };
        if d.is_finite() {
            d.clamp(0.0, 1.0)
        } else {
            f64::NAN
        }
    }

    /// The losses at the two truncation points of the noise: (lowest, highest).
    fn loss_range(self, q: f64, sigma: f64) -> (f64, f64) {
        let lo = sigma * phi_inv(0.5 * LOG_MASS_TRUNCATION.exp());
        let (x_lo, x_hi) = match self {
            Direction::Remove => (lo - 1.0, -lo),
            Direction::Add => (lo, -lo + 1.0),
        };
        (self.loss(q, sigma, x_hi), self.loss(q, sigma, x_lo))
    }
}

/// A discrete PLD: mass `probs[j]` at loss (lower + j)·h, and `infinity` at +∞.
#[derive(Clone, Debug)]
pub struct Pmf {
    pub h: f64,
    pub lower: i64,
    pub probs: Vec<f64>,
    pub infinity: f64,
}

impl Pmf {
    /// The connect-the-dots PLD of one step (module docs), or None when the grid would be longer
    /// than [`MAX_LEN`] or a point of the curve cannot be computed (σ² overflows: σ > ~1.3e154).
    pub fn subsampled_gaussian(dir: Direction, q: f64, sigma: f64, h: f64) -> Option<Pmf> {
        let (lo, hi) = dir.loss_range(q, sigma);
        let lo = (lo / h).floor();
        let hi = (hi / h).ceil();
        if !(lo.is_finite() && hi.is_finite()) || hi - lo + 1.0 > MAX_LEN as f64 {
            return None;
        }
        let (lo, hi) = (lo as i64, hi as i64);
        // δ at each grid point, made non-increasing (float error only).
        let mut deltas: Vec<f64> = (lo..=hi)
            .map(|i| dir.delta(q, sigma, i as f64 * h))
            .collect();
        // A δ that could not be computed (NaN) means no PLD at this σ, never δ = 0 (round 52,
        // review "pld" F1): the caller falls back to the RDP bound.
        if deltas.iter().any(|d| !d.is_finite()) {
            return None;
        }
        for j in 1..deltas.len() {
            deltas[j] = deltas[j].min(deltas[j - 1]);
        }
        let n = deltas.len();
        if n == 1 {
            return Some(Pmf {
                h,
                lower: lo,
                probs: vec![1.0 - deltas[0]],
                infinity: deltas[0],
            });
        }
        // Doroshenko et al. 2022, Algorithm 1 with a fixed gap d = h (dp_accounting's
        // `create_pmf_pessimistic_connect_dots_fixed_gap`):
        // p_1 = 1 − δ_1 + (δ_2 − δ_1)/(e^d − 1),
        // p_i = ((δ_{i+1} − δ_i) − e^d(δ_i − δ_{i−1}))/(e^d − 1),
        // p_n = (δ_n − δ_{n−1})/(e^{−d} − 1), mass at +∞ = δ_n; negative values (float error)
        // are set to 0, which only adds loss.
        let em1 = h.exp_m1();
        let e = h.exp();
        let diff: Vec<f64> = deltas.windows(2).map(|w| w[1] - w[0]).collect();
        let mut probs = vec![0.0; n];
        probs[0] = 1.0 - deltas[0] + diff[0] / em1;
        for i in 1..n - 1 {
            probs[i] = (diff[i] - diff[i - 1] * e) / em1;
        }
        probs[n - 1] = diff[n - 2] / (-h).exp_m1();
        for p in probs.iter_mut() {
            *p = p.max(0.0);
        }
        Some(Pmf {
            h,
            lower: lo,
            probs,
            infinity: deltas[n - 1],
        })
    }

    /// The PLD of `times` independent compositions (the `times`-th convolution power), or None
    /// when the window would be longer than [`MAX_LEN`].
    pub fn self_compose(&self, times: u64) -> Option<Pmf> {
        let len = self.probs.len();
        let t = times as f64;
        let (lo, hi) = convolution_bounds(&self.probs, t);
        let out_len = hi - lo + 1.0;
        if !(out_len.is_finite()) || out_len > MAX_LEN as f64 {
            return None;
        }
        let out_len = out_len as usize;
        let n = out_len.max(len).next_power_of_two();
        if n > MAX_LEN {
            return None;
        }
        let mut buf: Vec<C> = self.probs.iter().map(|&p| C(p, 0.0)).collect();
        buf.resize(n, C(0.0, 0.0));
        fft(&mut buf, false);
        for z in buf.iter_mut() {
            *z = z.pow(times);
        }
        fft(&mut buf, true);
        let lo_i = lo as i64;
        let nn = n as i64;
        let probs: Vec<f64> = (0..out_len as i64)
            .map(|i| (buf[(i + lo_i).rem_euclid(nn) as usize].0 / n as f64).max(0.0))
            .collect();
        // 1 − (1 − p_∞)^T, plus the truncated tails (dp_accounting's `DensePLDPmf.self_compose`).
        let infinity = TAIL_MASS_TRUNCATION - (t * (-self.infinity).ln_1p()).exp_m1();
        Some(Pmf {
            h: self.h,
            lower: self.lower.checked_mul(times as i64)?.checked_add(lo_i)?,
            probs,
            infinity: infinity.min(1.0),
        })
    }

    /// The smallest ε ≥ 0 with δ(ε) ≤ `delta` (+∞ when the mass at +∞ exceeds δ); the
    /// piecewise form of δ(ε) = p_∞ + Σ_{l > ε} p_l (1 − e^{ε − l}) is solved on the segment
    /// where it crosses δ (dp_accounting's `pld_pmf._get_epsilon_for_delta`).
    pub fn epsilon_for_delta(&self, delta: f64) -> f64 {
        if self.infinity > delta {
            return f64::INFINITY;
        }
        let mut upper = self.infinity;
        let mut lower = 0.0f64;
        for j in (0..self.probs.len()).rev() {
            let loss = (self.lower + j as i64) as f64 * self.h;
            if upper > delta && lower > 0.0 && ((upper - delta) / lower).ln() >= loss {
                break;
            }
            let p = self.probs[j];
            upper += p;
            lower += (-loss).exp() * p;
            if upper >= delta && lower == 0.0 {
                return loss.max(0.0);
            }
        }
        if upper <= lower + delta {
            return 0.0;
        }
        ((upper - delta) / lower).ln()
    }
}

/// The window [lo, hi] (indices of the T-fold sum) outside which the mass is at most
/// [`TAIL_MASS_TRUNCATION`], by Chernoff: P(S ≥ x) ≤ e^{−λx} M(λ)^T for λ > 0 and likewise for
/// λ < 0, at λ = ±k/len, k = 1..20 (dp_accounting's `common.compute_self_convolve_bounds`).
fn convolution_bounds(probs: &[f64], t: f64) -> (f64, f64) {
    let len = probs.len() as f64;
    let mut hi = (len - 1.0) * t;
    let mut lo = 0.0f64;
    for k in (-20i32..=20).filter(|k| *k != 0) {
        let order = k as f64 / len;
        // M(λ) = Σ p_j e^{λj}, with e^{λj} as a running product (|λ|·len ≤ 20: no overflow).
        let r = order.exp();
        let mut w = 1.0f64;
        let mut mgf = 0.0f64;
        for &p in probs {
            mgf += p * w;
            w *= r;
        }
        let bound = (t * mgf.ln() + (2.0 / TAIL_MASS_TRUNCATION).ln()) / order;
        if !bound.is_finite() {
            continue;
        }
        if order > 0.0 {
            hi = hi.min(bound.ceil());
        } else {
            lo = lo.max(bound.floor());
        }
    }
    (lo, hi.max(lo))
}

/// ε at δ of `steps` Poisson-subsampled Gaussian steps, both directions, at grid step `h`
/// (doubled while a length exceeds [`MAX_LEN`]); None if no grid step up to 1 fits.
pub fn composed_epsilon(q: f64, sigma: f64, steps: u64, delta: f64) -> Option<f64> {
    composed_epsilon_from(q, sigma, steps, delta, DISCRETISATION)
}

/// [`composed_epsilon`] starting from grid step `h0` (calibration locates σ on a coarser grid
/// first; every grid step gives an upper bound).
pub fn composed_epsilon_from(q: f64, sigma: f64, steps: u64, delta: f64, h0: f64) -> Option<f64> {
    let mut h = h0;
    while h <= 1.0 {
        // With q = 1 the two pairs are mirror images with the same PLD.
        let dirs: &[Direction] = if q == 1.0 {
            &[Direction::Remove]
        } else {
            &[Direction::Remove, Direction::Add]
        };
        let eps = dirs
            .iter()
            .map(|&d| {
                Pmf::subsampled_gaussian(d, q, sigma, h)
                    .and_then(|p| p.self_compose(steps))
                    .map(|p| p.epsilon_for_delta(delta))
            })
            .collect::<Option<Vec<f64>>>();
        if let Some(e) = eps {
            // A NaN (never expected) counts as unbounded loss: `f64::max` would drop it.
            let e = e
                .iter()
                .map(|&x| if x.is_nan() { f64::INFINITY } else { x })
                .fold(0.0, f64::max);
            // Round outward: the float error of the FFT (module constants).
            return Some(e + FLOAT_SLACK * e.max(1e-3));
        }
        h *= 2.0;
    }
    None
}

/// A complex number (re, im).
#[derive(Clone, Copy, Debug, PartialEq)]
struct C(f64, f64);

impl C {
    fn mul(self, o: C) -> C {
        C(self.0 * o.0 - self.1 * o.1, self.0 * o.1 + self.1 * o.0)
    }
    /// z^n by repeated squaring (relative error grows like log₂ n, not n).
    fn pow(self, mut n: u64) -> C {
        let mut base = self;
        let mut acc = C(1.0, 0.0);
        while n > 0 {
            if n & 1 == 1 {
                acc = acc.mul(base);
            }
            base = base.mul(base);
            n >>= 1;
        }
        acc
    }
}

/// In-place iterative radix-2 FFT (Cooley and Tukey 1965); `inverse` uses e^{+2πi/n} and does
/// not divide by n. Twiddles are computed directly by sin/cos (no recurrence drift).
fn fft(a: &mut [C], inverse: bool) {
    let n = a.len();
    debug_assert!(n.is_power_of_two());
    let bits = n.trailing_zeros();
    if bits == 0 {
        return;
    }
    for i in 0..n {
        let j = i.reverse_bits() >> (usize::BITS - bits);
        if i < j {
            a.swap(i, j);
        }
    }
    let sign = if inverse { 1.0 } else { -1.0 };
    let tw: Vec<C> = (0..n / 2)
        .map(|k| {
            let th = sign * 2.0 * std::f64::consts::PI * k as f64 / n as f64;
            C(th.cos(), th.sin())
        })
        .collect();
    let mut size = 2;
    while size <= n {
        let half = size / 2;
        let step = n / size;
        for start in (0..n).step_by(size) {
            for k in 0..half {
                let w = tw[k * step];
                let u = a[start + k];
                let v = a[start + k + half].mul(w);
                a[start + k] = C(u.0 + v.0, u.1 + v.1);
                a[start + k + half] = C(u.0 - v.0, u.1 - v.1);
            }
        }
        size *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fft_matches_direct_convolution() {
        let p = [0.2, 0.5, 0.3];
        let pmf = Pmf {
            h: 0.1,
            lower: -1,
            probs: p.to_vec(),
            infinity: 0.0,
        };
        let c = pmf.self_compose(3).unwrap();
        // Direct: (0.2 + 0.5x + 0.3x²)³.
        let mut direct = vec![1.0];
        for _ in 0..3 {
            let mut next = vec![0.0; direct.len() + 2];
            for (i, d) in direct.iter().enumerate() {
                for (j, q) in p.iter().enumerate() {
                    next[i + j] += d * q;
                }
            }
            direct = next;
        }
        assert_eq!(c.lower, -3);
        for (i, d) in direct.iter().enumerate() {
            let got = c.probs.get(i).copied().unwrap_or(0.0);
            assert!((got - d).abs() < 1e-14, "{i}: {got} vs {d}");
        }
    }

    #[test]
    fn unsampled_gaussian_delta_is_the_exact_curve() {
        // q = 1: δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), μ = 1/σ (Balle and Wang 2018, Thm 8).
        let (s, e): (f64, f64) = (2.0, 0.7);
        let mu = 1.0 / s;
        let want = phi(mu / 2.0 - e / mu) - e.exp() * phi(-mu / 2.0 - e / mu);
        for d in [Direction::Remove, Direction::Add] {
            assert!((d.delta(1.0, s, e) - want).abs() < 1e-12);
        }
    }

    #[test]
    fn one_step_pmf_is_a_distribution_with_the_right_curve() {
        let (q, s) = (0.01, 1.0);
        for d in [Direction::Remove, Direction::Add] {
            let p = Pmf::subsampled_gaussian(d, q, s, DISCRETISATION).unwrap();
            let total: f64 = p.probs.iter().sum::<f64>() + p.infinity;
            assert!((total - 1.0).abs() < 1e-6, "{total}");
            // Pessimistic: the discrete ε at δ is at least the exact one step's.
            let eps = p.epsilon_for_delta(1e-5);
            assert!(d.delta(q, s, eps) <= 1e-5 * (1.0 + 1e-6), "{eps}");
        }
    }

    #[test]
    fn remove_delta_past_the_exp_overflow_is_the_exact_curve() {
        // Round 52, review "pld" F1: for ε > 709.78 + ln q, (e^ε − 1)/q overflowed, x* became
        // −∞ and δ(ε) came out as 0. Exact values: the review's pld/exact1.py `d_remove` in
        // 80-digit mpmath, rounded to f64 (q, σ, ε, δ); at ε ≤ 800 the curve equals q to 20
        // digits.
        for (q, s, e, want) in [
            (0.01, 0.01, 700.0, 0.01),
            (0.01, 0.01, 705.5, 0.01),
            (0.01, 0.01, 800.0, 0.01),
            (0.01, 0.01, 5000.0, 0.00477651558244931),
            (0.01, 0.01, 5555.0, 1.0365887795896678e-10),
            (0.01, 0.01, 6000.0, 4.3404362829943293e-26),
            (1.0, 0.01, 800.0, 1.0),
            (1.0, 0.0075, 9000.0, 0.2002272911485908),
            // Both sides of the switch to logs at x*/σ = −37 (675.3: −36.998; 675.5: −37.003)
            // and of the overflow of (e^ε − 1)/q at 709.78 + ln q ≈ 705.18.
            (0.01, 0.025, 675.3, 0.009985417200742511),
            (0.01, 0.025, 675.5, 0.009985177722014566),
            (0.01, 0.025, 705.17, 0.009871230553734478),
            (0.01, 0.025, 705.19, 0.009871064511585743),
            (0.01, 0.05, 705.17, 5.766499751548534e-146),
            (0.01, 0.05, 705.19, 5.621030369784903e-146),
            (0.01, 0.025, 1200.0, 1.884826564662766e-26),
        ] {
            let got = Direction::Remove.delta(q, s, e);
            assert!(
                got >= want * (1.0 - 1e-9) && got <= want * (1.0 + 1e-9),
                "q={q} σ={s} ε={e}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn a_sigma_whose_square_overflows_has_no_pld() {
        // Round 52, review "pld" F2: σ > ~1.3e154 made σ² = ∞ and the grid NaN (reported as
        // ε = ∞); now "cannot compute", and the caller uses the RDP bound.
        assert!(Direction::Remove.delta(0.5, 1e200, 1.0).is_nan());
        assert!(Pmf::subsampled_gaussian(Direction::Remove, 0.5, 1e200, DISCRETISATION).is_none());
        assert!(composed_epsilon(1.0, 1e200, 10, 1e-10).is_none());
    }
}
