// LoRA adapters on a live server (tests/test_server_adapters.c starts it). Modes:
//   open: --adapter start=DIR --adapter-dir ROOT on loopback, no key: requests pick adapters by
//         "adapter" and by "model": "BASE:ID" (the openai SDK too); batched requests with
//         different adapters answer what they answer alone; run-time mounting by name only, with
//         traversal, absolute paths, symlinks out, truncated and oversized files refused; unmount.
//   key:  --api-key k1: admin calls without the key are 401, with it they work.
//   wide: --host 0.0.0.0 without a key: adapter administration is off (403).
import { OpenAI, base, check } from './common.mjs';

const mode = process.argv[3];
const json = { 'Content-Type': 'application/json' };

async function call(method, path, body, headers = {}) {
  const r = await fetch(`${base}${path}`, {
    method, headers: { ...json, ...headers }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let parsed = null;
  try { parsed = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, body: parsed, text };
}

const message = (r) => (r.body && r.body.error && r.body.error.message) || r.text;

async function complete(extra, headers) {
  const r = await call('POST', '/v1/completions', {
    prompt: 'The little robot walked into the garden and', max_tokens: 12, temperature: 0,
    ignore_eos: true, ...extra,
  }, headers);
  check(r.status === 200, `completion ${JSON.stringify(extra)} answers 200 (got ${r.status}: ${message(r)})`);
  return r.body.choices[0].text;
}

if (mode === 'open') {
  let r = await call('GET', '/v1/adapters');
  check(r.status === 200 && r.body.data.length === 1 && r.body.data[0].id === 'start' &&
        r.body.data[0].mounted === 'startup' && r.body.data[0].format === 'mlx-lm', 'GET lists the startup adapter');

  // run-time mounts: names only, inside --adapter-dir
  r = await call('POST', '/v1/adapters', { name: 'alpha' });
  check(r.status === 200 && r.body.id === 'alpha' && r.body.format === 'peft' && r.body.rank === 4,
        `POST mounts alpha (${message(r)})`);
  r = await call('POST', '/v1/adapters', { name: 'beta', id: 'b2' });
  check(r.status === 200 && r.body.id === 'b2' && r.body.rank === 8, 'POST mounts beta under id b2');
  check((await call('POST', '/v1/adapters', { name: 'alpha' })).status === 409, 'mounting alpha twice is 409');
  for (const name of ['../root/alpha', '..', '/etc', '/tmp', 'alpha/../beta', '.hidden', 'a b', '', 'x'.repeat(65)]) {
    r = await call('POST', '/v1/adapters', { name });
    check(r.status === 400 && /folder name/.test(message(r)), `name ${JSON.stringify(name)} is refused (${r.status})`);
  }
  r = await call('POST', '/v1/adapters', { path: '/tmp' });
  check(r.status === 400 && /never by path/.test(message(r)), 'a path field is refused');
  r = await call('POST', '/v1/adapters', { name: 'escape' });
  check(r.status === 403 && /outside/.test(message(r)), `a symlinked folder out of the root is refused (${message(r)})`);
  r = await call('POST', '/v1/adapters', { name: 'linkfile' });
  check(r.status === 403 && /adapter_config.json leads outside/.test(message(r)), `a symlinked file out of the root is refused (${message(r)})`);
  r = await call('POST', '/v1/adapters', { name: 'nothing' });
  check(r.status === 404, 'a missing folder is 404');
  r = await call('POST', '/v1/adapters', { name: 'broken' });
  check(r.status === 400 && /truncated|past the end/.test(message(r)), `a truncated weight file is refused (${message(r)})`);
  r = await call('POST', '/v1/adapters', { name: 'oversized' });
  check(r.status === 400 && /bytes after the last tensor/.test(message(r)), `an oversized weight file is refused (${message(r)})`);
  check(!JSON.stringify((await call('GET', '/v1/adapters')).body).includes('broken'), 'refused adapters are not listed');
  r = await call('POST', '/v1/adapters', { name: 5 });
  check(r.status === 400, 'a non-string name is 400');

  // requests pick adapters
  const plain = await complete({});
  const alpha = await complete({ adapter: 'alpha' });
  const alpha2 = await complete({ model: 'starter:alpha' });
  const beta = await complete({ adapter: 'b2' });
  const start = await complete({ model: 'anything:start' });
  check(alpha !== plain, 'the adapter changes the answer');
  check(alpha2 === alpha, '"model": "starter:alpha" picks alpha');
  check(beta !== alpha && start !== plain, 'other adapters answer otherwise');
  r = await call('POST', '/v1/completions', { prompt: 'hi', max_tokens: 2, adapter: 'nope' });
  check(r.status === 400 && /not mounted/.test(message(r)), 'an unknown adapter is 400');
  r = await call('POST', '/v1/completions', { prompt: 'hi', max_tokens: 2, model: 'starter:nope' });
  check(r.status === 400 && /not mounted/.test(message(r)), '"model": "starter:nope" is 400');
  r = await call('POST', '/v1/completions', { prompt: 'hi', max_tokens: 2, adapter: 'alpha', model: 'starter:b2' });
  check(r.status === 400 && /different adapters/.test(message(r)), 'adapter and model naming different adapters is 400');
  r = await call('POST', '/v1/completions', { prompt: 'hi', max_tokens: 2, adapter: 7 });
  check(r.status === 400, 'a non-string adapter is 400');
  const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
  const chatAlpha = await openai.chat.completions.create({
    model: 'starter:alpha', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0,
  });
  const chatAlpha2 = await openai.chat.completions.create({
    model: 'starter', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0, adapter: 'alpha',
  });
  check(chatAlpha.choices[0].message.content === chatAlpha2.choices[0].message.content,
        'the openai SDK picks an adapter by model name');

  // batched: the same requests at once answer as they did one by one
  const picks = [{}, { adapter: 'alpha' }, { adapter: 'b2' }, { model: 'starter:start' }, { adapter: 'alpha' }, {}];
  const together = await Promise.all(picks.map((p) => complete(p)));
  const alone = [plain, alpha, beta, start, alpha, plain];
  check(together.every((t, i) => t === alone[i]), 'batched requests with different adapters answer as alone');

  // unmount: running requests are unaffected, later ones cannot pick it
  const stream = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: json,
    body: JSON.stringify({ prompt: 'The little robot walked into the garden and', max_tokens: 40,
      temperature: 0, ignore_eos: true, adapter: 'alpha', stream: true }),
  });
  check(stream.status === 200, 'a streaming request with alpha starts');
  const reader = stream.body.getReader();
  const decoder = new TextDecoder();
  let sse = decoder.decode((await reader.read()).value); // it is running now
  r = await call('DELETE', '/v1/adapters/alpha');
  check(r.status === 200 && r.body.deleted === true, 'DELETE unmounts alpha');
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    sse += decoder.decode(value);
  }
  const streamed = sse.split('\n').filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)).choices[0]?.text ?? '').join('');
  check(streamed.startsWith(alpha), 'a request running with alpha finishes with it');
  r = await call('POST', '/v1/completions', { prompt: 'hi', max_tokens: 2, adapter: 'alpha' });
  check(r.status === 400, 'alpha is gone');
  check((await call('DELETE', '/v1/adapters/alpha')).status === 404, 'DELETE of an unknown id is 404');
  check((await call('DELETE', '/v1/adapters/start')).status === 200, 'a startup adapter can be unmounted');
  r = await call('GET', '/v1/adapters');
  check(r.body.data.map((a) => a.id).join() === 'b2', 'GET lists what is left');
} else if (mode === 'key') {
  for (const [method, path, body] of [['GET', '/v1/adapters'], ['POST', '/v1/adapters', { name: 'alpha' }],
    ['DELETE', '/v1/adapters/alpha']]) {
    const r = await call(method, path, body);
    check(r.status === 401, `${method} ${path} without the key is 401`);
  }
  const auth = { Authorization: 'Bearer k1' };
  let r = await call('POST', '/v1/adapters', { name: 'alpha' }, auth);
  check(r.status === 200, 'POST with the key mounts');
  r = await call('POST', '/v1/adapters', { name: '../outside' }, auth);
  check(r.status === 400, 'traversal is refused with the key too');
  await complete({ adapter: 'alpha' }, auth);
  check((await call('DELETE', '/v1/adapters/alpha', undefined, auth)).status === 200, 'DELETE with the key');
} else if (mode === 'wide') {
  for (const [method, path, body] of [['GET', '/v1/adapters'], ['POST', '/v1/adapters', { name: 'alpha' }],
    ['DELETE', '/v1/adapters/alpha']]) {
    const r = await call(method, path, body);
    check(r.status === 403 && /beyond loopback/.test(message(r)), `${method} ${path} is off beyond loopback without a key`);
  }
} else {
  check(false, `unknown mode ${mode}`);
}
