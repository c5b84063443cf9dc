//! `feed.item@1`: runs an automation on new items of an RSS or Atom feed.
//! The host polls the connection's feed (`url`, `every`) and appends each
//! new item once to the connection's stream; this source admits the new
//! items of a poll as one batch (`stepwell_guest::trigger::connection`).
//! Each event's `data` is `{id, title, link, published, updated, summary,
//! author, feed: {title, url}}`, written by the feed's authors: untrusted.
//!
//! Named occurrence inputs: `items` (each `{id, title, link, published,
//! summary, author}`) and `feed` (`{title, url}`).
use serde_json::{json, Value};
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::connection;
use stepwell_guest::trigger::*;

struct Feed;

/// The `items` and `feed` inputs of an admission's payload.
fn items(payload: &Value) -> Option<Value> {
    let events = payload["events"].as_array()?;
    let mut feed = json!({"title": null, "url": null});
    let mut items = Vec::new();
    for e in events {
        let data = &e["data"];
        let mut item = serde_json::Map::new();
        for k in ["id", "title", "link", "published", "summary", "author"] {
            item.insert(k.into(), data.get(k).cloned().unwrap_or(Value::Null));
        }
        items.push(Value::Object(item));
        if feed["url"].is_null() && data["feed"].is_object() {
            feed = json!({"title": data["feed"]["title"], "url": data["feed"]["url"]});
        }
    }
    Some(json!({ "items": items, "feed": feed }))
}

impl TriggerSource for Feed {
    fn descriptor() -> Descriptor {
        Descriptor {
            config_schema: connection::binding_config_schema(),
            event_schema: connection::batch_event_schema(),
            ..Descriptor::new("feed.item", 1, "When a feed has new items", Kind::Event)
        }
    }

    fn validate(config: Value, now: &str) -> Result<Value, TriggerError> {
        connection::validate(config, now)
    }

    fn initial_state(binding: &Binding, _: &str) -> Result<Value, TriggerError> {
        Ok(connection::initial_state(binding))
    }

    fn prepare(
        b: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<Wait, TriggerError> {
        connection::prepare(b, state, now, events)
    }

    fn admit(
        b: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        connection::admit(b, state, now, events, items)
    }

    fn rearm(b: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
        connection::rearm(b, state, now)
    }
}

export_trigger_source!(Feed);
