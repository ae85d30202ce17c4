#!/bin/bash
# The module map's rules that a compiler does not check (README: Architecture). Each line it prints
# is a broken rule; exit 1 then.
#   - The store is persistence: of sandbox/, files/ and network/ it includes only sandbox/types.hpp,
#     and nothing of the modules above it.
#   - sandbox/types.hpp is plain types: it includes nothing else of sandbox/.
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

exit $broken
