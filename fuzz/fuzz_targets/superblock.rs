//! The on-disk superblock decoder: any bytes (with a valid checksum, so the
//! fields are really parsed) either decode or give an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use raidkit_array::superblock::{seal, Superblock, MAGIC, SB_SIZE};

fuzz_target!(|data: &[u8]| {
    let mut b = vec![0u8; SB_SIZE];
    b[..8].copy_from_slice(&MAGIC);
    let n = data.len().min(SB_SIZE - 8);
    b[8..8 + n].copy_from_slice(&data[..n]);
    seal(&mut b);
    if let Ok(Some(sb)) = Superblock::decode(&b, "fuzz") {
        // Whatever decodes re-encodes to a block that decodes.
        assert!(matches!(Superblock::decode(&sb.encode(), "fuzz"), Ok(Some(_))));
    }
});
