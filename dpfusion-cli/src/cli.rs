//! Command-line arguments and the non-interactive runner (`-c`, `-f`): SQL statements, and
//! meta-command lines (`\budget`, `\d t`) carried out as the REPL does (round 51).
use std::path::PathBuf;
use std::process::ExitCode;

use dpfusion::accounting::FilterKind;
use dpfusion::accounting::filter::check_delta_share;
use dpfusion::session::{PrivateSession, Registration, SessionOptions};

use crate::repl::format::OutputFormat;

/// The parsed command line.
#[derive(Debug, Clone, Default)]
pub struct Cli {
    pub epsilon: Option<f64>,
    pub delta: Option<f64>,
    pub ledger: Option<PathBuf>,
    /// `--ledger-witness FILE`: the ledger's witness (docs/LEDGER.md).
    pub ledger_witness: Option<PathBuf>,
    pub private: Vec<(String, PathBuf)>,
    pub public: Vec<(String, PathBuf)>,
    /// The privacy filter of the `--private` tables (default: the ledger's, else gdp).
    pub filter: Option<FilterKind>,
    /// The share of δ reserved for partition selection for the `--private` tables.
    pub delta_share: Option<f64>,
    /// The data owner's catalog (catalog mode).
    pub catalog: Option<PathBuf>,
    /// Where `COPY ... TO` may write (single-user mode).
    pub output_dir: Option<PathBuf>,
    /// The owner's reason to relax the recorded policy of the `--private`/`--public` tables.
    pub relax: Option<String>,
    /// `--privacy-unit NAME=COLUMN`: the privacy unit column of the `--private` table NAME.
    pub units: Vec<(String, String)>,
    /// `--max-groups-contributed` / `--max-rows-contributed`: default bounds of the unit tables.
    pub max_groups: Option<u32>,
    pub max_rows: Option<u32>,
    /// `-c` and `-f` in the order given.
    pub scripts: Vec<Script>,
    pub format: Option<OutputFormat>,
    pub quiet: bool,
    /// `--connect grpc://HOST:PORT`: run against a `dpfusion serve` (analyst mode).
    pub connect: Option<String>,
    /// The file holding the bearer token for `--connect`.
    pub token_file: Option<PathBuf>,
    /// The CA certificate that signed a `grpc+tls://` server's certificate.
    pub tls_ca: Option<PathBuf>,
}

/// One `-c` command or `-f` file.
#[derive(Debug, Clone)]
pub enum Script {
    Command(String),
    File(PathBuf),
}

pub const HELP: &str = "\
dpfusion — differentially private SQL on Apache DataFusion

