//! The NBD server: fixed-newstyle handshake, then requests served
//! concurrently (each connection has its own workers; replies may leave out
//! of order), for any [`Member`] — in raidkit, an array.

use crate::mapped::{MappedReads, MappedWrites};
use crate::proto::*;
use crate::splice::Splicer;
use crate::stream::Stream;
use raidkit_member::Locked;
use raidkit_member::Member;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest read or write payload accepted (advertised as the maximum block size).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Preferred block size advertised to clients.
pub const PREFERRED_BLOCK: u32 = 4096;
/// Socket read buffer per connection. Payloads at least this big bypass it
/// (no extra copy) when it is empty.
const READ_BUFFER: usize = 32 << 10;

/// How long a parity array's run of writes waits at most for a missing
/// header while other requests of the connection are being served, and
/// how long each wait for it lasts before looking again.
const RUN_WAIT: Duration = Duration::from_millis(2);
const RUN_WAIT_STEP: Duration = Duration::from_micros(200);

/// How long a client may take over each handshake step.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// What is served.
#[derive(Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn Member>,
    pub read_only: bool,
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
    /// mappings of the member files (see `mapped.rs`).
    pub mapped_reads: bool,
    /// Large writes to cached pages of plain-file members of a level with
    /// no redundancy are received straight into mappings of the member
    /// files (see `mapped.rs`).
    pub mapped_writes: bool,
    /// Small write replies are held back for the next one's send while
    /// small writes queue up (see `Server::hold_replies`).
    pub batch_replies: bool,
    /// Connections served at once; more are closed at once (each costs a
    /// thread per worker, and threads are a bounded resource of the process).
    pub max_connections: usize,
}

/// Default bound on connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// Zero-copy read replies: the data goes from the member files to the
/// socket without passing through this process (a fifth of the server's
/// CPU time per MiB read, measured), but the client then copies it out of
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
    /// while small writes queued up (`Server::hold_replies`).
    pub held_replies: AtomicU64,
    pub errors: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    /// Connections closed unserved: over `max_connections`, or no thread
    /// could be had for them.
    pub connections_refused: AtomicU64,
}

