#!/usr/bin/env python3
"""Writes bench/server.md from the JSON files bench/server.sh collected (bench/server_load.mjs
output): per concurrency level, cinfer vs llama-server output tok/s, TTFT, ITL and TPOT p50/p99
with their cinfer / llama.cpp ratios; the prefix-cache cold/warm TTFT table; the machine, the
run conditions and the exact commands."""

import argparse
import datetime
import json
import os
import textwrap

from report_common import commit_of_binary, cpu_model, fmt, load, sh

ENGINES = (("cinfer", "cinfer"), ("llama", "llama-server"))
NA_LLAMA = "n/a (llama-server not built: see bench/README.md)"


def mem_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 0


def para(text, width=96):
    """Text with its line breaks and runs of spaces collapsed, filled to `width` columns."""
    return textwrap.fill(" ".join(text.split()), width, break_long_words=False,
                         break_on_hyphens=False)


def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def get(run, *keys):
    """run["summary"][k1][k2]... or None."""
    x = run and run.get("summary")
    for k in keys:
        x = x.get(k) if isinstance(x, dict) else None
    return x


def level_table(c, runs, have_llama):
    """The table of one concurrency level: rows = metrics, columns = engines + ratio."""
    cin, lla = runs.get("cinfer"), runs.get("llama")
    n = (cin or lla or {}).get("config", {}).get("requests", "?")
    rows = [
        ("output tok/s (higher is better)", ("output_tok_s",), 2),
        ("prompt + output tok/s", ("total_tok_s",), 1),
        ("TTFT p50 ms", ("ttft_ms", "p50"), 0),
        ("TTFT p99 ms", ("ttft_ms", "p99"), 0),
        ("ITL p50 ms", ("itl_ms", "p50"), 1),
        ("ITL p99 ms", ("itl_ms", "p99"), 1),
        ("TPOT p50 ms", ("tpot_ms", "p50"), 1),
        ("TPOT p99 ms", ("tpot_ms", "p99"), 1),
        ("request latency p50 ms", ("latency_ms", "p50"), 0),
        ("wall s", ("wall_s",), 1),
    ]
    out = [f"### Concurrency {c} ({n} requests)", "",
           "| metric | cinfer | llama-server | cinfer / llama.cpp |", "|---|---|---|---|"]
    for label, keys, digits in rows:
        a, b = get(cin, *keys), get(lla, *keys)
        lcol = fmt(b, digits) if have_llama else "n/a"
        out.append(f"| {label} | {fmt(a, digits)} | {lcol} | {ratio(a, b)} |")

    def tokens(run):
        if not run:
            return "n/a"
        s = run["summary"]
        per = s.get("output_tokens_per_request") or {}
        prompt = s.get("server_prompt_tokens") or {}
        span = lambda d: (f"{d.get('min')}" if d.get("min") == d.get("max")
                          else f"{d.get('min')}-{d.get('max')}")
        err = f", {s['errors']} failed" if s.get("errors") else ""
        return (f"{s['output_tokens']} ({span(per)} per request, {s['requests_ok']} ok{err}); "
                f"prompt {span(prompt)}")

    out.append(f"| output tokens received; prompt tokens per request (server's count) | "
               f"{tokens(cin)} | {tokens(lla) if have_llama else 'n/a'} | |")
    out.append(f"| CPU taken by other processes | {interference(cin)} | "
               f"{interference(lla) if have_llama else 'n/a'} | |")
    out.append("")
    for name, run in (("cinfer", cin), ("llama-server", lla)):
        if run and get(run, "first_error"):
            out.append(f"{name}: first error: `{get(run, 'first_error')}`")
            out.append("")
    return out


def interference(run):
    x = get(run, "cpu", "interference")
    return "n/a" if x is None else f"{100 * x:.1f}%"


