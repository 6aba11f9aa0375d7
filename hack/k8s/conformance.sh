#!/usr/bin/env bash
# Upstream's own node tests (e2e.test from k8s.io/kubernetes, at the control plane's version)
# against nodelet: a control plane from cluster.sh, nodelet nodes on the test bed's containerd,
# and the test images served from the open loopback registry, so no pull leaves the machine.
#
#   conformance.sh images        build the test images the node tests use and push them to the
#                                open registry (registry.sh up first); prints the repo list file
#   conformance.sh run OUT [N]   a control plane and N nodelet nodes (default 1), then the
#                                [NodeConformance] tests and sig-node's [Conformance] tests;
#                                OUT gets junit_01.xml, e2e.log, the nodes' logs and summary.md.
#                                E2E_FOCUS / E2E_SKIP replace the focus and the skip list, E2E_PROCS
#                                sets the parallel ginkgo processes (default 8), NODELET the binary.
#   conformance.sh node OUT      one nodelet node, then upstream's node e2e suite (e2e_node.test)
#                                against it: its [NodeConformance] tests, with the same skip list
#   conformance.sh summary OUT   (re)write OUT/summary.md from OUT/junit_01.xml
#
# The images are upstream's where upstream builds them from this module (agnhost, nnp) on
# busybox; the others are small stand-ins that behave as the tests expect (see IMAGES below).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hack=$(dirname "$here")
TB=${NODELET_TESTBED:-/var/lib/nodelet-testbed}
while [[ $TB == */ && $TB != / ]]; do TB=${TB%/}; done
REGISTRY=127.0.0.1:${NODELET_REGISTRY_PORT:-5811}
E2E_DIR=$TB/e2e
REPO_LIST=$E2E_DIR/repo-list.yaml
BUSYBOX_BIN=${NODELET_BUSYBOX:-/bin/busybox}
CLUSTER=$TB/clusters/conformance

log() { echo "conformance: $*" >&2; }
die() { echo "conformance: error: $*" >&2; exit 1; }

# What the tests run by default: the node's conformance tests, and the conformance tests of
# sig-node (whose names start with [sig-node]).
FOCUS='\[NodeConformance\]|\[sig-node\].*\[Conformance\]'
# Left out, each for a reason about this test bed (one machine, cgroup v1, no systemd, no
# cloud): pattern <TAB> reason. summary.md lists them with the tests each one left out.
SKIPS=$(cat <<'EOF'
\[Serial\]|\[Disruptive\]	Serial and Disruptive tests need the whole cluster to themselves; they run in their own pass (E2E_FOCUS) rather than beside the parallel ones.
\[Flaky\]	marked flaky upstream; not run by upstream's conformance jobs either.
\[Feature:[^]]*\]	needs an optional feature (feature gates, special hardware or add-ons) this control plane does not turn on.
\[Alpha\]|\[Beta\]	alpha or beta APIs behind feature gates this control plane leaves at their defaults.
\[sig-node\] PrivilegedPod \[NodeConformance\] should enable privileged commands	creates a dummy network link (ip link add dummy1 type dummy); this machine's kernel has no dummy link type (no module to load), so the command fails for any node agent.
\[sig-node\] (ConfigMap|Secrets) should be consumable (via the environment|as environment variable names)	the test bed's busybox (Debian bookworm's 1.35) drops environment variables whose names are not shell identifiers (the tests' keys are data-1, ...) before `env` prints them; upstream's busybox 1.37 image keeps them.
\[sig-node\] Kubelet Cgroup Manager	(node suite) looks for the QoS and pod cgroups under the machine's root cgroup (/kubepods); conformance nodes keep theirs under a cgroup root of their own (--cgroup-root /nodelet-conformance-N), so the test bed leaves the machine's cgroups as it found them.
\[sig-node\] ContainerMetrics	(node suite) requires each container's block I/O (container_blkio_device_usage_total, container_fs_reads_bytes_total and the like); this machine's kernel counts none in cgroup v1's blkio controller, where its controllers are (blkio.throttle.io_service_bytes reads "Total 0", even at the root after direct writes), so no node agent can report them here. Every other family the test checks passes (focused run, 2026-12-07).
\[sig-node\] ContainerLogPath	(node suite) reads the logs from the machine's /var/log/pods and /var/log/containers; conformance nodes write theirs under the test bed (--pod-logs-dir, --container-logs-dir), so the test bed leaves the machine's log directories as it found them.
EOF
)

