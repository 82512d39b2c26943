//! BigQuery's (ZetaSQL's) differential privacy clause, rewritten to dpfusion's DP functions
//! before planning (docs/SQL.md, "BigQuery's DIFFERENTIAL_PRIVACY clause").
//!
//! ```sql
//! SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, max_groups_contributed = 2)
//!   k, AVG(x, contribution_bounds_per_group => (0, 100)), COUNT(*)
//! FROM t GROUP BY k
//! ```
//!
//! sqlparser has no grammar for the clause: [`strip_dp_clause`] finds it with sqlparser's
//! tokenizer (never a string search: a string literal or a comment holding the words is not a
//! clause), reads its OPTIONS and replaces it by a marker select item; [`rewrite_dp_select`]
//! then removes the marker from the SELECT it marks and rewrites that SELECT's aggregates to
//! ordinary dp_* calls (`AVG` → `dp_mean`, `SUM` → `dp_sum`, `COUNT` → `dp_count`, `VAR_POP` →
//! `dp_variance`, `STDDEV_POP` → `dp_stddev`, `PERCENTILE_CONT` → `dp_quantile`). The result goes
//! through the guard like any query: the rewrite grants nothing.
//!
//! The statement's budget is split evenly over its aggregates, as BigQuery does ("the privacy
//! budget is split evenly across the DP aggregate functions in the query"; GoogleSQL for
//! BigQuery, query syntax, "Differential privacy clause", `epsilon` and `delta`): with n DP
//! aggregates each gets ε/n and δ/n. BigQuery counts one more, implicit aggregate for its group
//! threshold; in dpfusion the GROUP BY's partition selection is charged by its own rule
//! (docs/ACCOUNTING.md), the same as for a dp_* query, and is not part of the split. `dp_quantile`
//! is pure ε-DP: its δ share is unused.
//!
//! The privacy unit and its bounds are the data owner's: `privacy_unit_column` must name the
//! table's registered unit column and `max_groups_contributed` may only tighten the registered
//! bound (the session checks both against the registration: [`DpClause`]); everything else the
//! clause cannot express faithfully is refused with the reason, among it an aggregate in HAVING
//! or ORDER BY (only the SELECT list is rewritten: filter or order on its alias in an outer
//! query). `SUM` clamps each unit's total per group to `contribution_bounds_per_group`, as
//! BigQuery does; the other aggregates clamp each value (docs/SQL.md says so).
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName, ObjectNamePart,
    Query, SelectItem, SetExpr, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::Error;

/// The select item that marks the SELECT the clause belonged to, between
/// [`strip_dp_clause`] and [`rewrite_dp_select`].
const MARKER: &str = "__dpfusion_differential_privacy_clause__";

/// The clause's OPTIONS.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DpClause {
    /// The statement's ε, split evenly over its aggregates.
    pub epsilon: f64,
    /// The statement's δ, split evenly over its aggregates (`None`: each aggregate gets the
    /// session's `dpfusion.default_delta`).
    pub delta: Option<f64>,
    /// At most the registered `max_groups_contributed` of every table with a unit (checked by
    /// the session); the statement's L0 bound.
    pub max_groups_contributed: Option<u32>,
    /// Must be the registered unit column of every table with a unit (checked by the session).
    pub privacy_unit_column: Option<String>,
}

/// A refusal of the clause, typed where it is decided.
pub(crate) fn refusal(msg: impl std::fmt::Display) -> Error {
    Error::Refused(format!(
        "dpfusion refused the query: WITH DIFFERENTIAL_PRIVACY: {msg}"
    ))
}

fn is_word(t: &Token, w: &str) -> bool {
    matches!(t, Token::Word(word) if word.quote_style.is_none() && word.value.eq_ignore_ascii_case(w))
}

