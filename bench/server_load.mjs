#!/usr/bin/env node
// Load generator of bench/server.sh: drives any OpenAI-compatible server (cinfer serve,
// llama-server, ...) with a fixed, deterministic streaming workload and writes one JSON file per
// run with per-request timings and their aggregates (node:http, one connection per request, and
// SSE parsing; no client library).
//
// Requests: --api completions (default) sends /v1/completions with the prompt as token ids
// (--tokenizer needed; --bos-id first), so every server sees exactly the same tokens without
// a chat template or tool-call parser in the way; --api chat sends /v1/chat/completions with
// the same texts as messages (the servers tokenize and apply their chat templates).
// Modes:
//   throughput  N requests, C kept in flight (closed loop): each prompt is its own seeded word
//               sequence of exactly --prompt-tokens tokens (counted with --tokenizer when
//               given), --max-tokens, temperature 0, ignore_eos.
//               Aggregates: output tok/s = output tokens / wall time, TTFT (request sent ->
//               first content token), ITL (gaps between content chunks), TPOT (per request:
//               (last - first token time) / (tokens - 1)), each p50/p99.
//   prefix      sequential requests sharing one seeded system prompt of --system-tokens
//               tokens, each with its own short question (completions: "\n\nQuestion: ...
//               \nAnswer:" after the shared text): request 1 is cold, the rest warm;
//               reports each TTFT and the cached prompt tokens the server says it reused.
//   restart     one request of exactly --prompt-tokens seeded tokens (the same in every run
//               with the same --seed); --phase cold also POSTs /v1/cache/save afterwards (the
//               server runs with --prompt-cache-dir), --phase warm is the same request on a
//               restarted server over that directory: TTFT after a restart vs cold.
// --ban-partial-utf8 sends, with every request, logit_bias -100 for the byte-level BPE tokens of
// --tokenizer whose bytes are not valid UTF-8 on their own (1352 of Llama 3's 128000): a
// random-weight model strings such fragments into invalid UTF-8, which trained models do not
// emit and on which llama-server's output parser fails the request (HTTP 500 mid-stream).
// Before measuring: waits (bounded) for the machine to go idle and sends --warmup unrelated
// short requests. While measuring it samples /proc/stat and the server's /proc/PID/stat
// (--server-pid) to report how much CPU other processes took ("interference").
//
// Usage: node bench/server_load.mjs --url http://127.0.0.1:PORT --out FILE [--mode throughput]
//   [--concurrency C] [--requests N] [--prompt-tokens P] [--max-tokens M] [--system-tokens S]
//   [--api completions|chat] [--tokenizer tokenizer.json] [--bos-id ID] [--seed 1]
//   [--ignore-eos] [--ban-partial-utf8] [--label NAME] [--server-pid PID]
//   [--warmup 1] [--wait-idle 60] [--timeout 900] [--phase cold|warm] [--adapters A,B,...]
// --adapters: cinfer's LoRA adapters (mounted ids), one per request in turn (bench/adapters.sh).
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

// ==== Arguments ====

function parseArgs(argv) {
  const a = {
    url: null, out: null, mode: 'throughput', concurrency: 1, requests: 0, 'prompt-tokens': 128,
    'max-tokens': 32, 'system-tokens': 2048, tokenizer: null, seed: 1, 'ignore-eos': false,
    label: '', 'server-pid': 0, api: 'completions', 'bos-id': -1, 'ban-partial-utf8': false, warmup: 1, 'wait-idle': 60, timeout: 900, phase: 'cold',
    adapters: '',
  };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    if (!(k in a)) throw new Error(`unknown option ${argv[i]}`);
    if (typeof a[k] === 'boolean') a[k] = true;
    else a[k] = typeof a[k] === 'number' ? Number(argv[++i]) : argv[++i];
  }
  if (!a.url || !a.out) throw new Error('--url and --out are required');
  if (!['completions', 'chat'].includes(a.api)) throw new Error('--api is completions or chat');
  if (a.api === 'completions' && !a.tokenizer) throw new Error('--api completions needs --tokenizer');
  if (!a.requests) a.requests = a.mode === 'prefix' ? 5 : Math.max(2 * a.concurrency, 8);
  return a;
}

// ==== Deterministic prompts ====

