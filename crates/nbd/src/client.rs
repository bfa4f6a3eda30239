//! A small NBD client: enough of the protocol to use any NBD export
//! (raidkit's own, nbdkit, qemu-nbd, nbd-server) as a [`Member`] — for
//! `raidkit bench nbd://…` today and remote array members later.
//!
//! Written here because the Rust NBD client crates are synchronous with one
//! request at a time; a benchmark at queue depth 32 needs requests pipelined
//! on one connection, as fio's nbd engine does. Callers on any number of
//! threads send their requests under a short lock; one of the waiting
//! callers at a time reads replies, putting each (and a read's data,
//! straight into its caller's buffer) in place and waking its caller.
//!
//! Only simple replies are used (structured replies are not negotiated), so
//! every reply is a 16-byte header followed, for a successful read, by the
//! data.

use crate::proto::*;
use crate::stream::Stream;
pub use crate::uri::{Address, Endpoint, TlsParams};
use arc_swap::ArcSwap;
use raidkit_member::{check_range, Member, MemberError, Op, Remote, Result};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A simple reply's header: magic, error, handle.
const REPLY_LEN: usize = 16;
/// How many bytes of requests `run_queue` gathers into one send, and
/// receives at once at least.
const BATCH_BYTES: usize = 256 << 10;
/// How long `run_queue` polls for replies before it sleeps, with more
/// than one request in flight.
const SPIN: Duration = Duration::from_micros(50);

/// Time spent polling for replies, in nanoseconds, over the process.
static POLLED: AtomicU64 = AtomicU64::new(0);

/// How long this process's `run_queue` calls have spent polling for
/// replies: CPU time that is waiting, not work (a client that measures its
/// own CPU use leaves it out).
pub fn polled() -> Duration {
    Duration::from_nanos(POLLED.load(Ordering::Relaxed))
}

/// One request's completion. Set by whichever caller is reading replies
/// at the time; `lead` tells a waiting caller to take over the reading.
#[derive(Default)]
struct Slot {
    st: Mutex<SlotState>,
    cv: Condvar,
}

#[derive(Default)]
struct SlotState {
    done: Option<std::result::Result<(), io::Error>>,
    lead: bool,
}

enum Woken {
    Done(std::result::Result<(), io::Error>),
    Lead,
}

