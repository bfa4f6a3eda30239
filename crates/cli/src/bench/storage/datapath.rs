//! The lab's data-path tests (the procurement benchmarks in the seeds): a
//! 256 KiB memory buffer written out repeatedly until the file is complete,
//! or data read into it and discarded.
//! - mem_to_target / target_to_mem: one large file (the working set, at
//!   most 1 GiB) from memory to the target and back;
//! - streams_write / streams_read: --streams simultaneous copies, each on
//!   its own part of the target, against one copy of the same size alone:
//!   aggregate and per-stream rates, and the overhead of sharing (the seeds
//!   report 17% for two writers on md RAID-5: 24 MB/s each against 29);
//! - mixed_rw: one copy in and one copy out at the same time.

use super::{Aligned, Ctx, Series, Writer, BLOCK};
use anyhow::Result;
use std::time::Instant;

/// The lab's buffer size.
const BUF: usize = 256 << 10;

/// Move `[off, off + len)` between memory and the target; seconds taken
/// (a write's includes its flush).
fn copy(ctx: &Ctx, write: bool, off: u64, len: u64, start: Instant) -> Result<f64> {
    let t = &ctx.t.main;
    let mut buf = Aligned::new(BUF);
    let mut w = write.then(|| Writer::new(ctx.pattern));
    let mut o = off;
    while o < off + len {
        let n = BUF.min((off + len - o) as usize);
        if let Some(w) = &mut w {
            let at = ((o - off) % BLOCK as u64) as usize;
            t.write_at(w.data(at, n, o), o)?;
        } else {
            t.read_at(&mut buf.as_mut_slice()[..n], o)?;
        }
        o += n as u64;
    }
    if write {
        t.flush()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Several copies at once, one thread each: the seconds each took, from a
/// common start.
fn together(ctx: &Ctx, jobs: &[(bool, u64, u64)]) -> Result<Vec<f64>> {
    ctx.t.drop_cache()?;
    let start = Instant::now();
    let res: Vec<Result<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = jobs
            .iter()
            .map(|&(w, off, len)| sc.spawn(move || copy(ctx, w, off, len, start)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("stream thread"))
            .collect()
    });
    res.into_iter().collect()
}

fn mbs(len: u64, secs: f64) -> f64 {
    len as f64 / secs / 1e6
}

pub(super) fn run(ctx: &Ctx, test: &'static str) -> Result<Vec<Series>> {
    let runs = ctx.a.runs;
    match test {
        "mem_to_target" | "target_to_mem" => {
            let len = ctx.size.min(1 << 30) / BUF as u64 * BUF as u64;
            let write = test == "mem_to_target";
            Ok(vec![ctx.series(Series::new(test, "MB/s"), test, || {
                let secs = together(ctx, &[(write, 0, len)])?[0];
                Ok(mbs(len, secs))
            })?])
        }
        "streams_write" | "streams_read" => {
            let write = test == "streams_write";
            let k = ctx.a.streams;
            let len = ctx.size / k as u64 / BUF as u64 * BUF as u64;
            let (one, all, per, over) = if write {
                (
                    "streams_write_one",
                    "streams_write",
                    "streams_write_per_stream",
                    "streams_write_overhead",
                )
            } else {
                (
                    "streams_read_one",
                    "streams_read",
                    "streams_read_per_stream",
                    "streams_read_overhead",
                )
            };
            let mut s = [
                Series::new(one, "MB/s"),
                Series::new(all, "MB/s"),
                Series::new(per, "MB/s"),
                Series::new(over, "%"),
            ];
            for x in &mut s[1..] {
                x.streams = Some(k);
            }
            for run in 0..runs {
                ctx.progress.start(format!("{one} run {}", run + 1));
                let base = mbs(len, together(ctx, &[(write, 0, len)])?[0]);
                ctx.progress.step();
                ctx.progress.start(format!("{all} x{k} run {}", run + 1));
                let jobs: Vec<(bool, u64, u64)> =
                    (0..k).map(|i| (write, i as u64 * len, len)).collect();
                let secs = together(ctx, &jobs)?;
                ctx.progress.step();
                let slowest = secs.iter().copied().fold(0.0f64, f64::max);
                let per_stream = secs.iter().map(|&t| mbs(len, t)).sum::<f64>() / k as f64;
                s[0].values.push(base);
                s[1].values.push(mbs(len * k as u64, slowest));
                s[2].values.push(per_stream);
                s[3].values.push(100.0 * (1.0 - per_stream / base));
            }
            Ok(s.into())
        }
        _ => {
            // mixed_rw: a writer on the first half, a reader on the second.
            let len = ctx.size / 2 / BUF as u64 * BUF as u64;
            let mut s = [
                Series::new("mixed_write", "MB/s"),
                Series::new("mixed_read", "MB/s"),
            ];
            for run in 0..runs {
                ctx.progress.start(format!("mixed_rw run {}", run + 1));
                let secs = together(ctx, &[(true, 0, len), (false, len, len)])?;
                s[0].values.push(mbs(len, secs[0]));
                s[1].values.push(mbs(len, secs[1]));
                ctx.progress.step();
            }
            Ok(s.into())
        }
    }
}
