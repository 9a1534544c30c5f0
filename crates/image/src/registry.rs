//! A client of the OCI distribution API (v2): manifests, blobs streamed to disk and verified,
//! anonymous, basic and Bearer-token auth, and a small push (monolithic upload, manifest PUT).

use crate::digest::Digest;
use crate::egress::{redirect_policy, EgressPolicy, GuardedResolver};
use crate::error::{Error, IoContext, Result};
use crate::manifest::MANIFEST_ACCEPT;
use futures_util::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The largest manifest or config accepted (Docker's limit is 4 MiB too).
const MAX_DOCUMENT: usize = 4 << 20;

/// Credentials for a registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Auth {
    /// No credentials; Bearer tokens are still fetched anonymously when asked for.
    #[default]
    Anonymous,
    /// Username and password, sent on a Basic challenge or to a token endpoint.
    Basic { username: String, password: String },
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// `bearer` or `basic` (lowercase).
    pub scheme: String,
    /// Parameters (`realm`, `service`, `scope`, …) with quotes removed.
    pub params: HashMap<String, String>,
}

impl Challenge {
    /// Parses `Bearer realm="…",service="…",scope="repository:x:pull,push"`.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let mut params = HashMap::new();
        let mut chars = rest.chars().peekable();
        loop {
            while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
                chars.next();
            }
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            if key.is_empty() {
                break;
            }
            let mut value = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
            } else {
                value = chars.by_ref().take_while(|c| *c != ',').collect();
            }
            params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
        (!scheme.is_empty()).then(|| Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params,
        })
    }
}

/// One registry: its base URL, credentials and the tokens it handed out.
#[derive(Debug)]
pub struct Registry {
    http: reqwest::Client,
    base: Url,
    auth: Auth,
    /// Bearer tokens by scope.
    tokens: Mutex<HashMap<String, String>>,
    /// Set once the registry asked for Basic auth.
    basic: Mutex<bool>,
    /// Where its requests may go (a store's pulls); `None`: anywhere (pushes of tests and
    /// tools).
    egress: Option<Arc<EgressPolicy>>,
}

fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("bazaar/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
}

fn built(builder: reqwest::ClientBuilder) -> Result<reqwest::Client> {
    builder.build().map_err(|source| Error::Http {
        url: String::new(),
        source,
    })
}

/// An HTTP client for registries (rustls, the platform's root certificates).
pub(crate) fn http_client() -> Result<reqwest::Client> {
    built(client_builder())
}

/// The HTTP client of a store's pulls: names resolve, and redirects lead, only to the
/// addresses `egress` allows.
pub(crate) fn pull_client(egress: Arc<EgressPolicy>) -> Result<reqwest::Client> {
    built(
        client_builder()
            .dns_resolver(Arc::new(GuardedResolver(egress.clone())))
            .redirect(redirect_policy(egress)),
    )
}

fn scope(repo: &str, push: bool) -> String {
    format!(
        "repository:{repo}:{}",
        if push { "pull,push" } else { "pull" }
    )
}

