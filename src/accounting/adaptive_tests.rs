//! The adaptive counterexample to the old admission rule (GitHub issue 14, item 5;
//! docs/ACCOUNTING.md, "Why the old rule was invalid"), and the filter's bound on the same
//! family of strategies.
//!
//! Neighbours D (x = 1) and D' (x = 0). Query 1 is a Gaussian release Y₁ ~ N(μ₁x, 1) (μ₁-GDP).
//! The analyst then looks at Y₁:
//! - path A (Y₁ > t): a second Gaussian release Y₂ ~ N(μ₂x, 1);
//! - path B (Y₁ ≤ t): a partition selection whose whole cost is its additive δ₂: under D it
//!   releases a new key with probability δ₂, under D' never.
//!
//! The old rule (min of the exact GDP conversion and CKS, at δ_B − Σδ_add) admits path A while
//! √(μ₁² + μ₂²) ≤ μ*(ε_B, δ_B) and path B while δ_GDP(ε_B; μ₁) + δ₂ ≤ δ_B. The hockey-stick
//! divergence of the whole transcript is computed exactly in Y₂ (closed form of two Gaussians)
//! and by quadrature in Y₁.
use dpfusion_udfs::privacy::gdp::gdp_delta;
use dpfusion_udfs::privacy::normal::phi as cdf;
use dpfusion_udfs::privacy::{Profile, gaussian_mu};

use super::*;

/// The admission rule before filters, as `evaluate()` had it: compose the profiles, convert
/// with the min of GDP and CKS at δ_B − Σδ_add, compare with ε_B.
fn old_rule_admits(events: &[Event], b: &Budget) -> bool {
    Profile::from_events(events).epsilon(b.delta) <= b.epsilon * (1.0 + 1e-12)
}

fn density(y: f64, mean: f64) -> f64 {
    (-(y - mean) * (y - mean) / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// H_e(N(m, 1) ‖ N(0, 1)) = Φ(−e/m + m/2) − e^e Φ(−e/m − m/2), valid for every real e (Balle
/// and Wang 2018, Thm. 8); by symmetry also H_e(N(0, 1) ‖ N(m, 1)).
fn gauss_hockey(e: f64, m: f64) -> f64 {
    if m <= 0.0 {
        return (1.0 - e.exp()).max(0.0);
    }
    (cdf(-e / m + m / 2.0) - e.exp() * cdf(-e / m - m / 2.0)).max(0.0)
}

/// max of H_ε(P ‖ Q) and H_ε(Q ‖ P) for the two-path strategy (module docs), P under D (x = 1).
fn divergence(eps: f64, mu1: f64, mu2: f64, delta2: f64, t: f64) -> f64 {
    let (lo, hi, n) = (-14.0, 14.0 + mu1, 60_000);
    let h = (hi - lo) / n as f64;
    let (mut pq, mut qp) = (0.0, 0.0);
    for i in 0..n {
        let y = lo + (i as f64 + 0.5) * h;
        let (p, q) = (density(y, mu1), density(y, 0.0));
        let loss = mu1 * y - mu1 * mu1 / 2.0; // ln p/q
        if y > t {
            // ∫ (p p₂ − e^ε q q₂)₊ dy₂ = p · H_{ε − loss}(N(μ₂) ‖ N(0)), and the mirror.
            pq += p * gauss_hockey(eps - loss, mu2) * h;
            qp += q * gauss_hockey(eps + loss, mu2) * h;
        } else {
            // Outputs (y, key) and (y, no key): P = (pδ₂, p(1 − δ₂)), Q = (0, q).
            pq += (delta2 * p + ((1.0 - delta2) * p - eps.exp() * q).max(0.0)) * h;
            qp += (q - eps.exp() * (1.0 - delta2) * p).max(0.0) * h;
        }
    }
    pq.max(qp)
}

#[test]
fn old_rule_admits_an_adaptive_strategy_that_breaks_its_budget() {
    let b = Budget {
        epsilon: 1.0,
        delta: 1e-6,
    };
    let (mu1, t) = (0.2, 2.5);
    // The largest second steps the old rule admits on each path.
    let mu_star = gaussian_mu(b.epsilon, b.delta).unwrap();
    let mu2 = (mu_star * mu_star - mu1 * mu1).sqrt() * (1.0 - 1e-9);
    let delta2 = (b.delta - gdp_delta(b.epsilon, mu1)) * (1.0 - 1e-9);
    let path_a = [Event::Gaussian { mu: mu1 }, Event::Gaussian { mu: mu2 }];
    let path_b = [Event::Gaussian { mu: mu1 }, Event::Delta { delta: delta2 }];
    assert!(old_rule_admits(&path_a, &b), "old rule, path A");
    assert!(old_rule_admits(&path_b, &b), "old rule, path B");

    // Each path alone is (1, 1e-6)-DP, but the adaptive mixture is not.
    let h = divergence(b.epsilon, mu1, mu2, delta2, t);
    assert!(h > 1.9 * b.delta, "divergence {h:e} (expected ≈ 1.97e-6)");
    // ... equivalently, the ε at which the transcript is δ_B-DP is above 1.1.
    assert!(divergence(1.1, mu1, mu2, delta2, t) > b.delta);

    // The gdp filter (s = 0.5) refuses path B: its δ₂ ≈ 9.8e-7 exceeds δ_sel = 5e-7.
    let f = Filter::new(&b, FilterKind::Gdp, 0.5).unwrap();
    let first = f.usage(&path_a[..1]);
    assert_eq!(f.check(&first, &f.usage(&path_b[1..])), Some(Limit::Delta));
    // The zcdp and rdp filters refuse it too (their δ side is the same).
    for kind in [FilterKind::Zcdp, FilterKind::Rdp { order: None }] {
        let g = Filter::new(&b, kind, 0.5).unwrap();
        assert_eq!(
            g.check(&g.usage(&path_b[..1]), &g.usage(&path_b[1..])),
            Some(Limit::Delta),
            "{kind}"
        );
    }

    // The same family at the filter's largest admitted steps stays within δ_B, for every cut t
    // and first step μ₁ tried (the filter theorem, checked numerically on this family).
    let mu_b = f.main_budget().sqrt();
    for mu1 in [0.05, 0.1, 0.15, 0.2] {
        let mu2 = (mu_b * mu_b - mu1 * mu1).sqrt() * (1.0 - 1e-9);
        let path_a = [Event::Gaussian { mu: mu1 }, Event::Gaussian { mu: mu2 }];
        let path_b = [
            Event::Gaussian { mu: mu1 },
            Event::Delta { delta: f.delta_sel },
        ];
        let first = f.usage(&path_a[..1]);
        assert_eq!(f.check(&first, &f.usage(&path_a[1..])), None);
        assert_eq!(f.check(&first, &f.usage(&path_b[1..])), None);
        for t in [-1.0, 0.0, 1.0, 2.0, 2.5, 3.0, 4.0] {
            let h = divergence(b.epsilon, mu1, mu2, f.delta_sel, t);
            assert!(h <= b.delta, "μ₁ = {mu1}, t = {t}: {h:e}");
        }
    }
}
