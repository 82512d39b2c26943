//! The policy store's rule (docs/PRIVACY.md, "Who decides what"): only the data owner registers a
//! table (through the catalog, the single-user flags or the Rust API; never SQL). The owner's
//! first registration records the policy, with the pinned schema and file format, in the ledger.
//! A later registration that is the same keeps it; one that is stricter in every part it changes
//! is recorded; one that weakens or changes any part is refused with the difference, unless the
//! owner gives a reason to relax it, which is recorded with the difference in an `owner` record.
//!
//! Stricter means: private instead of public, a smaller ε or δ, `add_remove` instead of
//! `replace`, fewer public columns, a schema or format pinned where none was, a privacy unit
//! declared where the unit was one row (add/remove of all of a unit's rows protects more than
//! add/remove of one). Changing the default contribution bounds is recorded freely: any bounds
//! are valid (they trade bias for noise). Removing or changing the unit column or domain needs
//! a relaxation. A change of the neighbour relation (`replace` ↔ `add_remove`, row ↔ unit, the
//! unit column or domain), even a stricter one, is allowed without a relaxation only while the
//! table has no charges: the charges already made were calibrated for the old relation, and
//! their ε under the new one is unbounded (issue 26, class 7). The privacy filter
//! (kind and order) and the δ share are neither: changing them changes how past charges are
//! counted, so it needs an explicit relaxation. Lowering a budget stops later admissions earlier;
//! it does not make earlier admissions cheaper (docs/ACCOUNTING.md).
//!
//! Round 52 (review operator): a reason approves one change, the one it was recorded with: a
//! relaxation whose reason the ledger already recorded for the key, to make a new change, is
//! refused ([`reason_recorded`]); a registration whose unit domain is its own name (the default)
//! keeps the recorded domain, so a rename is no change of the relation
//! ([`keep_recorded_domain`]); a new private file key under the name of another private file key
//! with charges would start a new budget for what may be the same data moved, and needs a
//! relaxation ([`new_budget`]; docs/LEDGER.md, "A table's budget belongs to its path").
use std::path::Path;

use super::{AccountingError, FilterKind, Neighbours, Relaxation, TablePolicy, Visibility};

pub(super) enum Decision {
    /// The ledger's policy stays in force (returned with the session's name for the table).
    Keep(Box<TablePolicy>),
    /// The requested policy is new or stricter: write it to the ledger.
    Record,
}

/// One part of a policy that a registration changes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Change {
    pub what: String,
    pub stricter: bool,
    /// A change of the neighbour relation (neighbours, row → unit, the unit column or domain):
    /// the ε of the charges already made, counted under the new relation, is unbounded (a
    /// charge for one row says nothing about all of a unit's rows, one for a `replace` neighbour
    /// nothing about adding a row). So even when the new relation is stricter, it is allowed
    /// without the owner's `relax` only on a table with no charges yet.
    pub voids_charges: bool,
}

impl Change {
    fn new(what: impl Into<String>, stricter: bool) -> Self {
        Self {
            what: what.into(),
            stricter,
            voids_charges: false,
        }
    }

    /// A change of the neighbour relation ([`Change::voids_charges`]).
    fn relation(what: impl Into<String>, stricter: bool) -> Self {
        Self {
            voids_charges: true,
            ..Self::new(what, stricter)
        }
    }

    /// May this change be recorded without the owner's relaxation, on a table that has
    /// (`charged`) or has not charges in the ledger?
    fn allowed(&self, charged: bool) -> bool {
        self.stricter && !(charged && self.voids_charges)
    }
}

fn cols(v: &[String]) -> String {
    format!("[{}]", v.join(", "))
}

