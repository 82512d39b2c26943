//! `dp_linreg_sgd(y, features, epsilon[, delta[, sample_rate[, steps[, epochs[, clip[,
//! learning_rate[, noise]]]]]]])`, `dp_logreg_sgd(label, features, …)` (the same parameters)
//! and `dp_mlp_sgd(label, features, epsilon[, delta[, hidden[, classes[, sample_rate[, steps[,
//! epochs[, clip[, learning_rate[, noise]]]]]]]]])`: models fitted by DP-SGD. The algorithms,
//! their privacy argument and the accounting are in [`crate::optim::sgd`]; the networks in
//! [`crate::optim::mlp`].
//!
//! - `noise => 'independent'` (default): T steps of Poisson-subsampled DP-SGD at rate
//!   `sample_rate`; cost `SubsampledGaussian { q, z, T }` with z calibrated so that the
//!   standalone ε at δ is ≤ `epsilon` ([`crate::privacy::sgd::noise_multiplier`]). Refused
//!   under replace neighbours (the accountant's bound is add/remove), and by `gdp` / `zcdp`
//!   table filters (no GDP or zCDP bound of the subsampled Gaussian is proven here: the
//!   accountant names the owner's options).
//! - `noise => 'mf'`: one pass over a random batch assignment with correlated noise (square-root
//!   factorisation); cost `Gaussian { μ = gaussian_mu(ε, δ) }`, which composes in every filter.
//!   It does not sample: `steps` sets the batches (each row joins one of them), and a written
//!   `sample_rate` (other than 0, its declared default) is refused, not ignored.
//! - `steps` 0 (default): 1000 with `'independent'`, 100 with `'mf'`; `epochs` > 0 instead sets
//!   T = ⌈epochs/q⌉ (`'independent'` only; `'mf'` is one epoch). Both set is refused.
//! - Rows with a NULL/NaN label or feature, a wrong-length list, or a label outside the model's
//!   classes contribute nothing (never an error: [`crate::optim::rows`]). The feature count is
//!   the one the query fixes, never one learned from the rows (round 48): the model's
//!   coefficients (the network's `inputs`) have that size even with no usable row.
//! - Privacy units (`units:K:C`): the key after `neighbours`, as for `dp_logreg_agd`; units are
//!   sampled and clipped as a whole.
//!
//! Defaults (chosen on synthetic standardised data, docs/UTILITY.md "DP-SGD"): sample_rate 0.01
//! (`'independent'`; written as 0), clip 1, learning_rate 0.5, hidden 32, classes 2.
//!
//! Returns the model struct ([`crate::optim::model`], mechanism `'dp-sgd'` or `'dp-sgd-mf'`)
//! for the linear models (so `linreg_predict` / `logreg_predict_proba` apply), and the network
//! struct ([`crate::optim::mlp::MlpModel`]) for `dp_mlp_sgd` (`mlp_predict_proba`,
//! `mlp_predict`).
use std::sync::LazyLock;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Signature, Volatility,
};

use super::common::{DOC_SECTION_DP, ModelUdaf, coerce_features, coerce_param, is_number};
use super::declaration::{
    self, Aggregate, DELTA, EPSILON, MODEL_DATA, NEIGHBOURS, SGD_CLIP, SGD_EPOCHS,
    SGD_LEARNING_RATE, SGD_NOISE, SGD_PARAMS, SGD_SAMPLE_RATE, SGD_STEPS, UnitRule,
};
use super::params::{Neighbours, Params, literal_params, plan_error};
use crate::noise::SecureRng;
use crate::optim::mlp::{MAX_CLASSES, MAX_HIDDEN, MlpModel, mlp_model_data_type};
use crate::optim::model::{Model, model_data_type};
use crate::optim::rows::{LabelKind, RowBuffer};
use crate::optim::sgd::{Family, MAX_STEPS, NoiseKind, SgdPlan};
use crate::optim::units::{check_key_type, check_unit_key, split_unit_key};
use crate::privacy::{Event, PrivacyError};

/// Default Poisson sample rate q.
pub const DEFAULT_SAMPLE_RATE: f64 = 0.01;
/// Default T under `'independent'` (10 epochs at q = 0.01).
pub const DEFAULT_STEPS: u64 = 1000;
/// Default T under `'mf'` (batches of n/100 rows).
pub const DEFAULT_MF_STEPS: u64 = 100;
/// Default clipping norm (whole per-example gradient, all layers).
pub const DEFAULT_CLIP: f64 = 1.0;
/// Default step size on the mean clipped gradient.
pub const DEFAULT_LEARNING_RATE: f64 = 0.5;
/// Default hidden width of `dp_mlp_sgd`.
pub const DEFAULT_HIDDEN: f64 = 32.0;

/// Which aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SgdKind {
    Linear,
    Logistic,
    Mlp,
}

impl SgdKind {
    pub fn name(self) -> &'static str {
        match self {
            SgdKind::Linear => "dp_linreg_sgd",
            SgdKind::Logistic => "dp_logreg_sgd",
            SgdKind::Mlp => "dp_mlp_sgd",
        }
    }

    /// Its declaration ([`DP_LINREG_SGD`], [`DP_LOGREG_SGD`], [`DP_MLP_SGD`]).
    pub fn declaration(self) -> &'static Aggregate {
        match self {
            SgdKind::Linear => &DP_LINREG_SGD,
            SgdKind::Logistic => &DP_LOGREG_SGD,
            SgdKind::Mlp => &DP_MLP_SGD,
        }
    }
}

