#!/usr/bin/env bash
# End-to-end tests of ns-hpc's MCP server: installs the pinned npm packages (npm ci, skipped when
# node_modules matches package-lock.json), runs the node:test suites, then the Inspector CLI smoke
# test. Works from any directory. Exits non-zero on any failure.
#
# Environment: NSHPC_BINARY (default <repo>/build/ns-hpc), NSHPC_FIXTURE (default
# <repo>/build/tests/nshpc_mcp_fixture), NSHPC_CONFORMANCE_SERVER (default
# <repo>/build/tests/nshpc_conformance_server), E2E_TEST_TIMEOUT_MS (per test, default 120000).
set -uo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$E2E_DIR/../.." && pwd)"
export NSHPC_BINARY="${NSHPC_BINARY:-$REPO_DIR/build/ns-hpc}"
export NSHPC_FIXTURE="${NSHPC_FIXTURE:-$REPO_DIR/build/tests/nshpc_mcp_fixture}"
export NSHPC_CONFORMANCE_SERVER="${NSHPC_CONFORMANCE_SERVER:-$REPO_DIR/build/tests/nshpc_conformance_server}"
TEST_TIMEOUT_MS="${E2E_TEST_TIMEOUT_MS:-120000}"

cd "$E2E_DIR" || exit 2

for tool in node npm jq; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 2; }
done
for bin in "$NSHPC_BINARY" "$NSHPC_FIXTURE"; do
  [[ -x "$bin" ]] || { echo "run.sh: binary not found or not executable: $bin (build it first)" >&2; exit 2; }
done

"$E2E_DIR/install.sh" || exit 1

status=0
echo "run.sh: node --test (ns-hpc: $NSHPC_BINARY, fixture: $NSHPC_FIXTURE)"
node --test --test-reporter=tap --test-timeout="$TEST_TIMEOUT_MS" --test-concurrency=1 \
  stdio.test.mjs protocol.test.mjs fixture.test.mjs default_instance.test.mjs terminal.test.mjs files.test.mjs jobs.test.mjs \
  computer.test.mjs agent_tasks.test.mjs desktop.test.mjs live.test.mjs live_hostile.test.mjs app.test.mjs \
  http.test.mjs http_security.test.mjs eras.test.mjs tasks.test.mjs load.test.mjs dashboard.test.mjs live_browser.test.mjs || status=1

echo "run.sh: inspector.sh"
"$E2E_DIR/inspector.sh" || status=1

echo "run.sh: conformance.sh (the official MCP conformance suite over streamable HTTP)"
"$E2E_DIR/conformance.sh" || status=1

if [[ $status -ne 0 ]]; then
  echo "run.sh: FAILED" >&2
else
  echo "run.sh: all end-to-end tests passed"
fi
exit $status
