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
