//! The few devices a guest kernel needs: the COM1 UART, the i8042 reset line,
//! vmtrace's power-off port and the ACPI PM1a registers (`acpi_pm`).
//! Everything else on the port bus reads as all-ones and ignores writes, like
//! an empty ISA bus.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vm_superio::{I8042Device, Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi_pm::{Pm1, PmRequest};
use crate::layout;
// A poisoned device lock only means another vCPU thread panicked mid-access;
// the device state is still usable for the rest of the shutdown.
use crate::sys::lock;

/// An eventfd as a vm-superio interrupt trigger (the UART's IRQ line, wired to
/// the in-kernel irqchip with an irqfd).
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// What the guest asked the machine to do, seen on the port bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineRequest {
    PowerOff(u8),
    /// ACPI S5 through PM1a_CNT (an ACPI guest's `poweroff`).
    AcpiPowerOff,
    Reset,
}

/// The i8042's reset line: it records the request; the vCPU that wrote it
/// stops the run.
#[derive(Clone, Default)]
pub struct ResetLine(Arc<AtomicBool>);

impl Trigger for ResetLine {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// Lines kept from the console for error messages.
const CONSOLE_TAIL_LINES: usize = 20;
/// Longest line kept: a guest that never prints a newline must not grow host
/// memory, so a longer line is cut here and kept as lines of this length (its
/// bytes still all reach the sink).
const CONSOLE_LINE_MAX: usize = 4096;
/// What Linux prints when it panics (kernel/panic.c).
const PANIC_MARKER: &str = "Kernel panic - not syncing";

/// The marker is matched a byte at a time with no backtracking, which is
/// exact only if its first byte occurs nowhere else in it: after a mismatch
/// no match can then have started inside the bytes matched so far.
const _: () = {
    let m = PANIC_MARKER.as_bytes();
    let mut i = 1;
    while i < m.len() {
        assert!(m[i] != m[0], "PANIC_MARKER needs a unique first byte");
        i += 1;
    }
};

/// The console: bytes from the UART go to the user's sink; lines (cut at
/// [`CONSOLE_LINE_MAX`]) are kept for the end-of-run message, and the bytes
/// are scanned for a kernel panic as they arrive, each byte once.
pub struct Console {
    out: Box<dyn Write + Send>,
    /// The current line, at most `CONSOLE_LINE_MAX` bytes.
    line: Vec<u8>,
    /// Bytes of `PANIC_MARKER` that end the bytes seen so far on this line
    /// (across cuts of a long line, not across newlines).
    marker_matched: usize,
    /// Where in `line` the text after a just-seen panic marker starts.
    panic_at: Option<usize>,
    tail: VecDeque<String>,
    panic: Option<String>,
}

impl Console {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Console {
            out,
            line: Vec::new(),
            marker_matched: 0,
            panic_at: None,
            tail: VecDeque::new(),
            panic: None,
        }
    }
    pub fn panic_message(&self) -> Option<&str> {
        self.panic.as_deref()
    }
    pub fn tail(&self) -> impl Iterator<Item = &str> {
        self.tail.iter().map(String::as_str)
    }

    fn push(&mut self, b: u8) {
        self.line.push(b);
        if self.panic.is_none() && self.panic_at.is_none() {
            let marker = PANIC_MARKER.as_bytes();
            self.marker_matched = if b == marker[self.marker_matched] {
                self.marker_matched + 1
            } else {
                usize::from(b == marker[0])
            };
            if self.marker_matched == marker.len() {
                self.panic_at = Some(self.line.len());
                self.marker_matched = 0;
            }
        }
        if self.line.len() == CONSOLE_LINE_MAX {
            self.end_line();
        }
    }

    /// Keep the current line (whole, or the piece of a long one) in the tail.
    fn end_line(&mut self) {
        if let Some(at) = self.panic_at.take() {
            // The marker may have started in the previous piece of a cut line.
            let rest = String::from_utf8_lossy(&self.line[at..]);
            self.panic = Some(format!("{PANIC_MARKER}{}", rest.trim_end()));
        }
        let line = String::from_utf8_lossy(&self.line).trim_end().to_string();
        if self.tail.len() == CONSOLE_TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
        self.line.clear();
    }
}

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            match b {
                b'\n' => {
                    self.end_line();
                    self.marker_matched = 0;
                }
                b'\r' => {}
                _ => self.push(b),
            }
        }
        self.out.write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The port bus.
