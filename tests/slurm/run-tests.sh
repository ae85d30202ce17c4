#!/usr/bin/env bash
# The Slurm tests against a real single-node cluster on this machine: starts it
# (tests/slurm/cluster.sh up: munge, MariaDB, slurmdbd, slurmctld, slurmd, loopback only), runs
# the Slurm integration tests and the MCP end-to-end test, and stops the cluster again.
# Usage: run-tests.sh NSHPC_INTEGRATION_BINARY NS_HPC_BINARY. Exit 77 (skip) when not root.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
INTEGRATION="$(realpath "${1:-$REPO/build/tests/nshpc_integration}")"
NSHPC="$(realpath "${2:-$REPO/build/ns-hpc}")"

if [[ $EUID -ne 0 ]]; then
  echo "run-tests.sh: the single-node Slurm cluster needs root to start; skipped" >&2
  exit 77
fi

"$HERE/cluster.sh" up || { echo "run-tests.sh: the cluster did not start" >&2; exit 1; }
trap '"$HERE/cluster.sh" down' EXIT

status=0
NSHPC_SLURM_TESTS=1 NSHPC_BINARY="$NSHPC" "$INTEGRATION" --gtest_filter='Slurm.*' || status=1

# The MCP path (submit_job mode "slurm") with the SDK client.
"$REPO/tests/e2e/install.sh" || exit 1
(cd "$REPO/tests/e2e" && NSHPC_SLURM_TESTS=1 NSHPC_BINARY="$NSHPC" \
  node --test --test-reporter=tap --test-concurrency=1 slurm.test.mjs) || status=1

exit $status
