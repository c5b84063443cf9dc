//! Request bodies read under a deadline and a server-wide budget: a client
//! that sends its body slowly is answered 408 when the deadline passes,
//! and the bytes that bodies being read may hold, across every connection,
//! are bounded (a request that would go over the budget is answered 503 at
//! once rather than waiting with its connection open).

use std::sync::Arc;
use std::time::Duration;

use axum::body::HttpBody as _;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// The budget's unit: permits count KiB, so a budget of gigabytes fits a
/// semaphore's permits.
const UNIT: usize = 1024;

/// How long an over-large body is read on (and dropped) at most, so that a
/// sender still sending gets to read its 413.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// How many over-large bodies are read on at once; past that the answer
/// goes at once.
const DRAINS: usize = 16;

/// A body read whole, with its share of the budget: the share is given
/// back when this is dropped, so a caller that keeps the bytes until its
/// work on them is done keeps the budget honest.
pub(crate) struct BodyBytes {
    /// The body.
    pub(crate) bytes: Bytes,
    _share: Option<OwnedSemaphorePermit>,
}

/// The bytes that request bodies being read may hold, across the server
/// (or one share of it: the open webhook route has its own).
pub(crate) struct BodyBudget {
    permits: Arc<Semaphore>,
    drains: Arc<Semaphore>,
    /// The largest body one request may send, in bytes.
    pub(crate) max_body_bytes: usize,
    /// How long a request may take to send its whole body.
    pub(crate) deadline: Duration,
}

/// Why a body was not read.
#[derive(Debug)]
pub(crate) enum BodyRefusal {
    /// Over `max_body_bytes` (declared or sent).
    TooLarge,
    /// Not all sent before the deadline.
    TooSlow(Duration),
    /// The budget is taken by other requests' bodies.
    Busy,
    /// The connection failed while the body was read.
    Broken,
}

impl From<BodyRefusal> for ApiError {
    fn from(r: BodyRefusal) -> ApiError {
        match r {
            BodyRefusal::TooLarge => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is over the limit",
            ),
            BodyRefusal::TooSlow(d) => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} ms",
                    d.as_millis()
                ),
            ),
            BodyRefusal::Busy => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "the server holds as many request bodies as it takes: try again shortly",
            ),
            BodyRefusal::Broken => ApiError::invalid("body", "the body could not be read"),
        }
    }
}

impl BodyBudget {
    /// A budget of `total_bytes` (at least one body of `max_body_bytes`).
    pub(crate) fn new(total_bytes: usize, max_body_bytes: usize, deadline: Duration) -> Self {
        let units = total_bytes.max(max_body_bytes).div_ceil(UNIT);
        BodyBudget {
            permits: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
            drains: Arc::new(Semaphore::new(DRAINS)),
            max_body_bytes,
            deadline,
        }
    }

    /// Reads `body` whole: refused at once when it declares more than the
    /// limit or the budget cannot hold what it declares (a body of unknown
    /// length is budgeted at the limit), cut off at the limit or the
    /// deadline. The bytes keep their share of the budget until dropped.
    pub(crate) async fn read(&self, body: Body) -> Result<BodyBytes, BodyRefusal> {
        let hint = body.size_hint();
        if hint.lower() as usize > self.max_body_bytes {
            return Err(BodyRefusal::TooLarge);
        }
        let expected = hint
            .upper()
            .map_or(self.max_body_bytes, |n| n as usize)
            .min(self.max_body_bytes);
        if expected == 0 && hint.exact() == Some(0) {
            return Ok(BodyBytes {
                bytes: Bytes::new(),
                _share: None,
            });
        }
        let share = self.reserve(expected)?;
        let deadline = tokio::time::Instant::now() + self.deadline;
        let mut bytes = Vec::with_capacity(expected);
        let mut stream = body.into_data_stream();
        loop {
            let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return Err(BodyRefusal::TooSlow(self.deadline)),
                Ok(None) => break,
                Ok(Some(Err(_))) => return Err(BodyRefusal::Broken),
                Ok(Some(Ok(chunk))) => chunk,
            };
            if bytes.len() + chunk.len() > self.max_body_bytes.min(expected) {
                return Err(BodyRefusal::TooLarge);
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(BodyBytes {
            bytes: Bytes::from(bytes),
            _share: Some(share),
        })
    }

    /// Reads and drops up to `cap` bytes of `body`, for at most
    /// [`DRAIN_TIME`] and by at most [`DRAINS`] requests at once: a client
    /// still sending an over-large body gets to read the answer, and
    /// senders of over-large bodies hold no connection for long.
    pub(crate) async fn drain(&self, body: Body, cap: usize) {
        let Ok(_slot) = self.drains.try_acquire() else {
            return;
        };
        let deadline = tokio::time::Instant::now() + self.deadline.min(DRAIN_TIME);
        let mut stream = body.into_data_stream();
        let mut seen = 0usize;
        while seen <= cap {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(chunk))) => seen += chunk.len(),
                _ => return,
            }
        }
    }

    fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, BodyRefusal> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).map_err(|_| BodyRefusal::TooLarge)?;
        self.permits
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| BodyRefusal::Busy)
    }
}
