//! The ledger file: records, the hash chain and its sidecar, replay (catch-up), durable appends,
//! migration of unchained ledgers, the OS file lock and timestamps. The format and the rules are
//! in docs/LEDGER.md.
//!
//! Every line is one JSON record carrying `prev`, the hex SHA-256 of the previous line's bytes
//! (without its newline); line 1 is a `header` (format, random ledger id) whose `prev` is the
//! genesis value of that id. After every fsync'd append the sidecar `<ledger>.head` is replaced
//! (atomically) by the line count and the hash of the last line, so a cut to a shorter prefix,
//! an edited last line or a replaced file are detected too. The witness (a copy of the same seal
//! kept by the data owner outside the ledger's directory, [`Witness`]) is updated after the
//! sidecar, so that a ledger rolled back together with its sidecar is detected as well. Replay
//! refuses, without changing a byte, anything that does not verify; the one exception is a last
//! line without its newline (an interrupted append), which is cut away.
//!
//! A charge stores at most [`QUERY_CAP`] bytes of its SQL text (and the SHA-256 of the whole),
//! in the file and in memory.
//!
//! Replay also keeps, per table, every relaxation the owner recorded and the line from which the
//! table has no guarantee (round 52, review operator F2, F3: [`State::relaxations`],
//! [`State::no_guarantee`]); `verify` lists both.
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::checkpoint::{self, CheckpointRecord};
use super::filter::{Currency, FilterKind, Usage};
use super::{
    AccountingError, BudgetRow, DEFAULT_QUERY_DELTA, LedgerEntry, NativeCost, NoGuarantee,
    Relaxation, TableKey, TablePolicy, Visibility, check_budget, display, io_error,
};

/// The most bytes of a statement's SQL text a charge stores: the JSON text of its `query` field
/// (the escaped string, so quotes and control characters count as written). The SHA-256 of the
/// whole text and its length are stored beside it.
pub const QUERY_CAP: usize = 4096;

/// Bytes `c` takes in a JSON string as serde_json writes it.
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// What a charge stores of the SQL text `sql`: the longest prefix (cut at a character boundary)
/// whose JSON text is at most [`QUERY_CAP`] bytes, the hex SHA-256 of the whole text, and the
/// whole text's length in bytes.
pub fn capped_query(sql: &str) -> (String, String, u64) {
    let mut used = 0;
    let mut end = sql.len();
    for (i, c) in sql.char_indices() {
        used += json_len(c);
        if used > QUERY_CAP {
            end = i;
            break;
        }
    }
    (
        sql[..end].to_string(),
        hex(&sha256(sql.as_bytes())),
        sql.len() as u64,
    )
}

/// Bounds a replayed charge in memory like a new one: a ledger written before the cap may hold
/// long texts; their hash and length are computed from the whole text before it is cut.
fn bound_query(entry: &mut LedgerEntry) {
    if entry.query_sha256.is_some() && entry.query.len() <= QUERY_CAP {
        return;
    }
    let (prefix, hash, bytes) = capped_query(&entry.query);
    if entry.query_sha256.is_none() {
        entry.query_sha256 = Some(hash);
        entry.query_bytes = Some(bytes);
    }
    entry.query = prefix;
}

/// The ledger format this version writes and reads: a header line, then records chained by
/// `prev`. Format 1 is the unchained format of earlier versions (no header, no `prev`); it is
/// refused on open and converted by [`migrate`].
pub const FORMAT: u32 = 2;

/// Hashed with the ledger id into the `prev` of the header line.
const GENESIS_TAG: &[u8] = b"dpfusion ledger genesis v2\n";

pub(super) type Hash = [u8; 32];

/// The first line of a ledger.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Header {
    pub format: u32,
    /// 128 random bits, hex: makes the chain of every ledger distinct.
    pub ledger_id: String,
    /// UTC, RFC 3339 with milliseconds.
    pub created: String,
}

/// One line of the ledger (without its `prev`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub(super) enum Record {
    /// Line 1, and only line 1.
    Header(Header),
    /// A table registered for the first time (or made stricter: public → private).
    Policy(TablePolicy),
    /// An explicit action of the data owner.
    Owner(TablePolicy),
    /// An admitted query.
    Charge(LedgerEntry),
    /// A checkpoint: the digest of the state replayed from the lines before it, whose state is
    /// kept in `<ledger>.checkpoint` (module `checkpoint`).
    Checkpoint(CheckpointRecord),
}

/// A line as written: the record, then the hash of the previous line.
#[derive(Serialize)]
struct LineOut<'a> {
    #[serde(flatten)]
    record: &'a Record,
    prev: &'a str,
}

/// A line as read.
#[derive(Deserialize)]
pub(super) struct LineIn {
    #[serde(flatten)]
    pub record: Record,
    pub prev: String,
}

/// The sidecar `<ledger>.head`: how many lines the ledger had after the last append, and the
/// hash of the last one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Head {
    format: u32,
    ledger_id: String,
    lines: u64,
    hash: String,
}

/// The witness: the sidecar's seal (line count, hash of that line) plus the ledger's length in
/// bytes, kept by the data owner in a file outside the ledger's directory and updated after the
/// sidecar with every append (docs/LEDGER.md, "The witness"). A ledger and sidecar rolled back
/// together to an older, self-consistent pair are shorter than it, or diverge from it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Witness {
    format: u32,
    /// The ledger it witnesses, as a path (informational: where it was when written).
    ledger: String,
    ledger_id: String,
    lines: u64,
    /// The ledger's length in bytes after line `lines`.
    bytes: u64,
    hash: String,
}

/// What one table has been charged, compactly (its size does not grow with the charges): the
/// running sums of its events in each tracked [`Currency`] and the numbers of charges and
/// events. The events themselves stay in the ledger's lines (what needs them, e.g. the composed
/// profile `dpfusion ledger verify` reports for a table without a policy, reads them there).
///
/// The sums are kept for μ² and ρ always, and for ε(α) at the order of every rdp policy the
/// table has had when it was first charged under it; a policy that puts another currency in
/// force after charges (an owner's change of the order) gets its sums by one pass over the
/// ledger's charges ([`track_currencies`]). Each sum is the left fold of the events in ledger
/// order ([`Currency::fold`]), so it is bit for bit the sum a full replay computes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Spend {
    pub sums: Vec<(Currency, Usage)>,
    pub queries: u64,
    /// Number of events charged (a charge may carry none).
    pub events: u64,
}

impl Spend {
    fn new(policy: Option<&TablePolicy>) -> Spend {
        let mut sums = vec![
            (Currency::Gdp, Usage::default()),
            (Currency::Zcdp, Usage::default()),
        ];
        if let Some(c) = policy.and_then(policy_currency)
            && !sums.iter().any(|(k, _)| *k == c)
        {
            sums.push((c, Usage::default()));
        }
        Spend {
            sums,
            queries: 0,
            events: 0,
        }
    }

    /// The sums in `currency`, when tracked.
    pub fn usage(&self, currency: Currency) -> Option<&Usage> {
        self.sums
            .iter()
            .find(|(c, _)| *c == currency)
            .map(|(_, u)| u)
    }
}

/// The currency of a policy's filter: the currency of its compiled filter whenever that
/// compiles, read from the kind without compiling it (a ledger's policies name the rdp order in
/// force; compiling runs bisections, and this is asked on every catch-up). `None` only for an
/// rdp policy without an order whose budget supports no order (it admits nothing).
fn policy_currency(p: &TablePolicy) -> Option<Currency> {
    match p.filter {
        FilterKind::Gdp => Some(Currency::Gdp),
        FilterKind::Zcdp => Some(Currency::Zcdp),
        FilterKind::Rdp { order: Some(order) } => Some(Currency::Rdp { order }),
        FilterKind::Rdp { order: None } => p.compiled_filter().ok().map(|f| f.currency()),
    }
}

