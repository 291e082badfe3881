//! The memory store's state file: what outlives the process, in a documented
//! format, written so that a crash at any moment leaves the old file or the
//! new one, whole.
//!
//! # Format (version 1)
//!
//! One JSON object:
//!
//! ```json
//! {
//!   "format": "wxgate-state",
//!   "version": 1,
//!   "saved_at_us": 1795924800000000,
//!   "pairs": [
//!     { "account": "shop1", "rule": "send", "warmup_us": 0,
//!       "limits": [ { "window_us": 60000000, "tat": 1795924801000000 },
//!                   { "calendar": "day", "period": 20786, "used": 12, "next": 0 } ],
//!       "penalty": { "until": 1795925100000000, "started": 1795924800000000, "level": 1, "last_len": 300000000 },
//!       "warm_start": 0, "last_call": 1795924800000000,
//!       "shares": { "marketing": [ { "window_us": 60000000, "tat": 1795924801000000 } ] } }
//!   ],
//!   "token_refreshed": { "shop1": 1795924700000000 },
//!   "token_key": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
//!   "tokens": [ { "hash": "5bdcc146bf60754e6a042426089575c7", "account": "wx1234567890abcdef",
//!                 "until": 1795932000000000 } ]
//! }
//! ```
//!
//! Times are microseconds since the Unix epoch on the store's clock. A pair
//! is one (account, rule)'s [`RuleState`]: per window (by its length) the
//! GCRA theoretical arrival time, per calendar quota the period (days since
//! the epoch, or `year * 12 + month0`, in `quota_timezone`), the calls
//! counted in it and those already reserved for the next one (see
//! [`crate::limit`]); the penalty and its escalation ([`crate::limit::penalty`],
//! left out when there never was one); the warm-up start and the last
//! admitted call; the longest warm-up of the rule versions that used it;
//! and, for a rule with `max_share`, each caller's use of its share (its
//! limits as above, by caller label; left out when there is none).
//! Concurrency slots are not kept: their holders were calls of the process
//! that wrote the file. `token_refreshed` is the last access-token refresh
//! per account (warm-up restarts from it). `tokens` are the learned access
//! tokens ([`crate::store::tokens`]): each token's keyed hash under
//! `token_key` (never the token), the account it was issued to and when it
//! expires; both keys may be missing (a file from before them: a new key is
//! made). A file of another `format` or `version` is unreadable to this wxgate.
//!
//! # Writing
//!
//! To `<file>.tmp` in the same directory, fsync, rename over `<file>`, fsync
//! the directory: readers see the old file or the new one, never a mix.
//! A JSON file written whole rather than an embedded database (sled, redb,
//! SQLite): the state is small, has one writer, is read once at start-up,
//! and a rename is atomic on every POSIX file system; the file stays
//! readable and mendable by hand, and no storage engine with its own crash
//! recovery and format upgrades comes into the binary for it.
//!
//! # One writer
//!
//! `<file>.lock` beside it is locked (an advisory `flock`) while wxgate runs,
//! so that two processes never overwrite each other's state. The lock is
//! taken with the `fs4` crate: `std::fs::File::try_lock` is stable only
//! since Rust 1.89 and wxgate builds on 1.85; `fs4` is small, pure Rust
//! (over `rustix`, already in the dependency tree) and kept up to date.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use crate::limit::calendar::Period;
use crate::limit::learned::{LearnedDay, LearnedWindow};
use crate::limit::penalty::PenaltyState;
use crate::limit::{LimitState, RuleState, ShareState, WindowKey};
use crate::store::tokens::{TokenHash, TokenKey};
use crate::time::Micros;

const FORMAT: &str = "wxgate-state";
/// The format this wxgate writes and reads.
pub const VERSION: u32 = 1;

/// One (account, rule state)'s state as kept (`rule` is [`crate::limit::Rule::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub account: String,
    pub rule: Arc<str>,
    /// Without concurrency slots.
    pub state: RuleState,
    /// The longest warm-up of the rule versions that used this state.
    pub warmup_us: Micros,
}

