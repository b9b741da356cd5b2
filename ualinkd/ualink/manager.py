"""One accel's UALink manager (sans-IO): state, exports, imports, NPA space, peers, and the
UALink flows that run between them (spec §1.6, §3, §4, §5.4–§5.12, §6).

Nothing here waits or touches a socket. Work for the fabric leaves through `outbox` as
typed effects (`Send`, `Wake`); the agent (fabric/agent.py) carries them and calls back in
with what happened: `receive(src, msg)`, `on_sent(send, err, now)`, `handle_timer(now)`.
Time is an input, as in aioquic: `get_timer()` is the next deadline, and nothing times out
unless the caller says the time has come. Randomness is injected (`randbits`).

Theory of operation
===================

The import flow (§1.6 I6–I20, §5.4, §5.5). `import_handle()` checks the handle (I1–I5) and,
for an exporter on another node, starts an `ImportFlow` and returns what the agent's
waiter makes of it; the waiter only waits for `Wake(ImportDone)` and reads the outcome.
The flow's steps, all decided here:

    CONNECTING  connection NOT_READY: the peer is probed (§13 N2: its error fails the import
                at once, nothing sent), then IN_PROGRESS, HELLO is sent (tag HelloSent).
                (IN_PROGRESS or PENDING: EAGAIN at once, I8; ESTABLISHED: straight on,
                unless nothing is shared with the peer and the probe finds it restarted:
                then IN_PROGRESS and HELLO as from NOT_READY.)
                The HELLO send fails          → NOT_READY, the import fails with that error
                sent, then ESTABLISHED (a HELLO_ACK, or our HELLO_ACK to the peer's own
                HELLO accepted)               → REQUESTING
                sent, and no connection within response_timeout (5 s) → NOT_READY, no
                cleanup, ETIMEDOUT (I11)
    REQUESTING  NPA_REQ is sent (tag NpaReqSent) with the connection's generation noted.
                The send fails                → the connection is reset if ESTABLISHED
                                                (§13 N3), the import fails with that error
                sent, then the node leaves NOT_READY (NPA_RSP/NPA_FAIL, or torn down by a
                revoke, a reset or a stop)    → DONE: import_finish (the NPA BO, or the
                                                errno of NPA_FAIL / EINVAL)
                sent, and no answer within response_timeout → DONE with ETIMEDOUT, and the
                connection to the exporter is reset with the noted generation (I14, §5.8)
    DONE        the node leaves the table unless READY; `Wake(ImportDone(handle_lo))`.

A step's clock starts once its message was accepted (the kernel sends, then waits). The
2 s rule is the transport's: a send the peer does not acknowledge within
send_ack_timeout_ms comes back as `on_sent(.., DrmError(ETIME), ..)` and fails the step.
A waiter that is cancelled calls `import_cancelled()`: CONNECTING → NOT_READY (I10).
A connection setup also starts without an import when NPA_REQ, NPA_RSP or NPA_FAIL comes
from a peer that is not ESTABLISHED (§5.4); its failure is only logged. A HELLO received is
answered once its sender was probed (§13 N2; unreadable: no HELLO_ACK, NOT_READY).

Every step of §13 that changed U's behaviour is U's again under its quirk (KNOWN_QUIRKS).

The revoke flow (§5.7). `revoke()` (the BO's last GEM handle went) takes the export out of
the live table; with importers it goes to the "handle invalid" table: mappings
invalidated, pins dropped, one NPA_REVOKE per importer still connected with its recorded
generation (tag RevokeSent); just before each is posted the carrier asks `send_due`, which
drops an importer whose connection went down meanwhile (§13 N5). A failed REVOKE send drops
that importer from the expected set and resets its connection (as U′ and N do). Once
every send has its outcome the 5 s wait is armed (step 6). Each NPA_RELEASE clears its
importer; when none is expected, or at the deadline, `revoke_finish()` frees every NPA range
and resets the connection to each importer that never released (steps 7–9). A manager stop
ends every flow without messages (§6.9).
"""

from __future__ import annotations

import enum
import errno
import heapq
import itertools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..abi.constants import CREATE_NO_CPU_ACCESS, DOMAIN_NPA, DOMAIN_VRAM, GPU_PAGE_SIZE
from ..amdgpu import translation
from ..amdgpu.bo import AmdgpuBo, pin_in_vram
from ..amdgpu.driver import AmdgpuDriver
from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf
from . import protocol as p
from .npa import (
    ALIAS_METADATA,
    GPUID_MASK,
    GPUID_SHIFT,
    RANGE_MASK,
    RANGE_RESERVED,
    SEGMENT_PAGES,
    WRITEBACK_PAGES,
    NpaPageTable,
    NpaSpace,
    strip_npa,
)
from .peers import (
    ConnEvent,
    ConnState,
    ImporterRecord,
    ImportNode,
    NodeEvent,
    NodeState,
    PeerConn,
    RevokeState,
)
from .state import (
    ACCEL_MAX,
    STAGE_TARGET,
    AccelEvent,
    AccelState,
    AddrMode,
    ConfigStage,
    PpodInfo,
    VpodInfo,
    accel_transition,
)

if TYPE_CHECKING:
    from .host import UalinkHost

log = logging.getLogger(__name__)

_U64 = (1 << 64) - 1

# Kernel quirks (Emulator policy 2): named switches, all off by default.
QUIRK_HELLO_NO_RESET = "hello-no-reset"  # §5.4: HELLO on ESTABLISHED skips the cleanup
QUIRK_NO_REMOTE_SHOOTDOWN = "no-remote-shootdown"  # §5.11: accepted; nothing to skip here
QUIRK_STALE_EXPORT_HANDLE = "stale-export-handle"  # §6.10: re-export returns handle_hi 0
QUIRK_ALIAS_EXTRA_PINS = "alias-extra-pins"  # §6.10: repeated alias NPA_REQ pins again
# U's behaviours that the newer kernel N changed (§13), one switch per change:
QUIRK_NO_RESTART_PROBE = "no-restart-probe"  # N2: setup and HELLO never probe the peer
QUIRK_NPA_REQ_FAIL_NO_RESET = "npa-req-fail-no-reset"  # N3: a failed NPA_REQ send resets nothing
QUIRK_SEND_FAIL_SLOW = "send-fail-slow"  # N4: an unposted send polls 2 s for its ACK (link)
QUIRK_REVOKE_NO_RECHECK = "revoke-no-recheck"  # N5: REVOKE to every importer, no reset
QUIRK_NO_UALINK_OOPS = "no-ualink-oops"  # N6: the ioctl on a GPU without UALink oopses
QUIRK_EXPORT_EPERM_LEAK = "export-eperm-leak"  # N7: a refused (EPERM) export leaks the BO
KNOWN_QUIRKS = frozenset(
    {QUIRK_HELLO_NO_RESET, QUIRK_NO_REMOTE_SHOOTDOWN, QUIRK_STALE_EXPORT_HANDLE,
     QUIRK_ALIAS_EXTRA_PINS, QUIRK_NO_RESTART_PROBE, QUIRK_NPA_REQ_FAIL_NO_RESET,
     QUIRK_SEND_FAIL_SLOW, QUIRK_REVOKE_NO_RECHECK, QUIRK_NO_UALINK_OOPS,
     QUIRK_EXPORT_EPERM_LEAK}
)

# NPA_FAIL reason -> the importer's errno (§5.2, §1.6 I15–I16)
FAIL_ERRNO: dict[int, int] = {p.NpaFailReason.NOSPACE: errno.ENOSPC}


# ---- effects: what the agent must do for the manager --------------------------------------
# A Send's tag says what its outcome means to the manager (see `on_sent`).


@dataclass(frozen=True, slots=True)
class HelloSent:
    """A connection setup's HELLO (§5.4); `setup` numbers the setup it belongs to."""

    remote: int
    setup: int


