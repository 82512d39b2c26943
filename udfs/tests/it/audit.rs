//! Statistical privacy audits (issue 10): distinguishing tests on pairs of neighbouring datasets,
//! for `dp_mean`, `dp_linreg_gd` and `dp_logreg_agd`.
//!
//! Method (Ding, Wang, Wang, Zhang, Kifer, "Detecting Violations of Differential Privacy", CCS
//! 2018; Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning", NeurIPS
//! 2020): run the mechanism many times on D and on a neighbour D′ (one row added); for each
//! threshold t of a grid fixed before the runs (for `dp_mean`, the pooled quantiles of its
//! releases, [`pooled_quantile_grid`]) and each event S ∈ {M > t, M ≤ t}, estimate
//! p = P[M(D) ∈ S] and q = P[M(D′) ∈ S]; by (ε, δ)-DP, q ≤ e^ε p + δ (and the same with D and D′
//! swapped) for every event, so ε_lb = ln((q_lo − δ)/p_hi) with one-sided Clopper–Pearson bounds
//! (confidence 1 − 0.05/(4·|grid|) each, Bonferroni over the 4·|grid| tests) is a lower bound on
//! the true ε with probability ≥ 95% ([`epsilon_lower_bound`]). An audit passes when
//! max ε_lb ≤ ε (the claim). To show each audit has power, the same audit run on a deliberately
//! broken release (too little noise, the claim unchanged) must find ε_lb > ε.
//!
//! A passing audit does not prove privacy: it only fails to refute it on one pair of datasets
//! with one statistic. It catches gross errors (a missing factor in a calibration, a step that
//! leaks without being charged), which is what its power check measures.
//!
//! - `dp_mean`: each run is one group of a GROUP BY over G identical groups (every group holds a
//!   copy of D), so G independent releases come from one query over the real UDAF.
//! - `dp_linreg_gd` and `dp_logreg_agd`: each run is one call of the fit kernel that the UDAF's
//!   `evaluate` calls (`optim::linreg::GaussianGd::fit`, `optim::agd::fit`), built from the
//!   call's literal parameters by the UDAF's own parsing and calibration
//!   (`LinregParams::from_literals`, `AgdParams::from_literals`), all runs drawing from one
//!   seeded stream. (Not through the UDAF: with `with_insecure_seed`, every group's accumulator
//!   re-seeds with the same seed, so identical groups would get identical noise.)
//!
//! Seeds are fixed (`insecure_from_seed`, `with_insecure_seed`): the tests are reproducible.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::AggregateUDF;
use datafusion::prelude::SessionContext;
use dpfusion_udfs::aggregates::{AgdParams, DpMean, LinregParams};
use dpfusion_udfs::noise::SecureRng;
use dpfusion_udfs::optim::Rows;
use dpfusion_udfs::optim::agd;

/// Groups (independent releases) per dataset.
const G: usize = 40_000;

/// Releases of `sql` over G copies of `values`, one per group.
async fn releases(values: &[f64], seed: u64, sql: &str) -> Vec<f64> {
    let mut g = Vec::with_capacity(G * values.len());
    let mut x = Vec::with_capacity(G * values.len());
    for grp in 0..G as i64 {
        for v in values {
            g.push(grp);
            x.push(*v);
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(g)) as ArrayRef,
            Arc::new(Float64Array::from(x)),
        ],
    )
    .unwrap();
    let ctx = SessionContext::new();
    ctx.register_table(
        "t",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    ctx.register_udaf(AggregateUDF::from(DpMean::with_insecure_seed(seed)));
    let out = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut r = Vec::new();
    for b in out {
        let a = b.column(0).as_any().downcast_ref::<Float64Array>().unwrap();
        r.extend(a.values().iter().copied());
    }
    assert_eq!(r.len(), G);
    r
}

use dpfusion_udfs::audit::{epsilon_lower_bound, pooled_quantile_grid};

