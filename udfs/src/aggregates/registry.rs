//! The list of the DP aggregates' declarations (each in its function's file): name, data arguments, parameters (name, type, default,
//! doc), requirements, the SQL aggregates it replaces, how to build its UDAF and what a call
//! costs. Named-argument resolution, the guard, the REPL's completion and the docs read this list;
//! nothing else names the functions.
//!
//! Adding an aggregate: one file that declares it, one line here, the docs ([`super`], module
//! docs, "Adding an aggregate").
//!
//! Unit-level calls (`neighbours` = `'units:K:C'`): the model aggregates (`dp_linreg_gd`,
//! `dp_logreg_agd`) take one more argument after `neighbours`, the privacy-unit key column (any
//! type, not a literal and not a parameter: it is not in `params`), and refuse a unit-level call
//! without it; the guard strips it before calling `cost`, which reads the literals only.
pub use super::declaration::{
    Aggregate, CostFn, DataArg, Default, Kind, NoiseFn, Param, Requirement, UnitRule,
};

/// Every dpfusion DP aggregate: one line per function, its declaration in its own file.
pub static AGGREGATES: &[Aggregate] = &[
    super::dp_count::DP_COUNT,
    super::dp_count_distinct::DP_COUNT_DISTINCT,
    super::dp_sum::DP_SUM,
    super::dp_mean::DP_MEAN,
    super::dp_count::DP_COUNT_CI,
    super::dp_count_distinct::DP_COUNT_DISTINCT_CI,
    super::dp_sum::DP_SUM_CI,
    super::dp_mean::DP_MEAN_CI,
    super::dp_variance::DP_VARIANCE,
    super::dp_variance::DP_STDDEV,
    super::dp_variance::DP_VARIANCE_CI,
    super::dp_variance::DP_STDDEV_CI,
    super::dp_quantile::DP_QUANTILE,
    super::dp_quantile::DP_MEDIAN,
    super::dp_quantile::DP_QUANTILES,
    super::partition_select::DP_PARTITION_SELECT,
    super::dp_linreg_gd::DP_LINREG_GD,
    super::dp_logreg_agd::DP_LOGREG_AGD,
    super::dp_models_sgd::DP_LINREG_SGD,
    super::dp_models_sgd::DP_LOGREG_SGD,
    super::dp_models_sgd::DP_MLP_SGD,
    super::rgm_mean_by::RGM_MEAN_BY,
];

/// The declaration of `name` (case-insensitive), if it is a dpfusion DP aggregate.
pub fn get(name: &str) -> Option<&'static Aggregate> {
    AGGREGATES
        .iter()
        .find(|a| a.name.eq_ignore_ascii_case(name))
}

/// The base function of a `_ci` variant (`dp_mean_ci` → `dp_mean`, [`super::interval`]); the
/// declaration of `name` itself otherwise. The guard reads how a call contributes (unit-level
/// tables) from the base function.
pub fn base_of(name: &str) -> Option<&'static Aggregate> {
    let a = get(name)?;
    Some(
        a.name
            .strip_suffix("_ci")
            .and_then(get)
            .filter(|b| b.params.iter().all(|p| a.position(p.name).is_some()))
            .unwrap_or(a),
    )
}

