//! Failure domains: what can fail together (a host, a rack, a shelf, a
//! power feed). An array spread over hosts keeps its data when a whole
//! host is lost only if no host holds more of its members than the level
//! can lose; `create` refuses anything else unless forced.

use raidkit_layout::Geometry;
use std::collections::BTreeMap;

/// The domain of members with neither a label nor a host of their own.
pub const LOCAL: &str = "local";

/// A member's failure domain: its label if it has one, else the host of
/// its NBD URI (`nbd://HOST[:PORT]/...`, `nbds://...`), else this host.
pub fn domain_of(label: &str, member: &str) -> String {
    if !label.is_empty() {
        return label.to_string();
    }
    uri_host(member).unwrap_or_else(|| LOCAL.to_string())
}

/// The host part of an NBD URI over TCP.
fn uri_host(member: &str) -> Option<String> {
    let rest = member
        .strip_prefix("nbd://")
        .or_else(|| member.strip_prefix("nbds://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    // A TLS identity (`alice@host`) names who connects, not where: two
    // identities on one host are one domain.
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => hostport.rsplit_once(':').map_or(hostport, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// The domains whose loss the array would not survive, each with the roles
/// it holds. `domains[r]` is role r's domain; None for a role with no
/// member (created missing). Members all in one domain, or an array that
/// survives no loss at all, have nothing to weigh: empty.
pub fn crowded(geom: &Geometry, domains: &[Option<String>]) -> Vec<(String, Vec<usize>)> {
    let mut by: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (r, d) in domains.iter().enumerate() {
        if let Some(d) = d {
            by.entry(d.as_str()).or_default().push(r);
        }
    }
    if by.len() < 2 || !geom.level.has_redundancy() {
        return Vec::new();
    }
    by.into_iter()
        .filter(|(_, roles)| !geom.survives(roles))
        .map(|(d, roles)| (d.to_string(), roles))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_layout::Level;

    fn geom(level: Level, n: usize) -> Geometry {
        Geometry::new(level, level.default_layout(), 65536, vec![1 << 20; n]).unwrap()
    }

    fn some(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn domains_from_labels_and_uris() {
        assert_eq!(domain_of("", "nbd://10.0.0.2:10809/d"), "10.0.0.2");
        assert_eq!(domain_of("", "nbd://store-a/d"), "store-a");
        assert_eq!(domain_of("", "nbds://[fd00::2]:10809/d"), "fd00::2");
        assert_eq!(domain_of("", "nbd+unix:///d?socket=/s"), LOCAL);
        assert_eq!(domain_of("", "/dev/sdb"), LOCAL);
        assert_eq!(domain_of("rack-2", "nbd://10.0.0.2/d"), "rack-2");
        assert_eq!(
            domain_of("", "nbds://alice@10.0.0.2:10809/d?tls-psk-file=k"),
            "10.0.0.2"
        );
        assert_eq!(domain_of("", "nbds://bob@[fd00::2]/d"), "fd00::2");
    }

    #[test]
    fn a_domain_holding_more_than_the_level_can_lose_is_crowded() {
        // RAID-6 over three hosts, two members each: any host may go.
        let six = some(&["a", "a", "b", "b", "c", "c"]);
        assert!(crowded(&geom(Level::Raid6, 6), &six).is_empty());
        // RAID-5 the same way: a host takes two members with it.
        let c = crowded(&geom(Level::Raid5, 6), &six);
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(c[0], ("a".to_string(), vec![0, 1]));
        // RAID-10 n2 places copies on neighbours: a host with roles 0 and
        // 1 holds both copies of a chunk, one with 0 and 2 does not.
        let g = geom(Level::Raid10, 4);
        assert!(!crowded(&g, &some(&["a", "a", "b", "b"])).is_empty());
        assert!(crowded(&g, &some(&["a", "b", "a", "b"])).is_empty());
        // All in one place, or no redundancy at all: nothing to weigh.
        assert!(crowded(&geom(Level::Raid5, 3), &some(&["x", "x", "x"])).is_empty());
        assert!(crowded(&geom(Level::Raid0, 2), &some(&["a", "b"])).is_empty());
        // A missing role belongs nowhere.
        let mut m = some(&["a", "a", "b"]);
        m[1] = None;
        assert!(crowded(&geom(Level::Raid5, 3), &m).is_empty());
    }
}
