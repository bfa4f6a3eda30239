//! Mirrored levels (RAID-1, RAID-10): which copy serves a read, reads
//! that fall back to the other copies and repair the bad one, and writes
//! to every copy under the chunk's lock.

use super::*;

impl Array {
    /// The copies of a piece (role, device offset) in the order reads try
    /// them: mirrors take turns by chunk (md's read balancing, simplified),
    /// so sequential reads use every member. Other levels have one copy.
    pub(crate) fn copy_order<'p>(&self, p: &'p Piece) -> impl Iterator<Item = (usize, u64)> + 'p {
        let unit = p.logical / self.geom.chunk;
        // Copies not yet synced may differ: the first one is the one the
        // resync copies to the others, so every read returns it.
        let start = if self.unsynced(unit) {
            0
        } else {
            unit as usize % p.copies.len()
        };
        p.copies[start..].iter().chain(&p.copies[..start]).copied()
    }

    /// The role a read of a piece tries first.
    pub(crate) fn first_copy(&self, p: &Piece) -> usize {
        self.copy_order(p).next().expect("a piece has a copy").0
    }

    pub(crate) fn read_copies(&self, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        let mut bad: Small<usize> = Small::new();
        let mut last_err = None;
        let mut done = false;
        for (role, dev) in self.copy_order(p) {
            match self.member_read(v, role, dst, dev) {
                Some(Ok(())) => {
                    done = true;
                    break;
                }
                Some(Err(e)) => {
                    bad.push(role);
                    last_err = Some(e)
                }
                None => {}
            }
        }
        if done && !bad.is_empty() {
            // Cure the copies that failed, from a copy read under the lock
            // (so no write slips in between).
            let _g = self.lock(p.logical / self.geom.chunk);
            let mut good = scratch::take(dst.len());
            let src = p
                .copies
                .iter()
                .find(|&&(r, d)| !bad.contains(&r) && Self::readable(v, r, d, p.len).is_some());
            if let Some(&(r, dev)) = src {
                if let Some(Ok(())) = self.member_read(v, r, &mut good, dev) {
                    for &(br, bdev) in p.copies.iter().filter(|(r, _)| bad.contains(r)) {
                        self.repair(v, br, &good, bdev);
                    }
                }
            }
            scratch::give(good);
        }
        if done {
            return Ok(());
        }
        for &role in &bad {
            if let Some(d) = &v.roles[role].disk {
                self.fail_disk_by_ptr(d, "read error with no copy to cure it from");
            }
        }
        self.ensure_alive(p.logical)?;
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

    /// A large mirrored write: every chunk of it locked (in lock order),
    /// then each member writes all the copies it holds, in device order, by
    /// its own thread: one stream per disk, no seeking between copies.
    pub(crate) fn write_mirrored_parallel<'a>(
        &self,
        pieces: &'a [Piece],
        src: &dyn Fn(&'a Piece) -> &'a [u8],
    ) -> Result<()> {
        let chunk = self.geom.chunk;
        let first = pieces.first().expect("pieces");
        let last = pieces.last().expect("pieces");
        seams::before_stripe_lock();
        let _locks = self.lock_range(
            first.logical / chunk,
            (last.logical + last.len - 1) / chunk + 1,
        );
        let v: &View = &self.view_under_lock();
        let mut per_role: Vec<Vec<(u64, &[u8])>> =
            (0..self.geom.members()).map(|_| Vec::new()).collect();
        for p in pieces {
            let mut any = false;
            for &(role, dev) in &p.copies {
                if Self::writable(v, role) {
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
        in_parallel(streams, |(role, mut list)| {
            list.sort_by_key(|&(dev, _)| dev);
            list.into_iter()
                .try_for_each(|(dev, data)| self.member_write(v, role, data, dev))
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
        let _g = mirrored.then(|| self.lock(p.logical / self.geom.chunk));
        let now = mirrored.then(|| self.view_under_lock());
        let v: &View = now.as_deref().unwrap_or(v);
        let targets: Small<(usize, u64)> = p
            .copies
            .iter()
            .copied()
            .filter(|&(role, _)| Self::writable(v, role))
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
            return in_parallel(targets, |(role, dev)| self.member_write(v, role, data, dev));
        }
        for &(role, dev) in &targets {
            self.member_write(v, role, data, dev)?;
        }
        Ok(())
    }
}
