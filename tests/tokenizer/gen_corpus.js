// gen_corpus.js — writes the tokenizer stress corpus (tests/tokenizer/corpus.json), deterministically
// from a seed: `node tests/tokenizer/gen_corpus.js [SEED] > tests/tokenizer/corpus.json`.
// Each item is a string, or {"hex": "..."} for byte strings that are not valid UTF-8 (the reference reads
// them through TextDecoder, which replaces each maximal invalid subpart with U+FFFD).
// Plain JavaScript, no dependencies; the output does not depend on the Node version.
'use strict';

const SEED = Number(process.argv[2] || 20260516);
let state = SEED >>> 0;
function rnd() { // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1)); // inclusive
const pick = (a) => a[Math.floor(rnd() * a.length)];
const rep = (n, f) => Array.from({ length: n }, f).join('');
const cp = (c) => String.fromCodePoint(c);
const range = (lo, hi) => cp(ri(lo, hi));

// Code points are drawn from blocks assigned in Unicode 13 or earlier, so that every library involved
// (PCRE2 10.42: Unicode 14; utf8proc 2.8: Unicode 15; Node's ICU) agrees on their properties.
const WORDS = ['the', 'of', 'and', 'to', 'in', 'is', 'that', 'for', 'it', 'as', 'was', 'with', 'be', 'by', 'on', 'not',
  'he', 'I', 'this', 'are', 'or', 'his', 'from', 'at', 'which', 'but', 'have', 'an', 'had', 'they', 'you', 'were',
  'their', 'one', 'all', 'we', 'can', 'her', 'has', 'there', 'been', 'if', 'more', 'when', 'will', 'would', 'who',
  'so', 'no', 'phase', 'token', 'attention', 'cache', 'compressed', 'window', 'stride', 'Transformer', 'KV', 'GPU',
  'résumé', 'naïve', 'café', 'Zürich', 'straße', 'Ångström', 'façade', 'coöperate', 'jalapeño', 'São', 'Paulo',
  'ÉCOLE', 'Œuvre', 'İstanbul', 'ﬁnal', 'Ⅻ', 'Δέλτα', 'Москва', 'привет', 'مرحبا', 'שלום', 'नमस्ते', 'สวัสดี',
  'Ελληνικά', 'Tiếng', 'Việt', 'ǅemal', 'ǈubljana', 'x²', 'H₂O', '½', '³⁄₄', 'µs', 'Ω', 'Å', 'K'];
const CONTR = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"];
const caseVar = (s) => [...s].map((c) => (rnd() < 0.5 ? c.toUpperCase() : c.toLowerCase())).join('');
const QWEN_SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|object_ref_start|>', '<|box_end|>',
  '<|vision_pad|>', '<tool_call>', '</tool_call>', '<|fim_prefix|>', '<|fim_middle|>', '<|fim_suffix|>',
  '<|repo_name|>', '<|file_sep|>', '<think>', '</think>', '<tool_response>'];
const DS_SPECIAL = ['<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜▁pad▁｜>', '<｜place▁holder▁no▁7｜>',
  '<｜fim▁hole｜>', '<｜fim▁begin｜>', '<｜fim▁end｜>', '<｜User｜>', '<｜Assistant｜>', '<|EOT|>',
  '<｜tool▁calls▁begin｜>', '<｜tool▁call▁end｜>', '<｜tool▁sep｜>', '<｜tool▁outputs▁end｜>'];
const PARTIAL = ['<|im_sta', '<|im_start', 'im_start|>', '<|', '|>', '<｜', '｜>', '<｜begin▁of', '▁', '<think', '</think',
  '<|endoftext|', '<<|im_end|>>', '<｜User', '<|EOT|'];
const WS = [' ', '  ', '\t', '\n', '\r\n', '\r', '\n\n', '\u00a0', '\u3000', '\u2009', '\u200b', '\u2028', '\u000b',
  '\u000c', '\u0085', '\u1680', '\u202f', '\u205f', '\ufeff', ' \n', '\n ', '\t\t', '    ', '\u180e', '\u2060',
  '\u200c', '\u200d', '\u001c', '\u001d', '\u001e', '\u001f'];
