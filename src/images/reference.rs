//! Image references the way the docker reference grammar reads them: registry domain (docker.io
//! when the first part names no host), repository path (library/ for official images), tag
//! (latest when neither tag nor digest is given) and digest.

/// A parsed, normalised image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The registry host, with its port when one is given.
    pub domain: String,
    /// The repository path within the registry.
    pub path: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// The registry of short names.
const DEFAULT_DOMAIN: &str = "docker.io";

fn is_path_component(s: &str) -> bool {
    // [a-z0-9]+ separated by '.', '_', '__' or runs of '-'.
    let b = s.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !(b[i].is_ascii_lowercase() || b[i].is_ascii_digit()) {
            i += 1;
        }
        let sep = &s[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_domain(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    host_ok && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn is_digest(s: &str) -> bool {
    match s.split_once(':') {
        Some((algo, hex)) => {
            !algo.is_empty()
                && algo
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+._-".contains(&c))
                && hex.len() >= 32
                && hex.bytes().all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// Parses `image`, or says why it is not a valid reference.
pub fn parse(image: &str) -> Result<Reference, String> {
    if image.is_empty() {
        return Err("the image name is empty".into());
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) if is_digest(d) => (n, Some(d.to_string())),
        Some((_, d)) => return Err(format!("{d:?} is not a valid digest")),
        None => (image, None),
    };
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].rfind(':') {
        Some(i) => {
            let tag = &name_tag[last_slash + i + 1..];
            if !is_tag(tag) {
                return Err(format!("{tag:?} is not a valid tag"));
            }
            (&name_tag[..last_slash + i], Some(tag.to_string()))
        }
        None => (name_tag, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            if !is_domain(first) {
                return Err(format!("{first:?} is not a valid registry host"));
            }
            (first.to_string(), rest.to_string())
        }
        Some(_) => (DEFAULT_DOMAIN.to_string(), name.to_string()),
        None => (DEFAULT_DOMAIN.to_string(), format!("library/{name}")),
    };
    if path.bytes().any(|c| c.is_ascii_uppercase()) {
        return Err("the repository name must be lower-case".into());
    }
    if !path.split('/').all(is_path_component) {
        return Err(format!("{path:?} is not a valid repository name"));
    }
    if domain.len() + 1 + path.len() > 255 {
        return Err("the repository name is longer than 255 characters".into());
    }
    Ok(Reference {
        domain,
        path,
        tag,
        digest,
    })
}

/// The full name the runtime keeps for the image: domain, path, and the tag (`latest` when
/// neither tag nor digest is given) or digest.
impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        match (&self.tag, &self.digest) {
            (None, None) => f.write_str(":latest"),
            (tag, digest) => {
                if let Some(tag) = tag {
                    write!(f, ":{tag}")?;
                }
                if let Some(digest) = digest {
                    write!(f, "@{digest}")?;
                }
                Ok(())
            }
        }
    }
}

/// The image as given, with `:latest` added when it has neither tag nor digest (what the
/// kubelet hands the runtime).
pub fn with_default_tag(image: &str, r: &Reference) -> String {
    if r.tag.is_none() && r.digest.is_none() {
        format!("{image}:latest")
    } else {
        image.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(image: &str) -> String {
        let r = parse(image).unwrap();
        format!(
            "{}/{}{}{}",
            r.domain,
            r.path,
            r.tag.map(|t| format!(":{t}")).unwrap_or_default(),
            r.digest.map(|d| format!("@{d}")).unwrap_or_default()
        )
    }

    #[test]
    fn the_full_name_is_the_runtimes() {
        let name = |image: &str| parse(image).unwrap().to_string();
        assert_eq!(name("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(name("localhost/busybox:local"), "localhost/busybox:local");
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            name(&format!("reg:5000/a/b@{digest}")),
            format!("reg:5000/a/b@{digest}")
        );
    }

    #[test]
    fn short_names_are_normalised_like_upstream() {
        assert_eq!(full("busybox"), "docker.io/library/busybox");
        assert_eq!(full("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(full("team/app:v1"), "docker.io/team/app:v1");
        assert_eq!(full("localhost/busybox:local"), "localhost/busybox:local");
        assert_eq!(full("127.0.0.1:5000/a/b:c"), "127.0.0.1:5000/a/b:c");
        assert_eq!(
            full("registry.k8s.io/etcd:3.5.9-0"),
            "registry.k8s.io/etcd:3.5.9-0"
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            full(&format!("quay.io/x/y@{digest}")),
            format!("quay.io/x/y@{digest}")
        );
        let r = parse("busybox").unwrap();
        assert_eq!(with_default_tag("busybox", &r), "busybox:latest");
        let r = parse("busybox:1").unwrap();
        assert_eq!(with_default_tag("busybox:1", &r), "busybox:1");
    }

    #[test]
    fn bad_references_are_refused_with_a_reason() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "a//b",
            "busybox@sha256:xyz",
            "-a/b",
            "host:port/x",
            "a b",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
