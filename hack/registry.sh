#!/usr/bin/env bash
# Two private image registries on loopback for the nodelet tests, beside the test bed's
# containerd: one open, one behind htpasswd basic auth. Each has its own config and storage
# under $NODELET_TESTBED/registry; the test bed's locally built images are pushed to them with
# skopeo, and containerd is told (certs.d hosts files) to reach them over plain HTTP.
#
# The registry binary comes from Debian's docker-registry package, unpacked rather than
# installed: installing it would start a system service listening on every interface.
#
#   registry.sh up      start both (idempotent) and push the images
#   registry.sh down    stop both and remove their storage and hosts files
#   registry.sh env     the variables tests read
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TB=${NODELET_TESTBED:-/var/lib/nodelet-testbed}
while [[ $TB == */ && $TB != / ]]; do TB=${TB%/}; done
DIR=$TB/registry
BIN=$DIR/bin/docker-registry
CERTS_DIR=$TB/certs.d
IMAGES=$TB/images
OPEN=127.0.0.1:${NODELET_REGISTRY_PORT:-5811}
AUTH=127.0.0.1:${NODELET_AUTH_REGISTRY_PORT:-5812}
USER_NAME=nodelet

log() { echo "registry: $*" >&2; }
die() { echo "registry: error: $*" >&2; exit 1; }

ensure_binary() {
    [[ -x $BIN ]] && return 0
    log "unpacking docker-registry"
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download docker-registry >/dev/null 2>&1) ||
        { apt-get update -qq && (cd "$tmp" && apt-get download docker-registry >/dev/null); } ||
        die "cannot download the docker-registry package"
    dpkg-deb -x "$tmp"/docker-registry_*.deb "$tmp/root"
    mkdir -p "$DIR/bin"
    install -m 0755 "$tmp/root/usr/bin/docker-registry" "$BIN"
    rm -rf "$tmp"
}

# name addr [auth]
write_config() {
    local name=$1 addr=$2 auth=${3:-}
    mkdir -p "$DIR/$name/data"
    {
        echo "version: 0.1"
        echo "log: {level: warn, accesslog: {disabled: true}}"
        echo "storage: {filesystem: {rootdirectory: $DIR/$name/data}, delete: {enabled: true}}"
        echo "http: {addr: $addr, secret: nodelet-test-$name}"
        if [[ -n $auth ]]; then
            echo "auth: {htpasswd: {realm: nodelet-test, path: $DIR/htpasswd}}"
        fi
    } >"$DIR/$name/config.yml"
    mkdir -p "$CERTS_DIR/$addr"
    cat >"$CERTS_DIR/$addr/hosts.toml" <<EOF
server = "http://$addr"

[host."http://$addr"]
  capabilities = ["pull", "resolve"]
EOF
}

answering() { # addr
    python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen("http://%s/v2/" % sys.argv[1], timeout=2)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 401 else 1)
except Exception:
    sys.exit(1)
PY
}

start() { # name addr
    local name=$1 addr=$2 pidfile=$DIR/$1/pid
    if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && answering "$addr"; then
        return 0
    fi
    answering "$addr" && die "something else already answers on $addr"
    setsid "$BIN" serve "$DIR/$name/config.yml" >"$DIR/$name/log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    for _ in $(seq 1 100); do
        answering "$addr" && { log "$name registry on $addr"; return 0; }
        kill -0 "$(cat "$pidfile")" 2>/dev/null || break
        sleep 0.1
    done
    cat "$DIR/$name/log" >&2 || true
    die "the $name registry did not start on $addr"
}

push() { # archive dest [creds]
    local args=(--insecure-policy copy -q --dest-tls-verify=false)
    [[ -n ${3:-} ]] && args+=(--dest-creds "$3")
    skopeo "${args[@]}" "oci-archive:$1" "docker://$2" >/dev/null
}

cmd_up() {
    command -v skopeo >/dev/null || die "skopeo is missing (make deps)"
    command -v htpasswd >/dev/null || die "htpasswd is missing (make deps)"
    [[ -s $IMAGES/busybox.tar ]] || die "no test images yet: run 'hack/testbed.sh images' first"
    ensure_binary
    mkdir -p "$DIR"
    [[ -s $DIR/password ]] || python3 -c 'import secrets; print(secrets.token_hex(16))' >"$DIR/password"
    htpasswd -Bbc "$DIR/htpasswd" "$USER_NAME" "$(cat "$DIR/password")" 2>/dev/null
    write_config open "$OPEN"
    write_config auth "$AUTH" yes
    start open "$OPEN"
    start auth "$AUTH"
    # A second busybox whose content (and so digest) differs, for re-pushed tags.
    if [[ ! -s $IMAGES/busybox-two.tar || $IMAGES/busybox-two.tar -ot $IMAGES/busybox.tar ]]; then
        python3 "$HERE/mkimage.py" busybox --busybox "${NODELET_BUSYBOX:-/bin/busybox}" \
            --ref localhost/busybox:two --stamp two --out "$IMAGES/busybox-two.tar" >/dev/null
    fi
    push "$IMAGES/busybox.tar" "$OPEN/library/busybox:1"
    push "$IMAGES/busybox-two.tar" "$OPEN/library/busybox:2"
    push "$IMAGES/busybox.tar" "$AUTH/private/busybox:1" "$USER_NAME:$(cat "$DIR/password")"
    log "images pushed: $OPEN/library/busybox:1 $OPEN/library/busybox:2 $AUTH/private/busybox:1"
}

cmd_down() {
    local name pid
    for name in open auth; do
        if [[ -s $DIR/$name/pid ]]; then
            pid=$(cat "$DIR/$name/pid")
            # Only our registry: the pid must still run our binary.
            if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$BIN" ]]; then
                kill "$pid" 2>/dev/null || true
                for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                kill -9 "$pid" 2>/dev/null || true
            fi
        fi
        rm -rf "${DIR:?}/$name"
    done
    rm -rf "${CERTS_DIR:?}/$OPEN" "${CERTS_DIR:?}/$AUTH"
    rm -f "$DIR/htpasswd"
}

cmd_env() {
    echo "NODELET_TEST_REGISTRY=$OPEN"
    echo "NODELET_TEST_AUTH_REGISTRY=$AUTH"
    echo "NODELET_TEST_REGISTRY_USER=$USER_NAME"
    echo "NODELET_TEST_REGISTRY_PASSWORD_FILE=$DIR/password"
    echo "NODELET_TEST_REGISTRY_CERTS=$CERTS_DIR"
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
