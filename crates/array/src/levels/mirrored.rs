//! Mirrored levels (RAID-1, RAID-10): which copy serves a read, reads
//! that fall back to the other copies and repair the bad one, writes to
//! every copy under the chunk's lock; a member rebuilt chunk by chunk from
//! another copy, copies made equal (resync) and compared (check). The
//! copies code serves the striped levels too (one copy).

use super::LevelOps;
use crate::background::{windows, Process};
use crate::core::checked::is_mismatch;
use crate::core::{Core, Disk, View};
use crate::engine::{in_parallel, roles_list, write_in_runs, Array, Mismatch, Small, PARALLEL_IO};
use crate::error::{Error, Result};
use crate::metadata::checksums::BLOCK;
use crate::recovery::{Job, Outcome};
use crate::{scratch, seams};
use raidkit_layout::{Level, Piece};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct Mirrored;

impl LevelOps for Mirrored {
    fn read_piece(&self, a: &Array, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        a.read_copies(v, p, dst)
    }

    fn read_role(&self, a: &Array, v: &View, p: &Piece) -> usize {
        a.read_order(v, p, None)[0].0
    }

    fn read_piece_on(
        &self,
        a: &Array,
        v: &View,
        p: &Piece,
        dst: &mut [u8],
        role: usize,
    ) -> Result<()> {
        a.read_copies_from(v, p, dst, Some(role))
    }

    fn write<'a>(
        &self,
        a: &Array,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
        len: usize,
    ) -> Result<()> {
        if len >= PARALLEL_IO && pieces.len() > 1 {
            return a.write_mirrored_parallel(pieces, src);
        }
        pieces
            .iter()
            .try_for_each(|p| a.write_copies(v, p, src(p), true))
    }

    fn discard(&self, a: &Array, v: &View, pieces: &[Piece]) -> Result<Option<(u64, u64)>> {
        // Every copy under the chunk's lock, as a write: they stay equal.
        for p in pieces {
            let _g = a.core.lock(p.logical / a.core.geom().chunk);
            let v = a.core.view_under_lock(v);
            for &(role, dev) in &p.copies {
                a.core.member_discard(&v, role, dev, p.len)?;
            }
        }
        Ok(super::span(pieces))
    }

    fn units(&self, a: &Array) -> u64 {
        a.core.capacity() / a.core.geom().chunk
    }

    fn unit_in(&self, a: &Array, u: u64, marked: &dyn Fn(u64, u64) -> bool) -> bool {
        let chunk = a.core.geom().chunk;
        a.core.geom().pieces(u * chunk, chunk)[0]
            .copies
            .iter()
            .any(|&(_, d)| marked(d, d + chunk))
    }

    fn resync_unit(&self, a: &Array, v: &View, u: u64) -> Result<()> {
        // The first copy is the one reads return while unsynced.
        let chunk = a.core.geom().chunk;
        let p = &a.core.geom().pieces(u * chunk, chunk)[0];
        // The first copy that can be read there, as reads take it (a
        // member lost during the resync leaves the others to agree).
        let Some((src, r0, d0)) = p
            .copies
            .iter()
            .find_map(|&(r, d)| Core::readable(v, r, d, p.len).map(|disk| (disk, r, d)))
        else {
            // No copy left: nothing to make agree (reads fail there).
            return Ok(());
        };
        let mut buf = scratch::take(chunk as usize);
        // In a crash window the read may put rotten blocks of the first
        // copy back from the others (`Core::window_heal`), in memory only:
        // the resync writes them back after this (`write_back_healed`).
        let r = a
            .core
            .disk_read(src, &mut buf, d0)
            .map_err(Error::from)
            .and_then(|()| {
                p.copies
                    .iter()
                    .filter(|&&(r, d)| (r, d) != (r0, d0))
                    .try_for_each(|&(r, d)| a.core.member_write(v, r, &buf, d))
            });
        scratch::give(buf);
        r
    }

    fn check_unit(
        &self,
        a: &Array,
        v: &View,
        u: u64,
        each: &mut dyn FnMut(Mismatch),
    ) -> Result<u64> {
        let g = &a.core.geom();
        let chunk = g.chunk;
        let p = &g.pieces(u * chunk, chunk)[0];
        let (r0, d0) = p.copies[0];
        let mut first = scratch::take(chunk as usize);
        let mut other = scratch::take(chunk as usize);
        let r = (|| {
            read_in_sync(&a.core, v, r0, &mut first, d0)?;
            let mut bad = 0;
            let mut differ = Vec::new();
            for &(r, d) in &p.copies[1..] {
                read_in_sync(&a.core, v, r, &mut other, d)?;
                if other != first {
                    differ.push((r, d));
                }
            }
            if g.level == Level::Raid1 {
                // Which copy is right cannot be told: every role is named.
                if !differ.is_empty() {
                    bad += 1;
                    each(Mismatch {
                        unit: u,
                        array_offset: u * chunk,
                        member_offset: d0,
                        roles: p.copies.iter().map(|c| c.0).collect(),
                    });
                }
            } else {
                for (r, _) in differ {
                    bad += 1;
                    each(Mismatch {
                        unit: u,
                        array_offset: u * chunk,
                        member_offset: d0,
                        roles: vec![r0, r],
                    });
                }
            }
            Ok(bad)
        })();
        scratch::give(first);
        scratch::give(other);
        r
    }

    fn rebuild(&self, a: &Array, job: &Job, total: u64, process: &mut Process) -> Result<Outcome> {
        let chunk = a.core.geom().chunk;
        let batch = ((1u64 << 20) / chunk).max(1);
        loop {
            if let Some(end) = a.interrupted(job, process)? {
                return Ok(end);
            }
            let cursor = job.sync.cursor.load(Ordering::Acquire);
            let dirty = |s: u64| {
                job.sync
                    .dirty
                    .as_ref()
                    .is_none_or(|d| d.overlaps(s * chunk, (s + 1) * chunk))
            };
            let Some((s0, s1)) = windows(cursor / chunk, total / chunk, batch, dirty).next() else {
                job.sync.cursor.store(total, Ordering::Release);
                return Ok(Outcome::Done);
            };
            let Some(bytes) = a.rebuild_mirror_batch(job, s0, s1)? else {
                continue;
            };
            if process.checkpoint_due() {
                a.checkpoint(job)?;
            }
            process.advance(bytes);
        }
    }
}

