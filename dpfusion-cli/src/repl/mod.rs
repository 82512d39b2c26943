//! The interactive REPL (rustyline): multi-line statements ending with `;`, history, completion of
//! functions, tables and columns, keyword highlighting, meta-commands, and the remaining budget of
//! the tables used last in the prompt.
//!
//! Written once over a [`Backend`]: a local [`PrivateSession`](dpfusion::PrivateSession)
//! ([`local::Local`]) or a `dpfusion serve` reached with `--connect` ([`remote::Remote`]). The
//! `-c`/`-f` scripts ([`crate::cli::run_scripts`]) run through the same backends, and a script's
//! meta-command line (`\budget`, `\d t`) through the same [`Repl::meta`] as typed or piped input
//! (round 51, review "newuser": it reached the SQL parser).
pub mod format;
pub mod helper;
pub mod local;
pub mod remote;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Config, Editor};

use dpfusion::accounting::display::{Round, num, percent};
use format::{Escape, OutputFormat, render, terminal_safe};
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

/// One statement's answer, from either backend.
pub struct Answer {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// The charge receipt's line (`charged people ε …`), if the statement was charged.
    pub receipt: Option<String>,
    /// The tables the statement read (the prompt shows their budget).
    pub tables: Vec<String>,
}

/// The columns of `dp_ledger()` that `\ledger` shows on screen: all but the events
/// (`profile`), which `\format json` or `SELECT * FROM dp_ledger()` show.
pub(crate) fn ledger_on_screen(schema: &SchemaRef) -> Vec<usize> {
    (0..schema.fields().len())
        .filter(|&i| schema.field(i).name() != "profile")
        .collect()
}

impl Answer {
    /// A table to show (no receipt, no tables read).
    pub fn table(b: RecordBatch) -> Self {
        Answer {
            schema: b.schema(),
            batches: vec![b],
            receipt: None,
            tables: vec![],
        }
    }
}

/// What a statement admitted before it stopped (failed, or cancelled) was charged: the charge
/// stands (round 49, review composition F4).
pub struct Charged {
    /// Its receipt's line, as a finished statement's (`charged people: …`).
    pub receipt: String,
    /// The tables it charged, as it read them (the prompt shows their budget).
    pub tables: Vec<String>,
}

/// What a statement ([`Backend::sql_outcome`], [`Backend::sql_interruptible`]) did.
pub enum Outcome {
    Done(Result<Answer, String>),
    /// It failed after its admission: the error, and what it was charged (round 49, review
    /// composition F4: only the fixed message was shown, and the prompt kept the tables of the
    /// statement before).
    Failed(String, Charged),
    /// Ctrl-C cancelled it; if it had been admitted before, what it was charged.
    Cancelled(Option<Charged>),
}

/// One private table's budget, as the prompt and `\d` show it.
pub struct TableBudget {
    pub name: String,
    /// The budget's ε.
    pub epsilon: f64,
    /// The share of the budget left, in millionths
    /// ([`SHARE_SCALE`](dpfusion::accounting::display::SHARE_SCALE)).
    pub left_share: u64,
    /// The largest ε one default query could still use.
    pub remaining: f64,
    /// Partition selection's δ spent and left.
    pub delta_spent: f64,
    pub delta_left: f64,
}

/// Where the statements run: a local session or a server. The REPL and the scripts are written
/// once over this.
#[allow(async_fn_in_trait)] // used with concrete types inside this crate; never `dyn`
pub trait Backend {
    /// The banner's words after the version (`differentially private SQL`, `connected to URL`).
    fn greeting(&self) -> String;
    /// Runs one statement; an error is the message to show (see [`error_text`]).
    async fn sql(&mut self, sql: &str) -> Result<Answer, String>;
    /// As [`Backend::sql`], with what a statement that failed after its admission was charged
    /// ([`Outcome::Failed`]) where the backend knows it (the `-c`/`-f` scripts). The default
    /// knows none.
    async fn sql_outcome(&mut self, sql: &str) -> Outcome {
        Outcome::Done(self.sql(sql).await)
    }
    /// As [`Backend::sql_outcome`], but Ctrl-C cancels it (a charge already made stands).
    async fn sql_interruptible(&mut self, sql: &str) -> Outcome;
    /// The private tables' budgets (for the prompt and `\d`).
    async fn budget(&mut self) -> Vec<TableBudget>;
    /// `\budget`: the `SHOW BUDGET` table.
    async fn budget_table(&mut self) -> Result<Answer, String>;
    /// `\ledger`: the charges, as `format` shows them best.
    async fn ledger_table(&mut self, format: OutputFormat) -> Result<Answer, String>;
    /// The tables and their schemas (for completion).
    async fn tables(&mut self) -> Vec<(String, SchemaRef)>;
    /// `\d` (empty `table`: every table) and `\d TABLE`; an error for a table that does not
    /// exist (so that a script's `\d nope` fails, as its SQL would).
    async fn describe(&mut self, table: &str) -> Result<String, String>;
}

