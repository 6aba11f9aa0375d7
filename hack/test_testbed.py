"""Unit tests of testbed.py's parsers and plans: no root, no network, no runtime.

    python3 -m unittest discover -s hack -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import tempfile
import unittest
from unittest import mock

import testbed

NET = "nodelet-testbed"


def mountinfo_line(mount_id, point, fstype, optional="shared:1"):
    return "%d 1 0:%d / %s rw,relatime %s - %s none rw" % (mount_id, mount_id, point, optional, fstype)


class MountinfoTest(unittest.TestCase):
    def test_octal_escapes_become_the_characters_they_stand_for(self):
        self.assertEqual(
            testbed.unescape(r"/var/lib/with\040space\011tab\134slash"), "/var/lib/with space\ttab\\slash"
        )

    def test_a_mount_is_read_with_its_type_past_any_optional_fields(self):
        text = "\n".join(
            [
                mountinfo_line(21, "/", "ext4"),
                mountinfo_line(22, "/sys/fs/cgroup", "cgroup2", optional="shared:4 master:1"),
                mountinfo_line(23, "/mnt/no-optional", "tmpfs", optional=""),
                mountinfo_line(24, r"/mnt/a\040b", "overlay"),
            ]
        )
        self.assertEqual(
            testbed.parse_mountinfo(text),
            [
                testbed.Mount("/", "ext4"),
                testbed.Mount("/sys/fs/cgroup", "cgroup2"),
                testbed.Mount("/mnt/no-optional", "tmpfs"),
                testbed.Mount("/mnt/a b", "overlay"),
            ],
        )

    def test_lines_too_short_to_be_mounts_are_skipped(self):
        self.assertEqual(testbed.parse_mountinfo("\n1 2 3\n"), [])

    def test_mounts_under_a_dir_come_deepest_first_and_never_from_a_sibling_with_its_prefix(self):
        mounts = [
            testbed.Mount("/", "ext4"),
            testbed.Mount("/tb", "tmpfs"),
            testbed.Mount("/tb/state/a", "overlay"),
            testbed.Mount("/tb/state/a/rootfs/proc", "proc"),
            testbed.Mount("/tb2/state", "tmpfs"),
            testbed.Mount("/tb/state/b", "overlay"),
        ]
        self.assertEqual(
            testbed.mounts_under(mounts, "/tb"),
            ["/tb/state/a/rootfs/proc", "/tb/state/b", "/tb/state/a", "/tb"],
        )

    def test_a_point_mounted_twice_is_listed_twice_the_latest_first(self):
        mounts = [testbed.Mount("/tb/netns/x", "nsfs"), testbed.Mount("/tb/netns/x", "tmpfs")]
        self.assertEqual(testbed.mounts_under(mounts, "/tb"), ["/tb/netns/x", "/tb/netns/x"])

    def test_nothing_is_under_a_dir_without_mounts(self):
        self.assertEqual(testbed.mounts_under([testbed.Mount("/", "ext4")], "/tb"), [])

    def test_cgroup_hierarchies_of_both_versions_are_found(self):
        mounts = [
            testbed.Mount("/sys/fs/cgroup/memory", "cgroup"),
            testbed.Mount("/sys/fs/cgroup/unified", "cgroup2"),
            testbed.Mount("/sys/fs/cgroup", "tmpfs"),
            testbed.Mount("/sys", "sysfs"),
        ]
        self.assertEqual(
            testbed.cgroup_mount_points(mounts), ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"]
        )


class CgroupsPathTest(unittest.TestCase):
    def test_a_cgroupfs_path_in_a_bundle_spec_is_taken(self):
        self.assertEqual(testbed.cgroupfs_path({"linux": {"cgroupsPath": "/k8s.io/abc"}}), "/k8s.io/abc")

    def test_a_systemd_slice_spec_is_not_a_cgroupfs_path(self):
        spec = {"linux": {"cgroupsPath": "kubepods.slice:cri-containerd:abc"}}
        self.assertIsNone(testbed.cgroupfs_path(spec))

    def test_a_spec_without_a_cgroups_path_names_none(self):
        for spec in ({}, {"linux": None}, {"linux": {}}, {"linux": {"cgroupsPath": ""}}, [], {"linux": []}):
            with self.subTest(spec=spec):
                self.assertIsNone(testbed.cgroupfs_path(spec))


class OwnCgroupsTest(unittest.TestCase):
    def test_every_ancestor_of_our_cgroups_is_ours_but_the_root(self):
        text = "12:memory:/user.slice/session-1.scope\n0::/system.slice/ssh.service\n3:cpu:/\n"
        self.assertEqual(
            testbed.own_cgroups(text),
            {"/user.slice/session-1.scope", "/user.slice", "/system.slice/ssh.service", "/system.slice"},
        )

    def test_a_malformed_line_adds_nothing(self):
        self.assertEqual(testbed.own_cgroups("garbage\n"), set())


class RemovalTargetsTest(unittest.TestCase):
    def test_paths_are_normalised_and_only_absolute_foreign_ones_kept(self):
        paths = {"/k8s.io//abc/", "/default/x/../y", "//pod", "relative", "/", "//", "///", "//user.slice"}
        self.assertEqual(
            testbed.removal_targets(paths, own={"/user.slice"}), {"/k8s.io/abc", "/default/y", "/pod"}
        )

    def test_only_64_hex_digit_ids_name_container_cgroups(self):
        cid = "a" * 64
        self.assertEqual(testbed.container_ids([cid, "A" * 64, "a" * 63, "my-container", cid + "0"]), {cid})

    def test_children_come_before_their_parents(self):
        self.assertEqual(testbed.deepest_first(["/a", "/a/b/c", "/a/b"]), ["/a/b/c", "/a/b", "/a"])


class CleanCgroupsTest(unittest.TestCase):
    """clean_cgroups on a plain directory standing in for a cgroup hierarchy (without
    cgroup.procs files, so nothing is signalled)."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.mount = tmp.name

    def mkdirs(self, *rels):
        for rel in rels:
            os.makedirs(self.mount + rel, exist_ok=True)

    def exists(self, rel):
        return os.path.isdir(self.mount + rel)

    def clean(self, paths=(), ids=(), own=(), parents=()):
        return testbed.clean_cgroups([self.mount], set(paths), list(ids), set(own), list(parents))

    def test_a_listed_cgroup_goes_with_its_children_and_its_emptied_parents(self):
        self.mkdirs("/nodelet/pod1/c1", "/nodelet/pod1/c2/inner", "/nodelet/pod2")
        self.assertEqual(self.clean(paths=["/nodelet/pod1"]), set())
        self.assertFalse(self.exists("/nodelet/pod1"))
        self.assertTrue(self.exists("/nodelet/pod2"), "a parent still holding a cgroup stays")

    def test_parents_go_up_to_but_not_into_our_own_cgroups(self):
        self.mkdirs("/user.slice/ctr/one")
        self.clean(paths=["/user.slice/ctr/one"], own=["/user.slice"])
        self.assertFalse(self.exists("/user.slice/ctr"))
        self.assertTrue(self.exists("/user.slice"))

    def test_a_cgroup_named_after_a_container_id_is_found_below_the_root(self):
        cid = "0123456789abcdef" * 4
        self.mkdirs("/kubepods/burstable/pod9/" + cid, "/kubepods/burstable/pod9/" + "f" * 64)
        self.clean(ids=[cid, "not-a-cri-id"])
        self.assertFalse(self.exists("/kubepods/burstable/pod9/" + cid))
        self.assertTrue(self.exists("/kubepods/burstable/pod9/" + "f" * 64), "another container's stays")

    def test_a_container_cgroup_takes_the_parents_it_leaves_empty(self):
        cid = "0123456789abcdef" * 4
        self.mkdirs("/kubepods/burstable/pod9/" + cid, "/kubepods/besteffort")
        self.clean(ids=[cid])
        self.assertFalse(self.exists("/kubepods/burstable"))
        self.assertTrue(self.exists("/kubepods/besteffort"))

    def test_a_container_id_is_not_looked_for_too_deep(self):
        cid = "e" * 64
        deep = "/1/2/3/4/5/6/7/8/9/" + cid
        self.mkdirs(deep)
        self.clean(ids=[cid])
        self.assertTrue(self.exists(deep))

    def test_shared_parents_go_only_when_empty(self):
        self.mkdirs("/k8s.io", "/default/someone-elses")
        self.clean(parents=["/k8s.io", "/default"])
        self.assertFalse(self.exists("/k8s.io"))
        self.assertTrue(self.exists("/default/someone-elses"))

    def test_a_path_naming_the_root_removes_nothing(self):
        self.mkdirs("/other/cgroup")
        self.assertEqual(self.clean(paths=["/", "//", "///."]), set())
        self.assertTrue(self.exists("/other/cgroup"))

    def test_a_cgroup_that_cannot_be_removed_is_left_over(self):
        self.mkdirs("/busy")
        with open(self.mount + "/busy/not-a-cgroup-file", "w"):
            pass
        with mock.patch.object(testbed.time, "sleep"), contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(self.clean(paths=["/busy", "/gone"]), {"/busy"})
        self.assertIn("cannot remove cgroup", err.getvalue())


