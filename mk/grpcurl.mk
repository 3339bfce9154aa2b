# grpcurl, installed with `go install` at a pinned version into .tools/bin,
# exercised against a running server with reflection (tests/xlang).
TOOLS_DIR ?= $(CURDIR)/.tools
TOOLS_BIN ?= $(TOOLS_DIR)/bin
GRPCURL_VERSION := v1.9.3
GRPCURL_STAMP := $(TOOLS_DIR)/stamps/grpcurl@$(GRPCURL_VERSION)
GRPCURL := $(TOOLS_BIN)/grpcurl

TEST_TARGETS += test-grpcurl

.PHONY: grpcurl test-grpcurl

grpcurl: $(GRPCURL_STAMP)

$(GRPCURL_STAMP): | go-toolchain
	GOBIN=$(TOOLS_BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	@mkdir -p $(@D) && touch $@

test-grpcurl: deps go-toolchain $(GRPCURL_STAMP)
	$(PY) scripts/with_server.py -- sh -c 'cd tests/xlang && GRPCURL=$(GRPCURL) $(GO) test -count=1 -v -run Grpcurl ./...'
