//! Named-argument resolution for the DP functions, on the sqlparser AST.
//!
//! DataFusion 55 resolves `name => value` arguments itself, but cannot skip an optional argument
//! in the middle of the list. dpfusion resolves the calls of its own functions before planning:
//! every call is rewritten to the full positional form, with the omitted optional arguments filled
//! from their defaults (`delta` from the session's `dpfusion.default_delta`). What DataFusion then
//! plans is exactly what the accountant reads.
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Value, VisitMut, VisitorMut,
};

pub use dpfusion_udfs::aggregates::registry::Default;
use dpfusion_udfs::aggregates::registry::{AGGREGATES, Default as D};

/// One parameter of a DP function as users write it (data arguments first).
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub default: Default,
}

/// The user-facing parameter lists, data arguments first, read from the one declaration of each
/// aggregate ([`dpfusion_udfs::aggregates::registry`]). The hidden `neighbours` argument is not a
/// user parameter: the guard sets it from the table's registration and the plan.
pub static DP_FUNCTIONS: LazyLock<Vec<(&'static str, Vec<Param>)>> = LazyLock::new(|| {
    AGGREGATES
        .iter()
        .filter(|a| !a.internal)
        .map(|a| {
            let mut params: Vec<Param> = a
                .data
                .iter()
                .map(|d| Param {
                    name: d.name,
                    default: D::Required,
                })
                .collect();
            params.extend(a.user_params().map(|p| Param {
                name: p.name,
                default: p.default,
            }));
            (a.name, params)
        })
        .collect()
});

/// The parameter list of a DP function (case-insensitive name), if it is one.
pub fn dp_function_params(name: &str) -> Option<&'static [Param]> {
    let lower = name.to_ascii_lowercase();
    DP_FUNCTIONS
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, p)| p.as_slice())
}

