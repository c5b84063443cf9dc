// Writes what a JavaScript node declares (`describe({...})` in its module)
// into its built component, as the `stepwell:node` custom section that
// `stepwell inspect` and flow loading read. Run by scripts/build-js-guest:
//
//     node guest-sdk-js/declare.mjs NODE.js COMPONENT.wasm
//
// It loads the node's module in Node.js (its top level runs; its handler is
// not called), then appends the section to the component. A module that
// declares nothing leaves the component as it is.
import { appendFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const MAX_DESCRIPTION = 64 * 1024;
const [source, component] = process.argv.slice(2);
if (!source || !component) {
  console.error('usage: node declare.mjs NODE.js COMPONENT.wasm');
  process.exit(2);
}

const sdk = await import(new URL('./stepwell.js', import.meta.url));
await import(pathToFileURL(resolve(source)));
const description = sdk.declared();
if (description !== undefined) {
  const json = JSON.stringify(description);
  // JSON.stringify escapes a lone surrogate, which the host's parser refuses.
  const lone = (s) => typeof s === 'string' && /[\uD800-\uDFFF]/u.test(s);
  JSON.parse(json, (k, v) => {
    if (lone(k) || lone(v)) {
      console.error(`${source}: what describe() declares holds a lone surrogate, which UTF-8 cannot carry`);
      process.exit(1);
    }
    return v;
  });
  const text = Buffer.from(json);
  if (text.length > MAX_DESCRIPTION) {
    console.error(`${source}: the description is ${text.length} bytes, more than ${MAX_DESCRIPTION}`);
    process.exit(1);
  }
  const name = Buffer.from('stepwell:node');
  const body = Buffer.concat([leb128(name.length), name, text]);
  // A custom section (id 0) may come anywhere in a component: last, here.
  appendFileSync(component, Buffer.concat([Buffer.from([0]), leb128(body.length), body]));
}

/** `n` as unsigned LEB128. */
function leb128(n) {
  const out = [];
  do {
    let byte = n & 0x7f;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return Buffer.from(out);
}
