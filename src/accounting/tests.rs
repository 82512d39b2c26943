use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;

fn temp_ledger() -> crate::testdir::TestPath {
    crate::testdir::test_file("accounting", "sub/ledger.jsonl")
}

/// A test's ledger, its head and its witness (beside the ledger's directory) are all under the
/// temporary root, and go with it (src/testdir.rs): a test run leaves nothing behind.
#[test]
fn a_test_ledger_and_its_witness_are_removed_with_the_test_directory() {
    let path = temp_ledger();
    let root = path
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let witness = default_witness(&path).unwrap();
    {
        // As a session opens it: with its default witness.
        let acc = Accountant::open_witnessed(&path, &witness).unwrap();
        acc.register_table(private("t:a", "a", 1.0)).unwrap();
        acc.admit("q", &gauss("t:a", 0.1)).unwrap();
    }
    assert!(witness.exists(), "{}", witness.display());
    assert!(
        witness.starts_with(&root),
        "{} outside {}",
        witness.display(),
        root.display()
    );
    drop(path);
    assert!(!root.exists(), "{} removed", root.display());
}

/// A private add/remove policy with a gdp filter (shared with the policy module's tests).
pub(super) fn private(key: &str, name: &str, epsilon: f64) -> TablePolicy {
    TablePolicy {
        key: TableKey::from(key),
        name: name.to_string(),
        visibility: Visibility::Private,
        neighbours: Neighbours::AddRemove,
        public_columns: Vec::new(),
        budget: Budget {
            epsilon,
            delta: 1e-6,
        },
        filter: FilterKind::Gdp,
        delta_share: DEFAULT_DELTA_SHARE,
        schema: None,
        format: None,
        relaxed: None,
        unit: None,
    }
}

fn gauss(key: &str, mu: f64) -> Vec<TableCharge> {
    vec![TableCharge {
        key: TableKey::from(key),
        events: vec![Event::Gaussian { mu }],
    }]
}

fn rows_budget(epsilon: f64) -> Budget {
    Budget {
        epsilon,
        delta: 1e-6,
    }
}

fn file_len(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

fn append_raw(p: &Path, bytes: &str) {
    let mut f = OpenOptions::new().append(true).open(p).unwrap();
    f.write_all(bytes.as_bytes()).unwrap();
}

/// Admits `Gaussian{mu}` charges until refused; returns the receipts.
fn exhaust(acc: &Accountant, key: &str, mu: f64) -> Vec<Receipt> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        match acc.admit("SELECT dp_count(*) FROM t", &gauss(key, mu)) {
            Ok(r) => out.push(r),
            Err(AccountingError::BudgetExceeded { .. }) => return out,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("never exhausted");
}

#[test]
fn exceeded_message_format() {
    let request = CallRequest {
        key: TableKey::from("demo:salaries"),
        function: "dp_mean".into(),
        epsilon: Some(0.5),
        delta: Some(1e-7),
        mechanism: "gaussian".into(),
    };
    let e = AccountingError::BudgetExceeded {
        table: "salaries".into(),
        key: TableKey::from("demo:salaries"),
        cost: 0.3,
        spent: 0.9,
        remaining: 0.1,
        budget: Budget {
            epsilon: 1.0,
            delta: 1e-6,
        },
        why: Box::new(Refusal {
            filter: FilterKind::Gdp,
            limit: Limit::Epsilon,
            delta: DeltaState {
                cost: 0.0,
                spent: 0.0,
                reserved: 5e-7,
                delta_g: 5e-7,
            },
            numbers: RefusalNumbers {
                requests: vec![request.clone()],
                native: NativeCost {
                    unit: "μ²".into(),
                    cost: 0.0123456789,
                    used: 0.2,
                    budget: 0.21,
                    share: 58_789,
                    used_share: 952_381,
                },
                next_epsilon: 0.1234567,
                default_delta: DEFAULT_QUERY_DELTA,
                fix_epsilon: Some(0.2345678),
                other_mechanisms: false,
                refused_mechanisms: vec![],
                accepting_filters: vec![],
                recorded: true,
            },
        }),
    };
    assert_eq!(
        e.to_string(),
        "budget exceeded for table 'salaries' (limit: the ε part of its gdp filter, ε = 1 at \
         δ = 5e-7) (asked: dp_mean(ε 0.5, δ 1e-7, gaussian)): this query needs 5.8789% of the \
         budget (μ² 0.0123457) and 4.7619% is left (0.2 of 0.21 used). Lower `epsilon =>` to at \
         most 0.234567 (the most this call can use now), or ask the data owner for a larger \
         budget (the catalog's `epsilon`/`delta` of the table, or --epsilon/--delta in \
         single-user mode)."
    );
    let mk = |limit: Limit, filter: FilterKind| AccountingError::BudgetExceeded {
        table: "t".into(),
        key: TableKey::from("demo:t"),
        cost: 0.3,
        spent: 0.9,
        remaining: 0.1,
        budget: Budget {
            epsilon: 1.0,
            delta: 1e-6,
        },
        why: Box::new(Refusal {
            filter,
            limit,
            delta: DeltaState {
                cost: 2e-7,
                spent: 4e-7,
                reserved: 5e-7,
                delta_g: 5e-7,
            },
            numbers: RefusalNumbers {
                accepting_filters: vec![FilterKind::Zcdp, FilterKind::Rdp { order: None }],
                ..RefusalNumbers::default()
            },
        }),
    };
    let d = mk(Limit::Delta, FilterKind::Gdp).to_string();
    assert!(
        d.contains("limit: the δ reserved for partition selection, 5e-7 of the table's δ = 1e-6")
            && d.contains("needs δ = 2e-7, 4e-7 is spent and 1e-7 is left")
            && d.contains("lower `delta =>` to 2e-7 or less")
            && d.contains("group by public columns")
            && d.contains("larger `delta_share`"),
        "{d}"
    );
    let m = mk(
        Limit::Mechanism {
            mechanism: filter::mechanism_name(&Event::Zcdp { rho: 0.1 }),
            earlier: false,
        },
        FilterKind::Gdp,
    )
    .to_string();
    // Only surfaces that exist: SQL cannot set a table's filter.
    assert!(
        m.contains("accounted with the gdp filter")
            && m.contains("zCDP")
            && m.contains("`filter = \"zcdp\"` in the catalog")
            && m.contains("--filter zcdp")
            && !m.contains("dp.filter"),
        "{m}"
    );
    // A mechanism the filter cannot account for is a refusal, not an exhausted budget (no
    // smaller request fits either): typed `Refused` (wire code `refused`), same text; an ε limit
    // stays `BudgetExceeded`.
    let mech = mk(
        Limit::Mechanism {
            mechanism: filter::mechanism_name(&Event::Zcdp { rho: 0.1 }),
            earlier: false,
        },
        FilterKind::Gdp,
    );
    let text = format!("dpfusion refused the query: {mech}");
    let typed = crate::Error::from_accounting(mech);
    assert!(
        matches!(crate::Error::of(&typed), Some(crate::Error::Refused(t)) if *t == text),
        "{typed}"
    );
    let eps = crate::Error::from_accounting(mk(Limit::Epsilon, FilterKind::Gdp));
    assert!(matches!(
        crate::Error::of(&eps),
        Some(crate::Error::BudgetExceeded { .. })
    ));
}

/// Round 47 (review newuser, findings 5 and 6): a refusal's fix names only arguments the
/// refused function declares (DP-SGD has `noise`, not `mechanism`), none for a function without
/// a variant the filter accepts, none when the ledger already holds the refused charge; the δ
/// fix is never the session default, which counts as not written.
#[test]
fn refusal_fixes_name_arguments_the_function_has() {
    let call = |function: &str, mechanism: &str| CallRequest {
        key: TableKey::from("demo:t"),
        function: function.into(),
        epsilon: Some(1.0),
        delta: Some(1e-7),
        mechanism: mechanism.into(),
    };
    let refusal = |filter, limit, requests: Vec<CallRequest>, refused: Vec<&'static str>| {
        AccountingError::BudgetExceeded {
            table: "t".into(),
            key: TableKey::from("demo:t"),
            cost: 0.0,
            spent: 0.0,
            remaining: 0.0,
            budget: Budget {
                epsilon: 1.0,
                delta: 1e-6,
            },
            why: Box::new(Refusal {
                filter,
                limit,
                delta: DeltaState {
                    cost: 1e-7,
                    spent: 4.5e-7,
                    reserved: 5e-7,
                    delta_g: 5e-7,
                },
                numbers: RefusalNumbers {
                    requests,
                    refused_mechanisms: refused,
                    accepting_filters: vec![FilterKind::Rdp { order: None }],
                    ..RefusalNumbers::default()
                },
            }),
        }
        .to_string()
    };
    let mech = |e: &Event, earlier| Limit::Mechanism {
        mechanism: filter::mechanism_name(e),
        earlier,
    };
    let sgd = Event::SubsampledGaussian {
        sample_rate: 0.01,
        noise_multiplier: 1.0,
        steps: 10,
    };
    for f in [FilterKind::Zcdp, FilterKind::Gdp] {
        let m = refusal(
            f,
            mech(&sgd, false),
            vec![call("dp_linreg_sgd", "subsampled_gaussian")],
            vec!["subsampled_gaussian"],
        );
        assert!(
            m.contains("Fix: train with `noise => 'mf'` in dp_linreg_sgd")
                // Round 47, review "newuser2", E: the fix says what 'mf' does not take.
                && m.contains("without `sample_rate` or `epochs`")
                && !m.contains("mechanism =>"),
            "{m}"
        );
    }
    // A Laplace call on a gdp table: its own `mechanism` argument; the quantile beside it
    // (pure DP too) has no variant, so no fix for it.
    let pure = Event::PureDp { epsilon: 1.0 };
    let m = refusal(
        FilterKind::Gdp,
        mech(&pure, false),
        vec![call("dp_count", "pure_dp"), call("dp_quantile", "pure_dp")],
        vec!["pure_dp"],
    );
    assert!(
        m.contains("Fix: write `mechanism => 'gaussian'` in dp_count (")
            && !m.contains("in dp_quantile")
            && m.contains(
                "(asked: dp_count(ε 1, δ 1e-7, laplace), dp_quantile(ε 1, δ 1e-7, pure_dp))"
            ),
        "{m}"
    );
    // A Gaussian call beside the refused one gets no fix.
    let m = refusal(
        FilterKind::Gdp,
        mech(&Event::Zcdp { rho: 0.1 }, false),
        vec![call("dp_mean", "gaussian"), call("dp_logreg_agd", "zcdp")],
        vec!["zcdp"],
    );
    assert!(
        m.contains("Fix: the data owner can register") && !m.contains("=> '"),
        "{m}"
    );
    // The ledger holds the refused charge: only the owner can help.
    let m = refusal(
        FilterKind::Zcdp,
        mech(&sgd, true),
        vec![call("dp_linreg_sgd", "subsampled_gaussian")],
        vec!["subsampled_gaussian"],
    );
    assert!(
        m.contains("Fix: the data owner can register") && !m.contains("noise =>"),
        "{m}"
    );
    // δ: 5e-8 left, so δ ≤ 1e-7, the default, which would count as not written: the fix is
    // just below it.
    let d = refusal(FilterKind::Zcdp, Limit::Delta, vec![], vec![]);
    assert!(
        d.contains("lower `delta =>` to 9.99999e-8 or less (partition selection then needs δ/2 ≤ 4.99999e-8")
            && d.contains("just below the default 1e-7")
            && !d.contains("to 1e-7 or less"),
        "{d}"
    );
}

/// Round 47, review "newuser2", A: the δ refusal compares with the session's own default δ
/// (`dpfusion.default_delta`), not the constant 1e-7: with a default of 1e-8 and 5e-9 left it
/// does not suggest 1e-8 (written, that counts as not naming a δ), and with 5e-8 left it may
/// suggest 1e-7, which is then not the default. Its budget is shown as the owner wrote it.
#[test]
fn the_delta_refusal_avoids_the_sessions_own_default() {
    let refusal = |spent: f64, default_delta: f64| {
        AccountingError::BudgetExceeded {
            table: "t".into(),
            key: TableKey::from("demo:t"),
            cost: 0.0,
            spent: 0.0,
            remaining: 0.0,
            budget: Budget {
                epsilon: 1.0000001,
                delta: 1.0000001e-6,
            },
            why: Box::new(Refusal {
                filter: FilterKind::Gdp,
                limit: Limit::Delta,
                delta: DeltaState {
                    cost: 1e-7,
                    spent,
                    reserved: 5e-7,
                    delta_g: 5e-7,
                },
                numbers: RefusalNumbers {
                    default_delta,
                    ..RefusalNumbers::default()
                },
            }),
        }
        .to_string()
    };
    let d = refusal(4.95e-7, 1e-8);
    assert!(
        !d.contains("to 1e-8 or less") && d.contains("just below the default 1e-8"),
        "{d}"
    );
    assert!(d.contains("of the table's δ = 1.0000001e-6"), "{d}");
    let d = refusal(4.5e-7, 1e-8);
    assert!(
        d.contains("lower `delta =>` to 1e-7 or less") && !d.contains("just below"),
        "{d}"
    );
}

/// Every fix a mechanism refusal can suggest, for every DP aggregate: the argument is one the
/// function declares, and the value one its declaration accepts (round 47).
#[test]
fn every_suggested_argument_is_declared_with_that_value() {
    for a in dpfusion_udfs::aggregates::registry::AGGREGATES {
        let Some(fix) = analyst_fix(a.name) else {
            continue;
        };
        let arg = fix.split('`').nth(1).expect("a backticked argument");
        let (name, value) = arg.split_once(" => ").expect("name => value");
        let p = a
            .params
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{}: no parameter {name} ({fix})", a.name));
        assert!(
            p.doc.contains(value),
            "{}: {name} does not take {value}: {}",
            a.name,
            p.doc
        );
    }
    assert!(
        analyst_fix("dp_linreg_sgd")
            .unwrap()
            .contains("`noise => 'mf'`")
    );
    assert!(
        analyst_fix("dp_count_ci")
            .unwrap()
            .contains("`mechanism => 'gaussian'`")
    );
    assert_eq!(analyst_fix("dp_quantile"), None);
    assert_eq!(analyst_fix("rgm_mean_by"), None);
}

