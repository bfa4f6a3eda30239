//! md interoperability: arrays made by Linux's own md driver and mdadm
//! (in a VM: `scripts/md-fixtures.sh`, which boots Debian's kernel under
//! qemu) are found, examined, read, checked and served by raidkit, byte
//! for byte what md wrote; what raidkit writes to them, degraded
//! included, the kernel assembles and reads back.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// The arrays the fixture script makes: name, members, metadata, level.
const ARRAYS: [(&str, usize, &str, &str); 12] = [
    ("r5-12", 3, "md 1.2", "raid5"),
    ("r5ra-12", 3, "md 1.2", "raid5"),
    ("r6-12", 4, "md 1.2", "raid6"),
    ("r1-10", 2, "md 1.0", "raid1"),
    ("r10-12", 3, "md 1.2", "raid10"),
    // RAID-10's far (f2) and offset (o2) layouts.
    ("r10f-12", 3, "md 1.2", "raid10"),
    ("r10o-12", 4, "md 1.2", "raid10"),
    ("r0-11", 2, "md 1.1", "raid0"),
    ("r5-090", 3, "md 0.90", "raid5"),
    // With md's internal write-intent bitmap (1 MiB chunks; 1.0's lies
    // before its superblock, at the member's end).
    ("r5b-12", 3, "md 1.2", "raid5"),
    ("r1b-10", 2, "md 1.0", "raid1"),
    // Made a RAID-5 of 3, then converted by md to a RAID-6 of 4 keeping
    // the layout (md's left-symmetric-6: Q on the new member).
    ("r6p-12", 4, "md 1.2", "raid6"),
];

/// A member image attached read-only to a loop device, detached when
/// dropped (also when the test fails): `mdadm --examine-bitmap` reads a
/// regular file as a bitmap file of its own, a device as an md member.
struct ReadOnlyLoop(String);

impl ReadOnlyLoop {
    fn attach(image: &str) -> ReadOnlyLoop {
        let o = tool("timeout", &["30", "losetup", "-r", "-f", "--show", image]);
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        ReadOnlyLoop(dev)
    }
}

impl Drop for ReadOnlyLoop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("timeout")
            .args(["30", "losetup", "-d", &self.0])
            .status();
    }
}

/// `mdadm --examine-bitmap` of a member: (chunk bytes, events cleared,
/// bits, dirty bits).
fn md_bitmap(member: &str) -> (u64, u64, u64, u64) {
    let dev = ReadOnlyLoop::attach(member);
    let o = tool("timeout", &["60", "mdadm", "--examine-bitmap", &dev.0]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let get = |key: &str| -> String {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(" : ")?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {key} in mdadm -X {member}: {text}"))
    };
    let num = |s: &str| -> u64 { s.split_whitespace().next().unwrap().parse().unwrap() };
    // "Chunksize : 1 MB", "Bitmap : 63 bits (chunks), 2 dirty (3.2%)".
    let chunk = {
        let c = get("Chunksize");
        let unit = match c.split_whitespace().nth(1) {
            Some("KB") => 1 << 10,
            Some("MB") => 1 << 20,
            Some("GB") => 1 << 30,
            _ => 1,
        };
        num(&c) * unit
    };
    let bits = get("Bitmap");
    let dirty: u64 = bits.split(", ").nth(1).map(num).expect("dirty count");
    (chunk, num(&get("Events Cleared")), num(&bits), dirty)
}

fn members(dir: &Path, name: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| dir.join(format!("{name}-{i}.img")).display().to_string())
        .collect()
}

