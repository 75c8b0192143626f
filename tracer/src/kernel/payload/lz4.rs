//! LZ4's legacy frame, the one `lz4 -l` writes and the kernel's
//! lib/decompress_unlz4.c reads. lz4_flex decodes the blocks; it has no
//! reader for this old framing (only for the current frame format), so the
//! framing is here: a magic number, then blocks, each a little-endian `u32`
//! compressed length and an LZ4 block of at most 8 MiB of output.

/// The legacy frame's magic number.
const LEGACY_MAGIC: u32 = 0x184c_2102;
/// Largest output of one legacy block (LZ4's legacy chunk size).
const LEGACY_BLOCK: usize = 8 << 20;

/// Decompress a legacy LZ4 stream to at most `limit` bytes. The kernel's
/// Makefile appends the uncompressed size (`size_append`, 4 bytes) after the
/// last block: when present it must agree.
pub(super) fn decompress_legacy(data: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let word = |at: usize| -> Option<u32> {
        data.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if word(0) != Some(LEGACY_MAGIC) {
        return Err("no LZ4 legacy magic".into());
    }
    let mut out = Vec::new();
    let mut block = vec![0u8; LEGACY_BLOCK];
    let mut at = 4;
    while at < data.len() {
        let Some(len) = word(at) else {
            return Err(format!("{} stray bytes at the end", data.len() - at));
        };
        if len == LEGACY_MAGIC {
            // Concatenated streams, as the kernel accepts.
            at += 4;
            continue;
        }
        if at + 4 == data.len() {
            // The appended size: the last 4 bytes, where no block fits.
            if len != out.len() as u32 {
                return Err(format!(
                    "the appended size says {len} bytes, the blocks gave {}",
                    out.len()
                ));
            }
            break;
        }
        let start = at + 4;
        let end = start
            .checked_add(len as usize)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                format!(
                    "block at byte {at} claims {len} bytes, only {} remain",
                    data.len() - start
                )
            })?;
        let n = lz4_flex::block::decompress_into(&data[start..end], &mut block)
            .map_err(|e| format!("block at byte {at}: {e}"))?;
        if (out.len() + n) as u64 > limit {
            return Err(format!("it decompresses to more than {limit} bytes"));
        }
        out.extend_from_slice(&block[..n]);
        at = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_appended_size() {
        let a = lz4_flex::block::compress(b"hello hello hello hello");
        let b = lz4_flex::block::compress(b" world");
        let mut s = LEGACY_MAGIC.to_le_bytes().to_vec();
        for blk in [&a, &b] {
            s.extend_from_slice(&(blk.len() as u32).to_le_bytes());
            s.extend_from_slice(blk);
        }
        let whole = b"hello hello hello hello world";
        assert_eq!(decompress_legacy(&s, 1 << 20).unwrap(), whole);
        let mut sized = s.clone();
        sized.extend_from_slice(&(whole.len() as u32).to_le_bytes());
        assert_eq!(decompress_legacy(&sized, 1 << 20).unwrap(), whole);
        let mut wrong = s.clone();
        wrong.extend_from_slice(&7u32.to_le_bytes());
        assert!(decompress_legacy(&wrong, 1 << 20).is_err());
        assert!(decompress_legacy(&s[..s.len() - 2], 1 << 20).is_err());
        assert!(decompress_legacy(&s, 10).is_err());
    }
}
