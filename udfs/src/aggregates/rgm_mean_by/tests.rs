//! Unit tests of `rgm_mean_by`: parameters and cost, exact mergeable state, the contract, and the
//! statistics of the release (seeded, through the accumulator).
use std::time::Instant;

use datafusion::arrow::array::{Int64Array, StringArray};

use super::*;
use crate::aggregates::DEFAULT_DELTA;
use crate::mechanisms::rgm::{MAX_SIGMA, rgm_epsilon};

fn f(v: f64) -> ScalarValue {
    ScalarValue::Float64(Some(v))
}
fn s(v: &str) -> ScalarValue {
    ScalarValue::Utf8(Some(v.to_string()))
}
const PUBLIC_N: &str = "replace_public_n";

fn params(k: f64, eps: f64, delta: f64, m: f64) -> RgmMeanParams {
    RgmMeanParams::from_literals(&[f(k), f(eps), f(delta), f(m), s(PUBLIC_N)]).unwrap()
}

fn accumulator(p: RgmMeanParams, seed: Option<u64>) -> RgmAccumulator {
    let calibration = p.calibration().unwrap();
    RgmAccumulator::new(
        Arc::new(RgmRelease {
            params: p,
            calibration,
        }),
        DataType::Utf8,
        seed,
    )
}

fn batch(rows: &[(Option<&str>, Option<f64>)]) -> Vec<ArrayRef> {
    vec![
        Arc::new(Float64Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        )),
    ]
}

/// (group, mean, n) of a result.
fn rows_of(v: &ScalarValue) -> Vec<(String, f64, i64)> {
    let ScalarValue::List(l) = v else {
        panic!("not a list: {v:?}")
    };
    assert_eq!(l.len(), 1);
    let item = l.value(0);
    let st = item.as_struct();
    let g = st.column(0).as_string::<i32>();
    let m = st.column(1).as_primitive::<Float64Type>();
    let n = st.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
    (0..st.len())
        .map(|i| (g.value(i).to_string(), m.value(i), n.value(i)))
        .collect()
}

// ---------------------------------------------------------------- parameters and cost

#[test]
fn parameters_defaults_and_errors() {
    let p = RgmMeanParams::from_literals(&[f(1.5), f(1.0)]).unwrap();
    assert_eq!(
        (
            p.max_ratio,
            p.epsilon,
            p.delta,
            p.min_group_size,
            p.neighbours
        ),
        (1.5, 1.0, DEFAULT_DELTA, 2, Neighbours::AddRemove)
    );
    let p = RgmMeanParams::from_literals(&[
        ScalarValue::Int64(Some(2)),
        f(0.5),
        f(1e-6),
        ScalarValue::Int64(Some(500)),
        s(PUBLIC_N),
    ])
    .unwrap();
    assert_eq!((p.max_ratio, p.min_group_size), (2.0, 500));
    let err = |args: &[ScalarValue]| RgmMeanParams::from_literals(args).unwrap_err().to_string();
    assert!(err(&[f(0.9), f(1.0)]).contains("'max_ratio': got 0.9, expected a finite number >= 1"));
    assert!(err(&[f(f64::INFINITY), f(1.0)]).contains("'max_ratio'"));
    assert!(err(&[f(1.5), f(0.0)]).contains("'epsilon'"));
    assert!(err(&[f(1.5), f(1.0), f(1.0)]).contains("'delta'"));
    for m in [1.0, 2.5, -3.0, f64::NAN] {
        assert!(
            err(&[f(1.5), f(1.0), f(1e-6), f(m)]).contains("'min_group_size'"),
            "{m}"
        );
    }
    assert!(err(&[f(1.5), f(1.0), f(1e-6), f(2.0), s("bogus")]).contains("'neighbours'"));
    assert!(err(&[f(1.5), f(1.0), f(1e-6), f(2.0), s(PUBLIC_N), f(1.0)]).contains("at most 5"));
    assert!(err(&[s("1.5"), f(1.0)]).contains("'max_ratio'"));
    assert!(err(&[]).contains("'max_ratio': got nothing"));
}

