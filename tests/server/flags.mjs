// A second server started with the serve flags of issue 17 (tests/test_server.c): --port 0,
// --host localhost, --ctx-size 128, --chat-template FILE (content only), --max-connections 3,
// --idle-timeout 2, --log-format json. Argument: the port it printed.
import net from 'node:net';
import { OpenAI, check } from './common.mjs';

const port = Number(process.argv[2]);
const base = `http://localhost:${port}`;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
const content = 'Write a Python function that adds two numbers.';

// /stats reports the real figures: the thread count the model runs with (every CPU: no --threads)
const st = await (await fetch(`${base}/stats`)).json();
check(st.server.threads > 0 && st.batch.max === 2, `/stats threads ${st.server.threads}, batch.max ${st.batch.max}`);

// --chat-template FILE: the template renders the contents alone, so the prompt is their tokens
const tok = await (await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ content }) })).json();
const r = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content }], max_tokens: 1000000,
  ignore_eos: true, temperature: 0 });
check(r.usage.prompt_tokens === tok.tokens.length, `--chat-template FILE renders the prompt (${r.usage.prompt_tokens} tokens)`);
// max_tokens past the context's room is clamped to it and reported as length
check(r.choices[0].finish_reason === 'length' && r.usage.total_tokens === 128,
      `max_tokens clamped to the context (${r.usage.completion_tokens} generated, finish ${r.choices[0].finish_reason})`);

// --max-connections 3: with 3 idle connections open a new one is refused; --idle-timeout 2
// closes the idle ones, and requests are served again
await new Promise((r) => setTimeout(r, 2500)); // the client's keep-alive connection times out first
const opened = await Promise.all([0, 1, 2].map(() => new Promise((resolve) => {
  const sock = net.connect(port, 'localhost', () => resolve(sock));
  sock.on('error', () => resolve(sock));
})));
await new Promise((r) => setTimeout(r, 300));
// a raw request on a fourth connection: closed unanswered
const refused = await new Promise((resolve) => {
  let data = '';
  const sock = net.connect(port, 'localhost', () => sock.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n'));
  sock.on('data', (d) => { data += d; });
  sock.on('error', () => {});
  sock.on('close', () => resolve(data === ''));
  setTimeout(() => { sock.destroy(); resolve(false); }, 1500);
});
check(refused, 'a connection past --max-connections is not served');
const closedAt = await Promise.all(opened.map((sock) => new Promise((resolve) => {
  if (sock.destroyed) resolve(0);
  sock.on('close', () => resolve(Date.now()));
})));
check(closedAt.every((t) => t > 0), 'idle connections are closed by the server (--idle-timeout)');
// the server counts a connection gone once its close callback has run, which can come a moment
// after the peer sees the socket close: an attempt refused (or left unanswered) in that moment is
// retried, each on a fresh connection with a short deadline
let again = null;
for (let attempt = 0; attempt < 20 && !again; attempt++) {
  try {
    again = await fetch(`${base}/health`, {
      headers: { connection: 'close' },
      signal: AbortSignal.timeout(2000),
    });
  } catch {
    await new Promise((r) => setTimeout(r, 100));
  }
}
check(again !== null && again.status === 200, 'served again once the idle connections are gone');
