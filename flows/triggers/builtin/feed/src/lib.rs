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

stepwell_guest::export_connection_source!("feed.item", 1, "When a feed has new items", items);
