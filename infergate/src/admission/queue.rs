//! A pool's wait queue at run time: while every eligible endpoint is at `max_in_flight_per_endpoint`, requests
//! wait (bounded in number and time, round-robin between keys) for a turn to be placed; a finished request wakes
//! the head.
//!
//! One request at a time holds the pool's [`Turn`], from the room check until its ledger hold exists, so two
//! requests never both take the last free slot. Without a queue the turn is never needed: the queue exists only
//! for pools that configure it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};
use tokio::sync::Notify;

use super::fair_queue::FairQueue;
use crate::config::QueueConfig;
use crate::placement::Candidate;

/// A waiter re-checks this often even without a wake-up (an endpoint may have become healthy or left ejection).
const RECHECK: Duration = Duration::from_millis(100);

/// Whether a pool can take one more request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Some eligible endpoint is below its in-flight limit.
    Free,
    /// Every eligible endpoint is at its limit: wait.
    Full,
    /// No eligible endpoint at all: waiting would not help; placement answers 503.
    NoEndpoint,
}

/// Room in a placement snapshot. Pure.
pub fn room(cands: &[Candidate]) -> Room {
    let mut any = false;
    for c in cands.iter().filter(|c| c.eligible) {
        if !c.at_limit() {
            return Room::Free;
        }
        any = true;
    }
    if any {
        Room::Full
    } else {
        Room::NoEndpoint
    }
}

/// The candidates with every endpoint at its limit made ineligible, when some eligible endpoint is below it (a
/// policy's pick at its limit is re-placed among these). None when nothing would change. Pure.
pub fn below_limit(cands: &[Candidate]) -> Option<Vec<Candidate>> {
    if room(cands) != Room::Free {
        return None;
    }
    Some(
        cands
            .iter()
            .map(|c| Candidate {
                eligible: c.eligible && !c.at_limit(),
                ..*c
            })
            .collect(),
    )
}

/// Why a request was not given a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_length` requests were already waiting.
    Full,
    /// No turn within `max_wait`.
    Timeout,
}

/// The queue's Prometheus handles for one pool.
pub struct QueueMetrics {
    pub length: IntGauge,
    pub wait: Histogram,
    pub full: IntCounter,
    pub timeout: IntCounter,
    /// The client closed its connection while waiting.
    pub abandoned: IntCounter,
}

struct State {
    order: FairQueue<Arc<str>>,
    waiters: HashMap<u64, Arc<Notify>>,
    /// A request is between its room check and its hold.
    turn_taken: bool,
}

impl State {
    fn wake_head(&self) {
        if let Some(n) = self.order.head().and_then(|h| self.waiters.get(&h)) {
            // Stores a permit when the head is not waiting yet: no wake-up is lost.
            n.notify_one();
        }
    }
}

pub struct PoolQueue {
    /// A reload may change it (`reconfigure`).
    cfg: Mutex<QueueConfig>,
    state: Mutex<State>,
    next_ticket: AtomicU64,
    metrics: QueueMetrics,
}

/// The right to place one request now. Keep it until the request's ledger hold exists; dropping it passes the
/// turn on.
pub struct Turn {
    queue: Arc<PoolQueue>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut st = self.queue.state.lock();
        st.turn_taken = false;
        st.wake_head();
    }
}

/// A waiting request's place in the queue; leaves the queue when dropped unless it was served.
struct Ticket<'a> {
    queue: &'a PoolQueue,
    id: u64,
    waiting: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let mut st = self.queue.state.lock();
            let was_head = st.order.head() == Some(self.id);
            st.order.remove(self.id);
            st.waiters.remove(&self.id);
            self.queue.metrics.length.set(st.order.len() as i64);
            if was_head {
                st.wake_head();
            }
        }
    }
}

impl PoolQueue {
    pub fn new(cfg: QueueConfig, metrics: QueueMetrics) -> Arc<PoolQueue> {
        Arc::new(PoolQueue {
            cfg: Mutex::new(cfg),
            state: Mutex::new(State {
                order: FairQueue::new(cfg.max_length),
                waiters: HashMap::new(),
                turn_taken: false,
            }),
            next_ticket: AtomicU64::new(1),
            metrics,
        })
    }

    pub fn config(&self) -> QueueConfig {
        *self.cfg.lock()
    }

