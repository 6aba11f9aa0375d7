//! The pod's identity on the network, as the kubelet manages it: resolver configuration per
//! dnsPolicy, hostname and FQDN, the managed /etc/hosts, and which sysctls a pod may set.

use k8s_openapi::api::core::v1::{Pod, PodDNSConfig};

use crate::pod::spec;
use crate::runtime::cri;

/// Upstream's limits on a pod's resolver configuration.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// The node's DNS settings.
#[derive(Clone, Debug, Default)]
pub struct ClusterDns {
    /// --cluster-dns servers; empty means no cluster DNS.
    pub servers: Vec<String>,
    /// --cluster-domain, e.g. `cluster.local`; may be empty.
    pub domain: String,
}

/// Host resolver settings read from a resolv.conf text.
pub fn parse_resolv_conf(text: &str) -> cri::DnsConfig {
    let mut dns = cri::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(String::from)),
            Some("search") => dns.searches = words.map(String::from).collect(),
            Some("options") => dns.options.extend(words.map(String::from)),
            _ => {}
        }
    }
    dns
}

/// Reads the host resolver file (--resolv-conf), or an empty config when there is none.
pub fn host_dns(path: Option<&std::path::Path>) -> cri::DnsConfig {
    path.and_then(|p| std::fs::read_to_string(p).ok())
        .map(|text| parse_resolv_conf(&text))
        .unwrap_or_default()
}

fn push_unique(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|x| x == item) {
        list.push(item.to_string());
    }
}

