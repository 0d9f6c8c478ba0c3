//! engine-sim: serves one or more simulated vLLM engines (each with its own scheduler and prefix cache) on
//! several ports of one process. See `--help`.

use std::collections::HashSet;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use infergate_sim::{spawn_engine_on, SimConfig};

const AFTER_HELP: &str = "\
Logs go to stderr via env_logger (RUST_LOG=info). SIGINT / SIGTERM stop the process.
Runtime failure injection: POST /sim/control with JSON, e.g. {\"fail_status\":503}, {\"fail_status\":null},
{\"health_status\":500}, {\"slow_headers_ms\":2000}, {\"close_mid_stream_after\":3}, {\"drop_mid_stream_after\":1},
{\"error_mid_stream_after\":0} (vLLM's in-band stream error), {\"extra_waiting\":10}, {\"extra_running\":4},
{\"speed\":0.33}, {\"drop_idle_connections\":true}, {\"poison_idle_connections\":true},
{\"refuse_connections_ms\":1500}, {\"reset\":true}. An injected fail_status is answered at once with a JSON error
body (429 and 503 with Retry-After: 1). GET /sim/stats returns per-engine totals (received, scheduled and refused
generation requests among them); GET /sim/requests the recorded requests (method, path, headers, body_len,
body_fnv64 in hex), oldest first.";

const ENGINES: &str = "Engines (one independent engine per port)";
const KNOBS: &str = "Engine knobs (same for every engine; durations in milliseconds)";

/// Requests kept for inspection by default in the binary (the library default is larger).
const MAX_RECORDED_REQUESTS: usize = 10_000;

/// The argument of one `--ports`: a comma-separated list (empty items are ignored).
#[derive(Debug, Clone)]
struct PortList(Vec<u16>);

fn port_list(v: &str) -> Result<PortList, String> {
    v.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().map_err(|_| format!("'{p}' is not a port")))
        .collect::<Result<_, _>>()
        .map(PortList)
}

/// A number of milliseconds >= 0 (fractions allowed).
fn millis(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f),
        _ => Err("expected a number of milliseconds >= 0".into()),
    }
}

fn non_negative(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f),
        _ => Err("expected a number >= 0".into()),
    }
}

fn positive(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err("expected a number > 0".into()),
    }
}

fn at_least_one(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number >= 1 (leave the flag out for no limit)".into()),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn from_ms(f: f64) -> Duration {
    Duration::from_secs_f64(f / 1000.0)
}

