//! Edge TLS on a 2-agent loopback cluster against a real ACME server: Debian's Pebble, its
//! HTTPS under a CA made here, its DNS answered by `pebble-challtestsrv` (every name is
//! 127.0.0.1) and its HTTP-01 validation sent to the *second* host's proxy while the first
//! host issues. Certificates from Pebble served through both proxies (chain checked with
//! Pebble's root), SNI for two apps, force_https, HTTP/2 over TLS, an unknown name's alert,
//! a certificate given as PEM, renewal of short-lived certificates, a failed challenge's
//! error, and removal.

use crate::proxy;

use proxy::*;
use reqwest::{Method, StatusCode};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pebble's certificates live this long: renewal (at 2/3) happens within the test.
const CERT_LIFETIME_S: u64 = 30;

/// Pebble and its DNS server, killed (and reaped) when dropped.
struct Pebble {
    children: Vec<Child>,
    dir: tempfile::TempDir,
    acme: SocketAddr,
    management: SocketAddr,
    dns_management: SocketAddr,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_addr() -> SocketAddr {
    SocketAddr::from((
        [127, 0, 0, 1],
        bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST),
    ))
}

/// A free port for both TCP and UDP (the DNS server).
fn free_udp_addr() -> SocketAddr {
    loop {
        let a = free_addr();
        if std::net::UdpSocket::bind(a).is_ok() {
            return a;
        }
    }
}

impl Pebble {
    /// Picks Pebble's addresses and makes the CA of its HTTPS (`ca.pem`); started by
    /// [`Pebble::start`] once the proxy it validates through is known.
    fn prepare() -> Pebble {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "bazaar test ACME CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "pebble");
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        Pebble {
            children: Vec::new(),
            dir,
            acme: free_addr(),
            management: free_addr(),
            dns_management: free_addr(),
        }
    }

    fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn directory(&self) -> String {
        format!("https://{}/dir", self.acme)
    }

    /// Starts the DNS server and Pebble, validating HTTP-01 on `http_port` of 127.0.0.1.
    fn start(&mut self, http_port: u16) {
        for exe in ["pebble", "pebble-challtestsrv"] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {exe}")])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success(),
                "{exe} is missing (Debian package pebble; scripts/test installs it)"
            );
        }
        let dns = free_udp_addr();
        let log = |name: &str| std::fs::File::create(self.dir.path().join(name)).unwrap();
        let dns_srv = Command::new("pebble-challtestsrv")
            .args([
                "-defaultIPv4",
                "127.0.0.1",
                "-defaultIPv6",
                "",
                "-dns01",
                &dns.to_string(),
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-management",
                &self.dns_management.to_string(),
            ])
            .stdout(log("challtestsrv.log"))
            .stderr(log("challtestsrv.err"))
            .spawn()
            .unwrap();
        self.children.push(dns_srv);
        let d = self.dir.path();
        let config = json!({"pebble": {
            "listenAddress": self.acme.to_string(),
            "managementListenAddress": self.management.to_string(),
            "certificate": d.join("cert.pem"),
            "privateKey": d.join("key.pem"),
            "httpPort": http_port,
            "tlsPort": 1,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "certificateValidityPeriod": CERT_LIFETIME_S,
        }});
        std::fs::write(d.join("pebble.json"), config.to_string()).unwrap();
        let pebble = Command::new("pebble")
            .arg("-config")
            .arg(d.join("pebble.json"))
            .arg("-dnsserver")
            .arg(dns.to_string())
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(log("pebble.log"))
            .stderr(log("pebble.err"))
            .spawn()
            .unwrap();
        self.children.push(pebble);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(self.acme).is_err()
            || std::net::TcpStream::connect(self.dns_management).is_err()
        {
            assert!(Instant::now() < deadline, "pebble did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes `host` resolve to `ip` for Pebble's validation.
    async fn set_a(&self, host: &str, ip: &str) {
        let r = reqwest::Client::new()
            .post(format!("http://{}/add-a", self.dns_management))
            .json(&json!({"host": format!("{host}."), "addresses": [ip]}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    /// The root Pebble issues under (its management API, over our CA's HTTPS).
    async fn root(&self) -> CertificateDer<'static> {
        let ca = roots_of(&std::fs::read_to_string(self.ca_file()).unwrap());
        let (status, _, body, _) = https(
            self.management,
            "localhost",
            &ca,
            &[b"http/1.1"],
            "/roots/0",
        )
        .await
        .expect("pebble's management API");
        assert_eq!(status, 200);
        pem_certs(&body).remove(0)
    }
}

fn pem_certs(pem: &str) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap()
}

fn roots_of(pem: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(pem) {
        roots.add(c).unwrap();
    }
    roots
}

/// What an HTTPS exchange gave: status, headers, body and the server's leaf certificate.
type HttpsAnswer = (
    u16,
    http::HeaderMap,
    String,
    (CertificateDer<'static>, Vec<u8>),
);

/// `GET path` over TLS to `addr` with SNI (and Host) `name`, the chain checked against
/// `roots`, offering `alpn`; the leaf and the protocol negotiated come back too.
async fn https(
    addr: SocketAddr,
    name: &str,
    roots: &rustls::RootCertStore,
    alpn: &[&[u8]],
    path: &str,
) -> Result<HttpsAnswer, String> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots.clone())
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let server = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(server, tcp))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    let leaf = conn.peer_certificates().unwrap()[0].clone().into_owned();
    let negotiated = conn.alpn_protocol().unwrap_or_default().to_vec();
    let io = hyper_util::rt::TokioIo::new(tls);
    let uri = format!("https://{name}{path}");
    let req = http::Request::get(&uri)
        .header("host", name)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = if negotiated == b"h2" {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let (mut parts, body) = req.into_parts();
        parts.headers.remove("host");
        send.send_request(http::Request::from_parts(parts, body))
            .await
            .map_err(|e| e.to_string())?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        send.send_request(req).await.map_err(|e| e.to_string())?
    };
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    use http_body_util::BodyExt;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        status,
        headers,
        String::from_utf8_lossy(&body).into_owned(),
        (leaf, negotiated),
    ))
}

