"""What the fixture generators share: the reference's test harness on the
path, and the ledger record fields stepwell's StepRecord has."""

import os
import sys

sys.path.insert(0, os.path.join(os.environ["REFSRC"], "tests"))
import automation_harness as H  # noqa: E402,F401

KEEP = ("step_id", "run_id", "node_id", "status", "effect", "result", "error",
        "started_at", "ended_at", "idempotency_key")


class MonkeyPatch:
    """The one part of pytest's monkeypatch the harness's clock uses."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def record(r):
    """A reference ledger record with only StepRecord's fields."""
    out = {k: r.get(k) for k in KEEP}
    out["attempt"] = 1
    return out


def waiting_of(run):
    """A run's wait as a dict (stepwell's WaitState fields), or None."""
    w = run.waiting
    if w is None:
        return None
    return {
        "reason": w.reason.value, "wait_key": w.wait_key, "until": w.until,
        "resume_to_node": w.resume_to_node, "result_key": w.result_key,
        "prompt": w.prompt, "choices": w.choices, "details": w.details,
    }
