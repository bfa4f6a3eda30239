//! Held replies. On loopback a send costs the server as much as the rest
//! of a small write, since the kernel delivers the data to the client in
//! the same call; so while small writes queue up, the last worker to reply
//! may leave the replies in the buffer for whoever answers the next request
//! to send with its own.
//!
//! Only while requests queue up behind a quick write that has arrived whole
//! (`quick_backlog`): that write's worker replies soon and decides the same
//! way, so replies wait at most for one quick write, never for a request
//! still arriving, and the last reply of a burst goes out at once. A client
//! with few requests in flight gets every reply at once: held replies would
//! leave it nothing to do, and looking at the socket to find out would cost
//! a system call on every reply.

use crate::proto::{parse_request, CMD_FLAG_FUA, CMD_WRITE, REQUEST_LEN};
use crate::server::LARGE_REPLY;
use crate::stream::Stream;
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};

/// Replies held back are sent once they reach this much.
const REPLY_BATCH: usize = 16 << 10;

/// How much a connection's buffer must hold, beginning with a quick write
/// received whole, for replies to be held: four 4 KiB writes. Less lets a
/// client at a low queue depth wait for replies it could already have.
const HOLD_BACKLOG: usize = 16 << 10;

/// Whether a connection's read buffer held a backlog beginning with a
/// quick write when its last taker let go of it.
#[derive(Debug, Default)]
pub(crate) struct Backlog(AtomicBool);

impl Backlog {
    /// Look at the reader being let go (None: let go already, with the
    /// socket not looked at).
    pub(crate) fn note(&self, r: Option<&BufReader<Stream>>) {
        self.0.store(r.is_some_and(quick_backlog), Ordering::SeqCst);
    }
}

/// Whether the `held` bytes of replies in the buffer may stay there.
pub(super) fn may_hold(backlog: &Backlog, held: usize) -> bool {
    held < REPLY_BATCH && backlog.0.load(Ordering::SeqCst)
}

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
