//! Exactness of the blocked, runtime-dispatched row pass of `dp_linreg_gd` (issue 19,
//! `udfs/src/optim/kernel.rs`): on random data, the exact integer gradient sums are the same on
//! every path — the widest build chosen at run time (`Auto`: AVX-512 or AVX2), the AVX2 build
//! (`Avx2`, forced), the baseline x86-64 build that is the dispatch fallback (`Portable`, forced),
//! and the row-at-a-time reference (`Reference`) — with
//! and without privacy units, for many shapes, at parameters that send rows through the fast
//! path's fallback (huge residuals, ±1e150 values, non-finite norms), and for any split of the
//! rows (the sum over two halves equals the sum over all).
//!
//! Run: `cargo nextest run -p dpfusion-udfs --release --test it kernels::` (all seeded).
use dpfusion_udfs::aggregates::Neighbours;
use dpfusion_udfs::noise::SecureRng;
use dpfusion_udfs::optim::kernel::RowPath;
use dpfusion_udfs::optim::linreg::GaussianGd;
use dpfusion_udfs::optim::{Rows, Units};

/// Test data (not noise): n rows of d features; `wild` mixes in extreme values.
fn data(n: usize, d: usize, wild: bool, g: &mut SecureRng) -> Rows {
    let mut u = || g.uniform_f64();
    let mut x = Vec::with_capacity(n * d);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        for _ in 0..d {
            let v = 2.0 * u() - 1.0;
            let k = u();
            x.push(if wild && k < 0.01 {
                [1e150, -1e150, f64::INFINITY, -f64::INFINITY, 1e-300, 0.0][(u() * 6.0) as usize]
            } else if wild && k < 0.05 {
                v * 1e6
            } else {
                v * 3.0
            });
        }
        let y = 4.0 * u() - 2.0;
        labels.push(if wild && u() < 0.02 {
            [1e150, -1e150, f64::INFINITY, 1e12][(u() * 4.0) as usize]
        } else {
            y
        });
    }
    Rows { d, labels, x }
}

fn kernel(clip: f64, intercept: bool, replace: bool) -> GaussianGd {
    GaussianGd::new(0.9, 20, clip, 0.5, 0.0, intercept, replace, false).unwrap()
}

fn units_kernel(clip: f64, intercept: bool) -> GaussianGd {
    GaussianGd::new_units(
        0.9,
        Neighbours::Units { groups: 2, rows: 1 },
        20,
        clip,
        0.5,
        0.0,
        intercept,
    )
    .unwrap()
}

fn theta(p: usize, scale: f64, g: &mut SecureRng) -> Vec<f64> {
    (0..p)
        .map(|_| (2.0 * g.uniform_f64() - 1.0) * scale)
        .collect()
}

/// Every path, the same integers; returns them.
fn same_on_every_path(k: &GaussianGd, rows: &Rows, units: Option<&Units>, th: &[f64]) -> Vec<i128> {
    let auto = k.gradient_sum_with(rows, units, th, RowPath::Auto).unwrap();
    let portable = k
        .gradient_sum_with(rows, units, th, RowPath::Portable)
        .unwrap();
    let reference = k
        .gradient_sum_with(rows, units, th, RowPath::Reference)
        .unwrap();
    assert_eq!(
        auto,
        reference,
        "Auto (avx2: {})",
        RowPath::avx2_available()
    );
    assert_eq!(portable, reference, "Portable");
    let avx2 = k.gradient_sum_with(rows, units, th, RowPath::Avx2).unwrap();
    assert_eq!(avx2, reference, "Avx2");
    assert_eq!(k.gradient_sum(rows, units, th).unwrap(), reference);
    reference
}

