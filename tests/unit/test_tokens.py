"""dma-buf tokens (Emulator policy 5)."""

from __future__ import annotations

import errno

import pytest
from ualink_testkit import (
    CALLER,
    OTHER_UID,
    ScriptedBits,
    gem_create,
    make_node,
    open_file,
    open_token,
    pod_config,
    prime_to_fd_raw,
    prime_to_token,
)

from ualinkd.drm.errors import DrmError


def errno_of(fn, *args) -> int:
    with pytest.raises(DrmError) as e:
        fn(*args)
    return e.value.errno


def test_tokens_are_nonzero_and_unique():
    """Policy 5: a token is a random non-zero u32, drawn below 2^31 so that it reads as a
    positive s32 in PRIME_HANDLE_TO_FD's fd field; 0 and live tokens are redrawn."""
    bits = ScriptedBits()
    core = make_node(pod_config(nodes=[[{"id": 0}]]), randbits=bits)
    f = open_file(core)
    h = gem_create(f)
    bits.values = [0, 77, 77, 0, 78]
    bits.calls.clear()
    assert prime_to_token(f, h) == 77
    assert prime_to_token(f, h) == 78
    assert bits.calls == [31] * 5


def test_lookup_open_size_and_single_use():
    """Policy 5: the same uid opens a token once; its size is the BO size; a used token,
    a foreign uid or a malformed name → ENOENT."""
    core = make_node()
    f = open_file(core)
    h = gem_create(f, size=3 * 4096)
    token = prime_to_token(f, h)
    assert errno_of(core.dmabuf_lookup, str(token), OTHER_UID) == errno.ENOENT
    for name in ["0", "x", "-1", str(token) + "0" * 10, str(token ^ 1)]:
        assert errno_of(core.dmabuf_lookup, name, CALLER) == errno.ENOENT
    key, size = core.dmabuf_lookup(str(token), CALLER)
    assert size == 3 * 4096
    assert errno_of(core.tokens.open, key, OTHER_UID.uid) == errno.EACCES
    assert core.tokens.open(key, CALLER.uid) == key
    assert core.dmabuf_size(key) == 3 * 4096
    assert errno_of(core.dmabuf_lookup, str(token), CALLER) == errno.ENOENT
    assert errno_of(core.tokens.open, key, CALLER.uid) == errno.ENOENT
    assert core.dmabuf_resolve(key) is core.tokens.resolve(key)


def test_unopened_tokens_die_with_their_file():
    """Policy 5: a DrmFile's unopened tokens are dropped when it closes; the dma-buf
    reference goes back; opened ones survive."""
    core = make_node()
    f = open_file(core)
    h = gem_create(f)
    t_open, t_pending = prime_to_token(f, h), prime_to_token(f, h)
    key = open_token(core, t_open)
    buf = core.tokens.resolve(key)
    g = open_file(core)
    t_other = prime_to_token(g, gem_create(g))
    assert buf.refcount == 4  # obj cache, f's PRIME cache, pending token, open file
    f.release()
    assert buf.refcount == 1
    assert core.tokens.pending_count == 1  # g's token is untouched
    assert errno_of(core.dmabuf_lookup, str(t_pending), CALLER) == errno.ENOENT
    core.dmabuf_lookup(str(t_other), CALLER)
    assert len(f.device.objects) == 2
    core.dmabuf_release(key)
    assert len(f.device.objects) == 1
    assert errno_of(core.tokens.resolve, key) == errno.EINVAL
    assert errno_of(core.dmabuf_size, key) == errno.ENOENT
    core.dmabuf_release(key)  # a second release is harmless


def test_non_ascii_digit_names_are_enoent():
    """Policy 5: a token name is decimal ASCII; "²" or "٣" (str.isdigit() says yes, int()
    says no) is ENOENT, not a ValueError that the FUSE edge would turn into EIO."""
    core = make_node()
    for name in ["\u00b2", "\u0663", "1\u00b2", "\uff11"]:
        assert errno_of(core.dmabuf_lookup, name, CALLER) == errno.ENOENT


def test_unopened_tokens_are_bounded_per_file(monkeypatch):
    """Policy 5, §1.6 I19: a client that never opens its tokens gets EMFILE (as from
    fd_install out of fds) instead of growing the daemon; the refused dma-buf reference
    goes back, and opening a token makes room again."""
    import ualinkd.drm.tokens as tokens

    monkeypatch.setattr(tokens, "MAX_PENDING_PER_FILE", 3)
    core = make_node()
    f = open_file(core)
    h = gem_create(f)
    toks = [prime_to_token(f, h) for _ in range(3)]
    buf = core.tokens.resolve(open_token(core, toks[0]))
    refs = buf.refcount
    toks.append(prime_to_token(f, h))  # the opened one made room
    r = prime_to_fd_raw(f, h)
    assert r.result == -errno.EMFILE
    assert buf.refcount == refs + 1  # only the fourth token's reference was added
    g = open_file(core)
    prime_to_token(g, gem_create(g))  # the limit is per file
    assert core.tokens.pending_count == 4
    f.release()
    assert core.tokens.pending_count == 1
