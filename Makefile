# Redline — build, test and deploy.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# One version names the images and the chart: the chart's appVersion, its default image tag.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/redline/Chart.yaml)
REGISTRY ?= ghcr.io/redline-dev
IMG ?= $(REGISTRY)/redline:$(VERSION)
SIDECAR_IMG ?= $(REGISTRY)/redline-sidecar:$(VERSION)
# make images writes the image archives here (git-ignored, as bin/ is).
IMAGES_DIR ?= $(LOCALBIN)/images
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
KUSTOMIZE ?= kubectl kustomize
CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
ENVTEST_K8S_VERSION ?= 1.37.2
# Test flags; CI may add -v. Suites share two cores with envtest, so packages run one at a time.
GO_TEST_FLAGS ?= -p 1 -count=1 -timeout 30m

.PHONY: all
all: build

##@ General
.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development
.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests from the markers.
	$(CONTROLLER_GEN) rbac:roleName=redline-manager crd paths="./..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@$(MAKE) --no-print-directory chart-sync

# What the chart takes from config/ (one source of truth): the CRD, the RBAC rules, the
# webhook's rules and the deprecation warnings (a ValidatingAdmissionPolicy), copied byte for
# byte into charts/redline/files/config, which its templates read. test/helm's TestChartInSyncWithConfig fails until this has run after a change in config/.
CHART_SYNC_FILES := crd/bases/redline.dev_ratelimitpolicies.yaml crd/bases/redline.dev_redisbackends.yaml rbac/role.yaml rbac/leader_election_role.yaml webhook/rbac.yaml webhook/manifests.yaml deprecations/ratelimitpolicy.yaml
.PHONY: chart-sync
chart-sync: ## Copy the CRD, RBAC, webhook rules and deprecation warnings of config/ into the Helm chart (charts/redline/files/config).
	@rm -rf charts/redline/files/config
	@for f in $(CHART_SYNC_FILES); do mkdir -p charts/redline/files/config/$$(dirname $$f); cp config/$$f charts/redline/files/config/$$f; done

# Grafana dashboards are Go code (test/helm/dashboards, grafana-foundation-sdk); their JSON is
# checked in for the chart. TestDashboardsGenerated fails until this has run after a change.
.PHONY: dashboards
dashboards: ## Regenerate the chart's Grafana dashboards (charts/redline/dashboards/*.json) from test/helm/dashboards.
	cd test/helm && go run ./cmd/dashboards -out $(CURDIR)/charts/redline/dashboards

# The references of docs/reference are generated from the code (internal/docgen): the API from
# the CRDs, the flags from the flag sets, the annotations and the condition reasons from their
# constants, the metrics from the registries. internal/docgen's TestReferenceIsGenerated fails
# until this has run after a change to any of them.
# The chart README's values table comes from values.yaml's "# --" comments (test/helm's
# TestValuesTable fails until this has run after a change there).
.PHONY: docs
docs: ## Regenerate docs/reference/{api,flags,annotations,metrics,conditions}.md from the code and the values table of charts/redline/README.md.
	go run ./internal/docgen/cmd/docgen -root $(CURDIR)
	cd test/helm && go run ./cmd/valuestable

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## go fmt.
	go fmt ./...

.PHONY: vet
vet: ## go vet (the product module and the modules of hack/bench, hack/ratelimitcompare and test/helm).
	go vet ./...
	cd hack/bench && go vet ./...
	cd hack/ratelimitcompare && go vet ./...
	cd test/helm && go vet ./...
	cd test/cluster && go vet ./...
	cd hack/images && go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint with .golangci.yml (the product module and the modules of hack/bench, hack/ratelimitcompare and test/helm).
	$(GOLANGCI_LINT) run ./...
	cd hack/bench && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	cd hack/ratelimitcompare && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	cd test/helm && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	cd test/cluster && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	cd hack/images && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

.PHONY: envtest
envtest: ## Install etcd, kube-apiserver and kube-controller-manager (downloads, or builds them from Go modules).
	@hack/setup-envtest.sh --with-controller-manager >/dev/null

