#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in package.json)
# against ns-hpc's streamable HTTP transport:
#   1. the fixture server (tests/fixtures/conformance_server.cpp: ns-hpc's MCP core and HTTP
#      transport carrying the exact tools, resources and prompts the suite expects): every
#      scenario, pending ones included, must pass without a warning; then the fixture must exit
#      0 on SIGTERM;
#   2. the real `ns-hpc run --transport streamable-http` (temporary home, loopback), twice:
#      a. with a bearer token (the default for HTTP). The suite's client has no option to send
#         one, so a preload gives node's HTTP client (fetch and undici, through undici's global
#         dispatcher) an `Authorization: Bearer` header;
#      b. without a token (--allow-unauthenticated-http), the suite unmodified.
#      Every scenario that does not need the fixture's tools/resources/prompts must pass; the
#      ones that do are listed, with reasons, in conformance-ns-hpc-baseline.yml (the suite also
#      fails the run when a listed scenario passes, so the list stays exact), and must fail for
#      that reason only (unknown tool/prompt, resource not found, no completions).
# Prints the suite's summary lines; exits non-zero on any unexpected failure. Loopback only.
#
# Environment: NSHPC_CONFORMANCE_SERVER (default <repo>/build/tests/nshpc_conformance_server),
# NSHPC_BINARY (default <repo>/build/ns-hpc), CONFORMANCE_VERBOSE=1 (the suite's full output).
set -uo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$E2E_DIR/../.." && pwd)"
FIXTURE="${NSHPC_CONFORMANCE_SERVER:-$REPO_DIR/build/tests/nshpc_conformance_server}"
NSHPC="${NSHPC_BINARY:-$REPO_DIR/build/ns-hpc}"
BASELINE="$E2E_DIR/conformance-ns-hpc-baseline.yml"
SUITE="$E2E_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
VERBOSE="${CONFORMANCE_VERBOSE:-0}"

say() { echo "conformance.sh: $*"; }
die() { echo "conformance.sh: $*" >&2; exit 2; }

command -v node >/dev/null || die "node is required"
for bin in "$FIXTURE" "$NSHPC"; do
  [[ -x "$bin" ]] || die "binary not found or not executable: $bin (build it first)"
done
cd "$E2E_DIR" || exit 2
if [[ ! -f "$SUITE" ]]; then
  say "npm ci (node_modules is missing)"
  npm ci --no-audit --no-fund || die "npm ci failed"
