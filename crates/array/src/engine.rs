//! The array engine: logical reads and writes turned into member I/O, with
//! parity kept consistent and degraded operation where the level allows.
//!
//! An [`Array`] is itself a [`Member`], so arrays nest (RAID-50, RAID-60).

use crate::assemble::{Absence, Assembly, Health};
use crate::error::{Error, Result};
use crate::superblock::{write_superblock, ArrayState, Role, RoleState, Superblock};
use raidkit_layout::{Geometry, Level, Piece};
use raidkit_member::{Member, MemberError, Op};
use raidkit_parity as parity;
use smallvec::{smallvec, SmallVec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Per-stripe scratch lists, inline for up to 16 members (no allocation).
type Small<T> = SmallVec<[T; 16]>;

/// Column width for full-stripe writes (see `write_full_stripe`).
const COLUMN: usize = 128 << 10;

/// Stripe locks: a fixed table hashed by stripe number keeps unrelated
/// stripes concurrent while serialising updates of the same stripe.
const LOCKS: usize = 1024;

#[derive(Debug)]
struct IoSlot {
    member: Option<Arc<dyn Member>>,
    data_offset: u64,
}

#[derive(Debug)]
struct Meta {
    /// The array-wide superblock content (role table, events, state).
    sb: Superblock,
    /// Each present member's own superblock (its uuid, role, sizes, seq).
    member_sbs: Vec<Option<Superblock>>,
}

/// An assembled, running array.
#[derive(Debug)]
pub struct Array {
    name: String,
    geom: Geometry,
    slots: Vec<IoSlot>,
    meta: Mutex<Meta>,
    /// Set once the superblocks say dirty (and record missing members).
    write_ready: AtomicBool,
    read_only: bool,
    locks: Box<[Mutex<()>]>,
    /// Why each absent role is absent (for status reports).
    absence: Vec<Option<Absence>>,
    spares: Vec<String>,
}

/// One member's line in a status report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    /// The member's name (path); None for a role with no member.
    pub path: Option<String>,
    /// The role number; None for a spare.
    pub role: Option<usize>,
    /// active, missing, stale or spare.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Per-thread reusable buffers for stripe work, so that the hot path
/// neither allocates nor zero-fills fresh memory for every request.
mod scratch {
    use std::cell::RefCell;

    const KEEP: usize = 16;

    thread_local! {
        static FREE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// A buffer of `len` bytes with unspecified contents.
    pub fn take(len: usize) -> Vec<u8> {
        let mut b = FREE.with(|f| f.borrow_mut().pop()).unwrap_or_default();
        b.resize(len, 0);
        b
    }

    /// Return a buffer for reuse.
    pub fn give(b: Vec<u8>) {
        if b.capacity() == 0 {
            return;
        }
        FREE.with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < KEEP {
                f.push(b);
            }
        });
    }
}

/// Data rows of one stripe over a column range (read or reconstructed).
struct Rows {
    data: Vec<Vec<u8>>,
}

impl Array {
    /// Start an array from an assembly. Fails if too many members are
    /// unavailable, naming them.
    pub fn open(asm: Assembly, name: &str, read_only: bool) -> Result<Array> {
        if asm.health() == Health::Failed {
            let limit = match asm.geometry.level {
                Level::Linear | Level::Raid0 => "it has no redundancy".to_string(),
                Level::Raid10 => "RAID-10 can lose at most one member of each mirror set".into(),
                l => format!(
                    "{l} can lose at most {} member(s)",
                    asm.geometry.redundancy()
                ),
            };
            return Err(Error::NotEnoughMembers {
                name: asm.sb.name.clone(),
                detail: format!("unavailable: {}; {limit}", asm.describe_missing()),
            });
        }
        let slots = asm
            .slots
            .iter()
            .map(|s| IoSlot {
                member: s.member.clone(),
                data_offset: s.sb.as_ref().map_or(0, |sb| sb.data_offset),
            })
            .collect();
        let member_sbs = asm.slots.iter().map(|s| s.sb.clone()).collect();
        let absence = asm.slots.iter().map(|s| s.absence.clone()).collect();
        let spares = asm
            .spares
            .iter()
            .map(|(m, _)| m.name().to_string())
            .collect();
        Ok(Array {
            name: name.to_string(),
            geom: asm.geometry,
            slots,
            meta: Mutex::new(Meta {
                sb: asm.sb,
                member_sbs,
            }),
            write_ready: AtomicBool::new(false),
            read_only,
            locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
            absence,
            spares,
        })
    }

