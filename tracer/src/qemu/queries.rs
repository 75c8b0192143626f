//! The QMP queries vmtrace makes (run state, vCPUs, the RAM layout, the
//! gdbstub), each built on one `execute`, so that they work over any way
//! of reaching QEMU's monitor: one held connection ([`super::qmp::Qmp`]),
//! a connection per burst ([`super::monitor::Monitor`] over a QMP socket),
//! or another transport behind a `Monitor`.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::gdb::GdbAddr;
use super::layout::{join_layout, parse_flat_ram, parse_gpa2hva, parse_ramblocks, RamRange};
use super::qmp::{short, Qmp, QmpError};

/// One vCPU, from `query-cpus-fast`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuCpu {
    /// QEMU's cpu_index: the gdbstub's thread id minus one.
    pub index: u32,
    /// The host thread running it (a TCG thread under MTTCG, a KVM vCPU thread).
    pub thread_id: u32,
    pub qom_path: String,
    pub target: String,
}

/// QEMU's gdbstub as its chardev "gdb" shows it (`query-chardev`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdbServer {
    /// Where to connect, when it listens on a unix or TCP socket (a TCP
    /// stub on every address is reached on 127.0.0.1).
    pub addr: Option<GdbAddr>,
    /// A debugger is connected: the stub serves one at a time.
    pub connected: bool,
    /// QEMU's description, e.g. `disconnected:tcp:0.0.0.0:1234,server=on`.
    pub filename: String,
}

impl GdbServer {
    /// From the chardev's filename: `[disconnected:]unix:PATH,server=on` or
    /// `[disconnected:]tcp:HOST:PORT,server=on[ <-> PEER]`.
    pub fn parse(filename: &str) -> GdbServer {
        let (connected, rest) = match filename.strip_prefix("disconnected:") {
            Some(r) => (false, r),
            None => (true, filename),
        };
        let spec = rest.split(" <-> ").next().unwrap_or("");
        let spec = spec.split(',').next().unwrap_or("");
        let addr = if let Some(p) = spec.strip_prefix("unix:") {
            Some(GdbAddr::Unix(PathBuf::from(p)))
        } else if let Some((host, port)) =
            spec.strip_prefix("tcp:").and_then(|t| t.rsplit_once(':'))
        {
            let host = match host {
                "" | "0.0.0.0" | "::" | "[::]" => "127.0.0.1",
                h => h,
            };
            Some(GdbAddr::Tcp(format!("{host}:{port}")))
        } else {
            None
        };
        GdbServer {
            addr,
            connected,
            filename: filename.to_string(),
        }
    }
}

/// A way to run one QMP command on a QEMU; the queries come with it.
pub trait Queries {
    /// Runs `cmd` (with `args`) and returns its `return` value.
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError>;

    /// Where the monitor is, for errors: the QMP socket's path (or what
    /// another transport names its QEMU by).
    fn place(&self) -> &Path;

