#!/bin/bash
# Container entrypoint: one ualinkd node.
#
#   1. validate the pod config (and splice in the pod key from UALINK_KEY_FILE or UALINK_KEY,
#      if set),
#   2. create the mount point and clear a stale FUSE mount left there by a dead daemon,
#   3. wait until this node's own fabric address resolves (headless-service DNS records
#      appear a moment after the pod starts), then
#   4. exec ualinkd node --config CONFIG --node "$UALINK_NODE" --mount /run/ualinkd/node
#      (exec: the daemon is the container's main process, gets SIGTERM and unmounts).
#
# Needs /dev/fuse and CAP_SYS_ADMIN (mount(2) of the FUSE file system), e.g.
#   docker run --device /dev/fuse --cap-add SYS_ADMIN --security-opt apparmor:unconfined …
#
# Environment (defaults in brackets):
#   UALINK_NODE       this node's name in the pod config [the host name]
#   UALINK_CONFIG     the pod's TOML [/etc/ualinkd/pod.toml]
#   UALINK_KEY_FILE   a file holding the pod key (hex); replaces [pod] key of the config
#                     (or none: a config from `ualinkd node-config` holds this node's keys)
#   UALINK_KEY        the pod key itself, where a secret comes as an environment variable
#                     (podman kube play: no Secret volumes); not passed on to the daemon
#   UALINK_MOUNT      the mount point [/run/ualinkd/node]
#   UALINK_RUNDIR     where the effective config goes when a key is spliced in [/run/ualinkd]
#   UALINK_DNS_WAIT   seconds to wait for our own address to resolve [60]
#   UALINK_TRACE      text|json: trace every ioctl to stdout
#   UALINK_DRY_RUN=1  validate and print the command instead of running it
#   UALINKD, UALINK_PYTHON  the ualinkd command and the python that has ualinkd [ualinkd, python3]
# Extra arguments are passed on to `ualinkd node`.
set -euo pipefail

me=ualinkd-entrypoint
die() { echo "$me: $1" >&2; exit "${2:-1}"; }

node=${UALINK_NODE:-$(hostname)}
config=${UALINK_CONFIG:-/etc/ualinkd/pod.toml}
mount=${UALINK_MOUNT:-/run/ualinkd/node}
rundir=${UALINK_RUNDIR:-/run/ualinkd}
python=${UALINK_PYTHON:-python3}
ualinkd=${UALINKD:-ualinkd}
dry_run=${UALINK_DRY_RUN:-0}

[ -n "$node" ] || die "UALINK_NODE is not set (this node's name in $config)" 2
[ -r "$config" ] || die "no pod config at $config (mount it there, or set UALINK_CONFIG)" 2
if [ -n "${UALINK_KEY_FILE:-}" ] && [ ! -r "$UALINK_KEY_FILE" ]; then
    die "UALINK_KEY_FILE=$UALINK_KEY_FILE cannot be read" 2
fi
if [ -n "${UALINK_KEY_FILE:-}" ] && [ -n "${UALINK_KEY:-}" ]; then
    die "UALINK_KEY_FILE and UALINK_KEY are both set: give the pod key one way" 2
fi

# The run directory also holds the trace socket, whose directory a daemon refuses when others
# may write it (replay/record.py check_trace_dir): an orchestrator's emptyDir is mode 0777.
if [ -d "$rundir" ] && [ -O "$rundir" ]; then
    chmod go-w "$rundir" || die "cannot make $rundir ours alone (chmod go-w)"
fi

