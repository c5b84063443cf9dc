//! How a runtime is configured ([`RuntimeConfig`], [`RetryPolicy`]) and how a
//! run is started ([`StartOptions`]).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Map, Value};

/// The shortest [`RuntimeConfig::lease_ttl`] a runtime accepts.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);

/// The runtime's bounds, and the defaults written into a new run's
/// `vars._limits` (the reference runtime's keys).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// The most node steps one `tick` (or `resume`, or `run`) executes
    /// before returning a still running run (a later tick continues).
    pub max_steps_per_tick: u64,
    /// The most node steps one run may take without waiting (counted from
    /// `vars._runtime.node_visits` and `waited_at_visit`, so it survives
    /// restarts): a flow that loops from node to node without ever waiting
    /// fails with `limit_exceeded` instead of spinning for ever, while a
    /// run that waits between its loops (an automation controller) may
    /// loop for as long as it lives.
    pub max_node_visits: u64,
    /// The most bytes a run's vars may take as JSON: a step that would call
    /// a guest with more fails the run with `state_too_large`. Default
    /// 64 MiB. (Each step can add at most the guest output limit,
    /// [`crate::SandboxLimits::max_output_bytes`], so a run cannot grow far
    /// past it.)
    pub max_state_bytes: usize,
    /// The most bytes of JSON a resume payload may take (`resume`,
    /// `respond`, an event's payload): more is refused with
    /// `invalid_input` before anything is written. Default 8 MiB.
    pub max_payload_bytes: usize,
    /// Whether consecutive steps of one run in one tick may call the same
    /// component through one instance (see [`crate::wasm::NodeSession`]):
    /// much faster, and safe for pure guests. Default true.
    pub reuse_instances: bool,
    /// The most node steps the driver gives one run per pass before it
    /// moves on to the next run, so one busy run cannot starve the others.
    pub drive_steps_per_run: u64,
    /// How long one driver pass works on one run (it stops after the step
    /// under way once this passed): with `drive_steps_per_run`, what keeps
    /// slow steps of one run from holding up every other. The time a step
    /// spends compiling components on their first use (a workflow's, a
    /// trigger source's, a tool's), or reading them from the cache, is not
    /// counted: how far a pass gets does not depend on a cold cache.
    /// Default 1 s.
    pub drive_time_per_run: Duration,
    /// The most runs each part of a driver pass takes on (due waits,
    /// finished children, running runs): a backlog is worked through in
    /// batches.
    pub drive_batch: usize,
    /// How many threads one driver pass moves due and running runs with
    /// (each run by one of them). With more than one, the steps of runs
    /// that are ready together are committed together (SQLite's group
    /// commit). Default 1; `stepwell drive` and `stepwell serve` use the
    /// machine's cores, at most 4.
    pub drive_workers: usize,
    /// How long one driver pass hands out running runs (the last part of
    /// a pass): past it, the pass ends after the runs under way, and the
    /// next begins with what fell due meanwhile, so that a backlog of
    /// running runs never holds a due timer for longer than this and one
    /// run's `drive_time_per_run`. Each pass moves at least one running
    /// run. Default 200 ms.
    pub drive_pass_time: Duration,
    /// How many effects may be in flight at once: an effect whose handler
    /// [flies](crate::effects::EffectHandler::flies) (an LLM call, a tool
    /// batch) is recorded as started and executed off its run's step, so
    /// the driver moves on at once; its outcome is committed, and the run
    /// continued, by the runtime's settling threads when it lands. Past
    /// this many, effects execute inside their steps. 0: never in flight.
    /// Default 4096.
    pub max_in_flight: usize,
    /// How many bytes the effects in flight may hold at once, as their
    /// executors report them ([`crate::core::flight::Landing::hold_bytes`]:
    /// a model call's request, a tool batch's copy of its run's vars, an
    /// outcome that landed and waits for its settling). Past it, a step
    /// whose effect would fly is held back, as past
    /// [`RuntimeConfig::max_in_flight`]; one effect always may fly. A
    /// bound on memory, where `max_in_flight` bounds a count. Default
    /// 1 GiB.
    pub max_in_flight_bytes: usize,
    /// Whether effects started by direct calls (`tick`, `run`, `resume`)
    /// fly too, or only those of the driver's passes. With it, a `run` of
    /// a flow that calls a model returns the run `running` at once, and the
    /// run goes on by itself ([`crate::Runtime::wait_in_flight`] waits for
    /// it). Default false; `stepwell serve` sets it.
    pub calls_in_flight: bool,
    /// How many threads execute the effects in flight that hold a thread
    /// while they run (a tool batch: its tool instances and commands); an
    /// effect with its own executor (`llm_call`'s asynchronous client)
    /// takes none. With every one taken, a step that would fly such an
    /// effect is held back (it waits for a thread without holding its
    /// run's state). Default 32.
    pub flight_threads: usize,
    /// How long a lease lasts unless renewed (at least 1 s). A runtime
    /// renews the leases it holds every third of this; a process that dies
    /// leaves its runs to others after at most this long (at once, to a
    /// driver on the same host that can tell the process is gone).
    pub lease_ttl: Duration,
    /// How long `resume`, `tick` and the other calls on one run wait for a
    /// run another thread or process is executing before they give up with
    /// `conflict`. The driver never waits: it moves on.
    pub lease_wait: Duration,
    /// How long a chain of runs setting one another off may get: a
    /// synchronous subworkflow runs its child inside the parent's step, and
    /// an event runs its listeners inside the emitter's; a run of the chain
    /// left to the driver (see `max_cascade_runs`) keeps its place in it.
    /// An effect that would make the chain longer fails with
    /// `limit_exceeded` (a flow that starts itself, two workflows starting
    /// each other, listeners answering an event with the same event).
    pub max_nesting: u32,
    /// How many other runs one step may execute inside itself, all nesting
    /// levels together: listeners an `emit_event` resumes, sync children a
    /// `start_subworkflow` starts (and theirs). Past it, those runs are
    /// still resumed or started, and left to the driver; a sync parent
    /// waits for its child. Bounds the work of one step when runs fan out
    /// (an event that every listener answers with the same event).
    pub max_cascade_runs: u64,
    /// How much data a run's steps may write over its life: the bytes of
    /// guest output, effect results and resume payloads together (each
    /// lands in the ledger). Past it, the run fails with `limit_exceeded`.
    /// For comparison, Temporal ends a workflow history at 50 MB.
    pub max_run_data_bytes: u64,
    /// How many child runs one run may start over its life
    /// (`start_subworkflow`, sync or async). Past it, the start fails with
    /// `limit_exceeded`. With `max_nesting`, it bounds how many runs one
    /// run can set off.
    pub max_children_per_run: u64,
    /// Effect scopes `emit_event` may use (`run`, `session`, `workflow`,
    /// `global`); an emit with another scope fails with `invalid_effect`.
    pub emit_scopes: Vec<String>,
    /// Paths no tool may reach, added to every workspace scope's host deny
    /// prefixes when a run starts (the CLI puts its store's files here:
    /// the database, its artifacts, snapshots and compiled components).
    pub tool_deny_paths: Vec<std::path::PathBuf>,
    /// `_limits.max_iterations`.
    pub max_iterations: u64,
    /// `_limits.max_tokens`.
    pub max_tokens: u64,
    /// `_limits.max_history_messages` (-1 = unlimited).
    pub max_history_messages: i64,
    /// `_limits.warn_iterations_pct`.
    pub warn_iterations_pct: u64,
    /// `_limits.warn_tokens_pct`.
    pub warn_tokens_pct: u64,
    /// Retry policies for failed effects, by effect kind. An effect without
    /// one fails its run at the first failure; a failure that says it is not
    /// retryable fails it whatever the policy. A kind left out takes the
    /// default of the plugin that adds it ([`crate::core::plugin::Install::default_retry`]:
    /// `llm_call`, three attempts, backoff 1 s, doubling, at most 30 s);
    /// `max_attempts: 1` turns retries off. Default: empty.
    pub retries: HashMap<String, RetryPolicy>,
}

