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
const ARRAYS: [(&str, usize, &str, &str); 6] = [
    ("r5-12", 3, "md 1.2", "raid5"),
    ("r6-12", 4, "md 1.2", "raid6"),
    ("r1-10", 2, "md 1.0", "raid1"),
    ("r10-12", 3, "md 1.2", "raid10"),
    ("r0-11", 2, "md 1.1", "raid0"),
    ("r5-090", 3, "md 0.90", "raid5"),
];

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
        .flat_map(|(name, n, _, _)| members(dir.path(), name, *n))
        .collect();
    let before = digest(&all);

    // scan finds each array, with the metadata it carries.
    let o = ok(&["scan", "--json", &dir.path().display().to_string()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let found = v["arrays"].as_array().unwrap();
    assert_eq!(found.len(), ARRAYS.len(), "{v:#}");

    for (name, n, metadata, level) in ARRAYS {
        let ms = members(dir.path(), name, n);
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        assert_eq!(e["metadata"], metadata, "{name}: {e:#}");
        assert_eq!(e["level"], level, "{name}");
        let size = e["array_size"].as_u64().unwrap();
        if let Some(md) = md_array_size(dir.path(), name) {
            assert_eq!(size, md, "{name}: array size as md has it");
        }
        let s = found
            .iter()
            .find(|a| a["uuid"] == e["array_uuid"])
            .unwrap_or_else(|| panic!("{name} not found by scan: {v:#}"));
        assert_eq!(s["state"], "complete", "{name}");
        assert_eq!(s["metadata"], metadata, "{name}");

        // Offline read: the payload md was given.
        let out = dir.path().join("read.bin");
        ok(&args(
            &[
                "read",
                "-o",
                "0",
                "-n",
                "4M",
                "--out",
                &out.display().to_string(),
            ],
            &ms,
        ));
        assert!(
            std::fs::read(&out).unwrap() == payload,
            "{name}: read differs"
        );
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

        // 0.90 metadata raidkit does not write: read-write is refused,
        // with nothing written.
        if metadata == "md 0.90" {
            fails(
                &args(&["serve", "--listen", "127.0.0.1:0"], &ms),
                "read-only",
            );
        }
    }
    assert_eq!(digest(&all), before, "a member file changed");

    // raidkit writes an md array; the kernel assembles what it left.
    let ms = members(dir.path(), "r5-12", 3);
    let p2 = dir.path().join("p2.img");
    let p2_data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&p2, &p2_data).unwrap();
    ok(&args(
        &["write", "-o", "1M", "--in", &p2.display().to_string()],
        &ms,
    ));
    let out = in_vm(
        dir.path(),
        "mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc || exit 3\n\
         cat /proc/mdstat\n\
         dd if=/dev/md0 bs=1M skip=1 count=4 2>/dev/null | md5sum\n\
         dd if=/dev/vdd bs=1M count=4 2>/dev/null | md5sum\n\
         mdadm --stop /dev/md0\n",
        &[&ms[0], &ms[1], &ms[2], &p2.display().to_string()],
    );
    assert!(out.contains("[3/3] [UUU]"), "{out}");
    assert_two_equal_sums(&out);

    // Degraded: a member failed through raidkit, data written after; the
    // kernel starts the array without the stale member and reads the new
    // data from the other two.
    let mut srv = Served::start(dir.path(), &ms, &[]);
    ok(&[
        "fail",
        "--control",
        &srv.control.display().to_string(),
        &ms[2],
    ]);
    let p3 = dir.path().join("p3.img");
    let p3_data: Vec<u8> = p2_data.iter().map(|b| b ^ 0x3c).collect();
    std::fs::write(&p3, &p3_data).unwrap();
    tool(
        "timeout",
        &[
            "60",
            "qemu-io",
            "-f",
            "raw",
            "-c",
            &format!("write -s {} 8M 4M", p3.display()),
            &srv.uri,
        ],
    );
    assert_eq!(srv.stop().code(), Some(0));
    let out = in_vm(
        dir.path(),
        "mdadm --assemble /dev/md0 /dev/vda /dev/vdb /dev/vdc || exit 3\n\
         cat /proc/mdstat\n\
         dd if=/dev/md0 bs=1M skip=8 count=4 2>/dev/null | md5sum\n\
         dd if=/dev/vdd bs=1M count=4 2>/dev/null | md5sum\n\
         mdadm --stop /dev/md0\n",
        &[&ms[0], &ms[1], &ms[2], &p3.display().to_string()],
    );
    assert!(out.contains("[3/2] [UU_]"), "{out}");
    assert_two_equal_sums(&out);
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
