//! Direct entry analysis (issue 26) of the mini guest's `direct=1`
//! functions (guest/mini/direct.S, README "direct=1"), each crafted for one
//! rule: the safe ones get the site the rule says (at the entry or after
//! ENDBR64, whole instructions, RIP-relative or not), the others are
//! refused with the named reason at the offsets direct.S's comments give.
//! The functions are hand-written, so their bytes, and so these offsets,
//! are the same in every build; the ftrace builds differ only in having
//! ftrace sites elsewhere (none in these functions).

use std::path::{Path, PathBuf};
use std::process::Command;

use iced_x86::Code;
use tracer::kernel::direct::{DirectSite, KernelTable, Refusal, SiteTables};
use tracer::kernel::symbols::KernelImage;

/// Every build of the mini guest; mini-noftrace has no ftrace sites.
const BUILDS: [&str; 4] = ["mini-noftrace", "mini", "mini-percpu-addr", "mini-rethunk"];

/// What direct_riprel's first instruction loads (mini.h's
/// DIRECT_RIPREL_MAGIC, which the guest checks it returns).
const RIPREL_MAGIC: u64 = 0x5eed_0f0d_dead_beef;

/// guest/out/NAME.elf, built by `bash guest/build.sh NAME` (a no-op when up
/// to date).
fn build(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .args(["guest/build.sh", name])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash guest/build.sh {name}: {e}"));
    assert!(
        out.status.success(),
        "`bash guest/build.sh {name}` failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(format!("guest/out/{name}.elf"))
}

struct Mini {
    image: KernelImage,
    tables: SiteTables,
}

impl Mini {
    fn load(build: &str) -> Mini {
        let image = KernelImage::load_without_sites(&self::build(build)).unwrap();
        assert_eq!(image.mcount_loc.is_empty(), build == "mini-noftrace");
        let tables = SiteTables::read(&image).unwrap();
        Mini { image, tables }
    }

    fn addr(&self, name: &str) -> u64 {
        self.image
            .symbol(name)
            .unwrap_or_else(|| panic!("no {name}"))
            .addr
    }

    fn site(&self, name: &str) -> Result<DirectSite, Refusal> {
        self.site_with(&self.tables, name)
    }

    fn site_with(&self, tables: &SiteTables, name: &str) -> Result<DirectSite, Refusal> {
        let func = self
            .image
            .functions
            .iter()
            .position(|f| f.name == name)
            .unwrap_or_else(|| panic!("no function {name}"));
        DirectSite::analyze(&self.image, tables, func)
    }
}

#[test]
fn the_only_exception_table_entry_is_direct_extables_first_instruction() {
    for build in BUILDS {
        let m = Mini::load(build);
        let start = m.addr("__start___ex_table");
        assert_eq!(m.addr("__stop___ex_table"), start + 12, "{build}");
        assert_eq!(m.tables.count(KernelTable::ExTable), 1, "{build}");
        let f = m.addr("direct_extable");
        assert_eq!(
            m.tables.overlap(f, f + 1),
            Some((KernelTable::ExTable, f)),
            "{build}"
        );
        for t in [
            KernelTable::Alternative,
            KernelTable::JumpLabel,
            KernelTable::StaticCall,
            KernelTable::Retpoline,
            KernelTable::ReturnThunk,
        ] {
            assert_eq!(m.tables.count(t), 0, "{build}: {t:?}");
        }
        assert_eq!(
            m.tables.count(KernelTable::Ftrace),
            m.image.mcount_loc.len(),
            "{build}"
        );
        // Its fixup (s32 relative to itself, at +4) is the function's
        // `mov $-EFAULT`, at +0xc.
        let entry = m.image.file_bytes(start, 12).unwrap();
        let fixup = i32::from_le_bytes(entry[4..8].try_into().unwrap());
        let fixup = (start + 4).wrapping_add_signed(i64::from(fixup));
        assert_eq!(fixup, f + 0xc, "{build}");
    }
}

#[test]
fn safe_functions_get_the_site_their_rule_gives() {
    for build in BUILDS {
        let m = Mini::load(build);

        // RIP-relative first: `mov rax,[rip+direct_riprel_magic]`, 7
        // bytes, displaced alone, its operand kept for rebasing.
        let f = m.addr("direct_riprel");
        let s = m.site("direct_riprel").unwrap();
        assert_eq!(
            (s.addr, s.len, s.insns.len(), s.rip_relative),
            (f, 7, 1, true),
            "{build}"
        );
        let magic = m.addr("direct_riprel_magic");
        assert_eq!(s.insns[0].ip_rel_memory_address(), magic, "{build}");
        let bytes = m.image.file_bytes(magic, 8).unwrap();
        assert_eq!(
            u64::from_le_bytes(bytes.try_into().unwrap()),
            RIPREL_MAGIC,
            "{build}"
        );

        // ENDBR64 first: the site after it, `push rbp; mov rbp,rsp; inc
        // qword [rdi+8]` (1 + 3 + 4 bytes).
        let f = m.addr("direct_endbr");
        let s = m.site("direct_endbr").unwrap();
        assert_eq!(
            (s.addr, s.len, s.insns.len(), s.rip_relative),
            (f + 4, 8, 3, false),
            "{build}"
        );
        assert_eq!(s.insns[0].code(), Code::Push_r64, "{build}");

        // `test sil,1; je short +0xd`: the short jcc displaced, its target
        // past the displaced bytes (a relocation widens it).
        let f = m.addr("direct_jcc");
        let s = m.site("direct_jcc").unwrap();
        assert_eq!(
            (s.addr, s.len, s.insns.len(), s.rip_relative),
            (f, 6, 2, false),
            "{build}"
        );
        assert_eq!(s.insns[1].code(), Code::Je_rel8_64, "{build}");
        assert_eq!(s.insns[1].near_branch_target(), f + 0xd, "{build}");
    }
}

#[test]
fn crafted_functions_are_refused_by_their_rule() {
    for build in BUILDS {
        let m = Mini::load(build);
        for (name, why, rule) in [
            // `jb` at +7 back to +2, inside `xor; inc; cmp` (7 bytes).
            (
                "direct_jump_into",
                Refusal::JumpIntoSite { from: 7, to: 2 },
                "jump-into-site",
            ),
            // `jmp [table+rax*8]` at +5, after `mov; and` (5 bytes).
            (
                "direct_table",
                Refusal::IndirectJump { at: 5 },
                "indirect-jump",
            ),
            // Its first instruction is listed in __ex_table.
            (
                "direct_extable",
                Refusal::Overlaps {
                    table: KernelTable::ExTable,
                    at: 0,
                },
                "ex-table",
            ),
        ] {
            let r = m.site(name).unwrap_err();
            assert_eq!(r, why, "{build}: {name}");
            assert_eq!(r.rule(), rule, "{build}: {name}");
        }
        assert_eq!(
            m.site("direct_extable").unwrap_err().to_string(),
            "exception-table entry at +0x0 in the displaced bytes"
        );
        // The entry alone refuses it: without the table, `mov rax,[rdi+0x28];
        // inc rax` (4 + 3 bytes) would be a site.
        let mut no_ex = m.tables.clone();
        no_ex.remove(KernelTable::ExTable);
        let s = m.site_with(&no_ex, "direct_extable").unwrap();
        assert_eq!(
            (s.addr, s.len, s.rip_relative),
            (m.addr("direct_extable"), 7, false),
            "{build}"
        );
    }
}