/// md's own array size, from `mdadm --examine` ("Array Size : N KiB").
fn md_array_size(dir: &Path, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.examine.txt"))).ok()?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("Array Size :"))?;
    let kib: u64 = line
        .split(':')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn digest(paths: &[String]) -> Vec<String> {
    let mut a = vec!["120", "md5sum"];
    a.extend(paths.iter().map(String::as_str));
    let o = tool("timeout", &a);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn arrays_the_kernel_made_are_read_and_served_as_md_wrote_them() {
    // On the machine's disk: 17 sparse 64 MiB images.
    let dir = tempfile::Builder::new()
        .prefix("raidkit-md-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/md-fixtures.sh");
    let o = output_within(
        std::process::Command::new(&script).arg(dir.path()),
        Duration::from_secs(900),
    );
    assert!(
        o.status.success(),
        "md-fixtures.sh failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let payload = std::fs::read(dir.path().join("payload.img")).unwrap();
    let all: Vec<String> = ARRAYS
        .iter()
        .map(|(name, n, _, _)| (*name, *n))
        .chain([("r5f-12", 3)])
        .flat_map(|(name, n)| members(dir.path(), name, n))
        .collect();
    let before = digest(&all);

    // scan finds each array, with the metadata it carries.
    let o = ok(&["scan", "--json", &dir.path().display().to_string()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let found = v["arrays"].as_array().unwrap();
    assert_eq!(found.len(), ARRAYS.len() + 1, "{v:#}");

    for (name, n, metadata, level) in ARRAYS {
        let ms = members(dir.path(), name, n);
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        assert_eq!(e["metadata"], metadata, "{name}: {e:#}");
        assert_eq!(e["level"], level, "{name}");
        let size = e["array_size"].as_u64().unwrap();
        if let Some(md) = md_array_size(dir.path(), name) {
            assert_eq!(size, md, "{name}: array size as md has it");
        }
        agrees_with_mdadm(name, &ms[0], &e);
        if matches!(name, "r5b-12" | "r1b-10") {
            // md's bitmap is raidkit's: its chunk, its events cleared.
            let (chunk, cleared, _, _) = md_bitmap(&ms[0]);
            assert_eq!(e["consistency_policy"], "bitmap", "{name}: {e:#}");
            assert_eq!(e["bitmap"]["region"].as_u64(), Some(chunk), "{name}");
            assert_eq!(
                e["bitmap"]["events_cleared"].as_u64(),
                Some(cleared),
                "{name}"
            );
        }
        let s = found
            .iter()
            .find(|a| a["uuid"] == e["array_uuid"])
            .unwrap_or_else(|| panic!("{name} not found by scan: {v:#}"));
        assert_eq!(s["state"], "complete", "{name}");
        assert_eq!(s["metadata"], metadata, "{name}");

        // Offline read: the payload md was given.
        assert!(read_4m(dir.path(), &ms) == payload, "{name}: read differs");
        // check: redundancy agrees with the data as md left it.
        let o = ok(&args(&["check"], &ms));
        let text = String::from_utf8_lossy(&o.stdout);
        if level != "raid0" {
            assert!(
                text.contains(" 0 with redundancy that disagrees"),
                "{name}: {text}"
            );
        }

        // Served read-only over NBD: the same bytes, the size md has.
        let mut srv = Served::start(dir.path(), &ms, &["--read-only"]);
        let o = tool("timeout", &["30", "nbdinfo", "--size", &srv.uri]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            size.to_string(),
            "{name}"
        );
        let got = dir.path().join("nbd.bin");
        let _ = std::fs::remove_file(&got);
        tool(
            "timeout",
            &["60", "nbdcopy", &srv.uri, &got.display().to_string()],
        );
        let got = std::fs::read(&got).unwrap();
        assert!(
            got[..payload.len()] == payload[..],
            "{name}: NBD read differs"
        );
        assert_eq!(srv.stop().code(), Some(0), "{name}");
    }

    // A member md failed (and the payload written after): raidkit knows
    // the role as missing, the member as stale, and reads the payload.
    let ms = members(dir.path(), "r5f-12", 3);
    let d: Value = serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    assert_eq!(d["state"], "degraded", "{d:#}");
    let row = d["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str() == Some(ms[2].as_str()))
        .unwrap_or_else(|| panic!("{d:#}"))
        .clone();
    assert_ne!(row["state"], "active", "{d:#}");
    assert!(read_4m(dir.path(), &ms) == payload, "r5f-12: read differs");
    assert_eq!(digest(&all), before, "a member file changed");

    // raidkit writes each md array; the kernel assembles what it left,
    // reads raidkit's data, and its own check finds nothing to repair.
    let p2 = dir.path().join("p2.img");
    let p2_data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&p2, &p2_data).unwrap();
    let writable: Vec<(&str, usize)> = ARRAYS.iter().map(|a| (a.0, a.1)).collect();
    for (_, ms) in writable
        .iter()
        .map(|(name, n)| (name, members(dir.path(), name, *n)))
    {
        ok(&args(
            &["write", "-o", "1M", "--in", &p2.display().to_string()],
            &ms,
        ));
    }
    // The VM takes 24 disks, p2 one of them: boots of at most 23 members.
    let mut out = String::new();
    let mut batch: Vec<(&str, usize)> = Vec::new();
    for (i, a) in writable.iter().enumerate() {
        batch.push(*a);
        let room = 23 - batch.iter().map(|b| b.1).sum::<usize>();
        if writable.get(i + 1).is_none_or(|b| b.1 > room) {
            out += &assemble_and_check(dir.path(), &std::mem::take(&mut batch), &p2);
        }
    }
    let field = |tag: &str, name: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{tag} {name} ")))
            .unwrap_or_else(|| panic!("no {tag} for {name}: {out}"))
            .trim()
            .to_string()
    };
    let want = field("SUM", "payload");
    for (name, n) in &writable {
        assert_eq!(
            field("SUM", name),
            want,
            "{name}: md reads other data than raidkit wrote: {out}"
        );
        if *name != "r0-11" {
            let ups = "U".repeat(*n);
            assert!(
                field("ARRAY", name).contains(&format!("[{ups}]")),
                "{name}: {out}"
            );
            assert_eq!(field("MISMATCH", name), "0", "{name}: {out}");
        }
    }
    // The bitmaps raidkit kept are current to the kernel: none taken as
    // out of date (which would resync everything).
    assert!(
        !out.contains("out of date") && !out.contains("invalid bitmap"),
        "{out}"
    );
    // Degraded: a member failed through raidkit, data written after; the
    // kernel starts the array without the stale member and reads the new
    // data from the other two. Also with md 0.90's superblock, whose disk
    // descriptors mark the member faulty. And on RAID-10's far layout,
    // whose second copies lie in the members' second halves.
    let p3 = dir.path().join("p3.img");
    let p3_data: Vec<u8> = p2_data.iter().map(|b| b ^ 0x3c).collect();
    std::fs::write(&p3, &p3_data).unwrap();
    for name in ["r5-12", "r5-090", "r10f-12"] {
        let ms = members(dir.path(), name, 3);
        write_without_member_2(dir.path(), &ms, &p3);
        let out = in_vm(
            dir.path(),
            "mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc || exit 3\n\
             cat /proc/mdstat\n\
             dd if=/dev/md0 bs=1M skip=8 count=4 2>/dev/null | md5sum\n\
             dd if=/dev/vdd bs=1M count=4 2>/dev/null | md5sum\n\
             mdadm --stop /dev/md0\n",
            &[&ms[0], &ms[1], &ms[2], &p3.display().to_string()],
        );
        assert!(out.contains("[3/2] [UU_]"), "{name}: {out}");
        assert_two_equal_sums(&out);
    }

    // With md's bitmap: raidkit's degraded writes are marked in it, so the
    // kernel re-adds the member raidkit failed by resyncing only the chunks
    // written without it (counted by the sectors the guest writes to that
    // disk), and the array is whole and consistent again.
    let ms = members(dir.path(), "r5b-12", 3);
    write_without_member_2(dir.path(), &ms, &p3);
    let (chunk, cleared, bits, dirty) = md_bitmap(&ms[0]);
    let stale: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[2]]).stdout).unwrap();
    // 4 MiB of a 3-disk RAID-5 is 2 MiB of each member: 2 or 3 chunks.
    assert!(
        (2..=8).contains(&dirty) && bits > 32,
        "{dirty} of {bits} bits dirty"
    );
    assert!(
        cleared <= stale["events"].as_u64().unwrap(),
        "events cleared {cleared} after the failed member left: {stale:#}"
    );
    let out = in_vm(
        dir.path(),
        "w0=$(awk '{print $7}' /sys/block/vdc/stat)\n\
         mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc || exit 3\n\
         cat /proc/mdstat\n\
         grep -q vdc /proc/mdstat || mdadm /dev/md0 --re-add /dev/vdc || exit 4\n\
         sleep 1; mdadm --wait /dev/md0; cat /proc/mdstat\n\
         echo \"WRITTEN $(( $(awk '{print $7}' /sys/block/vdc/stat) - w0 ))\"\n\
         dd if=/dev/md0 bs=1M skip=8 count=4 2>/dev/null | md5sum\n\
         dd if=/dev/vdd bs=1M count=4 2>/dev/null | md5sum\n\
         echo check > /sys/block/md0/md/sync_action; sleep 1\n\
         while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 1; done\n\
         echo \"MISMATCH $(cat /sys/block/md0/md/mismatch_cnt)\"\n\
         dmesg | grep -i 'bitmap\\|recovery' | sed 's/^/KERNEL /'\n\
         mdadm --stop /dev/md0\n",
        &[&ms[0], &ms[1], &ms[2], &p3.display().to_string()],
    );
    assert!(out.contains("[3/3] [UUU]"), "not whole again: {out}");
    assert_two_equal_sums(&out);
    assert!(out.contains("MISMATCH 0"), "{out}");
    let written: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("WRITTEN "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{out}"))
        * 512;
    eprintln!("re-add by md's bitmap: {written} bytes written to the member for {dirty} dirty chunks of {bits}");
    // The dirty chunks were rewritten, and little else: a full recovery
    // writes the whole data area (bits x chunk).
    assert!(
        written >= 2 * chunk && written <= (dirty + 4) * chunk,
        "{written} bytes written to the re-added member for {dirty} dirty {chunk}-byte chunks of {bits}: {out}"
    );

    // A new member added by raidkit to the md array raidkit degraded
    // (r5-12, member 2 failed above): it gets md's superblock of its own
    // and is rebuilt; stopped in the middle of that rebuild, with a spare
    // added meanwhile and data written, the kernel assembles all of it,
    // goes on rebuilding from where raidkit stopped, and ends whole.
    let ms = members(dir.path(), "r5-12", 3);
    let new = dir.path().join("r5-12-new.img").display().to_string();
    let spare = dir.path().join("r5-12-spare.img").display().to_string();
    let mut srv = Served::start(dir.path(), &ms[..2], &["--rebuild-max", "4M"]);
    let ctl = srv.control.display().to_string();
    ok(&["add", "--control", &ctl, &new]);
    let t0 = std::time::Instant::now();
    while srv.status()["recovery"]["bytes_done"].as_u64().unwrap_or(0) < 8 << 20 {
        assert!(t0.elapsed() < Duration::from_secs(60), "{:#}", srv.status());
        std::thread::sleep(Duration::from_millis(200));
    }
    ok(&["add", "--control", &ctl, &spare]);
    let p4 = dir.path().join("p4.img");
    std::fs::write(&p4, p2_data.iter().map(|b| b ^ 0xa5).collect::<Vec<u8>>()).unwrap();
    write_and_stop(&mut srv, &p4, "40M");
    // mdadm sees what raidkit says: the new member in role 2, recovering
    // from an offset inside its data; the spare a spare.
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &new]).stdout).unwrap();
    agrees_with_mdadm("r5-12-new", &new, &e);
    let offset = e["recovery_offset"].as_u64().expect("a recovery offset");
    let size = e["data_size"].as_u64().unwrap();
    assert!(offset >= 8 << 20 && offset < size / 2, "{e:#}");
    let examined =
        String::from_utf8_lossy(&tool("timeout", &["60", "mdadm", "--examine", &new]).stdout)
            .to_string();
    assert!(
        examined.contains(&format!("Recovery Offset : {} sectors", offset / 512)),
        "{examined}"
    );
    let examined =
        String::from_utf8_lossy(&tool("timeout", &["60", "mdadm", "--examine", &spare]).stdout)
            .to_string();
    assert!(examined.contains("Device Role : spare"), "{examined}");
    let out = in_vm(
        dir.path(),
        "w0=$(awk '{print $7}' /sys/block/vdc/stat)\n\
         mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc /dev/vdd || exit 3\n\
         cat /proc/mdstat\n\
         sleep 1; mdadm --wait /dev/md0; cat /proc/mdstat\n\
         echo \"WRITTEN $(( $(awk '{print $7}' /sys/block/vdc/stat) - w0 ))\"\n\
         dd if=/dev/md0 bs=1M skip=8 count=4 2>/dev/null | md5sum\n\
         dd if=/dev/vde bs=1M count=4 2>/dev/null | md5sum\n\
         echo \"SUM4 $(dd if=/dev/md0 bs=1M skip=40 count=4 2>/dev/null | md5sum | cut -d' ' -f1)\"\n\
         echo \"WANT4 $(dd if=/dev/vdf bs=1M count=4 2>/dev/null | md5sum | cut -d' ' -f1)\"\n\
         echo check > /sys/block/md0/md/sync_action; sleep 1\n\
         while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 1; done\n\
         echo \"MISMATCH $(cat /sys/block/md0/md/mismatch_cnt)\"\n\
         mdadm --detail /dev/md0 | sed 's/^/DETAIL /'\n\
         mdadm --stop /dev/md0\n",
        &[
            &ms[0],
            &ms[1],
            &new,
            &spare,
            &p3.display().to_string(),
            &p4.display().to_string(),
        ],
    );
    assert!(out.contains("[3/3] [UUU]"), "not whole: {out}");
    assert_two_equal_sums(&out);
    let line = |tag: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag}: {out}"))
            .trim()
            .to_string()
    };
    assert_eq!(line("SUM4 "), line("WANT4 "), "{out}");
    assert_eq!(line("MISMATCH "), "0", "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("DETAIL") && l.contains("spare")),
        "the spare is not md's spare: {out}"
    );
    // The kernel went on from raidkit's recovery offset: it wrote the
    // rest of the member, not all of it.
    let written: u64 = line("WRITTEN ").parse::<u64>().unwrap() * 512;
    eprintln!("kernel finished raidkit's rebuild from {offset}: {written} bytes written of {size}");
    assert!(
        written <= size - offset + (4 << 20) && written >= (size - offset) / 2,
        "{written} bytes written to finish a rebuild stopped at {offset} of {size}: {out}"
    );
}

