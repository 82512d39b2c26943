//! Issue 29, the budget's numbers through a session: a receipt shows the request as written
//! (its ε is the call's ε), the cost as a share of the budget and what is left; every budget
//! number is printed with at most six significant digits; a private GROUP BY spends the
//! default selection δ (δ_sel/1000), so GROUP BYs fit by the thousand; a δ refusal names the
//! `delta =>` that fits.
use std::path::Path;

use dpfusion::accounting::display::SHARE_SCALE;
use dpfusion::{PrivateSession, Registration, SessionOptions};

use crate::common::{people_csv, temp_dir};

async fn session(dir: &Path, eps: f64, delta: f64) -> PrivateSession {
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(eps, delta)
            .with_target_partitions(2),
    )
    .await
    .unwrap();
    s.register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    s
}

/// Every number in `text` has at most six significant digits.
fn six_digits_at_most(text: &str) {
    for token in text.split(|c: char| !(c.is_ascii_digit() || c == '.')) {
        let digits: String = token
            .trim_start_matches(['0', '.'])
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        assert!(
            digits.len() <= 6,
            "{token}: more than six significant digits in: {text}"
        );
    }
}

#[tokio::test]
async fn a_receipt_shows_the_request_and_the_share_used() {
    let dir = temp_dir("receipt");
    let s = session(&dir, 1.0, 1e-6).await;
    let r = s
        .sql("SELECT dp_mean(age, 0, 100, epsilon => 0.5) FROM people")
        .await
        .unwrap();
    let receipt = r.receipt.expect("charged");
    let t = &receipt.tables[0];
    // The request as written: the ε is the call's, never a conversion.
    assert_eq!(t.requests.len(), 1);
    assert_eq!(t.requests[0].function, "dp_mean");
    assert_eq!(t.requests[0].epsilon, Some(0.5));
    assert_eq!(t.requests[0].delta, Some(1e-7));
    assert_eq!(t.requests[0].mechanism, "gaussian");
    assert_eq!(t.native.unit, "μ²");
    assert!(t.native.share > 0 && t.native.share == t.native.used_share);
    assert_eq!(t.left_share, SHARE_SCALE - t.native.share);
    let line = dpfusion::statements::receipt_line(&receipt);
    assert!(
        line.starts_with("charged people: dp_mean(ε 0.5, δ 1e-7, gaussian) cost "),
        "{line}"
    );
    assert!(line.contains("% of the budget (μ² ") && line.contains("% left"));
    six_digits_at_most(&line);
    // The same numbers in SHOW BUDGET and in the ledger.
    let b = s.budget();
    assert_eq!(b[0].native.used_share, t.native.used_share);
    let l = s.ledger().unwrap();
    assert_eq!(l[0].tables[0].requests, t.requests);
    assert_eq!(
        l[0].tables[0].native.as_ref().unwrap().share,
        t.native.share
    );
    // A refusal names the limit and the fix, in six digits.
    let e = s
        .sql("SELECT dp_mean(age, 0, 100, epsilon => 3) FROM people")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("limit: the ε part of its gdp filter")
            && e.contains("asked: dp_mean(ε 3, δ 1e-7, gaussian)")
            && e.contains("Lower `epsilon =>` to at most "),
        "{e}"
    );
    six_digits_at_most(&e);
    // The ε of the fix is admitted.
    let fix: f64 = e
        .split("Lower `epsilon =>` to at most ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    let ok = s
        .sql(&format!(
            "SELECT dp_mean(age, 0, 100, epsilon => {fix}) FROM people"
        ))
        .await;
    assert!(ok.is_ok(), "{fix}: {:?}", ok.err());
}

