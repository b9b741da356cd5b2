"""Property tests of the ABI codecs (STYLE rules 4 and 12; spec §1.3, §2.2–§2.8).

For every `Layout`: the generated struct.Struct codec and the construct schema agree on
every input of the exact size, encode agrees, decode(encode(x)) == x, and any other length
raises struct.error / construct's error, never anything else. Same for the UALink union.
"""

from __future__ import annotations

import dataclasses
import struct

import construct as cs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import IOC_NONE, IOC_READ, IOC_WRITE, IoctlCmd, ioc

LAYOUTS = [v for v in vars(st).values() if isinstance(v, st.Layout)]
layout_param = pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
DECODE_ERRORS = (struct.error, cs.ConstructError)


def records(layout: st.Layout) -> hs.SearchStrategy:
    """Records with every field inside its C type's range."""
    fields = []
    for ch in layout.fast.format[1:]:
        bits = struct.calcsize(ch) * 8
        if ch.islower():
            fields.append(hs.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1))
        else:
            fields.append(hs.integers(0, (1 << bits) - 1))
    return hs.tuples(*fields).map(lambda t: layout.record(*t))


@layout_param
@settings(max_examples=60, deadline=None)
@given(data=hs.data())
def test_fast_decode_equals_construct_decode(layout, data):
    """STYLE 4: fast decode == construct decode for random bytes of the exact size."""
    raw = data.draw(hs.binary(min_size=layout.size, max_size=layout.size))
    assert layout.decode(raw) == layout.decode_construct(raw)


@layout_param
@settings(max_examples=30, deadline=None)
@given(data=hs.data())
def test_one_field_reads_and_puts_what_the_whole_record_does(layout, data):
    """Layout.field (what handlers put an out field with, and the ioctl table's handed
    values are named by): reading one field gives the decoded record's value, putting a
    value changes that field and no other byte."""
    a, b = data.draw(records(layout)), data.draw(records(layout))
    for name in (f.name for f in dataclasses.fields(layout.record)):
        at = layout.field(name)
        raw = bytearray(layout.encode(a))
        assert at.get(raw) == getattr(a, name)
        at.put(raw, getattr(b, name))
        assert layout.decode(bytes(raw)) == dataclasses.replace(a, **{name: getattr(b, name)})
    with pytest.raises(KeyError):
        layout.field("no_such_field")


@layout_param
@settings(max_examples=60, deadline=None)
@given(data=hs.data())
def test_encode_equals_construct_encode_and_round_trips(layout, data):
    """STYLE 4: encode == construct encode; decode(encode(x)) == x; encode(decode(b)) == b."""
    value = data.draw(records(layout))
    raw = layout.encode(value)
    assert len(raw) == layout.size
    assert raw == layout.encode_construct(value)
    assert layout.decode(raw) == value
    assert layout.decode_construct(raw) == value
    assert layout.encode(layout.decode(raw)) == raw


@layout_param
@settings(max_examples=40, deadline=None)
@given(data=hs.data())
def test_wrong_length_raises_the_documented_error(layout, data):
    """STYLE 12 / rule 4 ("no trailing bytes accepted"): any other length raises
    struct.error (fast) or a construct error (schema), never anything else, never a value."""
    n = data.draw(hs.integers(0, 3 * layout.size).filter(lambda n: n != layout.size))
    raw = data.draw(hs.binary(min_size=n, max_size=n))
    with pytest.raises(struct.error):
        layout.decode(raw)
    with pytest.raises(cs.ConstructError):
        layout.decode_construct(raw)


@layout_param
def test_out_of_range_field_raises_on_encode(layout):
    """STYLE 12: a field too large for its C type does not silently wrap."""
    first = layout.fast.format[1]
    too_big = 1 << (struct.calcsize(first) * 8)
    fields = [too_big] + [0] * (len(layout.fast.format) - 2)
    with pytest.raises(struct.error):
        layout.encode(layout.record(*fields))
    with pytest.raises(cs.ConstructError):
        layout.encode_construct(layout.record(*fields))


@settings(max_examples=200, deadline=None)
@given(raw=hs.binary(min_size=24, max_size=24))
def test_ualink_fast_decode_equals_construct(raw):
    """§1.3: decode_ualink_handle_in == decode_ualink_handle_in_construct on every input."""
    fast = st.decode_ualink_handle_in(raw)
    assert fast == st.decode_ualink_handle_in_construct(raw)
    op, flags, lo, hi = struct.unpack("<IIQQ", raw)
    assert fast == st.UalinkHandleIn(op, flags, int.from_bytes(raw[8:12], "little"), lo, hi)


@settings(max_examples=100, deadline=None)
@given(raw=hs.binary(max_size=64).filter(lambda b: len(b) != 24))
def test_ualink_wrong_length_raises(raw):
    """§1.3 / STYLE 12: the 24-byte union decoders reject every other length."""
    with pytest.raises(struct.error):
        st.decode_ualink_handle_in(raw)
    with pytest.raises(cs.ConstructError):
        st.decode_ualink_handle_in_construct(raw)


@settings(max_examples=200, deadline=None)
@given(
    direction=hs.sampled_from([IOC_NONE, IOC_WRITE, IOC_READ, IOC_READ | IOC_WRITE]),
    type_=hs.integers(0, 255),
    nr=hs.integers(0, 255),
    size=hs.integers(0, (1 << 14) - 1),
)
def test_ioctl_cmd_round_trip(direction, type_, nr, size):
    """§1.1: IoctlCmd.decode(ioc(...)) gives back every field, and encodes to the same cmd."""
    cmd = ioc(direction, type_, nr, size)
    assert 0 <= cmd < 1 << 32
    d = IoctlCmd.decode(cmd)
    assert (d.direction, d.type, d.nr, d.size) == (direction, type_, nr, size)
    assert d.encode() == cmd
    assert d.copies_in == bool(direction & IOC_WRITE)
    assert d.copies_out == bool(direction & IOC_READ)


def test_ioctl_cmd_known_value():
    """§1.1: 0xC018645B is IOWR 'd' 0x5B size 24."""
    assert IoctlCmd.decode(0xC018645B) == IoctlCmd(3, 0x64, 0x5B, 24)


@pytest.mark.parametrize("args", [(4, 0, 0, 0), (0, 256, 0, 0), (0, 0, 256, 0), (0, 0, 0, 1 << 14),
                                  (0, -1, 0, 0)])
def test_ioc_rejects_out_of_range_fields(args):
    """§1.1: _IOC fields have 2/8/8/14 bits; ioc() refuses values that would not fit."""
    with pytest.raises(ValueError):
        ioc(*args)


@pytest.mark.parametrize("layout", [v for v in vars(st).values() if isinstance(v, st.ArrayLayout)],
                         ids=lambda lay: lay.name)
@settings(max_examples=20, deadline=None)
@given(data=hs.data())
def test_array_layout_fields_read_what_decode_does(layout, data):
    """ArrayLayout.field: a scalar field, or element i of an array field (named `x[i]`),
    reads what the whole struct's decode gives."""
    raw = data.draw(hs.binary(min_size=layout.size, max_size=layout.size))
    value = layout.decode(raw)
    for name, count in zip(layout.offsets, layout.counts, strict=True):
        whole = getattr(value, name)
        for i in range(count or 1):
            at = layout.field(name, i)
            assert at.get(raw) == (whole if count is None else whole[i])
            assert at.name == (name if count is None else f"{name}[{i}]")
