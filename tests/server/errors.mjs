// Malformed requests: each gets a 4xx with a JSON error in its API's shape, and the server keeps
// serving.
import { base, check } from './common.mjs';

const auth = { Authorization: 'Bearer test-key' };
async function post(path, body, headers = {}) {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...auth, ...headers }, body });
  let json = null;
  try { json = await r.json(); } catch { /* not json */ }
  return { status: r.status, json };
}
const openaiShape = (j) => j && j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string';
const anthropicShape = (j) => j && j.type === 'error' && typeof j.error?.message === 'string';
const msg = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra });

const cases = [
  ['bad JSON', '/v1/chat/completions', '{"messages": [', 400],
  ['not an object', '/v1/chat/completions', '[1,2]', 400],
  ['missing messages', '/v1/chat/completions', '{"max_tokens": 3}', 400],
  ['empty messages', '/v1/chat/completions', '{"messages": []}', 400],
  ['messages wrong type', '/v1/chat/completions', '{"messages": "hi"}', 400],
  ['unknown role', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'wizard', content: 'x' }] }), 400],
  ['content wrong type', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 5 }] }), 400],
  ['image part', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400],
  ['negative max_tokens', '/v1/chat/completions', msg({ max_tokens: -1 }), 400],
  ['zero max_tokens', '/v1/chat/completions', msg({ max_tokens: 0 }), 400],
  ['absurd max_tokens', '/v1/chat/completions', msg({ max_tokens: 1e12 }), 400],
  // a huge but int max_tokens is clamped to the context's room (flags.mjs checks it)
  ['string max_tokens', '/v1/chat/completions', msg({ max_tokens: '5' }), 400],
  ['temperature type', '/v1/chat/completions', msg({ temperature: 'hot' }), 400],
  ['temperature range', '/v1/chat/completions', msg({ temperature: 9 }), 400],
  ['top_p range', '/v1/chat/completions', msg({ top_p: 2 }), 400],
  ['logit_bias id', '/v1/chat/completions', msg({ logit_bias: { '99999999': 1 } }), 400],
  ['logprobs type', '/v1/chat/completions', msg({ logprobs: 'yes' }), 400],
  ['top_logprobs range', '/v1/chat/completions', msg({ logprobs: true, top_logprobs: 50 }), 400],
  ['n 0', '/v1/chat/completions', msg({ n: 0 }), 400],
  ['n above the batch', '/v1/chat/completions', msg({ n: 9 }), 400],
  ['n type', '/v1/chat/completions', msg({ n: '2' }), 400],
  ['stop type', '/v1/chat/completions', msg({ stop: 7 }), 400],
  ['stream type', '/v1/chat/completions', msg({ stream: 'yes' }), 400],
  ['completions prompt type', '/v1/completions', '{"prompt": {"a": 1}}', 400],
  ['completions bad id', '/v1/completions', '{"prompt": [1, -5]}', 400],
];
for (const [what, path, body, status] of cases) {
  const r = await post(path, body);
  check(r.status === status && openaiShape(r.json), `${what}: ${r.status}`);
}
// invalid UTF-8 body
{
  const bytes = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]);
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: auth, body: bytes });
  check(r.status === 400 && openaiShape(await r.json()), 'invalid UTF-8: 400');
}
// huge body (over 16 MiB)
{
  const big = '{"messages":[{"role":"user","content":"' + 'a'.repeat(17 << 20) + '"}]}';
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: auth, body: big });
  check(r.status === 413 && openaiShape(await r.json()), 'huge body: 413');
}
// Anthropic shape
for (const [what, body] of [['bad JSON', '{'], ['missing max_tokens', '{"messages":[{"role":"user","content":"x"}]}'],
                            ['unknown role', '{"max_tokens":3,"messages":[{"role":"tool","content":"x"}]}']]) {
  const r = await post('/v1/messages', body);
  check(r.status === 400 && anthropicShape(r.json), `anthropic ${what}: ${r.status}`);
}
// auth, routes, methods
check((await post('/v1/chat/completions', msg(), { Authorization: 'Bearer wrong' })).status === 401, 'wrong key: 401');
check((await fetch(`${base}/v1/models`)).status === 401, 'no key: 401');
check((await fetch(`${base}/v1/models`, { headers: { 'x-api-key': 'test-key' } })).status === 200, 'x-api-key accepted');
check((await fetch(`${base}/nope`, { headers: auth })).status === 404, 'unknown route: 404');
check((await fetch(`${base}/v1/chat/completions`, { headers: auth })).status === 405, 'wrong method: 405');
check((await (await fetch(`${base}/health`)).text()) === '{"status": "ok"}', 'health needs no key');
// still serving
const ok = await post('/v1/chat/completions', msg({ temperature: 0 }));
check(ok.status === 200 && ok.json.choices[0].message.content.length > 0, 'server still serves');
const metrics = await (await fetch(`${base}/metrics`, { headers: auth })).text();
check(/cinfer_requests_total\{route="\/v1\/chat\/completions",status="400"\}/.test(metrics) &&
      /cinfer_time_to_first_token_seconds_bucket/.test(metrics) &&
      /cinfer_kv_blocks_used\{codec="bf16"\} \d+/.test(metrics) &&
      /cinfer_kv_blocks_free\{codec="bf16"\} \d+/.test(metrics) &&
      /cinfer_prefix_cache_bytes \d+/.test(metrics), 'metrics');
console.log('errors: all passed');
