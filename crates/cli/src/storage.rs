//! `raidkit bench TARGET`: storage benchmarks for any target (a file, a
//! block device, a directory, or a raidkit array given as `array[...]`),
//! honest by construction: incompressible data, every timed write includes
//! its flush, direct I/O where the target allows it (and a warning when a
//! figure may come from a cache), measurements per zone (outer, middle and
//! inner thirds), several runs with median and spread, and the
//! configuration and machine recorded with the results.

use crate::cli::StorageBenchArgs;
use crate::units::human;
use anyhow::{anyhow, bail, Context, Result};
use raidkit_array::spec::{self, Spec};
use raidkit_member::Member;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 1 << 20;
const SMALL: usize = 4096;
/// Tests run by default.
pub const DEFAULT_TESTS: &str = "seq_write,seq_read,randwrite_4k,randread_4k";
const ALL_TESTS: [&str; 4] = ["seq_write", "seq_read", "randwrite_4k", "randread_4k"];

/// Shannon entropy of the bytes, in bits per byte (8 for random data).
pub fn entropy(data: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in data {
        counts[b as usize] += 1;
    }
    let n = data.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// A buffer aligned for direct I/O.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; sharing it
// read-only across threads is sound.
unsafe impl Send for Aligned {}
// SAFETY: as above; only `&self` (read-only) access is shared.
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(SMALL), SMALL).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points at len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len.max(SMALL), SMALL).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// What is being measured.
enum Target {
    File { file: File, direct: bool },
    Array(Arc<dyn Member>),
}

impl Target {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        match self {
            Target::File { file, .. } => file.read_exact_at(buf, off).map_err(Into::into),
            Target::Array(m) => m.read_at(buf, off).map_err(Into::into),
        }
    }

    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        match self {
            Target::File { file, .. } => file.write_all_at(buf, off).map_err(Into::into),
            Target::Array(m) => m.write_at(buf, off).map_err(Into::into),
        }
    }

    fn flush(&self) -> Result<()> {
        match self {
            Target::File { file, .. } => file.sync_data().map_err(Into::into),
            Target::Array(m) => m.flush().map_err(Into::into),
        }
    }

    fn direct(&self) -> bool {
        matches!(self, Target::File { direct: true, .. })
    }
}

fn ram_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Whether a path lives on a RAM file system (tmpfs, ramfs): direct I/O
/// there still measures memory.
fn in_ram(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we own; c is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

fn open_file(path: &Path, create: bool) -> Result<(File, bool)> {
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    match direct {
        Ok(f) => Ok((f, true)),
        // tmpfs and some file systems refuse O_DIRECT: buffered, and said so.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
            false,
        )),
        Err(e) => Err(anyhow!(e).context(format!("opening {}", path.display()))),
    }
}

