//! Load on `dpfusion serve` (docs/PERFORMANCE.md, "Serving"): an in-process server over a
//! private in-memory table of ROWS rows, and CLIENTS concurrent Flight SQL clients, each running
//! `SELECT dp_mean(x, 0, 1000, epsilon => 0.001) FROM t` QUERIES times (GetFlightInfo, which
//! admits, charges durably and runs the query, then DoGet of the result). Prints throughput and
//! p50/p99 latency per client count, beside the same statements through `PrivateSession::sql`
//! in the process (no server).
//!
//!     cargo run --release --example serve_load -- [ROWS] [QUERIES_PER_CLIENT] [CLIENTS,...]
//!     (defaults: 1000000 25 1,4,16)
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use dpfusion::arrow::array::{Float64Array, RecordBatch};
use dpfusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::serve::auth::{Analysts, TokenHash};
use dpfusion::serve::{ServeOptions, bind};
use dpfusion::{PrivateSession, Registration, SessionOptions};
use futures::StreamExt;
use tonic::transport::Channel;

const TOKEN: &str = "load-test-token-0123456789abcdef";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: usize = args
        .first()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let per_client: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(25);
    let clients: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').map(|c| c.parse()).collect())
        .transpose()?
        .unwrap_or_else(|| vec![1, 4, 16]);

    let dir = std::env::temp_dir().join(format!("dpfusion-serve-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let session =
        PrivateSession::open(SessionOptions::default().with_ledger(dir.join("l.jsonl"))).await?;
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)]));
    let batches: Vec<RecordBatch> = (0..rows)
        .collect::<Vec<_>>()
        .chunks(65_536)
        .map(|c| {
            let x = Float64Array::from_iter_values(c.iter().map(|&i| (i % 1000) as f64));
            RecordBatch::try_new(schema.clone(), vec![Arc::new(x)])
        })
        .collect::<Result<_, _>>()?;
    // A budget no run exhausts: the point is the server's cost, not refusals.
    session.register_batches("t", batches, Registration::private().budget(1e6, 1e-6))?;
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse()?,
        max_concurrent_queries: 64,
        ..ServeOptions::default()
    };
    let analysts = Analysts::new(vec![("load".into(), TokenHash::new(TOKEN))]);
    let session = Arc::new(session);
    let bound = bind(session.clone(), analysts, options).await?;
    let addr = bound.addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));

    println!(
        "dp_mean over {rows} rows, {per_client} queries per client, cores: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!("| path | clients | queries | wall (s) | queries/s | p50 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let sql = "SELECT dp_mean(x, 0, 1000, epsilon => 0.001) AS m FROM t";
    let report = |path: &str, n: usize, wall: Duration, mut all: Vec<Duration>| {
        all.sort();
        println!(
            "| {path} | {n} | {} | {:.2} | {:.1} | {:.1} | {:.1} |",
            all.len(),
            wall.as_secs_f64(),
            all.len() as f64 / wall.as_secs_f64(),
            percentile(&all, 0.5).as_secs_f64() * 1e3,
            percentile(&all, 0.99).as_secs_f64() * 1e3,
        );
    };
    for &n in &clients {
        // The same statements through PrivateSession::sql in this process: the server's cost is
        // the difference.
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..n {
            let session = session.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    session.sql(sql).await.map_err(|e| e.to_string())?;
                    lat.push(t.elapsed());
                }
                Ok::<_, String>(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        report("embedded", n, start.elapsed(), all);

        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..n {
            tasks.push(tokio::spawn(async move {
                let channel = Channel::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await?;
                let mut c = FlightSqlServiceClient::new(channel);
                c.set_token(TOKEN.to_string());
                let mut lat = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    let info = c.execute(sql.to_string(), None).await?;
                    for ep in info.endpoint {
                        let ticket = ep.ticket.ok_or("no ticket")?;
                        let mut s = c.do_get(ticket).await?;
                        while let Some(b) = s.next().await {
                            b?;
                        }
                    }
                    lat.push(t.elapsed());
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await?.map_err(|e| e.to_string())?);
        }
        report("server", n, start.elapsed(), all);
    }
    let _ = stop.send(());
    server.await??;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
