//! One connection: the handshake, then the transmission phase, where the
//! connection's workers each run the same loop (take a request, serve it,
//! reply). Workers take turns reading one request off the socket
//! (leader/follower, as nbdkit's parallel thread model) and then serve it
//! themselves, so a request never waits for a hand-off between threads;
//! replies leave in completion order.

use super::execute;
use super::fastpath::FastPaths;
use super::handshake::{handshake, Negotiated};
use super::reply::Replies;
use super::request::Intake;
use super::{Server, Target, ZeroCopy};
use crate::stream::Stream;
use raidkit_member::{AlignedVec, Locked};
use std::io;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// One connection's shared state in the transmission phase.
#[derive(Debug)]
struct Conn {
    intake: Intake,
    replies: Replies,
}

/// Serve a client from the handshake to its last reply. Once the
/// handshake has chosen an export, the connection counts in its counters
/// and its hook hears of the client.
pub(super) fn serve(server: &Arc<Server>, mut s: Stream, peer: &str) -> io::Result<()> {
    let Some((target, neg)) = handshake(&mut s, &server.targets, server.security().tls.as_ref())?
    else {
        return Ok(());
    };
    let stats = &target.stats;
    stats.connections_active.fetch_add(1, Ordering::AcqRel);
    stats.peers.locked().push(peer.to_string());
    target.on_client.call(peer, None);
    let result = transmission(&target, s, neg);
    match &result {
        Ok(()) => {
            tracing::debug!("{peer}: disconnected");
            target.on_client.call(peer, Some(""));
        }
        Err(e) => target.on_client.call(peer, Some(&e.to_string())),
    }
    {
        let mut peers = stats.peers.locked();
        if let Some(i) = peers.iter().position(|p| p == peer) {
            peers.remove(i);
        }
    }
    stats.connections_active.fetch_sub(1, Ordering::AcqRel);
    result
}

/// The transmission phase: the workers, until the connection ends.
fn transmission(server: &Arc<Target>, s: Stream, neg: Negotiated) -> io::Result<()> {
    let shared = Arc::new(Conn {
        intake: Intake::new(s.try_clone()?),
        replies: Replies::new(s.try_clone()?),
    });
    let zero_copy = match server.config.zero_copy {
        ZeroCopy::Always => true,
        ZeroCopy::Never => false,
        ZeroCopy::Auto => s.remote_tcp(),
    };
    // The connection's own thread is its first worker, so a connection
    // whose handshake was answered always has one: a process at its thread
    // limit serves it with the workers it could start besides, instead of
    // refusing a client it already told to go on.
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    for _ in 1..server.config.workers_per_connection.max(1) {
        let me = server.clone();
        let c = shared.clone();
        match std::thread::Builder::new()
            .name("nbd-worker".into())
            .spawn(move || worker(&me, &c, neg, zero_copy))
        {
            Ok(h) => workers.push(h),
            Err(e) => {
                tracing::warn!(
                    "serving a connection with {} workers: {e}",
                    workers.len() + 1
                );
                break;
            }
        }
    }
    worker(server, &shared, neg, zero_copy);
    for w in workers {
        let _ = w.join();
    }
    shared.replies.finish();
    s.shutdown(Shutdown::Both);
    match shared.intake.error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One worker: take a request, serve it, reply, until the connection ends.
fn worker(server: &Target, c: &Conn, neg: Negotiated, zero_copy: bool) {
    let mut fast = FastPaths::new(&server.config, zero_copy, server.stats.clone());
    // Reused from one request to the next: a write's payload, a read's
    // data. Aligned, so that direct-I/O members read and write them without
    // a bounce copy.
    let mut payload = AlignedVec::new();
    let mut buf = AlignedVec::new();
    // The requests taken together (more than one: a run of writes).
    let mut taken = Vec::new();
    loop {
        let Some(mut t) = c.intake.take(server, &mut fast, &mut payload, &mut taken) else {
            return;
        };
        let result = execute::serve(server, &mut t, &taken, &payload, neg, &mut buf, &mut fast);
        let sent = c
            .replies
            .send(&taken, neg, &result, &buf, &mut fast, c.intake.backlog());
        c.intake.done(&t);
        if sent.is_err() {
            // The client is gone; the next read sees it too.
            c.intake.close();
        }
    }
}
