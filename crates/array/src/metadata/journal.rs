//! The write journal: what closes the RAID-5/6 write hole.
//!
//! Every update of a parity stripe (new data pieces, new P and Q, over one
//! column window) is first written as one record to the journal areas of
//! `redundancy + 1` members and flushed there; only then are the blocks
//! written in place. After a crash, the records not yet known applied are
//! written in place again, in order, before the array serves: every stripe
//! is then consistent, whichever members are present, so a member lost at
//! the same time (or later) is rebuilt correctly. A torn record fails its
//! checksum and is ignored: its in-place writes had not started.
//!
//! A full-stripe update (every data chunk of a column window rewritten, all
//! members in service) logs only its *intent*: which window. It reads
//! nothing, so no data written before it is at stake, only the window it
//! rewrites (md's partial parity log reasons the same way); at replay its
//! parity is recomputed from the data in place, and earlier records'
//! blocks inside the window are not replayed over it. Data goes to the
//! members once, not three times.
//!
//! # Where it lives, and why
//!
//! In the members' own metadata areas (from the end of the bitmap, 64 KiB
//! aligned, to `data_offset`): no extra device to lose, and each record is
//! on `redundancy + 1` different members, so losing as many members as the
//! level survives still leaves a copy of every record. The area is used as
//! one log at the same offsets on every member: records are appended from
//! the start; when it is full, the writes in flight are let finish, every
//! member is flushed, the superblocks record `applied_seq` (every record up
//! to it is on the members in place) and the log starts again from the
//! beginning. Records from earlier rounds carry lower sequence numbers and
//! are ignored.
//!
//! # Record format (little-endian, 4 KiB aligned)
//!
//! ```text
//!   0 magic "RKJOURNL"   8 seq u64   16 array uuid [16]   32 stripe u64
//!  40 parts u32          44 payload bytes u32
//!  48 payload crc32c u32 52 header crc32c u32 (of the 4 KiB header, this field zero)
//!  56 flags u32 (1: intent)
//!  64 parts x 16 bytes: role u32, length u32, member data offset u64
//! 4096 payload: the parts' bytes in order, padded to 4 KiB
//! ```
//!
//! An intent record has one part, role 0xffffffff (every member of the
//! stripe), giving the window's member offset and length, and no payload.
//! The window may span consecutive stripes (a run of whole stripes, or the
//! stripes logged ahead of a sequential stream); the record's stripe is the
//! first. Replay takes it stripe by stripe, and skips the blocks of earlier
//! records inside it by member offset.

use crate::superblock::{get_u32, get_u64, put_u32, put_u64};
use raidkit_member::Locked;
use raidkit_member::{Member, MemberError};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use uuid::Uuid;

const MAGIC: [u8; 8] = *b"RKJOURNL";
pub const HEADER: usize = 4096;
const PART: usize = 16;
/// Most parts a record holds (a stripe's data pieces, P and Q).
pub const MAX_PARTS: usize = (HEADER - 64) / PART;
const FLAG_INTENT: u32 = 1;
const ALL_ROLES: u32 = u32::MAX;

/// One block to write in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub role: usize,
    /// Offset in the member's data area.
    pub dev: u64,
    pub data: Vec<u8>,
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub stripe: u64,
    pub parts: Vec<Part>,
    /// An intent record's window: member offset and length (no parts).
    pub intent: Option<(u64, u64)>,
}

/// Bytes a record of parts of these lengths takes in the log.
pub fn record_size(lens: impl Iterator<Item = usize>) -> u64 {
    (HEADER + lens.sum::<usize>().div_ceil(HEADER) * HEADER) as u64
}

/// Encode an intent record: the window `[dev, dev + len)` of `stripe` is
/// about to be rewritten whole.
pub fn encode_intent(uuid: Uuid, seq: u64, stripe: u64, dev: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; HEADER];
    b[0..8].copy_from_slice(&MAGIC);
    put_u64(&mut b, 8, seq);
    b[16..32].copy_from_slice(uuid.as_bytes());
    put_u64(&mut b, 32, stripe);
    put_u32(&mut b, 40, 1);
    put_u32(&mut b, 48, crate::checksums::crc32c(&[]));
    put_u32(&mut b, 56, FLAG_INTENT);
    put_u32(&mut b, 64, ALL_ROLES);
    put_u32(&mut b, 68, len as u32);
    put_u64(&mut b, 72, dev);
    let crc = header_crc(&b);
    put_u32(&mut b, 52, crc);
    b
}

