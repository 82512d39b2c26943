//! Total evaluation over private rows (docs/PRIVACY.md, "The private fragment").
//!
//! A failure is itself a bit: if an expression over private rows could fail on a row the analyst
//! picks (a CAST that does not parse, an integer overflow, a division by zero inside a CASE …),
//! whether the query fails would tell whether such a row exists. So every non-trivial expression
//! between a private scan and a DP aggregate is wrapped in [`TotalExpr`]: it evaluates the
//! expression on the whole batch and, only if that fails (or panics), again by halves of the batch
//! (`by_halves`) and makes the value NULL on exactly the rows that fail. The result is the same
//! as the expression wherever the expression is defined, and NULL elsewhere; DP aggregates skip
//! NULLs, filters drop them.
//!
//! A literal regular-expression or LIKE pattern inside is compiled once, at planning, into a
//! [`PatternMatcher`] (arrow compiles it again on every batch it matches, and whether a batch
//! runs it depends on the rows a private CASE, AND or OR selects: round 46), a fully built DFA
//! that matches a row in one transition per byte whatever the pattern (round 46: the regex
//! crate's fallback to an NFA simulation cost seconds per selected row).
use std::any::Any;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, new_null_array};
use datafusion::arrow::compute::{concat, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result, ScalarValue, exec_err};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::physical_expr::expressions::{Column as PhysicalColumn, Literal};
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};

use super::fragment;

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
/// docs/PRIVACY.md lists which functions those are. A match of a string against a literal
/// regular expression or LIKE pattern becomes a [`PatternMatcher`] holding the compiled pattern
/// (round 46: compiled here, once, rather than by arrow on every batch).
pub fn total_form(e: Expr, schema: &DFSchema) -> Result<Expr> {
    Ok(e.transform_up(|x| {
        if let Some(m) = PatternMatcher::of(&x, schema)? {
            return Ok(Transformed::yes(m));
        }
        total_node(x, schema)
    })?
    .data)
}

