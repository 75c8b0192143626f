//! The VM an attach, a detach or a guardian works on: the QEMU at a QMP
//! socket (`--qmp`), or a libvirt domain's (`--domain`, `--connect`), and
//! how each is reached and named.

use std::ffi::OsString;
use std::path::Path;

use tracer::qemu::burst;
use tracer::qemu::libvirt::{self, LibvirtDomain};
use tracer::qemu::libvirt_monitor;
use tracer::qemu::monitor::Monitor;
use tracer::qemu::session::{QemuError, REPLY_TIMEOUT};

/// A QEMU, as the user named it.
#[derive(Clone, Copy, Debug)]
pub enum VmTarget<'a> {
    Qmp(&'a Path),
    Domain { name: &'a str, uri: &'a str },
}

impl<'a> VmTarget<'a> {
    /// From the arguments (clap requires one of `qmp` and `domain`).
    pub fn of(qmp: Option<&'a Path>, domain: Option<&'a str>, uri: &'a str) -> VmTarget<'a> {
        match (domain, qmp) {
            (Some(name), _) => VmTarget::Domain { name, uri },
            (None, Some(q)) => VmTarget::Qmp(q),
            (None, None) => unreachable!("clap requires --qmp or --domain"),
        }
    }

    /// The arguments that name it again (for `vmtrace detach`, the guardian).
    pub fn args(&self) -> Vec<OsString> {
        match self {
            VmTarget::Qmp(q) => vec!["--qmp".into(), q.as_os_str().to_owned()],
            VmTarget::Domain { name, uri } => {
                let mut a: Vec<OsString> = vec!["--domain".into(), (*name).into()];
                if *uri != libvirt::DEFAULT_URI {
                    a.extend(["--connect".into(), (*uri).into()]);
                }
                a
            }
        }
    }

    /// `vmtrace detach ...` for it.
    pub fn detach_command(&self) -> String {
        let args: Vec<String> = self
            .args()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        format!("vmtrace detach {}", args.join(" "))
    }

    /// Its monitor, for a repair: a domain running or stopped.
    pub fn monitor(&self) -> Result<Monitor, QemuError> {
        match self {
            VmTarget::Qmp(q) => Ok(burst::connect(q, REPLY_TIMEOUT)?),
            VmTarget::Domain { name, uri } => {
                let d = LibvirtDomain::open_active(uri, name)?;
                Ok(libvirt_monitor::monitor(d)?)
            }
        }
    }
}