/// Rewrites every call of a DP function in `stmt` to full positional form.
pub fn resolve_named_arguments<V: VisitMut>(
    stmt: &mut V,
    default_delta: f64,
) -> Result<(), String> {
    let mut r = Resolver {
        default_delta,
        error: None,
    };
    let _ = stmt.visit(&mut r);
    match r.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

struct Resolver {
    default_delta: f64,
    error: Option<String>,
}

impl VisitorMut for Resolver {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Function(f) = expr else {
            return ControlFlow::Continue(());
        };
        if f.name.0.len() != 1 {
            return ControlFlow::Continue(());
        }
        let fname = f.name.to_string();
        let Some(params) = dp_function_params(&fname) else {
            return ControlFlow::Continue(());
        };
        let fname = fname.to_ascii_lowercase();
        let FunctionArguments::List(list) = &mut f.args else {
            self.error = Some(format!(
                "{fname} takes an argument list: {fname}({})",
                names(params)
            ));
            return ControlFlow::Break(());
        };
        match resolve(&fname, params, &list.args, self.default_delta) {
            Ok(args) => {
                list.args = args;
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

fn names(params: &[Param]) -> String {
    params
        .iter()
        .map(|p| match p.default {
            Default::Required => p.name.to_string(),
            _ => format!("[{}]", p.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn default_expr(d: Default, default_delta: f64) -> Option<Expr> {
    Some(match d {
        Default::Required | Default::Hidden => return None,
        Default::SessionDelta => Expr::value(Value::Number(format!("{default_delta:e}"), false)),
        Default::Number(s) => Expr::value(Value::Number(s.to_string(), false)),
        Default::Text(s) => Expr::value(Value::SingleQuotedString(s.to_string())),
        Default::Bool(b) => Expr::value(Value::Boolean(b)),
    })
}

fn resolve(
    fname: &str,
    params: &[Param],
    args: &[FunctionArg],
    default_delta: f64,
) -> Result<Vec<FunctionArg>, String> {
    let usage = format!("{fname}({})", names(params));
    let mut slots: Vec<Option<FunctionArgExpr>> = vec![None; params.len()];
    let mut seen_named = false;
    let mut positional = 0usize;
    let mut named: HashMap<String, usize> = HashMap::new();
    for a in args {
        match a {
            FunctionArg::Unnamed(e) => {
                if seen_named {
                    return Err(format!(
                        "{fname}: positional arguments must come before named ones; usage: {usage}"
                    ));
                }
                if positional >= params.len() {
                    return Err(format!(
                        "{fname} takes at most {} arguments, got {}; usage: {usage}",
                        params.len(),
                        args.len()
                    ));
                }
                slots[positional] = Some(e.clone());
                positional += 1;
            }
            FunctionArg::Named { name, arg, .. } => {
                seen_named = true;
                let key = if name.quote_style.is_some() {
                    name.value.clone()
                } else {
                    name.value.to_ascii_lowercase()
                };
                let Some(i) = params.iter().position(|p| p.name == key) else {
                    return Err(format!(
                        "{fname} has no parameter named '{}'; its parameters are: {}",
                        name.value,
                        params.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
                    ));
                };
                if slots[i].is_some() || named.contains_key(&key) {
                    return Err(format!(
                        "{fname}: parameter '{key}' is given more than once"
                    ));
                }
                named.insert(key, i);
                slots[i] = Some(arg.clone());
            }
            FunctionArg::ExprNamed { name, .. } => {
                return Err(format!(
                    "{fname}: '{name}' is not a parameter name; write name => value"
                ));
            }
        }
    }
    let mut out = Vec::with_capacity(params.len());
    for (p, slot) in params.iter().zip(slots) {
        let e = match slot {
            Some(e) => e,
            None => match default_expr(p.default, default_delta) {
                Some(d) => FunctionArgExpr::Expr(d),
                None => {
                    return Err(format!(
                        "{fname}: missing required argument '{}'; usage: {usage}",
                        p.name
                    ));
                }
            },
        };
        out.push(FunctionArg::Unnamed(e));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewrite(sql: &str) -> Result<String, String> {
        let mut stmts = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| e.to_string())?;
        resolve_named_arguments(&mut stmts[0], 1e-7)?;
        Ok(stmts[0].to_string())
    }

    #[test]
    fn named_in_any_order_with_optional_skipped() {
        assert_eq!(
            rewrite("SELECT dp_mean(x, epsilon => 0.5, upper => 10, lower => 0) FROM t").unwrap(),
            "SELECT dp_mean(x, 0, 10, 0.5, 1e-7, 'gaussian') FROM t"
        );
        assert_eq!(
            rewrite("SELECT DP_COUNT(value => x, epsilon => 1, delta => 1e-6) FROM t").unwrap(),
            "SELECT DP_COUNT(x, 1, 1e-6, 'gaussian') FROM t"
        );
        assert_eq!(
            rewrite("SELECT dp_sum(x, 0, 1, epsilon => 1, mechanism => 'laplace') FROM t").unwrap(),
            "SELECT dp_sum(x, 0, 1, 1, 1e-7, 'laplace') FROM t"
        );
        // Inside expressions and subqueries too.
        assert_eq!(
            rewrite("SELECT 2 * dp_sum(x, 0, 1, 1.0) FROM t").unwrap(),
            "SELECT 2 * dp_sum(x, 0, 1, 1.0, 1e-7, 'gaussian') FROM t"
        );
    }

    #[test]
    fn errors_name_the_parameter() {
        let e = rewrite("SELECT dp_mean(x, 0, 10) FROM t").unwrap_err();
        assert!(e.contains("missing required argument 'epsilon'"), "{e}");
        let e = rewrite("SELECT dp_mean(x, 0, 10, bogus => 1) FROM t").unwrap_err();
        assert!(e.contains("no parameter named 'bogus'"), "{e}");
        let e = rewrite("SELECT dp_mean(x, 0, 10, 1, lower => 1) FROM t").unwrap_err();
        assert!(e.contains("'lower' is given more than once"), "{e}");
        let e =
            rewrite("SELECT dp_mean(x, 0, 10, 1, 1e-6, 'laplace', 'replace') FROM t").unwrap_err();
        assert!(e.contains("at most 6 arguments"), "{e}");
        let e = rewrite("SELECT dp_mean(epsilon => 1, x) FROM t").unwrap_err();
        assert!(e.contains("positional arguments must come before"), "{e}");
    }

    #[test]
    fn other_functions_untouched() {
        assert_eq!(
            rewrite("SELECT avg(x), my.dp_mean(x) FROM t").unwrap(),
            "SELECT avg(x), my.dp_mean(x) FROM t"
        );
    }
}
