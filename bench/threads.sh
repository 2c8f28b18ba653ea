#!/usr/bin/env bash
# Thread scaling (`make bench-threads`): cinfer beside llama.cpp on the CPU at 1, 2, 4, 8 and 16
# threads, prefill of a 512-token prompt and decode, on random-weight models of the
# Llama-3.2-1B geometry in bf16 and q4 (llama.cpp: bf16 and Q4_0 GGUFs converted from the same
# weights). Needs no GPU and no network: llama.cpp is built for the CPU from LLAMA_CPP_SRC (a
# source folder or a .tar.xz of one; see LLAMA_CPP_SRC below) in WORK, outside the
# repository, with AMX off (llama.cpp 82bb485's AMX Q4_0 path dies with SIGILL on the Xeons
# this runs on). Writes bench/threads.md (BENCH_REPORT).
#
# Environment: WORK (default /tmp/cinfer-threads), THREADS ("1 2 4 8 16"), CONFIG (model
# config, default bench/configs/llama-3.2-1b.json), DTYPES ("bf16:bf16 q4:q4_0", cinfer
# dtype:GGUF type), PROMPT (512), GEN (32), RUNS (2), PRECISION (fast), LLAMA_CPP_SRC (default
# .llama/llama-src-cpu.tar.xz when `scripts/pack-llama-src.sh --cpu` made it, else
# .llama/llama-src.tar.xz), LLAMA_CMAKE_FLAGS (replaces the ISA flags chosen from /proc/cpuinfo), LLAMA_BENCH (a built
# llama-bench to use instead of building one), JOBS (build jobs),
# BENCH_REPORT (bench/threads.md), PY (a python3 with numpy, for the GGUF conversion).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/cinfer-threads}
THREADS=${THREADS:-"1 2 4 8 16"}
CONFIG=${CONFIG:-bench/configs/llama-3.2-1b.json}
DTYPES=${DTYPES:-"bf16:bf16 q4:q4_0"}
PROMPT=${PROMPT:-512}
GEN=${GEN:-32}
RUNS=${RUNS:-2}
PRECISION=${PRECISION:-fast}
if [ -z "${LLAMA_CPP_SRC:-}" ]; then
  LLAMA_CPP_SRC=.llama/llama-src.tar.xz
  [ ! -e .llama/llama-src-cpu.tar.xz ] || LLAMA_CPP_SRC=.llama/llama-src-cpu.tar.xz
fi
JOBS=${JOBS:-$(nproc)}
REPORT=${BENCH_REPORT:-bench/threads.md}
RESULTS=$WORK/results
mkdir -p "$WORK" "$RESULTS"
log() { echo "[bench-threads] $(date -u +%H:%M:%S) $*" >&2; }
if [ -z "${PY:-}" ]; then
  PY=python3
  for candidate in /usr/bin/python3 /opt/torch/.venv/bin/python3; do
    if [ -x "$candidate" ] && "$candidate" -c 'import numpy' 2>/dev/null; then
      PY=$candidate
      break
    fi
  done
fi
start=$(date +%s)

# 1. cinfer (make build brings its own dependencies where the -dev packages are missing).
if [ ! -x build/cinfer ]; then
  log "building cinfer"
  make build JOBS="$JOBS" >"$RESULTS/cinfer-build.log" 2>&1
fi

# 2. llama.cpp for the CPU, outside the repository (LLAMA_BENCH: a llama-bench already built
# from LLAMA_CPP_SRC, which then only lends its gguf-py).
LLAMA_DIR=""
LLAMA_BENCH=${LLAMA_BENCH:-}
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
  if [ -z "${LLAMA_CMAKE_FLAGS:-}" ]; then
    if grep -qw avx512_bf16 /proc/cpuinfo && grep -qw avx512_vnni /proc/cpuinfo &&
      grep -qw avx512vbmi /proc/cpuinfo; then
      LLAMA_CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
    else
      LLAMA_CMAKE_FLAGS="-DGGML_NATIVE=ON"
    fi
  fi
  [ -n "$LLAMA_BENCH" ] || LLAMA_BENCH=$LLAMA_DIR/build-cpu/bin/llama-bench
  if [ ! -x "$LLAMA_BENCH" ]; then
    # built in the background while step 3 writes the models (it needs only gguf-py)
    log "building llama.cpp (CPU, AMX off) in $LLAMA_DIR/build-cpu"
    # shellcheck disable=SC2086  # the flags are words
    (cmake -S "$LLAMA_DIR" -B "$LLAMA_DIR/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
      $LLAMA_CMAKE_FLAGS -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      >"$RESULTS/llama-build.log" 2>&1 &&
      cmake --build "$LLAMA_DIR/build-cpu" -j"$JOBS" --target llama-bench \
        >>"$RESULTS/llama-build.log" 2>&1) &
    llama_build=$!
  fi
else
  LLAMA_BENCH=""
  log "no llama.cpp sources at $LLAMA_CPP_SRC: measuring cinfer only"
fi