USAGE:
    dpfusion --catalog FILE [-c SQL]... [-f FILE]... [--format F] [-q]      (catalog mode)
    dpfusion [OWNER FLAGS] [-c SQL]... [-f FILE]... [--format F] [-q]      (single-user mode)
    dpfusion --connect grpc[+tls]://HOST:PORT --token-file F [--tls-ca FILE] [-c SQL]...
                                                   (client mode)
    dpfusion serve --catalog FILE [--listen ADDR]  (see 'dpfusion serve --help')
    dpfusion token [--stdin]                       (an analyst's token and its catalog hash)
    dpfusion ledger verify|reseal|migrate|report [PATH] (see 'dpfusion ledger --help')

With no -c/-f, opens the interactive REPL. Two roles: the data owner declares tables and their
policy; the analyst runs SQL. SQL is always the analyst's: it can never register a private
table, change a policy or touch the owner's files. The owner speaks through a catalog file
(--catalog, docs/CATALOG.md) or, in single-user mode, where the person running dpfusion is the
owner, through the owner flags below. With neither a catalog nor a --private/--public table, the
built-in demo tables are registered.

OPTIONS:
    -c, --command SQL        Run SQL (several statements separated by ';'); may be repeated
    -f, --file PATH          Run the statements in a file; may be repeated (runs in order with -c)
        --format FORMAT      Output format: table (default), csv or json
        --catalog FILE       Open the data owner's catalog (TOML): its ledger, tables and
                             policies. No owner flag may be given with it
    -q, --quiet              Do not print charge receipts
        --connect URL        Run the statements (or the REPL) on a dpfusion serve at
                             grpc://HOST:PORT, as the analyst whose token --token-file holds
        --token-file F       The file holding your bearer token (from the data owner)
        --tls-ca FILE        With grpc+tls://: the certificate (PEM) of the authority that
                             signed the server's certificate
    -h, --help               Print this help
    -V, --version            Print the version

OWNER FLAGS (single-user mode only):
        --epsilon E          Default per-table budget ε for tables registered here (default 1)
        --delta D            Default per-table budget δ (default 1e-6)
        --ledger PATH        The privacy ledger (default ./.dpfusion/ledger.jsonl)
        --ledger-witness FILE
                             The ledger's witness, outside the ledger's directory (default
                             <ledger dir>.witness/<ledger file>.witness; docs/LEDGER.md)
        --private NAME=PATH  Register a CSV or Parquet file as a private table; may be repeated
        --public NAME=PATH   Register a CSV or Parquet file as a public table; may be repeated
        --filter KIND        Privacy filter of the --private tables, fixed in the ledger when a
                             table is first registered: gdp (default; Gaussian mechanisms only,
                             tightest for them), zcdp (also zCDP, Laplace, pure DP, e.g.
                             dp_logreg_agd) or rdp / rdp:ORDER (every mechanism, rgm_mean_by
                             included, at one Rényi order). See docs/ACCOUNTING.md
        --delta-share S      Share of each --private table's δ reserved for partition selection
                             (GROUP BY over private columns), in (0, 1); default 0.5
        --output-dir DIR     The only directory COPY ... TO may write into (default: none)
        --relax REASON       Register the --private/--public tables even where this weakens or
                             changes the policy the ledger holds (a larger budget, more public
                             columns, ...); the reason and the changes are recorded in the ledger
        --privacy-unit NAME=COLUMN
                             The --private table NAME protects all the rows of one COLUMN value
                             (a customer, a patient) instead of one row; may be repeated
                             (docs/PRIVACY.md, \"Privacy units\")
        --max-groups-contributed K, --max-rows-contributed C
                             Default contribution bounds of the --privacy-unit tables: groups per
                             unit, and rows per unit and group (default 1 and 1)

EXAMPLES:
    dpfusion -c \"SELECT dp_gaussian_sigma(0.5, 1e-6, 100)\"
    dpfusion --private people=people.csv --epsilon 3 \\
        -c \"SELECT dp_mean(age, 0, 100, epsilon => 0.5) FROM people\"
    dpfusion -f sql/quickstart.sql --format csv
    dpfusion --catalog examples/catalog/dpfusion.toml -f examples/catalog/analyst.sql

SCRIPTS:
    Statements end with ';'. '--' starts a comment. A line that starts with '\\' is a REPL
    meta-command (\\budget, \\ledger, \\d [TABLE], \\explain SQL, \\format F, ...; \\? in the
    REPL lists them). A statement preceded by the comment '-- @expect-error' is expected to fail:
    its error is printed and the script goes on.

EXIT STATUS:
    0 when every statement succeeded; 1 at the first statement that fails (its error on stderr);
    2 for a bad command line.
";

fn need<'a>(args: &'a [String], i: usize, flag: &str) -> Result<&'a str, String> {
    args.get(i + 1)
        .map(|s| s.as_str())
        .ok_or_else(|| format!("{flag} needs a value"))
}

fn parse_f64(s: &str, flag: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .map_err(|_| format!("{flag} must be a number, got '{s}'"))
}

