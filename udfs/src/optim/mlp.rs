//! The networks of the DP-SGD aggregates ([`super::sgd`]): the per-example loss gradient of a
//! linear model (squared loss), a logistic model (log loss) and a one-hidden-layer ReLU network
//! (`dp_mlp_sgd`: sigmoid output for two classes, softmax for more), on a flat parameter vector.
//!
//! Layouts of θ (fixed by the call's literals and the feature count, never by data):
//! - linear / logistic: `[w (d values), b]`, prediction z = w·x + b;
//! - network: `[W₁ (h×d, row-major), b₁ (h), W₂ (k×h, row-major), b₂ (k)]`, with k = 1 output
//!   for two classes and k = classes otherwise; a = ReLU(W₁x + b₁), z = W₂a + b₂.
//!
//! Gradients by backpropagation (Goodfellow, Bengio, Courville, *Deep Learning*, 2016, §6.5):
//! with δ = ∂ℓ/∂z = σ(z) − y (log loss), softmax(z) − e_y (cross-entropy) or z − y (squared
//! loss), ∂ℓ/∂W₂ = δ aᵀ, ∂ℓ/∂b₂ = δ, ∂ℓ/∂W₁ = ((W₂ᵀδ) ⊙ 1[W₁x + b₁ > 0]) xᵀ, ∂ℓ/∂b₁ likewise.
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, ListArray, StringArray, StructArray, UInt32Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Float64Type, UInt32Type};
use datafusion::common::ScalarValue;

use super::linreg::VALUE_CLAMP;
use crate::scalars::predict::sigmoid;

/// Which network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Net {
    /// Linear regression, squared loss ½(z − y)².
    Linear { d: usize },
    /// Logistic regression, labels 0/1.
    Logistic { d: usize },
    /// One hidden ReLU layer of `hidden` units; labels 0 … classes − 1.
    Mlp {
        d: usize,
        hidden: usize,
        classes: usize,
    },
}

impl Net {
    /// Number of features.
    pub fn d(&self) -> usize {
        match *self {
            Net::Linear { d } | Net::Logistic { d } | Net::Mlp { d, .. } => d,
        }
    }

    /// Outputs of the last layer (1 for two classes).
    pub fn outputs(&self) -> usize {
        match *self {
            Net::Mlp { classes, .. } if classes > 2 => classes,
            _ => 1,
        }
    }

    /// Number of parameters p.
    pub fn params(&self) -> usize {
        match *self {
            Net::Linear { d } | Net::Logistic { d } => d + 1,
            Net::Mlp { d, hidden, .. } => {
                hidden * d + hidden + self.outputs() * hidden + self.outputs()
            }
        }
    }

    /// The initial parameters: zero for the linear models; He-initialised first layer
    /// (N(0, 2/d)) and N(0, 1/h) second layer for the network (He et al., ICCV 2015, §2.2),
    /// drawn from `normal` (data-independent randomness; it is not privacy noise).
    pub fn init(&self, mut normal: impl FnMut() -> f64) -> Vec<f64> {
        let mut theta = vec![0.0; self.params()];
        if let Net::Mlp { d, hidden, .. } = *self {
            let s1 = (2.0 / d.max(1) as f64).sqrt();
            for v in &mut theta[..hidden * d] {
                *v = s1 * normal();
            }
            let off = hidden * d + hidden;
            let s2 = (1.0 / hidden as f64).sqrt();
            for v in &mut theta[off..off + self.outputs() * hidden] {
                *v = s2 * normal();
            }
        }
        theta
    }

    /// The label as the loss reads it: a class index for the network (`None` for anything but
    /// an integer in 0 … classes − 1), 0/1 for logistic, the clamped value for linear.
    fn label(&self, y: f64) -> Option<f64> {
        match *self {
            Net::Linear { .. } => (!y.is_nan()).then(|| y.clamp(-VALUE_CLAMP, VALUE_CLAMP)),
            Net::Logistic { .. } => (y == 0.0 || y == 1.0).then_some(y),
            Net::Mlp { classes, .. } => {
                (y >= 0.0 && y < classes as f64 && y.fract() == 0.0).then_some(y)
            }
        }
    }

