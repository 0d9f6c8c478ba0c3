//! The `infergate_kv_*` series, read from the indexes when Prometheus scrapes: the request path and the
//! subscribers only touch atomics, and a removed endpoint's series vanish with it. Only endpoints that subscribe
//! have them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use super::{KvIndex, EVENT_TYPES};

/// Who lists the current endpoints' indexes (the pools).
pub trait KvSource: Send + Sync {
    fn kv_indexes(&self) -> Vec<Arc<KvIndex>>;
}

pub struct KvCollector {
    source: Weak<dyn KvSource>,
    lock: parking_lot::Mutex<()>,
    descs: Vec<Desc>,
    events: IntCounterVec,
    gaps: IntCounterVec,
    evicted: IntCounterVec,
    orphans: IntCounterVec,
    predicted: IntCounterVec,
    blocks: IntGaugeVec,
    stale: IntGaugeVec,
}

const L: [&str; 2] = ["pool", "endpoint"];

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

fn gauge(name: &str, help: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &L).expect("static metric definition")
}

impl KvCollector {
    /// Built once per router at start (not on a request path).
    pub fn new(source: Weak<dyn KvSource>) -> KvCollector {
        let events = counter(
            "infergate_kv_events_total",
            "KV-cache events received from the endpoint's engine, by type (BlockStored, BlockRemoved, \
             AllBlocksCleared; other: an unknown type; invalid: a message or event that did not decode).",
            &["pool", "endpoint", "type"],
        );
        let gaps = counter(
            "infergate_kv_event_gaps_total",
            "Sequence gaps in the endpoint's KV-event stream (lost messages).",
            &L,
        );
        let evicted = counter(
            "infergate_kv_index_evicted_blocks_total",
            "Blocks dropped from the endpoint's KV index to stay within max_blocks_per_endpoint.",
            &L,
        );
        let orphans = counter(
            "infergate_kv_orphan_blocks_total",
            "Stored blocks skipped because their parent block is not in the index.",
            &L,
        );
        let predicted = counter(
            "infergate_kv_predicted_cached_tokens_total",
            "Prompt tokens the KV index said the chosen endpoint already held, summed over placements (compare with \
             vllm:prompt_tokens_by_source_total{source=\"local_cache_hit\"}).",
            &L,
        );
        let blocks = gauge(
            "infergate_kv_index_blocks",
            "Blocks the endpoint's engine holds, by its KV events.",
        );
        let stale = gauge(
            "infergate_kv_index_stale",
            "1 while the endpoint's KV index is not trusted (no publisher, a recent gap, silence); placement then \
             uses the approximate prefix index.",
        );
        let mut descs = Vec::new();
        for c in [&events, &gaps, &evicted, &orphans, &predicted] {
            descs.extend(c.desc().into_iter().cloned());
        }
        for g in [&blocks, &stale] {
            descs.extend(g.desc().into_iter().cloned());
        }
        KvCollector {
            source,
            lock: parking_lot::Mutex::new(()),
            descs,
            events,
            gaps,
            evicted,
            orphans,
            predicted,
            blocks,
            stale,
        }
    }
}

impl Collector for KvCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _guard = self.lock.lock();
        let counters = [
            &self.events,
            &self.gaps,
            &self.evicted,
            &self.orphans,
            &self.predicted,
        ];
        for c in counters {
            c.reset();
        }
        self.blocks.reset();
        self.stale.reset();
        let now = Instant::now();
        if let Some(src) = self.source.upgrade() {
            for ix in src.kv_indexes() {
                if !ix.is_enabled() {
                    continue;
                }
                let l = [ix.pool.as_str(), ix.endpoint.as_str()];
                let c = &ix.counters;
                for (t, n) in EVENT_TYPES.iter().zip(&c.events) {
                    self.events
                        .with_label_values(&[l[0], l[1], t])
                        .inc_by(n.load(Ordering::Relaxed));
                }
                for (vec, n) in [
                    (&self.gaps, &c.gaps),
                    (&self.evicted, &c.evicted),
                    (&self.orphans, &c.orphans),
                    (&self.predicted, &c.predicted_cached_tokens),
                ] {
                    vec.with_label_values(&l).inc_by(n.load(Ordering::Relaxed));
                }
                self.blocks.with_label_values(&l).set(ix.blocks() as i64);
                self.stale
                    .with_label_values(&l)
                    .set(i64::from(ix.stale_reason(now).is_some()));
            }
        }
        counters
            .into_iter()
            .flat_map(|c| c.collect())
            .chain(
                [&self.blocks, &self.stale]
                    .into_iter()
                    .flat_map(|g| g.collect()),
            )
            .collect()
    }
}
