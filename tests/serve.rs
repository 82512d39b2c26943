//! `dpfusion serve` (issue 17): the built binary serves a catalog on a loopback port, and clients
//! speak Arrow Flight SQL to it: arrow-flight's `FlightSqlServiceClient` (Rust) and the ADBC
//! Flight SQL driver (Python, tests/serve_client.py).
mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables};
use arrow_flight::{FlightDescriptor, FlightInfo, Ticket};
use dpfusion::arrow::array::{Array, Float64Array, RecordBatch, StringArray};
use dpfusion::serve::auth::TokenHash;
use futures::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Status};

const ALICE: &str = "alice-0123456789abcdef0123456789abcdef";
const BOB: &str = "bob-fedcba9876543210fedcba9876543210";

/// A `dpfusion serve` child process, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    ledger: PathBuf,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server in this process (what `dpfusion serve` runs, from the same catalog), stopped when
/// dropped.
struct InProcess {
    addr: SocketAddr,
    ledger: PathBuf,
    dir: PathBuf,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// [`start`], in this process.
async fn serve_here(tag: &str, epsilon: f64, extra: &str) -> InProcess {
    let dir = common::temp_dir(tag);
    let catalog = write_catalog(&dir, epsilon, extra);
    let bound = dpfusion::serve::cmd::bind_catalog(&catalog, None)
        .await
        .unwrap();
    let addr = bound.addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));
    InProcess {
        addr,
        ledger: dir.join("ledger.jsonl"),
        dir,
        _stop: stop,
    }
}

/// Writes a catalog (people private with budget `epsilon`, depts public, analysts alice and
/// bob, listening on a free loopback port) plus `extra` TOML in `[server]`.
fn write_catalog(dir: &Path, epsilon: f64, extra: &str) -> PathBuf {
    let catalog = dir.join("dpfusion.toml");
    let text = format!(
        r#"
[session]
ledger = "ledger.jsonl"

[[table]]
name = "people"
path = "{people}"
epsilon = {epsilon:?}
delta = 1e-6

[[table]]
name = "depts"
path = "{depts}"
visibility = "public"

[[analyst]]
name = "alice"
token_hash = "{alice}"

[[analyst]]
name = "bob"
token_hash = "{bob}"

[server]
listen = "127.0.0.1:0"
{extra}
"#,
        people = common::people_csv().display(),
        depts = common::depts_csv().display(),
        alice = TokenHash::new(ALICE),
        bob = TokenHash::new(BOB),
    );
    std::fs::write(&catalog, text).unwrap();
    catalog
}