fn inc(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The server: accept loops plus one thread per connection.
#[derive(Debug)]
pub struct Server {
    export: Export,
    config: Config,
    stats: Arc<Stats>,
    stopping: AtomicBool,
    conns: Mutex<Vec<(Stream, JoinHandle<()>)>>,
    acceptors: Mutex<Vec<JoinHandle<()>>>,
}

/// What the handshake settled.
#[derive(Debug, Clone, Copy, Default)]
struct Negotiated {
    structured: bool,
    base_allocation: bool,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Server {
    pub fn new(export: Export, config: Config) -> Arc<Server> {
        Arc::new(Server {
            export,
            config,
            stats: Arc::new(Stats::default()),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            acceptors: Mutex::new(Vec::new()),
        })
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    pub fn export(&self) -> &Export {
        &self.export
    }

    /// Serve clients arriving on a TCP listener, from a thread of its own.
    pub fn serve_tcp(self: &Arc<Self>, l: TcpListener) -> io::Result<()> {
        self.spawn_acceptor(Listener::Tcp(l))
    }

    /// Serve clients arriving on a Unix socket listener.
    pub fn serve_unix(self: &Arc<Self>, l: UnixListener) -> io::Result<()> {
        self.spawn_acceptor(Listener::Unix(l))
    }

    fn spawn_acceptor(self: &Arc<Self>, l: Listener) -> io::Result<()> {
        match &l {
            Listener::Tcp(t) => t.set_nonblocking(true)?,
            Listener::Unix(u) => u.set_nonblocking(true)?,
        }
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || me.accept_loop(l))?;
        self.acceptors.locked().push(h);
        Ok(())
    }

    fn accept_loop(self: Arc<Self>, l: Listener) {
        while !self.stopping.load(Ordering::Acquire) {
            let accepted = match &l {
                Listener::Tcp(t) => t.accept().map(|(s, peer)| {
                    let _ = s.set_nodelay(true);
                    (Stream::Tcp(s), peer.to_string())
                }),
                Listener::Unix(u) => u.accept().map(|(s, _)| (Stream::Unix(s), "unix".into())),
            };
            match accepted {
                Ok((s, peer)) => {
                    if let Err(e) = self.start_connection(s, peer) {
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

    fn start_connection(self: &Arc<Self>, s: Stream, peer: String) -> io::Result<()> {
        // Accepted sockets may inherit non-blocking mode from the listener.
        match &s {
            Stream::Tcp(t) => t.set_nonblocking(false)?,
            Stream::Unix(u) => u.set_nonblocking(false)?,
        }
        let active = self.stats.connections_active.fetch_add(1, Ordering::AcqRel);
        if active >= self.config.max_connections as u64 {
            self.stats.connections_active.fetch_sub(1, Ordering::AcqRel);
            inc(&self.stats.connections_refused, 1);
            s.shutdown(Shutdown::Both);
            return Err(io::Error::other(format!(
                "{peer}: refused, {active} connections are being served (--max-connections)"
            )));
        }
        let handle_copy = match s.try_clone() {
            Ok(c) => c,
            Err(e) => {
                self.stats.connections_active.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || {
                inc(&me.stats.connections_total, 1);
                match me.connection(s) {
                    Ok(()) => tracing::debug!("{peer}: disconnected"),
                    Err(e) => tracing::info!("{peer}: connection ended: {e}"),
                }
                me.stats.connections_active.fetch_sub(1, Ordering::AcqRel);
            });
        let h = match spawned {
            Ok(h) => h,
            Err(e) => {
                // The socket went with the closure: the client sees it closed.
                self.stats.connections_active.fetch_sub(1, Ordering::AcqRel);
                inc(&self.stats.connections_refused, 1);
                return Err(io::Error::other(format!(
                    "no thread for the connection: {e}"
                )));
            }
        };
        let mut conns = self.conns.locked();
        conns.retain(|(_, h)| !h.is_finished());
        conns.push((handle_copy, h));
        Ok(())
    }

    /// Stop accepting, let every connection finish the requests it has
    /// read, and wait for them. The caller then flushes and closes the device.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for h in self.acceptors.locked().drain(..) {
            let _ = h.join();
        }
        let conns: Vec<_> = self.conns.locked().drain(..).collect();
        for (s, _) in &conns {
            s.shutdown(Shutdown::Read);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
    }

    fn connection(self: &Arc<Self>, mut s: Stream) -> io::Result<()> {
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let Some(neg) = self.handshake(&mut s)? else {
            return Ok(());
        };
        s.set_read_timeout(None)?;
        self.transmission(s, neg)
    }

    fn matches(&self, name: &str) -> bool {
        name.is_empty() || name == self.export.name
    }

    fn tflags(&self, neg: Negotiated) -> u16 {
        let mut f = TF_HAS_FLAGS
            | TF_SEND_FLUSH
            | TF_SEND_FUA
            | TF_SEND_TRIM
            | TF_SEND_WRITE_ZEROES
            | TF_SEND_FAST_ZERO
            | TF_SEND_CACHE
            // Writes go straight to the members (no cache in this process),
            // so a FLUSH on any connection covers writes completed on all.
            | TF_CAN_MULTI_CONN;
        if self.export.read_only {
            f |= TF_READ_ONLY;
        }
        if neg.structured {
            // Reads are always answered in one chunk, so DF is honoured.
            f |= TF_SEND_DF;
        }
        f
    }

    /// The fixed-newstyle handshake. `Ok(None)`: the client left cleanly.
    fn handshake(&self, s: &mut Stream) -> io::Result<Option<Negotiated>> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        s.write_all(&hello)?;
        let mut cf = [0u8; 4];
        s.read_exact(&mut cf)?;
        let cflags = u32::from_be_bytes(cf);
        if cflags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0
            || cflags & CLIENT_FIXED_NEWSTYLE == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unsupported client flags {cflags:#x}"),
            ));
        }
        let no_zeroes = cflags & CLIENT_NO_ZEROES != 0;
        let mut neg = Negotiated::default();
        let size = self.export.device.len();
        loop {
            let mut hb = [0u8; 16];
            s.read_exact(&mut hb)?;
            let h = parse_option_header(&hb)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if h.len > MAX_OPTION_LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("option {} with a {}-byte payload", h.option, h.len),
                ));
            }
            let mut data = vec![0u8; h.len as usize];
            s.read_exact(&mut data)?;
            let reply = |s: &mut Stream, kind: u32, payload: &[u8]| {
                s.write_all(&option_reply(h.option, kind, payload))
            };
            match h.option {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data);
                    if !self.matches(&name) {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("unknown export '{name}'"),
                        ));
                    }
                    let mut r = Vec::with_capacity(134);
                    r.extend_from_slice(&size.to_be_bytes());
                    r.extend_from_slice(&self.tflags(neg).to_be_bytes());
                    if !no_zeroes {
                        r.extend_from_slice(&[0u8; 124]);
                    }
                    s.write_all(&r)?;
                    return Ok(Some(neg));
                }
                OPT_ABORT => {
                    let _ = reply(s, REP_ACK, &[]);
                    return Ok(None);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        reply(s, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")?;
                        continue;
                    }
                    let mut p = (self.export.name.len() as u32).to_be_bytes().to_vec();
                    p.extend_from_slice(self.export.name.as_bytes());
                    p.extend_from_slice(self.export.description.as_bytes());
                    reply(s, REP_SERVER, &p)?;
                    reply(s, REP_ACK, &[])?;
                }
                OPT_INFO | OPT_GO => {
                    let go = match parse_go(&data) {
                        Ok(g) => g,
                        Err(e) => {
                            reply(s, REP_ERR_INVALID, e.to_string().as_bytes())?;
                            continue;
                        }
                    };
                    if !self.matches(&go.name) {
                        reply(s, REP_ERR_UNKNOWN, b"no such export")?;
                        continue;
                    }
                    reply(s, REP_INFO, &info_export(size, self.tflags(neg)))?;
                    if go.infos.contains(&INFO_NAME) {
                        reply(s, REP_INFO, &info_name(&self.export.name))?;
                    }
                    if go.infos.contains(&INFO_DESCRIPTION) {
                        reply(s, REP_INFO, &info_description(&self.export.description))?;
                    }
                    reply(
                        s,
                        REP_INFO,
                        &info_block_size(1, PREFERRED_BLOCK, MAX_PAYLOAD),
                    )?;
                    reply(s, REP_ACK, &[])?;
                    if h.option == OPT_GO {
                        return Ok(Some(neg));
                    }
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        reply(
                            s,
                            REP_ERR_INVALID,
                            b"NBD_OPT_STRUCTURED_REPLY takes no data",
                        )?;
                    } else {
                        neg.structured = true;
                        reply(s, REP_ACK, &[])?;
                    }
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    let set = h.option == OPT_SET_META_CONTEXT;
                    if !neg.structured {
                        reply(s, REP_ERR_INVALID, b"negotiate structured replies first")?;
                        continue;
                    }
                    let m = match parse_meta(&data) {
                        Ok(m) => m,
                        Err(e) => {
                            reply(s, REP_ERR_INVALID, e.to_string().as_bytes())?;
                            continue;
                        }
                    };
                    if !self.matches(&m.export) {
                        reply(s, REP_ERR_UNKNOWN, b"no such export")?;
                        continue;
                    }
                    let wanted =
                        m.queries.iter().any(|q| {
                            q == BASE_ALLOCATION || (!set && (q == "base:" || q.is_empty()))
                        }) || (!set && m.queries.is_empty());
                    if set {
                        neg.base_allocation = wanted;
                    }
                    if wanted {
                        let mut p = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                        p.extend_from_slice(BASE_ALLOCATION.as_bytes());
                        reply(s, REP_META_CONTEXT, &p)?;
                    }
                    reply(s, REP_ACK, &[])?;
                }
                OPT_STARTTLS => reply(s, REP_ERR_UNSUP, b"TLS is not supported")?,
                _ => reply(s, REP_ERR_UNSUP, b"unsupported option")?,
            }
        }
    }

    /// The transmission phase. Workers take turns reading one request off
    /// the socket (leader/follower, as nbdkit's parallel thread model) and
    /// then serve it themselves, so a request never waits for a hand-off
    /// between threads; replies leave in completion order.
    fn transmission(self: &Arc<Self>, s: Stream, neg: Negotiated) -> io::Result<()> {
        let shared = Arc::new(Conn {
            reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, s.try_clone()?)),
            writer: Mutex::new(BufWriter::with_capacity(256 << 10, s.try_clone()?)),
            replying: AtomicUsize::new(0),
            backlog: AtomicBool::new(false),
            serving: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let zero_copy = match self.config.zero_copy {
            ZeroCopy::Always => true,
            ZeroCopy::Never => false,
            ZeroCopy::Auto => s.remote_tcp(),
        };
        // A process at its thread limit serves the connection with the
        // workers it could start, or refuses it if it could start none.
        let mut workers: Vec<JoinHandle<()>> = Vec::new();
        for _ in 0..self.config.workers_per_connection.max(1) {
            let me = self.clone();
            let c = shared.clone();
            match std::thread::Builder::new()
                .name("nbd-worker".into())
                .spawn(move || me.worker(&c, neg, zero_copy))
            {
                Ok(h) => workers.push(h),
                Err(e) if workers.is_empty() => {
                    inc(&self.stats.connections_refused, 1);
                    s.shutdown(Shutdown::Both);
                    return Err(io::Error::other(format!("no thread to serve it: {e}")));
                }
                Err(e) => {
                    tracing::warn!("serving a connection with {} workers: {e}", workers.len());
                    break;
                }
            }
        }
        for w in workers {
            let _ = w.join();
        }
        let _ = shared.writer.locked().flush();
        s.shutdown(Shutdown::Both);
        let err = shared.error.locked().take();
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn worker(&self, c: &Conn, neg: Negotiated, zero_copy: bool) {
        let mut payload = Vec::new();
        let mut buf = Vec::new();
        let mut merged: Vec<Request> = Vec::new();
        let mut splicer = Splicer::new(zero_copy);
        let mut mapped = MappedReads::new(self.config.mapped_reads);
        let mut mapped_writes = MappedWrites::default();
        let size = self.export.device.len();
        let mut used = 0usize;
        // Bytes of the payload already written to the device on arrival,
        // and whether the device failed them afterwards.
        let mut placed = 0usize;
        let mut failed: Option<String> = None;
        // Whether this worker's request counts in `c.serving`.
        let mut counted = false;
        loop {
            merged.clear();
            {
                // Held while taking requests from the socket; a write whose
                // payloads all went straight into the device lets go of it
                // before the device finishes (see `MappedWrites::receive`).
                let mut reader = Some(c.reader.locked());
                if c.closing.load(Ordering::Acquire) {
                    return;
                }
                let got = (|| -> io::Result<()> {
                    let r = reader.as_mut().expect("reader held");
                    let Some(req) = read_header(r)? else {
                        return Ok(());
                    };
                    counted = req.len as usize >= LARGE_REPLY;
                    if counted {
                        c.serving.fetch_add(1, Ordering::AcqRel);
                    }
                    merged.push(req);
                    used = 0;
                    placed = 0;
                    failed = None;
                    if req.kind != CMD_WRITE {
                        return Ok(());
                    }
                    used = req.len as usize;
                    let mut have = 0;
                    let mut run = self.placeable_run(r, req, 0);
                    if let Err(Some(need)) = run {
                        run = self.wait_for_run(c, r, req, need);
                    }
                    if matches!(run, Err(Some(_))) {
                        // Still not there: take this payload, which lets
                        // the client send more, and look again (what was
                        // taken is then written from the buffer, the rest
                        // of the run straight in).
                        ensure_len(&mut payload, used);
                        read_payload(r, &mut payload[..used])?;
                        have = used;
                        run = self.placeable_run(r, req, have);
                    }
                    if let Ok(run) = run {
                        let total = run.iter().map(|q| q.len as usize).sum();
                        ensure_len(&mut payload, total);
                        let got = mapped_writes.receive(
                            &mut reader,
                            self.export.device.as_ref(),
                            &run,
                            &mut payload[..total],
                            have,
                            &mut merged,
                        )?;
                        placed = got.placed;
                        have = got.have;
                        used = got.end;
                        failed = got.error;
                    }
                    let Some(r) = reader.as_mut() else {
                        return Ok(()); // all placed
                    };
                    ensure_len(&mut payload, used);
                    read_payload(r, &mut payload[have..used])?;
                    if merged.len() == 1 && placed == 0 && self.config.merge_writes {
                        merge_writes(
                            r,
                            &mut payload,
                            &mut used,
                            &mut merged,
                            size,
                            self.config.merge_align,
                        )?;
                    }
                    Ok(())
                })();
                if let Err(e) = got {
                    c.closing.store(true, Ordering::Release);
                    *c.error.locked() = Some(e);
                    return;
                }
                c.backlog.store(
                    reader.as_deref().is_some_and(quick_backlog),
                    Ordering::SeqCst,
                );
                if merged.is_empty() {
                    // DISC or EOF: requests already taken still finish.
                    c.closing.store(true, Ordering::Release);
                    return;
                }
            }
            let first = merged[0];
            let whole = Request {
                len: used as u32,
                ..first
            };
            let whole = if first.kind == CMD_WRITE {
                whole
            } else {
                first
            };
            let result = match failed.take() {
                Some(msg) => {
                    inc(&self.stats.errors, 1);
                    Err((EIO, msg))
                }
                None => self.execute(
                    &whole,
                    (&payload[..used], placed),
                    neg,
                    &mut buf,
                    (&mut splicer, &mut mapped),
                ),
            };
            if placed > 0 && result.is_ok() {
                // Requests wholly written on arrival.
                let mut at = 0;
                let whole_ones = merged
                    .iter()
                    .take_while(|q| {
                        at += q.len as usize;
                        at <= placed
                    })
                    .count();
                inc(&self.stats.mapped_writes, whole_ones as u64);
            }
            let data_len = if splicer.loaded > 0 {
                splicer.loaded
            } else if mapped.loaded > 0 {
                mapped.loaded
            } else {
                buf.len()
            };
            if merged.len() > 1 {
                inc(&self.stats.merged_writes, merged.len() as u64 - 1);
                if result.is_ok() {
                    inc(&self.stats.writes, merged.len() as u64 - 1);
                }
            }
            // Replies are coalesced: a worker that finds others about to
            // reply leaves its reply in the buffer, and the last one sends
            // them all in one system call.
            c.replying.fetch_add(1, Ordering::AcqRel);
            let mut out = c.writer.locked();
            let sent = (|| {
                for req in &merged {
                    let header = reply_header(req, neg, &result, data_len);
                    if req.kind == CMD_READ && result.is_ok() {
                        if splicer.loaded > 0 {
                            // The data waits in the pipe: header, then the pipe.
                            out.flush()?;
                            send_more(out.get_mut(), &header)?;
                            splicer.send(out.get_ref().as_fd())?;
                            continue;
                        }
                        if mapped.loaded > 0 {
                            out.flush()?;
                            mapped.send(out.get_ref().as_fd(), &header)?;
                            continue;
                        }
                        if buf.len() >= LARGE_REPLY {
                            // Header and data in one system call, no copy.
                            out.flush()?;
                            write_all_vectored(out.get_mut(), &header, &buf)?;
                            continue;
                        }
                        out.write_all(&header)?;
                        out.write_all(&buf)?;
                    } else {
                        out.write_all(&header)?;
                    }
                }
                Ok(())
            })();
            splicer.discard();
            mapped.discard();
            let last = c.replying.fetch_sub(1, Ordering::AcqRel) == 1;
            let sent = sent.and_then(|()| {
                if !last {
                    Ok(())
                } else if self.hold_replies(c, out.buffer().len()) {
                    inc(&self.stats.held_replies, merged.len() as u64);
                    Ok(())
                } else {
                    out.flush()
                }
            });
            if counted {
                c.serving.fetch_sub(1, Ordering::AcqRel);
            }
            if sent.is_err() {
                // The client is gone; the next read sees it too.
                c.closing.store(true, Ordering::Release);
            }
        }
    }

    /// Whether the last worker to reply may leave the `held` bytes of
    /// replies in the buffer, for whoever answers the next request to send
    /// with its own: on loopback a send costs the server as much as the
    /// rest of a small write, since the kernel delivers the data to the
    /// client in the same call. Only while requests queue up behind a quick
    /// write that has arrived whole (`quick_backlog`): that write's worker
    /// replies soon and decides the same way, so replies wait at most for
    /// one quick write, never for a request still arriving, and the last
    /// reply of a burst goes out at once. A client with few requests in
    /// flight gets every reply at once: held replies would leave it
    /// nothing to do, and looking at the socket to find out costs a system
    /// call on every reply (both measured: 4 KiB writes at queue depth 4
    /// and 8 lost 11-13% that way).
    fn hold_replies(&self, c: &Conn, held: usize) -> bool {
        held < REPLY_BATCH && self.config.batch_replies && c.backlog.load(Ordering::SeqCst)
    }

    /// The run of writes, starting with `first` (whose header is taken, and
    /// the first `have` bytes of its payload too), whose payloads to try
    /// receiving straight into the device: `first` alone; for a parity
    /// array, `first` and the contiguous writes after it whose headers have
    /// arrived already (peeked at past the payloads, not taken) up to a
    /// stripe boundary, as whole stripes are all such an array takes.
    /// `Err(Some(n))`: none, but there may be one once more has arrived (a
    /// header is missing, which is in once the socket holds `n` bytes);
    /// `Err(None)`: none.
    fn placeable_run(
        &self,
        r: &BufReader<Stream>,
        first: Request,
        have: usize,
    ) -> Result<Vec<Request>, Option<usize>> {
        if !self.may_place(&first) {
            return Err(None);
        }
        let align = self.config.merge_align;
        if align == 0 {
            return Ok(vec![first]);
        }
        if !first.offset.is_multiple_of(align) {
            return Err(None);
        }
        let mut run = vec![first];
        let mut end = first.offset + first.len as u64;
        let mut total = first.len as usize;
        // Socket bytes before the next header: the payload not buffered.
        let unread = total - have.min(total);
        if r.buffer().len() > unread {
            // The next header is (partly) in the reader's buffer, not in
            // the socket: too rare to look for there.
            return Err(None);
        }
        let mut skip = unread - r.buffer().len();
        while !end.is_multiple_of(align) {
            let mut hb = [0u8; REQUEST_LEN];
            if total >= MERGE_MAX_ALIGNED {
                return Err(None);
            }
            if !r.get_ref().peek_at(skip, &mut hb) {
                return Err(Some(skip + REQUEST_LEN));
            }
            let Ok(next) = parse_request(&hb) else {
                return Err(None);
            };
            if next.kind != CMD_WRITE
                || next.flags != first.flags
                || next.offset != end
                || !self.may_place(&next)
            {
                return Err(None);
            }
            run.push(next);
            end += next.len as u64;
            total += next.len as usize;
            skip += REQUEST_LEN + next.len as usize;
        }
        Ok(run)
    }

    /// A run starting with `first` (nothing of its payload taken yet) whose
    /// next header is missing, until the socket holds `need` bytes: while
    /// other requests of this connection are being served, the client is
    /// most likely only waiting for their replies to send the rest, so wait
    /// for it a little (a stripe written in part costs reading the rest of
    /// it back and logging the data, besides a second copy). A client that
    /// sends no more until this write is answered is not kept waiting:
    /// nothing else is in flight then, or not for long.
    fn wait_for_run(
        &self,
        c: &Conn,
        r: &BufReader<Stream>,
        first: Request,
        mut need: usize,
    ) -> Result<Vec<Request>, Option<usize>> {
        let since = Instant::now();
        // What the socket can hold before the client must wait for this
        // worker to read: more cannot arrive. Taken as three quarters of
        // the buffer, the rest being the kernel's overhead (the queue was
        // seen to fill 99% of it with large writes over loopback, about
        // half with small segments).
        let buffer = r.get_ref().receive_buffer();
        let room = buffer - buffer / 4;
        loop {
            // This worker serves `first` (large, so counted): others are
            // more than one.
            if need > room || c.serving.load(Ordering::Acquire) <= 1 || since.elapsed() >= RUN_WAIT
            {
                return Err(Some(need));
            }
            r.get_ref().wait_for_bytes(need, RUN_WAIT_STEP);
            match self.placeable_run(r, first, 0) {
                Err(Some(n)) => need = n,
                run => {
                    if run.is_ok() {
                        inc(&self.stats.run_waits, 1);
                    }
                    return run;
                }
            }
        }
    }

    /// Whether a write's payload may be received straight into the device
    /// (`mapped.rs`): large, valid, and allowed. Invalid requests are left
    /// to `execute`, which answers them.
    fn may_place(&self, r: &Request) -> bool {
        self.config.mapped_writes
            && r.len as usize >= LARGE_REPLY
            && !self.export.read_only
            && r.flags & !CMD_FLAG_FUA == 0
            && r.offset
                .checked_add(r.len as u64)
                .is_some_and(|e| e <= self.export.device.len())
    }

    /// Serve one request; returns the reply header (and for a successful
    /// read, leaves the data in `buf`). A write's payload comes with the
    /// number of its first bytes already written on arrival.
    fn execute(
        &self,
        r: &Request,
        (payload, placed): (&[u8], usize),
        neg: Negotiated,
        buf: &mut Vec<u8>,
        (splicer, mapped): (&mut Splicer, &mut MappedReads),
    ) -> Result<(), (u32, String)> {
        let dev = &self.export.device;
        let size = dev.len();
        let in_range = r
            .offset
            .checked_add(r.len as u64)
            .is_some_and(|e| e <= size);
        let st = &self.stats;
        let result = (|| {
            let known_flags = match r.kind {
                CMD_READ => CMD_FLAG_FUA | CMD_FLAG_DF,
                CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
                CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                _ => 0,
            };
            if r.flags & !known_flags != 0 {
                return Err((EINVAL, format!("unsupported flags {:#x}", r.flags)));
            }
            let writes = matches!(r.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
            if writes && self.export.read_only {
                return Err((EPERM, "the export is read-only".into()));
            }
            let io_err = |e: raidkit_member::MemberError| (EIO, e.to_string());
            match r.kind {
                CMD_READ | CMD_CACHE | CMD_BLOCK_STATUS => {
                    if r.len == 0 || r.len > MAX_PAYLOAD && r.kind == CMD_READ {
                        return Err((EINVAL, format!("bad length {}", r.len)));
                    }
                    if !in_range {
                        return Err((EINVAL, "request beyond the end of the export".into()));
                    }
                    match r.kind {
                        CMD_READ => {
                            if splicer.load(dev.as_ref(), r.offset, r.len as usize) {
                                buf.clear();
                                inc(&st.zero_copy_reads, 1);
                            } else if r.len as usize >= LARGE_REPLY
                                && mapped.load(dev.as_ref(), r.offset, r.len as usize)
                            {
                                buf.clear();
                                inc(&st.mapped_reads, 1);
                            } else {
                                buf.resize(r.len as usize, 0);
                                dev.read_at(buf, r.offset).map_err(io_err)?;
                            }
                            inc(&st.reads, 1);
                            inc(&st.bytes_read, r.len as u64);
                        }
                        CMD_BLOCK_STATUS if !neg.base_allocation => {
                            return Err((EINVAL, "no metadata context negotiated".into()));
                        }
                        _ => {}
                    }
                }
                CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM => {
                    if !in_range {
                        let e = if r.kind == CMD_TRIM { EINVAL } else { ENOSPC };
                        return Err((e, "request beyond the end of the export".into()));
                    }
                    match r.kind {
                        CMD_WRITE => {
                            if placed < payload.len() {
                                dev.write_at(&payload[placed..], r.offset + placed as u64)
                                    .map_err(io_err)?;
                            }
                            inc(&st.writes, 1);
                            inc(&st.bytes_written, r.len as u64);
                        }
                        CMD_WRITE_ZEROES => {
                            if r.flags & CMD_FLAG_FAST_ZERO != 0 {
                                // Zeroing costs a full write here: say so.
                                return Err((ENOTSUP, "zeroing is not faster than writing".into()));
                            }
                            raidkit_member::write_zeroes(dev.as_ref(), r.offset, r.len as u64)
                                .map_err(io_err)?;
                            inc(&st.zeroes, 1);
                        }
                        _ => inc(&st.trims, 1), // advisory: the data stays as it was
                    }
                    if r.flags & CMD_FLAG_FUA != 0 {
                        dev.flush().map_err(io_err)?;
                    }
                }
                CMD_FLUSH => {
                    dev.flush().map_err(io_err)?;
                    inc(&st.flushes, 1);
                }
                other => return Err((EINVAL, format!("unknown command {other}"))),
            }
            Ok(())
        })();
        if let Err((_, msg)) = &result {
            inc(&st.errors, 1);
            tracing::debug!("request {:?} failed: {msg}", r);
        }
        result
    }
}

/// The reply header for a request's outcome (read data, if any, follows it).
fn reply_header(
    r: &Request,
    neg: Negotiated,
    result: &Result<(), (u32, String)>,
    read_len: usize,
) -> Vec<u8> {
    match result {
        Ok(()) => success_header(r, neg, read_len),
        Err((code, msg)) => {
            if neg.structured {
                structured_error(r.cookie, *code, msg)
            } else {
                simple_reply(*code, r.cookie).to_vec()
            }
        }
    }
}

fn success_header(r: &Request, neg: Negotiated, read_len: usize) -> Vec<u8> {
    if !neg.structured {
        return simple_reply(0, r.cookie).to_vec();
    }
    match r.kind {
        CMD_READ => {
            let mut v = structured_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                r.cookie,
                8 + read_len as u32,
            )
            .to_vec();
            v.extend_from_slice(&r.offset.to_be_bytes());
            v
        }
        CMD_BLOCK_STATUS => {
            // raidkit does not track holes: the whole range is allocated data.
            let mut v =
                structured_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, r.cookie, 12).to_vec();
            v.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
            v.extend_from_slice(&r.len.to_be_bytes());
            v.extend_from_slice(&0u32.to_be_bytes());
            v
        }
        // The spec lets a simple reply answer any other command even with
        // structured replies: 16 bytes that clients take in one read, where
        // a structured one costs them a second.
        _ => simple_reply(0, r.cookie).to_vec(),
    }
}