/// The DP aggregate that replaces the SQL aggregate `name` (e.g. `count` → `dp_count`).
pub fn replacing(name: &str) -> Option<&'static Aggregate> {
    AGGREGATES
        .iter()
        .find(|a| a.replaces.iter().any(|r| r.eq_ignore_ascii_case(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::ScalarValue;

    /// Valid literals for a call of `name` (trailing optional parameters left out).
    fn valid_literals(name: &str) -> Vec<ScalarValue> {
        use datafusion::arrow::array::ListArray;
        use datafusion::arrow::datatypes::Float64Type;
        use std::sync::Arc;
        let f = |v: f64| ScalarValue::Float64(Some(v));
        let s = |v: &str| ScalarValue::Utf8(Some(v.into()));
        let qs = ScalarValue::List(Arc::new(
            ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(vec![
                Some(0.25),
                Some(0.75),
            ])]),
        ));
        match name {
            "dp_count" | "dp_count_ci" | "dp_partition_select" => vec![f(1.0), f(1e-6)],
            "dp_count_distinct" => vec![f(1.0), f(1e-6), s("units:2:1")],
            "dp_count_distinct_ci" => vec![f(1.0), f(1e-6), f(0.9), s("units:2:1")],
            "dp_quantile" => vec![f(0.0), f(100.0), f(0.5), f(1.0)],
            "dp_median" => vec![f(0.0), f(100.0), f(1.0)],
            "dp_quantiles" => vec![f(0.0), f(100.0), qs, f(1.0)],
            "dp_linreg_gd" | "dp_logreg_agd" | "dp_linreg_sgd" | "dp_logreg_sgd" | "dp_mlp_sgd" => {
                vec![f(1.0), f(1e-6)]
            }
            "rgm_mean_by" => vec![f(2.0), f(1.0), f(1e-6), f(1000.0), s("replace_public_n")],
            _ => vec![f(0.0), f(100.0), f(1.0), f(1e-6)],
        }
    }

    /// Each function reads its literals by name through its own declaration
    /// ([`super::super::params::Params`]): a call's cost (the same reading the planner uses)
    /// asks for every declared parameter, and for no name the declaration lacks (that would
    /// panic). A `_ci` variant reads its base's parameters and `confidence`
    /// ([`super::super::interval::split_confidence`]).
    #[test]
    fn every_declared_parameter_is_read() {
        use super::super::params::read_log::was_read;
        for a in AGGREGATES {
            let cost = (a.cost)(&[], &valid_literals(a.name));
            assert!(cost.is_ok(), "{}: {cost:?}", a.name);
            let (reader, params) = match base_of(a.name) {
                Some(b) if b.name != a.name => (b.name, b.params),
                _ => (a.name, a.params),
            };
            for p in params {
                assert!(
                    was_read(reader, p.name),
                    "{reader} does not read `{}`",
                    p.name
                );
            }
        }
        for a in AGGREGATES {
            assert_eq!((a.udaf)().name(), a.name);
            assert_eq!(a.params.last().map(|p| p.name), Some("neighbours"));
        }
        assert_eq!(replacing("AVG").unwrap().name, "dp_mean");
        assert_eq!(
            get("dp_sum").unwrap().usage(),
            "dp_sum(value, lower, upper, epsilon[, delta][, mechanism])"
        );
    }

    /// Too many literals: refused with the declared list (the reading's count check).
    #[test]
    fn too_many_parameters_name_the_declared_ones() {
        let f = |v: f64| ScalarValue::Float64(Some(v));
        let e = (get("dp_logreg_agd").unwrap().cost)(&[], &vec![f(1.0); 11]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid argument 'arguments': got 11 parameters after label and features, expected \
             at most 10: epsilon, delta, clip_grad, clip_obj, splits, gamma, l2, fit_intercept, \
             max_step, neighbours"
        );
    }

    /// Every user-facing call describes its noise in EXPLAIN PRIVACY, from literals alone.
    #[test]
    fn every_aggregate_describes_its_noise() {
        let lits = valid_literals;
        for a in AGGREGATES {
            let n = (a.noise)(&lits(a.name));
            assert!(
                n.as_ref().is_some_and(|n| !n.is_empty()),
                "{}: {n:?}",
                a.name
            );
        }
        let noise = |name: &str, l: Vec<ScalarValue>| (get(name).unwrap().noise)(&l).unwrap();
        // dp_quantiles: 1024 bins of width 100/1024, ε/2 each, the score's sensitivity of the
        // larger max(q, 1 − q) and the exponent the sampler uses (round 50: it said
        // "sensitivity 1"; dp_quantile's tests check every neighbour mode).
        assert_eq!(
            noise("dp_quantiles", lits("dp_quantiles")),
            "exponential mechanism over 1024 bins of width 0.09766, ε = 0.5 for each of 2 \
             quantiles, score sensitivity Δ = max(q, 1 − q) = 0.75 (the largest over the \
             quantiles), exponent ε/(2Δ) = 0.3333"
        );
        // dp_variance, add_remove: μ₁² = μ²/2 on the centred sum (sensitivity h = 50 in value
        // units), μ_c² = μ²/4 on the count (sensitivity 1): σ₁ = 50/(μ/√2), σ_c = 1/(μ/2), with
        // μ = gaussian_mu(1, 1e-6) (module docs), up to the grid's 2^-20 relative.
        let mu = crate::privacy::gaussian_mu(1.0, 1e-6).unwrap();
        let text = noise("dp_variance", lits("dp_variance"));
        let short = crate::mechanisms::noise::short;
        assert!(
            text.contains(&format!("σ = {} on the count", short(2.0 / mu))),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "σ = {} on the sum of (value",
                short(50.0 * 2f64.sqrt() / mu)
            )),
            "{text}"
        );
        // A `_ci` call describes its base call's noise.
        assert_eq!(
            noise("dp_mean_ci", lits("dp_mean_ci")),
            noise("dp_mean", lits("dp_mean"))
        );
    }

    /// Both ways: every registered function is in README.md and in docs/SQL.md's "Aggregate
    /// functions" section, and every function a heading of that section names is registered.
    #[test]
    fn every_aggregate_is_documented() {
        let readme = include_str!("../../../README.md");
        let sql = include_str!("../../../docs/SQL.md");
        let start = sql.find("\n## Aggregate functions").expect("the section");
        let rest = &sql[start + 1..];
        let section = &rest[..rest[1..].find("\n## ").map_or(rest.len(), |i| i + 1)];
        for a in AGGREGATES.iter().filter(|a| !a.internal) {
            assert!(readme.contains(a.name), "README.md lacks {}", a.name);
            assert!(
                section.contains(&format!("{}(", a.name))
                    || section.contains(&format!("### {}", a.name)),
                "docs/SQL.md, \"Aggregate functions\", lacks {}",
                a.name
            );
        }
        let documented: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with("### "))
            .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
            .filter(|w| w.starts_with("dp_") || *w == "rgm_mean_by")
            .collect();
        assert!(documented.len() >= 10, "{documented:?}");
        for name in documented {
            assert!(
                get(name).is_some(),
                "docs/SQL.md documents {name}, not registered"
            );
        }
    }
}