/// The parts of `req` that differ from `e`, each marked stricter or not.
pub(super) fn changes(e: &TablePolicy, req: &TablePolicy) -> Vec<Change> {
    let mut out = Vec::new();
    match (e.visibility, req.visibility) {
        (Visibility::Public, Visibility::Private) => {
            out.push(Change::new("visibility public → private", true));
        }
        (Visibility::Private, Visibility::Public) => {
            out.push(Change::new("visibility private → public", false));
        }
        _ => {}
    }
    if e.visibility == Visibility::Private && req.visibility == Visibility::Private {
        let (eb, rb) = (e.budget, req.budget);
        if rb.epsilon != eb.epsilon {
            out.push(Change::new(
                format!("budget ε {} → {}", eb.epsilon, rb.epsilon),
                rb.epsilon < eb.epsilon,
            ));
        }
        if rb.delta != eb.delta {
            out.push(Change::new(
                format!("budget δ {:e} → {:e}", eb.delta, rb.delta),
                rb.delta < eb.delta,
            ));
        }
        // Orders are compared to 1e-12 relative: an automatic order read back from the ledger's
        // JSON may differ from the one computed again in its last bit, and the owner could not
        // reopen the table unchanged (review r45: `--filter rdp --epsilon 100` twice).
        let order_differs = matches!(
            (e.filter, req.filter),
            (FilterKind::Rdp { order: Some(x) }, FilterKind::Rdp { order: Some(y) })
                if (x - y).abs() > 1e-12 * x.abs().max(y.abs())
        );
        if !e.filter.same_kind(&req.filter) || order_differs {
            out.push(Change::new(
                format!("privacy filter {} → {}", e.filter, req.filter),
                false,
            ));
        }
        if req.delta_share != e.delta_share {
            out.push(Change::new(
                format!(
                    "δ share for partition selection {} → {}",
                    e.delta_share, req.delta_share
                ),
                false,
            ));
        }
        if e.neighbours != req.neighbours {
            out.push(Change::relation(
                format!("neighbours {} → {}", e.neighbours, req.neighbours),
                req.neighbours == Neighbours::AddRemove,
            ));
        }
        match (&e.unit, &req.unit) {
            (None, Some(u)) => out.push(Change::relation(
                format!("privacy unit: row → {}", u.column),
                // A unit of several rows protects more than one row under add/remove.
                req.neighbours == Neighbours::AddRemove,
            )),
            (Some(u), None) => out.push(Change::relation(
                format!("privacy unit: {} → row", u.column),
                false,
            )),
            (Some(a), Some(b)) if a.column != b.column || a.domain != b.domain => {
                out.push(Change::relation(
                    format!(
                        "privacy unit {} (domain {}) → {} (domain {})",
                        a.column, a.domain, b.column, b.domain
                    ),
                    false,
                ))
            }
            (Some(a), Some(b)) if a != b => out.push(Change::new(
                // Any bounds are valid: they trade bias for noise, never the guarantee.
                format!(
                    "default contribution bounds (groups {}, rows {}) → (groups {}, rows {})",
                    a.max_groups_contributed,
                    a.max_rows_contributed,
                    b.max_groups_contributed,
                    b.max_rows_contributed
                ),
                true,
            )),
            _ => {}
        }
        let added = req
            .public_columns
            .iter()
            .any(|c| !e.public_columns.contains(c));
        let removed = e
            .public_columns
            .iter()
            .any(|c| !req.public_columns.contains(c));
        if added || removed {
            out.push(Change::new(
                format!(
                    "public columns {} → {}",
                    cols(&e.public_columns),
                    cols(&req.public_columns)
                ),
                !added,
            ));
        }
    }
    match (&e.schema, &req.schema) {
        (Some(a), Some(b)) if a != b => out.push(Change::new(
            format!(
                "pinned schema {} → {}",
                super::schema_text(a),
                super::schema_text(b)
            ),
            false,
        )),
        (None, Some(b)) => out.push(Change::new(
            format!("schema pinned: {}", super::schema_text(b)),
            true,
        )),
        _ => {}
    }
    match (&e.format, &req.format) {
        (Some(a), Some(b)) if a != b => {
            out.push(Change::new(format!("file format {a} → {b}"), false))
        }
        (None, Some(b)) => out.push(Change::new(format!("file format pinned: {b}"), true)),
        _ => {}
    }
    out
}