    /// The output scores z (length [`Self::outputs`]) and, for the network, the hidden
    /// pre-activations into `hidden_pre` (length h).
    pub fn forward(&self, theta: &[f64], x: &[f64], hidden_pre: &mut [f64], z: &mut [f64]) {
        match *self {
            Net::Linear { d } | Net::Logistic { d } => {
                z[0] = theta[d] + dot(&theta[..d], x);
            }
            Net::Mlp { d, hidden, .. } => {
                let k = self.outputs();
                let (w1, rest) = theta.split_at(hidden * d);
                let (b1, rest) = rest.split_at(hidden);
                let (w2, b2) = rest.split_at(k * hidden);
                for j in 0..hidden {
                    hidden_pre[j] = b1[j] + dot(&w1[j * d..(j + 1) * d], x);
                }
                for c in 0..k {
                    let row = &w2[c * hidden..(c + 1) * hidden];
                    z[c] = b2[c]
                        + row
                            .iter()
                            .zip(hidden_pre.iter())
                            .map(|(w, &a)| w * a.max(0.0))
                            .sum::<f64>();
                }
            }
        }
    }

    /// Class probabilities (network and logistic) from scores `z`, into `out` (length 2 for one
    /// output: [1 − σ(z), σ(z)]; softmax otherwise).
    pub fn probabilities(&self, z: &[f64], out: &mut Vec<f64>) {
        out.clear();
        if z.len() == 1 {
            let p = sigmoid(z[0]);
            out.extend([1.0 - p, p]);
        } else {
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            out.extend(z.iter().map(|v| (v - m).exp()));
            let s: f64 = out.iter().sum();
            out.iter_mut().for_each(|v| *v /= s);
        }
    }

    /// The gradient of the example's loss at θ into `g` (length p). Returns false (g zeroed)
    /// when the label is not usable or the gradient is not finite: the row then contributes 0.
    pub fn gradient(
        &self,
        theta: &[f64],
        x: &[f64],
        y: f64,
        scratch: &mut Scratch,
        g: &mut [f64],
    ) -> bool {
        let Some(y) = self.label(y) else {
            g.fill(0.0);
            return false;
        };
        scratch.x.clear();
        scratch.x.extend(x.iter().map(|v| {
            if v.is_nan() {
                0.0
            } else {
                v.clamp(-VALUE_CLAMP, VALUE_CLAMP)
            }
        }));
        let x = &scratch.x;
        let k = self.outputs();
        let hid = match *self {
            Net::Mlp { hidden, .. } => hidden,
            _ => 0,
        };
        scratch.pre.resize(hid, 0.0);
        scratch.z.resize(k, 0.0);
        self.forward(theta, x, &mut scratch.pre, &mut scratch.z);
        // δ = ∂ℓ/∂z.
        let delta = &mut scratch.delta;
        delta.clear();
        match *self {
            Net::Linear { .. } => delta.push(scratch.z[0] - y),
            Net::Logistic { .. } => delta.push(sigmoid(scratch.z[0]) - y),
            Net::Mlp { .. } if k == 1 => delta.push(sigmoid(scratch.z[0]) - y),
            Net::Mlp { .. } => {
                let mut p = Vec::new();
                self.probabilities(&scratch.z, &mut p);
                delta.extend(p);
                delta[y as usize] -= 1.0;
            }
        }
        match *self {
            Net::Linear { d } | Net::Logistic { d } => {
                let r = delta[0];
                for (o, v) in g[..d].iter_mut().zip(x) {
                    *o = r * v;
                }
                g[d] = r;
            }
            Net::Mlp { d, hidden, .. } => {
                let (gw1, rest) = g.split_at_mut(hidden * d);
                let (gb1, rest) = rest.split_at_mut(hidden);
                let (gw2, gb2) = rest.split_at_mut(k * hidden);
                let w2 = &theta[hidden * d + hidden..hidden * d + hidden + k * hidden];
                for c in 0..k {
                    gb2[c] = delta[c];
                    for j in 0..hidden {
                        gw2[c * hidden + j] = delta[c] * scratch.pre[j].max(0.0);
                    }
                }
                for j in 0..hidden {
                    let back = if scratch.pre[j] > 0.0 {
                        (0..k).map(|c| w2[c * hidden + j] * delta[c]).sum::<f64>()
                    } else {
                        0.0
                    };
                    gb1[j] = back;
                    for (o, v) in gw1[j * d..(j + 1) * d].iter_mut().zip(x) {
                        *o = back * v;
                    }
                }
            }
        }
        if g.iter().all(|v| v.is_finite()) {
            true
        } else {
            g.fill(0.0);
            false
        }
    }
}

