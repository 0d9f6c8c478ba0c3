//! The background writer: the queue the request path fills (reservations, stored-response holders, replaced keys)
//! and the task that sends it in batches, one round trip per batch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use pingora_core::server::ShutdownWatch;

use super::load::PEER_TTL_INTERVALS;
use super::wire;
use super::{Cluster, BACKGROUND_TIMEOUT};

/// Writes queued for the background writer; past this they are dropped (and counted).
pub(super) const WRITE_QUEUE: usize = 8192;

/// One write for the background writer.
pub(super) enum Write {
    /// `SET key value PX ttl_ms`.
    Set {
        key: String,
        value: Vec<u8>,
        ttl_ms: u64,
    },
    /// A dispatch of `tokens` prefill tokens to `url` under `epoch`, into this replica's reservations.
    Reserve {
        epoch: u64,
        url: String,
        tokens: u64,
    },
}

impl Write {
    /// The `op` label its failure counts under.
    fn op(&self) -> &'static str {
        match self {
            Write::Reserve { .. } => "reserve",
            Write::Set { .. } => "write_binding",
        }
    }
}

/// The reservation fields this replica wrote, by epoch, so the writer deletes them once no reader needs them (a
/// reader's record of this replica is at most a few epochs old, else that peer reads as gone).
#[derive(Default)]
struct Sent(BTreeMap<u64, HashSet<String>>);

impl Sent {
    /// Note `field` of `epoch`; returns the fields of epochs before `current - PEER_TTL_INTERVALS - 1` to delete.
    fn note(&mut self, epoch: u64, url: &str, current: u64) -> Vec<String> {
        self.0.entry(epoch).or_default().insert(url.to_string());
        let keep_from = current.saturating_sub(u64::from(PEER_TTL_INTERVALS) + 1);
        let kept = self.0.split_off(&keep_from);
        let old = std::mem::replace(&mut self.0, kept);
        old.into_iter()
            .flat_map(|(e, urls)| {
                urls.into_iter()
                    .map(move |u| wire::reservation_field(e, &u))
            })
            .collect()
    }
}

impl Cluster {
    /// The writer: sends queued writes in batches.
    pub(super) async fn write_batches(self: Arc<Self>, stop: ShutdownWatch) {
        let Some(mut rx) = self.writes_rx.lock().take() else {
            return;
        };
        // The writes of requests still in flight at a stop are sent until they end (see `run`).
        let stopped = crate::lifecycle::requests_done(stop);
        tokio::pin!(stopped);
        let mut batch = Vec::with_capacity(256);
        let mut sent = Sent::default();
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, 256) => if n == 0 { return },
                _ = &mut stopped => return,
            }
            let Some(mut conn) = self.conn() else {
                for w in batch.drain(..) {
                    self.metrics.error(w.op());
                }
                continue;
            };
            let mut pipe = redis::pipe();
            let mut reserved: HashMap<String, i64> = HashMap::new();
            let mut stale = Vec::new();
            let current = *self.epoch.read();
            let mut ops: HashMap<&'static str, u64> = HashMap::new();
            for w in batch.drain(..) {
                *ops.entry(w.op()).or_default() += 1;
                match w {
                    Write::Set { key, value, ttl_ms } => {
                        pipe.cmd("SET")
                            .arg(key)
                            .arg(value)
                            .arg("PX")
                            .arg(ttl_ms)
                            .ignore();
                    }
                    Write::Reserve { epoch, url, tokens } => {
                        stale.extend(sent.note(epoch, &url, current));
                        *reserved
                            .entry(wire::reservation_field(epoch, &url))
                            .or_default() += wire::pack(tokens);
                    }
                }
            }
            if !reserved.is_empty() {
                let key = self.keys.reserved(&self.publishing_as());
                for (field, by) in reserved {
                    pipe.cmd("HINCRBY").arg(&key).arg(field).arg(by).ignore();
                }
                if !stale.is_empty() {
                    pipe.cmd("HDEL").arg(&key).arg(stale).ignore();
                }
                // The lease: a replica that dies takes its reservations with it a few intervals later.
                pipe.cmd("PEXPIRE")
                    .arg(&key)
                    .arg(wire::millis(self.peer_ttl()))
                    .ignore();
            }
            let failed = |ops: HashMap<&str, u64>| {
                for (op, n) in ops {
                    self.metrics.errors_total.with_label_values(&[op]).inc_by(n);
                }
            };
            match tokio::time::timeout(BACKGROUND_TIMEOUT, pipe.query_async::<()>(&mut conn)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failed(ops);
                    if e.code() == Some("WRONGTYPE") {
                        let _ = tokio::time::timeout(
                            BACKGROUND_TIMEOUT,
                            self.replace_foreign_keys(&mut conn),
                        )
                        .await;
                    }
                }
                Err(_) => failed(ops),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_fields_are_deleted_once_no_reader_needs_them() {
        let mut sent = Sent::default();
        assert!(sent.note(100, "http://a", 100).is_empty());
        assert!(sent.note(101, "http://a", 101).is_empty());
        assert!(sent.note(101, "http://b", 101).is_empty());
        // Epoch 107: a reader's record is at least 101 (else the peer is gone): 100 goes.
        assert_eq!(sent.note(107, "http://a", 107), vec!["100|http://a"]);
        let mut old = sent.note(120, "http://a", 120);
        old.sort();
        assert_eq!(old, vec!["101|http://a", "101|http://b", "107|http://a"]);
        assert!(sent.note(120, "http://a", 120).is_empty());
    }
}
