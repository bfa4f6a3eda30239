//! The lab's data-path tests (the procurement benchmarks in the seeds): a
//! 256 KiB memory buffer written out repeatedly until the file is complete,
//! or data read into it and discarded.
//! - mem_to_target / target_to_mem: one large file (the working set, at
//!   most 1 GiB) from memory to the target and back;
//! - streams_write / streams_read: --streams simultaneous copies (K), each
//!   on its own part of the target, against one copy of the same size
//!   alone, as the seeds measured two writers on md RAID-5 (29 MB/s alone,
//!   24 MB/s each together):
//!   - `*_one`: the single copy's rate (29);
//!   - `*` (aggregate): all bytes over the time until the last copy ended;
//!   - `*_per_stream`: the mean of each copy's own rate (24);
//!   - `*_overhead`: what sharing cost each stream, 1 - per_stream / one
//!     (17 %). It is negative when each of the K copies ran faster than one
//!     copy alone did, which happens when one stream cannot keep the target
//!     busy (one request at a time against a target with more to give:
//!     an array of several disks, an export across a network): the streams
//!     then gain from sharing rather than lose. `*_scaling`, aggregate / one
//!     (K at best for a target with room for K, 1 for a saturated one),
//!     says the same from the other side;
//! - mixed_rw: one copy in and one copy out at the same time.

use super::{cpu, Aligned, Ctx, Series, Writer, BLOCK};
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
    let runs = ctx.a.runs();
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
            if let Some(n) = ctx.a.clients {
                return by_clients(ctx, write, n);
            }
            let k = ctx.a.streams;
            let len = ctx.size / k as u64 / BUF as u64 * BUF as u64;
            let mut s = stream_series(write, k);
            for run in 0..runs {
                let one = s[0].test;
                ctx.progress.start(format!("{one} run {}", run + 1));
                let clock = cpu::Clock::start();
                let base = mbs(len, together(ctx, &[(write, 0, len)])?[0]);
                let base_cpu = clock.pct();
                ctx.progress.step();
                ctx.progress
                    .start(format!("{} x{k} run {}", s[1].test, run + 1));
                let jobs: Vec<(bool, u64, u64)> =
                    (0..k).map(|i| (write, i as u64 * len, len)).collect();
                let clock = cpu::Clock::start();
                let secs = together(ctx, &jobs)?;
                let all_cpu = clock.pct();
                ctx.progress.step();
                let rates: Vec<f64> = secs.iter().map(|&t| mbs(len, t)).collect();
                push_streams(&mut s, base, base_cpu, &rates, &secs, len, all_cpu);
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
            for x in &mut s {
                x.threads = 2;
            }
            for run in 0..runs {
                ctx.progress.start(format!("mixed_rw run {}", run + 1));
                let clock = cpu::Clock::start();
                let secs = together(ctx, &[(true, 0, len), (false, len, len)])?;
                let pct = clock.pct();
                s[0].values.push(mbs(len, secs[0]));
                s[1].values.push(mbs(len, secs[1]));
                for x in &mut s {
                    x.cpu.push(pct);
                }
                ctx.progress.step();
            }
            Ok(s.into())
        }
    }
}

