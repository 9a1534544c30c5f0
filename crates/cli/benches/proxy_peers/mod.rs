//! The proxy bench's peers and client: HAProxy configured to do bazaar's header work, the
//! TLS material shared by nginx and bazaar (one certificate, one cipher suite), wrk runs
//! (plain, HTTPS keep-alive, a new TLS connection per request) and the load average.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The hostname the HTTPS rows ask for (SNI and Host): bazaar picks its certificate by it.
pub const TLS_HOST: &str = "bench.localhost";
/// The one TLS 1.3 cipher suite and key exchange group both servers are held to (through
/// the client's OpenSSL configuration, since bazaar's server side is not configurable).
const CIPHER: &str = "TLS_AES_128_GCM_SHA256";
const GROUP: &str = "X25519";

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// With `BAZAAR_BENCH_PIN` set, every proxy runs on CPU [`PROXY_CPU`] and wrk and the
/// backend on [`CLIENT_CPU`]: each proxy gets the same one core, whatever else runs.
pub fn pinned() -> bool {
    std::env::var_os("BAZAAR_BENCH_PIN").is_some()
}
pub const PROXY_CPU: usize = 0;
pub const CLIENT_CPU: usize = 1;

/// Pins every thread of process `pid` to `cpu` (`taskset -a`).
pub fn pin(pid: u32, cpu: usize) {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "taskset could not pin {pid} to CPU {cpu}");
}

/// Installs the Debian packages whose commands are missing (`(command, package)`).
pub fn ensure_packages(wanted: &[(&str, &str)]) {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(bin, _)| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "command -v {bin} >/dev/null || test -x /usr/sbin/{bin}"
                ))
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return;
    }
    eprintln!("installing {missing:?} with apt-get");
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {}",
            missing.join(" ")
        ))
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "could not install {missing:?}");
}

/// `/usr/sbin/<name>` when it is there (Debian's daemons), else `name` on the PATH.
pub fn sbin(name: &str) -> String {
    let p = format!("/usr/sbin/{name}");
    if Path::new(&p).exists() {
        p
    } else {
        name.to_string()
    }
}

/// HAProxy (`nbthread 2`) in front of `upstream` on `port`, doing bazaar's header work:
/// X-Forwarded-For (`option forwardfor`), X-Forwarded-Proto, and a request id sent to the
/// machine and returned to the client; idle upstream connections shared (`http-reuse
/// always`).
pub fn start_haproxy(dir: &Path, port: u16, upstream: &str) -> Child {
    let conf = format!(
        r#"global
    nbthread 2
    maxconn 8192
    log stderr format raw local0 err
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    http-reuse always
frontend bench
    bind 127.0.0.1:{port}
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    http-response set-header X-Request-Id %[unique-id]
    default_backend machine
backend machine
    server m1 {upstream}
"#
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, conf).unwrap();
    Command::new(sbin("haproxy"))
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .spawn()
        .expect("haproxy starts")
}

/// The TLS material of the HTTPS rows, in `dir`: a self-signed ECDSA P-256 certificate for
/// [`TLS_HOST`], an OpenSSL configuration that holds wrk to one cipher suite and group, and
/// a hosts file that resolves [`TLS_HOST`] to loopback (bind-mounted over `/etc/hosts` for
/// wrk alone, in a mount namespace of its own).
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    openssl_conf: PathBuf,
    hosts: PathBuf,
}

impl Tls {
    pub fn make(dir: &Path) -> Tls {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let ok = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .arg("ec_paramgen_curve:prime256v1")
            .args(["-nodes", "-days", "2", "-subj"])
            .arg(format!("/CN={TLS_HOST}"))
            .arg("-addext")
            .arg(format!("subjectAltName=DNS:{TLS_HOST}"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "openssl could not make the bench certificate");
        let openssl_conf = dir.join("openssl-client.cnf");
        std::fs::write(
            &openssl_conf,
            format!(
                "openssl_conf = init\n[init]\nssl_conf = ssl\n[ssl]\nsystem_default = client\n\
                 [client]\nMinProtocol = TLSv1.3\nCiphersuites = {CIPHER}\nGroups = {GROUP}\n"
            ),
        )
        .unwrap();
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, format!("127.0.0.1 localhost {TLS_HOST}\n")).unwrap();
        Tls {
            cert,
            key,
            openssl_conf,
            hosts,
        }
    }

