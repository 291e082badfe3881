//! The journal beside the state file (`<state_file>.journal/`, a
//! directory holding `current` and, during a write, `old`; a directory so
//! that appends wake no watcher of the config file's directory): every
//! state change a crash must keep is written to the kernel before it takes
//! effect for any call (under the pair's lock), so a crash (SIGKILL, an OOM
//! kill, a panic) loses none of them; only a power loss loses what was not
//! yet synced (synced with each state-file write, every `flush_interval`).
//!
//! One line per change, in the order the pair saw them:
//!
//! - an admission of a calendar quota (or a count raised to WeChat's,
//!   `quota_sync`): `account\tstate\tday|month\tperiod_id\tused\n`, with
//!   the pair's count *after* it; replaying raises the count to it
//!   ([`crate::store::memory::MemoryStore::raise_count`]'s rule), so a line
//!   replayed twice, or older than the state file, changes nothing;
//! - a penalty's change (WeChat's penalised errcode, its escalation, an
//!   operator's penalty or lift, a success that ends the escalation):
//!   `account\tstate\tpenalty\tuntil\tstarted\tlevel\tlast_len\n`, the
//!   whole penalty state after it; replaying sets it;
//! - a clear (`clear_quota` WeChat accepted, the admin API's clear):
//!   `account\tstate\tclear\tat\n`; replaying clears the pair as at `at`
//!   ([`crate::limit::decide::clear`]), so the admissions after it count
//!   from zero again;
//! - a day limit WeChat reported (`quota_sync`, [`crate::limit::learned`]):
//!   `account\tstate\tlearned\tlimit\tat\n`; replaying sets it;
//! - a window a frequency 45009 lowered (`learn_windows`):
//!   `account\tstate\twindow\tper\tcount\tburst\tT\ttolerance\tat\tuntil\n`;
//!   replaying sets it.
//!
//! Replayed in order over the loaded state file, the lines give the state
//! of the crash: every change after the snapshot's read of a pair is in
//! the journal after the changes it followed. Names never hold a tab or a
//! newline (checked at config). A wxgate before penalty and clear lines
//! skips them.
//!
//! At each state-file write the journal is turned over: `current`
//! becomes `old` and a new one is started *before* the
//! states are read for the snapshot, so every change is in the snapshot
//! or in the new journal; the old one is deleted once the snapshot is
//! durable. At start both are replayed over the loaded state.
//!
//! The directory must be wxgate's alone (owned by its user, not writable by
//! group or others) and its files are opened without following a link
//! ([`crate::store::state_file::private_dir`]): otherwise wxgate does not start.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::limit::calendar::Period;
use crate::limit::learned::LearnedWindow;
use crate::limit::penalty::PenaltyState;
use crate::store::state_file::{open_private, private_dir, PrivateError};
use crate::time::Micros;

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

/// One change as the journal recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub account: String,
    pub state: String,
    pub change: Change,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The calendar count of `period` `period_id` after an admission.
    Count { period: Period, period_id: i64, used: u64 },
    /// The penalty state after a change.
    Penalty(PenaltyState),
    /// The pair was cleared at `at` (store time).
    Clear { at: Micros },
    /// WeChat reported `limit` as the pair's day limit at `at`.
    Learned { limit: u64, at: Micros },
    /// A window a frequency 45009 lowered.
    Window(LearnedWindow),
}

fn open_append(path: &Path) -> Result<File, PrivateError> {
    open_private(path, OpenOptions::new().append(true).create(true))
}

/// Starts a line `account\tstate\t` in `line`.
fn start(line: &mut Vec<u8>, account: &str, state: &str) {
    line.extend_from_slice(account.as_bytes());
    line.push(b'\t');
    line.extend_from_slice(state.as_bytes());
    line.push(b'\t');
}

fn field(line: &mut Vec<u8>, n: impl itoa::Integer, last: bool) {
    line.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    line.push(if last { b'\n' } else { b'\t' });
}

impl Journal {
    /// The journal of the state file at `state_file`, opened for appending.
    /// [`PrivateError::NotPrivate`] when its directory or a file in it is
    /// not wxgate's alone (a link, another owner, writable by others).
    pub fn open(state_file: &Path) -> Result<Journal, PrivateError> {
        let dir = sibling(state_file, ".journal");
        private_dir(&dir)?;
        let (path, old) = (dir.join("current"), dir.join("old"));
        let file = open_append(&path)?;
        // Read at start (replayed): never through a link either.
        if std::fs::symlink_metadata(&old).is_ok() {
            open_private(&old, OpenOptions::new().read(true))?;
        }
        Ok(Journal { path, old, current: arc_swap::ArcSwap::from_pointee(file), turning: Mutex::new(()) })
    }

    /// Records that `account`'s `state` counts `used` calls in each
    /// `(period, period_id)`: one `write` to the kernel.
    pub fn append(&self, account: &str, state: &str, counts: &Counts) -> io::Result<()> {
        self.write(|line| {
            for (period, id, used) in counts.iter().flatten() {
                start(line, account, state);
                line.extend_from_slice(period.as_str().as_bytes());
                line.push(b'\t');
                field(line, *id, false);
                field(line, *used, true);
            }
        })
    }

    /// Records `account`'s `state`'s penalty state after a change.
    pub fn append_penalty(&self, account: &str, state: &str, p: &PenaltyState) -> io::Result<()> {
        self.write(|line| {
            start(line, account, state);
            line.extend_from_slice(b"penalty\t");
            field(line, p.until, false);
            field(line, p.started, false);
            field(line, p.level, false);
            field(line, p.last_len, true);
        })
    }

