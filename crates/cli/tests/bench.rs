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
    let (v, err) = bench_json(&[&target, "--size", "12M"]);
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
    assert!(text.starts_with("test,zone,qd,value,unit,runs,min,max\n"));
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
    fails(&["bench", "nbd://127.0.0.1:1/x"], "not supported yet");
    fails(&["bench"], "give a TARGET");
    fails(
        &["bench", e, "--tests", "seq_read", "--size", "1M"],
        "too small",
    );
}
