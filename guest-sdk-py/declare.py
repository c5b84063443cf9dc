"""Writes what a Python node declares (a top-level `describe({...})` call in
its `app.py`, with a literal dict) into its built component, as the
`stepwell:node` custom section that `stepwell inspect` and flow loading
read. Run by scripts/build-python-guest:

    python3 guest-sdk-py/declare.py APP.py COMPONENT.wasm

The source is parsed, not run: the dict must be a literal (strings,
numbers, lists, dicts). A module that declares nothing leaves the component
as it is."""

import ast
import json
import sys

MAX_DESCRIPTION = 64 * 1024


def declared(path):
    """The literal given to the top-level `describe(...)` of `path`, or None."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = None
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if name != "describe":
            continue
        if found is not None:
            sys.exit(f"{path}:{stmt.lineno}: describe() is called once per node")
        if len(call.args) != 1 or call.keywords:
            sys.exit(f"{path}:{stmt.lineno}: describe() takes one dict")
        try:
            found = ast.literal_eval(call.args[0])
        except ValueError:
            sys.exit(f"{path}:{stmt.lineno}: describe() needs a literal dict (it is read, not run)")
        if not isinstance(found, dict):
            sys.exit(f"{path}:{stmt.lineno}: describe() takes one dict")
    return found


def leb128(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: declare.py APP.py COMPONENT.wasm")
    source, component = sys.argv[1:]
    description = declared(source)
    if description is None:
        return
    text = json.dumps(description, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > MAX_DESCRIPTION:
        sys.exit(f"{source}: the description is {len(text)} bytes, more than {MAX_DESCRIPTION}")
    name = b"stepwell:node"
    body = leb128(len(name)) + name + text
    # A custom section (id 0) may come anywhere in a component: last, here.
    with open(component, "ab") as f:
        f.write(b"\0" + leb128(len(body)) + body)


if __name__ == "__main__":
    main()
