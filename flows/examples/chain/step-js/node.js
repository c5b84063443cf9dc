// One link of the benchmark's chain, written in JavaScript: counts the step
// in `vars.i` and follows the node's `next` route; a node whose config says
// `{"last": true}` completes the run with `{"steps": i}`. The same node as
// flows/examples/chain/step (Rust), step-c and step-py.
//
// Built into flows/examples/chain/step-js.wasm by scripts/build-js-guest.
import { describe, node, Plan } from '../../../../guest-sdk-js/stepwell.js';

describe({
  description: 'One link of a chain: counts itself in vars.i.',
  vars: { i: 'the steps taken so far (a number, default 0)' },
  config: { last: "true on the chain's last node: complete the run" },
});

export const handle = node((input) => {
  const v = input.vars.i;
  const i = (Number.isSafeInteger(v) && v >= 0 ? v : 0) + 1;
  if (input.configField('last') === true) {
    return Plan.complete({ steps: i });
  }
  return Plan.follow().set('i', i);
});
