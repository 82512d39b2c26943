//! The interactive REPL (rustyline): multi-line statements ending with `;`, history, completion of
//! functions, tables and columns, keyword highlighting, meta-commands, and the remaining budget of
//! the tables used last in the prompt.
pub mod format;
pub mod helper;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use datafusion::error::DataFusionError;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Config, Editor};

use crate::session::{PrivateSession, QueryResult};
use crate::statements::{budget_batch, error_block, ledger_batch, receipt_line};
use format::{OutputFormat, render};
use helper::SqlHelper;

/// The `\?` text.
pub const META_HELP: &str = "\
Statements end with ';' and may span several lines.
  \\budget           per private table: budget, share used and left, next query's ε, δ (= SHOW BUDGET)
  \\ledger           every charge so far, oldest first (= SELECT * FROM dp_ledger())
  \\explain SQL      what SQL would cost and whether it would be admitted (= EXPLAIN PRIVACY)
  \\d [TABLE]        the tables, or one table: columns, visibility, neighbours, budget
  \\h [FUNCTION]     the DP aggregates, or one function's documentation (= HELP [FUNCTION])
  \\format FORMAT    table, csv or json
  \\timing           show how long each statement took (toggle)
  \\?                this help
  \\q                quit (or Ctrl-D)
Ctrl-C cancels the current input, or the running query (a query already charged stays charged).";

/// Prints one statement's result in `format` (stdout) and, unless `quiet`, its charge receipt
/// (stderr, whatever the format, so that stdout stays parseable). A statement with no rows to
/// show (`CREATE TABLE ... AS SELECT <DP query>`) still prints its receipt.
pub fn print_result(r: &QueryResult, format: OutputFormat, quiet: bool) -> Result<(), String> {
    clear_progress();
    let mut failed = None;
    if !(r.schema.fields().is_empty() && r.batches.is_empty()) {
        // A charged release always reaches the analyst: if the format cannot show it, JSON
        // can (every Arrow type has a JSON form).
        let s = render(&r.batches, &r.schema, format)
            .or_else(|e| {
                render(&r.batches, &r.schema, OutputFormat::Json).map_err(|_| e.to_string())
            })
            .unwrap_or_else(|e| {
                failed = Some(e);
                String::new()
            });
        if failed.is_none() {
            out(&s);
        }
    }
    if !quiet && let Some(rcpt) = &r.receipt {
        eprintln!("{}", receipt_line(rcpt));
    }
    match failed {
        Some(e) => Err(format!("the result cannot be printed: {e}")),
        None => Ok(()),
    }
}

/// Prints a line to stdout, made safe for a terminal ([`format::terminal_safe`]); a closed pipe
/// (`dpfusion … | head`) ends the program quietly.
pub fn out(s: &str) {
    use std::io::Write;
    let s = format::terminal_safe(s, format::Escape::Text);
    let mut o = std::io::stdout().lock();
    if let Err(e) = writeln!(o, "{s}").and_then(|_| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("dpfusion: cannot write the output: {e}");
    }
}

struct Repl {
    session: Arc<PrivateSession>,
    format: OutputFormat,
    quiet: bool,
    timing: bool,
    last_tables: Vec<String>,
}

/// What the user asked for with one input.
enum Flow {
    Continue,
    Quit,
}

