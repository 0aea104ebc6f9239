"""train.agent.measure.allreduce's launcher: the one command each host runs, for roles/verify and fab bench-net."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from train.agent.measure import allreduce


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpu_hosts_get_one_rank_each_in_host_order():
    argv = allreduce.rank_argv(1, [1, 1, 1], "10.0.0.1", 29501, "/opt/tandem/venv/bin/python", ["--sizes", "1M"])
    assert argv == ["/opt/tandem/venv/bin/python", "-m", "train.agent.measure.allreduce", "--rank", "1",
                    "--world-size", "3",
                    "--master-addr", "10.0.0.1", "--master-port", "29501", "--sizes", "1M"]


def test_a_host_with_several_gpus_runs_torchrun_from_the_same_venv():
    argv = allreduce.rank_argv(1, [1, 4], "10.0.0.1", 29501, "/opt/tandem/venv/bin/python", ["--sizes", "1M"])
    assert argv[:1] == ["/opt/tandem/venv/bin/torchrun"]
    assert argv[argv.index("--nproc_per_node") + 1] == "4" and argv[argv.index("--node_rank") + 1] == "1"
    assert argv[-4:] == ["-m", "train.agent.measure.allreduce", "--sizes", "1M"]


def test_env_file_lines(tmp_path):
    env = tmp_path / "env"
    env.write_text("# BEGIN network\nGLOO_SOCKET_IFNAME=eth1\nNCCL_SOCKET_IFNAME='eth1'\n\nTANDEM_VENV=/opt/v\n")
    assert allreduce.read_env_file(str(env)) == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1",
                                                 "TANDEM_VENV": "/opt/v"}


def launch_pair(tmp_path, env_lines: str, timeout: float = 120, ranks: int = 1,
                extra: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    """Two 'hosts' on this machine, each running the launcher command benchmarks.net starts."""
    env = tmp_path / "env"
    env.write_text(env_lines)
    port = free_port()
    procs = [subprocess.Popen(allreduce.host_argv(sys.executable, node, [ranks, ranks], "127.0.0.1", port,
                                                  ["--sizes", "1M,4M", "--iters", "2", "--timeout", "30", *extra],
                                                  env_file=str(env)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_two_hosts_reduce_correctly_through_the_launcher(tmp_path):
    rank0, rank1 = launch_pair(tmp_path, "GLOO_SOCKET_IFNAME=lo\n")
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    report = json.loads(next(line[5:] for line in rank0.stdout.splitlines() if line.startswith("JSON ")))
    assert report["world_size"] == 2 and report["backend"] == "gloo" and report["ok"]
    assert [r["size"] for r in report["results"]] == [2**20, 4 * 2**20]
    assert "busbw(GB/s)" in rank0.stdout and "JSON" not in rank1.stdout  # rank 0 reports


def test_two_hosts_of_two_ranks_reduce_over_all_four_through_the_launcher(tmp_path):
    """2 hosts x 2 ranks (a CPU host's cpu_ranks, or 2 GPUs): torchrun on each host, every rank of
    every host in one all_reduce (world 4, each rank's sum checked). The intra-host run is left out:
    both 'hosts' are this machine, and each would take the same port on 127.0.0.1."""
    rank0, rank1 = launch_pair(tmp_path, "GLOO_SOCKET_IFNAME=lo\n", ranks=2, extra=("--skip-intra",))
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    report = json.loads(next(line[5:] for line in rank0.stdout.splitlines() if line.startswith("JSON ")))
    assert report["world_size"] == 4 and report["ok"] and len(report["hosts"]) == 4, report
    assert "INTRA" not in rank0.stdout


def test_ranks_per_host_wins_over_gpus_per_host():
    assert allreduce.ranks_per_host("2,2", "0,0") == [2, 2]
    assert allreduce.ranks_per_host(None, "0,4") == [1, 4]  # the older form: one rank per CPU host
    assert allreduce.ranks_per_host("2,0", None) == [] and allreduce.ranks_per_host("x", None) == []
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.allreduce", "--node-rank", "1",
                           "--ranks-per-host", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--node-rank 1 with --ranks-per-host 2" in proc.stderr


def test_the_environment_file_reaches_the_ranks(tmp_path):
    """An interface that does not exist, from the file: gloo refuses it, so the file was read."""
    rank0, rank1 = launch_pair(tmp_path, "GLOO_SOCKET_IFNAME=tandem-none0\n", timeout=60)
    assert rank0.returncode != 0 and rank1.returncode != 0
    assert "tandem-none0" in rank0.stderr


def test_a_node_rank_beyond_the_hosts_is_refused():
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.allreduce", "--node-rank", "2",
                           "--gpus-per-host", "0,0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--node-rank 2 with --gpus-per-host 0,0" in proc.stderr


def test_a_host_with_several_gpus_measures_them_alone_first():
    """Two ranks on one 'host' (gloo on CPU stands in for NCCL over NVLink): the intra-host figure
    comes back as an INTRA line, with every rank's sum checked."""
    code = ("from train.agent.measure import allreduce; "
            f"a = allreduce.parser().parse_args(['--sizes', '1M', '--iters', '2', '--backend', 'gloo', "
            f"'--master-port', '{free_port()}', '--timeout', '30', '--json', '/nonexistent/x.json']); "
            "allreduce.measure_intra_host(2, a)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(next(line[6:] for line in done.stdout.splitlines() if line.startswith("INTRA ")))
    assert report["ok"] and report["world_size"] == 2 and report["results"][0]["size"] == 2**20


def test_gpu_hosts_run_nccl_under_torchrun_one_worker_per_gpu_as_training_does():
    """Even a one-GPU host: torchrun gives its worker LOCAL_RANK and the rendezvous, as `fab train` starts ranks."""
    sweep = ["--backend", "nccl", "--sizes", "1G"]
    one = allreduce.rank_argv(1, [1, 1], "10.0.0.1", 29501, "/opt/tandem/venv/bin/python", sweep, "nccl")
    assert one == ["/opt/tandem/venv/bin/torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "1",
                   "--master_addr", "10.0.0.1", "--master_port", "29501", "-m", "train.agent.measure.allreduce", *sweep]
    eight = allreduce.rank_argv(0, [8, 8], "10.0.0.1", 29501, "/opt/tandem/venv/bin/python", sweep, "nccl")
    assert eight[eight.index("--nproc_per_node") + 1] == "8"
    cpu = allreduce.rank_argv(0, [1, 1], "10.0.0.1", 29501, "/opt/tandem/venv/bin/python", ["--sizes", "1M"], "gloo")
    assert cpu[:3] == ["/opt/tandem/venv/bin/python", "-m", "train.agent.measure.allreduce"]  # the lab: the rank itself


def test_the_ranks_get_provisionings_nccl_sockets_unless_the_run_names_others():
    provisioned = {"NCCL_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8"}
    mine = {"PATH": "/usr/bin", "NCCL_SOCKET_NTHREADS": "1"}
    assert allreduce.rank_environment(mine, provisioned, None) == {"PATH": "/usr/bin", **provisioned}
    tried = allreduce.rank_environment(mine, provisioned, "4x4")
    assert (tried["NCCL_SOCKET_NTHREADS"], tried["NCCL_NSOCKS_PERTHREAD"], tried["NCCL_SOCKET_IFNAME"]) == (
        "4", "4", "ens5")
    defaults = allreduce.rank_environment(mine, provisioned, "none")
    assert "NCCL_SOCKET_NTHREADS" not in defaults and "NCCL_NSOCKS_PERTHREAD" not in defaults
    assert allreduce.nccl_settings(tried) == {"NCCL_NSOCKS_PERTHREAD": "4", "NCCL_SOCKET_IFNAME": "ens5",
                                              "NCCL_SOCKET_NTHREADS": "4"}


def test_the_report_names_the_nccl_settings_the_ranks_ran_with(tmp_path):
    """Through the launcher as bench-net starts it: the file's sockets, replaced by --nccl-sockets 16 (2x8)."""
    rank0, rank1 = launch_pair(tmp_path, "GLOO_SOCKET_IFNAME=lo\nNCCL_SOCKET_NTHREADS=1\nNCCL_NSOCKS_PERTHREAD=5\n",
                               extra=("--nccl-sockets", "16"))
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    report = json.loads(next(line[5:] for line in rank0.stdout.splitlines() if line.startswith("JSON ")))
    assert report["nccl_env"] == {"NCCL_NSOCKS_PERTHREAD": "8", "NCCL_SOCKET_NTHREADS": "2"}


def test_a_socket_choice_nccl_would_refuse_stops_the_launcher_before_any_rendezvous():
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.allreduce", "--node-rank", "0",
                           "--ranks-per-host",
                           "1,1", "--nccl-sockets", "9x8"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "NCCL sockets 9x8: threads 1 to 16, threads x sockets per thread at most 64" \
        in proc.stderr
