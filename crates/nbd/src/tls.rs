//! TLS on NBD connections (NBD_OPT_STARTTLS), with rustls, for the server
//! (`serve`/`export --tls`) and the client (`nbds://` members), and the
//! peers a server lets in (`--allow`).
//!
//! Once the handshake has switched to TLS, two threads carry the
//! connection between the socket and one end of a local socket pair: the
//! server's and the client's connection code keep working on a plain
//! stream (the other end) that they can clone for their reader and writer
//! threads, as they do on a socket. A rustls connection is one object for
//! both directions, so sharing it directly would put a reader blocked on
//! the network in the way of every writer. Records are produced and sent
//! under one lock, so they leave in the order they were sealed; nothing
//! blocks on the network while holding the connection's lock.
//!
//! Pre-shared keys (`--tls-psk`, in nbdkit's and qemu's key file format)
//! are served with OpenSSL instead: rustls has no external PSKs
//! (rustls#174). OpenSSL's connection cannot be read and written from two
//! threads at once, so one thread pumps both directions, polling the
//! socket and the pair without blocking on either.

use crate::stream::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What a server does about TLS.
#[derive(Clone)]
pub struct ServerTls {
    kind: Kind,
    /// Clients must switch to TLS before anything else (NBD's FORCEDTLS).
    pub require: bool,
}

#[derive(Clone)]
enum Kind {
    X509(Arc<rustls::ServerConfig>),
    Psk(openssl::ssl::SslContext),
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("require", &self.require)
            .finish()
    }
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("{}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("{}: no certificate in it", path.display())));
    }
    Ok(certs)
}

fn roots(ca: &Path) -> io::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca)? {
        roots
            .add(c)
            .map_err(|e| bad(format!("{}: {e}", ca.display())))?;
    }
    Ok(roots)
}

impl ServerTls {
    /// X.509: the server's certificate chain and key (PEM); with `ca`,
    /// clients must show a certificate it signed.
    pub fn x509(cert: &Path, key: &Path, ca: Option<&Path>, require: bool) -> io::Result<Self> {
        let chain = certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| bad(format!("{}: {e}", key.display())))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(bad)?;
        let builder = match ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(bad)?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(chain, key).map_err(bad)?;
        Ok(ServerTls {
            kind: Kind::X509(Arc::new(config)),
            require,
        })
    }

    /// Pre-shared keys from `file`: lines `IDENTITY:HEXKEY`, as nbdkit's
    /// and qemu's `--tls-psk` files (GnuTLS's psktool writes them). A client
    /// must know one identity's key; TLS 1.3, or TLS 1.2 with (EC)DHE-PSK.
    pub fn psk(file: &Path, require: bool) -> io::Result<Self> {
        use openssl::ssl::{SslContextBuilder, SslMethod, SslVersion};
        let keys = Arc::new(psk_keys(file)?);
        let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(bad)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(bad)?;
        b.set_cipher_list(PSK_CIPHERS).map_err(bad)?;
        b.set_psk_server_callback(move |ssl, identity, out| {
            if let (Some(id), Ok(ix)) = (identity, identity_index()) {
                ssl.set_ex_data(ix, String::from_utf8_lossy(id).into_owned());
            }
            let key = identity.and_then(|id| keys.iter().find(|(i, _)| i.as_bytes() == id));
            match key {
                Some((_, k)) if k.len() <= out.len() => {
                    out[..k.len()].copy_from_slice(k);
                    Ok(k.len())
                }
                // Unknown identity: no key, the handshake fails.
                _ => Ok(0),
            }
        });
        Ok(ServerTls {
            kind: Kind::Psk(b.build()),
            require,
        })
    }

    /// Switch `s` to TLS as the server (after NBD_OPT_STARTTLS was
    /// acknowledged): the TLS handshake, then the plain side.
    pub(crate) fn accept(&self, s: &Stream) -> io::Result<Stream> {
        match &self.kind {
            Kind::X509(config) => {
                let conn = rustls::ServerConnection::new(config.clone()).map_err(bad)?;
                carry(rustls::Connection::Server(conn), s)
            }
            Kind::Psk(ctx) => carry_openssl(ctx, s, true, &|ssl, reason| {
                let who = ssl
                    .ex_data(identity_index().ok()?)
                    .map_or("the client's identity".to_string(), |id| {
                        format!("identity '{id}'")
                    });
                Some(match reason {
                    BINDER_DOES_NOT_VERIFY | BAD_RECORD_MAC => {
                        format!("the client's key for {who} is not the one in this server's --tls-psk file")
                    }
                    NO_SUITABLE_SIGNATURE_ALGORITHM | NO_SHARED_CIPHER => format!(
                        "this server's --tls-psk file has no key for {who} (or the client offered no pre-shared key)"
                    ),
                    _ => return None,
                })
            }),
        }
    }
}

