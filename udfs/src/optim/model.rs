//! The model struct returned by the model aggregates (SQL.md, "Model struct"):
//! `Struct<coefficients List<Float64>, intercept Float64, iterations UInt32, epsilon Float64,
//! delta Float64, mechanism Utf8>`.
//!
//! A released model is public (it is the output of a DP function), so it can be stored with
//! `CREATE TABLE m AS SELECT dp_linreg_gd(...) AS model FROM t` and used by the predict
//! functions on any table.
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, ListArray, StringArray, StructArray, UInt32Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Float64Type, UInt32Type};
use datafusion::common::ScalarValue;

/// The model struct's fields, in order.
pub fn model_fields() -> Fields {
    Fields::from(vec![
        Field::new(
            "coefficients",
            DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true))),
            true,
        ),
        Field::new("intercept", DataType::Float64, true),
        Field::new("iterations", DataType::UInt32, true),
        Field::new("epsilon", DataType::Float64, true),
        Field::new("delta", DataType::Float64, true),
        Field::new("mechanism", DataType::Utf8, true),
    ])
}

/// `Struct<coefficients List<Float64>, intercept Float64, iterations UInt32, epsilon Float64,
/// delta Float64, mechanism Utf8>`.
pub fn model_data_type() -> DataType {
    DataType::Struct(model_fields())
}

/// A fitted model: prediction is `intercept + coefficients · x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub coefficients: Vec<f64>,
    pub intercept: f64,
    /// Iterations run (gradient releases).
    pub iterations: u32,
    /// The (ε, δ) the call was calibrated for.
    pub epsilon: f64,
    pub delta: f64,
    /// `'gaussian'`, `'rgm'`, `'agd'` …
    pub mechanism: String,
}

impl Model {
    /// The struct as a one-row array.
    pub fn to_array(&self) -> StructArray {
        let coefs = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::from_lengths([self.coefficients.len()]),
            Arc::new(Float64Array::from(self.coefficients.clone())),
            None,
        );
        let cols: Vec<ArrayRef> = vec![
            Arc::new(coefs),
            Arc::new(Float64Array::from(vec![self.intercept])),
            Arc::new(UInt32Array::from(vec![self.iterations])),
            Arc::new(Float64Array::from(vec![self.epsilon])),
            Arc::new(Float64Array::from(vec![self.delta])),
            Arc::new(StringArray::from(vec![self.mechanism.as_str()])),
        ];
        StructArray::new(model_fields(), cols, None)
    }

    /// The struct as a scalar of [`model_data_type`].
    pub fn to_scalar(&self) -> ScalarValue {
        ScalarValue::Struct(Arc::new(self.to_array()))
    }

    /// A NULL of [`model_data_type`] (e.g. a group with no usable rows under a public n).
    pub fn null_scalar() -> ScalarValue {
        ScalarValue::try_from(&model_data_type()).expect("struct types have a NULL scalar")
    }

    /// Row `i` of a model struct array, found by field name (so a struct with extra fields, or
    /// fields in another order, also works). `None` when the row, its coefficients or its
    /// intercept is NULL, or a required field is missing or mistyped.
    pub fn from_struct_array(a: &StructArray, i: usize) -> Option<Model> {
        if i >= a.len() || a.is_null(i) {
            return None;
        }
        let coefs = a.column_by_name("coefficients")?;
        if coefs.is_null(i) {
            return None;
        }
        let coefficients: Vec<f64> = match coefs.data_type() {
            DataType::List(_) => list_values(coefs.as_list::<i32>().value(i))?,
            DataType::LargeList(_) => list_values(coefs.as_list::<i64>().value(i))?,
            DataType::FixedSizeList(_, _) => list_values(coefs.as_fixed_size_list().value(i))?,
            _ => return None,
        };
        let f64_at = |name: &str| -> Option<Option<f64>> {
            let c = a.column_by_name(name)?;
            let c = datafusion::arrow::compute::cast(c, &DataType::Float64).ok()?;
            let c = c.as_primitive::<Float64Type>();
            Some(c.is_valid(i).then(|| c.value(i)))
        };
        let intercept = f64_at("intercept")??;
        let iterations = a
            .column_by_name("iterations")
            .and_then(|c| datafusion::arrow::compute::cast(c, &DataType::UInt32).ok())
            .and_then(|c| {
                let c = c.as_primitive::<UInt32Type>();
                c.is_valid(i).then(|| c.value(i))
            })
            .unwrap_or(0);
        let epsilon = f64_at("epsilon").flatten().unwrap_or(f64::NAN);
        let delta = f64_at("delta").flatten().unwrap_or(f64::NAN);
        let mechanism = a
            .column_by_name("mechanism")
            .and_then(|c| datafusion::arrow::compute::cast(c, &DataType::Utf8).ok())
            .and_then(|c| {
                let c = c.as_string::<i32>();
                c.is_valid(i).then(|| c.value(i).to_string())
            })
            .unwrap_or_default();
        Some(Model {
            coefficients,
            intercept,
            iterations,
            epsilon,
            delta,
            mechanism,
        })
    }
}

/// The values of one coefficient list as f64; `None` if any is NULL or not numeric.
fn list_values(v: ArrayRef) -> Option<Vec<f64>> {
    if v.null_count() > 0 {
        return None;
    }
    let c = datafusion::arrow::compute::cast(&v, &DataType::Float64).ok()?;
    Some(c.as_primitive::<Float64Type>().values().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_round_trip() {
        let m = Model {
            coefficients: vec![1.5, -2.0],
            intercept: 0.25,
            iterations: 30,
            epsilon: 1.0,
            delta: 1e-6,
            mechanism: "gaussian".into(),
        };
        let s = m.to_scalar();
        assert_eq!(s.data_type(), model_data_type());
        let arr = s.to_array().unwrap();
        let back = Model::from_struct_array(arr.as_struct(), 0).unwrap();
        assert_eq!(back, m);
        let null = Model::null_scalar();
        assert!(null.is_null());
        assert_eq!(null.data_type(), model_data_type());
        assert!(Model::from_struct_array(null.to_array().unwrap().as_struct(), 0).is_none());
    }
}
