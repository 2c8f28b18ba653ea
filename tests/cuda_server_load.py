#!/usr/bin/env python3
"""GPU server load test (part of `make test-cuda`): `cinfer serve --device cuda` on loopback,
CLIENTS concurrent streaming chat clients for SECONDS. Each greedy request's streamed text must
equal the same request's answer when it ran alone (nothing lost or mixed up in the batched GPU
steps; every sixth request asks for top log-probabilities, so its steps download whole logit rows
beside the others' greedy picks), every request must finish (some with prompts longer than the model's sliding window),
and at idle the KV pool must hold no blocks but the prefix
cache's. Python standard library only (the GPU machine has no npm).

Usage: cuda_server_load.py CINFER_BIN MODEL_DIR [CLIENTS=64] [SECONDS=90] [PORT=18431]
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

cinfer, model = sys.argv[1], sys.argv[2]
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 64
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 90
port = int(sys.argv[5]) if len(sys.argv) > 5 else 18431

TOPICS = ["add two numbers", "reverse a string", "sort a list", "read a file",
          "compute a factorial", "check a palindrome", "count words", "merge two dicts"]


# Every eighth request carries ~600 tokens of context: its prefill chunk passes the sliding window
# of the starter model (256), so committing it releases KV blocks (and slabs) that the step's own
# work still reads on the device.
CONTEXT = "Context:\n" + "\n".join(f"line {k}: total = total + {k} * step" for k in range(60))


def request_body(i, stream):
    ask_for = f"Write a Python function to {TOPICS[i % len(TOPICS)]}."
    content = f"{CONTEXT}\n{ask_for}" if i % 8 == 7 else ask_for
    body = {"model": "x", "temperature": 0, "max_tokens": 8 + (i % 5) * 8, "stream": stream,
            "messages": [{"role": "user", "content": content}]}
    if i % 6 == 5:  # its rows come back whole, beside other requests' greedy picks in one step
        body.update({"logprobs": True, "top_logprobs": 2})
    return body


def post(body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def ask(i):
    conn, resp = post(request_body(i, False))
    data = json.loads(resp.read())
    conn.close()
    return data["choices"][0]["message"]["content"]


def ask_streaming(i):
    conn, resp = post(request_body(i, True))
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    text, done = "", False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            break
        for choice in json.loads(payload).get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return text


def get_json(path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    data = json.loads(conn.getresponse().read())
    conn.close()
    return data


device = os.environ.get("CINFER_TEST_DEVICE", "cuda")  # cpu: a local check of the script itself
# CINFER_TEST_SERVE_ARGS: more `cinfer serve` flags (make test-cuda: "--tensor-parallel 2")
extra = os.environ.get("CINFER_TEST_SERVE_ARGS", "").split()
server = subprocess.Popen([cinfer, "serve", "--model", model, "--device", device, "--port",
                           str(port), "--batch", str(clients)] + extra,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
failures = []
try:
    for _ in range(600):
        try:
            if get_json("/health"):
                break
        except OSError:
            time.sleep(0.2)
    expected = {}
    for i in range(len(TOPICS) * 5):
        key = (i % len(TOPICS), i % 5)
        if key not in expected:
            expected[key] = ask(i)
    deadline = time.time() + seconds
    counts = {"done": 0, "bad": 0, "errors": 0}
    lock = threading.Lock()

    def worker(w):
        k = 0
        while time.time() < deadline:
            i = w * 7 + k
            k += 1
            try:
                text = ask_streaming(i)
                ok = text == expected[(i % len(TOPICS), i % 5)]
                with lock:
                    counts["done"] += 1
                    counts["bad"] += 0 if ok else 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    counts["errors"] += 1
                    failures.append(str(e))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    generated_before = get_json("/stats")["totals"]["generation_tokens"]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - start
    time.sleep(0.5)
    stats = get_json("/stats")
    kv, prefix, batch = stats["kv"], stats.get("prefix_cache", {}), stats["batch"]
    generated = stats["totals"]["generation_tokens"] - generated_before
    print(f"cuda server load: {clients} clients for {elapsed:.0f} s: {counts['done']} streamed "
          f"requests ({generated} tokens generated, {generated / elapsed:.0f} tok/s over all "
          f"clients), {counts['bad']} differing from their solo answer, {counts['errors']} "
          f"errors; idle: {kv['blocks_used']} KV blocks used, {prefix.get('blocks', 0)} held "
          f"by the prefix cache, running {batch['running']}, waiting {batch['waiting']}; "
          f"device {stats.get('server', {}).get('device')}")
    if counts["done"] < clients or counts["bad"] or counts["errors"]:
        failures.append("lost, failed or differing requests")
    if kv["blocks_used"] != prefix.get("blocks", 0) or batch["running"] or batch["waiting"]:
        failures.append("KV blocks or requests left at idle")
finally:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
for f in failures[:10]:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
