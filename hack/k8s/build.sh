#!/usr/bin/env bash
# Build the upstream control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, the kubelet, kubeadm, and the addons kubeadm installs: kube-proxy and
# CoreDNS), Prometheus's text-format parser (kube/promparse, for the metrics tests), and
# upstream's conformance tests (e2e.test, the ginkgo runner, the test image
# programs agnhost and nnp, and the sample device plugin) from upstream's Go modules, cached by
# version outside the checkout.
#
#   hack/k8s/build.sh bin      print the directory holding the control plane, building what is missing
#   hack/k8s/build.sh e2e      the same for the conformance tests (same directory)
#   hack/k8s/build.sh e2e-node the same, and upstream's node e2e suite (e2e_node.test)
#   hack/k8s/build.sh update   regenerate the go.mod files of kube/, etcd/ and coredns/ (after changing a version)
#
# A warm run finds every binary in the cache and builds nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The upstream versions built. After changing one, run `build.sh update` and commit the
# regenerated go.mod/go.sum files.
K8S_VERSION=v1.36.3
# The `go` line k8s.io/kubernetes declares at that version, so the binaries keep its GODEBUG defaults.
K8S_GO=1.26.0
ETCD_VERSION=v3.6.16
# The CoreDNS kubeadm installs at that Kubernetes version (its CoreDNSVersion).
COREDNS_VERSION=v1.14.2

cache=${NODELET_CACHE:-${HOME:-/root}/.cache/nodelet}
bindir="$cache/k8s/$K8S_VERSION-etcd$ETCD_VERSION/bin"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy)
# The conformance tests: binary name and package. e2e.test and e2e_node.test are test
# binaries (`go test -c`).
e2e_test_pkg=k8s.io/kubernetes/test/e2e
e2e_node_pkg=k8s.io/kubernetes/test/e2e_node
e2e_tools=(ginkgo=github.com/onsi/ginkgo/v2/ginkgo agnhost=k8s.io/kubernetes/test/images/agnhost
    nnp=k8s.io/kubernetes/test/images/nonewprivs
    sample-device-plugin=k8s.io/kubernetes/test/images/sample-device-plugin
    dra-test-driver=k8s.io/kubernetes/test/e2e/dra/test-driver)

log() { echo "k8s: $*" >&2; }

# The staging modules k8s.io/kubernetes replaces with ./staging/src, each pinned to the
# staging tag that matches the release (v1.N.P <-> v0.N.P).
staging_replaces() {
    local mod staging=v0.${K8S_VERSION#v1.}
    mod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $mod ]] || { log "cannot find the go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$mod" | while read -r m; do
        echo "	$m => $m $staging"
    done
}

update() {
    local tmp
    log "regenerating kube/go.mod for k8s.io/kubernetes $K8S_VERSION"
    tmp=$(mktemp)
    {
        echo "module nodelet.local/k8s/kube"
        echo
        echo "go $K8S_GO"
        echo
        echo "godebug default=go${K8S_GO%.*}"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        for b in "${kube_bins[@]}"; do echo "tool k8s.io/kubernetes/cmd/$b"; done
        for b in "${e2e_tools[@]}"; do echo "tool ${b#*=}"; done
        echo
        echo "replace ("
        staging_replaces
        echo ")"
    } > "$tmp"
    mv "$tmp" "$here/kube/go.mod"
    rm -f "$here/kube/go.sum"
    # tidy keeps the sums of our tools' imports, not those of a dependency's tests: load the
    # e2e test packages once so go.sum has what `go test -c` needs.
    (cd "$here/kube" && go mod tidy &&
        go list -mod=mod -test -deps "$e2e_test_pkg" "$e2e_node_pkg" >/dev/null)

    log "regenerating etcd/go.mod for etcd $ETCD_VERSION"
    cat > "$here/etcd/go.mod" <<MOD
module nodelet.local/k8s/etcd

go $K8S_GO

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

tool go.etcd.io/etcd/server/v3
MOD
    rm -f "$here/etcd/go.sum"
    (cd "$here/etcd" && go mod tidy)

    log "regenerating coredns/go.mod for CoreDNS $COREDNS_VERSION"
    mkdir -p "$here/coredns"
    cat > "$here/coredns/go.mod" <<MOD
module nodelet.local/k8s/coredns

go $K8S_GO

require github.com/coredns/coredns $COREDNS_VERSION

tool github.com/coredns/coredns
MOD
    rm -f "$here/coredns/go.sum"
    (cd "$here/coredns" && go mod tidy)
}

