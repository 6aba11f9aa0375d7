#!/usr/bin/env bash
# A real Kubernetes control plane on loopback: etcd, kube-apiserver and, on request,
# kube-controller-manager and kube-scheduler, with a PKI of its own.
#
#   cluster.sh up DIR [--controllers]   start a control plane in DIR (its own data, ports, PKI);
#                                       NODE_MONITOR_GRACE sets the controller manager's
#                                       --node-monitor-grace-period (default 40s),
#                                       ENABLE_ADMISSION / DISABLE_ADMISSION the API server's
#                                       admission plugins turned on (default NodeRestriction,
#                                       ServiceAccount) and off (default none)
#   cluster.sh node DIR NAME            write DIR/nodes/NAME.kubeconfig: the identity of node NAME
#                                       (CN=system:node:NAME, O=system:nodes)
#   cluster.sh stop DIR COMPONENT       stop one component (etcd, kube-apiserver, ...)
#   cluster.sh start DIR COMPONENT      start it again with the flags it had
#   cluster.sh down DIR                 stop everything DIR started and remove DIR
#   cluster.sh down-all PARENT          `down` every control plane below PARENT
#
# DIR/env holds what a client needs: KUBECONFIG (admin), the server URL and the ports.
# The binaries come from hack/k8s/build.sh (K8S_BIN overrides the directory).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

# The Service network; its first address is the `kubernetes` Service's.
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
CLUSTER_CIDR=10.214.0.0/16

bin_dir() {
    if [[ -n ${K8S_BIN:-} ]]; then echo "$K8S_BIN"; else bash "$here/build.sh" bin; fi
}

# Free loopback TCP ports (the kernel's choice of port 0, released at once).
free_ports() { # count
    python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}

# ---------------------------------------------------------------- PKI

# A private key: ECDSA P-256, or RSA 2048 (kubeadm's default) with `rsa`.
new_key() { # path [rsa]
    if [[ ${2:-} == rsa ]]; then
        (umask 077 && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null)
    else
        (umask 077 && openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null |
            openssl pkcs8 -topk8 -nocrypt -out "$1")
    fi
}

# A key pair and a certificate signed by the cluster CA.
issue() { # pki name subject extension-lines [rsa]
    local pki=$1 name=$2 subj=$3 ext=$4
    new_key "$pki/$name.key" "${5:-}"
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
    printf '%b\n' "$ext" > "$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 3650 -sha256 -extfile "$pki/$name.ext" \
        -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$pki/$name.ext"
}

client_ext='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth'