const EMOJI = ['😀', '😂', '🥲', '❤️', '👍', '👍🏻', '👍🏿', '👋🏽', '🙏🏾', '👩‍💻', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🏴‍☠️',
  '🧑🏽‍🚀', '👩🏼‍🤝‍👨🏿', '❤️‍🔥', '🇺🇸', '🇯🇵', '🇫🇷', '🇩🇪', '🇺🇦', '🇨🇳', '🇰🇷', '1️⃣', '#️⃣', '*️⃣', '©️', '™️',
  '☺︎', '✔', '✨', '🔥', '🚀', '🐍', '🦀', '🤖', '🧠', '🌍', '🎉', '💯', '🥳', '😶‍🌫️', '🧬'];
const PUNCT = '.,;:!?-–—()[]{}"\'`~@#$%^&*_+=/\\|<>«»“”‘’…·•§¶†‡※。，、！？：；「」『』（）【】《》〈〉・ー';
const COMB = [0x0300, 0x0301, 0x0302, 0x0303, 0x0308, 0x030a, 0x0327, 0x0328, 0x0323, 0x0331, 0x034f, 0x0361, 0x20dd,
  0x0670, 0x05b7, 0x093c, 0x0e31, 0x3099, 0x309a, 0xfe0f, 0x200d];

