//! bonnie++'s tests, as bonnie++ 2.00 does them:
//! - char_write / char_read: one byte per write(2) / read(2) system call
//!   over --char-size bytes (bonnie++'s -f, 20 MiB) or for --seconds,
//!   whichever ends first (at under 1 MB/s, 20 MiB would take most of a
//!   short run), through the file system's cache: a measure of per-call
//!   cost more than of storage. In a
//!   directory they use a file of their own, written from empty as
//!   bonnie++'s is (bytes written into an existing file whose pages have
//!   left the cache cost a page read each, which bonnie++ never pays);
//! - block_write / block_read: the working set in --chunk pieces (8 KiB);
//! - rewrite: each chunk read, changed and written back in place;
//! - random_seeks: 8192 chunk reads at random places by 5 processes (here
//!   threads; stopped early at --seconds), one in ten changed and written
//!   back; seeks per second;
//! - file_create (a directory only): --files empty files created, stat'ed
//!   and deleted in name order, then in random order; files per second.
//!
//! Unlike bonnie++, which needs a file of twice RAM to get past the page
//! cache, every read test starts with the file's cached pages written back
//! and dropped, and every write test's time includes its flush.

use super::{xorshift, Ctx, Series, Writer};
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Seeks per random_seeks run, and the processes that share them (bonnie++'s).
const SEEKS: usize = 8192;
const SEEKERS: usize = 5;

pub(super) fn run(ctx: &Ctx, test: &'static str) -> Result<Vec<Series>> {
    match test {
        "file_create" => file_create(ctx),
        "random_seeks" => {
            let mut s = Series::new(test, "seeks/s");
            s.threads = SEEKERS;
            Ok(vec![ctx.series(s, test, || random_seeks(ctx))?])
        }
        "char_write" | "char_read" => {
            let n = ctx.a.char_size.min(ctx.size);
            let series = Series::new(test, "MB/s");
            if let Some(dir) = &ctx.t.dir {
                // In a directory, as bonnie++: a file of its own, written
                // from empty (no page of an older file to read first).
                let path = dir.join(format!("raidkit-bench-{}.chr", std::process::id()));
                let r = char_file(ctx, test, series, &path, n);
                let _ = std::fs::remove_file(&path);
                return Ok(vec![r?]);
            }
            let f = ctx
                .t
                .buffered
                .as_ref()
                .expect("char tests only run on file targets");
            Ok(vec![ctx.series(series, test, || {
                if test == "char_write" {
                    char_write(f, n, &mut Writer::new(ctx.pattern), ctx.a.seconds())
                } else {
                    ctx.t.drop_cache()?;
                    char_read(f, n, ctx.a.seconds())
                }
            })?])
        }
        _ => {
            Ok(vec![ctx.series(Series::new(test, "MB/s"), test, || {
                block(ctx, test)
            })?])
        }
    }
}

/// The per-character tests on a file of their own at `path`.
fn char_file(ctx: &Ctx, test: &str, series: Series, path: &Path, n: u64) -> Result<Series> {
    let open = |truncate: bool| {
        File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(truncate)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))
    };
    if test == "char_write" {
        return ctx.series(series, test, || {
            let f = open(true)?;
            char_write(&f, n, &mut Writer::new(ctx.pattern), ctx.a.seconds())
        });
    }
    // char_read: the file written first (in blocks), then read back from
    // the medium a byte at a time.
    let f = open(true)?;
    let mut w = Writer::new(ctx.pattern);
    let mut off = 0u64;
    while off < n {
        let k = (n - off).min(super::BLOCK as u64) as usize;
        std::os::unix::fs::FileExt::write_all_at(&f, w.data(0, k, off), off)?;
        off += k as u64;
    }
    ctx.series(series, test, || {
        super::drop_file_cache(&f)?;
        char_read(&f, n, ctx.a.seconds())
    })
}

/// Bytes moved one at a time between looks at the clock.
const CHAR_STEP: usize = 64 << 10;

