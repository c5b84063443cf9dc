//! The feed poller of `feed.item@1` connections: the driver loops poll each
//! active feed connection every `every` (at least 60 s), with a conditional
//! GET (`If-None-Match` / `If-Modified-Since`), parse RSS or Atom with
//! `feed-rs`, and append each new item once to the connection's stream
//! (the item's id is the dedupe key, so an item is never appended twice,
//! across restarts and racing pollers too). The first poll of a connection
//! with `initial_items: skip` (the default) is a baseline: what the feed
//! already holds is history. A failure is recorded on the connection
//! (`last_error`) and the next poll waits a capped back-off (up to 6 h).

use super::connections::{Connections, ConnectionsInner};
use std::io::Read;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::connections::ConnectionEvent;
use stepwell_automation_core::time::format_timestamp as format_time;
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::store::{ConnectionRecord, StoreError};
use stepwell_runtime::Runtime;

/// The largest feed body read.
pub const MAX_FEED_BYTES: u64 = 5 * 1024 * 1024;
/// How many seen item ids a connection remembers.
pub const MAX_SEEN_KEPT: usize = 2000;
/// The longest back-off after failed polls.
pub const MAX_BACKOFF_SECS: i64 = 6 * 3600;
/// How long one fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// `^[1-9][0-9]*[smhd]$`, at most 366 days, in seconds.
pub fn parse_every(text: &str) -> Option<i64> {
    let unit = match text.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => return None,
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs = digits.parse::<i64>().ok()?.checked_mul(unit)?;
    (secs <= 366 * 86400).then_some(secs)
}

