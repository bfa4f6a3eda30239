//! A member that injects faults into another: read errors at chosen
//! offsets, writes that start failing after a count, delays, and a member
//! that vanishes after a number of operations. For tests, and for fire drills
//! before an array is trusted.
//!
//! Configured from a query string (the part after `?` in a member spec such
//! as `fault:disk3.img?read-error-at=4M,9M&delay=5ms`):
//!
//! | key | meaning |
//! |-----|---------|
//! | `read-error-at=OFF[,OFF...]` | a read that covers any of these member offsets fails (EIO) |
//! | `bad-sector-at=OFF[,OFF...]` | as above until a write covers the offset (a pending sector the disk remaps on write) |
//! | `fail-writes-after=N` | the first N writes succeed, every later one fails (EIO) |
//! | `delay=DUR` | every read and write first sleeps DUR (`5ms`, `1s`, `200us`) |
//! | `write-delay=DUR` | every write first sleeps DUR (a disk slow to write: its writes land after those of the others) |
//! | `vanish-after=N` | after N operations every operation fails (ENODEV), as a pulled cable |
//! | `hang-after=DUR` | from DUR after it is opened, every operation waits 10 minutes before it is done: a disk hung in its firmware's retries, answering nothing and reporting no error |
//! | `hang-at=OFF[,OFF...]` | a read or write that covers any of these member offsets waits 10 minutes before it is done, while every other operation is answered: a sector the disk retries in its firmware while it serves its other queued commands |
//! | `flaky-at=OFF[,OFF...]` | the first read that covers each of these member offsets fails (EIO), later ones succeed: a marginal sector that reads on a retry |
//! | `corrupt-at=OFF[,OFF...]` | silent corruption: a read that covers any of these member offsets returns that byte with bits flipped (and no error), until a write covers the offset (the disk then holds what was written) |
//!
//! Offsets take K/M/G/T suffixes.

use crate::{Member, MemberError, Op, Result};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What to inject.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultConfig {
    pub read_error_at: Vec<u64>,
    pub bad_sector_at: Vec<u64>,
    pub fail_writes_after: Option<u64>,
    pub delay: Option<Duration>,
    pub write_delay: Option<Duration>,
    /// `write_delay` only for writes at or past this offset (a slow data
    /// area under quick metadata writes).
    pub write_delay_from: u64,
    pub vanish_after: Option<u64>,
    pub hang_after: Option<Duration>,
    pub hang_at: Vec<u64>,
    pub corrupt_at: Vec<u64>,
    pub flaky_at: Vec<u64>,
}

fn parse_u64_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suf) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a number"))?;
    let mult: u64 = match suf.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("'{s}': unknown suffix")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

pub(crate) fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration"))?;
    Ok(match unit {
        "us" => Duration::from_micros(n),
        "ms" | "" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(format!("'{s}': use us, ms or s")),
    })
}

impl FaultConfig {
    /// Parse `key=value&key=value`.
    pub fn parse(query: &str) -> std::result::Result<FaultConfig, String> {
        let mut c = FaultConfig::default();
        for part in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            match k {
                "read-error-at" => {
                    for o in v.split(',') {
                        c.read_error_at.push(parse_u64_size(o)?);
                    }
                }
                "bad-sector-at" => {
                    for o in v.split(',') {
                        c.bad_sector_at.push(parse_u64_size(o)?);
                    }
                }
                "fail-writes-after" => c.fail_writes_after = Some(parse_u64_size(v)?),
                "delay" => c.delay = Some(parse_duration(v)?),
                "write-delay" => c.write_delay = Some(parse_duration(v)?),
                "write-delay-from" => c.write_delay_from = parse_u64_size(v)?,
                "vanish-after" => c.vanish_after = Some(parse_u64_size(v)?),
                "hang-after" => c.hang_after = Some(parse_duration(v)?),
                "hang-at" => {
                    for o in v.split(',') {
                        c.hang_at.push(parse_u64_size(o)?);
                    }
                }
                "corrupt-at" => {
                    for o in v.split(',') {
                        c.corrupt_at.push(parse_u64_size(o)?);
                    }
                }
                "flaky-at" => {
                    for o in v.split(',') {
                        c.flaky_at.push(parse_u64_size(o)?);
                    }
                }
                other => {
                    return Err(format!(
                        "unknown fault '{other}' (read-error-at, bad-sector-at, fail-writes-after, delay, write-delay, write-delay-from, vanish-after, hang-after, hang-at, corrupt-at, flaky-at)"
                    ))
                }
            }
        }
        Ok(c)
    }
}

