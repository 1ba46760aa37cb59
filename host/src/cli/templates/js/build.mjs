// Builds target/{{name}}.wasm with componentize-js's JavaScript API. Every
// optional runtime feature is off, so the component imports no WASI. Never
// enable AOT (weval): it downloads a binary at build time.
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, 'target/{{name}}.wasm');
const { component } = await componentize({
  sourcePath: resolve(here, 'ranker.js'),
  witPath: resolve(here, 'wit'),
  worldName: 'policy',
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
});
await mkdir(dirname(out), { recursive: true });
await writeFile(out, component);
console.log(out);
