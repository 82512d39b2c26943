//! `dpfusion --connect grpc://HOST:PORT --token-file F`: the REPL's backend (and `-c`/`-f`'s) as a
//! client of `dpfusion serve`. Statements run on the server, exactly as they would locally; the
//! prompt shows the remaining budget of the tables used last (from `SHOW BUDGET`), `\d` the
//! server's tables (Flight SQL `GetTables`), and completion knows their names and columns.
//! Results are read in messages up to the server's largest
//! (`dpfusion::serve::MAX_SENT_MESSAGE_BYTES`), and a statement that was charged and failed,
//! its result not read included, shows its receipt ([`Outcome::Failed`], round 50).
use std::path::Path;
use std::time::Duration;

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::CommandGetTables;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{Array, BinaryArray, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use dpfusion::accounting::display::{Round, num, percent};
use dpfusion::serve::StatementMetadata;
use futures::StreamExt;
use tonic::transport::Channel;

use super::format::OutputFormat;
use super::{Answer, Backend, Charged, Outcome, TableBudget};

/// A connection to a `dpfusion serve`.
pub struct Remote {
    client: FlightSqlServiceClient<Channel>,
    url: String,
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
        // Messages up to the server's largest, not tonic's default 4 MiB: the server never
        // splits a row, and a result with a row of 8 MB was charged, then could not be decoded
        // (round 50, review python F3).
        let inner = FlightServiceClient::new(channel)
            .max_decoding_message_size(dpfusion::serve::MAX_SENT_MESSAGE_BYTES);
        let mut client = FlightSqlServiceClient::new_from_inner(inner);
        client.set_token(token.to_string());
        let mut r = Remote {
            client,
            url: url.to_string(),
        };
        r.server_tables().await?;
        Ok(r)
    }

    async fn fetch(&mut self, info: arrow_flight::FlightInfo) -> Result<Vec<RecordBatch>, String> {
        self.fetch_flight(info).await.map_err(message)
    }

    async fn fetch_flight(
        &mut self,
        info: arrow_flight::FlightInfo,
    ) -> Result<Vec<RecordBatch>, FlightError> {
        let mut out = Vec::new();
        for ep in info.endpoint {
            let Some(ticket) = ep.ticket else { continue };
            let mut stream = self.client.do_get(ticket).await?;
            while let Some(b) = stream.next().await {
                out.push(b?);
            }
        }
        Ok(out)
    }

    /// Runs one statement on the server.
    pub async fn run(&mut self, sql: &str) -> Result<Answer, String> {
        self.run_charged(sql).await.map_err(|(e, _)| e)
    }

    /// [`Remote::run`], with what a statement that failed after its admission was charged: the
    /// server sends its receipt with the error (`dpfusion::serve::RECEIPT_HEADER`, round 49,
    /// review composition F4), or, when its result cannot be read, with the result
    /// ([`failed`]).
    async fn run_charged(&mut self, sql: &str) -> Result<Answer, (String, Option<Charged>)> {
        let info = self
            .client
            .execute(sql.to_string(), None)
            .await
            .map_err(|e| failed(e, None))?;
        let meta: StatementMetadata =
            serde_json::from_slice(&info.app_metadata).unwrap_or_default();
        let schema = info
            .clone()
            .try_decode_schema()
            .map(std::sync::Arc::new)
            .map_err(|e| (format!("the server sent a bad schema: {e}"), charged(&meta)))?;
        let batches = self
            .fetch_flight(info)
            .await
            .map_err(|e| failed(e, Some(&meta)))?;
        Ok(Answer {
            schema,
            batches,
            receipt: meta.receipt_text,
            tables: meta.tables,
        })
    }

    /// The outcome of one statement: [`Outcome::Failed`] when it failed after its admission.
    async fn outcome(&mut self, sql: &str) -> Outcome {
        match self.run_charged(sql).await {
            Ok(a) => Outcome::Done(Ok(a)),
            Err((e, Some(c))) => Outcome::Failed(e, c),
            Err((e, None)) => Outcome::Done(Err(e)),
        }
    }

    /// The server's tables and their schemas.
    pub async fn server_tables(&mut self) -> Result<Vec<(String, SchemaRef)>, String> {
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
                    Some(d) if !d.is_null(i) && d.value(i) != dpfusion::serve::SCHEMA_NAME => {
                        format!("{}.{}", d.value(i), names.value(i))
                    }
                    _ => names.value(i).to_string(),
                };
                out.push((name, std::sync::Arc::new(schema)));
            }
        }
        Ok(out)
    }
}

