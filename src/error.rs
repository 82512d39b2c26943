//! The errors an embedder can match. Every error of [`crate::PrivateSession`] that dpfusion
//! itself decides is a [`DataFusionError::External`] holding an [`Error`]; [`Error::of`] finds it:
//!
//! ```ignore
//! match session.sql(q).await {
//!     Err(e) => match dpfusion::Error::of(&e) {
//!         Some(dpfusion::Error::BudgetExceeded { table, remaining, .. }) => { /* … */ }
//!         Some(dpfusion::Error::Refused(why)) => { /* … */ }
//!         _ => { /* … */ }
//!     },
//!     Ok(r) => { /* … */ }
//! }
//! ```
use datafusion::common::DataFusionError;

use crate::accounting::{AccountingError, Budget, Limit};
use crate::session::EXECUTION_FAILED;

/// A typed dpfusion error. Built where dpfusion decides it (the guard, the session, the
/// accountant), never recovered from a message's text. New kinds may be added: match with a
/// wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The guard or the session refused the statement: a construct outside the private
    /// fragment, a policy option in SQL, a forbidden file. Nothing was charged or read. The
    /// message says what to do instead.
    #[error("{0}")]
    Refused(String),
    /// Admitting the query would exceed a table's budget. Nothing was charged or read.
    #[error("dpfusion refused the query: {message}")]
    BudgetExceeded {
        /// The table whose budget binds.
        table: String,
        /// ε of the refused charge alone, under the table's filter.
        cost: f64,
        /// ε spent so far.
        spent: f64,
        /// ε left.
        remaining: f64,
        /// The table's budget.
        budget: Budget,
        /// Which side of the filter binds (ε, the δ of partition selection, or a mechanism
        /// the filter cannot account for).
        limit: Limit,
        /// The full message.
        message: String,
    },
    /// The SQL or an argument is invalid (a name that does not exist, a type, a DP function's
    /// parameter). Nothing was charged or read.
    #[error("{0}")]
    Invalid(String),
    /// A registration conflicts with the policy the ledger holds (the data owner's side).
    #[error("{0}")]
    Policy(String),
    /// A query that reads a private table failed after it was admitted (also when the ledger's
    /// seals could not be written after its durable charge, round 46). Its charge stands; the
    /// cause is not shown because it could depend on the data (or names the owner's files).
    #[error("{}", EXECUTION_FAILED)]
    ExecutionFailed,
    /// A statement that reads no private table stopped at a bound the data owner sets on one
    /// statement: its memory ([`MEMORY_EXCEEDED`], `memory_limit`) or its spill files
    /// (`max_spill_bytes`). The message names the setting and nothing else of the failure: no
    /// operator, no size, no other statement (round 48: DataFusion's message listed the top
    /// consumers of a pool shared with other analysts' results and private queries). A query
    /// that reads a private table gets [`Error::ExecutionFailed`] instead.
    #[error("{0}")]
    ResourceLimit(String),
}

/// The one message of a statement that reads no private table and needed more memory than
/// one statement may use (round 48).
pub const MEMORY_EXCEEDED: &str = "dpfusion: the statement stopped: it needed more memory than \
one statement may use (the data owner's [session] memory_limit; sorts, hash aggregates and joins \
spill to disk past their share, unless max_spill_bytes is 0). Select fewer rows or columns, \
aggregate before joining or sorting, or ask the data owner for a larger memory_limit.";

/// The [`Error::ResourceLimit`] of `e` when a statement's memory or spill bound stopped it: a
/// `ResourcesExhausted` anywhere in its chain (the variant, never its text, which names the
/// pool's consumers and sizes), or the typed [`crate::session::SpillLimit`] inside the I/O error
/// of a spill write. None otherwise.
pub(crate) fn resource_limit(e: &DataFusionError) -> Option<Error> {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = at {
        if let Some(DataFusionError::ResourcesExhausted(_)) = x.downcast_ref::<DataFusionError>() {
            return Some(Error::ResourceLimit(MEMORY_EXCEEDED.to_string()));
        }
        if let Some(limit) = x
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<crate::session::SpillLimit>())
        {
            return Some(Error::ResourceLimit(limit.to_string()));
        }
        at = x.source();
    }
    None
}

impl Error {
    /// The dpfusion error inside a DataFusion error, if there is one.
    pub fn of(e: &DataFusionError) -> Option<&Error> {
        match e {
            DataFusionError::External(b) => b.downcast_ref::<Error>(),
            DataFusionError::Context(_, inner) => Self::of(inner),
            DataFusionError::Shared(inner) => Self::of(inner),
            DataFusionError::Diagnostic(_, inner) => Self::of(inner),
            _ => None,
        }
    }

