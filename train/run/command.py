"""The one place that builds a host's training command (and the evaluation command).

`training_command(...)` returns the exact shell line a host runs; `fab train --dry-run`
prints it. For rank 1 of two CPU hosts (tiny preset) it reads:

    { [ ! -r /etc/tandem/env ] || { set -a; . /etc/tandem/env; set +a; }; } && \\
    mkdir -p /data/runs/r1/checkpoints && cd /data/runs/r1 && \\
    { GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 \\
    setsid nohup /opt/tandem/venv/bin/torchrun --nnodes 2 --node_rank 1 \\
      --master_addr 10.77.0.11 --master_port 29500 --nproc_per_node 1 \\
      -m train.agent.trainer.fairseq_train /data/synthetic/bin --save-dir /data/runs/r1/checkpoints \\
      --task translation ... --arch transformer ... --max-update 300 ... \\
      --distributed-world-size 2 --distributed-init-method env:// --distributed-no-spawn \\
      --cpu --distributed-backend gloo --ddp-backend legacy_ddp --distributed-rank 1 \\
      >> /data/runs/r1/train.log 2>&1 < /dev/null & echo $! > /data/runs/r1/train.pid; }

(one line in reality; the monitor starts after it). /etc/tandem/env is what provisioning found
out about the host (the cluster NIC it detected): every job tandem starts reads it.

Ranks: host i of N (`node_rank` i, in inventory order) runs `nproc_per_node` processes: one per
GPU, or on a CPU host the inventory's `cpu_ranks` (default 1; train.cluster.Host.ranks); world
size = N × nproc_per_node, the same on every host (train.run.preflight refuses hosts that differ);
host i's ranks are i × nproc_per_node and the ones after it; the master is the first host. fairseq
with `--distributed-init-method env://` takes its rank from `--distributed-rank` (default 0 for
everyone, which hangs the rendezvous), so:
- one process per host: `--distributed-rank <node_rank>`;
- several per host (GPUs, or `cpu_ranks`): torchrun starts `bash -c '... --distributed-rank "$RANK"
  --device-id "$LOCAL_RANK"'` (torchrun --no-python), so each process passes the global rank and
  local GPU torchrun gave it (on a CPU host the device id is unused). The lab runs this path with
  `make lab-up RANKS=2` (tests/training/test_two_ranks.py: 2 hosts × 2 ranks); not yet on a
  multi-GPU host.

The effective batch is max_tokens × update_freq × world size tokens per update (`batch_line`:
what `fab train` says as it starts and with `--dry-run`).

`setsid nohup ... &` detaches the job from the SSH session; the pid file holds the
session leader's pid, so `kill -- -PID` stops torchrun and every rank it started.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

# ENV_FILE: what provisioning found out about the host (roles/network: the cluster NIC it detected,
# NCCL's and gloo's interface; roles/train_env): every job tandem starts there reads it first.
from train.hosts.paths import CACHE_ROOT, ENV_FILE
from train.recipe import strategies
from train.recipe.gpu_defaults import ALLOC_CONF, ALLOCATOR, default_precision  # noqa: F401 (its users read them here too)
from train.recipe.presets import COMMON, TANDEM_OPTIONS, Preset, Value, to_args
from train.recipe.presets import overridden as presets_overridden


def reading_env_file(env_file: str = ENV_FILE) -> str:
    """The start of a host's shell line that exports every KEY=VALUE of `env_file`, where it exists
    (a host provisioned by tandem has one). Variables the command line sets itself come after, and win:
    the inventory's cluster_nic over the NIC provisioning detected."""
    f = shlex.quote(env_file)
    return f"{{ [ ! -r {f} ] || {{ set -a; . {f}; set +a; }}; }} && "


