//! Parity levels (RAID-4/5/6): reads that reconstruct from P and Q,
//! stripe updates by read-modify-write, reconstruct-write or whole
//! stripes, and parity computed from the members (or in place, over their
//! mappings); a stripe's redundancy recomputed from its data (resync,
//! journal replay) and checked with the reference code. Rebuilding a
//! member: `parity_rebuild.rs`.

use super::LevelOps;
use crate::background::Process;
use crate::checksums::BLOCK;
use crate::core::{Core, View};
use crate::engine::{in_parallel, roles_list, Array, Mismatch, Small};
use crate::error::{Error, Result};
use crate::levels::mirrored::read_in_sync;
use crate::recovery::{Job, Outcome};
use crate::{scratch, seams};
use raidkit_layout::{Geometry, Piece, StripeMap};
use raidkit_member::Locked;
use raidkit_parity as parity;
use smallvec::smallvec;

/// Column width for full-stripe writes (see `write_full_stripe`).
pub(crate) const COLUMN: usize = 128 << 10;

pub(crate) struct Parity;

/// Where `Array::recompute_parity` takes a stripe's data from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataFrom {
    /// Exactly as the data members hold it, streamed a column at a time:
    /// a member that cannot be read is failed, and the stripe with it
    /// (its parity is what is being made, so nothing can be rebuilt from
    /// it). For data just written in place with every member in service.
    Members,
    /// The members, with a data member that is absent, resyncing or fails
    /// to read rebuilt from the stripe's redundancy where it allows (and
    /// cured from the result): resync and journal replay.
    OrRedundancy,
}

impl LevelOps for Parity {
    fn read_piece(&self, a: &Array, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        a.read_parity_piece(v, p, dst)
    }

    fn read_role(&self, _a: &Array, _v: &View, p: &Piece) -> usize {
        p.copies[0].0
    }

    fn write<'a>(
        &self,
        a: &Array,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
        _len: usize,
    ) -> Result<()> {
        a.write_parity(v, pieces, src)
    }

    fn discard(&self, a: &Array, v: &View, pieces: &[Piece]) -> Result<Option<(u64, u64)>> {
        // Whole stripes only: data and parity all discarded read back zero,
        // and zero is the parity of zeroes (P and Q). A part of a stripe
        // would need its parity rewritten: left as it is. With every
        // member in service only, as a whole-stripe write logs its intent
        // only then; a crash part-way leaves some chunks zero, which the
        // intent records (or the bitmap) have resynced at the next start.
        let Some((lo, hi)) = super::span(pieces) else {
            return Ok(None);
        };
        let g = &v.geom;
        let width = g.chunk * g.data_members() as u64;
        let (s0, s1) = (lo.div_ceil(width), hi / width);
        if s0 >= s1 || !Core::whole(v) {
            return Ok(None);
        }
        // A batch of stripes at a time: the journal holds a bounded number
        // of intent records, and clients wait for the locks held.
        const BATCH: u64 = 32;
        let mut at = s0;
        while at < s1 {
            let end = (at + BATCH).min(s1);
            // Under the stripes' locks before the intent records, as any
            // stripe write: a record that comes after another's is applied
            // after it.
            let _locks = a.core.lock_range(at, end);
            let v = a.core.view_under_lock(v);
            if !Core::whole(&v) {
                break;
            }
            let slots = a.journal_intents(at, end, g.chunk)?;
            let (dev, len) = (at * g.chunk, (end - at) * g.chunk);
            for role in 0..g.members() {
                a.core.member_discard(&v, role, dev, len)?;
            }
            drop(slots);
            at = end;
        }
        Ok((at > s0).then_some((s0 * width, at * width)))
    }

    fn units(&self, a: &Array) -> u64 {
        a.core.geom().stripes()
    }

    fn unit_in(&self, a: &Array, u: u64, marked: &dyn Fn(u64, u64) -> bool) -> bool {
        let chunk = a.core.geom().chunk;
        marked(u * chunk, (u + 1) * chunk)
    }

    fn resync_unit(&self, a: &Array, v: &View, u: u64) -> Result<()> {
        a.recompute_parity(v, u, 0, v.geom.chunk, DataFrom::OrRedundancy)
    }

    fn check_unit(
        &self,
        a: &Array,
        v: &View,
        s: u64,
        each: &mut dyn FnMut(Mismatch),
    ) -> Result<u64> {
        let g = &v.geom;
        let chunk = g.chunk;
        let sm = g.stripe_map(s);
        let mut bufs: Vec<Vec<u8>> = (0..g.members())
            .map(|_| scratch::take(chunk as usize))
            .collect();
        let r = (|| {
            for (role, b) in bufs.iter_mut().enumerate() {
                read_in_sync(&a.core, v, role, b, s * chunk)?;
            }
            // The data in syndrome order, for the slow reference code.
            let mut order = vec![0; sm.data.len()];
            for dd in 0..sm.data.len() {
                order[sm.syndrome[dd]] = sm.data[dd];
            }
            let refs: Vec<&[u8]> = order.iter().map(|&r| bufs[r].as_slice()).collect();
            let (rp, rq) = parity::reference::pq(&refs);
            let mut roles = Vec::new();
            if rp != bufs[sm.p] {
                roles.push(sm.p);
            }
            if let Some(q) = sm.q.filter(|&q| rq != bufs[q]) {
                roles.push(q);
            }
            if roles.is_empty() {
                return Ok(0);
            }
            each(Mismatch {
                unit: s,
                array_offset: g.stripe_data_offset(s, 0),
                member_offset: s * chunk,
                roles,
            });
            Ok(1)
        })();
        bufs.into_iter().for_each(scratch::give);
        r
    }

    fn rebuild(&self, a: &Array, job: &Job, total: u64, process: &mut Process) -> Result<Outcome> {
        a.parity_pipeline(job, total, process)
    }
}

