#!/usr/bin/env python3
"""Writes bench/cuda.md from the results bench/cuda.sh collected.

Usage: cuda_report.py RESULTS_DIR [OLD_REPORT]

With OLD_REPORT (the bench/cuda.md being replaced), everything below its KEEP_MARKER line (the
dated updates written by hand) follows the new tables unchanged.

RESULTS_DIR holds one folder per (model, dtype), named MODEL-DTYPE (bf16, q8, q4), each with
cinfer.json (build/step_bench with two input planes: f32-grade activations, the exact mode),
cinfer-fast.json (one bf16 input plane, the fast mode; optional), llama-bench.json and
llama-batched.jsonl (llama.cpp, absent when it was not built); and depth/ with cinfer.json
(decode at depth with each KV codec) and llama-bench-KV.json (KV = f16, q8_0, q4_0). Absolute
figures (this is a GPU report); the roofline share is weight bytes per token times tokens per
second over the bandwidth measured in the same run.
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


KEEP_MARKER = "<!-- Everything below this line is kept by bench/cuda_report.py when it rewrites the report. -->"
DTYPE_ORDER = {"bf16": 0, "q8": 1, "q4": 2}
LLAMA_TYPE = {"bf16": "bf16", "q8": "Q8_0", "q4": "Q4_0"}


def runs(results):
    """(model, dtype, folder) of every MODEL-DTYPE folder, the 1B before the 8B, bf16 first."""
    found = []
    for name in os.listdir(results):
        model, _, dtype = name.rpartition("-")
        if model and dtype in DTYPE_ORDER and os.path.isdir(os.path.join(results, name)):
            found.append((model, dtype, os.path.join(results, name)))
    def size(model):  # "llama-3.1-8b" -> 8.0; names without a size first
        try:
            return float(model.rsplit("-", 1)[-1].removesuffix("b"))
        except ValueError:
            return 0.0
    return sorted(found, key=lambda r: (size(r[0]), r[0], DTYPE_ORDER[r[1]]))


def section(model, dtype, d):
    c = load_json(os.path.join(d, "cinfer.json"))
    lb = load_json(os.path.join(d, "llama-bench.json")) or []
    batched = load_jsonl(os.path.join(d, "llama-batched.jsonl"))
    ltype = LLAMA_TYPE[dtype]
    out = [f"## {model} ({dtype}; llama.cpp {ltype})", ""]
    if not c:
        return out + ["cinfer did not run (see its .err file in the results).", ""]
    fast = load_json(os.path.join(d, "cinfer-fast.json"))
    bw = c.get("bandwidth_bytes_per_s") or 0
    wbytes = c.get("weight_bytes_per_token") or 0
    decode = {r["batch"]: r["tok_s"] for r in c.get("decode", [])}
    prefill = {r["tokens"]: r["tok_s"] for r in c.get("prefill", [])}
    f_decode = {r["batch"]: r["tok_s"] for r in (fast or {}).get("decode", [])}
    f_prefill = {r["tokens"]: r["tok_s"] for r in (fast or {}).get("prefill", [])}
    l_pp = {r.get("n_prompt"): r.get("avg_ts") for r in lb if r.get("n_gen") == 0}
    l_tg = next((r.get("avg_ts") for r in lb if r.get("n_prompt") == 0), None)
    l_size = next((r.get("model_size") for r in lb if r.get("model_size")), None)
    l_batched = {r.get("pl"): r.get("speed_tg") for r in batched}
    roof = bw / wbytes if bw and wbytes else None
    # Both engines' shares are over cinfer's bytes per token: the same weights at the same bits
    # per weight (bf16; 8.5 and 4.5 for MLX q8/q4 with groups of 64 as for Q8_0/Q4_0). llama.cpp's
    # file is no measure of what its decode reads: it holds the token-embedding table, of which a
    # step reads one row (an untied model's 1 GB at 8B in bf16), and llama-quantize may store the
    # head in another type.
    out += [f"Measured bandwidth {bw / 1e12:.2f} TB/s; the weights a decode step reads are "
            f"{wbytes / 1e9:.2f} GB per token, so the batch-1 roofline is {fmt(roof)} tok/s; both "
            "engines' shares below are over it"
            + (f" (llama.cpp's {ltype} file: {l_size / 1e9:.2f} GB)" if l_size else "")
            + f". GPU memory in use by cinfer at the end: "
            f"{c.get('gpu_memory_used_bytes', 0) / 2**30:.1f} GiB.", ""]
    share = lambda t, r=roof: "" if t is None or not r else f" ({100 * t / r:.0f}% of roofline)"
    rows = [("decode, batch 1 (tok/s)", decode.get(1), f_decode.get(1), l_tg, True)]
    rows += [(f"prefill {n} tokens (tok/s)", prefill[n], f_prefill.get(n), l_pp.get(n), False)
             for n in sorted(prefill)]
    rows += [(f"aggregate decode, {b} sequences (tok/s)", decode[b], f_decode.get(b),
              l_batched.get(b), False) for b in sorted(decode) if b != 1]
    none = lambda t: ""
    if fast:
        out += ["| measure | cinfer exact | cinfer fast | llama.cpp | exact / llama.cpp | "
                "fast / llama.cpp |", "|---|---|---|---|---|---|"]
        for name, e, f, l, roofed in rows:
            sh = share if roofed else none
            out.append(f"| {name} | {fmt(e)}{sh(e)} | {fmt(f)}{sh(f)} | {fmt(l)}{sh(l)} | "
                       f"{ratio(e, l)} | {ratio(f, l)} |")
    else:
        out += ["| measure | cinfer | llama.cpp | cinfer / llama.cpp |", "|---|---|---|---|"]
        for name, e, _, l, roofed in rows:
            sh = share if roofed else none
            out.append(f"| {name} | {fmt(e)}{sh(e)} | {fmt(l)}{sh(l)} | {ratio(e, l)} |")
    return out + [""]


def depth_section(d):
    """Batch-1 decode at depth: cinfer's KV codecs, llama.cpp's KV types, one column a depth."""
    c = load_json(os.path.join(d, "cinfer.json"))
    if not c:
        return []
    cells = {}
    for r in c.get("decode", []):
        if r.get("batch") == 1:
            cells[(r.get("kv"), r.get("context"))] = r.get("tok_s")
    llama = {}
    for kv in ("f16", "q8_0", "q4_0"):
        for r in load_json(os.path.join(d, f"llama-bench-{kv}.json")) or []:
            if r.get("n_prompt") == 0:
                llama[(kv, r.get("n_depth"))] = r.get("avg_ts")
    depths = sorted({ctx for _, ctx in cells} | {n for _, n in llama})
    codecs = list(dict.fromkeys(kv for kv, _ in cells))
    out = [f"## Decode at depth ({os.path.basename(os.path.normpath(c.get('model', '')))}, "
           "batch 1, tok/s)", "",
           "cinfer's KV codecs (the sequence stores its context in bf16 and converts before the "
           "timed steps) beside llama.cpp's KV types, K and V of one type. A quantized codec "
           "reads fewer bytes a token than bf16 KV.", "",
           "| KV | " + " | ".join(f"{n:,} tokens" for n in depths) + " |",
           "|---|" + "---|" * len(depths)]
    for kv in codecs:
        out.append(f"| cinfer {kv} | " + " | ".join(
            f"{fmt(cells.get((kv, n)), 1)}" + (
                "" if kv == "bf16" or cells.get((kv, n)) is None or not cells.get(("bf16", n))
                else f" ({cells[(kv, n)] / cells[('bf16', n)]:.2f}× bf16)") for n in depths) + " |")
    for kv in ("f16", "q8_0", "q4_0"):
        if any((kv, n) in llama for n in depths):
            out.append(f"| llama.cpp {kv} | " + " | ".join(
                fmt(llama.get((kv, n)), 1) for n in depths) + " |")
    return out + [""]


def main():
    results = sys.argv[1]
    gpu = open(os.path.join(results, "gpu.txt")).read().strip() if os.path.exists(
        os.path.join(results, "gpu.txt")) else "unknown GPU"
    out = ["# CUDA benchmark", "",
           f"GPU: {gpu}. Written by `make bench-cuda` (bench/cuda.sh) on the GPU machine; "
           "random-weight models of the named geometry (cinfer: `cinfer init-random`, q8/q4 "
           "MLX affine with groups of 64; llama.cpp: the bf16 folder converted to GGUF, and for "
           "q8/q4 quantized to Q8_0 / Q4_0 by llama-quantize, the same bits per weight), "
           "llama.cpp built with CUDA from source in the same run (flash attention on, all "
           "layers on the GPU). "
           "cinfer figures are its model step (build/step_bench: prefill in one chunk, decode "
           "steps of B sequences batched in one step, each holding a 128-token context); "
           "llama.cpp's are llama-bench (prefill, batch-1 decode) and llama-batched-bench "
           "(B sequences of the same context decoding together). cinfer *exact* feeds the "
           "matmuls and attention two bf16 planes of each f32 activation (value and remainder, "
           "logits within ~1e-3 of an f32 reference); *fast* one bf16 plane, as llama.cpp "
           "feeds bf16 activations. Shares of the roofline are the bytes of weights a decode "
           "step reads (cinfer's count: every matrix, and one row of an untied embedding table) "
           "times tok/s over the bandwidth a device copy measured in the same run, for both "
           "engines alike: they run the same weights at the same bits per weight. llama.cpp's "
           "file size is given beside it but is no measure of what its decode reads: the file "
           "holds the whole token-embedding table (1 GB of an untied 8B model in bf16) and "
           "llama-quantize may store the head in another type.", ""]
    for model, dtype, d in runs(results):
        out += section(model, dtype, d)
    out += depth_section(os.path.join(results, "depth"))
    out.append(KEEP_MARKER)
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        old = open(sys.argv[2]).read()
        if KEEP_MARKER in old:
            out.append(old.split(KEEP_MARKER, 1)[1].lstrip("\n").rstrip("\n"))
    print("\n".join(out))


if __name__ == "__main__":
    main()
