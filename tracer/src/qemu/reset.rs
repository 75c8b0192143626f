//! Was the machine reset? Told without QMP events: vmtrace holds QEMU's
//! monitor only for short bursts (`super::monitor`), and an event sent
//! between two bursts reaches nobody. A reset leaves no trace in QEMU's
//! run state (`query-status` says `running` throughout: runstate.c's
//! main_loop_should_exit resets the machine between pause_all_vcpus and
//! resume_all_vcpus), nor does QEMU clear RAM. What it does change is the
//! vCPUs: CPU 0 (the boot CPU) runs the firmware with paging off, then the
//! next kernel's decompressor at low addresses, then the next kernel, at
//! another KASLR offset. Each look reads CPU 0's state (HMP `info
//! registers`: QMP's `human-monitor-command` always asks the first CPU)
//! and takes either for a reset:
//! - at CPL 0, paging off: firmware (a running kernel never turns it off);
//! - at CPL 0, code at a user-half address, on two looks in a row:
//!   firmware or a kernel's early boot (a running kernel executes only at
//!   kernel-half addresses; but a look can catch a `syscall` or an
//!   interrupt from user mode half done, CPL 0 set and RIP not yet:
//!   target/i386/tcg/seg_helper.c's helper_syscall sets CS before EIP);
//! - at CPL 0, code in the kernel image's area (`__START_KERNEL_map`, 1
//!   GiB) but outside the traced kernel's image: another kernel.
//!
//! Watched on QEMU 7.2/TCG (docs/attach.md), the firmware's paging-off
//! phase after a reset or a triple fault outlasts many 50 ms looks.

use std::ops::Range;

use super::liveness::RunState;
use super::qmp::QmpEvents;

/// The kernel image's virtual area (arch/x86/include/asm/page_64_types.h:
/// `__START_KERNEL_map`, `KERNEL_IMAGE_SIZE` with KASLR): only a kernel's
/// image executes there (modules start above it).
const IMAGE_AREA: Range<u64> = 0xffff_ffff_8000_0000..0xffff_ffff_c000_0000;
/// Addresses from here up are the kernel half.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// CR0.PG.
const CR0_PG: u64 = 1 << 31;

/// CPU 0 as HMP's `info registers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuView {
    /// RIP (EIP outside long mode).
    pub rip: u64,
    pub cr0: u64,
    pub cpl: u8,
    /// In system management mode (the firmware's, at any time).
    pub smm: bool,
}

impl CpuView {
    /// From `info registers` (target/i386/cpu-dump.c's x86_cpu_dump_state):
    /// `RIP=...` (`EIP=` outside long mode), `CPL=`, `SMM=`, `CR0=`.
    pub fn parse(text: &str) -> Option<CpuView> {
        let field = |key: &str| {
            let at = text.find(key)? + key.len();
            let hex: String = text[at..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect();
            u64::from_str_radix(&hex, 16).ok()
        };
        Some(CpuView {
            rip: field("RIP=").or_else(|| field("EIP="))?,
            cr0: field("CR0=")?,
            cpl: u8::try_from(field(" CPL=")?).ok()?,
            smm: field(" SMM=")? != 0,
        })
    }
}

/// What a look saw: QEMU's run state, the events of its burst (if any
/// came during it), CPU 0.
pub struct LookSeen<'a> {
    pub status: &'a str,
    pub events: &'a QmpEvents,
    pub cpu0: Option<&'a CpuView>,
}

/// What a look makes of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The traced kernel runs (or is stopped: someone else's stop, which
    /// `RunState` carries, or vmtrace's own).
    GoOn(RunState),
    /// The machine was reset or shut down: why.
    Reset(String),
    /// The guest suspended to RAM (S3).
    Suspended,
    /// Go on, but CPU 0 ran code at a user-half address at CPL 0: the same
    /// on the next look is a reset.
    Suspect(RunState),
}