/// The literal parameters of a DP-SGD call.
#[derive(Debug, Clone, PartialEq)]
pub struct SgdParams {
    pub kind: SgdKind,
    pub epsilon: f64,
    pub delta: f64,
    pub hidden: usize,
    pub classes: usize,
    pub sample_rate: f64,
    pub steps: u64,
    pub clip: f64,
    pub learning_rate: f64,
    pub noise: NoiseKind,
    pub neighbours: Neighbours,
}

fn in_range(
    name: &str,
    v: Option<f64>,
    default: f64,
    ok: impl Fn(f64) -> bool,
    expected: &str,
) -> Result<f64, PrivacyError> {
    let v = v.unwrap_or(default);
    if v.is_finite() && ok(v) {
        Ok(v)
    } else {
        Err(PrivacyError::invalid(name, v, expected))
    }
}

/// The smallest sampling rate a DP-SGD call may give (see `from_literals`).
pub const MIN_SAMPLE_RATE: f64 = 1.0 / (1u64 << 30) as f64;

impl SgdParams {
    /// Reads and checks the literals of a `kind` call, and calibrates (an infeasible
    /// configuration fails here, at planning, before any charge).
    pub fn from_literals(kind: SgdKind, args: &[ScalarValue]) -> Result<Self, PrivacyError> {
        let p = Params::new(kind.declaration(), args)?;
        let num = |name| p.number(name);
        let epsilon = p.epsilon()?;
        let delta = p.delta()?;
        let (hidden, classes) = if kind == SgdKind::Mlp {
            let h = in_range(
                "hidden",
                num("hidden")?,
                DEFAULT_HIDDEN,
                |x| (1.0..=f64::from(MAX_HIDDEN)).contains(&x) && x.fract() == 0.0,
                &format!("an integer in [1, {MAX_HIDDEN}]"),
            )?;
            let c = in_range(
                "classes",
                num("classes")?,
                2.0,
                |x| (2.0..=f64::from(MAX_CLASSES)).contains(&x) && x.fract() == 0.0,
                &format!("an integer in [2, {MAX_CLASSES}] (labels 0 … classes − 1)"),
            )?;
            (h as usize, c as usize)
        } else {
            (0, 0)
        };
        let noise = match p.text("noise", NoiseKind::ACCEPTED)? {
            None => NoiseKind::Independent,
            Some(s) => NoiseKind::parse(s).ok_or_else(|| {
                PrivacyError::invalid("noise", format!("'{s}'"), NoiseKind::ACCEPTED)
            })?,
        };
        // 0 (the declared default) leaves q to the noise kind: 0.01 under 'independent'; 'mf'
        // has no sampling (its batches are set by `steps`), so a written rate is refused there
        // rather than ignored.
        let sample_rate = num("sample_rate")?.filter(|&q| q != 0.0);
        if let (Some(q), NoiseKind::Mf) = (sample_rate, noise) {
            return Err(PrivacyError::invalid(
                "sample_rate",
                q,
                "unset with noise => 'mf', which does not sample: it makes one pass in which \
                 every row joins one of `steps` batches (about 1/steps of the rows each); drop \
                 sample_rate and set steps (e.g. steps => 100 for batches of about 1% of the \
                 rows)",
            ));
        }
        let sample_rate = in_range(
            "sample_rate",
            sample_rate,
            DEFAULT_SAMPLE_RATE,
            // At least 2⁻³⁰: the Poisson sampler's gap ⌊ln(1 − U)/ln(1 − q)⌋ with U on a grid of
            // 2⁻⁵³ includes a row with probability at least 2⁻⁵³ whatever q is, so for q near
            // that the accounted q would under-state the real rate (review r45); a rate that
            // small samples nothing anyway.
            |x| (MIN_SAMPLE_RATE..=1.0).contains(&x),
            "0 (the default: 0.01) or a number in [2^-30 ≈ 9.3e-10, 1]",
        )?;
        let steps = in_range(
            "steps",
            num("steps")?,
            0.0,
            |x| (0.0..=MAX_STEPS as f64).contains(&x) && x.fract() == 0.0,
            "0 (automatic) or an integer in [1, 1000000]",
        )? as u64;
        let epochs = in_range(
            "epochs",
            num("epochs")?,
            0.0,
            |x| (0.0..=10_000.0).contains(&x),
            "0 (unset) or a number in (0, 10000]",
        )?;
        let steps = match (steps, epochs > 0.0, noise) {
            (s, true, _) if s > 0 => {
                return Err(PrivacyError::invalid(
                    "epochs",
                    epochs,
                    "0 when `steps` is set (give one of steps and epochs)",
                ));
            }
            (_, true, NoiseKind::Mf) => {
                return Err(PrivacyError::invalid(
                    "epochs",
                    epochs,
                    "0 with noise => 'mf' (one pass; set `steps`, the number of batches)",
                ));
            }
            (_, true, NoiseKind::Independent) => {
                let t = (epochs / sample_rate).ceil();
                if t > MAX_STEPS as f64 {
                    return Err(PrivacyError::invalid(
                        "epochs",
                        epochs,
                        "at most 1000000 steps (epochs / sample_rate)",
                    ));
                }
                t.max(1.0) as u64
            }
            (0, false, NoiseKind::Independent) => DEFAULT_STEPS,
            (0, false, NoiseKind::Mf) => DEFAULT_MF_STEPS,
            (s, false, _) => s,
        };
        let clip = in_range(
            "clip",
            num("clip")?,
            DEFAULT_CLIP,
            |x| x > 0.0 && x <= 1e100,
            "a finite number > 0 (at most 1e100)",
        )?;
        let learning_rate = in_range(
            "learning_rate",
            num("learning_rate")?,
            DEFAULT_LEARNING_RATE,
            |x| x > 0.0 && x <= 1e6,
            "a number in (0, 1e6]",
        )?;
        let neighbours = p.neighbours()?;
        let p = SgdParams {
            kind,
            epsilon,
            delta,
            hidden,
            classes,
            sample_rate,
            steps,
            clip,
            learning_rate,
            noise,
            neighbours,
        };
        p.plan()?;
        Ok(p)
    }

