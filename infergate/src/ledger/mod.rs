//! The prefill ledger: per-endpoint requests and estimated prefill tokens in flight (ours and, from the shared
//! store, other replicas'), the RAII hold, and the janitor.
//!
//! A request takes a [`Hold`] on the endpoint it is dispatched to. The hold adds one request and its estimated
//! prefill tokens to the endpoint's counters; the tokens go back at the first response body byte (or on any
//! error), the request when the hold is finished or dropped. Release is idempotent, so no path can release twice
//! and `Drop` makes sure every path releases once, even a panic inside a filter.
//!
//! Prefill tokens in flight usually last well under a second, so a sample of the gauge is nearly always 0; each
//! endpoint also keeps the peak of the last [`PEAK_WINDOW`] (see [`PeakWindow`]) for the status page and the demo.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::fnv::BuildFnv;

/// The window [`EndpointLoad::prefill_tokens_peak`] covers.
pub const PEAK_WINDOW: Duration = Duration::from_secs(2);
/// Width of one slot of the peak ring.
const PEAK_SLOT: Duration = Duration::from_millis(100);
/// Slots in the ring: more than the window needs, so a reader never sees a slot a writer is reusing.
const PEAK_SLOTS: usize = 32;

/// Slot stamps count `PEAK_SLOT`s from here.
static PEAK_EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn peak_stamp(now: Instant) -> u64 {
    (now.saturating_duration_since(*PEAK_EPOCH).as_nanos() / PEAK_SLOT.as_nanos()) as u64
}

/// The highest prefill-token level of each 100 ms slot, in a ring; read-only for readers, so any number of them
/// (status page, demo, scripts) see the same figure and none resets it for another.
///
/// A slot packs its stamp (high 32 bits: 100 ms units since `PEAK_EPOCH`, 13 years) and the level (low 32 bits,
/// saturated) into one `AtomicU64`, so a write is one `fetch_max`: a newer stamp always wins over the slot's old
/// lap, the same stamp keeps the larger level. Writers record the level after every increase and the level just
/// before every decrease, so the peak over a window is the largest slot inside it or the current level (a level
/// held unchanged through the whole window).
#[derive(Debug)]
pub struct PeakWindow {
    slots: [AtomicU64; PEAK_SLOTS],
}

