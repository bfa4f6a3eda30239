//! `raidkit bench TARGET`: storage benchmarks for any target (a file, a
//! block device, a directory, an NBD export, or a raidkit array given as
//! `array[...]`), honest by construction: incompressible data, every timed
//! write includes its flush, direct I/O where the target allows it (and a
//! warning when a figure may come from a cache), the page cache dropped
//! before buffered reads, scratch files filled before they are read,
//! measurements per zone (outer, middle and inner thirds), several runs
//! with median and spread, and the configuration and machine recorded with
//! the results.
//!
//! The tests: dd/fio style (here), bonnie++'s set ([`bonnie`]) and the
//! lab's data-path tests ([`datapath`]).

mod bonnie;
pub(crate) mod clients;
pub(crate) mod cpu;
mod datapath;
mod identity;
mod io;
pub(crate) mod members;
pub(crate) mod record;
mod report;
pub(crate) mod require;
mod uring;

use io::{Aligned, RandomJob, Rw};

use crate::cli::StorageBenchArgs;
use crate::units::human;
use anyhow::{anyhow, bail, Context, Result};
use raidkit_member::Member;

use raidkit_open::spec::{self, Spec};
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 1 << 20;
const SMALL: usize = 4096;

const DD: [&str; 4] = ["seq_write", "seq_read", "randwrite_4k", "randread_4k"];
/// bonnie++'s tests; the first six are its I/O line, file_create its second.
const BONNIE: [&str; 7] = [
    "char_write",
    "block_write",
    "rewrite",
    "char_read",
    "block_read",
    "random_seeks",
    "file_create",
];
const DATAPATH: [&str; 5] = [
    "mem_to_target",
    "target_to_mem",
    "streams_write",
    "streams_read",
    "mixed_rw",
];

/// Expand the --tests list (names and groups) in a stable order.
fn parse_tests(list: &str) -> Result<Vec<&'static str>> {
    let all: Vec<&'static str> = DD.iter().chain(&BONNIE).chain(&DATAPATH).copied().collect();
    let mut want: Vec<&'static str> = Vec::new();
    for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let group: &[&'static str] = match t {
            "all" => &all,
            "dd" => &DD,
            "bonnie" => &BONNIE,
            "datapath" => &DATAPATH,
            _ => match all.iter().find(|x| **x == t) {
                Some(x) => std::slice::from_ref(x),
                None => bail!(
                    "unknown test '{t}' (known: {}; groups: dd, bonnie, datapath, all)",
                    all.join(", ")
                ),
            },
        };
        for g in group {
            if !want.contains(g) {
                want.push(g);
            }
        }
    }
    if want.is_empty() {
        bail!("--tests is empty");
    }
    Ok(all.into_iter().filter(|t| want.contains(t)).collect())
}

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

/// What is being measured.
struct Target {
    /// The handle the dd-style and data-path tests use (direct I/O where
    /// the target allows it).
    main: Box<dyn Rw>,
    direct: bool,
    /// A buffered handle on the same file, for bonnie++'s tests, which go
    /// through the file system's cache as bonnie++ does (with the cache
    /// dropped before each read test).
    buffered: Option<File>,
    /// The directory, for file_create.
    dir: Option<PathBuf>,
}

impl Target {
    /// A target without a file system of its own (an array, an export).
    fn device(m: Arc<dyn Member>) -> Target {
        Target {
            main: Box::new(m),
            direct: false,
            buffered: None,
            dir: None,
        }
    }

    /// The handle for bonnie++'s block tests.
    fn bonnie_io(&self) -> &dyn Rw {
        match &self.buffered {
            Some(f) => f,
            None => &*self.main,
        }
    }

    /// Before a read test: make sure the next reads come from the target,
    /// not from the page cache (written back, then dropped).
    fn drop_cache(&self) -> Result<()> {
        match &self.buffered {
            Some(f) => drop_file_cache(f),
            None => Ok(()),
        }
    }
}

/// Write a file's cached pages back and drop them from the page cache.
fn drop_file_cache(f: &File) -> Result<()> {
    f.sync_data()?;
    // SAFETY: a plain advisory call on a file descriptor we own.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!(
            "posix_fadvise(DONTNEED): {}",
            std::io::Error::from_raw_os_error(r)
        );
    }
    Ok(())
}

