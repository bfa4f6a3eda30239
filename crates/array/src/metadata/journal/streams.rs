//! Streams of whole-stripe writes: intents logged ahead of them, and the
//! stripes whose data records keep a range from being logged ahead.

use super::{Journal, Slot};
use raidkit_member::Locked;
use std::collections::HashMap;

/// Intent records written ahead of a sequential stream of whole-stripe
/// writes, for stripes `lo..hi` (chunks of `chunk` bytes), one record with
/// sequence number `seq`. A write of whole
/// stripes inside the range relies on them instead of logging its own
/// intent and waiting for a flush (md's write-intent bitmap sets a bit
/// once for a region and flushes it once, for the same reason).
///
/// Sound while these hold, which `Journal::reuse` and
/// `Journal::logging_data` keep: the records are durable and not yet checkpointed (a held one
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
pub(super) struct Streams {
    ahead: Vec<Ahead>,
    /// Per stripe, the last record of its data. A stripe with one not yet checkpointed is not logged
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

impl Journal {
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

    /// A record of `stripe`'s data, sequence number `seq`, is about to be
    /// written (under the stripe's lock): no later write of the stripe may
    /// rely on an intent logged before it, and the stripe is not logged
    /// ahead again until the record is checkpointed. Called before any of
    /// the record is written, so that a record that lands on some members
    /// only (a failed write) has cut the range too.
    pub fn logging_data(&self, stripe: u64, seq: u64) {
        let mut streams = self.streams.locked();
        streams.data.insert(stripe, seq);
        for a in streams.ahead.iter_mut() {
            if a.lo <= stripe && stripe < a.hi {
                a.hi = stripe;
            }
        }
        streams.ahead.retain(|a| a.lo < a.hi);
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
}

#[cfg(test)]
mod tests {
    use super::super::HEADER;
    use super::*;

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
        j.logging_data(15, seq + 1);
        assert!(j.reuse(16, 17, 4096).is_none());
        let (h, upto) = j.reuse(12, 17, 4096).unwrap();
        assert_eq!(upto, 15);
        drop(h);
        // Such a stripe is not logged ahead until its record is checkpointed.
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
}
