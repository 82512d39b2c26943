//! The REPL's local backend: a [`PrivateSession`] in this process (single-user mode or the
//! data owner's catalog).
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use dpfusion::accounting::ReceiptSlot;
use dpfusion::accounting::display::SHARE_SCALE;
use dpfusion::session::PrivateSession;
use dpfusion::statements::{budget_batch, ledger_batch, receipt_line};

use super::format::OutputFormat;
use super::{Answer, Backend, Charged, Outcome, TableBudget, error_message};

/// A session in this process.
pub struct Local {
    session: Arc<PrivateSession>,
}

impl Local {
    pub fn new(session: PrivateSession) -> Self {
        Local {
            session: Arc::new(session),
        }
    }
}

fn answer(r: dpfusion::QueryResult) -> Answer {
    Answer {
        schema: r.schema,
        batches: r.batches,
        receipt: r.receipt.as_ref().map(receipt_line),
        tables: r.tables,
    }
}

/// What the statement whose receipt slot is `slot` was charged, if it was admitted: its receipt
/// line and the tables it charged, as it read them.
fn charged(slot: &ReceiptSlot) -> Option<Charged> {
    slot.take().map(|r| Charged {
        receipt: receipt_line(&r),
        tables: r.table_names(),
    })
}

/// The outcome of a statement that ended (`run`: what its task gave; Err: it panicked) with the
/// receipt slot `slot`: an error after its admission is [`Outcome::Failed`], with what it was
/// charged (round 49, review composition F4).
fn outcome(
    run: Result<datafusion::error::Result<dpfusion::QueryResult>, tokio::task::JoinError>,
    slot: &ReceiptSlot,
) -> Outcome {
    let e = match run {
        Ok(Ok(r)) => return Outcome::Done(Ok(answer(r))),
        Ok(Err(e)) => error_message(&e),
        Err(_) => dpfusion::Error::ExecutionFailed.to_string(),
    };
    match charged(slot) {
        Some(c) => Outcome::Failed(e, c),
        None => Outcome::Done(Err(e)),
    }
}

impl Backend for Local {
    fn greeting(&self) -> String {
        "differentially private SQL".to_string()
    }

    async fn sql(&mut self, sql: &str) -> Result<Answer, String> {
        self.session
            .sql(sql)
            .await
            .map(answer)
            .map_err(|e| error_message(&e))
    }

    async fn sql_outcome(&mut self, sql: &str) -> Outcome {
        let slot = ReceiptSlot::default();
        let run = slot.scope(self.session.sql(sql)).await;
        outcome(Ok(run), &slot)
    }

    async fn sql_interruptible(&mut self, sql: &str) -> Outcome {
        // The query runs in its own task: a model fit is CPU work inside one poll of the query,
        // and Ctrl-C must still be seen while it runs. Its admission puts its receipt in the
        // statement's slot, read when it fails or is cancelled after it (round 49).
        let session = self.session.clone();
        let text = sql.to_string();
        let slot = ReceiptSlot::default();
        let scoped = slot.clone();
        let mut task = tokio::spawn(async move { scoped.scope(session.sql(&text)).await });
        tokio::select! {
            r = &mut task => outcome(r, &slot),
            _ = tokio::signal::ctrl_c() => {
                // Stop a running model fit at its next iteration, and the scan with the task.
                dpfusion_udfs::progress::cancel_running();
                task.abort();
                // A poll under way on another worker finishes first (an admission included):
                // wait for it briefly, so that a charge made just now shows its receipt.
                let _ = tokio::time::timeout(std::time::Duration::from_millis(500), &mut task).await;
                // Admitted before the cancellation: its receipt, as for a finished query.
                Outcome::Cancelled(charged(&slot))
            }
        }
    }

    async fn budget(&mut self) -> Vec<TableBudget> {
        self.session
            .budget()
            .into_iter()
            .map(|r| TableBudget {
                left_share: SHARE_SCALE.saturating_sub(r.native.used_share),
                epsilon: r.epsilon,
                remaining: r.remaining,
                delta_spent: r.delta_spent,
                delta_left: r.delta_left,
                name: r.name,
            })
            .collect()
    }

    async fn budget_table(&mut self) -> Result<Answer, String> {
        budget_batch(&self.session.budget())
            .map(Answer::table)
            .map_err(|e| error_message(&e))
    }

    async fn ledger_table(&mut self, format: OutputFormat) -> Result<Answer, String> {
        // On screen the events (`profile`) are left out: `\format json` or
        // `SELECT * FROM dp_ledger()` show them.
        self.session
            .ledger()
            .and_then(|l| ledger_batch(&l, None))
            .and_then(|b| {
                if format != OutputFormat::Table {
                    return Ok(b);
                }
                Ok(b.project(&super::ledger_on_screen(&b.schema()))?)
            })
            .map(Answer::table)
            .map_err(|e| error_message(&e))
    }

    async fn tables(&mut self) -> Vec<(String, SchemaRef)> {
        self.session
            .tables()
            .into_iter()
            .map(|(t, _, schema)| (t, schema))
            .collect()
    }

    async fn describe(&mut self, table: &str) -> Result<String, String> {
        describe(&self.session, table)
    }
}

