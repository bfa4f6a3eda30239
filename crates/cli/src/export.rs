//! `raidkit export PATH`: one file or block device served as a plain NBD
//! export (no array metadata), for the storage hosts of an array whose
//! members are on other machines (`nbd://HOST:PORT/EXPORT` members). The
//! same NBD server and member engine as `serve`.

use crate::cli::ExportArgs;
use anyhow::{Context, Result};
use raidkit_nbd::{Config, Export, Server};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub fn export(a: ExportArgs) -> Result<()> {
    let opened = raidkit_member::open_member(&a.path, a.read_only, a.io.io)
        .with_context(|| format!("cannot export {}", a.path.display()))?;
    let member = opened.member;
    let name = a.name.clone().unwrap_or_else(|| {
        a.path
            .file_name()
            .map_or_else(|| "export".into(), |n| n.to_string_lossy().into_owned())
    });
    let listen = crate::serve::listen_of(a.listen.as_ref(), a.socket.as_ref());
    let l = crate::serve::bind(&listen, &a.socket)?;
    let waits = !member.buffered();
    let server = Server::new(
        Export {
            name: name.clone(),
            description: format!("raidkit export of {}", a.path.display()),
            device: member.clone(),
            read_only: a.read_only,
            preferred_block: raidkit_nbd::server::PREFERRED_BLOCK,
        },
        Config {
            // As serve: a client's queue depth reaches a device that waits.
            workers_per_connection: if waits { 32 } else { 8 },
            max_connections: a.max_connections as usize,
            ..Config::default()
        },
    );
    crate::serve::secure(&server, &a.access, listen.as_deref())?;
    let mut endpoints = Vec::new();
    if let Some(t) = l.tcp {
        endpoints.push(format!(
            "{}://{}/{}",
            crate::serve::scheme(&a.access),
            t.local_addr()?,
            crate::serve::uri_part(&name)
        ));
        server.serve_tcp(t)?;
    }
    if let Some(u) = l.unix {
        let p = a
            .socket
            .as_ref()
            .expect("socket given")
            .display()
            .to_string();
        endpoints.push(format!(
            "{}+unix:///{}?socket={}",
            crate::serve::scheme(&a.access),
            crate::serve::uri_part(&name),
            crate::serve::uri_part(&p).replace("%2F", "/")
        ));
        server.serve_unix(u)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    crate::say::report!(
        "raidkit: exporting {} ({}, {}) read-{}",
        a.path.display(),
        crate::units::human(member.len()),
        match opened.mode {
            raidkit_member::IoMode::Direct => "direct I/O",
            _ => "buffered",
        },
        if a.read_only { "only" } else { "write" }
    );
    for e in &endpoints {
        crate::say::report!("raidkit: listening on {e}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.shutdown();
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    member
        .close()
        .with_context(|| format!("flushing {}", a.path.display()))?;
    crate::say::note(&format!("stopped exporting {}", a.path.display()));
    Ok(())
}
