//! Optimisation kernels of the model aggregates, over rows buffered by [`rows::RowBuffer`].
//!
//! - [`rows`]: the mergeable row buffer (labels and a row-major feature matrix) and bad-input
//!   rules shared by every model aggregate.
//! - [`model`]: the model struct every model aggregate returns.
//! - [`linreg`]: DP gradient descent for linear regression (`dp_linreg_gd`): per-example clipped
//!   Gaussian GD, and relative-Gaussian-mechanism GD on the ridge objective.
pub mod agd;
pub mod linreg;
pub mod model;
pub mod rows;

pub use model::{Model, model_data_type};
pub use rows::{LabelKind, RowBuffer, Rows};