class RuncStateTest(unittest.TestCase):
    def test_the_rootfs_comes_from_the_config(self):
        self.assertEqual(testbed.runc_rootfs({"id": "x", "config": {"rootfs": "/tb/state/x/rootfs"}}), "/tb/state/x/rootfs")

    def test_a_state_without_a_config_has_no_rootfs(self):
        with self.assertRaises(KeyError):
            testbed.runc_rootfs({"id": "x"})


# `iptables -t nat -S` after CNI's bridge and portmap plugins set up a pod with a port on our
# network and a pod on another network.
NAT_RULES = r"""-P PREROUTING ACCEPT
-P INPUT ACCEPT
-P OUTPUT ACCEPT
-P POSTROUTING ACCEPT
-N CNI-DN-0a1b2c
-N CNI-HOSTPORT-DNAT
-N CNI-HOSTPORT-MASQ
-N CNI-HOSTPORT-SETMARK
-N CNI-abc123
-N CNI-def456
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 10.213.0.5/32 -m comment --comment "name: \"nodelet-testbed\" id: \"aaaa\"" -j CNI-abc123
-A POSTROUTING -s 10.214.0.5/32 -m comment --comment "name: \"nodelet-testbed-1\" id: \"bbbb\"" -j CNI-def456
-A CNI-DN-0a1b2c -s 10.213.0.0/16 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0a1b2c -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.213.0.5:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"nodelet-testbed\" id: \"aaaa\"" -m multiport --dports 8080 -j CNI-DN-0a1b2c
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
-A CNI-abc123 -d 10.213.0.0/16 -m comment --comment "name: \"nodelet-testbed\" id: \"aaaa\"" -j ACCEPT
-A CNI-abc123 ! -d 224.0.0.0/4 -m comment --comment "name: \"nodelet-testbed\" id: \"aaaa\"" -j MASQUERADE
-A CNI-def456 -d 10.214.0.0/16 -m comment --comment "name: \"nodelet-testbed-1\" id: \"bbbb\"" -j ACCEPT
"""