# ---------------------------------------------------------------- images

# name:tag <TAB> what it stands for. Each is a busybox image (the test bed's static busybox)
# with the additions in image_args.
IMAGES=$(cat <<'EOF'
e2e-test-images/busybox:1.37.0-1	upstream's busybox image: the same busybox applets, and a stand-in for nmeter (the time of day with milliseconds), which Debian's busybox lacks
e2e-test-images/agnhost:2.63.0	agnhost built from this module, on busybox with dash as /bin/sh and stand-ins for curl (plain GETs), netcat (TCP and UDP), nmeter (as in the busybox image) and bash (busybox sh), and the test bed's pause image as its fake registry's pause:testing (upstream: on alpine with bash, curl, netcat, dig, iperf, and registry.k8s.io's pause)
e2e-test-images/agnhost:2.55	the previous agnhost (tests only change a pod's image to it): the same build
e2e-test-images/nonroot:1.5	busybox with USER 1234, as upstream's
e2e-test-images/nonewprivs:1.4	nnp built from this module, setuid root, as upstream's
e2e-test-images/nginx:1.15-4	stand-in: busybox httpd serving on port 80 (tests only need a server that stays up)
e2e-test-images/nginx:1.27-0	stand-in: as nginx:1.15-4
e2e-test-images/glibc-dns-testing:2.0.0	stand-in: busybox sh and hostname (upstream: Debian with dnsutils)
e2e-test-images/kitten:1.8	the agnhost stand-in with upstream's kitten.jpg and data.json at the root, and an /etc/os-release naming Alpine Linux, as its Alpine base has (the image volume test reads both)
pause:3.10.2	the test bed's pause image
EOF
)

# The host's dash as /bin/sh, with the libraries it loads: the test bed's busybox shell runs
# its own applets ahead of PATH (its nc has no UDP), dash finds the stand-ins in /usr/bin.
dash_args() {
    local lib
    echo --add; echo "$(command -v dash):bin/sh:755"
    for lib in $(ldd "$(command -v dash)" | grep -o '/[^ ]*'); do
        echo --add; echo "$(readlink -f "$lib"):${lib#/}:755"
    done
}

# agnhost's fake-registry-server serves the images under /var/registry that upstream's agnhost
# image bakes in (its prepare_registry.sh): here the test bed's pause image as pause:testing,
# laid out as that server reads it (a tag file naming the manifest's digest, and each manifest
# and blob at <kind>/sha256/<first two>/<digest>/data). Prints the mkimage.py arguments.
registry_args() {
    local dir=$E2E_DIR/registry
    rm -rf "$dir"
    python3 - "$TB/images/pause.tar" "$dir" <<'PY'
import json, os, sys, tarfile
archive, out = sys.argv[1], sys.argv[2]
def add(src, dest):
    print("--add")
    print(f"{src}:var/registry/pause/{dest}:644")
with tarfile.open(archive) as t:
    def blob(digest):
        return t.extractfile("blobs/" + digest.replace(":", "/")).read()
    def put(kind, digest):
        algo, hexd = digest.split(":", 1)
        dest = f"{kind}/{algo}/{hexd[:2]}/{hexd}/data"
        path = os.path.join(out, dest)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(blob(digest))
        add(path, dest)
    manifest = json.loads(t.extractfile("index.json").read())["manifests"][0]["digest"]
    put("manifests", manifest)
    parts = json.loads(blob(manifest))
    for digest in [parts["config"]["digest"]] + [l["digest"] for l in parts["layers"]]:
        put("blobs", digest)
tag = os.path.join(out, "manifests", "testing")
with open(tag, "w") as f:
    f.write(manifest + "\n")
add(tag, "manifests/testing")
PY
}

image_args() { # name:tag bin -> mkimage.py busybox arguments
    local path=(--path /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin) dash registry
    case $1 in
        e2e-test-images/busybox:*) ARGS=(--add "$2/nmeter:bin/nmeter:755") ;;
        e2e-test-images/agnhost:*) mapfile -t dash < <(dash_args)
            registry=$(registry_args) || die "cannot lay out the fake registry's pause image"
            mapfile -t registry <<<"$registry"
            ARGS=("${path[@]}" --add "$2/agnhost:agnhost:755" --link agnhost-2:agnhost "${registry[@]}"
            --add "$E2E_DIR/curl:usr/bin/curl:755" --add "$2/nc:usr/bin/nc:755" --add "$2/nmeter:usr/bin/nmeter:755"
            --add "$E2E_DIR/bash:bin/bash:755" "${dash[@]}"
            --add "$AGNHOST_SRC/porter/localhost.crt:localhost.crt:644"
            --add "$AGNHOST_SRC/porter/localhost.key:localhost.key:600"
            --dir uploads --passwd "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh"
            --group "user-defined-in-image:x:1000:" --group "group-defined-in-image:x:50000:user-defined-in-image"
            --entrypoint '["/agnhost"]' --cmd '["pause"]') ;;
        e2e-test-images/nonroot:*) ARGS=("${path[@]}" --user 1234) ;;
        e2e-test-images/nonewprivs:*) ARGS=("${path[@]}" --add "$2/nnp:usr/local/bin/nnp:4755" --cmd '["nnp"]') ;;
        e2e-test-images/nginx:*) ARGS=("${path[@]}" --dir usr/share/nginx/html
            --cmd '["httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"]') ;;
        e2e-test-images/glibc-dns-testing:*) ARGS=("${path[@]}") ;;
        e2e-test-images/kitten:*) image_args e2e-test-images/agnhost: "$2"
            ARGS+=(--add "$AGNHOST_SRC/../kitten/html/kitten.jpg:kitten.jpg:644"
            --add "$AGNHOST_SRC/../kitten/html/data.json:data.json:644"
            --add "$E2E_DIR/os-release:etc/os-release:644" --cmd '["test-webserver"]') ;;
        *) die "no recipe for image $1" ;;
    esac
}