/// True when `req` may replace `e` in a `policy` record on replay (every change is stricter).
/// Replay keeps the rule under which the record was written; a relation change on a charged
/// table is refused before it is written ([`reconcile`]).
pub(super) fn no_weaker(e: &TablePolicy, req: &TablePolicy) -> bool {
    changes(e, req).iter().all(|c| c.stricter)
}

/// Decides what an owner registration `req` does, given the ledger's policy `existing` and
/// whether the ledger holds charges to the table (`charged`).
pub(super) fn reconcile(
    existing: Option<&TablePolicy>,
    req: &TablePolicy,
    charged: bool,
    ledger: &Path,
) -> Result<Decision, AccountingError> {
    let Some(e) = existing else {
        return Ok(Decision::Record);
    };
    let changes = changes(e, req);
    if changes.is_empty() {
        return Ok(Decision::Keep(Box::new(TablePolicy {
            name: req.name.clone(),
            ..e.clone()
        })));
    }
    if changes.iter().all(|c| c.allowed(charged)) {
        return Ok(Decision::Record);
    }
    Err(AccountingError::PolicyConflict(conflict_message(
        e, req, &changes, charged, ledger,
    )))
}

fn conflict_message(
    e: &TablePolicy,
    req: &TablePolicy,
    changes: &[Change],
    charged: bool,
    ledger: &Path,
) -> String {
    let weaker: Vec<String> = changes
        .iter()
        .filter(|c| !c.allowed(charged))
        .map(|c| {
            if c.stricter {
                format!(
                    "{} (a change of the neighbour relation on a table that has charges: their ε \
                     under the new relation is unbounded)",
                    c.what
                )
            } else {
                c.what.clone()
            }
        })
        .collect();
    format!(
        "table '{}' (file {}) is registered in ledger {} with a policy that this registration \
         would weaken or change: {}. dpfusion kept the recorded policy and registered nothing. \
         To keep it, register the table as recorded; to change it, the data owner relaxes it \
         explicitly, with a reason that the ledger records (relax = \"<reason>\" on the table in \
         the catalog, or Registration::relax(\"<reason>\") in the Rust API).",
        req.name,
        e.key,
        ledger.display(),
        weaker.join("; ")
    )
}

/// The text an owner relaxation records: the reason and every change.
pub(super) fn relaxation_note(reason: &str, changes: &[Change]) -> String {
    let what: Vec<&str> = changes.iter().map(|c| c.what.as_str()).collect();
    format!("{reason} [{}]", what.join("; "))
}

/// The earlier relaxation of a key, among its `relaxations`, that recorded the (trimmed)
/// `reason` ([`relaxation_note`]: the reason, then the changes in brackets). A reason approves
/// the change it was written for, not every later one (round 52, review operator F2: a `relax`
/// left in the catalog recorded every later weakening under the old reason, silently).
pub(super) fn reason_recorded<'a>(
    relaxations: &'a [Relaxation],
    reason: &str,
) -> Option<&'a Relaxation> {
    relaxations.iter().find(|r| reason_of(&r.note) == reason)
}

/// How every [`Change`]'s text begins (`changes`, `new_budget`): what tells, in a recorded
/// note, where the owner's reason ends and the bracketed changes begin.
const CHANGE_TEXTS: &[&str] = &[
    "a new budget for table",
    "budget δ",
    "budget ε",
    "default contribution bounds",
    "file format",
    "neighbours",
    "pinned schema",
    "privacy filter",
    "privacy unit",
    "public columns",
    "schema pinned",
    "visibility",
    "δ share",
];

