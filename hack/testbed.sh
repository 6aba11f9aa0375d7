#!/usr/bin/env bash
# The nodelet test bed: a private containerd (CRI) with its own CNI network.
#
#   testbed.sh up       start it (idempotent; clears the debris of a killed run first)
#   testbed.sh images   build and import localhost/pause:local and localhost/busybox:local
#   testbed.sh down     remove every pod/container, stop it, leave the machine as it was
#   testbed.sh env      print the variables the tests need
#   testbed.sh restart  kill containerd and start it again on the same state (a fault test)
#
# Everything lives under $NODELET_TESTBED (default /var/lib/nodelet-testbed).
# A test that needs a containerd of its own (a second node) starts another test bed in
# $NODELET_TESTBED/beds/NAME with NODELET_TESTBED_NET=N (1-30): its own network nodelet-testbed-N,
# bridge nodeletN and subnet 10.(213+N).0.0/16. `down` of the main test bed takes those down too.
# NODELET_CONTAINERD picks the runtime generation at `up`: 2 (the default: containerd 2.x and
# runc built by hack/runtime/build.sh) or 1.6 (Debian's containerd and runc). Each keeps its own
# content store; the other commands act on the generation the test bed was started with.
# It never touches a system containerd: only our socket, our dir, our bridge
# and the iptables rules CNI made for our network.
#
# This file holds the commands and containerd's lifecycle; testbed-cleanup.sh clears what
# containers and killed runs leave behind, with testbed.py for the files it must parse.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# runc, ip and iptables live in sbin; containerd and the CNI plugins inherit this
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin ;; esac
case ":$PATH:" in *:/sbin:*) ;; *) PATH=$PATH:/sbin ;; esac
export PATH

TB=${NODELET_TESTBED:-/var/lib/nodelet-testbed}
while [[ $TB == */ && $TB != / ]]; do TB=${TB%/}; done

SOCK=$TB/containerd.sock
TTRPC_SOCK=$TB/containerd.sock.ttrpc
CONFIG=$TB/config.toml
MAINT_CONFIG=$TB/config-maintenance.toml
PIDFILE=$TB/containerd.pid
LOG=$TB/containerd.log
DIRTY=$TB/dirty                      # exists from `up` until a complete `down`
GENERATION_FILE=$TB/containerd-generation # the generation of the running test bed
STATE=$TB/state                      # like /run/containerd: wiped by `down`
CDI_DIR=$STATE/cdi                   # DRA drivers' CDI specs (like /var/run/cdi)
RUNC_ROOT=$TB/runc                   # runc state of CRI containers
RUNC_V1_ROOT=$TB/runc-v1
RUNC_ALT_ROOT=$TB/runc-alt           # runc state of the second runtime handler's containers
ALT_HANDLER=runc-alt                 # the second runtime handler, for RuntimeClass tests
OPT=$TB/opt
CNI_CONF_DIR=$TB/cni/net.d
IPAM_DIR=$TB/cni/ipam
CERTS_DIR=$TB/certs.d
IMAGES=$TB/images
MARKS=$TB/marks                      # what the machine looked like before our first `up`
CGROUP_LIST=$TB/cgroups.list         # cgroup paths of our containers still to remove

NET=${NODELET_TESTBED_NET:-0}
[[ $NET =~ ^([0-9]|[12][0-9]|30)$ ]] || { echo "testbed: error: NODELET_TESTBED_NET must be 0-30 (got '$NET')" >&2; exit 1; }
NET_NAME=nodelet-testbed
(( NET == 0 )) || NET_NAME=nodelet-testbed-$NET
BRIDGE=nodelet$NET
SUBNET=10.$((213 + NET)).0.0/16
GATEWAY=10.$((213 + NET)).0.1        # the bridge's own address (the CNI bridge plugin's gateway)
BEDS=$TB/beds                        # the test beds of other nodes (NET > 0), each in a dir
CRI_NS=k8s.io
PAUSE_REF=localhost/pause:local
BUSYBOX_REF=localhost/busybox:local
BUSYBOX_BIN=${NODELET_BUSYBOX:-/bin/busybox}
DEFAULT_RUNC_ROOT=/run/containerd/runc # runc root of containers made without runtime options