/// The memory this process may fill with page cache: the machine's RAM, or
/// less when a memory cgroup limits it (a container, or a slice set up to
/// benchmark a large disk with a smaller working set). The page cache is
/// charged to the cgroup, so its limit is what "twice RAM" must exceed.
fn ram_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| meminfo_total(&s))
        .unwrap_or(0);
    let limit = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| cgroup_memory_limit(&s, Path::new("/sys/fs/cgroup")));
    match limit {
        Some(l) if total == 0 || l < total => l,
        _ => total,
    }
}

fn meminfo_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The lowest memory limit on the way from this process's memory cgroup up
/// to the root, for cgroup v1 (`N:memory:/path`, `memory.limit_in_bytes`
/// under `ROOT/memory`) and v2 (`0::/path`, `memory.max` under ROOT, or
/// under `ROOT/unified` on a hybrid system). None when no limit is set.
fn cgroup_memory_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (bases, file) = if ctrls.split(',').any(|c| c == "memory") {
            (vec![root.join("memory")], "memory.limit_in_bytes")
        } else if id == "0" && ctrls.is_empty() {
            (vec![root.to_path_buf(), root.join("unified")], "memory.max")
        } else {
            continue;
        };
        for base in bases {
            let mut dir = base.join(path.trim_start_matches('/'));
            loop {
                // "max" (v2) and v1's page-rounded i64::MAX both parse to no limit.
                let limit = std::fs::read_to_string(dir.join(file))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .filter(|&v| v < 1 << 62);
                if let Some(v) = limit {
                    best = Some(best.map_or(v, |b| b.min(v)));
                }
                if dir == base || !dir.pop() {
                    break;
                }
            }
        }
    }
    best
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

