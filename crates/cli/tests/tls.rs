//! TLS on every connection: storage hosts (`raidkit export --tls require`)
//! whose `nbds://` endpoints are an array's members, the array served with
//! TLS required and `--allow`, by certificates and by pre-shared keys;
//! driven with the real binary, nbdinfo, nbdcopy and qemu-io (openssl makes
//! the certificates).

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// A certificate authority and a server certificate for 127.0.0.1 in
/// `dir`, as libnbd and QEMU look for them there (ca-cert.pem,
/// server-cert.pem, server-key.pem).
fn certificates(dir: &std::path::Path) {
    let at = |f: &str| dir.join(f).display().to_string();
    tool(
        "timeout",
        &[
            "60",
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=raidkit test CA",
            "-keyout",
            &at("ca-key.pem"),
            "-out",
            &at("ca-cert.pem"),
        ],
    );
    tool(
        "timeout",
        &[
            "60",
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &at("server-key.pem"),
            "-out",
            &at("server.csr"),
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    tool(
        "timeout",
        &[
            "60",
            "openssl",
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &at("server.csr"),
            "-CA",
            &at("ca-cert.pem"),
            "-CAkey",
            &at("ca-key.pem"),
            "-CAcreateserial",
            "-out",
            &at("server-cert.pem"),
            "-extfile",
            &at("ext.cnf"),
        ],
    );
}

/// `raidkit export` of a new 32 MiB file at `f` on a free loopback port
/// with `tls` settings: the process and its URI.
fn tls_export(f: &std::path::Path, tls: &[&str]) -> (Guarded, String) {
    std::fs::File::create(f).unwrap().set_len(32 << 20).unwrap();
    let mut g = Guarded::spawn(
        Command::new(BIN)
            .args(["export", "--listen", "127.0.0.1:0"])
            .args(tls)
            .arg(f)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let out = g.child().stdout.take().unwrap();
    let line = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("nbd://") || l.contains("nbds://"))
        .expect("export URI");
    // With --tls require the endpoint says nbds:// (TLS required).
    let at = line
        .find("nbds://")
        .or_else(|| line.find("nbd://"))
        .unwrap();
    let uri = line[at..].to_string();
    (g, uri)
}

/// QEMU's client with TLS credentials `creds` writes `len` bytes of
/// `byte` at `at` of the export `served` names and reads them back;
/// then nbdcopy over `uri` (into `back`) finds them, and `data` around
/// them.
fn qemu_io_writes_over_tls(
    creds: &str,
    served: &str,
    (at, len, byte): (usize, usize, u8),
    (data, uri, back): (&[u8], &str, &std::path::Path),
) {
    let port = served
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let export = served.rsplit('/').next().unwrap();
    let q = tool(
        "timeout",
        &[
            "60",
            "qemu-io",
            "--object",
            creds,
            "--image-opts",
            &format!(
                "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export={export},tls-creds=tls0"
            ),
            "-c",
            &format!("write -P {byte:#x} {at} {len}"),
            "-c",
            &format!("read -P {byte:#x} {at} {len}"),
        ],
    );
    assert!(
        !String::from_utf8_lossy(&q.stdout).contains("Pattern verification failed"),
        "{q:?}"
    );
    let mut want = data.to_vec();
    want[at..at + len].fill(byte);
    tool(
        "timeout",
        &["60", "nbdcopy", uri, &back.display().to_string()],
    );
    assert!(std::fs::read(back).unwrap()[..want.len()] == want[..]);
}

#[test]
fn tls_on_every_connection_and_only_allowed_peers() {
    let dir = tmp();
    let certs = dir.path().join("pki");
    std::fs::create_dir(&certs).unwrap();
    certificates(&certs);
    let pki = certs.display().to_string();
    let cert = certs.join("server-cert.pem").display().to_string();
    let key = certs.join("server-key.pem").display().to_string();
    let tls = ["--tls", "require", "--tls-cert", &cert, "--tls-key", &key];
    // Servers that require TLS give their endpoints as nbds:// URIs.
    let secure = |uri: &str| {
        assert!(uri.starts_with("nbds://"), "{uri}");
        format!("{uri}?tls-certificates={pki}")
    };
    let plain = |uri: &str| uri.replacen("nbds://", "nbd://", 1);
    // Three storage hosts that require TLS; the array's members are
    // nbds:// URIs.
    let hosts: Vec<(Guarded, String)> = (0..3)
        .map(|i| tls_export(&dir.path().join(format!("h{i}.img")), &tls))
        .collect();
    // A plain client is refused by a host.
    let out = try_tool("timeout", &["20", "nbdinfo", "--size", &plain(&hosts[0].1)]);
    assert!(!out.status.success(), "{out:?}");
    let members: Vec<String> = hosts.iter().map(|h| secure(&h.1)).collect();
    create("5", &members, "24M");

    // The array served with TLS required and only loopback let in.
    let mut s = Served::start(
        dir.path(),
        &members,
        &[&tls[..], &["--allow", "127.0.0.0/8"]].concat(),
    );
    let uri = secure(&s.uri);
    let data: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let input = dir.path().join("in.raw");
    std::fs::write(&input, &data).unwrap();
    tool(
        "timeout",
        &["60", "nbdcopy", &input.display().to_string(), &uri],
    );
    let back = dir.path().join("back.raw");
    tool(
        "timeout",
        &["60", "nbdcopy", &uri, &back.display().to_string()],
    );
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
    // Idle past the 30 s a handshake may take: the members' TLS links stay
    // up (the handshake's read limit stayed on the sockets under TLS, and
    // every idle link was dropped at 30 s: the array failed by itself).
    std::thread::sleep(std::time::Duration::from_secs(36));
    let st: serde_json::Value = serde_json::from_slice(
        &ok(&[
            "status",
            "--json",
            "--control",
            &s.control.display().to_string(),
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(st["state"], "optimal", "{st}");
    // QEMU's client over TLS: a write and a read at odd offsets.
    qemu_io_writes_over_tls(
        &format!("tls-creds-x509,id=tls0,dir={pki},endpoint=client"),
        &s.uri,
        (1001, 3333, 0x5a),
        (&data, &uri, &back),
    );
    // Without TLS: refused.
    let out = try_tool("timeout", &["20", "nbdinfo", "--size", &plain(&s.uri)]);
    assert!(!out.status.success(), "{out:?}");
    // A client that does not trust the server's authority: refused.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    certificates(&other);
    let wrong = format!("{}?tls-certificates={}", s.uri, other.display());
    let out = try_tool("timeout", &["20", "nbdinfo", "--size", &wrong]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(s.stop().code(), Some(0));

    // A server that lets in only another network: a loopback client is
    // disconnected before the handshake, even with TLS.
    let mut s = Served::start(
        dir.path(),
        &members,
        &[&tls[..], &["--allow", "10.255.0.0/16"]].concat(),
    );
    let out = try_tool("timeout", &["20", "nbdinfo", "--size", &secure(&s.uri)]);
    assert!(!out.status.success(), "{out:?}");
    assert!(s.status()["connections"]["refused"].as_u64().unwrap() >= 1);
    assert_eq!(s.stop().code(), Some(0));

    // Pre-shared keys (nbdkit's and qemu's key file): the array served
    // to clients that know a key, libnbd's and QEMU's.
    let pskdir = dir.path().join("psk");
    std::fs::create_dir(&pskdir).unwrap();
    let psk = pskdir.join("keys.psk");
    std::fs::write(
        &psk,
        "alice:8d4d3b9f0c1e2a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b\n",
    )
    .unwrap();
    let psk_s = psk.display().to_string();
    let mut s = Served::start(
        dir.path(),
        &members,
        &["--tls", "require", "--tls-psk", &psk_s],
    );
    let with_key = |user: &str, file: &str| {
        format!(
            "{}?tls-psk-file={file}",
            s.uri.replacen("nbds://", &format!("nbds://{user}@"), 1)
        )
    };
    let uri = with_key("alice", &psk_s);
    tool(
        "timeout",
        &["60", "nbdcopy", &input.display().to_string(), &uri],
    );
    qemu_io_writes_over_tls(
        &format!(
            "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
            pskdir.display()
        ),
        &s.uri,
        (7777, 2222, 0xc3),
        (&data, &uri, &back),
    );
    // Without TLS, with a wrong key, as an unknown user who has alice's
    // key: refused.
    let wrong = pskdir.join("wrong.psk");
    std::fs::write(&wrong, "alice:00112233445566778899aabbccddeeff\n").unwrap();
    let mallory = pskdir.join("mallory.psk");
    let alice_key = std::fs::read_to_string(&psk)
        .unwrap()
        .replace("alice:", "mallory:");
    std::fs::write(&mallory, alice_key).unwrap();
    for bad in [
        plain(&s.uri),
        with_key("alice", &wrong.display().to_string()),
        with_key("mallory", &mallory.display().to_string()),
    ] {
        let out = try_tool("timeout", &["20", "nbdinfo", "--size", &bad]);
        assert!(!out.status.success(), "{bad}: {out:?}");
    }
    assert_eq!(s.stop().code(), Some(0));
    // A member on a host that requires keys: nbds://USER@...?tls-psk-file.
    let (_keyed, kuri) = tls_export(
        &dir.path().join("k.img"),
        &["--tls", "require", "--tls-psk", &psk_s],
    );
    let remote = format!(
        "{}?tls-psk-file={psk_s}",
        kuri.replacen("nbds://", "nbds://alice@", 1)
    );
    let local = dir.path().join("k-local.img").display().to_string();
    create("1", &[local.clone(), remote.clone()], "16M");
    ok(&[
        "write",
        &local,
        &remote,
        "-o",
        "1M",
        "--in",
        &input.display().to_string(),
    ]);
    // Read from the remote member alone: the bytes went over TLS.
    ok(&[
        "read",
        &remote,
        "-o",
        "1M",
        "-n",
        "3M",
        "--out",
        &back.display().to_string(),
    ]);
    assert!(std::fs::read(&back).unwrap() == data);
    ok(&["check", &local, &remote]);
    // A wrong key, an identity the host has no key for: the error says
    // which (OpenSSL's own text is "alert illegal parameter").
    let keyed = |user: &str, file: &std::path::Path| {
        format!(
            "{}?tls-psk-file={}",
            kuri.replacen("nbds://", &format!("nbds://{user}@"), 1),
            file.display()
        )
    };
    let read_one = |m: &str, needle: &str| {
        fails(
            &[
                "read",
                m,
                "-o",
                "0",
                "-n",
                "4K",
                "--out",
                &back.display().to_string(),
            ],
            needle,
        )
    };
    read_one(
        &keyed("alice", &wrong),
        &format!(
            "the key for 'alice' in {} is not the server's",
            wrong.display()
        ),
    );
    read_one(
        &keyed("mallory", &mallory),
        "the server has no key for identity 'mallory'",
    );
    // Keys without TLS, keys and certificates at once, a file that is
    // not keys: refused, nothing served.
    let f = dir.path().join("h0.img").display().to_string();
    let garbage = pskdir.join("garbage.psk");
    std::fs::write(&garbage, "alice:not-hex\n").unwrap();
    for args in [
        vec!["export", "--tls-psk", &psk_s, &f],
        vec![
            "export",
            "--tls",
            "require",
            "--tls-psk",
            &psk_s,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            &f,
        ],
        vec![
            "export",
            "--tls",
            "require",
            "--tls-psk",
            garbage.to_str().unwrap(),
            &f,
        ],
    ] {
        let out = raidkit_refused(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
}
