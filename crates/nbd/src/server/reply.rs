//! Replies: their headers, shaped by what the handshake settled, and
//! sending them. Replies are coalesced: a worker that finds others about to
//! reply leaves its reply in the buffer, and the last one sends them all in
//! one system call (or holds them a little longer, see `fastpath/hold.rs`).
//! Large read data bypasses the buffer, sent with its header in one call.

use super::fastpath::{Backlog, FastPaths};
use super::handshake::Negotiated;
use super::LARGE_REPLY;
use crate::proto::*;
use crate::stream::Stream;
use raidkit_member::Locked;
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Reply buffer per connection.
const WRITE_BUFFER: usize = 256 << 10;

/// The writing side of a connection, shared by its workers.
#[derive(Debug)]
pub(super) struct Replies {
    writer: Mutex<BufWriter<Stream>>,
    /// Workers with a reply ready or being written; the last one sends
    /// what is buffered, unless it may hold it.
    replying: AtomicUsize,
}

impl Replies {
    pub(super) fn new(s: Stream) -> Replies {
        Replies {
            writer: Mutex::new(BufWriter::with_capacity(WRITE_BUFFER, s)),
            replying: AtomicUsize::new(0),
        }
    }

    /// Answer every request of `taken` with `result`; a read's data is in
    /// `buf`, or loaded in `fast`. `Err`: the client is gone.
    pub(super) fn send(
        &self,
        taken: &[Request],
        neg: Negotiated,
        result: &Result<(), (u32, String)>,
        buf: &[u8],
        fast: &mut FastPaths,
        backlog: &Backlog,
    ) -> io::Result<()> {
        let data_len = match fast.loaded() {
            0 => buf.len(),
            n => n,
        };
        self.replying.fetch_add(1, Ordering::AcqRel);
        let mut out = self.writer.locked();
        let sent = (|| {
            for req in taken {
                let header = header(req, neg, result, data_len);
                if req.kind == CMD_READ && result.is_ok() {
                    if fast.loaded() > 0 {
                        // The data is not in this process: header, then it.
                        out.flush()?;
                        fast.send_read(out.get_mut(), &header)?;
                        continue;
                    }
                    if buf.len() >= LARGE_REPLY {
                        // Header and data straight from here, no copy.
                        out.flush()?;
                        out.get_mut().send_message(&header, buf)?;
                        continue;
                    }
                    out.write_all(&header)?;
                    out.write_all(buf)?;
                } else {
                    out.write_all(&header)?;
                }
            }
            Ok(())
        })();
        fast.discard();
        let last = self.replying.fetch_sub(1, Ordering::AcqRel) == 1;
        sent.and_then(|()| {
            if !last || fast.hold_replies(backlog, out.buffer().len(), taken.len()) {
                Ok(())
            } else {
                out.flush()
            }
        })
    }

    /// Send whatever is left in the buffer, once the workers are done.
    pub(super) fn finish(&self) {
        let _ = self.writer.locked().flush();
    }
}

/// The reply header for a request's outcome (read data, if any, follows it).
fn header(
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
