//! The speed series, read from the pools at scrape time: each endpoint's learned decode line, its speed relative
//! to its own recent history and the pool's, whether it is a speed outlier, and each pool's typical answer length.

use std::sync::{Arc, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntGaugeVec, Opts};

use super::{decode_lines, Pools};

pub(super) struct SpeedCollector {
    lock: parking_lot::Mutex<()>,
    source: Weak<Pools>,
    descs: Vec<Desc>,
    decode_step: GaugeVec,
    decode_per_sequence: GaugeVec,
    relative: GaugeVec,
    outlier: IntGaugeVec,
    answer: GaugeVec,
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

impl SpeedCollector {
    pub(super) fn new(pools: &Arc<Pools>) -> SpeedCollector {
        let ep = ["pool", "endpoint"];
        let decode_step = gauge(
            "infergate_endpoint_decode_seconds_per_token",
            "Learned time per streamed token with one sequence running (the decode line's value at 1); absent until learned.",
            &ep,
        );
        let decode_per_sequence = gauge(
            "infergate_endpoint_decode_seconds_per_sequence",
            "Learned extra time per streamed token per sequence running beside it (the decode line's slope); absent until learned.",
            &ep,
        );
        let relative = gauge(
            "infergate_endpoint_relative_speed",
            "The endpoint's speed against its own recent history or the pool's median, the lower of prefill and decode (1: as usual); absent until judged.",
            &ep,
        );
        let outlier = IntGaugeVec::new(
            Opts::new(
                "infergate_endpoint_speed_outlier",
                "1 while the endpoint is a speed outlier (below 40% of its recent speed or the pool's, until above 50%): it gets less new work.",
            ),
            &ep,
        )
        .expect("static metric definition");
        let answer = gauge(
            "infergate_pool_typical_answer_tokens",
            "The pool's typical streamed answer length in chunks (about tokens), which placement expects of a request its max_tokens allows; absent until learned.",
            &["pool"],
        );
        let descs = [&decode_step, &decode_per_sequence, &relative, &answer]
            .iter()
            .flat_map(|g| g.desc().into_iter().cloned())
            .chain(outlier.desc().into_iter().cloned())
            .collect();
        SpeedCollector {
            lock: parking_lot::Mutex::new(()),
            source: Arc::downgrade(pools),
            descs,
            decode_step,
            decode_per_sequence,
            relative,
            outlier,
            answer,
        }
    }
}

impl Collector for SpeedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _guard = self.lock.lock();
        let gauges = [
            &self.decode_step,
            &self.decode_per_sequence,
            &self.relative,
            &self.answer,
        ];
        for g in gauges {
            g.reset();
        }
        self.outlier.reset();
        if let Some(pools) = self.source.upgrade() {
            for p in &pools.pools {
                let endpoints = p.endpoints();
                for (e, line) in endpoints.iter().zip(decode_lines(&endpoints)) {
                    let l = [&*p.name, e.label.as_str()];
                    if let Some(line) = line {
                        self.decode_step.with_label_values(&l).set(line.at(1.0));
                        self.decode_per_sequence
                            .with_label_values(&l)
                            .set(line.slope);
                    }
                    let (slow, relative) = e.drift.state();
                    if let Some(r) = relative {
                        self.relative.with_label_values(&l).set(r);
                    }
                    self.outlier.with_label_values(&l).set(i64::from(slow));
                }
                if let Some(t) = p.answers.expected(None) {
                    self.answer.with_label_values(&[&*p.name]).set(t);
                }
            }
        }
        gauges
            .iter()
            .flat_map(|g| g.collect())
            .chain(self.outlier.collect())
            .collect()
    }
}