impl Slot {
    fn complete(&self, r: std::result::Result<(), io::Error>) {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).done = Some(r);
        self.cv.notify_one();
    }

    fn hand_over(&self) {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).lead = true;
        self.cv.notify_one();
    }

    fn take_done(&self) -> Option<std::result::Result<(), io::Error>> {
        self.st
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .done
            .take()
    }

    fn is_done(&self) -> bool {
        self.st
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .done
            .is_some()
    }

    /// Sleep until the reply is in or the reading is handed to us.
    fn wait(&self) -> Woken {
        let mut g = self.st.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = g.done.take() {
                return Woken::Done(r);
            }
            if std::mem::take(&mut g.lead) {
                return Woken::Lead;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A request waiting for its reply. `buf`/`len` is where a read's data goes.
struct Waiter {
    buf: *mut u8,
    len: usize,
    slot: Arc<Slot>,
}

// SAFETY: `buf` points into the buffer of a caller that does not return
// from `request` before its slot is completed (see there).
unsafe impl Send for Waiter {}

struct Shared {
    /// What the server said of the export on this connection.
    flags: u16,
    max_request: usize,
    /// A handle on the socket for shutting it down without a lock.
    ctl: Stream,
    /// The network connection: `ctl` itself, or what carries it (TLS).
    raw: Stream,
    /// How long a reply may take (None: as long as the network lets it).
    timeout: Option<Duration>,
    writer: Mutex<Stream>,
    /// The receiving half; held by the one caller reading replies.
    rx: Mutex<Stream>,
    /// Whether a caller is reading replies.
    reading: AtomicBool,
    pending: Mutex<HashMap<u64, Waiter>>,
    /// Why the connection is unusable, once it is.
    broken: Mutex<Option<String>>,
    next: AtomicU64,
}

impl Shared {
    /// Why a read or write on the connection failed, in words: a timeout
    /// (the socket's own, set to the request timeout) is a server that did
    /// not answer in time.
    fn lost_because(&self, e: &io::Error) -> String {
        match (e.kind(), self.timeout) {
            (io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut, Some(t)) => {
                format!("no answer within {:.1}s", t.as_secs_f64())
            }
            _ => format!("connection lost: {e}"),
        }
    }

    fn fail_all(&self, why: &str) {
        let mut b = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            *b = Some(why.to_string());
        }
        drop(b);
        // Whoever is still sending or reading stops now, nothing queued
        // is sent later, and the server sees the connection go.
        self.raw.abort();
        self.ctl.abort();
        let drained: Vec<Waiter> = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, w)| w)
            .collect();
        for w in drained {
            w.slot.complete(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                why.to_string(),
            )));
        }
    }

    /// Read one reply and complete its request.
    fn read_reply(&self, s: &mut Stream) -> std::result::Result<(), String> {
        let mut h = [0u8; 16];
        s.read_exact(&mut h).map_err(|e| self.lost_because(&e))?;
        let magic = u32::from_be_bytes(h[0..4].try_into().expect("4"));
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(format!("unexpected reply magic {magic:#x}"));
        }
        let error = u32::from_be_bytes(h[4..8].try_into().expect("4"));
        let handle = u64::from_be_bytes(h[8..16].try_into().expect("8"));
        let w = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .ok_or_else(|| format!("reply for unknown handle {handle}"))?;
        if error == ESHUTDOWN {
            // The server is going away (nbdkit answers so once asked to
            // stop): the connection is lost, as if cut, so that a member
            // is disconnected and rejoins when its server is back, not
            // failed for good; and it is closed now, as the server waits
            // for its clients to go before it exits.
            let why = "the server is shutting down (NBD_ESHUTDOWN)";
            w.slot
                .complete(Err(io::Error::new(io::ErrorKind::BrokenPipe, why)));
            return Err(why.into());
        }
        if error != 0 {
            w.slot
                .complete(Err(io::Error::from_raw_os_error(error as i32)));
            return Ok(());
        }
        if w.len > 0 {
            // SAFETY: the caller that registered this waiter does not
            // return before `complete` below, so its buffer of `len` bytes
            // at `buf` is alive, and nobody else touches it meanwhile.
            let buf = unsafe { std::slice::from_raw_parts_mut(w.buf, w.len) };
            if let Err(e) = s.read_exact(buf) {
                w.slot
                    .complete(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(self.lost_because(&e));
            }
        }
        w.slot.complete(Ok(()));
        Ok(())
    }

    /// Wait for `slot`, reading replies (everyone's) whenever nobody else
    /// is: with one request in flight its caller reads its own reply, with
    /// no thread in between, as a single-threaded client would.
    fn wait_for(&self, slot: &Slot) -> std::result::Result<(), io::Error> {
        loop {
            if self
                .reading
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                {
                    let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
                    while !slot.is_done() {
                        if let Err(why) = self.read_reply(&mut rx) {
                            self.fail_all(&why);
                            break;
                        }
                    }
                }
                self.reading.store(false, Ordering::Release);
                // Somebody still waiting must take over the reading.
                if let Some(w) = self
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .next()
                {
                    w.slot.hand_over();
                }
                // Not done yet when another thread's `fail_all` (a send
                // that failed, the link cut by the stall watch) drained
                // our waiter and has yet to complete it: it does so in a
                // moment, and until then our buffer is not ours to give
                // back. Waiting again, not panicking (which left a
                // client's request unanswered for good).
                match slot.take_done() {
                    Some(r) => return r,
                    None => continue,
                }
            }
            match slot.wait() {
                Woken::Done(r) => return r,
                Woken::Lead => continue,
            }
        }
    }
}

/// A connection to one NBD export, usable from many threads at once.
pub struct NbdClient {
    name: String,
    size: u64,
    /// The connection; replaced whole when the client connects again.
    shared: ArcSwap<Shared>,
    timeout: Option<Duration>,
    closed: AtomicBool,
}

