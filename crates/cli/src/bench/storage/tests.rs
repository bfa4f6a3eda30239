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

#[test]
fn test_lists_expand_groups_in_a_stable_order() {
    assert_eq!(
        parse_tests("randread_4k,seq_write").unwrap(),
        vec!["seq_write", "randread_4k"]
    );
    let all = parse_tests("all").unwrap();
    assert_eq!(all.len(), 16);
    assert_eq!(parse_tests("bonnie,dd,bonnie").unwrap().len(), 11);
    assert!(parse_tests("warp_speed").is_err());
    assert!(parse_tests(",").is_err());
}

#[test]
fn memory_cgroup_limits_are_found_up_the_hierarchy() {
    let root = tempfile::tempdir().unwrap();
    let w = |rel: &str, file: &str, v: &str| {
        let d = root.path().join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(file), v).unwrap();
    };
    // v1: no limit on the process's own group, 2 GiB on its parent.
    w("memory", "memory.limit_in_bytes", "9223372036854771712\n");
    w("memory/box", "memory.limit_in_bytes", "2147483648\n");
    w(
        "memory/box/job",
        "memory.limit_in_bytes",
        "9223372036854771712\n",
    );
    let v1 = "9:pids:/\n4:memory:/box/job\n0::/\n";
    assert_eq!(cgroup_memory_limit(v1, root.path()), Some(2 << 30));
    // v2: "max" everywhere but the leaf.
    w("", "memory.max", "max\n");
    w("slice", "memory.max", "max\n");
    w("slice/bench", "memory.max", "1073741824\n");
    assert_eq!(
        cgroup_memory_limit("0::/slice/bench\n", root.path()),
        Some(1 << 30)
    );
    // No limit anywhere, or no memory controller: none.
    assert_eq!(cgroup_memory_limit("0::/slice\n", root.path()), None);
    assert_eq!(cgroup_memory_limit("3:cpuset:/\n", root.path()), None);
    assert_eq!(
        meminfo_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
        Some(24576000 * 1024)
    );
}