#[tokio::test]
async fn group_bys_spend_the_default_selection_delta() {
    let dir = temp_dir("groupby");
    let s = session(&dir, 1.0, 1e-6).await;
    // δ_sel = 5e-7: each selection is calibrated for δ = 1e-9 and spends 5e-10.
    let q = "SELECT dept, dp_count(age, epsilon => 0.01) FROM people GROUP BY dept";
    let ex = s.sql(&format!("EXPLAIN PRIVACY {q}")).await.unwrap();
    let text = format!(
        "{}",
        datafusion::arrow::util::pretty::pretty_format_batches(&ex.batches).unwrap()
    );
    assert!(
        text.contains(
            "partition selection of the GROUP BY keys (noisy count ≥ threshold, ε = 0.01, δ = 1e-9)"
        ),
        "{text}"
    );
    for _ in 0..20 {
        s.sql(q).await.unwrap();
    }
    let b = &s.budget()[0];
    assert_eq!(b.queries, 20);
    assert!(
        (b.delta_spent - 20.0 * 5e-10).abs() < 1e-20,
        "{:e}",
        b.delta_spent
    );
    // 980 more would fit on the δ side (the accountant's unit test runs 1,000).
    assert!(
        b.delta_left >= 980.0 * 5e-10 * (1.0 - 1e-12),
        "{:e}",
        b.delta_left
    );
}

#[tokio::test]
async fn the_selection_delta_follows_the_tables_delta_unless_a_call_names_one() {
    let dir = temp_dir("delta");
    // δ_B = 1e-8: δ_sel = 5e-9, so a default selection spends at most 5e-12 and is calibrated
    // for 1e-11.
    let s = session(&dir, 50.0, 1e-8).await;
    let explain = |q: String| {
        let s = &s;
        async move {
            let ex = s.sql(&format!("EXPLAIN PRIVACY {q}")).await.unwrap();
            format!(
                "{}",
                datafusion::arrow::util::pretty::pretty_format_batches(&ex.batches).unwrap()
            )
        }
    };
    let q = "SELECT dept, dp_count(age, epsilon => 1) FROM people GROUP BY dept";
    let text = explain(q.to_string()).await;
    assert!(text.contains("ε = 1, δ = 1e-11)"), "{text}");
    s.sql(q).await.unwrap();
    assert_eq!(s.budget()[0].delta_spent, 5e-12);
    // A call that names its δ chooses the selection's δ (uncapped; it spends δ/2).
    let named = "SELECT dept, dp_count(age, epsilon => 1, delta => 2e-9) FROM people GROUP BY dept";
    let text = explain(named.to_string()).await;
    assert!(text.contains("ε = 1, δ = 2e-9)"), "{text}");
    // On δ: 5e-9 − 5e-12 is left, a selection at 2e-9 spends 1e-9: four fit, the fifth's
    // refusal names the `delta =>` that fits.
    for _ in 0..4 {
        s.sql(named).await.unwrap();
    }
    let e = s.sql(named).await.unwrap_err().to_string();
    assert!(
        e.contains("limit: the δ reserved for partition selection")
            && e.contains("lower `delta =>` to 1.9"),
        "{e}"
    );
}

/// SHOW BUDGET's row of `people`, column by column, as text (CSV's full precision).
async fn show_budget(s: &PrivateSession) -> std::collections::HashMap<String, String> {
    use datafusion::arrow::util::display::array_value_to_string;
    let r = s.sql("SHOW BUDGET").await.unwrap();
    let b = &r.batches[0];
    b.schema()
        .fields()
        .iter()
        .zip(b.columns())
        .map(|(f, c)| (f.name().clone(), array_value_to_string(c, 0).unwrap()))
        .collect()
}

