// Types of stepwell's JavaScript guest SDK (stepwell.js), for TypeScript
// and for editors. The WIT types they wrap are those of crates/wasm/wit
// (world `node`): records with camelCase fields, options as `undefined`.

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A point in time, UTC. */
export class Time {
  constructor(seconds: number | bigint, nanoseconds: number);
  readonly seconds: number;
  readonly nanoseconds: number;
  /** RFC 3339 in UTC with microseconds (`2026-12-02T08:00:00.123456Z`). */
  toRFC3339(): string;
  /** A `Date` (milliseconds). */
  toDate(): Date;
}

/** What the host passes to a node handler for one step of a run. */
export class Input {
  readonly runId: string;
  readonly workflowId: string;
  readonly nodeId: string;
  /** The node's static config (`null` when absent). */
  readonly config: Json;
  /** The run's vars. */
  readonly vars: { [key: string]: Json };
  /** The current time, chosen by the host. */
  readonly now: Time;
  /** 1 for the first attempt of this step. */
  readonly attempt: number;
  varStr(key: string): string | undefined;
  varPath(path: string): Json | undefined;
  configField(key: string): Json | undefined;
}

/** A request for the host to do something durable. */
export class Effect {
  constructor(kind: string, payload?: { [key: string]: Json });
  readonly kind: string;
  readonly payload: { [key: string]: Json };
  resultKey: string | undefined;
  /** Where the result goes in the vars (a dotted path). */
  into(key: string): Effect;
  static askUser(prompt: string, choices?: string[]): Effect;
  static waitUntil(until: string | { seconds: number }): Effect;
  static waitEvent(waitKey: string): Effect;
  static emitEvent(name: string, payload?: Json): Effect;
  static startSubworkflow(workflowId: string, vars?: { [key: string]: Json }): Effect;
}

/** What a node handler returns. */
export class Plan {
  static follow(): Plan;
  static goto(node: string): Plan;
  static complete(output: Json): Plan;
  set(key: string, value: Json): Plan;
  withEffect(effect: Effect): Plan;
}

/** Why a node could not make a plan (throw it). */
export class NodeError extends Error {
  readonly tag: 'invalid-input' | 'failed';
  static invalid(message: string): NodeError;
  static failed(message: string): NodeError;
}

/** The `handle` export of a node whose handler is `handler`. */
export function node(handler: (input: Input) => Plan): (input: unknown) => unknown;

/** What a node declares it expects (every key optional). */
export interface Description {
  /** What the node does. */
  description?: string;
  /** The vars it reads: name → what it holds. */
  vars?: { [name: string]: string };
  /** Its config fields: name → what it holds. */
  config?: { [name: string]: string };
  /** The route labels it may return. */
  routes?: string[];
}

/**
 * Declares what this node expects, for `stepwell inspect` and for flow
 * loading (scripts/build-js-guest writes it into the component). Call it
 * once, at the top level of the node's module.
 */
export function describe(description: Description): Description;

/** What `describe` was given, if it was called. */
export function declared(): Description | undefined;
