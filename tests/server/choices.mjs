// n > 1 choices (docs/server.md "Choices") against a live server (--batch 8): n = 3 with a
// temperature gives three choices with their own indexes, a seed makes them reproducible, choice 0
// is the n = 1 answer of the same seed, streaming gives the same texts per index, the prompt is
// prefilled once (/stats totals.prompt_tokens_prefilled), usage counts it once, every KV block is
// given back (to the prefix cache) afterwards; completions too; best_of stays a 400.
import { OpenAI, base, check, idle } from './common.mjs';

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
// a prompt no other script sends; one warm-up token puts it in the prefix cache first, so every
// request below starts from the same cached prefix and prefills the same rest: a cold prefill and a
// cached one split the prompt into other chunks, whose matmul kernels differ in the last bits of the
// logits (docs/generation.md "Reproducible sampling"), and a seeded draw may then pick another token
const messages = [{ role: 'user', content: `(${Date.now()}) Name three colours of the sea.` }];
const req = { model: 'x', messages, temperature: 1.0, max_tokens: 12, seed: 1234, n: 3 };
await client.chat.completions.create({ ...req, n: 1, max_tokens: 1 });

const before = await idle();
const r = await client.chat.completions.create(req);
const after = await idle();
check(r.choices.length === 3 && r.choices.every((c, i) => c.index === i), 'n = 3: three choices, indexes 0, 1, 2');
check(r.choices.every((c) => typeof c.message.content === 'string' && c.finish_reason), 'each choice has a message and a finish reason');
const texts = r.choices.map((c) => c.message.content);
check(new Set(texts).size > 1, 'the choices sample on their own');
check(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 3 && r.usage.completion_tokens <= 3 * 12 &&
  r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'usage: the prompt once, the three completions summed');
const prefilled = after.totals.prompt_tokens_prefilled - before.totals.prompt_tokens_prefilled;
const cached = r.usage.prompt_tokens_details.cached_tokens;
check(prefilled === r.usage.prompt_tokens - cached, `the prompt is prefilled once (${prefilled} tokens for a ${r.usage.prompt_tokens}-token prompt)`);
check(after.totals.prompt_tokens - before.totals.prompt_tokens === r.usage.prompt_tokens, 'the prompt counts once in totals.prompt_tokens');
check(after.kv.blocks_used === after.prefix_cache.blocks && after.kv.bytes_reserved === 0 && after.batch.running === 0,
  'every KV block is given back afterwards');

const again = await client.chat.completions.create(req);
check(JSON.stringify(again.choices.map((c) => c.message.content)) === JSON.stringify(texts), 'the same seed gives the same choices');
const one = await client.chat.completions.create({ ...req, n: 1 });
check(one.choices.length === 1 && one.choices[0].message.content === texts[0], 'choice 0 is the n = 1 answer of the seed');

const streamed = ['', '', ''];
const finishes = [null, null, null];
let usage = null;
for await (const c of await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } })) {
  for (const ch of c.choices) {
    streamed[ch.index] += ch.delta?.content ?? '';
    if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
  }
  if (c.usage) usage = c.usage;
}
check(JSON.stringify(streamed) === JSON.stringify(texts), 'streamed: the same text per index');
check(finishes.every((f) => f), 'streamed: a finish reason per choice');
check(usage && usage.completion_tokens === r.usage.completion_tokens && usage.prompt_tokens === r.usage.prompt_tokens, 'streamed usage');

// completions: n choices, streamed and not, with legacy logprobs per choice
const creq = { model: 'x', prompt: `def colour_${Date.now()}(x):`, max_tokens: 6, temperature: 1.0, seed: 99, n: 2, logprobs: 1 };
const cr = await client.completions.create(creq);
check(cr.choices.length === 2 && cr.choices[1].index === 1 && cr.choices.every((c) => c.logprobs.tokens.length > 0), 'completions n = 2 with logprobs');
const ctexts = ['', ''];
for await (const c of await client.completions.create({ ...creq, stream: true }))
  for (const ch of c.choices) ctexts[ch.index] += ch.text;
check(ctexts[0] === cr.choices[0].text && ctexts[1] === cr.choices[1].text, 'completions n = 2 streamed');
const echoed = await client.completions.create({ ...creq, logprobs: undefined, echo: true });
check(echoed.choices.every((c, i) => c.text === creq.prompt + cr.choices[i].text), 'echo with n = 2: the prompt before each choice');

// best_of stays a clear 400
let bestOf = null;
try { await client.completions.create({ ...creq, best_of: 3 }); } catch (e) { bestOf = e; }
check(bestOf && bestOf.status === 400 && /best_of/.test(bestOf.error?.message ?? bestOf.message), 'best_of > 1: 400 naming it');
const s = await idle();
check(s.kv.blocks_used === s.prefix_cache.blocks && s.kv.bytes_reserved === 0, 'every KV block is given back at the end');
