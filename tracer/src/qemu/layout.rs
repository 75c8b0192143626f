//! Where a QEMU guest's RAM lives: parsers of the HMP texts that say it.
//!
//! `info mtree -f -o` gives the flat view of the address space "memory":
//! each guest-physical range, its kind (ram, rom, i/o, ...), its RAMBlock
//! with `@offset` into it and its owner. Guest RAM is a `ram` range owned by
//! a memory backend object (`owner:{obj path=/objects/pc.ram}`); device RAM
//! such as vga.vram is owned by a device and left out. QEMU 7.2's
//! `info ramblock` has no host-address column, so `gpa2hva` gives each
//! range's host address, and `info ramblock` checks the range lies within
//! its block's used length.

/// Guest-physical RAM `[gpa, gpa + len)`, mapped at `hva` in QEMU's process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamRange {
    pub gpa: u64,
    pub len: u64,
    pub hva: u64,
    /// The RAMBlock's name, e.g. "pc.ram".
    pub name: String,
}

impl RamRange {
    /// The host address of `gpa` when this range holds it.
    pub fn hva_of(&self, gpa: u64) -> Option<u64> {
        (gpa >= self.gpa && gpa - self.gpa < self.len).then(|| self.hva + (gpa - self.gpa))
    }
}

/// A RAM range of the flat view: where it sits and which block backs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatRam {
    pub gpa: u64,
    pub len: u64,
    pub block: String,
    /// Offset into the block (`@offset`, 0 when absent).
    pub offset: u64,
}

/// One line of `info ramblock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamBlock {
    pub name: String,
    pub offset: u64,
    pub used: u64,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// The RAM ranges of address space "memory" in `info mtree -f [-o]`.
pub fn parse_flat_ram(text: &str) -> Result<Vec<FlatRam>, String> {
    let mut in_memory = false;
    let mut seen_memory = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("FlatView") {
            in_memory = false;
        } else if line.trim_start().starts_with("AS \"memory\"") {
            in_memory = true;
            seen_memory = true;
        } else if in_memory {
            if let Some(r) = parse_flat_line(line) {
                out.push(r);
            }
        }
    }
    if !seen_memory {
        return Err("no flat view of address space \"memory\" in its output".into());
    }
    if out.is_empty() {
        return Err("no RAM in address space \"memory\"".into());
    }
    Ok(out)
}

/// `  START-END (prio P, ram): NAME [@OFFSET] [owner:{obj path=...}]`, when
/// it is RAM owned by a memory backend (or the owner is not shown).
fn parse_flat_line(line: &str) -> Option<FlatRam> {
    let (range, rest) = line.trim().split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    let (start, end) = (hex(start)?, hex(end)?);
    let (attrs, rest) = rest.strip_prefix('(')?.split_once("): ")?;
    if attrs.rsplit(", ").next()? != "ram" {
        return None;
    }
    let (rest, owner) = match rest.find(" owner:{").or_else(|| rest.find(" parent:{")) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if owner.is_some_and(|o| !o.starts_with("owner:{obj ")) {
        return None;
    }
    let (block, offset) = match rest.rsplit_once(" @") {
        Some((name, off)) => (name, hex(off)?),
        None => (rest, 0),
    };
    Some(FlatRam {
        gpa: start,
        len: end.checked_sub(start)?.checked_add(1)?,
        block: block.trim().to_string(),
        offset,
    })
}

/// The blocks of `info ramblock` (name, offset, used length).
pub fn parse_ramblocks(text: &str) -> Vec<RamBlock> {
    let mut out = Vec::new();
    for line in text.lines() {
        // The name may hold spaces; the columns after it do not.
        let cols: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = cols.iter().position(|c| c.starts_with("0x")) else {
            continue;
        };
        let (Some(offset), Some(used)) = (hex(cols[i]), cols.get(i + 1).and_then(|c| hex(c)))
        else {
            continue;
        };
        // Name, then the page size ("4 KiB") before the offset.
        let name_end = i.saturating_sub(2).max(1);
        out.push(RamBlock {
            name: cols[..name_end].join(" "),
            offset,
            used,
        });
    }
    out
}

/// The host address in `Host virtual address for 0x100000 (pc.ram) is 0x7f..`.
pub fn parse_gpa2hva(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.strip_prefix("Host virtual address for ")
        .and_then(|r| r.rsplit_once(" is "))
        .and_then(|(_, hva)| hex(hva))
        .ok_or_else(|| t.to_string())
}

