"""The stepwell `hello` node, written in Python with the SDK
(guest-sdk-py/stepwell.py): greets `vars.name` (or "World") by completing
the run with `{"message": "Hello, <name>!", "language": "python"}`.

Built into a WebAssembly component (`flows/examples/hello-py/greet.wasm`) by
`scripts/build-python-guest`, which runs componentize-py against the `node`
world in `crates/wasm/wit/` with the SDK on the module path:

    componentize-py -d crates/wasm/wit -w node componentize app -p flows/examples/hello-py/greet -p guest-sdk-py -o flows/examples/hello-py/greet.wasm
"""

from stepwell import Plan, describe, node

describe({
    "description": "Greets vars.name.",
    "vars": {"name": "who to greet (text, default World)"},
})


@node
def WitWorld(input):
    name = input.var_str("name") or "World"
    return Plan.complete({"message": f"Hello, {name}!", "language": "python"})
