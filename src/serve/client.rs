//! `dpfusion --connect grpc://HOST:PORT --token-file F`: the REPL (and `-c`/`-f`) as a client of
//! `dpfusion serve`. Statements run on the server, exactly as they would locally; the prompt
//! shows the remaining budget of the tables used last (from `SHOW BUDGET`), `\d` the server's
//! tables (Flight SQL `GetTables`), and completion knows their names and columns.
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use arrow_flight::error::FlightError;
use arrow_flight::sql::CommandGetTables;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{Array, BinaryArray, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use futures::StreamExt;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Config, Editor};
use tonic::transport::Channel;

use super::StatementMetadata;
use crate::accounting::display::{Round, n6, num};
use crate::cli::{Ran, Script};
use crate::repl::Meta;
use crate::repl::format::{Escape, OutputFormat, render, terminal_safe};
use crate::repl::helper::SqlHelper;
use crate::statements::error_text as error_block;

/// A connection to a `dpfusion serve`.
pub struct Remote {
    client: FlightSqlServiceClient<Channel>,
    url: String,
}

/// One statement's answer.
pub struct RemoteResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    pub meta: StatementMetadata,
}

/// What a failed call tells the analyst: the server's message (with its status code's meaning).
fn message(e: FlightError) -> String {
    match e {
        FlightError::Tonic(s) => match s.code() {
            tonic::Code::Unavailable => format!(
                "the server is unavailable ({}); check the address and that dpfusion serve runs",
                s.message()
            ),
            _ => s.message().to_string(),
        },
        other => other.to_string(),
    }
}

impl Remote {
    /// Connects to `url` (`grpc://HOST:PORT` or `http://HOST:PORT`) with the token in
    /// `token_file`, and checks the token.
    /// With TLS (`grpc+tls://`), `tls_ca` is the certificate (PEM) of the authority that
    /// signed the server's certificate.
    pub async fn connect(
        url: &str,
        token_file: &Path,
        tls_ca: Option<&Path>,
    ) -> Result<Self, String> {
        let token = std::fs::read_to_string(token_file)
            .map_err(|e| format!("cannot read the token file {}: {e}", token_file.display()))?;
        let token = token.trim();
        if token.is_empty() {
            return Err(format!("the token file {} is empty", token_file.display()));
        }
        let (endpoint, tls) = match url.split_once("://") {
            Some(("grpc" | "grpc+tcp" | "http", rest)) => (format!("http://{rest}"), false),
            Some(("grpc+tls" | "https", rest)) => (format!("https://{rest}"), true),
            _ => {
                return Err(format!(
                    "--connect takes grpc://HOST:PORT or grpc+tls://HOST:PORT, got '{url}'"
                ));
            }
        };
        let mut endpoint =
            Channel::from_shared(endpoint).map_err(|e| format!("--connect {url}: {e}"))?;
        match (tls, tls_ca) {
            (true, Some(ca)) => {
                let pem = std::fs::read(ca)
                    .map_err(|e| format!("cannot read the CA certificate {}: {e}", ca.display()))?;
                let config = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(pem));
                endpoint = endpoint
                    .tls_config(config)
                    .map_err(|e| format!("TLS: {e}"))?;
            }
            (true, None) => {
                return Err(
                    "grpc+tls:// needs --tls-ca FILE: the certificate of the authority that \
                     signed the server's certificate (the data owner gives it)"
                        .to_string(),
                );
            }
            (false, Some(_)) => {
                return Err(
                    "--tls-ca is for grpc+tls:// servers; this URL is plain grpc://".to_string(),
                );
            }
            (false, None) => {}
        }
        let channel = endpoint
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let mut client = FlightSqlServiceClient::new(channel);
        client.set_token(token.to_string());
        let mut r = Remote {
            client,
            url: url.to_string(),
        };
        r.tables().await?;
        Ok(r)
    }

    async fn fetch(&mut self, info: arrow_flight::FlightInfo) -> Result<Vec<RecordBatch>, String> {
        let mut out = Vec::new();
        for ep in info.endpoint {
            let Some(ticket) = ep.ticket else { continue };
            let mut stream = self.client.do_get(ticket).await.map_err(message)?;
            while let Some(b) = stream.next().await {
                out.push(b.map_err(message)?);
            }
        }
        Ok(out)
    }

    /// Runs one statement on the server.
    pub async fn sql(&mut self, sql: &str) -> Result<RemoteResult, String> {
        let info = self
            .client
            .execute(sql.to_string(), None)
            .await
            .map_err(message)?;
        let meta: StatementMetadata =
            serde_json::from_slice(&info.app_metadata).unwrap_or_default();
        let schema = info
            .clone()
            .try_decode_schema()
            .map(std::sync::Arc::new)
            .map_err(|e| format!("the server sent a bad schema: {e}"))?;
        let batches = self.fetch(info).await?;
        Ok(RemoteResult {
            schema,
            batches,
            meta,
        })
    }

    /// The server's tables and their schemas.
    pub async fn tables(&mut self) -> Result<Vec<(String, SchemaRef)>, String> {
        let info = self
            .client
            .get_tables(CommandGetTables {
                include_schema: true,
                ..Default::default()
            })
            .await
            .map_err(message)?;
        let mut out = Vec::new();
        for b in self.fetch(info).await? {
            let names = b
                .column_by_name("table_name")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>());
            let schemas = b
                .column_by_name("table_schema")
                .and_then(|c| c.as_any().downcast_ref::<BinaryArray>());
            let (Some(names), Some(schemas)) = (names, schemas) else {
                return Err("the server's table list has no table_name/table_schema".into());
            };
            // The analyst's own tables (schema `mine`) are named with their schema.
            let db_schemas = b
                .column_by_name("db_schema_name")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>());
            for i in 0..names.len() {
                let schema =
                    datafusion::arrow::ipc::convert::try_schema_from_ipc_buffer(schemas.value(i))
                        .map_err(|e| format!("the server sent a bad table schema: {e}"))?;
                let name = match db_schemas {
                    Some(d) if !d.is_null(i) && d.value(i) != super::SCHEMA_NAME => {
                        format!("{}.{}", d.value(i), names.value(i))
                    }
                    _ => names.value(i).to_string(),
                };
                out.push((name, std::sync::Arc::new(schema)));
            }
        }
        Ok(out)
    }

    /// `SHOW BUDGET`'s rows: (table, epsilon, share left in percent, the next query's largest
    /// ε).
    async fn budget(&mut self) -> Vec<(String, f64, f64, f64)> {
        let Ok(r) = self.sql("SHOW BUDGET").await else {
            return vec![];
        };
        let mut out = Vec::new();
        for b in &r.batches {
            let col = |n: &str| b.column_by_name(n).cloned();
            let (Some(t), Some(e), Some(left), Some(rem)) = (
                col("table"),
                col("epsilon"),
                col("left_pct"),
                col("remaining_epsilon"),
            ) else {
                continue;
            };
            let (Some(t), Some(e), Some(left), Some(rem)) = (
                t.as_any().downcast_ref::<StringArray>(),
                e.as_any().downcast_ref::<Float64Array>(),
                left.as_any().downcast_ref::<Float64Array>(),
                rem.as_any().downcast_ref::<Float64Array>(),
            ) else {
                continue;
            };
            for i in 0..t.len() {
                out.push((
                    t.value(i).to_string(),
                    e.value(i),
                    left.value(i),
                    rem.value(i),
                ));
            }
        }
        out
    }
}