/// Finds `SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)` in `sql`: the statement with the
/// clause replaced by a marker item, and the OPTIONS; `None` when there is no clause. At most
/// one clause per statement.
pub fn strip_dp_clause(sql: &str) -> Result<Option<(String, DpClause)>, Error> {
    // Not unescaped: the statement is rebuilt from the tokens, and an unescaped 'O''Brien' would
    // print back as 'O'Brien' (another statement).
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .with_unescape(false)
        .tokenize()
        .map_err(|e| Error::Invalid(format!("SQL error: {e}")))?;
    if !tokens.iter().any(|t| is_word(t, "DIFFERENTIAL_PRIVACY")) {
        return Ok(None);
    }
    // The marker is the rewrite's own: a statement that already holds it would have a second
    // SELECT rewritten as if it had the clause, its aggregates made DP at a second ε (round 51,
    // review "fixes" F2: `OPTIONS(epsilon = 1)` spent 2).
    if tokens.iter().any(|t| t.to_string().contains(MARKER)) {
        return Err(refusal(format!(
            "the text '{MARKER}' is reserved (dpfusion marks the clause's SELECT with it); \
             remove it from the statement"
        )));
    }
    // Indices of the significant tokens.
    let sig: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i], Token::Whitespace(_)))
        .collect();
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let mut found: Option<(usize, usize, DpClause)> = None;
    for k in 0..sig.len() {
        if !at(k).is_some_and(|t| is_word(t, "DIFFERENTIAL_PRIVACY")) {
            continue;
        }
        let select_with = k >= 2
            && at(k - 1).is_some_and(|t| is_word(t, "WITH"))
            && at(k - 2).is_some_and(|t| is_word(t, "SELECT"));
        if !select_with {
            return Err(refusal(
                "the clause is written right after SELECT: SELECT WITH DIFFERENTIAL_PRIVACY \
                 OPTIONS (epsilon = ..., delta = ...) ...",
            ));
        }
        if found.is_some() {
            return Err(refusal(
                "a statement may have one DIFFERENTIAL_PRIVACY clause; run the SELECTs one at a \
                 time",
            ));
        }
        if !at(k + 1).is_some_and(|t| is_word(t, "OPTIONS"))
            || !matches!(at(k + 2), Some(Token::LParen))
        {
            return Err(refusal(
                "OPTIONS (epsilon = ..., delta = ...) must follow DIFFERENTIAL_PRIVACY",
            ));
        }
        // The options up to the matching parenthesis: name = value, comma-separated.
        let mut j = k + 3;
        let mut opts: Vec<(String, Vec<Token>)> = Vec::new();
        loop {
            match at(j) {
                Some(Token::RParen) if opts.is_empty() => break,
                Some(Token::Word(w)) if matches!(at(j + 1), Some(Token::Eq)) => {
                    let name = w.value.to_ascii_lowercase();
                    let mut value = Vec::new();
                    j += 2;
                    while let Some(t) = at(j) {
                        if matches!(t, Token::Comma | Token::RParen) {
                            break;
                        }
                        value.push(t.clone());
                        j += 1;
                    }
                    opts.push((name, value));
                    match at(j) {
                        Some(Token::Comma) => j += 1,
                        Some(Token::RParen) => break,
                        _ => return Err(refusal("OPTIONS (...) is not closed")),
                    }
                }
                _ => {
                    return Err(refusal(
                        "OPTIONS takes name = value pairs, e.g. OPTIONS (epsilon = 1, delta = 1e-6)",
                    ));
                }
            }
        }
        found = Some((sig[k - 1], sig[j], clause_of(&opts)?));
    }
    let Some((start, end, clause)) = found else {
        return Ok(None);
    };
    let mut out = String::with_capacity(sql.len() + MARKER.len());
    for t in &tokens[..start] {
        out.push_str(&t.to_string());
    }
    out.push_str(&format!(" '{MARKER}', "));
    for t in &tokens[end + 1..] {
        out.push_str(&t.to_string());
    }
    Ok(Some((out, clause)))
}

fn number(name: &str, value: &[Token]) -> Result<f64, Error> {
    let text: String = value.iter().map(|t| t.to_string()).collect();
    let parsed = match value {
        [Token::Number(n, _)] => n.parse::<f64>().ok(),
        [Token::Minus, Token::Number(n, _)] => n.parse::<f64>().ok().map(|x| -x),
        _ => None,
    };
    parsed.ok_or_else(|| refusal(format!("{name} must be a number, got '{text}'")))
}