.PHONY: test
test: manifests generate vet envtest controller-gen ## Run every test: unit, envtest, real-Redis and end-to-end suites, and the Helm chart's (test/helm; needs promtool).
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh --with-controller-manager)" go test $(GO_TEST_FLAGS) -json ./... -coverprofile cover.out | go run ./hack/testtimes -out test-times.md
	$(MAKE) --no-print-directory test-helm
	$(MAKE) --no-print-directory test-cluster
	cd hack/bench && go test $(GO_TEST_FLAGS) ./...
	cd hack/ratelimitcompare && go test $(GO_TEST_FLAGS) ./...

.PHONY: test-cluster
test-cluster: images ## Run only the real-cluster suite (test/cluster): as root, a one-node cluster of this machine (hack/cluster; containerd, runc, CNI plugins, iptables, nftables, conntrack from Debian), the images, the chart, metrics-server and cert-manager (built from Go modules, cached: hack/cluster/addons.sh), real pods.
	@hack/setup-envtest.sh --with-node >/dev/null
	@hack/cluster/addons.sh >/dev/null
	cd test/cluster && IMAGES_DIR=$(IMAGES_DIR) go test $(GO_TEST_FLAGS) ./...

.PHONY: test-helm
test-helm: controller-gen ## Run only the Helm chart's tests (test/helm: lint, golden files, schema, install into envtest, promtool).
	cd test/helm && KUBEBUILDER_ASSETS="$$($(CURDIR)/hack/setup-envtest.sh --with-controller-manager)" CONTROLLER_GEN=$(CONTROLLER_GEN) go test $(GO_TEST_FLAGS) ./...

##@ Build
.PHONY: build
build: generate ## Build the manager, sidecar and kubectl-redline binaries into bin/.
	go build -o $(LOCALBIN)/manager ./cmd/manager
	go build -o $(LOCALBIN)/sidecar ./cmd/sidecar
	go build -o $(LOCALBIN)/kubectl-redline ./cmd/kubectl-redline

.PHONY: run
run: manifests generate ## Run the manager against the cluster of the current kubeconfig (REDIS_URL=redis://...).
	go run ./cmd/manager --redis-url="$${REDIS_URL:-redis://127.0.0.1:6379}"

.PHONY: images
images: ## Build the manager and sidecar images without a daemon (static binaries FROM scratch, user 65532) as archives in bin/images/{manager,sidecar}.tar, tagged IMG and SIDECAR_IMG (the chart's appVersion).
	@rm -rf $(IMAGES_DIR) && mkdir -p $(IMAGES_DIR)/rootfs
	CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o $(IMAGES_DIR)/rootfs/manager ./cmd/manager
	CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o $(IMAGES_DIR)/rootfs/sidecar ./cmd/sidecar
	cd hack/images && go run . -out $(IMAGES_DIR) -label org.opencontainers.image.version=$(VERSION) \
		$(IMG)=$(IMAGES_DIR)/rootfs/manager $(SIDECAR_IMG)=$(IMAGES_DIR)/rootfs/sidecar

.PHONY: release
release: images ## Push the images to REGISTRY (make release REGISTRY=registry.example/team; credentials from the docker config) and the chart, packaged, as an OCI artifact to oci://REGISTRY/charts (credentials from helm registry login).
	cd hack/images && go run . -out $(IMAGES_DIR) -push -label org.opencontainers.image.version=$(VERSION) \
		$(IMG)=$(IMAGES_DIR)/rootfs/manager $(SIDECAR_IMG)=$(IMAGES_DIR)/rootfs/sidecar
	cd test/helm && go run ./cmd/chartpackage -out $(LOCALBIN)/chart -push oci://$(REGISTRY)/charts

.PHONY: chart-package
chart-package: ## Package the chart as helm package does, into bin/chart/redline-<version>.tgz.
	cd test/helm && go run ./cmd/chartpackage -out $(LOCALBIN)/chart

