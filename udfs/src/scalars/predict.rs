//! Prediction with released models: `linreg_predict(model, features)` and
//! `logreg_predict_proba(model, features)`.
//!
//! Both are post-processing of a DP release (the model struct, see [`crate::optim::model`]) and
//! cost nothing. `model` is a model struct (a column of a table made with `CREATE TABLE m AS
//! SELECT dp_linreg_gd(...) AS model ...`, or a scalar subquery); `features` is a list of numbers
//! (`[x1, x2]`, `make_array(x1, x2)`, or a list column) with as many values as the model has
//! coefficients.
//!
//! Per row: z = intercept + Σ_j coefficients_j · features_j.
//! - `linreg_predict` returns z.
//! - `logreg_predict_proba` returns σ(z) = 1/(1 + e^{−z}), computed as 1/(1 + e^{−z}) for z ≥ 0
//!   and e^{z}/(1 + e^{z}) for z < 0, so that no exponential overflows; the result is in [0, 1]
//!   (NaN only when z is NaN).
//!
//! NULL model, NULL feature list, or a NULL feature gives NULL. A feature list whose length
//! differs from the model's coefficient count is an error naming both lengths.
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{DataFusionError, Result, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, DocSection, Documentation, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

use crate::optim::model::Model;

/// Documentation section of the model functions.
const DOC_SECTION_MODELS: DocSection = DocSection {
    include: true,
    label: "Differential privacy: models",
    description: Some(
        "Prediction with models released by dp_linreg_gd, dp_logreg_agd, the DP-SGD models and \
         dp_mlp_sgd (post-processing, free).",
    ),
};

/// Which prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PredictKind {
    /// `linreg_predict(model, features)`: intercept + w·x.
    Linear,
    /// `logreg_predict_proba(model, features)`: sigmoid(intercept + w·x).
    LogisticProba,
}

impl PredictKind {
    pub fn name(self) -> &'static str {
        match self {
            PredictKind::Linear => "linreg_predict",
            PredictKind::LogisticProba => "logreg_predict_proba",
        }
    }

    fn documentation(self) -> &'static Documentation {
        static LIN: LazyLock<Documentation> = LazyLock::new(|| {
            Documentation::builder(
                DOC_SECTION_MODELS,
                "Prediction of a linear model released by dp_linreg_gd: intercept + \
                 Σ coefficients[j]·features[j]. Post-processing of a DP release: reads the model \
                 and the given features only, costs no budget. NULL model, list or feature \
                 gives NULL; a list whose length differs from the number of coefficients is an \
                 error.",
                "linreg_predict(model, features)",
            )
            .with_argument(
                "model",
                "Model struct returned by dp_linreg_gd (e.g. a column of a table created with \
                 CREATE TABLE m AS SELECT dp_linreg_gd(...) AS model FROM t).",
            )
            .with_argument(
                "features",
                "List of numbers in the order used for fitting: [x1, x2] or make_array(x1, x2).",
            )
            .with_sql_example(
                "SELECT p.id, linreg_predict(m.model, [p.age, p.bmi]) FROM m CROSS JOIN \
                 new_patients p;",
            )
            .with_related_udf("dp_linreg_gd")
            .build()
        });
        static LOG: LazyLock<Documentation> = LazyLock::new(|| {
            Documentation::builder(
                DOC_SECTION_MODELS,
                "Probability of label 1 under a logistic model released by dp_logreg_agd: \
                 sigmoid(intercept + Σ coefficients[j]·features[j]), computed without overflow; \
                 always in [0, 1]. Post-processing, costs no budget. NULL model, list or feature \
                 gives NULL; a list whose length differs from the number of coefficients is an \
                 error.",
                "logreg_predict_proba(model, features)",
            )
            .with_argument("model", "Model struct returned by dp_logreg_agd.")
            .with_argument(
                "features",
                "List of numbers in the order used for fitting: [x1, x2] or make_array(x1, x2).",
            )
            .with_sql_example(
                "SELECT logreg_predict_proba(m.model, [c.x1, c.x2]) > 0.5 FROM m CROSS JOIN \
                 customers c;",
            )
            .with_related_udf("dp_logreg_agd")
            .build()
        });
        match self {
            PredictKind::Linear => &LIN,
            PredictKind::LogisticProba => &LOG,
        }
    }
}

