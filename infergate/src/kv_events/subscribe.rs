//! One endpoint's subscriber: a ZMQ SUB socket on its engine's publisher (bound or connected, see
//! `KvEventsConfig::bind`), each message decoded and applied to the endpoint's index; a gap asks the replay socket
//! (a DEALER on the engine's ROUTER) when there is one. A bad message is counted, logged at debug without its
//! content, and skipped; nothing here panics or unwraps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::decode::{decode_batch, split_frames};
use super::{Applied, KvIndex};
use crate::config::KvSubscription;

/// How long a replay may take before the gap is left unfilled.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before trying a socket again after it failed (bind in use, bad address).
const RETRY: Duration = Duration::from_secs(1);

/// Follow `sub` into `index` until `stop` turns true or its sender is dropped.
pub async fn subscribe_loop(
    index: Arc<KvIndex>,
    sub: KvSubscription,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let who = format!("pool {} endpoint {}", index.pool, index.endpoint);
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        let mut socket = zeromq::SubSocket::new();
        let mut monitor = socket.monitor();
        let opened = tokio::select! {
            r = async {
                if sub.bind {
                    socket.bind(&sub.endpoint).await.map(drop)
                } else {
                    socket.connect(&sub.endpoint).await
                }
            } => r,
            _ = stop.changed() => return,
        };
        if let Err(e) = opened {
            log::warn!(
                "{who}: KV events: cannot {} {}: {e}",
                if sub.bind { "bind" } else { "connect to" },
                sub.endpoint
            );
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => continue,
                _ = stop.changed() => return,
            }
        }
        if let Err(e) = socket.subscribe(&sub.topic).await {
            log::warn!("{who}: KV events: cannot subscribe: {e}");
        }
        log::info!(
            "{who}: KV events: {} {}",
            if sub.bind {
                "listening on"
            } else {
                "connected to"
            },
            sub.endpoint
        );
        let mut monitoring = true;
        loop {
            tokio::select! {
                m = socket.recv() => match m {
                    Ok(msg) => on_message(&index, &sub, msg, &who).await,
                    Err(e) => {
                        // A publisher went away (the monitor says so too), or none is there yet.
                        log::debug!("{who}: KV events: receive: {e}");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                            _ = stop.changed() => return,
                        }
                    }
                },
                ev = monitor.next(), if monitoring => match ev {
                    Some(SocketEvent::Accepted(..) | SocketEvent::Connected(..)) => index.peer_connected(),
                    Some(SocketEvent::Disconnected(_)) => {
                        log::info!("{who}: KV events: publisher disconnected");
                        index.peer_gone();
                    }
                    Some(_) => {}
                    None => monitoring = false,
                },
                r = stop.changed() => {
                    if r.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

async fn on_message(index: &KvIndex, sub: &KvSubscription, msg: ZmqMessage, who: &str) {
    let frames: Vec<&[u8]> = msg.iter().map(|b| b.as_ref()).collect();
    let (seq, payload) = match split_frames(&frames) {
        Ok(x) => x,
        Err(e) => {
            log::debug!("{who}: KV events: message skipped: {e}");
            index.invalid();
            return;
        }
    };
    // Decode before taking the message's place: a batch that does not decode still advances the sequence (it
    // was received; what it said is lost, which is a gap of its own).
    let events = decode_batch(payload);
    let now = Instant::now();
    match index.sequence(seq, now) {
        Applied::InOrder => {}
        Applied::Joined { at } => {
            // Not a gap: the index starts here. A replay socket may still tell what came before.
            if let Some(addr) = &sub.replay {
                replay(index, addr, 0, at, who).await;
            }
        }
        Applied::Duplicate => return,
        Applied::Restarted => {
            log::info!(
                "{who}: KV events: sequence restarted at {seq} (engine restarted): index cleared"
            );
        }
        Applied::Gap { from, to } => {
            index
                .counters
                .gaps
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let filled = match &sub.replay {
                Some(addr) => replay(index, addr, from, to, who).await,
                None => false,
            };
            if !filled {
                log::debug!(
                    "{who}: KV events: batches {from}..{to} missed; index untrusted for a while"
                );
                index.gap(Instant::now());
            }
        }
    }
    apply_batch(index, events, who);
}

fn apply_batch(
    index: &KvIndex,
    events: Result<
        Vec<Result<super::decode::Event, super::decode::DecodeError>>,
        super::decode::DecodeError,
    >,
    who: &str,
) {
    match events {
        Ok(events) => {
            for ev in events {
                match ev {
                    Ok(ev) => index.apply(&ev),
                    Err(e) => {
                        log::debug!("{who}: KV events: event skipped: {e}");
                        index.invalid();
                    }
                }
            }
        }
        Err(e) => {
            log::debug!("{who}: KV events: batch skipped: {e}");
            index.invalid();
            index.gap(Instant::now());
        }
    }
}

/// Ask the replay socket for batches `from..to` and apply them; true when every one of them came.
async fn replay(index: &KvIndex, addr: &str, from: u64, to: u64, who: &str) -> bool {
    let run = async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(addr).await.map_err(|e| e.to_string())?;
        // vLLM's ROUTER expects [identity, "", start seq]; the identity is added by ZMQ.
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .map_err(|e| e.to_string())?;
        dealer.send(req).await.map_err(|e| e.to_string())?;
        let mut next = from;
        loop {
            let msg = dealer.recv().await.map_err(|e| e.to_string())?;
            // vLLM 0.32 sends ["", topic, seq, payload], older releases ["", seq, payload]; the end is seq -1
            // with an empty payload.
            let mut frames: Vec<&[u8]> = msg.iter().map(|b| b.as_ref()).collect();
            if frames.len() == 4 && frames[0].is_empty() {
                frames.remove(0);
            }
            let (seq, payload) = match split_frames(&frames) {
                Ok(x) => x,
                Err(e) => return Err(e.to_string()),
            };
            if seq == u64::MAX {
                return Ok(next >= to);
            }
            if seq < next || seq >= to {
                continue;
            }
            if seq > next {
                // The buffer no longer has some of them.
                return Ok(false);
            }
            apply_batch(index, decode_batch(payload), who);
            next = seq + 1;
        }
    };
    match tokio::time::timeout(REPLAY_TIMEOUT, run).await {
        Ok(Ok(filled)) => filled,
        Ok(Err(e)) => {
            log::debug!("{who}: KV events: replay failed: {e}");
            false
        }
        Err(_) => {
            log::debug!("{who}: KV events: replay timed out");
            false
        }
    }
}
