//! Live streams as Server-Sent Events: one run's ledger (and its state),
//! and the whole store's commits. Both resume from a sequence number
//! (`?after=` or the `Last-Event-ID` header), and both see the commits of
//! every process on the store: this process's wake them at once, other
//! processes' are found by looking every poll interval.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api::{read as blocking, record_json, run_summary, Params};
use super::error::ApiError;
use super::Shared;
use stepwell::RunState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct After {
    after: Option<u64>,
}

/// Where a stream starts: `?after=`, else `Last-Event-ID`, else `None`
/// (a run's stream: from its first record; the store's: from now).
fn start_after(q: &After, headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    if let Some(a) = q.after {
        return Ok(Some(a));
    }
    match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            ApiError::invalid("Last-Event-ID", format!("{v:?} is not a sequence number"))
        }),
    }
}

/// The events of a channel as an SSE body (a comment every 15 s keeps
/// proxies from closing it).
fn sse(rx: mpsc::Receiver<Event>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    sse_of(stream).into_response()
}

fn sse_of(
    stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// Waits until something was committed (by this process; by any, on a
/// store with a change feed, which the server watches), or, on a store
/// without one, the poll interval passes; `false` when the server shuts
/// down. An idle subscriber of a store with a feed does no work.
async fn pause(s: &Shared, commits: &mut tokio::sync::watch::Receiver<u64>) -> bool {
    let mut shutdown = s.shutdown.clone();
    if *shutdown.borrow() {
        return false;
    }
    let poll = async {
        if s.has_feed {
            std::future::pending::<()>().await
        } else {
            tokio::time::sleep(s.poll_interval).await
        }
    };
    tokio::select! {
        _ = commits.changed() => true,
        _ = poll => true,
        _ = shutdown.changed() => false,
    }
}

/// Sends `e` unless the client left or the server is shutting down (a
/// client that stopped reading cannot hold the shutdown up): `false` to
/// end the stream.
async fn send(s: &Shared, tx: &mpsc::Sender<Event>, e: Event) -> bool {
    let mut shutdown = s.shutdown.clone();
    if *shutdown.borrow() {
        return false;
    }
    tokio::select! {
        sent = tx.send(e) => sent.is_ok(),
        _ = shutdown.changed() => false,
    }
}

/// What a follower of a run is shown about its state: changes to any of
/// these are a `state` event.
fn state_key(run: &RunState) -> (u64, String) {
    (run.version, run.status.as_str().to_string())
}

/// `GET /v1/runs/{id}/ledger/stream`: `record` events (id: the record's
/// seq), a `state` event with the run whenever it changes, `end` once it
/// has ended and every record was sent.
pub(crate) async fn run_stream(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Params(q): Params<After>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut sent = start_after(&q, &headers)?.unwrap_or(0);
    // An unknown run is a 404, a position past its ledger a 400, before
    // the stream starts.
    {
        let (s, id) = (s.clone(), id.clone());
        // Record `sent` exists (one row read, not the ledger).
        let exists = blocking(move || {
            s.rt.get_state(&id)?;
            Ok(sent == 0
                || !s
                    .rt
                    .store()
                    .list_records_range(&id, sent - 1, sent)?
                    .is_empty())
        })
        .await?;
        if !exists {
            return Err(ApiError::invalid(
                "after",
                format!("the run's ledger has no record {sent}"),
            ));
        }
    }
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut commits = s.commits.clone();
        let mut shown: Option<(u64, String)> = None;
        loop {
            // The state first, then the records: a record is appended no
            // later than the state that follows it is saved, so a terminal
            // state read first means its last records are in this read.
            let (run, records) = {
                let (s2, id2) = (s.clone(), id.clone());
                match blocking(move || {
                    let run = s2.rt.get_state(&id2)?;
                    let page = s2
                        .rt
                        .ledger_page(&id2, sent, stepwell::LEDGER_PAGE as usize)?;
                    Ok((run, page))
                })
                .await
                {
                    Ok(v) => v,
                    Err(e) => {
                        send(&s, &tx, event("error", &json!(e.detail))).await;
                        return;
                    }
                }
            };
            for (seq, r) in &records {
                sent = *seq;
                let e = event("record", &record_json(r, sent)).id(sent.to_string());
                if !send(&s, &tx, e).await {
                    return;
                }
            }
            if records.len() as u64 == stepwell::LEDGER_PAGE {
                // A page at a time: the rest before the state.
                continue;
            }
            if shown.as_ref() != Some(&state_key(&run)) {
                shown = Some(state_key(&run));
                let data = serde_json::to_value(&run).unwrap_or(Value::Null);
                if !send(&s, &tx, event("state", &data)).await {
                    return;
                }
            }
            if run.status.is_terminal() {
                let end =
                    json!({"run_id": run.run_id, "status": run.status.as_str(), "records": sent});
                send(&s, &tx, event("end", &end)).await;
                return;
            }
            if !records.is_empty() {
                continue;
            }
            if !pause(&s, &mut commits).await || tx.is_closed() {
                return;
            }
        }
    });
    Ok(sse(rx))
}

