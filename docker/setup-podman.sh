#!/usr/bin/env bash
# Sets up podman on a Debian machine that has neither a Docker engine nor Docker Hub
# (shared/reference/containers.md): installs podman + runc + debootstrap, writes a containers.conf
# (runc, since crun cannot run on hybrid cgroups; ulimits the sandbox allows), and, when the
# registry cannot be reached, builds a stand-in base image with debootstrap.
#
#   docker/setup-podman.sh CONF_DIR BASE_IMAGE   -> prints the base image to build FROM
# CONF_DIR receives containers.conf (export CONTAINERS_CONF=CONF_DIR/containers.conf afterwards).
set -euo pipefail
conf_dir=$1
base=$2
standin=localhost/grpo-lens-base:bookworm-python3.11

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    echo "docker-test: installing podman, runc, debootstrap (once)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >&2
fi

mkdir -p "$conf_dir"
cat > "$conf_dir/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF=$conf_dir/containers.conf

# The pinned base when it is here or can be pulled; never --pull on build.
if podman image exists "$base" || timeout 300 podman pull -q "$base" >/dev/null 2>&1; then
    echo "$base"
    exit 0
fi
if ! podman image exists "$standin"; then
    echo "docker-test: registry unreachable; building the stand-in base $standin with debootstrap (once)" >&2
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    rootfs=$(mktemp -d /var/tmp/grpo-lens-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
        bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >&2
    rm -f "$rootfs"/usr/lib/python3.11/EXTERNALLY-MANAGED
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' - "$standin" >&2
fi
echo "$standin"