/// One node of [`total_form`] (its children already rewritten).
fn total_node(x: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    use datafusion::logical_expr::{BinaryExpr, Operator, TryCast, lit, when};
    match &x {
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
    }
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

/// `e` with every wrapper removed, and every [`PatternMatcher`] back to the match it was: for the
/// audit of the fragment, and to name a wrapped expression in a cluster's refusal (a plan with a
/// wrapper is refused on a cluster, never unwrapped to run there).
pub fn unwrap(e: Expr) -> Result<Expr> {
    Ok(e.transform_up(|x| {
        if let Some(original) = PatternMatcher::original(&x) {
            return Ok(Transformed::yes(original));
        }
        if let Expr::ScalarFunction(f) = &x
            && let Some(t) = (f.func.inner().as_ref() as &dyn Any).downcast_ref::<TotalExpr>()
        {
            let args = f.args.clone();
            let inner = unwrap(t.inner.clone())?
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
        // A panic here becomes NULL rows and the query goes on: caught quietly, so that the
        // command line's panic hook prints nothing the neighbouring dataset would not (round 46).
        let out = crate::error::caught_quietly(AssertUnwindSafe(|| {
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
        Ok(ColumnarValue::Array(self.total(&physical, &batch, &mut 0)?))
    }
}

impl TotalExpr {
    /// The expression over `batch`, NULL on exactly the rows where it fails: the whole batch at
    /// once, and only if that fails, by halves ([`by_halves`]). `evaluations` counts the
    /// evaluations.
    fn total(
        &self,
        physical: &Arc<dyn PhysicalExpr>,
        batch: &RecordBatch,
        evaluations: &mut usize,
    ) -> Result<ArrayRef> {
        let mut eval = |offset: usize, len: usize| {
            *evaluations += 1;
            self.eval(physical, &batch.slice(offset, len)).ok()
        };
        let n = batch.num_rows();
        if let Some(a) = eval(0, n) {
            return Ok(a);
        }
        if n == 0 {
            return Ok(new_null_array(&self.return_type, 0));
        }
        let null = new_null_array(&self.return_type, 1);
        let mut parts: Vec<ArrayRef> = Vec::new();
        by_halves(0, n, &mut eval, &null, &mut parts);
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        Ok(concat(&refs)?)
    }
}

/// Rows `offset .. offset + len` of a batch whose evaluation over those rows failed, evaluated by
/// halves (round 46): a half that evaluates is kept whole, a half that fails is split again, and
/// a single row that fails is `null` (one NULL). `eval(offset, len)` evaluates rows `offset ..
/// offset + len` (None: it failed); the values are appended to `out` in row order.
///
/// The values are those of evaluating row by row (each row's value where it evaluates, NULL where
/// it fails) for an expression whose value on a row does not depend on the other rows of its
/// batch, as for every expression of the private fragment. The cost: one failing row among n
/// takes 2·⌈log₂ n⌉ evaluations after the failed one (27 in all for a batch of 8,192 rows), f
/// failing rows at most 2·f·⌈log₂ n⌉, and every row failing 2n − 2. Before round 46 the fallback
/// evaluated the whole expression once per row: n evaluations whenever one row failed, each
/// compiling again every pattern in the expression (one failing row turned 0.1 s into 45 s).
fn by_halves(
    offset: usize,
    len: usize,
    eval: &mut dyn FnMut(usize, usize) -> Option<ArrayRef>,
    null: &ArrayRef,
    out: &mut Vec<ArrayRef>,
) {
    if len <= 1 {
        out.extend((len == 1).then(|| null.clone()));
        return;
    }
    let half = len / 2;
    for (o, l) in [(offset, half), (offset + half, len - half)] {
        match eval(o, l) {
            Some(a) => out.push(a),
            None => by_halves(o, l, eval, null, out),
        }
    }
}

/// A string matched against a literal regular expression or LIKE pattern (`fragment::
/// PatternMatch`), compiled at planning into a DFA ([`fragment::compile_pattern`], within its
/// bounds) and matched as arrow matches it: the same values, NULL for a NULL string, and one DFA
/// transition per byte of a string plus one at its end, whatever the pattern and the string
/// ([`dfa_match`]). It stands only inside a [`TotalExpr`] (made by [`total_form`]), and
/// [`unwrap`] turns it back into the match it was.
pub struct PatternMatcher {
    /// The match it stands for, its string replaced by NULL ([`Self::original`]).
    template: Expr,
    negated: bool,
    /// None: the empty regular expression, which matches every string.
    dfa: Option<fragment::PatternDfa>,
    signature: Signature,
}

/// Its match, not its DFA's table (up to a MiB of transitions).
impl std::fmt::Debug for PatternMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternMatcher")
            .field("template", &self.template)
            .field("dfa_bytes", &self.dfa.as_ref().map(|d| d.memory_usage()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
thread_local! {
    /// The DFA transitions [`dfa_match`] took on this thread (tests count them, round 46).
    static DFA_STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Does `dfa` match somewhere in `s` (the regex crate's `is_match`)? One transition per byte of
/// `s`, stopping early at a match or where no match can follow, and one for its end: no other
/// work per byte, whatever the pattern (round 46). An unanchored forward search of a DFA built
/// without quit bytes ([`fragment::compile_pattern`]) cannot fail; a failure is an error, which
/// the [`TotalExpr`] around makes NULL.
fn dfa_match(dfa: &fragment::PatternDfa, s: &str) -> Result<bool> {
    use regex_automata::Input;
    use regex_automata::dfa::Automaton;
    let Ok(mut state) = dfa.start_state_forward(&Input::new(s)) else {
        return exec_err!("{PATTERN_MATCH} could not start");
    };
    let bytes = s.as_bytes();
    let mut taken = 0;
    let mut decided = None;
    while taken < bytes.len() {
        state = dfa.next_state(state, bytes[taken]);
        taken += 1;
        if dfa.is_special_state(state) {
            if dfa.is_match_state(state) {
                decided = Some(true);
            } else if dfa.is_dead_state(state) {
                decided = Some(false);
            } else if dfa.is_quit_state(state) {
                return exec_err!("{PATTERN_MATCH} stopped on a quit byte");
            }
            if decided.is_some() {
                break;
            }
        }
    }
    #[cfg(test)]
    DFA_STEPS.with(|c| c.set(c.get() + taken as u64 + u64::from(decided.is_none())));
    let matched = decided.unwrap_or_else(|| dfa.is_match_state(dfa.next_eoi_state(state)));
    Ok(matched)
}

/// The name under which a pattern matcher appears in plans.
pub const PATTERN_MATCH: &str = "dp_pattern_match";

impl PartialEq for PatternMatcher {
    fn eq(&self, other: &Self) -> bool {
        self.template == other.template
    }
}
impl Eq for PatternMatcher {}
impl Hash for PatternMatcher {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.template.hash(state);
    }
}

impl PatternMatcher {
    /// `x` as a matcher, if it matches a string (over `schema`) against a literal pattern that
    /// compiles within the fragment's bounds. Anything else (a NULL pattern, another type, a
    /// refused pattern, which the fragment's check refuses before this runs) stays as it is.
    fn of(x: &Expr, schema: &DFSchema) -> Result<Option<Expr>> {
        let Some(m) = fragment::pattern_match(x) else {
            return Ok(None);
        };
        if let Expr::Like(l) = x
            && l.escape_char.is_some_and(|c| c != '\\')
        {
            return Ok(None);
        }
        let string =
            |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
        let ok_type = match m.expr.get_type(schema)? {
            DataType::Dictionary(_, v) => string(&v),
            t => string(&t),
        };
        let Some(text) = m.text().filter(|_| ok_type) else {
            return Ok(None);
        };
        let Ok(dfa) = fragment::compile_pattern(m.kind, m.case_insensitive, &text) else {
            return Ok(None);
        };
        let subject = m.expr.clone();
        let template = match x.clone() {
            Expr::BinaryExpr(mut b) => {
                b.left = Box::new(Expr::Literal(ScalarValue::Null, None));
                Expr::BinaryExpr(b)
            }
            Expr::Like(mut l) => {
                l.expr = Box::new(Expr::Literal(ScalarValue::Null, None));
                Expr::Like(l)
            }
            _ => return Ok(None),
        };
        let udf = PatternMatcher {
            template,
            negated: m.negated,
            dfa,
            signature: Signature::any(1, Volatility::Immutable),
        };
        Ok(Some(Expr::ScalarFunction(
            datafusion::logical_expr::expr::ScalarFunction::new_udf(
                Arc::new(ScalarUDF::new_from_impl(udf)),
                vec![subject],
            ),
        )))
    }

    /// The match `x` stands for, if `x` is a matcher.
    fn original(x: &Expr) -> Option<Expr> {
        let Expr::ScalarFunction(f) = x else {
            return None;
        };
        let m = (f.func.inner().as_ref() as &dyn Any).downcast_ref::<PatternMatcher>()?;
        let subject = Box::new(f.args.first()?.clone());
        Some(match m.template.clone() {
            Expr::BinaryExpr(mut b) => {
                b.left = subject;
                Expr::BinaryExpr(b)
            }
            Expr::Like(mut l) => {
                l.expr = subject;
                Expr::Like(l)
            }
            other => other,
        })
    }

    /// The match over the strings of `a` (a string array or a dictionary of strings).
    fn matches(&self, a: &dyn Array) -> Result<ArrayRef> {
        let one = |s: &str| -> Result<bool> {
            let m = match &self.dfa {
                Some(dfa) => dfa_match(dfa, s)?,
                None => true,
            };
            Ok(m != self.negated)
        };
        let out: BooleanArray = match a.data_type() {
            DataType::Utf8 => a
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(one).transpose())
                .collect::<Result<_>>()?,
            DataType::LargeUtf8 => a
                .as_string::<i64>()
                .iter()
                .map(|v| v.map(one).transpose())
                .collect::<Result<_>>()?,
            DataType::Utf8View => a
                .as_string_view()
                .iter()
                .map(|v| v.map(one).transpose())
                .collect::<Result<_>>()?,
            DataType::Null => BooleanArray::new_null(a.len()),
            DataType::Dictionary(..) => {
                let d = a.as_any_dictionary();
                let values = self.matches(d.values().as_ref())?;
                return Ok(take(values.as_ref(), d.keys(), None)?);
            }
            t => return exec_err!("{PATTERN_MATCH} of a value of type {t}"),
        };
        Ok(Arc::new(out))
    }
}

impl ScalarUDFImpl for PatternMatcher {
    fn name(&self) -> &str {
        PATTERN_MATCH
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some(arg) = args.args.first() else {
            return exec_err!("{PATTERN_MATCH} without an argument");
        };
        match arg {
            ColumnarValue::Array(a) => Ok(ColumnarValue::Array(self.matches(a.as_ref())?)),
            ColumnarValue::Scalar(s) => {
                let a = self.matches(s.to_array()?.as_ref())?;
                Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&a, 0)?))
            }
        }
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

    /// The `TotalExpr` of a wrapped expression.
    fn total_expr(w: &Expr) -> &TotalExpr {
        let Expr::ScalarFunction(f) = w else {
            panic!("not wrapped: {w}")
        };
        (f.func.inner().as_ref() as &dyn Any)
            .downcast_ref::<TotalExpr>()
            .expect("a TotalExpr")
    }

    /// Round 46: a batch that fails is retried by halves, with exactly the values of a retry row
    /// by row (each row's value, NULL where it fails, in order), for 0, 1, several and all rows
    /// failing at sizes 1, 2, 3, 8191 and 8192; one failing row costs 2·⌈log₂ n⌉ + 1
    /// evaluations in all (27 for 8,192 rows, where the row-by-row retry took 8,193).
    #[test]
    fn failing_rows_are_found_by_halves_with_the_values_of_a_row_by_row_retry() {
        let ctx = datafusion::prelude::SessionContext::new();
        let chr = datafusion::execution::FunctionRegistry::udf(&ctx, "chr").unwrap();
        let df =
            DFSchema::try_from(Schema::new(vec![Field::new("i", DataType::Int64, true)])).unwrap();
        let w = wrap(chr.call(vec![col("i")]), &df).unwrap();
        let t = total_expr(&w);
        let log2 = |n: usize| n.next_power_of_two().trailing_zeros() as usize;
        for n in [1usize, 2, 3, 8191, 8192] {
            let mut several: Vec<usize> =
                [0, 1, n / 3, n / 2, n / 2 + 1, n.saturating_sub(2), n - 1]
                    .into_iter()
                    .filter(|&r| r < n)
                    .collect();
            several.sort_unstable();
            several.dedup();
            let cases: Vec<Vec<usize>> = vec![
                vec![],
                vec![0],
                vec![n / 2],
                vec![n - 1],
                several,
                (0..n).collect(),
            ];
            for failing in cases {
                let mut fails = vec![false; n];
                failing.iter().for_each(|&r| fails[r] = true);
                // chr(-1) fails; a NULL every 7 rows stays NULL.
                let values: Int64Array = (0..n)
                    .map(|r| match (fails[r], r % 7 == 3) {
                        (true, _) => Some(-1),
                        (false, true) => None,
                        (false, false) => Some(65 + (r % 26) as i64),
                    })
                    .collect();
                let batch =
                    RecordBatch::try_new(t.schema.clone(), vec![Arc::new(values) as ArrayRef])
                        .unwrap();
                let mut evaluations = 0;
                let got = t.total(&t.physical, &batch, &mut evaluations).unwrap();
                let rows: Vec<ArrayRef> = (0..n)
                    .map(|r| {
                        t.eval(&t.physical, &batch.slice(r, 1))
                            .unwrap_or_else(|_| new_null_array(&t.return_type, 1))
                    })
                    .collect();
                let refs: Vec<&dyn Array> = rows.iter().map(|a| a.as_ref()).collect();
                let expected = concat(&refs).unwrap();
                let f = failing.len();
                assert_eq!(got.as_ref(), expected.as_ref(), "n = {n}, {f} failing");
                assert_eq!(got.null_count(), expected.null_count());
                let bound = match f {
                    0 => 1,
                    f if f == n => 2 * n - 1,
                    f => 1 + 2 * f * log2(n),
                };
                assert!(
                    evaluations <= bound,
                    "n = {n}, {f} failing: {evaluations} evaluations, more than {bound}"
                );
                if f == 1 {
                    assert!(evaluations <= 2 * log2(n) + 1, "{evaluations}");
                }
            }
        }
        // One failing row in 8,192, wherever it is: 27 evaluations.
        for at in [0, 1, 4095, 4096, 8191] {
            let values: Int64Array = (0..8192)
                .map(|r| Some(if r == at { -1 } else { 66 }))
                .collect();
            let batch =
                RecordBatch::try_new(t.schema.clone(), vec![Arc::new(values) as ArrayRef]).unwrap();
            let mut evaluations = 0;
            let got = t.total(&t.physical, &batch, &mut evaluations).unwrap();
            assert_eq!(evaluations, 27, "failing row {at}");
            assert_eq!(got.null_count(), 1);
            assert!(got.is_null(at));
        }
    }

    /// Round 46: a match against a literal regular expression or LIKE pattern is compiled once,
    /// at planning, and gives exactly what DataFusion's own evaluation (arrow's kernels, which
    /// compile the pattern on every batch) gives, on strings, large strings, string views and
    /// dictionaries, NULLs included; [`unwrap`] gives the match back.
    #[test]
    fn pattern_matchers_give_what_arrow_gives() {
        use datafusion::arrow::array::{DictionaryArray, LargeStringArray, StringViewArray};
        use datafusion::arrow::datatypes::Int32Type;
        use datafusion::logical_expr::{BinaryExpr, Like, Operator};
        let strings: Vec<Option<&str>> = vec![
            Some(""),
            Some("a"),
            Some("A"),
            Some("abc"),
            Some("ABC"),
            Some("aXc"),
            Some("a%"),
            Some("a_b"),
            Some("a\\"),
            Some("\\"),
            Some("é"),
            Some("É"),
            Some("foo bar"),
            Some("\u{212A}"),
            Some("k"),
            Some("K"),
            Some("a\nb"),
            Some("\n"),
            Some("."),
            Some("[a]bc"),
            Some("(x)yz"),
            Some("ǅ"),
            Some("ǆ"),
            Some("Ǆ"),
            Some("12"),
            Some("x.y"),
            Some("éfooé"),
            Some("foo_bar"),
            Some("a\r\nb"),
            Some("ω"),
            None,
        ];
        let regexes = [
            "",
            "a",
            "^a",
            "a$",
            "é",
            "\\w+",
            "^$",
            "[0-9]{2}",
            "a|b",
            "(?-u:\\b)foo(?-u:\\b)",
            "x*",
            "^",
            "\\d+$",
            "(?s)a.b",
            "\\Ab\\z",
            "(?R)^b$",
            "\\p{Greek}|\\p{Lt}",
            ".",
            "^.$",
            "(?m)^b",
            "ǅ",
            "k",
            "^\\p{Lu}",
            "x\\.y",
            "(?i)abc",
            "[^a]",
        ];
        let likes = [
            "", "%", "%%", "_", "a%", "%a", "%a%", "a_c", "a\\%", "a\\_b", "\\\\", "a\\", "%.%",
            "[a]%", "(x)%", "é%", "%k%", "ǆ", "_%_", "a%b%c", "\n%", "%\\", "x.y", "A%", "%C",
            "%B%", "_b_",
        ];
        type Literal = fn(String) -> ScalarValue;
        let columns: Vec<(ArrayRef, Literal)> = vec![
            (Arc::new(StringArray::from(strings.clone())), |p| {
                ScalarValue::Utf8(Some(p))
            }),
            (Arc::new(LargeStringArray::from(strings.clone())), |p| {
                ScalarValue::LargeUtf8(Some(p))
            }),
            (Arc::new(StringViewArray::from(strings.clone())), |p| {
                ScalarValue::Utf8View(Some(p))
            }),
            (
                Arc::new(
                    strings
                        .iter()
                        .copied()
                        .collect::<DictionaryArray<Int32Type>>(),
                ),
                |p| ScalarValue::Utf8(Some(p)),
            ),
        ];
        let mut compared = 0;
        for (column, literal) in columns {
            let b = RecordBatch::try_from_iter([("s", column.clone())]).unwrap();
            let df = DFSchema::try_from(b.schema().as_ref().clone()).unwrap();
            let mut exprs = vec![];
            for p in regexes {
                for op in [
                    Operator::RegexMatch,
                    Operator::RegexIMatch,
                    Operator::RegexNotMatch,
                    Operator::RegexNotIMatch,
                ] {
                    exprs.push(Expr::BinaryExpr(BinaryExpr::new(
                        Box::new(col("s")),
                        op,
                        Box::new(lit(literal(p.to_string()))),
                    )));
                }
            }
            for p in likes {
                for (negated, ci) in [(false, false), (false, true), (true, false), (true, true)] {
                    exprs.push(Expr::Like(Like::new(
                        negated,
                        Box::new(col("s")),
                        Box::new(lit(literal(p.to_string()))),
                        None,
                        ci,
                    )));
                }
                // The operator forms (~~ and the like) on plain strings.
                if matches!(column.data_type(), DataType::Utf8) {
                    for op in [
                        Operator::LikeMatch,
                        Operator::ILikeMatch,
                        Operator::NotLikeMatch,
                        Operator::NotILikeMatch,
                    ] {
                        exprs.push(Expr::BinaryExpr(BinaryExpr::new(
                            Box::new(col("s")),
                            op,
                            Box::new(lit(literal(p.to_string()))),
                        )));
                    }
                }
            }
            for e in exprs {
                let evaluate = |e: &Expr| {
                    let p =
                        create_physical_expr(e, &df, &ExecutionProps::new(), &Default::default())
                            .unwrap();
                    p.evaluate(&b).unwrap().into_array(b.num_rows()).unwrap()
                };
                let matcher = total_form(e.clone(), &df).unwrap();
                assert!(
                    matches!(&matcher, Expr::ScalarFunction(f) if f.func.name() == PATTERN_MATCH),
                    "{e} was not compiled: {matcher}"
                );
                assert_eq!(
                    evaluate(&matcher).as_ref(),
                    evaluate(&e).as_ref(),
                    "{e} over {}",
                    column.data_type()
                );
                assert_eq!(unwrap(matcher).unwrap(), e);
                // Wrapped, it evaluates the same, and unwraps to the match.
                assert_eq!(run(e.clone(), b.clone()).as_ref(), evaluate(&e).as_ref());
                assert_eq!(unwrap(wrap(e.clone(), &df).unwrap()).unwrap(), e);
                compared += 1;
            }
        }
        assert!(compared > 400, "{compared}");
    }

    /// Round 46 (review fix-guard, finding 1): matching is bounded per byte, not only
    /// compiling. The review's `a[ab]{3000}[^ab]` is refused; the largest pattern of its family
    /// that compiles (`a[ab]{11}[^ab]`), and 16 of that family ORed, matched against a 16 KiB
    /// string of `a` and `b` that a private CASE selects, take one DFA transition per byte of the
    /// selected row (plus one at its end) per pattern, counted: a selected row adds 16,383 steps
    /// per pattern to an unselected run of 1,024 rows (2,048 steps per pattern), and two add twice
    /// that. (The regex crate's NFA fallback took about 2.8 s per such row and pattern in a debug
    /// build.)
    #[test]
    fn a_row_a_private_case_selects_costs_one_dfa_step_per_byte_per_pattern() {
        use datafusion::logical_expr::{BinaryExpr, Operator, when};
        use fragment::PatternKind::Regex;
        let family = |c: char, k: usize| format!("{c}[ab]{{{k}}}[^ab]");
        assert!(fragment::compile_pattern(Regex, false, &family('a', 3000)).is_err());
        let k = (1..64)
            .take_while(|&k| fragment::compile_pattern(Regex, false, &family('a', k)).is_ok())
            .last()
            .unwrap();
        assert_eq!(k, 11);
        // 16 KiB of a and b, pseudo-random: [^ab] never matches, and no literal can be skipped to.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let big: String = (0..16 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x & 1 == 0 { 'a' } else { 'b' }
            })
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "salary",
            DataType::Int64,
            true,
        )]));
        let df = DFSchema::try_from(schema.as_ref().clone()).unwrap();
        let subject = when(col("salary").gt(lit(100_000i64)), lit(big.clone()))
            .otherwise(lit("x"))
            .unwrap();
        let matching = |p: String| {
            Expr::BinaryExpr(BinaryExpr::new(
                Box::new(subject.clone()),
                Operator::RegexMatch,
                Box::new(lit(p)),
            ))
        };
        let largest = matching(family('a', k));
        let sixteen = (0..16)
            .map(|i| matching(family(if i % 2 == 0 { 'a' } else { 'b' }, k - i / 2)))
            .reduce(|a, b| a.or(b))
            .unwrap();
        let rows = 1024;
        for (e, patterns) in [(largest, 1u64), (sixteen, 16)] {
            let w = wrap(e, &df).unwrap();
            let p =
                create_physical_expr(&w, &df, &ExecutionProps::new(), &Default::default()).unwrap();
            let steps = |selected: &[usize]| {
                let salaries: Int64Array = (0..rows)
                    .map(|r| {
                        Some(if selected.contains(&r) {
                            9_999_999
                        } else {
                            1_000 + r as i64
                        })
                    })
                    .collect();
                let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(salaries)]).unwrap();
                DFA_STEPS.with(|c| c.set(0));
                let a = p.evaluate(&batch).unwrap().into_array(rows).unwrap();
                assert_eq!(a.as_boolean().true_count(), 0);
                assert_eq!(a.null_count(), 0);
                DFA_STEPS.with(|c| c.get())
            };
            let none = steps(&[]);
            let one = steps(&[rows / 2]);
            let two = steps(&[0, rows - 1]);
            // An unselected row ("x") takes 2 steps per pattern; the selected one, its bytes
            // and one at its end.
            let per_row = big.len() as u64 + 1;
            assert_eq!(none, patterns * 2 * rows as u64);
            assert_eq!(
                one - none,
                patterns * (per_row - 2),
                "{patterns}: {none} → {one}"
            );
            assert_eq!(two - none, 2 * (one - none), "{patterns}");
        }
    }
}