/// How a failed effect is retried: the run waits (a durable time wait, reason
/// `until`, key `retry:<node>:<attempt>`) for the backoff, then executes the
/// node again with the next attempt number and the same idempotency key;
/// after `max_attempts` failures the run fails. Only failures marked
/// retryable (timeouts, transport errors, host resource limits) are retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// The wait before the second attempt.
    pub initial_backoff: Duration,
    /// Each further wait is the previous one times this (at least 1).
    pub factor: f64,
    /// No wait is longer than this.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1 for the first).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = self
            .factor
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(1_000) as i32);
        let secs =
            (self.initial_backoff.as_secs_f64() * factor).min(self.max_backoff.as_secs_f64());
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

impl RuntimeConfig {
    /// The driver workers of `stepwell drive` and `stepwell serve`
    /// ([`RuntimeConfig::drive_workers`]): one per core of this machine,
    /// at most 4.
    pub fn host_drive_workers() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_steps_per_tick: 100_000,
            max_node_visits: 100_000,
            max_state_bytes: 64 << 20,
            max_payload_bytes: 8 << 20,
            reuse_instances: true,
            drive_steps_per_run: 1_000,
            drive_time_per_run: Duration::from_secs(1),
            drive_batch: 256,
            drive_workers: 1,
            drive_pass_time: Duration::from_millis(200),
            max_in_flight: 4096,
            max_in_flight_bytes: 1 << 30,
            calls_in_flight: false,
            flight_threads: 32,
            lease_ttl: Duration::from_secs(30),
            lease_wait: Duration::from_secs(10),
            max_nesting: 16,
            max_cascade_runs: 1_000,
            max_run_data_bytes: 256 << 20,
            max_children_per_run: 10_000,
            tool_deny_paths: Vec::new(),
            emit_scopes: ["run", "session", "workflow", "global"]
                .map(String::from)
                .to_vec(),
            max_iterations: 20,
            max_tokens: 32_768,
            max_history_messages: -1,
            warn_iterations_pct: 80,
            warn_tokens_pct: 80,
            retries: HashMap::new(),
        }
    }
}

