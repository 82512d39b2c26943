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
    for t in &tokens {
        let op = match t {
            Token::Whitespace(_) | Token::SemiColon | Token::Period => continue,
            Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::Placeholder(_) => continue,
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
