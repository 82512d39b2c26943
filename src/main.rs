//! The `dpfusion` command line. See `dpfusion --help`.
use std::process::ExitCode;

use dpfusion::cli::{Cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = match Cli::parse(&args) {
        Ok(Some(cli)) => cli,
        Ok(None) => return ExitCode::SUCCESS, // --help / --version printed
        Err(e) => {
            eprintln!("dpfusion: {e}\nTry 'dpfusion --help'.");
            return ExitCode::from(2);
        }
    };
    run(cli).await
}
