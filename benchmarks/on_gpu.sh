#!/usr/bin/env bash
# On a GPU machine (one NVIDIA GPU, Python with CUDA torch, no internet, no sshd): tandem's GPU
# paths for real. Run from the repository root; benchmarks/README.md ("On a GPU machine") has the
# figures of the last run and how to carry the inputs.
#   KIT=kit        `make gpu-kit` (benchmarks/gpu_kit.py): wheels of what the image lacks (MANIFEST.json),
#                  sdist/fairseq_fixed-*.tar.gz or a fairseq wheel built for this Python;
#                  subwords/{train,valid,test}.{en,de} + dict.en.txt + corpus.json
#   OUT=DIR        where figures, logs and the report go
#   RUNS=...       benchmarks.gpu's runs (default base-fp16,big-fp16,big-bf16); none: the set-up alone
#   CORPUS=wmt16   the training text: WMT16's sentence lengths and batches (benchmarks/wmt16_shape.py,
#                  REPEAT x the sample's pairs asked: the same corpus up to REPEAT=33); sample: the
#                  sample's text repeated REPEAT times (the runs before 2026-11-27: its fill follows REPEAT)
#   REPEAT=30      sizes the training text, so that an epoch outlasts a run
#   PROFILE=F:C    profile updates F..F+C-1 (torch.profiler; py-spy too if KIT/tools has its wheel)
#   PROFILE_RUNS=  the runs to profile (default: every run)
set -uo pipefail
KIT=${KIT:-kit}; OUT=${OUT:?an output directory}; RUNS=${RUNS:-base-fp16,big-fp16,big-bf16}
REPEAT=${REPEAT:-30}; CORPUS=${CORPUS:-wmt16}; WORK=${WORK:-/tmp/tandem-gpu}
# before anything runs: a kit left behind is otherwise a tar error minutes into the session
[ -f "$KIT/MANIFEST.json" ] || ls "$KIT"/sdist/fairseq_fixed-*.tar.gz >/dev/null 2>&1 || {
  echo "KIT=$KIT holds no kit (no MANIFEST.json, no sdist/fairseq_fixed-*.tar.gz): run make gpu-kit here, carry kit/" >&2; exit 2; }