/// One connection's shared state in the transmission phase.
struct Conn {
    reader: Mutex<BufReader<Stream>>,
    writer: Mutex<BufWriter<Stream>>,
    /// Workers with a reply ready or being written; the last one sends
    /// what is buffered, unless it may wait for the next one's
    /// (`Server::hold_replies`).
    replying: AtomicUsize,
    /// Whether the reader's buffer held a backlog that begins with a quick
    /// write when its last taker let go of it (`quick_backlog`).
    backlog: AtomicBool,
    /// Workers that have taken a large request (`LARGE_REPLY` and more)
    /// and not yet answered it. Small ones are not counted, to keep their
    /// cost down: only a run of large writes asks (`Server::wait_for_run`).
    serving: AtomicUsize,
    /// Set on DISC, EOF, a malformed request or a dead client.
    closing: AtomicBool,
    error: Mutex<Option<io::Error>>,
}

/// Largest run of contiguous writes merged into one array write, when no
/// stripe boundary is sought.
const MERGE_MAX: usize = 8 << 20;
/// Largest run while seeking a stripe boundary to end on.
const MERGE_MAX_ALIGNED: usize = 16 << 20;

/// Like the kernel's block layer, take the writes that follow `merged[0]`
/// and continue it (same flags, next offset), as long as their headers have
/// already arrived (never waiting for one): one larger array write turns
/// sequential partial-stripe writes into full-stripe writes, which need no
/// reads. With `align`, the run stops as soon as it ends on a multiple of
/// `align` (md's stripe cache gets the same effect by holding partial
/// stripes back until the rest arrives). Each request still gets its own
/// reply.
fn merge_writes(
    r: &mut BufReader<Stream>,
    payload: &mut Vec<u8>,
    len: &mut usize,
    merged: &mut Vec<Request>,
    size: u64,
    align: u64,
) -> io::Result<()> {
    use std::io::BufRead;
    let first = merged[0];
    let max = if align > 0 {
        MERGE_MAX_ALIGNED
    } else {
        MERGE_MAX
    };
    loop {
        // Only a run inside the device is continued (the request is not
        // validated yet: its end may even wrap around).
        let end = match first.offset.checked_add(*len as u64) {
            Some(end) if end <= size => end,
            _ => return Ok(()),
        };
        if align > 0 && end.is_multiple_of(align) {
            return Ok(());
        }
        if r.buffer().len() < REQUEST_LEN {
            if !r.get_ref().has_bytes(REQUEST_LEN - r.buffer().len()) {
                return Ok(());
            }
            // Data is waiting, so this does not block.
            r.fill_buf()?;
            if r.buffer().len() < REQUEST_LEN {
                return Ok(());
            }
        }
        let buffered = r.buffer();
        let Ok(next) = parse_request(buffered[..REQUEST_LEN].try_into().expect("28 bytes")) else {
            return Ok(()); // left for the next read, which reports it
        };
        if next.kind != CMD_WRITE
            || next.flags != first.flags
            || next.offset != end
            || *len + next.len as usize > max
            || next.len as u64 > size - end
        {
            return Ok(());
        }
        r.consume(REQUEST_LEN);
        let at = *len;
        *len += next.len as usize;
        ensure_len(payload, *len);
        read_payload(r, &mut payload[at..*len])?;
        merged.push(next);
    }
}

