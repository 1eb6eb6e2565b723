# hedgerow — build, test and run targets. `make test` does all of its own set-up.
GO      ?= go
BIN     := bin/hedgerow
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build nats-server redis prometheus podman image image-test cluster cluster-down chaos regions regions-down regions-status chaos-regions test lint fuzz simulate demo compare-peers rescue-run bench-path clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hedgerow

# A nats-server for running gateway and worker processes against an external
# cluster, built from the nats-server/v2 module pinned in go.mod (no system package),
# statically linked (CGO off) so it also runs in a scratch image.
nats-server:
	CGO_ENABLED=0 $(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2

# redis-server and redis-cli for the tests that start their own Redis (standalone and
# cluster); installed from Debian's packages when missing.
redis:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then \
		echo "installing redis-server and redis-tools"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server redis-tools >/dev/null; \
	fi

# prometheus and promtool for the test that scrapes a running serve and checks
# deploy/'s alert rules and dashboard queries (deploy/deploy_test.go); installed
# from Debian's package when missing.
prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		echo "installing prometheus"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	fi

# podman, runc and what podman needs here, from Debian's packages when
# missing, and bin/podman/containers.conf, which every podman command of
# this Makefile reads (CONTAINERS_CONF): runc as the runtime (Debian's
# default, crun, refuses hosts that mount cgroup v1 and v2 side by side),
# cgroupfs, events to a file (no systemd needed), and ulimits a container
# may have: podman's default (1048576 open files) is above what an
# unprivileged host or a CI runner allows, and a container's process limit
# above the host's pid_max is refused.
PODMAN_CONF := bin/podman/containers.conf
PODMAN      := CONTAINERS_CONF=$(abspath $(PODMAN_CONF)) podman
podman:
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then \
		echo "installing podman and runc"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq podman runc ca-certificates >/dev/null; \
	fi
	@mkdir -p $(dir $(PODMAN_CONF))
	@nofile=$$(awk '/^Max open files/ {print $$5}' /proc/self/limits); nproc=$$(awk '/^Max processes/ {print $$4}' /proc/self/limits); pidmax=$$(cat /proc/sys/kernel/pid_max); \
	if [ "$$nofile" = unlimited ] || [ "$$nofile" -gt 1048576 ]; then nofile=1048576; fi; \
	if [ "$$nproc" = unlimited ] || [ "$$nproc" -gt "$$pidmax" ]; then nproc=$$pidmax; fi; \
	printf '%s\n' '# Written by make podman (Makefile); podman reads it through CONTAINERS_CONF.' \
		'[containers]' "default_ulimits = [\"nofile=$$nofile:$$nofile\", \"nproc=$$nproc:$$nproc\"]" \
		'[engine]' 'runtime = "runc"' 'cgroup_manager = "cgroupfs"' 'events_logger = "file"' > $(PODMAN_CONF)

# The image, without pulling any: deploy/image/build.sh builds what the
# Dockerfile's build stage would into bin/image/build, and podman builds
# the Dockerfile's final stage, unchanged, with that folder in the stage's
# place (the build context named build; GO_IMAGE=scratch only quiets the
# warning about the unused stage's base). Docker format, so a HEALTHCHECK
# a user adds is kept. IMAGE names it (hedgerow:dev is what
# deploy/k8s/overlays/local and deploy/compose.yaml run). Prints its size
# and build time.
IMAGE     ?= localhost/hedgerow:dev
IMAGE_DIR := bin/image
image: podman
	@start=$$(date +%s); \
	rm -rf $(IMAGE_DIR)/build && GO="$(GO)" sh deploy/image/build.sh $(IMAGE_DIR)/build $(VERSION) && \
	$(PODMAN) build --quiet --format docker --build-context build=$(abspath $(IMAGE_DIR)/build) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--build-arg GO_IMAGE=scratch -t $(IMAGE) . >/dev/null && \
	echo "image $(IMAGE): $$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE)) bytes, built in $$(( $$(date +%s) - start )) s"

# Runs the image as production does (deploy/image/image_test.go, build tag
# image): read-only root file system, the image's user 65532, no
# capabilities, no new privileges; serve in front of two fake routes (the
# image's fakellm) — readiness, a chat completion, a stream, a clean stop
# — then a gateway and a worker against a NATS server of the test's.
# Needs make image first.
image-test: podman
	$(GO) test -tags image -count=1 -timeout 5m ./deploy/image/ \
		-image=$(IMAGE) -podman-conf=$(abspath $(PODMAN_CONF))

# A local, production-shaped cluster from binaries, no containers
# (docs/architecture.md §12): three nats-server nodes (TLS, per-role users,
# JetStream) on 4223-4225, Redis (AOF) on 6380, two gateways on
# 127.0.0.1:8081 and :8082 (pool general, key local-dev-key), two workers
# for three fakellm routes, Prometheus on 9090 with the alert rules. Returns
# once every part is ready; state, logs, credentials and <part>.pid files
# in bin/cluster. `make cluster-down` stops exactly what it started.
CLUSTER_DIR ?= bin/cluster
ALERTS      ?= deploy/prometheus/alerts.yaml
cluster: build nats-server redis prometheus
	$(BIN) cluster up --dir $(CLUSTER_DIR) --nats-server bin/nats-server $(if $(ALERTS),--alerts $(ALERTS))

cluster-down:
	@if [ -x $(BIN) ]; then $(BIN) cluster down --dir $(CLUSTER_DIR); \
	else $(GO) run ./cmd/hedgerow cluster down --dir $(CLUSTER_DIR); fi

# The process-level fault suite against make cluster (brought up if it is
# not), under a steady load: kill -9 a worker mid-stream, kill -9 a gateway
# mid-stream and retry on the other, kill a NATS node and bring it back,
# restart Redis, partition a gateway from Redis. Prints a table per fault.
# Bounded (CHAOS_TIMEOUT); not part of make test.
CHAOS_TIMEOUT ?= 12m
CHAOS_RATE    ?= 25
chaos: cluster-if-down
	$(GO) test -tags chaos -count=1 -timeout $(CHAOS_TIMEOUT) -run '^TestChaos$$' -v ./integration/chaos \
		-chaos.dir=$(abspath $(CLUSTER_DIR)) -chaos.rate=$(CHAOS_RATE)

.PHONY: cluster-if-down
cluster-if-down: build nats-server redis prometheus
	@if ! $(BIN) cluster status --dir $(CLUSTER_DIR) >/dev/null 2>&1; then $(MAKE) --no-print-directory cluster; fi

# Two regions on one host (docs/architecture.md §12, §14), east and west:
# each its own nats-server (JetStream, TLS, the region's users and gateway
# links from nats-auth; clients 4231/4232), Redis (6391/6392), a worker and
# a gateway (east http://127.0.0.1:8281, west :8282, /metrics on the same
# ports; pool general, key local-dev-key), sharing three fakellm routes
# (9211-9213); a tenant rate and the routes' requests held across regions
# as leases. The supercluster link passes through fault proxies
# (7241/7242), delayed LINK_DELAY each way: `bin/hedgerow regions link
# --delay 80ms | --cut | --heal`. Returns once every part is ready; state,
# logs, credentials and the nats-server configurations in bin/regions.
# `make regions-down` stops exactly what it started.
REGIONS_DIR ?= bin/regions
LINK_DELAY  ?= 80ms
regions: build nats-server redis
	$(BIN) regions up --dir $(REGIONS_DIR) --nats-server bin/nats-server --delay $(LINK_DELAY)

regions-down:
	@if [ -x $(BIN) ]; then $(BIN) regions down --dir $(REGIONS_DIR); \
	else $(GO) run ./cmd/hedgerow regions down --dir $(REGIONS_DIR); fi

regions-status:
	@$(BIN) regions status --dir $(REGIONS_DIR)

# Against make regions (brought up if it is not): a steady load skewed
# between the regions (CHAOS_REGIONS_SKEW to east), the link cut for 60 s,
# then one region's Redis restarted. Prints a table per phase (requests,
# failures by kind, budget refusals apart, the lease metrics) and how long
# the shares took to converge after healing. Bounded; not part of make test.
CHAOS_REGIONS_TIMEOUT ?= 8m
CHAOS_REGIONS_RATE    ?= 20
CHAOS_REGIONS_SKEW    ?= 0.8
chaos-regions: regions-if-down
	$(GO) test -tags chaos -count=1 -timeout $(CHAOS_REGIONS_TIMEOUT) -run '^TestChaosRegions$$' -v ./integration/chaos \
		-regions.dir=$(abspath $(REGIONS_DIR)) -regions.rate=$(CHAOS_REGIONS_RATE) -regions.skew=$(CHAOS_REGIONS_SKEW)

.PHONY: regions-if-down
regions-if-down: build nats-server redis
	@if ! $(BIN) regions status --dir $(REGIONS_DIR) >/dev/null 2>&1; then $(MAKE) --no-print-directory regions; fi

# Every package, with the race detector. Bounded: the slowest package must end well inside the timeout.
# The what-if frontier test replays 480,000 simulated groups and the uneven-routes test simulates
# 300,000: too slow under the race detector, so they skip there and run here without it.
# go vet is make lint's (CI runs it first): on an empty build cache it is a whole build of its own.
test: redis prometheus
	$(GO) test -race -count=1 -timeout 10m ./...
	$(GO) test -count=1 -timeout 10m -run '^(TestReplayingAWorkloadsRecordsRecoversItsFrontier|TestUnevenRoutesHaveTeethAndHedgerowHoldsItsCeilings)$$' ./simulator/

# gofmt, go vet and the import rules below; CI (.ci/run) runs it before make test.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./... | awk -v m=$(MODULE) "$$IMPORT_RULES"

# The import rules of docs/architecture.md §3, on every package's own imports
# (tests may import more): dependencies point one way.
MODULE := github.com/hedgerow/hedgerow
define IMPORT_RULES
function under(p, dir) { return p == m "/" dir || index(p, m "/" dir "/") == 1 }
function bad(why) { printf "%s imports %s: %s\n", pkg, imp, why; failed = 1 }
{
	pkg = $$1
	for (i = 2; i <= NF; i++) {
		imp = $$i
		if (pkg == m "/dispatcher" && (imp == "net/http" || under(imp, "frontdoor")))
			bad("the runtime serves no door")
		if (under(pkg, "frontdoor") && (imp == m "/internal/config" || under(imp, "budgets")))
			bad("doors take plain options, not the configuration or the budgets")
		if (!under(pkg, "internal") && !under(pkg, "cmd") && !under(pkg, "integration") && under(imp, "internal"))
			bad("public packages, their test helpers included, take their own options and expose no internal/ type")
		if (pkg == m "/dispatcher/hedge" && imp !~ /^(errors|fmt|time|slices|maps|sort|strconv|strings|math)$$/ && imp != m "/schemas")
			bad("the hedge engine does no I/O")
		if ((under(pkg, "dispatcher") || under(pkg, "budgets") || under(pkg, "arbiter") || under(pkg, "worker") || under(pkg, "schemas")) && under(imp, "simulator"))
			bad("the runtime never imports the simulator")
		if (pkg == m "/arbiter" && (index(imp, "github.com/redis/go-redis/") == 1 || imp == "github.com/nats-io/nats.go/jetstream"))
			bad("the pure arbiter links no gate store: Redis and JetStream are arbiter/sharedgate's")
		if (under(pkg, "schemas") && (under(imp, "dispatcher") || under(imp, "worker") || under(imp, "arbiter") || under(imp, "budgets") || under(imp, "frontdoor")))
			bad("schemas is the bottom of the tree")
	}
}
END { exit failed }
endef
export IMPORT_RULES

# A bounded coverage-guided run of every fuzz target listed in
# scripts/fuzz-targets (14 targets: the front doors' bodies, the provider
# streams, the wire messages, the configuration, the hedge engine), FUZZTIME
# each, one after the other. Budget: 10s a target, about 5 minutes in all
# with the instrumented builds. FUZZ_ONLY=door,stream (groups or target
# names) narrows it, e.g. `make fuzz FUZZTIME=2m FUZZ_ONLY=door,stream`.
# Their seeds run as unit tests in `make test`.
FUZZTIME ?= 10s
FUZZ_ONLY ?=
fuzz:
	GO="$(GO)" FUZZTIME="$(FUZZTIME)" FUZZ_ONLY="$(FUZZ_ONLY)" sh scripts/fuzz.sh

# The main job for now: every strategy on the gpt4o streaming workload and on the
# mixed workload (200,000 requests each, pinned conditions), with a log-scale tail plot of each.
simulate: build
	$(BIN) simulate --workload gpt4o --stream --requests 200000 --seed 1 --plot bin/simulate-gpt4o.png
	@echo
	$(BIN) simulate --workload mixed --requests 200000 --seed 1 --plot bin/simulate-mixed.png
	@echo "plots: bin/simulate-gpt4o.png bin/simulate-mixed.png"

# The main job: the live system (serve, three fake routes, NATS, workers) under a
# Poisson load, once primary-only and once hedged, side by side.
demo: build
	$(BIN) demo

# hedgerow against the hedging libraries a Go team would otherwise use
# (cristalhq/hedgedhttp, failsafe-go's hedgepolicy; test dependencies only) and
# against no hedging, on one live seeded load: three fake routes, 6,000 streaming
# requests per contender interleaved by a seeded shuffle, the peers at the P95
# delay, headers at the first token and then open early. Prints the table.
# PEERS_CONDITIONS: both (those two, the default), first-token, open-early;
# uneven (one route with twice its siblings' stall share and half their decode
# speed, run with it first in the peers' route order — their primary — and then
# last), uneven-first, uneven-last; all (both, then uneven).
# PEERS_ORACLE=true: under uneven routes hedgerow's pool leaves the degraded
# route out — the bound any route choice can reach.
PEERS_REQUESTS ?= 6000
PEERS_WARMUP   ?= 1000
PEERS_RATE     ?= 100
PEERS_SCALE    ?= 0.2
PEERS_SEED     ?= 1
PEERS_SEEDS    ?=
PEERS_CONDITIONS ?= both
PEERS_DELAY    ?= 0
PEERS_DELAY_FROM ?= warm-up
PEERS_ORACLE   ?= false
compare-peers:
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkComparePeers$$' -benchtime 1x -timeout 60m ./integration/peers \
		-peers.requests=$(PEERS_REQUESTS) -peers.warmup=$(PEERS_WARMUP) -peers.rate=$(PEERS_RATE) -peers.scale=$(PEERS_SCALE) \
		-peers.seed=$(PEERS_SEED) -peers.seeds=$(PEERS_SEEDS) -peers.conditions=$(PEERS_CONDITIONS) \
		-peers.delay=$(PEERS_DELAY) -peers.delay-from=$(PEERS_DELAY_FROM) -peers.oracle=$(PEERS_ORACLE)

# The rescue fault run (docs/architecture.md §12): per break mode (cut, error,
# malformed, stall, truncate) three fake routes in process, one breaking every
# stream after its sixth token, and serve with a pool that rescues and one that
# does not; RESCUE_REQUESTS seeded requests a pool (half streaming), every answer
# checked whole, the plain pool's stream_interrupted retried at once as today's
# client does. Prints the table side by side; exits 1 if the rescued pool let a
# stream_interrupted or an invalid answer through. RESCUE_ROUNDS repeats each
# fault on fresh routes and serve and adds the rounds up (the picker avoids a
# route after its first break, so one round meets only a few breaks). A few
# seconds a round; not part of make test.
RESCUE_REQUESTS ?= 20
RESCUE_ROUNDS   ?= 1
RESCUE_SEED     ?= 1
rescue-run:
	$(GO) run ./internal/tools/rescuerun --requests $(RESCUE_REQUESTS) --rounds $(RESCUE_ROUNDS) --seed $(RESCUE_SEED)

# What the whole path costs beside the floor of one bare HTTP hop, in one
# run on this machine (docs/architecture.md §12, "The path's cost"; issue
# 31): fakellm --instant 20, serve with two routes on it (pprof on its
# internal listener) and proxyfloor in front of the same fake, as separate
# processes, plus a slow fake for the cancel race. Prints, with the load
# average at every step: the latency added at 500 requests/s (P50, P99,
# P99.9 and their ratios), the highest open-loop rate each sustains with
# P99 <= 25 ms (answers and streams of 20 tokens), CPU per request of each
# process, the cancel as the provider sees it beside a direct client's, and
# serve's CPU profile at its highest sustained rate (bin/bench-path: the
# profile and report.txt). About 4 minutes; QUICK=1 about a minute and a
# half. Stops every process it started, on failure or Ctrl-C too. Not part
# of make test.
QUICK            ?=
BENCH_PATH_FLAGS ?=
bench-path: build
	$(GO) build -o bin/proxyfloor ./internal/tools/proxyfloor
	$(GO) build -o bin/benchpath ./internal/tools/benchpath
	bin/benchpath --hedgerow $(BIN) --proxyfloor bin/proxyfloor --go $(GO) --out bin/bench-path $(if $(QUICK),--quick) $(BENCH_PATH_FLAGS)

clean:
	rm -rf bin
