"""NCCL's TCP sockets per peer, from the iperf3 stream count that measured the link
(train.agent.measure.nccl_sockets)."""

from __future__ import annotations

import pytest

from train.agent.measure import iperf, nccl_sockets


@pytest.mark.parametrize(("expected_mbps", "split"), [(1_000, None), (25_000, "1x5"), (50_000, "2x5"),
                                                      (100_000, "2x8")])
def test_a_link_gets_as_many_nccl_sockets_as_iperf3_needed_streams(expected_mbps, split):
    """1 Gb/s: one flow filled it, NCCL keeps its defaults; 100 Gb/s: 16 flows, NCCL's own AWS split 2x8."""
    streams = iperf.streams("auto", expected_mbps)
    chosen = nccl_sockets.choose("auto", streams)
    assert (str(chosen) if chosen else None) == split
    if chosen:
        assert chosen.total == streams


def test_every_count_splits_within_nccls_limits():
    for total in range(1, 200):
        s = nccl_sockets.split(total)
        assert 1 <= s.threads <= 16 and s.per_thread <= 8 and min(total, 64) <= s.total <= 64, (total, s)
    assert nccl_sockets.split(64).env() == {"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "8"}


def test_an_explicit_choice_wins_over_the_measurement():
    assert str(nccl_sockets.choose("4x4", 16)) == "4x4"
    assert str(nccl_sockets.choose(24, 1)) == "3x8"  # a count is split
    assert nccl_sockets.choose("none", 16) is None and nccl_sockets.choose(False, 16) is None


@pytest.mark.parametrize(("setting", "said"), [
    ("5x16", "NCCL sockets 5x16: threads 1 to 16, threads x sockets per thread at most 64"),
    ("17x1", "threads 1 to 16"),
    ("65", "a socket count (1 to 64)"),
    ("many", "not 'many'"),
    ("2x", "not '2x'"),
])
def test_a_choice_nccl_would_not_take_is_refused_with_what_it_takes(setting, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        nccl_sockets.choose(setting, 16)


def test_the_environment_file_says_where_the_sockets_come_from():
    assert nccl_sockets.env_lines("auto", 16) == [
        "# NCCL's TCP sockets per connection: 2x8 (16), from the 16 parallel iperf3 streams that measured the link",
        "NCCL_SOCKET_NTHREADS=2", "NCCL_NSOCKS_PERTHREAD=8"]
    assert nccl_sockets.env_lines("4x4", 1)[0].endswith("from network_nccl_sockets: 4x4")
    assert nccl_sockets.env_lines("auto", 1) == [] and nccl_sockets.env_lines("none", 16) == []