#[test]
fn budget_validation() {
    let bad_eps = check_budget(&Budget {
        epsilon: 0.0,
        delta: 1e-6,
    })
    .unwrap_err()
    .to_string();
    assert!(
        bad_eps.contains("epsilon") && bad_eps.contains("> 0"),
        "{bad_eps}"
    );
    let bad_delta = check_budget(&Budget {
        epsilon: 1.0,
        delta: 1.0,
    })
    .unwrap_err()
    .to_string();
    assert!(
        bad_delta.contains("delta") && bad_delta.contains("(0, 1)"),
        "{bad_delta}"
    );
    assert!(
        check_budget(&Budget {
            epsilon: f64::INFINITY,
            delta: 1e-6
        })
        .is_err()
    );
}

#[test]
fn rfc3339() {
    assert_eq!(ledger::format_rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
    assert_eq!(
        ledger::format_rfc3339(951_782_400, 5),
        "2000-02-29T00:00:00.005Z"
    );
    assert_eq!(
        ledger::format_rfc3339(1_700_000_000, 123),
        "2023-11-14T22:13:20.123Z"
    );
    assert_eq!(
        ledger::format_rfc3339(1_795_372_800, 123),
        "2026-11-22T18:40:00.123Z"
    );
    let now = ledger::now_rfc3339();
    assert_eq!(now.len(), 24, "{now}");
}

#[test]
fn admit_until_exhausted_then_refuse() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:salaries", "salaries", 1.0))
        .unwrap();
    let receipts = exhaust(&acc, "demo:salaries", 0.1);
    assert!(receipts.len() >= 2, "{}", receipts.len());
    let last = &receipts.last().unwrap().tables[0];
    assert!(last.spent_after <= 1.0 * (1.0 + 1e-12));
    assert_eq!(last.name, "salaries");
    assert!(receipts[0].tables[0].cost > 0.0);

    let before = file_len(&path);
    let err = acc
        .admit("SELECT again", &gauss("demo:salaries", 0.1))
        .unwrap_err();
    assert_eq!(file_len(&path), before, "a refused charge writes nothing");
    match &err {
        AccountingError::BudgetExceeded {
            table,
            spent,
            remaining,
            cost,
            ..
        } => {
            assert_eq!(table, "salaries");
            assert_eq!(*spent, last.spent_after);
            assert!((remaining - (1.0 - spent)).abs() < 1e-12);
            assert!((cost - receipts[0].tables[0].cost).abs() < 1e-12);
        }
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "budget exceeded for table 'salaries' (limit: the ε part of its gdp filter, ε = 1 at \
             δ = 5e-7): this query needs "
        ),
        "{msg}"
    );
    assert!(
        msg.contains("% of the budget (μ² 0.01)") && msg.contains("% is left"),
        "{msg}"
    );
    assert!(msg.contains("single-user mode)."), "{msg}");

    let alone = acc
        .admit("SELECT big", &gauss("demo:salaries", 5.0))
        .unwrap_err()
        .to_string();
    assert!(
        alone.contains("this query alone needs more than the table's whole budget (μ² 25 "),
        "{alone}"
    );

    let rows = acc.budget_rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].queries, receipts.len() as u64);
    assert_eq!(rows[0].spent, last.spent_after);
    let entries = acc.ledger_entries().unwrap();
    assert_eq!(entries.len(), receipts.len());
    assert!(entries.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    assert_eq!(entries[0].tables[0].delta, 5e-7, "ε is converted at δ_g");
    assert_eq!(acc.path(), &*path);

    // Preview computes the same without writing.
    let pv = acc.preview(&gauss("demo:salaries", 0.1)).unwrap();
    assert!(!pv[0].admitted);
    assert_eq!(file_len(&path), before);
}

#[test]
fn reopen_replays_spent() {
    let path = temp_ledger();
    let (rows, entries) = {
        let acc = Accountant::open(&path).unwrap();
        acc.register_table(private("demo:salaries", "salaries", 3.0))
            .unwrap();
        for _ in 0..3 {
            acc.admit("q", &gauss("demo:salaries", 0.1)).unwrap();
        }
        (acc.budget_rows(), acc.ledger_entries().unwrap())
    };
    let acc = Accountant::open(&path).unwrap();
    let again = acc.budget_rows();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].spent, rows[0].spent);
    assert_eq!(again[0].queries, 3);
    assert_eq!(acc.ledger_entries().unwrap(), entries);
    // A registration that states no budget gets the ledger's.
    let p = acc
        .register_table_with(
            private("demo:salaries", "pay", 1.0),
            FilterChoice::default(),
            None,
        )
        .unwrap();
    assert_eq!(p.budget.epsilon, 3.0);
    assert_eq!(acc.budget_rows()[0].name, "pay");
    let r = acc.admit("q", &gauss("demo:salaries", 0.1)).unwrap();
    assert_eq!(r.tables[0].name, "pay");
    assert_eq!(acc.ledger_entries().unwrap().last().unwrap().seq, 3);
}

#[test]
fn torn_last_line_is_truncated() {
    let path = temp_ledger();
    {
        let acc = Accountant::open(&path).unwrap();
        acc.register_table(private("demo:t", "t", 5.0)).unwrap();
        acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
        acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    }
    let good = file_len(&path);
    append_raw(&path, r#"{"record":"charge","seq":2,"time":"2026-01-"#);
    {
        let acc = Accountant::open(&path).unwrap();
        assert_eq!(acc.ledger_entries().unwrap().len(), 2);
        assert_eq!(file_len(&path), good);
        acc.admit("q3", &gauss("demo:t", 0.1)).unwrap();
    }
    // A complete (newline-terminated) but unreadable last line is not a torn write: it is
    // corruption, reported and never removed (issue 15).
    let before = fs::read(&path).unwrap();
    append_raw(&path, "{\"record\":\"cha\n");
    let after = fs::read(&path).unwrap();
    match Accountant::open(&path).unwrap_err() {
        AccountingError::Corrupt { line, .. } => assert_eq!(line, 6),
        e => panic!("{e}"),
    }
    assert_eq!(fs::read(&path).unwrap(), after, "nothing removed");
    assert_eq!(after.len(), before.len() + 15);
}

#[test]
fn torn_tail_from_another_writer_is_cut_before_appending() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    append_raw(&path, r#"{"record":"charge","se"#);
    acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.ledger_entries().unwrap().len(), 2);
}

#[test]
fn corrupt_middle_line_is_an_error() {
    let path = temp_ledger();
    {
        let acc = Accountant::open(&path).unwrap();
        acc.register_table(private("demo:t", "t", 5.0)).unwrap();
        acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
        acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    }
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(2, "this is not json");
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    let err = Accountant::open(&path).unwrap_err();
    match &err {
        AccountingError::Corrupt { line, path: p, .. } => {
            assert_eq!(*line, 3);
            assert_eq!(p, &*path);
        }
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("backup") && msg.contains("move it aside"),
        "{msg}"
    );
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    // Nothing was truncated (header, policy, two charges, the inserted line).
    assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 5);
}

#[test]
fn policy_conflicts() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let key = "/data/salaries.csv";
    acc.register_table(private(key, "salaries", 1.0)).unwrap();
    let conflict = |p: TablePolicy| match acc.register_table(p) {
        Err(AccountingError::PolicyConflict(m)) => m,
        other => panic!("{other:?}"),
    };
    let mut public = private(key, "salaries", 1.0);
    public.visibility = Visibility::Public;
    let m = conflict(public.clone());
    assert!(
        m.contains("visibility private → public") && m.contains(key),
        "{m}"
    );
    assert!(m.contains("relax"), "{m}");
    let m = conflict(private(key, "salaries", 2.0));
    assert!(m.contains("budget ε 1 → 2"), "{m}");
    let mut more_delta = private(key, "salaries", 1.0);
    more_delta.budget.delta = 1e-5;
    conflict(more_delta);
    let mut replace = private(key, "salaries", 1.0);
    replace.neighbours = Neighbours::Replace;
    conflict(replace);
    let mut cols = private(key, "salaries", 1.0);
    cols.public_columns = vec!["job".into()];
    conflict(cols);
    // A mixed change (one part stricter, one weaker) is refused too.
    let mut mixed = private(key, "salaries", 0.5);
    mixed.public_columns = vec!["job".into()];
    let m = conflict(mixed);
    assert!(m.contains("public columns [] → [job]"), "{m}");
    let before = file_len(&path);
    let kept = acc.register_table(private(key, "s2", 1.0)).unwrap();
    assert_eq!(kept.budget.epsilon, 1.0);
    assert_eq!(kept.name, "s2");
    assert_eq!(file_len(&path), before, "keeping a policy writes nothing");
    // A stricter registration is recorded.
    let stricter = acc.register_table(private(key, "s2", 0.8)).unwrap();
    assert_eq!(stricter.budget.epsilon, 0.8);
    assert!(file_len(&path) > before, "a stricter policy is written");
    // The guarantee shown stays the largest budget in force so far; the lower one caps what
    // is left.
    assert_eq!(acc.budget_rows()[0].epsilon, 1.0);
    let lowered = Filter::new(&stricter.budget, FilterKind::Gdp, DEFAULT_DELTA_SHARE).unwrap();
    assert!(
        acc.budget_rows()[0].remaining
            <= lowered.next_epsilon(&Usage::default(), DEFAULT_QUERY_DELTA)
    );
    // A weaker one with the owner's reason is recorded with the reason and the changes.
    let relaxed = acc
        .register_table_with(
            private(key, "s2", 1.0),
            FilterChoice {
                kind: true,
                delta_share: true,
                budget: true,
            },
            Some("approved by the review board"),
        )
        .unwrap();
    assert!(
        relaxed
            .relaxed
            .as_deref()
            .is_some_and(|r| r.contains("approved by the review board") && r.contains("0.8 → 1")),
        "{relaxed:?}"
    );
    assert!(
        fs::read_to_string(&path)
            .unwrap()
            .contains("approved by the review board")
    );

    // The owner may raise the budget and make the table public; both survive a restart.
    acc.owner_set_policy(private(key, "salaries", 2.0), "more budget")
        .unwrap();
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.budget_rows()[0].epsilon, 2.0);
    assert!(
        acc.owner_set_policy(public.clone(), " ").is_err(),
        "a reason is needed"
    );
    acc.owner_set_policy(public.clone(), "published").unwrap();
    assert!(acc.budget_rows().is_empty());
    // Public tables are not charged.
    let r = acc.admit("q", &gauss(key, 0.1)).unwrap();
    assert!(r.tables.is_empty());
    assert!(acc.ledger_entries().unwrap().is_empty());
    // Public → private is stricter: allowed and recorded.
    acc.register_table(private(key, "salaries", 1.0)).unwrap();
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    let rows = acc.budget_rows();
    assert_eq!(rows.len(), 1);
    // The table was public, its rows readable in clear: it has no guarantee since it was made
    // public (round 52, review operator F3; it showed 2, the largest budget it had); 1.0 caps
    // what is left.
    assert_eq!(rows[0].epsilon, f64::INFINITY);
    assert!(
        rows[0]
            .no_guarantee
            .as_ref()
            .is_some_and(|n| n.why.contains("made public")),
        "{:?}",
        rows[0].no_guarantee
    );
    let current = Filter::new(&rows_budget(1.0), FilterKind::Gdp, DEFAULT_DELTA_SHARE).unwrap();
    assert!(rows[0].remaining <= current.next_epsilon(&Usage::default(), DEFAULT_QUERY_DELTA));

    // Unknown keys are refused; session-local policies are not written, their charges are.
    assert!(matches!(
        acc.admit("q", &gauss("/nope", 0.1)),
        Err(AccountingError::UnknownTable(_))
    ));
    let before = file_len(&path);
    acc.register_table(private("mem:m", "m", 1.0)).unwrap();
    assert_eq!(file_len(&path), before);
    acc.admit("q", &gauss("mem:m", 0.1)).unwrap();
    assert!(file_len(&path) > before);
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.budget_rows().len(), 1, "mem: policy is session-local");
    acc.register_table(private("mem:m", "m", 1.0)).unwrap();
    let rows = acc.budget_rows();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].name, "m", "sorted by name");
    assert_eq!(rows[0].queries, 1, "replayed charges apply once registered");
}

#[test]
fn two_accountants_on_one_file_cannot_overspend() {
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    let b = Accountant::open(&path).unwrap();
    a.register_table(private("demo:t", "t", 2.0)).unwrap();
    // b sees a's policy: asking for more is refused.
    assert!(matches!(
        b.register_table(private("demo:t", "t", 3.0)),
        Err(AccountingError::PolicyConflict(_))
    ));
    b.register_table(private("demo:t", "t", 2.0)).unwrap();

    let ra = a.admit("qa", &gauss("demo:t", 0.1)).unwrap();
    let rb = b.admit("qb", &gauss("demo:t", 0.1)).unwrap();
    assert!(rb.tables[0].spent_after > ra.tables[0].spent_after);
    assert_eq!(b.ledger_entries().unwrap().last().unwrap().seq, 1);

    let more = exhaust(&a, "demo:t", 0.1);
    assert!(!more.is_empty());
    // b catches up on its next admission and is refused.
    let err = b.admit("qb2", &gauss("demo:t", 0.1)).unwrap_err();
    assert!(
        matches!(err, AccountingError::BudgetExceeded { .. }),
        "{err}"
    );
    assert_eq!(b.ledger_entries().unwrap().len(), 2 + more.len());
    assert_eq!(b.budget_rows()[0].spent, a.budget_rows()[0].spent);
    assert!(b.budget_rows()[0].spent <= 2.0 * (1.0 + 1e-12));
}

