// Utility routes and the fixes of issue 17 against the shared live server: /v1/models/{id}
// (openai models.retrieve), HEAD, /tokenize and /detokenize, Anthropic count_tokens
// (@anthropic-ai/sdk countTokens) and assistant prefill, a non-streaming request cancelled when its
// client goes away, and more idle connections than select() could watch.
import net from 'node:net';
import { OpenAI, Anthropic, base, check, idle, stats } from './common.mjs';

const auth = { Authorization: 'Bearer test-key' };
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'test-key', maxRetries: 0 });

// /v1/models/{id}
const listed = (await openai.models.list()).data[0];
const model = await openai.models.retrieve(listed.id);
check(model.id === listed.id && model.object === 'model', 'models.retrieve');
let missing = null;
try { await openai.models.retrieve('no-such-model'); } catch (e) { missing = e; }
check(missing && missing.status === 404, 'models.retrieve of another id is a 404');

// HEAD where GET works
for (const path of ['/v1/models', '/health', `/v1/models/${listed.id}`, '/stats']) {
  const r = await fetch(`${base}${path}`, { method: 'HEAD', headers: auth });
  check(r.status === 200 && (await r.text()) === '', `HEAD ${path}`);
}
check((await fetch(`${base}/v1/chat/completions`, { method: 'HEAD', headers: auth })).status === 405,
      'HEAD on a POST route is 405');

// /tokenize and /detokenize round trip
const post = (path, body) => fetch(`${base}${path}`, { method: 'POST', headers: { ...auth, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
const text = 'def add(a, b):\n    return a + b  # héllo';
const tok = await (await post('/tokenize', { content: text })).json();
check(Array.isArray(tok.tokens) && tok.tokens.length > 5 && tok.tokens.every(Number.isInteger), 'tokenize ids');
const pieces = await (await post('/tokenize', { content: text, with_pieces: true })).json();
check(pieces.tokens.length === tok.tokens.length && pieces.tokens.every((p, i) => p.id === tok.tokens[i]),
      'tokenize with_pieces gives the same ids');
const detok = await (await post('/detokenize', { tokens: tok.tokens })).json();
check(detok.content === text, 'detokenize inverts tokenize');
const badIds = await post('/detokenize', { tokens: [1, -3] });
check(badIds.status === 400 && (await badIds.json()).error.message.includes('tokens[1]'), 'detokenize names a bad id');
check((await post('/tokenize', { content: 5 })).status === 400, 'tokenize needs string content');

// Anthropic count_tokens equals the prompt tokens of the same request
const amsgs = [{ role: 'user', content: 'Write a Python function that adds two numbers.' }];
const counted = await anthropic.messages.countTokens({ model: 'x', system: 'You write code.', messages: amsgs });
const answered = await anthropic.messages.create({ model: 'x', max_tokens: 24, system: 'You write code.', messages: amsgs, temperature: 0 });
const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens || 0); // cached ones are apart
check(counted.input_tokens === prompt(answered.usage), `count_tokens = the prompt's tokens (${counted.input_tokens})`);
let countErr = null;
try { await anthropic.messages.countTokens({ model: 'x', messages: [] }); } catch (e) { countErr = e; }
check(countErr && countErr.status === 400, 'count_tokens of no messages is a 400');

// Anthropic prefill: a final assistant message is continued, not answered
const full = answered.content[0].text;
const words = full.split(/(?<= )/);
const prefill = words.slice(0, Math.min(3, words.length - 1)).join('').trimEnd();
const cont = await anthropic.messages.create({ model: 'x', max_tokens: 12, system: 'You write code.', temperature: 0,
  messages: [...amsgs, { role: 'assistant', content: prefill }] });
check(prompt(cont.usage) > prompt(answered.usage) && cont.content[0].text.length > 0 &&
      !cont.content[0].text.startsWith(prefill) && full.startsWith(prefill + cont.content[0].text.slice(0, 4)),
      `prefill continued: ${JSON.stringify(prefill)} + ${JSON.stringify(cont.content[0].text.slice(0, 12))} (alone: ${JSON.stringify(full.slice(0, 40))})`);

// a non-streaming request whose client disconnects is cancelled at the next step
const before = (await idle()).totals.requests_cancelled;
const abort = new AbortController();
const started = Date.now();
const long = openai.chat.completions.create({ model: 'x', max_tokens: 4000, ignore_eos: true, temperature: 0,
  messages: amsgs }, { signal: abort.signal }).catch((e) => e);
await new Promise((r) => setTimeout(r, 600));
check((await stats()).batch.running === 1, 'the long request is running');
abort.abort();
await long;
const after = await idle();
check(after.totals.requests_cancelled === before + 1 && Date.now() - started < 15000,
      `non-streaming request cancelled on disconnect (${Date.now() - started} ms)`);

// more idle connections than select() can watch (FD_SETSIZE 1024) do not lock others out
const sockets = [];
await Promise.all(Array.from({ length: 1100 }, () => new Promise((resolve) => {
  const sock = net.connect(Number(new URL(base).port), '127.0.0.1', resolve);
  sock.on('error', resolve);
  sockets.push(sock);
})));
const during = await openai.chat.completions.create({ model: 'x', max_tokens: 4, temperature: 0, messages: amsgs });
check(during.choices[0].message.content.length > 0, 'a request is served beside 1100 idle connections');
for (const sock of sockets) sock.destroy();

// /v1/completions echo: the prompt, then the same completion; streamed too; not with logprobs
const cprompt = 'def add(a, b):';
const plainC = await openai.completions.create({ model: 'x', prompt: cprompt, max_tokens: 8, temperature: 0 });
const echoed = await openai.completions.create({ model: 'x', prompt: cprompt, max_tokens: 8, temperature: 0, echo: true });
check(echoed.choices[0].text === cprompt + plainC.choices[0].text, 'echo puts the prompt before the completion');
let streamedC = '';
for await (const c of await openai.completions.create({ model: 'x', prompt: cprompt, max_tokens: 8, temperature: 0, echo: true, stream: true }))
  streamedC += c.choices[0]?.text ?? '';
check(streamedC === echoed.choices[0].text, 'echo streamed');
const idsPrompt = (await (await post('/tokenize', { content: cprompt })).json()).tokens;
const echoedIds = await openai.completions.create({ model: 'x', prompt: idsPrompt, max_tokens: 2, temperature: 0, echo: true });
check(echoedIds.choices[0].text.startsWith(cprompt), 'echo of a token-id prompt is its text');
let echoLp = null;
try { await openai.completions.create({ model: 'x', prompt: cprompt, max_tokens: 2, echo: true, logprobs: 2 }); } catch (e) { echoLp = e; }
check(echoLp && echoLp.status === 400, 'echo with logprobs is a 400');