def summary_table(levels, runs_by_level, have_llama):
    out = ["| concurrency | cinfer tok/s | llama-server tok/s | tok/s ratio | TTFT p50 ratio | "
           "ITL p50 ratio | TPOT p50 ratio |", "|---|---|---|---|---|---|---|"]
    for c in levels:
        cin, lla = runs_by_level[c].get("cinfer"), runs_by_level[c].get("llama")
        out.append("| {} | {} | {} | {} | {} | {} | {} |".format(
            c, fmt(get(cin, "output_tok_s"), 2),
            fmt(get(lla, "output_tok_s"), 2) if have_llama else "n/a",
            ratio(get(cin, "output_tok_s"), get(lla, "output_tok_s")),
            ratio(get(cin, "ttft_ms", "p50"), get(lla, "ttft_ms", "p50")),
            ratio(get(cin, "itl_ms", "p50"), get(lla, "itl_ms", "p50")),
            ratio(get(cin, "tpot_ms", "p50"), get(lla, "tpot_ms", "p50"))))
    return out


def prefix_table(results, have_llama):
    out = ["| engine | prompt tokens (server's count) | cold TTFT ms | warm TTFT p50 ms | "
           "cold / warm | cached tokens reported (cold, warm...) | CPU taken by others |",
           "|---|---|---|---|---|---|---|"]
    for key, name in ENGINES:
        run = load(os.path.join(results, f"{key}-prefix.json"))
        if key == "llama" and not have_llama:
            out.append(f"| {name} | {NA_LLAMA} | | | | | |")
            continue
        if not run:
            out.append(f"| {name} | n/a (run failed: see {key}-prefix.log) | | | | | |")
            continue
        s = run["summary"]
        prompts = sorted({p for p in s["prompt_tokens"] if p is not None})
        prompt = "n/a" if not prompts else (
            str(prompts[0]) if len(prompts) == 1 else f"{prompts[0]}-{prompts[-1]}")
        warm = ", ".join(fmt(x, 0) for x in s["warm_ttft_ms"])
        cached = ", ".join("n/a" if x is None else str(x) for x in s["cached_tokens"])
        out.append(f"| {name} | {prompt} | {fmt(s['cold_ttft_ms'], 0)} | "
                   f"{fmt(s['warm_ttft_ms_p50'], 0)} ({warm}) | {fmt(s['cold_over_warm'], 2)} | "
                   f"{cached} | {interference(run)} |")
    return out


def restart_table(results):
    """The prompt cache on disk: TTFT of one long prompt cold vs after a restart."""
    cold = load(os.path.join(results, "cinfer-restart-cold.json"))
    warm = load(os.path.join(results, "cinfer-restart-warm.json"))
    if not cold or not warm:
        return ["n/a (not run, or it failed: see cinfer-restart-cold.log / -warm.log)"]
    c, w = cold["summary"], warm["summary"]
    saved = c.get("saved") or {}
    return ["| run | prompt tokens | cached tokens | TTFT ms | CPU taken by others |",
            "|---|---|---|---|---|",
            f"| cold (then POST /v1/cache/save: {saved.get('blocks_written', 'n/a')} blocks, "
            f"{fmt((saved.get('bytes_written') or 0) / 2**20, 1)} MiB on disk) | "
            f"{c['prompt_tokens']} | {c['cached_tokens']} | {fmt(c['ttft_ms'], 0)} | "
            f"{interference(cold)} |",
            f"| after a restart | {w['prompt_tokens']} | {w['cached_tokens']} | "
            f"{fmt(w['ttft_ms'], 0)} | {interference(warm)} |",
            "",
            f"Cold / restarted TTFT: {ratio(c['ttft_ms'], w['ttft_ms'])}."]


def describe(cfg):
    return (f"hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
            f"{cfg['num_attention_heads']}/{cfg.get('num_key_value_heads')} heads, "
            f"head_dim {cfg.get('head_dim')}, FFN {cfg['intermediate_size']}, "
            f"vocab {cfg['vocab_size']}")


