//! A QEMU that libvirt runs, reached through libvirt rather than through a
//! QMP socket of its own: libvirtd holds the domain's `monitor.sock` for the
//! domain's whole life, so QMP commands go through libvirt-qemu's monitor
//! passthrough (`virDomainQemuMonitorCommand`, which libvirt records as the
//! domain's `custom-monitor` taint), and QEMU's PID, vCPUs and state come
//! from libvirt and /proc.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::{ErrorDomain, ErrorNumber};

use super::procs::{cmdline, process_uid, processes};

/// libvirt's system-wide QEMU driver, where the host's domains are.
pub const DEFAULT_URI: &str = "qemu:///system";

/// What can go wrong reaching a domain through libvirt, each naming the
/// connection URI or the domain.
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("libvirt at {uri} is not reachable (is libvirtd running?): {msg}")]
    Unreachable { uri: String, msg: String },
    #[error(
        "libvirt at {uri} refused the connection: {msg} (run as root, or as a member of the \
         libvirt group)"
    )]
    Denied { uri: String, msg: String },
    #[error(
        "libvirt at {uri} {what}, not QEMU's: vmtrace attaches to QEMU domains only \
         (qemu:///system, qemu:///session)"
    )]
    NotQemu { uri: String, what: String },
    #[error("libvirt at {uri} has no domain named {name:?}")]
    NoDomain { uri: String, name: String },
    #[error(
        "libvirt domain {name} is not running (its state is {state}): vmtrace attaches to \
         running guests only, and would leave this one running; start or resume it first"
    )]
    NotRunning { name: String, state: String },
    #[error("libvirt domain {name}: cannot find its QEMU process: {why}")]
    NoProcess { name: String, why: String },
    #[error(
        "libvirt domain {name}: QMP {cmd} through libvirt's monitor passthrough failed: {msg}"
    )]
    Passthrough {
        name: String,
        cmd: String,
        msg: String,
    },
    #[error("libvirt domain {name}: QMP {cmd} failed: {class}: {desc}")]
    Command {
        name: String,
        cmd: String,
        class: String,
        desc: String,
    },
    #[error("libvirt domain {name}: unexpected reply to QMP {cmd}: {what}")]
    Reply {
        name: String,
        cmd: String,
        what: String,
    },
    #[error("libvirt domain {name}: {what}: {msg}")]
    Libvirt {
        name: String,
        what: &'static str,
        msg: String,
    },
}

/// Opens a connection to libvirt at `uri`, refused unless it is QEMU's
/// driver. libvirt's default error handler (which prints every error to
/// stderr) is silenced: its errors come back as values.
pub fn connect(uri: &str) -> Result<Connect, LibvirtError> {
    virt::error::clear_error_callback();
    let conn = Connect::open(Some(uri)).map_err(|e| open_error(uri, &e))?;
    let driver = conn.get_type().unwrap_or_default();
    if !driver.eq_ignore_ascii_case("QEMU") {
        return Err(LibvirtError::NotQemu {
            uri: uri.into(),
            what: format!("is its {driver} driver"),
        });
    }
    Ok(conn)
}

/// Why a connection could not be opened: refused (authentication, access
/// control, the socket's permissions), a driver libvirt lacks, or no
/// daemon at all.
fn open_error(uri: &str, e: &virt::error::Error) -> LibvirtError {
    let msg = e.message().to_string();
    let denied = matches!(
        e.code(),
        ErrorNumber::AuthFailed
            | ErrorNumber::AuthUnavailable
            | ErrorNumber::AccessDenied
            | ErrorNumber::OperationDenied
    ) || msg.contains("Permission denied")
        // The daemon's authorization of a non-root client (polkit, over
        // D-Bus) failed: it does not let this user manage domains.
        || matches!(
            e.domain(),
            ErrorDomain::Polkit | ErrorDomain::Auth | ErrorDomain::Dbus
        );
    if denied {
        return LibvirtError::Denied {
            uri: uri.into(),
            msg,
        };
    }
    // A URI of another driver (lxc:///, xen:///) whose driver is absent
    // or inactive here ("no connection driver available", "libxenlight
    // state driver is not active"): not QEMU's either way.
    let driver = scheme(uri);
    if !driver.is_empty() && driver != "qemu" {
        return LibvirtError::NotQemu {
            uri: uri.into(),
            what: format!("names the {driver} driver (not available here: {msg})"),
        };
    }
    LibvirtError::Unreachable {
        uri: uri.into(),
        msg,
    }
}

/// The driver part of a libvirt URI: `qemu` of `qemu+ssh://host/system`
/// (empty for none: libvirt's default).
fn scheme(uri: &str) -> &str {
    let s = uri.split_once(':').map_or("", |(s, _)| s);
    s.split('+').next().unwrap_or(s)
}

