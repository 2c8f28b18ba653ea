// cinfer extensions over HTTP against a live server: `timings`, usage reasoning_tokens, the `kv`
// request plan (and its 400s), ignore_eos, stop_token_ids, continue_final_message,
// /v1/completions legacy logprobs (stream and not), CORS (--cors http://allowed.example) and the
// /metrics names of docs/server.md "Metrics and stats".
import { Anthropic, OpenAI, base, check } from './common.mjs';

const auth = { Authorization: 'Bearer test-key' };
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Write a Python function that adds two numbers.' }];
const greedy = { model: 'x', messages, temperature: 0 };
async function post(path, body) {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...auth },
    body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

// timings and reasoning_tokens
const timingKeys = ['prompt_n', 'prompt_ms', 'prompt_per_second', 'predicted_n', 'predicted_ms',
  'predicted_per_second', 'cache_n', 'draft_n', 'draft_accepted_n'];
const hasTimings = (t, r) => t && timingKeys.every((k) => typeof t[k] === 'number') &&
  t.predicted_n === r.usage.completion_tokens && t.prompt_n === r.usage.prompt_tokens - t.cache_n &&
  t.prompt_ms > 0 && t.predicted_ms >= 0;
const r = await client.chat.completions.create({ ...greedy, max_tokens: 6 });
check(hasTimings(r.timings, r), 'chat timings');
check(r.usage.completion_tokens_details?.reasoning_tokens === 0, 'usage reasoning_tokens');
let final = null;
for await (const c of await client.chat.completions.create({ ...greedy, max_tokens: 6, stream: true }))
  if (c.choices[0]?.finish_reason) final = c;
check(final && hasTimings(final.timings, final), 'stream timings on the final chunk');
const cr = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 4, temperature: 0 });
check(hasTimings(cr.timings, cr), 'completions timings');

// kv: the request's own codec plan
for (const kv of [{ codec: 'affine', bits: 4 }, { codec: 'turbo', bits: 3, start: 4 }, { codec: 'turbo-v', bits: [8, 3] },
  { codec: 'bf16' }, { codec: 'config' }, { bits: 8, group_size: 32 }]) {
  const k = await post('/v1/chat/completions', { ...greedy, max_tokens: 5, kv });
  check(k.status === 200 && k.json.usage.completion_tokens === 5, `kv ${JSON.stringify(kv)}`);
}
const plain = (await post('/v1/chat/completions', { ...greedy, max_tokens: 8 })).json.choices[0].message.content;
const late = (await post('/v1/chat/completions', { ...greedy, max_tokens: 8, kv: { codec: 'affine', bits: 4, start: 100000 } })).json;
check(late.choices[0].message.content === plain, 'kv start beyond the sequence: same tokens as bf16');
for (const [kv, field, code] of [[{ codec: 'affine', bits: 5 }, 'kv.bits', 'invalid_value'], [{ codec: 'zip' }, 'kv.codec', 'invalid_value'],
  [{ codec: 'affine', group_size: 48 }, 'kv.group_size', 'invalid_value'], [{ codec: 'affine', start: -1 }, 'kv.start', 'invalid_value'],
  [{ codec: 'affine', protect: 2 }, 'kv.protect', 'unsupported'], [{ codec: 'bf16', protect: 0 }, 'kv.protect', 'invalid_value'], [{ codec: 'affine', colour: 1 }, 'kv.colour', 'invalid_value'],
  ['affine', 'kv must', 'invalid_value'], [{ codec: 'affine', bits: 8, group_size: 128 }, 'group size', 'invalid_value']]) {
  const k = await post('/v1/chat/completions', { ...greedy, max_tokens: 2, kv });
  check(k.status === 400 && k.json.error.message.includes(field) && k.json.error.code === code, `kv ${JSON.stringify(kv)}: 400 naming ${field}`);
}
const anthropic = new Anthropic({ baseURL: base, apiKey: 'test-key', maxRetries: 0 });
const am = await anthropic.messages.create({ model: 'x', max_tokens: 4, messages, temperature: 0, kv: { codec: 'affine', bits: 8 } });
check(am.usage.output_tokens === 4, 'kv on /v1/messages');

// ignore_eos: EOS forced by logit_bias ends a request at once, unless ignored
const eos = { ...greedy, max_tokens: 4, logit_bias: { 1: 100 } };
const e1 = await client.chat.completions.create(eos);
check(e1.choices[0].finish_reason === 'stop' && e1.usage.completion_tokens === 1, 'EOS stops');
const e2 = await client.chat.completions.create({ ...eos, ignore_eos: true });
check(e2.choices[0].finish_reason === 'length' && e2.usage.completion_tokens === 4, 'ignore_eos');
const badEos = await post('/v1/chat/completions', { ...greedy, ignore_eos: 'yes' });
check(badEos.status === 400 && /ignore_eos/.test(badEos.json.error.message), 'ignore_eos type: 400');

