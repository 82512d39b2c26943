//! The private fragment: the positive definition of what may stand between a private scan and a
//! DP aggregate (docs/PRIVACY.md, "The private fragment"). Anything not listed here is refused at
//! planning.
//!
//! Plan nodes: `TableScan` (of one private table, without LIMIT), `Projection`, `Filter`,
//! `SubqueryAlias`. Expressions (an uncorrelated scalar subquery counts as a constant): the kinds
//! of [`check_expr`], the operators of [`operator_ok`], the scalar functions of [`FUNCTIONS`].
//!
//! The fragment is typed ([`check_expr_typed`], issue 26): each function has the argument types
//! and literal arguments it may take over private rows, casts go only to the targets of
//! [`cast_target`] (fixed-width scalars; strings and lists from bounded inputs), and the bytes one
//! row's value may take are bounded at planning from types and literals ([`bytes`]): never by a
//! number the analyst chooses (`repeat`, `lpad`, `rpad`, `replace`, `range`, `array_repeat`,
//! `levenshtein` are not in the list; `FixedSizeList(2147483647, …)` is not a cast target).
//! What one plan node holds at once is bounded too, its values summed ([`node_bytes`], the node
//! bounds of [`LIMITS`]; on every statement, what one step writes: [`WRITTEN_NODE_BYTES`]): a
//! node's batch holds them all together, outside the memory pool (round 48).
//! Every expression is evaluated totally: rewritten at planning into a total form where one
//! exists, wrapped as a last resort ([`super::total`]; [`Total`] says which functions need it).
//! A literal regular-expression or LIKE pattern is compiled at planning within bounds into a
//! fully built DFA ([`compile_pattern`]: its NFA's and its DFA's sizes and its case-folding work;
//! [`check_pattern_count`]: 16 a statement), and that DFA is what runs, one transition per byte of
//! a row whatever the pattern (round 46). No function's work per row is one value's length times
//! another's: the characters a trim removes and the substring `strpos` looks for are literals, a
//! trim's at most [`TRIM_SET_CHARS`] characters (round 49). A fixed-width scalar cast to text
//! counts its type's longest text ([`fixed_text_bytes`], round 49).
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Operator};

use crate::session::limits::MAX_LITERAL_DEPTH_BYTES;

/// Classes of argument types a function of the fragment accepts (checked on the planned,
/// coerced types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A number (integer, float, decimal up to Decimal128) or NULL.
    Num,
    /// An integer or NULL.
    Int,
    /// A string (Utf8, LargeUtf8, Utf8View, a dictionary of them) or NULL.
    Str,
    /// A date, time, timestamp, duration or interval, a string (parsed) or a number (seconds).
    Time,
    /// Any fixed-width scalar (a number, boolean, date or time) or a string.
    Scalar,
    /// A list of fixed-width scalars.
    List,
    /// Any type (struct access, struct building, a released model).
    Any,
}

/// How a function's output size per row is bounded, from its arguments' bounds ([`Bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Its output type has a fixed width (numbers, booleans, dates, times), or it is a text of
    /// at most 64 bytes (`chr`: one character).
    Fixed,
    /// At most the sum of its arguments (concat, coalesce, make_array …).
    Sum,
    /// At most its first argument (trim, left, split_part …).
    First,
    /// At most this many times its first argument (case mapping: one character may become three
    /// bytes more; `translate`: one byte may become a four-byte character).
    Times(u64),
    /// `concat_ws`: the separator (first argument) once between every two other arguments.
    Separated,
}

/// How a function is made total over private rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Total {
    /// It cannot fail on any value of its argument types.
    Infallible,
    /// It may fail on some values (an unparseable string, an invalid date or code point, an
    /// integer overflow): the last-resort wrapper ([`super::total`]) makes those values NULL.
    Fallback,
}

/// One scalar function of the private fragment: the types it may take over private rows, the
/// literals it needs, its size per row and how it is made total (docs/PRIVACY.md, "The private
/// fragment", has this table).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    pub name: &'static str,
    /// The class of each argument, by position; the last one applies to every further argument.
    /// Empty: no arguments.
    pub args: &'static [Class],
    /// Arguments (by position) that must be literals written in the query.
    pub literal: &'static [usize],
    pub size: Size,
    pub total: Total,
}

const fn f(name: &'static str, args: &'static [Class], size: Size, total: Total) -> Function {
    Function {
        name,
        args,
        literal: &[],
        size,
        total,
    }
}

const fn lf(
    name: &'static str,
    args: &'static [Class],
    literal: &'static [usize],
    size: Size,
    total: Total,
) -> Function {
    Function {
        name,
        args,
        literal,
        size,
        total,
    }
}

use Class::*;
use Size::{First, Fixed, Separated, Sum, Times};
use Total::{Fallback, Infallible};

/// The scalar functions allowed over private rows. Nothing here takes a size the analyst chooses:
/// `repeat`, `lpad`, `rpad`, `replace`, `range`, `array_repeat`, `levenshtein`, `to_char`,
/// `encode`/`decode`, regular-expression functions with a pattern from a column, … are not in the
/// list; `make_array`'s width is bounded by the expression's node count, and every expression by
/// [`LIMITS`] (bytes per row). Nor does anything here take work per row that grows faster than
/// its values (round 49, review "surface" F1): where DataFusion's work is one argument's length
/// times another's, that argument is a literal (the characters `btrim`/`ltrim`/`rtrim`/`trim`
/// remove, at most [`TRIM_SET_CHARS`] of them; the substring `strpos`/`instr` look for).
pub const FUNCTIONS: &[Function] = &[
    // numbers: floats never fail (NaN, ±inf); integer abs/power/round/trunc may overflow
    f("abs", &[Num], Fixed, Fallback),
    f("acos", &[Num], Fixed, Infallible),
    f("acosh", &[Num], Fixed, Infallible),
    f("asin", &[Num], Fixed, Infallible),
    f("asinh", &[Num], Fixed, Infallible),
    f("atan", &[Num], Fixed, Infallible),
    f("atan2", &[Num, Num], Fixed, Infallible),
    f("atanh", &[Num], Fixed, Infallible),
    f("cbrt", &[Num], Fixed, Infallible),
    f("ceil", &[Num], Fixed, Fallback),
    f("cos", &[Num], Fixed, Infallible),
    f("cosh", &[Num], Fixed, Infallible),
    f("cot", &[Num], Fixed, Infallible),
    f("degrees", &[Num], Fixed, Infallible),
    f("exp", &[Num], Fixed, Infallible),
    f("floor", &[Num], Fixed, Fallback),
    f("isnan", &[Num], Fixed, Infallible),
    f("iszero", &[Num], Fixed, Infallible),
    f("ln", &[Num], Fixed, Fallback),
    f("log", &[Num, Num], Fixed, Fallback),
    f("log10", &[Num], Fixed, Fallback),
    f("log2", &[Num], Fixed, Fallback),
    f("nanvl", &[Num, Num], Fixed, Infallible),
    f("pi", &[], Fixed, Infallible),
    f("power", &[Num, Num], Fixed, Fallback),
    f("pow", &[Num, Num], Fixed, Fallback),
    f("radians", &[Num], Fixed, Infallible),
    f("round", &[Num, Int], Fixed, Fallback),
    f("signum", &[Num], Fixed, Infallible),
    f("sin", &[Num], Fixed, Infallible),
    f("sinh", &[Num], Fixed, Infallible),
    f("sqrt", &[Num], Fixed, Fallback),
    f("tan", &[Num], Fixed, Infallible),
    f("tanh", &[Num], Fixed, Infallible),
    f("trunc", &[Num, Int], Fixed, Fallback),
    f("greatest", &[Scalar], Sum, Infallible),
    f("least", &[Scalar], Sum, Infallible),
    // NULL handling and conditionals: the output is one of the arguments
    f("coalesce", &[Scalar], Sum, Infallible),
    f("nullif", &[Scalar, Scalar], Sum, Infallible),
    f("nvl", &[Scalar, Scalar], Sum, Infallible),
    f("nvl2", &[Scalar, Scalar, Scalar], Sum, Infallible),
    f("ifnull", &[Scalar, Scalar], Sum, Infallible),
    // strings: output no longer than the inputs together (case mapping: at most three times)
    f("ascii", &[Str], Fixed, Infallible),
    f("bit_length", &[Str], Fixed, Infallible),
    // The characters to trim (and the substring strpos/instr look for) are literals over private
    // rows: DataFusion's work per row is their length times the value's (TRIM_SET_CHARS; round 49).
    lf("btrim", &[Str, Str], &[1], First, Infallible),
    f("char_length", &[Str], Fixed, Infallible),
    f("character_length", &[Str], Fixed, Infallible),
    f("chr", &[Int], Fixed, Fallback),
    f("concat", &[Scalar], Sum, Infallible),
    f("concat_ws", &[Str, Scalar], Separated, Infallible),
    f("contains", &[Str, Str], Fixed, Infallible),
    f("ends_with", &[Str, Str], Fixed, Infallible),
    f("initcap", &[Str], Times(3), Infallible),
    lf("instr", &[Str, Str], &[1], Fixed, Infallible),
    f("left", &[Str, Int], First, Infallible),
    f("length", &[Str], Fixed, Infallible),
    f("lower", &[Str], Times(3), Infallible),
    lf("ltrim", &[Str, Str], &[1], First, Infallible),
    f("octet_length", &[Str], Fixed, Infallible),
    f("reverse", &[Str], First, Infallible),
    f("right", &[Str, Int], First, Infallible),
    lf("rtrim", &[Str, Str], &[1], First, Infallible),
    // position 0 fails: rewritten to CASE WHEN n <> 0 THEN split_part(…) END at planning
    f("split_part", &[Str, Str, Int], First, Infallible),
    f("starts_with", &[Str, Str], Fixed, Infallible),
    lf("strpos", &[Str, Str], &[1], Fixed, Infallible),
    // No `substr`/`substring`: SQL parses both as SUBSTRING, which this build cannot plan
    // (DataFusion without `unicode_expressions`; round 46).
    f("translate", &[Str, Str, Str], Times(4), Infallible),
    lf("trim", &[Str, Str], &[1], First, Infallible),
    f("upper", &[Str], Times(3), Infallible),
    // dates and times: fixed-width results; a string that does not parse, or an invalid date,
    // fails (the fallback makes it NULL)
    lf("date_part", &[Str, Time], &[0], Fixed, Infallible),
    lf("datepart", &[Str, Time], &[0], Fixed, Infallible),
    lf("date_trunc", &[Str, Time], &[0], Fixed, Fallback),
    lf("datetrunc", &[Str, Time], &[0], Fixed, Fallback),
    lf("date_bin", &[Time, Time, Time], &[0], Fixed, Fallback),
    f("make_date", &[Num, Num, Num], Fixed, Fallback),
    f("to_date", &[Time, Str], Fixed, Fallback),
    f("to_timestamp", &[Time, Str], Fixed, Fallback),
    f("to_timestamp_seconds", &[Time, Str], Fixed, Fallback),
    f("to_timestamp_millis", &[Time, Str], Fixed, Fallback),
    f("to_timestamp_micros", &[Time, Str], Fixed, Fallback),
    f("to_timestamp_nanos", &[Time, Str], Fixed, Fallback),
    f("to_unixtime", &[Time, Str], Fixed, Fallback),
    f("from_unixtime", &[Num, Str], Fixed, Fallback),
    // arrow_cast(x, 'type'): only to the types a CAST may have ([`cast_target`]); rewritten at
    // planning to TRY_CAST (super::total::total_form)
    lf("arrow_cast", &[Any, Str], &[1], Sum, Infallible),
    // lists and structs (model features: [x1, x2] is make_array)
    f("make_array", &[Scalar], Sum, Infallible),
    f("make_list", &[Scalar], Sum, Infallible),
    f("array_element", &[List, Int], First, Infallible),
    f("array_length", &[List, Int], Fixed, Infallible),
    f("cardinality", &[List], Fixed, Infallible),
    lf("get_field", &[Any, Str], &[1], First, Infallible),
    f("named_struct", &[Any], Sum, Infallible),
    f("struct", &[Any], Sum, Infallible),
    // released models applied to rows (free post-processing of a release)
    f("linreg_predict", &[Any, List], Fixed, Fallback),
    f("logreg_predict_proba", &[Any, List], Fixed, Fallback),
    f("mlp_predict_proba", &[Any, List], Fixed, Fallback),
    f("mlp_predict", &[Any, List], Fixed, Fallback),
];

/// The most characters (repeats counted) the literal set of `btrim`/`ltrim`/`rtrim`/`trim` may
/// have over private rows (round 49, review "surface" F1).
///
/// DataFusion 55 (`datafusion-functions` `string/common.rs`, `Trimmer::trim`) keeps the set as a
/// `[char]` slice that `str::trim_start_matches`/`trim_end_matches` search from its start for
/// every character they trim: a row costs its length times the set's. A set computed from the row
/// (`btrim(s, concat(upper(s), s))`) made that the square of one private value: 0.12 s without
/// and 16.2 s with one 60 KB row, per call (review r49, debug build). A literal of at most 64
/// characters makes it at most 64 comparisons a character: 0.37 ms for a 64 KiB row whose every
/// character is the last of a 64-character set, in a release build, less than `upper` takes on
/// its own worst 64 KiB (1.4 ms, `ΐ`); the 1,024 bytes a literal may otherwise have would allow
/// 1,024 characters, sixteen times that (measured with rustc -O, round 49). 64 holds every
/// ASCII punctuation and whitespace character.
pub const TRIM_SET_CHARS: usize = 64;

/// The fragment's entry for the scalar function `name`.
pub fn function(name: &str) -> Option<&'static Function> {
    FUNCTIONS.iter().find(|f| f.name == name)
}

/// Bounds per expression (and per plan node) over private rows, so that no expression can copy a
/// row many times, nor a node hold many such copies together.
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
    /// Bytes one row's value of an expression may take: at most `row_copies` times the bytes of
    /// the row it is computed from, plus `constant_bytes` ([`Bytes`]).
    pub row_copies: u64,
    pub constant_bytes: u64,
    /// Bytes a row of one plan node may hold at once, summed over its values ([`node_bytes`]):
    /// at most `node_row_copies` times the row plus `node_constant_bytes`. A node's batch holds
    /// every value it computes and passes on together, outside the memory pool, so the bound on
    /// each expression alone did not bound the batch (round 48: 300 GROUP BY keys of 32 copies
    /// each aborted the process at 7.8 GB).
    pub node_row_copies: u64,
    pub node_constant_bytes: u64,
}

pub const LIMITS: Limits = Limits {
    nodes: 512,
    columns: 32,
    literal_bytes: 1024,
    in_list: 10_000,
    row_copies: 32,
    constant_bytes: 16 * 1024,
    node_row_copies: 64,
    node_constant_bytes: 64 * 1024,
};

/// The most items of a feature list of bare columns over private rows (declared beside the
/// models, which size their fits by it: `dpfusion_udfs::optim::rows::FEATURE_WIDTH`).
pub use dpfusion_udfs::optim::rows::FEATURE_WIDTH;

/// The width of `e` if it is a feature list of bare columns: `make_array`/`make_list` whose every
/// item is a column, or a column cast to a fixed-width scalar (the casts type coercion adds, or
/// their total form). Such a list copies each cell of its row once, so its size is bounded by the
/// schema, whatever its width.
pub fn bare_feature_list(e: &Expr) -> Option<usize> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if !matches!(f.func.name(), "make_array" | "make_list") || f.args.is_empty() {
        return None;
    }
    let bare = |a: &Expr| match a {
        Expr::Column(_) => true,
        Expr::Cast(c) => {
            matches!(c.expr.as_ref(), Expr::Column(_)) && fixed_scalar(c.field.data_type())
        }
        Expr::TryCast(c) => {
            matches!(c.expr.as_ref(), Expr::Column(_)) && fixed_scalar(c.field.data_type())
        }
        _ => false,
    };
    f.args.iter().all(bare).then_some(f.args.len())
}

/// Is `t` a number as a model's feature may be written: an integer, a float or a decimal (or a
/// dictionary of them). Not a string, a boolean, a date or NULL.
fn numeric_feature(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, v) => v.is_numeric(),
        t => t.is_numeric(),
    }
}