impl Array {
    /// Make stripe `stripe`'s P (and Q) over columns `[col, col + len)`
    /// agree with its data, written to every parity member that takes
    /// writes: the one place redundancy is recomputed from data (parity
    /// resync, journal replay, writes placed straight into member files).
    /// `from` says where the data may come from. Call with the stripe
    /// locked.
    pub(crate) fn recompute_parity(
        &self,
        v: &View,
        stripe: u64,
        col: u64,
        len: u64,
        from: DataFrom,
    ) -> Result<()> {
        let sm = v.geom.stripe_map(stripe);
        let dev = stripe * v.geom.chunk + col;
        if from == DataFrom::Members {
            return self.parity_streamed(v, &sm, stripe, col, len as usize);
        }
        let rows = self.read_rows(v, stripe, col, len, &vec![true; sm.data.len()])?;
        let (p, q) = parity_of(&sm, &rows, len as usize);
        rows.into_iter().for_each(scratch::give);
        if Core::writable(v, sm.p) {
            self.core.member_write(v, sm.p, &p, dev)?;
        }
        if let Some(qr) = sm.q.filter(|&qr| Core::writable(v, qr)) {
            self.core.member_write(v, qr, &q, dev)?;
        }
        Ok(())
    }

    pub(crate) fn read_parity_piece(&self, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        let (role, dev) = p.copies[0];
        if let Some(Ok(())) = self.core.member_read(v, role, dst, dev) {
            return Ok(());
        }
        // Missing or failing: rebuild the piece from the rest of its stripe
        // (read_rows tries the member once more and cures it if it can).
        let _g = self.core.lock(p.stripe);
        let k = v.geom.data_members();
        let mut need: Small<bool> = smallvec![false; k];
        need[p.dd] = true;
        let rows = self.read_rows(v, p.stripe, p.col, p.len, &need)?;
        dst.copy_from_slice(&rows[p.dd]);
        rows.into_iter().for_each(scratch::give);
        Ok(())
    }

