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