/// streams_write / streams_read from `n` client processes
/// ([`super::clients`]): the five series, and each client's rate.
fn by_clients(ctx: &Ctx, write: bool, n: usize) -> Result<Vec<Series>> {
    let len = ctx.size / n as u64 / BUF as u64 * BUF as u64;
    let target = ctx.target_text;
    let via = ctx.a.client_via.as_deref();
    let mut s = stream_series(write, n);
    let name: &'static str = if write {
        "streams_write_client"
    } else {
        "streams_read_client"
    };
    let mut per: Vec<Series> = (0..n)
        .map(|i| {
            let mut x = Series::new(name, "MB/s");
            x.client = Some(i + 1);
            x
        })
        .collect();
    for x in s.iter_mut() {
        // Each client is one thread of its own process: the busiest
        // client's CPU use is what tells whether a client was the bound.
        x.threads = 1;
    }
    for run in 0..ctx.a.runs() {
        ctx.progress
            .start(format!("{} (one client) run {}", s[0].test, run + 1));
        let one = super::clients::together(target, via, ctx.draw_seed(), &[(write, 0, len)])?;
        ctx.progress.step();
        ctx.progress
            .start(format!("{} ({n} clients) run {}", s[1].test, run + 1));
        let jobs: Vec<(bool, u64, u64)> = (0..n).map(|i| (write, i as u64 * len, len)).collect();
        let all = super::clients::together(target, via, ctx.draw_seed(), &jobs)?;
        ctx.progress.step();
        let secs: Vec<f64> = all.iter().map(|r| r.seconds).collect();
        let rates: Vec<f64> = secs.iter().map(|&t| mbs(len, t)).collect();
        let busiest = all.iter().map(|r| r.cpu).fold(0.0f64, f64::max);
        push_streams(
            &mut s,
            mbs(len, one[0].seconds),
            one[0].cpu,
            &rates,
            &secs,
            len,
            busiest,
        );
        for ((x, r), rate) in per.iter_mut().zip(&all).zip(&rates) {
            x.values.push(*rate);
            x.cpu.push(r.cpu);
        }
    }
    let mut out: Vec<Series> = s.into();
    out.extend(per);
    Ok(out)
}

/// The five series of a streams test of `k` streams: one alone, the
/// aggregate, per stream, overhead and scaling (defined at the top).
pub(super) fn stream_series(write: bool, k: usize) -> [Series; 5] {
    let names: [&'static str; 5] = if write {
        [
            "streams_write_one",
            "streams_write",
            "streams_write_per_stream",
            "streams_write_overhead",
            "streams_write_scaling",
        ]
    } else {
        [
            "streams_read_one",
            "streams_read",
            "streams_read_per_stream",
            "streams_read_overhead",
            "streams_read_scaling",
        ]
    };
    let mut s = [
        Series::new(names[0], "MB/s"),
        Series::new(names[1], "MB/s"),
        Series::new(names[2], "MB/s"),
        Series::new(names[3], "%"),
        Series::new(names[4], "x"),
    ];
    for x in &mut s[1..] {
        x.streams = Some(k);
        x.threads = k;
    }
    s
}

/// One run's figures into the series of [`stream_series`]: the copy alone
/// (`base` MB/s, with the client's CPU), and each stream's rate and
/// seconds together, each stream having moved `len` bytes.
pub(super) fn push_streams(
    s: &mut [Series; 5],
    base: f64,
    base_cpu: f64,
    rates: &[f64],
    secs: &[f64],
    len: u64,
    all_cpu: f64,
) {
    let k = rates.len();
    let slowest = secs.iter().copied().fold(0.0f64, f64::max);
    let per_stream = rates.iter().sum::<f64>() / k as f64;
    let aggregate = mbs(len * k as u64, slowest);
    s[0].values.push(base);
    s[0].cpu.push(base_cpu);
    s[1].values.push(aggregate);
    s[2].values.push(per_stream);
    s[3].values.push(100.0 * (1.0 - per_stream / base));
    s[4].values.push(aggregate / base);
    for x in &mut s[1..] {
        x.cpu.push(all_cpu);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_two_writers_cost_seventeen_percent() {
        // Two writers on md RAID-5: 29 MB/s alone, 24 MB/s each together.
        let mut s = stream_series(true, 2);
        let secs = [100.0 / 24.0, 100.0 / 24.0];
        push_streams(&mut s, 29.0, 50.0, &[24.0, 24.0], &secs, 100_000_000, 60.0);
        assert!((s[2].values[0] - 24.0).abs() < 1e-9);
        assert!((s[3].values[0] - 17.24).abs() < 0.01, "{}", s[3].values[0]);
        assert!((s[1].values[0] - 48.0).abs() < 1e-6);
        assert!((s[4].values[0] - 48.0 / 29.0).abs() < 1e-9);
        // Streams each faster together than one alone: negative overhead,
        // scaling above 1.
        let mut s = stream_series(false, 2);
        push_streams(
            &mut s,
            10.0,
            5.0,
            &[15.0, 15.0],
            &[1.0, 1.0],
            15_000_000,
            9.0,
        );
        assert!(s[3].values[0] < 0.0);
        assert!(s[4].values[0] > 1.0);
    }
}
