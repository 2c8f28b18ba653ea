#!/usr/bin/env bash
# LoRA adapter benchmark (`make bench`, after bench/server.sh, whose model it reuses): decode
# throughput of cinfer serve with a batch of 16 streams on the random-weight Llama-3.2-1B-geometry
# q4 model when the batch runs 0, 1 and 4 distinct adapters (rank 16 on every attention and MLP
# projection, bench/make_adapter.py; requests take the adapters in turn). Each case starts a fresh
# server with the four adapters mounted and drives it with bench/server_load.mjs (throughput mode,
# concurrency 16, the same prompts); writes bench/adapters.md.
# Environment overrides: CINFER, BENCH_WORK, BENCH_THREADS, ADAPTER_RANK (16), ADAPTER_REQUESTS
# (32), ADAPTER_PROMPT (128), ADAPTER_GEN (64), ADAPTER_REPORT, NODE.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CINFER=${CINFER:-build/cinfer}
WORK=${BENCH_WORK:-bench/work}
THREADS=${BENCH_THREADS:-$(nproc)}
RANK=${ADAPTER_RANK:-16}
REQUESTS=${ADAPTER_REQUESTS:-32}
PROMPT=${ADAPTER_PROMPT:-128}
GEN=${ADAPTER_GEN:-64}
REPORT=${ADAPTER_REPORT:-bench/adapters.md}
NODE=${NODE:-node}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
MODEL=$WORK/llama1b-q4-tok # made by bench/server.sh
OUT=$WORK/adapters
log() { echo "adapter-bench: $*" >&2; }

[ -x "$CINFER" ] || { log "$CINFER not found: build first (make)"; exit 1; }
[ -f "$MODEL/config.json" ] || { log "$MODEL missing: run bench/server.sh first"; exit 1; }
mkdir -p "$OUT"
for i in 1 2 3 4; do
  if [ ! -f "$OUT/a$i/adapter_model.safetensors" ] || [ "$MODEL/config.json" -nt "$OUT/a$i/adapter_model.safetensors" ]; then
    "$PY" bench/make_adapter.py "$MODEL" "$OUT/a$i" --rank "$RANK" --seed "$i"
  fi
done
BOS=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); b=c.get("bos_token_id"); print(b[0] if isinstance(b,list) else (b if b is not None else -1))' "$MODEL/config.json")

SERVER_PID=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

: >"$OUT/commands.txt"
for case in 0 1 4; do
  PORT=$("$NODE" -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
  cmd=("$CINFER" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" --batch 16 --threads "$THREADS"
       --quiet --adapter a1="$OUT/a1" --adapter a2="$OUT/a2" --adapter a3="$OUT/a3" --adapter a4="$OUT/a4")
  echo "${cmd[*]}" >>"$OUT/commands.txt"
  "${cmd[@]}" >"$OUT/server-$case.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { log "server exited (see $OUT/server-$case.log)"; exit 1; }
    sleep 0.5
  done
  adapters=
  [ "$case" = 1 ] && adapters=a1
  [ "$case" = 4 ] && adapters=a1,a2,a3,a4
  load=("$NODE" bench/server_load.mjs --url "http://127.0.0.1:$PORT" --out "$OUT/case-$case.json"
        --tokenizer "$MODEL/tokenizer.json" --bos-id "$BOS" --server-pid "$SERVER_PID" --ignore-eos
        --concurrency 16 --requests "$REQUESTS" --prompt-tokens "$PROMPT" --max-tokens "$GEN"
        --label "adapters-$case")
  [ -z "$adapters" ] || load+=(--adapters "$adapters")
  echo "${load[*]}" >>"$OUT/commands.txt"
  "${load[@]}"
  stop_server
done

"$PY" - "$OUT" "$REPORT" "$RANK" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PYEOF'
import json, sys
out, report, rank, commit = sys.argv[1:5]
rows = []
for case in ("0", "1", "4"):
    s = json.load(open("%s/case-%s.json" % (out, case)))["summary"]
    tpot = s.get("tpot_ms", {}).get("p50")
    rows.append("| %s | %.1f | %s | %s | %d | %d |" % (
        case, s["output_tok_s"], "%.1f" % tpot if tpot else "-",
        "%.0f" % s["ttft_ms"]["p50"] if s["ttft_ms"].get("p50") else "-",
        s["output_tokens"], s["errors"]))
base = json.load(open("%s/case-0.json" % out))["summary"]["output_tok_s"]
with open(report, "w") as f:
    f.write("# LoRA adapters in one batch (bench/adapters.sh)\n\n")
    f.write("cinfer serve --batch 16, random-weight Llama-3.2-1B geometry, q4 weights; adapters of "
            "rank %s on every attention and MLP projection; 16 streams in flight, requests take "
            "the adapters in turn. Commit %s. Commands: %s/commands.txt.\n\n" % (rank, commit, out))
    f.write("| distinct adapters | output tok/s | TPOT p50 ms | TTFT p50 ms | tokens | errors |\n")
    f.write("|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n\n")
    for case in ("1", "4"):
        t = json.load(open("%s/case-%s.json" % (out, case)))["summary"]["output_tok_s"]
        f.write("- %s adapter(s): %.0f%% of the throughput without adapters\n" % (case, 100 * t / base))
print("wrote", report)
PYEOF
