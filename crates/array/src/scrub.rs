//! Scrub: every block of every member read, checked against its checksum
//! and against redundancy (P and Q recomputed from the data, mirror copies
//! compared), and what disagrees named (member, role, member offset, array
//! range) and, unless asked only to check, repaired: a block that
//! disagrees with its checksum is rebuilt from redundancy (the result
//! checked against that checksum, as any read does) and rewritten; parity
//! that disagrees with checked data is recomputed; mirror copies that
//! differ with both checked are made equal to the first (md's repair).
//!
//! It runs in the background on the framework of rebuilds (throttle,
//! progress, `recovery.kind` = `scrub`), unit by unit under the unit's
//! lock while clients read and write, and records its position in the
//! superblocks every few seconds, so that a restart resumes it.

use crate::core::{Disk, View};
use crate::engine::Array;
use crate::error::{Error, Result};
use crate::events::{NewEvent, Severity};
use crate::levels::parity::parity_of;
use crate::metadata::checksums::BLOCK;
use crate::scratch;
use raidkit_member::{Locked, MemberError};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// One thing a scrub found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The member's name (path).
    pub member: String,
    pub role: usize,
    /// Byte offset on the member (where `dd` would read it).
    pub member_offset: u64,
    /// The array bytes concerned: the data itself, or for P and Q the
    /// column of the stripe's data they protect (its first chunk's part).
    pub array_offset: u64,
    pub length: u64,
    /// checksum (a block disagrees with its checksum), parity (P or Q
    /// disagrees with data that checks out), copies (mirror copies that
    /// both check out differ), read-error (the member could not be read),
    /// lost (a block a rebuild could not make: what it was rebuilt from
    /// was bad; an error until written, never this member's rot).
    pub kind: &'static str,
    /// repaired, reported (a check-only scrub), or unrepaired (more
    /// damage than redundancy covers: reads of it fail).
    pub action: &'static str,
}

/// The last scrub that ended.
#[derive(Debug, Clone, Serialize)]
pub struct LastScrub {
    /// Which scrub of this server's run it was (1, 2, ...); 0 for the
    /// last one of an earlier run, as the superblock kept it (its findings
    /// counted in `found`, not listed).
    pub run: u64,
    /// When it ended, in seconds since the Unix epoch.
    pub ended: u64,
    /// done, or why it stopped.
    pub result: String,
    pub check_only: bool,
    pub seconds: f64,
    /// Bytes of each member's data area read in this run.
    pub bytes: u64,
    pub repaired: u64,
    pub unrepaired: u64,
    /// Every mismatch it found (`mismatches` lists the first 1000).
    pub found: u64,
    pub mismatches: Vec<Finding>,
}

impl LastScrub {
    /// The last scrub of an earlier run, from the superblock.
    pub(crate) fn from_summary(s: &crate::superblock::ScrubSummary) -> LastScrub {
        LastScrub {
            run: 0,
            ended: s.ended,
            result: s.result.clone(),
            check_only: s.check_only,
            seconds: s.millis as f64 / 1000.0,
            bytes: s.bytes,
            repaired: s.repaired,
            unrepaired: s.unrepaired,
            found: s.found,
            mismatches: Vec::new(),
        }
    }
}

/// A scrub to run: from unit `from`, repairing unless `check_only`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScrubRequest {
    pub from: u64,
    pub check_only: bool,
}

/// Findings kept in `last_scrub` at most (the counts go on).
const KEEP: usize = 1000;

impl Array {
    /// Ask for a scrub (run by the background worker). Refused while the
    /// array is read-only, degraded, recovering or already scrubbing.
    pub fn start_scrub(&self, check_only: bool) -> Result<()> {
        if self.core.read_only && !check_only {
            return Err(Error::Invalid(
                "the array is open read-only: only --check-only can run".into(),
            ));
        }
        if self.level().units(self) == 0 {
            return Err(Error::Invalid(format!(
                "{} without checksums has nothing a scrub could check",
                self.core.geom().level
            )));
        }
        if !self.core.view.load().degraded_roles().is_empty() {
            return Err(Error::Invalid(
                "the array is degraded: a scrub needs every member (rebuild first)".into(),
            ));
        }
        if self.reshape_in_progress() {
            return Err(Error::Invalid(
                "a reshape is in progress: scrub once it is done (raidkit wait)".into(),
            ));
        }
        if self.needs_recovery() || self.core.window.is_open() {
            return Err(Error::Invalid(
                "a rebuild or resync is pending or running: scrub once it is done".into(),
            ));
        }
        let mut p = self.recovery.pending_scrub.locked();
        if p.is_some() || self.scrub_running() {
            return Err(Error::Invalid("a scrub is already running".into()));
        }
        *p = Some(ScrubRequest {
            from: 0,
            check_only,
        });
        self.recovery.scrub_stop.store(false, Ordering::Release);
        drop(p);
        self.core.wake.kick();
        Ok(())
    }

