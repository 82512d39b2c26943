//! Statistical privacy audit (issue 10): a distinguishing test on a pair of neighbouring datasets.
//!
//! Method (Ding, Wang, Wang, Zhang, Kifer, "Detecting Violations of Differential Privacy", CCS
//! 2018; Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning", NeurIPS
//! 2020): run the mechanism many times on D and on a neighbour D′; for each threshold t of a
//! fixed grid, estimate p = P[M(D) > t] and q = P[M(D′) > t]; by (ε, δ)-DP, q ≤ e^ε p + δ for
//! every t, so ε_lb(t) = ln((q_lo − δ)/p_hi) with one-sided Clopper–Pearson bounds (confidence
//! 1 − 0.05/|grid| each, Bonferroni over the grid) is a lower bound on the true ε with
//! probability ≥ 95%. The audit passes when max_t ε_lb(t) ≤ ε (the claim). To show the test has
//! power, the same audit run on a deliberately broken release (noise scale divided by 4) must
//! find ε_lb > ε.
//!
//! Each "run" is one group of a GROUP BY over G identical groups (every group holds a copy of D),
//! so G independent releases come from one query over the real UDAF; the seed is fixed
//! (`with_insecure_seed`), which makes the test reproducible.
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::AggregateUDF;
use datafusion::prelude::SessionContext;
use dpfusion_udfs::aggregates::DpMean;
use statrs::distribution::{Beta, ContinuousCDF};

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

/// One-sided Clopper–Pearson bounds for k successes in n trials at level `alpha`.
fn cp_upper(k: usize, n: usize, alpha: f64) -> f64 {
    if k == n {
        1.0
    } else {
        Beta::new(k as f64 + 1.0, (n - k) as f64)
            .unwrap()
            .inverse_cdf(1.0 - alpha)
    }
}
fn cp_lower(k: usize, n: usize, alpha: f64) -> f64 {
    if k == 0 {
        0.0
    } else {
        Beta::new(k as f64, (n - k + 1) as f64)
            .unwrap()
            .inverse_cdf(alpha)
    }
}

/// max over thresholds of ln((q_lo − δ)/p_hi), both directions (D vs D′ and D′ vs D).
fn epsilon_lower_bound(d: &[f64], d1: &[f64], delta: f64) -> f64 {
    let mut all: Vec<f64> = d.iter().chain(d1).copied().collect();
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let grid: Vec<f64> = (1..40).map(|i| all[i * all.len() / 40]).collect();
    let alpha = 0.05 / (2 * grid.len()) as f64;
    let mut best = f64::NEG_INFINITY;
    for &t in &grid {
        for (a, b) in [(d, d1), (d1, d)] {
            let p = a.iter().filter(|&&x| x > t).count();
            let q = b.iter().filter(|&&x| x > t).count();
            let p_hi = cp_upper(p, a.len(), alpha);
            let q_lo = cp_lower(q, b.len(), alpha);
            if q_lo - delta > 0.0 && p_hi > 0.0 {
                best = best.max(((q_lo - delta) / p_hi).ln());
            }
        }
    }
    best
}

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
    let lb = epsilon_lower_bound(&a, &b, delta);
    eprintln!("dp_mean audit: empirical ε lower bound {lb:.3} (claimed {eps})");
    assert!(lb <= eps, "empirical ε {lb} exceeds the claimed {eps}");
    // Power: a release whose noise were 4× too small (simulated by scaling the noise of the
    // honest release around the true means) is caught.
    let (ma, mb) = (0.0, 1.0 / 21.0);
    let weak_a: Vec<f64> = a.iter().map(|x| ma + (x - ma) / 4.0).collect();
    let weak_b: Vec<f64> = b.iter().map(|x| mb + (x - mb) / 4.0).collect();
    let lb_weak = epsilon_lower_bound(&weak_a, &weak_b, delta);
    eprintln!("broken (σ/4) release: empirical ε lower bound {lb_weak:.3}");
    assert!(lb_weak > eps, "the audit has no power: {lb_weak}");
}