/// Text from the server (a message, a receipt, a table's name), safe to print on a terminal.
fn safe(s: &str) -> std::borrow::Cow<'_, str> {
    terminal_safe(s, Escape::Text)
}

fn print(r: &RemoteResult, format: OutputFormat, quiet: bool) -> Result<(), String> {
    if !(r.schema.fields().is_empty() && r.batches.is_empty()) {
        let s = render(&r.batches, &r.schema, format)
            .or_else(|_| render(&r.batches, &r.schema, OutputFormat::Json))
            .map_err(|e| format!("the result cannot be printed: {}", safe(&e.to_string())))?;
        crate::repl::out(&s);
    }
    if !quiet && let Some(line) = &r.meta.receipt_text {
        eprintln!("{}", safe(line));
    }
    Ok(())
}

/// `dpfusion --connect URL --token-file F [-c SQL]... [-f FILE]...`.
pub async fn run(
    url: &str,
    token_file: &Path,
    tls_ca: Option<&Path>,
    scripts: &[Script],
    format: OutputFormat,
    quiet: bool,
) -> ExitCode {
    let mut remote = match Remote::connect(url, token_file, tls_ca).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpfusion: {}", safe(&e.to_string()));
            return ExitCode::from(1);
        }
    };
    if scripts.is_empty() {
        return repl(remote, format, quiet).await;
    }
    crate::cli::run_scripts(scripts, async |sql: &str| match remote.sql(sql).await {
        Ok(r) => match print(&r, format, quiet) {
            Ok(()) => Ran::Shown,
            Err(e) => Ran::Unprintable(e),
        },
        Err(e) => Ran::Failed(error_block(sql, &e)),
    })
    .await
}

struct State {
    remote: Remote,
    format: OutputFormat,
    quiet: bool,
    timing: bool,
    last_tables: Vec<String>,
}

