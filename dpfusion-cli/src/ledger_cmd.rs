//! `dpfusion ledger …`: check, re-seal and migrate a privacy ledger (docs/LEDGER.md).
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dpfusion::accounting::display::{self, Round, num};
use dpfusion::accounting::{self, LEDGER_FORMAT, LedgerReport, Visibility};

pub const HELP: &str = "\
dpfusion ledger — check and maintain a privacy ledger (docs/LEDGER.md)

USAGE:
    dpfusion ledger verify [PATH] [--ledger-witness FILE | --catalog FILE]
    dpfusion ledger reseal PATH [--ledger-witness FILE | --catalog FILE]
    dpfusion ledger migrate PATH [--ledger-witness FILE | --catalog FILE]
    dpfusion ledger report [PATH] -o FILE.html [--ledger-witness FILE | --catalog FILE]

PATH defaults to the catalog's ledger with --catalog, else ./.dpfusion/ledger.jsonl. The
sidecar PATH.head lives beside the ledger. The witness (outside the ledger's directory) is
FILE, else the catalog's (its ledger_witness, by default beside the catalog), else
<ledger dir>.witness/<ledger file>.witness: give the one the sessions on this ledger use.

COMMANDS:
    verify     Check the ledger without changing it: the header, the hash chain of every line,
               the sidecar (no line cut from the end, the last line unedited), the witness (the
               ledger and its sidecar not rolled back together) and every record. Prints
               records and charges, and per private table the numbers SHOW BUDGET shows:
               its guarantee (the largest budget ever in force), the budget in force, the
               shares used and left, the next ε and the δ of partition selection spent and
               left.
    reseal     Data owner only: write a new sidecar for the ledger as it is, after its chain is
               checked (e.g. a ledger restored from a backup without its .head). This accepts
               the ledger as complete: a cut to a shorter ledger is no longer detectable. It
               rewrites the witness too.
    migrate    Convert a ledger written by an earlier dpfusion (format 1: no header, no hash
               chain) to the current format. Stop every session on it first. The original is
               kept as PATH.v1.bak.
    report     The data owner's view: verifies the ledger as verify does, then writes one
               self-contained HTML page (inline SVG, no script, nothing fetched) with, per
               private table, the numbers SHOW BUDGET shows, the share of the budget used
               over time, by analyst and by function, and every charge with its SQL text.
               Give it to no analyst: it shows everyone's queries. FILE becomes a new file
               of yours (mode 0600) that replaces whatever was there; the ledger's own files
               are refused.

EXIT STATUS:
    0 when the ledger verifies (or the command succeeded); 1 when it does not (what is wrong
    and where is printed on stderr); 2 for a bad command line.
";

const DEFAULT: &str = ".dpfusion/ledger.jsonl";

/// Runs `dpfusion ledger ARGS…` (the arguments after `ledger`).
pub fn run(args: &[String]) -> ExitCode {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if args.iter().any(|a| matches!(*a, "-h" | "--help")) || args.is_empty() {
        print!("{HELP}");
        return if args.is_empty() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let (cmd, rest) = (args[0], &args[1..]);
    let (mut path, mut witness, mut catalog, mut output) = (None, None, None, None);
    let mut i = 0;
    while i < rest.len() {
        let a = rest[i];
        let slot = match a {
            "--ledger-witness" => &mut witness,
            "--catalog" => &mut catalog,
            "-o" | "--output" if cmd == "report" => &mut output,
            _ if a.starts_with('-') || path.is_some() => {
                return usage(&format!("unexpected argument '{a}'"));
            }
            _ => {
                path = Some(PathBuf::from(a));
                i += 1;
                continue;
            }
        };
        match rest.get(i + 1) {
            Some(v) if slot.is_none() => *slot = Some(PathBuf::from(*v)),
            _ => return usage(&format!("{a} needs one value")),
        }
        i += 2;
    }
    if witness.is_some() && catalog.is_some() {
        return usage("give --ledger-witness or --catalog, not both");
    }
    let mut from_catalog = None;
    if let Some(c) = &catalog {
        match dpfusion::catalog::Catalog::load(c) {
            Ok(c) => from_catalog = Some(c.session_options()),
            Err(e) => return fail(cmd, e),
        }
    }
    if path.is_none() && matches!(cmd, "verify" | "report") {
        path = Some(
            from_catalog
                .as_ref()
                .map_or_else(|| PathBuf::from(DEFAULT), |o| o.ledger_path.clone()),
        );
    }
    let Some(path) = path else {
        if matches!(cmd, "reseal" | "migrate") {
            return usage(&format!("'ledger {cmd}' needs the ledger's PATH"));
        }
        return usage(&format!("unknown ledger command '{cmd}'"));
    };
    let witness = match witness.or_else(|| from_catalog.and_then(|o| o.ledger_witness)) {
        Some(w) => w,
        None => match accounting::default_witness(&path) {
            Ok(w) => w,
            Err(e) => return fail(cmd, e),
        },
    };
    match cmd {
        "verify" => verify(&path, &witness),
        "reseal" => reseal(&path, &witness),
        "migrate" => migrate(&path, &witness),
        "report" => match output {
            Some(out) => report(&path, &witness, catalog.as_deref(), &out),
            None => usage("'ledger report' needs -o FILE.html"),
        },
        other => usage(&format!("unknown ledger command '{other}'")),
    }
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("dpfusion ledger: {msg}\nTry 'dpfusion ledger --help'.");
    ExitCode::from(2)
}

fn fail(cmd: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("dpfusion ledger {cmd}: FAILED: {e}");
    ExitCode::from(1)
}

fn verify(path: &Path, witness: &Path) -> ExitCode {
    match accounting::verify_with(path, Some(witness)) {
        Ok(r) => {
            let what = if r.witness.is_some() {
                "chain, sidecar and witness verified"
            } else {
                "chain and sidecar verified; no witness yet"
            };
            println!(
                "ledger {}: OK (format {LEDGER_FORMAT}, {what})",
                path.display()
            );
            println!("witness: {}", witness.display());
            print_report(&r);
            ExitCode::SUCCESS
        }
        Err(e) => fail("verify", e),
    }
}

fn report(path: &Path, witness: &Path, catalog: Option<&Path>, out: &Path) -> ExitCode {
    let html = match crate::ledger_report::html_report(path, Some(witness)) {
        Ok(h) => h,
        Err(e) => return fail("report", e),
    };
    match write_report(out, html.as_bytes(), path, witness, catalog) {
        Ok(()) => {
            println!(
                "ledger {}: verified; report written to {}",
                path.display(),
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail("report", format!("cannot write {}: {e}", out.display())),
    }
}

/// Writes the report (every analyst's SQL) to `out` without ever opening what `out` names (round
/// 46, review of the fixes: the report was written into a file another user owned and could
/// read, a FIFO at `out` hung the command, a link in a directory on the way was followed). The
/// bytes go to a new file beside `out`, `<name>.tmp`, created with `O_CREAT|O_EXCL|O_NOFOLLOW`,
/// mode 0600, and fsync'd; it is then renamed over `out`, so a link, a FIFO, a hard link or
/// another user's file at `out` is replaced, never written (the ledger's own way of replacing
/// its sidecar and witness: [`accounting::replace_file`]; a `<name>.tmp` left by a failed run is
/// removed by the next, never written through). Refused before anything is created: a directory
/// reached through a symbolic link that another user could replace
/// ([`dpfusion::files::path_link_others_control`]), and one of the ledger's own files
/// ([`ledgers_own`]).
fn write_report(
    out: &Path,
    bytes: &[u8],
    ledger: &Path,
    witness: &Path,
    catalog: Option<&Path>,
) -> Result<(), String> {
    let name = out
        .file_name()
        .ok_or("it names no file; give -o the report's file name")?;
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Some(c) = dpfusion::files::path_link_others_control(dir) {
        return Err(format!(
            "'{}' is a symbolic link in {}, a directory {} (mode {:o}): whoever can replace \
             the link chooses where everyone's queries are written. Name the directory the link \
             leads to, or keep the link in a directory only you can write ({})",
            c.entry.display(),
            c.dir.display(),
            c.what(),
            c.mode,
            c.fix()
        ));
    }
    if ledgers_own(out, dir, name, ledger, witness, catalog) {
        return Err("it is one of the ledger's own files; write the report elsewhere".into());
    }
    // A new 0600 file beside `out`, renamed over it: the ledger's own way of replacing a file.
    accounting::replace_file(bytes, out).map_err(|e| {
        format!("{e}; write the report to a new file of your own, in a directory you can write")
    })?;
    // The rename made durable (best effort: the report is written either way).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Whether `out` (in `dir`, named `name`) is one of the ledger's own files: the ledger, the
/// witness or the catalog, or a `<file>.<suffix>` beside the ledger or the witness (sidecar,
/// checkpoint, backup, temporary files: by name, whether it exists or not, so that a report is
/// never put where the ledger's next file may go), compared by device and inode of what `out`
/// names and of what it leads to.
fn ledgers_own(
    out: &Path,
    dir: &Path,
    name: &std::ffi::OsStr,
    ledger: &Path,
    witness: &Path,
    catalog: Option<&Path>,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ids = |p: &Path| -> Vec<(u64, u64)> {
        [std::fs::symlink_metadata(p), std::fs::metadata(p)]
            .into_iter()
            .flatten()
            .map(|m| (m.dev(), m.ino()))
            .collect()
    };
    let parent = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let named = ids(out);
    let mut own: Vec<PathBuf> = [ledger, witness]
        .into_iter()
        .chain(catalog)
        .map(Path::to_path_buf)
        .collect();
    let here = std::fs::canonicalize(dir).ok();
    for p in [ledger, witness] {
        let Some(file) = p.file_name() else { continue };
        let prefix = format!("{}.", file.to_string_lossy());
        let d = parent(p);
        if here.is_some()
            && std::fs::canonicalize(&d).ok() == here
            && name.to_string_lossy().starts_with(&prefix)
        {
            return true;
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            own.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .map(|e| e.path()),
            );
        }
    }
    !named.is_empty()
        && own
            .iter()
            .flat_map(|p| ids(p))
            .any(|id| named.contains(&id))
}

fn reseal(path: &Path, witness: &Path) -> ExitCode {
    match accounting::reseal(path, Some(witness)) {
        Ok(r) => {
            println!(
                "ledger {}: chain verified; wrote a new sidecar {} and witness {} for {} lines",
                path.display(),
                accounting::head_path(path).display(),
                witness.display(),
                r.lines
            );
            print_report(&r);
            ExitCode::SUCCESS
        }
        Err(e) => fail("reseal", e),
    }
}

fn migrate(path: &Path, witness: &Path) -> ExitCode {
    match accounting::migrate(path, Some(witness)) {
        Ok(m) => {
            println!(
                "ledger {}: migrated {} records to format {LEDGER_FORMAT}; the original is kept \
                 as {}",
                path.display(),
                m.records,
                m.backup.display()
            );
            if m.torn > 0 {
                println!(
                    "note: the last {} bytes were a line without its newline (an interrupted \
                     append, never admitted) and were left out",
                    m.torn
                );
            }
            verify(path, witness)
        }
        Err(e) => fail("migrate", e),
    }
}

fn print_report(r: &LedgerReport) {
    println!(
        "ledger id: {}",
        r.ledger_id.as_deref().unwrap_or("(none yet)")
    );
    println!(
        "records: {} lines ({} header, {} policy, {} owner, {} charge, {} checkpoint)",
        r.lines,
        u64::from(r.ledger_id.is_some()),
        r.policy_records,
        r.owner_records,
        r.charges,
        r.checkpoint_records
    );
    println!("tables: {}", r.tables.len());
    if !r.tables.is_empty() {
        let header = [
            "table",
            "key",
            "visibility",
            "filter",
            "guarantee",
            "in force",
            "used",
            "left",
            "next ε",
            "δ sel. spent",
            "δ sel. left",
            "charges",
        ];
        let rows: Vec<Vec<String>> = r.tables.iter().map(table_row).collect();
        let mut w = header.map(|h| h.chars().count());
        for row in &rows {
            for (i, c) in row.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[&str]| {
            let s: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c}{}", " ".repeat(w[i] - c.chars().count())))
                .collect();
            println!("  {}", s.join("  ").trim_end());
        };
        line(&header);
        for row in &rows {
            line(&row.iter().map(String::as_str).collect::<Vec<_>>());
        }
        // The ledger has no session: say at which δ its next ε is (round 47, review
        // "newuser2", A).
        println!(
            "next ε: the largest ε of one more Gaussian call at δ {} (the default \
             dpfusion.default_delta; a session with another default shows its own)",
            display::budget(accounting::DEFAULT_QUERY_DELTA)
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}

/// One table's line of `verify`'s summary: the numbers `SHOW BUDGET` shows for it (round 47,
/// review "newuser", findings 1-3), from the same [`accounting::BudgetRow`], printed as the
/// receipts print them: the guarantee (the largest budget ever in force) and the budget in force
/// that what is left is measured against, both as the owner wrote them ([`display::budget`]),
/// the shares used and left of the filter's budget, the next ε (rounded down; one Gaussian call
/// at δ [`accounting::DEFAULT_QUERY_DELTA`]), the δ of partition selection spent (up) and left
/// (down).
/// A public table, or a key without a recorded policy, has no budget: `-`.
fn table_row(t: &accounting::TableReport) -> Vec<String> {
    let visibility = match t.visibility {
        Some(Visibility::Private) => "private",
        Some(Visibility::Public) => "public",
        None => "session",
    };
    let mut row = vec![t.name.clone(), t.key.to_string(), visibility.to_string()];
    match (&t.budget_row, t.policy.as_ref().map(|p| p.budget)) {
        (Some(b), Some(now)) => {
            let used = b.native.used_share;
            row.extend([
                b.filter.to_string(),
                // Budgets as the owner wrote them, one rule for both (round 47, review
                // "newuser2", C: an unlowered budget showed guarantee ≠ in force).
                format!(
                    "ε={} δ={}",
                    display::budget(b.epsilon),
                    display::budget(b.delta)
                ),
                format!(
                    "ε={} δ={}",
                    display::budget(now.epsilon),
                    display::budget(now.delta)
                ),
                display::percent(used),
                display::percent_left(used, b.native.used, b.native.budget),
                num(b.remaining, Round::Down),
                num(b.delta_spent, Round::Up),
                num(b.delta_left, Round::Down),
            ]);
        }
        _ => row.extend(std::iter::repeat_n("-".to_string(), 8)),
    }
    row.push(t.charges.to_string());
    row
}
