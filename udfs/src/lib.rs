//! `dpfusion-udfs`: everything that runs inside a DataFusion query plan, and what each call costs.
//!
//! - [`privacy`]: privacy-loss profiles (RDP curve on a fixed order grid, Gaussian-DP μ, additive δ),
//!   their composition and conversion to (ε, δ), and calibration (analytic Gaussian, exact GDP, zCDP).
//! - [`noise`]: a CSPRNG seeded by the OS and samplers on a power-of-two grid that are immune to
//!   the floating-point attack of Mironov (2012).
//! - [`mechanisms`]: Gaussian and Laplace mechanisms built from the two above.
//! - [`aggregates`]: the DP aggregate functions (UDAFs).
//! - [`scalars`]: planning helpers and post-processing scalar functions.
//! - [`progress`]: the hook through which long model fits report progress to the REPL.

pub mod aggregates;
pub mod audit;
pub mod mechanisms;
pub mod noise;
pub mod optim;
pub mod privacy;
pub mod progress;
pub mod scalars;

use datafusion::prelude::SessionContext;

/// Register every dpfusion function (aggregates and scalars) on a DataFusion context.
pub fn register_all(ctx: &SessionContext) {
    for udf in scalars::all_scalar_udfs() {
        ctx.register_udf(udf);
    }
    for udaf in aggregates::all_udafs() {
        ctx.register_udaf(udaf);
    }
}
