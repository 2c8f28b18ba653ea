// The @anthropic-ai/sdk client against a live server: messages (stream and not), system,
// stop_sequences, tool_use / tool_result round trip, tool_choice any / tool (enforced tool calls),
// usage.
import { Anthropic, base, check } from './common.mjs';

const client = new Anthropic({ baseURL: base, apiKey: 'test-key', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Write a Python function that adds two numbers.' }];
const m = await client.messages.create({ model: 'x', max_tokens: 10, system: 'You write code.', messages, temperature: 0 });
check(m.type === 'message' && m.id.startsWith('msg_') && m.content[0].type === 'text', 'message shape');
check(m.stop_reason === 'max_tokens' && m.usage.output_tokens === 10 && m.usage.input_tokens > 0, 'stop_reason and usage');

const stream = client.messages.stream({ model: 'x', max_tokens: 10, system: 'You write code.', messages, temperature: 0 });
let text = '';
stream.on('text', (t) => { text += t; });
const final = await stream.finalMessage();
check(text === m.content[0].text && final.content[0].text === text, 'stream text equals non-stream text');
check(final.stop_reason === 'max_tokens', 'stream stop_reason');

const stopAt = m.content[0].text.slice(2, 5);
const s = await client.messages.create({ model: 'x', max_tokens: 10, system: 'You write code.', messages, temperature: 0, stop_sequences: [stopAt] });
check(s.stop_reason === 'stop_sequence' && s.stop_sequence === stopAt &&
      s.content[0].text === m.content[0].text.slice(0, m.content[0].text.indexOf(stopAt)), 'stop_sequences');

const tools = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
const t = await client.messages.create({ model: 'x', max_tokens: 8, tools, temperature: 0, messages: [
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }] }] });
check(t.type === 'message' && t.usage.output_tokens > 0, 'tool_use / tool_result round trip');

// tool_choice "any" and a named tool force a tool_use block whose input follows the schema.
for (const choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
  const forced = await client.messages.create({ model: 'x', max_tokens: 96, tools, tool_choice: choice, temperature: 0,
    messages: [{ role: 'user', content: 'Write a Python function that adds two numbers.' }] });
  const uses = forced.content.filter((b) => b.type === 'tool_use');
  check(forced.stop_reason === 'tool_use' && uses.length >= 1 && uses[0].name === 'get_weather' &&
        typeof uses[0].input === 'object' && uses[0].input !== null &&
        (uses[0].input.city === undefined || typeof uses[0].input.city === 'string'),
        `tool_choice ${choice.type}: ${JSON.stringify(forced.content)}`);
}

try {
  await client.messages.create({ model: 'x', max_tokens: 8, messages: [{ role: 'system', content: 'x' }] });
  check(false, 'bad role rejected');
} catch (e) {
  check(e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error', 'bad role: 400 in Anthropic shape');
}
console.log('anthropic: all passed');