/// Encode a record (header and padded payload).
pub fn encode(uuid: Uuid, seq: u64, stripe: u64, parts: &[(usize, u64, &[u8])]) -> Vec<u8> {
    assert!(parts.len() <= MAX_PARTS);
    let payload: usize = parts.iter().map(|p| p.2.len()).sum();
    let mut b = vec![0u8; record_size(parts.iter().map(|p| p.2.len())) as usize];
    b[0..8].copy_from_slice(&MAGIC);
    put_u64(&mut b, 8, seq);
    b[16..32].copy_from_slice(uuid.as_bytes());
    put_u64(&mut b, 32, stripe);
    put_u32(&mut b, 40, parts.len() as u32);
    put_u32(&mut b, 44, payload as u32);
    let mut at = HEADER;
    for (i, &(role, dev, data)) in parts.iter().enumerate() {
        let h = 64 + i * PART;
        put_u32(&mut b, h, role as u32);
        put_u32(&mut b, h + 4, data.len() as u32);
        put_u64(&mut b, h + 8, dev);
        b[at..at + data.len()].copy_from_slice(data);
        at += data.len();
    }
    let body_crc = crate::checksums::crc32c(&b[HEADER..HEADER + payload]);
    put_u32(&mut b, 48, body_crc);
    let crc = header_crc(&b[..HEADER]);
    put_u32(&mut b, 52, crc);
    b
}

fn header_crc(h: &[u8]) -> u32 {
    crate::checksums::crc32c_of(&[&h[..52], &[0; 4], &h[56..HEADER]])
}

/// If a valid header of this array starts `log[at..]`, the record's total
/// size; the payload is checked by [`decode`].
fn header_at(log: &[u8], at: usize, uuid: Uuid) -> Option<(u64, usize, usize)> {
    let h = log.get(at..at + HEADER)?;
    if h[0..8] != MAGIC || get_u32(h, 52) != header_crc(h) || h[16..32] != *uuid.as_bytes() {
        return None;
    }
    let parts = get_u32(h, 40) as usize;
    let payload = get_u32(h, 44) as usize;
    if parts > MAX_PARTS {
        return None;
    }
    Some((get_u64(h, 8), parts, payload))
}

/// Decode the record at `log[at..]`, if it is whole and of this array.
pub fn decode(log: &[u8], at: usize, uuid: Uuid) -> Option<(Record, usize)> {
    let (seq, nparts, payload) = header_at(log, at, uuid)?;
    let h = &log[at..at + HEADER];
    let body = log.get(at + HEADER..at + HEADER + payload)?;
    if crate::checksums::crc32c(body) != get_u32(h, 48) {
        return None;
    }
    match get_u32(h, 56) {
        0 => {}
        FLAG_INTENT => {
            if nparts != 1 || payload != 0 || get_u32(h, 64) != ALL_ROLES {
                return None;
            }
            let window = (get_u64(h, 72), get_u32(h, 68) as u64);
            return Some((
                Record {
                    seq,
                    stripe: get_u64(h, 32),
                    parts: Vec::new(),
                    intent: Some(window),
                },
                HEADER,
            ));
        }
        _ => return None,
    }
    let mut parts = Vec::with_capacity(nparts);
    let mut off = 0usize;
    for i in 0..nparts {
        let p = 64 + i * PART;
        let len = get_u32(h, p + 4) as usize;
        let data = body.get(off..off + len)?.to_vec();
        off += len;
        parts.push(Part {
            role: get_u32(h, p) as usize,
            dev: get_u64(h, p + 8),
            data,
        });
    }
    if off != payload {
        return None;
    }
    let size = HEADER + payload.div_ceil(HEADER) * HEADER;
    Some((
        Record {
            seq,
            stripe: get_u64(h, 32),
            parts,
            intent: None,
        },
        size,
    ))
}

/// Every record of this array in a member's log with a sequence number
/// above `after`. Scans every 4 KiB position: a record whose write never
/// landed leaves a gap, and later records may still follow it.
pub fn scan(
    m: &dyn Member,
    offset: u64,
    size: u64,
    uuid: Uuid,
    after: u64,
) -> Result<Vec<Record>, MemberError> {
    let mut log = vec![0u8; size as usize];
    m.read_at(&mut log, offset)?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= log.len() {
        match decode(&log, at, uuid) {
            Some((r, len)) if r.seq > after => {
                out.push(r);
                at += len;
            }
            _ => at += HEADER,
        }
    }
    Ok(out)
}

/// The log is reused a quarter at a time: before records go into a
/// quarter, the records of the previous round there must be applied in
/// place, durably, and the superblocks must say so (a checkpoint).
const SEGMENTS: usize = 4;

