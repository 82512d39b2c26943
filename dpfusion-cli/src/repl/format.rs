//! Output formats for query results: an aligned table, CSV or JSON (an array of objects), and
//! [`terminal_safe`], the one escaping of control characters for everything the REPL and the
//! remote client print (cells, messages, receipts, table names).
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::pretty::pretty_format_batches;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// An aligned table with borders (the default on a terminal).
    #[default]
    Table,
    /// RFC 4180 CSV with a header line.
    Csv,
    /// A JSON array of objects, one per row.
    Json,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "table" => Ok(OutputFormat::Table),
            "csv" => Ok(OutputFormat::Csv),
            "json" => Ok(OutputFormat::Json),
            other => Err(format!(
                "unknown output format '{other}': expected table, csv or json"
            )),
        }
    }
}

/// Whether [`terminal_safe`] keeps line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// A table cell: `\n` and `\t` are escaped too (a cell never spans lines or moves columns).
    Cell,
    /// A message or a whole rendered output: `\n` and `\t` are kept, everything else escaped.
    Text,
}

/// `s` with every character that a terminal could act on written as visible text, so that
/// text chosen by someone else (another analyst's table cells, a server's message) cannot move
/// the cursor, clear the screen, set the window title, hide or reorder text:
/// C0 controls (U+0000–U+001F, ESC included; `\n`/`\t` kept in [`Escape::Text`]) and DEL as
/// `\xHH`, `\r` as `\r`; C1 controls (U+0080–U+009F, e.g. the one-character CSI U+009B) and the
/// bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069) as `\u{HHHH}`. Text
/// without them is returned as it is.
pub fn terminal_safe(s: &str, mode: Escape) -> Cow<'_, str> {
    let unsafe_char = |c: char| match c {
        '\n' | '\t' => mode == Escape::Cell,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    };
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !unsafe_char(c) {
            out.push(c);
            continue;
        }
        let _ = match c {
            '\n' => write!(out, "\\n"),
            '\t' => write!(out, "\\t"),
            '\r' => write!(out, "\\r"),
            '\u{0}'..='\u{1f}' | '\u{7f}' => write!(out, "\\x{:02x}", c as u32),
            c => write!(out, "\\u{{{:04x}}}", c as u32),
        };
    }
    Cow::Owned(out)
}

/// Renders `batches` in `format`. An empty result still prints its header (table, CSV) or `[]`.
/// The text is safe to print on a terminal ([`terminal_safe`]): in the table format every text
/// cell is escaped ([`Escape::Cell`]), and the whole output is escaped ([`Escape::Text`]) in
/// every format, so no control character of the data reaches the terminal.
pub fn render(
    batches: &[RecordBatch],
    schema: &datafusion::arrow::datatypes::SchemaRef,
    format: OutputFormat,
) -> Result<String, ArrowError> {
    render_raw(batches, schema, format).map(|s| match terminal_safe(&s, Escape::Text) {
        Cow::Borrowed(_) => s,
        Cow::Owned(o) => o,
    })
}

fn render_raw(
    batches: &[RecordBatch],
    schema: &datafusion::arrow::datatypes::SchemaRef,
    format: OutputFormat,
) -> Result<String, ArrowError> {
    match format {
        OutputFormat::Table => {
            if batches.iter().all(|b| b.num_rows() == 0) {
                let empty = RecordBatch::new_empty(schema.clone());
                Ok(pretty_format_batches(&[empty])?.to_string())
            } else {
                // Text cells are cut at DISPLAY_TEXT characters, or at half of it when the table
                // would still be wider than DISPLAY_WIDTH (the ledger, EXPLAIN PRIVACY).
                for limit in [DISPLAY_TEXT, DISPLAY_TEXT / 2] {
                    let shown: Vec<RecordBatch> = batches
                        .iter()
                        .map(|b| for_display(b, limit))
                        .collect::<Result<_, _>>()?;
                    let out = pretty_format_batches(&shown)?.to_string();
                    if out.lines().all(|l| l.chars().count() <= DISPLAY_WIDTH) {
                        return Ok(out);
                    }
                }
                // Still too wide (many columns: the ledger, EXPLAIN PRIVACY): one record per
                // row, one line per non-NULL field, like psql's expanded display.
                expanded(batches)
            }
        }
        OutputFormat::Csv => {
            // CSV has no nested values: a struct or list cell (a model, rgm_mean_by's groups) is
            // written as its JSON text.
            let flat: Vec<RecordBatch> = batches
                .iter()
                .map(nested_as_json)
                .collect::<Result<_, _>>()?;
            let batches = &flat[..];
            let schema = &match flat.first() {
                Some(b) => b.schema(),
                None => nested_as_json(&RecordBatch::new_empty(schema.clone()))?.schema(),
            };
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                if batches.is_empty() {
                    w.write(&RecordBatch::new_empty(schema.clone()))?;
                }
                for b in batches {
                    w.write(b)?;
                }
            }
            Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
        }
        OutputFormat::Json => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::json::ArrayWriter::new(&mut buf);
                let refs: Vec<&RecordBatch> = batches.iter().collect();
                w.write_batches(&refs)?;
                w.finish()?;
            }
            let s = String::from_utf8_lossy(&buf).to_string();
            Ok(if s.is_empty() { "[]".to_string() } else { s })
        }
    }
}