/// A member with faults injected.
#[derive(Debug)]
pub struct FaultMember {
    inner: Arc<dyn Member>,
    config: FaultConfig,
    name: String,
    ops: AtomicU64,
    writes: AtomicU64,
    /// Bad sectors not yet rewritten.
    pending: std::sync::Mutex<Vec<u64>>,
    /// Silently corrupt bytes not yet rewritten.
    corrupt: std::sync::Mutex<Vec<u64>>,
    /// Marginal sectors not yet read.
    flaky: std::sync::Mutex<Vec<u64>>,
    opened: std::time::Instant,
}

impl FaultMember {
    pub fn new(inner: Arc<dyn Member>, config: FaultConfig) -> FaultMember {
        let name = inner.name().to_string();
        FaultMember {
            inner,
            pending: std::sync::Mutex::new(config.bad_sector_at.clone()),
            corrupt: std::sync::Mutex::new(config.corrupt_at.clone()),
            flaky: std::sync::Mutex::new(config.flaky_at.clone()),
            config,
            name,
            ops: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            opened: std::time::Instant::now(),
        }
    }

    fn err(&self, op: Op, offset: u64, len: u64, errno: i32) -> MemberError {
        MemberError::new(
            &self.name,
            op,
            offset,
            len,
            io::Error::from_raw_os_error(errno),
        )
    }

    /// Count an operation; fail it if the member has vanished.
    fn enter(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        let n = self.ops.fetch_add(1, Ordering::Relaxed);
        if self.config.vanish_after.is_some_and(|v| n >= v) {
            return Err(self.err(op, offset, len, 19)); // ENODEV
        }
        if let Some(d) = self.config.delay {
            std::thread::sleep(d);
        }
        if self
            .config
            .hang_after
            .is_some_and(|h| self.opened.elapsed() >= h)
        {
            std::thread::sleep(Duration::from_secs(600));
        }
        if self
            .config
            .hang_at
            .iter()
            .any(|&o| o >= offset && o < offset + len)
        {
            std::thread::sleep(Duration::from_secs(600));
        }
        Ok(())
    }
}

impl FaultMember {
    /// A write's faults around `write`, which writes to the inner member.
    fn write_with(
        &self,
        buf: &[u8],
        offset: u64,
        write: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let len = buf.len() as u64;
        self.enter(Op::Write, offset, len)?;
        if let Some(d) = self.config.write_delay {
            if offset >= self.config.write_delay_from {
                std::thread::sleep(d);
            }
        }
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        if self.config.fail_writes_after.is_some_and(|f| n >= f) {
            return Err(self.err(Op::Write, offset, len, 5));
        }
        write()?;
        let outside = |&o: &u64| !(o >= offset && o < offset + len);
        self.pending.lock().expect("bad sectors").retain(outside);
        self.corrupt.lock().expect("corrupt bytes").retain(outside);
        Ok(())
    }
}