// Common English words; a seeded PRNG strings them into text, trimmed to an exact token count.
const WORDS = `the of and to in is that for it as was with be by on not he this are or his from
at which but have an they you were her she there one all we their has been would more will if
no when what so said who can about up out them time some could into other than then now only
its like new these two may first any after well also made over did many before must through back
years where much your way down should because each just those people how too little state good
very make world still own see men work long here get both between life being under never day
same another know while last might great old year off come since against go came right used take
three states himself few house use during without again place around however home small found
thought went say part once general high upon school every does got united left number course war
until always away something fact though water less public put think almost hand enough far took
head yet government system better set told nothing night end why called didn find going look asked
later point knew city next program business give group toward young days let room president side
social given present several order national possible rather second face per among form important
often things looked early white case become large big need four within felt along children saw
best church ever least power development light thing seemed family interest want members mind
country area others done turned although open problem help sense began certain money times`.split(/\s+/);

function mulberry32(seed) {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let r = Math.imul(t ^ (t >>> 15), 1 | t);
    r = (r + Math.imul(r ^ (r >>> 7), 61 | r)) ^ r;
    return ((r ^ (r >>> 14)) >>> 0) / 4294967296;
  };
}

function wordText(seed, nWords) {
  const rnd = mulberry32(seed);
  const out = [];
  for (let i = 0; i < nWords; i++) {
    let w = WORDS[Math.floor(rnd() * WORDS.length)];
    if (i === 0 || rnd() < 0.08) w = w[0].toUpperCase() + w.slice(1);
    out.push(w);
    if (rnd() < 0.07) out[out.length - 1] += '.';
  }
  return out.join(' ');
}

// A text of exactly `tokens` tokens (when a tokenizer is given; else `tokens` words, which is
// close for these common words). Returns {text, ids (its tokens, or null), tokens: counted or null}.
async function exactText(tok, seed, tokens) {
  let text = wordText(seed, tokens + 8);
  if (!tok) return { text: wordText(seed, tokens), ids: null, tokens: null };
  const ids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  text = await tok.decode(ids.slice(0, tokens), true);
  const again = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  return { text, ids: again, tokens: again.length };
}

const encode = async (tok, text) => (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
const withBos = (a, ids) => (a['bos-id'] >= 0 ? [a['bos-id'], ...ids] : ids);

async function loadTokenizer(file) {
  if (!file) return null;
  const require = createRequire(import.meta.url);
  const dir = path.dirname(new URL(import.meta.url).pathname);
  const { Tokenizer } = require(path.join(dir, '../tests/npm/node_modules/@anush008/tokenizers'));
  return Tokenizer.fromFile(file);
}

// Token ids of a byte-level BPE tokenizer.json whose bytes are not valid UTF-8 by themselves.
function partialUtf8Tokens(file) {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const byteOf = new Map(bs.map((b) => [String.fromCodePoint(b), b]));
  for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) byteOf.set(String.fromCodePoint(256 + n++), b);
  const vocab = JSON.parse(fs.readFileSync(file, 'utf8')).model.vocab;
  const strict = new TextDecoder('utf-8', { fatal: true }), ids = [];
  for (const [piece, id] of Object.entries(vocab)) {
    const bytes = Uint8Array.from([...piece].map((ch) => byteOf.get(ch) ?? 0));
    try { strict.decode(bytes); } catch { ids.push(id); }
  }
  return ids.sort((x, y) => x - y);
}

const QUESTIONS = [
  'What is the main idea of the text above?', 'Summarize the second paragraph in one line.',
  'Which word appears most often?', 'Give the text a short title.',
  'Is the tone formal or informal?', 'List three nouns from the text.',
  'Translate the first sentence into French.', 'How many sentences are there?',
  'What would be a good follow-up question?', 'Name one thing the text does not mention.',
];

// ==== CPU accounting (Linux /proc) ====