fn clause_of(opts: &[(String, Vec<Token>)]) -> Result<DpClause, Error> {
    let mut c = DpClause::default();
    let mut epsilon = None;
    let mut seen: Vec<&str> = Vec::new();
    for (name, value) in opts {
        if seen.contains(&name.as_str()) {
            return Err(refusal(format!("option {name} is given more than once")));
        }
        seen.push(name);
        match name.as_str() {
            "epsilon" => {
                let e = number(name, value)?;
                if !(e.is_finite() && e > 0.0) {
                    return Err(refusal(format!("epsilon must be finite and > 0, got {e}")));
                }
                epsilon = Some(e);
            }
            "delta" => {
                let d = number(name, value)?;
                if !(d > 0.0 && d < 1.0) {
                    return Err(refusal(format!(
                        "delta must be in (0, 1), got {d}; dpfusion's Gaussian releases need \
                         δ > 0 (omit delta for the session's dpfusion.default_delta per \
                         aggregate)"
                    )));
                }
                c.delta = Some(d);
            }
            "max_rows_contributed" => {
                return Err(refusal(
                    "max_rows_contributed is not a BigQuery option; the data owner's \
                     max_rows_contributed applies (SET dpfusion.max_rows_contributed)",
                ));
            }
            "max_groups_contributed" => {
                let k = number(name, value)?;
                if !(k >= 1.0 && k.fract() == 0.0 && k <= u32::MAX as f64) {
                    return Err(refusal(format!(
                        "max_groups_contributed must be a positive integer, got {k}"
                    )));
                }
                c.max_groups_contributed = Some(k as u32);
            }
            "privacy_unit_column" => match value.as_slice() {
                [Token::Word(w)] => c.privacy_unit_column = Some(w.value.clone()),
                _ => {
                    return Err(refusal(
                        "privacy_unit_column must be a column name, e.g. privacy_unit_column = id",
                    ));
                }
            },
            "group_selection_strategy" => {
                if !matches!(value.as_slice(), [t] if is_word(t, "LAPLACE_THRESHOLD")) {
                    return Err(refusal(
                        "group_selection_strategy: dpfusion selects the groups of a private GROUP \
                         BY itself (a noisy-count threshold, like LAPLACE_THRESHOLD); for public \
                         groups join a public table of keys instead of PUBLIC_GROUPS \
                         (docs/SQL.md)",
                    ));
                }
            }
            "min_privacy_units_per_group" => {
                return Err(refusal(
                    "min_privacy_units_per_group is not supported: dpfusion's partition \
                     selection sets its threshold from δ (docs/ACCOUNTING.md)",
                ));
            }
            other => {
                return Err(refusal(format!(
                    "unknown option '{other}'; the options are epsilon, delta, \
                     max_groups_contributed, privacy_unit_column and group_selection_strategy"
                )));
            }
        }
    }
    c.epsilon = epsilon.ok_or_else(|| refusal("OPTIONS must set epsilon, e.g. epsilon = 1"))?;
    Ok(c)
}

/// Rewrites the SELECT marked by [`strip_dp_clause`] in `stmt`: its aggregates to dp_* calls
/// with ε/n and δ/n each (module docs). Errors are refusals with the reason.
pub fn rewrite_dp_select<V: VisitMut>(stmt: &mut V, clause: &DpClause) -> Result<(), Error> {
    let mut r = Rewriter {
        clause,
        done: false,
        error: None,
    };
    let _ = stmt.visit(&mut r);
    if let Some(e) = r.error {
        return Err(e);
    }
    if !r.done {
        return Err(refusal(
            "the clause must open a SELECT with a list of aggregates (SELECT WITH \
             DIFFERENTIAL_PRIVACY OPTIONS (...) k, COUNT(*) FROM t GROUP BY k)",
        ));
    }
    Ok(())
}

struct Rewriter<'a> {
    clause: &'a DpClause,
    done: bool,
    error: Option<Error>,
}

/// The first aggregate (one the clause maps, one without a DP form, or a dp_* function) called
/// in `node`, upper-cased as the refusals name it.
fn first_aggregate<V: datafusion::sql::sqlparser::ast::Visit>(node: &V) -> Option<String> {
    let found = datafusion::sql::sqlparser::ast::visit_expressions(node, |e| {
        if let Expr::Function(f) = e {
            let name = f.name.to_string().to_ascii_lowercase();
            let agg = MAPPING.iter().any(|(b, _)| *b == name)
                || NOT_DP.contains(&name.as_str())
                || name.starts_with("dp_");
            if agg {
                return ControlFlow::Break(name.to_ascii_uppercase());
            }
        }
        ControlFlow::Continue(())
    });
    match found {
        ControlFlow::Break(n) => Some(n),
        ControlFlow::Continue(()) => None,
    }
}

