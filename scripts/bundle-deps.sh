#!/usr/bin/env bash
# Prepares .deps/debs: the Debian packages (headers, .pc files, shared libraries) cinfer's build
# and tests link against, for a machine that has a compiler but no package registry (the GPU
# machine). Run it where apt works; scripts/install-deps.sh on the other machine unpacks them
# into .deps/root (nothing outside the checkout is touched) and the Makefile builds against it.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
          libpcre2-posix3 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12
          libcmocka-dev libcmocka0 pkgconf pkgconf-bin libpkgconf3
          libcurl4-openssl-dev libcurl4 libssl-dev libssl3
          libedit-dev libedit2 libbsd-dev libbsd0 libmd-dev libmd0)
mkdir -p .deps/debs
cd .deps/debs
apt-get download "${packages[@]}" >/dev/null
echo "bundle-deps: $(ls | wc -l) packages in .deps/debs ($(du -sh . | cut -f1))"
