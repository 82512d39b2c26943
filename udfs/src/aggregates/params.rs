//! Reading the literal parameters of the DP aggregates ([`Params`]: by name, through the
//! function's declaration), and the noise kind ([`Mechanism`]). Each function's parameter struct
//! lives in its own file (e.g. `dp_count::CountParams`), used both by the accountant (cost,
//! before any row is read) and by the accumulators (execution); the neighbour relation is
//! [`crate::privacy::Neighbours`] (re-exported here).
//!
//! The parameters are the arguments after the data arguments, at the positions their
//! declaration lists them in; [`Params`] maps each name to its position, so no function repeats
//! the list or an index. Trailing optional parameters may be missing: `delta` then defaults to [`DEFAULT_DELTA`] and
//! `neighbours` to `'add_remove'`. The session always passes every parameter (it resolves named
//! arguments and the session's default δ itself); the defaults matter only on a plain DataFusion
//! context.
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;

use super::declaration::Aggregate;
use crate::privacy::error::{check_delta, check_epsilon};
use crate::privacy::{Event, PrivacyError, gaussian_mu};

/// The per-call `delta` when the call leaves it out on a plain DataFusion context. (Inside a
/// dpfusion session the session setting `dpfusion.default_delta` is filled in instead.)
pub const DEFAULT_DELTA: f64 = 1e-7;

/// The noise of `dp_count`, `dp_sum` and `dp_mean` (`mechanism => 'gaussian' | 'laplace'`).
///
/// `'gaussian'` (the default): (ε, δ)-DP through one μ-GDP release; its noise composes well over
/// many releases (privacy loss grows with √k). `'laplace'`: pure ε-DP (δ = 0) with the exact
/// discrete Laplace; for a few releases at small ε its noise is smaller (Laplace's standard
/// deviation √2·Δ₁/ε against the Gaussian's Δ₂·√(2 ln(1.25/δ))/ε-order σ). See
/// Each function calibrates both kinds side by side in its own file and releases through one
/// [`crate::mechanisms::Noise`].
///
/// # When to choose it
/// Laplace noise has standard deviation √2·Δ₁/ε; the Gaussian's is about Δ₂·√(2 ln(1.25/δ))/ε
/// for one release, but Gaussian releases compose with a privacy loss growing as √k over k
/// releases, Laplace's as k. So: a few releases at a small ε → Laplace (e.g. one count at ε = 0.1,
/// δ = 1e-7: Laplace sd 14, Gaussian σ ≈ 47); many releases on one budget → Gaussian.
///
///
/// # L1 sensitivities (derived here) and the scale b = (Δ₁ + slack·g)/ε
/// The discrete Laplace of scale b on the grid g is ε-DP for any vector of per-group statistics
/// whose L1 change (after rounding each coordinate to g) is at most b·ε (independent noises:
/// log-likelihood ratios add over coordinates). One changed row (or unit) changes:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mechanism {
    #[default]
    Gaussian,
    Laplace,
}

impl Mechanism {
    pub const ACCEPTED: &'static str = "'gaussian' (the default) or 'laplace'";

    /// What a call of this noise kind at (ε, δ) costs: one μ-GDP release, μ = gaussian_mu(ε, δ)
    /// (Gaussian; a call splitting μ over several releases has μ_1² + … ≤ μ²), or pure ε-DP
    /// (Laplace; a call splitting ε has ε_1 + … ≤ ε): [`gaussian_cost`], [`laplace_cost`].
    pub fn cost(self, epsilon: f64, delta: f64) -> Result<Vec<Event>, PrivacyError> {
        match self {
            Mechanism::Gaussian => gaussian_cost(epsilon, delta),
            Mechanism::Laplace => Ok(laplace_cost(epsilon)),
        }
    }
}

/// The cost of a Laplace call: pure ε-DP, charged as `Event::PureDp { ε }` (Bun and Steinke
/// 2016, Prop. 1.4: RDP ≤ min(ε, αε²/2)), valid for any ε-DP mechanism. Not `Event::Laplace`:
/// its curve is Mironov's for the continuous Laplace, and the discrete Laplace released here
/// (sensitivity a whole number of grid steps) can exceed it at some orders (with a sensitivity of
/// one step its privacy loss is ±ε only, randomized response's); under the zcdp filter both
/// charge ε²/2.
fn laplace_cost(epsilon: f64) -> Vec<Event> {
    vec![Event::PureDp { epsilon }]
}

