# shellcheck shell=bash
# shellcheck disable=SC2153 # its upper-case names are the settings testbed.sh assigns
# The test bed's debris cleanup, sourced by testbed.sh, whose variables and helpers it uses.
# teardown brings the machine back to its state before the first `up`, whatever ran or died:
# `up` runs it to clear what a killed run left, `down` to leave. It removes our containers,
# shims, runc state, mounts, network (bridge, iptables rules, IPAM), cgroups and companion
# processes, and never anything a system containerd or another network owns.
# The parsing it needs (mountinfo, bundles, runc state, iptables rules) is in testbed.py.

# ---------------------------------------------------------------- marks

# Remember, once, what the machine looked like before our first `up`, so that
# `down` restores it: ip_forward (the bridge plugin sets it), the portmap
# plugin's shared chains, /run/containerd (the shims create it).
record_marks() {
    mkdir -p "$MARKS"
    [[ -e $MARKS/ip_forward ]] || cat /proc/sys/net/ipv4/ip_forward >"$MARKS/ip_forward"
    if [[ ! -e $MARKS/hostport-chains ]]; then
        if iptables -w -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1; then
            echo foreign >"$MARKS/hostport-chains"
        else
            echo ours >"$MARKS/hostport-chains"
        fi
    fi
    if [[ ! -e $MARKS/nft-tables ]]; then
        # iptables-nft creates the nat (and maybe filter) table on first use
        local t
        for t in nat filter mangle; do
            if ! nft_backend || nft list table ip "$t" >/dev/null 2>&1; then echo "$t present"; else echo "$t absent"; fi
        done >"$MARKS/nft-tables"
    fi
    if [[ ! -e $MARKS/run-containerd ]]; then
        if [[ -e /run/containerd ]]; then echo foreign; else echo ours; fi >"$MARKS/run-containerd"
    fi
}

nft_backend() { command -v nft >/dev/null && [[ $(iptables -V 2>/dev/null) == *nf_tables* ]]; }

# ---------------------------------------------------------------- containers

# cgroupsPath of every task bundle, remembered in $CGROUP_LIST
remember_cgroups() {
    [[ -d $STATE/io.containerd.runtime.v2.task ]] || return 0
    python3 "$HERE/testbed.py" remember-cgroups "$STATE/io.containerd.runtime.v2.task" "$CGROUP_LIST"
}

