//! Signatures, documentation section and accumulator plumbing shared by the DP aggregates.
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::DocSection;
use datafusion::logical_expr::function::AccumulatorArgs;

use super::accumulator::Finalise;
use super::declaration::{Aggregate, Default as ParamDefault, Kind, Param};
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

/// The argument types of a call of `declaration`: its data column (numeric → Float64, or any
/// type), then its declared parameters, each by its [`Kind`] ([`coerce_param`]); between the
/// required parameters and all of them may be given.
pub(crate) fn coerce_args(
    declaration: &Aggregate,
    data: DataArg,
    arg_types: &[DataType],
) -> Result<Vec<DataType>> {
    let function = declaration.name;
    let params = declaration.params;
    let required = params
        .iter()
        .filter(|p| p.default == ParamDefault::Required)
        .count();
    let n = arg_types.len();
    if n < 1 + required || n > 1 + params.len() {
        let optional = params[required..]
            .iter()
            .map(|p| format!("[, {}]", p.name))
            .collect::<String>();
        let names = params[..required]
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ");
        return plan_err!(
            "{function} takes {} to {} arguments: {function}(value, {names}{optional}), got {n}",
            1 + required,
            1 + params.len()
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
    for (p, t) in params.iter().zip(&arg_types[1..]) {
        out.push(coerce_param(function, p, t)?);
    }
    Ok(out)
}

/// The type of the literal parameter `p` of `function`, by its [`Kind`]: a string (`Text`), a
/// boolean or a number 0/1 (`Bool`), a list of numbers (`NumberList`), a number → Float64
/// (`Number`). A wrong type is a planning error naming the parameter.
pub(crate) fn coerce_param(function: &str, p: &Param, t: &DataType) -> Result<DataType> {
    let name = p.name;
    Ok(match p.kind {
        Kind::Text => match t {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => t.clone(),
            DataType::Null => DataType::Utf8,
            // The hidden parameter is the neighbour mode, set by the session.
            t if p.default == ParamDefault::Hidden => {
                return plan_err!(
                    "{function}: `{name}` must be a string literal ({}), got {t}",
                    Neighbours::ACCEPTED
                );
            }
            t => return plan_err!("{function}: `{name}` must be a string literal, got {t}"),
        },
        Kind::NumberList => match t {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                if is_number(f.data_type()) =>
            {
                t.clone()
            }
            t => {
                return plan_err!(
                    "{function}: `{name}` must be a list of numbers ({}), got {t}",
                    p.doc
                );
            }
        },
        Kind::Bool => match t {
            DataType::Boolean | DataType::Null => DataType::Boolean,
            t if is_number(t) => DataType::Float64,
            t => return plan_err!("{function}: `{name}` must be true or false, got {t}"),
        },
        // Integer and Float64 literals keep their type: no CAST for the analyzer to add and the
        // simplifier to fold (about 0.01 ms of planning each: `cargo bench --bench speed`,
        // "Fixed cost per query"; issue 32). The parameter is read as f64 either way
        // (`params::number`, the guard's `as_f64`: the same conversion as the cast).
        Kind::Number if t.is_integer() || matches!(t, DataType::Float64) => t.clone(),
        Kind::Number if is_number(t) => DataType::Float64,
        Kind::Number => return plan_err!("{function}: `{name}` must be a number literal, got {t}"),
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

/// A model aggregate (its rows buffered in a [`crate::optim::rows::RowBuffer`]): its
/// accumulator, either reading the call's arguments as written (`spread` = `None`, what
/// `accumulator` builds) or, `spread` = `Some(d)`, with the call's `make_array(x1, …, xd)`
/// features spread into d columns by the physical plan ([`super::bind`]): `args` are the
/// call's own (parameters read from them as always), and the accumulator's input is
/// `[label, x1, …, xd, unit key?]`.
pub(crate) trait ModelUdaf {
    fn model_accumulator(
        &self,
        args: AccumulatorArgs,
        spread: Option<usize>,
    ) -> Result<Box<dyn datafusion::logical_expr::Accumulator>>;
}

/// Validates the call shape and reads the literal parameters of a call of `declaration`.
pub(crate) fn call_literals(
    declaration: &Aggregate,
    args: &AccumulatorArgs,
) -> Result<Vec<datafusion::common::ScalarValue>> {
    if args.is_distinct {
        return plan_err!("{} does not support DISTINCT", declaration.name);
    }
    literal_params(declaration, args.exprs)
}

/// Shorthand for the boxed finaliser type.
pub(crate) type Fin = Arc<dyn Finalise>;