/// The decision: from what a look saw to go on, reset or suspended.
/// `image`: where the traced kernel's image runs (None when unknown);
/// `suspected`: the last look's verdict was `Suspect`.
pub fn judge(seen: &LookSeen<'_>, image: Option<&Range<u64>>, suspected: bool) -> Verdict {
    let ev = seen.events;
    let shutdown = ev
        .shutdown
        .clone()
        .filter(|w| w != "guest-reset" && w != "host-qmp-quit");
    if let Some(why) = ev.reset.clone().or(shutdown) {
        return Verdict::Reset(why);
    }
    if ev.suspend || seen.status == "suspended" {
        return Verdict::Suspended;
    }
    match seen.status {
        // Powered off (QEMU kept by -no-shutdown), or reset while stopped.
        "shutdown" | "prelaunch" => return Verdict::Reset(seen.status.to_string()),
        _ => {}
    }
    let state = RunState::parse(seen.status);
    match seen.cpu0.map(|c| elsewhere(c, image)) {
        Some(Sign::Sure(why)) => Verdict::Reset(why),
        Some(Sign::Twice(why)) if suspected => Verdict::Reset(why),
        Some(Sign::Twice(_)) => Verdict::Suspect(state),
        Some(Sign::None) | None => Verdict::GoOn(state),
    }
}

/// What CPU 0 shows of the kernel it runs.
enum Sign {
    None,
    /// Not the traced kernel, whatever the timing of the look.
    Sure(String),
    /// Not the traced kernel if seen twice in a row.
    Twice(String),
}

