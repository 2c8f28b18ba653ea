#!/usr/bin/env bash
# The CUDA benchmark (`make bench-cuda`, on a machine with an NVIDIA GPU): cinfer's model step on
# the GPU beside llama.cpp built with CUDA from source in the same run, on random-weight models of
# the Llama-3.2-1B and Llama-3.1-8B geometry (bench/configs) in bf16, q8 and q4. Writes
# bench/cuda.md.
#
# Measured per model and dtype, both engines on the same geometry (cinfer: `cinfer init-random`
# folders, q8/q4 MLX affine with groups of 64; llama.cpp: the bf16 folder converted by
# bench/gguf_from_hf.py, and for q8/q4 that GGUF quantized to Q8_0 / Q4_0 by llama-quantize, the
# same bits per weight):
#   - batch-1 decode tok/s and its share of the roofline (weight bytes per token over the GPU
#     bandwidth measured in the same run by a device copy);
#   - prefill tok/s of 512 and 2048 tokens;
#   - aggregate decode tok/s of 1..256 sequences decoding together (cinfer: its batched model
#     step; llama.cpp: llama-batched-bench, same context);
#   - GPU memory in use.
# And decode at depth (DEPTHS, default 4096 and 16384 tokens of context) of the 8B bf16 model with
# cinfer's KV codecs (KV_CODECS) beside llama.cpp's f16 / q8_0 / q4_0 KV (`llama-bench -d`).
# MODELS, DTYPES, DEPTHS, KV_CODECS, BATCHES pick a subset; each (model, dtype) keeps its results
# folder, and the report is written from every result present, so a run cut short can be resumed.
# llama.cpp sources: LLAMA_CPP_SRC, a source folder or a .tar.xz of one (default
# .llama/llama-src.tar.xz, a pruned tree of the reference commit carried to the GPU machine);
# never part of this repository. Without it only cinfer is measured (and the report says so).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/cinfer-cuda-bench}
MODELS=${MODELS:-"llama-3.2-1b llama-3.1-8b"}
DTYPES=${DTYPES:-"bf16 q8 q4"}
DEPTHS=${DEPTHS:-"4096,16384"}
KV_CODECS=${KV_CODECS:-"bf16,affine:8,affine:4,turbo:4,turbo:3"}
DEPTH_MODEL=${DEPTH_MODEL:-llama-3.1-8b}
BATCHES=${BATCHES:-"1,16,64,128,256"}
CONTEXT=${CONTEXT:-128}
GEN=${GEN:-32}
LLAMA_CPP_SRC=${LLAMA_CPP_SRC:-.llama/llama-src.tar.xz}
JOBS=${JOBS:-$(nproc)}
RESULTS=$WORK/results
mkdir -p "$WORK" "$RESULTS"
log() { echo "[bench-cuda] $*" >&2; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$RESULTS/gpu.txt"

# 1. llama.cpp with CUDA, built outside the repository.
LLAMA_DIR=""
LLAMA_BIN=""
if [ -e "$LLAMA_CPP_SRC" ]; then
  if [ -d "$LLAMA_CPP_SRC" ]; then
    LLAMA_DIR=$(cd "$LLAMA_CPP_SRC" && pwd)
  else
    LLAMA_DIR=$WORK/llama.cpp
    if [ ! -f "$LLAMA_DIR/CMakeLists.txt" ]; then
      mkdir -p "$LLAMA_DIR"
      tar xJf "$LLAMA_CPP_SRC" -C "$LLAMA_DIR"
    fi
  fi
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [ ! -x "$LLAMA_DIR/build-cuda/bin/llama-bench" ]; then
    log "building llama.cpp with CUDA in $LLAMA_DIR/build-cuda"
    cmake -S "$LLAMA_DIR" -B "$LLAMA_DIR/build-cuda" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_COMPILER="$nvcc" -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF >"$RESULTS/llama-build.log" 2>&1
  fi
  if [ ! -x "$LLAMA_DIR/build-cuda/bin/llama-quantize" ]; then
    cmake --build "$LLAMA_DIR/build-cuda" -j"$JOBS" --target llama-bench llama-batched-bench \
      llama-quantize >>"$RESULTS/llama-build.log" 2>&1
  fi
  LLAMA_BIN=$LLAMA_DIR/build-cuda/bin
fi

# The bf16 folder of a model and its GGUF (every dtype's GGUF is quantized from it).
bf16_folder() {
  local model=$1 dir=$WORK/$1-bf16
  if [ ! -f "$dir/.stamp" ]; then
    rm -rf "$dir"
    log "init-random $model bf16"
    build/cinfer init-random --config "bench/configs/$model.json" --out "$dir" --dtype bf16 \
      --seed 1 >/dev/null
    touch "$dir/.stamp"
  fi
  if [ -n "$LLAMA_BIN" ] && [ ! -f "$WORK/$model-bf16.gguf" ]; then
    log "GGUF of $model"
    LLAMA_CPP_DIR=$LLAMA_DIR python3 bench/gguf_from_hf.py "$dir" "$WORK/$model.partial.gguf" \
      --type bf16 2>"$RESULTS/$model-convert.err"
    mv "$WORK/$model.partial.gguf" "$WORK/$model-bf16.gguf"
  fi
}

for model in $MODELS; do
  config=bench/configs/$model.json
  for dtype in $DTYPES; do
    dir=$WORK/$model-$dtype
    out=$RESULTS/$model-$dtype
    mkdir -p "$out"
    # 2. The models: random weights of the geometry, and llama.cpp's GGUF of the same bits.
    bf16_folder "$model"
    if [ "$dtype" != bf16 ] && [ ! -f "$dir/.stamp" ]; then
      rm -rf "$dir"
      log "init-random $model $dtype"
      build/cinfer init-random --config "$config" --out "$dir" --dtype "$dtype" --group-size 64 \
        --seed 1 >/dev/null
      touch "$dir/.stamp"
    fi
    gguf=$WORK/$model-bf16.gguf
    if [ -n "$LLAMA_BIN" ] && [ "$dtype" != bf16 ]; then
      gguf=$WORK/$model-${dtype}_0.gguf
      if [ ! -f "$gguf" ]; then
        log "llama-quantize $model ${dtype}_0"
        case $dtype in q8) qtype=Q8_0 ;; *) qtype=Q4_0 ;; esac
        "$LLAMA_BIN/llama-quantize" "$WORK/$model-bf16.gguf" "$gguf.partial" $qtype "$JOBS" \
          >"$out/quantize.log" 2>&1
        mv "$gguf.partial" "$gguf"
      fi
    fi
    # 3. cinfer: prefill, batch-1 and batched decode in one process (the model loaded once), with
    # two input planes (exact) and one (fast).
    log "cinfer step_bench $model $dtype"
    build/step_bench "$dir" --device cuda --prompts 512,2048 --batches "$BATCHES" --gen "$GEN" \
      --context "$CONTEXT" --planes 2 >"$out/cinfer.json" 2>"$out/cinfer.err"
    build/step_bench "$dir" --device cuda --prompts 512,2048 --batches "$BATCHES" --gen "$GEN" \
      --context "$CONTEXT" --planes 1 >"$out/cinfer-fast.json" 2>"$out/cinfer-fast.err"
    # 4. llama.cpp: llama-bench (prefill, batch-1 decode) and llama-batched-bench (aggregate).
    if [ -n "$LLAMA_BIN" ]; then
      log "llama-bench $model $dtype"
      "$LLAMA_BIN/llama-bench" -m "$gguf" -ngl 99 -fa 1 -p 512,2048 -n "$GEN" \
        -r 3 -o json >"$out/llama-bench.json" 2>"$out/llama-bench.err"
      log "llama-batched-bench $model $dtype"
      max_batch=${BATCHES##*,}
      "$LLAMA_BIN/llama-batched-bench" -m "$gguf" -ngl 99 -fa on \
        -c $(((CONTEXT + GEN) * max_batch + 256)) -b 2048 -ub 512 -npp "$CONTEXT" -ntg "$GEN" \
        -npl "$BATCHES" --output-format jsonl >"$out/llama-batched.jsonl" 2>"$out/llama-batched.err"
    fi
  done
done

# 5. Decode at depth: the bf16 model with each KV codec beside llama.cpp's KV types.
if [ -n "$DEPTHS" ]; then
  out=$RESULTS/depth
  mkdir -p "$out"
  bf16_folder "$DEPTH_MODEL"
  log "cinfer step_bench $DEPTH_MODEL at depths $DEPTHS"
  build/step_bench "$WORK/$DEPTH_MODEL-bf16" --device cuda --prompts 0 --batches 1 --gen 32 \
    --context "$DEPTHS" --kv "$KV_CODECS" --planes 1 >"$out/cinfer.json" 2>"$out/cinfer.err"
  if [ -n "$LLAMA_BIN" ]; then
    log "llama-bench $DEPTH_MODEL at depths $DEPTHS"
    for kv in f16 q8_0 q4_0; do # K and V of one type (llama-bench would cross the two lists)
      "$LLAMA_BIN/llama-bench" -m "$WORK/$DEPTH_MODEL-bf16.gguf" -ngl 99 -fa 1 -p 0 -n 32 \
        -d "$DEPTHS" -ctk $kv -ctv $kv -r 3 -o json >"$out/llama-bench-$kv.json" \
        2>"$out/llama-bench-$kv.err"
    done
  fi
fi

python3 bench/cuda_report.py "$RESULTS" bench/cuda.md >bench/cuda.md.partial
mv bench/cuda.md.partial bench/cuda.md
log "wrote bench/cuda.md"
