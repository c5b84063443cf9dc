#!/usr/bin/env python3
"""Writes tests/fixtures/automation-commands.json: automation commands the
reference implementation (abstractruntime 0.13.0) applied through its own
test harness, each with the controller run before it, its result, and the
ledger records it appended. tests/automation.rs decides the same commands
from the same states with stepwell and compares.

    REFSRC=/path/to/abstractruntime-0.13.0 /path/to/venv/bin/python \
        scripts/reference/automation-commands.py > tests/fixtures/automation-commands.json
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refharness import H, MonkeyPatch, record, waiting_of  # noqa: E402
from abstractruntime.automations.commands import apply_automation_command  # noqa: E402
from abstractruntime.automations.service import get_automation  # noqa: E402


def main():
    root = Path(tempfile.mkdtemp())
    run_store, ledger_store = H.make_stores("sqlite", root)
    runtime = H.make_runtime(run_store, ledger_store)
    clock = H.Clock(MonkeyPatch())
    aid = H.create(runtime, clock, request_id="commands",
                   trigger={"source_id": "schedule", "source_version": 1,
                            "config": {"start_at": "2026-01-01T01:00:00Z", "every": "1h"}})
    H.drive(runtime, aid)
    steps = []

    def command(now, command_id, type_, payload=None, expected_revision=None, drive_at=None):
        if drive_at:
            H.at(runtime, clock, aid, drive_at)
        clock.set(now)
        before = runtime.get_state(aid)
        n = len(ledger_store.list(aid))
        result = apply_automation_command(runtime, automation_id=aid, command_id=command_id, type=type_,
                                          payload=payload, expected_revision=expected_revision, now=now)
        after = runtime.get_state(aid)
        waiting = waiting_of(after)
        steps.append({
            "after": {"status": after.status.value, "vars": after.vars, "waiting": waiting,
                      "get_automation": get_automation(run_store, aid)},
            "now": now, "command_id": command_id, "type": type_, "payload": payload,
            "expected_revision": expected_revision,
            "before": {"status": before.status.value, "vars": before.vars},
            "result": result,
            "records": [record(r) for r in ledger_store.list(aid)[n:]],
        })

    command("2026-01-01T00:10:00+00:00", "p1", "automation.pause")
    command("2026-01-01T00:11:00+00:00", "p2", "automation.pause")
    command("2026-01-01T03:30:00+00:00", "r1", "automation.resume")
    command("2026-01-01T03:31:00+00:00", "r2", "automation.resume")
    command("2026-01-01T03:32:00+00:00", "s1", "automation.stop_current")
    command("2026-01-01T03:33:00+00:00", "v1", "automation.revise", {"changes": {"title": "Renamed"}}, 1)
    command("2026-01-01T03:34:00+00:00", "v2", "automation.revise", {"changes": {"title": "Again"}}, 1)
    command("2026-01-01T03:35:00+00:00", "v3", "automation.revise", {"changes": {"title": ""}})
    command("2026-01-01T03:36:00+00:00", "v4", "automation.revise",
            {"changes": {"trigger": {"source_id": "schedule", "source_version": 1,
                                     "config": {"start_at": "2026-01-01T00:00:00Z", "every": "15m"}},
                         "policy": {"retry": {"max_attempts": 5}}}})
    command("2026-01-01T03:37:00+00:00", "v5", "automation.revise", {"changes": {"context": {"growing": {"summary": 1}}}})
    command("2026-01-01T03:38:00+00:00", "n1", "automation.run_now")
    command("2026-01-01T03:38:30+00:00", "n2", "automation.run_now")
    command("2026-01-01T03:39:00+00:00", "s2", "automation.stop_current")
    command("2026-01-01T03:40:00+00:00", "a1", "automation.archive")
    command("2026-01-01T03:41:00+00:00", "a2", "automation.archive")
    command("2026-01-01T03:42:00+00:00", "p3", "automation.pause")
    command("2026-01-01T03:43:00+00:00", "n3", "automation.run_now")
    command("2026-01-01T03:44:00+00:00", "u1", "automation.unarchive")
    command("2026-01-01T03:45:00+00:00", "u2", "automation.unarchive")
    command("2026-01-01T03:46:00+00:00", "r3", "automation.resume")
    print(json.dumps({"automation_id": aid, "steps": steps}, indent=1, sort_keys=True, ensure_ascii=False))


main()
