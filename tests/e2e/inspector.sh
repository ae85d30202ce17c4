#!/usr/bin/env bash
# Smoke test of `ns-hpc run` (stdio) with the MCP Inspector CLI (@modelcontextprotocol/inspector-cli).
# Needs tests/e2e/node_modules (run.sh installs it) and jq. Exits non-zero on any failure.
set -uo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$E2E_DIR/../.." && pwd)"
NSHPC_BINARY="${NSHPC_BINARY:-$REPO_DIR/build/ns-hpc}"
INSPECTOR="$E2E_DIR/node_modules/.bin/mcp-inspector-cli"

[[ -x "$NSHPC_BINARY" ]] || { echo "inspector.sh: ns-hpc binary not found: $NSHPC_BINARY" >&2; exit 2; }
[[ -x "$INSPECTOR" ]] || { echo "inspector.sh: $INSPECTOR missing; run npm ci in $E2E_DIR" >&2; exit 2; }
command -v jq >/dev/null || { echo "inspector.sh: jq is required" >&2; exit 2; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/nshpc-e2e-inspector-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/instances" "$TMP/context" "$TMP/xdg" "$TMP/run"
cat >"$TMP/config.toml" <<EOF
[namespace]
instances_dir = "$TMP/instances"
default_image = ""
[resource]
context_dirs = ["$TMP/context"]
EOF
# inspector-cli decides where its package.json is by checking "../package.json" relative to the
# *current directory* (it crashes with "Cannot find module .../@modelcontextprotocol/package.json"
# otherwise), so run it from a folder whose parent holds a package.json.
echo '{"private": true}' >"$TMP/package.json"

# The server command, as one executable without arguments: the launcher (cli.js) has a --config
# of its own that would take ns-hpc's, and it moves the target after the method options, where
# a variadic --tool-arg would swallow it. The server gets a minimal environment.
cat >"$TMP/server.sh" <<EOF
#!/bin/sh
exec env -i PATH="\$PATH" HOME="$TMP" XDG_CONFIG_HOME="$TMP/xdg" "$NSHPC_BINARY" --config "$TMP/config.toml" run
EOF
chmod +x "$TMP/server.sh"

failures=0
passes=0
fail() { echo "not ok - $1"; [[ -n "${2:-}" ]] && printf '  output: %s\n' "$2" | head -c 4000; failures=$((failures + 1)); }
pass() { echo "ok - $1"; passes=$((passes + 1)); }

# inspect NAME JQ_ASSERTION -- INSPECTOR_ARGS...: runs the inspector and checks its JSON output.
inspect() {
  local name="$1" check="$2"
  shift 3
  local out rc
  # --cli: the command-line mode (else the launcher starts the web UI).
  out="$(cd "$TMP/run" && timeout 60 "$INSPECTOR" --cli "$TMP/server.sh" "$@" 2>"$TMP/stderr")"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "$name (exit $rc)" "$out $(tail -c 2000 "$TMP/stderr")"
    return
  fi
  if ! jq -e "$check" >/dev/null 2>&1 <<<"$out"; then
    fail "$name (jq: $check)" "$out"
    return
  fi
  pass "$name"
}

inspect "tools/list lists create_instance" \
  '[.tools[].name] | index("create_instance") != null' -- \
  --method tools/list

inspect "tools/list: all seven tools have outputSchema" \
  '[.tools[] | select(.outputSchema != null)] | length >= 7' -- \
  --method tools/list

inspect "tools/call create_instance instance_id=insp-1" \
  '(.isError != true) and .structuredContent.id == "insp-1" and ([.content[].text] | join(" ") | test("insp-1"))' -- \
  --method tools/call --tool-name create_instance --tool-arg instance_id=insp-1 --tool-arg description=inspector

inspect "tools/call list_instances shows insp-1 (state persists between runs)" \
  '(.isError != true) and ([.structuredContent.instances[].id] | index("insp-1") != null)' -- \
  --method tools/call --tool-name list_instances

inspect "tools/call describe_instance of an unknown id is an isError result" \
  '.isError == true and ([.content[].text] | join(" ") | test("nope-404"))' -- \
  --method tools/call --tool-name describe_instance --tool-arg instance_id=nope-404

inspect "resources/read ns-hpc.md returns text" \
  '.contents[0].mimeType == "text/markdown" and (.contents[0].text | length > 0)' -- \
  --method resources/read --uri resource://ns-hpc/context/ns-hpc.md

inspect "resources/list has the built-in docs and the instance" \
  '[.resources[].uri] | (index("resource://ns-hpc/context/ns-hpc.md") != null and index("resource://ns-hpc/instances/insp-1") != null)' -- \
  --method resources/list

inspect "resources/templates/list has the instance template" \
  '[.resourceTemplates[].uriTemplate] | index("resource://ns-hpc/instances/{id}") != null' -- \
  --method resources/templates/list

inspect "prompts/list has work_in_sandbox" \
  '[.prompts[].name] | index("work_in_sandbox") != null' -- \
  --method prompts/list

inspect "prompts/get work_in_sandbox mentions the goal" \
  '.messages[0].role == "user" and (.messages[0].content.text | test("build the thing"))' -- \
  --method prompts/get --prompt-name work_in_sandbox --prompt-args "goal=build the thing"

if [[ -f "$TMP/instances/insp-1/audit.log" ]] && grep -q '"mcp.tool_call"' "$TMP/instances/insp-1/audit.log"; then
  pass "the inspector's calls are audited"
else
  fail "the inspector's calls are audited" "$(cat "$TMP/instances/insp-1/audit.log" 2>&1)"
fi

echo "inspector: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