@dataclass(frozen=True, slots=True)
class HelloAckSent:
    """Our HELLO_ACK to the peer's HELLO (§5.4: accepted → ESTABLISHED)."""

    remote: int


@dataclass(frozen=True, slots=True)
class NpaReqSent:
    """An import's NPA_REQ (§1.6 I12)."""

    handle_lo: int


@dataclass(frozen=True, slots=True)
class NpaRspSent:
    """A grant to importer `src` (§5.6 step 7: a failed send takes it back)."""

    handle_lo: int
    src: int


@dataclass(frozen=True, slots=True)
class RevokeSent:
    """One NPA_REVOKE of the revoke of `handle_lo` (§5.7 step 5)."""

    handle_lo: int


SendTag = HelloSent | HelloAckSent | NpaReqSent | NpaRspSent | RevokeSent


@dataclass(frozen=True, slots=True)
class Send:
    """Send `msg` to remote accel `dst`; report the outcome through `on_sent`."""

    src: int
    dst: int
    msg: p.Message
    tag: SendTag | None = None


@dataclass(frozen=True, slots=True)
class ImportDone:
    """Wake key: the import flow of `handle_lo` has its outcome."""

    handle_lo: int


WakeKey = ImportDone


@dataclass(frozen=True, slots=True)
class Wake:
    """Wake whoever waits for `key`."""

    key: WakeKey


@dataclass(frozen=True, slots=True)
class Announce:
    """Accel `accel`'s manager started with a new `incarnation` (§13 N2): the link tells
    every peer before anything this incarnation sends."""

    accel: int
    incarnation: int


Effect = Send | Wake | Announce

# §13 N2: how a manager reads a peer's incarnation over the fabric: (local accel, remote
# accel) -> the remote's incarnation; DrmError when it cannot be read (the probe's error).
ProbeFn = Callable[[int, int], int]


class ImportStep(enum.Enum):
    CONNECTING = "HELLO sent or being sent; waiting for the connection"
    REQUESTING = "NPA_REQ sent or being sent; waiting for the exporter's answer"
    DONE = "the outcome is known"


@dataclass(slots=True, eq=False)
class ImportFlow:
    """One remote import in flight (see the theory of operation above)."""

    node: ImportNode
    step: ImportStep = ImportStep.CONNECTING
    sent: bool = False  # this step's message was accepted by the peer
    deadline: float | None = None
    generation: int = 0  # of the connection when NPA_REQ went out (I14's reset)
    buf: DmaBuf | None = None
    error: DrmError | None = None

    @property
    def done(self) -> bool:
        return self.step == ImportStep.DONE

    def outcome(self) -> DmaBuf:
        """The new dma-buf reference (handed over once), or the import's DrmError."""
        assert self.done
        if self.error is not None:
            raise self.error
        buf, self.buf = self.buf, None
        assert buf is not None, "an import's outcome is taken once"
        return buf


@dataclass(slots=True, eq=False)
class ConnSetup:
    """One setup_connection towards `remote` (§5.4), for an import or on a receive trigger."""

    remote: int
    number: int
    flow: ImportFlow | None = None
    sent: bool = False
    deadline: float | None = None


# The fabric's wait for an import's outcome: a Completion its Wake (or an interruption) ends.
ImportWaiter = Callable[["UalinkManager", ImportFlow], Completion[DmaBuf]]


# The importers of every export nobody imports yet: one shared dict that stays empty (an
# empty dict per export is 64 bytes; a node may hold 10^6 exports). The first import gives
# the entry a dict of its own (handle_import_request); nothing else adds to it.
_NO_IMPORTERS: dict[int, ImporterRecord] = {}


@dataclass(slots=True)
class ExportEntry:
    """A live export (§6.1): one BO reference and the export-time dma-buf."""

    handle_lo: int
    handle_hi: int
    bo: AmdgpuBo
    buf: DmaBuf
    importers: dict[int, ImporterRecord] = field(default_factory=lambda: _NO_IMPORTERS)
    shared_npa: tuple[int, int] | None = None  # source-aliasing: (start, pages)
    revoke: RevokeState | None = None


def generate_handle(
    accel_id: int, randbits: Callable[[int], int], live: dict[int, ExportEntry]
) -> tuple[int, int]:
    """§3.2: random handle_lo with the accel id in bits 9..0, non-zero and unique among
    live exports; handle_hi is 64 random bits drawn afterwards (may be 0)."""
    while True:
        lo = (randbits(64) & ~p.HANDLE_LO_ID_MASK & _U64) | accel_id
        if lo != 0 and lo not in live:
            break
    return lo, randbits(64)