# The shared chains once no network maps a port: their boilerplate and the jumps into them.
IDLE_NAT_RULES = r"""-P PREROUTING ACCEPT
-N CNI-HOSTPORT-DNAT
-N CNI-HOSTPORT-MASQ
-N CNI-HOSTPORT-SETMARK
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
"""


class IptablesTest(unittest.TestCase):
    def test_rules_are_split_as_the_shell_would_and_blank_lines_dropped(self):
        rules = testbed.parse_rules('-A X -m comment --comment "name: \\"n\\" id: \\"i\\"" -j Y\n\n')
        self.assertEqual(rules, [["-A", "X", "-m", "comment", "--comment", 'name: "n" id: "i"', "-j", "Y"]])

    def test_the_jump_target_is_what_follows_dash_j(self):
        self.assertEqual(testbed.jump_target(["-A", "X", "-j", "MARK", "--set-xmark", "1"]), "MARK")
        self.assertIsNone(testbed.jump_target(["-N", "X"]))

    def test_a_network_is_named_by_its_exact_name_not_a_prefix(self):
        rule = ["-A", "X", "--comment", 'name: "nodelet-testbed-1" id: "b"', "-j", "Y"]
        self.assertTrue(testbed.names_network(rule, "nodelet-testbed-1"))
        self.assertFalse(testbed.names_network(rule, NET))
        self.assertFalse(testbed.names_network(["-A", "X", "-j", "Y"], NET))

    def test_our_rules_go_then_our_chains_are_flushed_and_deleted(self):
        commands = testbed.network_cleanup(testbed.parse_rules(NAT_RULES), NET)
        self.assertEqual(
            commands,
            [
                ["-D", "POSTROUTING", "-s", "10.213.0.5/32", "-m", "comment", "--comment",
                 'name: "nodelet-testbed" id: "aaaa"', "-j", "CNI-abc123"],
                ["-D", "CNI-HOSTPORT-DNAT", "-p", "tcp", "-m", "comment", "--comment",
                 'dnat name: "nodelet-testbed" id: "aaaa"', "-m", "multiport", "--dports", "8080",
                 "-j", "CNI-DN-0a1b2c"],
                ["-F", "CNI-DN-0a1b2c"],
                ["-F", "CNI-abc123"],
                ["-X", "CNI-DN-0a1b2c"],
                ["-X", "CNI-abc123"],
            ],
        )

    def test_another_networks_rules_and_chains_stay(self):
        commands = testbed.network_cleanup(testbed.parse_rules(NAT_RULES), "nodelet-testbed-1")
        self.assertEqual(
            commands,
            [
                ["-D", "POSTROUTING", "-s", "10.214.0.5/32", "-m", "comment", "--comment",
                 'name: "nodelet-testbed-1" id: "bbbb"', "-j", "CNI-def456"],
                ["-F", "CNI-def456"],
                ["-X", "CNI-def456"],
            ],
        )

    def test_a_table_without_our_network_is_left_alone(self):
        self.assertEqual(testbed.network_cleanup(testbed.parse_rules(NAT_RULES), "elsewhere"), [])
        self.assertEqual(testbed.network_cleanup([], NET), [])

    def test_shared_chains_stay_while_a_port_is_mapped(self):
        self.assertEqual(testbed.shared_cleanup(testbed.parse_rules(NAT_RULES)), [])

    def test_idle_shared_chains_go_with_the_jumps_into_them(self):
        commands = testbed.shared_cleanup(testbed.parse_rules(IDLE_NAT_RULES))
        self.assertEqual(
            commands,
            [
                ["-D", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"],
                ["-D", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"],
                ["-D", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade",
                 "-j", "CNI-HOSTPORT-MASQ"],
                ["-F", "CNI-HOSTPORT-DNAT"],
                ["-F", "CNI-HOSTPORT-SETMARK"],
                ["-F", "CNI-HOSTPORT-MASQ"],
                ["-X", "CNI-HOSTPORT-DNAT"],
                ["-X", "CNI-HOSTPORT-SETMARK"],
                ["-X", "CNI-HOSTPORT-MASQ"],
            ],
        )

    def test_without_shared_chains_there_is_nothing_to_remove(self):
        self.assertEqual(testbed.shared_cleanup(testbed.parse_rules("-P PREROUTING ACCEPT\n")), [])


class CommandsTest(unittest.TestCase):
    """The commands on files in a temporary directory, as testbed-cleanup.sh calls them."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    def run_main(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = testbed.main(list(argv))
        return code, out.getvalue()

    def write(self, rel, text):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_remembered_cgroups_add_to_the_list_sorted_and_without_systemd_specs(self):
        lst = self.write("cgroups.list", "/earlier/one\n\n")
        self.write("tasks/k8s.io/c1/config.json", json.dumps({"linux": {"cgroupsPath": "/k8s.io/c1"}}))
        self.write("tasks/k8s.io/c2/config.json", json.dumps({"linux": {"cgroupsPath": "a.slice:cri:c2"}}))
        self.write("tasks/default/c3/config.json", "{not json")
        self.write("tasks/default/c4/config.json", json.dumps({"linux": {"cgroupsPath": "/default/c4"}}))
        self.assertEqual(self.run_main("remember-cgroups", os.path.join(self.dir, "tasks"), lst), (0, ""))
        with open(lst) as f:
            self.assertEqual(f.read(), "/default/c4\n/earlier/one\n/k8s.io/c1\n")
        self.assertFalse(os.path.exists(lst + ".tmp"))

    def test_remembering_starts_a_list_that_does_not_exist(self):
        lst = os.path.join(self.dir, "cgroups.list")
        self.assertEqual(self.run_main("remember-cgroups", os.path.join(self.dir, "none"), lst), (0, ""))
        with open(lst) as f:
            self.assertEqual(f.read(), "")

    def test_the_rootfs_is_printed_from_a_state_file(self):
        state = self.write("state.json", json.dumps({"config": {"rootfs": "/tb/state/x/rootfs"}}))
        self.assertEqual(self.run_main("runc-rootfs", state), (0, "/tb/state/x/rootfs\n"))

    def test_a_state_file_without_a_rootfs_prints_nothing_and_fails(self):
        for text in ("{}", "not json", "[]"):
            with self.subTest(text=text):
                self.assertEqual(self.run_main("runc-rootfs", self.write("state.json", text)), (1, ""))
        self.assertEqual(self.run_main("runc-rootfs", os.path.join(self.dir, "missing.json")), (1, ""))


if __name__ == "__main__":
    unittest.main()