// stop_token_ids: the third greedy token stops the request (EOS-like: excluded from the text)
const lp = await client.chat.completions.create({ ...greedy, max_tokens: 3, logprobs: true });
const third = lp.choices[0].logprobs.content[2];
const st = await client.chat.completions.create({ ...greedy, max_tokens: 10, stop_token_ids: [third.id] });
const firstTwo = lp.choices[0].logprobs.content.slice(0, 2).map((t) => t.token).join('');
check(st.choices[0].finish_reason === 'stop' && st.usage.completion_tokens === 3 &&
      st.choices[0].message.content === firstTwo, `stop_token_ids [${third.id}]`);
for (const bad of [[-1], [1e9], 'x', [1.5]]) {
  const b = await post('/v1/chat/completions', { ...greedy, stop_token_ids: bad });
  check(b.status === 400 && /stop_token_ids/.test(b.json.error.message), `stop_token_ids ${JSON.stringify(bad)}: 400`);
}

// continue_final_message: the reply continues the final assistant message, as the raw prompt would
const prefix = 'def add_numbers(';
const cont = await client.chat.completions.create({ ...greedy, max_tokens: 6, continue_final_message: true,
  messages: [...messages, { role: 'assistant', content: prefix }] });
const raw = await client.completions.create({ model: 'x', max_tokens: 6, temperature: 0,
  prompt: `<start_of_turn>user\n${messages[0].content}<end_of_turn>\n<start_of_turn>model\n${prefix}` });
check(cont.choices[0].message.content === raw.choices[0].text && raw.usage.prompt_tokens === cont.usage.prompt_tokens,
      'continue_final_message continues the assistant text');
const noFinal = await post('/v1/chat/completions', { ...greedy, continue_final_message: true });
check(noFinal.status === 400 && /continue_final_message/.test(noFinal.json.error.message), 'continue_final_message without an assistant turn: 400');

// /v1/completions logprobs (legacy shape)
const cl = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 5, temperature: 0, logprobs: 2 });
const L = cl.choices[0].logprobs;
let offset = 0, offsetsOk = true;
L.tokens.forEach((t, i) => { offsetsOk &&= L.text_offset[i] === offset; offset += [...t].length; });
check(L.tokens.length === 5 && L.token_logprobs.length === 5 && L.token_logprobs.every((x) => x <= 0) &&
      L.top_logprobs.every((o, i) => Object.keys(o).length >= 1 && Object.keys(o).length <= 2 &&
        Math.max(...Object.values(o)) >= L.token_logprobs[i] - 1e-6) &&
      L.tokens.join('') === cl.choices[0].text && offsetsOk, 'completions logprobs shape');
const cs = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 5, temperature: 0, logprobs: 2, stream: true });
const streamed = { tokens: [], offsets: [] };
for await (const c of cs) {
  const l = c.choices[0]?.logprobs;
  if (l) { streamed.tokens.push(...l.tokens); streamed.offsets.push(...l.text_offset); }
}
check(JSON.stringify(streamed.tokens) === JSON.stringify(L.tokens) && JSON.stringify(streamed.offsets) === JSON.stringify(L.text_offset),
      'streamed completions logprobs equal the non-stream ones');
const cl0 = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 2, temperature: 0, logprobs: 0 });
check(cl0.choices[0].logprobs.tokens.length === 2, 'completions logprobs: 0');
const plainC = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 2, temperature: 0 });
check(plainC.choices[0].logprobs === null, 'no logprobs unless asked');

// CORS (the server runs with --cors http://allowed.example)
{
  const pre = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://allowed.example',
    'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' } });
  check(pre.status === 204 && pre.headers.get('access-control-allow-origin') === 'http://allowed.example' &&
        /POST/.test(pre.headers.get('access-control-allow-methods')) &&
        /authorization/i.test(pre.headers.get('access-control-allow-headers')), 'CORS preflight (no key needed)');
  const ok = await fetch(`${base}/v1/models`, { headers: { ...auth, Origin: 'http://allowed.example' } });
  check(ok.headers.get('access-control-allow-origin') === 'http://allowed.example', 'CORS header on an allowed origin');
  const other = await fetch(`${base}/v1/models`, { headers: { ...auth, Origin: 'http://evil.example' } });
  check(other.status === 200 && other.headers.get('access-control-allow-origin') === null, 'no CORS header for other origins');
  const otherPre = await fetch(`${base}/v1/models`, { method: 'OPTIONS', headers: { Origin: 'http://evil.example' } });
  check(otherPre.status === 405, 'no preflight for other origins');
  const sse = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { ...auth, 'Content-Type': 'application/json',
    Origin: 'http://allowed.example' }, body: JSON.stringify({ ...greedy, max_tokens: 2, stream: true }) });
  await sse.text();
  check(sse.headers.get('access-control-allow-origin') === 'http://allowed.example', 'CORS header on SSE');
}