fn open_buffered(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// One measurement series.
pub(crate) struct Series {
    test: &'static str,
    unit: &'static str,
    zone: Option<&'static str>,
    qd: Option<usize>,
    streams: Option<usize>,
    /// Which client process (from 1) of --clients, for its own figure.
    client: Option<usize>,
    values: Vec<f64>,
    /// The client's CPU use during each run, in % of one CPU.
    cpu: Vec<f64>,
    /// Threads the client drove the test from (what its CPU use is
    /// judged against).
    threads: usize,
}

impl Series {
    fn new(test: &'static str, unit: &'static str) -> Series {
        Series {
            test,
            unit,
            zone: None,
            qd: None,
            streams: None,
            client: None,
            values: Vec::new(),
            cpu: Vec::new(),
            threads: 1,
        }
    }
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

/// A well-mixed 64-bit value from `x` (SplitMix64's output function).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The next number of a xorshift64 sequence (state must not be zero).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in buf.chunks_mut(8) {
        let b = xorshift(&mut x).to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// Bytes in a sector, the unit each write's stamp covers.
const SECTOR: usize = 512;

/// Numbers the writers apart (the top bits of every stamp).
static WRITERS: AtomicU64 = AtomicU64::new(1);

/// The data one writer writes: a copy of the base pattern (pseudo-random,
/// or the --data sample) in which, before every write, each 512-byte sector
/// gets a stamp in its first 16 bytes: its offset on the target and a
/// number no other write carries. This is what fio's `scramble_buffers`
/// (on by default) does: the data stays incompressible, and no two sectors
/// ever written are alike, so storage that deduplicates (ZFS with dedup,
/// VDO, some SSD controllers) cannot store the writes as references to one
/// block and look faster than it is. Without the stamps every 1 MiB
/// sequential write would be the same megabyte, and 4 KiB random writes
/// would cycle through 256 blocks.
struct Writer {
    buf: Aligned,
    serial: u64,
}

impl Writer {
    fn new(pattern: &Aligned) -> Writer {
        let mut buf = Aligned::new(pattern.len);
        buf.as_mut_slice().copy_from_slice(pattern.as_slice());
        Writer {
            buf,
            serial: WRITERS.fetch_add(1, Ordering::Relaxed) << 40,
        }
    }

    /// `len` bytes of the pattern from `at` (wrapping to the start when
    /// they would run past its end), stamped for a write at `off`.
    fn data(&mut self, at: usize, len: usize, off: u64) -> &[u8] {
        let at = if at + len > self.buf.len { 0 } else { at };
        self.serial += 1;
        let b = &mut self.buf.as_mut_slice()[at..at + len];
        stamp(b, off, self.serial);
        b
    }
}

/// How fast a writer prepares data (MB/s): the stamps of 256 MiB of 1 MiB
/// writes, the only work a write's data costs once the pattern is made.
/// Recorded with the results, so that a write figure can be seen to be far
/// from the cost of making its data.
fn prepare_rate(pattern: &Aligned) -> f64 {
    let mut w = Writer::new(pattern);
    let n = 256u64;
    let t0 = Instant::now();
    for i in 0..n {
        std::hint::black_box(w.data(0, BLOCK, i * BLOCK as u64));
    }
    (n * BLOCK as u64) as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e6
}

/// Stamp each whole sector of `b` (to be written at `off`) with its own
/// offset and `serial`.
fn stamp(b: &mut [u8], off: u64, serial: u64) {
    for (i, s) in b.chunks_exact_mut(SECTOR).enumerate() {
        s[..8].copy_from_slice(&(off + (i * SECTOR) as u64).to_le_bytes());
        s[8..16].copy_from_slice(&serial.to_le_bytes());
    }
}

/// Progress shown on a terminal: one step per run of a test.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(steps: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(steps);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {msg:36} [{bar:30}] {pos}/{len} runs, {elapsed} (about {eta} left)",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress { bar }
    }

    fn start(&self, what: String) {
        if let Some(b) = &self.bar {
            b.set_message(what);
        }
    }

    fn step(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    fn done(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Everything the tests need.
pub(crate) struct Ctx<'a> {
    t: &'a Target,
    size: u64,
    a: &'a StorageBenchArgs,
    pattern: &'a Aligned,
    /// Queue depths of the random tests.
    qds: Vec<usize>,
    /// The run's seed, and how many seeds have been drawn from it.
    seed: u64,
    draws: AtomicU64,
    progress: Progress,
    notes: Vec<String>,
    /// The target as given (what --clients' processes connect to).
    target_text: &'a str,
}

impl Ctx<'_> {
    /// A seed of its own for the next measurement: each one draws other
    /// offsets, so none reads exactly the blocks another just wrote (which
    /// a controller's or host's cache would still hold).
    fn draw_seed(&self) -> u64 {
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        splitmix64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// Run `f` --runs times into a series.
    fn series(
        &self,
        mut s: Series,
        label: &str,
        mut f: impl FnMut() -> Result<f64>,
    ) -> Result<Series> {
        for run in 0..self.a.runs() {
            self.progress.start(format!("{label} run {}", run + 1));
            let clock = cpu::Clock::start();
            s.values.push(f()?);
            s.cpu.push(clock.pct());
            self.progress.step();
        }
        Ok(s)
    }

    /// Write the pattern sequentially over `[off, off + len)` in `block`
    /// pieces; flushed.
    fn fill(&self, off: u64, len: u64, block: usize) -> Result<()> {
        let mut w = Writer::new(self.pattern);
        let mut o = off;
        while o < off + len {
            let n = block.min((off + len - o) as usize);
            let at = (o % BLOCK as u64) as usize;
            self.t.main.write_at(w.data(at, n, o), o)?;
            o += n as u64;
        }
        self.t.main.flush()
    }
}

pub fn run(a: StorageBenchArgs) -> Result<()> {
    let target_text = a.target.clone().ok_or_else(|| {
        anyhow!("give a TARGET (a file, block device, directory, nbd://HOST:PORT/EXPORT or array[...]), or a subcommand: parity, engine, sweep")
    })?;
    let mut tests = parse_tests(&a.tests)?;
    if a.runs() == 0 {
        bail!("--runs must be at least 1");
    }
    if a.streams == 0 {
        bail!("--streams must be at least 1");
    }
    if a.chunk < 512 || a.chunk > BLOCK as u64 || !a.chunk.is_multiple_of(512) {
        bail!("--chunk must be a multiple of 512 bytes between 512 and 1M");
    }
    if !(a.seconds() > 0.0 && a.seconds() <= 3600.0) {
        bail!("--seconds must be more than 0 and at most 3600");
    }
    if a.files() == 0 {
        bail!("--files must be at least 1");
    }
    let qds = parse_qds(&a.qd)?;
    if let Some(n) = a.clients {
        if !(1..=64).contains(&n) {
            bail!("--clients must be between 1 and 64");
        }
        if !(target_text.starts_with("nbd://") || target_text.starts_with("nbd+unix://")) {
            bail!("--clients runs separate client processes against an NBD export (nbd://...); {target_text} is not one");
        }
        if !tests.iter().any(|t| t.starts_with("streams_")) {
            bail!("--clients runs streams_write and streams_read: name them in --tests");
        }
    }
    let reqs = match &a.require {
        Some(r) => require::parse(r)?,
        None => Vec::new(),
    };
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let control_status = |a: &StorageBenchArgs| -> Result<Option<serde_json::Value>> {
        let Some(path) = &a.control else {
            return Ok(None);
        };
        let v = raidkit_control::call(
            path,
            &serde_json::json!({"cmd": "status"}),
            Duration::from_secs(10),
        )
        .map_err(|e| anyhow!("--control {}: {e}", path.display()))?;
        Ok(Some(identity::array_state(&v)))
    };
    if a.control.is_some()
        && !(target_text.starts_with("nbd://") || target_text.starts_with("nbd+unix://"))
    {
        bail!("--control is for an NBD export served by raidkit; an array[...] target is described without it");
    }
    let array_start = control_status(&a)?;
    let members_first = if a.members_first {
        Some(members::members_first(&a, &target_text)?)
    } else {
        None
    };
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        splitmix64(t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32))
    });
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
    let writes = |tests: &[&str]| {
        tests
            .iter()
            .any(|t| !matches!(*t, "seq_read" | "randread_4k" | "char_read" | "block_read"))
    };

    // The target.
    let mut cleanup: Option<PathBuf> = None;
    let mut notes: Vec<String> = Vec::new();
    let mut ram_fs = false;
    let mut nbd = false;
    let mut array: Option<Arc<raidkit_array::Array>> = None;
    let (target, size, kind) = if target_text.starts_with("nbd://")
        || target_text.starts_with("nbd+unix://")
    {
        raidkit_nbd::client::Address::parse(&target_text).map_err(|e| anyhow!(e))?;
        if writes(&tests) && !a.destroy_data {
            bail!(
                "{target_text}: the write tests would overwrite the export's data; give --destroy-data if that is intended, or --tests seq_read,randread_4k"
            );
        }
        let c = raidkit_nbd::NbdClient::connect(&target_text)?;
        if c.read_only() && writes(&tests) {
            bail!("{target_text} is a read-only export: only the read tests can run (--tests seq_read,randread_4k)");
        }
        nbd = true;
        let len = c.len();
        let size = a.size_limit().unwrap_or(len).min(len);
        (
            Target {
                main: Box::new(Arc::new(c)),
                direct: false,
                buffered: None,
                dir: None,
            },
            size,
            "NBD export",
        )
    } else if target_text.starts_with("array[")
        || target_text.starts_with("fault:")
        || target_text.starts_with("sim:")
    {
        let s = Spec::parse(&target_text)?;
        // Read tests alone open the array read-only: nothing on its
        // members changes, not even the superblocks' event counts.
        let read_only = !writes(&tests);
        let m: Arc<dyn Member> = if matches!(s, Spec::Array(_)) {
            let arr = Arc::new(spec::open_array(&s, read_only)?);
            array = Some(arr.clone());
            arr
        } else {
            spec::open(&s, read_only)?
        };
        let size = a.size_limit().unwrap_or(m.len()).min(m.len());
        (Target::device(m), size, "raidkit array")
    } else {
        let path = PathBuf::from(&target_text);
        let meta = std::fs::metadata(&path);
        match meta {
            Ok(m) if m.is_dir() => {
                let f = path.join(format!("raidkit-bench-{}.tmp", std::process::id()));
                let size = a.size_limit().unwrap_or(1 << 30);
                let (file, direct) = open_file(&f, true)?;
                cleanup = Some(f.clone());
                file.set_len(size)
                    .with_context(|| format!("sizing {}", f.display()))?;
                (
                    Target {
                        main: Box::new(file),
                        direct,
                        buffered: Some(open_buffered(&f)?),
                        dir: Some(path.clone()),
                    },
                    size,
                    "directory",
                )
            }
            Ok(m) => {
                if !a.destroy_data && writes(&tests) {
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
                let size = a.size_limit().unwrap_or(len).min(len);
                (
                    Target {
                        main: Box::new(file),
                        direct,
                        buffered: Some(open_buffered(&path)?),
                        dir: None,
                    },
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
                let size = a.size_limit().unwrap_or(1 << 30);
                let (file, direct) = open_file(&path, true)?;
                cleanup = Some(path.clone());
                file.set_len(size)?;
                (
                    Target {
                        main: Box::new(file),
                        direct,
                        buffered: Some(open_buffered(&path)?),
                        dir: None,
                    },
                    size,
                    "new file",
                )
            }
            Err(e) => return Err(anyhow!(e).context(format!("{}", path.display()))),
        }
    };
    let array_start_here = array
        .as_deref()
        .map(|x| identity::array_state(&identity::array_status(x)));
    if let Some(p) = cleanup.as_deref().or(Some(Path::new(&target_text))) {
        ram_fs = target.buffered.is_some() && in_ram(p);
    }
    let size = size / BLOCK as u64 * BLOCK as u64;
    let result = (|| -> Result<(Vec<Series>, Vec<String>)> {
        if size < 3 * BLOCK as u64 {
            bail!("a working set of {size} bytes is too small (at least 3 MiB)");
        }
        // Tests the target cannot do are skipped, and said so.
        if target.buffered.is_none() {
            let before = tests.len();
            tests.retain(|t| !matches!(*t, "char_write" | "char_read"));
            if tests.len() != before {
                notes.push(format!(
                    "char_write and char_read skipped: they measure one-byte system calls through a file system, and a {} has none",
                    if nbd { "NBD export" } else { "raidkit array" }
                ));
            }
        }
        if target.dir.is_none() && tests.contains(&"file_create") {
            tests.retain(|t| *t != "file_create");
            notes.push("file_create skipped: it needs a directory as the target".into());
        }
        if tests.is_empty() {
            bail!("none of the tests asked for can run on this target");
        }
        let mut ctx = Ctx {
            t: &target,
            size,
            a: &a,
            pattern: &pattern,
            qds: qds.clone(),
            seed,
            draws: AtomicU64::new(0),
            progress: Progress::new(0),
            notes: Vec::new(),
            target_text: &target_text,
        };
        // A scratch file we created is sparse: fill it, so that reads read
        // the medium rather than holes.
        if cleanup.is_some() && tests.iter().any(|t| !t.contains("write")) {
            ctx.progress.start("filling the scratch file".into());
            ctx.fill(0, size, BLOCK)?;
        }
        let steps: usize = tests
            .iter()
            .map(|t| match *t {
                "seq_write" | "seq_read" => zones(&a).len(),
                "randwrite_4k" | "randread_4k" => zones(&a).len() * qds.len(),
                "file_create" => 6,
                "streams_write" | "streams_read" => 2,
                _ => 1,
            })
            .sum::<usize>()
            * a.runs();
        ctx.progress = Progress::new(steps as u64);
        let mut out = Vec::new();
        for &test in &tests {
            match test {
                "seq_write" | "seq_read" | "randwrite_4k" | "randread_4k" => {
                    out.extend(dd_test(&ctx, test)?)
                }
                "char_write" | "block_write" | "rewrite" | "char_read" | "block_read"
                | "random_seeks" | "file_create" => out.extend(bonnie::run(&ctx, test)?),
                _ => out.extend(datapath::run(&ctx, test)?),
            }
        }
        ctx.progress.done();
        Ok((out, std::mem::take(&mut ctx.notes)))
    })();
    if let Some(p) = &cleanup {
        let _ = std::fs::remove_file(p);
    }
    let (series, more_notes) = result?;
    notes.extend(more_notes);
    if report::any_client_bound(&series) {
        notes.push(format!(
            "figures marked client-bound were taken while raidkit bench itself used at least {}% of the CPUs its threads could use: they show the client's limit, not the target's",
            cpu::BOUND_PCT
        ));
    }
    let prepare_mbs = prepare_rate(&pattern);
    let mut extra = serde_json::json!({
        "time": started,
        "label": a.label,
        "identity": if nbd || array.is_some() {
            serde_json::json!({"target": target_text})
        } else {
            identity::path(Path::new(&target_text))
        },
    });
    if let Some(m) = members_first {
        extra["members_first"] = m;
    }
    let array_end = match &array {
        Some(arr) => {
            extra["array"] = serde_json::json!({"start": array_start_here, "end": identity::array_state(&identity::array_status(arr))});
            None
        }
        None => control_status(&a)?,
    };
    if let (Some(s), Some(e)) = (&array_start, &array_end) {
        extra["array"] = serde_json::json!({"start": s, "end": e});
    }

    let ram = ram_bytes();
    let cache_bound = ram_fs || (!target.direct && size < 2 * ram);
    if ram_fs {
        notes.push(
            "warning: the target is on a RAM file system (tmpfs): every figure measures memory, not storage".into(),
        );
    } else if nbd && size < 2 * ram {
        notes.push(format!(
            "warning: figures may be cache-bound: the working set ({}) is less than twice this machine's RAM ({}), and an NBD server may cache what it serves",
            human(size),
            human(ram)
        ));
    } else if cache_bound {
        notes.push(format!(
            "warning: figures may be cache-bound: no direct I/O on this target and the working set ({}) is less than twice RAM ({}); read figures in particular may come from a cache",
            human(size),
            human(ram)
        ));
    }
    let (doc, failed) = report::emit(
        &a,
        &report::Meta {
            target_text: &target_text,
            kind,
            size,
            direct: target.direct,
            data_source: &data_source,
            tests: &tests,
            cache_bound,
            ram_fs,
            seed,
            qds: &qds,
            prepare_mbs,
            reqs: &reqs,
            extra,
        },
        &series,
        &notes,
    )?;
    if let Some(dir) = &a.record {
        let p = record::save(dir, &doc)?;
        eprintln!("raidkit: recorded in {}", p.display());
    }
    if failed > 0 {
        return Err(require::Failed {
            failed,
            of: reqs.len(),
        }
        .into());
    }
    Ok(())
}

/// `--qd`: comma-separated queue depths, 1 to 256 each.
fn parse_qds(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|q| match q.trim().parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => Err(anyhow!(
                "--qd {text}: give queue depths from 1 to 256, separated by commas (such as 1,32)"
            )),
        })
        .collect()
}

