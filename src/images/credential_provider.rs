//! Kubelet credential provider plugins (`--image-credential-provider-config`,
//! `--image-credential-provider-bin-dir`): executables that hand out registry credentials for
//! the images their `matchImages` cover, over upstream's exec protocol
//! (`credentialprovider.kubelet.k8s.io`: a CredentialProviderRequest on standard input, a
//! CredentialProviderResponse on standard output). Answers are cached per image, registry or
//! globally, as the plugin's `cacheKeyType` says, for its `cacheDuration` or the provider's
//! `defaultCacheDuration`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::keyring::{Credential, Keyring};
use crate::config::parse_duration;

/// The versions of the exec protocol upstream speaks.
const API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

/// How long a plugin may run (upstream's catch-all).
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// The cache key of a plugin's answer that holds for every image.
const GLOBAL_KEY: &str = "<global>";

/// A plugin's standard error is cut to this much in messages.
const STDERR_SHOWN: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the credential provider config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("credential provider config {path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("plugin binary directory {0} did not exist")]
    NoBinDir(PathBuf),
    #[error("plugin binary executable {0} did not exist")]
    NoPlugin(PathBuf),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    api_version: String,
    kind: String,
    #[serde(default)]
    providers: Vec<ProviderSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProviderSpec {
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    token_attributes: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvVar {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    api_version: String,
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// One configured plugin.
struct Provider {
    name: String,
    program: PathBuf,
    match_images: Vec<String>,
    default_cache: Duration,
    api_version: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Cached answers by key (an image, a registry or [`GLOBAL_KEY`]), with their expiry. The
    /// lock is held across a plugin run so that concurrent pulls ask it once.
    cache: tokio::sync::Mutex<HashMap<String, (Instant, Keyring)>>,
}

/// The configured plugins, in the config's order.
pub struct Providers {
    providers: Vec<Provider>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.providers.iter().map(|p| &p.name))
            .finish()
    }
}

/// The configuration files: `config` itself, or the .json, .yaml and .yml files of the directory
/// it names, in name order.
fn config_files(config: &Path) -> Result<Vec<PathBuf>, Error> {
    if config.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(config)
            .map_err(|source| Error::Read {
                path: config.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("json" | "yaml" | "yml")
                    )
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::Invalid {
                path: config.to_path_buf(),
                why: "no configuration files (.json, .yaml, .yml) in the directory".into(),
            });
        }
        Ok(files)
    } else {
        Ok(vec![config.to_path_buf()])
    }
}

impl Providers {
    /// Reads the config (a file, or a directory whose .json/.yaml/.yml files are merged in name
    /// order), checks it as upstream does, and finds each plugin in `bin_dir`.
    pub fn load(config: &Path, bin_dir: &Path) -> Result<Providers, Error> {
        if !bin_dir.is_dir() {
            return Err(Error::NoBinDir(bin_dir.to_path_buf()));
        }
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let files = config_files(config)?;
        let mut providers: Vec<Provider> = Vec::new();
        for file in files {
            let invalid = |why: String| Error::Invalid {
                path: file.clone(),
                why,
            };
            let text = read(&file)?;
            let value = crate::pod::yaml::from_str(&text)
                .map_err(|e| invalid(crate::pod::yaml::error_text(&e)))?;
            let parsed: ConfigFile =
                serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
            let problems = check(&parsed, &providers);
            if !problems.is_empty() {
                return Err(invalid(problems.join("; ")));
            }
            for spec in parsed.providers {
                let program = bin_dir.join(&spec.name);
                if !is_executable(&program) {
                    return Err(Error::NoPlugin(program));
                }
                let default_cache = spec
                    .default_cache_duration
                    .as_deref()
                    .map(parse_duration)
                    .transpose()
                    .map_err(|why| invalid(format!("providers.defaultCacheDuration: {why}")))?
                    .unwrap_or_default();
                providers.push(Provider {
                    name: spec.name,
                    program,
                    match_images: spec
                        .match_images
                        .iter()
                        .map(|m| super::keyring::normalize_key(m))
                        .collect(),
                    default_cache,
                    api_version: spec.api_version,
                    args: spec.args,
                    env: spec.env.into_iter().map(|e| (e.name, e.value)).collect(),
                    cache: tokio::sync::Mutex::default(),
                });
            }
        }
        Ok(Providers { providers })
    }

    /// The credentials the plugins give for an image (`domain`/`path`, no tag), in the
    /// config's order. A plugin that fails is reported and gives none.
    pub async fn lookup(&self, domain: &str, path: &str) -> Vec<Credential> {
        let image = format!("{domain}/{path}");
        let mut out = Vec::new();
        for p in &self.providers {
            if !p
                .match_images
                .iter()
                .any(|m| super::keyring::matches(m, domain, path))
            {
                continue;
            }
            match p.provide(&image, domain).await {
                Ok(keyring) => out.extend(keyring.lookup(domain, path)),
                Err(why) => {
                    tracing::warn!(plugin = %p.name, %image, "no credentials from the credential provider plugin: {why}");
                }
            }
        }
        out
    }
}

