//! The real `raidkit` binary, driven as a user drives it.

mod common;

use common::{args, fails, members, ok, raidkit_refused, tmp};
use rand::{seq::SliceRandom, Rng, SeedableRng};
use serde_json::Value;
use std::path::Path;

fn digest(paths: &[String]) -> Vec<Vec<u8>> {
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.display().to_string()
}

fn read_array(ms: &[String], off: u64, len: usize) -> Vec<u8> {
    let (o, l) = (off.to_string(), len.to_string());
    let o = ok(&args(&["read", "--offset", &o, "--length", &l], ms));
    o.stdout
}

#[test]
fn every_level_round_trips_shuffled_and_degraded() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let cases: [(&str, Option<&str>, usize, usize); 10] = [
        // level, layout, members, how many may be lost
        ("linear", None, 2, 0),
        ("0", None, 3, 0),
        ("1", None, 3, 2),
        ("4", None, 4, 1),
        ("5", None, 4, 1),
        ("6", None, 5, 2),
        ("10", None, 4, 1),
        ("raid10", None, 3, 1),
        ("10", Some("f2"), 3, 1),
        ("10", Some("o2"), 4, 1),
    ];
    for (level, layout, n, tolerance) in cases {
        let dir = tmp();
        let ms = members(dir.path(), n);
        let mut create = vec![
            "create", "--level", level, "--size", "16M", "--chunk", "64K", "--name", "t",
        ];
        if let Some(l) = layout {
            create.extend(["--layout", l]);
        }
        ok(&args(&create, &ms));
        let level = format!("{level} {}", layout.unwrap_or(""));
        let detail: Value =
            serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
        let size = detail["size"].as_u64().unwrap();
        assert_eq!(detail["state"], "optimal");
        let data: Vec<u8> = (0..3_000_000).map(|_| rng.gen()).collect();
        let input = write_file(dir.path(), "in.bin", &data);
        let off = 123_457u64;
        let o = off.to_string();
        ok(&args(&["write", "--offset", &o, "--in", &input], &ms));
        let mut shuffled = ms.clone();
        shuffled.shuffle(&mut rng);
        assert!(
            read_array(&shuffled, off, data.len()) == data,
            "level {level}"
        );
        // The tail of the array reads too, and one byte past the end does not.
        let _ = read_array(&ms, size - 10, 10);
        fails(
            &args(
                &[
                    "read",
                    "--offset",
                    &(size - 10).to_string(),
                    "--length",
                    "11",
                ],
                &ms,
            ),
            "beyond the end",
        );

        let mut sets: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
        if tolerance >= 2 {
            for i in 0..n {
                for j in i + 1..n {
                    sets.push(vec![i, j]);
                }
            }
        }
        for gone in sets {
            let present: Vec<String> = ms
                .iter()
                .enumerate()
                .filter(|(i, _)| !gone.contains(i))
                .map(|(_, m)| m.clone())
                .collect();
            if gone.len() <= tolerance {
                assert!(
                    read_array(&present, off, data.len()) == data,
                    "level {level} without {gone:?}"
                );
            } else {
                let err = fails(
                    &args(&["read", "--offset", "0", "--length", "4096"], &present),
                    "cannot run",
                );
                for r in &gone {
                    assert!(err.contains(&format!("role {r} (missing)")), "{err}");
                }
            }
        }
        // One more than the level tolerates.
        if tolerance + 1 < n {
            let present: Vec<String> = ms[tolerance + 1..].to_vec();
            fails(
                &args(&["read", "--offset", "0", "--length", "1"], &present),
                "cannot run",
            );
            let d: Value =
                serde_json::from_slice(&ok(&args(&["detail", "--json"], &present)).stdout).unwrap();
            assert_eq!(d["state"], "failed");
        }
    }
}