fn is_nested(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Struct(_)
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::Map(..)
    )
}

/// `batch` with every nested column replaced by a Utf8 column of its values' JSON text.
fn nested_as_json(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| is_nested(f.data_type()))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if !is_nested(f.data_type()) {
            fields.push(f.as_ref().clone());
            cols.push(c.clone());
            continue;
        }
        let one = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "v",
                f.data_type().clone(),
                true,
            )])),
            vec![c.clone()],
        )?;
        let mut buf = Vec::new();
        {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(&one)?;
            w.finish()?;
        }
        let text = String::from_utf8_lossy(&buf);
        let values: Vec<Option<String>> = text
            .lines()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v.get("v").map(|x| x.to_string()))
            })
            .collect();
        fields.push(Field::new(f.name(), DataType::Utf8, true));
        cols.push(Arc::new(StringArray::from(values)));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Float64Array, StructArray};

    #[test]
    fn nested_cells_are_json_text_in_csv() {
        let model = StructArray::from(vec![(
            Arc::new(Field::new("intercept", DataType::Float64, false)),
            Arc::new(Float64Array::from(vec![1.5])) as ArrayRef,
        )]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Float64, false),
            Field::new("model", model.data_type().clone(), true),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Float64Array::from(vec![2.0])), Arc::new(model)],
        )
        .unwrap();
        let s = render(&[b], &schema, OutputFormat::Csv).unwrap();
        assert_eq!(s, "n,model\n2.0,\"{\"\"intercept\"\":1.5}\"");
        // An empty nested result still prints its header.
        let s = render(&[], &schema, OutputFormat::Csv).unwrap();
        assert_eq!(s, "n,model");
    }

    /// A column named by an expression that quotes a long literal (100,000 characters) prints
    /// with its name cut: a padding width past 65,535 made Rust's formatting panic.
    #[test]
    fn a_very_long_column_name_is_cut_not_a_panic() {
        let long = "x".repeat(100_000);
        let schema = Arc::new(Schema::new(vec![Field::new(
            &long,
            DataType::Float64,
            false,
        )]));
        let b =
            RecordBatch::try_new(schema, vec![Arc::new(Float64Array::from(vec![2.0]))]).unwrap();
        let s = expanded(&[b]).unwrap();
        assert!(
            s.contains("…") && s.len() < 1_000,
            "{}",
            &s[..200.min(s.len())]
        );
    }
}

/// Significant digits of a float in the table format. A DP release is noisy: its 7th digit is
/// noise, never signal (CSV and JSON keep every digit).
pub const DISPLAY_DIGITS: usize = 6;
/// The longest text cell in the table format (longer ones end with '…'; CSV and JSON keep all).
pub const DISPLAY_TEXT: usize = 80;
/// The width the table format tries to stay within, by cutting text cells shorter.
pub const DISPLAY_WIDTH: usize = 160;

/// `x` with [`DISPLAY_DIGITS`] significant digits, trailing zeros removed.
pub fn sig(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-4..15).contains(&mag) {
        let s = format!("{:.*e}", DISPLAY_DIGITS - 1, x);
        return match s.split_once('e') {
            Some((m, e)) if m.contains('.') => {
                format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
            }
            _ => s,
        };
    }
    let decimals = (DISPLAY_DIGITS as i32 - 1 - mag).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Rows as records: `-[ RECORD n ]-` then `column | value` for each non-NULL value, every line
