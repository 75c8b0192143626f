//! The ACPI PM1a register block (ACPI 6.5 §4.8.3): how an ACPI guest powers
//! the machine off. The FADT (`boot::acpi`) points at these ports and the
//! DSDT's `\_S5` names [`S5_SLP_TYP`]; Linux's `acpi_power_off()` writes
//! that SLP_TYP with SLP_EN into PM1a_CNT, which this block turns into a
//! power-off request.
//!
//! Nothing here raises the SCI: vmtrace has no fixed-feature events (no
//! power button, no PM timer), so the status register always reads 0.

use std::sync::Mutex;

use crate::layout::{PM1A_CNT_LEN, PM1A_CNT_PORT, PM1A_EVT_LEN, PM1A_EVT_PORT};
use crate::sys::lock;

/// PM1_CNT.SCI_EN: the machine is in ACPI mode. It always is (the FADT has
/// no SMI_CMD port to switch modes), so it always reads as set.
pub const SCI_EN: u16 = 1 << 0;
/// PM1_CNT.SLP_TYP, bits 10..=12: the sleep type to enter.
pub const SLP_TYP_SHIFT: u16 = 10;
pub const SLP_TYP_MASK: u16 = 0x7 << SLP_TYP_SHIFT;
/// PM1_CNT.SLP_EN: write-only, enters the state SLP_TYP names.
pub const SLP_EN: u16 = 1 << 13;
/// The SLP_TYP value of S5 (soft off), as the DSDT's `\_S5` package gives
/// it. Any 3-bit value works as long as the two agree; 5 reads as "S5".
pub const S5_SLP_TYP: u8 = 5;

/// What a write to the block asks of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmRequest {
    /// SLP_EN with the S5 sleep type.
    PowerOff,
}

#[derive(Debug, Default)]
struct Regs {
    /// PM1_STS: write 1 to clear. No event ever sets a bit.
    status: u16,
    /// PM1_EN.
    enable: u16,
    /// PM1_CNT as last written, without SLP_EN.
    control: u16,
}

/// The PM1a event and control registers.
#[derive(Debug, Default)]
pub struct Pm1 {
    regs: Mutex<Regs>,
}

/// Which register a port byte belongs to, and which byte of it.
#[derive(Clone, Copy)]
enum Reg {
    Status,
    Enable,
    Control,
}

fn locate(port: u16) -> Option<(Reg, u16)> {
    let evt_half = u16::from(PM1A_EVT_LEN / 2);
    let off = port.wrapping_sub(PM1A_EVT_PORT);
    if off < evt_half {
        return Some((Reg::Status, off));
    }
    if off < u16::from(PM1A_EVT_LEN) {
        return Some((Reg::Enable, off - evt_half));
    }
    let off = port.wrapping_sub(PM1A_CNT_PORT);
    (off < u16::from(PM1A_CNT_LEN)).then_some((Reg::Control, off))
}

impl Pm1 {
    /// Is `port` one of the block's ports?
    pub fn claims(port: u16) -> bool {
        locate(port).is_some()
    }

    /// A guest `in` of `data.len()` bytes from `port`: each byte from the
    /// register that holds it (bytes past the block read as all-ones).
    pub fn read(&self, port: u16, data: &mut [u8]) {
        let regs = lock(&self.regs);
        for (i, b) in data.iter_mut().enumerate() {
            *b = match locate(port.wrapping_add(i as u16)) {
                Some((Reg::Status, k)) => byte(regs.status, k),
                Some((Reg::Enable, k)) => byte(regs.enable, k),
                Some((Reg::Control, k)) => byte(regs.control | SCI_EN, k),
                None => 0xff,
            };
        }
    }

