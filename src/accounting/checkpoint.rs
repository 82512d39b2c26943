//! Checkpoints: the accountant's state at a line of the ledger, so that opening a session reads
//! the lines since the last checkpoint, not the whole ledger (docs/LEDGER.md, "Checkpoints").
//!
//! A checkpoint is two things:
//! - a `checkpoint` record in the ledger, hash-chained like every line: the number of lines
//!   before it, the layout of the state, and the SHA-256 of the state replayed from those lines
//!   (in the canonical form below);
//! - the file `<ledger>.checkpoint`: one JSON line naming the ledger, the record's line and byte
//!   offset, the layout and the same digest, then the state itself in that canonical form.
//!
//! The state is the ledger's [`State`] as a whole (every field replay fills that is not marked
//! `serde(skip)`), never a hand-listed copy of some of its fields. It is compact: per table the
//! running sums of each filter currency and counts (`ledger::Spend`), not the events or the
//! charges, so its size does not grow with the ledger; what needs every
//! charge (`dp_ledger()`, `dpfusion ledger report` and `verify`) reads the ledger's lines. Canonical form: the state as a
//! `serde_json::Value` (maps sorted by key), every floating-point number written as its bit
//! pattern and every string prefixed, so that reading it back gives the same bits (JSON's
//! decimal text does not round-trip through serde_json's default float parser).
//!
//! Opening a session uses the checkpoint only when the file's digest, the record's digest, the
//! record's position and the ledger's id agree; it then replays the lines after the record as
//! usual (chain, sidecar, witness). Anything else (no file, another layout, a file that does not
//! match its record, a seal older than the checkpoint) replays the ledger from line 1: the same
//! state as the full replay, since that *is* the full replay. `dpfusion ledger verify`,
//! `reseal` and every full replay check each checkpoint record of the current layout against the
//! state replayed up to it, so a checkpoint whose state differs from its lines is reported as
//! corruption.
//!
//! Where the digest is compared (round 50, review crash F1). Only where the state is a replay:
//! a replay from line 1 (`verify`, `reseal`, a session opening without a usable checkpoint) and
//! the replay of a session opening from a checkpoint (whose failure falls back to the full
//! replay, which decides). A running session's catch-up on lines other processes appended
//! checks a checkpoint record's place (it follows exactly the lines it names, and its `prev` is
//! the hash of the line before it, as for every line), not its digest: that session's state is
//! not a replay ([`State::live`]: the policies of its session-local tables, a recorded policy
//! kept under the name registered now, are in it and in no line), so the digest of a true
//! checkpoint differs from it, and comparing refused every admission of an intact ledger as
//! "forged". Nothing is lost by not comparing there: the session built its state by applying
//! the lines before the record itself, each verified by the chain, the sidecar and the witness,
//! and it never loads a state from the record or the file; the digest is a claim about the
//! replay, relied on only by [`load`] when a session opens, and checked by every full replay.
//! (A consistent forged record appended after the witness's line is not detectable by any
//! session, as docs/LEDGER.md, "Forged checkpoints", says.) Keeping the session's own policies
//! out of the digested state instead would need a second policy map beside the state in every
//! lookup of the accountant, and a currency's sums of a session-local table's charges are in
//! the state's per-table sums too. Only [`open_replay`] writes a checkpoint, of its replay,
//! before the session puts anything in the state.
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AccountingError;
use super::ledger::{
    self, FORMAT, Hash, LineIn, Prefix, Record, State, Sync, check_line, hex, other, sha256,
    sibling,
};

/// A new checkpoint is written when a session opens a ledger with at least this many lines
/// after the last one (or after line 1): opening then reads at most this many lines (plus the
/// checkpoint), whatever the ledger's length.
pub(super) const EVERY: u64 = 256;

/// The serialised form of [`State`]. Bump it when a field of `State`, `Spend` or anything they
/// contain changes its serialised form (the test `layout_is_pinned` fails then): checkpoints of
/// another layout are not used (a full replay instead) and their records are not compared.
pub(super) const LAYOUT: u32 = 3;

/// The largest checkpoint file read: the compact state is a few tens of kilobytes per table, so
/// a larger file is not a checkpoint this version wrote (not used: a full replay instead).
pub(super) const MAX_BYTES: u64 = 64 << 20;