impl State {
    async fn prompt(&mut self) -> String {
        if self.last_tables.is_empty() {
            return "dpfusion> ".to_string();
        }
        let rows = self.remote.budget().await;
        let parts: Vec<String> = self
            .last_tables
            .iter()
            .filter_map(|t| rows.iter().find(|r| r.0 == *t))
            .map(|(t, _, left, rem)| {
                // As the local prompt (docs/ACCOUNTING.md, "What the numbers mean").
                format!(
                    "{} {}% left, ε ≤ {}",
                    terminal_safe(t, Escape::Cell),
                    n6(*left),
                    num(*rem, Round::Down)
                )
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
        let outcome = tokio::select! {
            r = self.remote.sql(sql) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        };
        match outcome {
            None => eprintln!(
                "query cancelled (if it was admitted, its charge stands: a failure or \
                 cancellation can depend on the data)"
            ),
            Some(Ok(r)) => {
                if !r.meta.tables.is_empty() {
                    self.last_tables = r.meta.tables.clone();
                }
                if let Err(e) = print(&r, self.format, self.quiet) {
                    eprintln!("dpfusion: {e}");
                }
            }
            Some(Err(e)) => eprintln!("{}", error_block(sql, &e)),
        }
        if self.timing {
            eprintln!("Elapsed {:.3} s", start.elapsed().as_secs_f64());
        }
    }

    async fn describe(&mut self, table: &str) -> String {
        let tables = match self.remote.tables().await {
            Ok(t) => t,
            Err(e) => return e,
        };
        let budget = self.remote.budget().await;
        let policy = |name: &str| match budget.iter().find(|b| b.0 == name) {
            Some((_, e, left, rem)) => format!(
                "private, budget ε {}, {}% left (one more query could use ε ≤ {})",
                n6(*e),
                n6(*left),
                num(*rem, Round::Down)
            ),
            None => "public".to_string(),
        };
        if table.is_empty() {
            let mut out = String::from("Tables:\n");
            for (name, schema) in &tables {
                out.push_str(&format!(
                    "  {name:<12} {} columns; {}\n",
                    schema.fields().len(),
                    policy(name)
                ));
            }
            out.push_str("\\d TABLE shows its columns.");
            return out;
        }
        let want = table.to_ascii_lowercase();
        let Some((name, schema)) = tables.iter().find(|(n, _)| *n == want) else {
            return format!(
                "no table '{table}' (tables: {})",
                tables
                    .iter()
                    .map(|t| t.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let mut out = format!("Table {name}: {}\n  columns:\n", policy(name));
        for f in schema.fields() {
            out.push_str(&format!("    {:<14} {}\n", f.name(), f.data_type()));
        }
        out.push_str("  (SHOW TABLES shows neighbours and public columns)");
        out
    }

    /// Returns false on `\q`.
    async fn meta(&mut self, line: &str) -> bool {
        match Meta::parse(line, &mut self.format, &mut self.timing) {
            Meta::Quit => return false,
            Meta::Budget => self.run_sql("SHOW BUDGET").await,
            Meta::Ledger => {
                self.run_sql("SELECT seq, time, query, \"table\", epsilon, delta FROM dp_ledger()")
                    .await
            }
            Meta::Explain(query) => self.run_sql(&format!("EXPLAIN PRIVACY {query}")).await,
            Meta::Describe(table) => {
                let d = self.describe(table).await;
                println!("{}", safe(&d));
            }
            Meta::Done => {}
        }
        true
    }
}

async fn repl(remote: Remote, format: OutputFormat, quiet: bool) -> ExitCode {
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
    let helper = SqlHelper::new(std::io::stdout().is_terminal());
    let mut st = State {
        remote,
        format,
        quiet,
        timing: false,
        last_tables: vec![],
    };
    if let Ok(t) = st.remote.tables().await {
        helper.refresh_tables(&t);
    }
    rl.set_helper(Some(helper));
    println!(
        "dpfusion {} — connected to {}. \\? for help, \\d for tables, \\q to quit.",
        env!("CARGO_PKG_VERSION"),
        st.remote.url
    );
    let d = st.describe("").await;
    println!("{}", safe(&d));
    loop {
        let prompt = st.prompt().await;
        let read = tokio::task::block_in_place(|| rl.readline(&prompt));
        match read {
            Ok(input) => {
                let text = input.trim();
                if text.is_empty() {
                    continue;
                }
                let _ = rl.add_history_entry(text);
                if text.starts_with('\\') {
                    if !st.meta(text).await {
                        break;
                    }
                } else {
                    for stmt in crate::cli::split_statements(text) {
                        st.run_sql(&stmt).await;
                    }
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
    ExitCode::SUCCESS
}
