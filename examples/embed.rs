//! The smallest complete embedding of dpfusion: open a session, register a private table (as
//! its data owner), run DP queries (as the analyst), read the budget, and handle a refusal and
//! an exhausted budget by their typed errors. `cargo run --example embed`.
use std::sync::Arc;

use dpfusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
use dpfusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::{Error, PrivateSession, Registration, SessionOptions};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The ledger keeps every charge, durably, before any row is read. A real deployment keeps it
    // in a directory of the data owner's; this example uses a fresh one each run, removed at the
    // end with the ledger's witness (kept beside the ledger's directory: `dir/ledger.witness`).
    let dir = std::env::temp_dir().join(format!("dpfusion-embed-{}", std::process::id()));
    let session = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger").join("ledger.jsonl"))
            .with_default_budget(1.0, 1e-6),
    )
    .await?;

    // The data owner registers a private table: 1,000 people with an age and an income.
    let schema = Arc::new(Schema::new(vec![
        Field::new("age", DataType::Int64, false),
        Field::new("income", DataType::Float64, false),
    ]));
    let age = Int64Array::from_iter_values((0..1000).map(|i| 20 + i % 50));
    let income = Float64Array::from_iter_values((0..1000).map(|i| 30_000.0 + 50.0 * i as f64));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(age), Arc::new(income)])?;
    session.register_batches("people", vec![batch], Registration::private())?;

    // The analyst asks for a DP mean: it costs ε = 0.5 of the table's ε = 1.
    let r = session
        .sql("SELECT dp_mean(income, 0, 100000, epsilon => 0.5) AS mean_income FROM people")
        .await?;
    let mean = r.batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<Float64Array>()
        .expect("a Float64 column")
        .value(0);
    println!("DP mean income: {mean:.0}");
    // What is used is a share of the table's budget (docs/ACCOUNTING.md, "What the numbers
    // mean"); what is left, also as the largest ε one default query could still use.
    for b in session.budget() {
        println!(
            "{}: {} of the budget (ε {}) used, one more query could use ε ≤ {}",
            b.name,
            dpfusion::accounting::display::percent(b.native.used_share),
            b.epsilon,
            dpfusion::accounting::display::n6(b.remaining)
        );
    }

    // Raw rows are refused by the guard, before anything is read or charged.
    let e = session.sql("SELECT * FROM people").await.unwrap_err();
    assert!(matches!(Error::of(&e), Some(Error::Refused(_))));
    println!("refused: {}", Error::of(&e).expect("typed"));

    // A query that would exceed the budget is refused too, with the numbers.
    let e = session
        .sql("SELECT dp_count(age, epsilon => 2.0) FROM people")
        .await
        .unwrap_err();
    match Error::of(&e) {
        Some(Error::BudgetExceeded { table, message, .. }) => {
            println!("budget exceeded on {table}: {message}")
        }
        other => panic!("expected a budget refusal, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
