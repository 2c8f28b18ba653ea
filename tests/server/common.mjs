// Shared helpers of the live-server tests: SDK loading from CI_NPM_DIR and small assertions.
import { createRequire } from 'node:module';

export const port = Number(process.argv[2]);
export const base = `http://127.0.0.1:${port}`;
const require = createRequire((process.env.CI_NPM_DIR || new URL('../npm/node_modules', import.meta.url).pathname) + '/');
export const OpenAI = require('openai').default ?? require('openai');
export const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');

export function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

export async function stats() {
  return (await fetch(`${base}/stats`, { headers: { Authorization: "Bearer test-key" } })).json();
}

// Waits until the engine is idle and returns its stats.
export async function idle() {
  for (let i = 0; i < 200; i++) {
    const s = await stats();
    if (s.batch.running === 0 && s.batch.waiting === 0 && s.kv.blocks_used === s.prefix_cache.blocks) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
  return stats();
}