log() { echo "testbed: $*" >&2; }
die() { echo "testbed: error: $*" >&2; exit 1; }

# teardown and its helpers, which `up` and `down` run
# shellcheck source-path=SCRIPTDIR source=testbed-cleanup.sh
source "$HERE/testbed-cleanup.sh"

# The runtime generation's binaries and paths: GENERATION (2 or 1.6), CONTAINERD, CTR, RUNC,
# SHIM (the runc shim, for 2.x), ROOT (content store, snapshots, metadata: kept by `down`) and
# SHIM_SOCKET_DIR. `up` takes NODELET_CONTAINERD; the other commands the recorded generation.
select_generation() { # generation
    GENERATION=$1
    case $GENERATION in
        2)
            local bin
            bin=$(bash "$HERE/runtime/build.sh" bin) || die "cannot build containerd 2.x (hack/runtime/build.sh)"
            CONTAINERD=$bin/containerd CTR=$bin/ctr RUNC=$bin/runc SHIM=$bin/containerd-shim-runc-v2
            ROOT=$TB/root-2
            # 2.x takes the shims' socket dir from its config (at most 42 bytes): one per test bed
            SHIM_SOCKET_DIR=/run/nodelet-testbed/$(printf '%s' "$TB" | sha256sum | cut -c1-16)
            ;;
        1.6)
            CONTAINERD=containerd CTR=ctr RUNC=runc SHIM=
            ROOT=$TB/root
            SHIM_SOCKET_DIR=/run/containerd/s    # where containerd 1.6 shims put their sockets
            ;;
        *) die "NODELET_CONTAINERD must be 2 or 1.6 (got '$GENERATION')" ;;
    esac
}

recorded_generation() {
    local g
    g=$(cat "$GENERATION_FILE" 2>/dev/null || true)
    echo "${g:-${NODELET_CONTAINERD:-2}}"
}

