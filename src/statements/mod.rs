//! Session statements and their result tables: `SHOW BUDGET` / `dp_budget()`, `dp_ledger()`,
//! `EXPLAIN PRIVACY`, the registration summary, and how refusals and receipts are printed.
pub mod bigquery;
pub mod help;
pub mod named_args;
pub mod readable_names;

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use crate::accounting::display::{Round, SHARE_SCALE, shown, used_of_shown};
use crate::accounting::{
    Accountant, BudgetRow, LedgerEntry, Neighbours, PreviewRow, Receipt, TableKey, TablePolicy,
    Visibility,
};
use crate::guard::{DpCall, GuardedTable, TableInfo};

fn batch(cols: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )?)
}

fn strings<I: IntoIterator<Item = S>, S: Into<String>>(it: I) -> ArrayRef {
    Arc::new(StringArray::from(
        it.into_iter().map(|s| s.into()).collect::<Vec<String>>(),
    ))
}

fn floats<I: IntoIterator<Item = f64>>(it: I) -> ArrayRef {
    Arc::new(Float64Array::from(it.into_iter().collect::<Vec<f64>>()))
}

/// A share in millionths as a percentage (full precision: CSV and JSON keep it; the table
/// format prints six significant digits).
fn pct(share: u64) -> f64 {
    share as f64 / (SHARE_SCALE as f64 / 100.0)
}

/// `SHOW BUDGET` / `dp_budget()`: per private table, the guarantee (the largest ε and δ budgets
/// in force), the filter and its unit, the sum used in that unit against its budget, the share
/// used and left in percent, the largest ε one default query could still use
/// (`remaining_epsilon`: one Gaussian call at the δ the rows were computed at, the session's
/// `dpfusion.default_delta` in `SHOW BUDGET`), the number of charged queries, and the additive
/// δ of partition selection spent and left (docs/ACCOUNTING.md, "What the numbers mean"). The
/// guarantee (`epsilon`, `delta`) is the owner's number, unrounded (display::budget). A table
/// served under several names has a row under each (every name an analyst can query), with
/// the same numbers, and `same_budget_as` lists its other names: one budget, to be counted
/// once (NULL for a table of one name; round 49, review composition F3).
pub fn budget_batch(rows: &[BudgetRow]) -> Result<RecordBatch> {
    budget_batch_of(rows, rows)
}

/// The other names of `row`'s table among `rows` (rows of its key under another name): the
/// names the session serves the same file under, whose rows show the same budget (round 49).
pub fn same_budget_as<'a>(row: &BudgetRow, rows: &'a [BudgetRow]) -> Vec<&'a str> {
    rows.iter()
        .filter(|r| r.key == row.key && r.name != row.name)
        .map(|r| r.name.as_str())
        .collect()
}

/// [`budget_batch`] of `rows`, their other names found among `all`.
fn budget_batch_of(rows: &[BudgetRow], all: &[BudgetRow]) -> Result<RecordBatch> {
    let shared: Vec<Option<String>> = rows
        .iter()
        .map(|r| {
            let others = same_budget_as(r, all);
            (!others.is_empty()).then(|| others.join(", "))
        })
        .collect();
    batch(vec![
        ("table", strings(rows.iter().map(|r| r.name.clone()))),
        ("epsilon", floats(rows.iter().map(|r| r.epsilon))),
        ("delta", floats(rows.iter().map(|r| r.delta))),
        ("filter", strings(rows.iter().map(|r| r.filter.to_string()))),
        ("unit", strings(rows.iter().map(|r| r.native.unit.clone()))),
        // Used rounded up and the budget rounded down, shown together (display::used_of): with
        // more digits where six would show a budget not used up as used up or overspent (round
        // 47, review "newuser2", B).
        (
            "used",
            floats(
                rows.iter()
                    .map(|r| used_of_shown(r.native.used, r.native.budget).0),
            ),
        ),
        (
            "budget",
            floats(
                rows.iter()
                    .map(|r| used_of_shown(r.native.used, r.native.budget).1),
            ),
        ),
        (
            "used_pct",
            floats(rows.iter().map(|r| pct(r.native.used_share))),
        ),
        (
            "left_pct",
            floats(
                rows.iter()
                    .map(|r| pct(SHARE_SCALE.saturating_sub(r.native.used_share))),
            ),
        ),
        (
            "remaining_epsilon",
            floats(rows.iter().map(|r| shown(r.remaining, Round::Down))),
        ),
        (
            "queries",
            Arc::new(UInt64Array::from(
                rows.iter().map(|r| r.queries).collect::<Vec<u64>>(),
            )),
        ),
        (
            "spent_delta",
            floats(rows.iter().map(|r| shown(r.delta_spent, Round::Up))),
        ),
        (
            "remaining_delta",
            floats(rows.iter().map(|r| shown(r.delta_left, Round::Down))),
        ),
        (
            "same_budget_as",
            Arc::new(StringArray::from(shared)) as ArrayRef,
        ),
    ])
}

