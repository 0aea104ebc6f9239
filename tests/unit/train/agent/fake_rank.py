"""A stand-in for a host's ranks in the keepers' tests: it "trains" one update every 0.2 s, logs each
as fairseq does, and on rank 0 saves a checkpoint every `--save-every` updates (a torch-style zip,
written to a temporary name and renamed, as fairseq does), resuming from the one it finds. As
train.agent.trainer.fairseq_train's rank 0, it writes its pid for the keeper and saves at the end of the
update it is in when it gets SIGUSR2."""

import argparse
import json
import os
import pickle
import signal
import time
import zipfile
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--save-dir", required=True)
p.add_argument("--rank0", action="store_true")
p.add_argument("--max-update", type=int, default=100000)
p.add_argument("--save-every", type=int, default=10)
args = p.parse_args()
save = Path(args.save_dir)
last = save / "checkpoint_last.pt"
update = 0
if last.exists():
    with zipfile.ZipFile(last) as z:
        update = pickle.loads(z.read("archive/data.pkl"))["optimizer_history"][-1]["num_updates"]
print(f"resuming from update {update}", flush=True)
asked = []
signal.signal(signal.SIGUSR2, lambda *_: asked.append(True))
if args.rank0:
    (save / ".rank0.pid").write_text(str(os.getpid()))
while update < args.max_update:
    time.sleep(0.2)
    update += 1
    if args.rank0:
        print("INFO | train_inner | " + json.dumps({"num_updates": str(update)}), flush=True)
        if update % args.save_every == 0 or asked:
            asked.clear()
            tmp = save / "checkpoint_last.pt.tmp"
            with zipfile.ZipFile(tmp, "w") as z:
                z.writestr("archive/data.pkl", pickle.dumps({"optimizer_history": [{"num_updates": update}],
                                                             "padding": "x" * 50000}))
            tmp.rename(last)
if args.rank0:
    print("done training in 1.0 seconds", flush=True)
