//! The checksum area: one crc32c for every 4 KiB block of a member's data
//! area, parity included, so that a block that silently changed on the disk
//! is named (which member, which block) and rebuilt from redundancy.
//!
//! # Where it lies
//!
//! Just before the data, at the end of the metadata area:
//! `[data_offset - size, data_offset)`. Its offset and size are in the
//! superblock (format version 2; version 1 members have none). A member of
//! `len` bytes needs `len / 1024` bytes of checksums (0.1 %), in 64 KiB
//! steps: up to a quarter of the usual metadata area (`data_offset_for`,
//! members up to 32 GiB) it is taken from the end of that area (the
//! journal gets the rest); beyond, the data starts that much later.
//!
//! # Format (version 1)
//!
//! An array of little-endian u32, entry `i` for the data area's bytes
//! `[i * 4096, (i + 1) * 4096)`: crc32c of the block, except that 0 means
//! "no checksum yet" (blocks never written since the array was created, or
//! since a member was added; each gets its checksum when first written,
//! or as first read by a writable array: sync, scrub or client) and a block whose crc32c is 0 is recorded as 1 (which weakens
//! detection by one value in 2^32).
//!
//! # Why crc32c
//!
//! It runs in hardware (SSE 4.2's crc32 instruction, ARMv8's CRC
//! extension, and faster still folded with carry-less multiplies: 44 GB/s
//! per core on cached 4 KiB blocks here, see `crc32c`), so verifying every
//! read costs far less than moving the bytes, and it is already what the
//! superblocks and journal use. A 32-bit CRC over a 4 KiB block detects every burst of up to
//! 32 flipped bits and misses a random corruption once in 2^32: rot is
//! rare, and a missed one falls to the next scrub's redundancy check. A
//! 64-bit hash (xxh3) would halve the blocks per checksum page and add a
//! dependency for a gain in detection that rot rates do not need.
//!
//! # Crash consistency
//!
//! Data and its checksum are two writes to two places; a crash can tear
//! them. Checksum pages are written back at every flush (before the
//! member's own flush), so what a flush made durable agrees with its
//! checksums. A crash leaves disagreement only where writes were in flight,
//! which is exactly what the consistency policy already tracks (journal
//! records and intents, bitmap regions, everything for `none`): there a
//! block that disagrees is taken as it is and its checksum recomputed
//! ("adopted", as dm-integrity's bitmap mode does), unless redundancy
//! rebuilds it to content that agrees with that checksum (rot: see
//! `consistency/heal.rs`). See `core::checked`.

/// Bytes of data one checksum covers.
pub const BLOCK: u64 = 4096;
/// Bytes of one checksum.
pub const ENTRY: u64 = 4;
/// Format version of the area's content.
pub const FORMAT: u32 = 1;
/// Algorithm code in the superblock: crc32c.
pub const CRC32C: u32 = 1;
/// Entries per 4 KiB page of the area (the unit it is read and written in).
pub const PER_PAGE: u64 = 1024;

/// Bytes of checksum area a member of `len` bytes needs: an entry for
/// every block, in 64 KiB steps.
pub fn area_size(len: u64) -> u64 {
    (len.div_ceil(BLOCK) * ENTRY)
        .max(1)
        .next_multiple_of(64 << 10)
}

/// CRC-32C of `data` (the checksum of blocks, superblocks and journal
/// records). Through crc-fast, which folds with carry-less multiplies
/// (VPCLMULQDQ where the CPU has it) instead of running the crc32
/// instruction alone: on this project's machine 44 GB/s against 21 GB/s
/// over cached 4 KiB blocks, and every block a client reads or writes on a
/// checksummed array goes through it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// CRC-32C of `parts` laid end to end.
pub fn crc32c_of(parts: &[&[u8]]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

/// The checksum of one block as recorded (never 0: 0 is "none yet").
pub fn sum(block: &[u8]) -> u32 {
    match crc32c(block) {
        0 => 1,
        c => c,
    }
}

/// The recorded checksum of a block of zeroes (what a discarded block reads back).
pub fn zero_sum() -> u32 {
    static Z: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *Z.get_or_init(|| sum(&[0u8; BLOCK as usize]))
}

/// The checksum recorded for a block that could not be rebuilt (written
/// with zeroes): any value but the zeroes' own, so that it reads as bad.
pub fn lost_sum() -> u32 {
    !zero_sum()
}

/// Whether `block` agrees with its recorded checksum (0: nothing recorded).
pub fn matches(recorded: u32, block: &[u8]) -> bool {
    recorded == 0 || recorded == sum(block)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn area_is_a_thousandth_in_64k_steps() {
        assert_eq!(area_size(16 << 20), 64 << 10);
        assert_eq!(area_size(1 << 30), MIB);
        assert_eq!(area_size(1 << 40), 1 << 30);
        // Holds an entry for every block of the member.
        for len in [1u64 << 20, 3 << 30, (1 << 40) + 4096] {
            assert!(area_size(len) >= len.div_ceil(BLOCK) * ENTRY);
        }
    }

    #[test]
    fn a_lost_block_is_neither_zeroes_nor_their_complement() {
        // A block nothing could rebuild holds zeroes, and a write over its
        // stripe makes parity from it complemented (parity_write.rs):
        // neither may agree with what it is marked with.
        assert!(!matches(lost_sum(), &[0u8; BLOCK as usize]));
        assert!(!matches(lost_sum(), &[0xffu8; BLOCK as usize]));
    }

    #[test]
    fn crc32c_is_castagnolis_crc_whole_or_in_parts() {
        // The catalogue's check value of CRC-32/ISCSI: members written with
        // any earlier build verify the same.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        let whole = crc32c(&data);
        assert_eq!(
            crc32c_of(&[&data[..1], &data[1..4099], &data[4099..]]),
            whole
        );
        assert_eq!(crc32c_of(&[&data]), whole);
        assert_ne!(crc32c(&data[1..]), whole);
    }

    #[test]
    fn zero_is_never_a_recorded_sum() {
        assert_ne!(sum(&[0u8; 4096]), 0);
        assert!(matches(0, b"anything"));
        let mut b = vec![7u8; 4096];
        let s = sum(&b);
        assert!(matches(s, &b));
        b[100] ^= 1;
        assert!(!matches(s, &b));
    }
}
