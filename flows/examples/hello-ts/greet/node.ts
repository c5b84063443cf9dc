// The stepwell `hello` node, written in TypeScript: greets `vars.name` (or
// "World") by completing the run with
// `{"message": "Hello, <name>!", "language": "typescript"}`.
//
// scripts/build-js-guest type-checks it against guest-sdk-js/stepwell.d.ts,
// compiles it with tsc and builds flows/examples/hello-ts/greet.wasm.
import { describe, node, Plan, type Input } from '../../../../guest-sdk-js/stepwell.js';

describe({
  description: 'Greets vars.name.',
  vars: { name: 'who to greet (text, default World)' },
});

export const handle = node((input: Input): Plan => {
  const name: string = input.varStr('name') ?? 'World';
  return Plan.complete({ message: `Hello, ${name}!`, language: 'typescript' });
});
