#!/usr/bin/env bash
# Packs a llama.cpp source tree (the benchmark peer; never part of this repository) into
# .llama/ (git-ignored), small enough to carry to the GPU machine.
#   scripts/pack-llama-src.sh [LLAMA_CPP_DIR]        .llama/llama-src.tar.xz (~1.7 MB): for
#     bench/cuda.sh, which builds it with CUDA. Leaves out the build folder, every ggml backend but
#     the CPU and CUDA ones, and every tool but llama-bench, llama-batched-bench and llama-quantize
#     (tools/CMakeLists.txt rewritten to add only them); keeps gguf-py (bench/gguf_from_hf.py
#     writes GGUFs with it).
#   scripts/pack-llama-src.sh --cpu [LLAMA_CPP_DIR]  .llama/llama-src-cpu.tar.xz (~1.5 MB): for
#     bench/threads.sh, which builds llama-bench for the CPU only: also without ggml-cuda, the
#     server and every tool but llama-bench (tools/CMakeLists.txt rewritten to add only it), so
#     that it fits beside the repository and .deps under the device machine's 64 MiB carry limit.
# LLAMA_CPP_DIR defaults to /work/llama.cpp.
set -euo pipefail
cpu=0
if [ "${1:-}" = --cpu ]; then
  cpu=1
  shift
fi
src=${1:-/work/llama.cpp}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.llama"
excludes=()
for backend in vulkan sycl metal opencl cann hexagon webgpu openvino zdnn zendnn et virtgpu; do
  excludes+=(--exclude="./ggml/src/ggml-$backend")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$cpu" = 0 ]; then
  (cd "$src" && tar cf - --exclude=./build "${excludes[@]}" --exclude=./vendor/miniaudio \
    ./CMakeLists.txt ./cmake ./ggml ./src ./include ./common ./tools/CMakeLists.txt \
    ./tools/llama-bench ./tools/batched-bench ./tools/quantize ./vendor ./licenses ./LICENSE \
    ./gguf-py) | (cd "$tmp" && tar xf -)
  tools=$tmp/tools/CMakeLists.txt
  sed -i '/^# tools/,$d' "$tools"
  printf '# tools (packed for the CUDA benchmark)\nadd_subdirectory(llama-bench)\n%s\n%s\n' \
    'add_subdirectory(batched-bench)' 'add_subdirectory(quantize)' >>"$tools"
  (cd "$tmp" && tar cJf "$root/.llama/llama-src.tar.xz" .)
  echo "pack-llama-src: $(du -h "$root/.llama/llama-src.tar.xz" | cut -f1) in .llama/llama-src.tar.xz"
  exit 0
fi
(cd "$src" && tar cf - --exclude=./build "${excludes[@]}" --exclude=./ggml/src/ggml-cuda \
  --exclude=./vendor/miniaudio ./CMakeLists.txt ./cmake ./ggml ./src ./include ./common \
  ./tools/CMakeLists.txt ./tools/llama-bench ./vendor ./licenses ./LICENSE ./gguf-py) |
  (cd "$tmp" && tar xf -)
tools=$tmp/tools/CMakeLists.txt
sed -i '/^# tools/,$d' "$tools"
printf '# tools (packed for the CPU benchmark: llama-bench only)\nadd_subdirectory(llama-bench)\n' \
  >>"$tools"
(cd "$tmp" && tar cJf "$root/.llama/llama-src-cpu.tar.xz" .)
echo "pack-llama-src: $(du -h "$root/.llama/llama-src-cpu.tar.xz" | cut -f1) in" \
  ".llama/llama-src-cpu.tar.xz"
