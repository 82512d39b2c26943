//! DP-AGD (`dp_logreg_agd`'s kernel) on the paper's datasets BANK and IPUMS-BR, against the
//! corrected reference `dpagd_port.py` (mode `fixed`; docs/research/dpagd.md §3.2).
//!
//! ```text
//! cargo run --release -p dpfusion-udfs --example agd_benchmark -- [DATA_DIR] [options]
//! ```
//! DATA_DIR defaults to `data` and must hold `BANK.dat` and `IPUMS-BR.dat`
//! (whitespace-separated, label last; the files are not in this repository). Options:
//! - `--eps 0.1,0.4,1.6` (default; `--eps all` for the paper's grid 0.05 … 1.6);
//! - `--runs R` runs per fold (default 2) and `--folds F` (default 5): R·F fits per cell;
//! - `--splits S` (default: the SQL default, a function of ε and δ: `agd::default_splits`),
//!   `--split paper` for the paper's budget split (ε_nm = ε/(2·60), ρ_nm = ε_nm²/2,
//!   ρ_ng = ε_nm²/(4 ln(1.25/δ))) instead of ours;
//! - `--splits-scale K`: splits = clamp(K·√ρ) instead of the default constant (tuning);
//! - `--momentum B`: β_max of the heavy ball (default: the SQL default; 0 turns it off);
//! - `--validate`: tuning mode. The test folds are never read: each training fold is split
//!   again 80/20 (a fixed shuffle), the fit sees the 80% and is scored on the 20%;
//! - `--datasets BANK,IPUMS-BR`.
//!
//! Every parameter not given is the SQL function's default (`AgdParams::from_literals` with
//! only ε and δ), so the default run measures exactly what `dp_logreg_agd(y, x, ε, 1e-8)` fits.
//! Reported per cell: test accuracy and AUC (mean ± sd over the fits), accepted steps.
//!
//! Protocol of docs/research/dpagd.md §3.2: min-max scaling to [0, 1] on the full file (as the
//! authors do; not private, and outside what the SQL function does), a bias column
//! (`fit_intercept`), δ = 1e-8, C_grad = C_obj = 3, γ = 0.1, l2 = 1e-3, max_step = 2,
//! k-fold cross-validation with shuffling; accuracy on the test fold, objective = unclipped mean
//! logistic loss on the training fold. Noise comes from `SecureRng::insecure_from_seed` so that
//! every number is reproducible (never do this with real data).
use std::collections::BTreeMap;
use std::time::Instant;

use datafusion::common::ScalarValue;
use dpfusion_udfs::aggregates::dp_logreg_agd::AgdParams;
use dpfusion_udfs::noise::SecureRng;
use dpfusion_udfs::optim::Rows;
use dpfusion_udfs::optim::agd::{AgdPlan, SPLITS_MAX, SPLITS_MIN, fit};
use dpfusion_udfs::privacy::zcdp_rho;

/// docs/research/dpagd.md §3.2, "fixed" accuracy rows (ε = 0.05, 0.1, 0.2, 0.4, 0.8, 1.6).
const REFERENCE: [(&str, [f64; 6]); 2] = [
    ("BANK", [80.74, 85.08, 84.45, 87.61, 89.03, 89.34]),
    ("IPUMS-BR", [62.34, 67.51, 70.22, 73.79, 75.31, 76.19]),
];
const EPS_GRID: [f64; 6] = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6];
const DELTA: f64 = 1e-8;

struct SplitMix64(u64);
impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn load(path: &std::path::Path) -> Result<Rows, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rows = Rows::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Vec<f64> = line
            .split_whitespace()
            .map(|t| t.parse::<f64>().map_err(|e| format!("{t}: {e}")))
            .collect::<Result<_, _>>()?;
        let (label, x) = v.split_last().ok_or("empty line")?;
        if rows.d == 0 {
            rows.d = x.len();
        }
        if x.len() != rows.d {
            return Err("ragged file".into());
        }
        rows.labels.push(if *label > 0.5 { 1.0 } else { 0.0 });
        rows.x.extend_from_slice(x);
    }
    // Min-max scaling to [0, 1] on the full file (the authors' protocol).
    let (n, d) = (rows.n(), rows.d);
    for j in 0..d {
        let col = (0..n).map(|i| rows.x[i * d + j]);
        let lo = col.clone().fold(f64::INFINITY, f64::min);
        let hi = col.fold(f64::NEG_INFINITY, f64::max);
        for i in 0..n {
            let v = &mut rows.x[i * d + j];
            *v = if hi > lo { (*v - lo) / (hi - lo) } else { 0.0 };
        }
    }
    Ok(rows)
}

