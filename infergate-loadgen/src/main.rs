//! loadgen: replays agent-session traffic against an OpenAI-compatible base URL and prints a report (see
//! `--help` and `infergate::loadgen`).

use std::process::ExitCode;

use infergate_loadgen::{cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cfg = match cli::parse_args(std::env::args().skip(1)) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{}", cli::HELP);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(2);
        }
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
