#!/usr/bin/env bash
# Set up this machine, idempotently:
#   bash lab/bootstrap.sh        the controller (make setup): a Python >= 3.11, ssh and rsync, then the
#                                checkout's virtualenv .venv with requirements.txt. No root, no compiler;
#                                Linux or macOS.
#   bash lab/bootstrap.sh lab    the lab's system packages, and .venv with requirements-dev.txt (the
#                                training environment and the test tools besides; make lab-setup, root)
#   bash lab/bootstrap.sh test   the lab's, and what the lab tests use on this machine (make test-setup)
# Slow work is cached outside the checkout ($TANDEM_CACHE, default ~/.cache/tandem)
# and shared by every checkout on the machine (a developer's, CI's fresh clones):
#   $TANDEM_CACHE/wheels/        the fairseq wheel, built once (it compiles C++ for ~3 min)
#   $TANDEM_CACHE/venvs/<kind>-<hash>/  the controller's (requirements.txt) or the lab's and tests'
#                                (requirements-dev.txt) packages, one virtualenv per version of the
#                                requirements files (and of the functions below that build it)
# .venv is the checkout's own small virtualenv on top of that one (made in about 1 s): a .pth line puts
# the shared site-packages on its path, tandem is installed in it editable (this checkout's code, never
# another checkout's), and .venv/bin runs the shared tools (ansible-playbook, fab, pytest, ruff, torchrun,
# fairseq-*, ...) with .venv/bin/python, so that they import this checkout's tandem too.
# A finished shared virtualenv is only read: a user who cannot write the cache can still make .venv on it.
# Written for macOS's bash 3.2 too (no mapfile, no flock(1) or sha256sum there).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
# The controller's system packages (Debian, Ubuntu): ssh runs Ansible and rsync; rsync copies datasets
# (fab prepare-data) and a wheelhouse directory (train_env_wheelhouse_dir) to the hosts.
controller_apt=(openssh-client rsync)
# The lab: mmdebstrap builds the hosts' Debian, apt-ftparchive (apt-utils) their package repository,
# iproute2 the namespaces, links and tc caps.
lab_apt=(mmdebstrap apt-utils iproute2 openssh-client)
# What the lab tests run on this machine: iperf3 and ethtool inside the hosts' namespaces, xfsprogs for
# an XFS volume that provisioning must refuse to erase, chromium for the report page's browser test,
# etcd for the keepers' agreement among three hosts (tests/unit/train/agent/test_agreement.py).
test_apt=(iperf3 ethtool xfsprogs chromium etcd-server)

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
sha256() { if have sha256sum; then sha256sum; else shasum -a 256; fi | cut -c1-12; }

# flock(1) is Linux's; elsewhere (macOS) Python takes the same lock: flock(2) on the shell's own
# descriptor, held by the open file (as flock(1) holds it) after the Python process exits.
if ! have flock; then
  flock() {
    local nb=0
    if [ "$1" = -n ]; then nb=1; shift; fi
    "$python" -c 'import fcntl, sys
try: fcntl.flock(int(sys.argv[1]), fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[2] == "1" else 0))
except BlockingIOError: sys.exit(1)' "$1" "$nb"
  }
fi

# How to install something here: hint "<apt packages>" "<brew formulae>" "<dnf packages>"
hint() {
  if [ "$(uname -s)" = Darwin ]; then echo "brew install $2"
  elif have apt-get; then echo "sudo apt-get install $1"
  elif have dnf; then echo "sudo dnf install $3"
  else echo "install $1 with this system's package manager"
  fi
}

# Debian or Ubuntu as root: install what is missing. Anyone else: say what is missing and how to get it.
apt_install() {
  local missing=() p
  have dpkg-query || die "no dpkg here: the lab needs a Debian or Ubuntu machine (apt, network namespaces, root); a controller does not (make setup)"
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || die "system packages missing (${missing[*]}): sudo apt-get install ${missing[*]}"
  say "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

python_version() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null; }
python_minor() { "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
python_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

# The controller's Python: $TANDEM_PYTHON, else the first of python3, python3.13, python3.12, python3.11
# that is 3.11 or newer (macOS's own python3 is 3.9: Homebrew's python3.12 is then taken).
pick_python() {
  local p found=''
  if [ -n "${TANDEM_PYTHON:-}" ]; then
    have "$TANDEM_PYTHON" || die "TANDEM_PYTHON=$TANDEM_PYTHON not found"
    python_ok "$TANDEM_PYTHON" || die "TANDEM_PYTHON=$TANDEM_PYTHON is Python $(python_version "$TANDEM_PYTHON"); tandem needs 3.11 or newer"
    python=$TANDEM_PYTHON
    return
  fi
  for p in python3 python3.13 python3.12 python3.11; do
    if have "$p" && python_ok "$p"; then python=$p; return; fi
    [ -n "$found" ] || ! have "$p" || found="$p is $(python_version "$p")"
  done
  die "python3 >= 3.11 not found${found:+ ($found)}: $(hint "python3.11 python3.11-venv python3.11-dev" python@3.12 "python3.12 python3.12-devel")"
}

# What the controller needs before its virtualenv: ssh, rsync, Python's venv. On Debian or Ubuntu as
# root they are installed; anywhere else each missing one is named with how to get it.
check_controller() {
  local missing=() p
  pick_python
  if have dpkg-query && [ "$(id -u)" -eq 0 ]; then
    apt_install "${controller_apt[@]}"
  else
    for p in ssh rsync; do have "$p" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] || die "${missing[*]} not found: $(hint "openssh-client rsync" rsync "openssh-clients rsync")"
  fi
  "$python" -c 'import venv, ensurepip' 2>/dev/null && return
  if have apt-get && [ "$(id -u)" -eq 0 ]; then apt_install "python$(python_minor)-venv"; return; fi
  die "$python has no venv module: $(hint "python$(python_minor)-venv" python@3.12 python3)"
}

