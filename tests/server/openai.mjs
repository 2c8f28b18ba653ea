// The openai SDK against a live server: models, chat (stream and not), usage, stop strings,
// logprobs, completions, a tool round trip, cancellation mid-stream.
import { OpenAI, base, check, idle } from './common.mjs';

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Write a Python function that adds two numbers.' }];

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].object === 'model', 'models.list');

const r = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0 });
check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-'), 'chat object and id');
check(typeof r.choices[0].message.content === 'string' && r.choices[0].message.content.length > 0, 'chat content');
check(r.choices[0].finish_reason === 'length', 'finish_reason length');
check(r.usage.completion_tokens === 12 && r.usage.prompt_tokens > 0 &&
      r.usage.total_tokens === r.usage.prompt_tokens + 12, 'usage');
check(r.usage.prompt_tokens_details.cached_tokens === 0, 'cached_tokens reported');

// the prefix cache: a repeated long prompt reuses its full KV blocks and answers the same
const shared = [{ role: 'system', content: 'You are a careful Python assistant. '.repeat(12) },
  { role: 'user', content: 'Write a function that reverses a list.' }];
const cold = await client.chat.completions.create({ model: 'x', messages: shared, max_tokens: 8, temperature: 0 });
const warm = await client.chat.completions.create({ model: 'x', messages: shared, max_tokens: 8, temperature: 0 });
check(cold.usage.prompt_tokens_details.cached_tokens === 0 &&
      warm.usage.prompt_tokens_details.cached_tokens > 0 &&
      warm.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens &&
      warm.choices[0].message.content === cold.choices[0].message.content,
      `prefix cache hit (${warm.usage.prompt_tokens_details.cached_tokens} of ${warm.usage.prompt_tokens} cached)`);

// streaming gives the same greedy text
const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0,
  stream: true, stream_options: { include_usage: true } });
let text = '', finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(text === r.choices[0].message.content, 'stream text equals non-stream text');
check(finish === 'length' && usage && usage.completion_tokens === 12, 'stream finish and usage');

// stop strings: cut before the stop, never leaked
const full = r.choices[0].message.content;
const stopAt = full.slice(3, 6);
const s = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0, stop: [stopAt] });
check(s.choices[0].finish_reason === 'stop' && s.choices[0].message.content === full.slice(0, full.indexOf(stopAt)),
      `stop string ${JSON.stringify(stopAt)}`);
const ss = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0, stop: stopAt, stream: true });
let stext = '';
for await (const chunk of ss) for (const c of chunk.choices) stext += c.delta.content ?? '';
check(stext === s.choices[0].message.content, 'streamed stop string not leaked');

// logprobs
const lp = await client.chat.completions.create({ model: 'x', messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
check(lp.choices[0].logprobs.content.length === 3 && lp.choices[0].logprobs.content[0].top_logprobs.length === 2, 'logprobs');

// seeded sampling is reproducible
const a = await client.chat.completions.create({ model: 'x', messages, max_tokens: 8, temperature: 1, seed: 42 });
const b = await client.chat.completions.create({ model: 'x', messages, max_tokens: 8, temperature: 1, seed: 42 });
check(a.choices[0].message.content === b.choices[0].message.content, 'seed reproduces');

// completions
const c = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 6, temperature: 0 });
check(c.object === 'text_completion' && c.choices[0].text.length > 0 && c.usage.completion_tokens === 6, 'completions');

// tool round trip: tools declared, assistant tool call and tool result sent back
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const t1 = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }],
  tools, tool_choice: 'auto', max_tokens: 8, temperature: 0 });
check(['stop', 'length', 'tool_calls'].includes(t1.choices[0].finish_reason), 'tools accepted');
const t2 = await client.chat.completions.create({ model: 'x', max_tokens: 8, temperature: 0, tools, messages: [
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' }] });
check(t2.choices[0].message.role === 'assistant' && t2.usage.prompt_tokens > t1.usage.prompt_tokens, 'tool round trip');

// response_format is honoured (tests/server/structured.mjs has the rest)
const rf = await client.chat.completions.create({ model: 'x', messages, max_tokens: 4, response_format: { type: 'json_object' } });
check(rf.choices[0].message.content.startsWith('{'), 'response_format json_object accepted');

// cancellation mid-stream: abort after two chunks, the engine frees the sequence
const ctl = new AbortController();
const long = await client.chat.completions.create({ model: 'x', messages, max_tokens: 2000, temperature: 0, stream: true },
  { signal: ctl.signal });
let n = 0;
try {
  for await (const _ of long) if (++n === 3) ctl.abort();
} catch (e) { /* aborted */ }
const st = await idle();
check(st.kv.blocks_used === st.prefix_cache.blocks && st.batch.running === 0, 'cancelled stream freed its blocks');
check(st.totals.requests_cancelled >= 1 && st.totals.generation_tokens < 2000 * 2, 'cancelled before max_tokens');
console.log('openai: all passed');
