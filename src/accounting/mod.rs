//! Per-table privacy accounting: policies, admission, and the durable ledger.
//!
//! The [`Accountant`] owns one ledger file (JSON lines, append-only). The ledger is also the
//! policy store (PRIVACY.md, "Who is the adversary"): once a table key is registered private,
//! sessions can only make its policy stricter; anything else needs [`Accountant::owner_set_policy`],
//! which is itself written to the ledger.
//!
//! Admission (PRIVACY.md, "What a query costs") is one atomic step under the in-process mutex
//! and an exclusive OS lock on the ledger file: catch up on lines other processes appended,
//! compose each private table's recorded events with the charge, refuse if any table would
//! exceed its budget, otherwise append one `charge` record and fsync it before returning.
mod ledger;
mod policy;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use dpfusion_udfs::privacy::error::{check_delta, check_epsilon};
use dpfusion_udfs::privacy::{Event, Profile};
use serde::{Deserialize, Serialize};

use ledger::{FileLock, Record, State};

/// The identity of a table in the ledger: a canonical file path, or a session-local name with a
/// prefix (`mem:`, `result:`, `system:`, `demo:`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TableKey(String);

impl TableKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Keys whose policy lives only in this session's memory (their charges are still written).
    fn is_session_local(&self) -> bool {
        ["mem:", "result:", "system:"]
            .iter()
            .any(|p| self.0.starts_with(p))
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for TableKey {
    fn from(s: String) -> Self {
        TableKey(s)
    }
}

impl From<&str> for TableKey {
    fn from(s: &str) -> Self {
        TableKey(s.to_string())
    }
}

/// A table's total budget: the composition of all its charges must stay (ε, δ)-DP.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub epsilon: f64,
    pub delta: f64,
}

/// ε must be finite and > 0, δ in the open interval (0, 1).
pub fn check_budget(b: &Budget) -> Result<(), AccountingError> {
    check_epsilon("epsilon", b.epsilon)
        .and_then(|_| check_delta("delta", b.delta))
        .map(|_| ())
        .map_err(|e| AccountingError::InvalidBudget(format!("table budget: {e}")))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    Private,
    Public,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Neighbours {
    AddRemove,
    Replace,
}

impl fmt::Display for Neighbours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Neighbours::AddRemove => "add_remove",
            Neighbours::Replace => "replace",
        })
    }
}

/// What the data owner decided for one table. `name` is the session's alias; `key` is the
/// identity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TablePolicy {
    pub key: TableKey,
    pub name: String,
    pub visibility: Visibility,
    pub neighbours: Neighbours,
    pub public_columns: Vec<String>,
    pub budget: Budget,
}

/// The events one query charges to one table.
#[derive(Clone, Debug)]
pub struct TableCharge {
    pub key: TableKey,
    pub events: Vec<Event>,
}

/// What an admitted query was charged (private tables only).
#[derive(Clone, Debug)]
pub struct Receipt {
    pub tables: Vec<ReceiptTable>,
}

#[derive(Clone, Debug)]
pub struct ReceiptTable {
    pub name: String,
    pub key: TableKey,
    /// ε of this charge alone at the table's budget δ.
    pub cost: f64,
    /// ε of all charges so far, this one included.
    pub spent_after: f64,
    pub remaining_after: f64,
    pub budget: Budget,
}

/// What a query would be charged, without charging it (`EXPLAIN PRIVACY`).
#[derive(Clone, Debug)]
pub struct PreviewRow {
    pub name: String,
    pub key: TableKey,
    pub budget: Budget,
    pub cost: f64,
    pub spent_after: f64,
    pub remaining_after: f64,
    pub admitted: bool,
}

/// One private table's budget state (`SHOW BUDGET`).
#[derive(Clone, Debug)]
pub struct BudgetRow {
    pub name: String,
    pub key: TableKey,
    pub epsilon: f64,
    pub delta: f64,
    pub spent: f64,
    pub remaining: f64,
    pub queries: u64,
}

/// One charge record of the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub seq: u64,
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    pub query: String,
    pub tables: Vec<LedgerTable>,
}

/// One table of a charge: ε of this charge alone at the table's budget δ, and its events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerTable {
    pub name: String,
    pub key: TableKey,
    pub epsilon: f64,
    pub delta: f64,
    pub events: Vec<Event>,
}

#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    #[error("{}", exceeded_message(.table, *.cost, *.spent, *.remaining, .budget))]
    BudgetExceeded {
        table: String,
        key: TableKey,
        /// ε of the refused charge alone at the table's δ.
        cost: f64,
        /// ε spent so far (composition of the recorded charges).
        spent: f64,
        remaining: f64,
        budget: Budget,
    },
    #[error("{0}")]
    PolicyConflict(String),
    #[error("no policy is registered for table '{0}' in this ledger; register the table first")]
    UnknownTable(String),
    #[error("invalid budget: {0}")]
    InvalidBudget(String),
    #[error("ledger {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "ledger {} is corrupt at line {line}: {message}. No charge was dropped; restore the file \
         from a backup, or move it aside to start a new ledger (all budgets then start from zero)",
        .path.display()
    )]
    Corrupt {
        path: PathBuf,
        line: u64,
        message: String,
    },
}

