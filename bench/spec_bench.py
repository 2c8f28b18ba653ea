#!/usr/bin/env python3
"""Speculative decoding benchmark: `cinfer serve` on the starter model without speculation, with
prompt lookup (--lookup-ngram 3) and with the draft model (models/starter-draft), on code-completion
prompts (the first tokens of the held-out files in models/starter/eval_ids.json) and chat prompts
(docstring -> code requests), greedy, at concurrency 1 and 4. Reports decode tok/s (the engine's
`timings.predicted_per_second`, mean over requests; at concurrency 4 the aggregate completion
tokens per wall second), the acceptance rate and the mean tokens per target forward (generated /
decode steps, from /stats).

Usage: spec_bench.py [--cinfer build/cinfer] [--threads 2] [--gen 96] [--device cpu]
                     [--concurrency 1,4,16]
prints the rows of the tables in bench/spec.md (at concurrency C the prompts are cycled to C
requests).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT = [
    "Write a Python function `is_palindrome(s)` that returns True when s reads the same "
    "backwards, ignoring case and spaces.",
    "Write a Python function `flatten(xs)` that flattens a list of lists into one list.",
    "Write a Python function `count_words(text)` that returns a dict mapping each word to its "
    "count.",
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one sorted "
    "list.",
]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return json.loads(r.read())


def start(args, port, extra):
    cmd = [args.cinfer, "serve", "--model", os.path.join(ROOT, "models/starter"), "--port",
           str(port), "--threads", str(args.threads), "--prompt-cache", "0", "--device",
           args.device] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            get(port, "/health")
            return proc
        except Exception:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"server did not start: {' '.join(cmd)}")


def request(port, kind, prompt, gen):
    if kind == "code":
        body = {"model": "x", "prompt": prompt, "max_tokens": gen, "temperature": 0,
                "ignore_eos": True}
        r = post(port, "/v1/completions", body)
    else:
        body = {"model": "x", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": gen, "temperature": 0}
        r = post(port, "/v1/chat/completions", body)
    return r["timings"], r["usage"]["completion_tokens"]


def run_set(port, kind, prompts, gen, concurrency):
    before = get(port, "/stats")
    results = []
    t0 = time.time()
    if concurrency == 1:
        for p in prompts:
            results.append(request(port, kind, p, gen))
    else:
        lock = threading.Lock()

        def worker(p):
            out = request(port, kind, p, gen)
            with lock:
                results.append(out)

        batch = [prompts[i % len(prompts)] for i in range(concurrency)]
        threads = [threading.Thread(target=worker, args=(p,)) for p in batch]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.time() - t0
    after = get(port, "/stats")
    drafted = sum(t["draft_n"] for t, _ in results)
    accepted = sum(t["draft_accepted_n"] for t, _ in results)
    tokens = sum(n for _, n in results)
    steps = after["batch"]["steps"] - before["batch"]["steps"]
    if concurrency == 1:
        rate = sum(t["predicted_per_second"] for t, _ in results) / len(results)
    else:
        rate = tokens / wall
    return {"rate": rate, "drafted": drafted, "accepted": accepted, "tokens": tokens,
            "steps": steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cinfer", default=os.path.join(ROOT, "build/cinfer"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--port", type=int, default=28311)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,4,16")
    args = ap.parse_args()
    eval_ids = json.load(open(os.path.join(ROOT, "models/starter/eval_ids.json")))
    code = [seq[:192] for seq in eval_ids["sequences"]]
    configs = [("none", []), ("prompt lookup (--lookup-ngram 3)", ["--lookup-ngram", "3"]),
               ("draft model (starter-draft)",
                ["--draft-model", os.path.join(ROOT, "models/starter-draft")])]
    rows = []
    for name, extra in configs:
        proc = start(args, args.port, extra)
        try:
            request(args.port, "code", code[0][:32], 8)  # warm-up
            for kind, prompts in (("code", code), ("chat", CHAT)):
                for conc in [int(c) for c in args.concurrency.split(",")]:
                    r = run_set(args.port, kind, prompts, args.gen, conc)
                    rows.append((name, kind, conc, r))
                    print(name, kind, conc, r, flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    base = {(k, c): r["rate"] for n, k, c, r in rows if n == "none"}
    lines = ["| drafter | prompts | concurrency | decode tok/s | speed-up | acceptance | "
             "tokens per target forward |", "|---|---|---|---|---|---|---|"]
    for name, kind, conc, r in rows:
        acc = f"{100 * r['accepted'] / r['drafted']:.0f}% of {r['drafted']}" if r["drafted"] else "-"
        per_fwd = r["tokens"] / r["steps"] if r["steps"] and conc == 1 else None
        lines.append(f"| {name} | {kind} | {conc} | {r['rate']:.1f} | "
                     f"{r['rate'] / base[(kind, conc)]:.2f}x | {acc} | "
                     f"{per_fwd:.2f} |" if per_fwd else
                     f"| {name} | {kind} | {conc} | {r['rate']:.1f} | "
                     f"{r['rate'] / base[(kind, conc)]:.2f}x | {acc} | - |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