    /// Read the data chunks marked in `need` of `stripe` over
    /// `[col, col + len)`, reconstructing any that are unavailable or fail
    /// to read; members that failed are cured from the result or failed.
    /// Rows not needed may come back empty. Call with the stripe locked.
    /// With checksums, over whole checksum blocks: a rebuild of part of a
    /// block cannot be checked against its checksum, and one from parity
    /// made over blocks nothing could rebuild (see `rows_as_they_lie`), or
    /// torn by a crash, would be served as it came out.
    pub(crate) fn read_rows(
        &self,
        v: &View,
        stripe: u64,
        col: u64,
        len: u64,
        need: &[bool],
    ) -> Result<Vec<Vec<u8>>> {
        let (a, b) = (col / BLOCK * BLOCK, (col + len).next_multiple_of(BLOCK));
        if !self.core.checksums || !v.geom.chunk.is_multiple_of(BLOCK) || (a, b) == (col, col + len)
        {
            return self.read_rows_exact(v, stripe, col, len, need);
        }
        let whole = self.read_rows_exact(v, stripe, a, b - a, need)?;
        let at = (col - a) as usize..(col - a + len) as usize;
        Ok(whole
            .into_iter()
            .map(|row| {
                if row.is_empty() {
                    return row;
                }
                let mut part = scratch::take(len as usize);
                part.copy_from_slice(&row[at.clone()]);
                scratch::give(row);
                part
            })
            .collect())
    }