/// A whole state file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    pub saved_at_us: Micros,
    pub pairs: Vec<Pair>,
    /// Last access-token refresh per account.
    pub token_refreshed: Vec<(String, Micros)>,
    /// What `tokens` are hashed under (`None`: none written yet).
    pub token_key: Option<TokenKey>,
    pub tokens: Vec<Learned>,
}

/// A learned access token: its hash, its account, when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    pub hash: TokenHash,
    pub account: String,
    pub until: Micros,
}

impl Saved {
    /// Drops what can no longer change a decision at `now` (past periods,
    /// refilled windows, penalties ended and no longer recent, warm-ups
    /// over): exactly what the running store would have forgotten by then
    /// ([`RuleState::is_idle`]). `keep_warm_us` is the longest warm-up of
    /// any rule. Returns how many pairs were dropped.
    pub fn drop_stale(&mut self, now: Micros, offset_us: Micros, keep_warm_us: Micros) -> usize {
        let before = self.pairs.len();
        self.pairs.retain(|p| !p.state.is_idle(now, offset_us, p.warmup_us));
        self.token_refreshed.retain(|(_, at)| at.saturating_add(keep_warm_us) > now);
        self.tokens.retain(|t| t.until > now);
        before - self.pairs.len()
    }
}

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    format: Cow<'a, str>,
    version: u32,
}

/// The file as read, once [`Header`] was checked ([`FileOut`] writes the same shape).
#[derive(Deserialize)]
struct FileV1<'a> {
    saved_at_us: Micros,
    #[serde(borrow)]
    pairs: Vec<FilePair<'a>>,
    #[serde(borrow, default)]
    token_refreshed: BTreeMap<Cow<'a, str>, Micros>,
    #[serde(borrow, default)]
    token_key: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tokens: Vec<FileToken<'a>>,
}

#[derive(Serialize, Deserialize)]
struct FileToken<'a> {
    #[serde(borrow)]
    hash: Cow<'a, str>,
    #[serde(borrow)]
    account: Cow<'a, str>,
    until: Micros,
}

#[derive(Serialize, Deserialize)]
struct FilePair<'a> {
    #[serde(borrow)]
    account: Cow<'a, str>,
    #[serde(borrow)]
    rule: Cow<'a, str>,
    #[serde(default)]
    warmup_us: Micros,
    limits: Vec<FileLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    penalty: Option<FilePenalty>,
    warm_start: Micros,
    last_call: Micros,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    shares: BTreeMap<Cow<'a, str>, Vec<FileLimit>>,
    /// `per_recipient`: each recipient's key (a hash of its id, never the
    /// id) and its windows' (length, TAT). Absent in files of wxgate before
    /// it, which read back with no recipient state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    recipients: Vec<(u64, Vec<(Micros, Micros)>)>,
    /// The day limit WeChat reported ([`crate::limit::learned`]). Absent
    /// in files of wxgate before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    learned_day: Option<FileLearned>,
    /// Windows a frequency 45009 lowered (`learn_windows`): (length, count,
    /// burst, T, τ, at, until). Absent in files of wxgate before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learned_windows: Vec<(Micros, u64, u64, Micros, Micros, Micros, Micros)>,
    /// Of the lowered windows that saw WeChat take calls: (length, the most
    /// calls WeChat took in one window). Apart from `learned_windows`, so
    /// that a wxgate before it still reads the file (it ignores this key);
    /// absent in its files (nothing known: 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learned_took: Vec<(Micros, u64)>,
    /// Per window length, when its current run began (`learn_windows`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    runs: Vec<(Micros, Micros)>,
}

#[derive(Serialize, Deserialize)]
struct FileLearned {
    limit: u64,
    at: Micros,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum FileLimit {
    Window { window_us: Micros, tat: Micros },
    Calendar { calendar: FilePeriod, period: i64, used: u64, next: u64 },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FilePeriod {
    Day,
    Month,
}

#[derive(Serialize, Deserialize)]
struct FilePenalty {
    until: Micros,
    started: Micros,
    level: u32,
    last_len: Micros,
}

/// Writes `saved` in the file's format to `out`, pair by pair (no copy of
/// the whole file in memory).
pub fn encode_to(saved: &Saved, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(out, &FileOut(saved)).map_err(io::Error::from)
}

/// The file's bytes for `saved`.
pub fn encode(saved: &Saved) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing plain strings and integers to a Vec cannot fail.
    let _ = encode_to(saved, &mut out);
    out
}

/// [`FileV1`] as written: from a [`Saved`], converting one pair at a time.
struct FileOut<'a>(&'a Saved);

