//! What each node of the controller decides.
//!
//! A node sees the controller's vars ([`Controller`]): the definition
//! (`_meta.automation`), the state (`_runtime.automation`), the step's
//! `now`, and the answer of the host effect it asked for on its previous
//! visit ([`crate::protocol::FACTS_KEY`]). It answers with a [`Step`]: a
//! route, a question to the host (after which it runs again), a commit of
//! decisions, the wake wait, or the start of the occurrence's run.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use sha2::Digest as _;

use crate::admission::{
    admitted_envelope, build_prepared, history_ask, occurrence_session_kind, Admitting,
};
use crate::definition::stored_trigger_state;
use crate::ids::{occurrence_run_id, OccurrenceKind};
use crate::occurrence::{
    definition_ends, plan_dispatch, plan_outcome, plan_wait_locally, wait_after_prepare, WaitPlan,
};
use crate::outcome::{complete_occurrence, ChildView};
use crate::protocol::{
    AdmissionFacts, Basis, Commit, Entry, Facts, HistoryAsk, Observed, Park, Planned,
    TriggerAnswer, TriggerCall,
};
use crate::time::{format_timestamp, parse_timestamp};
use crate::{into_map, set, AutomationError};

/// What a node does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Follow this route of the node, changing nothing.
    Route(&'static str),
    /// Ask the host to call the trigger source; the node runs `again` with
    /// the answer.
    AskTrigger(TriggerCall),
    /// Ask the host for the attempt's run; the node runs `again` with it.
    ReadOccurrence(String),
    /// Commit these records (and notes), park if it says so, then follow
    /// the route.
    Commit(Commit, &'static str),
    /// Start the dispatched attempt's run (if absent) and wait for it.
    StartOccurrence(String),
}

/// What a node sees of the controller run.
#[derive(Debug, Clone, Copy)]
pub struct Controller<'a> {
    /// The automation's id (the controller run's id).
    pub id: &'a str,
    /// `_meta.automation`.
    pub definition: &'a Value,
    /// `_runtime.automation`.
    pub state: &'a Value,
    /// `_meta.automation_owner`, when the creator named one.
    pub owner: Option<&'a str>,
    /// The step's time.
    pub now: DateTime<Utc>,
    /// The answer of the host effect asked for on the previous visit
    /// ([`crate::protocol::Facts`]).
    pub facts: Option<&'a Value>,
    /// What the dispatch's wait wrote when the attempt's run ended.
    pub dispatch: Option<&'a Value>,
}

fn pending(state: &Value) -> Option<&Value> {
    state.get("pending_occurrence").filter(|p| p.is_object())
}

fn commit(entries: Vec<Entry>, route: &'static str) -> Step {
    Step::Commit(
        Commit {
            entries,
            ..Commit::default()
        },
        route,
    )
}

/// An answer the node may decide from, and the time it decides as of.
struct Answer<T> {
    answer: T,
    now: DateTime<Utc>,
    at: String,
}

/// What `admit` admits: a run-now or the trigger's admission.
struct Admission<'c> {
    /// The admitted envelope.
    envelope: Value,
    /// The occurrence's first run.
    first_run_id: String,
    /// The run-now command it answers.
    command_id: Option<&'c str>,
    /// When the trigger answered.
    at: String,
    /// What the trigger read with the admission (the history).
    context: Option<AdmissionFacts>,
    /// An event source's named inputs.
    inputs: Option<Value>,
    /// The trigger's state after the admission.
    trigger_update: Map<String, Value>,
    /// What the source folded (missed ticks), if anything.
    coalesced: Option<Map<String, Value>>,
}

