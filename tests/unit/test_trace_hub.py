"""`ualinkd record`'s subscriber queues (replay/record.py's TraceHub): bounded in records
and in bytes, so a recorder that stops reading costs the daemon a bounded amount of memory
and its recording says how many records it lost."""

from __future__ import annotations

import trio

from ualinkd.replay import record


class _Rec:
    """A record as the hub sees it: what it renders to."""

    name = "load"

    def __init__(self, size: int) -> None:
        self.line = "x" * size

    def json(self) -> str:
        return self.line


def test_a_subscriber_that_stops_reading_holds_queue_bytes_at_most(monkeypatch) -> None:
    """A GPU load's record is 2 MiB of JSON hex: 65,536 of them queued for a stopped
    recorder were 128 GiB. Past QUEUE_BYTES a record is counted lost instead; what the
    subscriber takes frees its room again."""
    monkeypatch.setattr(record, "QUEUE_BYTES", 10_000)
    hub = record.TraceHub(None)
    send, recv = trio.open_memory_channel[str](record.QUEUE)
    counts = [0, 0]
    hub.subscribers.append((send, counts))
    for _ in range(50):
        hub(_Rec(1000))  # type: ignore[arg-type]
    assert recv.statistics().current_buffer_used == 10
    assert counts == [40, 10_000]
    recv.receive_nowait()
    counts[1] -= 1000  # (the subscriber's task does this once the line is sent)
    hub(_Rec(1000))  # type: ignore[arg-type]
    assert counts == [40, 10_000] and recv.statistics().current_buffer_used == 10