fn next_poll(c: &ConnectionRecord) -> Option<DateTime<Utc>> {
    c.feeder_state["next_poll_at"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// Whether connection `c` is due for a poll at `now`.
pub fn due(c: &ConnectionRecord, now: DateTime<Utc>) -> bool {
    next_poll(c).is_none_or(|t| t <= now)
}

/// The feed parser, with item identities that never change between polls:
/// an item without an id is known by its link, else by the SHA-256 of its
/// title (feed-rs would make up a random one).
fn parser() -> feed_rs::parser::Parser {
    feed_rs::parser::Builder::new()
        .id_generator(|links, title, _uri| match links.first() {
            Some(link) => link.href.clone(),
            None => format!(
                "{TITLE_ID}{}",
                hex::encode(Sha256::digest(
                    title.as_ref().map_or("", |t| t.content.as_str()).as_bytes()
                ))
            ),
        })
        .build()
}

/// What an item is known by in the inbox and in the seen list: its id (an
/// item known only by its title also by its date: two items of one title
/// are two items), capped at 200 bytes (a feed cannot make the
/// connection's record grow without bound).
fn identity(e: &feed_rs::model::Entry) -> String {
    match (e.id.starts_with(TITLE_ID), e.published.or(e.updated)) {
        (true, Some(at)) => format!(
            "{TITLE_ID}{}",
            hex::encode(Sha256::digest(format!("{}\n{at}", e.id).as_bytes()))
        ),
        _ => super::connections::capped(&e.id),
    }
}

/// The prefix of an identity made from an item's title.
const TITLE_ID: &str = "sha256:";

/// One item as its event's `data`.
fn item_data(e: &feed_rs::model::Entry, feed_title: &str, url: &str) -> Value {
    let text = |t: &Option<feed_rs::model::Text>| {
        t.as_ref()
            .map(|t| t.content.trim().to_string())
            .unwrap_or_default()
    };
    json!({
        "id": e.id,
        "title": text(&e.title),
        "link": e.links.first().map(|l| l.href.clone()).unwrap_or_default(),
        "published": e.published.map(format_time),
        "updated": e.updated.map(format_time),
        "summary": text(&e.summary),
        "author": e.authors.first().map(|a| a.name.clone()).unwrap_or_default(),
        "feed": {"title": feed_title, "url": url},
    })
}

fn agent() -> ureq::Agent {
    static AGENT: std::sync::OnceLock<ureq::Agent> = std::sync::OnceLock::new();
    AGENT
        .get_or_init(|| {
            ureq::Agent::config_builder()
                .timeout_global(Some(FETCH_TIMEOUT))
                .timeout_connect(Some(Duration::from_secs(10)))
                .http_status_as_error(false)
                .max_redirects(5)
                .build()
                .into()
        })
        .clone()
}

/// A fetch: `None` for 304 Not Modified, else the body and the validators.
type Fetched = Option<(Vec<u8>, Option<String>, Option<String>)>;

fn fetch(url: &str, state: &Value) -> std::result::Result<Fetched, (String, String)> {
    let mut req = agent().get(url);
    if let Some(etag) = state["etag"].as_str() {
        req = req.header("If-None-Match", etag);
    }
    if let Some(lm) = state["last_modified"].as_str() {
        req = req.header("If-Modified-Since", lm);
    }
    let mut resp = req
        .call()
        .map_err(|e| ("feed_unreachable".to_string(), format!("{url}: {e}")))?;
    let status = resp.status().as_u16();
    if status == 304 {
        return Ok(None);
    }
    if !(200..300).contains(&status) {
        return Err((
            "feed_http_error".into(),
            format!("{url} answered HTTP {status}"),
        ));
    }
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (etag, last_modified) = (header("etag"), header("last-modified"));
    let mut body = Vec::new();
    resp.body_mut()
        .as_reader()
        .take(MAX_FEED_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| ("feed_unreachable".to_string(), format!("{url}: {e}")))?;
    if body.len() as u64 > MAX_FEED_BYTES {
        return Err((
            "feed_too_large".into(),
            format!("{url} is larger than {MAX_FEED_BYTES} bytes"),
        ));
    }
    Ok(Some((body, etag, last_modified)))
}

/// Polls feed connection `id` now if it is due (`force`: whether or not),
/// claiming the poll first so that two drivers never poll it at once.
/// Returns the number of items appended, or `None` when it was not due (or
/// another driver claimed it).
pub fn poll(rt: &Runtime, id: &str, force: bool) -> Result<Option<usize>> {
    let now = rt.now();
    let c = rt.connection(id)?;
    if c.source() != super::connections::FEED_SOURCE {
        return Err(super::connections::connection_error(
            "invalid_connection",
            Some("connection_id"),
            format!(
                "connection {id} is not a {} connection",
                super::connections::FEED_SOURCE
            ),
        ));
    }
    let every = parse_every(c.config["every"].as_str().unwrap_or("15m")).unwrap_or(900);
    // The claim: the next poll moves ahead before anything is fetched.
    let claimed_until = format_time(now + chrono::Duration::seconds(every));
    let claim = rt.store().update_connection(id, &mut |c| {
        if !force && !due(c, now) {
            return Err(StoreError::conflict("not due"));
        }
        c.feeder_state["next_poll_at"] = json!(claimed_until);
        Ok(())
    });
    let c = match claim {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(None),
        Err(e) if e.is_conflict() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let url = c.config["url"].as_str().unwrap_or_default().to_string();
    let state = if c.feeder_state.is_object() {
        c.feeder_state.clone()
    } else {
        json!({})
    };
    let parsed = fetch(&url, &state).and_then(|f| match f {
        None => Ok(None),
        Some((body, etag, lm)) => parser()
            .parse(&body[..])
            .map(|feed| Some((feed, etag, lm)))
            .map_err(|e| ("feed_unparsable".to_string(), format!("{url}: {e}"))),
    });
    let (feed, etag, last_modified) = match parsed {
        Ok(Some(p)) => p,
        Ok(None) => {
            rt.store().update_connection(id, &mut |c| {
                c.feeder_state["failures"] = json!(0);
                c.last_error = None;
                Ok(())
            })?;
            return Ok(Some(0));
        }
        Err((code, cause)) => {
            let failures = state["failures"].as_i64().unwrap_or(0) + 1;
            let delay = (every.max(60) << (failures - 1).min(8)).min(MAX_BACKOFF_SECS);
            let at = format_time(now);
            let next = format_time(now + chrono::Duration::seconds(delay));
            rt.store().update_connection(id, &mut |c| {
                c.feeder_state["failures"] = json!(failures);
                c.feeder_state["next_poll_at"] = json!(next);
                c.last_error = Some(json!({"code": code, "at": at, "cause": cause,
                    "fix": "Check the feed's address and that it serves RSS or Atom."}));
                Ok(())
            })?;
            return Err(Error::invalid("feed", cause));
        }
    };
    let title = feed
        .title
        .as_ref()
        .map(|t| t.content.trim().to_string())
        .unwrap_or_default();
    let seen: Vec<String> = state["seen"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let baseline =
        state["baseline_done"] != Value::Bool(true) && c.config["initial_items"] != "deliver";
    // Feeds list the newest first: deliver the newest `max_items` new ones,
    // oldest first.
    let max_items = c.config["max_items"].as_u64().unwrap_or(50) as usize;
    let mut new: Vec<&feed_rs::model::Entry> = feed
        .entries
        .iter()
        .filter(|e| !seen.contains(&identity(e)))
        .collect();
    new.reverse();
    let deliver: Vec<&feed_rs::model::Entry> = if baseline {
        Vec::new()
    } else {
        new[new.len().saturating_sub(max_items)..].to_vec()
    };
    let mut appended = 0;
    for e in &deliver {
        let digest = hex::encode(Sha256::digest(e.id.as_bytes()));
        let (a, _) = rt.append_connection_event(
            &c,
            ConnectionEvent {
                id: format!("feed:{}", &digest[..32]),
                data: item_data(e, &title, &url),
                time: e.published.or(e.updated).map(format_time),
                subject: Some(identity(e)),
                dedupe_key: identity(e),
                trusted: false,
            },
        )?;
        if !a.duplicate {
            appended += 1;
        }
    }
    let mut seen = seen;
    seen.extend(new.iter().map(|e| identity(e)));
    let keep = seen.len().saturating_sub(MAX_SEEN_KEPT);
    let seen: Vec<String> = seen.split_off(keep);
    rt.store().update_connection(id, &mut |c| {
        c.feeder_state["seen"] = json!(seen);
        c.feeder_state["etag"] = json!(etag);
        c.feeder_state["last_modified"] = json!(last_modified);
        c.feeder_state["failures"] = json!(0);
        c.feeder_state["baseline_done"] = json!(true);
        c.last_error = None;
        Ok(())
    })?;
    Ok(Some(appended))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_is_checked() {
        assert_eq!(parse_every("15m"), Some(900));
        assert_eq!(parse_every("60s"), Some(60));
        assert_eq!(parse_every("0m"), None);
        assert_eq!(parse_every("367d"), None);
        assert_eq!(parse_every("5"), None);
    }
}
