"""`fab evaluate`: translate the test set with a checkpoint on rank 0's host, SacreBLEU."""

from __future__ import annotations

from ..cluster import ClusterError, Host, run_all
from ..hosts.remote import venv_of
from ..recipe.record import Run
from . import command, gpu_choice


def evaluate(run: Run, hosts: list[Host], checkpoint: str, console) -> float:
    """SacreBLEU of `checkpoint` on the run's test set (also written to reports/RUN/bleu.json)."""
    host = run.hosts_of(hosts)[0]  # rank 0's host: it holds the checkpoints
    cmd = command.evaluation_command(
        data_dir=run.data_dir, checkpoint=f"{run.remote_dir}/checkpoints/{checkpoint}",
        reference=f"{run.data_dir}/test.ref.de", out_dir=f"{run.remote_dir}/eval",
        venv=venv_of(host), cpu=host.gpus == 0)
    gpu = gpu_choice.free_gpu(host, run.remote_dir.rsplit("/", 1)[0])  # never a GPU a run trains on
    if gpu is not None:
        cmd = f"export CUDA_VISIBLE_DEVICES={gpu}; {cmd}"
        console.print(f"evaluating on {host.name}'s GPU {gpu} (no run trains on it)")
    with console.status(f"translating the test set on {host.name}"):
        result = run_all([host], cmd)[host.name]
    if not result.ok:
        raise ClusterError(f"{host.name}: evaluation failed: {result.error or result.stderr}")
    bleu = command.parse_bleu(result.stdout)
    run.local_dir.mkdir(parents=True, exist_ok=True)
    (run.local_dir / "bleu.json").write_text(result.stdout)
    return bleu