const HZ = 100; // USER_HZ on Linux
function machineBusy() {
  const v = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1, 9).map(Number);
  const [user, nice, system, , , irq, softirq, steal] = v;
  return (user + nice + system + irq + softirq + steal) / HZ;
}
function processCpu(pid) {
  if (!pid) return 0;
  try {
    const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / HZ; // utime, stime
  } catch { return 0; }
}
function selfCpu() { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; }
function cpuSnapshot(pid) { return { t: performance.now(), busy: machineBusy(), server: processCpu(pid), client: selfCpu() }; }
function cpuDelta(a, b) {
  const wall = (b.t - a.t) / 1000, ncpu = os.cpus().length;
  const server = b.server - a.server, client = b.client - a.client, busy = b.busy - a.busy;
  const other = Math.max(0, busy - server - client);
  return { wall_s: wall, cpus: ncpu, busy_s: busy, server_s: server, client_s: client, other_s: other,
    interference: wall > 0 ? other / (wall * ncpu) : 0 };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function waitIdle(limitS) {
  const deadline = performance.now() + limitS * 1000, ncpu = os.cpus().length;
  let calm = 0;
  while (calm < 3 && performance.now() < deadline) {
    const b0 = machineBusy(), t0 = performance.now();
    await sleep(1000);
    const frac = (machineBusy() - b0) / (((performance.now() - t0) / 1000) * ncpu);
    calm = frac < 0.15 ? calm + 1 : 0;
  }
  return calm >= 3;
}

// ==== One streamed request ====

// POSTs JSON on a connection of its own (no keep-alive: a pooled connection that the server has
// just closed would fail the request); resolves with the response stream.
function post(url, body, timeoutS) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request(url, {
      method: 'POST', agent: false, signal: AbortSignal.timeout(timeoutS * 1000),
      headers: { 'content-type': 'application/json', 'content-length': data.length },
    }, resolve);
    req.on('error', reject);
    req.end(data);
  });
}

// Sends a streaming request: `input` is {messages} (chat) or {prompt} (completions: text or
// token ids). Returns {ttft_ms, itl_ms[], content_chunks, tokens, prompt_tokens, cached_tokens,
// latency_ms, finish_reason, error}. Times are from just before the request is sent.
async function streamRequest(a, input, maxTokens) {
  const chat = 'messages' in input;
  const body = {
    model: a.label || 'bench', ...input, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  };
  if (a['ignore-eos']) body.ignore_eos = true;
  if (a.logitBias) body.logit_bias = a.logitBias;
  if (a.adapters) { // --adapters A,B,...: request i runs with adapter i mod n (cinfer's "adapter")
    const list = a.adapters.split(',');
    a.adapterNext = (a.adapterNext || 0) + 1;
    body.adapter = list[(a.adapterNext - 1) % list.length];
  }
  const r = { ttft_ms: null, itl_ms: [], content_chunks: 0, tokens: null, prompt_tokens: null,
    cached_tokens: null, latency_ms: null, finish_reason: null, error: null };
  let t0 = performance.now();
  let last = null;
  try {
    const res = await post(`${a.url}/v1/${chat ? 'chat/completions' : 'completions'}`, body, a.timeout);
    if (res.statusCode !== 200) {
      let text = '';
      for await (const b of res) text += b;
      throw new Error(`HTTP ${res.statusCode}: ${text.slice(0, 300)}`);
    }
    const decoder = new TextDecoder();
    let buf = '';
    for await (const bytes of res) {
      const now = performance.now();
      buf += decoder.decode(bytes, { stream: true });
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(`stream error: ${JSON.stringify(j.error).slice(0, 300)}`);
          const c = j.choices && j.choices[0];
          const text = !c ? '' : chat ? (c.delta ? (c.delta.content || '') + (c.delta.reasoning_content || '') : '')
            : (c.text || '');
          if (text.length) {
            if (last === null) r.ttft_ms = now - t0;
            else r.itl_ms.push(now - last);
            last = now;
            r.content_chunks++;
          }
          if (c && c.finish_reason) r.finish_reason = c.finish_reason;
          if (j.usage) {
            r.tokens = j.usage.completion_tokens;
            r.prompt_tokens = j.usage.prompt_tokens;
            const d = j.usage.prompt_tokens_details;
            if (d && typeof d.cached_tokens === 'number') r.cached_tokens = d.cached_tokens;
          }
          if (j.timings && typeof j.timings.cache_n === 'number' && r.cached_tokens === null)
            r.cached_tokens = j.timings.cache_n;
        }
      }
    }
  } catch (e) {
    r.error = String(e && e.message ? e.message : e);
  }
  r.latency_ms = performance.now() - t0;
  if (r.tokens === null) r.tokens = r.content_chunks;
  r.first_ms = r.ttft_ms; // relative to its own send time
  r.last_ms = last === null ? null : last - t0;
  return r;
}

// ==== Statistics ====

function quantile(xs, q) {
  if (!xs.length) return null;
  const s = [...xs].sort((x, y) => x - y), pos = (s.length - 1) * q, lo = Math.floor(pos);
  return lo + 1 < s.length ? s[lo] + (s[lo + 1] - s[lo]) * (pos - lo) : s[lo];
}
const stats = (xs) => ({ p50: quantile(xs, 0.5), p99: quantile(xs, 0.99), mean: xs.length ? xs.reduce((x, y) => x + y, 0) / xs.length : null, n: xs.length });

