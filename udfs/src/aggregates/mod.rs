//! DP aggregate functions (DataFusion UDAFs) and what each call costs.
//!
//! Each function declares its data arguments and its literal parameters (name, kind, default,
//! doc, in positional order) in its own file (`pub const DP_X: Aggregate`, [`declaration`]);
//! [`registry::AGGREGATES`] lists them, and the signature, the coercion, the reading of the
//! literals ([`params::Params`]), named arguments, the guard's advice, the REPL's completion and
//! the UDAF documentation all read that one declaration (docs/SQL.md, "Aggregate functions",
//! documents them for users). The `_ci` variants ([`interval`]) take their base function's
//! parameters, then `confidence`, then `neighbours`, and return
//! `Struct{value, lower, upper, confidence, stddev}`.
//!
//! `mechanism` is `'gaussian'` (default) or `'laplace'` (pure ε-DP: [`Mechanism`]).
//! Every parameter must be a literal. `delta` may be left out (default [`DEFAULT_DELTA`]) and so
//! may `neighbours` (default `'add_remove'`); `neighbours` is set by the dpfusion session from the
//! table's registration, never by users. Named arguments work when every parameter up to the last
//! one given is supplied (DataFusion cannot skip a middle optional argument; the session resolves
//! named arguments itself).
//!
//! Costs never depend on data: [`dp_call_cost`] reads only the literal parameters, through the
//! same parameter structs ([`CountParams`], [`SumParams`], [`MeanParams`],
//! [`PartitionSelectParams`]) that the accumulators use to calibrate their noise.
//!
//! Noise is drawn only in `evaluate`, once per group, from a CSPRNG seeded by the OS; `state` and
//! `merge_batch` carry exact, un-noised partials ([`accumulator`], [`crate::mechanisms::exact`]).
//!
//! # Layout
//! One file per DP function, each declaring itself ([`declaration::Aggregate`]); [`registry`]
//! lists the declarations. The shared pieces import nothing from the functions: [`declaration`]
//! (types and shared parameters), [`params`] (reading the literals by name through the
//! declaration, [`Mechanism`]), [`adapter`] (the UDAF shell), [`interval`] (the `_ci` wrapper and
//! the interval maths), [`accumulator`]; [`bind`] (like [`registry`], it names functions: the
//! literal parameters bound into the physical plan's calls, a model's `make_array` features
//! spread into columns); the exact fixed-point arithmetic is
//! [`crate::mechanisms::exact`], the noise [`crate::mechanisms::Noise`], the neighbour relation
//! [`crate::privacy::Neighbours`]. The test `imports::no_import_circle_inside_aggregates_and_optim`
//! (udfs/tests/it/imports.rs, scripts/import_cycles.rs) keeps it so.
//!
//! # Adding an aggregate
//! For an aggregate that releases from exact per-group partials (a fixed-point sum, a count of
//! values, a count of rows: [`accumulator`]), as `dp_count`, `dp_sum`, `dp_mean` do
//! (`dp_count.rs` is the smallest example):
//! 1. Write `udfs/src/aggregates/dp_x.rs`, in this order, with each formula's source beside it:
//!    - `pub const DP_X: Aggregate` ([`declaration`]): name, summary, data arguments, parameters
//!      (the shared ones: [`declaration::EPSILON`], [`declaration::DELTA`],
//!      [`declaration::MECHANISM`], …, ending with [`declaration::NEIGHBOURS`]; each with its
//!      [`declaration::Kind`], which alone decides its SQL type), requirements, the SQL
//!      aggregates it replaces, its UDAF, `cost` and `noise`;
//!    - the parameter struct: `from_literals(args)` opens `Params::new(&DP_X, args)?`
//!      ([`params::Params`]: the count is checked against the declaration) and reads each
//!      parameter by its declared name (`p.bounds()?`, `p.epsilon()?`, `p.delta()?`,
//!      `p.mechanism()?`, `p.neighbours()?`, `p.number("bins")?` …), never by position; `cost`,
//!      which builds the release, so that the accountant refuses exactly what the planner
//!      refuses, and returns [`Mechanism::cost`]. The test `every_declared_parameter_is_read`
//!      fails while a declared parameter is not read, and reading an undeclared name panics;
//!    - the release: a struct holding one [`crate::mechanisms::Noise`] per noisy quantity, its
//!      `new` calibrating each noise kind side by side (`match p.mechanism`; under `units:K:C`
//!      the L1 sensitivity and slack times [`Neighbours::unit_l1_factor`], the Gaussian μ through
//!      [`Neighbours::calibration_mu`]), drawing only through `Noise::release` in one `draw`
//!      method, implementing `Finalise` ([`accumulator`]) with `noise` from `Noise::describe`;
//!    - `impl DpFunction for <Params>` (`NAME`, `spec`, `declaration`) and one `static SPEC`
//!      ([`adapter::Spec`]); `pub type DpX = DpUdaf<Params>` and `pub fn dp_x_udaf()`.
//!
//!    The adapter ([`adapter::DpUdaf`]) does the rest: signature, coercion, DISTINCT refusal,
//!    accumulators, state fields, the insecure test seed, documentation.
//! 2. Add `super::dp_x::DP_X` to [`registry::AGGREGATES`] and re-export the public items here.
//! 3. Document it in docs/SQL.md ("Aggregate functions") and README.md; the test
//!    `every_aggregate_is_documented` fails until both name it, and when docs/SQL.md documents a
//!    function the registry does not have. A contribution rule for unit-level tables goes in
//!    the root crate's src/guard/units.rs.
//!
//! Error bars ([`interval`]): implement `Finalise::finalise_with_intervals` calling the same
//! `draw` as `finalise`, so the `_ci` value is the base value by construction; then one line,
//! `interval::ci_variant!(Params, DP_X => DP_X_CI, "dp_x_ci", DpXCi, dp_x_ci_udaf, "summary");`,
//! generates the `_ci` declaration from the base's (parameters, data, cost, noise), its UDAF and
//! its `DpInterval` impl; list `DP_X_CI` in the registry and the docs as in steps 2 and 3.
//!
//! An aggregate with its own accumulator (the models, which buffer rows, and `rgm_mean_by`)
//! writes its own `AggregateUDFImpl` instead of the `Spec` (see `dp_logreg_agd.rs`), reading its
//! literals the same way (`literal_params(&DP_X, exprs)`, `Params::new(&DP_X, &lits)`; a
//! unit-level call's key is at `DP_X.unit_key_index()`); steps 2 and 3 are the same.
use datafusion::common::ScalarValue;
use datafusion::logical_expr::AggregateUDF;

