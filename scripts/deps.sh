#!/usr/bin/env bash
# Install what jsdurable needs on Debian 12, and nothing when it is all there.
#
# 1. Debian packages (apt-get, as root; `apt-get update` only when a package
#    cannot be found in the current lists).
# 2. The newest nats-server Debian carries, for the fixtures, `make demo`,
#    `make check` and `make bench`: the unstable suite's nats-server package
#    (2.15 when this was written; Debian 13's 2.10 when unstable cannot be
#    had), fetched with apt-get through a private sources list and state
#    folder (the system's apt configuration is never touched) and unpacked
#    with dpkg-deb into .cache/nats-server (git-ignored). It is a Go binary
#    with no library dependencies, so it runs on Debian 12 as it is. The
#    system's own nats-server (Debian 12: 2.9.10) stays installed: the
#    compatibility lane of `make check` runs against it. When neither suite
#    can be had, the fixtures fall back to the system's server and say so.
#    JSD_NATS_SUITES (default "sid trixie") names the suites tried, in order.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(gcc make pkg-config libc6-dev
      libnats-dev libsqlite3-dev libpq-dev libjansson-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev libcmocka-dev libsystemd-dev
      nats-server postgresql sqlite3 openssl procps util-linux psmisc help2man man-db
      python3-psycopg2)
[ "${JSD_DEPS_VALGRIND:-0}" = 1 ] && PKGS+=(valgrind)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "deps: need root to run: $*" >&2; exit 1; fi
}

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/jsd-apt.log 2>&1; then
    echo "deps: refreshing package lists (apt-get update)"
    as_root apt-get update -q >/tmp/jsd-apt.log 2>&1 || { cat /tmp/jsd-apt.log >&2; exit 1; }
    as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/jsd-apt.log 2>&1 \
      || { tail -20 /tmp/jsd-apt.log >&2; exit 1; }
  fi
fi

# ---- the newest nats-server, for the fixtures ---------------------------------
cache=.cache/nats-server
suites=${JSD_NATS_SUITES:-sid trixie}
# A cache unpacked from another suite list (an older checkout took trixie's
# 2.10) is fetched again; so is a cache that had found nothing.
if [ -e "$cache" ] && [ "$(cat "$cache/suites" 2>/dev/null)" != "$suites" ]; then
  rm -rf "$cache"
fi

fetch_nats() { # fetch_nats SUITE WORK: download SUITE's nats-server .deb into WORK
  local suite=$1 work=$2 keyring=/usr/share/keyrings/debian-archive-keyring.gpg mirror
  rm -rf "$work" && mkdir -p "$work/etc/sources.list.d" "$work/etc/preferences.d" \
    "$work/state/lists/partial" "$work/cache/archives/partial"
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb / && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || return 1
  echo "deb [signed-by=$keyring] ${mirror%/} $suite main" > "$work/etc/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$work/etc/sources.list" -o "Dir::Etc::SourceParts=$work/etc/sources.list.d"
            -o "Dir::Etc::Preferences=$work/etc/preferences" -o "Dir::Etc::PreferencesParts=$work/etc/preferences.d"
            -o "Dir::State=$work/state" -o "Dir::State::status=/dev/null" -o "Dir::Cache=$work/cache"
            -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
  timeout 180 apt-get "${apt_opts[@]}" -q update >"$work.log" 2>&1 &&
    (cd "$work" && timeout 180 apt-get "${apt_opts[@]}" -q download nats-server >>"$work.log" 2>&1) &&
    ls "$work"/nats-server_*.deb > /dev/null 2>&1
}

if [ ! -x "$cache/nats-server" ] && [ "${JSD_NO_NATS_NEW:-${JSD_NO_NATS_210:-0}}" != 1 ] && [ ! -e "$cache/unavailable" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work" "$work".*' EXIT
  got=""
  for suite in $suites; do
    if fetch_nats "$suite" "$work/$suite"; then got=$suite; break; fi
    echo "deps: notice: no nats-server from Debian's $suite suite ($(tail -1 "$work/$suite.log" 2>/dev/null))" >&2
  done
  if [ -n "$got" ]; then
    deb=$(ls "$work/$got"/nats-server_*.deb | head -1)
    dpkg-deb -x "$deb" "$work/x"
    bin=$(find "$work/x" -type f -name nats-server -perm -u+x | head -1)
    install -m 755 "$bin" "$cache/nats-server"
    basename "$deb" > "$cache/source"
    echo "deps: nats-server $("$cache/nats-server" --version | awk '{print $2}') (Debian $got) unpacked into $cache"
  else
    echo "deps: notice: could not fetch a newer nats-server; fixtures use the system's $(nats-server --version 2>/dev/null) (no sync_interval: always, no atomic batches)" >&2
    touch "$cache/unavailable"
  fi
  printf '%s\n' "$suites" > "$cache/suites"
fi
exit 0