#[test]
fn concurrent_threads_never_exceed_budget() {
    let path = temp_ledger();
    let acc = Arc::new(Accountant::open(&path).unwrap());
    acc.register_table(private("demo:t", "t", 2.0)).unwrap();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let acc = acc.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                for j in 0..20 {
                    match acc.admit(&format!("q{i}-{j}"), &gauss("demo:t", 0.1)) {
                        Ok(r) => {
                            assert!(r.tables[0].spent_after <= 2.0 * (1.0 + 1e-12));
                            ok += 1;
                        }
                        Err(AccountingError::BudgetExceeded { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                ok
            })
        })
        .collect();
    let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    // Serially, exactly the largest n whose sum stays in the filter's rectangle are admitted.
    let one = Event::Gaussian { mu: 0.1 };
    let f = private("demo:t", "t", 2.0).compiled_filter().unwrap();
    let mut n = 0u64;
    while f
        .check(
            &Usage::default(),
            &f.usage(std::iter::repeat_n(&one, n as usize + 1)),
        )
        .is_none()
    {
        n += 1;
    }
    assert!(n < 160, "the test must exhaust the budget");
    assert_eq!(admitted, n);
    let entries = acc.ledger_entries().unwrap();
    assert_eq!(entries.len() as u64, n);
    assert!(entries.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    let reopened = Accountant::open(&path).unwrap();
    assert_eq!(reopened.budget_rows()[0].queries, n);
}

#[test]
fn new_ledger_is_chained_from_a_header_and_sealed() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["record"], "header");
    assert_eq!(lines[0]["format"], ledger::FORMAT);
    let id = lines[0]["ledger_id"].as_str().unwrap();
    assert_eq!(id.len(), 32);
    assert_eq!(lines[0]["prev"], ledger_genesis_for_test(id));
    for (i, l) in text.lines().enumerate().skip(1) {
        let prev = text.lines().nth(i - 1).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(l).unwrap()["prev"],
            sha256_hex_for_test(prev.as_bytes())
        );
    }
    let head: serde_json::Value =
        serde_json::from_slice(&fs::read(head_path(&path)).unwrap()).unwrap();
    assert_eq!(head["lines"], 3);
    assert_eq!(head["ledger_id"], id);
    assert_eq!(
        head["hash"],
        sha256_hex_for_test(text.lines().last().unwrap().as_bytes())
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }
    // Reopening verifies and appends to the same chain; verify agrees.
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    let r = verify(&path).unwrap();
    assert_eq!((r.lines, r.charges, r.policy_records), (4, 2, 1));
    assert_eq!(r.tables[0].charges, 2);
    assert_eq!(r.tables[0].spent, acc.budget_rows()[0].spent);
    assert!(r.notes.is_empty(), "{:?}", r.notes);
}

fn sha256_hex_for_test(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn ledger_genesis_for_test(id: &str) -> String {
    sha256_hex_for_test(format!("dpfusion ledger genesis v2\n{id}").as_bytes())
}

#[test]
fn format_1_ledger_is_refused_then_migrated() {
    let path = temp_ledger();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    // What an earlier version wrote: no header, no `prev`.
    let old = concat!(
        r#"{"record":"policy","key":"demo:t","name":"t","visibility":"private","#,
        r#""neighbours":"add_remove","public_columns":[],"budget":{"epsilon":5.0,"delta":1e-6}}"#,
        "\n",
        r#"{"record":"charge","seq":0,"time":"2026-01-01T00:00:00.000Z","query":"q","#,
        r#""tables":[{"name":"t","key":"demo:t","epsilon":0.5,"delta":1e-6,"#,
        r#""events":[{"kind":"gaussian","mu":0.1}]}]}"#,
        "\n"
    );
    fs::write(&path, old).unwrap();
    let msg = Accountant::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains("earlier dpfusion") && msg.contains("dpfusion ledger migrate"),
        "{msg}"
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        old,
        "refused, unchanged"
    );
    let m = migrate(&path, None).unwrap();
    assert_eq!(m.records, 2);
    assert_eq!(fs::read_to_string(&m.backup).unwrap(), old);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.ledger_entries().unwrap().len(), 1);
    assert_eq!(acc.budget_rows()[0].queries, 1);
    assert!(migrate(&path, None).is_err(), "already migrated");
}

#[test]
fn filter_is_fixed_at_registration() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let key = "/data/t.csv";
    let mut rdp = private(key, "t", 5.0);
    rdp.filter = FilterKind::Rdp { order: None };
    // The default order is resolved from the budget and written to the ledger.
    let p = acc.register_table(rdp.clone()).unwrap();
    let FilterKind::Rdp { order: Some(a) } = p.filter else {
        panic!("{:?}", p.filter)
    };
    assert!(a > 1.0);
    let conflict =
        |p: TablePolicy, stated: FilterChoice| match acc.register_table_with(p, stated, None) {
            Err(AccountingError::PolicyConflict(m)) => m,
            other => panic!("{other:?}"),
        };
    let all = FilterChoice {
        kind: true,
        delta_share: true,
        budget: true,
    };
    let m = conflict(private(key, "t", 5.0), all);
    assert!(
        m.contains("privacy filter rdp:") && m.contains("→ gdp"),
        "{m}"
    );
    let mut other_order = rdp.clone();
    other_order.filter = FilterKind::Rdp {
        order: Some(a + 1.0),
    };
    conflict(other_order, all);
    let mut more_share = rdp.clone();
    more_share.delta_share = 0.9;
    let m = conflict(more_share, all);
    assert!(
        m.contains("δ share for partition selection 0.5 → 0.9"),
        "{m}"
    );
    // A smaller share is a change too (it changes how past charges count).
    let mut less_share = rdp.clone();
    less_share.delta_share = 0.1;
    conflict(less_share, all);
    // `rdp` without an order, or an unstated filter, keep the ledger's.
    assert_eq!(acc.register_table(rdp.clone()).unwrap().filter, p.filter);
    let kept = acc
        .register_table_with(private(key, "t", 5.0), FilterChoice::default(), None)
        .unwrap();
    assert_eq!(kept.filter, p.filter);
    // Survives a restart; the owner may change it.
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(acc.budget_rows()[0].filter, p.filter);
    let mut zcdp = private(key, "t", 5.0);
    zcdp.filter = FilterKind::Zcdp;
    acc.owner_set_policy(zcdp, "switch to zcdp").unwrap();
    assert_eq!(acc.budget_rows()[0].filter, FilterKind::Zcdp);
    // A filter the budget cannot support is refused before anything is written.
    let mut tiny = private("/data/u.csv", "u", 0.01);
    tiny.filter = FilterKind::Rdp { order: Some(1.5) };
    assert!(matches!(
        acc.register_table(tiny),
        Err(AccountingError::InvalidBudget(_))
    ));
    // A policy written before filters existed reads as gdp with half of δ for selection.
    let old = r#"{"key":"k","name":"t","visibility":"private","neighbours":"add_remove",
        "public_columns":[],"budget":{"epsilon":1.0,"delta":1e-6}}"#;
    let p: TablePolicy = serde_json::from_str(old).unwrap();
    assert_eq!((p.filter, p.delta_share), (FilterKind::Gdp, 0.5));
}

#[test]
fn both_halves_of_the_budget_are_reported() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    let selection = |d: f64| {
        vec![TableCharge {
            key: TableKey::from("demo:t"),
            events: vec![Event::Gaussian { mu: 0.05 }, Event::Delta { delta: d }],
        }]
    };
    let r = acc.admit("q1", &selection(3e-7)).unwrap();
    assert_eq!(r.tables[0].delta_spent_after, 3e-7);
    assert!((r.tables[0].delta_left_after - 2e-7).abs() < 1e-20);
    assert_eq!(r.tables[0].filter, FilterKind::Gdp);
    let row = &acc.budget_rows()[0];
    assert_eq!((row.delta_spent, row.filter), (3e-7, FilterKind::Gdp));
    // The δ side binds although ε is far from spent.
    let pv = acc.preview(&selection(3e-7)).unwrap();
    assert!(!pv[0].admitted && pv[0].limit == Some(Limit::Delta));
    assert!(pv[0].spent_after < 1.0);
    let err = acc.admit("q2", &selection(3e-7)).unwrap_err().to_string();
    assert!(err.contains("δ reserved for partition selection"), "{err}");
    // A mechanism the gdp filter does not accept: refused, limit named, ε not `inf`-charged.
    let zcdp = vec![TableCharge {
        key: TableKey::from("demo:t"),
        events: vec![Event::Zcdp { rho: 0.001 }],
    }];
    let pv = acc.preview(&zcdp).unwrap();
    assert!(matches!(pv[0].limit, Some(Limit::Mechanism { .. })));
    let err = acc.admit("q3", &zcdp).unwrap_err().to_string();
    assert!(err.contains("does not accept this query"), "{err}");
    assert_eq!(acc.ledger_entries().unwrap().len(), 1);
}

// ---- Issue 27: the stored SQL is capped, the witness, the replaced-file check ----

#[test]
fn stored_sql_is_capped_with_the_hash_of_the_whole() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 1e6)).unwrap();
    // 1 MiB of comment, plain and as control characters (6 bytes each in JSON), and multibyte.
    for filler in ["x", "\u{1}", "\"", "é", "𝄞"] {
        let q = format!(
            "SELECT dp_count(x, 1e-9) FROM t -- {}",
            filler.repeat((1 << 20) / filler.len())
        );
        let before = file_len(&path);
        acc.admit(&q, &gauss("demo:t", 1e-9)).unwrap();
        let added = file_len(&path) - before;
        // The cut text (4 KiB) plus the charge's other fields (hash, events, request, cost).
        assert!(added <= 4700, "{filler:?}: {added} bytes");
        let e = acc.ledger_entries().unwrap().pop().unwrap();
        assert!(q.starts_with(&e.query) && !e.query.is_empty());
        assert!(serde_json::to_string(&e.query).unwrap().len() - 2 <= QUERY_CAP);
        assert!(serde_json::to_string(&e.query).unwrap().len() - 2 > QUERY_CAP - 8);
        assert_eq!(
            e.query_sha256.as_deref(),
            Some(&*sha256_hex_for_test(q.as_bytes()))
        );
        assert_eq!(e.query_bytes, Some(q.len() as u64));
    }
    // A short text is stored whole, with its hash.
    acc.admit("q", &gauss("demo:t", 1e-9)).unwrap();
    let e = acc.ledger_entries().unwrap().pop().unwrap();
    assert_eq!((e.query.as_str(), e.query_bytes), ("q", Some(1)));
    // Replay gives the same entries.
    let again = Accountant::open(&path).unwrap();
    assert_eq!(
        again.ledger_entries().unwrap(),
        acc.ledger_entries().unwrap()
    );
    assert!(verify(&path).is_ok());
}

/// A format-2 ledger as a version before the cap wrote it (a charge with a long query and no
/// hash), sealed by its sidecar. Returns the whole query.
fn write_ledger_before_the_cap(path: &Path) -> String {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let id = "00112233445566778899aabbccddeeff";
    let header = format!(
        r#"{{"record":"header","format":2,"ledger_id":"{id}","created":"2026-01-01T00:00:00.000Z","prev":"{}"}}"#,
        ledger_genesis_for_test(id)
    );
    let policy = format!(
        r#"{{"record":"policy","key":"demo:t","name":"t","visibility":"private","neighbours":"add_remove","public_columns":[],"budget":{{"epsilon":5.0,"delta":1e-6}},"prev":"{}"}}"#,
        sha256_hex_for_test(header.as_bytes())
    );
    let query = format!("SELECT dp_count(x, 0.1) FROM t -- {}", "y".repeat(10_000));
    let charge = format!(
        r#"{{"record":"charge","seq":0,"time":"2026-01-01T00:00:00.000Z","query":"{query}","tables":[{{"name":"t","key":"demo:t","epsilon":0.5,"delta":1e-6,"events":[{{"kind":"gaussian","mu":0.1}}]}}],"prev":"{}"}}"#,
        sha256_hex_for_test(policy.as_bytes())
    );
    fs::write(path, format!("{header}\n{policy}\n{charge}\n")).unwrap();
    fs::write(
        head_path(path),
        format!(
            r#"{{"format":2,"ledger_id":"{id}","lines":3,"hash":"{}"}}"#,
            sha256_hex_for_test(charge.as_bytes())
        ),
    )
    .unwrap();
    query
}

#[test]
fn a_ledger_written_before_the_cap_replays_bounded_in_memory() {
    let path = temp_ledger();
    let query = write_ledger_before_the_cap(&path);
    let bytes = fs::read(&path).unwrap();
    let r = verify(&path).unwrap();
    assert_eq!((r.lines, r.charges), (3, 1));
    let acc = Accountant::open(&path).unwrap();
    let e = &acc.ledger_entries().unwrap()[0];
    assert!(e.query.len() <= QUERY_CAP && query.starts_with(&e.query));
    assert_eq!(
        e.query_sha256.as_deref(),
        Some(&*sha256_hex_for_test(query.as_bytes()))
    );
    assert_eq!(e.query_bytes, Some(query.len() as u64));
    assert_eq!(acc.budget_rows()[0].queries, 1);
    // Its lines are not rewritten; new charges chain after them.
    acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    assert!(fs::read(&path).unwrap().starts_with(&bytes));
    assert_eq!(verify(&path).unwrap().charges, 2);
}

fn witness_for(path: &Path) -> PathBuf {
    path.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("owner")
        .join("w.witness")
}

