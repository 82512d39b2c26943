//! Joins inside the private region (docs/PRIVACY.md, "Joins").
//!
//! A join may stand between a private scan and a DP aggregate only when it keeps every private
//! row's contribution known:
//!
//! - **A private region joined with a public plan** (a public table, or any query over public
//!   tables only), the private side preserved (`INNER`, `LEFT` with the private side on the left,
//!   `RIGHT` mirrored), on equality keys that are **unique in the public side**. Each private row
//!   then matches at most one public row: the join is a row-wise function of the private row
//!   (1-stable: McSherry, "Privacy Integrated Queries", SIGMOD 2009, §4.2, for a join whose key
//!   has at most one match), and the public columns it adds are a function of the private row's
//!   key. Uniqueness is public information: the session checks it before the query is admitted,
//!   on the public rows it then runs with (it materialises the public side, so a public file that
//!   changes between the check and the run cannot add a second match). A non-unique key is
//!   refused with the duplicate value (public).
//! - **Semi and anti joins** (`WHERE key IN (SELECT … FROM public)`, `EXISTS`, `NOT IN`) with a
//!   public side keep or drop each private row on its own: a filter, whatever the public side's
//!   duplicates.
//!
//! - **A public key set**: the private side `RIGHT JOIN` a public table (or the public table
//!   `LEFT JOIN` the private side) on a key unique in the public side, grouped by columns of the
//!   public side only. Every public row appears once, matched or NULL-extended, so the set of
//!   groups is the public table's: exact, with no partition selection and no δ for it (ZetaSQL's
//!   public groups). Each DP call reads only matched rows (a marker column the private side
//!   carries, NULL on the NULL-extended row), so a group without private rows releases noise
//!   around its empty value. No WHERE may stand above such a join (it could drop whole groups by
//!   private values); filter the private side in a subquery or use a FILTER clause.
//!
//!   On a table with a privacy unit the contribution bounding (units.rs) stands above the join
//!   and keeps at most K groups per unit, dropping the unit's rows of its other groups. A public
//!   row that has matches produces no NULL-extended row, so when every unit that matched it kept
//!   other groups, its group vanished, and whether it did depended on those units (review r48,
//!   units, finding 1). There every public row is therefore joined twice ([`COPY`]): the public
//!   side is `public CROSS JOIN (VALUES (0), (1))`, the private side carries the constant
//!   `0 AS __dpfusion_copy0`, and the pair is one more equality key. Copy 0 joins as above; copy
//!   1 matches nothing, so every public row reaches the bounding at least once NULL-extended,
//!   with a NULL unit, which the bounding keeps (each group once) and no DP call reads. The key
//!   stays unique with the copy; the public side is settled (run, checked, materialised) as the
//!   analyst wrote it, below the cross join. The final audit (checked.rs) refuses a join that
//!   keeps a public side's rows over a unit table without these copies. Tables without a unit
//!   keep the plan above.
//! - **Two private tables of one unit domain** joined on their unit columns ([`unit_join`]). Each
//!   side keeps, of each unit, at most M = K·C of its rows before the join (the statement's
//!   `max_groups_contributed` × `max_rows_contributed`; a join is refused when M > 1,024), a
//!   sample chosen by the bounding's keyed, order-independent row sample under a key of each
//!   side's own ([`units::join_prebound`], round 48): a unit's pairs are at most M², whatever its
//!   rows, so the join's work no longer grows as the square of one unit's rows. The pre-bound is
//!   a function of one unit's own rows (with the key and randomness), so adding or removing a
//!   unit still changes only that unit's rows of the join, and the contribution bounding above
//!   the join (K groups, C rows) and its sensitivities are unchanged. A `dp_sum` over such a join
//!   totals the pairs of each side's sample: of a unit with more than M rows in a table, M of
//!   them. The final audit (checked.rs) requires the pre-bound on both sides.
//!
//! Everything else (other joins of two private tables, a join that can repeat a private row, `FULL`
//! joins, a join without equality keys) stays refused.
//!
//! Under `replace` neighbours a join whose condition reads a private column anywhere (a key of
//! the private side, or the ON condition besides the keys, whatever the join type) makes the
//! join's output private: an inner or semi/anti join drops rows by it, and a LEFT JOIN decides by
//! it which public values each private row carries. Like a WHERE on a private column, it makes
//! the group set and sizes private (so the guard then adds partition selection, and refuses
//! `rgm_mean_by`); a public column of the other side traces to every private column of the
//! condition ([`condition_columns`]). Every key and condition is made total ([`super::total`]),
//! in a join with a public table and in a join of two unit tables alike.
use std::sync::Arc;

