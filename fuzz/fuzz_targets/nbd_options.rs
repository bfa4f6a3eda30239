//! The handshake parsers: an option header, then its payload as every
//! option that has one.
#![no_main]
use libfuzzer_sys::fuzz_target;
use raidkit_nbd::proto;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let h: &[u8; 16] = data[..16].try_into().unwrap();
        if let Ok(h) = proto::parse_option_header(h) {
            let _ = h.len;
        }
    }
    let _ = proto::parse_go(data);
    let _ = proto::parse_meta(data);
});
