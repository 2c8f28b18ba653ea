// /v1/embeddings through the openai client (base64 by default, decoded by the client) and as
// floats: unit vectors of the model's width, batches in order and equal to single calls, token-id
// input equal to its text, an embedding while a chat streams, and the 400s.
import { OpenAI, base, check, idle } from './common.mjs';

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
const same = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);

const one = await client.embeddings.create({ model: 'x', input: 'def add(a, b): return a + b' });
const v = one.data[0].embedding;
check(one.object === 'list' && one.data.length === 1 && one.data[0].object === 'embedding' &&
      v.length > 0 && Math.abs(norm(v) - 1) < 1e-4, `one embedding (${v.length} floats, unit)`);
check(one.usage.prompt_tokens > 0 && one.usage.total_tokens === one.usage.prompt_tokens, 'usage');

const texts = ['def add(a, b): return a + b', 'The weather is nice today.', 'SELECT * FROM users;'];
const batch = await client.embeddings.create({ model: 'x', input: texts, encoding_format: 'float' });
check(batch.data.length === 3 && batch.data.every((d, i) => d.index === i), 'a batch, in order');
check(same(batch.data[0].embedding, v), 'base64 (client default) equals float');
check(!same(batch.data[0].embedding, batch.data[1].embedding), 'different texts, different vectors');

const tok = await (await fetch(`${base}/tokenize`, { method: 'POST', headers: { Authorization: 'Bearer test-key' },
  body: JSON.stringify({ content: texts[0], add_special: true }) })).json();
const byIds = await client.embeddings.create({ model: 'x', input: tok.tokens, encoding_format: 'float' });
check(same(byIds.data[0].embedding, v), 'token ids embed as their text');

// beside a streaming chat: both finish, the chat's text is its solo text
const messages = [{ role: 'user', content: 'Write a Python function that adds two numbers.' }];
const solo = await client.chat.completions.create({ model: 'x', messages, max_tokens: 24, temperature: 0 });
const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 24, temperature: 0, stream: true });
let text = '', embedded = null;
for await (const c of stream) {
  text += c.choices[0]?.delta?.content ?? '';
  if (!embedded) embedded = client.embeddings.create({ model: 'x', input: texts, encoding_format: 'float' });
}
const during = await embedded;
check(text === solo.choices[0].message.content && same(during.data[2].embedding, batch.data[2].embedding),
      'an embedding beside a streaming chat changes neither');
await idle();

for (const [what, body] of [['empty input', { input: '' }], ['no input', {}], ['bad ids', { input: [1, -2] }],
  ['bad format', { input: 'x', encoding_format: 'int8' }], ['bad dimensions', { input: 'x', dimensions: 3 }]]) {
  const r = await fetch(`${base}/v1/embeddings`, { method: 'POST', headers: { Authorization: 'Bearer test-key', 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'x', ...body }) });
  check(r.status === 400 && (await r.json()).error.message.length > 0, `${what}: 400`);
}