#[test]
fn witness_refuses_a_ledger_rolled_back_with_its_sidecar() {
    let path = temp_ledger();
    let w = witness_for(&path);
    let acc = Accountant::open_witnessed(&path, &w).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    let old = (
        fs::read(&path).unwrap(),
        fs::read(head_path(&path)).unwrap(),
    );
    acc.admit("q2", &gauss("demo:t", 0.1)).unwrap();
    let seal: serde_json::Value = serde_json::from_slice(&fs::read(&w).unwrap()).unwrap();
    assert_eq!(seal["lines"], 4);
    assert_eq!(seal["bytes"], file_len(&path));
    drop(acc);
    // The older ledger and its older sidecar, together: consistent, and without the witness
    // it would be accepted (a refund of q2).
    fs::write(&path, &old.0).unwrap();
    fs::write(head_path(&path), &old.1).unwrap();
    assert!(verify(&path).is_ok());
    let msg = Accountant::open_witnessed(&path, &w)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("ends after 3 complete lines but its witness") && msg.contains("rolled back"),
        "{msg}"
    );
    assert!(verify_with(&path, Some(&w)).is_err());
    assert_eq!(fs::read(&path).unwrap(), old.0, "refused, unchanged");
    // A deleted ledger, another ledger, an emptied one.
    fs::remove_file(&path).unwrap();
    fs::remove_file(head_path(&path)).unwrap();
    let msg = Accountant::open_witnessed(&path, &w)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("does not exist but its witness"), "{msg}");
    assert!(!path.exists(), "nothing created");
    let other = Accountant::open(&path).unwrap();
    other.register_table(private("demo:t", "t", 5.0)).unwrap();
    drop(other);
    let msg = Accountant::open_witnessed(&path, &w)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("belongs to another ledger"), "{msg}");
    fs::write(&path, b"").unwrap();
    fs::remove_file(head_path(&path)).unwrap();
    let msg = Accountant::open_witnessed(&path, &w)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("holds no complete line but its witness"),
        "{msg}"
    );
}

#[test]
fn witness_diverging_at_its_line_is_refused() {
    let path = temp_ledger();
    let w = witness_for(&path);
    let acc = Accountant::open_witnessed(&path, &w).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    drop(acc);
    // Someone rewrote the last line (and recomputed the sidecar, which has no secret): the
    // witness still holds the hash of the line it saw.
    let mut seal: serde_json::Value = serde_json::from_slice(&fs::read(&w).unwrap()).unwrap();
    seal["hash"] = serde_json::Value::String("00".repeat(32));
    fs::write(&w, seal.to_string()).unwrap();
    let msg = Accountant::open_witnessed(&path, &w)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("differs from the one its witness"), "{msg}");
}

#[test]
fn witness_accepts_what_a_crash_leaves_and_its_first_use() {
    let path = temp_ledger();
    let w = witness_for(&path);
    // First use on an existing ledger (an earlier version, or no witness before): written.
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    drop(acc);
    assert!(verify_with(&path, Some(&w)).unwrap().notes[0].contains("no witness"));
    let acc = Accountant::open_witnessed(&path, &w).unwrap();
    assert!(w.exists());
    let behind = fs::read(&w).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    drop(acc);
    // A crash between the sidecar and the witness: the witness is one line behind.
    fs::write(&w, &behind).unwrap();
    let r = verify_with(&path, Some(&w)).unwrap();
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("the witness recorded 2 lines of 3"))
    );
    let acc = Accountant::open_witnessed(&path, &w).unwrap();
    assert_eq!(acc.ledger_entries().unwrap().len(), 1);
    let seal: serde_json::Value = serde_json::from_slice(&fs::read(&w).unwrap()).unwrap();
    assert_eq!(seal["lines"], 3, "brought up to date");
    assert!(verify_with(&path, Some(&w)).unwrap().notes.is_empty());
    drop(acc);
    // Never in the ledger's own directory.
    let inside = path.with_file_name("w.witness");
    let msg = Accountant::open_witnessed(&path, &inside)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("in the ledger's own directory"), "{msg}");
    // The default: a sibling directory of the ledger's.
    let d = default_witness(&path).unwrap();
    let dir = fs::canonicalize(path.parent().unwrap()).unwrap();
    assert_eq!(
        d,
        dir.with_file_name("sub.witness")
            .join("ledger.jsonl.witness")
    );
}