/// The owner's reason of a recorded [`relaxation_note`] (`reason [change; change]`): the text
/// before the first ` [` that opens the changes. A reason may hold brackets itself (`board
/// [minutes 3]`), so the split is where a change's text follows (round 52, review "fixes2a"
/// F4: a reason that was a prefix of an earlier one, up to a bracket, was taken for it).
pub(super) fn reason_of(note: &str) -> &str {
    let Some(body) = note.strip_suffix(']') else {
        return note;
    };
    let mut from = 0;
    while let Some(i) = body[from..].find(" [").map(|i| i + from) {
        let rest = &body[i + 2..];
        if rest.is_empty() || CHANGE_TEXTS.iter().any(|t| rest.starts_with(t)) {
            return &note[..i];
        }
        from = i + 2;
    }
    note
}

/// The refusal of a relaxation whose reason `earlier` already recorded for the key (round 52,
/// review operator F2).
pub(super) fn reason_reused_message(
    req: &TablePolicy,
    reason: &str,
    earlier: &Relaxation,
    changes: &[Change],
    ledger: &Path,
) -> String {
    let what: Vec<&str> = changes.iter().map(|c| c.what.as_str()).collect();
    format!(
        "table '{}' (file {}): the reason '{reason}' was recorded for an earlier change at line \
         {} of ledger {} ({}); write a new reason for this one ([{}]). A reason approves the \
         change it was written for: remove `relax` from the catalog once its change is \
         recorded. dpfusion kept the recorded policy and registered nothing.",
        req.name,
        req.key,
        earlier.line,
        ledger.display(),
        earlier.note,
        what.join("; ")
    )
}

/// The change an owner's registration of a new key makes when the ledger holds the same table
/// name for another private key with charges (round 52, review operator F1): a new budget.
pub(super) fn new_budget(name: &str, others: &[(TablePolicy, String)]) -> Change {
    let from: Vec<String> = others
        .iter()
        .map(|(p, used)| format!("{} ({used})", p.key))
        .collect();
    Change::new(
        format!(
            "a new budget for table '{name}', registered before from {}",
            from.join(", ")
        ),
        false,
    )
}

/// The refusal of a new key registered under the name of another private key with charges,
/// `others` (each with what it used), without the owner's reason (round 52, review operator F1).
pub(super) fn new_budget_message(
    req: &TablePolicy,
    others: &[(TablePolicy, String)],
    ledger: &Path,
) -> String {
    let from: Vec<String> = others
        .iter()
        .map(|(p, used)| format!("{} with charges ({used})", p.key))
        .collect();
    let old = others
        .first()
        .map_or(String::new(), |(p, _)| p.key.to_string());
    format!(
        "table '{}' was registered from {} in ledger {}; a registration from {} would start a \
         new budget: the ledger knows a table by the path of its files, and a new path is a new \
         table with a full budget. If it is the same data moved or copied, register it from \
         {old} (move the files back, or point the table's path there) to keep its budget; to \
         start a new budget deliberately (other data under the same name, or data moved for \
         good), add relax = \"<reason>\" to the table in the catalog (--relax in single-user \
         mode, Registration::relax in the Rust API): the ledger records it (docs/LEDGER.md, \
         \"A table's budget belongs to its path\"). dpfusion registered nothing.",
        req.name,
        from.join(", "),
        ledger.display(),
        req.key,
    )
}

