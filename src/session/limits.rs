//! The complexity limits of one statement's text, checked before it is parsed.
use datafusion::common::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::error::refused;

/// Limits on one statement's text, checked before parsing: a statement that could exhaust the
/// stack while it is parsed, planned, evaluated or dropped is refused with a message, never a
/// crash. Expressions become deep trees through chains of operators (`a + b + c …` is
/// left-deep), casts (`x::INT::INT …`) and parentheses, so the check estimates the depth of the
/// tree the statement parses to: along every path of parentheses, the number of operators
/// chained at each level (a comma or clause keyword starts a new expression), plus the nesting
/// itself. The bound keeps a debug build's planning within a 2 MiB thread stack (tokio's
/// default), so embedders calling `sql()` from any task are safe.
pub const MAX_SQL_BYTES: usize = 1 << 20;
/// The largest estimated expression depth.
pub const MAX_DEPTH: usize = 128;
/// The most set operations (UNION, INTERSECT, EXCEPT) and joins in one statement.
pub const MAX_CHAIN: usize = 64;
/// The most a string literal's bytes times the levels of expressions around it may be.
/// DataFusion copies a literal into the name of every expression around it, in each optimizer
/// pass, so planning takes about that product squared: a 900 KB literal inside 40 nested calls
/// kept a debug build planning for over five minutes, which a statement's time limit does not
/// stop (planning does not yield).
pub const MAX_LITERAL_DEPTH_BYTES: usize = 8 << 20;

pub(super) fn check_complexity(sql: &str) -> Result<()> {
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if sql.len() > MAX_SQL_BYTES {
        return refused!(
            "dpfusion refused the query: the statement has {} bytes, more than {MAX_SQL_BYTES}",
            sql.len()
        );
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| DataFusionError::Plan(format!("SQL error: {e}")))?;
    // Operators chained at each open level of parentheses (the last entry is the innermost).
    let mut levels: Vec<usize> = vec![0];
    let (mut depth, mut chains) = (0usize, 0usize);
    // The largest literal's bytes times the levels around it, and that literal's size.
    let (mut weight, mut heavy) = (0usize, (0usize, 0usize));
    for t in &tokens {
        let op = match t {
            Token::Whitespace(_) | Token::SemiColon | Token::Period => continue,
            Token::SingleQuotedString(text)
            | Token::DoubleQuotedString(text)
            | Token::NationalStringLiteral(text)
            | Token::HexStringLiteral(text) => {
                let around = levels.iter().sum::<usize>() + levels.len();
                if text.len().saturating_mul(around) > weight {
                    weight = text.len().saturating_mul(around);
                    heavy = (text.len(), around);
                }
                continue;
            }
            Token::Number(..) | Token::Placeholder(_) => continue,
            Token::LParen | Token::LBracket | Token::LBrace => {
                levels.push(0);
                false
            }
            Token::RParen | Token::RBracket | Token::RBrace => {
                if levels.len() > 1 {
                    levels.pop();
                }
                continue;
            }
            Token::Comma => {
                *levels.last_mut().expect("one level") = 0;
                continue;
            }
            Token::Word(w) => match w.keyword {
                Keyword::SELECT
                | Keyword::FROM
                | Keyword::WHERE
                | Keyword::GROUP
                | Keyword::HAVING
                | Keyword::ORDER
                | Keyword::LIMIT
                | Keyword::OFFSET
                | Keyword::ON
                | Keyword::USING
                | Keyword::WHEN
                | Keyword::THEN
                | Keyword::ELSE
                | Keyword::AS
                | Keyword::WITH => {
                    *levels.last_mut().expect("one level") = 0;
                    continue;
                }
                // A CASE opens a level like a parenthesis (its branches may nest further).
                Keyword::CASE => {
                    levels.push(0);
                    false
                }
                Keyword::END => {
                    if levels.len() > 1 {
                        levels.pop();
                    }
                    continue;
                }
                Keyword::UNION | Keyword::INTERSECT | Keyword::EXCEPT | Keyword::JOIN => {
                    chains += 1;
                    continue;
                }
                Keyword::AND
                | Keyword::OR
                | Keyword::XOR
                | Keyword::NOT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::ILIKE
                | Keyword::SIMILAR
                | Keyword::REGEXP
                | Keyword::RLIKE
                | Keyword::BETWEEN
                | Keyword::IN
                | Keyword::COLLATE
                | Keyword::AT
                | Keyword::DIV
                | Keyword::CAST
                | Keyword::INTERVAL => true,
                // Identifiers and other keywords (types, names, DISTINCT …).
                _ => continue,
            },
            // Every other symbol is an operator: arithmetic, comparison, ||, ::, ~, ->, @> …
            _ => true,
        };
        if op {
            *levels.last_mut().expect("one level") += 1;
        }
        depth = depth.max(levels.iter().sum::<usize>() + levels.len());
    }
    if weight > MAX_LITERAL_DEPTH_BYTES {
        return refused!(
            "dpfusion refused the query: a literal of {} bytes stands about {} levels deep in \
             an expression (its bytes times its depth may be at most {MAX_LITERAL_DEPTH_BYTES}: \
             the planner copies it into the name of every expression around it). Compute it \
             in a subquery, or make it shorter.",
            heavy.0,
            heavy.1
        );
    }
    if depth > MAX_DEPTH || chains > MAX_CHAIN {
        return refused!(
            "dpfusion refused the query: the statement is too complex (an expression about \
             {depth} levels deep, {chains} joins or set operations; the limits are {MAX_DEPTH} \
             and {MAX_CHAIN}). Use IN (...) lists instead of long OR chains, split long sums, or \
             split the statement."
        );
    }
    Ok(())
}