#[cfg(unix)]
#[test]
fn a_replaced_ledger_path_stops_admission() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("demo:t", "t", 5.0)).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    // A copy renamed over the path: same bytes, another file.
    let copy = path.with_file_name("copy");
    fs::copy(&path, &copy).unwrap();
    fs::rename(&copy, &path).unwrap();
    let msg = acc
        .admit("q2", &gauss("demo:t", 0.1))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("was replaced") && msg.contains("restart"),
        "{msg}"
    );
    let replaced = fs::read(&path).unwrap();
    // For good: also when the path is put right again.
    assert!(acc.admit("q3", &gauss("demo:t", 0.1)).is_err());
    assert_eq!(fs::read(&path).unwrap(), replaced);
    // A fresh process (here: a fresh accountant) opens the file now at the path.
    let fresh = Accountant::open(&path).unwrap();
    fresh.admit("q4", &gauss("demo:t", 0.1)).unwrap();
    // Deleted: refused too.
    let acc = Accountant::open(&path).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(acc.admit("q5", &gauss("demo:t", 0.1)).is_err());
}
/// Issue 26, class 7: `replace` → `add_remove` or row → unit on a table that has charges needs
/// the owner's relaxation (the past charges' ε under the new relation is unbounded); on a table
/// without charges it is recorded as stricter.
#[test]
fn a_relation_change_on_a_charged_table_needs_a_relaxation() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let mut replace = private("demo:rel", "rel", 1.0);
    replace.neighbours = Neighbours::Replace;
    acc.register_table(replace.clone()).unwrap();
    // No charges yet: replace → add_remove is recorded.
    acc.register_table(private("demo:rel", "rel", 1.0)).unwrap();
    assert_eq!(
        acc.policy(&TableKey::from("demo:rel")).unwrap().neighbours,
        Neighbours::AddRemove
    );
    acc.owner_set_policy(replace.clone(), "back to replace for the test")
        .unwrap();
    acc.admit("q", &gauss("demo:rel", 0.1)).unwrap();
    let before = file_len(&path);
    for to in [private("demo:rel", "rel", 1.0), {
        let mut u = replace.clone();
        u.unit = Some(PrivacyUnit {
            column: "customer".into(),
            domain: "people".into(),
            max_groups_contributed: 1,
            max_rows_contributed: 1,
        });
        u.neighbours = Neighbours::AddRemove;
        u
    }] {
        match acc.register_table(to.clone()) {
            Err(AccountingError::PolicyConflict(m)) => {
                assert!(m.contains("has charges") && m.contains("relax"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(file_len(&path), before, "nothing written");
    }
    assert_eq!(
        acc.policy(&TableKey::from("demo:rel")).unwrap().neighbours,
        Neighbours::Replace
    );
    // With the owner's reason it is recorded, with the change.
    let relaxed = acc
        .register_table_with(
            private("demo:rel", "rel", 1.0),
            FilterChoice {
                kind: true,
                delta_share: true,
                budget: true,
            },
            Some("new release protects every row's presence"),
        )
        .unwrap();
    assert!(
        relaxed
            .relaxed
            .as_deref()
            .is_some_and(|r| r.contains("neighbours replace → add_remove")),
        "{relaxed:?}"
    );
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert_eq!(
        acc.policy(&TableKey::from("demo:rel")).unwrap().neighbours,
        Neighbours::AddRemove
    );
}

/// Issue 29: the shares shown for a sequence of charges add up to the total shown, exactly
/// (they are differences of the rounded-up running share), and the ledger records each
/// charge's request and its cost in the filter's unit.
#[test]
fn shares_of_a_sequence_of_charges_add_up_to_the_total() {
    for kind in [
        FilterKind::Gdp,
        FilterKind::Zcdp,
        FilterKind::Rdp { order: None },
    ] {
        let path = temp_ledger();
        let acc = Accountant::open(&path).unwrap();
        let mut p = private("demo:s", "s", 3.0);
        p.filter = kind;
        acc.register_table(p).unwrap();
        let mut receipts = Vec::new();
        // Uneven charges (μ from 0.013 to 0.137), until refused.
        for i in 0..200u32 {
            let mu = 0.013 + f64::from(i % 7) * 0.0207;
            let request = CallRequest {
                key: TableKey::from("demo:s"),
                function: "dp_sum".into(),
                epsilon: Some(0.1 + f64::from(i % 7) / 10.0),
                delta: Some(1e-7),
                mechanism: "gaussian".into(),
            };
            match acc.admit_requests(
                "q",
                &gauss("demo:s", mu),
                std::slice::from_ref(&request),
                None,
            ) {
                Ok(r) => {
                    assert_eq!(
                        r.tables[0].requests,
                        vec![request],
                        "the request as written"
                    );
                    receipts.push(r)
                }
                Err(AccountingError::BudgetExceeded { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(receipts.len() > 10, "{kind}: {}", receipts.len());
        let total: u64 = receipts.iter().map(|r| r.tables[0].native.share).sum();
        let last = &receipts.last().unwrap().tables[0];
        assert_eq!(total, last.native.used_share, "{kind}");
        assert_eq!(total + last.left_share, display::SHARE_SCALE, "{kind}");
        let row = &acc.budget_rows()[0];
        assert_eq!(row.native.used_share, total, "{kind}: SHOW BUDGET's total");
        // The ledger holds the same shares, and they replay.
        drop(acc);
        let acc = Accountant::open(&path).unwrap();
        let shares: u64 = acc
            .ledger_entries()
            .unwrap()
            .iter()
            .map(|e| e.tables[0].native.as_ref().unwrap().share)
            .sum();
        assert_eq!(shares, total, "{kind}");
        let e = &acc.ledger_entries().unwrap()[0].tables[0];
        assert_eq!(e.requests[0].function, "dp_sum");
        assert_eq!(e.requests[0].epsilon, Some(0.1));
        assert_eq!(
            e.native.as_ref().unwrap().unit,
            Filter::new(&rows_budget(3.0), kind, 0.5).unwrap().unit()
        );
        // The percentages as printed add up too (four decimals of a percent are exact).
        let printed: f64 = receipts
            .iter()
            .map(|r| {
                display::percent(r.tables[0].native.share)
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .unwrap()
            })
            .sum();
        let shown_total: f64 = display::percent(total)
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(
            (printed - shown_total).abs() < 1e-6,
            "{printed} vs {shown_total}"
        );
    }
}

/// Issue 29: with the default budget (ε 1, δ 1e-6, half of δ reserved for partition
/// selection), 1,000 private GROUP BYs fit: each selection spends at most δ_sel/1000 by default,
/// and the δ side is compared in exact arithmetic, so the 1,000th is not refused by a rounding
/// error; the 1,001st is refused on δ, with the fix.
#[test]
fn a_thousand_group_bys_fit_the_default_budget() {
    let b = Budget {
        epsilon: 1.0,
        delta: 1e-6,
    };
    let f = Filter::new(&b, FilterKind::Gdp, DEFAULT_DELTA_SHARE).unwrap();
    let cap = f.selection_delta();
    assert!(cap <= 5e-10 && cap > 5e-10 * (1.0 - 1e-15), "{cap:e}");
    // The arithmetic alone, on every budget δ of a grid of awkward values: 1,000 fit, exactly.
    for delta in [1e-6, 3e-7, 7.1e-9, 1e-5, 2.3e-6, 9.99e-4] {
        for share in [0.5, 0.1, 0.3, 0.77] {
            let f = Filter::new(
                &Budget {
                    epsilon: 1.0,
                    delta,
                },
                FilterKind::Gdp,
                share,
            )
            .unwrap();
            let one = f.usage(&[Event::Delta {
                delta: f.selection_delta(),
            }]);
            let mut used = Usage::default();
            for i in 0..1000 {
                assert_eq!(f.check(&used, &one), None, "δ {delta:e} s {share}: #{i}");
                used = used.plus(&one);
            }
            // A naive float sum of the same δs may exceed δ_sel: the exact one does not.
            assert_eq!(f.check(&used, &Usage::default()), None);
        }
    }
    // Through the accountant: the selection's Gaussian (ε 0.01 at δ 2·cap) and its additive δ,
    // with a small call beside it, 1,000 times.
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let mut p = private("demo:g", "g", 1.0);
    p.budget = b;
    acc.register_table(p).unwrap();
    let mu = dpfusion_udfs::privacy::gaussian_mu(0.01, 2.0 * cap).unwrap();
    let call = dpfusion_udfs::privacy::gaussian_mu(0.01, 1e-7).unwrap();
    let charge = vec![TableCharge {
        key: TableKey::from("demo:g"),
        events: vec![
            Event::Gaussian { mu: call },
            Event::Gaussian { mu },
            Event::Delta { delta: cap },
        ],
    }];
    for i in 0..1000 {
        acc.admit("SELECT k, dp_count(*) … GROUP BY k", &charge)
            .unwrap_or_else(|e| panic!("GROUP BY #{}: {e}", i + 1));
    }
    let row = &acc.budget_rows()[0];
    assert_eq!(row.queries, 1000);
    assert!(row.delta_left < cap, "{:e}", row.delta_left);
    let err = acc.admit("one more", &charge).unwrap_err();
    match &err {
        AccountingError::BudgetExceeded { why, .. } => assert_eq!(why.limit, Limit::Delta),
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("a lower epsilon does not help"), "{msg}");
}

/// What is left is also shown as the largest ε of one default query; a query at that ε (as
/// printed, rounded down) is admitted, and one a little larger is refused.
#[test]
fn the_next_query_epsilon_is_admitted_and_tight() {
    for kind in [
        FilterKind::Gdp,
        FilterKind::Zcdp,
        FilterKind::Rdp { order: None },
    ] {
        let f = Filter::new(&rows_budget(2.0), kind, 0.5).unwrap();
        let used = f.usage(&[Event::Gaussian { mu: 0.3 }]);
        let e = f.next_epsilon(&used, DEFAULT_QUERY_DELTA);
        let shown: f64 = display::num(e, display::Round::Down).parse().unwrap();
        let at = |eps: f64| {
            let mu = dpfusion_udfs::privacy::gaussian_mu(eps, DEFAULT_QUERY_DELTA).unwrap();
            f.check(&used, &f.usage(&[Event::Gaussian { mu }]))
        };
        assert_eq!(at(shown), None, "{kind}: {shown}");
        assert_eq!(at(e * 1.0001), Some(Limit::Epsilon), "{kind}: {e}");
        // A single call at δ 1e-7 < δ_g may use a little more than what a conversion at δ_g
        // would suggest, never more than twice the budget here.
        assert!(e > 0.0 && e < 4.0, "{kind}: {e}");
    }
}

/// Round 46, F1: a process planned with the policy it registered, while admission charged under
/// the one another process recorded since. A statement planned under a policy the ledger no
/// longer holds is refused, also one that charges nothing, with nothing written.
#[test]
fn a_policy_changed_by_another_process_refuses_what_was_planned_under_the_old() {
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    let b = Accountant::open(&path).unwrap();
    let public = TablePolicy {
        visibility: Visibility::Public,
        ..private("demo:t", "t", 1.0)
    };
    let planned_a = a.register_table(public).unwrap();
    // Nothing appended since a's last read: checked without the lock (one stat, one fstat).
    assert!(!a.appended_since(&a.state()).unwrap());
    a.check_planned(std::slice::from_ref(&planned_a)).unwrap();
    // Another process makes it private (stricter: recorded without a relaxation).
    let stricter = b.register_table(private("demo:t", "t", 1.0)).unwrap();
    assert!(a.appended_since(&a.state()).unwrap(), "a catches up first");
    let before = file_len(&path);
    let err = a
        .check_planned(std::slice::from_ref(&planned_a))
        .unwrap_err();
    assert!(
        matches!(&err, AccountingError::PolicyChanged { table, changes, here: false }
            if table == "t" && changes.contains("visibility public → private")),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("changed by another process"), "{msg}");
    assert!(msg.contains("register"), "says what to do: {msg}");
    // Admission of a charge planned under the old policy: refused under the lock.
    let err = refused_at_admission(&a, &planned_a);
    assert!(
        matches!(err, AccountingError::PolicyChanged { .. }),
        "{err}"
    );
    assert_eq!(file_len(&path), before, "nothing written");
    assert!(a.ledger_entries().unwrap().is_empty());
    // What the ledger holds now passes, in both processes and in a new one.
    a.check_planned(std::slice::from_ref(&stricter)).unwrap();
    let c = Accountant::open(&path).unwrap();
    c.check_planned(std::slice::from_ref(&stricter)).unwrap();
    a.admit_planned(
        "q",
        &gauss("demo:t", 0.1),
        &[],
        None,
        std::slice::from_ref(&stricter),
        DEFAULT_QUERY_DELTA,
    )
    .unwrap();
    // A row → unit change (allowed while the table has no charges) and fewer public columns
    // are changes too; the session's name for the table is not.
    let cols = TablePolicy {
        public_columns: vec!["a".into(), "b".into()],
        ..private("demo:u", "u", 1.0)
    };
    let planned_u = a.register_table(cols.clone()).unwrap();
    let fewer = TablePolicy {
        public_columns: vec!["a".into()],
        unit: Some(PrivacyUnit::new("a_id", "u")),
        ..cols
    };
    b.register_table(fewer).unwrap();
    let err = a
        .check_planned(std::slice::from_ref(&planned_u))
        .unwrap_err()
        .to_string();
    assert!(err.contains("public columns [a, b] → [a]"), "{err}");
    assert!(err.contains("privacy unit: row → a_id"), "{err}");
    let renamed = TablePolicy {
        name: "other".into(),
        ..stricter
    };
    a.check_planned(&[renamed]).unwrap();
    // Session-local keys have no policy but the session's own.
    a.check_planned(&[private("mem:m", "m", 1.0)]).unwrap();
}

/// Round 46, F2: whoever can write a directory on the way to the ledger (or its witness) moves
/// both aside, and the next session started a new ledger with every budget at zero. Such a
/// location is refused at open; a sticky directory (like /tmp) holding the owner's own entry is
/// not such a place.
#[cfg(unix)]
#[test]
fn a_ledger_or_witness_that_others_can_move_aside_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = crate::testdir::test_dir("accounting-location");
    let shared = root.join("shared");
    fs::create_dir(&shared).unwrap();
    let ledger = shared.join("dp/ledger.jsonl");
    let witness = default_witness(&ledger).unwrap();
    let chmod = |p: &Path, m| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    chmod(&shared, 0o777);
    let err = Accountant::open_witnessed(&ledger, &witness).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("others can write"), "{msg}");
    assert!(msg.contains(&shared.display().to_string()), "{msg}");
    assert!(msg.contains("every budget at zero"), "{msg}");
    assert!(!ledger.exists(), "nothing created");
    assert!(Accountant::open(&ledger).is_err(), "also without a witness");
    // Sticky, like /tmp: only the entry's owner (this process's user) can move it.
    chmod(&shared, 0o1777);
    let acc = Accountant::open_witnessed(&ledger, &witness).unwrap();
    acc.register_table(private("demo:t", "t", 1.0)).unwrap();
    acc.admit("q", &gauss("demo:t", 0.1)).unwrap();
    drop(acc);
    // Made writable by others later: refused at the next open, the files left as they were.
    chmod(&shared, 0o777);
    let before = fs::read(&ledger).unwrap();
    assert!(Accountant::open_witnessed(&ledger, &witness).is_err());
    assert_eq!(fs::read(&ledger).unwrap(), before);
    chmod(&shared, 0o755);
    Accountant::open_witnessed(&ledger, &witness).unwrap();
    // The witness alone in such a place.
    let open_witness = root.join("open");
    fs::create_dir(&open_witness).unwrap();
    chmod(&open_witness, 0o777);
    let err = Accountant::open_witnessed(&ledger, &open_witness.join("w")).unwrap_err();
    assert!(err.to_string().contains("its witness"), "{err}");
    // A directory on the way that another user (not root) owns, or a group that is not its
    // owner's private group can write (as root only: chown).
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::ffi::OsStrExt;
        let chown = |p: &Path, uid: u32, gid: u32| {
            let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, gid) }, 0);
        };
        chown(&shared, 4242, 4242);
        let err = Accountant::open_witnessed(&ledger, &witness).unwrap_err();
        assert!(err.to_string().contains("another user owns"), "{err}");
        chown(&shared, 0, 4242);
        chmod(&shared, 0o775);
        let err = Accountant::open_witnessed(&ledger, &witness).unwrap_err();
        assert!(err.to_string().contains("others can write"), "{err}");
        // Also when the group is the owner's own (round 46, F3 of the review of its fixes: the
        // group of a user's own number may have other members); without group write, allowed.
        chown(&shared, 0, 0);
        assert!(Accountant::open_witnessed(&ledger, &witness).is_err());
        chmod(&shared, 0o755);
        Accountant::open_witnessed(&ledger, &witness).unwrap();
    }
}

/// The places the test suites keep their ledgers stay allowed: the system's temporary
/// directory and /dev/shm (sticky, writable by all), the build's target directory.
#[cfg(unix)]
#[test]
fn ledgers_in_the_test_suites_places_are_allowed() {
    let mut bases = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        bases.push(PathBuf::from("/dev/shm"));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        bases.push(PathBuf::from(t));
    }
    for base in bases {
        let dir = crate::testdir::test_dir_in(&base, "accounting-places");
        let ledger = dir.join("ledger.jsonl");
        Accountant::open_witnessed(&ledger, &default_witness(&ledger).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    }
}

/// Round 46, F4: after the charge's line is durable, a failure to write the sidecar (or the
/// witness) is `Unsealed`, a charge that stands: it is not lost and not refunded, and the next
/// open brings the seals up to date.
#[test]
fn a_seal_that_cannot_be_written_after_the_charge_is_a_charge_that_stands() {
    let path = temp_ledger();
    let witness = default_witness(&path).unwrap();
    let acc = Accountant::open_witnessed(&path, &witness).unwrap();
    acc.register_table(private("demo:t", "t", 10.0)).unwrap();
    // The sidecar's temporary file cannot be created: a directory (not empty) at its name.
    let blocker = ledger::sibling(&path, ".head.tmp");
    fs::create_dir_all(blocker.join("x")).unwrap();
    let err = acc.admit("q", &gauss("demo:t", 0.1)).unwrap_err();
    assert!(
        matches!(&err, AccountingError::Unsealed { charge: true, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("the charge stands"), "{err}");
    assert_eq!(acc.budget_rows()[0].queries, 1, "charged in this process");
    // The witness's temporary file, likewise (after an admission that brings the sidecar, and
    // the witness, up to date again).
    fs::remove_dir_all(&blocker).unwrap();
    acc.admit("q1", &gauss("demo:t", 0.1)).unwrap();
    let blocker = ledger::sibling(&witness, ".tmp");
    fs::create_dir_all(blocker.join("x")).unwrap();
    let err = acc.admit("q2", &gauss("demo:t", 0.1)).unwrap_err();
    assert!(
        matches!(&err, AccountingError::Unsealed { charge: true, .. }),
        "{err}"
    );
    fs::remove_dir_all(&blocker).unwrap();
    drop(acc);
    let again = Accountant::open_witnessed(&path, &witness).unwrap();
    assert_eq!(again.budget_rows()[0].queries, 3, "every charge stands");
    again.admit("q3", &gauss("demo:t", 0.1)).unwrap();
}

/// A canonical directory of `tag` holding `names` (one line each), and its key.
fn data_dir(tag: &str, names: &[&str]) -> (crate::testdir::TestPath, PathBuf) {
    let dir = crate::testdir::test_dir(tag);
    for n in names {
        fs::write(dir.join(n), "uid,x\n1,11\n").unwrap();
    }
    let canon = fs::canonicalize(&*dir).unwrap();
    (dir, canon)
}

/// Round 46, F1 of the review of its fixes: a session served a directory as public; another
/// process of the owner registered a file inside it as private under its own key (its
/// registration does not know the public table), and the session kept printing that file's
/// rows. The public table is refused at its next statement (and at admission), naming tables,
/// not paths; a private table elsewhere refuses nothing, and nothing is resolved again until a
/// policy record arrives.
#[test]
fn a_public_directory_is_refused_once_a_file_in_it_is_made_private_elsewhere() {
    let path = temp_ledger();
    let (_dir, data) = data_dir("accounting-files-now-private", &["a.csv", "b.csv"]);
    let (_other, elsewhere) = data_dir("accounting-files-elsewhere", &["c.csv"]);
    let key = |p: &Path| p.to_string_lossy().to_string();
    let a = Accountant::open(&path).unwrap();
    let b = Accountant::open(&path).unwrap();
    let public = TablePolicy {
        visibility: Visibility::Public,
        ..private(&key(&data), "d", 1.0)
    };
    let planned = a.register_table(public).unwrap();
    a.check_planned(std::slice::from_ref(&planned)).unwrap();
    // A private table in another directory: no refusal.
    b.register_table(private(&key(&elsewhere.join("c.csv")), "c", 1.0))
        .unwrap();
    a.check_planned(std::slice::from_ref(&planned)).unwrap();
    // Checked once per policy record: with nothing new, no resolution (the directory could
    // even be gone).
    let epoch = {
        let st = a.state();
        st.policy_records + st.owner_records
    };
    assert_eq!(a.state().files_checked.get(&planned.key), Some(&epoch));
    // Another process makes a.csv private (its own key, below the public directory).
    b.register_table(private(&key(&data.join("a.csv")), "a", 1.0))
        .unwrap();
    let before = file_len(&path);
    let err = a.check_planned(std::slice::from_ref(&planned)).unwrap_err();
    assert!(
        matches!(&err, AccountingError::FilesNowPrivate { table, private, here: false }
            if table == "d" && private == "a"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("by another process"), "{msg}");
    assert!(msg.contains("Nothing was charged"), "{msg}");
    assert!(!msg.contains(&key(&data)), "no path: {msg}");
    // Under the lock at admission too, and again at every statement.
    let err = refused_at_admission(&a, &planned);
    assert!(
        matches!(err, AccountingError::FilesNowPrivate { .. }),
        "{err}"
    );
    assert!(a.check_planned(std::slice::from_ref(&planned)).is_err());
    assert_eq!(file_len(&path), before, "nothing written");
    // A hard link of a private file in the public directory is the private file too.
    let (_dir2, data2) = data_dir("accounting-files-linked", &["b.csv"]);
    let public2 = a
        .register_table(TablePolicy {
            visibility: Visibility::Public,
            ..private(&key(&data2), "d2", 1.0)
        })
        .unwrap();
    a.check_planned(std::slice::from_ref(&public2)).unwrap();
    fs::hard_link(elsewhere.join("c.csv"), data2.join("c.csv")).unwrap();
    // (c is private already: its link is found once a policy record is applied.)
    b.register_table(private("demo:x", "x", 1.0)).unwrap();
    let err = a.check_planned(std::slice::from_ref(&public2)).unwrap_err();
    assert!(
        matches!(&err, AccountingError::FilesNowPrivate { private, .. } if private == "c"),
        "{err}"
    );
}

/// Round 46, F2 of the review of its fixes: one file under two names, the second registered
/// with a stricter policy (recorded), left the first name planning under the old one. The
/// registration that would change the policy a session serves under another name is refused,
/// nothing written; one that keeps it passes. And a statement that reads one key under two
/// policies is refused for the stale one, whichever comes first.
#[test]
fn a_second_name_of_a_key_under_another_policy_is_refused_and_the_stale_one_is_seen() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let row = acc.register_table(private("/t.csv", "t1", 1.0)).unwrap();
    let unit = TablePolicy {
        name: "t2".into(),
        unit: Some(PrivacyUnit::new("uid", "t")),
        ..row.clone()
    };
    let stated = FilterChoice {
        kind: true,
        delta_share: true,
        budget: true,
    };
    let before = file_len(&path);
    let err = acc
        .register_table_beside(unit.clone(), stated, None, std::slice::from_ref(&row))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, AccountingError::PolicyConflict(_)), "{msg}");
    assert!(msg.contains("table 't2'"), "{msg}");
    assert!(msg.contains("as table 't1'"), "{msg}");
    assert!(msg.contains("privacy unit: row → uid"), "{msg}");
    assert!(msg.contains("Register the file under one name"), "{msg}");
    assert_eq!(file_len(&path), before, "nothing written");
    // Also as a relaxation.
    assert!(
        acc.register_table_beside(
            unit.clone(),
            stated,
            Some("why"),
            std::slice::from_ref(&row)
        )
        .is_err()
    );
    assert_eq!(file_len(&path), before, "nothing written");
    // The same policy under a second name is one table.
    let same = TablePolicy {
        name: "t2".into(),
        ..row.clone()
    };
    acc.register_table_beside(same, stated, None, std::slice::from_ref(&row))
        .unwrap();
    // Without the check (another route to the record), the stale policy is refused in either
    // order, and the refusal says it came from this session.
    let recorded = acc.register_table(unit.clone()).unwrap();
    for planned in [
        vec![recorded.clone(), row.clone()],
        vec![row.clone(), recorded.clone()],
    ] {
        let err = acc.check_planned(&planned).unwrap_err();
        assert!(
            matches!(&err, AccountingError::PolicyChanged { table, here: true, .. }
                if table == "t1"),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("by this session"), "{msg}");
        assert!(!msg.contains("another process"), "{msg}");
    }
    acc.check_planned(std::slice::from_ref(&recorded)).unwrap();
}

/// Admission of one Gaussian charge on `demo:t`, planned under `planned`: refused (returns why).
fn refused_at_admission(a: &Accountant, planned: &TablePolicy) -> AccountingError {
    a.admit_planned(
        "q",
        &gauss("demo:t", 0.1),
        &[],
        None,
        std::slice::from_ref(planned),
        DEFAULT_QUERY_DELTA,
    )
    .unwrap_err()
}

/// Round 48, review "docsuser", F2: the filter a mechanism refusal advises accepts the refused
/// mechanism, for every mechanism kind a filter can refuse and every filter that can refuse
/// one: the filter named in `filter = "…"` is compiled at the table's budget and δ share and
/// given the event. zcdp is named only where it accepts it (never for DP-SGD's sampled curve
/// nor the relative Gaussian mechanism), and a table recorded in the ledger is told that the
/// change needs `relax` (a session-local one is not).
#[test]
fn r48_the_filter_a_mechanism_refusal_advises_accepts_the_refused_mechanism() {
    let kinds = [
        Event::Zcdp { rho: 0.01 },
        Event::PureDp { epsilon: 0.1 },
        Event::Laplace { epsilon: 0.1 },
        Event::Rgm {
            sigma: 5.0,
            gamma: 0.01,
            dims: 1,
            steps: 1,
        },
        Event::SubsampledGaussian {
            sample_rate: 0.01,
            noise_multiplier: 1.0,
            steps: 100,
        },
    ];
    let mut refusals = 0;
    for filter in [FilterKind::Gdp, FilterKind::Zcdp] {
        for ev in &kinds {
            for key in ["t:a", "mem:a"] {
                let path = temp_ledger();
                let acc = Accountant::open(&path).unwrap();
                let mut p = private(key, "a", 5.0);
                p.filter = filter;
                acc.register_table(p.clone()).unwrap();
                let own = p.compiled_filter().unwrap();
                let charge = [TableCharge {
                    key: TableKey::from(key),
                    events: vec![ev.clone()],
                }];
                let m = match acc.admit("q", &charge) {
                    Ok(_) => {
                        assert!(own.usage([ev]).refused.is_none(), "{filter} {ev:?}");
                        continue;
                    }
                    Err(e) => e.to_string(),
                };
                refusals += 1;
                assert!(own.usage([ev]).refused.is_some(), "{m}");
                let named = m
                    .split("`filter = \"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or_else(|| panic!("no filter named: {m}"));
                let kind: FilterKind = named.parse().unwrap();
                let advised = Filter::new(&p.budget, kind, p.delta_share).unwrap();
                assert!(advised.usage([ev]).refused.is_none(), "{named}: {m}");
                // Every filter the advice names accepts it.
                if m.contains("the filter zcdp") {
                    let z = Filter::new(&p.budget, FilterKind::Zcdp, p.delta_share).unwrap();
                    assert!(z.usage([ev]).refused.is_none(), "{m}");
                }
                assert_eq!(m.contains("`relax = \"<reason>\"`"), key == "t:a", "{m}");
            }
        }
    }
    // gdp refuses all five, zcdp the last two; each under both keys.
    assert_eq!(refusals, 2 * (5 + 2));
}

/// Round 48, review "docsuser", F1: the events of one call calibrated again at another ε give
/// back, at the call's own ε, the events its declaration charges (so that the bisection of
/// the most ε a refused call can use runs on that call's own costs), for every mechanism; a
/// partition selection's δ is none of a call's ε alone.
#[test]
fn r48_a_calls_events_at_its_own_epsilon_are_its_charged_events() {
    let call = |function: &str, delta: Option<f64>| CallRequest {
        key: TableKey::from("t:a"),
        function: function.into(),
        epsilon: Some(0.7),
        delta,
        mechanism: String::new(),
    };
    let rgm_sigma =
        dpfusion_udfs::mechanisms::rgm::calibrate_rgm_sigma(0.7, 1e-7, 0.02, 1, 1).unwrap();
    let sgd_z = dpfusion_udfs::privacy::sgd::noise_multiplier(0.01, 100, 0.7, 1e-7).unwrap();
    let cases = [
        (
            call("dp_median", None),
            vec![Event::PureDp { epsilon: 0.7 }],
        ),
        (
            call("dp_logreg_agd", Some(1e-7)),
            vec![Event::Zcdp {
                rho: dpfusion_udfs::privacy::zcdp_rho(0.7, 1e-7).unwrap(),
            }],
        ),
        (
            call("rgm_mean_by", Some(1e-7)),
            vec![Event::Rgm {
                sigma: rgm_sigma,
                gamma: 0.02,
                dims: 1,
                steps: 1,
            }],
        ),
        (
            call("dp_linreg_sgd", Some(1e-7)),
            vec![Event::SubsampledGaussian {
                sample_rate: 0.01,
                noise_multiplier: sgd_z,
                steps: 100,
            }],
        ),
    ];
    for (c, events) in &cases {
        let again = call_events_at(events, c, 0.7).unwrap();
        assert!(same_events(&again, events), "{again:?} {events:?}");
        // Less ε, more noise: a smaller charge under every filter's curve.
        let less = call_events_at(events, c, 0.63).unwrap();
        let p = |e: &[Event]| dpfusion_udfs::privacy::Profile::from_events(e).epsilon(1e-7);
        assert!(p(&less) < p(events), "{less:?} {events:?}");
    }
    // A selection's δ is no call's ε alone.
    let sel = [Event::Gaussian { mu: 0.1 }, Event::Delta { delta: 1e-9 }];
    assert!(call_events_at(&sel, &call("partition_selection", Some(2e-9)), 0.5).is_none());
}

/// Round 48, review "docsuser", F1 and F2, the texts: calls that are not all Gaussian and have
/// no number of their own are not told the Gaussian default query's ε; after an earlier charge
/// the filter cannot account for, rdp alone is named, without a word on zcdp; a session-local
/// table is not told about `relax`.
#[test]
fn r48_refusal_texts_without_a_gaussian_number_or_a_wrong_filter() {
    let refusal = |limit, numbers| {
        AccountingError::BudgetExceeded {
            table: "t".into(),
            key: TableKey::from("t:a"),
            cost: 0.0,
            spent: 0.0,
            remaining: 0.0,
            budget: Budget {
                epsilon: 1.0,
                delta: 1e-6,
            },
            why: Box::new(Refusal {
                filter: FilterKind::Gdp,
                limit,
                delta: DeltaState {
                    cost: 0.0,
                    spent: 0.0,
                    reserved: 5e-7,
                    delta_g: 5e-7,
                },
                numbers,
            }),
        }
        .to_string()
    };
    let e = refusal(
        Limit::Epsilon,
        RefusalNumbers {
            next_epsilon: 2.2648,
            other_mechanisms: true,
            ..RefusalNumbers::default()
        },
    );
    assert!(
        e.contains("Lower the calls' `epsilon =>` until EXPLAIN PRIVACY shows that the query fits")
            && !e.contains("2.2648")
            && !e.contains("one Gaussian call"),
        "{e}"
    );
    let m = refusal(
        Limit::Mechanism {
            mechanism: filter::mechanism_name(&Event::Zcdp { rho: 0.1 }),
            earlier: true,
        },
        RefusalNumbers {
            accepting_filters: vec![FilterKind::Rdp { order: None }],
            recorded: false,
            ..RefusalNumbers::default()
        },
    );
    assert!(
        m.contains("`filter = \"rdp\"`")
            && !m.contains("zcdp does not accept")
            && !m.contains("relax"),
        "{m}"
    );
}

/// Round 49 (review composition, F3): one file served under two names has one budget, and its
/// rows listed only the name registered last. Now every name the session serves a key under
/// has a row, with the same numbers; a name registered again for another file moves with it;
/// a key no name of this accountant serves keeps the ledger's name.
#[test]
fn budget_rows_show_every_name_a_key_is_served_under() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let a = acc.register_table(private("demo:t", "a", 3.0)).unwrap();
    let a2 = acc
        .register_table_beside(
            private("demo:t", "a2", 3.0),
            FilterChoice::default(),
            None,
            std::slice::from_ref(&a),
        )
        .unwrap();
    assert_eq!(a2.name, "a2");
    acc.admit("q", &gauss("demo:t", 0.1)).unwrap();
    let rows = acc.budget_rows();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "a2"]);
    assert_eq!(rows[0].key, rows[1].key);
    assert_eq!(rows[0].native, rows[1].native, "one budget");
    assert_eq!(rows[0].queries, 1);
    assert!(rows[0].native.used_share > 0);
    // `a2` now names another file: `a` alone serves demo:t.
    acc.register_table(private("demo:u", "a2", 1.0)).unwrap();
    let rows = acc.budget_rows();
    let named: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.key.as_str()))
        .collect();
    assert_eq!(named, [("a", "demo:t"), ("a2", "demo:u")]);
    // Another accountant on the ledger serves no name: one row a key, under the ledger's.
    let other = Accountant::open(&path).unwrap();
    let rows = other.budget_rows();
    let named: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.key.as_str()))
        .collect();
    assert_eq!(named, [("a", "demo:t"), ("a2", "demo:u")]);
}