fn is_marker(item: &SelectItem) -> bool {
    matches!(item, SelectItem::UnnamedExpr(Expr::Value(v))
        if v.value == Value::SingleQuotedString(MARKER.to_string()))
}

impl VisitorMut for Rewriter<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        if !select.projection.first().is_some_and(is_marker) {
            return ControlFlow::Continue(());
        }
        select.projection.remove(0);
        // Only the SELECT list is rewritten: an aggregate in HAVING or ORDER BY would be a second,
        // unsplit computation over the private rows (the guard would refuse it as non-private,
        // naming a dp_* function the clause does not take). Refused here, saying what to write.
        for (clause, found) in [
            ("HAVING", first_aggregate(&select.having)),
            ("ORDER BY", first_aggregate(&query.order_by)),
        ] {
            if let Some(name) = found {
                self.error = Some(refusal(format!(
                    "{name} in {clause} is not rewritten to a DP aggregate (only the SELECT list \
                     is); give the aggregate an alias in the SELECT list and {} it in an outer \
                     query, e.g. SELECT * FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (…) k, \
                     COUNT(*) AS n FROM t GROUP BY k) WHERE n > 10 ORDER BY n",
                    if clause == "HAVING" {
                        "filter on"
                    } else {
                        "order by"
                    }
                )));
                return ControlFlow::Break(());
            }
        }
        match rewrite_items(&mut select.projection, self.clause) {
            Ok(()) => {
                self.done = true;
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

/// The BigQuery DP aggregates and their dp_* function.
const MAPPING: &[(&str, &str)] = &[
    ("avg", "dp_mean"),
    ("sum", "dp_sum"),
    ("count", "dp_count"),
    ("var_pop", "dp_variance"),
    ("stddev_pop", "dp_stddev"),
    ("percentile_cont", "dp_quantile"),
];

/// Aggregates with no DP form here, named in the refusal.
const NOT_DP: &[&str] = &[
    "min",
    "max",
    "any_value",
    "array_agg",
    "string_agg",
    "median",
    "mode",
    "var_samp",
    "variance",
    "stddev",
    "stddev_samp",
    "approx_count_distinct",
    "approx_quantiles",
    "approx_top_count",
    "approx_top_sum",
    "count_if",
    "countif",
    "logical_and",
    "logical_or",
    "bit_and",
    "bit_or",
    "bit_xor",
    "corr",
    "covar_pop",
    "covar_samp",
    "first_value",
    "last_value",
];

fn rewrite_items(items: &mut [SelectItem], clause: &DpClause) -> Result<(), Error> {
    // First pass: check every call and count the aggregates.
    let mut n = 0usize;
    for item in items.iter_mut() {
        let expr = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => {
                return Err(refusal(
                    "SELECT * is not a DP aggregate; list the grouping columns and the \
                     aggregates",
                ));
            }
        };
        let mut counter = Counter {
            n: 0,
            error: None,
            clause,
            rewrite: false,
            count: 0,
        };
        let _ = expr.visit(&mut counter);
        if let Some(e) = counter.error {
            return Err(e);
        }
        n += counter.n;
    }
    if n == 0 {
        return Err(refusal(
            "the SELECT has no DP aggregate (AVG, COUNT, SUM, VAR_POP, STDDEV_POP, \
             PERCENTILE_CONT)",
        ));
    }
    // Unaliased items are named as written, each aggregate without its named arguments
    // (`AVG(salary)`, `COUNT(*)`, `PERCENTILE_CONT(age, 0.5)`), unique within the SELECT.
    let mut taken: Vec<String> = items
        .iter()
        .filter_map(|i| match i {
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            _ => None,
        })
        .collect();
    for item in items.iter_mut() {
        let SelectItem::UnnamedExpr(e) = item else {
            continue;
        };
        if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
            continue;
        }
        let mut short = e.clone();
        let _ = short.visit(&mut Shorten);
        let short = short.to_string();
        let name = std::iter::once(short.clone())
            .chain((2..).map(|k| format!("{short} #{k}")))
            .find(|n| !taken.contains(n))
            .expect("an unused name");
        taken.push(name.clone());
        *item = SelectItem::ExprWithAlias {
            expr: e.clone(),
            alias: Ident::with_quote('"', name),
        };
    }
    // Second pass: rewrite, each aggregate with ε/n and δ/n.
    for item in items.iter_mut() {
        let expr = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => continue,
        };
        let mut rw = Counter {
            n: 0,
            error: None,
            clause,
            rewrite: true,
            count: n,
        };
        let _ = expr.visit(&mut rw);
        if let Some(e) = rw.error {
            return Err(e);
        }
    }
    Ok(())
}

