// The Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`) and LangChain (`@langchain/openai`)
// against a live server of the starter model: structured output returns an object that the
// client validates against its zod schema (generateObject, generateText with Output.object,
// withStructuredOutput by JSON schema and by function calling), tool choice `required` yields a
// tool call, and each client's embed call returns the model's embeddings.
import { createRequire } from 'node:module';
import { base, check } from './common.mjs';

const require = createRequire((process.env.CI_NPM_DIR || new URL('../npm/node_modules', import.meta.url).pathname) + '/');
const { generateObject, generateText, Output, embed, embedMany, tool } = require('ai');
const { createOpenAICompatible } = require('@ai-sdk/openai-compatible');
const { ChatOpenAI, OpenAIEmbeddings } = require('@langchain/openai');
const { tool: lcTool } = require('@langchain/core/tools');
const { z } = require('zod');

const apiKey = 'test-key';
// what the starter model can fill: short strings, a number, a boolean, an enum, a short array
const Language = z.object({
  name: z.string().max(12),
  year: z.number(),
  typed: z.boolean(),
  kind: z.enum(['compiled', 'interpreted']),
  tags: z.array(z.string().max(6)).min(1).max(3),
});
const prompt = 'Describe the Python programming language as JSON.';
const validated = (o) => Language.safeParse(o).success;
const weather = { description: 'Get the weather in a city', schema: z.object({ city: z.string().max(16) }) };
const hidden = 512; // the starter model's width: every embedding has it, normalized

// ==== Vercel AI SDK ====
const cinfer = createOpenAICompatible({ name: 'cinfer', baseURL: `${base}/v1`, apiKey, supportsStructuredOutputs: true });
const model = cinfer.chatModel('starter');
const settings = { temperature: 0, maxOutputTokens: 200, maxRetries: 0 };

const go = await generateObject({ model, schema: Language, prompt, ...settings });
check(validated(go.object) && go.finishReason === 'stop', `ai generateObject: ${JSON.stringify(go.object)}`);
const gt = await generateText({ model, output: Output.object({ schema: Language }), prompt, ...settings, seed: 3, temperature: 0.8 });
check(validated(gt.output), `ai generateText with Output.object: ${JSON.stringify(gt.output)}`);
const tc = await generateText({
  model, prompt: 'What is the weather in Paris?', toolChoice: 'required', ...settings,
  tools: { get_weather: tool({ description: weather.description, inputSchema: weather.schema }) },
});
check(tc.toolCalls.length >= 1 && tc.toolCalls[0].toolName === 'get_weather' && weather.schema.safeParse(tc.toolCalls[0].input).success,
  `ai toolChoice required: ${JSON.stringify(tc.toolCalls.map((c) => c.input))}`);
const named = await generateText({
  model, prompt: 'Hello', toolChoice: { type: 'tool', toolName: 'get_weather' }, ...settings,
  tools: { get_weather: tool({ description: weather.description, inputSchema: weather.schema }),
    get_time: tool({ description: 'Get the time', inputSchema: z.object({ zone: z.string().max(8) }) }) },
});
check(named.toolCalls.length === 1 && named.toolCalls[0].toolName === 'get_weather', 'ai toolChoice of a named tool');
const e1 = await embed({ model: cinfer.embeddingModel('starter'), value: 'def add(a, b): return a + b', maxRetries: 0 });
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
check(e1.embedding.length === hidden && Math.abs(norm(e1.embedding) - 1) < 1e-3, 'ai embed: a normalized embedding of the model width');
const em = await embedMany({ model: cinfer.embeddingModel('starter'), values: ['one', 'two', 'def add(a, b): return a + b'], maxRetries: 0 });
check(em.embeddings.length === 3 && em.embeddings[2].every((x, i) => Math.abs(x - e1.embedding[i]) < 1e-4), 'ai embedMany: in order, equal to embed');

// ==== LangChain ====
const llm = new ChatOpenAI({ model: 'starter', apiKey, configuration: { baseURL: `${base}/v1` }, temperature: 0, maxTokens: 200, maxRetries: 0 });
for (const method of ['jsonSchema', 'functionCalling']) {
  const structured = llm.withStructuredOutput(Language, { name: 'language', method });
  const o = await structured.invoke(prompt);
  check(validated(o), `langchain withStructuredOutput (${method}): ${JSON.stringify(o)}`);
}
const getWeather = lcTool(async ({ city }) => `sunny in ${city}`, { name: 'get_weather', description: weather.description, schema: weather.schema });
const msg = await llm.bindTools([getWeather], { tool_choice: 'required' }).invoke('What is the weather in Paris?');
check(msg.tool_calls.length >= 1 && msg.tool_calls[0].name === 'get_weather' && weather.schema.safeParse(msg.tool_calls[0].args).success,
  `langchain tool_choice required: ${JSON.stringify(msg.tool_calls)}`);
const embeddings = new OpenAIEmbeddings({ model: 'starter', apiKey, configuration: { baseURL: `${base}/v1` }, maxRetries: 0 });
const q = await embeddings.embedQuery('def add(a, b): return a + b');
check(q.length === hidden && q.every((x, i) => Math.abs(x - e1.embedding[i]) < 1e-4), 'langchain embedQuery: the same embedding');
const docs = await embeddings.embedDocuments(['one', 'two']);
check(docs.length === 2 && docs[0].length === hidden && docs[0].some((x, i) => x !== docs[1][i]), 'langchain embedDocuments');
