#!/usr/bin/env bash
# `make demo`: a local two-node pod; a C client on node0 puts a message in VRAM and exports
# it; a client on node1 imports it, maps it and loads/stores it through its GPU across the
# fabric; the exporter lets go and the importer's next load faults. Then the same across the
# fabric with the GPU's SDMA engine: a libhsakmt SDMA queue on node1 copies node0's VRAM to
# host memory and back, and faults once node0 frees it. Stops the pod at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=libualink_c/build
ROOT=$(mktemp -d /tmp/ualink-demo.XXXXXX)
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
debug() { cat "$ROOT/$1/sys/kernel/debug/dri/128/$2"; }

.venv/bin/ualinkd pod --nodes 2 --root "$ROOT" --trace=json --trace-file "$ROOT/trace.jsonl" \
  >"$ROOT/pod.out" 2>"$ROOT/pod.log" &
POD=$!
cleanup() {
  exec 3>&- 4>&- 5>&- 6>&- 2>/dev/null || true
  kill -TERM "$POD" 2>/dev/null && wait "$POD" 2>/dev/null || true
  rm -rf "$ROOT"
}
trap cleanup EXIT
wait_for() {  # wait_for FILE PATTERN
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$ROOT/pod.log" >&2; exit 1
}

for _ in $(seq 300); do
  [ "$(grep -c ' ready: ' "$ROOT/pod.out" 2>/dev/null)" = 2 ] && break
  kill -0 "$POD" 2>/dev/null || { cat "$ROOT/pod.log"; exit 1; }
  sleep 0.1
done
step "ualinkd pod --nodes 2 --root $ROOT"
grep ' ready: ' "$ROOT/pod.out"
.venv/bin/ualinkctl --mount "$ROOT/node0" state

step "node0: an unmodified libdrm_amdgpu program (Debian's libdrm, through the LD_PRELOAD shim)"
echo "LD_PRELOAD=$BIN/libualink_shim.so UALINK_DRI_DIR=$ROOT/node0/dri $BIN/libdrm_discovery"
LD_PRELOAD=$BIN/libualink_shim.so UALINK_DRI_DIR=$ROOT/node0/dri "$BIN/libdrm_discovery" \
  | grep -E '^ok (get_device|node_type|device_name|render_name|version|init|query_gpu_info|heap_vram|dev_info)( |$)' \
  | cut -c1-110

step "node0: client A stores a message in a VRAM buffer through its GPU and exports it"
mkfifo "$ROOT/a.in" "$ROOT/b.in"
"$BIN/share" "$ROOT/node0/dri/renderD128" <"$ROOT/a.in" >"$ROOT/a.out" &
SHARE=$!
exec 3>"$ROOT/a.in"
wait_for "$ROOT/a.out" '^handle='
cat "$ROOT/a.out"
HANDLE=$(grep -o '^handle=[0-9a-f]*' "$ROOT/a.out" | cut -d= -f2)

step "node0: client B (another process) imports it locally: a real dma-buf fd of the same BO"
"$BIN/import" "$ROOT/node0/dri/renderD128" "$HANDLE"

step "node1: client C imports it over the fabric, maps it at a GPU VA, loads and stores"
"$BIN/peer" "$ROOT/node1/dri/renderD128" "$HANDLE" <"$ROOT/b.in" >"$ROOT/b.out" 3>&- &
PEER=$!
exec 4>"$ROOT/b.in"
wait_for "$ROOT/b.out" 'importer stores'
cat "$ROOT/b.out"
echo "node0 exports: $(debug node0 ualink_exports)"
echo "node1 imports: $(debug node1 ualink_imports)"
echo "node1 peers:   $(debug node1 ualink_peers)"

step "node0: client A loads what node1 stored, then exits: handle_free revokes the export"
exec 3>&-
wait "$SHARE"
tail -n 1 "$ROOT/a.out"
for _ in $(seq 100); do [ -z "$(debug node1 ualink_imports)" ] && break; sleep 0.05; done
echo "node1 imports: '$(debug node1 ualink_imports)' (NPA_REVOKE -> NPA_RELEASE)"

step "node1: client C loads again: the mapping is still there, the memory is not"
echo load >&4
wait_for "$ROOT/b.out" 'importer load at'
tail -n 1 "$ROOT/b.out"
echo "node1 gpu_faults: $(debug node1 gpu_faults)"
exec 4>&-
wait "$PEER"

if [ -x "$BIN/fabric_sdma" ]; then
  step "node0 -> node1 by the SDMA engine: libhsakmt's SDMA queue copies remote VRAM (fabric_sdma)"
  SHIM="env LD_PRELOAD=$BIN/libualink_shim.so"
  mkfifo "$ROOT/e.in" "$ROOT/i.in"
  $SHIM UALINK_DRI_DIR="$ROOT/node0/dri" "$BIN/fabric_sdma" export <"$ROOT/e.in" >"$ROOT/e.out" &
  EXP=$!
  exec 5>"$ROOT/e.in"
  wait_for "$ROOT/e.out" '^ok export'
  echo "node0 exporter: $(cat "$ROOT/e.out")"
  read -r LO HI < <(sed -n 's/^ok export lo=\([^ ]*\) hi=\([^ ]*\).*/\1 \2/p' "$ROOT/e.out")
  $SHIM UALINK_DRI_DIR="$ROOT/node1/dri" "$BIN/fabric_sdma" import "$LO" "$HI" \
    <"$ROOT/i.in" >"$ROOT/i.out" 5>&- &
  IMP=$!
  exec 6>"$ROOT/i.in"
  wait_for "$ROOT/i.out" '^ok copy_host_to_remote\|^fail'
  sed 's/^/node1 importer: /' "$ROOT/i.out"
  echo "check 1048576 1048576 2" >&5
  wait_for "$ROOT/e.out" '^ok check'
  echo "node0 sees the importer's SDMA store in its own VRAM: $(grep '^ok check' "$ROOT/e.out")"
  echo free >&5
  wait_for "$ROOT/e.out" '^ok freed'
  echo again >&6
  exec 6>&-
  wait "$IMP" || true
  echo "node1 after node0 freed the BO: $(grep -E '^(ok revoked_copy|fail)' "$ROOT/i.out")"
  echo "node1 gpu_faults: $(debug node1 gpu_faults)"
  exec 5>&-
  wait "$EXP" || true
fi

step "what the daemons traced, in start order (ualinkd timeline --text --no-discovery): ioctls, GPU loads/stores, fabric messages"
.venv/bin/ualinkd timeline "$ROOT/trace.jsonl" --text --no-discovery

step "the same as a timeline: a track per node, a thread per client, fabric messages as arrows"
TIMELINE=${UALINK_DEMO_TIMELINE:-/tmp/ualink-demo-timeline.json}
.venv/bin/ualinkd timeline "$ROOT/trace.jsonl" -o "$TIMELINE" 2>/dev/null
echo "timeline: $TIMELINE (open it in https://ui.perfetto.dev or chrome://tracing)"
