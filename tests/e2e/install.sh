#!/usr/bin/env bash
# Installs the e2e suite's pinned npm packages (npm ci), skipped when node_modules already matches
# package-lock.json. Works from any directory.
set -uo pipefail
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$E2E_DIR" || exit 2
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "install.sh: $tool is required" >&2; exit 2; }
done
# npm writes node_modules/.package-lock.json on install; equal to a fresh stamp of the lock file = up to date.
stamp="$E2E_DIR/node_modules/.nshpc-e2e-lock.sha256"
want="$(sha256sum package-lock.json package.json | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" || ! -d node_modules/@modelcontextprotocol/sdk ]]; then
  echo "install.sh: npm ci"
  npm ci --no-audit --no-fund || { echo "install.sh: npm ci failed" >&2; exit 1; }
  echo "$want" >"$stamp"
else
  echo "install.sh: node_modules is up to date with package-lock.json"
fi