make_pki() { # pki
    local pki=$1
    mkdir -p "$pki"
    chmod 0700 "$pki"
    new_key "$pki/ca.key"
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=nodelet-test-ca" -days 3650 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "$pki/ca.crt" 2>/dev/null
    # RSA, as kubeadm makes it: small TLS clients in test containers (busybox wget) speak no
    # ECDSA.
    issue "$pki" apiserver "/CN=kube-apiserver" \
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" rsa
    issue "$pki" admin "/O=system:masters/CN=kubernetes-admin" "$client_ext"
    issue "$pki" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
    issue "$pki" controller-manager "/CN=system:kube-controller-manager" "$client_ext"
    issue "$pki" scheduler "/CN=system:kube-scheduler" "$client_ext"
    # Signs and verifies service account tokens.
    new_key "$pki/sa.key"
    openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

kubeconfig() { # dir name user
    local dir=$1 name=$2 user=$3 server
    server=$(sed -n 's/^SERVER=//p' "$dir/env")
    cat > "$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodelet-test
  cluster:
    server: $server
    certificate-authority: $dir/pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $dir/pki/$user.crt
    client-key: $dir/pki/$user.key
contexts:
- name: $user@nodelet-test
  context:
    cluster: nodelet-test
    user: $user
current-context: $user@nodelet-test
EOF
    chmod 0600 "$dir/$name.kubeconfig"
}

# ---------------------------------------------------------------- processes

# The command line of each component, from the ports in DIR/env.
component_args() { # dir component
    local dir=$1 c=$2
    # shellcheck disable=SC1091
    source "$dir/env"
    local pki=$dir/pki
    case $c in
        etcd) ARGS=("$BIN/etcd" --name default --data-dir "$dir/etcd"
            --listen-client-urls "http://127.0.0.1:$ETCD_PORT"
            --advertise-client-urls "http://127.0.0.1:$ETCD_PORT"
            --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT"
            --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT"
            --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT"
            --listen-metrics-urls "" --unsafe-no-fsync --log-level warn) ;;
        kube-apiserver) ARGS=("$BIN/kube-apiserver"
            --etcd-servers "http://127.0.0.1:$ETCD_PORT"
            --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT"
            --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key"
            --client-ca-file "$pki/ca.crt"
            --service-account-issuer https://kubernetes.default.svc.cluster.local
            --service-account-key-file "$pki/sa.pub"
            --service-account-signing-key-file "$pki/sa.key"
            --api-audiences https://kubernetes.default.svc.cluster.local
            --service-cluster-ip-range "$SERVICE_CIDR"
            --authorization-mode "Node,RBAC"
            --enable-admission-plugins "$ENABLE_ADMISSION"
            --disable-admission-plugins "$DISABLE_ADMISSION"
            --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt"
            --kubelet-client-key "$pki/apiserver-kubelet-client.key"
            --kubelet-preferred-address-types "InternalIP,Hostname"
            --allow-privileged=true --endpoint-reconciler-type none
            --profiling=false --v 1) ;;
        kube-controller-manager) ARGS=("$BIN/kube-controller-manager"
            --kubeconfig "$dir/controller-manager.kubeconfig"
            --authentication-kubeconfig "$dir/controller-manager.kubeconfig"
            --authorization-kubeconfig "$dir/controller-manager.kubeconfig"
            --bind-address 127.0.0.1 --secure-port "$KCM_PORT"
            --root-ca-file "$pki/ca.crt" --service-account-private-key-file "$pki/sa.key"
            --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
            --use-service-account-credentials=true --leader-elect=false
            --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$CLUSTER_CIDR"
            --allocate-node-cidrs=false --controllers '*,-cloud-node-lifecycle'
            --node-monitor-grace-period "$NODE_MONITOR_GRACE"
            --flex-volume-plugin-dir "$dir/flexvolume"
            --profiling=false --v 1) ;;
        kube-scheduler) ARGS=("$BIN/kube-scheduler"
            --kubeconfig "$dir/scheduler.kubeconfig"
            --authentication-kubeconfig "$dir/scheduler.kubeconfig"
            --authorization-kubeconfig "$dir/scheduler.kubeconfig"
            --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false
            --profiling=false --v 1) ;;
        *) die "unknown component $c" ;;
    esac
}

start_component() { # dir component
    local dir=$1 c=$2 ARGS
    component_args "$dir" "$c"
    setsid "${ARGS[@]}" >>"$dir/logs/$c.log" 2>&1 < /dev/null &
    echo $! > "$dir/$c.pid"
}

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

stop_component() { # dir component
    local dir=$1 c=$2 pid
    pid=$(cat "$dir/$c.pid" 2>/dev/null || true)
    rm -f "$dir/$c.pid"
    alive "$pid" || return 0
    # Only our own process: every component's command line names this cluster's dir.
    grep -qa -- "$dir" "/proc/$pid/cmdline" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive "$pid" || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || return 0; sleep 0.1; done
}

wait_for() { # what seconds command...
    local what=$1 secs=$2 start=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        (( SECONDS - start < secs )) || return 1
        sleep 0.2
    done
    log "$what ready in $((SECONDS - start)) s"
}

etcd_healthy() { curl -fsS "http://127.0.0.1:$1/health" | grep -q '"health":"true"'; }
apiserver_ready() { # dir
    curl -fsS --cacert "$1/pki/ca.crt" --cert "$1/pki/admin.crt" --key "$1/pki/admin.key" \
        "https://127.0.0.1:$2/readyz" | grep -q ok
}