function word() { return pick(WORDS); }
function sentence(n) {
  let s = '';
  for (let i = 0; i < n; i++) {
    let w = word();
    if (rnd() < 0.15) w = w[0].toUpperCase() + w.slice(1);
    if (rnd() < 0.08) w += pick(CONTR);
    s += (i ? (rnd() < 0.9 ? ' ' : pick(WS)) : '') + w;
    if (rnd() < 0.1) s += pick([',', '.', ';', ':', '!', '?', '...', ' -']);
  }
  return s + (rnd() < 0.7 ? '.' : '');
}
function ident() {
  const parts = ['x', 'idx', 'buf', 'len', 'tok', 'ids', 'n', 'phase', 'cfg', 'kv', 'head', 'W', 'S', 'out', 'err'];
  let s = pick(parts);
  if (rnd() < 0.4) s += (rnd() < 0.5 ? '_' : '') + pick(parts);
  if (rnd() < 0.3) s += ri(0, 99);
  return s;
}
function code() {
  const nl = rnd() < 0.3 ? '\r\n' : '\n';
  const ind = rnd() < 0.5 ? '\t' : pick(['  ', '    ', '\t ', ' \t']);
  const lines = [];
  const n = ri(1, 8);
  for (let i = 0; i < n; i++) {
    const d = ri(0, 3);
    const t = pick([
      () => `for (int ${ident()} = 0; ${ident()} < ${ri(0, 4096)}; ${ident()}++) {`,
      () => `def ${ident()}(${ident()}, ${ident()}=${ri(0, 9)}):`,
      () => `return ${ident()}[${ident()}] * ${rnd().toFixed(ri(1, 8))};`,
      () => `if ${ident()} != ${ident()}: raise ValueError(f"bad {${ident()}!r}")`,
      () => `const ${ident()} = await fetch("https://example.com/${ident()}?q=${ri(0, 1e6)}");`,
      () => `// TODO(${ident()}): don't merge ${ident()}'s ${ident()} — it's O(n²)`,
      () => `#include <${ident()}.h>`,
      () => `    }${pick(['', ';', ' else {', ')'])}`,
      () => `${ident()} += ${ident()} << ${ri(0, 31)} | 0x${ri(0, 0xffffff).toString(16)};`,
      () => `printf("%s: %d\\n", ${ident()}, ${ident()});`,
      () => `SELECT ${ident()}, COUNT(*) FROM ${ident()} WHERE ${ident()} >= ${ri(0, 99999)} GROUP BY 1;`,
      () => `<div class="${ident()}">${sentence(ri(1, 4))}</div>`,
      () => `${ident()}:${pick(WS)}${JSON.stringify({ [ident()]: [ri(0, 9), ri(10, 999)] })}`,
      () => '',
    ])();
    lines.push(rep(d, () => ind) + t + (rnd() < 0.1 ? pick([' ', '  ', '\t']) : ''));
  }
  return lines.join(nl) + (rnd() < 0.5 ? nl : '');
}
function digits() {
  return pick([
    () => rep(ri(1, 60), () => String(ri(0, 9))),
    () => `${ri(0, 999)},${String(ri(0, 999)).padStart(3, '0')},${String(ri(0, 999)).padStart(3, '0')}`,
    () => `${ri(0, 99999)}.${rep(ri(1, 20), () => String(ri(0, 9)))}`,
    () => `v${ri(0, 20)}.${ri(0, 20)}.${ri(0, 200)}`,
    () => `${ri(1900, 2100)}-${String(ri(1, 12)).padStart(2, '0')}-${String(ri(1, 28)).padStart(2, '0')}T${ri(10, 23)}:${ri(10, 59)}`,
    () => `+1 (${ri(100, 999)}) ${ri(100, 999)}-${ri(1000, 9999)}`,
    () => rep(ri(1, 20), () => range(0xff10, 0xff19)), // fullwidth digits
    () => rep(ri(1, 12), () => range(0x0660, 0x0669)), // Arabic-Indic
    () => rep(ri(1, 12), () => range(0x0966, 0x096f)), // Devanagari
    () => `${ri(0, 9)}²${ri(0, 9)}³ ½ ¼ ⅞ Ⅻ ⅻ ① ⑳ ${range(0x2160, 0x2188)}`,
    () => `${word()}${ri(0, 1e9)}${word()}`,
    () => `${rep(ri(1, 30), () => String(ri(0, 9)))} ${rep(ri(1, 30), () => String(ri(0, 9)))}`,
    () => `0x${rep(ri(1, 32), () => pick('0123456789abcdefABCDEF'))}`,
    () => `${-ri(0, 1e6)}e${ri(-30, 30)}`,
  ])();
}
function cjk() {
  const pieces = [
    () => rep(ri(1, 20), () => range(0x4e00, 0x9fa5)),
    () => rep(ri(1, 8), () => range(0x9fa6, 0x9fef)), // CJK outside DeepSeek's explicit range
    () => rep(ri(1, 8), () => range(0x3400, 0x4db5)), // Extension A
    () => rep(ri(1, 15), () => range(0x3041, 0x3096)), // hiragana
    () => rep(ri(1, 15), () => range(0x30a1, 0x30fa)), // katakana
    () => rep(ri(1, 5), () => range(0xff66, 0xff9d)), // halfwidth katakana
    () => rep(ri(1, 12), () => range(0xac00, 0xd7a3)), // Hangul syllables
    () => rep(ri(1, 6), () => range(0x1100, 0x1112) + range(0x1161, 0x1175) + (rnd() < 0.5 ? range(0x11a8, 0x11c2) : '')), // jamo
    () => rep(ri(1, 4), () => range(0x3131, 0x318e)), // compatibility jamo
    () => pick(['。', '，', '、', '！', '？', '「', '」', '：', '；', '（', '）', '……', '——']),
    () => pick(WS),
    () => word(),
    () => String(ri(0, 10000)),
    () => rep(ri(1, 3), () => range(0xf900, 0xfa2d)), // CJK compatibility ideographs (NFC maps them)
  ];
  return rep(ri(1, 8), () => pick(pieces)());
}
function emoji() {
  return rep(ri(1, 6), () => {
    const e = pick(EMOJI);
    return pick([() => e, () => e + e, () => word() + e, () => ' ' + e, () => e + pick(WS), () => e + String(ri(0, 99)),
      () => e + rep(ri(0, 3), () => cp(0xfe0f)), () => e + cp(pick([0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff]))])();
  });
}
function combining() {
  return rep(ri(1, 6), () => pick([
    () => pick('aeiouAEIOUnNcCyY') + rep(ri(1, 3), () => cp(pick(COMB))),
    () => word().normalize(pick(['NFC', 'NFD', 'NFKD'])),
    () => cp(pick(COMB)) + word(), // a mark at the start
    () => 'Z' + rep(ri(5, 30), () => range(0x0300, 0x036f)), // zalgo
    () => pick(['नमस्ते', 'क्षत्रिय', 'ภาษาไทย', 'العَرَبِيَّة', 'עִבְרִית', 'ཀྱི', 'ಕನ್ನಡ']),
    () => pick(WS),
    () => 'e\u0301' + ' é ' + 'E\u0301' + 'É',
    () => '\u1100\u1161\u11a8' + ' ' + '각', // jamo that compose to a syllable
    () => '\u212b \u00c5 A\u030a \u2126 \u03a9 \u212a K', // singletons
    () => 'ﬁ ﬂ ﬀ ｆｕｌｌ ㍻ ㎏ ™ ℃ ⅷ', // compatibility characters (NFC leaves them)
    () => 'q\u0307\u0323 q\u0323\u0307 \u1e0b\u0323 \u1e0d\u0307', // canonical reordering
  ])());
}
function contractions() {
  return rep(ri(1, 6), () => {
    const c = pick(CONTR);
    return pick([
      () => word() + c,
      () => caseVar(word() + c),
      () => word().toUpperCase() + c.toUpperCase(),
      () => ' ' + c,
      () => c + c,
      () => word() + c.replace("'", '’'),
      () => pick(["don't", "DON'T", "I'm", "I'M", "we're", "WE'RE", "they've", "you'll", "he'd", "it's", "IT'S",
        "Y'all", "o'clock", "rock'n'roll", "'tis", "'s'", "''s", "'S", "'Ll", "'lL", "'Re", "'vE", "'ſ", "dog'ſ", "'K"]),
      () => pick(["'", "''", "'''", '"\'"', '\'\n']),
    ])() + pick([' ', '', '.', '\n', ', ']);
  });
}
function whitespace() {
  return rep(ri(1, 8), () => pick([
    () => pick(WS),
    () => rep(ri(1, 40), () => ' '),
    () => rep(ri(1, 12), () => '\n'),
    () => rep(ri(1, 6), () => '\r\n'),
    () => rep(ri(1, 8), () => pick(WS)),
    () => word(),
    () => pick(PUNCT),
    () => '\u0000', () => '\u0001\u001f\u007f',
  ])());
}
function special(sp) {
  return rep(ri(1, 6), () => pick([
    () => pick(sp),
    () => pick(QWEN_SPECIAL.concat(DS_SPECIAL)),
    () => pick(PARTIAL),
    () => ' ' + pick(sp) + ' ',
    () => pick(sp) + '\n',
    () => pick(sp) + pick(sp),
    () => 'user\n' + sentence(ri(1, 6)),
    () => pick(WS) + pick(sp) + pick(WS),
    () => word(),
    () => pick(sp).normalize('NFKC'), // fullwidth bars folded: no longer the token
    () => pick(sp).slice(0, -1),
  ])());
}
function chat() {
  const sp = rnd() < 0.5 ? QWEN_SPECIAL : DS_SPECIAL;
  if (sp === QWEN_SPECIAL)
    return `<|im_start|>system\n${sentence(ri(2, 8))}<|im_end|>\n<|im_start|>user\n${sentence(ri(2, 12))}<|im_end|>\n<|im_start|>assistant\n<think>\n${sentence(ri(1, 5))}\n</think>\n\n${code()}<|im_end|>`;
  return `<｜begin▁of▁sentence｜>${sentence(ri(2, 6))}<｜User｜>${sentence(ri(2, 10))}<｜Assistant｜>${code()}<｜end▁of▁sentence｜>`;
}
function longword() {
  return pick([
    () => rep(ri(50, 600), () => pick('abcdefghijklmnopqrstuvwxyz')),
    () => rep(ri(50, 2000), () => 'a'),
    () => rep(ri(10, 300), () => 'ab'),
    () => 'Pneumonoultramicroscopicsilicovolcanoconiosis'.repeat(ri(1, 8)),
    () => rep(ri(40, 400), () => pick('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/')) + '==',
    () => 'https://' + rep(ri(3, 8), () => ident()).toLowerCase() + '.example.org/' + rep(ri(2, 8), () => ident() + '/') + '?' + ident() + '=' + ri(0, 1e9),
    () => rep(ri(20, 300), () => range(0x4e00, 0x9fa5)),
    () => rep(ri(20, 200), () => range(0xac00, 0xd7a3)),
    () => rep(ri(20, 200), () => range(0x0430, 0x044f)),
    () => rep(ri(50, 500), () => pick('!@#$%^&*()-_=+[]{}')),
    () => rep(ri(50, 400), () => String(ri(0, 9))),
    () => rep(ri(20, 100), () => pick(EMOJI)),
    () => rep(ri(50, 300), () => '-') + '\n' + rep(ri(50, 300), () => '='),
  ])();
}
// Random text over a weighted list of blocks (all assigned in Unicode 13 or earlier).
const BLOCKS = [[0x20, 0x7e, 20], [0xa0, 0x24f, 6], [0x370, 0x3ff, 3], [0x400, 0x4ff, 3], [0x590, 0x5ea, 1],
  [0x600, 0x64a, 2], [0x900, 0x97f, 1], [0xe01, 0xe5b, 1], [0x1e00, 0x1eff, 2], [0x2000, 0x206f, 2], [0x2070, 0x209c, 1],
  [0x20a0, 0x20bf, 1], [0x2100, 0x214f, 1], [0x2190, 0x23ff, 2], [0x2500, 0x27bf, 2], [0x3000, 0x303f, 2],
  [0x4e00, 0x9fa5, 4], [0xac00, 0xd7a3, 2], [0xff01, 0xff5e, 1], [0x1d400, 0x1d7ff, 1], [0x1f300, 0x1f64f, 2],
  [0x1f680, 0x1f6d7, 1], [0x1f900, 0x1f9ff, 1], [0x10000, 0x1005d, 1], [0xe000, 0xe0ff, 1], [0x20000, 0x2a6dd, 1]];
