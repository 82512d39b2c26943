//! `dpfusion serve`: an Arrow Flight SQL server over one [`PrivateSession`] (docs/SQL.md,
//! README "Serving analysts").
//!
//! Every statement an analyst sends runs through [`PrivateSession::sql_as`], the path the REPL
//! uses: parse, guard, admission (atomic and durable in the accountant, the charge naming the
//! analyst), then execution. Only then is a result kept for the analyst to fetch: the statement
//! runs in `GetFlightInfo` (so refusals and budget errors come back there), and the `DoGet` of
//! its ticket streams the result's batches, once.
//!
//! - **Authentication**: every call carries `authorization: Bearer <token>`; the catalog holds
//!   each analyst's salted token hash ([`auth`]).
//! - **One session for all analysts.** Statements that would change it (`SET`, `CREATE`, `DROP`,
//!   `COPY`, …) are refused over the server, so no analyst's setting or table reaches another.
//! - **Limits**: a statement's time limit (admission and execution; the query is cancelled
//!   when it passes, its charge stands), a bound on statements running at once (they share the
//!   session's memory limit), and on the SQL's size. A client that goes away cancels its query
//!   (the charge stands).
//! - **Errors** are the REPL's messages, as Flight status codes: `InvalidArgument` for a
//!   refusal or invalid input, `ResourceExhausted` for a budget refusal, `Unauthenticated`.
pub mod auth;
pub mod client;
pub mod cmd;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandStatementQuery, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::common::DataFusionError;
use futures::{Stream, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::error::Error;
use crate::session::{PrivateSession, QueryResult};
use auth::Analysts;

/// The catalog and schema names the server reports (DataFusion's defaults).
pub const CATALOG_NAME: &str = "datafusion";
pub const SCHEMA_NAME: &str = "public";

/// The longest status message sent (a gRPC status travels in a header, which clients bound).
const MAX_MESSAGE: usize = 4096;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The address to listen on (port 0: any free port; [`Bound::addr`] tells which).
    pub listen: SocketAddr,
    /// Listen on a non-loopback address without TLS (tokens and results then cross the network
    /// in clear).
    pub insecure_listen_any: bool,
    /// A statement's time limit: waiting for its turn, admission and execution.
    pub query_timeout: Duration,
    /// How many statements run at once.
    pub max_concurrent_queries: usize,
    /// The longest SQL text accepted, in bytes.
    pub max_sql_bytes: usize,
    /// How long a result waits to be fetched (`DoGet`) before it is dropped.
    pub result_ttl: Duration,
    /// How many results may wait to be fetched, all analysts together.
    pub max_pending_results: usize,
    /// How many bytes of results may wait to be fetched, all analysts together.
    pub max_pending_bytes: usize,
    /// Serve over TLS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// After the shutdown signal, how long calls under way may take to finish before they are
    /// cancelled ([`Bound::serve`]).
    pub shutdown_grace: Duration,
}

/// The server's certificate chain and private key, PEM.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// The default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("a valid address"),
            insecure_listen_any: false,
            query_timeout: Duration::from_secs(300),
            max_concurrent_queries: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            max_sql_bytes: 1 << 20,
            result_ttl: Duration::from_secs(600),
            max_pending_results: 4096,
            max_pending_bytes: 1 << 30,
            tls: None,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} without TLS: bearer tokens and results would cross the \
         network in clear. Give the server a certificate and key (--tls-cert FILE --tls-key \
         FILE, or tls_cert and tls_key in [server]), or listen on a loopback address \
         (127.0.0.1, the default), or pass --insecure-listen-any on a network you trust"
    )]
    NotLoopback(SocketAddr),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(
        "no analyst can connect: the catalog lists no [[analyst]]. Add one per analyst with \
         name = \"…\" and the token_hash that 'dpfusion token' prints (docs/CATALOG.md)"
    )]
    NoAnalyst,
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("the server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A statement's `FlightInfo.app_metadata` (JSON): its charge receipt, as the REPL prints it,
/// and the private tables it used.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StatementMetadata {
    pub receipt: Option<String>,
    pub tables: Vec<String>,
}

/// The runtime statements run on, apart from the one serving calls. Shut down in the
/// background when the server goes (it may be dropped inside an async context).
struct QueryRuntime(Option<tokio::runtime::Runtime>);

impl QueryRuntime {
    fn new() -> std::io::Result<Self> {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("dpfusion-query")
            .enable_all()
            .build()?;
        Ok(Self(Some(rt)))
    }

    fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(rt) => rt.spawn(f),
            None => tokio::spawn(f),
        }
    }
}

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A result waiting for its `DoGet`.
struct Pending {
    analyst: String,
    result: QueryResult,
    at: Instant,
}

struct Shared {
    session: Arc<PrivateSession>,
    analysts: Analysts,
    options: ServeOptions,
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
    running: Arc<tokio::sync::Semaphore>,
    queries: QueryRuntime,
    /// Set when the server cancels the statements under way (shutdown after its grace).
    cancel: tokio::sync::watch::Sender<bool>,
    sql_info: SqlInfoData,
}

/// The Flight SQL service (cheap to clone: it shares one state).
#[derive(Clone)]
pub struct DpFlightSql(Arc<Shared>);

/// A server bound to its address, not yet serving.
pub struct Bound {
    listener: tokio::net::TcpListener,
    service: DpFlightSql,
    addr: SocketAddr,
    tls: Option<tonic::transport::Identity>,
}

impl Bound {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL clients connect to: `grpc+tls://ADDR` with TLS, else `grpc://ADDR`.
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("grpc+tls://{}", self.addr),
            None => format!("grpc://{}", self.addr),
        }
    }

    /// Serves until `shutdown` completes; then stops accepting calls, and gives the calls under
    /// way [`ServeOptions::shutdown_grace`] to finish before it cancels them (their statements'
    /// charges, made before any row was read, stand).
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let grace = self.service.0.options.shutdown_grace;
        let shared = Arc::clone(&self.service.0);
        let (stopping, mut stopped) = tokio::sync::watch::channel(false);
        let signal = async move {
            shutdown.await;
            let _ = stopping.send(true);
        };
        // After the signal and the grace period, cancel what still runs; a call that still
        // does not end (a client that reads no result) is left behind a few seconds later.
        let canceller = async move {
            let _ = stopped.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
            shared.cancel.send_replace(true);
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        tokio::select! {
            r = self.serve_until(signal) => r,
            _ = canceller => Ok(()),
        }
    }

    async fn serve_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let limit = (self.service.0.options.max_sql_bytes + (1 << 20)).max(4 << 20);
        let svc = FlightServiceServer::new(self.service)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(64 << 20);
        let incoming =
            tonic::transport::server::TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let mut builder = tonic::transport::Server::builder();
        if let Some(identity) = self.tls {
            builder = builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| ServeError::Tls(e.to_string()))?;
        }
        builder
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }
}

/// Binds the server for `session` (the data owner's, its tables registered) and `analysts`.
pub async fn bind(
    session: Arc<PrivateSession>,
    analysts: Analysts,
    options: ServeOptions,
) -> Result<Bound, ServeError> {
    if !options.listen.ip().is_loopback() && options.tls.is_none() && !options.insecure_listen_any {
        return Err(ServeError::NotLoopback(options.listen));
    }
    let tls = match &options.tls {
        None => None,
        Some(files) => {
            let read = |p: &std::path::Path, what: &str| {
                std::fs::read(p).map_err(|e| {
                    ServeError::Tls(format!("cannot read the {what} {}: {e}", p.display()))
                })
            };
            let cert = read(&files.cert, "certificate")?;
            let key = read(&files.key, "private key")?;
            Some(tonic::transport::Identity::from_pem(cert, key))
        }
    };
    if analysts.is_empty() {
        return Err(ServeError::NoAnalyst);
    }
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| ServeError::Bind(options.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Bind(options.listen, e))?;
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "dpfusion");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    info.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    info.append(SqlInfo::FlightSqlServerReadOnly, true);
    let sql_info = info
        .build()
        .map_err(|e| ServeError::Bind(addr, std::io::Error::other(e.to_string())))?;
    let running = Arc::new(tokio::sync::Semaphore::new(
        options.max_concurrent_queries.max(1),
    ));
    let queries = QueryRuntime::new()
        .map_err(|e| ServeError::Bind(addr, std::io::Error::other(e.to_string())))?;
    let service = DpFlightSql(Arc::new(Shared {
        session,
        analysts,
        options,
        pending: Mutex::new(HashMap::new()),
        running,
        queries,
        cancel: tokio::sync::watch::Sender::new(false),
        sql_info,
    }));
    Ok(Bound {
        listener,
        service,
        addr,
        tls,
    })
}

/// Cuts a message to [`MAX_MESSAGE`] bytes (at a character boundary).
fn cut(mut m: String) -> String {
    if m.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push('…');
    }
    m
}