fn exceeded_message(table: &str, cost: f64, spent: f64, remaining: f64, b: &Budget) -> String {
    let what = if cost > b.epsilon * (1.0 + 1e-12) {
        format!(
            "this query alone costs more than the table's whole budget: ε = {cost:.4} (at δ = {:e}) \
             against a budget of ε = {:.4}; {spent:.4} is spent and {remaining:.4} remains",
            b.delta, b.epsilon
        )
    } else {
        format!(
            "this query would cost ε = {cost:.4} (at δ = {:e}), {spent:.4} of {:.4} is spent and \
             {remaining:.4} remains",
            b.delta, b.epsilon
        )
    };
    format!(
        "budget exceeded for table '{table}': {what}. Lower epsilon in the query, or ask the data \
         owner for a larger budget."
    )
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> AccountingError + '_ {
    move |source| AccountingError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The per-table accountant over one ledger file. Cheap to share (`Arc`); all methods take
/// `&self`.
pub struct Accountant {
    path: PathBuf,
    /// Opened read + append; only touched while `state` is locked.
    file: File,
    state: Mutex<State>,
}

impl fmt::Debug for Accountant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accountant")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// One table's evaluation of a charge.
struct Evaluation {
    policy: TablePolicy,
    events: Vec<Event>,
    cost: f64,
    spent_before: f64,
    spent_after: f64,
    admitted: bool,
}

impl Evaluation {
    fn remaining_before(&self) -> f64 {
        (self.policy.budget.epsilon - self.spent_before).max(0.0)
    }
    fn remaining_after(&self) -> f64 {
        (self.policy.budget.epsilon - self.spent_after).max(0.0)
    }
}

impl Accountant {
    /// Opens (creating parent directories and the file if missing) and replays the ledger. A torn
    /// last line is truncated; any other unreadable line is an error.
    pub fn open(path: &Path) -> Result<Accountant, AccountingError> {
        let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = parent {
            fs::create_dir_all(dir).map_err(io_error(path))?;
        }
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io_error(path))?;
        if !existed {
            // Make the new directory entry durable too (best effort; not possible everywhere).
            if let Ok(d) = File::open(parent.unwrap_or(Path::new("."))) {
                let _ = d.sync_all();
            }
        }
        let acc = Accountant {
            path: path.to_path_buf(),
            file,
            state: Mutex::new(State::default()),
        };
        {
            let mut st = acc.state();
            let _lock = acc.sync(&mut st)?;
        }
        Ok(acc)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // State is only changed by whole-record application, so a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the exclusive file lock and reads what other processes appended since our last read.
    fn sync(&self, st: &mut State) -> Result<FileLock<'_>, AccountingError> {
        let lock = FileLock::exclusive(&self.file).map_err(io_error(&self.path))?;
        ledger::catch_up(&self.file, &self.path, st)?;
        Ok(lock)
    }

    /// Registers a table (or re-registers it in a new session). Returns the policy in force,
    /// which is the ledger's when the table is already known there.
    pub fn register_table(&self, policy: TablePolicy) -> Result<TablePolicy, AccountingError> {
        check_budget(&policy.budget)?;
        let mut st = self.state();
        if policy.key.is_session_local() {
            st.policies.insert(policy.key.clone(), policy.clone());
            return Ok(policy);
        }
        let _lock = self.sync(&mut st)?;
        match policy::reconcile(st.policies.get(&policy.key), &policy, &self.path)? {
            policy::Decision::Keep(kept) => {
                st.policies.insert(kept.key.clone(), kept.clone());
                Ok(kept)
            }
            policy::Decision::Record => {
                ledger::append(
                    &self.file,
                    &self.path,
                    &mut st,
                    Record::Policy(policy.clone()),
                )?;
                Ok(policy)
            }
        }
    }

    /// An explicit action of the data owner: sets the policy unconditionally (it may make a table
    /// public or raise its budget) and records it in the ledger as an `owner` record.
    pub fn owner_set_policy(&self, policy: TablePolicy) -> Result<TablePolicy, AccountingError> {
        check_budget(&policy.budget)?;
        let mut st = self.state();
        if policy.key.is_session_local() {
            st.policies.insert(policy.key.clone(), policy.clone());
            return Ok(policy);
        }
        let _lock = self.sync(&mut st)?;
        ledger::append(
            &self.file,
            &self.path,
            &mut st,
            Record::Owner(policy.clone()),
        )?;
        Ok(policy)
    }

    /// Check and charge, atomically and durably. Public tables are not charged. On refusal
    /// nothing is written.
    pub fn admit(&self, query: &str, charges: &[TableCharge]) -> Result<Receipt, AccountingError> {
        let mut st = self.state();
        let _lock = self.sync(&mut st)?;
        let evals = evaluate(&st, charges)?;
        if let Some(e) = evals.iter().find(|e| !e.admitted) {
            return Err(AccountingError::BudgetExceeded {
                table: e.policy.name.clone(),
                key: e.policy.key.clone(),
                cost: e.cost,
                spent: e.spent_before,
                remaining: e.remaining_before(),
                budget: e.policy.budget,
            });
        }
        if evals.is_empty() {
            return Ok(Receipt { tables: Vec::new() });
        }
        let entry = LedgerEntry {
            seq: st.next_seq,
            time: ledger::now_rfc3339(),
            query: query.to_string(),
            tables: evals
                .iter()
                .map(|e| LedgerTable {
                    name: e.policy.name.clone(),
                    key: e.policy.key.clone(),
                    epsilon: e.cost,
                    delta: e.policy.budget.delta,
                    events: e.events.clone(),
                })
                .collect(),
        };
        ledger::append(&self.file, &self.path, &mut st, Record::Charge(entry))?;
        Ok(Receipt {
            tables: evals
                .iter()
                .map(|e| ReceiptTable {
                    name: e.policy.name.clone(),
                    key: e.policy.key.clone(),
                    cost: e.cost,
                    spent_after: e.spent_after,
                    remaining_after: e.remaining_after(),
                    budget: e.policy.budget,
                })
                .collect(),
        })
    }

    /// The same computation as [`Accountant::admit`], without charging.
    pub fn preview(&self, charges: &[TableCharge]) -> Result<Vec<PreviewRow>, AccountingError> {
        let mut st = self.state();
        let _lock = self.sync(&mut st)?;
        Ok(evaluate(&st, charges)?
            .into_iter()
            .map(|e| PreviewRow {
                remaining_after: e.remaining_after(),
                name: e.policy.name,
                key: e.policy.key,
                budget: e.policy.budget,
                cost: e.cost,
                spent_after: e.spent_after,
                admitted: e.admitted,
            })
            .collect())
    }

    /// Private tables only, sorted by name (then key).
    pub fn budget_rows(&self) -> Vec<BudgetRow> {
        let mut st = self.state();
        // Best effort: a ledger error is reported by the next admission.
        let _ = self.sync(&mut st);
        let mut rows: Vec<BudgetRow> = st
            .policies
            .values()
            .filter(|p| p.visibility == Visibility::Private)
            .map(|p| {
                let (spent, queries) = st
                    .tables
                    .get(&p.key)
                    .map_or((0.0, 0), |t| (t.profile.epsilon(p.budget.delta), t.queries));
                BudgetRow {
                    name: p.name.clone(),
                    key: p.key.clone(),
                    epsilon: p.budget.epsilon,
                    delta: p.budget.delta,
                    spent,
                    remaining: (p.budget.epsilon - spent).max(0.0),
                    queries,
                }
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.key.cmp(&b.key)));
        rows
    }

    /// Every charge, oldest first.
    pub fn ledger_entries(&self) -> Vec<LedgerEntry> {
        let mut st = self.state();
        let _ = self.sync(&mut st);
        st.entries.clone()
    }
}

