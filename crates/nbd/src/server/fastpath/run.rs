//! Runs of writes placed together. A parity array takes writes placed
//! straight into its members in whole stripes only (it computes their
//! parity from what the data members hold afterwards), while a client cuts
//! a sequential stream into writes often smaller than a stripe. So the
//! writes that follow one, contiguous and already arrived, are looked at in
//! the socket (peeked at, not taken) up to a stripe boundary; and when the
//! next header is only missing because the client waits for other replies
//! of the connection, it is waited for a little, since a stripe written in
//! part costs reading the rest of it back and logging the data.

use crate::proto::{parse_request, Request, CMD_FLAG_FUA, CMD_WRITE, REQUEST_LEN};
use crate::server::{Config, Export, LARGE_REPLY, MERGE_MAX_ALIGNED};
use crate::stream::Stream;
use std::io::BufReader;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a run waits at most for a missing header while other requests
/// of the connection are being served, and how long each wait for it lasts
/// before looking again.
pub(crate) const RUN_WAIT: Duration = Duration::from_millis(2);
/// As `RUN_WAIT`, for a run of writes that would end inside a stripe of a
/// parity array. Longer: at 32 requests of 1 MiB in flight the next header
/// comes once an earlier run is written and its replies are out, several
/// milliseconds later; a run that gives up first ends in a partial-stripe
/// update (read, and with the journal logged with its data and flushed),
/// and so does the next run, from the other side of the stripe.
pub(crate) const STRIPE_WAIT: Duration = Duration::from_millis(10);
pub(crate) const RUN_WAIT_STEP: Duration = Duration::from_micros(200);

/// The writes whose payloads to try receiving straight into the device.
#[derive(Debug)]
pub(super) enum Run {
    /// These, in order: the first one's header is taken, the others' only
    /// peeked at.
    Ready(Vec<Request>),
    /// None yet, but there may be once more has arrived: a header is
    /// missing, which is in once the socket holds `need` bytes.
    Missing { need: usize },
    /// None: not for this path.
    Declined,
}

/// Workers of a connection that have taken a large request (`LARGE_REPLY`
/// and more) and not yet answered it. Small ones are not counted, to keep
/// their cost down: only a run of large writes asks.
#[derive(Debug, Default)]
pub(crate) struct Serving(AtomicUsize);

impl Serving {
    /// A worker has taken `r`; whether it counts (then `end` when answered).
    pub(crate) fn begin(&self, r: &Request) -> bool {
        let counted = r.len as usize >= LARGE_REPLY;
        if counted {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
        counted
    }

    pub(crate) fn end(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether other large requests are being served besides the one of
    /// the worker that asks: then the client most likely sends its next
    /// request once their replies leave.
    pub(crate) fn others(&self) -> bool {
        self.0.load(Ordering::Acquire) > 1
    }
}

/// Run detection, with its switches.
#[derive(Debug)]
pub(super) struct Runs {
    /// `Config::mapped_writes`: whether anything is placed at all.
    enabled: bool,
    /// `Config::merge_align`: the full-stripe size a run must fill (0: a
    /// write goes alone).
    align: u64,
}

impl Runs {
    pub(super) fn new(config: &Config) -> Runs {
        Runs {
            enabled: config.mapped_writes,
            align: config.merge_align,
        }
    }

    /// The run starting with `first` (whose header is taken, and the first
    /// `have` bytes of its payload too): `first` alone; for a parity array,
    /// `first` and the contiguous writes after it whose headers have
    /// arrived already, up to a stripe boundary.
    pub(super) fn placeable(
        &self,
        export: &Export,
        r: &BufReader<Stream>,
        first: Request,
        have: usize,
    ) -> Run {
        if !self.may_place(export, &first) {
            return Run::Declined;
        }
        let align = self.align;
        if align == 0 {
            return Run::Ready(vec![first]);
        }
        if !first.offset.is_multiple_of(align) {
            return Run::Declined;
        }
        let mut run = vec![first];
        let mut end = first.offset + first.len as u64;
        let mut total = first.len as usize;
        // Socket bytes before the next header: the payload not buffered.
        let unread = total - have.min(total);
        if r.buffer().len() > unread {
            // The next header is (partly) in the reader's buffer, not in
            // the socket: too rare to look for there.
            return Run::Declined;
        }
        let mut skip = unread - r.buffer().len();
        while !end.is_multiple_of(align) {
            let mut hb = [0u8; REQUEST_LEN];
            if total >= MERGE_MAX_ALIGNED {
                return Run::Declined;
            }
            if !r.get_ref().peek_at(skip, &mut hb) {
                return Run::Missing {
                    need: skip + REQUEST_LEN,
                };
            }
            let Ok(next) = parse_request(&hb) else {
                return Run::Declined;
            };
            if next.kind != CMD_WRITE
                || next.flags != first.flags
                || next.offset != end
                || !self.may_place(export, &next)
            {
                return Run::Declined;
            }
            run.push(next);
            end += next.len as u64;
            total += next.len as usize;
            skip += REQUEST_LEN + next.len as usize;
        }
        Run::Ready(run)
    }

    /// A run starting with `first` (nothing of its payload taken yet) whose
    /// next header is missing, until the socket holds `need` bytes: while
    /// other requests of this connection are being served, the client is
    /// most likely only waiting for their replies to send the rest, so wait
    /// for it a little. A client that sends no more until this write is
    /// answered is not kept waiting: nothing else is in flight then, or not
    /// for long.
    pub(super) fn wait_for(
        &self,
        export: &Export,
        serving: &Serving,
        r: &BufReader<Stream>,
        first: Request,
        mut need: usize,
    ) -> Run {
        let since = Instant::now();
        // What the socket can hold before the client must wait for this
        // worker to read: more cannot arrive. Three quarters of the
        // buffer, the rest being the kernel's overhead per segment (large
        // writes over loopback fill nearly all of it, small segments about
        // half).
        let buffer = r.get_ref().receive_buffer();
        let room = buffer - buffer / 4;
        loop {
            // This worker serves `first` (large, so counted): others are
            // more than one.
            if need > room || !serving.others() || since.elapsed() >= RUN_WAIT {
                return Run::Missing { need };
            }
            r.get_ref().wait_for_bytes(need, RUN_WAIT_STEP);
            match self.placeable(export, r, first, 0) {
                Run::Missing { need: n } => need = n,
                run => return run,
            }
        }
    }

    /// Whether a write's payload may be received straight into the device:
    /// large, valid, and allowed. Invalid requests are left to the ordinary
    /// path, which answers them.
    fn may_place(&self, export: &Export, r: &Request) -> bool {
        self.enabled
            && r.len as usize >= LARGE_REPLY
            && !export.read_only
            && r.flags & !CMD_FLAG_FUA == 0
            && r.offset
                .checked_add(r.len as u64)
                .is_some_and(|e| e <= export.device.len())
    }
}
