// stepwell's JavaScript guest SDK: write a node handler as one function from
// an `Input` to a `Plan`, and export it as the `node` world's `handle`:
//
//     import { node, Plan } from '<path to>/guest-sdk-js/stepwell.js';
//
//     export const handle = node((input) => {
//       const name = input.varStr('name') ?? 'World';
//       return Plan.complete({ message: `Hello, ${name}!` });
//     });
//
// `scripts/build-js-guest` builds such a file into a WebAssembly component
// with componentize-js (a JavaScript engine inside the component). The
// handler must be pure: everything it needs is in its input (the time too,
// `input.now`); everything it wants done is in its plan. The sandbox gives
// no network, no files, no environment; its clocks read the Unix epoch and
// its random source is a stream seeded per step (docs/nodes-js.md).

/** A point in time, UTC: seconds and nanoseconds since the Unix epoch. */
export class Time {
  constructor(seconds, nanoseconds) {
    /** Whole seconds since 1970-01-01T00:00:00Z (a Number). */
    this.seconds = Number(seconds);
    /** Nanoseconds past `seconds`. */
    this.nanoseconds = nanoseconds;
  }

  /** RFC 3339 in UTC with microseconds, the form the host writes times in. */
  toRFC3339() {
    const whole = new Date(this.seconds * 1000).toISOString().slice(0, 19);
    const micros = String(Math.floor(Math.min(this.nanoseconds, 999999999) / 1000));
    return `${whole}.${micros.padStart(6, '0')}Z`;
  }

  /** A `Date` (milliseconds: the microseconds are cut). */
  toDate() {
    return new Date(this.seconds * 1000 + Math.floor(this.nanoseconds / 1e6));
  }

  toString() {
    return this.toRFC3339();
  }
}

/** What the host passes to a node handler for one step of a run. */
export class Input {
  constructor(raw, config, vars) {
    /** The id of the run being executed. */
    this.runId = raw.runId;
    /** The id of the run's workflow. */
    this.workflowId = raw.workflowId;
    /** The id of the node being executed. */
    this.nodeId = raw.nodeId;
    /** The node's static `config` from the flow document (`null` when absent). */
    this.config = config;
    /** The run's vars (an object). */
    this.vars = vars;
    /** The current time, chosen by the host (the step's `started_at`). */
    this.now = new Time(raw.now.seconds, raw.now.nanoseconds);
    /** 1 for the first attempt of this step. */
    this.attempt = raw.attempt;
  }

  /** The var `key` if it is a string, else `undefined`. */
  varStr(key) {
    const v = this.vars[key];
    return typeof v === 'string' ? v : undefined;
  }

  /** The value at dotted `path` of the vars (`a.b.0`), or `undefined`. */
  varPath(path) {
    let v = this.vars;
    for (const part of path.split('.')) {
      if (v === null || typeof v !== 'object' || !Object.hasOwn(v, part)) return undefined;
      v = v[part];
    }
    return v;
  }

  /** The field `key` of the node's config, or `undefined`. */
  configField(key) {
    const c = this.config;
    return c !== null && typeof c === 'object' && Object.hasOwn(c, key) ? c[key] : undefined;
  }
}

/** A request for the host to do something durable (docs/flows.md lists every kind). */
export class Effect {
  constructor(kind, payload = {}) {
    this.kind = kind;
    this.payload = payload;
    this.resultKey = undefined;
  }

  /** Where the result (or a resumed wait's payload) goes in the vars: a dotted path. */
  into(key) {
    this.resultKey = key;
    return this;
  }

  /** Ask a person: the run waits until it is answered. */
  static askUser(prompt, choices) {
    return new Effect('ask_user', choices ? { prompt, choices } : { prompt });
  }

  /** Wait until a time (RFC 3339), or for `{seconds: n}`. */
  static waitUntil(until) {
    return new Effect('wait_until', typeof until === 'string' ? { until } : until);
  }

  /** Wait for the event with this key. */
  static waitEvent(waitKey) {
    return new Effect('wait_event', { wait_key: waitKey });
  }

  /** Emit an event (its listeners are resumed with `payload`). */
  static emitEvent(name, payload = {}) {
    return new Effect('emit_event', { name, payload });
  }

  /** Start a child run of `workflowId` with `vars`, and wait for its output. */
  static startSubworkflow(workflowId, vars = {}) {
    return new Effect('start_subworkflow', { workflow_id: workflowId, vars });
  }
}

/** What a node handler returns: what should happen next. */
export class Plan {
  constructor() {
    this.vars = undefined;
    this.effect = undefined;
    this.nextNode = undefined;
    this.completeOutput = undefined;
  }

  /** Follow the node's `next` route from the flow document. */
  static follow() {
    return new Plan();
  }

  /** Go to `node` next: a node id, or a label of this node's `routes`. */
  static goto(node) {
    const p = new Plan();
    p.nextNode = node;
    return p;
  }

  /** Finish the run with `output` (any JSON value). */
  static complete(output) {
    const p = new Plan();
    p.completeOutput = output === undefined ? null : output;
    return p;
  }

  /** Set var `key` to `value` (`null` removes it). */
  set(key, value) {
    if (this.vars === undefined) this.vars = {};
    this.vars[key] = value === undefined ? null : value;
    return this;
  }

  /** Ask the host for `effect` before moving on. */
  withEffect(effect) {
    this.effect = effect;
    return this;
  }
}

