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
use std::sync::{Condvar, Mutex};
use uuid::Uuid;

mod commit;
mod streams;

use commit::Commits;
pub use commit::Pending;
use streams::Streams;

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
        // Where the records go, worked out again after every wait for a
        // checkpoint: the lock is let go meanwhile, and other writers take
        // the space (a place worked out before would be handed out twice,
        // and the log's position moved back over records not yet
        // checkpointed, which replay then finds overwritten).
        let (mut at, new_segments) = loop {
            let mut at = st.pos;
            let wrapped = at + total > self.size;
            if wrapped {
                at = 0;
            }
            // The quarters the new records go into that this round has
            // not entered yet: their old records must be checkpointed
            // first.
            let new_segments: Vec<usize> = (seg(at)..=seg(at + total - 1))
                .filter(|&t| wrapped || t != st.segment)
                .collect();
            let need = new_segments.iter().map(|&t| st.last[t]).max().unwrap_or(0);
            if st.applied >= need {
                break (at, new_segments);
            }
            st = self.make_checkpoint(st, need, wait, &mut checkpoint)?;
            if !wait && st.applied < need {
                return Ok(None);
            }
        };
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

    /// Checkpoint every record whose in-place writes are done (those
    /// below the first still in flight), if any is not yet known applied;
    /// never waits (another checkpoint under way, or nothing new: false).
    /// `checkpoint(seq)` as for `reserve`.
    pub fn checkpoint_done<E>(
        &self,
        mut checkpoint: impl FnMut(u64) -> Result<(), E>,
    ) -> Result<bool, E> {
        let st = self.state.locked();
        let upto = st
            .inflight
            .first_key_value()
            .map_or(st.seq, |(&s, _)| s - 1);
        if st.checkpointing || st.applied >= upto {
            return Ok(false);
        }
        let st = self.make_checkpoint(st, upto, false, &mut checkpoint)?;
        Ok(st.applied >= upto)
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

    /// Writers of mixed record sizes (intents, partial-stripe records of
    /// every window), holding slots a while as writers do: a slot is never
    /// handed out over a record the checkpoints have not covered (replay
    /// would lose it).
    #[test]
    fn no_slot_is_handed_out_over_a_record_not_yet_checkpointed() {
        use rand::{Rng, SeedableRng};
        let j = Journal::new(0, 851968, 4, 0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let applied = std::cell::Cell::new(0u64);
        let mut all: Vec<(u64, u64, u64)> = Vec::new();
        let mut held: std::collections::VecDeque<Slot<'_>> = Default::default();
        for _ in 0..6000 {
            let len = match rng.gen_range(0..4) {
                0 => 4096,
                1 => 4096 + 3 * 16384,
                2 => 4096 + 3 * 49152,
                _ => 4096 * rng.gen_range(1..8u64),
            };
            let count = rng.gen_range(1..3usize);
            let wait = held.is_empty();
            while held.len() > rng.gen_range(0..40) {
                held.pop_front();
            }
            let r = j.reserve_many(count, len, wait, |seq| {
                applied.set(applied.get().max(seq));
                Ok::<(), ()>(())
            });
            let Some(slots) = r.unwrap() else {
                held.clear();
                continue;
            };
            for sl in slots {
                for &(seq, at, l) in &all {
                    if seq > applied.get() && at < sl.at + len && sl.at < at + l {
                        panic!(
                            "slot {} at {}+{len} over record {seq} at {at}+{l}, applied {}",
                            sl.seq,
                            sl.at,
                            applied.get()
                        );
                    }
                }
                all.push((sl.seq, sl.at, len));
                held.push_back(sl);
            }
        }
    }

    /// Two writers reach the end of the log while the checkpoint the wrap
    /// needs is being made, outside the lock: each gets a place of its
    /// own. (The second once kept the place it had worked out before
    /// waiting, the first one's, and moved the log's position back over
    /// records not yet checkpointed: records were lost to replay.)
    #[test]
    fn writers_that_wait_for_a_checkpoint_get_places_of_their_own() {
        let j = Journal::new(0, 64 << 10, 4, 0);
        // One round of done records: the next one wraps, and the first
        // quarter's records must be checkpointed before it goes there (the
        // checkpoints tried ahead of time fail).
        for _ in 0..16 {
            drop(j.reserve(4096, |_| Err::<(), ()>(())).unwrap());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (a, b) = std::thread::scope(|sc| {
            let a = sc.spawn(|| {
                let s = j
                    .reserve(8192, |_| {
                        tx.send(()).ok();
                        std::thread::sleep(std::time::Duration::from_millis(200));
                        Ok::<(), ()>(())
                    })
                    .unwrap();
                s.at
            });
            // The first writer is inside the checkpoint, the lock let go.
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("the first writer makes a checkpoint");
            let b = sc.spawn(|| j.reserve(8192, |_| Ok::<(), ()>(())).unwrap().at);
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(a + 8192 <= b || b + 8192 <= a, "places {a} and {b} overlap");
    }
}
