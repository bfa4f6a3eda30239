//! The file engines on block devices: loop devices with direct I/O over
//! files on the machine's disk (`losetup --direct-io=on`), attached by each
//! test and detached by a guard even when the test fails. Skipped, saying
//! why, where that cannot be done (not root, no losetup).

use raidkit_member::{open_member, AlignedBuf, DirectMember, FileMember, IoMode, Member};
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

/// The tests here take turns: a command one test starts (losetup, mkfs,
/// mount) holds copies of every descriptor of this process between its fork
/// and exec, so another test's O_EXCL open, closed and at once reopened,
/// could find its own claim on the device still held by that copy.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run a command under `timeout`; its stdout, or None if it failed.
fn run(args: &[&str]) -> Option<String> {
    let out = Command::new("timeout").arg("30").args(args).output().ok()?;
    if !out.status.success() {
        eprintln!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A loop device over a file, detached (and unmounted, if mounted) on drop.
struct Loop {
    dev: String,
    /// Where its file system is mounted (removed once unmounted).
    mounted: Option<tempfile::TempDir>,
    _dir: tempfile::TempDir,
}

impl Loop {
    /// A loop device of `len` bytes with direct I/O and this logical
    /// sector size; None (the reason printed) where loop devices cannot be
    /// had here.
    fn attach(len: u64, sector: u32) -> Option<Loop> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: loop devices need root");
            return None;
        }
        if run(&["losetup", "--version"]).is_none() {
            eprintln!("skipped: losetup is missing");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("raidkit-loop-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let backing = dir.path().join("backing.img");
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(len)
            .unwrap();
        let sector = sector.to_string();
        let b = backing.to_str().unwrap();
        let dev = run(&[
            "losetup",
            "--direct-io=on",
            "--sector-size",
            &sector,
            "-f",
            "--show",
            b,
        ])
        .expect("losetup could not attach a loop device");
        Some(Loop {
            dev,
            mounted: None,
            _dir: dir,
        })
    }

    fn path(&self) -> &Path {
        Path::new(&self.dev)
    }

    /// What the kernel says of the device in sysfs (queue/NAME).
    fn queue(&self, name: &str) -> u32 {
        let base = self.dev.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{base}/queue/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            run(&["umount", m.path().to_str().unwrap()]);
        }
        run(&["losetup", "-d", &self.dev]);
    }
}

/// The flags of this process's descriptor open on `path` (fdinfo, octal).
fn fd_flags(path: &Path) -> u32 {
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() == Some(path) {
            let name = e.file_name();
            let info =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{}", name.to_str().unwrap()))
                    .unwrap();
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
            return u32::from_str_radix(flags.trim(), 8).unwrap();
        }
    }
    panic!("no descriptor open on {}", path.display());
}

const O_DIRECT_OCTAL: u32 = 0o40000;

#[test]
fn a_loop_device_is_sized_blocked_and_opened_direct() {
    let _turn = serial();
    for sector in [512u32, 4096] {
        let Some(l) = Loop::attach(64 << 20, sector) else {
            return;
        };
        let m = DirectMember::open(l.path(), false).unwrap();
        assert!(m.is_block_device());
        assert_eq!(m.len(), 64 << 20);
        assert_eq!(m.logical_block_size(), l.queue("logical_block_size"));
        assert_eq!(m.logical_block_size(), sector);
        assert_eq!(m.physical_block_size(), l.queue("physical_block_size"));
        assert_eq!(m.block_size(), sector);
        assert_eq!(fd_flags(l.path()) & O_DIRECT_OCTAL, O_DIRECT_OCTAL);

        // Odd offsets and lengths, an aligned buffer, a durable write.
        m.write_at(b"sector-straddling bytes", 4096 * 3 - 5)
            .unwrap();
        let a = AlignedBuf::from_slice(&[7u8; 8192]);
        m.write_at(&a, 1 << 20).unwrap();
        m.write_at_durable(b"fua", 12_345).unwrap();
        let mut b = [0u8; 23];
        m.read_at(&mut b, 4096 * 3 - 5).unwrap();
        assert_eq!(&b, b"sector-straddling bytes");
        let mut c = [0u8; 3];
        m.read_at(&mut c, 12_345).unwrap();
        assert_eq!(&c, b"fua");

        // Discard (BLKZEROOUT) reads back zeroes, edges included.
        m.discard((1 << 20) + 100, 8000).unwrap();
        let mut d = vec![0u8; 8192];
        m.read_at(&mut d, 1 << 20).unwrap();
        assert!(d[..100].iter().all(|&x| x == 7) && d[8100..].iter().all(|&x| x == 7));
        assert!(
            d[100..8100].iter().all(|&x| x == 0),
            "{sector}: discard not zero"
        );
        m.flush().unwrap();

        // Auto picks direct I/O for a block device; buffered is not O_DIRECT.
        drop(m);
        let o = open_member(l.path(), false, IoMode::Auto).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.mode, IoMode::Direct);
        assert_eq!(o.logical_block, sector);
        drop(o);
        let f = FileMember::open(l.path(), false).unwrap();
        assert_eq!(f.len(), 64 << 20);
        assert_eq!(fd_flags(l.path()) & O_DIRECT_OCTAL, 0);
        let mut e = [0u8; 3];
        f.read_at(&mut e, 12_345).unwrap();
        assert_eq!(&e, b"fua", "what the direct engine wrote, read buffered");
    }
}

