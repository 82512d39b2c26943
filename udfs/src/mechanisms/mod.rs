//! Mechanisms: a calibrated noise distribution plus the rule that turns a true value into a release.
//! [`exact`] is the fixed-point arithmetic the aggregates sum in and release from exactly
//! (sensitivities that hold whatever the partitioning), [`noise::Noise`] the one noise type.
pub mod exact;
pub mod exponential;
pub mod gaussian;
pub mod laplace;
pub mod noise;
pub mod rgm;

pub use gaussian::GaussianMechanism;
pub use laplace::LaplaceMechanism;
pub use noise::{Interval, Noise};
