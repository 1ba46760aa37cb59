// Builds build/{{name}}.wasm with componentize-js's JavaScript API. Every
// optional runtime feature is off, so the component imports no WASI. Never
// enable AOT (weval): it downloads a binary at build time. The component's
// entry is build/entry.js (entry.mjs says why): exceptions name their cause.
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeEntry } from './entry.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, 'build/{{name}}.wasm');
const entry = resolve(here, 'build/entry.js');
const witPath = resolve(here, 'wit');
await mkdir(dirname(out), { recursive: true });
await writeEntry(entry, resolve(here, 'ranker.js'), witPath);
const { component } = await componentize({
  sourcePath: entry,
  witPath,
  worldName: 'policy',
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
});
await writeFile(out, component);
console.log(out);
