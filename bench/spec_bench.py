#!/usr/bin/env python3
"""Speculative decoding benchmark: `cinfer serve` on the starter model without speculation, with
prompt lookup (--lookup-ngram 3) and with the draft model (models/starter-draft), and, given a
llama.cpp build, llama.cpp's `llama-server` on the same models converted to GGUF
(bench/gguf_from_hf.py) without speculation, with its prompt lookup (`--spec-type ngram-simple`,
the same n-gram and draft lengths) and with the draft model (`--model-draft`, `--spec-type
draft-simple`, the same --draft-max/--draft-min) — in the same run, on the same prompts and
settings: code-completion prompts (the first 192 tokens of the held-out files in
models/starter/eval_ids.json, sent as token ids to /v1/completions with ignore_eos) and chat
prompts (docstring -> code requests through each server's chat template), greedy, at each
concurrency level. Reports decode tok/s (at concurrency 1 the mean of the responses'
`timings.predicted_per_second`; above it completion tokens per wall second), the acceptance rate
(accepted / drafted from `timings`), for cinfer the tokens per target forward (completion
tokens / engine steps from /stats), and the share of all CPUs other processes took during each
set (each set first waits up to --idle-wait seconds for an idle machine; on a shared machine
llama.cpp's thread pool slows down sharply when anything else runs).

Usage: spec_bench.py [--cinfer build/cinfer] [--llama-dir DIR | --llama-server BIN]
                     [--out DIR] [--device cpu|cuda] [--threads 2] [--gen 64]
                     [--concurrency 1,4,16] [--prompts N] [--draft-max 5] [--draft-min 1]
                     [--lookup-ngram 3] [--gguf-type q8_0] [--engines cinfer,llama]
                     [--report bench/spec.md] [--idle-wait 30] [--target DIR] [--draft DIR]
                     [--spec-policy auto|always|never]

Everything a run makes goes into --out (default bench/work/spec): the GGUFs (reused while newer
than the model folders), each server's log, results.json (every row), commands.txt and
table.md (the markdown section). --report FILE also writes that section into FILE between the
lines `<!-- spec_bench:begin -->` and `<!-- spec_bench:end -->` (appended when absent).
Without a llama-server binary the llama.cpp columns read n/a.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolated_run import HZ, NCPU, busy_seconds, wait_idle  # noqa: E402  (path set above)
CHAT = [
    "Write a Python function `is_palindrome(s)` that returns True when s reads the same "
    "backwards, ignoring case and spaces.",
    "Write a Python function `flatten(xs)` that flattens a list of lists into one list.",
    "Write a Python function `count_words(text)` that returns a dict mapping each word to its "
    "count.",
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one sorted "
    "list.",
]
BEGIN, END = "<!-- spec_bench:begin -->", "<!-- spec_bench:end -->"


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return json.loads(r.read())


class Server:
    """One server process on a loopback port, its log in the output folder."""

    def __init__(self, engine, cmd, port, log_path, commands):
        self.engine, self.port = engine, port
        commands.write(" ".join(cmd) + "\n")
        commands.flush()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1200):
            if self.proc.poll() is not None:
                break
            try:
                if get(port, "/health").get("status", "ok") == "ok":
                    return
            except Exception:
                pass
            time.sleep(0.1)
        self.stop()
        sys.exit(f"{engine} server did not start (log: {log_path}): {' '.join(cmd)}")

    def cpu_seconds(self):
        """CPU seconds the server process has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request(server, kind, prompt, gen):
    body = {"model": "x", "max_tokens": gen, "temperature": 0}
    if server.engine == "llama":
        body["cache_prompt"] = False  # cinfer runs with --prompt-cache 0
    if kind == "code":
        body.update(prompt=prompt, ignore_eos=True)
        r = post(server.port, "/v1/completions", body)
        text = r["choices"][0]["text"]
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        r = post(server.port, "/v1/chat/completions", body)
        text = r["choices"][0]["message"]["content"]
    t = r["timings"]
    return {"rate": t["predicted_per_second"], "tokens": r["usage"]["completion_tokens"],
            "drafted": t.get("draft_n", 0),
            "accepted": t.get("draft_accepted_n", t.get("draft_n_accepted", 0)), "text": text}