/// 1/(1 + e^{−z}) without overflow; in [0, 1].
pub fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// A prediction function as a DataFusion scalar UDF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Predict {
    kind: PredictKind,
    signature: Signature,
}

impl Predict {
    pub fn new(kind: PredictKind) -> Self {
        let signature = Signature::user_defined(Volatility::Immutable)
            .with_parameter_names(vec!["model".to_string(), "features".to_string()])
            .expect("two names for two parameters");
        Self { kind, signature }
    }

    pub fn udf(kind: PredictKind) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::new(kind))
    }
}

fn is_number(t: &DataType) -> bool {
    t.is_numeric() || t == &DataType::Null
}

/// The list's element type, if `t` is a list type.
fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

/// Per-row feature slices: offsets into a Float64 value array, and row validity (a NULL list or
/// any NULL element makes the row NULL).
fn feature_rows(arr: &ArrayRef) -> Result<(Vec<usize>, Vec<bool>, Float64Array)> {
    let n = arr.len();
    let (offsets, values): (Vec<usize>, ArrayRef) = match arr.data_type() {
        DataType::List(_) => {
            let l = arr.as_list::<i32>();
            (
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                Arc::clone(l.values()),
            )
        }
        DataType::LargeList(_) => {
            let l = arr.as_list::<i64>();
            (
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                Arc::clone(l.values()),
            )
        }
        DataType::FixedSizeList(_, k) => {
            let l = arr.as_fixed_size_list();
            let k = *k as usize;
            let start = l.offset() * k;
            (
                (0..=n).map(|i| start + i * k).collect(),
                Arc::clone(l.values()),
            )
        }
        DataType::Null => (
            vec![0; n + 1],
            Arc::new(Float64Array::from(Vec::<f64>::new())),
        ),
        t => return exec_err!("features must be a list of numbers, got {t}"),
    };
    let values = cast(&values, &DataType::Float64)?;
    let values = values.as_primitive::<Float64Type>().clone();
    let list_nulls = arr.logical_nulls();
    let valid = (0..n)
        .map(|i| {
            list_nulls.as_ref().is_none_or(|m| m.is_valid(i))
                && (values.null_count() == 0
                    || (offsets[i]..offsets[i + 1]).all(|j| values.is_valid(j)))
        })
        .collect();
    Ok((offsets, valid, values))
}