pub struct Devices {
    serial: Mutex<Serial<EventFdTrigger, vm_superio::serial::NoEvents, Console>>,
    i8042: Mutex<I8042Device<ResetLine>>,
    pm1: Pm1,
}

impl Devices {
    /// `serial_irq` is signalled when the UART raises its interrupt.
    pub fn new(serial_irq: EventFd, console: Console) -> Self {
        Devices {
            serial: Mutex::new(Serial::new(EventFdTrigger(serial_irq), console)),
            i8042: Mutex::new(I8042Device::new(ResetLine::default())),
            pm1: Pm1::default(),
        }
    }

    /// A guest `in` from `port`; fills `data`.
    pub fn pio_in(&self, port: u16, data: &mut [u8]) {
        if Pm1::claims(port) {
            // 16-bit registers, read with 16-bit accesses.
            return self.pm1.read(port, data);
        }
        data.fill(0xff);
        match port {
            p if (layout::SERIAL_PORT_BASE..layout::SERIAL_PORT_BASE + layout::SERIAL_PORT_LEN)
                .contains(&p) =>
            {
                let off = (p - layout::SERIAL_PORT_BASE) as u8;
                data[0] = lock(&self.serial).read(off);
            }
            layout::I8042_DATA_PORT | layout::I8042_COMMAND_PORT => {
                data[0] = lock(&self.i8042).read((port - layout::I8042_DATA_PORT) as u8);
            }
            _ => {}
        }
    }

    /// A guest `out` to `port`. Returns a machine-level request if the write
    /// powers off or resets the guest.
    pub fn pio_out(&self, port: u16, data: &[u8]) -> Option<MachineRequest> {
        if Pm1::claims(port) {
            return self
                .pm1
                .write(port, data)
                .map(|PmRequest::PowerOff| MachineRequest::AcpiPowerOff);
        }
        let value = *data.first()?;
        match port {
            p if (layout::SERIAL_PORT_BASE..layout::SERIAL_PORT_BASE + layout::SERIAL_PORT_LEN)
                .contains(&p) =>
            {
                let off = (p - layout::SERIAL_PORT_BASE) as u8;
                // A failed console write or IRQ signal is not the guest's fault
                // and must not stop it; the bytes are lost.
                let _ = lock(&self.serial).write(off, value);
                None
            }
            layout::I8042_DATA_PORT | layout::I8042_COMMAND_PORT => {
                let mut dev = lock(&self.i8042);
                let _ = dev.write((port - layout::I8042_DATA_PORT) as u8, value);
                // The model pulls the reset line on command 0xfe (layout::I8042_RESET_CMD).
                dev.reset_evt()
                    .0
                    .swap(false, Ordering::SeqCst)
                    .then_some(MachineRequest::Reset)
            }
            layout::POWEROFF_PORT => Some(MachineRequest::PowerOff(value)),
            _ => None,
        }
    }

