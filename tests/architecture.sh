#!/bin/bash
# The module map's rules that a compiler does not check (README: Architecture). Each line it prints
# is a broken rule; exit 1 then.
#   - The store is persistence: of sandbox/, files/ and network/ it includes only sandbox/types.hpp,
#     and nothing of the modules above it.
#   - sandbox/types.hpp is plain types: it includes nothing else of sandbox/.
#   - Facts below, advice at the faces: no string literal below the faces (MCP tools, the CLI,
#     WebDAV) names an `ns-hpc <command>` for someone to run; a layer below raises a typed error
#     (NotFound, NeedsAction) and each face words the advice for its audience.
set -u
src=${1:?usage: architecture.sh SOURCE_DIR}/src
broken=0
say() { echo "architecture: $*"; broken=1; }

while IFS= read -r line; do
  say "${line%%:*}: includes ${line#*:*:}: the store is persistence (move the behaviour to src/instances)"
done < <(grep -HnE '#include "(sandbox/[a-z_]+|files/|network/|jobs/|instances/|tools/|mcp/|transport/|dav/|cli/)' \
           "$src"/store/*.hpp "$src"/store/*.cpp | grep -v '"sandbox/types.hpp"' | sed "s|$src/||")

while IFS= read -r line; do
  say "${line%%:*}: includes ${line#*:*:}: sandbox/types.hpp stays plain types"
done < <(grep -HnE '#include "(sandbox|files|network|jobs|instances)/' "$src"/sandbox/types.hpp | sed "s|$src/||")

# The CLI's commands, as src/cli declares them (`app.add_subcommand("NAME"`, the name on the same
# line or the next), and the internal helpers the server starts (`ns-hpc __net-proxy`, ...).
commands=$(grep -hA1 'app\.add_subcommand(' "$src"/cli/*.cpp | grep -o '"[a-z][a-z-]*"' | tr -d '"' | sort -u | paste -sd'|')
[ -n "$commands" ] || say "no command found in src/cli (app.add_subcommand): the advice rule checks nothing"
# Allowed, each for its reason:
#   usage: ns-hpc {} / "ns-hpc {}: "  an internal helper's own usage line and stderr prefix (its
#                                     name from its constant); the server starts it, no one runs it
#   an ns-hpc instance                the noun ("'x' is an ns-hpc instance that is not a computer")
#   config/keys.cpp                   the key table's help: the configuration reference for the
#                                     operator (`config keys`, the README), who runs these commands
#   config/config.cpp: # Reserved     a comment in `config show`'s output, read by the same operator
allowed='usage: ns-hpc \{\}|"ns-hpc \{\}: |an ns-hpc instance |^config/keys\.cpp:|^config/config\.cpp:[0-9]+: .*"\\n# Reserved: '
while IFS= read -r line; do
  say "${line%%:*}:$(cut -d: -f2 <<<"$line"): names an ns-hpc command for someone to run; raise a typed error" \
      "(base/error.hpp: NotFound, NeedsAction) and word the advice in the faces (cli/app.cpp, tools/spec.cpp)"
done < <(for dir in sandbox store files network jobs instances base audit config; do
           [ -d "$src/$dir" ] && grep -rnE --include='*.cpp' --include='*.hpp' \
             "\"[^\"]*ns-hpc ($commands|__[a-z-]+|\{\})([^a-z_-]|$)" "$src/$dir"
         done | sed "s|$src/||" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' | grep -vE "$allowed")

exit $broken