impl Default for PeakWindow {
    fn default() -> Self {
        PeakWindow {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl PeakWindow {
    pub fn record(&self, level: u64, now: Instant) {
        let stamp = peak_stamp(now);
        let packed = (stamp << 32) | level.min(u64::from(u32::MAX));
        self.slots[stamp as usize % PEAK_SLOTS].fetch_max(packed, Ordering::Relaxed);
    }

    /// The largest level recorded in the slots of the `window` up to `now` (0 if none).
    pub fn max_over(&self, window: Duration, now: Instant) -> u64 {
        let stamp = peak_stamp(now);
        let span = (window.as_nanos() / PEAK_SLOT.as_nanos()).min(PEAK_SLOTS as u128 - 2) as u64;
        self.slots
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|p| {
                let at = p >> 32;
                at <= stamp && stamp - at <= span
            })
            .map(|p| p & u64::from(u32::MAX))
            .max()
            .unwrap_or(0)
    }
}

/// Other router replicas' requests and prefill tokens in flight to one endpoint, as last read from the shared
/// store.
#[derive(Debug, Default)]
pub struct PeerLoad {
    requests: AtomicU64,
    prefill_tokens: AtomicU64,
}

impl PeerLoad {
    /// (requests, prefill tokens); 0 without `cluster`.
    pub fn get(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.prefill_tokens.load(Ordering::Relaxed),
        )
    }

    /// What the store holds of the other replicas now (`cluster`).
    pub fn set(&self, requests: u64, prefill_tokens: u64) {
        self.requests.store(requests, Ordering::Relaxed);
        self.prefill_tokens.store(prefill_tokens, Ordering::Relaxed);
    }
}

/// Live load of one endpoint, read by placement and by the metrics collector.
#[derive(Debug, Default)]
pub struct EndpointLoad {
    requests: AtomicU64,
    prefill_tokens: AtomicU64,
    peak: PeakWindow,
    /// The most requests in flight since `mark_requests` (an engine stats scrape was sent).
    requests_since_mark: AtomicU64,
    /// Requests whose prefill was not released yet (no first output): the rest of `requests` decode.
    prefilling: AtomicU64,
    /// When the prefill at the head of the queue began, in nanoseconds since `PEAK_EPOCH`: when the tokens in
    /// flight rose from none, or some were last released (the next prefill in line starts then).
    head_since: AtomicU64,
}

fn epoch_nanos(now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(*PEAK_EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

impl EndpointLoad {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Start tracking the most requests in flight from now: an engine stats scrape is being sent.
    pub fn mark_requests(&self) {
        self.requests_since_mark
            .store(self.requests(), Ordering::Relaxed);
    }

    /// The most requests in flight at any moment since `mark_requests`, now included. What the engine's sample,
    /// taken somewhere in between, may count of ours: a request that finished while the scrape was under way is
    /// still in the engine's figure, and read as load placed elsewhere it would be a phantom (rather count one
    /// dispatched meanwhile as ours: a foreign request missed for one sample, not one invented).
    pub fn requests_since_mark(&self) -> u64 {
        self.requests_since_mark
            .load(Ordering::Relaxed)
            .max(self.requests())
    }

    pub fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens.load(Ordering::Relaxed)
    }

    /// Requests in flight that have not had their first output (queued or prefilling).
    pub fn prefilling(&self) -> u64 {
        self.prefilling.load(Ordering::Relaxed)
    }

    /// The most prefill tokens in flight at any moment of the last [`PEAK_WINDOW`], the current level included.
    pub fn prefill_tokens_peak(&self, now: Instant) -> u64 {
        self.peak
            .max_over(PEAK_WINDOW, now)
            .max(self.prefill_tokens())
    }

    /// How long the engine has been on the prefill at the head of our queue: 0 when none of ours is in flight.
    pub fn prefill_busy(&self, now: Instant) -> Duration {
        if self.prefill_tokens() == 0 {
            return Duration::ZERO;
        }
        let since = self.head_since.load(Ordering::Relaxed);
        Duration::from_nanos(epoch_nanos(now).saturating_sub(since))
    }

    fn add_prefill(&self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        let before = self.prefill_tokens.fetch_add(tokens, Ordering::Relaxed);
        if before == 0 {
            self.head_since.store(epoch_nanos(now), Ordering::Relaxed);
        }
        self.peak.record(before.saturating_add(tokens), now);
    }

    fn sub_prefill(&self, tokens: u64) {
        // Saturating: a bug elsewhere must show as a wrong gauge, never as a wrapped 2^64 that repels all traffic.
        let before = self
            .prefill_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(tokens))
            });
        if let Ok(level) = before {
            if tokens > 0 {
                let now = Instant::now();
                self.head_since.store(epoch_nanos(now), Ordering::Relaxed);
                self.peak.record(level, now);
            }
        }
    }

    fn sub_request(&self) {
        let _ = self
            .requests
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
    }
}

/// Why a hold's prefill tokens were released; the proxy uses it for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseCause {
    /// The first output arrived (the first body byte, or the first past a stream's preamble, see
    /// `proxy::first_output`): the engine finished prefill.
    FirstByte,
    /// An error, an upstream 5xx, a close or a cancel: the engine is not (or no longer) prefilling for us.
    Aborted,
    /// The janitor found the hold older than the limit.
    Janitor,
    /// The estimated prefill duration passed (non-streaming responses, see the sessions docs).
    EstimatedDone,
}

#[derive(Debug)]
struct HoldState {
    tokens: u64,
    prefill_released: bool,
    /// Set when the endpoint answered with headers: only then does the estimate count as work it did.
    served: bool,
    /// Release at this instant even without a first byte (non-streaming requests: estimated prefill end).
    release_at: Option<Instant>,
    /// Response headers are due by then (a stream: an engine sends them before prefill); past it without them,
    /// the janitor calls the hook once (`Ledger::report_late_headers`).
    headers_due: Option<(Instant, LateHookBox)>,
    late: bool,
}

