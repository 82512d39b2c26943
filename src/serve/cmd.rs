//! `dpfusion serve` and `dpfusion token`: the command lines.
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::auth::{Analysts, TokenHash, new_token};
use super::{ServeOptions, bind};
use crate::catalog::Catalog;

pub const SERVE_HELP: &str = "\
dpfusion serve — an Arrow Flight SQL server for analysts (README, \"Serving analysts\")

USAGE:
    dpfusion serve --catalog FILE [--listen ADDR] [--tls-cert FILE --tls-key FILE]
                   [--query-timeout SECS] [--max-concurrent-queries N] [--max-connections N]
                   [--max-result-bytes N] [--max-calls-per-analyst N]
                   [--insecure-listen-any]

Every statement runs as in the REPL (guard, admission, ledger, execution), for the analyst
whose bearer token it carries ([[analyst]] in the catalog, docs/CATALOG.md). Stops on SIGTERM
or Ctrl-C: no new call is accepted; statements under way get [server] shutdown_grace_secs (10)
to finish, then are cancelled (an admitted charge stands: it is in the ledger before any row is
read).

Every resource is bounded (README, \"Serving analysts\"; docs/CATALOG.md, [server]): connections,
and the time a connection may take to authenticate or stay idle; statements at once, per analyst
and in all; each analyst's calls in flight; a statement's time, SQL and result size; each
analyst's results waiting to be fetched (checked before admission).

OPTIONS:
        --catalog FILE               The data owner's catalog (required): tables, analysts, [server]
        --listen ADDR                Address to listen on (default: [server] listen, else
                                     127.0.0.1:50051; port 0 picks a free port)
        --query-timeout SECS         A statement's time limit (default: [server]
                                     query_timeout_secs, else 300)
        --max-concurrent-queries N   Statements running at once (default: [server]
                                     max_concurrent_queries, else the number of cores and at
                                     least 2; 1 is refused with two analysts or more)
        --max-connections N          Connections open at once (default: [server]
                                     max_connections, else 256)
        --max-result-bytes N         The largest result of one statement (default: [server]
                                     max_result_bytes, else 268435456, 256 MiB)
        --max-calls-per-analyst N    Calls of one analyst in flight at once, from their
                                     headers to their answers (being received, running or
                                     waiting for a turn); one more is refused before its body
                                     is read (default: twice the analyst's turns, at least 16)
        --tls-cert FILE              Serve over TLS with this certificate chain (PEM; default:
                                     [server] tls_cert). Clients connect to grpc+tls://
        --tls-key FILE               ... and its private key (PEM; default: [server] tls_key)
        --insecure-listen-any        Allow a non-loopback address without TLS: tokens and
                                     results then cross the network in clear
    -h, --help                       Print this help
";

pub const TOKEN_HELP: &str = "\
dpfusion token — make an analyst's bearer token and the hash the catalog stores

USAGE:
    dpfusion token            Print a new random token (line 1; give it to the analyst) and its
                              catalog line token_hash = \"sha256:…\" (line 2)
    dpfusion token --stdin    Read a token from standard input; print its token_hash line
";

/// The parsed `dpfusion serve` command line.
#[derive(Debug, Default)]
struct ServeArgs {
    catalog: Option<PathBuf>,
    listen: Option<String>,
    query_timeout: Option<f64>,
    max_concurrent: Option<usize>,
    max_connections: Option<usize>,
    max_result_bytes: Option<usize>,
    max_calls_per_analyst: Option<usize>,
    insecure_listen_any: bool,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

fn parse_serve(args: &[String]) -> Result<Option<ServeArgs>, String> {
    let mut a = ServeArgs::default();
    let mut i = 0;
    while i < args.len() {
        let (flag, inline) = match args[i].split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (args[i].as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => {
                print!("{SERVE_HELP}");
                return Ok(None);
            }
            "--catalog" => a.catalog = Some(PathBuf::from(value()?)),
            "--listen" => a.listen = Some(value()?),
            "--query-timeout" => {
                let v = value()?;
                let s: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| format!("--query-timeout must be seconds > 0, got '{v}'"))?;
                a.query_timeout = Some(s);
            }
            "--max-concurrent-queries" => {
                let v = value()?;
                let n: usize = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("--max-concurrent-queries must be a whole number > 0, got '{v}'")
                })?;
                a.max_concurrent = Some(n);
            }
            "--max-connections" | "--max-result-bytes" | "--max-calls-per-analyst" => {
                let v = value()?;
                let n: usize = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{flag} must be a whole number > 0, got '{v}'"))?;
                match flag {
                    "--max-connections" => a.max_connections = Some(n),
                    "--max-result-bytes" => a.max_result_bytes = Some(n),
                    _ => a.max_calls_per_analyst = Some(n),
                }
            }
            "--insecure-listen-any" => a.insecure_listen_any = true,
            "--tls-cert" => a.tls_cert = Some(PathBuf::from(value()?)),
            "--tls-key" => a.tls_key = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument '{other}'")),
        }
        i += 1;
    }
    if a.catalog.is_none() {
        return Err(
            "dpfusion serve needs --catalog FILE: the catalog declares the tables and the \
             analysts who may connect (docs/CATALOG.md)"
                .to_string(),
        );
    }
    Ok(Some(a))
}

