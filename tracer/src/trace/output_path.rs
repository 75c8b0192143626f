//! Output files: what `-o FILE` may name, checked before a run and written
//! without ever clobbering what is not a regular file.
//!
//! The rules:
//! - a path that does not exist, or a regular file, is written to a
//!   temporary file in the same directory (created exclusively) that is then
//!   renamed over it: an interrupted or failed write leaves the old file (or
//!   nothing) under the name, never a partial one; a replaced file keeps its
//!   permissions;
//! - a symlink is followed on purpose: the file it points to is the one
//!   written (replaced atomically beside it), and the link stays; a symlink
//!   to nothing is refused;
//! - a character device (`/dev/null`, a terminal) is written into, opened
//!   without truncating or creating; it is never unlinked or replaced; a
//!   write error there (`/dev/full`) is an error like any other;
//! - a directory, a FIFO, a socket or a block device is refused.
//!
//! [`check`] applies these rules before a run and also proves the directory
//! writable with at least [`MIN_FREE`] bytes free; [`write`] applies them
//! again when writing.
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// Free space a directory must have for [`check`] to accept a new file in it.
pub const MIN_FREE: u64 = 1 << 20;

/// Where an output goes.
#[derive(Debug)]
pub enum Target {
    /// A regular file (`existing` holds its permissions) or a path that
    /// does not exist yet, symlinks resolved: replaced atomically.
    File {
        path: PathBuf,
        existing: Option<fs::Permissions>,
    },
    /// A character device: written into, never replaced.
    Device(PathBuf),
}

fn refuse(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}; vmtrace writes regular files (replaced atomically) and character devices"),
    )
}

/// What `path` is, by the rules above. Touches nothing.
pub fn target(path: &Path) -> io::Result<Target> {
    if path.as_os_str().is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty path"));
    }
    let link = match fs::symlink_metadata(path) {
        Ok(m) => m,
        // (NotADirectory: a component of the directory is a file.)
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return new_file(path);
        }
        Err(e) => return Err(e),
    };
    let (meta, path) = if link.file_type().is_symlink() {
        match fs::metadata(path) {
            Ok(m) if m.is_file() => (m, fs::canonicalize(path)?),
            // A device or worse: opened (or refused) through the link.
            Ok(m) => (m, path.to_path_buf()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "it is a symlink to a file that does not exist; pass the path to write",
                ))
            }
            Err(e) => return Err(e),
        }
    } else {
        (link, path.to_path_buf())
    };
    let ft = meta.file_type();
    if ft.is_file() && meta.permissions().mode() & OWNER_WRITE == 0 {
        // Renaming over it would need no write permission at all (and root
        // has every permission): the owner's write bit is what says "keep".
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it is a read-only file; make it writable (chmod u+w) or choose another path",
        ))
    } else if ft.is_file() {
        Ok(Target::File {
            path,
            existing: Some(meta.permissions()),
        })
    } else if ft.is_char_device() {
        Ok(Target::Device(path))
    } else if ft.is_dir() {
        Err(refuse("a directory"))
    } else if ft.is_fifo() {
        Err(refuse("a FIFO (named pipe)"))
    } else if ft.is_socket() {
        Err(refuse("a socket"))
    } else if ft.is_block_device() {
        Err(refuse("a block device"))
    } else {
        Err(refuse("neither a file nor a device"))
    }
}

/// A path that does not exist: its directory must.
fn new_file(path: &Path) -> io::Result<Target> {
    let dir = dir_of(path);
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ))
        }
        Err(e) => return Err(e),
    }
    if path.file_name().is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it does not name a file",
        ));
    }
    Ok(Target::File {
        path: path.to_path_buf(),
        existing: None,
    })
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// `.NAME.TAG<pid>` beside `path`.
fn sibling(path: &Path, tag: &str) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "it does not name a file"))?;
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{tag}{}", std::process::id()));
    Ok(dir_of(path).join(tmp))
}

/// Before a run: `path` is something [`write`] will write, its
/// directory takes a new file and has [`MIN_FREE`] bytes free (or the
/// device opens for writing). Leaves nothing behind.
pub fn check(path: &Path) -> io::Result<Target> {
    let t = target(path)?;
    match &t {
        Target::Device(p) => {
            OpenOptions::new().write(true).open(p)?;
        }
        Target::File { path, .. } => {
            let probe = sibling(path, "probe")?;
            File::options().write(true).create_new(true).open(&probe)?;
            let _ = fs::remove_file(&probe);
            let dir = dir_of(path);
            if let Some(free) = free_bytes(dir) {
                if free < MIN_FREE {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!(
                            "{} has only {free} bytes free (at least {MIN_FREE} needed)",
                            dir.display()
                        ),
                    ));
                }
            }
        }
    }
    Ok(t)
}