    /// Stop a scrub that runs or waits to. Returns whether there was one.
    pub fn stop_scrub(&self) -> Result<bool> {
        let waiting = self.recovery.pending_scrub.locked().take().is_some();
        let running = self.scrub_running();
        if running {
            self.recovery.scrub_stop.store(true, Ordering::Release);
        }
        if waiting || running {
            let mut meta = self.core.meta.locked();
            if meta.sb.scrub.is_some() {
                meta.sb.scrub = None;
                self.core.write_superblocks(&mut meta)?;
            }
        }
        Ok(waiting || running)
    }

    fn scrub_running(&self) -> bool {
        self.recovery_status().is_some_and(|r| r.kind == "scrub")
    }

    pub fn last_scrub(&self) -> Option<LastScrub> {
        self.recovery.last_scrub.locked().clone()
    }

    /// Run the scrub asked for, if any (the background worker calls it).
    pub(crate) fn run_pending_scrub(&self) -> Result<()> {
        let Some(req) = self.recovery.pending_scrub.locked().take() else {
            return Ok(());
        };
        self.run_scrub(req)
    }

    fn run_scrub(&self, req: ScrubRequest) -> Result<()> {
        let chunk = self.core.geom().chunk;
        let units = self.level().units(self);
        let from = req.from.min(units);
        let mut process = crate::background::Process::start(
            self,
            crate::background::Plan {
                kind: "scrub",
                role: None,
                member: String::new(),
                with: Vec::new(),
                bytes_before: from * chunk,
                bytes_total: (units - from) * chunk,
                resumed_from: from * chunk,
            },
        );
        let began = std::time::Instant::now();
        let mut found = Vec::new();
        let mut count = 0u64;
        let (mut repaired, mut unrepaired) = (0u64, 0u64);
        let result = (|| -> Result<String> {
            let _writing = match req.check_only {
                false => Some(self.core.begin_write()?),
                true => None,
            };
            let mut ahead = ReadAhead::new(self, units);
            for u in from..units {
                if process.stopped() {
                    return Ok("the array was stopped (resumed at the next start)".into());
                }
                if self.recovery.scrub_stop.load(Ordering::Acquire) {
                    return Ok("stopped".into());
                }
                let v = self.core.view.load_full();
                if !v.degraded_roles().is_empty() {
                    return Ok("a member was lost".into());
                }
                let mut rot = false;
                let mut each = |f: Finding| {
                    rot |= f.kind == "checksum";
                    match f.action {
                        "repaired" => repaired += 1,
                        "unrepaired" => unrepaired += 1,
                        _ => {}
                    }
                    tracing::warn!(
                        member = f.member.as_str(),
                        role = f.role,
                        member_offset = f.member_offset,
                        array_offset = f.array_offset,
                        length = f.length,
                        kind = f.kind,
                        action = f.action,
                        "scrub: {} mismatch",
                        f.kind
                    );
                    count += 1;
                    if found.len() < KEEP {
                        found.push(f);
                    }
                };
                self.scrub_unit(&v, u, !req.check_only, &mut each, Some(ahead.at(u)))?;
                // Rot a scrub finds counts toward a member's failure as a
                // client's read finding it does: a disk rotting at many
                // places is failed, not healed block after block.
                let rotting: Vec<_> = v
                    .writable()
                    .into_iter()
                    .filter(|d| rot && d.checked.as_ref().is_some_and(|c| c.past_limit()))
                    .collect();
                if !rotting.is_empty() {
                    // Not while holding the stripes read ahead.
                    ahead.release();
                    for d in rotting {
                        self.core.fail_if_rotting(&d);
                    }
                }
                if process.checkpoint_due() {
                    self.scrub_checkpoint(Some((u + 1, req.check_only)), None)?;
                }
                // A paced scrub sleeps without holding the stripes it
                // read ahead: clients writing there would wait for it.
                process.advance_then(chunk, &mut || ahead.release());
            }
            Ok("done".into())
        })();
        let finished = matches!(result.as_deref(), Ok("done") | Ok("stopped"));
        let text = match &result {
            Ok(t) => t.clone(),
            Err(e) => e.to_string(),
        };
        let (seconds, bytes) = (
            began.elapsed().as_secs_f64(),
            self.recovery.done.load(Ordering::Relaxed),
        );
        let ended = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Where to resume, and how it went, in one superblock update: a
        // restarted server still tells when the array was last verified.
        let _ = self.scrub_checkpoint(
            if finished {
                None
            } else {
                let at = self.recovery.done.load(Ordering::Relaxed) / chunk.max(1) + from;
                Some((at, req.check_only))
            },
            Some(crate::superblock::ScrubSummary {
                ended,
                millis: (seconds * 1000.0) as u64,
                bytes,
                repaired,
                unrepaired,
                found: count,
                check_only: req.check_only,
                result: text.clone(),
            }),
        );
        process.end(text.clone());
        let mut last = self.recovery.last_scrub.locked();
        let run = last.as_ref().map_or(0, |l| l.run) + 1;
        let mismatches = count;
        self.core.emit(
            NewEvent::new(
                "ScrubFinished",
                if unrepaired > 0 {
                    Severity::Critical
                } else if mismatches > 0 || text != "done" {
                    Severity::Warning
                } else {
                    Severity::Info
                },
                format!(
                    "scrub {text}: {repaired} repaired, {unrepaired} unrepaired in {seconds:.0} s"
                ),
            )
            .data(serde_json::json!({
                "result": text, "check_only": req.check_only, "seconds": seconds,
                "bytes": bytes, "repaired": repaired, "unrepaired": unrepaired,
                "mismatches": mismatches,
            })),
        );
        *last = Some(LastScrub {
            run,
            ended,
            result: text,
            check_only: req.check_only,
            seconds,
            bytes,
            repaired,
            unrepaired,
            found: count,
            mismatches: found,
        });
        result.map(|_| ())
    }

