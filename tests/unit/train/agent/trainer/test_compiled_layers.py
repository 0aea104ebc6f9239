"""Transformer layers through torch.compile (train/agent/trainer/compiled_layers.py): the same outputs and
gradients as fairseq's eager layers, one graph per kind of layer whatever the batch's shape (a
recompile per batch would stall every update), eval and beam search untouched. torch.compile's
graph capture and autograd run here on CPU (backend aot_eager); the GPU's code generation is
torch's own."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
import torch._dynamo
from fairseq.data import Dictionary
from fairseq.incremental_decoding_utils import FairseqIncrementalState
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.modules import transformer_layer
from torch._dynamo.utils import counters

from train.agent.trainer import compiled_layers
from train.recipe import presets

SHAPES = [(3, 7, 9), (5, 4, 6), (2, 11, 12), (4, 9, 3)]  # sentences, source length, target length
MORE_SHAPES = [(6, 5, 5), (2, 13, 14), (7, 3, 8)]


def tiny_model() -> TransformerModel:
    dictionary = Dictionary()
    for i in range(60):
        dictionary.add_symbol(f"w{i}")
    options = presets.PRESETS["tiny"]
    args = argparse.Namespace(**{k: v for k, v in options.items() if k.endswith(("_dim", "_layers", "_heads"))})
    args.share_all_embeddings, args.arch = True, options["arch"]
    args.dropout = args.attention_dropout = args.activation_dropout = 0.0  # the same numbers both ways
    ARCH_CONFIG_REGISTRY[args.arch](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    return TransformerModel.build_model(args, task)


def batch(sentences: int, source: int, target: int):
    gen = torch.Generator().manual_seed(sentences * 100 + source)
    src = torch.randint(4, 60, (sentences, source), generator=gen)
    if source % 2:
        src[0, :2] = 1  # left-padded, as fairseq batches the source (in some batches only)
    prev = torch.randint(4, 60, (sentences, target), generator=gen)
    if sentences % 2:
        prev[-1, -2:] = 1  # right-padded targets in some batches only
    lengths = (src != 1).sum(1)
    return {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}


def train_steps(model, shapes=SHAPES):
    """Each shape's logits and the gradients they give."""
    results = []
    for shape in shapes:
        model.zero_grad()
        logits, _ = model(**batch(*shape))
        logits.float().pow(2).mean().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return results


@pytest.fixture
def compiled(monkeypatch):
    """compiled_layers installed for one test (aot_eager: no C++ compiler on the way), undone after."""
    for cls in (transformer_layer.TransformerEncoderLayerBase, transformer_layer.TransformerDecoderLayerBase):
        monkeypatch.setattr(cls, "forward", cls.forward)
    monkeypatch.setattr(FairseqIncrementalState, "get_incremental_state", FairseqIncrementalState.get_incremental_state)
    monkeypatch.setenv("TANDEM_COMPILE_LAYERS", "1")
    monkeypatch.setattr(compiled_layers, "compiles_in_training", False)  # what install() sets, undone after
    torch._dynamo.reset()
    counters.clear()
    compiled_layers.install(backend="aot_eager")
    yield
    torch._dynamo.reset()


