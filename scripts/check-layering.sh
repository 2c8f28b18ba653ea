#!/bin/sh
# Layering check (run by ctest): the command line and the server use cinfer's public C API
# (include/cinfer.h) exactly as an embedding program would. Every quoted #include in
# src/cli/*.c|h and src/server/*.c|h must name
#   - "cinfer.h" (the public API),
#   - a header of the file's own directory ("cli/..." in src/cli, "server/..." in src/server; the
#     CLI may also include "server/server.h", the server it starts), or
#   - a generic utility of "base/" (error.h, timing.h, threadpool.h, ...).
# System and third-party headers (<...>) are not checked. Fails naming file, line and header.
# Usage: scripts/check-layering.sh [REPO_ROOT]
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2

# Known exceptions, one "file:header" per line: each entry is remaining work; remove it when the
# include goes. Empty means none.
ALLOWED='
'

check() { # check DIR ALLOWED_PATTERN: report every quoted #include in DIR/*.c|h not matching it
  for file in "$1"/*.c "$1"/*.h; do
    [ -f "$file" ] || continue
    grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" |
      while IFS= read -r hit; do
        line=${hit%%:*}
        header=$(printf '%s\n' "$hit" | sed -E 's/.*include[[:space:]]*"([^"]*)".*/\1/')
        if printf '%s\n' "$header" | grep -qE "^($2)$"; then
          continue
        elif printf '%s\n' "$ALLOWED" | grep -qxF "$file:$header"; then
          echo "allowed (known exception): $file:$line includes $header" >&2
        else
          echo "$file:$line: includes \"$header\" (layering: only cinfer.h, its own directory and base/)"
        fi
      done
  done
}

report=$( (check src/cli 'cinfer\.h|cli/[^/]+\.h|server/server\.h|base/[^/]+\.h'
           check src/server 'cinfer\.h|server/[^/]+\.h|base/[^/]+\.h') )
if [ -n "$report" ]; then
  printf '%s\n' "$report"
  exit 1
fi
echo "layering: ok"
exit 0
