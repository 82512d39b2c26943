//! The private fragment: the positive definition of what may stand between a private scan and a
//! DP aggregate (docs/PRIVACY.md, "The private fragment"). Anything not listed here is refused at
//! planning.
//!
//! Plan nodes: `TableScan` (of one private table, without LIMIT), `Projection`, `Filter`,
//! `SubqueryAlias`. Expressions (an uncorrelated scalar subquery counts as a constant): the kinds of [`check_expr`], the operators of [`operator_ok`],
//! the scalar functions of [`SCALAR_FUNCTIONS`]. Every one of them is evaluated totally (an error
//! on a row makes that value NULL: see [`super::total`]) and its cost per row is bounded by the
//! size of the row and of the query text, never by a number the analyst chooses: functions such as
//! `repeat`, `lpad`, `rpad`, `replace`, `range`, `array_repeat` or `levenshtein` are not in the
//! list. Per expression, the limits of [`Limits`] bound how much one row can be copied.
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, Operator};

/// Scalar functions allowed over private rows. Each is total once wrapped (errors → NULL), and
/// its output is at most a constant times the size of its inputs (literals included).
pub const SCALAR_FUNCTIONS: &[&str] = &[
    // numbers
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "cos",
    "cosh",
    "cot",
    "degrees",
    "exp",
    "floor",
    "isnan",
    "iszero",
    "ln",
    "log",
    "log10",
    "log2",
    "nanvl",
    "pi",
    "power",
    "pow",
    "radians",
    "round",
    "signum",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    "greatest",
    "least",
    // NULL handling and conditionals
    "coalesce",
    "nullif",
    "nvl",
    "nvl2",
    "ifnull",
    // strings (output no longer than the inputs together)
    "ascii",
    "bit_length",
    "btrim",
    "char_length",
    "character_length",
    "chr",
    "concat",
    "concat_ws",
    "contains",
    "ends_with",
    "initcap",
    "instr",
    "left",
    "length",
    "lower",
    "ltrim",
    "octet_length",
    "reverse",
    "right",
    "rtrim",
    "split_part",
    "starts_with",
    "strpos",
    "substr",
    "substring",
    "translate",
    "trim",
    "upper",
    // dates and times
    "date_part",
    "datepart",
    "date_trunc",
    "datetrunc",
    "date_bin",
    "make_date",
    "to_date",
    "to_timestamp",
    "to_timestamp_seconds",
    "to_timestamp_millis",
    "to_timestamp_micros",
    "to_timestamp_nanos",
    "to_unixtime",
    "from_unixtime",
    "arrow_cast",
    // lists and structs (model features: [x1, x2] is make_array)
    "make_array",
    "make_list",
    "array_element",
    "array_length",
    "cardinality",
    "get_field",
    "named_struct",
    "struct",
    // released models applied to rows (free post-processing of a release)
    "linreg_predict",
    "logreg_predict_proba",
];

/// Bounds per expression over private rows, so that no expression can copy a row many times.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Expression nodes.
    pub nodes: usize,
    /// Column references (each may copy a cell once).
    pub columns: usize,
    /// Bytes of one string literal.
    pub literal_bytes: usize,
    /// Items of an IN list.
    pub in_list: usize,
}

pub const LIMITS: Limits = Limits {
    nodes: 512,
    columns: 32,
    literal_bytes: 1024,
    in_list: 10_000,
};

/// Binary operators allowed over private rows (all total once wrapped, constant cost per row,
/// output no larger than the operands). Regular expressions only with a literal pattern.
pub fn operator_ok(op: &Operator, right: &Expr) -> bool {
    use Operator::*;
    match op {
        Eq | NotEq | Lt | LtEq | Gt | GtEq | Plus | Minus | Multiply | Divide | Modulo | And
        | Or | IsDistinctFrom | IsNotDistinctFrom | BitwiseAnd | BitwiseOr | BitwiseXor
        | BitwiseShiftRight | BitwiseShiftLeft | StringConcat | IntegerDivide => true,
        RegexMatch | RegexIMatch | RegexNotMatch | RegexNotIMatch | LikeMatch | ILikeMatch
        | NotLikeMatch | NotILikeMatch => is_literal(right),
        _ => false,
    }
}

fn is_literal(e: &Expr) -> bool {
    match e {
        Expr::Literal(..) => true,
        Expr::Cast(c) => is_literal(&c.expr),
        Expr::TryCast(c) => is_literal(&c.expr),
        Expr::Alias(a) => is_literal(&a.expr),
        _ => false,
    }
}

fn literal_len(v: &ScalarValue) -> usize {
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => s.len(),
        ScalarValue::Binary(Some(b))
        | ScalarValue::LargeBinary(Some(b))
        | ScalarValue::BinaryView(Some(b))
        | ScalarValue::FixedSizeBinary(_, Some(b)) => b.len(),
        _ => 0,
    }
}

