"""stepwell's Python guest SDK: write a node handler as one function from an
`Input` to a `Plan`, and make it the `node` world's export:

    from stepwell import Plan, node

    @node
    def handle(input):
        name = input.var_str("name") or "World"
        return Plan.complete({"message": f"Hello, {name}!"})

    WitWorld = handle

`scripts/build-python-guest` builds such an `app.py` into a WebAssembly
component with componentize-py (a Python interpreter inside the component),
with this directory on the module path. The handler must be pure: everything
it needs is in its input (the time too, `input.now`); everything it wants
done is in its plan (docs/nodes-python.md).
"""

import json
from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def describe(description):
    """Declares what this node expects, for `stepwell inspect` and for flow
    loading: `description` (text), `vars` and `config` (name -> what it
    holds), `routes` (the route labels the node may return), all optional.
    Call it once, at the top level of `app.py`, with a literal dict:

        describe({"vars": {"name": "who to greet"}, "routes": ["done"]})

    `scripts/build-python-guest` reads that literal from the source (without
    running it) and writes it into the component's `stepwell:node` custom
    section. Returns `description`."""
    if not isinstance(description, dict):
        raise TypeError("describe() takes one dict")
    return description


class NodeError(Exception):
    """Why a node could not make a plan: raise one from a handler."""

    def __init__(self, tag, message):
        super().__init__(message)
        self.tag = tag
        self.message = message

    @staticmethod
    def invalid(message):
        """The input is not what the node needs: retrying will not help."""
        return NodeError("invalid-input", message)

    @staticmethod
    def failed(message):
        """The node failed for another reason."""
        return NodeError("failed", message)


class Input:
    """What the host passes to a node handler for one step of a run."""

    def __init__(self, raw, config, vars):
        self.run_id = raw.run_id
        self.workflow_id = raw.workflow_id
        self.node_id = raw.node_id
        #: The node's static `config` from the flow document (None when absent).
        self.config = config
        #: The run's vars (a dict).
        self.vars = vars
        #: The current time (UTC), chosen by the host: the step's `started_at`.
        self.now = _EPOCH + timedelta(
            seconds=raw.now.seconds, microseconds=raw.now.nanoseconds // 1000
        )
        #: 1 for the first attempt of this step.
        self.attempt = raw.attempt

    def var_str(self, key):
        """The var `key` if it is a string, else None."""
        v = self.vars.get(key)
        return v if isinstance(v, str) else None

    def var_path(self, path):
        """The value at dotted `path` of the vars (`a.b.0`), or None."""
        v = self.vars
        for part in path.split("."):
            if isinstance(v, dict) and part in v:
                v = v[part]
            elif isinstance(v, list) and (i := _index(part)) is not None and i < len(v):
                v = v[i]
            else:
                return None
        return v

    def config_field(self, key):
        """The field `key` of the node's config, or None."""
        return self.config.get(key) if isinstance(self.config, dict) else None

    def now_rfc3339(self):
        """The time as RFC 3339 in UTC with microseconds, as the host writes times."""
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _index(part):
    """`part` as a list index: ASCII digits, no leading zero; else None."""
    if part.isascii() and part.isdigit() and (part == "0" or not part.startswith("0")):
        return int(part)
    return None


class Effect:
    """A request for the host to do something durable (docs/flows.md lists every kind)."""

    def __init__(self, kind, payload=None, result_key=None):
        self.kind = kind
        self.payload = {} if payload is None else payload
        self.result_key = result_key

    def into(self, key):
        """Where the result (or a resumed wait's payload) goes in the vars: a dotted path."""
        self.result_key = key
        return self

    @staticmethod
    def ask_user(prompt, choices=None):
        """Ask a person: the run waits until it is answered."""
        return Effect("ask_user", {"prompt": prompt, "choices": choices} if choices else {"prompt": prompt})

    @staticmethod
    def wait_until(until):
        """Wait until a time (RFC 3339 text), or for `{"seconds": n}`."""
        return Effect("wait_until", {"until": until} if isinstance(until, str) else until)

    @staticmethod
    def wait_event(wait_key):
        """Wait for the event with this key."""
        return Effect("wait_event", {"wait_key": wait_key})

    @staticmethod
    def emit_event(name, payload=None):
        """Emit an event (its listeners are resumed with `payload`)."""
        return Effect("emit_event", {"name": name, "payload": {} if payload is None else payload})

    @staticmethod
    def start_subworkflow(workflow_id, vars=None):
        """Start a child run of `workflow_id` with `vars`, and wait for its output."""
        return Effect("start_subworkflow", {"workflow_id": workflow_id, "vars": {} if vars is None else vars})