/// The server's options: flags over the catalog's `[server]` over the defaults.
fn options(a: &ServeArgs, c: &Catalog) -> Result<ServeOptions, String> {
    let mut o = ServeOptions::default();
    let s = &c.server;
    if let Some(l) = a.listen.as_ref().or(s.listen.as_ref()) {
        o.listen = l.parse().map_err(|_| {
            format!("the listen address must be IP:PORT (e.g. 127.0.0.1:50051), got '{l}'")
        })?;
    }
    if let Some(t) = a.query_timeout.or(s.query_timeout_secs) {
        if !(t.is_finite() && t > 0.0) {
            return Err(format!("query_timeout_secs must be > 0, got {t}"));
        }
        o.query_timeout = Duration::from_secs_f64(t);
    }
    if let Some(n) = a.max_concurrent.or(s.max_concurrent_queries) {
        if n == 0 {
            return Err("max_concurrent_queries must be at least 1".to_string());
        }
        o.max_concurrent_queries = n;
    }
    if let Some(n) = s.max_sql_bytes {
        o.max_sql_bytes = n;
    }
    let at_least_one = |n: Option<usize>, key: &str| match n {
        Some(0) => Err(format!("{key} must be at least 1")),
        n => Ok(n),
    };
    let seconds = |t: Option<f64>, key: &str| match t {
        Some(t) if !(t.is_finite() && t > 0.0) => Err(format!("{key} must be > 0, got {t}")),
        t => Ok(t.map(Duration::from_secs_f64)),
    };
    if let Some(n) = at_least_one(s.max_queries_per_analyst, "max_queries_per_analyst")? {
        o.max_queries_per_analyst = n;
    }
    // Round 46: calls in flight per analyst (0 in the options: the default).
    if let Some(n) = at_least_one(
        a.max_calls_per_analyst.or(s.max_calls_per_analyst),
        "max_calls_per_analyst",
    )? {
        o.max_calls_per_analyst = n;
    }
    if let Some(n) = at_least_one(s.max_pending_results, "max_pending_results")? {
        o.max_pending_results = n;
    }
    if let Some(n) = at_least_one(s.max_pending_bytes, "max_pending_bytes")? {
        o.max_pending_bytes = n;
    }
    if let Some(n) = at_least_one(
        a.max_result_bytes.or(s.max_result_bytes),
        "max_result_bytes",
    )? {
        o.max_result_bytes = n;
    }
    if let Some(n) = at_least_one(a.max_connections.or(s.max_connections), "max_connections")? {
        o.max_connections = n;
    }
    if let Some(n) = at_least_one(
        s.max_ingest_bytes_per_analyst,
        "max_ingest_bytes_per_analyst",
    )? {
        o.max_ingest_bytes_per_analyst = n;
    }
    // Round 48: the memory held for all analysts (0 in the options: their shares' sum).
    if let Some(n) = at_least_one(s.max_held_bytes, "max_held_bytes")? {
        o.max_held_bytes = n;
    }
    if let Some(t) = seconds(s.result_ttl_secs, "result_ttl_secs")? {
        o.result_ttl = t;
    }
    if let Some(t) = seconds(s.handshake_timeout_secs, "handshake_timeout_secs")? {
        o.handshake_timeout = t;
    }
    match seconds(s.idle_timeout_secs, "idle_timeout_secs")? {
        Some(t) => o.idle_timeout = t,
        // The default outlasts a statement's time limit.
        None => {
            o.idle_timeout = o
                .idle_timeout
                .max(o.query_timeout + Duration::from_secs(60))
        }
    }
    if o.idle_timeout <= o.query_timeout {
        return Err(format!(
            "idle_timeout_secs ({} s) must be longer than query_timeout_secs ({} s): a \
             connection waiting for its statement would be closed",
            o.idle_timeout.as_secs_f64(),
            o.query_timeout.as_secs_f64()
        ));
    }
    if let Some(t) = s.shutdown_grace_secs {
        if !(t.is_finite() && t >= 0.0) {
            return Err(format!("shutdown_grace_secs must be >= 0, got {t}"));
        }
        o.shutdown_grace = Duration::from_secs_f64(t);
    }
    o.insecure_listen_any = a.insecure_listen_any;
    // Flags name files relative to the working directory, the catalog relative to itself.
    let cert = a
        .tls_cert
        .clone()
        .or_else(|| s.tls_cert.as_ref().map(|p| c.resolve(p)));
    let key = a
        .tls_key
        .clone()
        .or_else(|| s.tls_key.as_ref().map(|p| c.resolve(p)));
    o.tls = match (cert, key) {
        (Some(cert), Some(key)) => Some(super::TlsFiles { cert, key }),
        (None, None) => None,
        _ => {
            return Err(
                "TLS needs both a certificate and its private key (--tls-cert and --tls-key, or \
                 tls_cert and tls_key in [server])"
                    .to_string(),
            );
        }
    };
    Ok(o)
}

