//! `dpfusion ledger report LEDGER -o report.html`: the data owner's view of a ledger (issue 33).
//!
//! One self-contained HTML page (inline CSS and SVG, no script, nothing fetched), written only
//! for a ledger that verifies ([`dpfusion::accounting::verify_with`]: chain, sidecar, witness). Per
//! private table: the numbers `SHOW BUDGET` shows (the verified report's
//! [`accounting::BudgetRow`], the same computation: round 47, review "newuser", findings 1-3):
//! the guarantee (the largest budget ever in force), the budget in force, the sum used in the
//! filter's unit against its budget, the shares used and left, the next ε and the δ of partition
//! selection spent and left; then the share used over time, the shares by analyst and by
//! function, and the table of charges. The page is also well-formed XML (every element closed,
//! all text escaped), so a plain XML parser reads it.
//!
//! A charge's cost is its sum in the filter's unit and its share is the difference of the
//! running shares (millionths of the budget in force) before and after it, recomputed from the
//! events under the policy in force, so the shares of a table's charges, and the by-analyst and
//! by-function sums of them, add up exactly to its used share. No ε of a charge, and no
//! conversion of the running sum, is shown: neither is a guarantee (docs/ACCOUNTING.md, "Why no
//! 'ε charged'"). The by-function view splits a charge's share evenly between the DP calls it
//! made on the table (its requests as written; in older ledgers, the calls its SQL text names).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;

use dpfusion::accounting::display::{self, Round, SHARE_SCALE};
use dpfusion::accounting::{
    self, BudgetRow, Filter, LedgerEntry, LedgerReport, LedgerTable, TableKey, TablePolicy, Usage,
};
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
    /// The calls on this table as written (`dp_mean(ε 0.5, δ 1e-7, gaussian)`); empty in
    /// ledgers written before issue 29.
    requests: Vec<String>,
    /// The DP functions this charge called on the table, for the by-function view.
    functions: Vec<String>,
    /// Under the policy in force (`None`: no policy recorded, or it no longer compiles).
    cost: Option<Cost>,
}

/// A charge under the table's filter in force.
#[derive(Debug, Clone, Copy)]
struct Cost {
    /// Its sum in the filter's unit (rounded up).
    main: f64,
    /// Its share of the budget, millionths: the difference of the running shares.
    share: u64,
    /// The share used after it, millionths.
    used_share: u64,
    /// Its additive δ of partition selection.
    delta: f64,
}

/// One table's history.
#[derive(Debug)]
struct TableHistory {
    key: TableKey,
    name: String,
    /// The policy in force, as the verified replay applied it.
    policy: Option<TablePolicy>,
    /// What `SHOW BUDGET` shows for it (private tables with a policy).
    row: Option<BudgetRow>,
    /// A table made public after charges: the largest ε and δ budgets it had while private.
    was_private: Option<(f64, f64)>,
    rows: Vec<Row>,
}

/// Verifies the ledger at `path` (with its witness, when given) and returns the report page.
pub fn html_report(path: &Path, witness: Option<&Path>) -> Result<String, ReportError> {
    let report = accounting::verify_with(path, witness)?;
    let io = |source| ReportError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // The charges of each key, in ledger order: (the charge, its part for this key).
    let mut charges: BTreeMap<TableKey, Vec<(LedgerEntry, LedgerTable)>> = BTreeMap::new();
    // Only the lines that verified (a session may append meanwhile).
    for line in BufReader::new(file).lines().take(report.lines as usize) {
        let line = line.map_err(io)?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v.get("record").and_then(|r| r.as_str()) != Some("charge") {
            continue;
        }
        let Ok(mut e) = serde_json::from_value::<LedgerEntry>(v) else {
            continue;
        };
        for t in std::mem::take(&mut e.tables) {
            charges
                .entry(t.key.clone())
                .or_default()
                .push((e.clone(), t));
        }
    }
    let mut histories: Vec<TableHistory> = report
        .tables
        .iter()
        // Private tables, charged or not, and every key with charges: one charged without a
        // recorded policy, or a table the owner made public after charging it (round 47, review
        // "newuser2", G: its charges, SQL and guarantee were dropped from the owner's page). A
        // public table never charged has no budget.
        .filter(|t| t.budget_row.is_some() || t.charges > 0)
        .map(|t| {
            let filter = t
                .budget_row
                .as_ref()
                .and(t.policy.as_ref())
                .and_then(|p| p.compiled_filter().ok());
            TableHistory {
                key: t.key.clone(),
                name: t.name.clone(),
                policy: t.policy.clone(),
                row: t.budget_row.clone(),
                was_private: t
                    .guarantee
                    .filter(|_| t.visibility == Some(accounting::Visibility::Public)),
                rows: history(filter.as_ref(), charges.remove(&t.key).unwrap_or_default()),
            }
        })
        .collect();
    histories.sort_by(|a, b| a.name.cmp(&b.name).then(a.key.cmp(&b.key)));
    Ok(page(path, &report, &histories))
}