#[test]
fn blocked_pass_equals_reference_on_random_data() {
    let mut g = SecureRng::insecure_from_seed(19);
    let mut nonzero = 0;
    for &(n, d) in &[
        (1, 1),
        (7, 3),
        (8, 16),
        (9, 16),
        (1000, 16),
        (1003, 5),
        (517, 31),
        (300, 32),
        (200, 40),
    ] {
        for intercept in [true, false] {
            for wild in [false, true] {
                let rows = data(n, d, wild, &mut g);
                let p = d + usize::from(intercept);
                for &(clip, replace) in &[(1.0, false), (0.05, true), (1e3, false), (1e-8, false)] {
                    let k = kernel(clip, intercept, replace);
                    // Small θ (most rows unclipped), moderate, and huge (every row clipped, some
                    // residuals non-finite or beyond the fast path's range).
                    for scale in [1e-3, 0.3, 5.0, 1e200] {
                        let th = theta(p, scale, &mut g);
                        let s = same_on_every_path(&k, &rows, None, &th);
                        nonzero += usize::from(s.iter().any(|&v| v != 0));
                    }
                }
            }
        }
    }
    assert!(nonzero > 100, "{nonzero}");
}

/// Ties: labels and features on a grid where f·xⱼ/q lands exactly on k + ½.
#[test]
fn ties_round_the_same_way() {
    let mut g = SecureRng::insecure_from_seed(5);
    for intercept in [true, false] {
        let k = kernel(1e6, intercept, false); // nothing clipped
        let q = k.grid();
        let d = 4;
        let n = 203;
        let x: Vec<f64> = (0..n * d)
            .map(|_| [1.0, -1.0, 0.5, 3.0][g.uniform_below(4) as usize])
            .collect();
        // θ = 0: r = −y, so v = round(−y·xⱼ/q): make y a half-integer number of grid steps.
        let labels: Vec<f64> = (0..n)
            .map(|_| (g.uniform_below(2001) as f64 - 1000.0 + 0.5) * q)
            .collect();
        let rows = Rows { d, labels, x };
        let th = vec![0.0; d + usize::from(intercept)];
        same_on_every_path(&k, &rows, None, &th);
    }
}

#[test]
fn unit_level_blocked_pass_equals_reference() {
    let mut g = SecureRng::insecure_from_seed(23);
    for &(n, d) in &[(50, 2), (1000, 16), (777, 7)] {
        for intercept in [true, false] {
            for wild in [false, true] {
                let rows = data(n, d, wild, &mut g);
                // Units of 1 to 40 rows (some larger than a block of 8, some smaller).
                let mut sizes = vec![];
                let mut left = n;
                while left > 0 {
                    let s = (1 + g.uniform_below(40) as usize).min(left);
                    sizes.push(s);
                    left -= s;
                }
                let units = Units::from_sizes(&sizes);
                let p = d + usize::from(intercept);
                for clip in [1.0, 0.01] {
                    let k = units_kernel(clip, intercept);
                    for scale in [1e-2, 1.0, 1e200] {
                        let th = theta(p, scale, &mut g);
                        same_on_every_path(&k, &rows, Some(&units), &th);
                    }
                }
            }
        }
    }
}