/// Per private table of the charge (merged by key, in order of first appearance): its cost
/// alone, spent before and after, and whether it stays within budget.
fn evaluate(st: &State, charges: &[TableCharge]) -> Result<Vec<Evaluation>, AccountingError> {
    let mut merged: Vec<(&TableKey, Vec<Event>)> = Vec::new();
    for c in charges {
        match merged.iter_mut().find(|(k, _)| *k == &c.key) {
            Some((_, events)) => events.extend(c.events.iter().cloned()),
            None => merged.push((&c.key, c.events.clone())),
        }
    }
    let mut out = Vec::new();
    for (key, events) in merged {
        let policy = st
            .policies
            .get(key)
            .ok_or_else(|| AccountingError::UnknownTable(key.to_string()))?;
        if policy.visibility == Visibility::Public {
            continue;
        }
        let delta = policy.budget.delta;
        let charge = Profile::from_events(&events);
        let cost = charge.epsilon(delta);
        let (spent_before, spent_after) = match st.tables.get(key) {
            Some(t) => {
                let mut composed = t.profile.clone();
                composed.compose(&charge);
                (t.profile.epsilon(delta), composed.epsilon(delta))
            }
            None => (0.0, cost),
        };
        out.push(Evaluation {
            admitted: spent_after <= policy.budget.epsilon * (1.0 + 1e-12),
            policy: policy.clone(),
            events,
            cost,
            spent_before,
            spent_after,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