#[tokio::test]
async fn dp_mean_empirical_epsilon_stays_below_the_claim() {
    // D: 20 values at the lower bound 0; D′ = D plus one value at the upper bound 1 (add/remove).
    let eps = 1.0;
    let delta = 1e-6;
    let sql = format!("SELECT dp_mean(x, 0, 1, {eps}, {delta}) FROM t GROUP BY g");
    let d = vec![0.0; 20];
    let mut d1 = d.clone();
    d1.push(1.0);
    let a = releases(&d, 1, &sql).await;
    let b = releases(&d1, 2, &sql).await;
    let lb = epsilon_lower_bound(&a, &b, delta, &pooled_quantile_grid(&a, &b));
    eprintln!("dp_mean audit: empirical ε lower bound {lb:.3} (claimed {eps})");
    assert!(lb <= eps, "empirical ε {lb} exceeds the claimed {eps}");
    // Power: a release whose noise were 4× too small (simulated by scaling the noise of the
    // honest release around the true means) is caught.
    let (ma, mb) = (0.0, 1.0 / 21.0);
    let weak_a: Vec<f64> = a.iter().map(|x| ma + (x - ma) / 4.0).collect();
    let weak_b: Vec<f64> = b.iter().map(|x| mb + (x - mb) / 4.0).collect();
    let lb_weak = epsilon_lower_bound(
        &weak_a,
        &weak_b,
        delta,
        &pooled_quantile_grid(&weak_a, &weak_b),
    );
    eprintln!("broken (σ/4) release: empirical ε lower bound {lb_weak:.3}");
    assert!(lb_weak > eps, "the audit has no power: {lb_weak}");
}

/// A Float64 literal parameter.
fn lit(x: f64) -> ScalarValue {
    ScalarValue::Float64(Some(x))
}

/// One-feature rows (x, y).
fn rows(data: &[(f64, f64)]) -> Rows {
    Rows {
        d: 1,
        labels: data.iter().map(|r| r.1).collect(),
        x: data.iter().map(|r| r.0).collect(),
    }
}

/// `dp_linreg_gd` audit: fits per dataset (2 × 40 000 fits per mechanism audited, ≈ 6.5 s in
/// the unoptimised test profile).
const LINREG_RUNS: usize = 40_000;
/// Rows of D (all (x, y) = (0, 0)).
const LINREG_N: usize = 100;

/// ε_lb of `dp_linreg_gd(y, [x], eps_mech, 1e-6, iterations => 2, clip => 0.5,
/// learning_rate => 1, l2 => 0, fit_intercept => false)` ('gaussian', add/remove neighbours) on
/// D = 100 rows (0, 0) and D′ = D + (1, 1000), against the claim δ = 1e-6.
///
/// Why this pair: the rows of D have zero gradient ((θ·0 − 0)·0), so D's fit is pure noise; the
/// added row's residual θ − 1000 stays ≈ −1000, so its gradient is clipped to exactly −clip at
/// both iterations: the sums differ by the full sensitivity, on the one coefficient released.
/// With T = 2 the output is θ₂ (the tail average starts at T/2 + 1 = 2), and
/// θ₂ = −η(S̃₁ + S̃₂)/ñ carries both gradient releases, so the statistic sees the composition
/// of both and of the noisy count ñ (linreg.rs module docs, steps 2–3). The threshold grid is
/// fixed from public quantities: σ_θ = √2·σ_g/n, the std of θ₂ on D when ñ = n, and
/// t = k·σ_θ/4, k = −16..=16.
fn linreg_epsilon_lb(eps_mech: f64) -> f64 {
    let p = LinregParams::from_literals(&[
        lit(eps_mech),
        lit(1e-6),
        lit(2.0),
        lit(0.5),
        lit(1.0),
        lit(0.0),
        ScalarValue::Boolean(Some(false)),
    ])
    .unwrap();
    let kernel = p.gaussian().unwrap();
    let d = rows(&[(0.0, 0.0); LINREG_N]);
    let mut d1 = d.clone();
    d1.x.push(1.0);
    d1.labels.push(1000.0);
    let mut rng = SecureRng::insecure_from_seed(10);
    let mut run = |data: &Rows| -> Vec<f64> {
        (0..LINREG_RUNS)
            .map(|_| {
                kernel
                    .fit(data, data.n() as u64, &mut rng)
                    .unwrap()
                    .unwrap()[0]
            })
            .collect()
    };
    let a = run(&d);
    let b = run(&d1);
    let sigma_theta = 2f64.sqrt() * kernel.grad_mech.sigma / LINREG_N as f64;
    let grid: Vec<f64> = (-16..=16).map(|k| k as f64 * sigma_theta / 4.0).collect();
    epsilon_lower_bound(&a, &b, 1e-6, &grid)
}