/// Read from a member that must be in service and in sync.
pub(crate) fn read_in_sync(
    core: &Core,
    v: &View,
    role: usize,
    buf: &mut [u8],
    dev: u64,
) -> Result<()> {
    Ok(core
        .member_read(v, role, buf, dev)
        .expect("every member in sync")?)
}

impl Array {
    /// The copies of a piece (role, device offset) in turn order: mirrors
    /// take turns by chunk, so that one sequential reader uses every copy
    /// on devices that do not seek (see `read_order` for those that do).
    /// Other levels have one copy.
    pub(crate) fn copy_order<'p>(&self, p: &'p Piece) -> impl Iterator<Item = (usize, u64)> + 'p {
        let unit = p.logical / self.core.geom().chunk;
        // Where copies may differ, the first one is the one the resync
        // copies to the others, so every read returns it.
        let start = if p.copies.len() < 2 || self.copies_may_differ(p) {
            0
        } else {
            unit as usize % p.copies.len()
        };
        p.copies[start..].iter().chain(&p.copies[..start]).copied()
    }

    /// The copy of `p` on spinning disks that a read goes to, as md's
    /// RAID-10 chooses among near copies (raid10.c `read_balance`): a
    /// copy whose disk has nothing under way, else any; among those, the
    /// one whose head is nearest, so that a sequential reader's next piece
    /// goes where its disk's head already is (taking turns by chunk, each
    /// disk would skip every other chunk, and two readers would seek
    /// between each other's pieces). Its head then moves to the end of the
    /// read. md's RAID-1 keeps a sequential reader on its disk even when
    /// another is idle; an idle copy is taken here too, which measured
    /// better on simulated disks (docs/sweep/README.md). None where some
    /// copy is not on a spinning disk (or not known to be one): reads take
    /// turns there, which gives one reader the bandwidth of every copy on
    /// devices that do not seek.
    fn nearest_head(&self, v: &View, p: &Piece) -> Option<usize> {
        if p.copies.len() < 2 {
            return None;
        }
        let mut best: Option<((bool, u64), &Disk, usize)> = None;
        for (role, dev) in self.copy_order(p) {
            let Some(d) = Core::readable(v, role, dev, p.len) else {
                continue;
            };
            if d.rotational != Some(true) {
                return None;
            }
            let dist = d.read_head.load(Ordering::Relaxed).abs_diff(dev);
            let key = (d.busy(), dist);
            // Ties keep the turn's order.
            if best.is_none_or(|b| key < b.0) {
                best = Some((key, d, role));
            }
        }
        let (_, d, role) = best?;
        let dev = p.dev_on(role).expect("a copy");
        d.read_head.store(dev + p.len, Ordering::Relaxed);
        Some(role)
    }

    /// The copies in the order a read tries them: `first` (a role chosen
    /// before) or on spinning disks the one `nearest_head` chooses first,
    /// else `copy_order`; a copy on a slow member (one much slower than
    /// its peers, such as a remote member behind a congested link) goes
    /// last while another is fine, as md's failfast: a read is not made to
    /// wait on it. Not where copies may still differ (the first one is the
    /// truth there).
    fn read_order(&self, v: &View, p: &Piece, first: Option<usize>) -> Small<(usize, u64)> {
        let mut order: Small<(usize, u64)> = self.copy_order(p).collect();
        if order.len() < 2 || self.copies_may_differ(p) {
            return order;
        }
        if let Some(role) = first.or_else(|| self.nearest_head(v, p)) {
            let i = order.iter().position(|c| c.0 == role).expect("a copy");
            order[..=i].rotate_right(1);
        }
        let slow = |&(role, _): &(usize, u64)| {
            v.roles[role]
                .disk
                .as_ref()
                .is_some_and(|d| d.slow().is_some())
        };
        if !order.iter().any(slow) || order.iter().all(slow) {
            return order;
        }
        let (mut fine, late): (Small<_>, Small<_>) = order.into_iter().partition(|c| !slow(c));
        fine.extend(late);
        fine
    }

    pub(crate) fn read_copies(&self, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        self.read_copies_from(v, p, dst, None)
    }

    /// Read a piece from its copies, `first` (or as `read_order` says)
    /// first; the copies that failed are cured from one that did not.
    pub(crate) fn read_copies_from(
        &self,
        v: &View,
        p: &Piece,
        dst: &mut [u8],
        first: Option<usize>,
    ) -> Result<()> {
        let mut bad: Small<usize> = Small::new();
        let mut mismatched: Small<usize> = Small::new();
        let mut last_err = None;
        let mut done = false;
        for &(role, dev) in self.read_order(v, p, first).iter() {
            match self.core.member_read(v, role, dst, dev) {
                Some(Ok(())) => {
                    done = true;
                    break;
                }
                Some(Err(e)) => {
                    bad.push(role);
                    if crate::core::checked::is_mismatch(&e) {
                        mismatched.push(role);
                    }
                    last_err = Some(e)
                }
                None => {}
            }
        }
        if done {
            self.cure(v, p, &bad);
            return Ok(());
        }
        // Rot in every copy, but maybe in different blocks: each block is
        // read from a copy that has it right (and the others cured), as a
        // parity level rebuilds block by block. Only a block bad in every
        // copy fails the read.
        if !mismatched.is_empty() && p.len > BLOCK && self.read_block_by_block(v, p, dst, &bad) {
            return Ok(());
        }
        // A bad block is not a bad member (see the failure threshold).
        for &role in bad.iter().filter(|r| !mismatched.contains(r)) {
            if let Some(d) = &v.roles[role].disk {
                self.core
                    .fail_disk_by_ptr(d, "read error with no copy to cure it from");
            }
        }
        self.core.ensure_alive(p.logical)?;
        Err(match last_err {
            Some(e) => e.into(),
            None => Error::Unavailable {
                offset: p.logical,
                detail: format!(
                    "no member holds it (role(s) {} missing)",
                    roles_list(p.copies.iter().map(|c| c.0))
                ),
            },
        })
    }

    /// Cure the copies of `p` on the roles `bad` (whose reads failed) from
    /// a copy read under the chunk's lock, so that no write slips in
    /// between.
    fn cure(&self, v: &View, p: &Piece, bad: &[usize]) {
        if bad.is_empty() {
            return;
        }
        let _g = self.core.lock(p.logical / self.core.geom().chunk);
        let mut good = scratch::take(p.len as usize);
        let src = p
            .copies
            .iter()
            .find(|&&(r, d)| !bad.contains(&r) && Core::readable(v, r, d, p.len).is_some());
        if let Some(&(r, dev)) = src {
            if let Some(Ok(())) = self.core.member_read(v, r, &mut good, dev) {
                for &(br, bdev) in p.copies.iter().filter(|(r, _)| bad.contains(r)) {
                    self.core.repair(v, br, &good, bdev);
                }
            }
        }
        scratch::give(good);
    }

    /// `p` read in pieces of at most one checksum block (aligned as the
    /// blocks are: every copy of a piece lies at the same offset within its
    /// chunk), each from a copy that has it right; the copies whose whole
    /// read failed (`suspects`) are each read block by block too, and
    /// cured where they are wrong. Whether every block was read.
    fn read_block_by_block(&self, v: &View, p: &Piece, dst: &mut [u8], suspects: &[usize]) -> bool {
        let mut k = 0;
        while k < p.len {
            let at = p.logical + k;
            let n = (BLOCK - at % BLOCK).min(p.len - k);
            let sub = Piece {
                logical: at,
                len: n,
                col: p.col + k,
                copies: p.copies.iter().map(|&(r, dev)| (r, dev + k)).collect(),
                ..p.clone()
            };
            let part = &mut dst[k as usize..(k + n) as usize];
            let mut read = false;
            let mut bad: Small<usize> = Small::new();
            let mut other = scratch::take(n as usize);
            for &(role, dev) in sub.copies.iter() {
                // Once the block is read, only the suspects are read on,
                // to find what to cure.
                let into: &mut [u8] = if read {
                    if !suspects.contains(&role) {
                        continue;
                    }
                    &mut other
                } else {
                    part
                };
                match self.core.member_read(v, role, into, dev) {
                    Some(Ok(())) => read = true,
                    Some(Err(_)) => bad.push(role),
                    None => {}
                }
            }
            scratch::give(other);
            if !read {
                return false;
            }
            self.cure(v, &sub, &bad);
            k += n;
        }
        true
    }

    /// A large mirrored write: every chunk of it locked (in lock order),
    /// then each member writes all the copies it holds, in device order, by
    /// its own thread: one stream per disk, no seeking between copies.
    pub(crate) fn write_mirrored_parallel<'a>(
        &self,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
    ) -> Result<()> {
        let chunk = self.core.geom().chunk;
        let first = pieces.first().expect("pieces");
        let last = pieces.last().expect("pieces");
        seams::before_stripe_lock();
        let _locks = self.core.lock_range(
            first.logical / chunk,
            (last.logical + last.len - 1) / chunk + 1,
        );
        let v: &View = &self.core.view.load_full();
        let mut per_role: Vec<Vec<(u64, &[u8])>> = (0..self.core.geom().members())
            .map(|_| Vec::new())
            .collect();
        for p in pieces {
            let mut any = false;
            for &(role, dev) in &p.copies {
                if Core::writable(v, role) {
                    per_role[role].push((dev, src(p)));
                    any = true;
                }
            }
            if !any {
                return Err(Error::Unavailable {
                    offset: p.logical,
                    detail: format!(
                        "no member to write to (role(s) {} missing)",
                        roles_list(p.copies.iter().map(|c| c.0))
                    ),
                });
            }
        }
        let streams = per_role
            .into_iter()
            .enumerate()
            .filter(|(_, list)| !list.is_empty());
        let merge = !Self::page_cache_only(v);
        in_parallel(streams, |(role, mut list)| {
            list.sort_by_key(|&(dev, _)| dev);
            if merge {
                // The copies a member holds, one after the other on it, as
                // one request.
                return write_in_runs(
                    list,
                    |e| e.0,
                    |e| e.1,
                    |_, dev, d| self.core.member_write(v, role, d, dev),
                );
            }
            list.into_iter()
                .try_for_each(|(dev, data)| self.core.member_write(v, role, data, dev))
        })
    }

    /// Write one piece of a non-parity level to every copy.
    pub(crate) fn write_copies(
        &self,
        v: &View,
        p: &Piece,
        data: &[u8],
        mirrored: bool,
    ) -> Result<()> {
        seams::before_stripe_lock();
        // Mirrors must not diverge under concurrent writes to one chunk.
        let _g = mirrored.then(|| self.core.lock(p.logical / self.core.geom().chunk));
        let now = mirrored.then(|| self.core.view_under_lock(v));
        let v: &View = now.as_deref().unwrap_or(v);
        let targets: Small<(usize, u64)> = p
            .copies
            .iter()
            .copied()
            .filter(|&(role, _)| Core::writable(v, role))
            .collect();
        if targets.is_empty() {
            return Err(Error::Unavailable {
                offset: p.logical,
                detail: format!(
                    "no member to write to (role(s) {} missing)",
                    roles_list(p.copies.iter().map(|c| c.0))
                ),
            });
        }
        if targets.len() > 1 && data.len() >= 64 << 10 {
            // Large mirror writes: every copy at once.
            return in_parallel(targets, |(role, dev)| {
                self.core.member_write(v, role, data, dev)
            });
        }
        for &(role, dev) in &targets {
            self.core.member_write(v, role, data, dev)?;
        }
        Ok(())
    }

    /// Fill `buf` block by block from the first of `srcs` (member, offset
    /// of `buf`'s start) whose block agrees with its checksum; the offsets
    /// of blocks no copy has right are zeroed and returned.
    fn read_around_bad(&self, srcs: &[(Arc<Disk>, u64)], buf: &mut [u8]) -> Vec<u64> {
        let mut lost = Vec::new();
        for (k, blk) in buf.chunks_mut(BLOCK as usize).enumerate() {
            let at = k as u64 * BLOCK;
            if !srcs
                .iter()
                .any(|(d, dev)| self.core.disk_read(d, blk, dev + at).is_ok())
            {
                blk.fill(0);
                lost.push(at);
            }
        }
        lost
    }

    /// Rebuild chunk rows `[s0, s1)` of a mirror member from another copy.
    pub(crate) fn rebuild_mirror_batch(&self, job: &Job, s0: u64, s1: u64) -> Result<Option<u64>> {
        let chunk = self.core.geom().chunk;
        let mut done = 0;
        let mut buf = vec![0u8; chunk as usize];
        for row in s0..s1 {
            let dev = row * chunk;
            let Some(c) = self.core.geom().mirror_chunk_at(job.role, row) else {
                job.sync.cursor.store(dev + chunk, Ordering::Release);
                continue;
            };
            let _g = self.core.lock(c);
            let v = self.core.view.load_full();
            if !job.current(&v) {
                return Ok(Some(done));
            }
            let p = &self.core.geom().pieces(c * chunk, chunk)[0];
            let srcs: Vec<(Arc<Disk>, u64)> = p
                .copies
                .iter()
                .filter_map(|&(r, d)| {
                    let rv = &v.roles[r];
                    if r == job.role && !job.replace {
                        return None;
                    }
                    match (&rv.disk, &rv.sync) {
                        (Some(disk), None) => Some((disk.clone(), d)),
                        _ => None,
                    }
                })
                .collect();
            let Some((sd, sdev)) = srcs.first().cloned() else {
                return Err(Error::Unavailable {
                    offset: c * chunk,
                    detail: format!("no in-sync copy to rebuild role {} from", job.role),
                });
            };
            let mut lost = Vec::new();
            match self.core.disk_read(&sd, &mut buf, sdev) {
                Ok(()) => {}
                // Bad blocks, not a bad member: block by block from
                // whichever copy has each right.
                Err(e) if is_mismatch(&e) => lost = self.read_around_bad(&srcs, &mut buf),
                Err(e) => {
                    drop(_g);
                    self.core.fail_disk_by_ptr(&sd, &e.to_string());
                    self.core.ensure_alive(c * chunk)?;
                    return Ok(None);
                }
            }
            let t = &job.target;
            if let Err(e) = self
                .core
                .disk_write(t, &buf, dev)
                .and_then(|()| self.mark_lost(job, dev, &lost))
            {
                drop(_g);
                self.core.fail_disk_by_ptr(t, &e.to_string());
                return Ok(Some(done));
            }
            job.sync.cursor.store(dev + chunk, Ordering::Release);
            done += chunk;
        }
        Ok(Some(done))
    }
}
