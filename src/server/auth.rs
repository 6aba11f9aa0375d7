//! Who a request to the authenticated API is, and whether it may proceed, as the upstream
//! kubelet decides: a verified client certificate (user from its CN, groups from its O), else a
//! bearer token checked by the API server (TokenReview), else anonymous when allowed; then
//! AlwaysAllow, or the API server's SubjectAccessReview on `nodes/<subresource>` of this node.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// Who a request without credentials is, as upstream names it.
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// The user a verified client certificate names (DER): its CN, and its O values as groups.
    pub fn from_certificate(der: &[u8]) -> Option<User> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()?
            .as_str()
            .ok()?
            .to_string();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(String::from))
            .collect();
        Some(User { name, groups })
    }
}

/// What one authorization check asks: may the user do `verb` on `nodes/<subresource>` of this
/// node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    pub subresource: String,
    pub node: String,
}

/// A boxed future, for the object-safe [`Reviewer`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The API server's reviews (cluster mode provides them, with their caches).
pub trait Reviewer: Send + Sync {
    /// The user a bearer token belongs to; `None` when the API server does not know it (or
    /// cannot be asked).
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<User>>;
    /// Whether the user may do this; `Err(why)` when the API server could not be asked.
    fn authorize<'a>(
        &'a self,
        user: &'a User,
        attributes: &'a Attributes,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// How the authenticated API decides.
#[derive(Clone)]
pub struct Auth {
    /// Requests without credentials get in as system:anonymous (--anonymous-auth).
    pub anonymous: bool,
    /// The node these requests are about.
    pub node: String,
    /// Bearer tokens are reviewed by the API server (--authentication-token-webhook).
    pub token_webhook: bool,
    /// SubjectAccessReview per request (--authorization-mode=Webhook); else AlwaysAllow.
    pub authorization_webhook: bool,
    pub reviewer: Option<Arc<dyn Reviewer>>,
}

/// The user a connection's verified client certificate names, set by the TLS server.
#[derive(Clone)]
pub struct CertificateUser(pub Option<User>);

/// The subresources a request path is checked as, as upstream maps them: the specific one
/// first, then `proxy` for the paths that fall back to it.
pub fn subresources(path: &str) -> Vec<&'static str> {
    let under = |prefix: &str| {
        path == prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let mut out = Vec::new();
    if under("/pods") || under("/runningpods") {
        out.push("pods");
    } else if under("/healthz") {
        out.push("healthz");
    } else if under("/configz") {
        out.push("configz");
    }
    out.push(if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/checkpoint") {
        "checkpoint"
    } else {
        "proxy"
    });
    out
}

/// The API verb of an HTTP method.
fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    }
}

fn refuse(code: StatusCode, message: &str) -> Response {
    (code, format!("{message}\n")).into_response()
}

/// The middleware: authenticates, then authorizes, each request.
pub async fn check(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let from_certificate = req
        .extensions()
        .get::<CertificateUser>()
        .and_then(|c| c.0.clone());
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_string());
    let user = match (from_certificate, bearer, &auth.reviewer) {
        (Some(user), _, _) => user,
        (None, Some(token), _) if token.is_empty() => {
            return refuse(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        (None, Some(token), Some(reviewer)) if auth.token_webhook => {
            match reviewer.authenticate(&token).await {
                Some(user) => user,
                None => return refuse(StatusCode::UNAUTHORIZED, "Unauthorized"),
            }
        }
        _ if auth.anonymous => User::anonymous(),
        _ => return refuse(StatusCode::UNAUTHORIZED, "Unauthorized"),
    };
    let Some(reviewer) = auth
        .reviewer
        .as_ref()
        .filter(|_| auth.authorization_webhook)
    else {
        return next.run(req).await;
    };
    let path = req.uri().path().to_string();
    let verb = verb(req.method());
    let wanted = subresources(&path);
    for subresource in &wanted {
        let attributes = Attributes {
            verb: verb.into(),
            subresource: (*subresource).into(),
            node: auth.node.clone(),
        };
        match reviewer.authorize(&user, &attributes).await {
            Ok(true) => return next.run(req).await,
            Ok(false) => {}
            Err(why) => {
                tracing::warn!(user = %user.name, %path, "cannot authorize the request: {why}");
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Authorization error (the API server could not be asked)",
                );
            }
        }
    }
    let message = format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])",
        user.name,
        wanted.join(", ")
    );
    refuse(StatusCode::FORBIDDEN, &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        assert_eq!(subresources("/stats/summary"), ["stats"]);
        assert_eq!(subresources("/metrics"), ["metrics"]);
        assert_eq!(subresources("/logs/syslog"), ["log"]);
        assert_eq!(subresources("/containerLogs/ns/p/c"), ["proxy"]);
        assert_eq!(subresources("/exec/ns/p/c"), ["proxy"]);
        assert_eq!(subresources("/pods"), ["pods", "proxy"]);
        assert_eq!(subresources("/configz"), ["configz", "proxy"]);
        assert_eq!(subresources("/healthz/ping"), ["healthz", "proxy"]);
        assert_eq!(subresources("/statsx"), ["proxy"]);
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::GET), "get");
    }

    #[test]
    fn a_certificates_cn_is_the_user_and_its_organizations_the_groups() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let user = User::from_certificate(cert.der()).unwrap();
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.groups, ["system:nodes"]);
    }
}
