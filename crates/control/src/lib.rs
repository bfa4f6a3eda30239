//! The control socket: a Unix socket speaking JSON lines, through which
//! `raidkit status`, `fail`, `remove`, `add`, `replace`, `wait` and `speed`
//! talk to a running server.
//!
//! # Protocol
//!
//! Each request is one JSON object on one line, with a `cmd` field and the
//! command's arguments; each response is one JSON object on one line, with
//! `ok` (true or false) and either the command's result fields or `error`
//! (a message for people). A connection may carry any number of requests.
//!
//! ```text
//! -> {"cmd":"status"}
//! <- {"ok":true,"state":"optimal","members":[...],"io":{...}}
//! -> {"cmd":"frobnicate"}
//! <- {"ok":false,"error":"unknown command 'frobnicate'"}
//! ```

use serde_json::{json, Map, Value};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest request line accepted.
const MAX_LINE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("control socket {0} is in use by a running server")]
    InUse(String),
    #[error("control socket {path}: bad response: {detail}")]
    BadResponse { path: String, detail: String },
    #[error("{0}")]
    Refused(String),
}

/// A command handler: the request object in, result fields or an error message out.
pub type Handler =
    dyn Fn(&str, &Map<String, Value>) -> Result<Map<String, Value>, String> + Send + Sync;

/// A running control socket server; stops (and removes its socket) on drop.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listen on `path`. A stale socket file (nobody answering) is replaced;
    /// a live one is an error.
    pub fn start(path: &Path, handler: Arc<Handler>) -> Result<ControlServer, ControlError> {
        let name = path.display().to_string();
        let io_err = |source| ControlError::Io {
            path: name.clone(),
            source,
        };
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse(name));
            }
            std::fs::remove_file(path).map_err(io_err)?;
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(io_err)?;
            }
        }
        let l = UnixListener::bind(path).map_err(io_err)?;
        l.set_nonblocking(true).map_err(io_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(l, s2, handler))
            .map_err(io_err)?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop serving and remove the socket file.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(l: UnixListener, stop: Arc<AtomicBool>, handler: Arc<Handler>) {
    while !stop.load(Ordering::Acquire) {
        match l.accept() {
            Ok((s, _)) => {
                let h = handler.clone();
                let _ = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        if let Err(e) = connection(s, h) {
                            tracing::debug!("control connection ended: {e}");
                        }
                    });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn connection(s: UnixStream, handler: Arc<Handler>) -> io::Result<()> {
    s.set_nonblocking(false)?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        let n = (&mut r).take(MAX_LINE).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let resp = respond(&line, handler.as_ref());
        let mut out = serde_json::to_vec(&resp).unwrap_or_default();
        out.push(b'\n');
        w.write_all(&out)?;
        if !line.ends_with('\n') {
            return Ok(()); // over-long or truncated line: answered, then closed
        }
    }
}

/// One request line to one response object.
pub fn respond(line: &str, handler: &Handler) -> Value {
    let req: Value = match serde_json::from_str(line.trim()) {
        Ok(v) => v,
        Err(e) => return json!({"ok": false, "error": format!("request is not JSON: {e}")}),
    };
    let Some(obj) = req.as_object() else {
        return json!({"ok": false, "error": "request must be a JSON object"});
    };
    let Some(cmd) = obj.get("cmd").and_then(Value::as_str) else {
        return json!({"ok": false, "error": "request has no \"cmd\" string"});
    };
    match handler(cmd, obj) {
        Ok(mut fields) => {
            fields.insert("ok".into(), json!(true));
            Value::Object(fields)
        }
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// Send one request and wait for its response. An `ok: false` response
/// becomes `ControlError::Refused` with the server's message.
pub fn call(path: &Path, request: &Value, timeout: Duration) -> Result<Value, ControlError> {
    let name = path.display().to_string();
    let io_err = |source| ControlError::Io {
        path: name.clone(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(io_err)?;
    s.set_read_timeout(Some(timeout)).map_err(io_err)?;
    let mut line = serde_json::to_vec(request).expect("JSON value");
    line.push(b'\n');
    s.write_all(&line).map_err(io_err)?;
    let mut resp = String::new();
    BufReader::new(s)
        .take(64 << 20)
        .read_line(&mut resp)
        .map_err(io_err)?;
    let v: Value = serde_json::from_str(resp.trim()).map_err(|e| ControlError::BadResponse {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(v),
        Some(false) => Err(ControlError::Refused(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_string(),
        )),
        None => Err(ControlError::BadResponse {
            path: name,
            detail: "no \"ok\" field".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler() -> Arc<Handler> {
        Arc::new(|cmd: &str, args: &Map<String, Value>| match cmd {
            "echo" => Ok(args.clone()),
            other => Err(format!("unknown command '{other}'")),
        })
    }

    #[test]
    fn requests_responses_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.sock");
        let mut srv = ControlServer::start(&p, handler()).unwrap();
        let v = call(&p, &json!({"cmd": "echo", "x": 3}), Duration::from_secs(5)).unwrap();
        assert_eq!(v["x"], 3);
        let e = call(&p, &json!({"cmd": "nope"}), Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("unknown command 'nope'"));
        // A second server on the same live socket is refused.
        assert!(matches!(
            ControlServer::start(&p, handler()),
            Err(ControlError::InUse(_))
        ));
        // Garbage gets an error response, and the connection stays usable.
        let mut s = UnixStream::connect(&p).unwrap();
        s.write_all(b"not json\n{\"cmd\":\"echo\",\"y\":1}\n")
            .unwrap();
        let mut r = BufReader::new(s);
        let mut a = String::new();
        r.read_line(&mut a).unwrap();
        assert!(a.contains("\"ok\":false"));
        let mut b = String::new();
        r.read_line(&mut b).unwrap();
        assert!(b.contains("\"y\":1"));
        srv.stop();
        assert!(!p.exists());
        // A stale socket file is replaced.
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        drop(_l);
        let _srv = ControlServer::start(&p, handler()).unwrap();
    }
}