/// The replayed ledger, plus how far the file has been read.
///
/// The fields not marked `serde(skip)` are the accountant's state: what replay produces, stored
/// as a whole in a checkpoint (module `checkpoint`; a change to their serialised form must bump
/// `checkpoint::LAYOUT`). The skipped ones say where the file was read to, and the log.
///
/// `Clone` is for [`apply_all`]'s copy, which moves the two logs (`entries`, `hashes`) rather
/// than cloning them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct State {
    /// Byte offset of the end of the last record read (always the end of a complete line).
    #[serde(skip)]
    pub offset: u64,
    /// Number of complete lines read (the header included).
    #[serde(skip)]
    pub lines: u64,
    /// Lines whose hash is not in `hashes` (those before the checkpoint this state was loaded
    /// from; 0 after a replay from line 1): `hashes[i]` is the hash of line `hash_base + i + 1`.
    #[serde(skip)]
    pub hash_base: u64,
    /// The line of the last checkpoint record read or written (0: none).
    #[serde(skip)]
    pub checkpoint_line: u64,
    /// Loaded from a checkpoint: the charges before it are not in `entries` until
    /// [`load_prefix`] reads them.
    #[serde(skip)]
    pub prefix: Option<Prefix>,
    pub next_seq: u64,
    pub policies: HashMap<TableKey, TablePolicy>,
    /// Charges by key; a key may have charges before (or without) a policy in this session.
    pub tables: HashMap<TableKey, Spend>,
    #[serde(skip)]
    pub entries: Vec<LedgerEntry>,
    /// From the header (line 1).
    pub ledger_id: Option<String>,
    /// SHA-256 of every line read or written since `hash_base`, in order: the chain, checked
    /// against the sidecar and the witness.
    #[serde(skip)]
    pub hashes: Vec<Hash>,
    /// Per private table, the largest ε budget any policy record gave it: its guarantee, since
    /// admissions made under a budget that was later lowered were checked against the larger one
    /// (docs/ACCOUNTING.md).
    pub largest_epsilon: HashMap<TableKey, f64>,
    /// The same for δ: the δ of the guarantee is the largest δ budget in force (issue 29).
    pub largest_delta: HashMap<TableKey, f64>,
    /// Number of `policy` and `owner` records.
    pub policy_records: u64,
    pub owner_records: u64,
    /// Per key, every relaxation an `owner` record recorded, in ledger order (round 52, review
    /// operator F2): a reason approves one change ([`super::policy::reason_recorded`]), and
    /// `dpfusion ledger verify` lists them.
    pub relaxations: HashMap<TableKey, Vec<Relaxation>>,
    /// Per key, the first line from which the table has no guarantee, and why (round 52, review
    /// operator F3; [`note_no_guarantee`]).
    pub no_guarantee: HashMap<TableKey, NoGuarantee>,
    /// Number of `checkpoint` records read: all of them on a full replay (`dpfusion ledger
    /// verify`), those after the checkpoint a session started from otherwise. Not part of the
    /// checkpointed state.
    #[serde(skip)]
    pub checkpoint_records: u64,
    /// The policies this accountant itself recorded (`policy` and `owner` records it appended),
    /// by key: a policy changed under a session is then said to come from this process, not
    /// from another one (round 46).
    #[serde(skip)]
    pub recorded_here: HashMap<TableKey, TablePolicy>,
    /// Per public file table planned by a statement: the number of `policy` and `owner`
    /// records applied when its files were last found to hold no private table's file (round
    /// 46, `super::still_in_force`); they are looked at again only once that number changes.
    #[serde(skip)]
    pub files_checked: HashMap<TableKey, u64>,
    /// Benchmarks only ([`super::Accountant::insecure_skip_fsync_for_benchmarks`]): appends are
    /// not fsync'd. Never set by a session or the CLI.
    #[serde(skip)]
    pub insecure_no_fsync: bool,
    /// A session's state, no longer only a replay: set by `Accountant::open_with` once its
    /// opening replay is done. The session then puts in it what no line says (the policies of
    /// its session-local tables, a recorded policy kept under the name registered now, and the
    /// sums of their currencies), so a `checkpoint` record its catch-ups read is checked for its
    /// place (its line count, its `prev`) but not for its digest, which names a replay's state
    /// (round 50, review crash F1; `checkpoint::check_record`). Never checkpointed.
    #[serde(skip)]
    pub live: bool,
}

/// The part of a ledger before the checkpoint a [`State`] was loaded from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prefix {
    /// Its length in bytes (the checkpoint record starts there).
    pub offset: u64,
    /// Its number of lines.
    pub lines: u64,
    /// The hash of its last line (the checkpoint record's `prev`).
    pub last: Hash,
}

fn note_largest(st: &mut State, p: &TablePolicy) {
    if p.visibility == Visibility::Private {
        let e = st.largest_epsilon.entry(p.key.clone()).or_insert(0.0);
        *e = e.max(p.budget.epsilon);
        let d = st.largest_delta.entry(p.key.clone()).or_insert(0.0);
        *d = d.max(p.budget.delta);
    }
}

/// Notes that the table of `p`, a `policy` or `owner` record applied at line `line` over the
/// policy `e` in force before it, has no guarantee from that line on, when it has none yet
/// (round 52, review operator F3):
/// - a private table made public: its rows could be read in clear, so no budget bounds what
///   its releases reveal together;
/// - a table that was public made private: its rows could be read in clear before;
/// - a change of the neighbour relation ([`super::policy::Change::voids_charges`]) of a table
///   with charges: their ε under the new relation is unbounded.
///
/// The filter goes on bounding later charges; only the guarantee shown changes ([`budget_row`]).
fn note_no_guarantee(st: &mut State, e: Option<&TablePolicy>, p: &TablePolicy, line: u64) {
    let Some(e) = e else {
        return;
    };
    if st.no_guarantee.contains_key(&p.key) {
        return;
    }
    let charged = st.tables.get(&p.key).is_some_and(|t| t.events > 0);
    let why = match (e.visibility, p.visibility) {
        (Visibility::Private, Visibility::Public) => {
            Some("the table was made public: its rows could be read in clear".to_string())
        }
        (Visibility::Public, Visibility::Private) => Some(
            "the table was public before it was made private: its rows could be read in clear"
                .to_string(),
        ),
        (Visibility::Private, Visibility::Private) if charged => {
            // A rename of a unit table whose domain was the table's name, recorded before round
            // 52 as a change of domain (its refusal advised `relax`), is no change of the
            // relation: both domains were their table's default (review "fixes2a" F2).
            let mut p = p.clone();
            let name = p.name.clone();
            if let (Some(eu), Some(pu)) = (&e.unit, &mut p.unit)
                && eu.column == pu.column
                && eu.domain == e.name
                && pu.domain == name
            {
                pu.domain = eu.domain.clone();
            }
            let relation: Vec<String> = super::policy::changes(e, &p)
                .into_iter()
                .filter(|c| c.voids_charges)
                .map(|c| c.what)
                .collect();
            (!relation.is_empty()).then(|| {
                format!(
                    "the neighbour relation changed on a table with charges ({}): their ε under \
                     the new relation is unbounded",
                    relation.join("; ")
                )
            })
        }
        _ => None,
    };
    if let Some(why) = why {
        st.no_guarantee
            .insert(p.key.clone(), NoGuarantee { line, why });
    }
}