pub use crate::privacy::neighbours::{Neighbours, sqrt_up};

/// The two-group factor of `replace_private_keys`: √2 as an `f64`, 1.4142135623730951, which is
/// above the real √2 = 1.41421356237309504880… (so calibrations that multiply by it round
/// outward; checked in the tests).
pub const SQRT_2_UP: f64 = std::f64::consts::SQRT_2;

/// Builds a call's release at its `epsilon` (through `build`, the same constructor the planner's
/// `finaliser` and the accountant's `cost` use). When that fails because the calibrated noise
/// cannot be represented (an `Infeasible` error from the mechanism: σ above 2^1000, below
/// 2^−990, or beyond the sampler's grid), the error names the argument to change and the range
/// that works, found by trying other epsilons with the same constructor (the result is
/// monotone in ε: a larger ε means a larger μ and a smaller σ). The suggested bound is one at
/// which `build` succeeds. `scale` names the arguments that set the sensitivity and their values
/// (e.g. ("upper", "1e308 (lower -1e308)")), blamed when no epsilon works.
pub(crate) fn representable<T>(
    epsilon: f64,
    scale: (&str, &str),
    build: impl Fn(f64) -> Result<T, PrivacyError>,
) -> Result<T, PrivacyError> {
    let why = match build(epsilon) {
        Err(PrivacyError::Infeasible(why)) => why,
        other => return other,
    };
    let works = |e: f64| build(e).is_ok();
    // Bisection in log space between a failing and a working epsilon; returns a working one.
    let bisect = |mut bad: f64, mut good: f64| {
        for _ in 0..80 {
            let mid = (bad * good).sqrt();
            if !(mid.is_finite()) || mid == bad || mid == good {
                break;
            }
            if works(mid) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        good
    };
    let max = crate::privacy::calibrate::MAX_EPSILON;
    let mut e = epsilon;
    while e < max {
        let next = (e * 10.0).min(max);
        if works(next) {
            let good = bisect(e, next);
            return Err(PrivacyError::invalid(
                "epsilon",
                epsilon,
                &format!("epsilon ≥ {good:.6e} for this call ({why} at epsilon = {epsilon})"),
            ));
        }
        e = next;
    }
    let mut e = epsilon;
    while e > 1e-300 {
        let next = e / 10.0;
        if works(next) {
            let good = bisect(e, next);
            return Err(PrivacyError::invalid(
                "epsilon",
                epsilon,
                &format!("epsilon ≤ {good:.6e} for this call ({why} at epsilon = {epsilon})"),
            ));
        }
        e = next;
    }
    Err(PrivacyError::invalid(
        scale.0,
        scale.1,
        &format!(
            "a value whose noise is representable at some epsilon ≤ {max:e}: {why} at epsilon = {epsilon}"
        ),
    ))
}

/// The literal parameters of one call (the arguments after its data arguments), read by name
/// through the function's declaration ([`Aggregate::params`]): `Params::new(&DP_MEAN, args)?`,
/// then `p.bounds()?`, `p.epsilon()?`, `p.number("bins")?`. The position of a name is the
/// declaration's ([`Aggregate::position`]), so the reading cannot drift from the signature, the
/// named arguments and the docs. Reading a name the declaration does not have is a programming
/// error (a panic), caught by the test `every_declared_parameter_is_read`, which also checks
/// that every declared parameter is read.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    declaration: &'static Aggregate,
    args: &'a [ScalarValue],
}

impl<'a> Params<'a> {
    /// Fails when more parameters are given than `declaration` has.
    pub fn new(
        declaration: &'static Aggregate,
        args: &'a [ScalarValue],
    ) -> Result<Self, PrivacyError> {
        let names: Vec<&str> = declaration.params.iter().map(|p| p.name).collect();
        if args.len() > names.len() {
            let data = match declaration.data {
                [_] => "the data column".to_string(),
                data => data
                    .iter()
                    .map(|d| d.name)
                    .collect::<Vec<_>>()
                    .join(" and "),
            };
            return Err(PrivacyError::invalid(
                "arguments",
                format!("{} parameters after {data}", args.len()),
                &format!("at most {}: {}", names.len(), names.join(", ")),
            ));
        }
        Ok(Self { declaration, args })
    }

