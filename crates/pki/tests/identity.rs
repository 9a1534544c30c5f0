//! The cluster identity end to end in memory: a CA, hosts joining with tokens, and TLS
//! handshakes between them, including the hostile cases (another CA, another host's name,
//! no certificate, reused or expired tokens).

use bazaar_pki::*;
use rustls::pki_types::{CertificateDer, ServerName};
use std::sync::Arc;
use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn joined(ca: &ClusterCa, host_id: &str) -> HostIdentity {
    let token = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    let request = HostRequest::new(host_id).unwrap();
    let cert = ca.join(&token, host_id, &request.csr_pem, DAY).unwrap();
    request.into_identity(&cert, ca.cert_pem()).unwrap()
}

/// Runs a TLS handshake in memory; returns the client certificates the server saw.
fn handshake(
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    name: &str,
) -> Result<Option<Vec<CertificateDer<'static>>>, rustls::Error> {
    let mut c =
        rustls::ClientConnection::new(client, ServerName::try_from(name.to_string()).unwrap())?;
    let mut s = rustls::ServerConnection::new(server)?;
    for _ in 0..20 {
        let mut buf = Vec::new();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut buf.as_slice()).unwrap();
        s.process_new_packets()?;
        let mut buf = Vec::new();
        s.write_tls(&mut buf).unwrap();
        c.read_tls(&mut buf.as_slice()).unwrap();
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() {
            // The server reads the client's last flight.
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets()?;
            return Ok(s.peer_certificates().map(|c| c.to_vec()));
        }
    }
    panic!("handshake did not finish");
}

fn configs(identity: &HostIdentity) -> (Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>) {
    let handle = IdentityHandle::new(identity).unwrap();
    (
        client_config(&handle, identity.ca_pem()).unwrap(),
        server_config(&handle, identity.ca_pem()).unwrap(),
    )
}

#[test]
fn two_hosts_of_one_cluster_know_each_other_by_host_id() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let a = joined(&ca, "ha");
    let b = joined(&ca, "hb");
    let (a_client, _) = configs(&a);
    let (_, b_server) = configs(&b);
    let seen = handshake(a_client, b_server, &host_dns_name("hb")).unwrap();
    assert_eq!(peer_host_id(&seen.unwrap()).as_deref(), Some("ha"));
}

#[test]
fn a_host_claiming_another_hosts_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let a = joined(&ca, "ha");
    let c = joined(&ca, "hc");
    let (a_client, _) = configs(&a);
    let (_, c_server) = configs(&c);
    // a meant to reach hb; hc answers with its own (valid) certificate.
    let err = handshake(a_client, c_server, &host_dns_name("hb")).unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn certificates_of_another_ca_are_refused_both_ways() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(ours.path()).unwrap();
    let other = ClusterCa::init(theirs.path()).unwrap();
    let a = joined(&ca, "ha");
    let intruder = joined(&other, "hb");
    let (a_client, a_server) = configs(&a);
    let (x_client, x_server) = configs(&intruder);
    assert!(handshake(x_client, a_server, &host_dns_name("ha")).is_err());
    assert!(handshake(a_client, x_server, &host_dns_name("hb")).is_err());
}

#[test]
fn a_client_without_a_certificate_connects_but_names_no_host() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let a = joined(&ca, "ha");
    let (_, a_server) = configs(&a);
    let anonymous = join_client_config(&ca.fingerprint(), None).unwrap();
    let seen = handshake(anonymous, a_server, "anything").unwrap();
    assert!(seen.is_none());
}

#[test]
fn a_joining_host_refuses_a_server_of_another_ca() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(ours.path()).unwrap();
    let other = ClusterCa::init(theirs.path()).unwrap();
    let (_, impostor) = configs(&joined(&other, "ha"));
    let err = handshake(
        join_client_config(&ca.fingerprint(), None).unwrap(),
        impostor,
        "x",
    )
    .unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn a_join_token_is_used_once_and_expires() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let token = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    let first = HostRequest::new("h1").unwrap();
    ca.join(&token, "h1", &first.csr_pem, DAY).unwrap();
    let second = HostRequest::new("h2").unwrap();
    let err = ca.join(&token, "h2", &second.csr_pem, DAY).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");

    let expired = ca.new_join_token(Duration::ZERO).unwrap();
    let err = ca.join(&expired, "h2", &second.csr_pem, DAY).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    let mut forged = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    forged.secret = "00".repeat(32);
    assert!(ca.join(&forged, "h2", &second.csr_pem, DAY).is_err());
}