/// The command line. Engine knobs default to `SimConfig::default()`.
#[derive(Debug, Parser)]
#[command(
    name = "engine-sim",
    about = "engine-sim: simulated vLLM engines (OpenAI-compatible HTTP, vLLM V1 scheduler timing)",
    override_usage = "engine-sim --port 8101 [--port 8102 ...] [OPTIONS]\n       \
                      engine-sim --ports 8101,8102 [OPTIONS]\n       \
                      engine-sim --engines N --base-port P [OPTIONS]",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Add one engine on PORT (repeatable)
    #[arg(long, value_name = "PORT", help_heading = ENGINES)]
    port: Vec<u16>,
    /// Add engines on these ports (repeatable)
    #[arg(long, value_name = "P1,P2,...", value_parser = port_list, help_heading = ENGINES)]
    ports: Vec<PortList>,
    /// Add N engines on ports P, P+1, ... P+N-1 (with --base-port)
    #[arg(long, value_name = "N", requires = "base_port", help_heading = ENGINES)]
    engines: Option<u16>,
    /// First port of --engines
    #[arg(long, value_name = "P", requires = "engines", help_heading = ENGINES)]
    base_port: Option<u16>,
    /// Listen address
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1", help_heading = ENGINES)]
    host: IpAddr,

    /// Served model name
    #[arg(long, value_name = "NAME", default_value_t = SimConfig::default().model, help_heading = KNOBS)]
    model: String,
    /// Tokens per scheduler step (vLLM max_num_batched_tokens)
    #[arg(long, value_name = "N",
          default_value_t = SimConfig::default().step_token_budget, help_heading = KNOBS)]
    step_token_budget: usize,
    /// Most running requests (vLLM max_num_seqs)
    #[arg(long, value_name = "N", default_value_t = SimConfig::default().max_num_seqs, help_heading = KNOBS)]
    max_num_seqs: usize,
    /// Fixed cost per step
    #[arg(long, value_name = "MS", value_parser = millis, allow_negative_numbers = true,
          default_value_t = ms(SimConfig::default().step_overhead), help_heading = KNOBS)]
    step_overhead_ms: f64,
    /// Prefill throughput, tokens per second
    #[arg(long, value_name = "F", value_parser = positive, allow_negative_numbers = true,
          default_value_t = SimConfig::default().prefill_tokens_per_sec, help_heading = KNOBS)]
    prefill_tokens_per_sec: f64,
    /// Extra step cost per decoding sequence
    #[arg(long, value_name = "MS", value_parser = millis, allow_negative_numbers = true,
          default_value_t = ms(SimConfig::default().decode_step_cost_per_seq), help_heading = KNOBS)]
    decode_step_cost_per_seq_ms: f64,
    /// Attention in prefill: a prompt token at context position p costs 1 + p/K tokens' worth, so long prompts
    /// and follow-ups on long contexts prefill slower per token, as on real engines [default: off, every token
    /// costs the same]
    #[arg(long, value_name = "K", value_parser = positive, allow_negative_numbers = true, help_heading = KNOBS)]
    attention_context_tokens: Option<f64>,
    /// Prefix cache / KV capacity in tokens
    #[arg(long, value_name = "N",
          default_value_t = SimConfig::default().kv_capacity_tokens, help_heading = KNOBS)]
    kv_capacity_tokens: usize,
    /// KV block size in tokens
    #[arg(long, value_name = "N", default_value_t = SimConfig::default().block_tokens, help_heading = KNOBS)]
    block_tokens: usize,
    /// Output tokens when a request sets none
    #[arg(long, value_name = "N",
          default_value_t = SimConfig::default().default_max_tokens, help_heading = KNOBS)]
    default_max_tokens: usize,
    /// Context length: prompt + max_tokens beyond it get vLLM's 400 at once
    #[arg(long, value_name = "N", default_value_t = SimConfig::default().max_model_len, help_heading = KNOBS)]
    max_model_len: usize,
    /// Multiply every simulated duration
    #[arg(long, value_name = "F", value_parser = non_negative, allow_negative_numbers = true,
          default_value_t = SimConfig::default().time_scale, help_heading = KNOBS)]
    time_scale: f64,
    /// Metric name prefix
    #[arg(long, value_name = "P", default_value_t = SimConfig::default().metric_prefix, help_heading = KNOBS)]
    metric_prefix: String,
    /// Split each series over N engine="i" labels
    #[arg(long, value_name = "N",
          default_value_t = SimConfig::default().engine_label_count, help_heading = KNOBS)]
    engine_label_count: usize,
    /// Close idle keep-alive connections after MS [default: never; vLLM uses 5000]
    #[arg(long, value_name = "MS", value_parser = millis, allow_negative_numbers = true,
          help_heading = KNOBS)]
    keep_alive_timeout_ms: Option<f64>,
    /// Requests kept for inspection
    #[arg(long, value_name = "N", default_value_t = MAX_RECORDED_REQUESTS, help_heading = KNOBS)]
    max_recorded_requests: usize,
    /// Largest request body in bytes
    #[arg(long, value_name = "N",
          default_value_t = SimConfig::default().max_body_bytes, help_heading = KNOBS)]
    max_body_bytes: usize,
    /// Refuse a generation request with 429 (Retry-After: 1) when N requests already wait [default: no limit]
    #[arg(long, value_name = "N", value_parser = at_least_one, help_heading = KNOBS)]
    max_waiting: Option<usize>,
    /// End every answer after N tokens (end of sequence) when the request allows more [default: run to max_tokens]
    #[arg(long, value_name = "N", value_parser = at_least_one, help_heading = KNOBS)]
    stop_after: Option<usize>,
    /// Store Responses API responses (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1): previous_response_id, background,
    /// GET and cancel by id; the newest 10000 responses per engine [default: off, store ignored as by vLLM]
    #[arg(long, help_heading = KNOBS)]
    responses_store: bool,
    /// Answer a generation for any model but --model with vLLM's 404 [default: serve any model name]
    #[arg(long, help_heading = KNOBS)]
    only_served_model: bool,
    /// Publish KV-cache events in vLLM's wire format (ZMQ PUB, topic `kv`) on ADDR: `tcp://*:P` binds,
    /// `tcp://HOST:P` connects (as vLLM's --kv-events-config endpoint); engine i uses port P + i [default: off]
    #[arg(long, value_name = "ADDR", help_heading = KNOBS)]
    kv_events: Option<String>,
    /// Play both roles of vLLM's NixlConnector (kv_role kv_both): answer a prefill leg (kv_transfer_params
    /// do_remote_decode) with the params a decode engine needs; pull a decode leg's KV cache from the engine of
    /// this process that issued its params, refusing any other [default: off, params ignored as by vLLM]
    #[arg(long, help_heading = KNOBS)]
    kv_transfer: bool,
    /// KV-cache transfer speed of a decode leg's pull, prompt tokens per second
    #[arg(long, value_name = "F", value_parser = positive, allow_negative_numbers = true,
          default_value_t = SimConfig::default().kv_transfer_tokens_per_sec, help_heading = KNOBS)]
    kv_transfer_tokens_per_sec: f64,
    /// Speed of every engine against the calibrated one: each step takes 1/F as long (0.5: half the speed)
    #[arg(long, value_name = "F", value_parser = positive, allow_negative_numbers = true,
          default_value_t = SimConfig::default().speed, help_heading = KNOBS)]
    speed: f64,
    /// Speeds of the engines in port order (an unequal fleet; engines beyond the list run at --speed)
    #[arg(long, value_name = "F1,F2,...", value_parser = speed_list, help_heading = KNOBS)]
    speeds: Option<SpeedList>,
    /// Engine I (0-based, port order) changes to speed F once SECS simulated seconds have passed since it first
    /// had work (repeatable; a GPU that throttles mid-run)
    #[arg(long, value_name = "I:SECS:F", value_parser = speed_change, help_heading = KNOBS)]
    speed_change: Vec<SpeedChange>,
}

