//! One declaration per DP aggregate: its name, data arguments, parameters (name, type, default,
//! doc), requirements, the SQL aggregates it replaces, how to build its UDAF and what a call
//! costs. Named-argument resolution, the guard, the REPL's completion and the docs read this list;
//! nothing else names the functions.
//!
//! # Adding an aggregate
//! For an aggregate that releases from exact per-group partials (a fixed-point sum, a count of
//! values, a count of rows: [`super::accumulator`]), as `dp_count`, `dp_sum`, `dp_mean` and
//! `dp_partition_select` do:
//! 1. Write `udfs/src/aggregates/<name>.rs` (`dp_count.rs` is the smallest example), with the
//!    formula and its source cited beside the code in the module docs:
//!    - the parameter struct (`NAMES`, `from_literals`, and `cost`, which must call the release's
//!      constructor so that the accountant refuses exactly what the planner refuses; the
//!      existing ones live in `params.rs`, which holds the shared literal parsing);
//!    - the release: a struct built from the parameters (`new`, the calibration) implementing
//!      `Finalise` ([`super::accumulator`]: state shape, fixed-point grid, and the noisy
//!      output from the exact partials);
//!    - `impl DpFunction for <Params>` (its SQL `NAME`) and one `static SPEC: Spec`
//!      ([`super::adapter::Spec`]: data-argument kind, return type, state shape, the release
//!      from the literals, description, SQL example, related functions);
//!    - `pub type DpName = DpUdaf<Params>;` and `pub fn <name>_udaf() -> AggregateUDF`,
//!      re-exported from `aggregates/mod.rs`.
//!
//!    The adapter ([`super::adapter::DpUdaf`]) does the rest: signature, coercion, DISTINCT
//!    refusal, accumulators, state fields, the insecure test seed, documentation.
//! 2. Add one [`Aggregate`] entry to [`AGGREGATES`] below: the positional parameter order must
//!    be the one `from_literals` reads, ending with the hidden `neighbours`. The adapter reads
//!    the signature's parameter names, the number of required parameters, the syntax and the
//!    argument docs from this entry.
//! 3. Document it in README.md ("Functions") and docs/SQL.md; the test
//!    `every_aggregate_is_documented` in this file checks that both name it.
//!
//! Error bars ([`super::interval`]): to give an adapter function a `_ci` variant, implement
//! `Finalise::finalise_with_intervals` on its release(s) (drawing exactly as `finalise` does),
//! `impl DpInterval for <Params>` (the `_ci` name) with `pub fn <name>_ci_udaf()` returning
//! `DpCiUdaf::<Params>::udaf()`, and declare it below with the base parameters, then
//! `CONFIDENCE`, then `NEIGHBOURS`, `cost: ci_cost::<Params>` and `noise: ci_noise::<Params>`.
//! The guard reads a `_ci` call's contribution (unit-level tables) from its base ([`base_of`]).
//!
//! An aggregate with its own accumulator (the models `dp_linreg_gd`, `dp_logreg_agd`, which
//! buffer rows, and `rgm_mean_by`) writes its own `AggregateUDFImpl` instead of step 1's `Spec`
//! (see `dp_logreg_agd.rs`); steps 2 and 3 are the same.
//!
//! Unit-level calls (`neighbours` = `'units:K:C'`): the model aggregates (`dp_linreg_gd`,
//! `dp_logreg_agd`) take one more argument after `neighbours`, the privacy-unit key column (any
//! type, not a literal and not a parameter: it is not in `params`), and refuse a unit-level call
//! without it; the guard strips it before calling `cost`, which reads the literals only.
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{AggregateUDF, Expr};