impl fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdClient")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("flags", &self.flags())
            .finish()
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_u16(s: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(s: &mut Stream, option: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// What the handshake learnt about the export.
struct ExportInfo {
    size: u64,
    flags: u16,
    max_request: usize,
}

/// Fixed newstyle handshake: NBD_OPT_GO (asking for block sizes), or
/// NBD_OPT_EXPORT_NAME from a server that does not know GO.
fn handshake(
    s: &mut Stream,
    export: &str,
    tls: Option<&crate::tls::ClientTls>,
) -> io::Result<ExportInfo> {
    if read_u64(s)? != NBDMAGIC {
        return Err(bad("not an NBD server (no NBDMAGIC)"));
    }
    if read_u64(s)? != IHAVEOPT {
        return Err(bad(
            "the server speaks oldstyle NBD only, which is not supported",
        ));
    }
    let hflags = read_u16(s)?;
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(bad("the server does not do fixed newstyle negotiation"));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let cflags = CLIENT_FIXED_NEWSTYLE | if no_zeroes { CLIENT_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes())?;
    if let Some(tls) = tls {
        send_option(s, OPT_STARTTLS, &[])?;
        if read_u64(s)? != OPT_REPLY_MAGIC {
            return Err(bad("bad option reply magic"));
        }
        let (_opt, kind, len) = (read_u32(s)?, read_u32(s)?, read_u32(s)?);
        if len > MAX_OPTION_LEN {
            return Err(bad(format!("option reply of {len} bytes")));
        }
        let mut msg = vec![0u8; len as usize];
        s.read_exact(&mut msg)?;
        if kind != REP_ACK {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the server does not offer TLS ({})",
                    String::from_utf8_lossy(&msg)
                ),
            ));
        }
        *s = tls.connect(s)?;
    }

    let mut go = Vec::new();
    go.extend_from_slice(&(export.len() as u32).to_be_bytes());
    go.extend_from_slice(export.as_bytes());
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &go)?;
    let mut info: Option<(u64, u16)> = None;
    let mut max_request = 32 << 20;
    loop {
        if read_u64(s)? != OPT_REPLY_MAGIC {
            return Err(bad("bad option reply magic"));
        }
        let _opt = read_u32(s)?;
        let kind = read_u32(s)?;
        let len = read_u32(s)?;
        if len > MAX_OPTION_LEN {
            return Err(bad(format!("option reply of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match kind {
            REP_INFO if data.len() >= 2 => {
                let t = u16::from_be_bytes([data[0], data[1]]);
                if t == INFO_EXPORT && data.len() >= 12 {
                    let size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                    let flags = u16::from_be_bytes([data[10], data[11]]);
                    info = Some((size, flags));
                } else if t == INFO_BLOCK_SIZE && data.len() >= 14 {
                    let max = u32::from_be_bytes(data[10..14].try_into().expect("4 bytes"));
                    max_request = (max as usize).clamp(512, 32 << 20);
                }
            }
            REP_ACK => {
                let (size, flags) =
                    info.ok_or_else(|| bad("the server acknowledged GO without export info"))?;
                return Ok(ExportInfo {
                    size,
                    flags,
                    max_request,
                });
            }
            REP_ERR_UNSUP => break,
            k if k & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&data).into_owned();
                let what = match k {
                    REP_ERR_UNKNOWN => "no such export",
                    REP_ERR_POLICY => "refused by the server's policy",
                    REP_ERR_TLS_REQD => "the server requires TLS (nbds://)",
                    _ => "refused",
                };
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("export '{export}': {what} ({msg})"),
                ));
            }
            _ => {}
        }
    }
    // A server without NBD_OPT_GO: the old way.
    send_option(s, OPT_EXPORT_NAME, export.as_bytes())?;
    let size = read_u64(s)?;
    let flags = read_u16(s)?;
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z)?;
    }
    Ok(ExportInfo {
        size,
        flags,
        max_request,
    })
}

