//! The gdbstub's threads (QEMU's vCPUs) and their registers, as the stub
//! describes them (its target description, read once): `impl Gdb`, apart
//! from the protocol's packets and memory in `gdb`.

use super::gdb::{Gdb, GdbError, X86Regs, PACKET_OVERHEAD};
use super::regs::{includes, le_value, parse_regs, RegMap};
use super::rsp::{self, ThreadId};

/// Threads (vCPUs) taken from the stub: above QEMU's largest x86 machine.
const MAX_THREADS: usize = 8192;
/// Bytes of one target description file (QEMU's x86_64 ones are a few KiB).
const MAX_XML: usize = 1 << 20;

impl Gdb {
    /// The threads (vCPUs), in the stub's order: `MAX_THREADS` at most,
    /// within one reply timeout.
    pub fn threads(&mut self) -> Result<Vec<ThreadId>, GdbError> {
        self.within(Self::thread_list)
    }

    fn thread_list(&mut self) -> Result<Vec<ThreadId>, GdbError> {
        let mut out: Vec<ThreadId> = Vec::new();
        let mut cmd = "qfThreadInfo";
        loop {
            let r = self.command(cmd)?;
            let Some(list) = r.strip_prefix('m') else {
                if r == "l" {
                    return Ok(out);
                }
                return Err(self.failed(cmd, r));
            };
            for t in list.split(',') {
                if out.len() >= MAX_THREADS {
                    return Err(self.flood(cmd, MAX_THREADS, "threads"));
                }
                out.push(ThreadId::parse(t).ok_or_else(|| GdbError::Reply {
                    addr: self.addr.clone(),
                    cmd: cmd.into(),
                    reply: r.clone(),
                })?);
            }
            if let Some(pid) = out.first().and_then(|t| t.pid) {
                self.process = pid;
            }
            cmd = "qsThreadInfo";
        }
    }

    /// Selects `thread` for `g`, every time: any stop (a QMP `stop` too)
    /// makes QEMU select the stopping vCPU behind the client's back.
    fn select(&mut self, thread: ThreadId) -> Result<(), GdbError> {
        if self.selected == Some(thread) {
            return Ok(());
        }
        self.expect_ok(&format!("Hg{thread}"))?;
        self.selected = Some(thread);
        Ok(())
    }

    /// `thread`'s registers, placed by the stub's target description.
    pub fn regs(&mut self, thread: ThreadId) -> Result<X86Regs, GdbError> {
        if self.regmap.is_none() {
            self.regmap = Some(self.read_regmap()?);
        }
        self.select(thread)?;
        let g = self.command("g")?;
        let data = rsp::from_hex(g.as_bytes()).ok_or_else(|| self.reply_error("g", &g))?;
        let map = self.regmap.clone().unwrap_or_default();
        let mut regs = X86Regs::default();
        for (name, field) in regs.fields_mut() {
            let Some((desc, off)) = map.find(name) else {
                return Err(self.target_error(format!("no register {name} in its description")));
            };
            let size = desc.bits.div_ceil(8) as usize;
            *field = match data.get(*off..off + size) {
                Some(b) => le_value(b),
                // Not in `g`: ask for it alone.
                None => {
                    let cmd = format!("p{:x}", desc.regnum);
                    let r = self.command(&cmd)?;
                    let b = rsp::from_hex(r.as_bytes())
                        .filter(|b| b.len() == size)
                        .ok_or_else(|| self.reply_error(&cmd, &r))?;
                    le_value(&b)
                }
            };
        }
        Ok(regs)
    }

    /// Sets `thread`'s register `name` (as the target description names
    /// it: "rip", "eflags", "cs", ...) with `P`.
    pub fn set_reg(&mut self, thread: ThreadId, name: &str, value: u64) -> Result<(), GdbError> {
        if self.regmap.is_none() {
            self.regmap = Some(self.read_regmap()?);
        }
        let map = self.regmap.as_ref().and_then(|m| m.find(name)).cloned();
        let Some((desc, _)) = map else {
            return Err(self.target_error(format!("no register {name} in its description")));
        };
        let size = desc.bits.div_ceil(8) as usize;
        let mut bytes = value.to_le_bytes().to_vec();
        bytes.resize(size, 0);
        self.select(thread)?;
        self.expect_ok(&format!("P{:x}={}", desc.regnum, rsp::to_hex(&bytes)))
    }

    /// The register map from target.xml and the files it includes, within
    /// one reply timeout.
    fn read_regmap(&mut self) -> Result<RegMap, GdbError> {
        self.within(Self::regmap_files)
    }

    fn regmap_files(&mut self) -> Result<RegMap, GdbError> {
        if !self.features.xfer_features {
            return Err(self.target_error("gives no target description (qXfer:features)".into()));
        }
        let mut todo = vec!["target.xml".to_string()];
        let mut regs = Vec::new();
        let mut next = 0;
        let mut seen = 0;
        while let Some(file) = todo.pop() {
            seen += 1;
            if seen > 32 {
                return Err(self.target_error("target description includes too many files".into()));
            }
            let xml = self.xfer_features(&file)?;
            regs.extend(parse_regs(&xml, &mut next).map_err(|e| self.target_error(e))?);
            // In document order: the registers' default numbers follow it.
            todo.extend(includes(&xml).into_iter().rev());
        }
        Ok(RegMap::new(regs))
    }

    /// One file of the target description.
    fn xfer_features(&mut self, file: &str) -> Result<String, GdbError> {
        let mut out = Vec::new();
        let chunk = self
            .features
            .packet_size
            .saturating_sub(PACKET_OVERHEAD)
            .max(64);
        loop {
            let cmd = format!("qXfer:features:read:{file}:{:x},{chunk:x}", out.len());
            let r = self.command_bytes(cmd.as_bytes(), &cmd)?;
            let (more, data) = match r.first() {
                Some(b'm') => (true, &r[1..]),
                Some(b'l') => (false, &r[1..]),
                _ => return Err(self.failed(&cmd, String::from_utf8_lossy(&r).into())),
            };
            out.extend(rsp::unescape(data));
            if out.len() > MAX_XML {
                return Err(self.flood(&cmd, MAX_XML, "bytes of target description"));
            }
            if !more {
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
        }
    }
}