impl Serialize for FileOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let saved = self.0;
        let mut file = s.serialize_struct("FileV1", 7)?;
        file.serialize_field("format", FORMAT)?;
        file.serialize_field("version", &VERSION)?;
        file.serialize_field("saved_at_us", &saved.saved_at_us)?;
        file.serialize_field("pairs", &Pairs(&saved.pairs))?;
        file.serialize_field("token_refreshed", &Tokens(&saved.token_refreshed))?;
        if let Some(key) = &saved.token_key {
            file.serialize_field("token_key", &key.to_hex())?;
        }
        file.serialize_field("tokens", &LearnedTokens(&saved.tokens))?;
        file.end()
    }
}

struct Pairs<'a>(&'a [Pair]);

impl Serialize for Pairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(file_pair))
    }
}

struct Tokens<'a>(&'a [(String, Micros)]);

impl Serialize for Tokens<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(account, at)| (account, at)))
    }
}

struct LearnedTokens<'a>(&'a [Learned]);

impl Serialize for LearnedTokens<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| FileToken {
            hash: Cow::Owned(t.hash.to_hex()),
            account: Cow::Borrowed(&t.account),
            until: t.until,
        }))
    }
}

fn file_pair(p: &Pair) -> FilePair<'_> {
    let s = &p.state;
    let pen = s.penalty;
    FilePair {
        account: Cow::Borrowed(&p.account),
        rule: Cow::Borrowed(&p.rule),
        warmup_us: p.warmup_us,
        limits: file_limits(&s.limits),
        penalty: (pen != PenaltyState::default()).then_some(FilePenalty {
            until: pen.until,
            started: pen.started,
            level: pen.level,
            last_len: pen.last_len,
        }),
        warm_start: s.warm_start,
        last_call: s.last_call,
        shares: s.shares.iter().map(|sh| (Cow::Borrowed(&*sh.caller), file_limits(&sh.limits))).collect(),
        recipients: s
            .recipients
            .0
            .iter()
            .flat_map(|m| m.iter())
            .map(|(k, r)| (*k, r.iter().filter(|(per, _)| *per > 0).copied().collect()))
            .collect(),
        learned_day: s.learned_day.map(|l| FileLearned { limit: l.limit, at: l.at }),
        learned_windows: s
            .learned_windows
            .iter()
            .map(|l| (l.per_us, l.count, l.burst, l.interval_us, l.tolerance_us, l.at, l.until))
            .collect(),
        learned_took: s.learned_windows.iter().filter(|l| l.took > 0).map(|l| (l.per_us, l.took)).collect(),
        runs: s.runs.clone(),
    }
}

fn file_limits(limits: &[(WindowKey, LimitState)]) -> Vec<FileLimit> {
    limits
        .iter()
        .filter_map(|(key, state)| match (*key, *state) {
            (WindowKey::Window(window_us), LimitState::Tat(tat)) => Some(FileLimit::Window { window_us, tat }),
            (WindowKey::Calendar(p), LimitState::Count { period_id, used, next }) => {
                let calendar = match p {
                    Period::Day => FilePeriod::Day,
                    Period::Month => FilePeriod::Month,
                };
                Some(FileLimit::Calendar { calendar, period: period_id, used, next })
            }
            // Never written by the decision; nothing a decision would read.
            _ => None,
        })
        .collect()
}

fn state_limits(limits: Vec<FileLimit>) -> Vec<(WindowKey, LimitState)> {
    limits
        .into_iter()
        .map(|l| match l {
            FileLimit::Window { window_us, tat } => (WindowKey::Window(window_us), LimitState::Tat(tat)),
            FileLimit::Calendar { calendar, period, used, next } => {
                let p = match calendar {
                    FilePeriod::Day => Period::Day,
                    FilePeriod::Month => Period::Month,
                };
                (WindowKey::Calendar(p), LimitState::Count { period_id: period, used, next })
            }
        })
        .collect()
}