/// Applies one record, line `line` of the ledger, to the state: the only way the state
/// changes, on replay and on append.
fn apply(st: &mut State, rec: Record, line: u64) -> Result<(), String> {
    match rec {
        Record::Header(h) => {
            if st.ledger_id.is_some() {
                return Err("a second header record".to_string());
            }
            st.ledger_id = Some(h.ledger_id);
        }
        Record::Policy(p) => {
            check_budget(&p.budget).map_err(|e| e.to_string())?;
            // A `policy` record can only make a table stricter (only an `owner` record may weaken
            // or change it); one that would weaken it is not applied.
            let keep = st
                .policies
                .get(&p.key)
                .is_some_and(|e| !super::policy::no_weaker(e, &p));
            if !keep {
                let e = st.policies.get(&p.key).cloned();
                note_no_guarantee(st, e.as_ref(), &p, line);
                note_largest(st, &p);
                st.policies.insert(p.key.clone(), p);
            }
            st.policy_records += 1;
        }
        Record::Owner(p) => {
            check_budget(&p.budget).map_err(|e| e.to_string())?;
            let e = st.policies.get(&p.key).cloned();
            note_no_guarantee(st, e.as_ref(), &p, line);
            note_largest(st, &p);
            if let Some(note) = &p.relaxed {
                st.relaxations
                    .entry(p.key.clone())
                    .or_default()
                    .push(Relaxation {
                        line,
                        note: note.clone(),
                    });
            }
            st.policies.insert(p.key.clone(), p);
            st.owner_records += 1;
        }
        Record::Charge(mut entry) => {
            bound_query(&mut entry);
            for t in &entry.tables {
                let policy = st.policies.get(&t.key);
                let spend = st
                    .tables
                    .entry(t.key.clone())
                    .or_insert_with(|| Spend::new(policy));
                for (c, u) in &mut spend.sums {
                    *u = c.fold(std::mem::take(u), &t.events);
                }
                spend.queries += 1;
                spend.events += t.events.len() as u64;
            }
            st.next_seq = st.next_seq.max(entry.seq.saturating_add(1));
            st.entries.push(entry);
        }
        Record::Checkpoint(c) => {
            checkpoint::check_record(st, &c)?;
            st.checkpoint_line = st.lines + 1;
            st.checkpoint_records += 1;
        }
    }
    Ok(())
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn sha256(bytes: &[u8]) -> Hash {
    let mut h = [0u8; 32];
    h.copy_from_slice(&Sha256::digest(bytes));
    h
}

/// The `prev` of the header line of the ledger `ledger_id`.
fn genesis(ledger_id: &str) -> String {
    let mut b = GENESIS_TAG.to_vec();
    b.extend_from_slice(ledger_id.as_bytes());
    hex(&sha256(&b))
}

fn new_ledger_id() -> String {
    hex(&rand::random::<[u8; 16]>())
}

/// `<ledger>.head`, beside the ledger.
pub fn head_path(path: &Path) -> PathBuf {
    sibling(path, ".head")
}

/// The default place of a ledger's witness when the data owner names none and there is no
/// catalog: `<D>.witness/<ledger file name>.witness`, where `<D>` is the ledger's directory
/// (canonical when it exists), i.e. in a sibling directory of the ledger's, outside it.
pub fn default_witness(ledger: &Path) -> Result<PathBuf, AccountingError> {
    let abs = std::path::absolute(ledger).map_err(io_error(ledger))?;
    let dir = canonical_prefix(abs.parent().unwrap_or(Path::new("/")));
    let (Some(up), Some(name), Some(file)) = (dir.parent(), dir.file_name(), abs.file_name())
    else {
        return Err(unverifiable(
            ledger,
            "its directory has no parent in which to keep the ledger's witness; name the \
             witness's file with the ledger_witness catalog key or --ledger-witness"
                .to_string(),
        ));
    };
    let mut d = name.to_os_string();
    d.push(".witness");
    let mut f = file.to_os_string();
    f.push(".witness");
    Ok(up.join(d).join(f))
}

/// `p` with its longest existing prefix canonicalised (symbolic links resolved): the same path
/// whether or not its last components exist yet.
fn canonical_prefix(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        if let Ok(c) = fs::canonicalize(cur) {
            return rest.iter().rev().fold(c, |acc: PathBuf, n| acc.join(n));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(up), Some(name)) => {
                rest.push(name.to_os_string());
                cur = up;
            }
            _ => return p.to_path_buf(),
        }
    }
}

pub(super) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// What to do about a ledger that does not verify; appended to every such error.
const RESTORE: &str = "Nothing was changed. Restore the ledger and its .head sidecar together \
     from a backup (`dpfusion ledger verify PATH` checks a copy); do not start a new ledger \
     unless the data owner decides that every budget may start again from zero";

fn corrupt(path: &Path, line: u64, message: String) -> AccountingError {
    AccountingError::Corrupt {
        path: path.to_path_buf(),
        line,
        message,
    }
}

fn unverifiable(path: &Path, message: String) -> AccountingError {
    AccountingError::Unverifiable {
        path: path.to_path_buf(),
        message,
    }
}

fn old_format(path: &Path) -> AccountingError {
    let p = path.display();
    unverifiable(
        path,
        format!(
            "this ledger was written by an earlier dpfusion (format 1: no header, no hash chain) \
             and is not opened as it is. Stop every dpfusion session that uses it, then run \
             `dpfusion ledger migrate {p}`: it checks every record, keeps the original as \
             {p}.v1.bak and writes the same records in format {FORMAT}"
        ),
    )
}

pub(super) fn other(path: &Path, message: String) -> AccountingError {
    io_error(path)(io::Error::other(message))
}

/// Encodes `rec` as the next line after `st` (with its newline), and that line's hash.
fn encode(path: &Path, st: &State, rec: &Record) -> Result<(String, Hash), AccountingError> {
    let prev = match (rec, st.hashes.last()) {
        (Record::Header(h), None) => genesis(&h.ledger_id),
        (_, Some(h)) if !matches!(rec, Record::Header(_)) => hex(h),
        _ => {
            return Err(other(
                path,
                "internal error: the header must be the first record, and only it".to_string(),
            ));
        }
    };
    let mut line = serde_json::to_string(&LineOut {
        record: rec,
        prev: &prev,
    })
    .map_err(|e| other(path, e.to_string()))?;
    if serde_json::from_str::<LineIn>(&line).is_err() || line.contains('\n') {
        // E.g. a non-finite number, which JSON cannot hold: never write what replay cannot read.
        return Err(other(
            path,
            format!("refusing to write a record that could not be read back: {line}"),
        ));
    }
    let hash = sha256(line.as_bytes());
    line.push('\n');
    Ok((line, hash))
}

/// Checks one complete line (without its newline) as line `line_no`, after a line of hash
/// `prev`; returns its record. `id` is the ledger id, set by line 1.
pub(super) fn check_line(
    path: &Path,
    line_no: u64,
    line: &[u8],
    id: &mut Option<String>,
    prev: Option<&Hash>,
) -> Result<Record, AccountingError> {
    if line.trim_ascii().is_empty() {
        return Err(corrupt(
            path,
            line_no,
            "an empty line, which the ledger never writes".to_string(),
        ));
    }
    let parsed: LineIn = match serde_json::from_slice(line) {
        Ok(l) => l,
        Err(_) if line_no == 1 && serde_json::from_slice::<Record>(line).is_ok() => {
            return Err(old_format(path));
        }
        Err(e) => {
            return Err(corrupt(
                path,
                line_no,
                format!(
                    "not a ledger record ({e}); a complete line is never a torn write, so it \
                     is not removed"
                ),
            ));
        }
    };
    let expected = match (&parsed.record, line_no) {
        (Record::Header(h), 1) => {
            if h.format != FORMAT {
                return Err(corrupt(
                    path,
                    1,
                    format!(
                        "ledger format {} is not the format of this dpfusion ({FORMAT})",
                        h.format
                    ),
                ));
            }
            *id = Some(h.ledger_id.clone());
            genesis(&h.ledger_id)
        }
        (Record::Header(_), _) => {
            return Err(corrupt(
                path,
                line_no,
                "a second header record (lines from another ledger?)".to_string(),
            ));
        }
        (_, 1) => {
            return Err(corrupt(
                path,
                1,
                "the first line is not the ledger's header (was the start of the file cut off or \
                 replaced?)"
                    .to_string(),
            ));
        }
        (_, _) => hex(prev.expect("line > 1 has a previous line")),
    };
    if parsed.prev != expected {
        let what = if line_no == 1 {
            "the header's `prev` is not the genesis hash of its ledger id: the header was edited"
                .to_string()
        } else {
            format!(
                "its `prev` is not the hash of line {}: line {} or this line was edited, or \
                 lines were deleted, reordered or inserted here",
                line_no - 1,
                line_no - 1
            )
        };
        return Err(corrupt(path, line_no, what));
    }
    Ok(parsed.record)
}

/// The complete lines after `st` in `buf`, checked (chain, header) but not applied, and the
/// length of a last line without its newline (a torn write).
struct Scan {
    lines: Vec<(Record, Hash, u64)>,
    torn: u64,
    ledger_id: Option<String>,
}

fn scan(path: &Path, st: &State, buf: &[u8]) -> Result<Scan, AccountingError> {
    let mut out = Scan {
        lines: Vec::new(),
        torn: 0,
        ledger_id: st.ledger_id.clone(),
    };
    let mut prev = st.hashes.last().copied();
    let mut pos = 0;
    while pos < buf.len() {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            out.torn = (buf.len() - pos) as u64;
            break;
        };
        let line = &buf[pos..pos + nl];
        let line_no = st.lines + out.lines.len() as u64 + 1;
        let rec = check_line(path, line_no, line, &mut out.ledger_id, prev.as_ref())?;
        let hash = sha256(line);
        out.lines.push((rec, hash, nl as u64 + 1));
        prev = Some(hash);
        pos += nl + 1;
    }
    Ok(out)
}

