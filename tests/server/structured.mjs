// Structured output through the openai SDK against a live server: response_format json_schema
// with chat.completions.parse() (parsed object validated here), json_object, streaming, the
// grammar and json_schema extensions on /v1/completions and chat, 400s naming what is not
// supported, and tool_choice required / named enforced (valid tool calls) with its 400s.
import { Anthropic, OpenAI, base, check } from './common.mjs';

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Describe a Python list as JSON.' }];

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    size: { type: 'integer' },
    mutable: { type: 'boolean' },
    kind: { type: 'string', enum: ['list', 'tuple', 'set'] },
    items: { type: 'array', items: { type: 'string', maxLength: 6 }, minItems: 1, maxItems: 3 },
  },
  required: ['name', 'size', 'mutable', 'kind', 'items'],
  additionalProperties: false,
};

// Checks an object against `schema` (the keywords it uses).
function valid(o) {
  if (typeof o !== 'object' || o === null || Array.isArray(o)) return false;
  const keys = Object.keys(o);
  if (!schema.required.every((k) => keys.includes(k))) return false;
  if (!keys.every((k) => k in schema.properties)) return false;
  return typeof o.name === 'string' && [...o.name].length <= 12 && Number.isInteger(o.size) &&
    typeof o.mutable === 'boolean' && schema.properties.kind.enum.includes(o.kind) &&
    Array.isArray(o.items) && o.items.length >= 1 && o.items.length <= 3 &&
    o.items.every((s) => typeof s === 'string' && [...s].length <= 6);
}

const response_format = { type: 'json_schema', json_schema: { name: 'pylist', schema, strict: true } };
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.parse({ model: 'x', messages, max_tokens: 200, temperature: 1, seed,
    response_format });
  const msg = r.choices[0].message;
  check(r.choices[0].finish_reason === 'stop' && valid(msg.parsed),
        `parse() seed ${seed}: ${msg.content}`);
}

// the same through streaming: the concatenated deltas parse and validate
const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 200, temperature: 0.8,
  top_p: 0.9, seed: 5, response_format, stream: true });
let text = '';
for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? '';
check(valid(JSON.parse(text)), `streamed json_schema: ${text}`);

// json_object: any JSON object
const jo = await client.chat.completions.create({ model: 'x', messages, max_tokens: 300, temperature: 0.7, seed: 9,
  response_format: { type: 'json_object' } });
if (jo.choices[0].finish_reason === 'stop') {
  const o = JSON.parse(jo.choices[0].message.content);
  check(typeof o === 'object' && o !== null && !Array.isArray(o), `json_object: ${jo.choices[0].message.content}`);
} else {
  check(jo.choices[0].message.content.startsWith('{'), 'json_object (cut by max_tokens) starts an object');
}

// the grammar extension (GBNF) on /v1/completions and the json_schema one on chat
const g = await client.completions.create({ model: 'x', prompt: 'def add(a, b):', max_tokens: 20, temperature: 1,
  seed: 4, grammar: 'root ::= "answer: " ("yes" | "no")' });
check(/^answer: (yes|no)$/.test(g.choices[0].text) && g.choices[0].finish_reason === 'stop',
      `grammar on completions: ${g.choices[0].text}`);
const js = await client.chat.completions.create({ model: 'x', messages, max_tokens: 60, temperature: 1, seed: 6,
  json_schema: { type: 'array', items: { type: 'integer', enum: [1, 2, 3] }, minItems: 2, maxItems: 2 } });
const arr = JSON.parse(js.choices[0].message.content);
check(Array.isArray(arr) && arr.length === 2 && arr.every((x) => [1, 2, 3].includes(x)),
      `json_schema extension on chat: ${js.choices[0].message.content}`);

// unsupported features and bad grammars are 400s naming them
async function rejects(params, pattern, what) {
  try {
    await client.chat.completions.create({ model: 'x', messages, max_tokens: 4, ...params });
    check(false, what);
  } catch (e) {
    check(e.status === 400 && pattern.test(e.message), `${what}: ${e.message}`);
  }
}
await rejects({ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'string', pattern: '^a' } } } },
              /unsupported keyword "pattern"/, 'pattern is a 400');
