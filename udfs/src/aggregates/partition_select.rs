//! `dp_partition_select(value, epsilon[, delta])` → Boolean: Gaussian partition selection.
//! Internal: the session's GROUP BY rewrite keeps a group only when this is true, so that the
//! set of released groups is itself differentially private (PRIVACY.md, "What may be released").
//!
//! # Mechanism
//! For each group, the number c of rows reaching the aggregate (after its FILTER; NULL values
//! included: `value` only gives the aggregate an argument) is released as c̃ = c + noise by the
//! Gaussian mechanism of sensitivity 1 and μ = gaussian_mu(ε, δ/2) (actual σ ≥ 1/μ), and the group
//! is kept iff c̃ ≥ τ with
//!
//! τ = 1 + σ·Φ⁻¹(1 − δ/2) + 3g,
//!
//! g the mechanism's power-of-two grid (g ≈ σ·2^−20). This is the Gaussian thresholding of
//! Desfontaines, Voss, Gipson and Mandayam, "Differentially private partition selection"
//! (PoPETs 2022), as in Google's ZetaSQL/differential-privacy libraries.
//!
//! # Cost: `[Gaussian { μ }, Delta { δ/2 }]`
//! Let D' = D plus one row r (add/remove neighbours; removal is symmetric), r in group k.
//! - If k exists in D, only c_k changes, by 1: the vector of noisy counts is a μ-GDP release,
//!   and the kept set with its decisions is post-processing of it.
//! - If k is new (c_k = 1 in D', absent from D), every other group has the same count in both,
//!   so the outputs differ only through the event "k is kept", whose probability is at most δ/2:
//!   with the continuous Gaussian, P[1 + σZ ≥ 1 + σΦ⁻¹(1 − δ/2)] = Φ(−Φ⁻¹(1 − δ/2)) = δ/2.
//!
//! So the selection is (ε', δ' + δ/2)-DP for every (ε', δ') on the μ-GDP curve: the profile is the
//! Gaussian event plus an additive δ/2, and at δ the call is (ε, δ)-DP since μ is calibrated at δ/2.
//!
//! The noise is discrete (g·Y, Y a discrete Gaussian of parameter s = σ/g, and c is rounded to the
//! grid first, which moves it by at most g/2), so the δ/2 bound uses the tail bound
//! P[Y ≥ m] ≤ P[N(0, s²) ≥ m − 1] for integers m ≥ 1 (Canonne, Kamath, Steinke 2020): the
//! numerator Σ_{y≥m} e^{−y²/2s²} ≤ ∫_{m−1}^∞ e^{−x²/2s²} dx since the density decreases on
//! [y − 1, y], and the normaliser Σ_{y∈ℤ} e^{−y²/2s²} = s√(2π)·Σ_k e^{−2π²s²k²} ≥ s√(2π) (Poisson
//! summation). Hence P[keep | c = 1] ≤ Φ(−(τ − 1 − 3g/2)/σ) ≤ δ/2; the remaining 1.5g ≫ the
//! floating-point error of τ.
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, BooleanArray};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, Signature,
};

use super::accumulator::{DpAccumulator, DpGroups, Finalise, Partial, Shape};
use super::common::{DOC_SECTION_DP, DataArg, Fin, call_literals, coerce_args, dp_signature};
use super::exact::{FixedPoint, release_exact};
use super::params::{PartitionSelectParams, plan_error};
use crate::mechanisms::GaussianMechanism;
use crate::noise::SecureRng;
use crate::privacy::PrivacyError;
use crate::privacy::normal::phi_inv;

const SHAPE: Shape = Shape {
    sum: false,
    count: false,
    rows: true,
};

/// The `dp_partition_select` UDAF (internal).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DpPartitionSelect {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
}

impl Default for DpPartitionSelect {
    fn default() -> Self {
        Self::new()
    }
}

impl DpPartitionSelect {
    pub const NAME: &'static str = "dp_partition_select";

    pub fn new() -> Self {
        Self {
            signature: dp_signature(&PartitionSelectParams::NAMES),
            insecure_seed: None,
        }
    }