/// The part of a hold the janitor can see.
struct HoldEntry {
    load: Arc<EndpointLoad>,
    started: Instant,
    state: Mutex<HoldState>,
    on_release: ReleaseHook,
}

impl std::fmt::Debug for HoldEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldEntry")
            .field("started", &self.started)
            .field("state", &self.state)
            .finish()
    }
}

impl HoldEntry {
    fn state(&self) -> MutexGuard<'_, HoldState> {
        self.state.lock()
    }

    /// Release the prefill tokens once; returns true if this call released them.
    fn release_prefill(&self, cause: ReleaseCause) -> bool {
        let (tokens, served) = {
            let mut st = self.state();
            if st.prefill_released {
                return false;
            }
            st.prefill_released = true;
            self.load.sub_prefill(st.tokens);
            let _ = self
                .load
                .prefilling
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(1))
                });
            (st.tokens, st.served)
        };
        (self.on_release)(tokens, served, cause);
        true
    }
}

/// Registry of outstanding holds, for the janitor.
#[derive(Debug, Default)]
pub struct Ledger {
    next_id: AtomicU64,
    /// Keyed by the ledger's own sequential ids: FNV, not SipHash (a lookup on every dispatch and finish).
    holds: Mutex<HashMap<u64, Arc<HoldEntry>, BuildFnv>>,
}

/// Called when tokens are released: (tokens, served, cause). The proxy wires metrics through it.
pub type ReleaseHook = Arc<dyn Fn(u64, bool, ReleaseCause) + Send + Sync>;

/// Called once when a hold's response headers are overdue, with the hold's estimated prefill tokens.
pub type LateHook = Arc<dyn Fn(u64) + Send + Sync>;

/// A `LateHook` in a hold's state (Debug shows only that there is one).
#[derive(Clone)]
struct LateHookBox(LateHook);

impl std::fmt::Debug for LateHookBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateHook")
    }
}

/// Called once a hold's request slot was given back: wakes a request waiting for room (the pool's wait queue).
pub type FinishHook = Arc<dyn Fn() + Send + Sync>;

impl Ledger {
    pub fn new() -> Arc<Ledger> {
        Arc::new(Ledger::default())
    }

    fn holds(&self) -> MutexGuard<'_, HashMap<u64, Arc<HoldEntry>, BuildFnv>> {
        self.holds.lock()
    }

    /// Dispatch a request to an endpoint: one request and `tokens` prefill tokens are in flight until released.
    pub fn hold(
        self: &Arc<Self>,
        load: Arc<EndpointLoad>,
        tokens: u64,
        on_release: ReleaseHook,
    ) -> Hold {
        let requests = load.requests.fetch_add(1, Ordering::Relaxed) + 1;
        load.requests_since_mark
            .fetch_max(requests, Ordering::Relaxed);
        load.add_prefill(tokens);
        load.prefilling.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(HoldEntry {
            load,
            started: Instant::now(),
            state: Mutex::new(HoldState {
                tokens,
                prefill_released: false,
                served: false,
                release_at: None,
                headers_due: None,
                late: false,
            }),
            on_release,
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.holds().insert(id, entry.clone());
        Hold {
            id,
            entry,
            ledger: self.clone(),
            finished: false,
            on_finish: None,
        }
    }

    /// Release the prefill tokens of holds whose estimated prefill end has passed (cause
    /// [`ReleaseCause::EstimatedDone`]). Returns how many were released.
    pub fn release_due(&self, now: Instant) -> usize {
        let due: Vec<Arc<HoldEntry>> = self
            .holds()
            .values()
            .filter(|e| {
                let st = e.state();
                !st.prefill_released && st.release_at.is_some_and(|t| t <= now)
            })
            .cloned()
            .collect();
        due.iter()
            .filter(|e| e.release_prefill(ReleaseCause::EstimatedDone))
            .count()
    }

    /// Call the late hook of every hold whose response headers are overdue at `now` (once per hold). Returns how
    /// many were late.
    pub fn report_late_headers(&self, now: Instant) -> usize {
        let late: Vec<(LateHook, u64)> = self
            .holds()
            .values()
            .filter_map(|e| {
                let mut st = e.state();
                if st.served || st.late || st.headers_due.as_ref().is_none_or(|(t, _)| *t > now) {
                    return None;
                }
                st.late = true;
                let (_, hook) = st.headers_due.take()?;
                Some((hook.0, st.tokens))
            })
            .collect();
        for (hook, tokens) in &late {
            hook(*tokens);
        }
        late.len()
    }

    /// Number of holds not yet finished (requests in flight across all endpoints).
    pub fn outstanding(&self) -> usize {
        self.holds().len()
    }

    /// Release the prefill tokens of every hold older than `max_age` (cause [`ReleaseCause::Janitor`]). Returns how
    /// many were released. The request itself stays counted until its hold finishes: the connection is still open.
    pub fn expire(&self, max_age: Duration, now: Instant) -> usize {
        let old: Vec<Arc<HoldEntry>> = self
            .holds()
            .values()
            .filter(|e| now.saturating_duration_since(e.started) >= max_age)
            .cloned()
            .collect();
        old.iter()
            .filter(|e| e.release_prefill(ReleaseCause::Janitor))
            .count()
    }
}

/// One request's claim on an endpoint. Finish it explicitly or let it drop; both release exactly once.
pub struct Hold {
    id: u64,
    entry: Arc<HoldEntry>,
    ledger: Arc<Ledger>,
    finished: bool,
    on_finish: Option<FinishHook>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("id", &self.id)
            .field("entry", &self.entry)
            .finish()
    }
}

