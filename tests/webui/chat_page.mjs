// Browser test of the chat page (docs/server.md "Chat page"): starts `cinfer serve` on the
// starter model on a free loopback port, checks the static routes (content types, ETag / 304,
// HEAD, 405, 404), then drives Debian's headless Chromium through puppeteer-core: loads the page,
// sends a prompt and watches the reply arrive in several steps, checks the request the page sent
// (sampling fields, KV codec), stops a long reply mid-stream (the server counts it cancelled and
// the text stops growing), renders a canned stream with reasoning folded in a <details>, checks
// the markdown renderer escapes model text, reloads and finds the conversation again, saves a
// screenshot, checks that a server with --api-key serves the page, which asks for the key and
// works once it is entered, and finally checks that `--no-webui` answers 404 at /.
//
// Usage: node chat_page.mjs CINFER_BIN MODEL_DIR SCREENSHOT.png
// CHROMIUM (default /usr/bin/chromium) names the browser; CI_NPM_DIR the npm folder.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [cinfer, modelDir, screenshotPath] = process.argv.slice(2);
if (!cinfer || !modelDir || !screenshotPath) {
  console.error('usage: node chat_page.mjs CINFER_BIN MODEL_DIR SCREENSHOT.png');
  process.exit(2);
}
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
if (!existsSync(chromium)) {
  console.error(`FAIL: ${chromium} is missing: the chat page test needs Debian's chromium package ` +
    '(scripts/install-deps.sh installs it: apt-get install chromium)');
  process.exit(1);
}
const npmDir = process.env.CI_NPM_DIR || new URL('../npm/node_modules', import.meta.url).pathname;
let puppeteer;
try {
  puppeteer = createRequire(npmDir + '/')('puppeteer-core');
} catch (e) {
  console.error(`FAIL: puppeteer-core is not installed in ${npmDir} (scripts/install-npm.sh installs it): ${e.message}`);
  process.exit(1);
}

const slow = /asan|sanitize/i.test(process.env.CINFER_BUILD || '');
const T = slow ? 4 : 1; // timeout scale for sanitizer builds

