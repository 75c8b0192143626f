//! x86-64 registers from a gdbstub: where each sits in the `g` packet, read
//! from the stub's target description (`target.xml` and the files it
//! includes), never from a table of offsets.

/// A register of the target description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegDesc {
    pub name: String,
    /// The stub's register number (`p`/`P` packets).
    pub regnum: u32,
    pub bits: u32,
}

/// The registers in `g` order, with their byte offsets in its data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegMap {
    pub regs: Vec<(RegDesc, usize)>,
}

impl RegMap {
    /// From the registers of all the description's files, numbered in
    /// order unless a `regnum` says otherwise; `g` holds them by number.
    pub fn new(mut regs: Vec<RegDesc>) -> RegMap {
        regs.sort_by_key(|r| r.regnum);
        let mut off = 0;
        let regs = regs
            .into_iter()
            .map(|r| {
                let at = off;
                off += r.bits.div_ceil(8) as usize;
                (r, at)
            })
            .collect();
        RegMap { regs }
    }

    pub fn find(&self, name: &str) -> Option<&(RegDesc, usize)> {
        self.regs.iter().find(|(r, _)| r.name == name)
    }
}

/// An attribute's value in one tag's text.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = tag;
    loop {
        let i = rest.find(name)?;
        let before = rest[..i].chars().last();
        let after = &rest[i + name.len()..];
        if before.is_some_and(char::is_whitespace) {
            if let Some(v) = after.trim_start().strip_prefix('=') {
                let v = v.trim_start();
                let q = v.chars().next()?;
                let v = &v[1..];
                return v.find(q).map(|end| &v[..end]);
            }
        }
        rest = after;
    }
}

/// The tags named `tag` in `xml`, each as its text from `<` to `>`.
fn tags<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let t = &rest[i..];
        let Some(end) = t.find('>') else { break };
        if t[open.len()..].starts_with(|c: char| c.is_whitespace() || c == '/') {
            out.push(&t[..=end]);
        }
        rest = &t[end..];
    }
    out
}

/// `xml` without its comments (QEMU's i386-64bit.xml comments out
/// registers its `g` packet does not hold).
fn uncomment(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    while let Some(i) = rest.find("<!--") {
        out.push_str(&rest[..i]);
        rest = match rest[i..].find("-->") {
            Some(end) => &rest[i + end + 3..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// The files `xml` includes (`<xi:include href="..."/>`).
pub fn includes(xml: &str) -> Vec<String> {
    tags(&uncomment(xml), "xi:include")
        .iter()
        .filter_map(|t| attr(t, "href"))
        .map(str::to_string)
        .collect()
}

/// The `<reg>`s of one file; `next` is the number the next unnumbered
/// register gets, carried from file to file.
pub fn parse_regs(xml: &str, next: &mut u32) -> Result<Vec<RegDesc>, String> {
    let mut out = Vec::new();
    for t in tags(&uncomment(xml), "reg") {
        let name = attr(t, "name").ok_or_else(|| format!("register without a name: {t}"))?;
        let bits = attr(t, "bitsize")
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| format!("register {name} without a bitsize"))?;
        if let Some(n) = attr(t, "regnum") {
            *next = n
                .parse()
                .map_err(|_| format!("register {name}: bad regnum {n:?}"))?;
        }
        out.push(RegDesc {
            name: name.to_string(),
            regnum: *next,
            bits,
        });
        *next += 1;
    }
    Ok(out)
}

/// A vCPU's registers as vmtrace uses them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct X86Regs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
    pub cs: u64,
    pub ss: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub k_gs_base: u64,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub cr8: u64,
    pub efer: u64,
}

impl X86Regs {
    /// The description's name of each field (`eflags` for rflags), and the field.
    pub fn fields_mut(&mut self) -> [(&'static str, &mut u64); 33] {
        [
            ("rax", &mut self.rax),
            ("rbx", &mut self.rbx),
            ("rcx", &mut self.rcx),
            ("rdx", &mut self.rdx),
            ("rsi", &mut self.rsi),
            ("rdi", &mut self.rdi),
            ("rbp", &mut self.rbp),
            ("rsp", &mut self.rsp),
            ("r8", &mut self.r8),
            ("r9", &mut self.r9),
            ("r10", &mut self.r10),
            ("r11", &mut self.r11),
            ("r12", &mut self.r12),
            ("r13", &mut self.r13),
            ("r14", &mut self.r14),
            ("r15", &mut self.r15),
            ("rip", &mut self.rip),
            ("eflags", &mut self.rflags),
            ("cs", &mut self.cs),
            ("ss", &mut self.ss),
            ("ds", &mut self.ds),
            ("es", &mut self.es),
            ("fs", &mut self.fs),
            ("gs", &mut self.gs),
            ("fs_base", &mut self.fs_base),
            ("gs_base", &mut self.gs_base),
            ("k_gs_base", &mut self.k_gs_base),
            ("cr0", &mut self.cr0),
            ("cr2", &mut self.cr2),
            ("cr3", &mut self.cr3),
            ("cr4", &mut self.cr4),
            ("cr8", &mut self.cr8),
            ("efer", &mut self.efer),
        ]
    }
}

/// A little-endian value of up to 8 bytes.
pub fn le_value(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .take(8)
        .rev()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: &str = r#"<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd"><target><architecture>i386:x86-64</architecture><xi:include href="i386-64bit.xml"/></target>"#;

    const CORE: &str = r#"<feature name="org.gnu.gdb.i386.core">
  <flags id="x64_eflags" size="4"><field name="CF" start="0" end="0"/></flags>
  <reg name="rax" bitsize="64" type="int64" regnum="0"/>
  <reg name="rbx" bitsize="64" type="int64"/>
  <reg name="eflags" bitsize="32" type="x64_eflags"/>
  <!-- reg name="ss_base" bitsize="64" type="int64"/>
  <reg name="es_base" bitsize="64" type="int64"/-->
  <reg name="st0" bitsize="80" type="i387_ext"/>
  <reg name="cr3" bitsize="64" type="int64" regnum="40"/>
  <reg name="regnum_ignored" bitsize="8"/>
</feature>"#;

    #[test]
    fn descriptions_give_numbers_and_offsets() {
        assert_eq!(includes(TARGET), ["i386-64bit.xml"]);
        let mut next = 0;
        let map = RegMap::new(parse_regs(CORE, &mut next).unwrap());
        let got: Vec<(&str, u32, usize)> = map
            .regs
            .iter()
            .map(|(r, off)| (r.name.as_str(), r.regnum, *off))
            .collect();
        assert_eq!(
            got,
            [
                ("rax", 0, 0),
                ("rbx", 1, 8),
                ("eflags", 2, 16),
                ("st0", 3, 20),
                ("cr3", 40, 30),
                ("regnum_ignored", 41, 38)
            ]
        );
        assert_eq!(next, 42);
        assert!(parse_regs(r#"<reg name="x"/>"#, &mut next)
            .unwrap_err()
            .contains("bitsize"));
    }

    #[test]
    fn values_are_little_endian() {
        assert_eq!(le_value(&[0x78, 0x56, 0x34, 0x12]), 0x1234_5678);
        assert_eq!(le_value(&[1; 10]), 0x0101_0101_0101_0101);
    }
}
