//! `dp_linreg_gd` through a dpfusion session: fit on a private table, keep the model with
//! CREATE TABLE AS, predict on a public table; what is charged; what is refused.
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use dpfusion::{PrivateSession, Registration, SessionOptions};
use dpfusion_cli::demo::{PATIENTS_LINEAR, patients};
use dpfusion_udfs::optim::model::Model;
use dpfusion_udfs::privacy::{Event, gaussian_mu};

use crate::common::temp_dir;

async fn session(dir: &Path) -> PrivateSession {
    PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(10.0, 1e-6)
            .with_target_partitions(2),
    )
    .await
    .unwrap()
}

/// The demo `patients` rows (20,000; cost = PATIENTS_LINEAR·(1, x) + N(0, 0.5²)), split into
/// two batches so that the plan has several partitions.
fn patient_batches() -> Vec<RecordBatch> {
    let b = patients().unwrap();
    let h = b.num_rows() / 2;
    vec![b.slice(0, h), b.slice(h, b.num_rows() - h)]
}

/// A small public table of new patients to predict for.
fn new_patients() -> RecordBatch {
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
        ("age", Arc::new(Float64Array::from(vec![0.5, -0.5, 0.0]))),
        ("bmi", Arc::new(Float64Array::from(vec![0.2, 0.0, -0.4]))),
        ("bp", Arc::new(Float64Array::from(vec![0.1, -0.3, 0.0]))),
        ("chol", Arc::new(Float64Array::from(vec![0.0, 0.4, -0.2]))),
        ("smoker", Arc::new(Float64Array::from(vec![1.0, 0.0, 0.0]))),
    ];
    RecordBatch::try_from_iter(cols).unwrap()
}

fn truth(b: &RecordBatch, i: usize) -> f64 {
    let names = ["age", "bmi", "bp", "chol", "smoker"];
    PATIENTS_LINEAR[0]
        + names
            .iter()
            .zip(&PATIENTS_LINEAR[1..])
            .map(|(n, w)| {
                let c = b.column_by_name(n).unwrap().as_primitive::<Float64Type>();
                w * c.value(i)
            })
            .sum::<f64>()
}

const FEATURES: &str = "[age, bmi, bp, chol, smoker]";

#[tokio::test]
async fn fit_store_and_predict_on_a_public_table() {
    let dir = temp_dir("fit");
    let s = session(&dir).await;
    s.register_batches("patients", patient_batches(), Registration::private())
        .unwrap();
    s.register_batches("new_patients", vec![new_patients()], Registration::public())
        .unwrap();
    let r = s
        .sql(&format!(
            "CREATE TABLE m AS SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => 1) AS model \
             FROM patients"
        ))
        .await
        .unwrap();
    // What was charged: one Gaussian-DP event with μ = gaussian_mu(1, default δ = 1e-7).
    let receipt = r.receipt.expect("charged");
    let _ = receipt;
    let ledger = s.ledger().unwrap();
    let last = ledger.last().unwrap();
    assert_eq!(
        last.tables[0].events,
        vec![Event::Gaussian {
            mu: gaussian_mu(1.0, 1e-7).unwrap()
        }]
    );
    // The stored model is public: reading it costs nothing.
    let before = s.ledger().unwrap().len();
    let r = s.sql("SELECT model FROM m").await.unwrap();
    let m = Model::from_struct_array(r.batches[0].column(0).as_struct(), 0).unwrap();
    assert_eq!(m.coefficients.len(), 5);
    assert_eq!((m.iterations, m.epsilon, m.delta), (100, 1.0, 1e-7));
    assert_eq!(m.mechanism, "gaussian");
    let w: Vec<f64> = m
        .coefficients
        .iter()
        .chain([&m.intercept])
        .copied()
        .collect();
    let t: Vec<f64> = PATIENTS_LINEAR[1..]
        .iter()
        .chain(&PATIENTS_LINEAR[..1])
        .copied()
        .collect();
    let err = w
        .iter()
        .zip(&t)
        .map(|(a, b)| (a - b).powi(2))
        .sum::<f64>()
        .sqrt()
        / t.iter().map(|b| b * b).sum::<f64>().sqrt();
    assert!(err < 0.05, "relative error {err}: {m:?}");
    // Predict on the public table (post-processing: free).
    let r = s
        .sql(
            "SELECT p.id, linreg_predict(m.model, [p.age, p.bmi, p.bp, p.chol, p.smoker]) AS yhat \
             FROM m CROSS JOIN new_patients p ORDER BY p.id",
        )
        .await
        .unwrap();
    assert_eq!(s.ledger().unwrap().len(), before, "prediction is free");
    let b = &r.batches[0];
    let yhat = b.column(1).as_primitive::<Float64Type>();
    let np = new_patients();
    for i in 0..3 {
        assert!(
            (yhat.value(i) - truth(&np, i)).abs() < 0.2,
            "{i}: {} vs {}",
            yhat.value(i),
            truth(&np, i)
        );
    }
}

