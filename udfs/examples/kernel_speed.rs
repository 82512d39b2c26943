//! Speed of the model kernels alone, per row pass and per fit, with the numpy baseline
//! (`scripts/model_speed.py`, needs `.venv`), without building the SQL front end: the same data,
//! parameters and numpy script as `benches/models.rs` (issue 19).
//!
//! Run: `cargo run --release -p dpfusion-udfs --example kernel_speed [-- N]` (default N = 1M).
//! Prints the `dp_linreg_gd` row pass and `dp_logreg_agd`'s gradient + selection passes per path
//! ([`RowPath`]: `Reference` is the row-at-a-time pass of before issue 19, `Portable` the blocked
//! pass for baseline x86-64, `Avx2` its AVX2 build, `Auto` the dispatched one: AVX-512 where the
//! CPU has it), the full fits, and numpy's times for the same work (default BLAS threads, then 1).
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use datafusion::scalar::ScalarValue;
use dpfusion_udfs::aggregates::{AgdParams, LinregParams};
use dpfusion_udfs::noise::SecureRng;
use dpfusion_udfs::optim::Rows;
use dpfusion_udfs::optim::agd::{self, ChargeKind};
use dpfusion_udfs::optim::kernel::{self, RowPath};

const D: usize = 16;

fn f(x: f64) -> ScalarValue {
    ScalarValue::Float64(Some(x))
}
const T: u32 = 100;

fn write_raw(path: &Path, rows: &Rows) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for v in rows.x.iter().chain(&rows.labels) {
        w.write_all(&v.to_le_bytes()).unwrap();
    }
}

