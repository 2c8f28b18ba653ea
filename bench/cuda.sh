#!/usr/bin/env bash
# The CUDA benchmark (`make bench-cuda`, on a machine with an NVIDIA GPU): cinfer's model step on
# the GPU beside llama.cpp built with CUDA from source in the same run, on random-weight bf16
# models of the Llama-3.2-1B and Llama-3.1-8B geometry (bench/configs). Writes bench/cuda.md.
#
# Measured per model, both engines on the same weights (llama.cpp reads a GGUF converted from
# cinfer's folder by bench/gguf_from_hf.py):
#   - batch-1 decode tok/s and its share of the roofline (weight bytes per token over the GPU
#     bandwidth measured in the same run by a device copy);
#   - prefill tok/s of 512 and 2048 tokens;
#   - aggregate decode tok/s of 1..256 sequences decoding together (cinfer: its batched model
#     step; llama.cpp: llama-batched-bench, same context);
#   - GPU memory in use.
# llama.cpp sources: LLAMA_CPP_SRC, a source folder or a .tar.xz of one (default
# .llama/llama-src.tar.xz, a pruned tree of the reference commit carried to the GPU machine);
# never part of this repository. Without it only cinfer is measured (and the report says so).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/cinfer-cuda-bench}
MODELS=${MODELS:-"llama-3.2-1b llama-3.1-8b"}
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
    cmake --build "$LLAMA_DIR/build-cuda" -j"$JOBS" --target llama-bench llama-batched-bench \
      >>"$RESULTS/llama-build.log" 2>&1
  fi
  LLAMA_BIN=$LLAMA_DIR/build-cuda/bin
fi

for model in $MODELS; do
  config=bench/configs/$model.json
  dir=$WORK/$model-bf16
  out=$RESULTS/$model
  mkdir -p "$out"
  # 2. The model: random bf16 weights, and its GGUF for llama.cpp.
  if [ ! -f "$dir/.stamp" ]; then
    rm -rf "$dir"
    log "init-random $model"
    build/cinfer init-random --config "$config" --out "$dir" --dtype bf16 --seed 1 >/dev/null
    touch "$dir/.stamp"
  fi
  if [ -n "$LLAMA_BIN" ] && [ ! -f "$WORK/$model-bf16.gguf" ]; then
    log "GGUF of $model"
    LLAMA_CPP_DIR=$LLAMA_DIR python3 bench/gguf_from_hf.py "$dir" "$WORK/$model.partial.gguf" \
      --type bf16 2>"$out/convert.err"
    mv "$WORK/$model.partial.gguf" "$WORK/$model-bf16.gguf"
  fi
  # 3. cinfer: prefill, batch-1 and batched decode in one process (the model loaded once), with
  # two input planes (exact) and one (fast).
  log "cinfer step_bench $model"
  build/step_bench "$dir" --device cuda --prompts 512,2048 --batches "$BATCHES" --gen "$GEN" \
    --context "$CONTEXT" --planes 2 >"$out/cinfer.json" 2>"$out/cinfer.err"
  build/step_bench "$dir" --device cuda --prompts 512,2048 --batches "$BATCHES" --gen "$GEN" \
    --context "$CONTEXT" --planes 1 >"$out/cinfer-fast.json" 2>"$out/cinfer-fast.err"
  # 4. llama.cpp: llama-bench (prefill, batch-1 decode) and llama-batched-bench (aggregate).
  if [ -n "$LLAMA_BIN" ]; then
    log "llama-bench $model"
    "$LLAMA_BIN/llama-bench" -m "$WORK/$model-bf16.gguf" -ngl 99 -fa 1 -p 512,2048 -n "$GEN" \
      -r 3 -o json >"$out/llama-bench.json" 2>"$out/llama-bench.err"
    log "llama-batched-bench $model"
    max_batch=${BATCHES##*,}
    "$LLAMA_BIN/llama-batched-bench" -m "$WORK/$model-bf16.gguf" -ngl 99 -fa on \
      -c $(((CONTEXT + GEN) * max_batch + 256)) -b 2048 -ub 512 -npp "$CONTEXT" -ntg "$GEN" \
      -npl "$BATCHES" --output-format jsonl >"$out/llama-batched.jsonl" 2>"$out/llama-batched.err"
  fi
done

python3 bench/cuda_report.py "$RESULTS" "$MODELS" >bench/cuda.md
log "wrote bench/cuda.md"
