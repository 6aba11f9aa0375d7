#!/usr/bin/env bash
# `kubeadm init` with nodelet as the node agent, as clusters are really built: kubeadm writes the
# control plane's static pods (etcd, kube-apiserver, kube-controller-manager, kube-scheduler),
# nodelet runs them from /etc/kubernetes/manifests and joins the cluster they form.
#
# kubeadm's paths (/etc/kubernetes, /var/lib/kubelet, /var/lib/etcd) and ports (6443, 2379, 10250,
# ...) are fixed, so each bootstrap gets a machine of its own: private mount, network and UTS
# namespaces in which /etc, /usr and /var are overlays (writes land in the machine's directory, the
# host's files stay as they are), a containerd test bed, a view of the open loopback registry and
# the machine's own loopback and bridge. Nothing kubeadm or nodelet does in it reaches the host.
#
#   bootstrap.sh images          build the control plane's images and its addons' (kube-proxy,
#                                CoreDNS): the Go-built binaries on busybox, kube-proxy with the
#                                host's iptables; push them, with the pause image, to the open
#                                registry under the names kubeadm asks for (registry.sh up first)
#   bootstrap.sh up NAME NET     machine NAME on test bed network NET (1-30): kubeadm init in it
#                                with nodelet as the kubelet; returns once init has exited 0
#   bootstrap.sh exec NAME CMD   run CMD in machine NAME (kubectl there uses kubeadm's admin.conf)
#   bootstrap.sh stop-node NAME  stop the machine's nodelet (as `systemctl stop kubelet` would)
#   bootstrap.sh start-node NAME start it again with the flags kubeadm gave it
#   bootstrap.sh down NAME       stop the machine and everything in it, and remove its directory
#   bootstrap.sh run             `make bootstrap`: machine "dev", up, wait for Ctrl-C, down
#
# NODELET is the nodelet binary (default: the debug build in CARGO_TARGET_DIR). NODE_AGENT=kubelet
# at `up` runs the upstream kubelet built beside the control plane instead, for comparisons; it
# changes three host sysctls, which `down` restores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hack=$(dirname "$here")
TB=${NODELET_TESTBED:-/var/lib/nodelet-testbed}
while [[ $TB == */ && $TB != / ]]; do TB=${TB%/}; done
REGISTRY=127.0.0.1:${NODELET_REGISTRY_PORT:-5811}
REPO=$REGISTRY/k8s
BUSYBOX_BIN=${NODELET_BUSYBOX:-/bin/busybox}
K8S_VERSION=v1.36.3
# kubeadm names etcd's image after the etcd it was released with; ours is the one built here.
ETCD_TAG=3.6.16-0
PAUSE_TAG=3.10.2
COREDNS_TAG=v1.14.2
IMAGE_DIR=$TB/bootstrap-images
XTABLES=/usr/lib/x86_64-linux-gnu/xtables

log() { echo "bootstrap: $*" >&2; }
die() { echo "bootstrap: error: $*" >&2; exit 1; }

bin_dir() {
    [[ -n ${K8S_BIN:-} ]] || K8S_BIN=$(bash "$here/build.sh" bin 2>/dev/null)
    echo "$K8S_BIN"
}

# ---------------------------------------------------------------- images

push() { # archive ref
    skopeo --insecure-policy copy -q --dest-tls-verify=false "oci-archive:$1" "docker://$2" >/dev/null
}

