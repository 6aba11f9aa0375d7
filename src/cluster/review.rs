//! The API server's reviews for the node's authenticated API: TokenReview for bearer tokens and
//! SubjectAccessReview for each request, with upstream's caches (answers kept for
//! `authentication.webhook.cacheTTL`, and `authorization.webhook.cacheAuthorizedTTL` /
//! `cacheUnauthorizedTTL`). Tokens are cached by their SHA-256, never kept in the clear, and
//! only when the API server knew them. Reviews use a client of their own, so requests with
//! made-up tokens cannot hold up the node's heartbeat or its pods' status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::server::auth::{Attributes, BoxFuture, User};

/// The most answers each cache keeps; past that, expired ones go, then the cache is cleared.
const CACHE_LIMIT: usize = 4096;

/// How long each kind of answer is kept.
#[derive(Clone, Copy, Debug)]
pub struct Ttls {
    pub authenticated: Duration,
    pub allowed: Duration,
    pub denied: Duration,
}

/// Answers with the instant they expire, by key.
type Cache<K, V> = Mutex<HashMap<K, (V, Instant)>>;

/// Reviews through the API server, cached.
pub struct Reviewer {
    client: kube::Client,
    ttls: Ttls,
    tokens: Cache<[u8; 32], Option<User>>,
    decisions: Cache<(User, Attributes), bool>,
}

/// Looks `key` up in a cache of answers with their expiry.
fn cached<K: std::hash::Hash + Eq, V: Clone>(cache: &Cache<K, V>, key: &K) -> Option<V> {
    let cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .get(key)
        .filter(|(_, until)| *until > Instant::now())
        .map(|(v, _)| v.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(cache: &Cache<K, V>, key: K, value: V, ttl: Duration) {
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHE_LIMIT {
        let now = Instant::now();
        cache.retain(|_, (_, until)| *until > now);
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
    }
    cache.insert(key, (value, Instant::now() + ttl));
}

impl Reviewer {
    pub fn new(client: kube::Client, ttls: Ttls) -> Reviewer {
        Reviewer {
            client,
            ttls,
            tokens: Mutex::default(),
            decisions: Mutex::default(),
        }
    }

    async fn token_review(&self, token: &str) -> Option<User> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = cached(&self.tokens, &key) {
            return user;
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await;
        let user = match answer {
            Ok(review) => review
                .status
                .filter(|s| s.authenticated == Some(true))
                .and_then(|s| s.user)
                .and_then(|u| {
                    Some(User {
                        name: u.username?,
                        groups: u.groups.unwrap_or_default(),
                    })
                }),
            Err(e) => {
                // Not cached: the next request asks again.
                tracing::warn!(error = %crate::types::error_chain(&e), "cannot review a bearer token with the API server");
                return None;
            }
        };
        // Only known tokens are kept: a flood of made-up ones must not push them out.
        if user.is_some() {
            remember(&self.tokens, key, user.clone(), self.ttls.authenticated);
        }
        user
    }

    async fn access_review(&self, user: &User, attributes: &Attributes) -> Result<bool, String> {
        let key = (user.clone(), attributes.clone());
        if let Some(allowed) = cached(&self.decisions, &key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attributes.verb.clone()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attributes.subresource.clone()),
                    name: Some(attributes.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| crate::types::error_chain(&e))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            self.ttls.allowed
        } else {
            self.ttls.denied
        };
        remember(&self.decisions, key, allowed, ttl);
        Ok(allowed)
    }
}

impl crate::server::auth::Reviewer for Reviewer {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<User>> {
        Box::pin(self.token_review(token))
    }

    fn authorize<'a>(
        &'a self,
        user: &'a User,
        attributes: &'a Attributes,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(self.access_review(user, attributes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_are_kept_for_their_ttl() {
        let cache: Cache<u8, bool> = Mutex::default();
        remember(&cache, 1, true, Duration::from_secs(300));
        remember(&cache, 2, false, Duration::from_secs(30));
        assert_eq!(cached(&cache, &1), Some(true));
        assert_eq!(cached(&cache, &2), Some(false));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(cached(&cache, &1), Some(true));
        assert_eq!(cached(&cache, &2), None);
    }
}
