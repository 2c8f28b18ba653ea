// /v1/responses through the openai client: text, instructions, usage, max_output_tokens
// (incomplete), streaming events equal to the non-streaming text, previous_response_id from the
// in-memory store (and a 404 for an unknown id), function tools with tool_choice required, and a
// function_call_output round trip.
import { OpenAI, check } from './common.mjs';
import { base } from './common.mjs';

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'test-key', maxRetries: 0 });
const input = 'Write a Python function that adds two numbers.';

const r = await client.responses.create({ model: 'x', input, instructions: 'You write code.', max_output_tokens: 16, temperature: 0 });
check(r.object === 'response' && r.id.startsWith('resp_') && r.status === 'incomplete' &&
      r.incomplete_details?.reason === 'max_output_tokens', 'response object, incomplete at max_output_tokens');
check(r.output[0].type === 'message' && r.output[0].content[0].type === 'output_text' &&
      r.output_text.length > 0 && r.output_text === r.output[0].content[0].text, 'output_text');
check(r.usage.output_tokens === 16 && r.usage.input_tokens > 0 &&
      r.usage.total_tokens === r.usage.input_tokens + 16 && r.instructions === 'You write code.', 'usage and instructions');
const plain = await client.responses.create({ model: 'x', input, max_output_tokens: 16, temperature: 0 });
check(plain.usage.input_tokens < r.usage.input_tokens, 'instructions are part of the prompt');

// streaming: the event grammar and the same text
const events = [];
let streamed = '';
const stream = await client.responses.create({ model: 'x', input, instructions: 'You write code.', max_output_tokens: 16, temperature: 0, stream: true });
for await (const e of stream) {
  events.push(e.type);
  if (e.type === 'response.output_text.delta') streamed += e.delta;
}
check(events[0] === 'response.created' && events[1] === 'response.in_progress' &&
      events.includes('response.output_item.added') && events.includes('response.content_part.added') &&
      events.includes('response.output_text.done') && events.includes('response.output_item.done') &&
      events.at(-1) === 'response.incomplete', `stream events (${events.length})`);
check(streamed === r.output_text, 'streamed text equals the non-streaming text');
const helper = client.responses.stream({ model: 'x', input, instructions: 'You write code.', max_output_tokens: 16, temperature: 0 });
const final = await helper.finalResponse();
check(final.output_text === r.output_text, 'responses.stream() finalResponse');

// previous_response_id continues the stored conversation
const follow = await client.responses.create({ model: 'x', input: 'Now make it subtract.', previous_response_id: r.id, max_output_tokens: 8, temperature: 0 });
check(follow.previous_response_id === r.id && follow.usage.input_tokens > r.usage.input_tokens + 16,
      `previous_response_id carries the conversation (${follow.usage.input_tokens} input tokens)`);
let missing = null;
try { await client.responses.create({ model: 'x', input: 'hi', previous_response_id: 'resp_nope' }); } catch (e) { missing = e; }
check(missing && missing.status === 404, 'an unknown previous_response_id is a 404');
const unstored = await client.responses.create({ model: 'x', input, store: false, max_output_tokens: 4 });
let gone = null;
try { await client.responses.create({ model: 'x', input: 'hi', previous_response_id: unstored.id, max_output_tokens: 4 }); } catch (e) { gone = e; }
check(gone && gone.status === 404, 'store: false keeps nothing');

// function tools: tool_choice required gives a function_call item; its output continues
const tools = [{ type: 'function', name: 'add', description: 'Adds two numbers.', strict: true,
  parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'], additionalProperties: false } }];
const called = await client.responses.create({ model: 'x', input: 'What is 2 + 3?', tools, tool_choice: 'required', max_output_tokens: 64, temperature: 0 });
const call = called.output.find((o) => o.type === 'function_call');
check(call && call.name === 'add' && call.call_id && typeof JSON.parse(call.arguments).a === 'number', `function_call item ${call?.arguments}`);
const answered = await client.responses.create({ model: 'x', previous_response_id: called.id, tools, max_output_tokens: 8, temperature: 0,
  input: [{ type: 'function_call_output', call_id: call.call_id, output: '5' }] });
check(answered.status !== 'failed' && answered.usage.input_tokens > called.usage.input_tokens, 'function_call_output round trip');
let badTool = null;
try { await client.responses.create({ model: 'x', input: 'hi', tools: [{ type: 'web_search' }] }); } catch (e) { badTool = e; }
check(badTool && badTool.status === 400, 'unsupported tool types are a 400');