/// `DESCRIBE t`: one row per column of the table's schema (the pinned one for an owner's table),
/// as DataFusion prints it: `column_name`, `data_type`, `is_nullable` (`YES`/`NO`). Reads no row.
pub fn describe_batch(schema: &Schema) -> Result<RecordBatch> {
    let fields = schema.fields();
    batch(vec![
        (
            "column_name",
            strings(fields.iter().map(|f| f.name().clone())),
        ),
        (
            "data_type",
            strings(fields.iter().map(|f| f.data_type().to_string())),
        ),
        (
            "is_nullable",
            strings(
                fields
                    .iter()
                    .map(|f| if f.is_nullable() { "YES" } else { "NO" }),
            ),
        ),
    ])
}

/// `dp_ledger()`: every charge, oldest first, one row per (charge, table).
///
/// `viewer` is the analyst who asks (`dpfusion serve`); they see the SQL text and its hash of
/// their own charges only: `query` and `query_sha256` are NULL in everyone else's (an unsalted
/// hash would let an analyst confirm a guess at another's query: round 46). The data owner's
/// own view (`viewer` None: the CLI, the Rust API) shows every text. `query` holds what the
/// ledger stores: at most the first 4 KiB of the text; `query_sha256` is the hash of the whole.
pub fn ledger_batch(entries: &[LedgerEntry], viewer: Option<&str>) -> Result<RecordBatch> {
    let mut seq = Vec::new();
    let mut time = Vec::new();
    let mut query = Vec::new();
    let mut table = Vec::new();
    let mut request: Vec<Option<String>> = Vec::new();
    let mut unit: Vec<Option<String>> = Vec::new();
    let mut cost: Vec<Option<f64>> = Vec::new();
    let mut cost_pct: Vec<Option<f64>> = Vec::new();
    let mut used_pct: Vec<Option<f64>> = Vec::new();
    let mut delta = Vec::new();
    let mut profile = Vec::new();
    let mut analyst: Vec<Option<String>> = Vec::new();
    let mut hash: Vec<Option<String>> = Vec::new();
    for e in entries {
        let own = viewer.is_none() || e.analyst.as_deref() == viewer;
        for t in &e.tables {
            analyst.push(e.analyst.clone());
            seq.push(e.seq);
            time.push(e.time.clone());
            query.push(own.then(|| e.query.clone()));
            hash.push(own.then(|| e.query_sha256.clone()).flatten());
            table.push(t.name.clone());
            request.push((!t.requests.is_empty()).then(|| {
                t.requests
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }));
            unit.push(t.native.as_ref().map(|n| n.unit.clone()));
            cost.push(t.native.as_ref().map(|n| shown(n.cost, Round::Up)));
            // Never 0 for a positive charge (round 47): `< 0.0001%` in the receipts.
            cost_pct.push(
                t.native
                    .as_ref()
                    .map(|n| pct(crate::accounting::display::charge_share(n.share, n.cost))),
            );
            used_pct.push(t.native.as_ref().map(|n| pct(n.used_share)));
            delta.push(t.delta);
            profile.push(serde_json::to_string(&t.events).unwrap_or_default());
        }
    }
    batch(vec![
        ("seq", Arc::new(UInt64Array::from(seq)) as ArrayRef),
        ("time", strings(time)),
        ("query", Arc::new(StringArray::from(query)) as ArrayRef),
        ("table", strings(table)),
        // The calls as written; the cost in the filter's unit and as a share of the budget, and
        // the share used after the charge (NULL in charges written before issue 29).
        ("request", Arc::new(StringArray::from(request)) as ArrayRef),
        ("unit", Arc::new(StringArray::from(unit)) as ArrayRef),
        ("cost", Arc::new(Float64Array::from(cost)) as ArrayRef),
        (
            "cost_pct",
            Arc::new(Float64Array::from(cost_pct)) as ArrayRef,
        ),
        (
            "used_pct",
            Arc::new(Float64Array::from(used_pct)) as ArrayRef,
        ),
        // δ_g: the δ at which the filter converts its ε part.
        ("delta", floats(delta)),
        ("profile", strings(profile)),
        // Who spent it (`dpfusion serve`: the authenticated analyst; NULL otherwise).
        ("analyst", Arc::new(StringArray::from(analyst)) as ArrayRef),
        // SHA-256 of the whole SQL text (NULL, like `query`, in other analysts' charges).
        (
            "query_sha256",
            Arc::new(StringArray::from(hash)) as ArrayRef,
        ),
    ])
}

