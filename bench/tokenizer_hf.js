#!/usr/bin/env node
// Reference side of bench/tokenizer.sh: encode throughput of the Hugging Face tokenizers (Rust,
// through the @anush008/tokenizers node binding) on the same text, one string per call (the
// library encodes a single string on one thread). Prints one JSON line; writes the ids to
// argv[4] so the shell script can check that cinfer produced the same ids.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.resolve(__dirname, '../tests/npm/node_modules/@anush008/tokenizers'));

async function main() {
  const [tokFile, textFile, idsOut, repsArg] = process.argv.slice(2);
  const text = fs.readFileSync(textFile, 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  const tok = Tokenizer.fromFile(tokFile);
  const reps = Number(repsArg || 3);
  let best = Infinity, ids = null;
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < best) best = dt;
    ids = enc.getIds();
  }
  fs.writeFileSync(idsOut, '[' + ids.join(',') + ']\n');
  console.log(JSON.stringify({ bytes, tokens: ids.length, best_s: best, mb_per_s: bytes / 1e6 / best }));
}
main().catch((e) => { console.error(e); process.exit(1); });