fi
[[ -f "$SUITE" ]] || die "the conformance suite is not installed: $SUITE"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nshpc-conformance-XXXXXX")" || die "mktemp failed"
# As root the sandbox runs as uid 65534, which must pass through to the instances dir.
chmod 0755 "$WORK"
# Servers this script started (pid per name), killed by pid if still running at exit.
declare -A STARTED=()
cleanup() {
  local pid
  for pid in "${STARTED[@]}"; do
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Preload for part 2a: every request node makes (fetch, undici.request) carries the token.
cat >"$WORK/bearer-preload.cjs" <<'EOF'
const { createRequire } = require('node:module');
const { Agent, setGlobalDispatcher } = createRequire(process.env.CONFORMANCE_E2E_DIR + '/')('undici');
const value = `Bearer ${process.env.CONFORMANCE_BEARER_TOKEN}`;
function withAuth(h) {
  if (h == null) return { authorization: value };
  if (Array.isArray(h)) return Array.isArray(h[0]) ? [...h, ['authorization', value]] : [...h, 'authorization', value];
  if (typeof h[Symbol.iterator] === 'function') return [...h, ['authorization', value]];
  return { ...h, authorization: value };
}
class BearerAgent extends Agent {
  dispatch(opts, handler) {
    return super.dispatch({ ...opts, headers: withAuth(opts.headers) }, handler);
  }
}
setGlobalDispatcher(new BearerAgent());
EOF

# Reads the suite's results (-o dir/<side>-<scenario>-<time>/checks.json).
#   show <dir>: prints every FAILURE/WARNING check with its scenario and message;
#   reasons <dir> <baseline>: fails unless every baseline scenario failed only for a missing
#   fixture tool/prompt/resource or completions (and not, say, for a transport error).
cat >"$WORK/checks.mjs" <<'EOF'
import fs from 'node:fs';
import path from 'node:path';
const [mode, dir, baselineFile] = process.argv.slice(2);
const results = [];
for (const entry of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
  const m = /^server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$/.exec(entry);
  const file = path.join(dir, entry, 'checks.json');
  if (m && fs.existsSync(file)) results.push({ scenario: m[1], checks: JSON.parse(fs.readFileSync(file, 'utf8')) });
}
const short = (s) => String(s ?? '').replace(/\s+/g, ' ').slice(0, 300);
if (mode === 'show') {
  for (const { scenario, checks } of results)
    for (const c of checks)
      if (c.status === 'FAILURE' || c.status === 'WARNING')
        console.log(`  ${c.status} ${scenario} / ${c.id}: ${short(c.errorMessage || c.description)}`);
} else {
  const expected = fs.readFileSync(baselineFile, 'utf8').split('\n')
    .map((l) => /^\s*-\s*([\w-]+)\s*$/.exec(l)).filter(Boolean).map((m) => m[1]);
  const why = /unknown tool '|unknown prompt '|resource not found: test:\/\/|method not found: completion\/complete/;
  let bad = 0;
  for (const scenario of expected) {
    const r = results.find((x) => x.scenario === scenario);
    const failures = (r?.checks ?? []).filter((c) => c.status === 'FAILURE' || c.status === 'WARNING');
    const odd = failures.filter((c) => !why.test(c.errorMessage || ''));
    if (!r || failures.length === 0 || odd.length > 0) {
      bad++;
      console.log(`  ${scenario}: expected to fail only for a missing fixture tool/prompt/resource, but: ` +
        (r ? (odd.length ? odd.map((c) => short(c.errorMessage)).join(' | ') : 'it passed') : 'no results'));
    }
  }
  if (bad === 0) console.log(`  all ${expected.length} expected failures failed for the expected reason`);
  process.exit(bad ? 1 : 0);
}
EOF

# Stops a server this script started with SIGTERM; fails unless it exits 0 within 10 s.
stop_server() {
  local name=$1 err=$2 pid=${STARTED[$1]} rc
  kill -TERM "$pid" 2>/dev/null
  if ! timeout 10 tail --pid="$pid" -s 0.1 -f /dev/null; then
    say "FAIL: $name did not exit within 10 s of SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    unset "STARTED[$name]"
    return 1
  fi
  wait "$pid"
  rc=$?
  unset "STARTED[$name]"
  if ((rc != 0)); then
    say "FAIL: $name exited $rc on SIGTERM (want 0); its stderr:"
    tail -n 20 "$err" >&2
    return 1
  fi
  say "$name exited 0 on SIGTERM"
}

# Waits (up to 15 s) for a line of file $2 matching sed expression $3 (which prints the URL)
# while pid STARTED[$1] lives; prints the URL.
wait_url() {
  local name=$1 file=$2 expr=$3 url=""
  for _ in $(seq 150); do
    url="$(sed -n "$expr" "$file" | head -n 1)"
    [[ -n "$url" ]] && break
    kill -0 "${STARTED[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "$url"
}

# Runs the suite: run_suite <label> <url> <suite args…>, with the environment in SUITE_ENV.
# Shows the summary (and the failed or warned checks; the suite's full output with
# CONFORMANCE_VERBOSE=1); returns its exit status.
SUITE_ENV=()
run_suite() {
  local label=$1 url=$2 rc
  shift 2
  local log="$WORK/$label.log"
  say "[$label] conformance server --url $url $*"
  env "${SUITE_ENV[@]}" timeout 60 node "$SUITE" server --url "$url" -o "$WORK/$label-results" "$@" >"$log" 2>&1
  rc=$?
  ((rc == 124)) && say "[$label] the suite timed out after 60 s"
  if [[ "$VERBOSE" == 1 ]]; then
    cat "$log"
  else
    # The summary block and the baseline verdict, colour codes removed.
    sed -n '/=== SUMMARY ===/,$p' "$log" | sed 's/\x1b\[[0-9;]*m//g'
    if ((rc != 0)); then
      say "[$label] checks that failed or warned:"
      node "$WORK/checks.mjs" show "$WORK/$label-results"
      grep -E '^(Server test error|Failed to run scenario)' -A5 "$log"
    fi
  fi
  return "$rc"
}

status=0

# --- Part 1: the fixture ------------------------------------------------------------------
say "part 1: the fixture ($FIXTURE)"
"$FIXTURE" --host 127.0.0.1 --port 0 >"$WORK/fixture.out" 2>"$WORK/fixture.err" &
STARTED[fixture]=$!
url="$(wait_url fixture "$WORK/fixture.out" 's/^listening //p')"
if [[ -z "$url" ]]; then
  say "FAIL: the fixture did not print 'listening <url>'; stdout/stderr:"
  cat "$WORK/fixture.out" "$WORK/fixture.err" >&2
  exit 1
fi
# Every scenario, the pending ones (json-schema-2020-12, server-sse-polling) too; an empty
# baseline makes the suite count warnings as failures.
printf 'server: []\n' >"$WORK/no-failures.yml"
run_suite fixture "$url" --suite all --expected-failures "$WORK/no-failures.yml" || {
  status=1
  say "FAIL: part 1 (fixture); fixture stderr tail:"
  tail -n 20 "$WORK/fixture.err"
}
stop_server fixture "$WORK/fixture.err" || status=1

# --- Part 2: the real ns-hpc --------------------------------------------------------------
home="$WORK/home"
mkdir -p "$home/context" "$home/xdg" "$home/instances"
chmod 0755 "$home" "$home/instances"
cat >"$home/config.toml" <<EOF
[namespace]
instances_dir = "$home/instances"
default_image = ""
[resource]
context_dirs = ["$home/context"]
EOF
token="conformance-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

# run_nshpc <label> <token or empty>
run_nshpc() {
  local label=$1 tok=$2 url
  local -a extra=() server_env=(PATH="$PATH" HOME="$home" XDG_CONFIG_HOME="$home/xdg")
  if [[ -n "$tok" ]]; then
    server_env+=(NS_HPC_AUTH_TOKEN="$tok")
    SUITE_ENV=(NODE_OPTIONS="--require $WORK/bearer-preload.cjs" CONFORMANCE_E2E_DIR="$E2E_DIR"
               CONFORMANCE_BEARER_TOKEN="$tok")
  else
    extra=(--allow-unauthenticated-http)
    SUITE_ENV=()
  fi
  say "part 2 [$label]: ns-hpc run --transport streamable-http${extra[*]:+ ${extra[*]}} ($NSHPC)"
  env -i "${server_env[@]}" "$NSHPC" --config "$home/config.toml" run --transport streamable-http \
    --host 127.0.0.1 --port 0 "${extra[@]}" </dev/null >"$WORK/$label.out" 2>"$WORK/$label.err" &
  STARTED[$label]=$!
  # It prints "ns-hpc: MCP (streamable HTTP) listening on <url>" to stderr once ready.
  url="$(wait_url "$label" "$WORK/$label.err" 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p')"
  if [[ -z "$url" ]]; then
    say "FAIL: ns-hpc did not report its URL ('listening on http://…'); its stderr:"
    tail -n 30 "$WORK/$label.err" >&2
    stop_server "$label" "$WORK/$label.err"
    return 1
  fi
  local ok=0
  run_suite "$label" "$url" --suite active --expected-failures "$BASELINE" || ok=1
  SUITE_ENV=()
  if ((ok == 0)); then
    node "$WORK/checks.mjs" reasons "$WORK/$label-results" "$BASELINE" || ok=1
  fi
  if ((ok != 0)); then
    say "FAIL: part 2 [$label]; ns-hpc stderr tail:"
    tail -n 20 "$WORK/$label.err"
  fi
  stop_server "$label" "$WORK/$label.err" || ok=1
  return $ok
}

run_nshpc ns-hpc-token "$token" || status=1
run_nshpc ns-hpc-no-token "" || status=1

if ((status != 0)); then
  say "FAILED"
else
  say "all conformance checks passed"
fi
exit $status