    /// Record how far a scrub got (None: no scrub to resume), and how the
    /// scrub went once it ended (`summary`).
    fn scrub_checkpoint(
        &self,
        at: Option<(u64, bool)>,
        summary: Option<crate::superblock::ScrubSummary>,
    ) -> Result<()> {
        if self.core.read_only {
            return Ok(());
        }
        self.core.flush()?;
        let mut meta = self.core.meta.locked();
        meta.sb.scrub = at;
        if summary.is_some() {
            meta.sb.last_scrub = summary;
        }
        self.core.write_superblocks(&mut meta)
    }

    /// Read a member's range as it is, with the member offsets of blocks
    /// that disagree with their checksums.
    /// `ahead`: what was read ahead of it, used where it holds the range.
    fn scan(
        &self,
        v: &View,
        role: usize,
        dev: u64,
        len: u64,
        ahead: Option<&Ahead>,
    ) -> std::result::Result<(Vec<u8>, Vec<u64>), String> {
        let d = v.roles[role].disk.as_ref().ok_or("no member")?;
        let mut buf = scratch::take(len as usize);
        let at = d.data_offset + dev;
        if let Some((bytes, bad)) = ahead.and_then(|a| a.get(d, role, dev, len)) {
            buf.copy_from_slice(bytes);
            return Ok((buf, bad));
        }
        match read_verdict(d, &mut buf, at) {
            Ok(bad) => Ok((buf, bad)),
            Err(e) => {
                scratch::give(buf);
                Err(e.to_string())
            }
        }
    }