impl Repl {
    /// `dpfusion[salaries 97.5% left, ε ≤ 4.1]> `: per table the last query used, the share
    /// of its budget left and the largest ε one default query could still use
    /// (docs/ACCOUNTING.md, "What the numbers mean"), and `δ 3e-7 left` for partition
    /// selection once any of it was spent.
    fn prompt(&self) -> String {
        if self.last_tables.is_empty() {
            return "dpfusion> ".to_string();
        }
        let rows = self.session.budget();
        let parts: Vec<String> = self
            .last_tables
            .iter()
            .filter_map(|t| rows.iter().find(|r| r.name == *t))
            .map(|r| {
                use crate::accounting::display::{Round, SHARE_SCALE, num, percent};
                let mut p = format!(
                    "{} {} left, ε ≤ {}",
                    r.name,
                    percent(SHARE_SCALE.saturating_sub(r.native.used_share)),
                    num(r.remaining, Round::Down)
                );
                if r.delta_spent > 0.0 {
                    p.push_str(&format!(" δ {} left", num(r.delta_left, Round::Down)));
                }
                p
            })
            .collect();
        if parts.is_empty() {
            "dpfusion> ".to_string()
        } else {
            format!("dpfusion[{}]> ", parts.join(", "))
        }
    }

    async fn run_sql(&mut self, sql: &str) {
        let start = Instant::now();
        // The query runs in its own task: a model fit is CPU work inside one poll of the query,
        // and Ctrl-C must still be seen while it runs.
        let session = self.session.clone();
        let text = sql.to_string();
        QUERY_RUNNING.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.session.take_last_receipt();
        let mut task = tokio::spawn(async move { session.sql(&text).await });
        let outcome = tokio::select! {
            r = &mut task => Some(r.unwrap_or_else(|_| {
                Err(datafusion::error::DataFusionError::External(Box::new(
                    crate::error::Error::ExecutionFailed,
                )))
            })),
            _ = tokio::signal::ctrl_c() => {
                // Stop a running model fit at its next iteration, and the scan with the task.
                dpfusion_udfs::progress::cancel_running();
                task.abort();
                // A poll under way on another worker finishes first (an admission included):
                // wait for it briefly, so that a charge made just now shows its receipt.
                let _ = tokio::time::timeout(std::time::Duration::from_millis(500), &mut task).await;
                None
            }
        };
        QUERY_RUNNING.store(false, std::sync::atomic::Ordering::SeqCst);
        clear_progress();
        match outcome {
            None => {
                eprintln!(
                    "query cancelled (if it was admitted, its charge stands: a failure or \
                     cancellation can depend on the data)"
                );
                // Admitted before the cancellation: its receipt, as for a finished query.
                if let Some(rcpt) = self.session.take_last_receipt() {
                    if !self.quiet {
                        eprintln!("{}", receipt_line(&rcpt));
                    }
                    self.last_tables = rcpt.tables.iter().map(|t| t.name.clone()).collect();
                }
            }
            Some(Ok(r)) => {
                if !r.tables.is_empty() {
                    self.last_tables = r.tables.clone();
                }
                if let Err(e) = print_result(&r, self.format, self.quiet) {
                    eprintln!("dpfusion: {e}");
                }
            }
            Some(Err(e)) => eprintln!("{}", error_block(sql, &e)),
        }
        if self.timing {
            eprintln!("Elapsed {:.3} s", start.elapsed().as_secs_f64());
        }
    }

    fn show_batch(&self, b: datafusion::error::Result<datafusion::arrow::array::RecordBatch>) {
        match b {
            Ok(b) => {
                let r = QueryResult {
                    schema: b.schema(),
                    batches: vec![b],
                    receipt: None,
                    tables: vec![],
                };
                if let Err(e) = print_result(&r, self.format, true) {
                    eprintln!("dpfusion: {e}");
                }
            }
            Err(e) => eprintln!("{}", error_block("", &e)),
        }
    }

