#!/usr/bin/env python3
"""cinfer's step_bench and llama.cpp's llama-bench on the same model, one right after the other,
ROUNDS times, with the share of all CPUs other processes took during each run (a shared machine
disturbs the figures; this says by how much). Prints one JSON object per run and a summary with
the median of each measure.

Usage: pair_bench.py MODEL_DIR MODEL.gguf [--rounds 3] [--threads 2] [--prompt 128] [--gen 8]
                     [--precision exact|fast] [--step-bench build/step_bench]
                     [--llama-bench PATH]

cinfer: step_bench MODEL_DIR --device cpu --prompts P --batches 1,4 --gen G --context 64
        --threads T --precision exact|fast (prefill of P tokens in one chunk, batch-1 and
        4-sequence decode; precision defaults to exact, step_bench's own default, so figures
        recorded before the flag existed reproduce; `cinfer` itself defaults to fast);
llama.cpp: llama-bench -m MODEL.gguf -p P -n G -r 1 -t T -o json (prefill and batch-1 decode).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import time

NCPU = os.cpu_count() or 1


def busy_seconds():
    """CPU seconds all processes spent busy so far (/proc/stat, every CPU)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmd, env=None):
    """Runs cmd; returns (stdout, wall seconds, others' CPU share, load average before)."""
    load = os.getloadavg()[0]
    busy0, own0, t0 = busy_seconds(), children_cpu(), time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    wall = time.time() - t0
    others = (busy_seconds() - busy0 - (children_cpu() - own0)) / (wall * NCPU)
    return out, wall, max(0.0, others), load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--precision", choices=["exact", "fast"], default="exact")
    ap.add_argument("--step-bench", default="build/step_bench")
    ap.add_argument("--llama-bench", default="/work/llama.cpp/build/bin/llama-bench")
    a = ap.parse_args()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(a.llama_bench) + ":" + env.get("LD_LIBRARY_PATH", "")
    runs = {"cinfer": [], "llama": []}
    for r in range(a.rounds):
        out, wall, others, load = timed([
            a.step_bench, a.model_dir, "--device", "cpu", "--prompts", str(a.prompt),
            "--batches", "1,4", "--gen", str(a.gen), "--context", "64", "--threads",
            str(a.threads), "--precision", a.precision])
        j = json.loads(out)
        row = {"engine": "cinfer", "round": r, "prefill_tok_s": j["prefill"][0]["tok_s"],
               "decode_tok_s": j["decode"][0]["tok_s"], "decode4_tok_s": j["decode"][1]["tok_s"],
               "wall_s": round(wall, 1), "others_cpu": round(others, 3), "load": load}
        print(json.dumps(row), flush=True)
        runs["cinfer"].append(row)
        out, wall, others, load = timed([
            a.llama_bench, "-m", a.gguf, "-p", str(a.prompt), "-n", str(a.gen), "-r", "1", "-t",
            str(a.threads), "-o", "json"], env)
        tests = json.loads(out)
        pre = next(t for t in tests if t["n_prompt"] > 0 and t["n_gen"] == 0)
        dec = next(t for t in tests if t["n_gen"] > 0 and t["n_prompt"] == 0)
        row = {"engine": "llama.cpp", "round": r, "prefill_tok_s": round(pre["avg_ts"], 2),
               "decode_tok_s": round(dec["avg_ts"], 2), "wall_s": round(wall, 1),
               "others_cpu": round(others, 3), "load": load,
               "build": pre.get("build_commit", "")}
        print(json.dumps(row), flush=True)
        runs["llama"].append(row)
    summary = {}
    for engine, rows in runs.items():
        summary[engine] = {k: statistics.median(x[k] for x in rows)
                           for k in rows[0] if k.endswith("tok_s") or k in ("others_cpu", "load")}
    print(json.dumps({"median": summary}))


if __name__ == "__main__":
    main()
