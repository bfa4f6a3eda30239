//! `raidkit bench TARGET`: results in the documented shape, the cache-bound
//! warning on a working set in RAM, compressible data refused unless asked
//! for, and clear errors for bad targets and options.

mod common;

use common::*;
use serde_json::Value;

fn bench_json(args: &[&str]) -> (Value, String) {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    a.extend(["--json", "--runs", "2", "--seconds", "0.1"]);
    let o = ok(&a);
    (
        serde_json::from_slice(&o.stdout).unwrap(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn results_have_the_documented_shape_and_ram_targets_are_flagged() {
    let dir = tmp();
    let target = dir.path().join("t.img").display().to_string();
    let (v, err) = bench_json(&[&target, "--size", "12M", "--tests", "dd"]);
    // /dev/shm is a RAM disk: the warning must say so.
    assert!(err.contains("RAM file system"), "{err}");
    assert_eq!(v["config"]["cache_bound"], true);
    assert_eq!(v["config"]["size"], 12 << 20);
    assert!(v["config"]["machine"]["ram"].as_u64().unwrap() > 0);
    let results = v["results"].as_array().unwrap();
    // 2 sequential tests x 3 zones + 2 random tests x 3 zones x 2 queue depths.
    assert_eq!(results.len(), 18, "{v}");
    for r in results {
        for k in ["test", "value", "unit", "runs", "min", "max", "zone"] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
        assert_eq!(r["runs"], 2);
        let (value, min, max) = (
            r["value"].as_f64().unwrap(),
            r["min"].as_f64().unwrap(),
            r["max"].as_f64().unwrap(),
        );
        assert!(value > 0.0 && min <= value && value <= max, "{r}");
        if r["unit"] == "IOPS" {
            assert!(r["qd"] == 1 || r["qd"] == 32, "{r}");
        }
    }
    assert!(
        !std::path::Path::new(&target).exists(),
        "the scratch file was left behind"
    );
    // Other queue depths on request: one result per zone and depth.
    let (v, _) = bench_json(&[
        &target,
        "--size",
        "12M",
        "--tests",
        "randread_4k",
        "--qd",
        "4,16,128",
    ]);
    let qds: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["qd"].as_u64().unwrap())
        .collect();
    assert_eq!(qds, [4, 16, 128, 4, 16, 128, 4, 16, 128], "{v}");
}

#[test]
fn an_array_and_a_small_buffered_working_set_warn_of_the_cache() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let spec = format!("array[{}]", ms.join(","));
    let csv = dir.path().join("r.csv");
    let (v, err) = bench_json(&[
        &spec,
        "--tests",
        "seq_write,seq_read",
        "--size",
        "6M",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(err.contains("cache-bound"), "{err}");
    assert_eq!(v["config"]["kind"], "raidkit array");
    assert_eq!(v["results"].as_array().unwrap().len(), 6);
    let text = std::fs::read_to_string(&csv).unwrap();
    // Columns are only ever added at the end: the first nine stay put.
    assert!(text.starts_with(
        "test,zone,qd,value,unit,runs,min,max,streams,cpu,client_bound,client\n"
    ));
    assert_eq!(text.lines().count(), 7);
    // The array is intact afterwards.
    ok(&args(&["check"], &ms));
}

#[test]
fn compressible_data_is_refused_unless_asked_for() {
    let dir = tmp();
    let sample = dir.path().join("text.dat");
    std::fs::write(&sample, "event 1 energy 13.2 GeV; ".repeat(20000)).unwrap();
    let target = dir.path().join("t.img").display().to_string();
    let s = sample.to_str().unwrap();
    fails(
        &[
            "bench",
            &target,
            "--size",
            "6M",
            "--data",
            s,
            "--tests",
            "seq_write",
        ],
        "compressible",
    );
    let (v, _) = bench_json(&[
        &target,
        "--size",
        "6M",
        "--data",
        s,
        "--allow-compressible",
        "--tests",
        "seq_write",
    ]);
    assert!(v["config"]["data"].as_str().unwrap().contains("bits/byte"));
}

#[test]
fn bad_targets_and_options_get_clear_errors() {
    let dir = tmp();
    let existing = dir.path().join("keep.img");
    std::fs::write(&existing, vec![7u8; 8 << 20]).unwrap();
    let e = existing.to_str().unwrap();
    fails(&["bench", e], "--destroy-data");
    assert!(
        std::fs::read(&existing).unwrap().iter().all(|&b| b == 7),
        "data was overwritten"
    );
    fails(&["bench", "/nonexistent-dir/x.img"], "no such file");
    fails(
        &["bench", e, "--tests", "seq_read,warp_speed"],
        "unknown test 'warp_speed'",
    );
    fails(
        &["bench", e, "--tests", "seq_read", "--runs", "0"],
        "at least 1",
    );
    fails(
        &["bench", "nbd://127.0.0.1:1/x", "--tests", "seq_read"],
        "connecting to 127.0.0.1:1",
    );
    fails(&["bench", "nbd://127.0.0.1:notaport/x"], "bad port");
    fails(
        &["bench", e, "--tests", "seq_read", "--streams", "0"],
        "--streams",
    );
    fails(
        &["bench", e, "--tests", "seq_read", "--chunk", "100"],
        "--chunk",
    );
    fails(
        &["bench", e, "--tests", "randread_4k", "--qd", "0"],
        "--qd 0: give queue depths from 1 to 256",
    );
    fails(
        &["bench", e, "--tests", "randread_4k", "--qd", "1,x"],
        "--qd 1,x: give queue depths",
    );
    fails(&["bench"], "give a TARGET");
    fails(
        &["bench", e, "--tests", "seq_read", "--size", "1M"],
        "too small",
    );
}

fn result<'a>(v: &'a Value, test: &str) -> &'a Value {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["test"] == test)
        .unwrap_or_else(|| panic!("no {test} in {v}"))
}

#[test]
fn a_directory_gets_bonnies_set_and_the_data_path_tests() {
    let dir = tmp();
    let plots = dir.path().join("plots");
    let (v, err) = bench_json(&[
        dir.path().to_str().unwrap(),
        "--tests",
        "bonnie,datapath",
        "--size",
        "16M",
        "--char-size",
        "64K",
        "--files",
        "200",
        "--streams",
        "2",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    assert!(err.contains("RAM file system"), "{err}");
    assert_eq!(v["config"]["kind"], "directory");
    for (test, unit) in [
        ("char_write", "MB/s"),
        ("block_write", "MB/s"),
        ("rewrite", "MB/s"),
        ("char_read", "MB/s"),
        ("block_read", "MB/s"),
        ("random_seeks", "seeks/s"),
        ("seq_create", "files/s"),
        ("seq_stat", "files/s"),
        ("seq_delete", "files/s"),
        ("random_create", "files/s"),
        ("random_stat", "files/s"),
        ("random_delete", "files/s"),
        ("mem_to_target", "MB/s"),
        ("target_to_mem", "MB/s"),
        ("streams_write_one", "MB/s"),
        ("streams_write", "MB/s"),
        ("streams_write_per_stream", "MB/s"),
        ("streams_read", "MB/s"),
        ("mixed_write", "MB/s"),
        ("mixed_read", "MB/s"),
    ] {
        let r = result(&v, test);
        assert_eq!(r["unit"], unit, "{r}");
        assert_eq!(r["runs"], 2, "{r}");
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(result(&v, "streams_write")["streams"], 2);
    // The overhead is 1 - per-stream/one-stream, as the seeds define it;
    // it is recomputed here from the run's own medians as a sanity bound.
    let over = result(&v, "streams_read_overhead");
    assert_eq!(over["unit"], "%");
    assert!(over["value"].as_f64().unwrap() < 100.0, "{over}");
    // The per-character tests moved one byte per call: 64 KiB of them.
    assert_eq!(v["config"]["char_size"], 64 << 10);
    for (f, bar) in [
        ("throughput.svg", "block_write"),
        ("files.svg", "seq_create"),
    ] {
        let svg = std::fs::read_to_string(plots.join(f)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains(bar), "{f}: {svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }
    // Nothing left behind in the directory but the plots.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "plots")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn an_nbd_export_is_measured_within_its_working_set_only() {
    let dir = tmp();
    let ms = members(dir.path(), 3);
    create("5", &ms, "16M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    // Writing to someone's export needs consent.
    fails(&["bench", &s.uri, "--tests", "seq_write"], "--destroy-data");
    let (v, err) = bench_json(&[
        &s.uri,
        "--destroy-data",
        "--tests",
        "seq_write,seq_read,randwrite_4k,block_write,rewrite,char_write,streams_write",
        "--whole",
        "--size",
        "8M",
    ]);
    assert_eq!(v["config"]["kind"], "NBD export");
    assert!(err.contains("char_write and char_read skipped"), "{err}");
    assert!(
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["test"] != "char_write"),
        "{v}"
    );
    assert_eq!(result(&v, "seq_write")["zone"], "all");
    assert!(result(&v, "rewrite")["value"].as_f64().unwrap() > 0.0);
    assert_eq!(s.stop().code(), Some(0));
    // Only the first 8 MiB of the 16 MiB-per-member RAID-5 was written:
    // the rest still reads as zeroes, and parity agrees.
    let size: u64 = {
        let o = ok(&args(&["detail", "--json"], &ms));
        let d: Value = serde_json::from_slice(&o.stdout).unwrap();
        d["size"].as_u64().unwrap()
    };
    let out = dir.path().join("tail.bin");
    ok(&args(
        &[
            "read",
            "--offset",
            "8M",
            "--length",
            &(size - (8 << 20)).to_string(),
            "--out",
            out.to_str().unwrap(),
        ],
        &ms,
    ));
    let tail = std::fs::read(&out).unwrap();
    assert!(!tail.is_empty() && tail.iter().all(|&b| b == 0));
    let head = dir.path().join("head.bin");
    ok(&args(
        &[
            "read",
            "--offset",
            "0",
            "--length",
            "8M",
            "--out",
            head.to_str().unwrap(),
        ],
        &ms,
    ));
    assert!(std::fs::read(&head).unwrap().iter().any(|&b| b != 0));
    ok(&args(&["check"], &ms));
}

/// How many 4 KiB blocks of `data` are not all zero, and how many of those
/// are alike (the same as an earlier one).
fn nonzero_and_duplicate_blocks(data: &[u8]) -> (usize, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut nonzero = 0;
    let mut dups = 0;
    for b in data.chunks(4096).filter(|b| b.iter().any(|&x| x != 0)) {
        nonzero += 1;
        if !seen.insert(b) {
            dups += 1;
        }
    }
    (nonzero, dups)
}

/// A deduplicating target must not be flattered: no two blocks any write
/// test leaves behind are alike, whether written sequentially, at random by
/// threads (a file) or pipelined on one connection (an NBD export).
#[test]
fn written_data_cannot_be_deduplicated() {
    let dir = tmp();
    let file = dir.path().join("t.img");
    std::fs::write(&file, vec![0u8; 12 << 20]).unwrap();
    let f = file.to_str().unwrap();
    bench_json(&[f, "--destroy-data", "--tests", "seq_write"]);
    let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&file).unwrap());
    assert_eq!((nonzero, dups), (3072, 0));

    for (test, extra) in [("randwrite_4k", None), ("block_write", Some("--whole"))] {
        std::fs::write(&file, vec![0u8; 12 << 20]).unwrap();
        let mut a = vec![f, "--destroy-data", "--tests", test];
        a.extend(extra);
        bench_json(&a);
        let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&file).unwrap());
        assert!(nonzero > 100, "{test}: only {nonzero} blocks written");
        assert_eq!(dups, 0, "{test}: {dups} of {nonzero} blocks alike");
    }

    let ms = members(dir.path(), 2);
    create("0", &ms, "8M");
    let mut s = Served::start(dir.path(), &ms, &[]);
    bench_json(&[&s.uri, "--destroy-data", "--tests", "randwrite_4k"]);
    assert_eq!(s.stop().code(), Some(0));
    let size = {
        let o = ok(&args(&["detail", "--json"], &ms));
        let d: Value = serde_json::from_slice(&o.stdout).unwrap();
        d["size"].as_u64().unwrap().to_string()
    };
    let out = dir.path().join("all.bin");
    let o = out.to_str().unwrap();
    ok(&args(
        &["read", "--offset", "0", "--length", &size, "--out", o],
        &ms,
    ));
    let (nonzero, dups) = nonzero_and_duplicate_blocks(&std::fs::read(&out).unwrap());
    assert!(nonzero > 100, "NBD: only {nonzero} blocks written");
    assert_eq!(dups, 0, "NBD: {dups} of {nonzero} blocks alike");
}

/// Which 4 KiB blocks of the file at `p` are not all zero.
fn written_blocks(p: &std::path::Path) -> std::collections::BTreeSet<usize> {
    std::fs::read(p)
        .unwrap()
        .chunks(4096)
        .enumerate()
        .filter(|(_, b)| b.iter().any(|&x| x != 0))
        .map(|(i, _)| i)
        .collect()
}

/// Random offsets come from a seed recorded with the results: the same
/// seed draws the same offsets, and by default every invocation draws new
/// ones (so no run reads back exactly what a cache still holds).
#[test]
fn random_offsets_come_from_a_recorded_seed() {
    // A sparse file of 256 MiB: 4 KiB blocks.
    const BLOCKS: usize = 65536;
    let dir = tmp();
    let run = |name: &str, seed: Option<&str>| {
        let f = dir.path().join(name);
        std::fs::File::create(&f)
            .unwrap()
            .set_len(BLOCKS as u64 * 4096)
            .unwrap();
        let fs = f.to_str().unwrap().to_string();
        let mut a = vec![
            "bench",
            &fs,
            "--destroy-data",
            "--tests",
            "randwrite_4k",
            "--qd",
            "1",
            "--whole",
            "--runs",
            "1",
            "--seconds",
            "0.05",
            "--json",
        ];
        if let Some(s) = seed {
            a.extend(["--seed", s]);
        }
        let v: Value = serde_json::from_slice(&ok(&a).stdout).unwrap();
        assert_eq!(v["config"]["qd"], serde_json::json!([1]));
        (v["config"]["seed"].as_u64().unwrap(), written_blocks(&f))
    };
    let (s1, a) = run("a.img", Some("42"));
    let (s2, b) = run("b.img", Some("42"));
    assert_eq!((s1, s2), (42, 42));
    // Runs of the same seed for different times: one set of blocks holds
    // the other.
    let (small, big) = if a.len() <= b.len() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(small.len() > 100, "only {} blocks written", small.len());
    assert!(small.is_subset(big), "the same seed drew other offsets");
    // Another seed, and no seed at all: other offsets. Offsets drawn
    // independently share about |a| |c| / BLOCKS blocks by chance (a fast
    // machine covers much of the file in the time given), the same offsets
    // min(|a|, |c|): the count must lie nearer to chance.
    for (name, seed) in [("c.img", Some("43")), ("d.img", None)] {
        let (s, c) = run(name, seed);
        assert_ne!(s, 42);
        let shared = c.intersection(&a).count();
        let chance = a.len() * c.len() / BLOCKS;
        let same = c.len().min(a.len());
        assert!(
            same - chance > 50 && shared < (chance + same) / 2,
            "seed {s}: {shared} of {} blocks the same as seed 42's ({chance} by chance)",
            c.len()
        );
    }
}
