//! Checking redundancy against data, offline: every stripe (chunk, for
//! RAID-10) recomputed with the slow reference parity code or compared
//! copy by copy.

use super::*;

impl Array {
    /// Count stripes (parity levels) or chunks (mirrors) whose redundancy
    /// disagrees with the data, P and Q recomputed by the slow reference
    /// code. Needs every member present and in sync.
    pub fn count_mismatches(&self) -> Result<u64> {
        self.scan_mismatches(&mut |_| {})
    }

    /// As `count_mismatches`, calling `each` with every mismatch found, in
    /// order: which unit, where, and which roles disagree.
    pub fn scan_mismatches(&self, each: &mut dyn FnMut(Mismatch)) -> Result<u64> {
        let v = self.view.load();
        if !v.degraded_roles().is_empty() {
            return Err(Error::Invalid(
                "checking redundancy needs every member in sync".into(),
            ));
        }
        let chunk = self.geom.chunk as usize;
        let n = self.geom.members();
        let mut bad = 0;
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; chunk]; n];
        let rd = |role: usize, b: &mut [u8], dev: u64| -> Result<()> {
            Ok(self
                .member_read(&v, role, b, dev)
                .expect("every member in sync")?)
        };
        for s in 0..self.geom.stripes() {
            if !matches!(
                self.geom.level,
                Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid1
            ) {
                break;
            }
            for (role, b) in bufs.iter_mut().enumerate() {
                rd(role, b, s * chunk as u64)?;
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
                    let mut roles = Vec::new();
                    if rp != bufs[sm.p] {
                        roles.push(sm.p);
                    }
                    if let Some(q) = sm.q.filter(|&q| rq != bufs[q]) {
                        roles.push(q);
                    }
                    if !roles.is_empty() {
                        bad += 1;
                        each(Mismatch {
                            unit: s,
                            array_offset: self.geom.stripe_data_offset(s, 0),
                            member_offset: s * chunk as u64,
                            roles,
                        });
                    }
                }
                Level::Raid1 if bufs.iter().any(|b| b != &bufs[0]) => {
                    bad += 1;
                    each(Mismatch {
                        unit: s,
                        array_offset: s * chunk as u64,
                        member_offset: s * chunk as u64,
                        roles: (0..n).collect(),
                    });
                }
                _ => {}
            }
        }
        if self.geom.level == Level::Raid10 {
            let cap = self.capacity();
            let mut a = vec![0u8; chunk];
            let mut b = vec![0u8; chunk];
            for c in 0..cap / chunk as u64 {
                let p = self.geom.pieces(c * chunk as u64, chunk as u64);
                let (r0, d0) = p[0].copies[0];
                rd(r0, &mut a, d0)?;
                for &(r, d) in &p[0].copies[1..] {
                    rd(r, &mut b, d)?;
                    if a != b {
                        bad += 1;
                        each(Mismatch {
                            unit: c,
                            array_offset: c * chunk as u64,
                            member_offset: d0,
                            roles: vec![r0, r],
                        });
                    }
                }
            }
        }
        Ok(bad)
    }
}