impl ScalarUDFImpl for Predict {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        if arg_types.len() != 2 {
            return plan_err!(
                "{name} takes 2 arguments: {name}(model, features), got {}",
                arg_types.len()
            );
        }
        match &arg_types[0] {
            DataType::Struct(f)
                if f.find("coefficients").is_some() && f.find("intercept").is_some() => {}
            DataType::Null => {}
            t => {
                return plan_err!(
                    "{name}: `model` must be a model struct (the result of a dp_linreg_gd or \
                     dp_logreg_agd call) with fields coefficients and intercept, got {t}"
                );
            }
        }
        match &arg_types[1] {
            t if list_item(t).is_some_and(is_number) => {}
            DataType::Null => {}
            t => {
                return plan_err!(
                    "{name}: `features` must be a list of numbers ([x1, x2] or make_array(x1, \
                     x2)), got {t}"
                );
            }
        }
        Ok(arg_types.to_vec())
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let (model_arr, at) = model_rows(&args.args[0])?;
        let feat_arr = &args.args[1].to_array(n)?;
        let (offsets, valid, values) = feature_rows(feat_arr)?;
        let vals = values.values();
        let models = match model_arr.data_type() {
            DataType::Struct(_) => Some(model_arr.as_struct()),
            _ => None, // NULL-typed model: every row NULL
        };
        // Decode each distinct model row once: a model column usually repeats one model (CROSS
        // JOIN with a one-row model table), and a constant model is one row.
        let mut cache: Option<(usize, Option<Model>)> = None;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let Some(models) = models else {
                out.push(None);
                continue;
            };
            let reuse = match &cache {
                Some((j, _)) => *j == at(i) || (*j + 1 == at(i) && same_row(models, *j, at(i))),
                None => false,
            };
            if !reuse {
                cache = Some((at(i), Model::from_struct_array(models, at(i))));
            } else if let Some((j, _)) = cache.as_mut() {
                *j = at(i);
            }
            let model = cache.as_ref().and_then(|(_, m)| m.as_ref());
            let (Some(m), true) = (model, valid[i]) else {
                out.push(None);
                continue;
            };
            let x = &vals[offsets[i]..offsets[i + 1]];
            if x.len() != m.coefficients.len() {
                return Err(DataFusionError::Execution(format!(
                    "{}: the model has {} coefficients but the feature list has {} values",
                    self.name(),
                    m.coefficients.len(),
                    x.len()
                )));
            }
            let z = m.intercept
                + m.coefficients
                    .iter()
                    .zip(x)
                    .map(|(w, v)| w * v)
                    .sum::<f64>();
            out.push(Some(match self.kind {
                PredictKind::Linear => z,
                PredictKind::LogisticProba => sigmoid(z),
            }));
        }
        Ok(ColumnarValue::Array(Arc::new(Float64Array::from(out))))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(self.kind.documentation())
    }
}

/// Which model row a row uses.
type RowOf = fn(usize) -> usize;

/// The models of a call, and the row of them that row `i` uses: a constant model (a scalar
/// subquery) is one row, decoded once and never copied once per row (a model may be large:
/// copying it per row made memory grow with the rows a query selects).
fn model_rows(model: &ColumnarValue) -> Result<(ArrayRef, RowOf)> {
    Ok(match model {
        ColumnarValue::Scalar(s) => (s.to_array()?, |_| 0),
        ColumnarValue::Array(a) => (a.clone(), |i| i),
    })
}

/// Whether rows `a` and `b` of a struct array hold the same model (cheap check for the common
/// case of a repeated model).
fn same_row(s: &datafusion::arrow::array::StructArray, a: usize, b: usize) -> bool {
    use datafusion::arrow::array::make_comparator;
    use datafusion::arrow::compute::SortOptions;
    let arr: ArrayRef = Arc::new(s.clone());
    make_comparator(arr.as_ref(), arr.as_ref(), SortOptions::default())
        .map(|cmp| cmp(a, b).is_eq())
        .unwrap_or(false)
}

/// `mlp_predict_proba(model, features)` (List<Float64>: one probability per class, [1 − p, p]
/// for two classes) and `mlp_predict(model, features)` (Int64: the most probable class, the
/// smallest on ties), for networks released by `dp_mlp_sgd` ([`crate::optim::mlp::MlpModel`]).
/// Post-processing, free. NULL model, list or feature gives NULL; a feature list of another
/// length than the model's inputs is an error naming both lengths.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MlpPredict {
    proba: bool,
    signature: Signature,
}

impl MlpPredict {
    pub fn new(proba: bool) -> Self {
        let signature = Signature::user_defined(Volatility::Immutable)
            .with_parameter_names(vec!["model".to_string(), "features".to_string()])
            .expect("two names for two parameters");
        Self { proba, signature }
    }

    pub fn udf(proba: bool) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::new(proba))
    }
}

