//! Utility of contribution bounding on the `transactions` demo (issue 16; docs/UTILITY.md,
//! "Privacy units"): the error of `dp_sum(amount)` per category against the true sum, for
//! ε ∈ {0.5, 1, 2} and several bounds, beside the row-level release (the table registered
//! without its unit), whose guarantee is false for customers with many rows.
//!
//! ```sh
//! cargo run --release --example units_utility
//! ```
//!
//! For each configuration it runs the query `RUNS` times (fresh noise each time) and reports,
//! averaged over the 5 categories:
//! - `cut`: what the bounds remove from the true sum, (true − bounded truth)/true, where the
//!   bounded truth is the mean release over the runs (the noise has mean 0);
//! - `noise`: the mean absolute deviation of a release from the bounded truth, relative to the true
//!   sum;
//! - `error`: the mean absolute error of a release against the true sum, relative to it.
use std::collections::BTreeMap;

use dpfusion::arrow::array::{Array, Float64Array, Int64Array, StringArray};
use dpfusion::{PrivateSession, Registration, SessionOptions};
use dpfusion_cli::demo;

const RUNS: usize = 30;

#[tokio::main]
async fn main() -> dpfusion::datafusion::common::Result<()> {
    let batch = demo::transactions()?;
    let cat = batch
        .column(3)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let amount = batch
        .column(4)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    let customer = batch
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let mut truth: BTreeMap<String, f64> = BTreeMap::new();
    let mut rows_of: BTreeMap<i64, usize> = BTreeMap::new();
    for i in 0..batch.num_rows() {
        *truth.entry(cat.value(i).to_string()).or_default() += amount.value(i);
        *rows_of.entry(customer.value(i)).or_default() += 1;
    }
    let max_rows = rows_of.values().max().copied().unwrap_or(0);
    println!(
        "transactions: {} rows, {} customers, up to {max_rows} rows per customer",
        batch.num_rows(),
        rows_of.len()
    );
    println!("true sum per category: {truth:?}\n");
    println!("| release | ε | K (groups/unit) | upper | cut | noise | error |");
    println!("|---|---|---|---|---|---|---|");
    for eps in [0.5, 1.0, 2.0] {
        for (label, unit, k, upper) in [
            ("unit-level", true, 1u32, 500.0),
            ("unit-level", true, 2, 500.0),
            ("unit-level", true, 5, 2_000.0),
            ("unit-level", true, 5, 10_000.0),
            ("row-level (wrong guarantee)", false, 1, 500.0),
        ] {
            let dir = std::env::temp_dir().join(format!(
                "dpfusion-units-utility-{}-{eps}-{k}-{upper}-{unit}",
                std::process::id()
            ));
            let s = PrivateSession::open(
                SessionOptions::default().with_ledger(dir.join("ledger.jsonl")),
            )
            .await?;
            let reg = if unit {
                Registration::private()
                    .privacy_unit("customer_id")
                    .contribution_bounds(k, 1)
            } else {
                Registration::private()
            };
            s.register_batches("t", vec![batch.clone()], reg.budget(1e6, 1e-5))?;
            let sql = format!(
                "SELECT category, dp_sum(amount, 0, {upper}, epsilon => {eps}, delta => 1e-7) \
                 FROM t GROUP BY category"
            );
            let mut releases: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for _ in 0..RUNS {
                let r = s.sql(&sql).await?;
                for b in &r.batches {
                    let c = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                    let v = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
                    for i in 0..b.num_rows() {
                        if v.is_valid(i) {
                            releases
                                .entry(c.value(i).to_string())
                                .or_default()
                                .push(v.value(i));
                        }
                    }
                }
            }
            let (mut cut, mut noise, mut error) = (0.0, 0.0, 0.0);
            for (c, t) in &truth {
                let xs = releases.get(c).cloned().unwrap_or_default();
                let n = xs.len().max(1) as f64;
                let bounded = xs.iter().sum::<f64>() / n;
                cut += (t - bounded) / t;
                noise += xs.iter().map(|x| (x - bounded).abs()).sum::<f64>() / n / t;
                error += xs.iter().map(|x| (x - t).abs()).sum::<f64>() / n / t;
            }
            let g = truth.len() as f64;
            println!(
                "| {label} | {eps} | {} | {upper} | {:.1}% | {:.2}% | {:.1}% |",
                if unit { k.to_string() } else { "–".into() },
                100.0 * cut / g,
                100.0 * noise / g,
                100.0 * error / g
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(())
}
