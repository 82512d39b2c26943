//! Optimisation kernels of the model aggregates, over rows buffered by [`rows::RowBuffer`].
//!
//! - [`rows`]: the mergeable row buffer (labels and a row-major feature matrix) and bad-input
//!   rules shared by every model aggregate.
//! - [`model`]: the model struct every model aggregate returns.
//! - [`linreg`]: DP gradient descent for linear regression (`dp_linreg_gd`): per-example clipped
//!   Gaussian GD, and relative-Gaussian-mechanism GD on the ridge objective.
//! - [`clip`]: per-example clipping into exact integers ([`clip::Clipper`]), shared by the GD
//!   kernels and DP-SGD; the one float norm every fit's clipping reads ([`clip::l2_norm`]: no
//!   underflow to 0, never below the largest entry) and the one saturating integer squared norm
//!   every exact check compares ([`clip::norm2_int`]) (round 52).
//! - [`kernel`]: the blocked, runtime-dispatched (AVX2 or baseline) row passes of `dp_linreg_gd`
//!   and `dp_logreg_agd`: exact integer sums, the same for any split of the rows.
//! - [`agd`]: DP-AGD for logistic regression (`dp_logreg_agd`).
//! - [`mlp`]: the networks of the DP-SGD aggregates (linear, logistic, one hidden ReLU layer)
//!   and their per-example gradients.
//! - [`sgd`]: DP-SGD (`dp_linreg_sgd`, `dp_logreg_sgd`, `dp_mlp_sgd`): Poisson-subsampled
//!   per-example-clipped Gaussian steps, or one pass with matrix-factorised correlated noise.
//! - [`units`]: privacy units (unit-level neighbours `units:K:C`): rows grouped by unit and the
//!   exact per-unit clipping of user-level DP-SGD (McMahan et al., ICLR 2018, §3).
pub mod agd;
pub mod clip;
pub mod kernel;
pub mod linreg;
pub mod mlp;
pub mod model;
pub mod rows;
pub mod sgd;
pub mod units;

pub use model::{Model, model_data_type};
pub use rows::{LabelKind, RowBuffer, Rows};
pub use units::Units;

/// Rows below which a pass over the rows runs on one thread (spawning costs ~20 µs a thread).
const PAR_MIN_ROWS: usize = 1 << 15;

/// Threads for a pass over `n` rows: the machine's parallelism, one per `PAR_MIN_ROWS` rows.
fn threads_for(n: usize) -> usize {
    if n < 2 * PAR_MIN_ROWS {
        return 1;
    }
    // `available_parallelism` reads cgroup files on Linux: ask once per process.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get()));
    cores.min(n / PAR_MIN_ROWS).max(1)
}

/// Runs `f(start, chunk)` on contiguous chunks of `data` (chunk = rows `start..start + len`), on
/// scoped threads when `data` is large, and returns the results in row order. The kernels'
/// per-row sums are exact integers, so adding the per-chunk results gives the same value as one
/// sequential pass, whatever the number of threads (PRIVACY.md, "Numbers on a computer").
pub(crate) fn par_chunks_mut<U: Send, T: Send>(
    data: &mut [U],
    f: impl Fn(usize, &mut [U]) -> T + Sync,
) -> Vec<T> {
    let n = data.len();
    let threads = threads_for(n);
    if threads <= 1 {
        return vec![f(0, data)];
    }
    let chunk = n.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = data
            .chunks_mut(chunk)
            .enumerate()
            .map(|(k, c)| scope.spawn(move || f(k * chunk, c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// [`par_chunks_mut`] over the row range `0..n` alone.
pub(crate) fn par_ranges<T: Send>(
    n: usize,
    f: impl Fn(std::ops::Range<usize>) -> T + Sync,
) -> Vec<T> {
    let mut unit = vec![(); n];
    par_chunks_mut(&mut unit, |start, c| f(start..start + c.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_chunks_cover_every_row_once_in_order() {
        for n in [0, 1, 5, PAR_MIN_ROWS * 3 + 7] {
            let mut data: Vec<u64> = (0..n as u64).collect();
            let parts = par_chunks_mut(&mut data, |start, c| {
                for (k, v) in c.iter_mut().enumerate() {
                    assert_eq!(*v, (start + k) as u64);
                    *v += 1;
                }
                (start, c.len())
            });
            assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), n);
            assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(data.iter().enumerate().all(|(i, &v)| v == i as u64 + 1));
            let sums = par_ranges(n, |r| r.map(|i| i as u128).sum::<u128>());
            assert_eq!(sums.iter().sum::<u128>(), (0..n as u128).sum::<u128>());
        }
    }
}
