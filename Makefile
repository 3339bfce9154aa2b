# delayq: `make run` starts the server (with a managed redis-server when
# DELAYQ_REDIS_URL is unset); `make test` installs what is missing and runs
# every suite. CI calls `make test` through .ci/run.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
STAMP := $(VENV)/.deps-stamp
RUN_STAMP := $(VENV)/.run-deps-stamp
PROTO_FILES := $(wildcard proto/delayq/v1/*.proto)
PY_GEN_DIR := clients/python
# Descriptors with comments (source info) that gRPC reflection serves (reflection.py).
REFLECTION_SET := server/delayq_server/descriptors.binpb

# Suites appended by mk/*.mk fragments (Go, TypeScript, grpcurl, bench ...).
TEST_TARGETS := test-py
LINT_TARGETS := lint-py

.PHONY: help deps system-deps run-deps redis-server-dep run test test-py lint lint-py proto proto-py proto-check check-generated bench bench-lateness clean fuzz

help:
	@echo "make run          start delayq on 127.0.0.1:50051 (managed redis unless DELAYQ_REDIS_URL is set)"
	@echo "make test         install what is missing, start Redis, run every suite"
	@echo "make lint         ruff + mypy --strict"
	@echo "make proto        regenerate code from proto/"
	@echo "make proto-check  fail when generated code drifts from proto/"
	@echo "make bench        benchmarks (see bench/README.md)"
	@echo "make fuzz         long randomized property run against every RPC (FUZZ_EXAMPLES=2000)"

# Debian packages the suites need; installed only when missing.
redis-server-dep:
	@if ! command -v redis-server >/dev/null; then \
	  echo "installing redis-server (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; \
	  systemctl disable --now redis-server >/dev/null 2>&1 || true; \
	fi

system-deps: redis-server-dep
	@if [ ! -x /usr/bin/chromium ]; then \
	  echo "installing chromium (Debian package; the dashboard's browser tests drive it with Playwright)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi
	@if ! command -v gcc >/dev/null; then \
	  echo "installing gcc (builds the durability suite's unsynced-writes shim)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; \
	fi

# What the server needs at run time and nothing else (the Dockerfile runs the
# same commands): pinned dependencies, then the two packages without theirs.
$(RUN_STAMP): server/pyproject.toml clients/python/pyproject.toml scripts/runtime_requirements.py
	python3 -m venv $(VENV)
	python3 scripts/runtime_requirements.py > $(VENV)/runtime-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/runtime-requirements.txt
	$(PY) -m pip install -q --no-deps -e clients/python -e server
	touch $@

# Development and test tools on top (`make test`, `make lint`, `make deps`).
$(STAMP): requirements-dev.txt $(RUN_STAMP)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

deps: system-deps $(STAMP)

run-deps: redis-server-dep $(RUN_STAMP)

# Only the runtime: no development tools, no toolchains (README "Two commands").
run: run-deps
	$(PY) -m delayq_server $(RUN_ARGS)

test: deps
	@$(MAKE) --no-print-directory $(TEST_TARGETS)

test-py: deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

# `make test` runs the property tests small and derandomized; this runs them
# long with fresh randomness and writes status counts per RPC.
FUZZ_EXAMPLES ?= 2000
fuzz: deps
	@mkdir -p .run
	DELAYQ_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DELAYQ_FUZZ_RANDOM=1 DELAYQ_FUZZ_REPORT=.run/fuzz-report.txt \
	  $(PY) -m pytest -q -o timeout=0 tests/security/test_fuzz.py $(PYTEST_ARGS)
	@cat .run/fuzz-report.txt

lint: deps
	@$(MAKE) --no-print-directory $(LINT_TARGETS)

lint-py: deps
	$(PY) -m ruff check server clients/python pipeline tests bench scripts
	$(PY) -m ruff format --check server clients/python pipeline tests bench scripts
	$(PY) -m mypy server/delayq_server clients/python/delayq pipeline/delayq_pipeline tests
	$(PY) -m mypy --explicit-package-bases bench scripts

proto: proto-py

proto-py: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto \
	  --python_out=$(PY_GEN_DIR) --grpc_python_out=$(PY_GEN_DIR) \
	  --plugin=protoc-gen-mypy=$(abspath $(VENV))/bin/protoc-gen-mypy \
	  --plugin=protoc-gen-mypy_grpc=$(abspath $(VENV))/bin/protoc-gen-mypy_grpc \
	  --mypy_out=$(PY_GEN_DIR) --mypy_grpc_out=$(PY_GEN_DIR) \
	  $(PROTO_FILES)
	$(PY) -m grpc_tools.protoc -Iproto --include_imports --include_source_info \
	  --descriptor_set_out=$(REFLECTION_SET) $(PROTO_FILES)

# Regenerates everything and fails when the committed files change.
proto-check: proto
	@git diff --exit-code --stat -- $(PY_GEN_DIR)/delayq/v1 $(REFLECTION_SET) clients/go/delayqv1 clients/typescript/src/gen || (echo "generated code drifted from proto/: run 'make proto' and commit" >&2; exit 1)

# Issue 2's check: ~1,000 jobs/s falling due for 30 s through the real server
# (the harness's delayq lateness scenario alone; results in .run/bench-lateness).
bench-lateness: bench-deps
	$(PY) -m bench.harness --systems delayq --scenarios lateness --lateness-rates 1000 \
	  --lateness-duration 30 --runs 1 --out .run/bench-lateness $(BENCH_ARGS)

bench: bench-full

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .run

-include mk/*.mk
