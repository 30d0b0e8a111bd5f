GO ?= $(shell command -v go || echo /usr/local/go/bin/go)

.PHONY: build test race bench bench-peers fuzz demo vet staticcheck clean

build:
	$(GO) build -o bin/ptfs ./cmd/ptfs

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

# staticcheck at a pinned version, fetched by the module proxy.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck:
	$(GO) run $(STATICCHECK) ./...

# The whole suite: unit, corpus conformance, libipt differential, and the
# end-to-end tests on real FUSE mounts and uprobes (needs root); then the
# race detector on the packages whose code or tests run goroutines. With
# CI set, a test that lacks its environment fails instead of skipping.
test: vet staticcheck
	$(GO) test -count=1 -timeout 30m ./...
	$(MAKE) race

RACE_PKGS ?= ./perfio/... ./engine/... ./live/... ./session/... ./stream/... ./fs/... ./bind/... ./tracefs/... ./decode/... ./probes/... ./cmd/ptfs/...
race:
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)

# Benchmarks with their references measured in the same run.
bench:
	$(GO) test -run '^$$' -bench 'Packets|Records|Libipt' -benchmem -benchtime 3x ./decode
	$(GO) test -run '^$$' -bench AppendRecord -benchmem ./decode
	$(GO) test -run '^$$' -bench 'Flow|LibiptBlock|Libxdc' -benchmem -benchtime 10x ./flow
	$(GO) test -run '^$$' -bench . -benchmem ./stream ./perfio ./engine
	$(GO) test -run '^$$' -bench Live -benchtime 5x ./live
	$(GO) test -run '^$$' -bench Route -benchmem ./live
	$(GO) test -run '^$$' -bench Overhead -benchtime 200000x ./cmd/ptfs
	$(GO) test -run '^$$' -bench StreamLoad -benchtime 1000000x ./cmd/ptfs
	$(GO) test -run '^$$' -bench ProbeCost -benchtime 200000x ./cmd/ptfs

# ptfs beside bpftrace and perf on one probe workload (N hits; needs root,
# and the peers' packages: README "Performance"). Missing tools are skipped.
N ?= 1000000
bench-peers:
	./scripts/bench-peers.sh $(N)

# Each fuzz target for a short time (FUZZTIME, 20s unless given); scripts/fuzz.sh says
# how it tells a finding from Go 1.26's end-of-time race.
FUZZTIME ?= 20s
fuzz:
	GO=$(GO) ./scripts/fuzz.sh $(FUZZTIME)

demo: build
	./scripts/demo.sh

clean:
	rm -rf bin
