#!/usr/bin/env bash
# Installs the Debian packages cinfer's build, tests and benchmarks need (chromium: the chat page's
# browser test drives it headless through puppeteer-core; libedit: line editing in `cinfer chat`).
# Idempotent and silent when nothing is missing; called by the Makefile targets.
set -euo pipefail
packages=(build-essential cmake pkg-config clang libclang-rt-14-dev
          libjansson-dev libcmocka-dev
          libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libedit-dev nodejs
          python3-numpy chromium)
# A machine without a package registry (the GPU machine) gets the libraries from a bundle made
# by scripts/bundle-deps.sh and carried with the checkout: unpacked into .deps/root, which the
# Makefile then builds against. Its compilers and CUDA come with the machine.
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -d "$root/.deps/debs" ] && ! dpkg-query -W -f='${Status}' libjansson-dev 2>/dev/null |
    grep -q "install ok installed"; then
  if [ ! -f "$root/.deps/root/.unpacked" ]; then
    mkdir -p "$root/.deps/root"
    for deb in "$root"/.deps/debs/*.deb; do dpkg-deb -x "$deb" "$root/.deps/root"; done
    # private requirements (libmicrohttpd's GnuTLS) are the shared libraries' business, and
    # their .pc files are not in the bundle
    sed -i '/^Requires.private:/d' "$root"/.deps/root/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
    # a library the machine already has (libcurl, libssl, ...) is used from the machine, whose
    # copy comes with its own dependencies (the bundled libcurl's ssh/ldap/... libraries are not
    # bundled); the bundle keeps only its headers and the link name, pointed at that copy
    libdir="$root/.deps/root/usr/lib/x86_64-linux-gnu"
    for lib in "$libdir"/lib*.so.[0-9]*; do
      name=$(basename "$lib")
      case "$name" in *.so.*.*) continue ;; esac # the soname link, not the versioned file
      for sys in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
        [ -e "$sys/$name" ] || continue
        rm -f "$libdir/$name".*
        ln -sf "$sys/$name" "$libdir/$name"
        [ -L "$libdir/${name%.so.*}.so" ] && ln -sf "$name" "$libdir/${name%.so.*}.so"
        break
      done
    done
    touch "$root/.deps/root/.unpacked"
    echo "install-deps: unpacked $(ls "$root"/.deps/debs | wc -l) bundled packages into .deps/root" >&2
  fi
  exit 0
fi
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
