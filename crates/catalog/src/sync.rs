//! Anti-entropy over TCP, and tombstone collection.
//!
//! Every `anti_entropy_interval` (±25%) a node picks `sync_fanout` random live peers (its
//! seeds while it knows none) and sends each its digest (one entry per owner: max version,
//! count, hash). The peer answers with the rows the node lacks of every owner whose entry
//! differs (the rows above the node's max version when it is merely behind, all of that
//! owner's rows when it missed one) and its own entries for those owners; the node pushes
//! what the peer lacks in return. A node that was away or partitioned thus catches up from
//! a couple of peers without a full resend, and a converged cluster exchanges only
//! digests (a few dozen bytes per host, independent of the number of machines). Rows too big to broadcast make receivers of
//! their hint pull from the owner at once through the same exchange.
//!
//! The answering side guards its few answer slots: a connection must present an
//! authenticated frame header within `HEADER_DEADLINE` before it may take one (at most
//! `MAX_HANDSHAKES` connections wait for that at once), a peer holds at most
//! `MAX_ANSWERS_PER_PEER` slots, a request (the first frame) is at most `MAX_REQUEST`
//! bytes and must arrive at `MIN_REQUEST_RATE`,
//! and frames above the configured cap are refused from their header. Every row received
//! is checked against its owner's key; an owner's complete set (which may drop rows) is
//! believed only with the owner's signed digest entry ([`crate::trust`]).

use crate::node::{Counters, Shared};
use crate::replica::{DigestEntry, Replica, Row};
use crate::wire::{self, FrameHeader, SyncMsg, WireRow};
use anyhow::{bail, Context};
use rand::seq::IndexedRandom;
use rand::Rng;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::timeout;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// Rows per response or push, at most (whole owners only, so a little more): a node far
/// behind catches up over a few rounds instead of in one huge, slow exchange.
pub(crate) const MAX_ROWS_PER_MESSAGE: usize = 500;
/// Exchanges a node answers at once; more are refused at once (the initiator tries other
/// peers next round), so an overloaded node sheds work instead of timing everything out.
const MAX_CONCURRENT_ANSWERS: usize = 4;
/// A connection must present an authenticated frame header within this long.
const HEADER_DEADLINE: Duration = Duration::from_secs(1);
/// The largest request (a digest: a few dozen bytes per host) a slot is taken for.
const MAX_REQUEST: usize = 4 * 1024 * 1024;
/// A request's payload must arrive at this rate at least (after a first second), so a slow
/// peer holds a slot for seconds, not for the whole exchange's timeout.
const MIN_REQUEST_RATE: usize = 1024 * 1024;
/// Connections that have not yet presented their header, at most; more are closed at once.
const MAX_HANDSHAKES: usize = 64;
/// Answers one peer may hold at once (a periodic exchange and a hint's pull may overlap).
const MAX_ANSWERS_PER_PEER: usize = 2;

/// Accepts anti-entropy connections until aborted.
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let mut conns = JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_ANSWERS));
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    // Answers in progress per peer (by the id in its authenticated header).
    let answering: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    loop {
        while conns.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "too many connections waiting, refusing one");
                    continue;
                };
                let (shared, slots, answering) = (shared.clone(), slots.clone(), answering.clone());
                conns.spawn(async move {
                    let outcome =
                        admit_and_answer(&shared, stream, handshake, &slots, &answering).await;
                    if let Err(e) = outcome {
                        Counters::add(&shared.counters.rejected, 1);
                        tracing::debug!(%peer, error = %e, "sync from peer failed");
                    }
                });
            }
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// With a CA, first the TLS handshake (a client certificate of the CA is required, so a
/// peer without one is refused before it can send a byte of a frame), then as without:
/// see [`admit_and_answer_on`].
async fn admit_and_answer(
    shared: &Shared,
    stream: TcpStream,
    handshake: tokio::sync::OwnedSemaphorePermit,
    slots: &Arc<tokio::sync::Semaphore>,
    answering: &Mutex<HashMap<String, usize>>,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let Some(tls) = &shared.tls else {
        return admit_and_answer_on(shared, stream, None, handshake, slots, answering).await;
    };
    let stream = timeout(HEADER_DEADLINE, tls.acceptor.accept(stream))
        .await
        .context("no TLS handshake in time")?
        .context("TLS handshake refused")?;
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(bazaar_pki::peer_host_id)
        .context("no host certificate")?;
    anyhow::ensure!(!shared.is_revoked(&peer), "{peer} is revoked");
    admit_and_answer_on(shared, stream, Some(peer), handshake, slots, answering).await
}