const BW = BLOCKS.reduce((a, b) => a + b[2], 0);
function randomText() {
  let s = '';
  const n = ri(1, 80);
  for (let i = 0; i < n; i++) {
    let r = rnd() * BW, b = BLOCKS[0];
    for (const x of BLOCKS) { if ((r -= x[2]) < 0) { b = x; break; } }
    const c = ri(b[0], b[1]);
    if (c >= 0x1d400 && c <= 0x1d7ff && [0x1d455, 0x1d49d, 0x1d4a0, 0x1d4a1].includes(c)) continue;
    s += cp(c);
  }
  return s;
}
// Byte strings, most of them not valid UTF-8.
const hex = (bytes) => ({ hex: Buffer.from(bytes).toString('hex') });
function invalid() {
  const utf8 = (s) => [...Buffer.from(s, 'utf8')];
  const bad = () => pick([
    [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xe0, 0x9f, 0xbf], [0xed, 0xa0, 0x80],
    [0xed, 0xbf, 0xbf], [0xed, 0xa0, 0xbd, 0xed, 0xb2, 0xa9], [0xf0, 0x80, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80],
    [0xf5, 0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xff], [0xfe, 0xff], [0xc3], [0xe2, 0x82],
    [0xf0, 0x9f, 0x98], [0xe2, 0x28, 0xa1], [0xc3, 0x28], [0xf0, 0x28, 0x8c, 0xbc], [0xe2, 0x82, 0x28],
    [ri(0x80, 0xff)], [ri(0xc2, 0xf4), ri(0, 0x7f)], [ri(0, 255), ri(0, 255), ri(0, 255)],
  ]);
  const parts = [];
  const n = ri(1, 8);
  for (let i = 0; i < n; i++)
    parts.push(...(rnd() < 0.5 ? bad() : utf8(pick([word(), ' ', '\n', pick(EMOJI), '日本語', 'é', '<|im_end|>', '<｜User｜>', '  ']))));
  return hex(parts);
}
function english() { return rep(ri(1, 4), () => sentence(ri(3, 20)) + pick([' ', '\n', '\n\n', '  '])); }

