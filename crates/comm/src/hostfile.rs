//! Hostfiles: which machines form the cluster, and how to reach them.
//!
//! Two formats are read, told apart by their top-level JSON value:
//!
//! - MLX's (a list): `[{"ssh": "mac1", "ips": ["192.168.1.2", "192.168.2.2"]}, ...]`;
//!   each of `ips` is one cable, the first also the host's address
//! - ours (an object), which also says what each host can hold, for the planner:
//!
//! ```json
//! {"hosts": [{"name": "mac1", "addr": "192.168.1.2", "usable_memory_gb": 48,
//!             "cores": 12, "links": [{"addrs": ["169.254.0.1"]}], "device": "gpu"}]}
//! ```
//!
//! `device` (cpu, gpu or gpu:N) is where that host's rank computes; the
//! launcher passes it as `SHARDLM_DEVICE`, which a `--device` on the
//! command line overrides.
//!
//! `links` are the host's cables, one entry per network path (`addrs[0]` is
//! dialed; further entries are alternatives, e.g. an IPv6 address): connection
//! `k` between two hosts that both list cables runs over cable `k` of each
//! (see `TcpConfig::links`). Hosts are in rank order. Errors name the file and
//! the problem.

use crate::error::{CommError, Result};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// A parsed hostfile, in rank order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hostfile {
    pub hosts: Vec<Host>,
}

/// One machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Name used to reach the host for launching (ssh) and in messages.
    pub name: String,
    /// Address other ranks connect to (IP or host name, optionally with port).
    pub addr: String,
    /// Memory the engine may use on this host, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable_memory_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// Extra network paths (e.g. Thunderbolt cables), each with its addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    /// Where this host's rank computes: "cpu", "gpu" or "gpu:N".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// One network path to a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub addrs: Vec<String>,
}

/// One entry of an MLX hostfile.
#[derive(Deserialize)]
struct MlxHost {
    ssh: String,
    #[serde(default)]
    ips: Vec<String>,
}

impl Hostfile {
    /// Reads and validates a hostfile of either format.
    pub fn load(path: impl AsRef<Path>) -> Result<Hostfile> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| CommError::Hostfile { path: path.display().to_string(), detail: e.to_string() })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses hostfile text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Hostfile> {
        let err = |detail: String| CommError::Hostfile { path: origin.to_string(), detail };
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| err(format!("invalid JSON: {e}")))?;
        let file = match value {
            serde_json::Value::Array(_) => {
                let mlx: Vec<MlxHost> = serde_json::from_value(value)
                    .map_err(|e| err(format!("not an MLX hostfile (a list of {{\"ssh\", \"ips\"}}): {e}")))?;
                Hostfile {
                    hosts: mlx
                        .into_iter()
                        .map(|h| Host {
                            addr: h.ips.first().cloned().unwrap_or_else(|| h.ssh.clone()),
                            links: if h.ips.len() < 2 {
                                Vec::new()
                            } else {
                                h.ips.into_iter().map(|ip| Link { addrs: vec![ip] }).collect()
                            },
                            name: h.ssh,
                            usable_memory_gb: None,
                            cores: None,
                            device: None,
                        })
                        .collect(),
                }
            }
            serde_json::Value::Object(_) => serde_json::from_value(value).map_err(|e| err(e.to_string()))?,
            _ => return Err(err("expected a list (MLX format) or an object with \"hosts\"".into())),
        };
        file.validate().map_err(err)?;
        Ok(file)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.hosts.is_empty() {
            return Err("lists no hosts".into());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            let what = format!("host {i} ({:?})", h.name);
            if h.name.trim().is_empty() {
                return Err(format!("host {i} has an empty name"));
            }
            if h.addr.trim().is_empty() {
                return Err(format!("{what} has an empty address"));
            }
            if let Some(j) = self.hosts[..i].iter().position(|o| o.name == h.name) {
                return Err(format!("{what} has the same name as host {j}"));
            }
            if let Some(m) = h.usable_memory_gb {
                if !(m > 0.0 && m.is_finite()) {
                    return Err(format!("{what} has usable_memory_gb {m}, expected a positive number"));
                }
            }
            if h.cores == Some(0) {
                return Err(format!("{what} has 0 cores"));
            }
            if let Some(d) = &h.device {
                let gpu_n = d.strip_prefix("gpu:").is_some_and(|n| n.parse::<usize>().is_ok());
                if d != "cpu" && d != "gpu" && !gpu_n {
                    return Err(format!("{what} has device {d:?}, expected \"cpu\", \"gpu\" or \"gpu:N\""));
                }
            }
            for (k, link) in h.links.iter().enumerate() {
                if link.addrs.is_empty() || link.addrs.iter().any(|a| a.trim().is_empty()) {
                    return Err(format!("{what}: link {k} has no address or an empty one"));
                }
                if let Some(a) = link.addrs.iter().find(|a| a.contains([',', ';', '|', ' '])) {
                    return Err(format!("{what}: link {k} address {a:?} contains one of `,;| `"));
                }
            }
        }
        Ok(())
    }

    /// Number of hosts (one rank per host).
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether the file lists no host (never true for a validated file).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// `host:port` of every rank for [`crate::TcpConfig::peers`]: each host's
    /// `addr`, with `port` added unless the address already has one.
    pub fn rank_addresses(&self, port: u16) -> Vec<String> {
        self.hosts.iter().map(|h| with_port(&h.addr, port)).collect()
    }

    /// Every host's cables for [`crate::TcpConfig::links`] (a cable's
    /// addresses joined by `|`); empty when no host lists any.
    pub fn cable_addresses(&self) -> Vec<Vec<String>> {
        if self.hosts.iter().all(|h| h.links.is_empty()) {
            return Vec::new();
        }
        self.hosts.iter().map(|h| h.links.iter().map(|l| l.addrs.join("|")).collect()).collect()
    }

    /// Serialises in our format.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("hostfile serialises")
    }
}

fn with_port(addr: &str, port: u16) -> String {
    if addr.parse::<SocketAddr>().is_ok() {
        return addr.to_string();
    }
    if let Ok(IpAddr::V6(ip)) = addr.parse::<IpAddr>() {
        return format!("[{ip}]:{port}");
    }
    match addr.rsplit_once(':') {
        Some((host, p)) if !host.contains(':') && p.parse::<u16>().is_ok() => addr.to_string(),
        _ => format!("{addr}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_added_once() {
        assert_eq!(with_port("10.0.0.1", 5), "10.0.0.1:5");
        assert_eq!(with_port("10.0.0.1:7", 5), "10.0.0.1:7");
        assert_eq!(with_port("mac1", 5), "mac1:5");
        assert_eq!(with_port("mac1:9", 5), "mac1:9");
        assert_eq!(with_port("fe80::1", 5), "[fe80::1]:5");
        assert_eq!(with_port("[fe80::1]:6", 5), "[fe80::1]:6");
    }
}
