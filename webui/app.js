// cinfer chat page (docs/server.md "Chat page"). Plain browser JavaScript, no libraries:
// conversations in localStorage, replies streamed from /v1/chat/completions (SSE) and rendered
// with a small markdown renderer that escapes all text before adding its own tags, a keyword
// highlighter for code, a stop button (AbortController: the server cancels the request when the
// connection closes), per-request sampling and KV codec settings, TTFT and tokens/s per reply,
// reasoning folded in a <details>, and a model panel from /v1/models and /stats.
'use strict';

// ==== Markdown ====

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const KEYWORDS = new Set(
  ('if else elif for while do break continue return switch case default goto try catch finally ' +
    'throw throws raise except with as def class struct enum union typedef fn func function let ' +
    'var const static extern inline void int char long short float double bool unsigned signed ' +
    'auto sizeof import from export package module use pub mod impl trait where match mut ref ' +
    'self this super new delete true false null None True False nil undefined in is not and or ' +
    'lambda yield async await public private protected interface extends implements type go ' +
    'defer chan map range select then fi done esac echo local pass global nonlocal assert ' +
    'include define ifdef ifndef endif pragma').split(' '));
const HASH_COMMENT_LANGS = new Set(['python', 'py', 'sh', 'bash', 'shell', 'zsh', 'ruby', 'rb',
  'perl', 'r', 'yaml', 'yml', 'toml', 'make', 'makefile', 'dockerfile', 'cmake', 'ini', 'conf']);

// Highlights code (raw text) into HTML: comments, strings, numbers, keywords and calls get spans;
// every piece of text is escaped.
function highlight(code, lang) {
  const hash = HASH_COMMENT_LANGS.has(lang) ? '|#[^\\n]*' : '';
  const re = new RegExp(
    '(\\/\\*[\\s\\S]*?(?:\\*\\/|$)|\\/\\/[^\\n]*' + hash + ')' + // 1 comment
      '|("(?:[^"\\\\\\n]|\\\\.)*"?|\'(?:[^\'\\\\\\n]|\\\\.)*\'?|`(?:[^`\\\\]|\\\\.)*`?)' + // 2 string
      '|(\\b(?:0[xX][0-9a-fA-F]+|\\d+(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)\\b)' + // 3 number
      '|([A-Za-z_$][\\w$]*)', // 4 word
    'g');
  let out = '';
  let last = 0;
  for (let m = re.exec(code); m; m = re.exec(code)) {
    if (m[0] === '') { re.lastIndex++; continue; }
    out += escapeHtml(code.slice(last, m.index));
    const text = escapeHtml(m[0]);
    if (m[1]) out += '<span class="hl-com">' + text + '</span>';
    else if (m[2]) out += '<span class="hl-str">' + text + '</span>';
    else if (m[3]) out += '<span class="hl-num">' + text + '</span>';
    else if (KEYWORDS.has(m[4])) out += '<span class="hl-kw">' + text + '</span>';
    else if (code[re.lastIndex] === '(') out += '<span class="hl-fn">' + text + '</span>';
    else out += text;
    last = re.lastIndex;
  }
  return out + escapeHtml(code.slice(last));
}