/// Reads the first frame header (within [`HEADER_DEADLINE`]), takes an answer slot if one
/// is free and the peer holds none, and answers. Refusals are errors. `tls_peer` is the
/// host the peer's certificate names, which its frames must name too.
async fn admit_and_answer_on<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    mut stream: S,
    tls_peer: Option<String>,
    handshake: tokio::sync::OwnedSemaphorePermit,
    slots: &Arc<tokio::sync::Semaphore>,
    answering: &Mutex<HashMap<String, usize>>,
) -> anyhow::Result<()> {
    let header = timeout(
        HEADER_DEADLINE,
        shared
            .auth
            .read_header(&mut stream, shared.config.max_frame),
    )
    .await
    .context("no frame header in time")??
    .context("closed before a frame")?;
    drop(handshake);
    if let Some(peer) = &tls_peer {
        anyhow::ensure!(
            header.sender == *peer,
            "frames from {} over {peer}'s certificate",
            header.sender
        );
    }
    anyhow::ensure!(
        !shared.is_revoked(&header.sender),
        "{} is revoked",
        header.sender
    );
    if header.len > MAX_REQUEST {
        bail!("a request of {} bytes is too large", header.len);
    }
    let Ok(_slot) = slots.clone().try_acquire_owned() else {
        bail!("too many syncs at once");
    };
    let peer = header.sender.clone();
    {
        let mut answering = lock(answering);
        let held = answering.entry(peer.clone()).or_default();
        if *held >= MAX_ANSWERS_PER_PEER {
            bail!("{peer} already has {held} syncs in progress");
        }
        *held += 1;
    }
    let outcome = timeout(SYNC_TIMEOUT, answer(shared, stream, header)).await;
    {
        let mut answering = lock(answering);
        if let Some(held) = answering.get_mut(&peer) {
            *held -= 1;
            if *held == 0 {
                answering.remove(&peer);
            }
        }
    }
    outcome.context("timed out")?
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs anti-entropy rounds, hint pulls and tombstone collection until aborted.
pub(crate) async fn anti_entropy(shared: Arc<Shared>, mut pulls: mpsc::Receiver<String>) {
    let mut syncs = JoinSet::new();
    loop {
        while syncs.try_join_next().is_some() {}
        let interval = shared.config.anti_entropy_interval;
        let wait = interval.mul_f64(rand::rng().random_range(0.75..1.25));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {
                collect_garbage(&shared);
                for peer in pick_peers(&shared) {
                    syncs.spawn(sync_logged(shared.clone(), peer));
                }
            }
            Some(owner) = pulls.recv() => {
                let mut owners = BTreeSet::from([owner]);
                while let Ok(more) = pulls.try_recv() {
                    owners.insert(more);
                }
                for owner in owners {
                    Counters::add(&shared.counters.pulls, 1);
                    if let Some(peer) = pull_target(&shared, &owner) {
                        syncs.spawn(sync_logged(shared.clone(), peer));
                    }
                }
            }
        }
    }
}

fn collect_garbage(shared: &Shared) {
    let ttl = shared.config.tombstone_ttl.as_millis() as u64;
    let removed = shared
        .write()
        .replica
        .collect_garbage(bazaar_types::now_ms(), ttl);
    if !removed.is_empty() {
        tracing::debug!(count = removed.len(), "collected tombstones");
        shared.notify(&removed);
    }
}

/// `sync_fanout` random live peers, or the seeds while no peer is known.
fn pick_peers(shared: &Shared) -> Vec<SocketAddr> {
    let mut candidates: Vec<SocketAddr> = shared.read().members.live_addrs();
    if candidates.is_empty() {
        candidates = shared.config.seeds.clone();
    }
    candidates.retain(|a| *a != shared.addr && !shared.is_blocked(a));
    candidates
        .choose_multiple(&mut rand::rng(), shared.config.sync_fanout)
        .copied()
        .collect()
}

/// Where to pull an owner's rows from: the owner itself when it is reachable.
fn pull_target(shared: &Shared, owner: &str) -> Option<SocketAddr> {
    let st = shared.read();
    match st.members.get(owner) {
        Some(m)
            if matches!(
                m.status,
                crate::HostStatus::Alive | crate::HostStatus::Suspect
            ) =>
        {
            Some(m.addr)
        }
        _ => {
            drop(st);
            pick_peers(shared).into_iter().next()
        }
    }
}