#[derive(Debug, Default)]
struct LogState {
    /// Next free byte of the log.
    pos: u64,
    /// Last sequence number handed out.
    seq: u64,
    /// Records handed out whose in-place writes have not finished, with
    /// how many writers hold each (an intent written ahead of a stream is
    /// held again by every write that relies on it).
    inflight: std::collections::BTreeMap<u64, u32>,
    /// Every record up to this one is in place, durably, and recorded so.
    applied: u64,
    /// A checkpoint is being made (by a writer, outside the lock).
    checkpointing: bool,
    /// Threads waiting on `Journal::idle`: a record that ends wakes them
    /// only if there are any (a condition variable's wake is a system call
    /// even when nobody waits, once per record otherwise).
    waiting: usize,
    /// The quarter the last record went into.
    segment: usize,
    /// Per quarter, the highest sequence number of a record in it.
    last: [u64; SEGMENTS],
    /// Per quarter, what `last` was when this round entered it: the
    /// records a checkpoint must cover before it is written over.
    old: [u64; SEGMENTS],
}

/// The running log: space and sequence numbers for records.
#[derive(Debug)]
pub struct Journal {
    pub offset: u64,
    pub size: u64,
    /// Largest column window a record may cover.
    pub window: u64,
    state: Mutex<LogState>,
    idle: Condvar,
    commits: Mutex<Commits>,
    streams: Mutex<Streams>,
}

/// Intent records written ahead of a sequential stream of whole-stripe
/// writes, for stripes `lo..hi` (chunks of `chunk` bytes), one record with
/// sequence number `seq`. A write of whole
/// stripes inside the range relies on them instead of logging its own
/// intent and waiting for a flush (md's write-intent bitmap sets a bit
/// once for a region and flushes it once, for the same reason).
///
/// Sound while these hold, which `Journal::reuse` and `Journal::spoil`
/// keep: the records are durable and not yet checkpointed (a held one
/// keeps every checkpoint below it); no record of a stripe's data came
/// after its intent (replay writes a record's data over the in-place
/// blocks unless a later intent covers them, so such a record would undo
/// a later whole-stripe write); and no record of the range was in flight
/// when they were written (the writer held the stripes' locks).
#[derive(Debug, Clone, Copy)]
struct Ahead {
    lo: u64,
    hi: u64,
    seq: u64,
    chunk: u64,
}

/// Streams of whole-stripe writes: the ranges logged ahead of them, and
/// where the last runs ended (a run starting there continues a stream).
#[derive(Debug, Default)]
struct Streams {
    ahead: Vec<Ahead>,
    /// Per stripe, the last record of its data (u64::MAX while it is being
    /// written). A stripe with one not yet checkpointed is not logged
    /// ahead: its in-place blocks may not be durable yet, and replay would
    /// skip that record inside the range's window, leaving nothing to
    /// rebuild its other blocks from when a member is missing too.
    data: HashMap<u64, u64>,
    prune_at: usize,
    ends: [u64; STREAM_ENDS],
    next_end: usize,
}

/// Streams followed at once.
const STREAMS: usize = 8;
const STREAM_ENDS: usize = 8;
/// Stripes with data records remembered before the first pruning.
const PRUNE_AT: usize = 4096;

/// A record (or several, contiguous in the log) waiting to be made durable.
#[derive(Debug)]
pub struct Pending {
    ticket: u64,
    /// Offset in the log.
    pub at: u64,
    pub rec: Vec<u8>,
    /// The stripe it belongs to, and its array data offset (for errors).
    pub stripe: u64,
    pub dev: u64,
    /// The writer waiting for it.
    waiter: std::thread::Thread,
}

/// Group commit: records queued by concurrent writers, written by whichever
/// of them finds no write in progress, all at once.
#[derive(Debug, Default)]
struct Commits {
    queue: Vec<Pending>,
    /// A group commit is being written.
    leading: bool,
    next: u64,
    /// Outcomes of tickets written and not yet picked up by their writers.
    done: HashMap<u64, Result<(), String>>,
}

/// The writer leading a group commit: publishes the outcome to every writer
/// of its batch and steps down, also when the write panics (the others
/// would wait for ever).
struct Lead<'a> {
    journal: &'a Journal,
    tickets: Vec<u64>,
    waiters: Vec<std::thread::Thread>,
    outcome: Option<Result<(), String>>,
}

impl Drop for Lead<'_> {
    /// Only the writers of the batch are woken, and the first writer
    /// queued since, to lead the next one: a wake-up of every waiting
    /// writer at each commit cost several context switches per request
    /// (each went back to sleep until its own batch was written).
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err("the journal write did not finish".into()));
        let mut c = self.journal.commits.locked();
        for t in &self.tickets {
            c.done.insert(*t, outcome.clone());
        }
        c.leading = false;
        let next = c.queue.first().map(|p| p.waiter.clone());
        drop(c);
        self.waiters.iter().chain(&next).for_each(|t| t.unpark());
    }
}

/// A place in the log for one record, held until its in-place writes are done.
#[derive(Debug)]
pub struct Slot<'a> {
    journal: &'a Journal,
    pub seq: u64,
    pub at: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut st = self.journal.state.locked();
        if let std::collections::btree_map::Entry::Occupied(mut e) = st.inflight.entry(self.seq) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        if st.waiting > 0 {
            self.journal.idle.notify_all();
        }
    }
}

