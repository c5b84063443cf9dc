// A JavaScript node for the contract's behaviours: what it does is chosen by
// `vars.mode` (tests/cli.rs runs each and checks the host's typed outcome).
import { node, Plan, Effect, NodeError } from '../../../../guest-sdk-js/stepwell.js';

// JavaScript cannot trap on purpose: mode `trap` answers, past the SDK, a
// value the component's glue cannot lower into a step plan, which traps.
export const handle = (raw) => (JSON.parse(raw.vars).mode === 'trap' ? { nextNode: 42 } : act(raw));

const act = node((input) => {
  const mode = input.varStr('mode');
  switch (mode) {
    case 'complete':
      return Plan.complete({ echo: input.vars.value ?? null, node: input.nodeId, attempt: input.attempt, now: input.now.toRFC3339() });
    case 'next':
      return Plan.goto('end').set('seen', input.vars.value ?? true);
    case 'follow':
      return Plan.follow().set('seen', 'followed');
    case 'ask':
      return Plan.follow().withEffect(Effect.askUser('Your name?').into('answer'));
    case 'wait':
      return Plan.follow().withEffect(Effect.waitUntil({ seconds: 60 }));
    case 'invalid':
      throw NodeError.invalid('mode invalid: asked to refuse');
    case 'throw':
      throw new TypeError('boom');
    case 'spin':
      for (;;) {}
    case 'oom': {
      const held = [];
      for (;;) held.push(new Uint8Array(16 << 20).fill(1));
    }
    case 'bad':
      return Plan.follow().set('_runtime', {});
    default:
      throw NodeError.invalid(`unknown mode ${JSON.stringify(mode)}`);
  }
});