impl RuntimeConfig {
    /// The `_limits` object a new run starts with.
    pub fn limits_value(&self) -> Value {
        json!({
            "max_iterations": self.max_iterations,
            "current_iteration": 0,
            "max_tokens": self.max_tokens,
            "max_output_tokens": null,
            "max_input_tokens": null,
            "estimated_tokens_used": 0,
            "max_history_messages": self.max_history_messages,
            "warn_iterations_pct": self.warn_iterations_pct,
            "warn_tokens_pct": self.warn_tokens_pct,
        })
    }
}

/// How a run is started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    /// The run's initial vars. `_runtime` is refused here: it belongs to the
    /// host (see [`StartOptions::runtime`]).
    pub vars: Map<String, Value>,
    /// An explicit run id (`[A-Za-z0-9_-]+`): created only if free; the same
    /// identity returns the existing run, another is `identity_conflict`.
    pub run_id: Option<String>,
    /// Who starts the run.
    pub actor_id: Option<String>,
    /// The session the run belongs to.
    pub session_id: Option<String>,
    /// The parent run, for child runs.
    pub parent_run_id: Option<String>,
    /// What the host seeds `vars._runtime` with (its own bookkeeping, for
    /// example an automation controller's state). Only host code sets this:
    /// no guest, flow document or CLI argument reaches it.
    pub runtime: Map<String, Value>,
    /// The deployed version to start (`None`: see
    /// [`StartOptions::same_bundle_as`], else the latest).
    pub workflow_version: Option<u32>,
    /// A run's `(workflow id, version)` whose bundle the new run's version
    /// is taken from, if that bundle defines its workflow too: a child in
    /// its parent's bundle runs its parent's version.
    pub same_bundle_as: Option<(String, u32)>,
    /// The trace the run continues (a caller's W3C `traceparent`): its
    /// spans join that trace under that span. `None`: the trace of the
    /// span the starting thread is in, if tracing is on, else its own.
    pub trace_parent: Option<super::trace::SpanContext>,
}

