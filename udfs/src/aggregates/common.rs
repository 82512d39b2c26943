//! Signatures, documentation section and accumulator plumbing shared by the DP aggregates.
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::DocSection;
use datafusion::logical_expr::function::AccumulatorArgs;

use super::accumulator::Finalise;
use super::params::{Neighbours, literal_params};

/// The documentation section of every dpfusion DP aggregate.
pub(crate) const DOC_SECTION_DP: DocSection = DocSection {
    include: true,
    label: "Differential privacy",
    description: Some(
        "Aggregates that release noisy statistics with a differential-privacy guarantee. Every \
         argument after the data column must be a literal; each call costs its (epsilon, delta).",
    ),
};

/// What the data column accepts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DataArg {
    /// Integers, floats and decimals, coerced to Float64.
    Numeric,
    /// Any type (only NULL-ness is read).
    Any,
}

/// Integers, floats, decimals (also dictionary-encoded), and NULL: what a numeric argument accepts.
pub(crate) fn is_number(t: &DataType) -> bool {
    match t {
        DataType::Null => true,
        DataType::Dictionary(_, v) => v.is_numeric(),
        t => t.is_numeric(),
    }
}

/// The argument types of a call: the data column (numeric → Float64, or any type), then
/// `required ..= params.len()` parameters (`neighbours` a string, the others numbers → Float64).
pub(crate) fn coerce_args(
    function: &str,
    data: DataArg,
    params: &[&str],
    required: usize,
    arg_types: &[DataType],
) -> Result<Vec<DataType>> {
    let n = arg_types.len();
    if n < 1 + required || n > 1 + params.len() {
        let optional = params[required..]
            .iter()
            .map(|p| format!("[, {p}]"))
            .collect::<String>();
        return plan_err!(
            "{function} takes {} to {} arguments: {function}(value, {}{optional}), got {n}",
            1 + required,
            1 + params.len(),
            params[..required].join(", ")
        );
    }
    let value = match data {
        DataArg::Any => arg_types[0].clone(),
        DataArg::Numeric if is_number(&arg_types[0]) => DataType::Float64,
        DataArg::Numeric => {
            return plan_err!(
                "{function}: `value` must be numeric (integer, float or decimal; cast to Float64), got {}",
                arg_types[0]
            );
        }
    };
    let mut out = vec![value];
    for (name, t) in params.iter().zip(&arg_types[1..]) {
        out.push(coerce_param(function, name, t)?);
    }
    Ok(out)
}

/// The type of a literal parameter `name` of `function`: `neighbours` and `mechanism` strings,
/// `fit_intercept` a boolean (or a number, 0 or 1), every other parameter a number (→ Float64).
/// A wrong type is a planning error naming the argument.
pub(crate) fn coerce_param(function: &str, name: &str, t: &DataType) -> Result<DataType> {
    Ok(match name {
        "neighbours" | "mechanism" | "noise" => match t {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => t.clone(),
            DataType::Null => DataType::Utf8,
            t if name == "neighbours" => {
                return plan_err!(
                    "{function}: `neighbours` must be a string literal ({}), got {t}",
                    Neighbours::ACCEPTED
                );
            }
            t => return plan_err!("{function}: `{name}` must be a string literal, got {t}"),
        },
        "quantiles" => match t {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                if is_number(f.data_type()) =>
            {
                t.clone()
            }
            t => {
                return plan_err!(
                    "{function}: `quantiles` must be a list of numbers in [0, 1] \
                     ([0.25, 0.5, 0.75]), got {t}"
                );
            }
        },
        "fit_intercept" => match t {
            DataType::Boolean | DataType::Null => DataType::Boolean,
            t if is_number(t) => DataType::Float64,
            t => return plan_err!("{function}: `fit_intercept` must be true or false, got {t}"),
        },
        _ if is_number(t) => DataType::Float64,
        _ => return plan_err!("{function}: `{name}` must be a number literal, got {t}"),
    })
}

/// The type of a model's `features` argument: a list of numbers (`[x1, x2]`, `make_array(...)`),
/// kept as it is (the row buffer reads every list layout).
pub(crate) fn coerce_features(function: &str, t: &DataType) -> Result<DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
            if is_number(f.data_type()) =>
        {
            Ok(t.clone())
        }
        t => plan_err!(
            "{function}: `features` must be a list of numbers ([x1, x2] or make_array(x1, x2)), \
             got {t}"
        ),
    }
}

/// Validates the call shape and reads its literal parameters.
pub(crate) fn call_literals(
    function: &str,
    names: &[&str],
    args: &AccumulatorArgs,
) -> Result<Vec<datafusion::common::ScalarValue>> {
    if args.is_distinct {
        return plan_err!("{function} does not support DISTINCT");
    }
    literal_params(function, names, args.exprs, 1)
}

/// Shorthand for the boxed finaliser type.
pub(crate) type Fin = Arc<dyn Finalise>;
