// Bounded load test: N concurrent streaming clients for S seconds on loopback. Each request
// carries its own greedy prompt; its streamed text must equal the same request's solo answer
// (nothing lost or mixed up), and at idle the KV pool is back to zero used blocks.
import { OpenAI, base, check, idle } from './common.mjs';

const clients = Number(process.argv[3] || 16), seconds = Number(process.argv[4] || 10);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const topics = ['add two numbers', 'reverse a string', 'sort a list', 'read a file', 'compute a factorial',
  'check a palindrome', 'count words', 'merge two dicts'];
const req = (i) => ({ model: 'x', temperature: 0, max_tokens: 6 + (i % 5) * 3,
  messages: [{ role: 'user', content: `Write a Python function to ${topics[i % topics.length]}.` }] });

const expected = new Map();
for (let i = 0; i < topics.length * 5; i++) {
  const key = `${i % topics.length}/${i % 5}`;
  if (!expected.has(key)) expected.set(key, (await client.chat.completions.create(req(i))).choices[0].message.content);
}
const deadline = Date.now() + seconds * 1000;
let done = 0, bad = 0;
async function worker(w) {
  for (let k = 0; Date.now() < deadline; k++) {
    const i = w * 7 + k;
    const s = await client.chat.completions.create({ ...req(i), stream: true });
    let text = '';
    for await (const chunk of s) for (const c of chunk.choices) text += c.delta.content ?? '';
    if (text !== expected.get(`${i % topics.length}/${i % 5}`)) bad++;
    done++;
  }
}
await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
check(done >= clients && bad === 0, `${done} streamed requests, ${bad} mismatched`);
const st = await idle();
check(st.kv.blocks_used === st.prefix_cache.blocks && st.batch.running === 0 && st.batch.waiting === 0, 'idle: no KV blocks held but the prefix cache\'s');
check(st.batch.max === 8, `/stats batch.max is the --batch the server runs with (${st.batch.max})`);
console.log('load: all passed');