impl ScalarUDFImpl for MlpPredict {
    fn name(&self) -> &str {
        if self.proba {
            "mlp_predict_proba"
        } else {
            "mlp_predict"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        if arg_types.len() != 2 {
            return plan_err!(
                "{name} takes 2 arguments: {name}(model, features), got {}",
                arg_types.len()
            );
        }
        match &arg_types[0] {
            DataType::Struct(f) if f.find("weights").is_some() && f.find("hidden").is_some() => {}
            DataType::Null => {}
            t => {
                return plan_err!(
                    "{name}: `model` must be a network struct (the result of a dp_mlp_sgd call), \
                     got {t}"
                );
            }
        }
        match &arg_types[1] {
            t if list_item(t).is_some_and(is_number) => {}
            DataType::Null => {}
            t => {
                return plan_err!(
                    "{name}: `features` must be a list of numbers ([x1, x2] or make_array(x1, \
                     x2)), got {t}"
                );
            }
        }
        Ok(arg_types.to_vec())
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(if self.proba {
            DataType::List(Arc::new(
                datafusion::arrow::datatypes::Field::new_list_field(DataType::Float64, true),
            ))
        } else {
            DataType::Int64
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use crate::optim::mlp::MlpModel;
        use datafusion::arrow::array::{Float64Builder, Int64Array, ListBuilder};
        let n = args.number_rows;
        let (model_arr, at) = model_rows(&args.args[0])?;
        let feat_arr = &args.args[1].to_array(n)?;
        let (offsets, valid, values) = feature_rows(feat_arr)?;
        let vals = values.values();
        let models = match model_arr.data_type() {
            DataType::Struct(_) => Some(model_arr.as_struct()),
            _ => None,
        };
        let mut cache: Option<(usize, Option<MlpModel>)> = None;
        let mut probs = ListBuilder::new(Float64Builder::new());
        let mut classes = Vec::with_capacity(n);
        for i in 0..n {
            let model = match models {
                None => None,
                Some(models) => {
                    let reuse = matches!(&cache, Some((j, _))
                        if *j == at(i) || (*j + 1 == at(i) && same_row(models, *j, at(i))));
                    if !reuse {
                        cache = Some((at(i), MlpModel::from_struct_array(models, at(i))));
                    } else if let Some((j, _)) = cache.as_mut() {
                        *j = at(i);
                    }
                    cache.as_ref().and_then(|(_, m)| m.as_ref())
                }
            };
            let (Some(m), true) = (model, valid[i]) else {
                probs.append_null();
                classes.push(None);
                continue;
            };
            let x = &vals[offsets[i]..offsets[i + 1]];
            if x.len() != m.inputs as usize {
                return Err(DataFusionError::Execution(format!(
                    "{}: the model has {} inputs but the feature list has {} values",
                    self.name(),
                    m.inputs,
                    x.len()
                )));
            }
            let p = m.predict_proba(x);
            let best = p
                .iter()
                .enumerate()
                .fold((0usize, f64::NEG_INFINITY), |b, (k, &v)| {
                    if v > b.1 { (k, v) } else { b }
                })
                .0;
            classes.push(Some(best as i64));
            probs.append_value(p.into_iter().map(Some));
        }
        Ok(ColumnarValue::Array(if self.proba {
            Arc::new(probs.finish())
        } else {
            Arc::new(Int64Array::from(classes))
        }))
    }

    fn documentation(&self) -> Option<&Documentation> {
        static PROBA: LazyLock<Documentation> = LazyLock::new(|| {
            Documentation::builder(
                DOC_SECTION_MODELS,
                "Class probabilities of a network released by dp_mlp_sgd (one per class; \
                 [1 − p, p] for two classes).",
                "mlp_predict_proba(model, features)",
            )
            .with_argument("model", "Network struct returned by dp_mlp_sgd.")
            .with_argument(
                "features",
                "List of numbers, as many as the model's inputs.",
            )
            .with_related_udf("dp_mlp_sgd")
            .build()
        });
        static CLASS: LazyLock<Documentation> = LazyLock::new(|| {
            Documentation::builder(
                DOC_SECTION_MODELS,
                "The most probable class (0 … classes − 1) under a network released by \
                 dp_mlp_sgd.",
                "mlp_predict(model, features)",
            )
            .with_argument("model", "Network struct returned by dp_mlp_sgd.")
            .with_argument(
                "features",
                "List of numbers, as many as the model's inputs.",
            )
            .with_related_udf("dp_mlp_sgd")
            .build()
        });
        Some(if self.proba { &PROBA } else { &CLASS })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[test]
    fn sigmoid_is_stable() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert!((sigmoid(2.0) + sigmoid(-2.0) - 1.0).abs() < 1e-15);
        assert!(sigmoid(-745.0) >= 0.0 && sigmoid(f64::INFINITY) == 1.0);
        assert_eq!(sigmoid(f64::NEG_INFINITY), 0.0);
    }

    async fn floats(sql: &str) -> Result<Vec<Option<f64>>> {
        let ctx = SessionContext::new();
        crate::register_all(&ctx);
        let batches = ctx.sql(sql).await?.collect().await?;
        let mut out = vec![];
        for b in batches {
            let c = b.column(0).as_primitive::<Float64Type>();
            out.extend((0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))));
        }
        Ok(out)
    }

    const MODEL: &str = "named_struct('coefficients', [2.0, -1.0], 'intercept', 0.5, \
                         'iterations', arrow_cast(10, 'UInt32'), 'epsilon', 1.0, 'delta', 1e-6, \
                         'mechanism', 'gaussian')";

    /// A constant model is decoded once and never copied once per row (a model of 8 million
    /// coefficients, copied per row, made memory grow with the rows a query selected); a network
    /// of more classes or hidden units than dp_mlp_sgd releases is no network.
    #[test]
    fn a_constant_model_is_one_row_and_networks_have_released_shapes() {
        use crate::optim::mlp::{MAX_CLASSES, MlpModel};
        use datafusion::common::ScalarValue;
        let wide = ScalarValue::List(ScalarValue::new_list_nullable(
            &vec![ScalarValue::Float64(Some(1.0)); 100_000],
            &DataType::Float64,
        ));
        let (rows, at) = model_rows(&ColumnarValue::Scalar(wide)).expect("rows");
        assert_eq!((rows.len(), at(8191)), (1, 0));
        let network = |classes: u32| MlpModel {
            weights: vec![0.0; 3 * 2 + 2 + (2 + 1) * classes as usize],
            inputs: 3,
            hidden: 2,
            classes,
            iterations: 1,
            epsilon: 1.0,
            delta: 1e-6,
            mechanism: "gaussian".into(),
        };
        let decoded = |m: MlpModel| {
            let a = m.to_scalar().to_array().expect("array");
            MlpModel::from_struct_array(a.as_struct(), 0)
        };
        assert!(decoded(network(MAX_CLASSES)).is_some());
        assert!(decoded(network(MAX_CLASSES + 1)).is_none());
    }

    #[tokio::test]
    async fn predicts_per_row() {
        let sql = format!(
            "SELECT linreg_predict({MODEL}, [a, b]) FROM (VALUES (1, 2), (3, NULL), (0, 0)) AS t(a, b)"
        );
        assert_eq!(
            floats(&sql).await.unwrap(),
            vec![Some(0.5), None, Some(0.5)]
        );
        let sql = format!(
            "SELECT logreg_predict_proba({MODEL}, make_array(a, b)) FROM (VALUES (1.0, 2.5), (400.0, 0.0)) AS t(a, b)"
        );
        let p = floats(&sql).await.unwrap();
        assert_eq!(p[0], Some(0.5));
        assert_eq!(p[1], Some(1.0));
    }

    #[tokio::test]
    async fn bad_inputs() {
        let e = floats(&format!("SELECT linreg_predict({MODEL}, [1.0, 2.0, 3.0])"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 coefficients") && e.contains("3 values"),
            "{e}"
        );
        let e = floats("SELECT linreg_predict(1.0, [1.0])")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("model struct"), "{e}");
        let e = floats(&format!("SELECT linreg_predict({MODEL}, ['a', 'b'])"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("list of numbers"), "{e}");
        assert_eq!(
            floats("SELECT linreg_predict(NULL, [1.0])").await.unwrap(),
            vec![None]
        );
    }
}