    /// Whether the function declares parameter `name`.
    pub fn declares(&self, name: &str) -> bool {
        self.declaration.position(name).is_some()
    }

    /// The position of `name`; a name the declaration does not have is a programming error.
    fn at(&self, name: &'static str) -> usize {
        #[cfg(test)]
        read_log::record(self.declaration.name, name);
        self.declaration
            .position(name)
            .unwrap_or_else(|| panic!("{} declares no parameter `{name}`", self.declaration.name))
    }

    /// The literal of `name` as given (`None` when absent).
    pub fn value(&self, name: &'static str) -> Option<&'a ScalarValue> {
        self.args.get(self.at(name))
    }

    /// A numeric literal ([`number`]).
    pub fn number(&self, name: &'static str) -> Result<Option<f64>, PrivacyError> {
        number(self.args, self.at(name), name)
    }

    /// A required numeric literal; missing: an error naming it and what is `expected`.
    pub fn required(&self, name: &'static str, expected: &str) -> Result<f64, PrivacyError> {
        required(self.args, self.at(name), name, expected)
    }

    /// A string literal ([`text`]).
    pub fn text(
        &self,
        name: &'static str,
        accepted: &str,
    ) -> Result<Option<&'a str>, PrivacyError> {
        text(self.args, self.at(name), name, accepted)
    }

    /// A boolean literal ([`boolean`]).
    pub fn boolean(&self, name: &'static str) -> Result<Option<bool>, PrivacyError> {
        boolean(self.args, self.at(name), name)
    }

    /// `epsilon`: finite, > 0, required.
    pub fn epsilon(&self) -> Result<f64, PrivacyError> {
        check_epsilon("epsilon", self.required("epsilon", "a finite number > 0")?)
    }

    /// `delta`, [`DEFAULT_DELTA`] when absent.
    pub fn delta(&self) -> Result<f64, PrivacyError> {
        check_delta("delta", self.number("delta")?.unwrap_or(DEFAULT_DELTA))
    }

    /// `neighbours`, `'add_remove'` when absent.
    pub fn neighbours(&self) -> Result<Neighbours, PrivacyError> {
        match self.value("neighbours") {
            None => Ok(Neighbours::default()),
            Some(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::LargeUtf8(Some(s))
                | ScalarValue::Utf8View(Some(s)),
            ) => Neighbours::parse(s),
            Some(v) => Err(PrivacyError::invalid(
                "neighbours",
                format!("{v} ({})", v.data_type()),
                Neighbours::ACCEPTED,
            )),
        }
    }

    /// `mechanism` ([`Mechanism`]); [`Mechanism::Gaussian`] when absent, and for a function that
    /// declares no `mechanism` (`dp_count_distinct`, `dp_variance` …: Gaussian only).
    pub fn mechanism(&self) -> Result<Mechanism, PrivacyError> {
        if !self.declares("mechanism") {
            return Ok(Mechanism::Gaussian);
        }
        match self.text("mechanism", Mechanism::ACCEPTED)? {
            None => Ok(Mechanism::Gaussian),
            Some(s) if s.eq_ignore_ascii_case("gaussian") => Ok(Mechanism::Gaussian),
            Some(s) if s.eq_ignore_ascii_case("laplace") => Ok(Mechanism::Laplace),
            Some(s) => Err(PrivacyError::invalid(
                "mechanism",
                format!("'{s}'"),
                Mechanism::ACCEPTED,
            )),
        }
    }

    /// `lower` and `upper`: both finite, lower ≤ upper.
    pub fn bounds(&self) -> Result<(f64, f64), PrivacyError> {
        let lower = finite("lower", self.required("lower", "a finite number")?)?;
        let upper = finite("upper", self.required("upper", "a finite number")?)?;
        if lower > upper {
            return Err(PrivacyError::invalid(
                "lower",
                format!("{lower} (upper is {upper})"),
                "a finite number ≤ upper",
            ));
        }
        Ok((lower, upper))
    }
}

/// A numeric literal as f64 (`None` when the argument is absent). NULL or a non-numeric type is
/// an error naming the argument.
pub(crate) fn number(
    args: &[ScalarValue],
    i: usize,
    name: &str,
) -> Result<Option<f64>, PrivacyError> {
    let Some(v) = args.get(i) else {
        return Ok(None);
    };
    let bad =
        || PrivacyError::invalid(name, format!("{v} ({})", v.data_type()), "a number literal");
    if v.is_null() || !v.data_type().is_numeric() {
        return Err(bad());
    }
    match v.cast_to(&DataType::Float64) {
        Ok(ScalarValue::Float64(Some(x))) => Ok(Some(x)),
        _ => Err(bad()),
    }
}