fn char_write(mut f: &File, n: u64, w: &mut Writer, secs: f64) -> Result<f64> {
    f.seek(SeekFrom::Start(0))?;
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < n && (off == 0 || t0.elapsed().as_secs_f64() < secs) {
        // The bytes of the next piece, stamped as any write's; then one
        // system call per byte, as bonnie++'s per-character test.
        let k = (n - off).min(CHAR_STEP as u64) as usize;
        for c in w.data(0, k, off).chunks(1) {
            if f.write(c)? != 1 {
                bail!("short write in char_write");
            }
        }
        off += k as u64;
    }
    f.sync_data()?;
    Ok(off as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

fn char_read(mut f: &File, n: u64, secs: f64) -> Result<f64> {
    f.seek(SeekFrom::Start(0))?;
    let mut c = [0u8; 1];
    let mut sum = 0u64;
    let t0 = Instant::now();
    let mut done = 0u64;
    while done < n && (done == 0 || t0.elapsed().as_secs_f64() < secs) {
        let k = (n - done).min(CHAR_STEP as u64);
        for _ in 0..k {
            if f.read(&mut c)? != 1 {
                bail!("unexpected end of file in char_read");
            }
            sum = sum.wrapping_add(c[0] as u64);
        }
        done += k;
    }
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    Ok(done as f64 / secs / 1e6)
}

/// block_write, rewrite, block_read over the working set.
fn block(ctx: &Ctx, test: &str) -> Result<f64> {
    let io = ctx.t.bonnie_io();
    let chunk = ctx.a.chunk as usize;
    let n = ctx.size / chunk as u64 * chunk as u64;
    let mut w = Writer::new(ctx.pattern);
    let mut buf = vec![0u8; chunk];
    if test != "block_write" {
        ctx.t.drop_cache()?;
    }
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < n {
        match test {
            "block_write" => {
                let at = (off % super::BLOCK as u64) as usize;
                io.write_at(w.data(at, chunk, off), off)?;
            }
            "rewrite" => {
                io.read_at(&mut buf, off)?;
                buf[0] = buf[0].wrapping_add(1);
                io.write_at(&buf, off)?;
            }
            _ => io.read_at(&mut buf, off)?,
        }
        off += chunk as u64;
    }
    if test != "block_read" {
        io.flush()?;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

fn random_seeks(ctx: &Ctx) -> Result<f64> {
    let io = ctx.t.bonnie_io();
    let chunk = ctx.a.chunk as usize;
    let chunks = ctx.size / chunk as u64;
    ctx.t.drop_cache()?;
    let seeds: Vec<u64> = (0..SEEKERS).map(|_| ctx.draw_seed() | 1).collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let secs = ctx.a.seconds();
    let t0 = Instant::now();
    let errors: Vec<anyhow::Error> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..SEEKERS)
            .map(|p| {
                let mut x = seeds[p];
                let done = &done;
                sc.spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; chunk];
                    let mine = SEEKS / SEEKERS + usize::from(p < SEEKS % SEEKERS);
                    for i in 0..mine {
                        if i % 64 == 63 && t0.elapsed().as_secs_f64() >= secs {
                            break;
                        }
                        let off = (xorshift(&mut x) % chunks) * chunk as u64;
                        io.read_at(&mut buf, off)?;
                        if i % 10 == 0 {
                            buf[0] = buf[0].wrapping_add(1);
                            io.write_at(&buf, off)?;
                        }
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("seeker").err())
            .collect()
    });
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    io.flush()?;
    Ok(done.into_inner() as f64 / t0.elapsed().as_secs_f64())
}

/// A small deterministic shuffle (xorshift Fisher–Yates): the same random
/// order on every run.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        v.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    v
}

fn sync_dir(d: &Path) -> Result<()> {
    File::open(d)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing directory {}", d.display()))
}

fn name(d: &Path, i: usize) -> PathBuf {
    d.join(format!("{i:010}"))
}

fn rate(n: usize, t0: Instant) -> f64 {
    n as f64 / t0.elapsed().as_secs_f64()
}

/// One round of bonnie++ -n: six rates in the order of NAMES.
fn file_round(d: &Path, n: usize, ctx: &Ctx) -> Result<[f64; 6]> {
    let mut r = [0.0; 6];
    let create = |i: usize| -> Result<()> {
        File::options()
            .write(true)
            .create_new(true)
            .open(name(d, i))
            .map(drop)
            .with_context(|| format!("creating {}", name(d, i).display()))
    };
    let in_dir_order = || -> Result<Vec<PathBuf>> {
        std::fs::read_dir(d)?
            .map(|e| e.map(|e| e.path()).map_err(Into::into))
            .collect()
    };
    // Sequential: created in name order, stat'ed and deleted in directory order.
    let t0 = Instant::now();
    for i in 0..n {
        create(i)?;
    }
    sync_dir(d)?;
    r[0] = rate(n, t0);
    let t0 = Instant::now();
    let listed = in_dir_order()?;
    for p in &listed {
        std::fs::metadata(p)?;
    }
    r[1] = rate(listed.len(), t0);
    let t0 = Instant::now();
    let listed = in_dir_order()?;
    for p in &listed {
        std::fs::remove_file(p)?;
    }
    sync_dir(d)?;
    r[2] = rate(listed.len(), t0);
    // Random: created, stat'ed and deleted in random orders.
    let order = shuffled(n, ctx.draw_seed());
    let t0 = Instant::now();
    for &i in &order {
        create(i)?;
    }
    sync_dir(d)?;
    r[3] = rate(n, t0);
    let order = shuffled(n, ctx.draw_seed());
    let t0 = Instant::now();
    for &i in &order {
        std::fs::metadata(name(d, i))?;
    }
    r[4] = rate(n, t0);
    let order = shuffled(n, ctx.draw_seed());
    let t0 = Instant::now();
    for &i in &order {
        std::fs::remove_file(name(d, i))?;
    }
    sync_dir(d)?;
    r[5] = rate(n, t0);
    Ok(r)
}

/// The rates of one file_create round, in order.
pub(super) const NAMES: [&str; 6] = [
    "seq_create",
    "seq_stat",
    "seq_delete",
    "random_create",
    "random_stat",
    "random_delete",
];

fn file_create(ctx: &Ctx) -> Result<Vec<Series>> {
    let base = ctx.t.dir.as_ref().expect("file_create needs a directory");
    let d = base.join(format!("raidkit-bench-files-{}", std::process::id()));
    std::fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
    let mut out: Vec<Series> = NAMES.iter().map(|t| Series::new(t, "files/s")).collect();
    let result = (|| -> Result<()> {
        for run in 0..ctx.a.runs() {
            ctx.progress.start(format!(
                "file_create ({} files) run {}",
                ctx.a.files(),
                run + 1
            ));
            let r = file_round(&d, ctx.a.files(), ctx)?;
            for (s, v) in out.iter_mut().zip(r) {
                s.values.push(v);
            }
            for _ in 0..6 {
                ctx.progress.step();
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&d);
    result.map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v = shuffled(1000, 7);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}