fn zones(a: &StorageBenchArgs) -> &'static [&'static str] {
    if a.whole() {
        &["all"]
    } else {
        &["outer", "middle", "inner"]
    }
}

/// seq_write / seq_read (1 MiB, MB/s) and randwrite_4k / randread_4k (IOPS
/// at queue depths 1 and 32), per zone.
fn dd_test(ctx: &Ctx, test: &'static str) -> Result<Vec<Series>> {
    let zs = zones(ctx.a);
    let zone_len = ctx.size / zs.len() as u64 / BLOCK as u64 * BLOCK as u64;
    let t = ctx.t;
    let mut out = Vec::new();
    let mut buf = Aligned::new(BLOCK);
    for (zi, &zone) in zs.iter().enumerate() {
        let z0 = zi as u64 * zone_len;
        let qds: &[usize] = match test {
            "seq_write" | "seq_read" => &[0],
            _ => &ctx.qds,
        };
        for &qd in qds {
            let mut s = Series::new(test, if qd == 0 { "MB/s" } else { "IOPS" });
            s.zone = Some(zone);
            s.qd = (qd > 0).then_some(qd);
            // Pipelining targets keep the queue from one thread; the others
            // have a thread per request in flight.
            s.threads = if ctx.t.main.pipelines(qd) {
                1
            } else {
                qd.max(1)
            };
            let label = if qd > 0 {
                format!("{test} {zone} qd{qd}")
            } else {
                format!("{test} {zone}")
            };
            out.push(ctx.series(s, &label, || {
                match test {
                    "seq_write" => {
                        let mut w = Writer::new(ctx.pattern);
                        let t0 = Instant::now();
                        let mut off = z0;
                        while off < z0 + zone_len {
                            t.main.write_at(w.data(0, BLOCK, off), off)?;
                            off += BLOCK as u64;
                        }
                        t.main.flush()?;
                        Ok(zone_len as f64 / t0.elapsed().as_secs_f64() / 1e6)
                    }
                    "seq_read" => {
                        let t0 = Instant::now();
                        let mut off = z0;
                        while off < z0 + zone_len {
                            t.main.read_at(buf.as_mut_slice(), off)?;
                            off += BLOCK as u64;
                        }
                        Ok(zone_len as f64 / t0.elapsed().as_secs_f64() / 1e6)
                    }
                    _ => RandomJob {
                        t: &*ctx.t.main,
                        secs: ctx.a.seconds(),
                        pattern: ctx.pattern,
                        seed: ctx.draw_seed(),
                        z0,
                        len: zone_len,
                        qd,
                        write: test == "randwrite_4k",
                    }
                    .run(),
                }
            })?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
