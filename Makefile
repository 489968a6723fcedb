# obmesh: make help lists the targets.
GO       ?= go
BIN      := bin
PROTOC   ?= protoc
GOBIN    := $(shell $(GO) env GOPATH)/bin
BENCHTIME ?= 2s
# Debian's interpreter: it sees python3-pytest and python3-requests.
PYTHON   ?= /usr/bin/python3
SHELL    := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

.DEFAULT_GOAL := help

.PHONY: help build run test test-short test-hil lint proto bench fuzz fuzz-short clean deps

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/obmesh and bin/obmd
	$(GO) build -o $(BIN)/ ./cmd/...

run: build ## start obmesh dev: a coordinator, an agent and simulated nodes
	./$(BIN)/obmesh dev

deps: ## install the Debian packages the tests use (when missing)
	./scripts/install-deps.sh

test: deps build ## run every test: Go (under the race detector) and the HIL-client suite
	GORACE=halt_on_error=1 $(GO) test -race -count=1 -timeout 20m -json ./... | $(PYTHON) scripts/gotest-report.py
	@$(MAKE) --no-print-directory fuzz-short
	OBMD_BIN=$(CURDIR)/$(BIN)/obmd $(PYTHON) -m pytest -q -p no:cacheprovider tests/hil

test-hil: build ## the HIL-client suite only (Python, Debian's pytest and requests)
	OBMD_BIN=$(CURDIR)/$(BIN)/obmd $(PYTHON) -m pytest -v -p no:cacheprovider tests/hil

test-short: ## unit tests only (skips multi-process tests)
	$(GO) test -short -race ./...

lint: ## gofmt, go vet, go mod tidy check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff

proto: ## regenerate protobuf code (needs protoc; installs the Go generators)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$(GOBIN):$$PATH" $(PROTOC) --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		plugins/sdk/internal/driverpb/driver.proto internal/agentpb/agent.proto \
		coordinator/cluster/clusterpb/cluster.proto

bench: ## run the benchmarks (latency through the whole path vs in-process)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./internal/systemtest/ ./plugins/... ./agent/relay/ ./coordinator/events/

# Fuzz targets as package:Target. Their seed corpora (f.Add and testdata/fuzz)
# run as ordinary tests; make test also fuzzes each for FUZZTIME_SHORT.
FUZZ_TARGETS := ./coordinator/state:FuzzApplyDeterminism ./coordinator/state:FuzzDecode \
	./coordinator/state:FuzzRestore ./coordinator/apiserver:FuzzNativeAPI ./hilproxy:FuzzOBMDAPI
FUZZTIME_SHORT ?= 5s

fuzz: ## fuzz every target for FUZZTIME (default 30s) each
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $${FUZZTIME:-30s}"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $${FUZZTIME:-30s} -parallel 2 $${t%%:*}; \
	done

fuzz-short: ## fuzz every target briefly (FUZZTIME_SHORT, default 5s); part of make test
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME_SHORT)

clean: ## remove build output
	rm -rf $(BIN)
