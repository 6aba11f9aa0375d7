#!/usr/bin/env bash
# Build the upstream control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from upstream's Go modules, cached by version outside the checkout.
#
#   hack/k8s/build.sh bin      print the directory holding the binaries, building what is missing
#   hack/k8s/build.sh update   regenerate kube/go.mod and etcd/go.mod (after changing a version)
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

cache=${NODELET_CACHE:-${HOME:-/root}/.cache/nodelet}
bindir="$cache/k8s/$K8S_VERSION-etcd$ETCD_VERSION/bin"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

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
        echo
        echo "replace ("
        staging_replaces
        echo ")"
    } > "$tmp"
    mv "$tmp" "$here/kube/go.mod"
    rm -f "$here/kube/go.sum"
    (cd "$here/kube" && go mod tidy)

    log "regenerating etcd/go.mod for etcd $ETCD_VERSION"
    cat > "$here/etcd/go.mod" <<MOD
module nodelet.local/k8s/etcd

go $K8S_GO

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

tool go.etcd.io/etcd/server/v3
MOD
    rm -f "$here/etcd/go.sum"
    (cd "$here/etcd" && go mod tidy)
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
    for b in "${kube_bins[@]}" etcd; do [[ -x $bindir/$b ]] || missing+=("$b"); done
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
    for b in "${kube_bins[@]}"; do
        [[ -x $bindir/$b ]] && continue
        start=$SECONDS
        log "building $b $K8S_VERSION"
        (cd "$here/kube" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$bindir/$b.tmp" "k8s.io/kubernetes/cmd/$b")
        mv "$bindir/$b.tmp" "$bindir/$b"
        log "$b built in $((SECONDS - start)) s"
    done
}

case ${1:-} in
    bin) build; echo "$bindir" ;;
    update) update ;;
    *) echo "usage: $0 bin|update" >&2; exit 2 ;;
esac
