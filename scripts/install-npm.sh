#!/usr/bin/env bash
# Installs the npm reference packages the tests read (tokenizer.json files, the Hugging Face
# tokenizers and Jinja references, the OpenAI and Anthropic clients) into tests/npm.
# Idempotent and silent when the lock file is already satisfied.
set -euo pipefail
cd "$(dirname "$0")/../tests/npm"
stamp=node_modules/.cinfer-lock
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then exit 0; fi
echo "install-npm: installing test reference packages" >&2
npm ci --no-audit --no-fund --loglevel=error >&2
cp package-lock.json "$stamp"
