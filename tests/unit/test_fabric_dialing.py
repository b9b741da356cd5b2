"""fabric/dialing.py, the dialing policy, sans-IO: when links come up, who dials, backoff with
jitter, and how long a first use waits for its link (spec §5.4's setup_connection waits for
its HELLO's answer)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.fabric import dialing


def test_small_pods_link_at_start_large_ones_on_first_use():
    assert dialing.links_at_start("auto", 2)
    assert dialing.links_at_start("auto", dialing.AT_START_MAX_NODES)
    assert not dialing.links_at_start("auto", dialing.AT_START_MAX_NODES + 1)
    assert not dialing.links_at_start("auto", 256)
    assert dialing.links_at_start("at-start", 256)
    assert not dialing.links_at_start("on-first-use", 2)
    with pytest.raises(ValueError, match="lazy"):
        dialing.links_at_start("lazy", 2)


@given(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8))
def test_exactly_one_side_of_a_pair_dials(a, b):
    if a != b:
        assert dialing.dials(a, b) != dialing.dials(b, a)


@given(st.floats(0.001, 1.0), st.integers(1, 64),
       st.lists(st.floats(0.0, 0.999), min_size=40, max_size=40))
def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half(first, ratio, draws):
    cap = first * ratio
    it = iter(draws)
    b = dialing.Backoff(first, cap, rand=lambda: next(it))
    d = first
    for r in draws[:30]:
        got = b.next_delay()
        assert got == pytest.approx(d / 2 + d / 2 * r)
        assert d / 2 <= got <= d <= cap
        d = min(d * 2, cap)
    b.reset()
    assert b.next_delay() <= first


def test_backoff_jitter_spreads_dials_that_failed_together():
    """Nodes that failed at once come back at different times (the retry storm of a
    256-node mesh came from dials that all failed, and retried, together)."""
    delays = {round(dialing.Backoff(0.1, 2.0).next_delay(), 6) for _ in range(50)}
    assert len(delays) > 40
    assert all(0.05 <= d <= 0.1 for d in delays)
    with pytest.raises(ValueError):
        dialing.Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        dialing.Backoff(2.0, 1.0)


def test_first_use_waits_for_the_link_then_counts_the_peer_unreachable():
    f = dialing.FirstUse(wait=5.0)
    assert not f.wanted("b")
    assert not f.setting_up("b", 0.0)  # (not wanted: nothing is being set up)
    assert f.want("b", 10.0)
    assert not f.want("b", 11.0)  # (its loop started once)
    assert f.wanted("b")
    assert f.setting_up("b", 14.9)  # its uses wait for the link
    assert not f.setting_up("b", 15.0)  # tried for the wait: unreachable


def test_a_link_that_worked_and_dropped_is_an_unreachable_peer():
    f = dialing.FirstUse(wait=5.0)
    f.want("b", 0.0)
    f.up("b")
    assert not f.setting_up("b", 1.5)


def test_a_link_not_up_yet_is_unlinked_or_linking_not_down():
    """ualink_fabric's state of a link on first use that is not up: `unlinked` until a use
    asks for it (or the peer links it), `linking` while the use waits for it, `down` once
    the wait is over (unreachable) or after it has been up (dropped)."""
    f = dialing.FirstUse(wait=5.0)
    assert f.down_state("b", 0.0) == dialing.UNLINKED
    f.want("b", 10.0)
    assert f.down_state("b", 14.9) == dialing.LINKING
    assert f.down_state("b", 15.0) == dialing.DOWN  # tried for the wait: unreachable
    f.up("b")
    assert f.down_state("b", 15.0) == dialing.DOWN  # dropped after it worked
    f.up("c")  # the peer linked it (we never wanted it): once down, a dropped link
    assert f.down_state("c", 0.0) == dialing.DOWN
