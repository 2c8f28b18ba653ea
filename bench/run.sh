#!/usr/bin/env bash
# CPU benchmark (`make bench`): cinfer vs llama.cpp on random-weight models of real geometries
# (Llama-3.2-1B in bf16, q8 and q4; Gemma-3-1B in bf16 and q4; cinfer in fast and in exact
# precision), plus the machine's read-bandwidth roofline; writes bench/cpu.md (keeping the notes
# below its KEPT marker, see report.py).
# Run from the repo root after build/cinfer and build/membw exist. Overridable through the
# environment: CINFER, MEMBW, LLAMA_CPP_DIR, BENCH_THREADS, BENCH_PROMPT, BENCH_GEN, BENCH_RUNS
# (timed runs per invocation), BENCH_ROUNDS (rounds of invocations, see step 3), BENCH_MODELS (a
# subset of "llama1b gemma3-1b", space-separated), BENCH_CONFIG (the llama1b config),
# BENCH_GEMMA_CONFIG (the gemma3-1b config), BENCH_WORK (model/result folder), BENCH_REPORT (the
# markdown written), BENCH_ATTEMPTS (retries of a measurement disturbed by
# other processes; see isolated_run.py), CINFER_COMMIT (the commit the report names, for a
# binary built from another checkout; default: this checkout's HEAD).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CINFER=${CINFER:-build/cinfer}
MEMBW=${MEMBW:-build/membw}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp}
LLAMA_BENCH=$LLAMA_CPP_DIR/build/bin/llama-bench
THREADS=${BENCH_THREADS:-$(nproc)}
PROMPT=${BENCH_PROMPT:-512}
GEN=${BENCH_GEN:-64}
RUNS=${BENCH_RUNS:-1}
ROUNDS=${BENCH_ROUNDS:-3}
WORK=${BENCH_WORK:-bench/work}
REPORT=${BENCH_REPORT:-bench/cpu.md}
ATTEMPTS=${BENCH_ATTEMPTS:-3}
RESULTS=$WORK/results
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# The models, in run order: config and "cinfer dtype:GGUF type" pairs. Files are named after
# the model: $WORK/NAME-DTYPE (cinfer), $WORK/NAME-GTYPE.gguf, $RESULTS/NAME/*.json.
ALL_MODELS="llama1b gemma3-1b"
declare -A CONFIG_OF=(
  [llama1b]=${BENCH_CONFIG:-bench/configs/llama-3.2-1b.json}
  [gemma3-1b]=${BENCH_GEMMA_CONFIG:-bench/configs/gemma-3-1b.json}
)
declare -A PAIRS_OF=(
  [llama1b]="bf16:bf16 q8:q8_0 q4:q4_0"
  [gemma3-1b]="bf16:bf16 q4:q4_0"
)
MODELS=${BENCH_MODELS:-$ALL_MODELS}

export LLAMA_CPP_DIR

log() { echo "bench: $*" >&2; }
record() { echo "$*" >>"$RESULTS/commands.txt"; }
# isolated OUT ERR CMD...: runs a measurement when the machine is idle, retrying when other
# processes took more than 5% of the CPUs meanwhile.
isolated() {
  local out=$1 err=$2
  shift 2
  "$PY" bench/isolated_run.py --out "$out" --err "$err" --attempts "$ATTEMPTS" -- "$@"
}

[ -n "${MODELS// /}" ] || { log "BENCH_MODELS is empty (have: $ALL_MODELS)"; exit 2; }
for model in $MODELS; do
  if [ -z "${CONFIG_OF[$model]:-}" ]; then
    log "unknown model '$model' in BENCH_MODELS (have: $ALL_MODELS)"
    exit 2
  fi
done
for bin in "$CINFER" "$MEMBW"; do
  [ -x "$bin" ] || { log "$bin not found: build first (cmake --build build)"; exit 1; }
done

mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.json "$RESULTS"/*.err "$RESULTS"/*.try* "$RESULTS/commands.txt"
for model in $ALL_MODELS; do
  rm -f "$RESULTS/$model"/*.json "$RESULTS/$model"/*.err "$RESULTS/$model"/*.try*
done

have_llama=0
if [ -x "$LLAMA_BENCH" ]; then
  have_llama=1
else
  log "llama.cpp not built ($LLAMA_BENCH missing): see bench/README.md"
fi

for model in $MODELS; do
  config=${CONFIG_OF[$model]}
  pairs=${PAIRS_OF[$model]}
  mkdir -p "$RESULTS/$model"

  # 1. Random-weight models (reused while the stamp is newer than the config).
  for pair in $pairs; do
    dtype=${pair%%:*}
    dir=$WORK/$model-$dtype
    stamp=$dir/.bench-stamp
    if [ -f "$stamp" ] && [ "$stamp" -nt "$config" ]; then
      log "reusing $dir"
      continue
    fi
    rm -rf "$dir"
    group=()
    [ "$dtype" = bf16 ] || group=(--group-size 64)
    cmd=("$CINFER" init-random --config "$config" --out "$dir" --dtype "$dtype" --seed 1
         "${group[@]}")
    log "${cmd[*]}"
    record "${cmd[*]}"
    "${cmd[@]}"
    touch "$stamp"
  done

  # 2. GGUF copies of the bf16 folder for the llama.cpp peer (reused while newer than it).
  if [ "$have_llama" = 1 ]; then
    for pair in $pairs; do
      gtype=${pair##*:}
      gguf=$WORK/$model-$gtype.gguf
      if [ ! -f "$gguf" ] || [ "$WORK/$model-bf16/.bench-stamp" -nt "$gguf" ]; then
        partial=$WORK/$model-$gtype.partial.gguf
        cmd=("$PY" bench/gguf_from_hf.py "$WORK/$model-bf16" "$partial" --type "$gtype")
        log "${cmd[*]}"
        record "${cmd[*]}"
        "${cmd[@]}" 2>"$RESULTS/$model/convert-$gtype.err"
        mv "$partial" "$gguf"
      fi
    done
  fi

  # 3. Measurements in ROUNDS rounds; in each, every dtype's engines run one right after the
  # other (cinfer fast, cinfer exact, llama.cpp). A shared host's memory bandwidth drifts by
  # 20-30% over minutes: interleaving puts both engines under the same drift, and the report
  # takes the median over rounds of each engine and of the per-round ratios.
  for round in $(seq "$ROUNDS"); do
    for pair in $pairs; do
      dtype=${pair%%:*}
      gtype=${pair##*:}
      out=$RESULTS/$model
      # cinfer in its default (fast) precision, then in exact precision (f32 activations)
      for precision in fast exact; do
        stem=cinfer-$dtype
        [ "$precision" = fast ] || stem=cinfer-exact-$dtype
        cmd=("$CINFER" bench --device cpu --model "$WORK/$model-$dtype" -p "$PROMPT" -n "$GEN"
             --runs "$RUNS" --threads "$THREADS" --precision "$precision" --json)
        log "round $round: ${cmd[*]}"
        [ "$round" != 1 ] || record "${cmd[*]}"
        if ! isolated "$out/$stem.r$round.json" "$out/$stem.r$round.err" "${cmd[@]}"; then
          log "cinfer bench failed for $model $dtype $precision (see $out/$stem.r$round.err)"
          rm -f "$out/$stem.r$round.json"
        fi
      done
      [ "$have_llama" = 1 ] || continue
      # Both weight load modes: "mmap" leaves the weights in 4 KiB page-cache pages, "none"
      # reads them into anonymous memory; which one is faster varies, and the report takes the
      # better.
      cmd=("$LLAMA_BENCH" -m "$WORK/$model-$gtype.gguf" -p "$PROMPT" -n "$GEN" -r "$RUNS"
           -t "$THREADS" -lm "none,mmap" -o json)
      log "round $round: ${cmd[*]}"
      [ "$round" != 1 ] || record "${cmd[*]}"
      if ! isolated "$out/llama-$gtype.r$round.json" "$out/llama-$gtype.r$round.err" "${cmd[@]}"
      then
        log "llama-bench failed for $model $gtype (see $out/llama-$gtype.r$round.err)"
        rm -f "$out/llama-$gtype.r$round.json"
      fi
    done
  done
done

# 4. Read-bandwidth roofline at 1 and THREADS threads.
cmd=("$MEMBW" --threads "$THREADS")
log "${cmd[*]}"
record "${cmd[*]}"
isolated "$RESULTS/membw.json" "$RESULTS/membw.err" "${cmd[@]}"

# 5. The report: one section per model.
report_models=()
for model in $MODELS; do
  pairs=${PAIRS_OF[$model]}
  report_models+=(--model "$model" "${CONFIG_OF[$model]}" "${pairs// /,}")
done
"$PY" bench/report.py --results "$RESULTS" --threads "$THREADS" --prompt "$PROMPT" \
  --gen "$GEN" --runs "$RUNS" --rounds "$ROUNDS" --llama-bench "$LLAMA_BENCH" \
  "${report_models[@]}" --out "$REPORT"
log "wrote $REPORT"
cat "$REPORT"
