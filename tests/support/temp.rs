//! Scratch directories under the system temp dir, removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory of this test process; removed with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `wxgate-test-<pid>-<n>-<tag>`: unique within the process (whose tests
    /// run at the same time), and across test processes (a child run of the
    /// test binary, another `cargo test`).
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("wxgate-test-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `contents` to `name` in this directory; its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        path
    }
}

impl TempDir {
    /// Replaces `name` the way editors and config maps do (written aside,
    /// renamed over it: one event for a watcher); its path.
    pub fn replace(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.join(name);
        let aside = self.join(&format!("{name}.tmp"));
        std::fs::write(&aside, contents).expect("write temp file");
        std::fs::rename(&aside, &path).expect("rename over");
        path
    }

    /// Writes a secret file only its owner reads (0600, as wxgate requires).
    pub fn write_secret(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.write(name, contents);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
        }
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
