#!/usr/bin/env bash
# Builds the container images the testcontainers runs use, each only if it is missing
# (`--force` rebuilds all). No image registry is needed: the Debian bases come from
# debootstrap against the mirror apt already uses here, and the server images install
# Debian's own packages on top of them.
#
#   dblock/debian:bookworm, dblock/debian:trixie   minbase roots (docker import)
#   dblock/postgres:15      PostgreSQL 15 (bookworm)   like the official postgres image
#   dblock/mariadb:10.11    MariaDB 10.11 (bookworm)   like the official mariadb image
#   dblock/postgres:17      PostgreSQL 17 (trixie)
#   dblock/mariadb:11.8     MariaDB 11.8 (trixie)
#   dblock/pgbouncer:1.24   PgBouncer 1.24 (trixie), see pgbouncer/entrypoint.sh
#
# Environment: DBLOCK_CI_DEBIAN_MIRROR overrides the mirror read from apt's sources.
# Prints one timing line per step that ran.
set -euo pipefail
cd "$(dirname "$0")"

force=false
[ "${1:-}" = --force ] && force=true

roots=() # debootstrap directories, removed at exit
trap 'rm -rf "${roots[@]}"' EXIT

have() { ! $force && docker image inspect "$1" >/dev/null 2>&1; }

timed() { # label, log file, command...: runs it with its output in the log
  local label=$1 log=$2 start=$SECONDS; shift 2
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "images: $label failed (log: $log)" >&2
    return 1
  fi
  rm -f "$log"
  echo "images: $label took $((SECONDS - start)) s"
}

# The Debian mirror apt uses on this machine: the first non-security URI of a deb
# entry, from deb822 .sources files or one-line .list files.
mirror() {
  if [ -n "${DBLOCK_CI_DEBIAN_MIRROR:-}" ]; then echo "$DBLOCK_CI_DEBIAN_MIRROR"; return; fi
  local files=() m
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && files+=("$f")
  done
  m=$({
    awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "${files[@]}"
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i !~ /=/) { print $i; break } }' "${files[@]}"
  } 2>/dev/null | grep -E '^https?://' | grep -v -- '-security' | grep -i debian | head -n1)
  [ -n "$m" ] || { echo "images: no Debian mirror found in apt's sources; set DBLOCK_CI_DEBIAN_MIRROR" >&2; return 1; }
  echo "$m"
}

based=" " # bases built by this run (--force rebuilds each once)
base() { # suite
  local suite=$1 name=dblock/debian:$1 dir
  [[ $based == *" $suite "* ]] && return 0
  based+="$suite "
  have "$name" && return 0
  dir=$(mktemp -d /tmp/dblock-debootstrap-"$suite".XXXXXX)
  roots+=("$dir")
  local url; url=$(mirror)
  echo "images: debootstrap $suite from $url"
  timed "debootstrap $suite" "$dir.log" debootstrap --variant=minbase "$suite" "$dir" "$url"
  # Keep the image small: package lists and caches are fetched again inside each build.
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | docker import - "$name" >/dev/null
  rm -rf "$dir"
}

# An image is rebuilt when its context (Dockerfile, entrypoint) or build arguments
# changed since it was built: the build records their hash as a label.
source_hash() { # context, build args...
  local context=$1; shift
  { (cd "$context" && find . -type f -print0 | sort -z | xargs -0 sha256sum); echo "$@"; } \
    | sha256sum | cut -c1-16
}

current() { # name, hash
  have "$1" && [ "$(docker image inspect -f '{{index .Config.Labels "dblock.source"}}' "$1")" = "$2" ]
}

image() { # name, context, base suite, build args...
  local name=$1 context=$2 suite=$3; shift 3
  local hash; hash=$(source_hash "$context" "$suite" "$@")
  current "$name" "$hash" && return 0
  base "$suite"
  local args=(--build-arg "BASE=dblock/debian:$suite" --label "dblock.source=$hash")
  for a in "$@"; do args+=(--build-arg "$a"); done
  timed "build $name" "$(mktemp /tmp/dblock-image-build.XXXXXX)" \
    env DOCKER_BUILDKIT=0 docker build --force-rm -t "$name" "${args[@]}" "$context"
}

# Two chains, one per Debian suite, side by side: debootstrap mostly waits on the mirror
# while the other chain's builds use the CPU.
chain() { # image specs, separated by ";"
  trap 'rm -rf "${roots[@]}"' EXIT
  local spec
  while IFS= read -r spec; do
    # shellcheck disable=SC2086 # a spec is a word list
    [ -n "$spec" ] && image $spec
  done < <(tr ';' '\n' <<<"$1")
}
chain "dblock/postgres:15 postgres bookworm PG_MAJOR=15;
  dblock/mariadb:10.11 mariadb bookworm MARIADB_VERSION=10.11" &
bookworm=$!
chain "dblock/postgres:17 postgres trixie PG_MAJOR=17;
  dblock/mariadb:11.8 mariadb trixie MARIADB_VERSION=11.8;
  dblock/pgbouncer:1.24 pgbouncer trixie PGBOUNCER_VERSION=1.24" &
trixie=$!
rc=0
wait "$bookworm" || rc=1
wait "$trixie" || rc=1
[ "$rc" = 0 ] || echo "images: a build failed" >&2
exit "$rc"