.PHONY: docker-build
docker-build: ## Build the manager and sidecar images (IMG, SIDECAR_IMG); needs a Docker engine.
	docker build --target manager -t $(IMG) .
	docker build --target sidecar -t $(SIDECAR_IMG) .

##@ Deployment
.PHONY: install
install: manifests ## Install the CRD into the cluster of the current kubeconfig.
	$(KUSTOMIZE) config/crd | kubectl apply --server-side -f -

.PHONY: uninstall
uninstall: manifests ## Remove the CRD (and with it every RateLimitPolicy).
	$(KUSTOMIZE) config/crd | kubectl delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests ## Deploy the operator (IMG=..., SIDECAR_IMG=...) into the cluster of the current kubeconfig.
	$(KUSTOMIZE) config/default | sed -e 's|image: redline:latest|image: $(IMG)|' -e 's|--sidecar-image=redline-sidecar:latest|--sidecar-image=$(SIDECAR_IMG)|' | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove the operator.
	$(KUSTOMIZE) config/default | kubectl delete --ignore-not-found -f -

##@ Tools
.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

##@ Demo
DEMO_FLAGS ?=
.PHONY: demo
demo: ## Run Redline end to end on this machine (control plane, Redis, manager, 3 sidecars, Prometheus) in about a minute, into results/demo.{png,md,json}; DEMO_FLAGS=-pause keeps it up.
	go run ./hack/demo $(DEMO_FLAGS)

.PHONY: test-e2e
test-e2e: ## Run only the end-to-end suite (make test runs it too).
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh --with-controller-manager)" go test $(GO_TEST_FLAGS) ./test/e2e/ -v -ginkgo.v

##@ Benchmarks
BENCH_FLAGS ?=
# BENCH_BASE is the revision sidecarcost measures the working tree against (HEAD: what the
# uncommitted changes cost); e.g. make bench BENCH_BASE=v0.3.0.
BENCH_BASE ?= HEAD
.PHONY: bench
bench: ## Benchmark report of this machine into results/ (bench.md, bench.png, bench.json, sidecarcost.md against BENCH_BASE, waitcost.md, budgetcost.md) in about 15 minutes; needs redis-server and redis-benchmark, and wrk for the wrk rows.
	cd hack/bench && go run . -root $(CURDIR) -out $(CURDIR)/results $(BENCH_FLAGS)
	cd hack/bench && go run ./cmd/sidecarcost -root $(CURDIR) -base $(BENCH_BASE) > $(CURDIR)/results/sidecarcost.md
	cd hack/bench && go run ./cmd/waitcost > $(CURDIR)/results/waitcost.md
	cd hack/bench && go run ./cmd/budgetcost -root $(CURDIR) > $(CURDIR)/results/budgetcost.md

ENVOY_RATELIMIT_BIN ?=
COMPARE_FLAGS ?=
.PHONY: compare-envoy
compare-envoy: ## Envoy RLS face vs envoyproxy/ratelimit on one redis-server (ENVOY_RATELIMIT_BIN=path of its built server; see docs/benchmarks.md) into results/compare-envoy.md, about 1 minute.
	@if [ -z "$(ENVOY_RATELIMIT_BIN)" ]; then echo "compare-envoy: set ENVOY_RATELIMIT_BIN to an envoyproxy/ratelimit server binary (go build -o /tmp/ratelimit ./src/service_cmd in a checkout of it; docs/benchmarks.md)" >&2; exit 2; fi
	@if [ ! -x "$(ENVOY_RATELIMIT_BIN)" ]; then echo "compare-envoy: ENVOY_RATELIMIT_BIN=$(ENVOY_RATELIMIT_BIN) is not an executable file" >&2; exit 2; fi
	cd hack/ratelimitcompare && go run . -root $(CURDIR) -envoy-ratelimit "$(abspath $(ENVOY_RATELIMIT_BIN))" -out $(CURDIR)/results/compare-envoy.md $(COMPARE_FLAGS)
