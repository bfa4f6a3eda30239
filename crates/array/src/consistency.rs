//! Consistency across crashes: journaling parity updates, replaying the
//! journal after an unclean shutdown, or resyncing the regions the bitmap
//! marks (the whole array without one). See `journal.rs` for the log.

use crate::background::{windows, ParityResync, Plan, Process};
use crate::checksums::BLOCK;
use crate::core::{Core, Disk, View};
use crate::engine::Array;
use crate::engine::{in_parallel_on, journal_pool, Small};
use crate::error::{Error, Result};
use crate::journal::{self, Record, Slot};
use crate::levels::parity::DataFrom;
use raidkit_layout::{Level, Piece, StripeMap};
use raidkit_member::Locked;
use std::collections::BTreeMap;
use std::sync::Arc;

mod heal;

/// How far ahead of a stream of whole-stripe writes their intents are
/// logged: about this much data, at most `AHEAD_STRIPES` stripes. After a
/// crash, replay recomputes parity over as much (per stream followed).
const AHEAD_BYTES: u64 = 32 << 20;
const AHEAD_STRIPES: u64 = 256;

impl Array {
    /// Before the in-place writes of a stripe update: put the update in the
    /// journal (on `redundancy + 1` members) and make it durable there. The
    /// returned slot is held until the in-place writes are done.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn journal_update(
        &self,
        stripe: u64,
        sm: &StripeMap,
        pieces: &[(&Piece, &[u8])],
        dev: u64,
        p: &[u8],
        q: Option<&[u8]>,
    ) -> Result<Option<Slot<'_>>> {
        let mut parity = vec![(sm.p, p)];
        if let (Some(qr), Some(q)) = (sm.q, q) {
            parity.push((qr, q));
        }
        self.journal_parts(stripe, pieces, dev, &parity)
    }

    /// Log the data `pieces` of a stripe update and the `parity` blocks
    /// (role, bytes at `dev`) written with them, if any.
    pub(crate) fn journal_parts(
        &self,
        stripe: u64,
        pieces: &[(&Piece, &[u8])],
        dev: u64,
        parity: &[(usize, &[u8])],
    ) -> Result<Option<Slot<'_>>> {
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        let mut parts: Vec<(usize, u64, &[u8])> = pieces
            .iter()
            .map(|(pc, d)| (pc.copies[0].0, pc.copies[0].1, *d))
            .collect();
        parts.extend(parity.iter().map(|&(r, b)| (r, dev, b)));
        let size = journal::record_size(parts.iter().map(|x| x.2.len()));
        let slot = j.reserve(size, |seq| self.journal_checkpoint(seq))?;
        j.logging_data(stripe, slot.seq);
        let slot = self.journal_write(slot, stripe, dev, |uuid, seq| {
            journal::encode(uuid, seq, stripe, &parts)
        })?;
        Ok(Some(slot))
    }

    /// Before the in-place writes of a full-stripe update of the window
    /// `[dev, dev + len)`, chunks of `chunk` bytes: log the intent only
    /// (see `journal.rs`), unless one logged ahead of a stream covers the
    /// stripe. For an array with every member in service only.
    pub(crate) fn journal_intent(
        &self,
        stripe: u64,
        dev: u64,
        len: u64,
        chunk: u64,
    ) -> Result<Option<Slot<'_>>> {
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        if let Some((slot, _)) = j
            .reuse(stripe, stripe + 1, chunk)
            .filter(|_| !self.maybe_reshaping())
        {
            return Ok(Some(slot));
        }
        self.journal_put(j, stripe, dev, journal::HEADER as u64, |uuid, seq| {
            journal::encode_intent(uuid, seq, stripe, dev, len)
        })
        .map(Some)
    }

    /// Append a record of `size` bytes to the log on `redundancy + 1`
    /// members (spread by stripe) and make it durable there.
    fn journal_put<'a>(
        &'a self,
        j: &'a journal::Journal,
        stripe: u64,
        dev: u64,
        size: u64,
        encode: impl FnOnce(uuid::Uuid, u64) -> Vec<u8>,
    ) -> Result<Slot<'a>> {
        let slot = j.reserve(size, |seq| self.journal_checkpoint(seq))?;
        self.journal_write(slot, stripe, dev, encode)
    }

    /// Intent records for the whole stripes `s0..s1` of a geometry with
    /// `chunk`-byte chunks (during a change of chunk, the old geometry's
    /// above the reshape's checkpoint), written together for a caller that
    /// holds them all until the stripes are written. None: no journal.
    pub(crate) fn journal_intents(
        &self,
        s0: u64,
        s1: u64,
        chunk: u64,
    ) -> Result<Option<Vec<Slot<'_>>>> {
        if self.journal.is_none() {
            return Ok(None);
        }
        match self.journal_spans(&[(s0, s1)], chunk, true)? {
            Some(slots) => Ok(Some(slots)),
            None => Err(Error::Invalid(
                "too many intent records for the journal".into(),
            )),
        }
    }

    /// One intent record for each range of whole stripes, its window the
    /// range's chunks on every member (replay takes it stripe by stripe):
    /// one 4 KiB header per run rather than per stripe, so that the log
    /// fills, and is checkpointed (every member flushed), that much less
    /// often. A range wider than a record's window field takes a record
    /// per part. All are written in one durable write on each member (on a
    /// disk each durable write is a cache flush or a FUA). Slots in the
    /// order of `ranges`, the records' sequence numbers rising with them.
    /// Without `wait` (for a caller holding a slot already), None where
    /// the log would have to wait for a checkpoint first; nothing is
    /// written then. None also where the records would not fit in the log.
    fn journal_spans(
        &self,
        ranges: &[(u64, u64)],
        chunk: u64,
        wait: bool,
    ) -> Result<Option<Vec<Slot<'_>>>> {
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        let widest = (u64::from(u32::MAX) / chunk.max(1)).max(1);
        let parts: Vec<(u64, u64)> = ranges
            .iter()
            .flat_map(|&(a, b)| {
                (a..b)
                    .step_by(widest as usize)
                    .map(move |x| (x, b.min(x + widest)))
            })
            .collect();
        let Some(&(first, _)) = parts.first() else {
            return Ok(Some(Vec::new()));
        };
        let checkpoint = |seq| self.journal_checkpoint(seq);
        let header = journal::HEADER as u64;
        let Some(slots) = j.reserve_many(parts.len(), header, wait, checkpoint)? else {
            return Ok(None);
        };
        let uuid = self.core.meta.locked().sb.array_uuid;
        let mut recs = Vec::with_capacity(slots.len() * journal::HEADER);
        for (&(a, b), slot) in parts.iter().zip(&slots) {
            recs.extend_from_slice(&journal::encode_intent(
                uuid,
                slot.seq,
                a,
                a * chunk,
                (b - a) * chunk,
            ));
        }
        self.journal_store(first, first * chunk, slots[0].at, recs)?;
        Ok(Some(slots))
    }

    /// Intents for the whole stripes `s0..s1` (chunks of `chunk` bytes, the
    /// geometry's) before a caller that holds their locks writes them: those
    /// logged ahead of the stream if they cover them; else their own and,
    /// when the run continues a stream, those of the stripes after it, up
    /// to `AHEAD_BYTES` of data, in the same durable write. A sequential
    /// writer then waits for a flush once every few dozen MiB instead of
    /// once per run (on a disk each is a cache flush). The stripes ahead
    /// are locked while their intents are written, so that no update of
    /// theirs is in flight then, or only those whose locks are free.
    ///
    /// The cost: at replay, parity of those stripes is recomputed from
    /// their data, as for any intent, and with checksums their blocks'
    /// checksums are taken from the data in place, written or not.
    pub(crate) fn journal_stream(
        &self,
        v: &View,
        s0: u64,
        s1: u64,
    ) -> Result<Option<Vec<Slot<'_>>>> {
        let chunk = v.geom.chunk;
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        // Stripes covered by a range logged ahead, then the rest.
        let mut held = Vec::new();
        let first = s0;
        let mut s0 = s0;
        let reshaping = self.maybe_reshaping();
        if let Some((slot, upto)) = j.reuse(s0, s1, chunk).filter(|_| !reshaping) {
            held.push(slot);
            s0 = upto;
            if s0 == s1 {
                return Ok(Some(held));
            }
        }
        let stripe_bytes = chunk * v.geom.data_members() as u64;
        let want = (AHEAD_BYTES / stripe_bytes.max(1))
            .clamp(2, AHEAD_STRIPES)
            .min(j.size / journal::HEADER as u64 / 8)
            .min((j.size / journal::HEADER as u64).saturating_sub(s1 - s0) / 2)
            // One record: a range relied on is kept from a checkpoint by
            // holding its record, which would not keep an earlier one.
            .min(u64::from(u32::MAX) / chunk.max(1));
        // The stripes right after the run are often held by the stream's
        // next runs, written at the same time: the range starts after them,
        // and takes as many free stripes as follow. (A stripe's lock can
        // be taken at most once here: the span stays below the lock table.)
        let end = (s1 + 2 * want).min(v.geom.stripes());
        let mut locks = Vec::new();
        let mut lo = s1;
        if !reshaping && want > 0 && j.streaming(s0, s1, 2 * want) {
            for s in s1..end {
                match self.core.try_lock_range(s, s + 1).filter(|_| j.settled(s)) {
                    Some(mut g) => {
                        if locks.is_empty() {
                            lo = s;
                        }
                        locks.append(&mut g);
                        if locks.len() as u64 == want {
                            break;
                        }
                    }
                    None if locks.is_empty() => {}
                    None => break,
                }
            }
        }
        let hi = lo + locks.len() as u64;
        let ranges: Vec<(u64, u64)> = [(s0, s1), (lo, hi)]
            .into_iter()
            .filter(|r| r.1 > r.0)
            .collect();
        let mut slots = match self.journal_spans(&ranges, chunk, held.is_empty())? {
            Some(slots) => slots,
            // Holding records of the range logged ahead, this write cannot
            // wait for a checkpoint (it would wait for them): it logs all
            // its stripes itself, after letting them go.
            None => {
                drop(held);
                drop(locks);
                return self.journal_intents(first, s1, chunk);
            }
        };
        if hi > lo {
            let ahead = slots.pop().expect("the range's record");
            j.logged_ahead(lo, hi, ahead.seq, chunk);
            drop(ahead);
        }
        drop(locks);
        held.append(&mut slots);
        Ok(Some(held))
    }

    /// Whether parity can be recomputed from data everywhere: every
    /// member in service, or the members missing (or still being built)
    /// hold parity only in every row (a RAID-5 made RAID-6 whose Q member
    /// is being built, or a RAID-4's parity member), so no data of a
    /// stripe written at a crash has to be rebuilt from parity that may
    /// be torn. Not during a reshape (rows of two geometries).
    fn parity_recomputable(&self, v: &View) -> bool {
        let gone = v.degraded_roles();
        if gone.is_empty() {
            return true;
        }
        let g = &v.geom;
        if matches!(g.level, Level::Raid1 | Level::Raid10) {
            // No parity: the copies still in service are made to agree
            // with the first of them (what reads return meanwhile), and a
            // set down to one copy has nothing to agree with.
            return true;
        }
        if !g.level.is_parity() || self.maybe_reshaping() {
            return false;
        }
        // md's placements repeat every n rows (every n - 1 for the
        // layouts with Q on the last member): n rows hold every placement.
        let n = g.members() as u64;
        (0..n.min(g.stripes())).all(|s| g.stripe_map(s).data.iter().all(|d| !gone.contains(d)))
    }

    /// Whether a reshape may be under way: a stripe number then means a
    /// row of one geometry or the other, and intents logged ahead of a
    /// stream are neither written nor relied on.
    fn maybe_reshaping(&self) -> bool {
        self.reshape.try_read().map_or(true, |r| r.is_some())
    }

    /// Write a record into its reserved slot on `redundancy + 1` members
    /// (spread by stripe) and make it durable there.
    fn journal_write<'a>(
        &'a self,
        slot: Slot<'a>,
        stripe: u64,
        dev: u64,
        encode: impl FnOnce(uuid::Uuid, u64) -> Vec<u8>,
    ) -> Result<Slot<'a>> {
        let uuid = self.core.meta.locked().sb.array_uuid;
        let rec = encode(uuid, slot.seq);
        self.journal_store(stripe, dev, slot.at, rec)?;
        Ok(slot)
    }

    /// Write `rec` (one or more records, contiguous in the log) at `at` in
    /// the log, durably, sharing the write with the records concurrent
    /// updates commit meanwhile (see [`journal::Journal::commit`]).
    fn journal_store(&self, stripe: u64, dev: u64, at: u64, rec: Vec<u8>) -> Result<()> {
        let j = self.journal.as_ref().expect("journal");
        j.commit(at, stripe, dev, rec, |batch| {
            self.journal_store_batch(batch).map_err(|e| match e {
                Error::Unavailable { detail, .. } => detail,
                e => e.to_string(),
            })
        })
        .map_err(|detail| Error::Unavailable {
            offset: dev,
            detail,
        })
    }

    /// Write a batch of records on `redundancy + 1` members (spread by the
    /// first record's stripe; replay reads every member's log, so where a
    /// record lies is free), durably, each member's copy by itself
    /// (RWF_DSYNC; FUA with direct I/O), never by flushing a buffered
    /// member's data area: that would wait for every dirty page of it.
    fn journal_store_batch(&self, batch: &mut [journal::Pending]) -> Result<()> {
        let j = self.journal.as_ref().expect("journal");
        batch.sort_by_key(|p| p.at);
        // Records adjacent in the log become one write.
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for p in batch.iter_mut() {
            match runs.last_mut() {
                Some((at, bytes)) if *at + bytes.len() as u64 == p.at => {
                    bytes.extend_from_slice(&p.rec)
                }
                _ => runs.push((p.at, std::mem::take(&mut p.rec))),
            }
        }
        let (stripe, dev) = (batch[0].stripe, batch[0].dev);
        let v = self.core.view.load_full();
        let n = v.roles.len();
        let want = self.core.geom().redundancy() + 1;
        let targets: Small<&Arc<Disk>> = (0..n)
            .filter_map(|i| v.roles[(stripe as usize + i) % n].disk.as_ref())
            .take(want)
            .collect();
        let put = |d: &Arc<Disk>| {
            let m = &d.member;
            let done = self.core.timed(d, || match runs.as_slice() {
                [(at, bytes)] => m.write_at_durable(bytes, j.offset + at),
                // Several runs on a member without a page cache of its own:
                // a flush after them is one cache flush, as one FUA is.
                // Checksum pages stay behind: the records cover them.
                runs if !m.buffered() => {
                    for (at, bytes) in runs {
                        m.write_at(bytes, j.offset + at)?;
                    }
                    d.flush_device()
                }
                runs => runs
                    .iter()
                    .try_for_each(|(at, bytes)| m.write_at_durable(bytes, j.offset + at)),
            });
            match done {
                Ok(()) => 1,
                Err(e) => {
                    self.core
                        .fail_disk_by_ptr(d, &format!("writing the journal: {e}"));
                    0
                }
            }
        };
        let written = std::sync::atomic::AtomicUsize::new(0);
        if targets.len() > 1 && !Self::page_cache_only(&v) {
            // Disks: every copy at once, the records wait for the slowest
            // device rather than for the sum of them.
            let _ = in_parallel_on(journal_pool(), false, targets.iter(), |d| {
                written.fetch_add(put(d), std::sync::atomic::Ordering::Relaxed);
                Ok(())
            });
        } else {
            for d in &targets {
                written.fetch_add(put(d), std::sync::atomic::Ordering::Relaxed);
            }
        }
        let mut written = written.into_inner();
        // A copy that failed (its member is failed now) is made up on the
        // next members, as many as the records are short of.
        for i in 0..n {
            if written >= want {
                break;
            }
            let Some(d) = v.roles[(stripe as usize + i) % n].disk.as_ref() else {
                continue;
            };
            if !targets.iter().any(|t| Arc::ptr_eq(t, d)) {
                written += put(d);
            }
        }
        self.core.ensure_alive(dev)?;
        if written == 0 {
            return Err(Error::Unavailable {
                offset: dev,
                detail: "no member could take the journal record".into(),
            });
        }
        Ok(())
    }

    /// The log is full and nothing is in flight: make every record up to
    /// `seq` durable in place (flush) and record that in the superblocks.
    pub(crate) fn journal_checkpoint(&self, seq: u64) -> Result<()> {
        self.flush()?;
        let mut meta = self.core.meta.locked();
        // Never back: a reshape's own checkpoint (`journal_applied`) may
        // have recorded a later one meanwhile.
        meta.sb.journal.applied_seq = meta.sb.journal.applied_seq.max(seq);
        self.core.write_superblocks(&mut meta)
    }

    /// Before close: no record in flight, and the superblocks say every
    /// record is applied.
    pub(crate) fn journal_settle(&self) {
        if let Some(j) = &self.journal {
            let seq = j.quiesce();
            self.core.meta.locked().sb.journal.applied_seq = seq;
        }
    }

    /// At the start, before serving: after an unclean shutdown replay the
    /// journal or plan a resync of the regions the bitmap marks (of
    /// everything without one); and resume a resync the superblocks record
    /// as pending (an initial sync cut short, say).
    pub(crate) fn recover_unclean(&self, unclean: bool, force: bool) -> Result<()> {
        let checksums = self.checksums();
        if !self.core.geom().level.has_redundancy() && !checksums {
            return Ok(());
        }
        let pending = self.core.meta.locked().sb.resync;
        let mut plan = ParityResync {
            from: pending,
            marked: None,
        };
        if unclean && self.journal.is_some() {
            // Records replayed and windows resynced may hold blocks torn
            // from their checksums: taken as they are while replaying.
            if checksums {
                self.core.window.open(None, false);
            }
            let replayed = self.replay_journal();
            self.core.window.close();
            replayed?;
        } else if unclean && !self.core.geom().level.has_redundancy() {
            // Nothing to resync, but blocks being written at the crash
            // may disagree with their checksums: every block is read and
            // its checksum taken from it where it disagrees.
            plan.from = Some(0);
            self.recovery.note(vec![
                "not shut down cleanly: re-reading every block while serving, to re-record the checksums of blocks being written at the crash".into(),
            ]);
        } else if unclean {
            let v = self.core.view.load_full();
            if !self.parity_recomputable(&v) {
                if force {
                    self.recovery.note(vec![
                        "not shut down cleanly and degraded: started by force; stripes being written at the crash may rebuild wrong".into(),
                    ]);
                    if checksums {
                        // No resync can run: blocks being written at the
                        // crash keep being taken as they are while it runs.
                        self.core
                            .window
                            .open(self.core.bitmap.as_ref().map(|b| b.snapshot()), false);
                    }
                    // Owed all the same: the regions marked run once the
                    // array is whole again (`lost_marked_resync`), and the
                    // array stays dirty until then. Without a bitmap the
                    // rebuild of the missing member rewrites it whole.
                    if let Some(b) = self.core.bitmap.as_ref() {
                        *self.recovery.resync_marked.locked() = Some(b.snapshot());
                        self.recovery
                            .parity_unfinished
                            .store(true, std::sync::atomic::Ordering::Release);
                    }
                    return Ok(());
                }
                // Which roles lack their data, and how: a member part-way
                // through its rebuild cannot be "brought back".
                let how: Vec<String> = v
                    .degraded_roles()
                    .into_iter()
                    .map(|r| match &v.roles[r].disk {
                        Some(d) => {
                            format!("role {r} ({}) was part-way through a rebuild", d.name())
                        }
                        None => format!("role {r} has no member"),
                    })
                    .collect();
                return Err(Error::NotEnoughMembers {
                    name: self.core.name.clone(),
                    detail: format!(
                        "it was not shut down cleanly and is degraded ({}), without a journal: the parity of stripes being written at the crash may be wrong, so rebuilding could return garbage (the write hole). Bring back a missing member if there is one, or start it with --force to accept that",
                        how.join(", ")
                    ),
                });
            }
            match self.core.bitmap.as_ref() {
                Some(b) => plan.marked = Some(b.snapshot()),
                // Nothing says where writes were: everything, from the
                // start (a pending resync's position does not help: units
                // below it may have been written since).
                None => plan.from = Some(0),
            }
            self.recovery.note(vec![format!(
                "not shut down cleanly: resyncing parity {} while serving",
                if plan.marked.is_some() {
                    "in the regions the bitmap marks"
                } else {
                    "everywhere (no bitmap)"
                }
            )]);
            if plan.marked.is_some() {
                // Marked regions are not recorded anywhere but in the bitmap:
                // the array stays dirty until they are done.
                *self.recovery.resync_marked.locked() = plan.marked.clone();
                self.recovery
                    .parity_unfinished
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        if let Some(at) = plan.from {
            if pending.is_some() && !unclean {
                self.recovery.note(vec![format!(
                    "redundancy never made consistent from unit {at} of {} on (an initial sync cut short): resyncing it while serving",
                    self.level().units(self)
                )]);
            }
            self.unsynced_from
                .store(at, std::sync::atomic::Ordering::Release);
            let mut meta = self.core.meta.locked();
            if meta.sb.resync != Some(at) {
                meta.sb.resync = Some(at);
                self.core.write_superblocks(&mut meta)?;
            }
        }
        if checksums && (plan.from.is_some() || plan.marked.is_some()) {
            // Until the resync has passed, blocks there that disagree with
            // their checksums are put back from redundancy where the
            // rebuild agrees with their checksums, taken as they are
            // otherwise (see `CrashWindow`); the resync writes back what
            // reads put back.
            self.core.window.open(
                match plan.from {
                    Some(_) => None,
                    None => plan.marked.clone(),
                },
                true,
            );
        }
        if plan.from.is_some() || plan.marked.is_some() {
            *self.recovery.pending_parity.locked() = Some(plan);
            self.core.wake.kick();
        }
        Ok(())
    }

    /// Run the resync the array starts with (an initial sync, or one cut
    /// short) here and now rather than in the background, reporting
    /// `progress(done, total)` in bytes: for `create`.
    pub fn finish_resync(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        let plan = self.recovery.pending_parity.locked().take();
        if let Some(plan) = plan {
            self.run_parity_resync(plan, &mut progress)?;
        }
        if self.core.meta.locked().sb.resync.is_some() {
            let why = self
                .last_recovery()
                .map_or_else(|| "it did not run".to_string(), |l| l.result);
            return Err(Error::Invalid(format!(
                "the resync did not finish ({why}); `serve` resumes it"
            )));
        }
        Ok(())
    }

    /// Whether `unit`'s redundancy has never been made consistent (a
    /// pending initial or full resync has not reached it).
    pub(crate) fn unsynced(&self, unit: u64) -> bool {
        unit >= self
            .unsynced_from
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the copies of mirrored piece `p` may differ: an initial
    /// resync has not reached it, or it lies in a region an unclean stop
    /// left marked and the resync after it has not finished. Reads there
    /// take the first copy, the one the resync copies to the others: a
    /// read before the resync gives what one after it does.
    pub(crate) fn copies_may_differ(&self, p: &Piece) -> bool {
        use std::sync::atomic::Ordering;
        if self.unsynced(p.logical / self.core.geom().chunk) {
            return true;
        }
        if !self.recovery.parity_unfinished.load(Ordering::Acquire) {
            return false;
        }
        self.recovery
            .resync_marked
            .locked()
            .as_ref()
            .is_some_and(|m| p.copies.iter().any(|&(_, d)| m.overlaps(d, d + p.len)))
    }

    /// `unsynced` for stripe `stripe` of view `v`'s geometry. The resync
    /// counts units of the array's chunk; during a change of chunk a
    /// stripe of the old geometry spans other units, so it is placed by
    /// its member bytes: unsynced if its last unit is.
    pub(crate) fn unsynced_stripe(&self, v: &View, stripe: u64) -> bool {
        let last = ((stripe + 1) * v.geom.chunk).div_ceil(self.core.geom().chunk) - 1;
        self.unsynced(last)
    }

    /// Record how far a resync from a position got.
    fn resync_checkpoint(&self, at: Option<u64>) -> Result<()> {
        let mut meta = self.core.meta.locked();
        meta.sb.resync = at;
        self.core.write_superblocks(&mut meta)
    }

    /// Make redundancy agree with the data where `plan` says (units from a
    /// position on, and marked regions), unit by unit under the stripe
    /// locks, while clients read and write. A resync from a position
    /// records it in the superblocks every few seconds and at a stop, so a
    /// restart resumes there. `progress(done, total)` in bytes.
    pub(crate) fn run_parity_resync(
        &self,
        plan: ParityResync,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        let chunk = self.core.geom().chunk;
        let n_units = self.level().units(self);
        let from = plan.from.unwrap_or(u64::MAX);
        let in_marked = |lo: u64, hi: u64| plan.marked.as_ref().is_some_and(|d| d.overlaps(lo, hi));
        let wanted = |u: u64| u >= from || self.level().unit_in(self, u, &in_marked);
        let total = windows(0, n_units, u64::MAX, wanted)
            .map(|(a, b)| b - a)
            .sum::<u64>()
            * chunk;
        // Units below the resume position that are not redone were done by
        // earlier runs.
        let before = match plan.from {
            Some(f) => {
                let f = f.min(n_units);
                (f - windows(0, f, u64::MAX, wanted)
                    .map(|(a, b)| b - a)
                    .sum::<u64>())
                    * chunk
            }
            None => 0,
        };
        let resumed_from = plan.from.filter(|&f| f > 0).map_or(0, |f| f * chunk);
        let mut process = Process::start(
            self,
            Plan {
                kind: "parity-resync",
                role: None,
                member: String::new(),
                with: Vec::new(),
                bytes_before: before,
                bytes_total: total,
                resumed_from,
            },
        );
        let mut done = 0;
        let mut healed = 0;
        let mut unavailable = 0u64;
        let result = (|| -> Result<String> {
            let _writing = self.core.begin_write()?;
            for (a, b) in windows(0, n_units, u64::MAX, wanted) {
                for u in a..b {
                    if process.stopped() {
                        return Ok("the array was stopped (resumed at the next start)".into());
                    }
                    if !self.parity_recomputable(&self.core.view.load()) {
                        return Ok("a member was lost: parity cannot be recomputed".into());
                    }
                    // During a reshape, by the geometry of the unit's row
                    // (none: rows the reshape rewrites when it resumes).
                    let Some((v, units)) = self.units_for(u) else {
                        continue;
                    };
                    {
                        let _g = self.core.lock(u);
                        for x in units {
                            match self.level().resync_unit(self, &v, x) {
                                Ok(()) => {}
                                // Damage beyond what the level survives
                                // (blocks a rebuild lost, rot beside
                                // them): nothing to make consistent from;
                                // reads there fail until written.
                                Err(Error::Unavailable { offset, detail }) => {
                                    tracing::warn!(
                                        array = self.core.name.as_str(),
                                        offset,
                                        "resync: a unit left as it is: {detail}"
                                    );
                                    unavailable += 1;
                                    continue;
                                }
                                Err(e) => return Err(e),
                            }
                            healed += self.write_back_healed(&v, x)?;
                        }
                        if u >= from {
                            // Under the unit's lock: a write that takes it
                            // next sees the unit synced.
                            self.unsynced_from.store(u + 1, Ordering::Release);
                        }
                    }
                    done += chunk;
                    progress(done, total);
                    if plan.from.is_some() && process.checkpoint_due() {
                        // Durable in place before the position says so.
                        self.core.flush()?;
                        self.resync_checkpoint(Some(u + 1))?;
                    }
                    process.advance(chunk);
                }
            }
            self.core.flush()?;
            if plan.from.is_some() {
                self.unsynced_from.store(u64::MAX, Ordering::Release);
                self.resync_checkpoint(None)?;
            }
            self.recovery
                .parity_unfinished
                .store(false, Ordering::Release);
            *self.recovery.resync_marked.locked() = None;
            // Every block the crash could have torn has been read (and its
            // checksum recorded) and is written back by the flush above.
            self.core.window.close();
            if healed > 0 {
                let note = format!(
                    "the resync put back {healed} block(s) from redundancy that disagreed with their checksums (rotten, or torn by a write in flight at the crash)"
                );
                tracing::warn!(array = self.core.name.as_str(), "{note}");
                self.recovery.note(vec![note]);
            }
            if unavailable > 0 {
                let note = format!(
                    "the resync left {unavailable} unit(s) as they are: damaged beyond what the level survives (blocks a rebuild could not rebuild, or rot beside them), they read as errors until written"
                );
                tracing::warn!(array = self.core.name.as_str(), "{note}");
                self.recovery.note(vec![note]);
            }
            Ok("done".into())
        })();
        if plan.from.is_some() && !matches!(result.as_deref(), Ok("done")) {
            // Stopped or failed: record the position reached, if the
            // members can still take it.
            let at = self.unsynced_from.load(Ordering::Acquire);
            if self.core.flush().is_ok() {
                let _ = self.resync_checkpoint(Some(at));
            }
        }
        process.end(match &result {
            Ok(t) => t.clone(),
            Err(e) => e.to_string(),
        });
        result.map(|_| ())
    }

    /// Write every record of the journal not yet applied in place, in
    /// order, to the members present; then record them applied.
    fn replay_journal(&self) -> Result<()> {
        let j = self.journal.as_ref().expect("journal");
        let (uuid, after) = {
            let meta = self.core.meta.locked();
            (meta.sb.array_uuid, meta.sb.journal.applied_seq)
        };
        let v = self.core.view.load_full();
        let mut records: BTreeMap<u64, Record> = BTreeMap::new();
        let mut scanned = 0;
        for d in v.roles.iter().filter_map(|r| r.disk.as_ref()) {
            // A member that cannot be read is failed on its first I/O; the
            // other copies of its records are on other members.
            if let Ok(found) = journal::scan(d.member.as_ref(), j.offset, j.size, uuid, after) {
                scanned += 1;
                for r in found {
                    records.entry(r.seq).or_insert(r);
                }
            }
        }
        if scanned == 0 {
            return Err(Error::Invalid(
                "no member's journal could be read: refusing to serve data that may be inconsistent".into(),
            ));
        }
        let _writing = self.core.begin_write()?;
        let count = records.len();
        let mut last = after;
        // Windows rewritten whole after a record: its blocks there are not
        // replayed (the later data, in place, wins).
        let intents: Vec<(u64, u64, u64, u64)> = records
            .values()
            .filter_map(|r| r.intent.map(|(dev, len)| (r.seq, r.stripe, dev, len)))
            .collect();
        for (&seq, r) in &records {
            let _g = self.core.lock(r.stripe);
            // By member offsets: a window may span several stripes (a run
            // of whole stripes, or a range logged ahead of a stream), and a
            // stripe's blocks lie at the same offsets on every member.
            let later: Vec<(u64, u64)> = intents
                .iter()
                .filter(|i| i.0 > seq)
                .map(|i| (i.2, i.2 + i.3))
                .collect();
            for part in &r.parts {
                if part.role >= v.roles.len() {
                    continue;
                }
                for (lo, hi) in outside(part.dev, part.dev + part.data.len() as u64, &later) {
                    let at = (lo - part.dev) as usize..(hi - part.dev) as usize;
                    self.core.member_write(&v, part.role, &part.data[at], lo)?;
                }
            }
            last = seq;
        }
        // Then the windows rewritten whole get parity from their data. A
        // data member that is missing, or being resynced (a stale copy taken
        // back), gives its part through reconstruction, so that all parity
        // agrees (on RAID-6 a torn P and Q would otherwise rebuild that
        // member one way and leave Q saying another). Where the data cannot
        // be had (too many absent, or a stripe never synced), the window,
        // all of it written since the last flush, keeps what it has.
        let windows = intents.iter().flat_map(|&(_, _, dev, len)| {
            // A window spanning stripes, stripe by stripe (its geometry's:
            // only a run of whole stripes outside a reshape spans several).
            let chunk = self.view_for_dev(dev).map_or(len.max(1), |v| v.geom.chunk);
            let end = dev + len;
            std::iter::successors(Some(dev), move |&at| {
                let next = (at / chunk + 1) * chunk;
                (next < end).then_some(next)
            })
            .map(move |at| (at, ((at / chunk + 1) * chunk).min(end) - at))
        });
        // Before a window's parity is recomputed from its data, blocks
        // there that rotted while nothing wrote them are put back from
        // redundancy (`heal.rs`); the recompute would take them as they are.
        let checksums = self.checksums();
        let mut healed = 0;
        for (dev, len) in windows {
            // During a reshape, by the geometry of the stripe's row (that
            // in which it was written: before a reshape moves a row,
            // every record is known applied).
            let Some(v) = self.view_for_dev(dev) else {
                continue;
            };
            let chunk = v.geom.chunk;
            let stripe = dev / chunk;
            let sm = v.geom.stripe_map(stripe);
            let absent = sm
                .data
                .iter()
                .filter(|&&r| Core::readable(&v, r, dev, len).is_none())
                .count();
            if absent > 0
                && (self.unsynced_stripe(&v, stripe) || absent > 1 + usize::from(sm.q.is_some()))
            {
                continue;
            }
            let _g = self.core.lock(stripe);
            if checksums && absent == 0 && !self.unsynced_stripe(&v, stripe) {
                // Whole blocks, inside the stripe's chunks.
                let row = stripe * chunk..(stripe + 1) * chunk;
                let lo = (dev / BLOCK * BLOCK).max(row.start);
                let hi = (dev + len).next_multiple_of(BLOCK).min(row.end);
                if lo < hi {
                    match self.heal_rotten(&v, stripe, lo, hi) {
                        Ok(n) => healed += n,
                        Err(Error::Unavailable { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            match self.recompute_parity(
                &v,
                stripe,
                dev - stripe * chunk,
                len,
                DataFrom::OrRedundancy,
            ) {
                Ok(()) | Err(Error::Unavailable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.flush()?;
        j.advance_to(last);
        let mut meta = self.core.meta.locked();
        meta.sb.journal.applied_seq = last;
        self.core.write_superblocks(&mut meta)?;
        drop(meta);
        if count > 0 {
            self.recovery.note(vec![format!(
                "not shut down cleanly: replayed {count} journal record(s)"
            )]);
        }
        if healed > 0 {
            self.recovery.note(vec![format!(
                "replay put back {healed} block(s) from redundancy that disagreed with their checksums (rotten, or torn by a write in flight at the crash)"
            )]);
        }
        Ok(())
    }
}

/// The parts of `[lo, hi)` outside every range of `cut`.
fn outside(lo: u64, hi: u64, cut: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = vec![(lo, hi)];
    for &(a, b) in cut {
        out = out
            .into_iter()
            .flat_map(|(x, y)| {
                let mut v = Vec::new();
                if a >= y || b <= x {
                    v.push((x, y));
                } else {
                    if x < a {
                        v.push((x, a));
                    }
                    if b < y {
                        v.push((b, y));
                    }
                }
                v
            })
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::outside;

    #[test]
    fn ranges_outside_later_windows() {
        assert_eq!(outside(0, 100, &[]), vec![(0, 100)]);
        assert_eq!(outside(0, 100, &[(0, 100)]), vec![]);
        assert_eq!(
            outside(0, 100, &[(20, 30), (50, 200)]),
            vec![(0, 20), (30, 50)]
        );
        assert_eq!(outside(10, 20, &[(0, 5), (25, 30)]), vec![(10, 20)]);
    }
}
