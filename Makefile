# fencepost — the two commands that matter: `make run` and `make test`.
# Everything they need (venv, Python packages, the local DynamoDB-compatible
# test server) is installed here; nothing is expected to be installed by hand.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=
# `make test` runs the suite in this many processes (pytest-xdist; 1 = one process).
TEST_JOBS ?= 2

.PHONY: run test check generate bench reliability setup clean docs

# First set-up says what it is doing: one line, then pip's own progress when
# the output is a terminal (quiet in CI logs and pipes).
$(STAMP): pyproject.toml constraints.txt
	@echo "fencepost: setting up $(VENV) — installing Python packages from constraints.txt (about a minute, once)"
	$(PYTHON) -m venv $(VENV)
	@if [ -t 1 ]; then \
		$(PIP) install --progress-bar on -c constraints.txt -e '.[dev]'; \
	else \
		$(PIP) install -q -c constraints.txt -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true; \
	fi
	$(PY) -c 'import fencepost, fencepost_server, grpc_tools, moto, aioboto3, hypothesis, opentelemetry.sdk'
	@echo "fencepost: set-up done"
	touch $(STAMP)

setup: $(STAMP)

## Start the server on its embedded default (SQLite under ./.fencepost, 127.0.0.1:50051).
run: setup
	$(VENV)/bin/fencepost serve $(ARGS)

## Regenerate the Python stubs (+ .pyi) and the TypeScript client's src/gen from proto/ (npm ci first).
generate: setup
	PY=$(PY) scripts/generate.sh

## Generated code fresh (Python, TypeScript + tsc), buf lint, buf breaking against the previous commit.
check: setup
	PY=$(PY) scripts/check.sh

## The whole suite (contract on every backend, api, domain, short reliability),
## in TEST_JOBS processes; each starts its own DynamoDB emulator and servers on free ports.
test: check
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist worksteal $(ARGS)

## Benchmarks (never part of `make test`).
bench: setup
	$(PY) -m bench $(ARGS)

## Reliability suite, long profile: faults at every backend call, kill -9
## restarts, history checks; prints a figures table (sqlite + DynamoDB emulator).
## Then the wire fuzz suite's long profile (over 100,000 hostile calls; prints
## calls per RPC and the statuses seen), and 300 random operation sequences
## on DynamoDB against the memory reference (tests/contract/test_cas_model.py).
## Then the load-shaped tests `make test` scales down on the DynamoDB emulator
## (100k-record ReadLog, ...) at their full counts there.
reliability: setup
	FENCEPOST_RELIABILITY=long $(PY) -m pytest -q -p no:cacheprovider tests/reliability tests/fuzz tests/contract/test_cas_model.py $(ARGS)
	FENCEPOST_FULL_SCALE=1 $(PY) -m pytest -q -p no:cacheprovider -m scaled -k dynamodb tests $(ARGS)

clean:
	rm -rf $(VENV) .fencepost .pytest_cache client/typescript/node_modules client/typescript/dist

## Render the API reference (docs/reference.md) from the proto comments.
docs: setup
	$(PY) scripts/proto_docs.py