fn best<F: FnMut()>(reps: usize, mut g: F) -> Duration {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            g();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    println!(
        "n = {n}, d = {D}, fit_intercept; AVX2 available: {}, AVX-512 available: {}",
        RowPath::avx2_available(),
        RowPath::avx512_available()
    );
    let dir = std::env::temp_dir().join(format!("dpfusion-kspeed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let lin = Rows::synthetic(n, D, false, 11);
    let lp = LinregParams::from_literals(&[f(1.0), f(1e-6), f(T as f64)]).unwrap();
    let gd = lp.gaussian().unwrap();
    let theta: Vec<f64> = (0..=D).map(|j| 0.1 * j as f64).collect();
    for path in [
        RowPath::Reference,
        RowPath::Portable,
        RowPath::Avx2,
        RowPath::Auto,
    ] {
        let t = best(5, || {
            std::hint::black_box(gd.gradient_sum_with(&lin, None, &theta, path).unwrap());
        });
        println!(
            "dp_linreg_gd row pass {path:?}: {:.1} ms, {:.2} ns per row (wall, all threads)",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e9 / n as f64
        );
    }
    // The data pass alone, one thread, without the per-call setup (clamping, norms, the
    // transposed copy) that the row passes above include: row by row, and with rows in lanes
    // (`kernel::transpose_blocks`; Auto and Avx2 only, where the CPU has them).
    {
        let p = D + 1;
        let clipper = gd.clipper(p).unwrap();
        let norms: Vec<f64> = lin
            .x
            .chunks_exact(D)
            .map(|r| (r.iter().map(|v| v * v).sum::<f64>() + 1.0).sqrt())
            .collect();
        let xt = kernel::transpose_blocks(&lin.x, D);
        for path in [RowPath::Portable, RowPath::Avx2, RowPath::Auto] {
            for (label, xt) in [("row by row", &[][..]), ("rows in lanes", &xt[..])] {
                if path == RowPath::Portable && !xt.is_empty() {
                    continue;
                }
                let pass = kernel::Pass {
                    d: D,
                    intercept: true,
                    x: &lin.x,
                    xt,
                    y: &lin.labels,
                    norms: &norms,
                    theta: &theta,
                    clipper: &clipper,
                };
                let t = best(5, || {
                    let mut part = vec![0i64; p];
                    std::hint::black_box(pass.add_rows(0..n, &mut part, path));
                });
                println!(
                    "dp_linreg_gd data pass {path:?}, {label} (one thread): {:.2} ns per row",
                    t.as_secs_f64() * 1e9 / n as f64
                );
            }
        }
    }
    let lin_fit = best(3, || {
        let mut rng = SecureRng::from_os_entropy();
        std::hint::black_box(gd.fit(&lin, n as u64, &mut rng).unwrap());
    });
    println!("dp_linreg_gd fit, T = {T}: {:.2} s", lin_fit.as_secs_f64());
    let lin_path = dir.join("linreg.f64");
    write_raw(&lin_path, &lin);
    let sigma_count = match gd.divisor {
        dpfusion_udfs::optim::linreg::Divisor::NoisyCount(m) => m.sigma,
        dpfusion_udfs::optim::linreg::Divisor::Public => 0.0,
    };
    drop(lin);

    let log = Rows::synthetic(n, D, true, 12);
    let plan = AgdParams::from_literals(&[f(1.0), f(1e-6)])
        .unwrap()
        .plan()
        .unwrap();
    // One gradient pass and one 21-candidate selection pass, on one thread, per implementation
    // (`Reference`: the row-at-a-time passes of before issue 19).
    let w: Vec<f64> = (0..=D).map(|j| 0.05 * j as f64 - 0.3).collect();
    let u: Vec<f64> = (0..=D)
        .map(|j| if j % 2 == 0 { 0.2 } else { -0.2 })
        .collect();
    let steps: Vec<f64> = (0..=agd::CANDIDATES)
        .map(|i| i as f64 * 2.0 / agd::CANDIDATES as f64)
        .collect();
    for path in [
        RowPath::Reference,
        RowPath::Portable,
        RowPath::Avx2,
        RowPath::Auto,
    ] {
        let t = best(3, || {
            std::hint::black_box(agd::row_passes_with(&plan, &log, &w, &u, &steps, path));
        });
        println!(
            "dp_logreg_agd gradient + selection pass (one thread) {path:?}: {:.1} ms, {:.1} ns per row",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e9 / n as f64
        );
    }
    let mut rng = SecureRng::from_os_entropy();
    let t0 = Instant::now();
    let fit = agd::fit(&plan, &log, &mut rng);
    let agd_once = t0.elapsed();
    let passes = (
        fit.charges
            .iter()
            .filter(|c| c.kind == ChargeKind::Gradient)
            .count(),
        fit.selections as usize,
    );
    println!(
        "dp_logreg_agd fit: {:.2} s ({} gradient + {} selection passes)",
        agd_once.as_secs_f64(),
        passes.0,
        passes.1
    );
    let agd_path = dir.join("agd.f64");
    write_raw(&agd_path, &log);
    drop(log);

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = root.join(".venv/bin/python");
    if !py.exists() {
        println!("numpy skipped: no .venv");
        return;
    }
    for threads in [None, Some("1")] {
        let mut cmd = std::process::Command::new(&py);
        cmd.arg(root.join("scripts/model_speed.py"))
            .arg(&lin_path)
            .args(["--n", &n.to_string(), "--d", &D.to_string()])
            .args(["--iterations", &T.to_string()])
            .args(["--clip", &gd.clip.to_string()])
            .args(["--lr", &gd.learning_rate.to_string()])
            .args(["--sigma", &gd.grad_mech.sigma.to_string()])
            .args(["--sigma-count", &sigma_count.to_string()])
            .arg("--agd-data")
            .arg(&agd_path)
            .args(["--agd-gradients", &passes.0.to_string()])
            .args(["--agd-selections", &passes.1.to_string()])
            .args(["--reps", "2"]);
        if let Some(t) = threads {
            for k in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
                cmd.env(k, t);
            }
        }
        let out = cmd.output().unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let num = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        let (m, e, a) = (
            num("linreg_matvec_s"),
            num("linreg_materialised_s"),
            num("agd_s"),
        );
        println!(
            "numpy (BLAS threads {}): linreg matvec {m:.2} s → speed-up {:.2}×; per-example {e:.2} s → {:.2}×; AGD {a:.2} s → {:.2}×",
            threads.unwrap_or("default"),
            m / lin_fit.as_secs_f64(),
            e / lin_fit.as_secs_f64(),
            a / agd_once.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