use super::dp_models_sgd::{SgdKind, sgd_cost, sgd_noise};
use super::dp_quantile::{
    QuantileKind, cost_of as quantile_cost, dp_median_udaf, dp_quantile_udaf, dp_quantiles_udaf,
    noise_of as quantile_noise,
};
use super::interval::{ci_cost, ci_noise};
use super::{
    AgdParams, CountDistinctParams, CountParams, MeanParams, PartitionSelectParams, RgmMeanParams,
    StddevParams, SumParams, VarianceParams, dp_count_ci_udaf, dp_count_distinct_ci_udaf,
    dp_count_distinct_udaf, dp_count_udaf, dp_linreg_gd, dp_linreg_gd_udaf, dp_logreg_agd_udaf,
    dp_mean_ci_udaf, dp_mean_udaf, dp_partition_select_udaf, dp_stddev_ci_udaf, dp_stddev_udaf,
    dp_sum_ci_udaf, dp_sum_udaf, dp_variance_ci_udaf, dp_variance_udaf, rgm_mean_by_udaf,
};
use crate::privacy::{Event, PrivacyError};

/// The SQL type of a literal parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Number,
    Text,
    Bool,
    /// A list of numbers (`[0.25, 0.5, 0.75]`).
    NumberList,
}

/// The default of a parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// Required: no default.
    Required,
    /// The session's `dpfusion.default_delta`.
    SessionDelta,
    /// A numeric literal, as written in SQL.
    Number(&'static str),
    /// A string literal.
    Text(&'static str),
    /// A boolean literal.
    Bool(bool),
    /// Set by the session (the neighbour mode), never by users.
    Hidden,
}

/// One literal parameter after the data arguments.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    pub default: Default,
    pub doc: &'static str,
}

/// One data argument (an expression over the rows).
#[derive(Debug, Clone, Copy)]
pub struct DataArg {
    pub name: &'static str,
    pub doc: &'static str,
}

/// What a call needs of the table and the plan, checked by the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// The group sizes must be public: `replace` neighbours, public keys, no private filter.
    PublicGroupSizes,
    /// The value must be a bare column with a ratio bound declared by the data owner.
    DeclaredRatio,
}

/// What a call costs: from its data arguments' shape (never data) and its literal parameters.
pub type CostFn = fn(&[Expr], &[ScalarValue]) -> Result<Vec<Event>, PrivacyError>;

/// The declaration of one DP aggregate.
#[derive(Debug)]
pub struct Aggregate {
    pub name: &'static str,
    /// One line: what it releases.
    pub summary: &'static str,
    pub data: &'static [DataArg],
    /// In positional order (what the parameter struct's `from_literals` reads).
    pub params: &'static [Param],
    pub requirements: &'static [Requirement],
    /// Non-private SQL aggregates this one replaces (for the guard's advice).
    pub replaces: &'static [&'static str],
    /// Internal (inserted by the guard; not for users).
    pub internal: bool,
    pub udaf: fn() -> AggregateUDF,
    /// The privacy events of a call, from the shape of its data arguments as written (never
    /// data) and its literal parameters in positional order. Never reads data.
    pub cost: CostFn,
    /// The noise a call's release gets, from its literal parameters (EXPLAIN PRIVACY), when the
    /// function says (`None`: not described).
    pub noise: NoiseFn,
}

/// What noise a call's release gets, from its literal parameters in positional order.
pub type NoiseFn = fn(&[ScalarValue]) -> Option<String>;

/// [`NoiseFn`] of an aggregate served by the adapter: its release's own description.
fn spec_noise<P: super::adapter::DpFunction>(params: &[ScalarValue]) -> Option<String> {
    (P::spec().release)(params).ok()?.noise()
}

impl Aggregate {
    /// The parameters users may write (the hidden neighbour mode left out).
    pub fn user_params(&self) -> impl Iterator<Item = &'static Param> {
        self.params.iter().filter(|p| p.default != Default::Hidden)
    }

    /// The positional index of parameter `name` among the parameters (after the data).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }

    /// The call's signature as users write it, e.g. `dp_sum(value, lower, upper, epsilon[, delta])`.
    pub fn usage(&self) -> String {
        let mut s: Vec<String> = self.data.iter().map(|d| d.name.to_string()).collect();
        let mut optional = String::new();
        for p in self.user_params() {
            if p.default == Default::Required {
                s.push(p.name.to_string());
            } else {
                optional.push_str(&format!("[, {}]", p.name));
            }
        }
        format!("{}({}{optional})", self.name, s.join(", "))
    }
}