/// The argument of `--speeds`.
#[derive(Debug, Clone)]
struct SpeedList(Vec<f64>);

fn speed_list(v: &str) -> Result<SpeedList, String> {
    v.split(',')
        .map(|f| positive(f).map_err(|_| format!("'{}' is not a speed > 0", f.trim())))
        .collect::<Result<_, _>>()
        .map(SpeedList)
}

/// The argument of `--speed-change`.
#[derive(Debug, Clone, Copy)]
struct SpeedChange {
    engine: usize,
    after: Duration,
    speed: f64,
}

fn speed_change(v: &str) -> Result<SpeedChange, String> {
    let parts: Vec<&str> = v.split(':').map(str::trim).collect();
    let [i, secs, f] = parts[..] else {
        return Err("expected ENGINE:SECONDS:SPEED, e.g. 1:20:0.3".into());
    };
    Ok(SpeedChange {
        engine: i
            .parse()
            .map_err(|_| format!("'{i}' is not an engine index"))?,
        after: Duration::from_secs_f64(non_negative(secs)?),
        speed: positive(f).map_err(|_| format!("'{f}' is not a speed > 0"))?,
    })
}

/// `tcp://HOST:P` with its port moved up by `by` (vLLM's data-parallel ranks do the same).
fn offset_port(addr: &str, by: usize) -> String {
    match addr.rsplit_once(':') {
        Some((head, port)) => match port.parse::<usize>() {
            Ok(p) => format!("{head}:{}", p + by),
            Err(_) => addr.to_string(),
        },
        None => addr.to_string(),
    }
}

#[derive(Debug)]
struct Args {
    host: IpAddr,
    ports: Vec<u16>,
    cfg: SimConfig,
    /// Per engine: its speed and its mid-run change, if any.
    speeds: Vec<(f64, Option<(Duration, f64)>)>,
}

/// The ports of `--port` and `--ports` in command-line order, then those of `--engines` / `--base-port`.
fn ports_in_order(cli: &Cli, m: &ArgMatches) -> Result<Vec<u16>, String> {
    let mut given: Vec<(usize, &[u16])> = Vec::new();
    if let Some(idx) = m.indices_of("port") {
        given.extend(idx.zip(cli.port.chunks(1)));
    }
    if let Some(idx) = m.indices_of("ports") {
        given.extend(idx.zip(cli.ports.iter().map(|l| l.0.as_slice())));
    }
    given.sort_by_key(|(i, _)| *i);
    let mut ports: Vec<u16> = given
        .into_iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    if let (Some(n), Some(p)) = (cli.engines, cli.base_port) {
        for i in 0..n {
            ports.push(
                p.checked_add(i)
                    .ok_or("--engines/--base-port: port above 65535")?,
            );
        }
    }
    if ports.is_empty() {
        return Err("no engine: give --port, --ports or --engines with --base-port".into());
    }
    let mut seen = HashSet::new();
    if let Some(dup) = ports.iter().find(|p| !seen.insert(**p)) {
        return Err(format!("port {dup} given twice"));
    }
    Ok(ports)
}

