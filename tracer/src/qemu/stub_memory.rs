//! Guest memory through the gdbstub (`m`, `M`/`X`, QEMU's physical
//! addressing mode): `impl Gdb`, apart from the protocol in `gdb`. Used
//! while the guest is stopped: QEMU's own write path drops what TCG
//! translated from the bytes written.

use super::gdb::{bytes_text, Gdb, GdbError, PACKET_OVERHEAD};
use super::rsp;

/// `m` packets a read keeps in flight.
const READ_AHEAD: usize = 4;

impl Gdb {
    /// Makes memory addresses guest-physical (true) or virtual (false):
    /// QEMU's `Qqemu.PhyMemMode`.
    pub fn phys_mode(&mut self, on: bool) -> Result<(), GdbError> {
        self.expect_ok(&format!("Qqemu.PhyMemMode:{}", u8::from(on)))?;
        self.phys = on;
        Ok(())
    }

    fn mem_error(&self, op: &'static str, len: usize, at: u64, reply: String) -> GdbError {
        GdbError::Memory {
            addr: self.addr.clone(),
            op,
            len,
            addr_kind: if self.phys {
                "guest-physical"
            } else {
                "guest-virtual"
            },
            at,
            reply,
        }
    }

    /// Reads `buf.len()` bytes at `addr` (`m`, in packet-sized pieces).
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), GdbError> {
        // Two hex digits a byte in the reply, as gdb sizes its reads
        // (QEMU answers at most half its packet size).
        let chunk = (self.features.packet_size / 2).max(16);
        if self.running {
            return Err(GdbError::Running {
                addr: self.addr.clone(),
                cmd: "m".into(),
            });
        }
        // Several packets in flight: the stub answers in order, and a
        // socket does not garble (its acks are skipped, never awaited).
        for batch in buf.chunks_mut(chunk * READ_AHEAD).enumerate() {
            let (i, batch) = batch;
            let base = addr + (i * chunk * READ_AHEAD) as u64;
            let mut out = Vec::new();
            for (j, piece) in batch.chunks(chunk).enumerate() {
                let at = base + (j * chunk) as u64;
                out.extend(rsp::frame(format!("m{at:x},{:x}", piece.len()).as_bytes()));
            }
            self.resync()?;
            self.arm();
            self.write_raw(&out, "m")?;
            let replies = batch.len().div_ceil(chunk);
            for (j, piece) in batch.chunks_mut(chunk).enumerate() {
                let r = self.reply("m");
                // This reply and the rest of the batch's, if it timed out.
                self.owe_on_timeout(&r, replies - j);
                let r = r?;
                match rsp::from_hex(&r) {
                    Some(b) if b.len() == piece.len() => piece.copy_from_slice(&b),
                    _ => {
                        let at = base + (j * chunk) as u64;
                        let e = self.mem_error("read", piece.len(), at, bytes_text(&r));
                        // The rest of the batch's replies, not to leave them queued.
                        for k in j + 1..replies {
                            let r = self.reply("m");
                            self.owe_on_timeout(&r, replies - k);
                            r?;
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes `data` at `addr` (`X` when the stub takes it, else `M`).
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), GdbError> {
        if self.binary_write.is_none() {
            let r = self.command_bytes(format!("X{addr:x},0:").as_bytes(), "X")?;
            self.binary_write = Some(r == b"OK");
        }
        let binary = self.binary_write == Some(true);
        // Escaped binary may double a byte; hex always does.
        let chunk = (self.features.packet_size.saturating_sub(PACKET_OVERHEAD) / 2).max(16);
        let mut done = 0;
        while done < data.len() {
            let n = chunk.min(data.len() - done);
            let at = addr + done as u64;
            let piece = &data[done..done + n];
            let mut pkt = format!("{}{at:x},{n:x}:", if binary { 'X' } else { 'M' }).into_bytes();
            if binary {
                pkt.extend(rsp::escape(piece));
            } else {
                pkt.extend(rsp::to_hex(piece).into_bytes());
            }
            let r = self.command_bytes(&pkt, "write")?;
            if r != b"OK" {
                return Err(self.mem_error("write", n, at, String::from_utf8_lossy(&r).into()));
            }
            done += n;
        }
        Ok(())
    }
}