#[test]
fn bad_input_is_refused_and_overwrites_nothing() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    for m in &ms {
        std::fs::write(m, vec![0u8; 16 << 20]).unwrap();
    }
    let before = digest(&ms);
    fails(
        &args(&["create", "--level", "7"], &ms),
        "unknown RAID level",
    );
    fails(
        &args(&["create", "--level", "5", "--chunk", "3000"], &ms),
        "power of two",
    );
    // A member on a host that does not answer: named, once.
    let gone = "nbd://127.0.0.1:1/x";
    let err = fails(
        &["create", "--level", "1", &ms[0], gone],
        "connecting to 127.0.0.1:1",
    );
    assert_eq!(err.matches(gone).count(), 1, "{err}");
    fails(
        &args(&["create", "--level", "5", "--chunk", "2K"], &ms),
        "at least 4 KiB",
    );
    // A chunk of 0 once divided by zero; one too large was reported as
    // members too small.
    fails(
        &args(&["create", "--level", "0", "--chunk", "0"], &ms),
        "power of two",
    );
    fails(
        &args(&["create", "--level", "0", "--chunk", "1T"], &ms),
        "at most 1 GiB",
    );
    fails(
        &args(&["create", "--level", "5", "--name", ""], &ms),
        "non-empty and printable",
    );
    fails(
        &args(&["create", "--level", "5", "--name", "x\ny"], &ms),
        "non-empty and printable",
    );
    fails(
        &args(&["create", "--level", "6"], &ms),
        "at least 4 members",
    );
    fails(
        &args(&["create", "--level", "5", "--layout", "n2"], &ms),
        "does not apply",
    );
    fails(
        &args(&["create", "--level", "5", "--layout", "diagonal"], &ms),
        "unknown layout",
    );
    let dup = vec![ms[0].clone(), ms[1].clone(), ms[0].clone()];
    fails(&args(&["create", "--level", "5"], &dup), "more than once");
    // A --size too small for the metadata is named as such, not the
    // members (which are large enough).
    fails(
        &args(&["create", "--level", "5", "--size", "1M"], &ms),
        "--size 1048576 is too small",
    );
    assert_eq!(digest(&ms), before);

    // Mismatched sizes.
    let odd = dir.path().join("odd.img").display().to_string();
    std::fs::write(&odd, vec![0u8; 20 << 20]).unwrap();
    let mixed = vec![ms[0].clone(), ms[1].clone(), odd.clone()];
    fails(&args(&["create", "--level", "5"], &mixed), "differ in size");
    // Too small.
    let tiny = write_file(dir.path(), "tiny.img", &[0u8; 4096]);
    fails(
        &args(&["create", "--level", "1"], &[ms[0].clone(), tiny.clone()]),
        "too small",
    );
    assert_eq!(digest(&ms), before);

    // A junk file: refused by create (holds data) and by every reader.
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let junk_data: Vec<u8> = (0..16 << 20).map(|_| rng.gen()).collect();
    let junk = write_file(dir.path(), "junk.img", &junk_data);
    let with_junk = vec![ms[0].clone(), ms[1].clone(), junk.clone()];
    fails(&args(&["create", "--level", "5"], &with_junk), "holds data");
    assert_eq!(std::fs::read(&junk).unwrap(), junk_data);
    assert_eq!(digest(&ms), before);

    // Data further in, on members of 256 MiB (sparse; a metadata area of
    // 2 MiB): a few bytes anywhere in the metadata area past its first MiB
    // or in the last MiB (md's 0.90 and 1.0 superblocks, a backup GPT), a
    // few MiB of a file's data in the middle of the disk (the middle is
    // looked at in places: a disk of terabytes is not read whole). Each
    // refused without --force, nothing written.
    const BIG: usize = 256 << 20;
    let cases = [
        ((1 << 20) + 12345, 8, "metadata area"),
        (100 << 20, 4 << 20, "middle"),
        (BIG - 8, 8, "end"),
    ];
    let blank: Vec<String> = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("big{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(BIG as u64)
                .unwrap();
            p.display().to_string()
        })
        .collect();
    for (at, len, what) in cases {
        let used = dir.path().join("used.img");
        let f = std::fs::File::create(&used).unwrap();
        f.set_len(BIG as u64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &vec![0x5a; len], at as u64).unwrap();
        let used = used.display().to_string();
        let before_used = std::fs::read(&used).unwrap();
        let with_used = vec![blank[0].clone(), used.clone(), blank[1].clone()];
        let e = fails(&args(&["create", "--level", "5"], &with_used), "holds data");
        let seen: usize = e
            .split("offset ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no offset in {e}"));
        assert!((at..at + len).contains(&seen), "{what}: {e}");
        assert!(
            std::fs::read(&used).unwrap() == before_used,
            "{what}: the member was written"
        );
        for b in &blank {
            assert!(
                std::fs::read(b).unwrap().iter().all(|&x| x == 0),
                "{what}: {b} written"
            );
        }
    }

    // New files (--size): one named twice in two spellings is said to be,
    // and a create that fails on one of them leaves none behind.
    let new = |n: &str| dir.path().join(n).display().to_string();
    let dotted = format!("{}/./n0.img", dir.path().display());
    for (third, why) in [
        (dotted, "more than once"),
        (new("nodir/n2.img"), "No such file"),
    ] {
        let (n0, n1) = (new("n0.img"), new("n1.img"));
        let create = ["create", "--level", "5", "--size", "16M", &n0, &n1, &third];
        fails(&create, why);
    }
    assert!(!Path::new(&new("n0.img")).exists() && !Path::new(&new("n1.img")).exists());

    // A real array, then a second one: members of one are refused by the other.
    ok(&args(&["create", "--level", "5", "--name", "first"], &ms));
    let other = members(&dir.path().join("o"), 3);
    std::fs::create_dir_all(dir.path().join("o")).unwrap();
    ok(&args(
        &[
            "create", "--level", "5", "--size", "16M", "--name", "second",
        ],
        &other,
    ));
    // A member named twice (here through a link) is said to be, not
    // blamed on this process's own lock.
    let link = dir.path().join("link.img");
    std::os::unix::fs::symlink(&ms[0], &link).unwrap();
    let twice = vec![
        ms[0].clone(),
        link.display().to_string(),
        ms[1].clone(),
        ms[2].clone(),
    ];
    fails(
        &args(&["serve", "--listen", "127.0.0.1:0"], &twice),
        "same member",
    );
    let first = digest(&ms);
    let second = digest(&other);
    let steal = vec![other[0].clone(), other[1].clone(), ms[2].clone()];
    fails(
        &args(&["create", "--level", "5"], &steal),
        "already belongs to array",
    );
    let mix = vec![ms[0].clone(), ms[1].clone(), other[2].clone()];
    fails(&args(&["detail"], &mix), "different arrays");
    fails(
        &args(&["read", "--offset", "0", "--length", "1"], &mix),
        "different arrays",
    );
    let with_junk = vec![ms[0].clone(), ms[1].clone(), junk.clone()];
    fails(&args(&["detail"], &with_junk), "not a raidkit member");
    fails(&["examine", &junk], "not a raidkit member");
    let twice = vec![ms[0].clone(), ms[1].clone(), ms[1].clone()];
    fails(&args(&["detail"], &twice), "same member");
    fails(&["detail", "/nonexistent/x.img"], "/nonexistent/x.img");
    // Writes past the end are refused before anything is written.
    let d: Value = serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    let size = d["size"].as_u64().unwrap();
    let input = write_file(dir.path(), "in.bin", &[7u8; 8192]);
    fails(
        &args(
            &[
                "write",
                "--offset",
                &(size - 4096).to_string(),
                "--in",
                &input,
            ],
            &ms,
        ),
        "nothing written",
    );
    // Bad sizes and missing flags are usage errors.
    let o = raidkit_refused(&args(&["read", "--offset", "12Q", "--length", "1"], &ms));
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(digest(&ms), first);
    assert_eq!(digest(&other), second);
    // --force does overwrite.
    ok(&args(
        &["create", "--level", "5", "--force", "--name", "again"],
        &steal,
    ));
}

