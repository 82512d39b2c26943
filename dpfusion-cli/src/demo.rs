//! The built-in demo tables, generated deterministically in-process (no download):
//!
//! - `salaries` (60,000 rows): `job` (public; 12 jobs whose pay scales differ by 10×), `salary`
//!   (within a factor 1.5 inside each job), `years`, `remote`. Registered with `replace`
//!   neighbours and `job` public — the setting of the relative Gaussian mechanism.
//! - `patients` (20,000 rows): features `age`, `bmi`, `bp`, `chol`, `smoker` (scaled to [-1, 1]
//!   or 0/1), a 0/1 outcome `disease` drawn from a known logistic model, and a continuous outcome
//!   `cost` from a known linear model ([`PATIENTS_LOGISTIC`], [`PATIENTS_LINEAR`]). Registered
//!   private with `add_remove` neighbours.
//!
//! - `transactions` (about 30,000 rows of 5,000 customers): `txn_id`, `customer_id` (the
//!   **privacy unit**), `store`, `category`, `amount`, `day`. The number of rows per customer is
//!   heavy-tailed (a Pareto tail: most have a handful, some hundreds), and each customer buys
//!   mostly at a home store. Neighbours add or remove a customer with all their rows; the owner's
//!   default bounds are 2 groups and 5 rows per group (docs/PRIVACY.md, "Privacy units").
//! - `stores` (40 rows, **public**): `store` (unique), `region`, `city`: a table to join.
//!
//! The private tables get the demo budget ε = 5, δ = 1e-6 in the session's ledger; `salaries` is accounted with
//! the `rdp` filter (it serves RGM), `patients` with `zcdp` (it serves DP-AGD), docs/ACCOUNTING.md. The generator is a
//! SplitMix64 stream with a fixed seed: it makes test data, never noise.
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::common::Result;

use dpfusion::accounting::{FilterKind, TableKey};
use dpfusion::session::{PrivateSession, Registration};

/// The jobs of `salaries` and their base pay (the median of the job's range).
pub const JOBS: [(&str, f64); 12] = [
    ("cashier", 24_000.0),
    ("cook", 28_000.0),
    ("driver", 33_000.0),
    ("clerk", 38_000.0),
    ("technician", 46_000.0),
    ("nurse", 58_000.0),
    ("teacher", 62_000.0),
    ("accountant", 75_000.0),
    ("engineer", 98_000.0),
    ("manager", 125_000.0),
    ("lawyer", 170_000.0),
    ("surgeon", 240_000.0),
];

/// The logistic model of `patients.disease`: intercept then coefficients of
/// (age, bmi, bp, chol, smoker).
pub const PATIENTS_LOGISTIC: [f64; 6] = [-0.5, 1.2, 0.8, -0.6, 0.5, 0.9];
/// The linear model of `patients.cost`: intercept then coefficients of (age, bmi, bp, chol,
/// smoker); residual standard deviation [`PATIENTS_COST_NOISE`].
pub const PATIENTS_LINEAR: [f64; 6] = [3.0, 1.5, -0.7, 0.9, 0.4, 2.0];
pub const PATIENTS_COST_NOISE: f64 = 0.5;

/// Number of rows.
pub const SALARIES_ROWS: usize = 60_000;
pub const PATIENTS_ROWS: usize = 20_000;

/// SplitMix64 (Steele, Lea, Flood 2014): a small, fast, deterministic generator for test data.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The `salaries` table.
pub fn salaries() -> Result<RecordBatch> {
    let mut rng = SplitMix64::new(0x5a1a_2135);
    let n = SALARIES_ROWS;
    let mut job = Vec::with_capacity(n);
    let mut salary = Vec::with_capacity(n);
    let mut years = Vec::with_capacity(n);
    let mut remote = Vec::with_capacity(n);
    // Job sizes differ (some jobs are rare): weights 1..=12 shuffled by a fixed rule.
    let weights: Vec<f64> = (0..JOBS.len())
        .map(|i| 1.0 + ((i * 7) % JOBS.len()) as f64)
        .collect();
    let total: f64 = weights.iter().sum();
    for _ in 0..n {
        let mut u = rng.uniform() * total;
        let mut j = 0;
        while j + 1 < JOBS.len() && u >= weights[j] {
            u -= weights[j];
            j += 1;
        }
        let (name, base) = JOBS[j];
        let y = (rng.uniform() * 35.0).floor() as i64;
        // Within a factor 1.5 inside the job: base · [0.8165, 1.2247] (ratio exactly 1.5),
        // rising with experience.
        let lo = base / 1.5f64.sqrt();
        let t = (0.6 * (y as f64 / 35.0) + 0.4 * rng.uniform()).clamp(0.0, 1.0);
        let s = lo * 1.5f64.powf(t);
        job.push(name);
        salary.push((s * 100.0).round() / 100.0);
        years.push(y);
        remote.push(rng.uniform() < 0.25);
    }
    Ok(RecordBatch::try_from_iter(vec![
        ("job", Arc::new(StringArray::from(job)) as ArrayRef),
        ("salary", Arc::new(Float64Array::from(salary)) as ArrayRef),
        ("years", Arc::new(Int64Array::from(years)) as ArrayRef),
        ("remote", Arc::new(BooleanArray::from(remote)) as ArrayRef),
    ])?)
}