/// Round 47, review "newuser2", A: the next ε a session shows is computed at its own
/// `dpfusion.default_delta`, so a default query at the number shown is admitted, and the
/// receipt says at which δ; the δ refusal never suggests the session's default (a `delta =>`
/// equal to it counts as not written), and what it suggests does what it says.
#[tokio::test]
async fn next_epsilon_and_the_delta_fix_follow_the_sessions_default_delta() {
    let dir = temp_dir("r47-default-delta");
    let s = session(&dir, 5.0, 1e-6).await;
    s.sql("SET dpfusion.default_delta = 4e-7").await.unwrap();
    let next = show_budget(&s).await["remaining_epsilon"].clone();
    let r = s
        .sql(&format!(
            "SELECT dp_count(age, epsilon => {next}) AS n FROM people"
        ))
        .await
        .unwrap_or_else(|e| panic!("a default query at the next ε shown ({next}): {e}"));
    let receipt = r.receipt.expect("charged");
    assert_eq!(receipt.tables[0].next_epsilon_delta, 4e-7);
    let line = dpfusion::statements::receipt_line(&receipt);
    assert!(line.contains("(Gaussian, δ 4e-7)"), "{line}");

    let dir = temp_dir("r47-default-delta-fix");
    let s = session(&dir, 50.0, 1e-6).await;
    s.sql("SET dpfusion.default_delta = 1e-8").await.unwrap();
    // δ_sel = 5e-7; a selection at 9.9e-7 spends 4.95e-7, about 5e-9 is left.
    s.sql(
        "SELECT dept, dp_count(age, epsilon => 0.1, delta => 9.9e-7) AS n FROM people \
         GROUP BY dept",
    )
    .await
    .unwrap();
    let e = s
        .sql(
            "SELECT dept, dp_count(age, epsilon => 0.1, delta => 2e-8) AS n FROM people \
             GROUP BY dept",
        )
        .await
        .unwrap_err()
        .to_string();
    let at = e
        .find("lower `delta =>` to ")
        .unwrap_or_else(|| panic!("{e}"));
    let fix = e[at + "lower `delta =>` to ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_ne!(
        fix.parse::<f64>().unwrap(),
        1e-8,
        "the session's default: {e}"
    );
    // Written, it names the selection's δ (not capped as a default one would be).
    let q = format!(
        "SELECT dept, dp_count(age, epsilon => 0.1, delta => {fix}) AS n FROM people GROUP BY dept"
    );
    let ex = s.sql(&format!("EXPLAIN PRIVACY {q}")).await.unwrap();
    let text = format!(
        "{}",
        datafusion::arrow::util::pretty::pretty_format_batches(&ex.batches).unwrap()
    );
    assert!(
        text.contains(&format!("ε = 0.1, δ = {fix})")),
        "{fix}: {text}"
    );
    s.sql(&q).await.unwrap_or_else(|e| panic!("{q}: {e}"));
}

/// Round 47, review "newuser2", B and C: spent up to the next ε shown, SHOW BUDGET and the ε
/// refusal never show `used` at or above a budget that is not used up, nor 100% used; the
/// refusal shows the budget as the owner wrote it (`1.0000001`, not `1`).
#[tokio::test]
async fn used_stays_below_an_unspent_budget_and_budgets_show_as_written() {
    let dir = temp_dir("r47-used-below");
    let s = session(&dir, 1.0000001, 1.0000001e-6).await;
    for _ in 0..2 {
        let next = show_budget(&s).await["remaining_epsilon"].clone();
        if next.parse::<f64>().unwrap() == 0.0 {
            break;
        }
        s.sql(&format!(
            "SELECT dp_count(age, epsilon => {next}) AS n FROM people"
        ))
        .await
        .unwrap();
    }
    let row = s.budget().remove(0);
    let shown = show_budget(&s).await;
    let f = |c: &str| shown[c].parse::<f64>().unwrap();
    assert_eq!((f("epsilon"), f("delta")), (1.0000001, 1.0000001e-6));
    if row.native.used < row.native.budget {
        assert!(
            row.native.used <= f("used") && f("used") < f("budget"),
            "{shown:?} {row:?}"
        );
        assert!(f("budget") <= row.native.budget);
        assert!(f("used_pct") < 100.0 && f("left_pct") > 0.0, "{shown:?}");
    }
    let e = s
        .sql("SELECT dp_count(age, epsilon => 0.5) AS n FROM people")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("ε = 1.0000001 at δ = "), "{e}");
    let at = e.find(" is left (").unwrap_or_else(|| panic!("{e}"));
    let mut words = e[at + " is left (".len()..].split_whitespace();
    let x: f64 = words.next().unwrap().parse().unwrap();
    assert_eq!(words.next(), Some("of"));
    let y: f64 = words.next().unwrap().parse().unwrap();
    if row.native.used < row.native.budget {
        assert!(x < y, "{e}");
        assert!(!e.contains("and 0% is left"), "{e}");
    }
}

/// A session over `people` with `reg`'s policy, most of whose budget one Gaussian dp_count has
/// spent (0.9 × the next ε SHOW BUDGET shows, so that about a fifth is left).
async fn nearly_spent(dir: &Path, reg: Registration) -> PrivateSession {
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_target_partitions(2),
    )
    .await
    .unwrap();
    s.register_csv("people", people_csv(), reg).await.unwrap();
    let next: f64 = show_budget(&s).await["remaining_epsilon"].parse().unwrap();
    s.sql(&format!(
        "SELECT dp_count(age, epsilon => {}) AS n FROM people",
        0.9 * next
    ))
    .await
    .unwrap();
    s
}