/// The status a client gets for a statement's error: the REPL's message, with its kind as the
/// code.
pub fn status_of(e: &DataFusionError) -> Status {
    let full = e.to_string();
    let msg = full
        .strip_prefix("Error during planning: ")
        .or_else(|| full.strip_prefix("External error: "))
        .unwrap_or(&full)
        .to_string();
    let msg = cut(msg);
    match Error::of(e) {
        Some(Error::BudgetExceeded { .. }) => Status::resource_exhausted(msg),
        Some(Error::Refused(_) | Error::Invalid(_) | Error::Policy(_)) => {
            Status::invalid_argument(msg)
        }
        Some(Error::ExecutionFailed) | None => Status::internal(msg),
    }
}

fn refusal(msg: impl Into<String>) -> Status {
    Status::invalid_argument(cut(msg.into()))
}

/// The first keyword of every statement in `sql` (after whitespace, comments and empty
/// statements), upper case. The parser skips leading `;`, so `; SET …` is a `SET`.
fn statement_keywords(sql: &str) -> Vec<String> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let dialect = GenericDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, sql).tokenize() else {
        return vec![];
    };
    let mut out = Vec::new();
    let mut at_start = true;
    for t in tokens {
        match t {
            Token::Whitespace(_) => {}
            Token::SemiColon => at_start = true,
            Token::Word(w) if at_start => {
                out.push(w.value.to_ascii_uppercase());
                at_start = false;
            }
            _ => at_start = false,
        }
    }
    out
}

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

fn batches_stream(schema: SchemaRef, batches: Vec<RecordBatch>) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::iter(batches.into_iter().map(Ok)))
        .map_err(Status::from);
    Box::pin(stream)
}

fn info_for(
    command: &impl ProstMessageExt,
    schema: &Schema,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let ticket = Ticket::new(command.as_any().encode_to_vec());
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(e.to_string()))?
        .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
        .with_descriptor(descriptor))
}

