# orderpipe — the two commands are `make run` and `make test`.
SHELL := /bin/bash
GO ?= go
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(shell $(GO) env GOPATH)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
# Fuzz targets run FUZZTIME each in `make test`; `make fuzz FUZZTIME=5m` (or 5000000x) for longer.
# The default is a count, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-bounded run with a spurious "context deadline exceeded" at the end
# (golang/go#75804, fixed in Go 1.27); a count-bounded run has no deadline.
FUZZTIME ?= 30000x
FUZZ_TARGETS := $(shell grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u)

.PHONY: run test build postgres-binaries promtool alert-rules check-fmt vet lint unit fuzz chaos chaos-short clean

## run: install what is missing, then start the whole pipeline locally (orderpipe dev)
# As root, PostgreSQL runs as the postgres account, which must reach the data
# dir; a checkout in a private home (/root is 0700) keeps dev's data in
# /var/lib/orderpipe-dev instead, unless ORDERPIPE_DATA_DIR says otherwise.
run: postgres-binaries build
	@data="$${ORDERPIPE_DATA_DIR:-}"; \
	if [ -z "$$data" ]; then data=.data; \
	  if [ "$$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$(CURDIR)" 2>/dev/null; then \
	    data=/var/lib/orderpipe-dev; \
	    echo "note: the postgres account cannot reach $(CURDIR); dev keeps its data in $$data (set ORDERPIPE_DATA_DIR to choose)"; \
	  fi; fi; \
	exec env ORDERPIPE_DATA_DIR="$$data" ./bin/orderpipe dev

## test: gofmt, go vet, the pinned linter, the whole suite with -race (real servers), short fuzzing
test: postgres-binaries check-fmt vet lint alert-rules unit fuzz chaos-short

build:
	$(GO) build -o bin/orderpipe .

# PostgreSQL's server binaries come from the machine's Debian packages.
postgres-binaries:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi; \
	echo "PostgreSQL server binaries are missing; installing Debian's postgresql package"; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	  echo "Please install them first: sudo apt-get install -y postgresql" >&2; exit 1; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q postgresql

# promtool comes from Debian's prometheus package.
promtool:
	@if command -v promtool >/dev/null 2>&1; then exit 0; fi; \
	echo "promtool is missing; installing Debian's prometheus package"; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	  echo "Please install it first: sudo apt-get install -y --no-install-recommends prometheus" >&2; exit 1; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends prometheus

alert-rules: promtool
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

check-fmt:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

$(GOLANGCI_LINT):
	GOFLAGS= $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	cp $(shell $(GO) env GOPATH)/bin/golangci-lint $@

lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

unit:
	$(GO) test -race -count=1 -timeout 12m ./...

## chaos: the randomized fault checker on a 3-node NATS cluster (CHAOS_TIME=30m, CHAOS_SEED=… to replay)
# Both variables are read by `orderpipe chaos` itself.
chaos: postgres-binaries build
	./bin/orderpipe chaos

# The short run of `make test`: about 60s of faults, then the checks.
chaos-short: postgres-binaries build
	CHAOS_TIME=$${CHAOS_SHORT_TIME:-60s} ./bin/orderpipe chaos --quiesce 4m

fuzz:
	@set -e; for dir in $(FUZZ_TARGETS); do \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go | cut -c6-); do \
	    echo "fuzz $$dir $$f ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$dir; \
	  done; done

clean:
	rm -rf bin