#[test]
fn torn_superblock_update_still_assembles() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    ok(&args(&["create", "--level", "5", "--size", "16M"], &ms));
    let data = vec![0x5au8; 100_000];
    let input = write_file(dir.path(), "in.bin", &data);
    let out = ok(&args(
        &["write", "--offset", "1000", "--in", &input, "--json"],
        &ms,
    ));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (said["written"].as_u64(), said["offset"].as_u64()),
        (Some(100_000), Some(1000))
    );
    // Tear copy A of member 0: a sector of it is garbage.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&ms[0])
            .unwrap();
        f.write_all_at(&[0xffu8; 512], 1024).unwrap();
    }
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[0], "--json"]).stdout).unwrap();
    assert_eq!(
        e["superblock_copies_valid"],
        serde_json::json!([false, true])
    );
    let o = ok(&args(&["detail"], &ms));
    assert!(String::from_utf8_lossy(&o.stdout).contains("superblock copy is unreadable"));
    assert!(read_array(&ms, 1000, data.len()) == data);
    // The next update mends the torn copy.
    ok(&args(&["write", "--offset", "0", "--in", &input], &ms));
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[0], "--json"]).stdout).unwrap();
    assert_eq!(
        e["superblock_copies_valid"],
        serde_json::json!([true, true])
    );
    // Both copies bad: a corrupt superblock, reported as such.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&ms[1])
            .unwrap();
        f.write_all_at(&[0xffu8; 512], 1024).unwrap();
        f.write_all_at(&[0xffu8; 512], 8192 + 1024).unwrap();
    }
    fails(&args(&["detail"], &ms), "corrupt superblock");
    // Leaving it out assembles degraded.
    let rest = vec![ms[0].clone(), ms[2].clone()];
    assert!(read_array(&rest, 0, data.len()) == data);
}