// Inline markdown over already-escaped text: code spans, links (http, https and mailto only),
// bold, italic, strikethrough. Code spans are set aside first so nothing inside them changes.
function inline(escaped) {
  const held = [];
  const hold = (html) => '\u0000' + (held.push(html) - 1) + '\u0000';
  let s = escaped.replace(/`([^`\n]+)`/g, (_, c) => hold('<code>' + c + '</code>'));
  s = s.replace(/\[([^\]\n]+)\]\(((?:https?:\/\/|mailto:)[^\s()<>"]+)\)/g,
    (_, text, url) => hold('<a href="' + url + '" target="_blank" rel="noopener noreferrer">') + text + hold('</a>'));
  s = s.replace(/\*\*([^\n]+?)\*\*/g, '<strong>$1</strong>');
  s = s.replace(/__([^\n]+?)__/g, '<strong>$1</strong>');
  s = s.replace(/(^|[^\w*])\*(?!\s)([^*\n]+?)\*(?!\w)/g, '$1<em>$2</em>');
  s = s.replace(/(^|[^\w])_(?!\s)([^_\n]+?)_(?!\w)/g, '$1<em>$2</em>');
  s = s.replace(/~~([^\n]+?)~~/g, '<del>$1</del>');
  return s.replace(/\u0000(\d+)\u0000/g, (_, i) => held[Number(i)]);
}

function isTableSeparator(line) {
  return /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(line) && line.includes('-');
}
function tableCells(line) {
  let t = line.trim();
  if (t.startsWith('|')) t = t.slice(1);
  if (t.endsWith('|')) t = t.slice(0, -1);
  return t.split('|').map((c) => inline(c.trim()));
}

// Block markdown over escaped text (no code fences here): headings, rules, quotes, lists,
// tables, paragraphs.
function blocks(escaped) {
  const lines = escaped.split('\n');
  let html = '';
  let para = [];
  const flush = () => {
    if (para.length) html += '<p>' + para.map(inline).join('<br>') + '</p>';
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if (!line.trim()) { flush(); continue; }
    if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
      flush();
      html += '<h' + m[1].length + '>' + inline(m[2]) + '</h' + m[1].length + '>';
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      html += '<hr>';
    } else if (/^&gt;\s?/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^&gt;\s?/.test(lines[i])) quoted.push(lines[i++].replace(/^&gt;\s?/, ''));
      i--;
      html += '<blockquote>' + blocks(quoted.join('\n')) + '</blockquote>';
    } else if ((m = /^(\s*)([-*+]|\d{1,9}[.)])\s+/.exec(line))) {
      flush();
      const ordered = /\d/.test(m[2]);
      const start = ordered ? parseInt(m[2], 10) : 1;
      let items = '';
      while (i < lines.length) {
        const im = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(lines[i]);
        if (im && /\d/.test(im[2]) === ordered) {
          items += '<li>' + inline(im[3]) + '</li>';
        } else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && items) {
          items = items.slice(0, -5) + '<br>' + inline(lines[i].trim()) + '</li>';
        } else break;
        i++;
      }
      i--;
      html += ordered ? '<ol' + (start !== 1 ? ' start="' + start + '"' : '') + '>' + items + '</ol>'
        : '<ul>' + items + '</ul>';
    } else if (line.includes('|') && i + 1 < lines.length && isTableSeparator(lines[i + 1])) {
      flush();
      let t = '<table><thead><tr>' + tableCells(line).map((c) => '<th>' + c + '</th>').join('') +
        '</tr></thead><tbody>';
      i += 2;
      while (i < lines.length && lines[i].includes('|') && lines[i].trim()) {
        t += '<tr>' + tableCells(lines[i]).map((c) => '<td>' + c + '</td>').join('') + '</tr>';
        i++;
      }
      i--;
      html += t + '</tbody></table>';
    } else {
      para.push(line);
    }
  }
  flush();
  return html;
}

// Markdown (raw model text) to HTML. Fenced code blocks are cut out first and highlighted; an
// unterminated fence (a reply still streaming) runs to the end of the text. All other text is
// escaped before any tag is added, so model output can never inject markup.
function renderMarkdown(text) {
  const src = String(text).replace(/\r\n?/g, '\n').replace(/\u0000/g, '');
  const fence = /^ {0,3}(```+|~~~+)[ \t]*([\w+#.-]*)[^\n]*\n([\s\S]*?)(?:^ {0,3}\1[ \t]*$|(?![\s\S]))/gm;
  let html = '';
  let last = 0;
  for (let m = fence.exec(src); m; m = fence.exec(src)) {
    html += blocks(escapeHtml(src.slice(last, m.index)));
    const lang = m[2].toLowerCase();
    const code = m[3].replace(/\n$/, '');
    html += '<div class="codeblock">' + (lang ? '<span class="lang">' + escapeHtml(lang) + '</span>' : '') +
      '<button type="button" class="copy small">copy</button><pre><code>' + highlight(code, lang) +
      '</code></pre></div>';
    last = fence.lastIndex;
  }
  return html + blocks(escapeHtml(src.slice(last)));
}

// ==== Storage ====

const STORE_CONVERSATIONS = 'cinfer.conversations';
const STORE_CURRENT = 'cinfer.current';
const STORE_SETTINGS = 'cinfer.settings';
const KEY_NOTICE = 'This server needs an API key: enter it in Settings.';
const SETTING_FIELDS = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'ignore_eos', 'kv_codec', 'api_key'];

