# nodelet: build, test against a private containerd, run.
# The test bed (containerd + CNI + images) lives in $(NODELET_TESTBED); see hack/testbed.sh.

SHELL := /bin/bash

# Cargo's target dir: the caller's CARGO_TARGET_DIR, else a persistent cache
# outside the checkout (so a fresh clone, as in CI, still builds incrementally).
ifeq ($(strip $(CARGO_TARGET_DIR)),)
CARGO_TARGET_DIR := $(or $(HOME),/root)/.cache/nodelet/target
endif
export CARGO_TARGET_DIR
TARGET_DIR := $(CARGO_TARGET_DIR)

NODELET_TESTBED ?= /var/lib/nodelet-testbed
export NODELET_TESTBED

TESTBED := bash hack/testbed.sh

# The upstream control plane's binaries, built from Go modules and cached by version.
K8S_BIN = $(shell bash hack/k8s/build.sh bin)

.PHONY: help deps runtime-up images registries e2e-images control-plane-images runtime-down k8s nextest check unit build test run cluster bootstrap conformance conformance-node bench fuzz clean

help:
	@echo "make deps          install missing Debian packages (containerd, runc, CNI plugins, ...)"
	@echo "make runtime-up    start the private containerd test bed in $(NODELET_TESTBED)"
	@echo "make images        build and import localhost/pause:local and localhost/busybox:local"
	@echo "make registries    start the two loopback image registries (open, basic auth) and push to them"
	@echo "make e2e-images    build upstream's e2e.test and the test images it runs, push them to the open registry"
	@echo "make control-plane-images  the control plane's images for kubeadm, pushed to the open registry"
	@echo "make runtime-down  stop the test bed and its registries, and clean up after them"
	@echo "make k8s           build (once per version) etcd, kube-apiserver, controller manager, scheduler, kubectl"
	@echo "make check         rustfmt, clippy (warnings are errors) and shellcheck"
	@echo "make unit          the unit tests only: no test bed, seconds"
	@echo "make build         cargo build --locked (target dir $(TARGET_DIR))"
	@echo "make test          run the tests against the test bed, then tear it down"
	@echo "make run           run nodelet in the foreground against the test bed"
	@echo "make cluster       a control plane plus one nodelet joined to it, in the foreground"
	@echo "make bootstrap     kubeadm init with nodelet as the node agent, in a machine of its own, in the foreground"
	@echo "make conformance   upstream's node conformance tests against nodelet (long; target/conformance)"
	@echo "make conformance-node  upstream's node e2e suite against a running nodelet node (target/conformance-node)"
	@echo "make bench         pod start-up/teardown vs the runtime floor, and footprint (target/bench; BENCH_ARGS=--full for all of it)"
	@echo "make fuzz          run the cargo-fuzz target over manifest decoding (FUZZ_SECONDS, default 300)"
	@echo "make clean         cargo clean"

deps:
	@bash hack/deps.sh

runtime-up: deps
	@$(TESTBED) up

images: runtime-up
	@$(TESTBED) images

registries: images
	@bash hack/registry.sh up

e2e-images: registries
	@bash hack/k8s/conformance.sh images >/dev/null

control-plane-images: registries k8s
	@bash hack/k8s/bootstrap.sh images

runtime-down:
	@$(TESTBED) down

build:
	cargo build --locked

# Builds the control plane once per version, and puts its kubectl first on PATH in place of
# Debian's much older one.
k8s: deps
	@bash hack/k8s/build.sh bin >/dev/null
	@bin="$(K8S_BIN)"; test -x "$$bin/kubectl" || { echo "k8s: no kubectl in '$$bin'" >&2; exit 1; }; \
	ln -sf "$$bin/kubectl" /usr/local/bin/kubectl

# The suite runs one test per process (tests share nothing); cargo test would not.
nextest:
	@cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest

check: deps
	cargo fmt --check
	cargo clippy --all-targets --locked -- -D warnings
	shellcheck hack/*.sh hack/k8s/*.sh hack/runtime/*.sh

# The unit tests (pure logic; no runtime, no control plane), the test bed's parsers included.
unit: nextest
	cargo nextest run --locked --lib
	python3 -B -m unittest discover -s hack -p 'test_*.py'

# The tests that also run on containerd 1.6 after the whole suite ran on 2.x: those about the
# runtime's own behaviour (CRI calls and features, images, stops and hooks, status, networking,
# cgroups, a runtime restart, user namespaces), so both generations stay supported.
CONTAINERD16_TESTS := test(/^(cri|images|lifecycle|status|network|cgroups|resilience)::|^security::host_users/)

# The whole suite on containerd 2.x, then the subset above on 1.6 (`testbed.sh up` switches the
# generation, keeping the registries). Always tears the test bed down (also after a failure or
# Ctrl-C: the trap only keeps the shell alive), and exits with the tests' status (or, when the
# tests passed, with the tear-down's).
test: deps nextest k8s runtime-up images registries e2e-images control-plane-images
	@set -a; eval "$$($(TESTBED) env)"; set +a; export K8S_BIN="$(K8S_BIN)"; \
	trap : INT TERM; \
	cargo nextest run --locked; \
	status=$$?; \
	echo "make test: the runtime subset on containerd 1.6"; \
	if NODELET_CONTAINERD=1.6 $(TESTBED) up; then \
		set -a; eval "$$($(TESTBED) env)"; set +a; \
		cargo nextest run --locked --test it -E '$(CONTAINERD16_TESTS)' || status=1; \
	else status=1; fi; \
	trap - INT TERM; \
	$(TESTBED) down || { echo "make test: test bed tear-down failed" >&2; [ $$status -ne 0 ] || status=1; }; \
	exit $$status

run: deps runtime-up images build
	$(TARGET_DIR)/debug/nodelet --pod-manifest-path $(CURDIR)/manifests \
		--container-runtime-endpoint unix://$(NODELET_TESTBED)/containerd.sock \
		--root-dir $(NODELET_TESTBED)/kubelet \
		--pod-logs-dir $(NODELET_TESTBED)/pods-logs \
		--container-logs-dir $(NODELET_TESTBED)/containers-logs \
		--hostname-override nodelet-dev --cgroup-root /nodelet-dev

# The control plane lives in $(NODELET_TESTBED)/clusters/dev until `make runtime-down`. The node
# serves kubectl logs/exec on loopback; its static pod is the job (web.yaml uses a ConfigMap,
# which static pods may not in a cluster).
CLUSTER_DIR := $(NODELET_TESTBED)/clusters/dev
cluster: deps k8s runtime-up images build
	@bash hack/k8s/cluster.sh down $(CLUSTER_DIR)
	@bash hack/k8s/cluster.sh up $(CLUSTER_DIR) --controllers
	@bash hack/k8s/cluster.sh node $(CLUSTER_DIR) nodelet-dev >/dev/null
	@echo "cluster: kubectl --kubeconfig $(CLUSTER_DIR)/admin.kubeconfig get nodes,pods -A"
	$(TARGET_DIR)/debug/nodelet --kubeconfig $(CLUSTER_DIR)/nodes/nodelet-dev.kubeconfig \
		--client-ca-file $(CLUSTER_DIR)/pki/ca.crt --node-ip 127.0.0.1 \
		--pod-manifest-path $(CURDIR)/manifests/job.yaml \
		--container-runtime-endpoint unix://$(NODELET_TESTBED)/containerd.sock \
		--root-dir $(NODELET_TESTBED)/kubelet \
		--pod-logs-dir $(NODELET_TESTBED)/pods-logs \
		--container-logs-dir $(NODELET_TESTBED)/containers-logs \
		--hostname-override nodelet-dev --cgroup-root /nodelet-dev

# kubeadm writes the control plane's static pods and nodelet runs them; the machine (its own
# namespaces, containerd and files) lives until Ctrl-C. hack/k8s/bootstrap.sh says how to reach it.
bootstrap: deps k8s runtime-up images registries control-plane-images build
	@bash hack/k8s/bootstrap.sh run

# All of upstream's [NodeConformance] tests and sig-node's [Conformance] tests, against a control
# plane and CONFORMANCE_NODES nodelet nodes; the results land in target/conformance.
CONFORMANCE_NODES ?= 1
conformance: deps k8s runtime-up images registries e2e-images build
	@status=0; bash hack/k8s/conformance.sh run $(CURDIR)/target/conformance $(CONFORMANCE_NODES) || status=$$?; \
	$(TESTBED) down || true; exit $$status

# Upstream's node e2e suite (e2e_node.test): its [NodeConformance] tests against one running
# nodelet node; the results land in target/conformance-node.
conformance-node: deps k8s runtime-up images registries e2e-images build
	@status=0; bash hack/k8s/conformance.sh node $(CURDIR)/target/conformance-node || status=$$?; \
	$(TESTBED) down || true; exit $$status

# BENCH_ARGS passes options to the bench program, e.g. BENCH_ARGS="--pairs 7 --footprint-secs 60";
# "--full" adds cluster mode, the PLEG and kubeadm (about an hour; the default is minutes).
# The kubelet's containerd for the bench: configured as the main bed's, for it alone.
KUBELET_BED = $(NODELET_TESTBED)/beds/bench-kubelet

bench: deps k8s runtime-up images registries control-plane-images
	cargo build --release --locked --bin nodelet
	cargo build --profile bench-driver --locked --example bench
	@status=0; NODELET_TESTBED=$(KUBELET_BED) NODELET_TESTBED_NET=24 $(TESTBED) up && \
	$(TARGET_DIR)/bench-driver/examples/bench \
		--endpoint unix://$(NODELET_TESTBED)/containerd.sock \
		--nodelet $(TARGET_DIR)/release/nodelet --out target/bench \
		--kubelet $(K8S_BIN)/kubelet --kubelet-endpoint unix://$(KUBELET_BED)/containerd.sock \
		$(BENCH_ARGS) || status=$$?; \
	$(TESTBED) down || true; exit $$status

# The test suite runs the same decoding in smoke mode; this runs libFuzzer on it for longer.
FUZZ_SECONDS ?= 300
fuzz:
	@command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
	@mkdir -p fuzz/corpus
	cd fuzz && cargo +nightly fuzz run manifest corpus seeds -- -max_total_time=$(FUZZ_SECONDS)

clean:
	cargo clean
