//! Exactness of the blocked, runtime-dispatched row pass of `dp_linreg_gd` (issue 19,
//! `udfs/src/optim/kernel.rs`): on random data, the exact integer gradient sums are the same on
//! every path — the AVX2 build chosen at run time (`Auto`), the baseline x86-64 build that is the
//! dispatch fallback (`Portable`, forced), and the row-at-a-time reference (`Reference`) — with
//! and without privacy units, for many shapes, at parameters that send rows through the fast
//! path's fallback (huge residuals, ±1e150 values, non-finite norms), and for any split of the
//! rows (the sum over two halves equals the sum over all).
//!
//! Run: `cargo nextest run -p dpfusion-udfs --release --test kernels` (all seeded).
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
    for path in [RowPath::Auto, RowPath::Portable, RowPath::Reference] {
        let a = k.gradient_sum_with(&lo, None, &th, path).unwrap();
        let b = k.gradient_sum_with(&hi, None, &th, path).unwrap();
        let sum: Vec<i128> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(sum, all, "{path:?}");
    }
}
