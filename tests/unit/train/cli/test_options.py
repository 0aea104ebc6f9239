"""Every fab option's value checked before a host is reached (train.cli.options), and the exit status
train.cli.executor.cluster_task ends a task with (train.errors): 2 bad input, 3 refused, 1 failed."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from train.cli import options
from train.cli.executor import cluster_task, task
from train.cluster import ClusterError, Host
from train.errors import OptionError, Refused
from train.recipe import strategies
from train.recipe.record import Run
from train.run import session


@pytest.mark.parametrize(("parse", "value", "said"), [
    (options.whole(1), "x", "expected a whole number >= 1, got 'x'"),
    (options.whole(1), "1.5", "expected a whole number >= 1, got '1.5'"),
    (options.whole(0), "-1", "expected a whole number >= 0, got '-1'"),
    (options.port, "70000", "expected a whole number from 1 to 65535, got '70000'"),
    (options.seconds, "nan", "expected a number of seconds > 0, got 'nan'"),
    (options.mbps, "0", "expected a number of Mbit/s > 0, got '0'"),
    (options.fraction, "1.5", "expected a fraction from 0 to 1, e.g. 0.85, got '1.5'"),
    (options.precision, "fp64", "expected one of fp32, fp16, bf16, got 'fp64'"),
    (options.preset, "huge", "expected one of tiny, "),
    (options.name, "a/b", "expected a name of letters, digits"),
    (options.checkpoint, "../x.pt", "expected a checkpoint file name"),
    (options.size, "1X", "expected a size like 1M, 64M or 1G"),
    (options.link, "fast", "expected measure, bench or a speed in Mbit/s, got 'fast'"),
    (options.comm, "gossip", f"--comm is {strategies.syntax()} or auto, not 'gossip'"),
    (options.comm_list, "sync,local-sgd:1", "H must be at least 2"),
    (options.rates, "10mbit,fast", "rate 'fast' is not a tc rate"),
    (options.backup, "sometimes", "--backup must be off, last or every:MIN"),
    (options.overrides, "lr", "`lr`: an override is key=value"),
])
def test_a_bad_value_is_refused_saying_what_is_accepted(parse, value, said):
    with pytest.raises(ValueError) as refused:
        parse(value)
    assert said in str(refused.value)


@pytest.mark.parametrize(("parse", "value", "parsed"), [
    (options.whole(1), "4", 4), (options.whole(1), 29500, 29500), (options.seconds, "0.5", 0.5),
    (options.fraction, "0", 0.0), (options.comm, "LOCAL-SGD:8", "local-sgd:8"), (options.comm, "auto", "auto"),
    (options.overrides, "adam_betas=(0.9, 0.98),lr=0.001", ["adam_betas=(0.9, 0.98)", "lr=0.001"]),
    (options.link, "measure", "measure"), (options.link, "950", "950"), (options.size, "64M", "64M"),
    (options.backup, "every:30", "every:30"), (options.checkpoint, "checkpoint.best_loss_4.21.pt",
                                               "checkpoint.best_loss_4.21.pt"),
])
def test_a_good_value_comes_out_as_the_task_takes_it(parse, value, parsed):
    assert parse(value) == parsed


def test_the_checks_of_several_options_name_one_of_them():
    cpu = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2", gpus=1)]
    with pytest.raises(OptionError, match=r"^--precision: fp16 needs GPUs; a has none \(gpus: 0\): use fp32$"):
        options.precision_fits_hosts(cpu, {"precision": "fp16"})
    options.precision_fits_hosts(cpu, {"precision": "fp32"})
    with pytest.raises(OptionError, match=r"^--set: unknown option `max_updates`; did you mean max_update"):
        options.overrides_fit_preset(cpu, {"preset": "tiny", "set": ["max_updates=5"]})
    with pytest.raises(OptionError, match="^--set: `max_update=many`: expected"):
        options.overrides_fit_preset(cpu, {"preset": "tiny", "set": "max_update=many"})
    with pytest.raises(OptionError, match="^--min-size: expected a size <= --max-size 1M, got '1G'$"):
        options.sizes_in_order(cpu, {"min_size": "1G", "max_size": "1M"})
    with pytest.raises(OptionError, match="^--source and --wmt16 name two corpora"):
        options.one_corpus(cpu, {"source": "corpus", "wmt16": True})
    with pytest.raises(OptionError, match="^--rejoin takes lost hosts back"):
        options.resumable_run(cpu, {"rejoin": True, "new": True})


def test_an_option_error_is_one_line_naming_the_option():
    assert str(OptionError("update_freq", "expected a whole number >= 1, got 'x'")) == \
        "--update-freq: expected a whole number >= 1, got 'x'"
    assert str(OptionError("comm", "--comm is sync, fp16\n  or auto")) == "--comm is sync, fp16 or auto"


@pytest.fixture
def context(tmp_path, monkeypatch):
    """What Invoke hands a task: its config, with the inventory and the hosts --hosts named."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    cluster:\n      hosts:\n"
                         "        a: {ansible_host: 10.0.0.1}\n        b: {ansible_host: 10.0.0.2}\n")
    monkeypatch.setenv("FABRIC_INVENTORY", str(inventory))
    return SimpleNamespace(config={"inventory": str(inventory), "cluster_hosts": None})