/// Large enough for the pass to run on several threads; the sum over two halves of the rows
/// (any split) equals the sum over all, on every path.
#[test]
fn any_split_gives_the_same_sum() {
    let mut g = SecureRng::insecure_from_seed(31);
    let (n, d) = (70_001, 16);
    let rows = data(n, d, true, &mut g);
    let k = kernel(1.0, true, false);
    let th = theta(d + 1, 0.5, &mut g);
    let all = same_on_every_path(&k, &rows, None, &th);
    let cut = 12_345;
    let half = |a: usize, b: usize| Rows {
        d,
        labels: rows.labels[a..b].to_vec(),
        x: rows.x[a * d..b * d].to_vec(),
    };
    let (lo, hi) = (half(0, cut), half(cut, n));
    for path in [
        RowPath::Auto,
        RowPath::Avx2,
        RowPath::Portable,
        RowPath::Reference,
    ] {
        let a = k.gradient_sum_with(&lo, None, &th, path).unwrap();
        let b = k.gradient_sum_with(&hi, None, &th, path).unwrap();
        let sum: Vec<i128> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(sum, all, "{path:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// dp_logreg_agd's row passes (issue 19; `agd::row_passes_with`): the blocked gradient pass gives
// the reference's z and integers bit for bit on every path; the blocked selection pass gives the
// same integers on the AVX2 and baseline builds, and each row's floored candidate loss within one
// grid unit of the reference's (libm's `ln_1p` against `kernel::ln_1p_unit`), rarely different.

use dpfusion_udfs::optim::agd::{self, AgdConfig, AgdPlan};

fn agd_plan(clip_obj: f64, intercept: bool, replace: bool) -> AgdPlan {
    AgdPlan::new(AgdConfig {
        rho: 0.5,
        neighbours: if replace {
            Neighbours::Replace
        } else {
            Neighbours::AddRemove
        },
        clip_grad: 3.0,
        clip_obj,
        splits: 20.0,
        gamma: 0.1,
        l2: 1e-3,
        fit_intercept: intercept,
        max_step: 2.0,
        momentum: 0.0,
    })
    .unwrap()
}

/// Labels 0/1 (AGD's), features as [`data`].
fn agd_data(n: usize, d: usize, wild: bool, g: &mut SecureRng) -> Rows {
    let mut rows = data(n, d, wild, g);
    for y in &mut rows.labels {
        *y = f64::from(g.coin());
    }
    rows
}

fn grid(amax: f64) -> Vec<f64> {
    (0..=agd::CANDIDATES)
        .map(|i| i as f64 * amax / agd::CANDIDATES as f64)
        .collect()
}

/// The three paths on `rows`: gradient and z identical; scores identical between the two
/// blocked builds, and within one unit per row and candidate of the reference. Returns the
/// number of (row, candidate) pairs that differ from the reference (0 when the rows are one).
fn agd_paths(plan: &AgdPlan, rows: &Rows, w: &[f64], u: &[f64], steps: &[f64]) -> u128 {
    let (ga, sa, za) = agd::row_passes_with(plan, rows, w, u, steps, RowPath::Auto);
    let (gp, sp, zp) = agd::row_passes_with(plan, rows, w, u, steps, RowPath::Portable);
    let (gr, sr, zr) = agd::row_passes_with(plan, rows, w, u, steps, RowPath::Reference);
    let (g2, s2, z2) = agd::row_passes_with(plan, rows, w, u, steps, RowPath::Avx2);
    assert_eq!(g2, gr, "gradient, Avx2");
    assert_eq!(s2, sp, "scores, Avx2 against Portable");
    assert_eq!(
        z2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        zr.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let bits = |z: &[f64]| z.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&za), bits(&zr), "z, Auto");
    assert_eq!(bits(&zp), bits(&zr), "z, Portable");
    assert_eq!(
        ga,
        gr,
        "gradient, Auto (avx2: {})",
        RowPath::avx2_available()
    );
    assert_eq!(gp, gr, "gradient, Portable");
    assert_eq!(sa, sp, "scores, Auto against Portable");
    let n = rows.n() as u128;
    let mut differ = 0;
    for (a, r) in sa.iter().zip(&sr) {
        // Each row moves a score by at most one unit.
        assert!(a.abs_diff(*r) <= n, "{a} {r} (n = {n})");
        differ += a.abs_diff(*r);
    }
    differ
}

#[test]
fn agd_passes_on_every_path() {
    let mut g = SecureRng::insecure_from_seed(47);
    let mut compared = 0u128;
    let mut differ = 0u128;
    for &(n, d) in &[
        (1, 1),
        (7, 3),
        (8, 16),
        (9, 16),
        (1000, 16),
        (517, 31),
        (64, 0),
    ] {
        for intercept in [true, false] {
            for wild in [false, true] {
                let rows = agd_data(n, d, wild, &mut g);
                let p = d + usize::from(intercept);
                // C_obj: the default, large, and the smallest the plan accepts (round 52, review
                // "extremes": 1e-305, whose q_o = 2⁻¹⁰⁴⁶ is subnormal, is now refused, so the
                // selection pass always multiplies by a normal 1/q_o).
                for &(clip_obj, replace) in &[(3.0, false), (700.0, true), (agd::CLIP_MIN, false)] {
                    let plan = agd_plan(clip_obj, intercept, replace);
                    for (scale, amax) in [(1e-2, 0.1), (0.5, 2.0), (5.0, 30.0), (1e200, 2.0)] {
                        let w = theta(p, scale, &mut g);
                        let u = theta(p, 1.0, &mut g);
                        differ += agd_paths(&plan, &rows, &w, &u, &grid(amax));
                        compared += (n * (agd::CANDIDATES + 1)) as u128;
                    }
                }
            }
        }
    }
    // A floored loss differs by one unit of 2⁻³²·C_obj in at most a few per thousand
    // (row, candidate) pairs.
    assert!(differ * 200 < compared, "{differ} of {compared}");
}

/// Row by row (one-row inputs): every row's 21 integers within one unit of the reference.
#[test]
fn agd_scores_row_by_row() {
    let mut g = SecureRng::insecure_from_seed(53);
    let plan = agd_plan(3.0, true, false);
    let (mut rows_seen, mut differ) = (0u128, 0u128);
    for trial in 0..3000 {
        let d = 4;
        let mut rows = agd_data(1, d, trial % 5 == 0, &mut g);
        // Rows whose scores lie in the recurrence's range, and beyond it.
        let spread = [1.0, 30.0, 300.0, 3000.0][trial % 4];
        for v in &mut rows.x {
            *v *= spread;
        }
        let w = theta(d + 1, 1.0, &mut g);
        let u = theta(d + 1, 1.0, &mut g);
        differ += agd_paths(&plan, &rows, &w, &u, &grid([0.05, 2.0, 20.0][trial % 3]));
        rows_seen += 1;
    }
    assert!(
        differ * 200 < rows_seen * 21,
        "{differ} of {}",
        rows_seen * 21
    );
}

/// Large enough for the fit's passes to run on several threads (`agd::exact_sums`); the passes
/// over two halves of the rows add up to the pass over all, on every path.
#[test]
fn agd_any_split_gives_the_same_sums() {
    let mut g = SecureRng::insecure_from_seed(59);
    let (n, d) = (70_001, 16);
    let rows = agd_data(n, d, true, &mut g);
    let plan = agd_plan(3.0, true, false);
    let w = theta(d + 1, 0.5, &mut g);
    let u = theta(d + 1, 1.0, &mut g);
    let steps = grid(2.0);
    let (gt, st) = agd::exact_sums(&plan, &rows, None, &w, &u, &steps);
    let cut = 12_347;
    let half = |a: usize, b: usize| Rows {
        d,
        labels: rows.labels[a..b].to_vec(),
        x: rows.x[a * d..b * d].to_vec(),
    };
    let (lo, hi) = (half(0, cut), half(cut, n));
    for path in [
        RowPath::Auto,
        RowPath::Avx2,
        RowPath::Portable,
        RowPath::Reference,
    ] {
        let (g1, s1, _) = agd::row_passes_with(&plan, &lo, &w, &u, &steps, path);
        let (g2, s2, _) = agd::row_passes_with(&plan, &hi, &w, &u, &steps, path);
        let (ga, sa, _) = agd::row_passes_with(&plan, &rows, &w, &u, &steps, path);
        let gsum: Vec<i128> = g1.iter().zip(&g2).map(|(x, y)| x + y).collect();
        let ssum: Vec<u128> = s1.iter().zip(&s2).map(|(x, y)| x + y).collect();
        assert_eq!(gsum, ga, "{path:?}");
        assert_eq!(ssum, sa, "{path:?}");
        if path == RowPath::Auto {
            // The fit's threaded passes: the same integers as one sequential pass.
            assert_eq!(gt, ga);
            assert_eq!(st, sa);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Round 52, review "unsafe", F1–F2: features so small that their squares round to 0 (2⁻⁵³⁸),
// with no intercept. The fits computed ‖x̃‖ = √Σxⱼ² = 0, so the clip never clipped and only the
// exact integer checks stood between one row and the sums; the AVX2 lanes accepted a row whose
// integer was i64::MIN (2⁶³ grid units), and AGD's i128 sum of squares overflowed (a panic in
// debug, an accepted row in release). The norm is now `clip::l2_norm` and every check total.

use dpfusion_udfs::mechanisms::exact::pow2;

/// 2⁻⁵³⁸: its square rounds to 0.
const TINY: f64 = 1.1113793747425387e-162;

/// `base` zero rows (label 0) and, when `attack`, one more row at position 3 (inside the first
/// block of lanes) with every feature `x` and label `label`.
fn attack_rows(d: usize, base: usize, attack: bool, x: &[f64], label: f64) -> Rows {
    let mut rows = Rows {
        d,
        labels: vec![],
        x: vec![],
    };
    for i in 0..base + usize::from(attack) {
        let hit = attack && i == 3;
        rows.labels.push(if hit { label } else { 0.0 });
        for j in 0..d {
            rows.x.push(if hit { x[j % x.len()] } else { 0.0 });
        }
    }
    rows
}

/// Σⱼ (aⱼ − bⱼ)², exactly.
fn dist2(a: &[i128], b: &[i128]) -> u128 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).unsigned_abs().pow(2))
        .sum()
}

/// `dp_linreg_gd`'s gradient sum at θ = 0 on neighbouring datasets: D has one row of tiny
/// features and a huge label, D′ lacks it (add/remove) or has a zero row in its place
/// (replace). Every path gives the reference's integers (the AVX2 lanes used to add 2⁶³ grid
/// units for the row: review F1's label makes f·x/q = −3·2⁵² exactly), and the sums differ by
/// at most ⌊clip/q⌋ in L2; for features 2⁻⁵³⁸ the row is clipped (it moves the sum by more than
/// half the bound), no longer let through unclipped or dropped.
#[test]
fn tiny_features_with_a_huge_label_move_the_gradient_within_the_clip() {
    let mut checked = 0;
    for replace in [false, true] {
        for intercept in [false, true] {
            for d in [1usize, 2, 5] {
                let k = kernel(pow2(-80), intercept, replace);
                let p = d + usize::from(intercept);
                let c = k.clipper(p).unwrap().c_int;
                let q = k.grid();
                let th = vec![0.0; p];
                // Clipped: the row's gradient norm is above the clip (with an intercept, through
                // its constant 1 alone: |r| ≫ clip; 2⁻¹⁰⁷⁴·1e150 is below the clip).
                for (x, label, clipped) in [
                    (vec![TINY], 3.0 * pow2(52) * q / TINY, true),
                    (vec![TINY], 9.590011546570728e147, true),
                    (vec![pow2(-1074)], 1e150, intercept),
                    (
                        vec![TINY, pow2(-1074), -TINY],
                        3.0 * pow2(52) * q / TINY,
                        true,
                    ),
                    (vec![1e200, TINY], 1e150, true),
                    // clip/‖x̃‖ = 2⁻⁸⁰/1e308 underflows to 0: the row adds 0.
                    (vec![1e308, TINY], 1e150, false),
                ] {
                    let with = attack_rows(d, 15, true, &x, label);
                    let without = attack_rows(d, 15 + usize::from(replace), false, &x, label);
                    let a = same_on_every_path(&k, &with, None, &th);
                    let b = same_on_every_path(&k, &without, None, &th);
                    let moved = dist2(&a, &b);
                    assert!(moved <= u128::from(c).pow(2), "{x:?} {label}: {moved}");
                    if clipped {
                        assert!(4 * moved > u128::from(c).pow(2), "{x:?} {label}: {moved}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 2 * 3 * 6);
}

/// End to end (review F1's query as a fit): one iteration, step 1, no intercept, clip 2⁻⁸⁰,
/// `replace_public_n` (public n, so the two fits divide by the same n), the same insecure seed
/// (the same noise draws) on D (15 zero rows and the attack row) and D′ (16 zero rows): the
/// coefficients differ by the attack row's clipped gradient alone, at most clip/n and more
/// than half of it.
#[test]
fn tiny_features_with_a_huge_label_move_a_fit_within_its_clipped_bound() {
    let clip = pow2(-80);
    let k = GaussianGd::new(0.9, 1, clip, 1.0, 0.0, false, true, true).unwrap();
    let label = 3.0 * pow2(52) * k.grid() / TINY;
    for d in [1usize, 2] {
        let fit = |rows: &Rows| {
            let mut rng = SecureRng::insecure_from_seed(52);
            k.fit(rows, 16, &mut rng).unwrap().unwrap()
        };
        let a = fit(&attack_rows(d, 15, true, &[TINY], label));
        let b = fit(&attack_rows(d, 16, false, &[TINY], label));
        let moved = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt();
        let bound = clip / 16.0;
        assert!(
            moved <= bound * (1.0 + 1e-9),
            "{a:?} {b:?}: {moved} > {bound}"
        );
        assert!(moved > bound / 2.0, "{a:?} {b:?}: {moved}");
    }
}

fn tiny_clip_plan(intercept: bool) -> AgdPlan {
    AgdPlan::new(AgdConfig {
        rho: 0.5,
        neighbours: Neighbours::AddRemove,
        clip_grad: 1e-180,
        clip_obj: 3.0,
        splits: 20.0,
        gamma: 0.1,
        l2: 1e-3,
        fit_intercept: intercept,
        max_step: 2.0,
        momentum: 0.0,
    })
    .unwrap()
}

/// `dp_logreg_agd` with review F2's inputs: features 2⁻⁵³⁸ (two of them made Σk² = 2¹²⁷, past
/// i128), no intercept, `clip_grad` 1e-180 (q ≈ 2⁻⁶²⁸, so f·xⱼ ≈ 2⁸⁹ saturates at i64::MIN).
/// Every path gives the reference's gradient (no panic), the selection pass's scores agree
/// between builds and stay in [0, U] per row (`ScoreGrid` and `floor_small`'s 0 ≤ y < 2⁵²
/// hold), and adding the row moves the gradient sum by at most B in L2 (by more than B/2 when
/// the row is clipped) and every score by the same-signed c ∈ [0, U].
#[test]
fn agd_tiny_features_and_a_tiny_clip_stay_within_the_bounds() {
    let mut checked = 0;
    for intercept in [false, true] {
        let plan = tiny_clip_plan(intercept);
        let b = u128::try_from(plan.grad_units).unwrap();
        let cap = u128::from(plan.obj_units);
        for d in [1usize, 2, 3] {
            let p = d + usize::from(intercept);
            for (x, clipped) in [
                (vec![TINY], true),
                (vec![TINY, -TINY], true),
                (vec![pow2(-1074)], false),
                (vec![TINY, pow2(-1074), 1e-300], true),
                (vec![1e100, TINY], true),
            ] {
                let with = attack_rows(d, 15, true, &x, 1.0);
                let without = attack_rows(d, 15, false, &x, 1.0);
                let w = vec![0.0; p];
                let u: Vec<f64> = (0..p)
                    .map(|j| if j % 2 == 0 { 1.0 } else { -1e160 })
                    .collect();
                for steps in [grid(2.0), grid(1e-150)] {
                    agd_paths(&plan, &with, &w, &u, &steps);
                    let (ga, sa) = agd::exact_sums(&plan, &with, None, &w, &u, &steps);
                    let (gb, sb) = agd::exact_sums(&plan, &without, None, &w, &u, &steps);
                    let moved = dist2(&ga, &gb);
                    assert!(moved <= b * b, "{x:?}: {moved} > {}", b * b);
                    // With an intercept the row is clipped through its constant 1.
                    if clipped || intercept {
                        assert!(4 * moved > b * b, "{x:?}: {moved}");
                    }
                    for (sa, sb) in sa.iter().zip(&sb) {
                        assert!(sa >= sb && sa - sb <= cap, "{x:?}: {sa} {sb}");
                        assert!(*sa <= cap * 16);
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 3 * 5 * 2);
    // Whole fits on both datasets, seeded: no panic, a finite model.
    for intercept in [false, true] {
        let plan = tiny_clip_plan(intercept);
        for attack in [false, true] {
            let rows = attack_rows(2, 15, attack, &[TINY], 1.0);
            let mut rng = SecureRng::insecure_from_seed(52);
            let fit = agd::fit(&plan, &rows, &mut rng);
            assert!(fit.coefficients.iter().all(|v| v.is_finite()));
            assert!(fit.intercept.is_finite());
        }
    }
}