/// Prints one statement's answer in `format` (stdout) and, unless `quiet`, its charge receipt
/// (stderr, whatever the format, so that stdout stays parseable). A statement with no rows to
/// show (`CREATE TABLE ... AS SELECT <DP query>`) still prints its receipt.
pub fn print_answer(r: &Answer, format: OutputFormat, quiet: bool) -> Result<(), String> {
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
    if !quiet && let Some(line) = &r.receipt {
        eprintln!("{}", terminal_safe(line, Escape::Text));
    }
    match failed {
        Some(e) => Err(format!(
            "the result cannot be printed: {}",
            terminal_safe(&e, Escape::Text)
        )),
        None => Ok(()),
    }
}

/// A DataFusion error's message as the analyst reads it (without DataFusion's prefixes).
pub fn error_message(e: &datafusion::error::DataFusionError) -> String {
    let msg = e.to_string();
    msg.strip_prefix("Error during planning: ")
        .or_else(|| msg.strip_prefix("External error: "))
        .unwrap_or(&msg)
        .to_string()
}

/// A refusal or error as one readable block: `ERROR in: <first line of the statement>` then the
/// message (what, why, what to do; never a stack trace), both made safe to print on a terminal
/// ([`terminal_safe`]: a message can quote text chosen by someone else). An unknown table gets
/// a pointer to the tables there are ([`unknown_table_hint`]).
pub fn error_text(stmt: &str, msg: &str) -> String {
    let msg = unknown_table_hint(msg);
    let first = stmt.lines().next().unwrap_or("").trim();
    let shown = if first.chars().count() > 70 {
        format!("{}…", first.chars().take(70).collect::<String>())
    } else {
        first.to_string()
    };
    format!(
        "ERROR in: {}\n  {}",
        terminal_safe(&shown, Escape::Cell),
        terminal_safe(&msg, Escape::Text)
    )
}