function loadJson(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch {
    return fallback;
  }
}

// The stored conversations, keeping only well-formed ones (storage is shared with whatever else
// ran on this origin, and a user can edit it).
function loadConversations() {
  const list = loadJson(STORE_CONVERSATIONS, []);
  if (!Array.isArray(list)) return [];
  const ok = (m) => m && typeof m === 'object' && (m.role === 'user' || m.role === 'assistant') && typeof m.content === 'string';
  return list.filter((c) => c && typeof c === 'object' && typeof c.id === 'string' && Array.isArray(c.messages))
    .map((c) => ({
      id: c.id,
      title: typeof c.title === 'string' ? c.title : 'Chat',
      created: Number(c.created) || 0,
      updated: Number(c.updated) || 0,
      system: typeof c.system === 'string' ? c.system : '',
      messages: c.messages.filter(ok).map((m) => ({
        ...m,
        reasoning: typeof m.reasoning === 'string' ? m.reasoning : '',
        stats: m.stats && typeof m.stats === 'object' ? m.stats : {},
        // A reply that was streaming when the page went away ends as stopped.
        state: m.state === 'streaming' ? 'stopped' : m.state,
      })),
    }));
}

const state = {
  conversations: [], // [{id, title, created, updated, system, messages: [{role, content, reasoning?, state?, stats?, error?}]}]
  currentId: null,
  settings: {},
  controller: null, // AbortController of the reply streaming now
  streaming: null, // {conv, msg}
};

function saveConversations() {
  try {
    localStorage.setItem(STORE_CONVERSATIONS, JSON.stringify(state.conversations));
    localStorage.setItem(STORE_CURRENT, state.currentId || '');
  } catch (e) {
    showNotice('Could not save the conversations in this browser: ' + e.message);
  }
}

function saveSettings() {
  try {
    localStorage.setItem(STORE_SETTINGS, JSON.stringify(state.settings));
  } catch (e) {
    showNotice('Could not save the settings: ' + e.message);
  }
}

