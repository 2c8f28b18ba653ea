#!/bin/sh
# Install test: installs the build into a temporary prefix (cmake --install), builds
# examples/generate.c against it with nothing but `pkg-config --static cinfer`, runs it on the
# llama fixture and checks its greedy tokens: with f32 KV they equal transformers' greedy
# continuation (fixtures/llama/greedy.txt), with the default KV they equal `cinfer generate
# --temp 0`'s.
# Usage: test_install_example.sh BUILD_DIR SOURCE_DIR CINFER_BIN CC [EXTRA_CFLAGS]
set -u
build=$1 src=$2 cinfer=$3 cc=$4 extra=${5:-}
fixture=$src/tests/fixtures/llama
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
for f in lib/libcinfer.a include/cinfer.h lib/pkgconfig/cinfer.pc bin/cinfer; do
  [ -f "$tmp/prefix/$f" ] || fail "$f was not installed"
done
[ "$(ls "$tmp/prefix/include")" = cinfer.h ] || fail "include/ holds more than cinfer.h"
echo "installed into $tmp/prefix"

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags cinfer) || fail "pkg-config --cflags cinfer"
libs=$(pkg-config --static --libs cinfer) || fail "pkg-config --static --libs cinfer"
echo "pkg-config: cinfer $(pkg-config --modversion cinfer): $cflags $libs"
# shellcheck disable=SC2086 # flag lists split on purpose
$cc -std=c11 -Wall -Wextra -Werror $extra $cflags "$src/examples/generate.c" $libs \
  -o "$tmp/generate" || fail "examples/generate.c does not build against the installed library"

ids=$(cat "$fixture/ids.txt")
want=$(cat "$fixture/greedy.txt")
got=$("$tmp/generate" "$fixture" --ids "$ids" -n 16 --ignore-eos --kv-codec f32 --threads 2) ||
  fail "example run (f32 KV) failed"
[ "$got" = "$want" ] || fail "f32 KV: got $got, want (greedy.txt) $want"
echo "f32 KV: $got (greedy.txt)"

want=$("$cinfer" generate --model "$fixture" --ids "$ids" --temp 0 -n 16 --threads 2 2>/dev/null) ||
  fail "cinfer generate failed"
got=$("$tmp/generate" "$fixture" --ids "$ids" -n 16 --threads 2) || fail "example run failed"
[ "$got" = "$want" ] || fail "bf16 KV: got $got, want (cinfer generate) $want"
echo "bf16 KV: $got (cinfer generate --temp 0)"
echo "PASS"