/// Why `e` is not in the private fragment (None: it is). `what` names the place (e.g. "WHERE").
pub fn check_expr(e: &Expr) -> Option<String> {
    let mut why = None;
    let mut nodes = 0usize;
    let mut columns = 0usize;
    // The model arguments of the predict functions (a released model may come from a subquery).
    let mut models: Vec<&Expr> = Vec::new();
    let _ = e.apply(|x| {
        if let Expr::ScalarFunction(f) = x
            && matches!(f.func.name(), "linreg_predict" | "logreg_predict_proba")
            && let Some(m) = f.args.first()
        {
            models.push(m);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let _ = e.apply(|x| {
        nodes += 1;
        let bad: Option<String> = match x {
            Expr::Column(_) => {
                columns += 1;
                None
            }
            Expr::Literal(v, _) => (literal_len(v) > LIMITS.literal_bytes).then(|| {
                format!(
                    "a literal of {} bytes (at most {} over private rows)",
                    literal_len(v),
                    LIMITS.literal_bytes
                )
            }),
            Expr::Alias(_)
            | Expr::Not(_)
            | Expr::IsNotNull(_)
            | Expr::IsNull(_)
            | Expr::IsTrue(_)
            | Expr::IsFalse(_)
            | Expr::IsUnknown(_)
            | Expr::IsNotTrue(_)
            | Expr::IsNotFalse(_)
            | Expr::IsNotUnknown(_)
            | Expr::Negative(_)
            | Expr::Between(_)
            | Expr::Case(_)
            | Expr::Cast(_)
            | Expr::TryCast(_) => None,
            Expr::BinaryExpr(b) => (!operator_ok(&b.op, &b.right)).then(|| {
                format!(
                    "the operator {} (regular expressions and LIKE need a literal pattern)",
                    b.op
                )
            }),
            Expr::Like(l) => (!is_literal(&l.pattern))
                .then(|| "LIKE with a pattern that is not a literal".to_string()),
            Expr::InList(l) => {
                if l.list.len() > LIMITS.in_list {
                    Some(format!(
                        "an IN list of {} items (at most {})",
                        l.list.len(),
                        LIMITS.in_list
                    ))
                } else if !l.list.iter().all(is_literal) {
                    Some("an IN list whose items are not literals".to_string())
                } else {
                    None
                }
            }
            Expr::ScalarFunction(f) => {
                let name = f.func.name();
                (!SCALAR_FUNCTIONS.contains(&name)).then(|| {
                    format!(
                        "the function {name}() (not in the list of functions allowed over \
                         private rows: docs/PRIVACY.md, \"The private fragment\")"
                    )
                })
            }
            Expr::AggregateFunction(f) => Some(format!(
                "the aggregate {}() inside a row expression",
                f.func.name()
            )),
            Expr::WindowFunction(_) => Some("a window function".to_string()),
            // An uncorrelated scalar subquery is evaluated once, before the rows: a constant for
            // the private region. Its own plan is guarded like any query (it may read public
            // tables or DP releases, never raw private rows).
            Expr::ScalarSubquery(s) if s.outer_ref_columns.is_empty() => {
                let t = s.subquery.schema().field(0).data_type().clone();
                let fixed = t.is_primitive() || t == DataType::Boolean || t == DataType::Null;
                let model =
                    matches!(t, DataType::Struct(_)) && models.iter().any(|m| std::ptr::eq(*m, x));
                (!fixed && !model).then(|| {
                    format!(
                        "a scalar subquery of type {t} (over private rows a subquery may give a \
                         number, a boolean or a date, or a released model as the first argument \
                         of linreg_predict/logreg_predict_proba: a larger value would be copied \
                         once per row)"
                    )
                })
            }
            Expr::ScalarSubquery(_) => Some("a correlated subquery".to_string()),
            Expr::InSubquery(_) | Expr::Exists(_) | Expr::SetComparison(_) => {
                Some("a subquery".to_string())
            }
            Expr::SimilarTo(_) => Some("SIMILAR TO".to_string()),
            Expr::Placeholder(_) => Some("a placeholder ($1)".to_string()),
            Expr::OuterReferenceColumn(..) => Some("a correlated (outer) column".to_string()),
            Expr::ScalarVariable(..) => Some("a variable".to_string()),
            Expr::Unnest(_) => Some("UNNEST".to_string()),
            Expr::GroupingSet(_) => Some("GROUPING SETS, ROLLUP or CUBE".to_string()),
            other => Some(format!("the expression kind {}", other.variant_name())),
        };
        if bad.is_some() {
            why = bad;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if why.is_some() {
        return why;
    }
    if nodes > LIMITS.nodes {
        return Some(format!(
            "an expression of {nodes} nodes (at most {} over private rows)",
            LIMITS.nodes
        ));
    }
    if columns > LIMITS.columns {
        return Some(format!(
            "an expression with {columns} column references (at most {} over private rows)",
            LIMITS.columns
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn fragment_accepts_row_expressions_and_refuses_the_rest() {
        assert!(check_expr(&(col("a") + lit(1))).is_none());
        assert!(check_expr(&col("a").like(lit("x%"))).is_none());
        assert!(check_expr(&col("a").like(col("b"))).is_some());
        assert!(check_expr(&lit("x".repeat(2000))).is_some());
        let many = (0..40).fold(col("a"), |e, _| e + col("a"));
        assert!(check_expr(&many).is_some());
        assert!(SCALAR_FUNCTIONS.iter().all(|f| {
            ![
                "repeat",
                "lpad",
                "rpad",
                "replace",
                "range",
                "array_repeat",
                "levenshtein",
            ]
            .contains(f)
        }));
    }
}
