//! What `vmtrace vms` lists: libvirt's domains, and the QEMU processes
//! whose command line gives them a QMP socket, each with the `vmtrace
//! attach` that traces it. A domain's own QEMU is listed once, as the
//! domain (its monitor is libvirtd's).

use std::path::PathBuf;

use tracer::qemu::libvirt::{self, DomainSummary};
use tracer::qemu::procs::{self, HostQemu};

/// What `vmtrace vms` found.
pub struct Vms {
    /// The libvirt asked.
    pub uri: String,
    /// Its domains, or why it could not be asked (one line).
    pub domains: Result<Vec<Domain>, String>,
    /// QEMUs with a QMP socket that are no domain of that libvirt.
    pub qemus: Vec<PlainQemu>,
}

/// A libvirt domain.
pub struct Domain {
    pub summary: DomainSummary,
    /// Its QEMU's pid, when it runs (matched by `-uuid`).
    pub pid: Option<u32>,
    pub attach: String,
}

/// A QEMU with a QMP socket on its command line.
pub struct PlainQemu {
    pub pid: u32,
    pub qmp: PathBuf,
    pub accel: String,
    pub name: Option<String>,
    pub attach: String,
}

/// The attach command's tail: what every attach needs besides its VM.
fn attach_tail(kernel: Option<&std::path::Path>) -> String {
    let kernel = kernel.map_or_else(
        || "KERNEL".to_string(),
        |k| shell_word(&k.to_string_lossy()),
    );
    format!("--kernel {kernel} --trace 'FUNCS'")
}

/// `word` quoted for a shell when it needs to be.
fn shell_word(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@,".contains(c));
    if plain && !word.is_empty() {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

impl Vms {
    /// Look at libvirt (`uri`) and at /proc.
    pub fn gather(uri: &str) -> Vms {
        let qemus = procs::qemu_processes();
        let domains = libvirt::domains(uri).map_err(|e| e.to_string());
        let connect = match uri {
            libvirt::DEFAULT_URI => String::new(),
            other => format!(" --connect {}", shell_word(other)),
        };
        let domains = domains.map(|list| {
            list.into_iter()
                .map(|d| {
                    let pid = qemus
                        .iter()
                        .find(|q| {
                            q.uuid
                                .as_deref()
                                .is_some_and(|u| u.eq_ignore_ascii_case(&d.uuid))
                        })
                        .map(|q| q.pid);
                    let attach = format!(
                        "vmtrace attach --domain {}{connect} {}",
                        shell_word(&d.name),
                        attach_tail(d.kernel.as_deref())
                    );
                    Domain {
                        summary: d,
                        pid,
                        attach,
                    }
                })
                .collect::<Vec<_>>()
        });
        let taken: Vec<u32> = match &domains {
            Ok(list) => list.iter().filter_map(|d| d.pid).collect(),
            Err(_) => Vec::new(),
        };
        let qemus = qemus
            .into_iter()
            .filter(|q| !taken.contains(&q.pid))
            .flat_map(plain)
            .collect();
        Vms {
            uri: uri.to_string(),
            domains,
            qemus,
        }
    }
}

/// One entry per QMP socket of a QEMU's.
fn plain(q: HostQemu) -> Vec<PlainQemu> {
    q.qmp
        .iter()
        .map(|path| PlainQemu {
            pid: q.pid,
            qmp: path.clone(),
            accel: q.accel.clone(),
            name: q.name.clone(),
            attach: format!(
                "vmtrace attach --qmp {} {}",
                shell_word(&path.to_string_lossy()),
                attach_tail(None)
            ),
        })
        .collect()
}