@dataclass(frozen=True)
class Launch:
    """What one host needs to know to start its part of a run."""

    run_id: str
    node_rank: int
    nnodes: int
    gpus_per_host: int  # 0 = CPU
    master_addr: str
    master_port: int
    data_dir: str
    save_dir: str
    log_path: str
    nic: str
    venv: str
    update_freq: int = 1
    precision: str = "fp32"  # fp32, fp16, bf16 (the last two on GPUs only)
    comm: str = "sync"  # a train.recipe.strategies value: sync, fp16, local-sgd:H, ...
    omp_threads: int | None = None
    pid_path: str | None = None  # default: beside the log, <log stem>.pid
    env_file: str = ENV_FILE
    cpu_ranks: int = 1  # ranks on a CPU host (the inventory's cpu_ranks); a GPU host runs one per GPU
    peers: tuple[str, ...] = ()  # the other hosts' cluster addresses: the watchdog's PeerWatch asks them

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be at least 1, not {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.gpus_per_host < 0:
            raise ValueError(f"gpus_per_host must be 0 (CPU) or more, not {self.gpus_per_host}")
        if self.cpu_ranks < 1:
            raise ValueError(f"cpu_ranks must be at least 1, not {self.cpu_ranks}")
        if self.update_freq < 1:
            raise ValueError(f"update_freq must be at least 1, not {self.update_freq}")
        if self.precision not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"precision is fp32, fp16 or bf16, not {self.precision!r}")
        if self.precision != "fp32" and self.gpus_per_host == 0:
            raise ValueError(f"{self.precision} needs GPUs; this host has none (use fp32 on CPU)")
        strategies.parse(self.comm)  # raises on an unknown one
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"master_port {self.master_port} is not a TCP port")

    @property
    def nproc_per_node(self) -> int:
        """This host's ranks: one per GPU, else cpu_ranks (train.cluster.Host.ranks)."""
        return self.gpus_per_host if self.gpus_per_host > 0 else self.cpu_ranks

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def cpu(self) -> bool:
        return self.gpus_per_host == 0

    @property
    def pid_file(self) -> str:
        if self.pid_path:
            return self.pid_path
        log = PurePosixPath(self.log_path)
        return str(log.with_suffix(".pid"))

    @property
    def log_dir(self) -> str:
        return str(PurePosixPath(self.log_path).parent)


FIELDS = re.compile(r"\{(log_dir|save_dir|run_id)\}")


def _fill(options: Mapping[str, Value], launch: Launch) -> dict[str, Value]:
    names = {"log_dir": launch.log_dir, "save_dir": launch.save_dir, "run_id": launch.run_id}
    # only these three: any other brace in a value (a user's --set) is text, never a str.format field
    return {k: FIELDS.sub(lambda m: names[m[1]], v) if isinstance(v, str) else v for k, v in options.items()}


def fairseq_train_args(preset: Preset, launch: Launch) -> list[str]:
    """fairseq-train's arguments for this host (data dir first), unquoted."""
    args = [launch.data_dir, "--save-dir", launch.save_dir]
    strategy = strategies.parse(launch.comm)
    _, dropped = strategies.fairseq_options_of(strategy)  # fairseq knows BMUF's options only under --use-bmuf
    options = {k: v for k, v in preset.options.items() if k not in dropped and k not in TANDEM_OPTIONS}
    args += to_args(_fill(options, launch))
    if launch.update_freq > 1:
        args += ["--update-freq", str(launch.update_freq)]
    if launch.precision != "fp32":
        args.append(f"--{launch.precision}")
    args += [
        "--distributed-world-size",
        str(launch.world_size),
        "--distributed-init-method",
        "env://",
        "--distributed-no-spawn",
    ]
    if launch.cpu:
        args += ["--cpu", "--distributed-backend", "gloo"]
    chosen = preset.options.get("ddp_backend")
    # legacy_ddp on CPU hosts unless the preset asks for another (pytorch_ddp: train.agent.trainer.fairseq_train)
    backend = strategy.ddp_backend(str(chosen or ("legacy_ddp" if launch.cpu else "pytorch_ddp")))
    if chosen and backend != chosen:
        raise ValueError(f"--comm {strategy} all-reduces through {backend}; the run sets ddp_backend={chosen}")
    if not chosen and (launch.cpu or backend != "pytorch_ddp"):
        args += ["--ddp-backend", backend]
    args += strategy.fairseq_args(launch.world_size, preset.options)
    if launch.nproc_per_node == 1:
        args += ["--distributed-rank", str(launch.node_rank)]
    return args


