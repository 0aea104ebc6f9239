#!/usr/bin/env bash
# On a GPU machine (one NVIDIA GPU, Python with CUDA torch, no internet, no sshd): tandem's GPU
# paths for real. Run from the repository root; benchmarks/README.md ("On a GPU machine") has the
# figures of the last run and how to carry the inputs.
#   KIT=DIR        wheels (*.whl: fairseq's runtime deps, ansible-core) and sdist/fairseq_fixed-*.tar.gz
#                  or a fairseq wheel built for this Python; subwords/{train,valid,test}.{en,de} + dict.en.txt
#   OUT=DIR        where figures, logs and the report go
#   RUNS=...       benchmarks.gpu's runs (default base-fp16,big-fp16,big-bf16)
#   REPEAT=30      the training text repeated, so that an epoch outlasts a run
#   PROFILE=F:C    profile updates F..F+C-1 (torch.profiler; py-spy too if KIT/tools has its wheel)
#   PROFILE_RUNS=  the runs to profile (default: every run)
set -uo pipefail
KIT=${KIT:?the kit directory}; OUT=${OUT:?an output directory}; RUNS=${RUNS:-base-fp16,big-fp16,big-bf16}
REPEAT=${REPEAT:-30}; WORK=${WORK:-/tmp/tandem-gpu}
top=$(pwd); py=$(command -v python3); venv=$("$py" -c 'import sys; print(sys.prefix)')
mkdir -p "$OUT" "$WORK"
# A device machine returns only a few files: the results travel as one archive.
pack() { tar czf "$WORK/results.tgz" -C "$OUT" --exclude='*.part-*' . ; find "$OUT" -mindepth 1 -maxdepth 1 -not -name '*.part-*' -exec rm -rf {} + ; mv "$WORK/results.tgz" "$OUT/"; }
[ -n "${PACK:-}" ] && trap pack EXIT
step() { printf '\n== %s (%s s)\n' "$*" "$SECONDS"; }

step "the machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,persistence_mode --format=csv
"$py" -c 'import platform, torch; print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)'

step "fairseq for this Python ($("$py" -c 'import sys; print(sys.implementation.cache_tag)'))"
wheel=$(ls "$KIT"/fairseq_fixed-*-"$("$py" -c 'import sys; print(sys.implementation.cache_tag.replace("cpython-", "cp"))')"-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  # The CUDA kernels (libnat_cuda, NAT models only) are left out: without CUDA_HOME setup.py skips them.
  (unset CUDA_HOME; time "$py" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$WORK/wheels" "$KIT"/sdist/fairseq_fixed-*.tar.gz) || exit 1
  wheel=$(ls "$WORK"/wheels/fairseq_fixed-*.whl)
  cp "$wheel" "$OUT/" && (cd "$OUT" && split -b 15M "$(basename "$wheel")" "$(basename "$wheel").part-" && rm "$(basename "$wheel")")
fi
"$py" -m pip install -q --no-index --no-deps "$KIT"/*.whl "$wheel" || exit 1
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

step "the corpus (tandem's subwords, training text x$REPEAT)"
rm -rf "$WORK/text" "$WORK/wmt-sample" && mkdir -p "$WORK/text"
for lang in en de; do
  for _ in $(seq "$REPEAT"); do cat "$KIT/subwords/train.$lang"; done > "$WORK/text/train.$lang"
  cp "$KIT/subwords/valid.$lang" "$KIT/subwords/test.$lang" "$WORK/text/"
done
"$venv/bin/fairseq-preprocess" --source-lang en --target-lang de --trainpref "$WORK/text/train" \
  --validpref "$WORK/text/valid" --testpref "$WORK/text/test" --destdir "$WORK/wmt-sample" \
  --srcdict "$KIT/subwords/dict.en.txt" --joined-dictionary --workers 16 > "$WORK/preprocess.log" 2>&1 || { tail "$WORK/preprocess.log"; exit 1; }
cp "$KIT/subwords/corpus.json" "$WORK/wmt-sample/" 2>/dev/null

step "training runs: $RUNS"
"$py" -m benchmarks.gpu --data "$WORK/wmt-sample" --work "$WORK/runs" --out "$OUT" --runs "$RUNS" --venv "$venv" ${PROFILE:+--profile "$PROFILE"} ${PROFILE_RUNS:+--profile-runs "$PROFILE_RUNS"}
status=$?
step "done (exit $status)"
exit $status
