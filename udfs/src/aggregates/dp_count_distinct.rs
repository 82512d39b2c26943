//! `dp_count_distinct(unit, epsilon[, delta])`: a Gaussian-noised count of the distinct privacy
//! units of a unit-level table (docs/PRIVACY.md, "Privacy units").
//!
//! The dpfusion session rewrites the call so that each unit reaches the aggregate once per group
//! (its first row in a random order; [`super::params::Neighbours::Units`] with C = 1) in at
//! most K groups; the aggregate then counts non-NULL values exactly as `dp_count` does
//! ([`super::dp_count`]). Adding or removing one unit changes each of at most K per-group counts
//! by 1: L2 sensitivity √K (Wilson et al., "Differentially Private SQL with Bounded User
//! Contribution", PoPETs 2020, §3), so σ = √K/μ with μ = gaussian_mu(ε, δ): one μ-GDP release.
//!
//! Outside the session's rewrite (a plain DataFusion context, or a table whose unit is one row)
//! the call would count rows, not units, so it is refused at planning unless the hidden
//! `neighbours` mode is `units:K:C`.
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::AggregateUDF;

use super::accumulator::Shape;
use super::adapter::{DpFunction, DpUdaf, Spec};
use super::common::DataArg;
use super::declaration::{self, Aggregate, DELTA, EPSILON, NEIGHBOURS, UnitRule};
use super::dp_count::CountParams;
use super::dp_count::CountRelease;
use super::params::Params;
use crate::privacy::{Event, PrivacyError};

/// `dp_count_distinct(unit, epsilon, delta, neighbours)`: [`CountParams`] in a units mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CountDistinctParams(pub CountParams);

impl CountDistinctParams {
    pub fn from_literals(args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = CountParams::read(&Params::new(&DP_COUNT_DISTINCT, args)?)?;
        if !p.neighbours.is_units() {
            return Err(PrivacyError::invalid(
                "unit",
                "a table whose privacy unit is one row".to_string(),
                "the unit column of a table that declares a privacy unit (the dpfusion session \
                 bounds each unit to one row per group before counting)",
            ));
        }
        Ok(Self(p))
    }
    /// One Gaussian release, as `dp_count` (module docs).
    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        self.0.cost()
    }
}

/// The `dp_count_distinct` UDAF.
pub type DpCountDistinct = DpUdaf<CountDistinctParams>;

/// `dp_count_distinct` as an [`AggregateUDF`].
pub fn dp_count_distinct_udaf() -> AggregateUDF {
    DpCountDistinct::udaf()
}

impl DpFunction for CountDistinctParams {
    const NAME: &'static str = "dp_count_distinct";
    fn spec() -> &'static Spec {
        &SPEC
    }
    fn declaration() -> &'static Aggregate {
        &DP_COUNT_DISTINCT
    }
}

static SPEC: Spec = Spec {
    data: DataArg::Any,
    returns: DataType::Int64,
    shape: Shape {
        sum: false,
        sum_sq: false,
        count: true,
        rows: false,
    },
    release: |lits| {
        Ok(Arc::new(CountRelease::new(
            &CountDistinctParams::from_literals(lits)?.0,
        )?))
    },
    description: "Differentially private number of distinct privacy units (tables that declare a \
         privacy unit column only). Each unit is counted once in each of at most \
         max_groups_contributed groups; the exact count is released with discrete Gaussian noise \
         of L2 sensitivity √max_groups_contributed, calibrated so that the call is (epsilon, \
         delta)-DP for adding or removing a whole unit, then rounded and clamped at 0. Returns \
         Int64, never negative.",
    example: "SELECT dp_count_distinct(customer_id, epsilon => 0.5) FROM transactions;",
    related: &["dp_count"],
};

/// The declaration of `dp_count_distinct` (listed in [`super::registry::AGGREGATES`]).
pub const DP_COUNT_DISTINCT: Aggregate = Aggregate {
    name: "dp_count_distinct",
    summary: "noisy number of distinct privacy units (tables with a unit column)",
    data: &[declaration::DataArg {
        name: "unit",
        doc: "the table's privacy unit column",
    }],
    params: &[EPSILON, DELTA, NEIGHBOURS],
    requirements: &[],
    units: UnitRule::Once,
    replaces: &[],
    internal: false,
    udaf: dp_count_distinct_udaf,
    seeded: |seed| super::dp_count_distinct::DpCountDistinct::with_insecure_seed(seed).into(),
    cost: |_, p| {
        declaration::no_data(
            CountDistinctParams::from_literals,
            CountDistinctParams::cost,
            p,
        )
    },
    noise: super::adapter::spec_noise::<CountDistinctParams>,
};

super::interval::ci_variant!(CountDistinctParams, DP_COUNT_DISTINCT => DP_COUNT_DISTINCT_CI,
    "dp_count_distinct_ci", DpCountDistinctCi, dp_count_distinct_ci_udaf,
    "dp_count_distinct's release with its confidence interval");