    pub fn family(&self) -> Family {
        match self.kind {
            SgdKind::Linear => Family::Linear,
            SgdKind::Logistic => Family::Logistic,
            SgdKind::Mlp => Family::Mlp {
                hidden: self.hidden,
                classes: self.classes,
            },
        }
    }

    pub fn plan(&self) -> Result<SgdPlan, PrivacyError> {
        SgdPlan::new(
            self.family(),
            self.noise,
            self.epsilon,
            self.delta,
            self.sample_rate,
            self.steps,
            self.clip,
            self.learning_rate,
            self.neighbours,
        )
    }

    pub fn cost(&self) -> Result<Vec<Event>, PrivacyError> {
        Ok(self.plan()?.events)
    }
}

/// The most bytes a DP-SGD fit's working set may take outside the query's memory pool: its
/// vectors of the p parameters (the model, the gradient, its sum, the exact integer sums and
/// the release: at most [`FIT_BYTES_PER_PARAM`] bytes a parameter, rounded outward), and under
/// `noise => 'mf'` the history of every step's exact sum and release, 24·(p + 1) bytes a step
/// (`optim::sgd`, `hist_g` and `hist_y`). Review r45: hidden 4096, classes 1000 and 5000 'mf'
/// steps asked for 490 GB and aborted the process; a 16,000-wide feature column did too.
pub const MAX_FIT_BYTES: u64 = 256 << 20;

/// The working bytes a fit keeps per parameter besides an 'mf' history (see [`MAX_FIT_BYTES`]).
pub const FIT_BYTES_PER_PARAM: u64 = 128;

/// The registry's cost function of `kind`; with `data` (the call's label and features), a fit
/// whose working set would exceed [`MAX_FIT_BYTES`] is refused, before any charge.
pub fn sgd_cost(
    kind: SgdKind,
    data: &[datafusion::logical_expr::Expr],
    params: &[ScalarValue],
) -> Result<Vec<Event>, PrivacyError> {
    let p = SgdParams::from_literals(kind, params)?;
    // `[x1, …, xd]`, or a fixed-size list (the guard gives such a column as a CAST to its type).
    let written = data
        .get(1)
        .and_then(crate::optim::rows::planned_dims_logical);
    let d = written.unwrap_or(crate::optim::rows::FEATURE_WIDTH);
    let params_p = p.family().net(d).params() as u64 + 1;
    let fixed = FIT_BYTES_PER_PARAM.saturating_mul(params_p);
    let per_step = if p.noise == NoiseKind::Mf {
        24 * params_p
    } else {
        0
    };
    let need = fixed.saturating_add(per_step.saturating_mul(p.steps));
    if need > MAX_FIT_BYTES {
        let width = match written {
            Some(_) => String::new(),
            None => ", the widest a query may give: write the features as [x1, …, xd] to count \
                      them"
                .to_string(),
        };
        let what = match per_step {
            0 => format!(
                "a model of at most {} parameters ({} with {d} features{width}): a fit keeps \
                 {FIT_BYTES_PER_PARAM} bytes a parameter, at most {} MiB",
                MAX_FIT_BYTES / FIT_BYTES_PER_PARAM - 1,
                params_p - 1,
                MAX_FIT_BYTES >> 20
            ),
            s => format!(
                "at most {} steps with noise => 'mf' for this model ({} parameters with {d} \
                 features{width}): its history keeps {s} bytes a step, and the fit at most {} \
                 MiB in all. Use fewer steps or a smaller network, or noise => 'independent'",
                MAX_FIT_BYTES.saturating_sub(fixed) / s,
                params_p - 1,
                MAX_FIT_BYTES >> 20
            ),
        };
        let (name, value) = match per_step {
            0 if kind == SgdKind::Mlp => ("hidden", p.hidden as u64),
            0 => ("features", d as u64),
            _ => ("steps", p.steps),
        };
        return Err(PrivacyError::invalid(name, value, &what));
    }
    p.cost()
}

/// What EXPLAIN PRIVACY shows as a DP-SGD call's noise, from its literals alone.
pub fn sgd_noise(kind: SgdKind, params: &[ScalarValue]) -> Option<String> {
    let p = SgdParams::from_literals(kind, params).ok()?;
    let plan = p.plan().ok()?;
    let short = crate::mechanisms::noise::short;
    Some(match p.noise {
        NoiseKind::Independent => {
            let standalone = crate::privacy::sgd::epsilon(
                p.sample_rate,
                plan.noise_multiplier,
                p.steps,
                p.delta,
            )
            .ok()?;
            format!(
                "Gaussian σ = {} per step on the sum of per-example gradients clipped to {} \
                 (noise multiplier {}), Poisson sample rate q = {}, {} steps; standalone ε = {} \
                 at δ = {} (subsampled-Gaussian accountant)",
                short(plan.sigma()),
                short(p.clip),
                short(plan.noise_multiplier),
                short(p.sample_rate),
                p.steps,
                short(standalone),
                short(p.delta)
            )
        }
        NoiseKind::Mf => format!(
            "one pass in {} batches, Gaussian σ = {} per step correlated by the square-root \
             factorisation (sensitivity {} × column norm {}); one Gaussian mechanism, ε = {} \
             at δ = {}",
            p.steps,
            short(plan.sigma()),
            short(plan.sensitivity),
            short(crate::optim::sgd::max_column_norm(p.steps as usize)),
            short(p.epsilon),
            short(p.delta)
        ),
    })
}