/// Upstream's checks of a config file; `earlier` are the providers of files read before.
fn check(c: &ConfigFile, earlier: &[Provider]) -> Vec<String> {
    let mut problems = Vec::new();
    if c.api_version != "kubelet.config.k8s.io/v1" || c.kind != "CredentialProviderConfig" {
        problems.push(format!(
            "want apiVersion kubelet.config.k8s.io/v1 and kind CredentialProviderConfig, not {} {}",
            c.api_version, c.kind
        ));
    }
    if c.providers.is_empty() {
        problems.push("providers: Required value: at least 1 item in plugins is required".into());
    }
    let mut seen: Vec<&str> = earlier.iter().map(|p| p.name.as_str()).collect();
    for p in &c.providers {
        let name = &p.name;
        if name.is_empty()
            || name.contains('/')
            || name.contains(' ')
            || name == "."
            || name == ".."
        {
            problems.push(format!(
                "providers.name: Invalid value {name:?}: a provider name is a file name in the bin dir (no '/', no spaces, not '.' or '..')"
            ));
        }
        if seen.contains(&name.as_str()) {
            problems.push(format!("providers.name: Duplicate value: {name:?}"));
        }
        seen.push(name);
        if p.api_version.is_empty() {
            problems.push(format!("providers[{name}].apiVersion: Required value"));
        } else if !API_VERSIONS.contains(&p.api_version.as_str()) {
            problems.push(format!(
                "providers[{name}].apiVersion: Unsupported value {:?}: supported values: {}",
                p.api_version,
                API_VERSIONS.join(", ")
            ));
        }
        if p.match_images.is_empty() {
            problems.push(format!(
                "providers[{name}].matchImages: Required value: at least 1 item in matchImages is required"
            ));
        }
        for m in &p.match_images {
            if m.trim().is_empty() || m.contains(char::is_whitespace) {
                problems.push(format!(
                    "providers[{name}].matchImages: Invalid value {m:?}: match image is invalid"
                ));
            }
        }
        match p.default_cache_duration.as_deref() {
            None => problems.push(format!(
                "providers[{name}].defaultCacheDuration: Required value"
            )),
            Some(d) => {
                if let Err(why) = parse_duration(d) {
                    problems.push(format!(
                        "providers[{name}].defaultCacheDuration: Invalid value: {why}"
                    ));
                }
            }
        }
        if p.token_attributes.is_some() {
            problems.push(format!(
                "providers[{name}].tokenAttributes: Forbidden: service account tokens for credential providers are not supported by nodelet"
            ));
        }
        for e in &p.env {
            if e.name.is_empty() || e.name.contains('=') {
                problems.push(format!(
                    "providers[{name}].env.name: Invalid value {:?}",
                    e.name
                ));
            }
        }
    }
    problems
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Provider {
    /// The plugin's answer for `image`: cached by image, registry or globally, else asked.
    async fn provide(&self, image: &str, registry: &str) -> Result<Keyring, String> {
        let mut cache = self.cache.lock().await;
        let now = Instant::now();
        cache.retain(|_, (expires, _)| *expires > now);
        for key in [image, registry, GLOBAL_KEY] {
            if let Some((_, keyring)) = cache.get(key) {
                return Ok(keyring.clone());
            }
        }
        let response = self.exec(image).await?;
        let key = match response.cache_key_type.as_str() {
            "Image" => image,
            "Registry" => registry,
            "Global" => GLOBAL_KEY,
            other => {
                return Err(format!(
                    "credential provider plugin did not return a valid cacheKeyType: {other:?}"
                ));
            }
        };
        let keyring = Keyring::from_entries(response.auth.into_iter().map(|(k, a)| {
            (
                k,
                Credential {
                    username: a.username,
                    password: a.password,
                    ..Credential::default()
                },
            )
        }));
        let ttl = match response.cache_duration.as_deref() {
            Some(d) => parse_duration(d).map_err(|why| format!("cacheDuration: {why}"))?,
            None => self.default_cache,
        };
        if !ttl.is_zero() {
            cache.insert(key.to_string(), (now + ttl, keyring.clone()));
        }
        Ok(keyring)
    }

    /// Runs the plugin for one image and reads its response.
    async fn exec(&self, image: &str) -> Result<Response, String> {
        let request = serde_json::json!({
            "apiVersion": self.api_version,
            "kind": "CredentialProviderRequest",
            "image": image,
        });
        let mut child = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A plugin that does not read its request is judged by its answer alone.
            let _ = stdin.write_all(request.to_string().as_bytes()).await;
        }
        let output = tokio::time::timeout(EXEC_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| format!("no answer within {}s", EXEC_TIMEOUT.as_secs()))?
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let shown: String = stderr
                .chars()
                .take(STDERR_SHOWN)
                .flat_map(char::escape_default)
                .collect();
            return Err(format!("the plugin {}: {shown}", output.status));
        }
        let response: Response = serde_json::from_slice(&output.stdout)
            .map_err(|_| "error decoding credential provider plugin response from stdout")?;
        if response.api_version != self.api_version {
            return Err(format!(
                "apiVersion from credential plugin response did not match expected apiVersion:{}, actual apiVersion:{}",
                self.api_version, response.api_version
            ));
        }
        if response.kind != "CredentialProviderResponse" {
            return Err(format!(
                "failed to decode CredentialProviderResponse, unexpected Kind: {:?}",
                response.kind
            ));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A plugin script that logs each request to `calls` and answers with `answer`.
    fn plugin(dir: &Path, name: &str, answer: &str) -> PathBuf {
        let calls = dir.join(format!("{name}.calls"));
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ncat >>{calls}\necho >>{calls}\ncat <<'EOF'\n{answer}\nEOF\n",
                calls = calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        calls
    }

    fn config(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n{body}"),
        )
        .unwrap();
        path
    }

    const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

    #[tokio::test]
    async fn a_plugin_is_asked_for_matching_images_and_its_answer_cached_by_registry() {
        let tmp = tempfile::tempdir().unwrap();
        let calls = plugin(
            tmp.path(),
            "reg-login",
            &format!(
                r#"{{"apiVersion": "{V1}", "kind": "CredentialProviderResponse", "cacheKeyType": "Registry",
                    "auth": {{"*.example.com": {{"username": "u", "password": "p"}}}}}}"#
            ),
        );
        let cfg = config(
            tmp.path(),
            &format!(
                "providers:\n- name: reg-login\n  matchImages: ['*.example.com']\n  defaultCacheDuration: 1h\n  apiVersion: {V1}\n"
            ),
        );
        let providers = Providers::load(&cfg, tmp.path()).unwrap();
        assert!(providers.lookup("other.org", "a/b").await.is_empty());
        let found = providers.lookup("r.example.com", "team/app").await;
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].username.as_str(), found[0].password.as_str()),
            ("u", "p")
        );
        assert_eq!(
            providers.lookup("r.example.com", "team/other").await.len(),
            1
        );
        let asked = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(
            asked.lines().count(),
            1,
            "the registry's answer is cached: {asked}"
        );
        let request: serde_json::Value = serde_json::from_str(asked.trim()).unwrap();
        assert_eq!(request["kind"], "CredentialProviderRequest");
        assert_eq!(request["apiVersion"], V1);
        assert_eq!(request["image"], "r.example.com/team/app");
    }

    #[tokio::test]
    async fn a_zero_cache_duration_asks_every_time_and_a_bad_answer_gives_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let calls = plugin(
            tmp.path(),
            "p",
            &format!(
                r#"{{"apiVersion": "{V1}", "kind": "CredentialProviderResponse", "cacheKeyType": "Image",
                    "cacheDuration": "0s", "auth": {{"r.example.com": {{"username": "u", "password": "p"}}}}}}"#
            ),
        );
        plugin(
            tmp.path(),
            "wrong-version",
            r#"{"apiVersion": "credentialprovider.kubelet.k8s.io/v1beta1", "kind": "CredentialProviderResponse", "cacheKeyType": "Image"}"#,
        );
        let cfg = config(
            tmp.path(),
            &format!(
                "providers:\n- name: p\n  matchImages: [r.example.com]\n  defaultCacheDuration: 1h\n  apiVersion: {V1}\n\
                 - name: wrong-version\n  matchImages: [r.example.com]\n  defaultCacheDuration: 1h\n  apiVersion: {V1}\n"
            ),
        );
        let providers = Providers::load(&cfg, tmp.path()).unwrap();
        for _ in 0..2 {
            assert_eq!(providers.lookup("r.example.com", "x").await.len(), 1);
        }
        assert_eq!(std::fs::read_to_string(&calls).unwrap().lines().count(), 2);
    }

    #[test]
    fn bad_configs_and_missing_plugins_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        plugin(tmp.path(), "p", "{}");
        let err = |body: &str| {
            Providers::load(&config(tmp.path(), body), tmp.path())
                .unwrap_err()
                .to_string()
        };
        let e = err("providers:\n- name: p\n  matchImages: []\n  apiVersion: x/v9\n");
        assert!(e.contains("matchImages: Required"), "{e}");
        assert!(e.contains("defaultCacheDuration: Required"), "{e}");
        assert!(e.contains("apiVersion: Unsupported value \"x/v9\""), "{e}");
        let e = err(&format!(
            "providers:\n- name: missing\n  matchImages: [a.io]\n  defaultCacheDuration: 1m\n  apiVersion: {V1}\n"
        ));
        assert!(
            e.contains("plugin binary executable") && e.contains("missing"),
            "{e}"
        );
        let e = err(&format!(
            "providers:\n- name: p\n  matchImages: [a.io]\n  defaultCacheDuration: 1m\n  apiVersion: {V1}\n- name: p\n  matchImages: [a.io]\n  defaultCacheDuration: 1m\n  apiVersion: {V1}\n"
        ));
        assert!(e.contains("Duplicate"), "{e}");
        let e = err("providers:\n- name: p\n  matchImage: [a.io]\n");
        assert!(e.contains("unknown field `matchImage`"), "{e}");
        let e = Providers::load(
            &config(tmp.path(), "providers: []\n"),
            &tmp.path().join("nope"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("plugin binary directory"), "{e}");
    }
}