const out = [];
const add = (n, f) => { for (let i = 0; i < n; i++) out.push(f()); };
add(1000, code);
add(800, digits);
add(1200, cjk);
add(800, emoji);
add(800, combining);
add(800, contractions);
add(1000, whitespace);
add(500, () => special(QWEN_SPECIAL));
add(500, () => special(DS_SPECIAL));
add(300, chat);
add(800, invalid);
add(500, longword);
add(1500, randomText);
add(600, english);
// Characters assigned in Unicode 14 and 15 (the regex engines' tables differ in age): kept few, so that a
// table difference shows up as a handful of mismatches rather than hiding in the bulk.
add(100, () => rep(ri(1, 4), () => pick([() => word(), () => ' ', () => range(0x1fae0, 0x1fae7), () => range(0x1fae8, 0x1faf8),
  () => range(0x31350, 0x313a0), () => range(0x11f00, 0x11f10), () => range(0x0870, 0x0887), () => range(0x1e290, 0x1e2ad)])()));
add(300, () => rep(ri(2, 5), () => pick([code, digits, cjk, emoji, combining, contractions, whitespace, english])()));
out.push('', ' ', '\n', 'a', '\u0000', "'", "'s", '<|im_start|>', '<｜begin▁of▁sentence｜>', '\r\n\r\n', '\ufeff', '\u0085');
process.stdout.write('[\n' + out.map((x) => JSON.stringify(x)).join(',\n') + '\n]\n');