# ids of our containers: runc state, task bundles, CRI dirs, shims
known_ids() {
    {
        local d pid
        for d in "$RUNC_ROOT"/*/* "$RUNC_ALT_ROOT"/*/* "$STATE"/io.containerd.runtime.v2.task/*/* \
                 "$ROOT"/io.containerd.grpc.v1.cri/sandboxes/* "$ROOT"/io.containerd.grpc.v1.cri/containers/*; do
            if [[ -d $d ]]; then basename "$d"; fi
        done
        for pid in $(shim_pids); do arg_after "$pid" -id; done
    } | grep -E '^[A-Za-z0-9][A-Za-z0-9_.-]*$' | sort -u || true
}

# "namespace id" of every task bundle and runc state dir (shims are grouped by these)
known_tasks() {
    local d
    for d in "$STATE"/io.containerd.runtime.v2.task/*/* "$RUNC_ROOT"/*/* "$RUNC_ALT_ROOT"/*/*; do
        if [[ -d $d ]]; then echo "$(basename "$(dirname "$d")") $(basename "$d")"; fi
    done | sort -u
}

# shims started by our containerd: their argv names our socket
shim_pids() { pids_with_args -address "$SOCK"; }

# a shim's socket: /run/containerd/s/sha256(<containerd address>/<namespace>/<id>)
remove_shim_socket() { # namespace id
    local hash
    hash=$(printf '%s' "$SOCK/$1/$2" | sha256sum | cut -d' ' -f1)
    rm -f "$SHIM_SOCKET_DIR/$hash"
}

# Remove every container and task of our (running) containerd, in every namespace.
purge_containers() {
    local ns id failed=0
    for ns in $(ctr_ namespaces ls -q); do
        local ids tasks
        ids=$(ctr_ -n "$ns" containers ls -q) || { failed=1; continue; }
        tasks=$(ctr_ -n "$ns" tasks ls -q) || { failed=1; continue; }
        [[ -z $ids && -z $tasks ]] && continue
        log "removing $(wc -w <<<"$ids") container(s) in namespace $ns"
        for id in $tasks; do
            ctr_ -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
        done
        # (CRI deletes the tasks of exited containers itself: "not found" is fine)
        for id in $tasks; do
            ctr_ -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 || true
        done
        for id in $(ctr_ -n "$ns" tasks ls -q); do
            sleep 0.5
            ctr_ -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 || failed=1
        done
        for id in $ids; do
            ctr_ -n "$ns" containers delete "$id" >/dev/null 2>&1 || true
        done
        [[ -z $(ctr_ -n "$ns" containers ls -q) ]] || failed=1
    done
    return $failed
}

kill_shims() {
    local pid ns id
    for pid in $(shim_pids); do
        ns=$(arg_after "$pid" -namespace)
        id=$(arg_after "$pid" -id)
        log "killing stale shim $pid ($ns/$id)"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || true
        if [[ -n $ns && -n $id ]]; then remove_shim_socket "$ns" "$id"; fi
    done
}

# rootfs recorded in a runc state.json
runc_rootfs() {
    python3 "$HERE/testbed.py" runc-rootfs "$1" 2>/dev/null || true
}

kill_runc_container() { # root id
    log "removing runc container $2"
    "$RUNC" --root "$1" kill --all "$2" KILL >/dev/null 2>&1 || true
    "$RUNC" --root "$1" delete --force "$2" >/dev/null 2>&1 || true
}

# Kill what still runs in our containers and remove their runc state.
kill_runc_containers() { # "namespace id" lines of our tasks
    local root dir ns id
    for root in "$RUNC_ROOT"/* "$RUNC_ALT_ROOT"/* "$RUNC_V1_ROOT"/*; do
        [[ -d $root ]] || continue
        for dir in "$root"/*/; do
            if [[ -d $dir ]]; then kill_runc_container "$root" "$(basename "$dir")"; fi
        done
    done
    # A plain `ctr run` (no --runc-root) keeps runc state in runc's default
    # root, shared with any other containerd: touch only the state whose
    # rootfs is one of our bundles.
    while read -r ns id; do
        [[ -n $id && -f $DEFAULT_RUNC_ROOT/$ns/$id/state.json ]] || continue
        if [[ $(runc_rootfs "$DEFAULT_RUNC_ROOT/$ns/$id/state.json") == "$STATE"/* ]]; then
            kill_runc_container "$DEFAULT_RUNC_ROOT/$ns" "$id"
        fi
    done <<<"$1"
}

# ---------------------------------------------------------------- mounts

# mount points at or under $TB, innermost first
mounts_under_tb() {
    python3 "$HERE/testbed.py" mounts-under "$TB"
}

unmount_all() {
    local pass mp left
    for ((pass = 0; pass < 5; pass++)); do
        left=$(mounts_under_tb)
        [[ -z $left ]] && return 0
        while IFS= read -r mp; do
            umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
        done <<<"$left"
    done
    left=$(mounts_under_tb)
    [[ -z $left ]] || die "still mounted under $TB: $left"
}

# ---------------------------------------------------------------- network

# Delete what CNI made in iptables for our network, never anything else:
# rules whose comment names our network, the per-pod chains they jump to or
# live in, and the portmap plugin's shared chains only if we created them
# and nothing but their boilerplate is left in them.
clean_iptables() {
    command -v iptables >/dev/null || return 0
    local shared=foreign
    [[ -r $MARKS/hostport-chains ]] && shared=$(cat "$MARKS/hostport-chains")
    python3 "$HERE/testbed.py" clean-iptables "$NET_NAME" "$shared"
}

# drop the nftables tables iptables-nft created for us, once nothing is left in them
drop_empty_tables() {
    [[ -r $MARKS/nft-tables ]] && nft_backend || return 0
    local t state rules
    while read -r t state; do
        [[ $state == absent ]] || continue
        nft list table ip "$t" >/dev/null 2>&1 || continue
        # empty: only built-in chains with policy ACCEPT, no rule, no other chain
        rules=$(iptables -w -t "$t" -S 2>/dev/null) || continue
        if [[ -n $rules ]] && ! grep -qv '^-P [A-Z]* ACCEPT$' <<<"$rules"; then
            nft delete table ip "$t" 2>/dev/null || true
        fi
    done <"$MARKS/nft-tables"
}

clean_network() {
    local veth
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        for veth in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
            ip link delete "$veth" 2>/dev/null || true
        done
        log "deleting bridge $BRIDGE"
        ip link delete "$BRIDGE" 2>/dev/null || true
    fi
    clean_iptables
    drop_empty_tables
    rm -rf --one-file-system "${IPAM_DIR:?}/$NET_NAME"
    if [[ -r $MARKS/ip_forward ]]; then
        local want
        want=$(cat "$MARKS/ip_forward")
        [[ $(cat /proc/sys/net/ipv4/ip_forward) == "$want" ]] || echo "$want" >/proc/sys/net/ipv4/ip_forward
    fi
}

# ---------------------------------------------------------------- cgroups

# Remove the cgroup roots the tests, `make run`, the bench and the conformance nodes gave their
# nodes (/nodelet-test/<node>, /nodelet-dev, /nodelet-bench, /nodelet-conformance-<n>), deepest
# first, in every hierarchy; a tree still holding processes stays.
clean_test_cgroups() {
    local mount root
    while read -r mount; do
        for root in "$mount"/nodelet-test "$mount"/nodelet-dev "$mount"/nodelet-bench \
            "$mount"/nodelet-conformance-*; do
            [[ -d $root ]] || continue
            find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [[ -d $root ]] && log "warning: cgroup $root is still in use"
        done
    done < <(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) == "cgroup" || $(i+1) == "cgroup2") print $5; break } }' /proc/self/mountinfo)
    return 0
}

# Remove the cgroup directories our containers left: the paths their specs
# named (and their parents, while empty and not ours) and any directory
# named after one of our CRI container ids (64 hex digits); ctr's default
# parents /k8s.io and /default only when empty.
clean_cgroups() { # ids...
    python3 "$HERE/testbed.py" clean-cgroups "$CGROUP_LIST" "/$CRI_NS /default" "$@"
}

# ---------------------------------------------------------------- teardown

# Processes run beside this bed's containerd that it does not start itself (a kubeadm machine's
# nodelet and registry, hack/k8s/bootstrap.sh): "pid exe" lines; a pid running another program
# is not ours any more.
stop_companions() {
    local pid exe
    [[ -r $TB/companions ]] || return 0
    while read -r pid exe; do
        [[ -n $pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] || continue
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || log "warning: process $pid ($exe) does not go away"
    done <"$TB/companions"
    rm -f "$TB/companions"
}

# Bring the machine back to its state before `up`, whatever ran or died.
teardown() {
    local purged=0 ids tasks ns id
    mkdir -p "$TB"
    (( NET != 0 )) || down_beds
    stop_companions
    remember_cgroups
    if answering; then
        if purge_containers; then purged=1; else log "some containers could not be removed cleanly"; fi
        remember_cgroups
    fi
    ids=$(known_ids)
    tasks=$(known_tasks)
    stop_containerd
    kill_shims
    kill_runc_containers "$tasks"
    unmount_all
    while read -r ns id; do
        if [[ -n $id ]]; then remove_shim_socket "$ns" "$id"; fi
    done <<<"$tasks"
    # state and runc roots are runtime state like /run/containerd: wipe them
    rm -rf --one-file-system "$STATE" "$RUNC_ROOT" "$RUNC_ALT_ROOT" "$RUNC_V1_ROOT" "$TB/fifo"
    clean_network
    # shellcheck disable=SC2086
    clean_cgroups $ids
    # The main test bed's own: a test's bed must not touch the cgroups of tests still running.
    (( NET != 0 )) || clean_test_cgroups
    if [[ -e $DIRTY && $purged == 0 ]]; then
        # containerd died with containers in its metadata: remove them with a
        # containerd that has no CRI plugin (which would otherwise load them)
        log "removing stale containers from the metadata"
        write_config "$MAINT_CONFIG" io.containerd.grpc.v1.cri
        start_containerd "$MAINT_CONFIG"
        purge_containers || log "warning: could not purge every stale container"
        stop_containerd
        rm -f "$MAINT_CONFIG"
        unmount_all
        rm -rf --one-file-system "$STATE" "$RUNC_ROOT" "$RUNC_ALT_ROOT"
    fi
    rm -rf --one-file-system "$ROOT"/io.containerd.grpc.v1.cri/sandboxes "$ROOT"/io.containerd.grpc.v1.cri/containers
    if [[ $GENERATION == 2 ]]; then
        rm -rf --one-file-system "$SHIM_SOCKET_DIR"
        rmdir "$(dirname "$SHIM_SOCKET_DIR")" 2>/dev/null || true
    fi
    if [[ -r $MARKS/run-containerd && $(cat "$MARKS/run-containerd") == ours ]]; then
        rmdir /run/containerd/s "$DEFAULT_RUNC_ROOT"/* "$DEFAULT_RUNC_ROOT" /run/containerd 2>/dev/null || true
    fi
    rm -rf "$MARKS"
    rm -f "$DIRTY" "$PIDFILE" "$GENERATION_FILE"
}

# The other nodes' test beds, whatever their tests left.
down_beds() {
    local bed
    for bed in "$BEDS"/*/; do
        [[ -r $bed/net ]] || continue
        NODELET_TESTBED=${bed%/} NODELET_TESTBED_NET=$(cat "$bed/net") bash "$HERE/testbed.sh" down ||
            log "warning: the test bed $bed did not stop cleanly"
        rm -rf --one-file-system "$bed"
    done
}