#[test]
fn json_reports_and_stale_members() {
    let dir = tmp();
    let ms = members(dir.path(), 4);
    ok(&args(
        &[
            "create",
            "--level",
            "6",
            "--layout",
            "right-asymmetric",
            "--chunk",
            "128K",
            "--size",
            "32M",
            "--name",
            "lab",
        ],
        &ms,
    ));
    let e: Value = serde_json::from_slice(&ok(&["examine", &ms[2], "--json"]).stdout).unwrap();
    assert_eq!(e["level"], "raid6");
    assert_eq!(e["layout"], "right-asymmetric");
    assert_eq!(e["chunk"], 128 * 1024);
    assert_eq!(e["role"], 2);
    assert_eq!(e["name"], "lab");
    assert_eq!(e["data_offset"], 1 << 20);
    assert_eq!(e["data_size"], 31 << 20);
    assert_eq!(e["state"], "clean");
    assert!(e["events"].as_u64().unwrap() >= 1);
    let d: Value = serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    assert_eq!(d["uuid"], e["array_uuid"]);
    assert_eq!(d["size"], 2 * (31u64 << 20));
    assert_eq!(d["members"].as_array().unwrap().len(), 4);
    assert_eq!(d["members"][2]["path"], ms[2].as_str());
    assert_eq!(d["members"][2]["state"], "active");

    // Write with member 1 away; it comes back stale and is not trusted.
    let data = vec![0x11u8; 300_000];
    let input = write_file(dir.path(), "in.bin", &data);
    let without: Vec<String> = [0, 2, 3].iter().map(|&i| ms[i].clone()).collect();
    // Starting it without a member it did not know to be gone needs --run.
    let refused = raidkit_refused(&args(&["write", "--offset", "0", "--in", &input], &without));
    assert_eq!(refused.status.code(), Some(1));
    ok(&args(
        &["write", "--run", "--offset", "0", "--in", &input],
        &without,
    ));
    let d: Value = serde_json::from_slice(&ok(&args(&["detail", "--json"], &ms)).stdout).unwrap();
    assert_eq!(d["state"], "degraded");
    assert_eq!(d["members"][1]["state"], "stale");
    assert!(d["members"][1]["reason"]
        .as_str()
        .unwrap()
        .contains("behind"));
    assert!(read_array(&ms, 0, data.len()) == data);
}

#[test]
fn raid50_from_the_command_line() {
    let dir = tmp();
    let a = members(&dir.path().join("a"), 3);
    let b = members(&dir.path().join("b"), 3);
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    ok(&args(
        &["create", "--level", "5", "--size", "20M", "--chunk", "64K"],
        &a,
    ));
    ok(&args(
        &["create", "--level", "5", "--size", "20M", "--chunk", "64K"],
        &b,
    ));
    let outer = [
        format!("array[{}]", a.join(",")),
        format!("array[{}]", b.join(",")),
    ];
    ok(&args(&["create", "--level", "0", "--chunk", "64K"], &outer));
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let input = write_file(dir.path(), "in.bin", &data);
    ok(&args(&["write", "--offset", "777", "--in", &input], &outer));
    let degraded = [
        format!("array[{},{}]", a[0], a[2]),
        format!("array[{},{}]", b[1], b[2]),
    ];
    assert!(read_array(&degraded, 777, data.len()) == data);
    let d: Value =
        serde_json::from_slice(&ok(&args(&["detail", "--json"], &outer)).stdout).unwrap();
    assert_eq!(d["level"], "raid0");
    assert_eq!(d["state"], "optimal");
}

