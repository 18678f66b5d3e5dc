# The two commands of the README: `make run` (the service) and `make test` (the tests).
# Both set up .venv/ from requirements/ on a fresh machine and reuse it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv migrate clean

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

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
