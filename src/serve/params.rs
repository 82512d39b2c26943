//! Parameters of prepared statements (`?`, `?N`, `$N`): bound into the SQL text as literals of
//! their declared Arrow type *before* the statement is parsed, so the guard checks, and the
//! accountant charges, exactly the plan that runs — a bound statement is a statement the analyst
//! could have typed.
//!
//! Placeholders are found by the SQL tokenizer of the session's dialect (never inside a string,
//! an identifier or a comment) and replaced by the text of a literal: `5`, `0.25`, `'it''s'`,
//! `TRUE`, `NULL` for the types a literal of the SQL text has (Int64, Float64, Utf8, Boolean);
//! `CAST(… AS type)` for the others (other integers, Float32, Date32, Decimal128). Negative
//! numbers are parenthesised (`(-5)`), which the planner folds into a literal as when written.

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// Why parameters cannot be bound (a message for the analyst).
pub type BindError = String;

/// A prepared statement's handle. The server keeps no state: the handle is the statement's SQL
/// text, held by the client; once parameters are bound, it is [`BOUND`], the SQL with
/// placeholders (for the next binding: Flight SQL clients send the latest handle) and the bound
/// SQL that runs. A client that forges a handle only sends SQL, which runs as any statement does
/// (guard, admission, limits).
#[derive(Debug, PartialEq)]
pub struct Handle {
    pub sql: String,
    pub bound: Option<String>,
}

/// The first bytes of a handle with bound parameters, then JSON `[sql, bound]` (SQL text never
/// starts with a NUL byte).
const BOUND: &[u8] = b"\0dpfusion-bound\0";

impl Handle {
    pub fn decode(bytes: &[u8]) -> Result<Self, BindError> {
        if let Some(json) = bytes.strip_prefix(BOUND) {
            let (sql, bound): (String, String) = serde_json::from_slice(json)
                .map_err(|_| "the prepared statement handle is damaged: prepare it again")?;
            return Ok(Handle {
                sql,
                bound: Some(bound),
            });
        }
        let sql = String::from_utf8(bytes.to_vec())
            .map_err(|_| "the prepared statement handle is not UTF-8 text: send SQL text")?;
        Ok(Handle { sql, bound: None })
    }

    pub fn encode(&self) -> Vec<u8> {
        match &self.bound {
            None => self.sql.clone().into_bytes(),
            Some(bound) => {
                let mut out = BOUND.to_vec();
                out.extend(serde_json::to_vec(&(&self.sql, bound)).unwrap_or_default());
                out
            }
        }
    }

    /// The SQL that runs.
    pub fn runs(&self) -> &str {
        self.bound.as_deref().unwrap_or(&self.sql)
    }
}

/// A placeholder's place in the SQL text (byte range) and which parameter it takes (0-based).
struct Slot {
    start: usize,
    end: usize,
    index: usize,
}

/// The placeholders of `sql`, in order.
fn slots(sql: &str) -> Result<Vec<Slot>, BindError> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| format!("the SQL text cannot be read: {e}"))?;
    // Line and column (1-based, in characters) to byte offsets, by one cursor that only moves
    // forward: the tokens come in order, so the whole text is walked once (scanning each line
    // from its start for every placeholder was quadratic: 8,000 `?` took 2.3 s on the threads
    // that serve every client, review r45).
    let mut at = (1u64, 1u64, 0usize);
    let mut offset = |line: u64, column: u64| -> Option<usize> {
        while (at.0, at.1) < (line, column) {
            let c = sql[at.2..].chars().next()?;
            at = match c {
                '\n' => (at.0 + 1, 1, at.2 + 1),
                c => (at.0, at.1 + 1, at.2 + c.len_utf8()),
            };
        }
        ((at.0, at.1) == (line, column)).then_some(at.2)
    };
    let mut out = Vec::new();
    let mut next = 0usize;
    for t in tokens {
        let Token::Placeholder(p) = &t.token else {
            continue;
        };
        let index = if p == "?" {
            next += 1;
            next - 1
        } else if let Some(n) = p
            .strip_prefix('?')
            .or_else(|| p.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n >= 1)
        {
            n - 1
        } else {
            return Err(format!(
                "the placeholder {p} is not supported: use ? (in order) or $1, $2, … (by \
                 position)"
            ));
        };
        let (Some(start), Some(end)) = (
            offset(t.span.start.line, t.span.start.column),
            offset(t.span.end.line, t.span.end.column),
        ) else {
            return Err("the SQL text cannot be read: a placeholder's place is unknown".into());
        };
        if sql.get(start..end) != Some(p.as_str()) {
            return Err("the SQL text cannot be read: a placeholder's place is unknown".into());
        }
        out.push(Slot { start, end, index });
    }
    Ok(out)
}

