// A small stand-in for the Hugging Face Hub, for the `cinfer pull` tests (tests/test_hub.c):
// the revision listing (GET /api/models/ORG/NAME/revision/REV?blobs=true), file resolution
// (GET /ORG/NAME/resolve/REV/FILE, LFS files redirected to /cdn/... as the Hub redirects to its
// CDN), Range requests (206, 416), the Hub's X-Error-Code headers, and the faults the client
// must survive or report. Listens on 127.0.0.1 at a free port, prints "PORT <n>", and appends
// one line per request to LOGFILE. Exits when its standard input closes.
//
// usage: node server.mjs SOURCE_DIR LOGFILE
//
// Repos (content read from SOURCE_DIR):
//   cinfer/starter  models/starter
//   cinfer/llama    tests/fixtures/llama
//   cinfer/flaky    tests/fixtures/llama; the first GET of model.safetensors breaks mid-body
//   cinfer/norange  tests/fixtures/llama; Range headers are ignored (200 with the whole file)
//   cinfer/corrupt  tests/fixtures/llama; the listing's sha256 of model.safetensors is wrong
//   cinfer/gated    tests/fixtures/llama; files need "Authorization: Bearer good-token"
//                   (401 GatedRepo without a token, 403 GatedRepo with another one)
// Each has branch "main" and tag "v1" on one commit; other revisions are 404 RevisionNotFound,
// other repos 404 RepoNotFound.
import { createHash } from 'node:crypto';
import { appendFileSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';

const [source, logFile] = process.argv.slice(2);
if (!source || !logFile) {
  console.error('usage: node server.mjs SOURCE_DIR LOGFILE');
  process.exit(2);
}

function loadRepo(id, dir) {
  const files = new Map();
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (!statSync(path).isFile()) continue;
    const data = readFileSync(path);
    const lfs = name.endsWith('.safetensors') || name === 'tokenizer.json';
    const sha256 = createHash('sha256').update(data).digest('hex');
    const blobId = createHash('sha1').update(`blob ${data.length}\0`).update(data).digest('hex');
    files.set(name, { data, lfs, sha256, blobId });
  }
  const commit = createHash('sha1').update(`commit ${id}`).digest('hex');
  return { id, files, commit, refs: { main: commit, v1: commit } };
}

const llama = join(source, 'tests/fixtures/llama');
const repos = new Map();
for (const [id, dir] of [
  ['cinfer/starter', join(source, 'models/starter')],
  ['cinfer/llama', llama],
  ['cinfer/flaky', llama],
  ['cinfer/norange', llama],
  ['cinfer/corrupt', llama],
  ['cinfer/gated', llama],
]) {
  repos.set(id, loadRepo(id, dir));
}
const flakyBroken = new Set(); // files of cinfer/flaky whose first transfer already broke

function log(req) {
  const range = req.headers.range || '-';
  const auth = req.headers.authorization ? 'auth' : 'noauth';
  appendFileSync(logFile, `${req.method} ${req.url} range=${range} ${auth}\n`);
}

function hubError(res, status, code, message) {
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'X-Error-Code': code,
    'X-Error-Message': message,
  });
  res.end(JSON.stringify({ error: message }));
}

function commitOf(repo, rev) {
  if (rev === repo.commit) return repo.commit;
  return repo.refs[rev];
}

function listing(res, repo, rev) {
  const commit = commitOf(repo, rev);
  if (!commit) return hubError(res, 404, 'RevisionNotFound', `Invalid rev id: ${rev}`);
  const siblings = [];
  for (const [name, f] of repo.files) {
    const entry = { rfilename: name, blobId: f.blobId, size: f.data.length };
    if (f.lfs) {
      let sha256 = f.sha256;
      if (repo.id === 'cinfer/corrupt' && name === 'model.safetensors') {
        sha256 = createHash('sha256').update('not the content').digest('hex');
      }
      entry.lfs = { sha256, size: f.data.length, pointerSize: 134 };
    }
    siblings.push(entry);
  }
  const body = JSON.stringify({ _id: repo.commit.slice(0, 24), id: repo.id, modelId: repo.id,
                                sha: commit, private: false, gated: repo.id === 'cinfer/gated' ? 'auto' : false,
                                siblings });
  res.writeHead(200, { 'Content-Type': 'application/json' });
  res.end(body);
}