impl Journal {
    pub fn new(offset: u64, size: u64, members: usize, last_seq: u64) -> Journal {
        Journal {
            offset,
            size,
            window: window_for(size, members),
            state: Mutex::new(LogState {
                seq: last_seq,
                applied: last_seq,
                ..LogState::default()
            }),
            idle: Condvar::new(),
            commits: Mutex::new(Commits::default()),
            streams: Mutex::new(Streams::default()),
        }
    }

    /// A write of the whole stripes `s0..s1` (chunks of `chunk` bytes)
    /// whose first stripes are covered by intents logged ahead of its
    /// stream: the slot of the first of those records, held until the
    /// stripes are written, which keeps every checkpoint below them, and
    /// the end of the stripes covered (at most `s1`). None: no such
    /// records, or they are checkpointed, being checkpointed, or a writer
    /// waits for a checkpoint (which a held record would keep waiting);
    /// the caller logs its own intents. The caller holds the stripes' locks.
    pub fn reuse(&self, s0: u64, s1: u64, chunk: u64) -> Option<(Slot<'_>, u64)> {
        let mut streams = self.streams.locked();
        let i = streams
            .ahead
            .iter()
            .position(|a| a.chunk == chunk && a.lo <= s0 && s0 < a.hi)?;
        let a = streams.ahead[i];
        let seq = a.seq;
        let mut st = self.state.locked();
        if seq <= st.applied || st.checkpointing || st.waiting > 0 {
            streams.ahead.swap_remove(i);
            return None;
        }
        *st.inflight.entry(seq).or_insert(0) += 1;
        let slot = Slot {
            journal: self,
            seq,
            at: 0,
        };
        Some((slot, s1.min(a.hi)))
    }

    /// Whether a run of whole stripes starting at `s0` continues a stream
    /// (starts where a run ended, or inside a range logged ahead) and is
    /// not one written at the same time as a later one that logged ahead
    /// (a range logged ahead starts within `reach` after it); notes where
    /// this one ends, `s1`.
    pub fn streaming(&self, s0: u64, s1: u64, reach: u64) -> bool {
        let mut streams = self.streams.locked();
        let len = s1 - s0;
        let continues = streams
            .ends
            .iter()
            .any(|&e| e > 0 && e <= s0 && s0 <= e + len)
            || streams.ahead.iter().any(|a| a.lo <= s0 && s0 <= a.hi);
        let behind = streams
            .ahead
            .iter()
            .any(|a| s1 <= a.lo && a.lo <= s1 + reach);
        let n = streams.next_end;
        streams.ends[n] = s1;
        streams.next_end = (n + 1) % STREAM_ENDS;
        continues && !behind
    }

    /// The record of `stripe`'s data, announced by `spoil`, has sequence
    /// number `seq`.
    pub fn logged_data(&self, stripe: u64, seq: u64) {
        let mut streams = self.streams.locked();
        streams.data.insert(stripe, seq);
        // Kept to the records not yet checkpointed (a few thousand at most),
        // pruned when it has doubled since the last time.
        if streams.data.len() > streams.prune_at {
            let applied = self.state.locked().applied;
            streams.data.retain(|_, &mut q| q > applied);
            streams.prune_at = (2 * streams.data.len()).max(PRUNE_AT);
        }
    }

    /// Whether `stripe` may be logged ahead: no record of its data is
    /// being written or waits for a checkpoint.
    pub fn settled(&self, stripe: u64) -> bool {
        let streams = self.streams.locked();
        let applied = self.state.locked().applied;
        streams.data.get(&stripe).is_none_or(|&q| q <= applied)
    }

    /// Intents for stripes `lo..hi` were made durable, the first with
    /// sequence number `seq`, while the writer held those stripes' locks.
    pub fn logged_ahead(&self, lo: u64, hi: u64, seq: u64, chunk: u64) {
        let mut streams = self.streams.locked();
        streams.ahead.retain(|a| a.hi <= lo || hi <= a.lo);
        if streams.ahead.len() >= STREAMS {
            streams.ahead.remove(0);
        }
        streams.ahead.push(Ahead { lo, hi, seq, chunk });
    }

    /// A record of `stripe`'s data is being logged (under its lock): no
    /// later write of the stripe may rely on an intent logged before it.
    pub fn spoil(&self, stripe: u64) {
        let mut streams = self.streams.locked();
        streams.data.insert(stripe, u64::MAX);
        if streams.ahead.is_empty() {
            return;
        }
        for a in streams.ahead.iter_mut() {
            if a.lo <= stripe && stripe < a.hi {
                a.hi = stripe;
            }
        }
        streams.ahead.retain(|a| a.lo < a.hi);
    }

