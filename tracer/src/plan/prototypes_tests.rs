//! `Plan::prototypes` for a module's functions: by the module's own BTF,
//! never by a vmlinux function's of the same name.

use std::path::Path;

use crate::kernel::kaslr::KernelOffset;
use crate::kernel::module_btf::ko_btf_data;
use crate::kernel::modules::{LoadedModule, ModuleFunction, ModuleLayout};
use crate::kernel::prototype::{Param, ValueKind};
use crate::kernel::sites::NOP5;
use crate::plan::{Plan, ValuePlan};

/// Where the fake module's text starts: above the kernel's image, as
/// modules load.
const TEXT: u64 = 0xffff_ffff_c000_0000;

/// Debian 6.12's image with a module `vmt_test` added, whose functions
/// are `vmt_hit` and `vfs_write` (a vmlinux function's name), each with a
/// NOP site; its BTF vmt_test.ko's when `btf`. None (skipped) when the
/// guest's files are not built.
fn plan(btf: bool) -> Option<Plan> {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out/debian-6.12");
    let (kernel, ko) = (out.join("vmlinuz"), out.join("vmt_test.ko"));
    if !kernel.is_file() || !ko.is_file() {
        eprintln!("SKIPPED: run `bash guest/build.sh debian-6.12`");
        return None;
    }
    let (mut image, _) = crate::kernel::bzimage::load(&kernel).unwrap();
    let function = |name: &str, at: u64| ModuleFunction {
        name: name.into(),
        addr: TEXT + at,
        size: 0x40,
    };
    let m = LoadedModule {
        name: "vmt_test".into(),
        addr: TEXT + 0x1000,
        text: TEXT..TEXT + 0x80,
        functions: vec![function("vmt_hit", 0), function("vfs_write", 0x40)],
        sites: vec![TEXT, TEXT + 0x40],
        events: Vec::new(),
        tables: Default::default(),
    };
    let mut text = vec![0xccu8; 0x80];
    text[..5].copy_from_slice(&NOP5);
    text[0x40..0x45].copy_from_slice(&NOP5);
    let offset = KernelOffset { virt: 0, phys: 0 };
    assert_eq!(
        image.add_modules(&[(m, text)], ModuleLayout::unused(), offset),
        2
    );
    if btf {
        image.set_module_btf(TEXT + 0x1000, ko_btf_data(&ko).unwrap().unwrap());
    }
    let mut plan = Plan::from_image(image, &["*:mod:vmt_test".into()], &[]).unwrap();
    plan.values = ValuePlan {
        args: true,
        retval: false,
    };
    Some(plan)
}

/// The module's `vmt_hit` by its BTF, `(unsigned long i)`; its
/// `vfs_write`, which its BTF does not describe, has none: not the
/// vmlinux's `vfs_write`'s. Without the module's BTF, neither has one.
#[test]
fn a_modules_functions_are_described_by_its_own_btf_only() {
    let Some(with) = plan(true) else { return };
    let names: Vec<&str> = (with.funcs.iter())
        .map(|&f| with.image.functions[f].name.as_str())
        .collect();
    assert_eq!(names, ["vmt_hit [vmt_test]", "vfs_write [vmt_test]"]);
    assert!(with.btf.as_ref().unwrap().prototype("vfs_write").is_some());
    let protos = with.prototypes();
    let i = Param {
        name: "i".into(),
        kind: ValueKind::Unsigned(8),
        reg: 0,
    };
    assert_eq!(protos[0].as_ref().map(|p| &p.params[..]), Some(&[i][..]));
    assert_eq!(protos[1], None);
    let without = plan(false).unwrap();
    assert_eq!(without.prototypes(), [None, None]);
}
