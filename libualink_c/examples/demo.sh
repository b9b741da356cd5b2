#!/usr/bin/env bash
# `make demo`: a local two-node pod, a C client exporting a VRAM buffer on node0, another
# process importing it, and what the daemons traced. Stops the pod on the way out.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=libualink_c/build
ROOT=$(mktemp -d /tmp/ualink-demo.XXXXXX)
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

.venv/bin/ualinkd pod --nodes 2 --root "$ROOT" --trace >"$ROOT/pod.out" 2>"$ROOT/pod.log" &
POD=$!
cleanup() {
  exec 3>&- 2>/dev/null || true
  kill -TERM "$POD" 2>/dev/null && wait "$POD" 2>/dev/null || true
  rm -rf "$ROOT"
}
trap cleanup EXIT

for _ in $(seq 300); do
  [ "$(grep -c ' ready: ' "$ROOT/pod.out" 2>/dev/null)" = 2 ] && break
  kill -0 "$POD" 2>/dev/null || { cat "$ROOT/pod.log"; exit 1; }
  sleep 0.1
done
step "ualinkd pod --nodes 2 --root $ROOT"
grep ' ready: ' "$ROOT/pod.out"
step "ualinkctl --mount $ROOT/node0 state"
.venv/bin/ualinkctl --mount "$ROOT/node0" state

step "client A exports a 2 MiB VRAM BO on node0 (and keeps it open)"
mkfifo "$ROOT/hold"
"$BIN/export" "$ROOT/node0/dri/renderD128" --wait <"$ROOT/hold" >"$ROOT/export.out" &
EXPORTER=$!
exec 3>"$ROOT/hold"
for _ in $(seq 100); do grep -q '^handle=' "$ROOT/export.out" && break; sleep 0.05; done
cat "$ROOT/export.out"
HANDLE=$(grep -o '^handle=[0-9a-f]*' "$ROOT/export.out" | head -1 | cut -d= -f2)

step "client B (another process) imports it on node0: the local path gives a real dma-buf fd"
"$BIN/import" "$ROOT/node0/dri/renderD128" "$HANDLE" || true

step "client C imports it on node1: HELLO, NPA_REQ and NPA_RSP cross the TCP fabric"
"$BIN/import" "$ROOT/node1/dri/renderD128" "$HANDLE" || true
echo "node0 exports:  $(cat "$ROOT/node0/sys/kernel/debug/dri/128/ualink_exports")"
echo "node1 imports:  $(cat "$ROOT/node1/sys/kernel/debug/dri/128/ualink_imports")"
echo "node1 peers:    $(cat "$ROOT/node1/sys/kernel/debug/dri/128/ualink_peers")"

step "client A exits: its last GEM handle goes, handle_free revokes: NPA_REVOKE -> NPA_RELEASE"
exec 3>&-
wait "$EXPORTER" || true
sleep 0.2
echo "node1 imports:  '$(cat "$ROOT/node1/sys/kernel/debug/dri/128/ualink_imports")' (torn down)"
"$BIN/import" "$ROOT/node1/dri/renderD128" "$HANDLE" || true

step "what node0 and node1 traced (ualinkd pod --trace)"
grep -v ' ready: ' "$ROOT/pod.out" || true