/// A registration's privacy unit whose domain is the table's own name (`req.name`: the default
/// of a registration that states none) takes the domain the ledger recorded, `e`'s (round 52,
/// review operator F6: renaming a unit table changed its default domain, a change of the
/// neighbour relation, and the owner was sent to `relax`). As a budget, filter or δ share not
/// stated takes the recorded one. A domain stated equal to the table's name reads the same as
/// none (docs/CATALOG.md, "Changing a policy"): a shared domain is best named unlike any table.
pub(super) fn keep_recorded_domain(e: &TablePolicy, req: &mut TablePolicy) {
    if let (Some(eu), Some(ru)) = (&e.unit, &mut req.unit)
        && ru.domain == req.name
        && ru.domain != eu.domain
    {
        ru.domain = eu.domain.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::super::PrivacyUnit;
    use super::*;

    /// The shared test policy, with `replace` neighbours.
    fn policy() -> TablePolicy {
        TablePolicy {
            neighbours: Neighbours::Replace,
            ..super::super::tests::private("demo:t", "t", 1.0)
        }
    }

    fn unit(column: &str, domain: &str) -> Option<PrivacyUnit> {
        Some(PrivacyUnit {
            column: column.into(),
            domain: domain.into(),
            max_groups_contributed: 1,
            max_rows_contributed: 1,
        })
    }

    /// Review r45: an automatic Rényi order read back from the ledger may differ from the one
    /// computed again in its last bit; that is the same filter (a real change is still one).
    #[test]
    fn an_order_one_ulp_apart_is_the_same_filter() {
        let mut a = policy();
        a.filter = FilterKind::Rdp {
            order: Some(1.5370317963702527),
        };
        let mut b = a.clone();
        b.filter = FilterKind::Rdp {
            order: Some(f64::from_bits(1.5370317963702527f64.to_bits() + 1)),
        };
        assert!(changes(&a, &b).is_empty(), "{:?}", changes(&a, &b));
        b.filter = FilterKind::Rdp { order: Some(1.6) };
        assert_eq!(changes(&a, &b).len(), 1);
    }

    /// Issue 26, class 7: every change of the neighbour relation voids past charges. Without
    /// charges a stricter one is recorded; with charges it needs the owner's relaxation.
    #[test]
    fn a_relation_change_is_free_only_on_a_table_without_charges() {
        let ledger = Path::new("/nowhere/ledger.jsonl");
        let e = policy();
        let mut add_remove = e.clone();
        add_remove.neighbours = Neighbours::AddRemove;
        let mut with_unit = add_remove.clone();
        with_unit.unit = unit("customer", "people");
        let mut other_column = with_unit.clone();
        other_column.unit = unit("account", "people");
        let mut other_domain = with_unit.clone();
        other_domain.unit = unit("customer", "accounts");
        for (from, to) in [
            (&e, &add_remove),
            (&add_remove, &with_unit),
            (&with_unit, &other_column),
            (&with_unit, &other_domain),
            (&with_unit, &add_remove),
            (&add_remove, &e),
        ] {
            let cs = changes(from, to);
            assert!(cs.iter().any(|c| c.voids_charges), "{cs:?}");
            match reconcile(Some(from), to, true, ledger) {
                Err(AccountingError::PolicyConflict(m)) => {
                    assert!(m.contains("relax"), "{m}");
                }
                other => panic!("a charged table: {:?}", other.map(|_| ())),
            }
        }
        // Without charges: the stricter ones (replace → add_remove, row → unit) are recorded;
        // the weaker ones still need a relaxation.
        for (from, to) in [(&e, &add_remove), (&add_remove, &with_unit)] {
            assert!(matches!(
                reconcile(Some(from), to, false, ledger),
                Ok(Decision::Record)
            ));
        }
        for (from, to) in [
            (&with_unit, &other_column),
            (&with_unit, &add_remove),
            (&add_remove, &e),
        ] {
            assert!(reconcile(Some(from), to, false, ledger).is_err());
        }
        // A charged table may still be made stricter in its budget, and its bounds changed.
        let mut smaller = with_unit.clone();
        smaller.budget.epsilon = 0.5;
        smaller.unit.as_mut().unwrap().max_groups_contributed = 3;
        assert!(matches!(
            reconcile(Some(&with_unit), &smaller, true, ledger),
            Ok(Decision::Record)
        ));
        // Replay keeps the rule the record was written under.
        assert!(no_weaker(&e, &add_remove));
    }
}