check_paths() {
    [[ $TB == /* ]] || die "NODELET_TESTBED must be an absolute path (got '$TB')"
    case $TB in
        / | /run | /run/* | /var/run/* | /var/lib/containerd | /var/lib/containerd/* | /etc | /etc/* | /usr | /usr/* | /proc* | /sys* | /dev*)
            die "refusing NODELET_TESTBED=$TB" ;;
    esac
    # unix socket paths are limited to 108 bytes
    (( ${#TTRPC_SOCK} < 100 )) || die "NODELET_TESTBED path too long for a unix socket: $TB"
}

# ---------------------------------------------------------------- processes

# argv of a process into array ARGV (no fork: this runs for every process)
read_argv() { ARGV=(); { mapfile -d '' -t ARGV <"/proc/$1/cmdline"; } 2>/dev/null || true; }

# pids whose argv holds the two consecutive arguments $1 $2
pids_with_args() {
    local flag=$1 value=$2 dir pid i ARGV
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        read_argv "$pid"
        for ((i = 0; i + 1 < ${#ARGV[@]}; i++)); do
            if [[ ${ARGV[i]} == "$flag" && ${ARGV[i+1]} == "$value" ]]; then
                echo "$pid"
                break
            fi
        done
    done
}

# our containerd processes (the normal and the maintenance one)
containerd_pids() {
    { pids_with_args --config "$CONFIG"; pids_with_args --config "$MAINT_CONFIG"; } | sort -un
}

runs_our_config() { # pid
    local a ARGV
    read_argv "$1"
    for a in "${ARGV[@]}"; do
        [[ $a == "$CONFIG" || $a == "$MAINT_CONFIG" ]] && return 0
    done
    return 1
}

# value following $2 in the argv of pid $1
arg_after() {
    local i ARGV
    read_argv "$1"
    for ((i = 0; i + 1 < ${#ARGV[@]}; i++)); do
        if [[ ${ARGV[i]} == "$2" ]]; then echo "${ARGV[i+1]}"; return; fi
    done
}

# pid exists and is not a zombie
alive() {
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null || return 1
    local stat
    { stat=$(<"/proc/$1/stat"); } 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

wait_gone() { # pid seconds
    local pid=$1 n=$(( $2 * 10 ))
    while alive "$pid" && ((n-- > 0)); do sleep 0.1; done
    ! alive "$pid"
}

# (without containerd 2.x's warning about cgroup v1 on every call)
ctr_() { timeout 60 "$CTR" -a "$SOCK" "$@" 2> >(grep -v 'support for cgroup v1 is deprecated' >&2); }

answering() { [[ -S $SOCK ]] && timeout 5 "$CTR" -a "$SOCK" version >/dev/null 2>&1; }

# ---------------------------------------------------------------- config

# The part every config version shares: where containerd keeps its state and listens.
config_head() { # version disabled-plugins [extra disabled plugin]
    local disabled=$2
    [[ -n ${3:-} ]] && disabled="$disabled, \"$3\""
    cat <<EOF
# Written by hack/testbed.sh: the nodelet test bed's private containerd.
version = $1
root = "$ROOT"
state = "$STATE"
disabled_plugins = [$disabled]

[grpc]
  address = "$SOCK"
  uid = 0
  gid = 0

[ttrpc]
  address = "$TTRPC_SOCK"
EOF
}

write_config() { # path [extra disabled plugin]
    if [[ $GENERATION == 2 ]]; then write_config_v3 "$@"; else write_config_v2 "$@"; fi
}

# containerd 2.x: the CRI is split into an images, a runtime and a gRPC plugin. NRI is off: its
# socket is machine-wide.
write_config_v3() { # path [extra disabled plugin]
    local path=$1 extra=${2:-} handler
    {
        config_head 3 '"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri"' "$extra"
        cat <<EOF

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "$SHIM_SOCKET_DIR"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_REF"

  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$CERTS_DIR"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["$CDI_DIR"]

  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"

  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
        for handler in "runc $RUNC_ROOT" "$ALT_HANDLER $RUNC_ALT_ROOT"; do
            cat <<EOF

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${handler%% *}]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "$SHIM"

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${handler%% *}.options]
    SystemdCgroup = false
    BinaryName = "$RUNC"
    Root = "${handler#* }"
EOF
        done
    } >"$path.tmp"
    mv "$path.tmp" "$path"
}

# containerd 1.6
write_config_v2() { # path [extra disabled plugin]
    local path=$1 extra=${2:-}
    {
        config_head 2 '"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"' "$extra"
        cat <<EOF

[plugins."io.containerd.internal.v1.opt"]
  path = "$OPT"

[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = "$RUNC_V1_ROOT"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_REF"
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUNC_ROOT"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$ALT_HANDLER]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$ALT_HANDLER.options]
        SystemdCgroup = false
        Root = "$RUNC_ALT_ROOT"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CERTS_DIR"
EOF
    } >"$path.tmp"
    mv "$path.tmp" "$path"
}

write_cni_conf() {
    mkdir -p "$CNI_CONF_DIR" "$IPAM_DIR"
    cat >"$CNI_CONF_DIR/10-$NET_NAME.conflist.tmp" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$NET_NAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$IPAM_DIR"
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
    mv "$CNI_CONF_DIR/10-$NET_NAME.conflist.tmp" "$CNI_CONF_DIR/10-$NET_NAME.conflist"
}

# ---------------------------------------------------------------- start / stop

start_containerd() { # config
    local cfg=$1 pid n
    mkdir -p "$ROOT" "$STATE" "$CDI_DIR" "$RUNC_ROOT" "$RUNC_ALT_ROOT" "$OPT" "$CERTS_DIR"
    rm -f "$SOCK" "$TTRPC_SOCK"
    if [[ -f $LOG ]] && (( $(stat -c %s "$LOG") > 20 * 1024 * 1024 )); then mv -f "$LOG" "$LOG.1"; fi
    # fd 9 is our lock: containerd must not inherit it
    setsid "$CONTAINERD" --config "$cfg" </dev/null >>"$LOG" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$PIDFILE"
    for ((n = 0; n < 300; n++)); do
        answering && return 0
        alive "$pid" || break
        sleep 0.1
    done
    tail -n 20 "$LOG" >&2 || true
    die "containerd did not answer on $SOCK within 30 s (log: $LOG)"
}

stop_containerd() {
    local pids pid
    pids=$( { [[ -r $PIDFILE ]] && cat "$PIDFILE"; containerd_pids; } 2>/dev/null | sort -un || true)
    for pid in $pids; do
        alive "$pid" || continue
        # only a process running with our config is ours
        runs_our_config "$pid" || continue
        log "stopping containerd (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone "$pid" 10; then
            log "containerd $pid ignored SIGTERM, killing it"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 5 || die "containerd $pid does not go away"
        fi
    done
    rm -f "$SOCK" "$TTRPC_SOCK"
}

# ---------------------------------------------------------------- images

stamp_of() { sha256sum "$@" | sha256sum | cut -d' ' -f1; }

image_digest() { # ref -> digest known to our containerd, if any
    ctr_ -n "$CRI_NS" images ls 2>/dev/null | awk -v r="$1" '$1 == r {print $3}'
}

import_image() { # ref archive digest
    local ref=$1 archive=$2 want=$3
    [[ $(image_digest "$ref") == "$want" ]] && return 0
    log "importing $ref"
    ctr_ -n "$CRI_NS" images import "$archive" >/dev/null
    if [[ $(image_digest "$ref") != "$want" ]]; then
        ctr_ -n "$CRI_NS" images rm "$ref" >/dev/null 2>&1 || true
        ctr_ -n "$CRI_NS" images import "$archive" >/dev/null
    fi
}

images() {
    answering || die "containerd is not running: run '$0 up' first"
    mkdir -p "$IMAGES"
    local stamp
    [[ -x $BUSYBOX_BIN ]] || die "no static busybox at $BUSYBOX_BIN (package busybox-static)"

    stamp=$( { stamp_of "$HERE/pause.c" "$HERE/mkimage.py"; gcc -dumpfullversion; echo "$PAUSE_REF"; } | sha256sum | cut -d' ' -f1)
    if [[ ! -s $IMAGES/pause.tar || ! -s $IMAGES/pause.digest || $(cat "$IMAGES/pause.stamp" 2>/dev/null) != "$stamp" ]]; then
        log "building $PAUSE_REF"
        gcc -static -O2 -s -o "$IMAGES/pause" "$HERE/pause.c"
        python3 "$HERE/mkimage.py" pause --binary "$IMAGES/pause" --ref "$PAUSE_REF" \
            --out "$IMAGES/pause.tar" --digest-file "$IMAGES/pause.digest" >/dev/null
        echo "$stamp" >"$IMAGES/pause.stamp"
    fi

    stamp=$( { stamp_of "$BUSYBOX_BIN" "$HERE/mkimage.py"; echo "$BUSYBOX_REF"; } | sha256sum | cut -d' ' -f1)
    if [[ ! -s $IMAGES/busybox.tar || ! -s $IMAGES/busybox.digest || $(cat "$IMAGES/busybox.stamp" 2>/dev/null) != "$stamp" ]]; then
        log "building $BUSYBOX_REF"
        python3 "$HERE/mkimage.py" busybox --busybox "$BUSYBOX_BIN" --ref "$BUSYBOX_REF" \
            --out "$IMAGES/busybox.tar" --digest-file "$IMAGES/busybox.digest" >/dev/null
        echo "$stamp" >"$IMAGES/busybox.stamp"
    fi

    import_image "$PAUSE_REF" "$IMAGES/pause.tar" "$(cat "$IMAGES/pause.digest")"
    import_image "$BUSYBOX_REF" "$IMAGES/busybox.tar" "$(cat "$IMAGES/busybox.digest")"

    # `ctr images import` exits 0 even when it imported nothing: check
    local have ref
    have=$(ctr_ -n "$CRI_NS" images ls -q)
    for ref in "$PAUSE_REF" "$BUSYBOX_REF"; do
        grep -qxF "$ref" <<<"$have" || die "image $ref is missing after import"
    done
    log "images ready: $PAUSE_REF $BUSYBOX_REF"
}

# ---------------------------------------------------------------- commands

lock() {
    mkdir -p "$TB"
    exec 9>>"$TB/lock"
    flock 9
}

cmd_up() {
    lock
    local want=${NODELET_CONTAINERD:-2}
    select_generation "$(recorded_generation)"
    if answering && [[ -n $(containerd_pids) && $GENERATION == "$want" ]]; then
        log "containerd $GENERATION already running on $SOCK"
    else
        teardown
        select_generation "$want"
        log "starting containerd $GENERATION on $SOCK"
        mkdir -p "$TB"
        record_marks
        echo "$NET" >"$TB/net"
        echo "$GENERATION" >"$GENERATION_FILE"
        write_config "$CONFIG"
        write_cni_conf
        touch "$DIRTY"
        start_containerd "$CONFIG"
    fi
    bridge_up
    images
    log "up"
}

# The bridge with its gateway address from the start (the CNI plugin would make it with the
# first pod): a local address that is not loopback, for nodes the API server must reach through
# its proxy, which refuses loopback addresses.
bridge_up() {
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip -4 addr show dev "$BRIDGE" | grep -q " $GATEWAY/" || ip addr add "$GATEWAY/16" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

cmd_down() {
    lock
    select_generation "$(recorded_generation)"
    if (( NET == 0 )); then
        bash "$HERE/registry.sh" down || log "warning: the test registries did not stop cleanly"
        # Control planes that tests (or `make cluster`) left running, before their nodes' pods go.
        bash "$HERE/k8s/cluster.sh" down-all "$TB/clusters" || log "warning: a control plane did not stop cleanly"
    fi
    teardown
    log "down"
}

# A runtime fault for the resilience tests: containerd is killed (as in a crash) and started
# again on the same state; containers keep running under their shims meanwhile.
cmd_restart() {
    lock
    select_generation "$(recorded_generation)"
    local pids pid
    pids=$( { [[ -r $PIDFILE ]] && cat "$PIDFILE"; containerd_pids; } 2>/dev/null | sort -un || true)
    for pid in $pids; do
        alive "$pid" || continue
        runs_our_config "$pid" || continue
        log "killing containerd (pid $pid)"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || die "containerd $pid does not go away"
    done
    rm -f "$SOCK" "$TTRPC_SOCK"
    start_containerd "$CONFIG"
    log "containerd restarted"
}

cmd_images() {
    lock
    select_generation "$(recorded_generation)"
    images
}

cmd_env() {
    echo "NODELET_TEST_ENDPOINT=unix://$SOCK"
    echo "NODELET_TESTBED=$TB"
    echo "NODELET_TEST_NODE_IP=$GATEWAY"
    echo "NODELET_TEST_ALT_HANDLER=$ALT_HANDLER"
    echo "NODELET_TEST_ALT_RUNC_ROOT=$RUNC_ALT_ROOT"
    echo "NODELET_TEST_CDI_DIR=$CDI_DIR"
    select_generation "$(recorded_generation)"
    echo "NODELET_TEST_CONTAINERD=$GENERATION"
    echo "NODELET_TEST_CTR=$CTR"
    bash "$HERE/registry.sh" env
}

usage() { echo "usage: $0 up|down|images|env|restart" >&2; exit 2; }

[[ $# -eq 1 ]] || usage
check_paths
case $1 in
    up) cmd_up ;;
    down) cmd_down ;;
    images) cmd_images ;;
    env) cmd_env ;;
    restart) cmd_restart ;;
    *) usage ;;
esac