/// The arguments of a table function (`generate_series(1, 10)`, `dp_budget('people')`) are
/// numbers or strings written as such. DataFusion evaluates them while it plans the statement,
/// before any check of the plan can see them (the plan keeps only the function's scan), so an
/// expression there could make it allocate without bound (`generate_series(1, CASE WHEN
/// arrow_cast(NULL, 'FixedSizeList(2147483647, Int64)') IS NULL THEN 2 END)`) and end the
/// process.
pub(super) fn check_table_function_args(stmt: &datafusion::sql::parser::Statement) -> Result<()> {
    use datafusion::sql::parser::{CopyToSource, Statement as DFStatement};
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, TableFactor, UnaryOperator, Visit, Visitor,
    };
    use std::ops::ControlFlow;
    struct Args;
    fn literal(e: &Expr) -> bool {
        match e {
            Expr::Value(_) => true,
            Expr::UnaryOp {
                op: UnaryOperator::Minus | UnaryOperator::Plus,
                expr,
            } => matches!(expr.as_ref(), Expr::Value(_)),
            _ => false,
        }
    }
    impl Visitor for Args {
        type Break = String;
        fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<String> {
            let args: Vec<&FunctionArg> = match t {
                TableFactor::Table {
                    name,
                    args: Some(a),
                    ..
                } => {
                    if a.args.iter().all(|a| match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(e))
                        | FunctionArg::Named {
                            arg: FunctionArgExpr::Expr(e),
                            ..
                        } => literal(e),
                        _ => false,
                    }) {
                        return ControlFlow::Continue(());
                    }
                    return ControlFlow::Break(format!(
                        "the arguments of the table function {name} must be numbers or strings \
                         written as such (DataFusion evaluates them while it plans, before any \
                         check); compute the value in the query instead"
                    ));
                }
                TableFactor::Function { args, .. } => args.iter().collect(),
                TableFactor::TableFunction { .. } => {
                    return ControlFlow::Break(
                        "a TABLE(...) function in FROM is not supported".into(),
                    );
                }
                _ => return ControlFlow::Continue(()),
            };
            if args.is_empty() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(
                    "a table function with arguments in this form is not supported".into(),
                )
            }
        }
    }
    let found = match stmt {
        DFStatement::Statement(s) => s.visit(&mut Args),
        DFStatement::Explain(e) => return check_table_function_args(&e.statement),
        DFStatement::CopyTo(c) => match &c.source {
            CopyToSource::Query(q) => q.visit(&mut Args),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        _ => ControlFlow::Continue(()),
    };
    match found {
        ControlFlow::Break(why) => refused!("dpfusion refused the query: {why}"),
        ControlFlow::Continue(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long literal deep in an expression is refused before it is parsed (planning it took
    /// minutes); the same literal near the top, and a deep expression of short literals, pass.
    #[test]
    fn a_long_literal_deep_in_an_expression_is_refused() {
        let literal = format!("'{}'", "x".repeat(500_000));
        let nested = |levels: usize| {
            let mut e = format!("concat(CAST(random() AS VARCHAR), {literal})");
            for _ in 0..levels {
                e = format!("reverse({e})");
            }
            format!("SELECT length({e})")
        };
        let e = check_complexity(&nested(20))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("a literal of 500000 bytes stands about"), "{e}");
        check_complexity(&nested(2)).expect("a long literal near the top");
        let mut short = "concat(CAST(random() AS VARCHAR), 'abc')".to_string();
        for _ in 0..60 {
            short = format!("reverse({short})");
        }
        check_complexity(&format!("SELECT {short}")).expect("short literals, deep");
    }
}
