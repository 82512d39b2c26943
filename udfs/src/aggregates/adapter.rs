//! The one `AggregateUDFImpl` of the DP aggregates that release from exact partials
//! (`dp_count`, `dp_sum`, `dp_mean`, `dp_partition_select`).
//!
//! What differs between them is a [`Spec`] (return type, data-argument kind, state shape, how to
//! build the release from the literal parameters, the documentation text), declared beside the
//! function's release and reached through its parameter struct ([`DpFunction`]). The name, the
//! parameter names (signature), the number of required parameters and the argument docs are read
//! from the function's [`registry`] entry, so they cannot drift from what named arguments, the
//! guard and the REPL read. [`DpUdaf<P>`] implements the rest once: coercion, the accumulators
//! (`DpAccumulator`, `DpGroups`), the state fields and the documentation.
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, Signature,
    Volatility,
};

use super::accumulator::{DpAccumulator, DpGroups, Shape};
use super::common::{DOC_SECTION_DP, DataArg, Fin, call_literals, coerce_args};
use super::declaration::{Aggregate, Default as ParamDefault};
use super::params::plan_error;
use crate::privacy::PrivacyError;

/// What one DP aggregate adds to the adapter (everything else comes from its registry entry).
#[derive(Debug)]
pub struct Spec {
    /// What the data column accepts.
    pub(crate) data: DataArg,
    pub(crate) returns: DataType,
    /// The exact partials kept per group (what the release's `Finalise::shape` returns).
    pub(crate) shape: Shape,
    /// The release of a call, from its literal parameters in positional order (planning errors
    /// are prefixed with the function name by the adapter).
    pub(crate) release: fn(&[ScalarValue]) -> Result<Fin, PrivacyError>,
    /// What it releases and how (the documentation's description).
    pub(crate) description: &'static str,
    pub(crate) example: &'static str,
    pub(crate) related: &'static [&'static str],
}

/// A DP aggregate served by [`DpUdaf`], implemented by its parameter struct.
pub trait DpFunction: 'static {
    /// The SQL name, as declared in [`super::registry::AGGREGATES`].
    const NAME: &'static str;
    #[doc(hidden)]
    fn spec() -> &'static Spec;
    /// Its declaration (in its own file; [`super::registry::AGGREGATES`] lists it).
    fn declaration() -> &'static Aggregate;
}

/// The UDAF of the DP aggregate whose parameter struct is `P` (e.g. `DpUdaf<CountParams>`, alias
/// [`super::DpCount`]).
pub struct DpUdaf<P> {
    signature: Signature,
    /// Fixed noise seed, for reproducible tests only (Rust API; never reachable from SQL).
    insecure_seed: Option<u64>,
    doc: Documentation,
    _function: PhantomData<fn() -> P>,
}

impl<P: DpFunction> DpUdaf<P> {
    pub const NAME: &'static str = P::NAME;

    pub fn new() -> Self {
        let a = P::declaration();
        let data = a.data.iter().map(|d| d.name);
        let names = data.chain(a.params.iter().map(|p| p.name)).collect();
        Self {
            signature: Signature::user_defined(Volatility::Volatile)
                .with_parameter_names(names)
                .expect("user-defined signatures accept parameter names"),
            insecure_seed: None,
            doc: documentation(P::spec(), a),
            _function: PhantomData,
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

    /// As an [`AggregateUDF`].
    pub fn udaf() -> AggregateUDF {
        AggregateUDF::from(Self::new())
    }

    fn finaliser(&self, args: &AccumulatorArgs) -> Result<Fin> {
        let lits = call_literals(P::declaration(), args)?;
        (P::spec().release)(&lits).map_err(|e| plan_error(P::NAME, e))
    }
}

/// `Debug`, `PartialEq`, `Eq` and `Hash` for a UDAF struct `$t<P>` with fields `signature` and
/// `insecure_seed`: equal when the function and the seed are, so a seeded UDAF never equals the
/// real one.
macro_rules! identity_by_signature_and_seed {
    ($t:ident) => {
        impl<P> fmt::Debug for $t<P> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("signature", &self.signature)
                    .field("insecure_seed", &self.insecure_seed)
                    .finish_non_exhaustive()
            }
        }

        impl<P> PartialEq for $t<P> {
            fn eq(&self, other: &Self) -> bool {
                self.signature == other.signature && self.insecure_seed == other.insecure_seed
            }
        }

        impl<P> Eq for $t<P> {}

        impl<P> Hash for $t<P> {
            fn hash<H: Hasher>(&self, state: &mut H) {
                self.signature.hash(state);
                self.insecure_seed.hash(state);
            }
        }
    };
}
pub(crate) use identity_by_signature_and_seed;

/// The documentation: description and example from the spec, syntax and arguments from the
/// registry entry.
fn documentation(spec: &Spec, a: &Aggregate) -> Documentation {
    documentation_for(spec.data, spec.description, spec.example, spec.related, a)
}

/// The documentation of a function served from a release's [`Spec`] (also the `_ci` variants,
/// [`super::interval`]).
pub(crate) fn documentation_for(
    data: DataArg,
    description: &str,
    example: &str,
    related: &[&str],
    a: &Aggregate,
) -> Documentation {
    let mut b = Documentation::builder(DOC_SECTION_DP, description, a.usage());
    let kind = match data {
        DataArg::Numeric => "Numeric column (integers, floats, decimals; cast to Float64)",
        DataArg::Any => "Column of any type",
    };
    for d in a.data {
        b = b.with_argument(d.name, format!("{kind}: {}.", d.doc));
    }
    for p in a.params {
        let text = match p.default {
            ParamDefault::Hidden => format!("Hidden: {}; users never write it.", p.doc),
            _ => format!("Literal: {}.", p.doc),
        };
        b = b.with_argument(p.name, text);
    }
    b = b.with_sql_example(example);
    for r in related {
        b = b.with_related_udf(*r);
    }
    b.build()
}

impl<P: DpFunction> Default for DpUdaf<P> {
    fn default() -> Self {
        Self::new()
    }
}

identity_by_signature_and_seed!(DpUdaf);

impl<P: DpFunction> AggregateUDFImpl for DpUdaf<P> {
    fn name(&self) -> &str {
        P::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_args(P::declaration(), P::spec().data, arg_types)
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(P::spec().returns.clone())
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(DpAccumulator::new(
            self.finaliser(&args)?,
            self.insecure_seed,
        )?))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(P::spec().shape.state_fields(args.name))
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
        Some(&self.doc)
    }
}

/// [`super::declaration::NoiseFn`] of an aggregate served by the adapter: its release's own description.
pub(crate) fn spec_noise<P: DpFunction>(params: &[ScalarValue]) -> Option<String> {
    (P::spec().release)(params).ok()?.noise()
}