/// The `checkpoint` record of the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct CheckpointRecord {
    /// Lines before this record: the state is the replay of lines 1..=`lines`.
    pub lines: u64,
    pub layout: u32,
    /// Hex SHA-256 of the state in canonical form.
    pub state_sha256: String,
}

/// The first line of `<ledger>.checkpoint`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHead {
    format: u32,
    ledger_id: String,
    /// The line of the checkpoint record (1-based).
    line: u64,
    /// Its byte offset in the ledger.
    offset: u64,
    layout: u32,
    state_sha256: String,
}

/// `<ledger>.checkpoint`, beside the ledger.
pub fn checkpoint_path(ledger: &Path) -> PathBuf {
    sibling(ledger, ".checkpoint")
}

fn encode(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => Value::String(format!(
            "f{:016x}",
            n.as_f64().unwrap_or(f64::NAN).to_bits()
        )),
        Value::String(s) => Value::String(format!("s{s}")),
        Value::Array(a) => Value::Array(a.into_iter().map(encode).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, encode(v))).collect()),
        v => v,
    }
}

fn decode(v: Value) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            if let Some(bits) = s.strip_prefix('f') {
                let x = u64::from_str_radix(bits, 16)
                    .map(f64::from_bits)
                    .map_err(|e| e.to_string())?;
                Value::Number(
                    serde_json::Number::from_f64(x).ok_or("a non-finite number".to_string())?,
                )
            } else if let Some(t) = s.strip_prefix('s') {
                Value::String(t.to_string())
            } else {
                return Err(format!("an unprefixed string {s:?}"));
            }
        }
        Value::Array(a) => Value::Array(a.into_iter().map(decode).collect::<Result<_, _>>()?),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| decode(v).map(|v| (k, v)))
                .collect::<Result<_, _>>()?,
        ),
        v => v,
    })
}

/// The state in canonical form (see the module's documentation).
pub(super) fn state_bytes(st: &State) -> Result<Vec<u8>, String> {
    let v = serde_json::to_value(st).map_err(|e| e.to_string())?;
    serde_json::to_vec(&encode(v)).map_err(|e| e.to_string())
}

/// Reads a state written by [`state_bytes`] (its positional fields empty).
pub(super) fn parse_state(bytes: &[u8]) -> Result<State, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    serde_json::from_value(decode(v)?).map_err(|e| e.to_string())
}

/// The hex SHA-256 of the state in canonical form.
pub(super) fn state_digest(st: &State) -> Result<String, String> {
    state_bytes(st).map(|b| hex(&sha256(&b)))
}

/// Applying a `checkpoint` record after the lines of `st`: it must follow exactly the lines it
/// names, and (in the current layout) name the digest of the state replayed from them. The
/// digest is compared only when `st` is a replay (not [`State::live`]): a session's catch-up
/// checks the record's place, not its digest (round 50, review crash F1; the module's
/// documentation says why).
pub(super) fn check_record(st: &State, c: &CheckpointRecord) -> Result<(), String> {
    if c.lines != st.lines {
        return Err(format!(
            "a checkpoint record for the first {} lines at line {}: lines were deleted, inserted \
             or reordered",
            c.lines,
            st.lines + 1
        ));
    }
    if !st.live && c.layout == LAYOUT && state_digest(st)? != c.state_sha256 {
        return Err(
            "a checkpoint record whose state digest is not the digest of the state replayed \
             from the lines before it: the checkpoint was forged, or lines before it were \
             edited"
                .to_string(),
        );
    }
    Ok(())
}

/// Reads the complete line starting at byte `offset` of the ledger (without its newline).
fn line_at(file: &fs::File, offset: u64) -> Option<Vec<u8>> {
    let mut reader = file;
    reader.seek(SeekFrom::Start(offset)).ok()?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = reader.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        if let Some(i) = chunk[..n].iter().position(|&b| b == b'\n') {
            out.extend_from_slice(&chunk[..i]);
            return Some(out);
        }
        out.extend_from_slice(&chunk[..n]);
        if out.len() > 1 << 20 {
            return None;
        }
    }
}

/// The checkpoint file's bytes: opened without following a symbolic link (`O_NOFOLLOW`, like
/// the files of `files::store`), a regular file, at most [`MAX_BYTES`]. `None` otherwise.
fn read_file(cp: &Path) -> Option<Vec<u8>> {
    let mut o = fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut o,
        libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
    );
    let f = o.open(cp).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_BYTES + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= MAX_BYTES).then_some(bytes)
}

