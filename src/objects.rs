//! The data sources offer pods: ConfigMaps, Secrets and RuntimeClasses (beside static pods, or
//! from the API server) and, from the API server, service account tokens. The validated objects, a store of
//! them per source (one [`Writer`], the sync loop; cloneable [`Reader`]s, the pod sync), and which
//! objects a pod refers to. Values are never logged: `Debug` shows keys only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::pod::{ANNOTATION_CONFIG_SOURCE, is_config_key, is_dns1123_subdomain, spec};
use crate::service_links;
use crate::types::Source;

/// The most data one ConfigMap or Secret may hold, as upstream.
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024;

/// The kinds of object pods may refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
    /// A service account token issued for one pod (see [`token_name`]).
    ServiceAccountToken,
    /// A RuntimeClass (cluster-scoped: its namespace is empty): the runtime handler under
    /// [`HANDLER_KEY`], the pod overhead's quantities under `overhead/<resource>`.
    RuntimeClass,
}

impl Kind {
    /// The lower-case name upstream messages use (`configmap "x" not found`).
    pub fn lower(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::ServiceAccountToken => "service account token",
            Kind::RuntimeClass => "runtimeclass.node.k8s.io",
        }
    }

    /// Does an object of this kind live outside namespaces?
    pub fn is_cluster_scoped(self) -> bool {
        self == Kind::RuntimeClass
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::ServiceAccountToken => "ServiceAccountToken",
            Kind::RuntimeClass => "RuntimeClass",
        })
    }
}