/// `EXPLAIN PRIVACY`: one row per DP release (its `epsilon`, `delta` and mechanism as written),
/// then one summary row per table: the cost in the filter's unit (`cost`, `unit`) and as a share
/// of the budget (`cost_pct`), the shares used and left after the query, the largest ε one
/// default query could use after it (`remaining_epsilon_after`, at the session's default δ; for
/// a refused query, what it is now), the additive δ (partition selection) spent and left after
/// it, the table's filter, and when it would be refused, the binding limit (and NULL shares
/// used and left after it: nothing would be charged) (`epsilon`, `delta for partition selection`, or the mechanism the filter does
/// not accept). A cost the filter cannot bound is NULL, never `inf`: the limit column says why.
pub fn explain_privacy_batch(calls: &[DpCall], preview: &[PreviewRow]) -> Result<RecordBatch> {
    let mut table = Vec::new();
    let mut release = Vec::new();
    let mut eps = Vec::new();
    let mut delta = Vec::new();
    let mut mechanism: Vec<Option<String>> = Vec::new();
    let mut cost = Vec::new();
    let mut unit: Vec<Option<String>> = Vec::new();
    let mut cost_pct = Vec::new();
    let mut used = Vec::new();
    let mut left = Vec::new();
    let mut next = Vec::new();
    let mut admitted: Vec<Option<bool>> = Vec::new();
    let mut spent_delta = Vec::new();
    let mut remaining_delta = Vec::new();
    let mut filter: Vec<Option<String>> = Vec::new();
    let mut limit: Vec<Option<String>> = Vec::new();
    let mut bounds: Vec<Option<String>> = Vec::new();
    let mut noise: Vec<Option<String>> = Vec::new();
    let finite = |x: f64| x.is_finite().then_some(x);
    for c in calls {
        bounds.push(c.bounds.clone());
        noise.push(c.noise.clone());
        table.push(c.table.name.clone());
        release.push(c.display.clone());
        eps.push(finite(c.epsilon));
        delta.push(finite(c.delta));
        // As written (round 47): a Laplace call is `laplace`, not the `pure_dp` it is charged as.
        mechanism.push(Some(crate::accounting::written_mechanism(
            &c.function,
            &crate::accounting::mechanism_of(&c.events),
        )));
        cost.push(None);
        unit.push(None);
        cost_pct.push(None);
        used.push(None);
        left.push(None);
        next.push(None);
        admitted.push(None);
        spent_delta.push(None);
        remaining_delta.push(None);
        filter.push(None);
        limit.push(None);
    }
    for p in preview {
        // Named as the statement read it (its calls' tables), not by the name registered last
        // (round 49, review composition F3).
        let read = calls.iter().map(|c| (&c.table.key, c.table.name.as_str()));
        let names = crate::accounting::names_read(read, &p.key);
        let name = names.first().cloned().unwrap_or_else(|| p.name.clone());
        let also = names.get(1..).unwrap_or_default();
        release.push(format!(
            "total for table {}",
            read_as(&format!("'{name}'"), also)
        ));
        table.push(name);
        eps.push(None);
        delta.push(Some(p.budget.delta));
        mechanism.push(None);
        let bounded = p.limit.is_none() || p.limit == Some(crate::accounting::Limit::Epsilon);
        cost.push(
            finite(p.native.cost)
                .filter(|_| bounded)
                .map(|c| shown(c, Round::Up)),
        );
        unit.push(Some(p.native.unit.clone()));
        cost_pct.push(bounded.then(|| {
            pct(crate::accounting::display::charge_share(
                p.native.share,
                p.native.cost,
            ))
        }));
        // A refused query leaves the table as it is: no share "after" it (round 47, review
        // "newuser2", D: `used_after_pct 100`, `left_after_pct 0` as if admitted).
        used.push((bounded && p.admitted).then(|| pct(p.native.used_share)));
        left.push(p.admitted.then(|| pct(p.left_share)));
        next.push(Some(shown(p.next_epsilon, Round::Down)));
        admitted.push(Some(p.admitted));
        spent_delta.push(Some(shown(p.delta_spent_after, Round::Up)));
        remaining_delta.push(Some(shown(p.delta_left_after, Round::Down)));
        filter.push(Some(p.filter.to_string()));
        limit.push(p.limit.as_ref().map(|l| l.to_string()));
        bounds.push(None);
        noise.push(None);
    }
    let opt = |v: Vec<Option<f64>>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let opt_str = |v: Vec<Option<String>>| Arc::new(StringArray::from(v)) as ArrayRef;
    batch(vec![
        ("table", strings(table)),
        ("release", strings(release)),
        ("epsilon", opt(eps)),
        ("delta", opt(delta)),
        ("cost", opt(cost)),
        ("used_after_pct", opt(used)),
        ("left_after_pct", opt(left)),
        ("admitted", Arc::new(BooleanArray::from(admitted))),
        ("spent_delta_after", opt(spent_delta)),
        ("remaining_delta_after", opt(remaining_delta)),
        ("filter", opt_str(filter)),
        ("limit", opt_str(limit)),
        ("bounds", opt_str(bounds)),
        ("noise", opt_str(noise)),
        ("mechanism", opt_str(mechanism)),
        ("unit", opt_str(unit)),
        ("cost_pct", opt(cost_pct)),
        ("remaining_epsilon_after", opt(next)),
    ])
}

