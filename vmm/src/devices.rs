//! The few devices a guest kernel needs: the COM1 UART, the i8042 reset line,
//! and vmtrace's power-off port. Everything else on the port bus reads as
//! all-ones and ignores writes, like an empty ISA bus.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vm_superio::{I8042Device, Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::layout;

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
/// What Linux prints when it panics (kernel/panic.c).
const PANIC_MARKER: &str = "Kernel panic - not syncing";

/// The console: bytes from the UART go to the user's sink; whole lines are
/// kept for the end-of-run message and scanned for a kernel panic.
pub struct Console {
    out: Box<dyn Write + Send>,
    line: Vec<u8>,
    tail: VecDeque<String>,
    panic: Option<String>,
}

impl Console {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Console {
            out,
            line: Vec::new(),
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
}

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).trim_end().to_string();
                if self.panic.is_none() {
                    if let Some(pos) = line.find(PANIC_MARKER) {
                        self.panic = Some(line[pos..].to_string());
                    }
                }
                if self.tail.len() == CONSOLE_TAIL_LINES {
                    self.tail.pop_front();
                }
                self.tail.push_back(line);
                self.line.clear();
            } else if b != b'\r' {
                self.line.push(b);
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
}

impl Devices {
    /// `serial_irq` is signalled when the UART raises its interrupt.
    pub fn new(serial_irq: EventFd, console: Console) -> Self {
        Devices {
            serial: Mutex::new(Serial::new(EventFdTrigger(serial_irq), console)),
            i8042: Mutex::new(I8042Device::new(ResetLine::default())),
        }
    }

    /// A guest `in` from `port`; fills `data`.
    pub fn pio_in(&self, port: u16, data: &mut [u8]) {
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

/// A poisoned device lock only means another vCPU thread panicked mid-access;
/// the device state is still usable for the rest of the shutdown.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    }
}