/// The `_runtime` keys an operator may set when starting a run (`stepwell
/// run --runtime`): the run's tool and model policy. The host's own
/// bookkeeping keys are never accepted from outside.
pub const OPERATOR_RUNTIME_KEYS: [&str; 16] = [
    "allowed_tools",
    "tool_policy",
    "tool_executor",
    "tool_timeout_s",
    "workspace_read_only",
    "workspace_read_only_paths",
    "workspace_writable_paths",
    "provider",
    "model",
    "operator_email",
    "untrusted_input",
    "stream",
    "max_attachment_bytes",
    "max_inline_bytes",
    "disable_input_trimming",
    "max_input_tokens",
];

/// Checks an operator's `_runtime` policy for a new run: only
/// [`OPERATOR_RUNTIME_KEYS`], `stream` a boolean or null (the reference's
/// refusal text), `allowed_tools` a list.
pub fn operator_runtime(map: Map<String, Value>) -> crate::Result<Map<String, Value>> {
    for (k, v) in &map {
        if !OPERATOR_RUNTIME_KEYS.contains(&k.as_str()) {
            return Err(crate::Error::invalid(
                format!("_runtime.{k}"),
                format!(
                    "is not an operator setting (allowed: {})",
                    OPERATOR_RUNTIME_KEYS.join(", ")
                ),
            ));
        }
        if k == "stream" && !(v.is_boolean() || v.is_null()) {
            let kind = match v {
                Value::String(_) => "str",
                Value::Number(n) if n.is_f64() => "float",
                Value::Number(_) => "int",
                Value::Array(_) => "list",
                _ => "dict",
            };
            return Err(crate::Error::invalid(
                "_runtime.stream",
                format!("_runtime.stream must be a boolean (true or false), got {kind} {v}"),
            ));
        }
        if k == "allowed_tools" && !v.is_array() {
            return Err(crate::Error::invalid(
                "_runtime.allowed_tools",
                "allowed_tools must be a list when explicitly set",
            ));
        }
    }
    Ok(map)
}

/// The secret in file `path`, one line of at least 16 characters (the
/// server's token, the connections' key): created with 32 random bytes as
/// 64 hex digits, mode 0600, when missing (another process creating it
/// first wins), in a folder created `0700` when missing; refused when it is
/// a symbolic link, belongs to another user or others may read it (an
/// [`crate::Error::InvalidInput`] naming the file).
pub fn load_or_create_secret_file(path: &std::path::Path) -> crate::Result<String> {
    stepwell_store::private::load_or_create_secret_file(path)
        .map_err(|message| crate::Error::invalid(path.display().to_string(), message))
}

/// Refuses JSON text (`field`: where it came from, such as `--vars` or
/// `body`) holding an integer literal that no 64-bit integer holds: it
/// would be kept as the nearest float, changed without a word
/// (`123456789012345678901234567890` as `1.2345678901234568e29`). The
/// error names the field (`--vars.a.b[1]`) and the literal; write such a
/// number as a string, or as a float on purpose (`1.0e29`).
pub fn check_exact_integers(field: &str, text: &str) -> crate::Result<()> {
    match stepwell_flat_json::find_inexact_integer(text) {
        None => Ok(()),
        Some(found) => Err(crate::Error::invalid(
            inexact_field(field, &found.path),
            inexact_message(&found.literal),
        )),
    }
}

pub use stepwell_model::json::{inexact_field, inexact_message};