/// One ConfigMap or Secret, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct Object {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// The API server's UID of the object (empty for objects from files).
    pub uid: String,
    /// Every key with its bytes: a ConfigMap's data and binaryData, a Secret's data with its
    /// stringData applied.
    pub data: BTreeMap<String, Vec<u8>>,
    /// The keys of a ConfigMap's binaryData, which environment variables cannot use.
    binary: BTreeSet<String>,
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Object")
            .field("kind", &self.kind)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Object {
    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The value an environment variable gets from `key` (a ConfigMap's text data only, as
    /// upstream).
    pub fn env_value(&self, key: &str) -> Option<String> {
        if self.binary.contains(key) {
            return None;
        }
        self.data
            .get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Every key `envFrom` takes, with its value.
    pub fn env_pairs(&self) -> impl Iterator<Item = (&str, String)> {
        self.data
            .iter()
            .filter(|(k, _)| !self.binary.contains(*k))
            .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
    }
}

fn check_meta(
    p: &mut Vec<String>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) {
    let name = meta.name.as_deref().unwrap_or_default();
    if !is_dns1123_subdomain(name) {
        p.push(format!(
            "metadata.name: {name:?} must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"
        ));
    }
    if let Some(ns) = meta.namespace.as_deref()
        && (ns.len() > 63 || ns.contains('.') || !is_dns1123_subdomain(ns))
    {
        p.push(format!(
            "metadata.namespace: {ns:?} must be a DNS-1123 label"
        ));
    }
}

fn check_keys<'a>(p: &mut Vec<String>, field: &str, keys: impl Iterator<Item = &'a String>) {
    for key in keys.filter(|k| !is_config_key(k)) {
        p.push(format!(
            "{field}[{key:?}]: a key must consist of letters, digits, '-', '_' or '.', and not be '.' or start with '..'"
        ));
    }
}

fn finish(
    kind: Kind,
    meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    data: BTreeMap<String, Vec<u8>>,
    binary: BTreeSet<String>,
    mut problems: Vec<String>,
) -> Result<Object, Vec<String>> {
    let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_OBJECT_BYTES {
        problems.push(format!(
            "data: {size} bytes, more than the {MAX_OBJECT_BYTES} bytes a {kind} may hold"
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Object {
        kind,
        namespace: meta.namespace.unwrap_or_else(|| "default".into()),
        name: meta.name.unwrap_or_default(),
        uid: meta.uid.unwrap_or_default(),
        data,
        binary,
    })
}

/// Validates a decoded ConfigMap, reporting every problem.
pub fn config_map(cm: ConfigMap) -> Result<Object, Vec<String>> {
    let mut p = Vec::new();
    check_meta(&mut p, &cm.metadata);
    let text = cm.data.unwrap_or_default();
    let bytes = cm.binary_data.unwrap_or_default();
    check_keys(&mut p, "data", text.keys());
    check_keys(&mut p, "binaryData", bytes.keys());
    for key in bytes.keys().filter(|k| text.contains_key(*k)) {
        p.push(format!(
            "binaryData[{key:?}]: the key is also in data; a key may appear once"
        ));
    }
    let binary = bytes.keys().cloned().collect();
    let data = text
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .chain(bytes.into_iter().map(|(k, v)| (k, v.0)))
        .collect();
    finish(Kind::ConfigMap, cm.metadata, data, binary, p)
}

/// Validates a decoded Secret (stringData wins over data, as the API server merges them).
pub fn secret(secret: Secret) -> Result<Object, Vec<String>> {
    let mut p = Vec::new();
    check_meta(&mut p, &secret.metadata);
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let strings = secret.string_data.unwrap_or_default();
    check_keys(&mut p, "data", data.keys());
    check_keys(&mut p, "stringData", strings.keys());
    data.extend(strings.into_iter().map(|(k, v)| (k, v.into_bytes())));
    finish(Kind::Secret, secret.metadata, data, BTreeSet::new(), p)
}

/// Where a RuntimeClass object keeps its handler.
pub const HANDLER_KEY: &str = "handler";

/// Where a RuntimeClass object keeps the pod overhead's quantities: this prefix and the resource.
const OVERHEAD_PREFIX: &str = "overhead/";

/// Validates a RuntimeClass as the API server does: a DNS-1123 subdomain name, a DNS-1123
/// label handler, valid overhead quantities.
pub fn runtime_class(rc: RuntimeClass) -> Result<Object, Vec<String>> {
    let mut p = Vec::new();
    check_meta(&mut p, &rc.metadata);
    if rc.handler.is_empty() {
        p.push("handler: Required value".into());
    } else if !crate::pod::is_dns1123_label(&rc.handler) {
        p.push(format!(
            "handler: {:?} must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)",
            rc.handler
        ));
    }
    let mut data = BTreeMap::from([(HANDLER_KEY.to_string(), rc.handler.into_bytes())]);
    let fixed = rc.overhead.and_then(|o| o.pod_fixed).unwrap_or_default();
    for (resource, q) in fixed {
        if crate::pod::parse_quantity(&q.0).is_none_or(|v| v < 0.0) {
            p.push(format!(
                "overhead.podFixed[{resource}]: not a non-negative quantity"
            ));
        }
        data.insert(format!("{OVERHEAD_PREFIX}{resource}"), q.0.into_bytes());
    }
    let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        namespace: Some(String::new()),
        ..rc.metadata
    };
    finish(Kind::RuntimeClass, meta, data, BTreeSet::new(), p)
}

/// Gives each pod that names a RuntimeClass of `objects` with an overhead and sets none itself
/// that overhead, as the API server's RuntimeClass admission does for API pods.
pub fn admit_overhead(pods: &mut [Arc<Pod>], objects: &[Object]) {
    for pod in pods {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let Some(class) = spec.runtime_class_name.as_deref() else {
            continue;
        };
        if spec.overhead.is_some() {
            continue;
        }
        let Some(rc) = objects
            .iter()
            .find(|o| o.kind == Kind::RuntimeClass && o.name == class)
        else {
            continue;
        };
        let overhead: BTreeMap<String, Quantity> = rc
            .data
            .iter()
            .filter_map(|(k, v)| {
                let resource = k.strip_prefix(OVERHEAD_PREFIX)?;
                Some((
                    resource.to_string(),
                    Quantity(String::from_utf8_lossy(v).into()),
                ))
            })
            .collect();
        if !overhead.is_empty()
            && let Some(spec) = Arc::make_mut(pod).spec.as_mut()
        {
            spec.overhead = Some(overhead);
        }
    }
}

/// The key of a service account token's one file.
pub const TOKEN_KEY: &str = "token";

/// The store name of the token issued for the pod `uid` with this expiry and audience (empty:
/// the API server's own).
pub fn token_name(uid: &str, expiration_seconds: i64, audience: &str) -> String {
    format!("{uid}/{expiration_seconds}/{audience}")
}

/// A service account token issued to a pod, as an object of its namespace.
pub fn token(namespace: &str, name: &str, token: &str) -> Object {
    Object {
        kind: Kind::ServiceAccountToken,
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: String::new(),
        data: BTreeMap::from([(TOKEN_KEY.to_string(), token.as_bytes().to_vec())]),
        binary: BTreeSet::new(),
    }
}

/// A token a pod's projected volumes ask for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenRequest {
    /// The token's name in the store ([`token_name`]).
    pub name: String,
    pub service_account: String,
    /// Empty: the API server's own audiences.
    pub audience: String,
    pub expiration_seconds: i64,
}

/// How long a projected token lives when the pod does not say (the API server's default).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// The tokens `pod`'s projected volumes ask for.
pub fn token_requests(pod: &Pod) -> Vec<TokenRequest> {
    let s = spec(pod);
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let account = s
        .service_account_name
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "default".into());
    let mut out: Vec<TokenRequest> = s
        .volumes
        .iter()
        .flatten()
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .filter_map(|p| p.service_account_token.as_ref())
        .map(|t| {
            let audience = t.audience.clone().unwrap_or_default();
            let expiration = t.expiration_seconds.unwrap_or(TOKEN_EXPIRATION_SECONDS);
            TokenRequest {
                name: token_name(uid, expiration, &audience),
                service_account: account.clone(),
                audience,
                expiration_seconds: expiration,
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// An object's identity in the store: kind, namespace, name.
pub type Key = (Kind, String, String);

type Set = Arc<HashMap<Key, Arc<Object>>>;

/// Writes the store; there is one (the sync loop).
pub struct Writer {
    state: Arc<RwLock<HashMap<Source, Set>>>,
}

/// Reads the store; clone freely.
#[derive(Clone)]
pub struct Reader {
    state: Arc<RwLock<HashMap<Source, Set>>>,
    url_local_secrets: bool,
    services: service_links::Store,
}

/// A new, empty store. With `url_local_secrets` (`--manifest-url-local-secrets`), pods from
/// the manifest URL may use the manifest directory's Secrets. Views also carry the Services
/// of `services`, for the containers' service links.
pub fn store(url_local_secrets: bool, services: service_links::Store) -> (Writer, Reader) {
    let state = Arc::new(RwLock::new(HashMap::new()));
    (
        Writer {
            state: state.clone(),
        },
        Reader {
            state,
            url_local_secrets,
            services,
        },
    )
}

impl Writer {
    /// Replaces the objects of `source` and returns the keys that were added, changed or removed.
    /// Of two objects with one key, the first is kept.
    pub fn replace(&self, source: Source, objects: Vec<Object>) -> Vec<Key> {
        let mut new: HashMap<Key, Arc<Object>> = HashMap::new();
        for o in objects {
            let key = (o.kind, o.namespace.clone(), o.name.clone());
            if new.contains_key(&key) {
                tracing::warn!(%source, kind = %o.kind, object = %o.full_name(), "duplicate object in one source; keeping the first one");
                continue;
            }
            new.insert(key, Arc::new(o));
        }
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let old = state.get(&source).cloned().unwrap_or_default();
        let mut changed: Vec<Key> = new
            .iter()
            .filter(|(k, o)| old.get(*k) != Some(*o))
            .map(|(k, _)| k.clone())
            .chain(old.keys().filter(|k| !new.contains_key(*k)).cloned())
            .collect();
        changed.sort();
        state.insert(source, Arc::new(new));
        changed
    }
}

impl Reader {
    /// The objects `pod` may use: those of its own source first, then the ConfigMaps of the
    /// other local source. Secrets never cross from one source to another (whoever serves the
    /// manifest URL, or can tamper with a plain-HTTP fetch, gets no Secret of the manifest
    /// directory) unless the operator lets URL pods use the directory's. A pod from the API
    /// server uses the API server's objects only, so a static pod never depends on the API
    /// server and an API pod never on local files.
    pub fn view(&self, pod: &Pod) -> View {
        let own = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CONFIG_SOURCE))
            .and_then(|s| Source::parse(s));
        let order: &[(Source, bool)] = match own {
            Some(Source::Api) => &[(Source::Api, true)],
            Some(Source::Http) if self.url_local_secrets => {
                &[(Source::Http, true), (Source::File, true)]
            }
            Some(Source::Http) => &[(Source::Http, true), (Source::File, false)],
            _ => &[(Source::File, true), (Source::Http, false)],
        };
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        View {
            namespace: crate::types::namespace(pod).to_string(),
            sets: order
                .iter()
                .filter_map(|(s, secrets)| Some((state.get(s).cloned()?, *secrets)))
                .collect(),
            services: self.services.get(),
        }
    }
}

/// The objects one pod may use, as of when the view was taken.
pub struct View {
    namespace: String,
    /// In lookup order, each with whether its Secrets may be used.
    sets: Vec<(Set, bool)>,
    /// The node's Services; `None` before the API server's were listed once.
    services: Option<Arc<Vec<service_links::Service>>>,
}

impl View {
    /// A view with no objects and no Services, for pods that use none.
    pub fn empty(namespace: &str) -> View {
        View {
            namespace: namespace.into(),
            sets: Vec::new(),
            services: Some(Arc::default()),
        }
    }

    /// The service link variables of a pod in this view's namespace; `None` before the API
    /// server's Services were listed once.
    pub fn service_links(&self, enable_links: bool) -> Option<Vec<(String, String)>> {
        let all = self.services.as_ref()?;
        Some(service_links::variables(all, &self.namespace, enable_links))
    }

    /// The object of this kind and name in the pod's namespace.
    pub fn get(&self, kind: Kind, name: &str) -> Option<Arc<Object>> {
        let namespace = if kind.is_cluster_scoped() {
            String::new()
        } else {
            self.namespace.clone()
        };
        let key = (kind, namespace, name.to_string());
        self.sets
            .iter()
            .filter(|(_, secrets)| *secrets || kind != Kind::Secret)
            .find_map(|(s, _)| s.get(&key).cloned())
    }

    /// The message of a missing object, as upstream words it.
    pub fn not_found(kind: Kind, name: &str) -> String {
        format!("{} {name:?} not found", kind.lower())
    }

    /// The message of a missing key, as upstream words it.
    pub fn no_key(&self, kind: Kind, name: &str, key: &str) -> String {
        format!(
            "couldn't find key {key} in {kind} {}/{name}",
            self.namespace
        )
    }
}

/// Every object the pod refers to, by key: the pod's namespace, or none for cluster-scoped kinds.
pub fn references(pod: &Pod) -> BTreeSet<Key> {
    let namespace = crate::types::namespace(pod);
    names(pod)
        .into_iter()
        .map(|(kind, name)| {
            let ns = if kind.is_cluster_scoped() {
                ""
            } else {
                namespace
            };
            (kind, ns.to_string(), name)
        })
        .collect()
}

/// Every object the pod refers to, by kind and name.
fn names(pod: &Pod) -> BTreeSet<(Kind, String)> {
    let mut out = BTreeSet::new();
    let s = spec(pod);
    if let Some(class) = s.runtime_class_name.as_ref().filter(|c| !c.is_empty()) {
        out.insert((Kind::RuntimeClass, class.clone()));
    }
    let ephemeral = crate::pod::ephemeral_containers(s);
    for c in crate::pod::all_containers(s).chain(&ephemeral) {
        for e in c.env.iter().flatten() {
            let Some(from) = &e.value_from else { continue };
            if let Some(r) = &from.config_map_key_ref {
                out.insert((Kind::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &from.secret_key_ref {
                out.insert((Kind::Secret, r.name.clone()));
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                out.insert((Kind::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &e.secret_ref {
                out.insert((Kind::Secret, r.name.clone()));
            }
        }
    }
    for v in s.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            out.insert((Kind::ConfigMap, cm.name.clone()));
        }
        if let Some(sec) = &v.secret {
            out.insert((Kind::Secret, sec.secret_name.clone().unwrap_or_default()));
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &p.config_map {
                out.insert((Kind::ConfigMap, cm.name.clone()));
            }
            if let Some(sec) = &p.secret {
                out.insert((Kind::Secret, sec.name.clone()));
            }
        }
    }
    for secret in s.image_pull_secrets.iter().flatten() {
        out.insert((Kind::Secret, secret.name.clone()));
    }
    out.extend(
        token_requests(pod)
            .into_iter()
            .map(|t| (Kind::ServiceAccountToken, t.name)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(yaml: &str) -> Result<Object, Vec<String>> {
        config_map(serde_yaml_ng::from_str(yaml).unwrap())
    }

    #[test]
    fn config_maps_are_validated_with_every_problem() {
        let good = cm("metadata: {name: app}\ndata: {a.conf: x}\nbinaryData: {b: AAEC}\n").unwrap();
        assert_eq!(good.namespace, "default");
        assert_eq!(good.data["b"], vec![0, 1, 2]);
        assert_eq!(good.env_value("a.conf").as_deref(), Some("x"));
        assert_eq!(good.env_value("b"), None, "binary keys are not env values");
        let err =
            cm("metadata: {name: Bad}\ndata: {'..x': a, 'a b': c, d: e}\nbinaryData: {d: AA==}\n")
                .unwrap_err();
        let all = err.join("\n");
        for needle in [
            "metadata.name",
            "data[\"..x\"]",
            "data[\"a b\"]",
            "binaryData[\"d\"]",
        ] {
            assert!(all.contains(needle), "{needle} in {all}");
        }
        let big = "x".repeat(MAX_OBJECT_BYTES);
        let err = cm(&format!("metadata: {{name: big}}\ndata: {{k: {big}}}\n")).unwrap_err();
        assert!(err[0].contains("more than"), "{err:?}");
    }

    #[test]
    fn string_data_wins_and_debug_hides_values() {
        let s: Secret = serde_yaml_ng::from_str(
            "metadata: {name: s, namespace: ops}\ndata: {a: aGlkZGVu, b: b2xk}\nstringData: {b: new}\n",
        )
        .unwrap();
        let s = secret(s).unwrap();
        assert_eq!(s.data["a"], b"hidden");
        assert_eq!(s.data["b"], b"new");
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hidden") && shown.contains("\"a\""),
            "{shown}"
        );
    }

    #[test]
    fn replace_reports_changes_and_views_prefer_the_pods_source() {
        let (writer, reader) = store(false, crate::service_links::Store::standalone());
        let a = cm("metadata: {name: a}\ndata: {k: file}\n").unwrap();
        let b = cm("metadata: {name: b}\ndata: {k: v}\n").unwrap();
        let changed = writer.replace(Source::File, vec![a.clone(), b.clone()]);
        assert_eq!(changed.len(), 2);
        assert!(writer.replace(Source::File, vec![a.clone(), b]).is_empty());
        assert_eq!(writer.replace(Source::File, vec![a]).len(), 1, "b removed");
        let from_url = cm("metadata: {name: a}\ndata: {k: url}\n").unwrap();
        writer.replace(Source::Http, vec![from_url]);
        let pod = |source: &str| -> Pod {
            serde_yaml_ng::from_str(&format!(
                "metadata: {{name: p, annotations: {{kubernetes.io/config.source: {source}}}}}\n"
            ))
            .unwrap()
        };
        let value = |source| {
            reader
                .view(&pod(source))
                .get(Kind::ConfigMap, "a")
                .unwrap()
                .data["k"]
                .clone()
        };
        assert_eq!(value("file"), b"file");
        assert_eq!(value("http"), b"url");
        assert!(reader.view(&pod("api")).get(Kind::ConfigMap, "a").is_none());
        assert!(reader.view(&pod("file")).get(Kind::Secret, "a").is_none());

        // Secrets stay with their source unless URL pods are let use the directory's.
        let sec = |name: &str| -> Object {
            secret(
                serde_yaml_ng::from_str(&format!(
                    "metadata: {{name: {name}}}\nstringData: {{k: v}}\n"
                ))
                .unwrap(),
            )
            .unwrap()
        };
        writer.replace(Source::File, vec![sec("local")]);
        writer.replace(Source::Http, vec![sec("remote")]);
        let found = |reader: &Reader, source, name| {
            reader.view(&pod(source)).get(Kind::Secret, name).is_some()
        };
        assert!(found(&reader, "file", "local") && found(&reader, "http", "remote"));
        assert!(
            !found(&reader, "http", "local"),
            "a URL pod read a local Secret"
        );
        assert!(
            !found(&reader, "file", "remote"),
            "a URL's Secret filled in for a file pod"
        );
        let (opened, allowing) = store(true, service_links::Store::standalone());
        opened.replace(Source::File, vec![sec("local")]);
        assert!(found(&allowing, "http", "local"));
    }

    #[test]
    fn references_cover_env_env_from_and_volumes() {
        let pod: Pod = serde_yaml_ng::from_str(
            "metadata: {name: p}\nspec:\n  containers:\n  - name: c\n    env:\n    - {name: A, valueFrom: {configMapKeyRef: {name: one, key: k}}}\n    - {name: B, valueFrom: {secretKeyRef: {name: two, key: k}}}\n    envFrom: [{configMapRef: {name: three}}]\n  volumes:\n  - {name: v, secret: {secretName: four}}\n  - {name: w, projected: {sources: [{configMap: {name: five}}]}}\n  runtimeClassName: six\n",
        )
        .unwrap();
        let refs: Vec<String> = references(&pod)
            .into_iter()
            .map(|(k, ns, n)| format!("{k}/{ns}/{n}"))
            .collect();
        assert_eq!(
            refs,
            [
                "ConfigMap/default/five",
                "ConfigMap/default/one",
                "ConfigMap/default/three",
                "Secret/default/four",
                "Secret/default/two",
                "RuntimeClass//six"
            ]
        );
    }

    #[test]
    fn a_runtime_class_is_checked_and_gives_its_overhead_to_pods_that_set_none() {
        let rc: RuntimeClass = serde_yaml_ng::from_str(
            "metadata: {name: fast}\nhandler: runc-fast\noverhead: {podFixed: {cpu: 250m, memory: 64Mi}}\n",
        )
        .unwrap();
        let object = runtime_class(rc).unwrap();
        assert_eq!(object.namespace, "");
        assert_eq!(object.data[HANDLER_KEY], b"runc-fast");
        let bad: RuntimeClass =
            serde_yaml_ng::from_str("metadata: {name: Bad}\nhandler: no_underscores\n").unwrap();
        assert_eq!(runtime_class(bad).unwrap_err().len(), 2);
        let pod = |extra: &str| -> Pod {
            serde_yaml_ng::from_str(&format!(
                "metadata: {{name: p}}\nspec: {{runtimeClassName: fast, containers: []{extra}}}\n"
            ))
            .unwrap()
        };
        let mut pods = [pod(""), pod(", overhead: {cpu: 1}")].map(Arc::new);
        admit_overhead(&mut pods, std::slice::from_ref(&object));
        let overhead = |p: &Pod| p.spec.as_ref().unwrap().overhead.clone().unwrap();
        assert_eq!(overhead(&pods[0])["cpu"].0, "250m");
        assert_eq!(overhead(&pods[0])["memory"].0, "64Mi");
        assert_eq!(overhead(&pods[1]).len(), 1, "a pod's own overhead stays");
    }
}
