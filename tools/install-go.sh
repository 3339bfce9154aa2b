#!/usr/bin/env bash
# Installs a Go toolchain into .tools/go when the machine has none: Debian's
# golang-go bootstraps, then `go mod download` fetches the pinned toolchain
# (the golang.org/toolchain module) from the Go module proxy.
set -euo pipefail
version="${1:?usage: install-go.sh GO_VERSION (e.g. 1.26.0)}"
dest="${2:?usage: install-go.sh GO_VERSION DEST}"
if ! command -v go >/dev/null; then
  echo "installing golang-go (Debian package) to bootstrap Go ${version}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
fi
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
mod="golang.org/toolchain@v0.0.1-go${version}.linux-${arch}"
cache="$(mktemp -d)"
trap 'chmod -R u+w "$cache"; rm -rf "$cache"' EXIT
dir="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod GOMODCACHE="$cache" go mod download -json "$mod" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
test -f "$dir/bin/go" || { echo "no toolchain in $mod" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -r "$dir" "$dest"
chmod -R u+w "$dest"
chmod +x "$dest"/bin/* "$dest"/pkg/tool/*/* 2>/dev/null || true
"$dest/bin/go" version