def own_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_set(server, kind, prompts, gen, concurrency, idle_wait):
    """One set of requests; also the share of all CPUs that other processes (neither this
    client nor the server) took meanwhile, after waiting up to idle_wait s for an idle machine."""
    wait_idle(idle_wait)
    before = get(server.port, "/stats") if server.engine == "cinfer" else None
    results = []
    cpu0 = busy_seconds() - server.cpu_seconds() - own_cpu()
    t0 = time.time()
    if concurrency == 1:
        for p in prompts:
            results.append(request(server, kind, p, gen))
    else:
        lock = threading.Lock()
        errors = []

        def worker(p):
            try:
                out = request(server, kind, p, gen)
            except Exception as e:  # reported below, after every thread joined
                errors.append(e)
                return
            with lock:
                results.append(out)

        batch = [prompts[i % len(prompts)] for i in range(concurrency)]
        threads = [threading.Thread(target=worker, args=(p,)) for p in batch]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    wall = time.time() - t0
    others = (busy_seconds() - server.cpu_seconds() - own_cpu() - cpu0) / (wall * NCPU)
    tokens = sum(r["tokens"] for r in results)
    row = {"drafted": sum(r["drafted"] for r in results),
           "accepted": sum(r["accepted"] for r in results), "tokens": tokens,
           "rate": (sum(r["rate"] for r in results) / len(results) if concurrency == 1
                    else tokens / wall),
           "texts": [r["text"] for r in results] if concurrency == 1 else [],
           "others_cpu": max(0.0, others)}
    if before is not None:
        row["steps"] = get(server.port, "/stats")["batch"]["steps"] - before["batch"]["steps"]
    return row


