//! `dp_logreg_agd` at the extremes of `clip_grad` and `clip_obj` (round 52, review "extremes",
//! F1, F2): clips whose grids left the normal range are refused by the plan, before any row or
//! charge; at the smallest accepted clips the row passes agree on every build and keep the
//! one-row bounds on the reviewer's neighbouring data sets.

use dpfusion_udfs::aggregates::Neighbours;
use dpfusion_udfs::noise::SecureRng;
use dpfusion_udfs::optim::Rows;
use dpfusion_udfs::optim::agd::{self, AgdConfig, AgdPlan, CLIP_MIN};
use dpfusion_udfs::optim::kernel::RowPath;

fn config(clip_grad: f64, clip_obj: f64) -> AgdConfig {
    AgdConfig {
        rho: 0.01,
        neighbours: Neighbours::AddRemove,
        clip_grad,
        clip_obj,
        splits: 20.0,
        gamma: 0.1,
        l2: 1e-3,
        fit_intercept: true,
        max_step: 2.0,
        momentum: 0.0,
    }
}

/// The review's D (n = 2729) and D′ (n = 2728): y = i mod 2, x = (i mod 7)/7.
fn reviewers_rows(n: usize) -> Rows {
    Rows {
        d: 1,
        labels: (0..n).map(|i| (i % 2) as f64).collect(),
        x: (0..n).map(|i| (i % 7) as f64 / 7.0).collect(),
    }
}

/// F1: `clip_grad` 1e-310 and 5e-324 made planning loop forever (the grid was 0, doubled); F2:
/// `clip_obj` 1e-320 made a plan with q_o = 0 and U = 2⁶⁴ − 1. All are errors of the plan
/// (`AgdPlan::with_budgets` too), naming the argument.
#[test]
fn agd_clips_below_the_grid_range_are_refused_by_the_plan() {
    for (grad, obj, name) in [
        (1e-310, 3.0, "'clip_grad'"),
        (5e-324, 3.0, "'clip_grad'"),
        (3.0, 1e-320, "'clip_obj'"),
        (3.0, 5e-324, "'clip_obj'"),
    ] {
        let c = config(grad, obj);
        let e = AgdPlan::new(c).unwrap_err().to_string();
        assert!(e.contains(name), "{e}");
        let e = AgdPlan::with_budgets(c, 1e-4, 1e-4)
            .unwrap_err()
            .to_string();
        assert!(e.contains(name), "{e}");
    }
}

/// F2 at the smallest accepted clips: on D and D′ the blocked passes (every build) give the
/// reference's gradient and scores within one unit per row and candidate, every row adds at
/// most U to a score (D's scores exceed D′'s by c ∈ [0, U]: the lane sums did not wrap), and
/// whole seeded fits on both return finite models.
#[test]
fn agd_smallest_clips_keep_the_bounds_on_the_reviewers_neighbours() {
    for (grad, obj) in [(3.0, CLIP_MIN), (CLIP_MIN, 3.0), (CLIP_MIN, CLIP_MIN)] {
        let plan = AgdPlan::new(config(grad, obj)).unwrap();
        let cap = u128::from(plan.obj_units);
        let (d, d_prime) = (reviewers_rows(2729), reviewers_rows(2728));
        let steps: Vec<f64> = (0..=agd::CANDIDATES)
            .map(|i| i as f64 * 2.0 / agd::CANDIDATES as f64)
            .collect();
        for (w, u) in [([0.0, 0.0], [1.0, -1.0]), ([0.3, -2.0], [-0.5, 0.5])] {
            let mut sums = Vec::new();
            for rows in [&d, &d_prime] {
                let n = rows.labels.len() as u128;
                let (gr, sr, _) =
                    agd::row_passes_with(&plan, rows, &w, &u, &steps, RowPath::Reference);
                for path in [RowPath::Portable, RowPath::Auto, RowPath::Avx2] {
                    let (g, s, _) = agd::row_passes_with(&plan, rows, &w, &u, &steps, path);
                    assert_eq!(g, gr, "{path:?}");
                    for (a, r) in s.iter().zip(&sr) {
                        assert!(a.abs_diff(*r) <= n, "{path:?}: {a} {r}");
                        assert!(*a <= n * cap, "{path:?}: {a} > {n}·{cap}");
                    }
                }
                sums.push(agd::exact_sums(&plan, rows, None, &w, &u, &steps));
            }
            for (a, b) in sums[0].1.iter().zip(&sums[1].1) {
                assert!(a >= b && a - b <= cap, "{a} {b} (U = {cap})");
            }
        }
        for rows in [&d, &d_prime] {
            let mut rng = SecureRng::insecure_from_seed(52);
            let fit = agd::fit(&plan, rows, &mut rng);
            assert!(fit.coefficients.iter().all(|v| v.is_finite()));
            assert!(fit.intercept.is_finite());
        }
    }
}