/// Serve `ms`, fail its member 2, write `data` at 8 MiB through NBD, stop.
fn write_without_member_2(dir: &Path, ms: &[String], data: &Path) {
    let mut srv = Served::start(dir, ms, &[]);
    ok(&[
        "fail",
        "--control",
        &srv.control.display().to_string(),
        &ms[2],
    ]);
    write_and_stop(&mut srv, data, "8M");
}

/// Write the 4 MiB file `data` at `offset` of `srv`'s export (qemu-io), then
/// stop the server cleanly.
fn write_and_stop(srv: &mut Served, data: &Path, offset: &str) {
    tool(
        "timeout",
        &[
            "60",
            "qemu-io",
            "-f",
            "raw",
            "-c",
            &format!("write -s {} {offset} 4M", data.display()),
            &srv.uri,
        ],
    );
    assert_eq!(srv.stop().code(), Some(0));
}

/// One VM boot: the kernel assembles each of `arrays` (`name`, members),
/// prints its state (ARRAY), the md5 of its 4 MiB at 1 MiB (SUM) and, but
/// for RAID-0, the mismatch count of md's own check (MISMATCH); then the
/// md5 of `payload` (SUM payload) and the kernel's lines on bitmaps.
fn assemble_and_check(dir: &Path, arrays: &[(&str, usize)], payload: &Path) -> String {
    let letter = |i: usize| (b'a' + i as u8) as char;
    let mut disks: Vec<String> = Vec::new();
    let mut script = String::new();
    for (k, (name, n)) in arrays.iter().enumerate() {
        let devs: Vec<String> = (0..*n)
            .map(|i| format!("/dev/vd{}", letter(disks.len() + i)))
            .collect();
        disks.extend(members(dir, name, *n));
        script.push_str(&format!(
            "mdadm --assemble /dev/md{k} {devs} || exit 3\n\
             echo \"ARRAY {name} $(grep -A1 '^md{k} ' /proc/mdstat | tail -1)\"\n\
             echo \"SUM {name} $(dd if=/dev/md{k} bs=1M skip=1 count=4 2>/dev/null | md5sum | cut -d' ' -f1)\"\n\
             if [ {name} != r0-11 ]; then\n\
               echo check > /sys/block/md{k}/md/sync_action\n\
               sleep 1; while [ \"$(cat /sys/block/md{k}/md/sync_action)\" != idle ]; do sleep 1; done\n\
               echo \"MISMATCH {name} $(cat /sys/block/md{k}/md/mismatch_cnt)\"\n\
             fi\n\
             mdadm --stop /dev/md{k}\n",
            devs = devs.join(" ")
        ));
    }
    script.push_str(&format!(
        "echo \"SUM payload $(dd if=/dev/vd{} bs=1M count=4 2>/dev/null | md5sum | cut -d' ' -f1)\"\n\
         dmesg | grep -i 'bitmap' | sed 's/^/KERNEL /'\n",
        letter(disks.len())
    ));
    disks.push(payload.display().to_string());
    let refs: Vec<&str> = disks.iter().map(String::as_str).collect();
    in_vm(dir, &script, &refs)
}