/// Where a PSK server connection keeps the identity its client gave, for
/// the log line of a handshake that failed.
fn identity_index() -> Result<openssl::ex_data::Index<openssl::ssl::Ssl, String>, ()> {
    static INDEX: std::sync::OnceLock<Option<openssl::ex_data::Index<openssl::ssl::Ssl, String>>> =
        std::sync::OnceLock::new();
    INDEX
        .get_or_init(|| openssl::ssl::Ssl::new_ex_index().ok())
        .ok_or(())
}

// OpenSSL's reason codes (ssl/sslerr.h) of the failures a wrong key or an
// unknown identity gives; an alert received is 1000 + the alert's number.
const BINDER_DOES_NOT_VERIFY: i32 = 253;
const NO_SUITABLE_SIGNATURE_ALGORITHM: i32 = 118;
const NO_SHARED_CIPHER: i32 = 193;
const BAD_RECORD_MAC: i32 = 281;
const ALERT_BAD_RECORD_MAC: i32 = 1020;
const ALERT_HANDSHAKE_FAILURE: i32 = 1040;
const ALERT_ILLEGAL_PARAMETER: i32 = 1047;
const ALERT_DECRYPT_ERROR: i32 = 1051;
const ALERT_UNKNOWN_PSK_IDENTITY: i32 = 1115;

/// The keys of a PSK file: `IDENTITY:HEXKEY` per line.
fn psk_keys(file: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let wrong = || {
            bad(format!(
                "{}: line {}: not IDENTITY:HEXKEY",
                file.display(),
                i + 1
            ))
        };
        let (id, hex) = line.rsplit_once(':').ok_or_else(wrong)?;
        if id.is_empty() || hex.is_empty() || hex.len() % 2 != 0 {
            return Err(wrong());
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&hex[j..j + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| wrong())?;
        keys.push((id.to_string(), key));
    }
    if keys.is_empty() {
        return Err(bad(format!("{}: no keys in it", file.display())));
    }
    Ok(keys)
}

/// TLS 1.2's key exchanges with pre-shared keys and forward secrecy
/// (TLS 1.3 has its own suites).
const PSK_CIPHERS: &str = "kECDHEPSK:kDHEPSK:!eNULL";

/// Says what a failed handshake means, from the connection and OpenSSL's
/// reason code, where that can be told.
type Explain<'a> = &'a dyn Fn(&openssl::ssl::SslRef, i32) -> Option<String>;

/// The TLS handshake with OpenSSL on `net` (as the server or the client),
/// then one thread that pumps both directions between the connection and
/// a local socket pair; returns the pair's plain end. A failed handshake
/// is explained by `explain` where it can be (OpenSSL's own text, "sslv3
/// alert illegal parameter", does not say that a key is wrong), OpenSSL's
/// text kept after it.
fn carry_openssl(
    ctx: &openssl::ssl::SslContext,
    net: &Stream,
    server: bool,
    explain: Explain,
) -> io::Result<Stream> {
    use openssl::ssl::HandshakeError;
    let ssl = openssl::ssl::Ssl::new(ctx).map_err(bad)?;
    let net = net.try_clone()?;
    let tls = if server {
        ssl.accept(net)
    } else {
        ssl.connect(net)
    }
    .map_err(|e| {
        let meaning = match &e {
            HandshakeError::Failure(mid) => mid
                .error()
                .ssl_error()
                .into_iter()
                .flat_map(|stack| stack.errors())
                .find_map(|x| explain(mid.ssl(), x.reason_code())),
            _ => None,
        };
        match meaning {
            Some(m) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake: {m} ({e})"),
            ),
            None => io::Error::other(format!("TLS handshake: {e}")),
        }
    })?;
    let (mine, theirs) = UnixStream::pair()?;
    mine.set_nonblocking(true)?;
    tls.get_ref().set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("tls-psk".into())
        .spawn(move || {
            let mut tls = tls;
            if let Err(e) = pump(&mut tls, &mine) {
                tracing::debug!("TLS connection ended: {e}");
            }
            tls.get_ref().shutdown(Shutdown::Both);
            let _ = mine.shutdown(Shutdown::Both);
        })?;
    Ok(Stream::Unix(theirs))
}