// Sends file f honouring Range (unless the repo ignores it); cinfer/flaky breaks its first
// transfer of each LFS file halfway.
function sendFile(req, res, repo, name, f) {
  const size = f.data.length;
  const range = repo.id === 'cinfer/norange' ? undefined : req.headers.range;
  const headers = { 'Content-Type': 'application/octet-stream', 'Accept-Ranges': 'bytes',
                    ETag: `"${f.lfs ? f.sha256 : f.blobId}"` };
  if (range) {
    const m = /^bytes=(\d+)-(\d*)$/.exec(range);
    if (!m) return hubError(res, 400, 'BadRange', `bad range ${range}`);
    const start = Number(m[1]);
    const end = m[2] ? Math.min(Number(m[2]), size - 1) : size - 1;
    if (start >= size) {
      res.writeHead(416, { 'Content-Range': `bytes */${size}` });
      return res.end();
    }
    res.writeHead(206, { ...headers, 'Content-Length': end - start + 1,
                         'Content-Range': `bytes ${start}-${end}/${size}` });
    return res.end(f.data.subarray(start, end + 1));
  }
  if (repo.id === 'cinfer/flaky' && f.lfs && !flakyBroken.has(name)) {
    flakyBroken.add(name);
    res.writeHead(200, { ...headers, 'Content-Length': size });
    res.write(f.data.subarray(0, Math.floor(size / 2)), () => {
      setTimeout(() => res.socket.destroy(), 20);
    });
    return;
  }
  res.writeHead(200, { ...headers, 'Content-Length': size });
  res.end(f.data);
}

// The gated repo's files: 401 without a token, 403 with a token the repo does not accept.
function gateRefuses(req, res, repo) {
  if (repo.id !== 'cinfer/gated') return false;
  const auth = req.headers.authorization;
  if (auth === 'Bearer good-token') return false;
  const message = `Access to model ${repo.id} is restricted. You must have access to it and be authenticated to access it. Please log in.`;
  hubError(res, auth ? 403 : 401, 'GatedRepo', message);
  return true;
}

const server = createServer((req, res) => {
  log(req);
  const url = new URL(req.url, 'http://localhost');
  const path = decodeURIComponent(url.pathname);
  let m = /^\/api\/models\/([^/]+\/[^/]+)\/revision\/(.+)$/.exec(path);
  if (m) {
    const repo = repos.get(m[1]);
    if (!repo) return hubError(res, 404, 'RepoNotFound', 'Repository not found');
    return listing(res, repo, m[2]);
  }
  m = /^\/cdn\/([^/]+\/[^/]+)\/(.+)$/.exec(path);
  if (m) {
    const repo = repos.get(m[1]);
    const f = repo && repo.files.get(m[2]);
    if (!f) return hubError(res, 404, 'EntryNotFound', 'no such object');
    return sendFile(req, res, repo, m[2], f);
  }
  m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path);
  if (m) {
    const repo = repos.get(m[1]);
    if (!repo) return hubError(res, 404, 'RepoNotFound', 'Repository not found');
    if (gateRefuses(req, res, repo)) return;
    const commit = commitOf(repo, m[2]);
    if (!commit) return hubError(res, 404, 'RevisionNotFound', `Invalid rev id: ${m[2]}`);
    const f = repo.files.get(m[3]);
    if (!f) return hubError(res, 404, 'EntryNotFound', `${m[3]} does not exist`);
    if (f.lfs) {
      res.writeHead(302, { Location: `/cdn/${repo.id}/${encodeURIComponent(m[3])}`,
                           'X-Linked-Etag': `"${f.sha256}"`, 'X-Linked-Size': f.data.length,
                           'X-Repo-Commit': commit });
      return res.end();
    }
    return sendFile(req, res, repo, m[3], f);
  }
  hubError(res, 404, 'NotFound', `no route for ${path}`);
});

server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
// The test holds our stdin open; when it ends (the test finished or died), so do we.
process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