/// Why a state file's bytes cannot be read back (the file is then moved
/// aside and the store starts empty, saying this).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON with a `format` and a `version` (garbage, cut short).
    #[error("not a wxgate state file ({0})")]
    NotOurs(serde_json::Error),
    /// Another `format` than [`FORMAT`].
    #[error("not a wxgate state file (format \"{0}\")")]
    Format(String),
    /// Another version than [`VERSION`].
    #[error("state file version {0} (this wxgate reads version {VERSION})")]
    Version(u32),
    /// This format and version, but not what they hold.
    #[error("unreadable state file ({0})")]
    Unreadable(serde_json::Error),
    #[error("unreadable state file (token_key is not 64 hex digits)")]
    TokenKey,
    #[error("unreadable state file (a token's hash is not 32 hex digits)")]
    TokenHash,
}

/// Reads a state file's bytes; the error says what is wrong with them.
pub fn decode(bytes: &[u8]) -> Result<Saved, DecodeError> {
    let header: Header<'_> = serde_json::from_slice(bytes).map_err(DecodeError::NotOurs)?;
    if header.format != FORMAT {
        return Err(DecodeError::Format(header.format.into_owned()));
    }
    if header.version != VERSION {
        return Err(DecodeError::Version(header.version));
    }
    let file: FileV1<'_> = serde_json::from_slice(bytes).map_err(DecodeError::Unreadable)?;
    let pairs = file
        .pairs
        .into_iter()
        .map(|p| {
            let limits = state_limits(p.limits);
            let shares = p
                .shares
                .into_iter()
                .map(|(caller, limits)| ShareState { caller: Arc::from(&*caller), limits: state_limits(limits) })
                .collect();
            let penalty = p.penalty.map_or_else(PenaltyState::default, |f| PenaltyState {
                until: f.until,
                started: f.started,
                level: f.level,
                last_len: f.last_len,
            });
            let mut recipients = crate::limit::Recipients::default();
            for (key, windows) in p.recipients {
                let state = recipients.entry(key);
                for (slot, w) in state.iter_mut().zip(windows) {
                    *slot = w;
                }
            }
            let state = RuleState {
                limits,
                penalty,
                warm_start: p.warm_start,
                last_call: p.last_call,
                holders: Vec::new(),
                shares,
                recipients,
                learned_day: p.learned_day.map(|l| LearnedDay { limit: l.limit, at: l.at }),
                learned_windows: p
                    .learned_windows
                    .into_iter()
                    .map(|(per_us, count, burst, interval_us, tolerance_us, at, until)| LearnedWindow {
                        per_us,
                        count,
                        burst,
                        interval_us,
                        tolerance_us,
                        at,
                        until,
                        took: p.learned_took.iter().find(|(per, _)| *per == per_us).map_or(0, |(_, took)| *took),
                    })
                    .collect(),
                runs: p.runs,
                lease_end: 0,
                leases: Vec::new(),
                cleared_at: 0,
            };
            Pair { account: p.account.into_owned(), rule: Arc::from(&*p.rule), state, warmup_us: p.warmup_us }
        })
        .collect();
    let token_refreshed = file.token_refreshed.into_iter().map(|(a, t)| (a.into_owned(), t)).collect();
    let token_key = match file.token_key {
        None => None,
        Some(hex) => Some(TokenKey::from_hex(&hex).ok_or(DecodeError::TokenKey)?),
    };
    let tokens = file
        .tokens
        .into_iter()
        .map(|t| {
            let hash = TokenHash::from_hex(&t.hash).ok_or(DecodeError::TokenHash)?;
            Ok(Learned { hash, account: t.account.into_owned(), until: t.until })
        })
        .collect::<Result<_, DecodeError>>()?;
    Ok(Saved { saved_at_us: file.saved_at_us, pairs, token_refreshed, token_key, tokens })
}

/// Why the memory store cannot open its state file
/// (`crate::store::memory::MemoryStore::open`): wxgate does not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the state file.
    #[error(transparent)]
    Busy(#[from] Busy),
    /// Someone else could have written the journal beside the state file:
    /// it is neither replayed nor written through.
    #[error("the journal beside the state file is not wxgate's alone: {0}")]
    Journal(NotPrivate),
}