push() { # archive ref
    skopeo --insecure-policy copy -q --dest-tls-verify=false "oci-archive:$1" "docker://$2" >/dev/null
}

# The tests' hooks and dial helpers run `curl [options] URL` in agnhost containers: busybox
# wget does those GETs. Their scripts run under /bin/bash: busybox sh runs them.
write_standins() {
    cat >"$E2E_DIR/curl.tmp" <<'CURL'
#!/bin/sh
# curl stand-in for upstream's e2e tests: GET the one URL, print the body.
url=
while [ $# -gt 0 ]; do
    case $1 in
        -X|-m|--max-time|--connect-timeout|-H|-d|-w|-o) shift ;;
        -*) ;;
        *) url=$1 ;;
    esac
    shift
done
[ -n "$url" ] || { echo "curl: no URL given" >&2; exit 2; }
exec wget -q -O - "$url"
CURL
    mv "$E2E_DIR/curl.tmp" "$E2E_DIR/curl"
    printf '#!/bin/busybox sh\n# bash stand-in for upstream'"'"'s e2e tests: busybox sh.\nexec /bin/busybox sh "$@"\n' >"$E2E_DIR/bash"
    printf '# os-release of the kitten stand-in: upstream'"'"'s image is built on Alpine Linux\nNAME="Alpine Linux"\nID=alpine\n' >"$E2E_DIR/os-release"
}

