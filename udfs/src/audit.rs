//! Statistical privacy audits (distinguishing tests): the 95% lower confidence bound on ε from
//! releases of a mechanism on two neighbouring datasets. Used by the audits of this crate
//! (`udfs/tests/it/audit.rs`, `udfs/tests/it/units.rs`) and of the session (`tests/it/units.rs`).
//!
//! Method (Ding, Wang, Wang, Zhang, Kifer, "Detecting Violations of Differential Privacy", CCS
//! 2018; Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning", NeurIPS
//! 2020): for each threshold t of a grid and each event S ∈ {M > t, M ≤ t}, estimate
//! p = P[M(D) ∈ S] and q = P[M(D′) ∈ S]; (ε, δ)-DP implies q ≤ e^ε p + δ in both orders.
use statrs::distribution::{Beta, ContinuousCDF};

/// One-sided Clopper–Pearson bounds for k successes in n trials at level `alpha` (Clopper and
/// Pearson, Biometrika 1934): the upper bound is the 1 − α quantile of Beta(k + 1, n − k), the
/// lower bound the α quantile of Beta(k, n − k + 1).
pub fn cp_upper(k: usize, n: usize, alpha: f64) -> f64 {
    if k == n {
        1.0
    } else {
        Beta::new(k as f64 + 1.0, (n - k) as f64)
            .unwrap()
            .inverse_cdf(1.0 - alpha)
    }
}
pub fn cp_lower(k: usize, n: usize, alpha: f64) -> f64 {
    if k == 0 {
        0.0
    } else {
        Beta::new(k as f64, (n - k + 1) as f64)
            .unwrap()
            .inverse_cdf(alpha)
    }
}

/// The largest ε lower bound over the events {M > t} and {M ≤ t}, t in `grid`, in both
/// directions (D vs D′ and D′ vs D), from releases `d` = M(D) and `d1` = M(D′).
///
/// (ε, δ)-DP implies P[M(D′) ∈ S] ≤ e^ε·P[M(D) ∈ S] + δ for every event S and both orders of the
/// neighbours (Dwork and Roth 2014, Def. 2.4), so ε ≥ ln((q − δ)/p) with p, q the two
/// probabilities; p is replaced by its upper and q by its lower one-sided Clopper–Pearson bound
/// (Jagielski et al. 2020, their ε estimate with Clopper–Pearson intervals). Each of the
/// 4·|grid| bounds is at confidence 1 − 0.05/(4·|grid|), so all hold together with probability
/// ≥ 95% (Bonferroni), and the maximum is a 95% lower confidence bound on ε.
pub fn epsilon_lower_bound(d: &[f64], d1: &[f64], delta: f64, grid: &[f64]) -> f64 {
    let alpha = 0.05 / (4 * grid.len()) as f64;
    let above = |v: &[f64], t: f64| v.iter().filter(|&&x| x > t).count();
    let mut best = f64::NEG_INFINITY;
    for &t in grid {
        let (ka, kb) = (above(d, t), above(d1, t));
        // (successes in the first sample, in the second): {M > t} then {M ≤ t}, both orders.
        for ((p, np), (q, nq)) in [
            ((ka, d.len()), (kb, d1.len())),
            ((kb, d1.len()), (ka, d.len())),
            ((d.len() - ka, d.len()), (d1.len() - kb, d1.len())),
            ((d1.len() - kb, d1.len()), (d.len() - ka, d.len())),
        ] {
            let p_hi = cp_upper(p, np, alpha);
            let q_lo = cp_lower(q, nq, alpha);
            if q_lo - delta > 0.0 && p_hi > 0.0 {
                best = best.max(((q_lo - delta) / p_hi).ln());
            }
        }
    }
    best
}

/// 39 thresholds at the 1/40, …, 39/40 quantiles of the pooled releases. The grid depends on
/// the releases it is then tested on, so the 95% Bonferroni level holds only approximately; the
/// model audits use grids fixed from public parameters instead.
pub fn pooled_quantile_grid(d: &[f64], d1: &[f64]) -> Vec<f64> {
    let mut all: Vec<f64> = d.iter().chain(d1).copied().collect();
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (1..40).map(|i| all[i * all.len() / 40]).collect()
}