def ended(task, c, **kwargs) -> int:
    with pytest.raises(SystemExit) as exited:
        task(c, **kwargs)
    return exited.value.code


def test_cluster_task_parses_before_the_body_and_ends_with_the_exit_status(context, capsys):
    calls = []

    @cluster_task(checks=[options.precision_fits_hosts], update_freq=options.whole(1),
                  precision=options.precision)
    def body(c, hosts, update_freq=None, precision=None, then=None):
        calls.append(([h.name for h in hosts], update_freq, precision))
        if then:
            raise then

    body(context, update_freq="4")
    assert calls == [(["a", "b"], 4, None)]
    assert ended(body, context, update_freq="x") == 2
    assert capsys.readouterr().err == "error: --update-freq: expected a whole number >= 1, got 'x'\n"
    assert ended(body, context, precision="bf16") == 2  # a check: the hosts have no GPU
    assert len(calls) == 1  # neither reached the body
    assert ended(body, context, then=Refused("the network would take most of each step")) == 3
    assert capsys.readouterr().out == "refused: the network would take most of each step\n"
    assert ended(body, context, then=ClusterError("b: unreachable")) == 1
    assert ended(body, context, then=OptionError("set", "unknown option `x`")) == 2
    context.config["cluster_hosts"] = ["b", "c"]
    assert ended(body, context) == 2
    assert capsys.readouterr().err.endswith("error: --hosts: unknown host c: the inventory has a, b\n")


def test_a_parser_that_raises_anything_else_is_still_one_line_about_its_option(context, capsys):
    @cluster_task(when=lambda text: int(text))
    def body(c, hosts, when=None):
        pytest.fail("the body ran")

    assert ended(body, context, when="soon") == 2
    assert capsys.readouterr().err == "error: --when: invalid literal for int() with base 10: 'soon'\n"


def test_a_shared_option_gives_a_task_its_help_with_its_parser(context):
    """One declaration (train.cli.options.Option): a task naming it parses with it and `fab --help TASK` says
    its help; the task's own help= may say more; it parses the parameter of its name only."""
    @task(help={"dataset": options.DATASET.help + "; the run's own", "lines": "lines per host"})
    @cluster_task(port=options.PORT, dataset=options.DATASET, precision=options.PRECISION, lines=options.whole(1))
    def body(c, hosts, port=29500, dataset=None, precision=None, lines=1):
        return port, dataset

    assert body.help == {"port": options.PORT.help, "precision": options.PRECISION.help,
                         "dataset": options.DATASET.help + "; the run's own", "lines": "lines per host"}
    assert body.body(context, port="29504", dataset="wmt16") == (29504, "wmt16")
    assert ended(body.body, context, port="0") == 2
    with pytest.raises(TypeError, match="--port given --comm's"):
        cluster_task(port=options.COMM)(lambda c, hosts, port=None: None)


def test_train_refuses_a_network_bound_run_with_the_refusal_exit_3_means(monkeypatch):
    """fab train's network check refuses as fab predict's verdict does: Refused, exit 3."""
    verdict = SimpleNamespace(lines=["link 10 Mbit/s"], fewer_hosts_faster=None, network_bound=True, choice=None,
                              comparison=None)
    monkeypatch.setattr(session.predict, "for_run", lambda run, hosts, comm=None: verdict)
    run = Run(run_id="r", hosts=["a", "b"], preset="tiny", overrides=[], dataset="synthetic")
    hosts = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2")]
    quiet = Console(file=io.StringIO())
    with pytest.raises(Refused, match="nothing started"):
        session.network_check(run, hosts, False, quiet)
    assert session.network_check(run, hosts, True, quiet) is verdict  # --accept-slow-network