use datafusion::common::{Column, JoinType, Result};
use datafusion::logical_expr::{
    Expr, Join, LogicalPlan, LogicalPlanBuilder, Projection, SubqueryAlias, lit,
};

use super::units::{self, JoinSide};
use super::{
    Cx, GuardOptions, Region, TableInfo, any_private_table, base_columns, check_fragment,
    not_in_fragment,
};
use crate::accounting::PrivacyUnit;

/// A public side whose join keys must be unique, checked (and materialised) by the session
/// before admission.
#[derive(Debug, Clone)]
pub struct PublicSide {
    /// The public plan as it stands in the checked plan.
    pub plan: LogicalPlan,
    /// The join keys, over `plan`'s output.
    pub keys: Vec<Expr>,
    /// The private table it is joined with (for messages).
    pub private_table: String,
    /// Whether the join matches a NULL key with a NULL key (`IS NOT DISTINCT FROM`); with `=`
    /// a public row whose key is NULL matches no private row, so it is no duplicate.
    pub nulls_match: bool,
}

/// The private region's join `j` (one side private, the other public), checked, with the
/// private side rewritten by `region` and the public side guarded as a query of its own.
pub(super) fn region_join(
    j: &Join,
    out: &mut Region,
    cx: &mut Cx,
    table: &str,
) -> Result<LogicalPlan> {
    let left_private = any_private_table(&j.left).is_some();
    let right_private = any_private_table(&j.right).is_some();
    let private_left = match (left_private, right_private) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => return unit_join(j, out, cx, table),
        (false, false) => {
            return Err(not_in_fragment("a JOIN that reads no private table", table));
        }
    };
    use JoinType::*;
    let key_set = matches!((j.join_type, private_left), (Right, true) | (Left, false));
    let preserving = match (j.join_type, private_left) {
        (Inner, _) | (Left, true) | (Right, false) => true,
        (LeftSemi | LeftAnti, true) | (RightSemi | RightAnti, false) => false,
        _ if key_set => true,
        (jt, _) => {
            return Err(not_in_fragment(
                &format!(
                    "a {} JOIN that can add rows with no private row or repeat one (only INNER, \
                     LEFT/RIGHT keeping the private side, a RIGHT JOIN onto a public key table \
                     grouped by its columns, and semi/anti joins with a public table are \
                     allowed)",
                    jt.to_string().to_uppercase()
                ),
                table,
            ));
        }
    };
    if j.on.is_empty() {
        return Err(not_in_fragment(
            "a JOIN without equality keys (a cross join repeats every private row)",
            table,
        ));
    }
    let (private, public) = if private_left {
        (&j.left, &j.right)
    } else {
        (&j.right, &j.left)
    };
    for (l, r) in &j.on {
        check_fragment(l, j.left.schema(), "the JOIN keys", table)?;
        check_fragment(r, j.right.schema(), "the JOIN keys", table)?;
    }
    if let Some(f) = &j.filter {
        check_fragment(f, &j.schema, "the JOIN condition", table)?;
    }
    let private_plan = super::region(private, out, cx, table)?;
    if out.key_set {
        // Only projections may stand above a public key set: any join there could drop whole
        // groups (even NULL-extended ones) by private values, without partition selection.
        return Err(key_set_not_on_top(table));
    }
    // The public side is a query of its own: guarded as one (it reads no private table).
    let public_plan = super::visit(public.as_ref().clone(), cx)?;
    let public_keys: Vec<&Expr> =
        j.on.iter()
            .map(|(l, r)| if private_left { r } else { l })
            .collect();
    if key_set && j.filter.is_some() {
        return Err(not_in_fragment(
            "a join condition besides the equality keys in a RIGHT JOIN onto a public key table",
            table,
        ));
    }
    // A private column anywhere in the join's condition (the private side's equality keys, or
    // the ON condition besides them, on either side) makes the join's output private: an inner
    // or semi/anti join drops rows by it, and even a LEFT JOIN keeping every private row decides
    // by it which public values each row carries (hence the groups and their sizes when grouped
    // by them). Under `replace` neighbours the guard then adds partition selection and no longer
    // treats group sizes as public (issue 26, class 3).
    let condition_public = out.table.as_ref().is_some_and(|info| {
        condition_columns(j, private_left)
            .is_some_and(|cols| cols.iter().all(|c| info.is_public_column(c)))
    });
    if !condition_public {
        out.private_filter = true;
    }
    if preserving {
        // The analyst's public plan and keys: settled (run, keys checked unique, materialised)
        // as written, also where the key set below pairs each of its rows with two copies (the
        // node is replaced inside the cross join; the key plus the copy is then unique too).
        cx.public_sides.push(PublicSide {
            plan: public_plan.clone(),
            keys: public_keys.into_iter().cloned().collect(),
            private_table: table.to_string(),
            nulls_match: j.null_equality == datafusion::common::NullEquality::NullEqualsNull,
        });
    }
    // A public key set on a table with a privacy unit keeps every public row through the
    // contribution bounding (round 48): see [`COPY`].
    let copies = key_set && out.table.as_ref().is_some_and(|t| t.unit.is_some());
    // A public key set: the private side carries a marker, NULL on the NULL-extended rows (and on
    // a unit table the copy it matches, always 0).
    let private_plan = if key_set {
        out.key_set = true;
        let mut exprs: Vec<Expr> = private_plan
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        exprs.push(lit(true).alias(MATCHED));
        if copies {
            exprs.push(lit(0i64).alias(COPY_ZERO));
        }
        LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(private_plan))?)
    } else {
        private_plan
    };
    let public_plan = if copies {
        LogicalPlanBuilder::from(public_plan)
            .cross_join(copies_plan()?)?
            .build()?
    } else {
        public_plan
    };
    let (left, right) = if private_left {
        (private_plan, public_plan)
    } else {
        (public_plan, private_plan)
    };
    let filter = match &j.filter {
        Some(f) => Some(super::total::wrap(f.clone(), &j.schema)?),
        None => None,
    };
    let mut on = total_keys(j)?;
    if copies {
        let (private_key, public_key) = (
            Expr::Column(Column::new_unqualified(COPY_ZERO)),
            Expr::Column(Column::new_unqualified(COPY)),
        );
        on.push(if private_left {
            (private_key, public_key)
        } else {
            (public_key, private_key)
        });
    }
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(left),
        Arc::new(right),
        on,
        filter,
        j.join_type,
        j.join_constraint,
        j.null_equality,
        j.null_aware,
    )?))
}

