#!/usr/bin/env bash
# Set up this machine as a tandem controller, idempotently: system packages, then the checkout's
# virtualenv .venv. Slow work is cached outside the checkout ($TANDEM_CACHE, default ~/.cache/tandem)
# and shared by every checkout on the machine (a developer's, CI's fresh clones):
#   $TANDEM_CACHE/wheels/        the fairseq wheel, built once (it compiles C++ for ~3 min)
#   $TANDEM_CACHE/venvs/<hash>/  everything in requirements.txt, one virtualenv per version of the
#                                requirements files (and of the two functions below that build it)
# .venv is the checkout's own small virtualenv on top of that one (made in about 1 s): a .pth line puts
# the shared site-packages on its path, tandem is installed in it editable (this checkout's code, never
# another checkout's), and .venv/bin runs the shared tools (ansible-playbook, fab, pytest, ruff, torchrun,
# fairseq-*, ...) with .venv/bin/python, so that they import this checkout's tandem too.
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

build_fairseq_wheel() {
  local venv=$1 version
  version=$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt" | cut -d= -f3)
  mkdir -p "$cache/wheels"
  if ls "$cache/wheels"/fairseq_fixed-"$version"-*.whl >/dev/null 2>&1; then return; fi
  say "building the fairseq $version wheel once (compiles C++/Cython, about 3 minutes)"
  # No build isolation: an isolated build env would pull a multi-GB CUDA torch.
  "$venv/bin/pip" install -q "$(grep -E '^torch==' "$top/requirements-train.txt")" \
    "$(grep -E '^numpy==' "$top/requirements-train.txt")"
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$cache/wheels" "fairseq-fixed==$version"
}

# The shared virtualenv: requirements.txt, and the build tools (requirements-build.txt: setuptools is
# also what installs tandem editable, pyproject.toml's [build-system]). One set-up builds it at a time.
make_shared_venv() {
  local venv=$1
  mkdir -p "$cache/venvs"
  exec 9>"$venv.lock"
  flock -n 9 || { say "waiting for another set-up to finish $venv"; flock 9; }
  if [ ! -f "$venv/.complete" ]; then
    say "creating the shared virtualenv $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$top/requirements-build.txt"
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
  exec 9>&-
}

shared_venv_hash() {
  { cat "$top/requirements.txt" "$top/requirements-train.txt" "$top/requirements-build.txt"
    "$python" -c 'import sys; print(sys.version)'
    declare -f make_shared_venv build_fairseq_wheel; } | sha256sum | cut -c1-12
}

# .venv/bin: every executable of the shared venv that .venv lacks (its own python stays). A Python console
# script is copied with pip's /bin/sh opening for .venv/bin/python (a #! line has a length limit): it runs
# as .venv/bin/<name>, where tools such as ansible-lint look for their siblings. Anything else (ruff): a link.
link_shared_tools() {
  local shared=$1 bin=$2 tool name first second skip body q="'''"
  for tool in "$shared"/bin/*; do
    name=${tool##*/}
    { [ -f "$tool" ] && [ -x "$tool" ] && [ ! -e "$bin/$name" ]; } || continue
    first='' second=''
    { IFS= read -r first; IFS= read -r second; } < "$tool" 2>/dev/null || true
    # pip writes either `#!/venv/bin/python` or, for a long path, `#!/bin/sh` + `'''exec' "/venv/bin/python" ...`
    if [[ $first == "#!$shared/bin/python"* ]]; then skip=1
    elif [[ $first == "#!/bin/sh" && $second == "$q""exec' \"$shared/bin/python"* ]]; then skip=3
    else ln -s "$tool" "$bin/$name"; continue
    fi
    mapfile -t -s "$skip" body < "$tool"
    { printf '#!/bin/sh\n%sexec'"'"' "%s" "$0" "$@"\n'"'"' %s\n' "$q" "$top/.venv/bin/python" "$q"
      printf '%s\n' "${body[@]}"; } > "$bin/$name"
    chmod +x "$bin/$name"
  done
}

# The checkout's .venv on top of the shared one, made again when the shared venv, pyproject.toml, the
# checkout's place or this function change (it used to be a link to the shared venv: replaced).
make_checkout_venv() {
  local shared=$1 venv=$top/.venv new=$top/.venv.new stamp site shared_site
  stamp=$({ echo "$top $shared"; cat "$top/pyproject.toml"; declare -f make_checkout_venv link_shared_tools; } \
    | sha256sum | cut -c1-12)
  if [ ! -L "$venv" ] && [ "$(cat "$venv/.tandem-stamp" 2>/dev/null)" = "$stamp" ]; then return; fi
  say "making .venv: tandem from $top on top of $shared"
  rm -rf "$new"
  "$shared/bin/python" -m venv --without-pip "$new"
  site=$("$new/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  shared_site=$("$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  # addsitedir, not a bare path line: the shared site-packages' own .pth files count too
  echo "import site; site.addsitedir('$shared_site')" > "$site/_tandem_shared_venv.pth"
  "$new/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e "$top"
  link_shared_tools "$shared" "$new/bin"
  echo "$stamp" > "$new/.tandem-stamp"
  rm -rf "$venv"
  mv "$new" "$venv"
}

install_system_packages
shared="$cache/venvs/$(shared_venv_hash)"
make_shared_venv "$shared"
make_checkout_venv "$shared"
say "ready: .venv (tandem from $top, packages from $shared)"