/// What an error answer says, without echoing it: the codes of an OCI error body
/// (`MANIFEST_UNKNOWN`, `UNAUTHORIZED`, ...: capital letters and `_` only), nothing else.
/// A failed pull's message lands in machine events, and the server answering may be one
/// the caller could not read otherwise.
async fn error_codes(resp: Response) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Code>,
    }
    #[derive(serde::Deserialize)]
    struct Code {
        code: String,
    }
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() > 64 * 1024 {
            return String::new();
        }
    }
    let Ok(errors) = serde_json::from_slice::<Errors>(&body) else {
        return String::new();
    };
    let codes: Vec<String> = errors
        .errors
        .into_iter()
        .map(|e| e.code)
        .filter(|c| {
            c.len() <= 64 && !c.is_empty() && c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
        .take(4)
        .collect();
    codes.join(", ")
}

async fn expect(resp: Response, ok: &[StatusCode]) -> Result<Response> {
    if ok.contains(&resp.status()) {
        return Ok(resp);
    }
    Err(Error::Registry {
        url: resp.url().to_string(),
        status: resp.status().as_u16(),
        body: error_codes(resp).await,
    })
}

impl Registry {
    /// A client of `host[:port]` (`docker.io` means Docker Hub's API host). Plain HTTP when
    /// `plain_http` (loopback or configured insecure registries), HTTPS otherwise.
    pub fn new(host: &str, auth: Auth, plain_http: bool) -> Result<Registry> {
        Registry::with_client(http_client()?, host, auth, plain_http)
    }

    pub(crate) fn with_client(
        http: reqwest::Client,
        host: &str,
        auth: Auth,
        plain_http: bool,
    ) -> Result<Registry> {
        let host = if host == crate::reference::DOCKER_HUB {
            "registry-1.docker.io"
        } else {
            host
        };
        // RFC 6761: names under .invalid never resolve; say so without asking DNS.
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        if name == "invalid" || name.ends_with(".invalid") {
            return Err(Error::Reference(
                host.into(),
                "no such registry: .invalid names never resolve",
            ));
        }
        let scheme = if plain_http { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{host}/"))
            .map_err(|_| Error::Reference(host.into(), "bad registry host"))?;
        Ok(Registry {
            http,
            base,
            auth,
            tokens: Mutex::default(),
            basic: Mutex::new(false),
            egress: None,
        })
    }

    /// This client, its requests limited to what `egress` allows: refused now if the
    /// registry is an address it does not allow (names are checked as they resolve, by the
    /// store's client).
    pub(crate) fn with_egress(mut self, egress: Arc<EgressPolicy>) -> Result<Registry> {
        egress.check_url(&self.base).map_err(Error::Egress)?;
        self.egress = Some(egress);
        Ok(self)
    }

    fn url(&self, path: &str) -> Url {
        self.base.join(path).expect("registry paths are valid")
    }

    fn authorize(&self, req: RequestBuilder, scope: &str) -> RequestBuilder {
        if let Some(token) = self.tokens.lock().expect("tokens").get(scope) {
            return req.bearer_auth(token);
        }
        match &self.auth {
            Auth::Basic { username, password } if *self.basic.lock().expect("basic") => {
                req.basic_auth(username, Some(password))
            }
            _ => req,
        }
    }

    /// Sends the request `make` builds, answering one auth challenge and retrying once.
    async fn send(&self, scope: &str, make: impl Fn() -> RequestBuilder) -> Result<Response> {
        let http_err = |source: reqwest::Error| Error::Http {
            url: source.url().map(ToString::to_string).unwrap_or_default(),
            source,
        };
        let resp = self
            .authorize(make(), scope)
            .send()
            .await
            .map_err(http_err)?;
        if resp.status() != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let url = resp.url().to_string();
        let header = resp
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let challenge = Challenge::parse(header).ok_or_else(|| Error::Auth {
            url: url.clone(),
            reason: format!("401 without a usable WWW-Authenticate ({header:?})"),
        })?;
        match challenge.scheme.as_str() {
            "bearer" => {
                let token = self.fetch_token(&challenge, scope).await?;
                self.tokens
                    .lock()
                    .expect("tokens")
                    .insert(scope.to_string(), token);
            }
            "basic" if matches!(self.auth, Auth::Basic { .. }) => {
                *self.basic.lock().expect("basic") = true;
            }
            _ => {
                return Err(Error::Auth {
                    url,
                    reason: format!("registry wants {header:?} and no credentials fit"),
                })
            }
        }
        let resp = self
            .authorize(make(), scope)
            .send()
            .await
            .map_err(http_err)?;
        if resp.status() == StatusCode::UNAUTHORIZED {
            return Err(Error::Auth {
                url,
                reason: "credentials refused".into(),
            });
        }
        Ok(resp)
    }

    /// The Bearer token flow: GET the challenge's realm with its service and scope (and the
    /// credentials, if any) and read `token` or `access_token` from the JSON answer.
    async fn fetch_token(&self, challenge: &Challenge, scope: &str) -> Result<String> {
        let realm = challenge.params.get("realm").ok_or_else(|| Error::Auth {
            url: self.base.to_string(),
            reason: "Bearer challenge without a realm".into(),
        })?;
        let mut url = Url::parse(realm).map_err(|e| Error::Auth {
            url: realm.clone(),
            reason: format!("bad realm: {e}"),
        })?;
        // Credentials and tokens travel no less protected than the registry's own traffic.
        if url.scheme() != "https" && self.base.scheme() == "https" {
            return Err(Error::Auth {
                url: realm.clone(),
                reason: format!(
                    "the registry {} sends its token realm over plain {}; refused (only a \
                     loopback or insecure-listed registry may use a plain-http realm)",
                    self.base.host_str().unwrap_or_default(),
                    url.scheme()
                ),
            });
        }
        if let Some(egress) = &self.egress {
            egress.check_url(&url).map_err(|reason| Error::Auth {
                url: realm.clone(),
                reason,
            })?;
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = challenge.params.get("service") {
                query.append_pair("service", service);
            }
            query.append_pair(
                "scope",
                challenge.params.get("scope").map_or(scope, String::as_str),
            );
        }
        let mut req = self.http.get(url.clone());
        if let Auth::Basic { username, password } = &self.auth {
            req = req.basic_auth(username, Some(password));
        }
        let resp = req.send().await.map_err(|source| Error::Http {
            url: url.to_string(),
            source,
        })?;
        if !resp.status().is_success() {
            return Err(Error::Auth {
                url: url.to_string(),
                reason: format!("token endpoint answered {}", resp.status()),
            });
        }
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer = resp.json().await.map_err(|source| Error::Http {
            url: url.to_string(),
            source,
        })?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::Auth {
                url: url.to_string(),
                reason: "token endpoint gave no token".into(),
            })
    }

    /// GETs a manifest or index by tag or digest: its bytes and `Content-Type`.
    pub async fn manifest(&self, repo: &str, target: &str) -> Result<(Vec<u8>, Option<String>)> {
        let url = self.url(&format!("v2/{repo}/manifests/{target}"));
        let resp = self
            .send(&scope(repo, false), || {
                self.http.get(url.clone()).header(ACCEPT, MANIFEST_ACCEPT)
            })
            .await?;
        let resp = expect(resp, &[StatusCode::OK]).await?;
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|h| h.to_str().ok())
            .map(String::from);
        let bytes = read_limited(resp, &url).await?;
        Ok((bytes, content_type))
    }

    /// GETs a small blob (a config) into memory, verified against its digest.
    pub async fn blob_bytes(&self, repo: &str, digest: &Digest) -> Result<Vec<u8>> {
        let url = self.url(&format!("v2/{repo}/blobs/{digest}"));
        let resp = self
            .send(&scope(repo, false), || self.http.get(url.clone()))
            .await?;
        let bytes = read_limited(expect(resp, &[StatusCode::OK]).await?, &url).await?;
        digest.verify("blob", &bytes)?;
        Ok(bytes)
    }

    /// Streams a blob into `dest` (created or truncated), calling `progress(bytes_done)` as it
    /// goes, and fails unless the content has `digest` and `size` bytes.
    pub async fn blob_to_file(
        &self,
        repo: &str,
        digest: &Digest,
        size: u64,
        dest: &Path,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<()> {
        let url = self.url(&format!("v2/{repo}/blobs/{digest}"));
        let resp = self
            .send(&scope(repo, false), || self.http.get(url.clone()))
            .await?;
        let resp = expect(resp, &[StatusCode::OK]).await?;
        let mut file = tokio::fs::File::create(dest).await.at(dest)?;
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| Error::Http {
                url: url.to_string(),
                source,
            })?;
            hasher.update(&chunk);
            file.write_all(&chunk).await.at(dest)?;
            done += chunk.len() as u64;
            if done > size {
                break;
            }
            progress(done);
        }
        file.sync_all().await.at(dest)?;
        let actual = Digest::from_hasher(hasher);
        if &actual != digest || done != size {
            return Err(Error::DigestMismatch {
                what: "layer",
                expected: digest.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// Uploads a blob unless the registry has it (HEAD), with a monolithic POST + PUT.
    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> Result<Digest> {
        let digest = Digest::of(data);
        self.push_blob_body(repo, &digest, || reqwest::Body::from(data.to_vec()))
            .await?;
        Ok(digest)
    }

    /// [`Registry::push_blob`] of the file at `path`, whose digest is `digest`, streamed
    /// (a layer may be larger than memory).
    pub async fn push_blob_file(&self, repo: &str, path: &Path, digest: &Digest) -> Result<()> {
        std::fs::metadata(path).at(path)?;
        self.push_blob_body(repo, digest, || {
            // A file gone since is sent empty: the registry refuses it by its digest.
            std::fs::File::open(path)
                .map(|f| reqwest::Body::from(tokio::fs::File::from_std(f)))
                .unwrap_or_else(|_| reqwest::Body::from(Vec::new()))
        })
        .await
    }

    async fn push_blob_body(
        &self,
        repo: &str,
        digest: &Digest,
        body: impl Fn() -> reqwest::Body,
    ) -> Result<()> {
        let scope = scope(repo, true);
        let head = self.url(&format!("v2/{repo}/blobs/{digest}"));
        let resp = self.send(&scope, || self.http.head(head.clone())).await?;
        if resp.status() == StatusCode::OK {
            return Ok(());
        }
        let start = self.url(&format!("v2/{repo}/blobs/uploads/"));
        let resp = self.send(&scope, || self.http.post(start.clone())).await?;
        let resp = expect(resp, &[StatusCode::ACCEPTED]).await?;
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|h| h.to_str().ok())
            .ok_or_else(|| Error::Registry {
                url: start.to_string(),
                status: 202,
                body: "upload started without a Location".into(),
            })?;
        let mut put = start.join(location).map_err(|_| Error::Registry {
            url: start.to_string(),
            status: 202,
            body: format!("bad upload Location {location:?}"),
        })?;
        put.query_pairs_mut().append_pair("digest", digest.as_str());
        let resp = self
            .send(&scope, || {
                self.http
                    .request(Method::PUT, put.clone())
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(body())
            })
            .await?;
        expect(resp, &[StatusCode::CREATED]).await?;
        Ok(())
    }

    /// PUTs a manifest or index under `target` (a tag or its digest); returns its digest.
    pub async fn push_manifest(
        &self,
        repo: &str,
        target: &str,
        media_type: &str,
        body: &[u8],
    ) -> Result<Digest> {
        let url = self.url(&format!("v2/{repo}/manifests/{target}"));
        let resp = self
            .send(&scope(repo, true), || {
                self.http
                    .put(url.clone())
                    .header(CONTENT_TYPE, media_type)
                    .body(body.to_vec())
            })
            .await?;
        expect(resp, &[StatusCode::CREATED]).await?;
        Ok(Digest::of(body))
    }
}

async fn read_limited(resp: Response, url: &Url) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| Error::Http {
            url: url.to_string(),
            source,
        })?;
        out.extend_from_slice(&chunk);
        if out.len() > MAX_DOCUMENT {
            return Err(Error::Manifest(format!("{url}: document over 4 MiB")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_challenge() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.docker.io/token");
        assert_eq!(c.params["service"], "registry.docker.io");
        assert_eq!(c.params["scope"], "repository:library/busybox:pull,push");
        let b = Challenge::parse(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(
            (b.scheme.as_str(), b.params["realm"].as_str()),
            ("basic", "Registry Realm")
        );
        let odd = Challenge::parse(r#"Bearer realm=http://x/t, error="a\"b""#).unwrap();
        assert_eq!(odd.params["realm"], "http://x/t");
        assert_eq!(odd.params["error"], "a\"b");
    }

    #[tokio::test]
    async fn an_https_registry_never_sends_credentials_to_a_plain_http_realm() {
        let auth = Auth::Basic {
            username: "u".into(),
            password: "secret".into(),
        };
        let registry = Registry::new("registry.example.com", auth.clone(), false).unwrap();
        let challenge = Challenge::parse(
            r#"Bearer realm="http://127.0.0.1:9/token",service="registry.example.com""#,
        )
        .unwrap();
        let err = registry
            .fetch_token(&challenge, "repository:app:pull")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("plain http"), "{err}");
        // A plain-http registry (loopback or insecure-listed) may: the fetch is tried (and
        // here fails to connect, not refused).
        let plain = Registry::new("127.0.0.1:9", auth, true).unwrap();
        let err = plain
            .fetch_token(&challenge, "repository:app:pull")
            .await
            .unwrap_err()
            .to_string();
        assert!(!err.contains("plain http"), "{err}");
    }
}