// ==== Modes ====

async function throughput(a, tok) {
  const prompts = [];
  for (let i = 0; i < a.requests; i++) prompts.push(await exactText(tok, a.seed * 100003 + i, a['prompt-tokens']));
  const results = new Array(a.requests);
  let next = 0;
  const cpu0 = cpuSnapshot(a['server-pid']), t0 = performance.now();
  async function worker() {
    while (next < a.requests) {
      const i = next++;
      const sent = performance.now() - t0;
      const input = a.api === 'chat' ? { messages: [{ role: 'user', content: prompts[i].text }] }
        : { prompt: withBos(a, prompts[i].ids) };
      const r = await streamRequest(a, input, a['max-tokens']);
      results[i] = { index: i, sent_ms: sent, ...r };
    }
  }
  await Promise.all(Array.from({ length: a.concurrency }, worker));
  const wall = (performance.now() - t0) / 1000, cpu = cpuDelta(cpu0, cpuSnapshot(a['server-pid']));
  const ok = results.filter((r) => !r.error);
  const outTokens = ok.reduce((s, r) => s + r.tokens, 0), inTokens = ok.reduce((s, r) => s + (r.prompt_tokens || 0), 0);
  const tpot = ok.filter((r) => r.tokens > 1 && r.last_ms !== null).map((r) => (r.last_ms - r.first_ms) / (r.tokens - 1));
  return {
    config: { api: a.api, prompt_tokens: a['prompt-tokens'], prompt_tokens_counted: prompts.map((p) => p.tokens),
      max_tokens: a['max-tokens'], concurrency: a.concurrency, requests: a.requests },
    summary: {
      wall_s: wall, requests_ok: ok.length, errors: results.length - ok.length,
      output_tokens: outTokens, prompt_tokens: inTokens,
      output_tokens_per_request: { min: Math.min(...ok.map((r) => r.tokens)), max: Math.max(...ok.map((r) => r.tokens)) },
      server_prompt_tokens: { min: Math.min(...ok.map((r) => r.prompt_tokens)), max: Math.max(...ok.map((r) => r.prompt_tokens)) },
      short_requests: ok.filter((r) => r.tokens < a['max-tokens']).length,
      output_tok_s: outTokens / wall, total_tok_s: (outTokens + inTokens) / wall,
      ttft_ms: stats(ok.map((r) => r.ttft_ms).filter((x) => x !== null)),
      itl_ms: stats(ok.flatMap((r) => r.itl_ms)),
      tpot_ms: stats(tpot),
      latency_ms: stats(ok.map((r) => r.latency_ms)),
      first_error: results.find((r) => r.error)?.error ?? null,
      cpu,
    },
    requests: results.map(({ itl_ms, ...r }) => ({ ...r, itl_ms: itl_ms.map((x) => Math.round(x * 100) / 100) })),
  };
}

async function prefix(a, tok) {
  const system = await exactText(tok, a.seed * 7919 + 17, a['system-tokens']);
  const results = [];
  const cpu0 = cpuSnapshot(a['server-pid']);
  for (let i = 0; i < a.requests; i++) {
    const q = QUESTIONS[i % QUESTIONS.length];
    const input = a.api === 'chat'
      ? { messages: [{ role: 'system', content: system.text }, { role: 'user', content: q }] }
      : { prompt: withBos(a, [...system.ids, ...(await encode(tok, `\n\nQuestion: ${q}\nAnswer:`))]) };
    results.push({ index: i, warm: i > 0, ...(await streamRequest(a, input, a['max-tokens'])) });
  }
  const cpu = cpuDelta(cpu0, cpuSnapshot(a['server-pid']));
  const cold = results[0], warm = results.slice(1).filter((r) => !r.error && r.ttft_ms !== null);
  const warmTtft = quantile(warm.map((r) => r.ttft_ms), 0.5);
  return {
    config: { api: a.api, system_tokens: a['system-tokens'], system_tokens_counted: system.tokens,
      max_tokens: a['max-tokens'], requests: a.requests },
    summary: {
      cold_ttft_ms: cold.error ? null : cold.ttft_ms,
      warm_ttft_ms_p50: warmTtft,
      warm_ttft_ms: warm.map((r) => r.ttft_ms),
      cold_over_warm: cold.ttft_ms && warmTtft ? cold.ttft_ms / warmTtft : null,
      prompt_tokens: results.map((r) => r.prompt_tokens),
      cached_tokens: results.map((r) => r.cached_tokens),
      errors: results.filter((r) => r.error).length,
      first_error: results.find((r) => r.error)?.error ?? null,
      cpu,
    },
    requests: results,
  };
}

