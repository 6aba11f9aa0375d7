//! The pod's identity on the network: /etc/hosts, resolv.conf, hostname and sysctls, as seen
//! from inside containers.

use std::time::Duration;

use crate::bed::{BUSYBOX, FOREVER, Node};

fn pod(name: &str, spec_extra: &str, script: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 2
{spec_extra}  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {}]
",
        serde_json::to_string(&format!(
            "{script}; echo END; trap 'exit 0' TERM; {FOREVER}"
        ))
        .unwrap()
    )
}

#[tokio::test]
async fn hosts_file_and_hostname_name_the_pod() {
    let node = Node::start("etchosts", &["--cluster-domain", "cluster.local"]).await;
    node.write_manifest(
        "db.yaml",
        &pod(
            "db",
            "  hostname: db\n  subdomain: set\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo, bar]}]\n",
            "cat /etc/hosts; echo hostname=$(hostname)",
        ),
    );
    node.write_manifest(
        "fqdn.yaml",
        &pod(
            "fqdn",
            "  hostname: web\n  subdomain: set\n  setHostnameAsFQDN: true\n",
            "echo hostname=$(hostname)",
        ),
    );
    node.write_manifest(
        "long.yaml",
        &pod(
            "long",
            "  hostname: a-hostname-of-fifty-characters-or-so-for-this-test\n  subdomain: set\n  setHostnameAsFQDN: true\n",
            "echo hostname=$(hostname)",
        ),
    );
    node.write_manifest(
        "hn.yaml",
        &pod(
            "hn",
            "  hostNetwork: true\n  hostAliases: [{ip: 10.9.9.9, hostnames: [extra]}]\n",
            "cat /etc/hosts; echo hostname=$(hostname)",
        ),
    );
    let log = node.wait_log("db", "c", "END").await;
    let st = node
        .wait_status("db", "a pod IP", |s| s.pod_ip.is_some())
        .await;
    let ip = st.pod_ip.unwrap();
    for expected in [
        format!("{ip}\tdb.set.default.svc.cluster.local\tdb"),
        "127.0.0.1\tlocalhost".into(),
        "10.1.2.3\tfoo\tbar".into(),
        "hostname=db".into(),
    ] {
        assert!(
            log.lines().any(|l| l.ends_with(&expected)),
            "{expected:?} missing in:\n{log}"
        );
    }
    let log = node.wait_log("fqdn", "c", "END").await;
    assert!(
        log.contains("hostname=web.set.default.svc.cluster.local"),
        "{log}"
    );
    let log = node.wait_log("hn", "c", "END").await;
    let node_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        log.contains(&format!("hostname={}", node_hostname.trim())),
        "{log}"
    );
    assert!(log.lines().any(|l| l.ends_with("10.9.9.9\textra")), "{log}");
    let node_hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    let first = node_hosts.lines().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        log.lines().any(|l| l.ends_with(first)),
        "the node's hosts file: {first:?} in\n{log}"
    );
    // An FQDN the kernel cannot hold as hostname keeps the pod from starting, as upstream.
    crate::bed::eventually("the long FQDN refused", Duration::from_secs(30), || async {
        crate::bed::logs()
            .contains("Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain")
            .then_some(())
    })
    .await;
    assert!(node.sandboxes("long").await.is_empty());
    node.finish().await;
}

#[tokio::test]
async fn resolv_conf_follows_the_dns_policy() {
    let resolv = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        resolv.path(),
        "nameserver 192.0.2.53\nsearch example.test\noptions edns0\n",
    )
    .unwrap();
    let resolv_path = resolv.path().display().to_string();
    let node = Node::start(
        "resolv",
        &[
            "--cluster-dns",
            "10.96.0.10",
            "--cluster-domain",
            "cluster.local",
            "--resolv-conf",
            &resolv_path,
        ],
    )
    .await;
    node.write_manifest(
        "cf.yaml",
        &pod("cf", "  dnsPolicy: ClusterFirst\n", "cat /etc/resolv.conf"),
    );
    node.write_manifest(
        "df.yaml",
        &pod("df", "  dnsPolicy: Default\n", "cat /etc/resolv.conf"),
    );
    node.write_manifest(
        "none.yaml",
        &pod(
            "none",
            "  dnsPolicy: None\n  dnsConfig: {nameservers: [192.0.2.1], searches: [a.test], options: [{name: ndots, value: '2'}, {name: edns0}]}\n",
            "cat /etc/resolv.conf",
        ),
    );
    node.write_manifest(
        "merged.yaml",
        &pod(
            "merged",
            "  dnsConfig: {nameservers: [192.0.2.2], options: [{name: ndots, value: '1'}]}\n",
            "cat /etc/resolv.conf",
        ),
    );
    let cf = node.wait_log("cf", "c", "END").await;
    assert!(cf.contains("nameserver 10.96.0.10"), "{cf}");
    assert!(
        cf.contains(
            "search default.svc.cluster.local svc.cluster.local cluster.local example.test"
        ),
        "{cf}"
    );
    assert!(cf.contains("options ndots:5"), "{cf}");
    let df = node.wait_log("df", "c", "END").await;
    assert!(
        df.contains("nameserver 192.0.2.53") && df.contains("search example.test"),
        "{df}"
    );
    let none = node.wait_log("none", "c", "END").await;
    assert!(
        none.contains("nameserver 192.0.2.1") && !none.contains("10.96.0.10"),
        "{none}"
    );
    assert!(
        none.contains("search a.test") && none.contains("options ndots:2 edns0"),
        "{none}"
    );
    let merged = node.wait_log("merged", "c", "END").await;
    assert!(
        merged.contains("nameserver 10.96.0.10") && merged.contains("nameserver 192.0.2.2"),
        "{merged}"
    );
    assert!(merged.contains("options ndots:1"), "{merged}");
    node.finish().await;

    let plain = Node::start("resolvplain", &["--resolv-conf", &resolv_path]).await;
    plain.write_manifest("cf.yaml", &pod("cf", "", "cat /etc/resolv.conf"));
    let log = plain.wait_log("cf", "c", "END").await;
    assert!(
        log.contains("nameserver 192.0.2.53"),
        "without --cluster-dns ClusterFirst uses the host's: {log}"
    );
    plain.finish().await;
}

#[tokio::test]
async fn allowed_sysctls_are_set_and_forbidden_ones_reject_the_pod() {
    let node = Node::start("sysctl", &[]).await;
    node.write_manifest(
        "ok.yaml",
        &pod(
            "ok",
            "  securityContext: {sysctls: [{name: net.ipv4.ip_local_port_range, value: '40000 50000'}]}\n",
            "cat /proc/sys/net/ipv4/ip_local_port_range",
        ),
    );
    node.write_manifest(
        "bad.yaml",
        &pod(
            "bad",
            "  securityContext: {sysctls: [{name: net.core.somaxconn, value: '1024'}]}\n",
            "true",
        ),
    );
    let log = node.wait_log("ok", "c", "END").await;
    assert!(log.contains("40000\t50000"), "{log}");
    let st = node
        .wait_status("bad", "rejected", |s| {
            s.reason.as_deref() == Some("SysctlForbidden")
        })
        .await;
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert!(
        st.message
            .unwrap_or_default()
            .contains("net.core.somaxconn")
    );
    assert!(
        node.sandboxes("bad").await.is_empty(),
        "nothing of a rejected pod runs"
    );
    node.finish().await;
}
