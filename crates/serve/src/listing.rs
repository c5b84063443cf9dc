//! What the dashboard reads beside the plain lists: runs created in a time
//! window, and the picture of the flow a run executes.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use stepwell::core::Error;
use stepwell::flow::{NodeKind, Workflow};
use stepwell::{RunQuery, RunState};

use super::api::ApiResult;
use super::error::ApiError;
use super::Shared;

/// Runs created in `[since, until]` (either end open), newest first.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    /// The oldest creation time kept.
    pub(crate) since: Option<DateTime<Utc>>,
    /// The newest creation time kept.
    pub(crate) until: Option<DateTime<Utc>>,
}

impl Window {
    /// Reads the `since` and `until` parameters (RFC 3339); `None` when
    /// neither is given.
    pub(crate) fn parse(since: Option<&str>, until: Option<&str>) -> ApiResult<Option<Self>> {
        let time = |field: &str, v: Option<&str>| {
            v.map(|t| {
                DateTime::parse_from_rfc3339(t)
                    .map(|d| d.with_timezone(&Utc))
                    .map_err(|e| ApiError::invalid(field, not_a_time(t, &e)))
            })
            .transpose()
        };
        let window = Window {
            since: time("since", since)?,
            until: time("until", until)?,
        };
        if let (Some(a), Some(b)) = (window.since, window.until) {
            if a > b {
                return Err(ApiError::invalid("until", "is before since"));
            }
        }
        Ok((window.since.is_some() || window.until.is_some()).then_some(window))
    }

    fn holds(&self, run: &RunState) -> bool {
        let Ok(created) = DateTime::parse_from_rfc3339(&run.created_at) else {
            return false;
        };
        let created = created.with_timezone(&Utc);
        self.since.is_none_or(|s| created >= s) && self.until.is_none_or(|u| created <= u)
    }
}

/// Why `text` is not a time, quoting at most its first 40 characters; an
/// offset whose `+` arrived as a space (not percent-encoded) is named.
fn not_a_time(text: &str, e: &chrono::ParseError) -> String {
    let shown: String = text.chars().take(40).collect();
    let more = if text.chars().count() > 40 { "..." } else { "" };
    let hint = if text.get(19..).is_some_and(|rest| rest.contains(' ')) {
        " (a + in a query string is written %2B)"
    } else {
        ""
    };
    format!(
        "{:?} is not an RFC 3339 time (2026-01-01T00:00:00Z): {e}{hint}",
        format!("{shown}{more}")
    )
}

/// How many runs one windowed request reads at most: a narrow window over
/// a large store answers a short (even empty) page and a cursor to go on
/// from, instead of reading the whole store in one request.
const SCAN_BUDGET: usize = 5_000;
/// The page the window is read by.
const SCAN_PAGE: usize = 500;

/// One page of the runs `query` lists that `window` holds, newest first,
/// and the cursor of the next. Creation order need not follow creation
/// times (a run made with `--now`, an imported one), so no run is taken as
/// the end: the budget bounds the work instead.
pub(crate) fn windowed_page(
    s: &Shared,
    query: RunQuery,
    limit: usize,
    window: Window,
    show: fn(&RunState) -> Value,
) -> Result<Value, Error> {
    let list = |q: &RunQuery| s.rt.list_runs(q);
    read_window(list, query, (limit, SCAN_BUDGET), window, show)
}

/// [`windowed_page`] over any listing: `limit` runs a page, at most
/// `budget` read.
fn read_window(
    list: impl Fn(&RunQuery) -> Result<Vec<RunState>, Error>,
    mut query: RunQuery,
    (limit, budget): (usize, usize),
    window: Window,
    show: fn(&RunState) -> Value,
) -> Result<Value, Error> {
    query.limit = Some(SCAN_PAGE.min(budget));
    let mut found: Vec<RunState> = Vec::new();
    let mut scanned = 0;
    let page = |found: &[RunState], next: Option<String>| {
        let items: Vec<Value> = found.iter().map(show).collect();
        json!({"items": items, "next_cursor": next})
    };
    loop {
        let runs = list(&query)?;
        let full = Some(runs.len()) == query.limit;
        for run in runs {
            scanned += 1;
            query.after_run_id = Some(run.run_id.clone());
            if window.holds(&run) {
                found.push(run);
                if found.len() > limit {
                    // One more than the page: the page's last is the cursor.
                    found.truncate(limit);
                    let next = found.last().map(|r| r.run_id.clone());
                    return Ok(page(&found, next));
                }
            }
            if scanned >= budget {
                // More may follow: the next page goes on from the last run read.
                return Ok(page(&found, query.after_run_id.clone()));
            }
        }
        if !full {
            return Ok(page(&found, None));
        }
    }
}

