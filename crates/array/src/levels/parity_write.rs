//! Writes to parity levels: a request's pieces grouped by stripe, each
//! stripe updated under its lock by read-modify-write, reconstruct-write
//! or a full-stripe write, logged to the journal as the consistency policy
//! asks (one record per column window, or the intents of whole stripes).

use super::parity::{column_parity, COLUMN};
use crate::core::{Core, View};
use crate::engine::{all_small, in_parallel, in_parallel_small, Array, Small};
use crate::error::{Error, Result};
use crate::{scratch, seams};
use raidkit_layout::{Piece, StripeMap};
use raidkit_parity as parity;
use smallvec::smallvec;
use std::sync::Arc;

impl Array {
    /// A write to a parity level: its pieces grouped by stripe, each stripe
    /// updated under its lock; with a journal, by column windows (one
    /// record each) unless the whole stripe is rewritten with every member
    /// in service.
    pub(crate) fn write_parity<'a>(
        &self,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
    ) -> Result<()> {
        let mut i = 0;
        while i < pieces.len() {
            let j = stripe_end(pieces, i);
            // A run of stripes rewritten whole: with a journal, the
            // intents of all of them go in one durable write; on members
            // that wait for devices each member gets its part of the run
            // as one write (`write_stripes_merged`), journal or not.
            if (self.journal.is_some() || !Self::page_cache_only(v))
                && Core::whole(v)
                && self.whole_chunks(v, &pieces[i..j])
            {
                let mut run = vec![(i, j)];
                while run.len() < INTENT_BATCH {
                    let (_, e) = *run.last().expect("run");
                    if e == pieces.len() || pieces[e].stripe != pieces[e - 1].stripe + 1 {
                        break;
                    }
                    let f = stripe_end(pieces, e);
                    if !self.whole_chunks(v, &pieces[e..f]) {
                        break;
                    }
                    run.push((e, f));
                }
                if run.len() > 1 {
                    self.write_whole_stripes(v, pieces, &run, src)?;
                    i = run.last().expect("run").1;
                    continue;
                }
            }
            self.write_group(v, &pieces[i..j], src)?;
            i = j;
        }
        Ok(())
    }

    /// Whether one stripe's pieces rewrite every data chunk whole.
    fn whole_chunks(&self, v: &View, pieces: &[Piece]) -> bool {
        self.full_stripe(v, pieces) && pieces[0].col == 0 && pieces[0].len == v.geom.chunk
    }

    /// Stripes rewritten whole, one after the other (`run`: their pieces'
    /// ranges in `pieces`): under all their locks, one durable write of
    /// their intent records, then the stripes. Should a member have left
    /// meanwhile, stripe by stripe as any write.
    fn write_whole_stripes<'a>(
        &self,
        like: &View,
        pieces: &[Piece],
        run: &[(usize, usize)],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
    ) -> Result<()> {
        let s0 = pieces[run[0].0].stripe;
        let s1 = s0 + run.len() as u64;
        let chunk = like.geom.chunk;
        seams::before_stripe_lock();
        let locks = self.core.lock_range(s0, s1);
        let v = self.core.view_under_lock(like);
        if !Core::whole(&v) {
            drop(locks);
            return run
                .iter()
                .try_for_each(|&(a, b)| self.write_group(&v, &pieces[a..b], src));
        }
        let slots = self.journal_stream(&v, s0, s1)?;
        if !Self::page_cache_only(&v) {
            let done = self.write_stripes_merged(&v, pieces, run, src);
            drop(slots);
            return done;
        }
        for &(a, b) in run {
            let stripe = pieces[a].stripe;
            let sm = v.geom.stripe_map(stripe);
            let group: Small<(&Piece, &[u8])> = pieces[a..b].iter().map(|p| (p, src(p))).collect();
            self.write_full_stripe(&v, &group, &sm, stripe * chunk, chunk as usize)?;
        }
        drop(slots);
        Ok(())
    }

    /// Whole stripes `run` (locked, every member in service, intents
    /// logged) on members that wait for devices: parity computed for all
    /// of them, then each member's chunks of the run, which lie one after
    /// the other on it, written as one request, every member at once. A
    /// stripe at a time, each member got a chunk and waited for it before
    /// the next; two streams at once then interleaved their chunks on
    /// every disk, a seek between each two (two writers on RAID-5 of
    /// simulated disks: 154 MB/s, against 405 for one).
    fn write_stripes_merged<'a>(
        &self,
        v: &View,
        pieces: &[Piece],
        run: &[(usize, usize)],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
    ) -> Result<()> {
        let chunk = v.geom.chunk as usize;
        let s0 = pieces[run[0].0].stripe;
        let mut bufs: Vec<Vec<u8>> = (0..v.geom.members())
            .map(|_| scratch::take(run.len() * chunk))
            .collect();
        let all = &pieces[run[0].0..run.last().expect("run").1];
        crate::levels::parity::member_rows(&v.geom, s0, all, src, &mut bufs);
        let dev = s0 * chunk as u64;
        let done = in_parallel(bufs.iter().enumerate(), |(role, b)| {
            self.core.member_write(v, role, b, dev)
        });
        bufs.into_iter().for_each(scratch::give);
        done
    }

    /// One stripe's pieces: updated under its lock; with a journal, by
    /// column windows (one record each) unless the whole stripe is
    /// rewritten with every member in service.
    fn write_group<'a>(
        &self,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
    ) -> Result<()> {
        let stripe = pieces[0].stripe;
        match self.journal.as_ref().map(|jl| jl.window) {
            None => {
                let group: Small<(&Piece, &[u8])> = pieces.iter().map(|p| (p, src(p))).collect();
                self.write_stripe(v, stripe, &group)
            }
            Some(_) if self.full_stripe(v, pieces) && Core::whole(v) => {
                // The whole stripe rewritten: one intent record, no
                // windows needed.
                let group: Small<(&Piece, &[u8])> = pieces.iter().map(|p| (p, src(p))).collect();
                self.write_stripe(v, stripe, &group)
            }
            Some(w) => {
                // Journaled: one record per column window.
                let c0 = pieces.iter().map(|p| p.col).min().expect("piece");
                let c1 = pieces.iter().map(|p| p.col + p.len).max().expect("piece");
                let mut ws = c0 / w * w;
                while ws < c1 {
                    let clipped: Small<Piece> =
                        pieces.iter().filter_map(|p| clip(p, ws, ws + w)).collect();
                    if !clipped.is_empty() {
                        let group: Small<(&Piece, &[u8])> =
                            clipped.iter().map(|p| (p, src(p))).collect();
                        self.write_stripe(v, stripe, &group)?;
                    }
                    ws += w;
                }
                Ok(())
            }
        }
    }

    /// Whether one stripe's pieces rewrite the same columns of every data chunk.
    pub(crate) fn full_stripe(&self, v: &View, pieces: &[Piece]) -> bool {
        pieces.len() == v.geom.data_members()
            && pieces
                .iter()
                .all(|p| p.col == pieces[0].col && p.len == pieces[0].len)
    }

    /// Update one stripe: read-modify-write or reconstruct-write, whichever
    /// reads less (md's handle_stripe_dirtying), or no reads at all for a
    /// full-stripe write.
    pub(crate) fn write_stripe(
        &self,
        like: &View,
        stripe: u64,
        pieces: &[(&Piece, &[u8])],
    ) -> Result<()> {
        seams::before_stripe_lock();
        let _g = self.core.lock(stripe);
        let v: &View = &self.core.view_under_lock(like);
        let sm = v.geom.stripe_map(stripe);
        let k = sm.data.len();
        let chunk = v.geom.chunk;
        let c0 = pieces.iter().map(|(p, _)| p.col).min().expect("non-empty");
        let c1 = pieces
            .iter()
            .map(|(p, _)| p.col + p.len)
            .max()
            .expect("non-empty");
        let len = (c1 - c0) as usize;
        let dev = stripe * chunk + c0;
        let parity_roles: Small<usize> = std::iter::once(sm.p).chain(sm.q).collect();

        if !parity_roles.iter().any(|&r| Core::writable(v, r)) {
            // Every parity member of this stripe is gone: data is all there
            // is. Nothing to keep consistent, but with checksums a crash
            // can tear these blocks from theirs: the journal takes them, so
            // that replay rewrites them (and their checksums).
            let _slot = if self.core.checksums {
                self.journal_parts(stripe, pieces, dev, &[])?
            } else {
                None
            };
            for (p, d) in pieces {
                self.core.member_write(v, p.copies[0].0, d, p.copies[0].1)?;
            }
            return Ok(());
        }

        let mut new_for: Small<Option<(&Piece, &[u8])>> = smallvec![None; k];
        for &(p, d) in pieces {
            new_for[p.dd] = Some((p, d));
        }
        let covers =
            |dd: usize| new_for[dd].is_some_and(|(p, _)| p.col == c0 && p.col + p.len == c1);
        let rcw_reads = (0..k).filter(|&d| !covers(d)).count();
        let span = len as u64;
        let rmw_ok = parity_roles
            .iter()
            .all(|&r| Core::readable(v, r, dev, span).is_some())
            && pieces
                .iter()
                .all(|(p, _)| Core::readable(v, p.copies[0].0, p.copies[0].1, p.len).is_some());
        let rmw_reads = pieces.len() + parity_roles.len();
        // Parity never made consistent cannot be updated from itself.
        let rmw_ok = rmw_ok && !self.unsynced_stripe(v, stripe);

        if rmw_ok && rcw_reads > 0 && rmw_reads < rcw_reads {
            let mut pbuf = scratch::take(len);
            let mut qbuf = sm.q.map(|_| scratch::take(len));
            let mut olds: Small<Vec<u8>> = pieces
                .iter()
                .map(|(p, _)| scratch::take(p.len as usize))
                .collect();
            let read_ok = self.rmw_reads(
                v,
                &sm,
                dev,
                pieces,
                &mut pbuf,
                qbuf.as_deref_mut(),
                &mut olds,
            );
            if read_ok {
                for ((p, d), old) in pieces.iter().zip(&olds) {
                    let r = (p.col - c0) as usize..(p.col - c0 + p.len) as usize;
                    parity::update_pq(
                        &mut pbuf[r.clone()],
                        qbuf.as_mut().map(|q| &mut q[r]),
                        sm.syndrome[p.dd],
                        old,
                        d,
                    );
                }
            }
            let done = read_ok.then(|| {
                let _slot =
                    self.journal_update(stripe, &sm, pieces, dev, &pbuf, qbuf.as_deref())?;
                self.write_out(v, pieces, &sm, dev, &pbuf, qbuf.as_deref())
            });
            scratch::give(pbuf);
            if let Some(q) = qbuf {
                scratch::give(q);
            }
            olds.into_iter().for_each(scratch::give);
            // A failed read falls through to reconstruct-write below,
            // which rewrites every block read-modify-write read: that cures it.
            if let Some(r) = done {
                return r;
            }
        }

        // A full-stripe update with every member in service logs only its
        // intent (journal.rs); otherwise the journal takes the blocks.
        let intent = rcw_reads == 0 && self.journal.is_some() && Core::whole(v);
        if rcw_reads == 0 && len >= 2 * COLUMN && (self.journal.is_none() || intent) {
            let _slot = self.journal_intent(stripe, dev, len as u64, chunk)?;
            return self.write_full_stripe(v, pieces, &sm, dev, len);
        }

        // Reconstruct-write: assemble full rows, then compute parity afresh.
        // Fully covered chunks are used in place, without a copy.
        let need: Small<bool> = (0..k).map(|d| !covers(d)).collect();
        let mut rows = if rcw_reads > 0 {
            match self.read_rows(v, stripe, c0, len as u64, &need) {
                Ok(rows) => rows,
                Err(e) => self
                    .rows_as_they_lie(v, &sm, dev, len as u64, &need)
                    .ok_or(e)?,
            }
        } else {
            vec![Vec::new(); k]
        };
        for (dd, row) in rows.iter_mut().enumerate() {
            if let Some((p, d)) = new_for[dd] {
                if !covers(dd) {
                    let at = (p.col - c0) as usize;
                    row[at..at + d.len()].copy_from_slice(d);
                }
            }
        }
        let mut order: Small<usize> = smallvec![0; k];
        for dd in 0..k {
            order[sm.syndrome[dd]] = dd;
        }
        let refs: Small<&[u8]> = order
            .iter()
            .map(|&dd| match new_for[dd] {
                Some((_, d)) if covers(dd) => d,
                _ => rows[dd].as_slice(),
            })
            .collect();
        let mut pbuf = scratch::take(len);
        let mut qbuf = sm.q.map(|_| scratch::take(len));
        match qbuf.as_mut() {
            Some(qb) => parity::gen_pq(&refs, &mut pbuf, qb),
            None => parity::gen_p(&refs, &mut pbuf),
        }
        drop(refs);
        let slot = if intent {
            self.journal_intent(stripe, dev, len as u64, chunk)
        } else {
            self.journal_update(stripe, &sm, pieces, dev, &pbuf, qbuf.as_deref())
        };
        let written =
            slot.and_then(|_slot| self.write_out(v, pieces, &sm, dev, &pbuf, qbuf.as_deref()));
        scratch::give(pbuf);
        if let Some(q) = qbuf {
            scratch::give(q);
        }
        rows.into_iter().for_each(scratch::give);
        written
    }

    /// The data rows `need` of a stripe window `[dev, dev + len)` as they
    /// lie on their members, for a reconstruct-write that `read_rows`
    /// could not serve because blocks there disagree with their checksums
    /// beyond what redundancy rebuilds (a rebuild that met rot on RAID-5
    /// leaves two such blocks in a column). Without it no write to such a
    /// column could succeed, not even one over those blocks themselves.
    /// A block that disagrees with its checksum is taken complemented,
    /// bit by bit: rebuilt later through the parity made here, it comes
    /// back as neither what its checksum recorded nor what lies on the
    /// member, so it still reads as an error until written (parity made
    /// from the bytes as they lie would rebuild exactly those, and a
    /// rebuild equal to the member's bytes is taken as a rotten checksum
    /// entry and adopted: wrong data served). Every other block of the
    /// stripe, and those being written, are whole again.
    /// None (the write fails as the read did) where a row's member cannot
    /// be read (missing, not yet rebuilt there, an I/O error: its contents
    /// could only come from parity, which the damage makes wrong), without
    /// checksums, and in a crash window (blocks there are adopted, not bad).
    fn rows_as_they_lie(
        &self,
        v: &View,
        sm: &StripeMap,
        dev: u64,
        len: u64,
        need: &[bool],
    ) -> Option<Vec<Vec<u8>>> {
        use crate::checksums::BLOCK;
        if !self.core.checksums || self.core.window.covers(dev, len) {
            return None;
        }
        // Whole checksum blocks, each checked: a part of one cannot be.
        let (a, b) = (dev / BLOCK * BLOCK, (dev + len).next_multiple_of(BLOCK));
        // The members as they are now: one the failed read put out of
        // service is not read from.
        let now = self.core.view.load();
        let row_of = |role: usize| -> Option<Vec<u8>> {
            let d = Core::readable(v, role, a, b - a)?;
            if !Core::readable(&now, role, a, b - a).is_some_and(|x| Arc::ptr_eq(x, d)) {
                return None;
            }
            let c = d.checked.as_ref()?;
            let mut whole = scratch::take((b - a) as usize);
            let mut bad = 0;
            let ok = self
                .core
                .timed(d, || c.read_raw(&mut whole, d.data_offset + a))
                .is_ok()
                && whole.chunks_mut(BLOCK as usize).zip(0..).all(|(blk, i)| {
                    match c.agrees(blk, d.data_offset + a + i * BLOCK) {
                        Ok(true) => true,
                        Ok(false) => {
                            bad += 1;
                            blk.iter_mut().for_each(|x| *x = !*x);
                            true
                        }
                        Err(_) => false,
                    }
                });
            let row = ok.then(|| {
                let mut row = scratch::take(len as usize);
                row.copy_from_slice(&whole[(dev - a) as usize..(dev - a + len) as usize]);
                if bad > 0 {
                    tracing::warn!(
                    member = d.name(),
                    role,
                    member_offset = d.data_offset + a,
                    blocks = bad,
                    "write over a stripe with blocks nothing can rebuild: they still read as errors until written"
                );
                }
                row
            });
            scratch::give(whole);
            row
        };
        let mut rows: Vec<Vec<u8>> = Vec::with_capacity(need.len());
        for (dd, &n) in need.iter().enumerate() {
            match n.then(|| row_of(sm.data[dd])) {
                None => rows.push(Vec::new()),
                Some(Some(row)) => rows.push(row),
                Some(None) => {
                    rows.into_iter().for_each(scratch::give);
                    return None;
                }
            }
        }
        Some(rows)
    }

    /// A full-stripe write: parity computed by columns that stay in cache,
    /// either in this thread between the column's member writes (when
    /// those are copies into the page cache) or beside the data writes on
    /// another core. Members that wait for devices are written all at once
    /// even when other writes keep the cores busy: one column after the
    /// other, member by member, each write would wait for its device in
    /// turn, and two streaming writers on simulated disks got 32 MB/s where
    /// one alone got 400.
    pub(crate) fn write_full_stripe(
        &self,
        v: &View,
        pieces: &[(&Piece, &[u8])],
        sm: &StripeMap,
        dev: u64,
        len: usize,
    ) -> Result<()> {
        let k = sm.data.len();
        let mut by_dd: Small<&[u8]> = smallvec![&[][..]; k];
        for (p, d) in pieces {
            by_dd[p.dd] = d;
        }
        let mut pbuf = scratch::take(len);
        let mut qbuf = sm.q.map(|_| scratch::take(len));
        let done = if Self::page_cache_only(v) {
            // The member writes are only copies into the page cache: no
            // hand-offs. Column by
            // column, the data goes to the members and then feeds P and Q
            // while still in cache, so parity costs no second trip to memory.
            let mut at = 0;
            let mut done = Ok(());
            while at < len && done.is_ok() {
                let end = (at + COLUMN).min(len);
                for (dd, d) in by_dd.iter().enumerate() {
                    if done.is_ok() {
                        done = self
                            .core
                            .member_write(v, sm.data[dd], &d[at..end], dev + at as u64);
                    }
                }
                column_parity(sm, &by_dd, at..end, &mut pbuf, qbuf.as_deref_mut());
                at = end;
            }
            let done = done.and_then(|()| self.core.member_write(v, sm.p, &pbuf, dev));
            match (sm.q, &qbuf) {
                (Some(role), Some(q)) => {
                    done.and_then(|()| self.core.member_write(v, role, q, dev))
                }
                _ => done,
            }
        } else {
            // Data to the members on one core while another computes P and
            // Q and writes them: parity overlaps member I/O.
            let (data_done, parity_done) = rayon::join(
                || -> Result<()> {
                    // Every data member at once (disks in parallel).
                    in_parallel(by_dd.iter().enumerate(), |(dd, d)| {
                        self.core.member_write(v, sm.data[dd], d, dev)
                    })
                },
                || -> Result<()> {
                    let mut at = 0;
                    while at < len {
                        let end = (at + COLUMN).min(len);
                        column_parity(sm, &by_dd, at..end, &mut pbuf, qbuf.as_deref_mut());
                        at = end;
                    }
                    match (sm.q, &qbuf) {
                        // P and Q to their members at once.
                        (Some(role), Some(q)) => {
                            in_parallel([(sm.p, &pbuf[..]), (role, &q[..])], |(r, b)| {
                                self.core.member_write(v, r, b, dev)
                            })
                        }
                        _ => self.core.member_write(v, sm.p, &pbuf, dev),
                    }
                },
            );
            data_done.and(parity_done)
        };
        scratch::give(pbuf);
        if let Some(q) = qbuf {
            scratch::give(q);
        }
        done
    }

    /// The reads of a read-modify-write: old P (and Q) of the window
    /// `[dev, dev + pbuf.len())` and the old contents of each piece; on
    /// disks all at once, so the update waits for one read, not for the
    /// sum of them. false: one failed.
    #[allow(clippy::too_many_arguments)]
    fn rmw_reads(
        &self,
        v: &View,
        sm: &StripeMap,
        dev: u64,
        pieces: &[(&Piece, &[u8])],
        pbuf: &mut [u8],
        qbuf: Option<&mut [u8]>,
        olds: &mut [Vec<u8>],
    ) -> bool {
        let mut reads: Small<(usize, u64, &mut [u8])> = smallvec![(sm.p, dev, pbuf)];
        if let (Some(q), Some(qb)) = (sm.q, qbuf) {
            reads.push((q, dev, qb));
        }
        for ((p, _), old) in pieces.iter().zip(olds.iter_mut()) {
            reads.push((p.copies[0].0, p.copies[0].1, old.as_mut_slice()));
        }
        let read = |(role, at, buf): (usize, u64, &mut [u8])| match self
            .core
            .member_read(v, role, buf, at)
        {
            Some(Ok(())) => Ok(()),
            // Only whether it failed matters: reconstruct-write takes over.
            _ => Err(Error::Invalid("read-modify-write read failed".into())),
        };
        if Self::page_cache_only(v) {
            reads.into_iter().try_for_each(read).is_ok()
        } else if all_small(reads.iter().map(|r| &r.2[..])) {
            in_parallel_small(reads, read).is_ok()
        } else {
            in_parallel(reads, read).is_ok()
        }
    }

    /// The writes that end a stripe update: new data, P and Q (on disks
    /// all at once).
    pub(crate) fn write_out(
        &self,
        v: &View,
        pieces: &[(&Piece, &[u8])],
        sm: &StripeMap,
        dev: u64,
        p: &[u8],
        q: Option<&[u8]>,
    ) -> Result<()> {
        let mut writes: Small<(usize, u64, &[u8])> = pieces
            .iter()
            .map(|(piece, d)| (piece.copies[0].0, piece.copies[0].1, *d))
            .collect();
        writes.push((sm.p, dev, p));
        if let (Some(role), Some(q)) = (sm.q, q) {
            writes.push((role, dev, q));
        }
        let write = |(role, at, buf): (usize, u64, &[u8])| self.core.member_write(v, role, buf, at);
        if Self::page_cache_only(v) {
            writes.into_iter().try_for_each(write)
        } else if all_small(writes.iter().map(|w| w.2)) {
            in_parallel_small(writes, write)
        } else {
            in_parallel(writes, write)
        }
    }
}

/// Most intent records one write logs together (the log holds a bounded
/// number, and clients wait for the locks held).
const INTENT_BATCH: usize = 32;

/// The end of the run of pieces of `pieces[i]`'s stripe.
fn stripe_end(pieces: &[Piece], i: usize) -> usize {
    let mut j = i;
    while j < pieces.len() && pieces[j].stripe == pieces[i].stripe {
        j += 1;
    }
    j
}

/// The part of a piece within columns `[lo, hi)` of its chunk.
pub(crate) fn clip(p: &Piece, lo: u64, hi: u64) -> Option<Piece> {
    let a = p.col.max(lo);
    let b = (p.col + p.len).min(hi);
    if a >= b {
        return None;
    }
    let d = a - p.col;
    Some(Piece {
        logical: p.logical + d,
        len: b - a,
        stripe: p.stripe,
        col: a,
        dd: p.dd,
        copies: p.copies.iter().map(|&(r, dev)| (r, dev + d)).collect(),
    })
}