/// Round 49 (review composition, F3): a charge, its receipt and a refusal named the table by
/// the name registered last (`charged a2` for a query on `a`). Now by the names the statement
/// read it by (its planned policies): the first as the name, the others as `also_read_as`.
#[test]
fn receipts_and_charges_name_the_table_as_the_statement_read_it() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let a = acc.register_table(private("demo:t", "a", 1.0)).unwrap();
    let a2 = acc
        .register_table_beside(
            private("demo:t", "a2", 1.0),
            FilterChoice::default(),
            None,
            std::slice::from_ref(&a),
        )
        .unwrap();
    let admit = |planned: &[TablePolicy], mu: f64| {
        acc.admit_planned("q", &gauss("demo:t", mu), &[], None, planned, 1e-7)
    };
    let r = admit(std::slice::from_ref(&a), 0.1).unwrap();
    assert_eq!(r.tables[0].name, "a");
    assert!(r.tables[0].also_read_as.is_empty());
    assert_eq!(r.table_names(), ["a"]);
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["tables"][0].get("also_read_as").is_none(), "{json}");
    assert_eq!(acc.ledger_entries().unwrap()[0].tables[0].name, "a");
    // Read under both names (charged once): named by both, in the order read.
    let r = admit(&[a2.clone(), a.clone()], 0.1).unwrap();
    assert_eq!(r.tables.len(), 1);
    assert_eq!(r.tables[0].name, "a2");
    assert_eq!(r.tables[0].also_read_as, ["a"]);
    assert_eq!(r.table_names(), ["a2", "a"]);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["tables"][0]["also_read_as"][0], "a", "{json}");
    // A refusal names the table as read too.
    let e = admit(std::slice::from_ref(&a), 100.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("budget exceeded for table 'a'"), "{e}");
    // Without planned policies: the ledger's name (the last registered).
    let r = acc.admit("q", &gauss("demo:t", 0.01)).unwrap();
    assert_eq!(r.tables[0].name, "a2");
}

/// Round 49 (review composition, F4): a statement that failed after its admission showed no
/// receipt. Its admission now puts the receipt in the statement's slot (in the task it runs
/// in): a charge's receipt is there, a refusal leaves it empty, and outside a scope nothing is
/// kept.
#[tokio::test]
async fn a_charge_puts_its_receipt_in_the_statements_slot() {
    let path = temp_ledger();
    let acc = Arc::new(Accountant::open(&path).unwrap());
    acc.register_table(private("demo:t", "t", 1.0)).unwrap();
    let slot = ReceiptSlot::default();
    let r = slot
        .scope(async { acc.admit("q", &gauss("demo:t", 0.1)).unwrap() })
        .await;
    let kept = slot.take().expect("the charge's receipt");
    assert_eq!(kept.tables[0].native, r.tables[0].native);
    assert_eq!(kept.tables[0].left_share, r.tables[0].left_share);
    assert!(slot.take().is_none(), "taken once");
    let refused = slot
        .scope(async { acc.admit("q", &gauss("demo:t", 100.0)) })
        .await;
    assert!(refused.is_err());
    assert!(slot.take().is_none(), "a refusal charges nothing");
    // Outside any scope, and in a scope of its own: each statement's slot is its own.
    acc.admit("q", &gauss("demo:t", 0.01)).unwrap();
    let other = ReceiptSlot::default();
    other
        .scope(async { acc.admit("q", &gauss("demo:t", 0.01)).unwrap() })
        .await;
    assert!(slot.take().is_none());
    assert!(other.take().is_some());
}