/// Waits for SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Loads the catalog, opens its session and binds the server: everything `dpfusion serve` does
/// before it serves. Returns the server, the number of analysts and of tables; or the exit
/// status and the message.
async fn prepare(a: &ServeArgs) -> Result<(super::Bound, usize, usize), (u8, String)> {
    let path = a.catalog.clone().unwrap_or_default();
    let catalog = Catalog::load(&path).map_err(|e| (1, e.to_string()))?;
    let opts = options(a, &catalog).map_err(|e| (2, e))?;
    let mut list = Vec::new();
    for an in &catalog.analysts {
        let h = TokenHash::parse(&an.token_hash)
            .map_err(|e| (1, format!("analyst '{}': {e}", an.name)))?;
        list.push((an.name.clone(), h));
    }
    // The TLS files given on the command line are the owner's too (the catalog's already are).
    let tls: Vec<PathBuf> = [&a.tls_cert, &a.tls_key]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let session = Arc::new(
        catalog
            .open_protecting(&tls)
            .await
            .map_err(|e| (1, e.to_string()))?,
    );
    let tables = session.tables().len();
    let bound = bind(session, Analysts::new(list), opts)
        .await
        .map_err(|e| (1, e.to_string()))?;
    Ok((bound, catalog.analysts.len(), tables))
}

/// [`run_serve`]'s server for the catalog at `path`, bound but not serving (for tests and
/// embedders): the catalog's `[server]` settings, `listen` overriding its address.
pub async fn bind_catalog(
    path: &std::path::Path,
    listen: Option<&str>,
) -> Result<super::Bound, String> {
    let a = ServeArgs {
        catalog: Some(path.to_path_buf()),
        listen: listen.map(str::to_string),
        ..ServeArgs::default()
    };
    prepare(&a).await.map(|x| x.0).map_err(|e| e.1)
}

