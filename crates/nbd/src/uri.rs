//! Where an NBD export is, as a URI names it (the NBD URI scheme, with
//! libnbd's TLS settings in the query): for the client.

use std::io;

/// Where an export is: parsed from `nbd://HOST[:PORT][/EXPORT]`,
/// `nbd+unix:///EXPORT?socket=PATH`, or their TLS forms `nbds://` and
/// `nbds+unix://` (the NBD URI scheme). TLS settings ride in the query,
/// as libnbd's: `tls-certificates=DIR` (DIR/ca-cert.pem to trust, and
/// DIR/client-cert.pem with DIR/client-key.pem to show, if there),
/// `tls-ca=FILE`, and `tls-hostname=NAME` (the name the server's
/// certificate must carry; default the URI's host); or pre-shared keys,
/// `nbds://USER@HOST/EXPORT?tls-psk-file=FILE` (USER's key in FILE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub endpoint: Endpoint,
    pub export: String,
    /// Set for nbds:// and nbds+unix://.
    pub tls: Option<TlsParams>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(String),
    Unix(String),
}

/// TLS settings of a URI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsParams {
    pub ca: Option<String>,
    pub certificates: Option<String>,
    pub hostname: Option<String>,
    pub psk_file: Option<String>,
    /// The identity whose pre-shared key is used (the URI's user).
    pub username: Option<String>,
}

impl TlsParams {
    /// The client's TLS configuration, expecting `host` unless the URI
    /// names another.
    pub(crate) fn client(&self, host: &str) -> io::Result<crate::tls::ClientTls> {
        use std::path::PathBuf;
        if let Some(file) = &self.psk_file {
            let user = self.username.as_deref().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "?tls-psk-file needs the identity as the URI's user: nbds://USER@HOST/EXPORT",
                )
            })?;
            return crate::tls::ClientTls::psk(user, std::path::Path::new(file));
        }
        let dir = self.certificates.as_ref().map(PathBuf::from);
        let ca = match (&self.ca, &dir) {
            (Some(f), _) => PathBuf::from(f),
            (None, Some(d)) => d.join("ca-cert.pem"),
            (None, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "nbds:// needs a certificate authority to trust: ?tls-certificates=DIR (with ca-cert.pem) or ?tls-ca=FILE",
                ))
            }
        };
        let client = dir.and_then(|d| {
            let (c, k) = (d.join("client-cert.pem"), d.join("client-key.pem"));
            (c.exists() && k.exists()).then_some((c, k))
        });
        let name = self.hostname.as_deref().unwrap_or(host);
        crate::tls::ClientTls::x509(
            name,
            &ca,
            client.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
    }
}

impl Address {
    pub fn parse(uri: &str) -> std::result::Result<Address, String> {
        let not_nbd = || format!("{uri}: not an NBD URI (nbd://HOST[:PORT][/EXPORT])");
        let (scheme, rest) = uri.split_once("://").ok_or_else(not_nbd)?;
        let (unix, tls) = match scheme {
            "nbd" => (false, false),
            "nbds" => (false, true),
            "nbd+unix" => (true, false),
            "nbds+unix" => (true, true),
            _ => return Err(not_nbd()),
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let param = |k: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        // USER@ before the host: the pre-shared key's identity.
        let (username, path) = match path.split_once('@') {
            Some((u, rest)) if !u.contains('/') => (Some(u.to_string()), rest),
            _ => (None, path),
        };
        let tls = tls.then(|| TlsParams {
            ca: param("tls-ca"),
            certificates: param("tls-certificates"),
            hostname: param("tls-hostname"),
            psk_file: param("tls-psk-file"),
            username: username.clone(),
        });
        if unix {
            let socket = param("socket").ok_or_else(|| {
                format!(
                    "{uri}: an nbd+unix URI needs ?socket=PATH (nbd+unix:///EXPORT?socket=PATH)"
                )
            })?;
            let export = path.strip_prefix('/').unwrap_or(path).to_string();
            return Ok(Address {
                endpoint: Endpoint::Unix(socket),
                export,
                tls,
            });
        }
        let (hostport, export) = match path.split_once('/') {
            Some((h, e)) => (h, e.to_string()),
            None => (path, String::new()),
        };
        if hostport.is_empty() {
            return Err(format!("{uri}: no host"));
        }
        let hostport = if hostport.starts_with('[') {
            // [v6]:port or [v6]
            if hostport.ends_with(']') {
                format!("{hostport}:10809")
            } else {
                hostport.to_string()
            }
        } else if let Some((_, port)) = hostport.rsplit_once(':') {
            port.parse::<u16>()
                .map_err(|_| format!("{uri}: bad port '{port}'"))?;
            hostport.to_string()
        } else {
            format!("{hostport}:10809")
        };
        Ok(Address {
            endpoint: Endpoint::Tcp(hostport),
            export,
            tls,
        })
    }

    /// The host a TLS server's certificate is checked against.
    pub(crate) fn host(&self) -> &str {
        match &self.endpoint {
            Endpoint::Tcp(hp) => {
                let h = hp.rsplit_once(':').map_or(hp.as_str(), |(h, _)| h);
                h.trim_start_matches('[').trim_end_matches(']')
            }
            Endpoint::Unix(_) => "localhost",
        }
    }
}
