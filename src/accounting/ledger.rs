//! The ledger file: records, replay (catch-up), durable appends, the OS file lock and timestamps.
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use dpfusion_udfs::privacy::{Event, Profile};
use serde::{Deserialize, Serialize};

use super::{
    AccountingError, LedgerEntry, TableKey, TablePolicy, Visibility, check_budget, io_error,
};

/// One line of the ledger.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub(super) enum Record {
    /// A table registered for the first time (or made stricter: public → private).
    Policy(TablePolicy),
    /// An explicit action of the data owner.
    Owner(TablePolicy),
    /// An admitted query.
    Charge(LedgerEntry),
}

/// What one table has been charged: every event, their composed profile, and the number of
/// charges.
#[derive(Debug)]
pub(super) struct Spend {
    pub events: Vec<Event>,
    pub profile: Profile,
    pub queries: u64,
}

/// The replayed ledger, plus how far the file has been read.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Byte offset of the end of the last record read (always the end of a complete line).
    pub offset: u64,
    /// Number of complete lines read.
    pub lines: u64,
    pub next_seq: u64,
    pub policies: HashMap<TableKey, TablePolicy>,
    /// Charges by key; a key may have charges before (or without) a policy in this session.
    pub tables: HashMap<TableKey, Spend>,
    pub entries: Vec<LedgerEntry>,
}

/// Applies one record to the state: the only way the state changes, on replay and on append.
fn apply(st: &mut State, rec: Record) -> Result<(), String> {
    match rec {
        Record::Policy(p) => {
            check_budget(&p.budget).map_err(|e| e.to_string())?;
            // A `policy` record can only make a table stricter; a private table stays as it is
            // (only an `owner` record may weaken it).
            let keep = st
                .policies
                .get(&p.key)
                .is_some_and(|e| e.visibility == Visibility::Private);
            if !keep {
                st.policies.insert(p.key.clone(), p);
            }
        }
        Record::Owner(p) => {
            check_budget(&p.budget).map_err(|e| e.to_string())?;
            st.policies.insert(p.key.clone(), p);
        }
        Record::Charge(entry) => {
            for t in &entry.tables {
                let spend = st.tables.entry(t.key.clone()).or_insert_with(|| Spend {
                    events: Vec::new(),
                    profile: Profile::zero(),
                    queries: 0,
                });
                spend.events.extend(t.events.iter().cloned());
                spend.profile.compose(&Profile::from_events(&t.events));
                spend.queries += 1;
            }
            st.next_seq = st.next_seq.max(entry.seq.saturating_add(1));
            st.entries.push(entry);
        }
    }
    Ok(())
}

fn corrupt(path: &Path, line: u64, message: String) -> AccountingError {
    AccountingError::Corrupt {
        path: path.to_path_buf(),
        line,
        message,
    }
}

/// Cuts a torn tail (an interrupted append) back to the end of the last complete record.
fn truncate(file: &File, path: &Path, len: u64) -> Result<(), AccountingError> {
    file.set_len(len)
        .and_then(|()| file.sync_data())
        .map_err(io_error(path))
}

/// Reads and applies every complete line after `st.offset`. Must be called with the exclusive
/// file lock held: a tail without a newline, or an unreadable last line, is then a torn write
/// (no writer is active) and is truncated. An unreadable line followed by others is corruption.
pub(super) fn catch_up(file: &File, path: &Path, st: &mut State) -> Result<(), AccountingError> {
    let len = file.metadata().map_err(io_error(path))?.len();
    if len < st.offset {
        return Err(corrupt(
            path,
            st.lines,
            "the file is shorter than the part this session already read (was it replaced or \
             truncated by hand?)"
                .to_string(),
        ));
    }
    if len == st.offset {
        return Ok(());
    }
    let mut buf = Vec::new();
    let mut reader = file;
    reader
        .seek(SeekFrom::Start(st.offset))
        .and_then(|_| reader.read_to_end(&mut buf))
        .map_err(io_error(path))?;
    let mut pos = 0;
    while pos < buf.len() {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            return truncate(file, path, st.offset);
        };
        let end = pos + nl + 1;
        let line = &buf[pos..pos + nl];
        let line_no = st.lines + 1;
        if !line.trim_ascii().is_empty() {
            match serde_json::from_slice::<Record>(line) {
                Ok(rec) => apply(st, rec).map_err(|m| corrupt(path, line_no, m))?,
                Err(_) if buf[end..].trim_ascii().is_empty() => {
                    return truncate(file, path, st.offset);
                }
                Err(e) => {
                    return Err(corrupt(path, line_no, format!("unreadable record ({e})")));
                }
            }
        }
        st.offset += (end - pos) as u64;
        st.lines += 1;
        pos = end;
    }
    Ok(())
}

/// Appends one record (one `write_all` of the whole line), fsyncs it, then applies it to the
/// state. Must be called with the exclusive file lock held, right after [`catch_up`].
pub(super) fn append(
    file: &File,
    path: &Path,
    st: &mut State,
    rec: Record,
) -> Result<(), AccountingError> {
    let mut line = serde_json::to_string(&rec).map_err(|e| io_error(path)(io::Error::other(e)))?;
    if serde_json::from_str::<Record>(&line).is_err() {
        // E.g. a non-finite number, which JSON cannot hold: never write what replay cannot read.
        return Err(io_error(path)(io::Error::other(format!(
            "refusing to write a record that could not be read back: {line}"
        ))));
    }
    line.push('\n');
    let mut writer = file;
    if let Err(e) = writer
        .write_all(line.as_bytes())
        .and_then(|()| file.sync_data())
    {
        // Not admitted: remove whatever part reached the file (best effort; replay would too).
        let _ = file.set_len(st.offset);
        return Err(io_error(path)(e));
    }
    st.offset += line.len() as u64;
    st.lines += 1;
    let line_no = st.lines;
    apply(st, rec).map_err(|m| corrupt(path, line_no, m))
}

/// An exclusive OS lock on the ledger file (excludes other processes and other `Accountant`s on
/// the same file), released on drop.
pub(super) struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    pub fn exclusive(file: &'a File) -> io::Result<Self> {
        file.lock()?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// The current UTC time as RFC 3339 with milliseconds, e.g. `2026-11-22T18:40:00.123Z`.
pub(super) fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(d.as_secs(), d.subsec_millis())
}

pub(super) fn format_rfc3339(secs: u64, millis: u32) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}