/// The base columns of the private side that the condition of `j` (one side private, the
/// other public) reads: its keys on the private side, and the private side's columns in its
/// ON condition besides the keys (the public side's columns there are public, and a function of
/// the private side's keys). None when a column cannot be traced (treated as private).
pub(super) fn condition_columns(
    j: &Join,
    private_left: bool,
) -> Option<std::collections::BTreeSet<String>> {
    let private = if private_left { &j.left } else { &j.right };
    let mut out = std::collections::BTreeSet::new();
    for (l, r) in &j.on {
        let k = if private_left { l } else { r };
        out.extend(base_columns(k, private)?);
    }
    if let Some(f) = &j.filter {
        for c in f.column_refs() {
            if private.schema().has_column(c) {
                out.extend(super::trace_column(c, private)?);
            } else if !j.schema.has_column(c) {
                return None;
            }
        }
    }
    Some(out)
}

/// Two private tables joined on their privacy unit columns: both declare a unit of the same
/// domain (the same people), the join is INNER, and its equality keys pair the two unit columns
/// as bare columns. Every row of the join belongs to one unit (the one both rows share), so the
/// contribution bounding that follows (units.rs: at most K groups per unit, C rows per group) is
/// applied after the join and bounds a unit's contribution whatever its number of rows in
/// either table: adding or removing a unit from the domain changes only its own rows of the
/// join. Each call is charged to both tables.
///
/// Each side is also bounded per unit before the join ([`units::join_prebound`], round 48): at
/// most M = K·C of a unit's rows (K and C in force for the statement, [`join_rows`]; refused when
/// M > 1,024), a keyed random sample under a key of each side's own, so one unit's pairs are at
/// most M² whatever its rows (until round 48 a unit with n rows in each table made n² pairs
/// before anything was capped: the time, and over the server success or `DeadlineExceeded`,
/// depended on one unit). The sample is a function of that unit's own rows, so the argument
/// above is unchanged.
fn unit_join(j: &Join, out: &mut Region, cx: &mut Cx, table: &str) -> Result<LogicalPlan> {
    let refuse_with = |why: String| {
        not_in_fragment(
            &format!(
                "a JOIN of two private tables ({why}; two private tables may be joined only on \
                 their privacy unit columns, with an INNER JOIN, when the data owner declared \
                 the same unit domain for both)"
            ),
            table,
        )
    };
    if j.join_type != JoinType::Inner {
        let jt = j.join_type.to_string().to_uppercase();
        return Err(refuse_with(format!("a {jt} JOIN")));
    }
    if j.null_equality == datafusion::common::NullEquality::NullEqualsNull {
        // IS NOT DISTINCT FROM pairs every NULL-unit row of one table with every one of the
        // other: rows that reach no DP call, but whose number (a product of two private counts)
        // would set the work and the time (review r45).
        return Err(refuse_with(
            "keys compared with IS NOT DISTINCT FROM, which matches NULL with NULL; use =".into(),
        ));
    }
    let mut left = Region::default();
    let left_plan = super::region(&j.left, &mut left, cx, table)?;
    let mut right = Region::default();
    let right_plan = super::region(&j.right, &mut right, cx, table)?;
    if left.key_set || right.key_set {
        return Err(key_set_not_on_top(table));
    }
    // A side that already joins two private tables: a chain (the final audit refuses it too;
    // refused here, at planning, before its sides are bounded; round 48).
    if !left.also.is_empty() || !right.also.is_empty() {
        return Err(super::refuse(PRIVATE_JOIN_CHAIN));
    }
    let (Some(lt), Some(rt)) = (left.table.clone(), right.table.clone()) else {
        return Err(refuse_with("a side could not be traced".into()));
    };
    let (Some(lu), Some(ru)) = (&lt.unit, &rt.unit) else {
        return Err(refuse_with(format!(
            "'{}' or '{}' declares no privacy unit",
            lt.name, rt.name
        )));
    };
    if lu.domain != ru.domain {
        return Err(refuse_with(format!(
            "'{}' has unit domain '{}' and '{}' has '{}'",
            lt.name, lu.domain, rt.name, ru.domain
        )));
    }
    let Some((left_unit, right_unit)) = unit_keys(j, &lu.column, &ru.column) else {
        return Err(refuse_with(format!(
            "the keys do not pair '{}.{}' with '{}.{}' as they are (no cast, one type: a \
             unit is compared as the identifier it is, so the data owner declares the unit \
             columns of one domain with one type)",
            lt.name, lu.column, rt.name, ru.column
        )));
    };
    // Each side bounded per unit before the join (round 48, review "resources", finding 1): at
    // most M = K·C rows of each unit, so at most M² pairs of a unit reach the bounding.
    let rows = join_rows(&lt, &rt, lu, &cx.opts)?;
    for (l, r) in &j.on {
        check_fragment(l, j.left.schema(), "the JOIN keys", table)?;
        check_fragment(r, j.right.schema(), "the JOIN keys", table)?;
    }
    if let Some(f) = &j.filter {
        check_fragment(f, &j.schema, "the JOIN condition", table)?;
    }
    // The other tables, each once and never the region's own (round 49, review
    // "composition", F1): a table joined with itself on its unit (or one file under two names,
    // one ledger key) spends its budget once, as one table does: every joined row belongs to
    // one unit, and the pre-bound and the bounding cap that unit's pairs as they cap its rows.
    for t in std::iter::once(rt).chain(left.also).chain(right.also) {
        if t.key != lt.key && !out.also.iter().any(|o| o.key == t.key) {
            out.also.push(t);
        }
    }
    out.table = Some(lt);
    out.private_filter = true;
    let filter = match &j.filter {
        Some(f) => Some(super::total::wrap(f.clone(), &j.schema)?),
        None => None,
    };
    // The keys made total too: a key that fails on one row must not fail the query (issue 26,
    // class 4); a NULL key matches nothing.
    let on = total_keys(j)?;
    let key = units::query_key(cx.opts.insecure_seed);
    let left_plan = units::join_prebound(left_plan, &left_unit, rows, key, JoinSide::Left)?;
    let right_plan = units::join_prebound(right_plan, &right_unit, rows, key, JoinSide::Right)?;
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(left_plan),
        Arc::new(right_plan),
        on,
        filter,
        j.join_type,
        j.join_constraint,
        j.null_equality,
        j.null_aware,
    )?))
}