/// The array's first 4 MiB, read offline by `raidkit read`.
fn read_4m(dir: &Path, ms: &[String]) -> Vec<u8> {
    let out = dir.join("read.bin");
    let o = out.display().to_string();
    ok(&args(&["read", "-o", "0", "-n", "4M", "--out", &o], ms));
    std::fs::read(&out).unwrap()
}

/// `mdadm --examine` of the member on this host (mdadm reads superblocks
/// without the md driver) says what `raidkit examine` says, field by field.
fn agrees_with_mdadm(name: &str, member: &str, e: &Value) {
    let o = tool("timeout", &["60", "mdadm", "--examine", member]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let get = |key: &str| -> Option<String> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let hex = |s: &str| {
        s.chars()
            .filter(char::is_ascii_hexdigit)
            .collect::<String>()
    };
    let uuid = get("Array UUID").or_else(|| get("UUID")).expect("a uuid");
    assert_eq!(
        hex(&uuid),
        hex(e["array_uuid"].as_str().unwrap()),
        "{name}: {text}"
    );
    assert_eq!(
        get("Raid Level").as_deref(),
        e["level"].as_str(),
        "{name}: {text}"
    );
    assert_eq!(
        get("Raid Devices").and_then(|v| v.parse::<u64>().ok()),
        e["raid_disks"].as_u64(),
        "{name}: {text}"
    );
    if let Some(c) = get("Chunk Size") {
        let kib: u64 = c.trim_end_matches('K').parse().unwrap();
        assert_eq!(kib * 1024, e["chunk"].as_u64().unwrap(), "{name}: {text}");
    }
    if let Some(l) = get("Layout") {
        let theirs = l
            .replace("near=", "n")
            .replace("far=", "f")
            .replace("offset=", "o");
        assert_eq!(theirs, e["layout"].as_str().unwrap_or(""), "{name}: {text}");
    }
    if let Some(ev) = get("Events") {
        // 0.90 prints "0.N"; 1.x the count.
        let n: u64 = ev.rsplit('.').next().unwrap().parse().unwrap();
        assert_eq!(n, e["events"].as_u64().unwrap(), "{name}: {text}");
    }
    if let Some(d) = get("Data Offset") {
        let sectors: u64 = d.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(
            sectors * 512,
            e["data_offset"].as_u64().unwrap(),
            "{name}: {text}"
        );
    }
    if let Some(r) = get("Device Role") {
        let ours = match e["role"].as_str() {
            Some(s) => s.to_string(),
            None => e["role"].to_string(),
        };
        assert!(
            r.ends_with(&format!("device {ours}")),
            "{name}: role {r} vs {ours}: {text}"
        );
    }
    // 1.x prints sizes in sectors ("N sectors (...)"), 0.90 in KiB.
    let bytes = |v: &str| -> u64 {
        let n: u64 = v.split_whitespace().next().unwrap().parse().unwrap();
        n * if v.contains("sectors") { 512 } else { 1024 }
    };
    if let Some(d) = get("Avail Dev Size") {
        assert_eq!(
            bytes(&d),
            e["data_size"].as_u64().unwrap(),
            "{name}: {text}"
        );
    }
    if let Some(d) = get("Used Dev Size") {
        let role_size = e["roles"][0]["data_size"].as_u64();
        assert_eq!(Some(bytes(&d)), role_size, "{name}: {text} {e:#}");
    }
    if let Some(st) = get("State") {
        // md's clean, or active (in use: raidkit's dirty).
        let ours = if st == "clean" { "clean" } else { "dirty" };
        assert_eq!(e["state"], ours, "{name}: {text}");
    }
    match get("Recovery Offset") {
        Some(r) => {
            let sectors: u64 = r.split_whitespace().next().unwrap().parse().unwrap();
            assert_eq!(
                Some(sectors * 512),
                e["recovery_offset"].as_u64(),
                "{name}: {text}"
            );
        }
        None => assert!(e["recovery_offset"].is_null(), "{name}: {text}"),
    }
    if let Some(n) = get("Name") {
        let short = n.split_whitespace().next().unwrap();
        let short = short.rsplit(':').next().unwrap();
        assert_eq!(short, e["name"].as_str().unwrap(), "{name}: {text}");
    }
}

/// Run `script` in the md VM with `disks`; its output.
fn in_vm(dir: &Path, script: &str, disks: &[&str]) -> String {
    let f = dir.join("vm-script.sh");
    std::fs::write(&f, script).unwrap();
    let vm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/md-vm.sh");
    let o = output_within(
        std::process::Command::new(&vm).arg(&f).args(disks),
        Duration::from_secs(400),
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "md-vm.sh failed: {out}");
    out
}

/// The two md5sum lines of a VM script's output are one sum.
fn assert_two_equal_sums(out: &str) {
    let sums: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with("  -"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(sums.len(), 2, "{out}");
    assert_eq!(
        sums[0], sums[1],
        "what md reads differs from what raidkit wrote: {out}"
    );
}

/// `create --metadata md`: arrays raidkit creates and writes are found and
/// started by `mdadm --assemble --scan` in the guest, hold raidkit's data,
/// and md's own check finds them consistent.
#[test]
fn arrays_raidkit_creates_with_md_metadata_the_kernel_assembles() {
    let dir = tempfile::Builder::new()
        .prefix("raidkit-mdc-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let payload: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8)
        .collect();
    std::fs::write(p("payload.img"), &payload).unwrap();
    let shapes: [(&str, &str, usize, &[&str]); 5] = [
        ("r5", "5", 3, &["--chunk", "64K"]),
        ("r6", "6", 4, &["--chunk", "64K"]),
        ("r1", "1", 2, &[]),
        ("r10", "10", 3, &["--chunk", "64K"]),
        ("r10f", "10", 3, &["--chunk", "64K", "--layout", "f2"]),
    ];
    let mut disks = Vec::new();
    for (name, level, n, extra) in shapes {
        let ms: Vec<String> = (0..n).map(|i| p(&format!("{name}-{i}.img"))).collect();
        let mut a = vec![
            "create",
            "-l",
            level,
            "--metadata",
            "md",
            "--size",
            "64M",
            "--name",
            name,
        ];
        a.extend_from_slice(extra);
        ok(&args(&a, &ms));
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        assert_eq!(e["metadata"], "md 1.2", "{e:#}");
        agrees_with_mdadm(name, &ms[0], &e);
        ok(&args(&["write", "-o", "0", "--in", &p("payload.img")], &ms));
        if name == "r1" {
            // Replaced by raidkit while served: the new disk gets md's
            // superblock of its own (a device number past the table
            // create wrote) and the kernel takes it in the old one's place.
            let new = p("r1-new.img");
            let mut srv = Served::start(dir.path(), &ms, &[]);
            let ctl = srv.control.display().to_string();
            ok(&["replace", "--control", &ctl, &ms[0], "--with", &new]);
            ok(&["wait", "--control", &ctl]);
            assert_eq!(srv.stop().code(), Some(0));
            let e: Value =
                serde_json::from_slice(&ok(&["examine", "--json", &new]).stdout).unwrap();
            assert_eq!(e["role"], 0, "{e:#}");
            agrees_with_mdadm("r1-new", &new, &e);
            disks.extend([new, ms[1].clone()]);
            continue;
        }
        disks.extend(ms);
    }
    // Asked for what md metadata cannot carry: refused, nothing created.
    let bad = p("bad-0.img");
    fails(
        &[
            "create",
            "-l",
            "1",
            "--metadata",
            "md",
            "--checksums",
            "on",
            "--size",
            "64M",
            &bad,
            &p("bad-1.img"),
        ],
        "checksums",
    );
    assert!(!Path::new(&bad).exists(), "a refused create left a file");
    let script = "printf 'DEVICE /dev/vd*\\nAUTO +all\\n' > /etc/mdadm/mdadm.conf\n\
         mdadm --assemble --scan || exit 3\n\
         cat /proc/mdstat\n\
         for m in $(ls /sys/block | grep '^md'); do\n\
           k=$(cat /sys/block/$m/md/level)-$(cat /sys/block/$m/md/layout)\n\
           echo \"SUM $k $(dd if=/dev/$m bs=1M count=4 2>/dev/null | md5sum | cut -d' ' -f1)\"\n\
           echo \"DEGRADED $k $(cat /sys/block/$m/md/degraded)\"\n\
           echo check > /sys/block/$m/md/sync_action; sleep 1\n\
           while [ \"$(cat /sys/block/$m/md/sync_action)\" != idle ]; do sleep 1; done\n\
           echo \"MISMATCH $k $(cat /sys/block/$m/md/mismatch_cnt)\"\n\
         done\n\
         mdadm --stop --scan\n";
    let refs: Vec<&str> = disks.iter().map(String::as_str).collect();
    let out = in_vm(dir.path(), script, &refs);
    let want = {
        let o = tool("md5sum", &[&p("payload.img")]);
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    // Level and md's layout number: RAID-10 near 2 (0x102) and far 2 (0x201).
    for level in ["raid5-2", "raid6-2", "raid1-0", "raid10-258", "raid10-513"] {
        let get = |tag: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{tag} {level} ")))
                .unwrap_or_else(|| panic!("no {tag} for {level}: {out}"))
                .trim()
                .to_string()
        };
        assert_eq!(get("SUM"), want, "{level}: {out}");
        assert_eq!(get("DEGRADED"), "0", "{level}: {out}");
        assert_eq!(get("MISMATCH"), "0", "{level}: {out}");
    }
}

/// md metadata on RAID-10's far and offset layouts, members of an odd
/// number of chunks: `mdadm --examine` shows the size raidkit serves (it
/// shows a member's used size times members over copies, so the used size
/// must be whole groups of far copies, which is all md uses anyway).
#[test]
fn mdadm_shows_the_size_raidkit_serves_for_raid10_far_and_offset() {
    let dir = tmp();
    for layout in ["f2", "o2", "f3", "o3"] {
        let ms: Vec<String> = (0..3)
            .map(|i| {
                dir.path()
                    .join(format!("{layout}-{i}.img"))
                    .display()
                    .to_string()
            })
            .collect();
        ok(&args(
            &[
                "create",
                "--metadata",
                "md",
                "--level",
                "10",
                "--layout",
                layout,
                "--chunk",
                "512K",
                "--size",
                "9999K",
            ],
            &ms,
        ));
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        let ours = e["array_size"].as_u64().unwrap();
        let o = tool("timeout", &["60", "mdadm", "--examine", &ms[0]]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let kib: u64 = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Array Size : "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{layout}: {text}"));
        assert_eq!(kib * 1024, ours, "{layout}: {text}");
        agrees_with_mdadm(layout, &ms[0], &e);
    }
}