/// How many parameters `sql` takes (the largest index used).
pub fn count(sql: &str) -> Result<usize, BindError> {
    Ok(slots(sql)?.iter().map(|s| s.index + 1).max().unwrap_or(0))
}

/// `sql` with row `row` of `params` bound into it (column i is parameter i+1).
pub fn bind(sql: &str, params: &RecordBatch, row: usize) -> Result<String, BindError> {
    let slots = slots(sql)?;
    let needed = slots.iter().map(|s| s.index + 1).max().unwrap_or(0);
    if params.num_columns() != needed {
        return Err(format!(
            "the statement takes {needed} parameter(s), and {} value(s) were sent: send one \
             value per placeholder",
            params.num_columns()
        ));
    }
    let mut out = String::with_capacity(sql.len() + 18 * slots.len());
    let mut at = 0;
    for s in &slots {
        out.push_str(&sql[at..s.start]);
        // Spaces around the literal: it never fuses with the token before or after it (`E?`
        // would otherwise read `E'…'`, an escape string; `1?` a longer number; `'a'?` one string).
        out.push(' ');
        out.push_str(
            &literal(params.column(s.index).as_ref(), row).map_err(|why| {
                format!(
                    "parameter {} ({}): {why}",
                    s.index + 1,
                    params.schema().field(s.index).name()
                )
            })?,
        );
        out.push(' ');
        at = s.end;
    }
    out.push_str(&sql[at..]);
    Ok(out)
}

/// The SQL type name of an Arrow type a parameter may have, for `CAST(… AS name)`.
fn sql_type(t: &DataType) -> Option<String> {
    Some(match t {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::UInt8 => "TINYINT UNSIGNED".into(),
        DataType::UInt16 => "SMALLINT UNSIGNED".into(),
        DataType::UInt32 => "INT UNSIGNED".into(),
        DataType::UInt64 => "BIGINT UNSIGNED".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        _ => return None,
    })
}

/// A quoted SQL string.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A number's text, parenthesised when negative (so that `x-?` never reads `x--5`).
fn number(text: String) -> String {
    if text.starts_with('-') {
        format!("({text})")
    } else {
        text
    }
}

