//! The client's side of the protocol, now that a server on another host is
//! an array member: a hostile server's greeting, option replies and
//! replies to reads in flight. Never a panic, a hang, or a write past a
//! buffer.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    raidkit_nbd::client::fuzz_server_bytes(data);
});
