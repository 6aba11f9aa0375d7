#!/usr/bin/env bash
# Build the test bed's current container runtime, containerd 2.x (the daemon, its runc shim and
# ctr) and a runc it fully supports, from their Go modules, cached by version outside the
# checkout. Debian's containerd 1.6 and runc 1.1 remain the older generation (hack/deps.sh).
#
#   hack/runtime/build.sh bin      print the directory holding the binaries, building what is missing
#   hack/runtime/build.sh update   regenerate containerd/go.mod and runc/go.mod (after changing a version)
#
# A warm run finds every binary in the cache and builds nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The upstream versions built. After changing one, run `build.sh update` and commit the
# regenerated go.mod/go.sum files.
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
GO_LINE=1.26.0

cache=${NODELET_CACHE:-${HOME:-/root}/.cache/nodelet}
bindir="$cache/runtime/containerd$CONTAINERD_VERSION-runc$RUNC_VERSION/bin"
containerd_bins=(containerd containerd-shim-runc-v2 ctr)
containerd_mod=github.com/containerd/containerd/v2
runc_mod=github.com/opencontainers/runc

log() { echo "runtime: $*" >&2; }

update() {
    local b
    log "regenerating containerd/go.mod for containerd $CONTAINERD_VERSION"
    {
        printf 'module nodelet.local/runtime/containerd\n\ngo %s\n\nrequire %s %s\n\ntool (\n' \
            "$GO_LINE" "$containerd_mod" "$CONTAINERD_VERSION"
        for b in "${containerd_bins[@]}"; do printf '\t%s/cmd/%s\n' "$containerd_mod" "$b"; done
        printf ')\n'
    } >"$here/containerd/go.mod"
    rm -f "$here/containerd/go.sum"
    (cd "$here/containerd" && go mod tidy)

    log "regenerating runc/go.mod for runc $RUNC_VERSION"
    printf 'module nodelet.local/runtime/runc\n\ngo %s\n\nrequire %s %s\n\ntool %s\n' \
        "$GO_LINE" "$runc_mod" "$RUNC_VERSION" "$runc_mod" >"$here/runc/go.mod"
    rm -f "$here/runc/go.sum"
    (cd "$here/runc" && go mod tidy)
}

build() {
    local b start
    mkdir -p "$bindir"
    export GOFLAGS=-mod=readonly
    for b in "${containerd_bins[@]}"; do
        [[ -x $bindir/$b ]] && continue
        start=$SECONDS
        log "building $b $CONTAINERD_VERSION"
        # Static, without the snapshotters the test bed disables; the shim's shim-level gRPC
        # is unused (it speaks ttrpc).
        local tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
        [[ $b == containerd-shim-runc-v2 ]] && tags+=" no_grpc"
        (cd "$here/containerd" && CGO_ENABLED=0 go build -trimpath -tags "$tags" \
            -ldflags "-s -w -X $containerd_mod/version.Version=$CONTAINERD_VERSION -X $containerd_mod/version.Revision=module" \
            -o "$bindir/$b.tmp" "$containerd_mod/cmd/$b")
        mv "$bindir/$b.tmp" "$bindir/$b"
        log "$b built in $((SECONDS - start)) s"
    done
    if [[ ! -x $bindir/runc ]]; then
        start=$SECONDS
        log "building runc $RUNC_VERSION"
        # runc needs cgo (its namespace setup is C) and libseccomp; libpathrs is left out (it is
        # optional and a Rust library).
        (cd "$here/runc" && CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs" \
            -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=module" \
            -o "$bindir/runc.tmp" "$runc_mod")
        mv "$bindir/runc.tmp" "$bindir/runc"
        log "runc built in $((SECONDS - start)) s"
    fi
}

case ${1:-} in
    bin) build; echo "$bindir" ;;
    update) update ;;
    *) echo "usage: $0 bin|update" >&2; exit 2 ;;
esac