def main():
    ap = argparse.ArgumentParser()
    for opt in ("--results", "--model", "--gguf", "--config", "--levels", "--llama-server",
                "--api", "--out"):
        ap.add_argument(opt, required=True)
    for opt in ("--threads", "--prompt", "--gen", "--system", "--prefix-requests",
                "--prefix-slots", "--prefix-gen", "--have-llama", "--elapsed", "--ban",
                "--restart-tokens"):
        ap.add_argument(opt, type=int, required=True)
    a = ap.parse_args()
    have_llama = bool(a.have_llama)
    levels = a.levels.split()
    runs_by_level = {c: {key: load(os.path.join(a.results, f"{key}-c{c}.json"))
                         for key, _ in ENGINES} for c in levels}
    with open(a.config) as f:
        cfg = json.load(f)

    commit = commit_of_binary()
    llama_dir = os.path.dirname(os.path.dirname(os.path.dirname(a.llama_server)))
    llama_commit = os.environ.get("LLAMA_CPP_COMMIT") or sh(
        ["git", "-C", llama_dir, "rev-parse", "--short=12", "HEAD"])
    if llama_commit == "unknown":
        llama_commit = "unknown (see bench/README.md)"
    if not have_llama:
        llama_commit = "not built"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        with open(os.path.join(a.results, "commands.txt")) as f:
            commands = f.read().strip()
    except OSError:
        commands = "(none recorded)"
    loadavg = open("/proc/loadavg").read().split()[:3]

    level_sections = []
    for c in levels:
        level_sections += level_table(c, runs_by_level[c], have_llama)
    conditions = []
    for c in levels:
        for key, name in ENGINES:
            run = runs_by_level[c].get(key)
            if run:
                conditions.append(f"{name} C={c} {interference(run)}")
    for key, name in ENGINES:
        run = load(os.path.join(a.results, f"{key}-prefix.json"))
        if run:
            conditions.append(f"{name} prefix {interference(run)}")
    busy = any((get(r, "cpu", "interference") or 0) > 0.05
               for lv in runs_by_level.values() for r in lv.values() if r)
    busy_note = ("\n**Other processes took more than 5% of the CPUs during some runs (see Run "
                 "conditions): the machine was busy, so these figures are preliminary; rerun "
                 "on a quiet machine.**\n" if busy else "")
    llama_note = "" if have_llama else f"\nllama-server columns: {NA_LLAMA}.\n"
    ban_note = ("; every request carries `logit_bias` -100 for the 1352 Llama 3 tokens whose bytes "
                "are not valid UTF-8 alone (a random-weight model strings them into invalid UTF-8, "
                "on which llama-server's output parser fails the request mid-stream)"
                if a.ban else "")
    if a.api == "chat":
        workload = (f"streaming `/v1/chat/completions` requests; each request's user message "
                    f"is its own seeded text of {a.prompt} tokens (each server applies its chat "
                    f"template)")
        prefix_how = ("as the system message, with a different short question as the user "
                      "message of each request")
    else:
        workload = (f"streaming `/v1/completions` requests whose prompts are token ids, the "
                    f"same on both sides: BOS + its own seeded text of {a.prompt} tokens (no "
                    f"chat template involved)")
        prefix_how = ("(token ids: BOS + the shared text) followed by a different short "
                      "question (`Question: ...` / `Answer:`) per request")

    intro = para(f"""Both servers run the same random-weight Llama-3.2-1B-geometry model
({describe(cfg)}) with the real Llama 3 tokenizer: cinfer serves `{a.model}` (q4: MLX affine,
group 64, 4.5 bits per weight), llama-server `{a.gguf}` (Q4_0, 4.5 bits per weight, same
weights, written by `bench/gguf_from_hf.py --tokenizer`). Each server gets C slots (cinfer
`--batch C`, llama-server `-np C --cont-batching`) and {a.threads} threads, and is started fresh
for each level. The client (`bench/server_load.mjs`) keeps C requests in flight until max(2C, 8)
are done: {workload}; max_tokens {a.gen}, temperature 0, `ignore_eos` (both servers honour it;
the tokens actually received are in the tables){ban_note}. One unmeasured warm-up request
precedes each run.""")
    definitions = para("""Definitions: output tok/s = output tokens of all requests / wall time
of the level; prompt + output tok/s counts the prompt tokens too (with these short answers most
of the work is prefill). TTFT = request sent -> first streamed token. ITL = gaps between
consecutive streamed chunks, pooled over all requests (a chunk is one token unless a token's
text is empty, e.g. half of a UTF-8 character, or the client read several at once). TPOT = per
request, (last - first token time) / (tokens - 1). Ratios are cinfer / llama.cpp: above 1 means
cinfer is faster for tok/s, slower for the latencies. Absolute times are specific to this
machine; compare the ratios.""")
    prefix_intro = para(f"""A shared system prompt of {a.system} tokens of seeded text
{prefix_how}: {a.prefix_requests} requests one after another on a fresh server with
{a.prefix_slots} slots, max_tokens {a.prefix_gen}. The first is cold; the others can reuse the
shared prompt's KV (cinfer: its prefix cache; llama-server: its slots' prompt cache,
`cache_prompt` on by default, and its host-memory prompt cache). Cached tokens are what each
server reports (`usage.prompt_tokens_details.cached_tokens`; llama-server also
`timings.cache_n`).""")
    cin_prefix = load(os.path.join(a.results, "cinfer-prefix.json"))
    if cin_prefix and not any(cin_prefix["summary"]["cached_tokens"][1:]):
        prefix_intro += "\n\n" + para("""cinfer reported no cached tokens on the warm requests:
this build does not reuse the prefix (no prefix cache yet, or it missed), so its warm TTFT is
another full prefill.""")
    conditions_text = para(f"""CPU time taken by other processes during each run, as a share of
all CPUs (the load generator waits up to a minute for the machine to go idle before each run; a
run above 5% is repeated once on a fresh server, keeping the cleaner): {", ".join(conditions) or
"n/a"}.""")
    restart_intro = para(f"""cinfer only (`serve --prompt-cache-dir`): one prompt of
{a.restart_tokens} seeded tokens, max_tokens {a.prefix_gen}, on a fresh server with one slot;
then `POST /v1/cache/save`, the server stopped and started again over the same directory, and
the same prompt sent again. The restarted server reads the prompt's KV blocks from disk at
admission and prefills only the last partial block.""")
    out = f"""# Server benchmark: cinfer vs llama-server

{intro}
{busy_note}
- Machine: {cpu_model()}, {a.threads} threads (`nproc` = {os.cpu_count()}), {mem_gib():.0f} GiB
- Date: {now}; load average at the end {" ".join(loadavg)}
- cinfer commit: {commit}; llama.cpp: {llama_commit}
- Command: `make bench` (runs `bench/server.sh` after `bench/run.sh` and `bench/kv.sh`), or
  `bench/server.sh` alone; this run took {a.elapsed / 60:.1f} minutes
{llama_note}
{definitions}

## Summary

{chr(10).join(summary_table(levels, runs_by_level, have_llama))}

## By concurrency

{chr(10).join(level_sections)}
## Prefix cache

{prefix_intro}

{chr(10).join(prefix_table(a.results, have_llama))}

## Prompt cache after a restart

{restart_intro}

{chr(10).join(restart_table(a.results))}

## Run conditions

{conditions_text}

## Commands

Result files: `ENGINE-cC.json`, `ENGINE-prefix.json`, `cinfer-restart-{{cold,warm}}.json` in
`{a.results}` (`.tryN` in a command is
attempt N; the kept attempt is renamed without it).

```
{commands}
```
"""
    with open(a.out, "w") as f:
        f.write(out)


if __name__ == "__main__":
    main()
