//! The NBD server: fixed-newstyle handshake, then requests served
//! concurrently (each connection has its own workers; replies may leave out
//! of order), for any [`Member`] — in raidkit, an array.
//!
//! One file per stage a connection goes through, each owning its own state:
//!
//! - `accept.rs`: the listeners, their threads, admitting a connection (the
//!   `max_connections` bound, a thread for it) and stopping them all.
//! - `handshake.rs`: the fixed-newstyle option haggling, which settles what
//!   the transmission phase may send (`Negotiated`).
//! - `connection.rs`: the transmission phase: the workers of a connection
//!   and the loop each runs (take a request, serve it, reply).
//! - `request.rs`: taking a request off the socket (header, payload,
//!   contiguous writes merged).
//! - `execute.rs`: serving it against the device: checks, errors, counters.
//! - `reply.rs`: reply headers and sending them, coalesced with the other
//!   workers' replies.
//! - `fastpath/`: the ways around a copy through this process (splice,
//!   mapped reads and writes, runs of writes placed whole, held replies),
//!   behind one interface whose answers say what was done, so that the
//!   stages above read the same whether or not a fast path applies.
//!
//! This file holds what the stages share: the public types, the tuning,
//! the counters and the reading of payloads. The stages read the server's
//! export, tuning and counters; what changes as a connection is served is
//! owned by the stage that changes it.

mod accept;
mod connection;
mod execute;
mod fastpath;
mod handshake;
#[doc(hidden)]
pub use handshake::fuzz_client_bytes;
mod reply;
mod request;

use crate::stream::Stream;
use accept::{Accepting, Listener};
use raidkit_member::{Locked, Member};
use std::io::{self, BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest read or write payload accepted (advertised as the maximum block size).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Preferred block size advertised to clients.
pub const PREFERRED_BLOCK: u32 = 4096;
/// Requests at least this big are large: their data bypasses the reply
/// buffer, and they are the ones a fast path is worth its set-up for
/// (smaller replies are better coalesced with others in the reply buffer).
const LARGE_REPLY: usize = 64 << 10;
/// Largest run of contiguous writes served as one while seeking a stripe
/// boundary to end on (merged, or placed straight into a parity array).
const MERGE_MAX_ALIGNED: usize = 16 << 20;

/// What is served.
#[derive(Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn Member>,
    pub read_only: bool,
    /// The request size the device serves best (NBD_INFO_BLOCK_SIZE's
    /// preferred size; a power of two, as the protocol requires).
    pub preferred_block: u32,
}

/// Server tuning.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker threads per connection (requests served at once).
    pub workers_per_connection: usize,
    /// Merge runs of contiguous writes into one device write (for parity
    /// arrays, where a larger write fills whole stripes and needs no reads).
    pub merge_writes: bool,
    /// With `merge_writes`, the device's full-stripe size in bytes (0: none):
    /// a run is ended where it reaches a multiple of it, so that the next run
    /// starts on a stripe boundary and a sequential stream is cut into whole
    /// stripes rather than into runs whose edges are partial stripes.
    pub merge_align: u64,
    /// When large reads are answered with splice(2) (see `ZeroCopy`).
    pub zero_copy: ZeroCopy,
    /// Large reads of cached data not spliced are sent straight from
    /// mappings of the member files (see `fastpath/mapped_read.rs`).
    pub mapped_reads: bool,
    /// Large writes to cached pages of plain-file members, of a level with
    /// no redundancy or in whole stripes of a parity array, are received
    /// straight into mappings of the member files (see
    /// `fastpath/mapped_write.rs`).
    pub mapped_writes: bool,
    /// Small write replies are held back for the next one's send while
    /// small writes queue up (see `fastpath/hold.rs`).
    pub batch_replies: bool,
    /// Connections served at once; more are closed at once (each costs a
    /// thread per worker, and threads are a bounded resource of the process).
    pub max_connections: usize,
}