# 1. Validate with ualinkd's own loader. Prints the config to run and our address's host.
validated=$(
    UALINK_NODE="$node" UALINK_CONFIG="$config" UALINK_RUNDIR="$rundir" \
    "$python" - <<'EOF'
import os, sys, tomllib
from ualinkd.config import ConfigError, PodConfig
from ualinkd.fabric.auth import node_keys
from ualinkd.fabric.link import parse_address

path, node = os.environ["UALINK_CONFIG"], os.environ["UALINK_NODE"]
try:
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    key_file = os.environ.get("UALINK_KEY_FILE")
    key = os.environ.get("UALINK_KEY", "").strip()
    if key_file:
        with open(key_file) as f:
            key = f.read().strip()
    if key:
        doc.setdefault("pod", {})["key"] = key
    cfg = PodConfig.from_dict(doc, path)
    node_keys(cfg, node)  # the pod key, or this node's own link keys (ualinkd node-config)
    host, _ = parse_address(cfg.node(node).address)
except tomllib.TOMLDecodeError as e:
    sys.exit(f"ualinkd-entrypoint: invalid pod config: {path}: not valid TOML: {e}")
except (ConfigError, OSError) as e:
    sys.exit(f"ualinkd-entrypoint: invalid pod config: {e}")
if key:  # the daemon reads one file: write the config with the key, readable by root only
    rundir = os.environ["UALINK_RUNDIR"]
    os.makedirs(rundir, exist_ok=True)
    path = os.path.join(rundir, "pod.toml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(cfg.to_toml())
print(os.path.abspath(path))
print(host)
EOF
) || exit 2
unset UALINK_KEY  # in the config copy now; the daemon's environment need not hold it
run_config=$(sed -n 1p <<<"$validated")
host=$(sed -n 2p <<<"$validated")

# A dry run only says what it would run: it needs no device.
[ -c /dev/fuse ] || [ "$dry_run" = 1 ] \
    || die "no /dev/fuse: run the container with --device /dev/fuse and --cap-add SYS_ADMIN"

# 2. The mount point, and a stale FUSE mount on it (its daemon died: stat fails ENOTCONN).
is_fuse_mount() {
    awk -v p="$1" '{ for (i = 7; i <= NF; i++) if ($i == "-") break;
                     if ($5 == p && $(i + 1) ~ /^fuse/) found = 1 }
                   END { exit !found }' /proc/self/mountinfo
}
mount=$(realpath -m "$mount")
if is_fuse_mount "$mount" && ! stat "$mount" >/dev/null 2>&1; then
    if [ "$dry_run" = 1 ]; then
        echo "$me: would clear the stale FUSE mount at $mount" >&2
    else
        echo "$me: clearing the stale FUSE mount at $mount" >&2
        umount -l "$mount" 2>/dev/null || fusermount3 -uz "$mount" \
            || die "could not clear the stale FUSE mount at $mount"
    fi
fi
mkdir -p "$mount"

# 3. Our own address must resolve before the daemon can listen on it. Said when it does
#    not at once (a StatefulSet's headless-Service record comes a moment after the pod
#    starts; a name that never comes is a wrong address or Service), and every 10 s.
if [[ ! $host =~ ^[0-9.]+$ && $host != *:* && $dry_run != 1 ]]; then  # a name, not an IP
    wait_s=${UALINK_DNS_WAIT:-60}
    waited=0
    until getent hosts "$host" >/dev/null; do
        if [ "$waited" -ge "$wait_s" ]; then
            die "our fabric address $host does not resolve after ${wait_s}s (the pod \
config's address for $node; in Kubernetes, the headless Service that names the pods; \
UALINK_DNS_WAIT sets the wait)"
        fi
        if [ $((waited % 10)) = 0 ]; then
            echo "$me: waiting for our fabric address $host to resolve" \
                 "($((wait_s - waited))s left)" >&2
        fi
        sleep 1
        waited=$((waited + 1))
    done
    [ "$waited" = 0 ] || echo "$me: $host resolves after ${waited}s" >&2
fi

# 4. The daemon.
cmd=("$ualinkd" node --config "$run_config" --node "$node" --mount "$mount")
[ -z "${UALINK_TRACE:-}" ] || cmd+=("--trace=$UALINK_TRACE")
cmd+=("$@")
if [ "$dry_run" = 1 ]; then
    printf '%q ' exec "${cmd[@]}" | sed 's/ $//'
    echo
    exit 0
fi
exec "${cmd[@]}"