    /// Make `rec` (at `at` in the log) durable, together with the records
    /// other writers queue meanwhile: on a disk each durable write is a
    /// cache flush or a FUA, which costs the same for one record as for
    /// thirty, so concurrent updates share one (group commit, as a file
    /// system's journal does). The first writer to find no write in
    /// progress takes every record queued and hands them to `write`; the
    /// others wait for its outcome.
    pub fn commit(
        &self,
        at: u64,
        stripe: u64,
        dev: u64,
        rec: Vec<u8>,
        write: impl FnOnce(&mut Vec<Pending>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut c = self.commits.locked();
        let ticket = c.next;
        c.next += 1;
        c.queue.push(Pending {
            ticket,
            at,
            rec,
            stripe,
            dev,
            waiter: std::thread::current(),
        });
        let mut write = Some(write);
        loop {
            if let Some(outcome) = c.done.remove(&ticket) {
                return outcome;
            }
            if !c.leading {
                // No write in progress, so ours is still queued (a leader
                // publishes every outcome before it steps down).
                c.leading = true;
                let mut batch = std::mem::take(&mut c.queue);
                drop(c);
                let me = std::thread::current().id();
                let mut lead = Lead {
                    journal: self,
                    tickets: batch.iter().map(|p| p.ticket).collect(),
                    waiters: batch
                        .iter()
                        .filter(|p| p.waiter.id() != me)
                        .map(|p| p.waiter.clone())
                        .collect(),
                    outcome: None,
                };
                let write = write.take().expect("a writer leads once");
                lead.outcome = Some(write(&mut batch));
                drop(lead);
                c = self.commits.locked();
                continue;
            }
            // Woken by the leader of the batch that holds our record, or
            // to lead the next one; a spurious wake-up goes round again.
            drop(c);
            std::thread::park();
            c = self.commits.locked();
        }
    }

    /// The last sequence number handed out.
    pub fn last_seq(&self) -> u64 {
        self.state.locked().seq
    }

    /// Room for a record of `len` bytes. When the log is full,
    /// `checkpoint(seq)` runs first, with no record in flight: it must make
    /// every record up to `seq` durable in place and record that.
    pub fn reserve<E>(
        &self,
        len: u64,
        checkpoint: impl FnMut(u64) -> Result<(), E>,
    ) -> Result<Slot<'_>, E> {
        Ok(self
            .take(1, len, true, checkpoint)?
            .expect("a reservation that waits")
            .pop()
            .expect("one slot"))
    }

