#!/usr/bin/env bash
# Check what libjsdurable.so exports against the public headers, so that a
# new public header or function cannot slip past the export rules unnoticed:
#
#   - every dynamic symbol it defines is named jsd_ followed by a character
#     other than '_' (no jsd__ internals, no helper without the prefix);
#   - every function declared in include/jsdurable.h and include/jsdurable/*.h
#     carries JSD_EXTERN and is exported (a declaration without JSD_EXTERN is
#     hidden by -fvisibility=hidden, and a program linking it would fail).
#
#   BUILD=build scripts/check-exports.sh      (run by `make check`)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
so=$BUILD/libjsdurable.so
[ -f "$so" ] || { echo "check-exports: $so not built"; exit 1; }
fail=0

exports=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVWiu]$/ {sub(/@.*/, "", $3); print $3}' | sort -u)
bad=$(printf '%s\n' "$exports" | grep -v '^jsd_[^_]' || true)
if [ -n "$bad" ]; then
  echo "check-exports: $so exports symbols outside the public API (not jsd_<name>, or jsd__):"
  printf '  %s\n' $bad
  fail=1
fi

# Top-level function declarations: a line at column 0 that names jsd_x( and is
# not a typedef (continuation lines of a declaration are indented).
headers=(include/jsdurable.h include/jsdurable/*.h)
unmarked=$(grep -nE '^[a-z][^(;{}=#]*\bjsd_[a-z0-9_]+\(' "${headers[@]}" | grep -vE ':[0-9]+:typedef ' || true)
if [ -n "$unmarked" ]; then
  echo "check-exports: public declarations without JSD_EXTERN (hidden from the .so):"
  printf '%s\n' "$unmarked" | sed 's/^/  /'
  fail=1
fi
declared=$(grep -hoE '^JSD_EXTERN [^(;{}=#]*\bjsd_[a-z0-9_]+\(' "${headers[@]}" |
           grep -oE 'jsd_[a-z0-9_]+\($' | tr -d '(' | sort -u)
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exports"))
if [ -n "$missing" ]; then
  echo "check-exports: declared in a public header but not exported by $so (no definition?):"
  printf '  %s\n' $missing
  fail=1
fi

if [ $fail = 0 ]; then
  echo "check-exports: $(printf '%s\n' "$exports" | wc -l) symbols exported, all public, every public declaration among them"
fi
exit $fail
