//! engine-sim: serves one or more simulated vLLM engines (each with its own scheduler and prefix cache) on
//! several ports of one process. See `--help`.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use infergate_sim::{spawn_engine_on, SimConfig};

const HELP: &str = "\
engine-sim: simulated vLLM engines (OpenAI-compatible HTTP, vLLM V1 scheduler timing)

USAGE:
    engine-sim --port 8101 [--port 8102 ...] [OPTIONS]
    engine-sim --ports 8101,8102 [OPTIONS]
    engine-sim --engines N --base-port P [OPTIONS]

ENGINES (one independent engine per port):
    --port PORT                    add one engine on PORT (repeatable)
    --ports P1,P2,...              add engines on these ports
    --engines N --base-port P      add N engines on ports P, P+1, ... P+N-1
    --host ADDR                    listen address (default 127.0.0.1)

ENGINE KNOBS (same for every engine; durations in milliseconds):
    --model NAME                   served model name (default sim-model)
    --step-token-budget N          tokens per scheduler step, max_num_batched_tokens (default 8192)
    --max-num-seqs N               most running requests (default 64)
    --step-overhead-ms MS          fixed cost per step (default 18)
    --prefill-tokens-per-sec F     prefill throughput (default 44000)
    --decode-step-cost-per-seq-ms MS
                                   extra step cost per decoding sequence (default 0.25)
    --kv-capacity-tokens N         prefix cache / KV capacity in tokens (default 2000000)
    --block-tokens N               KV block size in tokens (default 16)
    --default-max-tokens N         output tokens when a request sets none (default 16)
    --max-model-len N              longest prompt + output accepted (default 10000000)
    --time-scale F                 multiply every simulated duration (default 1.0)
    --metric-prefix P              metric name prefix (default \"vllm:\")
    --engine-label-count N         split each series over N engine=\"i\" labels (default 1)
    --keep-alive-timeout-ms MS     close idle keep-alive connections after MS (default: never; vLLM uses 5000)
    --max-recorded-requests N      requests kept for inspection (default 10000 in the binary)
    --max-body-bytes N             largest request body (default 67108864)

    -h, --help                     this help

Logs go to stderr via env_logger (RUST_LOG=info). SIGINT / SIGTERM stop the process.
Runtime failure injection: POST /sim/control with JSON, e.g. {\"fail_status\":503}, {\"fail_status\":null},
{\"health_status\":500}, {\"slow_headers_ms\":2000}, {\"close_mid_stream_after\":3}, {\"extra_waiting\":10},
{\"extra_running\":4}, {\"drop_idle_connections\":true}, {\"poison_idle_connections\":true},
{\"refuse_connections_ms\":1500}, {\"reset\":true}. GET /sim/stats returns per-engine totals;
GET /sim/requests the recorded requests (method, path, headers, body_len, body_fnv64 in hex), oldest first.
";

struct Args {
    host: IpAddr,
    ports: Vec<u16>,
    cfg: SimConfig,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut host: IpAddr = [127, 0, 0, 1].into();
    let mut ports = Vec::new();
    let mut engines: Option<u16> = None;
    let mut base_port: Option<u16> = None;
    let mut cfg = SimConfig {
        max_recorded_requests: 10_000,
        ..SimConfig::default()
    };
    fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
        v.parse()
            .map_err(|_| format!("{flag}: invalid value '{v}'"))
    }
    fn ms(flag: &str, v: &str) -> Result<Duration, String> {
        let f: f64 = num(flag, v)?;
        if !(f.is_finite() && f >= 0.0) {
            return Err(format!("{flag}: must be a number of milliseconds >= 0"));
        }
        Ok(Duration::from_secs_f64(f / 1000.0))
    }
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--port" => ports.push(num(&flag, &value()?)?),
            "--ports" => {
                for p in value()?.split(',').filter(|p| !p.trim().is_empty()) {
                    ports.push(num(&flag, p.trim())?);
                }
            }
            "--engines" => engines = Some(num(&flag, &value()?)?),
            "--base-port" => base_port = Some(num(&flag, &value()?)?),
            "--host" => host = num(&flag, &value()?)?,
            "--model" => cfg.model = value()?,
            "--step-token-budget" => cfg.step_token_budget = num(&flag, &value()?)?,
            "--max-num-seqs" => cfg.max_num_seqs = num(&flag, &value()?)?,
            "--step-overhead-ms" => cfg.step_overhead = ms(&flag, &value()?)?,
            "--prefill-tokens-per-sec" => cfg.prefill_tokens_per_sec = num(&flag, &value()?)?,
            "--decode-step-cost-per-seq-ms" => cfg.decode_step_cost_per_seq = ms(&flag, &value()?)?,
            "--kv-capacity-tokens" => cfg.kv_capacity_tokens = num(&flag, &value()?)?,
            "--block-tokens" => cfg.block_tokens = num(&flag, &value()?)?,
            "--default-max-tokens" => cfg.default_max_tokens = num(&flag, &value()?)?,
            "--max-model-len" => cfg.max_model_len = num(&flag, &value()?)?,
            "--time-scale" => cfg.time_scale = num(&flag, &value()?)?,
            "--metric-prefix" => cfg.metric_prefix = value()?,
            "--engine-label-count" => cfg.engine_label_count = num(&flag, &value()?)?,
            "--keep-alive-timeout-ms" => cfg.keep_alive_timeout = Some(ms(&flag, &value()?)?),
            "--max-recorded-requests" => cfg.max_recorded_requests = num(&flag, &value()?)?,
            "--max-body-bytes" => cfg.max_body_bytes = num(&flag, &value()?)?,
            other => return Err(format!("unknown argument '{other}' (see --help)")),
        }
    }
    match (engines, base_port) {
        (Some(n), Some(p)) => {
            for i in 0..n {
                ports.push(
                    p.checked_add(i)
                        .ok_or("--engines/--base-port: port above 65535")?,
                );
            }
        }
        (None, None) => {}
        _ => return Err("--engines and --base-port go together".into()),
    }
    if ports.is_empty() {
        return Err(
            "no engine: give --port, --ports or --engines with --base-port (see --help)".into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = ports.iter().find(|p| !seen.insert(**p)) {
        return Err(format!("port {dup} given twice"));
    }
    if !(cfg.time_scale.is_finite() && cfg.time_scale >= 0.0) {
        return Err("--time-scale must be >= 0".into());
    }
    if !(cfg.prefill_tokens_per_sec.is_finite() && cfg.prefill_tokens_per_sec > 0.0) {
        return Err("--prefill-tokens-per-sec must be > 0".into());
    }
    Ok(Some(Args { host, ports, cfg }))
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
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

#[tokio::main]
async fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("engine-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let mut engines = Vec::new();
    for port in &args.ports {
        match spawn_engine_on(SocketAddr::new(args.host, *port), args.cfg.clone()).await {
            Ok(h) => {
                println!("engine-sim listening on {}", h.url());
                engines.push(h);
            }
            Err(e) => {
                eprintln!("engine-sim: cannot listen on {}:{port}: {e}", args.host);
                return ExitCode::FAILURE;
            }
        }
    }
    log::info!(
        "{} engine(s), model {}, time scale {}, prefill {} tok/s, budget {}, max_num_seqs {}",
        engines.len(),
        args.cfg.model,
        args.cfg.time_scale,
        args.cfg.prefill_tokens_per_sec,
        args.cfg.step_token_budget,
        args.cfg.max_num_seqs
    );
    wait_for_signal().await;
    log::info!("engine-sim: stopping");
    for h in engines {
        h.shutdown().await;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<Args>, String> {
        parse_args(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn port_forms() {
        let a = parse("--port 8101 --port=8102 --ports 8103,8104")
            .unwrap()
            .unwrap();
        assert_eq!(a.ports, vec![8101, 8102, 8103, 8104]);
        let a = parse("--engines 3 --base-port 9000 --time-scale 0.5 --metric-prefix vllm_")
            .unwrap()
            .unwrap();
        assert_eq!(a.ports, vec![9000, 9001, 9002]);
        assert_eq!(a.cfg.time_scale, 0.5);
        assert_eq!(a.cfg.metric_prefix, "vllm_");
        assert!(parse("--help").unwrap().is_none());
        assert!(parse("").is_err());
        assert!(parse("--port 1 --port 1").is_err());
        assert!(parse("--engines 2").is_err());
        assert!(parse("--port 1 --bogus 2").is_err());
        let a = parse("--port 1 --step-overhead-ms 5 --decode-step-cost-per-seq-ms 0.5")
            .unwrap()
            .unwrap();
        assert_eq!(a.cfg.step_overhead, Duration::from_millis(5));
        assert_eq!(a.cfg.decode_step_cost_per_seq, Duration::from_micros(500));
    }
}