/// Default bound on connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// Zero-copy read replies: the data goes from the member files to the
/// socket without passing through this process (the server's copy of it
/// is saved), but the client then copies it out of
/// the file system's cache rather than out of freshly written socket
/// buffers. On one machine (loopback, Unix sockets) the client pays more
/// than the server saves, and a client that is already CPU-bound gets
/// slower; over a network the NIC reads the cache and the server's CPU is
/// what is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// For TCP clients at a non-loopback address.
    #[default]
    Auto,
    Always,
    Never,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            workers_per_connection: 8,
            merge_writes: false,
            merge_align: 0,
            zero_copy: ZeroCopy::Auto,
            mapped_reads: true,
            mapped_writes: true,
            batch_replies: true,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// I/O counters, shared with whoever reports status.
#[derive(Debug, Default)]
pub struct Stats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    /// Writes merged into the write before them (see `Config::merge_writes`).
    pub merged_writes: AtomicU64,
    /// Reads answered with splice(2), file to socket, never copied here.
    pub zero_copy_reads: AtomicU64,
    /// Reads sent from mappings of the member files' cached pages.
    pub mapped_reads: AtomicU64,
    /// Writes received from the socket straight into the member files'
    /// cached pages.
    pub mapped_writes: AtomicU64,
    /// Runs of writes to a parity array waited for (a header was missing
    /// while others were being served) and then placed whole.
    pub run_waits: AtomicU64,
    /// Replies left in the reply buffer for the next one's system call,
    /// while small writes queued up (`fastpath/hold.rs`).
    pub held_replies: AtomicU64,
    pub errors: AtomicU64,
    /// Connections the server accepted and served, whatever export they
    /// went on to choose: the server's, in each of its exports' counters.
    pub connections_total: AtomicU64,
    /// Connections serving this export now.
    pub connections_active: AtomicU64,
    /// Connections closed unserved: over `max_connections`, or no thread
    /// could be had for them.
    pub connections_refused: AtomicU64,
    /// Who is connected now: the peer address of each connection served
    /// ("unix" for a Unix socket).
    pub peers: std::sync::Mutex<Vec<String>>,
}