/// Both directions of a non-blocking OpenSSL connection and the plain
/// side, until the plain side has ended and all it wrote is sent: what
/// comes in is handed on once the plain side took what came before, what
/// the plain side writes is sealed and sent; when neither can move, wait
/// for either socket.
fn pump(tls: &mut openssl::ssl::SslStream<Stream>, mut plain: &UnixStream) -> io::Result<()> {
    use openssl::ssl::ErrorCode;
    let mut buf = vec![0u8; 64 << 10];
    let (mut inbound, mut outbound) = (Vec::new(), Vec::new());
    let (mut net_done, mut plain_done) = (false, false);
    let would_block = |e: &io::Error| e.kind() == io::ErrorKind::WouldBlock;
    loop {
        let mut moved = false;
        let mut net_wants_write = false;
        if !inbound.is_empty() {
            match plain.write(&inbound) {
                Ok(n) => {
                    inbound.drain(..n);
                    moved = true;
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if inbound.is_empty() && !net_done {
            match tls.ssl_read(&mut buf) {
                Ok(n) if n > 0 => {
                    inbound.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Ok(_) => net_done = true,
                Err(e) => match e.code() {
                    ErrorCode::WANT_READ => {}
                    ErrorCode::WANT_WRITE => net_wants_write = true,
                    ErrorCode::ZERO_RETURN => net_done = true,
                    // The peer went without close_notify.
                    ErrorCode::SYSCALL if e.io_error().is_none() => net_done = true,
                    _ => return Err(io::Error::other(e.to_string())),
                },
            }
            if net_done {
                // The plain side reads to its end, and may still reply.
                let _ = plain.shutdown(Shutdown::Write);
                moved = true;
            }
        }
        if outbound.is_empty() && !plain_done {
            match plain.read(&mut buf) {
                Ok(0) => plain_done = true,
                Ok(n) => outbound.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
            moved |= plain_done || !outbound.is_empty();
        }
        if !outbound.is_empty() {
            match tls.ssl_write(&outbound) {
                Ok(n) => {
                    outbound.drain(..n);
                    moved = true;
                }
                Err(e) => match e.code() {
                    ErrorCode::WANT_WRITE => net_wants_write = true,
                    ErrorCode::WANT_READ => {}
                    _ => return Err(io::Error::other(e.to_string())),
                },
            }
        }
        if plain_done && outbound.is_empty() {
            // The plain side is gone and all it wrote is sent: nothing
            // would take what still comes in (the caller then shuts the
            // socket, as the rustls carrier does).
            let _ = tls.shutdown();
            return Ok(());
        }
        if !moved {
            let mut fds = [
                libc::pollfd {
                    fd: tls.get_ref().raw_fd(),
                    events: if net_wants_write { libc::POLLOUT } else { 0 }
                        | if inbound.is_empty() && !net_done {
                            libc::POLLIN
                        } else {
                            0
                        },
                    revents: 0,
                },
                libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(plain),
                    events: if inbound.is_empty() { 0 } else { libc::POLLOUT }
                        | if outbound.is_empty() && !plain_done {
                            libc::POLLIN
                        } else {
                            0
                        },
                    revents: 0,
                },
            ];
            // SAFETY: fds is a valid array of two pollfd for the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// What a client does about TLS: whom it trusts and whom it expects.
#[derive(Clone)]
pub struct ClientTls {
    kind: ClientKind,
}

#[derive(Clone)]
enum ClientKind {
    X509 {
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    },
    Psk {
        ctx: openssl::ssl::SslContext,
        /// The identity and its key file, for the error of a refused key.
        user: String,
        file: String,
    },
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ClientKind::X509 { name, .. } => {
                f.debug_struct("ClientTls").field("name", name).finish()
            }
            ClientKind::Psk { user, .. } => f.debug_struct("ClientTls").field("psk", user).finish(),
        }
    }
}

impl ClientTls {
    /// Trusting the certificates in `ca` (PEM), expecting a server
    /// certificate for `host` (a name or an address); with `cert` and
    /// `key`, showing a client certificate.
    pub fn x509(host: &str, ca: &Path, client: Option<(&Path, &Path)>) -> io::Result<ClientTls> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| bad(format!("{host}: not a host name or address: {e}")))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(bad)?
            .with_root_certificates(roots(ca)?);
        let config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    certs(cert)?,
                    PrivateKeyDer::from_pem_file(key)
                        .map_err(|e| bad(format!("{}: {e}", key.display())))?,
                )
                .map_err(bad)?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls {
            kind: ClientKind::X509 {
                config: Arc::new(config),
                name,
            },
        })
    }

    /// As `user`, with `user`'s pre-shared key from `file` (the server's
    /// key file format), by OpenSSL as the server side.
    pub fn psk(user: &str, file: &Path) -> io::Result<ClientTls> {
        use openssl::ssl::{SslContextBuilder, SslMethod, SslVersion};
        let key = psk_keys(file)?
            .into_iter()
            .find(|(id, _)| id == user)
            .map(|(_, k)| k)
            .ok_or_else(|| bad(format!("{}: no key for '{user}'", file.display())))?;
        let identity = user.as_bytes().to_vec();
        let mut b = SslContextBuilder::new(SslMethod::tls_client()).map_err(bad)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(bad)?;
        b.set_cipher_list(PSK_CIPHERS).map_err(bad)?;
        b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
            // The identity NUL-terminated, the key as is.
            if identity.len() < id_out.len() && key.len() <= key_out.len() {
                id_out[..identity.len()].copy_from_slice(&identity);
                id_out[identity.len()] = 0;
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            } else {
                Ok(0)
            }
        });
        Ok(ClientTls {
            kind: ClientKind::Psk {
                ctx: b.build(),
                user: user.to_string(),
                file: file.display().to_string(),
            },
        })
    }

    /// Switch `s` to TLS as the client (after the server acknowledged
    /// NBD_OPT_STARTTLS).
    pub(crate) fn connect(&self, s: &Stream) -> io::Result<Stream> {
        match &self.kind {
            ClientKind::X509 { config, name } => {
                let conn =
                    rustls::ClientConnection::new(config.clone(), name.clone()).map_err(bad)?;
                carry(rustls::Connection::Client(conn), s)
            }
            ClientKind::Psk { ctx, user, file } => carry_openssl(ctx, s, false, &|_, reason| {
                Some(match reason {
                    ALERT_ILLEGAL_PARAMETER | ALERT_DECRYPT_ERROR | ALERT_BAD_RECORD_MAC => format!(
                        "the server refused the key of identity '{user}': the key for '{user}' in {file} is not the server's"
                    ),
                    ALERT_HANDSHAKE_FAILURE | ALERT_UNKNOWN_PSK_IDENTITY => format!(
                        "the server has no key for identity '{user}' (or takes no pre-shared keys)"
                    ),
                    _ => return None,
                })
            }),
        }
    }
}

