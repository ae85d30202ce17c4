#!/usr/bin/env bash
# `make run`: checks the machine (doctor --fix; a missing default image is built in the
# background), then serves MCP over streamable HTTP on loopback with WebDAV and the dashboard,
# in the foreground until Ctrl-C. The lines to use are printed as the server starts:
#   Dashboard: http://127.0.0.1:PORT/login?code=…   (open it in a browser: a one-time login link)
#   ns-hpc: MCP client configuration: {…}            (paste into an MCP client)
#   ns-hpc: WebDAV at http://127.0.0.1:PORT/dav/     (any user name, the token as password)
# Environment: NSHPC_PORT (default 8000; 0 = any free port), NS_HPC_CONFIG (your config; WebDAV
# then follows its [dav] enabled).
set -euo pipefail
nshpc=${1:-build/ns-hpc}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
echo "\$ ns-hpc doctor --fix --background"
"$nshpc" doctor --fix --background || { echo "doctor found a problem: fix it first (see the fix lines above)"; exit 1; }
config=()
if [[ -z "${NS_HPC_CONFIG:-}" ]]; then
  config=(--config "$here/run.toml")  # WebDAV on, the rest as configured
fi
echo
echo "\$ ns-hpc run --transport streamable-http --port ${NSHPC_PORT:-8000}   (Ctrl-C stops it; instances and running jobs stay)"
exec "$nshpc" "${config[@]}" run --transport streamable-http --port "${NSHPC_PORT:-8000}"
