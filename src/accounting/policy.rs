//! The policy store's rule (PRIVACY.md, "Who is the adversary"): a session may register a table
//! for the first time, or make a known table stricter; it may never weaken a private table. Its
//! privacy filter (kind, and order for `rdp`) can never be changed by a session, nor its share of
//! δ for partition selection raised; a smaller share keeps the ledger's, like a smaller budget.
use std::path::Path;

use super::{AccountingError, FilterKind, Neighbours, TablePolicy, Visibility};

pub(super) enum Decision {
    /// The ledger's policy stays in force (returned with the session's name for the table).
    Keep(TablePolicy),
    /// The requested policy is new or stricter: write it to the ledger.
    Record,
}

/// Decides what a session's registration `req` does, given the ledger's policy `existing`.
pub(super) fn reconcile(
    existing: Option<&TablePolicy>,
    req: &TablePolicy,
    ledger: &Path,
) -> Result<Decision, AccountingError> {
    let Some(e) = existing else {
        return Ok(Decision::Record);
    };
    let keep = || {
        Ok(Decision::Keep(TablePolicy {
            name: req.name.clone(),
            ..e.clone()
        }))
    };
    match (e.visibility, req.visibility) {
        (Visibility::Public, Visibility::Private) => return Ok(Decision::Record),
        (Visibility::Public, Visibility::Public) => return keep(),
        (Visibility::Private, _) => {}
    }
    let conflict = |what: String| {
        Err(AccountingError::PolicyConflict(format!(
            "table file {} is registered private in ledger {}; {what}. The data owner can \
             change it with an owner action.",
            e.key,
            ledger.display()
        )))
    };
    if req.visibility == Visibility::Public {
        return conflict("it cannot be re-registered as public".to_string());
    }
    let (eb, rb) = (e.budget, req.budget);
    if rb.epsilon > eb.epsilon || rb.delta > eb.delta {
        return conflict(format!(
            "its budget is ε = {:.4}, δ = {:e} and a session cannot raise it to ε = {:.4}, \
             δ = {:e}",
            eb.epsilon, eb.delta, rb.epsilon, rb.delta
        ));
    }
    // The filter is fixed when the table is first registered: choosing it per session would
    // let the analyst switch rules adaptively, which no filter theorem covers.
    let order_differs = matches!(
        (e.filter, req.filter),
        (FilterKind::Rdp { order: Some(x) }, FilterKind::Rdp { order: Some(y) }) if x != y
    );
    if !e.filter.same_kind(&req.filter) || order_differs {
        return conflict(format!(
            "its privacy filter is {} and a session cannot change it to {}",
            e.filter, req.filter
        ));
    }
    if req.delta_share > e.delta_share {
        return conflict(format!(
            "its share of δ reserved for partition selection is {} and a session cannot raise it \
             to {}",
            e.delta_share, req.delta_share
        ));
    }
    if e.neighbours == Neighbours::AddRemove && req.neighbours == Neighbours::Replace {
        return conflict(format!(
            "its neighbour relation is {} and a session cannot weaken it to {}",
            e.neighbours, req.neighbours
        ));
    }
    let added: Vec<&str> = req
        .public_columns
        .iter()
        .filter(|c| !e.public_columns.iter().any(|x| x.eq_ignore_ascii_case(c)))
        .map(String::as_str)
        .collect();
    if !added.is_empty() {
        return conflict(format!(
            "its public columns are [{}] and a session cannot declare more ({}) public",
            e.public_columns.join(", "),
            added.join(", ")
        ));
    }
    keep()
}