    /// Run `f` on the console (for the panic message and the last lines).
    pub fn with_console<R>(&self, f: impl FnOnce(&mut Console) -> R) -> R {
        f(lock(&self.serial).writer_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn serial_bytes_reach_console_and_panic_is_seen() {
        let sink = Sink::default();
        let dev = Devices::new(
            EventFd::new(0).unwrap(),
            Console::new(Box::new(sink.clone())),
        );
        for b in b"hello\nKernel panic - not syncing: VFS\n" {
            assert_eq!(dev.pio_out(layout::SERIAL_PORT_BASE, &[*b]), None);
        }
        assert!(sink.0.lock().unwrap().starts_with(b"hello\n"));
        assert_eq!(
            dev.with_console(|c| c.panic_message().map(str::to_owned))
                .as_deref(),
            Some("Kernel panic - not syncing: VFS")
        );
    }

    /// Counts the bytes written, keeps none.
    #[derive(Clone, Default)]
    struct Counter(Arc<std::sync::atomic::AtomicUsize>);
    impl Write for Counter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.fetch_add(b.len(), Ordering::Relaxed);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn endless_line_keeps_memory_bounded() {
        const TOTAL: usize = 10 << 20;
        let sink = Counter::default();
        let mut c = Console::new(Box::new(sink.clone()));
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..TOTAL / chunk.len() {
            c.write_all(&chunk).unwrap();
            assert!(c.line.len() < CONSOLE_LINE_MAX, "{}", c.line.len());
        }
        assert!(
            c.line.capacity() <= CONSOLE_LINE_MAX,
            "{}",
            c.line.capacity()
        );
        assert_eq!(c.tail.len(), CONSOLE_TAIL_LINES);
        assert!(c.tail().all(|l| l.len() == CONSOLE_LINE_MAX));
        // Every byte still reached the sink.
        assert_eq!(sink.0.load(Ordering::Relaxed), TOTAL);

        // The long line ends; a panic on the next line is still seen.
        c.write_all(b"yy\r\n[    1.5] Kernel panic - not syncing: VFS: no root\r\n")
            .unwrap();
        assert_eq!(
            c.panic_message(),
            Some("Kernel panic - not syncing: VFS: no root")
        );
        let tail: Vec<&str> = c.tail().collect();
        assert_eq!(tail.len(), CONSOLE_TAIL_LINES);
        assert_eq!(
            tail[CONSOLE_TAIL_LINES - 2..],
            [
                "x".repeat(TOTAL % CONSOLE_LINE_MAX) + "yy",
                "[    1.5] Kernel panic - not syncing: VFS: no root".to_string()
            ]
        );
        assert!(c.line.is_empty());
    }

    #[test]
    fn panic_marker_across_a_cut_is_seen() {
        let mut c = Console::new(Box::new(std::io::sink()));
        let mut bytes = vec![b'.'; CONSOLE_LINE_MAX - 10];
        bytes.extend_from_slice(b"Kernel panic - not syncing: late\nnext\n");
        c.write_all(&bytes).unwrap();
        assert_eq!(c.panic_message(), Some("Kernel panic - not syncing: late"));
        // The first panic is kept.
        c.write_all(b"Kernel panic - not syncing: second\n")
            .unwrap();
        assert_eq!(c.panic_message(), Some("Kernel panic - not syncing: late"));
    }

    #[test]
    fn panic_marker_does_not_span_lines_or_restart_wrongly() {
        let mut c = Console::new(Box::new(std::io::sink()));
        // A partial marker, a newline, the rest: no panic.
        c.write_all(b"Kernel panic\n - not syncing\n").unwrap();
        assert_eq!(c.panic_message(), None);
        // A false start right before the real marker.
        c.write_all(b"KerKernel panic - not syncing: x\n").unwrap();
        assert_eq!(c.panic_message(), Some("Kernel panic - not syncing: x"));
    }

    #[test]
    fn poweroff_and_reset_ports() {
        let dev = Devices::new(
            EventFd::new(0).unwrap(),
            Console::new(Box::new(std::io::sink())),
        );
        assert_eq!(
            dev.pio_out(layout::POWEROFF_PORT, &[3]),
            Some(MachineRequest::PowerOff(3))
        );
        assert_eq!(
            dev.pio_out(layout::I8042_COMMAND_PORT, &[layout::I8042_RESET_CMD]),
            Some(MachineRequest::Reset)
        );
        let mut d = [0u8; 1];
        dev.pio_in(0x1234, &mut d);
        assert_eq!(d, [0xff]);
        // ACPI S5: SLP_TYP = 5 with SLP_EN, one 16-bit write to PM1a_CNT.
        let s5 = (u16::from(crate::acpi_pm::S5_SLP_TYP) << crate::acpi_pm::SLP_TYP_SHIFT)
            | crate::acpi_pm::SLP_EN;
        assert_eq!(
            dev.pio_out(layout::PM1A_CNT_PORT, &s5.to_le_bytes()),
            Some(MachineRequest::AcpiPowerOff)
        );
    }
}
