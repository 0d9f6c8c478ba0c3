//! loadgen: replays agent-session traffic against an OpenAI-compatible base URL and prints a report (see
//! `--help` and the `infergate_loadgen` library).

use std::process::ExitCode;

use infergate_loadgen::{cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cfg = match cli::parse_args(std::env::args_os()) {
        Ok(c) => c,
        // Help: stdout, status 0; a usage error: stderr, status 2.
        Err(e) => e.exit(),
    };
    match run(&cfg).await {
        Ok(report) => {
            print!("{}", report.table());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}