/// M, the rows of each unit each side of a unit join keeps ([`units::join_prebound`]): K·C of
/// the bounds in force for the statement (those of the left table `lt`, whose unit `lu` the
/// contribution bounding above the join reads, or the session's), refused past
/// [`units::MAX_JOIN_ROWS`] (round 48).
fn join_rows(lt: &TableInfo, rt: &TableInfo, lu: &PrivacyUnit, opts: &GuardOptions) -> Result<u64> {
    let (k, c) = units::bounds_in_force(lu, opts);
    let rows = u64::from(k) * u64::from(c);
    if rows <= units::MAX_JOIN_ROWS {
        return Ok(rows);
    }
    let most = units::MAX_JOIN_ROWS;
    let k_fit = u64::from(k).min(most);
    Err(super::refuse(format!(
        "a JOIN of private tables '{}' and '{}' on their privacy unit keeps, before the join, at \
         most max_groups_contributed × max_rows_contributed rows of each unit from each table \
         (so that one unit's pairs stay bounded whatever its number of rows), and that product \
         may be at most {most}; the bounds in force are max_groups_contributed = {k} and \
         max_rows_contributed = {c}, {rows} rows. Set smaller bounds for this query, e.g. SET \
         dpfusion.max_groups_contributed = {k_fit} and SET dpfusion.max_rows_contributed = {} \
         (each may be set from 1 to 1,000,000, their product at most {most} for such a join), \
         or ask the data owner to lower the bounds of table '{}'.",
        lt.name,
        rt.name,
        (most / k_fit).max(1),
        lt.name
    )))
}