#[test]
fn only_public_group_sizes_are_accepted() {
    for nb in ["add_remove", "replace"] {
        let p = RgmMeanParams::from_literals(&[f(1.5), f(1.0), f(1e-6), f(500.0), s(nb)]).unwrap();
        let e = p.cost().unwrap_err().to_string();
        assert!(
            e.contains("'neighbours'") && e.contains("public group sizes"),
            "{e}"
        );
    }
}

#[test]
fn cost_is_one_rgm_event_for_the_worst_group() {
    let p = params(1.5, 1.0, 1e-6, 500.0);
    let ev = p.cost().unwrap();
    let Event::Rgm {
        sigma,
        gamma,
        dims,
        steps,
    } = ev[0]
    else {
        panic!("{ev:?}")
    };
    assert_eq!((dims, steps, ev.len()), (1, 1, 1));
    assert_eq!(gamma, accounted_gamma(1.5, 500));
    // γ = 1.25/749.5 (docs/research/rgm.md §7(a)), plus the slack 2^−24(1 + γ)
    assert!((gamma / (1.25 / 749.5) - 1.0).abs() < 1e-4);
    // The call is (1, 1e-6)-DP by the accountant's conversion, and tightly so.
    let e = rgm_epsilon(sigma, gamma, 1, 1, 1e-6);
    assert!(e <= 1.0 && e > 1.0 - 1e-6, "{e}");
    assert!((sigma - 4.6958).abs() < 1e-3, "σ = {sigma}");
}

#[test]
fn infeasible_target_names_floor_and_group_size() {
    // K = 1.5 with groups of 2: γ ≈ 0.5, far too large.
    let e = params_err(1.5, 1.0, 1e-6, 2.0);
    assert!(e.contains("epsilon floor (as noise → ∞) is"), "{e}");
    let n = smallest_feasible_group_size(1.5, 1.0, 1e-6, 2).unwrap();
    assert!(
        e.contains(&format!(
            "the smallest min_group_size that reaches it is {n}"
        )),
        "{e}"
    );
    // and that size works, one less does not
    assert!(params(1.5, 1.0, 1e-6, n as f64).cost().is_ok());
    assert!(
        rgm_epsilon(MAX_SIGMA, accounted_gamma(1.5, n - 1), 1, 1, 1e-6) > 1.0,
        "n − 1 would be feasible"
    );
    eprintln!("{e}");
}

fn params_err(k: f64, eps: f64, delta: f64, m: f64) -> String {
    RgmMeanParams::from_literals(&[f(k), f(eps), f(delta), f(m), s(PUBLIC_N)])
        .unwrap()
        .cost()
        .unwrap_err()
        .to_string()
}

#[test]
fn udaf_is_registered_with_docs() {
    let all = crate::aggregates::all_udafs();
    let u = all.iter().find(|u| u.name() == "rgm_mean_by").unwrap();
    let doc = u.documentation().unwrap();
    assert!(doc.description.contains("relative Gaussian mechanism"));
    assert_eq!(
        crate::aggregates::dp_aggregate_data_args("rgm_mean_by"),
        Some(2)
    );
    let c = crate::aggregates::dp_call_cost(
        "rgm_mean_by",
        &[f(1.5), f(1.0), f(1e-6), f(500.0), s(PUBLIC_N)],
    );
    assert!(matches!(c, Some(Ok(ref v)) if v.len() == 1));
    assert_ne!(RgmMeanBy::new(), RgmMeanBy::with_insecure_seed(1));
    let by = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let t = RgmMeanBy::new()
        .coerce_types(&[DataType::Int32, by, DataType::Float64, DataType::Int64])
        .unwrap();
    assert_eq!(t[..2], [DataType::Float64, DataType::Utf8]);
    assert!(
        RgmMeanBy::new()
            .coerce_types(&[
                DataType::Utf8,
                DataType::Utf8,
                DataType::Float64,
                DataType::Float64
            ])
            .is_err()
    );
}