    /// Whether every member is present, some redundancy is lost, or data is.
    pub fn health(&self) -> Health {
        let missing: Vec<usize> = (0..self.slots.len())
            .filter(|&r| self.slots[r].member.is_none())
            .collect();
        if missing.is_empty() {
            Health::Optimal
        } else if self.geom.survives(&missing) {
            Health::Degraded
        } else {
            Health::Failed
        }
    }

    /// Every role's member and state, then the spares.
    pub fn members_status(&self) -> Vec<MemberStatus> {
        let mut v: Vec<MemberStatus> = self
            .slots
            .iter()
            .enumerate()
            .map(|(role, s)| match (&s.member, &self.absence[role]) {
                (Some(m), _) => MemberStatus {
                    path: Some(m.name().to_string()),
                    role: Some(role),
                    state: "active",
                    reason: None,
                },
                (None, Some(Absence::Stale { member, reason })) => MemberStatus {
                    path: Some(member.clone()),
                    role: Some(role),
                    state: "stale",
                    reason: Some(reason.clone()),
                },
                (None, _) => MemberStatus {
                    path: None,
                    role: Some(role),
                    state: "missing",
                    reason: None,
                },
            })
            .collect();
        v.extend(self.spares.iter().map(|p| MemberStatus {
            path: Some(p.clone()),
            role: None,
            state: "spare",
            reason: None,
        }));
        v
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geom
    }

    pub fn capacity(&self) -> u64 {
        self.geom.capacity()
    }

    /// The array's current superblock content.
    pub fn superblock(&self) -> Superblock {
        self.meta.lock().expect("meta lock").sb.clone()
    }

    fn member(&self, role: usize) -> Option<&Arc<dyn Member>> {
        self.slots[role].member.as_ref()
    }