/// Drops the named arguments of the BigQuery aggregates (their output names).
struct Shorten;

impl VisitorMut for Shorten {
    type Break = ();
    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = expr
            && f.name.0.len() == 1
            && MAPPING
                .iter()
                .any(|(b, _)| f.name.to_string().eq_ignore_ascii_case(b))
            && let FunctionArguments::List(list) = &mut f.args
        {
            list.args.retain(|a| matches!(a, FunctionArg::Unnamed(_)));
        }
        ControlFlow::Continue(())
    }
}

/// Checks (and with `rewrite`, rewrites) the aggregate calls of one select item.
struct Counter<'a> {
    n: usize,
    error: Option<Error>,
    clause: &'a DpClause,
    rewrite: bool,
    /// The statement's number of aggregates (when rewriting).
    count: usize,
}

fn number_expr(x: f64) -> Expr {
    // Rust's shortest round-trip forms: the value the call is calibrated for is exactly x.
    let text = if (1e-4..1e15).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    };
    Expr::value(Value::Number(text, false))
}

fn named(name: &str, value: Expr) -> FunctionArg {
    FunctionArg::Named {
        name: Ident::new(name),
        arg: FunctionArgExpr::Expr(value),
        operator: datafusion::sql::sqlparser::ast::FunctionArgOperator::RightArrow,
    }
}

