"""`fab logs --follow`: every host's new lines, prefixed with the host, until stopped (Ctrl-C);
a host that cannot be reached is said at once and named at the end."""

from __future__ import annotations

import threading

import pytest

from train.cluster import ClusterError, Host
from train.recipe.record import Run
from train.run import logtail

RUN = Run(run_id="run-1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")


class TailingConnection:
    """What `tail -F` over SSH does: the last lines at once, then nothing until the connection closes."""

    def __init__(self, host: Host, chunks: list[str]):
        self.host, self.chunks, self.closed, self.commands = host, chunks, threading.Event(), []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, command, out_stream, **kwargs):
        assert kwargs["pty"] and kwargs["in_stream"] is False  # a pty: closing it hangs tail up
        self.commands.append(command)
        for chunk in self.chunks:
            out_stream.write(chunk)
        self.closed.wait(10)
        return type("Result", (), {"exited": -1})()

    def close(self):
        self.closed.set()


def test_every_hosts_lines_come_prefixed_until_stopped():
    a, b = Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")
    conns = {"v100a": TailingConnection(a, ["update 1\r\nupd", "ate 2\r\n"]),
             "v100b": TailingConnection(b, ["initialized host v100b as rank 1\r\n"])}
    said, stop = [], threading.Event()

    def say(line):
        said.append(line)
        if len(said) == 3:
            stop.set()  # as Ctrl-C does

    lost = logtail.follow_logs(RUN, [a, b], 5, say, opener=lambda h: conns[h.name], stop=stop)
    assert lost == {}
    assert sorted(said) == ["v100a | update 1", "v100a | update 2", "v100b | initialized host v100b as rank 1"]
    assert said.index("v100a | update 1") < said.index("v100a | update 2")
    assert conns["v100a"].commands == ["tail -n 5 -F /data/tandem/runs/run-1/train.log"]
    assert all(c.closed.is_set() for c in conns.values())  # every tail hung up


def test_a_host_that_cannot_be_reached_is_said_and_named_at_the_end():
    a, b = Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")
    alive = TailingConnection(a, ["update 1\n"])

    def opener(host):
        if host.name == "v100b":
            raise OSError("[Errno 113] No route to host")
        return alive

    said, stop = [], threading.Event()
    threading.Timer(0.5, stop.set).start()
    lost = logtail.follow_logs(RUN, [a, b], 20, said.append, opener=opener, stop=stop)
    assert lost == {"v100b": "OSError: [Errno 113] No route to host"}
    assert "v100b | unreachable: OSError: [Errno 113] No route to host" in said and "v100a | update 1" in said


def test_following_hosts_that_all_dropped_ends_by_itself_and_fails_naming_them():
    def opener(host):
        raise EOFError("gone")

    printed = []
    console = type("Console", (), {"print": lambda self, text, **kw: printed.append(text)})()
    with pytest.raises(ClusterError, match=r"^unreachable: v100a \(EOFError: gone\): check that each VM runs"):
        logtail.follow(RUN, [Host("v100a", "10.0.0.1")], 20, console, opener=opener)
    assert printed[-1] == "v100a | unreachable: EOFError: gone"