# ---------------------------------------------------------------- commands

cmd_up() { # dir [--controllers]
    local dir=$1 controllers=${2:-} start=$SECONDS
    [[ $dir == /* ]] || die "DIR must be an absolute path (got '$dir')"
    [[ -e $dir/env ]] && die "$dir already holds a control plane; \`$0 down $dir\` first"
    BIN=$(bin_dir)
    mkdir -p "$dir/logs"
    read -r ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT SCHED_PORT <<<"$(free_ports 5)"
    cat > "$dir/env" <<EOF
BIN=$BIN
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PORT=$APISERVER_PORT
KCM_PORT=$KCM_PORT
SCHED_PORT=$SCHED_PORT
SERVER=https://127.0.0.1:$APISERVER_PORT
KUBECONFIG=$dir/admin.kubeconfig
CA=$dir/pki/ca.crt
NODE_MONITOR_GRACE=${NODE_MONITOR_GRACE:-40s}
ENABLE_ADMISSION=${ENABLE_ADMISSION:-NodeRestriction,ServiceAccount}
DISABLE_ADMISSION=${DISABLE_ADMISSION:-}
EOF
    make_pki "$dir/pki"
    kubeconfig "$dir" admin admin
    kubeconfig "$dir" controller-manager controller-manager
    kubeconfig "$dir" scheduler scheduler
    start_component "$dir" etcd
    wait_for etcd 30 etcd_healthy "$ETCD_PORT" || die "etcd did not become healthy; see $dir/logs/etcd.log"
    start_component "$dir" kube-apiserver
    wait_for kube-apiserver 120 apiserver_ready "$dir" "$APISERVER_PORT" ||
        die "kube-apiserver did not become ready; see $dir/logs/kube-apiserver.log"
    if [[ $controllers == --controllers ]]; then
        start_component "$dir" kube-controller-manager
        start_component "$dir" kube-scheduler
    fi
    log "control plane up in $((SECONDS - start)) s: KUBECONFIG=$dir/admin.kubeconfig"
}

cmd_node() { # dir name
    local dir=$1 name=$2
    [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "bad node name '$name'"
    mkdir -p "$dir/nodes"
    issue "$dir/pki" "node-$name" "/O=system:nodes/CN=system:node:$name" "$client_ext"
    kubeconfig "$dir" "nodes/$name" "node-$name"
    echo "$dir/nodes/$name.kubeconfig"
}

cmd_stop() { stop_component "$1" "$2"; }

cmd_start() { # dir component
    local dir=$1 c=$2
    # shellcheck disable=SC1091
    source "$dir/env"
    start_component "$dir" "$c"
    case $c in
        etcd) wait_for etcd 30 etcd_healthy "$ETCD_PORT" ;;
        kube-apiserver) wait_for kube-apiserver 120 apiserver_ready "$dir" "$APISERVER_PORT" ;;
    esac
}

cmd_down() { # dir
    local dir=$1 c
    [[ -d $dir ]] || return 0
    [[ -f $dir/env ]] || die "$dir does not look like a control plane dir (no env)"
    for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
        stop_component "$dir" "$c"
    done
    rm -rf "$dir"
}

cmd_down_all() { # parent
    local d
    [[ -d $1 ]] || return 0
    for d in "$1"/*/; do
        [[ -f $d/env ]] && cmd_down "${d%/}"
    done
    return 0
}

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" >&2; exit 2; }

case ${1:-} in
    up) [[ $# -ge 2 ]] || usage; cmd_up "$2" "${3:-}" ;;
    node) [[ $# -eq 3 ]] || usage; cmd_node "$2" "$3" ;;
    stop) [[ $# -eq 3 ]] || usage; cmd_stop "$2" "$3" ;;
    start) [[ $# -eq 3 ]] || usage; cmd_start "$2" "$3" ;;
    down) [[ $# -eq 2 ]] || usage; cmd_down "$2" ;;
    down-all) [[ $# -eq 2 ]] || usage; cmd_down_all "$2" ;;
    *) usage ;;
esac
