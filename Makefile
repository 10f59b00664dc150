SHELL := /bin/bash
# Tendril build, test and demo entry points. `make demo` and `make test` are
# the README's two set-up commands; both work on a fresh Debian machine.

GO       ?= go
# hack/install-deps.sh (make deps) puts go.mod's Go toolchain here when the
# machine's go is missing or older; first on PATH once it exists.
export PATH := $(or $(TENDRIL_CACHE),$(HOME)/.cache/tendril)/go/bin:$(PATH)
BIN      := $(CURDIR)/bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -X github.com/tendril-net/tendril/pkg/version.Version=$(VERSION) \
            -X github.com/tendril-net/tendril/pkg/version.Commit=$(COMMIT)
COMMANDS := $(notdir $(wildcard cmd/*))
# The files `make generate` writes, and only those (git pathspecs): bpf2go's
# objects and bindings, the C/Go shared enums, the shared-maps test object,
# deepcopy, the clientset/listers/informers and the CRDs. verify-generated
# compares only these, so an edit elsewhere does not fail it.
GENERATED_FILES := ':(glob)pkg/datapath/bpf/*_bpfel.go' ':(glob)pkg/datapath/bpf/*_bpfel.o' \
	pkg/datapath/maps/enums_gen.go pkg/datapath/bpf/testdata/shared_maps.o \
	':(glob)pkg/**/zz_generated*.go' pkg/k8s/client deploy/crds
# Their checksums (tracked and new files; a missing one shows as an error line).
generated_sums = git ls-files -co --exclude-standard -- $(GENERATED_FILES) | sort | xargs -r sha256sum 2>&1

# Time per fuzz target of `make fuzz`; `make fuzz-short` (run by `make test`)
# gives each FUZZTIME_SHORT. The targets are listed in hack/fuzz-targets.txt.
FUZZTIME ?= 10m
FUZZTIME_SHORT ?= 5s

.PHONY: all build deps generate verify-generated verify-helm helm-render helm-crds images lint test test-unit bench-smoke fuzz fuzz-short demo demo-down k8s-binaries coredns hubble clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./cmd/,$(COMMANDS))

deps:
	@hack/install-deps.sh

generate:
	@if [ -x hack/generate-bpf.sh ]; then hack/generate-bpf.sh; fi
	@if [ -x hack/update-codegen.sh ]; then hack/update-codegen.sh; fi
	@$(MAKE) --no-print-directory helm-crds

# Regenerates everything and fails when that changed a generated file: its
# checksums before and after, so unstaged edits (generated or not) of a tree
# whose generated files are current pass.
verify-generated:
	@before=$$($(generated_sums)); \
		$(MAKE) --no-print-directory generate || exit 1; \
		after=$$($(generated_sums)); \
		if [ "$$before" != "$$after" ]; then \
			diff <(echo "$$before") <(echo "$$after") >&2; \
			echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; \
		fi

# The Helm chart (deploy/helm/tendril): its crds/ is a copy of deploy/crds
# (helm reads CRDs only from the chart's own directory), and its rendered
# manifests are committed in deploy/helm/rendered, one file per values set
# (hack/helm-render.sh, with helm from hack/helm.sh). verify-helm, part of
# `make test`, lints the chart and fails when either copy is stale.
HELM_CHART := deploy/helm/tendril
helm-crds:
	@rm -f $(HELM_CHART)/crds/*.yaml && mkdir -p $(HELM_CHART)/crds && cp deploy/crds/*.yaml $(HELM_CHART)/crds/

helm-render: helm-crds
	@hack/helm-render.sh deploy/helm/rendered

verify-helm:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
		hack/helm-render.sh "$$tmp" || exit 1; \
		if ! diff -r deploy/helm/rendered "$$tmp" >&2 || ! diff -r --exclude='*.go' deploy/crds $(HELM_CHART)/crds >&2; then \
			echo "the chart's CRDs or rendered manifests are stale: run 'make helm-render' and commit" >&2; exit 1; \
		fi

# OCI image archives of the agent, operator, relay and lab workload
# (pkg/images, docs/install.md) from static binaries, without a container
# engine, under _output/images; the same sources give the same digests.
# Every timestamp is SOURCE_DATE_EPOCH, else 0.
IMAGES_OUT ?= _output/images
images:
	$(GO) run ./hack/images --out $(IMAGES_OUT) --version $(VERSION) --revision $(COMMIT)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

k8s-binaries:
	@if [ -x hack/k8s-binaries.sh ]; then hack/k8s-binaries.sh; fi

# CoreDNS for the lab's cluster DNS (kube-dns), from the Go module proxy,
# cached beside the Kubernetes binaries (about four minutes the first time).
coredns:
	@hack/coredns.sh >/dev/null

# Everything CI runs: system packages, generated-file check, lint, build,
# Kubernetes binaries (cached outside the repo), then every test including
# the privileged ones (CI=true turns their skips into failures).
# The test binaries are built first two at a time (`-exec /bin/true` builds
# and vets each package's and runs none; its failures show again in the
# run), since -p 1 would also build them one at a time.
# The main run takes one package at a time (-p 1): the privileged packages
# send real traffic under timing (a 100/s ping across restarts and attach
# mode switches, the lab), and keep the measurements they log quiet.
# Packages whose code runs goroutines against shared state: `make test` runs
# them a second time under the race detector.
RACE_PACKAGES := ./pkg/endpointmanager/ ./pkg/endpoint/ ./pkg/policy/... ./pkg/ipcache/... \
	./pkg/identity/... ./pkg/cni/... ./pkg/agent/ ./pkg/lifecycle/ ./pkg/health/ ./pkg/namedns/ \
	./pkg/nodemanager/ ./pkg/agent/nodehealth/ ./pkg/kvstore/ ./pkg/k8s/watchers/ ./pkg/agent/agentk8s/ ./pkg/node/ ./pkg/loadbalancer/... ./pkg/dbinspect/ \
	./pkg/observer/... ./pkg/hubble/ ./pkg/agent/agentflows/ ./pkg/datapath/sockterm/ ./pkg/agent/hostdev/ ./pkg/operator/... ./pkg/agent/epattach/ \
	./pkg/agent/nodes/ ./pkg/reconcile/

test: deps verify-generated verify-helm lint build k8s-binaries coredns
	@echo "==> go test in two lanes side by side (test/e2e, test/e2e/containerd, then fuzz-short; the other packages then the race run and bench-smoke), full log in .test-output.log"
	@tb=$$(date +%s); $(GO) test -count=1 -exec /bin/true ./... > /dev/null 2>&1; \
		t0=$$(date +%s); echo "==> test binaries built in $$((t0-tb)) s$${TENDRIL_CI_START:+, prerequisites $$((tb-TENDRIL_CI_START)) s}"; \
		GO=$(GO) BIN_DIR=$(BIN) RACE_PACKAGES="$(RACE_PACKAGES)" hack/test-lanes.sh $(CURDIR)/.test-output.log; status=$$?; \
		hack/test-summary.sh $(CURDIR)/.test-output.log; \
		if [ $$status -ne 0 ]; then echo "==> failures in detail:"; hack/test-failures.sh $(CURDIR)/.test-output.log | head -600; fi; \
		exit $$status

test-unit:
	$(GO) test -count=1 ./...

# Every fuzz target of hack/fuzz-targets.txt for FUZZTIME each (10m: two
# hours in all); a crasher fails and is left under the package's
# testdata/fuzz/<target>/ to fix and commit as a regression input.
fuzz:
	@hack/fuzz.sh $(FUZZTIME)

# The same for FUZZTIME_SHORT each: part of `make test`, whose log gets its
# output ("--- fuzz <package> <target>: rc=..., execs=..." per target and
# "FAIL fuzz ..." for a failure).
fuzz-short:
	@FUZZ_SHORT=1 hack/fuzz.sh $(FUZZTIME_SHORT)

# Every BenchmarkPrivileged* once (b.N = 1), so the checks inside them run
# in CI, and the kvstore benchmark whose etcd-binary case is published (it
# fails under CI=true when it cannot run). Sub-benchmarks named by a size of
# 10,000 or more (lbmap's 10000- to 100000-services tables) are left out:
# the same checks run at 1,000, and the large tables take minutes even once.
# `make test` runs it after the tests, appended to the same log. Numbers
# from this run mean nothing.
BENCH_SMOKE_PACKAGES := $(sort $(addprefix ./,$(dir $(shell git grep -l 'func BenchmarkPrivileged' -- '*_test.go'))))
bench-smoke:
	@echo "==> bench-smoke: every BenchmarkPrivileged* with -benchtime 1x"
	TENDRIL_BIN_DIR=$(BIN) $(GO) test -p 1 -v -count=1 -run '^$$' -bench '^BenchmarkPrivileged/^([^0-9]|[0-9]{1,4}-)' -benchtime 1x -timeout 20m $(BENCH_SMOKE_PACKAGES)
	$(GO) test -v -count=1 -run '^$$' -bench '^BenchmarkCreateOnly$$' -benchtime 1x -timeout 10m ./pkg/kvstore/

demo: deps build k8s-binaries coredns
	@hack/demo.sh

demo-down:
	@if [ -x hack/demo-down.sh ]; then hack/demo-down.sh; fi

# The stock hubble CLI (cilium v1.18.8), built from the Go module proxy into
# the cache (about four minutes the first time), linked as bin/hubble.
hubble:
	@mkdir -p $(BIN)
	@ln -sf "$$(hack/hubble-cli.sh)" $(BIN)/hubble && echo "bin/hubble -> $$(readlink $(BIN)/hubble)"

clean:
	rm -rf $(BIN) .test-output.log _output