/// Replies held back for a batch are sent once they reach this much.
const REPLY_BATCH: usize = 16 << 10;

/// How much a connection's buffer must hold, beginning with a quick write
/// received whole, for replies to be held (`Server::hold_replies`): four
/// 4 KiB writes. (With 8 KiB, and with none, 4 KiB writes at queue depth 4
/// lost 2-5%; with 16 KiB they measured level with no holding at depths 4
/// and 8, and 1.08-1.11x at 32.)
const HOLD_BACKLOG: usize = 16 << 10;

/// Whether `r`'s buffer holds `HOLD_BACKLOG` bytes or more, beginning with
/// a quick write whose payload is all there: one that takes little time to
/// serve, smaller than `LARGE_REPLY` and without FUA (a page-cache write,
/// never a flush or a read that may have to wait for a disk).
fn quick_backlog(r: &BufReader<Stream>) -> bool {
    let b = r.buffer();
    b.len() >= HOLD_BACKLOG
        && b.get(..REQUEST_LEN)
            .and_then(|h| parse_request(h.try_into().expect("28 bytes")).ok())
            .is_some_and(|q| {
                let len = q.len as usize;
                q.kind == CMD_WRITE
                    && len < LARGE_REPLY
                    && q.flags & CMD_FLAG_FUA == 0
                    && b.len() >= REQUEST_LEN + len
            })
}