/// One measurement series.
struct Series {
    test: &'static str,
    unit: &'static str,
    zone: Option<&'static str>,
    qd: Option<usize>,
    values: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

pub fn run(a: StorageBenchArgs) -> Result<()> {
    let target_text = a
        .target
        .clone()
        .ok_or_else(|| anyhow!("give a TARGET (a file, block device, directory or array[...]), or a subcommand: parity, engine"))?;
    if target_text.starts_with("nbd://") || target_text.starts_with("nbd+unix://") {
        bail!(
            "NBD targets are not supported yet; serve the export through nbdfuse and give the file"
        );
    }
    let tests: Vec<&'static str> = a
        .tests
        .split(',')
        .map(|t| {
            ALL_TESTS
                .iter()
                .copied()
                .find(|x| *x == t.trim())
                .ok_or_else(|| anyhow!("unknown test '{t}' (known: {})", ALL_TESTS.join(", ")))
        })
        .collect::<Result<_>>()?;
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    // The data written: incompressible by default.
    let mut pattern = Aligned::new(BLOCK);
    let data_source = match &a.data {
        Some(p) => {
            let sample =
                std::fs::read(p).with_context(|| format!("reading --data {}", p.display()))?;
            if sample.is_empty() {
                bail!("--data {} is empty", p.display());
            }
            let e = entropy(&sample[..sample.len().min(16 << 20)]);
            if e < 7.5 && !a.allow_compressible {
                bail!(
                    "--data {} looks compressible ({e:.2} bits of entropy per byte; random data has 8): storage that compresses would look faster than it is; give --allow-compressible to use it anyway",
                    p.display()
                );
            }
            for (i, b) in pattern.as_mut_slice().iter_mut().enumerate() {
                *b = sample[i % sample.len()];
            }
            format!("{} ({e:.2} bits/byte)", p.display())
        }
        None => {
            fill_random(pattern.as_mut_slice(), 0x5eed);
            "pseudo-random (incompressible)".to_string()
        }
    };

    // The target.
    let mut cleanup: Option<PathBuf> = None;
    let mut notes: Vec<String> = Vec::new();
    let mut ram_fs = false;
    let (target, size, kind) = if target_text.starts_with("array[")
        || target_text.starts_with("fault:")
        || target_text.starts_with("sim:")
    {
        let s = Spec::parse(&target_text)?;
        let m = spec::open(&s, false)?;
        let size = a.size.unwrap_or(m.len()).min(m.len());
        (Target::Array(m), size, "raidkit array")
    } else {
        let path = PathBuf::from(&target_text);
        let meta = std::fs::metadata(&path);
        match meta {
            Ok(m) if m.is_dir() => {
                let f = path.join(format!("raidkit-bench-{}.tmp", std::process::id()));
                let size = a.size.unwrap_or(1 << 30);
                let (file, direct) = open_file(&f, true)?;
                file.set_len(size)
                    .with_context(|| format!("sizing {}", f.display()))?;
                cleanup = Some(f);
                (Target::File { file, direct }, size, "directory")
            }
            Ok(m) => {
                if !a.destroy_data && tests.iter().any(|t| t.contains("write")) {
                    bail!(
                        "{} exists: the write tests would overwrite it; give --destroy-data if that is intended, or --tests seq_read,randread_4k",
                        path.display()
                    );
                }
                let (file, direct) = open_file(&path, false)?;
                let len = if m.file_type().is_block_device() {
                    use std::io::Seek;
                    let mut f2 = &file;
                    f2.seek(std::io::SeekFrom::End(0))?
                } else {
                    m.len()
                };
                if len < (3 * BLOCK) as u64 {
                    bail!(
                        "{} has {len} bytes: too small to measure (at least 3 MiB)",
                        path.display()
                    );
                }
                let size = a.size.unwrap_or(len).min(len);
                (
                    Target::File { file, direct },
                    size,
                    if m.file_type().is_block_device() {
                        "block device"
                    } else {
                        "file"
                    },
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let parent = path
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                if !parent.is_dir() {
                    bail!("{}: no such file or directory", path.display());
                }
                let size = a.size.unwrap_or(1 << 30);
                let (file, direct) = open_file(&path, true)?;
                file.set_len(size)?;
                cleanup = Some(path.clone());
                (Target::File { file, direct }, size, "new file")
            }
            Err(e) => return Err(anyhow!(e).context(format!("{}", path.display()))),
        }
    };
    if let Some(p) = cleanup.as_deref().or(Some(Path::new(&target_text))) {
        ram_fs = matches!(target, Target::File { .. }) && in_ram(p);
    }
    let size = size / BLOCK as u64 * BLOCK as u64;
    if size < 3 * BLOCK as u64 {
        bail!("a working set of {size} bytes is too small (at least 3 MiB)");
    }
    let ram = ram_bytes();
    let cache_bound = ram_fs || (!target.direct() && size < 2 * ram);
    if ram_fs {
        notes.push(
            "warning: the target is on a RAM file system (tmpfs): every figure measures memory, not storage".into(),
        );
    } else if cache_bound {
        notes.push(format!(
            "warning: figures may be cache-bound: no direct I/O on this target and the working set ({}) is less than twice RAM ({}); read figures in particular may come from the page cache",
            human(size),
            human(ram)
        ));
    }
    let result = measure(&target, size, &tests, &a, &pattern);
    if let Some(p) = &cleanup {
        let _ = std::fs::remove_file(p);
    }
    let series = result?;

    let config = json!({
        "target": target_text,
        "kind": kind,
        "size": size,
        "direct_io": target.direct(),
        "runs": a.runs,
        "seconds": a.seconds,
        "data": data_source,
        "tests": tests,
        "machine": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "ram": ram,
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "cpu": std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|x| x.trim().to_string())),
        },
        "cache_bound": cache_bound,
        "ram_fs": ram_fs,
        "raidkit": env!("CARGO_PKG_VERSION"),
    });
    let results: Vec<Value> = series
        .iter()
        .map(|s| {
            let mut o = json!({
                "test": s.test,
                "value": median(&s.values),
                "unit": s.unit,
                "runs": s.values.len(),
                "min": s.values.iter().copied().fold(f64::INFINITY, f64::min),
                "max": s.values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            });
            if let Some(z) = s.zone {
                o["zone"] = json!(z);
            }
            if let Some(q) = s.qd {
                o["qd"] = json!(q);
            }
            o
        })
        .collect();
    if let Some(csv) = &a.csv {
        let mut text = String::from("test,zone,qd,value,unit,runs,min,max\n");
        for r in &results {
            text.push_str(&format!(
                "{},{},{},{:.3},{},{},{:.3},{:.3}\n",
                r["test"].as_str().unwrap_or(""),
                r["zone"].as_str().unwrap_or(""),
                r["qd"].as_u64().map(|q| q.to_string()).unwrap_or_default(),
                r["value"].as_f64().unwrap_or(0.0),
                r["unit"].as_str().unwrap_or(""),
                r["runs"],
                r["min"].as_f64().unwrap_or(0.0),
                r["max"].as_f64().unwrap_or(0.0),
            ));
        }
        std::fs::write(csv, text).with_context(|| format!("writing {}", csv.display()))?;
    }
    for n in &notes {
        eprintln!("raidkit: {n}");
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"config": config, "results": results, "notes": notes})
            )?
        );
        return Ok(());
    }
    println!(
        "raidkit bench {target_text} ({kind}, {} working set, {} I/O, {} run(s), data {data_source})",
        human(size),
        if target.direct() { "direct" } else { "buffered" },
        a.runs
    );
    println!(
        "{:<14} {:<7} {:>3} {:>12} {:<6} {:>12} {:>12}",
        "test", "zone", "qd", "median", "unit", "min", "max"
    );
    for r in &results {
        println!(
            "{:<14} {:<7} {:>3} {:>12.1} {:<6} {:>12.1} {:>12.1}",
            r["test"].as_str().unwrap_or(""),
            r["zone"].as_str().unwrap_or("-"),
            r["qd"]
                .as_u64()
                .map(|q| q.to_string())
                .unwrap_or_else(|| "-".into()),
            r["value"].as_f64().unwrap_or(0.0),
            r["unit"].as_str().unwrap_or(""),
            r["min"].as_f64().unwrap_or(0.0),
            r["max"].as_f64().unwrap_or(0.0),
        );
    }
    Ok(())
}

