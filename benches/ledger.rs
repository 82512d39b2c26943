//! The ledger's cost to a session (issue 32): opening a ledger (what every process start pays)
//! on a short and a long ledger, and admission's wall time per charge with and without its one
//! fsync. Run:
//!
//! ```text
//! cargo bench --bench ledger
//! DPFUSION_BENCH_ENTRIES=10,10000,100000 DPFUSION_BENCH_REPS=50 cargo bench --bench ledger
//! ```
//!
//! (defaults: 10 and 10,000 entries, 30 repetitions; `DPFUSION_BENCH_KEEP=1` keeps the ledgers
//! and prints their directory). Each ledger has two private tables (a gdp
//! and an rdp filter) and `n` charges of one or two tables, built without fsync (that is not
//! what is measured), then opened once so that its checkpoint is written. Printed, per ledger:
//! - `open`: `Accountant::open` from the checkpoint (median and worst of the repetitions),
//!   which reads the compact state and the lines after it; `open+250`: the same with 250
//!   charges after the checkpoint (about the most a session reads before writing a new one);
//!   `full`: the ledger read from line 1 (`dpfusion ledger verify`'s read), for reference;
//! - `admit fsync` / `admit no-fsync`: wall time of one `admit` (the catch-up under the lock,
//!   the filter's sums, the append, the sidecar) with the append fsync'd (as always outside
//!   this bench) and without it (`Accountant::insecure_skip_fsync_for_benchmarks`).
//!
//! Then the difference of the open times between the longest and the shortest ledger, against
//! the 10 ms target.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dpfusion::accounting::{
    Accountant, FilterKind, TableCharge, TableKey, TablePolicy, checkpoint_path, head_path, verify,
};
use dpfusion::dpfusion_udfs::privacy::Event;

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn policy(key: &str, filter: FilterKind) -> TablePolicy {
    serde_json::from_value(serde_json::json!({
        "key": key,
        "name": key.trim_start_matches("demo:"),
        "visibility": "private",
        "neighbours": "add_remove",
        "public_columns": [],
        "budget": { "epsilon": 1e6, "delta": 1e-6 },
    }))
    .map(|mut p: TablePolicy| {
        p.filter = filter;
        p
    })
    .unwrap()
}

fn charges(i: usize) -> Vec<TableCharge> {
    let mu = 0.01 + (i % 17) as f64 * 1e-3;
    let a = TableCharge {
        key: TableKey::from("demo:a"),
        events: vec![Event::Gaussian { mu }, Event::Delta { delta: 1e-15 }],
    };
    let b = TableCharge {
        key: TableKey::from("demo:b"),
        events: vec![
            Event::Gaussian { mu: mu / 2.0 },
            Event::SubsampledGaussian {
                sample_rate: 0.01,
                noise_multiplier: 3.0,
                steps: 10,
            },
        ],
    };
    if i.is_multiple_of(2) {
        vec![a]
    } else {
        vec![a, b]
    }
}

/// A ledger of `n` charges in `dir`, its checkpoint written.
fn build(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join(format!("ledger-{n}.jsonl"));
    let acc = Accountant::open(&path).unwrap();
    acc.insecure_skip_fsync_for_benchmarks();
    acc.register_table(policy("demo:a", FilterKind::Gdp))
        .unwrap();
    acc.register_table(policy("demo:b", FilterKind::Rdp { order: None }))
        .unwrap();
    for i in 0..n {
        acc.admit(&format!("SELECT dp_mean(x, 0, 1, {i}) FROM t"), &charges(i))
            .unwrap();
    }
    drop(acc);
    // The first session replays it all and writes the checkpoint.
    drop(Accountant::open(&path).unwrap());
    path
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn open_times(path: &Path, reps: usize) -> (Duration, Duration) {
    let mut v = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let acc = Accountant::open(path).unwrap();
        v.push(t.elapsed());
        drop(acc);
    }
    let worst = *v.iter().max().unwrap();
    (median(v), worst)
}