/// Round 50 (review crash, F1): another process charges `key` (registered under `name`) on
/// [`checkpoint::EVERY`] lines, then another one opens the ledger, which appends a checkpoint
/// record right after its replay.
fn another_process_checkpoints(path: &Path, key: &str, name: &str) {
    let b = Accountant::open(path).unwrap();
    b.register_table(private(key, name, 10.0)).unwrap();
    for i in 0..checkpoint::EVERY {
        b.admit(&format!("SELECT {i}"), &gauss(key, 0.001)).unwrap();
    }
    drop(b);
    let before = verify(path).unwrap().checkpoint_records;
    drop(Accountant::open(path).unwrap());
    assert_eq!(
        verify(path).unwrap().checkpoint_records,
        before + 1,
        "a checkpoint record was appended"
    );
}

/// The numbers of `rows` without the names they are shown under (a session shows a key under
/// the names it serves it by, a new session under the ledger's).
fn numbers(rows: Vec<BudgetRow>) -> String {
    let rows: Vec<BudgetRow> = rows
        .into_iter()
        .map(|r| BudgetRow {
            name: String::new(),
            ..r
        })
        .collect();
    format!("{rows:?}")
}

/// Round 50 (review crash, F1, variant A): a session that registered a recorded table under a
/// new name holds the recorded policy under that name, which no line has, so its state is not
/// a replay's. A checkpoint record another process appended is still read as a checkpoint, not
/// as a forgery: the session goes on admitting, with the numbers of a new session.
#[test]
fn a_session_holding_a_renamed_table_admits_after_another_process_checkpoints() {
    let path = temp_ledger();
    {
        let first = Accountant::open(&path).unwrap();
        first
            .register_table(private("demo:t", "staff", 10.0))
            .unwrap();
        first.admit("q0", &gauss("demo:t", 0.01)).unwrap();
    }
    let a = Accountant::open(&path).unwrap();
    let kept = a.register_table(private("demo:t", "people", 10.0)).unwrap();
    assert_eq!(kept.name, "people");
    assert_eq!(a.state().policies[&TableKey::from("demo:t")].name, "people");
    a.admit("before", &gauss("demo:t", 0.01)).unwrap();
    another_process_checkpoints(&path, "demo:t", "staff");
    let r = a.admit("after", &gauss("demo:t", 0.01)).unwrap();
    assert_eq!(r.tables[0].name, "people");
    assert_eq!(a.state().checkpoint_records, 1, "read as a checkpoint");
    // Its decisions and numbers are a new session's (which starts from that checkpoint).
    let fresh = Accountant::open(&path).unwrap();
    assert!(fresh.state().prefix.is_some());
    assert_eq!(numbers(a.budget_rows()), numbers(fresh.budget_rows()));
    assert_eq!(a.budget_rows()[0].queries, checkpoint::EVERY + 3);
    let big = gauss("demo:t", 500.0);
    let strip = |v: Vec<PreviewRow>| {
        v.into_iter()
            .map(|p| {
                format!(
                    "{:?}",
                    PreviewRow {
                        name: String::new(),
                        ..p
                    }
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(a.preview(&big).unwrap()),
        strip(fresh.preview(&big).unwrap())
    );
    assert!(!a.preview(&big).unwrap()[0].admitted);
    verify(&path).unwrap();
}

/// Round 50 (review crash, F1, variant B): a session holding a session-local table (a `result:`
/// key: its policy is never written, its charges are) admits after another process appended a
/// checkpoint; the session-local table's charges are all counted.
#[test]
fn a_session_holding_a_session_local_table_admits_after_another_process_checkpoints() {
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    a.register_table(private("demo:t", "t", 10.0)).unwrap();
    let mut local = private("result:r", "r", 5.0);
    // Another currency than the recorded table's: its sums are in the session's state only.
    local.filter = FilterKind::Rdp { order: Some(8.0) };
    a.register_table(local).unwrap();
    let both = [gauss("demo:t", 0.01), gauss("result:r", 0.1)].concat();
    a.admit("before", &both).unwrap();
    another_process_checkpoints(&path, "demo:t", "t");
    let r = a.admit("after", &both).unwrap();
    assert_eq!(r.tables.len(), 2);
    let rows = a.budget_rows();
    let local_row = rows.iter().find(|r| r.name == "r").unwrap();
    assert_eq!(local_row.queries, 2);
    let fresh = Accountant::open(&path).unwrap();
    let recorded = |rows: Vec<BudgetRow>| {
        numbers(
            rows.into_iter()
                .filter(|r| r.key == TableKey::from("demo:t"))
                .collect(),
        )
    };
    assert_eq!(recorded(a.budget_rows()), recorded(fresh.budget_rows()));
    assert!(fresh.policy(&TableKey::from("result:r")).is_none());
    verify(&path).unwrap();
}

/// Appends `record` (a JSON object without its `prev`) chained after the ledger's last line,
/// and seals it in the sidecar: what someone who can write the ledger's directory can do.
/// Returns the new line's number.
fn append_chained(path: &Path, mut record: serde_json::Value) -> u64 {
    let text = fs::read_to_string(path).unwrap();
    let last = text.lines().last().unwrap();
    record["prev"] = serde_json::Value::String(sha256_hex_for_test(last.as_bytes()));
    let line = record.to_string();
    append_raw(path, &format!("{line}\n"));
    let n = text.lines().count() as u64 + 1;
    let head: serde_json::Value =
        serde_json::from_slice(&fs::read(head_path(path)).unwrap()).unwrap();
    let seal = serde_json::json!({"format": LEDGER_FORMAT, "ledger_id": head["ledger_id"],
        "lines": n, "hash": sha256_hex_for_test(line.as_bytes())});
    fs::write(head_path(path), seal.to_string()).unwrap();
    n
}

/// Appends, chained and sealed, a checkpoint record at the wrong place (naming one line too
/// few, with a made-up digest); its line number.
fn append_misplaced_checkpoint(path: &Path) -> u64 {
    let lines = fs::read_to_string(path).unwrap().lines().count();
    append_chained(
        path,
        serde_json::json!({"record": "checkpoint", "lines": lines - 1,
            "layout": checkpoint::LAYOUT, "state_sha256": "00".repeat(32)}),
    )
}

/// Round 50 (review crash, F1): a checkpoint record whose digest is not the replay's is refused
/// by every replay from line 1 (`verify`, `reseal`, a session opening without a checkpoint
/// file), as before; a running session, whose state is not a replay, checks its place in the
/// chain (its line count, its `prev`) and goes on: it never loads a state from the record.
#[test]
fn a_checkpoint_record_is_checked_for_its_place_in_a_catch_up_and_its_digest_in_a_replay() {
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    a.register_table(private("demo:t", "t", 10.0)).unwrap();
    a.admit("q", &gauss("demo:t", 0.1)).unwrap();
    let lines = fs::read_to_string(&path).unwrap().lines().count();
    let forged = append_chained(
        &path,
        serde_json::json!({"record": "checkpoint", "lines": lines,
            "layout": checkpoint::LAYOUT, "state_sha256": "00".repeat(32)}),
    );
    a.admit("q", &gauss("demo:t", 0.1)).unwrap();
    assert_eq!(a.budget_rows()[0].queries, 2);
    let digest = |e: AccountingError| {
        assert!(
            matches!(e, AccountingError::Corrupt { line, .. } if line == forged),
            "{e}"
        );
        assert!(e.to_string().contains("state digest"), "{e}");
    };
    digest(verify(&path).unwrap_err());
    digest(reseal(&path, None).unwrap_err());
    digest(Accountant::open(&path).err().unwrap());
    // At the wrong place (naming one line too few), a running session refuses it too.
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    a.register_table(private("demo:t", "t", 10.0)).unwrap();
    let misplaced = append_misplaced_checkpoint(&path);
    let err = a.admit("q", &gauss("demo:t", 0.1)).unwrap_err();
    assert!(
        matches!(err, AccountingError::Corrupt { line, .. } if line == misplaced),
        "{err}"
    );
    assert!(err.to_string().contains("reordered"), "{err}");
}

/// Round 50 (review crash, F2): a catch-up that fails at a line (here a checkpoint record at the
/// wrong place after three charges of another process) applies none of the lines it read: the
/// state is as it was, the budget shown too, and nothing is admitted. The next catch-up reads
/// them again from the same place, so once the owner removed the bad line every charge counts
/// (never an under-count).
#[test]
fn a_catch_up_that_fails_at_a_line_leaves_the_state_as_it_was() {
    let path = temp_ledger();
    let a = Accountant::open(&path).unwrap();
    a.register_table(private("demo:t", "t", 10.0)).unwrap();
    a.admit("q", &gauss("demo:t", 0.1)).unwrap();
    let snapshot = |a: &Accountant| {
        let st = a.state();
        (
            checkpoint::state_bytes(&st).unwrap(),
            (st.offset, st.lines, st.hashes.len(), st.entries.len()),
            (st.checkpoint_line, st.checkpoint_records),
        )
    };
    let before = snapshot(&a);
    let rows = format!("{:?}", a.budget_rows());
    let b = Accountant::open(&path).unwrap();
    for _ in 0..3 {
        b.admit("b", &gauss("demo:t", 0.1)).unwrap();
    }
    drop(b);
    let good = file_len(&path);
    let bad = append_misplaced_checkpoint(&path);
    let err = a.admit("q", &gauss("demo:t", 0.1)).unwrap_err();
    assert!(
        matches!(err, AccountingError::Corrupt { line, .. } if line == bad),
        "{err}"
    );
    assert_eq!(snapshot(&a), before, "none of the lines before it applied");
    assert_eq!(format!("{:?}", a.budget_rows()), rows);
    assert!(a.preview(&gauss("demo:t", 0.1)).is_err());
    // The owner removes the line and reseals: the next catch-up counts the three charges.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(good)
        .unwrap();
    reseal(&path, None).unwrap();
    a.admit("q", &gauss("demo:t", 0.1)).unwrap();
    let fresh = Accountant::open(&path).unwrap();
    assert_eq!(a.budget_rows()[0].queries, 5);
    assert_eq!(
        format!("{:?}", a.budget_rows()),
        format!("{:?}", fresh.budget_rows())
    );
}

/// Every `FilterChoice` stated (the registration states its budget, filter and δ share).
fn all_stated() -> FilterChoice {
    FilterChoice {
        kind: true,
        delta_share: true,
        budget: true,
    }
}

/// Round 52 (review operator, F2): a `relax` left in the catalog recorded every later weakening
/// under its old reason, silently. A reason approves one change: a registration that gives a
/// reason the ledger recorded for the key before, and would make a new change, is refused with
/// nothing written (also after a restart, and from a checkpoint); the same registration with
/// it is kept; a new reason is recorded; `verify` lists every relaxation.
#[test]
fn a_relax_reason_approves_one_change() {
    let path = temp_ledger();
    let key = "/data/salaries.csv";
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private(key, "salaries", 1.0)).unwrap();
    acc.admit("q", &gauss(key, 0.1)).unwrap();
    let board = "approved by the board 2026-01";
    acc.register_table_with(private(key, "salaries", 2.0), all_stated(), Some(board))
        .unwrap();
    let relaxed_at = verify(&path).unwrap().lines;
    // Left in the catalog, it keeps the same registration (nothing differs, nothing written).
    let before = file_len(&path);
    let kept = acc
        .register_table_with(private(key, "salaries", 2.0), all_stated(), Some(board))
        .unwrap();
    assert_eq!(kept.budget.epsilon, 2.0);
    assert_eq!(file_len(&path), before);
    // A slip under the old reason: refused, naming the earlier change and the new one.
    let mut slip = private(key, "salaries", 50.0);
    slip.public_columns = vec!["salary".into()];
    let refused = |acc: &Accountant, reason: &str| match acc.register_table_with(
        slip.clone(),
        all_stated(),
        Some(reason),
    ) {
        Err(AccountingError::PolicyConflict(m)) => m,
        other => panic!("{other:?}"),
    };
    for reason in [board, "  approved by the board 2026-01 "] {
        let m = refused(&acc, reason);
        assert!(
            m.contains(&format!(
                "the reason '{board}' was recorded for an earlier change at line {relaxed_at}"
            )) && m.contains("[budget ε 1 → 2]")
                && m.contains("write a new reason for this one ([budget ε 2 → 50; public columns [] → [salary]])")
                && m.contains("remove `relax`"),
            "{m}"
        );
        assert_eq!(file_len(&path), before, "nothing written");
    }
    assert_eq!(
        acc.policy(&TableKey::from(key)).unwrap().budget.epsilon,
        2.0
    );
    // The same after a restart, and from a checkpoint (the reasons are in its state).
    drop(acc);
    another_process_checkpoints(&path, "/data/other.csv", "other");
    let acc = Accountant::open(&path).unwrap();
    assert!(
        acc.state().checkpoint_line > 0,
        "opened from the checkpoint"
    );
    refused(&acc, board);
    // A new reason approves the new change.
    let r = acc
        .register_table_with(slip.clone(), all_stated(), Some("second board decision"))
        .unwrap();
    assert!(
        r.relaxed
            .as_deref()
            .is_some_and(|n| n.starts_with("second board decision [budget ε 2 → 50")),
        "{r:?}"
    );
    // A reason is the key's own: another key may give the same one.
    acc.register_table(private("/data/b.csv", "b", 1.0))
        .unwrap();
    acc.register_table_with(private("/data/b.csv", "b", 3.0), all_stated(), Some(board))
        .unwrap();
    // `verify` lists every relaxation, with its line.
    let report = verify(&path).unwrap();
    let t = report
        .tables
        .iter()
        .find(|t| t.key.as_str() == key)
        .unwrap();
    assert_eq!(t.relaxations.len(), 2, "{:?}", t.relaxations);
    assert_eq!(t.relaxations[0].line, relaxed_at);
    let notes: Vec<&String> = report
        .notes
        .iter()
        .filter(|n| n.contains("the owner relaxed its policy at line"))
        .collect();
    assert_eq!(notes.len(), 3, "{:?}", report.notes);
    assert!(
        notes[0].contains("table 'b' (/data/b.csv): the owner relaxed its policy at line")
            && notes[1].contains(&format!("at line {relaxed_at}: {board} [budget ε 1 → 2]")),
        "{notes:?}"
    );
}

/// Round 52 (review operator, F3): a record that voids a table's guarantee (private → public,
/// public → private, a change of the neighbour relation on a table with charges) makes its
/// guarantee none from that line on: `SHOW BUDGET`'s `epsilon` is +∞ and `verify` says "guarantee:
/// none since line N (why)", also after a restart. What is left and the refusals are as before.
/// A lowered budget, and a relation change on a table without charges, keep the guarantee.
#[test]
fn a_public_period_or_a_relation_change_on_charges_leaves_no_guarantee() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let public = |key: &str, name: &str| TablePolicy {
        visibility: Visibility::Public,
        ..private(key, name, 1.0)
    };
    let replace = |key: &str, name: &str| TablePolicy {
        neighbours: Neighbours::Replace,
        ..private(key, name, 1.0)
    };
    // a: private, charged, made public by the owner, then private again (stricter).
    acc.register_table(private("/d/a.csv", "a", 1.0)).unwrap();
    acc.admit("q", &gauss("/d/a.csv", 0.1)).unwrap();
    acc.owner_set_policy(public("/d/a.csv", "a"), "open data release")
        .unwrap();
    let a_public = verify(&path).unwrap().lines;
    acc.register_table(private("/d/a.csv", "a", 0.5)).unwrap();
    // b: public first, then private (a `policy` record).
    acc.register_table(public("/d/b.csv", "b")).unwrap();
    acc.register_table(private("/d/b.csv", "b", 1.0)).unwrap();
    let b_private = verify(&path).unwrap().lines;
    // c: replace, charged, then add_remove with the owner's reason.
    acc.register_table(replace("/d/c.csv", "c")).unwrap();
    acc.admit("q", &gauss("/d/c.csv", 0.1)).unwrap();
    acc.register_table_with(
        private("/d/c.csv", "c", 1.0),
        all_stated(),
        Some("presence"),
    )
    .unwrap();
    let c_relation = verify(&path).unwrap().lines;
    // d: replace → add_remove without charges (stricter: recorded); e: charged, budget lowered.
    acc.register_table(replace("/d/d.csv", "d")).unwrap();
    acc.register_table(private("/d/d.csv", "d", 1.0)).unwrap();
    acc.register_table(private("/d/e.csv", "e", 1.0)).unwrap();
    acc.admit("q", &gauss("/d/e.csv", 0.1)).unwrap();
    acc.register_table(private("/d/e.csv", "e", 0.5)).unwrap();
    let check = |acc: &Accountant| {
        let rows: BTreeMap<String, BudgetRow> = acc
            .budget_rows()
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        for (name, line, why) in [
            ("a", a_public, "made public"),
            ("b", b_private, "was public before"),
            ("c", c_relation, "neighbours replace → add_remove"),
        ] {
            let r = &rows[name];
            assert_eq!(r.epsilon, f64::INFINITY, "{name}");
            let n = r.no_guarantee.as_ref().unwrap();
            assert_eq!(n.line, line, "{name}: {n:?}");
            assert!(n.why.contains(why), "{name}: {n:?}");
        }
        assert_eq!(rows["d"].epsilon, 1.0);
        assert_eq!(
            rows["e"].epsilon, 1.0,
            "a lowered budget keeps the guarantee"
        );
        assert!(rows["d"].no_guarantee.is_none() && rows["e"].no_guarantee.is_none());
        // What is left is measured against the budget in force, as before.
        assert!(rows["c"].native.used_share > 0);
    };
    check(&acc);
    // The filter still bounds later charges.
    exhaust(&acc, "/d/c.csv", 0.3);
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    check(&acc);
    let report = verify(&path).unwrap();
    for (name, line) in [("a", a_public), ("b", b_private), ("c", c_relation)] {
        let t = report.tables.iter().find(|t| t.name == name).unwrap();
        assert_eq!(
            t.budget_row.as_ref().map(|r| r.epsilon),
            Some(f64::INFINITY),
            "{name}"
        );
        assert_eq!(
            t.no_guarantee.as_ref().map(|n| n.line),
            Some(line),
            "{name}"
        );
        assert!(
            report.notes.iter().any(|n| n.contains(&format!(
                "table '{name}' (/d/{name}.csv): guarantee: none since line {line} ("
            ))),
            "{name}: {:?}",
            report.notes
        );
    }
    assert!(
        !report
            .notes
            .iter()
            .any(|n| n.contains("table 'd'") || n.contains("table 'e'")),
        "{:?}",
        report.notes
    );
}

/// `/d/purchases.csv` as table `name`, its privacy unit `customer` in `domain`.
fn purchases_with_unit(name: &str, domain: &str) -> TablePolicy {
    TablePolicy {
        unit: Some(PrivacyUnit {
            domain: domain.to_string(),
            ..PrivacyUnit::new("customer", name)
        }),
        ..private("/d/purchases.csv", name, 1.0)
    }
}

/// Round 52 (review operator, F6): renaming a table with a privacy unit whose domain was the
/// default (its name) changed the domain, a change of the neighbour relation that needed
/// `relax`. A registration whose domain is its own name (the default) keeps the recorded domain,
/// with nothing written; a domain stated otherwise is still a change.
#[test]
fn renaming_a_unit_table_keeps_its_recorded_domain() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(purchases_with_unit("purchases", "purchases"))
        .unwrap();
    acc.admit("q", &gauss("/d/purchases.csv", 0.1)).unwrap();
    let before = file_len(&path);
    let kept = acc
        .register_table(purchases_with_unit("orders", "orders"))
        .unwrap();
    assert_eq!(kept.name, "orders");
    assert_eq!(kept.unit.as_ref().unwrap().domain, "purchases");
    assert_eq!(file_len(&path), before, "nothing written");
    assert_eq!(acc.budget_rows()[0].queries, 1, "the same budget");
    // A domain stated otherwise is a change of the relation, on a table with charges.
    match acc.register_table(purchases_with_unit("orders", "people")) {
        Err(AccountingError::PolicyConflict(m)) => {
            assert!(
                m.contains("(domain purchases) → customer (domain people)"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    // A recorded domain of another name is kept too when the registration states none.
    acc.register_table_with(
        purchases_with_unit("orders", "people"),
        all_stated(),
        Some("one domain"),
    )
    .unwrap();
    let kept = acc
        .register_table(purchases_with_unit("sales", "sales"))
        .unwrap();
    assert_eq!(kept.unit.as_ref().unwrap().domain, "people");
}

/// Review "fixes2a" F2: before round 52 a rename of a unit table whose domain was its name
/// was recorded, with the owner's `relax` (as the refusal advised), as a change of domain. That
/// record is no change of the neighbour relation: the table keeps its guarantee, on append and
/// on replay; a domain changed otherwise on charges still voids it.
#[test]
fn an_old_rename_of_a_unit_table_keeps_its_guarantee() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(purchases_with_unit("purchases", "purchases"))
        .unwrap();
    acc.admit("q", &gauss("/d/purchases.csv", 0.1)).unwrap();
    // As a version before round 52 recorded the rename.
    acc.owner_set_policy(purchases_with_unit("orders", "orders"), "renamed")
        .unwrap();
    let row = |acc: &Accountant| acc.budget_rows().into_iter().next().unwrap();
    assert!(row(&acc).no_guarantee.is_none() && row(&acc).epsilon == 1.0);
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert!(row(&acc).no_guarantee.is_none() && row(&acc).epsilon == 1.0);
    // A domain of another name than the table's: a change of the relation.
    acc.owner_set_policy(purchases_with_unit("orders", "people"), "one domain")
        .unwrap();
    assert!(row(&acc).no_guarantee.is_some() && row(&acc).epsilon.is_infinite());
}

/// Round 52 (review operator, F1, the name part): moving a private table's file (a new path,
/// a new key) gave it a fresh budget, silently. A new private file key registered under a name
/// the ledger holds for another private file key with charges is refused, naming both paths and
/// what was used, unless the owner relaxes it; then an `owner` record says so. Not refused: a
/// key without charges under the name, a public registration, a key that is not a file (demo,
/// session-local), another name, the same key, a table this session registered under another
/// name since.
#[test]
fn a_new_path_under_a_charged_tables_name_needs_the_owners_reason() {
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    let (old, new) = ("/data/salaries.csv", "/data2/salaries.csv");
    acc.register_table(private(old, "salaries", 1.0)).unwrap();
    acc.register_table(private("/data/idle.csv", "idle", 1.0))
        .unwrap();
    acc.admit("q", &gauss(old, 0.1)).unwrap();
    let before = file_len(&path);
    let m = match acc.register_table(private(new, "salaries", 1.0)) {
        Err(AccountingError::PolicyConflict(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(
        m.contains(&format!(
            "table 'salaries' was registered from {old} with charges ("
        )) && m.contains("% of its budget ε 1 δ 1e-6 used)")
            && m.contains(&format!(
                "a registration from {new} would start a new budget"
            ))
            && m.contains(&format!("register it from {old}"))
            && m.contains("relax = \"<reason>\""),
        "{m}"
    );
    // The same after a restart.
    drop(acc);
    let acc = Accountant::open(&path).unwrap();
    assert!(acc.register_table(private(new, "salaries", 1.0)).is_err());
    assert_eq!(file_len(&path), before, "nothing written");
    // Not refused.
    acc.register_table(private("/data2/idle.csv", "idle", 1.0))
        .unwrap();
    acc.register_table(TablePolicy {
        visibility: Visibility::Public,
        ..private("/data3/salaries.csv", "salaries", 1.0)
    })
    .unwrap();
    acc.register_table(private("demo:salaries", "salaries", 1.0))
        .unwrap();
    acc.register_table(private("mem:salaries", "salaries", 1.0))
        .unwrap();
    acc.register_table(private("/data2/pay.csv", "pay", 1.0))
        .unwrap();
    acc.register_table(private(old, "salaries", 1.0)).unwrap();
    // With the owner's reason: an `owner` record with the reason and the new budget.
    let r = acc
        .register_table_with(
            private(new, "salaries", 1.0),
            all_stated(),
            Some("moved to a new disk for good"),
        )
        .unwrap();
    let note = r.relaxed.unwrap();
    assert!(
        note.starts_with("moved to a new disk for good [a new budget for table 'salaries'")
            && note.contains(old),
        "{note}"
    );
    // Left in the catalog: kept, nothing written.
    let before = file_len(&path);
    acc.register_table_with(
        private(new, "salaries", 1.0),
        all_stated(),
        Some("moved to a new disk for good"),
    )
    .unwrap();
    assert_eq!(file_len(&path), before);
    assert!(
        verify(&path)
            .unwrap()
            .notes
            .iter()
            .any(|n| n.contains("moved to a new disk for good")),
    );
    // A table this session serves under another name since does not hold the name.
    acc.register_table(private("/d/x.csv", "x", 1.0)).unwrap();
    acc.admit("q", &gauss("/d/x.csv", 0.1)).unwrap();
    acc.register_table(private("/d/x.csv", "y", 1.0)).unwrap();
    acc.register_table(private("/e/x.csv", "x", 1.0)).unwrap();
    // Review "fixes2a" F1: the reason of one move approves no other (each move is a new key),
    // whether or not the key it moved to was charged since; a new reason does.
    acc.admit("q", &gauss(new, 0.1)).unwrap();
    let third = "/data3/private/salaries.csv";
    let before = file_len(&path);
    let m = match acc.register_table_with(
        private(third, "salaries", 1.0),
        all_stated(),
        Some("  moved to a new disk for good "),
    ) {
        Err(AccountingError::PolicyConflict(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(
        m.contains("the reason 'moved to a new disk for good' was recorded for an earlier change"),
        "{m}"
    );
    assert_eq!(file_len(&path), before, "nothing written");
    acc.register_table_with(
        private(third, "salaries", 1.0),
        all_stated(),
        Some("moved again, to the archive"),
    )
    .unwrap();
    // Review "fixes3" F2: nor when the copy it was recorded for is called otherwise now.
    acc.admit("q", &gauss(third, 0.1)).unwrap();
    acc.register_table(private(third, "old_salaries", 1.0))
        .unwrap();
    assert!(
        acc.register_table_with(
            private("/data4/salaries.csv", "salaries", 1.0),
            all_stated(),
            Some("moved again, to the archive"),
        )
        .is_err()
    );
}

/// Review "fixes2a" F4: a recorded note's reason is what precedes its changes, brackets in the
/// reason included; a shorter reason is another reason.
#[test]
fn a_notes_reason_is_what_precedes_its_changes() {
    use super::policy::reason_of;
    assert_eq!(reason_of("board [budget ε 1 → 2]"), "board");
    assert_eq!(
        reason_of("board [minutes 3] [budget ε 1 → 2; public columns [a] → [a, b]]"),
        "board [minutes 3]"
    );
    assert_eq!(
        reason_of("moved [a new budget for table 't', registered before from /a (1% used)]"),
        "moved"
    );
    assert_eq!(reason_of("no changes listed"), "no changes listed");
    let path = temp_ledger();
    let acc = Accountant::open(&path).unwrap();
    acc.register_table(private("/d/t.csv", "t", 1.0)).unwrap();
    acc.register_table_with(
        private("/d/t.csv", "t", 2.0),
        all_stated(),
        Some("board [minutes 3]"),
    )
    .unwrap();
    // "board" is not "board [minutes 3]": a new reason, recorded.
    acc.register_table_with(private("/d/t.csv", "t", 3.0), all_stated(), Some("board"))
        .unwrap();
    assert!(
        acc.register_table_with(
            private("/d/t.csv", "t", 4.0),
            all_stated(),
            Some("board [minutes 3]")
        )
        .is_err()
    );
}
