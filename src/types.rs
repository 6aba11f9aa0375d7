//! Shared vocabulary: pod identities, pod sources and the updates that flow from sources to the sync loop.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// A pod's UID as the runtime and the API know it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PodUid {
    /// The UID of a decoded pod (empty when the pod has none yet).
    pub fn of(pod: &Pod) -> PodUid {
        PodUid(pod.metadata.uid.clone().unwrap_or_default())
    }
}

/// Whether `s` may be one part of a path on the node as it is: a pod's UID, name or namespace,
/// or a container's name or ID. What the runtime reports is not trusted with more: a sandbox
/// whose UID is `../..` or `/etc` must not aim nodelet's cleanup outside its directories.
pub fn is_path_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// `s` with its control characters (line breaks included) written as escapes: text a
/// container controls cannot start a line of its own in nodelet's log, or move the cursor.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `url` with the password of its user info replaced by `xxxxx`, as Go's `URL.Redacted`
/// shows it: fit for logs and /configz.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info
                .split_once(':')
                .map_or(user_info, |(user, _)| user);
            let hidden = if user_info.contains(':') {
                ":xxxxx"
            } else {
                ""
            };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// When a pod must show its credentials for an image already on the node
/// (imagePullCredentialsVerificationPolicy, upstream's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullVerification {
    /// Any pod may use any image on the node.
    NeverVerify,
    /// For the images the node pulled, not for those put there otherwise (upstream's default).
    NeverVerifyPreloadedImages,
    /// For every image but those of preloadedImagesVerificationAllowlist.
    NeverVerifyAllowlistedImages,
    /// For every image.
    AlwaysVerify,
}

impl PullVerification {
    pub const ALL: [PullVerification; 4] = [
        PullVerification::NeverVerify,
        PullVerification::NeverVerifyPreloadedImages,
        PullVerification::NeverVerifyAllowlistedImages,
        PullVerification::AlwaysVerify,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PullVerification::NeverVerify => "NeverVerify",
            PullVerification::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            PullVerification::NeverVerifyAllowlistedImages => "NeverVerifyAllowlistedImages",
            PullVerification::AlwaysVerify => "AlwaysVerify",
        }
    }

    /// Whether a pod must show its credentials for `image` (as written), which the node
    /// pulled or not; `allowlist` holds repositories or `prefix/*` wildcards.
    pub fn requires(self, allowlist: &[String], image: &str, pulled_by_node: bool) -> bool {
        match self {
            PullVerification::NeverVerify => false,
            PullVerification::NeverVerifyPreloadedImages => pulled_by_node,
            PullVerification::AlwaysVerify => true,
            PullVerification::NeverVerifyAllowlistedImages => {
                let repo = image_repository(image);
                !allowlist.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => repo.starts_with(prefix),
                    None => repo == p,
                })
            }
        }
    }

    /// Why an allow-list entry is not a repository without tag or digest nor a `prefix/*`
    /// wildcard, if it is neither.
    pub fn check_pattern(pattern: &str) -> Result<(), &'static str> {
        if pattern.trim() != pattern || pattern.is_empty() {
            return Err("empty, or with spaces around it");
        }
        match pattern.strip_suffix("/*") {
            Some("") => Err("a wildcard needs at least a registry host"),
            Some(prefix) if prefix.contains('*') => Err("only a trailing /* is allowed"),
            Some(_) => Ok(()),
            None if pattern.contains('*') => Err("only a trailing /* is allowed"),
            None if image_repository(pattern) != pattern => {
                Err("neither a tag nor a digest is allowed")
            }
            None => Ok(()),
        }
    }
}

/// An image as written without its tag and digest.
pub fn image_repository(image: &str) -> &str {
    let name = image.split_once('@').map_or(image, |(name, _)| name);
    match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    }
}

/// How pod cgroups are named, as nodelet and the runtime must agree (`--cgroup-driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    /// The upstream spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a desired pod comes from; the value of the `kubernetes.io/config.source` annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    File,
    Http,
    Api,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Http => "http",
            Source::Api => "api",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        match s {
            "file" => Some(Source::File),
            "http" => Some(Source::Http),
            "api" => Some(Source::Api),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a set of pods, in the order the mux emits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOperation {
    /// The pods are gone from their source.
    Remove,
    /// The pods are new.
    Add,
    /// The pods' specs changed.
    Update,
    /// The pods are being deleted gracefully (deletionTimestamp set).
    Delete,
    /// Only the pods' status changed.
    Reconcile,
}

/// One operation on pods of one source.
#[derive(Clone, Debug)]
pub struct PodUpdate {
    pub op: PodOperation,
    pub source: Source,
    pub pods: Vec<Arc<Pod>>,
}

/// A pod's namespace; `default` when it names none, as the API server defaults it.
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `namespace/name` of a pod, for messages and duplicate detection.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        namespace(pod),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// An admit handler's refusal of a pod: the reason (upstream's, such as `OutOfcpu`) and the
/// message.
pub type Refusal = (std::borrow::Cow<'static, str>, String);

/// Writes `value` as JSON to `path` through a temporary file renamed over it, so a crash
/// leaves the old file or the new one, never half of one.
pub fn replace_json(path: &std::path::Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(value)?)?;
    std::fs::rename(&tmp, path)
}

/// An error with its causes: `outer: cause: root cause`. This is the one place a chain is
/// printed: nodelet's own errors describe only their layer and leave the cause to their source.
/// Some libraries' errors (kube's, tonic's transport errors) also print their cause in their
/// own text; a cause the layer above has printed that way is not printed again.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut above = out.clone();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !above.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        above = text;
        src = s.source();
    }
    out
}

