//! The declaration of a DP aggregate ([`Aggregate`]): its name, data arguments, parameters
//! (name, kind, default, doc), requirements, the SQL aggregates it replaces, its UDAF, its cost and
//! its noise. Each function's file declares itself with one `pub const` of this type; the registry
//! ([`super::registry::AGGREGATES`]) lists them. The parameters shared by several functions are
//! here (`EPSILON`, `DELTA`, `MECHANISM`, `CONFIDENCE`, `NEIGHBOURS`, …).
//!
//! Nothing here imports a function's file: the arrows run from the functions to this module.
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{AggregateUDF, Expr};

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

/// How one privacy unit contributes to a call on a unit-level table (`units:K:C` neighbours):
/// what the guard bounds before the aggregate (the root crate's src/guard/units.rs reads it;
/// docs/PRIVACY.md, "Privacy units"). Every unit reaches at most K groups (L0); within a group:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitRule {
    /// At most C rows of each (unit, group) (`dp_count`, `dp_mean`, …): calibrated for
    /// `units:K:C`.
    Rows,
    /// One value per (unit, group), the unit's total, clamped by the call (`dp_sum`):
    /// `units:K:1`.
    Total,
    /// Once per (unit, group); the data argument must be the unit column itself
    /// (`dp_count_distinct`, partition selection): `units:K:1`.
    Once,
    /// Every row, with the unit key passed after the parameters; the call clips each unit's
    /// summed gradient (the models): `units:K:1`.
    PerUnit,
    /// Refused on a unit-level table: "`name` needs `needs`, but table … protects privacy units
    /// (column …): `why`. `instead`".
    Refused {
        needs: &'static str,
        why: &'static str,
        instead: &'static str,
    },
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
    /// In positional order; the parameter struct's `from_literals` reads them by name through
    /// this list ([`super::params::Params`]), and the coercion types them by [`Kind`].
    pub params: &'static [Param],
    pub requirements: &'static [Requirement],
    /// How a unit contributes on a unit-level table (the guard's bounding).
    pub units: UnitRule,
    /// Non-private SQL aggregates this one replaces (for the guard's advice).
    pub replaces: &'static [&'static str],
    /// Internal (inserted by the guard; not for users).
    pub internal: bool,
    pub udaf: fn() -> AggregateUDF,
    /// INSECURE, for reproducible tests only: the UDAF drawing from a generator seeded with the
    /// argument ([`super::all_udafs_insecure_seeded`]).
    pub seeded: fn(u64) -> AggregateUDF,
    /// The privacy events of a call, from the shape of its data arguments as written (never
    /// data) and its literal parameters in declared order. Never reads data.
    pub cost: CostFn,
    /// The noise a call's release gets, from its literal parameters (EXPLAIN PRIVACY), when the
    /// function says (`None`: not described).
    pub noise: NoiseFn,
}

/// What noise a call's release gets, from its literal parameters in positional order.
pub type NoiseFn = fn(&[ScalarValue]) -> Option<String>;

impl Aggregate {
    /// The parameters users may write (the hidden neighbour mode left out).
    pub fn user_params(&self) -> impl Iterator<Item = &'static Param> {
        self.params.iter().filter(|p| p.default != Default::Hidden)
    }

    /// The positional index of parameter `name` among the parameters (after the data).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }

    /// The argument index of a unit-level model call's privacy-unit key: after the data
    /// arguments and every parameter ([`super::registry`], module docs).
    pub const fn unit_key_index(&self) -> usize {
        self.data.len() + self.params.len()
    }

    /// The names of the data arguments and then of the parameters, as the signature lists them.
    pub fn argument_names(&self) -> Vec<&'static str> {
        let data = self.data.iter().map(|d| d.name);
        data.chain(self.params.iter().map(|p| p.name)).collect()
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

pub const fn number(name: &'static str, default: Default, doc: &'static str) -> Param {
    Param {
        name,
        kind: Kind::Number,
        default,
        doc,
    }
}