    /// Records that `account`'s `state` was cleared at `at`.
    pub fn append_clear(&self, account: &str, state: &str, at: Micros) -> io::Result<()> {
        self.write(|line| {
            start(line, account, state);
            line.extend_from_slice(b"clear\t");
            field(line, at, true);
        })
    }

    /// Records the day limit WeChat reported for `account`'s `state` at `at`.
    pub fn append_learned(&self, account: &str, state: &str, limit: u64, at: Micros) -> io::Result<()> {
        self.write(|line| {
            start(line, account, state);
            line.extend_from_slice(b"learned\t");
            field(line, limit, false);
            field(line, at, true);
        })
    }

    /// Records a window a frequency 45009 lowered for `account`'s `state`.
    pub fn append_window(&self, account: &str, state: &str, l: &LearnedWindow) -> io::Result<()> {
        self.write(|line| {
            start(line, account, state);
            line.extend_from_slice(b"window\t");
            field(line, l.per_us, false);
            field(line, l.count, false);
            field(line, l.burst, false);
            field(line, l.interval_us, false);
            field(line, l.tolerance_us, false);
            field(line, l.at, false);
            field(line, l.until, false);
            field(line, l.took, true);
        })
    }

    /// Writes what `fill` puts in this thread's line buffer, with one `write`.
    fn write(&self, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            fill(&mut line);
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
        let file = open_append(&self.path).map_err(|e| match e {
            PrivateError::Io(e) => e,
            PrivateError::NotPrivate(e) => io::Error::other(e.0),
        })?;
        self.current.store(Arc::new(file));
        Ok(true)
    }

    /// The snapshot holds what the set-aside journal held.
    pub fn drop_old(&self) {
        match std::fs::remove_file(&self.old) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(file = %self.old.display(), error = %e, "cannot remove the set-aside journal")
            }
            _ => {}
        }
    }

    /// Every record of the set-aside and the current journal, oldest
    /// first; lines that do not read (a line cut by the crash) are skipped.
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for path in [&self.old, &self.path] {
            let Ok(file) = open_private(path, OpenOptions::new().read(true)) else { continue };
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
    let f: Vec<&str> = line.split('\t').collect();
    let (account, state) = (f.first()?.to_string(), f.get(1)?.to_string());
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok());
    let change = match (*f.get(2)?, f.len()) {
        ("day" | "month", 5) => Change::Count {
            period: if f[2] == "day" { Period::Day } else { Period::Month },
            period_id: n(3)?,
            used: f[4].parse().ok()?,
        },
        ("penalty", 7) => {
            Change::Penalty(PenaltyState { until: n(3)?, started: n(4)?, level: f[5].parse().ok()?, last_len: n(6)? })
        }
        ("clear", 4) => Change::Clear { at: n(3)? },
        ("learned", 5) => Change::Learned { limit: f[3].parse().ok()?, at: n(4)? },
        // The 11th field (what WeChat took) is absent in journals of wxgate
        // before it: 0, nothing known.
        ("window", 10 | 11) => Change::Window(LearnedWindow {
            per_us: n(3)?,
            count: f[4].parse().ok()?,
            burst: f[5].parse().ok()?,
            interval_us: n(6)?,
            tolerance_us: n(7)?,
            at: n(8)?,
            until: n(9)?,
            took: f.get(10).map_or(Some(0), |v| v.parse().ok())?,
        }),
        _ => return None,
    };
    Some(Record { account, state, change })
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
        let p = PenaltyState { until: 5, started: 2, level: 3, last_len: 3 };
        j.append_penalty("wxA", "send", &p).expect("append");
        j.append_clear("wxA", "send", 7).expect("append");
        j.append_learned("wxA", "send", 30, 8).expect("append");
        let w = LearnedWindow {
            per_us: 60,
            count: 5,
            burst: 1,
            interval_us: 12,
            tolerance_us: 0,
            at: 9,
            until: 99,
            took: 7,
        };
        j.append_window("wxA", "send", &w).expect("append");
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("state.json.journal/current"))
            .expect("open")
            .write_all(b"wxA\tsend\tday\t2")
            .expect("cut");
        let changes: Vec<Change> = j.records().into_iter().map(|r| r.change).collect();
        let count =
            |period, used| Change::Count { period, period_id: if period == Period::Day { 20_000 } else { 657 }, used };
        assert_eq!(
            changes,
            vec![
                count(Period::Day, 1),
                count(Period::Day, 2),
                count(Period::Month, 2),
                Change::Penalty(p),
                Change::Clear { at: 7 },
                Change::Learned { limit: 30, at: 8 },
                Change::Window(w),
            ]
        );
        j.drop_old();
        assert_eq!(j.records().len(), 6);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A journal line of a wxgate before `took`: the window with nothing
    /// known of what WeChat took.
    #[test]
    fn an_older_window_line_reads_with_nothing_taken() {
        let r = parse("wxA\tsend\twindow\t60\t5\t1\t12\t0\t9\t99").map(|r| r.change);
        let w = LearnedWindow {
            per_us: 60,
            count: 5,
            burst: 1,
            interval_us: 12,
            tolerance_us: 0,
            at: 9,
            until: 99,
            took: 0,
        };
        assert_eq!(r, Some(Change::Window(w)));
    }
}