/// A domain's state as `virsh domstate` words it.
pub fn state_name(state: virt::sys::virDomainState) -> &'static str {
    match state {
        virt::sys::VIR_DOMAIN_RUNNING => "running",
        virt::sys::VIR_DOMAIN_BLOCKED => "idle",
        virt::sys::VIR_DOMAIN_PAUSED => "paused",
        virt::sys::VIR_DOMAIN_SHUTDOWN => "in shutdown",
        virt::sys::VIR_DOMAIN_SHUTOFF => "shut off",
        virt::sys::VIR_DOMAIN_CRASHED => "crashed",
        virt::sys::VIR_DOMAIN_PMSUSPENDED => "pmsuspended",
        _ => "no state",
    }
}

/// A running QEMU domain, its QMP reached through libvirt.
pub struct LibvirtDomain {
    /// Held for the domain's handle (libvirt frees it with the connection).
    _conn: Connect,
    dom: Domain,
    pub uri: String,
    pub name: String,
    /// QEMU's process, as /proc shows it (`qemu_pid`).
    pub pid: u32,
}

impl LibvirtDomain {
    /// The running domain `name` of the libvirt at `uri`, and its QEMU.
    pub fn open(uri: &str, name: &str) -> Result<LibvirtDomain, LibvirtError> {
        LibvirtDomain::open_in(uri, name, &[virt::sys::VIR_DOMAIN_RUNNING])
    }

    /// The domain `name` while it has a QEMU, running or stopped (paused,
    /// or frozen at a breakpoint): what a repair works on.
    pub fn open_active(uri: &str, name: &str) -> Result<LibvirtDomain, LibvirtError> {
        use virt::sys::{VIR_DOMAIN_BLOCKED, VIR_DOMAIN_PAUSED, VIR_DOMAIN_RUNNING};
        LibvirtDomain::open_in(
            uri,
            name,
            &[VIR_DOMAIN_RUNNING, VIR_DOMAIN_PAUSED, VIR_DOMAIN_BLOCKED],
        )
    }

    /// The domain `name`, refused unless in one of the `states`.
    fn open_in(
        uri: &str,
        name: &str,
        states: &[virt::sys::virDomainState],
    ) -> Result<LibvirtDomain, LibvirtError> {
        let conn = connect(uri)?;
        let dom = Domain::lookup_by_name(&conn, name).map_err(|e| match e.code() {
            ErrorNumber::NoDomain => LibvirtError::NoDomain {
                uri: uri.into(),
                name: name.into(),
            },
            _ => libvirt(name, "looking it up", &e),
        })?;
        let (state, _) = dom
            .get_state()
            .map_err(|e| libvirt(name, "reading its state", &e))?;
        if !states.contains(&state) {
            return Err(LibvirtError::NotRunning {
                name: name.into(),
                state: state_name(state).into(),
            });
        }
        let uuid = dom
            .get_uuid_string()
            .map_err(|e| libvirt(name, "reading its UUID", &e))?;
        let pid = qemu_pid(name, &uuid).map_err(|why| LibvirtError::NoProcess {
            name: name.into(),
            why,
        })?;
        Ok(LibvirtDomain {
            _conn: conn,
            dom,
            uri: uri.into(),
            name: name.into(),
            pid,
        })
    }

    /// One QMP command through libvirt's passthrough, its `return` value.
    /// libvirt sends it on the domain's monitor and waits for the reply
    /// (its own monitor timeout); QEMU's asynchronous events stay
    /// libvirt's.
    pub fn execute(&self, cmd: &str, args: Option<Value>) -> Result<Value, LibvirtError> {
        let mut msg = json!({ "execute": cmd });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let flags = virt::sys::VIR_DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT;
        let text = self
            .dom
            .qemu_monitor_command(&msg.to_string(), flags)
            .map_err(|e| LibvirtError::Passthrough {
                name: self.name.clone(),
                cmd: cmd.into(),
                msg: e.message().to_string(),
            })?;
        let reply = |what: &str| LibvirtError::Reply {
            name: self.name.clone(),
            cmd: cmd.into(),
            what: what.chars().take(60).collect(),
        };
        let v: Value = serde_json::from_str(&text).map_err(|_| reply(&text))?;
        if let Some(r) = v.get("return") {
            return Ok(r.clone());
        }
        match v.get("error") {
            Some(e) => Err(LibvirtError::Command {
                name: self.name.clone(),
                cmd: cmd.into(),
                class: e["class"].as_str().unwrap_or("?").into(),
                desc: e["desc"].as_str().unwrap_or("?").into(),
            }),
            None => Err(reply(&text)),
        }
    }

    /// The domain's state now, as libvirt has it.
    pub fn state(&self) -> Result<&'static str, LibvirtError> {
        let (s, _) = self
            .dom
            .get_state()
            .map_err(|e| libvirt(&self.name, "reading its state", &e))?;
        Ok(state_name(s))
    }

    /// The domain's vCPUs, as libvirt counts them.
    pub fn vcpus(&self) -> Result<u32, LibvirtError> {
        let info = self
            .dom
            .get_info()
            .map_err(|e| libvirt(&self.name, "reading its info", &e))?;
        Ok(info.nr_virt_cpu)
    }

    /// The user QEMU runs as (libvirt's `user` in qemu.conf), from /proc.
    pub fn uid(&self) -> Result<u32, LibvirtError> {
        process_uid(self.pid).ok_or_else(|| LibvirtError::NoProcess {
            name: self.name.clone(),
            why: format!("/proc/{} has no Uid line (the process is gone?)", self.pid),
        })
    }

    /// libvirt's id of the running domain.
    pub fn id(&self) -> Option<u32> {
        self.dom.get_id()
    }
}

