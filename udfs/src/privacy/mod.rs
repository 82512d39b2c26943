//! Privacy-loss profiles and their arithmetic.
//!
//! A mechanism's cost is recorded as an [`Event`] (a small parametric description that the ledger
//! stores) and evaluated into a [`Profile`] (an RDP curve on the fixed order grid [`grid::ORDERS`],
//! an optional Gaussian-DP μ, and an additive δ). Profiles compose by adding curves, adding μ² and
//! adding δ (PRIVACY.md, "What a query costs").

pub mod calibrate;
pub mod cks;
pub mod error;
pub mod gdp;
pub mod grid;
pub mod neighbours;
pub mod normal;
pub mod pld;
pub mod profile;
pub mod sgd;

pub use calibrate::{
    analytic_gaussian_sigma, gaussian_epsilon, gaussian_mu, gaussian_sigma_for_steps, zcdp_epsilon,
    zcdp_rho,
};
pub use error::PrivacyError;
pub use neighbours::Neighbours;
pub use profile::{Event, Profile};

/// Google dp-accounting's reference numbers (`udfs/tests/data/accounting_vectors.json`).
#[cfg(test)]
pub(crate) fn test_vectors() -> serde_json::Value {
    serde_json::from_str(include_str!("../../tests/data/accounting_vectors.json"))
        .expect("accounting_vectors.json")
}
