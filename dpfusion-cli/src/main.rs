//! The `dpfusion` command line. See `dpfusion --help`.
use std::process::ExitCode;

use dpfusion_cli::cli::{Cli, run};
use dpfusion_cli::ledger_cmd;

#[tokio::main]
async fn main() -> ExitCode {
    dpfusion::error::install_panic_hook();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("ledger") {
        return ledger_cmd::run(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("serve") {
        return dpfusion::serve::cmd::run_serve(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("token") {
        return dpfusion::serve::cmd::run_token(&args[1..]);
    }
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