pub const EPSILON: Param = number(
    "epsilon",
    Default::Required,
    "ε > 0, finite: the call is (ε, δ)-DP on its own",
);
pub const PURE_EPSILON: Param = number(
    "epsilon",
    Default::Required,
    "ε > 0, finite: the call is ε-DP (pure, δ = 0) on its own",
);
pub const DELTA: Param = number(
    "delta",
    Default::SessionDelta,
    "δ in (0, 1); defaults to the session's dpfusion.default_delta (1e-7)",
);
pub const MECHANISM: Param = Param {
    name: "mechanism",
    kind: Kind::Text,
    default: Default::Text("gaussian"),
    doc: "'gaussian' ((ε, δ)-DP, the default) or 'laplace' (pure ε-DP: δ is not used)",
};
/// The `_ci` variants' interval level ([`super::interval`]), just before `neighbours`.
pub const CONFIDENCE: Param = number(
    "confidence",
    Default::Number("0.95"),
    "the interval's coverage, in (0, 1); the interval is post-processing: no extra charge",
);
/// The quantiles' histogram resolution ([`super::dp_quantile`]), just before `neighbours`.
pub const BINS: Param = number(
    "bins",
    Default::Number("1024"),
    "the histogram's bins, a power of two in [2, 8192]: the resolution is (upper − lower)/bins; \
     public, no extra cost; the state is 8·bins bytes per group and each release O(bins)",
);
pub const NEIGHBOURS: Param = Param {
    name: "neighbours",
    kind: Kind::Text,
    default: Default::Hidden,
    doc: "the neighbour mode, set by the session from the table and the plan",
};
pub const LOWER: Param = number(
    "lower",
    Default::Required,
    "finite; values are clamped to [lower, upper]",
);
pub const UPPER: Param = number("upper", Default::Required, "finite, ≥ lower");

pub const SGD_SAMPLE_RATE: Param = number(
    "sample_rate",
    Default::Number("0"),
    "Poisson sample rate q per step; 0: 0.01 ('independent'; 'mf' does not sample)",
);
pub const SGD_STEPS: Param = number(
    "steps",
    Default::Number("0"),
    "steps T; 0: 1000 ('independent') or 100 ('mf')",
);
pub const SGD_EPOCHS: Param = number(
    "epochs",
    Default::Number("0"),
    "instead of steps: T = ceil(epochs/q); 0: unset",
);
pub const SGD_CLIP: Param = number(
    "clip",
    Default::Number("1"),
    "L2 bound of each example's whole gradient",
);
pub const SGD_LEARNING_RATE: Param = number(
    "learning_rate",
    Default::Number("0.5"),
    "step size on the mean clipped gradient",
);
pub const SGD_NOISE: Param = Param {
    name: "noise",
    kind: Kind::Text,
    default: Default::Text("independent"),
    doc: "'independent' (Poisson DP-SGD) or 'mf' (one pass, correlated noise)",
};
/// The parameters of `dp_linreg_sgd` and `dp_logreg_sgd`.
pub const SGD_PARAMS: &[Param] = &[
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
pub const VALUE: DataArg = DataArg {
    name: "value",
    doc: "the column or row expression aggregated",
};
pub const COUNTED: DataArg = DataArg {
    name: "value",
    doc: "only its NULL-ness (and NaN) is read",
};
pub const ROWS: DataArg = DataArg {
    name: "value",
    doc: "every row of the group counts, NULLs included",
};
pub const MODEL_DATA: &[DataArg] = &[
    DataArg {
        name: "label",
        doc: "the label column",
    },
    DataArg {
        name: "features",
        doc: "a list of numbers: [x1, x2] or make_array(x1, x2)",
    },
];

pub(crate) fn no_data<T>(
    f: fn(&[ScalarValue]) -> Result<T, PrivacyError>,
    cost: fn(&T) -> Result<Vec<Event>, PrivacyError>,
    params: &[ScalarValue],
) -> Result<Vec<Event>, PrivacyError> {
    f(params).and_then(|p| cost(&p))
}

/// The parameters of a `_ci` variant, generated from its base function's ([`super::interval`]):
/// the base parameters before the hidden `neighbours`, then [`CONFIDENCE`], then `neighbours`.
/// `M` must be the base's count plus one (checked at compile time).
pub const fn with_confidence<const M: usize>(base: &[Param]) -> [Param; M] {
    assert!(
        base.len() + 1 == M,
        "a _ci variant has one parameter more than its base"
    );
    let mut out = [CONFIDENCE; M];
    let mut i = 0;
    while i + 1 < base.len() {
        out[i] = base[i];
        i += 1;
    }
    out[M - 1] = base[base.len() - 1];
    out
}