fn lock(c: &Mutex<rustls::Connection>) -> std::sync::MutexGuard<'_, rustls::Connection> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The TLS handshake on `net`, then two threads that carry the
/// connection between `net` and a local socket pair; returns the pair's
/// plain end. Each thread ends when its side does, and closes its
/// direction on the other.
fn carry(mut conn: rustls::Connection, net: &Stream) -> io::Result<Stream> {
    let mut io = net.try_clone()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut io)
            .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
    }
    // The read limit that bounded the handshake (on the socket, shared by
    // every clone) would end the connection once it had been idle that
    // long: the reading thread below waits for records as long as the
    // link lasts. A lost link ends it when the plain side gives up (its
    // own timeouts) and the other thread shuts the socket.
    io.set_read_timeout(None)?;
    let (mine, theirs) = UnixStream::pair()?;
    let conn = Arc::new(Mutex::new(conn));
    // Held while records are sealed and sent: they leave in order.
    let sending = Arc::new(Mutex::new(()));
    // Seal what the connection wants to send and send it, in order.
    let flush = {
        let (conn, sending) = (conn.clone(), sending.clone());
        move |net: &mut Stream, plain: &[u8]| -> io::Result<()> {
            let _order = sending.lock().unwrap_or_else(|e| e.into_inner());
            let mut sealed = Vec::with_capacity(plain.len() + 64);
            {
                let mut c = lock(&conn);
                if !plain.is_empty() {
                    c.writer().write_all(plain)?;
                }
                while c.wants_write() {
                    c.write_tls(&mut sealed)?;
                }
            }
            net.write_all(&sealed)
        }
    };
    // Network to plain side.
    {
        let (conn, flush) = (conn.clone(), flush.clone());
        let (mut net, mut out) = (net.try_clone()?, mine.try_clone()?);
        std::thread::Builder::new()
            .name("tls-in".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut plain = vec![0u8; 64 << 10];
                let r = (|| -> io::Result<()> {
                    // The handshake may have taken in the first records of
                    // data already: they are handed on before any wait.
                    let mut n = 0;
                    loop {
                        let mut got = Vec::new();
                        let (answer, closed) = {
                            let mut c = lock(&conn);
                            let mut rd = &buf[..n];
                            let mut closed = false;
                            // Taken in piece by piece, the plaintext drained
                            // as it comes: rustls holds only so much.
                            loop {
                                loop {
                                    match c.reader().read(&mut plain) {
                                        Ok(0) => {
                                            closed = true;
                                            break;
                                        }
                                        Ok(k) => got.extend_from_slice(&plain[..k]),
                                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                                        Err(e) => return Err(e),
                                    }
                                }
                                if rd.is_empty() || closed {
                                    break;
                                }
                                c.read_tls(&mut rd)?;
                                c.process_new_packets().map_err(bad)?;
                            }
                            (c.wants_write(), closed)
                        };
                        if answer {
                            flush(&mut net, &[])?;
                        }
                        out.write_all(&got)?;
                        if closed {
                            return Ok(());
                        }
                        n = net.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                    }
                })();
                if let Err(e) = r {
                    tracing::debug!("TLS connection ended: {e}");
                    net.shutdown(Shutdown::Both);
                }
                // The plain side reads to its end, and may still reply.
                let _ = out.shutdown(Shutdown::Write);
            })?;
    }
    // Plain side to network.
    {
        let (mut net, mut inp) = (net.try_clone()?, mine);
        std::thread::Builder::new()
            .name("tls-out".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let r = (|| -> io::Result<()> {
                    loop {
                        let n = inp.read(&mut buf)?;
                        if n == 0 {
                            lock(&conn).send_close_notify();
                            return flush(&mut net, &[]);
                        }
                        flush(&mut net, &buf[..n])?;
                    }
                })();
                if let Err(e) = r {
                    tracing::debug!("TLS connection ended: {e}");
                }
                net.shutdown(Shutdown::Both);
                let _ = inp.shutdown(Shutdown::Both);
            })?;
    }
    Ok(Stream::Unix(theirs))
}

