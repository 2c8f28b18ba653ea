#!/usr/bin/env bash
# CPU benchmark (`make bench`): cinfer vs llama.cpp on one random-weight Llama-3.2-1B-geometry
# model in bf16, q8 and q4, plus the machine's read-bandwidth roofline; writes bench/cpu.md.
# Run from the repo root after build/cinfer and build/membw exist. Overridable through the
# environment: CINFER, MEMBW, LLAMA_CPP_DIR, BENCH_THREADS, BENCH_PROMPT, BENCH_GEN, BENCH_RUNS,
# BENCH_CONFIG, BENCH_WORK (model/result folder), BENCH_REPORT (the markdown written),
# BENCH_ATTEMPTS (retries of a measurement disturbed by other processes; see isolated_run.py).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CINFER=${CINFER:-build/cinfer}
MEMBW=${MEMBW:-build/membw}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp}
LLAMA_BENCH=$LLAMA_CPP_DIR/build/bin/llama-bench
THREADS=${BENCH_THREADS:-$(nproc)}
PROMPT=${BENCH_PROMPT:-512}
GEN=${BENCH_GEN:-64}
RUNS=${BENCH_RUNS:-3}
CONFIG=${BENCH_CONFIG:-bench/configs/llama-3.2-1b.json}
WORK=${BENCH_WORK:-bench/work}
REPORT=${BENCH_REPORT:-bench/cpu.md}
ATTEMPTS=${BENCH_ATTEMPTS:-3}
RESULTS=$WORK/results
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

export LLAMA_CPP_DIR
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.json "$RESULTS"/*.err "$RESULTS"/*.try* "$RESULTS/commands.txt"

log() { echo "bench: $*" >&2; }
record() { echo "$*" >>"$RESULTS/commands.txt"; }
# isolated OUT ERR CMD...: runs a measurement when the machine is idle, retrying when other
# processes took more than 5% of the CPUs meanwhile.
isolated() {
  local out=$1 err=$2
  shift 2
  "$PY" bench/isolated_run.py --out "$out" --err "$err" --attempts "$ATTEMPTS" -- "$@"
}

for bin in "$CINFER" "$MEMBW"; do
  [ -x "$bin" ] || { log "$bin not found: build first (cmake --build build)"; exit 1; }
done

# 1. Random-weight models (reused when the stamp is newer than the config and the binary).
for dtype in bf16 q8 q4; do
  dir=$WORK/llama1b-$dtype
  stamp=$dir/.bench-stamp
  if [ -f "$stamp" ] && [ "$stamp" -nt "$CONFIG" ]; then
    log "reusing $dir"
    continue
  fi
  rm -rf "$dir"
  group=()
  [ "$dtype" = bf16 ] || group=(--group-size 64)
  cmd=("$CINFER" init-random --config "$CONFIG" --out "$dir" --dtype "$dtype" --seed 1
       "${group[@]}")
  log "${cmd[*]}"
  record "${cmd[*]}"
  "${cmd[@]}"
  touch "$stamp"
done

# 2. GGUF copies of the bf16 folder for the llama.cpp peer (reused while newer than it).
have_llama=0
if [ -x "$LLAMA_BENCH" ]; then
  have_llama=1
  for gtype in bf16 q8_0 q4_0; do
    gguf=$WORK/llama1b-$gtype.gguf
    if [ ! -f "$gguf" ] || [ "$WORK/llama1b-bf16/.bench-stamp" -nt "$gguf" ]; then
      partial=$WORK/llama1b-$gtype.partial.gguf
      cmd=("$PY" bench/gguf_from_hf.py "$WORK/llama1b-bf16" "$partial" --type "$gtype")
      log "${cmd[*]}"
      record "${cmd[*]}"
      "${cmd[@]}" 2>"$RESULTS/convert-$gtype.err"
      mv "$partial" "$gguf"
    fi
  done
else
  log "llama.cpp not built ($LLAMA_BENCH missing): see bench/README.md"
fi

# 3. Measurements, each engine right after the other for one dtype, so that slow drifts of the
# machine (other tenants of the host) affect both sides alike.
for pair in bf16:bf16 q8:q8_0 q4:q4_0; do
  dtype=${pair%%:*}
  gtype=${pair##*:}
  cmd=("$CINFER" bench --model "$WORK/llama1b-$dtype" -p "$PROMPT" -n "$GEN" --runs "$RUNS"
       --threads "$THREADS" --json)
  log "${cmd[*]}"
  record "${cmd[*]}"
  if ! isolated "$RESULTS/cinfer-$dtype.json" "$RESULTS/cinfer-$dtype.err" "${cmd[@]}"; then
    log "cinfer bench failed for $dtype (see $RESULTS/cinfer-$dtype.err)"
    rm -f "$RESULTS/cinfer-$dtype.json"
  fi
  [ "$have_llama" = 1 ] || continue
  # Both weight load modes: "mmap" leaves the weights in 4 KiB page-cache pages, "none" reads
  # them into anonymous memory; which one is faster varies, and the report takes the better.
  cmd=("$LLAMA_BENCH" -m "$WORK/llama1b-$gtype.gguf" -p "$PROMPT" -n "$GEN" -r "$RUNS"
       -t "$THREADS" -lm "none,mmap" -o json)
  log "${cmd[*]}"
  record "${cmd[*]}"
  if ! isolated "$RESULTS/llama-$gtype.json" "$RESULTS/llama-$gtype.err" "${cmd[@]}"; then
    log "llama-bench failed for $gtype (see $RESULTS/llama-$gtype.err)"
    rm -f "$RESULTS/llama-$gtype.json"
  fi
done

# 4. Read-bandwidth roofline at 1 and THREADS threads.
cmd=("$MEMBW" --threads "$THREADS")
log "${cmd[*]}"
record "${cmd[*]}"
isolated "$RESULTS/membw.json" "$RESULTS/membw.err" "${cmd[@]}"

# 5. The report.
"$PY" bench/report.py --results "$RESULTS" --threads "$THREADS" --prompt "$PROMPT" \
  --gen "$GEN" --runs "$RUNS" --llama-bench "$LLAMA_BENCH" --config "$CONFIG" --out "$REPORT"
log "wrote $REPORT"
cat "$REPORT"