/// The ε of "Lower `epsilon =>` to at most X (the most this call can use now)" in `e`.
fn fix_epsilon(e: &str) -> f64 {
    let at = e
        .find("Lower `epsilon =>` to at most ")
        .unwrap_or_else(|| panic!("no ε fix: {e}"));
    let rest = &e[at + "Lower `epsilon =>` to at most ".len()..];
    assert!(rest.contains("(the most this call can use now)"), "{e}");
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// Round 48, review "docsuser", F1: a refused call of any mechanism (a pure-DP quantile at
/// 8192 bins, a Laplace count, the models: Gaussian, zCDP, Poisson-subsampled DP-SGD, and the
/// relative Gaussian mechanism) is told the most ε it can use now, found on the admission rule
/// for its own mechanism, not the Gaussian default query's: written as shown, it is admitted,
/// and 1% more is refused.
#[tokio::test]
async fn r48_the_epsilon_fix_of_one_call_of_any_mechanism_is_admitted_as_written() {
    use dpfusion::accounting::FilterKind;
    let rdp = FilterKind::Rdp { order: None };
    let cases: Vec<(&str, Registration, &str)> = vec![
        (
            "median",
            Registration::private()
                .budget(1.0, 1e-6)
                .filter(FilterKind::Zcdp),
            "SELECT dp_median(salary, 0, 200000, {e}, bins => 8192) AS m FROM people",
        ),
        (
            "laplace",
            Registration::private()
                .budget(1.0, 1e-6)
                .filter(FilterKind::Zcdp),
            "SELECT dp_count(age, epsilon => {e}, mechanism => 'laplace') AS n FROM people",
        ),
        (
            "linreg",
            Registration::private().budget(1.0, 1e-6),
            "SELECT dp_linreg_gd(salary / 100000, [age / 100], epsilon => {e}) AS m FROM people",
        ),
        (
            "logreg",
            Registration::private()
                .budget(1.0, 1e-6)
                .filter(FilterKind::Zcdp),
            "SELECT dp_logreg_agd(CAST(remote AS DOUBLE), [age / 100], epsilon => {e}) AS m \
             FROM people",
        ),
        (
            "sgd",
            Registration::private().budget(1.0, 1e-6).filter(rdp),
            "SELECT dp_linreg_sgd(salary / 100000, [age / 100], epsilon => {e}, steps => 100) \
             AS m FROM people",
        ),
        (
            "rgm",
            Registration::private()
                .budget(200.0, 1e-6)
                .filter(rdp)
                .replace()
                .public_columns(["dept"])
                .ratio_bound("salary", "dept", 1.6),
            "SELECT rgm_mean_by(salary, dept, 1.6, epsilon => {e}, min_group_size => 50) AS m \
             FROM people",
        ),
    ];
    for (name, reg, q) in cases {
        let dir = temp_dir(&format!("r48-fix-{name}"));
        let s = nearly_spent(&dir, reg).await;
        let at = |e: f64| q.replace("{e}", &e.to_string());
        let budget: f64 = show_budget(&s).await["epsilon"].parse().unwrap();
        let e = s.sql(&at(budget)).await.unwrap_err().to_string();
        assert!(!e.contains("one Gaussian call"), "{name}: {e}");
        let fix = fix_epsilon(&e);
        // 1% more is refused (a refusal charges nothing), the number as written is admitted.
        let more = s.sql(&at(fix * 1.01)).await.unwrap_err().to_string();
        assert!(more.contains("limit: the ε part"), "{name}: {more}");
        let used = s.budget()[0].queries;
        s.sql(&at(fix))
            .await
            .unwrap_or_else(|e| panic!("{name}: the fix {fix} as written: {e}"));
        assert_eq!(s.budget()[0].queries, used + 1, "{name}");
    }
}

/// Round 48, review "docsuser", F7: `dp_budget('t')` gives t's row only (the argument was
/// ignored, while the docs used `dp_budget('people')`); `dp_budget()` every private table's.
/// A name that is no private table's (unknown, or public) is refused naming it and the
/// private tables there are; a non-string or a second argument is refused saying the form.
#[tokio::test]
async fn r48_dp_budget_of_a_table_is_that_tables_row() {
    use datafusion::arrow::array::{Array, StringArray};
    let dir = temp_dir("r48-dp-budget");
    let s = session(&dir, 1.0, 1e-6).await;
    s.register_csv("depts", crate::common::depts_csv(), Registration::public())
        .await
        .unwrap();
    s.register_csv(
        "others",
        crate::common::purchases_csv(),
        Registration::private(),
    )
    .await
    .unwrap();
    let tables = |sql: &'static str| {
        let s = &s;
        async move {
            let r = s.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            let mut names = Vec::new();
            for b in &r.batches {
                let c = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap()
                    .clone();
                names.extend((0..c.len()).map(|i| c.value(i).to_string()));
            }
            names
        }
    };
    assert_eq!(
        tables("SELECT \"table\" FROM dp_budget() ORDER BY 1").await,
        ["others", "people"]
    );
    assert_eq!(
        tables("SELECT \"table\" FROM dp_budget('people')").await,
        ["people"]
    );
    assert_eq!(
        tables("SELECT \"table\" FROM dp_budget('others')").await,
        ["others"]
    );
    for (q, says) in [
        (
            "SELECT * FROM dp_budget('nobody')",
            vec![
                "dp_budget('nobody')",
                "no private table is named 'nobody'",
                "'others', 'people'",
            ],
        ),
        (
            "SELECT * FROM dp_budget('depts')",
            vec![
                "no private table is named 'depts'",
                "a public table has no budget",
            ],
        ),
        (
            "SELECT * FROM dp_budget(1)",
            vec![
                "dp_budget takes no argument",
                "one table's name as a string",
            ],
        ),
        (
            "SELECT * FROM dp_budget('people', 'others')",
            vec!["dp_budget takes no argument", "got 2 arguments"],
        ),
    ] {
        let e = s.sql(q).await.unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(dpfusion::Error::of(&e), Some(dpfusion::Error::Refused(_))),
            "{q}: {m}"
        );
        for w in says {
            assert!(m.contains(w), "{q}: {w}: {m}");
        }
    }
}