/// DataFusion's message for a table that does not exist, `table 'datafusion.public.t' not
/// found`, as an analyst reads it: the name as written (without the default catalog and schema,
/// which the analyst never wrote) and where to find the tables (round 51, review "newuser": no
/// pointer). The whole message must be DataFusion's: anything else is shown as it is. Local and
/// `--connect` sessions alike (the server sends DataFusion's text).
pub fn unknown_table_hint(msg: &str) -> std::borrow::Cow<'_, str> {
    match msg
        .strip_prefix("table '")
        .and_then(|m| m.strip_suffix("' not found"))
    {
        Some(name) if !name.contains('\'') => {
            let name = name
                .strip_prefix("datafusion.public.")
                .or_else(|| name.strip_prefix("datafusion."))
                .unwrap_or(name);
            format!("table '{name}' not found (SHOW TABLES lists the tables you can read)").into()
        }
        _ => msg.into(),
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

struct Repl<B> {
    backend: B,
    format: OutputFormat,
    quiet: bool,
    timing: bool,
    last_tables: Vec<String>,
}

/// What a meta-command line leaves to its caller, the REPL or a script (round 51).
enum MetaDone {
    /// Carried out: its answer, if any, is shown.
    Shown,
    /// It failed: the error block to show ([`error_text`]).
    Failed(String),
    /// `\explain QUERY`: this statement is to run as any other.
    Sql(String),
    /// `\q`.
    Quit,
}

/// Whether an input line (or a script's statement) is a meta-command: it starts with `\`. The
/// REPL, its line editor and the `-c`/`-f` scripts decide with this (round 51).
pub fn is_meta(text: &str) -> bool {
    text.trim_start().starts_with('\\')
}

impl<B: Backend> Repl<B> {
    fn new(backend: B, format: OutputFormat, quiet: bool) -> Self {
        Repl {
            backend,
            format,
            quiet,
            timing: false,
            last_tables: vec![],
        }
    }

    /// `dpfusion[salaries 97.5% left, ε ≤ 4.1]> `: per table the last query used, the share
    /// of its budget left and the largest ε one default query could still use
    /// (docs/ACCOUNTING.md, "What the numbers mean"), and `δ 3e-7 left` for partition
    /// selection once any of it was spent.
    async fn prompt(&mut self) -> String {
        if self.last_tables.is_empty() {
            return "dpfusion> ".to_string();
        }
        let rows = self.backend.budget().await;
        let parts: Vec<String> = self
            .last_tables
            .iter()
            .filter_map(|t| rows.iter().find(|r| r.name == *t))
            .map(|r| {
                let mut p = format!(
                    "{} {} left, ε ≤ {}",
                    terminal_safe(&r.name, Escape::Cell),
                    percent(r.left_share),
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
        QUERY_RUNNING.store(true, std::sync::atomic::Ordering::SeqCst);
        let outcome = self.backend.sql_interruptible(sql).await;
        QUERY_RUNNING.store(false, std::sync::atomic::Ordering::SeqCst);
        clear_progress();
        match outcome {
            Outcome::Cancelled(admitted) => {
                eprintln!(
                    "query cancelled (if it was admitted, its charge stands: a failure or \
                     cancellation can depend on the data)"
                );
                // Admitted before the cancellation: its receipt, as for a finished query.
                if let Some(charged) = admitted {
                    self.charged(charged);
                }
            }
            // Failed after its admission: the error, then what it was charged (round 49).
            Outcome::Failed(e, charged) => {
                eprintln!("{}", error_text(sql, &e));
                self.charged(charged);
            }
            Outcome::Done(Ok(r)) => {
                if !r.tables.is_empty() {
                    self.last_tables = r.tables.clone();
                }
                if let Err(e) = print_answer(&r, self.format, self.quiet) {
                    eprintln!("dpfusion: {e}");
                }
            }
            Outcome::Done(Err(e)) => eprintln!("{}", error_text(sql, &e)),
        }
        if self.timing {
            eprintln!("Elapsed {:.3} s", start.elapsed().as_secs_f64());
        }
    }

    /// What a statement that stopped after its admission was charged: its receipt (unless
    /// quiet), and the prompt moves to its tables, as after a finished statement.
    fn charged(&mut self, charged: Charged) {
        if !self.quiet {
            eprintln!("{}", terminal_safe(&charged.receipt, Escape::Text));
        }
        if !charged.tables.is_empty() {
            self.last_tables = charged.tables;
        }
    }

    /// A meta-command's table (`\budget`, `\ledger`), shown as the REPL shows it (no receipt).
    fn show(&self, line: &str, b: Result<Answer, String>) -> MetaDone {
        match b.and_then(|r| print_answer(&r, self.format, true)) {
            Ok(()) => MetaDone::Shown,
            Err(e) => MetaDone::Failed(error_text(line, &e)),
        }
    }

    /// Carries out one meta-command line, typed, piped or in a `-c`/`-f` script alike.
    async fn meta(&mut self, line: &str) -> MetaDone {
        match Meta::parse(line, &mut self.format, &mut self.timing) {
            Meta::Quit => MetaDone::Quit,
            Meta::Budget => {
                let b = self.backend.budget_table().await;
                self.show(line, b)
            }
            Meta::Ledger => {
                let b = self.backend.ledger_table(self.format).await;
                self.show(line, b)
            }
            Meta::Explain(query) => MetaDone::Sql(format!("EXPLAIN PRIVACY {query}")),
            Meta::Describe(table) => match self.backend.describe(table).await {
                Ok(d) => {
                    out(&d);
                    MetaDone::Shown
                }
                Err(e) => MetaDone::Failed(error_text(line, &e)),
            },
            Meta::Mistake(e) => MetaDone::Failed(error_text(line, &e)),
            Meta::Done => MetaDone::Shown,
        }
    }

    /// One statement of a `-c`/`-f` script: a meta-command line as the REPL carries it out
    /// (round 51, review "newuser": `-c '\budget'` got the SQL parser's error), else SQL.
    async fn script_statement(&mut self, stmt: &str) -> crate::cli::Ran {
        use crate::cli::Ran;
        if !is_meta(stmt) {
            return self.script_sql(stmt).await;
        }
        match self.meta(stmt).await {
            MetaDone::Shown => Ran::Shown,
            MetaDone::Failed(block) => Ran::Failed(block),
            MetaDone::Sql(sql) => self.script_sql(&sql).await,
            MetaDone::Quit => Ran::Quit,
        }
    }

    /// One SQL statement of a script: its answer, or the error block, with what it was charged
    /// if it failed after its admission.
    async fn script_sql(&mut self, sql: &str) -> crate::cli::Ran {
        use crate::cli::Ran;
        let start = Instant::now();
        let outcome = self.backend.sql_outcome(sql).await;
        if self.timing {
            eprintln!("Elapsed {:.3} s", start.elapsed().as_secs_f64());
        }
        let (e, charged) = match outcome {
            Outcome::Done(Ok(r)) => {
                return match print_answer(&r, self.format, self.quiet) {
                    Ok(()) => Ran::Shown,
                    Err(e) => Ran::Unprintable(e),
                };
            }
            Outcome::Done(Err(e)) => (e, None),
            Outcome::Failed(e, charged) => (e, Some(charged)),
            Outcome::Cancelled(charged) => (
                "the statement was cancelled (if it was admitted, its charge stands)".to_string(),
                charged,
            ),
        };
        clear_progress();
        // Failed after its admission: the error, then what it was charged, as the REPL shows
        // them (round 49, review composition F4); the receipt unless quiet, as a finished
        // statement's.
        let mut block = error_text(sql, &e);
        if let Some(c) = charged.filter(|_| !self.quiet) {
            block.push('\n');
            block.push_str(&terminal_safe(&c.receipt, Escape::Text));
        }
        Ran::Failed(block)
    }
}

/// A meta-command (`\budget`, `\d t`, …) that needs the backend. The REPL (local or
/// `--connect`'s, typed or piped) and the `-c`/`-f` scripts read meta-commands through
/// [`Meta::parse`] and carry them out in [`Repl::meta`].
pub enum Meta<'a> {
    Quit,
    Budget,
    Ledger,
    /// `\explain QUERY` (never empty).
    Explain(&'a str),
    /// `\d [TABLE]` (empty: every table).
    Describe(&'a str),
    /// Carried out already (`\?`, `\format`, `\timing`).
    Done,
    /// A mistake (an unknown command, a bad format): what to tell the user. A script stops
    /// there, as at a failed statement.
    Mistake(String),
}

impl<'a> Meta<'a> {
    /// Parses one meta-command line, carrying out at once what needs no backend: `\?`,
    /// `\format` (on `format`), `\timing` (on `timing`).
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
                return Meta::Mistake(
                    "\\explain needs a query, e.g. \\explain SELECT dp_count(x, 0.1) FROM t".into(),
                );
            }
            "\\?" | "\\help" if arg.is_empty() => println!("{META_HELP}"),
            // `\h` lists the DP aggregates, `\h NAME` documents one (statements::help).
            "\\h" | "\\help" => println!("{}", dpfusion::statements::help::help_text(arg)),
            "\\format" => match arg.parse::<OutputFormat>() {
                Ok(f) => {
                    *format = f;
                    println!("output format: {}", arg.to_ascii_lowercase());
                }
                Err(e) => return Meta::Mistake(e),
            },
            "\\timing" => {
                *timing = !*timing;
                println!("timing is {}", if *timing { "on" } else { "off" });
            }
            other => {
                return Meta::Mistake(format!("unknown command {other}: \\? lists the commands"));
            }
        }
        Meta::Done
    }
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

/// Runs the interactive REPL on `backend` until `\q` or Ctrl-D.
pub async fn run_repl<B: Backend>(backend: B, format: OutputFormat, quiet: bool) -> ExitCode {
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
    let mut repl = Repl::new(backend, format, quiet);
    let helper = SqlHelper::new(std::io::stdout().is_terminal());
    helper.refresh_tables(&repl.backend.tables().await);
    rl.set_helper(Some(helper));
    let history = history_path();
    let _ = rl.load_history(&history);
    println!(
        "dpfusion {} — {}. \\? for help, \\d for tables, \\q to quit.",
        env!("CARGO_PKG_VERSION"),
        terminal_safe(&repl.backend.greeting(), Escape::Text)
    );
    // The policy in force, as the data owner set it (docs/CATALOG.md).
    let d = repl.backend.describe("").await.unwrap_or_else(|e| e);
    println!("{}", terminal_safe(&d, Escape::Text));
    loop {
        let prompt = repl.prompt().await;
        let read = tokio::task::block_in_place(|| rl.readline(&prompt));
        match read {
            Ok(input) => {
                let text = input.trim();
                if text.is_empty() {
                    continue;
                }
                let _ = rl.add_history_entry(text);
                if is_meta(text) {
                    match repl.meta(text).await {
                        MetaDone::Quit => break,
                        MetaDone::Sql(sql) => repl.run_sql(&sql).await,
                        MetaDone::Failed(block) => eprintln!("{block}"),
                        MetaDone::Shown => {}
                    }
                } else {
                    for stmt in crate::cli::split_statements(text) {
                        repl.run_sql(&stmt).await;
                    }
                }
                let tables = repl.backend.tables().await;
                if let Some(h) = rl.helper() {
                    h.refresh_tables(&tables);
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

/// Runs the `-c`/`-f` scripts (`cli.scripts`), or the REPL when there are none, on `backend`.
pub async fn run_on<B: Backend>(
    backend: B,
    scripts: &[crate::cli::Script],
    format: OutputFormat,
    quiet: bool,
) -> ExitCode {
    if scripts.is_empty() {
        return run_repl(backend, format, quiet).await;
    }
    install_progress();
    let mut repl = Repl::new(backend, format, quiet);
    crate::cli::run_scripts(scripts, async |stmt: &str| {
        repl.script_statement(stmt).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend whose statements end as `outcome` says, with the budget rows `rows`.
    struct Scripted {
        outcome: fn() -> Outcome,
        rows: Vec<(&'static str, u64)>,
    }

    impl Backend for Scripted {
        fn greeting(&self) -> String {
            String::new()
        }
        async fn sql(&mut self, _: &str) -> Result<Answer, String> {
            Err("not scripted".into())
        }
        async fn sql_outcome(&mut self, _: &str) -> Outcome {
            (self.outcome)()
        }
        async fn sql_interruptible(&mut self, _: &str) -> Outcome {
            (self.outcome)()
        }
        async fn budget(&mut self) -> Vec<TableBudget> {
            self.rows
                .iter()
                .map(|(name, left_share)| TableBudget {
                    name: name.to_string(),
                    epsilon: 1.0,
                    left_share: *left_share,
                    remaining: 0.5,
                    delta_spent: 0.0,
                    delta_left: 0.0,
                })
                .collect()
        }
        async fn budget_table(&mut self) -> Result<Answer, String> {
            Err(String::new())
        }
        async fn ledger_table(&mut self, _: OutputFormat) -> Result<Answer, String> {
            Err(String::new())
        }
        async fn tables(&mut self) -> Vec<(String, SchemaRef)> {
            vec![]
        }
        async fn describe(&mut self, _: &str) -> Result<String, String> {
            Ok(String::new())
        }
    }

    /// Round 51 (review "newuser"): DataFusion's unknown-table message, and only it, gets the
    /// name as written and where the tables are listed.
    #[test]
    fn an_unknown_table_points_to_show_tables() {
        assert_eq!(
            unknown_table_hint("table 'datafusion.public.nosuch' not found"),
            "table 'nosuch' not found (SHOW TABLES lists the tables you can read)"
        );
        assert_eq!(
            unknown_table_hint("table 'datafusion.nope.x' not found"),
            "table 'nope.x' not found (SHOW TABLES lists the tables you can read)"
        );
        assert_eq!(
            unknown_table_hint("table 'other.s.t' not found"),
            "table 'other.s.t' not found (SHOW TABLES lists the tables you can read)"
        );
        for kept in [
            "dpfusion refused the query: table 'people' not found in the ledger",
            "table 'a' and table 'b' not found",
        ] {
            assert_eq!(unknown_table_hint(kept), kept);
        }
        assert!(
            error_text(
                "SELECT 1 FROM nosuch",
                "table 'datafusion.public.nosuch' not found"
            )
            .ends_with("(SHOW TABLES lists the tables you can read)")
        );
        assert!(is_meta("  \\d t") && !is_meta("SELECT '\\d'"));
    }

    fn failed() -> Outcome {
        Outcome::Failed(
            "the query failed while it ran".into(),
            Charged {
                receipt: "charged a: dp_count(ε 1, δ 1e-7, gaussian) cost 10% of the budget".into(),
                tables: vec!["a".into()],
            },
        )
    }

    /// Round 49 (review composition, F4): after a statement that failed after its admission,
    /// the prompt kept the tables of the statement before (and showed nothing of the charge).
    /// Now it moves to the failed statement's tables, as after a finished one; a failure
    /// before admission leaves it where it was.
    #[tokio::test]
    async fn a_failure_after_admission_moves_the_prompt_to_its_tables() {
        let mut repl = Repl {
            backend: Scripted {
                outcome: failed,
                rows: vec![("a", 900_000), ("b", 500_000)],
            },
            format: OutputFormat::Table,
            quiet: true,
            timing: false,
            last_tables: vec!["b".into()],
        };
        assert_eq!(repl.prompt().await, "dpfusion[b 50% left, ε ≤ 0.5]> ");
        repl.run_sql("SELECT dp_count(x, 1.0) FROM a").await;
        assert_eq!(repl.last_tables, ["a"]);
        assert_eq!(repl.prompt().await, "dpfusion[a 90% left, ε ≤ 0.5]> ");
        repl.backend.outcome = || Outcome::Done(Err("refused".into()));
        repl.last_tables = vec!["b".into()];
        repl.run_sql("SELECT x FROM a").await;
        assert_eq!(repl.last_tables, ["b"], "nothing was charged");
    }
}
