//! The transmission-phase request parser, and the round trip through the encoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use raidkit_nbd::proto;

fuzz_target!(|data: &[u8]| {
    if data.len() >= proto::REQUEST_LEN {
        let b: &[u8; proto::REQUEST_LEN] = data[..proto::REQUEST_LEN].try_into().unwrap();
        if let Ok(r) = proto::parse_request(b) {
            assert_eq!(&proto::encode_request(&r), b);
        }
    }
});