/// The `patients` table.
pub fn patients() -> Result<RecordBatch> {
    let mut rng = SplitMix64::new(0x9a71_e475);
    let n = PATIENTS_ROWS;
    let mut cols: Vec<Vec<f64>> = (0..5).map(|_| Vec::with_capacity(n)).collect();
    let mut disease = Vec::with_capacity(n);
    let mut cost = Vec::with_capacity(n);
    for _ in 0..n {
        let age = rng.uniform() * 2.0 - 1.0;
        let bmi = (0.5 * rng.normal()).clamp(-1.0, 1.0);
        let bp = (0.4 * age + 0.4 * rng.normal()).clamp(-1.0, 1.0);
        let chol = (0.5 * rng.normal()).clamp(-1.0, 1.0);
        let smoker = if rng.uniform() < 0.3 { 1.0 } else { 0.0 };
        let x = [age, bmi, bp, chol, smoker];
        let z: f64 = PATIENTS_LOGISTIC[0]
            + x.iter()
                .zip(&PATIENTS_LOGISTIC[1..])
                .map(|(a, b)| a * b)
                .sum::<f64>();
        let p = 1.0 / (1.0 + (-z).exp());
        disease.push(i64::from(rng.uniform() < p));
        let c: f64 = PATIENTS_LINEAR[0]
            + x.iter()
                .zip(&PATIENTS_LINEAR[1..])
                .map(|(a, b)| a * b)
                .sum::<f64>()
            + PATIENTS_COST_NOISE * rng.normal();
        cost.push(c);
        for (k, v) in x.iter().enumerate() {
            cols[k].push(*v);
        }
    }
    let names = ["age", "bmi", "bp", "chol", "smoker"];
    let mut fields: Vec<(&str, ArrayRef)> = names
        .iter()
        .zip(cols)
        .map(|(n, c)| (*n, Arc::new(Float64Array::from(c)) as ArrayRef))
        .collect();
    fields.push(("disease", Arc::new(Int64Array::from(disease))));
    fields.push(("cost", Arc::new(Float64Array::from(cost))));
    Ok(RecordBatch::try_from_iter(fields)?)
}

/// `transactions` (module docs): customers and the number of rows.
pub const CUSTOMERS: usize = 5_000;
/// The number of stores (the rows of `stores`) and their regions.
pub const STORES: usize = 40;
pub const REGIONS: [&str; 4] = ["north", "south", "east", "west"];
const CATEGORIES: [&str; 5] = ["grocery", "fuel", "pharmacy", "electronics", "clothing"];

/// The number of rows of a customer: ⌊u^(−1/1.1)⌋ capped at 800, a Pareto tail of index 1.1
/// (mean ≈ 6, a few customers with hundreds of rows).
fn rows_of_customer(rng: &mut SplitMix64) -> usize {
    let u = 1.0 - rng.uniform();
    (u.powf(-1.0 / 1.1).floor() as usize).clamp(1, 800)
}

/// The `transactions` table (module docs).
pub fn transactions() -> Result<RecordBatch> {
    let mut rng = SplitMix64::new(0x7a_5ac7_1045);
    let (mut id, mut customer, mut store, mut category, mut amount, mut day) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for c in 0..CUSTOMERS {
        let home = (rng.next_u64() % STORES as u64) as i64 + 1;
        let n = rows_of_customer(&mut rng);
        for _ in 0..n {
            id.push(id.len() as i64 + 1);
            customer.push(c as i64 + 1);
            let s = if rng.uniform() < 0.8 {
                home
            } else {
                (rng.next_u64() % STORES as u64) as i64 + 1
            };
            store.push(s);
            let k = (rng.next_u64() % CATEGORIES.len() as u64) as usize;
            category.push(CATEGORIES[k]);
            // Log-normal amounts around $30, a few in the thousands.
            amount.push(((3.4 + 0.9 * rng.normal()).exp() * 100.0).round() / 100.0);
            day.push((rng.next_u64() % 365) as i64 + 1);
        }
    }
    let fields: Vec<(&str, ArrayRef)> = vec![
        ("txn_id", Arc::new(Int64Array::from(id))),
        ("customer_id", Arc::new(Int64Array::from(customer))),
        ("store", Arc::new(Int64Array::from(store))),
        ("category", Arc::new(StringArray::from(category))),
        ("amount", Arc::new(Float64Array::from(amount))),
        ("day", Arc::new(Int64Array::from(day))),
    ];
    Ok(RecordBatch::try_from_iter(fields)?)
}

/// The public `stores` table: one row per store, with its region and city.
pub fn stores() -> Result<RecordBatch> {
    let store: Vec<i64> = (1..=STORES as i64).collect();
    let region: Vec<&str> = (0..STORES).map(|i| REGIONS[i % REGIONS.len()]).collect();
    let city: Vec<String> = (0..STORES)
        .map(|i| format!("city-{:02}", i / 2 + 1))
        .collect();
    let fields: Vec<(&str, ArrayRef)> = vec![
        ("store", Arc::new(Int64Array::from(store))),
        ("region", Arc::new(StringArray::from(region))),
        ("city", Arc::new(StringArray::from(city))),
    ];
    Ok(RecordBatch::try_from_iter(fields)?)
}