def convert(args, llama_dir, folder, out):
    """The folder as a GGUF of --gguf-type with its tokenizer, reused while newer."""
    src = os.path.join(folder, "config.json")
    if os.path.exists(out) and os.path.getmtime(out) > os.path.getmtime(src):
        return out
    env = dict(os.environ, LLAMA_CPP_DIR=llama_dir)
    cmd = [sys.executable, os.path.join(ROOT, "bench/gguf_from_hf.py"), folder, out + ".partial",
           "--type", args.gguf_type, "--tokenizer", folder]
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode:
        sys.exit(f"conversion failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    os.replace(out + ".partial", out)
    return out


def machine(args):
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    desc = f"{cpu}, {os.cpu_count()} CPUs, {args.threads} threads per server"
    if args.device != "cpu":
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            desc += f"; GPU: {gpu.splitlines()[0] if gpu else 'unknown'}"
        except (OSError, subprocess.TimeoutExpired):
            desc += "; GPU: unknown"
    return desc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cinfer", default=os.path.join(ROOT, "build/cinfer"))
    ap.add_argument("--llama-dir", default=os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp"),
                    help="llama.cpp source folder with build/bin/llama-server and gguf-py/")
    ap.add_argument("--llama-server", help="the llama-server binary (default: in --llama-dir)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/work/spec"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--port", type=int, default=28311)
    ap.add_argument("--device", default="cpu", help="cinfer's --device; llama.cpp gets -ngl 99 "
                                                    "(all layers on the GPU) unless cpu")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per kind (at most 4)")
    ap.add_argument("--draft-max", type=int, default=5)
    ap.add_argument("--draft-min", type=int, default=1)
    ap.add_argument("--lookup-ngram", type=int, default=3)
    ap.add_argument("--gguf-type", default="q8_0", choices=["f32", "bf16", "q8_0", "q4_0"],
                    help="llama.cpp's weights (q8_0: 8.5 bits per weight, as the starter's "
                         "MLX q8 with group 64)")
    ap.add_argument("--engines", default="cinfer,llama")
    ap.add_argument("--spec-policy", default="auto", choices=["auto", "always", "never"],
                    help="cinfer serve --spec-policy for the speculating servers (auto: a step "
                    "speculates when it pays; always: as llama.cpp does)")
    ap.add_argument("--target", default=os.path.join(ROOT, "models/starter"),
                    help="the target model folder (e.g. a bf16 copy by tools/dequantize.py for a "
                         "backend without MLX weights)")
    ap.add_argument("--draft", default=os.path.join(ROOT, "models/starter-draft"),
                    help="the draft model folder")
    ap.add_argument("--report", help="markdown file to write the section into")
    ap.add_argument("--idle-wait", type=float, default=30,
                    help="seconds to wait for an idle machine before each set (0: none)")
    args = ap.parse_args()

    engines = args.engines.split(",")
    if any(e not in ("cinfer", "llama") for e in engines):
        sys.exit("--engines: a comma-separated subset of cinfer,llama")
    if not 1 <= args.prompts <= 4:
        sys.exit("--prompts must be 1..4")
    levels = [int(c) for c in args.concurrency.split(",")]
    os.makedirs(args.out, exist_ok=True)
    llama_server = args.llama_server or os.path.join(args.llama_dir, "build/bin/llama-server")
    if "llama" in engines and not os.access(llama_server, os.X_OK):
        print(f"spec_bench: {llama_server} not found: llama.cpp columns will read n/a",
              file=sys.stderr)
        engines.remove("llama")
    target, draft = os.path.abspath(args.target), os.path.abspath(args.draft)
    with open(os.path.join(ROOT, "models/starter/eval_ids.json")) as f:
        code = [seq[:192] for seq in json.load(f)["sequences"]][:args.prompts]
    chat = CHAT[:args.prompts]
    spec = ["--draft-max", str(args.draft_max), "--draft-min", str(args.draft_min),
            "--spec-policy", args.spec_policy]
    lspec = ["--spec-draft-n-max", str(args.draft_max), "--spec-draft-n-min", str(args.draft_min)]
    configs = {"cinfer": [("none", []),
                          ("lookup", ["--lookup-ngram", str(args.lookup_ngram)] + spec),
                          ("draft", ["--draft-model", draft] + spec)]}
    if "llama" in engines:
        gguf_target = convert(args, args.llama_dir, target, os.path.join(
            args.out, f"{os.path.basename(target)}-{args.gguf_type}.gguf"))
        gguf_draft = convert(args, args.llama_dir, draft, os.path.join(
            args.out, f"{os.path.basename(draft)}-{args.gguf_type}.gguf"))
        configs["llama"] = [
            ("none", []),
            ("lookup", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                        str(args.lookup_ngram), "--spec-ngram-simple-size-m",
                        str(args.draft_max)]),
            ("draft", ["--model-draft", gguf_draft, "--spec-type", "draft-simple"] + lspec)]
    ctx_per_slot = 192 + args.gen + 256
    rows = []
    commands = open(os.path.join(args.out, "commands.txt"), "w")
    for engine in engines:
        for name, extra in configs[engine]:
            for conc in levels:
                log = os.path.join(args.out, f"{engine}-{name}-c{conc}.log")
                if engine == "cinfer":
                    cmd = [args.cinfer, "serve", "--model", target, "--port", str(args.port),
                           "--threads", str(args.threads), "--prompt-cache", "0", "--device",
                           args.device, "--batch", str(conc)] + extra
                else:
                    cmd = [llama_server, "-m", gguf_target, "--port", str(args.port), "-t",
                           str(args.threads), "-np", str(conc), "-c", str(conc * ctx_per_slot),
                           "--no-webui", "--cache-ram", "0", "-ngl",
                           "0" if args.device == "cpu" else "99"] + extra
                    if args.device != "cpu" and name == "draft":
                        cmd += ["-ngld", "99"]
                server = Server(engine, cmd, args.port, log, commands)
                try:
                    request(server, "code", code[0][:32], 8)  # warm-up
                    for kind, prompts in (("code", code), ("chat", chat)):
                        r = run_set(server, kind, prompts, args.gen, conc, args.idle_wait)
                        rows.append({"engine": engine, "drafter": name, "kind": kind,
                                     "concurrency": conc, **r})
                        print(engine, name, kind, conc,
                              {k: v for k, v in r.items() if k != "texts"}, flush=True)
                finally:
                    server.stop()
    commands.close()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": machine(args), "args": vars(args), "rows": rows}, f, indent=1)
    section = render(args, rows, levels)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(section)
    print(section)
    if args.report:
        insert(args.report, section)


NAMES = {"none": "none", "lookup": "prompt lookup", "draft": "draft model (starter-draft)"}


def render(args, rows, levels):
    def find(engine, name, kind, conc):
        return next((r for r in rows if (r["engine"], r["drafter"], r["kind"],
                                         r["concurrency"]) == (engine, name, kind, conc)), None)

    def cells(engine, name, kind, conc):
        r, base = find(engine, name, kind, conc), find(engine, "none", kind, conc)
        if r is None:
            return ["n/a", "n/a", "n/a"]
        acc = (f"{100 * r['accepted'] / r['drafted']:.0f}% of {r['drafted']}"
               if r["drafted"] else "-")
        up = f"{r['rate'] / base['rate']:.2f}x" if base else "n/a"
        return [f"{r['rate']:.1f}", up, acc]

    lines = [BEGIN, "", f"Measured {datetime.date.today().isoformat()} on {machine(args)}; "
             f"device {args.device}; {args.gen} tokens per request, {args.prompts} prompts "
             f"per kind; draft length {args.draft_min}..{args.draft_max}, lookup n-gram "
             f"{args.lookup_ngram}; llama.cpp weights {args.gguf_type.upper()} "
             f"(`bench/gguf_from_hf.py --tokenizer`). Commands: `{args.out}/commands.txt`.",
             "",
             "| drafter | prompts | concurrency | cinfer tok/s | speed-up | acceptance | "
             "tokens per target forward | llama.cpp tok/s | speed-up | acceptance | "
             "cinfer / llama.cpp | others' CPU (cinfer / llama.cpp) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in ("none", "lookup", "draft"):
        for kind in ("code", "chat"):
            for conc in levels:
                c, lc = find("cinfer", name, kind, conc), find("llama", name, kind, conc)
                per_fwd = (f"{c['tokens'] / c['steps']:.2f}"
                           if c and conc == 1 and c.get("steps") else "-")
                ratio = f"{c['rate'] / lc['rate']:.2f}" if c and lc else "n/a"
                others = " / ".join(f"{100 * r['others_cpu']:.0f}%" if r else "n/a"
                                    for r in (c, lc))
                lines.append("| " + " | ".join(
                    [NAMES[name], kind, str(conc)] + cells("cinfer", name, kind, conc)
                    + [per_fwd] + cells("llama", name, kind, conc) + [ratio, others]) + " |")
    same = [(c, lc) for c in rows for lc in rows
            if c["engine"] == "cinfer" and lc["engine"] == "llama" and c["texts"]
            and (c["drafter"], c["kind"], c["concurrency"]) ==
            (lc["drafter"], lc["kind"], lc["concurrency"])]
    if same:
        equal = sum(a == b for c, lc in same for a, b in zip(c["texts"], lc["texts"]))
        total = sum(min(len(c["texts"]), len(lc["texts"])) for c, lc in same)
        lines += ["", f"Greedy texts at concurrency 1 identical between the engines in {equal} "
                      f"of {total} requests (llama.cpp's {args.gguf_type.upper()} weights are "
                      "a requantization of cinfer's, so near-ties may resolve differently)."]
    lines += ["", END, ""]
    return "\n".join(lines)


def insert(path, section):
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
