# The two commands of the README: `make run` (the service) and `make test` (the tests).
# Both set up .venv/ from requirements/ on a fresh machine and reuse it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-ml venv migrate clean

$(STAMP): requirements/base.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	touch $(STAMP)

venv: $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

run: $(STAMP)
	$(PY) -m api.run

# Two passes: everything on SQLite, then the PostgreSQL-only cases (statement timeouts, advisory locks)
# with PostgreSQL as the database. Both real Redis and PostgreSQL are expected on 127.0.0.1.
test: $(STAMP)
	$(PY) -m pytest -m "not postgres and not ml" $(PYTEST_ARGS)
	HEAVY_LANES_TEST_ON_POSTGRES=1 $(PY) -m pytest -m postgres $(PYTEST_ARGS)

# The optional sentence-transformers embedder and reranker (requirements/ml.txt, about 6 GB with torch).
test-ml: $(STAMP)
	$(PY) -m pip install -q -r requirements/ml.txt
	$(PY) -m pytest -m ml $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
