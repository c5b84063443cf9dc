"""A Python node for the contract's behaviours: what it does is chosen by
`vars.mode` (tests/cli.rs runs each and checks the host's typed outcome), as
flows/examples/contract-js does in JavaScript. Built by
scripts/build-python-guest with componentize-py."""

import json
import time

import wit_world
from wit_world.imports.types import (
    Effect,
    NodeError_Failed,
    NodeError_InvalidInput,
    NodeInput,
    StepPlan,
)
from componentize_py_types import Err


def plan(vars=None, effect=None, next_node=None, complete=None, completes=False) -> StepPlan:
    return StepPlan(
        vars=None if vars is None else json.dumps(vars),
        effect=effect,
        next_node=next_node,
        complete_output=json.dumps(complete) if completes else None,
    )


class WitWorld(wit_world.WitWorld):
    def handle(self, input: NodeInput) -> StepPlan:
        vars = json.loads(input.vars)
        mode = vars.get("mode")
        value = vars.get("value")
        if mode == "complete":
            whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(input.now.seconds))
            stamp = whole + ".%06dZ" % (input.now.nanoseconds // 1000)
            output = {"echo": value, "node": input.node_id, "attempt": input.attempt, "now": stamp}
            return plan(complete=output, completes=True)
        if mode == "next":
            return plan(vars={"seen": True if value is None else value}, next_node="end")
        if mode == "follow":
            return plan(vars={"seen": "followed"})
        if mode == "ask":
            return plan(effect=Effect("ask_user", json.dumps({"prompt": "Your name?"}), "answer"))
        if mode == "wait":
            return plan(effect=Effect("wait_until", json.dumps({"seconds": 60}), None))
        if mode == "invalid":
            raise Err(NodeError_InvalidInput("mode invalid: asked to refuse"))
        if mode == "throw":
            raise Err(NodeError_Failed("boom"))
        if mode == "spin":
            while True:
                pass
        if mode == "oom":
            held = []
            while True:
                held.append(bytearray(16 << 20))
        if mode == "bad":
            return plan(vars={"_runtime": {}})
        raise Err(NodeError_InvalidInput(f"unknown mode {mode!r}"))