    fn lock(&self, stripe: u64) -> MutexGuard<'_, ()> {
        self.locks[(stripe % LOCKS as u64) as usize]
            .lock()
            .expect("stripe lock")
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity() => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.capacity(),
            }),
        }
    }

    fn member_read(&self, role: usize, buf: &mut [u8], dev: u64) -> Option<Result<()>> {
        let s = &self.slots[role];
        s.member
            .as_ref()
            .map(|m| Ok(m.read_at(buf, s.data_offset + dev)?))
    }

    fn member_write(&self, role: usize, buf: &[u8], dev: u64) -> Result<()> {
        let s = &self.slots[role];
        match &s.member {
            Some(m) => Ok(m.write_at(buf, s.data_offset + dev)?),
            None => Ok(()),
        }
    }

    /// Write every present member's superblock from the array-wide state.
    fn write_superblocks(&self, meta: &mut Meta) -> Result<()> {
        meta.sb.utime = unix_now();
        for (role, slot) in self.slots.iter().enumerate() {
            let (Some(m), Some(own)) = (&slot.member, meta.member_sbs[role].as_mut()) else {
                continue;
            };
            let mut sb = meta.sb.clone();
            sb.member_uuid = own.member_uuid;
            sb.role = Role::Active(role as u32);
            sb.data_offset = own.data_offset;
            sb.data_size = own.data_size;
            sb.recovery_offset = own.recovery_offset;
            sb.seq = own.seq;
            write_superblock(m.as_ref(), &mut sb)?;
            *own = sb;
        }
        Ok(())
    }

    /// Before the first write: record that the array is dirty and which
    /// roles are absent (raising the event counter), so that a member that
    /// missed these writes is known to be stale when it comes back.
    fn begin_write(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("the array is open read-only".into()));
        }
        if self.write_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut meta = self.meta.lock().expect("meta lock");
        if self.write_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut changed = false;
        for (role, slot) in self.slots.iter().enumerate() {
            if slot.member.is_none() && meta.sb.roles[role].state == RoleState::Active {
                meta.sb.roles[role].state = RoleState::Removed;
                changed = true;
            }
        }
        if changed {
            meta.sb.events += 1;
        }
        meta.sb.state = ArrayState::Dirty;
        self.write_superblocks(&mut meta)?;
        self.write_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Flush every member and, if the array was written, mark it clean.
    pub fn close(&self) -> Result<()> {
        self.flush()?;
        let mut meta = self.meta.lock().expect("meta lock");
        if self.write_ready.swap(false, Ordering::AcqRel) {
            meta.sb.state = ArrayState::Clean;
            self.write_superblocks(&mut meta)?;
        }
        for s in &self.slots {
            if let Some(m) = &s.member {
                m.close()?;
            }
        }
        Ok(())
    }

    /// Make every completed write durable on every member.
    pub fn flush(&self) -> Result<()> {
        for s in &self.slots {
            if let Some(m) = &s.member {
                m.flush()?;
            }
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at logical `offset`.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        for p in self.geom.pieces(offset, buf.len() as u64) {
            let at = (p.logical - offset) as usize;
            let dst = &mut buf[at..at + p.len as usize];
            if self.geom.level.is_parity() {
                self.read_parity_piece(&p, dst)?;
            } else {
                self.read_copies(&p, dst)?;
            }
        }
        Ok(())
    }

    fn read_copies(&self, p: &Piece, dst: &mut [u8]) -> Result<()> {
        let mut last_err = None;
        for &(role, dev) in &p.copies {
            match self.member_read(role, dst, dev) {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => last_err = Some(e),
                None => {}
            }
        }
        Err(last_err.unwrap_or_else(|| Error::Unavailable {
            offset: p.logical,
            detail: format!(
                "no member holds it (role(s) {} missing)",
                roles_list(p.copies.iter().map(|c| c.0))
            ),
        }))
    }

    fn read_parity_piece(&self, p: &Piece, dst: &mut [u8]) -> Result<()> {
        let (role, dev) = p.copies[0];
        if let Some(Ok(())) = self.member_read(role, dst, dev) {
            return Ok(());
        }
        // Missing or failing: rebuild the piece from the rest of its stripe.
        let _g = self.lock(p.stripe);
        let k = self.geom.data_members();
        let mut need = vec![false; k];
        need[p.dd] = true;
        let rows = self.read_rows(p.stripe, p.col, p.len, &need, &[role])?;
        dst.copy_from_slice(&rows.data[p.dd]);
        Ok(())
    }

    /// Read the data chunks marked in `need` of `stripe` over
    /// `[col, col + len)`, reconstructing any that are missing or fail
    /// (never reading from the roles in `avoid`).
    fn read_rows(
        &self,
        stripe: u64,
        col: u64,
        len: u64,
        need: &[bool],
        avoid: &[usize],
    ) -> Result<Rows> {
        let sm = self.geom.stripe_map(stripe);
        let k = sm.data.len();
        let dev = stripe * self.geom.chunk + col;
        let mut failed: Vec<usize> = avoid.to_vec();
        let mut data: Vec<Option<Vec<u8>>> = vec![None; k];
        let read = |role: usize, failed: &mut Vec<usize>| -> Option<Vec<u8>> {
            if failed.contains(&role) {
                return None;
            }
            let mut b = scratch::take(len as usize);
            match self.member_read(role, &mut b, dev) {
                Some(Ok(())) => Some(b),
                Some(Err(_)) => {
                    scratch::give(b);
                    failed.push(role);
                    None
                }
                None => {
                    scratch::give(b);
                    None
                }
            }
        };
        for dd in (0..k).filter(|&d| need[d]) {
            data[dd] = read(sm.data[dd], &mut failed);
        }
        if (0..k).all(|d| !need[d] || data[d].is_some()) {
            return Ok(Rows {
                data: data.into_iter().map(Option::unwrap_or_default).collect(),
            });
        }
        for dd in 0..k {
            if data[dd].is_none() && !need[dd] {
                data[dd] = read(sm.data[dd], &mut failed);
            }
        }
        let p = read(sm.p, &mut failed);
        let q = sm.q.and_then(|q| read(q, &mut failed));
        let lost: Vec<usize> = (0..k).filter(|&d| data[d].is_none()).collect();
        // Work in syndrome order so that Q-based recovery sees md's indices.
        let mut syn: Vec<Vec<u8>> = vec![Vec::new(); k];
        for dd in 0..k {
            syn[sm.syndrome[dd]] = data[dd].take().unwrap_or_else(|| vec![0; len as usize]);
        }
        let s = |dd: usize| sm.syndrome[dd];
        match (lost.as_slice(), &p, &q) {
            ([], _, _) => {}
            ([x], Some(p), _) => parity::recover_data_p(&mut syn, s(*x), p),
            ([x], None, Some(q)) => parity::recover_data_q(&mut syn, s(*x), q),
            ([x, y], Some(p), Some(q)) => parity::recover_two_data(&mut syn, s(*x), s(*y), p, q),
            _ => {
                let mut gone: Vec<usize> = lost.iter().map(|&d| sm.data[d]).collect();
                if p.is_none() {
                    gone.push(sm.p);
                }
                if let (Some(qr), None) = (sm.q, &q) {
                    gone.push(qr);
                }
                gone.sort_unstable();
                return Err(Error::Unavailable {
                    offset: self.geom.stripe_data_offset(stripe, lost[0]) + col,
                    detail: format!(
                        "roles {} of stripe {stripe} are missing or failing",
                        roles_list(gone.into_iter())
                    ),
                });
            }
        }
        let mut out = vec![Vec::new(); k];
        for dd in 0..k {
            out[dd] = std::mem::take(&mut syn[sm.syndrome[dd]]);
        }
        Ok(Rows { data: out })
    }

    /// Write `buf` at logical `offset`.
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.begin_write()?;
        let pieces = self.geom.pieces(offset, buf.len() as u64);
        let src = |p: &Piece| {
            let at = (p.logical - offset) as usize;
            &buf[at..at + p.len as usize]
        };
        if self.geom.level.is_parity() {
            let mut i = 0;
            while i < pieces.len() {
                let stripe = pieces[i].stripe;
                let mut j = i;
                while j < pieces.len() && pieces[j].stripe == stripe {
                    j += 1;
                }
                let group: Small<(&Piece, &[u8])> =
                    pieces[i..j].iter().map(|p| (p, src(p))).collect();
                self.write_stripe(stripe, &group)?;
                i = j;
            }
            return Ok(());
        }
        let mirrored = matches!(self.geom.level, Level::Raid1 | Level::Raid10);
        for p in &pieces {
            // Mirrors must not diverge under concurrent writes to one chunk.
            let _g = mirrored.then(|| self.lock(p.logical / self.geom.chunk));
            let mut wrote = false;
            for &(role, dev) in &p.copies {
                if self.member(role).is_some() {
                    self.member_write(role, src(p), dev)?;
                    wrote = true;
                }
            }
            if !wrote {
                return Err(Error::Unavailable {
                    offset: p.logical,
                    detail: format!(
                        "no member to write to (role(s) {} missing)",
                        roles_list(p.copies.iter().map(|c| c.0))
                    ),
                });
            }
        }
        Ok(())
    }

    /// Update one stripe: read-modify-write or reconstruct-write, whichever
    /// reads less (md's handle_stripe_dirtying), or no reads at all for a
    /// full-stripe write.
    fn write_stripe(&self, stripe: u64, pieces: &[(&Piece, &[u8])]) -> Result<()> {
        let _g = self.lock(stripe);
        let sm = self.geom.stripe_map(stripe);
        let k = sm.data.len();
        let chunk = self.geom.chunk;
        let c0 = pieces.iter().map(|(p, _)| p.col).min().expect("non-empty");
        let c1 = pieces
            .iter()
            .map(|(p, _)| p.col + p.len)
            .max()
            .expect("non-empty");
        let len = (c1 - c0) as usize;
        let dev = stripe * chunk + c0;
        let parity_roles: Small<usize> = std::iter::once(sm.p).chain(sm.q).collect();
        let parity_present = parity_roles.iter().any(|&r| self.member(r).is_some());

        if !parity_present {
            // Every parity member of this stripe is gone: data is all there is.
            for (p, d) in pieces {
                self.member_write(p.copies[0].0, d, p.copies[0].1)?;
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
        let rmw_ok = parity_roles.iter().all(|&r| self.member(r).is_some())
            && pieces
                .iter()
                .all(|(p, _)| self.member(p.copies[0].0).is_some());
        let rmw_reads = pieces.len() + parity_roles.len();

        if rmw_ok && rcw_reads > 0 && rmw_reads < rcw_reads {
            let mut pbuf = scratch::take(len);
            let mut qbuf = sm.q.map(|_| scratch::take(len));
            let mut old = scratch::take(0);
            let done = (|| {
                self.member_read(sm.p, &mut pbuf, dev).expect("present")?;
                if let (Some(q), Some(qb)) = (sm.q, qbuf.as_mut()) {
                    self.member_read(q, qb, dev).expect("present")?;
                }
                for (p, d) in pieces {
                    old.resize(p.len as usize, 0);
                    self.member_read(p.copies[0].0, &mut old, p.copies[0].1)
                        .expect("present")?;
                    let r = (p.col - c0) as usize..(p.col - c0 + p.len) as usize;
                    parity::update_pq(
                        &mut pbuf[r.clone()],
                        qbuf.as_mut().map(|q| &mut q[r]),
                        sm.syndrome[p.dd],
                        &old,
                        d,
                    );
                }
                Ok(())
            })()
            .and_then(|()| self.write_out(pieces, &sm, dev, &pbuf, qbuf.as_deref()));
            scratch::give(pbuf);
            if let Some(q) = qbuf {
                scratch::give(q);
            }
            scratch::give(old);
            return done;
        }

        if rcw_reads == 0 && len >= 2 * COLUMN {
            return self.write_full_stripe(pieces, &sm, dev, len);
        }

        // Reconstruct-write: assemble full rows, then compute parity afresh.
        // Fully covered chunks are used in place, without a copy.
        let need: Small<bool> = (0..k).map(|d| !covers(d)).collect();
        let mut rows = if rcw_reads > 0 {
            self.read_rows(stripe, c0, len as u64, &need, &[])?.data
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
        let written = self.write_out(pieces, &sm, dev, &pbuf, qbuf.as_deref());
        scratch::give(pbuf);
        if let Some(q) = qbuf {
            scratch::give(q);
        }
        rows.into_iter().for_each(scratch::give);
        written
    }

    /// A full-stripe write, column by column: each column's data goes to
    /// the members and then feeds P and Q while still in cache, so parity
    /// costs no second trip to memory.
    fn write_full_stripe(
        &self,
        pieces: &[(&Piece, &[u8])],
        sm: &raidkit_layout::StripeMap,
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
        // Data to the members on one core while another computes P and Q
        // and writes them: parity overlaps member I/O.
        let (data_done, parity_done) = rayon::join(
            || -> Result<()> {
                for (dd, d) in by_dd.iter().enumerate() {
                    self.member_write(sm.data[dd], d, dev)?;
                }
                Ok(())
            },
            || -> Result<()> {
                let mut refs: Small<&[u8]> = smallvec![&[][..]; k];
                let mut at = 0;
                while at < len {
                    let end = (at + COLUMN).min(len);
                    for (dd, d) in by_dd.iter().enumerate() {
                        refs[sm.syndrome[dd]] = &d[at..end];
                    }
                    match qbuf.as_mut() {
                        Some(q) => parity::gen_pq(&refs, &mut pbuf[at..end], &mut q[at..end]),
                        None => parity::gen_p(&refs, &mut pbuf[at..end]),
                    }
                    at = end;
                }
                self.member_write(sm.p, &pbuf, dev)?;
                if let (Some(role), Some(q)) = (sm.q, &qbuf) {
                    self.member_write(role, q, dev)?;
                }
                Ok(())
            },
        );
        scratch::give(pbuf);
        if let Some(q) = qbuf {
            scratch::give(q);
        }
        data_done.and(parity_done)
    }

    /// The writes that end a stripe update: new data, then P and Q.
    fn write_out(
        &self,
        pieces: &[(&Piece, &[u8])],
        sm: &raidkit_layout::StripeMap,
        dev: u64,
        p: &[u8],
        q: Option<&[u8]>,
    ) -> Result<()> {
        for (piece, d) in pieces {
            self.member_write(piece.copies[0].0, d, piece.copies[0].1)?;
        }
        self.member_write(sm.p, p, dev)?;
        if let (Some(role), Some(q)) = (sm.q, q) {
            self.member_write(role, q, dev)?;
        }
        Ok(())
    }

    /// Make redundancy consistent with the data everywhere: parity
    /// recomputed from data, mirrors copied from the first present copy.
    /// `progress(done, total)` is called after each step.
    pub fn resync(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        self.begin_write()?;
        let chunk = self.geom.chunk;
        match self.geom.level {
            Level::Linear | Level::Raid0 => {}
            Level::Raid1 | Level::Raid10 => {
                let total = self.capacity();
                let mut buf = vec![0u8; chunk as usize];
                let mut pos = 0;
                while pos < total {
                    let ps = self.geom.pieces(pos, chunk.min(total - pos));
                    for p in ps {
                        let b = &mut buf[..p.len as usize];
                        self.read_copies(&p, b)?;
                        self.write(b, p.logical)?;
                        pos = p.logical + p.len;
                    }
                    progress(pos, total);
                }
            }
            _ => {
                let stripes = self.geom.stripes();
                let k = self.geom.data_members();
                let need = vec![true; k];
                for s in 0..stripes {
                    let _g = self.lock(s);
                    let sm = self.geom.stripe_map(s);
                    let rows = self.read_rows(s, 0, chunk, &need, &[])?.data;
                    let mut order = vec![0; k];
                    for dd in 0..k {
                        order[sm.syndrome[dd]] = dd;
                    }
                    let refs: Vec<&[u8]> = order.iter().map(|&d| rows[d].as_slice()).collect();
                    let mut pbuf = vec![0u8; chunk as usize];
                    let mut qbuf = vec![0u8; chunk as usize];
                    parity::gen_pq(&refs, &mut pbuf, &mut qbuf);
                    self.member_write(sm.p, &pbuf, s * chunk)?;
                    if let Some(q) = sm.q {
                        self.member_write(q, &qbuf, s * chunk)?;
                    }
                    progress(s + 1, stripes);
                }
            }
        }
        Ok(())
    }

    /// Count stripes (parity levels) or chunks (mirrors) whose redundancy
    /// disagrees with the data. Needs every member present.
    pub fn count_mismatches(&self) -> Result<u64> {
        if self.slots.iter().any(|s| s.member.is_none()) {
            return Err(Error::Invalid(
                "checking redundancy needs every member".into(),
            ));
        }
        let chunk = self.geom.chunk as usize;
        let n = self.geom.members();
        let mut bad = 0;
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; chunk]; n];
        for s in 0..self.geom.stripes() {
            for (role, b) in bufs.iter_mut().enumerate() {
                self.member_read(role, b, s * chunk as u64)
                    .expect("present")?;
            }
            match self.geom.level {
                Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                    let sm = self.geom.stripe_map(s);
                    let mut order = vec![0; sm.data.len()];
                    for dd in 0..sm.data.len() {
                        order[sm.syndrome[dd]] = sm.data[dd];
                    }
                    let refs: Vec<&[u8]> = order.iter().map(|&r| bufs[r].as_slice()).collect();
                    let (rp, rq) = parity::reference::pq(&refs);
                    if rp != bufs[sm.p] || sm.q.is_some_and(|q| rq != bufs[q]) {
                        bad += 1;
                    }
                }
                Level::Raid1 if bufs.iter().any(|b| b != &bufs[0]) => bad += 1,
                _ => {}
            }
        }
        if self.geom.level == Level::Raid10 {
            let cap = self.capacity();
            let mut a = vec![0u8; chunk];
            let mut b = vec![0u8; chunk];
            for p in
                (0..cap / chunk as u64).map(|c| self.geom.pieces(c * chunk as u64, chunk as u64))
            {
                let (r0, d0) = p[0].copies[0];
                self.member_read(r0, &mut a, d0).expect("present")?;
                for &(r, d) in &p[0].copies[1..] {
                    self.member_read(r, &mut b, d).expect("present")?;
                    if a != b {
                        bad += 1;
                    }
                }
            }
        }
        Ok(bad)
    }
}

fn roles_list(roles: impl Iterator<Item = usize>) -> String {
    roles.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

impl Member for Array {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), MemberError> {
        self.read(buf, offset).map_err(|e| {
            MemberError::new(&self.name, Op::Read, offset, buf.len() as u64, e.into_io())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), MemberError> {
        self.write(buf, offset).map_err(|e| {
            MemberError::new(&self.name, Op::Write, offset, buf.len() as u64, e.into_io())
        })
    }

    fn flush(&self) -> Result<(), MemberError> {
        Array::flush(self).map_err(|e| MemberError::new(&self.name, Op::Flush, 0, 0, e.into_io()))
    }

    fn close(&self) -> Result<(), MemberError> {
        Array::close(self).map_err(|e| MemberError::new(&self.name, Op::Flush, 0, 0, e.into_io()))
    }
}
