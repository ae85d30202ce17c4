#!/usr/bin/env bash
# Installs the dashboard's live-view libraries (noVNC, xterm.js) pinned by
# dashboard/vendor/package-lock.json (npm ci), skipped when node_modules already matches the lock.
# The build embeds them (src/dashboard/assets.cmake); without npm the build still works and the
# page says the live views are not built in. Works from any directory.
set -uo pipefail
VENDOR_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../dashboard/vendor" && pwd)"
cd "$VENDOR_DIR" || exit 2
if ! command -v npm >/dev/null; then
  echo "ui-vendor.sh: npm is not installed: the dashboard is built without its live desktop and terminal" \
       "(install nodejs and npm, then run make deps-ui)" >&2
  exit 0
fi
stamp="$VENDOR_DIR/node_modules/.nshpc-ui-lock.sha256"
want="$(sha256sum package-lock.json package.json | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f node_modules/@novnc/novnc/core/rfb.js \
      && -f node_modules/@xterm/xterm/lib/xterm.mjs ]]; then
  exit 0
fi
echo "ui-vendor.sh: npm ci (dashboard/vendor)"
npm ci --no-audit --no-fund --ignore-scripts || { echo "ui-vendor.sh: npm ci failed in $VENDOR_DIR" >&2; exit 1; }
echo "$want" >"$stamp"