/// A DP-SGD UDAF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpSgd {
    kind: SgdKind,
    signature: Signature,
    insecure_seed: Option<u64>,
}

impl DpSgd {
    pub fn new(kind: SgdKind) -> Self {
        let mut names = kind.declaration().argument_names();
        if kind == SgdKind::Linear {
            names[0] = "y";
        }
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Volatile)
                .with_parameter_names(names)
                .expect("user-defined signatures accept parameter names"),
            insecure_seed: None,
        }
    }

    /// INSECURE: noise (and sampling) from a fixed seed, for reproducible tests only. Never
    /// register this in a session that serves real queries.
    pub fn with_insecure_seed(kind: SgdKind, seed: u64) -> Self {
        Self {
            insecure_seed: Some(seed),
            ..Self::new(kind)
        }
    }

    fn params(&self, args: &AccumulatorArgs) -> Result<(SgdParams, bool)> {
        let name = self.kind.name();
        if args.is_distinct {
            return plan_err!("{name} does not support DISTINCT");
        }
        let a = self.kind.declaration();
        let (exprs, key) = split_unit_key(args.exprs, a.data.len(), a.params.len());
        let lits = literal_params(a, exprs)?;
        let p = SgdParams::from_literals(self.kind, &lits).map_err(|e| plan_error(name, e))?;
        check_unit_key(name, p.neighbours.is_units(), key.is_some())?;
        Ok((p, key.is_some()))
    }
}

pub fn dp_linreg_sgd_udaf() -> AggregateUDF {
    AggregateUDF::from(DpSgd::new(SgdKind::Linear))
}
pub fn dp_logreg_sgd_udaf() -> AggregateUDF {
    AggregateUDF::from(DpSgd::new(SgdKind::Logistic))
}
pub fn dp_mlp_sgd_udaf() -> AggregateUDF {
    AggregateUDF::from(DpSgd::new(SgdKind::Mlp))
}

impl AggregateUDFImpl for DpSgd {
    fn name(&self) -> &str {
        self.kind.name()
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let f = self.kind.name();
        let a = self.kind.declaration();
        let names: Vec<&str> = a.params.iter().map(|p| p.name).collect();
        let n = arg_types.len();
        if !(3..=1 + a.unit_key_index()).contains(&n) {
            return plan_err!(
                "{f} takes 3 to {} arguments: {f}(label, features, epsilon[, {}]) (and, set by \
                 the session, neighbours and a privacy-unit key), got {n}",
                1 + names.len(),
                names[1..names.len() - 1].join("[, ")
            );
        }
        let label = match &arg_types[0] {
            DataType::Boolean if self.kind != SgdKind::Linear => DataType::Boolean,
            t if is_number(t) => DataType::Float64,
            t => return plan_err!("{f}: the label must be numeric or boolean, got {t}"),
        };
        let features = coerce_features(f, &arg_types[1])?;
        let mut out = vec![label, features];
        for (p, t) in a.params.iter().zip(&arg_types[2..]) {
            out.push(coerce_param(f, p, t)?);
        }
        if let Some(key) = arg_types.get(a.unit_key_index()) {
            check_key_type(f, key)?;
            out.push(key.clone());
        }
        Ok(out)
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            SgdKind::Mlp => mlp_model_data_type(),
            _ => model_data_type(),
        })
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.model_accumulator(args, None)
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let units = args.input_fields.len() > self.kind.declaration().unit_key_index();
        Ok(RowBuffer::state_fields_for(args.name, units))
    }
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
    fn documentation(&self) -> Option<&Documentation> {
        Some(match self.kind {
            SgdKind::Linear => &DOC_LINREG,
            SgdKind::Logistic => &DOC_LOGREG,
            SgdKind::Mlp => &DOC_MLP,
        })
    }
}

impl ModelUdaf for DpSgd {
    fn model_accumulator(
        &self,
        args: AccumulatorArgs,
        spread: Option<usize>,
    ) -> Result<Box<dyn Accumulator>> {
        let (params, units) = self.params(&args)?;
        let plan = params.plan().map_err(|e| plan_error(self.kind.name(), e))?;
        let kind = match (self.kind, params.classes) {
            (SgdKind::Linear, _) => LabelKind::Real,
            (SgdKind::Mlp, c) if c > 2 => LabelKind::Real,
            _ => LabelKind::Binary,
        };
        // The planned feature count (the query's, never the rows': round 48), or no accumulator:
        // the network's shape (its `inputs`) is fixed before any row is read.
        let mut buffer = RowBuffer::planned(
            self.kind.name(),
            kind,
            args.exprs.get(1),
            args.expr_fields.get(1).map(|f| f.as_ref()),
            spread,
        )?;
        if units {
            buffer = buffer.with_units();
        }
        Ok(Box::new(SgdAccumulator {
            kind: self.kind,
            buffer,
            params,
            plan,
            insecure_seed: self.insecure_seed,
        }))
    }
}

#[derive(Debug)]
struct SgdAccumulator {
    kind: SgdKind,
    buffer: RowBuffer,
    params: SgdParams,
    plan: SgdPlan,
    insecure_seed: Option<u64>,
}