/// Round 48, review "fixudfs", F1: one call charged to two private tables (a join on their
/// unit) is told the most ε that fits both: the first table's fix was refused by the second.
#[tokio::test]
async fn r48_the_epsilon_fix_of_a_call_charged_to_two_tables_fits_both() {
    let dir = temp_dir("r48-fix-join");
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_target_partitions(2),
    )
    .await
    .unwrap();
    let unit = || {
        Registration::private()
            .budget(1.0, 1e-6)
            .privacy_unit("id")
            .unit_domain("person")
    };
    // Two files (one file under two names is one table to the ledger).
    for t in ["a", "b"] {
        let path = dir.join(format!("{t}.csv"));
        std::fs::copy(people_csv(), &path).unwrap();
        s.register_csv(t, &path, unit()).await.unwrap();
    }
    // b has less left than a.
    s.sql("SELECT dp_count(age, epsilon => 0.6) AS n FROM b")
        .await
        .unwrap();
    let q = |e: f64| {
        format!("SELECT dp_count(a.age, epsilon => {e}) AS n FROM a JOIN b ON a.id = b.id")
    };
    let e = s.sql(&q(3.0)).await.unwrap_err().to_string();
    let fix = fix_epsilon(&e);
    s.sql(&q(fix))
        .await
        .unwrap_or_else(|e| panic!("the fix {fix} was refused: {e}"));
}

/// The string column `name` of `batches`, NULL as None.
fn string_column(
    batches: &[datafusion::arrow::array::RecordBatch],
    name: &str,
) -> Vec<Option<String>> {
    use datafusion::arrow::array::{Array, StringArray};
    let mut out = Vec::new();
    for b in batches {
        let c = b
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"))
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        out.extend((0..c.len()).map(|i| (!c.is_null(i)).then(|| c.value(i).to_string())));
    }
    out
}

/// A session with one file (people) registered private under the names `a` and `a2` (one
/// table, one budget: docs/CATALOG.md), with a privacy unit, and private `b`, another file.
async fn one_file_two_names(dir: &Path) -> PrivateSession {
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_target_partitions(2),
    )
    .await
    .unwrap();
    let unit = || {
        Registration::private()
            .budget(3.0, 1e-6)
            .privacy_unit("id")
            .unit_domain("person")
    };
    let path = dir.join("people.csv");
    std::fs::copy(people_csv(), &path).unwrap();
    for name in ["a", "a2"] {
        s.register_csv(name, &path, unit()).await.unwrap();
    }
    let other = dir.join("b.csv");
    std::fs::copy(people_csv(), &other).unwrap();
    s.register_csv("b", &other, Registration::private())
        .await
        .unwrap();
    s
}

