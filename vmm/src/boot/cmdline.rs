//! The guest kernel's command line: vmtrace's defaults for the kernel and
//! the host, then the caller's words.

use super::{BootError, KernelKind};
use crate::layout;

/// Linux command line: serial console, reboot through the keyboard controller
/// (the run then ends), reboot at once on panic. KASLR stays on: the tracer
/// finds the kernel's offsets at attach.
pub const LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";
/// What a host whose KVM runs guest ring 0 in its instruction emulator cannot
/// run (see docs/emulating-kvm.md): XSAVE, CMPXCHG16B, POPCNT, SMAP's clac/stac,
/// and `lsl`, which Linux's NMI entry (`paranoid_entry`) runs to find its
/// per-CPU base when FSGSBASE is on: an NMI (an RCU stall's backtrace on
/// this slow host) would stop the guest. Without FSGSBASE it reads the GS
/// base MSR instead.
pub const EMULATOR_HOST_CMDLINE: &str = "noxsave nofsgsbase clearcpuid=cx16,popcnt,smap";

/// What the caller asks of the command line.
#[derive(Clone, Copy, Debug)]
pub enum Cmdline<'a> {
    /// vmtrace's defaults, then these words (whitespace-separated).
    Append(&'a [String]),
    /// Exactly this line.
    Replace(&'a str),
}

/// The command line for a `kind` kernel on a host that does or does not
/// emulate guest ring 0, checked against the space the boot protocols give.
pub fn kernel_cmdline(
    kind: KernelKind,
    emulator_host: bool,
    words: Cmdline<'_>,
) -> Result<String, BootError> {
    let line = match words {
        Cmdline::Replace(s) => s.to_owned(),
        Cmdline::Append(extra) => {
            let mut words: Vec<String> = Vec::new();
            if kind.is_linux() {
                words.extend(LINUX_CMDLINE.split(' ').map(str::to_owned));
                if emulator_host {
                    words.extend(EMULATOR_HOST_CMDLINE.split(' ').map(str::to_owned));
                }
            }
            for w in extra.iter().flat_map(|c| c.split_whitespace()) {
                merge_word(&mut words, w);
            }
            words.join(" ")
        }
    };
    // The loader stores it NUL-terminated.
    let max = layout::CMDLINE_MAX_SIZE - 1;
    if line.len() > max {
        return Err(BootError::CmdlineTooLong {
            len: line.len(),
            max,
        });
    }
    Ok(line)
}

/// Append a command-line word. Linux honours only the last `clearcpuid=`, so
/// a caller's list is merged into ours instead of silently replacing it.
fn merge_word(words: &mut Vec<String>, word: &str) {
    const CLEARCPUID: &str = "clearcpuid=";
    if let Some(list) = word.strip_prefix(CLEARCPUID) {
        if let Some(ours) = words.iter_mut().find(|w| w.starts_with(CLEARCPUID)) {
            ours.push(',');
            ours.push_str(list);
            return;
        }
    }
    words.push(word.to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearcpuid_lists_are_merged() {
        let mut w = vec![
            "console=ttyS0".to_string(),
            "clearcpuid=cx16,smap".to_string(),
        ];
        merge_word(&mut w, "clearcpuid=erms");
        merge_word(&mut w, "quiet");
        assert_eq!(w, ["console=ttyS0", "clearcpuid=cx16,smap,erms", "quiet"]);
        let mut w = Vec::new();
        merge_word(&mut w, "clearcpuid=erms");
        assert_eq!(w, ["clearcpuid=erms"]);
    }

    #[test]
    fn command_line_by_kind() {
        let extra = ["quiet clearcpuid=erms".to_string()];
        let a = Cmdline::Append(&extra);
        assert_eq!(
            kernel_cmdline(KernelKind::LinuxElf, true, a).unwrap(),
            format!("{LINUX_CMDLINE} noxsave nofsgsbase clearcpuid=cx16,popcnt,smap,erms quiet")
        );
        assert_eq!(
            kernel_cmdline(KernelKind::BzImage, false, a).unwrap(),
            format!("{LINUX_CMDLINE} quiet clearcpuid=erms")
        );
        assert_eq!(
            kernel_cmdline(KernelKind::Elf, true, a).unwrap(),
            "quiet clearcpuid=erms"
        );
        assert_eq!(
            kernel_cmdline(KernelKind::BzImage, true, Cmdline::Replace("root=/dev/vda")).unwrap(),
            "root=/dev/vda"
        );
        let long = ["x".repeat(layout::CMDLINE_MAX_SIZE)];
        assert!(matches!(
            kernel_cmdline(KernelKind::Elf, false, Cmdline::Append(&long)),
            Err(BootError::CmdlineTooLong { .. })
        ));
    }
}