/// The SQL text of the literal in row `row` of `a`, of `a`'s type.
fn literal(a: &dyn Array, row: usize) -> Result<String, String> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Float32Type, Float64Type, Int64Type};
    let t = a.data_type();
    let Some(name) = sql_type(t) else {
        return Err(format!(
            "values of type {t} cannot be parameters: send booleans, integers, floating-point \
             numbers, decimals, strings or dates"
        ));
    };
    if a.is_null(row) {
        return Ok(format!("CAST(NULL AS {name})"));
    }
    let cast = |text: String| format!("CAST({text} AS {name})");
    Ok(match t {
        DataType::Boolean => {
            if a.as_boolean().value(row) {
                "TRUE".into()
            } else {
                "FALSE".into()
            }
        }
        // The literal types of SQL text: written as they would be typed.
        DataType::Int64 => number(a.as_primitive::<Int64Type>().value(row).to_string()),
        DataType::Float64 => {
            let v = a.as_primitive::<Float64Type>().value(row);
            if v.is_finite() {
                // `{:?}` is the shortest text that reads back as the same f64 (`0.1`, `1e-7`),
                // always with a '.' or an exponent, so that SQL reads a Float64.
                number(format!("{v:?}"))
            } else {
                cast(quoted(&v.to_string()))
            }
        }
        DataType::Float32 => {
            let v = a.as_primitive::<Float32Type>().value(row);
            cast(quoted(&v.to_string()))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = array_value_to_string(a, row).map_err(|e| e.to_string())?;
            quoted(&s)
        }
        DataType::Date32 | DataType::Decimal128(..) => {
            let s = array_value_to_string(a, row).map_err(|e| e.to_string())?;
            cast(quoted(&s))
        }
        // The other integers.
        _ => {
            let s = array_value_to_string(a, row).map_err(|e| e.to_string())?;
            cast(number(s))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array, Int64Array,
        StringArray,
    };
    use std::sync::Arc;

    fn batch(cols: Vec<ArrayRef>) -> RecordBatch {
        RecordBatch::try_from_iter(
            cols.into_iter()
                .enumerate()
                .map(|(i, c)| (format!("p{i}"), c)),
        )
        .unwrap()
    }

    #[test]
    fn placeholders_outside_strings_and_comments_are_bound_as_typed_literals() {
        let sql = "SELECT dp_count(id, ?) AS n, '?' AS q /* ? */ FROM t WHERE dept = ? -- ?\n AND x-? > $1";
        assert_eq!(count(sql).unwrap(), 3);
        let b = batch(vec![
            Arc::new(Float64Array::from(vec![0.25])),
            Arc::new(StringArray::from(vec!["it's"])),
            Arc::new(Int64Array::from(vec![-5])),
        ]);
        assert_eq!(
            bind(sql, &b, 0).unwrap(),
            "SELECT dp_count(id,  0.25 ) AS n, '?' AS q /* ? */ FROM t WHERE dept =  'it''s'  -- ?\n AND x- (-5)  >  0.25 "
        );
    }

    #[test]
    fn each_type_is_a_literal_of_that_type() {
        let one = |a: ArrayRef| literal(a.as_ref(), 0).unwrap();
        assert_eq!(one(Arc::new(Float64Array::from(vec![1e-7]))), "1e-7");
        assert_eq!(one(Arc::new(Float64Array::from(vec![3.0]))), "3.0");
        assert_eq!(
            one(Arc::new(Float64Array::from(vec![f64::NAN]))),
            "CAST('NaN' AS DOUBLE)"
        );
        assert_eq!(one(Arc::new(Int32Array::from(vec![7]))), "CAST(7 AS INT)");
        assert_eq!(
            one(Arc::new(Float32Array::from(vec![0.5]))),
            "CAST('0.5' AS REAL)"
        );
        assert_eq!(one(Arc::new(BooleanArray::from(vec![true]))), "TRUE");
        assert_eq!(
            one(Arc::new(Date32Array::from(vec![0]))),
            "CAST('1970-01-01' AS DATE)"
        );
        assert_eq!(
            one(Arc::new(Int64Array::from(vec![None::<i64>]))),
            "CAST(NULL AS BIGINT)"
        );
        let bin: ArrayRef = Arc::new(datafusion::arrow::array::BinaryArray::from(vec![
            b"x".as_ref(),
        ]));
        assert!(
            literal(bin.as_ref(), 0)
                .unwrap_err()
                .contains("cannot be parameters")
        );
    }

    #[test]
    fn a_handle_keeps_its_placeholders_once_bound() {
        let plain = Handle::decode(b"SELECT ?").unwrap();
        assert_eq!(plain.runs(), "SELECT ?");
        let bound = Handle {
            sql: "SELECT ?".into(),
            bound: Some("SELECT 1".into()),
        };
        let back = Handle::decode(&bound.encode()).unwrap();
        assert_eq!(back, bound);
        assert_eq!(back.runs(), "SELECT 1");
        assert!(Handle::decode(b"\0dpfusion-bound\0{").is_err());
    }

    #[test]
    fn a_wrong_number_of_values_or_a_named_placeholder_is_refused() {
        let b = batch(vec![Arc::new(Int64Array::from(vec![1]))]);
        assert!(bind("SELECT ?, ?", &b, 0).unwrap_err().contains("takes 2"));
        assert!(count("SELECT $0").unwrap_err().contains("not supported"));
        assert_eq!(count("SELECT $2, ?").unwrap(), 2);
    }
}
