//! A progress hook for long model fits: the fit reports (iterations done, total); the host (the
//! REPL on a terminal) decides whether and how to show it. Reporting is a no-op when no reporter
//! is installed, and never depends on private data beyond the public iteration counter.
//!
//! Cancellation: a fit notes the [`generation`] when it starts and stops at its next iteration
//! once [`cancel_running`] has been called (the REPL's Ctrl-C), or once its statement's own flag
//! is set ([`within`]; the server's time limit). A fit is CPU work inside an aggregate's
//! `evaluate`, which dropping the query's future does not interrupt.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The current cancellation generation (a fit notes it when it starts).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::SeqCst)
}

/// Stops every model fit running in this process at its next iteration. (One process, one
/// interactive user: the REPL. A server cancels per query instead.)
pub fn cancel_running() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

thread_local! {
    /// The cancellation flag of the statement whose accumulator runs on this thread now
    /// ([`within`]).
    static STATEMENT: std::cell::RefCell<Option<Arc<AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (an accumulator's work, synchronous on this thread) with `token` as the statement's
/// cancellation flag: a fit inside stops at its next iteration once the flag is set (the
/// server sets it at the statement's time limit, or when the client goes away; review r45: a
/// fit is one synchronous call that dropping the statement's future does not interrupt).
pub fn within<T>(token: &Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            STATEMENT.with(|s| *s.borrow_mut() = previous);
        }
    }
    let _restore = Restore(STATEMENT.with(|s| s.replace(Some(Arc::clone(token)))));
    f()
}

/// True when [`cancel_running`] was called since `started` (a [`generation`]), or the flag of
/// the statement running on this thread ([`within`]) is set.
pub fn cancelled(started: u64) -> bool {
    generation() != started
        || STATEMENT.with(|s| {
            s.borrow()
                .as_ref()
                .is_some_and(|t| t.load(Ordering::Relaxed))
        })
}

/// The error of a fit stopped by [`cancel_running`].
pub fn cancelled_error(function: &str) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Execution(format!("{function}: cancelled"))
}

/// What a fit reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The function, e.g. `dp_linreg_gd`.
    pub function: &'static str,
    /// Iterations done so far.
    pub done: u64,
    /// Iterations planned (an upper bound for fits that may stop early).
    pub total: u64,
}

type Reporter = Arc<dyn Fn(&Progress) + Send + Sync>;

static REPORTER: RwLock<Option<Reporter>> = RwLock::new(None);

/// Installs (or, with `None`, removes) the process-wide reporter.
pub fn set_reporter(r: Option<Reporter>) {
    *REPORTER.write().unwrap_or_else(|e| e.into_inner()) = r;
}

/// Reports progress to the installed reporter, if any.
pub fn report(function: &'static str, done: u64, total: u64) {
    let r = REPORTER.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(r) = r {
        r(&Progress {
            function,
            done,
            total,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn reporter_receives_progress() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        // Only this test's reports: model fits in parallel tests report too.
        set_reporter(Some(Arc::new(move |p: &Progress| {
            if p.function == "dp_test" {
                s.lock().unwrap().push((p.done, p.total))
            }
        })));
        report("dp_test", 3, 10);
        set_reporter(None);
        report("dp_test", 4, 10);
        assert_eq!(*seen.lock().unwrap(), vec![(3, 10)]);
    }

    #[test]
    fn cancelling_moves_the_generation() {
        let g = generation();
        assert!(!cancelled(g));
        cancel_running();
        assert!(cancelled(g));
        assert!(!cancelled(generation()));
    }
}
