//! What a vCPU does with each KVM_RUN result, as a pure function of the exit
//! (after Firecracker's `handle_kvm_exit`): port I/O goes to the devices, and
//! the rest becomes an [`Action`] for the vCPU thread. It needs no vCPU fd, so
//! tests drive it with constructed exits.

use std::collections::BTreeMap;

use kvm_bindings::{KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::VcpuExit;

use crate::devices::{Devices, MachineRequest};
use crate::layout::TRACE_PORT;
use crate::stop::{StopReason, VcpuError};

/// Exit kinds counted for `--stats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExitKind {
    Trap,
    PioOut,
    PioIn,
    MmioRead,
    MmioWrite,
    Kick,
    Assist,
    Hlt,
    Shutdown,
    SystemEvent,
    Other,
}

impl ExitKind {
    pub const ALL: [ExitKind; 11] = [
        ExitKind::Trap,
        ExitKind::PioOut,
        ExitKind::PioIn,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::Kick,
        ExitKind::Assist,
        ExitKind::Hlt,
        ExitKind::Shutdown,
        ExitKind::SystemEvent,
        ExitKind::Other,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ExitKind::Trap => "trace-trap",
            ExitKind::PioOut => "pio-out",
            ExitKind::PioIn => "pio-in",
            ExitKind::MmioRead => "mmio-read",
            ExitKind::MmioWrite => "mmio-write",
            ExitKind::Kick => "kick (EINTR)",
            ExitKind::Assist => "emulation-assist",
            ExitKind::Hlt => "hlt",
            ExitKind::Shutdown => "shutdown",
            ExitKind::SystemEvent => "system-event",
            ExitKind::Other => "other",
        }
    }
}

/// What one vCPU did.
#[derive(Clone, Debug, Default)]
pub struct VcpuStats {
    pub exits: [u64; ExitKind::ALL.len()],
    /// Emulation assists by instruction.
    pub assists: BTreeMap<&'static str, u64>,
}

impl VcpuStats {
    pub(crate) fn count(&mut self, k: ExitKind) {
        self.exits[k as usize] += 1;
    }
    pub fn get(&self, k: ExitKind) -> u64 {
        self.exits[k as usize]
    }
}

/// What the vCPU thread does after an exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run the guest again.
    Resume,
    /// A patched site wrote the trace port: call the trap handler.
    Trap,
    /// KVM's emulator gave up: try the emulation assist.
    Assist,
    /// The vCPU triple-faulted; the caller adds RIP to the stop reason.
    TripleFault,
    /// The run ends.
    Stop(StopReason),
}

/// The port bus, as the exit handler sees it (the VM's `Devices`, or a test's
/// recorder).
pub trait PortBus {
    fn pio_in(&self, port: u16, data: &mut [u8]);
    fn pio_out(&self, port: u16, data: &[u8]) -> Option<MachineRequest>;
}

impl PortBus for Devices {
    fn pio_in(&self, port: u16, data: &mut [u8]) {
        Devices::pio_in(self, port, data)
    }
    fn pio_out(&self, port: u16, data: &[u8]) -> Option<MachineRequest> {
        Devices::pio_out(self, port, data)
    }
}

