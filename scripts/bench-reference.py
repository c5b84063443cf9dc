#!/usr/bin/env python3
"""Benchmark of the Python reference implementation (abstractruntime 0.13.0),
shaped like `stepwell bench` so the two sets of figures can be put side by side.

Prints one JSON object on stdout (medians, same meaning as stepwell's figures):

- `chain_steps_per_s_memory`: one run through a 1,000-node chain, on
  InMemoryRunStore + InMemoryLedgerStore. Each node is a plain Python handler
  that counts the step in `vars.i` and moves to the next node; the last one
  completes with `{"steps": i}` (like flows/examples/chain/step). The run is
  started first (not timed); the timed part is one `tick` that executes all
  1,000 nodes. 25 repeats (3 with --quick), median of steps/s.
- `chain_steps_per_s_sqlite`: the same on the reference's own SQLite stores
  (SqliteRunStore + SqliteLedgerStore on one SqliteDatabase: WAL,
  synchronous=NORMAL, as the reference configures it).
- `ask_resume_cycles_per_s_sqlite`: start a run whose first node is an
  ASK_USER effect, tick until it waits, resume it with {"text": "Bob"}, tick
  to completion (`{"greeting": "Hello, Bob!"}`), on SQLite. Cycles/s, median
  of 5 batches of 500 (--quick: 1 batch of 50).
- `ask_resume_cycles_per_s_sqlite_chained`: the same with the ledger wrapped in
  the reference's HashChainedLedgerStore (SHA-256 chain, one BEGIN IMMEDIATE
  transaction per record), closer to stepwell's hash-chained ledger.
- `automation_occurrences_per_s_sqlite`: one automation (schedule@1 every
  1m from 2026-01-01T00:00:00Z, target `echo` answering
  `{"response": "echo:" + prompt, "success": true}`) on SQLite; each
  occurrence moves the controller's clock one minute, wakes the controller
  (its due deadline, resumed as the reference's test harness does) and drives
  it (`drive_automation`): admission, dispatch, the child's run, completion.
  Occurrences/s, median of 3 batches of 100 on a fresh automation each
  (--quick: 1 batch of 20). Needs abstractcore (`pip install --no-deps
  abstractcore==2.30.0 pydantic httpx`); skipped without it.
- `automation_commands_per_s_sqlite`: `apply_automation_command` pause and
  resume in turn (new command ids), on a parked hourly automation on SQLite.
  Commands/s, median of 3 batches of 200 (--quick: 1 of 40).
- `history_window_us_p50`: `session_chat_messages` over a session of 500
  completed runs (prompt "How is memory now? (turn i)", answer ~420
  characters) on InMemoryRunStore, folded into the default 50,000-token
  window (some turns dropped), as stepwell's figure. Microseconds, median of
  100 reads (--quick: 20). The reference estimates tokens with
  AbstractCore's tokenizer when it is importable; the figure pins its
  fallback (a quarter of the characters), as stepwell does.
- `reference_version`, `notes`.

Every run's final status and output are checked; the script raises if a
chain did not execute all its nodes or a cycle did not complete.

Install the reference (Python >= 3.10; the parts used here need nothing beyond
the standard library, sqlite3 included, hence --no-deps):

    python3 -m venv .venv-ref && .venv-ref/bin/pip install --no-deps abstractruntime==0.13.0
    .venv-ref/bin/python scripts/bench-reference.py [--quick] [--only NAME,NAME]

`--only` measures the named figures alone, whole names separated by commas
(scripts/bench-compare uses it to run the two implementations in turns).

Do not run it from inside the reference's source tree (its `email` package
would shadow the standard library's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from abstractruntime import (
    Effect,
    EffectType,
    HashChainedLedgerStore,
    InMemoryLedgerStore,
    InMemoryRunStore,
    Runtime,
    RunStatus,
    SqliteDatabase,
    SqliteLedgerStore,
    SqliteRunStore,
    StepPlan,
    WorkflowSpec,
)

REFERENCE_VERSION = "0.13.0"


def chain_workflow(length: int) -> WorkflowSpec:
    """`length` nodes n0..n{length-1}; each counts the step in vars.i."""

    def link(node_id: str, next_id: str):
        def handler(run, ctx):
            run.vars["i"] = run.vars.get("i", 0) + 1
            return StepPlan(node_id=node_id, next_node=next_id)

        return handler

    def last(node_id: str):
        def handler(run, ctx):
            i = run.vars.get("i", 0) + 1
            return StepPlan(node_id=node_id, complete_output={"steps": i})

        return handler

    nodes = {f"n{k}": link(f"n{k}", f"n{k + 1}") for k in range(length - 1)}
    nodes[f"n{length - 1}"] = last(f"n{length - 1}")
    return WorkflowSpec(workflow_id="bench.chain", entry_node="n0", nodes=nodes)


def ask_workflow() -> WorkflowSpec:
    """Like flows/examples/ask-user: ask for a name, then greet."""

    def ask(run, ctx):
        return StepPlan(
            node_id="ask",
            effect=Effect(
                type=EffectType.ASK_USER,
                payload={"prompt": "What is your name?"},
                result_key="user_input",
            ),
            next_node="greet",
        )

    def greet(run, ctx):
        name = (run.vars.get("user_input") or {}).get("text")
        return StepPlan(node_id="greet", complete_output={"greeting": f"Hello, {name}!"})

    return WorkflowSpec(workflow_id="ask-user", entry_node="ask", nodes={"ask": ask, "greet": greet})


def bench_chain(rt: Runtime, length: int, repeats: int) -> float:
    wf = chain_workflow(length)
    rates = []
    for _ in range(repeats):
        run_id = rt.start(workflow=wf, vars={})
        t = time.perf_counter()
        state = rt.tick(workflow=wf, run_id=run_id, max_steps=length + 10)
        secs = time.perf_counter() - t
        if state.status != RunStatus.COMPLETED or state.output != {"steps": length}:
            raise RuntimeError(
                f"chain ended {state.status.value} with output {state.output!r} "
                f"(error {state.error!r}), expected completed with {{'steps': {length}}}"
            )
        # The stored run must agree (the tick returns the in-memory object).
        stored = rt.get_state(run_id)
        if stored.status != RunStatus.COMPLETED or stored.output != {"steps": length}:
            raise RuntimeError(f"stored chain run is {stored.status.value}: {stored.output!r}")
        rates.append(length / secs)
    return statistics.median(rates)


def ask_cycle(rt: Runtime, wf: WorkflowSpec) -> str:
    run_id = rt.start(workflow=wf, vars={})
    parked = rt.tick(workflow=wf, run_id=run_id, max_steps=10)
    if parked.status != RunStatus.WAITING or parked.waiting is None:
        raise RuntimeError(f"ask-user did not park: {parked.status.value} {parked.error!r}")
    rt.resume(workflow=wf, run_id=run_id, wait_key=parked.waiting.wait_key,
              payload={"text": "Bob"}, max_steps=0)
    done = rt.tick(workflow=wf, run_id=run_id, max_steps=10)
    if done.status != RunStatus.COMPLETED or done.output != {"greeting": "Hello, Bob!"}:
        raise RuntimeError(f"ask-user did not complete: {done.status.value} {done.output!r} {done.error!r}")
    return run_id


def bench_cycles(rt: Runtime, per_batch: int, batches: int) -> float:
    wf = ask_workflow()
    rates = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(per_batch):
            ask_cycle(rt, wf)
        rates.append(per_batch / (time.perf_counter() - t))
    return statistics.median(rates)


def sqlite_runtime(path: Path, chained: bool = False) -> Runtime:
    db = SqliteDatabase(path)
    ledger = SqliteLedgerStore(db)
    return Runtime(
        run_store=SqliteRunStore(db),
        ledger_store=HashChainedLedgerStore(ledger) if chained else ledger,
    )


def ledger_shape(rt: Runtime, wf: WorkflowSpec, kind: str) -> str:
    """Ledger records one run of `wf` leaves (for the notes)."""
    if kind == "chain":
        run_id = rt.start(workflow=wf, vars={})
        rt.tick(workflow=wf, run_id=run_id, max_steps=10_000)
    else:
        run_id = ask_cycle(rt, wf)
    records = rt.get_ledger(run_id)
    types = [str(((r.get("effect") or {}).get("type")) or "-") + ":" + str(r.get("status")) for r in records]
    return f"{len(records)} records ({', '.join(types)})"


T0 = "2026-01-01T00:00:00+00:00"


def automation_world(path: Path):
    """A runtime with the controller bundle and an `echo` target on SQLite, and
    a clock for the controller (the reference reads it through
    `controller._now_iso`, which its own tests replace the same way)."""
    from abstractruntime.automations import controller as controller_mod
    from abstractruntime.automations import register_controller_bundle
    from abstractruntime.scheduler.registry import WorkflowRegistry

    def answer(run, ctx):
        return StepPlan(node_id="answer", complete_output={
            "response": f"echo:{run.vars.get('prompt')}", "success": True})

    registry = WorkflowRegistry()
    registry.register(WorkflowSpec(workflow_id="echo", entry_node="answer", nodes={"answer": answer}))
    register_controller_bundle(registry)
    db = SqliteDatabase(path)
    rt = Runtime(run_store=SqliteRunStore(db), ledger_store=SqliteLedgerStore(db), workflow_registry=registry)
    clock = {"now": T0}
    controller_mod._now_iso = lambda: clock["now"]
    return rt, clock


def automation_request(request_id: str, every: str) -> dict:
    return {
        "request_id": request_id, "title": "Bench",
        "target": {"workflow_id": "echo", "bundle_ref": "bench@1.0.0", "flow_id": "echo",
                   "input_data": {"prompt": "check memory"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"start_at": T0, "every": every}},
        "workspace_root": "/tmp/automation-ws",
    }


def bench_automation_occurrences(root: Path, per_batch: int, batches: int) -> float:
    from datetime import datetime, timedelta

    from abstractruntime.automations import create_automation, drive_automation
    from abstractruntime.automations.bundle import controller_workflow_spec

    rates = []
    for b in range(batches):
        rt, clock = automation_world(root / f"occurrences-{b}.sqlite")
        clock["now"] = T0
        aid, _ = create_automation(rt, automation_request(f"bench-{b}", "1m"), now=T0)
        drive_automation(rt, aid)
        start = time.perf_counter()
        for i in range(1, per_batch + 1):
            clock["now"] = (datetime.fromisoformat(T0) + timedelta(minutes=i)).isoformat()
            state = rt.get_state(aid)
            rt.resume(workflow=controller_workflow_spec(), run_id=aid, wait_key=state.waiting.wait_key,
                      payload={"timed_out": True}, max_steps=0)
            drive_automation(rt, aid)
        rates.append(per_batch / (time.perf_counter() - start))
        st = rt.get_state(aid).vars["_runtime"]["automation"]
        if st["next_index"] != per_batch + 2 or st["last_outcome"]["status"] != "completed":
            raise RuntimeError(f"automation bench: unexpected state {st['next_index']} {st['last_outcome']}")
    return statistics.median(rates)


def bench_automation_commands(root: Path, per_batch: int, batches: int) -> float:
    from abstractruntime.automations import apply_automation_command, create_automation, drive_automation

    rates = []
    for b in range(batches):
        rt, clock = automation_world(root / f"commands-{b}.sqlite")
        clock["now"] = T0
        aid, _ = create_automation(rt, automation_request(f"cmd-{b}", "1h"), now=T0)
        drive_automation(rt, aid)
        start = time.perf_counter()
        for i in range(per_batch):
            kind = "automation.pause" if i % 2 == 0 else "automation.resume"
            r = apply_automation_command(rt, automation_id=aid, command_id=f"c{i}", type=kind, now=T0)
            if r["status"] != "applied":
                raise RuntimeError(f"command bench: {r}")
        rates.append(per_batch / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_history_window(reads: int) -> float:
    from abstractruntime.core.models import RunState
    from abstractruntime.memory import token_budget
    from abstractruntime.session_history import session_chat_messages

    token_budget.estimate_tokens = lambda text, model=None: 0 if not text else max(1, len(text) // 4)
    store = InMemoryRunStore()
    answer = "The figure held steady at forty-one percent. " * 9
    for i in range(500):
        at = f"2026-01-01T{i // 3600:02d}:{(i // 60) % 60:02d}:{i % 60:02d}+00:00"
        store.save(RunState(run_id=f"turn-{i:04d}", workflow_id="chat", status=RunStatus.COMPLETED,
                            current_node=None, vars={"prompt": f"How is memory now? (turn {i})"},
                            output={"response": answer}, session_id="bench-session",
                            created_at=at, updated_at=at))
    times = []
    for i in range(reads + 5):
        t = time.perf_counter()
        history = session_chat_messages(run_store=store, session_id="bench-session")
        us = (time.perf_counter() - t) * 1e6
        if not history or history.report["dropped_messages"] == 0:
            raise RuntimeError("the 500-turn history did not fill the window")
        if i >= 5:
            times.append(us)
    return statistics.median(times)


# The figures this script measures (what --only accepts).
FIGURES = (
    "chain_steps_per_s_memory",
    "chain_steps_per_s_sqlite",
    "ask_resume_cycles_per_s_sqlite",
    "ask_resume_cycles_per_s_sqlite_chained",
    "automation_occurrences_per_s_sqlite",
    "automation_commands_per_s_sqlite",
    "history_window_us_p50",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 chain repeats, 1 batch of 50 cycles")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated figure names (whole names, unlike stepwell bench's --only): "
                             "measure only these (and skip the notes' ledger probe)")
    args = parser.parse_args()
    only = None
    if args.only is not None:
        only = {name.strip() for name in args.only.split(",")}
        unknown = sorted(only - set(FIGURES)) if only != {""} else [""]
        if unknown:
            parser.error(f"--only: unknown figure {unknown[0]!r}; the figures are {', '.join(FIGURES)}")

    def want(name: str) -> bool:
        return only is None or name in only
    chain_len = 1_000
    repeats = 3 if args.quick else 25
    per_batch, batches = (50, 1) if args.quick else (500, 5)

    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="stepwell-bench-reference-") as scratch, \
            contextlib.redirect_stdout(sys.stderr):
        root = Path(scratch)
        if want("chain_steps_per_s_memory"):
            mem = Runtime(run_store=InMemoryRunStore(), ledger_store=InMemoryLedgerStore())
            figures["chain_steps_per_s_memory"] = round(bench_chain(mem, chain_len, repeats))

        if want("chain_steps_per_s_sqlite"):
            chain_rt = sqlite_runtime(root / "chain.sqlite")
            figures["chain_steps_per_s_sqlite"] = round(bench_chain(chain_rt, chain_len, repeats))

        if want("ask_resume_cycles_per_s_sqlite"):
            ask_rt = sqlite_runtime(root / "ask.sqlite")
            figures["ask_resume_cycles_per_s_sqlite"] = round(bench_cycles(ask_rt, per_batch, batches))

        if want("ask_resume_cycles_per_s_sqlite_chained"):
            chained_rt = sqlite_runtime(root / "ask-chained.sqlite", chained=True)
            figures["ask_resume_cycles_per_s_sqlite_chained"] = round(
                bench_cycles(chained_rt, per_batch, batches))

        try:
            import abstractcore  # noqa: F401  (the automation layer needs it)
            have_automations = True
        except ImportError:
            have_automations = False
        if have_automations and want("automation_occurrences_per_s_sqlite"):
            occ = (20, 1) if args.quick else (100, 3)
            figures["automation_occurrences_per_s_sqlite"] = round(
                bench_automation_occurrences(root, *occ), 1)
        if have_automations and want("automation_commands_per_s_sqlite"):
            cmds = (40, 1) if args.quick else (200, 3)
            figures["automation_commands_per_s_sqlite"] = round(bench_automation_commands(root, *cmds), 1)

        if want("history_window_us_p50"):
            figures["history_window_us_p50"] = round(bench_history_window(20 if args.quick else 100), 1)

        if only is None:
            probe = sqlite_runtime(root / "probe.sqlite")
            chain_ledger = ledger_shape(probe, chain_workflow(chain_len), "chain")
            ask_ledger = ledger_shape(probe, ask_workflow(), "ask")

    figures["reference_version"] = REFERENCE_VERSION
    if only is not None:
        json.dump(figures, sys.stdout)
        sys.stdout.write("\n")
        return 0
    figures["notes"] = (
        "SQLite = the reference's SqliteRunStore + SqliteLedgerStore (one file, WAL, synchronous=NORMAL). "
        "Nodes are plain in-process Python functions (no sandbox); stepwell's are WASM components. "
        "A pure transition (no effect) writes NO ledger record in the reference: each chain step is one "
        "run-row upsert (INSERT ... ON CONFLICT DO UPDATE of the whole run JSON + a wait_index delete) "
        "committed in its own transaction, plus two SELECT status,paused probes; the in-memory store keeps "
        "the live object (no copy, no serialization). stepwell appends a hash-chained ledger record per "
        "step in the same transaction as the run. "
        f"Ledger of one 1,000-node chain run here: {chain_ledger}. "
        f"Ledger of one ask/resume cycle: {ask_ledger}; each record is its own transaction, and so is "
        "each of the 4 run saves (start, park, resume, complete): 9 commits per cycle. The reference's "
        "runtime does not chain its ledger by default (only its diary wraps HashChainedLedgerStore); the "
        "_chained figure wraps it (BEGIN IMMEDIATE + head read + SHA-256 per record)."
    )
    json.dump(figures, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
