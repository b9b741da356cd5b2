"""dma-buf tokens: how a FUSE server hands out dma-buf fds (Emulator policy 5).

The kernel installs an fd in the caller; we cannot. Instead the ioctl returns a random
non-zero u32 token (below 2^31, so the s32 `fd` field of PRIME_HANDLE_TO_FD never reads as a
negative, error-looking value) and the client opens `<mount>/dmabuf/<token>` once, as the
same uid, to get a real fd. A token holds a dma-buf reference until it is opened (the
reference moves to the open file) or its DrmFile closes. `key`s name tokens and open files
in the file tree.
Syncobj files and sync files (SYNCOBJ_HANDLE_TO_FD) are tokens of the same namespace and
directory, so the same open turns them into fds; only their kind tells them apart.
A DrmFile may hold at most `MAX_PENDING_PER_FILE` unopened tokens: past that, installing
fails with EMFILE as fd_install would for a process out of fds (§1.6 I19), so a client that
never opens its tokens cannot grow the daemon without bound.
"""

from __future__ import annotations

import errno
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import DrmError
from .gem import DmaBuf

if TYPE_CHECKING:
    from .file import DrmFile


MAX_PENDING_PER_FILE = 4096


class Shared(Protocol):
    """What a token file holds: a dma-buf, a syncobj file or a sync file."""

    @property
    def size(self) -> int: ...
    def get(self) -> None: ...
    def put(self) -> None: ...


@dataclass(slots=True)
class _Token:
    token: int
    key: int
    buf: Shared
    uid: int
    owner: DrmFile


class DmaBufTokens:
    def __init__(self, randbits: Callable[[int], int] = secrets.randbits) -> None:
        self._randbits = randbits
        self._pending: dict[int, _Token] = {}  # token -> pending
        self._by_key: dict[int, _Token] = {}  # key -> pending
        self.opened: dict[int, Shared] = {}  # key -> open dma-buf (or syncobj) file
        self._per_file: dict[DrmFile, int] = {}  # owner -> its pending tokens
        self._keys = 0

    def install(self, buf: Shared, owner: DrmFile, uid: int) -> int:
        """Take over one reference of `buf` (dropped on failure); return the token the
        client will open. EMFILE when `owner` already holds too many unopened tokens."""
        pending = self._per_file.get(owner, 0)
        if pending >= MAX_PENDING_PER_FILE:
            buf.put()
            raise DrmError(errno.EMFILE, f"{pending} dma-buf tokens were never opened")
        self._per_file[owner] = pending + 1
        token = 0
        while token == 0 or token in self._pending:
            token = self._randbits(31)
        self._keys += 1
        entry = _Token(token, self._keys, buf, uid, owner)
        self._pending[token] = entry
        self._by_key[entry.key] = entry
        return token

    def lookup(self, name: str, uid: int) -> tuple[int, int]:
        """(key, size) of a pending token; ENOENT for unknown, used or foreign tokens."""
        if not (name.isascii() and name.isdigit()) or len(name) > 10:  # not "²" or "٣"
            raise DrmError(errno.ENOENT)
        entry = self._pending.get(int(name))
        if entry is None or entry.uid != uid:
            raise DrmError(errno.ENOENT)
        return entry.key, entry.buf.size

    def size(self, key: int) -> int:
        entry = self._by_key.get(key)
        if entry is not None:
            return entry.buf.size
        buf = self.opened.get(key)
        if buf is None:
            raise DrmError(errno.ENOENT)
        return buf.size

    def open(self, key: int, uid: int) -> int:
        """Consume the token; the open file (named by `key`) now holds the reference."""
        entry = self._by_key.get(key)
        if entry is None or entry.uid != uid:
            raise DrmError(errno.ENOENT if entry is None else errno.EACCES)
        self._forget(entry)
        self.opened[key] = entry.buf
        return key

    def _forget(self, entry: _Token) -> None:
        del self._by_key[entry.key]
        del self._pending[entry.token]
        left = self._per_file[entry.owner] - 1
        if left:
            self._per_file[entry.owner] = left
        else:
            del self._per_file[entry.owner]

    def release(self, key: int) -> None:
        buf = self.opened.pop(key, None)
        if buf is not None:
            buf.put()

    def resolve(self, key: int) -> DmaBuf:
        buf = self.opened.get(key)
        if not isinstance(buf, DmaBuf):
            raise DrmError(errno.EINVAL, "not an open ualinkd dma-buf")
        return buf

    def resolve_any(self, key: int) -> Shared:
        """The open token file of `key`, whatever it holds (EINVAL: none)."""
        buf = self.opened.get(key)
        if buf is None:
            raise DrmError(errno.EINVAL, "not an open ualinkd token file")
        return buf

    def drop_file(self, owner: DrmFile) -> None:
        """The DrmFile that asked is gone: its unopened tokens die with it."""
        for entry in [e for e in self._pending.values() if e.owner is owner]:
            self._forget(entry)
            entry.buf.put()

    @property
    def pending_count(self) -> int:
        return len(self._pending)