    /// "kvm" when KVM is enabled, else "tcg".
    fn accel(&mut self) -> Result<&'static str, QmpError> {
        let r = self.execute("query-kvm", None)?;
        Ok(if r["enabled"].as_bool() == Some(true) {
            "kvm"
        } else {
            "tcg"
        })
    }

    /// vCPU `qom_path`'s CPUID feature `name` (an x86 CPU's QOM property,
    /// such as "cx16"); None where QEMU has no such property.
    fn cpu_feature(&mut self, qom_path: &str, name: &str) -> Result<Option<bool>, QmpError> {
        let args = json!({ "path": qom_path, "property": name });
        match self.execute("qom-get", Some(args)) {
            Ok(v) => Ok(v.as_bool()),
            Err(QmpError::Command { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The run state: "running", "paused", "prelaunch", "shutdown", ...
    fn status(&mut self) -> Result<String, QmpError> {
        let r = self.execute("query-status", None)?;
        r["status"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| reply(self, "query-status", &r.to_string()))
    }

    /// The vCPUs, by index.
    fn cpus(&mut self) -> Result<Vec<QemuCpu>, QmpError> {
        let r = self.execute("query-cpus-fast", None)?;
        let list = r
            .as_array()
            .ok_or_else(|| reply(self, "query-cpus-fast", &r.to_string()))?;
        let mut cpus = Vec::with_capacity(list.len());
        for c in list {
            let (Some(index), Some(thread_id)) = (c["cpu-index"].as_u64(), c["thread-id"].as_u64())
            else {
                return Err(reply(self, "query-cpus-fast", &c.to_string()));
            };
            cpus.push(QemuCpu {
                index: index as u32,
                thread_id: thread_id as u32,
                qom_path: c["qom-path"].as_str().unwrap_or("").into(),
                target: c["target"].as_str().unwrap_or("").into(),
            });
        }
        cpus.sort_by_key(|c| c.index);
        Ok(cpus)
    }

    /// Runs an HMP command and returns its text. HMP reports failure in
    /// that text; callers that know the command check it.
    fn hmp(&mut self, cmd: &str) -> Result<String, QmpError> {
        let r = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": cmd })),
        )?;
        let text = r
            .as_str()
            .ok_or_else(|| reply(self, "human-monitor-command", &r.to_string()))?;
        if let Some(rest) = text.strip_prefix("unknown command:") {
            return Err(hmp_error(self, cmd, &format!("unknown command:{rest}")));
        }
        Ok(text.to_string())
    }

    /// Guest-physical RAM (not ROM, not device memory) and where it is
    /// mapped in QEMU's process.
    fn ram_layout(&mut self) -> Result<Vec<RamRange>, QmpError> {
        let mut cmd = "info mtree -f -o";
        let mut mtree = self.hmp(cmd)?;
        if !mtree.contains("FlatView") {
            // A QEMU without `-o` (owners): device RAM is then kept too.
            cmd = "info mtree -f";
            mtree = self.hmp(cmd)?;
        }
        let flat = parse_flat_ram(&mtree).map_err(|e| hmp_error(self, cmd, &e))?;
        let blocks_text = self.hmp("info ramblock")?;
        let blocks = parse_ramblocks(&blocks_text);
        let mut hvas = Vec::with_capacity(flat.len());
        for r in &flat {
            let cmd = format!("gpa2hva {:#x}", r.gpa);
            let text = self.hmp(&cmd)?;
            hvas.push(parse_gpa2hva(&text).map_err(|e| hmp_error(self, &cmd, &e))?);
        }
        join_layout(&flat, &hvas, &blocks).map_err(|e| hmp_error(self, "info ramblock", &e))
    }

    /// Opens QEMU's gdbstub on `spec` (a chardev: `unix:PATH,server=on,wait=off`,
    /// `tcp::PORT`).
    fn open_gdbserver(&mut self, spec: &str) -> Result<(), QmpError> {
        let cmd = format!("gdbserver {spec}");
        let text = self.hmp(&cmd)?;
        if text.trim_start().starts_with("Waiting for gdb connection") {
            Ok(())
        } else {
            Err(hmp_error(self, &cmd, &text))
        }
    }

    /// QEMU's gdbstub, if one is open (`-s`, `-gdb` or `gdbserver`).
    fn gdbserver(&mut self) -> Result<Option<GdbServer>, QmpError> {
        let r = self.execute("query-chardev", None)?;
        let list = r
            .as_array()
            .ok_or_else(|| reply(self, "query-chardev", &r.to_string()))?;
        Ok(list
            .iter()
            .find(|c| c["label"] == "gdb")
            .and_then(|c| c["filename"].as_str())
            .map(GdbServer::parse))
    }

    /// Closes QEMU's gdbstub (`gdbserver none`).
    fn close_gdbserver(&mut self) -> Result<(), QmpError> {
        let text = self.hmp("gdbserver none")?;
        if text.trim_start().starts_with("Disabled gdbserver") {
            Ok(())
        } else {
            Err(hmp_error(self, "gdbserver none", &text))
        }
    }
}

impl Queries for Qmp {
    fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        Qmp::execute(self, cmd, args)
    }

    fn place(&self) -> &Path {
        self.path()
    }
}

fn reply(q: &(impl Queries + ?Sized), cmd: &str, what: &str) -> QmpError {
    QmpError::Reply {
        path: q.place().to_path_buf(),
        cmd: cmd.into(),
        what: short(what),
    }
}

/// HMP's failure text, one line.
fn hmp_error(q: &(impl Queries + ?Sized), cmd: &str, text: &str) -> QmpError {
    let msg: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    QmpError::Hmp {
        path: q.place().to_path_buf(),
        cmd: cmd.into(),
        msg: msg.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "gdb" chardev's filenames of QEMU 7.2, captured.
    #[test]
    fn gdbserver_chardevs() {
        let g = GdbServer::parse("disconnected:tcp:0.0.0.0:1234,server=on");
        assert_eq!(g.addr, Some(GdbAddr::Tcp("127.0.0.1:1234".into())));
        assert!(!g.connected);
        let g = GdbServer::parse("tcp:127.0.0.1:1234,server=on <-> 127.0.0.1:49228");
        assert_eq!(g.addr, Some(GdbAddr::Tcp("127.0.0.1:1234".into())));
        assert!(g.connected);
        let g = GdbServer::parse("disconnected:unix:/tmp/qw/g6.sock,server=on");
        assert_eq!(g.addr, Some(GdbAddr::Unix("/tmp/qw/g6.sock".into())));
        assert!(!g.connected);
        assert!(GdbServer::parse("unix:/tmp/qw/g6.sock,server=on").connected);
        assert_eq!(GdbServer::parse("pty:/dev/pts/3").addr, None);
    }
}