/// The state at the ledger's checkpoint, positioned after its record, when the checkpoint file
/// and the record agree (see the module's documentation); else `None` (replay from line 1).
pub(super) fn load(file: &fs::File, path: &Path) -> Option<State> {
    let bytes = read_file(&checkpoint_path(path))?;
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let head: FileHead = serde_json::from_slice(&bytes[..nl]).ok()?;
    let raw = &bytes[nl + 1..];
    if head.format != FORMAT
        || head.layout != LAYOUT
        || head.line < 2
        || hex(&sha256(raw)) != head.state_sha256
    {
        return None;
    }
    // The ledger's header names the same ledger.
    let first = line_at(file, 0)?;
    let mut id = None;
    check_line(path, 1, &first, &mut id, None).ok()?;
    if id.as_deref() != Some(head.ledger_id.as_str()) {
        return None;
    }
    // The record at the offset is this checkpoint's.
    let line = line_at(file, head.offset)?;
    let parsed: LineIn = serde_json::from_slice(&line).ok()?;
    let Record::Checkpoint(c) = parsed.record else {
        return None;
    };
    if c.lines + 1 != head.line || c.layout != LAYOUT || c.state_sha256 != head.state_sha256 {
        return None;
    }
    let mut last: Hash = [0; 32];
    if parsed.prev.len() != 64 {
        return None;
    }
    for (i, b) in last.iter_mut().enumerate() {
        *b = u8::from_str_radix(parsed.prev.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    let mut st = parse_state(raw).ok()?;
    if st.ledger_id.as_deref() != Some(head.ledger_id.as_str()) {
        return None;
    }
    st.offset = head.offset + line.len() as u64 + 1;
    st.lines = head.line;
    st.hash_base = head.line - 1;
    st.hashes = vec![sha256(&line)];
    st.checkpoint_line = head.line;
    st.prefix = Some(Prefix {
        offset: head.offset,
        lines: head.line - 1,
        last,
    });
    Some(st)
}

/// Writes a checkpoint of `st` (a state replayed from the ledger, nothing else applied): the
/// file first (replaced by a rename, not fsync'd: a lost or stale file only means a longer
/// replay), then the record, appended like any record. Under the exclusive lock. Never of a
/// session's state ([`State::live`]), which holds what no line says: nothing is written then
/// (a checkpoint is a cache; only [`open_replay`] writes one, before the session starts).
fn write(
    file: &fs::File,
    path: &Path,
    witness: Option<&Path>,
    st: &mut State,
) -> Result<(), AccountingError> {
    debug_assert!(!st.live, "a checkpoint of a session's state");
    let Some(id) = st.ledger_id.clone().filter(|_| !st.live) else {
        return Ok(());
    };
    let raw = state_bytes(st).map_err(|m| other(path, m))?;
    let digest = hex(&sha256(&raw));
    let head = FileHead {
        format: FORMAT,
        ledger_id: id,
        line: st.lines + 1,
        offset: st.offset,
        layout: LAYOUT,
        state_sha256: digest.clone(),
    };
    let mut bytes = serde_json::to_vec(&head).map_err(|e| other(path, e.to_string()))?;
    bytes.push(b'\n');
    bytes.extend_from_slice(&raw);
    let target = checkpoint_path(path);
    ledger::replace_bytes(&bytes, &sibling(&target, ".tmp"), &target, Sync::NoFsync)?;
    ledger::append(
        file,
        path,
        witness,
        st,
        Record::Checkpoint(CheckpointRecord {
            lines: st.lines,
            layout: LAYOUT,
            state_sha256: digest,
        }),
    )
}

/// Replays the ledger when a session opens it (under the exclusive lock, `st` empty): from its
/// checkpoint when that verifies, else from line 1; then writes a new checkpoint when at least
/// [`EVERY`] lines follow the last one.
pub(super) fn open_replay(
    file: &fs::File,
    path: &Path,
    witness: Option<&Path>,
    st: &mut State,
) -> Result<(), AccountingError> {
    let mut done = false;
    if let Some(loaded) = load(file, path) {
        *st = loaded;
        done = ledger::catch_up(file, path, witness, st).is_ok();
    }
    if !done {
        // No usable checkpoint, or the lines after it (or a seal older than it) did not verify
        // from it: the full replay decides.
        *st = State::default();
        ledger::catch_up(file, path, witness, st)?;
    }
    if st.lines >= st.checkpoint_line.max(1) + EVERY {
        write(file, path, witness, st)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::tests::private;
    use crate::accounting::{Accountant, FilterKind, TableCharge, TableKey};
    use dpfusion_udfs::privacy::Event;

    fn temp_ledger(tag: &str) -> crate::testdir::TestPath {
        crate::testdir::test_file(&format!("checkpoint-{tag}"), "ledger.jsonl")
    }

    /// A ledger with two private tables and `n` charges of mixed events (a Gaussian
    /// with an additive δ, a plain Gaussian), long enough for a checkpoint when `n` ≥ [`EVERY`].
    fn filled(tag: &str, n: usize) -> crate::testdir::TestPath {
        let path = temp_ledger(tag);
        let acc = Accountant::open(&path).unwrap();
        acc.register_table(private("demo:a", "a", 1e6)).unwrap();
        acc.register_table(private("demo:b", "b", 1e6)).unwrap();
        for i in 0..n {
            let mu = 0.1 + i as f64 / 7.0;
            let charges = [
                TableCharge {
                    key: TableKey::from("demo:a"),
                    events: vec![Event::Gaussian { mu }, Event::Delta { delta: 1e-9 }],
                },
                TableCharge {
                    key: TableKey::from("demo:b"),
                    events: vec![Event::Gaussian { mu: mu / 3.0 }],
                },
            ];
            acc.admit(&format!("SELECT {i}"), &charges[..1 + i % 2])
                .unwrap();
        }
        path
    }

    /// What SHOW BUDGET shows (every field, exact).
    fn rows(path: &Path) -> String {
        format!("{:?}", Accountant::open(path).unwrap().budget_rows())
    }

    fn full_replay(path: &Path) -> State {
        let file = fs::File::open(path).unwrap();
        let mut st = State::default();
        ledger::catch_up(&file, path, None, &mut st).unwrap();
        st
    }

    #[test]
    fn a_checkpointed_ledger_replays_to_the_state_of_a_full_replay() {
        let path = filled("same", EVERY as usize + 10);
        assert!(!checkpoint_path(&path).exists());
        // Opening writes the checkpoint (more than EVERY lines since line 1)…
        drop(Accountant::open(&path).unwrap());
        assert!(checkpoint_path(&path).exists());
        // …then more charges, another session.
        let acc = Accountant::open(&path).unwrap();
        for i in 0..5 {
            let c = [TableCharge {
                key: TableKey::from("demo:b"),
                events: vec![Event::Gaussian {
                    mu: 0.01 * i as f64,
                }],
            }];
            acc.admit("SELECT more", &c).unwrap();
        }
        drop(acc);
        let file = fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut cp = load(&file, &path).expect("the checkpoint is used");
        assert!(cp.hash_base > 0 && cp.entries.is_empty());
        ledger::catch_up(&file, &path, None, &mut cp).unwrap();
        let full = full_replay(&path);
        assert_eq!(state_bytes(&cp).unwrap(), state_bytes(&full).unwrap());
        assert_eq!(
            (cp.offset, cp.lines, cp.hashes.last()),
            (full.offset, full.lines, full.hashes.last())
        );
        assert_eq!(cp.entries.len(), 5);
        ledger::load_prefix(&file, &path, &mut cp).unwrap();
        assert_eq!(cp.entries, full.entries);
        // The profiles are bit for bit the same (the canonical form carries bits).
        assert_eq!(cp.tables, full.tables);
        // `dpfusion ledger verify`'s record counts add up to the lines, checkpoints included.
        let r = crate::accounting::verify(&path).unwrap();
        assert_eq!(r.checkpoint_records, 1);
        assert_eq!(
            r.lines,
            u64::from(r.ledger_id.is_some())
                + r.policy_records
                + r.owner_records
                + r.charges
                + r.checkpoint_records
        );
    }

    #[test]
    fn a_forged_checkpoint_file_is_not_used_and_a_forged_record_is_refused() {
        let path = filled("forged", EVERY as usize + 2);
        drop(Accountant::open(&path).unwrap());
        let spent = rows(&path);
        let cp = checkpoint_path(&path);
        let text = fs::read_to_string(&cp).unwrap();
        let (head, state) = text.split_once('\n').unwrap();
        let mut v: Value = serde_json::from_str(state).unwrap();
        // The state edited (a table's running sum set to zero, its charges to none) without its
        // digest: not used.
        v["tables"]["demo:a"]["queries"] = serde_json::json!(0);
        let sums = v["tables"]["demo:a"]["sums"].as_array_mut().unwrap();
        assert!(
            sums[0][1]["main"]
                .as_u64()
                .is_some_and(|b| f64::from_bits(b) > 0.0)
        );
        sums[0][1]["main"] = serde_json::json!(0);
        let forged = serde_json::to_string(&v).unwrap();
        fs::write(&cp, format!("{head}\n{forged}")).unwrap();
        let file = fs::File::open(&path).unwrap();
        assert!(load(&file, &path).is_none());
        assert_eq!(rows(&path), spent);
        // With its digest recomputed in the file: still not used (the record disagrees).
        let mut h: Value = serde_json::from_str(head).unwrap();
        h["state_sha256"] = Value::String(hex(&sha256(forged.as_bytes())));
        fs::write(&cp, format!("{h}\n{forged}")).unwrap();
        assert!(load(&file, &path).is_none());
        assert_eq!(rows(&path), spent);
        // And with the record's digest forged too (chain and sidecar recomputed, as someone who
        // can write the ledger's directory could): the full replay refuses it.
        let mut lines: Vec<String> = fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let at = lines
            .iter()
            .position(|l| l.contains("\"record\":\"checkpoint\""))
            .unwrap();
        lines.truncate(at + 1);
        let mut rec: Value = serde_json::from_str(&lines[at]).unwrap();
        rec["state_sha256"] = h["state_sha256"].clone();
        lines[at] = serde_json::to_string(&rec).unwrap();
        fs::write(&path, lines.join("\n") + "\n").unwrap();
        let id = h["ledger_id"].as_str().unwrap();
        let seal = serde_json::json!({"format": 2, "ledger_id": id, "lines": at + 1,
            "hash": hex(&sha256(lines[at].as_bytes()))});
        fs::write(ledger::head_path(&path), seal.to_string()).unwrap();
        let err = crate::accounting::verify(&path).unwrap_err().to_string();
        assert!(err.contains("state digest"), "{err}");
        // A session started from the (consistent) forged pair would trust it: that is what the
        // witness is for (dpfusion-cli/tests/it/ledger.rs); verify and every full replay refuse it.
        fs::remove_file(&cp).unwrap();
        let err = Accountant::open(&path).err().unwrap().to_string();
        assert!(err.contains("state digest"), "{err}");
    }

    #[test]
    fn a_stale_checkpoint_replays_from_its_line() {
        let path = filled("stale", EVERY as usize + 2);
        drop(Accountant::open(&path).unwrap());
        let old = fs::read(checkpoint_path(&path)).unwrap();
        let acc = Accountant::open(&path).unwrap();
        for _ in 0..EVERY + 1 {
            let c = [TableCharge {
                key: TableKey::from("demo:a"),
                events: vec![Event::Gaussian { mu: 0.01 }],
            }];
            acc.admit("SELECT again", &c).unwrap();
        }
        drop(acc);
        drop(Accountant::open(&path).unwrap()); // the second checkpoint
        let want = rows(&path);
        fs::write(checkpoint_path(&path), old).unwrap();
        let file = fs::File::open(&path).unwrap();
        let mut st = load(&file, &path).expect("an older checkpoint still names its record");
        assert!(st.lines < 2 * EVERY);
        drop(file);
        assert_eq!(rows(&path), want);
        let file = fs::File::open(&path).unwrap();
        ledger::catch_up(&file, &path, None, &mut st).unwrap();
        assert_eq!(
            state_bytes(&st).unwrap(),
            state_bytes(&full_replay(&path)).unwrap()
        );
    }

    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A random event of a kind `kinds` allows (0 Gaussian, 1 Delta, 2 zCDP, 3 Laplace,
    /// 4 pure DP, 5 RGM, 6 Poisson-subsampled Gaussian), parameters spread over decades so
    /// that the sums round.
    fn event(rng: &mut u64, kinds: &[u8]) -> Event {
        let u = |rng: &mut u64| (splitmix(rng) >> 11) as f64 / (1u64 << 53) as f64;
        let small = |rng: &mut u64| 10f64.powf(-3.0 + 2.5 * u(rng));
        match kinds[(splitmix(rng) % kinds.len() as u64) as usize] {
            0 => Event::Gaussian { mu: small(rng) },
            1 => Event::Delta {
                delta: 1e-12 * (1.0 + u(rng)),
            },
            2 => Event::Zcdp {
                rho: small(rng) * small(rng),
            },
            3 => Event::Laplace {
                epsilon: small(rng),
            },
            4 => Event::PureDp {
                epsilon: small(rng),
            },
            5 => Event::Rgm {
                sigma: 50.0 + 100.0 * u(rng),
                gamma: 0.01 * u(rng),
                dims: 1 + (splitmix(rng) % 3) as u32,
                steps: 1 + (splitmix(rng) % 4) as u32,
            },
            _ => Event::SubsampledGaussian {
                sample_rate: 0.001 + 0.01 * u(rng),
                noise_multiplier: 2.0 + 3.0 * u(rng),
                steps: 1 + splitmix(rng) % 20,
            },
        }
    }

    /// The sums of a table's filter as the code before compact checkpoints computed them: the
    /// filter's fold over every event of the table in the ledger's charges, in order.
    fn sums_of_every_event(
        entries: &[crate::accounting::LedgerEntry],
        key: &TableKey,
        f: &crate::accounting::Filter,
    ) -> crate::accounting::Usage {
        f.usage(
            entries
                .iter()
                .flat_map(|e| e.tables.iter())
                .filter(|t| &t.key == key)
                .flat_map(|t| t.events.iter()),
        )
    }

    /// Randomised sequences of charges on three tables (gdp, zcdp, rdp; every event kind each
    /// filter takes, PLD-style subsampled and RGM events included), with owner changes of the
    /// filter (an rdp order put in force after charges; a zcdp table made gdp, so its earlier
    /// Laplace charges are refused), sessions opened from the checkpoint along the way: the
    /// state a session opens with is the state of a full replay byte for byte, each table's
    /// running sums are bit for bit the fold over every event of the ledger, and the admission
    /// decisions of a checkpointed session and a fully replayed one agree.
    #[test]
    fn randomised_charges_replay_from_a_checkpoint_to_the_full_replay_bit_for_bit() {
        for seed in [1u64, 2, 3] {
            let path = temp_ledger(&format!("random{seed}"));
            let mut rng = seed;
            let acc = Accountant::open(&path).unwrap();
            let mut g = private("demo:g", "g", 40.0);
            g.filter = FilterKind::Gdp;
            let mut z = private("demo:z", "z", 40.0);
            z.filter = FilterKind::Zcdp;
            let mut r = private("demo:r", "r", 40.0);
            r.filter = FilterKind::Rdp { order: None };
            for p in [g, z, r.clone()] {
                acc.register_table(p).unwrap();
            }
            let tables: [(&str, &[u8]); 3] = [
                ("demo:g", &[0, 0, 1]),
                ("demo:z", &[0, 1, 2, 3, 4]),
                ("demo:r", &[0, 1, 2, 3, 4, 5, 6]),
            ];
            let n = 2 * EVERY as usize + 40;
            let mut acc = Some(acc);
            let (mut admitted, mut refused) = (0, 0);
            for i in 0..n {
                if i == n / 2 {
                    // The owner puts another rdp order in force: its sums are not kept yet.
                    let mut p = r.clone();
                    p.filter = FilterKind::Rdp { order: Some(8.0) };
                    acc.as_ref()
                        .unwrap()
                        .owner_set_policy(p, "order 8")
                        .unwrap();
                }
                if i == 3 * n / 4 {
                    let mut p = private("demo:z", "z", 40.0);
                    p.filter = FilterKind::Gdp;
                    acc.as_ref()
                        .unwrap()
                        .owner_set_policy(p, "gdp now")
                        .unwrap();
                }
                if i.is_multiple_of(97) {
                    // A new session, from the checkpoint when there is one.
                    drop(acc.take());
                    acc = Some(Accountant::open(&path).unwrap());
                }
                let a = acc.as_ref().unwrap();
                let mut charges = Vec::new();
                for (key, kinds) in tables {
                    if splitmix(&mut rng).is_multiple_of(3) {
                        let k = 1 + splitmix(&mut rng) % 3;
                        charges.push(TableCharge {
                            key: TableKey::from(key),
                            events: (0..k).map(|_| event(&mut rng, kinds)).collect(),
                        });
                    }
                }
                match a.admit(&format!("q{i}"), &charges) {
                    Ok(_) => admitted += 1,
                    Err(crate::accounting::AccountingError::BudgetExceeded { .. }) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            drop(acc);
            assert!(
                admitted > EVERY as usize + 100 && refused > 0,
                "{admitted} {refused}"
            );
            {
                let file = fs::OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(&path)
                    .unwrap();
                let mut cp = load(&file, &path).expect("the checkpoint loads");
                ledger::catch_up(&file, &path, None, &mut cp).unwrap();
            }
            let a = Accountant::open(&path).unwrap();
            let full = full_replay(&path);
            {
                let st = a.state();
                assert!(st.prefix.is_some(), "the session started from a checkpoint");
                assert!(st.lines - st.checkpoint_line < EVERY + 2);
                assert_eq!(state_bytes(&st).unwrap(), state_bytes(&full).unwrap());
                assert_eq!(st.tables, full.tables);
            }
            let entries = a.ledger_entries().unwrap();
            assert_eq!(entries, full.entries);
            for p in a.policies() {
                let f = p.compiled_filter().unwrap();
                let want = sums_of_every_event(&entries, &p.key, &f);
                let st = a.state();
                let got = st.tables[&p.key].usage(f.currency()).unwrap();
                assert_eq!(got.main.to_bits(), want.main.to_bits(), "{}", p.key);
                assert_eq!(got.delta.to_bits(), want.delta.to_bits());
                assert_eq!(got.delta_exact, want.delta_exact);
                assert_eq!(got.refused, want.refused);
            }
            // The zcdp table made gdp holds refused (Laplace, zCDP) events.
            assert!(a.budget_rows().iter().any(|r| r.spent.is_infinite()));
            // Admission decisions: a session from the checkpoint and one replayed in full.
            fs::remove_file(checkpoint_path(&path)).unwrap();
            let b = Accountant::open(&path).unwrap();
            assert!(b.state().prefix.is_none());
            for _ in 0..30 {
                let (key, kinds) = tables[(splitmix(&mut rng) % 3) as usize];
                let c = [TableCharge {
                    key: TableKey::from(key),
                    events: (0..3).map(|_| event(&mut rng, kinds)).collect(),
                }];
                let (pa, pb) = (a.preview(&c).unwrap(), b.preview(&c).unwrap());
                assert_eq!(format!("{pa:?}"), format!("{pb:?}"));
            }
            assert_eq!(
                format!("{:?}", a.budget_rows()),
                format!("{:?}", b.budget_rows())
            );
        }
    }

    /// The checkpoint file is opened without following a symbolic link, and a file larger than
    /// [`MAX_BYTES`] (or not a regular file) is not read: a full replay instead.
    #[cfg(unix)]
    #[test]
    fn a_symlinked_or_oversized_checkpoint_is_not_read() {
        let path = filled("nofollow", EVERY as usize + 2);
        drop(Accountant::open(&path).unwrap());
        let want = rows(&path);
        let cp = checkpoint_path(&path);
        let file = fs::File::open(&path).unwrap();
        assert!(load(&file, &path).is_some());
        // The same (valid) bytes behind a symbolic link: not followed.
        let elsewhere = path.with_file_name("elsewhere");
        fs::rename(&cp, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cp).unwrap();
        assert!(read_file(&cp).is_none());
        assert!(load(&file, &path).is_none());
        assert_eq!(rows(&path), want);
        // A directory, and a (sparse) file over the cap: not read.
        fs::remove_file(&cp).unwrap();
        fs::create_dir(&cp).unwrap();
        assert!(load(&file, &path).is_none());
        fs::remove_dir(&cp).unwrap();
        fs::copy(&elsewhere, &cp).unwrap();
        assert!(load(&file, &path).is_some());
        fs::OpenOptions::new()
            .write(true)
            .open(&cp)
            .unwrap()
            .set_len(MAX_BYTES + 1)
            .unwrap();
        assert!(read_file(&cp).is_none());
        assert_eq!(rows(&path), want);
    }

    /// A crash between the checkpoint file's rename and its record's append leaves a file whose
    /// record is not in the ledger: not used (full replay), and the next session writes both.
    #[test]
    fn a_checkpoint_file_without_its_record_is_not_used() {
        let path = filled("norecord", EVERY as usize + 2);
        let want = rows(&path);
        drop(Accountant::open(&path).unwrap());
        let text = fs::read_to_string(checkpoint_path(&path)).unwrap();
        let head: Value = serde_json::from_str(text.split_once('\n').unwrap().0).unwrap();
        let offset = head["offset"].as_u64().unwrap();
        // The ledger as it was before the record (the crash), its sidecar matching it.
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(offset)
            .unwrap();
        crate::accounting::reseal(&path, None).unwrap();
        let file = fs::File::open(&path).unwrap();
        assert!(load(&file, &path).is_none());
        drop(file);
        assert_eq!(rows(&path), want);
        // That session replayed from line 1 and wrote a checkpoint again.
        let file = fs::File::open(&path).unwrap();
        let mut st = load(&file, &path).expect("a new checkpoint");
        ledger::catch_up(&file, &path, None, &mut st).unwrap();
        assert_eq!(
            state_bytes(&st).unwrap(),
            state_bytes(&full_replay(&path)).unwrap()
        );
        assert_eq!(
            crate::accounting::verify(&path).unwrap().checkpoint_records,
            1
        );
    }

    /// The canonical form of a fixed state: if this changes, so does the layout of every
    /// checkpoint; bump [`LAYOUT`] and the digest below.
    #[test]
    fn layout_is_pinned() {
        let mut st = State {
            next_seq: 3,
            ledger_id: Some("00ff".to_string()),
            policy_records: 1,
            ..State::default()
        };
        let p = private("demo:a", "a", 2.5);
        st.largest_epsilon.insert(p.key.clone(), 2.5);
        // Round 52 (review operator F2, F3): the relaxations and the lost guarantee.
        st.relaxations.insert(
            p.key.clone(),
            vec![crate::accounting::Relaxation {
                line: 2,
                note: "why [budget ε 1 → 2.5]".to_string(),
            }],
        );
        st.no_guarantee.insert(
            p.key.clone(),
            crate::accounting::NoGuarantee {
                line: 2,
                why: "made public".to_string(),
            },
        );
        st.policies.insert(p.key.clone(), p);
        let events = vec![Event::Gaussian { mu: 0.5 }, Event::Delta { delta: 1e-9 }];
        let sums = [
            crate::accounting::Currency::Gdp,
            crate::accounting::Currency::Zcdp,
            crate::accounting::Currency::Rdp { order: 8.0 },
        ]
        .into_iter()
        .map(|c| (c, c.fold(Default::default(), &events)))
        .chain([(
            crate::accounting::Currency::Rdp { order: 2.0 },
            crate::accounting::Usage {
                main: f64::INFINITY,
                refused: Some("x".to_string()),
                ..Default::default()
            },
        )])
        .collect();
        st.tables.insert(
            TableKey::from("demo:a"),
            ledger::Spend {
                sums,
                queries: 2,
                events: 2,
            },
        );
        let bytes = state_bytes(&st).unwrap();
        let back = parse_state(&bytes).unwrap();
        assert_eq!(state_bytes(&back).unwrap(), bytes);
        assert_eq!(
            (LAYOUT, hex(&sha256(&bytes)).as_str()),
            (
                3,
                "b4aee83afe32ea78464207a1feda4ea465fcab6b2d036d2689e02f9b64847c30"
            ),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
    }

    #[test]
    fn floats_and_strings_round_trip_exactly() {
        let v = serde_json::json!({"a": [0.1, 1e-300, 0.30000000000000004, 5e-324],
                                   "s": "f00", "n": 3, "m": {"k": "x"}});
        let back = decode(
            serde_json::from_slice(&serde_json::to_vec(&encode(v.clone())).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(back, v);
        let bits = |v: &Value| v["a"][2].as_f64().unwrap().to_bits();
        assert_eq!(bits(&back), 0.30000000000000004f64.to_bits());
        assert!(decode(Value::String("x".into())).is_err());
    }
}