# kube-proxy programs the node's packet filter with iptables: the host's (nft backend), with
# the libraries and extensions it loads, beside the binary.
iptables_args() {
    local lib tool ext
    echo --add; echo "$(readlink -f /usr/sbin/xtables-nft-multi):usr/sbin/xtables-nft-multi:755"
    for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
        echo --link; echo "usr/sbin/$tool:xtables-nft-multi"
    done
    for lib in $( { ldd /usr/sbin/xtables-nft-multi; for ext in "$XTABLES"/*.so; do ldd "$ext"; done; } |
        grep -o '/[^ ]*' | sort -u); do
        echo --add; echo "$(readlink -f "$lib"):${lib#/}:755"
    done
    for lib in "$XTABLES"/*.so; do
        echo --add; echo "$lib:${lib#/}:644"
    done
}

image_args() { # name bin -> ARGS
    ARGS=(--path /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    case $1 in
        coredns) ARGS+=(--add "$2/coredns:coredns:755" --entrypoint '["/coredns"]') ;;
        kube-proxy) mapfile -t -O "${#ARGS[@]}" ARGS < <(iptables_args)
            ARGS+=(--add "$2/kube-proxy:usr/local/bin/kube-proxy:755") ;;
        *) ARGS+=(--add "$2/$1:usr/local/bin/$1:755") ;;
    esac
}

cmd_images() {
    local bin name tag archive stamp ARGS
    bin=$(bin_dir)
    [[ -x $BUSYBOX_BIN ]] || die "no static busybox at $BUSYBOX_BIN (package busybox-static)"
    [[ -s $TB/images/pause.tar ]] || die "no pause image yet: run 'hack/testbed.sh images' first"
    [[ -x /usr/sbin/xtables-nft-multi ]] || die "no iptables (nft) on the host for the kube-proxy image (package iptables)"
    mkdir -p "$IMAGE_DIR"
    for name in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy coredns; do
        case $name in
            etcd) tag=$ETCD_TAG ;;
            coredns) tag=$COREDNS_TAG ;;
            *) tag=$K8S_VERSION ;;
        esac
        archive=$IMAGE_DIR/$name.tar
        image_args "$name" "$bin"
        stamp=$( { sha256sum "$BUSYBOX_BIN" "$hack/mkimage.py" "$bin/$name"; echo "$REPO/$name:$tag ${ARGS[*]}"; } | sha256sum | cut -d' ' -f1)
        if [[ ! -s $archive || $(cat "$archive.stamp" 2>/dev/null) != "$stamp" ]]; then
            log "building $REPO/$name:$tag"
            # Uncompressed: the binaries are large and the image never leaves the machine.
            python3 "$hack/mkimage.py" busybox --busybox "$BUSYBOX_BIN" --ref "$REPO/$name:$tag" \
                --out "$archive" --no-gzip "${ARGS[@]}" >/dev/null
            echo "$stamp" >"$archive.stamp"
        fi
        push "$archive" "$REPO/$name:$tag"
    done
    push "$TB/images/pause.tar" "$REPO/pause:$PAUSE_TAG"
    log "control plane images pushed to $REPO"
}

# ---------------------------------------------------------------- the machine

# Machine NAME's files: its containerd test bed (under the main bed's beds/, so the main bed's
# `down` takes it down with everything else), the overlays' upper layers, logs and configs.
set_machine() { # NAME
    [[ $1 =~ ^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$ ]] || die "machine name '$1' is not a DNS label"
    NAME=$1
    MDIR=$TB/beds/kubeadm-$NAME
    NODE=kubeadm-$NAME
    CGROUP_ROOT=/nodelet-test/kubeadm-$NAME
}

# The machine's containerd, whose namespaces are the machine's; only while that pid still runs
# the machine's config (a pid is reused once its process is gone).
machine_pid() {
    local pid
    pid=$(cat "$MDIR/containerd.pid" 2>/dev/null) || return 1
    [[ -n $pid ]] || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$MDIR/config.toml" || return 1
    echo "$pid"
}

in_machine() {
    local pid
    pid=$(machine_pid) || die "machine $NAME is not running"
    PATH=$MDIR/bin:$(bin_dir):$PATH KUBECONFIG=/etc/kubernetes/admin.conf \
        nsenter --target "$pid" --mount --net --uts -- "$@"
}

# Starts CMD in the machine in a session of its own, its output appended to LOG; nsenter and
# setsid exec what they run, so the pid in PIDFILE is CMD's. The bed's `down` stops it.
spawn() { # pidfile log cmd...
    local pidfile=$1 out=$2 pid
    shift 2
    pid=$(machine_pid) || die "machine $NAME is not running"
    PATH=$MDIR/bin:$PATH nsenter --target "$pid" --mount --net --uts -- setsid "$@" </dev/null >>"$out" 2>&1 &
    echo $! >"$pidfile"
    echo "$! $(readlink -f "$1")" >>"$MDIR/companions"
    # Not this script's job: `down` stops it, and its end is not reported here.
    disown $!
}

# The node agent's binary: nodelet, or the upstream kubelet (NODE_AGENT=kubelet at `up`).
agent_binary() {
    if [[ $(cat "$MDIR/agent" 2>/dev/null || echo "$AGENT") == kubelet ]]; then
        echo "$(bin_dir)/kubelet"
    else
        echo "$NODELET"
    fi
}

# The bed's containerd is started inside the new namespaces, after the overlays are in place; it
# keeps them alive. The test bed directory is bound back over the /var overlay so that containerd's
# snapshots and the machine's own upper layers stay on the host's file system.
start_machine() { # NET
    local net=$1 gateway generation
    gateway=10.$((213 + net)).0.1
    generation=${NODELET_CONTAINERD:-$(cat "$TB/containerd-generation" 2>/dev/null || echo 2)}
    mkdir -p "$MDIR"/upper/{etc,usr,var} "$MDIR"/work/{etc,usr,var} "$MDIR/bin" "$MDIR/certs.d"
    cp -r "$TB/certs.d/$REGISTRY" "$MDIR/certs.d/"
    echo "$AGENT" >"$MDIR/agent"
    ln -sf "$(agent_binary)" "$MDIR/bin/kubelet"
    echo "$gateway" >"$MDIR/address"
    # shellcheck disable=SC2016 # the script expands its own arguments
    unshare --mount --net --uts --propagation private -- env \
        NODELET_TESTBED="$MDIR" NODELET_TESTBED_NET="$net" NODELET_CONTAINERD="$generation" \
        bash -euo pipefail -c '
        hostname "$0"
        ip link set lo up
        # kubeadm wants forwarding on; this is the machine'\''s own network stack.
        echo 1 >/proc/sys/net/ipv4/ip_forward
        # A /run of its own: kube-proxy'\''s xtables lock and the runtime'\''s state stay in it.
        mount -t tmpfs -o mode=0755 nodelet-run /run
        mount -t tmpfs nodelet-bootstrap /mnt
        case $1/ in /var/*|/etc/*) mkdir /mnt/tb; mount --bind "$1" /mnt/tb ;; esac
        for d in etc usr var; do
            mount -t overlay "nodelet-$d" -o "lowerdir=/$d,upperdir=$NODELET_TESTBED/upper/$d,workdir=$NODELET_TESTBED/work/$d" "/$d"
        done
        case $1/ in /var/*|/etc/*) mount --move /mnt/tb "$1" ;; esac
        umount /mnt
        exec bash "$2/testbed.sh" up' "$NODE" "$TB" "$hack" >"$MDIR/machine.log" 2>&1 ||
        { tail -n 20 "$MDIR/machine.log" >&2; die "machine $NAME did not start (log: $MDIR/machine.log)"; }
}

# The open registry's storage, served on the machine's own loopback under the same address.
start_registry() {
    local reg=$TB/registry
    sed "s#^http: .*#http: {addr: $REGISTRY, secret: nodelet-machine-$NAME}#" "$reg/open/config.yml" >"$MDIR/registry.yml"
    spawn "$MDIR/registry.pid" "$MDIR/registry.log" "$reg/bin/docker-registry" serve "$MDIR/registry.yml"
    sleep_until 10 "the machine's registry" in_machine python3 -c \
        "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=2)"
}

sleep_until() { # seconds what command...
    local n=$(( $1 * 10 )) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((n-- > 0)) || die "$what did not come up"
        sleep 0.1
    done
}

write_kubeadm_config() {
    local address
    address=$(cat "$MDIR/address")
    cat >"$MDIR/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: $address
  bindPort: 6443
nodeRegistration:
  name: $NODE
  criSocket: unix://$MDIR/containerd.sock
  kubeletExtraArgs:
  - {name: node-ip, value: $address}
  # This machine's cgroups are v1 (hybrid), which kubeadm's system check refuses for kubelets
  # of 1.35 and later.
  ignorePreflightErrors: [SystemVerification]
timeouts:
  # The test machine runs other tests beside this one.
  kubernetesAPICall: 3m
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $K8S_VERSION
imageRepository: $REPO
etcd:
  local:
    imageTag: $ETCD_TAG
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# No cgroupDriver: kubeadm's default (systemd) stands, and the agent uses the runtime's (cgroupfs).
cgroupRoot: $CGROUP_ROOT
# This machine's cgroups are v1, which the kubelet of 1.35 and later refuses unless told.
failCgroupV1: false
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
# The connection tracking table's size and timeouts are the host's, not the machine's.
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# Host sysctls the upstream kubelet sets at start: what they were, for `down`.
KUBELET_SYSCTLS=(vm/overcommit_memory kernel/panic kernel/panic_on_oops)

save_sysctls() {
    local s
    for s in "${KUBELET_SYSCTLS[@]}"; do echo "$s $(cat "/proc/sys/$s")"; done >"$MDIR/sysctls"
}

restore_sysctls() {
    local s v
    [[ -r $MDIR/sysctls ]] || return 0
    while read -r s v; do echo "$v" >"/proc/sys/$s"; done <"$MDIR/sysctls"
}

# As the kubelet's systemd unit runs it: kubeadm's config and kubeconfig, then its flags file.
cmd_start_node() {
    local args=() env=/var/lib/kubelet/kubeadm-flags.env mount
    if in_machine test -s "$env"; then
        # shellcheck disable=SC2016
        mapfile -t args < <(in_machine bash -c '. "$0"; printf "%s\n" $KUBELET_KUBEADM_ARGS' "$env")
    fi
    local agent
    agent=$(cat "$MDIR/agent")
    if [[ $agent == kubelet ]]; then
        [[ -r $MDIR/sysctls ]] || save_sysctls
        # The kubelet wants its cgroup root to exist in every hierarchy.
        while read -r mount; do mkdir -p "$mount$CGROUP_ROOT"; done < <(findmnt -n -l -t cgroup,cgroup2 -o TARGET)
    fi
    spawn "$MDIR/agent.pid" "$MDIR/$agent.log" "$(agent_binary)" --config=/var/lib/kubelet/config.yaml \
        --kubeconfig=/etc/kubernetes/kubelet.conf "${args[@]}"
    log "$agent started in machine $NAME (log: $MDIR/$agent.log)"
}

cmd_stop_node() {
    local pid
    pid=$(cat "$MDIR/agent.pid" 2>/dev/null) || return 0
    if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$(readlink -f "$(agent_binary)")" ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$MDIR/agent.pid"
}

cmd_up() { # NAME NET
    local net=${2:-} started=$SECONDS pid
    [[ $net =~ ^([1-9]|[12][0-9]|30)$ ]] || die "usage: bootstrap.sh up NAME NET (NET 1-30)"
    [[ $AGENT == nodelet || $AGENT == kubelet ]] || die "NODE_AGENT must be nodelet or kubelet"
    [[ -x $(agent_binary) ]] || die "no $AGENT at $(agent_binary)"
    [[ -s $TB/registry/open/config.yml && -d $TB/certs.d/$REGISTRY ]] ||
        die "the open registry is not up: run 'make registries control-plane-images' first"
    cmd_down_quiet
    start_machine "$net"
    start_registry
    write_kubeadm_config
    log "kubeadm init in machine $NAME (log: $MDIR/kubeadm.log)"
    date +%s.%N >"$MDIR/init-started"
    in_machine "$(bin_dir)/kubeadm" init --config "$MDIR/kubeadm.yaml" >"$MDIR/kubeadm.log" 2>&1 &
    pid=$!
    # kubeadm does not start the kubelet (it would ask systemd): nodelet starts as soon as
    # kubeadm has written its configuration, as the kubelet's unit restarts on it.
    until [[ -s $MDIR/upper/var/lib/kubelet/config.yaml ]]; do
        [[ -d /proc/$pid ]] || break
        sleep 0.2
    done
    [[ -d /proc/$pid ]] && cmd_start_node
    if ! wait "$pid"; then
        tail -n 30 "$MDIR/kubeadm.log" >&2
        die "kubeadm init failed in machine $NAME (log: $MDIR/kubeadm.log)"
    fi
    log "kubeadm init succeeded in $((SECONDS - started)) s; node $NODE at $(cat "$MDIR/address")"
}

cmd_down_quiet() {
    local pid mount
    [[ -d $MDIR ]] || return 0
    cmd_stop_node
    restore_sysctls
    if pid=$(machine_pid); then
        nsenter --target "$pid" --mount --net -- env NODELET_TESTBED="$MDIR" \
            NODELET_TESTBED_NET="$(cat "$MDIR/net" 2>/dev/null || echo 1)" bash "$hack/testbed.sh" down ||
            log "warning: machine $NAME's test bed did not stop cleanly"
    fi
    # What is left (the namespaces are gone with their last process): the bed's files.
    NODELET_TESTBED=$MDIR NODELET_TESTBED_NET=$(cat "$MDIR/net" 2>/dev/null || echo 1) \
        bash "$hack/testbed.sh" down >/dev/null 2>&1 || true
    rm -rf --one-file-system "$MDIR"
    # nodelet's QoS and pod cgroups, deepest first, in every hierarchy.
    while read -r mount; do
        [[ -d $mount$CGROUP_ROOT ]] || continue
        find "$mount$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null ||
            log "warning: cgroup $mount$CGROUP_ROOT is still in use"
    done < <(findmnt -n -l -t cgroup,cgroup2 -o TARGET)
}

cmd_down() {
    cmd_down_quiet
    log "machine $NAME is down"
}

cmd_run() {
    set_machine dev
    trap 'cmd_down' EXIT
    trap 'exit 0' INT TERM
    cmd_up dev 20
    cat <<EOF
bootstrap: the cluster is up. In the machine (kubectl uses kubeadm's admin.conf):
  bash hack/k8s/bootstrap.sh exec dev kubectl get nodes,pods -A
  bash hack/k8s/bootstrap.sh exec dev kubectl taint nodes $NODE node-role.kubernetes.io/control-plane:NoSchedule-
nodelet's log: $MDIR/nodelet.log. Ctrl-C stops the machine and removes it.
EOF
    while :; do sleep 3600; done
}

NODELET=${NODELET:-${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/nodelet/target}/debug/nodelet}
AGENT=${NODE_AGENT:-nodelet}
case ${1:-} in
    images) cmd_images ;;
    up) set_machine "${2:-}"; cmd_up "$2" "${3:-}" ;;
    exec) set_machine "${2:-}"; shift 2; in_machine "$@" ;;
    stop-node) set_machine "${2:-}"; cmd_stop_node ;;
    start-node) set_machine "${2:-}"; cmd_start_node ;;
    down) set_machine "${2:-}"; cmd_down ;;
    run) cmd_run ;;
    *) echo "usage: $0 images|up NAME NET|exec NAME CMD...|stop-node NAME|start-node NAME|down NAME|run" >&2; exit 2 ;;
esac
