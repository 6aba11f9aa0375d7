//! Node-level registry credentials, as upstream's docker keyring: the first docker config file
//! found (`<root-dir>/config.json`, `~/.docker/config.json`, `/.docker/config.json`, then the
//! legacy `.dockercfg` in the same places), entries matched to an image by host glob and path
//! prefix, most specific first. Credentials are read at each pull and never logged.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use crate::runtime::cri;

/// One registry login.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    pub identity_token: String,
    pub registry_token: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The CRI's form of it.
    pub fn auth_config(&self) -> cri::AuthConfig {
        cri::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            identity_token: self.identity_token.clone(),
            registry_token: self.registry_token.clone(),
            ..Default::default()
        }
    }
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    identitytoken: String,
    #[serde(default)]
    registrytoken: String,
}

#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// The credentials of one docker config file, by registry key.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    entries: Vec<(String, Credential)>,
}

/// Where docker config files are looked for, in upstream order.
fn candidates(root_dir: &Path) -> Vec<(PathBuf, bool)> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut out = vec![(root_dir.join("config.json"), true)];
    if let Some(h) = &home {
        out.push((h.join(".docker/config.json"), true));
    }
    out.push((PathBuf::from("/.docker/config.json"), true));
    out.push((root_dir.join(".dockercfg"), false));
    if let Some(h) = &home {
        out.push((h.join(".dockercfg"), false));
    }
    out.push((PathBuf::from("/.dockercfg"), false));
    out
}

impl Keyring {
    /// Reads the first docker config file that exists. A file that cannot be read or parsed is
    /// reported (without its content) and skipped.
    pub fn load(root_dir: &Path) -> Keyring {
        for (path, is_config_json) in candidates(root_dir) {
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            match Keyring::parse(&text, is_config_json) {
                Ok(k) => return k,
                Err(why) => {
                    tracing::warn!(file = %path.display(), "cannot use the docker config file: {why}");
                }
            }
        }
        Keyring::default()
    }

    /// A config.json (`{"auths": {...}}`) or a legacy .dockercfg (the map itself).
    pub fn parse(text: &[u8], is_config_json: bool) -> Result<Keyring, String> {
        // serde's messages could quote a value: only its position is kept.
        let shape = |e: serde_json::Error| format!("not valid JSON at line {}", e.line());
        let auths: BTreeMap<String, Entry> = if is_config_json {
            serde_json::from_slice::<ConfigJson>(text)
                .map_err(shape)?
                .auths
        } else {
            serde_json::from_slice(text).map_err(shape)?
        };
        let mut entries = Vec::new();
        for (key, e) in auths {
            let mut c = Credential {
                username: e.username,
                password: e.password,
                identity_token: e.identitytoken,
                registry_token: e.registrytoken,
            };
            if !e.auth.is_empty() {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(e.auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| format!("the auth of {key:?} is not base64 of user:password"))?;
                let (user, pass) = decoded
                    .split_once(':')
                    .ok_or_else(|| format!("the auth of {key:?} is not user:password"))?;
                c.username = user.to_string();
                c.password = pass.to_string();
            }
            entries.push((key, c));
        }
        Ok(Keyring::from_entries(entries))
    }

    /// Credentials by registry key (`host[:port][/path]`, a scheme allowed, `*` globs in host
    /// labels).
    pub fn from_entries(entries: impl IntoIterator<Item = (String, Credential)>) -> Keyring {
        let mut entries: Vec<(String, Credential)> = entries
            .into_iter()
            .map(|(key, c)| (normalize_key(&key), c))
            .collect();
        // Most specific first: reverse lexical order puts longer paths and exact hosts ahead.
        entries.sort_by(|a, b| b.0.cmp(&a.0));
        Keyring { entries }
    }