/// Parses a command line (program name first). `--help` comes back as an error of kind `DisplayHelp`, which
/// `clap::Error::exit` prints to stdout with status 0.
fn parse_args<I, T>(args: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = Cli::command();
    let m = cmd.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&m)?;
    let ports = ports_in_order(&cli, &m).map_err(|e| cmd.error(ErrorKind::ValueValidation, e))?;
    let cfg = SimConfig {
        model: cli.model,
        step_token_budget: cli.step_token_budget,
        max_num_seqs: cli.max_num_seqs,
        step_overhead: from_ms(cli.step_overhead_ms),
        prefill_tokens_per_sec: cli.prefill_tokens_per_sec,
        decode_step_cost_per_seq: from_ms(cli.decode_step_cost_per_seq_ms),
        attention_context_tokens: cli.attention_context_tokens,
        kv_capacity_tokens: cli.kv_capacity_tokens,
        block_tokens: cli.block_tokens,
        default_max_tokens: cli.default_max_tokens,
        max_model_len: cli.max_model_len,
        time_scale: cli.time_scale,
        metric_prefix: cli.metric_prefix,
        engine_label_count: cli.engine_label_count,
        keep_alive_timeout: cli.keep_alive_timeout_ms.map(from_ms),
        max_recorded_requests: cli.max_recorded_requests,
        max_body_bytes: cli.max_body_bytes,
        max_waiting: cli.max_waiting,
        stop_after: cli.stop_after,
        responses_store: cli.responses_store,
        only_served_model: cli.only_served_model,
        kv_events: cli.kv_events.clone(),
        kv_transfer: cli.kv_transfer,
        kv_transfer_tokens_per_sec: cli.kv_transfer_tokens_per_sec,
        speed: cli.speed,
        speed_change: None,
    };
    let listed = cli.speeds.map_or_else(Vec::new, |l| l.0);
    if listed.len() > ports.len() {
        return Err(cmd.error(
            ErrorKind::ValueValidation,
            format!(
                "--speeds lists {} speeds for {} engines",
                listed.len(),
                ports.len()
            ),
        ));
    }
    let mut speeds: Vec<(f64, Option<(Duration, f64)>)> = (0..ports.len())
        .map(|i| (listed.get(i).copied().unwrap_or(cli.speed), None))
        .collect();
    for c in &cli.speed_change {
        let Some(s) = speeds.get_mut(c.engine) else {
            return Err(cmd.error(
                ErrorKind::ValueValidation,
                format!(
                    "--speed-change names engine {} of {}",
                    c.engine,
                    ports.len()
                ),
            ));
        };
        s.1 = Some((c.after, c.speed));
    }
    Ok(Args {
        host: cli.host,
        ports,
        cfg,
        speeds,
    })
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
    let args = match parse_args(std::env::args_os()) {
        Ok(a) => a,
        // Help: stdout, status 0; a usage error: stderr, status 2.
        Err(e) => e.exit(),
    };
    let mut engines = Vec::new();
    for (i, port) in args.ports.iter().enumerate() {
        let mut cfg = args.cfg.clone();
        cfg.kv_events = cfg.kv_events.map(|a| offset_port(&a, i));
        (cfg.speed, cfg.speed_change) = args.speeds[i];
        match spawn_engine_on(SocketAddr::new(args.host, *port), cfg).await {
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
    use infergate_sim::MAX_STORED_RESPONSES;

    fn parse(s: &str) -> Result<Args, clap::Error> {
        parse_args(std::iter::once("engine-sim").chain(s.split_whitespace()))
    }

    #[test]
    fn port_forms() {
        let a = parse("--port 8101 --port=8102 --ports 8103,8104").unwrap();
        assert_eq!(a.ports, vec![8101, 8102, 8103, 8104]);
        // Command-line order across --port and --ports; empty list items are ignored.
        let a = parse("--ports 8103,,8104, --port 8101 --ports=8105").unwrap();
        assert_eq!(a.ports, vec![8103, 8104, 8101, 8105]);
        let a =
            parse("--engines 3 --base-port 9000 --time-scale 0.5 --metric-prefix vllm_").unwrap();
        assert_eq!(a.ports, vec![9000, 9001, 9002]);
        assert_eq!(a.cfg.time_scale, 0.5);
        assert_eq!(a.cfg.metric_prefix, "vllm_");
        assert_eq!(parse("--help").unwrap_err().kind(), ErrorKind::DisplayHelp);
        assert!(parse("").is_err());
        assert!(parse("--port 1 --port 1").is_err());
        assert!(parse("--engines 2").is_err());
        assert!(parse("--base-port 2").is_err());
        assert!(parse("--engines 2 --base-port 65535").is_err());
        assert!(parse("--port 1 --bogus 2").is_err());
        assert!(parse("--port 1 --ports 2,x").is_err());
        assert!(parse("--port 1 --time-scale -1").is_err());
        assert!(parse("--port 1 --prefill-tokens-per-sec 0").is_err());
        assert!(parse("--port 1 --step-overhead-ms nan").is_err());
        assert!(parse("--port 1 --attention-context-tokens 0").is_err());
        assert_eq!(
            parse("--port 1").unwrap().cfg.attention_context_tokens,
            None
        );
        let a = parse("--port 1 --attention-context-tokens 30000").unwrap();
        assert_eq!(a.cfg.attention_context_tokens, Some(30_000.0));
        let a = parse("--port 1 --step-overhead-ms 5 --decode-step-cost-per-seq-ms 0.5").unwrap();
        assert_eq!(a.cfg.step_overhead, Duration::from_millis(5));
        assert_eq!(a.cfg.decode_step_cost_per_seq, Duration::from_micros(500));
        assert_eq!(a.host, IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn defaults_are_the_library_defaults() {
        let a = parse("--port 1 --host 0.0.0.0 --keep-alive-timeout-ms 5000").unwrap();
        let d = SimConfig::default();
        let c = &a.cfg;
        assert_eq!(a.host, IpAddr::from([0, 0, 0, 0]));
        assert_eq!(c.keep_alive_timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            (
                c.model.as_str(),
                c.step_token_budget,
                c.max_num_seqs,
                c.step_overhead
            ),
            (
                d.model.as_str(),
                d.step_token_budget,
                d.max_num_seqs,
                d.step_overhead
            )
        );
        assert_eq!(
            (
                c.prefill_tokens_per_sec,
                c.decode_step_cost_per_seq,
                c.kv_capacity_tokens
            ),
            (
                d.prefill_tokens_per_sec,
                d.decode_step_cost_per_seq,
                d.kv_capacity_tokens
            )
        );
        assert_eq!(
            (
                c.block_tokens,
                c.default_max_tokens,
                c.max_model_len,
                c.time_scale
            ),
            (
                d.block_tokens,
                d.default_max_tokens,
                d.max_model_len,
                d.time_scale
            )
        );
        assert_eq!(
            (
                c.metric_prefix.as_str(),
                c.engine_label_count,
                c.max_body_bytes
            ),
            (
                d.metric_prefix.as_str(),
                d.engine_label_count,
                d.max_body_bytes
            )
        );
        assert_eq!(c.max_recorded_requests, MAX_RECORDED_REQUESTS);
        assert_eq!(parse("--port 1").unwrap().cfg.keep_alive_timeout, None);
        assert_eq!(parse("--port 1").unwrap().cfg.max_waiting, None);
        assert_eq!(parse("--port 1").unwrap().cfg.stop_after, None);
        assert_eq!(
            parse("--port 1 --stop-after 8").unwrap().cfg.stop_after,
            Some(8)
        );
        assert_eq!(
            parse("--port 1 --max-waiting 3").unwrap().cfg.max_waiting,
            Some(3)
        );
        assert!(parse("--port 1 --max-waiting 0").is_err());
        assert!(!parse("--port 1").unwrap().cfg.responses_store);
        assert!(
            parse("--port 1 --responses-store")
                .unwrap()
                .cfg
                .responses_store
        );
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("--responses-store"), "{help}");
        assert!(
            help.contains(&format!("newest {MAX_STORED_RESPONSES} responses")),
            "{help}"
        );
        assert!(help.contains("POST /sim/control"), "{help}");
        assert!(help.contains("[default: 8192]"), "{help}");
        assert!(help.contains("[default: 0.25]"), "{help}");
    }

    #[test]
    fn per_engine_speeds_and_a_change_mid_run() {
        let a = parse("--ports 1,2,3 --speed 0.8 --speeds 1,0.5 --speed-change 2:20:0.3").unwrap();
        assert_eq!(
            a.speeds,
            vec![
                (1.0, None),
                (0.5, None),
                (0.8, Some((Duration::from_secs(20), 0.3)))
            ]
        );
        assert_eq!(parse("--port 1").unwrap().speeds, vec![(1.0, None)]);
        assert!(
            parse("--port 1 --speeds 1,2").is_err(),
            "more speeds than engines"
        );
        assert!(parse("--port 1 --speeds 0").is_err());
        assert!(
            parse("--port 1 --speed-change 1:5:0.5").is_err(),
            "no engine 1"
        );
        assert!(parse("--port 1 --speed-change 0:5").is_err());
        assert!(parse("--port 1 --speed-change 0:-1:0.5").is_err());
        assert!(parse("--port 1 --speed-change 0:1:0").is_err());
    }

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }
}