/// Does one of `j`'s equality keys pair the unit column `left` of its left side with `right` of
/// its right side, both as they are (no cast anywhere: [`super::exact_column`]) and of one type?
/// Shared by the guard's unit join and the final audit.
pub(super) fn pairs_units(j: &Join, left: &str, right: &str) -> bool {
    unit_keys(j, left, right).is_some()
}

/// The key columns of [`pairs_units`]'s pair (the first), over the left and the right side. A
/// side bounded per unit before the join ([`units::join_prebound`], in the plan the audit reads)
/// is seen through to the unit below it.
fn unit_keys(j: &Join, left: &str, right: &str) -> Option<(Column, Column)> {
    use datafusion::logical_expr::ExprSchemable;
    // The base column a key is, through a side's pre-bound if it has one.
    let exact = |c: &Column, side: &LogicalPlan| match units::through_join_prebound(c, side) {
        Some((unit, below)) => super::exact_column(unit, below),
        None => super::exact_column(&Expr::Column(c.clone()), side),
    };
    j.on.iter().find_map(|(l, r)| {
        // The guard's total wrappers, if any, seen through (a wrapped key is computed).
        let plain = |e: &Expr| super::total::unwrap(e.clone()).unwrap_or_else(|_| e.clone());
        let (l, r) = (plain(l), plain(r));
        // (Aliases seen through, as exact_column does.)
        fn column(e: &Expr) -> Option<&Column> {
            match e {
                Expr::Column(c) => Some(c),
                Expr::Alias(a) => column(&a.expr),
                _ => None,
            }
        }
        let (lc, rc) = (column(&l)?, column(&r)?);
        (exact(lc, &j.left).as_deref() == Some(left)
            && exact(rc, &j.right).as_deref() == Some(right)
            && matches!(
                (l.get_type(j.left.schema()), r.get_type(j.right.schema())),
                (Ok(a), Ok(b)) if a == b
            ))
        .then(|| (lc.clone(), rc.clone()))
    })
}

/// The equality keys of `j`, each made total over its side's schema.
fn total_keys(j: &Join) -> Result<Vec<(Expr, Expr)>> {
    j.on.iter()
        .map(|(l, r)| {
            Ok((
                super::total::wrap(l.clone(), j.left.schema())?,
                super::total::wrap(r.clone(), j.right.schema())?,
            ))
        })
        .collect()
}

/// The refusal of a second join of private tables in one private region (the guard's and the
/// final audit's).
pub(super) const PRIVATE_JOIN_CHAIN: &str = "more than one join of private tables in one private \
     region (each multiplies a unit's rows, so the work would grow as a power of a private \
     count); join two tables, aggregate, then combine the releases";

