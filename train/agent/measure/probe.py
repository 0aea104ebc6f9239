"""What a host's training environment is: versions, GPUs, and (for a run) data, disk, port, processes.

    python -m train.agent.measure.probe                                   # versions only (provisioning)
    python -m train.agent.measure.probe --data DIR --port 29500 --run DIR --packages
                                                                  # + what `fab train` checks first

prints one JSON object: python, torch, cuda, cuda_available, cuda_devices, fairseq, numpy, agent
(the digest of this agent's own sources);
with --data the sha256 of the dataset's MANIFEST.sha256 (null when absent) and the free GB on
/data; with --port whether the rendezvous port is free; with --run the pid of a process of that
run already there (null when none); with --packages every installed distribution and its version
(what `pip freeze` lists: train.agent.measure.pins compares them with the pins); with --cache FILE the
versions come from FILE while the installed packages, Python and driver are unchanged. When torch
or fairseq does not import, `import_error` says why and the exit status is 1. roles/train_env and
roles/verify ask it once per host; `fab train` asks it in its preflight; `versions_differ` is the
one comparison all three use.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import socket
import sys

VERSION_KEYS = ("python", "torch", "cuda", "fairseq", "numpy")  # what must be equal on every host of a run


def versions() -> dict:
    out: dict = {"python": platform.python_version()}
    try:
        import fairseq
        import numpy
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                   cuda_devices=torch.cuda.device_count(), fairseq=fairseq.__version__, numpy=numpy.__version__)
    except Exception as err:  # reported, not raised: the caller names the host
        out["import_error"] = repr(err)
    return out


def environment_key() -> str:
    """What versions() depends on, read without importing torch (seconds): Python, every installed
    distribution, the NVIDIA driver and its device nodes."""
    from train.agent.measure.pins import installed

    parts = [platform.python_version(), json.dumps(installed(), sort_keys=True)]
    try:
        with open("/proc/driver/nvidia/version") as f:
            parts.append(f.read())
    except OSError:
        parts.append("no nvidia driver")
    parts.append(",".join(sorted(d for d in os.listdir("/dev") if d.startswith("nvidia"))))
    parts += [version_file_stat(package) for package in ("torch", "fairseq", "numpy")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def version_file_stat(package: str) -> str:
    """The size and time of a package's version.py, found without importing it: a version file changed
    in place (a patched package, a hand edit) is a changed environment too."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
        path = os.path.join(os.path.dirname(spec.origin), "version.py")
        st = os.stat(path)
        return f"{package} {st.st_size} {st.st_mtime_ns}"
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return f"{package} -"


def cached_versions(path: str) -> dict:
    """versions(), answered from `path` while environment_key() is what it was: provisioning's reruns
    ask every host, and importing torch and fairseq takes seconds on each."""
    key = environment_key()
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return saved["versions"]
    except (OSError, ValueError, KeyError):
        pass
    out = versions()
    if "import_error" not in out:
        try:
            with open(path, "w") as f:
                json.dump({"key": key, "versions": out}, f)
        except OSError:
            pass  # a cache, not a result
    return out


def agent_digest() -> str:
    """sha256 of the host-side agent's sources, as roles/train_env installs them (train/__init__.py and
    every .py of train/agent's folders): the controller computes it over its checkout, each host over its
    copy, and `fab train` refuses a host whose copy is another version's (a controller updated without
    re-provisioning would run the old agent, which ignores what it does not know)."""
    agent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # train/agent
    top = os.path.dirname(os.path.dirname(agent))
    sources = [os.path.join(folder, n) for folder, _, names in os.walk(agent) for n in names if n.endswith(".py")]
    files = [os.path.join(os.path.dirname(agent), "__init__.py"), *sorted(sources)]  # the same order on every host
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            content = f.read()
        digest.update(f"{os.path.relpath(path, top)}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def manifest_sha256(data_dir: str) -> str | None:
    manifest = os.path.join(data_dir, "MANIFEST.sha256")
    if not os.path.exists(manifest):
        return None
    with open(manifest, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def training_files(data_dir: str, pair: str = "en-de") -> dict:
    """The sizes fab train's start line turns into the dataset's tokens (train.run.length): each
    side's training binary in bytes and dict.en.txt's lines; or why they could not be read."""
    source = pair.split("-")[0]
    try:
        sizes = [os.path.getsize(os.path.join(data_dir, f"train.{pair}.{lang}.bin")) for lang in pair.split("-")]
        with open(os.path.join(data_dir, f"dict.{source}.txt"), "rb") as f:
            lines = sum(1 for _ in f)
    except OSError as err:
        return {"error": str(err)}
    return {"bin_bytes": sizes, "dict_lines": lines}


def free_gb(path: str = "/data") -> float:
    return round(shutil.disk_usage(path if os.path.isdir(path) else "/").free / 1e9, 1)


def size_gb(path: str) -> float:
    """The bytes of every file under `path` (a run's own checkpoints and logs: a resume replaces them)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return round(total / 1e9, 2)


def port_free(port: int) -> tuple[bool, str | None]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return True, None
    except OSError as err:
        return False, str(err)
    finally:
        s.close()


def gpus() -> list[dict]:
    """Each GPU's name (as NVML reports it: the MFU table's key) and memory: the batch tandem derives
    fits the smallest (train.plan.batch). NVML, not torch.cuda: the probe runs beside a training run
    and must not initialise CUDA on its GPUs."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            out.append({"name": name.decode() if isinstance(name, bytes) else str(name),
                        "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20})
        return out
    finally:
        pynvml.nvmlShutdown()


def probe(data: str | None = None, port: int | None = None, run: str | None = None,
          packages: bool = False, cache: str | None = None) -> dict:
    out = cached_versions(cache) if cache else versions()
    out["agent"] = agent_digest()
    if out.get("cuda_devices"):
        try:
            out["gpus"] = gpus()
        except Exception as err:  # reported, not raised: preflight names the host
            out["gpu_error"] = repr(err)
    if packages:
        from train.agent.measure.pins import installed

        out["packages"] = installed()
    if data is not None:
        out["data"] = manifest_sha256(data)
        out["free_gb"] = free_gb()
        out["training_files"] = training_files(data)
    if port is not None:
        out["port_free"], error = port_free(port)
        if error:
            out["port_error"] = error
    if run is not None:
        from train.agent.keeper.state import run_pids

        pids = run_pids(run)
        out["running"] = pids[0] if pids else None
        out["run_gb"] = size_gb(run)
    return out


def versions_differ(answers: dict[str, dict], keys=VERSION_KEYS) -> list[str]:
    """Each host whose versions differ from the first host's, named with both: [] when all agree."""
    if not answers:
        return []
    first, *others = answers
    return [f"{host}: {key} {answers[host].get(key)} but {first} has {answers[first].get(key)}"
            for host in others for key in keys if answers[host].get(key) != answers[first].get(key)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.measure.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a dataset directory: its manifest's checksum, and the free space on /data")
    p.add_argument("--port", type=int, help="a port that must be free (the rendezvous on rank 0's host)")
    p.add_argument("--run", help="a run directory: is a process of that run already here?")
    p.add_argument("--packages", action="store_true", help="every installed distribution and its version")
    p.add_argument("--cache", help="a file to answer the versions from while the installed packages, "
                   "Python and NVIDIA driver stay the same")
    args = p.parse_args(argv)
    out = probe(args.data, args.port, args.run, args.packages, args.cache)
    print(json.dumps(out))
    if "import_error" in out:
        print(f"torch/fairseq do not import: {out['import_error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
