// Builds ranker.js into a component: `node build.mjs [out.wasm]`.
//
// componentize-js is called through its JavaScript API (the jco CLI's
// `componentize` command fails here), with every optional runtime feature off:
// the result is a "pure" component that imports only poolgate's host interface,
// no WASI. Never enable AOT (weval): it downloads a binary at build time.
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
// The skeleton's entry writer (poolgate plugin new copies it): exceptions
// name their message and line, in every export.
import { writeEntry } from '../../../host/src/cli/templates/js/entry.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? resolve(here, '../../../target/examples/js/reset-soonest-js.wasm'));
const witPath = resolve(process.env.POOLGATE_WIT ?? resolve(here, '../../../wit'));

// The entry goes beside the sources, not beside `out`: componentize-js
// loads modules only from under the entry's tree, and `out` may be anywhere
// (a CARGO_TARGET_DIR outside the checkout).
const entry = resolve(here, 'build', 'entry.js');
await mkdir(dirname(entry), { recursive: true });
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