/// Another process holds the state file's lock.
#[derive(Debug, thiserror::Error)]
#[error("another wxgate is using the state file {0} (its lock {1} is held): give each instance its own [store] state_file, or use the Redis store to share quotas")]
pub struct Busy(PathBuf, PathBuf);

/// The state file of this process: its path, and its lock while held.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    /// Why the lock could not be taken (and writes will likely fail), if so.
    unwritable: Option<String>,
    /// The locked `<path>.lock`, until [`StateFile::unlock`].
    lock: Mutex<Option<File>>,
}

/// Options that create a file readable and writable by its owner only.
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    options
}

/// A new file at `path`, 0600; fails if anything (a symlink too) is there.
fn private_new(path: &Path) -> io::Result<File> {
    private(OpenOptions::new().write(true).create_new(true)).open(path)
}

/// Options that never follow a symbolic link at the path's last component
/// (`O_NOFOLLOW`: opening a link fails) and create a file 0600: for every
/// file wxgate opens, rather than creates anew, beside the state file (its
/// lock, the admissions journal).
pub fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(options, rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    private(options)
}

/// A path beside the state file that someone else could have written,
/// or a link: wxgate refuses to start rather than use it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotPrivate(pub String);

/// Creating or checking a path beside the state file failed: an I/O error
/// (go on without it, saying so), or the path is not wxgate's own.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    NotPrivate(#[from] NotPrivate),
}

/// Creates `dir` (0700) if it is absent, and checks that it is wxgate's
/// alone: a directory, not a symbolic link, owned by this process's user,
/// not writable by its group or others. Nobody else can then plant a file
/// or a link in it.
pub fn private_dir(dir: &Path) -> Result<(), PrivateError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => builder.create(dir)?,
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(NotPrivate(format!(
            "{} is not a directory (a symbolic link or a file is there; wxgate never follows one there): remove it",
            dir.display()
        ))
        .into());
    }
    owned_alone(dir, &meta).map_err(PrivateError::from)
}