#[test]
fn every_command_has_help() {
    for cmd in [
        "create", "examine", "detail", "read", "write", "list", "stop",
    ] {
        let o = ok(&[cmd, "--help"]);
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: raidkit"));
    }
    ok(&["--help"]);
    let o = raidkit_refused(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn bench_parity_prints_the_anchor_format() {
    let o = ok(&[
        "bench",
        "parity",
        "--k",
        "4",
        "--chunk",
        "8K",
        "--seconds",
        "0.05",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    let names: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    for want in ["memcpy", "xor_gen", "pq_gen", "rs_recover_2"] {
        assert!(names.contains(&want), "{want} missing from:\n{out}");
    }
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 4, "{line}");
        assert_eq!(f[1], "4");
        assert_eq!(f[2], "8192");
        assert!(f[3].parse::<f64>().unwrap() > 0.0, "{line}");
    }
    fails(&["bench", "parity", "--k", "1"], "--k must be between");
    fails(&["bench", "parity", "--isa", "mmx"], "not available");
}

#[test]
fn bench_engine_reports_every_level_and_cleans_up() {
    let dir = tmp();
    let d = dir.path().display().to_string();
    let o = ok(&[
        "bench",
        "engine",
        "--members",
        "4",
        "--size",
        "12M",
        "--chunk",
        "64K",
        "--seconds",
        "0.1",
        "--runs",
        "1",
        "--dir",
        &d,
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    for level in ["raid0", "raid5", "raid6"] {
        assert!(out.lines().any(|l| l.starts_with(level)), "{out}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "member files left behind"
    );
    fails(
        &["bench", "engine", "--members", "3", "--dir", &d],
        "at least 4",
    );
}

#[test]
fn fault_injected_members_still_read_correctly() {
    let dir = tmp();
    let ms = members(dir.path(), 5);
    ok(&args(
        &["create", "--level", "6", "--size", "16M", "--chunk", "64K"],
        &ms,
    ));
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let input = write_file(dir.path(), "in.bin", &data);
    ok(&args(&["write", "--offset", "0", "--in", &input], &ms));
    // Member 1 fails reads in its data area, member 3 vanishes after its
    // superblock has been read: RAID-6 still returns every byte.
    let faulty = vec![
        ms[0].clone(),
        format!("fault:{}?read-error-at=1100K,1500K,2M", ms[1]),
        ms[2].clone(),
        format!("fault:{}?vanish-after=2&delay=1ms", ms[3]),
        ms[4].clone(),
    ];
    assert!(read_array(&faulty, 0, data.len()) == data);
    // A bad fault spec is a clear error.
    let bad = vec![format!("fault:{}?explode=1", ms[0]), ms[1].clone()];
    fails(&args(&["detail"], &bad), "unknown fault 'explode'");
}

/// Whether process `pid` is gone (or a zombie: killed, not yet reaped).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A shell that starts a grandchild (`sleep`), writes its pid to `pidf`
/// and waits for it.
fn sh_with_grandchild(pidf: &Path) -> std::process::Command {
    let mut c = std::process::Command::new("sh");
    c.args([
        "-c",
        &format!("sleep 600 & echo $! > {}; wait", pidf.display()),
    ]);
    c
}

fn read_pid(pidf: &Path) -> String {
    common::wait_for("the grandchild's pid", 30, || {
        std::fs::read_to_string(pidf).is_ok_and(|s| s.ends_with('\n'))
    });
    std::fs::read_to_string(pidf).unwrap().trim().to_string()
}

#[test]
fn a_hung_tool_is_killed_at_its_deadline_with_its_children() {
    let dir = tmp();
    let pidf = dir.path().join("grandchild.pid");
    let r = std::panic::catch_unwind(|| {
        common::output_within(
            &mut sh_with_grandchild(&pidf),
            std::time::Duration::from_secs(1),
        )
    });
    assert!(r.is_err(), "a hung tool ran past its deadline unnoticed");
    let pid = read_pid(&pidf);
    common::wait_for("the grandchild to be killed", 10, || gone(&pid));
}

#[test]
fn a_guarded_child_is_killed_when_the_test_panics() {
    let dir = tmp();
    let pidf = dir.path().join("grandchild.pid");
    let child = std::sync::Mutex::new(String::new());
    let r = std::panic::catch_unwind(|| {
        let g = common::Guarded::spawn(&mut sh_with_grandchild(&pidf));
        *child.lock().unwrap() = g.id().to_string();
        read_pid(&pidf);
        panic!("a failing test");
    });
    assert!(r.is_err());
    let (pid, sh) = (read_pid(&pidf), child.into_inner().unwrap());
    common::wait_for("the child and grandchild to be killed", 10, || {
        gone(&pid) && gone(&sh)
    });
}

/// `check --json`: (exit code, mismatches, checked).
fn check(ms: &[String]) -> (Option<i32>, u64, u64) {
    let (code, bad, checked, _) = check_named(ms);
    (code, bad, checked)
}

/// A mismatch `check` names: (unit, member offset, roles).
type Named = (u64, u64, Vec<u64>);

/// `check --json`: (exit code, mismatches, checked, those named).
fn check_named(ms: &[String]) -> (Option<i32>, u64, u64, Vec<Named>) {
    let o = common::raidkit(&args(&["check", "--json"], ms));
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let found = v["found"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["unit"].as_u64().unwrap(),
                f["member_offset"].as_u64().unwrap(),
                f["roles"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_u64().unwrap())
                    .collect(),
            )
        })
        .collect();
    (
        o.status.code(),
        v["mismatches"].as_u64().unwrap(),
        v["checked"].as_u64().unwrap(),
        found,
    )
}

/// Flip one byte of `member`'s data area at `at` (from the data start).
fn flip(member: &str, at: u64) {
    use std::os::unix::fs::FileExt;
    let e: Value = serde_json::from_slice(&ok(&["examine", "--json", member]).stdout).unwrap();
    let off = e["data_offset"].as_u64().unwrap() + at;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(member)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], off).unwrap();
}

#[test]
fn create_syncs_members_that_hold_data_and_check_finds_planted_mismatches() {
    // `check` counts the stripes (chunks for mirrors) that disagree, names
    // each (unit, where on the members, which roles: the parity that
    // disagrees, or the copies that differ), and exits 1.
    // With checksums, each flipped block is named by the member that holds
    // it (and the block, in `findings`), whether data or parity.
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    const CHUNK: u64 = 64 << 10;
    let shapes = [("5", 4, None), ("6", 5, None), ("10", 4, Some("n2"))];
    for (cs, (level, n, layout)) in ["off", "on"]
        .into_iter()
        .flat_map(|cs| shapes.map(|s| (cs, s)))
    {
        let dir = tmp();
        let ms = members(dir.path(), n);
        // Members full of random bytes (not blank): create needs --force,
        // and then syncs their redundancy.
        let mut junk = || {
            for m in &ms {
                let mut b = vec![0u8; 8 << 20];
                rng.fill(&mut b[..]);
                std::fs::write(m, b).unwrap();
            }
        };
        junk();
        let mut head = vec![
            "create",
            "--level",
            level,
            "--size",
            "8M",
            "--chunk",
            "64K",
            "--checksums",
            cs,
        ];
        if let Some(l) = layout {
            head.extend(["--layout", l]);
        }
        fails(&args(&head, &ms), "holds data");
        head.push("--force");
        let mut with_json = head.clone();
        with_json.push("--json");
        let o = ok(&args(&with_json, &ms));
        let (code, bad, checked) = check(&ms);
        assert_eq!(
            (code, bad),
            (Some(0), 0),
            "RAID-{level} after the initial sync"
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["initial_sync"], true, "RAID-{level}: {v}");
        let e: Value = serde_json::from_slice(&ok(&["examine", "--json", &ms[0]]).stdout).unwrap();
        let rows = e["data_size"].as_u64().unwrap() / CHUNK;
        // Parity levels: stripes; RAID-10: chunks of the array.
        let expect = if level == "10" {
            rows * n as u64 / 2
        } else {
            rows
        };
        assert_eq!(checked, expect, "RAID-{level}");
        // Planted: one byte in row 3 of member 1, one in row 7 of member 1
        // and of member 2 (the same row: one stripe, but for RAID-10 n2 on
        // 4 members two mirror pairs), one in row 9 of member 0.
        flip(&ms[1], 3 * CHUNK + 100);
        flip(&ms[1], 7 * CHUNK + 5);
        flip(&ms[2], 7 * CHUNK + 6000);
        flip(&ms[0], 9 * CHUNK + CHUNK - 1);
        let (code, bad, _, found) = check_named(&ms);
        let want = if level == "10" { 4 } else { 3 };
        if cs == "on" {
            assert_eq!((code, bad), (Some(1), want), "RAID-{level} with checksums");
            let expect: Vec<Named> = match level {
                "10" => vec![
                    (6, 3 * CHUNK, vec![1]),
                    (14, 7 * CHUNK, vec![1]),
                    (15, 7 * CHUNK, vec![2]),
                    (18, 9 * CHUNK, vec![0]),
                ],
                _ => vec![
                    (3, 3 * CHUNK, vec![1]),
                    (7, 7 * CHUNK, vec![1, 2]),
                    (9, 9 * CHUNK, vec![0]),
                ],
            };
            assert_eq!(found, expect, "RAID-{level}: the members named");
            let o = common::raidkit(&args(&["check", "--json"], &ms));
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            let data_offset = |m: &str| {
                let e: Value =
                    serde_json::from_slice(&ok(&["examine", "--json", m]).stdout).unwrap();
                e["data_offset"].as_u64().unwrap()
            };
            let blocks: Vec<(String, u64, u64, String)> = v["findings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["member"].as_str().unwrap().to_string(),
                        f["member_offset"].as_u64().unwrap(),
                        f["length"].as_u64().unwrap(),
                        f["kind"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let at = |m: usize, off: u64| {
                (
                    ms[m].clone(),
                    data_offset(&ms[m]) + off / 4096 * 4096,
                    4096,
                    "checksum".to_string(),
                )
            };
            let mut want_blocks = vec![
                at(1, 3 * CHUNK + 100),
                at(1, 7 * CHUNK + 5),
                at(2, 7 * CHUNK + 6000),
                at(0, 9 * CHUNK + CHUNK - 1),
            ];
            let mut blocks = blocks;
            blocks.sort();
            want_blocks.sort();
            assert_eq!(blocks, want_blocks, "RAID-{level}: the blocks named");
            continue;
        }
        assert_eq!(
            code,
            Some(1),
            "RAID-{level}: check passed with planted mismatches"
        );
        assert_eq!(bad, want, "RAID-{level}");
        // Named, by md's placement written out here: left-symmetric puts
        // P of stripe s on role n-1-(s mod n) and Q on the next role; n2
        // on four members mirrors array chunk 2r+p on roles 2p, 2p+1 at
        // row r.
        let parity = |s: u64| -> Vec<u64> {
            let n = n as u64;
            let p = n - 1 - s % n;
            match level {
                "5" => vec![p],
                _ => vec![p, (p + 1) % n],
            }
        };
        let expect: Vec<Named> = match level {
            "5" => vec![
                (3, 3 * CHUNK, parity(3)),
                (7, 7 * CHUNK, parity(7)),
                (9, 9 * CHUNK, parity(9)),
            ],
            // Stripe 3: role 1 is its P (Q is right); stripe 7: P and Q
            // both disagree (a data and the P flipped); stripe 9: role 0
            // is its P.
            "6" => vec![
                (3, 3 * CHUNK, vec![parity(3)[0]]),
                (7, 7 * CHUNK, parity(7)),
                (9, 9 * CHUNK, vec![parity(9)[0]]),
            ],
            _ => vec![
                (6, 3 * CHUNK, vec![0, 1]),
                (14, 7 * CHUNK, vec![0, 1]),
                (15, 7 * CHUNK, vec![2, 3]),
                (18, 9 * CHUNK, vec![0, 1]),
            ],
        };
        assert_eq!(found, expect, "RAID-{level}: the mismatches named");
        // Without the initial sync, random members disagree nearly everywhere.
        junk();
        head.push("--assume-clean");
        ok(&args(&head, &ms));
        let (code, bad, checked) = check(&ms);
        assert_eq!(code, Some(1), "RAID-{level}");
        assert!(bad > checked / 2, "RAID-{level}: {bad} of {checked}");
    }
}

/// A report whose reader has gone (`raidkit detail ... | head -1`) ends
/// quietly, by SIGPIPE as other Unix tools do, not with a panic.
#[test]
fn a_report_whose_reader_is_gone_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let dir = tmp();
    let ms = members(dir.path(), 3);
    common::create("5", &ms, "16M");
    let mut c = Command::new(common::BIN)
        .args(args(&["detail"], &ms))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The read end is closed before anything is printed.
    drop(c.stdout.take());
    let t = std::time::Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > std::time::Duration::from_secs(60) {
            let _ = c.kill();
            panic!("detail did not end within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(st.signal(), Some(libc::SIGPIPE), "{st}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
