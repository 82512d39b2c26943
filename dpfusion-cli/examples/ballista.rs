//! dpfusion on an Apache DataFusion Ballista cluster (README, "Beyond one machine").
//!
//! ```sh
//! # Everything in one process: a scheduler and two executors on localhost, then the client.
//! cargo run --release --example ballista --features distributed
//!
//! # The same as separate processes (on one machine, or one scheduler and N workers):
//! cargo run --release --example ballista --features distributed -- scheduler --bind 127.0.0.1:50050
//! cargo run --release --example ballista --features distributed -- executor --scheduler localhost:50050 --port 50051
//! cargo run --release --example ballista --features distributed -- executor --scheduler localhost:50050 --port 50061
//! cargo run --release --example ballista --features distributed -- client --scheduler df://localhost:50050
//! ```
//!
//! The client writes the demo tables (`salaries`, `patients`) as Parquet files (4 each) under a
//! data directory (`--data DIR`, default a new temporary directory), registers them as private
//! tables, runs DP queries on the cluster, and prints the results and the budget. The guard, the
//! accountant and the ledger (`DIR/ledger.jsonl`) stay in the client; executors read the files at
//! the same paths, so with workers on other machines `DIR` must be on storage they share.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;
use dpfusion::distributed::{self, ExecutorOptions};
use dpfusion::statements::receipt_line;
use dpfusion::{PrivateSession, Registration, SessionOptions};
use dpfusion_cli::demo;

const USAGE: &str = "\
usage: ballista                          scheduler + 2 executors in this process, then the demo
       ballista scheduler [--bind HOST:PORT]           (default 127.0.0.1:50050)
       ballista executor [--scheduler HOST:PORT] [--bind HOST] [--external-host HOST]
                         [--port PORT] [--grpc-port PORT] [--vcores N]
       ballista client [--scheduler df://HOST:PORT] [--data DIR]";

/// The demo's queries: (what it shows, SQL).
const QUERIES: &[(&str, &str)] = &[
    (
        "dp_mean over all salaries (one release, noise drawn once at the final aggregation)",
        "SELECT dp_count(salary, epsilon => 0.25) AS employees, \
         dp_mean(salary, lower => 0, upper => 300000, epsilon => 0.5) AS mean_salary \
         FROM salaries",
    ),
    (
        "dp_mean per job (public column: no partition selection)",
        "SELECT job, dp_mean(salary, 0, 300000, epsilon => 0.5) AS mean_salary \
         FROM salaries GROUP BY job ORDER BY job",
    ),
    (
        "dp_mean per smoker status (private column: partition selection on the executors too)",
        "SELECT smoker, dp_mean(cost, 0, 20, epsilon => 0.5) AS mean_cost \
         FROM patients GROUP BY smoker ORDER BY smoker",
    ),
    (
        "rgm_mean_by: the relative Gaussian mechanism, one mean per job (groups of at least \
         100 rows: with max_ratio 1.5 and epsilon 0.5 smaller groups would be infeasible)",
        "SELECT rgm_mean_by(salary, job, max_ratio => 1.5, epsilon => 0.5, \
         min_group_size => 100) AS by_job FROM salaries",
    ),
    (
        "dp_linreg_gd: a linear model of cost, fitted by DP gradient descent",
        "SELECT dp_linreg_gd(cost, [age, bmi, bp, chol, smoker], epsilon => 1.0) AS model \
         FROM patients",
    ),
    (
        "dp_logreg_agd: a logistic model of disease, fitted by DP-AGD",
        "SELECT dp_logreg_agd(disease, [age, bmi, bp, chol, smoker], epsilon => 1.0) AS model \
         FROM patients",
    ),
];

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn bad(msg: impl Into<String>) -> DataFusionError {
    DataFusionError::Configuration(format!("{}\n{USAGE}", msg.into()))
}

fn host_port(s: &str) -> Result<(String, u16)> {
    let (h, p) = s
        .rsplit_once(':')
        .ok_or_else(|| bad(format!("expected HOST:PORT, got '{s}'")))?;
    let p = p.parse().map_err(|_| bad(format!("bad port in '{s}'")))?;
    Ok((h.to_string(), p))
}

fn number<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T> {
    match arg(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| bad(format!("{name}: not a number: '{v}'"))),
    }
}