/// The items of a feature list as written, each with the plan whose schema types it: through an
/// alias, and through a column that a projection (or a subquery alias over one) below defines.
/// `None` when the features are not a `make_array`/`make_list` (a list-typed column: its element
/// type is checked by the model's type check).
fn written_feature_items(e: &Expr, input: &LogicalPlan) -> Option<(Vec<Expr>, LogicalPlan)> {
    match e {
        Expr::Alias(a) => written_feature_items(&a.expr, input),
        Expr::ScalarFunction(f) if matches!(f.func.name(), "make_array" | "make_list") => {
            Some((f.args.clone(), input.clone()))
        }
        Expr::Column(c) => {
            let i = input.schema().index_of_column(c).ok()?;
            match input {
                LogicalPlan::Projection(p) => written_feature_items(p.expr.get(i)?, &p.input),
                LogicalPlan::SubqueryAlias(s) => {
                    let (q, f) = s.input.schema().qualified_field(i);
                    let col = Expr::Column(datafusion::common::Column::new(q.cloned(), f.name()));
                    written_feature_items(&col, &s.input)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The most bytes a value the statement writes may take, by what is written (literals, the
/// type of an `arrow_cast`, the counts of `repeat`, `lpad`, `rpad`, `array_repeat`, `range`,
/// `generate_series`): 4 MiB, as much as the statement's text itself may hold (1 MiB) and more.
///
/// Checked on the plan as written, before DataFusion's optimizer evaluates constant expressions.
/// That evaluation allocates the whole value outside any memory pool, and an allocation that
/// fails aborts the process: `arrow_cast(NULL, 'FixedSizeList(2147483647, Int64)')` asked for
/// 16 GiB while planning, whatever the tables (found by the differential fuzzer). Any statement,
/// public or private, is refused when a value it writes may exceed this. The same bound holds at
/// run time for a constant call of a function outside the private fragment (sized.rs): a folded
/// constant is formatted into the names of the expressions around it in every optimizer pass (a
/// binary one byte by byte), so a 40 MB constant kept a debug build planning for over a minute.
pub const WRITTEN_VALUE_BYTES: u64 = 4 << 20;

/// The most bytes a value that reads a column may take by what the statement writes (the count
/// of a `repeat(name, n)`, the type of an `arrow_cast(x, …)`): 64 KiB a row, so that a batch of
/// 8,192 rows, which a function's output fills outside any memory pool, stays within 512 MiB.
pub const WRITTEN_ROW_BYTES: u64 = 64 << 10;

/// The most bytes one step of a plan (a projection, aggregate, join, window, unnest, VALUES, UNION,
/// filter or sort over more than one row) may write a row, its values summed
/// ([`written_by_node`]): 128 KiB, twice [`WRITTEN_ROW_BYTES`], so that a value at its own bound
/// leaves room beside it, and a batch of 8,192 rows, which holds every value of the step at once
/// outside any memory pool, stays within 1 GiB: a quarter of the default memory limit, what
/// sized.rs lets one call write a batch at run time. Each value was bounded alone, so N columns
/// of 64 KiB made N × 512 MiB a batch (round 48, review "resources", finding 3).
pub const WRITTEN_NODE_BYTES: u64 = 2 * WRITTEN_ROW_BYTES;

/// The most bytes the steps of one row of a statement (no FROM, an aggregate without GROUP BY,
/// and what passes one on) and the rows of its VALUES lists may write, their values summed over
/// every such step and row ([`written_by_node`]): 64 MiB, the largest message `dpfusion serve`
/// sends. DataFusion folds
/// their constants while it plans, before admission and outside any memory pool, and each value
/// was bounded alone ([`WRITTEN_VALUE_BYTES`]): 40 columns of `repeat('x', 4000000)` held 785 MB,
/// and a statement of 1 MiB could ask for about 160 GB (round 50, found while fixing the
/// server's message limit). A value passed on through several such steps counts at each.
pub const WRITTEN_ONE_ROW_BYTES: u64 = 64 << 20;

/// The most times a value may copy the values of a row it reads ([`Written::rows`]), on public
/// tables and constants: 1,024 (over private rows the typed fragment allows 32).
pub const WRITTEN_ROW_COPIES: u64 = 1024;

/// Refuses a statement that writes a value of more than [`WRITTEN_VALUE_BYTES`], or more than
/// [`WRITTEN_ROW_BYTES`] a row, or more than [`WRITTEN_NODE_BYTES`] a row in one step (its values
/// summed), or that copies a row's values more than [`WRITTEN_ROW_COPIES`] times (see there),
/// composed through the statement's subqueries and common table expressions:
/// a column counts what its definition writes ([`written_columns`]), so that `s || s`, level
/// after level, is counted (it made values of 2^34 times their start and aborted the process).
/// A recursive query's step may not grow the values it reads from the step before. The message
/// names the deepest expression that exceeds a bound (where the growth is written, not the
/// expressions that carry it up). The literal patterns a statement matches over private rows are
/// counted here too ([`check_pattern_count`]).
pub fn check_written_sizes(plan: &LogicalPlan) -> datafusion::common::Result<()> {
    check_pattern_count(plan)?;
    let mut problem = None;
    let mut one_row_bytes = 0u64;
    plan.apply_with_subqueries(|node| {
        let inputs: Vec<(&DFSchema, Vec<Written>)> = node
            .inputs()
            .into_iter()
            .map(|i| (i.schema().as_ref(), written_columns(i)))
            .collect();
        let lookup = |c: &Column| lookup_written(&inputs, c);
        if let LogicalPlan::RecursiveQuery(r) = node
            && let Some(w) = written_columns(&r.recursive_term)
                .into_iter()
                .find(|w| w.rows > 1)
        {
            problem = Some(format!(
                "a recursive query whose step may copy the values it reads {} times (each step \
                 would grow them): a recursive step may not grow its values",
                w.rows
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        // Round 50: the steps of one row, and every row of a VALUES list, summed over the
        // statement ([`WRITTEN_ONE_ROW_BYTES`]; review "fixes3" F2: 12,000 VALUES rows of 64 KiB
        // each held 3.3 GB before admission).
        if let LogicalPlan::Values(v) = node {
            let rows = v.values.iter().flatten().map(|e| written(e, &lookup).bytes);
            one_row_bytes = rows.fold(one_row_bytes, u64::saturating_add);
        } else if one_row(node)
            && let Some(b) = written_by_node(node, &inputs)
        {
            one_row_bytes = one_row_bytes.saturating_add(b);
        }
        // Round 48: the values of one step summed, each of which may be within its bound (one
        // value past its own bound is named below instead).
        if !one_row(node)
            && let Some(b) = written_by_node(node, &inputs)
            && b > WRITTEN_NODE_BYTES
        {
            problem = Some(format!(
                "{} writes up to {b} bytes a row in all, its values summed (at most \
                 {WRITTEN_NODE_BYTES} bytes a row a step, and {WRITTEN_ROW_BYTES} a value: a batch \
                 of 8,192 rows holds every value of a step at once, outside the memory pool); \
                 compute fewer large values in one step, or split the query",
                step_name(node)
            ));
        }
        // A value larger than a row's bound, in a relation of more than one row, is copied
        // into every row of each batch: a 4 MiB constant projected over a table, or joined
        // with one, made 32 GiB a batch.
        if !one_row(node)
            && matches!(
                node,
                LogicalPlan::Projection(_)
                    | LogicalPlan::Join(_)
                    | LogicalPlan::Unnest(_)
                    | LogicalPlan::Window(_)
                    | LogicalPlan::Aggregate(_)
                    | LogicalPlan::Values(_)
                    | LogicalPlan::Union(_)
            )
            && let Some(w) = written_columns(node)
                .into_iter()
                .find(|w| w.bytes > WRITTEN_ROW_BYTES)
        {
            problem = Some(format!(
                "a value of up to {} bytes would be copied into every row of a relation of \
                 many rows (at most {WRITTEN_ROW_BYTES} bytes a row); compute it where it is \
                 used once, or make it smaller",
                w.bytes
            ));
        }
        node.apply_expressions(|e| {
            // A constant the optimizer folds to a literal is copied into the name of every
            // expression around it (session/limits.rs, MAX_LITERAL_DEPTH_BYTES).
            let (heavy, levels) = heaviest_constant(e, 1, &lookup);
            if heavy.saturating_mul(levels) > MAX_LITERAL_DEPTH_BYTES as u64 {
                problem = Some(format!(
                    "a constant of up to {heavy} bytes stands about {levels} levels deep in an \
                     expression (its bytes times its depth may be at most \
                     {MAX_LITERAL_DEPTH_BYTES}: the planner copies it into the name of every \
                     expression around it); compute it in a subquery, or make it smaller"
                ));
            }
            e.apply(|x| {
                // A window aggregate that builds a list or a string gives every row its
                // window's values: a window of n rows makes n² (array_agg(x) OVER () over
                // 100,000 rows asked for 80 GB).
                if let Expr::WindowFunction(w) = x
                    && matches!(w.fun.name(), "array_agg" | "string_agg")
                {
                    problem = Some(format!(
                        "`{}` gives every row a list or string of its window's rows (its size \
                         grows as the square of the rows); aggregate with GROUP BY instead",
                        shown(x)
                    ));
                    return Ok(TreeNodeRecursion::Continue);
                }
                // A column passed on (renamed or not) writes nothing new.
                let passed_on = match x {
                    Expr::Column(_) => true,
                    Expr::Alias(a) => matches!(a.expr.as_ref(), Expr::Column(_)),
                    _ => false,
                };
                if passed_on {
                    return Ok(TreeNodeRecursion::Continue);
                }
                let w = written(x, &lookup);
                let (most, what) = if w.per_row {
                    (WRITTEN_ROW_BYTES, "a row")
                } else {
                    (WRITTEN_VALUE_BYTES, "a value")
                };
                if w.bytes > most {
                    problem = Some(match w.bytes {
                        u64::MAX => format!(
                            "`{}` chooses a size not written as a number (a count, length or \
                             range bound there must be a number literal, e.g. 15 rather than \
                             10 + 5, so that its size is known before DataFusion evaluates it)",
                            shown(x)
                        ),
                        b => format!(
                            "`{}` writes up to {b} bytes for {what} (at most {most} bytes: a \
                             type, count or length chosen in the query, or a value copied into \
                             itself through subqueries); use a smaller one",
                            shown(x)
                        ),
                    });
                    return Ok(TreeNodeRecursion::Continue);
                }
                if w.rows > WRITTEN_ROW_COPIES {
                    problem = Some(format!(
                        "`{}` copies the values of a row up to {} times (at most \
                         {WRITTEN_ROW_COPIES}: a count chosen in the query, or a value copied \
                         into itself through subqueries); use fewer copies",
                        shown(x),
                        w.rows
                    ));
                    return Ok(TreeNodeRecursion::Continue);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if problem.is_none() && one_row_bytes > WRITTEN_ONE_ROW_BYTES {
        problem = Some(format!(
            "the steps of one row of this statement and the rows of its VALUES lists write up \
             to {one_row_bytes} bytes in all, their values summed (at most \
             {WRITTEN_ONE_ROW_BYTES}: DataFusion computes their constants while it plans, \
             outside the memory pool); write fewer or smaller constants, or split the statement"
        ));
    }
    match problem {
        Some(why) => Err(super::refuse(&why)),
        None => Ok(()),
    }
}

/// What one step of more than one row writes a row at once, its values summed ([`Written::bytes`],
/// saturating; `inputs`: its inputs' schemas and columns; round 48): a projection, VALUES or UNION
/// its output's columns (a column passed on counts what it wrote below: it is held beside the
/// new ones); an aggregate its group keys and what its calls read (arguments, FILTER, ORDER BY);
/// a join both sides' columns (copied into every row it makes), its keys and its condition; a
/// window its input's columns and what its calls read; an unnest its input's columns; a filter
/// or a sort what its predicate or keys write. None for any other node.
fn written_by_node(node: &LogicalPlan, inputs: &[(&DFSchema, Vec<Written>)]) -> Option<u64> {
    let lookup = |c: &Column| lookup_written(inputs, c);
    let add = |a: u64, b: u64| a.saturating_add(b);
    let exprs =
        |es: &mut dyn Iterator<Item = &Expr>| es.map(|e| written(e, &lookup).bytes).fold(0, add);
    let columns = |i: usize| {
        inputs
            .get(i)
            .map_or(0, |(_, cols)| cols.iter().map(|w| w.bytes).fold(0, add))
    };
    Some(match node {
        LogicalPlan::Projection(p) => exprs(&mut p.expr.iter()),
        LogicalPlan::Values(_) | LogicalPlan::Union(_) => {
            written_columns(node).iter().map(|w| w.bytes).fold(0, add)
        }
        LogicalPlan::Aggregate(a) => exprs(
            &mut a
                .group_expr
                .iter()
                .chain(a.aggr_expr.iter().flat_map(aggregate_inputs)),
        ),
        LogicalPlan::Join(j) => add(
            add(columns(0), columns(1)),
            exprs(
                &mut j
                    .on
                    .iter()
                    .flat_map(|(l, r)| [l, r])
                    .chain(j.filter.as_ref())
                    .filter(|e| passed_on(e).is_none()),
            ),
        ),
        LogicalPlan::Window(w) => add(
            columns(0),
            exprs(&mut w.window_expr.iter().flat_map(window_inputs)),
        ),
        // Its rows are its output's: an element of each list beside the other columns (a
        // one-row input of a long list, `unnest(range(1, 200000))`, writes rows of 8 bytes).
        LogicalPlan::Unnest(_) => written_columns(node).iter().map(|w| w.bytes).fold(0, add),
        LogicalPlan::Filter(f) => exprs(&mut std::iter::once(&f.predicate)),
        LogicalPlan::Sort(s) => exprs(
            &mut s
                .expr
                .iter()
                .map(|k| &k.expr)
                .filter(|e| passed_on(e).is_none()),
        ),
        _ => return None,
    })
}

/// What a window expression reads: its call's arguments, FILTER, PARTITION BY and ORDER BY (`e`
/// itself if it is not a call).
fn window_inputs(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::Alias(a) => window_inputs(&a.expr),
        Expr::WindowFunction(w) => {
            let p = &w.params;
            p.args
                .iter()
                .chain(p.filter.as_deref())
                .chain(&p.partition_by)
                .chain(p.order_by.iter().map(|s| &s.expr))
                .collect()
        }
        e => vec![e],
    }
}

/// A step of a plan as a message names it.
fn step_name(node: &LogicalPlan) -> &'static str {
    match node {
        LogicalPlan::Projection(_) => "a SELECT list (projection)",
        LogicalPlan::Values(_) => "a VALUES list",
        LogicalPlan::Union(_) => "a UNION",
        LogicalPlan::Aggregate(_) => "an aggregate (its GROUP BY keys and its calls' arguments)",
        LogicalPlan::Join(_) => "a JOIN (both sides' values, its keys and its condition)",
        LogicalPlan::Window(_) => "a window (its input and its calls' arguments)",
        LogicalPlan::Unnest(_) => "an UNNEST",
        LogicalPlan::Filter(_) => "a WHERE clause (filter)",
        LogicalPlan::Sort(_) => "an ORDER BY",
        _ => "a step",
    }
}

/// An expression for a message, cut to 120 characters.
fn shown(e: &Expr) -> String {
    let s = e.to_string();
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// A size the query writes: an upper bound on the bytes of one value by what is written in it
/// (saturating; `u64::MAX` where a count is written but not as a plain number, so it cannot be
/// sized: refused), how many times it may copy the values of a row it reads from a table
/// (`rows`), and whether the value reads a column (then it is computed once a row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    bytes: u64,
    per_row: bool,
    rows: u64,
}

impl Written {
    /// A column read from a table (or whose definition is not known): the data's size, once.
    const READ: Written = Written {
        bytes: 0,
        per_row: true,
        rows: 1,
    };
    fn max(self, o: Written) -> Written {
        Written {
            bytes: self.bytes.max(o.bytes),
            per_row: self.per_row || o.per_row,
            rows: self.rows.max(o.rows),
        }
    }
}

/// The constant part of `e` (one that reads no column) whose bytes times the levels around it
/// are the largest: its bytes and its levels (`around` for `e` itself).
fn heaviest_constant(e: &Expr, around: u64, cols: &dyn Fn(&Column) -> Written) -> (u64, u64) {
    let mut best = (0u64, 0u64);
    if e.column_refs().is_empty() && !matches!(e, Expr::Literal(..)) {
        best = (written(e, cols).bytes, around);
    }
    let _ = e.apply_children(|c| {
        let (b, l) = heaviest_constant(c, around + 1, cols);
        if b.saturating_mul(l) > best.0.saturating_mul(best.1) {
            best = (b, l);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    best
}

/// Whether `plan` has at most one row by its shape (no FROM, an aggregate without GROUP BY, one
/// VALUES row, and what passes one of them on).
fn one_row(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::EmptyRelation(_) => true,
        LogicalPlan::Aggregate(a) => a.group_expr.is_empty(),
        LogicalPlan::Values(v) => v.values.len() <= 1,
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Distinct(_) => plan.inputs().first().is_some_and(|i| one_row(i)),
        _ => false,
    }
}

/// A column of a fixed-width type: its width, once a row.
fn fixed(t: &DataType) -> Option<Written> {
    fixed_width(t).map(|w| Written {
        bytes: w,
        per_row: true,
        rows: 0,
    })
}

/// The column `c` among `inputs` (each a schema and its columns' [`Written`]), the first that
/// has it; a column of none of them (an outer reference) counts as read.
fn lookup_written(inputs: &[(&DFSchema, Vec<Written>)], c: &Column) -> Written {
    inputs
        .iter()
        .find_map(|(schema, cols)| {
            schema
                .index_of_column(c)
                .ok()
                .and_then(|i| cols.get(i).copied())
        })
        .unwrap_or(Written::READ)
}

/// What each output column of `plan` writes ([`Written`]), composed through the plan
/// ([`compose`]): a table's column of a fixed-width type its width, any other read once; an
/// aggregate's result read once (its memory is the pool's); an unnested item its width if fixed.
fn written_columns(plan: &LogicalPlan) -> Vec<Written> {
    compose(plan)
}

impl ColumnBound for Written {
    const READ: Written = Written::READ;
    fn max(self, o: Self) -> Self {
        Written::max(self, o)
    }
    fn scanned(plan: &LogicalPlan) -> Vec<Self> {
        plan.schema()
            .fields()
            .iter()
            .map(|f| fixed(f.data_type()).unwrap_or(Written::READ))
            .collect()
    }
    fn expr(e: &Expr, schema: &DFSchema, cols: &[Self]) -> Self {
        let inputs = [(schema, cols.to_vec())];
        written(e, &|c| lookup_written(&inputs, c))
    }
    // A list or string an aggregate builds of its rows (array_agg, string_agg) may take what
    // the memory pool allows: it may be used once, not copied (it counts as many copies of a row
    // as a value may take). Any other aggregate's result is one of its values or a number.
    fn aggregated(e: &Expr, t: &DataType, largest: Self) -> Self {
        let inner = match e {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
        match inner {
            Expr::AggregateFunction(f) if matches!(f.func.name(), "array_agg" | "string_agg") => {
                Written {
                    bytes: 0,
                    per_row: true,
                    rows: WRITTEN_ROW_COPIES,
                }
            }
            _ => fixed(t).unwrap_or(largest),
        }
    }
    fn unnested(t: &DataType, largest: Self) -> Self {
        fixed(t).unwrap_or(largest)
    }
}

/// A bound on the values of a column, composed through a plan by [`compose`]: the private
/// fragment's [`Bytes`] and what a statement writes, [`Written`].
trait ColumnBound: Copy {
    /// A column whose definition is not known (read from a table): the least any column takes.
    const READ: Self;
    fn max(self, o: Self) -> Self;
    /// The columns of a scan or an empty relation.
    fn scanned(plan: &LogicalPlan) -> Vec<Self>;
    /// An expression over `schema`, whose columns take `cols`.
    fn expr(e: &Expr, schema: &DFSchema, cols: &[Self]) -> Self;
    /// An aggregate's result `e` of type `t`, its input's columns taking at most `largest`.
    fn aggregated(e: &Expr, t: &DataType, largest: Self) -> Self;
    /// An unnested item of type `t`, its input's columns taking at most `largest`.
    fn unnested(t: &DataType, largest: Self) -> Self;
}

/// Each output column of `plan`, composed bottom-up: a scan's columns as the bound says; a
/// projected expression over its input's columns; a column passed on by a filter, alias, sort,
/// limit, repartition or join keeps its bound; a union's or a recursive query's column the largest
/// of its terms'; an aggregate's groups as expressions and its results as the bound says; any
/// other node's columns the largest of its inputs'.
fn compose<B: ColumnBound>(plan: &LogicalPlan) -> Vec<B> {
    let n = plan.schema().fields().len();
    let largest = |cols: &[B]| cols.iter().fold(B::READ, |a, b| a.max(*b));
    // Each input composed once (twice per node would be exponential in nested aggregates).
    let over = |input: &LogicalPlan, cols: &[B], exprs: &[Expr]| -> Vec<B> {
        exprs
            .iter()
            .map(|e| B::expr(e, input.schema(), cols))
            .collect()
    };
    match plan {
        LogicalPlan::TableScan(_) | LogicalPlan::EmptyRelation(_) => B::scanned(plan),
        LogicalPlan::Projection(p) => over(&p.input, &compose::<B>(&p.input), &p.expr),
        LogicalPlan::Values(v) => (0..n)
            .map(|i| {
                v.values
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|e| B::expr(e, &v.schema, &[]))
                    .fold(B::READ, B::max)
            })
            .collect(),
        LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Distinct(datafusion::logical_expr::Distinct::All(_)) => {
            let cols = compose::<B>(plan.inputs()[0]);
            if cols.len() == n {
                cols
            } else {
                vec![largest(&cols); n]
            }
        }
        LogicalPlan::Join(j) => {
            let (l, r) = (compose::<B>(&j.left), compose::<B>(&j.right));
            use datafusion::logical_expr::JoinType::*;
            match j.join_type {
                LeftSemi | LeftAnti => l,
                RightSemi | RightAnti => r,
                _ if n == l.len() + r.len() => l.into_iter().chain(r).collect(),
                _ => vec![largest(&[largest(&l), largest(&r)]); n],
            }
        }
        LogicalPlan::Union(_) | LogicalPlan::RecursiveQuery(_) => {
            let terms: Vec<Vec<B>> = plan.inputs().into_iter().map(compose::<B>).collect();
            (0..n)
                .map(|i| {
                    largest(
                        &terms
                            .iter()
                            .filter_map(|t| t.get(i).copied())
                            .collect::<Vec<_>>(),
                    )
                })
                .collect()
        }
        LogicalPlan::Aggregate(a) => {
            let cols = compose::<B>(&a.input);
            let rest = largest(&cols);
            let mut out = over(&a.input, &cols, &a.group_expr);
            let fields = plan.schema().fields();
            for (e, f) in a.aggr_expr.iter().zip(fields.iter().skip(out.len())) {
                out.push(B::aggregated(e, f.data_type(), rest));
            }
            out.resize(n, B::READ);
            out
        }
        LogicalPlan::Unnest(u) => {
            let rest = largest(&compose::<B>(&u.input));
            plan.schema()
                .fields()
                .iter()
                .map(|f| B::unnested(f.data_type(), rest))
                .collect()
        }
        other => {
            let all: Vec<B> = other.inputs().into_iter().flat_map(compose::<B>).collect();
            vec![largest(&all); n]
        }
    }
}

/// The size `e` writes ([`Written`]), its columns' from `cols`: literals, casts to sized types,
/// and the functions whose output size an argument chooses (`repeat`, `lpad`, `rpad`,
/// `array_repeat`, `array_resize`, `range`, `generate_series`, `replace`, `regexp_replace`),
/// nested ones multiplied; any other function, `||` and any other expression writes the sum of
/// its arguments (a boolean or number result counts its operands too: conservative). A column
/// read from a table writes nothing (its size is the data's; the private fragment bounds rows
/// over private tables) and copies its row once; a byte at least where it is copied.
fn written(e: &Expr, cols: &dyn Fn(&Column) -> Written) -> Written {
    let columns = |e: &Expr| !e.column_refs().is_empty();
    // A count written as a number (its value), a column (0: per row, bounded when it runs:
    // sized.rs), or anything else (not sized: u64::MAX), as i128 so that negative bounds keep
    // their distance.
    let number = |a: Option<&Expr>| -> Option<i128> {
        match a? {
            Expr::Negative(x) if matches!(x.as_ref(), Expr::Literal(..)) => {
                number_of(x).map(|n| -n)
            }
            x => number_of(x),
        }
    };
    let count = |a: Option<&Expr>| -> u64 {
        match (a, number(a)) {
            (_, Some(n)) => u64::try_from(n).unwrap_or(0),
            (Some(Expr::Column(_)), None) => 0,
            (None, None) => 0,
            _ => u64::MAX,
        }
    };
    let sum = |xs: &mut dyn Iterator<Item = &Expr>| {
        xs.map(|x| written(x, cols))
            .fold((0u64, 0u64), |(b, r), w| {
                (b.saturating_add(w.bytes), r.saturating_add(w.rows))
            })
    };
    let per_row = columns(e);
    let (bytes, rows) = match e {
        Expr::Column(c) => {
            let w = cols(c);
            (w.bytes, w.rows)
        }
        Expr::Literal(v, _) => (
            match v {
                ScalarValue::Utf8(Some(t))
                | ScalarValue::LargeUtf8(Some(t))
                | ScalarValue::Utf8View(Some(t)) => t.len() as u64,
                v => v.size() as u64,
            },
            0,
        ),
        Expr::Alias(a) => {
            let w = written(&a.expr, cols);
            (w.bytes, w.rows)
        }
        Expr::Cast(c) => {
            let w = written(&c.expr, cols);
            (w.bytes.max(type_bytes(c.field.data_type())), w.rows)
        }
        Expr::TryCast(c) => {
            let w = written(&c.expr, cols);
            (w.bytes.max(type_bytes(c.field.data_type())), w.rows)
        }
        Expr::ScalarFunction(f) => {
            let args = &f.args;
            let arg = |i: usize| {
                args.get(i).map_or(
                    Written {
                        bytes: 0,
                        per_row: false,
                        rows: 0,
                    },
                    |a| written(a, cols),
                )
            };
            match f.name() {
                "arrow_cast" => {
                    let ty = match args.get(1) {
                        Some(Expr::Literal(ScalarValue::Utf8(Some(t)), _)) => {
                            t.parse::<DataType>().map_or(0, |t| type_bytes(&t))
                        }
                        _ => 0,
                    };
                    {
                        let a = arg(0);
                        (a.bytes.max(ty), a.rows)
                    }
                }
                // n copies of a string (of a byte at least: a column's is not written), a
                // string of n characters (4 bytes each at most), n copies of a value.
                // A count read from a column is bounded when the call runs, at a row's worth
                // (sized.rs): its result counts that much, so copies of it add up here.
                "repeat" | "lpad" | "rpad" | "array_repeat" | "array_resize"
                    if matches!(args.get(1), Some(Expr::Column(_))) =>
                {
                    (WRITTEN_ROW_BYTES, 0)
                }
                "repeat" => {
                    let (n, a) = (count(args.get(1)), arg(0));
                    (n.saturating_mul(a.bytes.max(1)), n.saturating_mul(a.rows))
                }
                "lpad" | "rpad" => {
                    let a = arg(0);
                    (count(args.get(1)).saturating_mul(4).max(a.bytes), a.rows)
                }
                "array_repeat" | "array_resize" => {
                    let (n, a) = (count(args.get(1)), arg(0));
                    (
                        n.saturating_mul(a.bytes.max(8)),
                        n.saturating_mul(a.rows.max(1)),
                    )
                }
                // Hexadecimal doubles (base64 takes 4/3); an item per character at most 16
                // bytes: as the bound when the call runs (sized.rs) counts them.
                "encode" => {
                    let a = arg(0);
                    (
                        a.bytes.saturating_mul(2).saturating_add(4),
                        a.rows.saturating_mul(2),
                    )
                }
                "string_to_array" => {
                    let a = arg(0);
                    (
                        a.bytes.saturating_add(1).saturating_mul(16),
                        a.rows.saturating_mul(16),
                    )
                }
                "range" | "generate_series"
                    if args.iter().any(|a| matches!(a, Expr::Column(_))) =>
                {
                    (WRITTEN_ROW_BYTES, 0)
                }
                // Every match replaced: at most the text's length times the replacement's.
                "replace" | "regexp_replace" => {
                    let (a, to) = (arg(0), arg(2));
                    (
                        a.bytes.max(1).saturating_mul(to.bytes.max(1)),
                        a.rows
                            .saturating_mul(to.bytes.max(1))
                            .saturating_add(to.rows.saturating_mul(a.bytes.max(1)))
                            .saturating_add(a.rows.saturating_mul(to.rows)),
                    )
                }
                "range" | "generate_series" => {
                    let bound = |i: usize| match (args.get(i), number(args.get(i))) {
                        (_, Some(n)) => Some(n),
                        (Some(Expr::Column(_)), None) => Some(0),
                        _ => None,
                    };
                    let (lo, hi, step) = match args.len() {
                        1 => (Some(0), bound(0), Some(1)),
                        2 => (bound(0), bound(1), Some(1)),
                        _ => (bound(0), bound(1), bound(2)),
                    };
                    let bytes = match (lo, hi, step) {
                        (Some(lo), Some(hi), Some(step)) => {
                            let items = (hi - lo).unsigned_abs() / step.unsigned_abs().max(1);
                            u64::try_from(items.saturating_mul(8)).unwrap_or(u64::MAX)
                        }
                        // Dates, timestamps, intervals: not sized.
                        _ => u64::MAX,
                    };
                    (bytes, 0)
                }
                // A function of the private fragment: its size rule there (FUNCTIONS); any
                // other: the sum of its arguments (and bounded when it runs: sized.rs).
                // (Each argument sized once: twice per level would be exponential in depth.)
                name => match function(name).map(|f| f.size) {
                    Some(Fixed) => (FIXED_AS_TEXT, 0),
                    Some(First) => {
                        let a = arg(0);
                        (a.bytes, a.rows)
                    }
                    Some(Times(k)) => {
                        let a = arg(0);
                        (a.bytes.saturating_mul(k), a.rows.saturating_mul(k))
                    }
                    Some(Separated) => {
                        let (sep, copies) = (arg(0), args.len().saturating_sub(2) as u64);
                        let (b, r) = sum(&mut args.iter().skip(1));
                        (
                            b.saturating_add(sep.bytes.saturating_mul(copies)),
                            r.saturating_add(sep.rows.saturating_mul(copies)),
                        )
                    }
                    Some(Sum) | None => sum(&mut args.iter()),
                },
            }
        }
        // An aggregate's or a window's result: its memory is the pool's; read once.
        Expr::AggregateFunction(_) | Expr::WindowFunction(_) => (0, 1),
        // A constant from a subquery: what its plan writes is checked there.
        Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) => (0, 0),
        Expr::BinaryExpr(b) if b.op == Operator::StringConcat => {
            sum(&mut [b.left.as_ref(), b.right.as_ref()].into_iter())
        }
        // Numbers and booleans (their operands are checked as values of their own).
        Expr::BinaryExpr(_)
        | Expr::Like(_)
        | Expr::SimilarTo(_)
        | Expr::Not(_)
        | Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsTrue(_)
        | Expr::IsFalse(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotTrue(_)
        | Expr::IsNotFalse(_)
        | Expr::IsNotUnknown(_)
        | Expr::Negative(_)
        | Expr::Between(_)
        | Expr::InList(_) => (16, 0),
        // One of its branches.
        Expr::Case(c) => c
            .when_then_expr
            .iter()
            .map(|(_, t)| t.as_ref())
            .chain(c.else_expr.as_deref())
            .map(|x| written(x, cols))
            .fold((0, 0), |(b, r), w| (b.max(w.bytes), r.max(w.rows))),
        other => {
            let mut children = vec![];
            let _ = other.apply_children(|c| {
                children.push(c);
                Ok(TreeNodeRecursion::Continue)
            });
            sum(&mut children.into_iter())
        }
    };
    Written {
        bytes,
        per_row,
        rows,
    }
}

/// The value of a literal number as i128 (NULL: 0; None: not a number literal).
fn number_of(e: &Expr) -> Option<i128> {
    match e {
        Expr::Literal(v, _) => match v.clone().cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(n)) => Some(n.map_or(0, i128::from)),
            _ => None,
        },
        _ => None,
    }
}

/// The bytes one value of type `t` takes at least, by its fixed sizes (a fixed-size list of n
/// items n times its item), saturating; 8 for a variable-size one (as written, it may be empty).
pub(super) fn type_bytes(t: &DataType) -> u64 {
    match t {
        DataType::FixedSizeList(f, n) => u64::try_from(*n)
            .unwrap_or(0)
            .saturating_mul(type_bytes(f.data_type())),
        DataType::FixedSizeBinary(n) => u64::try_from(*n).unwrap_or(0),
        DataType::Struct(fields) => fields
            .iter()
            .map(|f| type_bytes(f.data_type()))
            .fold(0, u64::saturating_add),
        DataType::Dictionary(_, v) => type_bytes(v),
        // A null union or run-end array allocates every child (or the values) in full.
        DataType::Union(fields, _) => fields
            .iter()
            .map(|(_, f)| type_bytes(f.data_type()))
            .fold(0, u64::saturating_add),
        DataType::RunEndEncoded(ends, values) => {
            type_bytes(ends.data_type()).saturating_add(type_bytes(values.data_type()))
        }
        DataType::Map(f, _)
        | DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f) => type_bytes(f.data_type()).max(8),
        t => t.primitive_width().map_or(8, |w| w as u64),
    }
}

/// Every model call's feature list holds numbers as written (issue: a mixed list), and no DP
/// call has the wildcard `*` among its arguments (round 51, review "newuser": `dp_count(*, ε)` was
/// refused as "the expression kind Wildcard … between private table …"; [`wildcard_refusal`]).
///
/// Checked on the plan as the SQL planner made it, before the analyzer's type coercion: there,
/// `[x0, name]` with `name` a string is coerced to one element type (the string cast to a number,
/// failing or not per row, or the numbers to strings), and an implicit cast cannot be told from an
/// explicit one afterwards. A string, boolean, date or NULL item is refused, naming it; an
/// explicit numeric cast (`CAST(name AS DOUBLE)`, docs/SQL.md "Bad input") is a number as
/// written.
pub fn check_feature_lists(plan: &LogicalPlan) -> datafusion::common::Result<()> {
    let mut problem = None;
    plan.apply_with_subqueries(|node| {
        let LogicalPlan::Aggregate(agg) = node else {
            return Ok(TreeNodeRecursion::Continue);
        };
        for e in &agg.aggr_expr {
            let mut e = e;
            while let Expr::Alias(a) = e {
                e = &a.expr;
            }
            let Expr::AggregateFunction(f) = e else {
                continue;
            };
            let name = f.func.name().to_ascii_lowercase();
            let Some(spec) = dpfusion_udfs::aggregates::registry::get(&name) else {
                continue;
            };
            for a in &f.params.args {
                if a.exists(|x| Ok(is_wildcard(x)))? {
                    problem = Some(wildcard_refusal(&name, spec));
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            let Some(i) = spec.data.iter().position(|d| d.name == "features") else {
                continue;
            };
            let Some((items, below)) = f
                .params
                .args
                .get(i)
                .and_then(|a| written_feature_items(a, &agg.input))
            else {
                continue;
            };
            for (k, item) in items.iter().enumerate() {
                let t = item.get_type(below.schema())?;
                if !numeric_feature(&t) {
                    let shown = match item {
                        Expr::Column(c) => c.name.clone(),
                        e => e.to_string(),
                    };
                    problem = Some(format!(
                        "the features of {name} must be numbers as written, and item {} of the \
                         list, `{shown}`, is {t} (it would be converted implicitly to the list's \
                         common type). Cast it explicitly with a numeric cast, e.g. \
                         CAST({shown} AS DOUBLE) (docs/SQL.md, \"Bad input\"), or drop it from \
                         the list.",
                        k + 1
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match problem {
        Some(m) => Err(super::refuse(m)),
        None => Ok(()),
    }
}

/// `*` or `t.*` (DataFusion's deprecated `Expr::Wildcard`, which its SQL planner still leaves
/// in a function's arguments).
#[allow(deprecated)]
fn is_wildcard(e: &Expr) -> bool {
    matches!(e, Expr::Wildcard { .. })
}

/// The refusal of a wildcard among the arguments of the DP aggregate `spec`, called as `name`:
/// it is never one, and the message says what to write in the function's own terms (round 51).
fn wildcard_refusal(name: &str, spec: &dpfusion_udfs::aggregates::registry::Aggregate) -> String {
    let counts = dpfusion_udfs::aggregates::registry::base_of(name).map(|b| b.name);
    if counts == Some("dp_count") {
        return format!(
            "{name} counts the non-NULL values of a column, and `*` is no column: write \
             {name}(col, epsilon) (any NOT NULL column counts every row). Its arguments: {}.",
            spec.usage()
        );
    }
    let data: Vec<&str> = spec.data.iter().map(|d| d.name).collect();
    format!(
        "`*` is no argument of {name} (nor of any DP function): write {}, with a column or an \
         expression over one row's columns as {}.",
        spec.usage(),
        data.join(", ")
    )
}

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

// ---- literal patterns over private rows (round 46) ---------------------------------------------

/// The most bytes the NFA of a literal pattern over private rows may take (regex-automata's
/// `thompson::Config::nfa_size_limit`, for a regular expression as written and for the one a
/// LIKE pattern stands for): 256 KiB. It bounds the work of compiling the NFA (about a
/// millisecond) and of each step of building [`PATTERN_DFA_BYTES`] from it. Unicode `\w` alone
/// takes 18 KiB, so `\w{10}` fits (176 KiB) and `\w{20}` does not.
pub const PATTERN_BYTES: usize = 256 << 10;

/// The most bytes the DFA a literal pattern over private rows is matched with may take, and the
/// most its determinization may use beside it (regex-automata's `dense::Config::dfa_size_limit`
/// and `determinize_size_limit`): 1 MiB. Round 46: the NFA's size bounded the work of matching a
/// row only loosely (`a[ab]{3000}[^ab]` fitted 256 KiB, and the regex crate's lazy DFA gave up on
/// it and fell back to an NFA simulation costing seconds per 16 KiB row), so every pattern over
/// private rows is determinised in full at planning and a row costs one transition per byte,
/// whatever the pattern. A pattern whose DFA would be larger is refused: `a[ab]{11}[^ab]` fits
/// (514 KiB), `a[ab]{12}[^ab]` does not; `\w{5}` (793 KiB) and `\w{6}` (951 KiB) fit,
/// `\w{7}` does not; `^\w+@\w+\.\w+$` takes 478 KiB, `\d{4}-\d{2}-\d{2}` 104 KiB, a
/// LIKE `%foo%` or ILIKE `a_b%` under 2 KiB, `%a_________b%` (9 `_` after a `%`) 640 KiB.
/// Building one took at most 0.06 s in a release build and 1.1 s in a debug build for an allowed
/// pattern (`(?:.?){120}b`), 0.17 s and 3.2 s for one refused at the bound, over adversarial
/// families (measured on 2 cores); 2 MiB doubled that (4 MiB: 2.3 s in a release build) for
/// little more that fits. A statement builds each pattern about four times (the fragment check,
/// the matcher, the two audits), so its patterns cost at most a few seconds of planning in a
/// release build: work its text decides, never the data.
pub const PATTERN_DFA_BYTES: usize = 1 << 20;

/// A literal pattern compiled for matching over private rows: a dense DFA searched unanchored
/// (anchors in the pattern anchor it), one transition per byte ([`compile_pattern`]).
pub type PatternDfa = regex_automata::dfa::dense::DFA<Vec<u32>>;

/// The most characters a case-insensitive regular expression's character classes may hold
/// (in ranges that start at or below U+1E943, the last character with a case folding): 262,144. The regex crate
/// folds every character of a class it matches without regard to case one by one, before the
/// size limit is checked: `(?i)[\s\S]` folded all 1.1 million characters (about 3.5 ms in a
/// release build), fifty of them compiled in a quarter of a second within 64 KiB. `(?i)\pL` holds
/// 70,260 such characters; `(?i)\w` and `(?i)[a-z]` fold nothing large.
pub const PATTERN_FOLDED_CHARS: u64 = 1 << 18;

/// The most literal patterns (regular expressions and LIKE patterns) one statement may match over
/// private rows: 16, counted on the statement as written ([`check_pattern_count`]).
pub const PATTERNS: usize = 16;

/// What a literal pattern stands for: a regular expression (`~ ~* !~ !~*`) or a LIKE pattern
/// (`LIKE ILIKE NOT LIKE NOT ILIKE`, `~~ ~~* !~~ !~~*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternKind {
    Regex,
    Like,
}

/// A pattern match: `expr` matched against `pattern`.
#[derive(Debug, Clone, Copy)]
pub struct PatternMatch<'a> {
    pub expr: &'a Expr,
    pub pattern: &'a Expr,
    pub kind: PatternKind,
    pub case_insensitive: bool,
    pub negated: bool,
}

impl PatternMatch<'_> {
    /// The pattern's text when it is a literal string (None: NULL, or not a literal).
    pub fn text(&self) -> Option<String> {
        literal_value(self.pattern)?
            .try_as_str()
            .flatten()
            .map(str::to_string)
    }
}

/// `e` as a pattern match, if it is one (SIMILAR TO is refused over private rows, and no
/// `regexp_*` function is in [`FUNCTIONS`]).
pub fn pattern_match(e: &Expr) -> Option<PatternMatch<'_>> {
    use Operator::*;
    use PatternKind::{Like, Regex};
    match e {
        Expr::BinaryExpr(b) => {
            let (kind, case_insensitive, negated) = match b.op {
                RegexMatch => (Regex, false, false),
                RegexIMatch => (Regex, true, false),
                RegexNotMatch => (Regex, false, true),
                RegexNotIMatch => (Regex, true, true),
                LikeMatch => (Like, false, false),
                ILikeMatch => (Like, true, false),
                NotLikeMatch => (Like, false, true),
                NotILikeMatch => (Like, true, true),
                _ => return None,
            };
            Some(PatternMatch {
                expr: &b.left,
                pattern: &b.right,
                kind,
                case_insensitive,
                negated,
            })
        }
        Expr::Like(l) => Some(PatternMatch {
            expr: &l.expr,
            pattern: &l.pattern,
            kind: Like,
            case_insensitive: l.case_insensitive,
            negated: l.negated,
        }),
        _ => None,
    }
}

/// The regular expression arrow matches for a LIKE pattern (arrow-string 59.3.2,
/// `predicate.rs`, `regex_like`; its other predicates are shortcuts with the same result): `%`
/// is `.*` (dropped at either end, where the regex is then unanchored), `_` is `.`, `\` escapes
/// the next character (a trailing one is a backslash), and every other character is itself.
/// Compiled with `dot_matches_new_line`, and `case_insensitive` for ILIKE.
pub fn like_regex(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut chars = pattern.chars().peekable();
    match chars.peek() {
        Some('%') => {
            chars.next();
        }
        _ => out.push('^'),
    }
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => {
                    if regex_syntax::is_meta_character(next) {
                        out.push('\\');
                    }
                    out.push(next);
                }
                None => out.push_str("\\\\"),
            },
            '%' => out.push_str(".*"),
            '_' => out.push('.'),
            c => {
                if regex_syntax::is_meta_character(c) {
                    out.push('\\');
                }
                out.push(c);
            }
        }
    }
    if out.ends_with(".*") {
        out.truncate(out.len() - 2);
    } else {
        out.push('$');
    }
    out
}

/// The literal pattern `pattern` compiled to the language arrow compiles it to over a batch (a
/// regular expression prefixed by `(?i)` when case-insensitive; a LIKE pattern by [`like_regex`],
/// with `dot_matches_new_line`, and `case_insensitive` for ILIKE; the regex crate's defaults
/// otherwise: Unicode, UTF-8, the same parser), as a fully built DFA ([`PatternDfa`]), or why it
/// is refused over private rows: it does not compile; matched without regard to case, its
/// classes hold more than [`PATTERN_FOLDED_CHARS`] characters; its NFA would take more than
/// [`PATTERN_BYTES`]; it has a Unicode word boundary, which a DFA cannot match (`(?-u:\b)`
/// can); or its DFA would take more than [`PATTERN_DFA_BYTES`]. None: the empty regular
/// expression, which arrow does not compile (it matches every string).
///
/// So the compile is bounded and done once, at planning: the expressions over private rows hold
/// the compiled matcher (`super::total::total_form`), so that no batch compiles a pattern, and
/// whether a batch has a row a private CASE, AND or OR selects no longer decides whether a
/// pattern is compiled (round 46: 25 patterns under `CASE WHEN salary > 100000` took 6.2 s on a
/// table with one such row and 0.085 s without it). And matching is bounded: one DFA transition
/// per byte of a row, whatever the pattern (round 46: `a[ab]{3000}[^ab]` compiled within the
/// NFA bound and cost about 2.8 s per selected 16 KiB row in a debug build).
pub fn compile_pattern(
    kind: PatternKind,
    case_insensitive: bool,
    pattern: &str,
) -> Result<Option<PatternDfa>, String> {
    use regex_automata::dfa::{StartKind, dense};
    use regex_automata::nfa::thompson;
    use regex_automata::util::syntax;
    let shown = |p: &str| match p.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &p[..i]),
        None => p.to_string(),
    };
    let (text, what) = match kind {
        PatternKind::Regex if pattern.is_empty() && !case_insensitive => return Ok(None),
        PatternKind::Regex if case_insensitive => (
            format!("(?i){pattern}"),
            format!("the regular expression '{}'", shown(pattern)),
        ),
        PatternKind::Regex => (
            pattern.to_string(),
            format!("the regular expression '{}'", shown(pattern)),
        ),
        PatternKind::Like => (
            like_regex(pattern),
            format!("the LIKE pattern '{}'", shown(pattern)),
        ),
    };
    if kind == PatternKind::Regex {
        let ast = regex_syntax::ast::parse::Parser::new()
            .parse(&text)
            .map_err(|e| format!("{what}, which is not a valid regular expression ({e})"))?;
        let folded = folded_chars(&text, &ast);
        if folded > PATTERN_FOLDED_CHARS {
            return Err(format!(
                "{what}, which matches character classes of {folded} characters without regard \
                 to case (at most {PATTERN_FOLDED_CHARS} over private rows: each character of \
                 such a class is case-folded one by one when the pattern is compiled); match \
                 case, or use smaller classes ([a-z] rather than [\\s\\S] or \\p{{Any}})"
            ));
        }
    }
    const SMALLER: &str = "use a smaller pattern: fewer counted repetitions (\\w{20}, [ab]{30}), \
        fewer wildcards (_ and %) in a row or after a leading %, ASCII classes ([A-Za-z0-9_] or \
        (?-u:\\w) rather than Unicode \\w, \\d or \\pL)";
    // The regex crate's defaults (arrow's `Regex::new` and `RegexBuilder`): Unicode, UTF-8 only,
    // nesting at most 250, no octal; LIKE as arrow builds it.
    let nfa = thompson::Compiler::new()
        .syntax(
            syntax::Config::new()
                .case_insensitive(kind == PatternKind::Like && case_insensitive)
                .dot_matches_new_line(kind == PatternKind::Like),
        )
        .configure(
            thompson::Config::new()
                .nfa_size_limit(Some(PATTERN_BYTES))
                .which_captures(thompson::WhichCaptures::None),
        )
        .build(&text)
        .map_err(|e| match e.size_limit() {
            Some(_) => format!(
                "{what}, which compiles to more than {PATTERN_BYTES} bytes (the most over private \
                 rows); {SMALLER}"
            ),
            None => {
                let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
                format!("{what}, which does not compile ({why})")
            }
        })?;
    if nfa.look_set_any().contains_word_unicode() {
        return Err(format!(
            "{what}, which has a Unicode word boundary (\\b, \\B, \\<, \\> or \\b{{...}}): over \
             private rows a pattern is matched by a DFA, one step per byte whatever the data, and \
             a DFA cannot match Unicode word boundaries; use an ASCII one, (?-u:\\b), which \
             takes only [A-Za-z0-9_] as word characters"
        ));
    }
    dense::Builder::new()
        .configure(
            dense::Config::new()
                .start_kind(StartKind::Unanchored)
                .dfa_size_limit(Some(PATTERN_DFA_BYTES))
                .determinize_size_limit(Some(PATTERN_DFA_BYTES)),
        )
        .build_from_nfa(&nfa)
        .map(Some)
        .map_err(|e| {
            if e.is_size_limit_exceeded() {
                format!(
                    "{what}, whose automaton takes more than {PATTERN_DFA_BYTES} bytes (the most \
                     over private rows, where a pattern is matched by a DFA built in full when \
                     the statement is planned, so that matching a row costs one step per byte \
                     whatever the data); {SMALLER}"
                )
            } else {
                format!("{what}, which does not compile ({e})")
            }
        })
}

/// How many characters the classes of `ast` (a regular expression's syntax, `text` its source)
/// hold that the regex crate would case-fold one by one: 0 when no part of it is
/// case-insensitive; otherwise, for every class it translates with folding (each bracketed class,
/// nested ones and the operands of `&&`, `--`, `~~` included, and each `\p{…}`), the characters of
/// its ranges (before negation, which comes after folding) that start at or below U+1E943, the
/// last character with a case folding (regex-syntax 0.8 folds such a range character by
/// character, to its end). An upper bound: every such class counts, whatever flags it is under.
/// Perl classes (`\w`, `\d`, `\s`) outside brackets are not folded one by one (measured).
fn folded_chars(text: &str, ast: &regex_syntax::ast::Ast) -> u64 {
    use regex_syntax::ast::{
        Ast, ClassBracketed, ClassSet, ClassSetItem, ClassUnicode, ClassUnicodeKind,
        ClassUnicodeOpKind, Flag, GroupKind,
    };
    use regex_syntax::hir::{Class, HirKind, translate::Translator};
    const LAST_FOLDED: u32 = 0x1E943;
    struct Walk<'a> {
        text: &'a str,
        chars: u64,
        case_insensitive: bool,
    }
    impl Walk<'_> {
        fn class(&mut self, node: Ast) {
            let n = match Translator::new().translate(self.text, &node) {
                Ok(h) => match h.kind() {
                    HirKind::Class(Class::Unicode(c)) => c
                        .ranges()
                        .iter()
                        .filter(|r| u32::from(r.start()) <= LAST_FOLDED)
                        .map(|r| u64::from(u32::from(r.end()) - u32::from(r.start())) + 1)
                        .sum(),
                    HirKind::Class(Class::Bytes(_)) => 256,
                    _ => 0,
                },
                Err(_) => u64::MAX,
            };
            self.chars = self.chars.saturating_add(n);
        }
        fn unicode(&mut self, u: &ClassUnicode) {
            let mut u = u.clone();
            u.negated = false;
            if let ClassUnicodeKind::NamedValue { op, .. } = &mut u.kind
                && *op == ClassUnicodeOpKind::NotEqual
            {
                *op = ClassUnicodeOpKind::Equal;
            }
            self.class(Ast::class_unicode(u));
        }
        fn bracketed(&mut self, b: &ClassBracketed) {
            let mut positive = b.clone();
            positive.negated = false;
            self.class(Ast::class_bracketed(positive));
            self.set(&b.kind);
        }
        fn set(&mut self, s: &ClassSet) {
            match s {
                ClassSet::Item(i) => self.item(i),
                ClassSet::BinaryOp(op) => {
                    for side in [&op.lhs, &op.rhs] {
                        self.bracketed(&ClassBracketed {
                            span: op.span,
                            negated: false,
                            kind: side.as_ref().clone(),
                        });
                    }
                }
            }
        }
        fn item(&mut self, i: &ClassSetItem) {
            match i {
                ClassSetItem::Bracketed(b) => self.bracketed(b),
                ClassSetItem::Unicode(u) => self.unicode(u),
                ClassSetItem::Union(u) => u.items.iter().for_each(|x| self.item(x)),
                _ => {}
            }
        }
        fn ast(&mut self, a: &Ast) {
            match a {
                Ast::Flags(f) if f.flags.flag_state(Flag::CaseInsensitive) == Some(true) => {
                    self.case_insensitive = true;
                }
                Ast::ClassUnicode(u) => self.unicode(u),
                Ast::ClassBracketed(b) => self.bracketed(b),
                Ast::Repetition(r) => self.ast(&r.ast),
                Ast::Group(g) => {
                    if let GroupKind::NonCapturing(f) = &g.kind
                        && f.flag_state(Flag::CaseInsensitive) == Some(true)
                    {
                        self.case_insensitive = true;
                    }
                    self.ast(&g.ast);
                }
                Ast::Alternation(x) => x.asts.iter().for_each(|y| self.ast(y)),
                Ast::Concat(x) => x.asts.iter().for_each(|y| self.ast(y)),
                _ => {}
            }
        }
    }
    let mut w = Walk {
        text,
        chars: 0,
        case_insensitive: false,
    };
    w.ast(ast);
    if w.case_insensitive { w.chars } else { 0 }
}

/// Why the pattern match `m` is not allowed over private rows (None: it is): a pattern that is
/// not a literal, or a literal one [`compile_pattern`] refuses. A NULL pattern matches nothing.
fn pattern_refusal(m: &PatternMatch) -> Option<String> {
    if !is_literal(m.pattern) {
        return Some(match m.kind {
            PatternKind::Regex => {
                "a regular expression whose pattern is not a literal (regular expressions and \
                 LIKE need a literal pattern)"
                    .to_string()
            }
            PatternKind::Like => "LIKE with a pattern that is not a literal".to_string(),
        });
    }
    let text = m.text()?;
    compile_pattern(m.kind, m.case_insensitive, &text).err()
}

/// Refuses a statement that matches more than [`PATTERNS`] literal patterns over private rows
/// (in the expressions of the nodes that read a private table's rows below them, short of a DP
/// aggregate: projections, filters, joins, and the DP aggregate's own arguments, FILTER and
/// GROUP BY), counted on the plan as written, subqueries included. Each is compiled at planning
/// and matched per row ([`compile_pattern`]), so this bounds both for a statement; checked from
/// [`check_written_sizes`], which runs once per statement before planning goes on.
pub fn check_pattern_count(plan: &LogicalPlan) -> datafusion::common::Result<()> {
    let mut count = 0usize;
    plan.apply_with_subqueries(|node| {
        if node
            .inputs()
            .into_iter()
            .any(|i| super::raw_private_table(i).is_some())
        {
            node.apply_expressions(|e| {
                e.apply(|x| {
                    if pattern_match(x).is_some() {
                        count += 1;
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if count > PATTERNS {
        return Err(super::refuse(format!(
            "the statement matches {count} regular expressions or LIKE patterns over private \
             rows (at most {PATTERNS}: each is compiled when the statement is planned and \
             matched on every row); match fewer, e.g. combine alternatives into one regular \
             expression ('a|b' rather than two matches)"
        )));
    }
    Ok(())
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
        // A list or struct literal (e.g. a make_array of literals, folded by the optimizer): its
        // memory, since it is copied once per row like any literal.
        ScalarValue::List(_)
        | ScalarValue::LargeList(_)
        | ScalarValue::FixedSizeList(_)
        | ScalarValue::Struct(_)
        | ScalarValue::Map(_) => v.size().saturating_sub(std::mem::size_of::<ScalarValue>()),
        _ => 0,
    }
}

/// Why `e` is not in the private fragment (None: it is), from its shape alone: the expression
/// kinds, operators and function names. [`check_expr_typed`] adds the types.
pub fn check_expr(e: &Expr) -> Option<String> {
    let mut why = None;
    let mut nodes = 0usize;
    let mut columns = 0usize;
    // The model arguments of the predict functions (a released model may come from a subquery).
    let mut models: Vec<&Expr> = Vec::new();
    let _ = e.apply(|x| {
        if let Expr::ScalarFunction(f) = x
            && matches!(
                f.func.name(),
                "linreg_predict" | "logreg_predict_proba" | "mlp_predict_proba" | "mlp_predict"
            )
            && let Some(m) = f.args.first()
        {
            models.push(m);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let _ = e.apply(|x| {
        nodes += 1;
        // A feature list of bare columns is bounded by the schema, not by the query: one node
        // and one column reference, up to FEATURE_WIDTH items (issue 28).
        if let Some(width) = bare_feature_list(x) {
            if width > FEATURE_WIDTH {
                why = Some(format!(
                    "a feature list of {width} columns (at most {FEATURE_WIDTH} over private rows)"
                ));
                return Ok(TreeNodeRecursion::Stop);
            }
            columns += 1;
            return Ok(TreeNodeRecursion::Jump);
        }
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
            Expr::BinaryExpr(b) if !operator_ok(&b.op, &b.right) => Some(format!(
                "the operator {} (regular expressions and LIKE need a literal pattern)",
                b.op
            )),
            // A literal pattern, compiled here within bounds (round 46).
            Expr::BinaryExpr(_) | Expr::Like(_) => pattern_match(x).and_then(|m| pattern_refusal(&m)),
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
                function(name).is_none().then(|| {
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
                         of linreg_predict/logreg_predict_proba/mlp_predict(_proba): a larger value would be copied \
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

// ---- the typed fragment (issue 26, class 2) ------------------------------------------------------

/// A bound on the bytes one row's value takes: at most `row` times the bytes of the private row
/// it is computed from, plus `constant` bytes (from types and literals, at planning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bytes {
    pub row: u64,
    pub constant: u64,
}

impl Bytes {
    fn constant(c: u64) -> Self {
        Self {
            row: 0,
            constant: c,
        }
    }
    fn plus(self, o: Self) -> Self {
        Self {
            row: self.row.saturating_add(o.row),
            constant: self.constant.saturating_add(o.constant),
        }
    }
    fn times(self, k: u64) -> Self {
        Self {
            row: self.row.saturating_mul(k),
            constant: self.constant.saturating_mul(k),
        }
    }
}

/// The width in bytes of a value of a fixed-width type (None: variable width). Fixed-size lists
/// and binaries count their whole width, whatever size the query wrote.
pub fn fixed_width(t: &DataType) -> Option<u64> {
    use DataType::*;
    Some(match t {
        Null => 0,
        Boolean | Int8 | UInt8 => 1,
        Int16 | UInt16 | Float16 => 2,
        Int32 | UInt32 | Float32 | Date32 | Time32(_) | Decimal32(..) => 4,
        Int64 | UInt64 | Float64 | Date64 | Time64(_) | Timestamp(..) | Duration(_)
        | Decimal64(..) => 8,
        Decimal128(..) | Interval(_) => 16,
        Decimal256(..) => 32,
        FixedSizeBinary(n) => u64::try_from(*n).unwrap_or(u64::MAX),
        FixedSizeList(f, n) => fixed_width(f.data_type())?
            .max(1)
            .saturating_mul(u64::try_from(*n).unwrap_or(u64::MAX)),
        Struct(fs) => fs
            .iter()
            .map(|f| fixed_width(f.data_type()))
            .sum::<Option<u64>>()?,
        _ => return None,
    })
}

/// A fixed-width scalar a value may be cast to over private rows: numbers (decimals up to
/// Decimal128), booleans, dates, times, timestamps, durations, intervals.
pub fn fixed_scalar(t: &DataType) -> bool {
    use DataType::*;
    matches!(
        t,
        Null | Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float16
            | Float32
            | Float64
            | Decimal32(..)
            | Decimal64(..)
            | Decimal128(..)
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(..)
            | Duration(_)
            | Interval(_)
    )
}

fn is_string(t: &DataType) -> bool {
    use DataType::*;
    match t {
        Utf8 | LargeUtf8 | Utf8View | Null => true,
        Dictionary(_, v) => is_string(v),
        _ => false,
    }
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

/// Why a CAST (or TRY_CAST, or `arrow_cast`) from `from` to `to` is not allowed over private rows
/// (None: it is). Allowed: to a fixed-width scalar ([`fixed_scalar`]); to a string from a string
/// or from a fixed-width scalar (its text has a bounded length); to a list of fixed-width scalars
/// from a list (as many items as the input); to a fixed-size list from a fixed-size list of the
/// same size. Refused: every other target, in particular a fixed-size list or binary whose size
/// the query chooses, Decimal256, dictionaries, structs, maps, binaries.
pub fn cast_target(from: &DataType, to: &DataType) -> Option<String> {
    let ok = match to {
        t if fixed_scalar(t) => true,
        t if is_string(t) && !matches!(t, DataType::Dictionary(..)) => {
            is_string(from) || fixed_scalar(from)
        }
        DataType::List(f) | DataType::LargeList(f) => {
            fixed_scalar(f.data_type()) && list_item(from).is_some_and(fixed_scalar)
        }
        DataType::FixedSizeList(f, n) => {
            fixed_scalar(f.data_type())
                && matches!(from, DataType::FixedSizeList(g, m) if m == n && fixed_scalar(g.data_type()))
        }
        _ => false,
    };
    (!ok).then(|| {
        format!(
            "a cast from {from} to {to} (over private rows a value may be cast only to a \
             fixed-width scalar: an integer, float, decimal up to Decimal128, boolean, date, time, \
             timestamp, duration or interval; to a string only from a string or a fixed-width \
             scalar; to a list of fixed-width scalars only from a list of the same length)"
        )
    })
}

fn in_class(c: Class, t: &DataType) -> bool {
    let num = |t: &DataType| {
        matches!(t, DataType::Null) || (t.is_numeric() && !matches!(t, DataType::Decimal256(..)))
    };
    match c {
        Class::Num => num(t),
        Class::Int => matches!(t, DataType::Null) || t.is_integer(),
        Class::Str => is_string(t),
        Class::Time => {
            num(t)
                || is_string(t)
                || matches!(
                    t,
                    DataType::Date32
                        | DataType::Date64
                        | DataType::Time32(_)
                        | DataType::Time64(_)
                        | DataType::Timestamp(..)
                        | DataType::Duration(_)
                        | DataType::Interval(_)
                )
        }
        Class::Scalar => fixed_scalar(t) || is_string(t),
        Class::List => list_item(t).is_some_and(fixed_scalar),
        Class::Any => true,
    }
}

/// A column of variable width read from a table: one row.
const ONE_ROW: Bytes = Bytes {
    row: 1,
    constant: 0,
};

/// The bytes one row's value of each output column of `plan` may take ([`Bytes`]), relative to
/// the rows of the tables it reads, composed through the plan ([`compose`]) so that sizes compose
/// through subqueries: a scanned column takes one row (a settled public side's, its largest
/// value's measured bytes); a projected expression its [`bytes`] over its input's columns; an
/// aggregate's results and unnested items (the unit bounding's totals and samples, which copy
/// input values) the largest column of its input.
///
/// Without this, each projection over private rows was bounded against its own input row, and a
/// chain of subqueries multiplied the bounds: `s || s` twice per level, 34 levels deep, made a
/// value of 2^34 times a row and aborted the process, at a size that depends on the private
/// values (found this round). An expression outside the fragment (on a public side; over private
/// rows the audit refuses it) counts one row, as a column of its own.
pub fn column_bytes(plan: &LogicalPlan) -> Vec<Bytes> {
    compose(plan)
}

impl ColumnBound for Bytes {
    const READ: Bytes = ONE_ROW;
    fn max(self, o: Self) -> Self {
        Bytes {
            row: self.row.max(o.row),
            constant: self.constant.max(o.constant),
        }
    }
    // A settled public side (checked.rs, `settle`): its values' measured bytes, a constant.
    fn scanned(plan: &LogicalPlan) -> Vec<Self> {
        let n = plan.schema().fields().len();
        let LogicalPlan::TableScan(scan) = plan else {
            return vec![ONE_ROW; n];
        };
        let widest = datafusion::datasource::source_as_provider(&scan.source)
            .ok()
            .and_then(|p| {
                p.downcast_ref::<super::table::GuardedTable>()
                    .and_then(|g| g.widest().map(<[u64]>::to_vec))
            });
        match widest {
            Some(w) => (0..n)
                .map(|k| {
                    let c = scan.projection.as_ref().map_or(k, |p| p[k]);
                    Bytes::constant(w.get(c).copied().unwrap_or(u64::MAX))
                })
                .collect(),
            None => vec![ONE_ROW; n],
        }
    }
    fn expr(e: &Expr, schema: &DFSchema, cols: &[Self]) -> Self {
        super::total::unwrap(e.clone())
            .ok()
            .and_then(|e| bytes(&e, schema, cols).ok())
            .unwrap_or(ONE_ROW)
    }
    // The unit bounding's totals and samples copy input values.
    fn aggregated(_: &Expr, _: &DataType, largest: Self) -> Self {
        largest
    }
    fn unnested(_: &DataType, largest: Self) -> Self {
        largest
    }
}

/// The bytes one row's value of `e` (over `schema`, whose columns take `cols`: see
/// [`column_bytes`]; a column missing there one row) may take. Fixed-width types take their
/// width; a literal its length; a function its [`Size`].
pub fn bytes(e: &Expr, schema: &DFSchema, cols: &[Bytes]) -> Result<Bytes, String> {
    let t = e
        .get_type(schema)
        .map_err(|err| format!("an expression whose type is unknown ({err})"))?;
    if let Some(w) = fixed_width(&t) {
        return Ok(Bytes::constant(w));
    }
    let sum = |xs: &mut dyn Iterator<Item = &Expr>| -> Result<Bytes, String> {
        let mut b = Bytes::default();
        for x in xs {
            b = b.plus(bytes(x, schema, cols)?);
        }
        Ok(b)
    };
    Ok(match e {
        Expr::Column(c) => schema
            .index_of_column(c)
            .ok()
            .and_then(|i| cols.get(i).copied())
            .unwrap_or(ONE_ROW),
        Expr::Literal(v, _) => Bytes::constant(literal_len(v) as u64),
        Expr::Alias(a) => bytes(&a.expr, schema, cols)?,
        Expr::Cast(c) => cast_bytes(&c.expr, &t, schema, cols)?,
        Expr::TryCast(c) => cast_bytes(&c.expr, &t, schema, cols)?,
        // A constant: not copied per row (the total wrapper keeps it a scalar), and only a
        // fixed-width value or a released model may stand here (check_expr).
        Expr::ScalarSubquery(_) => Bytes::default(),
        Expr::Case(c) => sum(&mut c
            .when_then_expr
            .iter()
            .map(|(_, t)| t.as_ref())
            .chain(c.else_expr.as_deref()))?,
        Expr::BinaryExpr(b) => bytes(&b.left, schema, cols)?.plus(bytes(&b.right, schema, cols)?),
        Expr::ScalarFunction(f) => {
            let Some(spec) = function(f.func.name()) else {
                return Err(format!("the function {}()", f.func.name()));
            };
            let first = || match f.args.first() {
                Some(a) => bytes(a, schema, cols),
                None => Ok(Bytes::default()),
            };
            match spec.size {
                // One probability per class, of a network of at most MAX_CLASSES classes.
                Fixed if spec.name == "mlp_predict_proba" => Bytes::constant(
                    8 * u64::from(dpfusion_udfs::optim::mlp::MAX_CLASSES) + FIXED_AS_TEXT,
                ),
                // A short text of a fixed length bound (chr: one character).
                Fixed => Bytes::constant(FIXED_AS_TEXT),
                // arrow_cast(x, 'type'): the size of a cast of x.
                Sum if spec.name == "arrow_cast" => match f.args.first() {
                    Some(a) => cast_bytes(a, &t, schema, cols)?,
                    None => Bytes::default(),
                },
                Sum => sum(&mut f.args.iter())?,
                First => first()?,
                Times(k) => first()?.times(k),
                Separated => {
                    let n = f.args.len().saturating_sub(2) as u64;
                    let sep = first()?.times(n);
                    sep.plus(sum(&mut f.args.iter().skip(1))?)
                }
            }
        }
        other => {
            let mut b = Bytes::default();
            let _ = other.apply_children(|c| {
                match bytes(c, schema, cols) {
                    Ok(x) => b = b.plus(x),
                    Err(_) => b = b.plus(Bytes::constant(u64::MAX)),
                }
                Ok(TreeNodeRecursion::Continue)
            });
            b
        }
    })
}

/// The bytes of `inner` cast to `to`: a fixed-width scalar's text at most its type's longest
/// ([`fixed_text_bytes`]); a list cast keeps its items, each item at most the target's width
/// more.
fn cast_bytes(
    inner: &Expr,
    to: &DataType,
    schema: &DFSchema,
    cols: &[Bytes],
) -> Result<Bytes, String> {
    let from = inner
        .get_type(schema)
        .map_err(|err| format!("an expression whose type is unknown ({err})"))?;
    if let Some(w) = fixed_width(to) {
        return Ok(Bytes::constant(w));
    }
    if is_string(to) && fixed_scalar(&from) {
        return Ok(Bytes::constant(fixed_text_bytes(&from)));
    }
    let b = bytes(inner, schema, cols)?;
    Ok(match (list_item(to), list_item(&from)) {
        (Some(ti), Some(fi)) => {
            let (tw, fw) = (fixed_width(ti).unwrap_or(1), fixed_width(fi).unwrap_or(1));
            b.times(tw.div_ceil(fw.max(1)).max(1))
        }
        _ => b,
    })
}

/// The bytes counted for a function of size [`Size::Fixed`] whose result is not of a fixed width:
/// `chr`'s one character (at most 4 bytes) with room, and beside `mlp_predict_proba`'s
/// probabilities. A cast's text is counted by its type ([`fixed_text_bytes`]).
const FIXED_AS_TEXT: u64 = 64;

/// The longest text arrow writes for a value of the fixed-width scalar type `t` cast to a string
/// (u64::MAX for a type that is not one), with DataFusion's cast options (durations written out,
/// `DEFAULT_FORMAT_OPTIONS`) or arrow's own (ISO 8601 durations), whichever is longer.
/// Round 49 (review "surface" F3): every type counted 64 bytes, and an interval's text takes 76,
/// `-2147483648 mons -2147483648 days -2562047 hours -47 mins -16.854775808 secs`. The unit test
/// `fixed_text_bytes_bounds_what_arrow_casts_writes` casts each type's extremes.
pub fn fixed_text_bytes(t: &DataType) -> u64 {
    use DataType::*;
    use datafusion::arrow::datatypes::IntervalUnit;
    // The sign, then the digits (at most the precision, and the native integer's), with a point
    // and zeros before them when the scale is at least their number, or zeros after them for a
    // negative scale (arrow-data's `format_decimal_str`).
    let decimal = |precision: u8, scale: i8, native_digits: u8| {
        let digits = u64::from(precision.min(native_digits));
        let scale_digits = u64::from(scale.unsigned_abs());
        1 + match scale {
            ..0 => digits + scale_digits,
            0 => digits,
            1.. => (digits + 1).max(scale_digits + 2),
        }
    };
    match t {
        Null => 0,
        Boolean => 5,
        Int8 => 4,
        Int16 => 6,
        Int32 => 11,
        Int64 | UInt64 => 20,
        UInt8 => 3,
        UInt16 => 5,
        UInt32 => 10,
        // ryu: 17 significant digits, a sign, a point and an exponent (`-2.2250738585072014e-308`);
        // a Float16 through f32's Display, without an exponent (`-0.000000059604645`).
        Float16 | Float32 | Float64 => 24,
        Decimal32(p, s) => decimal(*p, *s, 10),
        Decimal64(p, s) => decimal(*p, *s, 19),
        Decimal128(p, s) => decimal(*p, *s, 39),
        Decimal256(p, s) => decimal(*p, *s, 77),
        // chrono's years, ±262,143 (arrow fails beyond them): `-262143-01-01`, then a time of day
        // with milliseconds (Date64), or down to nanoseconds (`23:59:59.999999999`).
        Date32 => 13,
        Date64 => 26,
        Time32(_) | Time64(_) => 18,
        // `-262143-01-01T00:00:00.000001`; nanoseconds reach only 1677–2262
        // (`2262-04-11T23:47:16.854775807`); with a zone its offset, `+05:45`, in minutes.
        Timestamp(_, None) => 29,
        Timestamp(_, Some(_)) => 35,
        // `-106751 days -23 hours -47 mins -16.854775808 secs` (nanoseconds; milliseconds take
        // 49: `-106751991167 days -7 hours -12 mins -55.807 secs`).
        Duration(_) => 50,
        Interval(IntervalUnit::YearMonth) => 23,
        Interval(IntervalUnit::DayTime) => 49,
        Interval(IntervalUnit::MonthDayNano) => 76,
        _ => u64::MAX,
    }
}

/// Why `e`, an expression over private rows with input `schema`, is not in the typed private
/// fragment (None: it is). Adds to [`check_expr`]: every CAST, TRY_CAST and `arrow_cast` has an
/// allowed target ([`cast_target`]); every function's arguments are of its classes and its
/// literal arguments literals ([`FUNCTIONS`]); the bytes one row's value may take are bounded
/// ([`bytes`] over the input's columns `cols`, [`column_bytes`]; [`LIMITS`]). The final audit of
/// a whole plan calls this on every expression over private rows.
pub fn check_expr_typed(e: &Expr, schema: &DFSchema, cols: &[Bytes]) -> Option<String> {
    if let Some(why) = check_expr(e) {
        return Some(why);
    }
    let mut why = None;
    let _ = e.apply(|x| {
        let bad = typed_node(x, schema);
        if bad.is_some() {
            why = bad;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if why.is_some() {
        return why;
    }
    // Every value the expression computes on the way is bounded, not only its result:
    // `length(upper(upper(…(s))))` returns a number but builds each upper-cased string first.
    let mut largest = Bytes::default();
    let mut failed = None;
    let _ = e.apply(|x| {
        match bytes(x, schema, cols) {
            Ok(b) => {
                largest.row = largest.row.max(b.row);
                largest.constant = largest.constant.max(b.constant);
            }
            Err(why) => {
                failed = Some(why);
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if failed.is_some() {
        return failed;
    }
    let b = largest;
    (b.row > LIMITS.row_copies || b.constant > LIMITS.constant_bytes).then(|| {
        format!(
            "an expression whose value may take {} times a row plus {} bytes per row (at most \
             {} times a row plus {} bytes over private rows: a function whose output size the \
             query chooses, or too many copies of a value)",
            b.row, b.constant, LIMITS.row_copies, LIMITS.constant_bytes
        )
    })
}

// ---- what one node holds at once (round 48) ------------------------------------------------------

/// A column passed on as it is, renamed or not.
fn passed_on(e: &Expr) -> Option<&Column> {
    match e {
        Expr::Column(c) => Some(c),
        Expr::Alias(a) => passed_on(&a.expr),
        _ => None,
    }
}

fn sum_bytes(xs: impl IntoIterator<Item = Bytes>) -> Bytes {
    xs.into_iter().fold(Bytes::default(), Bytes::plus)
}

/// What one column of a batch holds per row beyond the rows of the private tables the plan reads
/// (in the units of [`Bytes`]; [`held`]), and, for a struct (or a list of structs) whose fields
/// are known, what each field holds: the unit bounding keeps copies of its arguments in such
/// structs and unnests them back into columns (units.rs), each field one argument.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Part {
    pub bytes: Bytes,
    pub fields: Vec<(String, Part)>,
}

impl Part {
    fn value(bytes: Bytes) -> Part {
        Part {
            bytes,
            fields: vec![],
        }
    }
}

/// What the columns `parts` hold together: every column counted, also two that share one array
/// (a hash repartition, a filter, a join or an aggregate's group keys copy each column apart).
pub fn held_total(parts: &[Part]) -> Bytes {
    sum_bytes(parts.iter().map(|p| p.bytes))
}

/// `e`, evaluated over `input` (whose columns hold `held_in`; `sizes`: their [`column_bytes`]): a
/// column passed on holds what it held there; a computed value its [`bytes`], a new array.
fn held_of(e: &Expr, input: &LogicalPlan, held_in: &[Part], sizes: &[Bytes]) -> Part {
    let schema = input.schema();
    match passed_on(e).and_then(|c| schema.index_of_column(c).ok()) {
        Some(i) if i < held_in.len() => held_in[i].clone(),
        _ => Part::value(<Bytes as ColumnBound>::expr(e, schema, sizes)),
    }
}

/// The expressions an aggregate evaluates for `e`, one of its aggregate expressions: the call's
/// arguments, then its FILTER and ORDER BY (`e` itself if it is not a call).
fn aggregate_inputs(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::Alias(a) => aggregate_inputs(&a.expr),
        Expr::AggregateFunction(f) => f
            .params
            .args
            .iter()
            .chain(f.params.filter.as_deref())
            .chain(f.params.order_by.iter().map(|s| &s.expr))
            .collect(),
        e => vec![e],
    }
}

/// The result of `e`, an aggregate expression whose inputs ([`aggregate_inputs`]) hold `inputs`:
/// what its inputs hold together; for the unit bounding's calls, whose results keep copies of
/// their arguments in structs, each field's argument, as units.rs lays them out (`kept_fields`:
/// `c0 …` the group keys then the totals, `sample` the sampled rows; `sample_fields`: `pos`,
/// then `c0 …` the sampled columns).
fn aggregate_part(e: &Expr, inputs: &[Part]) -> Part {
    use super::units::{Sample, TopGroups};
    let bytes = sum_bytes(inputs.iter().map(|p| p.bytes));
    let call = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::AggregateFunction(f) = call else {
        return Part::value(bytes);
    };
    let inner = f.func.inner().as_ref() as &dyn std::any::Any;
    let named = |from: &[Part]| -> Vec<(String, Part)> {
        from.iter()
            .enumerate()
            .map(|(j, p)| (format!("c{j}"), p.clone()))
            .collect()
    };
    let args = &inputs[..f.params.args.len().min(inputs.len())];
    let fields = if let Some(top) = inner.downcast_ref::<TopGroups>() {
        // (K, C, hash, g…, t…, s…)
        let l = top.layout;
        match args.get(3..) {
            Some(rest) if rest.len() == l.groups + l.totals + l.sampled => {
                let (kept, sampled) = rest.split_at(l.groups + l.totals);
                let mut fields = named(kept);
                if l.rows {
                    let sample = Part {
                        bytes: sum_bytes(sampled.iter().map(|p| p.bytes)),
                        fields: named(sampled),
                    };
                    fields.push(("sample".to_string(), sample));
                }
                fields
            }
            _ => vec![],
        }
    } else if inner.is::<Sample>() {
        // (C, x…)
        args.get(1..).map(named).unwrap_or_default()
    } else {
        vec![]
    };
    Part { bytes, fields }
}

/// What each column of a batch of `plan`'s output holds per row beyond the rows of the private
/// tables it reads (round 48): a column read from a private table nothing (it is the row); a
/// column of a plan that reads no private table the constant part of its [`column_bytes`] (a
/// settled public side's measured bytes, copied into every row a join makes); a computed value
/// its [`bytes`]; a column passed on by a projection, filter, alias, sort, limit or join what it
/// held below (values computed level after level and passed on are held together); an
/// aggregate's group keys as values and each result what the values it reads hold
/// ([`aggregate_part`]); an unnested item what its list held, an unnested field what that field
/// held (a field not known: its width if fixed, else all its struct held).
pub fn held(plan: &LogicalPlan) -> Vec<Part> {
    let n = plan.schema().fields().len();
    let kept = |h: Vec<Part>| {
        if h.len() == n {
            h
        } else {
            vec![Part::value(held_total(&h)); n]
        }
    };
    // A plan that reads no private table (a join's public side): a public row is no private
    // row's copy.
    if super::any_private_table(plan).is_none() {
        return column_bytes(plan)
            .into_iter()
            .map(|b| Part::value(Bytes::constant(b.constant)))
            .collect();
    }
    match plan {
        LogicalPlan::TableScan(_) => vec![Part::default(); n],
        LogicalPlan::Projection(p) => {
            let (held_in, sizes) = (held(&p.input), column_bytes(&p.input));
            p.expr
                .iter()
                .map(|e| held_of(e, &p.input, &held_in, &sizes))
                .collect()
        }
        LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Distinct(datafusion::logical_expr::Distinct::All(_)) => {
            kept(held(plan.inputs()[0]))
        }
        LogicalPlan::Join(j) => {
            use datafusion::logical_expr::JoinType::*;
            match j.join_type {
                LeftSemi | LeftAnti => kept(held(&j.left)),
                RightSemi | RightAnti => kept(held(&j.right)),
                _ => kept(held(&j.left).into_iter().chain(held(&j.right)).collect()),
            }
        }
        LogicalPlan::Aggregate(a) => {
            let (held_in, sizes) = (held(&a.input), column_bytes(&a.input));
            let of = |e: &Expr| held_of(e, &a.input, &held_in, &sizes);
            let mut out: Vec<Part> = a.group_expr.iter().map(of).collect();
            for e in &a.aggr_expr {
                let inputs: Vec<Part> = aggregate_inputs(e).into_iter().map(of).collect();
                out.push(aggregate_part(e, &inputs));
            }
            kept(out)
        }
        LogicalPlan::Unnest(u) => {
            let held_in = held(&u.input);
            let (in_schema, out_schema) = (u.input.schema(), plan.schema());
            // The next field of each struct column unnested, in order.
            let mut next = vec![0usize; held_in.len()];
            (0..n)
                .map(|i| {
                    let Some(&j) = u.dependency_indices.get(i) else {
                        return Part::value(held_total(&held_in));
                    };
                    let from = held_in.get(j).cloned().unwrap_or_default();
                    let width = fixed_width(out_schema.field(i).data_type());
                    if u.struct_type_columns.contains(&j) {
                        let k = next[j];
                        next[j] += 1;
                        let name = match in_schema.field(j).data_type() {
                            DataType::Struct(fs) => fs.get(k).map(|f| f.name().clone()),
                            _ => None,
                        };
                        let known = name.and_then(|name| {
                            from.fields.iter().find(|(f, _)| *f == name).map(|(_, p)| p)
                        });
                        match (known, width) {
                            (Some(p), _) => p.clone(),
                            (None, Some(w)) => Part::value(Bytes::constant(w)),
                            (None, None) => Part::value(from.bytes),
                        }
                    } else if u.list_type_columns.iter().any(|(c, _)| *c == j) {
                        width.map_or(from, |w| Part::value(Bytes::constant(w)))
                    } else {
                        from
                    }
                })
                .collect()
        }
        other => {
            let all: Vec<Part> = other.inputs().into_iter().flat_map(held).collect();
            vec![Part::value(held_total(&all)); n]
        }
    }
}

/// What one node over private rows holds per row at once, in the units of [`Bytes`] (round 48,
/// review "resources", finding 3): a projection its output ([`held`]: the values it computes and
/// those it passes on); an aggregate its group keys and every value its calls read (arguments,
/// FILTER, ORDER BY); a filter its input and its predicate; a join both its sides and the keys
/// and condition it evaluates. None for a node that evaluates no expression. Every column
/// counts, also two copies of one value (they are copied apart, [`held_total`]). Beside this, a
/// node holds its input's batch (bounded at its own node) and one expression's values on the
/// way (each bounded alone, [`check_expr_typed`]).
pub fn node_bytes(plan: &LogicalPlan) -> Option<Bytes> {
    let computed = |exprs: &mut dyn Iterator<Item = &Expr>, schema: &DFSchema, sizes: &[Bytes]| {
        sum_bytes(
            exprs
                .filter(|e| passed_on(e).is_none())
                .map(|e| <Bytes as ColumnBound>::expr(e, schema, sizes)),
        )
    };
    match plan {
        LogicalPlan::Projection(_) => Some(held_total(&held(plan))),
        LogicalPlan::Aggregate(a) => {
            let (held_in, sizes) = (held(&a.input), column_bytes(&a.input));
            let read = a
                .group_expr
                .iter()
                .chain(a.aggr_expr.iter().flat_map(aggregate_inputs));
            Some(sum_bytes(
                read.map(|e| held_of(e, &a.input, &held_in, &sizes).bytes),
            ))
        }
        LogicalPlan::Filter(f) => Some(held_total(&held(&f.input)).plus(computed(
            &mut std::iter::once(&f.predicate),
            f.input.schema(),
            &column_bytes(&f.input),
        ))),
        LogicalPlan::Join(j) => {
            let (ls, rs) = (column_bytes(&j.left), column_bytes(&j.right));
            let keys = computed(&mut j.on.iter().map(|(l, _)| l), j.left.schema(), &ls).plus(
                computed(&mut j.on.iter().map(|(_, r)| r), j.right.schema(), &rs),
            );
            // The condition sees both sides' columns (also where the output has one side's).
            let both = j.left.schema().join(j.right.schema()).ok();
            let sizes: Vec<Bytes> = ls.iter().chain(&rs).copied().collect();
            let condition = match (&j.filter, &both) {
                (Some(f), Some(schema)) => computed(&mut std::iter::once(f), schema, &sizes),
                (Some(f), None) => computed(&mut std::iter::once(f), &j.schema, &sizes),
                (None, _) => Bytes::default(),
            };
            Some(
                held_total(&held(&j.left))
                    .plus(held_total(&held(&j.right)))
                    .plus(keys)
                    .plus(condition),
            )
        }
        _ => None,
    }
}

/// Why `plan`, a node over private rows that a message calls `what`, holds too much at once
/// ([`node_bytes`] past [`LIMITS`]' node bounds; None: within them).
pub fn check_node_bytes(plan: &LogicalPlan, what: &str) -> Option<String> {
    let b = node_bytes(plan)?;
    (b.row > LIMITS.node_row_copies || b.constant > LIMITS.node_constant_bytes).then(|| {
        format!(
            "{what} holds values of up to {} times a row plus {} bytes per row at once (over \
             private rows at most {} times a row plus {} bytes a step, and {} times a row plus {} \
             bytes a value: the values one step computes and passes on stay in memory together \
             for a whole batch); compute fewer large values in one step (fewer or smaller \
             GROUP BY keys, SELECT expressions or copies of a column), or split the query",
            b.row,
            b.constant,
            LIMITS.node_row_copies,
            LIMITS.node_constant_bytes,
            LIMITS.row_copies,
            LIMITS.constant_bytes
        )
    })
}

fn typed_node(x: &Expr, schema: &DFSchema) -> Option<String> {
    let ty = |e: &Expr| e.get_type(schema).ok();
    match x {
        Expr::Cast(c) => cast_target(&ty(&c.expr)?, c.field.data_type()),
        Expr::TryCast(c) => cast_target(&ty(&c.expr)?, c.field.data_type()),
        Expr::ScalarFunction(f) => {
            let spec = function(f.func.name())?;
            let name = spec.name;
            for i in spec.literal {
                if let Some(a) = f.args.get(*i)
                    && !is_literal(a)
                {
                    return Some(not_a_literal(name, *i));
                }
            }
            for (i, a) in f.args.iter().enumerate() {
                let Some(class) = spec.args.get(i).or(spec.args.last()) else {
                    return Some(format!("{name}() with arguments"));
                };
                let t = ty(a)?;
                if !in_class(*class, &t) {
                    return Some(format!(
                        "argument {} of {name}() of type {t} (over private rows it takes {})",
                        i + 1,
                        class_text(*class)
                    ));
                }
            }
            match name {
                "arrow_cast" => {
                    let from = ty(f.args.first()?)?;
                    let to = ty(x)?;
                    cast_target(&from, &to)
                }
                "btrim" | "ltrim" | "rtrim" | "trim" => trim_set_refusal(name, f.args.get(1)),
                // split_part(s, delimiter, 0) fails on every row.
                "split_part" => match f.args.get(2).and_then(literal_value) {
                    Some(v) if v.is_null() || v == ScalarValue::Int64(Some(0)) => Some(
                        "split_part() with position 0 or NULL (positions count from 1, or from \
                         -1 at the end)"
                            .to_string(),
                    ),
                    _ => None,
                },
                "date_part" | "datepart" | "date_trunc" | "datetrunc" => {
                    match f.args.first().and_then(literal_value) {
                        Some(ScalarValue::Utf8(Some(p)))
                        | Some(ScalarValue::LargeUtf8(Some(p)))
                        | Some(ScalarValue::Utf8View(Some(p))) => {
                            let ok = if name.contains("trunc") {
                                DATE_TRUNC_UNITS.contains(&p.to_lowercase().as_str())
                            } else {
                                DATE_PART_FIELDS.contains(&p.to_lowercase().as_str())
                            };
                            (!ok).then(|| {
                                format!(
                                    "{name}() with '{p}' (over private rows: one of {})",
                                    if name.contains("trunc") {
                                        DATE_TRUNC_UNITS.join(", ")
                                    } else {
                                        DATE_PART_FIELDS.join(", ")
                                    }
                                )
                            })
                        }
                        _ => Some(format!(
                            "{name}() whose first argument is not a string literal"
                        )),
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// How `name` is written in SQL, for a message: `btrim` also as `trim(s, characters)` and
/// `TRIM(BOTH characters FROM s)`, `strpos` as `instr` (this build plans no `POSITION(x IN s)`).
fn spelled(name: &str) -> &'static str {
    match name {
        "btrim" | "trim" => {
            "btrim(s, characters) (also written trim(s, characters) or TRIM(BOTH characters FROM s))"
        }
        "ltrim" => "ltrim(s, characters) (also written TRIM(LEADING characters FROM s))",
        "rtrim" => "rtrim(s, characters) (also written TRIM(TRAILING characters FROM s))",
        "strpos" | "instr" => "strpos(s, substring) (also written instr(s, substring))",
        _ => "",
    }
}

/// Why argument `i` (from 0) of `name`, which must be a literal over private rows, is refused
/// when it is not one: what to write instead, and why (round 49 for the trims and `strpos`).
fn not_a_literal(name: &str, i: usize) -> String {
    match name {
        "btrim" | "ltrim" | "rtrim" | "trim" => format!(
            "{} whose characters to trim are not a literal (over private rows write them in the \
             query, at most {TRIM_SET_CHARS} characters, e.g. {name}(s, ' .,;'): DataFusion \
             compares every character it trims with every character of the set, so a set taken \
             from the row would make a row's work grow with the square of its length)",
            spelled(name)
        ),
        "strpos" | "instr" => format!(
            "{} whose substring is not a literal (over private rows write it in the query, e.g. \
             strpos(s, 'abc'); to test whether a value contains another value of the row, use \
             contains(s, x): DataFusion searches for a substring taken from the row by comparing \
             it at every position, work that grows with the product of the two lengths)",
            spelled(name)
        ),
        _ => format!(
            "argument {} of {name}() is not a literal (over private rows it must be written in \
             the query)",
            i + 1
        ),
    }
}

/// Why the literal set of characters `set` of the trim function `name` is refused over private
/// rows (None: it is not, or there is none: one argument trims spaces): more than
/// [`TRIM_SET_CHARS`] characters, or a literal whose text is not known at planning.
fn trim_set_refusal(name: &str, set: Option<&Expr>) -> Option<String> {
    let chars = match literal_value(set?) {
        Some(ScalarValue::Utf8(t) | ScalarValue::LargeUtf8(t) | ScalarValue::Utf8View(t)) => {
            t.map_or(0, |t| t.chars().count())
        }
        Some(v) if v.is_null() => 0,
        _ => return Some(not_a_literal(name, 1)),
    };
    (chars > TRIM_SET_CHARS).then(|| {
        format!(
            "{} with {chars} characters to trim (at most {TRIM_SET_CHARS} over private rows, \
             repeats counted: DataFusion compares every character it trims with every character \
             of the set; write each character once, or trim fewer)",
            spelled(name)
        )
    })
}

/// The fields `date_part` accepts over private rows (a subset of DataFusion's, each valid for
/// every date and timestamp type).
const DATE_PART_FIELDS: &[&str] = &[
    "year",
    "quarter",
    "month",
    "week",
    "day",
    "hour",
    "minute",
    "second",
    "millisecond",
    "microsecond",
    "dow",
    "doy",
    "isodow",
    "isoyear",
    "epoch",
];

/// The units `date_trunc` accepts.
const DATE_TRUNC_UNITS: &[&str] = &[
    "microsecond",
    "millisecond",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "quarter",
    "year",
];

fn literal_value(e: &Expr) -> Option<ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Alias(a) => literal_value(&a.expr),
        Expr::Cast(c) => literal_value(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => literal_value(&c.expr)?.cast_to(c.field.data_type()).ok(),
        _ => None,
    }
}

fn class_text(c: Class) -> &'static str {
    match c {
        Class::Num => "a number (decimals up to Decimal128)",
        Class::Int => "an integer",
        Class::Str => "a string",
        Class::Time => "a date, time, timestamp, string or number",
        Class::Scalar => "a fixed-width scalar or a string",
        Class::List => "a list of fixed-width scalars",
        Class::Any => "any type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::logical_expr::{cast, col, lit};
    use std::sync::Arc;

    fn schema() -> DFSchema {
        DFSchema::try_from(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("f", DataType::Float64, true),
        ]))
        .unwrap()
    }

    fn call(name: &str, args: Vec<Expr>) -> Expr {
        let ctx = datafusion::prelude::SessionContext::new();
        let udf = datafusion::execution::FunctionRegistry::udf(&ctx, name).unwrap();
        udf.call(args)
    }

    /// What a statement writes is sized before DataFusion's optimizer evaluates it: the types of
    /// `arrow_cast` (nested fixed sizes multiplied), the counts of the functions that size their
    /// output by an argument (nested ones multiplied), the bound at 4 MiB; a column's size is not
    /// written (a byte at least where it is copied a written number of times; the row-level
    /// limits of the private fragment are checked on columns later).
    #[test]
    fn written_sizes_are_bounded_before_planning_evaluates_them() {
        let size = |e: &Expr| written(e, &|_| Written::READ).bytes;
        let cast_to = |t: &str| call("arrow_cast", vec![lit(ScalarValue::Null), lit(t)]);
        assert_eq!(
            size(&cast_to("FixedSizeList(2147483647, Int64)")),
            2_147_483_647 * 8
        );
        assert_eq!(
            size(&cast_to(
                "FixedSizeList(1000, FixedSizeList(1000, Float64))"
            )),
            8_000_000
        );
        assert_eq!(size(&cast_to("FixedSizeBinary(100)")), 100);
        assert_eq!(size(&cast_to("FixedSizeList(1024, Int64)")), 8192);
        let repeat = |x: Expr, n: i64| call("array_repeat", vec![x, lit(n)]);
        let nested = repeat(repeat(lit(1i64), 100_000), 100_000);
        assert!(size(&nested) >= 100_000 * 100_000 * 8);
        assert!(size(&call("repeat", vec![lit("ab"), lit(2_000_000_000i64)])) == 4e9 as u64);
        assert_eq!(
            size(&call("repeat", vec![col("s"), lit(1_000_000_000i64)])),
            1_000_000_000
        );
        // A count read from a column: a row's worth, bounded when the call runs (sized.rs).
        assert_eq!(
            size(&call("repeat", vec![col("s"), col("i")])),
            WRITTEN_ROW_BYTES
        );
        assert_eq!(
            size(&call("range", vec![lit(1i64), lit(3_000_000_001i64)])),
            24_000_000_000
        );
        assert!(size(&call("lpad", vec![lit(""), lit(2_000_000_000i64)])) >= 8e9 as u64);
        assert!(size(&lit("x".repeat(100))) < WRITTEN_VALUE_BYTES);
        // On a plan: refused anywhere in it, subqueries included, naming the expression.
        let plan = |e: Expr| {
            datafusion::logical_expr::LogicalPlanBuilder::empty(true)
                .project(vec![e.alias("v")])
                .unwrap()
                .build()
                .unwrap()
        };
        let why = check_written_sizes(&plan(cast_to("FixedSizeList(2147483647, Int64)")))
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("writes up to 17179869176 bytes for a value"),
            "{why}"
        );
        assert!(why.contains("FixedSizeList(2147483647, Int64)"), "{why}");
        check_written_sizes(&plan(cast_to("FixedSizeList(1024, Int64)"))).unwrap();
        check_written_sizes(&plan(repeat(lit(1i64), 1000))).unwrap();
        let sub = datafusion::logical_expr::LogicalPlanBuilder::empty(true)
            .filter(Expr::Exists(datafusion::logical_expr::expr::Exists::new(
                datafusion::logical_expr::Subquery {
                    subquery: Arc::new(plan(nested)),
                    outer_ref_columns: vec![],
                    spans: Default::default(),
                },
                false,
            )))
            .unwrap()
            .build()
            .unwrap();
        assert!(check_written_sizes(&sub).is_err());
    }

    /// A model's feature list holds numbers as written: a string (column or literal) or NULL item
    /// is refused on the plan before type coercion, naming the item (coercion would make
    /// `[x, s]` a list of numbers by casting `s`, and the model would accept it; a boolean beside
    /// numbers DataFusion's planner already refuses, "Failed to unify"). An
    /// explicit numeric cast, computed numbers and a list defined in a subquery are checked the
    /// same way; list-typed columns are left to the model's own type check.
    #[tokio::test]
    async fn feature_lists_hold_numbers_as_written() {
        let ctx = datafusion::prelude::SessionContext::new();
        for u in dpfusion_udfs::aggregates::all_udafs() {
            ctx.register_udaf(u);
        }
        let batch = datafusion::arrow::array::RecordBatch::new_empty(Arc::new(Schema::new(vec![
            Field::new("y", DataType::Float64, true),
            Field::new("x", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Boolean, true),
        ])));
        ctx.register_batch("t", batch).unwrap();
        let check = |sql: &'static str| {
            let state = ctx.state();
            async move {
                let plan = state.create_logical_plan(sql).await.unwrap();
                check_feature_lists(&plan).map_err(|e| e.to_string())
            }
        };
        for (sql, item) in [
            (
                "SELECT dp_linreg_gd(y, [x, s], 1.0) FROM t",
                "item 2 of the list, `s`, is Utf8",
            ),
            (
                "SELECT dp_linreg_gd(y, make_array(x, 'a'), 1.0) FROM t",
                "`Utf8(\"a\")`",
            ),
            (
                "SELECT dp_linreg_gd(y, make_array(s, x / 2), 1.0) FROM t",
                "item 1",
            ),
            ("SELECT dp_logreg_agd(y, [x, NULL], 1.0) FROM t", "is Null"),
            (
                "SELECT dp_mlp_sgd(y, f, 1.0) FROM (SELECT y, [x, s] AS f FROM t) AS q",
                "`s`, is Utf8",
            ),
            (
                "SELECT m FROM (SELECT dp_linreg_sgd(y, [x, s], 1.0) AS m FROM t)",
                "dp_linreg_sgd",
            ),
        ] {
            let e = check(sql).await.unwrap_err();
            assert!(
                e.contains("must be numbers as written") && e.contains(item),
                "{sql}: {e}"
            );
            assert!(e.contains("CAST("), "{e}");
        }
        for sql in [
            "SELECT dp_linreg_gd(y, [x, CAST(s AS DOUBLE)], 1.0) FROM t",
            "SELECT dp_linreg_gd(y, [x / 2 - 1, y * 3, 0.5], 1.0) FROM t",
            "SELECT dp_linreg_gd(y, f, 1.0) FROM (SELECT y, [x, y] AS f FROM t)",
            // Not a model's features: a string list elsewhere is not this check's business.
            "SELECT dp_count(y, 1.0) FROM t WHERE array_length(make_array(s, 'b')) = 2",
        ] {
            check(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    /// Round 51 (review "newuser"): `*` among a DP call's arguments is refused on the plan as
    /// written, in the function's own words, not as "the expression kind Wildcard".
    #[tokio::test]
    async fn a_wildcard_in_a_dp_call_is_refused_in_the_functions_words() {
        let ctx = datafusion::prelude::SessionContext::new();
        for u in dpfusion_udfs::aggregates::all_udafs() {
            ctx.register_udaf(u);
        }
        let batch = datafusion::arrow::array::RecordBatch::new_empty(Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
        ])));
        ctx.register_batch("t", batch).unwrap();
        for (sql, says) in [
            (
                "SELECT dp_count(*, 1.0) FROM t",
                "dp_count counts the non-NULL values of a column, and `*` is no column: write \
                 dp_count(col, epsilon) (any NOT NULL column counts every row). Its arguments: \
                 dp_count(value, epsilon[, delta][, mechanism]).",
            ),
            (
                "SELECT dp_count_ci(t.*, epsilon => 1.0) AS n FROM t",
                "dp_count_ci counts the non-NULL values",
            ),
            (
                "SELECT dp_sum(*, 0, 1, 1.0) FROM t GROUP BY x",
                "`*` is no argument of dp_sum (nor of any DP function): write dp_sum(value, \
                 lower, upper, epsilon",
            ),
        ] {
            let plan = ctx.state().create_logical_plan(sql).await.unwrap();
            let e = check_feature_lists(&plan).unwrap_err().to_string();
            assert!(e.contains(says), "{sql}: {e}");
            assert!(!e.contains("Wildcard"), "{e}");
        }
        let state = ctx.state();
        let plan = state.create_logical_plan("SELECT dp_count(x, 1.0) FROM t");
        check_feature_lists(&plan.await.unwrap()).unwrap();
    }

    /// Issue 26, class 2: casts and functions whose per-row size the query chooses.
    #[test]
    fn the_typed_fragment_bounds_casts_and_bytes_per_row() {
        let df = schema();
        let refused = |e: Expr| check_expr_typed(&e, &df, &[]).expect("refused");
        let ok = |e: Expr| assert_eq!(check_expr_typed(&e, &df, &[]), None);
        let huge = "FixedSizeList(2147483647, Decimal256(76,0))";
        assert!(refused(call("arrow_cast", vec![col("f"), lit(huge)])).contains("a cast from"));
        assert!(
            refused(call(
                "arrow_cast",
                vec![col("s"), lit("FixedSizeBinary(2147483647)")]
            ))
            .contains("a cast from")
        );
        assert!(refused(cast(col("f"), DataType::Decimal256(76, 0))).contains("Decimal256"));
        ok(call("arrow_cast", vec![col("s"), lit("Int64")]));
        ok(cast(col("s"), DataType::Int32));
        ok(cast(col("i"), DataType::Utf8));
        ok(cast(col("f"), DataType::Decimal128(38, 2)));
        // Case mapping may triple a row: three levels are 27 rows, four 81 (over 32).
        let upper = |e: Expr| call("upper", vec![e]);
        ok(upper(upper(upper(col("s")))));
        assert!(refused(upper(upper(upper(upper(col("s")))))).contains("times a row"));
        // 100 literals of 1000 bytes: each is allowed, 100 KB per row is not.
        let wide = call("make_array", vec![lit("x".repeat(1000)); 100]);
        assert!(refused(wide).contains("bytes per row"));
        // Literal arguments.
        assert!(
            refused(call(
                "date_trunc",
                vec![
                    lit("fortnight"),
                    cast(
                        col("i"),
                        DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Second, None)
                    )
                ]
            ))
            .contains("fortnight")
        );
        assert!(
            refused(call("split_part", vec![col("s"), lit(","), lit(0i64)])).contains("position 0")
        );
        ok(call("split_part", vec![col("s"), lit(","), lit(2i64)]));
        // Argument classes: a string function over a number is refused.
        assert!(refused(call("sqrt", vec![col("s")])).contains("argument 1 of sqrt()"));
        // Every entry's size rule is one of the table's, and no function is listed twice.
        let mut names: Vec<_> = FUNCTIONS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FUNCTIONS.len());
    }

    /// Round 44: the bound holds for every value computed on the way (inside a function that
    /// returns a number), and a column a projection computed takes that projection's bound.
    #[test]
    fn sizes_compose_through_projections_and_inner_values() {
        use datafusion::logical_expr::{binary_expr, table_scan};
        let df = schema();
        let upper = |e: Expr| call("upper", vec![e]);
        let length = |e: Expr| call("length", vec![e]);
        assert_eq!(
            check_expr_typed(&length(upper(upper(upper(col("s"))))), &df, &[]),
            None
        );
        let inner = length(upper(upper(upper(upper(col("s"))))));
        assert!(
            check_expr_typed(&inner, &df, &[])
                .expect("refused")
                .contains("81 times a row")
        );
        // s || s, level after level: 2, 4, 8, … rows, each level's column its input's twice.
        let twice = || binary_expr(col("s"), Operator::StringConcat, col("s")).alias("s");
        let mut plan = table_scan(Some("t"), df.as_arrow(), None).expect("scan");
        for level in 1..=6u32 {
            plan = plan.project(vec![twice(), col("i")]).expect("project");
            let built = plan.clone().build().expect("plan");
            let cols = column_bytes(&built);
            assert_eq!(cols[0].row, 1 << level, "level {level}");
            assert_eq!(
                cols[1],
                Bytes::constant(8),
                "a fixed-width column keeps its width"
            );
            let over = check_expr_typed(&twice(), built.schema(), &cols);
            assert_eq!(
                over.is_some(),
                2u64 << level > LIMITS.row_copies,
                "level {level}"
            );
        }
        // A filter, an alias and a sort pass sizes on; a scan's variable-width column is one row.
        let built = plan
            .filter(col("i").gt(lit(0i64)))
            .and_then(|p| p.alias("a"))
            .and_then(|p| p.sort(vec![col("i").sort(true, false)]))
            .and_then(|p| p.build())
            .expect("plan");
        assert_eq!(column_bytes(&built)[0].row, 64);
        let scan = table_scan(Some("t"), df.as_arrow(), None)
            .and_then(|p| p.build())
            .expect("scan");
        assert_eq!(column_bytes(&scan)[1], ONE_ROW);
    }

    /// Round 48 (review "resources", finding 3): what one node holds at once is its values
    /// summed, each of which the per-expression bound admits alone: the reviewer's 300 GROUP BY
    /// keys of 32 copies each (attack B) and 16 of them (attack A) are refused, two are admitted;
    /// bare columns are shared, not copied; values computed level after level count where they
    /// are held together.
    #[test]
    fn a_node_holds_its_values_summed() {
        use datafusion::functions_aggregate::expr_fn::count;
        use datafusion::logical_expr::{LogicalPlanBuilder, binary_expr, table_scan};
        let df = schema();
        // '<tag>' || s || s || … (n copies of s), named k<tag>.
        let value = |tag: usize, n: usize| {
            let mut e = lit(tag.to_string());
            for _ in 0..n {
                e = binary_expr(e, Operator::StringConcat, col("s"));
            }
            e
        };
        let copies = |tag: usize, n: usize| value(tag, n).alias(format!("k{tag}"));
        let scan = || table_scan(Some("t"), df.as_arrow(), None).expect("scan");
        let build = |b: datafusion::common::Result<LogicalPlanBuilder>| {
            b.and_then(|b| b.build()).expect("plan")
        };
        let refused = |p: &LogicalPlan, rows: u64| {
            let why = check_node_bytes(p, "the node").expect("refused");
            assert!(
                why.starts_with(&format!(
                    "the node holds values of up to {rows} times a row"
                )),
                "{why}"
            );
            assert!(why.contains("split the query"), "{why}");
        };
        let admitted = |p: &LogicalPlan| assert_eq!(check_node_bytes(p, "the node"), None);
        let keys: Vec<Expr> = (0..300).map(|i| copies(i, 32)).collect();
        for k in &keys {
            assert_eq!(check_expr_typed(k, &df, &[]), None, "{k}");
        }
        // Computed in a projection below the aggregate, or by the aggregate itself.
        let projected = build(scan().project(keys.clone()));
        refused(&projected, 9600);
        let grouped = build(scan().aggregate(keys[..16].to_vec(), vec![count(col("i"))]));
        refused(&grouped, 512);
        // The aggregate over the projection groups by columns passed on: what it holds below.
        let over = build(
            LogicalPlanBuilder::from(projected.clone())
                .aggregate((0..300).map(|i| col(format!("k{i}"))), vec![count(lit(1))]),
        );
        refused(&over, 9600);
        admitted(&build(scan().project(keys[..2].to_vec())));
        // A call's arguments and FILTER count with the keys.
        let args = build(scan().aggregate(
            keys[..1].to_vec(),
            vec![count(value(1, 32)), count(value(2, 1))],
        ));
        refused(&args, 65);
        // Bare columns (renamed or not) are shared with the scan: nothing held.
        let wide = datafusion::arrow::datatypes::Schema::new(
            (0..40)
                .map(|i| Field::new(format!("c{i}"), DataType::Utf8, true))
                .collect::<Vec<_>>(),
        );
        let bare =
            build(table_scan(Some("w"), &wide, None).and_then(|p| {
                p.project((0..40).map(|i| col(format!("c{i}")).alias(format!("d{i}"))))
            }));
        assert_eq!(node_bytes(&bare), Some(Bytes::default()));
        // Level after level (subqueries the optimizer does not merge): a value computed below
        // and passed on is held beside the new ones; dropped, it is not.
        let one = scan()
            .project(vec![copies(0, 32), col("s"), col("i")])
            .unwrap();
        let two = one
            .project(vec![col("k0"), copies(1, 32), col("s"), col("i")])
            .unwrap();
        admitted(&build(Ok(two.clone())));
        refused(
            &build(
                two.clone()
                    .project(vec![col("k0"), col("k1"), copies(2, 1), col("i")]),
            ),
            65,
        );
        admitted(&build(two.clone().project(vec![col("k1"), copies(2, 32)])));
        // A column passed on twice is two columns (a repartition, a filter or the aggregate's
        // group keys copy each apart): the attack A shape, one key written 16 times and merged
        // by common-subexpression elimination into one value named 16 times.
        refused(
            &build(
                two.clone()
                    .project(vec![col("k0"), col("k0").alias("again"), col("k1")]),
            ),
            96,
        );
        // A filter holds its input and its predicate; a fixed-width result its width.
        let filtered = build(
            two.clone()
                .filter(call("length", vec![copies(3, 1)]).gt(lit(0i64))),
        );
        assert_eq!(
            node_bytes(&filtered),
            Some(Bytes {
                row: 64,
                constant: 1 + 2
            })
        );
        // Fixed-width values sum their widths.
        let fixed = build(
            scan().project((0..100).map(|i| (col("i") + lit(i as i64)).alias(format!("n{i}")))),
        );
        assert_eq!(node_bytes(&fixed), Some(Bytes::constant(800)));
    }

    /// Round 48 (review "resources", finding 3): on public tables too, what one step writes a row
    /// is its values summed, each of which may be within its own bound: three values of 60,000
    /// bytes (`lpad(s, 15000)`: four bytes a character) are refused, two admitted; a value written below and passed on counts
    /// where it is held beside new ones; an aggregate counts what its calls read; a row of
    /// constants is not a relation of many rows.
    #[test]
    fn written_sizes_are_summed_over_a_step() {
        use datafusion::functions_aggregate::expr_fn::count;
        use datafusion::logical_expr::{LogicalPlanBuilder, table_scan};
        let df = schema();
        let big = |name: &str| call("lpad", vec![col("s"), lit(15_000i64)]).alias(name);
        let scan = || table_scan(Some("t"), df.as_arrow(), None).expect("scan");
        let build = |b: datafusion::common::Result<LogicalPlanBuilder>| {
            b.and_then(|b| b.build()).expect("plan")
        };
        let refused = |p: &LogicalPlan, what: &str, bytes: u64| {
            let why = check_written_sizes(p).unwrap_err().to_string();
            assert!(
                why.contains(&format!("{what} writes up to {bytes} bytes a row in all")),
                "{why}"
            );
        };
        check_written_sizes(&build(scan().project(vec![big("a"), big("b")]))).unwrap();
        refused(
            &build(scan().project(vec![big("a"), big("b"), big("c")])),
            "a SELECT list (projection)",
            180_000,
        );
        let two = scan().project(vec![big("a"), big("b"), col("s")]).unwrap();
        refused(
            &build(two.clone().project(vec![col("a"), col("b"), big("c")])),
            "a SELECT list (projection)",
            180_000,
        );
        check_written_sizes(&build(two.project(vec![col("b"), big("c")]))).unwrap();
        refused(
            &build(scan().aggregate(
                vec![big("a")],
                vec![
                    count(call("lpad", vec![col("s"), lit(15_000i64)])).alias("n1"),
                    count(call("lpad", vec![col("s"), lit(15_001i64)])).alias("n2"),
                ],
            )),
            "an aggregate (its GROUP BY keys and its calls' arguments)",
            180_004,
        );
        let constants =
            |n: usize| {
                build(LogicalPlanBuilder::empty(true).project((0..n).map(|i| {
                    call("repeat", vec![lit("x"), lit(60_000i64)]).alias(format!("c{i}"))
                })))
            };
        check_written_sizes(&constants(3)).unwrap();
        // Round 50: the steps of one row, summed over the statement: 16 constants of 4,000,000
        // bytes pass (64,000,000 ≤ 64 MiB), 17 do not, in one SELECT list or in as many
        // subqueries (each one row, none over its own bound).
        let huge =
            |n: usize| {
                build(LogicalPlanBuilder::empty(true).project((0..n).map(|i| {
                    call("repeat", vec![lit("x"), lit(4_000_000i64)]).alias(format!("c{i}"))
                })))
            };
        check_written_sizes(&huge(16)).unwrap();
        let why = check_written_sizes(&huge(17)).unwrap_err().to_string();
        assert!(why.contains("write up to 68000000 bytes in all"), "{why}");
        let exists = (0..17).fold(LogicalPlanBuilder::empty(true), |b, _| {
            b.filter(datafusion::logical_expr::exists(Arc::new(huge(1))))
                .expect("filter")
        });
        let why = check_written_sizes(&build(Ok(exists)))
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("the steps of one row of this statement"),
            "{why}"
        );
        // Every row of a VALUES list too (review "fixes3" F2): 1,100 rows of 64,000 bytes are
        // 70,400,000 bytes, each row within its own bound.
        let rows = |n: usize| {
            build(LogicalPlanBuilder::values(
                (0..n)
                    .map(|_| vec![call("repeat", vec![lit("x"), lit(64_000i64)])])
                    .collect(),
            ))
        };
        check_written_sizes(&rows(1_000)).unwrap();
        let why = check_written_sizes(&rows(1_100)).unwrap_err().to_string();
        assert!(why.contains("write up to 70400000 bytes in all"), "{why}");
    }

    #[test]
    fn cast_targets() {
        use DataType::*;
        let fsl = |n| FixedSizeList(Arc::new(Field::new("item", Float64, true)), n);
        let list = List(Arc::new(Field::new("item", Float64, true)));
        assert!(cast_target(&Utf8, &Int64).is_none());
        assert!(cast_target(&Float64, &Utf8).is_none());
        assert!(cast_target(&list, &List(Arc::new(Field::new("item", Int64, true)))).is_none());
        assert!(cast_target(&fsl(3), &fsl(3)).is_none());
        assert!(cast_target(&fsl(3), &fsl(4)).is_some());
        assert!(cast_target(&list, &fsl(1_000_000)).is_some());
        assert!(cast_target(&Float64, &fsl(1)).is_some());
        assert!(cast_target(&Utf8, &Binary).is_some());
        assert!(cast_target(&Int64, &Decimal256(76, 0)).is_some());
        assert!(
            cast_target(&list, &Utf8).is_some(),
            "a list's text is not bounded"
        );
    }

    #[test]
    fn fragment_accepts_row_expressions_and_refuses_the_rest() {
        assert!(check_expr(&(col("a") + lit(1))).is_none());
        assert!(check_expr(&col("a").like(lit("x%"))).is_none());
        assert!(check_expr(&col("a").like(col("b"))).is_some());
        assert!(check_expr(&lit("x".repeat(2000))).is_some());
        let many = (0..40).fold(col("a"), |e, _| e + col("a"));
        assert!(check_expr(&many).is_some());
        assert!(FUNCTIONS.iter().map(|f| f.name).all(|f| {
            ![
                "repeat",
                "lpad",
                "rpad",
                "replace",
                "range",
                "array_repeat",
                "levenshtein",
            ]
            .contains(&f)
        }));
    }

    /// Round 46: a LIKE pattern stands for the regular expression arrow builds for it (its test
    /// cases, arrow-string 59.3.2 `predicate.rs`).
    #[test]
    fn like_patterns_translate_as_arrow_translates_them() {
        for (like, regex) in [
            (r"%foobar%", r"foobar"),
            (r"foo%bar", r"^foo.*bar$"),
            (r"foo_bar", r"^foo.bar$"),
            (r"\%\_", r"^%_$"),
            (r"\a", r"^a$"),
            (r"\\%", r"^\\"),
            (r"\\a", r"^\\a$"),
            (r".", r"^\.$"),
            (r"$", r"^\$$"),
            (r"\\", r"^\\$"),
            (r"", r"^$"),
            (r"a\", r"^a\\$"),
        ] {
            assert_eq!(like_regex(like), regex, "{like}");
        }
    }

    /// Round 46: literal patterns over private rows are compiled at planning within bounds: the
    /// NFA's size (`\w{20}`, 4,000 LIKE wildcards), the DFA's size (`a[ab]{3000}[^ab]`, the
    /// review's attack, and `\w{7}`), Unicode word boundaries (which a DFA cannot match) and,
    /// without regard to case, the characters folded (`(?i)[\s\S]`); the refusal says what, why
    /// and what to do. Everyday patterns pass.
    #[test]
    fn literal_patterns_are_bounded_when_they_compile() {
        use PatternKind::{Like, Regex};
        let refused = |kind, ci, p: &str| match compile_pattern(kind, ci, p) {
            Ok(_) => panic!("{p} was not refused"),
            Err(why) => why,
        };
        let ok = |kind, ci, p: &str| {
            compile_pattern(kind, ci, p)
                .unwrap_or_else(|e| panic!("{p}: {e}"))
                .map_or(0, |d| d.memory_usage())
        };
        for p in [
            r"^\w+@\w+$",
            r"\d{4}-\d{2}-\d{2}",
            r"^[A-Z][a-z]+$",
            r"(?-u:\b)foo(?-u:\b)",
            r"^\S+@\S+\.[a-z]{2,}$",
            r"(a|b|c){30}",
            r"\pL+",
            "",
        ] {
            ok(Regex, false, p);
            ok(Regex, true, p);
        }
        // The brief's everyday patterns, and their DFAs' sizes (doc of PATTERN_DFA_BYTES).
        let kib = |n: usize| n.div_ceil(1024);
        assert_eq!(kib(ok(Regex, false, r"\w{5}")), 793);
        assert_eq!(kib(ok(Regex, true, r"\w{6}")), 951);
        assert_eq!(kib(ok(Regex, false, r"^\w+@\w+\.\w+$")), 478);
        assert_eq!(kib(ok(Regex, false, r"\d{4}-\d{2}-\d{2}")), 104);
        assert!(ok(Regex, false, r"(?i)^[a-z]+$") < 1024);
        assert!(ok(Like, false, "%foo%") < 2048);
        assert!(ok(Like, true, "a_b%") < 2048);
        assert_eq!(kib(ok(Like, false, "%a_________b%")), 640);
        assert_eq!(kib(ok(Regex, false, r"a[ab]{11}[^ab]")), 514);
        ok(Regex, true, r"[\w]");
        ok(Regex, false, r"[\s\S]");
        ok(Regex, false, r"(?i)\P{L}");
        ok(Regex, false, r"[A-Za-z0-9_]{50}");
        ok(Regex, false, r"(?-u:\w){50}");
        ok(Like, true, &"_%".repeat(10));
        ok(Like, false, &"a".repeat(1000));
        let big = refused(Regex, false, r"\w{20}");
        assert!(
            big.contains(&format!("compiles to more than {PATTERN_BYTES} bytes"))
                && big.contains("[A-Za-z0-9_]"),
            "{big}"
        );
        assert!(refused(Regex, true, r"\w{150}").contains("compiles to more than"));
        let like = refused(Like, true, &"_%".repeat(2000));
        assert!(
            like.starts_with("the LIKE pattern '_%_%") && like.contains("wildcards"),
            "{like}"
        );
        // The DFA's bound: the review's pattern, one repetition past the largest of its family,
        // Unicode \w past six, LIKE past nine _ after a %.
        for (kind, p) in [
            (Regex, r"a[ab]{3000}[^ab]"),
            (Regex, r"a[ab]{12}[^ab]"),
            (Regex, r"\w{7}"),
            (Like, "%a__________b%"),
        ] {
            let why = refused(kind, false, p);
            assert!(
                why.contains(&format!(
                    "automaton takes more than {PATTERN_DFA_BYTES} bytes"
                )) && why.contains("one step per byte")
                    && why.contains("(?-u:\\w)"),
                "{why}"
            );
        }
        // Unicode word boundaries: refused, with the ASCII one suggested.
        for p in [r"\bfoo\b", r"\B", r"\<a", r"a\b{end}"] {
            let why = refused(Regex, false, p);
            assert!(
                why.contains("Unicode word boundary") && why.contains("(?-u:\\b)"),
                "{why}"
            );
        }
        for p in [
            r"[\s\S]",
            r"\p{Any}",
            r"[\x00-\x{10FFFF}]",
            r"[a[b[\pL\pN]]]",
        ] {
            let why = refused(Regex, true, p);
            assert!(
                why.contains("without regard to case") && why.contains("match case"),
                "{why}"
            );
            assert!(refused(Regex, false, &format!("(?i){p}")).contains("without regard"));
            assert!(refused(Regex, false, &format!("a(?i:{p})")).contains("without regard"));
        }
        assert!(refused(Regex, false, "(a").contains("not a valid regular expression"));
        // What is folded: classes as written, before negation; Perl classes outside brackets not.
        let folded = |p: &str| {
            folded_chars(
                p,
                &regex_syntax::ast::parse::Parser::new().parse(p).unwrap(),
            )
        };
        assert_eq!(folded(r"[\s\S]"), 0, "case-sensitive");
        assert_eq!(folded(r"(?i)[\s\S]"), 0x110000);
        assert_eq!(folded(r"(?i)[a-z]"), 26);
        assert_eq!(folded(r"(?i)[^a-z]"), 26);
        assert_eq!(folded(r"(?i)\w+"), 0);
        assert_eq!(folded(r"(?i)\P{L}"), folded(r"(?i)\pL"));
        assert!(folded(r"(?i)\pL") < PATTERN_FOLDED_CHARS / 3);
    }

    /// Every function the fragment admits by name can be planned from SQL in this build (a
    /// type error is fine: the name resolved). `substr` and `substring` could not (round 46: SQL
    /// parses both as SUBSTRING, and DataFusion is built without `unicode_expressions`), so they
    /// left the list.
    #[tokio::test]
    async fn every_function_of_the_fragment_plans_from_sql() {
        let ctx = datafusion::prelude::SessionContext::new();
        dpfusion_udfs::register_all(&ctx);
        let unplanned = |e: &str| {
            e.contains("Invalid function")
                || e.contains("could not be planned")
                || e.contains("not implemented")
                || e.contains("not supported")
        };
        for f in FUNCTIONS {
            let n = match f.args.len() {
                0 => 0,
                n if matches!(f.name, "greatest" | "least" | "coalesce" | "concat") => n + 1,
                n => n,
            };
            let args: Vec<String> = (0..n)
                .map(|i| {
                    let class = f.args.get(i).or(f.args.last()).copied().unwrap_or(Any);
                    match (f.name, i, class) {
                        ("date_part" | "datepart", 0, _) => "'year'".to_string(),
                        ("date_trunc" | "datetrunc", 0, _) => "'day'".to_string(),
                        ("date_bin", 0, _) => "INTERVAL '1 day'".to_string(),
                        ("arrow_cast", 1, _) => "'Int64'".to_string(),
                        ("get_field", 0, _) => "named_struct('a', 1)".to_string(),
                        ("get_field", 1, _) => "'a'".to_string(),
                        ("named_struct", _, _) => "'a', 1".to_string(),
                        (_, _, Num | Int | Scalar) => "1".to_string(),
                        (_, _, Str) => "'a'".to_string(),
                        (_, _, Time) => "TIMESTAMP '2020-01-01 00:00:00'".to_string(),
                        (_, _, List) => "[1.0, 2.0]".to_string(),
                        (_, _, Any) => {
                            "named_struct('coefficients', [1.0], 'intercept', 0.0)".to_string()
                        }
                    }
                })
                .collect();
            let sql = format!("SELECT {}({})", f.name, args.join(", "));
            if let Err(e) = ctx.state().create_logical_plan(&sql).await {
                let e = e.to_string();
                assert!(!unplanned(&e), "{sql}: {e}");
            }
        }
        // The check sees what removed substr and substring.
        let e = ctx
            .state()
            .create_logical_plan("SELECT substr('abc', 1, 2)")
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(e.is_ok() || unplanned(&e.clone().unwrap_err()), "{e:?}");
    }

    /// Round 49 (review "surface" F3): the text a cast writes for a fixed-width scalar is at most
    /// what [`fixed_text_bytes`] counts for its type, checked against what arrow's cast writes for
    /// each type's extremes (and every Float16, a sweep of the other floats' exponents), with
    /// DataFusion's cast options and arrow's own; a value arrow cannot write (a date beyond
    /// chrono's years) fails, and the total wrapper makes it NULL.
    #[test]
    fn fixed_text_bytes_bounds_what_arrow_casts_writes() {
        use datafusion::arrow::array::{
            Array, ArrayData, ArrayRef, BooleanArray, Date32Array, Date64Array, Decimal32Array,
            Decimal64Array, Decimal128Array, DurationMicrosecondArray, DurationMillisecondArray,
            DurationNanosecondArray, DurationSecondArray, Float32Array, Float64Array, Int8Array,
            Int16Array, Int32Array, Int64Array, IntervalDayTimeArray, IntervalMonthDayNanoArray,
            IntervalYearMonthArray, NullArray, StringArray, Time32MillisecondArray,
            Time32SecondArray, Time64MicrosecondArray, Time64NanosecondArray,
            TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
            TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array, make_array,
        };
        use datafusion::arrow::buffer::Buffer;
        use datafusion::arrow::compute::{CastOptions, cast_with_options};
        use datafusion::arrow::datatypes::{IntervalDayTime, IntervalMonthDayNano};
        use datafusion::common::format::DEFAULT_CAST_OPTIONS;

        // The longest text of any value of `a` cast to Utf8, each value alone (a value arrow
        // cannot write fails alone, or panics: chrono, for a time at its ends in a zone west of
        // UTC), with either options.
        let longest = |a: &ArrayRef| -> usize {
            let mut most = 0;
            for options in [DEFAULT_CAST_OPTIONS, CastOptions::default()] {
                for i in 0..a.len() {
                    let cast = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        cast_with_options(&a.slice(i, 1), &DataType::Utf8, &options)
                    }));
                    let Ok(Ok(text)) = cast else {
                        continue;
                    };
                    let text = text.as_any().downcast_ref::<StringArray>().unwrap();
                    if text.is_valid(0) {
                        most = most.max(text.value(0).len());
                    }
                }
            }
            most
        };
        let i64s = [i64::MIN, i64::MIN + 1, -i64::MAX / 1000, -1, 0, 1, i64::MAX];
        let i32s = [i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX];
        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(NullArray::new(1)),
            Arc::new(BooleanArray::from(vec![true, false])),
            Arc::new(Int8Array::from(vec![i8::MIN, -1, i8::MAX])),
            Arc::new(Int16Array::from(vec![i16::MIN, -1, i16::MAX])),
            Arc::new(Int32Array::from(i32s.to_vec())),
            Arc::new(Int64Array::from(i64s.to_vec())),
            Arc::new(UInt8Array::from(vec![0, u8::MAX])),
            Arc::new(UInt16Array::from(vec![0, u16::MAX])),
            Arc::new(UInt32Array::from(vec![0, u32::MAX])),
            Arc::new(UInt64Array::from(vec![0, u64::MAX])),
        ];
        // Every Float16; for f32 and f64, every binary exponent with a few mantissas, both signs.
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        arrays.push(make_array(
            ArrayData::builder(DataType::Float16)
                .len(halves.len())
                .add_buffer(Buffer::from_slice_ref(&halves))
                .build()
                .unwrap(),
        ));
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut f32s = vec![];
        let mut f64s = vec![];
        for sign in [0u64, 1] {
            for e in 0..256u64 {
                for m in [0, 1, (1 << 23) - 1, 0x2A_AAAA] {
                    f32s.push(f32::from_bits((sign << 31 | e << 23 | m) as u32));
                }
                for _ in 0..16 {
                    let m = next() & ((1 << 23) - 1);
                    f32s.push(f32::from_bits((sign << 31 | e << 23 | m) as u32));
                }
            }
            for e in 0..2048u64 {
                for m in [0, 1, (1 << 52) - 1, 0x5_5555_5555_5555] {
                    f64s.push(f64::from_bits(sign << 63 | e << 52 | m));
                }
                for _ in 0..16 {
                    let m = next() & ((1 << 52) - 1);
                    f64s.push(f64::from_bits(sign << 63 | e << 52 | m));
                }
            }
        }
        f64s.extend([
            f64::MIN_POSITIVE,
            -2.2250738585072014e-308,
            1.2345678901234567e-5,
        ]);
        arrays.push(Arc::new(Float32Array::from(f32s)));
        arrays.push(Arc::new(Float64Array::from(f64s)));
        // Decimals at full precision, every kind of scale.
        for (p, s) in [(9u8, 0i8), (9, 4), (9, 9), (9, -5)] {
            let m = 10i32.pow(u32::from(p)) - 1;
            let a = Decimal32Array::from(vec![-m, -1, 0, 1, m]);
            arrays.push(Arc::new(a.with_precision_and_scale(p, s).unwrap()));
        }
        for (p, s) in [(18u8, 0i8), (18, 9), (18, 18), (18, -10)] {
            let m = 10i64.pow(u32::from(p)) - 1;
            let a = Decimal64Array::from(vec![-m, -1, 0, 1, m]);
            arrays.push(Arc::new(a.with_precision_and_scale(p, s).unwrap()));
        }
        for (p, s) in [
            (38u8, 0i8),
            (38, 10),
            (38, 37),
            (38, 38),
            (5, 5),
            (38, -38),
            (1, -128),
        ] {
            let m = 10i128.pow(u32::from(p)) - 1;
            let a = Decimal128Array::from(vec![-m, -(m / 10) - 1, -1, 0, 1, m]);
            arrays.push(Arc::new(a.with_precision_and_scale(p, s).unwrap()));
        }
        // Dates and times at chrono's ends (and past them), with the longest fractions.
        let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
        let day = |d: chrono::NaiveDate| (d - epoch).num_days();
        let (lo, hi) = (day(chrono::NaiveDate::MIN), day(chrono::NaiveDate::MAX));
        let days: Vec<i32> = [lo - 1, lo, -1, 0, hi, hi + 1]
            .iter()
            .map(|d| *d as i32)
            .chain(i32s)
            .collect();
        arrays.push(Arc::new(Date32Array::from(days)));
        let ms = 86_400_000;
        let ends = |per_day: i64| -> Vec<i64> {
            // Nanoseconds reach past neither end: i64's.
            let (lo, hi) = (lo.saturating_mul(per_day), (hi + 1).saturating_mul(per_day));
            [
                lo.saturating_sub(1),
                lo,
                lo.saturating_add(1),
                hi.saturating_sub(1),
                hi,
                -1,
                1,
            ]
            .into_iter()
            .chain(i64s)
            .collect()
        };
        arrays.push(Arc::new(Date64Array::from(ends(ms))));
        arrays.push(Arc::new(Time32SecondArray::from(vec![0, 1, 86_399])));
        arrays.push(Arc::new(Time32MillisecondArray::from(vec![1, 86_399_999])));
        arrays.push(Arc::new(Time64MicrosecondArray::from(vec![
            1,
            86_399_999_999,
        ])));
        arrays.push(Arc::new(Time64NanosecondArray::from(vec![
            1,
            86_399_999_999_999,
        ])));
        for zone in [
            None,
            Some("+05:45"),
            Some("-23:59"),
            Some("UTC"),
            Some("Asia/Kolkata"),
            Some("America/St_Johns"),
            Some("Pacific/Kiritimati"),
        ] {
            arrays.push(Arc::new(
                TimestampSecondArray::from(ends(86_400)).with_timezone_opt(zone),
            ));
            arrays.push(Arc::new(
                TimestampMillisecondArray::from(ends(ms)).with_timezone_opt(zone),
            ));
            arrays.push(Arc::new(
                TimestampMicrosecondArray::from(ends(ms * 1000)).with_timezone_opt(zone),
            ));
            arrays.push(Arc::new(
                TimestampNanosecondArray::from(ends(ms * 1_000_000)).with_timezone_opt(zone),
            ));
        }
        let mut durations = i64s.to_vec();
        durations.extend([i64::MAX / 1000, -(i64::MAX / 1000), -i64::MAX]);
        arrays.push(Arc::new(DurationSecondArray::from(durations.clone())));
        arrays.push(Arc::new(DurationMillisecondArray::from(durations.clone())));
        arrays.push(Arc::new(DurationMicrosecondArray::from(durations.clone())));
        arrays.push(Arc::new(DurationNanosecondArray::from(durations.clone())));
        // Intervals: every combination of the extremes of their parts.
        arrays.push(Arc::new(IntervalYearMonthArray::from(i32s.to_vec())));
        let mut day_times = vec![];
        for d in i32s {
            for m in i32s {
                day_times.push(IntervalDayTime::new(d, m));
            }
        }
        arrays.push(Arc::new(IntervalDayTimeArray::from(day_times)));
        let mut month_day_nanos = vec![];
        for m in i32s {
            for d in i32s {
                for n in durations.iter().chain(&[-9_223_372_036_854_775_807]) {
                    month_day_nanos.push(IntervalMonthDayNano::new(m, d, *n));
                }
            }
        }
        arrays.push(Arc::new(IntervalMonthDayNanoArray::from(month_day_nanos)));

        let mut report = vec![];
        // Quiet while chrono panics (each test runs in a process of its own under nextest).
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        for a in &arrays {
            let t = a.data_type();
            assert!(fixed_scalar(t) || matches!(t, DataType::Float16), "{t}");
            let (most, bound) = (longest(a), fixed_text_bytes(t));
            report.push(format!("{t}: {most} of {bound}"));
            assert!(
                most as u64 <= bound,
                "{t}: arrow wrote {most} bytes, counted {bound}"
            );
        }
        std::panic::set_hook(hook);
        println!("{}", report.join("\n"));
        // The review's value: 76 bytes, and a cast of an interval to text counts them.
        let review = IntervalMonthDayNanoArray::from(vec![IntervalMonthDayNano::new(
            i32::MIN,
            i32::MIN,
            -9_223_372_036_854_775_807,
        )]);
        assert_eq!(longest(&(Arc::new(review) as ArrayRef)), 76);
        let interval = lit(ScalarValue::IntervalMonthDayNano(Some(
            IntervalMonthDayNano::new(1, 2, 3),
        )));
        assert_eq!(
            bytes(&cast(interval, DataType::Utf8), &schema(), &[]),
            Ok(Bytes::constant(76))
        );
        assert_eq!(
            bytes(&cast(col("i"), DataType::Utf8), &schema(), &[]),
            Ok(Bytes::constant(20))
        );
        // Not a fixed-width scalar: not bounded.
        assert_eq!(fixed_text_bytes(&DataType::Utf8), u64::MAX);
    }

    /// Round 49 (review "surface" F1): the characters the trims remove and the substring
    /// `strpos` looks for are literals over private rows, a trim's at most TRIM_SET_CHARS
    /// characters; one-argument trims, and literal ones, are admitted.
    #[test]
    fn trim_sets_and_strpos_substrings_are_literals_over_private_rows() {
        let df = schema();
        let refused = |e: Expr| check_expr_typed(&e, &df, &[]).expect("refused");
        let ok = |e: Expr| assert_eq!(check_expr_typed(&e, &df, &[]), None, "{e}");
        let longest = "ab".repeat(TRIM_SET_CHARS / 2);
        for name in ["btrim", "ltrim", "rtrim"] {
            let why = refused(call(name, vec![col("s"), col("s")]));
            assert!(
                why.contains(&format!("{name}(s, characters)"))
                    && why.contains("characters to trim are not a literal")
                    && why.contains(&format!("e.g. {name}(s, ' .,;')"))
                    && why.contains("square"),
                "{why}"
            );
            let concat = call("concat", vec![call("upper", vec![col("s")]), col("s")]);
            assert!(refused(call(name, vec![col("s"), concat])).contains("not a literal"));
            ok(call(name, vec![col("s")]));
            ok(call(name, vec![col("s"), lit(" .,;")]));
            ok(call(name, vec![col("s"), lit(ScalarValue::Utf8(None))]));
            ok(call(name, vec![col("s"), lit(longest.as_str())]));
            // Characters, not bytes: 64 four-byte characters are 64.
            ok(call(name, vec![col("s"), lit("😀".repeat(TRIM_SET_CHARS))]));
            let why = refused(call(name, vec![col("s"), lit(format!("{longest}a"))]));
            assert!(
                why.contains("with 65 characters to trim (at most 64 over private rows"),
                "{why}"
            );
            // The value may be a literal; the set still may not come from the row.
            assert!(refused(call(name, vec![lit("abc"), col("s")])).contains("not a literal"));
        }
        let why = refused(call("strpos", vec![col("s"), col("s")]));
        assert!(
            why.contains("strpos(s, substring) (also written instr(s, substring))")
                && why.contains("contains(s, x)"),
            "{why}"
        );
        ok(call("strpos", vec![col("s"), lit("abc")]));
        ok(call("strpos", vec![lit("abc"), lit("b")]));
        ok(call("contains", vec![col("s"), col("s")]));
    }
}