_UNSET = object()


class Plan:
    """What a node handler returns: what should happen next."""

    def __init__(self):
        self.vars = None
        self.effect = None
        self.next_node = None
        self.complete_output = _UNSET

    @staticmethod
    def follow():
        """Follow the node's `next` route from the flow document."""
        return Plan()

    @staticmethod
    def goto(node):
        """Go to `node` next: a node id, or a label of this node's `routes`."""
        p = Plan()
        p.next_node = node
        return p

    @staticmethod
    def complete(output):
        """Finish the run with `output` (any JSON value)."""
        p = Plan()
        p.complete_output = output
        return p

    def set(self, key, value):
        """Set var `key` to `value` (None removes it)."""
        if self.vars is None:
            self.vars = {}
        self.vars[key] = value
        return self

    def with_effect(self, effect):
        """Ask the host for `effect` before moving on."""
        self.effect = effect
        return self


def _text(value, what):
    """`value` as a string the host can carry (UTF-8), else a `NodeError`."""
    if not isinstance(value, str):
        raise NodeError.failed(f"{what} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise NodeError.failed(f"{what} holds a lone surrogate, which UTF-8 cannot carry")
    return value


def _json(value, what):
    """`value` as JSON text, else a `NodeError` naming `what` (NaN and the
    infinities have no JSON form)."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise NodeError.failed(f"{what} cannot be written as JSON: {e}")
    return _text(text, what)


def _message(value):
    """An error message the host can carry (a fixed text when `value` cannot
    be written as one)."""
    try:
        return str(value).encode("utf-8", "replace").decode("utf-8")
    except BaseException:
        return "the node failed with an error that cannot be written as text"


def _described(e):
    """`<type>: <message>` of exception `e`, or a fixed text if its `__str__` fails."""
    try:
        return f"{type(e).__name__}: {e}"
    except BaseException:
        return f"{type(e).__name__}: (its message cannot be written as text)"


def _parsed(text, what):
    try:
        return json.loads(text)
    except ValueError as e:
        raise NodeError.invalid(f"{what} is not JSON: {e}")


def node(handler):
    """The `WitWorld` class componentize-py exports for a node whose handler
    is `handler`, a function from an `Input` to a `Plan`. A `NodeError` it
    raises is the step's error as it says; any other exception is `failed`."""
    import wit_world
    from componentize_py_types import Err
    from wit_world.imports import types

    def to_wit(plan):
        if not isinstance(plan, Plan):
            raise NodeError.failed("the handler returned something that is not a Plan")
        e = plan.effect
        effect = None
        if e is not None:
            key = None if e.result_key is None else _text(e.result_key, "the effect result key")
            kind = _text(e.kind, "the effect kind")
            effect = types.Effect(kind, _json(e.payload, "the effect payload"), key)
        done = plan.complete_output is not _UNSET
        return types.StepPlan(
            vars=None if plan.vars is None else _json(plan.vars, "the vars"),
            effect=effect,
            next_node=None if plan.next_node is None else _text(plan.next_node, "the next node"),
            complete_output=_json(plan.complete_output, "the output") if done else None,
        )

    def handle(self, raw):
        try:
            config = None if raw.config is None else _parsed(raw.config, "config")
            vars = _parsed(raw.vars, "vars")
            if not isinstance(vars, dict):
                raise NodeError.invalid("vars is not an object")
            return to_wit(handler(Input(raw, config, vars)))
        except NodeError as e:
            if e.tag == "invalid-input":
                raise Err(types.NodeError_InvalidInput(_message(e.message)))
            raise Err(types.NodeError_Failed(_message(e.message)))
        except Err:
            raise
        except BaseException as e:  # SystemExit too: a node has no process to end
            raise Err(types.NodeError_Failed(_message(_described(e))))

    return type("WitWorld", (wit_world.WitWorld,), {"handle": handle})
