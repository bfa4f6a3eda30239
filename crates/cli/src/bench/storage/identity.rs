//! What was measured, for the permanent record: the disk behind a file or
//! device (model, serial, firmware, write cache, as the system tells them
//! in sysfs and udev's database), and an array's level and state.

use serde_json::{json, Map, Value};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// udev's record of a device (`/run/udev/data/bMAJ:MIN`): its E: lines.
fn udev(major: u32, minor: u32) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(text) = read(Path::new(&format!("/run/udev/data/b{major}:{minor}"))) {
        for l in text.lines() {
            if let Some((k, v)) = l.strip_prefix("E:").and_then(|e| e.split_once('=')) {
                m.insert(k.to_string(), json!(v));
            }
        }
    }
    m
}

/// The disk a block device (major:minor) is or belongs to, as sysfs and
/// udev describe it.
pub(super) fn disk(major: u32, minor: u32) -> Value {
    let Ok(mut dir) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return json!({"device": format!("{major}:{minor}")});
    };
    let partition = dir.join("partition").exists();
    if partition {
        dir.pop();
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dev = dir.join("device");
    let (dmaj, dmin) = read(&dir.join("dev"))
        .and_then(|d| {
            let (a, b) = d.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((major, minor));
    let u = udev(dmaj, dmin);
    let from_udev = |k: &str| u.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let mut o = json!({
        "device": format!("/dev/{name}"),
        "model": read(&dev.join("model")).or_else(|| from_udev("ID_MODEL")),
        "vendor": read(&dev.join("vendor")).or_else(|| from_udev("ID_VENDOR")),
        "serial": read(&dev.join("serial"))
            .or_else(|| from_udev("ID_SERIAL_SHORT"))
            .or_else(|| from_udev("ID_SERIAL")),
        "firmware": read(&dev.join("firmware_rev"))
            .or_else(|| read(&dev.join("rev")))
            .or_else(|| from_udev("ID_REVISION")),
        "write_cache": read(&dir.join("queue/write_cache")),
        "rotational": read(&dir.join("queue/rotational")).map(|r| r == "1"),
        "logical_block_size": read(&dir.join("queue/logical_block_size")).and_then(|v| v.parse::<u64>().ok()),
        "size": read(&dir.join("size")).and_then(|v| v.parse::<u64>().ok()).map(|s| s * 512),
    });
    if partition {
        o["partition"] = json!(true);
    }
    if let Some(b) = read(&dir.join("loop/backing_file")) {
        o["loop"] = json!({
            "backing_file": b,
            "direct_io": read(&dir.join("loop/dio")).map(|d| d == "1"),
        });
    }
    o
}

/// The file system a path is on (the longest mount point above it).
fn file_system(path: &Path) -> Option<Value> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = read(Path::new("/proc/self/mounts"))?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() >= 3).then(|| (f[0], PathBuf::from(f[1].replace("\\040", " ")), f[2]))
        })
        .filter(|(_, m, _)| path.starts_with(m))
        .max_by_key(|(_, m, _)| m.as_os_str().len())
        .map(|(src, m, t)| json!({"source": src, "mount": m, "type": t}))
}

/// A file, directory or block device: the device and the disk under it.
pub(super) fn path(p: &Path) -> Value {
    let Ok(m) = std::fs::metadata(p) else {
        return json!({"path": p});
    };
    if m.file_type().is_block_device() {
        let rdev = m.rdev();
        let mut o = disk(libc::major(rdev), libc::minor(rdev));
        o["path"] = json!(p);
        return o;
    }
    let dev = m.dev();
    json!({
        "path": p,
        "file_system": file_system(p),
        "disk": disk(libc::major(dev), libc::minor(dev)),
    })
}

/// An array's level and state from its status (the server's `status`
/// response or the same fields of an array opened here).
pub(super) fn array_state(status: &Value) -> Value {
    json!({
        "level": status["array"]["level"],
        "name": status["array"]["name"],
        "chunk": status["array"]["chunk"],
        "members": status["members"].as_array().map(|m| m.len()),
        "consistency_policy": status["array"]["consistency_policy"],
        "state": status["state"],
        // A member being rebuilt is not yet redundancy: rebuilding counts.
        "degraded": matches!(status["state"].as_str(), Some("degraded" | "rebuilding" | "failed")),
        "rebuilding": status["recovery"].is_object(),
        "recovery": status["recovery"]["kind"],
    })
}

/// An array opened here, described as a server's `status` describes it.
pub(super) fn array_status(arr: &raidkit_array::Array) -> Value {
    let sb = arr.superblock();
    json!({
        "state": arr.state_name(),
        "array": {
            "name": sb.name,
            "level": sb.level.to_string(),
            "chunk": sb.chunk,
            "consistency_policy": raidkit_array::create::Policy::of(&sb).name(),
        },
        "members": arr.members_status(),
        "recovery": arr.recovery_status(),
    })
}