/// The flow `run` executes, as the dashboard draws it: its entry and its
/// nodes with their kinds and static successors (`next` and `routes`; a
/// component may also name any node id, which only the ledger shows).
pub(crate) fn flow_json(run: &RunState, wf: &Workflow) -> Value {
    let mut ids: Vec<&String> = wf.nodes.keys().collect();
    ids.sort();
    let nodes: Vec<Value> = ids
        .into_iter()
        .map(|id| {
            let node = &wf.nodes[id];
            let (kind, effect) = match &node.kind {
                NodeKind::Component { .. } => ("component", None),
                NodeKind::Effect { kind, .. } => ("effect", Some(kind.as_str())),
                NodeKind::Complete { .. } => ("complete", None),
            };
            json!({
                "id": node.id,
                "kind": kind,
                "effect": effect,
                "next": node.next,
                "routes": node.routes,
            })
        })
        .collect();
    json!({
        "run_id": run.run_id,
        "workflow_id": wf.workflow_id,
        "workflow_version": run.workflow_version,
        "entry": wf.entry,
        "current_node": run.current_node,
        "status": run.status.as_str(),
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepwell::RunStatus;

    /// Runs r0..r{n}, created a minute apart from 2026-01-01T00:00Z, but
    /// `r3` dated 2020 (made with `--now`): listed in creation order.
    fn runs(n: usize) -> Vec<RunState> {
        (0..n)
            .map(|i| {
                let created = if i == 3 {
                    "2020-01-01T00:00:00Z".to_string()
                } else {
                    format!("2026-01-01T{:02}:{:02}:00Z", i / 60, i % 60)
                };
                serde_json::from_value(json!({
                    "version": 1, "run_id": format!("r{i}"), "workflow_id": "w",
                    "status": RunStatus::Completed.as_str(), "vars": {},
                    "created_at": created, "updated_at": created,
                }))
                .unwrap()
            })
            .collect()
    }

    fn read(
        all: &[RunState],
        limit: usize,
        budget: usize,
        window: Window,
        after: Option<&str>,
    ) -> (Vec<String>, Value) {
        let list = |q: &RunQuery| Ok(q.page(all.to_vec(), |r| &r.run_id, |r| q.matches(r)));
        let query = RunQuery {
            newest_first: true,
            after_run_id: after.map(str::to_string),
            ..RunQuery::default()
        };
        let page = read_window(list, query, (limit, budget), window, |r| json!(r.run_id)).unwrap();
        let ids = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        (ids, page["next_cursor"].clone())
    }

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn at(t: &str) -> Option<DateTime<Utc>> {
        Some(DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc))
    }

    #[test]
    fn a_bad_time_is_quoted_short_and_a_lost_plus_is_named() {
        let long = "9".repeat(5000);
        let e = Window::parse(Some(&long), None).unwrap_err();
        let text = format!("{e:?}");
        assert!(
            text.len() < 600 && text.contains("...\\\" is not"),
            "{text}"
        );
        let e = Window::parse(None, Some("2026-01-01T00:00:00 01:00")).unwrap_err();
        assert!(format!("{e:?}").contains("%2B"), "{e:?}");
    }

    #[test]
    fn a_window_keeps_the_runs_created_in_it_whatever_their_order() {
        let all = runs(10);
        let since = Window {
            since: at("2026-01-01T00:05:00Z"),
            until: None,
        };
        assert_eq!(
            read(&all, 50, 5000, since, None).0,
            ["r9", "r8", "r7", "r6", "r5"]
        );
        // The run dated 2020 is found past newer ones.
        let old = Window {
            since: None,
            until: at("2021-01-01T00:00:00Z"),
        };
        assert_eq!(
            read(&all, 50, 5000, old, None),
            (vec!["r3".to_string()], Value::Null)
        );
        let both = Window {
            since: at("2026-01-01T00:02:00Z"),
            until: at("2026-01-01T00:04:00Z"),
        };
        assert_eq!(read(&all, 50, 5000, both, None).0, ["r4", "r2"]);
    }

    #[test]
    fn pages_of_a_window_neither_skip_nor_repeat() {
        let all = runs(10);
        let since = Window {
            since: at("2026-01-01T00:00:00Z"),
            until: None,
        };
        let (first, next) = read(&all, 4, 5000, since, None);
        assert_eq!((first, next), (ids(&["r9", "r8", "r7", "r6"]), json!("r6")));
        let (second, next) = read(&all, 4, 5000, since, Some("r6"));
        assert_eq!(
            (second, next),
            (ids(&["r5", "r4", "r2", "r1"]), json!("r1"))
        );
        let (third, next) = read(&all, 4, 5000, since, Some("r1"));
        assert_eq!((third, next), (ids(&["r0"]), Value::Null));
    }

    #[test]
    fn a_narrow_window_reads_no_more_than_its_budget() {
        let all = runs(10);
        let old = Window {
            since: None,
            until: at("2021-01-01T00:00:00Z"),
        };
        // Three runs read: none in the window yet, a cursor to go on from.
        assert_eq!(read(&all, 50, 3, old, None), (vec![], json!("r7")));
        assert_eq!(read(&all, 50, 3, old, Some("r7")), (vec![], json!("r4")));
        assert_eq!(
            read(&all, 50, 3, old, Some("r4")),
            (ids(&["r3"]), json!("r1"))
        );
        assert_eq!(read(&all, 50, 3, old, Some("r1")), (vec![], Value::Null));
    }
}