/// The rows of one table's charges, each costed under `filter` (the policy in force) from its
/// events, folded in ledger order as the accountant folds them.
fn history(filter: Option<&Filter>, charges: Vec<(LedgerEntry, LedgerTable)>) -> Vec<Row> {
    let mut used = Usage::default();
    charges
        .into_iter()
        .map(|(e, t)| {
            let cost = filter.map(|f| {
                let before = f.share(&used);
                used = f.currency().fold(std::mem::take(&mut used), &t.events);
                let own = f.usage(&t.events);
                let used_share = f.share(&used);
                Cost {
                    main: own.main,
                    share: used_share.saturating_sub(before),
                    used_share,
                    delta: own.delta,
                }
            });
            let functions = if t.requests.is_empty() {
                dp_functions(&e.query)
            } else {
                t.requests.iter().map(|r| r.function.clone()).collect()
            };
            Row {
                seq: e.seq,
                time: e.time,
                analyst: e.analyst.unwrap_or_else(|| "(owner's session)".into()),
                query: e.query,
                requests: t.requests.iter().map(ToString::to_string).collect(),
                functions,
                cost,
            }
        })
        .collect()
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
        "<p class=\"note\">The numbers are those SHOW BUDGET shows analysts (at the default δ). A table's guarantee \
         is the largest budget it has had in force; what is used and left is measured against \
         the budget in force, in the unit of the table's privacy filter (μ² for gdp, ρ for \
         zcdp, RDP ε at the filter's order for rdp). A charge's share is its part of that \
         budget (the difference of the running shares, recomputed under the policy in force), \
         so the shares of a table's charges, and the sums by analyst and by function, add up \
         exactly to its share used; a charge made before the owner changed the budget or the \
         filter may show another share than the one it was admitted with (dp_ledger()'s \
         cost_pct). Next ε is the largest ε one more default query (one Gaussian call at δ \
         1e-7, the default dpfusion.default_delta; a session with another default shows its \
         own) could use. Budgets (the guarantee and the budget in force) are shown as the owner \
         wrote them. A table made public after it was charged keeps its charges here, marked \
         now public. No ε is shown per charge or as spent: conversions of a charge or of \
         the running sum are not guarantees. Costs and amounts used are rounded up, what is \
         left down. The view by function splits a charge's share evenly between its DP \
         calls.</p>\n",
    );
    if tables.is_empty() {
        h.push_str("<p>No private table is recorded in this ledger yet.</p>\n");
    }
    h.push_str(
        "<h2>Summary</h2>\n<table>\n<tr><th>table</th><th>guarantee ε</th>\
         <th>guarantee δ</th><th>budget in force</th><th>filter</th><th>used</th><th>left</th>\
         <th>next ε</th><th>δ sel. spent</th><th>δ sel. left</th><th>charges</th></tr>\n",
    );
    for t in tables {
        let _ = write!(
            h,
            "<tr><td><a href=\"#{}\">{}</a></td>",
            anchor(&t.key),
            esc(&t.name)
        );
        match (&t.row, &t.policy) {
            (Some(b), Some(p)) => {
                let used = b.native.used_share;
                let _ = write!(
                    h,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td>",
                    display::budget(b.epsilon),
                    display::budget(b.delta),
                    esc(&in_force(p)),
                    esc(&b.filter.to_string()),
                    display::percent(used),
                    share_bar(used, b),
                    num(b.remaining, Round::Down),
                    num(b.delta_spent, Round::Up),
                    num(b.delta_left, Round::Down),
                );
            }
            // Made public after charges: the guarantee it had; nothing is in force or left.
            _ if t.was_private.is_some() => {
                let (e, d) = t.was_private.unwrap_or_default();
                let _ = write!(
                    h,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td><td>now public</td>{}",
                    display::budget(e),
                    display::budget(d),
                    "<td>—</td>".repeat(6)
                );
            }
            // No budget: a key charged without a recorded policy.
            _ => h.push_str(&"<td>—</td>".repeat(9)),
        }
        let _ = writeln!(h, "<td class=\"n\">{}</td></tr>", t.rows.len());
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

/// The budget in force: `ε 5, δ 1e-6` (what is left is measured against it), as the owner
/// wrote it ([`display::budget`], as the guarantee; round 47, review "newuser2", C).
fn in_force(p: &TablePolicy) -> String {
    format!(
        "ε {}, δ {}",
        display::budget(p.budget.epsilon),
        display::budget(p.budget.delta)
    )
}

/// A small horizontal bar: the share of the budget left (millionths), with its percentage
/// (`< 0.0001%` while less than a millionth is left: [`display::percent_left`]).
fn share_bar(used_share: u64, b: &BudgetRow) -> String {
    let left = SHARE_SCALE.saturating_sub(used_share);
    let w = 120.0;
    let pct = esc(&display::percent_left(
        used_share,
        b.native.used,
        b.native.budget,
    ));
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"190\" height=\"14\" \
         role=\"img\" aria-label=\"{pct} left\"><rect x=\"0\" y=\"1\" width=\"{w}\" \
         height=\"12\" fill=\"#eee\" stroke=\"#999\"/><rect x=\"0\" y=\"1\" width=\"{:.1}\" \
         height=\"12\" fill=\"#4a8\"/><text x=\"{}\" y=\"11\">{pct}</text></svg>",
        left as f64 / SHARE_SCALE as f64 * w,
        w + 6.0,
    )
}

