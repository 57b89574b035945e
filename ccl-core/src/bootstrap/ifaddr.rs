//! Network interface selection with NCCL's rules (`NCCL_SOCKET_IFNAME`,
//! `NCCL_SOCKET_FAMILY`). The selection is pure ([`pick_interface`]); only
//! [`list_interfaces`] touches the OS (`getifaddrs`, the one `unsafe` block of the bootstrap).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{CclError, Result};

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// One of its addresses.
    pub addr: IpAddr,
}

/// A parsed `NCCL_SOCKET_IFNAME`: comma-separated name prefixes; a leading `^` excludes
/// the listed interfaces, a following `=` makes the names exact instead of prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfnameFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfnameFilter {
    /// Parses the raw value; an empty list (e.g. `^` alone) is an error naming `var`.
    pub fn parse(var: &str, raw: &str) -> Result<IfnameFilter> {
        let mut s = raw.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names: Vec<String> = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(CclError::arg(format!(
                "{var}={raw:?} names no interface (expected e.g. eth0, ^docker,lo or =eth0)"
            )));
        }
        Ok(IfnameFilter {
            exclude,
            exact,
            names,
        })
    }

    /// True when interface `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

fn usable(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => !v.is_unspecified() && !v.is_multicast(),
        // Link-local IPv6 needs a scope id on every peer; NCCL-like, skip it.
        IpAddr::V6(v) => {
            !v.is_unspecified() && !v.is_multicast() && (v.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// Chooses the interface address to advertise. `ifname` / `family` are the raw values of
/// `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY` (`AF_INET` or `AF_INET6`). Without `ifname`
/// NCCL's default order applies: `ib*`, then anything but `docker*`/`lo*`, then
/// `docker*`, then `lo*`. Per interface an IPv4 address is preferred. `Ok(None)` when
/// nothing qualifies (and `ifname` was not given).
pub fn pick_interface(
    ifaces: &[Interface],
    ifname: Option<&str>,
    family: Option<&str>,
) -> Result<Option<Interface>> {
    let want_v6 = match family.map(str::trim) {
        None => None,
        Some("AF_INET") => Some(false),
        Some("AF_INET6") => Some(true),
        Some(other) => {
            return Err(CclError::arg(format!(
                "NCCL_SOCKET_FAMILY={other:?} must be AF_INET or AF_INET6"
            )))
        }
    };
    let cands: Vec<&Interface> = ifaces
        .iter()
        .filter(|i| usable(&i.addr))
        .filter(|i| want_v6.is_none_or(|v6| i.addr.is_ipv6() == v6))
        .collect();
    // The first matching interface in list order, with its IPv4 address if it has one.
    let first = |f: &IfnameFilter| -> Option<Interface> {
        let matching: Vec<&Interface> = cands
            .iter()
            .copied()
            .filter(|i| f.matches(&i.name))
            .collect();
        let name = &matching.first()?.name;
        matching
            .iter()
            .find(|i| &i.name == name && i.addr.is_ipv4())
            .or_else(|| matching.first())
            .map(|i| (*i).clone())
    };
    if let Some(raw) = ifname {
        let f = IfnameFilter::parse("NCCL_SOCKET_IFNAME", raw)?;
        return match first(&f) {
            Some(i) => Ok(Some(i)),
            None => {
                let mut have: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
                have.dedup();
                Err(CclError::arg(format!(
                    "NCCL_SOCKET_IFNAME={raw:?} matches no interface with a usable address (interfaces: {})",
                    have.join(", ")
                )))
            }
        };
    }
    for spec in ["ib", "^docker,lo", "docker", "lo"] {
        let f = IfnameFilter::parse("default", spec)?;
        if let Some(i) = first(&f) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The addresses of this host's interfaces that are up (`getifaddrs`).
pub fn list_interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success getifaddrs stores a list that stays
    // valid until the matching freeifaddrs below.
    let rc = unsafe { libc::getifaddrs(&mut head) };
    if rc != 0 {
        return Err(CclError::sys("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list from getifaddrs, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        if ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points to a sockaddr, whose first field is the
        // family; read_unaligned copes with any alignment.
        let family = unsafe { std::ptr::read_unaligned(ifa.ifa_addr) }.sa_family;
        let addr = match i32::from(family) {
            libc::AF_INET => {
                // SAFETY: family AF_INET means the storage holds a full sockaddr_in.
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means the storage holds a full sockaddr_in6.
                let sin6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out.push(Interface { name, addr });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(name: &str, a: &str) -> Interface {
        Interface {
            name: name.into(),
            addr: a.parse().unwrap(),
        }
    }

    fn host() -> Vec<Interface> {
        vec![
            i("lo", "127.0.0.1"),
            i("docker0", "172.17.0.1"),
            i("eth0", "fe80::1"),
            i("eth0", "fd00::2"),
            i("eth0", "192.0.2.2"),
            i("eth1", "10.0.0.5"),
            i("lo", "::1"),
        ]
    }

    fn pick(ifs: &[Interface], n: Option<&str>, f: Option<&str>) -> Option<Interface> {
        pick_interface(ifs, n, f).unwrap()
    }

    #[test]
    fn filter_parsing_and_matching() {
        let f = IfnameFilter::parse("V", "eth,ib").unwrap();
        assert!(f.matches("eth0") && f.matches("ib1") && !f.matches("lo"));
        let f = IfnameFilter::parse("V", "^docker,lo").unwrap();
        assert!(f.matches("eth0") && !f.matches("docker0") && !f.matches("lo"));
        let f = IfnameFilter::parse("V", "=eth0").unwrap();
        assert!(f.matches("eth0") && !f.matches("eth01"));
        let f = IfnameFilter::parse("V", "^=eth0").unwrap();
        assert!(!f.matches("eth0") && f.matches("eth01"));
        for bad in ["^", "=", "^=", " , "] {
            let e = IfnameFilter::parse("NCCL_SOCKET_IFNAME", bad).unwrap_err();
            assert!(e.to_string().contains("NCCL_SOCKET_IFNAME"), "{e}");
        }
    }

    #[test]
    fn default_order_prefers_real_interfaces_and_ipv4() {
        assert_eq!(pick(&host(), None, None), Some(i("eth0", "192.0.2.2")));
        let mut ib = host();
        ib.push(i("ib0", "10.9.9.9"));
        assert_eq!(pick(&ib, None, None), Some(i("ib0", "10.9.9.9")));
        let only = vec![i("lo", "127.0.0.1"), i("docker0", "172.17.0.1")];
        assert_eq!(pick(&only, None, None), Some(i("docker0", "172.17.0.1")));
        assert_eq!(pick(&only[..1], None, None), Some(i("lo", "127.0.0.1")));
        assert_eq!(pick(&[], None, None), None);
        // Link-local IPv6 alone is not usable.
        assert_eq!(pick(&[i("eth0", "fe80::1")], None, None), None);
    }

    #[test]
    fn user_filter_and_family() {
        assert_eq!(
            pick(&host(), Some("eth1"), None),
            Some(i("eth1", "10.0.0.5"))
        );
        assert_eq!(pick(&host(), Some("=lo"), None), Some(i("lo", "127.0.0.1")));
        assert_eq!(
            pick(&host(), Some("^eth0"), None),
            Some(i("lo", "127.0.0.1"))
        );
        assert_eq!(
            pick(&host(), Some("eth0"), Some("AF_INET6")),
            Some(i("eth0", "fd00::2"))
        );
        assert_eq!(
            pick(&host(), None, Some("AF_INET6")),
            Some(i("eth0", "fd00::2"))
        );
        assert_eq!(
            pick(&host(), Some("lo"), Some("AF_INET6")),
            Some(i("lo", "::1"))
        );
        let e = pick_interface(&host(), Some("wlan"), None).unwrap_err();
        assert!(
            e.to_string().contains("NCCL_SOCKET_IFNAME") && e.to_string().contains("eth0"),
            "{e}"
        );
        let e = pick_interface(&host(), None, Some("inet")).unwrap_err();
        assert!(e.to_string().contains("NCCL_SOCKET_FAMILY"), "{e}");
    }

    #[test]
    fn lists_loopback_on_this_host() {
        let l = list_interfaces().unwrap();
        assert!(
            l.iter().any(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{l:?}"
        );
    }
}
