//! Secure noise.
//!
//! - [`SecureRng`]: ChaCha20 seeded from the operating system. A fixed seed exists only as
//!   [`SecureRng::insecure_from_seed`], for tests.
//! - Samplers on a power-of-two grid (see [`grid`]): the discrete Gaussian and discrete Laplace of
//!   Canonne, Kamath and Steinke (NeurIPS 2020), sampled exactly with integer arithmetic, then
//!   scaled by the grid step. The output of a release is a multiple of the grid step, so the
//!   floating-point attack of Mironov (CCS 2012) does not apply.

pub mod discrete;
pub mod grid;
pub mod rng;

pub use discrete::{sample_discrete_gaussian, sample_discrete_laplace};
pub use grid::{granularity_for, granularity_for_mechanism, round_to_grid};
pub use rng::SecureRng;