#[tokio::test]
async fn group_by_and_named_arguments() {
    let dir = temp_dir("group");
    let s = session(&dir).await;
    s.register_batches("patients", patient_batches(), Registration::private())
        .unwrap();
    // GROUP BY a private column: one model per group that passes partition selection.
    let r = s
        .sql(
            "SELECT smoker, dp_linreg_gd(cost, [age, bmi], epsilon => 2, iterations => 20, \
             fit_intercept => true, clip => 2) AS model FROM patients GROUP BY smoker \
             ORDER BY smoker",
        )
        .await
        .unwrap();
    let b = &r.batches[0];
    assert_eq!(b.num_rows(), 2);
    let models = b.column(1).as_struct();
    for i in 0..2 {
        let m = Model::from_struct_array(models, i).unwrap();
        assert_eq!(m.coefficients.len(), 2);
        assert_eq!(m.iterations, 20);
        // age coefficient 1.5 in both groups (bp correlates with age, so loosely)
        assert!((m.coefficients[0] - 1.5).abs() < 0.6, "{m:?}");
    }
    // The display of the call in the ledger names every parameter.
    let q = s.ledger().unwrap().last().unwrap().query.clone();
    assert!(q.contains("dp_linreg_gd"), "{q}");
}

#[tokio::test]
async fn refusals_cost_nothing_and_read_nothing() {
    let dir = temp_dir("refuse");
    let s = session(&dir).await;
    s.register_batches("patients", patient_batches(), Registration::private())
        .unwrap();
    let cases = [
        // 'rgm' needs a public n (replace neighbours).
        (
            format!(
                "SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => 1, mechanism => 'rgm', \
                 l2 => 0.1) FROM patients"
            ),
            "replace",
        ),
        // parameters must be literals
        (
            format!("SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => age) FROM patients"),
            "literal",
        ),
        (
            format!("SELECT dp_linreg_gd(cost, {FEATURES}, 1, 1e-6, 0) FROM patients"),
            "iterations",
        ),
        (
            format!("SELECT dp_linreg_gd(cost, {FEATURES}, 1, clip => -1) FROM patients"),
            "clip",
        ),
        (
            format!(
                "SELECT dp_linreg_gd(cost, {FEATURES}, 1, mechanism => 'laplace') FROM patients"
            ),
            "mechanism",
        ),
        // non-numeric types
        (
            "SELECT dp_linreg_gd(cost, [CAST(age AS VARCHAR)], 1) FROM patients".to_string(),
            "features",
        ),
        (
            format!("SELECT dp_linreg_gd(CAST(cost AS VARCHAR), {FEATURES}, 1) FROM patients"),
            "label",
        ),
        // raw predictions on private rows are not DP
        (
            "SELECT linreg_predict(named_struct('coefficients', [1.0], 'intercept', 0.0), [age]) \
             FROM patients"
                .to_string(),
            "refused",
        ),
    ];
    for (sql, needle) in &cases {
        let e = s.sql(sql).await.expect_err(sql).to_string();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    assert!(s.ledger().unwrap().is_empty(), "nothing charged");
    assert_eq!(s.scans("patients"), 0, "nothing read");
}

/// Round 52, review "extremes", F1, F2 and the minor items: `dp_logreg_agd` with `clip_grad`
/// 1e-310 looped forever while it planned (EXPLAIN PRIVACY was enough, and no deadline could
/// stop it), and with `clip_obj` 1e-320 its score sums overflowed after the charge. Both, as
/// statements and under EXPLAIN PRIVACY, are refused at planning naming the argument, with
/// the value in exponent form; `dp_sum` at ±f64::MAX names `upper` (not an argument
/// 'sensitivity'). Nothing is charged and nothing read.
#[tokio::test]
async fn extreme_model_and_sum_arguments_are_refused_at_planning() {
    let dir = temp_dir("extremes");
    let s = session(&dir).await;
    let rdp = Registration::private().filter(dpfusion::accounting::FilterKind::Rdp { order: None });
    s.register_batches("patients", patient_batches(), rdp)
        .unwrap();
    let agd = |args: &str| {
        format!(
            "SELECT dp_logreg_agd(smoker, [age], epsilon => 0.5, delta => 1e-7, {args}) AS m \
             FROM patients"
        )
    };
    let cases = [
        (agd("clip_grad => 1e-310"), "'clip_grad': got 1e-310"),
        (agd("clip_grad => 5e-324"), "'clip_grad': got 5e-324"),
        (agd("clip_obj => 1e-320"), "'clip_obj': got 1e-320"),
        (
            "SELECT dp_sum(cost, -1.7976931348623157e308, 1.7976931348623157e308, 1.0) \
             FROM patients"
                .to_string(),
            "'upper': got 1.7976931348623157e308 (lower -1.7976931348623157e308)",
        ),
    ];
    for (sql, needle) in &cases {
        for sql in [sql.clone(), format!("EXPLAIN PRIVACY {sql}")] {
            let e = s.sql(&sql).await.expect_err(&sql).to_string();
            assert!(e.contains(needle), "{sql}: {e}");
            assert!(!e.contains("0.0000") && !e.contains("'sensitivity'"), "{e}");
        }
    }
    assert!(s.ledger().unwrap().is_empty(), "nothing charged");
    assert_eq!(s.scans("patients"), 0, "nothing read");
}

/// A 'replace' table with the rows of `patients` (n public when unfiltered).
#[tokio::test]
async fn rgm_on_a_replace_table() {
    let dir = temp_dir("rgm");
    let s = session(&dir).await;
    s.register_batches(
        "patients",
        patient_batches(),
        // RGM events are accepted by the rdp filter only (docs/ACCOUNTING.md).
        Registration::private()
            .replace()
            .filter(dpfusion::accounting::FilterKind::Rdp { order: None }),
    )
    .unwrap();
    let q = format!(
        "SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => 3, mechanism => 'rgm', l2 => 0.1, \
         feature_bound => 2, label_bound => 10, min_rows => 20000) AS model FROM patients"
    );
    let r = s.sql(&q).await.unwrap();
    let m = Model::from_struct_array(r.batches[0].column(0).as_struct(), 0).unwrap();
    assert_eq!(m.mechanism, "rgm");
    eprintln!("rgm model: {m:?}");
    assert_eq!(m.coefficients.len(), 5);
    let ev = s.ledger().unwrap().last().unwrap().tables[0].events.clone();
    match ev.as_slice() {
        [Event::Rgm { dims, steps, .. }] => assert_eq!((*dims, *steps), (6, 100)),
        other => panic!("{other:?}"),
    }
    // With a WHERE filter n is no longer public: refused at planning, nothing charged.
    let n = s.ledger().unwrap().len();
    let e = s
        .sql(&format!("{} WHERE age > 0", q.trim_end_matches(';')))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("public row count"), "{e}");
    assert_eq!(s.ledger().unwrap().len(), n);
    // Too few rows for min_rows: a NULL model (n is public), charged.
    let r = s
        .sql(&format!(
            "SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => 5, mechanism => 'rgm', l2 => 1, \
             min_rows => 30000) AS model FROM patients"
        ))
        .await
        .unwrap();
    assert!(r.batches[0].column(0).is_null(0));
    // Infeasible targets fail at planning with the ε floor.
    let e = s
        .sql(&format!(
            "SELECT dp_linreg_gd(cost, {FEATURES}, epsilon => 0.01, mechanism => 'rgm', \
             l2 => 0.01, min_rows => 1000) FROM patients"
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("floor"), "{e}");
}

/// The session's named-argument defaults are the UDAF's own.
#[test]
fn named_defaults_match_the_udaf() {
    use dpfusion::statements::named_args::{Default, dp_function_params};
    use dpfusion_udfs::aggregates::dp_linreg_gd::defaults as d;
    let params = dp_function_params("dp_linreg_gd").unwrap();
    let num = |name: &str| -> f64 {
        match params.iter().find(|p| p.name == name).unwrap().default {
            Default::Number(s) => s.parse().unwrap(),
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(num("iterations"), d::ITERATIONS as f64);
    assert_eq!(num("clip"), d::CLIP);
    assert_eq!(num("learning_rate"), d::LEARNING_RATE);
    assert_eq!(num("l2"), d::L2);
    assert_eq!(num("feature_bound"), d::FEATURE_BOUND);
    assert_eq!(num("label_bound"), d::LABEL_BOUND);
    assert_eq!(num("min_rows"), d::MIN_ROWS as f64);
    let names: Vec<&str> = params.iter().map(|p| p.name).collect();
    let mut want = vec!["label", "features"];
    want.extend(
        dpfusion_udfs::aggregates::dp_linreg_gd::DP_LINREG_GD
            .user_params()
            .map(|p| p.name),
    );
    assert_eq!(names, want);
    assert!(matches!(
        params
            .iter()
            .find(|p| p.name == "fit_intercept")
            .unwrap()
            .default,
        Default::Bool(true)
    ));
    assert!(matches!(
        params
            .iter()
            .find(|p| p.name == "mechanism")
            .unwrap()
            .default,
        Default::Text("gaussian")
    ));
}

/// A fit buffers its rows (16 bytes per row and feature plus the label; docs/SQL.md): past the
/// session's memory limit the query fails with the one fixed message, never by exhausting the
/// process's memory, and its charge stands.
#[tokio::test]
async fn a_fit_past_the_memory_limit_fails_with_the_fixed_message() {
    let dir = temp_dir("memlimit");
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(10.0, 1e-6)
            .with_memory_limit(256 * 1024),
    )
    .await
    .unwrap();
    s.register_batches(
        "patients",
        vec![patients().unwrap()],
        Registration::private().replace(),
    )
    .unwrap();
    let e = s
        .sql("SELECT dp_linreg_gd(cost / 100000, [age / 100.0, bmi / 60.0], epsilon => 1.0) FROM patients")
        .await
        .unwrap_err();
    assert!(
        matches!(
            dpfusion::Error::of(&e),
            Some(dpfusion::Error::ExecutionFailed)
        ),
        "{e}"
    );
    assert_eq!(s.budget()[0].queries, 1, "the charge stands");
}

/// Issue 28: a feature list of bare columns is bounded by the schema, not by the query. A table
/// of 52 features (IPUMS-BR's width) fits through SQL with both models; a list past
/// `FEATURE_WIDTH` and a wide list of computed expressions stay refused, charging nothing.
#[tokio::test]
async fn models_of_52_features_fit_through_sql() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    const WIDTH: usize = 52;
    let dir = temp_dir("wide");
    let s = session(&dir).await;
    let n = 2_000usize;
    // x_j(i) in [-1, 1] from a fixed hash; y = 1 when x0 + x1 > 0 (the label), t = x0 − x1.
    let x = |i: usize, j: usize| {
        let h = (i as u64 * 0x9e37_79b9 + j as u64 * 0x85eb_ca6b) % 2_001;
        h as f64 / 1_000.0 - 1.0
    };
    let mut fields = vec![
        Field::new("y", DataType::Int64, false),
        Field::new("t", DataType::Float64, false),
    ];
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            (0..n).map(|i| i64::from(x(i, 0) + x(i, 1) > 0.0)),
        )),
        Arc::new(Float64Array::from_iter_values(
            (0..n).map(|i| x(i, 0) - x(i, 1)),
        )),
    ];
    for j in 0..WIDTH {
        fields.push(Field::new(format!("x{j}"), DataType::Float64, false));
        cols.push(Arc::new(Float64Array::from_iter_values(
            (0..n).map(|i| x(i, j)),
        )));
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    // dp_logreg_agd's zCDP steps: a table accounted with the rdp filter.
    let rdp = Registration::private().filter(dpfusion::accounting::FilterKind::Rdp { order: None });
    s.register_batches("wide", vec![batch], rdp).unwrap();
    let list = |k: usize| {
        (0..k)
            .map(|j| format!("x{}", j % WIDTH))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let features = format!("[{}]", list(WIDTH));
    for (sql, fit) in [
        (
            format!("SELECT dp_logreg_agd(y, {features}, epsilon => 1.6) FROM wide"),
            "dp_logreg_agd",
        ),
        (
            format!(
                "SELECT dp_linreg_gd(t, make_array({}), epsilon => 1, iterations => 20) FROM wide",
                list(WIDTH)
            ),
            "dp_linreg_gd",
        ),
    ] {
        let before = s.ledger().unwrap().len();
        let r = s.sql(&sql).await.unwrap_or_else(|e| panic!("{fit}: {e}"));
        let m = Model::from_struct_array(r.batches[0].column(0).as_struct(), 0).unwrap();
        assert_eq!(m.coefficients.len(), WIDTH, "{fit}");
        assert_eq!(s.ledger().unwrap().len(), before + 1, "{fit}: charged once");
    }
    // Past the width, and a wide list of computed expressions: refused, nothing charged.
    let before = s.ledger().unwrap().len();
    let too_wide = format!(
        "SELECT dp_logreg_agd(y, [{}], epsilon => 1) FROM wide",
        list(1025)
    );
    let e = s.sql(&too_wide).await.unwrap_err().to_string();
    assert!(e.contains("feature list of 1025 columns"), "{e}");
    let computed = format!(
        "SELECT dp_logreg_agd(y, [{}], epsilon => 1) FROM wide",
        (0..40)
            .map(|j| format!("x{j} * 2"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let e = s.sql(&computed).await.unwrap_err().to_string();
    assert!(e.contains("column references"), "{e}");
    assert_eq!(s.ledger().unwrap().len(), before);
}

/// Issue 28: IPUMS-BR (the DP-AGD paper's data set, n = 38,000, d = 52) fitted **through SQL** at
/// ε = 1.6, δ = 1e-8, against docs/UTILITY.md (the kernel at ε = 1.6, 5-fold protocol: 76.84 ±
/// 0.50 % accuracy; the reference "fixed" algorithm 76.19 %; majority 50.63 %, non-private
/// 77.14 %). The protocol of docs/UTILITY.md: min-max scaling to [0, 1] on the whole file, the
/// label last; here one seeded 70/30 split and three fits. The data is not in the repository:
/// the test reads `$DPFUSION_DATA_DIR/IPUMS-BR.dat` and is skipped, with a note, when the
/// variable is unset. Run: `DPFUSION_DATA_DIR=/path/to/data cargo nextest run --test it -E
/// 'test(ipums)' --no-capture`.
#[tokio::test]
async fn ipums_br_accuracy_through_sql() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let Some(dir) = std::env::var_os("DPFUSION_DATA_DIR") else {
        eprintln!(
            "ipums_br_accuracy_through_sql: skipped (set DPFUSION_DATA_DIR to a directory with IPUMS-BR.dat)"
        );
        return;
    };
    let text = std::fs::read_to_string(Path::new(&dir).join("IPUMS-BR.dat")).unwrap();
    let mut rows: Vec<Vec<f64>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    let d = rows[0].len() - 1;
    assert_eq!(d, 52);
    for j in 0..d {
        let lo = rows.iter().map(|r| r[j]).fold(f64::INFINITY, f64::min);
        let hi = rows.iter().map(|r| r[j]).fold(f64::NEG_INFINITY, f64::max);
        for r in rows.iter_mut() {
            r[j] = if hi > lo {
                (r[j] - lo) / (hi - lo)
            } else {
                0.0
            };
        }
    }
    // A seeded shuffle (SplitMix64), then 70 % to fit and 30 % to test.
    let mut state = 0x1234_5678_9abc_def0_u64;
    for i in (1..rows.len()).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        rows.swap(i, ((z ^ (z >> 31)) % (i as u64 + 1)) as usize);
    }
    let (train, test) = rows.split_at(rows.len() * 7 / 10);
    let mut fields = vec![Field::new("y", DataType::Int64, false)];
    let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
        train.iter().map(|r| i64::from(r[d] > 0.5)),
    ))];
    for j in 0..d {
        fields.push(Field::new(format!("x{j}"), DataType::Float64, false));
        cols.push(Arc::new(Float64Array::from_iter_values(
            train.iter().map(|r| r[j]),
        )));
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    let dir = temp_dir("ipums");
    let s = session(&dir).await;
    let reg = Registration::private()
        .filter(dpfusion::accounting::FilterKind::Rdp { order: None })
        .budget(100.0, 1e-6);
    s.register_batches("ipums", vec![batch], reg).unwrap();
    let features = (0..d)
        .map(|j| format!("x{j}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql =
        format!("SELECT dp_logreg_agd(y, [{features}], epsilon => 1.6, delta => 1e-8) FROM ipums");
    let mut acc = vec![];
    for _ in 0..3 {
        let r = s.sql(&sql).await.unwrap();
        let m = Model::from_struct_array(r.batches[0].column(0).as_struct(), 0).unwrap();
        let ok = test
            .iter()
            .filter(|r| {
                let z = m.intercept
                    + m.coefficients
                        .iter()
                        .zip(r.iter())
                        .map(|(w, x)| w * x)
                        .sum::<f64>();
                (z >= 0.0) == (r[d] > 0.5)
            })
            .count();
        acc.push(100.0 * ok as f64 / test.len() as f64);
    }
    let mean = acc.iter().sum::<f64>() / acc.len() as f64;
    eprintln!(
        "IPUMS-BR through SQL, ε = 1.6: accuracy {acc:?} %, mean {mean:.2} % (docs/UTILITY.md: 76.84 ± 0.50)"
    );
    // Within noise of the kernel's 76.84 ± 0.50 (a 70/30 split, three fits: 2 points of slack),
    // far above the majority class (50.63 %).
    assert!(mean > 74.8, "mean accuracy {mean:.2} %");
}
