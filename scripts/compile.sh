#!/usr/bin/env bash
# The compiler launcher (CMAKE_CXX_COMPILER_LAUNCHER): ccache, set so that a clone anywhere finds
# what any other clone compiled. Usage: compile.sh SOURCE_DIR COMPILER ARGS...
#   - BASEDIR: absolute paths below the source tree are hashed as relative ones; NOHASHDIR: the
#     build folder's path stays out of the hash (-g would put it in).
#   - A precompiled header is not the same file twice (GCC writes memory addresses into it), so
#     ccache hashes a checksum beside it instead (pch_external_checksum): what the header
#     preprocesses to, the compiler's version and its path-free flags — what the .gch is made of.
set -uo pipefail
base=$1
shift
export CCACHE_BASEDIR=$base CCACHE_NOHASHDIR=1 CCACHE_PCH_EXTSUM=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if ! command -v ccache >/dev/null; then exec "$@"; fi
ccache "$@" || exit
# The same command without its output and dependency options, to preprocess the header again.
out=
args=()
while (($#)); do
  case $1 in
    -o) out=$2; shift ;;
    -MT | -MF) shift ;;
    -c | -MD) ;;
    *) args+=("$1") ;;
  esac
  shift
done
[[ $out == *.gch ]] || exit 0
{
  "${args[0]}" --version
  printf '%s\n' "${args[@]:1}" | grep -v /
  "${args[@]}" -E -P
} | sha256sum >"$out.sum.tmp" && mv "$out.sum.tmp" "$out.sum"
