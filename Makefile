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

# The version obmesh reports (obmesh version, the API's status): a tag on
# HEAD (v1.2.3 -> 1.2.3, or 1.2.3-4-gabc1234 after it), else the source's
# development version with the commit (0.1.0-dev+gabc1234, .dirty when the
# tree has changes).
ifndef VERSION
VERSION := $(shell v=$$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null) && echo "$${v/v/}" || \
	echo "$$(sed -n 's/^var Version = "\(.*\)"$$/\1/p' coordinator/coordinator.go)+g$$(git describe --always --dirty 2>/dev/null | tr - . || echo unknown)")
endif
# The commit obmesh version reports (12 digits, -dirty with changes).
ifndef COMMIT
COMMIT := $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || c=$$c-dirty; echo $$c; })
endif
LDFLAGS  := -X github.com/obmesh/obmesh/coordinator.Version=$(VERSION) -X github.com/obmesh/obmesh/cmd/obmesh/daemon.Commit=$(COMMIT)

# make install: where things go (DESTDIR is prepended to all of them).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DOCDIR     ?= $(PREFIX)/share/doc/obmesh
# make package: the staging tree, the output directory and nfpm.
PKGROOT    ?= build/pkgroot
DIST       ?= dist
NFPM       ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2

.DEFAULT_GOAL := help

.PHONY: install package print-version print-commit help build run test test-short test-hil lint proto bench fuzz fuzz-short clean deps mutate mutate-ci

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/obmesh and bin/obmd
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

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
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./tests/systemtest/ ./plugins/... ./agent/relay/ ./coordinator/events/ ./agent/powersync/ ./coordinator/observe/ ./tests/bmcsim/ ./coordinator/ops/

# Fuzz targets as package:Target. Their seed corpora (f.Add and testdata/fuzz)
# run as ordinary tests; make test also fuzzes each for FUZZTIME_SHORT.
FUZZ_TARGETS := ./coordinator/state:FuzzApplyDeterminism ./coordinator/state:FuzzDecode \
	./coordinator/state:FuzzRestore ./coordinator/apiserver:FuzzNativeAPI ./hilproxy:FuzzOBMDAPI
# A count, not a duration: a duration that ran out while the engine still
# gathered its baseline coverage failed with "context deadline exceeded".
FUZZTIME_SHORT ?= 2000x

fuzz: ## fuzz every target for FUZZTIME (default 30s) each
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $${FUZZTIME:-30s}"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $${FUZZTIME:-30s} -parallel 2 $${t%%:*}; \
	done

fuzz-short: ## fuzz every target briefly (FUZZTIME_SHORT, default 2000 inputs); part of make test
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME_SHORT)

install: build ## install binaries, systemd units, completions, the man page, docs and example configs into DESTDIR/PREFIX (default /usr/local)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(DOCDIR)/examples \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/vendor-completions \
		$(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 $(BIN)/obmesh $(BIN)/obmd $(DESTDIR)$(BINDIR)/
	for u in packaging/systemd/*.service.in; do \
		out=$(DESTDIR)$(UNITDIR)/$$(basename $$u .in); \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' $$u > $$out; \
		chmod 0644 $$out; \
	done
	install -m 0644 packaging/sysusers.d/obmesh.conf $(DESTDIR)$(PREFIX)/lib/sysusers.d/obmesh.conf
	install -m 0644 configs/*.toml $(DESTDIR)$(DOCDIR)/examples/
	install -m 0644 README.md CHANGELOG.md docs/*.md $(DESTDIR)$(DOCDIR)/
	GOOS= GOARCH= $(GO) run ./cmd/obmesh completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/obmesh
	GOOS= GOARCH= $(GO) run ./cmd/obmesh completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/vendor-completions/_obmesh
	GOOS= GOARCH= $(GO) run -ldflags '$(LDFLAGS)' ./cmd/obmesh man | gzip -n -9 > $(DESTDIR)$(PREFIX)/share/man/man1/obmesh.1.gz
	chmod 0644 $(DESTDIR)$(PREFIX)/share/bash-completion/completions/obmesh $(DESTDIR)$(PREFIX)/share/zsh/vendor-completions/_obmesh \
		$(DESTDIR)$(PREFIX)/share/man/man1/obmesh.1.gz

print-version: ## print the version make build, install and package stamp
	@echo $(VERSION)

print-commit: ## print the commit make build, install and package stamp
	@echo $(COMMIT)

package: ## build dist/obmesh_VERSION_ARCH.deb (DIST) with nfpm v2.45.2 (go run: network only to the Go module proxy)
	rm -rf $(PKGROOT)
	$(MAKE) --no-print-directory install DESTDIR=$(abspath $(PKGROOT)) PREFIX=/usr SYSCONFDIR=/etc VERSION=$(VERSION)
	mkdir -p $(DIST)
	VERSION=$(VERSION) ARCH=$$($(GO) env GOARCH) PKGROOT=$(abspath $(PKGROOT)) $(NFPM) package --config packaging/nfpm.yaml --packager deb --target $(DIST)/

# Mutation testing (gremlins v0.6.0, installed into bin/tools): each package
# with its own -short tests. docs/testing.md has the table and the mutants
# judged equivalent.
MUTATE_PKGS ?=
MUTATE_CI_PKGS ?= coordinator/seal hilproxy
MUTATE_FLOOR ?= 85:85
MUTATE_BUDGET ?= 420

mutate: ## mutation testing of the core packages; table in bin/mutate/table.md
	./scripts/mutate.sh -u $(MUTATE_PKGS)

mutate-ci: ## CI's mutation check: a few fast packages, a score floor and a time budget
	MUTATE_WORKERS=2 ./scripts/mutate.sh -o $(BIN)/mutate-ci -f $(MUTATE_FLOOR) -b $(MUTATE_BUDGET) $(MUTATE_CI_PKGS)

clean: ## remove build output
	rm -rf $(BIN) build $(DIST)