    /// `count` slots of `len` bytes each, one after the other, all at once:
    /// for a caller that holds them together (reserving them one by one
    /// could wait for itself, when the log wraps). None: they would not fit
    /// in the log at all, or, without `wait` (for a caller that already
    /// holds a slot), they could not be had without waiting for a
    /// checkpoint (which would wait for the caller's own slot); nothing is
    /// reserved then.
    pub fn reserve_many<E>(
        &self,
        count: usize,
        len: u64,
        wait: bool,
        checkpoint: impl FnMut(u64) -> Result<(), E>,
    ) -> Result<Option<Vec<Slot<'_>>>, E> {
        if len * count as u64 > self.size {
            return Ok(None);
        }
        self.take(count, len, wait, checkpoint)
    }

    /// `count` slots of `len` bytes; without `wait`, None where a
    /// checkpoint that cannot be made at once stands in the way.
    fn take<E>(
        &self,
        count: usize,
        len: u64,
        wait: bool,
        mut checkpoint: impl FnMut(u64) -> Result<(), E>,
    ) -> Result<Option<Vec<Slot<'_>>>, E> {
        let total = len * count as u64;
        let quarter = (self.size / SEGMENTS as u64).max(1);
        let seg = |at: u64| ((at / quarter) as usize).min(SEGMENTS - 1);
        let mut st = self.state.locked();
        let mut at = st.pos;
        let wrapped = at + total > self.size;
        if wrapped {
            at = 0;
        }
        // The quarters the new records go into that this round has not
        // entered yet: their old records must be checkpointed first.
        let new_segments: Vec<usize> = (seg(at)..=seg(at + total - 1))
            .filter(|&t| wrapped || t != st.segment)
            .collect();
        let need = new_segments.iter().map(|&t| st.last[t]).max().unwrap_or(0);
        while st.applied < need {
            st = self.make_checkpoint(st, need, wait, &mut checkpoint)?;
            if !wait && st.applied < need {
                return Ok(None);
            }
        }
        for &t in &new_segments {
            st.old[t] = st.last[t];
            st.last[t] = 0;
        }
        let mut slots = Vec::with_capacity(count);
        for _ in 0..count {
            st.seq += 1;
            let seq = st.seq;
            st.inflight.insert(seq, 1);
            slots.push(Slot {
                journal: self,
                seq: st.seq,
                at,
            });
            let end_seg = seg(at + len - 1);
            for t in seg(at)..=end_seg {
                st.last[t] = st.seq;
            }
            at += len;
        }
        st.pos = at;
        st.segment = seg(at.saturating_sub(1));
        // Entering a quarter: checkpoint the next one's old records now,
        // while the writers fill this one, so that none waits for it when
        // the log gets there. Its records are a round old and normally
        // done; if not, the writer that needs the quarter waits for them.
        if !new_segments.is_empty() {
            let next = (seg(at.saturating_sub(1)) + 1) % SEGMENTS;
            let ahead = st.last[next];
            if st.applied < ahead {
                // A failure here is met again, and returned, by the writer
                // that needs the quarter.
                drop(self.make_checkpoint(st, ahead, false, &mut checkpoint));
            }
        }
        Ok(Some(slots))
    }

    /// Make (or wait for another writer's) checkpoint of every record up
    /// to at least `need`: once no record up to it is in flight, as many
    /// as are done, outside the lock. Without `wait`, only if that can be
    /// done at once.
    fn make_checkpoint<'g, E>(
        &'g self,
        mut st: std::sync::MutexGuard<'g, LogState>,
        need: u64,
        wait: bool,
        checkpoint: &mut impl FnMut(u64) -> Result<(), E>,
    ) -> Result<std::sync::MutexGuard<'g, LogState>, E> {
        while st.checkpointing
            || st
                .inflight
                .first_key_value()
                .is_some_and(|(&s, _)| s <= need)
        {
            if !wait {
                return Ok(st);
            }
            st.waiting += 1;
            st = self
                .idle
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.waiting -= 1;
            if st.applied >= need {
                return Ok(st);
            }
        }
        let upto = st
            .inflight
            .first_key_value()
            .map_or(st.seq, |(&s, _)| s - 1);
        st.checkpointing = true;
        drop(st);
        let done = checkpoint(upto);
        let mut st = self.state.locked();
        st.checkpointing = false;
        if done.is_ok() {
            st.applied = st.applied.max(upto);
        }
        self.idle.notify_all();
        done.map(|()| st)
    }

    /// Continue numbering after `seq` (records found at replay).
    pub fn advance_to(&self, seq: u64) {
        let mut st = self.state.locked();
        st.seq = st.seq.max(seq);
    }

    /// Wait until no record is in flight (for a final checkpoint).
    pub fn quiesce(&self) -> u64 {
        let mut st = self.state.locked();
        while !st.inflight.is_empty() || st.checkpointing {
            st.waiting += 1;
            st = self
                .idle
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.waiting -= 1;
        }
        st.seq
    }
}

