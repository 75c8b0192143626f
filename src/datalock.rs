//! The data file's lock: a second `record` (or `-o`) of a file a run is
//! writing is refused before it boots, instead of renaming the file to
//! `.old` or truncating it under the first.
//!
//! The lock is an exclusive `flock` on `FILE.lock` beside the data file
//! (beside the file a symlink names), taken before the data file is
//! rotated or created, and held until the run ends. It is not on the data
//! file itself: that file is renamed (`.old`) or created by the run, so two
//! runs starting together could each find nothing locked. The lock file is
//! removed by its holder at the end (as git removes `index.lock`); a run
//! killed (SIGKILL) leaves it, harmless: only a held `flock` refuses.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::InputError;

/// Held while a run writes its data file; removes `FILE.lock` when dropped.
pub struct Lock {
    path: PathBuf,
    // Closed (releasing the flock) after the drop removed `path`.
    _file: fs::File,
}

/// `FILE.lock` beside `FILE`.
pub fn lock_path(data: &Path) -> PathBuf {
    let mut name = data.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

impl Lock {
    /// Lock the data file `data` (the file itself, not a symlink to it);
    /// refused when another run holds it. None where the file system has
    /// no `flock`: there is nothing to hold.
    pub fn acquire(data: &Path) -> Result<Option<Lock>, InputError> {
        let path = lock_path(data);
        let failed = |source: io::Error| InputError::DataFileLock {
            lock: path.clone(),
            data: data.to_path_buf(),
            source,
        };
        // A holder removes the file before it releases the lock: a lock
        // taken on a file no longer at `path` is taken again on the new one.
        for _ in 0..100 {
            // Never blocks, never follows a link put there; a FIFO or
            // worse found there is refused below.
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o644)
                .open(&path)
                .map_err(failed)?;
            let meta = file.metadata().map_err(failed)?;
            if !meta.is_file() {
                return Err(failed(io::Error::other("it is not a regular file")));
            }
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                return match io::Error::last_os_error() {
                    e if e.kind() == io::ErrorKind::WouldBlock => {
                        Err(InputError::DataFileBusy(data.to_path_buf()))
                    }
                    // A file system without flock: nothing to hold (and
                    // nothing to remove: another run may have made it).
                    _ => Ok(None),
                };
            }
            match fs::symlink_metadata(&path) {
                Ok(now) if now.dev() == meta.dev() && now.ino() == meta.ino() => {
                    return Ok(Some(Lock { path, _file: file }));
                }
                // Removed (and perhaps made again) by the run that held it.
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(InputError::DataFileBusy(data.to_path_buf()))
    }

    /// The lock file, for a signal handler to remove (see `vmm::run::end_on_terminate`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while held: a run waiting on this file takes its lock
        // and finds it gone, and locks a new one.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held: a second lock of the file is refused; released: the lock file
    /// is gone, and the file can be locked again.
    #[test]
    fn held_refuses_a_second_and_is_removed_when_released() {
        let dir = std::env::temp_dir().join(format!("vmtrace-datalock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let data = dir.join("t.data");
        let first = Lock::acquire(&data).unwrap().unwrap();
        assert_eq!(first.path(), dir.join("t.data.lock"));
        assert!(matches!(
            Lock::acquire(&data),
            Err(InputError::DataFileBusy(p)) if p == data
        ));
        // The data file is never needed, and never made, by the lock.
        assert!(!data.exists());
        drop(first);
        assert!(!dir.join("t.data.lock").exists());
        let again = Lock::acquire(&data).unwrap().unwrap();
        drop(again);
        // A FIFO in the lock's place: refused at once, not waited on.
        let fifo = std::ffi::CString::new(dir.join("t.data.lock").to_str().unwrap()).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path that outlives the call;
        // mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let e = Lock::acquire(&data).err().unwrap().to_string();
        assert!(e.contains("it is not a regular file"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }
}