/// Registers the demo tables, the private ones with the demo budget (ε = 5, δ = 1e-6 each).
pub fn register_demo(session: &PrivateSession) -> Result<()> {
    let provider = |b: RecordBatch| -> Result<Arc<datafusion::datasource::MemTable>> {
        Ok(Arc::new(datafusion::datasource::MemTable::try_new(
            b.schema(),
            vec![vec![b]],
        )?))
    };
    session.register_provider(
        "salaries",
        provider(salaries()?)?,
        TableKey::from("demo:salaries".to_string()),
        Registration::private()
            .replace()
            .public_columns(["job"])
            // The contract rgm_mean_by relies on, declared by the owner and checked on the data.
            .ratio_bound("salary", "job", 1.5)
            .budget(5.0, 1e-6)
            // rgm_mean_by records RGM events, which only the rdp filter accepts.
            .filter(FilterKind::Rdp { order: None }),
    )?;
    session.register_provider(
        "patients",
        provider(patients()?)?,
        TableKey::from("demo:patients".to_string()),
        Registration::private()
            .budget(5.0, 1e-6)
            // dp_logreg_agd records zCDP events; dp_mean and dp_linreg_gd Gaussian ones.
            .filter(FilterKind::Zcdp),
    )?;
    session.register_provider(
        "transactions",
        provider(transactions()?)?,
        TableKey::from("demo:transactions".to_string()),
        Registration::private()
            .privacy_unit("customer_id")
            .unit_domain("customer")
            .contribution_bounds(2, 5)
            .budget(5.0, 1e-6),
    )?;
    session.register_provider(
        "stores",
        provider(stores()?)?,
        TableKey::from("demo:stores".to_string()),
        Registration::public(),
    )?;
    Ok(())
}

/// What `\d` says about a demo table (None for other tables).
pub fn describe_demo(name: &str, key: &TableKey) -> Option<String> {
    match key.as_str() {
        "demo:salaries" => Some(format!(
            "built-in demo ({} synthetic rows as '{name}'): 12 jobs whose pay differs by 10x, \
             salaries within a factor 1.5 inside each job; job is public and neighbours replace \
             one row, and the owner declared salary within a factor 1.5 by job, so \
             rgm_mean_by(salary, job, 1.5, ...) applies",
            SALARIES_ROWS
        )),
        "demo:patients" => Some(format!(
            "built-in demo ({} synthetic rows as '{name}'): features age, bmi, bp, chol, smoker; \
             disease (0/1) from a known logistic model, cost from a known linear model",
            PATIENTS_ROWS
        )),
        "demo:transactions" => Some(format!(
            "built-in demo ({} customers' purchases as '{name}'): the privacy unit is \
             customer_id (a neighbour adds or removes a customer with all their rows); rows per \
             customer are heavy-tailed (some have hundreds); join the public table stores on \
             store",
            CUSTOMERS
        )),
        "demo:stores" => Some(format!(
            "built-in demo (public, {STORES} stores as '{name}'): store (unique), region, city"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[test]
    fn salaries_respect_the_declared_shape() {
        let b = salaries().unwrap();
        assert!(b.num_rows() >= 50_000);
        let job = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        let sal = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
        for (name, base) in JOBS {
            let v: Vec<f64> = (0..b.num_rows())
                .filter(|&i| job.value(i) == name)
                .map(|i| sal.value(i))
                .collect();
            assert!(v.len() > 500, "{name}: {}", v.len());
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(0.0, f64::max);
            assert!(hi / lo <= 1.5 + 1e-3, "{name}: {lo}..{hi}");
            assert!(lo > base / 1.3 && hi < base * 1.3);
        }
        assert!(JOBS[11].1 / JOBS[0].1 >= 10.0);
    }

    #[test]
    fn transactions_have_a_heavy_tail_of_rows_per_customer() {
        let t = transactions().unwrap();
        let c = t.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        let mut per = vec![0usize; CUSTOMERS + 1];
        for i in 0..c.len() {
            per[c.value(i) as usize] += 1;
        }
        let max = *per.iter().max().unwrap();
        let over_100 = per.iter().filter(|&&n| n >= 100).count();
        assert!((20_000..60_000).contains(&t.num_rows()), "{}", t.num_rows());
        assert!(
            max >= 300 && over_100 >= 3,
            "max {max}, {over_100} customers ≥ 100 rows"
        );
        assert_eq!(transactions().unwrap(), t);
    }

    #[test]
    fn patients_are_deterministic_and_balanced() {
        let a = patients().unwrap();
        let b = patients().unwrap();
        assert_eq!(a, b);
        let y = a.column(5).as_any().downcast_ref::<Int64Array>().unwrap();
        let pos = (0..y.len()).filter(|&i| y.value(i) == 1).count() as f64 / y.len() as f64;
        assert!((0.3..0.7).contains(&pos), "{pos}");
    }
}