async fn sync_logged(shared: Arc<Shared>, peer: SocketAddr) {
    Counters::add(&shared.counters.syncs, 1);
    let outcome = timeout(SYNC_TIMEOUT, sync_with(&shared, peer)).await;
    let failed = match outcome {
        Ok(Ok(())) => false,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "sync failed");
            true
        }
        Err(_) => {
            tracing::debug!(%peer, "sync timed out");
            true
        }
    };
    if failed {
        Counters::add(&shared.counters.syncs_failed, 1);
    }
}

/// One exchange with `peer`, as the initiator: over mTLS with a CA (the peer must be a
/// host of the CA, not revoked, and its frames must name the host its certificate names).
pub(crate) async fn sync_with(shared: &Shared, peer: SocketAddr) -> anyhow::Result<()> {
    if shared.is_blocked(&peer) {
        bail!("peer is partitioned away");
    }
    let stream = timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
        .await
        .context("connect timed out")??;
    stream.set_nodelay(true)?;
    let Some(tls) = &shared.tls else {
        return exchange(shared, stream, None).await;
    };
    // The verifier takes any host of the CA; the name only has to be valid.
    let name = rustls::pki_types::ServerName::try_from(bazaar_pki::HOST_NAME_SUFFIX)?;
    let stream = timeout(CONNECT_TIMEOUT, tls.connector.connect(name, stream))
        .await
        .context("TLS handshake timed out")?
        .context("TLS handshake")?;
    let peer_id = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(bazaar_pki::peer_host_id)
        .context("the peer presented no host certificate")?;
    anyhow::ensure!(!shared.is_revoked(&peer_id), "{peer_id} is revoked");
    exchange(shared, stream, Some(peer_id)).await
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    mut stream: S,
    tls_peer: Option<String>,
) -> anyhow::Result<()> {
    let request = SyncMsg::Request {
        from: shared.node_id().to_owned(),
        from_addr: shared.addr,
        digest: shared.read().replica.digest_entries(),
        revocations: revocations(shared),
    };
    send(shared, &mut stream, &request).await?;
    let Some((header, frame)) = receive(shared, &mut stream).await? else {
        bail!("closed before a response");
    };
    if let Some(peer) = &tls_peer {
        anyhow::ensure!(
            header.sender == *peer,
            "frames from {} over {peer}'s certificate",
            header.sender
        );
    }
    let SyncMsg::Response {
        from,
        rows,
        want,
        complete,
        revocations,
    } = wire::decode(&frame)?
    else {
        bail!("expected a sync response");
    };
    anyhow::ensure!(
        from == header.sender,
        "response from {from} sent by {}",
        header.sender
    );
    merge_revocations(shared, &revocations);
    merge_rows(shared, &from, rows, complete);
    shared.write().synced = true;
    if !want.is_empty() {
        let (rows, complete) = {
            let st = shared.read();
            let me = shared.node_id();
            let mut rows = Vec::new();
            for t in &want {
                if rows.len() >= MAX_ROWS_PER_MESSAGE {
                    break;
                }
                if let Some(mine) = st.replica.entry(&t.owner) {
                    rows.extend(rows_for(&st.replica, me, &mine, Some(t)));
                }
            }
            let complete = own_entry_if_sent(&st.replica, me, &rows);
            (rows, complete)
        };
        let push = SyncMsg::Push {
            rows: rows.iter().map(WireRow::from_row).collect(),
            complete: complete.map(|e| shared.sign_complete_set(e)),
        };
        send(shared, &mut stream, &push).await?;
    }
    Ok(())
}

/// This node's digest entry when `rows` carry its rows (they then carry all of them).
fn own_entry_if_sent(replica: &Replica, me: &str, rows: &[Row]) -> Option<DigestEntry> {
    rows.iter()
        .any(|r| r.owner == me)
        .then(|| replica.entry(me))
        .flatten()
}

/// Checks and merges rows received from `from`; `complete` is its signed claim that its
/// own rows among them are its complete set.
fn merge_rows(
    shared: &Shared,
    from: &str,
    rows: Vec<WireRow>,
    complete: Option<crate::trust::SignedEntry>,
) {
    let claimed = complete.as_ref().map(|_| from);
    let rows = decode_rows(shared, rows, claimed);
    let authority = complete
        .filter(|c| shared.is_complete_set(from, c, &rows))
        .map(|_| from);
    shared.merge(rows, authority);
}

