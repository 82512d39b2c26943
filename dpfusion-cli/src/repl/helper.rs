//! The rustyline helper: completion of functions, keywords, tables and columns; keyword
//! highlighting; multi-line input until `;`.
use std::borrow::Cow;
use std::sync::Mutex;

use rustyline::completion::Completer;
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::Hinter;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Context, Helper};

/// SQL keywords offered for completion and highlighted.
pub const KEYWORDS: &[&str] = &[
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "ORDER", "HAVING", "AS", "AND", "OR", "NOT", "CASE",
    "WHEN", "THEN", "ELSE", "END", "CAST", "NULL", "IS", "IN", "BETWEEN", "LIKE", "CREATE",
    "EXTERNAL", "TABLE", "STORED", "LOCATION", "OPTIONS", "SHOW", "BUDGET", "EXPLAIN", "PRIVACY",
    "WITH", "ASC", "DESC", "LIMIT", "SET", "TRUE", "FALSE", "CSV", "PARQUET",
];

/// Meta-commands offered for completion after a backslash.
pub const META: &[&str] = &[
    "\\budget",
    "\\ledger",
    "\\explain",
    "\\d",
    "\\format",
    "\\timing",
    "\\?",
    "\\q",
];

/// Names the completer knows (refreshed after each statement).
#[derive(Debug, Default)]
pub struct SqlHelper {
    names: Mutex<Vec<String>>,
    colour: bool,
}

impl SqlHelper {
    pub fn new(colour: bool) -> Self {
        SqlHelper {
            names: Mutex::new(vec![]),
            colour,
        }
    }

    /// Reloads function names, and table and column names from `tables` (a server's tables
    /// for `dpfusion --connect`).
    pub fn refresh_tables(&self, tables: &[(String, datafusion::arrow::datatypes::SchemaRef)]) {
        // The DP aggregates from their one declaration, the scalar functions (predict, planning
        // helpers) from the udfs crate, and the session's table functions.
        let mut names: Vec<String> = dpfusion_udfs::aggregates::registry::AGGREGATES
            .iter()
            .filter(|a| !a.internal)
            .map(|a| a.name.to_string())
            .collect();
        names.extend(
            dpfusion_udfs::scalars::all_scalar_udfs()
                .iter()
                .map(|f| f.name().to_string()),
        );
        names.extend(["dp_budget", "dp_ledger"].map(String::from));
        for (t, schema) in tables {
            names.push(t.clone());
            names.extend(schema.fields().iter().map(|f| f.name().clone()));
        }
        names.sort();
        names.dedup();
        *self.names.lock().expect("lock") = names;
    }

    /// Completion candidates for the word ending at `pos`: (start of the word, candidates).
    pub fn candidates(&self, line: &str, pos: usize) -> (usize, Vec<String>) {
        let before = &line[..pos];
        let start = before
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '\\' || *c == '?'))
            .map(|(i, c)| i + c.len_utf8())
            .unwrap_or(0);
        let word = &before[start..];
        if word.is_empty() {
            return (start, vec![]);
        }
        let lower = word.to_ascii_lowercase();
        let mut out: Vec<String> = Vec::new();
        if word.starts_with('\\') {
            out.extend(
                META.iter()
                    .filter(|m| m.starts_with(word))
                    .map(|m| m.to_string()),
            );
            return (start, out);
        }
        out.extend(
            self.names
                .lock()
                .expect("lock")
                .iter()
                .filter(|n| n.to_ascii_lowercase().starts_with(&lower))
                .cloned(),
        );
        let upper = word.chars().next().is_some_and(|c| c.is_uppercase());
        out.extend(
            KEYWORDS
                .iter()
                .filter(|k| k.to_ascii_lowercase().starts_with(&lower))
                .map(|k| {
                    if upper {
                        k.to_string()
                    } else {
                        k.to_ascii_lowercase()
                    }
                }),
        );
        (start, out)
    }
}

