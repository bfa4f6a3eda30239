//! Taking requests off a connection's socket. The workers of a connection
//! take turns at it (whoever holds the reader reads one request, with its
//! payload, then lets go and serves it), so that a request never waits for
//! a hand-off between threads. A write's payload goes straight into the
//! device where a fast path can take it; otherwise it is read into the
//! worker's buffer, with the contiguous writes behind it that have already
//! arrived merged in (`Config::merge_writes`).

use super::fastpath::{Backlog, FastPaths, Outcome, Serving, RUN_WAIT_STEP, STRIPE_WAIT};
use super::{ensure_len, read_payload, Target, MAX_PAYLOAD, MERGE_MAX_ALIGNED};
use crate::proto::*;
use crate::stream::Stream;
use raidkit_member::AlignedVec;
use raidkit_member::Locked;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Socket read buffer per connection. Payloads at least this big bypass it
/// (no extra copy) when it is empty.
const READ_BUFFER: usize = 32 << 10;

/// Largest run of contiguous writes merged into one array write, when no
/// stripe boundary is sought.
const MERGE_MAX: usize = 8 << 20;

/// The reading side of a connection, shared by its workers.
#[derive(Debug)]
pub(super) struct Intake {
    reader: Mutex<BufReader<Stream>>,
    /// Set on DISC, EOF, a malformed request or a dead client.
    closing: AtomicBool,
    /// What ended the connection, if it was not the client's choice.
    error: Mutex<Option<io::Error>>,
    /// What the reader's buffer held when last let go (for held replies).
    backlog: Backlog,
    /// Workers serving a large request (for runs of writes).
    serving: Serving,
}

/// What a worker took: one request, or a run of contiguous writes served
/// as one.
#[derive(Debug)]
pub(super) struct Taken {
    /// What to serve: the first request, for a write with the length of the
    /// whole run.
    pub(super) whole: Request,
    /// The payload's length in the worker's buffer (0 but for writes).
    pub(super) used: usize,
    /// Payload bytes already written to the device on arrival.
    pub(super) placed: usize,
    /// The device failed the bytes placed afterwards: every request taken
    /// fails with this.
    pub(super) failed: Option<String>,
    /// Whether it counts in `Intake::serving`.
    counted: bool,
}

impl Intake {
    pub(super) fn new(s: Stream) -> Intake {
        Intake {
            reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, s)),
            closing: AtomicBool::new(false),
            error: Mutex::new(None),
            backlog: Backlog::default(),
            serving: Serving::default(),
        }
    }

    /// Take the next request, its payload into `payload` and every request
    /// it stands for into `taken`. None: the connection is closing (DISC,
    /// EOF, or an error, which `error` gives); the requests already taken
    /// still finish.
    pub(super) fn take(
        &self,
        server: &Target,
        fast: &mut FastPaths,
        payload: &mut AlignedVec,
        taken: &mut Vec<Request>,
    ) -> Option<Taken> {
        taken.clear();
        // Held while taking requests from the socket; a write whose
        // payloads all went straight into the device lets go of it before
        // the device finishes (see `FastPaths::write`). Whatever ends the
        // connection is noted before it is let go, so that no other worker
        // reads past a malformed request.
        let mut reader = Some(self.reader.locked());
        if self.closing.load(Ordering::Acquire) {
            return None;
        }
        let got = self.read(server, fast, &mut reader, payload, taken);
        if let Err(e) = got {
            self.closing.store(true, Ordering::Release);
            *self.error.locked() = Some(e);
            return None;
        }
        self.backlog.note(reader.as_deref());
        let got = got.ok().flatten();
        if got.is_none() {
            self.closing.store(true, Ordering::Release);
        }
        got
    }

    fn read(
        &self,
        server: &Target,
        fast: &mut FastPaths,
        reader: &mut Option<MutexGuard<'_, BufReader<Stream>>>,
        payload: &mut AlignedVec,
        taken: &mut Vec<Request>,
    ) -> io::Result<Option<Taken>> {
        let r = reader.as_mut().expect("reader held");
        let Some(req) = read_header(r)? else {
            return Ok(None);
        };
        let mut t = Taken {
            whole: req,
            used: 0,
            placed: 0,
            failed: None,
            counted: self.serving.begin(&req),
        };
        taken.push(req);
        if req.kind != CMD_WRITE {
            return Ok(Some(t));
        }
        let (outcome, got) =
            fast.write(&server.export, &self.serving, reader, req, payload, taken)?;
        if let Outcome::DeviceFailed(msg) = outcome {
            t.failed = Some(msg);
        }
        t.placed = got.placed;
        let mut used = got.end;
        // None: every payload was placed, and the reader let go.
        if let Some(r) = reader.as_mut() {
            ensure_len(payload, used);
            read_payload(r, &mut payload[got.have..used])?;
            if taken.len() == 1 && got.placed == 0 && server.config.merge_writes {
                merge_writes(
                    r,
                    &self.serving,
                    payload,
                    &mut used,
                    taken,
                    Limits {
                        size: server.export.device.len(),
                        align: server.config.merge_align,
                        wait: STRIPE_WAIT,
                    },
                )?;
            }
        }
        t.used = used;
        t.whole.len = used as u32;
        Ok(Some(t))
    }

    /// A worker has answered `t`.
    pub(super) fn done(&self, t: &Taken) {
        if t.counted {
            self.serving.end();
        }
    }

    /// End the connection: no more requests are taken.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    pub(super) fn backlog(&self) -> &Backlog {
        &self.backlog
    }

    /// What ended the connection, if it was not the client's choice.
    pub(super) fn error(&self) -> Option<io::Error> {
        self.error.locked().take()
    }
}