    /// A refusal, as the `DataFusionError` a statement returns: `message` is the whole text the
    /// analyst reads ("dpfusion refused the query: … what to do instead").
    pub(crate) fn refused(message: impl Into<String>) -> DataFusionError {
        Error::Refused(message.into()).into()
    }

    /// Wraps a DataFusion error of a statement as a typed one. Refusals are typed where they
    /// are decided (`refused!`, [`Error::refused`]); what is left here is DataFusion's own:
    /// its planning, SQL and schema errors are invalid input; other errors (I/O of public
    /// tables, …) stay as they are.
    pub(crate) fn classify(e: DataFusionError) -> DataFusionError {
        if Self::of(&e).is_some() {
            return e;
        }
        // A statement's memory or spill bound, as one fixed text (round 48).
        if let Some(limit) = resource_limit(&e) {
            return limit.into();
        }
        // A ledger error that reached the statement untyped (`dp_ledger()`): for an analyst, the
        // fixed message (round 46).
        if let Some(fixed) = accounting_of(&e).and_then(ledger_unavailable) {
            return fixed;
        }
        if let Some(m) = unwrap_coercion(&e.to_string()) {
            return Error::Invalid(m).into();
        }
        let typed = match e {
            DataFusionError::Diagnostic(_, inner) => return Self::classify(*inner),
            // The file store's refusal ([`crate::files::store::Refused`], decided where a scan
            // or COPY opens a file), through the object store's error. Only a query over public
            // tables gets here: a private query's error is the fixed message already.
            DataFusionError::ObjectStore(os) => match &*os {
                datafusion::object_store::Error::Generic { source, .. }
                    if source.is::<crate::files::store::Refused>() =>
                {
                    Error::Refused(source.to_string())
                }
                _ => return DataFusionError::ObjectStore(os),
            },
            DataFusionError::Plan(m) => Error::Invalid(m),
            DataFusionError::SQL(..)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_) => Error::Invalid(e.to_string()),
            other => return other,
        };
        typed.into()
    }

    /// The typed error of an accounting refusal.
    pub(crate) fn from_accounting(e: AccountingError) -> DataFusionError {
        let typed = match e {
            // A mechanism the table's filter cannot account for is not a budget that ran out:
            // no smaller request fits either, so it is a refusal (wire code `refused`), with the
            // accountant's message (which names the owner's options).
            AccountingError::BudgetExceeded { ref why, .. }
                if matches!(why.limit, Limit::Mechanism { .. }) =>
            {
                Error::Refused(format!("dpfusion refused the query: {e}"))
            }
            AccountingError::BudgetExceeded {
                ref table,
                cost,
                spent,
                remaining,
                budget,
                ref why,
                ..
            } => Error::BudgetExceeded {
                table: table.clone(),
                cost,
                spent,
                remaining,
                budget,
                limit: why.limit.clone(),
                message: e.to_string(),
            },
            AccountingError::PolicyConflict(m) => Error::Policy(m),
            // The statement was planned under a policy the ledger no longer holds, or reads a
            // public table whose files the ledger now holds as a private table's: refused,
            // nothing written or read (round 46).
            AccountingError::PolicyChanged { .. } | AccountingError::FilesNowPrivate { .. } => {
                Error::Refused(e.to_string())
            }
            // The charge is durable and the seals failed after it (round 46): the analyst gets
            // the fixed message of a failed admitted query (its charge stands, no path, over
            // the server the code `execution_failed`); the detail, which names the owner's
            // files, goes to the owner's stderr (the server's log, the owner's terminal).
            AccountingError::Unsealed { charge: true, .. } => {
                eprintln!("dpfusion: {e}");
                Error::ExecutionFailed
            }
            other => {
                return ledger_unavailable(&other)
                    .unwrap_or_else(|| DataFusionError::External(Box::new(other)));
            }
        };
        DataFusionError::External(Box::new(typed))
    }
}

/// The one message an analyst gets when the ledger cannot be read, locked or verified before a
/// statement's charge (round 46, F7 of the review of its fixes): the detail names the data
/// owner's files.
pub const LEDGER_UNAVAILABLE: &str = "dpfusion refused the query: the privacy ledger is \
unavailable, so nothing was charged and nothing was read. The data owner's log has the detail; \
ask the data owner, or try again later.";