cmd_images() {
    local bin name ref what archive stamp ARGS
    bin=$(bash "$here/build.sh" e2e)
    mkdir -p "$E2E_DIR"
    write_standins
    AGNHOST_SRC=$(cd "$here/kube" && go list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost)
    [[ -x $BUSYBOX_BIN ]] || die "no static busybox at $BUSYBOX_BIN (package busybox-static)"
    [[ -s $TB/images/pause.tar ]] || die "no pause image yet: run 'hack/testbed.sh images' first"
    mkdir -p "$E2E_DIR/images"
    while IFS=$'\t' read -r name what; do
        ref=$REGISTRY/$name
        archive=$E2E_DIR/images/$(tr '/:' '__' <<<"$name").tar
        if [[ $name == pause:* ]]; then
            archive=$TB/images/pause.tar
        else
            image_args "$name" "$bin"
            stamp=$( { sha256sum "$BUSYBOX_BIN" "$hack/mkimage.py" "$bin/agnhost" "$bin/nnp" "$bin/nc" "$bin/nmeter" "$E2E_DIR/curl" "$E2E_DIR/bash" "$E2E_DIR/os-release" "$TB/images/pause.tar"; echo "$ref ${ARGS[*]}"; } | sha256sum | cut -d' ' -f1)
            if [[ ! -s $archive || $(cat "$archive.stamp" 2>/dev/null) != "$stamp" ]]; then
                log "building $name ($what)"
                python3 "$hack/mkimage.py" busybox --busybox "$BUSYBOX_BIN" --ref "$ref" --out "$archive" "${ARGS[@]}" >/dev/null
                echo "$stamp" >"$archive.stamp"
                # The runtime pulls by tag only when it has none: drop its stale copy.
                timeout 60 "$(bash "$hack/testbed.sh" env | sed -n 's/^NODELET_TEST_CTR=//p')" -a "$TB/containerd.sock" -n k8s.io images rm "$ref" >/dev/null 2>&1 || true
            fi
        fi
        push "$archive" "$ref"
    done <<<"$IMAGES"
    # Every registry upstream's image list names maps to the loopback registry; the invalid
    # one to a closed loopback port, so a test's bad pull fails without leaving the machine.
    cat >"$REPO_LIST.tmp" <<EOF
promoterE2eRegistry: $REGISTRY/e2e-test-images
buildImageRegistry: $REGISTRY/build-image
invalidRegistry: 127.0.0.1:9/invalid
gcEtcdRegistry: $REGISTRY
gcRegistry: $REGISTRY
sigStorageRegistry: $REGISTRY/sig-storage
privateRegistry: $REGISTRY/k8s-authenticated-test
dockerLibraryRegistry: $REGISTRY/library
cloudProviderGcpRegistry: $REGISTRY/cloud-provider-gcp
EOF
    mv "$REPO_LIST.tmp" "$REPO_LIST"
    log "test images pushed to $REGISTRY"
    echo "$REPO_LIST"
}

# ---------------------------------------------------------------- run

NODE_PIDS=()

stop_nodes() {
    local pid
    for pid in "${NODE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${NODE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    NODE_PIDS=()
}

cleanup() {
    stop_nodes
    bash "$here/cluster.sh" down "$CLUSTER" || log "warning: the control plane did not stop cleanly"
}

# A node's address: the test bed bridge's, local but not loopback, since the API server's
# proxy to nodes (nodes/proxy, which upstream's node suite reads /configz through) refuses
# loopback addresses.
start_node() { # out name index
    local out=$1 name=$2 i=$3 kubeconfig dir=$TB/conformance/$2 node_ip
    node_ip=$(bash "$hack/testbed.sh" env | sed -n 's/^NODELET_TEST_NODE_IP=//p')
    kubeconfig=$(bash "$here/cluster.sh" node "$CLUSTER" "$name")
    # The node suite writes static pods here; none survives from an earlier run.
    rm -rf "$dir/manifests"
    mkdir -p "$dir/manifests"
    "$NODELET" --kubeconfig "$kubeconfig" --client-ca-file "$CLUSTER/pki/ca.crt" \
        --node-ip "$node_ip" --hostname-override "$name" \
        --container-runtime-endpoint "unix://$TB/containerd.sock" \
        --root-dir "$dir/root" --pod-logs-dir "$dir/pods" --container-logs-dir "$dir/containers" \
        --pod-manifest-path "$dir/manifests" \
        --cgroup-root "/nodelet-$name" --address "$node_ip" \
        --port $((10250 + 10 * i)) --read-only-port $((10255 + 10 * i)) \
        --healthz-port $((10248 + 10 * i)) >"$out/$name.log" 2>&1 &
    NODE_PIDS+=($!)
}