function current() {
  return state.conversations.find((c) => c.id === state.currentId) || null;
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

// ==== DOM helpers ====

const nodes = new WeakMap(); // message -> its element

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function showNotice(text) {
  const n = $('notice');
  n.textContent = text || '';
  n.hidden = !text;
}

function formatBytes(n) {
  if (typeof n !== 'number' || !isFinite(n)) return '?';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let u = 0;
  while (n >= 1000 && u < units.length - 1) { n /= 1000; u++; }
  return (u ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + ' ' + units[u];
}

function formatDuration(s) {
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

// ==== Rendering ====

function renderConversationList() {
  const ul = $('conversations');
  ul.textContent = '';
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const conv of sorted) {
    const li = el('li', conv.id === state.currentId ? 'active' : '');
    li.dataset.id = conv.id;
    li.title = conv.title;
    li.append(el('span', 'title', conv.title));
    const del = el('button', 'delete', '×');
    del.type = 'button';
    del.title = 'Delete this chat';
    del.setAttribute('aria-label', 'Delete chat ' + conv.title);
    li.append(del);
    ul.append(li);
  }
}

function metaText(msg) {
  const s = msg.stats || {};
  const parts = [];
  if (typeof s.ttft_ms === 'number') parts.push('TTFT ' + Math.round(s.ttft_ms) + ' ms');
  if (typeof s.tps === 'number' && isFinite(s.tps)) parts.push(s.tps.toFixed(1) + ' tok/s');
  if (typeof s.tokens === 'number') parts.push((s.estimated ? '~' : '') + s.tokens + ' tokens');
  if (s.kv) parts.push('kv ' + s.kv);
  return parts.join(' · ');
}

// Builds (or updates) one message's element. Assistant messages keep their <details> element
// across updates so a reader's open/closed choice survives streaming.
function renderMessage(msg, node) {
  if (!node) {
    node = el('div', 'msg ' + msg.role);
    node.append(el('div', 'role', msg.role === 'user' ? 'You' : 'Assistant'));
    if (msg.role === 'user') {
      node.append(el('div', 'body'));
    } else {
      const details = el('details', 'reasoning');
      details.append(el('summary', '', 'Reasoning'));
      details.append(el('div', 'reasoning-text md'));
      details.hidden = true;
      node.append(details, el('div', 'content md'), el('div', 'meta'));
    }
  }
  if (msg.role === 'user') {
    node.querySelector('.body').textContent = msg.content;
    return node;
  }
  node.dataset.state = msg.state || 'done';
  const details = node.querySelector('.reasoning');
  if (msg.reasoning) {
    details.hidden = false;
    const thinking = msg.state === 'streaming' && !msg.content;
    details.querySelector('summary').textContent =
      (thinking ? 'Reasoning…' : 'Reasoning') + ' (' + msg.reasoning.length + ' characters)';
    details.querySelector('.reasoning-text').innerHTML = renderMarkdown(msg.reasoning);
  }
  node.querySelector('.content').innerHTML = renderMarkdown(msg.content || '');
  const meta = node.querySelector('.meta');
  meta.textContent = '';
  if (msg.error) meta.append(el('div', 'error', msg.error));
  const line = metaText(msg);
  if (line) meta.append(el('span', 'stats', line));
  if (msg.state === 'stopped') meta.append(el('span', 'stopped', (line ? ' · ' : '') + 'stopped'));
  if (msg.finish === 'length') meta.append(el('span', 'truncated', (line ? ' · ' : '') + 'truncated (max_tokens)'));
  return node;
}

function renderMessages() {
  const box = $('messages');
  box.textContent = '';
  const conv = current();
  $('chat-title').textContent = conv ? conv.title : 'New chat';
  $('system').value = conv ? conv.system || '' : state.settings.system || '';
  if (!conv || !conv.messages.length) {
    box.append(el('div', 'empty', 'Send a message to start a conversation.'));
    return;
  }
  for (const msg of conv.messages) {
    const node = renderMessage(msg);
    nodes.set(msg, node);
    box.append(node);
  }
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderConversationList();
  renderMessages();
}

function setStreaming(on) {
  $('send').disabled = on;
  $('stop').hidden = !on;
}

// ==== Settings ====

function readSettingsForm() {
  for (const f of SETTING_FIELDS) {
    const input = $(f);
    state.settings[f] = input.type === 'checkbox' ? input.checked : input.value.trim();
  }
  saveSettings();
}

function fillSettingsForm() {
  for (const f of SETTING_FIELDS) {
    const input = $(f);
    const v = state.settings[f];
    if (input.type === 'checkbox') input.checked = !!v;
    else input.value = v === undefined || v === null ? '' : v;
  }
}

function authHeaders() {
  const key = state.settings.api_key;
  return key ? { Authorization: 'Bearer ' + key } : {};
}

// The request body: messages plus the sampling fields the user set and the KV codec extension.
function buildRequest(conv) {
  const messages = [];
  if (conv.system && conv.system.trim()) messages.push({ role: 'system', content: conv.system });
  for (const m of conv.messages) {
    if (m.role === 'user') messages.push({ role: 'user', content: m.content });
    else if (m.role === 'assistant' && m.content && m.state !== 'streaming') messages.push({ role: 'assistant', content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  const s = state.settings;
  const floats = ['temperature', 'top_p', 'min_p'];
  const ints = ['top_k', 'max_tokens', 'seed'];
  for (const f of floats) if (s[f] !== '' && s[f] !== undefined && isFinite(Number(s[f]))) body[f] = Number(s[f]);
  for (const f of ints) if (s[f] !== '' && s[f] !== undefined && Number.isInteger(Number(s[f]))) body[f] = Number(s[f]);
  if (s.ignore_eos) body.ignore_eos = true;
  if (s.kv_codec) {
    const [codec, bits] = s.kv_codec.split(':');
    body.kv = bits ? { codec, bits: Number(bits) } : { codec };
  }
  return body;
}

// ==== Streaming ====

// Reads an SSE response body, calling onData(json) for each `data:` frame until [DONE].
async function readSse(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = frame.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      onData(JSON.parse(data));
    }
  }
}

async function errorMessage(response) {
  let text = '';
  try {
    text = await response.text();
    const j = JSON.parse(text);
    if (j && j.error) return (j.error.message || JSON.stringify(j.error)) + ' (HTTP ' + response.status + ')';
  } catch {
    // not JSON: the text itself
  }
  return 'HTTP ' + response.status + (text ? ': ' + text.slice(0, 300) : '');
}

async function send(text) {
  if (state.controller) return;
  let conv = current();
  if (!conv) {
    conv = { id: newId(), title: 'New chat', created: Date.now(), updated: Date.now(), system: $('system').value, messages: [] };
    state.conversations.push(conv);
    state.currentId = conv.id;
  }
  conv.system = $('system').value;
  if (!conv.messages.length) conv.title = text.replace(/\s+/g, ' ').trim().slice(0, 60) || 'New chat';
  conv.messages.push({ role: 'user', content: text });
  const msg = { role: 'assistant', content: '', reasoning: '', state: 'streaming', stats: {} };
  conv.updated = Date.now();
  const body = buildRequest(conv);
  conv.messages.push(msg);
  if (body.kv) msg.stats.kv = state.settings.kv_codec;
  saveConversations();
  renderAll();
  const node = nodes.get(msg);
  const box = $('messages');

  const controller = new AbortController();
  state.controller = controller;
  state.streaming = { conv, msg };
  setStreaming(true);
  showNotice('');

  const t0 = performance.now();
  let tFirst = null;
  let deltas = 0;
  let scheduled = false;
  const repaint = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      renderMessage(msg, node);
      if (atBottom) box.scrollTop = box.scrollHeight;
    });
  };
  try {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      msg.error = await errorMessage(response);
      if (response.status === 401) showNotice(KEY_NOTICE);
      msg.state = 'error';
    } else {
      await readSse(response, (chunk) => {
        if (chunk.error) {
          msg.error = chunk.error.message || JSON.stringify(chunk.error);
          msg.state = 'error';
          return;
        }
        const choice = chunk.choices && chunk.choices[0];
        const delta = choice && choice.delta;
        if (delta && (delta.content || delta.reasoning_content)) {
          if (tFirst === null) {
            tFirst = performance.now();
            msg.stats.ttft_ms = tFirst - t0;
          }
          deltas++;
          if (delta.reasoning_content) msg.reasoning += delta.reasoning_content;
          if (delta.content) msg.content += delta.content;
          repaint();
        }
        if (choice && choice.finish_reason) msg.finish = choice.finish_reason;
        if (chunk.usage) msg.stats.tokens = chunk.usage.completion_tokens;
        if (chunk.timings) {
          const t = chunk.timings;
          if (typeof t.predicted_per_second === 'number' && t.predicted_n > 1) msg.stats.tps = t.predicted_per_second;
          if (typeof t.predicted_n === 'number' && msg.stats.tokens === undefined) msg.stats.tokens = t.predicted_n;
        }
      });
      if (msg.state === 'streaming') msg.state = 'done';
    }
  } catch (e) {
    if (e.name === 'AbortError') {
      msg.state = 'stopped';
    } else {
      msg.state = 'error';
      msg.error = 'The request failed: ' + e.message;
    }
  }
  const tEnd = performance.now();
  if (msg.stats.tokens === undefined && deltas) {
    msg.stats.tokens = deltas; // each streamed delta carries about one token
    msg.stats.estimated = true;
  }
  if (msg.stats.tps === undefined && tFirst !== null && deltas > 1 && tEnd > tFirst) {
    msg.stats.tps = ((msg.stats.tokens || deltas) - 1) / ((tEnd - tFirst) / 1000);
  }
  state.controller = null;
  state.streaming = null;
  conv.updated = Date.now();
  saveConversations();
  renderMessage(msg, node);
  renderConversationList();
  setStreaming(false);
  refreshModelInfo();
}

