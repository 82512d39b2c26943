//! How tight is each privacy filter, against the old admission rule? (docs/ACCOUNTING.md)
//!
//!     cargo run --release --example accounting_tightness
//!
//! Workloads: (1) the charged calls of sql/quickstart.sql on the demo tables (ε_B = 5,
//! δ_B = 1e-6 each), their events read from the ledger of a real run; (2) 100 × dp_mean(ε = 0.1,
//! δ = 1e-7) on one table with ε_B = 5, δ_B = 1e-6, and (3) the same call offered 10,000 times,
//! to count how many each rule admits. Each sequence of charges is replayed under
//! the old rule (min of the GDP and CKS conversions at δ_B − Σδ_add, which is not a valid filter)
//! and under the gdp, zcdp and rdp filters with the default δ share 0.5. A charge that a rule
//! refuses is skipped (not charged) and the replay goes on.
use std::collections::BTreeMap;

use dpfusion::accounting::{Budget, Filter, FilterKind, Usage};
use dpfusion::session::{PrivateSession, SessionOptions};
use dpfusion_cli::cli::split_script;
use dpfusion_udfs::privacy::{Event, Profile};

/// (admitted, refused, ε reported at the end, Σδ_add, what refused first) under one rule.
struct Outcome {
    admitted: usize,
    refused: usize,
    epsilon: f64,
    delta: f64,
    first_refusal: String,
}

fn old_rule(b: &Budget, charges: &[Vec<Event>]) -> Outcome {
    let mut state = Profile::zero();
    let (mut admitted, mut refused, mut first) = (0, 0, String::new());
    for c in charges {
        let mut next = state.clone();
        next.compose(&Profile::from_events(c));
        if next.epsilon(b.delta) <= b.epsilon * (1.0 + 1e-12) {
            state = next;
            admitted += 1;
        } else {
            refused += 1;
            if first.is_empty() {
                first = "ε".into();
            }
        }
    }
    Outcome {
        admitted,
        refused,
        epsilon: state.epsilon(b.delta),
        delta: state.additive_delta(),
        first_refusal: first,
    }
}

fn filter_rule(b: &Budget, kind: FilterKind, charges: &[Vec<Event>]) -> Outcome {
    let f = Filter::new(b, kind, 0.5).expect("filter");
    let mut used = Usage::default();
    let (mut admitted, mut refused, mut first) = (0, 0, String::new());
    for c in charges {
        let u = f.usage(c);
        match f.check(&used, &u) {
            None => {
                used = used.plus(&u);
                admitted += 1;
            }
            Some(limit) => {
                refused += 1;
                if first.is_empty() {
                    first = limit.to_string();
                }
            }
        }
    }
    Outcome {
        admitted,
        refused,
        epsilon: f.epsilon(&used),
        delta: used.delta,
        first_refusal: first,
    }
}

fn report(name: &str, b: &Budget, charges: &[Vec<Event>]) {
    let rules: Vec<(String, Outcome)> = vec![
        ("old rule (invalid)".into(), old_rule(b, charges)),
        ("gdp".into(), filter_rule(b, FilterKind::Gdp, charges)),
        ("zcdp".into(), filter_rule(b, FilterKind::Zcdp, charges)),
        (
            format!(
                "rdp (α* = {:.3})",
                match Filter::new(b, FilterKind::Rdp { order: None }, 0.5)
                    .unwrap()
                    .kind
                {
                    FilterKind::Rdp { order: Some(a) } => a,
                    _ => f64::NAN,
                }
            ),
            filter_rule(b, FilterKind::Rdp { order: None }, charges),
        ),
    ];
    for (rule, o) in rules {
        println!(
            "| {name} | {rule} | {}/{} | {:.4} | {:.1e} | {} |",
            o.admitted,
            o.admitted + o.refused,
            o.epsilon,
            o.delta,
            if o.first_refusal.is_empty() {
                "-".to_string()
            } else {
                o.first_refusal
            }
        );
    }
}

#[tokio::main]
async fn main() -> datafusion::common::Result<()> {
    let dir = std::env::temp_dir().join(format!("dpfusion-tightness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let session =
        PrivateSession::open(SessionOptions::default().with_ledger(dir.join("ledger.jsonl")))
            .await?;
    dpfusion_cli::demo::register_demo(&session)?;
    let script = std::fs::read_to_string("sql/quickstart.sql")?;
    for stmt in split_script(&script) {
        let _ = session.sql(&stmt.sql).await; // the refusals the script expects are skipped
    }
    // Charges per table, in order.
    let mut by_table: BTreeMap<String, Vec<Vec<Event>>> = BTreeMap::new();
    for e in session.ledger().unwrap() {
        for t in e.tables {
            by_table.entry(t.name).or_default().push(t.events);
        }
    }
    // One dp_mean(ε = 0.1, δ = 1e-7), its events as the session records them.
    session
        .sql("SELECT dp_mean(cost, 0, 20, epsilon => 0.1, delta => 1e-7) FROM patients")
        .await?;
    let mean = session.ledger().unwrap().last().unwrap().tables[0]
        .events
        .clone();
    let _ = std::fs::remove_dir_all(&dir);

    let b = Budget {
        epsilon: 5.0,
        delta: 1e-6,
    };
    println!(
        "| workload | rule | admitted | ε reported (at δ_B for the old rule, δ_g = 5e-7 for the \
         filters) | Σδ_add | first refusal |"
    );
    println!("|---|---|---|---|---|---|");
    for (table, charges) in &by_table {
        report(&format!("quickstart: {table}"), &b, charges);
    }
    report("100 × dp_mean(ε=0.1, δ=1e-7)", &b, &vec![mean.clone(); 100]);
    report(
        "dp_mean(ε=0.1, δ=1e-7) until refused",
        &b,
        &vec![mean; 10_000],
    );
    Ok(())
}