/// Bytes an unprivileged writer may still use in `dir`'s filesystem.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Writes what `body` writes to `path`, by the rules above: atomically
/// over a regular file or a new path (on error the temporary file is
/// removed and `path` is as it was), into a character device. Returns
/// where it went. `body` should buffer; its writer is the file itself.
pub fn write(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<Target> {
    let t = target(path)?;
    match &t {
        Target::Device(p) => {
            let mut f = OpenOptions::new().write(true).open(p)?;
            body(&mut f)?;
            f.flush()?;
        }
        Target::File { path, existing } => {
            let tmp = sibling(path, "tmp")?;
            let mut f = File::options().write(true).create_new(true).open(&tmp)?;
            let result = (|| {
                if let Some(perm) = existing {
                    f.set_permissions(perm.clone())?;
                }
                body(&mut f)?;
                f.flush()?;
                drop(f);
                replace(&tmp, path, existing.is_some())
            })();
            if let Err(e) = result {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        }
    }
    Ok(t)
}

/// The owner's write bit of a file mode.
const OWNER_WRITE: u32 = 0o200;

/// Moves the finished temporary file `tmp` to `path`, which was a regular
/// file (`existed`) or nothing when `target` looked. The run between that
/// look and now can be long (a whole trace): what is at `path` now must
/// still be what the rules allow. A new path is taken only if it is still
/// free (`renameat2(RENAME_NOREPLACE)`: no window at all); a regular file
/// is looked at again just before the rename (a window of one system call).
fn replace(tmp: &Path, path: &Path, existed: bool) -> io::Result<()> {
    if !existed {
        return rename_noreplace(tmp, path);
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => fs::rename(tmp, path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "it was a regular file when the run started and is no longer one; nothing replaced",
        )),
        // Removed meanwhile: take the path if still free.
        Err(e) if e.kind() == io::ErrorKind::NotFound => rename_noreplace(tmp, path),
        Err(e) => Err(e),
    }
}

/// `rename(from, to)` that fails if `to` exists.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths, relative to the working directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::AlreadyExists {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "something was created there during the run; nothing replaced",
        ));
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("vmtrace-export-file-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let d = scratch("fail");
        let p = d.join("out.csv");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let e = write(&p, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "disk full");
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert_eq!(names(&d), ["out.csv"]);
        // A good write replaces it, keeping its permissions.
        write(&p, |w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(names(&d), ["out.csv"]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_read_only_file_is_refused() {
        let d = scratch("ro");
        let p = d.join("keep.json");
        fs::write(&p, b"precious").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).unwrap();
        let e = check(&p).unwrap_err().to_string();
        assert!(e.contains("read-only file"), "{e}");
        assert!(write(&p, |w| w.write_all(b"x")).is_err());
        assert_eq!(fs::read(&p).unwrap(), b"precious");
        assert_eq!(names(&d), ["keep.json"]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn what_appears_at_the_path_during_the_run_is_not_replaced() {
        let d = scratch("race");
        // Checked as new; then a FIFO (or anything) appears there.
        let p = d.join("new.csv");
        let tmp = d.join(".tmp");
        fs::write(&tmp, b"data").unwrap();
        fs::create_dir(&p).unwrap();
        let e = replace(&tmp, &p, false).unwrap_err().to_string();
        assert!(e.contains("created there during the run"), "{e}");
        assert!(fs::metadata(&p).unwrap().is_dir());
        // Checked as a regular file; it became a directory.
        let e = replace(&tmp, &p, true).unwrap_err().to_string();
        assert!(e.contains("no longer one"), "{e}");
        // Still a regular file: replaced; gone meanwhile: taken.
        let q = d.join("old.csv");
        fs::write(&q, b"old").unwrap();
        replace(&tmp, &q, true).unwrap();
        assert_eq!(fs::read(&q).unwrap(), b"data");
        fs::write(&tmp, b"again").unwrap();
        let r = d.join("gone.csv");
        replace(&tmp, &r, true).unwrap();
        assert_eq!(fs::read(&r).unwrap(), b"again");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn what_is_refused_and_what_is_followed() {
        let d = scratch("rules");
        let e = check(&d).unwrap_err().to_string();
        assert!(e.starts_with("it is a directory"), "{e}");
        let e = check(&d.join("no/x")).unwrap_err().to_string();
        assert!(
            e.starts_with("directory ") && e.ends_with("does not exist"),
            "{e}"
        );
        fs::write(d.join("f"), b"").unwrap();
        let e = check(&d.join("f/x")).unwrap_err().to_string();
        assert!(e.ends_with("/f is not a directory"), "{e}");
        std::os::unix::fs::symlink("nowhere", d.join("dangling")).unwrap();
        let e = check(&d.join("dangling")).unwrap_err().to_string();
        assert!(e.contains("symlink to a file that does not exist"), "{e}");
        // A symlink to a file: the file is written, the link stays.
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/real"), b"old").unwrap();
        std::os::unix::fs::symlink("sub/real", d.join("link")).unwrap();
        match write(&d.join("link"), |w| w.write_all(b"new")).unwrap() {
            Target::File { path, existing } => {
                assert!(path.ends_with("sub/real") && existing.is_some(), "{path:?}");
            }
            t => panic!("{t:?}"),
        }
        assert!(fs::symlink_metadata(d.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(d.join("sub/real")).unwrap(), b"new");
        assert_eq!(names(&d.join("sub")), ["real"]);
        // A character device is written into.
        assert!(matches!(
            check(Path::new("/dev/null")),
            Ok(Target::Device(_))
        ));
        assert!(matches!(
            write(Path::new("/dev/null"), |w| w.write_all(b"x")),
            Ok(Target::Device(_))
        ));
        // A new file: checked without leaving anything behind.
        assert!(matches!(
            check(&d.join("new")),
            Ok(Target::File { existing: None, .. })
        ));
        assert_eq!(names(&d), ["dangling", "f", "link", "sub"]);
        let _ = fs::remove_dir_all(&d);
    }
}
