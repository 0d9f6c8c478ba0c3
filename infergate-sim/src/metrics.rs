//! Prometheus text exposition with vLLM V1 metric names (prefix configurable), split over `engine` labels.

use std::fmt::Write;

use super::config::SimConfig;
use super::scheduler::SchedCounters;

/// Share of `total` reported under engine label `i` of `k`: the shares sum to `total` and each is monotonic in
/// `total`, so split counters stay counters.
pub fn share(total: u64, k: usize, i: usize) -> u64 {
    let k = k.max(1) as u64;
    total / k + u64::from((i as u64) < total % k)
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Writer<'a> {
    out: String,
    prefix: &'a str,
    model: String,
    engines: usize,
}

impl Writer<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {}{} {}", self.prefix, name, help);
        let _ = writeln!(self.out, "# TYPE {}{} {}", self.prefix, name, kind);
    }

    fn sample(&mut self, name: &str, engine: usize, extra: &str, v: f64) {
        let _ = writeln!(
            self.out,
            "{}{}{{engine=\"{}\",model_name=\"{}\"{}}} {}",
            self.prefix,
            name,
            engine,
            self.model,
            extra,
            fmt_value(v)
        );
    }

    /// A count split over the engine labels (gauge or counter).
    fn split(&mut self, name: &str, kind: &str, help: &str, extra: &[(&str, u64)]) {
        self.header(name, kind, help);
        for (labels, total) in extra {
            for e in 0..self.engines {
                self.sample(name, e, labels, share(*total, self.engines, e) as f64);
            }
        }
    }
}

/// Renders `/metrics`.
pub fn render(
    cfg: &SimConfig,
    c: &SchedCounters,
    extra_running: u64,
    extra_waiting: u64,
) -> String {
    let mut w = Writer {
        out: String::with_capacity(4096),
        prefix: &cfg.metric_prefix,
        model: escape(&cfg.model),
        engines: cfg.engine_label_count.max(1),
    };
    w.split(
        "num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &[("", c.running as u64 + extra_running)],
    );
    w.split(
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &[("", c.waiting as u64 + extra_waiting)],
    );
    // A fraction per engine: every engine label reports the same usage (average them, do not sum).
    let usage = (c.kv_tokens as f64 / cfg.kv_capacity_tokens.max(1) as f64).min(1.0);
    w.header(
        "kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
    );
    for e in 0..w.engines {
        w.sample("kv_cache_usage_perc", e, "", usage);
    }
    w.split(
        "num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        &[("", 0)],
    );
    w.split(
        "prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        &[("", c.prompt_tokens)],
    );
    w.split(
        "prompt_tokens_by_source_total",
        "counter",
        "Number of prompt tokens by source.",
        &[
            (",source=\"local_compute\"", c.computed_prompt_tokens),
            (",source=\"local_cache_hit\"", c.cached_prompt_tokens),
            (",source=\"external_kv_transfer\"", c.external_prompt_tokens),
        ],
    );
    w.split(
        "generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        &[("", c.generation_tokens)],
    );
    w.split(
        "prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        &[("", c.prefix_cache_queries)],
    );
    w.split(
        "prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        &[("", c.prefix_cache_hits)],
    );
    w.split(
        "request_success_total",
        "counter",
        "Count of successfully processed requests.",
        &[
            (",finished_reason=\"length\"", c.finished),
            (",finished_reason=\"stop\"", 0),
            (",finished_reason=\"abort\"", c.aborted),
        ],
    );
    w.header(
        "cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
    );
    let blocks = cfg.kv_capacity_tokens / cfg.block_tokens.max(1);
    for e in 0..w.engines {
        let labels = format!(
            ",block_size=\"{}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\"",
            cfg.block_tokens, blocks
        );
        w.sample("cache_config_info", e, &labels, 1.0);
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_sum_and_are_monotonic() {
        for k in 1..5 {
            let mut prev = vec![0; k];
            for t in 0..50u64 {
                let s: Vec<u64> = (0..k).map(|i| share(t, k, i)).collect();
                assert_eq!(s.iter().sum::<u64>(), t);
                assert!(s.iter().zip(&prev).all(|(a, b)| a >= b));
                prev = s;
            }
        }
    }

    #[test]
    fn renders_names_and_labels() {
        let cfg = SimConfig {
            engine_label_count: 2,
            ..SimConfig::default()
        };
        let c = SchedCounters {
            running: 3,
            waiting: 1,
            prompt_tokens: 10,
            ..Default::default()
        };
        let t = render(&cfg, &c, 0, 2);
        assert!(t.contains("# TYPE vllm:num_requests_running gauge"));
        assert!(t.contains("vllm:num_requests_running{engine=\"0\",model_name=\"sim-model\"} 2.0"));
        assert!(t.contains("vllm:num_requests_running{engine=\"1\",model_name=\"sim-model\"} 1.0"));
        assert!(t.contains("vllm:num_requests_waiting{engine=\"1\",model_name=\"sim-model\"} 1.0"));
        assert!(t.contains("vllm:prompt_tokens_by_source_total{engine=\"0\",model_name=\"sim-model\",source=\"local_cache_hit\"} 0.0"));
        assert!(t.contains("vllm:prompt_tokens_total{engine=\"1\",model_name=\"sim-model\"} 5.0"));
    }
}