function stop() {
  if (state.controller) state.controller.abort();
}

// ==== Model panel ====

async function getJson(path) {
  const r = await fetch(path, { headers: authHeaders() });
  if (!r.ok) {
    const e = new Error(await errorMessage(r));
    e.status = r.status;
    throw e;
  }
  return r.json();
}

async function refreshModelInfo() {
  const dl = $('model-info');
  const rows = [];
  try {
    const [models, stats] = await Promise.all([getJson('/v1/models'), getJson('/stats')]);
    const m = (models.data && models.data[0]) || {};
    $('model-name').textContent = m.id || '';
    rows.push(['model', m.id]);
    if (stats.model) {
      rows.push(['architecture', stats.model.model_type]);
      rows.push(['layers', stats.model.layers]);
      rows.push(['weights', formatBytes(stats.model.weights_bytes)]);
      rows.push(['context', stats.model.ctx_size + ' / ' + stats.model.max_position_embeddings]);
    }
    rows.push(['reasoning', m.reasoning ? 'yes' : 'no']);
    if (stats.server) {
      rows.push(['device', stats.server.device + (stats.server.threads ? ', ' + stats.server.threads + (stats.server.threads === 1 ? ' thread' : ' threads') : '')]);
      rows.push(['uptime', formatDuration(stats.server.uptime_s)]);
    }
    if (stats.kv) rows.push(['KV cache', formatBytes(stats.kv.bytes_used) + ' of ' + formatBytes(stats.kv.bytes_budget)]);
    if (stats.batch) rows.push(['requests', stats.batch.running + ' running, ' + stats.batch.waiting + ' waiting (batch ' + stats.batch.max + ')']);
    if (stats.totals) {
      rows.push(['served', stats.totals.requests_finished + ' done, ' + stats.totals.requests_cancelled + ' cancelled']);
      rows.push(['tokens', stats.totals.prompt_tokens + ' prompt, ' + stats.totals.generation_tokens + ' generated']);
    }
    if (stats.prefix_cache) rows.push(['prefix cache', stats.prefix_cache.entries + ' entries, ' + stats.prefix_cache.hits + ' hits']);
    dl.dataset.loaded = 'true';
    if ($('notice').textContent === KEY_NOTICE) showNotice('');
  } catch (e) {
    rows.push(['error', e.message]);
    if (e.status === 401) showNotice(KEY_NOTICE);
  }
  dl.textContent = '';
  for (const [k, v] of rows) dl.append(el('dt', '', k), el('dd', '', v === undefined || v === null ? '?' : String(v)));
}