// One long prompt, cold (then saved to the server's prompt cache directory) or after a restart.
async function restart(a, tok) {
  const prompt = await exactText(tok, a.seed * 15485863 + 5, a['prompt-tokens']);
  const input = a.api === 'chat' ? { messages: [{ role: 'user', content: prompt.text }] }
    : { prompt: withBos(a, prompt.ids) };
  const cpu0 = cpuSnapshot(a['server-pid']);
  const r = await streamRequest(a, input, a['max-tokens']);
  let saved = null;
  if (a.phase === 'cold') {
    const res = await post(`${a.url}/v1/cache/save`, {}, a.timeout);
    let text = '';
    for await (const b of res) text += b;
    saved = res.statusCode === 200 ? JSON.parse(text) : { error: `HTTP ${res.statusCode}: ${text.slice(0, 300)}` };
  }
  return {
    config: { api: a.api, prompt_tokens: a['prompt-tokens'], prompt_tokens_counted: prompt.tokens,
      max_tokens: a['max-tokens'], phase: a.phase },
    summary: { phase: a.phase, ttft_ms: r.error ? null : r.ttft_ms, prompt_tokens: r.prompt_tokens,
      cached_tokens: r.cached_tokens, saved, errors: r.error ? 1 : 0, first_error: r.error,
      cpu: cpuDelta(cpu0, cpuSnapshot(a['server-pid'])) },
    requests: [r],
  };
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const tok = await loadTokenizer(a.tokenizer);
  if (a['ban-partial-utf8']) {
    if (!a.tokenizer) throw new Error('--ban-partial-utf8 needs --tokenizer');
    a.banned = partialUtf8Tokens(a.tokenizer);
    a.logitBias = Object.fromEntries(a.banned.map((id) => [String(id), -100]));
  }
  const idle = a['wait-idle'] > 0 ? await waitIdle(a['wait-idle']) : null;
  for (let i = 0; i < a.warmup; i++) {
    const text = `Warm-up ${i}: say something.`;
    const w = await streamRequest(a, a.api === 'chat' ? { messages: [{ role: 'user', content: text }] }
      : { prompt: withBos(a, await encode(tok, text)) }, 4);
    if (w.error) throw new Error(`warm-up request failed: ${w.error}`);
  }
  const run = a.mode === 'prefix' ? await prefix(a, tok)
    : a.mode === 'restart' ? await restart(a, tok) : await throughput(a, tok);
  const out = { label: a.label, url: a.url, mode: a.mode, ignore_eos: a['ignore-eos'], seed: a.seed,
    banned_tokens: a.banned ? a.banned.length : 0,
    machine_idle_before: idle, date: new Date().toISOString(), ...run };
  fs.writeFileSync(a.out, JSON.stringify(out, null, 1) + '\n');
  const s = out.summary;
  if (a.mode === 'restart')
    console.error(`server_load: ${a.label} restart ${a.phase}: TTFT ${s.ttft_ms?.toFixed(0)} ms, prompt ${s.prompt_tokens}, cached ${s.cached_tokens}, errors ${s.errors}`);
  else if (a.mode === 'prefix')
    console.error(`server_load: ${a.label} prefix: cold ${s.cold_ttft_ms?.toFixed(0)} ms, warm p50 ${s.warm_ttft_ms_p50?.toFixed(0)} ms, cached ${JSON.stringify(s.cached_tokens)}, errors ${s.errors}`);
  else
    console.error(`server_load: ${a.label} C=${a.concurrency}: ${s.output_tok_s.toFixed(2)} tok/s, TTFT p50 ${s.ttft_ms.p50?.toFixed(0)} ms, ITL p50 ${s.itl_ms.p50?.toFixed(1)} ms, ${s.output_tokens} tokens in ${s.wall_s.toFixed(1)} s, errors ${s.errors}, interference ${s.cpu.interference.toFixed(3)}`);
  if (a.mode === 'throughput' && s.requests_ok === 0) process.exit(1);
}

main().catch((e) => { console.error(`server_load: ${e.stack || e}`); process.exit(1); });
