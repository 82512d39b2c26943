//! CPU time (not wall time) of one implementation of a model row pass, for measurements on a
//! loaded machine (issue 19): the thread's own on-CPU nanoseconds from
//! `/proc/thread-self/schedstat` (Linux), so that other processes' load does not count.
//! 60,000 rows (below the size at which the passes split across threads), d = 16, the data of
//! `kernel_speed`.
//!
//! Run: `cargo run --release -p dpfusion-udfs --example kernel_cpu -- WHAT PATH`, WHAT one of
//! `linfit` (a `dp_linreg_gd` fit, T = 100: ns per row and iteration), `agd` (one gradient and
//! one 21-candidate selection pass of `dp_logreg_agd`: ns per row), `agdg` (the gradient pass
//! with a single candidate); PATH one of `ref`, `port`, `avx2`, `auto` ([`RowPath`]).
use datafusion::scalar::ScalarValue;
use dpfusion_udfs::aggregates::{AgdParams, LinregParams};
use dpfusion_udfs::optim::Rows;
use dpfusion_udfs::optim::agd;
use dpfusion_udfs::optim::kernel::RowPath;

fn f(x: f64) -> ScalarValue {
    ScalarValue::Float64(Some(x))
}

/// This thread's on-CPU time in ns.
fn cpu() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let what = a.get(1).map_or("agd", String::as_str);
    let path = match a.get(2).map_or("auto", String::as_str) {
        "ref" => RowPath::Reference,
        "port" => RowPath::Portable,
        "avx2" => RowPath::Avx2,
        _ => RowPath::Auto,
    };
    let (n, d, reps) = (60_000, 16, 40);
    if what == "linfit" {
        let lin = Rows::synthetic(n, d, false, 11);
        let gd = LinregParams::from_literals(&[f(1.0), f(1e-6), f(100.0)])
            .unwrap()
            .gaussian()
            .unwrap();
        let mut rng = dpfusion_udfs::noise::SecureRng::from_os_entropy();
        let t0 = cpu();
        std::hint::black_box(gd.fit(&lin, n as u64, &mut rng).unwrap());
        let ns = (cpu() - t0) as f64 / (n * 100) as f64;
        println!("dp_linreg_gd fit (Auto): {ns:.1} ns per row and iteration (CPU)");
        return;
    }
    let log = Rows::synthetic(n, d, true, 12);
    let plan = AgdParams::from_literals(&[f(1.0), f(1e-6)])
        .unwrap()
        .plan()
        .unwrap();
    let w: Vec<f64> = (0..=d).map(|j| 0.05 * j as f64 - 0.3).collect();
    let u: Vec<f64> = (0..=d)
        .map(|j| if j % 2 == 0 { 0.2 } else { -0.2 })
        .collect();
    let steps: Vec<f64> = if what == "agdg" {
        vec![0.0]
    } else {
        (0..=agd::CANDIDATES).map(|i| i as f64 * 0.1).collect()
    };
    let t0 = cpu();
    for _ in 0..reps {
        std::hint::black_box(agd::row_passes_with(&plan, &log, &w, &u, &steps, path));
    }
    let ns = (cpu() - t0) as f64 / (n * reps) as f64;
    println!("dp_logreg_agd {what} {path:?}: {ns:.1} ns per row (CPU)");
}
