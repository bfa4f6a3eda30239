//! Accepting connections: the listeners and their threads, the admission
//! of each connection (the `max_connections` bound, a thread of its own),
//! and stopping them all. Threads are a bounded resource of the process,
//! so a connection that cannot be given one is closed at once rather than
//! left waiting.

use super::{connection, inc, Server};
use crate::stream::Stream;
use raidkit_member::Locked;
use std::io;
use std::net::{Shutdown, TcpListener};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// The threads that accept and serve, and the flag that stops them.
#[derive(Debug, Default)]
pub(super) struct Accepting {
    stopping: AtomicBool,
    /// Each connection's thread, with a handle on its socket to end it.
    conns: Mutex<Vec<(Stream, JoinHandle<()>)>>,
    acceptors: Mutex<Vec<JoinHandle<()>>>,
}

impl Accepting {
    /// Stop accepting, let every connection finish the requests it has
    /// read, and wait for them: for at most `patience`, if given. Returns
    /// how many connections were still serving a request then; they are
    /// left to themselves (their clients get no more answers).
    pub(super) fn shutdown(&self, patience: Option<Duration>) -> usize {
        self.stopping.store(true, Ordering::Release);
        for h in self.acceptors.locked().drain(..) {
            let _ = h.join();
        }
        let conns: Vec<_> = self.conns.locked().drain(..).collect();
        for (s, _) in &conns {
            // The workers see the end of the stream after the requests
            // already received.
            s.shutdown(Shutdown::Read);
        }
        let until = patience.map(|p| std::time::Instant::now() + p);
        let mut left = 0;
        for (_, h) in conns {
            while until.is_some_and(|u| std::time::Instant::now() < u) && !h.is_finished() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if until.is_none() || h.is_finished() {
                let _ = h.join();
            } else {
                left += 1;
            }
        }
        left
    }
}

/// Accept clients on `l` from a thread of its own, until shutdown.
pub(super) fn spawn(server: &Arc<Server>, l: Listener) -> io::Result<()> {
    // Non-blocking, so that the loop notices shutdown.
    match &l {
        Listener::Tcp(t) => t.set_nonblocking(true)?,
        Listener::Unix(u) => u.set_nonblocking(true)?,
    }
    let me = server.clone();
    let h = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || accept_loop(me, l))?;
    server.accepting.acceptors.locked().push(h);
    Ok(())
}

fn accept_loop(server: Arc<Server>, l: Listener) {
    while !server.accepting.stopping.load(Ordering::Acquire) {
        let accepted = match &l {
            Listener::Tcp(t) => match t.accept() {
                Ok((s, peer)) if !server.security().allow.admits(peer.ip()) => {
                    // Refused before a byte of the protocol is sent.
                    let _ = s.shutdown(Shutdown::Both);
                    for t in &server.targets {
                        inc(&t.stats.connections_refused, 1);
                    }
                    tracing::warn!("{peer}: refused, not in the allowed peers (--allow)");
                    continue;
                }
                r => r.map(|(s, peer)| {
                    let _ = s.set_nodelay(true);
                    (Stream::Tcp(s), peer.to_string())
                }),
            },
            Listener::Unix(u) => u.accept().map(|(s, _)| (Stream::Unix(s), "unix".into())),
        };
        match accepted {
            Ok((s, peer)) => {
                if let Err(e) = start_connection(&server, s, peer) {
                    tracing::warn!("cannot start a connection: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Admit a connection and serve it from a thread of its own, or close it.
fn start_connection(server: &Arc<Server>, s: Stream, peer: String) -> io::Result<()> {
    // Accepted sockets may inherit non-blocking mode from the listener.
    match &s {
        Stream::Tcp(t) => t.set_nonblocking(false)?,
        Stream::Unix(u) => u.set_nonblocking(false)?,
    }
    // Which export it is for is not known before its handshake: a
    // connection accepted or refused counts in every export's counters (as
    // the server's; those active count only in the export they chose).
    let refused = || {
        for t in &server.targets {
            inc(&t.stats.connections_refused, 1);
        }
    };
    let active = server.admitted.fetch_add(1, Ordering::AcqRel);
    if active >= server.max_connections as u64 {
        server.admitted.fetch_sub(1, Ordering::AcqRel);
        refused();
        s.shutdown(Shutdown::Both);
        return Err(io::Error::other(format!(
            "{peer}: refused, {active} connections are being served (--max-connections)"
        )));
    }
    let handle_copy = match s.try_clone() {
        Ok(c) => c,
        Err(e) => {
            server.admitted.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
    };
    let me = server.clone();
    let spawned = std::thread::Builder::new()
        .name("nbd-conn".into())
        .spawn(move || {
            if let Err(e) = connection::serve(&me, s, &peer) {
                tracing::info!("{peer}: connection ended: {e}");
            }
            me.admitted.fetch_sub(1, Ordering::AcqRel);
        });
    let h = match spawned {
        Ok(h) => h,
        Err(e) => {
            // The socket went with the closure: the client sees it closed.
            server.admitted.fetch_sub(1, Ordering::AcqRel);
            refused();
            return Err(io::Error::other(format!(
                "no thread for the connection: {e}"
            )));
        }
    };
    for t in &server.targets {
        inc(&t.stats.connections_total, 1);
    }
    let mut conns = server.accepting.conns.locked();
    conns.retain(|(_, h)| !h.is_finished());
    conns.push((handle_copy, h));
    Ok(())
}