def environment(launch: Launch, preset: Preset | None = None,
                user_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables set for the training processes. On GPU hosts a rank whose peer vanished must
    not wait in NCCL for its 10-minute default: the process group times out with fairseq's
    heartbeat (train.agent.trainer.fairseq_train sets it from TANDEM_PG_TIMEOUT_S), and NCCL's watchdog
    then tears the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING=1) instead of leaving it blocked.
    The heartbeat is sized to the largest collective on the measured link (presets.failure_timeout_s).
    GPU ranks run torch's allocator with expandable segments (ALLOCATOR: the GPU memory model of
    train.plan.batch assumes it), unless `user_env` (default: the environment `fab train` runs in)
    sets PYTORCH_CUDA_ALLOC_CONF: then the ranks get the user's value (empty: torch's defaults)."""
    env: dict[str, str] = {}
    if not launch.cpu:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        env[ALLOC_CONF] = (os.environ if user_env is None else user_env).get(ALLOC_CONF, ALLOCATOR)
    # a strategy without fairseq's distributed wrapper (local SGD's BMUF) runs without its heartbeat: on
    # CPU hosts too only the process group's timeout ends a rank whose peer vanished (gloo's: 30 min)
    strategy = strategies.parse(launch.comm)
    if (not launch.cpu or not strategy.heartbeat_in_wrapper) and preset \
            and preset.options.get("heartbeat_timeout"):
        env["TANDEM_PG_TIMEOUT_S"] = str(preset.options["heartbeat_timeout"])
    if launch.nic:
        env["GLOO_SOCKET_IFNAME"] = launch.nic
        env["NCCL_SOCKET_IFNAME"] = launch.nic
    if launch.omp_threads:
        env["OMP_NUM_THREADS"] = str(launch.omp_threads)
    if preset:
        env.update(strategy.environment(preset.options))  # its host-side hook's (train/agent/comm_*.py)
    env.update(fast_step_environment(launch, preset))
    return env


# tandem's switches for faster steps on GPUs: option -> (variable, on unless set). fused_adam and
# flat_master_copy (train/agent/trainer/fast_steps.py) are measured on an H100 and on by default; fused_loss
# (train/agent/trainer/fused_loss.py) and compile_layers (train/agent/trainer/compiled_layers.py) wait for theirs
# (benchmarks/README.md, "Next on a GPU").
FAST_STEP_SWITCHES = {
    "fused_adam": ("TANDEM_FUSED_ADAM", True),
    "flat_master_copy": ("TANDEM_FLAT_MASTER_COPY", True),
    "fused_loss": ("TANDEM_FUSED_LOSS", False),
    "compile_layers": ("TANDEM_COMPILE_LAYERS", False),
}


# the switches whose code torch.compile makes on the host, at a run's first updates
COMPILING_SWITCHES = ("fused_loss", "compile_layers")


def fast_step_environment(launch: Launch, preset: Preset | None) -> dict[str, str]:
    """On GPU hosts each switch as `--set NAME=true|false` says, else its default; CPU hosts get
    none (fairseq takes its fused Adam path only where CUDA is; the others are for GPU kernels).
    Where a switch compiles, torch keeps what it compiled on the data volume (CACHE_ROOT; its
    default, /tmp, is gone after a reboot): a restarted run reuses it instead of compiling for minutes."""
    if launch.cpu:
        return {}
    options = preset.options if preset else {}
    env = {variable: "1" for option, (variable, default) in FAST_STEP_SWITCHES.items()
           if options.get(option, default)}
    if any(options.get(option, FAST_STEP_SWITCHES[option][1]) for option in COMPILING_SWITCHES):
        env["TORCHINDUCTOR_CACHE_DIR"] = f"{CACHE_ROOT}/inductor"
        env["TRITON_CACHE_DIR"] = f"{CACHE_ROOT}/triton"
    return env


def switches_cpu_hosts_ignore(overrides: list[str], options: dict, hosts: list[str]) -> str | None:
    """What to tell a user who `--set` a GPU step switch on for CPU hosts: they train without it."""
    asked = [f"{name}=true" for name in FAST_STEP_SWITCHES if presets_overridden(overrides, name) and options.get(name)]
    if not asked:
        return None
    which = "it" if len(asked) == 1 else "them"
    return f"{', '.join(asked)}: GPU kernels; the CPU hosts {', '.join(hosts)} train without {which}"


def trainer_argv(launch: Launch, preset: Preset) -> list[str]:
    """tandem's entry point (train/agent/trainer/fairseq_train.py): fairseq-train with what fairseq 0.12
    alone gets wrong fixed. Its heartbeat leaves a rank blocked on a vanished peer alive; on GPUs
    cuDNN's attention rebuilds its plan for each new batch shape (~120 ms of host time per update
    on an H100), bf16 means a TPU and every rank dies; on CPU hosts pytorch_ddp gets a GPU device
    id."""
    return [f"{launch.venv.rstrip('/')}/bin/python", "-m", "train.agent.trainer.fairseq_train"]


def foreground_command(preset: Preset, launch: Launch) -> list[str]:
    """The torchrun argv (no environment, no detaching): what runs on the host."""
    venv = launch.venv.rstrip("/")
    head = [
        f"{venv}/bin/torchrun",
        "--nnodes",
        str(launch.nnodes),
        "--node_rank",
        str(launch.node_rank),
        "--master_addr",
        launch.master_addr,
        "--master_port",
        str(launch.master_port),
        "--nproc_per_node",
        str(launch.nproc_per_node),
    ]
    train = [*trainer_argv(launch, preset), *fairseq_train_args(preset, launch)]
    if launch.nproc_per_node == 1:
        return head + train[1:]  # torchrun -m MODULE: its own python runs the module
    # several processes per host: each passes the global rank torchrun gives it
    inner = f'exec {shlex.join(train)} --distributed-rank "$RANK" --device-id "$LOCAL_RANK"'
    return head + ["--no-python", "bash", "-c", inner]


def training_command(preset: Preset, launch: Launch) -> str:
    """The full shell line that starts this host's ranks, detached, logging to `log_path`.

    It creates the save and log directories, removes `fab stop`'s mark of a stopped run, sets the
    environment, starts torchrun under
    `setsid nohup` with stdin closed, and writes the session leader's pid to the pid file.
    The log is appended to: a resumed run keeps its whole history in one file.
    """
    dirs = sorted({launch.save_dir, launch.log_dir})
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in environment(launch, preset).items())
    return (
        f"{reading_env_file(launch.env_file)}"
        f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)} && cd {shlex.quote(launch.log_dir)} && rm -f stopped && "
        f"{{ {env} setsid nohup {shlex.join(foreground_command(preset, launch))} "
        f">> {shlex.quote(launch.log_path)} 2>&1 < /dev/null & echo $! > {shlex.quote(launch.pid_file)}; }} && "
        f"{{ setsid nohup {shlex.join(monitor_command(launch, preset))} "
        f">> {shlex.quote(launch.log_dir + '/monitor.log')} 2>&1 < /dev/null & }}"
    )


# A peer silent this long has vanished (train.agent.measure.monitor.PeerWatch): under the 60 s a lost host
# must be noticed in, whatever the heartbeat a slow link's collectives need
PEER_LOST_AFTER_S = 45


def monitor_command(launch: Launch, preset: Preset | None = None) -> list[str]:
    """The sampler beside the training (train/agent/measure/monitor.py): NIC, CPU, memory, GPUs to
    samples.jsonl every 2 s; it ends by itself when the run's processes are gone. Without the
    inventory's cluster_nic it samples the NIC provisioning detected (TANDEM_CLUSTER_NIC). As the
    host's watchdog it kills a rank left stopped (frozen) 15 s beyond the heartbeat that ends its
    peers."""
    nic = ["--nic", launch.nic] if launch.nic else []
    peers = ["--peers", ",".join(launch.peers), "--peer-lost-after", str(PEER_LOST_AFTER_S)] if launch.peers else []
    heartbeat = int((preset.options if preset else {}).get("heartbeat_timeout") or COMMON["heartbeat_timeout"])
    return [f"{launch.venv.rstrip('/')}/bin/python", "-m", "train.agent.measure.monitor",
            "--out", f"{launch.log_dir}/samples.jsonl", *nic, "--watch", launch.save_dir,
            "--frozen-after", str(heartbeat + 15), "--log", launch.log_path, "--pid-file", launch.pid_file, *peers]


def launches(
    run_id: str,
    hosts: Sequence[Mapping[str, object]],
    *,
    master_port: int,
    data_dir: str,
    run_dir: str,
    venv: str,
    update_freq: int = 1,
    precision: str = "fp32",
    comm: str = "sync",
) -> list[Launch]:
    """One Launch per host, in order (rank 0 first, the master): hosts are mappings with
    `address`, `gpus`, `nic` and optionally `ranks` (a CPU host's ranks, the inventory's
    `cpu_ranks`; a GPU host runs one per GPU) and `threads` (CPU threads per rank, the inventory's
    `train_threads`). All hosts must run the same number of ranks on the same kind of device:
    torchrun starts the same number of processes everywhere (train.run.preflight.layout_problems
    says which host differs, and what to do, before this is reached)."""
    if not hosts:
        raise ValueError("no hosts to launch on")
    gpus = {int(h.get("gpus", 0) or 0) for h in hosts}  # type: ignore[arg-type]
    if len(gpus) > 1:
        raise ValueError(f"hosts promise different GPU counts {sorted(gpus)}; tandem needs them equal")
    cpu = {int(h.get("ranks", 1) or 1) for h in hosts}  # type: ignore[arg-type]
    if gpus == {0} and len(cpu) > 1:
        raise ValueError(f"CPU hosts run different numbers of ranks {sorted(cpu)}; tandem needs them equal")
    run = PurePosixPath(run_dir)
    return [
        Launch(
            run_id=run_id,
            node_rank=i,
            nnodes=len(hosts),
            gpus_per_host=int(h.get("gpus", 0) or 0),  # type: ignore[arg-type]
            master_addr=str(hosts[0]["address"]),
            master_port=master_port,
            data_dir=data_dir,
            save_dir=str(run / "checkpoints"),
            log_path=str(run / "train.log"),
            nic=str(h.get("nic", "") or ""),
            venv=venv,
            update_freq=update_freq,
            precision=precision,
            comm=comm,
            omp_threads=int(h["threads"]) if h.get("threads") else None,  # type: ignore[arg-type]
            cpu_ranks=int(h.get("ranks", 1) or 1),  # type: ignore[arg-type]
            peers=tuple(str(o["address"]) for o in hosts if o is not h),
        )
        for i, h in enumerate(hosts)
    ]


def tokens_per_update(max_tokens: int, update_freq: int, ranks: int) -> int:
    """The effective batch's tokens (at most, padding included): every rank's batch of up to
    max_tokens, update_freq of them before each update."""
    return max_tokens * update_freq * ranks


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def batch_line(hosts: int, ranks_per_host: int, max_tokens: int | None, update_freq: int,
               batch_size: int | None = None) -> str:
    """The effective batch in words, as `fab train` says it when it starts:

    >>> batch_line(2, 2, 4096, 1)
    'batch 2 hosts x 2 ranks x 4,096 tokens x update-freq 1 = 16,384 tokens per update'
    """
    ranks = hosts * ranks_per_host
    shape = f"batch {_count(hosts, 'host')} x {_count(ranks_per_host, 'rank')}"
    if max_tokens:
        return (f"{shape} x {max_tokens:,} tokens x update-freq {update_freq} = "
                f"{tokens_per_update(max_tokens, update_freq, ranks):,} tokens per update")
    if batch_size:
        return (f"{shape} x {batch_size:,} sentences x update-freq {update_freq} = "
                f"{batch_size * update_freq * ranks:,} sentences per update")
    return f"{shape} x update-freq {update_freq} (no max_tokens or batch_size: fairseq's default batch)"


def generate_argv(venv: str, data_dir: str, checkpoint: str, subset: str, beam: int, batch_size: int, cpu: bool,
                  bpe: str, max_len_a: float, max_len_b: int) -> list[str]:
    """fairseq-generate's arguments, through tandem's entry point (train/agent/trainer/fairseq_generate.py:
    the checkpoint loaded as data only): every sentence kept (batch multiple 1), subwords joined back."""
    argv = [f"{venv}/bin/python", "-m", "train.agent.trainer.fairseq_generate", data_dir, "--path", checkpoint,
            "--gen-subset", subset,
            "--beam", str(beam), "--batch-size", str(batch_size), "--required-batch-size-multiple", "1",
            "--remove-bpe", bpe, "--max-len-a", str(max_len_a), "--max-len-b", str(max_len_b)]
    return [*argv, "--cpu"] if cpu else argv


def evaluation_command(
    *,
    data_dir: str,
    checkpoint: str,
    reference: str,
    out_dir: str,
    venv: str,
    subset: str = "test",
    beam: int = 5,
    batch_size: int = 128,
    cpu: bool = True,
    bpe: str = "sentencepiece",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    env_file: str = ENV_FILE,
) -> str:
    """The single-host evaluation: translate `subset` with `checkpoint`, score with SacreBLEU.

    Writes OUT/generate.txt (fairseq-generate's output), OUT/hyp.txt (detokenised
    hypotheses in test-set order) and OUT/bleu.json (sacrebleu's JSON; `parse_bleu` reads it).
    `reference` is the raw (not subword-split) target side of the subset. Hypotheses are
    capped at max_len_a × source length + max_len_b tokens, so that an untrained model that
    never emits end-of-sentence does not take minutes to score.
    """
    venv = venv.rstrip("/")
    out = PurePosixPath(out_dir)
    q = shlex.quote
    generate = generate_argv(venv, data_dir, checkpoint, subset, beam, batch_size, cpu, bpe, max_len_a, max_len_b)
    gen, hyp, bleu = out / "generate.txt", out / "hyp.txt", out / "bleu.json"
    return (
        f"{reading_env_file(env_file)}mkdir -p {q(str(out))} && {shlex.join(generate)} > {q(str(gen))} && "
        f"grep -P '^H-\\d+\\t' {q(str(gen))} | sed 's/^H-//' | sort -n -k1,1 | cut -f3 > {q(str(hyp))} && "
        f"{venv}/bin/sacrebleu {q(reference)} -i {q(str(hyp))} -m bleu -w 2 > {q(str(bleu))} && "
        f"cat {q(str(bleu))}"
    )


def parse_bleu(text: str) -> float:
    """The BLEU score from sacrebleu's output (its JSON, or the `BLEU = 12.34 ...` line)."""
    import json
    import re

    try:
        data = json.loads(text)
        if isinstance(data, list):
            data = data[0]
        return float(data["score"])
    except (ValueError, KeyError, TypeError, IndexError):
        match = re.search(r"BLEU\S*\s*=\s*([0-9.]+)", text)
        if not match:
            raise ValueError(f"no BLEU score in {text[:200]!r}") from None
        return float(match.group(1))


def parse_signature(text: str) -> str:
    """SacreBLEU's signature from its JSON ('nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0'):
    what a published score must share to compare with this one; '' when the output has none."""
    import json

    try:
        data = json.loads(text)
        if isinstance(data, list):
            data = data[0]
        return str(data.get("signature", ""))
    except (ValueError, AttributeError, IndexError):
        return ""
