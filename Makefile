# outboxd: `make demo` and `make test` are the only set-up a user needs.
.DEFAULT_GOAL := help
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers: 3 measured fastest on 2 cores (the suite waits on processes,
# leases and sockets more than it computes; see README "Tests"). `make test WORKERS=1`
# runs it in one process.
WORKERS ?= 3
PYTEST := $(BIN)/pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadgroup

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install outboxd with its test extra

lint: $(STAMP) ## ruff, mypy --strict, and the import contracts (lint-imports)
	$(BIN)/ruff check outbox dispatcher providers tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint ## set up, lint, and run the whole test suite
	$(PYTEST) --durations=15

check: $(STAMP) lint ## the inner loop: lint and every test that starts no daemon process
	$(PYTEST) -m "not slow"

demo: $(STAMP) ## run the whole promise on the embedded SQLite default
	$(BIN)/outboxd demo

demo-langgraph: $(STAMP) ## a LangGraph graph staging, killed, resuming, continuing with the receipt
	$(BIN)/python examples/langgraph/demo.py

bench: $(STAMP) ## side-by-side throughput ratios (needs PostgreSQL); writes docs/bench-latest.md
	$(BIN)/pip install -q 'procrastinate>=3' 'pgqueuer[asyncpg,psycopg]>=1.6,<2'
	$(BIN)/python -m bench --out docs/bench-latest.md

soak: $(STAMP) ## the long seeded chaos soak
	$(BIN)/python -m tests.chaos.soak

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

.PHONY: help install lint test check demo demo-langgraph bench soak clean