/// Writes `batch` as `parts` Parquet files under `dir`.
fn write_parts(dir: &Path, batch: &RecordBatch, parts: usize) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let n = batch.num_rows();
    for i in 0..parts {
        let (start, end) = (i * n / parts, (i + 1) * n / parts);
        let file = std::fs::File::create(dir.join(format!("part-{i}.parquet")))?;
        let mut w = ArrowWriter::try_new(file, batch.schema(), None)?;
        w.write(&batch.slice(start, end - start))?;
        w.close()?;
    }
    Ok(())
}

async fn client(url: &str, data: &Path) -> Result<()> {
    let started = Instant::now();
    write_parts(&data.join("salaries"), &demo::salaries()?, 4)?;
    write_parts(&data.join("patients"), &demo::patients()?, 4)?;
    let session = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(data.join("ledger.jsonl"))
            .with_ballista_remote(url),
    )
    .await?;
    session
        .register_parquet(
            "salaries",
            data.join("salaries"),
            Registration::private()
                .replace()
                .public_columns(["job"])
                .budget(5.0, 1e-6),
        )
        .await?;
    session
        .register_parquet(
            "patients",
            data.join("patients"),
            Registration::private().budget(5.0, 1e-6),
        )
        .await?;
    println!(
        "client: scheduler {url}; tables salaries ({} rows) and patients ({} rows) as Parquet \
         under {}\n",
        demo::SALARIES_ROWS,
        demo::PATIENTS_ROWS,
        data.display()
    );
    for &(what, sql) in QUERIES {
        println!("-- {what}\n{sql};");
        let t = Instant::now();
        match session.sql(sql).await {
            Ok(r) => {
                println!("{}", pretty_format_batches(&r.batches)?);
                if let Some(receipt) = &r.receipt {
                    println!("{}", receipt_line(receipt));
                }
                println!("({:.2} s)\n", t.elapsed().as_secs_f64());
            }
            Err(e) => println!("ERROR: {e}\n"),
        }
    }
    println!("-- a refusal: raw rows of a private table (nothing is sent to the cluster)");
    if let Err(e) = session.sql("SELECT * FROM salaries LIMIT 3").await {
        println!("ERROR: {e}\n");
    }
    println!(
        "-- SHOW BUDGET (kept by this client in {})",
        data.join("ledger.jsonl").display()
    );
    let budget = session.sql("SHOW BUDGET").await?;
    println!("{}", pretty_format_batches(&budget.batches)?);
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn data_dir(args: &[String]) -> Result<PathBuf> {
    let dir = match arg(args, "--data") {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join(format!("dpfusion-ballista-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(std::fs::canonicalize(&dir)?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {
            let cluster = distributed::start_local_cluster(2, 1).await?;
            println!(
                "in-process Ballista cluster: scheduler {} and {} executors (loopback, random \
                 ports), every dpfusion function registered on each",
                cluster.scheduler, cluster.executors
            );
            client(&cluster.url(), &data_dir(&args)?).await
        }
        Some("scheduler") => {
            let bind: SocketAddr = arg(&args, "--bind")
                .unwrap_or_else(|| "127.0.0.1:50050".into())
                .parse()
                .map_err(|e| bad(format!("--bind: {e}")))?;
            println!("dpfusion Ballista scheduler on {bind} (Ctrl-C stops it)");
            distributed::run_scheduler(bind).await
        }
        Some("executor") => {
            let d = ExecutorOptions::default();
            let (scheduler_host, scheduler_port) =
                host_port(&arg(&args, "--scheduler").unwrap_or_else(|| "localhost:50050".into()))?;
            let options = ExecutorOptions {
                scheduler_host,
                scheduler_port,
                bind_host: arg(&args, "--bind").unwrap_or(d.bind_host),
                external_host: arg(&args, "--external-host"),
                port: number(&args, "--port", d.port)?,
                grpc_port: number(&args, "--grpc-port", 0)?,
                vcores: number(&args, "--vcores", d.vcores)?,
            };
            let options = ExecutorOptions {
                grpc_port: if options.grpc_port == 0 {
                    options.port + 1
                } else {
                    options.grpc_port
                },
                ..options
            };
            println!(
                "dpfusion Ballista executor on {}:{} serving scheduler {}:{} (Ctrl-C stops it)",
                options.bind_host, options.port, options.scheduler_host, options.scheduler_port
            );
            distributed::run_executor(options).await
        }
        Some("client") => {
            let url = arg(&args, "--scheduler").unwrap_or_else(|| "df://localhost:50050".into());
            client(&url, &data_dir(&args)?).await
        }
        Some("-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(bad(format!("unknown command '{other}'"))),
    }
}