fn subset(rows: &Rows, idx: &[usize]) -> Rows {
    let mut out = Rows {
        d: rows.d,
        ..Rows::default()
    };
    for &i in idx {
        out.labels.push(rows.labels[i]);
        out.x.extend_from_slice(rows.row(i));
    }
    out
}

fn z(w0: f64, w: &[f64], x: &[f64]) -> f64 {
    w0 + w.iter().zip(x).map(|(a, b)| a * b).sum::<f64>()
}

/// Accuracy in %: positive when z ≥ 0 (the authors' rule).
fn accuracy(w0: f64, w: &[f64], rows: &Rows) -> f64 {
    let ok = (0..rows.n())
        .filter(|&i| (z(w0, w, rows.row(i)) >= 0.0) == (rows.labels[i] > 0.5))
        .count();
    100.0 * ok as f64 / rows.n() as f64
}

/// Area under the ROC curve of the scores z = w·x̃ (Mann–Whitney U with midranks for ties).
fn auc(w0: f64, w: &[f64], rows: &Rows) -> f64 {
    let mut s: Vec<(f64, bool)> = (0..rows.n())
        .map(|i| (z(w0, w, rows.row(i)), rows.labels[i] > 0.5))
        .collect();
    s.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rank_sum, mut npos) = (0.0, 0.0);
    let mut i = 0;
    while i < s.len() {
        let mut j = i;
        while j < s.len() && s[j].0 == s[i].0 {
            j += 1;
        }
        let mid = (i + j + 1) as f64 / 2.0; // ranks i+1..=j
        for e in &s[i..j] {
            if e.1 {
                rank_sum += mid;
                npos += 1.0;
            }
        }
        i = j;
    }
    let nneg = s.len() as f64 - npos;
    (rank_sum - npos * (npos + 1.0) / 2.0) / (npos * nneg)
}

/// Mean unclipped logistic loss.
fn objective(w0: f64, w: &[f64], rows: &Rows) -> f64 {
    let s: f64 = (0..rows.n())
        .map(|i| {
            let t = z(w0, w, rows.row(i));
            let sp = t.max(0.0) + (-t.abs()).exp().ln_1p();
            sp - rows.labels[i] * t
        })
        .sum();
    s / rows.n() as f64
}

/// Non-private logistic regression by Newton's method (IRLS) with a tiny ridge for stability.
fn newton(rows: &Rows) -> (f64, Vec<f64>) {
    let p = rows.d + 1;
    let mut w = vec![0.0; p];
    for _ in 0..50 {
        let mut g = vec![0.0; p];
        let mut h = vec![0.0; p * p];
        for i in 0..rows.n() {
            let x = rows.row(i);
            let xt: Vec<f64> = std::iter::once(1.0).chain(x.iter().cloned()).collect();
            let t = z(w[0], &w[1..], x);
            let s = 1.0 / (1.0 + (-t).exp());
            let r = s - rows.labels[i];
            let c = s * (1.0 - s);
            for a in 0..p {
                g[a] += r * xt[a];
                for b in 0..p {
                    h[a * p + b] += c * xt[a] * xt[b];
                }
            }
        }
        for a in 0..p {
            h[a * p + a] += 1e-6 * rows.n() as f64;
            g[a] += 1e-6 * rows.n() as f64 * w[a];
        }
        let step = solve(h, g, p);
        let mut m: f64 = 0.0;
        for a in 0..p {
            w[a] -= step[a];
            m = m.max(step[a].abs());
        }
        if m < 1e-10 {
            break;
        }
    }
    (w[0], w[1..].to_vec())
}

/// Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<f64>, mut b: Vec<f64>, p: usize) -> Vec<f64> {
    for c in 0..p {
        let piv = (c..p)
            .max_by(|&i, &j| a[i * p + c].abs().total_cmp(&a[j * p + c].abs()))
            .unwrap();
        for k in 0..p {
            a.swap(c * p + k, piv * p + k);
        }
        b.swap(c, piv);
        for r in c + 1..p {
            let f = a[r * p + c] / a[c * p + c];
            for k in c..p {
                a[r * p + k] -= f * a[c * p + k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; p];
    for r in (0..p).rev() {
        let s: f64 = (r + 1..p).map(|k| a[r * p + k] * x[k]).sum();
        x[r] = (b[r] - s) / a[r * p + r];
    }
    x
}

struct Opts {
    dir: std::path::PathBuf,
    eps: Vec<f64>,
    runs: usize,
    folds: usize,
    splits: Option<f64>,
    splits_scale: Option<f64>,
    momentum: Option<f64>,
    validate: bool,
    paper_split: bool,
    datasets: Vec<String>,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        dir: "data".into(),
        eps: vec![0.1, 0.4, 1.6],
        runs: 2,
        folds: 5,
        splits: None,
        splits_scale: None,
        momentum: None,
        validate: false,
        paper_split: false,
        datasets: vec!["BANK".into(), "IPUMS-BR".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--eps" => {
                let v = val()?;
                o.eps = if v == "all" {
                    EPS_GRID.to_vec()
                } else {
                    v.split(',')
                        .map(|s| s.parse().map_err(|e| format!("--eps {s}: {e}")))
                        .collect::<Result<_, _>>()?
                }
            }
            "--runs" => o.runs = val()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--folds" => o.folds = val()?.parse().map_err(|e| format!("--folds: {e}"))?,
            "--splits" => o.splits = Some(val()?.parse().map_err(|e| format!("--splits: {e}"))?),
            "--split" => o.paper_split = val()? == "paper",
            "--splits-scale" => {
                o.splits_scale = Some(val()?.parse().map_err(|e| format!("--splits-scale: {e}"))?)
            }
            "--momentum" => {
                o.momentum = Some(val()?.parse().map_err(|e| format!("--momentum: {e}"))?)
            }
            "--validate" => o.validate = true,
            "--datasets" => o.datasets = val()?.split(',').map(String::from).collect(),
            s if !s.starts_with("--") => o.dir = s.into(),
            s => return Err(format!("unknown option {s}")),
        }
    }
    Ok(o)
}

/// Mean and sample standard deviation.
fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0).max(1.0);
    (m, var.sqrt())
}

/// One cell of the table.
struct Cell {
    eps: f64,
    acc: (f64, f64),
    auc: (f64, f64),
    reference: f64,
    majority: f64,
    obj: f64,
    iterations: f64,
    splits: f64,
}

