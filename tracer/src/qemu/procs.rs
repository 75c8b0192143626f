//! The host's QEMU processes as /proc shows them: their arguments, their
//! user, and the QMP sockets and accelerator their command lines name.

use std::path::PathBuf;

/// The host's process ids, from /proc.
pub fn processes() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
}

/// A process's arguments, from /proc/PID/cmdline (None once it is gone).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// A process's real user, from /proc/PID/status.
pub fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A QEMU process found in /proc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostQemu {
    pub pid: u32,
    /// Its QMP unix sockets, from its command line (`-qmp unix:PATH`, or a
    /// `-chardev socket,path=PATH` that a `-mon ...,mode=control` uses).
    pub qmp: Vec<PathBuf>,
    /// `kvm`, `tcg`, ... (`-accel`, `-machine accel=`, `-enable-kvm`;
    /// QEMU's default is TCG).
    pub accel: String,
    /// `-name`'s guest name, if given.
    pub name: Option<String>,
    /// `-uuid`, if given (libvirt always gives it).
    pub uuid: Option<String>,
}

/// Every QEMU system emulator running on the host that this user can see.
pub fn qemu_processes() -> Vec<HostQemu> {
    let mut found: Vec<HostQemu> = processes()
        .filter_map(|pid| parse_qemu(pid, &cmdline(pid)?))
        .collect();
    found.sort_by_key(|q| q.pid);
    found
}

/// What a QEMU's arguments say, or None if `args` is not a QEMU system
/// emulator's.
pub fn parse_qemu(pid: u32, args: &[String]) -> Option<HostQemu> {
    let prog = args.first()?;
    let base = prog.rsplit('/').next().unwrap_or(prog);
    if !base.starts_with("qemu-system-") && base != "qemu-kvm" {
        return None;
    }
    // Options with their value: `-opt value` (QEMU takes `--opt` too).
    let opts: Vec<(&str, &str)> = args[1..]
        .windows(2)
        .filter(|w| w[0].starts_with('-'))
        .map(|w| (w[0].trim_start_matches('-'), w[1].as_str()))
        .collect();
    let flag = |f: &str| args[1..].iter().any(|a| a.trim_start_matches('-') == f);
    let mut qmp: Vec<PathBuf> = opts
        .iter()
        .filter(|(o, _)| *o == "qmp" || *o == "qmp-pretty")
        .filter_map(|(_, v)| unix_path(v))
        .collect();
    for (o, v) in &opts {
        if *o != "mon" || prop(v, "mode") != Some("control") {
            continue;
        }
        let id = prop(v, "chardev").or_else(|| v.split(',').next().filter(|f| !f.contains('=')));
        let path = opts.iter().find_map(|(o, c)| {
            (*o == "chardev" && c.starts_with("socket,") && prop(c, "id") == id && id.is_some())
                .then(|| prop(c, "path"))
                .flatten()
        });
        qmp.extend(path.map(PathBuf::from));
    }
    let accel = opts
        .iter()
        .find_map(|(o, v)| match *o {
            "accel" => v.split(',').next().map(str::to_string),
            "machine" | "M" => prop(v, "accel").map(str::to_string),
            _ => None,
        })
        .or_else(|| flag("enable-kvm").then(|| "kvm".to_string()))
        .unwrap_or_else(|| "tcg".into());
    let name = opts
        .iter()
        .find(|(o, _)| *o == "name")
        .map(|(_, v)| prop(v, "guest").unwrap_or_else(|| v.split(',').next().unwrap_or(v)))
        .map(str::to_string);
    let uuid = opts
        .iter()
        .find(|(o, _)| *o == "uuid")
        .map(|(_, v)| v.to_string());
    Some(HostQemu {
        pid,
        qmp,
        accel,
        name,
        uuid,
    })
}

/// The path of a `unix:PATH[,opts]` chardev address.
fn unix_path(spec: &str) -> Option<PathBuf> {
    let rest = spec.strip_prefix("unix:")?;
    Some(PathBuf::from(rest.split(',').next()?))
}

/// The value of `key=` in a comma-separated option string.
fn prop<'a>(spec: &'a str, key: &str) -> Option<&'a str> {
    spec.split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    /// The command lines of tests/common/qemu.rs, of a `-mon` user and of
    /// libvirt 9.0 (its monitor passed as an fd: no path to list).
    #[test]
    fn qmp_sockets_and_accelerators_from_command_lines() {
        let q = parse_qemu(
            7,
            &args(
                "qemu-system-x86_64 -accel tcg -m 256 -qmp unix:/tmp/v/qmp.sock,server=on,wait=off \
                 -chardev socket,id=s0,path=/tmp/v/serial.sock -serial chardev:s0",
            ),
        )
        .unwrap();
        assert_eq!(q.qmp, vec![PathBuf::from("/tmp/v/qmp.sock")]);
        assert_eq!(q.accel, "tcg");
        let q = parse_qemu(
            8,
            &args(
                "/usr/bin/qemu-system-x86_64 -enable-kvm -chardev socket,id=m,path=/run/m.sock,server=on \
                 -mon chardev=m,mode=control -name vm1",
            ),
        )
        .unwrap();
        assert_eq!(q.qmp, vec![PathBuf::from("/run/m.sock")]);
        assert_eq!((q.accel.as_str(), q.name.as_deref()), ("kvm", Some("vm1")));
        let q = parse_qemu(
            9,
            &args(
                "/usr/bin/qemu-system-x86_64 -name guest=dom,debug-threads=on -machine pc,accel=tcg \
                 -uuid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 \
                 -chardev socket,id=charmonitor,fd=31,server=on,wait=off \
                 -mon chardev=charmonitor,id=monitor,mode=control",
            ),
        )
        .unwrap();
        assert!(q.qmp.is_empty());
        assert_eq!(q.name.as_deref(), Some("dom"));
        assert_eq!(
            q.uuid.as_deref(),
            Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
        );
        assert_eq!(
            parse_qemu(1, &args("/bin/bash -c qemu-system-x86_64")),
            None
        );
    }
}
