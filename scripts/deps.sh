#!/usr/bin/env bash
# Install what jsdurable needs on Debian 12, and nothing when it is all there.
#
# 1. Debian packages (apt-get, as root; `apt-get update` only when a package
#    cannot be found in the current lists).
# 2. A newer nats-server for the test fixtures: Debian 13's nats-server 2.10
#    package, fetched with apt-get through a private sources list and state
#    folder (the system's apt configuration is never touched) and unpacked
#    with dpkg-deb into .cache/ (git-ignored). 2.10 knows `sync_interval:
#    always`, so acknowledged writes are on disk. When it cannot be had, the
#    fixtures fall back to the system's nats-server 2.9.10 and say so.
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

# ---- nats-server 2.10 for the fixtures ------------------------------------------
cache=.cache/nats-server
if [ ! -x "$cache/nats-server" ] && [ "${JSD_NO_NATS_210:-0}" != 1 ] && [ ! -e "$cache/unavailable" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/etc/sources.list.d" "$work/etc/preferences.d" "$work/state/lists/partial" \
           "$work/cache/archives/partial"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb / && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
  echo "deb [signed-by=$keyring] ${mirror%/} trixie main" > "$work/etc/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$work/etc/sources.list" -o "Dir::Etc::SourceParts=$work/etc/sources.list.d"
            -o "Dir::Etc::Preferences=$work/etc/preferences" -o "Dir::Etc::PreferencesParts=$work/etc/preferences.d"
            -o "Dir::State=$work/state" -o "Dir::State::status=/dev/null" -o "Dir::Cache=$work/cache"
            -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
  if [ -n "$mirror" ] && timeout 120 apt-get "${apt_opts[@]}" -q update >"$work/log" 2>&1 \
     && (cd "$work" && timeout 120 apt-get "${apt_opts[@]}" -q download nats-server >>"$work/log" 2>&1); then
    deb=$(ls "$work"/nats-server_*.deb | head -1)
    dpkg-deb -x "$deb" "$work/x"
    bin=$(find "$work/x" -type f -name nats-server -perm -u+x | head -1)
    install -m 755 "$bin" "$cache/nats-server"
    basename "$deb" > "$cache/source"
    echo "deps: nats-server $("$cache/nats-server" --version | awk '{print $2}') unpacked into $cache"
  else
    echo "deps: notice: could not fetch nats-server 2.10; fixtures use the system's $(nats-server --version 2>/dev/null) (no sync_interval: always)" >&2
    touch "$cache/unavailable"
  fi
fi
exit 0
