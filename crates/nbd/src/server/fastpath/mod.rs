//! The fast paths: ways to serve a request with a copy of its data or a
//! system call fewer, where the medium allows it. Each has its switch in
//! [`Config`] and its counter in [`Stats`]:
//!
//! - `splice.rs`: large reads moved file → pipe → socket, never copied
//!   here (`zero_copy`; `zero_copy_reads`).
//! - `mapped_read.rs`: large reads sent from mappings of the member files'
//!   cached pages (`mapped_reads`; `mapped_reads`).
//! - `mapped_write.rs`: large writes received from the socket straight into
//!   such mappings (`mapped_writes`; `mapped_writes`).
//! - `run.rs`: for a parity array, the run of writes to place together
//!   (whole stripes), and a short wait for its missing headers
//!   (`mapped_writes` with `merge_align`; `run_waits`).
//! - `hold.rs`: small write replies held for the next one's send
//!   (`batch_replies`; `held_replies`).
//!
//! The connection stages ask [`FastPaths`] only (and keep, per
//! connection, the `Backlog` and `Serving` it looks at), and its answers
//! are an [`Outcome`]: what was done, so that the ordinary path knows where
//! to carry on. A fast path leaves a member's errors alone: where it meets
//! one it stops, and the ordinary path, which cures the error from
//! redundancy or fails the member, meets it again. Only the device's own
//! failure after payloads were placed is passed on (`DeviceFailed`), since
//! no ordinary write follows to report it.

mod hold;
mod mapped_read;
mod mapped_write;
mod run;
mod splice;

pub(super) use hold::Backlog;
pub(super) use run::{Serving, RUN_WAIT_STEP, STRIPE_WAIT};

use super::{ensure_len, inc, read_payload, Config, Export, Stats, LARGE_REPLY};
use crate::proto::Request;
use crate::stream::Stream;
use mapped_read::MappedReads;
use mapped_write::{MappedWrites, Received};
use raidkit_member::AlignedVec;
use raidkit_member::Member;
use run::{Run, Runs};
use splice::Splicer;
use std::io::{self, BufReader};
use std::sync::{Arc, MutexGuard};

/// What a fast path did with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not this path's to take: switched off, too small, not in plain
    /// files or not cached, a mapping refused. Nothing was done to the
    /// device; the ordinary path serves the request.
    Declined,
    /// Done: a read's data is loaded, for `FastPaths::send_read`; a run of
    /// writes' payloads are all in the device.
    Served,
    /// Begun, then stopped at a member (a write error, a fault in a
    /// mapping): the ordinary path serves the rest from where this stopped.
    Stopped,
    /// The payloads were placed, but the device failed the work that
    /// follows (a parity array could not bring the stripes up to date):
    /// every request taken fails with this message.
    DeviceFailed(String),
}

/// Why a fast path stopped inside a callback of `Member::with_file_extents`
/// or `Member::with_write_extents`, which can only answer with an
/// `io::Error`: carried in one, so that what comes back is told apart from
/// the device's own errors by its type.
#[derive(Debug)]
enum Stop {
    /// Nothing was written or loaded: not cached, no mapping to be had.
    Declined,
    /// Stopped at a member part-way.
    Member,
    /// The connection failed (its error is kept aside by the caller).
    Connection,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Declined => "fast path declined",
            Stop::Member => "fast path stopped at a member",
            Stop::Connection => "connection failed",
        })
    }
}

impl std::error::Error for Stop {}

impl Stop {
    fn into_error(self) -> io::Error {
        // `WouldBlock` is how `Member::with_write_extents` is told that
        // nothing was written (a parity array then leaves its parity
        // alone); the kind means nothing else here.
        let kind = match self {
            Stop::Declined => io::ErrorKind::WouldBlock,
            Stop::Member | Stop::Connection => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }

    /// The stop `e` carries, if it is one of ours.
    fn of(e: &io::Error) -> Option<&Stop> {
        e.get_ref()?.downcast_ref()
    }
}

/// One worker's fast paths, with their switches.
#[derive(Debug)]
pub(super) struct FastPaths {
    splicer: Splicer,
    mapped_reads: MappedReads,
    mapped_writes: MappedWrites,
    runs: Runs,
    batch_replies: bool,
    stats: Arc<Stats>,
}

impl FastPaths {
    /// `zero_copy`: whether this connection's large reads are spliced
    /// (`Config::zero_copy`, settled per connection).
    pub(super) fn new(config: &Config, zero_copy: bool, stats: Arc<Stats>) -> FastPaths {
        FastPaths {
            splicer: Splicer::new(zero_copy),
            mapped_reads: MappedReads::new(config.mapped_reads),
            mapped_writes: MappedWrites::default(),
            runs: Runs::new(config),
            batch_replies: config.batch_replies,
            stats,
        }
    }

