//! Per-function help: `HELP` / `HELP dp_mean` as a statement and `\h` / `\h dp_mean` in the
//! REPL (issue 33). Everything shown is read from the DP aggregates' declarations
//! ([`dpfusion_udfs::aggregates::registry`]: usage, arguments, parameters with their defaults
//! and docs, requirements) and from each aggregate's own documentation (description, example,
//! related functions); nothing here names a function.
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::Result;
use dpfusion_udfs::aggregates::registry::{self, Aggregate, Default as ParamDefault, Requirement};

/// The user-facing DP aggregates (the guard's internal ones left out), in declaration order.
fn public_aggregates() -> impl Iterator<Item = &'static Aggregate> {
    registry::AGGREGATES.iter().filter(|a| !a.internal)
}

/// `\h` / `HELP`: one line per DP aggregate, its name and what it releases.
pub fn help_index() -> String {
    let width = public_aggregates().map(|a| a.name.len()).max().unwrap_or(0);
    let mut out = String::from("DP aggregates (HELP name or \\h name shows one):\n");
    for a in public_aggregates() {
        out.push_str(&format!("  {:<width$}  {}\n", a.name, a.summary));
    }
    out.push_str(
        "Every call needs its own epsilon; bounds (lower, upper) are public and clamp the \
         values. docs/SQL.md has the full reference.",
    );
    wrap(&out, WIDTH)
}

/// `\h name` / `HELP name`: the function's documentation, or what exists when `name` is no DP
/// aggregate.
pub fn help_text(name: &str) -> String {
    let name = name
        .trim()
        .trim_matches(|c| c == '\'' || c == '"' || c == '`');
    if name.is_empty() {
        return help_index();
    }
    let Some(a) = registry::get(name).filter(|a| !a.internal) else {
        let close: Vec<&str> = public_aggregates()
            .map(|a| a.name)
            .filter(|n| {
                let l = name.to_ascii_lowercase();
                n.contains(l.trim_start_matches("dp_")) || l.contains(n)
            })
            .collect();
        let mut s = format!("no DP aggregate '{name}'.");
        if !close.is_empty() {
            s.push_str(&format!(" Did you mean: {}?", close.join(", ")));
        }
        s.push_str(" HELP (or \\h) lists them all.");
        return s;
    };
    let doc = (a.udaf)().documentation().cloned();
    let mut out = format!("{}: {}\n\n  {}\n", a.name, a.summary, a.usage());
    if let Some(d) = &doc {
        out.push_str(&format!("\n{}\n", d.description.trim()));
    }
    let w = a
        .data
        .iter()
        .map(|d| d.name.len())
        .chain(a.user_params().map(|p| p.name.len()))
        .max()
        .unwrap_or(0)
        + 2;
    out.push_str("\nArguments:\n");
    for d in a.data {
        out.push_str(&format!("  {:<w$}{}\n", d.name, d.doc));
    }
    for p in a.user_params() {
        let default = match p.default {
            ParamDefault::Required => "required".to_string(),
            ParamDefault::Number(n) => format!("default {n}"),
            ParamDefault::Text(t) => format!("default '{t}'"),
            ParamDefault::Bool(b) => format!("default {b}"),
            // Its doc names the session's default.
            ParamDefault::SessionDelta => {
                out.push_str(&format!("  {:<w$}{}\n", p.name, p.doc));
                continue;
            }
            ParamDefault::Hidden => continue,
        };
        out.push_str(&format!("  {:<w$}{}; {default}\n", p.name, p.doc));
    }
    for r in a.requirements {
        out.push_str(match r {
            Requirement::PublicGroupSizes => {
                "\nNeeds public group sizes: `replace` neighbours, GROUP BY public columns \
                 only, no filter on private columns.\n"
            }
            Requirement::DeclaredRatio => {
                "\nNeeds a ratio bound the data owner declared for the value column and the \
                 column it is grouped by ([[table.ratio_bounds]] in the catalog).\n"
            }
        });
    }
    out.push_str(
        "\nParameters may be given by position or by name (name => value); every call is \
         charged to the tables it reads.\n",
    );
    if let Some(d) = &doc {
        if let Some(ex) = &d.sql_example {
            out.push_str(&format!("\nExample:\n{}\n", indent(ex.trim())));
        }
        if let Some(rel) = d.related_udfs.as_ref().filter(|r| !r.is_empty()) {
            out.push_str(&format!("\nSee also: {}\n", rel.join(", ")));
        }
    }
    wrap(out.trim_end(), WIDTH)
}

/// The help text's width: it fits a terminal and the table format's cells (80 characters).
const WIDTH: usize = 78;

/// Wraps each line longer than `width` at spaces; a continuation keeps the line's indentation,
/// and an argument line's (two spaces, then the name column) aligns under its description.
fn wrap(text: &str, width: usize) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.chars().count() <= width {
            out.push(line.to_string());
            continue;
        }
        let lead = line.len() - line.trim_start().len();
        // An indented two-column line (`  name   text`): continue under the text.
        let column = (lead == 2)
            .then(|| {
                let rest = &line[lead..];
                let word = rest.find(' ')?;
                let gap = rest[word..].len() - rest[word..].trim_start().len();
                (gap >= 2).then_some(lead + word + gap)
            })
            .flatten();
        let start = column.unwrap_or(lead);
        let cont = " ".repeat(start);
        let mut cur = line[..start].to_string();
        for word in line[start..].split_whitespace() {
            let fresh = cur.len() == start;
            if !fresh && cur.chars().count() + 1 + word.chars().count() > width {
                out.push(std::mem::replace(&mut cur, cont.clone()));
                cur.push_str(word);
            } else {
                if !fresh {
                    cur.push(' ');
                }
                cur.push_str(word);
            }
        }
        out.push(cur);
    }
    out.join("\n")
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `HELP [name]` statement's result: one column `help`, one row per line of the text.
pub fn help_batch(name: &str) -> Result<RecordBatch> {
    let text = help_text(name);
    let lines: Vec<&str> = text.lines().collect();
    let schema = Arc::new(Schema::new(vec![Field::new("help", DataType::Utf8, false)]));
    Ok(RecordBatch::try_new(
        schema,
        vec![Arc::new(StringArray::from(lines))],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_mean_help_comes_from_the_registry() {
        let h = help_text("DP_MEAN");
        let a = registry::get("dp_mean").unwrap();
        assert!(h.starts_with("dp_mean: "), "{h}");
        assert!(h.contains(&a.usage()), "{h}");
        let flat = h.split_whitespace().collect::<Vec<_>>().join(" ");
        for p in a.user_params() {
            assert!(flat.contains(p.doc), "{} missing:\n{h}", p.name);
        }
        // The hidden neighbour mode is the session's: never shown.
        assert!(!h.contains("neighbour mode"), "{h}");
        assert!(h.contains("Example:"), "{h}");
        assert!(h.lines().all(|l| l.chars().count() <= WIDTH), "{h}");
    }

    #[test]
    fn the_index_lists_every_public_aggregate_and_unknown_names_are_explained() {
        let idx = help_index();
        for a in registry::AGGREGATES.iter().filter(|a| !a.internal) {
            assert!(idx.contains(a.name), "{} missing", a.name);
        }
        assert_eq!(help_text(""), idx);
        let u = help_text("dp_avg");
        assert!(
            u.starts_with("no DP aggregate 'dp_avg'") && u.contains("HELP"),
            "{u}"
        );
        let b = help_batch("dp_sum").unwrap();
        assert_eq!(b.schema().field(0).name(), "help");
        assert!(b.num_rows() > 5);
    }
}