/// Reused buffers of [`Net::gradient`].
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    x: Vec<f64>,
    pre: Vec<f64>,
    z: Vec<f64>,
    delta: Vec<f64>,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(u, v)| u * v).sum()
}

/// The most classes a network may have (dp_mlp_sgd's `classes`, and a released model's).
pub const MAX_CLASSES: u32 = 1000;
/// The most hidden units (dp_mlp_sgd's `hidden`, and a released model's).
pub const MAX_HIDDEN: u32 = 4096;

/// The struct `dp_mlp_sgd` returns (SQL.md, "Model struct"): `Struct<weights List<Float64>,
/// inputs UInt32, hidden UInt32, classes UInt32, iterations UInt32, epsilon Float64, delta
/// Float64, mechanism Utf8>`, `weights` in the layout of [`Net::Mlp`] (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MlpModel {
    pub weights: Vec<f64>,
    pub inputs: u32,
    pub hidden: u32,
    pub classes: u32,
    pub iterations: u32,
    pub epsilon: f64,
    pub delta: f64,
    pub mechanism: String,
}

/// The fields of [`MlpModel`]'s struct, in order.
pub fn mlp_model_fields() -> Fields {
    Fields::from(vec![
        Field::new(
            "weights",
            DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true))),
            true,
        ),
        Field::new("inputs", DataType::UInt32, true),
        Field::new("hidden", DataType::UInt32, true),
        Field::new("classes", DataType::UInt32, true),
        Field::new("iterations", DataType::UInt32, true),
        Field::new("epsilon", DataType::Float64, true),
        Field::new("delta", DataType::Float64, true),
        Field::new("mechanism", DataType::Utf8, true),
    ])
}

/// The struct type of [`MlpModel`].
pub fn mlp_model_data_type() -> DataType {
    DataType::Struct(mlp_model_fields())
}

impl MlpModel {
    /// The network this model evaluates.
    pub fn net(&self) -> Net {
        Net::Mlp {
            d: self.inputs as usize,
            hidden: self.hidden as usize,
            classes: self.classes as usize,
        }
    }

