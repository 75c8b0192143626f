//! A libvirt domain's QEMU monitor as a session's [`Transport`]: each QMP
//! command goes through libvirt's monitor passthrough (libvirtd holds the
//! domain's QMP socket; `super::libvirt`), so there is no connection of
//! vmtrace's to QEMU to hold or let go between bursts. QEMU's events stay
//! libvirtd's: the session does without them (`super::monitor`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::libvirt::{LibvirtDomain, LibvirtError};
use super::monitor::{process_start, Monitor, QemuIdentity, Transport};
use super::qmp::{QemuVersion, QmpError, QmpEvents};

/// The monitor of the running domain `domain` (its QEMU found, its
/// version asked once).
pub fn monitor(domain: LibvirtDomain) -> Result<Monitor, LibvirtError> {
    Ok(Monitor::new(Box::new(DomainMonitor::new(domain)?)))
}

/// What a domain's monitor names it by in errors (its `place`).
const PLACE_PREFIX: &str = "libvirt domain ";

/// The domain a monitor's place names, if it is a domain's.
pub fn domain_of(place: &Path) -> Option<&str> {
    place.to_str()?.strip_prefix(PLACE_PREFIX)
}

/// A domain's QMP, through libvirt.
pub struct DomainMonitor {
    domain: LibvirtDomain,
    /// Names the domain in errors: "libvirt domain NAME".
    place: PathBuf,
    identity: QemuIdentity,
}

impl DomainMonitor {
    pub fn new(domain: LibvirtDomain) -> Result<DomainMonitor, LibvirtError> {
        let no_process = |why: String| LibvirtError::NoProcess {
            name: domain.name.clone(),
            why,
        };
        let pid = domain.pid;
        let started = process_start(pid)
            .ok_or_else(|| no_process(format!("process {pid} has no /proc entry")))?;
        let v = domain.execute("query-version", None)?;
        let num = |k: &str| v["qemu"][k].as_u64().unwrap_or(0) as u32;
        let identity = QemuIdentity {
            pid,
            uid: domain.uid()?,
            started,
            version: QemuVersion {
                major: num("major"),
                minor: num("minor"),
                micro: num("micro"),
                package: v["package"].as_str().unwrap_or("").trim().to_string(),
            },
        };
        Ok(DomainMonitor {
            place: PathBuf::from(format!("{PLACE_PREFIX}{}", domain.name)),
            domain,
            identity,
        })
    }

    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.domain.name
    }
}

impl Transport for DomainMonitor {
    /// One command through libvirt, while the domain's QEMU is still the one
    /// found (libvirt would send it to a restarted domain's new QEMU).
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        if !self.identity.same_process(self.domain.pid) {
            return Err(QmpError::Closed {
                path: self.place.clone(),
            });
        }
        self.domain.execute(cmd, args).map_err(|e| match e {
            LibvirtError::Command {
                cmd, class, desc, ..
            } => QmpError::Command {
                path: self.place.clone(),
                cmd,
                class,
                desc,
            },
            // The domain stopped or went (libvirt: "domain is not
            // running", no such domain): its monitor is gone.
            _ if !matches!(self.domain.state(), Ok("running" | "paused" | "idle")) => {
                QmpError::Closed {
                    path: self.place.clone(),
                }
            }
            e => QmpError::Libvirt(Box::new(e)),
        })
    }

    fn end_burst(&mut self) {}

    fn take_events(&mut self) -> QmpEvents {
        QmpEvents::default()
    }

    fn identity(&self) -> &QemuIdentity {
        &self.identity
    }

    fn place(&self) -> &Path {
        &self.place
    }
}
