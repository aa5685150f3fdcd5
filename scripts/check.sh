#!/usr/bin/env bash
# The contract guard: generated code (Python, TypeScript) is fresh, the
# TypeScript client type-checks (tsc), buf lint is clean, and the proto has no
# breaking change against the previous commit (buf breaking, FILE rules).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUF=${BUF:-$(dirname "$PY")/buf}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY="$PY" scripts/generate.sh "$tmp"
if ! diff -r -x __init__.py -x __pycache__ "$tmp/fencepost/v1" client/fencepost/v1 >"$tmp/diff.txt"; then
  cat "$tmp/diff.txt" | head -40
  echo "check: generated code under client/fencepost/v1 is stale; run 'make generate' and commit" >&2
  exit 1
fi
if ! diff -r "$tmp/typescript/src/gen" client/typescript/src/gen >"$tmp/diff.txt"; then
  cat "$tmp/diff.txt" | head -40
  echo "check: generated code under client/typescript/src/gen is stale; run 'make generate' and commit" >&2
  exit 1
fi
(cd client/typescript && node_modules/.bin/tsc -p . --noEmit)
echo "check: generated code is fresh (Python, TypeScript); the TypeScript client type-checks"

"$BUF" lint
echo "check: buf lint clean"

"$PY" scripts/proto_docs.py --out "$tmp/reference.md"
if ! diff -u docs/reference.md "$tmp/reference.md" >"$tmp/docs.diff"; then
  head -40 "$tmp/docs.diff"
  echo "check: docs/reference.md is stale; run 'make docs' and commit" >&2
  exit 1
fi
echo "check: docs/reference.md is fresh and every proto element is commented"

# Baseline: the committed proto when the working tree changed it, else the
# commit before HEAD (the previously landed contract).
against=${BUF_AGAINST:-}
if [ -z "$against" ] && git rev-parse --git-dir >/dev/null 2>&1; then
  if [ -n "$(git status --porcelain -- proto 2>/dev/null)" ]; then
    ref=HEAD
  else
    ref=HEAD~1
  fi
  if git cat-file -e "$ref:proto" 2>/dev/null; then
    against=".git#ref=$ref"
  fi
fi
if [ -n "$against" ]; then
  "$BUF" breaking --against "$against"
  echo "check: buf breaking clean against $against"
else
  echo "check: no previous proto to compare against; buf breaking skipped"
fi
