//! The process's I/O mode reaches every file a spec opens: plain, inside
//! `fault:`/`sim:` wrappers and inside nested arrays; an array created and
//! served over direct-I/O members reads back what was written at odd
//! offsets. One test function: the mode is process-wide.

use raidkit_array::create::{CreateOptions, Policy};
use raidkit_layout::{Layout, Level};
use raidkit_member::{FileMember, Member};
use raidkit_open::{io_mode, open, open_array, set_io_mode, IoMode, Spec};

fn spec(s: &str) -> Spec {
    Spec::parse(s).unwrap()
}

#[test]
fn specs_open_in_the_process_io_mode() {
    let dir = tempfile::Builder::new()
        .prefix("raidkit-open-io-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let files: Vec<String> = (0..3)
        .map(|i| {
            let p = dir.path().join(format!("d{i}.img"));
            FileMember::create(&p, 8 << 20).unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();

    // Nothing set: buffered, as before.
    assert_eq!(io_mode(), IoMode::Buffered);
    let m = open(&spec(&files[0]), false).unwrap();
    assert!(m.as_file().is_some(), "buffered members offer their file");
    assert_eq!(m.block_size(), 1);
    drop(m);

    set_io_mode(IoMode::Direct);
    assert_eq!(io_mode(), IoMode::Direct);
    for s in [
        files[0].clone(),
        format!("fault:{}?read-error-at=1G", files[0]),
        format!("sim:{}?bw=10G&seek=0ms", files[0]),
    ] {
        let m = open(&spec(&s), false).unwrap();
        assert!(m.as_file().is_none(), "{s}: direct members offer no file");
        assert!(m.block_size() >= 512, "{s}: the block size reaches the top");
    }

    // An array over direct-I/O members: created, opened, written at odd
    // offsets and read back, also as a member of another array's spec.
    let members: Vec<Spec> = files.iter().map(|f| spec(f)).collect();
    let opts = CreateOptions {
        level: Level::Raid5,
        layout: Layout::parse(Level::Raid5, "left-symmetric").unwrap(),
        chunk: 64 << 10,
        size: None,
        name: "direct".into(),
        force: false,
        assume_clean: false,
        background_sync: false,
        bitmap_region: 1 << 20,
        policy: Policy::Journal,
        spares: Vec::new(),
        checksums: false,
        md: false,
        data_offset: None,
        domains: Vec::new(),
    };
    raidkit_open::create(&members, &[], &opts, |_, _| {}).unwrap();
    let nested = format!("array[{}]", files.join(","));
    let a = open_array(&spec(&nested), false).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    a.write_at(&data, 12_345).unwrap();
    a.write_at_durable(b"odd bytes", 7).unwrap();
    let mut back = vec![0u8; data.len()];
    a.read_at(&mut back, 12_345).unwrap();
    assert!(back == data, "the array read back something else");
    let mut b = [0u8; 9];
    a.read_at(&mut b, 7).unwrap();
    assert_eq!(&b, b"odd bytes");
    a.close().unwrap();
    drop(a);

    set_io_mode(IoMode::Auto);
    let m = open(&spec(&files[1]), true).unwrap();
    assert!(
        m.as_file().is_none(),
        "auto on a disk's file system is direct"
    );
    set_io_mode(IoMode::Buffered);
}