impl Accumulator for SgdAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.buffer
            .update_values(values, self.kind.declaration().unit_key_index())
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.buffer.merge(states)
    }
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.buffer.state()
    }
    fn evaluate(&mut self) -> Result<ScalarValue> {
        let mut rng = match self.insecure_seed {
            Some(s) => SecureRng::insecure_from_seed(s),
            None => SecureRng::from_os_entropy(),
        };
        let name = self.kind.name();
        let units = self.buffer.group_units();
        let fit = self
            .plan
            .fit(self.buffer.rows(), units.as_ref(), &mut rng, name)?;
        if fit.cancelled {
            return Err(crate::progress::cancelled_error(name));
        }
        let mechanism = match self.params.noise {
            NoiseKind::Independent => "dp-sgd",
            NoiseKind::Mf => "dp-sgd-mf",
        };
        let iterations = u32::try_from(fit.steps).unwrap_or(u32::MAX);
        Ok(match self.kind {
            SgdKind::Mlp => MlpModel {
                inputs: u32::try_from(self.buffer.dims()).unwrap_or(u32::MAX),
                hidden: self.params.hidden as u32,
                classes: self.params.classes as u32,
                weights: fit.theta,
                iterations,
                epsilon: self.params.epsilon,
                delta: self.params.delta,
                mechanism: mechanism.into(),
            }
            .to_scalar(),
            _ => {
                let d = fit.theta.len() - 1;
                Model {
                    coefficients: fit.theta[..d].to_vec(),
                    intercept: fit.theta[d],
                    iterations,
                    epsilon: self.params.epsilon,
                    delta: self.params.delta,
                    mechanism: mechanism.into(),
                }
                .to_scalar()
            }
        })
    }
    /// The buffer, what regrouping it by privacy unit holds ([`RowBuffer::group_units_bytes`])
    /// and under `'mf'` the batches ([`SgdPlan::rows_bytes`]), all allocated by `evaluate`
    /// after DataFusion's last look at this size (round 51, review "sgd", F1: they were left
    /// out, so a unit-table fit used 3–4 times the pool after its charge). The fit's
    /// per-parameter working set is bounded at planning instead ([`MAX_FIT_BYTES`]). A function
    /// of n, d, the keys' bytes and the literals, never of values.
    fn size(&self) -> usize {
        let n = self.buffer.rows().n();
        self.buffer
            .accumulator_size::<Self>(self.plan.rows_bytes(n))
    }
}

const SGD_ARGS: &str = "sample_rate: Poisson rate q in (0, 1] (0, the default: 0.01; 'independent' \
     only, refused with 'mf'); steps: T (0, the default: 1000, or 100 with 'mf'); epochs: instead of steps, T = ceil(epochs/q); clip: L2 \
     bound of each example's whole gradient (default 1); learning_rate: step on the mean \
     clipped gradient (default 0.5); noise: 'independent' (Poisson DP-SGD, default) or 'mf' \
     (one pass, correlated noise).";

fn doc(kind: SgdKind, description: &str, syntax: &str, example: &str) -> Documentation {
    let mut b = Documentation::builder(DOC_SECTION_DP, description.to_string(), syntax.to_string())
        .with_argument(
            if kind == SgdKind::Linear {
                "y"
            } else {
                "label"
            },
            match kind {
                SgdKind::Linear => "Numeric target.",
                SgdKind::Logistic => "0/1 numbers or booleans.",
                SgdKind::Mlp => "Class 0 … classes − 1 (0/1 or boolean for two classes).",
            },
        )
        .with_argument(
            "features",
            "List of numbers per row; standardised features (mean 0, sd 1) suit the defaults.",
        )
        .with_argument("epsilon", "Literal ε > 0.")
        .with_argument(
            "delta",
            "Literal δ in (0, 1); defaults to the session's dpfusion.default_delta.",
        );
    if kind == SgdKind::Mlp {
        b = b
            .with_argument("hidden", "Hidden ReLU units, 1 to 4096 (default 32).")
            .with_argument(
                "classes",
                "Number of classes, 2 to 1000 (default 2; MAX_CLASSES).",
            );
    }
    b.with_argument(
        "sample_rate, steps, epochs, clip, learning_rate, noise",
        SGD_ARGS,
    )
    .with_sql_example(example)
    .build()
}

static DOC_LINREG: LazyLock<Documentation> = LazyLock::new(|| {
    doc(
        SgdKind::Linear,
        "Linear regression by DP-SGD: Poisson-subsampled batches, per-example clipping, Gaussian \
         noise per step, subsampled-Gaussian accounting (or one pass with correlated noise, \
         noise => 'mf'). Returns the model struct; predict with linreg_predict.",
        "dp_linreg_sgd(y, features, epsilon[, delta[, sample_rate[, steps[, epochs[, clip[, \
         learning_rate[, noise]]]]]]])",
        "SELECT dp_linreg_sgd(price, [area, rooms], 1.0, 1e-6) AS model FROM houses;",
    )
});
static DOC_LOGREG: LazyLock<Documentation> = LazyLock::new(|| {
    doc(
        SgdKind::Logistic,
        "Logistic regression by DP-SGD (as dp_linreg_sgd, log loss). Returns the model struct; \
         predict with logreg_predict_proba.",
        "dp_logreg_sgd(label, features, epsilon[, delta[, sample_rate[, steps[, epochs[, clip[, \
         learning_rate[, noise]]]]]]])",
        "SELECT dp_logreg_sgd(churned, [age, tenure], 1.0, 1e-6, sample_rate => 0.02) AS model \
         FROM customers;",
    )
});
static DOC_MLP: LazyLock<Documentation> = LazyLock::new(|| {
    doc(
        SgdKind::Mlp,
        "A neural network with one hidden ReLU layer (sigmoid output for two classes, softmax \
         for more) trained by DP-SGD with per-example clipping of the whole gradient. Returns \
         the network struct; predict with mlp_predict_proba / mlp_predict.",
        "dp_mlp_sgd(label, features, epsilon[, delta[, hidden[, classes[, sample_rate[, steps[, \
         epochs[, clip[, learning_rate[, noise]]]]]]]]])",
        "SELECT dp_mlp_sgd(digit, pixels, 1.0, 1e-6, classes => 10) AS net FROM images;",
    )
});

