// The stepwell `hello` node, written in JavaScript: greets `vars.name` (or
// "World") by completing the run with
// `{"message": "Hello, <name>!", "language": "javascript"}`.
//
// Built into flows/examples/hello-js/greet.wasm by scripts/build-js-guest.
import { describe, node, Plan } from '../../../../guest-sdk-js/stepwell.js';

describe({
  description: 'Greets vars.name.',
  vars: { name: 'who to greet (text, default World)' },
});

export const handle = node((input) => {
  const name = input.varStr('name') ?? 'World';
  return Plan.complete({ message: `Hello, ${name}!`, language: 'javascript' });
});