impl Hold {
    /// Tokens currently held (0 once released).
    pub fn tokens_held(&self) -> u64 {
        let st = self.entry.state();
        if st.prefill_released {
            0
        } else {
            st.tokens
        }
    }

    /// The estimate as it stands (whether or not released).
    pub fn estimate(&self) -> u64 {
        self.entry.state().tokens
    }

    pub fn prefill_released(&self) -> bool {
        self.entry.state().prefill_released
    }

    pub fn age(&self) -> Duration {
        self.entry.started.elapsed()
    }

    /// Grow the estimate while the body streams in (chunked uploads), up to `cap` tokens in all.
    /// Does nothing once the tokens were released.
    pub fn grow_to(&self, tokens: u64) {
        let mut st = self.entry.state();
        if st.prefill_released || tokens <= st.tokens {
            return;
        }
        let add = tokens - st.tokens;
        st.tokens = tokens;
        self.entry.load.add_prefill(add);
    }

    /// Release the tokens at `at` unless the first byte comes earlier (see [`Ledger::release_due`]).
    pub fn release_at(&self, at: Instant) {
        self.entry.state().release_at = Some(at);
    }

    /// The endpoint answered with response headers: from now on the estimate counts as work it did.
    pub fn mark_served(&self) {
        let mut st = self.entry.state();
        st.served = true;
        st.headers_due = None;
    }

    /// Response headers are due by `at`: past it without them, `hook` is called once (by the janitor).
    pub fn headers_due(&self, at: Instant, hook: LateHook) {
        self.entry.state().headers_due = Some((at, LateHookBox(hook)));
    }

    /// The janitor found this hold's headers overdue.
    pub fn was_late(&self) -> bool {
        self.entry.state().late
    }

    /// Release the prefill tokens (idempotent). Returns true if this call released them.
    pub fn release_prefill(&self, cause: ReleaseCause) -> bool {
        self.entry.release_prefill(cause)
    }

    /// Call `hook` once the request slot is given back.
    pub fn on_finish(&mut self, hook: FinishHook) {
        self.on_finish = Some(hook);
    }

    /// End the request: release the tokens if still held, then the request slot (idempotent).
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.release_prefill(ReleaseCause::Aborted);
        self.entry.load.sub_request();
        self.ledger.holds().remove(&self.id);
        if let Some(hook) = self.on_finish.take() {
            hook();
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests;