// ---------------------------------------------------------------- state

#[test]
fn groups_are_exact_sorted_and_mergeable() {
    let p = params(2.0, 100.0, 1e-6, 3.0); // tiny groups need a large ε
    let rows: Vec<(Option<&str>, Option<f64>)> = vec![
        (Some("b"), Some(10.0)),
        (Some("a"), Some(1.0)),
        (Some("b"), Some(20.0)),
        (None, Some(-7.0)), // NULL group: skipped (and not checked)
        (Some("a"), Some(1.5)),
        (Some("c"), Some(100.0)), // 2 rows < min_group_size 3: left out
        (Some("b"), Some(15.0)),
        (Some("a"), Some(2.0)),
        (Some("c"), Some(150.0)),
    ];
    let mut single = accumulator(p, Some(1));
    single.update_batch(&batch(&rows)).unwrap();
    // Three partitions, merged in another order.
    let mut fin = accumulator(p, Some(1));
    let mut states = vec![];
    for part in [&rows[..2], &rows[2..6], &rows[6..]] {
        let mut a = accumulator(p, None);
        a.update_batch(&batch(part)).unwrap();
        states.push(a.state().unwrap());
    }
    states.reverse();
    for st in &states {
        let arr = st[0].to_array().unwrap();
        fin.merge_batch(&[arr]).unwrap();
    }
    for (k, g) in &single.groups {
        let h = &fin.groups[k];
        assert_eq!(
            (g.rows, g.min, g.max, g.violated),
            (h.rows, h.min, h.max, h.violated)
        );
        assert_eq!(g.sum.to_bytes(), h.sum.to_bytes(), "{k}");
    }
    assert_eq!(single.groups.len(), 3);
    let a = rows_of(&single.evaluate().unwrap());
    let b = rows_of(&fin.evaluate().unwrap());
    assert_eq!(a, b, "same seed, same exact state: same release");
    assert_eq!(
        a.iter().map(|r| (r.0.as_str(), r.2)).collect::<Vec<_>>(),
        [("a", 3), ("b", 3)]
    );
    // σ·γ for groups of 3 with K = 2 at ε = 100.
    let sd = p.calibration().unwrap().sigma * noise_gamma(2.0, 3);
    assert!((a[0].1 / 1.5 - 1.0).abs() < 8.0 * sd, "{a:?} {sd}");
    assert!((a[1].1 / 15.0 - 1.0).abs() < 8.0 * sd, "{a:?}");
    // Empty input: an empty list, not NULL.
    let mut empty = accumulator(p, Some(2));
    assert!(rows_of(&empty.evaluate().unwrap()).is_empty());
    assert_eq!(
        empty.evaluate().unwrap().data_type(),
        result_type(&DataType::Utf8)
    );
}

