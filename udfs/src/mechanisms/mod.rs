//! Mechanisms: a calibrated noise distribution plus the rule that turns a true value into a release.
pub mod exponential;
pub mod gaussian;
pub mod laplace;
pub mod noise;
pub mod rgm;

pub use gaussian::GaussianMechanism;
pub use laplace::LaplaceMechanism;
pub use noise::{Interval, Noise};
