#!/usr/bin/env bash
# KV-cache benchmark (`make bench`, after bench/run.sh): for every KV codec, bytes per token
# relative to bf16, KL divergence and top-1 agreement of next-token distributions against bf16
# KV (cinfer kv-quality) on the fixtures and a random Llama-3.2-1B-geometry model, and decode
# tok/s at 512, 4k and 16k tokens of context against bf16 KV (cinfer bench --depth), with
# llama.cpp's f16/q8_0/q4_0 KV on the same model (GGUF) in the same run. Writes bench/kv.md.
# Environment overrides: CINFER, LLAMA_CPP_DIR, BENCH_THREADS, KV_MODEL (folder), KV_GGUF,
# KV_DEPTHS, KV_LLAMA_DEPTHS, KV_GEN, KV_RUNS, KV_TOKENS, KV_WORK, KV_REPORT, KV_EXTRA_MODELS (space-separated
# folders scored for quality too, e.g. the trained starter model).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CINFER=${CINFER:-build/cinfer}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp}
LLAMA_BENCH=$LLAMA_CPP_DIR/build/bin/llama-bench
THREADS=${BENCH_THREADS:-$(nproc)}
MODEL=${KV_MODEL:-bench/work/llama1b-q4}
GGUF=${KV_GGUF:-bench/work/llama1b-q4_0.gguf}
DEPTHS=${KV_DEPTHS:-512 4096 16384}
# llama.cpp's depth is a real prefill: 16k tokens take over 10 minutes per KV type on 2 cores.
LLAMA_DEPTHS=${KV_LLAMA_DEPTHS:-512 4096}
GEN=${KV_GEN:-16}
RUNS=${KV_RUNS:-3}
TOKENS=${KV_TOKENS:-1024}
WORK=${KV_WORK:-bench/work/kv}
REPORT=${KV_REPORT:-bench/kv.md}
EXTRA_MODELS=${KV_EXTRA_MODELS:-}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

log() { echo "kv-bench: $*" >&2; }
mkdir -p "$WORK"
rm -f "$WORK"/*.json "$WORK"/*.jsonl "$WORK/commands.txt"
record() { echo "$*" >>"$WORK/commands.txt"; }

[ -x "$CINFER" ] || { log "$CINFER not found: build first"; exit 1; }
if [ ! -d "$MODEL" ]; then
  log "$MODEL missing: run bench/run.sh first (it creates the random models)"
  exit 1
fi

# Codecs: name|flags
CODECS=(
  "affine:8:64|--kv-codec affine --kv-bits 8 --kv-group-size 64"
  "affine:4:64|--kv-codec affine --kv-bits 4 --kv-group-size 64"
  "affine:4:32|--kv-codec affine --kv-bits 4 --kv-group-size 32"
  "turbo:4,4|--kv-codec turbo --kv-bits 4"
  "turbo:4,3|--kv-codec turbo --kv-bits 4 --kv-value-bits 3"
  "turbo:3,3|--kv-codec turbo --kv-bits 3"
  "turbo:2,2|--kv-codec turbo --kv-bits 2"
  "turbo-v:8,3|--kv-codec turbo-v --kv-bits 8 --kv-value-bits 3"
  "turbo-v:4,4|--kv-codec turbo-v --kv-bits 4 --kv-value-bits 4"
)

# 1. Quality: every codec on every model it fits (a codec whose groups or rotation do not fit a
# model's head_dim is skipped; the report lists it as n/a).
QUALITY_MODELS=(models/starter "$MODEL" tests/fixtures/qwen3 tests/fixtures/llama3-tied
                tests/fixtures/gemma3 tests/fixtures/gemma4 $EXTRA_MODELS)
# The trained starter model is scored on its held-out text (the 4 sequences of eval_ids.json,
# concatenated), the random-weight models on seeded random tokens.
STARTER_IDS=$WORK/starter_ids.txt
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(",".join(str(i) for s in d["sequences"] for i in s))' \
  models/starter/eval_ids.json >"$STARTER_IDS"
declare -A seen=()
for model in "${QUALITY_MODELS[@]}"; do
  [ -d "$model" ] || continue
  [ -z "${seen[$model]:-}" ] || continue
  seen[$model]=1
  source_flags=(--tokens "$TOKENS")
  case "$model" in
    tests/fixtures/*) source_flags=(--tokens 512) ;;
    models/starter) source_flags=(--ids-file "$STARTER_IDS") ;;
  esac
  for entry in "${CODECS[@]}"; do
    name=${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    cmd=("$CINFER" kv-quality --device cpu --model "$model" "${source_flags[@]}" --chunk 128 --threads "$THREADS"
         "${flags[@]}")
    record "${cmd[*]}"
    log "${cmd[*]}"
    if out=$("${cmd[@]}" 2>"$WORK/err.txt"); then
      echo "{\"model\": \"$model\", \"result\": $out}" >>"$WORK/quality.jsonl"
    else
      echo "{\"model\": \"$model\", \"codec\": \"$name\", \"error\": $("$PY" -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().strip()))' "$WORK/err.txt")}" >>"$WORK/quality.jsonl"
    fi
  done
done

# 1b. Held-out perplexity of the starter model per codec (bf16 first).
for entry in "bf16|--kv-codec bf16" "${CODECS[@]}"; do
  name=${entry%%|*}
  read -r -a flags <<<"${entry#*|}"
  cmd=("$CINFER" perplexity --device cpu --model models/starter --ids-file models/starter/eval_ids.json
       --chunk 128 --threads "$THREADS" --json "${flags[@]}")
  record "${cmd[*]}"
  log "${cmd[*]}"
  if out=$("${cmd[@]}"); then echo "{\"codec\": \"$name\", \"result\": $out}" >>"$WORK/perplexity.jsonl"; fi
done

# 2. Decode speed at depth, cinfer: bf16 and every codec.
for depth in $DEPTHS; do
  for entry in "bf16|--kv-codec bf16" "${CODECS[@]}"; do
    read -r -a flags <<<"${entry#*|}"
    cmd=("$CINFER" bench --device cpu --model "$MODEL" -p 1 -n "$GEN" --runs "$RUNS" --warmup 1
         --depth "$depth" --threads "$THREADS" --json "${flags[@]}")
    record "${cmd[*]}"
    log "${cmd[*]}"
    if out=$("${cmd[@]}"); then echo "$out" >>"$WORK/speed.jsonl"; fi
  done
done

# 3. llama.cpp on the same model: f16, q8_0 and q4_0 KV (flash attention, which quantized V
# needs), one llama-bench call per depth and type.
if [ -x "$LLAMA_BENCH" ] && [ -f "$GGUF" ]; then
  for depth in $LLAMA_DEPTHS; do
    runs=$RUNS
    for kv in f16 q8_0 q4_0; do
      cmd=("$LLAMA_BENCH" -m "$GGUF" -p 0 -n "$GEN" -d "$depth" -r "$runs" -t "$THREADS"
           -fa 1 -ctk "$kv" -ctv "$kv" -o json)
      record "${cmd[*]}"
      log "${cmd[*]}"
      "${cmd[@]}" >"$WORK/llama-$kv-$depth.json" 2>"$WORK/llama-$kv-$depth.err" ||
        log "llama-bench failed for $kv at $depth"
    done
  done
else
  log "llama.cpp or $GGUF missing: no llama.cpp columns"
fi

"$PY" bench/kv_report.py --work "$WORK" --model "$MODEL" --threads "$THREADS" --gen "$GEN" \
  --runs "$RUNS" --tokens "$TOKENS" --out "$REPORT"
log "wrote $REPORT"
cat "$REPORT"
