//! Which credentials each image the node pulled was pulled with, so that a pod may use an image
//! already on the node only if it could have pulled it itself (upstream's image pull manager,
//! `KubeletEnsureSecretPulledImages`). Kept in the root dir as upstream keeps it, one JSON file
//! per record named by the SHA-256 of its key: `image_manager/pulling/` holds an intent per
//! image being pulled (left behind by a crash mid-pull, it marks the image as pulled by the
//! node), `image_manager/pulled/` a record per image ID with the credentials it was pulled
//! with, by repository.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::runtime::cri;
use crate::types::{PullVerification, image_repository as repository};

/// A Secret a pull may come from, with the hash of the credentials it gave.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub credential_hash: String,
}

/// A service account a credential provider pulled for (kept from records nodelet reads).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct ServiceAccountRef {
    uid: String,
    namespace: String,
    name: String,
}

/// Who may use an image of one repository without pulling it again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Credentials {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kubernetes_secrets: Vec<SecretRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kubernetes_service_accounts: Vec<ServiceAccountRef>,
    /// Pulled with the node's own credentials, or none: every pod may use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    node_pods_accessible: bool,
}

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Intent {
    kind: String,
    api_version: String,
    image: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pulled {
    kind: String,
    api_version: String,
    last_updated_time: String,
    image_ref: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    credential_mapping: BTreeMap<String, Credentials>,
}

impl Pulled {
    /// Merges what a pull or a match learnt into the record; says whether it changed.
    fn merge(&mut self, repository: &str, learnt: Credentials) -> bool {
        let entry = self.credential_mapping.entry(repository.to_string());
        let had = match entry {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(learnt);
                return true;
            }
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        };
        if had.node_pods_accessible {
            return false;
        }
        if learnt.node_pods_accessible {
            *had = learnt;
            return true;
        }
        let mut changed = false;
        for secret in learnt.kubernetes_secrets {
            let same = |s: &SecretRef| {
                (s.uid.as_str(), s.namespace.as_str(), s.name.as_str())
                    == (
                        secret.uid.as_str(),
                        secret.namespace.as_str(),
                        secret.name.as_str(),
                    )
            };
            match had.kubernetes_secrets.iter_mut().find(|s| same(s)) {
                Some(s) if s.credential_hash == secret.credential_hash => {}
                Some(s) => {
                    *s = secret;
                    changed = true;
                }
                None => {
                    had.kubernetes_secrets.push(secret);
                    changed = true;
                }
            }
        }
        had.kubernetes_secrets.sort();
        changed
    }
}

/// Whether two image names are of the same repository once normalised (`busybox` is
/// `docker.io/library/busybox`).
fn same_repository(a: &str, b: &str) -> bool {
    let repo = |image: &str| super::parse_reference(image).map(|r| (r.domain, r.path));
    matches!((repo(a), repo(b)), (Ok(a), Ok(b)) if a == b)
}

/// A secret match writes its Secret into the record only while the record lists fewer.
const RECORD_WHILE_MATCHING_LIMIT: usize = 100;

/// The records of one root dir.
#[derive(Debug)]
pub struct PullRecords {
    verification: PullVerification,
    /// The repositories (or `prefix/*`) exempt under `NeverVerifyAllowlistedImages`.
    allowlist: Vec<String>,
    pulling: PathBuf,
    pulled: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Pulls under way, by image as written.
    in_flight: HashMap<String, u32>,
    /// The images with an intent on the disk, and the image IDs with a record there: read
    /// once at start, then kept as the files are written and removed.
    intents: HashSet<String>,
    records: HashSet<String>,
    /// Pulled records read or written, by image ID, with when each was last used (a tick).
    cache: HashMap<String, (Pulled, u64)>,
    tick: u64,
    /// How many records each kind of cache holds at most (upstream's sizes for maxPods).
    intents_size: usize,
    pulled_size: usize,
}