# 3. The models: random weights in each cinfer dtype, GGUFs converted from the bf16 folder.
name=$(basename "$CONFIG" .json)
for pair in $DTYPES; do
  dtype=${pair%%:*}
  dir=$WORK/$name-$dtype
  if [ ! -f "$dir/.stamp" ] || [ "$CONFIG" -nt "$dir/.stamp" ]; then
    rm -rf "$dir"
    group=()
    [ "$dtype" = bf16 ] || group=(--group-size 64)
    log "init-random $name $dtype"
    build/cinfer init-random --config "$CONFIG" --out "$dir" --dtype "$dtype" --seed 1 \
      "${group[@]}" >/dev/null
    touch "$dir/.stamp"
  fi
done
if [ -n "$LLAMA_BENCH" ]; then
  if [ ! -f "$WORK/$name-bf16/.stamp" ]; then
    rm -rf "$WORK/$name-bf16"
    log "init-random $name bf16 (the GGUF source)"
    build/cinfer init-random --config "$CONFIG" --out "$WORK/$name-bf16" --dtype bf16 --seed 1 \
      >/dev/null
    touch "$WORK/$name-bf16/.stamp"
  fi
  for pair in $DTYPES; do
    gtype=${pair##*:}
    gguf=$WORK/$name-$gtype.gguf
    if [ ! -f "$gguf" ] || [ "$WORK/$name-bf16/.stamp" -nt "$gguf" ]; then
      log "GGUF $gtype"
      LLAMA_CPP_DIR=$LLAMA_DIR "$PY" bench/gguf_from_hf.py "$WORK/$name-bf16" "$gguf.partial" \
        --type "$gtype" 2>"$RESULTS/convert-$gtype.err"
      mv "$gguf.partial" "$gguf"
    fi
  done
fi

if [ -n "${llama_build:-}" ] && ! wait "$llama_build"; then
  log "the llama.cpp build failed (see $RESULTS/llama-build.log): measuring cinfer only"
  LLAMA_BENCH=""
fi

# The report from whatever results exist so far: written after every measured point, so a run
# stopped by a time limit still leaves the points it measured (the missing ones read n/a).
write_report() {
  "$PY" bench/threads_report.py --results "$RESULTS" --config "$CONFIG" --dtypes "$DTYPES" \
    --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" --runs "$RUNS" --precision "$PRECISION" \
    --seconds $(($(date +%s) - start)) >"$REPORT.partial" && mv "$REPORT.partial" "$REPORT"
}

# 4. Measurements: per dtype and thread count, cinfer then llama.cpp (weights read into
# allocated memory: -lm none), so that drifts of the machine touch both alike.
rm -f "$RESULTS"/cinfer-*.json "$RESULTS"/llama-*.json "$RESULTS"/pool-*.json
for pair in $DTYPES; do
  dtype=${pair%%:*}
  gtype=${pair##*:}
  for t in $THREADS; do
    log "cinfer $dtype, $t threads"
    build/cinfer bench --device cpu --model "$WORK/$name-$dtype" -p "$PROMPT" -n "$GEN" \
      --runs "$RUNS" --threads "$t" --precision "$PRECISION" --json >"$RESULTS/cinfer-$dtype-$t.json" \
      2>"$RESULTS/cinfer-$dtype-$t.err" || log "cinfer failed (see $RESULTS/cinfer-$dtype-$t.err)"
    write_report
    [ -n "$LLAMA_BENCH" ] || continue
    log "llama.cpp $gtype, $t threads"
    "$LLAMA_BENCH" -m "$WORK/$name-$gtype.gguf" -p "$PROMPT" -n "$GEN" -r "$RUNS" -t "$t" \
      -lm none -o json >"$RESULTS/llama-$gtype-$t.json" 2>"$RESULTS/llama-$gtype-$t.err" ||
      log "llama-bench failed (see $RESULTS/llama-$gtype-$t.err)"
    write_report
  done
done

# 5. The thread pool alone (build/pool_bench: one job of near-empty tasks, back to back and after
# 20 us of serial work) at each thread count with a 20 us and a 1 ms spin (the old default of
# pools of up to 2 threads, and the default), and cinfer's last dtype at the most threads with a
# 20 us spin (CINFER_POOL_SPIN_US), against its default run above.
if [ ! -x build/pool_bench ]; then
  make build JOBS="$JOBS" >>"$RESULTS/cinfer-build.log" 2>&1 || true
fi
rm -f "$RESULTS"/pool-*.json
if [ -x build/pool_bench ]; then
  for t in $THREADS; do
    for spin in 20 1000; do
      CINFER_POOL_SPIN_US=$spin build/pool_bench --threads "$t" --jobs 1000 \
        >"$RESULTS/pool-$t-$spin.json" 2>/dev/null || true
    done
  done
fi
last=${DTYPES##* }
last=${last%%:*}
max_t=$(printf '%s\n' $THREADS | sort -n | tail -1) # the most threads, whatever the list's order
log "cinfer $last, $max_t threads, CINFER_POOL_SPIN_US=20"
CINFER_POOL_SPIN_US=20 build/cinfer bench --device cpu --model "$WORK/$name-$last" \
  -p "$PROMPT" -n "$GEN" --runs "$RUNS" --threads "$max_t" --precision "$PRECISION" --json \
  >"$RESULTS/cinfer-spin20-$last-$max_t.json" 2>/dev/null || true

write_report
log "wrote $REPORT in $(($(date +%s) - start)) s"
