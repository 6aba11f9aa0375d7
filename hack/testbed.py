#!/usr/bin/env python3
"""The parts of the test bed's cleanup (hack/testbed-cleanup.sh) that read structured files.

mountinfo, OCI bundles, runc state and `iptables -S` are easier to parse here than in bash.
Each command keeps its parsing in pure functions (tested in test_testbed.py) and its effects
in a thin wrapper that reads the files and runs the commands.

    testbed.py remember-cgroups BUNDLES LIST      add the cgroupfs paths the task bundles under
                                                  BUNDLES name to the file LIST (one a line)
    testbed.py runc-rootfs STATE_JSON             print the rootfs a runc state.json records
    testbed.py mounts-under DIR                   print the mount points at or under DIR,
                                                  innermost first
    testbed.py clean-iptables NET SHARED          delete what CNI made in iptables for network
                                                  NET; the portmap plugin's shared chains too
                                                  when SHARED is "ours" and they are idle
    testbed.py clean-cgroups LIST PARENTS [ID..]  remove the cgroups LIST names and those named
                                                  after a container ID, then the cgroups in
                                                  PARENTS (space-separated) if empty; LIST keeps
                                                  only the paths that could not be removed
"""

import argparse
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import NamedTuple

# The portmap plugin's chains, shared by every CNI network on the machine.
SHARED_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SNAT")
# The rule each shared chain holds when no network maps a port any more.
SHARED_BOILERPLATE = {"CNI-HOSTPORT-SETMARK": "MARK", "CNI-HOSTPORT-MASQ": "MASQUERADE"}
# Container ids the CRI gives containers and sandboxes; cgroups named like this are theirs.
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
# How deep under a cgroup mount a container's cgroup is looked for.
MAX_CGROUP_DEPTH = 8


def log(message):
    print("testbed: " + message, file=sys.stderr)


# ------------------------------------------------------------------ path lists


def read_list(path):
    """The non-blank lines of a list file, stripped; none when it does not exist."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.strip() for line in f if line.strip()}


def write_list(path, items):
    """Replaces a list file at once: a killed run leaves the old list or the new one."""
    with open(path + ".tmp", "w") as f:
        f.write("".join(item + "\n" for item in sorted(items)))
    os.replace(path + ".tmp", path)


# ------------------------------------------------------------------ mountinfo


class Mount(NamedTuple):
    point: str
    fstype: str


def unescape(field):
    """Undoes the kernel's octal escapes (space, tab, newline, backslash) in a mountinfo field."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text):
    """The mounts of /proc/PID/mountinfo, in the kernel's order (the order they were made)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        # optional fields come before the "-" separator, so the type is found after it
        fstype = fields[fields.index("-") + 1] if "-" in fields[:-1] else ""
        mounts.append(Mount(unescape(fields[4]), fstype))
    return mounts


def mounts_under(mounts, root):
    """Mount points at or under root in the order to unmount them: deepest first and, at one
    depth, the latest first (it hides the ones below it)."""
    found = [
        (m.point.count("/"), n, m.point)
        for n, m in enumerate(mounts)
        if m.point == root or m.point.startswith(root + "/")
    ]
    return [point for _, _, point in sorted(found, reverse=True)]


def cgroup_mount_points(mounts):
    """Where the cgroup hierarchies (v1 controllers and v2) are mounted."""
    return [m.point for m in mounts if m.fstype in ("cgroup", "cgroup2")]


# ------------------------------------------------------------------ cgroups


def cgroupfs_path(bundle_config):
    """The cgroupsPath an OCI runtime spec names, if it is a cgroupfs path: a systemd slice
    spec ("slice:prefix:name") is the systemd driver's to remove."""
    if not isinstance(bundle_config, dict):
        return None
    linux = bundle_config.get("linux") or {}
    path = linux.get("cgroupsPath") if isinstance(linux, dict) else None
    if isinstance(path, str) and path and ":" not in path:
        return path
    return None