/// For the fuzzer: what a hostile server could send a client, as bytes:
/// the handshake's greeting and option replies, then replies to four reads
/// of up to 4 KiB in flight. Never panics, never hangs (the bytes end).
#[doc(hidden)]
pub fn fuzz_server_bytes(data: &[u8]) {
    let Some((ours, theirs)) = Stream::fed(data) else {
        return;
    };
    let Ok(mut s) = ours.try_clone() else { return };
    if handshake(&mut s, "fuzz", None).is_err() {
        return;
    }
    let _ = ours.set_read_timeout(Some(Duration::from_secs(1)));
    let Ok(ctl) = s.try_clone() else { return };
    let shared = Shared {
        flags: 0,
        max_request: 4096,
        ctl,
        raw: ours,
        timeout: None,
        writer: Mutex::new(theirs),
        rx: Mutex::new(s.try_clone().expect("clone")),
        reading: AtomicBool::new(true),
        pending: Mutex::new(HashMap::new()),
        broken: Mutex::new(None),
        next: AtomicU64::new(1),
    };
    let mut bufs = vec![vec![0u8; 4096]; 4];
    let slots: Vec<Arc<Slot>> = (0..4).map(|_| Arc::new(Slot::default())).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        shared.pending.lock().expect("pending").insert(
            i as u64 + 1,
            Waiter {
                buf: b.as_mut_ptr(),
                len: b.len() >> i,
                slot: slots[i].clone(),
            },
        );
    }
    while !slots.iter().all(|s| s.is_done()) {
        if let Err(why) = shared.read_reply(&mut s) {
            // Every waiter completed before its buffer goes.
            shared.fail_all(&why);
            break;
        }
    }
}

/// Fills in a write's data (the buffer) for its offset.
pub type FillWrite<'a> = dyn FnMut(u64, &mut [u8]) + 'a;

impl NbdClient {
    /// Connect to `uri` (see [`Address::parse`]) and negotiate the export.
    /// Requests wait for their replies as long as the network lets them.
    pub fn connect(uri: &str) -> io::Result<NbdClient> {
        Self::connect_with(uri, None)
    }

    /// As `connect`, with a limit on how long connecting and every
    /// request may take: a server that does not answer in time (a cut
    /// link, where TCP would wait for minutes) loses the connection, and
    /// the requests in flight fail.
    pub fn connect_with(uri: &str, timeout: Option<Duration>) -> io::Result<NbdClient> {
        let (shared, size) = Self::open(uri, timeout)?;
        Ok(Self::of(uri, shared, size, timeout))
    }

    fn of(uri: &str, shared: Shared, size: u64, timeout: Option<Duration>) -> NbdClient {
        NbdClient {
            name: uri.to_string(),
            size,
            shared: ArcSwap::from_pointee(shared),
            timeout,
            closed: AtomicBool::new(false),
        }
    }

    /// As `connect_with` with a request timeout of `timeout`, but connecting
    /// and negotiating may take only `connect`: a host tried again in the
    /// background is given a short while each time, its requests the
    /// usual time once it answers.
    pub fn connect_limited(
        uri: &str,
        connect: Duration,
        timeout: Option<Duration>,
    ) -> io::Result<NbdClient> {
        let (shared, size) = Self::open(uri, Some(timeout.map_or(connect, |t| t.min(connect))))?;
        shared.ctl.set_read_timeout(timeout)?;
        shared.ctl.set_write_timeout(timeout)?;
        Ok(Self::of(uri, shared, size, timeout))
    }