const fn number(name: &'static str, default: Default, doc: &'static str) -> Param {
    Param {
        name,
        kind: Kind::Number,
        default,
        doc,
    }
}

const EPSILON: Param = number(
    "epsilon",
    Default::Required,
    "ε > 0, finite: the call is (ε, δ)-DP on its own",
);
const PURE_EPSILON: Param = number(
    "epsilon",
    Default::Required,
    "ε > 0, finite: the call is ε-DP (pure, δ = 0) on its own",
);
const DELTA: Param = number(
    "delta",
    Default::SessionDelta,
    "δ in (0, 1); defaults to the session's dpfusion.default_delta (1e-7)",
);
const MECHANISM: Param = Param {
    name: "mechanism",
    kind: Kind::Text,
    default: Default::Text("gaussian"),
    doc: "'gaussian' ((ε, δ)-DP, the default) or 'laplace' (pure ε-DP: δ is not used)",
};
/// The `_ci` variants' interval level ([`super::interval`]), just before `neighbours`.
const CONFIDENCE: Param = number(
    "confidence",
    Default::Number("0.95"),
    "the interval's coverage, in (0, 1); the interval is post-processing: no extra charge",
);
/// The quantiles' histogram resolution ([`super::dp_quantile`]), just before `neighbours`.
const BINS: Param = number(
    "bins",
    Default::Number("1024"),
    "the histogram's bins, a power of two in [2, 8192]: the resolution is (upper − lower)/bins; \
     public, no extra cost; the state is 8·bins bytes per group and each release O(bins)",
);
const NEIGHBOURS: Param = Param {
    name: "neighbours",
    kind: Kind::Text,
    default: Default::Hidden,
    doc: "the neighbour mode, set by the session from the table and the plan",
};
const LOWER: Param = number(
    "lower",
    Default::Required,
    "finite; values are clamped to [lower, upper]",
);
const UPPER: Param = number("upper", Default::Required, "finite, ≥ lower");

const SGD_SAMPLE_RATE: Param = number(
    "sample_rate",
    Default::Number("0.01"),
    "Poisson sample rate q per step",
);
const SGD_STEPS: Param = number(
    "steps",
    Default::Number("0"),
    "steps T; 0: 1000 ('independent') or 100 ('mf')",
);
const SGD_EPOCHS: Param = number(
    "epochs",
    Default::Number("0"),
    "instead of steps: T = ceil(epochs/q); 0: unset",
);
const SGD_CLIP: Param = number(
    "clip",
    Default::Number("1"),
    "L2 bound of each example's whole gradient",
);
const SGD_LEARNING_RATE: Param = number(
    "learning_rate",
    Default::Number("0.5"),
    "step size on the mean clipped gradient",
);
const SGD_NOISE: Param = Param {
    name: "noise",
    kind: Kind::Text,
    default: Default::Text("independent"),
    doc: "'independent' (Poisson DP-SGD) or 'mf' (one pass, correlated noise)",
};
/// The parameters of `dp_linreg_sgd` and `dp_logreg_sgd` (`SgdParams::NAMES`).
const SGD_PARAMS: &[Param] = &[
    EPSILON,
    DELTA,
    SGD_SAMPLE_RATE,
    SGD_STEPS,
    SGD_EPOCHS,
    SGD_CLIP,
    SGD_LEARNING_RATE,
    SGD_NOISE,
    NEIGHBOURS,
];
const VALUE: DataArg = DataArg {
    name: "value",
    doc: "the column or row expression aggregated",
};
const COUNTED: DataArg = DataArg {
    name: "value",
    doc: "only its NULL-ness (and NaN) is read",
};
const ROWS: DataArg = DataArg {
    name: "value",
    doc: "every row of the group counts, NULLs included",
};
const MODEL_DATA: &[DataArg] = &[
    DataArg {
        name: "label",
        doc: "the label column",
    },
    DataArg {
        name: "features",
        doc: "a list of numbers: [x1, x2] or make_array(x1, x2)",
    },
];