impl Controller<'_> {
    /// The answer of the previous visit, if it is a `T` asked on the state
    /// and revision the node sees now (a command in between moved the
    /// state version: the node asks again).
    fn answer<T: serde::de::DeserializeOwned>(&self) -> Option<Answer<T>> {
        let facts: Facts = serde_json::from_value(self.facts?.clone()).ok()?;
        let now = parse_timestamp(&facts.basis.asked_at, "asked_at").ok()?;
        let at = format_timestamp(now);
        if facts.basis != Basis::of(self.definition, self.state, &facts.basis.asked_at) {
            return None;
        }
        let answer = serde_json::from_value(facts.answer).ok()?;
        Some(Answer { answer, now, at })
    }

    fn trigger_answer(&self) -> Option<Answer<TriggerAnswer>> {
        self.answer()
    }

    /// `read_definition`: `end` when nothing is pending and the automation
    /// is archived or its trigger exhausted; else `continue`.
    pub fn read_definition(&self) -> Step {
        if definition_ends(self.definition, self.state) {
            Step::Route("end")
        } else {
            Step::Route("continue")
        }
    }

    /// `wait`: [`plan_wait_locally`], else the trigger's `prepare`
    /// ([`wait_after_prepare`]): `go` on to `admit`, park on the wake wait,
    /// or `end` (noting a source that ran out as exhausted).
    pub fn wait(&self) -> Step {
        let (plan, at) = match plan_wait_locally(self.definition, self.state, self.now) {
            Some(plan) => (plan, None),
            None => match self.trigger_answer() {
                Some(Answer {
                    answer: TriggerAnswer::Prepare { wait },
                    now,
                    at,
                }) => (wait_after_prepare(&wait, now), Some(at)),
                _ => return Step::AskTrigger(TriggerCall::Prepare),
            },
        };
        match plan {
            WaitPlan::Go => Step::Route("go"),
            WaitPlan::Park(until) => Step::Commit(
                Commit {
                    at,
                    park: Some(Park { until }),
                    ..Commit::default()
                },
                "go",
            ),
            WaitPlan::End => {
                // A source that keeps no `exhausted` of its own (a plugin)
                // has it noted once it says it will never fire again.
                let nothing_pending = self.state["pending_occurrence"].is_null()
                    && self.state["manual_pending"].is_null();
                let archived = !self.definition["archived_at"].is_null();
                if nothing_pending && !archived && self.state["exhausted"] != Value::Bool(true) {
                    Step::Commit(
                        Commit {
                            at,
                            note_exhausted: true,
                            ..Commit::default()
                        },
                        "end",
                    )
                } else {
                    Step::Route("end")
                }
            }
        }
    }

    /// `admit`: a pending occurrence is cancelled (a stop asked before its
    /// dispatch), left to its backoff (`rearm`) or dispatched; else a
    /// queued run-now (through `manual@1`) or the trigger's admission is
    /// admitted (`automation.admitted`, with `automation.coalesced` when
    /// the source folded missed ticks) and goes on to `prepare`; paused,
    /// archived or nothing due goes back (`rearm`).
    pub fn admit(&self) -> Result<Step, AutomationError> {
        let (definition, state) = (self.definition, self.state);
        let at = format_timestamp(self.now);
        if let Some(pending) = pending(state) {
            return Ok(self.admit_pending(pending, &at));
        }
        let index = state["next_index"].as_u64().filter(|i| *i > 0).unwrap_or(1);
        let revision = definition["revision"].as_u64().unwrap_or(1);
        let manual = state
            .get("manual_pending")
            .and_then(|m| m.get("command_id"))
            .and_then(Value::as_str);
        let admission = match manual {
            Some(command_id) => self.admit_manual(command_id, at),
            None => self.admit_scheduled(revision, index),
        };
        match admission {
            Ok(admission) => self.admitted(admission, index, revision),
            Err(step) => Ok(step),
        }
    }

    /// `admit` with an occurrence pending: cancelled (a stop asked before
    /// its dispatch), left to its backoff (`rearm`) or dispatched.
    fn admit_pending(&self, pending: &Value, at: &str) -> Step {
        let phase = pending.get("phase").and_then(Value::as_str);
        if set(pending.get("stop_requested")) && phase != Some("dispatched") {
            let c = complete_occurrence(self.definition, self.state, "cancelled", None, at);
            let index = pending["index"].as_u64().unwrap_or(0);
            let decision = Planned {
                name: "automation.completed".into(),
                discriminator: index.to_string(),
                fields: into_map(c.fields),
                delta: json!({"state": c.state}),
            };
            return commit(vec![Entry::Decision(decision)], "rearm");
        }
        let due = pending
            .get("retry_at")
            .and_then(Value::as_str)
            .and_then(|t| parse_timestamp(t, "retry_at").ok())
            .is_none_or(|t| t <= self.now);
        if phase == Some("backoff") && !due {
            return Step::Route("rearm");
        }
        Step::Route("dispatch")
    }

    /// Whether an admission `context` holds what the automation asks with
    /// it (a growing automation reads its history with the admission; an
    /// answer without it, asked before, is asked again).
    fn complete(history: &Option<HistoryAsk>, context: &Option<AdmissionFacts>) -> bool {
        history.is_none() || context.as_ref().is_some_and(|c| c.history.is_some())
    }

    /// The queued run-now `command_id` (through `manual@1`), or the step
    /// that asks the trigger for it first.
    fn admit_manual<'c>(&self, command_id: &'c str, now_at: String) -> Result<Admission<'c>, Step> {
        let history = history_ask(self.id, self.definition);
        let event_id = format!("manual:{command_id}");
        let answer = self.trigger_answer().and_then(|a| match a.answer {
            TriggerAnswer::Manual { envelope, context }
                if envelope["event_id"] == event_id && Self::complete(&history, &context) =>
            {
                Some((envelope, a.at, context))
            }
            _ => None,
        });
        let Some((envelope, at, context)) = answer else {
            return Err(Step::AskTrigger(TriggerCall::Manual {
                command_id: command_id.to_string(),
                fired_at: now_at,
                history,
            }));
        };
        Ok(Admission {
            envelope: admitted_envelope(&envelope, false),
            first_run_id: occurrence_run_id(self.id, OccurrenceKind::Manual { command_id }, 1),
            command_id: Some(command_id),
            at,
            context,
            inputs: None,
            trigger_update: Map::new(),
            coalesced: None,
        })
    }

    /// What the trigger admits, or the step to take instead: back to
    /// `rearm` when paused, archived or nothing is due (committing a cursor
    /// the source moved past events it passed over), or asking the trigger.
    fn admit_scheduled(&self, revision: u64, index: u64) -> Result<Admission<'static>, Step> {
        let (definition, state) = (self.definition, self.state);
        if set(state.get("paused")) || set(definition.get("archived_at")) {
            return Err(Step::Route("rearm"));
        }
        let history = history_ask(self.id, definition);
        let Some(Answer {
            answer:
                TriggerAnswer::Admit {
                    state: source_state,
                    admitted,
                    context,
                },
            at,
            ..
        }) = self.trigger_answer().filter(|a| match &a.answer {
            TriggerAnswer::Admit {
                admitted: Some(_),
                context,
                ..
            } => Self::complete(&history, context),
            _ => true,
        })
        else {
            return Err(Step::AskTrigger(TriggerCall::Admit { history }));
        };
        let Some(admitted) = admitted else {
            return Err(self.passed_over(&source_state));
        };
        Ok(Admission {
            envelope: admitted_envelope(&admitted.envelope, admitted.untrusted),
            first_run_id: occurrence_run_id(
                self.id,
                OccurrenceKind::Scheduled { revision, index },
                1,
            ),
            command_id: None,
            at,
            context,
            inputs: admitted.inputs,
            trigger_update: stored_trigger_state(&source_state),
            coalesced: admitted
                .payload
                .get("coalesced")
                .and_then(Value::as_object)
                .cloned(),
        })
    }

    /// Nothing to admit: a stale wake (`rearm`), or events the source passed
    /// over, whose cursor it moved (committed, so that they are not
    /// examined again).
    fn passed_over(&self, source_state: &Value) -> Step {
        let moved = stored_trigger_state(source_state);
        let own = |s: Option<&Value>| s.filter(|v| !v.is_null()).cloned();
        if own(moved.get("source_state")) == own(self.state.get("source_state")) {
            return Step::Route("rearm");
        }
        let digest = hex::encode(sha2::Sha256::digest(
            Value::Object(moved.clone()).to_string().as_bytes(),
        ));
        commit(
            vec![Entry::Decision(Planned {
                name: "automation.passed_over".into(),
                discriminator: digest[..32].to_string(),
                fields: into_map(json!({"source_state": moved.get("source_state")})),
                delta: json!({"state": moved}),
            })],
            "rearm",
        )
    }

    /// The admission's records (`automation.coalesced` when the source
    /// folded missed ticks, `automation.admitted`), going on to `prepare`.
    fn admitted(
        &self,
        admission: Admission<'_>,
        index: u64,
        revision: u64,
    ) -> Result<Step, AutomationError> {
        let definition = self.definition;
        let Admission {
            envelope,
            first_run_id,
            command_id,
            at,
            context,
            inputs,
            trigger_update,
            coalesced,
        } = admission;
        let prepared = build_prepared(
            self.id,
            definition,
            self.owner,
            &Admitting {
                index,
                envelope: &envelope,
                first_run_id: &first_run_id,
                inputs: inputs.as_ref(),
            },
            &context.unwrap_or_default(),
        )?;
        let event_id = envelope["event_id"].clone();
        let pending = json!({
            "run_id": first_run_id,
            "index": index,
            "attempt": 1,
            "event_id": event_id,
            "revision": revision,
            "envelope": envelope,
            "phase": "admitted",
            "command_id": command_id,
            "prepared": prepared,
            "retry": definition["policy"]["retry"],
            "session_kind": occurrence_session_kind(definition, self.id),
            "stop_requested": false,
        });
        let mut entries = Vec::new();
        if let Some(mut fields) = coalesced {
            fields.insert("event_id".into(), event_id.clone());
            entries.push(Entry::Observation(Observed {
                name: "automation.coalesced".into(),
                discriminator: event_id.as_str().unwrap_or_default().to_string(),
                fields,
            }));
        }
        let mut delta = trigger_update;
        delta.insert("pending_occurrence".into(), pending);
        delta.insert("next_index".into(), json!(index + 1));
        delta.insert("manual_pending".into(), Value::Null);
        entries.push(Entry::Decision(Planned {
            name: "automation.admitted".into(),
            discriminator: index.to_string(),
            fields: into_map(json!({
                "run_id": first_run_id,
                "index": index,
                "attempt": 1,
                "event_id": event_id,
                "trigger_envelope": envelope,
                "prepared": prepared,
            })),
            delta: json!({"state": delta}),
        }));
        Ok(Step::Commit(
            Commit {
                at: Some(at),
                entries,
                ..Commit::default()
            },
            "prepare",
        ))
    }

    /// `prepare_context`: the occurrence's inputs were frozen at admission;
    /// it checks that one is pending and goes on to `dispatch`.
    pub fn prepare_context(&self) -> Result<Step, AutomationError> {
        if pending(self.state).is_none() {
            return Err(AutomationError::new(
                "invalid_state",
                None,
                "prepare_context: no occurrence is pending (admit routes here only after admitting one)",
            ));
        }
        Ok(Step::Route("dispatch"))
    }

    /// `dispatch`: `automation.dispatched` for the current attempt (then
    /// this node `again`), else the start of its run and the wait for it.
    pub fn dispatch(&self) -> Result<Step, AutomationError> {
        if let Some(planned) = plan_dispatch(self.id, self.state)? {
            return Ok(commit(vec![Entry::Decision(planned)], "again"));
        }
        let run_id = pending(self.state)
            .and_then(|p| p["run_id"].as_str())
            .unwrap_or_default();
        Ok(Step::StartOccurrence(run_id.to_string()))
    }

    /// `record_outcome`: what the ended attempt's run means
    /// ([`plan_outcome`]: completed, cancelled, failed, or a retry after
    /// its backoff), then `next`; a run still going is waited on again
    /// (`dispatch`).
    pub fn record_outcome(&self) -> Result<Step, AutomationError> {
        let (definition, state) = (self.definition, self.state);
        let Some(pending) = pending(state) else {
            return Ok(Step::Route("next"));
        };
        if pending["phase"] != "dispatched" {
            return Ok(Step::Route("next"));
        }
        let run_id = pending["run_id"].as_str().unwrap_or_default();
        if let Some(sub) = self
            .dispatch
            .and_then(|d| d.get("sub_run_id"))
            .and_then(Value::as_str)
        {
            if sub != run_id {
                return Err(AutomationError::new(
                    "invalid_state",
                    None,
                    format!(
                        "the dispatch answered for run {sub}, not for the occurrence's run {run_id}"
                    ),
                ));
            }
        }
        let read = self
            .answer::<ChildView>()
            .filter(|a| a.answer.run_id == run_id);
        let Some(Answer { answer, now, at }) = read else {
            return Ok(Step::ReadOccurrence(run_id.to_string()));
        };
        Ok(match plan_outcome(definition, state, &answer, now)? {
            None => Step::Route("dispatch"),
            Some(planned) => Step::Commit(
                Commit {
                    at: Some(at),
                    entries: vec![Entry::Decision(planned)],
                    ..Commit::default()
                },
                "next",
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::DEFAULT_RETRY;
    use crate::protocol::{Admitted, TriggerWait};

    const ID: &str = "34f631d4-0bf3-5fea-a282-70c1b1d5b24b";

    fn definition() -> Value {
        json!({
            "revision": 1, "title": "Watch", "archived_at": null, "workspace_root": "/w",
            "notify": {"channels": ["console"]}, "context": {"mode": "independent"},
            "target": {"workflow_id": "echo", "input_data": {"prompt": "hi"}},
            "trigger": {"binding_id": "b1", "source_id": "schedule", "source_version": 1,
                        "config": {"every": "1h"}},
            "policy": {"retry": serde_json::from_str::<Value>(DEFAULT_RETRY).unwrap(),
                       "tool_approval": "auto", "untrusted_input_tools": []},
        })
    }

    fn state() -> Value {
        json!({"pending_occurrence": null, "manual_pending": null, "paused": false,
               "exhausted": false, "next_index": 1, "attention_seq": 0, "state_version": 0})
    }

    fn now() -> DateTime<Utc> {
        parse_timestamp("2026-01-01T00:30:00Z", "now").unwrap()
    }

    fn at<'a>(definition: &'a Value, state: &'a Value, facts: Option<&'a Value>) -> Controller<'a> {
        Controller {
            id: ID,
            definition,
            state,
            owner: None,
            now: now(),
            facts,
            dispatch: None,
        }
    }

    /// `a` as the host answers it, asked on `state` of `definition()` at
    /// `asked_at`.
    fn asked(a: impl serde::Serialize, state: &Value, asked_at: &str) -> Value {
        json!(Facts {
            basis: Basis::of(&definition(), state, asked_at),
            answer: serde_json::to_value(a).unwrap(),
        })
    }

    fn answer(a: TriggerAnswer) -> Value {
        asked(a, &state(), "2026-01-01T00:29:00+00:00")
    }

    #[test]
    fn wait_asks_the_trigger_only_when_the_state_does_not_say() {
        let (d, s) = (definition(), state());
        assert_eq!(
            at(&d, &s, None).wait(),
            Step::AskTrigger(TriggerCall::Prepare)
        );
        // An answer to another question is not an answer: ask again.
        let stale = answer(TriggerAnswer::Manual {
            envelope: json!({}),
            context: None,
        });
        assert_eq!(
            at(&d, &s, Some(&stale)).wait(),
            Step::AskTrigger(TriggerCall::Prepare)
        );
        let later = answer(TriggerAnswer::Prepare {
            wait: TriggerWait::Until {
                until: "2026-01-01T01:00:00Z".into(),
            },
        });
        let Step::Commit(c, "go") = at(&d, &s, Some(&later)).wait() else {
            panic!("a later tick parks");
        };
        assert_eq!(
            c.park.unwrap().until.as_deref(),
            Some("2026-01-01T01:00:00+00:00")
        );
        assert!(c.entries.is_empty() && !c.note_exhausted);
        let due = answer(TriggerAnswer::Prepare {
            wait: TriggerWait::Until {
                until: "2026-01-01T00:00:00Z".into(),
            },
        });
        assert_eq!(at(&d, &s, Some(&due)).wait(), Step::Route("go"));
        let over = answer(TriggerAnswer::Prepare {
            wait: TriggerWait::Exhausted,
        });
        let Step::Commit(c, "end") = at(&d, &s, Some(&over)).wait() else {
            panic!("an exhausted source ends");
        };
        assert!(c.note_exhausted && c.park.is_none());
        // An exhaustion asked on another state version is not this one's.
        let mut moved = state();
        moved["state_version"] = json!(4);
        assert_eq!(
            at(&d, &moved, Some(&over)).wait(),
            Step::AskTrigger(TriggerCall::Prepare)
        );
        let mut queued = state();
        queued["manual_pending"] = json!({"command_id": "c1"});
        assert_eq!(at(&d, &queued, None).wait(), Step::Route("go"));
    }

    #[test]
    fn admit_freezes_a_run_now_through_manual() {
        let d = definition();
        let mut s = state();
        s["manual_pending"] = json!({"command_id": "c1"});
        s["paused"] = json!(true);
        let ask = at(&d, &s, None).admit().unwrap();
        assert_eq!(
            ask,
            Step::AskTrigger(TriggerCall::Manual {
                command_id: "c1".into(),
                fired_at: "2026-01-01T00:30:00+00:00".into(),
                history: None,
            })
        );
        let scheduled = answer(TriggerAnswer::Admit {
            state: json!({}),
            admitted: None,
            context: None,
        });
        assert_eq!(at(&d, &s, Some(&scheduled)).admit().unwrap(), ask);
        let envelope = json!({"event_id": "manual:c1", "source_id": "manual", "source_version": 1,
                              "fired_at": "2026-01-01T00:30:00Z", "payload": {"command_id": "c1"},
                              "binding_id": "b1"});
        let manual = asked(
            TriggerAnswer::Manual {
                envelope,
                context: None,
            },
            &s,
            "2026-01-01T00:29:00Z",
        );
        let Step::Commit(c, "prepare") = at(&d, &s, Some(&manual)).admit().unwrap() else {
            panic!("a run-now is admitted");
        };
        // Decided as of the question.
        assert_eq!(c.at.as_deref(), Some("2026-01-01T00:29:00+00:00"));
        let [Entry::Decision(p)] = c.entries.as_slice() else {
            panic!("one decision: {:?}", c.entries);
        };
        assert_eq!(p.name, "automation.admitted");
        let run_id = occurrence_run_id(ID, OccurrenceKind::Manual { command_id: "c1" }, 1);
        assert_eq!(p.fields["run_id"], json!(run_id));
        let pending = &p.delta["state"]["pending_occurrence"];
        assert_eq!(pending["command_id"], "c1");
        assert_eq!(pending["envelope"]["fired_at"], "2026-01-01T00:30:00+00:00");
        assert_eq!(
            pending["prepared"]["input_data"]["prompt"],
            "[Trigger manual@1 · occurrence 1 · fired 2026-01-01T00:30:00+00:00]\nhi"
        );
        assert_eq!(p.delta["state"]["manual_pending"], Value::Null);
    }

    #[test]
    fn admit_coalesces_and_a_stale_wake_rearms() {
        let (d, s) = (definition(), state());
        assert_eq!(
            at(&d, &s, None).admit().unwrap(),
            Step::AskTrigger(TriggerCall::Admit { history: None })
        );
        let nothing = answer(TriggerAnswer::Admit {
            state: json!({"tick": 3}),
            admitted: None,
            context: None,
        });
        assert_eq!(
            at(&d, &s, Some(&nothing)).admit().unwrap(),
            Step::Route("rearm")
        );
        // A source that passed events over moved its own cursor: that is
        // committed, then the node rearms.
        let passed = answer(TriggerAnswer::Admit {
            state: json!({"tick": 0, "cursor_seq": 7}),
            admitted: None,
            context: None,
        });
        let Step::Commit(c, "rearm") = at(&d, &s, Some(&passed)).admit().unwrap() else {
            panic!("the moved cursor is committed");
        };
        let Entry::Decision(p) = &c.entries[0] else {
            panic!("a decision");
        };
        assert_eq!(p.name, "automation.passed_over");
        assert_eq!(p.delta["state"]["source_state"]["cursor_seq"], 7);
        let admitted = answer(TriggerAnswer::Admit {
            state: json!({"tick": 4, "scheduled_count": 2, "cursor": 9}),
            admitted: Some(Admitted {
                payload: json!({"coalesced": {"missed": 2}}),
                envelope: json!({"event_id": "e4", "source_id": "schedule", "source_version": 1,
                                 "fired_at": "2026-01-01T00:00:00Z", "payload": {},
                                 "binding_id": "b1"}),
                inputs: None,
                untrusted: false,
            }),
            context: None,
        });
        let Step::Commit(c, "prepare") = at(&d, &s, Some(&admitted)).admit().unwrap() else {
            panic!("admitted");
        };
        // Asked before a command moved the state: asked again.
        let mut moved = state();
        moved["state_version"] = json!(1);
        assert_eq!(
            at(&d, &moved, Some(&admitted)).admit().unwrap(),
            Step::AskTrigger(TriggerCall::Admit { history: None })
        );
        let mut revised = definition();
        revised["revision"] = json!(2);
        assert_eq!(
            at(&revised, &s, Some(&admitted)).admit().unwrap(),
            Step::AskTrigger(TriggerCall::Admit { history: None })
        );
        let [Entry::Observation(o), Entry::Decision(p)] = c.entries.as_slice() else {
            panic!(
                "the coalesced observation, then the admission: {:?}",
                c.entries
            );
        };
        assert_eq!(
            (o.name.as_str(), o.discriminator.as_str()),
            ("automation.coalesced", "e4")
        );
        assert_eq!(o.fields["missed"], 2);
        assert_eq!(p.delta["state"]["tick"], 4);
        assert_eq!(p.delta["state"]["source_state"], json!({"cursor": 9}));
        assert_eq!(p.delta["state"]["next_index"], 2);
    }

    #[test]
    fn dispatch_records_then_starts_and_an_outcome_needs_its_own_run() {
        let d = definition();
        let mut s = state();
        s["pending_occurrence"] = json!({"run_id": "r1", "index": 1, "attempt": 1, "revision": 1,
                                         "phase": "admitted", "command_id": null,
                                         "retry": d["policy"]["retry"]});
        let Step::Commit(c, "again") = at(&d, &s, None).dispatch().unwrap() else {
            panic!("the dispatch is recorded first");
        };
        let [Entry::Decision(p)] = c.entries.as_slice() else {
            panic!("one decision");
        };
        s["pending_occurrence"] = p.delta["state"]["pending_occurrence"].clone();
        let run_id = s["pending_occurrence"]["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            at(&d, &s, None).dispatch().unwrap(),
            Step::StartOccurrence(run_id.clone())
        );
        // A read of another run is not the answer.
        let read = |view: Value| asked(view, &s, "2026-01-01T00:30:00Z");
        let other =
            read(json!({"run_id": "r0", "status": "completed", "output": {}, "error": null}));
        assert_eq!(
            at(&d, &s, Some(&other)).record_outcome().unwrap(),
            Step::ReadOccurrence(run_id.clone())
        );
        let going = read(json!({"run_id": run_id, "status": "waiting"}));
        assert_eq!(
            at(&d, &s, Some(&going)).record_outcome().unwrap(),
            Step::Route("dispatch")
        );
        let failed = read(json!({"run_id": run_id, "status": "failed", "error": "boom"}));
        let Step::Commit(c, "next") = at(&d, &s, Some(&failed)).record_outcome().unwrap() else {
            panic!("an ended run is recorded");
        };
        let [Entry::Decision(p)] = c.entries.as_slice() else {
            panic!("one decision");
        };
        assert_eq!(p.name, "automation.retry_scheduled");
        assert_eq!(p.fields["retry_at"], "2026-01-01T00:30:30+00:00");
        let mut stopped = s.clone();
        stopped["pending_occurrence"]["phase"] = json!("admitted");
        stopped["pending_occurrence"]["stop_requested"] = json!(true);
        let Step::Commit(c, "rearm") = at(&d, &stopped, None).admit().unwrap() else {
            panic!("a stop before the dispatch cancels");
        };
        let [Entry::Decision(p)] = c.entries.as_slice() else {
            panic!("one decision");
        };
        assert_eq!(
            (p.name.as_str(), &p.fields["status"]),
            ("automation.completed", &json!("cancelled"))
        );
    }

    #[test]
    fn the_controller_copies_only_what_an_outcome_reads() {
        let output = json!({"response": "ok", "huge": "x".repeat(1000), "success": true,
                            "result": {"answer": "a", "deep": [[[[1]]]]}, "notify": {"title": "t"}});
        let view = ChildView::of("r1", "completed", Some(&output), None);
        assert_eq!(
            view.output,
            Some(
                json!({"response": "ok", "success": true, "notify": {"title": "t"},
                        "result": {"answer": "a"}})
            )
        );
        let full = ChildView {
            output: Some(output),
            ..view.clone()
        };
        assert_eq!(
            crate::normalize_occurrence_output(&view),
            crate::normalize_occurrence_output(&full)
        );
        let text = ChildView::of("r1", "failed", Some(&json!("no object")), Some("boom"));
        assert_eq!(text.output, Some(json!({})));
        assert_eq!(text.error.as_deref(), Some("boom"));
    }
}
