"""The link of overlapped bucket reductions (perfmodel/modelling/channel.py), on hand-computed timelines."""
from __future__ import annotations

import math
import signal

import pytest

from pydtnn_lite.perfmodel.modelling.channel import Channel, TransferCost, reduction_phases


def test_a_reduction_halves_and_doubles_in_log2_steps_each_way():
    assert [reduction_phases(p) for p in (2, 3, 4, 8, 9)] == [2, 4, 4, 6, 8]


def two_buckets(inside_calls: bool, window: float = math.inf, cpu_per_byte: float = 0.0) -> Channel:
    """Two buckets of 4 bytes on 2 ranks, 2 s each: phases of 2 bytes and 1 s."""
    return Channel([4.0, 4.0], [2.0, 2.0], 2, inside_calls, TransferCost(cpu_per_byte, window))


def calls(channel: Channel, last: int) -> float:
    """An MPI call every second from 0 to ``last``, both buckets posted at the first; the
    CPU time charged for what moved."""
    cpu = 0.0
    for now in range(last + 1):
        cpu += channel.advance(now)
        channel.call(2)
    return cpu


def left(channel: Channel) -> list[tuple[int, float]]:
    return [(phase.bucket, phase.seconds_left) for phase in channel.moving]


def test_with_several_buckets_outstanding_tests_keep_the_link_busy():
    # A1 over 0-1 (B1 queued behind it at 0), B1 1-2 (A2 queued at 1), A2 2-3 (B2 queued at 2), B2 3-4.
    channel = two_buckets(inside_calls=True)
    calls(channel, 3)
    assert left(channel) == [(1, pytest.approx(1.0))] and not any(channel.phases_left)
    channel.advance(4.0)
    assert not channel.moving and channel.time == 4.0


def test_between_two_calls_the_link_moves_at_most_the_window():
    # A byte per interval between calls, half a phase: A1 over 0-0.5 and 1-1.5, B1 (queued at
    # 0) over 2-2.5 and 3-3.5, A2 (started at 2) 4-4.5 and 5-5.5, B2 (started at 4) 6-6.5 and 7-7.5.
    channel = two_buckets(inside_calls=True, window=1.0, cpu_per_byte=0.25)
    cpu = calls(channel, 7)
    assert left(channel) == [(1, pytest.approx(0.5))] and not any(channel.phases_left)
    assert cpu == pytest.approx(7 * 0.25)  # a byte a second moved beside the computation
    assert channel.advance(8.0) == pytest.approx(0.25) and not channel.moving


def test_networks_that_move_data_on_their_own_run_every_phase_back_to_back():
    channel = two_buckets(inside_calls=False, window=1.0, cpu_per_byte=0.25)
    channel.call(2)
    assert channel.advance(10.0) == 0.0  # no window, no CPU: the host's cores are not involved
    assert sum(channel.phases_left) == 0 and not channel.moving


def test_a_blocking_call_runs_the_outstanding_phases_back_to_back_behind_the_link():
    channel = two_buckets(inside_calls=True, window=1.0)
    channel.advance(0.0)
    channel.call(2)  # A1 and B1 start
    channel.advance(1.0)  # half of A1 (the window)
    # At 1: A1's other half, then B1, A2 and B2 whole, 3.5 s, and nothing left.
    assert channel.finish(1.0, 2) == pytest.approx(4.5)
    assert channel.time == pytest.approx(4.5) and not any(channel.phases_left)


def test_a_bucket_whose_exchanges_inside_the_nodes_stay_off_the_link_holds_it_for_its_link_part():
    # Each bucket 2 s, of which 1 s on the link: phases of 0.5 s back to back, 2 s for both,
    # and the last bucket's second off the link after them.
    channel = Channel([4.0, 4.0], [2.0, 2.0], 2, False, TransferCost(), link_seconds=[1.0, 1.0])
    channel.call(2)
    assert [phase.seconds_left for phase in channel.moving] == [0.5] * 4
    assert channel.finish(0.0, 2) == pytest.approx(3.0)
    done = Channel([4.0, 4.0], [2.0, 2.0], 2, False, TransferCost(), link_seconds=[1.0, 1.0])
    done.call(2)
    done.advance(5.0)  # both buckets through: nothing left to wait for, on the link or off it
    assert done.finish(5.0, 2) == pytest.approx(5.0)


@pytest.mark.parametrize("pipelined, done, left_after", [(False, 4.0, [0, 0]), (True, 2.0, [0, 2])])
def test_a_blocking_call_of_a_pipelined_channel_completes_only_the_reductions_the_tests_started(
        pipelined: bool, done: float, left_after: list[int]) -> None:
    # A is tested at 0 (its first phase starts); B is posted at 0.5, right before a batch-norm
    # reduction blocks. Flat, B's Allreduce is MPICH's to progress: the call waits for A's
    # phases left (1.5 s) and all of B's (2 s). Pipelined, B's collective between the nodes
    # starts at a later test: the call waits for A only, and B's phases are all still to go.
    channel = Channel([4.0, 4.0], [2.0, 2.0], 2, True, TransferCost(), pipelined=pipelined)
    channel.advance(0.0)
    channel.call(1)
    channel.advance(0.5)
    assert channel.block(0.5, 2) == pytest.approx(done)
    assert channel.phases_left == left_after and not channel.moving


def test_a_window_spent_to_a_subnormal_sliver_ends_the_calls_move_instead_of_spinning():
    """A window's bytes less what moved can leave a sliver so small that no time moves it (its
    seconds underflow to 0); validating a hierarchical 2 x 2 trace spun there for good. The
    link stops for that call, and the next call moves the rest."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the link spun on a spent window"))
    signal.alarm(10)
    try:
        channel = Channel([4.0], [2.0], 2, True, TransferCost(window_bytes=5e-324))
        channel.call(1)
        assert channel.advance(0.5) == 0.0 and left(channel) == [(0, 1.0)] and channel.time == 0.5
        unlimited = Channel([4.0], [2.0], 2, False, TransferCost())
        unlimited.call(1)
        unlimited.advance(3.0)
        assert not unlimited.moving and unlimited.time == 3.0
    finally:
        signal.alarm(0)