/// For a statement run for an analyst (`dpfusion serve`: [`crate::session::current_analyst`]),
/// a ledger error before any charge (the ledger's I/O and lock, a ledger that does not verify,
/// that was replaced or moved, or whose seals failed after a record that was no charge) as the
/// refusal [`LEDGER_UNAVAILABLE`], which names no path; the detail goes to the data owner's
/// stderr (the server's log). None otherwise: the owner's own process (the command line, the
/// Rust API) gets the detail in the error itself.
fn ledger_unavailable(e: &AccountingError) -> Option<DataFusionError> {
    let before_charge = matches!(
        e,
        AccountingError::Io { .. }
            | AccountingError::Corrupt { .. }
            | AccountingError::Unverifiable { .. }
            | AccountingError::Unsealed { charge: false, .. }
    );
    let analyst = crate::session::current_analyst().filter(|_| before_charge)?;
    eprintln!("dpfusion: a statement of analyst '{analyst}' was refused: {e}");
    Some(Error::Refused(LEDGER_UNAVAILABLE.to_string()).into())
}

/// The accounting error inside a DataFusion error, if there is one.
fn accounting_of(e: &DataFusionError) -> Option<&AccountingError> {
    match e {
        DataFusionError::External(b) => b.downcast_ref::<AccountingError>(),
        DataFusionError::Context(_, inner) => accounting_of(inner),
        DataFusionError::Shared(inner) => accounting_of(inner),
        DataFusionError::Diagnostic(_, inner) => accounting_of(inner),
        _ => None,
    }
}

impl From<Error> for DataFusionError {
    fn from(e: Error) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// `Err` of a typed refusal ([`Error::Refused`]) with a formatted message, written where the
/// refusal is decided (as DataFusion's `plan_err!` is for its own planning errors). The message
/// says what was refused, why, and what to do instead.
macro_rules! refused {
    ($($arg:tt)*) => {
        Err($crate::error::Error::refused(format!($($arg)*)))
    };
}
pub(crate) use refused;

/// A function's argument error as DataFusion's planner wraps it ("Execution error: Function 'f'
/// user-defined coercion failed with: Error during planning: f: `lower` must be … No function
/// matches … Candidate functions: f(value, lower, …, neighbours)"), unwrapped to the one sentence
/// the function wrote, followed by a DP aggregate's usage as users write it (the session's hidden
/// `neighbours` argument left out). None: not such an error. Planning errors depend on the SQL
/// text only, never on data.
fn unwrap_coercion(msg: &str) -> Option<String> {
    const WRAP: &str = "user-defined coercion failed with: ";
    let at = msg.find(WRAP)?;
    let mut inner = &msg[at + WRAP.len()..];
    if let Some(end) = inner.find("No function matches the given name") {
        inner = &inner[..end];
    }
    let mut inner = inner.trim();
    while let Some(rest) = ["Error during planning: ", "Execution error: "]
        .iter()
        .find_map(|p| inner.strip_prefix(p))
    {
        inner = rest.trim();
    }
    let inner = inner.trim_end_matches('.');
    let name = inner.split(':').next().unwrap_or("").trim();
    let usage = dpfusion_udfs::aggregates::registry::get(name)
        .filter(|a| !a.internal)
        .map(|a| {
            format!(
                " Usage: {} (HELP {} shows each argument).",
                a.usage(),
                a.name
            )
        })
        .unwrap_or_default();
    Some(format!("{inner}.{usage}"))
}

/// The command line's panic hook: a panic's message could quote a value of a private row (an
/// arrow kernel, a sampler), so the binary prints a fixed line instead of the payload and the
/// location. (A library does not set hooks; an embedder chooses its own.)
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|_| {
        if QUIET.with(|q| q.get()) > 0 {
            return;
        }
        eprintln!(
            "dpfusion: internal error (a panic). No detail is shown: it could quote private data."
        );
    }));
}

