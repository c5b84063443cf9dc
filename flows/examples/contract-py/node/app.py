"""A Python node for the contract's behaviours, written with the SDK
(guest-sdk-py/stepwell.py): what it does is chosen by `vars.mode`
(tests/cli.rs runs each and checks the host's typed outcome), as
flows/examples/contract-js does in JavaScript. Built by
scripts/build-python-guest with componentize-py."""

import os

from stepwell import Effect, NodeError, Plan, node


@node
def WitWorld(input):
    mode = input.var_str("mode")
    value = input.vars.get("value")
    if mode == "complete":
        output = {"echo": value, "node": input.node_id, "attempt": input.attempt, "now": input.now_rfc3339()}
        return Plan.complete(output)
    if mode == "next":
        return Plan.goto("end").set("seen", True if value is None else value)
    if mode == "follow":
        return Plan.follow().set("seen", "followed")
    if mode == "ask":
        return Plan.follow().with_effect(Effect.ask_user("Your name?").into("answer"))
    if mode == "wait":
        return Plan.follow().with_effect(Effect.wait_until({"seconds": 60}))
    if mode == "invalid":
        raise NodeError.invalid("mode invalid: asked to refuse")
    if mode == "throw":
        raise TypeError("boom")
    if mode == "trap":
        os.abort()
    if mode == "spin":
        while True:
            pass
    if mode == "oom":
        held = []
        while True:
            held.append(bytearray(16 << 20))
    if mode == "bad":
        return Plan.follow().set("_runtime", {})
    raise NodeError.invalid(f"unknown mode {mode!r}")