/// The widest column window whose record fits a quarter of the log.
pub fn window_for(size: u64, members: usize) -> u64 {
    let w = (size / 4).saturating_sub(HEADER as u64) / members.max(1) as u64;
    (w / 4096 * 4096).min(128 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_member::MemMember;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let u = Uuid::from_u128(7);
        let a = vec![1u8; 5000];
        let b = vec![2u8; 4096];
        let rec = encode(u, 9, 3, &[(0, 8192, &a), (2, 8192, &b)]);
        assert_eq!(rec.len(), 4096 + 12288);
        let (r, size) = decode(&rec, 0, u).unwrap();
        assert_eq!(size, rec.len());
        assert_eq!((r.seq, r.stripe, r.parts.len()), (9, 3, 2));
        assert_eq!(r.parts[0].data, a);
        assert_eq!(r.parts[1].role, 2);
        assert!(decode(&rec, 0, Uuid::from_u128(8)).is_none(), "other array");
        for byte in [3usize, 45, 70, 4100, 9000] {
            let mut bad = rec.clone();
            bad[byte] ^= 0x40;
            assert!(decode(&bad, 0, u).is_none(), "byte {byte}");
        }
    }

    #[test]
    fn intents_logged_ahead_are_relied_on_only_while_sound() {
        let j = Journal::new(0, 1 << 20, 4, 0);
        let ok = |_| Ok::<(), ()>(());
        // Nothing logged ahead: nothing to rely on.
        assert!(j.reuse(10, 12, 4096).is_none());
        let s = j.reserve(HEADER as u64, ok).unwrap();
        let seq = s.seq;
        drop(s);
        j.logged_ahead(10, 20, seq, 4096);
        // Inside the range (the end clipped to it); another chunk or a
        // range starting outside it: no.
        let (held, upto) = j.reuse(18, 24, 4096).unwrap();
        assert_eq!((held.seq, upto), (seq, 20));
        assert!(j.reuse(8, 12, 4096).is_none());
        assert!(j.reuse(12, 14, 8192).is_none());
        // While held, a checkpoint does not cover the record.
        let mut covered = 0;
        let later = j.reserve(HEADER as u64, ok).unwrap();
        drop(later);
        let st = j.state.locked();
        let st = j
            .make_checkpoint(st, seq, false, &mut |upto| {
                covered = upto;
                Ok::<(), ()>(())
            })
            .unwrap();
        drop(st);
        assert_eq!(covered, 0, "a held record was checkpointed");
        drop(held);
        // A record of a stripe's data cuts the range there.
        j.spoil(15);
        assert!(j.reuse(16, 17, 4096).is_none());
        let (h, upto) = j.reuse(12, 17, 4096).unwrap();
        assert_eq!(upto, 15);
        drop(h);
        // Such a stripe is not logged ahead until its record is checkpointed.
        assert!(!j.settled(15));
        j.logged_data(15, seq + 1);
        assert!(!j.settled(15));
        assert!(j.settled(16));
        // Checkpointed: the range is gone, the stripe settled.
        let st = j.state.locked();
        drop(
            j.make_checkpoint(st, seq + 1, true, &mut |_| Ok::<(), ()>(()))
                .unwrap(),
        );
        assert!(j.reuse(12, 13, 4096).is_none());
        assert!(j.settled(15));
    }

    #[test]
    fn intent_records_round_trip_and_damage_is_detected() {
        let u = Uuid::from_u128(7);
        let rec = encode_intent(u, 12, 40, 40 * 65536 + 8192, 16384);
        assert_eq!(rec.len(), HEADER);
        let (r, size) = decode(&rec, 0, u).unwrap();
        assert_eq!(size, HEADER);
        assert_eq!((r.seq, r.stripe), (12, 40));
        assert!(r.parts.is_empty());
        assert_eq!(r.intent, Some((40 * 65536 + 8192, 16384)));
        for byte in [9usize, 57, 66, 73] {
            let mut bad = rec.clone();
            bad[byte] ^= 0x40;
            assert!(decode(&bad, 0, u).is_none(), "byte {byte}");
        }
        // An ordinary record says it is not an intent.
        let d = encode(u, 13, 40, &[(0, 0, &[1; 512])]);
        assert_eq!(decode(&d, 0, u).unwrap().0.intent, None);
    }

    #[test]
    fn scan_skips_gaps_and_old_rounds() {
        let u = Uuid::from_u128(7);
        let m = MemMember::new("m", 1 << 20);
        let off = 64 << 10;
        let r1 = encode(u, 5, 0, &[(0, 0, &[1; 4096])]);
        let r2 = encode(u, 7, 1, &[(1, 0, &[2; 4096])]);
        let old = encode(u, 2, 1, &[(1, 0, &[3; 4096])]);
        m.write_at(&r1, off).unwrap();
        // A gap (a record that never landed), then r2, then an old round's record.
        m.write_at(&r2, off + 3 * 8192).unwrap();
        m.write_at(&old, off + 6 * 8192).unwrap();
        let found = scan(&m, off, 256 << 10, u, 3).unwrap();
        assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5, 7]);
    }

    #[test]
    fn a_full_log_checkpoints_with_nothing_in_flight() {
        let j = Journal::new(0, 64 << 10, 4, 10);
        let a = j.reserve(32 << 10, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!((a.seq, a.at), (11, 0));
        // `a` in flight: no checkpoint of it ahead.
        let b = j.reserve(32 << 10, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(b.at, 32 << 10);
        drop(a);
        drop(b);
        let mut cp = None;
        let c = j
            .reserve(8 << 10, |seq| {
                cp = Some(seq);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(cp, Some(12));
        assert_eq!((c.seq, c.at), (13, 0));
    }

    #[test]
    fn a_writer_waiting_for_a_record_in_flight_is_woken_when_it_ends() {
        // The log is full and its first record is still in flight: the
        // next writer's checkpoint must wait for it, and its end must
        // wake that writer (records end without a wake-up when nobody
        // waits).
        let j = std::sync::Arc::new(Journal::new(0, 64 << 10, 4, 10));
        let a = j.reserve(32 << 10, |_| Ok::<(), ()>(())).unwrap();
        drop(j.reserve(32 << 10, |_| Ok::<(), ()>(())).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let j2 = j.clone();
        std::thread::spawn(move || {
            let s = j2.reserve(8 << 10, |_| Ok::<(), ()>(())).unwrap();
            let _ = tx.send((s.seq, s.at));
        });
        let wait = std::time::Duration::from_millis(300);
        assert!(
            rx.recv_timeout(wait).is_err(),
            "did not wait for the record"
        );
        drop(a);
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the waiting writer was never woken");
        assert_eq!(got, (13, 0));
    }

    #[test]
    fn the_next_quarter_is_checkpointed_ahead() {
        // Quarters of 16 KiB, one record each.
        let j = Journal::new(0, 64 << 10, 4, 10);
        let mut cps = Vec::new();
        let mut held = Vec::new();
        for (seq, at) in [(11, 0), (12, 16 << 10), (13, 32 << 10)] {
            let s = j
                .reserve(16 << 10, |x| {
                    cps.push(x);
                    Ok::<(), ()>(())
                })
                .unwrap();
            assert_eq!((s.seq, s.at), (seq, at));
            held.push(s);
        }
        held.clear();
        assert!(cps.is_empty(), "nothing to checkpoint yet: {cps:?}");
        // Entering the last quarter checkpoints the first one's records
        // (the log comes back to it next), but not the record in flight.
        let d = j
            .reserve(16 << 10, |x| {
                cps.push(x);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(cps, vec![13]);
        drop(d);
        // The wrap needs no checkpoint of its own.
        let e = j
            .reserve(16 << 10, |x| {
                cps.push(x);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!((e.seq, e.at), (15, 0));
        assert_eq!(cps, vec![13]);
        // The second quarter: the third's old record (13) is covered.
        drop(e);
        let f = j
            .reserve(16 << 10, |x| {
                cps.push(x);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(f.at, 16 << 10);
        assert_eq!(cps, vec![13]);
        // The third: the fourth's (14) is not, and is checkpointed ahead,
        // up to the last record done (16), not the one in flight (17).
        drop(f);
        let g = j
            .reserve(16 << 10, |x| {
                cps.push(x);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!((g.seq, g.at), (17, 32 << 10));
        assert_eq!(cps, vec![13, 16]);
    }

    /// Runs `f` on its own thread; panics if it has not returned within
    /// a minute (a writer never woken would wait for ever).
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("a writer was never woken")
    }

    #[test]
    fn group_commit_writes_every_record_once_and_wakes_every_writer() {
        use std::sync::Arc;
        let j = Arc::new(Journal::new(0, 64 << 20, 4, 0));
        let written = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let (threads, each) = (16u64, 40u64);
        let (j2, w2, b2) = (j.clone(), written.clone(), batches.clone());
        let outcomes = within_a_minute(move || {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (j, w, b) = (j2.clone(), w2.clone(), b2.clone());
                    std::thread::spawn(move || {
                        (0..each)
                            .map(|i| {
                                let at = (t * each + i) * 4096;
                                j.commit(at, 0, 0, vec![t as u8; 16], |batch| {
                                    // A write that takes a while, as a
                                    // durable one does: others queue meanwhile.
                                    std::thread::sleep(std::time::Duration::from_micros(300));
                                    w.lock().unwrap().extend(batch.iter().map(|p| p.at));
                                    b.lock().unwrap().push(batch.len());
                                    Ok(())
                                })
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(outcomes.len() as u64, threads * each);
        assert!(outcomes.iter().all(|o| o.is_ok()));
        let mut w = written.lock().unwrap().clone();
        w.sort_unstable();
        let want: Vec<u64> = (0..threads * each).map(|x| x * 4096).collect();
        assert_eq!(w, want, "every record written, once");
        let b = batches.lock().unwrap();
        assert!(
            b.iter().any(|&n| n > 1),
            "concurrent records share a write: {b:?}"
        );
    }

    #[test]
    fn a_commit_that_panics_fails_its_batch_and_the_next_goes_on() {
        use std::sync::Arc;
        let j = Arc::new(Journal::new(0, 64 << 20, 4, 0));
        let outcomes = within_a_minute(move || {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            // The first writer leads and holds its write until the others
            // have queued behind it.
            let first = {
                let j = j.clone();
                std::thread::spawn(move || {
                    j.commit(0, 0, 0, vec![0; 16], move |_| {
                        wait.recv().unwrap();
                        Ok(())
                    })
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(50));
            let others: Vec<_> = (1..4u64)
                .map(|i| {
                    let j = j.clone();
                    std::thread::spawn(move || {
                        j.commit(i * 4096, 0, 0, vec![0; 16], |_| -> Result<(), String> {
                            panic!("the write of batch two panics")
                        })
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(200));
            go.send(()).unwrap();
            let first = first.join().unwrap();
            let others: Vec<_> = others.into_iter().map(|h| h.join()).collect();
            // Afterwards the journal still commits.
            let after = j.commit(1 << 20, 0, 0, vec![0; 16], |_| Ok(()));
            (first, others, after)
        });
        let (first, others, after) = outcomes;
        assert_eq!(first, Ok(()));
        // Each of the others either led a write that panicked, or was in
        // such a batch and is told its record was not written.
        for o in &others {
            match o {
                Err(_) => {}
                Ok(r) => assert!(r.is_err(), "a record of a panicked write reported written"),
            }
        }
        assert!(
            others.iter().any(|o| o.is_err()),
            "some writer led and panicked"
        );
        assert_eq!(after, Ok(()));
    }
}