// ==== Events ====

function selectConversation(id) {
  if (state.controller) return;
  state.currentId = id;
  saveConversations();
  renderAll();
}

function deleteConversation(id) {
  if (state.streaming && state.streaming.conv.id === id) stop();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.currentId === id) state.currentId = null;
  saveConversations();
  renderAll();
}

function init() {
  state.conversations = loadConversations();
  try {
    state.currentId = localStorage.getItem(STORE_CURRENT) || null;
  } catch {
    state.currentId = null;
    showNotice('This browser does not allow local storage: conversations will not be kept.');
  }
  if (!current()) state.currentId = null;
  const settings = loadJson(STORE_SETTINGS, {});
  state.settings = settings && typeof settings === 'object' && !Array.isArray(settings) ? settings : {};
  if (state.settings.settings_open) $('app').classList.add('with-settings');
  fillSettingsForm();

  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('prompt').value;
    if (!text.trim() || state.controller) return;
    $('prompt').value = '';
    send(text);
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', () => {
    if (state.controller) return;
    state.currentId = null;
    saveConversations();
    renderAll();
    $('prompt').focus();
  });
  $('conversations').addEventListener('click', (e) => {
    const li = e.target.closest('li');
    if (!li) return;
    if (e.target.closest('.delete')) deleteConversation(li.dataset.id);
    else selectConversation(li.dataset.id);
  });
  $('toggle-settings').addEventListener('click', () => {
    const open = $('app').classList.toggle('with-settings');
    state.settings.settings_open = open;
    saveSettings();
  });
  for (const f of SETTING_FIELDS) $(f).addEventListener('change', readSettingsForm);
  $('api_key').addEventListener('change', () => refreshModelInfo());
  $('system').addEventListener('change', () => {
    const conv = current();
    if (conv) {
      conv.system = $('system').value;
      saveConversations();
    } else {
      state.settings.system = $('system').value;
      saveSettings();
    }
  });
  $('refresh-info').addEventListener('click', refreshModelInfo);
  $('messages').addEventListener('click', (e) => {
    const btn = e.target.closest('.copy');
    if (!btn) return;
    const code = btn.parentElement.querySelector('code');
    if (navigator.clipboard && code) {
      navigator.clipboard.writeText(code.textContent).then(() => { btn.textContent = 'copied'; }, () => { btn.textContent = 'copy failed'; });
    }
  });
  renderAll();
  refreshModelInfo();
}

// The renderer is exposed for the browser test (tests/webui/chat_page.mjs).
window.cinfer = { renderMarkdown, highlight, escapeHtml };
document.addEventListener('DOMContentLoaded', init);