    /// New limits from a reload; waiting requests keep their place (and the deadline they started with).
    pub fn reconfigure(&self, cfg: QueueConfig) {
        *self.cfg.lock() = cfg;
        self.state.lock().order.set_max_len(cfg.max_length);
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.state.lock().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A waiting request's client closed its connection (its ticket has already left the queue).
    pub fn count_abandoned(&self) {
        self.metrics.abandoned.inc();
    }

    /// A request slot of the pool was freed: let the head look again.
    pub fn wake(&self) {
        self.state.lock().wake_head();
    }

    /// Wait for this request's turn. `room` is asked (under the queue's lock) whether the pool can take it; a
    /// request is placed at once when nobody waits and there is room, else it waits behind the others, served
    /// round-robin between `key`s, until the head finds room, or gives up after `max_wait`.
    pub async fn turn(
        self: &Arc<Self>,
        key: Arc<str>,
        mut room: impl FnMut() -> Room,
    ) -> Result<Turn, Refusal> {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        // Whether this request waits for room, not only for another request's placement to finish (microseconds):
        // only those are observed in the wait histogram.
        let mut for_room;
        {
            let mut st = self.state.lock();
            for_room = !st.order.is_empty() || room() == Room::Full;
            if !for_room && !st.turn_taken {
                st.turn_taken = true;
                return Ok(Turn {
                    queue: self.clone(),
                });
            }
            if !st.order.push(key, id) {
                self.metrics.full.inc();
                return Err(Refusal::Full);
            }
            st.waiters.insert(id, notify.clone());
            self.metrics.length.set(st.order.len() as i64);
        }
        let mut ticket = Ticket {
            queue: self,
            id,
            waiting: true,
        };
        let start = Instant::now();
        let deadline = start + self.config().max_wait;
        loop {
            {
                let mut st = self.state.lock();
                if !st.turn_taken && st.order.head() == Some(id) {
                    if room() == Room::Full {
                        for_room = true;
                    } else {
                        st.order.pop_head();
                        st.waiters.remove(&id);
                        st.turn_taken = true;
                        ticket.waiting = false;
                        self.metrics.length.set(st.order.len() as i64);
                        if for_room {
                            self.metrics.wait.observe(start.elapsed().as_secs_f64());
                        }
                        return Ok(Turn {
                            queue: self.clone(),
                        });
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                drop(ticket);
                self.metrics.timeout.inc();
                self.metrics.wait.observe(start.elapsed().as_secs_f64());
                return Err(Refusal::Timeout);
            }
            let nap = (deadline - now).min(RECHECK);
            let _ = tokio::time::timeout(nap, notify.notified()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn cand(eligible: bool, requests: u64) -> Candidate {
        Candidate {
            eligible,
            requests,
            max_in_flight: Some(2),
            ..Candidate::default()
        }
    }

    #[test]
    fn room_in_a_snapshot() {
        assert_eq!(room(&[cand(true, 2), cand(true, 1)]), Room::Free);
        assert_eq!(room(&[cand(true, 2), cand(false, 0)]), Room::Full);
        assert_eq!(room(&[cand(false, 0)]), Room::NoEndpoint);
        assert_eq!(room(&[]), Room::NoEndpoint);
        let unlimited = Candidate {
            eligible: true,
            requests: 99,
            ..Candidate::default()
        };
        assert_eq!(room(&[unlimited]), Room::Free);
    }

    #[test]
    fn below_limit_hides_full_endpoints_only_when_another_has_room() {
        let c = [cand(true, 2), cand(true, 1), cand(false, 0)];
        let b = below_limit(&c).unwrap();
        assert_eq!(
            b.iter().map(|c| c.eligible).collect::<Vec<_>>(),
            [false, true, false]
        );
        assert_eq!(below_limit(&[cand(true, 2)]), None);
    }

    fn metrics() -> QueueMetrics {
        QueueMetrics {
            length: IntGauge::new("l", "l").unwrap(),
            wait: Histogram::with_opts(prometheus::HistogramOpts::new("w", "w")).unwrap(),
            full: IntCounter::new("f", "f").unwrap(),
            timeout: IntCounter::new("t", "t").unwrap(),
            abandoned: IntCounter::new("a", "a").unwrap(),
        }
    }

    fn queue(max_length: usize, max_wait: Duration) -> Arc<PoolQueue> {
        PoolQueue::new(
            QueueConfig {
                max_length,
                max_wait,
            },
            metrics(),
        )
    }

    /// A pool of `cap` slots the test fills and frees by hand.
    #[derive(Clone, Default)]
    struct Slots(Arc<AtomicUsize>);

    impl Slots {
        fn room(&self, cap: usize) -> impl FnMut() -> Room + '_ {
            move || {
                if self.0.load(Ordering::SeqCst) < cap {
                    Room::Free
                } else {
                    Room::Full
                }
            }
        }
    }

    #[tokio::test]
    async fn waits_for_a_freed_slot_and_serves_keys_in_turn() {
        let q = queue(16, Duration::from_secs(5));
        let slots = Slots::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        // The one slot is taken.
        slots.0.store(1, Ordering::SeqCst);
        let mut tasks = tokio::task::JoinSet::new();
        let spawn = |tasks: &mut tokio::task::JoinSet<()>, key: &'static str, n: u32| {
            let (q, slots, order) = (q.clone(), slots.clone(), order.clone());
            tasks.spawn(async move {
                let turn = q.turn(Arc::from(key), slots.room(1)).await.unwrap();
                slots.0.fetch_add(1, Ordering::SeqCst);
                order.lock().push(format!("{key}{n}"));
                drop(turn);
            });
        };
        for n in 1..=3 {
            spawn(&mut tasks, "a", n);
            // Let each one enqueue in order.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        spawn(&mut tasks, "b", 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(q.len(), 4);
        for _ in 0..4 {
            // A request ends: its slot frees and the head is woken.
            slots.0.fetch_sub(1, Ordering::SeqCst);
            q.wake();
            let before = order.lock().len();
            for _ in 0..200 {
                if order.lock().len() > before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        while tasks.join_next().await.is_some() {}
        assert_eq!(*order.lock(), ["a1", "b1", "a2", "a3"]);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn full_and_timeout() {
        let q = queue(1, Duration::from_millis(150));
        let slots = Slots::default();
        slots.0.store(1, Ordering::SeqCst);
        let waiting = {
            let (q, slots) = (q.clone(), slots.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                let r = q.turn(Arc::from("a"), slots.room(1)).await.map(drop);
                (r, t0.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            q.turn(Arc::from("b"), slots.room(1)).await.err(),
            Some(Refusal::Full)
        );
        let (r, waited) = waiting.await.unwrap();
        assert_eq!(r, Err(Refusal::Timeout));
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(q.is_empty(), "a timed-out request leaves the queue");
        assert_eq!(q.metrics.full.get(), 1);
        assert_eq!(q.metrics.timeout.get(), 1);
        assert_eq!(q.metrics.wait.get_sample_count(), 1);
    }

    #[tokio::test]
    async fn one_turn_at_a_time_and_no_endpoint_does_not_wait() {
        let q = queue(4, Duration::from_secs(5));
        let first = q.turn(Arc::from("a"), || Room::Free).await.unwrap();
        // Room, but the turn is taken: the second waits until the first is placed.
        let second = {
            let q = q.clone();
            tokio::spawn(async move { q.turn(Arc::from("b"), || Room::Free).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished());
        drop(first);
        assert_eq!(second.await.unwrap(), Ok(()));
        assert_eq!(
            q.metrics.wait.get_sample_count(),
            0,
            "waiting for another's placement is no wait for room"
        );
        let t0 = Instant::now();
        drop(q.turn(Arc::from("a"), || Room::NoEndpoint).await.unwrap());
        assert!(t0.elapsed() < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue_and_passes_the_turn() {
        let q = queue(4, Duration::from_secs(5));
        let full = Arc::new(AtomicUsize::new(1));
        let room = |f: Arc<AtomicUsize>| {
            move || {
                if f.load(Ordering::SeqCst) == 1 {
                    Room::Full
                } else {
                    Room::Free
                }
            }
        };
        let head = {
            let (q, f) = (q.clone(), full.clone());
            tokio::spawn(async move { q.turn(Arc::from("a"), room(f)).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let next = {
            let (q, f) = (q.clone(), full.clone());
            tokio::spawn(async move { q.turn(Arc::from("b"), room(f)).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        head.abort();
        let _ = head.await;
        assert_eq!(q.len(), 1);
        full.store(0, Ordering::SeqCst);
        q.wake();
        assert_eq!(next.await.unwrap(), Ok(()));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn new_limits_keep_the_waiting_requests_and_bound_the_next() {
        let q = queue(4, Duration::from_secs(5));
        let slots = Slots::default();
        slots.0.store(1, Ordering::SeqCst);
        let wait = |key: &'static str| {
            let (q, slots) = (q.clone(), slots.clone());
            tokio::spawn(async move { q.turn(Arc::from(key), slots.room(1)).await.map(drop) })
        };
        let (a, b) = (wait("a"), wait("b"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.len(), 2);
        q.reconfigure(QueueConfig {
            max_length: 1,
            max_wait: Duration::from_millis(50),
        });
        assert_eq!(q.config().max_length, 1);
        // Both keep their place; a third is refused at the new length.
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.turn(Arc::from("c"), slots.room(1)).await.err(),
            Some(Refusal::Full)
        );
        slots.0.store(0, Ordering::SeqCst);
        q.wake();
        assert_eq!(a.await.unwrap(), Ok(()));
        q.wake();
        assert_eq!(b.await.unwrap(), Ok(()));
        // The next waiter gets the new, shorter wait.
        slots.0.store(1, Ordering::SeqCst);
        let t0 = Instant::now();
        assert_eq!(
            q.turn(Arc::from("d"), slots.room(1)).await.err(),
            Some(Refusal::Timeout)
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