/// What a statement that ended with `e` was charged, with the error's message: the receipt
/// the error carries, else the one its result carried (`answered`: the statement's `FlightInfo`
/// metadata, when it was answered). Round 50 (review python F3): a result charged, then not
/// fetched or not decoded (a row wider than the client's limit) showed no charge; it is a
/// charged failure, [`Outcome::Failed`].
fn failed(e: FlightError, answered: Option<&StatementMetadata>) -> (String, Option<Charged>) {
    let sent = match &e {
        FlightError::Tonic(s) => dpfusion::serve::receipt_of(s),
        _ => None,
    };
    let charged = sent
        .as_ref()
        .and_then(charged)
        .or_else(|| answered.and_then(charged));
    (message(e), charged)
}

/// The charge `m` (a statement's metadata) says, if it was charged.
fn charged(m: &StatementMetadata) -> Option<Charged> {
    Some(Charged {
        receipt: m.receipt_text.clone()?,
        tables: m.tables.clone(),
    })
}

/// A column of `b` by name and type.
fn column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Option<&'a T> {
    b.column_by_name(name)?.as_any().downcast_ref::<T>()
}

/// The budgets in `SHOW BUDGET`'s batches (statements::budget_batch's columns).
fn budget_rows(batches: &[RecordBatch]) -> Vec<TableBudget> {
    let mut out = Vec::new();
    for b in batches {
        let (Some(t), Some(e), Some(left), Some(rem), Some(ds), Some(dl)) = (
            column::<StringArray>(b, "table"),
            column::<Float64Array>(b, "epsilon"),
            column::<Float64Array>(b, "left_pct"),
            column::<Float64Array>(b, "remaining_epsilon"),
            column::<Float64Array>(b, "spent_delta"),
            column::<Float64Array>(b, "remaining_delta"),
        ) else {
            continue;
        };
        for i in 0..t.len() {
            out.push(TableBudget {
                name: t.value(i).to_string(),
                epsilon: e.value(i),
                // `left_pct` is the share in millionths divided by 10⁴ (statements::budget_batch):
                // back to millionths, exactly.
                left_share: (left.value(i) * 1e4).round().max(0.0) as u64,
                remaining: rem.value(i),
                delta_spent: ds.value(i),
                delta_left: dl.value(i),
            });
        }
    }
    out
}

impl Backend for Remote {
    fn greeting(&self) -> String {
        format!("connected to {}", self.url)
    }

    async fn sql(&mut self, sql: &str) -> Result<Answer, String> {
        self.run(sql).await
    }

    async fn sql_outcome(&mut self, sql: &str) -> Outcome {
        self.outcome(sql).await
    }

    async fn sql_interruptible(&mut self, sql: &str) -> Outcome {
        tokio::select! {
            r = self.outcome(sql) => r,
            // The server cancels a query whose client went away (its charge stands); which
            // charge was made, if any, is in the ledger (`\ledger`).
            _ = tokio::signal::ctrl_c() => Outcome::Cancelled(None),
        }
    }

    /// From `SHOW BUDGET`'s rows.
    async fn budget(&mut self) -> Vec<TableBudget> {
        match self.run("SHOW BUDGET").await {
            Ok(r) => budget_rows(&r.batches),
            Err(_) => vec![],
        }
    }

    async fn budget_table(&mut self) -> Result<Answer, String> {
        self.run("SHOW BUDGET").await
    }

    async fn ledger_table(&mut self, format: OutputFormat) -> Result<Answer, String> {
        // As the local `\ledger`: every column, the events (`profile`) left out on screen
        // (review r45: this selected an `epsilon` column dp_ledger() no longer has).
        let mut a = self.run("SELECT * FROM dp_ledger()").await?;
        if format == OutputFormat::Table {
            let keep = super::ledger_on_screen(&a.schema);
            a.schema = std::sync::Arc::new(a.schema.project(&keep).map_err(|e| e.to_string())?);
            a.batches = a
                .batches
                .iter()
                .map(|b| b.project(&keep))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
        }
        Ok(a)
    }

    async fn tables(&mut self) -> Vec<(String, SchemaRef)> {
        self.server_tables().await.unwrap_or_default()
    }