    /// A new connection to `uri`, negotiated: its state and the export's size.
    fn open(uri: &str, timeout: Option<Duration>) -> io::Result<(Shared, u64)> {
        let addr =
            Address::parse(uri).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let mut s =
            match &addr.endpoint {
                Endpoint::Tcp(hp) => {
                    let t = connect_tcp(hp, timeout).map_err(|e| {
                        io::Error::new(e.kind(), format!("{uri}: connecting to {hp}: {e}"))
                    })?;
                    t.set_nodelay(true)?;
                    Stream::Tcp(t)
                }
                Endpoint::Unix(p) => Stream::Unix(UnixStream::connect(p).map_err(|e| {
                    io::Error::new(e.kind(), format!("{uri}: connecting to {p}: {e}"))
                })?),
            };
        if let Some(t) = timeout {
            s.keepalive(t / 2);
        }
        let tls = match &addr.tls {
            Some(p) => Some(
                p.client(addr.host())
                    .map_err(|e| io::Error::new(e.kind(), format!("{uri}: {e}")))?,
            ),
            None => None,
        };
        // The connection itself, under TLS if any: it is what a lost
        // connection resets.
        let raw = s.try_clone()?;
        // A server that never answers must not hang us at the handshake.
        let handshake_limit =
            timeout.map_or(Duration::from_secs(30), |t| t.min(Duration::from_secs(30)));
        s.set_read_timeout(Some(handshake_limit))?;
        let info = handshake(&mut s, &addr.export, tls.as_ref()).map_err(|e| match e.kind() {
            // The socket's read timeout ran out ("Resource temporarily
            // unavailable" says nothing of that).
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{uri}: no answer to the NBD handshake within {:.0}s: the connection was \
                     taken but the server said nothing (not an NBD server, a link that \
                     went down, or a server already serving all the clients it takes: \
                     qemu-nbd takes one unless --shared)",
                    handshake_limit.as_secs_f64()
                ),
            ),
            _ => io::Error::new(e.kind(), format!("{uri}: {e}")),
        })?;
        // From now on the request timeout: a read that waits longer for a
        // reply, or a write for room to send, gives up.
        s.set_read_timeout(timeout)?;
        s.set_write_timeout(timeout)?;
        let shared = Shared {
            flags: info.flags,
            max_request: info.max_request,
            ctl: s.try_clone()?,
            raw,
            timeout,
            writer: Mutex::new(s.try_clone()?),
            rx: Mutex::new(s),
            reading: AtomicBool::new(false),
            pending: Mutex::new(HashMap::new()),
            broken: Mutex::new(None),
            next: AtomicU64::new(1),
        };
        Ok((shared, info.size))
    }

    /// The transmission flags the server advertised.
    pub fn flags(&self) -> u16 {
        self.shared.load().flags
    }

    /// Whether the server said writes are refused.
    pub fn read_only(&self) -> bool {
        self.flags() & TF_READ_ONLY != 0
    }

    /// One request and its reply. `read_into` receives a read's data;
    /// `payload` is a write's.
    fn request(
        &self,
        sh: &Shared,
        cmd: u16,
        offset: u64,
        len: u32,
        read_into: Option<&mut [u8]>,
        payload: &[u8],
    ) -> io::Result<()> {
        if let Some(why) = sh.broken.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()));
        }
        let handle = sh.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::default());
        let (buf, blen) = match read_into {
            Some(b) => (b.as_mut_ptr(), b.len()),
            None => (std::ptr::null_mut(), 0),
        };
        sh.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(
            handle,
            Waiter {
                buf,
                len: blen,
                slot: slot.clone(),
            },
        );
        let mut h = [0u8; REQUEST_LEN];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&0u16.to_be_bytes());
        h[6..8].copy_from_slice(&cmd.to_be_bytes());
        h[8..16].copy_from_slice(&handle.to_be_bytes());
        h[16..24].copy_from_slice(&offset.to_be_bytes());
        h[24..28].copy_from_slice(&len.to_be_bytes());
        let sent = {
            let mut w = sh.writer.lock().unwrap_or_else(|e| e.into_inner());
            w.send_message(&h, payload)
        };
        if let Err(e) = sent {
            sh.fail_all(&format!("sending a request: {e}"));
        }
        // Whatever happened, the waiter is completed exactly once (by a
        // reply or by fail_all): only then may the caller's buffer go.
        sh.wait_for(&slot)
    }

    /// Keep `qd` requests of `len` bytes in flight from this one thread
    /// until `deadline`, as fio's nbd engine does: reads (data dropped) or,
    /// with `write`, writes whose data it fills in for each request's
    /// offset. `next` gives each request's offset. Returns the requests
    /// completed. Needs the connection to itself: no other request may be
    /// in flight.
    pub fn run_queue(
        &self,
        qd: usize,
        len: u32,
        mut write: Option<&mut FillWrite>,
        deadline: std::time::Instant,
        mut next: impl FnMut() -> u64,
    ) -> io::Result<u64> {
        let sh = &*self.shared.load_full();
        if sh
            .reading
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
            || !sh
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            sh.reading.store(false, Ordering::Release);
            return Err(io::Error::other("run_queue needs the connection to itself"));
        }
        let r = (|| {
            let mut w = sh.writer.lock().unwrap_or_else(|e| e.into_inner());
            let mut rx = sh.rx.lock().unwrap_or_else(|e| e.into_inner());
            let cmd = if write.is_some() { CMD_WRITE } else { CMD_READ };
            let payload = if write.is_some() { len as usize } else { 0 };
            // Requests go out in batches and replies come in by the
            // buffer-full, as libnbd's event loop does for fio's nbd
            // engine: one send for every request a batch of replies makes
            // room for, and one receive for as many replies as have
            // arrived. A send and a receive per request cost the client
            // (and, over loopback, the kernel's TCP work on both ends)
            // more than the request: with them this loop measured 0.8 of
            // fio against nbdkit's memory plugin at 4 KiB and QD32.
            let mut out: Vec<u8> = Vec::with_capacity(BATCH_BYTES + REQUEST_LEN + payload);
            let reply_len = REPLY_LEN + if cmd == CMD_READ { len as usize } else { 0 };
            let mut inbuf = vec![0u8; BATCH_BYTES.max(2 * reply_len)];
            let (mut have, mut at) = (0usize, 0usize);
            let mut failed: Option<io::Error> = None;
            // Queue the next request in `out` (sent once the batch is
            // full or complete); false (and `failed` set) if its offset is
            // out of range, which is refused without sending.
            let mut queue = |out: &mut Vec<u8>,
                             w: &mut Stream,
                             failed: &mut Option<io::Error>|
             -> io::Result<bool> {
                let off = next();
                if let Err(e) = check_range(&self.name, Op::Read, off, len as u64, self.size) {
                    *failed = Some(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()));
                    return Ok(false);
                }
                let mut h = [0u8; REQUEST_LEN];
                h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                h[6..8].copy_from_slice(&cmd.to_be_bytes());
                h[8..16].copy_from_slice(&sh.next.fetch_add(1, Ordering::Relaxed).to_be_bytes());
                h[16..24].copy_from_slice(&off.to_be_bytes());
                h[24..28].copy_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&h);
                if let Some(fill) = &mut write {
                    let from = out.len();
                    out.resize(from + payload, 0);
                    fill(off, &mut out[from..]);
                }
                if out.len() >= BATCH_BYTES {
                    w.write_all(out)?;
                    out.clear();
                }
                Ok(true)
            };
            let mut in_flight = 0usize;
            while in_flight < qd.max(1) && queue(&mut out, &mut w, &mut failed)? {
                in_flight += 1;
            }
            w.write_all(&out)?;
            out.clear();
            let mut done = 0u64;
            while in_flight > 0 {
                // At least one whole reply in the buffer, then every
                // whole one that came with it.
                let mut answered = 0usize;
                loop {
                    if have - at >= REPLY_LEN {
                        let h = &inbuf[at..at + REPLY_LEN];
                        if u32::from_be_bytes(h[0..4].try_into().expect("4")) != SIMPLE_REPLY_MAGIC
                        {
                            return Err(bad("unexpected reply magic"));
                        }
                        let error = u32::from_be_bytes(h[4..8].try_into().expect("4"));
                        let size = if error == 0 { reply_len } else { REPLY_LEN };
                        if have - at >= size {
                            at += size;
                            in_flight -= 1;
                            answered += 1;
                            if error != 0 {
                                failed.get_or_insert(io::Error::from_raw_os_error(error as i32));
                            } else {
                                done += 1;
                            }
                            continue;
                        }
                    }
                    if answered > 0 {
                        break;
                    }
                    // Keep the partial reply at the buffer's start.
                    inbuf.copy_within(at..have, 0);
                    have -= at;
                    at = 0;
                    // With several requests in flight a reply is never far
                    // off: poll for it a while before sleeping. A client
                    // that sleeps between replies makes the server wake it
                    // for each batch, and over loopback in a virtual
                    // machine that wake-up (an interrupt to the other CPU)
                    // cost nbdkit's memory plugin a fifth of its rate at
                    // QD32 (docs/performance.md). One request in flight
                    // waits as fio and dd do, asleep.
                    let n = if qd > 1 {
                        let t0 = std::time::Instant::now();
                        let got = loop {
                            if let Some(n) = rx.read_now(&mut inbuf[have..])? {
                                break Some(n);
                            }
                            if t0.elapsed() >= SPIN {
                                break None;
                            }
                            std::hint::spin_loop();
                        };
                        POLLED.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        match got {
                            Some(n) => n,
                            None => rx.read(&mut inbuf[have..])?,
                        }
                    } else {
                        rx.read(&mut inbuf[have..])?
                    };
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    have += n;
                }
                if failed.is_none() && std::time::Instant::now() < deadline {
                    for _ in 0..answered {
                        if !queue(&mut out, &mut w, &mut failed)? {
                            break;
                        }
                        in_flight += 1;
                    }
                    w.write_all(&out)?;
                    out.clear();
                }
            }
            // A request the server refused leaves the connection usable.
            Ok(match failed {
                Some(e) => Err(e),
                None => Ok(done),
            })
        })();
        sh.reading.store(false, Ordering::Release);
        match r {
            Ok(r) => r,
            Err(e) => {
                sh.fail_all(&format!("pipelined requests: {e}"));
                Err(e)
            }
        }
    }

    /// Send NBD_CMD_DISC and close the connection.
    pub fn disconnect(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let sh = self.shared.load_full();
        let mut w = sh.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut h = [0u8; REQUEST_LEN];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
        let _ = w.write_all(&h);
        w.shutdown(Shutdown::Both);
    }

    fn io_err(&self, op: Op, offset: u64, len: u64, e: io::Error) -> MemberError {
        MemberError::new(&self.name, op, offset, len, e)
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        self.disconnect();
    }
}