fn read_head(path: &Path) -> Result<Option<Head>, AccountingError> {
    let hp = head_path(path);
    match fs::read(&hp) {
        Ok(bytes) => serde_json::from_slice::<Head>(bytes.trim_ascii())
            .ok()
            .filter(|h| h.format == FORMAT && h.lines > 0)
            .map(Some)
            .ok_or_else(|| {
                unverifiable(
                    path,
                    format!(
                        "its sidecar {} is not a valid ledger head (it was overwritten). {RESTORE}",
                        hp.display()
                    ),
                )
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(&hp)(e)),
    }
}

/// Whether a seal (sidecar, witness) is fsync'd before its rename. An append does not: its one
/// fsync is the ledger's (docs/LEDGER.md, "One fsync per charge"). The data owner's commands
/// (`reseal`, `migrate`) do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sync {
    Fsync,
    NoFsync,
}

/// Replaces the sidecar with the state's line count and last hash: a temporary file (fsync'd
/// when `sync` says so), then renamed over it. Only under the exclusive lock.
fn write_head(path: &Path, st: &State, sync: Sync) -> Result<(), AccountingError> {
    let (Some(id), Some(last)) = (&st.ledger_id, st.hashes.last()) else {
        return Err(other(path, "internal error: no header to seal".to_string()));
    };
    let head = Head {
        format: FORMAT,
        ledger_id: id.clone(),
        lines: st.lines,
        hash: hex(last),
    };
    replace_json(
        path,
        &head,
        &sibling(path, ".head.tmp"),
        &head_path(path),
        sync,
    )
}

/// Replaces `target` with `value` as one JSON line: written to `tmp`, fsync'd (with
/// [`Sync::Fsync`]), then renamed over `target` (the sidecar and the witness are written so;
/// `path` is the ledger, for errors).
fn replace_json(
    path: &Path,
    value: &impl Serialize,
    tmp: &Path,
    target: &Path,
    sync: Sync,
) -> Result<(), AccountingError> {
    let mut text = serde_json::to_string(value).map_err(|e| other(path, e.to_string()))?;
    text.push('\n');
    replace_bytes(text.as_bytes(), tmp, target, sync)
}

/// Creates the temporary file `tmp` (mode 0600). One left by an interrupted writer (writers
/// hold the exclusive lock) is removed, not reused: the new one is created with
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, so a symbolic link (or any file) planted at its name is
/// never written through.
fn create_tmp(tmp: &Path) -> Result<File, AccountingError> {
    match fs::remove_file(tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(tmp)(e)),
    }
    let mut o = private_options();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o.open(tmp).map_err(io_error(tmp))
}

/// Replaces `target` with `bytes`: written to `tmp` (fsync'd with [`Sync::Fsync`]), then renamed
/// over `target`, so a reader sees the old or the new content, never a part.
pub(super) fn replace_bytes(
    bytes: &[u8],
    tmp: &Path,
    target: &Path,
    sync: Sync,
) -> Result<(), AccountingError> {
    let mut f = create_tmp(tmp)?;
    f.write_all(bytes)
        .and_then(|()| match sync {
            Sync::Fsync => f.sync_all(),
            Sync::NoFsync => Ok(()),
        })
        .map_err(io_error(tmp))?;
    fs::rename(tmp, target).map_err(io_error(target))
}

/// Replaces `target` with `bytes`, fsync'd, as the sidecar and the witness are written
/// ([`replace_bytes`]: a new 0600 file `<target>.tmp` created with `O_CREAT | O_EXCL |
/// O_NOFOLLOW`, renamed over `target`, so nothing planted at either name is written through):
/// for the owner's files beside the ledger (`dpfusion ledger report -o`).
pub fn replace_file(bytes: &[u8], target: &Path) -> Result<(), AccountingError> {
    replace_bytes(bytes, &sibling(target, ".tmp"), target, Sync::Fsync)
}

fn read_witness(path: &Path, wp: &Path) -> Result<Option<Witness>, AccountingError> {
    match fs::read(wp) {
        Ok(bytes) => serde_json::from_slice::<Witness>(bytes.trim_ascii())
            .ok()
            .filter(|w| w.format == FORMAT && w.lines > 0)
            .map(Some)
            .ok_or_else(|| {
                unverifiable(
                    path,
                    format!(
                        "its witness {} is not a valid ledger witness (it was overwritten). \
                         {RESTORE}",
                        wp.display()
                    ),
                )
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(wp)(e)),
    }
}

/// Creates the directory of a witness (mode 0700) when it is missing.
pub(super) fn make_witness_dir(wp: &Path) -> Result<(), AccountingError> {
    if let Some(dir) = wp.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(io_error(wp))?;
    }
    Ok(())
}

/// Replaces the witness with the state's seal, like the sidecar (a temporary file renamed over
/// it); with [`Sync::Fsync`] the file and then its directory are fsync'd, so that the rename is
/// durable. Only under the exclusive lock, after the sidecar.
fn write_witness(path: &Path, wp: &Path, st: &State, sync: Sync) -> Result<(), AccountingError> {
    let (Some(id), Some(last)) = (&st.ledger_id, st.hashes.last()) else {
        return Err(other(
            path,
            "internal error: no header to witness".to_string(),
        ));
    };
    let w = Witness {
        format: FORMAT,
        ledger: path.display().to_string(),
        ledger_id: id.clone(),
        lines: st.lines,
        bytes: st.offset,
        hash: hex(last),
    };
    make_witness_dir(wp)?;
    replace_json(path, &w, &sibling(wp, ".tmp"), wp, sync)?;
    if sync == Sync::Fsync
        && let Some(dir) = wp.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// What the witness says about the lines read so far plus `scan`: `Ok(None)` when it matches
/// the last line, `Ok(Some(n))` when it matches an earlier line `n` (a writer died between the
/// sidecar and the witness, or another process with another witness appended).
fn check_witness(
    path: &Path,
    wp: &Path,
    st: &State,
    scan: &Scan,
    w: &Witness,
) -> Result<Option<u64>, AccountingError> {
    let total = st.lines + scan.lines.len() as u64;
    let wd = wp.display();
    let advice = "The ledger and its sidecar were rolled back, replaced or cut (e.g. restored \
                  from an older backup or copied over by someone who can write the ledger's \
                  directory): charges recorded since are missing, and their budget would be \
                  refunded. Nothing was changed. Restore the newest ledger and .head (`dpfusion \
                  ledger verify PATH --ledger-witness WITNESS` checks a copy); only if the data \
                  owner decides that the missing charges are gone for good, move the witness \
                  aside";
    if total == 0 {
        return Err(unverifiable(
            path,
            format!(
                "the ledger holds no complete line but its witness {wd} recorded {} lines. \
                 {advice}",
                w.lines
            ),
        ));
    }
    if scan.ledger_id.as_deref() != Some(w.ledger_id.as_str()) {
        return Err(unverifiable(
            path,
            format!(
                "its witness {wd} belongs to another ledger (id {}, the ledger's is {}): the \
                 ledger was replaced, or the witness is another ledger's. {advice}",
                w.ledger_id,
                scan.ledger_id.as_deref().unwrap_or("?")
            ),
        ));
    }
    if w.lines > total {
        return Err(unverifiable(
            path,
            format!(
                "the ledger ends after {total} complete lines but its witness {wd} recorded {}. \
                 {advice}",
                w.lines
            ),
        ));
    }
    if hex(&hash_at(path, st, scan, w.lines)?) != w.hash {
        return Err(unverifiable(
            path,
            format!(
                "line {} differs from the one its witness {wd} recorded: the ledger diverges \
                 from the one witnessed. {advice}",
                w.lines
            ),
        ));
    }
    Ok((w.lines < total).then_some(w.lines))
}

/// The hash of line `n` (1-based, at least 1, at most the lines of `st` and `scan`) of the lines
/// in `st` followed by `scan`. A line before the checkpoint `st` was loaded from has no hash in
/// memory: an error (when a session opens, it then replays the ledger from line 1).
fn hash_at(path: &Path, st: &State, scan: &Scan, n: u64) -> Result<Hash, AccountingError> {
    if n <= st.hash_base {
        return Err(unverifiable(
            path,
            format!(
                "a seal (sidecar or witness) names line {n}, before the checkpoint at line {} \
                 this session started from; start the session again (it replays the ledger from \
                 its first line when a seal is older than its checkpoint)",
                st.hash_base + 1
            ),
        ));
    }
    Ok(if n <= st.lines {
        st.hashes[(n - st.hash_base - 1) as usize]
    } else {
        scan.lines[(n - st.lines - 1) as usize].1
    })
}

/// What the sidecar says about the lines read so far plus `scan`.
enum HeadState {
    /// It matches the last line.
    Current,
    /// It matches an earlier line (the process that appended after it died before updating it).
    Behind(u64),
    /// No sidecar and no complete line: a new ledger (or one whose creation was interrupted).
    New,
    /// No sidecar and only the header: creation was interrupted after the header.
    Missing,
}

fn check_head(
    path: &Path,
    st: &State,
    scan: &Scan,
    head: Option<&Head>,
) -> Result<HeadState, AccountingError> {
    let total = st.lines + scan.lines.len() as u64;
    let hp = head_path(path);
    let Some(h) = head else {
        return match total {
            0 => Ok(HeadState::New),
            1 => Ok(HeadState::Missing),
            _ => Err(unverifiable(
                path,
                format!(
                    "its sidecar {} is missing, so a cut to a shorter ledger cannot be ruled \
                     out. Restore the sidecar from the same backup as the ledger; if the data \
                     owner knows the ledger is complete, `dpfusion ledger reseal {}` writes a \
                     new one",
                    hp.display(),
                    path.display()
                ),
            )),
        };
    };
    if total == 0 {
        return Err(unverifiable(
            path,
            format!(
                "the ledger holds no complete line but its sidecar {} recorded {} lines: it was \
                 emptied or replaced. {RESTORE}",
                hp.display(),
                h.lines
            ),
        ));
    }
    if scan.ledger_id.as_deref() != Some(h.ledger_id.as_str()) {
        return Err(unverifiable(
            path,
            format!(
                "its sidecar {} belongs to another ledger (id {}, the ledger's is {}): the ledger \
                 was replaced. {RESTORE}",
                hp.display(),
                h.ledger_id,
                scan.ledger_id.as_deref().unwrap_or("?")
            ),
        ));
    }
    if h.lines > total {
        return Err(corrupt(
            path,
            total + 1,
            format!(
                "the ledger ends after {total} complete lines but its sidecar {} recorded {}: \
                 lines were cut from the end",
                hp.display(),
                h.lines
            ),
        ));
    }
    if hex(&hash_at(path, st, scan, h.lines)?) != h.hash {
        return Err(corrupt(
            path,
            h.lines,
            format!(
                "the line differs from the one its sidecar {} recorded: it was edited (or the \
                 lines after line {} were replaced)",
                hp.display(),
                h.lines.saturating_sub(1)
            ),
        ));
    }
    Ok(if h.lines == total {
        HeadState::Current
    } else {
        HeadState::Behind(h.lines)
    })
}

/// Whether [`read`] may repair what an interrupted writer left (a torn last line, a sidecar
/// behind the ledger, a new or half-created ledger). Sessions repair under the exclusive lock;
/// `dpfusion ledger verify` only reports.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Repair,
    ReadOnly,
}

