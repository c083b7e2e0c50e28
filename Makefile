# Every target installs what it needs: a fresh clone runs `make demo` or `make test` with no other step.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export LOCKSTEP_CACHE ?= $(HOME)/.cache/lockstep

.PHONY: venv bins test unit e2e lint demo bench cluster-up cluster-down clean soak fuzz \
	fuzz-verbs

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -U pip
	$(VPY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, scheduler-plugins,
# etcd, kwok and the other pinned tools into
# $(LOCKSTEP_CACHE)/bin/<name>-<version>/ when missing; does nothing when all are present.
bins:
	bash hack/build-bins.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check app coscheduling testbed tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VPY) hack/dead_code.py
	$(VENV)/bin/deptry .

unit: $(STAMP)
	$(VPY) -m pytest tests/unit -q

e2e: $(STAMP) bins
	$(VPY) -m pytest tests/e2e -q

# The whole suite: lint, unit tests and the end-to-end tests on the real test bed, each on
# two pytest-xdist workers. The unit tests are CPU-bound and share nothing. The end-to-end
# tests mostly wait (a bed's start, watches, kube-scheduler's queue): one at a time they kept
# the 2-core machine at a load average near 1 for over 30 minutes. Each bed has its own ports
# and directory; --dist loadfile keeps one file's tests on one worker, in order.
test: $(STAMP) bins lint
	$(VPY) -m pytest tests/unit -q -ra -n 2
	$(VPY) -m pytest tests/e2e -q -ra -n 2 --dist loadfile

# The gang core's model-based test with a bigger budget than `make test` gives it
# (tests/unit/model/test_model.py; FUZZ_EXAMPLES runs of up to FUZZ_STEPS random steps). Each run
# draws a new seed and prints it; LOCKSTEP_FUZZ_SEED=n make fuzz replays that run. `make
# test` runs the same model with a fixed seed (the same runs every time).
FUZZ_EXAMPLES ?= 3000
FUZZ_STEPS ?= 80
fuzz: $(STAMP)
	@seed=$${LOCKSTEP_FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "fuzz seed: $$seed (replay: LOCKSTEP_FUZZ_SEED=$$seed make fuzz)"; \
	LOCKSTEP_FUZZ_SEED=$$seed LOCKSTEP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		LOCKSTEP_FUZZ_STEPS=$(FUZZ_STEPS) $(VPY) -m pytest tests/unit/model/test_model.py -q -s \
		-p no:cacheprovider --hypothesis-seed=$$seed

# Property-based fuzzing of the HTTP edge (tests/unit/app/http/test_fuzz_verbs.py) with a long budget:
# FUZZ_VERBS_EXAMPLES requests per verb (filter, prioritize, bind, debug); counts go to
# run/fuzz-verbs-summary.json. LOCKSTEP_FUZZ_VERBS_SEED=n replays a seed.
FUZZ_VERBS_EXAMPLES ?= 10000
fuzz-verbs: $(STAMP)
	LOCKSTEP_FUZZ_VERBS_EXAMPLES=$(FUZZ_VERBS_EXAMPLES) \
		$(VPY) -m pytest tests/unit/app/http/test_fuzz_verbs.py -q -s -p no:cacheprovider

# The long runs of what `make test` runs short:
# - the churn soak (tests/e2e/test_churn.py): SOAK_SECONDS of churn (default 600), then
#   draining; LOCKSTEP_CHURN_SEED=n replays a seed. Counts go to run/churn-summary-soak.json;
# - plain pods beside gangs (tests/e2e/test_plain_pods.py): PLAIN_REPEATS runs of every order
#   (make test: 8) and MIXED_SOAK_SECONDS of the mixed stream (make test: 40).
SOAK_SECONDS ?= 600
PLAIN_REPEATS ?= 20
MIXED_SOAK_SECONDS ?= 300
soak: $(STAMP) bins
	LOCKSTEP_SOAK_SECONDS=$(SOAK_SECONDS) $(VPY) -m pytest tests/e2e/test_churn.py -q -s -k soak
	LOCKSTEP_PLAIN_REPEATS=$(PLAIN_REPEATS) LOCKSTEP_MIXED_SOAK_SECONDS=$(MIXED_SOAK_SECONDS) \
		$(VPY) -m pytest tests/e2e/test_plain_pods.py -q -s

demo: $(STAMP) bins
	$(VPY) -m testbed.demo

bench: $(STAMP) bins
	$(VPY) -m benchmarks

# TOPOLOGY=path/to/topology.yaml LOCKSTEP=1 make cluster-up
# LOCKSTEP=1 runs the default install (the admission webhook on, with its own certificate);
# WEBHOOK=0 runs the extender alone.
cluster-up: $(STAMP) bins
	$(VPY) -m testbed up $(if $(TOPOLOGY),--topology $(TOPOLOGY)) $(if $(LOCKSTEP),--lockstep) \
		$(if $(filter 0,$(WEBHOOK)),--no-webhook)

cluster-down: $(STAMP)
	$(VPY) -m testbed down

clean:
	rm -rf $(VENV) run bench-results
