//! Idempotency keys of ledger records, and the host's bookkeeping in a run's
//! `vars._runtime`.
//!
//! - an effect's key is `<run>:<effect_seq>` (the same for every attempt of
//!   that effect, and on replay after a crash);
//! - the record that ends a run without an effect is `<run>:terminal`;
//! - the record that ends a wait is `<effect key>:resumed:<payload digest>`
//!   (`:due:` when it came due), or `resumed-by:<cause>` when another run's
//!   effect (an event) resumed it, so that effect can tell it already did;
//! - `<run>` is the run id, plus `~<n>` once a snapshot was restored `n`
//!   times (a restored run repeats effect numbers).

use serde_json::{json, Map, Value};

use super::model::RunState;

/// Vars the host owns: no guest patch, result key, resume payload or child
/// vars may write them. `_runtime` holds the host's bookkeeping, `_meta` a
/// run's identity and attribution, `_limits` its budgets.
pub const HOST_OWNED_VARS: [&str; 3] = ["_runtime", "_meta", "_limits"];

/// A run's vars without the host-owned ones (a copy): what a guest wrote
/// and the run started with, as the ledger keeps them for forks.
pub fn user_vars(vars: &Map<String, Value>) -> Map<String, Value> {
    vars.iter()
        .filter(|(k, _)| !is_host_owned(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether the var (or dotted path) `key` is host-owned: its first segment
/// is one of [`HOST_OWNED_VARS`], or it starts with `_runtime`.
pub fn is_host_owned(key: &str) -> bool {
    // Every host-owned name starts with `_` (checked for every key of
    // every patch: most keys stop here).
    if !key.starts_with('_') {
        return false;
    }
    let first = key.split('.').next().unwrap_or(key);
    HOST_OWNED_VARS.contains(&first) || key.starts_with("_runtime")
}

/// A fresh, random record id (a UUID v4, hyphenated).
pub(crate) fn new_step_id() -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_string()
}

/// The key prefix of a run's records (see the module docs).
pub(crate) fn key_prefix(run: &RunState) -> String {
    match run
        .vars
        .get("_runtime")
        .and_then(|r| r.get("restores"))
        .and_then(Value::as_u64)
    {
        Some(n) if n > 0 => format!("{}~{n}", run.run_id),
        _ => run.run_id.clone(),
    }
}

/// The idempotency key of effect `seq` of `run`.
pub fn effect_idempotency_key(run: &RunState, seq: u64) -> String {
    format!("{}:{seq}", key_prefix(run))
}

/// The idempotency key of the run's latest effect.
pub(crate) fn effect_key(run: &RunState) -> Option<String> {
    let seq = run.vars.get("_runtime")?.get("effect_seq")?.as_u64()?;
    Some(effect_idempotency_key(run, seq))
}

/// The idempotency key of the record that ends a run without an effect
/// (completed, failed or cancelled): a run ends once.
pub(crate) fn terminal_key(run: &RunState) -> String {
    format!("{}:terminal", key_prefix(run))
}

/// The idempotency key of the resume that effect `cause` (of another run)
/// delivered.
pub fn caused_resume_key(cause: &str) -> String {
    format!("resumed-by:{cause}")
}

/// The run's `vars._runtime` object (created, or replaced if it is not an
/// object).
pub(crate) fn runtime_vars(run: &mut RunState) -> &mut Map<String, Value> {
    if !run.vars.get("_runtime").is_some_and(Value::is_object) {
        run.vars
            .insert("_runtime".into(), Value::Object(Map::new()));
    }
    run.vars
        .get_mut("_runtime")
        .and_then(Value::as_object_mut)
        .expect("made an object above")
}

/// Sets the counter `key` of `map` to `n` (in place when it exists: no
/// allocation on the hot path).
fn set_counter(map: &mut Map<String, Value>, key: &str, n: u64) {
    match map.get_mut(key) {
        Some(v) => *v = Value::from(n),
        None => {
            map.insert(key.to_string(), Value::from(n));
        }
    }
}

fn runtime_u64(run: &RunState, key: &str) -> Option<u64> {
    run.vars.get("_runtime")?.get(key)?.as_u64()
}

/// Counter `total` of `vars._runtime` less counter `mark` (0 when either is
/// missing or the mark is ahead): one lookup of `_runtime` for both.
fn runtime_since(run: &RunState, total: &str, mark: &str) -> u64 {
    let Some(rt) = run.vars.get("_runtime") else {
        return 0;
    };
    let read = |key| rt.get(key).and_then(Value::as_u64).unwrap_or(0);
    read(total).saturating_sub(read(mark))
}

/// Adds `n` to counter `key` of `vars._runtime` (saturating) and returns
/// the total; in place when it exists as a number (every step counts, and
/// this takes two lookups rather than four).
fn bump_counter(run: &mut RunState, key: &str, n: u64) -> u64 {
    if let Some(Value::Object(rt)) = run.vars.get_mut("_runtime") {
        if let Some(v) = rt.get_mut(key) {
            if let Some(old) = v.as_u64() {
                let total = old.saturating_add(n);
                *v = Value::from(total);
                return total;
            }
        }
    }
    let map = runtime_vars(run);
    let total = map
        .get(key)
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .saturating_add(n);
    set_counter(map, key, total);
    total
}

/// The counters of `vars._runtime` a node step reads, taken in one pass
/// over it (each separate lookup costs a search of the vars and one of
/// `_runtime`, and a step made half a dozen).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepCounters {
    /// `node_visits`: node steps taken so far.
    pub node_visits: u64,
    /// `waited_at_visit`: `node_visits` when the run last waited.
    pub waited_at_visit: u64,
    /// `data_bytes`: bytes of data the run's steps wrote.
    pub data_bytes: u64,
    /// `data_at_wait`: `data_bytes` when the run last waited.
    pub data_at_wait: u64,
    /// The attempt number (`attempt`; 1 when absent).
    pub attempt: u32,
    /// Whether `attempt` or `retry_seq` is set (a retry is under way).
    pub retrying: bool,
}

impl StepCounters {
    /// The counters of `run`, as [`node_visits`], [`visits_since_wait`],
    /// [`data_bytes`], [`data_since_wait`] and [`current_attempt`] read
    /// them one at a time.
    pub(crate) fn read(run: &RunState) -> StepCounters {
        let mut c = StepCounters {
            node_visits: 0,
            waited_at_visit: 0,
            data_bytes: 0,
            data_at_wait: 0,
            attempt: 1,
            retrying: false,
        };
        let Some(Value::Object(rt)) = run.vars.get("_runtime") else {
            return c;
        };
        for (key, v) in rt {
            let n = v.as_u64();
            match key.as_str() {
                "node_visits" => c.node_visits = n.unwrap_or(0),
                "waited_at_visit" => c.waited_at_visit = n.unwrap_or(0),
                "data_bytes" => c.data_bytes = n.unwrap_or(0),
                "data_at_wait" => c.data_at_wait = n.unwrap_or(0),
                "attempt" => {
                    c.retrying = true;
                    c.attempt = n.map_or(1, |a| a.clamp(1, u32::MAX as u64) as u32);
                }
                "retry_seq" => c.retrying = true,
                _ => {}
            }
        }
        c
    }

    /// Node steps since the run last waited ([`visits_since_wait`]).
    pub(crate) fn visits_since_wait(&self) -> u64 {
        self.node_visits.saturating_sub(self.waited_at_visit)
    }

    /// The data the run's budget counts, given its total `data_bytes`: all
    /// of it, or (`per_wait`) what was written since it last waited.
    pub(crate) fn data_spent(&self, data_bytes: u64, per_wait: bool) -> u64 {
        if per_wait {
            data_bytes.saturating_sub(self.data_at_wait)
        } else {
            data_bytes
        }
    }
}

/// The attempt number of the run's current node (`vars._runtime.attempt`).
pub(crate) fn current_attempt(run: &RunState) -> u32 {
    runtime_u64(run, "attempt").map_or(1, |a| a.clamp(1, u32::MAX as u64) as u32)
}

/// Sets the attempt number (1 removes it, and the retried effect's number:
/// the first attempt is the default).
pub(crate) fn set_attempt(run: &mut RunState, attempt: u32) {
    if attempt <= 1 {
        if let Some(rt) = run.vars.get_mut("_runtime").and_then(Value::as_object_mut) {
            rt.remove("attempt");
            rt.remove("retry_seq");
        }
        return;
    }
    runtime_vars(run).insert("attempt".into(), json!(attempt));
}

/// The sequence number of the run's next effect: the retried effect's
/// number while a retry is under way (every attempt of an effect keeps its
/// idempotency key), else one more than the last.
pub(crate) fn next_effect_seq(run: &mut RunState) -> u64 {
    if let Some(seq) = runtime_u64(run, "retry_seq") {
        return seq;
    }
    let map = runtime_vars(run);
    let seq = map.get("effect_seq").and_then(Value::as_u64).unwrap_or(0) + 1;
    set_counter(map, "effect_seq", seq);
    seq
}

/// Remembers `seq` as the effect the next attempt retries.
pub(crate) fn set_retry_seq(run: &mut RunState, seq: u64) {
    runtime_vars(run).insert("retry_seq".into(), json!(seq));
}

/// How many node steps the run has taken (`vars._runtime.node_visits`).
pub(crate) fn node_visits(run: &RunState) -> u64 {
    runtime_u64(run, "node_visits").unwrap_or(0)
}

/// How many node steps the run has taken since it last waited (all of
/// them if it never did): what `RuntimeConfig::max_node_visits` bounds.
pub(crate) fn visits_since_wait(run: &RunState) -> u64 {
    runtime_since(run, "node_visits", "waited_at_visit")
}

/// Notes that the run waits now (`vars._runtime.waited_at_visit`): a run
/// that waits between its loops (an automation controller) never reaches
/// the visit limit.
pub(crate) fn mark_wait(run: &mut RunState) {
    let n = node_visits(run);
    let bytes = data_bytes(run);
    let map = runtime_vars(run);
    set_counter(map, "waited_at_visit", n);
    set_counter(map, "data_at_wait", bytes);
}

/// The bytes of data the run wrote since it last waited: the budget of a
/// workflow whose steps never fail it (the automation controller, which
/// lives for as long as its automation).
pub(crate) fn data_since_wait(run: &RunState) -> u64 {
    runtime_since(run, "data_bytes", "data_at_wait")
}

/// Counts one more node step.
pub(crate) fn count_visit(run: &mut RunState) -> u64 {
    bump_counter(run, "node_visits", 1)
}

pub use stepwell_model::json::{json_depth, too_deep, MAX_JSON_DEPTH};

/// How many dotted parts a `result_key` may have, and how long it may be.
pub const MAX_RESULT_KEY_PARTS: usize = 16;
const MAX_RESULT_KEY_BYTES: usize = 256;

/// Why `key` is not a usable `result_key` (a dotted path into the vars), if
/// it is not.
pub fn bad_result_key(key: &str) -> Option<String> {
    let parts = key.split('.').count();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        Some(format!("{key:?} has an empty part"))
    } else if key.len() > MAX_RESULT_KEY_BYTES {
        Some(format!(
            "is {} bytes long (the limit is {MAX_RESULT_KEY_BYTES})",
            key.len()
        ))
    } else if parts > MAX_RESULT_KEY_PARTS {
        Some(format!(
            "has {parts} dotted parts (the limit is {MAX_RESULT_KEY_PARTS})"
        ))
    } else if is_host_owned(key) {
        Some(format!("{key:?} is owned by the host"))
    } else {
        None
    }
}