/// The pod's resolver configuration per its dnsPolicy and dnsConfig, with warnings for what had
/// to be dropped (upstream's limits) or could not be honoured.
pub fn dns_config(
    pod: &Pod,
    host: &cri::DnsConfig,
    cluster: &ClusterDns,
) -> (cri::DnsConfig, Vec<String>) {
    let s = spec(pod);
    let mut warnings = Vec::new();
    let host_network = s.host_network.unwrap_or(false);
    let policy = s.dns_policy.as_deref().unwrap_or("ClusterFirst");
    // ClusterFirst on the host network means Default, as upstream; ClusterFirstWithHostNet does not.
    let wants_cluster =
        policy == "ClusterFirstWithHostNet" || (policy == "ClusterFirst" && !host_network);
    let mut dns = match policy {
        "None" => cri::DnsConfig::default(),
        _ if wants_cluster && cluster.servers.is_empty() => {
            warnings.push(format!(
                "dnsPolicy {policy} but no cluster DNS is configured (--cluster-dns); using the host's resolver"
            ));
            host.clone()
        }
        _ if wants_cluster => {
            let ns = crate::types::namespace(pod);
            let mut searches = Vec::new();
            if !cluster.domain.is_empty() {
                searches = vec![
                    format!("{ns}.svc.{}", cluster.domain),
                    format!("svc.{}", cluster.domain),
                    cluster.domain.clone(),
                ];
            }
            for h in &host.searches {
                push_unique(&mut searches, h);
            }
            cri::DnsConfig {
                servers: cluster.servers.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        _ => host.clone(),
    };
    if let Some(extra) = &s.dns_config {
        merge(&mut dns, extra);
    }
    limit(&mut dns, &mut warnings);
    (dns, warnings)
}

/// Adds the pod's dnsConfig: its nameservers and searches after the policy's, and its options
/// replacing any of the same name.
fn merge(dns: &mut cri::DnsConfig, extra: &PodDNSConfig) {
    for server in extra.nameservers.iter().flatten() {
        push_unique(&mut dns.servers, server);
    }
    for search in extra.searches.iter().flatten() {
        push_unique(&mut dns.searches, search);
    }
    for opt in extra.options.iter().flatten() {
        let name = opt.name.clone().unwrap_or_default();
        let text = match &opt.value {
            Some(v) => format!("{name}:{v}"),
            None => name.clone(),
        };
        dns.options
            .retain(|o| o.split(':').next() != Some(name.as_str()));
        dns.options.push(text);
    }
}

/// Keeps at most upstream's number of nameservers and search domains, with a warning for each cut.
fn limit(dns: &mut cri::DnsConfig, warnings: &mut Vec<String>) {
    if dns.servers.len() > MAX_NAMESERVERS {
        warnings.push(format!(
            "only {MAX_NAMESERVERS} nameservers are kept: {}",
            dns.servers[..MAX_NAMESERVERS].join(" ")
        ));
        dns.servers.truncate(MAX_NAMESERVERS);
    }
    let mut chars = 0;
    let mut kept = Vec::new();
    for search in &dns.searches {
        if kept.len() == MAX_SEARCHES
            || chars + search.len() + usize::from(!kept.is_empty()) > MAX_SEARCH_CHARS
        {
            break;
        }
        chars += search.len() + usize::from(!kept.is_empty());
        kept.push(search.clone());
    }
    if kept.len() < dns.searches.len() {
        warnings.push(format!(
            "search domains were cut to {} (at most {MAX_SEARCHES}, {MAX_SEARCH_CHARS} characters): {}",
            kept.len(),
            kept.join(" ")
        ));
        dns.searches = kept;
    }
}

/// The pod's hostname (spec.hostname, else the pod name cut to 63 characters without a trailing
/// `-` or `.`) and its FQDN when it has a subdomain.
pub fn hostname_and_fqdn(pod: &Pod, cluster_domain: &str) -> (String, Option<String>) {
    let s = spec(pod);
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let hostname = match s.hostname.as_deref().filter(|h| !h.is_empty()) {
        Some(h) => h.to_string(),
        None => name
            .chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_string(),
    };
    // Upstream's form, a trailing dot included when there is no cluster domain.
    let fqdn = s.subdomain.as_deref().filter(|d| !d.is_empty()).map(|sub| {
        let ns = crate::types::namespace(pod);
        format!("{hostname}.{sub}.{ns}.svc.{cluster_domain}")
    });
    (hostname, fqdn)
}

/// The most a hostname may hold in the kernel (its nodename field).
const KERNEL_HOSTNAME_MAX: usize = 64;

/// Upstream's refusal of a pod whose FQDN, to be its hostname, does not fit the kernel.
pub fn fqdn_too_long(pod: &Pod, cluster_domain: &str) -> Option<String> {
    let name = sandbox_hostname(pod, cluster_domain);
    (name.len() > KERNEL_HOSTNAME_MAX).then(|| {
        format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {name} is too long ({KERNEL_HOSTNAME_MAX} characters is the max, {} characters requested)",
            name.len()
        )
    })
}

/// The sandbox hostname: empty on the host network (the node's name stays); the FQDN with
/// setHostnameAsFQDN; else the hostname.
pub fn sandbox_hostname(pod: &Pod, cluster_domain: &str) -> String {
    let s = spec(pod);
    if s.host_network.unwrap_or(false) {
        return String::new();
    }
    let (hostname, fqdn) = hostname_and_fqdn(pod, cluster_domain);
    match fqdn {
        Some(f) if s.set_hostname_as_fqdn == Some(true) => f,
        _ => hostname,
    }
}

/// The managed /etc/hosts: localhost entries and the pod's IPs with its names for pod-network
/// pods, the node's own hosts file for host-network pods; then hostAliases.
pub fn etc_hosts(pod: &Pod, pod_ips: &[String], cluster_domain: &str, node_hosts: &str) -> String {
    let s = spec(pod);
    let mut out = String::new();
    if s.host_network.unwrap_or(false) {
        out.push_str(node_hosts);
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    } else {
        out.push_str("# Kubernetes-managed hosts file.\n");
        out.push_str("127.0.0.1\tlocalhost\n");
        out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str("fe00::0\tip6-localnet\n");
        out.push_str("fe00::0\tip6-mcastprefix\n");
        out.push_str("fe00::1\tip6-allnodes\n");
        out.push_str("fe00::2\tip6-allrouters\n");
        let (hostname, fqdn) = hostname_and_fqdn(pod, cluster_domain);
        for ip in pod_ips {
            match &fqdn {
                Some(f) => out.push_str(&format!("{ip}\t{f}\t{hostname}\n")),
                None => out.push_str(&format!("{ip}\t{hostname}\n")),
            }
        }
    }
    let aliases = s.host_aliases.iter().flatten().collect::<Vec<_>>();
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            out.push_str(&format!("{}\t{names}\n", alias.ip));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c", "image": "i"}]);
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "web-n1", "namespace": "prod"}, "spec": spec}),
        )
        .unwrap()
    }

    fn host() -> cri::DnsConfig {
        parse_resolv_conf("nameserver 1.1.1.1\nsearch example.com\noptions edns0\n")
    }

    fn cluster() -> ClusterDns {
        ClusterDns {
            servers: vec!["10.96.0.10".into()],
            domain: "cluster.local".into(),
        }
    }

    #[test]
    fn cluster_first_uses_cluster_dns_and_search_path() {
        let (dns, warnings) = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "ClusterFirst"})),
            &host(),
            &cluster(),
        );
        assert!(warnings.is_empty());
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            [
                "prod.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "example.com"
            ]
        );
        assert_eq!(dns.options, ["ndots:5"]);
    }

    #[test]
    fn policies_choose_the_resolver() {
        let default = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "Default"})),
            &host(),
            &cluster(),
        )
        .0;
        assert_eq!(default, host());
        let host_net = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "ClusterFirst", "hostNetwork": true})),
            &host(),
            &cluster(),
        )
        .0;
        assert_eq!(
            host_net,
            host(),
            "ClusterFirst on the host network is Default"
        );
        let with_host_net = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "ClusterFirstWithHostNet", "hostNetwork": true})),
            &host(),
            &cluster(),
        )
        .0;
        assert_eq!(with_host_net.servers, ["10.96.0.10"]);
        let (fallback, warnings) = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "ClusterFirst"})),
            &host(),
            &ClusterDns::default(),
        );
        assert_eq!(fallback, host());
        assert_eq!(warnings.len(), 1);
        let none = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["9.9.9.9"], "searches": ["a.b"], "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}})),
            &host(),
            &cluster(),
        )
        .0;
        assert_eq!(
            (none.servers, none.searches, none.options),
            (
                vec!["9.9.9.9".to_string()],
                vec!["a.b".to_string()],
                vec!["ndots:2".to_string(), "edns0".to_string()]
            )
        );
    }

    #[test]
    fn dns_config_merges_and_limits_apply() {
        let p = pod(serde_json::json!({
            "dnsPolicy": "ClusterFirst",
            "dnsConfig": {"nameservers": ["8.8.8.8", "8.8.4.4", "9.9.9.9"], "options": [{"name": "ndots", "value": "1"}]}
        }));
        let (dns, warnings) = dns_config(&p, &host(), &cluster());
        assert_eq!(dns.servers, ["10.96.0.10", "8.8.8.8", "8.8.4.4"]);
        assert_eq!(dns.options, ["ndots:1"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let (dns, warnings) = dns_config(
            &pod(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": many}})),
            &host(),
            &cluster(),
        );
        assert_eq!(dns.searches.len(), 32);
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn hostnames_fqdns_and_hosts_files() {
        let p = pod(
            serde_json::json!({"hostname": "db", "subdomain": "set", "hostAliases": [{"ip": "10.1.1.1", "hostnames": ["foo", "bar"]}]}),
        );
        assert_eq!(
            hostname_and_fqdn(&p, "cluster.local"),
            ("db".into(), Some("db.set.prod.svc.cluster.local".into()))
        );
        assert_eq!(sandbox_hostname(&p, "cluster.local"), "db");
        let fqdn = pod(
            serde_json::json!({"hostname": "db", "subdomain": "set", "setHostnameAsFQDN": true}),
        );
        assert_eq!(sandbox_hostname(&fqdn, ""), "db.set.prod.svc.");
        assert_eq!(fqdn_too_long(&fqdn, "cluster.local"), None);
        let long = pod(serde_json::json!({
            "hostname": "a-hostname-of-fifty-characters-or-so-for-this-test",
            "subdomain": "set", "setHostnameAsFQDN": true
        }));
        assert!(
            fqdn_too_long(&long, "cluster.local")
                .is_some_and(|m| m.contains("is too long (64 characters is the max")),
        );
        let hosts = etc_hosts(&p, &["10.0.0.7".into()], "cluster.local", "");
        assert!(hosts.contains("127.0.0.1\tlocalhost\n"));
        assert!(hosts.contains("10.0.0.7\tdb.set.prod.svc.cluster.local\tdb\n"));
        assert!(hosts.ends_with("# Entries added by HostAliases.\n10.1.1.1\tfoo\tbar\n"));
        let hn = pod(
            serde_json::json!({"hostNetwork": true, "hostAliases": [{"ip": "10.1.1.2", "hostnames": ["baz"]}]}),
        );
        assert_eq!(
            etc_hosts(&hn, &[], "", "127.0.0.1 node\n"),
            "127.0.0.1 node\n\n# Entries added by HostAliases.\n10.1.1.2\tbaz\n"
        );
        assert_eq!(sandbox_hostname(&hn, ""), "");
        let long = format!("{}-x", "a".repeat(62));
        let mut lp = pod(serde_json::json!({}));
        lp.metadata.name = Some(long);
        assert_eq!(
            hostname_and_fqdn(&lp, "").0,
            "a".repeat(62),
            "cut at 63, trailing '-' dropped"
        );
    }
}
