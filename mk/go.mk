# Go client (clients/go): toolchain, pinned protoc plugins, vet and tests.
# A machine without Go gets one in .tools/go (tools/install-go.sh).
TOOLS_DIR ?= $(CURDIR)/.tools
TOOLS_BIN ?= $(TOOLS_DIR)/bin
GO_BOOTSTRAP_VERSION := 1.26.0
GO := $(or $(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go),$(TOOLS_DIR)/go/bin/go)
# protoc-gen-go must match google.golang.org/protobuf in clients/go/go.mod.
PROTOC_GEN_GO_VERSION := v1.36.11
PROTOC_GEN_GO_GRPC_VERSION := v1.6.1
GO_PLUGINS := $(TOOLS_DIR)/stamps/protoc-gen-go@$(PROTOC_GEN_GO_VERSION) \
              $(TOOLS_DIR)/stamps/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

TEST_TARGETS += test-go
LINT_TARGETS += lint-go

.PHONY: go-toolchain go-plugins test-go lint-go

go-toolchain: $(GO)

$(TOOLS_DIR)/go/bin/go:
	tools/install-go.sh $(GO_BOOTSTRAP_VERSION) $(TOOLS_DIR)/go

go-plugins: $(GO_PLUGINS)

$(TOOLS_DIR)/stamps/protoc-gen-go@%: | go-toolchain
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$*
	@mkdir -p $(@D) && touch $@

$(TOOLS_DIR)/stamps/protoc-gen-go-grpc@%: | go-toolchain
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$*
	@mkdir -p $(@D) && touch $@

# Unit tests (in-process fake) and integration tests (real server, tag
# `integration`) in one run.
test-go: deps go-toolchain
	cd clients/go && $(GO) vet -tags integration ./...
	$(PY) scripts/with_server.py -- sh -c 'cd clients/go && $(GO) test -race -count=1 -tags integration ./...'

lint-go: go-toolchain
	cd clients/go && $(GO) vet -tags integration ./...
	@out="$$(cd clients/go && $(dir $(realpath $(GO)))gofmt -l .)"; \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out" >&2; exit 1; fi