#[test]
fn contract_violations_fail_without_naming_anything() {
    let p = params(1.5, 100.0, 1e-6, 2.0);
    let bad_sets: Vec<Vec<(Option<&str>, Option<f64>)>> = vec![
        vec![(Some("secret"), Some(1.0)), (Some("secret"), Some(1.6))], // ratio 1.6 > 1.5
        vec![(Some("secret"), Some(1.0)), (Some("secret"), None)],      // NULL value
        vec![
            (Some("secret"), Some(1.0)),
            (Some("secret"), Some(f64::NAN)),
        ],
        vec![(Some("secret"), Some(1.0)), (Some("secret"), Some(0.0))],
        vec![(Some("secret"), Some(-1.0)), (Some("secret"), Some(-1.2))],
        vec![
            (Some("secret"), Some(f64::INFINITY)),
            (Some("secret"), Some(f64::INFINITY)),
        ],
        // a group too small to be released is still checked
        vec![
            (Some("ok"), Some(1.0)),
            (Some("ok"), Some(1.1)),
            (Some("tiny"), Some(-5.0)),
        ],
    ];
    for rows in bad_sets {
        let mut a = accumulator(p, Some(3));
        a.update_batch(&batch(&rows)).unwrap();
        let e = a.evaluate().unwrap_err();
        assert!(matches!(e, DataFusionError::Execution(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("declared contract") && msg.contains("nothing was released"));
        for leak in ["secret", "tiny", "1.6", "-1", "NaN", "inf"] {
            assert!(!msg.contains(leak), "{msg} names {leak}");
        }
    }
    // Exactly at the ratio is fine.
    let mut a = accumulator(p, Some(4));
    a.update_batch(&batch(&[(Some("x"), Some(2.0)), (Some("x"), Some(3.0))]))
        .unwrap();
    assert_eq!(rows_of(&a.evaluate().unwrap()).len(), 1);
}

// ---------------------------------------------------------------- statistics

/// Evaluations: the sample variance of N normal draws has relative sd √(2/(N−1)); 5 of them at
/// N = 6000 is 0.091 < 0.095, so a σ 10% off (variance ×1.21 or ×0.81) is always detected.
const DRAWS: usize = 6000;

#[test]
fn each_group_has_relative_std_sigma_gamma() {
    let start = Instant::now();
    // Three groups of very different scales and sizes; min_group_size 50.
    let p = params(1.5, 1.0, 1e-6, 50.0);
    let sigma = p.calibration().unwrap().sigma;
    let mut rows: Vec<(Option<&str>, Option<f64>)> = vec![];
    let groups = [
        ("cashier", 24_000.0, 60usize),
        ("nurse", 58_000.0, 200),
        ("surgeon", 240_000.0, 1000),
    ];
    for (name, base, n) in groups {
        for i in 0..n {
            // within a factor 1.5: base·[1, 1.5)
            rows.push((Some(name), Some(base * (1.0 + 0.5 * (i as f64 / n as f64)))));
        }
    }
    let mut acc = accumulator(p, Some(42));
    acc.update_batch(&batch(&rows)).unwrap();
    let truth: Vec<f64> = groups
        .iter()
        .map(|(name, _, _)| {
            let v: Vec<f64> = rows
                .iter()
                .filter(|r| r.0 == Some(*name))
                .filter_map(|r| r.1)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        })
        .collect();
    let mut rel: Vec<Vec<f64>> = vec![vec![]; 3];
    for _ in 0..DRAWS {
        let out = rows_of(&acc.evaluate().unwrap());
        assert_eq!(out.len(), 3);
        for (g, (name, m, n)) in out.iter().enumerate() {
            assert_eq!((name.as_str(), *n as usize), (groups[g].0, groups[g].2));
            rel[g].push(m / truth[g] - 1.0);
        }
    }
    for (g, (name, _, n)) in groups.iter().enumerate() {
        let want = sigma * noise_gamma(1.5, *n as u64); // relative std σ·γ_g
        let xs = &rel[g];
        let k = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / k;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0);
        let r = var / (want * want);
        let tol = 5.0 * (2.0 / (k - 1.0)).sqrt();
        assert!(tol < 0.095);
        assert!(
            (r - 1.0).abs() <= tol,
            "{name}: variance ratio {r} outside 1 ± {tol}"
        );
        assert!(
            (r / 1.21 - 1.0).abs() > tol && (r / 0.81 - 1.0).abs() > tol,
            "{name}: 10%"
        );
        assert!(mean.abs() <= 5.0 * want / k.sqrt(), "{name}: bias {mean}");
        eprintln!(
            "{name} (n = {n}): relative std {:.5} vs σγ = {want:.5} (ratio of variances {r:.4})",
            var.sqrt()
        );
    }
    // The fairness point: relative errors differ by group size only, not by pay scale.
    eprintln!("rgm statistics: {:?}", start.elapsed());
}
