# buf (from its npm package, pinned in tools/package-lock.json): lint,
# format and breaking checks, and `buf generate` for Go and TypeScript.
# Python keeps its own generator (proto-py, grpc_tools.protoc + mypy-protobuf).
BUF_DEPS := tools/node_modules/.delayq-stamp
BUF := tools/node_modules/.bin/buf
# `buf breaking` compares proto/ with this; override to compare with a tag.
BUF_BREAKING_AGAINST ?= .git\#branch=main,subdir=proto
GEN_GO_DIR := clients/go/delayqv1
GEN_TS_DIR := clients/typescript/src/gen

.PHONY: buf-deps proto-buf proto-go proto-ts buf-check proto-untracked

buf-deps: $(BUF_DEPS)

# npm install, not npm ci: the registry here lacks the other platforms'
# optional buf binaries, which npm ci insists on; the lockfile still pins.
$(BUF_DEPS): tools/package.json tools/package-lock.json | node-toolchain
	cd tools && $(NPM) install --no-audit --no-fund
	@touch $@

proto: proto-buf
proto-go proto-ts: proto-buf

# Stale outputs go first, so a removed .proto leaves no orphan behind.
proto-buf: $(BUF_DEPS) clients/typescript/node_modules/.delayq-stamp go-plugins
	rm -f $(GEN_GO_DIR)/*.pb.go
	rm -rf $(GEN_TS_DIR)
	$(BUF) generate

proto-check: buf-check proto-untracked

buf-check: $(BUF_DEPS)
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(BUF) breaking --against '$(BUF_BREAKING_AGAINST)'

# `git diff` in proto-check misses files that generation newly created.
proto-untracked: proto
	@out="$$(git status --porcelain --untracked-files=all -- $(GEN_GO_DIR) $(GEN_TS_DIR) $(PY_GEN_DIR)/delayq/v1)"; \
	  if [ -n "$$out" ]; then echo "generated code drifted from proto/ (run 'make proto' and commit):" >&2; echo "$$out" >&2; exit 1; fi