/// One exchange, as the peer asked; `header` is the first frame's, already checked.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    mut stream: S,
    header: FrameHeader,
) -> anyhow::Result<()> {
    let deadline = HEADER_DEADLINE + Duration::from_secs((header.len / MIN_REQUEST_RATE) as u64);
    let frame = timeout(deadline, shared.auth.read_body(&mut stream, &header))
        .await
        .context("request too slow")??;
    Counters::add(&shared.counters.tcp_bytes_received, frame.len());
    let SyncMsg::Request {
        from,
        from_addr,
        digest,
        revocations: theirs,
    } = wire::decode(&frame)?
    else {
        bail!("expected a sync request");
    };
    anyhow::ensure!(
        from == header.sender,
        "request from {from} sent by {}",
        header.sender
    );
    if shared.is_blocked(&from_addr) {
        Counters::add(&shared.counters.dropped_partitioned, 1);
        return Ok(());
    }
    merge_revocations(shared, &theirs);
    // Copy under the lock, encode outside it.
    let (rows, want, complete) = {
        let st = shared.read();
        let me = shared.node_id();
        let (rows, want) = diff(&st.replica, me, &digest);
        let complete = st
            .synced
            .then(|| own_entry_if_sent(&st.replica, me, &rows))
            .flatten();
        (rows, want, complete)
    };
    let response = SyncMsg::Response {
        from: shared.node_id().to_owned(),
        rows: rows.iter().map(WireRow::from_row).collect(),
        want,
        complete: complete.map(|e| shared.sign_complete_set(e)),
        revocations: revocations(shared),
    };
    let wants = matches!(&response, SyncMsg::Response { want, .. } if !want.is_empty());
    send(shared, &mut stream, &response).await?;
    if wants {
        let Some((header, frame)) = receive(shared, &mut stream).await? else {
            bail!("closed before a push");
        };
        anyhow::ensure!(from == header.sender, "push from {}", header.sender);
        let SyncMsg::Push { rows, complete } = wire::decode(&frame)? else {
            bail!("expected a sync push");
        };
        merge_rows(shared, &from, rows, complete);
        shared.write().synced = true;
    }
    Ok(())
}

/// Compares a peer's digest with the replica: the rows to send, and this replica's
/// entries for the owners where the peer's entry differs (the peer sends what we lack
/// of those; a zero entry stands for an owner we do not know).
pub(crate) fn diff(
    replica: &Replica,
    me: &str,
    theirs: &[DigestEntry],
) -> (Vec<Row>, Vec<DigestEntry>) {
    let theirs_by_owner: HashMap<&str, &DigestEntry> =
        theirs.iter().map(|e| (e.owner.as_str(), e)).collect();
    let mut rows = Vec::new();
    for mine in replica.digest_entries() {
        if rows.len() >= MAX_ROWS_PER_MESSAGE {
            break;
        }
        let their = theirs_by_owner.get(mine.owner.as_str()).copied();
        rows.extend(rows_for(replica, me, &mine, their));
    }
    let want = theirs
        .iter()
        .filter_map(|t| match replica.entry(&t.owner) {
            Some(mine) if mine.same_as(t) => None,
            Some(mine) => Some(mine),
            None => Some(DigestEntry {
                owner: t.owner.clone(),
                max_version: 0,
                count: 0,
                hash: 0,
            }),
        })
        .collect();
    (rows, want)
}

/// The rows of one owner that a peer whose digest entry is `theirs` should get.
///
/// An owner's versions only grow, so when the peer is merely behind (our max version is
/// higher) the rows above its max are the ones it certainly lacks: send just those. When
/// the max versions are equal but the sets differ (a row was missed), send all of the
/// owner's rows. When the peer is ahead, send nothing: it sends us its newer rows, and the
/// next round compares again. Our own rows always go whole, since the receiver takes them
/// as our complete set.
fn rows_for(
    replica: &Replica,
    me: &str,
    mine: &DigestEntry,
    theirs: Option<&DigestEntry>,
) -> Vec<Row> {
    let above = match theirs {
        Some(t) if t.same_as(mine) => return Vec::new(),
        _ if mine.owner == me => 0,
        None => 0,
        Some(t) if mine.max_version > t.max_version => t.max_version,
        Some(t) if mine.max_version == t.max_version => 0,
        Some(_) => return Vec::new(),
    };
    replica
        .owner_rows(&mine.owner)
        .filter(|r| r.version > above)
        .cloned()
        .collect()
}