fn parse_table(s: &str, flag: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{flag} takes NAME=PATH, got '{s}'"))?;
    if name.is_empty() || path.is_empty() {
        return Err(format!("{flag} takes NAME=PATH, got '{s}'"));
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

impl Cli {
    /// Parses arguments (without the program name). `Ok(None)` when help or version was printed.
    pub fn parse(args: &[String]) -> Result<Option<Cli>, String> {
        let mut cli = Cli::default();
        let mut i = 0;
        while i < args.len() {
            let a = args[i].as_str();
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (a, None),
            };
            let value = |i: &mut usize| -> Result<String, String> {
                if let Some(v) = &inline {
                    Ok(v.clone())
                } else {
                    let v = need(args, *i, flag)?.to_string();
                    *i += 1;
                    Ok(v)
                }
            };
            match flag {
                "-h" | "--help" => {
                    print!("{HELP}");
                    return Ok(None);
                }
                "-V" | "--version" => {
                    println!("dpfusion {}", env!("CARGO_PKG_VERSION"));
                    return Ok(None);
                }
                "-c" | "--command" => cli.scripts.push(Script::Command(value(&mut i)?)),
                "-f" | "--file" => cli
                    .scripts
                    .push(Script::File(PathBuf::from(value(&mut i)?))),
                "--format" => cli.format = Some(value(&mut i)?.parse()?),
                "--epsilon" => cli.epsilon = Some(parse_f64(&value(&mut i)?, flag)?),
                "--delta" => cli.delta = Some(parse_f64(&value(&mut i)?, flag)?),
                "--ledger" => cli.ledger = Some(PathBuf::from(value(&mut i)?)),
                "--ledger-witness" => cli.ledger_witness = Some(PathBuf::from(value(&mut i)?)),
                "--private" => cli.private.push(parse_table(&value(&mut i)?, flag)?),
                "--public" => cli.public.push(parse_table(&value(&mut i)?, flag)?),
                "--filter" => cli.filter = Some(value(&mut i)?.parse()?),
                "--delta-share" => {
                    let s = parse_f64(&value(&mut i)?, flag)?;
                    check_delta_share(s).map_err(|e| format!("{flag}: {e}"))?;
                    cli.delta_share = Some(s);
                }
                "--catalog" => cli.catalog = Some(PathBuf::from(value(&mut i)?)),
                "--output-dir" => cli.output_dir = Some(PathBuf::from(value(&mut i)?)),
                "--relax" => cli.relax = Some(value(&mut i)?),
                "--privacy-unit" => {
                    let v = value(&mut i)?;
                    match v.split_once('=') {
                        Some((t, c)) if !t.is_empty() && !c.is_empty() => {
                            cli.units.push((t.to_string(), c.to_string()))
                        }
                        _ => return Err(format!("{flag} takes NAME=COLUMN, got '{v}'")),
                    }
                }
                "--max-groups-contributed" | "--max-rows-contributed" => {
                    let v = value(&mut i)?;
                    let n = v
                        .parse::<u64>()
                        .map_err(|_| format!("{flag} must be an integer, got '{v}'"))
                        .and_then(|n| {
                            dpfusion::accounting::PrivacyUnit::check_bound(&flag[2..], n)
                        })?;
                    if flag == "--max-groups-contributed" {
                        cli.max_groups = Some(n);
                    } else {
                        cli.max_rows = Some(n);
                    }
                }
                "-q" | "--quiet" => cli.quiet = true,
                "--connect" => cli.connect = Some(value(&mut i)?),
                "--token-file" => cli.token_file = Some(PathBuf::from(value(&mut i)?)),
                "--tls-ca" => cli.tls_ca = Some(PathBuf::from(value(&mut i)?)),
                other => return Err(format!("unknown argument '{other}'")),
            }
            i += 1;
        }
        for (t, _) in &cli.units {
            if !cli.private.iter().any(|(n, _)| n == t) {
                return Err(format!(
                    "--privacy-unit {t}=…: '{t}' is not a --private table of this command line"
                ));
            }
        }
        if (cli.max_groups.is_some() || cli.max_rows.is_some()) && cli.units.is_empty() {
            return Err(
                "--max-groups-contributed and --max-rows-contributed need --privacy-unit".into(),
            );
        }
        // A bad value is a bad command line (exit status 2), not a failed session.
        let b = cli.session_options().default_budget;
        dpfusion::accounting::check_new_budget(&b).map_err(|e| {
            format!(
                "--epsilon {} --delta {:e}: {e}",
                cli.epsilon.unwrap_or(b.epsilon),
                b.delta
            )
        })?;
        if cli.connect.is_some() != cli.token_file.is_some() {
            return Err(
                "--connect and --token-file go together: the server's address and the \
                 file holding your token"
                    .to_string(),
            );
        }
        if cli.tls_ca.is_some() && cli.connect.is_none() {
            return Err("--tls-ca goes with --connect grpc+tls://HOST:PORT".to_string());
        }
        // The data owner's flags: neither a client of a server (its owner declares the tables)
        // nor an analyst in catalog mode may give them.
        let owner_flags = [
            ("--epsilon", cli.epsilon.is_some()),
            ("--delta", cli.delta.is_some()),
            ("--ledger", cli.ledger.is_some()),
            ("--ledger-witness", cli.ledger_witness.is_some()),
            ("--private", !cli.private.is_empty()),
            ("--public", !cli.public.is_empty()),
            ("--filter", cli.filter.is_some()),
            ("--delta-share", cli.delta_share.is_some()),
            ("--output-dir", cli.output_dir.is_some()),
            ("--relax", cli.relax.is_some()),
            ("--privacy-unit", !cli.units.is_empty()),
            ("--max-groups-contributed", cli.max_groups.is_some()),
            ("--max-rows-contributed", cli.max_rows.is_some()),
        ];
        if cli.connect.is_some() {
            let catalog = [("--catalog", cli.catalog.is_some())];
            if let Some((f, _)) = catalog.iter().chain(&owner_flags).find(|(_, g)| *g) {
                return Err(format!(
                    "{f} cannot be given with --connect: the server's data owner declares the \
                     tables and their policy"
                ));
            }
        }
        if cli.catalog.is_some() {
            let given: Vec<&str> = owner_flags
                .iter()
                .filter(|(_, g)| *g)
                .map(|(f, _)| *f)
                .collect();
            if !given.is_empty() {
                return Err(format!(
                    "{} cannot be given with --catalog: in catalog mode the catalog is the data \
                     owner's only voice (its ledger, tables, budgets and output directory). Ask \
                     the owner to change the catalog, or run without --catalog (single-user mode) \
                     on files you own",
                    given.join(", ")
                ));
            }
        }
        Ok(Some(cli))
    }

    /// The session options these flags give (single-user mode: analyst SQL may register any
    /// file that is no private table's as a public table).
    pub fn session_options(&self) -> SessionOptions {
        let mut o =
            SessionOptions::default().with_analyst_files(dpfusion::session::AnalystFiles::Anywhere);
        if let Some(d) = &self.output_dir {
            o = o.with_output_dir(d.clone());
        }
        if let Some(l) = &self.ledger {
            o.ledger_path = l.clone();
        }
        o.ledger_witness = self.ledger_witness.clone();
        if let Some(e) = self.epsilon {
            o.default_budget.epsilon = e;
        }
        if let Some(d) = self.delta {
            o.default_budget.delta = d;
        }
        o
    }
}

/// Splits SQL text into statements at `;` outside quotes and comments. `--` starts a comment to
/// the end of the line. A line that starts a statement with `\` is a meta-command to the end of
/// the line ([`crate::repl::is_meta`]), as the REPL reads it.
pub fn split_statements(text: &str) -> Vec<String> {
    split_script(text).into_iter().map(|s| s.sql).collect()
}

/// One statement of a script.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptStatement {
    pub sql: String,
    /// The statement is preceded by the comment `-- @expect-error`: its failure is printed and
    /// the script goes on (its success is then an error). Lets a walk-through such as
    /// sql/quickstart.sql show a refusal.
    pub expect_error: bool,
}