/// A string literal (`None` when the argument is absent); anything else is an error naming the
/// argument and the `accepted` values.
pub(crate) fn text<'a>(
    args: &'a [ScalarValue],
    i: usize,
    name: &str,
    accepted: &str,
) -> Result<Option<&'a str>, PrivacyError> {
    match args.get(i) {
        None => Ok(None),
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Ok(Some(s.as_str())),
        Some(v) => Err(PrivacyError::invalid(
            name,
            format!("{v} ({})", v.data_type()),
            accepted,
        )),
    }
}

/// A boolean literal, or the numbers 0 and 1 (`None` when the argument is absent); anything else
/// (NULL included) is an error naming the argument.
pub(crate) fn boolean(
    args: &[ScalarValue],
    i: usize,
    name: &str,
) -> Result<Option<bool>, PrivacyError> {
    let Some(v) = args.get(i) else {
        return Ok(None);
    };
    let bad = || {
        PrivacyError::invalid(
            name,
            format!("{v} ({})", v.data_type()),
            "true or false (or 1 or 0)",
        )
    };
    match v {
        ScalarValue::Boolean(Some(b)) => Ok(Some(*b)),
        _ => match number(args, i, name) {
            Ok(Some(x)) if x == 0.0 || x == 1.0 => Ok(Some(x == 1.0)),
            _ => Err(bad()),
        },
    }
}

fn required(
    args: &[ScalarValue],
    i: usize,
    name: &str,
    expected: &str,
) -> Result<f64, PrivacyError> {
    number(args, i, name)?.ok_or_else(|| PrivacyError::invalid(name, "nothing (missing)", expected))
}

fn finite(name: &str, v: f64) -> Result<f64, PrivacyError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(PrivacyError::invalid(name, v, "a finite number"))
    }
}

/// One Gaussian-DP release of the whole call: μ = gaussian_mu(ε, δ).
fn gaussian_cost(epsilon: f64, delta: f64) -> Result<Vec<Event>, PrivacyError> {
    Ok(vec![Event::Gaussian {
        mu: gaussian_mu(epsilon, delta)?,
    }])
}

/// A parameter error as a DataFusion planning error that names the function.
pub(crate) fn plan_error(function: &str, e: PrivacyError) -> DataFusionError {
    DataFusionError::Plan(format!("{function}: {e}"))
}

/// The literal parameters of a call of `declaration` on the physical side: the expressions after
/// its data arguments, each a [`Literal`] (or a constant expression, evaluated on an empty
/// batch). Anything else is a planning error "`upper` of dp_mean must be a literal".
pub(crate) fn literal_params(
    declaration: &Aggregate,
    exprs: &[Arc<dyn PhysicalExpr>],
) -> Result<Vec<ScalarValue>> {
    let function = declaration.name;
    let params = exprs.get(declaration.data.len()..).unwrap_or_default();
    params
        .iter()
        .enumerate()
        .map(|(i, expr)| {
            let name = declaration.params.get(i).map_or("parameter", |p| p.name);
            if let Some(lit) = expr.downcast_ref::<Literal>() {
                return Ok(lit.value().clone());
            }
            let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
            match expr.evaluate(&empty) {
                Ok(ColumnarValue::Scalar(s)) => Ok(s),
                _ => Err(DataFusionError::Plan(format!(
                    "`{name}` of {function} must be a literal, got {expr}"
                ))),
            }
        })
        .collect()
}

/// Test only: which parameters each function's reading asked for by name (the test
/// `every_declared_parameter_is_read`).
#[cfg(test)]
pub(crate) mod read_log {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static READ: RefCell<BTreeSet<(&'static str, &'static str)>> =
            const { RefCell::new(BTreeSet::new()) };
    }

    pub(crate) fn record(function: &'static str, param: &'static str) {
        READ.with(|r| r.borrow_mut().insert((function, param)));
    }

    /// Whether `function` read `param` on this thread.
    pub(crate) fn was_read(function: &str, param: &str) -> bool {
        READ.with(|r| {
            r.borrow()
                .iter()
                .any(|(f, p)| *f == function && *p == param)
        })
    }
}
