//! Version 11's field: the command line that recorded the trace, `u32` n
//! then n `str` (argv, each argument as given; see the parent module).

use std::io::{self, Read, Write};

use super::encode::put_str;
use super::reader::Reader;
use super::TraceFileError;
use crate::trace::cmdline::{bounded, MAX_ARGS, MAX_ARG_BYTES};

/// The command line, as much of it as a file keeps (`cmdline::bounded`).
pub(super) fn put_cmdline(argv: &[String], w: &mut Vec<u8>) -> io::Result<()> {
    let kept = bounded(argv);
    // At most MAX_ARGS: fits a u32.
    w.write_all(&(kept.len() as u32).to_le_bytes())?;
    for a in &kept {
        put_str(w, a)?;
    }
    Ok(())
}

/// The command line: at most `MAX_ARGS` arguments of at most
/// `MAX_ARG_BYTES` each (more is corrupt).
pub(super) fn read_cmdline<R: Read>(r: &mut Reader<'_, R>) -> Result<Vec<String>, TraceFileError> {
    let n = r.u32()?;
    if n as usize > MAX_ARGS {
        return Err(r.corrupt(format!(
            "a command line of {n} arguments (at most {MAX_ARGS})"
        )));
    }
    // Each argument's length first.
    r.need(u64::from(n) * 4, "the command line")?;
    let mut argv = Vec::with_capacity(n as usize);
    for i in 0..n {
        let a = r.string("a command-line argument")?;
        if a.len() > MAX_ARG_BYTES {
            return Err(r.corrupt(format!(
                "command-line argument {i} is {} bytes (at most {MAX_ARG_BYTES})",
                a.len()
            )));
        }
        argv.push(a);
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::trace::datafile::Section;

    fn read(bytes: &[u8]) -> Result<Vec<String>, TraceFileError> {
        let mut r = Reader {
            r: bytes,
            path: Path::new("t.data"),
            pos: 0,
            actual: bytes.len() as u64,
            declared: bytes.len() as u64,
            section: Section::Header,
        };
        read_cmdline(&mut r)
    }

    #[test]
    fn a_command_line_past_the_bounds_is_corrupt() {
        let mut b = Vec::new();
        put_cmdline(&["vmtrace".into(), "a b".into()], &mut b).unwrap();
        assert_eq!(read(&b).unwrap(), ["vmtrace", "a b"]);
        let many = (MAX_ARGS as u32 + 1).to_le_bytes();
        let e = read(&many).unwrap_err().to_string();
        assert!(
            e.ends_with("a command line of 257 arguments (at most 256)"),
            "{e}"
        );
        let mut long = 1u32.to_le_bytes().to_vec();
        put_str(&mut long, &"x".repeat(MAX_ARG_BYTES + 1)).unwrap();
        let e = read(&long).unwrap_err().to_string();
        assert!(
            e.ends_with("command-line argument 0 is 16385 bytes (at most 16384)"),
            "{e}"
        );
    }
}
