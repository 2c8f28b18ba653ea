#!/bin/sh
# Layering check (run by ctest): the command line and the server reach the model only through
# the engine/session layer. Fails, naming file and line, when
#   - src/cli/*.c|h includes a header from src/kv/ or src/backend/, or the model's forward
#     internals (model/model.h, model/spec.h);
#   - src/server/* includes a header from src/kv/ or src/backend/.
# Usage: scripts/check-layering.sh [REPO_ROOT]
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2

# Known exceptions, one "file:header" per line: files another change is still moving onto the
# engine. Each entry is remaining work; remove it when the include goes. Empty means none.
ALLOWED='
'

failed=0
check() { # check DIR PATTERN: report every matching #include in DIR/*.c and DIR/*.h
  for file in "$1"/*.c "$1"/*.h; do
    [ -f "$file" ] || continue
    grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"($2)" "$file" |
      while IFS= read -r hit; do
        line=${hit%%:*}
        header=$(printf '%s\n' "$hit" | sed -E 's/.*include[[:space:]]*"([^"]*)".*/\1/')
        if printf '%s\n' "$ALLOWED" | grep -qxF "$file:$header"; then
          echo "allowed (known exception): $file:$line includes $header" >&2
        else
          echo "$file:$line: includes \"$header\" (layering: use the engine/session layer)"
        fi
      done
  done
}

report=$( (check src/cli 'kv/|backend/|model/model\.h"|model/spec\.h"'; check src/server 'kv/|backend/') )
if [ -n "$report" ]; then
  printf '%s\n' "$report"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "layering: ok"
exit "$failed"
