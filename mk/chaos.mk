# The fault suite (issue 8): `make chaos` runs every fault for several rounds under
# load, with the one-million-jobs-in-one-second burst, and prints the checker's table
# (docs/chaos.md). The short fixed-seed version is part of `make test` (tests/chaos/).
.PHONY: chaos chaos-short

chaos: deps
	$(PY) -m tests.chaos.soak $(CHAOS_ARGS)

chaos-short: deps
	$(PY) -m pytest -q -s tests/chaos $(PYTEST_ARGS)
