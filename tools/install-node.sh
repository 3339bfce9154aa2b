#!/usr/bin/env bash
# Installs Node.js and npm from Debian's packages when the machine has none.
set -euo pipefail
if command -v node >/dev/null && command -v npm >/dev/null; then exit 0; fi
echo "installing nodejs and npm (Debian packages)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
node --version
