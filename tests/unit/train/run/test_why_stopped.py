"""fab train, following a run that ends early, names the culprit in one line and fails."""

from train.recipe import logformat
from train.run.launch import HostState
from train.run.status import run_state, why_stopped_early

# torchrun's summary when a worker dies, as it lands at the end of a host's train.log
TORCHRUN_SIGKILL = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.agent.trainer.fairseq_train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_02:58:01
  host      : v100b
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================""".splitlines()

TORCHRUN_EXIT = [line.replace("02:58:01", "02:58:07").replace("v100b", "v100a")
                 .replace("rank      : 1", "rank      : 0")
                 .replace("exitcode  : -9 (pid: 4242)", "exitcode  : 1 (pid: 777)")
                 .replace("Signal 9 (SIGKILL) received by PID 4242", "Traceback ...") for line in TORCHRUN_SIGKILL]


# what rank 0 printed in CI when v100b's rank was SIGKILLed: gloo's error, then torchrun's report,
# in the same second as v100b's
GLOO_PEER_CLOSED = [
    "2026-11-23 05:12:09 | INFO | train_inner | epoch 001:     20 / 30 loss=9.346",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.3]:4123",
    "E1123 05:12:10.352000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) "
    "local_rank: 0 (pid: 777) of binary: /opt/tandem/venv/bin/python3",
    "Traceback (most recent call last):",
    '  File "/opt/tandem/venv/bin/torchrun", line 8, in <module>',
    *[line.replace("02:58:07", "02:58:01") for line in TORCHRUN_EXIT],
]


def progress(update: int, finished: bool = False) -> logformat.Progress:
    return logformat.Progress(update=update, max_update=400, loss=5.0, valid_loss=None, seconds_per_update=0.4,
                             wps=1000.0, wpb=400.0, devices=2, finished=finished)


def state(name, running=False, reachable=True, prog=None, lines=()):
    return HostState(name, running, reachable, prog, list(lines)[-8:], ended=logformat.rank_end(list(lines)))


def test_the_first_rank_torchrun_saw_die_is_named_with_its_signal_and_update():
    states = [state("v100a", prog=progress(130), lines=TORCHRUN_EXIT), state("v100b", lines=TORCHRUN_SIGKILL)]
    assert why_stopped_early(states) == "v100b: rank 1 killed by SIGKILL at update 130; the others stopped"


def test_an_unreachable_host_is_named():
    states = [state("v100a", prog=progress(130), lines=TORCHRUN_EXIT), state("v100b", reachable=False)]
    assert why_stopped_early(states) == "v100b: unreachable; the run stopped at update 130"


def test_no_host_answering_says_so_and_makes_up_no_state_of_the_run():
    states = [state("v100a", reachable=False), state("v100b", reachable=False)]
    assert why_stopped_early(states) == "v100a, v100b: unreachable from here; the run's state is not known"
    assert run_state(states) == "[red]v100a, v100b: unreachable from here; the run's state is not known[/]"
    rank0_lost = [state("v100a", reachable=False), state("v100b", lines=TORCHRUN_SIGKILL)]
    assert why_stopped_early(rank0_lost) == ("v100a: unreachable; the run stopped at an update not known here "
                                             "(rank 0's host is unreachable)")


def test_a_finished_or_running_run_is_not_an_early_stop():
    assert why_stopped_early([state("v100a", prog=progress(400, finished=True)), state("v100b")]) is None
    assert why_stopped_early([state("v100a", running=True, prog=progress(130)), state("v100b")]) is None


def test_torchruns_failure_block_is_read():
    end = logformat.rank_end(["noise", *TORCHRUN_SIGKILL])
    assert (end.rank, end.how, end.time) == (1, "killed by SIGKILL", "2026-11-23_02:58:01")
    assert logformat.rank_end(["2026 | INFO | train_inner | {}"]) is None


def test_each_rank_says_what_became_of_it():
    assert state("v100a", running=True).describe(finished=False) == "running"
    assert state("v100b", lines=TORCHRUN_SIGKILL).describe(finished=False) == "died: killed by SIGKILL"
    assert state("v100b", reachable=False).describe(finished=False) == "unreachable"
    assert state("v100b", lines=TORCHRUN_SIGKILL).describe(finished=True) == "finished"
    stopped = HostState("v100a", False, True, None, [], stopped_by_user=True)
    assert stopped.describe(finished=False) == "stopped by fab stop"


def test_the_last_log_line_shown_is_not_a_warning():
    lines = ["2026-11-23 02:58:00 | INFO | train_inner | {}",
             "/opt/tandem/venv/lib/python3.11/site-packages/torch/x.py:12: UserWarning: something deprecated",
             "  warnings.warn(",
             "============================================================"]
    assert logformat.meaningful(lines) == ["2026-11-23 02:58:00 | INFO | train_inner | {}"]


def test_a_run_stopped_with_fab_stop_is_not_an_early_stop_but_a_death_before_it_still_is():
    stopped = [HostState(n, False, True, progress(130) if n == "v100a" else None, [], stopped_by_user=True)
               for n in ("v100a", "v100b")]
    assert why_stopped_early(stopped) is None
    culprit = state("v100b", lines=TORCHRUN_SIGKILL)
    assert why_stopped_early([stopped[0], culprit]).startswith("v100b: rank 1 killed by SIGKILL")


def test_a_survivor_that_lost_its_peer_in_the_same_second_is_not_the_culprit():
    states = [state("v100a", prog=progress(20), lines=GLOO_PEER_CLOSED), state("v100b", lines=TORCHRUN_SIGKILL)]
    assert why_stopped_early(states) == "v100b: rank 1 killed by SIGKILL at update 20; the others stopped"
    # the survivor's last words are gloo's error, not torchrun's report ("[0]:") after it
    assert logformat.meaningful(GLOO_PEER_CLOSED)[-1].endswith("Connection closed by peer [10.77.0.3]:4123")


def test_a_rank_that_crashed_on_its_own_is_the_culprit_even_with_an_exit_code():
    crashed = ["RuntimeError: CUDA out of memory.", *TORCHRUN_EXIT]
    states = [state("v100a", prog=progress(20), lines=crashed), state("v100b", lines=GLOO_PEER_CLOSED)]
    assert why_stopped_early(states).startswith("v100a: rank 0 exited with code 1 at update 20")


def test_the_status_table_says_which_ranks_each_host_runs():
    from rich.console import Console

    from train.run.status import table

    states = [HostState("v100a", True, True, progress(20), [], ranks="0-1"),
              HostState("v100b", True, True, None, [], ranks="2-3")]
    console = Console(width=120, record=True, color_system=None)
    console.print(table(states))
    text = console.export_text()
    assert "ranks" in text.splitlines()[1] and "│ v100a │ 0-1   │ running" in text and "│ v100b │ 2-3   │" in text, text


def raised(error: str, host: str, rank: int, when: str = "02:58:07") -> list[str]:
    """A rank that raised `error` itself (fairseq's traceback), then torchrun's report of it."""
    return ["Traceback (most recent call last):", '  File "fairseq_cli/train.py", line 1, in main', error,
            *[line.replace("v100a", host).replace("rank      : 0", f"rank      : {rank}")
              .replace("02:58:07", when) for line in TORCHRUN_EXIT]]


def test_the_same_error_on_every_host_blames_none_and_the_run_is_not_shrunk():

    same = "ValueError: bad option: --lr 0 on 2 ranks"
    states = [state("v100a", prog=progress(130), lines=raised(same, "v100a", 0)),
              state("v100b", lines=raised(same.replace("2 ranks", "4 ranks"), "v100b", 1, "02:58:09"))]
    assert why_stopped_early(states) == (
        "every host's ranks failed with the same error at update 130: ValueError: bad option: --lr 0 on 2 ranks; "
        "no host is to blame (fix it, then `fab train` resumes)")


def test_a_host_whose_rank_raised_alone_is_still_the_one_blamed():
    states = [state("v100a", prog=progress(130), lines=GLOO_PEER_CLOSED),
              state("v100b", lines=raised("MemoryError: out of memory", "v100b", 1, "02:58:01"))]
    assert why_stopped_early(states) == "v100b: rank 1 exited with code 1 at update 130; the others stopped"
    different = [state("v100a", prog=progress(130), lines=raised("KeyError: 'x'", "v100a", 0)),
                 state("v100b", lines=raised("MemoryError: out of memory", "v100b", 1, "02:58:01"))]
    assert why_stopped_early(different).startswith("v100b: rank 1")