#[test]
fn bad_requests_change_nothing_and_ids_are_not_taken_twice() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let token = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    assert!(ca.join(&token, "h1", "not a csr", DAY).is_err());
    assert!(ca
        .join(&token, "H/1", &HostRequest::new("h1").unwrap().csr_pem, DAY)
        .is_err());
    // The token survived both.
    joined_with(&ca, &token, "h1").unwrap();
    // Another token cannot take h1's id.
    let again = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    let err = joined_with(&ca, &again, "h1").unwrap_err();
    assert!(
        err.to_string().contains("already has a certificate"),
        "{err}"
    );
    // and that token is still good for a new host.
    joined_with(&ca, &again, "h2").unwrap();
}

fn joined_with(ca: &ClusterCa, token: &JoinToken, host_id: &str) -> anyhow::Result<HostIdentity> {
    let request = HostRequest::new(host_id)?;
    let cert = ca.join(token, host_id, &request.csr_pem, DAY)?;
    request.into_identity(&cert, ca.cert_pem())
}

#[test]
fn a_token_of_another_cluster_is_refused() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(ours.path()).unwrap();
    let other = ClusterCa::init(theirs.path()).unwrap();
    let token = other.new_join_token(Duration::from_secs(3600)).unwrap();
    assert!(joined_with(&ca, &token, "h1").is_err());
}

#[test]
fn a_certificate_is_issued_for_the_id_asked_whatever_the_request_says() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(dir.path()).unwrap();
    let token = ca.new_join_token(Duration::from_secs(3600)).unwrap();
    // A request naming hvictim, joining as hnew: the certificate names hnew only.
    let request = HostRequest::new("hvictim").unwrap();
    let cert = ca.join(&token, "hnew", &request.csr_pem, DAY).unwrap();
    let der: Vec<CertificateDer> =
        rustls::pki_types::pem::PemObject::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    assert_eq!(peer_host_id(&der).as_deref(), Some("hnew"));
}

#[test]
fn the_identity_is_kept_private_and_renewal_swaps_it_for_new_connections() {
    use std::os::unix::fs::PermissionsExt;
    let ca_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(ca_dir.path()).unwrap();
    let a = joined(&ca, "ha");
    let tls = data.path().join("tls");
    a.save(&tls).unwrap();
    for name in ["host.pem", "ca.crt"] {
        let mode = std::fs::metadata(tls.join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name}");
    }
    let loaded = HostIdentity::load(&tls, "ha").unwrap().unwrap();
    assert_eq!(loaded.not_after(), a.not_after());
    assert!(loaded.renew_at() < loaded.not_after());
    // Loaded under another host id: refused.
    assert!(HostIdentity::load(&tls, "hb").is_err());

    let handle = IdentityHandle::new(&loaded).unwrap();
    let b = joined(&ca, "hb");
    let (b_client, _) = configs(&b);
    let server = server_config(&handle, ca.cert_pem()).unwrap();
    let before = handshake(b_client.clone(), server.clone(), &host_dns_name("ha"));
    assert!(before.is_ok());
    let request = HostRequest::new("ha").unwrap();
    let cert = ca.renew("ha", &request.csr_pem, 2 * DAY).unwrap();
    let renewed = request.into_identity(&cert, ca.cert_pem()).unwrap();
    assert!(renewed.not_after() > a.not_after());
    handle.replace(&renewed).unwrap();
    assert!(handshake(b_client, server, &host_dns_name("ha")).is_ok());
    // A host that never joined cannot renew.
    assert!(ca
        .renew("hz", &HostRequest::new("hz").unwrap().csr_pem, DAY)
        .is_err());
}
