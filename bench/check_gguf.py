#!/usr/bin/env python3
"""Checks that llama.cpp runs a GGUF written by bench/gguf_from_hf.py as cinfer runs the source
folder: teacher-forced logits (`cinfer logits` vs bench/llama_logits) and greedy continuations
(`cinfer generate --ids --temp 0` vs `llama_logits --greedy`) on the same token-id prompts.

Usage: check_gguf.py MODEL_DIR MODEL.gguf --llama-logits BIN [--cinfer build/cinfer]
                     [--prompts FILE.json | --eval-ids N:LEN] [--fixture] [--gen 32]
                     [--kv f32|bf16]

Prompts: --eval-ids N:LEN takes the first LEN tokens of N sequences of MODEL_DIR/eval_ids.json
(the starter models); --prompts a JSON list of id lists; --fixture the folder's ids.txt (a test
fixture) and also compares with its transformers logits.f32 and greedy.txt. Prints one line per
prompt: the largest logit difference, the smallest per-position correlation, the share of
positions whose argmax agrees, and how many greedy tokens agree before the first difference.
Exit status 1 when a greedy continuation or an argmax differs. Needs numpy.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def compare(a, b):
    """(max |a - b|, min per-row correlation, share of rows with the same argmax)."""
    corr = min(float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b))
    return float(np.abs(a - b).max()), corr, float((a.argmax(1) == b.argmax(1)).mean())


def agree(x, y):
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("gguf")
    ap.add_argument("--llama-logits", required=True, help="the built bench/llama_logits.c")
    ap.add_argument("--cinfer", default=os.path.join(ROOT, "build/cinfer"))
    ap.add_argument("--prompts")
    ap.add_argument("--eval-ids", metavar="N:LEN")
    ap.add_argument("--fixture", action="store_true")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--kv", choices=["f32", "bf16"], default="f32",
                    help="cinfer's KV codec (llama.cpp's KV follows: f32, or f16 for bf16)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    if args.fixture:
        with open(os.path.join(args.model_dir, "ids.txt")) as f:
            prompts = [[int(t) for t in f.read().split(",")]]
    elif args.eval_ids:
        n, length = (int(x) for x in args.eval_ids.split(":"))
        with open(os.path.join(args.model_dir, "eval_ids.json")) as f:
            prompts = [s[:length] for s in json.load(f)["sequences"][:n]]
    elif args.prompts:
        with open(args.prompts) as f:
            prompts = json.load(f)
    else:
        sys.exit("give --fixture, --eval-ids N:LEN or --prompts FILE")

    lkv = "f32" if args.kv == "f32" else "f16"
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for k, ids in enumerate(prompts):
            csv = ",".join(map(str, ids))
            mine, theirs = os.path.join(tmp, "c.f32"), os.path.join(tmp, "l.f32")
            run([args.cinfer, "logits", "--model", args.model_dir, "--ids", csv, "--out", mine,
                 "--threads", str(args.threads), "--kv-codec", args.kv])
            out = run([args.llama_logits, args.gguf, csv, "--out", theirs, "--greedy",
                       str(args.gen), "--threads", str(args.threads), "--kv", lkv])
            lgreedy = [int(t) for t in out.strip().split(",")] if args.gen else []
            a = np.fromfile(mine, "<f4").reshape(len(ids), -1)
            b = np.fromfile(theirs, "<f4").reshape(len(ids), -1)
            gen = json.loads(run([args.cinfer, "generate", "--model", args.model_dir, "--ids",
                                  csv, "--temp", "0", "-n", str(args.gen), "--ignore-eos",
                                  "--json", "--threads", str(args.threads), "--kv-codec",
                                  args.kv]))
            cgreedy = gen["ids"]
            d, corr, top1 = compare(a, b)
            same = agree(cgreedy, lgreedy)
            line = (f"prompt {k} ({len(ids)} ids): cinfer vs llama.cpp max|dlogit| {d:.4f}, "
                    f"min corr {corr:.6f}, argmax agree {100 * top1:.1f}%, greedy "
                    f"{same}/{args.gen} equal")
            if top1 < 1 or same < args.gen:
                failed = True
            if args.fixture:
                ref = np.fromfile(os.path.join(args.model_dir, "logits.f32"), "<f4")
                ref = ref.reshape(len(ids), -1)
                rd, rcorr, rtop1 = compare(ref, b)
                with open(os.path.join(args.model_dir, "greedy.txt")) as f:
                    want = [int(t) for t in f.read().split(",")]
                line += (f"; transformers vs llama.cpp max|dlogit| {rd:.4f}, min corr "
                         f"{rcorr:.6f}, argmax agree {100 * rtop1:.1f}%, greedy "
                         f"{agree(want, lgreedy)}/{min(len(want), args.gen)} equal")
            print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
