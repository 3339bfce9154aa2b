# Cross-language tests (tests/xlang): a Go producer's job consumed by a
# Python worker, a TypeScript producer's job consumed by a Go worker, with
# trace-context headers checked at each hop.
TEST_TARGETS += test-xlang
LINT_TARGETS += lint-xlang

.PHONY: test-xlang lint-xlang

test-xlang: deps go-toolchain ts-build
	$(PY) scripts/with_server.py -- sh -c 'cd tests/xlang && DELAYQ_PYTHON=$(PY) $(GO) test -count=1 -v -run CrossLanguage ./...'

lint-xlang: go-toolchain
	cd tests/xlang && $(GO) vet ./...
	@out="$$(cd tests/xlang && $(dir $(realpath $(GO)))gofmt -l .)"; \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out" >&2; exit 1; fi