#[test]
fn dp_linreg_gd_empirical_epsilon_stays_below_the_claim() {
    // 2 × 40 000 fits per mechanism; ε_lb is a 95% lower confidence bound (Bonferroni over the
    // 4 × 33 events). Measured at seed 10: 0.33 for the real mechanism.
    let eps = 1.0;
    let lb = linreg_epsilon_lb(eps);
    eprintln!("dp_linreg_gd audit: empirical ε lower bound {lb:.3} (claimed {eps})");
    assert!(lb <= eps, "empirical ε {lb} exceeds the claimed {eps}");
    // Power: the mechanism calibrated for ε = 5 (gradient noise σ_g 3.06 → 0.71, count noise
    // 18.9 → 4.4: 4.3× smaller) while the claim stays ε = 1 is caught. Measured at seed 10:
    // 2.28. (Calibrated for ε = 3 it gives 1.47.)
    let lb_weak = linreg_epsilon_lb(5.0);
    eprintln!("broken (calibrated for ε = 5) fit: empirical ε lower bound {lb_weak:.3}");
    assert!(lb_weak > eps, "the audit has no power: {lb_weak}");
}

/// `dp_logreg_agd` audit: fits per dataset (2 × 100 000 fits per mechanism audited, ≈ 6.5 s in
/// the unoptimised test profile).
const AGD_RUNS: usize = 100_000;

/// ε_lb of `dp_logreg_agd(y, [x], eps_mech, 1e-6, clip_grad => 3, clip_obj => 3, splits => 2,
/// gamma => 0.1, l2 => 1e-3, fit_intercept => false)` (add/remove neighbours) on
/// D = five rows with x = 0 (labels 0, 1, 0, 1, 1) and D′ = D + (x = 10, y = 1), against the
/// claim δ = 1e-6.
///
/// Why this pair: rows with x = 0 have zero gradient and the same loss ln 2 at every candidate
/// step, so on D both the noisy gradient and the scores carry no signal. The added row's
/// gradient at w = 0 is (σ(0) − 1)·10 = −5, clipped to the full C_grad = 3; its clipped loss
/// spans 0.69 → 3 = C_obj over the wrong-direction candidates, so it also moves the step
/// selection. `splits => 2` (ρ_ng = ρ_nm = ρ/4, agd.rs "Budget split") keeps the signal in one
/// step while still running every mechanism of the fit: the gradient release, the exponential
/// mechanism, and after a rejected step (k* = 0) the GRADAVG draw, under the privacy filter.
/// The released coefficient is then ±α_k with α_k = k·max_step/20 = k/10 (agd.rs step 3), so
/// the fixed grid is the midpoints t = (k + ½)/10, k = −21..=20.
fn agd_epsilon_lb(eps_mech: f64) -> f64 {
    let p = AgdParams::from_literals(&[
        lit(eps_mech),
        lit(1e-6),
        lit(3.0),
        lit(3.0),
        lit(2.0),
        lit(0.1),
        lit(1e-3),
        ScalarValue::Boolean(Some(false)),
    ])
    .unwrap();
    let plan = p.plan().unwrap();
    let d = rows(&[(0.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.0, 1.0), (0.0, 1.0)]);
    let mut d1 = d.clone();
    d1.x.push(10.0);
    d1.labels.push(1.0);
    let mut rng = SecureRng::insecure_from_seed(20);
    let mut run = |data: &Rows| -> Vec<f64> {
        (0..AGD_RUNS)
            .map(|_| agd::fit(&plan, data, &mut rng).coefficients[0])
            .collect()
    };
    let a = run(&d);
    let b = run(&d1);
    let grid: Vec<f64> = (-21..=20).map(|k| (k as f64 + 0.5) / 10.0).collect();
    epsilon_lower_bound(&a, &b, 1e-6, &grid)
}

#[test]
fn dp_logreg_agd_empirical_epsilon_stays_below_the_claim() {
    // 2 × 100 000 fits per mechanism; ε_lb is a 95% lower confidence bound (Bonferroni over the
    // 4 × 42 events). Measured at seed 20: 0.07 for the real mechanism. It is far below ε:
    // one step of the fit spends about half of ρ (the second step never fits the privacy
    // filter), and a single ±α_k carries little of even that.
    let eps = 1.0;
    let lb = agd_epsilon_lb(eps);
    eprintln!("dp_logreg_agd audit: empirical ε lower bound {lb:.3} (claimed {eps})");
    assert!(lb <= eps, "empirical ε {lb} exceeds the claimed {eps}");
    // Power: the fit calibrated for ε = 20 (ρ 0.024 → 4.79; gradient noise s/B 9.1 → 0.65 and
    // selection temperature T/U 4.5 → 0.32: 14× smaller) while the claim stays ε = 1 is caught.
    // Measured at seed 20: 2.48. (Calibrated for ε = 10 it gives 1.09, for ε = 5 0.49: this
    // audit catches only gross errors.)
    let lb_weak = agd_epsilon_lb(20.0);
    eprintln!("broken (calibrated for ε = 20) fit: empirical ε lower bound {lb_weak:.3}");
    assert!(lb_weak > eps, "the audit has no power: {lb_weak}");
}
