"""The C data plane's Python side: its channels, its routes, and the accesses it hands back.

fuse/dataplane.c says what the C does and why. A FuseSession owns one DataPlane (its
thread replies to that session's reads and writes). The fabric link hands it each
authenticated data channel (`open`/`close`: fabric/channels.py's DataChannels). The routes
come from what Python served itself: `route_import` after a render-node read or write that
one remote mapping answered (lowlevel.py), `route_export` after a LOAD or STORE that BO
chunks answered (daemon.py). Every route goes at the next `translation.changed()`.
The GPU engine's remote copies load through it too (`load_into`: a piece's bytes received
straight into a buffer of the engine's, its outcome a Completion).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import Any

import trio

from ualinkd.amdgpu import translation
from ualinkd.drm.completion import Completion
from ualinkd.fuse._fuse_ll import ffi, lib

log = logging.getLogger(__name__)

FAST_MAX = lib.DP_FAST_MAX  # the largest load the C carries
CHANNELS = lib.DP_CHANNELS  # channels open at once (one per peer that has one)
# s a dropped channel's line waits for its link's fate: a peer that stops (a pod stopping,
# a daemon restarted or killed) closes its channels and its link together, and the channel's
# end is often seen first; the link's own line then says why both went.
DROP_LOG_GRACE = 2.0
_FALLBACKS_PER_TAKE = 256
_LOADED_PER_TAKE = 256
# ualinkd_dp_stats's counters, in the order it writes them (stats() names them)
_STATS = ("fast_loads", "served", "fallbacks", "refused", "spliced", "fast_stores",
          "served_stores", "refused_stores", "late_stores", "reused_buffers", "kept_buffers")
_LATE_STORES = _STATS.index("late_stores")  # (log_events reads it alone)
# An engine load's outcome (`load_into`): its bytes are in the buffer; not carried (the
# caller loads them through the link); no answer within the link's deadline (the link's
# fault); the data plane stopped.
LOADED = 0
FALLBACK = lib.DP_FALLBACK
EXPIRED = -errno.ETIME

# (req, ino, size, off, fh, unique, expired: no answer within the deadline, to fault,
#  data: a store's bytes, None for a load)
Fallback = tuple[Any, int, int, int, int, int, bool, bytes | None]


class DataPlane:
    def __init__(self) -> None:
        dp = lib.ualinkd_dp_new()
        if dp == ffi.NULL:
            raise MemoryError("ualinkd_dp_new")
        self.pointer: Any = dp
        self.notify_fd = -1
        self._peers: dict[int, str] = {}  # channel handle -> peer
        self._fallbacks = ffi.new("struct dp_fallback[]", _FALLBACKS_PER_TAKE)
        self._stats = ffi.new("uint64_t[]", len(_STATS))
        self._late_logged = 0
        self.on_broken: Callable[[int], None] | None = None  # DataChannels.on_broken
        # Whether the link to a peer is up (FabricLink.is_up; None: no link to ask, a
        # dropped channel is logged at once)
        self.link_up: Callable[[str], bool] | None = None
        self._said_full = False  # has_room said the table is full (once per episode)
        # Engine loads out (`load_into`): token -> (its Completion, the buffer the thread
        # writes into, kept alive here until the thread posted its outcome)
        self._loads: dict[int, tuple[Completion[int], Any]] = {}
        self._next_token = 1
        self._loaded = ffi.new("struct dp_loaded[]", _LOADED_PER_TAKE)
        self._engine_stats = ffi.new("uint64_t[2]")
        self._event_handle = ffi.new("int *")  # (log_events': what take_event fills in)
        self._event_why = ffi.new("char[160]")
        translation.listen(self.flush)

    @property
    def running(self) -> bool:
        return self.notify_fd >= 0

    def start(self, fuse_fd: int = -1) -> bool:
        """Start the thread, splicing large answers into `fuse_fd` (the session's /dev/fuse;
        -1: it copies them); False (one warning, loads go through Python) if it cannot."""
        if self.pointer == ffi.NULL:
            return False
        fd = lib.ualinkd_dp_start(self.pointer, fuse_fd)
        if fd < 0:
            log.warning("data plane: not started (%s); GPU loads go through the link",
                        os.strerror(-fd))
            return False
        self.notify_fd = fd
        return True

    def stop(self, err: int = errno.EINTR) -> None:
        """Stop the thread: channels closed, the loads it still held answered `err`."""
        if self.notify_fd >= 0:
            try:
                trio.lowlevel.notify_closing(self.notify_fd)
            except RuntimeError:
                pass  # not inside trio: nobody can be waiting on the fd
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_stop(self.pointer, err)
        self.notify_fd = -1
        self._peers.clear()
        self.finish_loads()  # (the thread posted those it held as `-err`)

    def free(self) -> None:
        translation.unlisten(self.flush)
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_stop(self.pointer, errno.EINTR)
            self.finish_loads()  # (what it held: posted EINTR)
            lib.ualinkd_dp_free(self.pointer)
            self.pointer = ffi.NULL
        self.notify_fd = -1

    def set_timeout(self, seconds: float) -> None:
        """A load's deadline once sent: the link's ack_timeout, so that a load carried here
        faults when the same LOAD on the link would (the pod's send_ack_timeout_ms)."""
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_set_timeout(self.pointer, max(1, int(seconds * 1e9)))

    # -- fabric/channels.py's DataChannels -----------------------------------------------
    def open(self, peer: str, fd: int, peer_accels: Collection[int]) -> int | None:
        """A data channel to `peer` (its accels `peer_accels`): takes `fd`."""
        if not self.running:
            os.close(fd)
            return None
        accels = sorted(peer_accels)
        handle = int(lib.ualinkd_dp_open(self.pointer, fd, ffi.new("uint16_t[]", accels),
                                         len(accels)))
        if handle < 0:  # (the C closed fd)
            log.info("data plane: no channel to %s (%s); its loads go through the link",
                     peer, os.strerror(-handle))
            return None
        self._peers[handle] = peer
        log.debug("data plane: channel to %s open", peer)
        return handle

    def has_room(self, dialing: int = 0) -> bool:
        """Whether `open` would take one more channel, `dialing` more being dialed: asked by
        the link before it dials or admits one, so that past CHANNELS peers a link costs no
        channel handshake to be refused (and two lines each); one INFO line when the table
        fills (again after a channel closed)."""
        if not self.running:
            return False
        if len(self._peers) + dialing < CHANNELS:
            return True
        if len(self._peers) >= CHANNELS and not self._said_full:
            self._said_full = True
            log.info("data plane: all %d channels in use; the links to more peers carry "
                     "their loads themselves", CHANNELS)
        return False

    def clock(self, handle: int, origin: float, peer_clock: tuple[int, float] | None) -> None:
        """The link's clocks for channel `handle` (fabric/session.py, trio time): our link
        clock's zero, and the peer's clock from its last PING (its ms, our time on receipt).
        The STOREs we send carry a deadline on the peer's clock as the link's do, and a
        peer's STORE found past its deadline is refused, never stored (policy 10: a store
        its requester reported failed must not land later)."""
        if self.pointer == ffi.NULL:
            return
        to_mono = time.monotonic() - trio.current_time()
        peer_ms, at = peer_clock if peer_clock is not None else (0, None)
        lib.ualinkd_dp_set_clock(self.pointer, handle, int((origin + to_mono) * 1e9), peer_ms,
                                 0 if at is None else max(1, int((at + to_mono) * 1e9)))

    def close(self, handle: int) -> None:
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_close(self.pointer, handle)
        if self._peers.pop(handle, None) is not None:
            self._said_full = False  # (room again: the next time it fills is news)

    # -- routes ----------------------------------------------------------------------------
    def flush(self) -> None:
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_flush(self.pointer)

    def forget_file(self, fh: int) -> None:
        """File `fh` was released: its routes go."""
        if self.pointer != ffi.NULL:
            lib.ualinkd_dp_forget_file(self.pointer, fh)

    def route_import(self, fh: int, va_start: int, va_end: int, npa_start: int, src: int,
                     dst: int, *, write: bool = False) -> None:
        """Reads (`write`: writes) of file `fh` in [va_start, va_end) load (store) NPA
        `npa_start` on at accel `dst`, issued by accel `src`."""
        if self.running:
            lib.ualinkd_dp_route_import(self.pointer, fh, va_start, va_end, npa_start, src,
                                        dst, lib.DP_WRITE if write else lib.DP_READ)

    def route_export(self, src: int, dst: int, npa_start: int, length: int,
                     backing: bytearray | int | None, offset: int) -> None:
        """LOADs (and STOREs) from accel `src` of NPA [npa_start, +length) at our accel `dst`
        read (write) `backing` from `offset`: a BO chunk (which must live, never resized,
        until the next translation.changed(): BoMemory's chunks do), a BO's memfd, or None
        for zeros (no STORE: Python makes the chunk)."""
        if not self.running or length <= 0:
            return
        if isinstance(backing, bytearray):
            if offset < 0 or offset + length > len(backing):
                return
            mem = ffi.cast("const char *", ffi.from_buffer(backing)) + offset
            lib.ualinkd_dp_route_export(self.pointer, src, dst, npa_start, mem, -1, 0, length)
        else:
            lib.ualinkd_dp_route_export(self.pointer, src, dst, npa_start, ffi.NULL,
                                        -1 if backing is None else backing, offset, length)

    # -- the GPU engine's loads ------------------------------------------------------------
    def load_into(self, src: int, dst: int, npa: int, buf: bytearray, offset: int,
                  n: int) -> Completion[int] | None:
        """A load of NPA [npa, +n) at accel `dst` issued by our accel `src`, its bytes
        received by the thread straight into buf[offset:offset + n]: its outcome (LOADED,
        FALLBACK, EXPIRED or -errno) by Completion, once the thread no longer touches the
        buffer (it is kept alive here until then, whatever becomes of the caller). None
        when the data plane does not take it (no channel to `dst`, its window full, more
        than FAST_MAX): the caller loads it through the link."""
        if not self.running or not 0 < n <= FAST_MAX or offset < 0 or offset + n > len(buf):
            return None
        token = self._next_token
        view = ffi.from_buffer(buf)  # (holds buf, and keeps it from being resized)
        if lib.ualinkd_dp_load_into(self.pointer, src, dst, npa,
                                    ffi.cast("char *", view) + offset, n, token) != 0:
            return None
        self._next_token += 1
        c: Completion[int] = Completion()
        self._loads[token] = (c, view)
        return c

    def finish_loads(self) -> None:
        """Complete the engine loads whose outcome the thread posted."""
        if self.pointer == ffi.NULL or not self._loads:
            return
        while True:
            n = lib.ualinkd_dp_take_loaded(self.pointer, self._loaded, _LOADED_PER_TAKE)
            for d in self._loaded[0:n]:
                c, _ = self._loads.pop(d.token)
                c.set_result(int(d.status))
            if n < _LOADED_PER_TAKE:
                return

    def engine_stats(self) -> tuple[int, int]:
        """(engine loads carried whole, engine loads handed back to the link or faulted)"""
        if self.pointer == ffi.NULL:
            return 0, 0
        lib.ualinkd_dp_engine_stats(self.pointer, self._engine_stats)
        return int(self._engine_stats[0]), int(self._engine_stats[1])

    # -- what the thread hands back --------------------------------------------------------
    def take_fallbacks(self) -> list[Fallback]:
        out: list[Fallback] = []
        while True:
            n = lib.ualinkd_dp_take_fallbacks(self.pointer, self._fallbacks,
                                              _FALLBACKS_PER_TAKE)
            for f in self._fallbacks[0:n]:
                data = None
                if f.data != ffi.NULL:  # a store's bytes: ours now
                    data = ffi.buffer(f.data, f.size)[:]
                    lib.free(f.block)
                out.append((f.req, f.ino, f.size, f.off, f.fh, f.unique, bool(f.expired), data))
            if n < _FALLBACKS_PER_TAKE:
                return out

    def log_events(self) -> None:
        """One line per channel the thread found broken (and dropped: its link is told,
        `on_broken`, to dial another). Its slot is closed here: the C frees a broken
        channel's slot only when told (ualinkd_dp_close), and a slot never freed would be
        one fewer channel for the daemon's life (64 breaks, any peer's, and no channel
        could open). A channel its link closed meanwhile is not logged: the link's own
        line says why it went; nor is one whose link goes down within DROP_LOG_GRACE (a
        peer that stops closes both; at a 256-node pod's stop every node wrote a WARNING
        per peer): the WARNING is for a channel that broke while its link stays up."""
        if self.pointer == ffi.NULL:
            return
        # (on every wake-up of the thread's eventfd, one per GPU engine load: the counters
        # alone, not stats()'s dict and its engine counters, a third C call)
        lib.ualinkd_dp_stats(self.pointer, self._stats)
        late = int(self._stats[_LATE_STORES])
        if late > self._late_logged:
            self._late_logged = late
            log.warning("data plane: refused a STORE past its deadline (its requester had "
                        "given up): %d so far", late)
        handle, why = self._event_handle, self._event_why
        while lib.ualinkd_dp_take_event(self.pointer, handle, why, len(why)):
            peer = self._peers.get(handle[0])
            if peer is None:
                continue
            self.close(handle[0])
            reason = ffi.string(why).decode(errors="replace")
            if self.link_up is None:
                self._log_dropped(peer, reason)
            else:
                trio.lowlevel.spawn_system_task(self._dropped_with_its_link, peer, reason,
                                                self.link_up)
            if self.on_broken is not None:
                self.on_broken(handle[0])

    @staticmethod
    def _log_dropped(peer: str, why: str) -> None:
        log.warning("data plane: channel to %s dropped: %s (its loads go through the link)",
                    peer, why)

    async def _dropped_with_its_link(self, peer: str, why: str,
                                     link_up: Callable[[str], bool]) -> None:
        """The dropped channel's line once its link had DROP_LOG_GRACE to go down too: a
        WARNING if it is still up, else DEBUG (the link's line says why both went). A
        system task: the daemon's end cancels it, with nothing to report."""
        await trio.sleep(DROP_LOG_GRACE)
        if link_up(peer):
            self._log_dropped(peer, why)
        else:
            log.debug("data plane: channel to %s closed with its link: %s", peer, why)

    def stats(self) -> dict[str, int]:
        """fast_loads: loads of ours the C carried (spliced: those whose answer it spliced
        into /dev/fuse); served: peers' LOADs it answered; fallbacks: loads and stores it
        handed back to Python; refused: LOADs it sent back to the link; fast_stores,
        served_stores, refused_stores: the same for stores; late_stores: STOREs refused
        past their deadline; reused_buffers: carried stores that handed libfuse a request
        buffer kept from an earlier one (dataplane.c DP_SPARES), kept_buffers: how many it
        keeps now (none once idle a second); engine_loads, engine_fallbacks: the GPU
        engine's loads (`load_into`) carried whole, and handed back (to the link, or to
        fault)."""
        if self.pointer == ffi.NULL:
            return {}
        lib.ualinkd_dp_stats(self.pointer, self._stats)
        stats = dict(zip(_STATS, self._stats, strict=True))
        stats["channels"] = len(self._peers)
        stats["engine_loads"], stats["engine_fallbacks"] = self.engine_stats()
        return stats