    /// Scrub one unit (a stripe, or a chunk of the address space). With
    /// `ahead`, the caller holds the unit's locks and the members' ranges
    /// were read ahead under them.
    pub(crate) fn scrub_unit(
        &self,
        v: &View,
        u: u64,
        repair: bool,
        each: &mut dyn FnMut(Finding),
        ahead: Option<&Ahead>,
    ) -> Result<()> {
        let g = &self.core.geom();
        let chunk = g.chunk;
        let name = |role: usize| {
            v.roles[role]
                .disk
                .as_ref()
                .map_or_else(String::new, |d| d.name().to_string())
        };
        let member_at = |role: usize, dev: u64| {
            v.roles[role]
                .disk
                .as_ref()
                .map_or(dev, |d| d.data_offset + dev)
        };
        if g.level.is_parity() {
            let _g = ahead.is_none().then(|| self.core.lock(u));
            let v = &self.core.view.load_full();
            let sm = g.stripe_map(u);
            let dev = u * chunk;
            let array_of = |role: usize, off: u64| {
                let col = off - dev;
                match sm.data.iter().position(|&r| r == role) {
                    Some(dd) => g.stripe_data_offset(u, dd) + col,
                    None => g.stripe_data_offset(u, 0) + col,
                }
            };
            let mut rows = Vec::new();
            let mut bad: Vec<(usize, Vec<u64>, &'static str)> = Vec::new();
            for role in 0..g.members() {
                match self.scan(v, role, dev, chunk, ahead) {
                    Ok((buf, b)) => {
                        let (lost, rot) = self.split_lost(v, role, b);
                        for (b, kind) in [(lost, "lost"), (rot, "checksum")] {
                            if !b.is_empty() {
                                bad.push((role, b, kind));
                            }
                        }
                        rows.push(buf);
                    }
                    Err(_) => {
                        bad.push((role, vec![member_at(role, dev)], "read-error"));
                        rows.push(Vec::new());
                    }
                }
            }
            if bad.is_empty() {
                // Everything checks out: redundancy must agree with it.
                let data: Vec<Vec<u8>> = sm.data.iter().map(|&r| rows[r].clone()).collect();
                let (p, q) = parity_of(&sm, &data, chunk as usize);
                let mut wrong: Vec<(usize, Vec<u8>)> = Vec::new();
                if p != rows[sm.p] {
                    wrong.push((sm.p, p));
                }
                if let Some(qr) = sm.q.filter(|&qr| q != rows[qr]) {
                    wrong.push((qr, q));
                }
                for (role, good) in wrong {
                    let (lo, hi) = differing(&good, &rows[role]);
                    if repair {
                        self.core.member_write(v, role, &good, dev)?;
                    }
                    each(Finding {
                        member: name(role),
                        role,
                        member_offset: member_at(role, dev + lo),
                        array_offset: array_of(role, dev + lo),
                        length: hi - lo,
                        kind: "parity",
                        action: if repair { "repaired" } else { "reported" },
                    });
                }
            } else if repair {
                // Rebuilt from redundancy through the read path (checked
                // against each bad block's own checksum, rewritten, read
                // back); then P and Q recomputed from the data.
                // Blocks a rebuild could not make stay as they are (an
                // error until written), and so does parity over them; the
                // rest is rebuilt around them, one block column at a time
                // where the stripe holds one (taken whole, a lost block
                // left every other column of the stripe unrepaired).
                let lost = |r: usize, col: u64, len: u64| self.core.lost_in(v, r, dev + col, len);
                let cols: Vec<(u64, u64)> = if (0..g.members()).any(|r| lost(r, 0, chunk)) {
                    (0..chunk)
                        .step_by(BLOCK as usize)
                        .map(|c| (c, BLOCK.min(chunk - c)))
                        .collect()
                } else {
                    vec![(0, chunk)]
                };
                for (col, len) in cols {
                    let need: Vec<bool> = sm.data.iter().map(|&r| !lost(r, col, len)).collect();
                    let Ok(r) = self.read_rows(v, u, col, len, &need) else {
                        continue;
                    };
                    r.into_iter().for_each(scratch::give);
                    if need.iter().all(|&n| n) {
                        let _ = self.recompute_parity(
                            v,
                            u,
                            col,
                            len,
                            crate::levels::parity::DataFrom::OrRedundancy,
                        );
                    }
                }
            }
            for (role, blocks, kind) in bad {
                let still = if repair {
                    let v = self.core.view.load();
                    match self.scan(&v, role, dev, chunk, None) {
                        Ok((b, s)) => {
                            scratch::give(b);
                            s
                        }
                        Err(_) => blocks.clone(),
                    }
                } else {
                    Vec::new()
                };
                let base = member_at(role, 0);
                let run = Run {
                    role,
                    kind,
                    unit: chunk,
                    repair,
                };
                run.report(each, &name(role), &blocks, &still, |lo| {
                    array_of(role, lo - base)
                });
            }
            rows.into_iter().for_each(scratch::give);
            return Ok(());
        }
        // Mirrors and striped levels: each piece's copies.
        for p in g.pieces(u * chunk, chunk).iter() {
            let lock = (ahead.is_none()
                && g.level != raidkit_layout::Level::Raid0
                && g.level != raidkit_layout::Level::Linear)
                .then(|| self.core.lock(p.logical / chunk));
            let mut scans = Vec::new();
            for &(role, dev) in &p.copies {
                scans.push((role, dev, self.scan(v, role, dev, p.len, ahead)));
            }
            let bad_any = scans
                .iter()
                .any(|(_, _, s)| !matches!(s, Ok((_, b)) if b.is_empty()));
            let mut differ = false;
            if !bad_any && scans.len() > 1 {
                let first = &scans[0].2.as_ref().expect("checked").0;
                for (role, dev, s) in &scans[1..] {
                    let buf = &s.as_ref().expect("checked").0;
                    if buf != first {
                        differ = true;
                        let (lo, hi) = differing(first, buf);
                        if repair {
                            self.core.member_write(v, *role, first, *dev)?;
                        }
                        each(Finding {
                            member: name(*role),
                            role: *role,
                            member_offset: member_at(*role, dev + lo),
                            array_offset: p.logical + lo,
                            length: hi - lo,
                            kind: "copies",
                            action: if repair { "repaired" } else { "reported" },
                        });
                    }
                }
            }
            if !bad_any {
                drop(lock);
                let _ = differ;
                scans
                    .into_iter()
                    .for_each(|(_, _, s)| s.into_iter().for_each(|(b, _)| scratch::give(b)));
                continue;
            }
            // A bad copy rewritten from a copy that checks out (still under
            // the lock, so no write slips in between).
            let clean = scans
                .iter()
                .find_map(|(_, _, s)| s.as_ref().ok().filter(|(_, b)| b.is_empty()))
                .map(|(buf, _)| buf.clone());
            if repair {
                if let Some(good) = &clean {
                    for (role, dev, s) in &scans {
                        if !matches!(s, Ok((_, b)) if b.is_empty()) {
                            self.core.repair(v, *role, good, *dev);
                        }
                    }
                }
            }
            drop(lock);
            for (role, dev, s) in scans {
                let (blocks, kind) = match s {
                    Ok((b, blocks)) => {
                        scratch::give(b);
                        (blocks, "checksum")
                    }
                    Err(_) => (vec![member_at(role, dev)], "read-error"),
                };
                if blocks.is_empty() {
                    continue;
                }
                let still = if repair && clean.is_some() {
                    match self.scan(v, role, dev, p.len, None) {
                        Ok((b, s)) => {
                            scratch::give(b);
                            s
                        }
                        Err(_) => blocks.clone(),
                    }
                } else {
                    blocks.clone()
                };
                let (lost, rot) = match kind {
                    "checksum" => self.split_lost(v, role, blocks),
                    _ => (Vec::new(), blocks),
                };
                let base = member_at(role, dev);
                for (blocks, kind) in [(lost, "lost"), (rot, kind)] {
                    let run = Run {
                        role,
                        kind,
                        unit: p.len,
                        repair,
                    };
                    run.report(each, &name(role), &blocks, &still, |lo| {
                        p.logical + (lo - base)
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a scrub found on one member of a unit, to be reported.
struct Run {
    role: usize,
    kind: &'static str,
    /// A read error's length (the whole piece read).
    unit: u64,
    repair: bool,
}

impl Run {
    /// One finding per run of `blocks` (member offsets): repaired where
    /// `still` (the blocks a read after the repair found bad) has none of
    /// it. `array_of` gives a member offset's array offset.
    fn report(
        &self,
        each: &mut dyn FnMut(Finding),
        member: &str,
        blocks: &[u64],
        still: &[u64],
        array_of: impl Fn(u64) -> u64,
    ) {
        for (lo, n) in runs(blocks) {
            let fixed = !still.iter().any(|&o| o >= lo && o < lo + n * BLOCK);
            each(Finding {
                member: member.to_string(),
                role: self.role,
                member_offset: lo,
                array_offset: array_of(lo),
                length: if self.kind == "read-error" {
                    self.unit
                } else {
                    n * BLOCK
                },
                kind: self.kind,
                action: match (self.repair, fixed) {
                    (false, _) => "reported",
                    (true, true) => "repaired",
                    (true, false) => "unrepaired",
                },
            });
        }
    }
}

impl Array {
    /// `blocks` of role `role` (member offsets) split into those a rebuild
    /// marked lost (what it was rebuilt from was bad: not this member's
    /// rot) and the rest.
    fn split_lost(&self, v: &View, role: usize, blocks: Vec<u64>) -> (Vec<u64>, Vec<u64>) {
        let Some(c) = v.roles[role].disk.as_ref().and_then(|d| d.checked.as_ref()) else {
            return (Vec::new(), blocks);
        };
        blocks
            .into_iter()
            .partition(|&at| c.is_lost(at).unwrap_or(false))
    }
}

/// The first and last differing byte of two buffers, widened to blocks.
fn differing(a: &[u8], b: &[u8]) -> (u64, u64) {
    let lo = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0) as u64;
    let hi = a.len() - a.iter().zip(b).rev().position(|(x, y)| x != y).unwrap_or(0);
    (
        lo / BLOCK * BLOCK,
        (hi as u64).next_multiple_of(BLOCK).min(a.len() as u64),
    )
}

/// Runs of consecutive blocks (start offset, count) in a sorted list.
fn runs(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((lo, n)) if *lo + *n * BLOCK == b => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

/// Read a member's bytes as they are, with the member offsets of blocks
/// that disagree with their checksums.
fn read_verdict(d: &Disk, buf: &mut [u8], at: u64) -> std::result::Result<Vec<u64>, MemberError> {
    match &d.checked {
        Some(c) => c.read_verdict(buf, at),
        None => d.member.read_at(buf, at).map(|()| Vec::new()),
    }
}

/// A member range read ahead, with the member offsets of its blocks that
/// disagreed with their checksums when read (checked at once, as the
/// levels without a stripe lock need: a write landing later must not make
/// old bytes look rotten).
struct Range {
    role: usize,
    disk: Arc<Disk>,
    dev: u64,
    data: Vec<u8>,
    bad: Vec<u64>,
}

/// The member ranges of a run of units, read ahead.
#[derive(Default)]
pub(crate) struct Ahead {
    ranges: Vec<Range>,
}

impl Ahead {
    /// The bytes of `[dev, dev + len)` on `role` and its bad blocks, if
    /// read ahead from this very member; None sends the caller to read
    /// it itself (also after a read error ahead, so that the error is
    /// found and named chunk by chunk as without read-ahead).
    fn get(&self, d: &Arc<Disk>, role: usize, dev: u64, len: u64) -> Option<(&[u8], Vec<u64>)> {
        let r = self.ranges.iter().find(|r| {
            r.role == role
                && Arc::ptr_eq(&r.disk, d)
                && r.dev <= dev
                && dev + len <= r.dev + r.data.len() as u64
        })?;
        let s = (dev - r.dev) as usize;
        let at = d.data_offset + dev;
        let bad = r.bad.iter().copied().filter(|&o| o >= at && o < at + len);
        Some((&r.data[s..s + len as usize], bad.collect()))
    }
}

/// A step of units: its stripe locks (held from before its reads until
/// it is done) and its readers, one thread per member.
struct Step<'a> {
    a: u64,
    b: u64,
    readers: Vec<JoinHandle<Vec<Range>>>,
    ahead: Ahead,
    _guards: Vec<crate::core::StripeGuard<'a>>,
}

impl Step<'_> {
    fn join(&mut self) {
        for h in self.readers.drain(..) {
            if let Ok(r) = h.join() {
                self.ahead.ranges.extend(r);
            }
        }
    }
}

impl Drop for Step<'_> {
    /// Readers finish before the locks go (their bytes are not used, but
    /// no read of a range should outlive its lock).
    fn drop(&mut self) {
        self.join();
    }
}

/// Units scrubbed in order, their member ranges read in steps (about
/// 1 MiB per member) ahead, every member at once, with the next steps
/// already queued on the disks while this one is checked, so each disk
/// streams. Unit by unit, reading one chunk of each member after the
/// other, a scrub ran at a fraction of the disks' rate.
pub(crate) struct ReadAhead<'a> {
    array: &'a Array,
    to: u64,
    step: u64,
    /// The current step first, then those read ahead.
    steps: std::collections::VecDeque<Step<'a>>,
}

/// Steps read ahead of the current one.
const DEPTH: usize = 2;

impl<'a> ReadAhead<'a> {
    pub(crate) fn new(array: &'a Array, to: u64) -> ReadAhead<'a> {
        let step = ((1u64 << 20) / array.core.geom().chunk).max(1);
        ReadAhead {
            array,
            to,
            step,
            steps: Default::default(),
        }
    }

    /// Unit `u`'s ranges, read (its locks held until a unit past its step
    /// is asked for). Units are asked for in increasing order.
    pub(crate) fn at(&mut self, u: u64) -> &Ahead {
        while self.steps.front().is_some_and(|s| s.b <= u || s.a > u) {
            // Done with (or, out of order, not this one): its locks go.
            self.steps.pop_front();
        }
        if self.steps.is_empty() {
            let s = self.issue(u, false).expect("a blocking lock is always had");
            self.steps.push_back(s);
        }
        while self.steps.len() <= DEPTH {
            let b = self.steps.back().expect("a step").b;
            // Taken only if free: a client holding one of these locks may
            // be waiting for one of ours (the lock table wraps), so waiting
            // here could deadlock. Not had now, it is taken (blocking)
            // once the steps before it are done and their locks released.
            match (b < self.to).then(|| self.issue(b, true)).flatten() {
                Some(s) => self.steps.push_back(s),
                None => break,
            }
        }
        let cur = self.steps.front_mut().expect("current step");
        cur.join();
        &cur.ahead
    }

    /// Let go of every step read ahead (and its locks).
    pub(crate) fn release(&mut self) {
        self.steps.clear();
    }

    fn issue(&self, a: u64, only_if_free: bool) -> Option<Step<'a>> {
        let core = &self.array.core;
        let b = (a + self.step).min(self.to);
        let guards = if only_if_free {
            core.try_lock_range(a, b)?
        } else {
            core.lock_range(a, b)
        };
        let v = core.view.load_full();
        let g = &core.geom();
        let chunk = g.chunk;
        let mut want: Vec<Vec<(u64, u64)>> = vec![Vec::new(); g.members()];
        if g.level.is_parity() {
            for w in want.iter_mut() {
                w.push((a * chunk, b * chunk));
            }
        } else {
            for u in a..b {
                for p in g.pieces(u * chunk, chunk).iter() {
                    for &(role, dev) in &p.copies {
                        want[role].push((dev, dev + p.len));
                    }
                }
            }
        }
        let mut readers = Vec::new();
        for (role, mut ranges) in want.into_iter().enumerate() {
            let Some(disk) = v.roles[role].disk.clone() else {
                continue;
            };
            ranges.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::new();
            for (lo, hi) in ranges {
                match merged.last_mut() {
                    Some(m) if m.1 == lo => m.1 = hi,
                    _ => merged.push((lo, hi)),
                }
            }
            let spawned = std::thread::Builder::new()
                .name("scrub-read".into())
                .spawn(move || {
                    let mut out = Vec::new();
                    for (lo, hi) in merged {
                        let mut data = vec![0u8; (hi - lo) as usize];
                        let at = disk.data_offset + lo;
                        let Ok(bad) = read_verdict(&disk, &mut data, at) else {
                            continue;
                        };
                        out.push(Range {
                            role,
                            disk: disk.clone(),
                            dev: lo,
                            data,
                            bad,
                        });
                    }
                    out
                });
            // Without a thread (at the process's limit) the unit reads
            // its ranges itself, as it would without read-ahead.
            if let Ok(h) = spawned {
                readers.push(h);
            }
        }
        Some(Step {
            a,
            b,
            readers,
            ahead: Ahead::default(),
            _guards: guards,
        })
    }
}
