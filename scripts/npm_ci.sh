#!/usr/bin/env bash
# Installs a Node package's locked dependencies: `npm ci` in DIR, only when
# DIR/node_modules is missing or was installed from another package-lock.json.
# Usage: scripts/npm_ci.sh DIR
set -euo pipefail
dir=$1
command -v npm >/dev/null || { echo "npm_ci: npm is not installed (Node.js >= 18 and npm are required)" >&2; exit 1; }
stamp="$dir/node_modules/.fencepost-lock-sha256"
lock=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock" ]; then
  exit 0
fi
(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
echo "$lock" >"$stamp"
