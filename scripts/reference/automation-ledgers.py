#!/usr/bin/env python3
"""Writes tests/fixtures/automation-ledgers.json: controller ledgers the
reference implementation (abstractruntime 0.13.0) writes for a few
automations driven through its own test harness, and its answers to
`list_occurrences` / `list_attention` over them. tests/automation.rs folds the
same records with stepwell's queries and compares; the records are also the
exact shapes stepwell's controller must write.

Run (from anywhere but the reference's source tree), with the reference's
sdist unpacked at REFSRC:

    REFSRC=/path/to/abstractruntime-0.13.0 /path/to/venv/bin/python \
        scripts/reference/automation-ledgers.py > tests/fixtures/automation-ledgers.json
"""

import copy
import json
from datetime import datetime, timedelta
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refharness import H, MonkeyPatch, record, waiting_of  # noqa: E402
from abstractruntime.automations.attention import list_attention  # noqa: E402
from abstractruntime.automations.service import get_automation, list_occurrences  # noqa: E402
from abstractruntime.automation_queries import automation_summary  # noqa: E402
from abstractruntime.automations.controller import next_fire_at  # noqa: E402
from abstractruntime.core.models import RunStatus  # noqa: E402


def ten_minutes_after(now):
    t = datetime.fromisoformat(now) + timedelta(minutes=10)
    return t.isoformat()


def view(runtime, run_store, aid, now):
    """The controller run at `now`, and what get_automation / automation_summary show of it."""
    run = runtime.get_state(aid)
    waiting = waiting_of(run)
    # Between steps (running, no wait): the trigger's own answer, now and
    # ten minutes later (when a coalesced tick is due).
    between = copy.deepcopy(run)
    between.status = RunStatus.RUNNING
    between.waiting = None
    asked = {t: next_fire_at(between, now=t) for t in (now, ten_minutes_after(now))}
    return {
        "now": now,
        "between_steps": asked,
        "run": {"status": run.status.value, "vars": run.vars, "waiting": waiting,
                "session_id": run.session_id},
        "get_automation": get_automation(run_store, aid),
        "summary": automation_summary(run),
    }


def scenario(name, request_kwargs, times, occurrence_queries, attention_queries):
    root = Path(tempfile.mkdtemp())
    run_store, ledger_store = H.make_stores("sqlite", root)
    runtime = H.make_runtime(run_store, ledger_store)
    clock = H.Clock(MonkeyPatch())
    aid = H.create(runtime, clock, **request_kwargs)
    H.drive(runtime, aid)
    views = [view(runtime, run_store, aid, clock.now)]
    for t in times:
        H.at(runtime, clock, aid, t)
        views.append(view(runtime, run_store, aid, clock.now))
    records = [record(r) for r in ledger_store.list(aid)]
    return {
        "name": name,
        "automation_id": aid,
        "records": records,
        "views": views,
        "occurrences": [{"query": q, "page": list_occurrences(runtime, aid, **q)} for q in occurrence_queries],
        "attention": [{"query": q, "page": list_attention(ledger_store, aid, **q)} for q in attention_queries],
    }


out = [
    scenario(
        "every 2m, notify, coalesced",
        {"request_id": "memory-watch", "input_data": {"prompt": "check memory", "notify": True}},
        ["2026-01-01T00:02:30+00:00", "2026-01-01T00:11:00+00:00"],
        [{}, {"limit": 2}, {"cursor": "occ1:2", "limit": 2}, {"limit": 0}, {"cursor": "occ1:1"}],
        [{}, {"limit": 2}, {"cursor": "att1:2"}, {"after_seq": 1, "limit": 1}, {"after_seq": 3}],
    ),
    scenario(
        "flaky, retried once",
        {"request_id": "flaky-1", "workflow_id": "flaky", "input_data": {"prompt": "p", "fail_until": 2}},
        ["2026-01-01T00:00:31+00:00"],
        [{}],
        [{}],
    ),
    scenario(
        "flaky, always failing",
        {"request_id": "flaky-2", "workflow_id": "flaky", "input_data": {"prompt": "p", "fail_until": 9}},
        ["2026-01-01T00:00:31+00:00", "2026-01-01T00:01:32+00:00"],
        [{}],
        [{}],
    ),
]
print(json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False))