/// Round 49 (review composition, F3): one file registered under two names is one table with one
/// budget, and every budget surface kept only the name registered last: `SHOW BUDGET` and
/// `dp_budget()` listed `a2` only, `dp_budget('a')` was refused, a query on `a` printed
/// `charged a2`. Now every name has its row (the same numbers, `same_budget_as` naming the
/// others: one budget, counted once), `dp_budget('a')` is `a`'s row, and the receipt, the
/// ledger's charge and a refusal name the table as the query wrote it.
#[tokio::test]
async fn r49_one_file_under_two_names_shows_its_budget_under_each() {
    use dpfusion::statements::receipt_line;
    let dir = temp_dir("r49-two-names");
    let s = one_file_two_names(&dir).await;
    let r = s
        .sql("SELECT dp_count(age, epsilon => 0.1) AS n FROM a")
        .await
        .unwrap();
    let receipt = r.receipt.expect("charged");
    assert_eq!(receipt.tables.len(), 1);
    assert_eq!(receipt.tables[0].name, "a");
    assert!(receipt.tables[0].also_read_as.is_empty());
    let line = receipt_line(&receipt);
    assert!(line.starts_with("charged a: dp_count(ε 0.1"), "{line}");
    assert_eq!(r.tables, ["a"]);
    let charged = receipt.tables[0].native.used_share;
    // SHOW BUDGET and dp_budget(): a row under each name, the same numbers, marked as one.
    for q in ["SHOW BUDGET", "SELECT * FROM dp_budget()"] {
        let b = s.sql(q).await.unwrap().batches;
        assert_eq!(
            string_column(&b, "table"),
            [Some("a".into()), Some("a2".into()), Some("b".into())],
            "{q}"
        );
        assert_eq!(
            string_column(&b, "same_budget_as"),
            [Some("a2".into()), Some("a".into()), None],
            "{q}"
        );
    }
    let rows = s.budget();
    let a = rows.iter().find(|r| r.name == "a").expect("a's row");
    let a2 = rows.iter().find(|r| r.name == "a2").expect("a2's row");
    assert_eq!(a.key, a2.key);
    assert_eq!((a.native.used_share, a.queries), (charged, 1));
    assert_eq!((a2.native.used_share, a2.queries), (charged, 1));
    // dp_budget('a'): a's row, which says it is a2's budget too.
    let b = s
        .sql("SELECT * FROM dp_budget('a')")
        .await
        .unwrap_or_else(|e| panic!("dp_budget('a'): {e}"))
        .batches;
    assert_eq!(string_column(&b, "table"), [Some("a".into())]);
    assert_eq!(string_column(&b, "same_budget_as"), [Some("a2".into())]);
    // The ledger's charge names `a` too.
    let ledger = s.ledger().unwrap();
    assert_eq!(ledger.last().unwrap().tables[0].name, "a");
    // Both names in one statement (a self-join on the unit: charged once): named by both.
    let r = s
        .sql("SELECT dp_count(x.age, epsilon => 0.1) AS n FROM a x JOIN a2 y ON x.id = y.id")
        .await
        .unwrap();
    let receipt = r.receipt.expect("charged");
    assert_eq!(receipt.tables.len(), 1, "one table, charged once");
    assert_eq!(receipt.tables[0].name, "a");
    assert_eq!(receipt.tables[0].also_read_as, ["a2"]);
    let line = receipt_line(&receipt);
    assert!(
        line.starts_with("charged a (also read as a2: one table, one budget): dp_count("),
        "{line}"
    );
    // EXPLAIN PRIVACY's total row, and a refusal, name it as written.
    let b = s
        .sql("EXPLAIN PRIVACY SELECT dp_count(age, epsilon => 0.1) AS n FROM a")
        .await
        .unwrap()
        .batches;
    let release = string_column(&b, "release");
    assert_eq!(
        release.last().unwrap().as_deref(),
        Some("total for table 'a'")
    );
    assert!(
        string_column(&b, "table")
            .iter()
            .all(|t| t.as_deref() == Some("a")),
        "{b:?}"
    );
    let e = s
        .sql("SELECT dp_count(age, epsilon => 1000) AS n FROM a")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("budget exceeded for table 'a'"), "{e}");
}