/// [`split_statements`], keeping the `-- @expect-error` marks.
pub fn split_script(text: &str) -> Vec<ScriptStatement> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut expect_error = false;
    let mut chars = text.chars().peekable();
    let (mut in_single, mut in_double) = (false, false);
    while let Some(c) = chars.next() {
        match c {
            '\'' if !in_double => in_single = !in_single,
            '"' if !in_single => in_double = !in_double,
            '-' if !in_single && !in_double && chars.peek() == Some(&'-') => {
                let mut comment = String::new();
                for n in chars.by_ref() {
                    if n == '\n' {
                        cur.push('\n');
                        break;
                    }
                    comment.push(n);
                }
                if comment.trim_start_matches('-').trim() == "@expect-error" {
                    expect_error = true;
                }
                continue;
            }
            // A meta-command (`\budget`, `\d t`) is one line, as the REPL reads it; `;` and
            // quotes in it are its own (round 51, review "newuser": `-c '\budget'` was SQL).
            '\\' if !in_single && !in_double && cur.trim().is_empty() => {
                let mut line = String::from(c);
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                    line.push(n);
                }
                out.push(ScriptStatement {
                    sql: line.trim().to_string(),
                    expect_error,
                });
                expect_error = false;
                cur.clear();
                continue;
            }
            ';' if !in_single && !in_double => {
                if !cur.trim().is_empty() {
                    out.push(ScriptStatement {
                        sql: cur.trim().to_string(),
                        expect_error,
                    });
                    expect_error = false;
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(ScriptStatement {
            sql: cur.trim().to_string(),
            expect_error,
        });
    }
    out
}

async fn register_tables(session: &PrivateSession, cli: &Cli) -> Result<(), String> {
    for (name, path, reg) in cli
        .private
        .iter()
        .map(|(n, p)| {
            let mut reg = Registration::private();
            reg.filter = cli.filter;
            reg.delta_share = cli.delta_share;
            // --epsilon/--delta state the budget; without them a table the ledger knows keeps
            // its recorded budget (and a new one gets the defaults).
            if cli.epsilon.is_some() || cli.delta.is_some() {
                let b = session.options().default_budget;
                reg.budget = Some(b);
            }
            if let Some((_, col)) = cli.units.iter().find(|(t, _)| t == n) {
                reg = reg
                    .privacy_unit(col.clone())
                    .contribution_bounds(cli.max_groups.unwrap_or(1), cli.max_rows.unwrap_or(1));
            }
            (n, p, reg)
        })
        .chain(
            cli.public
                .iter()
                .map(|(n, p)| (n, p, Registration::public())),
        )
    {
        let reg = match &cli.relax {
            Some(r) => reg.relax(r.clone()),
            None => reg,
        };
        let r = if dpfusion::owner::is_parquet(path) {
            session.register_parquet(name, path, reg).await
        } else {
            session.register_csv(name, path, reg).await
        };
        r.map_err(|e| format!("registering {name}={}: {e}", path.display()))?;
    }
    Ok(())
}

/// Opens the session the command line asks for: the catalog's, or single-user mode's.
async fn open(cli: &Cli) -> Result<PrivateSession, String> {
    if let Some(path) = &cli.catalog {
        let catalog = dpfusion::catalog::Catalog::load(path).map_err(|e| e.to_string())?;
        return catalog.open().await.map_err(|e| e.to_string());
    }
    let session = PrivateSession::open(cli.session_options())
        .await
        .map_err(|e| e.to_string())?;
    register_tables(&session, cli).await?;
    Ok(session)
}

/// Runs the command line: the REPL when no `-c`/`-f` is given, else the scripts in order, on
/// a local session or (`--connect`) a server.
pub async fn run(cli: Cli) -> ExitCode {
    let format = cli.format.unwrap_or_default();
    if let (Some(url), Some(token_file)) = (&cli.connect, &cli.token_file) {
        let remote = match crate::repl::remote::Remote::connect(
            url,
            token_file,
            cli.tls_ca.as_deref(),
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "dpfusion: {}",
                    crate::repl::format::terminal_safe(&e, crate::repl::format::Escape::Text)
                );
                return ExitCode::from(1);
            }
        };
        return crate::repl::run_on(remote, &cli.scripts, format, cli.quiet).await;
    }
    let session = match open(&cli).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dpfusion: {e}");
            return ExitCode::from(1);
        }
    };
    if cli.catalog.is_none()
        && cli.private.is_empty()
        && cli.public.is_empty()
        && let Err(e) = crate::demo::register_demo(&session)
    {
        eprintln!("dpfusion: cannot register the demo tables: {e}");
        return ExitCode::from(1);
    }
    let local = crate::repl::local::Local::new(session);
    crate::repl::run_on(local, &cli.scripts, format, cli.quiet).await
}