/// The declaration of `dp_linreg_sgd` (listed in [`super::registry::AGGREGATES`]).
pub const DP_LINREG_SGD: Aggregate = Aggregate {
    name: "dp_linreg_sgd",
    summary: "a linear model fitted by DP-SGD (Poisson sampling, or 'mf' correlated noise)",
    data: MODEL_DATA,
    params: SGD_PARAMS,
    requirements: &[],
    units: UnitRule::PerUnit,
    replaces: &[],
    internal: false,
    udaf: dp_linreg_sgd_udaf,
    seeded: |seed| super::dp_models_sgd::DpSgd::with_insecure_seed(SgdKind::Linear, seed).into(),
    cost: |d, p| sgd_cost(SgdKind::Linear, d, p),
    noise: |p| sgd_noise(SgdKind::Linear, p),
};

/// The declaration of `dp_logreg_sgd` (listed in [`super::registry::AGGREGATES`]).
pub const DP_LOGREG_SGD: Aggregate = Aggregate {
    name: "dp_logreg_sgd",
    summary: "a logistic model fitted by DP-SGD (Poisson sampling, or 'mf' correlated noise)",
    data: MODEL_DATA,
    params: SGD_PARAMS,
    requirements: &[],
    units: UnitRule::PerUnit,
    replaces: &[],
    internal: false,
    udaf: dp_logreg_sgd_udaf,
    seeded: |seed| super::dp_models_sgd::DpSgd::with_insecure_seed(SgdKind::Logistic, seed).into(),
    cost: |d, p| sgd_cost(SgdKind::Logistic, d, p),
    noise: |p| sgd_noise(SgdKind::Logistic, p),
};