/// What [`read`] found that an interrupted writer left.
#[derive(Debug, Default)]
struct Leftover {
    torn: u64,
    head_behind: Option<u64>,
    head_missing: bool,
    new: bool,
    /// The witness matched this earlier line.
    witness_behind: Option<u64>,
    /// There is no witness yet (its first use, e.g. a ledger of an earlier version).
    witness_missing: bool,
}

/// Verifies, then applies, every complete line after `st.offset`; in [`Mode::Repair`] also cuts
/// a torn last line, brings the sidecar up to date and initialises a new ledger. Nothing is
/// changed (in the file or in `st`) unless the new lines and the sidecar verify and every new
/// line applies ([`apply_all`]: all of them or none, round 50); once they have, a failure of the
/// repair leaves them applied (they verified) and the file as the repair left it.
fn read(
    file: &File,
    path: &Path,
    witness: Option<&Path>,
    st: &mut State,
    mode: Mode,
) -> Result<Leftover, AccountingError> {
    let len = file.metadata().map_err(io_error(path))?.len();
    if len < st.offset {
        return Err(corrupt(
            path,
            st.lines,
            "the file is shorter than the part this session already read (it was replaced or \
             truncated)"
                .to_string(),
        ));
    }
    let head = read_head(path)?;
    let mut buf = Vec::new();
    if len > st.offset {
        let mut reader = file;
        reader
            .seek(SeekFrom::Start(st.offset))
            .and_then(|_| reader.read_to_end(&mut buf))
            .map_err(io_error(path))?;
    }
    let scanned = scan(path, st, &buf)?;
    // The witness first: a ledger rolled back together with a deleted sidecar is a rollback
    // (the witness's message), not only a missing sidecar whose message suggests a reseal
    // (review r45).
    let (witness_behind, witness_missing) = match witness {
        Some(wp) => match read_witness(path, wp)? {
            Some(w) => (check_witness(path, wp, st, &scanned, &w)?, false),
            None => (None, true),
        },
        None => (None, false),
    };
    let head_state = check_head(path, st, &scanned, head.as_ref())?;
    apply_all(file, path, st, scanned.lines)?;
    let mut left = Leftover {
        torn: scanned.torn,
        witness_behind,
        witness_missing,
        ..Leftover::default()
    };
    match head_state {
        HeadState::Current => {}
        HeadState::Behind(n) => left.head_behind = Some(n),
        HeadState::Missing => left.head_missing = true,
        HeadState::New => left.new = true,
    }
    if mode == Mode::ReadOnly {
        return Ok(left);
    }
    if left.torn > 0 {
        // Only a last line without its newline: an append that never completed (no writer is
        // active under the exclusive lock), so never a charge that was admitted.
        file.set_len(st.offset)
            .and_then(|()| file.sync_data())
            .map_err(io_error(path))?;
    }
    if left.new {
        let header = Record::Header(Header {
            format: FORMAT,
            ledger_id: new_ledger_id(),
            created: now_rfc3339(),
        });
        // Writes the sidecar and the witness too.
        append(file, path, witness, st, header)?;
        return Ok(Leftover::default());
    }
    if left.head_behind.is_some() || left.head_missing {
        write_head(path, st, Sync::NoFsync)?;
    }
    if let Some(wp) = witness
        && st.lines > 0
        && (left.witness_behind.is_some() || left.witness_missing)
    {
        write_witness(path, wp, st, Sync::NoFsync)?;
    }
    Ok(Leftover::default())
}

