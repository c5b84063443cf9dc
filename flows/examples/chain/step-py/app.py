"""One link of the benchmark's chain, written in Python: counts the step in
`vars.i` and follows the node's `next` route; a node whose config says
`{"last": true}` completes the run with `{"steps": i}`. The same node as
flows/examples/chain/step (Rust), step-c and step-js.

Built into flows/examples/chain/step-py.wasm by scripts/build-python-guest."""

from stepwell import Plan, describe, node

describe({
    "description": "One link of a chain: counts itself in vars.i.",
    "vars": {"i": "the steps taken so far (a number, default 0)"},
    "config": {"last": "true on the chain's last node: complete the run"},
})


@node
def WitWorld(input):
    i = input.vars.get("i")
    i = (i if isinstance(i, int) and not isinstance(i, bool) and i >= 0 else 0) + 1
    if input.config_field("last") is True:
        return Plan.complete({"steps": i})
    return Plan.follow().set("i", i)
