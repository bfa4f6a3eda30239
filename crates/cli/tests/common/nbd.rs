//! Talking NBD by hand, and the checks the NBD tests share.

use super::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub fn host_port(uri: &str) -> String {
    uri.trim_start_matches("nbd://")
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

pub fn detail(ms: &[String]) -> Value {
    serde_json::from_slice(&ok(&args(&["detail", "--json"], ms)).stdout).unwrap()
}

pub fn io_count(s: &Served, what: &str) -> u64 {
    let ctl = s.control.display().to_string();
    let st: Value =
        serde_json::from_slice(&ok(&["status", "--control", &ctl, "--json"]).stdout).unwrap();
    st["io"][what].as_u64().unwrap()
}

/// Stop the server (cleanly) and check the array's redundancy offline.
pub fn stop_and_check(s: &mut Served, ms: &[String]) {
    assert_eq!(s.stop().code(), Some(0));
    let o = ok(&args(&["check", "--json"], ms));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"], 0, "{v}");
}

pub fn encode(
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(payload);
    b
}

/// A hand-written client, to send what well-behaved libraries never send.
pub struct Raw {
    pub s: TcpStream,
}

pub const OPT_MAGIC: u64 = 0x4948_4156_454f_5054;

impl Raw {
    pub fn connect(uri: &str) -> Raw {
        let s = TcpStream::connect(host_port(uri)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = Raw { s };
        let mut hello = [0u8; 18];
        r.s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        r
    }

    pub fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = OPT_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// (reply type, payload)
    pub fn option_reply(&mut self) -> (u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut p = vec![0u8; len as usize];
        self.s.read_exact(&mut p).unwrap();
        (kind, p)
    }

    /// Handshake with NBD_OPT_GO on the default export; returns the size.
    pub fn go(uri: &str) -> (Raw, u64) {
        let mut r = Raw::connect(uri);
        r.s.write_all(&3u32.to_be_bytes()).unwrap();
        // An unknown option first: NBD_REP_ERR_UNSUP, and negotiation goes on.
        r.option(0x7777, b"junk");
        assert_eq!(r.option_reply().0, (1 << 31) | 1);
        // A malformed GO: NBD_REP_ERR_INVALID.
        r.option(7, &[0, 0, 0, 9, b'x']);
        assert_eq!(r.option_reply().0, (1 << 31) | 3);
        let mut go = 0u32.to_be_bytes().to_vec();
        go.extend_from_slice(&0u16.to_be_bytes());
        r.option(7, &go);
        let mut size = 0;
        loop {
            let (kind, p) = r.option_reply();
            match kind {
                3 if p[..2] == [0, 0] => size = u64::from_be_bytes(p[2..10].try_into().unwrap()),
                3 => {}
                1 => break,
                other => panic!("unexpected option reply {other:#x}"),
            }
        }
        (r, size)
    }

    pub fn request(&mut self, kind: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) {
        let b = encode(kind, flags, 0xc00c_1e00, offset, len, payload);
        self.s.write_all(&b).unwrap();
    }

    /// Simple reply: (error, data)
    pub fn reply(&mut self, read_len: usize) -> (u32, Vec<u8>) {
        let (err, _, d) = self.reply_with_cookie(read_len);
        (err, d)
    }

    /// Simple reply: (error, cookie, data)
    pub fn reply_with_cookie(&mut self, read_len: usize) -> (u32, u64, Vec<u8>) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut d = vec![0u8; if err == 0 { read_len } else { 0 }];
        self.s.read_exact(&mut d).unwrap();
        (err, cookie, d)
    }

    /// `n` simple replies in whatever order they come, sorted by cookie;
    /// the one to the read `read.0` carries `read.1` bytes of data.
    pub fn replies(&mut self, n: usize, read: (u64, usize)) -> Vec<(u32, u64, Vec<u8>)> {
        let mut got: Vec<(u32, u64, Vec<u8>)> = (0..n)
            .map(|_| {
                let mut h = [0u8; 16];
                self.s.read_exact(&mut h).unwrap();
                assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
                let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
                let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
                let len = if err == 0 && cookie == read.0 {
                    read.1
                } else {
                    0
                };
                let mut d = vec![0u8; len];
                self.s.read_exact(&mut d).unwrap();
                (err, cookie, d)
            })
            .collect();
        got.sort_by_key(|g| g.1);
        got
    }

    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

/// A handshake up to the option phase (fixed newstyle, no zeroes).
pub fn options(uri: &str) -> Raw {
    let mut r = Raw::connect(uri);
    r.s.write_all(&3u32.to_be_bytes()).unwrap();
    r
}

pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
