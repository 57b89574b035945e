//! `SIGPIPE` in a C host process.
//!
//! The library writes to sockets from its own threads (bootstrap, the analyzer hubs'
//! gRPC links). When the peer's process dies (SIGKILL of a rank), such a write fails
//! with `EPIPE` and the kernel sends `SIGPIPE` to the writer; with the default action
//! that kills the whole survivor process on the spot, before it can report the failure
//! (no error, no `atexit`, no incident). Rust and Python programs ignore `SIGPIPE`
//! already; a C or C++ program usually does not. So on its first call the library sets
//! `SIGPIPE` to ignored **only when its action is still the default**; a handler or an
//! explicit ignore set by the application is left as it is. Like NCCL's own use of
//! `MSG_NOSIGNAL`, writes to a closed socket or pipe then fail with `EPIPE` instead.

/// What [`ignore_if_default`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The action was the default: now ignored.
    Ignored,
    /// The application had set an action: left alone.
    LeftAlone,
    /// The action could not be read or set (errno).
    Failed(i32),
}

/// Sets `SIGPIPE` to ignored when its action is the default (see the module docs).
pub(crate) fn ignore_if_default() -> Outcome {
    // SAFETY: a zeroed `sigaction` is a valid "no handler, empty mask" value; it is only
    // used as the output of the query.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries; `old` is a valid, writable sigaction.
    if unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) } != 0 {
        return Outcome::Failed(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    if old.sa_sigaction != libc::SIG_DFL {
        return Outcome::LeftAlone;
    }
    // SAFETY: installs SIG_IGN (no handler code runs); `new` is fully initialised (zeroed:
    // empty mask, no flags) and outlives the call.
    let rc = unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGPIPE, &new, std::ptr::null_mut())
    };
    if rc != 0 {
        return Outcome::Failed(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Outcome::Ignored
}

/// [`ignore_if_default`] once per process (called by every export).
pub(crate) fn once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match ignore_if_default() {
        Outcome::Ignored => tracing::debug!(target: "nccl::INIT",
            "CCL-D: SIGPIPE was at its default action; now ignored (a dead peer's socket must not kill this process)"),
        Outcome::LeftAlone => {}
        Outcome::Failed(e) => tracing::debug!(target: "nccl::INIT",
            "CCL-D: cannot set SIGPIPE to ignored (errno {e})"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn action() -> libc::sighandler_t {
        // SAFETY: as in `ignore_if_default`: query only, into a valid zeroed value.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(
                libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old),
                0
            );
            old.sa_sigaction
        }
    }

    fn set(h: libc::sighandler_t) {
        // SAFETY: installs SIG_DFL / SIG_IGN / a valid `extern "C" fn(c_int)` handler.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = h;
            assert_eq!(
                libc::sigaction(libc::SIGPIPE, &new, std::ptr::null_mut()),
                0
            );
        }
    }

    extern "C" fn app_handler(_: libc::c_int) {}

    /// One test (the signal action is process-wide): a default action becomes ignored and
    /// a write to a pipe whose reader is gone then fails with EPIPE instead of killing this
    /// process; an application's own handler is kept.
    #[test]
    fn default_sigpipe_becomes_ignored_and_an_apps_handler_is_kept() {
        set(libc::SIG_DFL);
        assert_eq!(ignore_if_default(), Outcome::Ignored);
        assert_eq!(action(), libc::SIG_IGN);
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe() writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: closes the read end this test owns.
        unsafe { libc::close(fds[0]) };
        // SAFETY: the write end is a valid descriptor owned from here on by the File.
        let mut w = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
        let e = w.write(b"x").expect_err("the reader is gone");
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        // Already ignored: left alone.
        assert_eq!(ignore_if_default(), Outcome::LeftAlone);
        let h = app_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
        set(h);
        assert_eq!(ignore_if_default(), Outcome::LeftAlone);
        assert_eq!(action(), h);
        set(libc::SIG_IGN);
    }
}
