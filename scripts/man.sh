#!/usr/bin/env bash
# Generate the man pages from the tool's own --help, so they can never
# disagree with it: jsdurable(1) from `jsdurable --help`, and
# jsdurable-COMMAND(1) from `jsdurable COMMAND --help` for every command the
# top-level help lists under "Commands:" (a new command gets its page without
# an edit here). help2man (Debian package help2man) does the formatting.
#
#   BUILD=build VERSION=0.1.0 scripts/man.sh OUTDIR     (run by `make`)
#
# Without help2man it prints a notice and exits 0: `make` still builds the
# library and the tool, and `make install` refuses to go on without pages.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
out=${1:-$BUILD/man}
cli=$BUILD/jsdurable
version=${VERSION:-$("$cli" --version | awk '{print $2}')}
if ! command -v help2man >/dev/null; then
  echo "man: help2man not installed (make deps): man pages not built" >&2
  exit 0
fi
mkdir -p "$out/wrap"
commands=$("$cli" --help | awk '/^Commands:/ {on=1; next} on && /^  [a-z]/ {print $1; next} on && !/^  / {exit}')
[ -n "$commands" ] || { echo "man: no commands found in '$cli --help'" >&2; exit 1; }

# help2man runs "PROGRAM --help"; a command's page needs "jsdurable CMD
# --help", so each gets a two-line wrapper named after the page.
gen() { # NAME DESCRIPTION PROGRAM
  local tmp="$out/$1.1.tmp"
  help2man --no-info --no-discard-stderr --version-string="$version" \
    --name="$2" --section=1 --output="$tmp" "$3"
  if ! cmp -s "$tmp" "$out/$1.1"; then mv "$tmp" "$out/$1.1"; else rm -f "$tmp"; fi
}
abs_cli=$(cd "$(dirname "$cli")" && pwd)/$(basename "$cli")
gen jsdurable "durable, effectively-once messaging between a SQL store and NATS JetStream" "$abs_cli"
n=1
for c in $commands; do
  desc=$("$cli" --help | awk -v c="$c" '$1 == c {$1 = ""; sub(/^ +/, ""); print; exit}')
  w="$out/wrap/jsdurable-$c"
  printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$abs_cli" "$c" > "$w"
  chmod +x "$w"
  gen "jsdurable-$c" "$desc" "$w"
  n=$((n + 1))
done
echo "man: $n pages in $out"
