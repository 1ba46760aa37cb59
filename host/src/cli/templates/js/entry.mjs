// Writes the component's entry module: it imports the ranker and wraps each
// export so that an exception says what and where. From `rank` and
// `configure` a thrown Error becomes the `err` poolgate records ("TypeError: x
// is null at rank (ranker.js:17:5)") rather than a bare trap; `observe` has no
// error to return, so it logs the same line at error level before it traps,
// and poolgate puts that line in the recorded cause. Written by `poolgate
// plugin new`; build.mjs calls it.
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, relative, join } from 'node:path';

export async function writeEntry(entry, ranker, witDir) {
  const wit = await readFile(join(witDir, 'policy.wit'), 'utf8');
  const version = /package\s+poolgate:policy@([^;\s]+)/.exec(wit)?.[1];
  if (!version) throw new Error(`${witDir}/policy.wit declares no poolgate:policy version`);
  let from = relative(dirname(entry), ranker);
  if (!from.startsWith('.')) from = `./${from}`;
  await writeFile(entry, `import { log } from 'poolgate:policy/host@${version}';
import { ranker as impl } from ${JSON.stringify(from)};

function explain(e) {
  if (!(e instanceof Error)) return String(e);
  const frames = String(e.stack || '').split('\\n')
    .filter((f) => f && !f.includes(${JSON.stringify(entry.split('/').pop())}) && !f.includes('initializer.js'))
    .slice(0, 4)
    .map((f) => {
      const at = f.lastIndexOf('@');
      return at < 0 ? f : \`\${f.slice(0, at) || '<anonymous>'} (\${f.slice(at + 1).replace(/^.*\\//, '')})\`;
    });
  return frames.length ? \`\${e.name}: \${e.message} at \${frames.join(' < ')}\` : \`\${e.name}: \${e.message}\`;
}

export const ranker = {
  configure(config, pool) {
    try { return impl.configure(config, pool); } catch (e) { throw explain(e); }
  },
  rank(req, candidates, windows) {
    try { return impl.rank(req, candidates, windows); } catch (e) { throw explain(e); }
  },
  observe(req, account, ended) {
    try { return impl.observe(req, account, ended); } catch (e) { const why = explain(e); log('error', why); throw why; }
  },
};
`);
}
