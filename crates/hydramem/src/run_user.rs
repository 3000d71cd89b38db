//! `hydramem run --user USER`: the program runs as USER, with USER's primary group and
//! supplementary groups (as `runuser -u USER` or `setpriv --init-groups` would set them),
//! while `hydramem run` itself stays root to start it.
//!
//! Why not `hydramem run -- setpriv … CMD`: the pager is preloaded into every program the
//! command executes, setpriv included, and its thread is there when setpriv changes users.
//! setpriv keeps its capabilities across the change in its own thread only
//! (PR_SET_KEEPCAPS), so its next change of group succeeds there and fails in the pager's
//! thread, and the C library aborts the process. Here the change happens in the child
//! before it executes CMD, with one thread; CMD starts with the pager as USER.
//!
//! USER may not be allowed to make a userfaultfd (vm.unprivileged_userfaultfd = 0 and
//! /dev/userfaultfd root's): the child keeps a descriptor of /dev/userfaultfd, opened as
//! root, across the change and the exec, and the pager makes its userfaultfd through it.
//! That descriptor is inherited by what CMD executes (each gets a pager of its own), and it
//! only ever makes userfaultfds for the process that uses it.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The user a program runs as.
#[derive(Debug, Clone, PartialEq)]
pub struct RunAs {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
    pub home: PathBuf,
}

impl RunAs {
    /// USER (a name, or a number) from the user database, with its groups.
    pub fn lookup(user: &str) -> Result<RunAs> {
        let name = CString::new(user).with_context(|| format!("--user {user:?}"))?;
        let mut pw: libc::passwd = unsafe_zeroed_passwd();
        let mut buf = vec![0 as libc::c_char; 16 << 10];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is to a live local of the right type; `buf`'s length is
        // given, and the strings `pw` points to live in `buf`, which outlives their use.
        let r = unsafe {
            match user.parse::<libc::uid_t>() {
                Ok(uid) => libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found),
                Err(_) => libc::getpwnam_r(
                    name.as_ptr(),
                    &mut pw,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut found,
                ),
            }
        };
        if r != 0 {
            bail!(
                "looking up --user {user}: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
        if found.is_null() {
            bail!("--user {user}: no such user (see getent passwd)");
        }
        // SAFETY: getpwnam_r/getpwuid_r succeeded: pw_name and pw_dir are C strings in `buf`.
        let (pw_name, home) = unsafe {
            (
                CStr::from_ptr(pw.pw_name).to_owned(),
                CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned(),
            )
        };
        let groups = group_list(&pw_name, pw.pw_gid)
            .with_context(|| format!("listing the groups of --user {user}"))?;
        Ok(RunAs {
            name: pw_name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            groups,
            home: home.into(),
        })
    }

    /// Makes `cmd` run as this user: its environment's USER, LOGNAME and HOME, and the
    /// change of groups and user in the child before it executes. With `dev` (a descriptor
    /// of /dev/userfaultfd), the child keeps it open across the exec.
    pub fn apply(&self, cmd: &mut Command, dev: Option<&OwnedFd>) {
        cmd.env("USER", &self.name)
            .env("LOGNAME", &self.name)
            .env("HOME", &self.home);
        let (uid, gid, groups) = (self.uid, self.gid, self.groups.clone());
        let dev = dev.map(|d| d.as_raw_fd());
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: fcntl, setgroups, setgid and setuid are
        // system calls; it allocates nothing (`groups` was built before).
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = dev {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: passwd is plain data (integers and pointers) for which all zeros is valid.
    unsafe { std::mem::zeroed() }
}

/// The groups of user `name` (primary group `gid` first).
fn group_list(name: &CStr, gid: libc::gid_t) -> Result<Vec<libc::gid_t>> {
    let mut n: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let asked = n;
        // SAFETY: `groups` has room for `n` entries, and getgrouplist is told so.
        let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            groups.truncate(n as usize);
            return Ok(groups);
        }
        if n <= asked {
            // It gives no larger count: do not loop.
            n = asked.saturating_mul(2);
        }
        if n > 65_536 {
            bail!("more than 65,536 groups");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_up_root_by_name_and_number() {
        let by_name = RunAs::lookup("root").unwrap();
        assert_eq!(by_name.uid, 0);
        assert_eq!(by_name.gid, 0);
        assert!(by_name.groups.contains(&0));
        assert_eq!(RunAs::lookup("0").unwrap(), by_name);
    }

    #[test]
    fn an_unknown_user_is_a_clear_error() {
        let e = RunAs::lookup("no-such-user-hydramem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such user"), "{e}");
        assert!(RunAs::lookup("a\0b").is_err());
    }
}