/// Applies the verified complete `lines` after the lines of `st`, then gives a session's own
/// policies (session-local tables, which are not records) the sums of their currencies
/// ([`track_currencies`]): all or nothing (round 50, review crash F2). A line that does not
/// apply (a checkpoint record at the wrong place, a record with an invalid budget, …) or a
/// failed read leaves `st` as it was, so the next catch-up reads the same lines again from the
/// same place: none is skipped (no under-count) and none is half-applied. The lines are applied
/// to a copy, swapped in on success; the copy costs the per-table maps only, since the two
/// logs, which only grow, are moved to it (not cloned) and cut back to their length on failure.
fn apply_all(
    file: &File,
    path: &Path,
    st: &mut State,
    lines: Vec<(Record, Hash, u64)>,
) -> Result<(), AccountingError> {
    if lines.is_empty() {
        // Changes `st` only once it has succeeded.
        return track_currencies(file, path, st);
    }
    let (n_entries, n_hashes) = (st.entries.len(), st.hashes.len());
    let entries = std::mem::take(&mut st.entries);
    let hashes = std::mem::take(&mut st.hashes);
    let mut next = st.clone();
    next.entries = entries;
    next.hashes = hashes;
    // A panic while applying (none is known) must not lose the logs either (round 50, review
    // "fixes" F3): they are put back, cut to their length, before it goes on unwinding.
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lines
            .into_iter()
            .try_for_each(|(rec, hash, n)| apply_line(file, path, &mut next, rec, hash, n))
            .and_then(|()| track_currencies(file, path, &mut next))
    }));
    match applied {
        Ok(Ok(())) => {
            *st = next;
            Ok(())
        }
        failed => {
            next.entries.truncate(n_entries);
            next.hashes.truncate(n_hashes);
            st.entries = next.entries;
            st.hashes = next.hashes;
            match failed {
                Ok(e) => e,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }
}

/// Applies the complete line `rec` (of hash `hash`, `len` bytes with its newline, already in
/// the file) after the lines of `st`: the one step of replay and of append. After a `policy` or
/// `owner` record, the sums of a currency it puts in force are computed at once
/// ([`track_currencies`]), so the state after each line (what a checkpoint record's digest
/// names) depends on the lines only.
fn apply_line(
    file: &File,
    path: &Path,
    st: &mut State,
    rec: Record,
    hash: Hash,
    len: u64,
) -> Result<(), AccountingError> {
    let line_no = st.lines + 1;
    let policy = matches!(rec, Record::Policy(_) | Record::Owner(_));
    // With `st.lines` still the lines before it.
    apply(st, rec, line_no).map_err(|m| corrupt(path, line_no, m))?;
    st.offset += len;
    st.lines += 1;
    st.hashes.push(hash);
    if policy {
        track_currencies(file, path, st)?;
    }
    Ok(())
}

/// Gives every charged private table the sums in the currency of its policy in force when they
/// are not kept yet (a policy that put another rdp order in force after charges, or a session's
/// own policy of a session-local table): one pass over the ledger's lines up to `st.offset`
/// (their chain checked against the state's), folding that table's events in ledger order, as
/// a full replay would ([`Spend`]). Rare (an owner's action); from then on the sums are kept.
pub(super) fn track_currencies(
    file: &File,
    path: &Path,
    st: &mut State,
) -> Result<(), AccountingError> {
    let missing: Vec<(TableKey, Currency)> = st
        .policies
        .iter()
        .filter(|(_, p)| p.visibility == Visibility::Private)
        .filter_map(|(k, p)| {
            let c = policy_currency(p)?;
            let spend = st.tables.get(k)?;
            spend.usage(c).is_none().then(|| (k.clone(), c))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut buf = vec![0u8; st.offset as usize];
    let mut reader = file;
    reader
        .seek(SeekFrom::Start(0))
        .and_then(|_| reader.read_exact(&mut buf))
        .map_err(io_error(path))?;
    let scanned = scan(path, &State::default(), &buf)?;
    if scanned.lines.len() as u64 != st.lines
        || scanned.lines.last().map(|l| l.1) != st.hashes.last().copied()
    {
        return Err(corrupt(
            path,
            st.lines,
            "the ledger's lines no longer hash to the chain this session read (the file was \
             changed under the lock)"
                .to_string(),
        ));
    }
    let mut sums = vec![Usage::default(); missing.len()];
    for (rec, _, _) in &scanned.lines {
        if let Record::Charge(e) = rec {
            for t in &e.tables {
                for ((k, c), u) in missing.iter().zip(sums.iter_mut()) {
                    if &t.key == k {
                        *u = c.fold(std::mem::take(u), &t.events);
                    }
                }
            }
        }
    }
    for ((k, c), u) in missing.into_iter().zip(sums) {
        if let Some(spend) = st.tables.get_mut(&k) {
            spend.sums.push((c, u));
        }
    }
    Ok(())
}

/// Reads and applies what other processes appended since the last read, repairing what an
/// interrupted writer left. Must be called with the exclusive file lock held.
pub(super) fn catch_up(
    file: &File,
    path: &Path,
    witness: Option<&Path>,
    st: &mut State,
) -> Result<(), AccountingError> {
    read(file, path, witness, st, Mode::Repair).map(|_| ())
}

/// Appends one record (one `write_all` of the whole line), fsyncs it (the one fsync of an
/// append), applies it to the state, then replaces the sidecar, then the witness, without
/// fsyncing them (docs/LEDGER.md, "One fsync per charge"). Must be called with the exclusive
/// file lock held, right after [`catch_up`].
pub(super) fn append(
    file: &File,
    path: &Path,
    witness: Option<&Path>,
    st: &mut State,
    rec: Record,
) -> Result<(), AccountingError> {
    let (line, hash) = encode(path, st, &rec)?;
    let mut writer = file;
    if let Err(e) = writer.write_all(line.as_bytes()).and_then(|()| {
        if st.insecure_no_fsync {
            Ok(())
        } else {
            file.sync_data()
        }
    }) {
        // Not admitted: remove whatever part reached the file (best effort; replay would too).
        let _ = file.set_len(st.offset);
        return Err(io_error(path)(e));
    }
    let charge = matches!(rec, Record::Charge(_));
    // The record is durable; if what follows fails (its application, the sidecar, the
    // witness), the caller is told that it stands (`Unsealed`: a charge's statement releases
    // nothing, and the analyst gets a fixed message without the path, round 46), and the next
    // session brings the seals up to date.
    let seal = |st: &mut State| -> Result<(), AccountingError> {
        // Applied as replay applies it.
        apply_line(file, path, st, rec, hash, line.len() as u64)?;
        write_head(path, st, Sync::NoFsync)?;
        match witness {
            Some(wp) => write_witness(path, wp, st, Sync::NoFsync),
            None => Ok(()),
        }
    };
    seal(st).map_err(|e| AccountingError::Unsealed {
        path: path.to_path_buf(),
        charge,
        source: Box::new(e),
    })
}

/// Reads the charges of the part of the ledger before the checkpoint `st` was loaded from (a
/// session started from a checkpoint reads them only when they are listed: `dp_ledger()`),
/// checking that part's chain up to the checkpoint record. Nothing is changed on error.
pub(super) fn load_prefix(file: &File, path: &Path, st: &mut State) -> Result<(), AccountingError> {
    let Some(p) = st.prefix else {
        return Ok(());
    };
    let mut buf = vec![0u8; p.offset as usize];
    let mut reader = file;
    reader
        .seek(SeekFrom::Start(0))
        .and_then(|_| reader.read_exact(&mut buf))
        .map_err(io_error(path))?;
    let scanned = scan(path, &State::default(), &buf)?;
    if scanned.torn != 0
        || scanned.lines.len() as u64 != p.lines
        || scanned.lines.last().map(|l| l.1) != Some(p.last)
    {
        return Err(corrupt(
            path,
            p.lines + 1,
            "the checkpoint record's `prev` is not the hash of the line before it: lines before \
             the checkpoint were edited"
                .to_string(),
        ));
    }
    let mut entries = Vec::new();
    for (rec, _, _) in scanned.lines {
        if let Record::Charge(mut e) = rec {
            bound_query(&mut e);
            entries.push(e);
        }
    }
    entries.append(&mut st.entries);
    st.entries = entries;
    st.prefix = None;
    Ok(())
}

/// `OpenOptions` that create files readable and writable by their owner only (Unix).
fn private_options() -> OpenOptions {
    #[allow(unused_mut)]
    let mut o = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o
}

/// Opens the ledger for reading and appending, never truncating it: a new file is created
/// exclusively (`create_new`, mode 0600, in new directories of mode 0700); an existing one is
/// opened as it is. The header is written by the first [`catch_up`].
pub(super) fn open_file(path: &Path, witness: Option<&Path>) -> Result<File, AccountingError> {
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
    let hp = head_path(path);
    if !path.exists() && hp.exists() {
        // Checked before creating anything: a deleted ledger is not a new one.
        return Err(unverifiable(
            path,
            format!(
                "the ledger does not exist but its sidecar {} does: it was deleted or moved. \
                 {RESTORE}",
                hp.display()
            ),
        ));
    }
    if let Some(wp) = witness
        && !path.exists()
        && wp.exists()
    {
        return Err(unverifiable(
            path,
            format!(
                "the ledger does not exist but its witness {} does: it was deleted or moved. \
                 {RESTORE}; if the data owner decides to start a new ledger, move the witness \
                 aside too",
                wp.display()
            ),
        ));
    }
    // Created only once the refusals above are passed: a refused open creates nothing (round 52,
    // review "operator" F4: a refused ledger left its empty directory behind).
    if let Some(dir) = parent {
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(io_error(path))?;
    }
    match private_options()
        .read(true)
        .append(true)
        .create_new(true)
        .open(path)
    {
        Ok(f) => {
            // Make the new directory entry durable too (best effort; not possible everywhere).
            if let Ok(d) = File::open(parent.unwrap_or(Path::new("."))) {
                let _ = d.sync_all();
            }
            Ok(f)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(io_error(path)),
        Err(e) => Err(io_error(path)(e)),
    }
}

/// One table of a [`LedgerReport`].
#[derive(Clone, Debug)]
pub struct TableReport {
    pub key: TableKey,
    /// The name in the policy in force, else in the last charge.
    pub name: String,
    /// `None` for a key charged without a recorded policy (session-local tables).
    pub visibility: Option<Visibility>,
    /// The policy in force, as replay applied the records (a `policy` record that would weaken
    /// it is not applied): its budget is the one what is left is measured against. `None` for
    /// a key charged without a recorded policy.
    pub policy: Option<TablePolicy>,
    /// A private table's budget state exactly as `SHOW BUDGET` / `dp_budget()` give it (round
    /// 47): the guarantee (`epsilon`/`delta`, the largest budget ever in force), the filter's
    /// sum, budget and share used (`native`), the next ε, the δ of partition selection spent and
    /// left. `None` for a public table and for a key without a recorded policy.
    pub budget_row: Option<BudgetRow>,
    /// The largest ε and δ budgets the key has had while private (its guarantee), kept after
    /// the owner made it public: `dpfusion ledger report` still shows the charges made while it
    /// was private (round 47, review "newuser2", G). `None`: never private.
    pub guarantee: Option<(f64, f64)>,
    /// [`BudgetRow::spent`] (0 without a row): the filter's conversion of the running sum. Not a
    /// guarantee and never shown (docs/ACCOUNTING.md, "Why no 'ε charged'").
    pub spent: f64,
    pub charges: u64,
    /// Every relaxation the owner recorded for the key, in ledger order (round 52, review
    /// operator F2).
    pub relaxations: Vec<Relaxation>,
    /// Since when the key has no guarantee (round 52, review operator F3): the budget row's
    /// `epsilon` is then +∞. `guarantee` stays the largest budget of the charges made while the
    /// table was private, their bound as charged, which says nothing of what the table's rows
    /// revealed since.
    pub no_guarantee: Option<NoGuarantee>,
}

/// What `dpfusion ledger verify` found in a ledger that verifies.
#[derive(Clone, Debug)]
pub struct LedgerReport {
    pub path: PathBuf,
    pub ledger_id: Option<String>,
    /// Complete lines, the header included.
    pub lines: u64,
    pub policy_records: u64,
    pub owner_records: u64,
    pub checkpoint_records: u64,
    pub charges: u64,
    pub tables: Vec<TableReport>,
    /// Things an interrupted writer left, which the next session repairs; then, per table, every
    /// relaxation the owner recorded and since when a table has no guarantee (round 52, review
    /// operator F2, F3: what `dpfusion ledger verify` prints as `note:` lines).
    pub notes: Vec<String>,
    /// The witness checked (None: none was given, or there is none yet).
    pub witness: Option<PathBuf>,
}

/// A private table's budget state from the replayed ledger: the one computation of the numbers
/// `SHOW BUDGET`, `dp_budget()`, `dpfusion ledger verify` and `dpfusion ledger report` show
/// (docs/ACCOUNTING.md, "What the numbers mean"). The guarantee is the largest budget the table
/// has had in force; the share used, the next ε and the δ left are measured against the policy
/// `p` in force; the next ε is one Gaussian call's at `default_delta` (a session's
/// `dpfusion.default_delta`; [`DEFAULT_QUERY_DELTA`] in the ledger tools). A policy that no longer compiles, or sums not kept in its filter's currency,
/// show the table as exhausted.
pub(super) fn budget_row(st: &State, p: &TablePolicy, default_delta: f64) -> BudgetRow {
    let spend = st.tables.get(&p.key);
    let queries = spend.map_or(0, |t| t.queries);
    let compiled = p.compiled_filter().ok().and_then(|f| {
        let u = match spend {
            None => Usage::default(),
            Some(t) => t.usage(f.currency())?.clone(),
        };
        Some((f, u))
    });
    let (spent, delta_spent, delta_left, native, next) = match compiled {
        Some((f, u)) => {
            let native = NativeCost {
                unit: f.unit(),
                cost: 0.0,
                used: u.main,
                budget: f.main_budget(),
                share: 0,
                used_share: f.share(&u),
            };
            (
                f.epsilon(&u),
                u.delta,
                (f.delta_sel - u.delta).max(0.0),
                native,
                f.next_epsilon(&u, default_delta),
            )
        }
        None => (
            f64::INFINITY,
            0.0,
            0.0,
            NativeCost {
                used_share: display::SHARE_SCALE,
                ..NativeCost::default()
            },
            0.0,
        ),
    };
    // The guarantee is the largest budget the table has had; a lowered budget caps what is left
    // (docs/ACCOUNTING.md, "Lowering a budget"). None (+∞) since a record voided it (round 52,
    // review operator F3).
    let no_guarantee = st.no_guarantee.get(&p.key).cloned();
    let epsilon = match &no_guarantee {
        Some(_) => f64::INFINITY,
        None => st
            .largest_epsilon
            .get(&p.key)
            .map_or(p.budget.epsilon, |e| e.max(p.budget.epsilon)),
    };
    let delta = st
        .largest_delta
        .get(&p.key)
        .map_or(p.budget.delta, |d| d.max(p.budget.delta));
    BudgetRow {
        name: p.name.clone(),
        key: p.key.clone(),
        epsilon,
        delta,
        no_guarantee,
        spent,
        remaining: next,
        remaining_delta_of: default_delta,
        native,
        queries,
        delta_spent,
        delta_left,
        filter: p.filter,
    }
}

fn report(path: &Path, witness: Option<&Path>, st: &State, mut notes: Vec<String>) -> LedgerReport {
    let mut keys: Vec<&TableKey> = st.policies.keys().chain(st.tables.keys()).collect();
    keys.sort();
    keys.dedup();
    let tables: Vec<TableReport> = keys
        .into_iter()
        .map(|k| {
            let policy = st.policies.get(k);
            let last = st
                .entries
                .iter()
                .rev()
                .find_map(|e| e.tables.iter().find(|t| &t.key == k));
            let private = policy.filter(|p| p.visibility == Visibility::Private);
            // Round 47 (review "newuser", findings 1-3): the numbers SHOW BUDGET shows, from the
            // same computation; no conversion of a running sum is reported.
            let budget_row = private.map(|p| budget_row(st, p, DEFAULT_QUERY_DELTA));
            TableReport {
                key: k.clone(),
                name: policy
                    .map(|p| p.name.clone())
                    .or(last.map(|t| t.name.clone()))
                    .unwrap_or_default(),
                visibility: policy.map(|p| p.visibility),
                policy: policy.cloned(),
                spent: budget_row.as_ref().map_or(0.0, |r| r.spent),
                guarantee: st
                    .largest_epsilon
                    .get(k)
                    .zip(st.largest_delta.get(k))
                    .map(|(e, d)| (*e, *d)),
                budget_row,
                charges: st.tables.get(k).map_or(0, |s| s.queries),
                relaxations: st.relaxations.get(k).cloned().unwrap_or_default(),
                no_guarantee: st.no_guarantee.get(k).cloned(),
            }
        })
        .collect();
    // The owner's decisions, for the owner to see (round 52, review operator F2, F3).
    for t in &tables {
        for r in &t.relaxations {
            notes.push(format!(
                "table '{}' ({}): the owner relaxed its policy at line {}: {}",
                t.name, t.key, r.line, r.note
            ));
        }
        if let Some(n) = &t.no_guarantee {
            notes.push(format!(
                "table '{}' ({}): guarantee: none since line {} ({})",
                t.name, t.key, n.line, n.why
            ));
        }
    }
    LedgerReport {
        path: path.to_path_buf(),
        ledger_id: st.ledger_id.clone(),
        lines: st.lines,
        policy_records: st.policy_records,
        owner_records: st.owner_records,
        checkpoint_records: st.checkpoint_records,
        charges: st.entries.len() as u64,
        tables,
        notes,
        witness: witness.map(Path::to_path_buf),
    }
}

/// Checks a ledger without changing it (under a shared lock, so no session appends meanwhile):
/// the chain, the header, the sidecar and every record. `Err` says what is wrong and where.
/// [`verify_with`] checks the witness too.
pub fn verify(path: &Path) -> Result<LedgerReport, AccountingError> {
    verify_with(path, None)
}

/// [`verify`], and the witness when one is given (`dpfusion ledger verify`).
pub fn verify_with(path: &Path, witness: Option<&Path>) -> Result<LedgerReport, AccountingError> {
    let file = File::open(path).map_err(io_error(path))?;
    let _lock = FileLock::shared(&file).map_err(io_error(path))?;
    let mut st = State::default();
    let left = read(&file, path, witness, &mut st, Mode::ReadOnly)?;
    let mut notes = Vec::new();
    if left.new {
        notes.push(
            "the ledger is empty and has no sidecar: a new ledger, initialised by its first \
             session"
                .to_string(),
        );
    }
    if left.torn > 0 {
        notes.push(format!(
            "the last {} bytes are a line without its newline (an interrupted append, never \
             admitted); the next session cuts them",
            left.torn
        ));
    }
    if let Some(n) = left.head_behind {
        notes.push(format!(
            "the sidecar recorded {n} lines of {} (a session died between its append and the \
             sidecar update); the next session updates it",
            st.lines
        ));
    }
    if left.head_missing {
        notes.push(
            "the sidecar is missing and the ledger holds only its header (creation was \
             interrupted); the next session writes it"
                .to_string(),
        );
    }
    if let Some(n) = left.witness_behind {
        notes.push(format!(
            "the witness recorded {n} lines of {} (a session died between the sidecar and the \
             witness update, or a session with another witness appended); the next session \
             updates it",
            st.lines
        ));
    }
    if let (Some(wp), true) = (witness, left.witness_missing) {
        notes.push(format!(
            "there is no witness at {}: a rollback of the ledger with its sidecar cannot be \
             ruled out. The next session with this witness writes it",
            wp.display()
        ));
    }
    let checked = witness.filter(|_| !left.witness_missing);
    Ok(report(path, checked, &st, notes))
}

/// Re-seals a ledger whose chain verifies but whose sidecar is missing or stale: writes a new
/// sidecar for the ledger as it is. This accepts the ledger as complete: a data-owner action,
/// for after restoring a ledger without its sidecar. The witness, when given, is rewritten too
/// (so a ledger shorter than it is accepted: the owner's decision).
pub fn reseal(path: &Path, witness: Option<&Path>) -> Result<LedgerReport, AccountingError> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_error(path))?;
    let _lock = FileLock::exclusive(&file).map_err(io_error(path))?;
    let mut buf = Vec::new();
    (&file).read_to_end(&mut buf).map_err(io_error(path))?;
    let mut st = State::default();
    let scanned = scan(path, &st, &buf)?;
    if scanned.lines.is_empty() {
        return Err(unverifiable(
            path,
            "the ledger holds no complete line: there is nothing to seal".to_string(),
        ));
    }
    // A witness that recorded more, or other, lines than the ledger holds is a rollback: a
    // reseal would overwrite it and refund the missing charges (review r45). The owner who
    // decides they are gone for good moves the witness aside first (the message says so).
    if let Some(wp) = witness
        && let Some(w) = read_witness(path, wp)?
    {
        check_witness(path, wp, &st, &scanned, &w)?;
    }
    for (rec, hash, n) in scanned.lines {
        apply_line(&file, path, &mut st, rec, hash, n)?;
    }
    write_head(path, &st, Sync::Fsync)?;
    if let Some(wp) = witness {
        write_witness(path, wp, &st, Sync::Fsync)?;
    }
    let mut notes = Vec::new();
    if scanned.torn > 0 {
        notes.push(format!(
            "the last {} bytes are a line without its newline; the next session cuts them",
            scanned.torn
        ));
    }
    Ok(report(path, witness, &st, notes))
}

/// What [`migrate`] did.
#[derive(Clone, Debug)]
pub struct Migration {
    /// Records carried over (the new header not included).
    pub records: u64,
    /// Bytes of a last line without its newline that were left out (an interrupted append).
    pub torn: u64,
    /// The original file, byte for byte.
    pub backup: PathBuf,
}

/// Converts a format-1 ledger (no header, no `prev`) to the current format: every record is
/// checked and carried over in order after a new header, the original is kept as
/// `<ledger>.v1.bak`, the new file replaces the ledger by a rename, and a sidecar is written.
/// Every session on the ledger must be stopped first (earlier versions do not read the new
/// format, and keep appending to the file they opened). The witness, when given, is written for
/// the new ledger.
pub fn migrate(path: &Path, witness: Option<&Path>) -> Result<Migration, AccountingError> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_error(path))?;
    let _lock = FileLock::exclusive(&file).map_err(io_error(path))?;
    let mut old = Vec::new();
    (&file).read_to_end(&mut old).map_err(io_error(path))?;
    let mut records = Vec::new();
    let mut pos = 0;
    let mut torn = 0;
    let mut line_no = 0u64;
    while pos < old.len() {
        let Some(nl) = old[pos..].iter().position(|&b| b == b'\n') else {
            torn = (old.len() - pos) as u64;
            break;
        };
        let line = &old[pos..pos + nl];
        line_no += 1;
        pos += nl + 1;
        if line.trim_ascii().is_empty() {
            continue;
        }
        if line_no == 1 && serde_json::from_slice::<LineIn>(line).is_ok() {
            return Err(unverifiable(
                path,
                format!("the ledger is already in format {FORMAT}: nothing to migrate"),
            ));
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(Record::Header(_)) | Err(_) => {
                return Err(corrupt(
                    path,
                    line_no,
                    "not a format-1 ledger record; nothing was changed. Restore the ledger from \
                     a backup, or have the data owner decide what the line should be"
                        .to_string(),
                ));
            }
            Ok(rec) => records.push(rec),
        }
    }
    if records.is_empty() {
        return Err(unverifiable(
            path,
            "the ledger holds no record: nothing to migrate (an empty file is initialised by \
             the next session)"
                .to_string(),
        ));
    }
    // The new ledger, built and applied record by record (which checks every record).
    let mut st = State::default();
    let mut out = String::new();
    let header = Record::Header(Header {
        format: FORMAT,
        ledger_id: new_ledger_id(),
        created: now_rfc3339(),
    });
    let count = records.len() as u64;
    for rec in std::iter::once(header).chain(records) {
        let (line, hash) = encode(path, &st, &rec)?;
        out.push_str(&line);
        st.offset += line.len() as u64;
        st.lines += 1;
        st.hashes.push(hash);
        let n = st.lines;
        apply(&mut st, rec, n).map_err(|m| corrupt(path, n - 1, m))?;
    }
    // Read back what will be written: the same chain and the same state.
    let mut check = State::default();
    let again = scan(path, &check, out.as_bytes())?;
    for (n, (rec, _, _)) in (1..).zip(again.lines) {
        apply(&mut check, rec, n).map_err(|m| other(path, m))?;
    }
    if check.entries != st.entries || check.policies != st.policies || again.torn != 0 {
        return Err(other(
            path,
            "internal error: the migrated ledger does not replay as the original".to_string(),
        ));
    }
    // 1. The original, byte for byte.
    let backup = sibling(path, ".v1.bak");
    match fs::read(&backup) {
        Ok(b) if b == old => {}
        Ok(_) => {
            return Err(unverifiable(
                path,
                format!(
                    "{} exists and differs from the ledger; move it away first",
                    backup.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut f = private_options()
                .write(true)
                .create_new(true)
                .open(&backup)
                .map_err(io_error(&backup))?;
            f.write_all(&old)
                .and_then(|()| f.sync_all())
                .map_err(io_error(&backup))?;
        }
        Err(e) => return Err(io_error(&backup)(e)),
    }
    // 2. The new ledger beside it, 3. its sidecar, 4. the rename (atomic). Interrupted before
    // 4, the ledger is still the format-1 file and migrating again starts over.
    let tmp = sibling(path, ".migrating");
    let mut f = create_tmp(&tmp)?;
    f.write_all(out.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_error(&tmp))?;
    write_head(path, &st, Sync::Fsync)?;
    if let Some(wp) = witness {
        write_witness(path, wp, &st, Sync::Fsync)?;
    }
    fs::rename(&tmp, path).map_err(io_error(path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(Migration {
        records: count,
        torn,
        backup,
    })
}

/// An OS lock on the ledger file (excludes other processes and other `Accountant`s on
/// the same file), released on drop.
pub(super) struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    pub fn exclusive(file: &'a File) -> io::Result<Self> {
        file.lock()?;
        Ok(FileLock(file))
    }

    /// Excludes writers only (for `dpfusion ledger verify`).
    pub fn shared(file: &'a File) -> io::Result<Self> {
        file.lock_shared()?;
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
