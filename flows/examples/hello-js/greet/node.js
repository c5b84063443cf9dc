// The stepwell `hello` node, written in JavaScript: greets `vars.name` (or
// "World") by completing the run with
// `{"message": "Hello, <name>!", "language": "javascript"}`.
//
// Built into flows/examples/hello-js/greet.wasm by scripts/build-js-guest.
import { node, Plan } from '../../../../guest-sdk-js/stepwell.js';

export const handle = node((input) => {
  const name = input.varStr('name') ?? 'World';
  return Plan.complete({ message: `Hello, ${name}!`, language: 'javascript' });
});
