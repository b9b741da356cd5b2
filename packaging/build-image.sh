#!/bin/bash
# Build the ualinkd image with podman, from nothing but Debian's packages and this checkout:
#
#   packaging/build-image.sh [IMAGE]            (default ualinkd:0.1.0; `make image` runs it)
#
# Prints the image's name, then the CONTAINERS_CONF that podman needs here (an empty line when
# its defaults work).
#
#   1. a base image without any registry: debootstrap a Debian 12 minbase with python3,
#      python3-venv and fuse3, `podman import` it as $UALINK_BASE_IMAGE
#      [localhost/ualinkd-base:bookworm]; kept for the next build (set UALINK_BASE_IMAGE to
#      an image you have, e.g. docker.io/library/python:3.11-slim-bookworm, to skip this);
#   2. `podman build --format docker` (keeps the HEALTHCHECK) of packaging/Containerfile with
#      BASE = that image, from build/wheelhouse (`make wheelhouse`): no network in the build.
#
# Needs root (debootstrap), podman and debootstrap (`apt-get install podman debootstrap`).
# UALINK_DEBIAN_MIRROR [http://deb.debian.org/debian], UALINK_CACHE [/var/cache/ualinkd-images].
set -euo pipefail
cd "$(dirname "$0")/.."
me=build-image
die() { echo "$me: $1" >&2; exit 1; }

image=${1:-ualinkd:0.1.0}
base=${UALINK_BASE_IMAGE:-localhost/ualinkd-base:bookworm}
mirror=${UALINK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${UALINK_CACHE:-/var/cache/ualinkd-images}

command -v podman >/dev/null || die "podman is missing: apt-get install podman"
[ -d build/wheelhouse ] && ls build/wheelhouse/ualinkd-*.whl >/dev/null 2>&1 \
    || die "no build/wheelhouse/ualinkd-*.whl: run \`make wheelhouse\` first"

if ! podman image exists "$base"; then
    [ "$base" = localhost/ualinkd-base:bookworm ] \
        || die "base image $base is not here (podman pull it, or unset UALINK_BASE_IMAGE)"
    command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    mkdir -p "$cache/debs"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    echo "$me: debootstrap bookworm from $mirror (a few minutes the first time)" >&2
    debootstrap --variant=minbase --cache-dir="$cache/debs" \
        --include=python3,python3-venv,fuse3,ca-certificates \
        bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { tail -n 20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
    echo "$me: base image $base made" >&2
fi

# The runtime and limits this host needs (packaging/podman-probe.sh says what and why).
conf=$(packaging/podman-probe.sh "$base") || die "podman cannot run a container on this host"
[ -z "$conf" ] || export CONTAINERS_CONF="$conf"
old=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
podman build --format docker --build-arg "BASE=$base" -f packaging/Containerfile \
    -t "$image" . >&2
# The image this build replaced is left untagged (<none>, 200 MB a build): remove it unless
# it still has a tag or a container (then rmi refuses, and it stays).
new=$(podman image inspect --format '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ] \
        && [ -z "$(podman image inspect --format '{{join .RepoTags ""}}' "$old" 2>/dev/null)" ]; then
    podman rmi "$old" >/dev/null 2>&1 || true
fi
echo "$image"
echo "${conf:-}"