# A fresh OUT, a control plane and N nodelet nodes, until they are Ready (stopped on exit).
cluster_up() { # out nodes
    local out=$1 nodes=$2 i name
    NODELET=${NODELET:-${CARGO_TARGET_DIR:-$HOME/.cache/nodelet/target}/debug/nodelet}
    [[ -x $NODELET ]] || die "no nodelet binary at $NODELET (make build)"
    [[ -s $REPO_LIST ]] || die "no test images yet: run '$0 images' first"
    rm -rf "$out"
    mkdir -p "$out"
    bash "$here/cluster.sh" down "$CLUSTER"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    bash "$here/cluster.sh" up "$CLUSTER" --controllers
    # shellcheck disable=SC1091
    source "$CLUSTER/env"
    export KUBECONFIG
    for ((i = 0; i < nodes; i++)); do
        name=conformance-$i
        start_node "$out" "$name" "$i"
    done
    for ((i = 0; i < nodes; i++)); do
        until "$BIN/kubectl" wait --for=condition=Ready "node/conformance-$i" --timeout=5s >/dev/null 2>&1; do
            kill -0 "${NODE_PIDS[$i]}" 2>/dev/null || die "node conformance-$i exited; see $out/conformance-$i.log"
        done
    done
    log "$nodes node(s) ready"
}

# The skip list as one pattern.
skip_pattern() {
    local skip='' pattern
    while IFS=$'\t' read -r pattern _; do skip+="${skip:+|}$pattern"; done <<<"$SKIPS"
    echo "$skip"
}

