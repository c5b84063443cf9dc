//! The reference harness's world for automation tests (its
//! `automation_harness.py`): a SQLite host with a manual clock at T0, the
//! "Memory watch" request, `at(t)` = move the clock, wake the controller,
//! drive.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use stepwell::automation::{
    apply_automation_command, create_automation, drive_until_idle, show_automation, Command,
};
use stepwell::{ManualClock, RunQuery, RunState, Runtime};

use crate::{repo, Backend, Host};

/// The harness's start time.
pub const T0: &str = "2026-01-01T00:00:00+00:00";

/// `t` (RFC 3339) as a time.
pub fn at_time(t: &str) -> DateTime<Utc> {
    t.parse().unwrap()
}

/// The reference harness's world: a store, a clock at T0.
pub struct World {
    /// The host (SQLite).
    pub h: Host,
    /// Its clock.
    pub clock: Arc<ManualClock>,
}

/// An hourly schedule from 00:00Z.
pub fn hourly() -> Value {
    json!({"source_id": "schedule", "source_version": 1,
           "config": {"start_at": "2026-01-01T00:00:00Z", "every": "1h"}})
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl World {
    /// A SQLite host with its clock at T0.
    pub fn new() -> World {
        World::on(Backend::Sqlite)
    }

    /// A host on `backend` with its clock at T0.
    pub fn on(backend: Backend) -> World {
        let clock = Arc::new(ManualClock::new(at_time(T0)));
        World {
            h: Host::with_clock(backend, clock.clone()),
            clock,
        }
    }

    /// The runtime.
    pub fn rt(&self) -> &Runtime {
        &self.h.rt
    }

    /// The harness's `request(**kwargs)`: title "Memory watch", a 2m grid
    /// from T0, target `echo` with prompt "check memory".
    pub fn request(&self, overrides: Value) -> Value {
        let workflow = overrides["workflow_id"]
            .as_str()
            .unwrap_or("echo")
            .to_string();
        let dir = repo()
            .join("flows/automations")
            .join(&workflow)
            .canonicalize()
            .unwrap();
        let input = overrides
            .get("input_data")
            .cloned()
            .unwrap_or(json!({"prompt": "check memory"}));
        let mut r = json!({
            "request_id": overrides["request_id"].as_str().unwrap_or("memory-watch"),
            "title": "Memory watch",
            "target": {"workflow_id": workflow, "bundle_ref": dir.display().to_string(),
                       "flow_id": workflow, "input_data": input},
            "trigger": overrides.get("trigger").cloned().unwrap_or(
                json!({"source_id": "schedule", "source_version": 1,
                       "config": {"start_at": T0, "every": "2m"}})),
            "workspace_root": "/tmp/automation-ws",
        });
        for key in ["policy", "context", "workspace_root"] {
            if let Some(v) = overrides.get(key) {
                r[key] = v.clone();
            }
        }
        r
    }

    /// Creates the automation of `request(overrides)`; its id.
    pub fn create(&self, overrides: Value) -> String {
        let req = self.request(overrides);
        create_automation(self.rt(), &req, self.clock.now_utc(), None)
            .unwrap()
            .automation_id
    }

    /// Drives until idle (no errors); the controller `id` after.
    pub fn drive(&self, id: &str) -> RunState {
        let report = drive_until_idle(self.rt(), 200).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        self.rt().get_state(id).unwrap()
    }

    /// Moves the clock, wakes the controller if it is parked on its wake
    /// wait (due or not: a stale wake must admit nothing), drives.
    pub fn at(&self, id: &str, t: &str) -> RunState {
        self.clock.set(at_time(t));
        let run = self.rt().get_state(id).unwrap();
        if let Some(w) = run
            .waiting
            .as_ref()
            .filter(|w| w.wait_key.ends_with(":wake"))
        {
            let key = w.wait_key.clone();
            self.rt()
                .resume(id, &key, json!({"timed_out": true}))
                .unwrap();
        }
        self.drive(id)
    }

    /// Applies command `kind` at `now`.
    pub fn cmd(&self, id: &str, command_id: &str, kind: &str, now: &str) -> Value {
        self.cmd_with(id, command_id, kind, now, None, None)
    }

    /// Applies command `kind` at `now` with a payload and an expected revision.
    pub fn cmd_with(
        &self,
        id: &str,
        command_id: &str,
        kind: &str,
        now: &str,
        payload: Option<Value>,
        expected_revision: Option<i64>,
    ) -> Value {
        apply_automation_command(
            self.rt(),
            &Command {
                automation_id: id,
                command_id,
                command_type: kind,
                payload: payload.as_ref(),
                actor: None,
                expected_revision,
            },
            at_time(now),
        )
        .unwrap()
    }

    /// The controller's `_runtime.automation`.
    pub fn state(&self, id: &str) -> Value {
        self.rt().get_state(id).unwrap().vars["_runtime"]["automation"].clone()
    }

    /// `show_automation` now.
    pub fn show(&self, id: &str) -> Value {
        show_automation(self.rt(), id, self.clock.now_utc()).unwrap()
    }

    /// Payloads of the automation records named `name`, in ledger order.
    pub fn records(&self, id: &str, name: &str) -> Vec<Value> {
        self.rt()
            .get_ledger(id)
            .unwrap()
            .iter()
            .filter_map(|r| r.effect.as_ref())
            .filter(|e| e.kind == "emit_event" && e.payload["name"] == name)
            .map(|e| e.payload["payload"].clone())
            .collect()
    }

    /// The controller's children, oldest first.
    pub fn children(&self, id: &str) -> Vec<RunState> {
        let mut c = self
            .rt()
            .list_runs(&RunQuery {
                parent_run_id: Some(id.to_string()),
                ..Default::default()
            })
            .unwrap();
        c.sort_by(|a, b| (&a.created_at, &a.run_id).cmp(&(&b.created_at, &b.run_id)));
        c
    }

    /// Answers `child`'s wait on a person with `{"text": text}`.
    pub fn answer(&self, child: &RunState, text: &str) {
        let key = child.waiting.as_ref().unwrap().wait_key.clone();
        self.rt()
            .resume(&child.run_id, &key, json!({"text": text}))
            .unwrap();
    }
}

pub trait NowUtc {
    /// The clock's time.
    fn now_utc(&self) -> DateTime<Utc>;
}

impl NowUtc for ManualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        stepwell::Clock::now(self)
    }
}