/// `\d` and `\d TABLE`: what a user needs to know to query a table privately; an error naming
/// the tables for a table that does not exist.
pub fn describe(session: &PrivateSession, table: &str) -> Result<String, String> {
    let tables = session.tables();
    let budget = session.budget();
    let policy = |name: &str, private: bool| -> String {
        if !private {
            return "public".to_string();
        }
        match budget.iter().find(|b| b.name == name) {
            Some(b) => {
                use dpfusion::accounting::display::{Round, SHARE_SCALE, num, percent};
                // The same file under other names: one budget (round 49, review composition F3).
                let others = dpfusion::statements::same_budget_as(b, &budget);
                let shared = if others.is_empty() {
                    String::new()
                } else {
                    format!(" (one budget with {}: the same file)", others.join(", "))
                };
                // A table whose guarantee the owner voided shows why, not "budget ε inf"
                // (round 52, review "operator" F3).
                let guarantee = match &b.no_guarantee {
                    Some(n) => format!(
                        "no DP guarantee since ledger line {} ({}), δ {}",
                        n.line,
                        n.why,
                        dpfusion::accounting::display::budget(b.delta)
                    ),
                    None => format!(
                        "budget ε {} at δ {}",
                        dpfusion::accounting::display::budget(b.epsilon),
                        dpfusion::accounting::display::budget(b.delta)
                    ),
                };
                format!(
                    "private, {guarantee}{shared}; {} filter, {} used, {} left (one more \
                     query could use ε ≤ {}); partition-selection δ {} spent, {} left",
                    b.filter,
                    percent(b.native.used_share),
                    percent(SHARE_SCALE.saturating_sub(b.native.used_share)),
                    num(b.remaining, Round::Down),
                    num(b.delta_spent, Round::Up),
                    num(b.delta_left, Round::Down)
                )
            }
            None => "private".to_string(),
        }
    };
    let neighbours = |n: dpfusion::accounting::Neighbours| match n {
        dpfusion::accounting::Neighbours::AddRemove => "add_remove",
        dpfusion::accounting::Neighbours::Replace => "replace",
    };
    if table.is_empty() {
        if tables.is_empty() {
            return Ok(
                "no tables: the data owner declares them (dpfusion --catalog FILE, or \
                       --private NAME=PATH in single-user mode)"
                    .to_string(),
            );
        }
        let mut out = String::from("Tables:\n");
        for (name, info, schema) in &tables {
            out.push_str(&format!(
                "  {name:<12} {} columns; {}{}\n",
                schema.fields().len(),
                policy(name, info.private),
                match (&info.unit, info.private) {
                    (Some(u), true) => format!("; privacy unit {}", u.column),
                    (None, true) => format!("; neighbours {}", neighbours(info.neighbours)),
                    _ => String::new(),
                }
            ));
        }
        out.push_str("\\d TABLE shows its columns.");
        return Ok(out);
    }
    let want = table.to_ascii_lowercase();
    let Some((name, info, schema)) = tables.iter().find(|(n, _, _)| *n == want) else {
        return Err(format!(
            "no table '{table}' (tables: {})",
            tables
                .iter()
                .map(|t| t.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let mut out = format!("Table {name}: {}\n", policy(name, info.private));
    if let Some((p, by)) = session
        .policies()
        .into_iter()
        .find(|(p, _)| p.name == *name)
    {
        let who = match by.as_str() {
            "owner" => "the data owner",
            "analyst" => "analyst SQL",
            _ => "a CREATE TABLE AS (a DP result)",
        };
        out.push_str(&format!(
            "  registered by {who}: {}{}\n",
            p.key,
            p.format
                .as_deref()
                .map(|f| format!(", read as {f}"))
                .unwrap_or_default()
        ));
        if by == "owner" && p.key.as_str().starts_with('/') {
            out.push_str("  schema: pinned in the ledger at the owner's first registration\n");
        }
    }
    if let (Some(u), true) = (&info.unit, info.private) {
        out.push_str(&format!(
            "  privacy unit: {} (domain {}): a neighbour adds or removes a unit with all its \
             rows; a query bounds each unit to {} group(s) and {} row(s) per group (SET \
             dpfusion.max_groups_contributed / max_rows_contributed)\n",
            u.column, u.domain, u.max_groups_contributed, u.max_rows_contributed
        ));
    } else if info.private {
        out.push_str(&format!(
            "  neighbours: {} ({})\n",
            neighbours(info.neighbours),
            match info.neighbours {
                dpfusion::accounting::Neighbours::AddRemove =>
                    "a neighbour adds or removes one row; the row count is private",
                dpfusion::accounting::Neighbours::Replace =>
                    "a neighbour replaces one row; the row count is public",
            }
        ));
        out.push_str(&format!(
            "  public columns: {}\n",
            if info.public_columns.is_empty() {
                "none".to_string()
            } else {
                info.public_columns.join(", ")
            }
        ));
        out.push_str(
            "  read it only through DP aggregates (dp_count, dp_sum, dp_mean, ...); \
             GROUP BY on a private column adds partition selection\n",
        );
    }
    out.push_str("  columns:\n");
    for f in schema.fields() {
        let marker = if !info.private {
            ""
        } else if info.is_public_column(f.name()) {
            "  (public)"
        } else if info.unit.as_ref().is_some_and(|u| &u.column == f.name()) {
            "  (private; the privacy unit)"
        } else {
            "  (private)"
        };
        out.push_str(&format!("    {:<14} {}{marker}\n", f.name(), f.data_type()));
    }
    if let Some(note) = crate::demo::describe_demo(name, &info.key) {
        out.push_str(&format!("  about: {note}\n"));
    }
    Ok(out.trim_end().to_string())
}
