//! What a status report says of each member.

use super::{Core, ErrorCounts};
use crate::assemble::Absence;

/// One member's line in a status report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    /// The member's name (path); None for a role with no member.
    pub path: Option<String>,
    /// The role number; None for a spare.
    pub role: Option<usize>,
    /// active, rebuilding, faulty, disconnected (a remote member whose
    /// link is down, which may rejoin; with no role, one not reached since
    /// the start), spare or missing.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its failure domain (see `domains`): its label, the host of its
    /// URI, or `local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Read, write and checksum errors seen on it (members that are open).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<ErrorCounts>,
    /// Set while the member is much slower than its peers (SlowMember).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<Slow>,
    /// Bytes and operations read and written, time spent (open members).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<super::io::MemberIo>,
    /// Whether its device spins, as the kernel says (open members whose
    /// device says): mirrored levels then read as md does on disks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
}

/// How slow a slow member is: its mean time per operation over the last
/// few seconds, and the median of its peers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Slow {
    pub latency_us: u64,
    pub peers_us: u64,
}

/// A member's failure domain.
fn domain(d: &super::Disk) -> Option<String> {
    use raidkit_member::Locked;
    Some(crate::domains::domain_of(&d.sb.locked().domain, d.name()))
}

/// A failed member's state: disconnected while it may still come back.
fn failed_state(d: &super::Disk) -> &'static str {
    use raidkit_member::Locked;
    if d.away.locked().is_some() {
        "disconnected"
    } else {
        "faulty"
    }
}

impl Core {
    /// Every role's member and state, then replacements, spares and failed members.
    pub fn members_status(&self) -> Vec<MemberStatus> {
        let v = self.view.load();
        let mut out = Vec::new();
        for (role, rv) in v.roles.iter().enumerate() {
            out.push(match (&rv.disk, &rv.absence) {
                (Some(d), _) => MemberStatus {
                    path: Some(d.name().to_string()),
                    role: Some(role),
                    state: if rv.sync.is_some() {
                        "rebuilding"
                    } else {
                        "active"
                    },
                    reason: None,
                    domain: domain(d),
                    errors: Some(d.errors()),
                    slow: d.slow(),
                    io: Some(d.io.report()),
                    rotational: d.rotational,
                },
                (None, absence) => {
                    // A failed member still open speaks for its role: the
                    // most recent, if the role has failed more than once.
                    if let Some((d, _, why)) = v.failed.iter().rev().find(|f| f.1 == Some(role)) {
                        MemberStatus {
                            path: Some(d.name().to_string()),
                            role: Some(role),
                            state: failed_state(d),
                            reason: Some(why.clone()),
                            domain: domain(d),
                            errors: Some(d.errors()),
                            slow: d.slow(),
                            io: Some(d.io.report()),
                            rotational: d.rotational,
                        }
                    } else if let Some(Absence::Stale { member, reason }) = absence {
                        MemberStatus {
                            path: Some(member.clone()),
                            role: Some(role),
                            state: "missing",
                            reason: Some(format!("stale: {reason}")),
                            domain: Some(crate::domains::domain_of("", member)),
                            errors: None,
                            slow: None,
                            io: None,
                            rotational: None,
                        }
                    } else {
                        MemberStatus {
                            path: None,
                            role: Some(role),
                            state: "missing",
                            reason: None,
                            domain: None,
                            errors: None,
                            slow: None,
                            io: None,
                            rotational: None,
                        }
                    }
                }
            });
            if let Some((d, _)) = &rv.replacement {
                out.push(MemberStatus {
                    path: Some(d.name().to_string()),
                    role: Some(role),
                    state: "rebuilding",
                    reason: Some(format!(
                        "replacing {}",
                        rv.disk.as_ref().map_or("-", |d| d.name())
                    )),
                    domain: domain(d),
                    errors: Some(d.errors()),
                    slow: d.slow(),
                    io: Some(d.io.report()),
                    rotational: d.rotational,
                });
            }
        }
        out.extend(v.spares.iter().map(|d| MemberStatus {
            path: Some(d.name().to_string()),
            role: None,
            state: "spare",
            reason: None,
            domain: domain(d),
            errors: Some(d.errors()),
            slow: d.slow(),
            io: Some(d.io.report()),
            rotational: d.rotational,
        }));
        for (i, (d, role, why)) in v.failed.iter().enumerate() {
            let speaks_for_role = role.is_some_and(|r| {
                v.roles[r].disk.is_none()
                    && v.failed.iter().rposition(|f| f.1 == Some(r)) == Some(i)
            });
            if speaks_for_role {
                continue; // shown in its role's line
            }
            out.push(MemberStatus {
                path: Some(d.name().to_string()),
                role: None,
                state: failed_state(d),
                reason: Some(why.clone()),
                domain: domain(d),
                errors: Some(d.errors()),
                slow: d.slow(),
                io: Some(d.io.report()),
                rotational: d.rotational,
            });
        }
        // Remote members named at start whose hosts have not answered yet:
        // their roles are not known until their superblocks are read.
        let limit = self.rejoin_timeout();
        for a in raidkit_member::Locked::locked(&self.awaited).members.iter() {
            let (since, last) = a.since();
            let refused = a.refused();
            out.push(MemberStatus {
                path: Some(a.name.clone()),
                role: None,
                state: if refused.is_some() {
                    "faulty"
                } else {
                    "disconnected"
                },
                reason: Some(refused.unwrap_or_else(|| {
                    format!(
                        "not reached since the start {}s ago ({last}); tried again for {}s more",
                        since.elapsed().as_secs(),
                        limit.saturating_sub(since.elapsed()).as_secs()
                    )
                })),
                domain: Some(crate::domains::domain_of("", &a.name)),
                errors: None,
                slow: None,
                io: None,
                rotational: None,
            });
        }
        out
    }
}