/// What bounds a run of merged writes: the device's size, the boundary it
/// ends on (0: none), and how long it waits for a missing header.
#[derive(Debug, Clone, Copy)]
struct Limits {
    size: u64,
    align: u64,
    wait: Duration,
}

/// Like the kernel's block layer, take the writes that follow `merged[0]`
/// and continue it (same flags, next offset), as long as their headers have
/// arrived: one larger array write turns sequential partial-stripe writes
/// into full-stripe writes, which need no reads. With `align`, the run
/// stops as soon as it ends on a multiple of `align` (md's stripe cache
/// gets the same effect by holding partial stripes back until the rest
/// arrives); a run that would end inside a stripe waits a little for the
/// next header while other large requests of the connection are being
/// served (the client most likely sends it as soon as one of their replies
/// leaves), as a run of mapped writes does. Without that wait, two
/// sequential writers on two connections broke their runs mid-stripe three
/// times as often as one (0.3 member reads per 1 MiB write instead of 0.1):
/// each break is two partial-stripe updates, read-modify-written and, with
/// the journal, logged with their data. Each request still gets its own
/// reply.
fn merge_writes(
    r: &mut BufReader<Stream>,
    serving: &Serving,
    payload: &mut AlignedVec,
    len: &mut usize,
    merged: &mut Vec<Request>,
    Limits { size, align, wait }: Limits,
) -> io::Result<()> {
    let first = merged[0];
    let max = if align > 0 {
        MERGE_MAX_ALIGNED
    } else {
        MERGE_MAX
    };
    let since = Instant::now();
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
            let missing = REQUEST_LEN - r.buffer().len();
            if !r.get_ref().has_bytes(missing) {
                if align == 0 || !serving.others() || since.elapsed() >= wait {
                    return Ok(());
                }
                r.get_ref().wait_for_bytes(missing, RUN_WAIT_STEP);
                continue;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    fn write_request(offset: u64, len: u32, cookie: u64) -> Request {
        Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie,
            offset,
            len,
        }
    }

    #[test]
    fn a_run_ending_inside_a_stripe_waits_for_the_next_header_only_while_others_are_served() {
        const PIECE: u32 = 64 << 10;
        const STRIPE: u64 = 3 * PIECE as u64;
        for others in [true, false] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let mut r = BufReader::new(Stream::Tcp(l.accept().unwrap().0));
            let serving = Serving::default();
            let first = write_request(0, PIECE, 1);
            assert!(serving.begin(&first));
            if others {
                assert!(serving.begin(&write_request(10 * STRIPE, PIECE, 9)));
            }
            let mut payload = AlignedVec::new();
            payload.resize(PIECE as usize);
            let mut len = PIECE as usize;
            let mut merged = vec![first];
            // The next write, which completes the stripe, arrives only
            // after the run has looked for it.
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let next = write_request(PIECE as u64, 2 * PIECE, 2);
                // The server side may be gone (nothing waited): ignored.
                let _ = client.write_all(&encode_request(&next));
                let _ = client.write_all(&vec![7u8; 2 * PIECE as usize]);
            });
            // A long limit, so that a slow machine cannot make the header
            // late; the server's is STRIPE_WAIT.
            let limits = Limits {
                size: 1 << 30,
                align: STRIPE,
                wait: Duration::from_secs(10),
            };
            merge_writes(
                &mut r,
                &serving,
                &mut payload,
                &mut len,
                &mut merged,
                limits,
            )
            .unwrap();
            drop(r);
            sender.join().unwrap();
            if others {
                assert_eq!(merged.len(), 2, "the run did not wait for its next write");
                assert_eq!(len as u64, STRIPE);
                assert!(payload[PIECE as usize..len].iter().all(|&b| b == 7));
            } else {
                assert_eq!(
                    merged.len(),
                    1,
                    "nothing else in flight, yet the run waited"
                );
                assert_eq!(len, PIECE as usize);
            }
        }
    }
}