/// Cache flushes a device has completed (field 16 of /sys/block/*/stat).
fn flushes(l: &Loop) -> u64 {
    let base = l.dev.trim_start_matches("/dev/");
    let stat = std::fs::read_to_string(format!("/sys/block/{base}/stat")).unwrap();
    stat.split_whitespace().nth(15).unwrap().parse().unwrap()
}

#[test]
fn a_durable_write_to_a_device_costs_one_cache_flush() {
    // RWF_DSYNC on a block device gives a FUA write (on a loop device, a
    // write and a flush) and then a second flush; the journal's records
    // are durable writes, so each costs its commit one flush, not two.
    let _turn = serial();
    let Some(l) = Loop::attach(16 << 20, 512) else {
        return;
    };
    let m = DirectMember::open(l.path(), false).unwrap();
    let a = AlignedBuf::from_slice(&[9u8; 4096]);
    let before = flushes(&l);
    for i in 0..20u64 {
        m.write_at_durable(&a, i * 4096).unwrap();
    }
    assert_eq!(flushes(&l) - before, 20, "flushes for 20 durable writes");
    let mut b = vec![0u8; 4096];
    m.read_at(&mut b, 19 * 4096).unwrap();
    assert_eq!(b, vec![9u8; 4096]);
}

#[test]
fn a_device_held_exclusively_is_refused_for_writing() {
    let _turn = serial();
    let Some(l) = Loop::attach(32 << 20, 512) else {
        return;
    };
    let holder = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(l.path())
        .unwrap();
    for io in [IoMode::Direct, IoMode::Buffered, IoMode::Auto] {
        let e = open_member(l.path(), false, io).unwrap_err();
        assert_eq!(
            e.source.kind(),
            std::io::ErrorKind::ResourceBusy,
            "{io}: {e}"
        );
        // Held by this process itself: no other holder to name.
        let busy = raidkit_member::InUse::of_error(&e.source).expect("an InUse error");
        assert!(busy.device && busy.pid.is_none(), "{busy:?}");
    }
    // Reading a held device is fine (examine, detail).
    open_member(l.path(), true, IoMode::Direct).unwrap();
    drop(holder);
    // Held by another process: named, with its PID. (It ends by itself
    // after a minute should this test die before killing it.)
    let mut other = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!(
            "import os,sys,time; os.open('{}', os.O_RDONLY|os.O_EXCL); print('held', flush=True); time.sleep(60)",
            l.path().display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(other.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let e = open_member(l.path(), false, IoMode::Direct).unwrap_err();
    let busy = raidkit_member::InUse::of_error(&e.source).cloned();
    let _ = other.kill();
    let _ = other.wait();
    let busy = busy.expect("an InUse error");
    assert_eq!(busy.pid, Some(other.id()), "{busy:?}");
    assert!(busy.device, "{busy:?}");
    assert_eq!(busy.program.as_deref(), Some("python3"), "{busy:?}");
    assert!(
        e.to_string()
            .contains(&format!("(PID {})", busy.pid.unwrap())),
        "{e}"
    );
    open_member(l.path(), false, IoMode::Direct).unwrap();
}

#[test]
fn a_device_holding_a_mounted_file_system_is_refused() {
    let _turn = serial();
    let Some(mut l) = Loop::attach(64 << 20, 512) else {
        return;
    };
    if run(&["mkfs.ext4", "-q", &l.dev]).is_none() {
        eprintln!("skipped: mkfs.ext4 failed or is missing");
        return;
    }
    let mnt = tempfile::Builder::new()
        .prefix("raidkit-mnt-")
        .tempdir_in("/var/tmp")
        .unwrap();
    if run(&["mount", &l.dev, mnt.path().to_str().unwrap()]).is_none() {
        eprintln!("skipped: mount failed");
        return;
    }
    l.mounted = Some(mnt);
    let e = DirectMember::open(l.path(), false).unwrap_err();
    assert_eq!(e.source.kind(), std::io::ErrorKind::ResourceBusy, "{e}");
    assert!(e.to_string().contains("mounted"), "{e}");
    assert!(e.to_string().contains(&l.dev), "names the device: {e}");
    assert!(FileMember::open(l.path(), false).is_err());
}