impl PullRecords {
    /// The records under `root_dir`, made private (0700) if new. The caches are sized as
    /// upstream's for `max_pods` pods and `max_parallel` pulls at once.
    pub fn open(
        root_dir: &Path,
        (verification, allowlist): (PullVerification, Vec<String>),
        max_pods: usize,
        max_parallel: usize,
    ) -> std::io::Result<PullRecords> {
        let dir = root_dir.join("image_manager");
        let (pulling, pulled) = (dir.join("pulling"), dir.join("pulled"));
        for d in [&dir, &pulling, &pulled] {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)?;
        }
        let intents = read_all::<Intent>(&pulling).into_iter();
        let mut state = State {
            in_flight: HashMap::new(),
            intents: intents.map(|i| i.image).collect(),
            records: HashSet::new(),
            cache: HashMap::new(),
            tick: 0,
            intents_size: (2 * max_pods).max(2 * max_parallel).clamp(1, 1024),
            pulled_size: (5 * max_pods).clamp(1, 2000),
        };
        for record in read_all::<Pulled>(&pulled) {
            state.records.insert(record.image_ref.clone());
            state.cache(record);
        }
        state.publish();
        Ok(PullRecords {
            verification,
            allowlist,
            pulling,
            pulled,
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns the intents a crash left behind into records for the images that made it onto the
    /// node (with no credentials: the next pod to use one pulls again); the others stay.
    pub fn recover(&self, images: &[cri::Image]) {
        let on_node: HashMap<&str, &str> = images
            .iter()
            .flat_map(|i| {
                (i.repo_tags.iter().chain(&i.repo_digests))
                    .map(|name| (name.as_str(), i.id.as_str()))
            })
            .collect();
        let mut state = self.lock();
        let cut_short: Vec<String> = state.intents.iter().cloned().collect();
        for image in cut_short {
            let Some(id) = on_node.get(image.as_str()) else {
                continue;
            };
            tracing::info!(%image, "an image pull was under way when the agent stopped; the image is on the node and its pull is recorded");
            let mut record = self.get(&mut state, id).unwrap_or_else(|| new_record(id));
            record
                .credential_mapping
                .entry(repository(&image).into())
                .or_default();
            self.put(&mut state, record);
            remove(&self.pulling.join(file_name(&image)));
            state.intents.remove(&image);
        }
        state.publish();
    }

    /// Whether a pod must pull `image` (as written), present on the node as `image_ref` (and
    /// `named` so by the runtime), to prove it may use it, given the pod's credentials for the
    /// image (`secrets`, asked for only when a record is to be matched), as upstream decides
    /// it; counted by result.
    ///
    /// One difference: upstream takes every name of an image ID the node pulled as pulled by
    /// the node, so a preloaded image stops working under its own name once the node pulls
    /// the same content under another. Here a name the runtime has for the image, under
    /// whose repository the node never pulled it, counts as preloaded. A reference by ID or by
    /// a name the runtime does not have is checked as upstream checks it.
    pub fn must_pull(
        &self,
        image: &str,
        image_ref: (&str, bool),
        secrets: impl FnOnce() -> Vec<SecretRef>,
    ) -> bool {
        let (must, result) = self.check(image, image_ref, secrets);
        crate::metrics::get().image_mustpull_check(result);
        must
    }

    fn check(
        &self,
        image: &str,
        (image_ref, named): (&str, bool),
        secrets: impl FnOnce() -> Vec<SecretRef>,
    ) -> (bool, &'static str) {
        let mut state = self.lock();
        let record = self.get(&mut state, image_ref);
        let pulling = state.in_flight.contains_key(image) || state.intents.contains(image);
        let pulled_under_this_name = record.as_ref().is_some_and(|r| {
            let same = |key: &String| same_repository(key, image);
            r.credential_mapping.keys().any(same)
        });
        let pulled_by_node = pulling || (record.is_some() && (!named || pulled_under_this_name));
        if !self
            .verification
            .requires(&self.allowlist, image, pulled_by_node)
        {
            return (false, "credentialPolicyAllowed");
        }
        let Some(mut record) = record else {
            return (true, "mustAuthenticate");
        };
        let repo = repository(image);
        let Some(known) = record.credential_mapping.get(repo) else {
            return (true, "mustAuthenticate");
        };
        if known.node_pods_accessible {
            return (false, "credentialRecordFound");
        }
        if known.kubernetes_secrets.is_empty() {
            return (true, "mustAuthenticate");
        }
        let listed = known.kubernetes_secrets.len();
        for secret in secrets() {
            let matched = known.kubernetes_secrets.iter().any(|k| {
                (!k.credential_hash.is_empty() && k.credential_hash == secret.credential_hash)
                    || (&k.uid, &k.namespace, &k.name)
                        == (&secret.uid, &secret.namespace, &secret.name)
            });
            if matched {
                // A new Secret of the same credentials, or new credentials of a known Secret,
                // is written down so that the next match is direct.
                let learnt = Credentials {
                    kubernetes_secrets: vec![secret.clone()],
                    ..Credentials::default()
                };
                if listed < RECORD_WHILE_MATCHING_LIMIT && record.merge(repo, learnt) {
                    record.last_updated_time = now();
                    self.put(&mut state, record);
                }
                return (false, "credentialRecordFound");
            }
        }
        (true, "mustAuthenticate")
    }

    /// A pull of `image` (as written) begins: its intent is on the disk until it ends.
    pub fn pull_started(&self, image: &str) -> std::io::Result<()> {
        let mut state = self.lock();
        let intent = Intent {
            kind: "ImagePullIntent".into(),
            api_version: API_VERSION.into(),
            image: image.into(),
        };
        write_json(&self.pulling, &file_name(image), &intent)?;
        *state.in_flight.entry(image.to_string()).or_default() += 1;
        state.intents.insert(image.to_string());
        state.publish();
        Ok(())
    }

    /// A pull of `image` ended: pulled as `image_ref` with a pod's Secret (`Some`), or with
    /// the node's credentials or none (`None`); or failed (`pulled` is `None`).
    pub fn pull_ended(&self, image: &str, pulled: Option<(&str, Option<SecretRef>)>) {
        let mut state = self.lock();
        if let Some((image_ref, secret)) = pulled {
            let learnt = match secret {
                Some(secret) => Credentials {
                    kubernetes_secrets: vec![secret],
                    ..Credentials::default()
                },
                None => Credentials {
                    node_pods_accessible: true,
                    ..Credentials::default()
                },
            };
            let mut record = self
                .get(&mut state, image_ref)
                .unwrap_or_else(|| new_record(image_ref));
            if record.merge(repository(image), learnt) {
                record.last_updated_time = now();
                self.put(&mut state, record);
            }
        }
        let left = state.in_flight.get(image).copied().unwrap_or(0);
        if left <= 1 {
            state.in_flight.remove(image);
            state.intents.remove(image);
            remove(&self.pulling.join(file_name(image)));
        } else {
            state.in_flight.insert(image.to_string(), left - 1);
        }
        state.publish();
    }

    /// After image GC removed images: drops the records of images no longer on the node that
    /// were last updated before the pass began.
    pub fn prune(&self, on_node: &HashSet<String>, began: std::time::SystemTime) {
        let began = k8s_openapi::jiff::Timestamp::try_from(began).unwrap_or_default();
        let mut state = self.lock();
        let gone: Vec<String> = (state.records.iter())
            .filter(|id| !on_node.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            let updated = self.get(&mut state, &id).and_then(|r| {
                (r.last_updated_time)
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()
            });
            if updated.is_none_or(|t| t < began) {
                tracing::info!(image = %id, "forgetting the pull record of an image no longer on the node");
                state.cache.remove(&id);
                state.records.remove(&id);
                remove(&self.pulled.join(file_name(&id)));
            }
        }
        state.publish();
    }

    /// The record of an image ID, from the cache or, for one the cache let go, the disk.
    fn get(&self, state: &mut State, image_ref: &str) -> Option<Pulled> {
        if !state.records.contains(image_ref) {
            return None;
        }
        state.tick += 1;
        let tick = state.tick;
        if let Some((record, used)) = state.cache.get_mut(image_ref) {
            *used = tick;
            return Some(record.clone());
        }
        let record: Pulled = read_json(&self.pulled.join(file_name(image_ref)))?;
        if record.image_ref != image_ref {
            return None;
        }
        state.cache(record.clone());
        Some(record)
    }

    /// Writes the record (the disk first) and keeps it in the cache.
    fn put(&self, state: &mut State, record: Pulled) {
        if let Err(e) = write_json(&self.pulled, &file_name(&record.image_ref), &record) {
            tracing::warn!(image = %record.image_ref, error = %e, "cannot write the image's pull record");
            return;
        }
        state.records.insert(record.image_ref.clone());
        state.cache(record);
        state.publish();
    }
}

impl State {
    /// Keeps the record in the cache, dropping the least recently used one when it is full.
    fn cache(&mut self, record: Pulled) {
        self.tick += 1;
        if self.cache.len() >= self.pulled_size && !self.cache.contains_key(&record.image_ref) {
            let oldest = (self.cache.iter())
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.cache.remove(&oldest);
            }
        }
        self.cache
            .insert(record.image_ref.clone(), (record, self.tick));
    }

    /// Sets upstream's gauges: the intents and records on the disk, and how full the caches
    /// are.
    fn publish(&self) {
        let percent = |n: usize, size: usize| (n * 100) as f64 / size as f64;
        crate::metrics::get().image_pull_records(
            (self.intents.len(), self.records.len()),
            (
                percent(self.in_flight.len(), self.intents_size),
                percent(self.cache.len(), self.pulled_size),
            ),
        );
    }
}

/// Every record of a directory that reads as one.
fn read_all<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<T> {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries
        .filter(|e| is_record(&e.file_name().to_string_lossy()))
        .filter_map(|e| read_json(&e.path()))
        .collect()
}

/// The hash of the credentials a Secret gives, as upstream computes it (SHA-256 of the JSON of
/// its user name and password).
pub fn credential_hash(auth: &cri::AuthConfig) -> String {
    #[derive(Serialize)]
    struct Login<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        username: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        password: &'a str,
    }
    let login = Login {
        username: &auth.username,
        password: &auth.password,
    };
    let json = serde_json::to_vec(&login).unwrap_or_default();
    hex(&Sha256::digest(&json))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn new_record(image_ref: &str) -> Pulled {
    Pulled {
        kind: "ImagePulledRecord".into(),
        api_version: API_VERSION.into(),
        last_updated_time: now(),
        image_ref: image_ref.into(),
        credential_mapping: BTreeMap::new(),
    }
}

/// Now, as the records' times are written (RFC 3339, whole seconds).
fn now() -> String {
    crate::types::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A record's file name: `sha256-` and the hex SHA-256 of its key.
fn file_name(key: &str) -> String {
    format!("sha256-{}", hex(&Sha256::digest(key.as_bytes())))
}

fn is_record(name: &str) -> bool {
    name.starts_with("sha256-") && !name.ends_with(".tmp")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes)
        .inspect_err(|e| tracing::warn!(file = %path.display(), error = %e, "cannot read an image pull record"))
        .ok()
}

/// Writes the file whole: a temporary file, renamed over it.
fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        remove(&tmp);
    }
    written
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), error = %e, "cannot remove an image pull record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, hash: &str) -> SecretRef {
        SecretRef {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            credential_hash: hash.into(),
        }
    }

    fn open(dir: &Path, policy: PullVerification) -> PullRecords {
        PullRecords::open(dir, (policy, Vec::new()), 110, 0).unwrap()
    }

    #[test]
    fn an_image_pulled_with_a_secret_needs_that_secret_or_its_credentials() {
        let tmp = tempfile::tempdir().unwrap();
        let records = open(tmp.path(), PullVerification::NeverVerifyPreloadedImages);
        let image = "reg.example/private/app:1";
        records.pull_started(image).unwrap();
        assert!(
            records.must_pull(image, ("sha256:a", false), Vec::new),
            "a pull under way marks the image as the node's"
        );
        records.pull_ended(image, Some(("sha256:a", Some(secret("one", "h1")))));
        assert!(
            !tmp.path()
                .join("image_manager/pulling")
                .join(file_name(image))
                .exists()
        );
        assert!(
            records.must_pull(image, ("sha256:a", false), Vec::new),
            "no credentials"
        );
        assert!(records.must_pull(image, ("sha256:a", false), || vec![secret("other", "h2")]));
        assert!(!records.must_pull(image, ("sha256:a", false), || vec![secret("one", "h1")]));
        assert!(
            !records.must_pull("reg.example/private/app:2", ("sha256:a", false), || vec![
                secret("twin", "h1")
            ]),
            "another Secret of the same credentials, under another tag of the repository"
        );
        // A name the runtime has for the same content, under another repository, is one the
        // image came by otherwise (preloaded); by its ID, or under the repository the node
        // pulled, it is checked.
        assert!(!records.must_pull("localhost/app:1", ("sha256:a", true), Vec::new));
        assert!(records.must_pull("sha256:a", ("sha256:a", false), Vec::new));
        assert!(records.must_pull("reg.example/private/app:9", ("sha256:a", true), Vec::new));
        // The twin is written down, and the record reads back from the disk.
        let again = open(tmp.path(), PullVerification::NeverVerifyPreloadedImages);
        let record = again.get(&mut again.lock(), "sha256:a").unwrap();
        let names: Vec<&str> = record.credential_mapping["reg.example/private/app"]
            .kubernetes_secrets
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["one", "twin"]);
        assert!(again.must_pull(image, ("sha256:a", false), Vec::new));
        assert!(
            !again.must_pull("other.example/app:1", ("sha256:b", false), Vec::new),
            "an image the node did not pull is not checked by default"
        );
        let always = open(tmp.path(), PullVerification::AlwaysVerify);
        assert!(always.must_pull("other.example/app:1", ("sha256:b", false), Vec::new));
        let never = open(tmp.path(), PullVerification::NeverVerify);
        assert!(!never.must_pull(image, ("sha256:a", false), Vec::new));
    }

    #[test]
    fn an_image_pulled_with_the_nodes_credentials_is_every_pods() {
        let tmp = tempfile::tempdir().unwrap();
        let records = open(tmp.path(), PullVerification::AlwaysVerify);
        records.pull_started("busybox").unwrap();
        records.pull_ended("busybox", Some(("sha256:b", None)));
        assert!(!records.must_pull("busybox:latest", ("sha256:b", false), Vec::new));
        // A later pull with a Secret takes nothing away.
        records.pull_started("busybox").unwrap();
        records.pull_ended("busybox", Some(("sha256:b", Some(secret("s", "h")))));
        assert!(!records.must_pull("busybox", ("sha256:b", false), Vec::new));
        records.pull_started("busybox").unwrap();
        records.pull_ended("busybox", None);
        assert!(!records.must_pull("busybox", ("sha256:b", false), Vec::new));
    }

    #[test]
    fn records_in_upstreams_format_are_read_and_a_cut_short_pull_is_settled() {
        let tmp = tempfile::tempdir().unwrap();
        // Files another agent wrote before this one started (the first open makes the
        // directories).
        open(tmp.path(), PullVerification::NeverVerifyPreloadedImages);
        let dir = tmp.path().join("image_manager");
        std::fs::write(
            dir.join("pulled").join(file_name("sha256:c")),
            r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2025-01-01T00:00:00Z","imageRef":"sha256:c","credentialMapping":{"reg.example/app":{"kubernetesSecrets":[{"uid":"u","namespace":"ns","name":"s","credentialHash":"h"}]}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("pulling").join(file_name("reg.example/cut:1")),
            r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"reg.example/cut:1"}"#,
        )
        .unwrap();
        let records = open(tmp.path(), PullVerification::NeverVerifyPreloadedImages);
        let known = SecretRef {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "s".into(),
            credential_hash: "h".into(),
        };
        assert!(!records.must_pull("reg.example/app:1", ("sha256:c", false), || vec![known]));
        assert!(records.must_pull("reg.example/app:1", ("sha256:c", false), Vec::new));

        let image = cri::Image {
            id: "sha256:d".into(),
            repo_tags: vec!["reg.example/cut:1".into()],
            ..Default::default()
        };
        records.recover(&[image]);
        assert!(
            !dir.join("pulling")
                .join(file_name("reg.example/cut:1"))
                .exists()
        );
        assert!(
            records.must_pull("reg.example/cut:1", ("sha256:d", false), Vec::new),
            "the credentials of a pull cut short are not known"
        );

        let far = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        records.prune(&HashSet::from(["sha256:c".to_string()]), far);
        assert!(
            dir.join("pulled").join(file_name("sha256:c")).exists(),
            "on the node"
        );
        assert!(
            !dir.join("pulled").join(file_name("sha256:d")).exists(),
            "gone from the node"
        );
    }

    #[test]
    fn the_credential_hash_is_upstreams() {
        let auth = cri::AuthConfig {
            username: "user".into(),
            password: "pass".into(),
            ..Default::default()
        };
        // sha256 of {"username":"user","password":"pass"}, as Go marshals upstream's AuthConfig.
        let json = r#"{"username":"user","password":"pass"}"#;
        assert_eq!(
            credential_hash(&auth),
            hex(&Sha256::digest(json.as_bytes()))
        );
    }
}