const ZONES: [&str; 3] = ["outer", "middle", "inner"];

fn measure(
    t: &Target,
    size: u64,
    tests: &[&'static str],
    a: &StorageBenchArgs,
    pattern: &Aligned,
) -> Result<Vec<Series>> {
    let zone_len = size / 3 / BLOCK as u64 * BLOCK as u64;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new((tests.len() * a.runs * 3) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg:24} [{bar:30}] {pos}/{len}")
                .expect("template")
                .progress_chars("=> "),
        );
        b
    });
    let mut out: Vec<Series> = Vec::new();
    let mut buf = Aligned::new(BLOCK);
    for &test in tests {
        for (zi, &zone) in ZONES.iter().enumerate() {
            let z0 = zi as u64 * zone_len;
            let (unit, qds): (&'static str, &[usize]) = match test {
                "seq_write" | "seq_read" => ("MB/s", &[0]),
                _ => ("IOPS", &[1, 32]),
            };
            for &qd in qds {
                let mut values = Vec::with_capacity(a.runs);
                for run in 0..a.runs {
                    if let Some(b) = &bar {
                        b.set_message(format!("{test} {zone} run {}", run + 1));
                    }
                    let v = match test {
                        "seq_write" => {
                            let t0 = Instant::now();
                            let mut off = z0;
                            while off < z0 + zone_len {
                                t.write_at(pattern.as_slice(), off)?;
                                off += BLOCK as u64;
                            }
                            t.flush()?;
                            zone_len as f64 / t0.elapsed().as_secs_f64() / 1e6
                        }
                        "seq_read" => {
                            let t0 = Instant::now();
                            let mut off = z0;
                            while off < z0 + zone_len {
                                t.read_at(buf.as_mut_slice(), off)?;
                                off += BLOCK as u64;
                            }
                            zone_len as f64 / t0.elapsed().as_secs_f64() / 1e6
                        }
                        "randwrite_4k" | "randread_4k" => random_io(
                            t,
                            z0,
                            zone_len,
                            qd,
                            test == "randwrite_4k",
                            a.seconds,
                            pattern,
                        )?,
                        _ => unreachable!(),
                    };
                    values.push(v);
                }
                out.push(Series {
                    test,
                    unit,
                    zone: Some(zone),
                    qd: (qd > 0).then_some(qd),
                    values,
                });
            }
            if let Some(b) = &bar {
                b.inc(a.runs as u64);
            }
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    Ok(out)
}

/// 4 KiB random reads or writes within `[z0, z0 + len)` by `qd` threads
/// for `secs` seconds (writes end with a flush inside the timing); IOPS.
fn random_io(
    t: &Target,
    z0: u64,
    len: u64,
    qd: usize,
    write: bool,
    secs: f64,
    pattern: &Aligned,
) -> Result<f64> {
    let blocks = len / SMALL as u64;
    let ops = AtomicU64::new(0);
    let deadline = Duration::from_secs_f64(secs.max(0.05));
    let t0 = Instant::now();
    let errors: Vec<anyhow::Error> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..qd)
            .map(|i| {
                let ops = &ops;
                sc.spawn(move || -> Result<()> {
                    let mut buf = Aligned::new(SMALL);
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((i as u64 + 1) * 0x1234_5678);
                    while t0.elapsed() < deadline {
                        for _ in 0..16 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let off = z0 + (x % blocks) * SMALL as u64;
                            if write {
                                let at = ((x >> 20) as usize % (BLOCK / SMALL)) * SMALL;
                                t.write_at(&pattern.as_slice()[at..at + SMALL], off)?;
                            } else {
                                t.read_at(buf.as_mut_slice(), off)?;
                            }
                        }
                        ops.fetch_add(16, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("bench thread").err())
            .collect()
    });
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    if write {
        t.flush()?;
    }
    Ok(ops.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_tells_random_from_compressible() {
        let mut r = vec![0u8; 1 << 20];
        fill_random(&mut r, 7);
        assert!(entropy(&r) > 7.99, "{}", entropy(&r));
        let text = b"the quick brown fox jumps over the lazy dog ".repeat(1000);
        assert!(entropy(&text) < 5.0);
        assert_eq!(entropy(&[0u8; 4096]), 0.0);
    }
}