/** Why a node could not make a plan: throw one from a handler. */
export class NodeError extends Error {
  constructor(tag, message) {
    super(message);
    this.tag = tag;
  }

  /** The input is not what the node needs: retrying will not help. */
  static invalid(message) {
    return new NodeError('invalid-input', message);
  }

  /** The node failed for another reason. */
  static failed(message) {
    return new NodeError('failed', message);
  }
}

/** `text` parsed as JSON, or a `NodeError.invalid` naming `what`. */
function parsed(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw NodeError.invalid(`${what} is not JSON: ${e.message}`);
  }
}

/** `value` as JSON text (`undefined` stays none); `what` names it in the
 * error when it has no JSON form (a function, a symbol, a BigInt, a cycle). */
function text(value, what) {
  if (value === undefined) return undefined;
  let out;
  try {
    // JSON.stringify escapes a lone surrogate (`\ud800`), which the host's
    // parser refuses: name it here instead.
    out = JSON.stringify(value, function (key, v) {
      if (LONE_SURROGATE.test(key) || (typeof v === 'string' && LONE_SURROGATE.test(v))) {
        throw NodeError.failed(`${what} holds a lone surrogate, which UTF-8 cannot carry`);
      }
      return v;
    });
  } catch (e) {
    if (e instanceof NodeError) throw e;
    throw NodeError.failed(`${what} cannot be written as JSON: ${e.message}`);
  }
  if (out === undefined) {
    throw NodeError.failed(`${what} cannot be written as JSON (a ${typeof value})`);
  }
  return checked(out, what);
}

/** A UTF-16 surrogate not part of a pair (in `u` mode a pair is one code
 * point, so only a lone one matches). */
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

/** A string for the host: `value` when it is one, with no lone surrogate
 * (which UTF-8 cannot carry), else a `NodeError.failed` naming `what`. */
function checked(value, what) {
  if (typeof value !== 'string') {
    throw NodeError.failed(`${what} must be a string, not ${value === null ? 'null' : typeof value}`);
  }
  if (LONE_SURROGATE.test(value)) {
    throw NodeError.failed(`${what} holds a lone surrogate, which UTF-8 cannot carry`);
  }
  return value;
}

/** `value` checked as a string when it is there. */
function optional(value, what) {
  return value === undefined || value === null ? undefined : checked(value, what);
}

/** The WIT `step-plan` of `plan`. */
function stepPlan(plan) {
  if (!(plan instanceof Plan)) {
    throw NodeError.failed('the handler returned something that is not a Plan');
  }
  const e = plan.effect;
  let effect;
  if (e !== undefined && e !== null) {
    effect = {
      kind: checked(e.kind, 'the effect kind'),
      payload: text(e.payload ?? {}, 'the effect payload'),
      resultKey: optional(e.resultKey, 'the effect result key'),
    };
  }
  return {
    vars: text(plan.vars, 'the vars'),
    effect,
    nextNode: optional(plan.nextNode, 'the next node'),
    completeOutput: text(plan.completeOutput, 'the output'),
  };
}

/** The WIT `node-error` of `e`, a `NodeError`: its tag when it is one of
 * the two, else `failed`; its message as text the host can carry. */
function nodeError(e) {
  const tag = e.tag === 'invalid-input' ? 'invalid-input' : 'failed';
  return { tag, val: String(e.message).replace(/[\uD800-\uDFFF]/gu, '\uFFFD') };
}

/**
 * The `handle` export of a node whose handler is `handler`, a function
 * from an `Input` to a `Plan`. What it throws becomes the step's error: a
 * `NodeError` as it says, anything else as `failed`.
 */
export function node(handler) {
  return function handle(raw) {
    try {
      const config = raw.config === undefined || raw.config === null ? null : parsed(raw.config, 'config');
      const vars = parsed(raw.vars, 'vars');
      if (vars === null || typeof vars !== 'object' || Array.isArray(vars)) {
        throw NodeError.invalid('vars is not an object');
      }
      return stepPlan(handler(new Input(raw, config, vars)));
    } catch (e) {
      let error;
      try {
        error = e instanceof NodeError ? nodeError(e) : nodeError({ message: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
      } catch {
        error = nodeError({ message: 'the handler threw a value that cannot be written as text' });
      }
      throw error;
    }
  };
}

// What `describe` was given, on `globalThis`: the build script reads it
// through whichever copy of this module it loads.
const DESCRIBED = Symbol.for('stepwell.described');

/**
 * Declares what this node expects, for `stepwell inspect` and for flow
 * loading: `description` (text), `vars` and `config` (name → what it
 * holds), `routes` (the route labels the node may return), all optional.
 * Call it once, at the top level of the node's module:
 *
 *     describe({ vars: { name: 'who to greet' }, routes: ['done'] });
 *
 * `scripts/build-js-guest` loads the module in Node.js after building it,
 * reads what was declared, and writes it into the component's
 * `stepwell:node` custom section. Returns `description`.
 */
export function describe(description) {
  if (description === null || typeof description !== 'object' || Array.isArray(description)) {
    throw new TypeError('describe() takes one object');
  }
  if (globalThis[DESCRIBED] !== undefined) {
    throw new Error('describe() is called once per node');
  }
  globalThis[DESCRIBED] = JSON.parse(JSON.stringify(description));
  return description;
}

/** What `describe` was given, if it was called (for the build script). */
export function declared() {
  return globalThis[DESCRIBED];
}
