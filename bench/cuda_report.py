#!/usr/bin/env python3
"""Writes bench/cuda.md from the results bench/cuda.sh collected.

Usage: cuda_report.py RESULTS_DIR "MODEL MODEL ..."

Per model: cinfer.json (build/step_bench with two input planes: f32-grade activations, the exact
mode), cinfer-fast.json (one bf16 input plane, the fast mode; optional), llama-bench.json and
llama-batched.jsonl (llama.cpp, absent when it was not built). Absolute figures (this is a GPU report); the roofline share is
weight bytes per token times tokens per second over the bandwidth measured in the same run.
"""
import json
import os
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except (OSError, ValueError):
        pass
    return rows


def fmt(x, digits=0):
    return "–" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def main():
    results, models = sys.argv[1], sys.argv[2].split()
    gpu = open(os.path.join(results, "gpu.txt")).read().strip() if os.path.exists(
        os.path.join(results, "gpu.txt")) else "unknown GPU"
    out = ["# CUDA benchmark", "",
           f"GPU: {gpu}. Written by `make bench-cuda` (bench/cuda.sh) on the GPU machine; "
           "random-weight bf16 models of the named geometry, the same weights in both engines "
           "(llama.cpp reads a GGUF converted from cinfer's folder), llama.cpp built with CUDA "
           "from source in the same run (flash attention on, all layers on the GPU). "
           "cinfer figures are its model step (build/step_bench: prefill in one chunk, decode "
           "steps of B sequences batched in one step, each holding a 128-token context); "
           "llama.cpp's are llama-bench (prefill, batch-1 decode) and llama-batched-bench "
           "(B sequences of the same context decoding together). cinfer *exact* feeds the "
           "matmuls and attention two bf16 planes of each f32 activation (value and remainder, "
           "logits within ~1e-3 of an f32 reference); *fast* one bf16 plane, as llama.cpp "
           "feeds bf16 activations.", ""]
    for model in models:
        d = os.path.join(results, model)
        c = load_json(os.path.join(d, "cinfer.json"))
        lb = load_json(os.path.join(d, "llama-bench.json")) or []
        batched = load_jsonl(os.path.join(d, "llama-batched.jsonl"))
        out += [f"## {model} (bf16)", ""]
        if not c:
            out += ["cinfer did not run (see its .err file in the results).", ""]
            continue
        fast = load_json(os.path.join(d, "cinfer-fast.json"))
        bw = c.get("bandwidth_bytes_per_s") or 0
        wbytes = c.get("weight_bytes_per_token") or 0
        decode = {r["batch"]: r["tok_s"] for r in c.get("decode", [])}
        prefill = {r["tokens"]: r["tok_s"] for r in c.get("prefill", [])}
        f_decode = {r["batch"]: r["tok_s"] for r in (fast or {}).get("decode", [])}
        f_prefill = {r["tokens"]: r["tok_s"] for r in (fast or {}).get("prefill", [])}
        l_pp = {r.get("n_prompt"): r.get("avg_ts") for r in lb if r.get("n_gen") == 0}
        l_tg = next((r.get("avg_ts") for r in lb if r.get("n_prompt") == 0), None)
        l_batched = {r.get("pl"): r.get("speed_tg") for r in batched}
        roof = bw / wbytes if bw and wbytes else None
        out += [f"Measured bandwidth {bw / 1e12:.2f} TB/s; weights {wbytes / 1e9:.2f} GB per "
                f"token, so the batch-1 roofline is {fmt(roof)} tok/s. GPU memory in use by "
                f"cinfer at the end: {c.get('gpu_memory_used_bytes', 0) / 2**30:.1f} GiB.", ""]
        share = lambda t: "" if t is None or not roof else f" ({100 * t / roof:.0f}% of roofline)"
        rows = [("decode, batch 1 (tok/s)", decode.get(1), f_decode.get(1), l_tg, True)]
        rows += [(f"prefill {n} tokens (tok/s)", prefill[n], f_prefill.get(n), l_pp.get(n), False)
                 for n in sorted(prefill)]
        rows += [(f"aggregate decode, {b} sequences (tok/s)", decode[b], f_decode.get(b),
                  l_batched.get(b), False) for b in sorted(decode) if b != 1]
        if fast:
            out += ["| measure | cinfer exact | cinfer fast | llama.cpp | exact / llama.cpp | "
                    "fast / llama.cpp |", "|---|---|---|---|---|---|"]
            for name, e, f, l, roofed in rows:
                sh = share if roofed else (lambda t: "")
                out.append(f"| {name} | {fmt(e)}{sh(e)} | {fmt(f)}{sh(f)} | {fmt(l)}{sh(l)} | "
                           f"{ratio(e, l)} | {ratio(f, l)} |")
        else:
            out += ["| measure | cinfer | llama.cpp | cinfer / llama.cpp |", "|---|---|---|---|"]
            for name, e, _, l, roofed in rows:
                sh = share if roofed else (lambda t: "")
                out.append(f"| {name} | {fmt(e)}{sh(e)} | {fmt(l)}{sh(l)} | {ratio(e, l)} |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