/// The refusal of anything but projections above a public key set.
fn key_set_not_on_top(table: &str) -> datafusion::common::DataFusionError {
    not_in_fragment(
        "a JOIN above a RIGHT JOIN onto a public key table (only projections may stand between \
         a public key set and the DP aggregate: a join there could drop whole groups by private \
         values)",
        table,
    )
}

/// The marker column of a public key set's private side (NULL on the NULL-extended rows).
const MATCHED: &str = "__dpfusion_matched";

/// The column of a public row's copy in a public key set on a table with a privacy unit (module
/// docs; round 48): copy 0 joins as any key set does, copy 1 matches no private row (each
/// private row's [`COPY_ZERO`] is 0), so every public row reaches the contribution bounding at least once
/// NULL-extended, with a NULL unit, and its group cannot vanish there.
pub(super) const COPY: &str = "__dpfusion_copy";

/// The private side's copy in a key set on a unit table: always 0 ([`COPY`]).
pub(super) const COPY_ZERO: &str = "__dpfusion_copy0";

/// The two copies of every public row of a key set on a unit table ([`COPY`]): `VALUES (0), (1)`
/// as the column `__dpfusion_copy`. The final audit requires exactly this plan there.
pub(super) fn copies_plan() -> Result<LogicalPlan> {
    LogicalPlanBuilder::values(vec![vec![lit(0i64)], vec![lit(1i64)]])?
        .project(vec![
            Expr::Column(Column::new_unqualified("column1")).alias(COPY),
        ])?
        .build()
}

/// Is `c`, a column of `plan`'s output, a column of the public side of the key-set join below
/// (traced through projections of bare columns and aliases)?
pub(super) fn from_public_key_set(c: &Column, plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => match p.schema.index_of_column(c) {
            Ok(i) => match &p.expr[i] {
                Expr::Column(inner) => from_public_key_set(inner, &p.input),
                Expr::Alias(a) => match a.expr.as_ref() {
                    Expr::Column(inner) => from_public_key_set(inner, &p.input),
                    _ => false,
                },
                _ => false,
            },
            Err(_) => false,
        },
        LogicalPlan::SubqueryAlias(s) => match s.schema.index_of_column(c) {
            Ok(i) => {
                let (q, f) = s.input.schema().qualified_field(i);
                from_public_key_set(&Column::new(q.cloned(), f.name()), &s.input)
            }
            Err(_) => false,
        },
        LogicalPlan::Join(j) => {
            let public = if private_is_left(j) {
                &j.right
            } else {
                &j.left
            };
            public.schema().has_column(c)
        }
        _ => false,
    }
}

/// `plan` (a checked region whose key-set join stands below projections and aliases only) with
/// the match marker carried up to its output, and the expression that reads it there.
pub(super) fn carry_marker(plan: &LogicalPlan, table: &str) -> Result<(LogicalPlan, Expr)> {
    match plan {
        LogicalPlan::Join(j) if j.schema.has_column_with_unqualified_name(MATCHED) => {
            Ok((plan.clone(), Expr::Column(Column::new_unqualified(MATCHED))))
        }
        LogicalPlan::Projection(p) => {
            let (input, m) = carry_marker(&p.input, table)?;
            let mut exprs = p.expr.clone();
            exprs.push(match &m {
                Expr::Column(c) if c.name == MATCHED && c.relation.is_none() => m.clone(),
                m => m.clone().alias(MATCHED),
            });
            let new = Projection::try_new(exprs, Arc::new(input))?;
            Ok((
                LogicalPlan::Projection(new),
                Expr::Column(Column::new_unqualified(MATCHED)),
            ))
        }
        LogicalPlan::SubqueryAlias(s) => {
            let (input, _) = carry_marker(&s.input, table)?;
            let new = SubqueryAlias::try_new(Arc::new(input), s.alias.clone())?;
            let m = Expr::Column(Column::new(Some(new.alias.clone()), MATCHED));
            Ok((LogicalPlan::SubqueryAlias(new), m))
        }
        _ => Err(not_in_fragment(
            "an operation between a RIGHT JOIN onto a public key table and the DP aggregate \
             (only projections may stand there: a WHERE could drop whole groups by private \
             values; filter the private side in a subquery, or use a FILTER clause)",
            table,
        )),
    }
}

/// Which side of `j` is private (true: the left).
pub(super) fn private_is_left(j: &Join) -> bool {
    any_private_table(&j.left).is_some()
}