/// Nanoseconds since the Unix epoch (the clock the runtime stamps its times with).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The current time as a Kubernetes timestamp (RFC 3339 when displayed).
pub fn now() -> k8s_openapi::jiff::Timestamp {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// Resources the node gives to pods: capacity less reservations and hard eviction thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allocatable {
    /// Cores.
    pub cpu: f64,
    /// Bytes.
    pub memory: f64,
    /// Bytes of the root dir's filesystem.
    pub ephemeral_storage: f64,
    pub pods: u32,
}

#[cfg(test)]
mod tests {

    #[test]
    fn pull_verification_follows_the_policy_and_the_allowlist() {
        let list = [
            "reg.example/team/*".to_string(),
            "docker.io/library/busybox".to_string(),
        ];
        let allowlisted = PullVerification::NeverVerifyAllowlistedImages;
        assert!(!allowlisted.requires(&list, "reg.example/team/app:1", true));
        assert!(!allowlisted.requires(&list, "docker.io/library/busybox@sha256:ab", true));
        assert!(allowlisted.requires(&list, "reg.example/other/app:1", false));
        assert!(!PullVerification::NeverVerifyPreloadedImages.requires(&[], "x", false));
        assert!(PullVerification::NeverVerifyPreloadedImages.requires(&[], "x", true));
        assert_eq!(
            image_repository("reg.example:5000/app:1"),
            "reg.example:5000/app"
        );
        assert_eq!(
            image_repository("reg.example:5000/app"),
            "reg.example:5000/app"
        );
        assert_eq!(image_repository("app:1@sha256:ab"), "app");
        for bad in [
            "",
            " reg.example/*",
            "*",
            "/*",
            "reg.example/a*/b",
            "reg.example/app:1",
        ] {
            assert!(PullVerification::check_pattern(bad).is_err(), "{bad:?}");
        }
        for good in ["reg.example/*", "reg.example:5000/team/app"] {
            assert!(PullVerification::check_pattern(good).is_ok(), "{good:?}");
        }
    }

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot prepare the pod")]
    struct Layered(#[source] std::io::Error);

    /// A library error in the other style: its text repeats its cause's.
    #[derive(Debug, thiserror::Error)]
    #[error("ApiError: {0}")]
    struct Pasting(#[source] std::io::Error);

    #[test]
    fn a_chain_prints_each_cause_once() {
        let io = || std::io::Error::other("disk full");
        assert_eq!(
            error_chain(&Layered(io())),
            "cannot prepare the pod: disk full"
        );
        assert_eq!(error_chain(&Pasting(io())), "ApiError: disk full");
        #[derive(Debug, thiserror::Error)]
        #[error("cannot join the cluster")]
        struct Outer(#[source] Pasting);
        assert_eq!(
            error_chain(&Outer(Pasting(io()))),
            "cannot join the cluster: ApiError: disk full"
        );
    }

    #[test]
    fn passwords_in_urls_are_hidden_and_the_rest_kept() {
        assert_eq!(
            redacted_url("https://me:s3cret@example.test:8443/m?x=1"),
            "https://me:xxxxx@example.test:8443/m?x=1"
        );
        assert_eq!(redacted_url("http://token@h/p@q"), "http://token@h/p@q");
        assert_eq!(redacted_url("http://h/a:b@c"), "http://h/a:b@c");
        assert_eq!(redacted_url("not a url"), "not a url");
    }

    #[test]
    fn path_parts_and_printable_text() {
        for good in ["abc", "1f0e-22", "a.b_c", "..x"] {
            assert!(is_path_part(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "/etc", "a\0b", &"x".repeat(254)] {
            assert!(!is_path_part(bad), "{bad:?}");
        }
        assert_eq!(printable("ok"), "ok");
        assert_eq!(printable("a\nb\r\u{1b}"), "a\\nb\\r\\u{1b}");
    }
}