cmd_run() { # out [nodes]
    local out=$1 nodes=${2:-1} bin
    [[ $out == /* ]] || out=$PWD/$out
    bin=$(bash "$here/build.sh" e2e)
    cluster_up "$out" "$nodes"
    run_suite "$out" "$bin" e2e.test \
        --kubeconfig "$KUBECONFIG" --e2e-output-dir "$out" --disable-log-dump --non-blocking-taints ''
}

# Runs upstream test binary $3 of directory $2 under ginkgo with the focus and skip list and
# the arguments after $3, writes OUT/e2e.log and OUT/summary.md, and stops the nodes.
run_suite() { # out bin test-binary args...
    local out=$1 bin=$2 test=$3 start=$SECONDS status
    shift 3
    set +e
    # The repo list also as the environment: test packages that name images in package
    # variables (the node suite's) read it before the flags are parsed.
    KUBE_TEST_REPO_LIST=$REPO_LIST "$bin/ginkgo" --procs="${E2E_PROCS:-8}" --timeout=3h --no-color --succinct \
        --focus="${E2E_FOCUS:-$FOCUS}" --skip="${E2E_SKIP-$(skip_pattern)}" \
        "$bin/$test" -- "$@" --kubectl-path "$BIN/kubectl" --kube-test-repo-list "$REPO_LIST" \
        --report-dir "$out" 2>&1 | tee "$out/e2e.log" | grep -E --line-buffered '^(• \[|Ran |FAIL|PASS|SUCCESS)'
    status=${PIPESTATUS[0]}
    set -e
    log "$test ran for $((SECONDS - start)) s (exit $status)"
    stop_nodes
    cmd_summary "$out"
    return "$status"
}

# The suite reads the node's read-only port on localhost (its own services run the kubelet on
# every address); this node listens on the bridge's, so a relay on loopback stands in, stopped
# with the nodes.
relay_read_only() {
    local node_ip
    node_ip=$(bash "$hack/testbed.sh" env | sed -n 's/^NODELET_TEST_NODE_IP=//p')
    python3 - "$node_ip" <<'PY' &
import socket, sys, threading

target = (sys.argv[1], 10255)
server = socket.create_server(("127.0.0.1", 10255))


def pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


while True:
    client, _ = server.accept()
    try:
        node = socket.create_connection(target)
    except OSError:
        client.close()
        continue
    for a, b in ((client, node), (node, client)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
PY
    NODE_PIDS+=($!)
}

# Upstream's node e2e suite (e2e_node.test) against the running node (--start-services=false):
# one nodelet node, the suite reaching the API server with a cluster-admin service account
# token. The API server runs without the ServiceAccount admission plugin, as the suite's own
# services run it: its tests create pods in new namespaces without waiting for their service
# account.
cmd_node() { # out
    local out=$1 bin token
    [[ $out == /* ]] || out=$PWD/$out
    bin=$(bash "$here/build.sh" e2e-node)
    ENABLE_ADMISSION=NodeRestriction DISABLE_ADMISSION=ServiceAccount cluster_up "$out" 1
    relay_read_only
    "$BIN/kubectl" -n kube-system create serviceaccount e2e-node >/dev/null
    "$BIN/kubectl" create clusterrolebinding e2e-node --clusterrole cluster-admin \
        --serviceaccount kube-system:e2e-node >/dev/null
    token=$("$BIN/kubectl" -n kube-system create token e2e-node --duration 24h)
    run_suite "$out" "$bin" e2e_node.test \
        --start-services=false --prepull-images=false --host "$SERVER" --bearer-token "$token" \
        --node-name conformance-0 --container-runtime-endpoint "unix://$TB/containerd.sock"
}

cmd_summary() { # out
    local out=$1
    [[ -s $out/junit_01.xml ]] || die "no $out/junit_01.xml"
    python3 - "$out" "${E2E_FOCUS:-$FOCUS}" "$SKIPS" <<'PY'
import re, sys, xml.etree.ElementTree as ET
out, focus = sys.argv[1], re.compile(sys.argv[2])
skips = [line.split("\t", 1) for line in sys.argv[3].splitlines() if line.strip()]
passed, failed, skipped = [], [], []
for case in ET.parse(out + "/junit_01.xml").getroot().iter("testcase"):
    name = re.sub(r"^\[It\] ", "", case.get("name", ""))
    if not focus.search(name):
        continue  # not asked for: upstream's other tests
    bad = case.find("failure") if case.find("failure") is not None else case.find("error")
    if bad is not None:
        text = (bad.get("message") or "") + "\n" + (bad.text or "")
        lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("[FAILED] in")]
        failed.append((name, lines[0] if lines else ""))
    elif case.find("skipped") is not None:
        skipped.append((name, (case.find("skipped").get("message") or "").strip()))
    else:
        passed.append(name)

def reason(name, message):
    for pattern, why in skips:
        if re.search(pattern, name):
            return why
    message = re.sub(r"^skipped\s*-?\s*", "", message)
    return message or "skipped by the test itself"

cell = lambda text: text.replace("|", "/").replace("\n", " ")
with open(out + "/summary.md", "w") as f:
    f.write("| result | tests |\n|---|---|\n")
    f.write(f"| passed | {len(passed)} |\n| failed | {len(failed)} |\n| skipped | {len(skipped)} |\n\n")
    if failed:
        f.write("### Failed\n\n| test | first line of the failure |\n|---|---|\n")
        for name, line in sorted(failed):
            f.write(f"| {cell(name)} | {cell(line)[:240]} |\n")
        f.write("\n")
    if skipped:
        reasons = {}
        for name, message in skipped:
            reasons.setdefault(reason(name, message), []).append(name)
        f.write("### Skipped, by reason\n\n| reason | tests |\n|---|---|\n")
        for why, names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            f.write(f"| {cell(why)[:300]} | {len(names)} |\n")
        f.write("\n")
    f.write("### Passed\n\n")
    for name in sorted(passed):
        f.write(f"- {name}\n")
print(f"conformance: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped; see {out}/summary.md", file=sys.stderr)
PY
}

case ${1:-} in
    images) cmd_images ;;
    run) [[ $# -ge 2 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }; cmd_run "$2" "${3:-1}" ;;
    node) [[ $# -eq 2 ]] || exit 2; FOCUS='\[NodeConformance\]'; cmd_node "$2" ;;
    summary) [[ $# -eq 2 ]] || exit 2; cmd_summary "$2" ;;
    *) sed -n '2,20p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