/// True when `text` ends a statement: a `;` outside quotes is the last non-blank thing, or it is
/// a meta-command, or it is blank.
pub fn input_complete(text: &str) -> bool {
    let t = text.trim();
    if t.is_empty() || super::is_meta(t) {
        return true;
    }
    let (mut single, mut double, mut last_semicolon_end) = (false, false, false);
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '-' if !single && !double && chars.peek() == Some(&'-') => {
                // comment to the end of the line
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
                continue;
            }
            ';' if !single && !double => {
                last_semicolon_end = true;
                continue;
            }
            c if c.is_whitespace() => continue,
            _ => {}
        }
        last_semicolon_end = false;
    }
    last_semicolon_end && !single && !double
}

impl Completer for SqlHelper {
    type Candidate = String;
    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        Ok(self.candidates(line, pos))
    }
}

impl Hinter for SqlHelper {
    type Hint = String;
}

impl Highlighter for SqlHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        if !self.colour {
            return Cow::Borrowed(line);
        }
        Cow::Owned(highlight_keywords(line))
    }
    fn highlight_char(&self, _line: &str, _pos: usize, _kind: CmdKind) -> bool {
        self.colour
    }
}

/// Keywords in bold blue, DP function names in green; strings untouched.
pub fn highlight_keywords(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 16);
    let mut word = String::new();
    let mut in_str = false;
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        let up = word.to_ascii_uppercase();
        if KEYWORDS.contains(&up.as_str()) {
            out.push_str("\x1b[1;34m");
            out.push_str(word);
            out.push_str("\x1b[0m");
        } else if dpfusion::statements::named_args::dp_function_params(&word.to_ascii_lowercase())
            .is_some()
        {
            out.push_str("\x1b[32m");
            out.push_str(word);
            out.push_str("\x1b[0m");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in line.chars() {
        if in_str {
            out.push(c);
            if c == '\'' {
                in_str = false;
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
            if c == '\'' {
                in_str = true;
            }
        }
    }
    flush(&mut word, &mut out);
    out
}

impl Validator for SqlHelper {
    fn validate(&self, ctx: &mut ValidationContext) -> rustyline::Result<ValidationResult> {
        Ok(if input_complete(ctx.input()) {
            ValidationResult::Valid(None)
        } else {
            ValidationResult::Incomplete
        })
    }
}

impl Helper for SqlHelper {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_end_with_a_semicolon() {
        assert!(input_complete("SELECT 1;"));
        assert!(input_complete("SELECT 1; -- done"));
        assert!(!input_complete("SELECT 1"));
        assert!(!input_complete("SELECT ';"));
        assert!(!input_complete("SELECT 1;\nSELECT"));
        assert!(input_complete("\\budget"));
        assert!(input_complete(""));
    }

    #[test]
    fn completes_functions_keywords_and_meta() {
        let h = SqlHelper::new(false);
        *h.names.lock().unwrap() = vec!["dp_mean".into(), "dp_count".into(), "salaries".into()];
        let (start, c) = h.candidates("SELECT dp_m", 11);
        assert_eq!(start, 7);
        assert_eq!(c, vec!["dp_mean"]);
        let (_, c) = h.candidates("SEL", 3);
        assert_eq!(c, vec!["SELECT"]);
        let (_, c) = h.candidates("\\bu", 3);
        assert_eq!(c, vec!["\\budget"]);
        let (_, c) = h.candidates("from sal", 8);
        assert_eq!(c, vec!["salaries"]);
    }

    #[test]
    fn highlighting_keeps_the_text() {
        let s = highlight_keywords("select dp_mean(x, 'from') from t");
        let plain: String = {
            let mut out = String::new();
            let mut skip = false;
            for c in s.chars() {
                if c == '\x1b' {
                    skip = true;
                } else if skip && c == 'm' {
                    skip = false;
                } else if !skip {
                    out.push(c);
                }
            }
            out
        };
        assert_eq!(plain, "select dp_mean(x, 'from') from t");
        assert!(s.contains("\x1b[1;34mselect"));
        assert!(!s.contains("\x1b[1;34mfrom')"));
    }
}