/// Decodes the rows worth merging. Rows the replica already holds at that version or a
/// newer one are skipped before their JSON is parsed (most of a sync, when it repairs a
/// missed row), except those of `authority`, whose complete set is needed.
fn decode_rows(shared: &Shared, rows: Vec<WireRow>, authority: Option<&str>) -> Vec<Row> {
    let rows: Vec<WireRow> = {
        let st = shared.read();
        rows.into_iter()
            .filter(|w| {
                authority == Some(w.owner.as_str())
                    || st
                        .replica
                        .get(&w.owner, w.kind, &w.key)
                        .is_none_or(|r| r.version < w.version)
            })
            .collect()
    };
    rows.into_iter()
        .filter_map(|w| shared.open_row(w))
        .collect()
}

/// The revocations this node knows (none without a CA).
fn revocations(shared: &Shared) -> Vec<bazaar_pki::Revocation> {
    shared
        .ca
        .as_ref()
        .map(|ca| ca.revocations())
        .unwrap_or_default()
}

/// Takes a peer's revocations (each checked against the CA).
fn merge_revocations(shared: &Shared, revocations: &[bazaar_pki::Revocation]) {
    for r in revocations {
        if let Err(e) = shared.revoke(r) {
            Counters::add(&shared.counters.rejected, 1);
            tracing::debug!(error = %e, "refused a revocation");
        }
    }
}

async fn send<S: AsyncWrite + Unpin>(
    shared: &Shared,
    stream: &mut S,
    msg: &SyncMsg,
) -> anyhow::Result<()> {
    let n = shared
        .auth
        .write_frame(stream, shared.node_id(), &wire::encode(msg))
        .await?;
    Counters::add(&shared.counters.tcp_bytes_sent, n);
    Ok(())
}

async fn receive<S: AsyncRead + Unpin>(
    shared: &Shared,
    stream: &mut S,
) -> anyhow::Result<Option<(FrameHeader, Vec<u8>)>> {
    let frame = shared
        .auth
        .read_frame(stream, shared.config.max_frame)
        .await?;
    if let Some((_, payload)) = &frame {
        Counters::add(&shared.counters.tcp_bytes_received, payload.len());
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::MachineRecord;
    use crate::replica::Record;

    fn machine(owner: &str, id: &str, version: u64) -> Row {
        Row {
            owner: owner.into(),
            version,
            deleted: false,
            updated_at_ms: version,
            record: Record::Machine(MachineRecord {
                id: id.into(),
                host_id: owner.into(),
                ..Default::default()
            }),
            seal: Default::default(),
        }
    }

    #[test]
    fn diff_sends_only_differing_owners() {
        let mut a = Replica::new();
        let mut b = Replica::new();
        for r in [machine("x", "m1", 1), machine("y", "m2", 1)] {
            a.apply(r.clone());
            b.apply(r);
        }
        a.apply(machine("x", "m3", 2));
        b.apply(machine("z", "m4", 1));
        let (rows, want) = diff(&a, "a", &b.digest_entries());
        // b is behind on x: a sends only the row above b's max; nothing of y (same).
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].key(), "m3");
        // a asks for x (differs) and z (unknown, zero entry).
        let owners: Vec<&str> = want.iter().map(|e| e.owner.as_str()).collect();
        assert_eq!(owners, vec!["x", "z"]);
        assert_eq!(want[1].max_version, 0);
        let (rows, want) = diff(&a, "a", &a.digest_entries());
        assert!(rows.is_empty() && want.is_empty());
    }

    #[test]
    fn diff_sends_whole_owner_on_holes_and_own_rows_whole() {
        let mut a = Replica::new();
        let mut b = Replica::new();
        // Same max version, but b missed m1: a sends all of x.
        for r in [machine("x", "m1", 1), machine("x", "m2", 2)] {
            a.apply(r);
        }
        b.apply(machine("x", "m2", 2));
        let (rows, _) = diff(&a, "a", &b.digest_entries());
        assert_eq!(rows.len(), 2);
        // b is ahead of a on x: a sends nothing of x.
        b.apply(machine("x", "m3", 3));
        let (rows, _) = diff(&a, "a", &b.digest_entries());
        assert!(rows.is_empty());
        // a's own rows always go whole.
        let (rows, _) = diff(&a, "x", &b.digest_entries());
        assert_eq!(rows.len(), 2);
    }
}