# Upstream's release builds stamp the version; without it /version says v0.0.0-master.
kube_ldflags() {
    local v=${K8S_VERSION#v} minor
    minor=$(cut -d. -f2 <<<"$v")
    local f="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$f"
}

build() {
    local missing=() b start
    for b in "${kube_bins[@]}" etcd coredns; do [[ -x $bindir/$b ]] || missing+=("$b"); done
    [[ $bindir/promparse -nt $here/kube/promparse/main.go ]] || missing+=(promparse)
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "cached in $bindir"
        return
    fi
    mkdir -p "$bindir"
    export CGO_ENABLED=0 GOFLAGS=-mod=readonly
    if [[ ! -x $bindir/etcd ]]; then
        start=$SECONDS
        log "building etcd $ETCD_VERSION"
        (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bindir/etcd.tmp" go.etcd.io/etcd/server/v3)
        mv "$bindir/etcd.tmp" "$bindir/etcd"
        log "etcd built in $((SECONDS - start)) s"
    fi
    if [[ ! -x $bindir/coredns ]]; then
        start=$SECONDS
        log "building coredns $COREDNS_VERSION"
        (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$bindir/coredns.tmp" github.com/coredns/coredns)
        mv "$bindir/coredns.tmp" "$bindir/coredns"
        log "coredns built in $((SECONDS - start)) s"
    fi
    for b in "${kube_bins[@]}"; do
        [[ -x $bindir/$b ]] && continue
        start=$SECONDS
        log "building $b $K8S_VERSION"
        (cd "$here/kube" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$bindir/$b.tmp" "k8s.io/kubernetes/cmd/$b")
        mv "$bindir/$b.tmp" "$bindir/$b"
        log "$b built in $((SECONDS - start)) s"
    done
    # Prometheus's own text-format parser, for the metrics tests (see kube/promparse): rebuilt
    # when its source changes.
    if [[ ! $bindir/promparse -nt $here/kube/promparse/main.go ]]; then
        (cd "$here/kube" && go build -trimpath -ldflags "-s -w" -o "$bindir/promparse.tmp" ./promparse)
        mv "$bindir/promparse.tmp" "$bindir/promparse"
    fi
}

# One test binary (`go test -c`) of package $2 as $bindir/$1, unless cached.
build_test_binary() {
    local start=$SECONDS
    [[ -x $bindir/$1 ]] && return
    log "building $1 $K8S_VERSION"
    (cd "$here/kube" && go test -c -trimpath -ldflags "$(kube_ldflags)" -o "$bindir/$1.tmp" "$2")
    mv "$bindir/$1.tmp" "$bindir/$1"
    log "$1 built in $((SECONDS - start)) s"
}

# e2e.test, ginkgo, agnhost, nnp (the nonewprivs image's program), the sample device plugin, the
# DRA test driver, nc, nmeter and dra-v1beta1-driver, beside the control plane.
build_e2e() {
    local b name start
    export CGO_ENABLED=0 GOFLAGS=-mod=readonly
    mkdir -p "$bindir"
    build_test_binary e2e.test "$e2e_test_pkg"
    # Our own stand-ins for the test images (see kube/nc, kube/nmeter) and test driver (see
    # kube/dra-v1beta1-driver): rebuilt when their source changes.
    for name in nc nmeter dra-v1beta1-driver; do
        if [[ ! $bindir/$name -nt $here/kube/$name/main.go ]]; then
            (cd "$here/kube" && go build -trimpath -ldflags "-s -w" -o "$bindir/$name.tmp" "./$name")
            mv "$bindir/$name.tmp" "$bindir/$name"
        fi
    done
    for b in "${e2e_tools[@]}"; do
        name=${b%%=*}
        [[ -x $bindir/$name ]] && continue
        start=$SECONDS
        log "building $name"
        (cd "$here/kube" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$bindir/$name.tmp" "${b#*=}")
        mv "$bindir/$name.tmp" "$bindir/$name"
        log "$name built in $((SECONDS - start)) s"
    done
}

case ${1:-} in
    bin) build; echo "$bindir" ;;
    e2e) build_e2e; echo "$bindir" ;;
    e2e-node)
        build_e2e
        build_test_binary e2e_node.test "$e2e_node_pkg"
        echo "$bindir"
        ;;
    update) update ;;
    *) echo "usage: $0 bin|e2e|e2e-node|update" >&2; exit 2 ;;
esac
