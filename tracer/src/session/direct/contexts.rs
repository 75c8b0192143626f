//! No guest context may be inside a direct site's displaced bytes (past
//! their first) when they change: it would resume in the middle of the
//! jump. Under the pause, for every vCPU in kernel mode: its RIP, and every
//! word of its stack from RSP to the top of its stack (interrupted
//! contexts' saved RIPs and return addresses are there; a stale word counts
//! too, which only delays the site). A task switched out keeps only return
//! addresses of calls, and a displaced `call` is always the last displaced
//! instruction (the jump needs 5 bytes, a call is 5): its return address
//! is past the displaced bytes. So on a kernel that cannot preempt a task
//! in kernel mode, the vCPUs are all there is to check (preemptible ones
//! are refused, `crate::plan::build`).

use vmm::gva::AddressSpace;

/// Linux x86-64's kernel stacks (task and IRQ) are 16 KiB, aligned to
/// their size (THREAD_SIZE, IRQ_STACK_SIZE without KASAN).
pub const STACK_SIZE: u64 = 16 << 10;

/// A vCPU as the check needs it.
#[derive(Clone, Copy, Debug)]
pub struct VcpuRegs {
    pub cpu: usize,
    pub rip: u64,
    pub rsp: u64,
    /// It runs at CPL 3: no kernel context to check.
    pub user_mode: bool,
}

/// A context found inside a site's displaced bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy {
    /// Index of the site (into the ranges given).
    pub k: usize,
    pub cpu: usize,
    /// The address inside the displaced bytes.
    pub at: u64,
    /// Where it was: the vCPU's RIP, or a word on its stack.
    pub on_stack: bool,
}

/// The sites of `ranges` (running `(start, end)` of each site's displaced
/// bytes, by site) that some context of `vcpus` is inside.
pub fn find(space: &mut AddressSpace<'_>, ranges: &[(u64, u64)], vcpus: &[VcpuRegs]) -> Vec<Busy> {
    let mut sorted: Vec<(u64, u64, usize)> = ranges
        .iter()
        .enumerate()
        .map(|(k, &(s, e))| (s, e, k))
        .collect();
    sorted.sort_unstable();
    let inside = |a: u64| {
        let i = sorted.partition_point(|r| r.0 < a).checked_sub(1)?;
        let (s, e, k) = sorted[i];
        (a > s && a < e).then_some(k)
    };
    let mut busy = Vec::new();
    for v in vcpus.iter().filter(|v| !v.user_mode) {
        if let Some(k) = inside(v.rip) {
            busy.push(Busy {
                k,
                cpu: v.cpu,
                at: v.rip,
                on_stack: false,
            });
        }
        for word in stack_words(space, v.rsp) {
            if let Some(k) = inside(word) {
                busy.push(Busy {
                    k,
                    cpu: v.cpu,
                    at: word,
                    on_stack: true,
                });
            }
        }
    }
    busy
}

/// The words from `rsp` to the top of its stack, page by page, up to the
/// first page that cannot be read.
fn stack_words(space: &mut AddressSpace<'_>, rsp: u64) -> Vec<u64> {
    const PAGE: u64 = 4096;
    let rsp = rsp & !7;
    let top = (rsp | (STACK_SIZE - 1)).wrapping_add(1);
    let mut words = Vec::new();
    let mut at = rsp;
    while at < top && at != 0 {
        let end = ((at | (PAGE - 1)) + 1).min(top);
        let mut buf = vec![0u8; (end - at) as usize];
        if space.read(at, &mut buf).is_err() {
            break;
        }
        words.extend(
            buf.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8"))),
        );
        at = end;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    use vmm::gva::PagingMode;

    #[test]
    fn a_rip_or_a_stack_word_inside_the_displaced_bytes_is_found() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        vmm::boot::regs::setup_page_tables(&mem).unwrap();
        let base = 0xffff_ffff_8100_0000u64;
        let ranges = [(base + 0x100, base + 0x107), (base + 0x200, base + 0x205)];
        // A stack at 0x20_0000..0x20_4000 (16 KiB aligned), RSP near its top.
        let stack_top = 0x20_4000u64;
        let rsp = stack_top - 0x40;
        mem.write_obj(base + 0x203, GuestAddress(rsp + 0x18))
            .unwrap();
        // Below RSP: dead, not read.
        mem.write_obj(base + 0x101, GuestAddress(rsp - 8)).unwrap();
        let mut space = AddressSpace::new(&mem, vmm::layout::PML4_START, PagingMode::Level4);
        let v = |cpu, rip, user_mode| VcpuRegs {
            cpu,
            rip,
            rsp,
            user_mode,
        };
        let busy = find(&mut space, &ranges, &[v(0, base + 0x102, false)]);
        assert_eq!(
            busy,
            [
                Busy {
                    k: 0,
                    cpu: 0,
                    at: base + 0x102,
                    on_stack: false
                },
                Busy {
                    k: 1,
                    cpu: 0,
                    at: base + 0x203,
                    on_stack: true
                },
            ]
        );
        // The first byte is fine (the jump is there), and so is a user-mode vCPU.
        let busy = find(
            &mut space,
            &ranges[..1],
            &[v(0, base + 0x100, false), v(1, base + 0x103, true)],
        );
        assert!(busy.is_empty(), "{busy:?}");
    }
}