/// Read replies at least this big bypass the reply buffer.
const LARGE_REPLY: usize = 64 << 10;

/// Write a reply header that data from a splice will follow: on TCP with
/// MSG_MORE, so that header and data leave in the same segments.
fn send_more(s: &mut Stream, header: &[u8]) -> io::Result<()> {
    if !s.is_tcp() {
        return s.write_all(header);
    }
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;
    let fd = s.as_fd().as_raw_fd();
    let mut at = 0;
    while at < header.len() {
        match send(
            fd,
            &header[at..],
            MsgFlags::from_bits_retain(nix::libc::MSG_MORE) | MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Write `a` then `b` with as few system calls as the socket allows.
fn write_all_vectored(w: &mut impl Write, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut bufs = [io::IoSlice::new(a), io::IoSlice::new(b)];
    let mut slices: &mut [io::IoSlice<'_>] = &mut bufs;
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read a payload: what is already buffered, then the rest straight from
/// the socket into `dst` (through the buffer it would cost another copy).
fn read_payload(r: &mut BufReader<Stream>, dst: &mut [u8]) -> io::Result<()> {
    use std::io::BufRead;
    let have = r.buffer().len().min(dst.len());
    dst[..have].copy_from_slice(&r.buffer()[..have]);
    r.consume(have);
    r.get_mut().read_exact(&mut dst[have..])
}

/// Grow a reused buffer to at least `n` bytes. Its length never shrinks,
/// so steady traffic zero-fills nothing.
fn ensure_len(buf: &mut Vec<u8>, n: usize) {
    if buf.len() < n {
        buf.resize(n, 0);
    }
}

/// Read one request's header (a write's payload is left in the stream,
/// checked not to exceed the maximum). `Ok(None)`: DISC or a clean EOF.
fn read_header(r: &mut BufReader<Stream>) -> io::Result<Option<Request>> {
    let mut hb = [0u8; REQUEST_LEN];
    match r.read_exact(&mut hb) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let req = parse_request(&hb)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad request: {e}")))?;
    if req.kind == CMD_DISC {
        return Ok(None);
    }
    if req.kind == CMD_WRITE && req.len > MAX_PAYLOAD {
        // The payload cannot be skipped safely: end the connection.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "write of {} bytes exceeds the maximum {MAX_PAYLOAD}",
                req.len
            ),
        ));
    }
    Ok(Some(req))
}