    /// A guest `out` of `data` to `port`. The whole access is applied before
    /// SLP_EN is looked at, so a 16-bit write and two byte writes (SLP_TYP
    /// and SLP_EN share the high byte) act alike.
    pub fn write(&self, port: u16, data: &[u8]) -> Option<PmRequest> {
        let mut regs = lock(&self.regs);
        let mut control_written = false;
        for (i, &b) in data.iter().enumerate() {
            match locate(port.wrapping_add(i as u16)) {
                Some((Reg::Status, k)) => regs.status &= !(u16::from(b) << (8 * k)),
                Some((Reg::Enable, k)) => set_byte(&mut regs.enable, k, b),
                Some((Reg::Control, k)) => {
                    set_byte(&mut regs.control, k, b);
                    control_written = true;
                }
                None => {}
            }
        }
        if !control_written || regs.control & SLP_EN == 0 {
            return None;
        }
        regs.control &= !SLP_EN;
        let typ = (regs.control & SLP_TYP_MASK) >> SLP_TYP_SHIFT;
        // The DSDT offers no other sleep state; a guest that asks for one
        // anyway stays running, as on a machine without it.
        (typ == u16::from(S5_SLP_TYP)).then_some(PmRequest::PowerOff)
    }
}

fn byte(reg: u16, k: u16) -> u8 {
    (reg >> (8 * k)) as u8
}

fn set_byte(reg: &mut u16, k: u16, b: u8) {
    let shift = 8 * k;
    *reg = (*reg & !(0xff << shift)) | (u16::from(b) << shift);
}

#[cfg(test)]
mod tests {
    use super::*;

    const S5_CONTROL: u16 = (S5_SLP_TYP as u16) << SLP_TYP_SHIFT;

    #[test]
    fn acpica_s5_sequence_powers_off_on_the_second_write() {
        let pm = Pm1::default();
        // acpi_hw_legacy_sleep: read PM1_CNT, write SLP_TYP, then SLP_TYP|SLP_EN.
        let mut d = [0u8; 2];
        pm.read(PM1A_CNT_PORT, &mut d);
        assert_eq!(u16::from_le_bytes(d), SCI_EN);
        let first = S5_CONTROL | SCI_EN;
        assert_eq!(pm.write(PM1A_CNT_PORT, &first.to_le_bytes()), None);
        assert_eq!(
            pm.write(PM1A_CNT_PORT, &(first | SLP_EN).to_le_bytes()),
            Some(PmRequest::PowerOff)
        );
        // SLP_EN is write-only.
        pm.read(PM1A_CNT_PORT, &mut d);
        assert_eq!(u16::from_le_bytes(d) & SLP_EN, 0);
    }

    #[test]
    fn byte_writes_act_like_a_word_write() {
        let pm = Pm1::default();
        let v = (S5_CONTROL | SLP_EN).to_le_bytes();
        assert_eq!(pm.write(PM1A_CNT_PORT, &v[..1]), None);
        assert_eq!(
            pm.write(PM1A_CNT_PORT + 1, &v[1..]),
            Some(PmRequest::PowerOff)
        );
    }

    #[test]
    fn other_sleep_types_and_plain_writes_do_nothing() {
        let pm = Pm1::default();
        for typ in (0..8u16).filter(|&t| t != u16::from(S5_SLP_TYP)) {
            let v = (typ << SLP_TYP_SHIFT) | SLP_EN;
            assert_eq!(pm.write(PM1A_CNT_PORT, &v.to_le_bytes()), None, "{typ}");
        }
        assert_eq!(pm.write(PM1A_CNT_PORT, &S5_CONTROL.to_le_bytes()), None);
    }

    #[test]
    fn event_registers() {
        let pm = Pm1::default();
        let mut d = [0u8; 4];
        // Status and enable as one dword: no event pending, nothing enabled.
        pm.read(PM1A_EVT_PORT, &mut d);
        assert_eq!(d, [0; 4]);
        // Enable is read/write; status is write-1-to-clear and stays 0.
        assert_eq!(pm.write(PM1A_EVT_PORT + 2, &0x0120u16.to_le_bytes()), None);
        assert_eq!(pm.write(PM1A_EVT_PORT, &0xffffu16.to_le_bytes()), None);
        pm.read(PM1A_EVT_PORT, &mut d);
        assert_eq!(d, [0, 0, 0x20, 0x01]);
        assert!(Pm1::claims(PM1A_EVT_PORT) && Pm1::claims(PM1A_CNT_PORT + 1));
        assert!(!Pm1::claims(PM1A_CNT_PORT + 2) && !Pm1::claims(PM1A_EVT_PORT - 1));
        // An access running past the block reads all-ones beyond it.
        let mut d = [0u8; 4];
        pm.read(PM1A_CNT_PORT, &mut d);
        assert_eq!(d, [1, 0, 0xff, 0xff]);
    }
}