impl DpFlightSql {
    /// The analyst a call comes from: its bearer token must be one of the catalog's.
    fn analyst<T>(&self, request: &Request<T>) -> Result<String, Status> {
        let Some(value) = request.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "no token: send the header 'authorization: Bearer <token>' with the token the \
                 data owner gave you",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "the authorization header must be 'Bearer <token>' (the token the data \
                     owner gave you)",
                )
            })?;
        self.0
            .analysts
            .authenticate(token)
            .map(str::to_string)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "the token is not valid for this server: check it, or ask the data owner \
                     for one",
                )
            })
    }

    /// Runs one statement for `analyst`, within the server's limits.
    async fn run(&self, analyst: &str, sql: &str) -> Result<QueryResult, Status> {
        let o = &self.0.options;
        if sql.len() > o.max_sql_bytes {
            return Err(refusal(format!(
                "dpfusion refused the query: its SQL text is {} bytes, and this server accepts \
                 at most {} (the data owner's [server] max_sql_bytes)",
                sql.len(),
                o.max_sql_bytes
            )));
        }
        // A positive list: queries and the read-only session statements. Anything else (SET,
        // CREATE, DROP, COPY, DML, …) would change the one session every analyst shares.
        if let Some(k) = statement_keywords(sql).into_iter().find(|k| {
            !matches!(
                k.as_str(),
                "SELECT" | "WITH" | "SHOW" | "EXPLAIN" | "DESCRIBE" | "DESC" | "VALUES"
            )
        }) {
            return Err(refusal(format!(
                "dpfusion refused the query: {k} is not available over the server: one session \
                 serves every analyst, and a statement that changes it would reach the others \
                 (the server runs SELECT, WITH, VALUES, SHOW, DESCRIBE and EXPLAIN). Give delta \
                 => … in each DP call instead of SET dpfusion.default_delta, and keep results on \
                 your side (the data owner declares tables and default contribution bounds in \
                 the catalog)"
            )));
        }
        let timeout = o.query_timeout;
        let run = async {
            let turn = Arc::clone(&self.0.running)
                .acquire_owned()
                .await
                .map_err(|_| Status::unavailable("the server is shutting down"))?;
            // The statement runs on the query runtime, so that a long scan or model fit never
            // holds up the calls of other clients; its turn ends when its task does.
            let session = Arc::clone(&self.0.session);
            let (analyst, sql) = (analyst.to_string(), sql.to_string());
            let task = self.0.queries.spawn(async move {
                let _turn = turn;
                session.sql_as(&analyst, &sql).await
            });
            // Dropping this call (client gone, time limit) aborts the task: the query stops at
            // its next await point; an admitted charge stands.
            let _abort = AbortOnDrop(task.abort_handle());
            match task.await {
                Ok(r) => r.map_err(|e| status_of(&e)),
                Err(_) => Err(Status::internal(
                    "dpfusion: the statement failed (an internal error). No detail is shown: it \
                     could quote private data. If it was admitted, its charge stands",
                )),
            }
        };
        let mut cancel = self.0.cancel.subscribe();
        tokio::select! {
            r = tokio::time::timeout(timeout, run) => match r {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "the statement ran longer than the server's limit of {} s and was \
                     cancelled; if it was admitted, its charge stands (the data owner's \
                     [server] query_timeout_secs)",
                    timeout.as_secs_f64()
                ))),
            },
            _ = cancel.wait_for(|c| *c) => Err(Status::unavailable(
                "the server is shutting down and cancelled the statement; if it was admitted, \
                 its charge stands",
            )),
        }
    }

    /// Keeps a result for its `DoGet`; returns the ticket's handle.
    fn keep(&self, analyst: &str, result: QueryResult) -> Result<Vec<u8>, Status> {
        use rand::RngCore;
        let mut pending = self.0.pending.lock().expect("lock");
        let ttl = self.0.options.result_ttl;
        pending.retain(|_, p| p.at.elapsed() < ttl);
        let size = |r: &QueryResult| -> usize {
            r.batches.iter().map(|b| b.get_array_memory_size()).sum()
        };
        let waiting: usize = pending.values().map(|p| size(&p.result)).sum();
        if pending.len() >= self.0.options.max_pending_results
            || waiting + size(&result) > self.0.options.max_pending_bytes
        {
            return Err(Status::unavailable(
                "too many results (or too large ones) are waiting to be fetched; fetch (DoGet) \
                 the results of your earlier statements, select fewer rows, or try again later. \
                 If this statement was charged, its charge stands",
            ));
        }
        let mut handle = vec![0u8; 16];
        rand::rng().fill_bytes(&mut handle);
        pending.insert(
            handle.clone(),
            Pending {
                analyst: analyst.to_string(),
                result,
                at: Instant::now(),
            },
        );
        Ok(handle)
    }

    async fn statement_info(
        &self,
        sql: &str,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let analyst = self.analyst(&request)?;
        let result = self.run(&analyst, sql).await?;
        let schema = result.schema.clone();
        let rows: usize = result.batches.iter().map(|b| b.num_rows()).sum();
        let meta = StatementMetadata {
            receipt: result.receipt.as_ref().map(crate::statements::receipt_line),
            tables: result.tables.clone(),
        };
        let meta = serde_json::to_vec(&meta).map_err(|e| Status::internal(e.to_string()))?;
        let handle = self.keep(&analyst, result)?;
        let ticket = TicketStatementQuery {
            statement_handle: handle.into(),
        };
        let info = info_for(&ticket, &schema, request.into_inner())?
            .with_total_records(rows as i64)
            .with_ordered(true)
            .with_app_metadata(meta);
        Ok(Response::new(info))
    }

    fn tables_batch(&self, query: CommandGetTables) -> Result<RecordBatch, Status> {
        let mut builder = query.into_builder();
        for (name, _, schema) in self.0.session.tables() {
            builder
                .append(CATALOG_NAME, SCHEMA_NAME, &name, "TABLE", &schema)
                .map_err(Status::from)?;
        }
        builder.build().map_err(Status::from)
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| refusal(format!("the {what} is not UTF-8 text; send SQL text")))
}

fn one_batch(batch: Result<RecordBatch, Status>) -> Result<Response<DoGetStream>, Status> {
    let batch = batch?;
    Ok(Response::new(batches_stream(batch.schema(), vec![batch])))
}

#[tonic::async_trait]
impl FlightSqlService for DpFlightSql {
    type FlightService = DpFlightSql;

