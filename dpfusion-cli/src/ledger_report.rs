//! `dpfusion ledger report LEDGER -o report.html`: the data owner's view of a ledger (issue 33).
//!
//! One self-contained HTML page (inline CSS and SVG, no script, nothing fetched), written only
//! for a ledger that verifies ([`dpfusion::accounting::verify_with`]: chain, sidecar, witness). Per
//! private table: the ε spent over time under the table's filter (the same composition
//! `SHOW BUDGET` reports, recomputed after each charge from the events up to it), the budget
//! and the share left, the ε by analyst and by function, and the table of charges. The page is
//! also well-formed XML (every element closed, all text escaped), so a plain XML parser reads it.
//!
//! A charge's own ε is what the ledger records for it alone; charges compose under the filter,
//! so the spent ε grows by less than the sum of the charges' ε. The by-analyst and by-function
//! views add charges' own ε and say so; the by-function view splits a charge's ε evenly between
//! the DP calls its SQL text names.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;

use dpfusion::accounting::display::{self, Round};
use dpfusion::accounting::{self, LedgerEntry, LedgerReport, TableKey, TablePolicy, Visibility};
use dpfusion_udfs::aggregates::registry;

/// What went wrong: the ledger does not verify, or it cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("the ledger does not verify, so no report is written: {0}")]
    Unverified(#[from] accounting::AccountingError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// One charge of one table, as the report shows it.
#[derive(Debug, Clone)]
struct Row {
    seq: u64,
    time: String,
    analyst: String,
    query: String,
    epsilon: f64,
    delta: f64,
    /// ε spent on the table after this charge, under its filter.
    spent_after: f64,
    functions: Vec<String>,
}

/// One private table's history.
#[derive(Debug)]
struct TableHistory {
    key: TableKey,
    name: String,
    policy: Option<TablePolicy>,
    rows: Vec<Row>,
    /// Spent ε as the verified report computes it (authoritative).
    spent: f64,
}

/// Verifies the ledger at `path` (with its witness, when given) and returns the report page.
pub fn html_report(path: &Path, witness: Option<&Path>) -> Result<String, ReportError> {
    let report = accounting::verify_with(path, witness)?;
    let io = |source| ReportError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut policies: BTreeMap<TableKey, TablePolicy> = BTreeMap::new();
    let mut histories: Vec<TableHistory> = Vec::new();
    let mut events: BTreeMap<TableKey, Vec<dpfusion_udfs::privacy::Event>> = BTreeMap::new();
    // Only the lines that verified (a session may append meanwhile).
    for line in BufReader::new(file).lines().take(report.lines as usize) {
        let line = line.map_err(io)?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        match v.get("record").and_then(|r| r.as_str()) {
            Some("policy" | "owner") => {
                if let Ok(p) = serde_json::from_value::<TablePolicy>(v) {
                    policies.insert(p.key.clone(), p);
                }
            }
            Some("charge") => {
                let Ok(e) = serde_json::from_value::<LedgerEntry>(v) else {
                    continue;
                };
                charge(&e, &policies, &mut events, &mut histories);
            }
            _ => {}
        }
    }
    for h in &mut histories {
        if let Some(p) = policies.get(&h.key) {
            h.policy = Some(p.clone());
            h.name = p.name.clone();
        }
        if let Some(t) = report.tables.iter().find(|t| t.key == h.key) {
            h.spent = t.spent;
        }
    }
    // Private tables without charges yet still show their budget.
    for (k, p) in &policies {
        if p.visibility == Visibility::Private && !histories.iter().any(|h| &h.key == k) {
            histories.push(TableHistory {
                key: k.clone(),
                name: p.name.clone(),
                policy: Some(p.clone()),
                rows: vec![],
                spent: 0.0,
            });
        }
    }
    histories.retain(|h| {
        h.policy
            .as_ref()
            .is_none_or(|p| p.visibility == Visibility::Private)
    });
    histories.sort_by(|a, b| a.name.cmp(&b.name).then(a.key.cmp(&b.key)));
    Ok(page(path, &report, &histories))
}

/// Adds one charge to the histories of the tables it charged.
fn charge(
    e: &LedgerEntry,
    policies: &BTreeMap<TableKey, TablePolicy>,
    events: &mut BTreeMap<TableKey, Vec<dpfusion_udfs::privacy::Event>>,
    histories: &mut Vec<TableHistory>,
) {
    let functions = dp_functions(&e.query);
    for t in &e.tables {
        let evs = events.entry(t.key.clone()).or_default();
        evs.extend(t.events.iter().cloned());
        let spent_after = match policies.get(&t.key) {
            Some(p) => accounting::spent_epsilon(p, evs),
            None => f64::NAN,
        };
        let row = Row {
            seq: e.seq,
            time: e.time.clone(),
            analyst: e
                .analyst
                .clone()
                .unwrap_or_else(|| "(owner's session)".into()),
            query: e.query.clone(),
            epsilon: t.epsilon,
            delta: t.delta,
            spent_after,
            functions: functions.clone(),
        };
        match histories.iter_mut().find(|h| h.key == t.key) {
            Some(h) => h.rows.push(row),
            None => histories.push(TableHistory {
                key: t.key.clone(),
                name: t.name.clone(),
                policy: None,
                rows: vec![row],
                spent: 0.0,
            }),
        }
    }
}

/// The DP aggregates a query's text calls, in order (a name from the registry followed by `(`).
fn dp_functions(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_alphabetic() || bytes[i] == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &sql[start..i];
            let rest = sql[i..].trim_start();
            if rest.starts_with('(')
                && let Some(a) = registry::get(word).filter(|a| !a.internal)
            {
                out.push(a.name.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Text escaped for HTML and XML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0; a query never needs them shown.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A number for display: six significant digits ([`display::num`]), rounded in the direction
/// that never flatters the budget (spent up, left down); "—" when not finite.
fn num(x: f64, round: Round) -> String {
    if x.is_finite() {
        display::num(x, round)
    } else {
        "—".into()
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}\
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}\
h3{font-size:1.05em}table{border-collapse:collapse;margin:.5em 0;font-size:.9em}\
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.9em}\
.q{max-width:480px;overflow-wrap:anywhere}.note{color:#555;font-size:.9em}\
svg text{font-size:11px;font-family:system-ui,sans-serif}";

fn page(path: &Path, report: &LedgerReport, tables: &[TableHistory]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n\
         <meta charset=\"utf-8\"/>\n<title>dpfusion ledger report: {}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>Privacy ledger report</h1>\n",
        esc(&path.display().to_string())
    );
    let verified = if report.witness.is_some() {
        "hash chain, sidecar and witness verified"
    } else {
        "hash chain and sidecar verified; no witness yet"
    };
    let _ = writeln!(
        h,
        "<p>Ledger <code>{}</code>, id <code>{}</code>: {verified}. {} lines, {} charges, {} \
         tables. Written {} UTC by dpfusion {}.</p>",
        esc(&path.display().to_string()),
        esc(report.ledger_id.as_deref().unwrap_or("(none yet)")),
        report.lines,
        report.charges,
        report.tables.len(),
        chrono::Utc::now().format("%Y-%m-%d %H:%M:%S"),
        env!("CARGO_PKG_VERSION"),
    );
    h.push_str(
        "<p class=\"note\">Spent ε is the ε of all charges together under the table's privacy \
         filter (as SHOW BUDGET reports it); charges compose, so it grows by less than the sum \
         of the charges' own ε. The views by analyst and by function add the charges' own ε; a \
         charge's ε is split evenly between the DP calls its SQL names.</p>\n",
    );
    if tables.is_empty() {
        h.push_str("<p>No private table is recorded in this ledger yet.</p>\n");
    }
    h.push_str(
        "<h2>Summary</h2>\n<table>\n<tr><th>table</th><th>budget ε</th><th>budget δ</th>\
                <th>filter</th><th>spent ε</th><th>remaining ε</th><th>share left</th>\
                <th>charges</th></tr>\n",
    );
    for t in tables {
        let (eps, delta, filter) = budget_of(t);
        let left = (eps - t.spent).max(0.0);
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#{}\">{}</a></td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>\
             <td class=\"n\">{}</td></tr>",
            anchor(&t.key),
            esc(&t.name),
            num(eps, Round::Nearest),
            delta.map_or("—".into(), |d| format!("{d:e}")),
            esc(&filter),
            num(t.spent, Round::Up),
            num(left, Round::Down),
            share_bar(eps, t.spent),
            t.rows.len()
        );
    }
    h.push_str("</table>\n");
    for t in tables {
        table_section(&mut h, t);
    }
    h.push_str("</body>\n</html>\n");
    h
}

fn anchor(key: &TableKey) -> String {
    let s: String = key
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("t-{s}")
}

/// (budget ε, budget δ, filter name) of a table (ε NaN when no policy is recorded).
fn budget_of(t: &TableHistory) -> (f64, Option<f64>, String) {
    match &t.policy {
        Some(p) => (
            p.budget.epsilon,
            Some(p.budget.delta),
            p.filter.name().to_string(),
        ),
        None => (f64::NAN, None, "(session table)".into()),
    }
}

/// A small horizontal bar: the share of the budget left, with its percentage.
fn share_bar(budget: f64, spent: f64) -> String {
    if !(budget.is_finite() && budget > 0.0) {
        return "—".into();
    }
    let left = ((budget - spent) / budget).clamp(0.0, 1.0);
    let w = 120.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"170\" height=\"14\" \
         role=\"img\" aria-label=\"{pct:.1}% left\"><rect x=\"0\" y=\"1\" width=\"{w}\" \
         height=\"12\" fill=\"#eee\" stroke=\"#999\"/><rect x=\"0\" y=\"1\" width=\"{:.1}\" \
         height=\"12\" fill=\"#4a8\"/><text x=\"{}\" y=\"11\">{pct:.1}%</text></svg>",
        left * w,
        w + 6.0,
        // Rounded down: never more left than there is.
        pct = (left * 1000.0).floor() / 10.0
    )
}

fn table_section(h: &mut String, t: &TableHistory) {
    let (eps, delta, filter) = budget_of(t);
    let _ = write!(
        h,
        "<h2 id=\"{}\">Table {}</h2>\n<p>Key <code>{}</code>; budget ε {} at δ {}, {} filter; \
         spent ε {}, {} left ({} charges).</p>\n",
        anchor(&t.key),
        esc(&t.name),
        esc(&t.key.to_string()),
        num(eps, Round::Nearest),
        delta.map_or("—".into(), |d| format!("{d:e}")),
        esc(&filter),
        num(t.spent, Round::Up),
        num((eps - t.spent).max(0.0), Round::Down),
        t.rows.len()
    );
    if t.rows.is_empty() {
        h.push_str("<p>No charge yet.</p>\n");
        return;
    }
    h.push_str("<h3>ε spent over time</h3>\n");
    h.push_str(&over_time(t, eps));
    // By analyst and by function: sums of the charges' own ε.
    let mut by_analyst: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    let mut by_function: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for r in &t.rows {
        let a = by_analyst.entry(r.analyst.as_str()).or_default();
        a.0 += 1;
        a.1 += r.epsilon;
        let share = r.epsilon / r.functions.len().max(1) as f64;
        if r.functions.is_empty() {
            let f = by_function.entry("(other)".into()).or_default();
            f.0 += 1;
            f.1 += r.epsilon;
        }
        for f in &r.functions {
            let e = by_function.entry(f.clone()).or_default();
            e.0 += 1;
            e.1 += share;
        }
    }
    h.push_str("<h3>By analyst</h3>\n");
    h.push_str(&bars(
        "analyst",
        "charges",
        by_analyst.iter().map(|(k, v)| (k.to_string(), *v)),
    ));
    h.push_str("<h3>By function</h3>\n");
    h.push_str(&bars(
        "function",
        "calls",
        by_function.iter().map(|(k, v)| (k.clone(), *v)),
    ));
    h.push_str(
        "<h3>Charges</h3>\n<table>\n<tr><th>seq</th><th>time (UTC)</th><th>analyst</th>\
         <th>ε of the charge</th><th>δ</th><th>spent ε after</th><th>functions</th>\
         <th>query</th></tr>\n",
    );
    for r in &t.rows {
        let _ = writeln!(
            h,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>\
             <td class=\"q\"><code>{}</code></td></tr>",
            r.seq,
            esc(&r.time),
            esc(&r.analyst),
            num(r.epsilon, Round::Up),
            format_args!("{:e}", r.delta),
            num(r.spent_after, Round::Up),
            esc(&r.functions.join(", ")),
            esc(&r.query)
        );
    }
    h.push_str("</table>\n");
}

/// A step chart of the spent ε after each charge against its time, with the budget dashed.
fn over_time(t: &TableHistory, budget: f64) -> String {
    let (w, ht, l, r, top, bottom) = (720.0, 240.0, 56.0, 16.0, 12.0, 36.0);
    let times: Vec<f64> = t
        .rows
        .iter()
        .map(|r| {
            chrono::DateTime::parse_from_rfc3339(&r.time)
                .map(|d| d.timestamp_millis() as f64)
                .unwrap_or(f64::NAN)
        })
        .collect();
    // By time when every charge has one and they span an interval; else by charge number.
    let by_time = times.iter().all(|x| x.is_finite())
        && times.last().copied().unwrap_or(0.0) > times.first().copied().unwrap_or(0.0);
    let xs: Vec<f64> = if by_time {
        times.clone()
    } else {
        (1..=t.rows.len()).map(|i| i as f64).collect()
    };
    let (x0, x1) = (
        xs.first().copied().unwrap_or(0.0),
        xs.last().copied().unwrap_or(1.0),
    );
    let span = if x1 > x0 { x1 - x0 } else { 1.0 };
    let ymax = t
        .rows
        .iter()
        .map(|r| r.spent_after)
        .filter(|v| v.is_finite())
        .fold(if budget.is_finite() { budget } else { 0.0 }, f64::max)
        .max(1e-12)
        * 1.05;
    let px = |x: f64| l + (x - x0) / span * (w - l - r);
    let py = |y: f64| top + (1.0 - y / ymax) * (ht - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{ht}\" \
         viewBox=\"0 0 {w} {ht}\" role=\"img\" aria-label=\"spent epsilon over time\">\n\
         <rect x=\"{l}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" \
         stroke=\"#bbb\"/>\n",
        w - l - r,
        ht - top - bottom
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            w - r,
            py(y),
            py(y),
            l - 4.0,
            py(y) + 4.0,
            num(y, Round::Nearest)
        );
    }
    if budget.is_finite() {
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#c33\" \
             stroke-dasharray=\"6 4\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" \
             fill=\"#c33\">budget ε {}</text>",
            w - r,
            py(budget),
            py(budget),
            w - r - 4.0,
            py(budget) - 4.0,
            num(budget, Round::Nearest)
        );
    }
    let mut prev = py(0.0);
    let mut d = format!("M{:.1},{prev:.1}", px(x0));
    for (x, row) in xs.iter().zip(&t.rows) {
        if row.spent_after.is_finite() {
            let y = py(row.spent_after);
            let _ = write!(d, " L{:.1},{prev:.1} L{:.1},{y:.1}", px(*x), px(*x));
            prev = y;
        }
    }
    let _ = writeln!(
        s,
        "<path d=\"{d}\" fill=\"none\" stroke=\"#2a6\" stroke-width=\"2\"/>"
    );
    for (x, row) in xs.iter().zip(&t.rows) {
        if row.spent_after.is_finite() {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#2a6\"><title>#{} {}: spent \
                 ε {}</title></circle>",
                px(*x),
                py(row.spent_after),
                row.seq,
                esc(&row.time),
                num(row.spent_after, Round::Up)
            );
        }
    }
    let (first, last) = if by_time {
        (
            t.rows.first().map(|r| r.time.clone()).unwrap_or_default(),
            t.rows.last().map(|r| r.time.clone()).unwrap_or_default(),
        )
    } else {
        ("charge 1".to_string(), format!("charge {}", t.rows.len()))
    };
    let _ = write!(
        s,
        "<text x=\"{l}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
         </svg>\n",
        ht - bottom + 16.0,
        esc(&first),
        w - r,
        ht - bottom + 16.0,
        esc(&last)
    );
    s
}