/// Why CPU 0 does not run the traced kernel, if it shows that it does not.
fn elsewhere(cpu: &CpuView, image: Option<&Range<u64>>) -> Sign {
    // User mode, or SMM (the firmware's handler, at any time): no sign.
    if cpu.cpl != 0 || cpu.smm {
        return Sign::None;
    }
    if cpu.cr0 & CR0_PG == 0 {
        return Sign::Sure(format!(
            "CPU 0 runs firmware (RIP {:#x}, paging off)",
            cpu.rip
        ));
    }
    if cpu.rip < KERNEL_HALF {
        return Sign::Twice(format!(
            "CPU 0 runs firmware or a kernel's early boot (RIP {:#x})",
            cpu.rip
        ));
    }
    match image {
        Some(image) if IMAGE_AREA.contains(&cpu.rip) && !image.contains(&cpu.rip) => {
            Sign::Sure(format!(
                "CPU 0 runs another kernel (RIP {:#x}, outside the traced kernel's image \
                 {:#x}-{:#x})",
                cpu.rip, image.start, image.end
            ))
        }
        _ => Sign::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU 0 of the default guest under QEMU 7.2/TCG, captured: idle in
    /// the kernel; in SeaBIOS 5 ms after `system_reset`; in the next
    /// kernel's decompressor.
    const KERNEL: &str = "RAX=0000000000000000 RBX=0000000000000000\n\
        RIP=ffffffff8a3b693b RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\n\
        CR0=80050033 CR2=0000000000401000 CR3=0000000000483000 CR4=000006b0\n";
    const FIRMWARE: &str = "EAX=00000000 EBX=00000000\n\
        EIP=000efa80 EFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0\n\
        CR0=00000011 CR2=00000000 CR3=00000000 CR4=00000000\n";
    const DECOMPRESSOR: &str =
        "RIP=00000000001002a2 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0\n\
        CR0=80000011 CR2=0000000000000000 CR3=0000000001eb5000 CR4=00000020\n";
    const USER: &str = "RIP=0000000000401491 RFL=00000246 [---Z-P-] CPL=3 II=0 A20=1 SMM=0 HLT=0\n\
        CR0=80050033 CR2=0000000000401000 CR3=000000000043c000 CR4=000006b0\n";
    const IMAGE: Range<u64> = 0xffff_ffff_8a00_0000..0xffff_ffff_8c00_0000;

    fn judged(status: &str, events: QmpEvents, regs: Option<&str>) -> Verdict {
        judged_after(false, status, events, regs)
    }

    fn judged_after(
        suspected: bool,
        status: &str,
        events: QmpEvents,
        regs: Option<&str>,
    ) -> Verdict {
        let cpu = regs.map(|r| CpuView::parse(r).unwrap());
        let seen = LookSeen {
            status,
            events: &events,
            cpu0: cpu.as_ref(),
        };
        judge(&seen, Some(&IMAGE), suspected)
    }

    #[test]
    fn info_registers_is_read_in_long_mode_and_outside_it() {
        let k = CpuView::parse(KERNEL).unwrap();
        assert_eq!(
            (k.rip, k.cr0, k.cpl, k.smm),
            (0xffff_ffff_8a3b_693b, 0x8005_0033, 0, false)
        );
        let f = CpuView::parse(FIRMWARE).unwrap();
        assert_eq!((f.rip, f.cr0 & CR0_PG), (0xefa80, 0));
        assert_eq!(CpuView::parse(USER).unwrap().cpl, 3);
        assert_eq!(CpuView::parse("unknown command: 'info'"), None);
    }

    #[test]
    fn the_traced_kernel_or_its_user_space_goes_on() {
        let none = QmpEvents::default;
        for regs in [KERNEL, USER] {
            assert_eq!(
                judged("running", none(), Some(regs)),
                Verdict::GoOn(RunState::Running)
            );
        }
        assert_eq!(
            judged("running", none(), None),
            Verdict::GoOn(RunState::Running)
        );
        // Someone else's stop, with the kernel where it was.
        assert_eq!(
            judged("paused", none(), Some(KERNEL)),
            Verdict::GoOn(RunState::Stopped("paused".into()))
        );
        // vmtrace's own code (exitless) is above the image area.
        let own = KERNEL.replace("ffffffff8a3b693b", "ffffffffff800040");
        assert_eq!(
            judged("running", none(), Some(&own)),
            Verdict::GoOn(RunState::Running)
        );
        // SMM runs the firmware's handler at any time.
        let smm = FIRMWARE.replace("SMM=0", "SMM=1");
        assert_eq!(
            judged("running", none(), Some(&smm)),
            Verdict::GoOn(RunState::Running)
        );
    }

    #[test]
    fn firmware_early_boot_or_another_kernel_is_a_reset() {
        let none = QmpEvents::default;
        let v = judged("running", none(), Some(FIRMWARE));
        assert!(
            matches!(&v, Verdict::Reset(w) if w.contains("paging off")),
            "{v:?}"
        );
        // Paging on, a user-half RIP at CPL 0: a syscall half entered, or
        // the decompressor; the decompressor if seen twice.
        assert_eq!(
            judged("running", none(), Some(DECOMPRESSOR)),
            Verdict::Suspect(RunState::Running)
        );
        let v = judged_after(true, "running", none(), Some(DECOMPRESSOR));
        assert!(
            matches!(&v, Verdict::Reset(w) if w.contains("early boot")),
            "{v:?}"
        );
        assert_eq!(
            judged_after(true, "running", none(), Some(KERNEL)),
            Verdict::GoOn(RunState::Running)
        );
        // The next kernel, at another KASLR offset.
        let next = KERNEL.replace("ffffffff8a3b693b", "ffffffff915a53ce");
        let v = judged("running", none(), Some(&next));
        assert!(
            matches!(&v, Verdict::Reset(w) if w.contains("another kernel")),
            "{v:?}"
        );
        // Without the image's bounds, only the firmware is told.
        let cpu = CpuView::parse(&next).unwrap();
        let seen = LookSeen {
            status: "running",
            events: &none(),
            cpu0: Some(&cpu),
        };
        assert_eq!(judge(&seen, None, false), Verdict::GoOn(RunState::Running));
        for status in ["shutdown", "prelaunch"] {
            assert_eq!(
                judged(status, none(), Some(KERNEL)),
                Verdict::Reset(status.into())
            );
        }
    }

    #[test]
    fn events_seen_in_a_burst_and_a_suspend_are_taken() {
        let reset = QmpEvents {
            reset: Some("guest-reset".into()),
            ..QmpEvents::default()
        };
        assert_eq!(
            judged("running", reset, Some(KERNEL)),
            Verdict::Reset("guest-reset".into())
        );
        // A reboot's SHUTDOWN(guest-reset) comes with its RESET; alone it
        // says nothing more.
        let rebooting = QmpEvents {
            shutdown: Some("guest-reset".into()),
            ..QmpEvents::default()
        };
        assert_eq!(
            judged("running", rebooting, Some(KERNEL)),
            Verdict::GoOn(RunState::Running)
        );
        assert_eq!(
            judged("suspended", QmpEvents::default(), Some(KERNEL)),
            Verdict::Suspended
        );
    }
}
