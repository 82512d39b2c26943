//! DP-SGD accounting at extreme parameters (round 52, review "pld"): the PLD accountant past the
//! exp overflow of one step's privacy loss (F1), the RDP bound where the PLD has no finite value
//! (F2). Reference numbers are independent of dpfusion: the exact one-step hockey-stick curve in
//! 60-digit mpmath (the review's `pld/exact1.py`, `eps(q, σ, δ)`), Google `dp_accounting` 0.6.0
//! (PLD at grid step 0.05, optimistic: a lower bound of the true ε; RDP accountant: an upper
//! bound), and bisections of `exact1.py` in σ.
use dpfusion_udfs::privacy::sgd;

#[test]
fn epsilon_past_the_exp_overflow_is_never_below_the_true_epsilon() {
    // (q, σ, steps, δ, a lower bound of the true ε). The old code gave 705.18, 705.33, 705.18,
    // 709.09, 707.48, 688.99, 7052.29 and 14811.5: the loss mass above ≈ 709.78 + ln q was moved
    // down to there.
    let q30 = 2f64.powi(-30); // the fits' smallest sample rate
    for (q, z, t, d, truth) in [
        // exact1.py (one step: the exact ε).
        (0.01, 0.01, 1, 1e-10, 5555.62203557197),
        (0.01, 0.0022037563961863032, 1, 1e-10, 105494.86958372),
        (0.01, 0.02, 1, 1e-10, 1525.04723779625),
        (0.5, 0.03, 1, 1e-10, 762.413701635198),
        (0.1, 0.025, 1, 1e-6, 967.343006839419),
        (q30, 0.01, 1, 1e-10, 5102.27317255116),
        // dp_accounting optimistic PLD, h = 0.05 (pessimistic: 29978.50 and 18120.25).
        (0.01, 0.01, 10, 1e-10, 29978.199999456538),
        (0.01, 0.015, 100, 1e-6, 18116.349999850143),
    ] {
        let got = sgd::epsilon(q, z, t, d).unwrap();
        assert!(
            got >= truth && got <= truth * 1.01,
            "q={q} σ={z} T={t} δ={d}: {got} vs {truth}"
        );
    }
}

#[test]
fn calibrated_sigma_past_the_overflow_meets_the_target() {
    // The review's attack: dp_sgd_sigma(0.01, 1, 1e4, 1e-10) returned σ = 0.0022038, whose true
    // ε is 105 495. σ* is the σ whose exact ε (exact1.py) is 1e4, by 60 bisections in mpmath; ε
    // decreases in σ, so σ ≥ σ* meets the target. At q = 1 the PLD used to be +∞ above 709.78.
    for (q, sigma_star) in [(0.01, 0.00735509810796012), (1.0, 0.00739590722169833)] {
        let z = sgd::noise_multiplier(q, 1, 1e4, 1e-10).unwrap();
        assert!(
            z >= sigma_star && z <= sigma_star * 1.01,
            "q={q}: {z} vs {sigma_star}"
        );
        assert!(sgd::epsilon(q, z, 1, 1e-10).unwrap() <= 1e4);
    }
}

#[test]
fn tiny_delta_and_huge_sigma_use_the_rdp_bound() {
    // δ below the 1e-15 the PLD composition puts at +∞ gave ε = ∞ (review F2). The smaller of
    // the PLD and RDP bounds is finite and above the truth:
    // q = 0.01, σ = 10, one step, δ = 1e-20: exact ε 0.0128288462768557 (exact1.py);
    // dp_accounting's RdpAccountant: 0.07622898954905209.
    let got = sgd::epsilon(0.01, 10.0, 1, 1e-20).unwrap();
    assert!(
        (0.0128288462768557..=0.07622898954905209 * 1.01).contains(&got),
        "{got}"
    );
    // q = 0.01, σ = 1, 1000 steps, δ = 1e-15: dp_accounting's RdpAccountant 5.397160351157354
    // (an upper bound; ours, on the order grid with chords between integer orders, may be a
    // little above it).
    let got = sgd::epsilon(0.01, 1.0, 1000, 1e-15).unwrap();
    assert!(got.is_finite() && got <= 5.397160351157354 * 1.01, "{got}");
    // σ = 1e200 (σ² overflows): the unsampled Gaussian's μ = √10·1e-200, whose exact ε at
    // δ = 1e-10 is below 1e-190; the RDP bound is the grid's floor, finite and small.
    let got = sgd::epsilon(1.0, 1e200, 10, 1e-10).unwrap();
    assert!(got.is_finite() && got < 1e-4, "{got}");
    // A fit at δ = 1e-16 is no longer refused, and its σ meets the target.
    let z = sgd::noise_multiplier(0.01, 100, 5.0, 1e-16).unwrap();
    assert!(sgd::epsilon(0.01, z, 100, 1e-16).unwrap() <= 5.0, "{z}");
}
