//! LZO payloads: the lzop container (`lzop -9`, what the kernel's Makefile
//! runs for CONFIG_KERNEL_LZO) around LZO1X blocks.
//!
//! Written here rather than taken from a crate: every LZO crate on crates.io
//! (lzo1x, rust-lzo, minilzo-rs) is GPL-licensed, which vmtrace's Apache-2.0
//! licence cannot take in. The decoder follows the stream format as the
//! kernel documents it (Documentation/staging/lzo.rst); the container follows
//! lzop's header layout. Every read and every back-reference is bounds
//! checked: a corrupt stream is an error, never a panic.

/// lzop's 9-byte magic.
const LZOP_MAGIC: [u8; 9] = [0x89, b'L', b'Z', b'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a];
/// Header flags (lzop's F_*).
const F_ADLER32_D: u32 = 0x0001;
const F_ADLER32_C: u32 = 0x0002;
const F_H_EXTRA_FIELD: u32 = 0x0040;
const F_CRC32_D: u32 = 0x0100;
const F_CRC32_C: u32 = 0x0200;
const F_H_FILTER: u32 = 0x0800;
/// First lzop version with the 0.94 header fields (version needed, level,
/// mtime high).
const LZOP_094: u16 = 0x0940;
/// lzop's largest block (its MAX_BLOCK_SIZE).
const MAX_BLOCK: usize = 64 << 20;

/// A bounds-checked cursor over the input.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Input<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| format!("input ends at byte {} inside a {n}-byte field", self.at))?;
        let b = &self.data[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    fn be16(&mut self) -> Result<u16, String> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn be32(&mut self) -> Result<u32, String> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Decompress an lzop file to at most `limit` bytes. Bytes after its end
/// marker (the kernel's appended size) are ignored.
pub(super) fn decompress_lzop(data: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let mut r = Input { data, at: 0 };
    if r.bytes(LZOP_MAGIC.len())? != LZOP_MAGIC {
        return Err("no lzop magic".into());
    }
    let version = r.be16()?;
    let _lib_version = r.be16()?;
    if version >= LZOP_094 {
        let _needed = r.be16()?;
    }
    let method = r.u8()?;
    // 1, 2, 3: LZO1X-1, LZO1X-1(15), LZO1X-999, all read by one decoder.
    if !(1..=3).contains(&method) {
        return Err(format!("lzop method {method} is not LZO1X"));
    }
    if version >= LZOP_094 {
        let _level = r.u8()?;
    }
    let flags = r.be32()?;
    if flags & F_H_FILTER != 0 {
        return Err("lzop filters are not supported (the kernel writes none)".into());
    }
    let _mode = r.be32()?;
    let _mtime_low = r.be32()?;
    if version >= LZOP_094 {
        let _mtime_high = r.be32()?;
    }
    let name_len = r.u8()?;
    r.bytes(usize::from(name_len))?;
    let _header_checksum = r.be32()?;
    if flags & F_H_EXTRA_FIELD != 0 {
        let len = r.be32()?;
        r.bytes(len as usize)?;
        let _extra_checksum = r.be32()?;
    }

    let mut out = Vec::new();
    loop {
        let dst_len = r.be32()? as usize;
        if dst_len == 0 {
            return Ok(out);
        }
        let src_len = r.be32()? as usize;
        if dst_len > MAX_BLOCK || src_len > dst_len {
            return Err(format!(
                "block at byte {} claims {src_len} -> {dst_len} bytes",
                r.at - 8
            ));
        }
        if (out.len() + dst_len) as u64 > limit {
            return Err(format!("it decompresses to more than {limit} bytes"));
        }
        // Checksums are skipped, as the kernel does: the ELF parse that
        // follows checks the result.
        for flag in [F_ADLER32_D, F_CRC32_D] {
            if flags & flag != 0 {
                r.be32()?;
            }
        }
        if src_len < dst_len {
            for flag in [F_ADLER32_C, F_CRC32_C] {
                if flags & flag != 0 {
                    r.be32()?;
                }
            }
        }
        let block_at = r.at;
        let src = r.bytes(src_len)?;
        if src_len == dst_len {
            // Stored: incompressible.
            out.extend_from_slice(src);
        } else {
            let start = out.len();
            lzo1x_decompress(src, &mut out, dst_len)
                .map_err(|e| format!("LZO1X block at byte {block_at}: {e}"))?;
            if out.len() - start != dst_len {
                return Err(format!(
                    "LZO1X block at byte {block_at} gave {} bytes, not {dst_len}",
                    out.len() - start
                ));
            }
        }
    }
}

/// Append the decompression of one LZO1X block to `out`, producing at most
/// `max` bytes. Back-references reach only into this block's output, as in
/// lzop (each block is compressed on its own).
pub(super) fn lzo1x_decompress(src: &[u8], out: &mut Vec<u8>, max: usize) -> Result<(), String> {
    let base = out.len();
    let mut r = Input { data: src, at: 0 };
    let literals = |r: &mut Input, out: &mut Vec<u8>, n: usize| -> Result<(), String> {
        if out.len() - base + n > max {
            return Err("output longer than the block's size".into());
        }
        out.extend_from_slice(r.bytes(n)?);
        Ok(())
    };
    // A length that did not fit its bits: 255 per zero byte, then the
    // first non-zero byte, on top of the field's maximum.
    let extended = |r: &mut Input, field_max: usize| -> Result<usize, String> {
        let mut len = field_max;
        loop {
            match r.u8()? {
                0 => {
                    len += 255;
                    if len > MAX_BLOCK {
                        return Err("a length longer than any block".into());
                    }
                }
                b => return Ok(len + usize::from(b)),
            }
        }
    };

    // Literals copied by the previous instruction: 0, 1-3, or 4 for "4 or
    // more"; it changes what an instruction below 16 means.
    let mut state: usize = 0;
    match src.first() {
        None => return Err("empty block".into()),
        Some(&17) => return Err("LZO-RLE bitstreams are not supported".into()),
        Some(&b) if b > 17 => {
            r.at = 1;
            let n = usize::from(b - 17);
            literals(&mut r, out, n)?;
            state = n.min(4);
        }
        Some(_) => {}
    }
    loop {
        let t = usize::from(r.u8()?);
        let (len, dist, next) = if t < 16 {
            match state {
                0 => {
                    // A run of 4 or more literals.
                    let n = if t == 0 { extended(&mut r, 15)? } else { t } + 3;
                    literals(&mut r, out, n)?;
                    state = 4;
                    continue;
                }
                1..=3 => (2, (t >> 2) + (usize::from(r.u8()?) << 2) + 1, t & 3),
                _ => (3, (t >> 2) + (usize::from(r.u8()?) << 2) + 2049, t & 3),
            }
        } else if t >= 64 {
            let len = if t >= 128 {
                5 + ((t >> 5) & 3)
            } else {
                3 + ((t >> 5) & 1)
            };
            (len, ((t >> 2) & 7) + (usize::from(r.u8()?) << 3) + 1, t & 3)
        } else if t >= 32 {
            let len = if t & 31 == 0 {
                extended(&mut r, 31)?
            } else {
                t & 31
            } + 2;
            let d = usize::from(le16(&mut r)?);
            (len, (d >> 2) + 1, d & 3)
        } else {
            let len = if t & 7 == 0 {
                extended(&mut r, 7)?
            } else {
                t & 7
            } + 2;
            let d = usize::from(le16(&mut r)?);
            let dist = ((t & 8) << 11) + (d >> 2);
            if dist == 0 {
                // End of stream: nothing may follow it.
                if r.at != src.len() {
                    return Err(format!("{} bytes after the end marker", src.len() - r.at));
                }
                return Ok(());
            }
            (len, dist + 16384, d & 3)
        };
        let produced = out.len() - base;
        if dist > produced {
            return Err(format!(
                "a back-reference {dist} bytes back with only {produced} bytes written"
            ));
        }
        if produced + len > max {
            return Err("output longer than the block's size".into());
        }
        // Byte by byte: the source may overlap what is being written.
        let from = out.len() - dist;
        for i in 0..len {
            let b = out[from + i];
            out.push(b);
        }
        literals(&mut r, out, next)?;
        state = next;
    }
}

fn le16(r: &mut Input) -> Result<u16, String> {
    let b = r.bytes(2)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made block: 4 literals "abcd", a match of 8 bytes 4 back
    /// (`1 11 000 00`, distance 1 + (0 << 3) + 0 = ... see below), the end.
    #[test]
    fn literals_match_and_end() {
        // First byte 17 + 4: copy 4 literals, state 4.
        // Then 0b111_000_00 = 0xe0 with H = 0: length 5 + 3 = 8,
        // distance ((0xe0 >> 2) & 7) + (0x00 << 3) + 1 = 1; 0 trailing literals.
        // Hmm: distance 1 repeats "d"; use D = 3 for distance 4.
        let t = 0b1110_1100u8; // L = 3 (len 8), D = 3, S = 0
        let block = [21, b'a', b'b', b'c', b'd', t, 0x00, 0x11, 0x00, 0x00];
        let mut out = Vec::new();
        lzo1x_decompress(&block, &mut out, 64).unwrap();
        assert_eq!(out, b"abcdabcdabcd");
    }

    #[test]
    fn corrupt_blocks_are_errors() {
        let mut out = Vec::new();
        // A back-reference before the start.
        assert!(lzo1x_decompress(&[21, b'a', b'b', b'c', b'd', 0xfc, 0x40], &mut out, 64).is_err());
        // Truncated literals.
        assert!(lzo1x_decompress(&[30, b'a'], &mut out, 64).is_err());
        // Output past the block's size.
        assert!(lzo1x_decompress(&[21, b'a', b'b', b'c', b'd', 0x11, 0, 0], &mut out, 2).is_err());
        // Bytes after the end marker.
        assert!(
            lzo1x_decompress(&[21, b'a', b'b', b'c', b'd', 0x11, 0, 0, 9], &mut out, 64).is_err()
        );
        assert!(decompress_lzop(b"\x89LZO\0\r\n\x1a\n", 1 << 20).is_err());
    }

    proptest::proptest! {
        /// Arbitrary bytes, as a block or behind a valid lzop header, give
        /// a result or an error: never a panic, never more than asked for.
        #[test]
        fn arbitrary_input_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut out = Vec::new();
            let _ = lzo1x_decompress(&data, &mut out, 4096);
            proptest::prop_assert!(out.len() <= 4096);
            let mut file = LZOP_MAGIC.to_vec();
            // version 0x1040, lib 0x2080, needed 0x0940, method 1, level 9,
            // flags 0, mode, mtime low/high, empty name, checksum.
            file.extend_from_slice(&[0x10, 0x40, 0x20, 0x80, 0x09, 0x40, 1, 9]);
            file.extend_from_slice(&[0; 4 + 4 + 4 + 4 + 1 + 4]);
            file.extend_from_slice(&data);
            let _ = decompress_lzop(&file, 1 << 16);
        }
    }
}