# Building fairseq's wheel (once per Python) compiles C++ against Python's headers.
check_build_tools() {
  local include
  include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if { have c++ || have g++ || have clang++; } && [ -f "$include/Python.h" ]; then return; fi
  if have apt-get && [ "$(id -u)" -eq 0 ]; then
    apt_install g++ "python$(python_minor)-dev"
    return
  fi
  if [ "$(uname -s)" = Darwin ]; then
    die "fairseq's wheel is built here once and needs a C++ compiler and Python's headers: xcode-select --install"
  fi
  die "fairseq's wheel is built here once and needs a C++ compiler and Python's headers ($include/Python.h): $(hint "g++ python3-dev" "" "gcc-c++ python3-devel")"
}

# The wheel is this Python's (cp311, cp312, ...): a cache shared by two Pythons holds one for each.
build_fairseq_wheel() {
  local venv=$1 version
  version=$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt" | cut -d= -f3)
  mkdir -p "$cache/wheels"
  if fairseq_wheel_cached "$venv/bin/python"; then return; fi
  say "building the fairseq $version wheel once (compiles C++/Cython, about 3 minutes)"
  # No build isolation: an isolated build env would pull a multi-GB CUDA torch.
  "$venv/bin/pip" install -q "$(grep -E '^torch==' "$top/requirements-train.txt")" \
    "$(grep -E '^numpy==' "$top/requirements-train.txt")"
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$cache/wheels" "fairseq-fixed==$version"
}