/// `dpfusion serve ARGS`.
pub async fn run_serve(args: &[String]) -> ExitCode {
    let a = match parse_serve(args) {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dpfusion serve: {e}\nTry 'dpfusion serve --help'.");
            return ExitCode::from(2);
        }
    };
    let (bound, analysts, tables) = match prepare(&a).await {
        Ok(x) => x,
        Err((code, e)) => {
            eprintln!("dpfusion serve: {e}");
            return ExitCode::from(code);
        }
    };
    println!("{}", listening(&bound.url(), analysts, tables));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    match bound.serve(shutdown_signal()).await {
        Ok(()) => {
            println!("dpfusion serve: stopped; the ledger is intact");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dpfusion serve: {e}");
            ExitCode::from(1)
        }
    }
}

/// `dpfusion token ARGS`.
pub fn run_token(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        None => {
            let token = new_token();
            println!("{token}");
            println!("token_hash = \"{}\"", TokenHash::new(&token));
            ExitCode::SUCCESS
        }
        Some("--stdin") if args.len() == 1 => {
            let mut s = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
                eprintln!("dpfusion token: cannot read standard input: {e}");
                return ExitCode::from(1);
            }
            let token = s.trim();
            if token.len() < 16 {
                eprintln!(
                    "dpfusion token: the token on standard input has {} characters; use at least \
                     16 random characters (or run 'dpfusion token' for a new one)",
                    token.len()
                );
                return ExitCode::from(2);
            }
            println!("token_hash = \"{}\"", TokenHash::new(token));
            ExitCode::SUCCESS
        }
        Some("-h" | "--help") => {
            print!("{TOKEN_HELP}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("dpfusion token: unknown argument '{other}'\n{TOKEN_HELP}");
            ExitCode::from(2)
        }
    }
}

/// The line `dpfusion serve` prints once it listens (tests read the address from it).
fn listening(url: &str, analysts: usize, tables: usize) -> String {
    // "1 analyst", not "1 analysts" (round 51, review "newuser").
    let n = |k: usize, noun: &str| format!("{k} {noun}{}", if k == 1 { "" } else { "s" });
    format!(
        "dpfusion serve: listening on {url} ({}, {})",
        n(analysts, "analyst"),
        n(tables, "table")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_counts_in_words() {
        assert_eq!(
            listening("grpc://127.0.0.1:1", 1, 1),
            "dpfusion serve: listening on grpc://127.0.0.1:1 (1 analyst, 1 table)"
        );
        assert!(listening("grpc://h:1", 2, 4).ends_with("(2 analysts, 4 tables)"));
    }

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn serve_flags_parse_and_need_a_catalog() {
        let a = parse_serve(&args(&[
            "--catalog",
            "c.toml",
            "--listen=127.0.0.1:0",
            "--query-timeout",
            "2.5",
            "--max-concurrent-queries",
            "3",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(a.listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(a.query_timeout, Some(2.5));
        assert_eq!(a.max_concurrent, Some(3));
        assert!(parse_serve(&args(&[])).unwrap_err().contains("--catalog"));
        assert!(parse_serve(&args(&["--catalog", "c", "--query-timeout", "0"])).is_err());
        assert!(parse_serve(&args(&["--catalog", "c", "--bogus"])).is_err());
        let a = parse_serve(&args(&[
            "--catalog",
            "c",
            "--max-connections=5",
            "--max-result-bytes",
            "1024",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.max_connections, a.max_result_bytes),
            (Some(5), Some(1024))
        );
        assert!(parse_serve(&args(&["--catalog", "c", "--max-connections", "0"])).is_err());
        let a = parse_serve(&args(&["--catalog", "c", "--max-calls-per-analyst=3"]))
            .unwrap()
            .unwrap();
        assert_eq!(a.max_calls_per_analyst, Some(3));
        assert!(parse_serve(&args(&["--catalog", "c", "--max-calls-per-analyst", "0"])).is_err());
    }
}
