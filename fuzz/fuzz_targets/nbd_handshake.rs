//! The server's whole handshake (every option, STARTTLS included, in any
//! order) fed a client's bytes: never a panic or a hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    raidkit_nbd::server::fuzz_client_bytes(data);
});
