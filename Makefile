# tandem: `make demo` and `make test` do all the set-up they need on a fresh machine (Debian, root);
# `make setup` alone is a controller's (a laptop's: Linux or macOS, no root, no torch), the lab's packages apart.
SHELL := /bin/bash
export TANDEM_CACHE ?= $(HOME)/.cache/tandem
PY := .venv/bin/python
# The virtualenv's tools (ansible, fab) first, as for a user who activated it.
export PATH := $(CURDIR)/.venv/bin:$(PATH)
HOSTS ?= 2
SUBNET ?= 10.77.0.0/24
RATE ?= none
SLOW_NIC ?=
CLUSTER_NET ?= 1
DISTRO ?= bookworm
LOGIN_USER ?= debian
RANKS ?= 1
DATA_DISK_GB ?= 4
LAB := $(PY) -m lab

.PHONY: test-labs bench-targets require-root setup lab-setup test-setup demo test lint unit lab-up lab-down lab-status lab-shape wheelhouse gpu-kit clean

setup:  ## the controller: .venv with requirements.txt (no torch, no compiler, no root), tandem editable in it; packages cached in $TANDEM_CACHE
	@bash lab/bootstrap.sh

lab-setup:  ## the lab: its system packages (Debian or Ubuntu, root: mmdebstrap, apt-utils, iproute2), .venv with requirements-dev.txt
	@bash lab/bootstrap.sh lab

test-setup:  ## the lab's, and what the lab tests run here besides: iperf3, ethtool, xfsprogs, chromium
	@bash lab/bootstrap.sh test

wheelhouse: setup  ## the offline wheelhouse provisioning installs from: HOST_PYTHON=3.12 ACCELERATOR=cu128 (default: this Python, cpu)
	@$(PY) -m train.provision.wheelhouse $(if $(HOST_PYTHON),--python $(HOST_PYTHON)) $(if $(ACCELERATOR),--accelerator $(ACCELERATOR))

gpu-kit: lab-setup  ## the kit a lent GPU machine needs (wheels for its Python, fairseq's sdist, subwords) in kit/: PYTHON=3.12
	@$(PY) -m benchmarks.gpu_kit --python $(or $(PYTHON),3.12) --dest kit

require-root:
	@[ "$$(id -u)" -eq 0 ] || { echo "the lab needs root (network namespaces, mounts, loop devices): run sudo make $(MAKECMDGOALS)" >&2; exit 2; }

lab-up: require-root lab-setup  ## start the local lab (HOSTS=2, SUBNET=10.77.0.0/24, SLOW_NIC=v100b, CLUSTER_NET=0: one network, DISTRO=trixie: Debian 13, LOGIN_USER=root: root logins, RANKS=2: two ranks a host, DATA_DISK_GB=16: a /data of 16 GB)
	@$(LAB) up --hosts $(HOSTS) --subnet $(SUBNET) --slow-nic "$(SLOW_NIC)" $(if $(filter 1,$(CLUSTER_NET)),--cluster-net,--no-cluster-net) --distro $(DISTRO) --login-user $(LOGIN_USER) --ranks $(RANKS) --data-disk-gb $(DATA_DISK_GB)

lab-down:  ## remove everything the lab made
	@if [ -x $(PY) ]; then $(LAB) down; else bash lab/bootstrap.sh && $(LAB) down; fi

lab-status: lab-setup require-root
	@$(LAB) status

lab-shape: lab-setup require-root  ## cap the link between the lab hosts: RATE=100mbit, RATE=none
	@$(LAB) shape $(RATE)

demo: lab-setup  ## the main job end to end on the lab
	@$(PY) -m lab.demo

lint: test-setup
	@.venv/bin/ruff check lab train benchmarks tests fabfile.py
	@ANSIBLE_INVENTORY=inventory/hosts.yml .venv/bin/ansible-lint --offline --profile production provision.yml playbooks roles  # its syntax check needs an inventory (ansible.cfg fails on none)

# The unit tests wait on sockets, subprocesses and heartbeats more than on the CPU: two workers
# (pytest-xdist) took 5.5 min where one took 8.7 on the 2-core CI machine (three: 5.3). The lab's tests share
# one lab and run one at a time, after them; both run whatever the other's outcome.
UNIT_TESTS = .venv/bin/pytest -n 2 -m "not lab and not sweep and not own_lab and not extra"
LAB_TESTS = .venv/bin/pytest -m "lab and not sweep and not own_lab and not extra"

unit: test-setup
	@$(UNIT_TESTS)

test: test-setup lint  ## everything, the lab included, but the speed targets (make bench-targets)
	@$(UNIT_TESTS); units=$$?; $(LAB_TESTS); labs=$$?; \
	  [ $$units -eq 0 ] && [ $$labs -eq 0 ] || { echo "make test: unit tests exit $$units, lab tests exit $$labs"; exit 1; }

test-labs: test-setup  ## the tests that bring up labs of their own beyond make test's (the older three-host runs, every VM gone, Debian 13 hosts) and the older lab tests make test's newer ones cover (~25 min)
	@.venv/bin/pytest -m "own_lab or extra"

bench-targets: test-setup  ## the benchmarks' targets on the lab, the step-time sweeps and the all_reduce bandwidth included (~17 min)
	@.venv/bin/pytest tests/bench -v
	@.venv/bin/pytest tests/training -m sweep -v

bench-prepare: test-setup require-root  ## fab prepare-data --wmt16 at WMT16's full size (4.56M pairs) on a lab of its own with 16 GB volumes; PAIRS=N for another size
	@$(LAB) --prefix tdmprep up --subnet 10.85.0.0/24 --data-disk-gb 16
	@.venv/bin/ansible-playbook -i inventory/lab-tdmprep.yml provision.yml --skip-tags verify -e network_measure=false \
		&& $(PY) -m benchmarks.prepare_lab --prefix tdmprep $(if $(PAIRS),--pairs $(PAIRS)); rc=$$?; $(LAB) --prefix tdmprep down; exit $$rc

help:
	@grep -E '^[a-z-]+:.*##' Makefile | sed 's/:.*## /\t/'
