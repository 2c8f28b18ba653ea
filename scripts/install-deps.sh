#!/usr/bin/env bash
# Installs the Debian packages cinfer's build, tests and benchmarks need.
# Idempotent and silent when nothing is missing; called by the Makefile targets.
set -euo pipefail
packages=(build-essential cmake pkg-config clang libclang-rt-14-dev
          libjansson-dev libcmocka-dev
          libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libssl-dev nodejs
          python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm ships inside NodeSource's nodejs package but separately in Debian's.
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq >&2
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
