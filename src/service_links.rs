//! Service links: the environment variables that tell a container where Services are, as
//! upstream's kubelet sets them (`FOO_SERVICE_HOST`, `FOO_SERVICE_PORT`, Docker-style
//! `FOO_PORT_80_TCP...`): the API server's `kubernetes` Service for every pod (in-cluster
//! clients find the API server by it), and the Services of the pod's namespace unless the pod
//! turns `enableServiceLinks` off. The Services come from the API server; standalone there are
//! none.

use std::sync::{Arc, RwLock};

/// A Service with a cluster IP, as its links need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: String,
    pub ports: Vec<Port>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub name: String,
    pub port: i32,
    /// Upper case, as the API spells it (TCP, UDP, SCTP).
    pub protocol: String,
}

impl Service {
    /// The links' view of an API Service; `None` for one without a cluster IP (headless or
    /// ExternalName), which has no links, as upstream.
    pub fn from_api(s: &k8s_openapi::api::core::v1::Service) -> Option<Service> {
        let spec = s.spec.as_ref()?;
        let cluster_ip = spec
            .cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None")?;
        Some(Service {
            namespace: s.metadata.namespace.clone().unwrap_or_default(),
            name: s.metadata.name.clone().unwrap_or_default(),
            cluster_ip,
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| Port {
                    name: p.name.clone().unwrap_or_default(),
                    port: p.port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                })
                .collect(),
        })
    }
}

/// The Services known to the node: `None` until the API server's have been listed once.
/// Written by the cluster's Service watch, read when containers are created.
#[derive(Clone)]
pub struct Store(Arc<RwLock<Option<Arc<Vec<Service>>>>>);

impl Store {
    /// A store for a node without an API server: no Services, and nothing to wait for.
    pub fn standalone() -> Store {
        Store(Arc::new(RwLock::new(Some(Arc::default()))))
    }

    /// A store that waits for the API server's Services.
    pub fn unlisted() -> Store {
        Store(Arc::new(RwLock::new(None)))
    }

    pub fn set(&self, services: Vec<Service>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(services));
    }

    /// The Services as of now; `None` before the first list.
    pub fn get(&self) -> Option<Arc<Vec<Service>>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The API server's own Services, linked into every pod.
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// The link variables of a pod in `namespace`, sorted by name.
pub fn variables(all: &[Service], namespace: &str, enable_links: bool) -> Vec<(String, String)> {
    let mut chosen: std::collections::BTreeMap<&str, &Service> = Default::default();
    for s in all {
        if s.namespace == MASTER_NAMESPACE && MASTER_SERVICES.contains(&s.name.as_str()) {
            chosen.entry(&s.name).or_insert(s);
        } else if s.namespace == namespace && enable_links {
            chosen.insert(&s.name, s);
        }
    }
    let mut vars: Vec<(String, String)> = chosen.values().flat_map(|s| links(s)).collect();
    vars.sort();
    vars
}

/// `my-svc` → `MY_SVC`.
fn env_name(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

fn links(s: &Service) -> Vec<(String, String)> {
    let prefix = env_name(&s.name);
    let Some(first) = s.ports.first() else {
        return vec![(format!("{prefix}_SERVICE_HOST"), s.cluster_ip.clone())];
    };
    let mut vars = vec![
        (format!("{prefix}_SERVICE_HOST"), s.cluster_ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for p in s.ports.iter().filter(|p| !p.name.is_empty()) {
        vars.push((
            format!("{prefix}_SERVICE_PORT_{}", env_name(&p.name)),
            p.port.to_string(),
        ));
    }
    let host = |p: &Port| match s.cluster_ip.contains(':') {
        true => format!("[{}]:{}", s.cluster_ip, p.port),
        false => format!("{}:{}", s.cluster_ip, p.port),
    };
    let proto = first.protocol.to_ascii_lowercase();
    vars.push((
        format!("{prefix}_PORT"),
        format!("{proto}://{}", host(first)),
    ));
    for p in &s.ports {
        let proto = p.protocol.to_ascii_lowercase();
        let base = format!(
            "{prefix}_PORT_{}_{}",
            p.port,
            p.protocol.to_ascii_uppercase()
        );
        vars.push((base.clone(), format!("{proto}://{}", host(p))));
        vars.push((format!("{base}_PROTO"), proto));
        vars.push((format!("{base}_PORT"), p.port.to_string()));
        vars.push((format!("{base}_ADDR"), s.cluster_ip.clone()));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(namespace: &str, name: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            namespace: namespace.into(),
            name: name.into(),
            cluster_ip: "10.96.0.10".into(),
            ports: ports
                .iter()
                .map(|(n, p, proto)| Port {
                    name: n.to_string(),
                    port: *p,
                    protocol: proto.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_service_links_its_host_ports_and_docker_style_variables() {
        let all = [svc(
            "web",
            "front-end",
            &[("http", 80, "TCP"), ("dns", 53, "UDP")],
        )];
        let vars: std::collections::BTreeMap<_, _> =
            variables(&all, "web", true).into_iter().collect();
        let want = [
            ("FRONT_END_SERVICE_HOST", "10.96.0.10"),
            ("FRONT_END_SERVICE_PORT", "80"),
            ("FRONT_END_SERVICE_PORT_HTTP", "80"),
            ("FRONT_END_SERVICE_PORT_DNS", "53"),
            ("FRONT_END_PORT", "tcp://10.96.0.10:80"),
            ("FRONT_END_PORT_80_TCP", "tcp://10.96.0.10:80"),
            ("FRONT_END_PORT_80_TCP_PROTO", "tcp"),
            ("FRONT_END_PORT_80_TCP_PORT", "80"),
            ("FRONT_END_PORT_80_TCP_ADDR", "10.96.0.10"),
            ("FRONT_END_PORT_53_UDP", "udp://10.96.0.10:53"),
            ("FRONT_END_PORT_53_UDP_PROTO", "udp"),
            ("FRONT_END_PORT_53_UDP_PORT", "53"),
            ("FRONT_END_PORT_53_UDP_ADDR", "10.96.0.10"),
        ];
        assert_eq!(vars.len(), want.len(), "{vars:?}");
        for (k, v) in want {
            assert_eq!(vars.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn the_api_servers_service_is_linked_into_every_namespace_even_without_links() {
        let all = [
            svc("default", "kubernetes", &[("https", 443, "TCP")]),
            svc("default", "other", &[("", 1, "TCP")]),
            svc("web", "mine", &[("", 2, "TCP")]),
        ];
        let names = |ns, links| -> Vec<String> {
            variables(&all, ns, links)
                .into_iter()
                .filter(|(k, _)| k.ends_with("_SERVICE_HOST"))
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(
            names("web", true),
            ["KUBERNETES_SERVICE_HOST", "MINE_SERVICE_HOST"]
        );
        assert_eq!(names("web", false), ["KUBERNETES_SERVICE_HOST"]);
        assert_eq!(
            names("default", true),
            ["KUBERNETES_SERVICE_HOST", "OTHER_SERVICE_HOST"]
        );
    }

    #[test]
    fn headless_and_external_services_have_no_links() {
        let headless: k8s_openapi::api::core::v1::Service = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "h", "namespace": "web"}, "spec": {"clusterIP": "None"}}),
        )
        .unwrap();
        assert_eq!(Service::from_api(&headless), None);
        let external: k8s_openapi::api::core::v1::Service = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "e", "namespace": "web"}, "spec": {"type": "ExternalName", "externalName": "example.test"}}),
        )
        .unwrap();
        assert_eq!(Service::from_api(&external), None);
    }
}
