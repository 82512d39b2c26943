//! Total evaluation over private rows (docs/PRIVACY.md, "The private fragment").
//!
//! A failure is itself a bit: if an expression over private rows could fail on a row the analyst
//! picks (a CAST that does not parse, an integer overflow, a division by zero inside a CASE …),
//! whether the query fails would tell whether such a row exists. So every non-trivial expression
//! between a private scan and a DP aggregate is wrapped in [`TotalExpr`]: it evaluates the
//! expression on the whole batch and, only if that fails (or panics), evaluates it again row by
//! row and makes the value NULL on exactly the rows that fail. The result is the same as the
//! expression wherever the expression is defined, and NULL elsewhere; DP aggregates skip NULLs,
//! filters drop them.
use std::any::Any;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, new_null_array};
use datafusion::arrow::compute::concat;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::physical_expr::expressions::{Column as PhysicalColumn, Literal};
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};

/// The name under which a wrapped expression appears in plans.
pub const TOTAL: &str = "dp_total";

/// An expression over private rows, made total: NULL wherever the expression fails.
#[derive(Debug)]
pub struct TotalExpr {
    /// The expression, over the columns `__c0 … __cN` (the call's arguments, in order).
    inner: Expr,
    schema: Arc<Schema>,
    physical: Arc<dyn PhysicalExpr>,
    return_type: DataType,
    signature: Signature,
}

impl PartialEq for TotalExpr {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.schema == other.schema
    }
}
impl Eq for TotalExpr {}
impl Hash for TotalExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

/// Does `e` need wrapping? A column, a literal, and a CAST of a numeric or boolean column to a
/// floating-point type (which the DP aggregates' argument coercion inserts) cannot fail. A CAST
/// of a string can (a value that does not parse), so it is wrapped.
fn trivially_total(e: &Expr, schema: &DFSchema) -> bool {
    match e {
        Expr::Column(_) | Expr::Literal(..) => true,
        Expr::Alias(a) => trivially_total(&a.expr, schema),
        Expr::Cast(datafusion::logical_expr::Cast { expr, field })
        | Expr::TryCast(datafusion::logical_expr::TryCast { expr, field }) => {
            matches!(field.data_type(), DataType::Float64 | DataType::Float32)
                && matches!(expr.as_ref(), Expr::Column(_))
                && expr
                    .get_type(schema)
                    .is_ok_and(|t| t.is_numeric() || t == DataType::Boolean)
        }
        _ => false,
    }
}

/// `e` rewritten at planning into forms that cannot fail, so that the last-resort wrapper's
/// row-by-row fallback is never taken for them (issue 26, class 2: a batch that fails runs
/// measurably slower, a timing signal):
/// - `CAST(x AS t)` and `arrow_cast(x, 't')` become `TRY_CAST(x AS t)` (NULL where x does not
///   convert; the target was checked at planning: fragment::cast_target);
/// - `split_part(s, d, n)` becomes `CASE WHEN n <> 0 THEN split_part(s, d, n) END`;
/// - integer and decimal `a / b`, `a % b`, `a DIV b` become `CASE WHEN b <> 0 [AND NOT (b = -1
///   AND a = MIN)] THEN a op b END` (NULL on a zero divisor and on the one signed overflow; the
///   CASE evaluates the division only on the rows its condition selects). Float division never
///   fails (±inf, NaN).
///
/// Everything else that may fail on some value stays behind the wrapper ([`wrap`]);
/// docs/PRIVACY.md lists which functions those are.
pub fn total_form(e: Expr, schema: &DFSchema) -> Result<Expr> {
    use datafusion::logical_expr::{BinaryExpr, Operator, TryCast, lit, when};
    Ok(e.transform_up(|x| match &x {
        Expr::Cast(c) => Ok(Transformed::yes(Expr::TryCast(TryCast::new_from_field(
            c.expr.clone(),
            c.field.clone(),
        )))),
        Expr::ScalarFunction(f) if f.func.name() == "arrow_cast" && !f.args.is_empty() => {
            let t = x.get_type(schema)?;
            Ok(Transformed::yes(Expr::TryCast(TryCast::new(
                Box::new(f.args[0].clone()),
                t,
            ))))
        }
        // split_part(s, d, 0) fails (positions count from 1, or from -1 at the end).
        Expr::ScalarFunction(f) if f.func.name() == "split_part" && f.args.len() == 3 => {
            let n = f.args[2].clone();
            let zero = ScalarValue::new_zero(&n.get_type(schema)?)?;
            Ok(Transformed::yes(
                when(n.not_eq(lit(zero)), x.clone()).end()?,
            ))
        }
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Divide | Operator::Modulo | Operator::IntegerDivide,
            right,
        }) => {
            let t = x.get_type(schema)?;
            let rt = right.get_type(schema)?;
            if !(t.is_integer() || t.is_decimal()) {
                return Ok(Transformed::no(x));
            }
            let zero = ScalarValue::new_zero(&rt)?;
            let mut safe = right.as_ref().clone().not_eq(lit(zero));
            if rt.is_signed_integer() {
                let lt = left.get_type(schema)?;
                if let (Ok(minus_one), Some(min)) =
                    (ScalarValue::new_negative_one(&rt), ScalarValue::min(&lt))
                {
                    let overflow = right
                        .as_ref()
                        .clone()
                        .eq(lit(minus_one))
                        .and(left.as_ref().clone().eq(lit(min)));
                    safe = safe.and(!overflow);
                }
            }
            Ok(Transformed::yes(when(safe, x.clone()).end()?))
        }
        _ => Ok(Transformed::no(x)),
    })?
    .data)
}