impl Member for NbdClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, Op::Read, offset, buf.len() as u64, self.size)?;
        let sh = self.shared.load_full();
        let mut off = offset;
        for piece in buf.chunks_mut(sh.max_request) {
            let n = piece.len();
            self.request(&sh, CMD_READ, off, n as u32, Some(piece), &[])
                .map_err(|e| self.io_err(Op::Read, off, n as u64, e))?;
            off += n as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(&self.name, Op::Write, offset, buf.len() as u64, self.size)?;
        let sh = self.shared.load_full();
        if sh.flags & TF_READ_ONLY != 0 {
            return Err(self.io_err(
                Op::Write,
                offset,
                buf.len() as u64,
                io::Error::from_raw_os_error(EPERM as i32),
            ));
        }
        let mut off = offset;
        for piece in buf.chunks(sh.max_request) {
            self.request(&sh, CMD_WRITE, off, piece.len() as u32, None, piece)
                .map_err(|e| self.io_err(Op::Write, off, piece.len() as u64, e))?;
            off += piece.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let sh = self.shared.load_full();
        if sh.flags & TF_SEND_FLUSH == 0 {
            // The server says writes are durable when acknowledged.
            return Ok(());
        }
        self.request(&sh, CMD_FLUSH, 0, 0, None, &[])
            .map_err(|e| self.io_err(Op::Flush, 0, 0, e))
    }

    fn remote(&self) -> Option<&dyn Remote> {
        Some(self)
    }
}

