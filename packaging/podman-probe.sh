#!/bin/bash
# What podman needs on this host, found by trying: prints the path of a containers.conf to
# use as CONTAINERS_CONF (empty when podman's defaults run a container), and says on stderr
# what it changed and why.
#
#   packaging/podman-probe.sh IMAGE            (an image that has /bin/true)
#
# Seen on Debian 12 hosts: crun refuses a cgroup v1/v2 hybrid ("cgroups in hybrid mode not
# supported") where runc works; without CAP_SYS_RESOURCE the default RLIMIT_NOFILE (1048576)
# and RLIMIT_NPROC of a container cannot be set, so the limits must stay below this host's.
set -uo pipefail
image=${1:?usage: podman-probe.sh IMAGE}
cache=${UALINK_CACHE:-/var/cache/ualinkd-images}
mkdir -p "$cache"
try() { CONTAINERS_CONF=${1:-} podman run --rm --network none --entrypoint /bin/true "$image" 2>&1; }

if out=$(try ""); then
    echo ""
    exit 0
fi
echo "podman-probe: the defaults fail: $out" >&2
runtimes=$(for r in crun runc; do command -v "$r" >/dev/null && echo "$r"; done)
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
conf="$cache/containers.conf"
for runtime in $runtimes; do
    for nproc in "$(ulimit -Hu)" 32768 4096; do
        [ "$nproc" = unlimited ] && nproc=32768
        printf '# written by packaging/podman-probe.sh\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "%s"\n' \
            "$nofile" "$nofile" "$nproc" "$nproc" "$runtime" >"$conf"
        if try "$conf" >/dev/null; then
            echo "podman-probe: using runtime $runtime, nofile=$nofile, nproc=$nproc ($conf)" >&2
            echo "$conf"
            exit 0
        fi
    done
done
echo "podman-probe: no runtime ($runtimes) and limits run a container here; install runc" \
     "(apt-get install runc) or give the host CAP_SYS_RESOURCE" >&2
exit 1