def own_cgroups(proc_cgroup):
    """The cgroups of a process (/proc/PID/cgroup) and all their ancestors but the root: none
    of them may be removed under it."""
    own = set()
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        path = parts[2]
        while path not in ("", "/"):
            own.add(path)
            path = os.path.dirname(path)
    return own


def removal_targets(paths, own):
    """The cgroup paths to remove, normalised: absolute ones only, never the root or one of
    our own."""
    targets = set()
    for path in paths:
        path = os.path.normpath(path)
        if path.startswith("//"):
            # normpath keeps two leading slashes (POSIX lets them mean something else; cgroupfs
            # does not): "//" is the root
            path = path[1:]
        if path.startswith("/") and path != "/" and path not in own:
            targets.add(path)
    return targets


def container_ids(ids):
    """The ids that are CRI container or sandbox ids."""
    return {i for i in ids if CONTAINER_ID.fullmatch(i)}


def deepest_first(paths):
    """Children before their parents: a cgroup with children cannot be removed."""
    return sorted(paths, key=lambda p: -p.count("/"))


def find_named(mount, names):
    """Cgroups under a mount whose directory name is one of names, relative to the mount."""
    found = set()
    for dirpath, dirnames, _ in os.walk(mount):
        if dirpath[len(mount):].count("/") > MAX_CGROUP_DEPTH:
            dirnames[:] = []
            continue
        for d in dirnames:
            if d in names:
                found.add(os.path.join(dirpath, d)[len(mount):])
    return found


def remove_cgroup(d):
    """Kills what runs in a cgroup and removes it, retrying for a few seconds while its
    processes die; True when it is gone."""
    for _ in range(50):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                procs = [int(x) for x in f.read().split()]
        except OSError:
            procs = []
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(d)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    log("cannot remove cgroup %s" % d)
    return False


def clean_cgroups(mounts, paths, ids, own, parents):
    """Removes from every hierarchy mounted at mounts the cgroups at paths and those called
    after one of ids, each after its children; then the parents they leave empty, and each of
    parents if empty. Returns the paths that could not be removed."""
    targets = removal_targets(paths, own)
    names = container_ids(ids)
    leftover = set()
    for m in mounts:
        here = set(targets)
        if names:
            here |= find_named(m, names)
        for rel in deepest_first(here):
            d = m + rel
            if os.path.isdir(d):
                # children first (a pod cgroup holds its containers' cgroups)
                for dirpath, _, _ in sorted(os.walk(d), key=lambda t: -t[0].count("/")):
                    if dirpath != d:
                        remove_cgroup(dirpath)
                if not remove_cgroup(d):
                    leftover.add(rel)
                    continue
            # then the parents the path created, while empty
            parent = os.path.dirname(rel)
            while parent not in ("", "/") and parent not in own:
                try:
                    os.rmdir(m + parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)
        # ctr's default cgroup parents (/<namespace>) are shared with any other containerd
        for rel in parents:
            try:
                os.rmdir(m + rel)
            except OSError:
                pass
    return leftover


# ------------------------------------------------------------------ runc


def runc_rootfs(state):
    """The root filesystem of the container a runc state.json describes."""
    return state["config"]["rootfs"]


# ------------------------------------------------------------------ iptables


def parse_rules(text):
    """The lines of `iptables -S`, each split into its arguments as the shell would."""
    return [shlex.split(line) for line in text.splitlines() if line.strip()]


def jump_target(rule):
    return rule[rule.index("-j") + 1] if "-j" in rule else None


def names_network(rule, net):
    """Whether a rule carries the comment CNI gives the rules it makes for network net."""
    marker = 'name: "%s" id: ' % net
    return "--comment" in rule and marker in rule[rule.index("--comment") + 1]


