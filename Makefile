# The two commands of the README: `make run` (the service) and `make test` (the tests).
# Both set up .venv/ from requirements/ on a fresh machine and reuse it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint venv migrate clean bench cluster

$(STAMP): requirements/base.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	touch $(STAMP)

venv: $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

run: $(STAMP)
	$(PY) -m devstack

# Two passes: everything on SQLite, then the PostgreSQL-only cases (statement timeouts, advisory locks)
# with PostgreSQL as the database. Both real Redis and PostgreSQL are expected on 127.0.0.1.
# Each pass runs in TEST_PROCESSES pytest-xdist processes, a test file to a process: most of its time is
# tests waiting on the real workers and servers they start, so two processes halve it on two cores (on
# PostgreSQL each process gets a test database of its own from pytest-django).
# Each pass ends with its slowest tests (--durations), the place to look when the CI run's time grows.
TEST_PROCESSES ?= 2
test: $(STAMP) lint
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile -m "not postgres" --durations=15 $(PYTEST_ARGS)
	HEAVY_LANES_TEST_ON_POSTGRES=1 $(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile -m postgres --durations=5 \
		$(PYTEST_ARGS)

# The house's own checks, run first by `make test`: the style (ruff, pyproject.toml) and the layers
# (import-linter: api over workers over capacity and concepts over common; docs/architecture.md, "Parts").
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Every benchmark in turn (docs/benchmarks.md), each against its own private Redis (and, from submission on,
# its own stack: PostgreSQL database heavy_lanes_bench, gunicorn, lane workers). Results: bench/out/*.json.
# Needs PostgreSQL on 127.0.0.1:5432 (trust auth, user postgres), redis-server and wrk (installed here if root).
bench: $(STAMP)
	@command -v wrk >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then \
		apt-get install -y -q wrk || { apt-get update -q && apt-get install -y -q wrk; }; \
	else echo 'wrk is missing: apt-get install -y wrk (as root)' >&2; exit 1; fi; }
	$(PY) bench/stack.py --with-redis -- $(PY) bench/admission.py --redis '{redis}'
	$(PY) bench/submission.py
	$(PY) bench/roundtrip.py
	$(PY) bench/work.py
	$(PY) bench/sharing.py
	$(PY) bench/waiting.py
	$(PY) bench/saturation.py
	$(PY) bench/retry_after.py
	$(PY) bench/latency.py
	$(PY) bench/quality.py
	$(PY) bench/answer_memory.py
	$(PY) bench/answer_memory.py --case lexical --echo-bytes 67108864
	$(PY) bench/flood.py
	$(PY) bench/flood_cpu.py
	$(PY) bench/cost.py

# The production shape on this machine (cluster/, docs/cluster.md): one network namespace per host, every fault
# of the issue under load, the checks after each; writes docs/cluster.md. Needs root (it installs nginx,
# redis-sentinel and faketime when they are missing) and PostgreSQL's binaries; about 15 minutes.
cluster: $(STAMP)
	@for tool in nginx redis-sentinel faketime; do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then pkgs=$$(echo $$missing | sed 's/nginx/nginx-light/'); \
		apt-get install -y -q $$pkgs || { apt-get update -q && apt-get install -y -q $$pkgs; }; fi
	$(PY) -m cluster

clean:
	rm -rf $(VENV) var