    /// INSECURE: noise from a fixed seed, for reproducible tests. Never register this in a
    /// session that serves real queries.
    pub fn with_insecure_seed(seed: u64) -> Self {
        Self {
            insecure_seed: Some(seed),
            ..Self::new()
        }
    }

    fn finaliser(&self, args: &AccumulatorArgs) -> Result<Fin> {
        let lits = call_literals(Self::NAME, &PartitionSelectParams::NAMES, args)?;
        let p =
            PartitionSelectParams::from_literals(&lits).map_err(|e| plan_error(Self::NAME, e))?;
        Ok(Arc::new(
            SelectRelease::new(&p).map_err(|e| plan_error(Self::NAME, e))?,
        ))
    }
}

/// `dp_partition_select` as an [`AggregateUDF`].
pub fn dp_partition_select_udaf() -> AggregateUDF {
    AggregateUDF::from(DpPartitionSelect::new())
}

/// The release of a `dp_partition_select` call.
#[derive(Debug, Clone)]
pub(crate) struct SelectRelease {
    pub mech: GaussianMechanism,
    /// τ: keep iff the noisy count is ≥ τ.
    pub threshold: f64,
}

/// τ = 1 + σ·Φ⁻¹(1 − δ/2) + 3g (module docs). Φ⁻¹(1 − δ/2) is computed as −Φ⁻¹(δ/2), which
/// keeps full precision for small δ.
pub(crate) fn threshold(sigma: f64, granularity: f64, delta: f64) -> f64 {
    1.0 + sigma * -phi_inv(delta / 2.0) + 3.0 * granularity
}

impl SelectRelease {
    pub fn new(p: &PartitionSelectParams) -> Result<Self, PrivacyError> {
        let mech = GaussianMechanism::from_mu(p.mu()?, 1.0)?;
        Ok(Self {
            threshold: threshold(mech.sigma, mech.granularity, p.delta),
            mech,
        })
    }
}

impl Finalise for SelectRelease {
    fn shape(&self) -> Shape {
        SHAPE
    }
    fn fixed_point(&self) -> Option<FixedPoint> {
        None
    }
    fn finalise(&self, rng: &mut SecureRng, partials: &[Partial]) -> Result<ArrayRef> {
        let out = partials
            .iter()
            .map(|p| Ok(release_exact(&self.mech, rng, p.rows as i128, 0)? >= self.threshold))
            .collect::<Result<Vec<bool>>>()?;
        Ok(Arc::new(BooleanArray::from(out)))
    }
}

impl AggregateUDFImpl for DpPartitionSelect {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_args(
            Self::NAME,
            DataArg::Any,
            &PartitionSelectParams::NAMES,
            1,
            arg_types,
        )
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(DpAccumulator::new(
            self.finaliser(&args)?,
            self.insecure_seed,
        )?))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(SHAPE.state_fields(args.name))
    }
    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        !args.is_distinct
    }
    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(DpGroups::new(
            self.finaliser(&args)?,
            self.insecure_seed,
        )?))
    }
    /// The result does not depend on row order (exact integer partials).
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOC)
    }
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        DOC_SECTION_DP,
        "Internal (used by the dpfusion session's GROUP BY rewrite): Gaussian partition \
         selection. True iff the group's row count plus discrete Gaussian noise (σ = 1/μ, \
         μ = gaussian_mu(epsilon, delta/2)) reaches 1 + σ·Φ⁻¹(1 − delta/2) (plus three grid \
         steps), so that a group made of a single row is released with probability at most \
         delta/2 (Desfontaines et al., PoPETs 2022). Cost: μ-GDP plus an additive delta/2; \
         (epsilon, delta)-DP in total.",
        "dp_partition_select(value, epsilon[, delta])",
    )
    .with_argument(
        "value",
        "Any column; every row of the group counts, NULLs included.",
    )
    .with_argument("epsilon", "Literal ε > 0 (finite).")
    .with_argument("delta", "Literal δ in (0, 1); defaults to 1e-7.")
    .with_sql_example(
        "SELECT job, dp_count(job, 0.5) FROM salaries GROUP BY job \
         HAVING dp_partition_select(job, 0.5, 1e-6);",
    )
    .build()
});