await rejects({ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object',
  properties: { age: { type: 'integer', minimum: 0 } } } } } }, /"minimum" at \/properties\/age/, 'minimum is a 400 naming where');
await rejects({ response_format: { type: 'yaml' } }, /response_format.type "yaml"/, 'unknown response_format type');
await rejects({ grammar: 'root ::= [a-' }, /grammar line 1, column 10/, 'bad GBNF is a 400 with its position');
await rejects({ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, /one of/, 'two constraints');
// tool_choice: "required" and a named function force one tool call whose arguments follow the
// tool's parameters; invalid values are 400s
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 },
      unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } } },
  { type: 'function', function: { name: 'add', description: 'Add two integers',
    parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } },
      required: ['a', 'b'] } } },
];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
function validCall(call) {
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather')
    return typeof args.city === 'string' && [...args.city].length <= 20 && ['c', 'f'].includes(args.unit);
  if (call.function.name === 'add') return Number.isInteger(args.a) && Number.isInteger(args.b);
  return false;
}
for (const seed of [11, 12]) {
  const r = await client.chat.completions.create({ model: 'x', messages: ask, tools, tool_choice: 'required',
    max_tokens: 120, temperature: 1, seed });
  const calls = r.choices[0].message.tool_calls ?? [];
  check(r.choices[0].finish_reason === 'tool_calls' && calls.length === 1 && validCall(calls[0]),
        `tool_choice required seed ${seed}: ${JSON.stringify(calls)}`);
}
const named = await client.chat.completions.create({ model: 'x', messages: ask, tools, max_tokens: 120,
  temperature: 1, seed: 13, tool_choice: { type: 'function', function: { name: 'add' } } });
const nc = named.choices[0].message.tool_calls ?? [];
check(nc.length === 1 && nc[0].function.name === 'add' && validCall(nc[0]), `named tool_choice: ${JSON.stringify(nc)}`);
const streamed = await client.chat.completions.create({ model: 'x', messages: ask, tools, tool_choice: 'required',
  max_tokens: 120, temperature: 1, seed: 14, stream: true });
let streamedName = '', streamedArgs = '';
for await (const chunk of streamed)
  for (const c of chunk.choices)
    for (const tc of c.delta.tool_calls ?? []) {
      streamedName += tc.function?.name ?? '';
      streamedArgs += tc.function?.arguments ?? '';
    }
check(validCall({ function: { name: streamedName, arguments: streamedArgs } }), `streamed required tool call: ${streamedName} ${streamedArgs}`);
await rejects({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, /"nope", which is not in tools/, 'unknown tool name is a 400');
await rejects({ tool_choice: 'required' }, /needs tools/, 'required without tools is a 400');
await rejects({ tools, tool_choice: 'sometimes' }, /tool_choice "sometimes"/, 'unknown tool_choice string is a 400');
await rejects({ tools, tool_choice: 'required', response_format: { type: 'json_object' } }, /cannot be combined/, 'required with response_format');
// the Anthropic route: tool_choice any and tool are enforced the same way, as tool_use blocks
const anthropic = new Anthropic({ baseURL: base, apiKey: 'test-key', maxRetries: 0 });
const aTools = tools.map((t) => ({ name: t.function.name, description: t.function.description,
  input_schema: t.function.parameters }));
for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
  const m = await anthropic.messages.create({ model: 'x', max_tokens: 120, temperature: 1, messages: ask,
    tools: aTools, tool_choice });
  const uses = m.content.filter((b) => b.type === 'tool_use');
  check(m.stop_reason === 'tool_use' && uses.length === 1 &&
        (tool_choice.type === 'any' || uses[0].name === 'get_weather') &&
        validCall({ function: { name: uses[0].name, arguments: JSON.stringify(uses[0].input) } }),
        `anthropic tool_choice ${tool_choice.type}: ${JSON.stringify(uses)}`);
}
try {
  await anthropic.messages.create({ model: 'x', max_tokens: 4, messages: ask, tools: aTools,
    tool_choice: { type: 'tool', name: 'nope' } });
  check(false, 'anthropic unknown tool name');
} catch (e) {
  check(e.status === 400 && /nope.{0,4}, which is not in tools/.test(e.message), `anthropic unknown tool name: ${e.message}`);
}
console.log('structured: all passed');