    /// Load a read's data, `len` bytes at `offset` of `dev`, to be sent
    /// with `send_read`: spliced into a pipe, or else found in mappings.
    /// `Declined`: nothing is held, read with `read_at`.
    pub(super) fn read(&mut self, dev: &dyn Member, offset: u64, len: usize) -> Outcome {
        if self.splicer.load(dev, offset, len) == Outcome::Served {
            inc(&self.stats.zero_copy_reads, 1);
            return Outcome::Served;
        }
        if len >= LARGE_REPLY && self.mapped_reads.load(dev, offset, len) == Outcome::Served {
            inc(&self.stats.mapped_reads, 1);
            return Outcome::Served;
        }
        Outcome::Declined
    }

    /// Bytes of read data loaded by `read`, waiting for `send_read` (0:
    /// none).
    pub(super) fn loaded(&self) -> usize {
        self.splicer.loaded.max(self.mapped_reads.loaded)
    }

    /// Send `header` and the data `read` loaded on `s`, whose buffered
    /// writer has been flushed.
    pub(super) fn send_read(&mut self, s: &mut Stream, header: &[u8]) -> io::Result<()> {
        if self.splicer.loaded > 0 {
            self.splicer.send(s, header)
        } else {
            s.send_more(header)?;
            self.mapped_reads.send(s.as_fd())
        }
    }

    /// Forget a loaded read that will not be sent.
    pub(super) fn discard(&mut self) {
        self.splicer.discard();
        self.mapped_reads.discard();
    }

    /// Take the payload of the write `first`, whose header is taken from
    /// `reader`, straight into the device if it can go there: alone, or
    /// for a parity array with the writes after it that make whole stripes
    /// (their headers are taken on the way and added to `taken`). What is
    /// not placed is left for the ordinary path: the returned positions
    /// (`Received`) say what is in the device, what in `payload` and what
    /// is still in the socket. With every payload in, `reader` is let go
    /// (set to None) so that other workers take the next requests while the
    /// device finishes. `Err`: the connection failed.
    pub(super) fn write(
        &mut self,
        export: &Export,
        serving: &Serving,
        reader: &mut Option<MutexGuard<'_, BufReader<Stream>>>,
        first: Request,
        payload: &mut AlignedVec,
        taken: &mut Vec<Request>,
    ) -> io::Result<(Outcome, Received)> {
        let len = first.len as usize;
        let r = reader.as_mut().expect("reader held");
        let mut have = 0;
        let mut run = self.runs.placeable(export, r, first, 0);
        if let Run::Missing { need } = run {
            run = self.runs.wait_for(export, serving, r, first, need);
            if let Run::Ready(_) = run {
                inc(&self.stats.run_waits, 1);
            }
        }
        if let Run::Missing { .. } = run {
            // Still not there: take this payload, which lets the client
            // send more, and look again (what was taken is then written
            // from the buffer, the rest of the run straight in).
            ensure_len(payload, len);
            read_payload(r, &mut payload[..len])?;
            have = len;
            run = self.runs.placeable(export, r, first, have);
        }
        let run = match run {
            Run::Ready(run) => run,
            Run::Missing { .. } | Run::Declined => {
                let got = Received {
                    placed: 0,
                    have,
                    end: len,
                };
                return Ok((Outcome::Declined, got));
            }
        };
        let total = run.iter().map(|q| q.len as usize).sum();
        ensure_len(payload, total);
        self.mapped_writes.receive(
            reader,
            export.device.as_ref(),
            &run,
            &mut payload[..total],
            have,
            taken,
        )
    }

    /// Count the requests of `taken` wholly written on arrival (the first
    /// `placed` bytes of their payloads), once they have succeeded.
    pub(super) fn count_placed(&self, taken: &[Request], placed: usize) {
        let mut at = 0;
        let whole_ones = taken
            .iter()
            .take_while(|q| {
                at += q.len as usize;
                at <= placed
            })
            .count();
        inc(&self.stats.mapped_writes, whole_ones as u64);
    }

    /// Whether the last worker to reply may leave the `held` bytes of
    /// `replies` replies in the buffer for the next one's send (see
    /// `hold.rs`).
    pub(super) fn hold_replies(&self, backlog: &Backlog, held: usize, replies: usize) -> bool {
        let hold = self.batch_replies && hold::may_hold(backlog, held);
        if hold {
            inc(&self.stats.held_replies, replies as u64);
        }
        hold
    }
}
