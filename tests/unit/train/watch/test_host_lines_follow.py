"""The host lines under `fab train`'s bar follow the run's members: after an elastic restart
without v100b they show v100a alone, and v100b again once it is grown back."""

from __future__ import annotations

from train.cluster import Host
from train.recipe.record import Run
from train.watch.compact import HostLines


def names(lines: HostLines) -> list[str]:
    return [f.host.name for f in lines.feed.hosts]


def test_host_lines_follow_the_runs_members():
    a, b = Host(name="v100a", address="10.0.0.1"), Host(name="v100b", address="10.0.0.2")
    run = Run(run_id="r", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    lines = HostLines(run, [a, b])
    try:
        lines.follow([a])
        assert names(lines) == ["v100a"]
        feed = lines.feed
        lines.follow([a])
        assert lines.feed is feed  # unchanged members keep their connections
        lines.follow([a, b])
        assert names(lines) == ["v100a", "v100b"]
    finally:
        lines.close()