fn inc(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What `Server::on_client` is told: a client's address, and None when it
/// connected or why it left (`Some("")`: it disconnected cleanly).
pub type ClientHook = dyn Fn(&str, Option<&str>) + Send + Sync;

#[derive(Default)]
struct Hook(std::sync::Mutex<Option<Arc<ClientHook>>>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Hook {
    fn call(&self, peer: &str, left: Option<&str>) {
        let h = self.0.locked().clone();
        if let Some(h) = h {
            h(peer, left);
        }
    }
}

/// One export and what serving it needs: its tuning and its counters. A
/// connection serves one target, the one its handshake chose.
#[derive(Debug)]
pub struct Target {
    export: Export,
    config: Config,
    stats: Arc<Stats>,
    on_client: Hook,
}

impl Target {
    pub fn export(&self) -> &Export {
        &self.export
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Call `f` when a client starts using this export (`None`) and when it
    /// leaves (why, or "" for a clean disconnect). `f` runs on the
    /// connection's thread and must not block.
    pub fn on_client(&self, f: impl Fn(&str, Option<&str>) + Send + Sync + 'static) {
        *self.on_client.0.locked() = Some(Arc::new(f));
    }
}

/// The server: accept loops plus one thread per connection, for one or
/// more exports (a client picks one by name; the empty name is the first).
#[derive(Debug)]
pub struct Server {
    targets: Vec<Arc<Target>>,
    max_connections: usize,
    /// Connections admitted and not yet ended, whatever their export (the
    /// `max_connections` bound is the process's, not an export's).
    admitted: AtomicU64,
    accepting: Accepting,
    /// TLS and the peers let in; set once, before serving.
    security: std::sync::OnceLock<Security>,
}

/// Who may connect and how: TLS (offered or required) and the peers let in.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub tls: Option<crate::tls::ServerTls>,
    pub allow: crate::tls::Allow,
}

impl Server {
    /// A server of one export.
    pub fn new(export: Export, config: Config) -> Arc<Server> {
        let max = config.max_connections;
        Server::with_exports(vec![(export, config)], max)
    }

    /// A server of several exports, each with its own tuning and counters,
    /// serving at most `max_connections` connections at once in all.
    ///
    /// # Panics
    /// With no export, or two of one name (a client could not pick).
    pub fn with_exports(exports: Vec<(Export, Config)>, max_connections: usize) -> Arc<Server> {
        assert!(!exports.is_empty(), "a server needs an export");
        let mut names: Vec<&str> = exports.iter().map(|(e, _)| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), exports.len(), "export names must differ");
        Arc::new(Server {
            targets: exports
                .into_iter()
                .map(|(export, config)| {
                    Arc::new(Target {
                        export,
                        config,
                        stats: Arc::new(Stats::default()),
                        on_client: Hook::default(),
                    })
                })
                .collect(),
            max_connections,
            admitted: AtomicU64::new(0),
            accepting: Accepting::default(),
            security: std::sync::OnceLock::new(),
        })
    }

    /// The exports, the default one first.
    pub fn targets(&self) -> &[Arc<Target>] {
        &self.targets
    }

    /// The export called `name`.
    pub fn target(&self, name: &str) -> Option<&Arc<Target>> {
        self.targets.iter().find(|t| t.export.name == name)
    }

    /// See [`Target::on_client`]; for the default export.
    pub fn on_client(&self, f: impl Fn(&str, Option<&str>) + Send + Sync + 'static) {
        self.targets[0].on_client(f);
    }

    /// The default export's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.targets[0].stats()
    }

    /// The default export.
    pub fn export(&self) -> &Export {
        &self.targets[0].export
    }

    /// Offer or require TLS and admit only some peers: once, before the
    /// first listener is served.
    pub fn secure(&self, security: Security) -> io::Result<()> {
        self.security
            .set(security)
            .map_err(|_| io::Error::other("the server's security is already set"))
    }

    pub(crate) fn security(&self) -> &Security {
        static NONE: std::sync::OnceLock<Security> = std::sync::OnceLock::new();
        self.security
            .get()
            .unwrap_or_else(|| NONE.get_or_init(Security::default))
    }

    /// Serve clients arriving on a TCP listener, from a thread of its own.
    pub fn serve_tcp(self: &Arc<Self>, l: TcpListener) -> io::Result<()> {
        accept::spawn(self, Listener::Tcp(l))
    }

    /// Serve clients arriving on a Unix socket listener.
    pub fn serve_unix(self: &Arc<Self>, l: UnixListener) -> io::Result<()> {
        accept::spawn(self, Listener::Unix(l))
    }

    /// Stop accepting, let every connection finish the requests it has
    /// read, and wait for them. The caller then flushes and closes the device.
    pub fn shutdown(&self) {
        self.accepting.shutdown(None);
    }

    /// `shutdown`, waiting at most `patience` for the requests in flight
    /// (a request held by a device that never answers would hold the stop
    /// for ever). Returns how many connections were given up on, their
    /// requests unanswered.
    pub fn shutdown_within(&self, patience: std::time::Duration) -> usize {
        self.accepting.shutdown(Some(patience))
    }
}

/// Read a payload: what is already buffered, then the rest straight from
/// the socket into `dst` (through the buffer it would cost another copy).
fn read_payload(r: &mut BufReader<Stream>, dst: &mut [u8]) -> io::Result<()> {
    let have = r.buffer().len().min(dst.len());
    dst[..have].copy_from_slice(&r.buffer()[..have]);
    r.consume(have);
    r.get_mut().read_exact(&mut dst[have..])
}

/// Grow a reused buffer to at least `n` bytes. Its length never shrinks,
/// so steady traffic zero-fills nothing.
fn ensure_len(buf: &mut raidkit_member::AlignedVec, n: usize) {
    if buf.len() < n {
        buf.resize(n);
    }
}