/// The ranges with their host addresses, each checked against its block.
pub fn join_layout(
    flat: &[FlatRam],
    hvas: &[u64],
    blocks: &[RamBlock],
) -> Result<Vec<RamRange>, String> {
    let mut out = Vec::with_capacity(flat.len());
    for (r, &hva) in flat.iter().zip(hvas) {
        // The block's name in `info ramblock` may carry a device path prefix
        // ("0000:00:02.0/vga.vram") where the region's does not.
        let block = blocks
            .iter()
            .find(|b| b.name == r.block || b.name.ends_with(&format!("/{}", r.block)));
        if let Some(b) = block {
            if r.offset.checked_add(r.len).is_none_or(|end| end > b.used) {
                return Err(format!(
                    "RAM range {:#x}+{:#x} at offset {:#x} of block {} exceeds its used length {:#x}",
                    r.gpa, r.len, r.offset, r.block, b.used
                ));
            }
        }
        out.push(RamRange {
            gpa: r.gpa,
            len: r.len,
            hva,
            name: r.block.clone(),
        });
    }
    out.sort_by_key(|r| r.gpa);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `info mtree -f -o` of QEMU 7.2 (`-m 256`, pc machine), the part up to
    /// the I/O space.
    const MTREE: &str = r#"FlatView #0
 AS "cpu-smm-0", root: memory
 Root memory region: memory
  0000000000000000-00000000000bffff (prio 0, ram): pc.ram owner:{obj path=/objects/pc.ram}
  00000000000c0000-00000000000cafff (prio 0, rom): pc.ram @00000000000c0000 owner:{obj path=/objects/pc.ram}
  0000000000100000-000000000fffffff (prio 0, ram): pc.ram @0000000000100000 owner:{obj path=/objects/pc.ram}

FlatView #1
 AS "memory", root: system
 AS "cpu-memory-0", root: system
 AS "cpu-memory-1", root: system
 Root memory region: system
  0000000000000000-000000000009ffff (prio 0, ram): pc.ram owner:{obj path=/objects/pc.ram}
  00000000000a0000-00000000000bffff (prio 1, i/o): vga-lowmem owner:{dev path=/machine/unattached/device[9]}
  00000000000c0000-00000000000cafff (prio 0, rom): pc.ram @00000000000c0000 owner:{obj path=/objects/pc.ram}
  00000000000cb000-00000000000cdfff (prio 0, ram): pc.ram @00000000000cb000 owner:{obj path=/objects/pc.ram}
  00000000000ce000-00000000000e7fff (prio 0, rom): pc.ram @00000000000ce000 owner:{obj path=/objects/pc.ram}
  00000000000e8000-00000000000effff (prio 0, ram): pc.ram @00000000000e8000 owner:{obj path=/objects/pc.ram}
  00000000000f0000-00000000000fffff (prio 0, rom): pc.ram @00000000000f0000 owner:{obj path=/objects/pc.ram}
  0000000000100000-000000000fffffff (prio 0, ram): pc.ram @0000000000100000 owner:{obj path=/objects/pc.ram}
  00000000fd000000-00000000fdffffff (prio 1, ram): vga.vram owner:{dev path=/machine/unattached/device[9]}
  00000000febc0000-00000000febdffff (prio 1, i/o): e1000-mmio owner:{dev path=/machine/unattached/device[22]}
  00000000febf0400-00000000febf041f (prio 0, i/o): vga ioports remapped owner:{dev path=/machine/unattached/device[9]}
  00000000fee00000-00000000feefffff (prio 4096, i/o): apic-msi owner:{dev path=/machine/unattached/device[0]/lapic}
  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios parent:{obj path=/machine/unattached}

FlatView #2
 AS "I/O", root: io
 Root memory region: io
  0000000000000000-0000000000000007 (prio 0, i/o): dma-chan owner:{dev path=/machine/unattached/device[12]}
"#;

    /// `info ramblock` of the same QEMU.
    const RAMBLOCK: &str = "              Block Name    PSize              Offset               Used              Total
                  pc.ram    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000
   0000:00:02.0/vga.vram    4 KiB  0x0000000010080000 0x0000000001000000 0x0000000001000000
    /rom@etc/acpi/tables    4 KiB  0x0000000011100000 0x0000000000020000 0x0000000000200000
                 pc.bios    4 KiB  0x0000000010000000 0x0000000000040000 0x0000000000040000
";

    /// The flat view of a QEMU 7.2 with `-m 3584 -S`: 3 GiB below the PCI
    /// hole, the rest above 4 GiB at offset 3 GiB of pc.ram.
    const MTREE_HIGH: &str = r#"FlatView #1
 AS "memory", root: system
 AS "cpu-memory-0", root: system
 Root memory region: system
  0000000000000000-000000000009ffff (prio 0, ram): pc.ram owner:{obj path=/objects/pc.ram}
  00000000000a0000-00000000000bffff (prio 1, i/o): vga-lowmem owner:{dev path=/machine/unattached/device[9]}
  00000000000c0000-00000000000dffff (prio 1, rom): pc.rom parent:{obj path=/machine/unattached}
  00000000000e0000-00000000000fffff (prio 0, rom): pc.bios @0000000000020000 parent:{obj path=/machine/unattached}
  0000000000100000-00000000bfffffff (prio 0, ram): pc.ram @0000000000100000 owner:{obj path=/objects/pc.ram}
  00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic owner:{dev path=/machine/i440fx/ioapic}
  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios parent:{obj path=/machine/unattached}
  0000000100000000-000000011fffffff (prio 0, ram): pc.ram @00000000c0000000 owner:{obj path=/objects/pc.ram}

FlatView #2
"#;

    #[test]
    fn flat_view_above_4g() {
        let flat = parse_flat_ram(MTREE_HIGH).unwrap();
        let got: Vec<(u64, u64, u64)> = flat.iter().map(|r| (r.gpa, r.len, r.offset)).collect();
        assert_eq!(
            got,
            [
                (0, 0xa0000, 0),
                (0x10_0000, 0xbff0_0000, 0x10_0000),
                (0x1_0000_0000, 0x2000_0000, 0xc000_0000)
            ]
        );
        let blocks = [RamBlock {
            name: "pc.ram".into(),
            offset: 0,
            used: 0xe000_0000,
        }];
        let hvas: Vec<u64> = flat.iter().map(|r| 0x7f0f_9fe0_0000 + r.offset).collect();
        let l = join_layout(&flat, &hvas, &blocks).unwrap();
        assert_eq!(l[2].hva_of(0x1_0000_0000), Some(0x7f10_5fe0_0000));
    }

    #[test]
    fn flat_view_keeps_backend_ram_only() {
        let flat = parse_flat_ram(MTREE).unwrap();
        let got: Vec<(u64, u64, &str, u64)> = flat
            .iter()
            .map(|r| (r.gpa, r.len, r.block.as_str(), r.offset))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0xa0000, "pc.ram", 0),
                (0xcb000, 0x3000, "pc.ram", 0xcb000),
                (0xe8000, 0x8000, "pc.ram", 0xe8000),
                (0x100000, 0xff00000, "pc.ram", 0x100000),
            ]
        );
    }

    #[test]
    fn flat_view_without_owners_keeps_all_ram() {
        let text = MTREE.replace(" owner:{obj path=/objects/pc.ram}", "");
        let text: String = text
            .lines()
            .map(|l| l.split(" owner:{").next().unwrap().to_string() + "\n")
            .collect();
        let flat = parse_flat_ram(&text).unwrap();
        assert_eq!(flat.len(), 5);
        assert_eq!(flat[4].block, "vga.vram");
    }

    #[test]
    fn flat_view_missing_is_an_error() {
        assert!(parse_flat_ram("FlatView #0\n AS \"I/O\", root: io\n")
            .unwrap_err()
            .contains("address space \"memory\""));
    }

    #[test]
    fn ramblocks_parse_names_with_paths() {
        let b = parse_ramblocks(RAMBLOCK);
        assert_eq!(b.len(), 4);
        assert_eq!(
            b[0],
            RamBlock {
                name: "pc.ram".into(),
                offset: 0,
                used: 0x1000_0000
            }
        );
        assert_eq!(b[1].name, "0000:00:02.0/vga.vram");
        assert_eq!(b[2].name, "/rom@etc/acpi/tables");
        assert_eq!(b[2].used, 0x20000);
    }

    #[test]
    fn gpa2hva_parses_or_says_why() {
        assert_eq!(
            parse_gpa2hva("Host virtual address for 0x100000 (pc.ram) is 0x7f2fc3f00000\r\n"),
            Ok(0x7f2f_c3f0_0000)
        );
        assert_eq!(
            parse_gpa2hva("No memory is mapped at address 0x20000000\r\n"),
            Err("No memory is mapped at address 0x20000000".into())
        );
    }

    #[test]
    fn join_checks_block_lengths() {
        let flat = parse_flat_ram(MTREE).unwrap();
        let blocks = parse_ramblocks(RAMBLOCK);
        let hvas: Vec<u64> = flat.iter().map(|r| 0x7f00_0000_0000 + r.offset).collect();
        let l = join_layout(&flat, &hvas, &blocks).unwrap();
        assert_eq!(l[3].hva_of(0x1000_0000 - 1), Some(0x7f00_0fff_ffff));
        assert_eq!(l[3].hva_of(0x1000_0000), None);
        let mut big = flat.clone();
        big[3].len += 0x1000;
        assert!(join_layout(&big, &hvas, &blocks)
            .unwrap_err()
            .contains("exceeds its used length"));
    }
}
