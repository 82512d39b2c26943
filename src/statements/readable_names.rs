//! Readable output names for unaliased DP calls, on the sqlparser AST, before
//! [`super::named_args`] fills in the omitted arguments.
//!
//! DataFusion names an unaliased expression after its planned form, every literal included:
//! `dp_mean(salaries.salary,Int64(0),Int64(300000),Float64(0.5),Float64(0.0000001),Utf8("gaussian"))`.
//! dpfusion aliases every unaliased select item that contains a DP call with the item as written,
//! each DP call shortened to its data arguments: `dp_mean(salary)`, `2 * dp_sum(x)`,
//! `dp_linreg_gd(y, [a, b])`. When two items of one SELECT would get the same name, the later
//! ones are named as written in full (`dp_mean(salary, 0, 100, 0.5)`), then numbered
//! (`dp_mean(salary) #2`), so every output name is unique. Explicit aliases are kept.
use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArguments, Ident, Query, SelectItem, SetExpr, Visit, VisitMut,
    Visitor, VisitorMut,
};

use dpfusion_udfs::aggregates::registry::AGGREGATES;

/// The number of data arguments and their names of the DP function `name` (as written, any
/// case), if it is one users call.
fn dp_data_args(name: &str) -> Option<Vec<&'static str>> {
    let lower = name.to_ascii_lowercase();
    AGGREGATES
        .iter()
        .find(|a| !a.internal && a.name == lower)
        .map(|a| a.data.iter().map(|d| d.name).collect())
}

fn dp_call_data(expr: &Expr) -> Option<Vec<&'static str>> {
    match expr {
        Expr::Function(f) if f.name.0.len() == 1 => dp_data_args(&f.name.to_string()),
        _ => None,
    }
}

/// Aliases every unaliased select item holding a DP call, in every query of `stmt` (module
/// docs).
pub fn name_dp_columns<V: VisitMut>(stmt: &mut V) {
    let _ = stmt.visit(&mut Namer);
}

struct Namer;

impl VisitorMut for Namer {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        name_set_expr(&mut query.body);
        ControlFlow::Continue(())
    }
}

fn name_set_expr(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => name_items(&mut select.projection),
        SetExpr::SetOperation { left, right, .. } => {
            name_set_expr(left);
            name_set_expr(right);
        }
        // Nested queries are visited on their own.
        _ => {}
    }
}

fn contains_dp_call(expr: &Expr) -> bool {
    struct Finder(bool);
    impl Visitor for Finder {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if dp_call_data(e).is_some() {
                self.0 = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
    }
    let mut f = Finder(false);
    let _ = expr.visit(&mut f);
    f.0
}

/// `expr` with every DP call cut to its data arguments (named ones made positional).
fn short_form(expr: &Expr) -> Expr {
    struct Shortener;
    impl VisitorMut for Shortener {
        type Break = ();
        fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            let Some(data) = dp_call_data(e) else {
                return ControlFlow::Continue(());
            };
            let Expr::Function(f) = e else {
                return ControlFlow::Continue(());
            };
            if let FunctionArguments::List(list) = &mut f.args {
                let mut kept: Vec<FunctionArg> = Vec::new();
                for (i, a) in list.args.iter().enumerate() {
                    match a {
                        FunctionArg::Unnamed(_) if i < data.len() => kept.push(a.clone()),
                        FunctionArg::Named { name, arg, .. }
                            if data.iter().any(|d| name.value.eq_ignore_ascii_case(d)) =>
                        {
                            kept.push(FunctionArg::Unnamed(arg.clone()))
                        }
                        _ => {}
                    }
                }
                list.args = kept;
                list.clauses.clear();
            }
            ControlFlow::Continue(())
        }
    }
    let mut short = expr.clone();
    let _ = VisitMut::visit(&mut short, &mut Shortener);
    short
}

fn name_items(items: &mut [SelectItem]) {
    // The names already taken: explicit aliases and bare columns.
    let mut taken: HashSet<String> = items
        .iter()
        .filter_map(|i| match i {
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            SelectItem::UnnamedExpr(Expr::Identifier(id)) => Some(id.value.clone()),
            SelectItem::UnnamedExpr(Expr::CompoundIdentifier(ids)) => {
                ids.last().map(|id| id.value.clone())
            }
            _ => None,
        })
        .collect();
    for item in items.iter_mut() {
        let SelectItem::UnnamedExpr(expr) = item else {
            continue;
        };
        if !contains_dp_call(expr) {
            continue;
        }
        let short = short_form(expr).to_string();
        let full = expr.to_string();
        let name = if !taken.contains(&short) {
            short
        } else if !taken.contains(&full) {
            full
        } else {
            (2..)
                .map(|k| format!("{short} #{k}"))
                .find(|n| !taken.contains(n))
                .expect("an unused number")
        };
        taken.insert(name.clone());
        *item = SelectItem::ExprWithAlias {
            expr: expr.clone(),
            alias: Ident::with_quote('"', name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn named(sql: &str) -> String {
        let mut stmts = Parser::parse_sql(&GenericDialect {}, sql).unwrap();
        name_dp_columns(&mut stmts[0]);
        stmts[0].to_string()
    }

    #[test]
    fn dp_calls_are_named_by_their_data() {
        assert_eq!(
            named("SELECT dept, dp_mean(salary, 0, 300000, epsilon => 0.5) FROM t GROUP BY dept"),
            "SELECT dept, dp_mean(salary, 0, 300000, epsilon => 0.5) AS \"dp_mean(salary)\" \
             FROM t GROUP BY dept"
        );
        assert_eq!(
            named("SELECT 2 * DP_SUM(value => x, lower => 0, upper => 1, epsilon => 1) FROM t"),
            "SELECT 2 * DP_SUM(value => x, lower => 0, upper => 1, epsilon => 1) AS \
             \"2 * DP_SUM(x)\" FROM t"
        );
        // Explicit aliases and other expressions are kept.
        assert_eq!(
            named("SELECT dp_count(x, 1) AS n, count(*) FROM t"),
            "SELECT dp_count(x, 1) AS n, count(*) FROM t"
        );
        // In subqueries and set operations too.
        assert_eq!(
            named(
                "SELECT * FROM (SELECT dp_count(x, 1) FROM t) UNION ALL SELECT dp_count(y, 1) FROM u"
            ),
            "SELECT * FROM (SELECT dp_count(x, 1) AS \"dp_count(x)\" FROM t) UNION ALL SELECT \
             dp_count(y, 1) AS \"dp_count(y)\" FROM u"
        );
    }

    #[test]
    fn names_are_unique() {
        assert_eq!(
            named("SELECT dp_count(x, 1), dp_count(x, 2), dp_count(x, 1), dp_count(x) FROM t"),
            "SELECT dp_count(x, 1) AS \"dp_count(x)\", dp_count(x, 2) AS \"dp_count(x, 2)\", \
             dp_count(x, 1) AS \"dp_count(x, 1)\", dp_count(x) AS \"dp_count(x) #2\" FROM t"
        );
        // A bare column of the same name is not shadowed.
        assert_eq!(
            named("SELECT \"dp_count(x)\", dp_count(x, 1) FROM t"),
            "SELECT \"dp_count(x)\", dp_count(x, 1) AS \"dp_count(x, 1)\" FROM t"
        );
    }
}