/// Round 49 (review composition, F4): a statement that failed after its admission showed no
/// receipt, though its charge stands. Its admission puts the receipt in the statement's slot
/// (`ReceiptSlot`), which the front ends read: what was charged, the share used and what is
/// left, the numbers the budget then shows; the error is the one fixed message, unchanged.
#[tokio::test]
async fn r49_a_statement_that_fails_after_admission_keeps_its_receipt() {
    use dpfusion::accounting::ReceiptSlot;
    use dpfusion::session::EXECUTION_FAILED;
    let dir = temp_dir("r49-failed-receipt");
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_memory_limit(1),
    )
    .await
    .unwrap();
    s.register_csv(
        "people",
        people_csv(),
        Registration::private().budget(10.0, 1e-6),
    )
    .await
    .unwrap();
    let slot = ReceiptSlot::default();
    let e = slot
        .scope(s.sql("SELECT id, dp_count(age, 1.0) AS n FROM people GROUP BY id"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            dpfusion::Error::of(&e),
            Some(dpfusion::Error::ExecutionFailed)
        ),
        "{e}"
    );
    assert_eq!(e.to_string(), format!("External error: {EXECUTION_FAILED}"));
    let receipt = slot.take().expect("admitted: its receipt");
    assert_eq!(receipt.tables[0].name, "people");
    assert_eq!(receipt.table_names(), ["people"]);
    let t = &receipt.tables[0];
    assert_eq!(t.requests[0].function, "dp_count");
    assert!(
        t.requests
            .iter()
            .any(|r| r.function == "partition_selection")
    );
    let ledger = s.ledger().unwrap();
    assert_eq!(ledger.len(), 1, "the charge stands");
    let recorded = ledger[0].tables[0].native.as_ref().unwrap();
    assert_eq!(
        (t.native.share, t.native.used_share),
        (recorded.share, recorded.used_share)
    );
    let row = &s.budget()[0];
    assert_eq!(row.native.used_share, t.native.used_share);
    assert_eq!(t.left_share, SHARE_SCALE - row.native.used_share);
    // A statement refused before admission leaves its slot empty.
    let refused = ReceiptSlot::default();
    assert!(
        refused
            .scope(s.sql("SELECT age FROM people"))
            .await
            .is_err()
    );
    assert!(refused.take().is_none());
}

/// Round 49, review "newuser" F1: SHOW BUDGET, `dp_budget()` and `PrivateSession::budget` show
/// the tables this session serves. A second session on the same ledger, with its own `people`
/// (another file) and a table of the first's it does not register, listed both of the first's
/// tables too, one of them under the same name as its own, with nothing to tell them apart.
#[tokio::test]
async fn r49_budget_displays_show_the_sessions_own_tables() {
    let dir = temp_dir("r49-served");
    let ledger = dir.join("ledger.jsonl");
    let open = || async {
        PrivateSession::open(SessionOptions::default().with_ledger(&ledger))
            .await
            .unwrap()
    };
    let other = dir.join("other.csv");
    std::fs::copy(people_csv(), &other).unwrap();
    let first = open().await;
    first
        .register_csv("people", people_csv(), Registration::private())
        .await
        .unwrap();
    first
        .register_csv("staff", &other, Registration::private())
        .await
        .unwrap();
    first
        .sql("SELECT dp_count(age, epsilon => 0.1) AS n FROM staff")
        .await
        .unwrap();
    drop(first);
    // The second session: its `people` is the first's `staff` file; the first's people file
    // is not registered.
    let second = open().await;
    second
        .register_csv("people", &other, Registration::private())
        .await
        .unwrap();
    for q in ["SHOW BUDGET", "SELECT * FROM dp_budget()"] {
        let b = second.sql(q).await.unwrap().batches;
        assert_eq!(string_column(&b, "table"), [Some("people".into())], "{q}");
    }
    let rows = second.budget();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].name, "people");
    assert_eq!(
        rows[0].queries, 1,
        "the file's own charge, made under another name"
    );
}