impl Remote for NbdClient {
    fn lost(&self) -> Option<String> {
        let sh = self.shared.load();
        if let Some(why) = sh.broken.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Some(why);
        }
        // Nothing is sent or read on an idle connection, so a server that
        // went away would go unnoticed until the next request: look.
        let why = sh.ctl.gone()?;
        sh.fail_all(&why);
        Some(why)
    }

    fn cut(&self, why: &str) {
        self.shared.load().fail_all(why);
    }

    fn reconnect(&self, timeout: Duration) -> io::Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(io::Error::other("the client was closed"));
        }
        if self.lost().is_none() {
            return Ok(());
        }
        let limit = Some(self.timeout.map_or(timeout, |t| t.min(timeout)));
        let (shared, size) = Self::open(&self.name, limit)?;
        // The request timeout again, not the (maybe shorter) connect one.
        shared.ctl.set_read_timeout(self.timeout)?;
        shared.ctl.set_write_timeout(self.timeout)?;
        if size != self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the export is {size} bytes now, {} before",
                    self.name, self.size
                ),
            ));
        }
        self.shared.store(Arc::new(shared));
        Ok(())
    }
}

/// A TCP connection to `host:port`, trying each address it resolves to,
/// each for at most `timeout` (an unreachable host otherwise takes the
/// kernel's SYN retries, about two minutes).
fn connect_tcp(hostport: &str, timeout: Option<Duration>) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let Some(t) = timeout else {
        return TcpStream::connect(hostport);
    };
    let mut last = None;
    for a in hostport.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, t) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
}

#[cfg(test)]
mod tests;