fn table_section(h: &mut String, t: &TableHistory) {
    let _ = write!(
        h,
        "<h2 id=\"{}\">Table {}</h2>\n<p>Key <code>{}</code>; ",
        anchor(&t.key),
        esc(&t.name),
        esc(&t.key.to_string()),
    );
    match (&t.row, &t.policy) {
        (Some(b), Some(p)) => {
            let used = b.native.used_share;
            // Used up, the budget down, apart where six digits would not keep them apart
            // (round 47, review "newuser2", B).
            let (used_n, budget_n) = display::used_of(b.native.used, b.native.budget);
            let _ = writeln!(
                h,
                "budget ε {} at δ {} (the guarantee: the largest budget the table has had in \
                 force); in force now {}, {} filter: used {} {used_n} of {budget_n} ({} used, \
                 {} left); one more default query could use ε ≤ {}; δ of partition selection \
                 spent {}, {} left ({} charges).</p>",
                display::budget(b.epsilon),
                display::budget(b.delta),
                esc(&in_force(p)),
                esc(&b.filter.to_string()),
                esc(&b.native.unit),
                display::percent(used),
                esc(&display::percent_left(used, b.native.used, b.native.budget)),
                num(b.remaining, Round::Down),
                num(b.delta_spent, Round::Up),
                num(b.delta_left, Round::Down),
                t.rows.len()
            );
        }
        _ if t.was_private.is_some() => {
            let (e, d) = t.was_private.unwrap_or_default();
            let _ = writeln!(
                h,
                "now public: the data owner made the table public after these charges, which \
                 were made while it was private, under a budget of ε {} at δ {} at most (the \
                 guarantee: the largest budget it had in force). Nothing is in force or left \
                 now, so no share is shown ({} charges).</p>",
                display::budget(e),
                display::budget(d),
                t.rows.len()
            );
        }
        _ => {
            let _ = writeln!(
                h,
                "no policy recorded in the ledger (a session's own table: its policy lived in \
                 that session's memory), so no budget or share is shown ({} charges).</p>",
                t.rows.len()
            );
        }
    }
    if t.rows.is_empty() {
        h.push_str("<p>No charge yet.</p>\n");
        return;
    }
    if t.row.is_some() {
        h.push_str("<h3>Share of the budget used over time</h3>\n");
        h.push_str(&over_time(t));
    }
    // By analyst and by function: sums of the charges' shares (and costs in the unit).
    let mut by_analyst: BTreeMap<&str, Sum> = BTreeMap::new();
    let mut by_function: BTreeMap<String, Sum> = BTreeMap::new();
    for r in &t.rows {
        let (share, main) = r.cost.map_or((0, 0.0), |c| (c.share, c.main));
        by_analyst
            .entry(r.analyst.as_str())
            .or_default()
            .add(share, main);
        if r.functions.is_empty() {
            by_function
                .entry("(other)".into())
                .or_default()
                .add(share, main);
        }
        let n = r.functions.len().max(1) as f64;
        for (f, part) in r.functions.iter().zip(split(share, r.functions.len())) {
            by_function
                .entry(f.clone())
                .or_default()
                .add(part, main / n);
        }
    }
    let unit = t.row.as_ref().map(|b| b.native.unit.clone());
    h.push_str("<h3>By analyst</h3>\n");
    h.push_str(&bars(
        "analyst",
        "charges",
        unit.as_deref(),
        by_analyst.iter().map(|(k, v)| (k.to_string(), *v)),
    ));
    h.push_str("<h3>By function</h3>\n");
    h.push_str(&bars(
        "function",
        "calls",
        unit.as_deref(),
        by_function.iter().map(|(k, v)| (k.clone(), *v)),
    ));
    let _ = writeln!(
        h,
        "<h3>Charges</h3>\n<table>\n<tr><th>seq</th><th>time (UTC)</th><th>analyst</th>\
         <th>requests</th><th>cost ({})</th><th>share</th><th>used after</th>\
         <th>δ sel.</th><th>query</th></tr>",
        esc(unit.as_deref().unwrap_or("—"))
    );
    for r in &t.rows {
        let requests = if r.requests.is_empty() {
            r.functions.join(", ")
        } else {
            r.requests.join(", ")
        };
        let (cost, share, after, delta) = match r.cost {
            Some(c) => (
                num(c.main, Round::Up),
                display::percent_of(c.share, c.main),
                display::percent(c.used_share),
                num(c.delta, Round::Up),
            ),
            None => ("—".into(), "—".into(), "—".into(), "—".into()),
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"q\"><code>{}</code></td></tr>",
            r.seq,
            esc(&r.time),
            esc(&r.analyst),
            esc(&requests),
            cost,
            share,
            after,
            delta,
            esc(&r.query)
        );
    }
    h.push_str("</table>\n");
}