/// What one statement of a script did.
pub enum Ran {
    /// It ran and its result was printed.
    Shown,
    /// It ran but its result could not be printed (the message).
    Unprintable(String),
    /// It failed (the error block to show).
    Failed(String),
    /// `\q`: the scripts end here, successfully.
    Quit,
}

/// Runs the `-c` and `-f` scripts in order, statement by statement (SQL, or a meta-command line),
/// through `exec` (a local session or `--connect`'s server, [`crate::repl::run_on`]). Stops at the
/// first failure, unless the statement is marked `-- @expect-error`, whose error goes to stdout;
/// a marked statement that succeeds is a failure. `\q` ends them successfully.
pub async fn run_scripts(scripts: &[Script], mut exec: impl AsyncFnMut(&str) -> Ran) -> ExitCode {
    for script in scripts {
        let text = match script {
            Script::Command(c) => c.clone(),
            Script::File(p) => match std::fs::read_to_string(p) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("dpfusion: cannot read {}: {e}", p.display());
                    return ExitCode::from(1);
                }
            },
        };
        for stmt in split_script(&text) {
            match exec(&stmt.sql).await {
                Ran::Shown if stmt.expect_error => {
                    eprintln!(
                        "dpfusion: this statement was marked '-- @expect-error' but succeeded: {}",
                        stmt.sql
                    );
                    return ExitCode::from(1);
                }
                Ran::Shown => {}
                // `\q` ends the scripts; marked as expected to fail, it is a statement that
                // did not fail (round 51, review "fixes" F3).
                Ran::Quit if stmt.expect_error => {
                    eprintln!(
                        "dpfusion: this statement was marked '-- @expect-error' but succeeded: {}",
                        stmt.sql
                    );
                    return ExitCode::from(1);
                }
                Ran::Quit => return ExitCode::SUCCESS,
                Ran::Unprintable(e) => {
                    eprintln!("dpfusion: {e}");
                    return ExitCode::from(1);
                }
                Ran::Failed(block) if stmt.expect_error => crate::repl::out(&block),
                Ran::Failed(block) => {
                    eprintln!("{block}");
                    return ExitCode::from(1);
                }
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_and_comments() {
        let s = split_statements("SELECT ';' AS a; -- c;omment\nSELECT 2;\n\n");
        assert_eq!(s, vec!["SELECT ';' AS a", "SELECT 2"]);
        let s = split_script("SELECT 1;\n-- @expect-error\nSELECT * FROM t;\nSELECT 3");
        assert_eq!(
            s.iter().map(|x| x.expect_error).collect::<Vec<_>>(),
            vec![false, true, false]
        );
    }

    /// Round 51 (review "newuser"): a meta-command line of a script is one statement, to the end
    /// of its line, as the REPL reads it; a `\` inside SQL is SQL.
    #[test]
    fn a_meta_command_is_one_line_of_a_script() {
        let s = split_script(
            "\\budget\nSELECT '\\x' AS a;\n  \\d salaries\n-- @expect-error\n\\nope 'a;b\nSELECT 2",
        );
        assert_eq!(
            s.iter()
                .map(|x| (x.sql.as_str(), x.expect_error))
                .collect::<Vec<_>>(),
            vec![
                ("\\budget", false),
                ("SELECT '\\x' AS a", false),
                ("\\d salaries", false),
                ("\\nope 'a;b", true),
                ("SELECT 2", false),
            ]
        );
        assert_eq!(
            split_statements("\\explain SELECT 1;"),
            ["\\explain SELECT 1;"]
        );
    }

    #[test]
    fn parses_flags_in_order() {
        let args: Vec<String> = [
            "-c",
            "SELECT 1",
            "-f",
            "a.sql",
            "--format",
            "json",
            "--epsilon=3",
            "--private",
            "t=x.csv",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let cli = Cli::parse(&args).unwrap().unwrap();
        assert_eq!(cli.scripts.len(), 2);
        assert!(matches!(cli.scripts[1], Script::File(_)));
        assert_eq!(cli.format, Some(OutputFormat::Json));
        assert_eq!(cli.epsilon, Some(3.0));
        assert_eq!(cli.private[0].0, "t");
        assert!(Cli::parse(&["--bogus".to_string()]).is_err());
        assert!(Cli::parse(&["--private".to_string(), "nope".to_string()]).is_err());
    }

    #[test]
    fn parses_privacy_units() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = Cli::parse(&args(&[
            "--private",
            "t=t.csv",
            "--privacy-unit",
            "t=customer",
            "--max-groups-contributed",
            "3",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.units, vec![("t".to_string(), "customer".to_string())]);
        assert_eq!((c.max_groups, c.max_rows), (Some(3), None));
        for bad in [
            &["--privacy-unit", "t=customer"][..],
            &["--private", "t=t.csv", "--privacy-unit", "t"],
            &["--private", "t=t.csv", "--max-rows-contributed", "2"],
            &[
                "--private",
                "t=t.csv",
                "--privacy-unit",
                "t=c",
                "--max-rows-contributed",
                "0",
            ],
        ] {
            assert!(Cli::parse(&args(bad)).is_err(), "{bad:?}");
        }
        assert!(HELP.contains("--privacy-unit"));
    }

    #[test]
    fn parses_filter_and_delta_share() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cli = Cli::parse(&args(&["--filter", "rdp:8", "--delta-share=0.25"]))
            .unwrap()
            .unwrap();
        assert_eq!(cli.filter, Some(FilterKind::Rdp { order: Some(8.0) }));
        assert_eq!(cli.delta_share, Some(0.25));
        assert!(Cli::parse(&args(&["--filter", "pld"])).is_err());
        assert!(Cli::parse(&args(&["--delta-share", "1"])).is_err());
        assert!(HELP.contains("--filter") && HELP.contains("--delta-share"));
    }

    #[test]
    fn bad_budgets_and_owner_flags_in_catalog_mode_are_bad_command_lines() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = Cli::parse(&args(&["--delta", "0.5"])).unwrap_err();
        assert!(e.contains("far below 1/n"), "{e}");
        let e = Cli::parse(&args(&["--epsilon", "-1"])).unwrap_err();
        assert!(e.contains("epsilon"), "{e}");
        assert!(Cli::parse(&args(&["--delta", "1e-3"])).is_ok());
        let e = Cli::parse(&args(&[
            "--catalog",
            "c.toml",
            "--epsilon",
            "5",
            "--ledger",
            "l",
        ]))
        .unwrap_err();
        assert!(
            e.contains("--epsilon, --ledger") && e.contains("catalog"),
            "{e}"
        );
        let e = Cli::parse(&args(&["--catalog", "c.toml", "--private", "t=x.csv"])).unwrap_err();
        assert!(e.contains("--private"), "{e}");
    }
}