/// Starts the built binary, `dpfusion serve`, on [`write_catalog`]'s catalog.
fn start(tag: &str, epsilon: f64, extra: &str) -> Server {
    let dir = common::temp_dir(tag);
    let catalog = write_catalog(&dir, epsilon, extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["serve", "--catalog"])
        .arg(&catalog)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {} // keep the pipe drained
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the server did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .parse()
        .unwrap();
    Server {
        child,
        addr,
        ledger: dir.join("ledger.jsonl"),
        dir,
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

async fn client(addr: SocketAddr, token: Option<&str>) -> FlightSqlServiceClient<Channel> {
    let mut c = FlightSqlServiceClient::new(channel(addr).await);
    if let Some(t) = token {
        c.set_token(t.to_string());
    }
    c
}

fn status(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(s) => *s,
        other => Status::unknown(other.to_string()),
    }
}

/// Fetches every endpoint of `info`.
async fn fetch(
    c: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<Vec<RecordBatch>, Status> {
    let mut out = Vec::new();
    for ep in info.endpoint {
        let ticket = ep.ticket.ok_or_else(|| Status::unknown("no ticket"))?;
        let mut stream = c.do_get(ticket).await.map_err(status)?;
        while let Some(b) = stream.next().await {
            out.push(b.map_err(status)?);
        }
    }
    Ok(out)
}

/// Runs one statement: GetFlightInfo, then DoGet of its ticket.
async fn query(
    c: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<RecordBatch>, Status> {
    let info = c.execute(sql.to_string(), None).await.map_err(status)?;
    fetch(c, info).await
}

fn column<'a>(batches: &'a [RecordBatch], name: &str) -> Vec<&'a Arc<dyn Array>> {
    batches
        .iter()
        .map(|b| {
            b.column_by_name(name)
                .unwrap_or_else(|| panic!("no {name}"))
        })
        .collect()
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// The server answers a trivial statement.
async fn still_serving(addr: SocketAddr) {
    let mut c = client(addr, Some(ALICE)).await;
    let b = query(&mut c, "SELECT 1 AS one").await.unwrap();
    assert_eq!(rows(&b), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_client_queries_refusals_budget_auth_and_bad_requests() {
    let s = serve_here("serve-basic", 1.0, "max_sql_bytes = 1048576").await;
    let addr = s.addr;
    let mut alice = client(addr, Some(ALICE)).await;

    // A DP query: admitted, charged to alice in the ledger.
    let b = query(&mut alice, "SELECT dp_count(id, 0.5) AS n FROM people")
        .await
        .unwrap();
    assert_eq!(rows(&b), 1);
    assert_eq!(b[0].schema().field(0).name(), "n");

    // A refused query: InvalidArgument with the REPL's message; nothing charged.
    let e = query(&mut alice, "SELECT age FROM people")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("refused") && e.message().contains("people"),
        "{}",
        e.message()
    );
    // Invalid input: InvalidArgument too.
    let e = query(&mut alice, "SELECT nope FROM depts")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // SET would reach every analyst: refused over the server.
    let e = query(&mut alice, "/* c */ SET dpfusion.default_delta = 1e-9")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("SET"), "{}", e.message());
    for sql in [
        "; SET dpfusion.default_delta = 1e-9",
        "CREATE TABLE kept AS SELECT dp_count(id, 0.1) AS n FROM people",
        "DROP TABLE depts",
    ] {
        let e = query(&mut alice, sql).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{sql}: {e:?}");
        assert!(e.message().contains("over the server"), "{}", e.message());
    }

    // SHOW BUDGET, EXPLAIN PRIVACY and dp_ledger() are ordinary statements.
    let b = query(&mut alice, "SHOW BUDGET").await.unwrap();
    assert!(rows(&b) >= 1);
    let b = query(
        &mut alice,
        "EXPLAIN PRIVACY SELECT dp_count(id, 0.1) AS n FROM people",
    )
    .await
    .unwrap();
    assert!(rows(&b) >= 1);
    let b = query(&mut alice, "SELECT * FROM dp_ledger()")
        .await
        .unwrap();
    assert_eq!(rows(&b), 1);

    // Budget exhaustion: ResourceExhausted, with the message.
    let bob_first = {
        let mut bob = client(addr, Some(BOB)).await;
        let mut first = None;
        for _ in 0..50 {
            match query(&mut bob, "SELECT dp_count(id, 0.5) AS n FROM people").await {
                Ok(_) => {}
                Err(e) => {
                    first = Some(e);
                    break;
                }
            }
        }
        first.expect("the budget runs out")
    };
    assert_eq!(bob_first.code(), Code::ResourceExhausted, "{bob_first:?}");
    assert!(
        bob_first.message().contains("budget"),
        "{}",
        bob_first.message()
    );

    // Authentication: no token, a wrong token, a malformed header.
    for token in [None, Some("wrong-token"), Some(&ALICE[..10])] {
        let mut c = client(addr, token).await;
        let e = query(&mut c, "SELECT 1").await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{token:?}: {e:?}");
        let e = c
            .get_tables(CommandGetTables::default())
            .await
            .map_err(status)
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
    }
    let mut raw = FlightServiceClient::new(channel(addr).await);
    let mut req = tonic::Request::new(FlightDescriptor::new_cmd(b"x".to_vec()));
    req.metadata_mut()
        .insert("authorization", "Basic YWxpY2U6eA==".parse().unwrap());
    let e = raw.get_flight_info(req).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::Unauthenticated | Code::InvalidArgument),
        "{e:?}"
    );

    // A 10 MB SQL string: a clean status, not a hang or a crash.
    let big = format!("SELECT 1 /* {} */", "x".repeat(10 << 20));
    let e = query(&mut alice, &big).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted
        ),
        "{:?} {}",
        e.code(),
        &e.message()[..e.message().len().min(300)]
    );
    // Just over the server's limit: its own message.
    let big = format!("SELECT 1 /* {} */", "x".repeat(1 << 20));
    let e = query(&mut alice, &big).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("max_sql_bytes"), "{}", e.message());

    // Malformed requests: a command that is no protobuf, a ticket nobody issued.
    let mut raw = FlightServiceClient::new(channel(addr).await);
    let mut req = tonic::Request::new(FlightDescriptor::new_cmd(vec![0xff, 0x01, 0x02]));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let e = raw.get_flight_info(req).await.unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    let e = query_ticket(&mut alice, b"not a ticket").await.unwrap_err();
    assert!(
        matches!(e.code(), Code::InvalidArgument | Code::NotFound),
        "{e:?}"
    );

    // GetSchemas / GetTables: the owner's tables with their pinned schemas.
    let info = alice
        .get_db_schemas(CommandGetDbSchemas::default())
        .await
        .unwrap();
    let b = fetch(&mut alice, info).await.unwrap();
    assert_eq!(rows(&b), 1);
    let info = alice
        .get_tables(CommandGetTables {
            include_schema: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let b = fetch(&mut alice, info).await.unwrap();
    let names: Vec<String> = column(&b, "table_name")
        .iter()
        .flat_map(|a| {
            let a = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..a.len())
                .map(|i| a.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(names, vec!["depts", "people"]);

    // A prepared statement without parameters runs through the same path.
    let mut p = alice
        .prepare("SELECT count(*) AS n FROM depts".to_string(), None)
        .await
        .unwrap();
    assert_eq!(p.dataset_schema().unwrap().field(0).name(), "n");
    let info = p.execute().await.unwrap();
    let b = fetch(&mut alice, info).await.unwrap();
    assert_eq!(rows(&b), 1);
    p.close().await.unwrap();

    // A client that goes away mid-stream: the server keeps serving.
    let info = alice
        .execute(
            "SELECT value FROM generate_series(1, 300000)".to_string(),
            None,
        )
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut stream = alice.do_get(ticket).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0);
    drop(stream);
    // ... and one that goes away while its statement runs.
    let mut c = client(addr, Some(ALICE)).await;
    let slow = c.execute(
        "SELECT count(*) FROM generate_series(1, 100000000000) a".to_string(),
        None,
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), slow)
            .await
            .is_err()
    );
    drop(c);
    still_serving(addr).await;

    // The ledger verifies; the charges name their analysts, in the file and in dp_ledger().
    let mut alice = client(addr, Some(ALICE)).await;
    let rows = query(
        &mut alice,
        "SELECT DISTINCT analyst FROM dp_ledger() ORDER BY analyst",
    )
    .await
    .unwrap();
    let names: Vec<String> = column(&rows, "analyst")
        .iter()
        .flat_map(|a| {
            let a = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..a.len())
                .map(|i| a.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(names, ["alice", "bob"]);
    let report = dpfusion::accounting::verify(&s.ledger).unwrap();
    assert!(report.charges >= 2);
    let text = std::fs::read_to_string(&s.ledger).unwrap();
    assert!(text.contains(r#""analyst":"alice""#), "{text}");
    assert!(text.contains(r#""analyst":"bob""#), "{text}");
}

async fn query_ticket(
    c: &mut FlightSqlServiceClient<Channel>,
    ticket: &[u8],
) -> Result<Vec<RecordBatch>, Status> {
    let mut stream = c
        .do_get(Ticket::new(ticket.to_vec()))
        .await
        .map_err(status)?;
    let mut out = Vec::new();
    while let Some(b) = stream.next().await {
        out.push(b.map_err(status)?);
    }
    Ok(out)
}

/// How many `sql` the accountant admits on a fresh ledger for `people` at budget ε = `epsilon`,
/// one after the other.
async fn admissible(epsilon: f64, sql: &str) -> usize {
    let dir = common::temp_dir("serve-expected");
    let s = dpfusion::PrivateSession::open(
        dpfusion::SessionOptions::default().with_ledger(dir.join("l.jsonl")),
    )
    .await
    .unwrap();
    s.register_csv(
        "people",
        common::people_csv(),
        dpfusion::Registration::private().budget(epsilon, 1e-6),
    )
    .await
    .unwrap();
    for n in 0..10_000 {
        if let Err(e) = s.sql(sql).await {
            assert!(
                matches!(
                    dpfusion::Error::of(&e),
                    Some(dpfusion::Error::BudgetExceeded { .. })
                ),
                "{e}"
            );
            return n;
        }
    }
    panic!("never refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_32_clients_1000_queries_admit_exactly_the_budget() {
    const CLIENTS: usize = 32;
    const QUERIES: usize = 1000;
    let epsilon = 1.0;
    let dp = "SELECT dp_count(id, 0.1) AS n FROM people";
    let expected = admissible(epsilon, dp).await;
    assert!(expected > 10 && expected < QUERIES / 2, "{expected}");
    let s = serve_here("serve-load", epsilon, "max_concurrent_queries = 4").await;
    let addr = s.addr;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let token = if k % 2 == 0 { ALICE } else { BOB };
            let mut c = client(addr, Some(token)).await;
            let (mut admitted, mut exhausted, mut invalid) = (0usize, 0usize, 0usize);
            for i in (k..QUERIES).step_by(CLIENTS) {
                if i % 10 == 3 {
                    // An invalid query naming this client: its error may quote only it.
                    let marker = format!("nope_c{k}_q{i}");
                    let e = query(&mut c, &format!("SELECT {marker} FROM depts"))
                        .await
                        .unwrap_err();
                    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
                    assert!(e.message().contains(&marker), "{}", e.message());
                    assert_eq!(e.message().matches("nope_c").count(), 1, "{}", e.message());
                    invalid += 1;
                    continue;
                }
                match query(&mut c, dp).await {
                    Ok(b) => {
                        let n = column(&b, "n")[0]
                            .as_any()
                            .downcast_ref::<Float64Array>()
                            .map(|a| a.len())
                            .unwrap_or(1);
                        assert_eq!(n, 1);
                        admitted += 1;
                    }
                    Err(e) => {
                        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                        assert!(!e.message().contains("nope_c"), "{}", e.message());
                        exhausted += 1;
                    }
                }
            }
            (admitted, exhausted, invalid)
        }));
    }
    let (mut admitted, mut exhausted, mut invalid) = (0, 0, 0);
    for t in tasks {
        let (a, e, i) = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("the load finishes in time")
            .unwrap();
        admitted += a;
        exhausted += e;
        invalid += i;
    }
    let elapsed = started.elapsed();
    assert_eq!(admitted + exhausted + invalid, QUERIES);
    assert_eq!(
        admitted, expected,
        "admitted {admitted}, the budget allows {expected}"
    );
    let report = dpfusion::accounting::verify(&s.ledger).unwrap();
    assert_eq!(report.charges as usize, expected);
    eprintln!(
        "{QUERIES} statements from {CLIENTS} clients in {elapsed:?}: {admitted} admitted, \
         {exhausted} refused for budget, {invalid} invalid"
    );
    still_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_with_the_ledger_intact() {
    let mut s = start("serve-term", 1.0, "shutdown_grace_secs = 1");
    let mut c = client(s.addr, Some(ALICE)).await;
    query(&mut c, "SELECT dp_count(id, 0.2) AS n FROM people")
        .await
        .unwrap();
    // A statement under way when the signal comes: cancelled after the grace period.
    let addr = s.addr;
    let slow = tokio::spawn(async move {
        let mut c = client(addr, Some(BOB)).await;
        query(&mut c, SLOW).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(code) = s.child.try_wait().unwrap() {
            break code;
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    let e = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Cancelled | Code::Unknown
        ),
        "{e:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["ledger", "verify"])
        .arg(&s.ledger)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn serve_refuses_a_public_address_without_the_explicit_flag_and_a_catalog_without_analysts() {
    let dir = common::temp_dir("serve-refuse");
    let catalog = dir.join("c.toml");
    std::fs::write(
        &catalog,
        format!(
            "[session]\nledger = \"l.jsonl\"\n[[analyst]]\nname = \"a\"\ntoken_hash = \"{}\"\n",
            TokenHash::new(ALICE)
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["serve", "--listen", "0.0.0.0:0", "--catalog"])
        .arg(&catalog)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--insecure-listen-any") && err.contains("TLS"),
        "{err}"
    );
    std::fs::write(&catalog, "[session]\nledger = \"l.jsonl\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .args(["serve", "--listen", "127.0.0.1:0", "--catalog"])
        .arg(&catalog)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[[analyst]]"), "{err}");
    // `dpfusion token` prints a token and a hash that matches it.
    let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
        .arg("token")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let token = lines.next().unwrap();
    let hash = lines.next().unwrap();
    let hash = hash
        .strip_prefix("token_hash = \"")
        .and_then(|h| h.strip_suffix('"'))
        .unwrap();
    assert!(TokenHash::parse(hash).unwrap().matches(token));
}

/// The Python interpreter of the serve venv (scripts/setup-venv-serve.sh), or why there is none.
fn python_venv() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let have_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        return Err("python3 is not installed".into());
    }
    let out = Command::new("bash")
        .arg(root.join("scripts/setup-venv-serve.sh"))
        .output()
        .map_err(|e| format!("cannot run scripts/setup-venv-serve.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/setup-venv-serve.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_adbc_client_runs_queries_refusals_budget_and_exhaustion() {
    let python = match python_venv() {
        Ok(p) => p,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: the Python ADBC client test needs Python 3 and PyPI: {why}");
            return;
        }
        Err(why) => panic!("CI must run the Python ADBC client test: {why}"),
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_client.py");
    let tls = format!(
        "tls_cert = {:?}\ntls_key = {:?}",
        tls_file("server.crt"),
        tls_file("server.key")
    );
    for (tag, extra, tls) in [
        ("serve-adbc", "", false),
        ("serve-adbc-tls", tls.as_str(), true),
    ] {
        let s = serve_here(tag, 1.0, extra).await;
        let mut cmd = Command::new(&python);
        cmd.arg(&script).env("DPFUSION_TOKEN", ALICE);
        if tls {
            cmd.arg(format!("grpc+tls://localhost:{}", s.addr.port()))
                .arg(tls_file("ca.crt"));
        } else {
            cmd.arg(format!("grpc://{}", s.addr));
        }
        let out = tokio::task::block_in_place(|| cmd.output().unwrap());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{tag}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("all ok"), "{stdout}");
        dpfusion::accounting::verify(&s.ledger).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_connects_to_a_server_with_a_token_file() {
    let s = serve_here("serve-connect", 1.0, "").await;
    let token = s.dir.join("token");
    std::fs::write(&token, format!("{BOB}\n")).unwrap();
    let url = format!("grpc://{}", s.addr);
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(["--connect", &url, "--token-file"])
            .arg(&token)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = tokio::task::block_in_place(|| {
        run(&[
            "-c",
            "SELECT dp_count(id, 0.25) AS n FROM people; SHOW BUDGET",
            "--format",
            "csv",
        ])
    });
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.lines().next() == Some("n"), "{out}");
    assert!(out.contains("remaining_epsilon"), "{out}");
    assert!(err.contains("charged people"), "{err}");
    let (code, _, err) = tokio::task::block_in_place(|| run(&["-c", "SELECT age FROM people"]));
    assert_eq!(code, Some(1));
    assert!(err.contains("refused"), "{err}");
    // A wrong token: the server's message, exit 1.
    std::fs::write(&token, "not-a-token").unwrap();
    let (code, _, err) = tokio::task::block_in_place(|| run(&["-c", "SELECT 1"]));
    assert_eq!(code, Some(1));
    assert!(err.contains("token"), "{err}");
    // The charge names bob.
    let text = std::fs::read_to_string(&s.ledger).unwrap();
    assert!(text.contains(r#""analyst":"bob""#), "{text}");
}

/// A statement that runs for minutes (a count over 10^11 generated rows).
const SLOW: &str = "SELECT count(*) AS n FROM generate_series(1, 100000000000) a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_or_a_time_limit_cancels_the_statement() {
    // One statement at a time: the next one can start only once the first has let go.
    let s = serve_here(
        "serve-cancel",
        1.0,
        "max_concurrent_queries = 1\nquery_timeout_secs = 60",
    )
    .await;
    let mut c = client(s.addr, Some(ALICE)).await;
    let slow = c.execute(SLOW.to_string(), None);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), slow)
            .await
            .is_err()
    );
    drop(c);
    let started = Instant::now();
    let mut b = client(s.addr, Some(BOB)).await;
    tokio::time::timeout(Duration::from_secs(30), query(&mut b, "SELECT 1 AS one"))
        .await
        .expect("the abandoned statement was cancelled")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(s);

    let s = serve_here(
        "serve-timeout",
        1.0,
        "max_concurrent_queries = 1\nquery_timeout_secs = 1",
    )
    .await;
    let mut c = client(s.addr, Some(ALICE)).await;
    let e = tokio::time::timeout(Duration::from_secs(30), query(&mut c, SLOW))
        .await
        .expect("the time limit stops it")
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(
        e.message().contains("query_timeout_secs"),
        "{}",
        e.message()
    );
    still_serving(s.addr).await;
}

#[tokio::test]
async fn charges_without_an_analyst_keep_their_old_bytes_and_verify_with_new_ones() {
    let dir = common::temp_dir("serve-ledger-compat");
    let path = dir.join("l.jsonl");
    let s = dpfusion::PrivateSession::open(dpfusion::SessionOptions::default().with_ledger(&path))
        .await
        .unwrap();
    s.register_csv(
        "people",
        common::people_csv(),
        dpfusion::Registration::private().budget(1.0, 1e-6),
    )
    .await
    .unwrap();
    let q = "SELECT dp_count(id, 0.1) AS n FROM people";
    s.sql(q).await.unwrap();
    s.sql_as("carol", q).await.unwrap();
    let lines = common::lines(&path);
    let charges: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(r#""record":"charge""#))
        .collect();
    assert_eq!(charges.len(), 2);
    // A charge without an analyst is written as before the field existed.
    assert!(!charges[0].contains("analyst"), "{}", charges[0]);
    assert!(
        charges[1].contains(r#""analyst":"carol""#),
        "{}",
        charges[1]
    );
    drop(s);
    assert_eq!(dpfusion::accounting::verify(&path).unwrap().charges, 2);
    // And it replays.
    let s = dpfusion::PrivateSession::open(dpfusion::SessionOptions::default().with_ledger(&path))
        .await
        .unwrap();
    let entries = s.ledger();
    assert_eq!(entries[0].analyst, None);
    assert_eq!(entries[1].analyst.as_deref(), Some("carol"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repl_connects_to_a_server_in_a_pseudo_terminal() {
    let have_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the pseudo-terminal test: python3 is missing"
        );
        eprintln!("SKIPPED: the pseudo-terminal test needs python3");
        return;
    }
    let s = serve_here("serve-pty", 1.0, "").await;
    let token = s.dir.join("token");
    std::fs::write(&token, ALICE).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pty/remote_session.py");
    let url = format!("grpc://{}", s.addr);
    let history = s.dir.join("history");
    let o = tokio::task::block_in_place(|| {
        Command::new("python3")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_dpfusion"))
            .arg(&url)
            .arg(&token)
            .arg(&history)
            .output()
            .unwrap()
    });
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_when_the_owner_gives_a_certificate_and_key() {
    let extra = format!(
        "tls_cert = {:?}\ntls_key = {:?}",
        tls_file("server.crt"),
        tls_file("server.key")
    );
    let s = serve_here("serve-tls", 1.0, &extra).await;
    // The server says where: grpc+tls://.
    let ca = std::fs::read(tls_file("ca.crt")).unwrap();
    let channel = Channel::from_shared(format!("https://localhost:{}", s.addr.port()))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token(ALICE.to_string());
    let b = query(&mut c, "SELECT dp_count(id, 0.25) AS n FROM people")
        .await
        .unwrap();
    assert_eq!(rows(&b), 1);
    let e = query(&mut c, "SELECT age FROM people").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // A plaintext client gets no answer, only a transport error; the server goes on.
    let plain = Channel::from_shared(format!("http://{}", s.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(ch) = plain {
        let mut p = FlightSqlServiceClient::new(ch);
        p.set_token(ALICE.to_string());
        assert!(query(&mut p, "SELECT 1").await.is_err());
    }
    let b = query(&mut c, "SELECT 1 AS one").await.unwrap();
    assert_eq!(rows(&b), 1);
    // The command line client, with the CA.
    let token = s.dir.join("token");
    std::fs::write(&token, ALICE).unwrap();
    let url = format!("grpc+tls://localhost:{}", s.addr.port());
    let out = tokio::task::block_in_place(|| {
        Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(["--connect", &url, "--token-file"])
            .arg(&token)
            .arg("--tls-ca")
            .arg(tls_file("ca.crt"))
            .args(["-c", "SHOW BUDGET", "--format", "csv"])
            .output()
            .unwrap()
    });
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("remaining_epsilon"));
    // Without the CA: a message that says what to give.
    let out = tokio::task::block_in_place(|| {
        Command::new(env!("CARGO_BIN_EXE_dpfusion"))
            .args(["--connect", &url, "--token-file"])
            .arg(&token)
            .args(["-c", "SELECT 1"])
            .output()
            .unwrap()
    });
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-ca"));
}

#[test]
fn the_catalog_checks_analysts_and_server_keys() {
    use dpfusion::catalog::Catalog;
    let parse = |text: &str| Catalog::parse(text, Path::new("/srv/owner/dpfusion.toml"));
    let hash = TokenHash::new(ALICE);
    let c = parse(&format!(
        "[[analyst]]\nname = \"alice\"\ntoken_hash = \"{hash}\"\n[server]\nlisten = \
         \"127.0.0.1:0\"\nquery_timeout_secs = 2.5\nmax_concurrent_queries = 3\n\
         max_sql_bytes = 1000\ntls_cert = \"tls/c.pem\"\ntls_key = \"tls/k.pem\"\n"
    ))
    .unwrap();
    assert_eq!(c.analysts[0].name, "alice");
    assert_eq!(c.server.query_timeout_secs, Some(2.5));
    assert_eq!(c.server.max_concurrent_queries, Some(3));
    assert_eq!(
        c.resolve(c.server.tls_cert.as_deref().unwrap()),
        Path::new("/srv/owner/tls/c.pem")
    );
    let err = |text: &str| parse(text).unwrap_err().to_string();
    // A token instead of its hash, a typo, a second alice, an unknown [server] key.
    let e = err(&format!(
        "[[analyst]]\nname = \"a\"\ntoken_hash = \"{ALICE}\"\n"
    ));
    assert!(e.contains("dpfusion token"), "{e}");
    let e = err(&format!("[[analyst]]\nname = \"a\"\ntoken = \"{hash}\"\n"));
    assert!(e.contains("token"), "{e}");
    let two = format!("[[analyst]]\nname = \"a\"\ntoken_hash = \"{hash}\"\n");
    let e = err(&format!("{two}{two}"));
    assert!(e.contains("declared twice"), "{e}");
    let e = err("[server]\nlisten_on = \"127.0.0.1:1\"\n");
    assert!(e.contains("listen_on"), "{e}");
}
