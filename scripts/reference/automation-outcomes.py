#!/usr/bin/env python3
"""Writes tests/fixtures/automation-outcomes.json: the reference implementation's
answers (abstractruntime 0.13.0) for occurrence outputs, notify values and
completions, which tests/automation.rs compares stepwell's with.

Run: /path/to/venv-with-abstractruntime/bin/python scripts/reference/automation-outcomes.py > tests/fixtures/automation-outcomes.json
"""
import json
from abstractruntime.core.models import RunState, RunStatus
from abstractruntime.automations.attention import normalize_occurrence_output, notify_payload
from abstractruntime.automations.controller import complete_occurrence, current_occurrence
def child(status, output, error=None):
    return RunState(run_id="c1", workflow_id="w", status=RunStatus(status), current_node=None, vars={}, output=output, error=error)
cases = [
 ("completed", {"response": "echo:hi", "success": True}, None),
 ("completed", {"result": {"answer": "A", "success": False, "error": "bad"}}, None),
 ("completed", {"result": {"answer": "A"}, "notify": True}, None),
 ("completed", {"result": "plain text"}, None),
 ("completed", {"answer": 5, "response": "r"}, None),
 ("completed", "not an object", None),
 ("completed", None, None),
 ("failed", {"error": "boom"}, "node failed: x"),
 ("failed", {"error": {"a": 1}}, None),
 ("failed", {"error": ""}, ""),
 ("cancelled", {}, None),
 ("completed", {"success": False}, None),
 ("completed", {"result": {"notify": {"title": "T"}}, "response": "x"}, None),
 ("completed", {"notify": {"title": " Spike ", "body": "CPU 97%"}, "response": "r"}, None),
]
outs = []
for st, out, err in cases:
    outs.append({"status": st, "output": out, "error": err, "expected": normalize_occurrence_output(child(st, out, err))})
OUT = {"outputs": outs}
notes = [True, False, None, "yes", {"title": "", "body": " "}, {"title": " T ", "body": 5}, {"title": "x"*200, "body": "b"*3000}, {"body": "only body"}, 1]
OUT["notify"] = [{"raw": r, "expected": notify_payload(r, title="Memory watch"+"!"*130, answer="a"*400)} for r in notes]
class T:
    def __init__(s, d, st, now): s.definition=d; s.state=st; s.now=now
    def decide(s, name, disc, fields, state, node_id): return {"name": name, "disc": disc, "fields": fields, "state": state, "node": node_id}
pending = {"run_id": "r-1", "index": 3, "attempt": 2}
defs = [
 {"title": "Memory watch", "notify": {"channels": ["console"]}},
 {"title": "Memory watch", "notify": {"channels": ["console", "email"], "recipients": ["a@b.c"]}},
 {"title": "Memory watch", "notify": {"channels": ["console"], "always": True, "title": "Note", "body": "fallback"}, "one_shot": True},
 {"title": "Memory watch"},
]
res = []
for d in defs:
    for status, oc in [("completed", {"answer": "echo:x", "success": True, "notify": None, "error": None}),
                       ("completed", {"answer": "  ", "success": True, "notify": {"title": "Spike", "body": "CPU"}, "error": None}),
                       ("completed", {"answer": "", "success": True, "notify": None, "error": None}),
                       ("failed", {"answer": "", "success": False, "notify": None, "error": "boom on attempt 3"}),
                       ("failed", None), ("cancelled", None)]:
        t = T(d, {"pending_occurrence": pending, "attention_seq": 4}, "2026-01-01T00:01:30+00:00")
        res.append({"definition": d, "status": status, "outcome": oc, "expected": complete_occurrence(t, status=status, outcome=oc, node_id="record_outcome")})
OUT["completions"] = res
r = RunState(run_id="a", workflow_id="w", status=RunStatus.RUNNING, current_node=None, vars={"_runtime": {"automation": {"pending_occurrence": {"index": 2, "run_id": "x", "attempt": 2, "phase": "backoff"}}}})
OUT["current"] = current_occurrence(r)
print(json.dumps(OUT, indent=1, sort_keys=True, ensure_ascii=False))
