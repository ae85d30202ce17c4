#!/usr/bin/env bash
# make test's test step: every suite (ctest), then the check that the tests left nothing of ours
# running (scripts/leftovers.sh). Usage: run-tests.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
# This script started with the run: what starts after it is the run's.
read -r stat </proc/$$/stat
rest=${stat##*) }
read -r _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ start _ <<<"$rest"
(cd "$build" && ctest --output-on-failure -j 2)
rc=$?
"$here/leftovers.sh" "$start" || rc=1
exit $rc