fairseq_wheel_cached() {
  local version tag
  version=$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt" | cut -d= -f3)
  tag=$("$1" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  ls "$cache/wheels"/fairseq_fixed-"$version"-"$tag"-*.whl >/dev/null 2>&1
}

# The collections the roles use, out of the pinned ansible release's wheel (PyPI; Galaxy may be
# unreachable): ansible-core alone has only ansible.builtin.
install_collections() {
  local venv=$1 release names site
  release=$(grep -E '^ansible==' "$top/requirements-collections.txt")
  names=$(grep -vE '^(#|ansible==|$)' "$top/requirements-collections.txt" | tr '\n' ' ')
  mkdir -p "$cache/downloads"
  "$venv/bin/pip" download -q --no-deps --only-binary :all: -d "$cache/downloads" "$release"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$venv/bin/python" - "$cache/downloads/ansible-${release#ansible==}-py3-none-any.whl" "$site" $names <<'PY'
import sys, zipfile
wheel, site, names = sys.argv[1], sys.argv[2], sys.argv[3:]
prefixes = tuple("ansible_collections/%s/" % n.replace(".", "/") for n in names)
with zipfile.ZipFile(wheel) as z:
    z.extractall(site, [m for m in z.namelist() if m.startswith(prefixes)])
PY
}

# A shared virtualenv, one of two kinds:
#   controller  requirements.txt and the roles' collections: what a laptop runs (no torch, no compiler)
#   dev         requirements-dev.txt: the controller's, the training environment (fairseq's wheel built
#               here once), the whole ansible release and the test tools: the lab and the tests
# One set-up builds it at a time.
make_shared_venv() {
  local kind=$1 venv=$2
  mkdir -p "$cache/venvs"
  exec 9>"$venv.lock"
  flock -n 9 || { say "waiting for another set-up to finish $venv"; flock 9; }
  if [ ! -f "$venv/.complete" ]; then
    say "creating the shared $kind virtualenv $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    if [ "$kind" = controller ]; then
      say "installing requirements.txt"
      "$venv/bin/pip" install -q -r "$top/requirements.txt"
      install_collections "$venv"
    else
      "$venv/bin/pip" install -q -r "$top/requirements-build.txt"
      build_fairseq_wheel "$venv"
      say "installing requirements-dev.txt"
      grep -v '^fairseq-fixed' "$top/requirements-train.txt" > "$venv/requirements-train.txt"
      sed -e 's#^-r requirements-train.txt#-r '"$venv"'/requirements-train.txt#' \
        -e 's#^-r requirements.txt#-r '"$top"'/requirements.txt#' "$top/requirements-dev.txt" > "$venv/requirements-dev.txt"
      "$venv/bin/pip" install -q -r "$venv/requirements-dev.txt"
      # fairseq's metadata asks for torchaudio, which translation never imports: install
      # its wheel without dependencies; requirements-train.txt lists the ones it needs.
      "$venv/bin/pip" install -q --find-links "$cache/wheels" --no-deps \
        "$(grep -E '^fairseq-fixed==' "$top/requirements-train.txt")"
    fi
    touch "$venv/.complete"
  fi
  exec 9>&-
}

shared_venv_hash() {
  { echo "$1"; cat "$top"/requirements*.txt
    "$python" -c 'import sys; print(sys.version)'
    declare -f make_shared_venv build_fairseq_wheel install_collections; } | sha256
}

# .venv/bin: every executable of the shared venv that .venv lacks (its own python stays). A Python console
# script is copied with pip's /bin/sh opening for .venv/bin/python (a #! line has a length limit): it runs
# as .venv/bin/<name>, where tools such as ansible-lint look for their siblings. Anything else (ruff): a link.
link_shared_tools() {
  local shared=$1 bin=$2 tool name first second skip q="'''"
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
    { printf '#!/bin/sh\n%sexec'"'"' "%s" "$0" "$@"\n'"'"' %s\n' "$q" "$top/.venv/bin/python" "$q"
      tail -n +"$((skip + 1))" "$tool"; } > "$bin/$name"
    chmod +x "$bin/$name"
  done
}

# venv writes the place it is made at into its files (activate's VIRTUAL_ENV and prompt, pyvenv.cfg, a script's
# #! line) and links: a venv made at $1 to be renamed $2 names $2 in each of them instead ($1 and $2 in the same
# folder; a compiled .pyc naming $1 is removed, Python compiles it again). Any file or link that still names $1's
# folder name afterwards stops the set-up, before the rename.
name_venv_as() {
  "$1/bin/python" - "$1" "$2" <<'PY' || die "$1 still names ${1##*/}: not renamed to $2"
import os, sys
made, final = sys.argv[1], sys.argv[2]


def entries():
    for root, dirs, files in os.walk(made):
        yield from (os.path.join(root, name) for name in dirs + files)


def names(path, text):
    """Whether the link's target or the file's bytes hold text."""
    if os.path.islink(path):
        return text in os.readlink(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return text.encode() in f.read()
    return False


for path in entries():
    if not names(path, made):
        continue
    if os.path.islink(path):
        target = os.readlink(path)
        os.remove(path)
        os.symlink(target.replace(made, final), path)
    elif path.endswith(".pyc"):
        os.remove(path)
    else:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:  # the same file: its mode stays
            f.write(data.replace(made.encode(), final.encode()))
left = [path for path in entries() if names(path, os.path.basename(made))]
for path in left:
    print("still names %s: %s" % (os.path.basename(made), path), file=sys.stderr)
sys.exit(1 if left else 0)
PY
}

# The checkout's .venv on top of the shared one, made again when the shared venv, pyproject.toml, the
# checkout's place or these functions change (it used to be a link to the shared venv: replaced). It is made
# as .venv.new, so that a half-made one is never used, names .venv throughout (name_venv_as), then is renamed.
make_checkout_venv() {
  local shared=$1 venv=$top/.venv new=$top/.venv.new stamp site shared_site
  stamp=$({ echo "$top $shared"; cat "$top/pyproject.toml"
    declare -f make_checkout_venv link_shared_tools name_venv_as; } | sha256)
  if [ ! -L "$venv" ] && [ "$(cat "$venv/.tandem-stamp" 2>/dev/null)" = "$stamp" ]; then return; fi
  say "making .venv: tandem from $top on top of $shared"
  rm -rf "$new"
  "$shared/bin/python" -m venv --without-pip --prompt .venv "$new"
  site=$("$new/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  shared_site=$("$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  # addsitedir, not a bare path line: the shared site-packages' own .pth files count too
  echo "import site; site.addsitedir('$shared_site')" > "$site/_tandem_shared_venv.pth"
  "$new/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation -e "$top"
  link_shared_tools "$shared" "$new/bin"
  name_venv_as "$new" "$venv"
  echo "$stamp" > "$new/.tandem-stamp"
  rm -rf "$venv"
  mv "$new" "$venv"
}

kind=controller
case "${1:-controller}" in
  controller) ;;
  lab) apt_install "${lab_apt[@]}"; kind=dev ;;
  test) apt_install "${lab_apt[@]}" "${test_apt[@]}"; kind=dev ;;
  *) die "usage: bash lab/bootstrap.sh [lab|test]" ;;
esac
check_controller
shared="$cache/venvs/$kind-$(shared_venv_hash "$kind")"
if [ ! -f "$shared/.complete" ]; then
  [ "$kind" = controller ] || fairseq_wheel_cached "$python" || check_build_tools
  make_shared_venv "$kind" "$shared"
fi
# TANDEM_SHARED_ONLY=1: the shared virtualenv alone, no .venv here (a test builds the controller's for a
# user who cannot write the cache, without turning its own .venv into a controller's)
if [ "${TANDEM_SHARED_ONLY:-0}" = 1 ]; then say "ready: $shared"; exit; fi
make_checkout_venv "$shared"
say "ready: .venv (tandem from $top, packages from $shared)"