/// Two connections of one client (one request each), and how each handshake went.
async fn handshake_kinds(
    addr: SocketAddr,
    name: &str,
    roots: &rustls::RootCertStore,
) -> Vec<rustls::HandshakeKind> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth(),
    );
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await
            .unwrap();
        let req = format!("GET / HTTP/1.1\r\nhost: {name}\r\nconnection: close\r\n\r\n");
        tls.write_all(req.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // The proxy ends a closed answer with close_notify (rustls reports an unexpected
        // end of file otherwise): a truncated answer is told from a whole one.
        tls.read_to_end(&mut answer)
            .await
            .expect("the answer ends with close_notify");
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        kinds.push(tls.get_ref().1.handshake_kind().unwrap());
    }
    kinds
}

async fn certs_call(
    c: &Cluster,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    c.api(method, path, body).await
}

/// Waits until the certificate of `hostname` has left `pending`; returns it.
async fn settled(c: &Cluster, app: &str, hostname: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, v) = certs_call(
            c,
            Method::GET,
            &format!("/apps/{app}/certificates/{hostname}"),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if v["status"] != "pending" {
            return v;
        }
        assert!(Instant::now() < deadline, "still pending: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `bazaar certs ...` against agent 0, as a user runs it.
fn cli(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = Command::new(EXE)
        .arg("certs")
        .args(args)
        .env("BAZAAR_API_URL", c.agents[0].url())
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificates_from_pebble_are_served_by_every_proxy() {
    let mut pebble = Pebble::prepare();
    let directory = pebble.directory();
    let ca = pebble.ca_file();
    let c = Cluster::start(
        2,
        &[
            "--acme-directory",
            &directory,
            "--acme-ca",
            ca.to_str().unwrap(),
        ],
    );
    // Validation reaches the second host's proxy; the first host issues.
    pebble.start(c.agents[1].proxy_addr().port());
    let tls: Vec<SocketAddr> = c
        .agents
        .iter()
        .map(|a| a.proxy_tls_addr().unwrap())
        .collect();

    c.create_app("web").await;
    c.create_app("api").await;
    let ports = json!({"ports": [
        {"port": 80, "handlers": ["http"], "force_https": true},
        {"port": 443, "handlers": ["tls", "http"]},
    ]});
    c.create_machine("web", ports, json!({})).await;
    c.create_machine("api", json!({}), json!({})).await;
    c.wait_routable(0, "api").await;

    // Issued by ACME through the CLI; pending until Pebble validated through host 1.
    let (ok, out) = cli(&c, &["add", "-a", "web", "web.example.com"]);
    assert!(ok, "{out}");
    assert!(out.contains("pending"), "{out}");
    let web = settled(&c, "web", "web.example.com").await;
    assert_eq!(web["status"], "issued", "{web}");
    assert_eq!(web["source"], "acme");
    let (s, api_cert) = certs_call(
        &c,
        Method::POST,
        "/apps/api/certificates",
        Some(json!({"hostname": "API.example.com"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{api_cert}");
    assert_eq!(api_cert["hostname"], "api.example.com");
    assert_eq!(
        settled(&c, "api", "api.example.com").await["status"],
        "issued"
    );
    let (ok, out) = cli(&c, &["show", "-a", "web", "web.example.com"]);
    assert!(
        ok && out.contains("issued") && out.contains("not_after"),
        "{out}"
    );
    let (ok, out) = cli(&c, &["list", "-a", "api"]);
    assert!(ok && out.contains("api.example.com"), "{out}");

    // Served through both hosts' proxies, the chain checked against Pebble's root; the
    // machine sees X-Forwarded-Proto: https.
    let root = pebble.root().await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).unwrap();
    let mut web_leaf = None;
    for addr in &tls {
        let (s, _, body, (leaf, proto)) = https(
            *addr,
            "web.example.com",
            &roots,
            &[b"http/1.1"],
            "/hello?x=1",
        )
        .await
        .unwrap();
        assert_eq!(s, 200, "{body}");
        assert_eq!(proto, b"http/1.1");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["headers"]["x-forwarded-proto"], "https", "{v}");
        assert_eq!(v["headers"]["host"], "web.example.com", "{v}");
        web_leaf = Some(leaf);
    }
    let web_leaf = web_leaf.unwrap();

    // SNI picks the certificate, and the hostname the app.
    let (s, _, body, (api_leaf, _)) = https(tls[1], "api.example.com", &roots, &[b"http/1.1"], "/")
        .await
        .unwrap();
    assert_eq!(s, 200, "{body}");
    assert_ne!(api_leaf, web_leaf);
    let api_machine = machine_of(&body);
    let (_, machines) = c.api(Method::GET, "/apps/api/machines", None).await;
    assert_eq!(machines[0]["id"], api_machine.as_str());

    // Session resumption: a second connection of the same client resumes (ticket).
    assert_eq!(
        handshake_kinds(tls[0], "web.example.com", &roots).await,
        [rustls::HandshakeKind::Full, rustls::HandshakeKind::Resumed]
    );

    // HTTP/2 over TLS.
    let (s, _, body, (_, proto)) = https(tls[0], "web.example.com", &roots, &[b"h2"], "/h2")
        .await
        .unwrap();
    assert_eq!(s, 200, "{body}");
    assert_eq!(proto, b"h2");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["headers"]["x-forwarded-proto"], "https", "{v}");

    // force_https: plain HTTP is redirected, path and query kept; an app without it is
    // served over plain HTTP at its hostname too.
    let plain = |i: usize, host: &str, path: &str| {
        let url = format!("{}{path}", c.agents[i].proxy_url());
        let req = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .get(url)
            .header("host", host);
        async move { req.send().await.unwrap() }
    };
    let r = plain(1, "web.example.com", "/a/b?c=d&e=1").await;
    assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(
        r.headers()["location"],
        format!("https://web.example.com:{}/a/b?c=d&e=1", tls[1].port()).as_str()
    );
    let r = plain(0, "web.localhost", "/x").await;
    assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
    let r = plain(0, "api.example.com", "/").await;
    assert_eq!(r.status(), StatusCode::OK);

    // A name without a certificate: a fatal alert at once, no hang.
    let started = Instant::now();
    let err = https(tls[0], "nope.example.com", &roots, &[b"http/1.1"], "/")
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert!(
        err.contains("AccessDenied") || err.contains("alert"),
        "{err}"
    );

    // A certificate given as PEM, served at once; bad ones refused with Fly's error shape.
    let key = rcgen::KeyPair::generate().unwrap();
    let own = rcgen::CertificateParams::new(vec!["own.example.com".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let pem =
        |cert: &str, key: &str, host: &str| json!({"hostname": host, "cert": cert, "key": key});
    let other_key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let expired = {
        let mut p = rcgen::CertificateParams::new(vec!["own.example.com".to_string()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2019, 1, 1);
        p.not_after = rcgen::date_time_ymd(2020, 1, 1);
        p.self_signed(&key).unwrap()
    };
    for (body, why) in [
        (
            pem(&own.pem(), &other_key, "own.example.com"),
            "does not match",
        ),
        (
            pem(&own.pem(), &key.serialize_pem(), "else.example.com"),
            "does not name",
        ),
        (
            pem("junk", &key.serialize_pem(), "own.example.com"),
            "certificate",
        ),
        (json!({"hostname": "not a name"}), "not a valid hostname"),
        (
            json!({"hostname": "own.example.com", "cert": own.pem()}),
            "both",
        ),
        (
            pem(&expired.pem(), &key.serialize_pem(), "own.example.com"),
            "expired",
        ),
    ] {
        let (s, v) = certs_call(&c, Method::POST, "/apps/api/certificates", Some(body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"].as_str().unwrap().contains(why), "{v}");
    }
    let (s, v) = certs_call(
        &c,
        Method::POST,
        "/apps/web/certificates",
        Some(json!({"hostname": "api.example.com"})),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = certs_call(
        &c,
        Method::POST,
        "/apps/api/certificates",
        Some(pem(&own.pem(), &key.serialize_pem(), "own.example.com")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["source"], "custom");
    let own_roots = roots_of(&own.pem());
    let served = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        https(tls[1], "own.example.com", &own_roots, &[b"http/1.1"], "/")
            .await
            .ok()
            .filter(|a| a.0 == 200)
    })
    .await;
    assert!(served.is_ok(), "the PEM certificate is served by host 1");

    // A failed challenge: the name resolves where nothing answers; the error says why.
    pebble.set_a("down.example.com", "127.0.0.2").await;
    let (s, v) = certs_call(
        &c,
        Method::POST,
        "/apps/web/certificates",
        Some(json!({"hostname": "down.example.com"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let failed = settled(&c, "web", "down.example.com").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let why = failed["error"].as_str().unwrap();
    assert!(why.contains("ACME") && why.contains("127.0.0.2"), "{why}");
    let (ok, out) = cli(&c, &["show", "-a", "web", "down.example.com"]);
    assert!(
        ok && out.contains("failed") && out.contains("127.0.0.2"),
        "{out}"
    );

    // Renewal at 2/3 of the life: both proxies serve a new certificate before the old
    // one expires.
    let renewed = bazaar_testkit::eventually(Duration::from_secs(CERT_LIFETIME_S + 15), || async {
        let mut leaves = Vec::new();
        for addr in &tls {
            let a = https(*addr, "web.example.com", &roots, &[b"http/1.1"], "/").await;
            leaves.push(a.ok()?.3 .0);
        }
        leaves.iter().all(|l| *l != web_leaf).then_some(())
    })
    .await;
    assert!(renewed.is_ok(), "the certificate was not renewed");
    let now = settled(&c, "web", "web.example.com").await;
    assert_eq!(now["status"], "issued");
    assert!(
        now["not_after"].as_str() > web["not_after"].as_str(),
        "{now} vs {web}"
    );

    // Removed: no proxy serves the name any more.
    let (ok, out) = cli(&c, &["remove", "-a", "api", "api.example.com"]);
    assert!(ok, "{out}");
    let gone = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let mut all = true;
        for addr in &tls {
            all &= https(*addr, "api.example.com", &roots, &[b"http/1.1"], "/")
                .await
                .is_err();
        }
        all.then_some(())
    })
    .await;
    assert!(gone.is_ok(), "api.example.com still served after removal");
    let (s, _) = certs_call(
        &c,
        Method::GET,
        "/apps/api/certificates/api.example.com",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // The issuing host dies: the live host with the lowest id (host 1, the only one left)
    // renews in its place, and its row becomes the certificate.
    let owner = now["owner_host"].as_str().unwrap().to_string();
    let before = https(tls[1], "web.example.com", &roots, &[b"http/1.1"], "/")
        .await
        .unwrap()
        .3
         .0;
    let mut c = c;
    c.agents[0].kill9();
    let fly1 = bazaar_testkit::Fly::new(&c.agents[1]);
    let taken = bazaar_testkit::eventually(Duration::from_secs(CERT_LIFETIME_S + 15), || async {
        let (_, v) = fly1
            .call(Method::GET, "/apps/web/certificates/web.example.com", None)
            .await;
        let leaf = https(tls[1], "web.example.com", &roots, &[b"http/1.1"], "/")
            .await
            .ok()?
            .3
             .0;
        (v["owner_host"] != owner.as_str() && v["status"] == "issued" && leaf != before)
            .then_some(v)
    })
    .await;
    assert!(taken.is_ok(), "host 1 did not take the renewal over");
    drop(pebble);
}