fn main() -> Result<(), String> {
    let o = parse_args()?;
    println!(
        "DP-AGD benchmark: δ = {DELTA:e}, {} folds × {} runs, split = {}, splits = {}, momentum \
         = {}{}",
        o.folds,
        o.runs,
        if o.paper_split {
            "paper"
        } else {
            "equal-ρ (ours)"
        },
        match (o.paper_split, o.splits, o.splits_scale) {
            (true, _, _) => "60 (paper)".to_string(),
            (_, Some(s), _) => s.to_string(),
            (_, None, Some(k)) => format!("{k}·√ρ"),
            _ => "default (agd::default_splits)".to_string(),
        },
        o.momentum.map_or("default".to_string(), |m| m.to_string()),
        if o.validate {
            "; VALIDATION mode (inner 80/20 split of the training folds; test folds unused)"
        } else {
            ""
        }
    );
    let mut table: BTreeMap<String, Vec<Cell>> = BTreeMap::new();
    for name in &o.datasets {
        let rows = load(&o.dir.join(format!("{name}.dat")))?;
        let n = rows.n();
        let pos = rows.labels.iter().sum::<f64>() / n as f64;
        let majority = 100.0 * pos.max(1.0 - pos);
        let (b0, b) = newton(&rows);
        println!(
            "\n{name}: n = {n}, d = {}, majority {majority:.2}%, non-private LR (Newton, all \
             rows) {:.2}%, AUC {:.4}, obj {:.3}",
            rows.d,
            accuracy(b0, &b, &rows),
            auc(b0, &b, &rows),
            objective(b0, &b, &rows)
        );
        for &eps in &o.eps {
            let started = Instant::now();
            let rho = zcdp_rho(eps, DELTA).map_err(|e| e.to_string())?;
            // The SQL function's defaults: only ε and δ given.
            let params = AgdParams::from_literals(&[
                ScalarValue::Float64(Some(eps)),
                ScalarValue::Float64(Some(DELTA)),
            ])
            .map_err(|e| e.to_string())?;
            let mut config = params.config().map_err(|e| e.to_string())?;
            assert_eq!(config.rho, rho);
            if let Some(k) = o.splits_scale {
                config.splits = (k * rho.sqrt()).round().clamp(SPLITS_MIN, SPLITS_MAX);
            }
            if let Some(s) = o.splits {
                config.splits = s;
            }
            if let Some(m) = o.momentum {
                config.momentum = m;
            }
            let plan = if o.paper_split {
                config.splits = 60.0;
                let e_nm = eps / (2.0 * 60.0);
                let rho_nm = e_nm * e_nm / 2.0;
                let rho_ng = e_nm * e_nm / (4.0 * (1.25 / DELTA).ln());
                AgdPlan::with_budgets(config, rho_ng, rho_nm)
            } else {
                AgdPlan::new(config)
            }
            .map_err(|e| e.to_string())?;
            let (mut accs, mut aucs, mut objs, mut iters) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for run in 0..o.runs {
                let mut perm: Vec<usize> = (0..n).collect();
                let mut sm = SplitMix64(0xA6D0 + run as u64);
                for i in (1..n).rev() {
                    perm.swap(i, (sm.next() % (i as u64 + 1)) as usize);
                }
                for f in 0..o.folds {
                    let fold = |keep: bool| -> Vec<usize> {
                        perm.iter()
                            .enumerate()
                            .filter(|(k, _)| (k % o.folds == f) == keep)
                            .map(|(_, &i)| i)
                            .collect()
                    };
                    let (mut test_idx, mut train_idx) = (fold(true), fold(false));
                    if o.validate {
                        // Tuning never sees the test fold: split the training fold 80/20.
                        let mut sm = SplitMix64(0x7A11 + (run * 100 + f) as u64);
                        for i in (1..train_idx.len()).rev() {
                            train_idx.swap(i, (sm.next() % (i as u64 + 1)) as usize);
                        }
                        let cut = train_idx.len() * 4 / 5;
                        test_idx = train_idx.split_off(cut);
                    }
                    let (tr, te) = (subset(&rows, &train_idx), subset(&rows, &test_idx));
                    let seed = (eps.to_bits() ^ (run as u64) << 8 ^ f as u64).wrapping_mul(31);
                    let mut rng = SecureRng::insecure_from_seed(seed);
                    let m = fit(&plan, &tr, &mut rng);
                    assert!(m.spent <= rho);
                    accs.push(accuracy(m.intercept, &m.coefficients, &te));
                    aucs.push(auc(m.intercept, &m.coefficients, &te));
                    objs.push(objective(m.intercept, &m.coefficients, &tr));
                    iters.push(m.iterations as f64);
                }
            }
            let refv = REFERENCE
                .iter()
                .find(|(d, _)| d == name)
                .and_then(|(_, r)| EPS_GRID.iter().position(|&e| e == eps).map(|k| r[k]))
                .unwrap_or(f64::NAN);
            let cell = Cell {
                eps,
                acc: mean_sd(&accs),
                auc: mean_sd(&aucs),
                reference: refv,
                majority,
                obj: mean_sd(&objs).0,
                iterations: mean_sd(&iters).0,
                splits: plan.config.splits,
            };
            println!(
                "  ε = {eps:<5} acc {:.2} ± {:.2}  AUC {:.4} ± {:.4}  (reference fixed {refv:.2}, \
                 majority {majority:.2})  obj {:.3}  splits {}  iterations {:.0}  [{:.1}s]",
                cell.acc.0,
                cell.acc.1,
                cell.auc.0,
                cell.auc.1,
                cell.obj,
                cell.splits,
                cell.iterations,
                started.elapsed().as_secs_f64()
            );
            table.entry(name.clone()).or_default().push(cell);
        }
    }
    println!(
        "\n| dataset | ε | accuracy % (mean ± sd) | AUC (mean ± sd) | reference `fixed` % | \
         majority % | obj | splits | steps |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, cells) in &table {
        for c in cells {
            println!(
                "| {name} | {} | {:.2} ± {:.2} | {:.3} ± {:.3} | {:.2} | {:.2} | {:.3} | {} | {:.0} |",
                c.eps,
                c.acc.0,
                c.acc.1,
                c.auc.0,
                c.auc.1,
                c.reference,
                c.majority,
                c.obj,
                c.splits,
                c.iterations
            );
        }
    }
    Ok(())
}
