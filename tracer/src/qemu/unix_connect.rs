//! A unix-socket connect that gives up. QEMU listens on its QMP socket with
//! a backlog of one (chardev/char-socket.c: `qio_net_listener_open_sync(...,
//! 1, ...)`) and accepts nothing while a client is connected: once the
//! queue is full, a blocking `connect(2)` waits for as long as that client
//! stays. vmtrace connects per burst (`super::burst`), so it connects
//! without blocking and retries while the queue is full, until `wait`.

use std::ffi::OsStr;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Between two tries while the queue is full.
const RETRY: Duration = Duration::from_millis(20);

/// Connects to the unix socket at `path`, retrying while its listen queue
/// is full, up to `wait`: then `ErrorKind::WouldBlock`. Other errors are
/// `connect(2)`'s. The stream returned blocks.
pub fn connect_within(path: &Path, wait: Duration) -> Result<UnixStream, Error> {
    let (addr, len) = sockaddr(path.as_os_str())?;
    // SAFETY: socket(2) takes no pointers; a new fd or -1 comes back.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: the fd was just made and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: `addr` is a sockaddr_un that lives across the call and
        // `len` its used length.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc == 0 {
            break;
        }
        let e = Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The listen queue is full: someone else is served.
            Some(libc::EAGAIN) if Instant::now() < deadline => std::thread::sleep(RETRY),
            Some(libc::EAGAIN) => return Err(Error::from(ErrorKind::WouldBlock)),
            _ => return Err(e),
        }
    }
    // SAFETY: fcntl on the open fd; F_GETFL and F_SETFL take no pointers.
    let rc = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK)
    };
    if rc != 0 {
        return Err(Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// The sockaddr_un of `path`, and its length; a path too long for one is
/// `InvalidInput`, as std's connect says it.
fn sockaddr(path: &OsStr) -> Result<(libc::sockaddr_un, libc::socklen_t), Error> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    // (One byte stays for the terminating NUL.)
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "path must be shorter than SUN_LEN",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A listener that accepts nothing: its queue fills, and a connect
    /// then gives up after `wait` instead of blocking for good.
    #[test]
    fn a_full_listen_queue_is_given_up_on() {
        let dir = std::env::temp_dir().join(format!("vmtrace-uc-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        // QEMU's backlog (a second listen(2) sets it).
        // SAFETY: listen(2) on the listener's open fd.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 1) }, 0);
        let mut held = Vec::new();
        let full = loop {
            match connect_within(&path, Duration::from_millis(100)) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 8, "the queue never filled");
        };
        assert_eq!(full.kind(), ErrorKind::WouldBlock);
        // One accepted: room for one more.
        let _first = listener.accept().unwrap();
        assert!(connect_within(&path, Duration::from_millis(100)).is_ok());
        let missing = connect_within(&dir.join("none.sock"), Duration::ZERO).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        let long = dir.join("x".repeat(200));
        let e = connect_within(&long, Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        drop(held);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
