#!/usr/bin/env bash
# Set up this machine as a tandem controller, idempotently: system packages, then one
# virtualenv with everything in requirements.txt. Slow work is cached outside the
# checkout ($TANDEM_CACHE, default ~/.cache/tandem) so a fresh clone reuses it:
#   $TANDEM_CACHE/wheels/        the fairseq wheel, built once (it compiles C++ for ~3 min)
#   $TANDEM_CACHE/venvs/<hash>/  the virtualenv for one version of the requirements files
# .venv in the checkout is a link to the matching virtualenv.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
python=${TANDEM_PYTHON:-python3}
# xfsprogs: the provisioning tests put an XFS volume on a data device (tandem must refuse to erase it)
apt_packages=(mmdebstrap iperf3 ethtool openssh-client apt-utils iproute2 rsync chromium xfsprogs)

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

install_system_packages() {
  local missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || die "system packages missing (${missing[*]}); run as root or: sudo apt-get install ${missing[*]}"
  say "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

requirements_hash() {
  cat "$top/requirements.txt" "$top/requirements-train.txt" "$0" | sha256sum | cut -c1-12
}

build_fairseq_wheel() {
  local venv=$1 version
  version=$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt" | cut -d= -f3)
  mkdir -p "$cache/wheels"
  if ls "$cache/wheels"/fairseq_fixed-"$version"-*.whl >/dev/null 2>&1; then return; fi
  say "building the fairseq $version wheel once (compiles C++/Cython, about 3 minutes)"
  # No build isolation: an isolated build env would pull a multi-GB CUDA torch.
  "$venv/bin/pip" install -q "$(grep -E '^torch==' "$top/requirements-train.txt")" \
    "$(grep -E '^numpy==' "$top/requirements-train.txt")" cython==3.3.1 wheel setuptools
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$cache/wheels" "fairseq-fixed==$version"
}

make_venv() {
  local venv
  venv="$cache/venvs/$(requirements_hash)"
  if [ ! -f "$venv/.complete" ]; then
    say "creating the virtualenv $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip wheel setuptools
    build_fairseq_wheel "$venv"
    say "installing requirements.txt"
    grep -v '^fairseq-fixed' "$top/requirements-train.txt" > "$venv/requirements-train.txt"
    sed 's#^-r requirements-train.txt#-r '"$venv"'/requirements-train.txt#' "$top/requirements.txt" \
      > "$venv/requirements.txt"
    "$venv/bin/pip" install -q -r "$venv/requirements.txt"
    # fairseq's metadata asks for torchaudio, which translation never imports: install
    # its wheel without dependencies; requirements-train.txt lists the ones it needs.
    "$venv/bin/pip" install -q --find-links "$cache/wheels" --no-deps \
      "$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt")"
    touch "$venv/.complete"
  fi
  ln -sfn "$venv" "$top/.venv"
}

install_system_packages
make_venv
say "ready: $(readlink "$top/.venv")"
