//! The mini guest's `stack=1` chains (guest/mini/README.md "Frame pointers",
//! "stack=1") are frame-pointer chains in every build: each function on a
//! chain makes its frame (`push rbp`, `mov rbp,rsp`) before the call that
//! continues the chain and writes RBP nowhere else but in its epilogue
//! (`pop rbp` then `ret` or a `jmp` to the return thunk), and `_start`
//! clears RBP before it calls C, so an unwinder walking RBP from
//! `stack_leaf`'s entry finds each caller and stops at 0 in `mini_main`'s
//! frame. Read from the machine code, the way objdump shows it.

use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::HashMap;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, Register,
};
use object::{Object, ObjectSection, ObjectSymbol};

/// A build's function symbols (address, size) and their code. Read with
/// `object`, since vmtrace's KernelImage refuses mini-noftrace (no sites).
struct Image {
    funcs: HashMap<String, (u64, u64)>,
    code: HashMap<String, Vec<u8>>,
}

impl Image {
    fn load(path: &Path) -> Image {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let elf = object::File::parse(&*data).expect("an ELF file");
        let mut img = Image {
            funcs: HashMap::new(),
            code: HashMap::new(),
        };
        for sym in elf
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text)
        {
            let name = sym.name().expect("a name").to_string();
            let sec = elf
                .section_by_index(sym.section_index().expect("a section"))
                .expect("its section");
            let off = (sym.address() - sec.address()) as usize;
            let bytes = sec.data().expect("section bytes")[off..][..sym.size() as usize].to_vec();
            img.funcs.insert(name.clone(), (sym.address(), sym.size()));
            img.code.insert(name, bytes);
        }
        img
    }

    fn addr(&self, name: &str) -> u64 {
        self.range(name).start
    }

    fn range(&self, name: &str) -> std::ops::Range<u64> {
        let (a, n) = self.funcs[name];
        a..a + n
    }
}

/// Every build of the mini guest (.ci/run builds them all).
const BUILDS: [&str; 4] = ["mini", "mini-percpu-addr", "mini-rethunk", "mini-noftrace"];

/// Each path's chain at stack_leaf's entry, innermost first.
const CHAINS: [&[&str]; 4] = [
    &[
        "stack_leaf",
        "stack_mid",
        "stack_outer_a",
        "mini_main",
        "_start",
    ],
    &["stack_leaf", "stack_outer_b", "mini_main", "_start"],
    &["stack_leaf", "mini_main", "_start"],
    &[
        "stack_leaf",
        "stack_recurse",
        "stack_recurse",
        "stack_recurse",
        "mini_main",
        "_start",
    ],
];

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

/// A function's instructions.
fn code(image: &Image, name: &str) -> Vec<Instruction> {
    let bytes = image.code.get(name).unwrap_or_else(|| panic!("no {name}"));
    Decoder::with_ip(64, bytes, image.addr(name), DecoderOptions::NONE)
        .into_iter()
        .collect()
}

fn writes_rbp(info: &mut InstructionInfoFactory, ins: &Instruction) -> bool {
    info.info(ins).used_registers().iter().any(|u| {
        u.register().full_register() == Register::RBP
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::ReadWrite
                    | OpAccess::CondWrite
                    | OpAccess::ReadCondWrite
            )
    })
}

fn is_call_to(ins: &Instruction, target: u64) -> bool {
    ins.flow_control() == FlowControl::Call && ins.near_branch_target() == target
}

/// `caller` calls `callee` with a sound frame of its own (see the top):
/// the return addresses of those calls.
fn frame_then_call(image: &Image, caller: &str, callee: &str) -> Vec<u64> {
    let ins = code(image, caller);
    let target = image.addr(callee);
    let calls: Vec<usize> = (0..ins.len())
        .filter(|&i| is_call_to(&ins[i], target))
        .collect();
    assert!(!calls.is_empty(), "{caller} never calls {callee}");
    let mut info = InstructionInfoFactory::new();
    // The site (a 5-byte NOP) first, except in mini-noftrace; then the push.
    let first = usize::from(ins[0].code() == Code::Nop_rm32 && ins[0].len() == 5);
    assert_eq!(
        ins[first].code(),
        Code::Push_r64,
        "{caller}: {}",
        ins[first]
    );
    assert_eq!(ins[first].op0_register(), Register::RBP, "{caller}");
    let frame = (0..ins.len())
        .filter(|&i| writes_rbp(&mut info, &ins[i]))
        .filter(|&i| ins[i].mnemonic() == Mnemonic::Mov && ins[i].op1_register() == Register::RSP)
        .collect::<Vec<_>>();
    assert_eq!(frame.len(), 1, "{caller}: one mov rbp,rsp");
    assert!(
        calls.iter().all(|&c| frame[0] < c),
        "{caller}: frame before the call"
    );
    for i in (0..ins.len()).filter(|&i| writes_rbp(&mut info, &ins[i]) && i != frame[0]) {
        let next = ins.get(i + 1).map(|n| n.flow_control());
        assert!(
            ins[i].mnemonic() == Mnemonic::Pop
                && matches!(
                    next,
                    Some(FlowControl::Return | FlowControl::UnconditionalBranch)
                ),
            "{caller}: {} writes rbp outside its epilogue",
            ins[i]
        );
    }
    calls.iter().map(|&c| ins[c].next_ip()).collect()
}

/// `_start` clears RBP, then calls mini_cpu_init and mini_main without
/// writing RBP again: the return address of its call of mini_main.
fn start_clears_rbp(image: &Image) -> u64 {
    let ins = code(image, "_start");
    let main = image.addr("mini_main");
    let call = ins
        .iter()
        .position(|i| is_call_to(i, main))
        .expect("_start calls mini_main");
    let xor = ins[..call]
        .iter()
        .rposition(|i| {
            i.mnemonic() == Mnemonic::Xor
                && i.op0_register() == Register::EBP
                && i.op1_register() == Register::EBP
        })
        .expect("xor ebp,ebp before call mini_main");
    let first_call = ins
        .iter()
        .position(|i| i.flow_control() == FlowControl::Call)
        .expect("a call");
    assert!(xor < first_call, "RBP cleared before the first C call");
    let mut info = InstructionInfoFactory::new();
    assert!(
        !ins[xor + 1..call].iter().any(|i| writes_rbp(&mut info, i)),
        "_start writes rbp after clearing it"
    );
    ins[call].next_ip()
}

#[test]
fn stack_chains_are_frame_pointer_chains_in_every_build() {
    for name in BUILDS {
        let image = Image::load(&build(name));
        let start_ret = start_clears_rbp(&image);
        assert!(
            image.range("_start").contains(&start_ret),
            "{name}: mini_main returns into _start"
        );
        for chain in CHAINS {
            for pair in chain.windows(2) {
                let (callee, caller) = (pair[0], pair[1]);
                if caller != "_start" {
                    let rets = frame_then_call(&image, caller, callee);
                    assert!(
                        rets.iter().all(|r| image.range(caller).contains(r)),
                        "{name}: {caller}'s calls of {callee} return into it"
                    );
                }
            }
            println!("{name}: {} ok", chain.join(" <- "));
        }
    }
}