    async fn describe(&mut self, table: &str) -> Result<String, String> {
        let tables = self.server_tables().await?;
        let budget = self.budget().await;
        let policy = |name: &str| match budget.iter().find(|b| b.name == name) {
            // An infinite guarantee is one the owner voided (round 52, review "operator" F3).
            Some(b) if b.epsilon.is_infinite() => format!(
                "private, no DP guarantee (the owner's ledger says since when), {} left (one \
                 more query could use ε ≤ {})",
                percent(b.left_share),
                num(b.remaining, Round::Down)
            ),
            Some(b) => format!(
                "private, budget ε {}, {} left (one more query could use ε ≤ {})",
                dpfusion::accounting::display::budget(b.epsilon),
                percent(b.left_share),
                num(b.remaining, Round::Down)
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
            return Ok(out);
        }
        let want = table.to_ascii_lowercase();
        let Some((name, schema)) = tables.iter().find(|(n, _)| *n == want) else {
            return Err(format!(
                "no table '{table}' (tables: {})",
                tables
                    .iter()
                    .map(|t| t.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let mut out = format!("Table {name}: {}\n  columns:\n", policy(name));
        for f in schema.fields() {
            out.push_str(&format!("    {:<14} {}\n", f.name(), f.data_type()));
        }
        out.push_str("  (SHOW TABLES shows neighbours and public columns)");
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The prompt's numbers from the server's `SHOW BUDGET` are the local ones: the share left
    /// back in millionths exactly (97.5% and 1/3 of a budget), δ spent and left as sent.
    #[test]
    fn show_budget_rows_give_the_local_prompts_numbers() {
        use datafusion::arrow::array::ArrayRef;
        let f = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
        let b = RecordBatch::try_from_iter(vec![
            (
                "table",
                Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            ("epsilon", f(vec![5.0, 1.0])),
            ("left_pct", f(vec![975_000.0 / 1e4, 333_334.0 / 1e4])),
            ("remaining_epsilon", f(vec![4.1, 0.2])),
            ("spent_delta", f(vec![0.0, 3e-7])),
            ("remaining_delta", f(vec![1e-6, 7e-7])),
        ])
        .unwrap();
        let rows = budget_rows(&[b]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].name.as_str(), rows[0].left_share), ("a", 975_000));
        assert_eq!(percent(rows[0].left_share), "97.5%");
        assert_eq!(rows[1].left_share, 333_334);
        assert_eq!(percent(rows[1].left_share), "33.3334%");
        assert_eq!((rows[1].delta_spent, rows[1].delta_left), (3e-7, 7e-7));
        assert_eq!(rows[1].epsilon, 1.0);
    }

    /// Round 50 (review python F3): a result charged, then not decoded (a row past the
    /// client's limit), showed no charge. Now the receipt its `FlightInfo` carried makes it a
    /// charged failure; a receipt the error carries comes first; an uncharged statement's error
    /// and one before any answer show none.
    #[test]
    fn r50_a_result_charged_then_not_read_shows_its_charge() {
        let meta = |text: &str, table: &str| StatementMetadata {
            receipt: None,
            receipt_text: Some(text.to_string()),
            tables: vec![table.to_string()],
        };
        let answered = meta("charged a: dp_count(ε 1) cost 10% of the budget", "a");
        let decode = || FlightError::DecodeError("decoded message length too large".into());
        let (e, c) = failed(decode(), Some(&answered));
        assert!(e.contains("too large"), "{e}");
        let c = c.expect("charged");
        assert_eq!(
            (c.receipt.as_str(), c.tables),
            (
                answered.receipt_text.as_deref().unwrap(),
                vec!["a".to_string()]
            )
        );
        assert!(
            failed(decode(), None).1.is_none(),
            "no answer: no charge known"
        );
        assert!(
            failed(decode(), Some(&StatementMetadata::default()))
                .1
                .is_none(),
            "answered, not charged"
        );
        // The error's own receipt first.
        let mut status = tonic::Status::internal("failed");
        status.metadata_mut().insert_bin(
            dpfusion::serve::RECEIPT_HEADER,
            tonic::metadata::MetadataValue::from_bytes(
                serde_json::to_string(&meta("charged b: cost 1%", "b"))
                    .unwrap()
                    .as_bytes(),
            ),
        );
        let (_, c) = failed(FlightError::Tonic(Box::new(status)), Some(&answered));
        assert_eq!(c.unwrap().tables, ["b"]);
    }
}
