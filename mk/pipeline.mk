# Data pipeline on Spark (issue 10): pipeline/ (delayq-pipeline), its tests run in
# the default pytest run (tests/pipeline). PySpark needs a Java runtime.
PIPELINE_STAMP := $(VENV)/.pipeline-deps-stamp

.PHONY: java-deps pipeline-deps pipeline-demo bench-pipeline

# Debian's Java 17 runs pyspark 3.5; installed only when missing (like redis-server).
java-deps:
	@if ! command -v java >/dev/null; then \
	  echo "installing openjdk-17-jre-headless (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi

$(PIPELINE_STAMP): pipeline/pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e pipeline
	touch $@

pipeline-deps: java-deps $(PIPELINE_STAMP)

deps: pipeline-deps

# Issue 10's figure: 1,000,000 rows end to end through `delayq-pipeline schedule`
# beside the Python client sending the same rows, same run (.run/bench-pipeline).
bench-pipeline: deps
	$(PY) -m bench.pipeline_throughput $(BENCH_ARGS)

# Generates a dataset, schedules it, works it, exports the events, writes the report
# (.run/pipeline-demo/report/report.html) against a fresh server with --record-events.
pipeline-demo: deps
	rm -rf .run/pipeline-demo
	$(PY) scripts/with_server.py --server-arg=--record-events -- \
	  $(PY) -m delayq_pipeline.demo --out .run/pipeline-demo $(DEMO_ARGS)
