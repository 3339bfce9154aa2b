# Benchmarks (issue 5): delayq side by side with BullMQ (Node, npm) and arq (PyPI).
# `make bench-full` writes bench/results/; `make bench-quick` is the < 2 min CI smoke run
# (checks completion and sanity only, never timing). See bench/README.md.
BENCH_PEERS := bench/peers
# arq pins redis<6 while .venv has redis 8, so arq gets its own venv.
BENCH_ARQ_VENV := $(BENCH_PEERS)/.venv
BENCH_STAMP := $(VENV)/.bench-deps-stamp

.PHONY: bench-deps bench-full bench-quick bench-profile bench-replay bench-auth bench-telemetry

$(BENCH_STAMP): bench/requirements.txt $(STAMP)
	$(PY) -m pip install -q -r bench/requirements.txt
	touch $@

$(BENCH_ARQ_VENV)/.deps-stamp: bench/requirements-arq.txt
	python3 -m venv $(BENCH_ARQ_VENV)
	$(BENCH_ARQ_VENV)/bin/python -m pip install -q -r bench/requirements-arq.txt
	touch $@

$(BENCH_PEERS)/node_modules/.deps-stamp: $(BENCH_PEERS)/package.json $(BENCH_PEERS)/package-lock.json
	@# npm install, not npm ci: npm leaves msgpackr's optional per-platform packages out
	@# of the lock file here, and npm ci then refuses it; install still keeps locked versions.
	cd $(BENCH_PEERS) && npm install --no-audit --no-fund --loglevel=error
	touch $@

bench-deps: deps $(BENCH_STAMP) $(BENCH_ARQ_VENV)/.deps-stamp $(BENCH_PEERS)/node_modules/.deps-stamp

bench-full: bench-deps
	$(PY) -m bench.harness $(BENCH_ARGS)

bench-quick: bench-deps
	$(PY) -m bench.harness --quick $(BENCH_ARGS)

# py-spy of the delayq server and client per scenario -> bench/results/profile/.
bench-profile: bench-deps
	$(PY) -m bench.harness --profile $(BENCH_ARGS)

# Issue 13: enqueue throughput with telemetry off, /metrics on, tracing on (same run).
bench-telemetry: deps
	$(PY) -m bench.telemetry $(BENCH_ARGS)

# Issue 9: enqueue throughput with auth off and on, same run, alternating rounds.
bench-auth: deps
	$(PY) -m bench.auth $(BENCH_ARGS)

TEST_TARGETS += bench-quick

# mypy over bench/ needs matplotlib's stubs, which bench-deps installs.
lint-py: $(BENCH_STAMP)

# Redelivery after a SIGKILLed Worker, with and without its release grace (issue 8).
.PHONY: bench-redelivery
bench-redelivery: deps
	$(PY) -m bench.redelivery $(BENCH_ARGS)

# Redis CPU per script call with and without the lost-reply guard (issue 8).
bench-replay: deps
	$(PY) -m bench.replay_overhead $(BENCH_ARGS)

# Issue 11: big backlogs, lateness with the backlog in place and a burst of jobs due
# at once, on one Redis and on a 3-master cluster (bench/scale.py). The issue's run:
# make bench-scale BENCH_ARGS="--backlogs 10000,1000000,10000000 --burst 1000000"
.PHONY: bench-scale
bench-scale: deps
	$(PY) -m bench.scale --json .run/bench-scale.json $(BENCH_ARGS)

# Issue 12: Redis bytes per delayed job (1 h and 30 d spreads) and where they go, per
# key kind (bench/memory_breakdown.py; --redis-args for another Redis config).
.PHONY: bench-memory
bench-memory: deps
	$(PY) -m bench.memory_breakdown $(BENCH_ARGS)

# Issue 12: unary Enqueue calls/s with --workers 1 and 2, the client on several
# connections (bench/workers_scaling.py).
.PHONY: bench-workers
bench-workers: deps
	$(PY) -m bench.workers_scaling $(BENCH_ARGS)

# Issue 12: server CPU s per 1,000 jobs at 1,000 due jobs/s, with the consumer's lateness
# (bench/timer_cpu.py; BENCH_ARGS="--compare ../other-checkout --rounds 3" for an A/B,
# "--floor" for a bare grpc.aio server's CPU at the same events per s, bench/timer_floor.py).
.PHONY: bench-timers
bench-timers: bench-deps
	$(PY) -m bench.timer_cpu $(BENCH_ARGS)

# Issue 14: redrive and purge of 100,000 jobs through AdminService: jobs/s and
# the slowest Redis command (SLOWLOG) of each (bench/admin.py).
.PHONY: bench-admin
bench-admin: deps
	$(PY) -m bench.admin --json .run/bench-admin.json $(BENCH_ARGS)

# Issue 15: push delivery, callbacks/s to a local receiver and callback lateness.
.PHONY: bench-push
bench-push: deps
	$(PY) -m bench.push $(BENCH_ARGS)

# Issue 12: where a unary Enqueue's time goes (bare grpc.aio servers beside delayq).
.PHONY: bench-unary
bench-unary: deps
	$(PY) -m bench.unary_latency $(BENCH_ARGS)

# Issue 12: Redis time of each enqueue script call (the 2 ms bound) for batches of
# spread, one-delay and rising due times beside a 1M backlog (bench/enqueue_calls.py).
.PHONY: bench-enqueue-calls
bench-enqueue-calls: deps
	$(PY) -m bench.enqueue_calls $(BENCH_ARGS)

# Issue 12: this tree's enqueue.lua against another commit's (BENCH_ARGS="--base REV"),
# in one Redis, taking turns round by round.
.PHONY: bench-enqueue-ab
bench-enqueue-ab: deps
	$(PY) -m bench.enqueue_script_ab $(BENCH_ARGS)

# Issue 12: client CPU per Redis script call through redis-py's pools and QuickPool.
.PHONY: bench-pool
bench-pool: deps
	$(PY) -m bench.redis_pool $(BENCH_ARGS)