def test_compiled_layers_train_as_fairseqs_with_one_graph_a_kind_of_layer(compiled):
    eager = tiny_model()
    model = copy.deepcopy(eager)
    for cls in (transformer_layer.TransformerEncoderLayerBase, transformer_layer.TransformerDecoderLayerBase):
        assert cls.forward._tandem
    with torch.compiler.set_stance("force_eager"):  # fairseq's own layers, for the reference
        expected = train_steps(eager)
    got = train_steps(model)
    for (logits, grads), (their_logits, their_grads) in zip(got, expected, strict=True):
        torch.testing.assert_close(logits, their_logits, rtol=1e-4, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, their_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    # the encoder one, the decoder two (its last layer returns attention weights), padding or not
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    train_steps(model, MORE_SHAPES)
    assert counters["stats"]["unique_graphs"] == 3, "a new batch shape compiled again"
    assert model.state_dict().keys() == eager.state_dict().keys()  # checkpoints as before


def test_validation_and_beam_search_stay_eager(compiled):
    model = tiny_model().eval()
    with torch.no_grad():
        model(**batch(*SHAPES[0]))
        encoder_out = model.encoder(batch(*SHAPES[0])["src_tokens"], src_lengths=batch(*SHAPES[0])["src_lengths"])
        state: dict = {}
        for step in range(1, 4):
            model.decoder(batch(*SHAPES[0])["prev_output_tokens"][:, :step], encoder_out=encoder_out,
                          incremental_state=state)
    assert counters["stats"]["unique_graphs"] == 0
    assert state, "beam search kept its decoding state"


def test_without_a_gpu_compiler_the_layers_stay_fairseqs(monkeypatch, caplog):
    """A GPU image whose torch came without triton: the run goes on uncompiled, and says so."""
    encoder = transformer_layer.TransformerEncoderLayerBase
    monkeypatch.setattr(encoder, "forward", encoder.forward)
    monkeypatch.setenv("TANDEM_COMPILE_LAYERS", "1")
    monkeypatch.setattr(compiled_layers, "gpu_compiler_available", lambda: False)
    before = encoder.forward
    compiled_layers.install()
    assert encoder.forward is before
    assert "no triton" in caplog.text


RANK = """
import functools, os, sys, time
from torch._dynamo.backends.debugging import eager
from train.agent.trainer import compiled_layers, fairseq_train

def slow_on_rank_0(gm, example_inputs):
    # a GPU host's compile (40-150 s) on rank 0 only: rank 1 waits for it in the first all-reduce
    if os.environ["RANK"] == "0":
        time.sleep(float(os.environ["COMPILE_S"]))
    return eager(gm, example_inputs)

compiled_layers.install = functools.partial(compiled_layers.install, backend=slow_on_rank_0)
# what `fab train`'s torchrun line adds to each worker's arguments
sys.argv = ["fairseq_train", *sys.argv[1:], "--distributed-rank", os.environ["RANK"],
            "--device-id", os.environ["LOCAL_RANK"]]
fairseq_train.main()
"""


def tiny_corpus(root) -> None:
    """A joined dictionary and mmap train/valid splits, as fairseq-preprocess writes them."""
    from fairseq.data import indexed_dataset

    dictionary = Dictionary()
    for i in range(60):
        dictionary.add_symbol(f"w{i}")
    gen = torch.Generator().manual_seed(1)
    for split, sentences in (("train", 96), ("valid", 8)):
        for lang in ("en", "de"):
            builder = indexed_dataset.make_builder(str(root / f"{split}.en-de.{lang}.bin"), impl="mmap",
                                                   vocab_size=len(dictionary))
            for _ in range(sentences):
                length = int(torch.randint(4, 12, (), generator=gen))
                builder.add_item(torch.cat([torch.randint(4, 64, (length,), generator=gen),
                                            torch.tensor([dictionary.eos()])]).int())
            builder.finalize(str(root / f"{split}.en-de.{lang}.idx"))
    for lang in ("en", "de"):
        dictionary.save(str(root / f"dict.{lang}.txt"))


def test_two_ranks_outlive_a_first_update_compile_slower_than_their_heartbeat(tmp_path):
    """Real fairseq through tandem's entry point, 2 ranks under torchrun on gloo, the run's arguments as
    `fab train` builds them, with a 4 s heartbeat that is also the process group's timeout (what GPU
    hosts get); rank 0's compile takes 9 s (3 graphs x 3 s), rank 1 waits for it in the first
    all-reduce. Without the allowance rank 0 was killed for not making progress at its first forward
    and rank 1 timed out in gloo: the run died at update 1."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from train.run import command

    data = tmp_path / "data"
    data.mkdir()
    tiny_corpus(data)
    (launch,) = command.launches("r1", [{"address": "127.0.0.1", "gpus": 0, "ranks": 2}], master_port=29500,
                                 data_dir=str(data), run_dir=str(tmp_path / "run"), venv="/v")
    preset = presets.resolve("tiny", ["heartbeat_timeout=4", "max_update=4", "log_interval=1",
                                      "ddp_backend=pytorch_ddp", "max_tokens=256"])
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "TANDEM_COMPILE_LAYERS": "1", "TANDEM_PG_TIMEOUT_S": "4", "COMPILE_S": "3",
           "TANDEM_COMPILE_ALLOWANCE_S": "40", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script),
                           *command.fairseq_train_args(preset, launch)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert "Killing job for not making progress" not in log, log[-4000:]
    assert done.returncode == 0, log[-4000:]
    assert '"num_updates": "4"' in log, log[-4000:]


STALL = """
import sys, time
import torch
from fairseq.distributed.distributed_timeout_wrapper import DistributedTimeoutWrapper
from train.agent.trainer import compiled_layers, fairseq_train

fairseq_train.heartbeat_kills()
model = DistributedTimeoutWrapper(torch.nn.Linear(2, 2), timeout=1)
model(torch.zeros(1, 2))
if sys.argv[1] == "compiling":
    compiled_layers.CLOCK.started()
elif sys.argv[1] == "compiled long ago":
    compiled_layers.CLOCK.ended()
    compiled_layers.CLOCK.last -= 100
time.sleep(3)
model(torch.zeros(1, 2))
print("alive")
"""


@pytest.mark.parametrize("state, survives", [("compiling", True), ("compiled long ago", False), ("never", False)])
def test_the_heartbeat_waits_for_a_compile_and_only_for_one(state, survives):
    """A 1 s heartbeat, a 3 s stall after a forward, a 5 s allowance: the rank lives through the stall
    while it compiles; once its compiles are past the allowance (or it never compiled), a stall is a
    vanished peer again, and the heartbeat kills it (SIGKILL, fairseq's message)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STALL, state], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TANDEM_COMPILE_ALLOWANCE_S": "5"})
    assert (done.returncode == 0 and "alive" in done.stdout) is survives, done.stderr[-2000:]
    assert ("Killing job for not making progress" in done.stderr) is not survives
    if not survives:
        assert done.returncode == -9


def test_the_clock_hears_each_compile_its_lazy_backward_too():
    """What the heartbeat reads: torch's own compile callbacks, forward (dynamo) and backward (compiled
    lazily, at the first backward pass: on a GPU host, tens of seconds more)."""
    torch._dynamo.reset()  # (which forgets the callbacks too)
    clock = compiled_layers.CompileClock()
    clock.listen()
    try:
        f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager")
        x = torch.randn(5, requires_grad=True)
        loss = f(x)
        after_forward = clock.last
        assert after_forward is not None and not clock.compiling
        loss.backward()
        assert clock.last > after_forward, "the lazy backward's compile was not heard"
    finally:
        torch._dynamo.reset()
