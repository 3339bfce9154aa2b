# TypeScript client (clients/typescript): npm ci from the committed lockfile,
# tsc --strict, node's test runner against a real server.
TS_DIR := clients/typescript
NPM := $(or $(shell command -v npm 2>/dev/null),/usr/bin/npm)
TS_DEPS := $(TS_DIR)/node_modules/.delayq-stamp
TS_SOURCES = $(shell find $(TS_DIR)/src $(TS_DIR)/test -name '*.ts') $(TS_DIR)/tsconfig.json
TS_BUILD := $(TS_DIR)/dist/.delayq-stamp

TEST_TARGETS += test-ts
LINT_TARGETS += lint-ts

.PHONY: node-toolchain ts-deps ts-build test-ts lint-ts

node-toolchain:
	@tools/install-node.sh

ts-deps: $(TS_DEPS)

$(TS_DEPS): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json | node-toolchain
	cd $(TS_DIR) && $(NPM) ci --no-audit --no-fund
	@touch $@

ts-build: $(TS_BUILD)

$(TS_BUILD): $(TS_DEPS) $(TS_SOURCES)
	rm -rf $(TS_DIR)/dist
	cd $(TS_DIR) && node_modules/.bin/tsc -p tsconfig.json
	@touch $@

test-ts: deps $(TS_BUILD)
	$(PY) scripts/with_server.py -- sh -c 'cd $(TS_DIR) && node --test --test-reporter=spec dist/test/*.test.js'

lint-ts: $(TS_DEPS)
	cd $(TS_DIR) && node_modules/.bin/tsc -p tsconfig.json --noEmit