impl Member for FaultMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn refresh_len(&self) -> Result<u64> {
        self.inner.refresh_len()
    }

    fn peek_len(&self) -> Result<u64> {
        self.inner.peek_len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.enter(Op::Read, offset, len)?;
        if self
            .config
            .read_error_at
            .iter()
            .any(|&o| o >= offset && o < offset + len)
            || self
                .pending
                .lock()
                .expect("bad sectors")
                .iter()
                .any(|&o| o >= offset && o < offset + len)
        {
            return Err(self.err(Op::Read, offset, len, 5)); // EIO
        }
        {
            let mut flaky = self.flaky.lock().expect("marginal sectors");
            let before = flaky.len();
            flaky.retain(|&o| !(o >= offset && o < offset + len));
            if flaky.len() < before {
                return Err(self.err(Op::Read, offset, len, 5)); // EIO, once
            }
        }
        self.inner.read_at(buf, offset)?;
        for &o in self.corrupt.lock().expect("corrupt bytes").iter() {
            if o >= offset && o < offset + len {
                buf[(o - offset) as usize] ^= 0x5a;
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_with(buf, offset, || self.inner.write_at(buf, offset))
    }

    /// A durable write is a write like any other to the faults (it counts
    /// towards fail-writes-after and heals bad sectors), made durable by
    /// the member inside.
    fn write_at_durable(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_with(buf, offset, || self.inner.write_at_durable(buf, offset))
    }

    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn flush(&self) -> Result<()> {
        self.enter(Op::Flush, 0, 0)?;
        self.inner.flush()
    }

    fn remote(&self) -> Option<&dyn crate::Remote> {
        self.inner.remote()
    }

    fn rotational(&self) -> Option<bool> {
        self.inner.rotational()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemMember;

    #[test]
    fn parses_and_refuses() {
        let c = FaultConfig::parse(
            "read-error-at=4K,1M&fail-writes-after=3&delay=2ms&vanish-after=10&write-delay=1ms&write-delay-from=1M",
        )
        .unwrap();
        assert_eq!(c.read_error_at, vec![4096, 1 << 20]);
        assert_eq!(c.fail_writes_after, Some(3));
        assert_eq!(c.delay, Some(Duration::from_millis(2)));
        assert_eq!(c.write_delay, Some(Duration::from_millis(1)));
        assert_eq!(c.write_delay_from, 1 << 20);
        assert_eq!(c.vanish_after, Some(10));
        assert_eq!(
            FaultConfig::parse("hang-at=4K,2M").unwrap().hang_at,
            vec![4096, 2 << 20]
        );
        assert!(FaultConfig::parse("explode=1").is_err());
        assert!(FaultConfig::parse("delay=5 parsecs").is_err());
        assert!(FaultConfig::parse("read-error-at").is_err());
        assert!(FaultConfig::parse("read-error-at=12Q").is_err());
    }

    #[test]
    fn injects_what_it_is_told() {
        let inner: Arc<dyn Member> = Arc::new(MemMember::new("m", 1 << 20));
        let c =
            FaultConfig::parse("read-error-at=8192&fail-writes-after=2&vanish-after=8").unwrap();
        let f = FaultMember::new(inner, c);
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 0).unwrap(); // op 1
        let e = f.read_at(&mut b, 8000).unwrap_err(); // op 2: covers 8192
        assert_eq!(e.source.raw_os_error(), Some(5));
        f.read_at(&mut b, 8193).unwrap(); // op 3: starts after it
        f.write_at(&b, 0).unwrap(); // op 4
        f.write_at(&b, 0).unwrap(); // op 5
        assert!(f.write_at(&b, 0).is_err()); // op 6: third write fails
        f.read_at(&mut b, 0).unwrap(); // op 7
        f.flush().unwrap(); // op 8
        let e = f.read_at(&mut b, 0).unwrap_err(); // op 9: vanished
        assert_eq!(e.source.raw_os_error(), Some(19));
        assert!(f.flush().is_err());
    }

    #[test]
    fn durable_writes_are_faulted_as_writes_and_stay_durable_alone() {
        use crate::{CutRng, PowerCutMember};
        let dropped_elsewhere = (0..100).any(|seed| {
            let inner = Arc::new(PowerCutMember::new("p", vec![0; 64 << 10]));
            let f = FaultMember::new(
                inner.clone(),
                FaultConfig::parse("fail-writes-after=2").unwrap(),
            );
            f.write_at(&[3; 512], 8192).unwrap();
            f.write_at_durable(&[2; 512], 0).unwrap();
            assert!(
                f.write_at_durable(&[2; 512], 0).is_err(),
                "the third write fails"
            );
            inner.cut(&mut CutRng::new(seed));
            let d = inner.durable();
            assert!(d[..512].iter().all(|&x| x == 2), "durable write lost");
            d[8192] == 0
        });
        assert!(dropped_elsewhere, "the durable write flushed everything");
    }

    #[test]
    fn bad_sectors_heal_when_rewritten() {
        let inner: Arc<dyn Member> = Arc::new(MemMember::new("m", 1 << 20));
        let f = FaultMember::new(inner, FaultConfig::parse("bad-sector-at=5000").unwrap());
        let mut b = [0u8; 4096];
        assert!(f.read_at(&mut b, 4096).is_err());
        assert!(f.read_at(&mut b, 4096).is_err());
        f.read_at(&mut b, 0).unwrap();
        f.write_at(&b, 4096).unwrap();
        f.read_at(&mut b, 4096).unwrap();
    }

    #[test]
    fn corruption_is_silent_until_rewritten() {
        let inner: Arc<dyn Member> = Arc::new(MemMember::new("m", 1 << 20));
        inner.write_at(&[7u8; 8192], 4096).unwrap();
        let f = FaultMember::new(inner, FaultConfig::parse("corrupt-at=5000,6K").unwrap());
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 4096).unwrap();
        let flipped: Vec<usize> = (0..4096).filter(|&i| b[i] != 7).collect();
        assert_eq!(flipped, vec![5000 - 4096, 6144 - 4096]);
        f.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0), "elsewhere untouched");
        f.write_at(&[9u8; 4096], 4096).unwrap();
        f.read_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 9), "rewritten: read as written");
    }

    #[test]
    fn a_flaky_sector_fails_its_first_read_only() {
        let inner: Arc<dyn Member> = Arc::new(MemMember::new("m", 1 << 20));
        inner.write_at(&[7u8; 8192], 4096).unwrap();
        let f = FaultMember::new(inner, FaultConfig::parse("flaky-at=5000,64K").unwrap());
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0), "elsewhere read");
        assert!(f.read_at(&mut b, 4096).is_err(), "first read of 5000");
        f.read_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 7), "the retry reads it");
        assert!(
            f.read_at(&mut b, 64 << 10).is_err(),
            "64K: its own first read"
        );
        f.read_at(&mut b, 64 << 10).unwrap();
    }
}
