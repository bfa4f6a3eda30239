//! A member that can lose power: writes are held apart until a flush makes
//! them durable, and a power cut drops, keeps or tears (sector by sector)
//! each write not yet flushed, as a disk with a volatile cache may. For
//! crash-consistency tests, in the spirit of redb's crash_consistency tests.

use crate::{check_range, Member, MemberError, Op, Result};
use std::sync::Mutex;

const SECTOR: usize = 512;

#[derive(Debug, Default)]
struct State {
    durable: Vec<u8>,
    /// Writes since the last flush, in order.
    pending: Vec<(u64, Vec<u8>)>,
    dead: bool,
}

/// A member whose unflushed writes a power cut may lose or tear.
pub struct PowerCutMember {
    name: String,
    len: u64,
    state: Mutex<State>,
}

/// A small deterministic generator (xorshift64*), so that a failing cut
/// can be replayed from its seed.
#[derive(Debug, Clone)]
pub struct CutRng(u64);

impl CutRng {
    pub fn new(seed: u64) -> CutRng {
        CutRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

impl std::fmt::Debug for PowerCutMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCutMember")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PowerCutMember {
    pub fn new(name: &str, contents: Vec<u8>) -> PowerCutMember {
        PowerCutMember {
            name: name.to_string(),
            len: contents.len() as u64,
            state: Mutex::new(State {
                durable: contents,
                ..State::default()
            }),
        }
    }

    /// Cut the power: each unflushed write is dropped, kept, or torn (a
    /// random subset of its sectors lands). Every later operation fails.
    pub fn cut(&self, rng: &mut CutRng) {
        cut_state(&mut self.state.lock().expect("power-cut state"), rng);
    }

    /// Cut the power of all of `members` at one instant, as a power cut
    /// hits every disk of a machine at once: none of them takes a write
    /// after any of them lost power. Cut one after the other, a member
    /// still powered could take writes made because another had already
    /// failed (a superblock recording it faulty), which no real power cut
    /// allows.
    pub fn cut_all(members: &[&PowerCutMember], rng: &mut CutRng) {
        let mut states: Vec<_> = members
            .iter()
            .map(|m| m.state.lock().expect("power-cut state"))
            .collect();
        for st in &mut states {
            cut_state(st, rng);
        }
    }

    /// What is on stable storage (after a cut: what survived it).
    pub fn durable(&self) -> Vec<u8> {
        self.state.lock().expect("power-cut state").durable.clone()
    }

    fn dead(&self, op: Op, offset: u64, len: u64) -> MemberError {
        MemberError::new(
            &self.name,
            op,
            offset,
            len,
            std::io::Error::from_raw_os_error(5),
        )
    }
}

/// A cut of one member's state: its unflushed writes dropped, kept or
/// torn, and every later operation failed.
fn cut_state(st: &mut State, rng: &mut CutRng) {
    let pending = std::mem::take(&mut st.pending);
    for (off, data) in pending {
        let at = off as usize;
        match rng.below(3) {
            0 => {}
            1 => st.durable[at..at + data.len()].copy_from_slice(&data),
            _ => {
                for (i, s) in data.chunks(SECTOR).enumerate() {
                    if rng.below(2) == 0 {
                        let p = at + i * SECTOR;
                        st.durable[p..p + s.len()].copy_from_slice(s);
                    }
                }
            }
        }
    }
    st.dead = true;
}

impl Member for PowerCutMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, Op::Read, offset, buf.len() as u64, self.len)?;
        let st = self.state.lock().expect("power-cut state");
        if st.dead {
            return Err(self.dead(Op::Read, offset, buf.len() as u64));
        }
        let at = offset as usize;
        buf.copy_from_slice(&st.durable[at..at + buf.len()]);
        // Later writes win: overlay the pending ones in order.
        let end = offset + buf.len() as u64;
        for (o, d) in &st.pending {
            let (lo, hi) = ((*o).max(offset), (o + d.len() as u64).min(end));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&d[(lo - o) as usize..(hi - o) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(&self.name, Op::Write, offset, buf.len() as u64, self.len)?;
        let mut st = self.state.lock().expect("power-cut state");
        if st.dead {
            return Err(self.dead(Op::Write, offset, buf.len() as u64));
        }
        st.pending.push((offset, buf.to_vec()));
        Ok(())
    }

    /// The write lands on stable storage at once (a FUA write), and
    /// nothing else does: other unflushed writes stay at the cut's mercy.
    /// The parts of earlier unflushed writes that it overwrites are
    /// dropped from them, as a disk's cache holds only the newest copy of a
    /// sector, so that a cut cannot bring older bytes back over it.
    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(&self.name, Op::Write, offset, buf.len() as u64, self.len)?;
        let mut st = self.state.lock().expect("power-cut state");
        if st.dead {
            return Err(self.dead(Op::Write, offset, buf.len() as u64));
        }
        let end = offset + buf.len() as u64;
        let pending = std::mem::take(&mut st.pending);
        for (o, d) in pending {
            let e = o + d.len() as u64;
            if e <= offset || o >= end {
                st.pending.push((o, d));
                continue;
            }
            if o < offset {
                st.pending.push((o, d[..(offset - o) as usize].to_vec()));
            }
            if e > end {
                st.pending.push((end, d[(end - o) as usize..].to_vec()));
            }
        }
        st.durable[offset as usize..end as usize].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock().expect("power-cut state");
        if st.dead {
            return Err(self.dead(Op::Flush, 0, 0));
        }
        let pending = std::mem::take(&mut st.pending);
        for (o, d) in pending {
            st.durable[o as usize..o as usize + d.len()].copy_from_slice(&d);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_writes_survive_and_unflushed_ones_may_not() {
        let m = PowerCutMember::new("p", vec![0; 64 << 10]);
        m.write_at(&[1; 4096], 0).unwrap();
        m.flush().unwrap();
        m.write_at(&[2; 8192], 4096).unwrap();
        let mut b = vec![0u8; 4096];
        m.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, vec![2; 4096], "reads see unflushed writes");
        let mut kept = [0usize; 3];
        for seed in 0..200 {
            let m = PowerCutMember::new("p", vec![0; 64 << 10]);
            m.write_at(&[1; 4096], 0).unwrap();
            m.flush().unwrap();
            m.write_at(&[2; 8192], 4096).unwrap();
            m.cut(&mut CutRng::new(seed));
            assert!(m.read_at(&mut b, 0).is_err(), "dead after the cut");
            let d = m.durable();
            assert!(d[..4096].iter().all(|&x| x == 1), "flushed write lost");
            let landed = d[4096..12288].chunks(512).filter(|s| s[0] == 2).count();
            kept[match landed {
                0 => 0,
                16 => 2,
                _ => 1,
            }] += 1;
        }
        // Over 200 cuts every outcome happens: dropped, torn, kept.
        assert!(kept.iter().all(|&k| k > 0), "{kept:?}");
    }

    #[test]
    fn a_cut_of_all_members_leaves_none_to_record_that_another_failed() {
        // A thread writes one member until that fails, then records the
        // failure durably on the other, as an array marks a failed member
        // faulty in the superblocks of the rest. Cut at one instant, the
        // other member never takes that record.
        for seed in 0..20 {
            let a = std::sync::Arc::new(PowerCutMember::new("a", vec![0; 4096]));
            let b = std::sync::Arc::new(PowerCutMember::new("b", vec![0; 4096]));
            let t = {
                let (a, b) = (a.clone(), b.clone());
                std::thread::spawn(move || loop {
                    if a.write_at(&[1; 512], 0).is_err() {
                        let _ = b.write_at_durable(&[9; 512], 512);
                        break;
                    }
                    std::thread::yield_now();
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(2));
            PowerCutMember::cut_all(&[&a, &b], &mut CutRng::new(seed));
            t.join().unwrap();
            assert!(
                b.durable()[512..1024].iter().all(|&x| x == 0),
                "seed {seed}: a member took a write after the cut"
            );
        }
    }

    #[test]
    fn a_durable_write_survives_alone_and_is_not_undone_by_older_writes() {
        for seed in 0..200 {
            let m = PowerCutMember::new("p", vec![0; 64 << 10]);
            m.write_at(&[1; 8192], 0).unwrap(); // pending, under the durable one
            m.write_at(&[3; 4096], 32768).unwrap(); // pending, elsewhere
            m.write_at_durable(&[2; 1000], 3000).unwrap();
            let mut b = vec![0u8; 8192];
            m.read_at(&mut b, 0).unwrap();
            assert!(b[..3000].iter().all(|&x| x == 1) && b[3000..4000].iter().all(|&x| x == 2));
            assert!(b[4000..].iter().all(|&x| x == 1), "reads see every write");
            m.cut(&mut CutRng::new(seed));
            let d = m.durable();
            assert!(
                d[3000..4000].iter().all(|&x| x == 2),
                "seed {seed}: durable write lost"
            );
            kept_or_not(&d[32768..36864], seed);
        }
        // The other pending write was not made durable by it: some cut drops it.
        let dropped = (0..200).any(|seed| {
            let m = PowerCutMember::new("p", vec![0; 64 << 10]);
            m.write_at(&[3; 4096], 32768).unwrap();
            m.write_at_durable(&[2; 512], 0).unwrap();
            m.cut(&mut CutRng::new(seed));
            m.durable()[32768..36864].iter().all(|&x| x == 0)
        });
        assert!(dropped, "a durable write made another write durable");
    }

    fn kept_or_not(d: &[u8], seed: u64) {
        assert!(d.iter().all(|&x| x == 0 || x == 3), "seed {seed}");
    }
}