use crate::privacy::{Event, PrivacyError};

pub mod accumulator;
pub mod adapter;
pub mod bind;
mod common;
pub mod declaration;
pub mod dp_count;
pub mod dp_count_distinct;
pub mod dp_linreg_gd;
pub mod dp_logreg_agd;
pub mod dp_mean;
pub mod dp_models_sgd;
pub mod dp_quantile;
pub mod dp_sum;
pub mod dp_variance;
pub mod interval;
pub mod params;
pub mod partition_select;
pub mod registry;
pub mod rgm_mean_by;

pub use accumulator::Partial;
pub use dp_count::{CountParams, DpCount, DpCountCi, dp_count_ci_udaf, dp_count_udaf};
pub use dp_count_distinct::{
    CountDistinctParams, DpCountDistinct, DpCountDistinctCi, dp_count_distinct_ci_udaf,
    dp_count_distinct_udaf,
};
pub use dp_linreg_gd::{DpLinregGd, LinregParams, dp_linreg_gd_udaf};
pub use dp_logreg_agd::{AgdParams, DpLogregAgd, dp_logreg_agd_udaf};
pub use dp_mean::{DpMean, DpMeanCi, MeanParams, dp_mean_ci_udaf, dp_mean_udaf};
pub use dp_models_sgd::{
    DpSgd, SgdKind, SgdParams, dp_linreg_sgd_udaf, dp_logreg_sgd_udaf, dp_mlp_sgd_udaf,
};
pub use dp_quantile::{
    DpQuantileUdaf, QuantileKind, QuantileParams, dp_median_udaf, dp_quantile_udaf,
    dp_quantiles_udaf,
};
pub use dp_sum::{DpSum, DpSumCi, SumParams, dp_sum_ci_udaf, dp_sum_udaf};
pub use dp_variance::{
    DpStddev, DpStddevCi, DpVariance, DpVarianceCi, StddevParams, VarianceParams,
    dp_stddev_ci_udaf, dp_stddev_udaf, dp_variance_ci_udaf, dp_variance_udaf,
};
pub use params::{DEFAULT_DELTA, Mechanism, Neighbours};
pub use partition_select::{DpPartitionSelect, PartitionSelectParams, dp_partition_select_udaf};
pub use rgm_mean_by::{RgmMeanBy, RgmMeanParams, rgm_mean_by_udaf};

/// Every dpfusion DP aggregate ([`registry::AGGREGATES`]).
pub fn all_udafs() -> Vec<AggregateUDF> {
    registry::AGGREGATES.iter().map(|a| (a.udaf)()).collect()
}

/// INSECURE, for reproducible tests only: every dpfusion DP aggregate, as [`all_udafs`], but
/// drawing its noise from a generator seeded with `seed` instead of the operating system. Reached
/// only through the Rust API (`SessionOptions::with_insecure_noise_seed`), never from SQL, the
/// CLI, the catalog or the server.
pub fn all_udafs_insecure_seeded(seed: u64) -> Vec<AggregateUDF> {
    registry::AGGREGATES
        .iter()
        .map(|a| (a.seeded)(seed))
        .collect()
}

/// How many leading data arguments a dpfusion DP aggregate takes (`None`: not one).
pub fn dp_aggregate_data_args(name: &str) -> Option<usize> {
    registry::get(name).map(|a| a.data.len())
}

/// The privacy events a call costs, from its literal parameters (the arguments after the data
/// columns, in positional order; trailing optional ones may be missing). `None`: not a dpfusion
/// DP aggregate. Never reads data.
pub fn dp_call_cost(
    name: &str,
    params: &[ScalarValue],
) -> Option<Result<Vec<Event>, PrivacyError>> {
    registry::get(name).map(|a| (a.cost)(&[], params))
}

/// The noise of a call's release, from its literal parameters (for EXPLAIN PRIVACY), e.g.
/// `Gaussian σ = 5.302`. `None`: not a DP aggregate, or one that does not describe its noise.
pub fn dp_call_noise(name: &str, params: &[ScalarValue]) -> Option<String> {
    registry::get(name).and_then(|a| (a.noise)(params))
}

/// Like [`dp_call_cost`], for a call whose cost may also depend on the *shape* of its data
/// arguments as written in the query (never on data): the feature count of `dp_linreg_gd` with
/// mechanism 'rgm', read from `[x1, …, xd]` / `make_array(…)`. `data` are the call's logical
/// data-argument expressions.
pub fn dp_call_cost_with_data(
    name: &str,
    data: &[datafusion::logical_expr::Expr],
    params: &[ScalarValue],
) -> Option<Result<Vec<Event>, PrivacyError>> {
    registry::get(name).map(|a| (a.cost)(data, params))
}

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