    /// The nginx `server` blocks for the HTTPS rows: keep-alive on `port`, and on
    /// `close_port` the same with the connection closed after each answer (every request
    /// a new TLS connection), both doing bazaar's header work with `X-Forwarded-Proto https`.
    pub fn nginx_servers(&self, port: u16, close_port: u16) -> String {
        let server = |port: u16, extra: &str| {
            format!(
                r#"
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name {TLS_HOST};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:bench:10m;
        {extra}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Request-Id $request_id;
            add_header X-Request-Id $request_id always;
        }}
    }}"#,
                cert = self.cert.display(),
                key = self.key.display(),
            )
        };
        server(port, "") + &server(close_port, "keepalive_timeout 0;")
    }
}

/// What one wrk run asks for.
#[derive(Clone, Copy)]
pub struct Load<'a> {
    pub url: &'a str,
    /// `Host` header to send (the URL's otherwise).
    pub host: Option<&'a str>,
    /// Ask for the connection to close after each answer: a new connection per request.
    pub close: bool,
    /// Over TLS with this material (the URL names [`TLS_HOST`]).
    pub tls: Option<&'a Tls>,
}

#[derive(Debug)]
pub struct WrkResult {
    pub rps: f64,
    pub p50: String,
    pub p99: String,
    /// wrk's "Socket errors" line (connect, read, write, timeout), when it printed one.
    pub errors: Option<String>,
}

pub fn wrk(load: Load<'_>, secs: u64, conns: u64) -> WrkResult {
    let mut args: Vec<String> = vec![
        "-t2".into(),
        format!("-c{conns}"),
        format!("-d{secs}s"),
        "--latency".into(),
    ];
    if let Some(h) = load.host {
        args.extend(["-H".into(), format!("Host: {h}")]);
    }
    if load.close {
        args.extend(["-H".into(), "Connection: close".into()]);
    }
    args.push(load.url.to_string());
    let out = match load.tls {
        None => wrk_command("wrk").args(&args).output(),
        Some(tls) => {
            // wrk resolves the URL's name (and sends it as SNI): a hosts file of our own,
            // seen by wrk only.
            let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
            wrk_command("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(format!(
                    "mount --bind '{}' /etc/hosts && exec wrk {}",
                    tls.hosts.display(),
                    quoted.join(" ")
                ))
                .env("OPENSSL_CONF", &tls.openssl_conf)
                .output()
        }
    }
    .expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    let rps = field("Requests/sec:").parse().unwrap_or(0.0);
    let non2xx = text.contains("Non-2xx");
    assert!(
        !non2xx && rps > 0.0,
        "wrk {}:\n{text}\n{}",
        load.url,
        String::from_utf8_lossy(&out.stderr)
    );
    WrkResult {
        rps,
        p50: field("50%"),
        p99: field("99%"),
        errors: text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("Socket errors:"))
            .map(|e| e.trim().to_string()),
    }
}

/// `program` (wrk, or what execs it), on [`CLIENT_CPU`] when [`pinned`].
fn wrk_command(program: &str) -> Command {
    if pinned() {
        let mut c = Command::new("taskset");
        c.args(["-c", &CLIENT_CPU.to_string(), program]);
        c
    } else {
        Command::new(program)
    }
}

/// A wrk latency (`987.00us`, `3.07ms`, `1.20s`) in milliseconds.
pub fn millis(text: &str) -> f64 {
    let (number, unit) = text.split_at(
        text.find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(text.len()),
    );
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1e3,
        "s" => n * 1e3,
        "m" => n * 60e3,
        _ => n,
    }
}

/// Whether this build's agent has an HTTPS listener for its proxy.
pub fn bazaar_has_tls(exe: &Path) -> bool {
    Command::new(exe)
        .args(["agent", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--proxy-tls-listen"))
}

/// Gives app `app` the bench certificate for [`TLS_HOST`] through the CLI (`bazaar certs
/// add --cert --key`).
pub fn bazaar_add_cert(exe: &Path, api: &str, token: &str, app: &str, tls: &Tls) {
    let out = Command::new(exe)
        .args(["certs", "add", "-a", app, TLS_HOST, "--cert"])
        .arg(&tls.cert)
        .arg("--key")
        .arg(&tls.key)
        .env("BAZAAR_API_URL", api)
        .env("BAZAAR_TOKEN", token)
        .output()
        .expect("bazaar certs add runs");
    assert!(
        out.status.success(),
        "bazaar certs add: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