    async fn meta(&mut self, line: &str) -> Flow {
        match Meta::parse(line, &mut self.format, &mut self.timing) {
            Meta::Quit => return Flow::Quit,
            Meta::Budget => self.show_batch(budget_batch(&self.session.budget())),
            Meta::Ledger => {
                // On screen the events (`profile`) are left out: `\format json` or
                // `SELECT * FROM dp_ledger()` show them.
                let b = self
                    .session
                    .ledger()
                    .and_then(|l| ledger_batch(&l, None))
                    .and_then(|b| {
                        if self.format != OutputFormat::Table {
                            return Ok(b);
                        }
                        let keep: Vec<usize> = (0..b.num_columns())
                            .filter(|&i| b.schema().field(i).name() != "profile")
                            .collect();
                        Ok(b.project(&keep)?)
                    });
                self.show_batch(b)
            }
            Meta::Explain(query) => self.run_sql(&format!("EXPLAIN PRIVACY {query}")).await,
            Meta::Describe(table) => println!("{}", describe(&self.session, table)),
            Meta::Done => {}
        }
        Flow::Continue
    }
}

/// A meta-command (`\budget`, `\d t`, …) that needs the backend. Both REPLs, the local one and
/// `--connect`'s, read their input through [`Meta::parse`]: only what they do with these differs.
pub enum Meta<'a> {
    Quit,
    Budget,
    Ledger,
    /// `\explain QUERY` (never empty).
    Explain(&'a str),
    /// `\d [TABLE]` (empty: every table).
    Describe(&'a str),
    /// Carried out already (`\?`, `\format`, `\timing`), or a mistake already reported.
    Done,
}

impl<'a> Meta<'a> {
    /// Parses one meta-command line, carrying out at once what needs no backend: `\?`,
    /// `\format` (on `format`), `\timing` (on `timing`), and the messages for mistakes.
    pub fn parse(line: &'a str, format: &mut OutputFormat, timing: &mut bool) -> Meta<'a> {
        let line = line.trim().trim_end_matches(';').trim();
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        match cmd {
            "\\q" | "\\quit" => return Meta::Quit,
            "\\budget" => return Meta::Budget,
            "\\ledger" => return Meta::Ledger,
            "\\d" => return Meta::Describe(arg),
            "\\explain" if !arg.is_empty() => return Meta::Explain(arg),
            "\\explain" => {
                eprintln!("\\explain needs a query, e.g. \\explain SELECT dp_count(x, 0.1) FROM t")
            }
            "\\?" | "\\help" if arg.is_empty() => println!("{META_HELP}"),
            // `\h` lists the DP aggregates, `\h NAME` documents one (statements::help).
            "\\h" | "\\help" => println!("{}", crate::statements::help::help_text(arg)),
            "\\format" => match arg.parse::<OutputFormat>() {
                Ok(f) => {
                    *format = f;
                    println!("output format: {}", arg.to_ascii_lowercase());
                }
                Err(e) => eprintln!("{e}"),
            },
            "\\timing" => {
                *timing = !*timing;
                println!("timing is {}", if *timing { "on" } else { "off" });
            }
            other => eprintln!("unknown command {other}: \\? lists the commands"),
        }
        Meta::Done
    }
}

/// `\d` and `\d TABLE`: what a user needs to know to query a table privately.
pub fn describe(session: &PrivateSession, table: &str) -> String {
    let tables = session.tables();
    let budget = session.budget();
    let policy = |name: &str, private: bool| -> String {
        if !private {
            return "public".to_string();
        }
        match budget.iter().find(|b| b.name == name) {
            Some(b) => {
                use crate::accounting::display::{Round, SHARE_SCALE, n6, num, percent};
                format!(
                    "private, budget ε {} at δ {}; {} filter, {} used, {} left (one more query \
                     could use ε ≤ {}); partition-selection δ {} spent, {} left",
                    n6(b.epsilon),
                    n6(b.delta),
                    b.filter,
                    percent(b.native.used_share),
                    percent(SHARE_SCALE.saturating_sub(b.native.used_share)),
                    num(b.remaining, Round::Down),
                    num(b.delta_spent, Round::Up),
                    num(b.delta_left, Round::Down)
                )
            }
            None => "private".to_string(),
        }
    };
    let neighbours = |n: crate::accounting::Neighbours| match n {
        crate::accounting::Neighbours::AddRemove => "add_remove",
        crate::accounting::Neighbours::Replace => "replace",
    };
    if table.is_empty() {
        if tables.is_empty() {
            return "no tables: the data owner declares them (dpfusion --catalog FILE, or \
                    --private NAME=PATH in single-user mode)"
                .to_string();
        }
        let mut out = String::from("Tables:\n");
        for (name, info, schema) in &tables {
            out.push_str(&format!(
                "  {name:<12} {} columns; {}{}\n",
                schema.fields().len(),
                policy(name, info.private),
                match (&info.unit, info.private) {
                    (Some(u), true) => format!("; privacy unit {}", u.column),
                    (None, true) => format!("; neighbours {}", neighbours(info.neighbours)),
                    _ => String::new(),
                }
            ));
        }
        out.push_str("\\d TABLE shows its columns.");
        return out;
    }
    let want = table.to_ascii_lowercase();
    let Some((name, info, schema)) = tables.iter().find(|(n, _, _)| *n == want) else {
        return format!(
            "no table '{table}' (tables: {})",
            tables
                .iter()
                .map(|t| t.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let mut out = format!("Table {name}: {}\n", policy(name, info.private));
    if let Some((p, by)) = session
        .policies()
        .into_iter()
        .find(|(p, _)| p.name == *name)
    {
        let who = match by.as_str() {
            "owner" => "the data owner",
            "analyst" => "analyst SQL",
            _ => "a CREATE TABLE AS (a DP result)",
        };
        out.push_str(&format!(
            "  registered by {who}: {}{}\n",
            p.key,
            p.format
                .as_deref()
                .map(|f| format!(", read as {f}"))
                .unwrap_or_default()
        ));
        if by == "owner" && p.key.as_str().starts_with('/') {
            out.push_str("  schema: pinned in the ledger at the owner's first registration\n");
        }
    }
    if let (Some(u), true) = (&info.unit, info.private) {
        out.push_str(&format!(
            "  privacy unit: {} (domain {}): a neighbour adds or removes a unit with all its \
             rows; a query bounds each unit to {} group(s) and {} row(s) per group (SET \
             dpfusion.max_groups_contributed / max_rows_contributed)\n",
            u.column, u.domain, u.max_groups_contributed, u.max_rows_contributed
        ));
    } else if info.private {
        out.push_str(&format!(
            "  neighbours: {} ({})\n",
            neighbours(info.neighbours),
            match info.neighbours {
                crate::accounting::Neighbours::AddRemove =>
                    "a neighbour adds or removes one row; the row count is private",
                crate::accounting::Neighbours::Replace =>
                    "a neighbour replaces one row; the row count is public",
            }
        ));
        out.push_str(&format!(
            "  public columns: {}\n",
            if info.public_columns.is_empty() {
                "none".to_string()
            } else {
                info.public_columns.join(", ")
            }
        ));
        out.push_str(
            "  read it only through DP aggregates (dp_count, dp_sum, dp_mean, ...); \
             GROUP BY on a private column adds partition selection\n",
        );
    }
    out.push_str("  columns:\n");
    for f in schema.fields() {
        let marker = if !info.private {
            ""
        } else if info.is_public_column(f.name()) {
            "  (public)"
        } else if info.unit.as_ref().is_some_and(|u| &u.column == f.name()) {
            "  (private; the privacy unit)"
        } else {
            "  (private)"
        };
        out.push_str(&format!("    {:<14} {}{marker}\n", f.name(), f.data_type()));
    }
    if let Some(note) = crate::demo::describe_demo(name, &info.key) {
        out.push_str(&format!("  about: {note}\n"));
    }
    out.trim_end().to_string()
}

/// On a terminal (stderr), long model fits report "iterations done/total" on one line that is
/// erased when the fit ends; nothing is printed when output is piped.
static PROGRESS_SHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// A query of the REPL is running: progress is shown only then (a cancelled fit may report once
/// more before it sees the cancellation; that report must not land on the prompt).
static QUERY_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Clears a progress line left on the terminal (a fit that stopped before its last planned
/// iteration, or a cancelled one), so that what follows starts on a clean line.
pub fn clear_progress() {
    if PROGRESS_SHOWN.swap(false, std::sync::atomic::Ordering::SeqCst) {
        use std::io::Write;
        let mut e = std::io::stderr();
        let _ = write!(e, "\r\x1b[2K");
        let _ = e.flush();
    }
}

pub fn install_progress() {
    if std::io::stderr().is_terminal() {
        // Long model fits report "iterations done/total" on one line of the terminal; nothing is
        // printed when output is piped.
        dpfusion_udfs::progress::set_reporter(Some(std::sync::Arc::new(
            |p: &dpfusion_udfs::progress::Progress| {
                use std::io::Write;
                if !QUERY_RUNNING.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let mut e = std::io::stderr();
                if p.done >= p.total {
                    let _ = write!(e, "\r\x1b[2K");
                    PROGRESS_SHOWN.store(false, std::sync::atomic::Ordering::SeqCst);
                } else {
                    let _ = write!(
                        e,
                        "\r\x1b[2K{}: iteration {}/{}",
                        p.function, p.done, p.total
                    );
                    PROGRESS_SHOWN.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = e.flush();
            },
        )));
    }
}

/// The history file: `$DPFUSION_HISTORY`, else `~/.dpfusion_history`, else `.dpfusion/history`.
fn history_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DPFUSION_HISTORY") {
        return PathBuf::from(p);
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".dpfusion_history"),
        None => PathBuf::from(".dpfusion/history"),
    }
}

/// Runs the interactive REPL until `\q` or Ctrl-D.
pub async fn run_repl(session: PrivateSession, format: OutputFormat, quiet: bool) -> ExitCode {
    let config = Config::builder()
        .auto_add_history(false)
        .completion_type(rustyline::CompletionType::List)
        .build();
    let mut rl: Editor<SqlHelper, DefaultHistory> = match Editor::with_config(config) {
        Ok(rl) => rl,
        Err(e) => {
            eprintln!("dpfusion: cannot start the line editor: {e}");
            return ExitCode::from(1);
        }
    };
    install_progress();
    let helper = SqlHelper::new(std::io::stdout().is_terminal());
    helper.refresh(&session);
    rl.set_helper(Some(helper));
    let history = history_path();
    let _ = rl.load_history(&history);
    let mut repl = Repl {
        session: Arc::new(session),
        format,
        quiet,
        timing: false,
        last_tables: vec![],
    };
    println!(
        "dpfusion {} — differentially private SQL. \\? for help, \\d for tables, \\q to quit.",
        env!("CARGO_PKG_VERSION")
    );
    // The policy in force, as the data owner set it (docs/CATALOG.md).
    println!("{}", describe(&repl.session, ""));
    loop {
        let prompt = repl.prompt();
        let read = tokio::task::block_in_place(|| rl.readline(&prompt));
        match read {
            Ok(input) => {
                let text = input.trim();
                if text.is_empty() {
                    continue;
                }
                let _ = rl.add_history_entry(text);
                if text.starts_with('\\') {
                    if let Flow::Quit = repl.meta(text).await {
                        break;
                    }
                } else {
                    for stmt in crate::cli::split_statements(text) {
                        repl.run_sql(&stmt).await;
                    }
                }
                if let Some(h) = rl.helper() {
                    h.refresh(&repl.session);
                }
            }
            Err(ReadlineError::Interrupted) => {
                println!("^C");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("dpfusion: {e}");
                break;
            }
        }
    }
    if let Some(dir) = history.parent()
        && !dir.as_os_str().is_empty()
    {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = rl.save_history(&history);
    ExitCode::SUCCESS
}

#[allow(dead_code)]
fn _unused(_: DataFusionError) {}