/// `e` (an expression over `schema`), made total. Returns `e` itself when it cannot fail.
/// Rewritten first into its total form ([`total_form`]); the wrapper is the last resort for
/// what may still fail.
pub fn wrap(e: Expr, schema: &DFSchema) -> Result<Expr> {
    if trivially_total(&e, schema) {
        return Ok(e);
    }
    let e = total_form(e, schema)?;
    if trivially_total(&e, schema) {
        return Ok(e);
    }
    // A feature list keeps its shape ([x1, …, xk] is make_array of k arguments, which the model
    // aggregates read at planning): its elements are made total one by one.
    if let Expr::ScalarFunction(f) = &e
        && matches!(f.func.name(), "make_array" | "make_list")
    {
        let args = f
            .args
            .iter()
            .map(|a| wrap(a.clone(), schema))
            .collect::<Result<Vec<_>>>()?;
        return Ok(Expr::ScalarFunction(
            datafusion::logical_expr::expr::ScalarFunction::new_udf(f.func.clone(), args),
        ));
    }
    // Replace each distinct column (and each scalar subquery, which the planner evaluates once,
    // before the rows) by __ci; the call's arguments are those expressions.
    let mut cols: Vec<Expr> = Vec::new();
    let inner = e
        .clone()
        .transform_up(|x| {
            if matches!(x, Expr::Column(_) | Expr::ScalarSubquery(_)) {
                let i = match cols.iter().position(|k| k == &x) {
                    Some(i) => i,
                    None => {
                        cols.push(x.clone());
                        cols.len() - 1
                    }
                };
                return Ok(Transformed::yes(Expr::Column(Column::from_name(format!(
                    "__c{i}"
                )))));
            }
            Ok(Transformed::no(x))
        })?
        .data;
    let mut fields = Vec::with_capacity(cols.len());
    for (i, c) in cols.iter().enumerate() {
        let t = c.get_type(schema)?;
        fields.push(Field::new(format!("__c{i}"), t, true));
    }
    let arrow = Arc::new(Schema::new(fields));
    let df = DFSchema::try_from(arrow.as_ref().clone())?;
    let return_type = inner.get_type(&df)?;
    let physical = create_physical_expr(&inner, &df, &ExecutionProps::new(), &Default::default())?;
    let udf = TotalExpr {
        inner,
        schema: arrow,
        physical,
        return_type,
        signature: if cols.is_empty() {
            Signature::nullary(Volatility::Volatile)
        } else {
            Signature::any(cols.len(), Volatility::Volatile)
        },
    };
    let args = cols;
    Ok(Expr::ScalarFunction(
        datafusion::logical_expr::expr::ScalarFunction::new_udf(
            Arc::new(ScalarUDF::new_from_impl(udf)),
            args,
        ),
    ))
}

/// `e` with every wrapper removed (for a cluster, whose codec resolves functions by name).
pub fn unwrap(e: Expr) -> Result<Expr> {
    Ok(e.transform_up(|x| {
        if let Expr::ScalarFunction(f) = &x
            && let Some(t) = (f.func.inner().as_ref() as &dyn Any).downcast_ref::<TotalExpr>()
        {
            let args = f.args.clone();
            let inner = t
                .inner
                .clone()
                .transform_up(|y| {
                    if let Expr::Column(c) = &y
                        && let Some(i) = c.name.strip_prefix("__c")
                        && let Ok(i) = i.parse::<usize>()
                        && let Some(a) = args.get(i)
                    {
                        return Ok(Transformed::yes(a.clone()));
                    }
                    Ok(Transformed::no(y))
                })?
                .data;
            return Ok(Transformed::yes(inner));
        }
        Ok(Transformed::no(x))
    })?
    .data)
}