fn admit_times(path: &Path, reps: usize, fsync: bool) -> (Duration, Duration) {
    let acc = Accountant::open(path).unwrap();
    if !fsync {
        acc.insecure_skip_fsync_for_benchmarks();
    }
    let mut v = Vec::new();
    for i in 0..reps {
        let c = charges(i);
        let t = Instant::now();
        acc.admit("SELECT dp_mean(x, 0, 1, 0.1) FROM t", &c)
            .unwrap();
        v.push(t.elapsed());
    }
    let mean = v.iter().sum::<Duration>() / reps as u32;
    (median(v), mean)
}

/// Opening `path` after `more` charges past its checkpoint, on a fresh copy each time (opening
/// the ledger itself would write a new checkpoint after 256 lines).
fn open_after(dir: &Path, path: &Path, n: usize, more: usize, reps: usize) {
    let acc = Accountant::open(path).unwrap();
    acc.insecure_skip_fsync_for_benchmarks();
    for i in 0..more {
        acc.admit("SELECT later", &charges(i)).unwrap();
    }
    drop(acc);
    let mut v = Vec::new();
    let copy = dir.join(format!("copy-{n}.jsonl"));
    for _ in 0..reps {
        // A fresh copy each time (opening would write a new checkpoint after 256 lines).
        for (from, to) in [
            (path.to_path_buf(), copy.clone()),
            (head_path(path), head_path(&copy)),
            (checkpoint_path(path), checkpoint_path(&copy)),
        ] {
            std::fs::copy(from, to).unwrap();
        }
        let t = Instant::now();
        let acc = Accountant::open(&copy).unwrap();
        v.push(t.elapsed());
        drop(acc);
    }
    let worst = *v.iter().max().unwrap();
    println!(
        "{n:>7} open+{more}       median {}  worst {}",
        ms(median(v)),
        ms(worst)
    );
}

fn main() {
    let sizes = env_list("DPFUSION_BENCH_ENTRIES", &[10, 10_000]);
    let reps = env_list("DPFUSION_BENCH_REPS", &[30])[0].max(1);
    // The ledgers in `root/l`: their witnesses (`root/l.witness`, docs/LEDGER.md) go with `root`.
    let root = std::env::temp_dir().join(format!("dpfusion-bench-ledger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("l");
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "ledger bench: {reps} repetitions, ledgers in {}",
        dir.display()
    );
    let mut opens = Vec::new();
    for &n in &sizes {
        let t = Instant::now();
        let path = build(&dir, n);
        let bytes = std::fs::metadata(&path).unwrap().len();
        let cp = std::fs::metadata(checkpoint_path(&path))
            .map(|m| m.len())
            .unwrap_or(0);
        println!(
            "{n:>7} entries: {bytes} bytes, checkpoint {cp} bytes (built in {:.1} s)",
            t.elapsed().as_secs_f64()
        );
        let (open, worst) = open_times(&path, reps);
        println!(
            "{n:>7} open           median {}  worst {}",
            ms(open),
            ms(worst)
        );
        let t = Instant::now();
        let r = verify(&path).unwrap();
        println!(
            "{n:>7} full           {} ({} lines read from line 1)",
            ms(t.elapsed()),
            r.lines
        );
        // 250 charges after the checkpoint: about the most a session reads before writing a new
        // one (after 256 lines). Only for a ledger with a checkpoint (a short one has none).
        let more = 250;
        if !checkpoint_path(&path).exists() {
            println!("{n:>7} open+{more}       (no checkpoint: skipped)");
        } else {
            open_after(&dir, &path, n, more, reps);
        }
        let (m, mean) = admit_times(&path, reps, true);
        println!("{n:>7} admit fsync    median {}  mean {}", ms(m), ms(mean));
        let (m, mean) = admit_times(&path, reps, false);
        println!("{n:>7} admit no-fsync median {}  mean {}", ms(m), ms(mean));
        opens.push((n, open));
    }
    if let (Some((n0, a)), Some((n1, b))) = (opens.first(), opens.last()) {
        let diff = b.as_secs_f64() - a.as_secs_f64();
        println!(
            "open {n1} vs {n0} entries: {:+.3} ms (target: within 10 ms) -> {}",
            diff * 1e3,
            if diff <= 0.010 { "met" } else { "NOT met" }
        );
    }
    if std::env::var_os("DPFUSION_BENCH_KEEP").is_some() {
        // For measuring a whole process on these ledgers (docs/PERFORMANCE.md, "Ledger").
        println!("kept: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
}