/// `path` (as `meta`, read without following a link) belongs to this
/// process's user and neither its group nor others may write it.
#[cfg(unix)]
fn owned_alone(path: &Path, meta: &std::fs::Metadata) -> Result<(), NotPrivate> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(NotPrivate(format!(
            "{} is owned by user id {}, not by wxgate's user (id {me}): someone else could plant files there; \
             remove it, or give it to wxgate's user (chown)",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(NotPrivate(format!(
            "{} has mode {:04o}: its group or others can write it, and so plant files or links there: chmod 700 {}",
            path.display(),
            meta.mode() & 0o7777,
            path.display()
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn owned_alone(_path: &Path, _meta: &std::fs::Metadata) -> Result<(), NotPrivate> {
    Ok(())
}

/// Opens `path` in a [`private_dir`] with `options` ([`no_follow`]): a link
/// there is refused ([`NotPrivate`]), never followed, and so is anything
/// but a regular file.
pub fn open_private(path: &Path, options: &mut OpenOptions) -> Result<File, PrivateError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(NotPrivate(format!(
            "{} is not a regular file (a symbolic link, or another kind of file; wxgate never follows a link there): \
                 remove it",
            path.display()
        ))
            .into())
        }
        _ => {}
    }
    // O_NOFOLLOW: a link planted since the look above fails the open.
    Ok(no_follow(options).open(path)?)
}

impl StateFile {
    /// Takes `<path>.lock` (creating the directory if need be). `Err` when
    /// another process holds it. When the lock file cannot even be created
    /// (a read-only or missing directory), the file is still opened for
    /// reading, with [`StateFile::unwritable`] saying why writes will fail.
    pub fn open(path: PathBuf) -> Result<StateFile, Busy> {
        let lock_path = sibling(&path, ".lock");
        // Never through a link planted at the lock's path.
        let lock = std::fs::create_dir_all(dir_of(&path)).and_then(|_| {
            no_follow(OpenOptions::new().read(true).write(true).create(true).truncate(false)).open(&lock_path)
        });
        let (lock, unwritable) = match lock {
            Err(e) => (None, Some(format!("cannot create {}: {e}", lock_path.display()))),
            Ok(file) => match fs4::FileExt::try_lock(&file) {
                Ok(()) => (Some(file), None),
                Err(fs4::TryLockError::WouldBlock) => return Err(Busy(path, lock_path)),
                // A file system without locks (some network ones): go on unlocked.
                Err(fs4::TryLockError::Error(e)) => {
                    tracing::warn!(lock = %lock_path.display(), error = %e, "cannot lock the state file; go on without");
                    (None, None)
                }
            },
        };
        Ok(StateFile { path, unwritable, lock: Mutex::new(lock) })
    }

    /// Lets another process take the file (after the last write).
    pub fn unlock(&self) {
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why writes will likely fail (the directory is not writable), if so.
    pub fn unwritable(&self) -> Option<&str> {
        self.unwritable.as_deref()
    }

    /// The file's bytes; `None` if there is no file yet.
    pub fn read(&self) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the file with what `fill` writes, atomically and durably:
    /// temporary file, fsync, rename, fsync of the directory.
    pub fn write(&self, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
        let tmp = sibling(&self.path, ".tmp");
        // A file (or a symlink someone planted) left at the temporary path
        // goes first; the new one is created, never opened: a link is not
        // followed, and only wxgate's user may read what it holds (the
        // token key's check, learned-token hashes).
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut out = BufWriter::with_capacity(256 * 1024, private_new(&tmp)?);
        fill(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &self.path)?;
        // Makes the rename itself durable. Opening a directory fails on some
        // platforms (Windows), where the rename is durable enough.
        if let Ok(dir) = File::open(dir_of(&self.path)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// Renames an unreadable file to `<path>.corrupt-<unix_secs>`, so that
    /// it is kept for a look and not overwritten. Its new path.
    pub fn move_aside(&self, unix_secs: i64) -> io::Result<PathBuf> {
        let to = sibling(&self.path, &format!(".corrupt-{unix_secs}"));
        std::fs::rename(&self.path, &to)?;
        Ok(to)
    }
}

/// `path` with `suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;
    const H: Micros = 3600 * S;
    /// 2026-11-29 10:00 Beijing.
    const NOW: Micros = 20_786 * 86_400 * S + 2 * H;
    const BEIJING: Micros = 8 * H;

    fn pair(account: &str, state: RuleState) -> Pair {
        Pair { account: account.into(), rule: Arc::from("send"), state, warmup_us: 0 }
    }

    fn counted(period_id: i64, used: u64) -> RuleState {
        RuleState {
            limits: vec![(WindowKey::Calendar(Period::Day), LimitState::Count { period_id, used, next: 0 })],
            last_call: NOW - H,
            ..RuleState::default()
        }
    }

    #[test]
    fn a_saved_state_reads_back_whole() {
        let today = Period::Day.id(NOW, BEIJING);
        let mut rich = counted(today, 12);
        rich.limits.push((WindowKey::Window(60 * S), LimitState::Tat(NOW + 3 * S)));
        rich.limits
            .push((WindowKey::Calendar(Period::Month), LimitState::Count { period_id: 24_322, used: 7, next: 1 }));
        rich.penalty = PenaltyState { until: NOW + 300 * S, started: NOW, level: 2, last_len: 300 * S };
        rich.warm_start = NOW - 10 * S;
        rich.shares = vec![
            ShareState { caller: "hr".into(), limits: vec![(WindowKey::Window(60 * S), LimitState::Tat(NOW + S))] },
            ShareState {
                caller: "marketing".into(),
                limits: vec![(
                    WindowKey::Calendar(Period::Day),
                    LimitState::Count { period_id: today, used: 3, next: 0 },
                )],
            },
        ];
        rich.learned_windows = vec![lowered(60 * S, 56), lowered(H, 0)];
        rich.runs = vec![(60 * S, NOW - 30 * S)];
        let saved = Saved {
            saved_at_us: NOW,
            pairs: vec![
                Pair { warmup_us: 30 * S, ..pair("shop-1", rich) },
                pair("\"odd\" \u{1F600}", counted(today, 1)),
            ],
            token_refreshed: vec![("shop-1".into(), NOW - S)],
            token_key: Some(TokenKey::random()),
            tokens: vec![Learned { hash: TokenKey::random().hash(b"TOKEN"), account: "wxA".into(), until: NOW + H }],
        };
        let bytes = encode(&saved);
        assert_eq!(decode(&bytes).map_err(|e| e.to_string()), Ok(saved));
        let text = String::from_utf8(bytes).expect("UTF-8");
        assert!(text.starts_with(r#"{"format":"wxgate-state","version":1,"#), "{text}");
    }

    /// A window a 45009 lowered, WeChat having taken `took` in one window.
    fn lowered(per_us: Micros, took: u64) -> LearnedWindow {
        LearnedWindow {
            per_us,
            count: 54,
            burst: 3,
            interval_us: 1_153_847,
            tolerance_us: 2_307_694,
            at: NOW,
            until: NOW + 14 * H,
            took,
        }
    }

    /// A file of a wxgate before `learned_took` (it ignores the key, so it
    /// reads this wxgate's files too): its lowered windows read back with
    /// nothing known of what WeChat took.
    #[test]
    fn a_lowered_window_of_an_older_file_reads_back_with_nothing_taken() {
        let state = RuleState { learned_windows: vec![lowered(60 * S, 56)], ..counted(1, 1) };
        let text =
            String::from_utf8(encode(&Saved { pairs: vec![pair("a", state)], ..Saved::default() })).expect("UTF-8");
        let older = text.replace(r#","learned_took":[[60000000,56]]"#, "");
        assert_ne!(older, text, "{text}");
        let saved = decode(older.as_bytes()).expect("an older file");
        assert_eq!(saved.pairs[0].state.learned_windows, [lowered(60 * S, 0)]);
    }

    #[test]
    fn a_penalty_free_pair_is_written_without_one() {
        let saved = Saved { pairs: vec![pair("a", counted(1, 1))], ..Saved::default() };
        assert!(!String::from_utf8(encode(&saved)).expect("UTF-8").contains("penalty"));
    }

    #[test]
    fn garbage_truncation_and_other_versions_are_refused_with_a_reason() {
        let decode = |bytes: &[u8]| decode(bytes).map_err(|e| e.to_string());
        let whole = encode(&Saved { pairs: vec![pair("a", counted(1, 1))], ..Saved::default() });
        let truncated = &whole[..whole.len() - 5];
        assert!(decode(truncated).unwrap_err().contains("not a wxgate state file (EOF"), "truncated");
        assert!(decode(b"\x00\x01garbage").unwrap_err().contains("not a wxgate state file"));
        assert!(decode(br#"{"format":"other","version":1}"#).unwrap_err().contains("format \"other\""));
        let v2 = String::from_utf8(whole.clone()).expect("UTF-8").replace(r#""version":1"#, r#""version":2"#);
        assert_eq!(decode(v2.as_bytes()), Err("state file version 2 (this wxgate reads version 1)".into()));
        let bad = String::from_utf8(whole).expect("UTF-8").replace(r#""used":1"#, r#""used":"x""#);
        assert!(decode(bad.as_bytes()).unwrap_err().starts_with("unreadable state file"));
        // Written before learned tokens: read without them.
        let older = decode(br#"{"format":"wxgate-state","version":1,"saved_at_us":0,"pairs":[]}"#).expect("older file");
        assert_eq!((older.token_key, older.tokens), (None, vec![]));
        let bad_key = br#"{"format":"wxgate-state","version":1,"saved_at_us":0,"pairs":[],"token_key":"00"}"#;
        assert_eq!(decode(bad_key), Err("unreadable state file (token_key is not 64 hex digits)".into()));
    }

    #[test]
    fn loading_keeps_todays_counts_and_recent_penalties_and_drops_the_rest() {
        let today = Period::Day.id(NOW, BEIJING);
        let penalised = |until: Micros, last_len: Micros| RuleState {
            penalty: PenaltyState { until, started: until - last_len, level: 1, last_len },
            ..RuleState::default()
        };
        let window = |tat: Micros| RuleState {
            limits: vec![(WindowKey::Window(60 * S), LimitState::Tat(tat))],
            last_call: tat - 60 * S,
            ..RuleState::default()
        };
        let warming = RuleState { last_call: NOW - 10 * S, ..window(NOW - S) };
        let mut saved = Saved {
            saved_at_us: NOW - H,
            pairs: vec![
                pair("today", counted(today, 12)),
                pair("yesterday", counted(today - 1, 20)),
                pair("live-penalty", penalised(NOW + 60 * S, 300 * S)),
                // Ended 100 s ago after 300 s: a repeat now would still escalate.
                pair("recent-penalty", penalised(NOW - 100 * S, 300 * S)),
                pair("old-penalty", penalised(NOW - 700 * S, 300 * S)),
                pair("window-busy", window(NOW + 5 * S)),
                pair("window-refilled", window(NOW - S)),
                Pair { warmup_us: 60 * S, ..pair("warming-up", warming.clone()) },
                Pair { warmup_us: 5 * S, ..pair("warmed-up", warming) },
            ],
            token_refreshed: vec![("fresh".into(), NOW - 10 * S), ("stale".into(), NOW - 100 * S)],
            tokens: vec![
                Learned { hash: TokenHash([1; 16]), account: "live".into(), until: NOW + 1 },
                Learned { hash: TokenHash([2; 16]), account: "expired".into(), until: NOW },
            ],
            ..Saved::default()
        };
        let dropped = saved.drop_stale(NOW, BEIJING, 60 * S);
        let kept: Vec<&str> = saved.pairs.iter().map(|p| p.account.as_str()).collect();
        assert_eq!(kept, ["today", "live-penalty", "recent-penalty", "window-busy", "warming-up"]);
        assert_eq!(dropped, 4);
        assert_eq!(saved.token_refreshed, vec![("fresh".to_owned(), NOW - 10 * S)]);
        let tokens: Vec<&str> = saved.tokens.iter().map(|t| t.account.as_str()).collect();
        assert_eq!(tokens, ["live"]);
    }

    /// The journal's directory must be wxgate's alone: another user's
    /// directory is refused (as root: one given to uid 65534; otherwise
    /// `/`, root's), and so are a link and a directory others may write.
    #[cfg(unix)]
    #[test]
    fn a_directory_of_another_user_a_link_or_one_others_may_write_is_not_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("wxgate-private-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mine = dir.join("mine");
        private_dir(&mine).expect("created 0700, mine");
        let mode = std::fs::metadata(&mine).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let refused = |path: &Path| match private_dir(path) {
            Err(PrivateError::NotPrivate(e)) => e.0,
            other => panic!("{}: {other:?}", path.display()),
        };
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o770)).expect("chmod");
        assert!(refused(&mine).contains("has mode 0770"));
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&mine, &link).expect("symlink");
        assert!(refused(&link).contains("is not a directory"));
        let (other, owner) = if rustix::process::geteuid().is_root() {
            let theirs = dir.join("theirs");
            private_dir(&theirs).expect("created");
            std::os::unix::fs::chown(&theirs, Some(65_534), None).expect("chown");
            (theirs, 65_534)
        } else {
            (PathBuf::from("/"), 0)
        };
        assert!(refused(&other).contains(&format!("is owned by user id {owner}")), "{}", other.display());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("wxgate-state-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = StateFile::open(dir.join("state.json")).expect("lock");
        assert_eq!(file.unwritable(), None);
        assert_eq!(file.read().expect("read"), None);
        file.write(|out| out.write_all(b"one")).expect("write");
        file.write(|out| out.write_all(b"two")).expect("write");
        assert_eq!(file.read().expect("read"), Some(b"two".to_vec()));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "the file and its lock: {names:?}");
        let aside = file.move_aside(42).expect("move aside");
        assert!(aside.ends_with("state.json.corrupt-42"));
        assert_eq!(file.read().expect("read"), None);
        // A second holder is refused while the first lives, welcome after.
        assert!(StateFile::open(dir.join("state.json")).is_err());
        file.unlock();
        assert!(StateFile::open(dir.join("state.json")).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