fn no_data<T>(
    f: fn(&[ScalarValue]) -> Result<T, PrivacyError>,
    cost: fn(&T) -> Result<Vec<Event>, PrivacyError>,
    params: &[ScalarValue],
) -> Result<Vec<Event>, PrivacyError> {
    f(params).and_then(|p| cost(&p))
}

/// Every dpfusion DP aggregate.
pub static AGGREGATES: &[Aggregate] = &[
    Aggregate {
        name: "dp_count",
        summary: "noisy count of the non-NULL values (Int64, never negative)",
        data: &[COUNTED],
        params: &[EPSILON, DELTA, MECHANISM, NEIGHBOURS],
        requirements: &[],
        replaces: &["count"],
        internal: false,
        udaf: dp_count_udaf,
        cost: |_, p| no_data(CountParams::from_literals, CountParams::cost, p),
        noise: spec_noise::<CountParams>,
    },
    Aggregate {
        name: "dp_count_distinct",
        summary: "noisy number of distinct privacy units (tables with a unit column)",
        data: &[DataArg {
            name: "unit",
            doc: "the table's privacy unit column",
        }],
        params: &[EPSILON, DELTA, NEIGHBOURS],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_count_distinct_udaf,
        cost: |_, p| {
            no_data(
                CountDistinctParams::from_literals,
                CountDistinctParams::cost,
                p,
            )
        },
        noise: spec_noise::<CountDistinctParams>,
    },
    Aggregate {
        name: "dp_sum",
        summary: "noisy sum of the values clamped to [lower, upper]",
        data: &[VALUE],
        params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
        requirements: &[],
        replaces: &["sum"],
        internal: false,
        udaf: dp_sum_udaf,
        cost: |_, p| no_data(SumParams::from_literals, SumParams::cost, p),
        noise: spec_noise::<SumParams>,
    },
    Aggregate {
        name: "dp_mean",
        summary: "noisy mean of the values clamped to [lower, upper], within [lower, upper]",
        data: &[VALUE],
        params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
        requirements: &[],
        replaces: &["avg", "mean"],
        internal: false,
        udaf: dp_mean_udaf,
        cost: |_, p| no_data(MeanParams::from_literals, MeanParams::cost, p),
        noise: spec_noise::<MeanParams>,
    },
    Aggregate {
        name: "dp_count_ci",
        summary: "dp_count's release with its confidence interval: \
                  Struct{value, lower, upper, confidence, stddev}",
        data: &[COUNTED],
        params: &[EPSILON, DELTA, MECHANISM, CONFIDENCE, NEIGHBOURS],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_count_ci_udaf,
        cost: ci_cost::<CountParams>,
        noise: ci_noise::<CountParams>,
    },
    Aggregate {
        name: "dp_count_distinct_ci",
        summary: "dp_count_distinct's release with its confidence interval",
        data: &[DataArg {
            name: "unit",
            doc: "the table's privacy unit column",
        }],
        params: &[EPSILON, DELTA, CONFIDENCE, NEIGHBOURS],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_count_distinct_ci_udaf,
        cost: ci_cost::<CountDistinctParams>,
        noise: ci_noise::<CountDistinctParams>,
    },
    Aggregate {
        name: "dp_sum_ci",
        summary: "dp_sum's release with its confidence interval",
        data: &[VALUE],
        params: &[
            LOWER, UPPER, EPSILON, DELTA, MECHANISM, CONFIDENCE, NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_sum_ci_udaf,
        cost: ci_cost::<SumParams>,
        noise: ci_noise::<SumParams>,
    },
    Aggregate {
        name: "dp_mean_ci",
        summary: "dp_mean's release with its confidence interval",
        data: &[VALUE],
        params: &[
            LOWER, UPPER, EPSILON, DELTA, MECHANISM, CONFIDENCE, NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_mean_ci_udaf,
        cost: ci_cost::<MeanParams>,
        noise: ci_noise::<MeanParams>,
    },
    Aggregate {
        name: "dp_variance",
        summary: "noisy population variance of the values clamped to [lower, upper], within \
                  [0, (upper − lower)²/4]",
        data: &[VALUE],
        params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
        requirements: &[],
        replaces: &["var_pop", "var", "var_samp", "variance"],
        internal: false,
        udaf: dp_variance_udaf,
        cost: |_, p| no_data(VarianceParams::from_literals, VarianceParams::cost, p),
        noise: spec_noise::<VarianceParams>,
    },
    Aggregate {
        name: "dp_stddev",
        summary: "noisy population standard deviation of the values clamped to [lower, upper], \
                  within [0, (upper − lower)/2]",
        data: &[VALUE],
        params: &[LOWER, UPPER, EPSILON, DELTA, MECHANISM, NEIGHBOURS],
        requirements: &[],
        replaces: &["stddev_pop", "stddev", "stddev_samp"],
        internal: false,
        udaf: dp_stddev_udaf,
        cost: |_, p| no_data(StddevParams::from_literals, StddevParams::cost, p),
        noise: spec_noise::<StddevParams>,
    },
    Aggregate {
        name: "dp_variance_ci",
        summary: "dp_variance's release with its confidence interval (delta method)",
        data: &[VALUE],
        params: &[
            LOWER, UPPER, EPSILON, DELTA, MECHANISM, CONFIDENCE, NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_variance_ci_udaf,
        cost: ci_cost::<VarianceParams>,
        noise: ci_noise::<VarianceParams>,
    },
    Aggregate {
        name: "dp_stddev_ci",
        summary: "dp_stddev's release with its confidence interval (√ of the variance's)",
        data: &[VALUE],
        params: &[
            LOWER, UPPER, EPSILON, DELTA, MECHANISM, CONFIDENCE, NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_stddev_ci_udaf,
        cost: ci_cost::<StddevParams>,
        noise: ci_noise::<StddevParams>,
    },
    Aggregate {
        name: "dp_quantile",
        summary: "noisy q-quantile of the values clamped to [lower, upper] (exponential \
                  mechanism, pure ε-DP)",
        data: &[VALUE],
        params: &[
            LOWER,
            UPPER,
            number("q", Default::Required, "the quantile, in [0, 1]"),
            PURE_EPSILON,
            BINS,
            NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[
            "percentile_cont",
            "approx_percentile_cont",
            "approx_percentile_cont_with_weight",
        ],
        internal: false,
        udaf: dp_quantile_udaf,
        cost: |_, p| quantile_cost(QuantileKind::Quantile, p),
        noise: |p| quantile_noise(QuantileKind::Quantile, p),
    },
    Aggregate {
        name: "dp_median",
        summary: "noisy median of the values clamped to [lower, upper] (exponential mechanism, \
                  pure ε-DP)",
        data: &[VALUE],
        params: &[LOWER, UPPER, PURE_EPSILON, BINS, NEIGHBOURS],
        requirements: &[],
        replaces: &["median", "approx_median"],
        internal: false,
        udaf: dp_median_udaf,
        cost: |_, p| quantile_cost(QuantileKind::Median, p),
        noise: |p| quantile_noise(QuantileKind::Median, p),
    },
    Aggregate {
        name: "dp_quantiles",
        summary: "noisy quantiles (a list) of the values clamped to [lower, upper], ε/k each, \
                  sorted",
        data: &[VALUE],
        params: &[
            LOWER,
            UPPER,
            Param {
                name: "quantiles",
                kind: Kind::NumberList,
                default: Default::Required,
                doc: "a list of 1 to 100 quantiles in [0, 1], e.g. [0.25, 0.5, 0.75]",
            },
            PURE_EPSILON,
            BINS,
            NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_quantiles_udaf,
        cost: |_, p| quantile_cost(QuantileKind::Quantiles, p),
        noise: |p| quantile_noise(QuantileKind::Quantiles, p),
    },
    Aggregate {
        name: "dp_partition_select",
        summary: "internal: keeps a GROUP BY group only if its noisy row count passes a threshold",
        data: &[ROWS],
        params: &[EPSILON, DELTA, NEIGHBOURS],
        requirements: &[],
        replaces: &[],
        internal: true,
        udaf: dp_partition_select_udaf,
        cost: |_, p| {
            no_data(
                PartitionSelectParams::from_literals,
                PartitionSelectParams::cost,
                p,
            )
        },
        noise: spec_noise::<PartitionSelectParams>,
    },
    Aggregate {
        name: "dp_linreg_gd",
        summary: "a linear model fitted by DP gradient descent",
        data: MODEL_DATA,
        params: &[
            EPSILON,
            DELTA,
            number("iterations", Default::Number("100"), "gradient steps"),
            number(
                "clip",
                Default::Number("0.5"),
                "per-example gradient clipping norm",
            ),
            number("learning_rate", Default::Number("1"), "step size"),
            number("l2", Default::Number("0"), "ridge penalty"),
            Param {
                name: "fit_intercept",
                kind: Kind::Bool,
                default: Default::Bool(true),
                doc: "fit an intercept",
            },
            Param {
                name: "mechanism",
                kind: Kind::Text,
                default: Default::Text("gaussian"),
                doc: "'gaussian' or 'rgm'",
            },
            number(
                "feature_bound",
                Default::Number("1"),
                "'rgm': feature clipping",
            ),
            number("label_bound", Default::Number("1"), "'rgm': label clipping"),
            number(
                "min_rows",
                Default::Number("10000"),
                "'rgm': the smallest table size the calibration assumes",
            ),
            NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_linreg_gd_udaf,
        cost: dp_linreg_gd::linreg_cost,
        noise: dp_linreg_gd::linreg_noise,
    },
    Aggregate {
        name: "dp_logreg_agd",
        summary: "a logistic model fitted by DP-AGD (Lee and Kifer 2018)",
        data: MODEL_DATA,
        params: &[
            EPSILON,
            DELTA,
            number("clip_grad", Default::Number("3"), "gradient clipping norm"),
            number("clip_obj", Default::Number("3"), "objective clipping"),
            number(
                "splits",
                Default::Number("0"),
                "budget splits (iterations); 0: a function of ε and δ",
            ),
            number(
                "gamma",
                Default::Number("0.1"),
                "relative increase of the gradient's ρ after a rejected direction (step 0 selected)",
            ),
            number("l2", Default::Number("0.001"), "ridge penalty"),
            Param {
                name: "fit_intercept",
                kind: Kind::Bool,
                default: Default::Bool(true),
                doc: "fit an intercept",
            },
            number(
                "max_step",
                Default::Number("2"),
                "the largest step size candidate",
            ),
            NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: dp_logreg_agd_udaf,
        cost: |_, p| no_data(AgdParams::from_literals, AgdParams::cost, p),
        noise: super::dp_logreg_agd::agd_noise,
    },
    Aggregate {
        name: "dp_linreg_sgd",
        summary: "a linear model fitted by DP-SGD (Poisson sampling, or 'mf' correlated noise)",
        data: MODEL_DATA,
        params: SGD_PARAMS,
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: super::dp_models_sgd::dp_linreg_sgd_udaf,
        cost: |_, p| sgd_cost(SgdKind::Linear, p),
        noise: |p| sgd_noise(SgdKind::Linear, p),
    },
    Aggregate {
        name: "dp_logreg_sgd",
        summary: "a logistic model fitted by DP-SGD (Poisson sampling, or 'mf' correlated noise)",
        data: MODEL_DATA,
        params: SGD_PARAMS,
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: super::dp_models_sgd::dp_logreg_sgd_udaf,
        cost: |_, p| sgd_cost(SgdKind::Logistic, p),
        noise: |p| sgd_noise(SgdKind::Logistic, p),
    },
    Aggregate {
        name: "dp_mlp_sgd",
        summary: "a one-hidden-layer ReLU network fitted by DP-SGD",
        data: MODEL_DATA,
        params: &[
            EPSILON,
            DELTA,
            number("hidden", Default::Number("32"), "hidden ReLU units"),
            number(
                "classes",
                Default::Number("2"),
                "number of classes (labels 0 … classes − 1)",
            ),
            SGD_SAMPLE_RATE,
            SGD_STEPS,
            SGD_EPOCHS,
            SGD_CLIP,
            SGD_LEARNING_RATE,
            SGD_NOISE,
            NEIGHBOURS,
        ],
        requirements: &[],
        replaces: &[],
        internal: false,
        udaf: super::dp_models_sgd::dp_mlp_sgd_udaf,
        cost: |_, p| sgd_cost(SgdKind::Mlp, p),
        noise: |p| sgd_noise(SgdKind::Mlp, p),
    },
    Aggregate {
        name: "rgm_mean_by",
        summary: "per group of a public column, the mean with noise relative to it (RGM)",
        data: &[
            DataArg {
                name: "value",
                doc: "a bare column with a ratio bound declared by the data owner",
            },
            DataArg {
                name: "by",
                doc: "a bare public column",
            },
        ],
        params: &[
            number(
                "max_ratio",
                Default::Required,
                "K ≥ the declared bound: in each group max ≤ K × min",
            ),
            EPSILON,
            DELTA,
            number(
                "min_group_size",
                Default::Number("2"),
                "groups smaller than this are left out; σ is calibrated for this size",
            ),
            NEIGHBOURS,
        ],
        requirements: &[Requirement::PublicGroupSizes, Requirement::DeclaredRatio],
        replaces: &[],
        internal: false,
        udaf: rgm_mean_by_udaf,
        cost: |_, p| no_data(RgmMeanParams::from_literals, RgmMeanParams::cost, p),
        noise: super::rgm_mean_by::rgm_noise,
    },
];

/// The declaration of `name` (case-insensitive), if it is a dpfusion DP aggregate.
pub fn get(name: &str) -> Option<&'static Aggregate> {
    AGGREGATES
        .iter()
        .find(|a| a.name.eq_ignore_ascii_case(name))
}

/// The base function of a `_ci` variant (`dp_mean_ci` → `dp_mean`, [`super::interval`]); the
/// declaration of `name` itself otherwise. The guard reads how a call contributes (unit-level
/// tables) from the base function.
pub fn base_of(name: &str) -> Option<&'static Aggregate> {
    let a = get(name)?;
    Some(
        a.name
            .strip_suffix("_ci")
            .and_then(get)
            .filter(|b| b.params.iter().all(|p| a.position(p.name).is_some()))
            .unwrap_or(a),
    )
}

/// The DP aggregate that replaces the SQL aggregate `name` (e.g. `count` → `dp_count`).
pub fn replacing(name: &str) -> Option<&'static Aggregate> {
    AGGREGATES
        .iter()
        .find(|a| a.replaces.iter().any(|r| r.eq_ignore_ascii_case(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_match_the_parameter_structs() {
        use super::super::{CountParams, LinregParams, MeanParams, SumParams};
        let names = |a: &Aggregate| a.params.iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(names(get("dp_count").unwrap()), CountParams::NAMES);
        assert_eq!(names(get("dp_sum").unwrap()), SumParams::NAMES);
        assert_eq!(names(get("dp_mean").unwrap()), MeanParams::NAMES);
        assert_eq!(names(get("dp_variance").unwrap()), VarianceParams::NAMES);
        assert_eq!(names(get("dp_stddev").unwrap()), StddevParams::NAMES);
        for k in [
            QuantileKind::Quantile,
            QuantileKind::Median,
            QuantileKind::Quantiles,
        ] {
            assert_eq!(names(get(k.name()).unwrap()), k.names());
        }
        assert_eq!(names(get("dp_linreg_gd").unwrap()), LinregParams::NAMES);
        assert_eq!(names(get("dp_logreg_agd").unwrap()), AgdParams::NAMES);
        assert_eq!(names(get("rgm_mean_by").unwrap()), RgmMeanParams::NAMES);
        use super::super::SgdParams;
        assert_eq!(names(get("dp_logreg_sgd").unwrap()), SgdParams::NAMES);
        assert_eq!(names(get("dp_linreg_sgd").unwrap()), SgdParams::NAMES);
        assert_eq!(names(get("dp_mlp_sgd").unwrap()), SgdParams::MLP_NAMES);
        for a in AGGREGATES {
            assert_eq!((a.udaf)().name(), a.name);
            assert_eq!(a.params.last().map(|p| p.name), Some("neighbours"));
        }
        assert_eq!(replacing("AVG").unwrap().name, "dp_mean");
        assert_eq!(
            get("dp_sum").unwrap().usage(),
            "dp_sum(value, lower, upper, epsilon[, delta][, mechanism])"
        );
    }

    /// Every user-facing call describes its noise in EXPLAIN PRIVACY, from literals alone.
    #[test]
    fn every_aggregate_describes_its_noise() {
        use datafusion::arrow::array::{Float64Array, ListArray};
        use datafusion::arrow::datatypes::Float64Type;
        use std::sync::Arc;
        let f = |v: f64| ScalarValue::Float64(Some(v));
        let s = |v: &str| ScalarValue::Utf8(Some(v.into()));
        let qs = ScalarValue::List(Arc::new(
            ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(vec![
                Some(0.25),
                Some(0.75),
            ])]),
        ));
        let _ = Float64Array::from(vec![0.0]);
        let lits = |name: &str| -> Vec<ScalarValue> {
            match name {
                "dp_count" | "dp_count_ci" | "dp_partition_select" => vec![f(1.0), f(1e-6)],
                "dp_count_distinct" => vec![f(1.0), f(1e-6), s("units:2:1")],
                "dp_count_distinct_ci" => vec![f(1.0), f(1e-6), f(0.9), s("units:2:1")],
                "dp_quantile" => vec![f(0.0), f(100.0), f(0.5), f(1.0)],
                "dp_median" => vec![f(0.0), f(100.0), f(1.0)],
                "dp_quantiles" => vec![f(0.0), f(100.0), qs.clone(), f(1.0)],
                "dp_linreg_gd" | "dp_logreg_agd" | "dp_linreg_sgd" | "dp_logreg_sgd"
                | "dp_mlp_sgd" => vec![f(1.0), f(1e-6)],
                "rgm_mean_by" => vec![f(2.0), f(1.0), f(1e-6), f(1000.0), s("replace_public_n")],
                _ => vec![f(0.0), f(100.0), f(1.0), f(1e-6)],
            }
        };
        for a in AGGREGATES {
            let n = (a.noise)(&lits(a.name));
            assert!(
                n.as_ref().is_some_and(|n| !n.is_empty()),
                "{}: {n:?}",
                a.name
            );
        }
        let noise = |name: &str, l: Vec<ScalarValue>| (get(name).unwrap().noise)(&l).unwrap();
        // dp_quantiles: 1024 bins of width 100/1024, ε/2 each.
        assert_eq!(
            noise("dp_quantiles", lits("dp_quantiles")),
            "exponential mechanism over 1024 bins of width 0.09766, ε = 0.5 for each of 2 \
             quantiles (rank score, sensitivity 1)"
        );
        // dp_variance, add_remove: μ₁² = μ²/2 on the centred sum (sensitivity h = 50 in value
        // units), μ_c² = μ²/4 on the count (sensitivity 1): σ₁ = 50/(μ/√2), σ_c = 1/(μ/2), with
        // μ = gaussian_mu(1, 1e-6) (module docs), up to the grid's 2^-20 relative.
        let mu = crate::privacy::gaussian_mu(1.0, 1e-6).unwrap();
        let text = noise("dp_variance", lits("dp_variance"));
        let short = crate::mechanisms::noise::short;
        assert!(
            text.contains(&format!("σ = {} on the count", short(2.0 / mu))),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "σ = {} on the sum of (value",
                short(50.0 * 2f64.sqrt() / mu)
            )),
            "{text}"
        );
        // A `_ci` call describes its base call's noise.
        assert_eq!(
            noise("dp_mean_ci", lits("dp_mean_ci")),
            noise("dp_mean", lits("dp_mean"))
        );
    }

    #[test]
    fn every_aggregate_is_documented() {
        let readme = include_str!("../../../README.md");
        let sql = include_str!("../../../docs/SQL.md");
        for a in AGGREGATES.iter().filter(|a| !a.internal) {
            assert!(readme.contains(a.name), "README.md lacks {}", a.name);
            assert!(sql.contains(a.name), "docs/SQL.md lacks {}", a.name);
        }
    }
}
