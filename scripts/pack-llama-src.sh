#!/usr/bin/env bash
# Packs a llama.cpp source tree (the benchmark peer; never part of this repository) into
# .llama/llama-src.tar.xz (git-ignored), small enough to carry to the GPU machine, where
# bench/cuda.sh builds it with CUDA. Leaves out the build folder and every ggml backend but the
# CPU and CUDA ones; keeps gguf-py (bench/gguf_from_hf.py writes GGUFs with it).
# Usage: scripts/pack-llama-src.sh [LLAMA_CPP_DIR (default /work/llama.cpp)]
set -euo pipefail
src=${1:-/work/llama.cpp}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.llama"
excludes=()
for backend in vulkan sycl metal opencl cann hexagon webgpu openvino zdnn zendnn et virtgpu; do
  excludes+=(--exclude="./ggml/src/ggml-$backend")
done
(cd "$src" && tar cJf "$root/.llama/llama-src.tar.xz" --exclude=./build "${excludes[@]}" \
  --exclude='./tools/server/public*' --exclude=./tools/ui ./CMakeLists.txt ./cmake ./ggml ./src \
  ./include ./common ./tools ./vendor ./licenses ./LICENSE ./gguf-py)
echo "pack-llama-src: $(du -h "$root/.llama/llama-src.tar.xz" | cut -f1) in .llama/llama-src.tar.xz"