/// Handle one KVM_RUN result of vCPU `cpu`. `io_size` is `kvm_run.io.size`
/// (bytes per element) for an I/O exit: string I/O (`rep outsb`, `rep insb`)
/// exits once with `count` elements of `size` bytes, and each element is one
/// access to the device, in order.
pub fn handle_exit<B: PortBus + ?Sized>(
    cpu: usize,
    exit: Result<VcpuExit<'_>, kvm_ioctls::Error>,
    io_size: u8,
    bus: &B,
) -> (ExitKind, Action) {
    // KVM gives 1, 2 or 4; never let a bad value make the chunking panic.
    let size = usize::from(io_size).max(1);
    let exit = match exit {
        Ok(exit) => exit,
        // A kick (see pause.rs): go back and look at the flags.
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            return (ExitKind::Kick, Action::Resume)
        }
        Err(source) => return (ExitKind::Other, stop(VcpuError::KvmRun { cpu, source })),
    };
    match exit {
        VcpuExit::IoOut(TRACE_PORT, _) => (ExitKind::Trap, Action::Trap),
        VcpuExit::IoOut(port, data) => {
            for element in data.chunks(size) {
                if let Some(req) = bus.pio_out(port, element) {
                    // The machine goes away: the rest of the string is moot.
                    let reason = match req {
                        MachineRequest::PowerOff(status) => StopReason::PowerOff(status),
                        MachineRequest::AcpiPowerOff => StopReason::AcpiPowerOff,
                        MachineRequest::Reset => StopReason::Reset,
                    };
                    return (ExitKind::PioOut, Action::Stop(reason));
                }
            }
            (ExitKind::PioOut, Action::Resume)
        }
        VcpuExit::IoIn(port, data) => {
            for element in data.chunks_mut(size) {
                bus.pio_in(port, element);
            }
            (ExitKind::PioIn, Action::Resume)
        }
        VcpuExit::MmioRead(_, data) => {
            data.fill(0xff); // nothing is mapped there
            (ExitKind::MmioRead, Action::Resume)
        }
        VcpuExit::MmioWrite(..) => (ExitKind::MmioWrite, Action::Resume),
        VcpuExit::Shutdown => (ExitKind::Shutdown, Action::TripleFault),
        VcpuExit::Hlt => (ExitKind::Hlt, stop(VcpuError::Halted { cpu })),
        VcpuExit::InternalError => (ExitKind::Assist, Action::Assist),
        VcpuExit::SystemEvent(kind, _) => (
            ExitKind::SystemEvent,
            Action::Stop(match kind {
                KVM_SYSTEM_EVENT_SHUTDOWN => StopReason::PowerOff(0),
                KVM_SYSTEM_EVENT_RESET => StopReason::Reset,
                KVM_SYSTEM_EVENT_CRASH => StopReason::Crash { cpu },
                _ => VcpuError::SystemEvent { cpu, kind }.into(),
            }),
        ),
        VcpuExit::FailEntry(reason, _) => {
            (ExitKind::Other, stop(VcpuError::FailEntry { cpu, reason }))
        }
        other => {
            let exit = format!("{other:?}");
            (
                ExitKind::Other,
                stop(VcpuError::UnexpectedExit { cpu, exit }),
            )
        }
    }
}

