//! The errors an embedder can match (reachable through `DataFusionError::External`).
use crate::session::EXECUTION_FAILED;

/// A typed dpfusion error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A query that reads a private table failed after it was admitted. Its charge stands; the
    /// cause is not shown because it could depend on the data.
    #[error("{}", EXECUTION_FAILED)]
    ExecutionFailed,
}

/// The command line's panic hook: a panic's message could quote a value of a private row (an
/// arrow kernel, a sampler), so the binary prints a fixed line instead of the payload and the
/// location. (A library does not set hooks; an embedder chooses its own.)
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|_| {
        eprintln!(
            "dpfusion: internal error (a panic). No detail is shown: it could quote private data."
        );
    }));
}
