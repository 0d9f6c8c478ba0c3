//! Request bodies held for routing: read whole before the upstream is chosen (bounded per request, per process
//! and in time) and handed to every forwarding attempt.
//!
//! Routing needs fields that can sit anywhere in the body (openai-python 1.x sends `model` and `stream` after
//! `messages`), so the router reads the whole body first. Pingora replays only 64 KiB of a body read this early;
//! the patched pingora-proxy (vendor/pingora-proxy.patch) instead asks `request_body_filter` for the body on each
//! attempt, and the proxy supplies the one held here, so a retry resends all of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pingora_error::ErrorType;
use pingora_proxy::Session;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::errors::ApiError;

/// Budget accounting unit: permits are KiB so that a 1 GiB budget fits a semaphore comfortably.
const UNIT: u64 = 1024;

/// Limits on reading one body.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body accepted (413 beyond).
    pub max_bytes: usize,
    /// The whole body must arrive within this (408 otherwise).
    pub deadline: Duration,
    /// How long a request waits for room in the process-wide budget before 503.
    pub budget_wait: Duration,
}

/// The process-wide budget of body bytes held for routing: a flood of large uploads waits briefly for room or is
/// turned away with 503, never grows the process without bound.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    units: u64,
}

impl BodyBudget {
    pub fn new(bytes: u64) -> BodyBudget {
        let units = bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
        BodyBudget {
            permits: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Bytes currently held across all requests.
    pub fn held_bytes(&self) -> u64 {
        (self.units - self.permits.available_permits() as u64) * UNIT
    }

    /// Claim room for `bytes` more, waiting until `until` at most.
    async fn claim(
        &self,
        bytes: u64,
        until: Instant,
        into: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<(), ApiError> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).map_err(|_| ApiError::router_busy())?;
        if units == 0 {
            return Ok(());
        }
        // Room now, the common case: no clock, no timer.
        let permit = match self.permits.clone().try_acquire_many_owned(units) {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(ApiError::router_busy()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let wait = until.saturating_duration_since(Instant::now());
                match tokio::time::timeout(wait, self.permits.clone().acquire_many_owned(units))
                    .await
                {
                    Ok(Ok(p)) => p,
                    _ => return Err(ApiError::router_busy()),
                }
            }
        };
        match into {
            Some(p) => p.merge(permit),
            None => *into = Some(permit),
        }
        Ok(())
    }
}

/// A whole request body and its claim on the budget (returned when this is dropped).
#[derive(Debug)]
pub struct HeldBody {
    pub bytes: Bytes,
    _claim: Option<OwnedSemaphorePermit>,
}

impl HeldBody {
    /// Hold `bytes` instead (a decode leg's body), under the same claim on the budget.
    pub fn replace(&mut self, bytes: Bytes) {
        self.bytes = bytes;
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Answer the client with this.
    Answer(ApiError),
    /// The client went away: nothing to answer.
    ClientGone(Box<pingora_error::Error>),
}

/// Read the whole body (`content_length` from the validated header, None for chunked).
pub async fn read_whole(
    session: &mut Session,
    content_length: Option<u64>,
    limits: BodyLimits,
    budget: &BodyBudget,
) -> Result<HeldBody, BodyError> {
    let started = Instant::now();
    let budget_until = started + limits.budget_wait;
    let mut claim = None;
    // A declared length is claimed up front: it either fits or waits, instead of starving half-way.
    if let Some(n) = content_length {
        if let Err(busy) = budget.claim(n, budget_until, &mut claim).await {
            return Err(drain_then(session, started + limits.deadline, busy).await);
        }
    }
    let mut buf = BytesMut::with_capacity(content_length.unwrap_or(16 * 1024) as usize);
    let read = async {
        let downstream = session.as_downstream_mut();
        while let Some(chunk) = downstream.read_request_body().await? {
            if buf.len() + chunk.len() > limits.max_bytes {
                return Ok(Err(ApiError::body_too_large(limits.max_bytes, None)));
            }
            if content_length.is_none() {
                if let Err(e) = budget
                    .claim(chunk.len() as u64, budget_until, &mut claim)
                    .await
                {
                    return Ok(Err(e));
                }
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Ok(()))
    };
    match tokio::time::timeout(limits.deadline, read).await {
        Err(_) => Err(BodyError::Answer(ApiError::body_timeout())),
        Ok(Ok(Ok(()))) => Ok(HeldBody {
            bytes: buf.freeze(),
            _claim: claim,
        }),
        Ok(Ok(Err(api))) if api.status == 503 => {
            drop(buf);
            Err(drain_then(session, started + limits.deadline, api).await)
        }
        Ok(Ok(Err(api))) => Err(BodyError::Answer(api)),
        Ok(Err(e)) => Err(classify_read_error(e)),
    }
}

/// Read and discard the rest of the body before answering `answer`: a client still uploading would otherwise see
/// a broken pipe instead of the 503 and its Retry-After. Nothing is kept; bounded by `until`.
async fn drain_then(session: &mut Session, until: Instant, answer: ApiError) -> BodyError {
    let wait = until.saturating_duration_since(Instant::now());
    match tokio::time::timeout(wait, session.as_downstream_mut().drain_request_body()).await {
        Ok(Ok(())) => BodyError::Answer(answer),
        Ok(Err(e)) => classify_read_error(e),
        Err(_) => BodyError::Answer(ApiError::body_timeout()),
    }
}

fn classify_read_error(e: Box<pingora_error::Error>) -> BodyError {
    match e.etype() {
        ErrorType::ReadTimedout => BodyError::Answer(ApiError::body_timeout()),
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError => {
            BodyError::ClientGone(e)
        }
        // Malformed chunk framing and the like: the client's fault.
        _ => BodyError::Answer(ApiError::malformed_body()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_waits_then_refuses_and_returns_room_on_drop() {
        let b = BodyBudget::new(4 * UNIT);
        let mut a = None;
        let soon = Instant::now() + Duration::from_millis(50);
        b.claim(3 * UNIT, soon, &mut a).await.unwrap();
        assert_eq!(b.held_bytes(), 3 * UNIT);
        let mut c = None;
        let err = b.claim(2 * UNIT, soon, &mut c).await.unwrap_err();
        assert_eq!(err.status, 503);
        assert_eq!(err.retry_after, Some(1));
        drop(a);
        assert_eq!(b.held_bytes(), 0);
        let later = Instant::now() + Duration::from_millis(50);
        b.claim(2 * UNIT, later, &mut c).await.unwrap();
        b.claim(UNIT, later, &mut c).await.unwrap();
        assert_eq!(b.held_bytes(), 3 * UNIT);
    }
}
