"""Per-remote connection state and importer node state, as transition tables (spec §5.4, §5.5).

Each table maps (state, event) to the next state; anything not in a table is a no-op for
that event. The manager applies the side effects (generation counts, cleanup, messages).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..amdgpu.bo import AmdgpuBo
    from ..drm.gem import DmaBuf


class ConnState(enum.IntEnum):
    NOT_READY = 0
    IN_PROGRESS = 1
    PENDING = 2
    ESTABLISHED = 3


class ConnEvent(enum.Enum):
    SETUP = "local setup_connection"
    HELLO_FAILED = "HELLO send failed / wait interrupted / timed out"
    HELLO_ACK = "HELLO_ACK received"
    HELLO = "HELLO received"
    ACK_SENT = "our HELLO_ACK was accepted"
    ACK_SEND_FAILED = "our HELLO_ACK could not be sent"
    RESET = "connection reset (§5.8): NPA_RSP timeout, missing NPA_RELEASE, failed REVOKE"
    RESET_FOR_HELLO = "connection reset requested by a HELLO while ESTABLISHED"
    STOP = "manager stop/start"
    RESYNCED = "setup_connection's probe found the peer restarted (§13 N2)"
    HELLO_PROBE_FAILED = "the sender of a HELLO could not be probed (§13 N2)"


_C = ConnState
_E = ConnEvent
# §5.4. SETUP from IN_PROGRESS/PENDING answers EAGAIN; from ESTABLISHED returns at once.
CONN_TRANSITIONS: dict[tuple[ConnState, ConnEvent], ConnState] = {
    (_C.NOT_READY, _E.SETUP): _C.IN_PROGRESS,
    (_C.IN_PROGRESS, _E.HELLO_FAILED): _C.NOT_READY,
    (_C.IN_PROGRESS, _E.HELLO_ACK): _C.ESTABLISHED,
    (_C.NOT_READY, _E.HELLO): _C.PENDING,
    (_C.IN_PROGRESS, _E.HELLO): _C.IN_PROGRESS,  # simultaneous open
    (_C.PENDING, _E.HELLO): _C.PENDING,
    (_C.ESTABLISHED, _E.HELLO): _C.PENDING,  # the peer restarted
    (_C.PENDING, _E.ACK_SENT): _C.ESTABLISHED,
    (_C.IN_PROGRESS, _E.ACK_SENT): _C.ESTABLISHED,
    (_C.PENDING, _E.ACK_SEND_FAILED): _C.NOT_READY,
    (_C.IN_PROGRESS, _E.ACK_SEND_FAILED): _C.IN_PROGRESS,
    # §5.8: only from ESTABLISHED (the caller also checks the generation).
    (_C.ESTABLISHED, _E.RESET): _C.NOT_READY,
    (_C.ESTABLISHED, _E.RESET_FOR_HELLO): _C.PENDING,
    # §13 N2 (not in U): an ESTABLISHED connection with nothing shared whose peer restarted
    # is set up again as from NOT_READY; a HELLO whose sender cannot be probed is not
    # answered.
    (_C.ESTABLISHED, _E.RESYNCED): _C.IN_PROGRESS,
    (_C.PENDING, _E.HELLO_PROBE_FAILED): _C.NOT_READY,
    (_C.IN_PROGRESS, _E.HELLO_PROBE_FAILED): _C.NOT_READY,
    **{(s, _E.STOP): _C.NOT_READY for s in ConnState},
}


@dataclass(slots=True)
class PeerConn:
    """One remote accel as seen from a local accel."""

    remote: int
    state: ConnState = ConnState.NOT_READY
    generation: int = 0  # +1 every time the state becomes ESTABLISHED; never reset
    # §13 N2: the peer's incarnation as our last probe read it (None: not probed since our
    # manager started); a probe reading another one finds the peer "resynced".
    peer_incarnation: int | None = None

    def takes(self, event: ConnEvent) -> bool:
        """True if the table has a row for `event` from the current state."""
        return (self.state, event) in CONN_TRANSITIONS

    def apply(self, event: ConnEvent) -> bool:
        """Take the transition; True if the state became ESTABLISHED by it."""
        nxt = CONN_TRANSITIONS.get((self.state, event))
        if nxt is None:
            return False
        became = nxt == ConnState.ESTABLISHED and self.state != ConnState.ESTABLISHED
        self.state = nxt
        if became:
            self.generation = (self.generation + 1) & 0xFFFFFFFF
        return became

    def ready_generation(self) -> int:
        """The helper of §5.4: the current generation if ESTABLISHED, else 0."""
        return self.generation if self.state == ConnState.ESTABLISHED else 0


class NodeState(enum.IntEnum):
    NOT_READY = 0
    PENDING = 1
    READY = 2
    TEARDOWN = 3


class NodeEvent(enum.Enum):
    ANSWER = "NPA_RSP or NPA_FAIL from the exporter"
    WAITER_OK = "waiter created the NPA BO"
    REVOKE = "NPA_REVOKE with matching handle_hi"
    RESET = "connection reset towards the exporter"
    STOP = "manager stop"


# §5.5. WAITER_FAILED is not a state: a failed node is removed from the table. NPA_REVOKE
# tears down a node in any state but TEARDOWN (§5.7 "NPA_REVOKE receipt" checks only the
# handle): the exporter records an importer before its NPA_RSP is delivered, so a revoke
# can overtake the answer; the waiter then fails (EINVAL) instead of making a dead node
# READY that the dedupe path would hand out forever.
NODE_TRANSITIONS: dict[tuple[NodeState, NodeEvent], NodeState] = {
    (NodeState.NOT_READY, NodeEvent.ANSWER): NodeState.PENDING,
    (NodeState.PENDING, NodeEvent.WAITER_OK): NodeState.READY,
    (NodeState.NOT_READY, NodeEvent.REVOKE): NodeState.TEARDOWN,
    (NodeState.PENDING, NodeEvent.REVOKE): NodeState.TEARDOWN,
    (NodeState.READY, NodeEvent.REVOKE): NodeState.TEARDOWN,
    (NodeState.READY, NodeEvent.RESET): NodeState.TEARDOWN,
    **{(s, NodeEvent.STOP): NodeState.TEARDOWN for s in NodeState},
}


@dataclass(slots=True)
class ImportNode:
    """An import table entry, keyed by handle_lo (§6.2)."""

    handle_lo: int
    handle_hi: int
    exporter: int
    state: NodeState = NodeState.NOT_READY
    npa_offset: int = 0
    size_pages: int = 0
    fail_reason: int = 0
    bo: AmdgpuBo | None = None
    buf: DmaBuf | None = None
    internal_handle: int = 0
    linked: bool = False  # READY and counted in the manager's per-exporter imports (§13 N2)

    def apply(self, event: NodeEvent) -> bool:
        nxt = NODE_TRANSITIONS.get((self.state, event))
        if nxt is None:
            return False
        self.state = nxt
        return True


@dataclass(slots=True)
class ImporterRecord:
    """An exporter's record of one importer of one export (§5.6 step 8)."""

    npa_start: int  # in this accel's allocator (GPU id bits included in SI mode)
    pages: int
    generation: int


@dataclass(slots=True)
class RevokeState:
    """An export in the "handle invalid" table while its revoke runs (§5.7)."""

    expected: set[int] = field(default_factory=set)  # importers whose RELEASE is awaited
    unsent: int = 0  # NPA_REVOKE sends whose outcome is not known yet
    deadline: float | None = None  # §5.7 step 6: the 5 s wait, armed once all are sent