/// `share` split evenly into `n` parts in whole millionths, the remainder to the first parts:
/// they add up to `share`.
fn split(share: u64, n: usize) -> impl Iterator<Item = u64> {
    let n = n.max(1) as u64;
    (0..n).map(move |i| share / n + u64::from(i < share % n))
}

/// A sum of charges: their number, their shares (millionths) and their costs in the unit.
#[derive(Clone, Copy, Debug, Default)]
struct Sum {
    n: u64,
    share: u64,
    main: f64,
}

impl Sum {
    fn add(&mut self, share: u64, main: f64) {
        self.n += 1;
        self.share += share;
        self.main += main;
    }
}

/// A step chart of the share of the budget used after each charge against its time, with the
/// budget (100%) dashed.
fn over_time(t: &TableHistory) -> String {
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
    // Shares are at most the whole budget.
    let ymax = SHARE_SCALE as f64 * 1.05;
    let px = |x: f64| l + (x - x0) / span * (w - l - r);
    let py = |y: f64| top + (1.0 - y / ymax) * (ht - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{ht}\" \
         viewBox=\"0 0 {w} {ht}\" role=\"img\" aria-label=\"share of the budget used over \
         time\">\n<rect x=\"{l}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" \
         stroke=\"#bbb\"/>\n",
        w - l - r,
        ht - top - bottom
    );
    for i in 0..=4u64 {
        let y = (SHARE_SCALE / 4 * i) as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            w - r,
            py(y),
            py(y),
            l - 4.0,
            py(y) + 4.0,
            display::percent(SHARE_SCALE / 4 * i)
        );
    }
    let full = SHARE_SCALE as f64;
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#c33\" \
         stroke-dasharray=\"6 4\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" \
         fill=\"#c33\">budget in force</text>",
        w - r,
        py(full),
        py(full),
        w - r - 4.0,
        py(full) - 4.0,
    );
    let mut prev = py(0.0);
    let mut d = format!("M{:.1},{prev:.1}", px(x0));
    for (x, row) in xs.iter().zip(&t.rows) {
        if let Some(c) = row.cost {
            let y = py(c.used_share as f64);
            let _ = write!(d, " L{:.1},{prev:.1} L{:.1},{y:.1}", px(*x), px(*x));
            prev = y;
        }
    }
    let _ = writeln!(
        s,
        "<path d=\"{d}\" fill=\"none\" stroke=\"#2a6\" stroke-width=\"2\"/>"
    );
    for (x, row) in xs.iter().zip(&t.rows) {
        if let Some(c) = row.cost {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#2a6\"><title>#{} {}: {} \
                 used</title></circle>",
                px(*x),
                py(c.used_share as f64),
                row.seq,
                esc(&row.time),
                display::percent(c.used_share)
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

/// A table with one horizontal bar per row: (label, sum of its charges), the bar the share.
fn bars(
    what: &str,
    count: &str,
    unit: Option<&str>,
    rows: impl Iterator<Item = (String, Sum)>,
) -> String {
    let rows: Vec<(String, Sum)> = rows.collect();
    let max = rows.iter().map(|(_, s)| s.share).max().unwrap_or(0);
    let mut s = format!(
        "<table>\n<tr><th>{what}</th><th>{count}</th><th>cost ({}, sum)</th>\
         <th>share of the budget (sum)</th><th></th></tr>\n",
        esc(unit.unwrap_or("—"))
    );
    for (k, sum) in rows {
        let wpx = if max > 0 {
            sum.share as f64 / max as f64 * 240.0
        } else {
            0.0
        };
        let (cost, share) = if unit.is_some() {
            (
                num(sum.main, Round::Up),
                display::percent_of(sum.share, sum.main),
            )
        } else {
            ("—".into(), "—".into())
        };
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{cost}</td>\
             <td class=\"n\">{share}</td><td><svg xmlns=\"http://www.w3.org/2000/svg\" \
             width=\"250\" height=\"12\"><rect x=\"0\" y=\"1\" width=\"{wpx:.1}\" \
             height=\"10\" fill=\"#58a\"/></svg></td></tr>",
            esc(&k),
            sum.n,
        );
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpfusion::dpfusion_udfs::privacy::Event;

    /// Round 47 (review "newuser", finding 1): a charge's share is the difference of the running
    /// shares under the policy in force, so the shares of the charges add up exactly to the
    /// share the filter gives their sum (SHOW BUDGET's used_pct), and so do the even splits of
    /// the by-function view; a charge of the same events costs the same in the unit.
    #[test]
    fn the_shares_of_the_charges_and_their_splits_add_up_to_the_share_used() {
        let policy: TablePolicy = serde_json::from_value(serde_json::json!({
            "key": "demo:t", "name": "t", "visibility": "private",
            "neighbours": "add_remove", "public_columns": [],
            "budget": { "epsilon": 1.0, "delta": 1e-6 },
        }))
        .unwrap();
        let f = policy.compiled_filter().unwrap();
        let charges: Vec<(LedgerEntry, LedgerTable)> = (0..7)
            .map(|i| {
                let t = LedgerTable {
                    name: "t".into(),
                    key: policy.key.clone(),
                    epsilon: 0.0,
                    delta: 0.0,
                    events: vec![Event::Gaussian {
                        mu: 0.05 + 0.01 * i as f64,
                    }],
                    requests: vec![],
                    native: None,
                };
                let e = LedgerEntry {
                    seq: i,
                    time: String::new(),
                    query: "SELECT dp_count(x, 0.1), dp_sum(y, 0, 1, 0.1) FROM t".into(),
                    query_sha256: None,
                    query_bytes: None,
                    tables: vec![],
                    analyst: None,
                };
                (e, t)
            })
            .collect();
        let all: Vec<Event> = charges.iter().flat_map(|(_, t)| t.events.clone()).collect();
        let rows = history(Some(&f), charges);
        let used = f.share(&f.usage(&all));
        assert!(used > 0);
        let costs: Vec<Cost> = rows.iter().map(|r| r.cost.unwrap()).collect();
        assert_eq!(costs.iter().map(|c| c.share).sum::<u64>(), used);
        assert_eq!(costs.last().unwrap().used_share, used);
        assert_eq!(rows[0].functions, ["dp_count", "dp_sum"]);
        for c in &costs {
            assert_eq!(split(c.share, 2).sum::<u64>(), c.share);
            assert_eq!(split(c.share, 3).sum::<u64>(), c.share);
        }
        assert_eq!(split(7, 3).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!(split(5, 0).collect::<Vec<_>>(), [5]);
        // Without a filter (no policy recorded): no cost, no share.
        assert!(history(None, vec![]).is_empty());
    }

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