fn libvirt(name: &str, what: &'static str, e: &virt::error::Error) -> LibvirtError {
    LibvirtError::Libvirt {
        name: name.into(),
        what,
        msg: e.message().to_string(),
    }
}

/// The QEMU process of the domain with `uuid`: the one libvirt's pid file
/// names (`/run/libvirt/qemu/NAME.pid`), checked against its command line
/// (`-uuid UUID`), else the one /proc shows with that `-uuid`.
fn qemu_pid(name: &str, uuid: &str) -> Result<u32, String> {
    let pid_file = Path::new("/run/libvirt/qemu").join(format!("{name}.pid"));
    if let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    {
        if cmdline(pid).is_some_and(|a| has_uuid(&a, uuid)) {
            return Ok(pid);
        }
    }
    let found: Vec<u32> = processes()
        .filter(|&p| cmdline(p).is_some_and(|a| has_uuid(&a, uuid)))
        .collect();
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => Err(format!(
            "no process runs with -uuid {uuid} ({} names none)",
            pid_file.display()
        )),
        many => Err(format!("several processes run with -uuid {uuid}: {many:?}")),
    }
}

fn has_uuid(args: &[String], uuid: &str) -> bool {
    args.windows(2)
        .any(|w| w[0] == "-uuid" && w[1].eq_ignore_ascii_case(uuid))
}

/// The domain whose libvirt monitor socket `path` is, if it is one:
/// libvirt keeps each running domain's QMP socket as `monitor.sock` in
/// the domain's directory, `domain-ID-NAME` (NAME shortened to 20
/// characters), and holds it for the domain's whole life.
pub fn monitor_owner(path: &Path) -> Option<String> {
    if path.file_name()? != "monitor.sock" {
        return None;
    }
    let dir = path.parent()?.file_name()?.to_str()?;
    let (id, name) = dir.strip_prefix("domain-")?.split_once('-')?;
    (id.parse::<u32>().is_ok() && !name.is_empty()).then(|| name.to_string())
}

/// A domain as `vmtrace vms` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSummary {
    pub name: String,
    /// As `virsh domstate` words it.
    pub state: &'static str,
    pub vcpus: u32,
    pub memory_kib: u64,
    /// The kernel it boots directly (its XML's `<os><kernel>`), if any.
    pub kernel: Option<PathBuf>,
    pub uuid: String,
}

/// Every domain (running or not) of the libvirt at `uri`, by name.
pub fn domains(uri: &str) -> Result<Vec<DomainSummary>, LibvirtError> {
    let conn = connect(uri)?;
    let all = conn
        .list_all_domains(0)
        .map_err(|e| LibvirtError::Unreachable {
            uri: uri.into(),
            msg: e.message().to_string(),
        })?;
    let mut out = Vec::with_capacity(all.len());
    for dom in all {
        // A domain undefined meanwhile is left out.
        let (Ok(name), Ok(info), Ok(uuid)) =
            (dom.get_name(), dom.get_info(), dom.get_uuid_string())
        else {
            continue;
        };
        let xml = dom.get_xml_desc(0).unwrap_or_default();
        out.push(DomainSummary {
            name,
            state: state_name(info.state),
            vcpus: info.nr_virt_cpu,
            memory_kib: info.memory,
            kernel: element_text(&xml, "kernel").map(PathBuf::from),
            uuid,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The text of the first `<tag>...</tag>` of a libvirt XML document (its
/// `<kernel>` holds a path and nothing else; libvirt escapes `&` and `<`).
fn element_text(xml: &str, tag: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    let raw = xml[start..end].trim();
    let text = raw
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&apos;", "'")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domains_kernel_from_its_xml() {
        let xml = "<domain type='qemu'><os><type>hvm</type>\
                   <kernel>/var/lib/a&amp;b/bzImage</kernel><initrd>/x</initrd></os></domain>";
        assert_eq!(
            element_text(xml, "kernel").as_deref(),
            Some("/var/lib/a&b/bzImage")
        );
        assert_eq!(element_text("<domain><os/></domain>", "kernel"), None);
    }

    #[test]
    fn libvirts_monitor_sockets_name_their_domain() {
        let owner = |p: &str| monitor_owner(Path::new(p));
        assert_eq!(
            owner("/var/lib/libvirt/qemu/domain-3-web-1/monitor.sock").as_deref(),
            Some("web-1")
        );
        assert_eq!(
            owner("/var/lib/libvirt/qemu/domain-3-web-1/other.sock"),
            None
        );
        assert_eq!(owner("/tmp/vm/monitor.sock"), None);
        assert_eq!(owner("/tmp/domain-x-y/monitor.sock"), None);
    }
}
