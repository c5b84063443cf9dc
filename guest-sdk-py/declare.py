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


def names_for_describe(tree):
    """The ways the module can call the SDK's `describe`: the names it
    imported it as (`from stepwell import describe [as d]`) and the
    `<module>.describe` of `import stepwell [as s]`."""
    plain, modules = set(), set()
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "stepwell":
            plain.update(a.asname or a.name for a in stmt.names if a.name == "describe")
        elif isinstance(stmt, ast.Import):
            modules.update(a.asname or a.name for a in stmt.names if a.name == "stepwell")
    return plain, modules


def is_describe(call, plain, modules):
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in plain
    return isinstance(f, ast.Attribute) and f.attr == "describe" and (
        isinstance(f.value, ast.Name) and f.value.id in modules
    )


def declared(path):
    """The literal given to the top-level `describe(...)` of `path`, or None."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    plain, modules = names_for_describe(tree)
    found = None
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
        if not isinstance(call, ast.Call) or not is_describe(call, plain, modules):
            continue
        where = f"{path}:{stmt.lineno}"
        if found is not None:
            sys.exit(f"{where}: describe() is called once per node")
        if len(call.args) != 1 or call.keywords:
            sys.exit(f"{where}: describe() takes one dict")
        try:
            found = ast.literal_eval(call.args[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            sys.exit(f"{where}: describe() needs a literal dict (it is read, not run)")
        if not isinstance(found, dict):
            sys.exit(f"{where}: describe() takes one dict")
        try:
            json.dumps(found, allow_nan=False, ensure_ascii=False).encode()
        except (TypeError, ValueError, UnicodeEncodeError) as e:
            sys.exit(f"{where}: describe()'s dict has no JSON form: {e}")
    if found is None and (plain or modules):
        # Imported, never called at the top level (inside an `if`, a function).
        print(f"{path}: describe is imported but not called at the top level: nothing declared",
              file=sys.stderr)
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
    text = json.dumps(description, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if len(text) > MAX_DESCRIPTION:
        sys.exit(f"{source}: the description is {len(text)} bytes, more than {MAX_DESCRIPTION}")
    name = b"stepwell:node"
    body = leb128(len(name)) + name + text
    # A custom section (id 0) may come anywhere in a component: last, here.
    with open(component, "ab") as f:
        f.write(b"\0" + leb128(len(body)) + body)


if __name__ == "__main__":
    main()