/// A table with one horizontal bar per row: (label, (count, ε)).
fn bars(what: &str, count: &str, rows: impl Iterator<Item = (String, (u64, f64))>) -> String {
    let rows: Vec<(String, (u64, f64))> = rows.collect();
    let max = rows.iter().map(|(_, (_, e))| *e).fold(0.0, f64::max);
    let mut s = format!(
        "<table>\n<tr><th>{what}</th><th>{count}</th><th>ε of its charges (sum)</th>\
         <th></th></tr>\n"
    );
    for (k, (n, e)) in rows {
        let wpx = if max > 0.0 { e / max * 240.0 } else { 0.0 };
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td class=\"n\">{n}</td><td class=\"n\">{}</td><td><svg \
             xmlns=\"http://www.w3.org/2000/svg\" width=\"250\" height=\"12\"><rect x=\"0\" \
             y=\"1\" width=\"{wpx:.1}\" height=\"10\" fill=\"#58a\"/></svg></td></tr>",
            esc(&k),
            num(e, Round::Up)
        );
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_calls_are_found_in_the_text_and_text_is_escaped() {
        assert_eq!(
            dp_functions("SELECT dp_mean (x, 0, 1, 0.5), DP_COUNT(y, 0.1), my_dp_sum(z) FROM t"),
            ["dp_mean", "dp_count"]
        );
        assert_eq!(
            esc("a<b & 'c' \"d\"\u{1b}"),
            "a&lt;b &amp; &#39;c&#39; &quot;d&quot; "
        );
    }
}
