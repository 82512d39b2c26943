//! A progress hook for long model fits: the fit reports (iterations done, total); the host (the
//! REPL on a terminal) decides whether and how to show it. Reporting is a no-op when no reporter
//! is installed, and never depends on private data beyond the public iteration counter.
use std::sync::{Arc, RwLock};

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
}