thread_local! {
    /// How many [`caught_quietly`] calls this thread is inside.
    static QUIET: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `catch_unwind`, with the command line's panic hook silent meanwhile: for a panic that is
/// part of a total evaluation (its rows become NULL and the query goes on), which must print
/// nothing that a dataset without the row would not (review of round 46: the hook's line on
/// stderr would have told the two apart).
pub fn caught_quietly<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> std::thread::Result<R> {
    QUIET.with(|q| q.set(q.get() + 1));
    let out = std::panic::catch_unwind(f);
    QUIET.with(|q| q.set(q.get() - 1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic caught by [`caught_quietly`] leaves the quiet count as it was, so the hook
    /// speaks again for the next panic outside it.
    #[test]
    fn a_quiet_catch_is_quiet_only_inside() {
        let out = caught_quietly(|| {
            assert_eq!(QUIET.with(|q| q.get()), 1);
            panic!("inside")
        });
        assert!(out.is_err());
        assert_eq!(QUIET.with(|q| q.get()), 0);
        assert_eq!(caught_quietly(|| 7).ok(), Some(7));
    }

    #[test]
    fn argument_errors_are_unwrapped_to_one_sentence_with_the_usage() {
        let wrapped = "Execution error: Function 'dp_mean' user-defined coercion failed with: \
            Error during planning: dp_mean: `lower` must be a number literal, got Utf8. No \
            function matches the given name and argument types 'dp_mean(Float64, Utf8, Int64, \
            Float64, Float64, Utf8)'. You might need to add explicit type casts.\n\tCandidate \
            functions:\n\tdp_mean(value, lower, upper, epsilon, delta, mechanism, neighbours)";
        let m = unwrap_coercion(wrapped).unwrap();
        assert_eq!(
            m,
            "dp_mean: `lower` must be a number literal, got Utf8. Usage: dp_mean(value, lower, \
             upper, epsilon[, delta][, mechanism]) (HELP dp_mean shows each argument)."
        );
        assert!(unwrap_coercion("Error during planning: table 't' not found").is_none());
        let e = Error::classify(DataFusionError::Execution(wrapped.into()));
        assert!(matches!(Error::of(&e), Some(Error::Invalid(_))), "{e}");
    }

    /// Refusals are typed where they are decided: no source file builds one as a planning error
    /// (whose kind could then only be guessed from its text).
    #[test]
    fn no_refusal_is_built_as_an_untyped_planning_error() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        assert!(files.len() > 20);
        let mut untyped = Vec::new();
        for f in files {
            let text: String = std::fs::read_to_string(&f)
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            for bad in [
                "plan_err!( \"dpfusion refused",
                "Plan(format!( \"dpfusion refused",
            ] {
                let bad_tight = bad.replace("( ", "(");
                if text.contains(bad) || text.contains(&bad_tight) {
                    untyped.push(format!("{}: {bad_tight}", f.display()));
                }
            }
        }
        assert!(untyped.is_empty(), "untyped refusals: {untyped:?}");
    }

    /// Round 48 (review "server48" F2): a statement's memory error, however DataFusion wrapped
    /// it, is one fixed text: nothing of its message (which listed the memory pool's top
    /// consumers, another analyst's results and their sizes among them). A spill past
    /// `max_spill_bytes`, inside the I/O error of the spill write, names the setting. A typed
    /// error (the fixed message of a private query) stays as it is.
    #[test]
    fn memory_and_spill_errors_are_fixed_texts() {
        use std::sync::Arc;
        let pool = || {
            DataFusionError::ResourcesExhausted(
                "Additional allocation failed for HashJoinInput[1] with top memory consumers \
                 (across reservations) as: dpfusion serve result of bob#0 consumed 217.5 MB"
                    .into(),
            )
        };
        for e in [
            pool(),
            pool().context("while joining"),
            DataFusionError::Shared(Arc::new(pool())),
            DataFusionError::External(Box::new(pool())),
            DataFusionError::ArrowError(
                Box::new(datafusion::arrow::error::ArrowError::ExternalError(
                    Box::new(pool()),
                )),
                None,
            ),
        ] {
            let e = Error::classify(e);
            assert!(
                matches!(Error::of(&e), Some(Error::ResourceLimit(_))),
                "{e}"
            );
            assert_eq!(e.to_string(), format!("External error: {MEMORY_EXCEEDED}"));
        }
        let io = std::io::Error::other(crate::session::SpillLimit { max: 1024 });
        let spill = DataFusionError::ArrowError(
            Box::new(datafusion::arrow::error::ArrowError::IoError(
                io.to_string(),
                io,
            )),
            None,
        );
        let e = Error::classify(spill.context("sorting"));
        let text = e.to_string();
        assert!(
            matches!(Error::of(&e), Some(Error::ResourceLimit(_))),
            "{text}"
        );
        assert!(
            text.contains("1024 bytes") && text.contains("max_spill_bytes"),
            "{text}"
        );
        let private = Error::classify(Error::ExecutionFailed.into());
        assert!(matches!(Error::of(&private), Some(Error::ExecutionFailed)));
        let other = Error::classify(DataFusionError::Execution("divide by zero".into()));
        assert!(Error::of(&other).is_none(), "{other}");
    }

    /// The file store's refusal, surfacing through the object store, is a typed refusal.
    #[test]
    fn a_file_store_refusal_is_typed_refused() {
        let refusal = crate::files::store::Refused::NotRegistered("/tmp/x.csv".into());
        let text = refusal.to_string();
        let e = DataFusionError::ObjectStore(Box::new(datafusion::object_store::Error::Generic {
            store: "dpfusion",
            source: Box::new(refusal),
        }));
        let e = Error::classify(e);
        assert!(
            matches!(Error::of(&e), Some(Error::Refused(m)) if *m == text),
            "{e}"
        );
        let other = Error::classify(DataFusionError::ObjectStore(Box::new(
            datafusion::object_store::Error::NotFound {
                path: "x".into(),
                source: "gone".into(),
            },
        )));
        assert!(Error::of(&other).is_none(), "{other}");
    }
}