/// `GET /v1/stream`: every commit of the store, in commit order: `record`
/// events (data: the record with its `run_id` and `seq`), then a `run`
/// event with the run's summary; the id of the last event of each commit
/// is the feed position to resume after. Without `after` (or
/// `Last-Event-ID`) it starts at the newest commit; a first `position`
/// event says where it starts. On a backend that keeps no feed
/// (memory, JSON files) it shows the commits of this process from the
/// moment the client connects, numbered from 1 for each connection
/// (`after` and `Last-Event-ID` do not apply there).
pub(crate) async fn store_stream(
    State(s): State<Arc<Shared>>,
    Params(q): Params<After>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = start_after(&q, &headers)?;
    let head = {
        let s = s.clone();
        blocking(move || Ok(s.rt.store().feed_head()?)).await?
    };
    let (tx, rx) = mpsc::channel::<Event>(256);
    if let Some(head) = head {
        // From now unless told where: the first event says where now is.
        let after = after.unwrap_or(head);
        if after > head {
            return Err(ApiError::invalid(
                "after",
                format!("the feed's newest position is {head}"),
            ));
        }
        let _ = tx
            .send(event("position", &json!({"after": after, "head": head})).id(after.to_string()))
            .await;
        tokio::spawn(follow_feed(s, after, tx));
    } else {
        tokio::spawn(follow_process(s, tx));
    }
    Ok(sse(rx))
}

async fn follow_feed(s: Arc<Shared>, mut after: u64, tx: mpsc::Sender<Event>) {
    let mut commits = s.commits.clone();
    loop {
        let s2 = s.clone();
        let batch = blocking(move || {
            let entries = s2.rt.store().list_feed(after, 100)?.unwrap_or_default();
            let mut out = Vec::new();
            for e in entries {
                let records =
                    s2.rt
                        .ledger_range(&e.run_id, e.from_seq.saturating_sub(1), e.to_seq)?;
                let run = s2.rt.load_run_opt(&e.run_id)?;
                out.push((e, records, run));
            }
            Ok(out)
        })
        .await;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                send(&s, &tx, event("error", &json!(e.detail))).await;
                return;
            }
        };
        let empty = batch.is_empty();
        for (entry, records, run) in batch {
            for (i, r) in records.iter().enumerate() {
                let mut e = event("record", &record_json(r, entry.from_seq + i as u64));
                if run.is_none() && i + 1 == records.len() {
                    e = e.id(entry.seq.to_string());
                }
                if !send(&s, &tx, e).await {
                    return;
                }
            }
            if let Some(run) = &run {
                let e = event("run", &run_summary(run)).id(entry.seq.to_string());
                if !send(&s, &tx, e).await {
                    return;
                }
            }
            after = entry.seq;
        }
        if empty && (!pause(&s, &mut commits).await || tx.is_closed()) {
            return;
        }
    }
}

async fn follow_process(s: Arc<Shared>, tx: mpsc::Sender<Event>) {
    let feed = s.rt.subscribe_ledger(None);
    let (atx, mut arx) = mpsc::channel::<stepwell::StepRecord>(1024);
    // The bridge from the runtime's subscription ends with the stream
    // (it looks every second whether anyone still listens).
    std::thread::spawn(move || loop {
        match feed.recv_timeout(Duration::from_secs(1)) {
            Ok(r) => {
                if atx.blocking_send(r).is_err() {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !atx.is_closed() => {}
            Err(_) => break,
        }
    });
    let mut shutdown = s.shutdown.clone();
    let mut n = 0u64;
    loop {
        // A client that left ends the stream (and the bridge) at once,
        // not at the next commit.
        let r = tokio::select! {
            r = arx.recv() => r,
            _ = shutdown.changed() => None,
            _ = tx.closed() => None,
        };
        let Some(r) = r else { return };
        n += 1;
        let run_id = r.run_id.clone();
        let data = serde_json::to_value(&r).unwrap_or(Value::Null);
        if !send(&s, &tx, event("record", &data).id(n.to_string())).await {
            return;
        }
        let s2 = s.clone();
        if let Ok(Some(run)) = blocking(move || s2.rt.load_run_opt(&run_id)).await {
            if !send(&s, &tx, event("run", &run_summary(&run))).await {
                return;
            }
        }
    }
}