    /// The credentials that apply to an image in `domain`/`path`, most specific first.
    pub fn lookup(&self, domain: &str, path: &str) -> Vec<Credential> {
        self.entries
            .iter()
            .filter(|(key, _)| matches(key, domain, path))
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// A key without its scheme, with docker.io's legacy names made `docker.io`.
pub(super) fn normalize_key(key: &str) -> String {
    let bare = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let bare = bare.trim_end_matches('/');
    let (host, path) = bare.split_once('/').unwrap_or((bare, ""));
    let host = match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        h => h,
    };
    match path {
        // The v1 API suffix of docker.io's classic key names no repository.
        "" | "v1" | "v2" => host.to_string(),
        p => format!("{host}/{p}"),
    }
}

/// Does the key (host glob with optional port, optional path prefix) cover the image?
pub(super) fn matches(key: &str, domain: &str, path: &str) -> bool {
    let (key_host, key_path) = key.split_once('/').unwrap_or((key, ""));
    let split_port = |h: &str| match h.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.to_string()),
        None => (h.to_string(), String::new()),
    };
    let (kh, kp) = split_port(key_host);
    let (ih, ip) = split_port(domain);
    if kp != ip {
        return false;
    }
    let key_labels: Vec<&str> = kh.split('.').collect();
    let image_labels: Vec<&str> = ih.split('.').collect();
    key_labels.len() == image_labels.len()
        && key_labels
            .iter()
            .zip(&image_labels)
            .all(|(k, i)| glob(k, i))
        && path.starts_with(key_path)
}

/// `*` matches any run of characters within one host label.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern.eq_ignore_ascii_case(text),
        Some((head, tail)) => {
            text.len() >= head.len()
                && text[..head.len()].eq_ignore_ascii_case(head)
                && (0..=text.len() - head.len()).any(|skip| glob(tail, &text[head.len() + skip..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring(json: &str) -> Keyring {
        Keyring::parse(json.as_bytes(), true).unwrap()
    }

    #[test]
    fn entries_match_by_host_glob_port_and_path_most_specific_first() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:pw1");
        let k = keyring(&format!(
            r#"{{"auths": {{
                "registry.example.com": {{"auth": "{auth}"}},
                "registry.example.com/team": {{"username": "bob", "password": "pw2"}},
                "*.mirror.example.com": {{"username": "carol", "password": "pw3"}},
                "127.0.0.1:5000": {{"username": "dave", "password": "pw4"}},
                "https://index.docker.io/v1/": {{"username": "erin", "password": "pw5"}}
            }}}}"#
        ));
        let users = |d: &str, p: &str| -> Vec<String> {
            k.lookup(d, p).into_iter().map(|c| c.username).collect()
        };
        assert_eq!(users("registry.example.com", "team/app"), ["bob", "alice"]);
        assert_eq!(users("registry.example.com", "other/app"), ["alice"]);
        assert_eq!(users("eu.mirror.example.com", "x"), ["carol"]);
        assert!(
            users("a.eu.mirror.example.com", "x").is_empty(),
            "a glob is one label"
        );
        assert_eq!(users("127.0.0.1:5000", "x"), ["dave"]);
        assert!(users("127.0.0.1:5001", "x").is_empty(), "ports must agree");
        assert_eq!(users("docker.io", "library/busybox"), ["erin"]);
        assert_eq!(k.lookup("registry.example.com", "x")[0].password, "pw1");
    }

    #[test]
    fn legacy_files_parse_and_bad_ones_never_echo_secrets() {
        let k = Keyring::parse(br#"{"reg.example.com": {"auth": "dTpw"}}"#, false).unwrap();
        assert_eq!(k.lookup("reg.example.com", "a")[0].username, "u");
        let err = Keyring::parse(br#"{"auths": {"r": {"auth": "hunter2!!"}}}"#, true).unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let err = Keyring::parse(br#"{"auths": {"r": {"password": hunter2}}}"#, true).unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let shown = format!("{:?}", k.lookup("reg.example.com", "a"));
        assert!(!shown.contains("\"p\""), "{shown}");
    }

    #[test]
    fn the_first_existing_file_is_the_keyring() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            Keyring::load(tmp.path())
                .lookup("r.example.com", "a")
                .is_empty()
        );
        std::fs::write(
            tmp.path().join(".dockercfg"),
            r#"{"r.example.com": {"username": "legacy", "password": "p"}}"#,
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("config.json"),
            r#"{"auths": {"r.example.com": {"username": "modern", "password": "p"}}}"#,
        )
        .unwrap();
        assert_eq!(
            Keyring::load(tmp.path()).lookup("r.example.com", "a")[0].username,
            "modern"
        );
    }
}