/// within [`DISPLAY_WIDTH`] (values cut with '…'). A struct (a model, a `_ci` interval) shows one
/// line per field, `column.field | value`.
fn expanded(batches: &[RecordBatch]) -> Result<String, ArrowError> {
    use datafusion::arrow::array::{Array, AsArray};
    let mut out = String::new();
    let mut n = 0;
    for b in batches {
        let shown = for_display(b, DISPLAY_WIDTH)?;
        let schema = b.schema();
        // One (name, column, display column) per line of a record: struct fields flattened.
        let mut lines: Vec<(String, ArrayRef, Option<ArrayRef>)> = Vec::new();
        fn flatten(
            name: String,
            c: &ArrayRef,
            shown: Option<&ArrayRef>,
            lines: &mut Vec<(String, ArrayRef, Option<ArrayRef>)>,
        ) {
            if let DataType::Struct(fields) = c.data_type() {
                let s = c.as_struct();
                for (f, child) in fields.iter().zip(s.columns()) {
                    // A NULL struct shows no fields; its children are masked by its nulls.
                    let masked = match s.nulls() {
                        Some(nulls) => {
                            let data = child
                                .to_data()
                                .into_builder()
                                .nulls(Some(match child.nulls() {
                                    Some(own) => datafusion::arrow::buffer::NullBuffer::union(
                                        Some(nulls),
                                        Some(own),
                                    )
                                    .expect("two"),
                                    None => nulls.clone(),
                                }))
                                .build();
                            match data {
                                Ok(d) => datafusion::arrow::array::make_array(d),
                                Err(_) => child.clone(),
                            }
                        }
                        None => child.clone(),
                    };
                    flatten(format!("{name}.{}", f.name()), &masked, None, lines);
                }
            } else {
                // A name longer than half the display (an expression's, which may quote a long
                // literal) is cut: a padding width past 65,535 makes Rust's formatting panic.
                let name = match name.char_indices().nth(DISPLAY_WIDTH / 2) {
                    Some((i, _)) => format!("{}…", &name[..i]),
                    None => name,
                };
                lines.push((name, c.clone(), shown.cloned()));
            }
        }
        for ((f, c), sc) in schema.fields().iter().zip(b.columns()).zip(shown.columns()) {
            flatten(f.name().clone(), c, Some(sc), &mut lines);
        }
        let width = lines
            .iter()
            .map(|(name, _, _)| name.chars().count())
            .max()
            .unwrap_or(0);
        let room = DISPLAY_WIDTH.saturating_sub(width + 3).max(8);
        for row in 0..b.num_rows() {
            n += 1;
            out.push_str(&format!("-[ RECORD {n} ]-\n"));
            for (name, c, sc) in &lines {
                if c.is_null(row) {
                    continue;
                }
                let mut v = match sc {
                    Some(sc) => datafusion::arrow::util::display::array_value_to_string(sc, row)?,
                    None => nested_text(c, row)?,
                };
                if v.chars().count() > room {
                    v = v.chars().take(room - 1).collect::<String>() + "…";
                }
                out.push_str(&format!("{name:<width$} | {v}\n"));
            }
        }
    }
    Ok(out.trim_end().to_string())
}

/// One value of `c` (any type, nested or not) as the table format shows it: floats at
/// [`DISPLAY_DIGITS`] significant digits ([`sig`]), structs as `{field: value, …}`, lists as
/// `[value, …]`, text escaped ([`Escape::Cell`]), NULL as `NULL`.
fn nested_text(c: &ArrayRef, row: usize) -> Result<String, ArrowError> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};
    if c.is_null(row) {
        return Ok("NULL".to_string());
    }
    let list = |values: ArrayRef| -> Result<String, ArrowError> {
        let items: Vec<String> = (0..values.len())
            .map(|i| nested_text(&values, i))
            .collect::<Result<_, _>>()?;
        Ok(format!("[{}]", items.join(", ")))
    };
    Ok(match c.data_type() {
        DataType::Float64 => sig(c.as_primitive::<Float64Type>().value(row)),
        DataType::Float32 => sig(c.as_primitive::<Float32Type>().value(row) as f64),
        DataType::Struct(fields) => {
            let s = c.as_struct();
            let parts: Vec<String> = fields
                .iter()
                .zip(s.columns())
                .map(|(f, child)| Ok(format!("{}: {}", f.name(), nested_text(child, row)?)))
                .collect::<Result<_, ArrowError>>()?;
            format!("{{{}}}", parts.join(", "))
        }
        DataType::List(_) => list(c.as_list::<i32>().value(row))?,
        DataType::LargeList(_) => list(c.as_list::<i64>().value(row))?,
        DataType::FixedSizeList(..) => list(c.as_fixed_size_list().value(row))?,
        _ => {
            let v = datafusion::arrow::util::display::array_value_to_string(c, row)?;
            terminal_safe(&v, Escape::Cell).into_owned()
        }
    })
}