/// The one-row summary printed when a table is registered by SQL.
pub fn registration_batch(p: &TablePolicy) -> Result<RecordBatch> {
    tables_batch(&[(p.clone(), "analyst".to_string())])
}

/// `SHOW TABLES`: per table, the policy in force (visibility, neighbours, public columns, budget,
/// filter, δ share), the pinned schema, and who registered it (`owner`, `analyst`, `result`).
pub fn tables_batch(rows: &[(TablePolicy, String)]) -> Result<RecordBatch> {
    let private = |p: &TablePolicy| p.visibility == Visibility::Private;
    batch(vec![
        ("table", strings(rows.iter().map(|(p, _)| p.name.clone()))),
        (
            "visibility",
            strings(
                rows.iter()
                    .map(|(p, _)| if private(p) { "private" } else { "public" }),
            ),
        ),
        (
            "neighbours",
            strings(rows.iter().map(|(p, _)| match (&p.unit, p.neighbours) {
                // A unit table: neighbours add or remove a whole unit.
                (Some(u), _) => format!(
                    "add_remove unit {} (domain {}; max_groups_contributed {}, \
                     max_rows_contributed {})",
                    u.column, u.domain, u.max_groups_contributed, u.max_rows_contributed
                ),
                (None, Neighbours::AddRemove) => "add_remove".to_string(),
                (None, Neighbours::Replace) => "replace".to_string(),
            })),
        ),
        (
            "public_columns",
            strings(rows.iter().map(|(p, _)| p.public_columns.join(","))),
        ),
        (
            "budget_epsilon",
            Arc::new(Float64Array::from(
                rows.iter()
                    .map(|(p, _)| private(p).then_some(p.budget.epsilon))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "budget_delta",
            Arc::new(Float64Array::from(
                rows.iter()
                    .map(|(p, _)| private(p).then_some(p.budget.delta))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "filter",
            Arc::new(StringArray::from(
                rows.iter()
                    .map(|(p, _)| private(p).then(|| p.filter.to_string()))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "delta_share",
            Arc::new(Float64Array::from(
                rows.iter()
                    .map(|(p, _)| private(p).then_some(p.delta_share))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "schema",
            strings(rows.iter().map(|(p, _)| {
                p.schema
                    .as_deref()
                    .map(crate::accounting::schema_text)
                    .unwrap_or_default()
            })),
        ),
        ("set_by", strings(rows.iter().map(|(_, s)| s.clone()))),
    ])
}

/// What a query was charged, one line per table: the calls as written, the cost as a share of
/// the table's budget and in its filter's unit, what is left as a share and as the largest ε of
/// one default query (docs/ACCOUNTING.md, "What the numbers mean"). Six significant digits.
pub fn receipt_line(r: &Receipt) -> String {
    use crate::accounting::display::{Round, num, percent};
    r.tables
        .iter()
        .map(|t| {
            let asked = if t.requests.is_empty() {
                String::new()
            } else {
                format!(
                    " {}",
                    t.requests
                        .iter()
                        .map(|q| q.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let n = &t.native;
            let mut line = format!(
                "charged {}:{asked} cost {} of the budget ({} {}); {} left, one more query \
                 could use ε ≤ {} (Gaussian, δ {})",
                read_as(&t.name, &t.also_read_as),
                crate::accounting::display::percent_of(n.share, n.cost),
                n.unit,
                num(n.cost, Round::Up),
                percent(t.left_share),
                num(t.next_epsilon, Round::Down),
                crate::accounting::display::budget(t.next_epsilon_delta),
            );
            if t.delta_spent_after > 0.0 {
                line.push_str(&format!(
                    "; partition-selection δ spent so far {}, {} left",
                    num(t.delta_spent_after, Round::Up),
                    num(t.delta_left_after, Round::Down)
                ));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A table as a statement read it: its name, and when the statement read the same file by
/// other names too, those, saying that they are one table (round 49, review composition F3).
fn read_as(name: &str, also: &[String]) -> String {
    if also.is_empty() {
        return name.to_string();
    }
    format!(
        "{name} (also read as {}: one table, one budget)",
        also.join(", ")
    )
}

/// `dp_budget()`: the accountant, and the session's default δ, at which next ε is computed as
/// SHOW BUDGET computes it (round 47).
#[derive(Debug)]
struct BudgetFn(Arc<Accountant>, Arc<std::sync::RwLock<f64>>);
#[derive(Debug)]
struct LedgerFn(Arc<Accountant>);

fn system_table(name: &str, b: RecordBatch) -> Result<Arc<dyn TableProvider>> {
    let mem = Arc::new(MemTable::try_new(b.schema(), vec![vec![b]])?);
    Ok(Arc::new(GuardedTable::new(
        mem,
        TableInfo {
            name: name.to_string(),
            key: TableKey::from(format!("system:{name}")),
            private: false,
            neighbours: Neighbours::AddRemove,
            public_columns: vec![],
            ratio_bounds: vec![],
            unit: None,
            selection_delta: None,
        },
    )))
}

impl TableFunctionImpl for BudgetFn {
    /// `dp_budget()`: every private table's row; `dp_budget('t')`: t's only (round 48, review
    /// "docsuser", F7: the argument was ignored, while the docs used `dp_budget('people')`).
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let delta = *self.1.read().expect("lock");
        let all = self.0.served_budget_rows_at(delta);
        let rows = budget_rows_of(all.clone(), args.exprs())?;
        system_table("dp_budget", budget_batch_of(&rows, &all)?)
    }
}

/// The rows `dp_budget(…)` shows: all of `rows` without an argument, with a table's name as a
/// string only that table's (exact name, else the same name in another case). Refused: a name
/// that is no private table's (unknown, or public: a public table has no budget), naming the
/// private tables there are; an argument that is not one string. The names listed are those
/// `dp_budget()` shows anyway.
fn budget_rows_of(
    rows: Vec<BudgetRow>,
    args: &[datafusion::logical_expr::Expr],
) -> Result<Vec<BudgetRow>> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Expr;
    let name = match args {
        [] => return Ok(rows),
        [
            Expr::Literal(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::LargeUtf8(Some(s))
                | ScalarValue::Utf8View(Some(s)),
                _,
            ),
        ] => s.as_str(),
        _ => {
            return crate::error::refused!(
                "dpfusion refused the query: dp_budget takes no argument (every private table) \
                 or one table's name as a string, e.g. dp_budget('people'); got {} argument{}",
                args.len(),
                if args.len() == 1 {
                    " that is not a string"
                } else {
                    "s"
                }
            );
        }
    };
    let exact: Vec<BudgetRow> = rows.iter().filter(|r| r.name == name).cloned().collect();
    let found = if exact.is_empty() {
        rows.iter()
            .filter(|r| r.name.eq_ignore_ascii_case(name))
            .cloned()
            .collect()
    } else {
        exact
    };
    if !found.is_empty() {
        return Ok(found);
    }
    let mut names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    names.dedup();
    let listed = if names.is_empty() {
        "there is none".to_string()
    } else {
        format!(
            "name one of {}",
            names
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    crate::error::refused!(
        "dpfusion refused the query: dp_budget('{name}'): no private table is named '{name}' (a \
         public table has no budget); {listed}, or call dp_budget() for every private table"
    )
}

impl TableFunctionImpl for LedgerFn {
    fn call_with_args(&self, _args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let viewer = crate::session::current_analyst();
        system_table(
            "dp_ledger",
            ledger_batch(
                &self
                    .0
                    .ledger_entries()
                    .map_err(|e| DataFusionError::External(Box::new(e)))?,
                viewer.as_deref(),
            )?,
        )
    }
}

/// Registers `dp_budget()` and `dp_ledger()`.
pub fn register_table_functions(
    ctx: &SessionContext,
    accountant: Arc<Accountant>,
    default_delta: Arc<std::sync::RwLock<f64>>,
) {
    ctx.register_udtf(
        "dp_budget",
        Arc::new(BudgetFn(accountant.clone(), default_delta)),
    );
    ctx.register_udtf("dp_ledger", Arc::new(LedgerFn(accountant)));
}

#[allow(dead_code)]
fn _types(_: DataType) {}

#[cfg(test)]
mod tests {
    /// Round 47 (review "newuser2", F): docs/SQL.md's list of the functions
    /// `dpfusion.max_rows_contributed` bounds is the code's: every aggregate that takes up to C
    /// rows of a unit per group (`UnitRule::Rows`; the `_ci` variants follow their base), and
    /// no other.
    #[test]
    fn the_sql_doc_lists_the_functions_max_rows_contributed_bounds() {
        use dpfusion_udfs::aggregates::declaration::UnitRule;
        let doc = include_str!("../../docs/SQL.md");
        let line = doc
            .lines()
            .find(|l| l.starts_with("| `dpfusion.max_rows_contributed` = C"))
            .expect("the setting's row");
        for a in dpfusion_udfs::aggregates::registry::AGGREGATES {
            if a.internal || a.name.ends_with("_ci") {
                continue;
            }
            let listed = line.contains(&format!("`{}`", a.name));
            let rows = a.units == UnitRule::Rows;
            assert_eq!(rows, listed, "{}: {line}", a.name);
        }
    }
}