    /// The struct as a scalar of [`mlp_model_data_type`].
    pub fn to_scalar(&self) -> ScalarValue {
        let w = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::from_lengths([self.weights.len()]),
            Arc::new(Float64Array::from(self.weights.clone())),
            None,
        );
        let cols: Vec<ArrayRef> = vec![
            Arc::new(w),
            Arc::new(UInt32Array::from(vec![self.inputs])),
            Arc::new(UInt32Array::from(vec![self.hidden])),
            Arc::new(UInt32Array::from(vec![self.classes])),
            Arc::new(UInt32Array::from(vec![self.iterations])),
            Arc::new(Float64Array::from(vec![self.epsilon])),
            Arc::new(Float64Array::from(vec![self.delta])),
            Arc::new(StringArray::from(vec![self.mechanism.as_str()])),
        ];
        ScalarValue::Struct(Arc::new(StructArray::new(mlp_model_fields(), cols, None)))
    }

    /// Row `i` of a struct array, by field name; `None` when NULL, malformed, or when the
    /// weight count does not match the shape.
    pub fn from_struct_array(a: &StructArray, i: usize) -> Option<MlpModel> {
        if i >= a.len() || a.is_null(i) {
            return None;
        }
        let w = a.column_by_name("weights")?;
        if w.is_null(i) {
            return None;
        }
        let wv = match w.data_type() {
            DataType::List(_) => w.as_list::<i32>().value(i),
            DataType::LargeList(_) => w.as_list::<i64>().value(i),
            _ => return None,
        };
        if wv.null_count() > 0 {
            return None;
        }
        let wv = cast(&wv, &DataType::Float64).ok()?;
        let weights = wv.as_primitive::<Float64Type>().values().to_vec();
        let u32_at = |name: &str| -> Option<u32> {
            let c = cast(a.column_by_name(name)?, &DataType::UInt32).ok()?;
            let c = c.as_primitive::<UInt32Type>();
            c.is_valid(i).then(|| c.value(i))
        };
        let f64_at = |name: &str| -> f64 {
            a.column_by_name(name)
                .and_then(|c| cast(c, &DataType::Float64).ok())
                .and_then(|c| {
                    let c = c.as_primitive::<Float64Type>();
                    c.is_valid(i).then(|| c.value(i))
                })
                .unwrap_or(f64::NAN)
        };
        let m = MlpModel {
            weights,
            inputs: u32_at("inputs")?,
            hidden: u32_at("hidden")?,
            classes: u32_at("classes")?,
            iterations: u32_at("iterations").unwrap_or(0),
            epsilon: f64_at("epsilon"),
            delta: f64_at("delta"),
            mechanism: a
                .column_by_name("mechanism")
                .and_then(|c| cast(c, &DataType::Utf8).ok())
                .and_then(|c| {
                    let c = c.as_string::<i32>();
                    c.is_valid(i).then(|| c.value(i).to_string())
                })
                .unwrap_or_default(),
        };
        // The shapes dp_mlp_sgd releases (a struct of other shapes, e.g. one written in the
        // query, is no network: a million classes would make each row's prediction 8 MB).
        ((2..=MAX_CLASSES).contains(&m.classes)
            && (1..=MAX_HIDDEN).contains(&m.hidden)
            && m.weights.len() == m.net().params())
        .then_some(m)
    }

    /// Class probabilities for features `x` (length `inputs`).
    pub fn predict_proba(&self, x: &[f64]) -> Vec<f64> {
        let net = self.net();
        let mut pre = vec![0.0; self.hidden as usize];
        let mut z = vec![0.0; net.outputs()];
        net.forward(&self.weights, x, &mut pre, &mut z);
        let mut out = Vec::new();
        net.probabilities(&z, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backpropagation against central finite differences of the loss.
    #[test]
    fn gradients_match_finite_differences() {
        let loss = |net: &Net, theta: &[f64], x: &[f64], y: f64| -> f64 {
            let k = net.outputs();
            let mut pre = vec![0.0; 8];
            let mut z = vec![0.0; k];
            net.forward(theta, x, &mut pre, &mut z);
            match net {
                Net::Linear { .. } => 0.5 * (z[0] - y).powi(2),
                _ if k == 1 => {
                    let p = sigmoid(z[0]);
                    -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
                }
                _ => {
                    let mut p = Vec::new();
                    net.probabilities(&z, &mut p);
                    -p[y as usize].ln()
                }
            }
        };
        let x = [0.3, -1.2, 0.7];
        let mut state = 1u64;
        let mut normal = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        };
        for (net, y) in [
            (Net::Linear { d: 3 }, 0.4),
            (Net::Logistic { d: 3 }, 1.0),
            (
                Net::Mlp {
                    d: 3,
                    hidden: 8,
                    classes: 2,
                },
                1.0,
            ),
            (
                Net::Mlp {
                    d: 3,
                    hidden: 8,
                    classes: 4,
                },
                2.0,
            ),
        ] {
            let mut theta = net.init(&mut normal);
            theta.iter_mut().for_each(|t| *t += 0.1 * normal());
            let mut g = vec![0.0; net.params()];
            assert!(net.gradient(&theta, &x, y, &mut Scratch::default(), &mut g));
            for i in 0..theta.len() {
                let h = 1e-6;
                let mut a = theta.clone();
                a[i] += h;
                let mut b = theta.clone();
                b[i] -= h;
                let fd = (loss(&net, &a, &x, y) - loss(&net, &b, &x, y)) / (2.0 * h);
                assert!((fd - g[i]).abs() < 1e-5, "{net:?} {i}: {fd} vs {}", g[i]);
            }
        }
        // Unusable labels contribute nothing.
        let net = Net::Mlp {
            d: 3,
            hidden: 8,
            classes: 3,
        };
        let theta = net.init(normal);
        let mut g = vec![1.0; net.params()];
        assert!(!net.gradient(&theta, &x, 3.0, &mut Scratch::default(), &mut g));
        assert!(g.iter().all(|&v| v == 0.0));
    }
}
