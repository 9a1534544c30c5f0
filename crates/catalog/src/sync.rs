//! Anti-entropy over TCP, and tombstone collection.
//!
//! Every `anti_entropy_interval` (±25%) a node picks `sync_fanout` random live peers (its
//! seeds while it knows none) and sends each its digest (one entry per owner: max version,
//! count, hash). The peer answers with all rows of every owner whose entry differs, and
//! names the owners it wants in return; the node pushes those. Both sides then hold the
//! union, so a node that was away or partitioned catches up from a couple of peers, and
//! a converged cluster exchanges only digests. Rows too big to broadcast make receivers of
//! their hint pull from the owner at once through the same exchange.

use crate::node::{Counters, Shared};
use crate::replica::{DigestEntry, Replica, Row};
use crate::wire::{self, SyncMsg, WireRow, TAG_LEN};
use anyhow::{bail, Context};
use rand::seq::IndexedRandom;
use rand::Rng;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::timeout;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts anti-entropy connections until aborted.
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                conns.spawn(async move {
                    match timeout(SYNC_TIMEOUT, answer(&shared, stream)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            Counters::add(&shared.counters.rejected, 1);
                            tracing::debug!(%peer, error = %e, "sync from peer failed");
                        }
                        Err(_) => tracing::debug!(%peer, "sync from peer timed out"),
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

/// Runs anti-entropy rounds, hint pulls and tombstone collection until aborted.
pub(crate) async fn anti_entropy(shared: Arc<Shared>, mut pulls: mpsc::UnboundedReceiver<String>) {
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
        Some(m) if matches!(m.status, crate::HostStatus::Alive | crate::HostStatus::Suspect) => {
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

/// One exchange with `peer`, as the initiator.
pub(crate) async fn sync_with(shared: &Shared, peer: SocketAddr) -> anyhow::Result<()> {
    if shared.is_blocked(&peer) {
        bail!("peer is partitioned away");
    }
    let mut stream = timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
        .await
        .context("connect timed out")??;
    stream.set_nodelay(true)?;
    let request = SyncMsg::Request {
        from: shared.node_id().to_owned(),
        from_addr: shared.addr,
        digest: shared.read().replica.digest_entries(),
    };
    send(shared, &mut stream, &request).await?;
    let Some(SyncMsg::Response {
        from,
        rows,
        want,
        authoritative,
    }) = receive(shared, &mut stream).await?
    else {
        bail!("expected a sync response");
    };
    shared.merge(decode_rows(rows), authoritative.then_some(from.as_str()));
    shared.write().synced = true;
    if !want.is_empty() {
        let rows = rows_of(&shared.read().replica, want.iter().map(String::as_str));
        let push = SyncMsg::Push {
            rows,
            authoritative: true,
        };
        send(shared, &mut stream, &push).await?;
    }
    Ok(())
}

/// One exchange, as the peer asked.
async fn answer(shared: &Shared, mut stream: TcpStream) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let Some(SyncMsg::Request {
        from,
        from_addr,
        digest,
    }) = receive(shared, &mut stream).await?
    else {
        bail!("expected a sync request");
    };
    if shared.is_blocked(&from_addr) {
        Counters::add(&shared.counters.dropped_partitioned, 1);
        return Ok(());
    }
    let response = {
        let st = shared.read();
        let (rows, want) = diff(&st.replica, &digest);
        SyncMsg::Response {
            from: shared.node_id().to_owned(),
            rows,
            want,
            authoritative: st.synced,
        }
    };
    let wants = matches!(&response, SyncMsg::Response { want, .. } if !want.is_empty());
    send(shared, &mut stream, &response).await?;
    if wants {
        let Some(SyncMsg::Push {
            rows,
            authoritative,
        }) = receive(shared, &mut stream).await?
        else {
            bail!("expected a sync push");
        };
        shared.merge(decode_rows(rows), authoritative.then_some(from.as_str()));
        shared.write().synced = true;
    }
    Ok(())
}

/// Compares a peer's digest with the replica: the rows to send (all rows of every owner
/// whose entry differs or the peer lacks) and the owners to ask for (whose entry differs
/// or the replica lacks).
pub(crate) fn diff(replica: &Replica, theirs: &[DigestEntry]) -> (Vec<WireRow>, Vec<String>) {
    let theirs_by_owner: HashMap<&str, &DigestEntry> =
        theirs.iter().map(|e| (e.owner.as_str(), e)).collect();
    let mut send_owners = Vec::new();
    for mine in replica.digest_entries() {
        match theirs_by_owner.get(mine.owner.as_str()) {
            Some(t) if t.same_as(&mine) => {}
            _ => send_owners.push(mine.owner),
        }
    }
    let want = theirs
        .iter()
        .filter(|t| replica.entry(&t.owner).is_none_or(|m| !m.same_as(t)))
        .map(|t| t.owner.clone())
        .collect();
    (
        rows_of(replica, send_owners.iter().map(String::as_str)),
        want,
    )
}

fn rows_of<'a>(replica: &Replica, owners: impl Iterator<Item = &'a str>) -> Vec<WireRow> {
    owners
        .flat_map(|o| replica.owner_rows(o))
        .map(WireRow::from_row)
        .collect()
}

fn decode_rows(rows: Vec<WireRow>) -> Vec<Row> {
    rows.into_iter()
        .filter_map(|w| match w.into_row() {
            Ok(row) => Some(row),
            Err(e) => {
                tracing::debug!(error = %e, "dropped an invalid row");
                None
            }
        })
        .collect()
}

async fn send(shared: &Shared, stream: &mut TcpStream, msg: &SyncMsg) -> anyhow::Result<()> {
    let n = shared.auth.write_frame(stream, &wire::encode(msg)).await?;
    Counters::add(&shared.counters.tcp_bytes_sent, n);
    Ok(())
}

async fn receive(shared: &Shared, stream: &mut TcpStream) -> anyhow::Result<Option<SyncMsg>> {
    match shared.auth.read_frame(stream).await? {
        Some(frame) => {
            Counters::add(&shared.counters.tcp_bytes_received, frame.len() + 4 + TAG_LEN);
            Ok(Some(wire::decode(&frame)?))
        }
        None => Ok(None),
    }
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
        let (rows, want) = diff(&a, &b.digest_entries());
        // a sends all of x (it differs), nothing of y (same); wants x and z.
        let owners: BTreeSet<&str> = rows.iter().map(|r| r.owner.as_str()).collect();
        assert_eq!(owners, BTreeSet::from(["x"]));
        assert_eq!(rows.len(), 2);
        assert_eq!(want, vec!["x".to_string(), "z".to_string()]);
        let (rows, want) = diff(&a, &a.digest_entries());
        assert!(rows.is_empty() && want.is_empty());
    }
}
