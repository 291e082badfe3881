//! The admissions journal beside the state file (`<state_file>.journal/`,
//! a directory holding `current` and, during a write, `old`; a directory
//! so that appends wake no watcher of the config file's directory):
//! every admission of a calendar quota is written to the kernel before its
//! call is forwarded, so a crash (SIGKILL, an OOM kill, a panic) loses no
//! admission of a day; only a power loss loses what was not yet synced
//! (synced with each state-file write, every `flush_interval`).
//!
//! One line per admission, `account\tstate\tperiod\tperiod_id\tused\n`,
//! with the pair's count *after* it: replaying is raising each count to the
//! largest recorded ([`crate::store::memory::MemoryStore::raise_raw`]), so
//! a line replayed twice, or a line older than the state file, changes
//! nothing. Names never hold a tab or a newline (checked at config).
//!
//! At each state-file write the journal is turned over: `current`
//! becomes `old` and a new one is started *before* the
//! states are read for the snapshot, so every admission is in the snapshot
//! or in the new journal; the old one is deleted once the snapshot is
//! durable. At start both are replayed over the loaded state.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::limit::calendar::Period;

pub struct Journal {
    path: PathBuf,
    old: PathBuf,
    /// The file appended to (swapped at a turn-over; loaded per append
    /// without a lock).
    current: arc_swap::ArcSwap<File>,
    /// One turn-over at a time.
    turning: Mutex<()>,
}

/// At most this many calendar limits per rule (a day and a month).
pub const MAX_COUNTS: usize = 2;

/// A pair's calendar counts after an admission (unused slots `None`).
pub type Counts = [Option<(Period, i64, u64)>; MAX_COUNTS];

thread_local! {
    /// Each thread's line buffer: an append allocates nothing.
    static LINE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(256));
}

/// One admission as the journal recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub account: String,
    pub state: String,
    pub period: Period,
    pub period_id: i64,
    pub used: u64,
}

fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

impl Journal {
    /// The journal of the state file at `state_file`, opened for appending.
    pub fn open(state_file: &Path) -> io::Result<Journal> {
        let dir = sibling(state_file, ".journal");
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir)?;
        let (path, old) = (dir.join("current"), dir.join("old"));
        let file = open_append(&path)?;
        Ok(Journal { path, old, current: arc_swap::ArcSwap::from_pointee(file), turning: Mutex::new(()) })
    }

    /// Records that `account`'s `state` counts `used` calls in each
    /// `(period, period_id)`: one `write` to the kernel.
    pub fn append(&self, account: &str, state: &str, counts: &Counts) -> io::Result<()> {
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            for (period, id, used) in counts.iter().flatten() {
                line.extend_from_slice(account.as_bytes());
                line.push(b'\t');
                line.extend_from_slice(state.as_bytes());
                line.push(b'\t');
                line.extend_from_slice(period.as_str().as_bytes());
                line.push(b'\t');
                line.extend_from_slice(itoa::Buffer::new().format(*id).as_bytes());
                line.push(b'\t');
                line.extend_from_slice(itoa::Buffer::new().format(*used).as_bytes());
                line.push(b'\n');
            }
            (&**self.current.load()).write_all(&line)
        })
    }

    /// Makes what was appended durable.
    pub fn sync(&self) -> io::Result<()> {
        self.current.load().sync_data()
    }

    /// Starts a new journal, the current one set aside as `.old` (to be
    /// dropped once a snapshot holds it). `false` when an older one is
    /// still set aside (its snapshot failed): then the current one goes on.
    pub fn turn_over(&self) -> io::Result<bool> {
        let _one = self.turning.lock().unwrap_or_else(|e| e.into_inner());
        if self.old.exists() {
            return Ok(false);
        }
        self.current.load().sync_data()?;
        std::fs::rename(&self.path, &self.old)?;
        self.current.store(Arc::new(open_append(&self.path)?));
        Ok(true)
    }

    /// The snapshot holds what the set-aside journal held.
    pub fn drop_old(&self) {
        match std::fs::remove_file(&self.old) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(file = %self.old.display(), error = %e, "cannot remove the set-aside admissions journal")
            }
            _ => {}
        }
    }

    /// Every record of the set-aside and the current journal, oldest
    /// first; lines that do not read (a line cut by the crash) are skipped.
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for path in [&self.old, &self.path] {
            let Ok(file) = File::open(path) else { continue };
            for line in io::BufReader::new(file).lines().map_while(Result::ok) {
                if let Some(r) = parse(&line) {
                    out.push(r);
                }
            }
        }
        out
    }
}

fn parse(line: &str) -> Option<Record> {
    let mut f = line.split('\t');
    let (account, state, period, id, used) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    if f.next().is_some() {
        return None;
    }
    let period = match period {
        "day" => Period::Day,
        "month" => Period::Month,
        _ => return None,
    };
    Some(Record {
        account: account.to_owned(),
        state: state.to_owned(),
        period,
        period_id: id.parse().ok()?,
        used: used.parse().ok()?,
    })
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_turn_over_and_a_cut_line_is_skipped() {
        let dir = std::env::temp_dir().join(format!("wxgate-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let state = dir.join("state.json");
        let j = Journal::open(&state).expect("open");
        j.append("wxA", "send", &[Some((Period::Day, 20_000, 1)), None]).expect("append");
        assert!(j.turn_over().expect("turn over"));
        j.append("wxA", "send", &[Some((Period::Day, 20_000, 2)), Some((Period::Month, 657, 2))]).expect("append");
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("state.json.journal/current"))
            .expect("open")
            .write_all(b"wxA\tsend\tday\t2")
            .expect("cut");
        let records = j.records();
        assert_eq!(records.iter().map(|r| r.used).collect::<Vec<_>>(), vec![1, 2, 2]);
        assert_eq!(records[2].period, Period::Month);
        j.drop_old();
        assert_eq!(j.records().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