def network_cleanup(rules, net):
    """The iptables arguments that delete network net's rules from one table: the rules naming
    it or jumping into its chains (outside those chains), then its chains, flushed and deleted.
    Its chains are the per-pod CNI- chains its rules live in or jump to."""
    chains = {r[1] for r in rules if r[0] == "-N"}
    mine = set()
    for r in rules:
        if r[0] == "-A" and names_network(r, net):
            for c in (r[1], jump_target(r)):
                if c and c.startswith("CNI-") and c not in SHARED_CHAINS and c in chains:
                    mine.add(c)
    commands = [
        ["-D", *r[1:]]
        for r in rules
        if r[0] == "-A" and r[1] not in mine and (names_network(r, net) or jump_target(r) in mine)
    ]
    commands += [["-F", c] for c in sorted(mine)]
    commands += [["-X", c] for c in sorted(mine)]
    return commands


def shared_cleanup(nat_rules):
    """The iptables arguments that delete the portmap plugin's shared chains from the nat table,
    when they hold nothing but their boilerplate; none while some network maps a port."""
    chains = {r[1] for r in nat_rules if r[0] == "-N"}
    body = {c: [r for r in nat_rules if r[0] == "-A" and r[1] == c] for c in SHARED_CHAINS if c in chains}
    idle = all(jump_target(r) == SHARED_BOILERPLATE.get(c) for c, rows in body.items() for r in rows)
    if not body or not idle:
        return []
    commands = [
        ["-D", *r[1:]] for r in nat_rules if r[0] == "-A" and r[1] not in body and jump_target(r) in body
    ]
    commands += [["-F", c] for c in body]
    commands += [["-X", c] for c in body]
    return commands


def iptables(table, args, check=True):
    r = subprocess.run(["iptables", "-w", "-t", table, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        log("iptables -t %s %s: %s" % (table, " ".join(args), r.stderr.strip()))
    return r


def table_rules(table):
    r = iptables(table, ["-S"], check=False)
    return parse_rules(r.stdout) if r.returncode == 0 else []


# ------------------------------------------------------------------ commands


def cmd_remember_cgroups(args):
    paths = read_list(args.list)
    for cfg in glob.glob(os.path.join(args.bundles, "*", "*", "config.json")):
        try:
            with open(cfg) as f:
                path = cgroupfs_path(json.load(f))
        except (OSError, ValueError):
            continue
        if path:
            paths.add(path)
    write_list(args.list, paths)


def cmd_runc_rootfs(args):
    try:
        with open(args.state) as f:
            print(runc_rootfs(json.load(f)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log("no rootfs in %s: %s" % (args.state, e))
        return 1
    return 0


def read_mountinfo():
    with open("/proc/self/mountinfo") as f:
        return parse_mountinfo(f.read())


def cmd_mounts_under(args):
    for point in mounts_under(read_mountinfo(), args.dir):
        print(point)


def cmd_clean_iptables(args):
    for table in ("nat", "filter", "mangle"):
        for command in network_cleanup(table_rules(table), args.net):
            iptables(table, command)
    if args.shared == "ours":
        for command in shared_cleanup(table_rules("nat")):
            iptables("nat", command)


def cmd_clean_cgroups(args):
    paths = read_list(args.list)
    with open("/proc/self/cgroup") as f:
        own = own_cgroups(f.read())
    mounts = cgroup_mount_points(read_mountinfo())
    leftover = clean_cgroups(mounts, paths, args.ids, own, args.parents.split())
    write_list(args.list, leftover & paths)


def main(argv):
    parser = argparse.ArgumentParser(prog="testbed.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("remember-cgroups")
    p.add_argument("bundles")
    p.add_argument("list")
    p.set_defaults(run=cmd_remember_cgroups)
    p = sub.add_parser("runc-rootfs")
    p.add_argument("state")
    p.set_defaults(run=cmd_runc_rootfs)
    p = sub.add_parser("mounts-under")
    p.add_argument("dir")
    p.set_defaults(run=cmd_mounts_under)
    p = sub.add_parser("clean-iptables")
    p.add_argument("net")
    p.add_argument("shared")
    p.set_defaults(run=cmd_clean_iptables)
    p = sub.add_parser("clean-cgroups")
    p.add_argument("list")
    p.add_argument("parents")
    p.add_argument("ids", nargs="*")
    p.set_defaults(run=cmd_clean_cgroups)
    args = parser.parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