    /// A bearer token is checked and echoed back; nothing else is needed (every call carries
    /// the token).
    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        self.analyst(&request)?;
        let header = request
            .metadata()
            .get("authorization")
            .cloned()
            .ok_or_else(|| Status::unauthenticated("no token"))?;
        let out = futures::stream::iter(vec![Ok(HandshakeResponse::default())]);
        let mut resp: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(out));
        resp.metadata_mut().insert("authorization", header);
        Ok(resp)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if query.transaction_id.is_some() {
            self.analyst(&request)?;
            return Err(refusal(
                "dpfusion does not support transactions: send statements without one",
            ));
        }
        self.statement_info(&query.query, request).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = utf8(&cmd.prepared_statement_handle, "prepared statement handle")?;
        self.statement_info(&sql, request).await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let analyst = self.analyst(&request)?;
        let mut pending = self.0.pending.lock().expect("lock");
        let handle = ticket.statement_handle.to_vec();
        let mine = pending
            .get(&handle)
            .is_some_and(|p| p.analyst == analyst && p.at.elapsed() < self.0.options.result_ttl);
        let Some(p) = mine.then(|| pending.remove(&handle)).flatten() else {
            return Err(Status::not_found(
                "no result for this ticket: a result is fetched once, by the analyst who ran \
                 the statement, within the server's result time limit. Run the statement again \
                 (a DP query is charged again)",
            ));
        };
        drop(pending);
        Ok(Response::new(batches_stream(
            p.result.schema,
            p.result.batches,
        )))
    }

    async fn do_get_prepared_statement(
        &self,
        _query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        Err(refusal(
            "fetch a prepared statement's result with the ticket its GetFlightInfo returns",
        ))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request)?;
        let schema = query.into_builder().schema();
        Ok(Response::new(info_for(
            &query,
            &schema,
            request.into_inner(),
        )?))
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME);
        one_batch(builder.build().map_err(Status::from))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request)?;
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(info_for(
            &query,
            &schema,
            request.into_inner(),
        )?))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME, SCHEMA_NAME);
        one_batch(builder.build().map_err(Status::from))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request)?;
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(info_for(
            &query,
            &schema,
            request.into_inner(),
        )?))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        one_batch(self.tables_batch(query))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request)?;
        let schema = table_types_batch().schema();
        Ok(Response::new(info_for(
            &query,
            &schema,
            request.into_inner(),
        )?))
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        one_batch(Ok(table_types_batch()))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request)?;
        let schema = query.clone().into_builder(&self.0.sql_info).schema();
        Ok(Response::new(info_for(
            &query,
            &schema,
            request.into_inner(),
        )?))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        one_batch(
            query
                .into_builder(&self.0.sql_info)
                .build()
                .map_err(Status::from),
        )
    }

    /// A prepared statement's handle is its SQL; it runs (and is charged) at each execution.
    /// Its result schema is the plan's when the statement is a query the guard accepts, else
    /// unknown (empty) until it runs.
    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        self.analyst(&request)?;
        if query.transaction_id.is_some() {
            return Err(refusal(
                "dpfusion does not support transactions: prepare statements without one",
            ));
        }
        if query.query.len() > self.0.options.max_sql_bytes {
            return Err(refusal(format!(
                "dpfusion refused the query: its SQL text is {} bytes, and this server accepts \
                 at most {}",
                query.query.len(),
                self.0.options.max_sql_bytes
            )));
        }
        let schema = match self.0.session.check(&query.query).await {
            Ok(g) => g.schema().as_ref().clone(),
            Err(_) => Schema::empty(),
        };
        let message: IpcMessage = SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: datafusion::arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema: message.0,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        self.analyst(&request)?;
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        _query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        self.analyst(&request)?;
        Err(refusal(
            "dpfusion does not support parameters in prepared statements: write the values into \
             the SQL text",
        ))
    }

    async fn do_get_fallback(
        &self,
        request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<DoGetStream>, Status> {
        self.analyst(&request)?;
        Err(refusal(format!(
            "dpfusion serve does not support this request ({})",
            message.type_url
        )))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

fn table_types_batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "table_type",
        DataType::Utf8,
        false,
    )]));
    RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec!["TABLE"]))])
        .expect("a valid batch")
}

/// The service behind a Flight server (for embedding in one's own tonic server).
pub fn flight_service(bound: &Bound) -> FlightServiceServer<DpFlightSql> {
    FlightServiceServer::new(bound.service.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_keywords_skip_comments_and_empty_statements() {
        let k = |s: &str| statement_keywords(s);
        assert_eq!(k("  -- x\n/* y */ set a = 1"), vec!["SET"]);
        assert_eq!(k("; ;SET a = 1"), vec!["SET"]);
        assert_eq!(k("SELECT 1; drop table t"), vec!["SELECT", "DROP"]);
        assert_eq!(k("SELECT 'SET'"), vec!["SELECT"]);
        assert!(k("(SELECT 1)").is_empty());
        assert!(k("").is_empty());
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let m = cut("é".repeat(5000));
        assert!(m.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(m.ends_with('…'));
    }
}