// speculative decoding (the server runs with --lookup-ngram 3): greedy output equals that of a
// request that does not speculate; timings count the drafts; /stats and /metrics report them
const rep = { model: 'x', prompt: 'def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(',
  max_tokens: 24, temperature: 0 };
const sp = await post('/v1/completions', rep);
const ns = await post('/v1/completions', { ...rep, num_draft: 0 });
const off = await post('/v1/completions', { ...rep, speculative: false });
const capped = await post('/v1/completions', { ...rep, speculative: { num_draft: 1 } });
check(sp.status === 200 && ns.status === 200 && sp.json.choices[0].text === ns.json.choices[0].text,
  'speculative greedy output equals plain greedy output');
check(sp.json.timings.draft_n > 0 && sp.json.timings.draft_accepted_n <= sp.json.timings.draft_n &&
  typeof sp.json.timings.draft_acceptance_rate === 'number', 'speculative timings count drafts');
check(ns.json.timings.draft_n === 0 && off.json.timings.draft_n === 0, 'num_draft 0 / speculative false: no drafts');
check(capped.status === 200 && capped.json.choices[0].text === ns.json.choices[0].text, 'speculative {num_draft: 1}');
for (const bad of [{ speculative: 'yes' }, { speculative: { gamma: 2 } }, { num_draft: -1 }]) {
  const b = await post('/v1/completions', { ...rep, ...bad });
  check(b.status === 400 && /speculative|num_draft/.test(b.json.error.message), `${JSON.stringify(bad)}: 400`);
}
const stats = await (await fetch(`${base}/stats`, { headers: auth })).json();
check(stats.speculative && stats.speculative.draft_tokens > 0 && stats.speculative.acceptance_rate >= 0 &&
  stats.speculative.acceptance_rate <= 1, '/stats speculative');
// the policy's steps: the first round of each request is measured, so some steps speculated;
// prompt lookup makes no draft-model steps
check(stats.speculative.steps > 0 && stats.speculative.declined_steps >= 0 &&
  stats.speculative.draft_steps === 0, '/stats speculative steps');

// /metrics: every docs/server.md "Metrics and stats" name the engine can report
const metrics = await (await fetch(`${base}/metrics`, { headers: auth })).text();
const names = ['cinfer_requests_total', 'cinfer_prompt_tokens_total', 'cinfer_prompt_tokens_cached_total',
  'cinfer_generation_tokens_total', 'cinfer_prefix_cache_hits_total', 'cinfer_prefix_cache_misses_total',
  'cinfer_spec_draft_tokens_total', 'cinfer_spec_accepted_tokens_total', 'cinfer_spec_steps_total',
  'cinfer_spec_declined_steps_total', 'cinfer_spec_draft_steps_total', 'cinfer_requests_running',
  'cinfer_requests_waiting', 'cinfer_kv_bytes_used', 'cinfer_kv_bytes_budget', 'cinfer_prefix_cache_bytes',
  'cinfer_weights_bytes', 'cinfer_time_to_first_token_seconds', 'cinfer_inter_token_latency_seconds',
  'cinfer_queue_time_seconds', 'cinfer_request_duration_seconds', 'cinfer_kv_conversions_total',
  'cinfer_kv_blocks_used', 'cinfer_kv_blocks_free'];
const missing = names.filter((n) => !new RegExp(`^# TYPE ${n} `, 'm').test(metrics));
check(missing.length === 0, `metrics names (missing: ${missing.join(', ') || 'none'})`);
check(/^cinfer_weights_bytes [1-9]\d*$/m.test(metrics), 'weights bytes');
check(/^cinfer_spec_draft_tokens_total [1-9]\d*$/m.test(metrics), 'speculative drafts counted');
// the affine 8-bit request above converted: counted under its codec
check(/^cinfer_kv_conversions_total\{codec="affine:8:64"\} [1-9]\d*$/m.test(metrics), 'KV conversions per codec');
console.log('extensions: all passed');