/// The peers a server lets in: addresses and networks (CIDR). Empty:
/// everyone.
#[derive(Debug, Clone, Default)]
pub struct Allow(Vec<ipnet::IpNet>);

impl Allow {
    /// `ADDR[/PREFIX],...`
    pub fn parse(list: &str) -> Result<Allow, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let net = match item.parse::<ipnet::IpNet>() {
                Ok(n) => n,
                Err(_) => match item.parse::<IpAddr>() {
                    Ok(a) => ipnet::IpNet::from(a),
                    Err(_) => {
                        return Err(format!(
                            "--allow: '{item}' is neither an address nor a network (ADDR/PREFIX)"
                        ))
                    }
                },
            };
            nets.push(net);
        }
        if nets.is_empty() {
            return Err("--allow: no address or network given".into());
        }
        Ok(Allow(nets))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `peer` may connect. An IPv4 peer on an IPv6 socket
    /// (::ffff:a.b.c.d) counts as its IPv4 address.
    pub fn admits(&self, peer: IpAddr) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|n| n.contains(&peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists() {
        let a = Allow::parse("10.1.0.0/16, 192.168.5.7,fd00::/8").unwrap();
        assert!(a.admits("10.1.200.3".parse().unwrap()));
        assert!(a.admits("::ffff:10.1.0.1".parse().unwrap()));
        assert!(a.admits("192.168.5.7".parse().unwrap()));
        assert!(a.admits("fd12::1".parse().unwrap()));
        assert!(!a.admits("10.2.0.1".parse().unwrap()));
        assert!(!a.admits("192.168.5.8".parse().unwrap()));
        assert!(Allow::parse("10.0.0.0/33").is_err());
        assert!(Allow::parse("example.org").is_err());
        assert!(Allow::parse(" , ").is_err());
        assert!(Allow::default().admits("8.8.8.8".parse().unwrap()));
    }
}