/// The declaration of `dp_mlp_sgd` (listed in [`super::registry::AGGREGATES`]).
pub const DP_MLP_SGD: Aggregate = Aggregate {
    name: "dp_mlp_sgd",
    summary: "a one-hidden-layer ReLU network fitted by DP-SGD",
    data: MODEL_DATA,
    params: &[
        EPSILON,
        DELTA,
        declaration::number(
            "hidden",
            declaration::Default::Number("32"),
            "hidden ReLU units",
        ),
        declaration::number(
            "classes",
            declaration::Default::Number("2"),
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
    units: UnitRule::PerUnit,
    replaces: &[],
    internal: false,
    udaf: dp_mlp_sgd_udaf,
    seeded: |seed| super::dp_models_sgd::DpSgd::with_insecure_seed(SgdKind::Mlp, seed).into(),
    cost: |d, p| sgd_cost(SgdKind::Mlp, d, p),
    noise: |p| sgd_noise(SgdKind::Mlp, p),
};

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: f64) -> ScalarValue {
        ScalarValue::Float64(Some(v))
    }
    fn s(v: &str) -> ScalarValue {
        ScalarValue::Utf8(Some(v.into()))
    }

    /// EXPLAIN PRIVACY of a Poisson fit: σ per step, q, T and the standalone ε (numbers from
    /// the accountant, so checked against it here rather than in the .slt files).
    #[test]
    fn poisson_cost_and_explain_agree_with_the_accountant() {
        // epsilon, delta, sample_rate, steps
        let lits = [f(1.0), f(1e-6), f(0.05), f(200.0)];
        let p = SgdParams::from_literals(SgdKind::Logistic, &lits).unwrap();
        let z = crate::privacy::sgd::noise_multiplier(0.05, 200, 1.0, 1e-6).unwrap();
        let ev = p.cost().unwrap();
        assert_eq!(
            ev,
            vec![Event::SubsampledGaussian {
                sample_rate: 0.05,
                noise_multiplier: z,
                steps: 200
            }]
        );
        assert!(crate::privacy::sgd::epsilon(0.05, z, 200, 1e-6).unwrap() <= 1.0);
        let plan = p.plan().unwrap();
        // σ on the grid: at least z·clip, within a hair of it.
        assert!(plan.sigma() >= z && plan.sigma() < z * 1.001);
        let text = sgd_noise(SgdKind::Logistic, &lits).unwrap();
        let short = crate::mechanisms::noise::short;
        assert!(
            text.starts_with(&format!("Gaussian σ = {} per step", short(plan.sigma()))),
            "{text}"
        );
        assert!(
            text.contains("Poisson sample rate q = 0.05, 200 steps; standalone ε = "),
            "{text}"
        );
        // epochs: T = ⌈epochs/q⌉.
        let e = SgdParams::from_literals(
            SgdKind::Logistic,
            &[f(1.0), f(1e-6), f(0.05), f(0.0), f(3.0)],
        )
        .unwrap();
        assert_eq!(e.steps, 60);
    }

    #[test]
    fn refusals_name_the_argument() {
        let err = |kind, lits: &[ScalarValue]| {
            SgdParams::from_literals(kind, lits)
                .unwrap_err()
                .to_string()
        };
        // Replace neighbours: Poisson refused with the owner's options, 'mf' accepted.
        let mut lits = vec![f(1.0), f(1e-6), f(0.0), f(0.0), f(0.0), f(1.0), f(0.5)];
        lits.extend([s("independent"), s("replace")]);
        assert!(err(SgdKind::Logistic, &lits).contains("noise => 'mf'"));
        lits[7] = s("mf");
        let mf = SgdParams::from_literals(SgdKind::Logistic, &lits).unwrap();
        assert_eq!(mf.steps, DEFAULT_MF_STEPS);
        assert_eq!(mf.plan().unwrap().sensitivity, 2.0);
        assert!(err(SgdKind::Mlp, &[f(1.0), f(1e-6), f(32.0), f(1.0)]).contains("classes"));
        assert!(err(SgdKind::Linear, &[f(1.0), f(1e-6), f(1.5)]).contains("sample_rate"));
        // Review r45: a rate the sampler cannot draw (it includes a row with probability at
        // least 2⁻⁵³) is refused; the smallest accepted one works.
        assert!(err(SgdKind::Linear, &[f(1.0), f(1e-6), f(1e-300)]).contains("2^-30"));
        assert!(
            SgdParams::from_literals(SgdKind::Linear, &[f(1.0), f(1e-6), f(MIN_SAMPLE_RATE)])
                .is_ok()
        );
    }

    /// Review r45: a fit keeps its working set outside the memory pool (128 bytes a parameter,
    /// and under 'mf' 24·(p + 1) bytes a step); one past [`MAX_FIT_BYTES`] is refused at
    /// planning (before any charge), counting the written features, a fixed-size list's width
    /// (the guard gives such a column as a CAST to its type), or else the widest list a query
    /// may give.
    #[test]
    fn a_fit_past_its_working_set_is_refused_at_planning() {
        use datafusion::arrow::datatypes::{DataType, Field};
        use datafusion::logical_expr::{Cast, Expr, col};
        let two = datafusion::functions_nested::expr_fn::make_array(vec![col("x"), col("y")]);
        let wide = Expr::Cast(Cast::new(
            Box::new(col("xs")),
            DataType::FixedSizeList(
                std::sync::Arc::new(Field::new("item", DataType::Float64, true)),
                16_000,
            ),
        ));
        let mlp = |features: &Expr, hidden: f64, classes: f64, steps: f64, noise: &str| {
            let lits = [
                f(1.0),
                f(1e-6),
                f(hidden),
                f(classes),
                f(0.0),
                f(steps),
                f(0.0),
                f(1.0),
                f(0.5),
                s(noise),
            ];
            sgd_cost(SgdKind::Mlp, &[col("label"), features.clone()], &lits)
        };
        // 4096·2 + 4096 + 1000·4096 + 1000 parameters: 128 bytes each is past 256 MiB.
        let e = mlp(&two, 4096.0, 1000.0, 2.0, "independent")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'hidden'") && e.contains("parameters"), "{e}");
        // 512·2 + 512 + 10·512 + 10 = 6,666 parameters: 'mf' keeps 160 kB a step.
        assert!(mlp(&two, 512.0, 10.0, 1000.0, "mf").is_ok());
        let e = mlp(&two, 512.0, 10.0, 5000.0, "mf")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'steps'") && e.contains("history"), "{e}");
        // A 16,000-wide column counts as 16,000 features, not as the widest written list.
        let e = mlp(&wide, 32.0, 2.0, 100.0, "mf").unwrap_err().to_string();
        assert!(e.contains("16000 features"), "{e}");
        assert!(mlp(&wide, 32.0, 2.0, 10.0, "mf").is_ok());
        // Features not written out count as the widest list (1,024): a linear model still fits
        // its largest 'mf' run.
        let lin = [
            f(1.0),
            f(1e-6),
            f(0.0),
            f(5000.0),
            f(0.0),
            f(1.0),
            f(0.5),
            s("mf"),
        ];
        assert!(sgd_cost(SgdKind::Linear, &[col("y"), col("xs")], &lin).is_ok());
    }

    /// 'mf' does not sample: a written sample_rate is refused (saying what to write), never
    /// silently ignored; 0, the declared default, leaves q to the noise kind (0.01 Poisson).
    #[test]
    fn mf_refuses_a_written_sample_rate() {
        let call = |q: f64, noise: &str| {
            let lits = [
                f(1.0),
                f(1e-6),
                f(q),
                f(50.0),
                f(0.0),
                f(1.0),
                f(0.5),
                s(noise),
            ];
            SgdParams::from_literals(SgdKind::Logistic, &lits)
        };
        for q in [0.01, 0.02, 1.0] {
            let e = call(q, "mf").unwrap_err().to_string();
            assert!(
                e.contains("'sample_rate'") && e.contains("set steps"),
                "{q}: {e}"
            );
        }
        let mf = call(0.0, "mf").unwrap();
        assert_eq!((mf.steps, mf.plan().unwrap().sample_rate), (50, 1.0 / 50.0));
        assert_eq!(
            call(0.0, "independent").unwrap().sample_rate,
            DEFAULT_SAMPLE_RATE
        );
        assert_eq!(call(0.02, "independent").unwrap().sample_rate, 0.02);
    }

    /// 'mf': one Gaussian mechanism with μ = gaussian_mu(ε, δ) and σ ≥ clip·‖C e₁‖/μ.
    #[test]
    fn mf_is_one_gaussian_mechanism() {
        let mut lits = vec![f(0.5), f(1e-6), f(0.0), f(50.0), f(0.0), f(1.0), f(0.5)];
        lits.push(s("mf"));
        let p = SgdParams::from_literals(SgdKind::Logistic, &lits).unwrap();
        let mu = crate::privacy::gaussian_mu(0.5, 1e-6).unwrap();
        assert_eq!(p.cost().unwrap(), vec![Event::Gaussian { mu }]);
        let col = crate::optim::sgd::max_column_norm(50);
        let sigma = p.plan().unwrap().sigma();
        assert!(sigma >= col / mu && sigma < col / mu * 1.001, "{sigma}");
    }

    /// Round 51, review "sgd", F1: a DP-SGD accumulator's size counts what `evaluate` allocates
    /// in proportion to the rows after DataFusion's last look at it: under privacy units the
    /// regrouping ([`RowBuffer::group_units_bytes`], the sum every model fit counts through
    /// [`RowBuffer::accumulator_size`]), and under 'mf' the batches, 4 bytes a unit twice and
    /// T + 1 offsets. Both fits then run within what was counted.
    #[test]
    fn size_covers_the_regrouping_and_the_mf_batches() {
        use datafusion::arrow::array::{Array, Float64Array, Int64Array, ListArray};
        use datafusion::arrow::datatypes::Float64Type;
        use std::sync::Arc;
        let (n, d, steps) = (1024usize, 3usize, 40usize);
        let batch = |units: bool| {
            let y: ArrayRef = Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| (i % 2) as f64),
            ));
            let x: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(
                (0..n).map(|i| Some(vec![Some(i as f64 / n as f64); d])),
            ));
            let mut v = vec![y, x];
            if units {
                let at = SgdKind::Logistic.declaration().unit_key_index();
                v.extend(std::iter::repeat_n(
                    Arc::new(Int64Array::from(vec![0i64; n])) as ArrayRef,
                    at - 2,
                ));
                v.push(Arc::new(Int64Array::from_iter_values(
                    (0..n as i64).map(|i| i / 3),
                )));
            }
            v
        };
        let acc = |noise: &str, units: bool| {
            let mut lits = vec![f(1.0), f(1e-6), f(0.0), f(steps as f64), f(0.0), f(1.0)];
            lits.extend([f(0.5), s(noise)]);
            if units {
                lits.push(s("units:1:1"));
            }
            let params = SgdParams::from_literals(SgdKind::Logistic, &lits).unwrap();
            let mut buffer = RowBuffer::new(LabelKind::Binary, d);
            if units {
                buffer = buffer.with_units();
            }
            let mut a = SgdAccumulator {
                kind: SgdKind::Logistic,
                buffer,
                plan: params.plan().unwrap(),
                params,
                insecure_seed: Some(3),
            };
            a.update_batch(&batch(units)).unwrap();
            assert_eq!(a.buffer.rows().n(), n);
            a
        };
        let fixed = size_of::<SgdAccumulator>() - size_of::<RowBuffer>();
        // Row level, Poisson: the rows alone.
        let plain = acc("independent", false);
        assert_eq!(plain.size(), plain.buffer.size() + fixed);
        // Units: the regrouping too, at least its copies of labels, features, keys and their
        // ends, the dense unit index and the permutation, and no more than the key map's
        // ~100 bytes a row beyond them.
        let mut keyed = acc("independent", true);
        let regroup = keyed.size() - keyed.buffer.size() - fixed;
        assert_eq!(regroup, keyed.buffer.group_units_bytes());
        let copies = n * 8 * (d + 1) + n * 9 + n * 8; // an Int64 key: a null byte and 8
        assert!(regroup >= copies + n * (4 + 8), "{regroup} < {copies}");
        assert!(regroup <= copies + 120 * n, "{regroup}");
        // 'mf': the batches on top, exactly.
        let mut mf = acc("mf", true);
        assert_eq!(
            mf.size() - keyed.size(),
            2 * n * size_of::<u32>() + (steps + 1) * size_of::<usize>()
        );
        let row_mf = acc("mf", false);
        assert_eq!(row_mf.size() - plain.size(), mf.size() - keyed.size());
        for a in [&mut keyed, &mut mf] {
            let ScalarValue::Struct(m) = a.evaluate().unwrap() else {
                panic!("a model struct")
            };
            assert!(!m.is_null(0));
        }
    }

    /// Round 51, review "sgd", F1, end to end: with a memory pool that holds the rows of a
    /// unit-level DP-SGD fit but not their regrouping, the fit fails with the pool's error (in
    /// a dpfusion session, the fixed resource message) instead of regrouping outside the pool;
    /// the same rows at row level (no regrouping) fit in the same pool. 300,000 rows of one
    /// feature and distinct Int64 keys: about 33 bytes a row buffered (at most twice that with
    /// the vectors' growth, under 20 MB), 104 more to regroup (31 MB); the pool is 32 MiB.
    #[tokio::test]
    async fn a_unit_fit_whose_regrouping_passes_the_pool_fails() {
        use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
        use datafusion::datasource::MemTable;
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::prelude::{SessionConfig, SessionContext};
        use std::sync::Arc;
        let n = 300_000usize;
        let batches: Vec<RecordBatch> = (0..n)
            .step_by(8192)
            .map(|at| {
                let r = at..(at + 8192).min(n);
                RecordBatch::try_from_iter([
                    (
                        "u",
                        Arc::new(Int64Array::from_iter_values(r.clone().map(|i| i as i64)))
                            as ArrayRef,
                    ),
                    (
                        "c",
                        Arc::new(Float64Array::from_iter_values(
                            r.clone().map(|i| (i % 2) as f64),
                        )),
                    ),
                    (
                        "x",
                        Arc::new(Float64Array::from_iter_values(
                            r.map(|i| (i % 7) as f64 - 3.0),
                        )),
                    ),
                ])
                .unwrap()
            })
            .collect();
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(GreedyMemoryPool::new(32 << 20)))
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(
            SessionConfig::new().with_target_partitions(1),
            runtime,
        );
        crate::register_all(&ctx);
        let schema = batches[0].schema();
        ctx.register_table(
            "t",
            Arc::new(MemTable::try_new(schema, vec![batches]).unwrap()),
        )
        .unwrap();
        let fit = |tail: &str| {
            format!(
                "SELECT dp_logreg_sgd(c, [x], 1.0, 1e-6, 0, 1, 0, 1, 0.5, 'independent'{tail}) \
                 FROM t"
            )
        };
        let run = |sql: String| {
            let ctx = ctx.clone();
            async move { ctx.sql(&sql).await?.collect().await }
        };
        run(fit(""))
            .await
            .expect("row level: the rows fit the pool");
        let err = run(fit(", 'units:1:1', u"))
            .await
            .expect_err("the regrouping is counted")
            .to_string();
        assert!(err.contains("Resources exhausted"), "{err}");
    }
}