top=$(pwd); py=$(command -v python3); venv=$("$py" -c 'import sys; print(sys.prefix)')
# PACK=1 empties OUT into its archive at the end: only a folder that holds nothing yet
if [ -n "${PACK:-}" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "on_gpu.sh: PACK=1 empties OUT at the end, and $OUT already holds files: give an empty or new folder" >&2; exit 2
fi
mkdir -p "$OUT" "$WORK"
# A device machine returns only a few files: the results travel as one archive.
pack() { tar czf "$WORK/results.tgz" -C "$OUT" --exclude='*.part-*' . ; find "$OUT" -mindepth 1 -maxdepth 1 -not -name '*.part-*' -exec rm -rf {} + ; mv "$WORK/results.tgz" "$OUT/"; }
[ -n "${PACK:-}" ] && trap pack EXIT
step() { printf '\n== %s (%s s)\n' "$*" "$SECONDS"; }

step "the machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,persistence_mode --format=csv
"$py" -c 'import importlib.util as u, platform, torch; print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "triton", "yes" if u.find_spec("triton") else "no (compile_layers, fused_loss run unfused)")'

step "fairseq for this Python ($("$py" -c 'import sys; print(sys.implementation.cache_tag)'))"
wheel=$(ls "$KIT"/fairseq_fixed-*-"$("$py" -c 'import sys; print(sys.implementation.cache_tag.replace("cpython-", "cp"))')"-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  # The CUDA kernels (libnat_cuda, NAT models only) are left out: without CUDA_HOME setup.py skips them.
  # setup.py compiles its five extensions one after the other (2 min on one core): here one a core
  # (build_ext --parallel), then the wheel in the same run. torch's ninja backend writes one build.ninja
  # for every extension (parallel builds overwrite each other's) and forces a rebuild: the plain one.
  src="$WORK/fairseq-src"; rm -rf "$src" "$WORK/wheels" && mkdir -p "$src"
  tar xzf "$(ls "$KIT"/sdist/fairseq_fixed-*.tar.gz | head -1)" -C "$src" --strip-components=1 || exit 1
  (cd "$src" && unset CUDA_HOME && time "$py" - "$(nproc)" "$WORK/wheels" > "$WORK/fairseq-build.log" 2>&1 <<'PY'
import runpy, sys
from torch.utils import cpp_extension
plain = cpp_extension.BuildExtension.__init__
cpp_extension.BuildExtension.__init__ = lambda self, *a, **k: plain(self, *a, **{**k, "use_ninja": False})
jobs, dest = sys.argv[1:]
sys.argv = ["setup.py", "-q", "build_ext", "--parallel", jobs, "bdist_wheel", "-d", dest]
runpy.run_path("setup.py", run_name="__main__")
PY
  ) || { tail -20 "$WORK/fairseq-build.log"; exit 1; }
  wheel=$(ls "$WORK"/wheels/fairseq_fixed-*.whl)
  # It comes back in parts: joined (cat), put in ~/.cache/tandem/wheels, the next `make gpu-kit` carries it.
  cp "$wheel" "$OUT/" && (cd "$OUT" && split -b 15M "$(basename "$wheel")" "$(basename "$wheel").part-" && rm "$(basename "$wheel")")
fi
if [ -f "$KIT/MANIFEST.json" ]; then
  # pip's resolver against the image: what it has stays, what it lacks comes from the kit (or fails by name)
  # shellcheck disable=SC2046
  "$py" -m pip install -q --no-index --find-links "$KIT" $("$py" -c 'import json, sys; print(*json.load(open(sys.argv[1]))["install"])' "$KIT/MANIFEST.json") || exit 1
else
  "$py" -m pip install -q --no-index --no-deps "$KIT"/*.whl || exit 1
fi
"$py" -m pip install -q --no-index --no-deps "$wheel" || exit 1
ls "$KIT"/tools/*.whl >/dev/null 2>&1 && "$py" -m pip install -q --no-index --no-deps "$KIT"/tools/*.whl
# What roles/train_env does: tandem's host-side code on the venv's path.
echo "$top" > "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tandem.pth"
"$py" -c 'import fairseq, fairseq.data.data_utils_fast; print("fairseq", fairseq.__version__)' || exit 1

step "provisioning's GPU checks, local connection"
for promised in ${CHECKS-1 2}; do
  printf 'cluster:\n  hosts:\n    gpu0:\n      ansible_connection: local\n      ansible_become: false\n      ansible_python_interpreter: %s\n      gpus: %s\n' "$py" "$promised" > "$WORK/inventory-$promised.yml"
  ANSIBLE_ROLES_PATH=roles ANSIBLE_STDOUT_CALLBACK=default "$venv/bin/ansible-playbook" -i "$WORK/inventory-$promised.yml" playbooks/gpu.yml 2>&1 \
    | tee "$OUT/gpu-check-$promised.txt" | grep -E 'msg|fatal|failed|ok=|GPU' ; echo "gpus: $promised -> exit ${PIPESTATUS[0]}"
done

step "the corpus (tandem's subwords; $CORPUS, REPEAT=$REPEAT)"
rm -rf "$WORK/text" "$WORK/wmt-sample" && mkdir -p "$WORK/text"
if [ "$CORPUS" = wmt16 ]; then
  "$py" -m benchmarks.wmt16_shape build --subwords "$KIT/subwords" --out "$WORK/text" \
    --pairs $((REPEAT * $(wc -l < "$KIT/subwords/train.en"))) | tee "$OUT/corpus.txt" || exit 1
else
  for lang in en de; do
    for _ in $(seq "$REPEAT"); do cat "$KIT/subwords/train.$lang"; done > "$WORK/text/train.$lang"
    cp "$KIT/subwords/valid.$lang" "$KIT/subwords/test.$lang" "$WORK/text/"
  done
fi
"$venv/bin/fairseq-preprocess" --source-lang en --target-lang de --trainpref "$WORK/text/train" \
  --validpref "$WORK/text/valid" --testpref "$WORK/text/test" --destdir "$WORK/wmt-sample" \
  --srcdict "$KIT/subwords/dict.en.txt" --joined-dictionary --workers 16 > "$WORK/preprocess.log" 2>&1 || { tail "$WORK/preprocess.log"; exit 1; }
cp "$KIT/subwords/corpus.json" "$WORK/wmt-sample/" 2>/dev/null

[ "$RUNS" = none ] && { step "done (RUNS=none: the set-up and its checks alone)"; exit 0; }
step "training runs: $RUNS"
"$py" -m benchmarks.gpu --data "$WORK/wmt-sample" --work "$WORK/runs" --out "$OUT" --runs "$RUNS" --venv "$venv" ${PROFILE:+--profile "$PROFILE"} ${PROFILE_RUNS:+--profile-runs "$PROFILE_RUNS"}
status=$?
step "done (exit $status)"
exit $status