let failed = false;
const cleanups = [];
function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    failed = true;
    throw new Error(what);
  }
  console.log(`ok: ${what}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Starts `cinfer serve` and waits for /health; retries on another port if this one was taken.
async function startServer(extra = []) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const child = spawn(cinfer, ['serve', '--model', modelDir, '--port', String(port), '--threads', '1', ...extra],
      { stdio: ['ignore', 'inherit', 'pipe'] });
    let log = '';
    child.stderr.on('data', (d) => { log += d; process.stderr.write(d); });
    let exited = false;
    child.on('exit', () => { exited = true; });
    const base = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 600 && !exited; i++) {
      try {
        if ((await fetch(base + '/health')).ok) {
          const server = { child, base, port, log: () => log };
          cleanups.push(() => stopServer(server));
          return server;
        }
      } catch { /* not up yet */ }
      await sleep(100);
    }
    child.kill('SIGKILL');
  }
  throw new Error('cinfer serve did not become healthy');
}

async function stopServer(server) {
  if (server.child.exitCode !== null || server.stopped) return server.child.exitCode;
  server.stopped = true;
  const done = new Promise((r) => server.child.on('exit', (code, sig) => r(sig ? 128 : code)));
  server.child.kill('SIGINT');
  const code = await Promise.race([done, sleep(30000 * T).then(() => -1)]);
  if (code === -1) server.child.kill('SIGKILL');
  return code;
}

async function stats(base) {
  return (await fetch(base + '/stats')).json();
}

// ---- static routes ----
async function checkStaticRoutes(base) {
  const page = await fetch(base + '/');
  check(page.status === 200 && page.headers.get('content-type').startsWith('text/html'), 'GET / is an HTML page');
  const html = await page.text();
  check(html.includes('/assets/app.js') && html.includes('/assets/style.css'), 'the page links its script and stylesheet');
  const etag = page.headers.get('etag');
  check(/^"[0-9a-f]{16}"$/.test(etag || ''), `GET / has an ETag (${etag})`);
  check((await fetch(base + '/index.html')).headers.get('etag') === etag, '/index.html is the same page');
  const again = await fetch(base + '/', { headers: { 'If-None-Match': etag } });
  check(again.status === 304, 'If-None-Match with the ETag gets 304');
  const js = await fetch(base + '/assets/app.js');
  check(js.status === 200 && js.headers.get('content-type').startsWith('text/javascript'), 'app.js is served as JavaScript');
  check((await js.text()).includes('renderMarkdown'), 'app.js is the page script');
  const css = await fetch(base + '/assets/style.css');
  check(css.status === 200 && css.headers.get('content-type').startsWith('text/css'), 'style.css is served as CSS');
  const head = await fetch(base + '/', { method: 'HEAD' });
  check(head.status === 200 && head.headers.get('content-length') === String(Buffer.byteLength(html)) &&
    (await head.text()) === '', 'HEAD / answers the headers without the body');
  check((await fetch(base + '/', { method: 'POST', body: '{}' })).status === 405, 'POST / is 405');
  check((await fetch(base + '/assets/missing.js')).status === 404, 'an unknown asset is 404');
}

// Text of the last assistant message and its state.
const lastReply = () => {
  const nodes = document.querySelectorAll('.msg.assistant');
  const n = nodes[nodes.length - 1];
  return n ? { text: n.querySelector('.content').textContent, state: n.dataset.state, meta: n.querySelector('.meta').textContent } : null;
};

async function setField(page, id, value) {
  await page.$eval('#' + id, (e, v) => {
    if (e.type === 'checkbox') e.checked = v;
    else e.value = v;
    e.dispatchEvent(new Event('change', { bubbles: true }));
  }, value);
}

// Types a prompt and sends it with Enter; resolves with the body of the POST the page sent.
async function sendPrompt(page, text) {
  const sent = new Promise((resolve) => {
    const onRequest = (req) => {
      if (req.url().endsWith('/v1/chat/completions') && req.method() === 'POST') {
        page.off('request', onRequest);
        resolve(JSON.parse(req.postData()));
      }
    };
    page.on('request', onRequest);
  });
  await page.click('#prompt');
  await page.type('#prompt', text);
  await page.keyboard.press('Enter');
  return sent;
}

async function run() {
  const server = await startServer();
  const { base } = server;
  await checkStaticRoutes(base);

  const profile = mkdtempSync(join(tmpdir(), 'cinfer-chromium-'));
  cleanups.push(() => rmSync(profile, { recursive: true, force: true }));
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    userDataDir: profile,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
  });
  cleanups.unshift(() => browser.close());
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  page.setDefaultTimeout(60000 * T);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') pageErrors.push(m.text()); });

  await page.goto(base + '/', { waitUntil: 'load' });
  await page.waitForSelector('#model-info[data-loaded="true"]');
  const info = await page.$eval('#model-info', (e) => e.textContent);
  check(info.includes('starter') && info.includes('gemma4') && /context8192/.test(info.replace(/\s/g, '')),
    'the model panel shows /v1/models and /stats (id, architecture, context)');

  // 1. A streamed reply arrives in steps.
  // (256 tokens: long enough that the reply streams over many frames however fast the model runs)
  await setField(page, 'max_tokens', '256');
  await setField(page, 'ignore_eos', true);
  await setField(page, 'seed', '7');
  await setField(page, 'temperature', '0.4');
  await setField(page, 'kv_codec', 'affine:8');
  await page.evaluate(() => {
    window.__seen = [];
    const box = document.getElementById('messages');
    new MutationObserver(() => {
      const nodes = box.querySelectorAll('.msg.assistant');
      const n = nodes[nodes.length - 1];
      if (n) window.__seen.push({ len: n.querySelector('.content').textContent.length, state: n.dataset.state });
    }).observe(box, { childList: true, subtree: true, characterData: true, attributes: true });
  });
  const body1 = await sendPrompt(page, 'Write a Python function that returns the n-th Fibonacci number.');
  check(body1.stream === true && body1.max_tokens === 256 && body1.seed === 7 && body1.temperature === 0.4 &&
    body1.ignore_eos === true, 'the request carries stream and the sampling settings');
  check(body1.kv && body1.kv.codec === 'affine' && body1.kv.bits === 8, 'the request carries the KV codec (kv: affine 8)');
  check(body1.messages.length === 1 && body1.messages[0].role === 'user', 'the request carries the conversation');
  await page.waitForFunction(() => {
    const n = [...document.querySelectorAll('.msg.assistant')].pop();
    return n && n.dataset.state !== 'streaming';
  });
  const reply1 = await page.evaluate(lastReply);
  check(reply1.state === 'done', `the reply finished (state ${reply1.state}, ${reply1.meta})`);
  check(reply1.text.trim().length > 0, `the reply has text (${JSON.stringify(reply1.text.slice(0, 80))}…)`);
  const seen = await page.evaluate(() => window.__seen);
  const streamingLengths = [...new Set(seen.filter((s) => s.state === 'streaming' && s.len > 0).map((s) => s.len))];
  check(streamingLengths.length >= 3, `the text grew in steps while streaming (${streamingLengths.length} distinct lengths: ${streamingLengths.slice(0, 8).join(', ')}…)`);
  // the rendered text grows; it may lose a few characters when a markdown marker pair closes
  // (`_x_` becomes emphasis), never more
  const drops = streamingLengths.slice(1).map((v, i) => streamingLengths[i] - v).filter((d) => d > 0);
  check(drops.every((d) => d <= 4) && streamingLengths[streamingLengths.length - 1] > streamingLengths[0] + 100,
    `the streamed text grew (largest drop ${Math.max(0, ...drops)} characters)`);
  check(/TTFT \d+ ms/.test(reply1.meta) && /\d+(\.\d+)? tok\/s/.test(reply1.meta) && /256 tokens/.test(reply1.meta),
    `TTFT, tokens/s and the token count are shown (${reply1.meta})`);
  check(/kv affine:8/.test(reply1.meta), 'the reply shows the KV codec it used');
  const firstTitle = await page.$eval('#conversations li.active .title', (e) => e.textContent);
  check(firstTitle.startsWith('Write a Python function'), `the conversation list shows the chat (${firstTitle})`);

  // 2. Stop a long reply mid-stream; the server cancels it.
  const before = await stats(base);
  await setField(page, 'max_tokens', '6000');
  await setField(page, 'kv_codec', '');
  const body2 = await sendPrompt(page, 'Tell me a very long story.');
  check(body2.messages.length === 3 && body2.messages[1].role === 'assistant' && !('kv' in body2),
    'the follow-up carries the history and no KV codec');
  await page.waitForFunction(() => {
    const n = [...document.querySelectorAll('.msg.assistant')].pop();
    return n && n.dataset.state === 'streaming' && n.querySelector('.content').textContent.length > 20;
  });
  check(await page.$eval('#stop', (e) => !e.hidden), 'the stop button shows while streaming');
  await page.click('#stop');
  await page.waitForFunction(() => [...document.querySelectorAll('.msg.assistant')].pop().dataset.state !== 'streaming');
  const stopped = await page.evaluate(lastReply);
  check(stopped.state === 'stopped' && /stopped/.test(stopped.meta), `the reply is marked stopped (${stopped.meta})`);
  await sleep(1000);
  check((await page.evaluate(lastReply)).text === stopped.text, 'the text stops growing after stop');
  let after;
  for (let i = 0; i < 100 * T; i++) {
    after = await stats(base);
    if (after.totals.requests_cancelled > before.totals.requests_cancelled && after.batch.running === 0) break;
    await sleep(100);
  }
  check(after.totals.requests_cancelled === before.totals.requests_cancelled + 1 && after.batch.running === 0,
    'the server cancelled the stopped request');
  const generated = after.totals.generation_tokens - before.totals.generation_tokens;
  check(generated < 6000, `the server stopped generating (${generated} tokens of 6000)`);
  check(await page.$eval('#send', (e) => !e.disabled) && await page.$eval('#stop', (e) => e.hidden),
    'send is enabled again after stop');

  // 3. The markdown renderer escapes model text and highlights code.
  const md = await page.evaluate(() => window.cinfer.renderMarkdown(
    '# Title\n<img src=x onerror="alert(1)"> **bold** and `<b>`\n\n[ok](https://example.com) [bad](javascript:alert(1))\n\n' +
    '- one\n- two\n\n```python\ndef f(n):  # comment\n    return "s" + 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n'));
  check(!/<img|<b>|href="javascript/i.test(md) && md.includes('&lt;img') && md.includes('<code>&lt;b&gt;</code>'),
    'model text cannot inject markup (HTML is escaped, javascript: links are not made)');
  check(md.includes('<h1>Title</h1>') && md.includes('<strong>bold</strong>') && md.includes('<a href="https://example.com"') &&
    md.includes('<li>one</li>') && md.includes('<table>'), 'markdown renders headings, bold, links, lists and tables');
  check(md.includes('<span class="hl-kw">def</span>') && md.includes('<span class="hl-str">&quot;s&quot;</span>') &&
    md.includes('<span class="hl-com"># comment</span>') && md.includes('<span class="hl-num">1</span>'),
    'code blocks are highlighted (keywords, strings, comments, numbers)');
  const open = await page.evaluate(() => window.cinfer.renderMarkdown('```js\nlet x = 1;'));
  check(open.includes('<pre><code><span class="hl-kw">let</span>'), 'an unterminated fence (mid-stream) renders as code');

  // 4. Reasoning deltas are shown folded (a canned stream: the starter model does not reason).
  await page.setRequestInterception(true);
  const canned = (req) => {
    if (!req.url().endsWith('/v1/chat/completions')) return req.continue();
    const chunk = (delta, extra = {}) => 'data: ' + JSON.stringify({ id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }], ...extra }) + '\n\n';
    req.respond({
      status: 200,
      contentType: 'text/event-stream',
      body: chunk({ role: 'assistant', content: '' }) + chunk({ reasoning_content: 'The user wants ' }) +
        chunk({ reasoning_content: 'a greeting.' }) + chunk({ content: 'Hello **there**!' }) +
        'data: ' + JSON.stringify({ id: 'x', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 }, timings: { predicted_n: 9, predicted_per_second: 123.4 } }) + '\n\n' +
        'data: [DONE]\n\n',
    });
  };
  page.on('request', canned);
  await page.click('#new-chat');
  await sendPrompt(page, 'Say hello');
  await page.waitForFunction(() => [...document.querySelectorAll('.msg.assistant')].pop()?.dataset.state === 'done');
  const r = await page.evaluate(() => {
    const n = [...document.querySelectorAll('.msg.assistant')].pop();
    const d = n.querySelector('details.reasoning');
    return { hidden: d.hidden, open: d.open, summary: d.querySelector('summary').textContent, text: d.querySelector('.reasoning-text').textContent, html: n.querySelector('.content').innerHTML, meta: n.querySelector('.meta').textContent };
  });
  check(!r.hidden && !r.open && r.text === 'The user wants a greeting.' && /Reasoning/.test(r.summary),
    `reasoning_content is shown folded in a <details> (${JSON.stringify(r)})`);
  check(r.html.includes('<strong>there</strong>') && /123\.4 tok\/s/.test(r.meta) && /9 tokens/.test(r.meta),
    'the content renders as markdown with the server\'s tokens/s');
  page.off('request', canned);
  await page.setRequestInterception(false);

  // 5. Screenshot of the first conversation, then reload and find it again.
  await page.click('#toggle-settings');
  const firstLi = await page.$$eval('#conversations li', (lis) => lis.findIndex((li) => li.textContent.includes('Write a Python')));
  check(firstLi >= 0, 'the first conversation is in the list');
  await (await page.$$('#conversations li'))[firstLi].click();
  await page.waitForFunction(() => document.querySelectorAll('.msg').length === 4);
  await page.screenshot({ path: screenshotPath });
  console.log(`ok: screenshot saved to ${screenshotPath}`);

  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector('#conversations li');
  const titles = await page.$$eval('#conversations li .title', (e) => e.map((x) => x.textContent));
  check(titles.length === 2 && titles.some((t) => t.startsWith('Write a Python')) && titles.includes('Say hello'),
    `after a reload both conversations are listed (${titles.join(' | ')})`);
  const restored = await page.$$eval('.msg', (nodes) => nodes.map((n) => ({ role: n.classList.contains('user') ? 'user' : 'assistant', text: (n.querySelector('.content') || n.querySelector('.body')).textContent, state: n.dataset.state })));
  check(restored.length === 4 && restored[0].text.startsWith('Write a Python') && restored[1].text === reply1.text &&
    restored[3].text === stopped.text && restored[3].state === 'stopped',
    'the conversation is restored from localStorage with its replies (the stopped one still marked)');
  check(await page.$eval('#max_tokens', (e) => e.value) === '6000', 'settings survive the reload');

  // 6. Deleting a conversation.
  await page.$$eval('#conversations li', (lis) => lis.find((li) => li.textContent.includes('Say hello')).querySelector('.delete').click());
  check((await page.$$('#conversations li')).length === 1, 'a conversation can be deleted');

  // Damaged storage: malformed entries are dropped, the page still works.
  await page.evaluate(() => {
    localStorage.setItem('cinfer.conversations', JSON.stringify([null, 5, { id: 'k', title: '<b>kept</b>', messages: [{ role: 'user', content: 'hi' }, 7, { role: 'evil', content: 'x' }, { role: 'assistant', content: '**yo**', state: 'streaming' }] }, { id: 'no-messages' }]));
    localStorage.setItem('cinfer.current', 'k');
    localStorage.setItem('cinfer.settings', '[1,2]');
  });
  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector('#conversations li');
  const damaged = await page.evaluate(() => ({
    titles: [...document.querySelectorAll('#conversations li .title')].map((e) => e.textContent),
    msgs: [...document.querySelectorAll('.msg')].map((n) => n.dataset.state || 'user'),
    bold: document.querySelector('.msg.assistant .content').innerHTML,
  }));
  check(damaged.titles.length === 1 && damaged.titles[0] === '<b>kept</b>' && damaged.msgs.join() === 'user,stopped' &&
    damaged.bold.includes('<strong>yo</strong>'), `damaged storage keeps only the well-formed conversation (${JSON.stringify(damaged)})`);

  check(pageErrors.length === 0, `no errors in the page (${pageErrors.join('; ')})`);
  check(await stopServer(server) === 0, 'cinfer serve exits 0 on SIGINT');

  // 7. --api-key: the page loads without a key, asks for one, and works once it is entered.
  const keyed = await startServer(['--api-key', 'page-key']);
  pageErrors.length = 0;
  await page.goto(keyed.base + '/', { waitUntil: 'load' });
  await page.waitForFunction(() => !document.getElementById('notice').hidden);
  const notice = await page.$eval('#notice', (e) => e.textContent);
  check(/API key/.test(notice), `without a key the page asks for one (${notice})`);
  check(!(await page.$eval('#model-info', (e) => e.dataset.loaded)), 'the model panel stays empty without the key');
  await page.click('#toggle-settings');
  await setField(page, 'api_key', 'page-key');
  await page.waitForSelector('#model-info[data-loaded="true"]');
  check(await page.$eval('#notice', (e) => e.hidden), 'with the key entered in Settings the model panel loads and the notice goes');
  await setField(page, 'max_tokens', '8');
  await sendPrompt(page, 'Hello');
  await page.waitForFunction(() => [...document.querySelectorAll('.msg.assistant')].pop()?.dataset.state !== 'streaming');
  const keyedReply = await page.evaluate(lastReply);
  check(keyedReply.state === 'done' && keyedReply.text.length > 0, `a reply streams with the key (${keyedReply.meta})`);
  // The failed loads before the key was entered are the browser's 401 console errors.
  check(pageErrors.every((e) => /401/.test(e)), `no other errors in the page (${pageErrors.join('; ')})`);
  await browser.close();
  cleanups.shift();
  check(await stopServer(keyed) === 0, 'cinfer serve --api-key exits 0 on SIGINT');

  // 8. --no-webui: no page, the API still there.
  const bare = await startServer(['--no-webui']);
  check((await fetch(bare.base + '/')).status === 404, '--no-webui: GET / is 404');
  check((await fetch(bare.base + '/assets/app.js')).status === 404, '--no-webui: the assets are 404');
  check((await fetch(bare.base + '/v1/models')).status === 200, '--no-webui: the API still answers');
  check(await stopServer(bare) === 0, 'cinfer serve --no-webui exits 0 on SIGINT');
}

const watchdog = setTimeout(() => {
  console.error('FAIL: the chat page test timed out');
  process.exit(1);
}, 850000);
try {
  await run();
} catch (e) {
  if (!failed) console.error(`FAIL: ${e.stack || e}`);
  failed = true;
} finally {
  for (const c of cleanups) {
    try { await c(); } catch { /* best effort */ }
  }
  clearTimeout(watchdog);
}
process.exit(failed ? 1 : 0);