fn stop(e: VcpuError) -> Action {
    Action::Stop(StopReason::Error(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    use crate::layout::{I8042_COMMAND_PORT, POWEROFF_PORT, SERIAL_PORT_BASE};

    /// Records every access; reads return 0x10, 0x11, ... in order.
    #[derive(Default)]
    struct Recorder {
        outs: RefCell<Vec<(u16, Vec<u8>)>>,
        ins: RefCell<Vec<(u16, usize)>>,
    }

    impl PortBus for Recorder {
        fn pio_in(&self, port: u16, data: &mut [u8]) {
            let mut ins = self.ins.borrow_mut();
            data.fill(0x10 + ins.len() as u8);
            ins.push((port, data.len()));
        }
        fn pio_out(&self, port: u16, data: &[u8]) -> Option<MachineRequest> {
            self.outs.borrow_mut().push((port, data.to_vec()));
            match port {
                POWEROFF_PORT => Some(MachineRequest::PowerOff(data[0])),
                I8042_COMMAND_PORT => Some(MachineRequest::Reset),
                _ => None,
            }
        }
    }

    fn handle(exit: VcpuExit<'_>, io_size: u8, bus: &Recorder) -> (ExitKind, Action) {
        handle_exit(2, Ok(exit), io_size, bus)
    }

    fn error(e: VcpuError) -> Action {
        Action::Stop(StopReason::Error(e))
    }

    #[test]
    fn one_byte_out_and_in() {
        let bus = Recorder::default();
        let r = handle(VcpuExit::IoOut(SERIAL_PORT_BASE, b"x"), 1, &bus);
        assert_eq!(r, (ExitKind::PioOut, Action::Resume));
        assert_eq!(*bus.outs.borrow(), [(SERIAL_PORT_BASE, b"x".to_vec())]);
        let mut data = [0u8; 1];
        let r = handle(VcpuExit::IoIn(SERIAL_PORT_BASE + 5, &mut data), 1, &bus);
        assert_eq!(r, (ExitKind::PioIn, Action::Resume));
        assert_eq!(data, [0x10]);
    }

    #[test]
    fn string_out_delivers_every_element_in_order() {
        let bus = Recorder::default();
        let text = b"mini: rep outsb ok\n";
        let r = handle(VcpuExit::IoOut(SERIAL_PORT_BASE, text), 1, &bus);
        assert_eq!(r, (ExitKind::PioOut, Action::Resume));
        let got: Vec<u8> = bus.outs.borrow().iter().flat_map(|o| o.1.clone()).collect();
        assert_eq!(got, text);
        assert_eq!(bus.outs.borrow().len(), text.len());
        // `rep outsw`: three 2-byte elements.
        let bus = Recorder::default();
        let r = handle(VcpuExit::IoOut(0x80, &[1, 2, 3, 4, 5, 6]), 2, &bus);
        assert_eq!(r, (ExitKind::PioOut, Action::Resume));
        assert_eq!(
            *bus.outs.borrow(),
            [(0x80, vec![1, 2]), (0x80, vec![3, 4]), (0x80, vec![5, 6])]
        );
        // A whole page of bytes.
        let bus = Recorder::default();
        let page = vec![b'a'; 4096];
        handle(VcpuExit::IoOut(SERIAL_PORT_BASE, &page), 1, &bus);
        assert_eq!(bus.outs.borrow().len(), 4096);
    }

    #[test]
    fn string_in_fills_every_element_in_order() {
        let bus = Recorder::default();
        let mut data = [0u8; 8];
        let r = handle(VcpuExit::IoIn(SERIAL_PORT_BASE + 5, &mut data), 1, &bus);
        assert_eq!(r, (ExitKind::PioIn, Action::Resume));
        assert_eq!(data, [0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17]);
        // `rep insd`: two 4-byte elements.
        let bus = Recorder::default();
        let mut data = [0u8; 8];
        handle(VcpuExit::IoIn(0x60, &mut data), 4, &bus);
        assert_eq!(data, [0x10, 0x10, 0x10, 0x10, 0x11, 0x11, 0x11, 0x11]);
        assert_eq!(*bus.ins.borrow(), [(0x60, 4), (0x60, 4)]);
    }

    #[test]
    fn power_off_and_reset_ports_stop_the_run() {
        let bus = Recorder::default();
        let r = handle(VcpuExit::IoOut(POWEROFF_PORT, &[3]), 1, &bus);
        assert_eq!(r, (ExitKind::PioOut, Action::Stop(StopReason::PowerOff(3))));
        let r = handle(VcpuExit::IoOut(I8042_COMMAND_PORT, &[0xfe]), 1, &bus);
        assert_eq!(r, (ExitKind::PioOut, Action::Stop(StopReason::Reset)));
        // The first element that powers off ends the string.
        let bus = Recorder::default();
        let r = handle(VcpuExit::IoOut(POWEROFF_PORT, &[7, 8, 9]), 1, &bus);
        assert_eq!(r.1, Action::Stop(StopReason::PowerOff(7)));
        assert_eq!(bus.outs.borrow().len(), 1);
    }

    #[test]
    fn trace_port_is_a_trap_and_reaches_no_device() {
        let bus = Recorder::default();
        let r = handle(VcpuExit::IoOut(TRACE_PORT, &[0]), 1, &bus);
        assert_eq!(r, (ExitKind::Trap, Action::Trap));
        assert!(bus.outs.borrow().is_empty());
    }

    #[test]
    fn mmio_reads_all_ones_and_writes_are_ignored() {
        let bus = Recorder::default();
        let mut data = [0u8; 4];
        let r = handle(VcpuExit::MmioRead(0xfed0_0000, &mut data), 0, &bus);
        assert_eq!(r, (ExitKind::MmioRead, Action::Resume));
        assert_eq!(data, [0xff; 4]);
        let r = handle(VcpuExit::MmioWrite(0xfed0_0000, &[1]), 0, &bus);
        assert_eq!(r, (ExitKind::MmioWrite, Action::Resume));
    }

    #[test]
    fn shutdown_hlt_and_emulation_failure() {
        let bus = Recorder::default();
        assert_eq!(
            handle(VcpuExit::Shutdown, 0, &bus),
            (ExitKind::Shutdown, Action::TripleFault)
        );
        assert_eq!(
            handle(VcpuExit::Hlt, 0, &bus),
            (ExitKind::Hlt, error(VcpuError::Halted { cpu: 2 }))
        );
        assert_eq!(
            handle(VcpuExit::InternalError, 0, &bus),
            (ExitKind::Assist, Action::Assist)
        );
    }

    #[test]
    fn system_events_power_off_reset_crash_or_fail() {
        let bus = Recorder::default();
        let event = |kind| handle(VcpuExit::SystemEvent(kind, &[]), 0, &bus).1;
        assert_eq!(
            event(KVM_SYSTEM_EVENT_SHUTDOWN),
            Action::Stop(StopReason::PowerOff(0))
        );
        assert_eq!(
            event(KVM_SYSTEM_EVENT_RESET),
            Action::Stop(StopReason::Reset)
        );
        assert_eq!(
            event(KVM_SYSTEM_EVENT_CRASH),
            Action::Stop(StopReason::Crash { cpu: 2 })
        );
        let wakeup = kvm_bindings::KVM_SYSTEM_EVENT_WAKEUP;
        assert_eq!(
            event(wakeup),
            error(VcpuError::SystemEvent {
                cpu: 2,
                kind: wakeup
            })
        );
        let Action::Stop(r) = event(77) else {
            panic!("an unknown event stops the run")
        };
        assert!(r.to_string().contains("system event 77"), "{r}");
    }

    #[test]
    fn kicks_resume_and_other_errors_stop() {
        let bus = Recorder::default();
        for errno in [libc::EINTR, libc::EAGAIN] {
            let r = handle_exit(0, Err(kvm_ioctls::Error::new(errno)), 0, &bus);
            assert_eq!(r, (ExitKind::Kick, Action::Resume));
        }
        let source = kvm_ioctls::Error::new(libc::EFAULT);
        let r = handle_exit(0, Err(source), 0, &bus);
        assert_eq!(
            r,
            (ExitKind::Other, error(VcpuError::KvmRun { cpu: 0, source }))
        );
    }

    #[test]
    fn failed_entry_and_unexpected_exits_stop_and_say_which() {
        let bus = Recorder::default();
        assert_eq!(
            handle(VcpuExit::FailEntry(0x21, 0), 0, &bus),
            (
                ExitKind::Other,
                error(VcpuError::FailEntry {
                    cpu: 2,
                    reason: 0x21
                })
            )
        );
        let (kind, Action::Stop(r)) = handle(VcpuExit::IrqWindowOpen, 0, &bus) else {
            panic!("an unexpected exit stops the run")
        };
        assert_eq!(kind, ExitKind::Other);
        assert_eq!(r.to_string(), "vCPU 2: unexpected exit IrqWindowOpen");
    }

    #[test]
    fn a_zero_io_size_does_not_panic() {
        let bus = Recorder::default();
        handle(VcpuExit::IoOut(SERIAL_PORT_BASE, b"ab"), 0, &bus);
        assert_eq!(bus.outs.borrow().len(), 2);
    }
}