    /// `read_rows` over exactly `[col, col + len)`.
    fn read_rows_exact(
        &self,
        v: &View,
        stripe: u64,
        col: u64,
        len: u64,
        need: &[bool],
    ) -> Result<Vec<Vec<u8>>> {
        let sm = v.geom.stripe_map(stripe);
        let k = sm.data.len();
        let dev = stripe * v.geom.chunk + col;
        let mut failed: Small<usize> = Small::new();
        let mut data: Vec<Option<Vec<u8>>> = vec![None; k];
        // Roles whose read failed on a checksum mismatch: a bad block, not
        // a bad member (the failure threshold deals with members that rot).
        let mismatched: std::sync::Mutex<Small<usize>> = Default::default();
        let read = |role: usize, failed: &mut Small<usize>| -> Option<Vec<u8>> {
            let mut b = scratch::take(len as usize);
            match self.core.member_read(v, role, &mut b, dev) {
                Some(Ok(())) => Some(b),
                Some(Err(e)) => {
                    scratch::give(b);
                    failed.push(role);
                    if crate::core::checked::is_mismatch(&e) {
                        mismatched.locked().push(role);
                    }
                    None
                }
                None => {
                    scratch::give(b);
                    None
                }
            }
        };
        let wanted: Small<usize> = (0..k).filter(|&d| need[d]).collect();
        if wanted.len() > 1 && !Self::page_cache_only(v) {
            // Disks: every row at once.
            let got = std::sync::Mutex::new((std::mem::take(&mut data), Small::new()));
            let _ = in_parallel(wanted, |dd| {
                let mut f = Small::new();
                let row = read(sm.data[dd], &mut f);
                let mut g = got.locked();
                g.0[dd] = row;
                g.1.extend(f);
                Ok(())
            });
            (data, failed) = got.into_inner().unwrap_or_else(|e| e.into_inner());
        } else {
            for dd in wanted {
                data[dd] = read(sm.data[dd], &mut failed);
            }
        }
        if (0..k).all(|d| !need[d] || data[d].is_some()) {
            return Ok(data.into_iter().map(Option::unwrap_or_default).collect());
        }
        for dd in 0..k {
            if data[dd].is_none() && !need[dd] {
                data[dd] = read(sm.data[dd], &mut failed);
            }
        }
        if self.unsynced_stripe(v, stripe) {
            // Its parity was never made consistent: what it would give is
            // garbage, so the data is unavailable until the resync comes.
            let mismatched = mismatched.locked();
            for &r in failed.iter().filter(|r| !mismatched.contains(r)) {
                if let Some(d) = &v.roles[r].disk {
                    self.core
                        .fail_disk_by_ptr(d, "read error in a stripe not yet synced");
                }
            }
            data.into_iter().flatten().for_each(scratch::give);
            let lost = (0..k).find(|&d| need[d]).unwrap_or(0);
            return Err(Error::Unavailable {
                offset: v.geom.stripe_data_offset(stripe, lost) + col,
                detail: format!(
                    "stripe {stripe} has not been synced yet, so it cannot be reconstructed"
                ),
            });
        }
        let p = read(sm.p, &mut failed);
        let q = sm.q.and_then(|q| read(q, &mut failed));
        // Data blocks a rebuild could not make: nothing can check what
        // parity would make of them (parity may have been made over what
        // the member holds there since), so they are solved for as
        // missing, never checked, served or written back; the rest of the
        // stripe is rebuilt around them and checked as ever. (A parity
        // block is whatever the data makes it: rewritten as ever.)
        let lost: Small<usize> = failed
            .iter()
            .copied()
            .filter(|&r| {
                sm.data.contains(&r)
                    && mismatched.locked().contains(&r)
                    && self.core.lost_in(v, r, dev, len)
            })
            .collect();
        let rows = match self.solve_checked(
            v,
            &sm,
            &data,
            p.as_deref(),
            q.as_deref(),
            &failed,
            &lost,
            len,
            dev,
        ) {
            Ok(rows) => rows,
            Err(why) => {
                data.into_iter().flatten().for_each(scratch::give);
                p.into_iter().chain(q).for_each(scratch::give);
                // Only blocks that disagree with their checksums, over more
                // than one block: each column may be short of fewer blocks
                // than the stripe has parity (rot on two members of a
                // RAID-5 stripe, at different offsets).
                let block_wise = {
                    let mm = mismatched.locked();
                    !mm.is_empty()
                        && failed.iter().all(|r| mm.contains(r))
                        && dev / BLOCK != (dev + len - 1) / BLOCK
                };
                if block_wise {
                    return self.read_rows_by_block(v, stripe, col, len, need);
                }
                let gone = match why {
                    Unsolved::Lost(gone) => gone,
                    Unsolved::Disagrees(role) => {
                        let lost = (0..k).find(|&d| sm.data[d] == role).unwrap_or(0);
                        return Err(Error::Unavailable {
                            offset: v.geom.stripe_data_offset(stripe, lost) + col,
                            detail: format!(
                                "stripe {stripe}: what redundancy rebuilds for role {role} disagrees with its checksum (more damage than the level can survive)"
                            ),
                        });
                    }
                };
                let mismatched = mismatched.locked();
                for &r in failed.iter().filter(|r| !mismatched.contains(r)) {
                    if let Some(d) = &v.roles[r].disk {
                        self.core
                            .fail_disk_by_ptr(d, "read error that redundancy could not cover");
                    }
                }
                self.core.ensure_alive(dev)?;
                let lost = (0..k).find(|&d| gone.contains(&sm.data[d])).unwrap_or(0);
                let bad = if mismatched.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (roles {}: blocks that disagree with their checksums)",
                        roles_list(mismatched.iter().copied())
                    )
                };
                return Err(Error::Unavailable {
                    offset: v.geom.stripe_data_offset(stripe, lost) + col,
                    detail: format!(
                        "roles {} of stripe {stripe} are missing or failing{bad}",
                        roles_list(gone.into_iter())
                    ),
                });
            }
        };
        data.into_iter().flatten().for_each(scratch::give);
        if let Some(dd) = (0..k).find(|&d| need[d] && lost.contains(&sm.data[d])) {
            p.into_iter().chain(q).for_each(scratch::give);
            rows.rows.into_iter().for_each(scratch::give);
            return Err(Error::Unavailable {
                offset: v.geom.stripe_data_offset(stripe, dd) + col,
                detail: format!(
                    "stripe {stripe}: role {}'s block is one a rebuild could not make (it reads as an error until written)",
                    sm.data[dd]
                ),
            });
        }
        if !failed.is_empty() || rows.parity_wrong {
            let (pp, qq) = parity_of(&sm, &rows.rows, len as usize);
            let mut fix: Small<usize> = failed
                .iter()
                .copied()
                .filter(|r| !lost.contains(r))
                .collect();
            if rows.parity_wrong {
                fix.extend(
                    std::iter::once(sm.p)
                        .chain(sm.q)
                        .filter(|r| !failed.contains(r)),
                );
            }
            for &r in &fix {
                let good: &[u8] = if r == sm.p {
                    &pp
                } else if Some(r) == sm.q {
                    &qq
                } else {
                    &rows.rows[sm.data.iter().position(|&x| x == r).expect("data role")]
                };
                self.core.repair(v, r, good, dev);
            }
        }
        p.into_iter().chain(q).for_each(scratch::give);
        Ok(rows.rows)
    }

    /// `read_rows`, one checksum block at a time. Call with the stripe
    /// locked.
    fn read_rows_by_block(
        &self,
        v: &View,
        stripe: u64,
        col: u64,
        len: u64,
        need: &[bool],
    ) -> Result<Vec<Vec<u8>>> {
        let base = stripe * v.geom.chunk;
        let mut out: Vec<Vec<u8>> = need
            .iter()
            .map(|&n| {
                if n {
                    scratch::take(len as usize)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let mut c = col;
        while c < col + len {
            let end = ((base + c) / BLOCK + 1) * BLOCK - base;
            let end = end.min(col + len);
            let rows = match self.read_rows(v, stripe, c, end - c, need) {
                Ok(rows) => rows,
                Err(e) => {
                    out.into_iter().for_each(scratch::give);
                    return Err(e);
                }
            };
            let at = (c - col) as usize..(end - col) as usize;
            for (o, r) in out.iter_mut().zip(&rows) {
                if !o.is_empty() {
                    o[at.clone()].copy_from_slice(r);
                }
            }
            rows.into_iter().for_each(scratch::give);
            c = end;
        }
        Ok(out)
    }

    /// `solve`, with every row rebuilt for a member that failed to read
    /// checked against that member's own checksums: a rebuild from parity
    /// that is itself stale (a write torn by a crash) must never be served
    /// or written back. On RAID-6 a rebuild through P that disagrees is
    /// tried through Q (P is then the one wrong). `data` is left as read.
    #[allow(clippy::too_many_arguments)]
    fn solve_checked(
        &self,
        v: &View,
        sm: &StripeMap,
        data: &[Option<Vec<u8>>],
        p: Option<&[u8]>,
        q: Option<&[u8]>,
        failed: &[usize],
        lost: &[usize],
        len: u64,
        dev: u64,
    ) -> std::result::Result<Solved, Unsolved> {
        // Through P (or whatever the stripe has), then, on RAID-6 with
        // both, through Q alone (P taken as the wrong one).
        let mut tries = vec![(p, q, false)];
        if p.is_some() && q.is_some() {
            tries.push((None, q, true));
        }
        let mut disagrees = None;
        for (p, q, parity_wrong) in tries {
            let rows = solve(sm, data.to_vec(), p, q, len as usize).map_err(Unsolved::Lost)?;
            let bad = sm.data.iter().enumerate().find(|&(dd, &r)| {
                failed.contains(&r) && !lost.contains(&r) && !self.core.agrees(v, r, &rows[dd], dev)
            });
            match bad {
                None => return Ok(Solved { rows, parity_wrong }),
                Some((_, &r)) => disagrees = Some(r),
            }
        }
        Err(Unsolved::Disagrees(disagrees.expect("tried at least once")))
    }

    /// Compute stripe `stripe`'s P (and Q) straight from the data chunks in
    /// the members' mappings into the parity chunks' mappings: no copy in
    /// or out, where `parity_from_members` reads the chunks back and writes
    /// the parity. Call with the stripe locked (nothing else in this
    /// program touches its chunks). false: a chunk is not cached or not in
    /// one mapped window, or a page faulted (a member file truncated or
    /// failing under the server; whatever was written is then overwritten
    /// by `parity_from_members`, which also reports the error).
    ///
    /// On checked members the files under the checks are used: the data
    /// chunks as they are (just written in place, their checksums taken
    /// from these same bytes under this stripe lock), the parity chunks
    /// held as writes in place, which records their checksums afterwards.
    pub(crate) fn parity_in_place(&self, v: &View, stripe: u64) -> bool {
        let sm = v.geom.stripe_map(stripe);
        let k = sm.data.len();
        let chunk = v.geom.chunk;
        let dev = stripe * chunk;
        let outs: Small<usize> = std::iter::once(sm.p).chain(sm.q).collect();
        let mut ranges = Vec::with_capacity(k + outs.len());
        // Checked parity members, held once every chunk is known mapped.
        let mut to_hold: Small<(&crate::core::checked::Checked, u64)> = Small::new();
        for (role, write) in sm
            .data
            .iter()
            .map(|&r| (r, false))
            .chain(outs.iter().map(|&r| (r, true)))
        {
            let Some(d) = &v.roles[role].disk else {
                return false;
            };
            let at = d.data_offset + dev;
            let m = match &d.checked {
                None => d.member.as_mapper(),
                Some(c) => {
                    if write {
                        to_hold.push((c.as_ref(), at));
                    }
                    c.inner().as_mapper()
                }
            };
            let Some(m) = m else {
                return false;
            };
            let had = ranges.len();
            let cached = if write {
                m.cached_for_write(at, chunk, &mut ranges)
            } else {
                m.cached(at, chunk, &mut ranges)
            };
            if !matches!(cached, Ok(true)) || ranges.len() != had + 1 {
                return false;
            }
        }
        // P and Q are held as writes in flight (their checksums recorded
        // from what lands) only now, so that a stripe that cannot go in
        // place costs no read-back of its parity.
        let mut held: Small<_> = Small::new();
        for &(c, at) in &to_hold {
            match c.in_place(at, chunk) {
                Ok(Some(g)) => held.push(g),
                _ => {
                    held.iter_mut().for_each(|g| g.nothing_written());
                    return false;
                }
            }
        }
        seams::before_parity_in_place();
        let isa = parity::Isa::best();
        let mut refs: Small<&[u8]> = smallvec![&[][..]; k];
        for (dd, r) in ranges[..k].iter().enumerate() {
            // SAFETY: read inside `guarded` below; the stripe lock keeps
            // every writer in this program off the chunk.
            refs[sm.syndrome[dd]] = unsafe { r.bytes() };
        }
        // SAFETY: as above; P and Q are other members' chunks than the
        // data, so these are the only slices of their bytes.
        let (p, mut q) = unsafe {
            (
                ranges[k].bytes_mut(),
                ranges.get(k + 1).map(|r| r.bytes_mut()),
            )
        };
        // SAFETY: the closure only runs the parity kernels over slices set
        // up beforehand, which allocate nothing and hold no guards.
        let done = unsafe {
            raidkit_member::guarded(&mut || match q.as_deref_mut() {
                Some(q) => parity::gen_pq_with(isa, &refs, p, q),
                None => parity::gen_p_with(isa, &refs, p),
            })
        };
        seams::parity_in_place(done.is_ok());
        drop(held);
        done.is_ok()
    }

    /// `recompute_parity` from the members as they are: the data read a
    /// column at a time into buffers kept per thread, P and Q generated
    /// over each column.
    fn parity_streamed(
        &self,
        v: &View,
        sm: &StripeMap,
        stripe: u64,
        col0: u64,
        len: usize,
    ) -> Result<()> {
        let k = sm.data.len();
        let chunk = v.geom.chunk as usize;
        let dev = stripe * chunk as u64 + col0;
        let col = COLUMN.min(len);
        // Buffers of the sizes this needs, not ones of other sizes from the
        // shared scratch pool, which would be zero-filled to size each time.
        thread_local! {
            static BUFS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut bufs = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
        bufs.resize_with(k + 2, Vec::new);
        for (i, b) in bufs.iter_mut().enumerate() {
            let want = if i < k { col } else { len };
            if b.len() != want {
                b.resize(want, 0);
            }
        }
        let mut qbuf = bufs.pop().filter(|_| sm.q.is_some());
        let mut pbuf = bufs.pop().expect("P buffer");
        let mut rows = bufs;
        let mut done = Ok(());
        let mut at = 0;
        'columns: while at < len {
            let n = col.min(len - at);
            for (dd, row) in rows.iter_mut().enumerate() {
                let role = sm.data[dd];
                match self
                    .core
                    .member_read(v, role, &mut row[..n], dev + at as u64)
                {
                    Some(Ok(())) => {}
                    failed => {
                        let why = match failed {
                            Some(Err(e)) => e.to_string(),
                            _ => "not readable".into(),
                        };
                        if let Some(d) = &v.roles[role].disk {
                            self.core
                                .fail_disk_by_ptr(d, &format!("reading back a stripe: {why}"));
                        }
                        done = Err(Error::Unavailable {
                            offset: v.geom.stripe_data_offset(stripe, dd) + col0 + at as u64,
                            detail: format!("reading back role {role}: {why}"),
                        });
                        break 'columns;
                    }
                }
            }
            let by_dd: Small<&[u8]> = rows.iter().map(|r| &r[..n]).collect();
            let mut refs: Small<&[u8]> = smallvec![&[][..]; k];
            for (dd, d) in by_dd.iter().enumerate() {
                refs[sm.syndrome[dd]] = d;
            }
            match qbuf.as_mut() {
                Some(q) => parity::gen_pq(&refs, &mut pbuf[at..at + n], &mut q[at..at + n]),
                None => parity::gen_p(&refs, &mut pbuf[at..at + n]),
            }
            at += n;
        }
        let done = done
            .and_then(|()| self.core.member_write(v, sm.p, &pbuf, dev))
            .and_then(|()| match (sm.q, &qbuf) {
                (Some(role), Some(q)) => self.core.member_write(v, role, q, dev),
                _ => Ok(()),
            });
        let mut bufs = rows;
        bufs.push(pbuf);
        bufs.push(qbuf.unwrap_or_default());
        BUFS.with(|b| *b.borrow_mut() = bufs);
        done
    }
}

/// Data rows rebuilt and checked (`Array::solve_checked`).
struct Solved {
    rows: Vec<Vec<u8>>,
    /// Rebuilt through Q because P gave a row that disagrees with its
    /// checksum: P (and Q, recomputed alike) must be rewritten.
    parity_wrong: bool,
}

/// Why a stripe's data could not be had.
enum Unsolved {
    /// These roles are missing or failing, more than the level covers.
    Lost(Vec<usize>),
    /// What redundancy gives for this role disagrees with its checksum.
    Disagrees(usize),
}

/// Rebuild the data rows of a stripe (in dd order) from what could be
/// read: `data[dd]` None where lost, P and Q where available. Works in
/// syndrome order so that Q-based recovery sees md's indices.
pub(crate) fn solve(
    sm: &StripeMap,
    mut data: Vec<Option<Vec<u8>>>,
    p: Option<&[u8]>,
    q: Option<&[u8]>,
    len: usize,
) -> std::result::Result<Vec<Vec<u8>>, Vec<usize>> {
    let k = sm.data.len();
    let lost: Small<usize> = (0..k).filter(|&d| data[d].is_none()).collect();
    let mut syn: Vec<Vec<u8>> = vec![Vec::new(); k];
    for dd in 0..k {
        syn[sm.syndrome[dd]] = data[dd].take().unwrap_or_else(|| vec![0; len]);
    }
    let s = |dd: usize| sm.syndrome[dd];
    match (lost.as_slice(), p, q) {
        ([], _, _) => {}
        ([x], Some(p), _) => parity::recover_data_p(&mut syn, s(*x), p),
        ([x], None, Some(q)) => parity::recover_data_q(&mut syn, s(*x), q),
        ([x, y], Some(p), Some(q)) => parity::recover_two_data(&mut syn, s(*x), s(*y), p, q),
        _ => {
            let mut gone: Vec<usize> = lost.iter().map(|&d| sm.data[d]).collect();
            if p.is_none() {
                gone.push(sm.p);
            }
            if let (Some(qr), None) = (sm.q, q) {
                gone.push(qr);
            }
            gone.sort_unstable();
            return Err(gone);
        }
    }
    let mut out = vec![Vec::new(); k];
    for dd in 0..k {
        out[dd] = std::mem::take(&mut syn[sm.syndrome[dd]]);
    }
    Ok(out)
}

/// P and Q of full data rows (given in dd order).
pub(crate) fn parity_of(sm: &StripeMap, rows: &[Vec<u8>], len: usize) -> (Vec<u8>, Vec<u8>) {
    let k = sm.data.len();
    let mut order: Small<&[u8]> = smallvec![&[][..]; k];
    for dd in 0..k {
        order[sm.syndrome[dd]] = &rows[dd];
    }
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    parity::gen_pq(&order, &mut p, &mut q);
    (p, q)
}

/// P (and Q) of one column of a full stripe, from each data chunk's
/// `cols` (by data index), into the same columns of `p` and `q`.
pub(crate) fn column_parity(
    sm: &StripeMap,
    by_dd: &[&[u8]],
    cols: std::ops::Range<usize>,
    p: &mut [u8],
    q: Option<&mut [u8]>,
) {
    let mut refs: Small<&[u8]> = smallvec![&[][..]; by_dd.len()];
    for (dd, d) in by_dd.iter().enumerate() {
        refs[sm.syndrome[dd]] = &d[cols.clone()];
    }
    match q {
        Some(q) => parity::gen_pq(&refs, &mut p[cols.clone()], &mut q[cols]),
        None => parity::gen_p(&refs, &mut p[cols]),
    }
}

/// Whole rows (stripes) `[s0, s0 + rows)` of `g` laid out per member, as
/// each member holds them one after the other: `pieces` (covering the rows'
/// data whole, in order) copied from `src`, and for parity levels P and Q
/// computed from them. `per[role]` must be `rows` chunks long.
pub(crate) fn member_rows<'a>(
    g: &Geometry,
    s0: u64,
    pieces: &[Piece],
    src: &dyn Fn(&Piece) -> &'a [u8],
    per: &mut [Vec<u8>],
) {
    let c = g.chunk as usize;
    let rows = per.first().map_or(0, |b| b.len() / c);
    for piece in pieces {
        let (role, dev) = piece.copies[0];
        let at = (dev - s0 * g.chunk) as usize;
        per[role][at..at + piece.len as usize].copy_from_slice(src(piece));
    }
    if !g.level.is_parity() {
        return;
    }
    for row in 0..rows {
        let sm = g.stripe_map(s0 + row as u64);
        let at = row * c..(row + 1) * c;
        let mut pb = std::mem::take(&mut per[sm.p]);
        let mut qb = sm.q.map(|r| std::mem::take(&mut per[r]));
        {
            let by_dd: Small<&[u8]> = sm.data.iter().map(|&r| &per[r][at.clone()]).collect();
            column_parity(
                &sm,
                &by_dd,
                0..c,
                &mut pb[at.clone()],
                qb.as_mut().map(|b| &mut b[at.clone()]),
            );
        }
        per[sm.p] = pb;
        if let (Some(r), Some(b)) = (sm.q, qb) {
            per[r] = b;
        }
    }
}