/// Bytes of data the run's steps wrote so far (guest output, effect
/// results, resume payloads): `vars._runtime.data_bytes`.
pub(crate) fn data_bytes(run: &RunState) -> u64 {
    runtime_u64(run, "data_bytes").unwrap_or(0)
}

/// Counts `n` more bytes of data written by the run; returns the total.
pub(crate) fn count_data(run: &mut RunState, n: u64) -> u64 {
    bump_counter(run, "data_bytes", n)
}

/// The key of `vars._runtime` that says how many parents a run has above
/// it (set when a child is started; 0 for a run started from outside).
pub const LINEAGE: &str = "lineage";

/// How many parents the run has above it.
pub(crate) fn lineage(run: &RunState) -> u32 {
    runtime_u64(run, LINEAGE).map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// How many child runs the run has started.
pub(crate) fn children_started(run: &RunState) -> u64 {
    runtime_u64(run, "children_started").unwrap_or(0)
}

/// Counts one more child run started.
pub(crate) fn count_child(run: &mut RunState) {
    bump_counter(run, "children_started", 1);
}

/// The key of `vars._runtime` that carries how deep in a chain of runs set
/// off by one another a run was resumed or started, when it was left to
/// the driver rather than executed inline (see
/// [`crate::RuntimeConfig::max_cascade_runs`]).
pub const CASCADE_DEPTH: &str = "cascade_depth";

/// Notes that the run was resumed or started `depth` levels deep in a
/// chain and left to the driver.
pub(crate) fn set_cascade_depth(run: &mut RunState, depth: u32) {
    set_counter(runtime_vars(run), CASCADE_DEPTH, u64::from(depth));
}

/// Takes the depth [`set_cascade_depth`] noted, if any (the commit that
/// follows forgets it: only the steps up to the run's next wait continue
/// that chain).
pub(crate) fn take_cascade_depth(run: &mut RunState) -> Option<u32> {
    let d = runtime_u64(run, CASCADE_DEPTH)?;
    runtime_vars(run).remove(CASCADE_DEPTH);
    Some(u32::try_from(d).unwrap_or(u32::MAX))
}

/// The first identity field on which two runs with one id differ: their
/// workflow, session, parent, the `vars._meta` sections the plugins name
/// (`meta`), and the creation digest.
pub(crate) fn identity_mismatch<'k>(
    existing: &RunState,
    requested: &RunState,
    mut meta_keys: impl Iterator<Item = &'k &'static str>,
) -> Option<String> {
    let meta = |r: &RunState, key: &str| r.vars.get("_meta").and_then(|m| m.get(key)).cloned();
    if existing.workflow_id != requested.workflow_id {
        Some("workflow_id".into())
    } else if existing.session_id != requested.session_id {
        Some("session_id".into())
    } else if existing.parent_run_id != requested.parent_run_id {
        Some("parent_run_id".into())
    } else if let Some(key) = meta_keys.find(|k| meta(existing, k) != meta(requested, k)) {
        Some(format!("vars._meta.{key}"))
    } else if meta(existing, "creation_digest").is_some()
        && meta(existing, "creation_digest") != meta(requested, "creation_digest")
    {
        // A run stored before creation digests were kept has none: its
        // identity is the fields above.
        Some("vars._meta.creation_digest".into())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_with(runtime: Option<Value>) -> RunState {
        let mut vars = Map::new();
        vars.insert("i".into(), json!(3));
        if let Some(rt) = runtime {
            vars.insert("_runtime".into(), rt);
        }
        serde_json::from_value(json!({
            "version": 1, "run_id": "r", "workflow_id": "w", "status": "running",
            "current_node": "n", "vars": vars, "waiting": null, "output": null,
            "error": null, "created_at": "t", "updated_at": "t",
        }))
        .unwrap()
    }

    /// The one-pass read gives what the one-at-a-time readers give, for
    /// every shape `_runtime` may take.
    #[test]
    fn step_counters_read_what_the_single_readers_read() {
        for rt in [
            None,
            Some(json!("not an object")),
            Some(json!({})),
            Some(
                json!({"node_visits": 7, "waited_at_visit": 2, "data_bytes": 900, "data_at_wait": 100}),
            ),
            Some(
                json!({"node_visits": 2, "waited_at_visit": 5, "data_bytes": 1, "data_at_wait": 9}),
            ),
            Some(json!({"node_visits": "7", "data_bytes": -1, "attempt": 3, "retry_seq": 4})),
            Some(json!({"attempt": "x", "effect_seq": 2})),
            Some(json!({"attempt": 0})),
            Some(json!({"attempt": 1u64 << 40})),
            Some(json!({"retry_seq": 1, "node_visits": 1})),
        ] {
            let run = run_with(rt.clone());
            let c = StepCounters::read(&run);
            assert_eq!(c.node_visits, node_visits(&run), "{rt:?}");
            assert_eq!(c.visits_since_wait(), visits_since_wait(&run), "{rt:?}");
            assert_eq!(c.data_bytes, data_bytes(&run), "{rt:?}");
            assert_eq!(
                c.data_spent(c.data_bytes, false),
                data_bytes(&run),
                "{rt:?}"
            );
            assert_eq!(
                c.data_spent(c.data_bytes, true),
                data_since_wait(&run),
                "{rt:?}"
            );
            assert_eq!(c.attempt, current_attempt(&run), "{rt:?}");
            // `retrying` says whether set_attempt(run, 1) has anything to
            // remove.
            let mut cleared = run.clone();
            set_attempt(&mut cleared, 1);
            assert_eq!(c.retrying, cleared != run, "{rt:?}");
        }
    }

    #[test]
    fn counters_are_bumped_in_place_or_created() {
        let mut run = run_with(Some(json!({"node_visits": 4})));
        assert_eq!(count_visit(&mut run), 5);
        assert_eq!(count_data(&mut run, 10), 10);
        assert_eq!(count_data(&mut run, u64::MAX), u64::MAX);
        let mut run = run_with(Some(json!({"node_visits": "x"})));
        assert_eq!(count_visit(&mut run), 1);
        let mut run = run_with(Some(json!([1])));
        assert_eq!(count_visit(&mut run), 1);
        assert_eq!(run.vars["_runtime"], json!({"node_visits": 1}));
        let mut run = run_with(None);
        count_child(&mut run);
        count_child(&mut run);
        assert_eq!(children_started(&run), 2);
    }

    #[test]
    fn host_owned_vars_are_recognised_by_their_first_segment() {
        for key in [
            "_runtime",
            "_runtime.x",
            "_runtimes",
            "_meta",
            "_meta.occurrence",
            "_limits.max_tokens",
        ] {
            assert!(is_host_owned(key), "{key}");
        }
        for key in ["meta", "runtime", "x._meta", "_metadata", "limits"] {
            assert!(!is_host_owned(key), "{key}");
        }
        // The check starts with a key's `_`: every name must have one.
        for key in HOST_OWNED_VARS {
            assert!(is_host_owned(key), "{key}");
        }
    }
}