class UalinkManager:
    def __init__(
        self,
        host: UalinkHost,
        driver: AmdgpuDriver,
        ppod: PpodInfo,
        vpod: VpodInfo,
        stage: ConfigStage,
        quirks: frozenset[str] = frozenset(),
        randbits: Callable[[int], int] = secrets.randbits,
        npa_limit_pages: int | None = None,
        response_timeout: float = 5.0,
    ) -> None:
        self.host = host
        self.driver = driver
        self.ppod = ppod  # (sets accel_id)
        self.vpod = vpod
        self.stage = stage
        self.quirks = quirks
        self.randbits = randbits
        self.npa_limit_pages = npa_limit_pages
        self.state = AccelState.UNCONFIGURED
        self.local_accels: list[int] = []
        self.active_snapshot: frozenset[int] | None = None  # bitmap at activation (§5.10)
        self.exports: dict[int, ExportEntry] = {}  # live table, by handle_lo
        self.invalid: dict[int, ExportEntry] = {}  # "handle invalid" table (§5.7)
        self.imports: dict[int, ImportNode] = {}  # by handle_lo
        self.conns: dict[int, PeerConn] = {}
        # The addressing mode the NPA space was laid out in at activation (§4.2); a later
        # config update that only changes vpod.addr_mode does not re-lay it out (§5.9).
        self.npa_mode = AddrMode.SOURCE_ALIASING
        self.npa: NpaSpace = self._new_npa_space(self.npa_mode)
        self.npa_table = NpaPageTable()
        self.drop_msg_bitmap = 0  # §5.12
        self.refused_accesses = 0  # data-plane accesses the NPA page table refused
        self._refusals_logged: set[tuple[int, str]] = set()
        self._repeats: dict[tuple[object, ...], int] = {}  # see _log_repeated
        self.outbox: list[Effect] = []
        # The UALink flows (theory of operation above) and their deadlines.
        self.response_timeout = response_timeout  # §1.6 I11, I14; §5.7 step 6
        self.flows: dict[int, ImportFlow] = {}  # by handle_lo
        self.setups: dict[int, ConnSetup] = {}  # by ConnSetup.number
        self._setup_numbers = itertools.count(1)
        self._timers: list[tuple[float, int, ImportFlow | ConnSetup | ExportEntry]] = []
        self._timer_seq = itertools.count()
        # A deadline was armed since get_timer() last ran: only then can the next one be
        # sooner than what the caller last read (most requests arm none, and the caller
        # asks after every one).
        self.deadline_armed = False
        # How an import that must wait is awaited: the fabric's waiter (`attach`); None
        # when no fabric runs in this process.
        self.import_waiter: ImportWaiter | None = None
        # §13 N2: this accel's incarnation (new at each manager start), and how a peer's is
        # read (the fabric's; None when no fabric runs in this process: nothing to probe).
        self.incarnation = 0
        self.probe: ProbeFn | None = None
        # Per remote accel: READY imports from it and live exports' importer records of it
        # (what N2's "nothing shared with that peer" counts, kept as they change).
        self._imported_from: dict[int, int] = {}
        self._exported_to: dict[int, int] = {}
        self.internal_file = DrmFile(driver.device)  # the driver's internal "ualink" client
        if driver.ualink_ip:  # (§13 N6: without the block the driver has no UALink info)
            driver.ualink = self

    def _log_repeated(self, key: tuple[object, ...], level: int, fmt: str, *args: object) -> None:
        """One line per cause, not one per message: the first occurrence of `key` is logged,
        then the 10th, 100th, … with the count so far (a burst of 2000 revokes towards a
        dead importer gives four lines, not 2000)."""
        n = self._repeats.get(key, 0) + 1
        self._repeats[key] = n
        if n == 1:
            log.log(level, fmt, *args)
        elif n in (10, 100, 1000, 10000) or n % 100000 == 0:
            log.log(level, fmt + " (%d times so far)", *args, n)

    @property
    def ppod(self) -> PpodInfo:
        return self._ppod

    @ppod.setter
    def ppod(self, ppod: PpodInfo) -> None:
        # accel_id is read a dozen times per import (every effect, every timer check): a
        # plain attribute, kept with the pPod info it comes from, not a property call each.
        self._ppod = ppod
        self.accel_id: int = ppod.accel_id

    @property
    def state(self) -> AccelState:
        return self._state

    @state.setter
    def state(self, state: AccelState) -> None:
        # accel_active is asked on every send and request (a property was a call each): a
        # plain attribute, kept with the state it comes from.
        self._state = state
        self.accel_active: bool = state == AccelState.ACTIVE

    def conn(self, remote: int) -> PeerConn:
        c = self.conns.get(remote)
        if c is None:
            c = self.conns[remote] = PeerConn(remote)
        return c

    def _new_npa_space(self, mode: AddrMode) -> NpaSpace:
        if mode == AddrMode.SOURCE_IDENTIFICATION:
            return NpaSpace(0, ACCEL_MAX << GPUID_SHIFT)
        end = SEGMENT_PAGES - 1  # the size comes from a bit mask: the last page is lost
        if self.npa_limit_pages is not None:  # pages left for imports, write-back aside
            end = min(end, ALIAS_METADATA + WRITEBACK_PAGES + self.npa_limit_pages)
        space = NpaSpace(ALIAS_METADATA, end)
        # §4.2: source-aliasing takes its write-back area from the allocator at activation,
        # so the first BO's NPA is 0x802, not 0x800.
        space.reserved = space.alloc(WRITEBACK_PAGES)
        return space

    @property
    def npa_import_pages(self) -> int:
        """NPA pages granted to importers (the write-back area not counted)."""
        reserved = self.npa.reserved
        return self.npa.used_pages - (self.npa.used[reserved] if reserved is not None else 0)

    # -- the accel state (§5.9, §6.9) ---------------------------------------------------------
    def change_state(self, event: AccelEvent, stage: ConfigStage | None = None) -> bool:
        """The one place the accel state changes: `event` (with the configuration `stage`
        for AccelEvent.STAGE) through state.ACCEL_TRANSITIONS. True if the state changed."""
        target = STAGE_TARGET[stage] if stage is not None else None
        nxt = accel_transition(self.state, event, self.ppod, self.vpod, target)
        changed, self.state = nxt != self.state, nxt
        if changed:
            translation.changed()  # an accel that is not ACTIVE serves no NPA access
        return changed

    def activate(self) -> None:
        if not self.change_state(AccelEvent.ACTIVATE):
            return
        self.active_snapshot = self.vpod.active_accels
        # §13 N2: a manager start is a new incarnation (random: a restarted daemon must not
        # come back with the number it had), told to the peers before anything we send.
        self.incarnation = secrets.randbits(64) or 1
        if self.probe is not None:  # a fabric runs (before it, links announce it as they come up)
            self.outbox.append(Announce(self.accel_id, self.incarnation))
        self.npa_mode = self.vpod.addr_mode
        self.npa = self._new_npa_space(self.npa_mode)
        log.info("accel %d: ACTIVE in vPod %d", self.accel_id, self.vpod.vpod_id)

    def deactivate(self) -> None:
        """deactivate_accelerator: acts on ACTIVE and ERROR; stops the manager (§6.9)."""
        if not self.change_state(AccelEvent.DEACTIVATE):
            return
        self.stop()
        log.info("accel %d: deactivated", self.accel_id)

    def stop(self) -> None:
        """Manager stop (§6.9): connections NOT_READY, every import and export torn down
        without messages; peers are not told."""
        for c in self.conns.values():
            c.apply(ConnEvent.STOP)
            c.peer_incarnation = None
        for node in list(self.imports.values()):
            node.apply(NodeEvent.STOP)
            self._teardown_node(node)
        for entry in list(self.exports.values()):
            had_importers = bool(entry.importers)
            for remote in list(entry.importers):
                self._drop_importer(entry, remote)
            self._free_export(entry)
            if had_importers:  # §3.4: only an export without importers keeps the stale field
                entry.bo.ualink_handle_lo = 0
        for entry in list(self.invalid.values()):  # revokes in flight: stop waiting
            assert entry.revoke is not None
            entry.revoke.expected.clear()
            for rec in entry.importers.values():
                self._free_npa(rec.npa_start)
            if entry.shared_npa is not None:
                self._free_npa(entry.shared_npa[0])
        self.exports.clear()
        translation.changed()
        self.invalid.clear()
        self._imported_from.clear()
        self._exported_to.clear()

    # -- export (§1.6 E1–E7) ---------------------------------------------------------------
    def export(self, file: DrmFile, gem_handle: int) -> tuple[int, int]:
        bo = self.driver.lookup_bo(file, gem_handle)  # E1: ENOENT
        if not bo.preferred_domains & DOMAIN_VRAM:  # E2
            raise DrmError(errno.EOPNOTSUPP, "only BOs preferring VRAM are exportable")
        if bo.ualink_handle_lo:  # E3: idempotent per BO
            entry = self.exports.get(bo.ualink_handle_lo)
            if entry is not None and entry.bo is bo:
                return entry.handle_lo, entry.handle_hi
            if QUIRK_STALE_EXPORT_HANDLE in self.quirks:
                log.warning(
                    "accel %d: stale UALink handle %#x re-exported with handle_hi 0 (quirk)",
                    self.accel_id, bo.ualink_handle_lo,
                )
                return bo.ualink_handle_lo, 0
        # §13 N7: one ioctl runs at a time here, so the first export of a BO has stored its
        # handle before any other export of it is looked at: never two handles for one BO
        # (N's EAGAIN for the loser of a race has no race to lose).
        if QUIRK_EXPORT_EPERM_LEAK in self.quirks:
            bo.get()  # U took the reference first and kept it when E5 failed (§13 N7)
            buf = self.driver.device.prime_handle_to_dmabuf(file, gem_handle)  # E5: EPERM
            bo.put()
        else:
            buf = self.driver.device.prime_handle_to_dmabuf(file, gem_handle)  # E5: EPERM
        lo, hi = generate_handle(self.accel_id, self.randbits, self.exports)
        bo.get()
        self.exports[lo] = ExportEntry(lo, hi, bo, buf)
        bo.ualink_handle_lo = lo
        return lo, hi

    # -- revoke (§5.7, §6.4) -----------------------------------------------------------------
    def revoke(self, bo: AmdgpuBo) -> None:
        """handle_free: the BO's GEM handle count reached 0 (§5.7 steps 1–2)."""
        entry = self.exports.get(bo.ualink_handle_lo) if bo.ualink_handle_lo else None
        if entry is None or entry.bo is not bo:
            return
        del self.exports[entry.handle_lo]
        translation.changed()
        if not entry.importers:
            self._free_export(entry)
            return
        for remote in entry.importers:  # unlinked from the per-importer lists (step 1)
            self._count(self._exported_to, remote, -1)
        entry.revoke = RevokeState()
        self.invalid[entry.handle_lo] = entry
        self._revoke_invalidate(entry)
        if not entry.revoke.expected:  # nobody to wait for (all stale or gone)
            self.revoke_finish(entry)

    def _revoke_invalidate(self, entry: ExportEntry) -> None:
        """§5.7 steps 3–5: invalidate the importers' NPA mappings, unpin, drop the BO, and
        put one NPA_REVOKE per importer still connected with its recorded generation."""
        assert entry.revoke is not None
        for remote, rec in list(entry.importers.items()):
            if self.conn(remote).ready_generation() != rec.generation:
                self._drop_importer(entry, remote)  # stale generation: skipped silently
                continue
            # PTEs rewritten, then (heavyweight) remote TLB shootdown: importers hold no
            # translation cache here, so with or without "no-remote-shootdown" the next
            # access through the NPA faults.
            self.npa_table.invalidate(rec.npa_start)
            translation.changed()
        entry.bo.pin_count -= len(entry.importers)  # once per importer bit (§5.7 step 4)
        entry.bo.ualink_handle_lo = 0
        buf, bo = entry.buf, entry.bo
        buf.put()
        bo.put()
        # One message and one tag for every importer: they are the same values.
        msg = p.NpaRevoke(p.handle_lo_bits(entry.handle_lo), entry.handle_hi)
        tag = RevokeSent(entry.handle_lo)
        entry.revoke.expected.update(entry.importers)
        entry.revoke.unsent += len(entry.importers)
        self.outbox.extend(Send(self.accel_id, remote, msg, tag) for remote in entry.importers)

    def revoke_finish(self, entry: ExportEntry) -> list[int]:
        """§5.7 steps 7–9: free every NPA range, reset the connection to every importer that
        never released; returns those importers."""
        assert entry.revoke is not None
        if self.invalid.get(entry.handle_lo) is not entry:
            return []  # a manager stop already finished it
        missing = sorted(entry.revoke.expected)
        records = dict(entry.importers)
        entry.importers.clear()
        translation.changed()
        for rec in records.values():
            self._free_npa(rec.npa_start)
        if entry.shared_npa is not None:
            self._free_npa(entry.shared_npa[0])
            entry.shared_npa = None
        self.invalid.pop(entry.handle_lo, None)
        for remote in missing:
            gen = records[remote].generation if remote in records else 0
            if self.connection_reset(remote, ConnState.NOT_READY, gen):
                # The revokes still waiting on it end the same way: counted in this line.
                waiting = sum(remote in e.revoke.expected for e in self.invalid.values()
                              if e.revoke is not None)
                log.warning("accel %d: accel %d never released handle %#x (nor %d other "
                            "handles being revoked); resetting the connection", self.accel_id,
                            remote, entry.handle_lo, waiting)
        return missing

    def _free_export(self, entry: ExportEntry) -> None:
        if QUIRK_STALE_EXPORT_HANDLE not in self.quirks:
            entry.bo.ualink_handle_lo = 0
        entry.buf.put()
        entry.bo.put()

    def _free_npa(self, start: int) -> None:
        self.npa_table.unmap(start)
        translation.changed()
        if start in self.npa.used:
            self.npa.free(start)

    def _drop_importer(self, entry: ExportEntry, remote: int) -> None:
        """Forget one importer of a live export: unpin once, free its NPA (§5.8)."""
        rec = entry.importers.pop(remote)
        if self.exports.get(entry.handle_lo) is entry:  # (a revoked one was unlinked)
            self._count(self._exported_to, remote, -1)
        translation.changed()
        entry.bo.pin_count -= 1
        if entry.shared_npa is None:
            self._free_npa(rec.npa_start)
        elif not entry.importers:
            self._free_npa(entry.shared_npa[0])
            entry.shared_npa = None

    @staticmethod
    def _count(counts: dict[int, int], remote: int, delta: int) -> None:
        n = counts.get(remote, 0) + delta
        if n:
            counts[remote] = n
        else:
            counts.pop(remote, None)

    def shares_with(self, remote: int) -> bool:
        """§13 N2: something is imported from or exported to `remote` (a READY import
        node, or an importer record of a live export)."""
        return remote in self._imported_from or remote in self._exported_to

    # -- connection reset (§5.8) -------------------------------------------------------------
    def connection_reset(self, remote: int, new_state: ConnState, generation: int) -> bool:
        """§5.8: `new_state` NOT_READY (timeouts) or PENDING (a HELLO while ESTABLISHED),
        only from ESTABLISHED with the same `generation`; then the cleanup."""
        c = self.conn(remote)
        event = ConnEvent.RESET if new_state == ConnState.NOT_READY else ConnEvent.RESET_FOR_HELLO
        if c.generation != generation or not c.takes(event):
            return False
        c.apply(event)
        for node in [n for n in self.imports.values() if n.exporter == remote]:
            if node.apply(NodeEvent.RESET):
                self._teardown_node(node)
        for entry in self.exports.values():
            if remote in entry.importers:
                self._drop_importer(entry, remote)
        log.info("accel %d: connection to accel %d reset (generation %d)",
                 self.accel_id, remote, generation)
        return True

    # -- import (§1.6 I1–I20) -----------------------------------------------------------------
    def import_handle(
        self, file: DrmFile, handle_lo: int, handle_hi: int
    ) -> DmaBuf | Completion[DmaBuf]:
        exporter_id = handle_lo & p.HANDLE_LO_ID_MASK
        if exporter_id >= ACCEL_MAX:  # I1
            raise DrmError(errno.EINVAL, f"exporter accel id {exporter_id} >= 256")
        if exporter_id in self.local_accels:  # I2: local path, no messages, no pin
            exporter = self.host.by_accel_id(exporter_id)
            if exporter is None:  # I2a
                raise DrmError(errno.ENODEV, f"no local accel {exporter_id}")
            entry = exporter.exports.get(handle_lo)
            if entry is None or entry.handle_hi != handle_hi:  # I2b
                raise DrmError(errno.EINVAL, "no live export with that handle")
            entry.buf.get()  # I2c: a new fd of the exporter's export-time dma-buf
            return entry.buf
        if exporter_id not in self.vpod.active_accels:  # Emulator policy 4
            log.warning("import refused: accel %d is not in vPod %d of accel %d",
                        exporter_id, self.vpod.vpod_id, self.accel_id)
            raise DrmError(errno.EACCES, f"accel {exporter_id} is outside the vPod")
        node = self.imports.get(handle_lo)
        if node is not None:
            if node.state in (NodeState.NOT_READY, NodeState.PENDING):  # I3
                raise DrmError(errno.EAGAIN, "an import of this handle is in flight")
            if node.state == NodeState.READY and node.buf is not None:  # I5: dedupe
                node.buf.get()
                return node.buf
            raise DrmError(errno.EINVAL, "import is being torn down")  # I4
        if self.import_waiter is None:
            # No fabric in this process: the HELLO cannot be sent (§5.1 send error).
            raise DrmError(errno.ETIME, f"no fabric link towards accel {exporter_id}")
        return self.import_waiter(self, self._start_import(handle_lo, handle_hi))

    def attach(self, waiter: ImportWaiter) -> None:
        """A fabric runs: imports that must wait are awaited through `waiter`."""
        self.import_waiter = waiter

    def import_begin(self, handle_lo: int, handle_hi: int) -> ImportNode:
        """I6–I7: a new node in NOT_READY (the caller holds it until finish/abort)."""
        if handle_lo in self.imports:
            raise DrmError(errno.EAGAIN, "another import inserted this handle first")
        node = ImportNode(handle_lo, handle_hi, handle_lo & p.HANDLE_LO_ID_MASK)
        self.imports[handle_lo] = node
        return node

    def _setup_connection(self, remote: int) -> bool:
        """§5.4 local setup_connection: True when a HELLO must be sent and waited for,
        False when already ESTABLISHED; EAGAIN while someone else sets it up (I8).

        §13 N2 (quirk "no-restart-probe": U never probes): NOT_READY probes the peer first,
        and a failed probe is returned at once, no HELLO sent, still NOT_READY. ESTABLISHED
        with nothing shared with the peer probes too: its error is returned (state kept),
        in sync goes on, a restarted peer is set up again (IN_PROGRESS, HELLO)."""
        c = self.conn(remote)
        probing = QUIRK_NO_RESTART_PROBE not in self.quirks
        if c.state == ConnState.ESTABLISHED:
            if not probing or self.shares_with(remote) or not self._probe(remote):
                return False
            log.info("accel %d: accel %d restarted (its incarnation changed): connecting "
                     "again", self.accel_id, remote)
            c.apply(ConnEvent.RESYNCED)
            return True
        if c.state in (ConnState.IN_PROGRESS, ConnState.PENDING):
            raise DrmError(errno.EAGAIN, f"connection to accel {remote} is being set up")
        if probing:
            self._probe(remote)
        c.apply(ConnEvent.SETUP)
        return True

    def _probe(self, remote: int) -> bool:
        """§13 N2's probe of `remote` over the fabric: True when it restarted since our last
        probe ("resynced"), False when in sync; DrmError (ESHUTDOWN when this accel is not
        ACTIVE, else the read's error) when it cannot be read."""
        if not self.accel_active:
            raise DrmError(errno.ESHUTDOWN, f"accel {self.accel_id} is not ACTIVE")
        if self.probe is None:  # no fabric in this process: nothing to read the peer by
            return False
        incarnation = self.probe(self.accel_id, remote)
        if not incarnation:  # not announced yet (a link just up, or coming up): unknown
            return False
        c = self.conn(remote)
        resynced = c.peer_incarnation is not None and c.peer_incarnation != incarnation
        c.peer_incarnation = incarnation
        return resynced

    def _hello(self, remote: int) -> p.Hello:
        return p.Hello(receiver_id=remote, sender_id=self.accel_id)

    def _hello_failed(self, remote: int) -> None:
        """I9–I11: HELLO not sent, interrupted or timed out: NOT_READY, no cleanup."""
        self.conn(remote).apply(ConnEvent.HELLO_FAILED)

    def npa_req(self, node: ImportNode) -> p.NpaReq:
        return p.NpaReq(p.handle_lo_bits(node.handle_lo), node.handle_hi)

    def _import_timed_out(self, node: ImportNode, generation: int) -> None:
        """I14: no NPA_RSP/NPA_FAIL in time: reset the whole connection to the exporter."""
        self.connection_reset(node.exporter, ConnState.NOT_READY, generation)

    def import_finish(self, node: ImportNode) -> DmaBuf:
        """I15–I20 once the exporter answered: the NPA BO and its dma-buf, node READY."""
        if node.state != NodeState.PENDING:
            raise DrmError(errno.EINVAL, "the import was torn down while it waited")
        if node.fail_reason:
            err = FAIL_ERRNO.get(node.fail_reason, errno.EINVAL)
            raise DrmError(err, f"exporter answered NPA_FAIL({node.fail_reason})")
        if node.npa_offset == 0 or node.size_pages == 0:  # I17
            raise DrmError(errno.EINVAL, "NPA_RSP with NPA 0 or size 0")
        bo = AmdgpuBo(self.driver.device, node.size_pages * GPU_PAGE_SIZE, 1, DOMAIN_NPA,
                      CREATE_NO_CPU_ACCESS, None)
        bo.npa = (node.exporter, node.npa_offset, node.size_pages)
        node.internal_handle = self.internal_file.handle_create(bo)
        bo.put()  # the internal handle holds it
        node.bo = bo
        node.buf = self.driver.device.prime_handle_to_dmabuf(self.internal_file,
                                                             node.internal_handle)
        node.apply(NodeEvent.WAITER_OK)
        node.linked = True
        self._count(self._imported_from, node.exporter, 1)
        node.buf.get()  # the caller's new fd
        return node.buf

    def import_abort(self, node: ImportNode) -> None:
        """The waiter failed: the node leaves the table (§5.5)."""
        if node.state != NodeState.READY and self.imports.get(node.handle_lo) is node:
            del self.imports[node.handle_lo]

    def _teardown_node(self, node: ImportNode) -> None:
        """TEARDOWN: GPU mappings of the NPA BO stop working, the table's references go."""
        if self.imports.get(node.handle_lo) is node:
            del self.imports[node.handle_lo]
        if node.linked:
            node.linked = False
            self._count(self._imported_from, node.exporter, -1)
        if node.bo is not None:
            node.bo.npa_revoked = True
            translation.changed()
            node.bo = None
        if node.buf is not None:
            buf, node.buf = node.buf, None
            buf.put()
        if node.internal_handle:
            self.internal_file.handle_delete(node.internal_handle)
            node.internal_handle = 0
        self._node_changed(node)

    # -- receive path (§5.1, §5.3–§5.7, §5.12) --------------------------------------------------
    def receive(self, src: int, msg: p.Message) -> None:
        """One message from remote accel `src` (the transport's stamp)."""
        if not self.accel_active:
            log.debug("accel %d not ACTIVE: dropping %s from %d", self.accel_id, msg, src)
            return
        t = int(msg.type)
        if self.drop_msg_bitmap and t < 64 and self.drop_msg_bitmap >> t & 1:
            self.drop_msg_bitmap &= ~(1 << t)
            log.warning("accel %d: dropping one %s from accel %d (drop_msg bitmap)",
                        self.accel_id, p.MsgType(t).name if t in p.MsgType._value2member_map_
                        else t, src)
            return
        # Emulator policy 4, §5.10: per-peer resources exist only for the accels of the
        # bitmap this accel was activated with; anything from another accel is dropped.
        members = self.active_snapshot
        if src not in (members if members is not None else self.vpod.active_accels):
            self._log_repeated(("not-in-vpod", src), logging.WARNING,
                               "accel %d: dropping %s from accel %d, which is not in vPod %d",
                               self.accel_id, type(msg).__name__, src, self.vpod.vpod_id)
            return
        handler = _RECEIVERS.get(type(msg))
        if handler is None:
            self._log_repeated(("unknown-type", src), logging.WARNING,
                               "accel %d: unknown message type %d from accel %d ignored",
                               self.accel_id, t, src)
        else:
            handler(self, src, msg)

    def _on_hello_ack(self, src: int, msg: p.HelloAck) -> None:
        if self.conn(src).apply(ConnEvent.HELLO_ACK):
            self._connected(src)

    def _on_hello(self, src: int, msg: p.Hello) -> None:
        if msg.receiver_id != self.accel_id or msg.sender_id != src or src >= ACCEL_MAX:
            self._log_repeated(("hello-malformed", src), logging.WARNING,
                               "accel %d: malformed HELLO from accel %d dropped",
                               self.accel_id, src)
            return
        c = self.conn(src)
        if c.state == ConnState.ESTABLISHED and QUIRK_HELLO_NO_RESET not in self.quirks:
            # The peer restarted: what we shared with it is gone (contract; the reference
            # build skips this, quirk "hello-no-reset").
            self.connection_reset(src, ConnState.PENDING, c.generation)
        c.apply(ConnEvent.HELLO)
        if QUIRK_NO_RESTART_PROBE not in self.quirks:
            # §13 N2: the sender is probed before it is answered; one that cannot be read
            # gets no HELLO_ACK (it times out) and the connection is NOT_READY.
            try:
                self._probe(src)
            except DrmError as e:
                c.apply(ConnEvent.HELLO_PROBE_FAILED)
                self._log_repeated(("hello-probe", src, e.errno), logging.WARNING,
                                   "accel %d: HELLO from accel %d not answered: probing it "
                                   "failed: %s", self.accel_id, src, e.strerror)
                return
        self.outbox.append(Send(self.accel_id, src, p.HelloAck(), HelloAckSent(src)))

    def _not_established(self, src: int, what: str) -> bool:
        if self.conn(src).state == ConnState.ESTABLISHED:
            return False
        self._log_repeated(("not-established", src, what), logging.INFO,
                           "accel %d: %s from accel %d before the connection is up: "
                           "dropped, setting up", self.accel_id, what, src)
        try:
            if self._setup_connection(src):
                self._setup(src, None)
        except DrmError as e:  # someone else is setting it up
            self._log_repeated(("setup-busy", src, e.errno), logging.INFO,
                               "accel %d: connection setup towards accel %d: %s",
                               self.accel_id, src, e.strerror)
        return True

    def _fail(self, src: int, lo: int, reason: p.NpaFailReason) -> None:
        self.outbox.append(Send(self.accel_id, src, p.NpaFail(p.handle_lo_bits(lo), reason)))

    def _on_npa_req(self, src: int, msg: p.NpaReq) -> None:
        """§5.6."""
        if self._not_established(src, "NPA_REQ"):
            return
        lo = msg.handle_lo_bits | self.accel_id
        entry = self.exports.get(lo)
        if entry is None or entry.handle_hi != msg.handle_hi:
            self._fail(src, lo, p.NpaFailReason.INVALID_HANDLE)
            return
        bo = entry.bo
        # Step 3: pinned in VRAM while any importer holds an NPA (moved there, evicting
        # others, if it sits in GTT); when VRAM cannot take it → NPA_FAIL(ERROR).
        if bo.pin_count == 0 and not pin_in_vram(bo, self.driver.vram, self.driver.gtt):
            log.warning("accel %d: cannot pin BO of handle %#x in VRAM for accel %d",
                        self.accel_id, lo, src)
            self._fail(src, lo, p.NpaFailReason.ERROR)
            return
        bo.pin_count += 1
        mode = self.npa_mode
        rec = entry.importers.get(src)
        if mode == AddrMode.SOURCE_IDENTIFICATION and rec is not None:
            bo.pin_count -= 1
            self._fail(src, lo, p.NpaFailReason.DUPLICATE)
            return
        pages = -(-bo.size // GPU_PAGE_SIZE)
        if mode == AddrMode.SOURCE_ALIASING and entry.shared_npa is not None:
            start = entry.shared_npa[0]
            if rec is not None and QUIRK_ALIAS_EXTRA_PINS not in self.quirks:
                bo.pin_count -= 1  # the reference build keeps this pin for good (§6.10)
        else:
            if mode == AddrMode.SOURCE_IDENTIFICATION:
                base = src << GPUID_SHIFT
                hi = base | RANGE_MASK
                if self.npa_limit_pages is not None:
                    hi = min(hi, base + RANGE_RESERVED + self.npa_limit_pages)
                got = self.npa.alloc(pages, base | RANGE_RESERVED, hi)
            else:
                got = self.npa.alloc(pages)
            if got is None:
                bo.pin_count -= 1
                self._fail(src, lo, p.NpaFailReason.NOSPACE)
                return
            start = got
            self.npa_table.map(start, pages, bo)
            if mode == AddrMode.SOURCE_ALIASING:
                entry.shared_npa = (start, pages)
        if rec is None:
            if entry.importers is _NO_IMPORTERS:
                entry.importers = {}
            entry.importers[src] = ImporterRecord(start, pages, self.conn(src).generation)
            self._count(self._exported_to, src, 1)
        else:  # step 4: a repeated request marks the importer with the current generation
            rec.generation = self.conn(src).generation
        rsp = p.NpaRsp(p.handle_lo_bits(lo), pages, strip_npa(start))
        self.outbox.append(Send(self.accel_id, src, rsp, NpaRspSent(lo, src)))

    def _npa_rsp_failed(self, lo: int, src: int) -> None:
        """§5.6 step 7: NPA_RSP could not be sent: the requester is no importer, its pin
        goes, and so does its NPA (source-aliasing: the shared one once nobody is left, even
        when another importer's grant was still in flight when it was allocated)."""
        entry = self.exports.get(lo)
        if entry is not None and src in entry.importers:
            self._drop_importer(entry, src)

    def _on_npa_answer(self, src: int, msg: p.NpaRsp | p.NpaFail) -> None:
        if self._not_established(src, type(msg).__name__):
            return
        node = self.imports.get(msg.handle_lo_bits | src)
        if node is None or node.exporter != src:
            self._log_repeated(("answer-unknown", src, type(msg)), logging.INFO,
                               "accel %d: %s for unknown handle from accel %d dropped",
                               self.accel_id, type(msg).__name__, src)
            return
        if isinstance(msg, p.NpaRsp):
            node.npa_offset, node.size_pages = msg.npa_offset, msg.size_pages
        else:
            node.fail_reason = msg.reason or p.NpaFailReason.ERROR
        if node.apply(NodeEvent.ANSWER):
            self._node_changed(node)
        else:
            self._log_repeated(("answer-unsolicited", src, type(msg)), logging.INFO,
                               "accel %d: unsolicited %s from accel %d", self.accel_id,
                               type(msg).__name__, src)

    def _on_revoke(self, src: int, msg: p.NpaRevoke) -> None:
        lo = msg.handle_lo_bits | src
        node = self.imports.get(lo)
        if node is None or node.handle_hi != msg.handle_hi or not node.apply(NodeEvent.REVOKE):
            self._log_repeated(("revoke-unknown", src), logging.INFO,
                               "accel %d: NPA_REVOKE for unknown handle %#x from accel %d "
                               "dropped", self.accel_id, lo, src)
            return
        self._teardown_node(node)
        release = p.NpaRelease(p.handle_lo_bits(lo), msg.handle_hi)
        self.outbox.append(Send(self.accel_id, src, release))

    def _on_release(self, src: int, msg: p.NpaRelease) -> None:
        lo = msg.handle_lo_bits | self.accel_id
        entry = self.invalid.get(lo)
        if entry is None or entry.handle_hi != msg.handle_hi or entry.revoke is None:
            self._log_repeated(("release-unknown", src), logging.INFO,
                               "accel %d: NPA_RELEASE for unknown handle %#x from accel %d "
                               "dropped", self.accel_id, lo, src)
            return
        if src not in entry.revoke.expected:
            self._log_repeated(("release-unexpected", src), logging.WARNING,
                               "accel %d: unexpected NPA_RELEASE from accel %d",
                               self.accel_id, src)
            return
        entry.revoke.expected.discard(src)
        if not entry.revoke.expected:
            self.revoke_finish(entry)

    # -- data plane: serving LOAD / STORE from importers (§4.4, policy 10) ----------------------
    def _resolve_npa(self, src: int, npa_byte_addr: int,
                     length: int) -> tuple[AmdgpuBo, int, int]:
        """An importer's NPA access → (our BO, byte offset in it, bytes of the BO its NPA
        mapping reaches). Refuses (EFAULT) what the
        exporter's NPA page table would not translate: another GPU's segment, an unmapped or
        invalidated page, a range past the mapping, a requester that is not an importer."""
        page = npa_byte_addr >> 12
        reason = None
        if not self.accel_active:
            reason = "accel not ACTIVE"
        elif (page >> GPUID_SHIFT) & GPUID_MASK != self.accel_id or npa_byte_addr >> 51:
            reason = "outside this accel's NPA segment"
        else:
            table_page = strip_npa(page)
            if self.npa_mode == AddrMode.SOURCE_IDENTIFICATION:
                table_page |= src << GPUID_SHIFT
            hit = self.npa_table.lookup(table_page)
            if hit is None:
                reason = "NPA not mapped (or its PTE was invalidated)"
            else:
                mapping, index = hit
                offset = index * GPU_PAGE_SIZE + (npa_byte_addr & (GPU_PAGE_SIZE - 1))
                entry = self.exports.get(mapping.bo.ualink_handle_lo)
                if entry is None or src not in entry.importers:
                    reason = f"accel {src} is not an importer of that BO"
                elif length < 0 or offset + length > (
                        reach := min(mapping.bo.size, mapping.pages * GPU_PAGE_SIZE)):
                    reason = "access past the end of the BO"
                else:
                    return mapping.bo, offset, reach
        self.refused_accesses += 1
        if (src, reason) not in self._refusals_logged:
            self._refusals_logged.add((src, reason))
            log.warning("accel %d: refused an NPA access from accel %d at %#x: %s",
                        self.accel_id, src, npa_byte_addr, reason)
        raise DrmError(errno.EFAULT, reason)

    def serve_load(self, src: int, npa_byte_addr: int, length: int) -> list[memoryview]:
        """The bytes a LOAD reads, as views of the BO's memory (BoMemory.read_views)."""
        bo, offset, _ = self._resolve_npa(src, npa_byte_addr, length)
        return bo.memory.read_views(offset, length)

    def load_routes(self, src: int, npa_byte_addr: int, length: int
                    ) -> list[tuple[int, int, bytearray | int | None, int]]:
        """After serving that LOAD: the routes that answer the same LOADs of its BO chunks
        without us (fuse/dataplane.c), valid until translation.changed(): (NPA byte
        address, length, where the bytes live (BoMemory.backing), their offset there).
        Empty when it would not be served now."""
        try:
            bo, offset, reach = self._resolve_npa(src, npa_byte_addr, length)
        except DrmError:
            return []
        npa_of_bo = npa_byte_addr - offset  # an NPA mapping is the BO from its first page
        return [(npa_of_bo + base, min(n, reach - base), backing,
                 base if isinstance(backing, int) else 0)  # (a memfd holds the whole BO)
                for base, n, backing in bo.memory.backing(offset, length) if base < reach]

    def serve_store(self, src: int, npa_byte_addr: int, data: bytes | bytearray) -> None:
        bo, offset, _ = self._resolve_npa(src, npa_byte_addr, len(data))
        bo.memory.write(offset, data)

    # -- send outcomes ----------
    def on_sent(self, send: Send, err: DrmError | None, now: float | None = None) -> None:
        """The agent reports how a `Send` ended (None: the peer accepted it) at time `now`
        (needed by the sends whose acceptance starts a wait: HELLO, NPA_REQ, NPA_REVOKE)."""
        tag = send.tag
        if err is not None and isinstance(tag, HelloAckSent | NpaRspSent):
            # A reply the receive ring waited for (§5.1: sends are synchronous, up to the 2 s
            # ACK limit): say so, since every peer's messages to this accel waited with it.
            name = type(send.msg).__name__
            self._log_repeated(("reply-failed", name, send.dst, err.errno), logging.WARNING,
                               "accel %d: %s to accel %d failed: %s (this accel's receive "
                               "ring waited for it, every peer's messages behind it)",
                               self.accel_id, name, send.dst, err.strerror)
        if tag is None:
            if err is not None:
                name = type(send.msg).__name__
                self._log_repeated(("send-failed", name, send.dst, err.errno), logging.INFO,
                                   "accel %d: sending %s to accel %d failed: %s",
                                   self.accel_id, name, send.dst, err.strerror)
        elif isinstance(tag, HelloAckSent):
            c = self.conn(send.dst)
            if err is None:
                if c.apply(ConnEvent.ACK_SENT):
                    self._connected(send.dst)
            else:
                c.apply(ConnEvent.ACK_SEND_FAILED)
        elif isinstance(tag, HelloSent):
            self._hello_sent(tag, err, now)
        elif isinstance(tag, NpaReqSent):
            self._npa_req_sent(tag, err, now)
        elif isinstance(tag, NpaRspSent):
            if err is not None:
                self._npa_rsp_failed(tag.handle_lo, tag.src)
        else:
            self._revoke_sent(tag, send.dst, err, now)

    # -- the import flow (theory of operation at the top) ------------------------------------
    def _start_import(self, handle_lo: int, handle_hi: int) -> ImportFlow:
        node = self.import_begin(handle_lo, handle_hi)
        flow = ImportFlow(node)
        try:
            setup = self._setup_connection(node.exporter)  # I8: EAGAIN while in progress
        except DrmError:
            self.import_abort(node)
            raise
        self.flows[handle_lo] = flow
        if setup:
            self._setup(node.exporter, flow)
        else:
            self._request(flow)
        return flow

    def _setup(self, remote: int, flow: ImportFlow | None) -> None:
        """The connection is IN_PROGRESS: send HELLO (§5.4)."""
        setup = ConnSetup(remote, next(self._setup_numbers), flow)
        self.setups[setup.number] = setup
        self.outbox.append(Send(self.accel_id, remote, self._hello(remote),
                                HelloSent(remote, setup.number)))

    def _hello_sent(self, tag: HelloSent, err: DrmError | None, now: float | None) -> None:
        setup = self.setups.get(tag.setup)
        if setup is None:
            return  # its import was cancelled
        if err is not None:  # I9
            self._setup_failed(setup, err)
        elif self.conn(setup.remote).state == ConnState.ESTABLISHED:
            setup.sent = True
            self._connected(setup.remote)
        else:
            setup.sent = True
            self._arm(setup, now)

    def _setup_failed(self, setup: ConnSetup, err: DrmError) -> None:
        """I9–I11: NOT_READY, no cleanup; the import (if any) fails with `err`."""
        del self.setups[setup.number]
        self._hello_failed(setup.remote)
        if setup.flow is not None:
            self._end(setup.flow, err)
        else:
            log.info("accel %d: connection setup towards accel %d: %s", self.accel_id,
                     setup.remote, err.strerror)

    def _connected(self, remote: int) -> None:
        """The connection to `remote` became ESTABLISHED: the setups whose HELLO went out
        are done, and their imports go on to NPA_REQ."""
        if (self.conn(remote).peer_incarnation is None and self.probe is not None
                and QUIRK_NO_RESTART_PROBE not in self.quirks):
            # Its probe found nothing to read yet (the link came up for this connection, on
            # first use: fabric/dialing.py); the peer announced itself since, and a restart
            # is told from this reading.
            try:
                self._probe(remote)
            except DrmError:
                pass
        for setup in [s for s in self.setups.values() if s.remote == remote and s.sent]:
            del self.setups[setup.number]
            flow = setup.flow
            if flow is not None and self.flows.get(flow.node.handle_lo) is flow:
                self._request(flow)

    def _request(self, flow: ImportFlow) -> None:
        """I12: NPA_REQ to the exporter, the connection's generation noted for I14."""
        node = flow.node
        flow.step, flow.sent, flow.deadline = ImportStep.REQUESTING, False, None
        flow.generation = self.conn(node.exporter).ready_generation()
        self.outbox.append(Send(self.accel_id, node.exporter, self.npa_req(node),
                                NpaReqSent(node.handle_lo)))

    def _npa_req_sent(self, tag: NpaReqSent, err: DrmError | None, now: float | None) -> None:
        flow = self.flows.get(tag.handle_lo)
        if flow is None or flow.step != ImportStep.REQUESTING:
            return
        if err is not None:
            if QUIRK_NPA_REQ_FAIL_NO_RESET not in self.quirks:
                # §13 N3 (U left it alone): the connection to the exporter is reset first,
                # with the cleanup of §5.8, if it is ESTABLISHED: N passes the generation it
                # reads at that moment, not the one the NPA_REQ was sent with.
                c = self.conn(flow.node.exporter)
                self.connection_reset(c.remote, ConnState.NOT_READY, c.ready_generation())
            self._end(flow, err)
            return
        flow.sent = True
        if flow.node.state != NodeState.NOT_READY:  # answered (or torn down) already
            self._finish(flow)
        else:
            self._arm(flow, now)

    def _node_changed(self, node: ImportNode) -> None:
        """The node was answered or torn down: a flow waiting on it finishes (I13, I15)."""
        flow = self.flows.get(node.handle_lo)
        if (flow is not None and flow.node is node and flow.step == ImportStep.REQUESTING
                and flow.sent):
            self._finish(flow)

    def _finish(self, flow: ImportFlow) -> None:
        try:
            buf = self.import_finish(flow.node)
        except DrmError as e:
            self._end(flow, e)
        else:
            self._end(flow, None, buf)

    def _end(self, flow: ImportFlow, err: DrmError | None, buf: DmaBuf | None = None) -> None:
        """DONE: the node leaves the table unless READY; the waiter is woken."""
        lo = flow.node.handle_lo
        if self.flows.get(lo) is flow:
            del self.flows[lo]
        flow.step, flow.deadline, flow.error, flow.buf = ImportStep.DONE, None, err, buf
        self.import_abort(flow.node)
        self.outbox.append(Wake(ImportDone(lo)))

    def import_cancelled(self, flow: ImportFlow) -> None:
        """The waiter was cancelled (I10): a connection being set up for it goes back to
        NOT_READY, the node leaves the table; an outcome nobody will take is dropped."""
        if flow.done:
            if flow.buf is not None:
                buf, flow.buf = flow.buf, None
                buf.put()
            return
        for setup in [s for s in self.setups.values() if s.flow is flow]:
            del self.setups[setup.number]
            self._hello_failed(setup.remote)
        del self.flows[flow.node.handle_lo]
        flow.step, flow.deadline = ImportStep.DONE, None
        flow.error = DrmError(errno.EINTR, "the import was interrupted")
        self.import_abort(flow.node)

    # -- the revoke flow ----------
    def _revoke_sent(self, tag: RevokeSent, dst: int, err: DrmError | None,
                     now: float | None) -> None:
        entry = self.invalid.get(tag.handle_lo)
        if entry is None or entry.revoke is None:
            return
        revoke = entry.revoke
        revoke.unsent -= 1
        if err is not None:
            revoke.expected.discard(dst)
            if QUIRK_REVOKE_NO_RECHECK not in self.quirks:  # §13 N5, as U′ (U: no reset)
                gen = entry.importers[dst].generation if dst in entry.importers else 0
                self.connection_reset(dst, ConnState.NOT_READY, gen)
        if not revoke.expected:
            self.revoke_finish(entry)
        elif revoke.unsent == 0:
            self._arm(entry, now)  # step 6: wait up to 5 s for the releases

    def send_due(self, send: Send, now: float | None = None) -> bool:
        """Asked by the carrier just before it posts `send`: False drops it unsent.

        §13 N5: an NPA_REVOKE goes only to an importer whose connection is still ESTABLISHED
        with the generation its record holds; one that went down since the revoke began is
        dropped from the release-expected set (not waited for). U sends to every importer
        of the set it built first (quirk "revoke-no-recheck")."""
        tag = send.tag
        if not isinstance(tag, RevokeSent) or QUIRK_REVOKE_NO_RECHECK in self.quirks:
            return True
        entry = self.invalid.get(tag.handle_lo)
        if entry is None or entry.revoke is None or send.dst not in entry.revoke.expected:
            return True
        rec = entry.importers.get(send.dst)
        if rec is not None and self.conn(send.dst).ready_generation() == rec.generation:
            return True
        revoke = entry.revoke
        revoke.unsent -= 1
        revoke.expected.discard(send.dst)
        log.info("accel %d: accel %d went down before its NPA_REVOKE of %#x: skipped",
                 self.accel_id, send.dst, tag.handle_lo)
        if not revoke.expected:
            self.revoke_finish(entry)
        elif revoke.unsent == 0:
            self._arm(entry, now)  # step 6 for the importers it did send to
        return False

    # -- time (aioquic's get_timer / handle_timer) --------------------------------------------
    def _arm(self, what: ImportFlow | ConnSetup | ExportEntry, now: float | None) -> None:
        assert now is not None, "a send that starts a wait is reported with the time"
        deadline = now + self.response_timeout
        if isinstance(what, ExportEntry):
            assert what.revoke is not None
            what.revoke.deadline = deadline
        else:
            what.deadline = deadline
        heapq.heappush(self._timers, (deadline, next(self._timer_seq), what))
        self.deadline_armed = True

    def _armed(self, deadline: float, what: ImportFlow | ConnSetup | ExportEntry) -> bool:
        """Whether a timer entry still stands (its flow may have ended or moved on)."""
        if isinstance(what, ImportFlow):
            return self.flows.get(what.node.handle_lo) is what and what.deadline == deadline
        if isinstance(what, ConnSetup):
            return self.setups.get(what.number) is what and what.deadline == deadline
        return (self.invalid.get(what.handle_lo) is what and what.revoke is not None
                and what.revoke.deadline == deadline)

    def get_timer(self) -> float | None:
        """The next deadline of a flow (None: nothing waits for time)."""
        self.deadline_armed = False
        timers = self._timers
        while timers and not self._armed(timers[0][0], timers[0][2]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def handle_timer(self, now: float) -> None:
        """Every deadline at or before `now` fires: I11 (no HELLO_ACK), I14 (no NPA_RSP:
        ETIMEDOUT and a connection reset), §5.7 step 6 (releases missing: finish)."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, what = heapq.heappop(timers)
            if not self._armed(deadline, what):
                continue
            if isinstance(what, ConnSetup):
                what.deadline = None
                self._setup_failed(what, DrmError(errno.ETIMEDOUT,
                                                  f"no HELLO_ACK from accel {what.remote}"))
            elif isinstance(what, ImportFlow):
                node = what.node
                self._end(what, DrmError(errno.ETIMEDOUT, f"no NPA_RSP from accel "
                                                          f"{node.exporter}"))
                self._import_timed_out(node, what.generation)
            else:
                assert what.revoke is not None
                what.revoke.deadline = None
                self.revoke_finish(what)

    def take_effects(self) -> list[Effect]:
        out, self.outbox = self.outbox, []
        return out

    # -- introspection ----------
    def check_invariants(self) -> None:
        """Pin count ≥ importers for every export and a pinned BO in VRAM (§5.6 step 3),
        NPA bookkeeping consistent."""
        assert not _NO_IMPORTERS, "the shared empty importers dict was written to"
        for entry in list(self.exports.values()):
            assert entry.bo.pin_count >= len(entry.importers), (
                f"pin count {entry.bo.pin_count} < importers {len(entry.importers)}")
            assert not entry.bo.pin_count or entry.bo.placement is self.driver.vram, (
                "a pinned BO outside VRAM")
        reserved = 0 if self.npa.reserved is None else 1
        assert len(self.npa_table) + reserved == len(self.npa.used)
        # §13 N2's "shared with that peer" counts, kept as they change, equal a recount.
        imported: dict[int, int] = {}
        for node in self.imports.values():
            if node.linked:
                imported[node.exporter] = imported.get(node.exporter, 0) + 1
        exported: dict[int, int] = {}
        for entry in self.exports.values():
            for remote in entry.importers:
                exported[remote] = exported.get(remote, 0) + 1
        assert imported == self._imported_from, (imported, self._imported_from)
        assert exported == self._exported_to, (exported, self._exported_to)


# receive(): each message type's handler (one lookup per message, not a chain of isinstance).
_RECEIVERS: dict[type, Callable[..., None]] = {
    p.Hello: UalinkManager._on_hello,
    p.HelloAck: UalinkManager._on_hello_ack,
    p.NpaReq: UalinkManager._on_npa_req,
    p.NpaRsp: UalinkManager._on_npa_answer,
    p.NpaFail: UalinkManager._on_npa_answer,
    p.NpaRevoke: UalinkManager._on_revoke,
    p.NpaRelease: UalinkManager._on_release,
}