impl TotalExpr {
    fn eval(&self, physical: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<ArrayRef> {
        let n = batch.num_rows();
        let out = catch_unwind(AssertUnwindSafe(|| {
            physical.evaluate(batch).and_then(|v| v.into_array(n))
        }));
        let failed =
            || datafusion::common::DataFusionError::Execution("row expression failed".into());
        match out {
            Ok(Ok(a)) if a.len() == n && a.data_type() == &self.return_type => Ok(a),
            // A kernel may return another layout of the same logical type (e.g. Utf8View).
            Ok(Ok(a)) if a.len() == n => {
                datafusion::arrow::compute::cast(&a, &self.return_type).map_err(|_| failed())
            }
            _ => Err(failed()),
        }
    }
}

impl ScalarUDFImpl for TotalExpr {
    fn name(&self) -> &str {
        TOTAL
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.return_type.clone())
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        // A scalar argument (a scalar subquery's value, a folded constant) stays a literal: it is
        // never copied once per row.
        let mut physical = self.physical.clone();
        let mut columns = Vec::with_capacity(args.args.len());
        for (i, a) in args.args.into_iter().enumerate() {
            match a {
                ColumnarValue::Array(a) => columns.push(a),
                ColumnarValue::Scalar(s) => {
                    columns.push(new_null_array(self.schema.field(i).data_type(), n));
                    physical = physical
                        .transform(|e| {
                            if let Some(c) =
                                (e.as_ref() as &dyn Any).downcast_ref::<PhysicalColumn>()
                                && c.index() == i
                            {
                                return Ok(Transformed::yes(
                                    Arc::new(Literal::new(s.clone())) as Arc<dyn PhysicalExpr>
                                ));
                            }
                            Ok(Transformed::no(e))
                        })?
                        .data;
                }
            }
        }
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        if let Ok(a) = self.eval(&physical, &batch) {
            return Ok(ColumnarValue::Array(a));
        }
        // Some row fails: evaluate row by row, NULL where it fails.
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(n);
        for i in 0..n {
            parts.push(
                self.eval(&physical, &batch.slice(i, 1))
                    .unwrap_or_else(|_| new_null_array(&self.return_type, 1)),
            );
        }
        if parts.is_empty() {
            return Ok(ColumnarValue::Array(new_null_array(&self.return_type, 0)));
        }
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        Ok(ColumnarValue::Array(concat(&refs)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::logical_expr::{cast, col, lit};

    fn run(e: Expr, batch: RecordBatch) -> ArrayRef {
        let df = DFSchema::try_from(batch.schema().as_ref().clone()).unwrap();
        let w = wrap(e, &df).unwrap();
        let p = create_physical_expr(&w, &df, &ExecutionProps::new(), &Default::default()).unwrap();
        p.evaluate(&batch)
            .unwrap()
            .into_array(batch.num_rows())
            .unwrap()
    }

    #[test]
    fn failing_rows_become_null_and_the_others_keep_their_value() {
        let b = RecordBatch::try_from_iter([
            (
                "s",
                Arc::new(StringArray::from(vec!["1", "x", "3"])) as ArrayRef,
            ),
            ("i", Arc::new(Int64Array::from(vec![1, 0, 2])) as ArrayRef),
        ])
        .unwrap();
        // CAST of a non-number fails on row 2 only.
        let a = run(cast(col("s"), DataType::Int64), b.clone());
        let a = a.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![Some(1), None, Some(3)]);
        // Integer division by zero on row 2 only.
        let a = run(lit(10i64) / col("i"), b.clone());
        let a = a.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![Some(10), None, Some(5)]);
        // DataFusion's integer + wraps (no error to catch): the wrapper changes nothing.
        let a = run(col("i") + lit(i64::MAX), b);
        let a = a.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![Some(i64::MIN), Some(i64::MAX), Some(i64::MIN + 1)]
        );
    }

    /// Issue 26, class 2: casts and integer divisions are rewritten into total forms, so a batch
    /// with failing rows evaluates at once (the row-by-row fallback is not taken).
    #[test]
    fn total_forms_evaluate_without_error() {
        let b = RecordBatch::try_from_iter([
            (
                "s",
                Arc::new(StringArray::from(vec!["1", "x", "3"])) as ArrayRef,
            ),
            ("i", Arc::new(Int64Array::from(vec![1, 0, -1])) as ArrayRef),
        ])
        .unwrap();
        let df = DFSchema::try_from(b.schema().as_ref().clone()).unwrap();
        let eval = |e: Expr| {
            let t = total_form(e, &df).unwrap();
            let p =
                create_physical_expr(&t, &df, &ExecutionProps::new(), &Default::default()).unwrap();
            let a = p.evaluate(&b).expect("no error").into_array(3).unwrap();
            a.as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .iter()
                .collect::<Vec<_>>()
        };
        assert!(matches!(
            total_form(cast(col("s"), DataType::Int64), &df).unwrap(),
            Expr::TryCast(_)
        ));
        assert_eq!(
            eval(cast(col("s"), DataType::Int64)),
            vec![Some(1), None, Some(3)]
        );
        assert_eq!(eval(lit(10i64) / col("i")), vec![Some(10), None, Some(-10)]);
        assert_eq!(eval(lit(10i64) % col("i")), vec![Some(0), None, Some(0)]);
        // i64::MIN / -1 overflows: NULL on that row only.
        assert_eq!(
            eval(lit(i64::MIN) / col("i")),
            vec![Some(i64::MIN), None, None]
        );
    }

    #[test]
    fn unwrap_restores_the_expression() {
        let b =
            RecordBatch::try_from_iter([("i", Arc::new(Int64Array::from(vec![1])) as ArrayRef)])
                .unwrap();
        let df = DFSchema::try_from(b.schema().as_ref().clone()).unwrap();
        let e = col("i") * lit(2i64) + col("i");
        let w = wrap(e.clone(), &df).unwrap();
        assert_ne!(w, e);
        assert_eq!(unwrap(w).unwrap(), e);
    }
}