impl VisitorMut for Counter<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                self.error = Some(refusal(
                    "subqueries in the SELECT list of a DP clause are not supported",
                ));
                return ControlFlow::Break(());
            }
            _ => {}
        }
        let Expr::Function(f) = expr else {
            return ControlFlow::Continue(());
        };
        if f.name.0.len() != 1 {
            return ControlFlow::Continue(());
        }
        let fname = f.name.to_string().to_ascii_lowercase();
        if fname.starts_with("dp_") || fname == "rgm_mean_by" {
            self.error = Some(refusal(format!(
                "{fname} is a dpfusion DP function: under the clause write BigQuery's \
                 aggregates (AVG, COUNT, SUM, VAR_POP, STDDEV_POP, PERCENTILE_CONT), or drop the \
                 clause and give {fname} its own epsilon"
            )));
            return ControlFlow::Break(());
        }
        if NOT_DP.contains(&fname.as_str()) {
            self.error = Some(refusal(format!(
                "{} has no differentially private form; the DP aggregates are AVG, COUNT, SUM, \
                 VAR_POP, STDDEV_POP and PERCENTILE_CONT",
                fname.to_ascii_uppercase()
            )));
            return ControlFlow::Break(());
        }
        let Some(&(_, dp)) = MAPPING.iter().find(|(b, _)| *b == fname) else {
            return ControlFlow::Continue(());
        };
        match self.map_call(&fname, dp, f) {
            Ok(Some(new)) => {
                self.n += 1;
                *expr = new;
                // The new call's arguments are not aggregates: do not descend into them.
                ControlFlow::Continue(())
            }
            Ok(None) => {
                self.n += 1;
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

impl Counter<'_> {
    /// The dp_* call for a BigQuery aggregate (`None` when only counting).
    fn map_call(
        &self,
        fname: &str,
        dp: &str,
        f: &datafusion::sql::sqlparser::ast::Function,
    ) -> Result<Option<Expr>, Error> {
        let upper = fname.to_ascii_uppercase();
        if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
            return Err(refusal(format!(
                "{upper}: OVER, FILTER and WITHIN GROUP are not supported in a DP clause"
            )));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(refusal(format!("{upper} takes an argument list")));
        };
        if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
            return Err(refusal(format!(
                "{upper}(DISTINCT ...) and clauses inside the call are not supported; for \
                 distinct privacy units use COUNT(*) on a table with a privacy unit, or \
                 dp_count_distinct"
            )));
        }
        let mut positional: Vec<Expr> = Vec::new();
        let mut bounds: Option<(Expr, Expr)> = None;
        let mut star = false;
        for a in &list.args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => positional.push(e.clone()),
                FunctionArg::Unnamed(_) if fname == "count" => star = true,
                FunctionArg::Named { name, arg, .. }
                    if name
                        .value
                        .eq_ignore_ascii_case("contribution_bounds_per_group") =>
                {
                    match arg {
                        FunctionArgExpr::Expr(Expr::Tuple(t)) if t.len() == 2 => {
                            bounds = Some((t[0].clone(), t[1].clone()))
                        }
                        _ => {
                            return Err(refusal(format!(
                                "{upper}: contribution_bounds_per_group takes (lower, upper)"
                            )));
                        }
                    }
                }
                FunctionArg::Named { name, .. } => {
                    return Err(refusal(format!(
                        "{upper} has no parameter '{}'; it takes contribution_bounds_per_group \
                         => (lower, upper)",
                        name.value
                    )));
                }
                _ => return Err(refusal(format!("{upper}: unsupported argument '{a}'"))),
            }
        }
        let want = if fname == "percentile_cont" { 2 } else { 1 };
        let got = positional.len() + usize::from(star);
        if got != want {
            return Err(refusal(format!(
                "{upper} takes {want} argument{} before contribution_bounds_per_group, got {got}",
                if want == 1 { "" } else { "s" }
            )));
        }
        if !self.rewrite {
            return Ok(None);
        }
        let n = self.count as f64;
        let epsilon = number_expr(self.clause.epsilon / n);
        let delta = self.clause.delta.map(|d| number_expr(d / n));
        let mut args: Vec<FunctionArg> = Vec::new();
        let value = if star {
            // COUNT(*): every row counts; a literal is never NULL.
            Expr::value(Value::Number("1".to_string(), false))
        } else {
            positional[0].clone()
        };
        args.push(FunctionArg::Unnamed(FunctionArgExpr::Expr(value)));
        if fname == "count" {
            if bounds.is_some() {
                return Err(refusal(
                    "COUNT: contribution_bounds_per_group is not supported; a unit's rows per \
                     group are bounded by the data owner's max_rows_contributed",
                ));
            }
        } else {
            let Some((lo, hi)) = bounds else {
                return Err(refusal(format!(
                    "{upper} needs contribution_bounds_per_group => (lower, upper): dpfusion \
                     does not derive bounds from the data (BigQuery's implicit bounds spend \
                     budget on the data); e.g. {upper}(x, contribution_bounds_per_group => (0, \
                     100))"
                )));
            };
            args.push(named("lower", lo));
            args.push(named("upper", hi));
        }
        if fname == "percentile_cont" {
            args.push(named("q", positional[1].clone()));
        }
        args.push(named("epsilon", epsilon));
        if fname != "percentile_cont"
            && let Some(d) = delta
        {
            args.push(named("delta", d));
        }
        let mut call = f.clone();
        call.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(dp))]);
        call.args =
            FunctionArguments::List(datafusion::sql::sqlparser::ast::FunctionArgumentList {
                duplicate_treatment: None,
                args,
                clauses: vec![],
            });
        Ok(Some(Expr::Function(call)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewrite(sql: &str) -> Result<(String, DpClause), String> {
        let (sql, clause) = strip_dp_clause(sql)
            .map_err(|e| e.to_string())?
            .expect("a clause");
        let mut stmts = Parser::parse_sql(&GenericDialect {}, &sql).map_err(|e| e.to_string())?;
        rewrite_dp_select(&mut stmts[0], &clause).map_err(|e| e.to_string())?;
        Ok((stmts[0].to_string(), clause))
    }

    #[test]
    fn the_documented_shape_rewrites_with_the_budget_split() {
        let (sql, c) = rewrite(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, \
             max_groups_contributed = 2) k, AVG(x, contribution_bounds_per_group => (0, 100)), \
             COUNT(*), SUM(x, contribution_bounds_per_group => (0, 10)), \
             PERCENTILE_CONT(x, 0.5, contribution_bounds_per_group => (0, 100)) FROM t GROUP BY k",
        )
        .unwrap();
        assert_eq!(
            c,
            DpClause {
                epsilon: 1.0,
                delta: Some(1e-6),
                max_groups_contributed: Some(2),
                privacy_unit_column: None
            }
        );
        assert_eq!(
            sql,
            "SELECT k, dp_mean(x, lower => 0, upper => 100, epsilon => 0.25, delta => 2.5e-7) AS \
             \"AVG(x)\", dp_count(1, epsilon => 0.25, delta => 2.5e-7) AS \"COUNT(*)\", \
             dp_sum(x, lower => 0, upper => 10, epsilon => 0.25, delta => 2.5e-7) AS \"SUM(x)\", \
             dp_quantile(x, lower => 0, upper => 100, q => 0.5, epsilon => 0.25) AS \
             \"PERCENTILE_CONT(x, 0.5)\" FROM t GROUP BY k"
        );
    }

    /// Round 51, review "fixes" F2: a second SELECT marked by the analyst was rewritten too.
    #[test]
    fn the_marker_written_by_the_analyst_is_refused() {
        let e = rewrite(&format!(
            "SELECT * FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1) job, COUNT(*) AS \
             n FROM salaries GROUP BY job) a JOIN (SELECT '{MARKER}', job AS j2, COUNT(*) AS c2 \
             FROM salaries GROUP BY job) b ON a.job = b.j2"
        ))
        .unwrap_err();
        assert!(e.contains("is reserved"), "{e}");
    }

    #[test]
    fn not_a_clause() {
        // Words in strings and comments are not a clause.
        assert_eq!(
            strip_dp_clause("SELECT 'WITH DIFFERENTIAL_PRIVACY' -- DIFFERENTIAL_PRIVACY\n FROM t")
                .unwrap(),
            None
        );
        assert_eq!(strip_dp_clause("SELECT avg(x) FROM t").unwrap(), None);
    }

    #[test]
    fn quoted_text_is_kept_as_written() {
        // A doubled quote stays doubled: the WHERE is the one the analyst wrote.
        let (sql, _) = strip_dp_clause(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM t \
             WHERE k = 'x'' OR ''1''=''1' AND \"a\"\"b\" = 1",
        )
        .unwrap()
        .unwrap();
        assert!(sql.contains("'x'' OR ''1''=''1'"), "{sql}");
        assert!(sql.contains("\"a\"\"b\""), "{sql}");
    }

    #[test]
    fn refusals_say_why() {
        let cases = [
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (delta = 1e-6) COUNT(*) FROM t",
                "must set epsilon",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, kappa = 2) COUNT(*) FROM t",
                "unknown option 'kappa'",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) MAX(x) FROM t",
                "MAX has no differentially private form",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) AVG(x) FROM t",
                "needs contribution_bounds_per_group",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(DISTINCT x) FROM t",
                "DISTINCT",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) dp_count(x, 1) FROM t",
                "dpfusion DP function",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) k FROM t GROUP BY k",
                "no DP aggregate",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, group_selection_strategy = PUBLIC_GROUPS) COUNT(*) FROM t",
                "PUBLIC_GROUPS",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 0) COUNT(*) FROM t",
                "delta must be in (0, 1)",
            ),
            (
                "SELECT * FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM t) a, (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM t) b",
                "one DIFFERENTIAL_PRIVACY clause",
            ),
            ("SELECT DIFFERENTIAL_PRIVACY FROM t", "right after SELECT"),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) k, COUNT(*) AS n FROM t GROUP BY k HAVING COUNT(*) > 3",
                "COUNT in HAVING is not rewritten to a DP aggregate",
            ),
            (
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) k, COUNT(*) AS n FROM t GROUP BY k ORDER BY SUM(x) DESC",
                "SUM in ORDER BY is not rewritten to a DP aggregate",
            ),
        ];
        for (sql, want) in cases {
            let e = rewrite(sql).unwrap_err();
            assert!(e.contains(want), "{sql}: {e}");
            assert!(e.starts_with("dpfusion refused the query"), "{e}");
        }
    }

    #[test]
    fn inner_select_and_unit_options() {
        let (sql, c) = rewrite(
            "SELECT * FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, \
             privacy_unit_column = customer) COUNT(x) AS n FROM t) s",
        )
        .unwrap();
        assert_eq!(c.privacy_unit_column.as_deref(), Some("customer"));
        assert_eq!(c.delta, None);
        assert_eq!(
            sql,
            "SELECT * FROM (SELECT dp_count(x, epsilon => 0.5) AS n FROM t) s"
        );
    }
}