/// The table format's view of a batch: floats at [`DISPLAY_DIGITS`] significant digits, text
/// escaped ([`Escape::Cell`]) and cut at `text_limit` characters.
fn for_display(batch: &RecordBatch, text_limit: usize) -> Result<RecordBatch, ArrowError> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        let text: Option<Vec<Option<String>>> = match f.data_type() {
            DataType::Float64 => {
                let a = c.as_primitive::<Float64Type>();
                Some(
                    (0..a.len())
                        .map(|i| a.is_valid(i).then(|| sig(a.value(i))))
                        .collect(),
                )
            }
            DataType::Float32 => {
                let a = c.as_primitive::<Float32Type>();
                Some(
                    (0..a.len())
                        .map(|i| a.is_valid(i).then(|| sig(a.value(i) as f64)))
                        .collect(),
                )
            }
            t if is_nested(t) => Some(
                (0..c.len())
                    .map(|i| c.is_valid(i).then(|| nested_text(c, i)).transpose())
                    .collect::<Result<_, _>>()?,
            ),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let c = cast(c, &DataType::Utf8)?;
                let a = c.as_string::<i32>();
                Some(
                    (0..a.len())
                        .map(|i| {
                            a.is_valid(i).then(|| {
                                let v = terminal_safe(a.value(i), Escape::Cell);
                                if v.chars().count() > text_limit {
                                    let cut: String = v.chars().take(text_limit - 1).collect();
                                    format!("{cut}…")
                                } else {
                                    v.into_owned()
                                }
                            })
                        })
                        .collect(),
                )
            }
            _ => None,
        };
        match text {
            Some(v) => {
                fields.push(Field::new(f.name(), DataType::Utf8, true));
                cols.push(Arc::new(StringArray::from(v)));
            }
            None => {
                fields.push(f.as_ref().clone());
                cols.push(c.clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn tables_wider_than_the_display_become_records() {
        let cols: Vec<(String, ArrayRef)> = (0..14)
            .map(|i| {
                (
                    format!("a_rather_long_column_name_{i}"),
                    Arc::new(StringArray::from(vec![Some("x".repeat(30)), None])) as ArrayRef,
                )
            })
            .collect();
        let b = RecordBatch::try_from_iter(cols).unwrap();
        let out = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Table).unwrap();
        assert!(out.starts_with("-[ RECORD 1 ]-"), "{out}");
        assert!(out.contains("-[ RECORD 2 ]-"), "{out}");
        assert!(
            out.lines().all(|l| l.chars().count() <= DISPLAY_WIDTH),
            "{out}"
        );
        assert!(out.contains("a_rather_long_column_name_13 | xxx"), "{out}");
        // A narrow table stays a table.
        let b = RecordBatch::try_from_iter(vec![(
            "a",
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
        )])
        .unwrap();
        let out = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Table).unwrap();
        assert!(out.starts_with('+'), "{out}");
    }

    #[test]
    fn control_characters_are_escaped_in_every_format() {
        assert_eq!(terminal_safe("plain ü", Escape::Cell), "plain ü");
        assert!(matches!(
            terminal_safe("a\nb", Escape::Text),
            Cow::Borrowed(_)
        ));
        assert_eq!(terminal_safe("a\nb\tc", Escape::Cell), "a\\nb\\tc");
        assert_eq!(
            terminal_safe("\x1b[2J\r\x07\x7f", Escape::Text),
            "\\x1b[2J\\r\\x07\\x7f"
        );
        assert_eq!(
            terminal_safe("\u{9b}31m\u{202e}abc\u{2066}", Escape::Text),
            "\\u{009b}31m\\u{202e}abc\\u{2066}"
        );
        // A batch holding a screen-clearing cell (and the title-setting OSC) prints no ESC byte,
        // and no other control character, in any format.
        let evil = "\x1b[2J\x1b]0;pwned\x07\u{9b}1m\u{202e}x\ry";
        let b = RecordBatch::try_from_iter(vec![
            ("name", Arc::new(StringArray::from(vec![evil])) as ArrayRef),
            (
                "v",
                Arc::new(datafusion::arrow::array::StringViewArray::from(vec![evil])) as ArrayRef,
            ),
        ])
        .unwrap();
        for f in [OutputFormat::Table, OutputFormat::Csv, OutputFormat::Json] {
            let out = render(std::slice::from_ref(&b), &b.schema(), f).unwrap();
            assert!(
                !out.chars()
                    .any(|c| (c.is_control() && c != '\n' && c != '\t')
                        || ('\u{202a}'..='\u{202e}').contains(&c)),
                "{f:?}: {out:?}"
            );
            assert!(out.contains("[2J") && !out.contains('\x1b'), "{f:?}: {out}");
        }
    }

    #[test]
    fn error_messages_are_escaped_for_the_repl_and_the_client() {
        // The REPL's and `dpfusion --connect`'s error block (the client's messages come from
        // the server, and can quote another analyst's text).
        let b = crate::repl::error_text(
            "SELECT '\x1b]0;t\x07' FROM x",
            "no table '\x1b[2J\u{202e}evil'\nsecond line",
        );
        assert!(
            !b.contains('\x1b') && !b.contains('\x07') && !b.contains('\u{202e}'),
            "{b}"
        );
        assert!(b.contains("\\x1b[2J") && b.contains("\nsecond line"), "{b}");
    }

    #[test]
    fn nested_values_are_readable_in_the_table_format() {
        use datafusion::arrow::array::{Array, Float64Array, Int64Array, ListArray, StructArray};
        use datafusion::arrow::datatypes::Float64Type;
        let coefficients = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(vec![
            Some(0.123456789),
            Some(-2.0),
        ])]);
        let model = StructArray::from(vec![
            (
                Arc::new(Field::new(
                    "coefficients",
                    coefficients.data_type().clone(),
                    true,
                )),
                Arc::new(coefficients) as ArrayRef,
            ),
            (
                Arc::new(Field::new("intercept", DataType::Float64, true)),
                Arc::new(Float64Array::from(vec![88463.3500375])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("iterations", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![100])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("epsilon", DataType::Float64, true)),
                Arc::new(Float64Array::from(vec![0.30000000000000004])) as ArrayRef,
            ),
        ]);
        let b = RecordBatch::try_from_iter(vec![("model", Arc::new(model) as ArrayRef)]).unwrap();
        let out = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Table).unwrap();
        assert!(
            out.contains(
                "{coefficients: [0.123457, -2], intercept: 88463.4, iterations: 100, epsilon: 0.3}"
            ),
            "{out}"
        );
        // CSV and JSON keep every digit.
        let csv = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Csv).unwrap();
        assert!(
            csv.contains("0.123456789") && csv.contains("0.30000000000000004"),
            "{csv}"
        );
        let json = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Json).unwrap();
        assert!(json.contains("0.30000000000000004"), "{json}");
        // Too wide for a table (52 coefficients): records with one line per field, so the
        // fields after a long list still show.
        let long = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(
            (0..52).map(|i| Some(i as f64 / 7.0)).collect::<Vec<_>>(),
        )]);
        let model = StructArray::from(vec![
            (
                Arc::new(Field::new("coefficients", long.data_type().clone(), true)),
                Arc::new(long) as ArrayRef,
            ),
            (
                Arc::new(Field::new("iterations", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![100])) as ArrayRef,
            ),
        ]);
        let b = RecordBatch::try_from_iter(vec![("model", Arc::new(model) as ArrayRef)]).unwrap();
        let out = render(std::slice::from_ref(&b), &b.schema(), OutputFormat::Table).unwrap();
        assert!(out.starts_with("-[ RECORD 1 ]-"), "{out}");
        assert!(
            out.contains("model.coefficients | [0, 0.142857, 0.285714"),
            "{out}"
        );
        assert!(out.contains("model.iterations   | 100"), "{out}");
        assert!(
            out.lines().all(|l| l.chars().count() <= DISPLAY_WIDTH),
            "{out}"
        );
    }

    #[test]
    fn floats_show_six_significant_digits() {
        assert_eq!(sig(88463.3500375), "88463.4");
        assert_eq!(sig(0.4444197144819428), "0.44442");
        assert_eq!(sig(805.761848), "805.762");
        assert_eq!(sig(5.0), "5");
        assert_eq!(sig(-1.5e-7), "-1.5e-7");
        assert_eq!(sig(1e-6), "1e-6");
        assert_eq!(sig(123456789.0), "123456789");
        assert_eq!(sig(0.0), "0");
        assert_eq!(sig(f64::NAN), "NaN");
    }
}
