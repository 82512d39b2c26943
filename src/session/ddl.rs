//! What analyst SQL may change in a session, and what it may not: `CREATE TABLE … AS` (a DP
//! result, public), `CREATE EXTERNAL TABLE` (a public table of files the data owner allows),
//! `DROP`, and the `SET` of the session's settings. Views, DML, other DDL and other statements
//! (transactions included: a charge is final once admitted, so there is nothing to roll back)
//! are refused with a typed [`crate::Error::Refused`]. No analyst statement replaces, shadows or
//! drops a table of the data owner.
//!
//! An analyst's table is named by one bare, lower-case name, as the owner's are (round 50): a
//! qualified name (`x.r`) or a quoted one that is not lower case (`"R4"`) is refused, so that the
//! name a statement writes is the table it acts on. `CREATE [EXTERNAL] TABLE` over an existing
//! table does what SQL says (round 50): `IF NOT EXISTS` does nothing and runs (and charges)
//! nothing, `OR REPLACE` replaces it, and without either it is refused. A `CREATE TABLE … AS`'s
//! result table is checked on the checked plan's schema before admission (every column typed,
//! names distinct), so a table that could not be installed or read is refused with nothing
//! charged (round 50). `DROP TABLE` forgets a table only when DataFusion dropped it.
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::{DataFusionError, Result, TableReference, internal_err};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, TransactionConclusion};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;

use super::{PrivateSession, QueryResult, Registration};
use crate::accounting::{PrivacyUnit, TableKey};
use crate::error::refused;
use crate::guard;
use crate::statements;

/// The refusal of `ROLLBACK` (SQL, and the Flight SQL action of `dpfusion serve`): nothing can
/// be undone. Every statement takes effect on its own, a query's charge is durable in the ledger
/// before any row is read and is never refunded, and analyst SQL writes no table of the owner's:
/// a rollback that answered OK would claim an undo that did not happen.
pub const ROLLBACK_REFUSED: &str = "dpfusion refused ROLLBACK: nothing can be undone. A query's \
charge is final once it is admitted (written to the ledger before any row is read, never \
refunded), and every statement takes effect on its own, so the statements before this ROLLBACK \
stand, charges included (SHOW BUDGET shows them). Run statements without a transaction; to stop \
spending, stop sending queries.";

/// The session's settings analyst SQL may `SET` (each to a value, or `DEFAULT`).
const SETTINGS: [&str; 3] = [
    "dpfusion.default_delta",
    "dpfusion.max_groups_contributed",
    "dpfusion.max_rows_contributed",
];

/// The one refusal of a `SET` of anything but [`SETTINGS`], whatever its form (`SET TIME ZONE`,
/// `SET ROLE`, `SET a = 1, b = 2`, `SET datafusion.…`): `what` names what the statement sets.
fn set_refused(what: &str) -> DataFusionError {
    crate::error::Error::refused(format!(
        "dpfusion refused the query: SET {what} is not allowed; the settings are \
         dpfusion.default_delta, dpfusion.max_groups_contributed and \
         dpfusion.max_rows_contributed, each written SET name = value or SET name = DEFAULT (the \
         session's own). Over dpfusion serve no SET is available."
    ))
}

/// The refusal of `RESET`: `SET name = DEFAULT` does it for the settings analyst SQL may change.
pub(super) const RESET_REFUSED: &str = "dpfusion refused the query: RESET is not allowed; set a \
setting back to the session's own with SET dpfusion.default_delta = DEFAULT (or \
dpfusion.max_groups_contributed, dpfusion.max_rows_contributed).";

/// Refuses, before DataFusion plans it, a `SET` that its planner cannot plan (`SET TIME ZONE …`,
/// `SET ROLE …`, `SET SESSION x = …`, `SET x = 1 + 1`: it answered with a Rust debug dump of the
/// statement): the one `SET` refusal, or for one of [`SETTINGS`] how to write it (round 50,
/// review "settings"). What passes is `SET name = value` with one literal, a name or a signed
/// value, which DataFusion plans into the `SetVariable` that [`PrivateSession::statement`]
/// checks (and the server refuses by its kind).
pub(super) fn check_set_statement(stmt: &DFStatement) -> Result<()> {
    use ast::{Expr, Set, UnaryOperator, Value};
    let set = match stmt {
        DFStatement::Statement(s) => match s.as_ref() {
            ast::Statement::Set(set) => set,
            _ => return Ok(()),
        },
        DFStatement::Explain(e) => return check_set_statement(&e.statement),
        _ => return Ok(()),
    };
    let names = |names: &[&ast::ObjectName]| {
        names
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match set {
        Set::SingleAssignment {
            scope,
            hivevar,
            variable,
            values,
        } => {
            let plain = match values.as_slice() {
                [Expr::Identifier(_)] => true,
                [Expr::Value(v)] => matches!(
                    v.value,
                    Value::Number(..) | Value::SingleQuotedString(_) | Value::Boolean(_)
                ),
                [Expr::UnaryOp { op, .. }] => {
                    matches!(op, UnaryOperator::Plus | UnaryOperator::Minus)
                }
                _ => false,
            };
            if scope.is_none() && !*hivevar && plain {
                return Ok(());
            }
            let var = variable.to_string().to_ascii_lowercase();
            if !SETTINGS.contains(&var.as_str()) {
                return Err(set_refused(&variable.to_string()));
            }
            refused!(
                "dpfusion refused the query: {set}: write SET {var} = value, with one number \
                 literal (or DEFAULT, the session's own) and no SESSION, LOCAL or HIVEVAR"
            )
        }
        Set::ParenthesizedAssignments { variables, .. } => {
            Err(set_refused(&names(&variables.iter().collect::<Vec<_>>())))
        }
        Set::MultipleAssignments { assignments } => Err(set_refused(&names(
            &assignments.iter().map(|a| &a.name).collect::<Vec<_>>(),
        ))),
        Set::SetSessionAuthorization(_) => Err(set_refused("SESSION AUTHORIZATION")),
        Set::SetSessionParam(_) => Err(set_refused(
            set.to_string().trim_start_matches("SET ").trim_start(),
        )),
        Set::SetRole { .. } => Err(set_refused("ROLE")),
        Set::SetTimeZone { .. } => Err(set_refused("TIME ZONE")),
        Set::SetNames { .. } | Set::SetNamesDefault {} => Err(set_refused("NAMES")),
        Set::SetTransaction { .. } => Err(set_refused("TRANSACTION")),
    }
}

/// The columns of type `Null` of a `CREATE TABLE … AS` result, and its column names that are
/// not distinct, checked on the checked plan's schema before admission (round 50, review
/// "settings" F1: the table was charged, then refused with the owner's registration message
/// about files, or installed with two columns `job` that no later query could read). Worded
/// for the statement, with nothing charged.
fn check_result_table(name: &str, schema: &Schema) -> Result<()> {
    let untyped = super::register::untyped_columns(schema);
    if let Some(first) = untyped.first() {
        return refused!(
            "dpfusion refused the statement: CREATE TABLE {name} AS …: column(s) '{}' have no \
             type (a NULL the query gives no type to), and a table's columns need one; give \
             column {first} a type: CAST(NULL AS DOUBLE) AS {first} (or the type it holds). \
             Nothing was charged.",
            untyped.join("', '")
        );
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .find(|n| !seen.insert(*n))
    {
        return refused!(
            "dpfusion refused the statement: CREATE TABLE {name} AS …: the query gives two \
             columns the name '{twice}' (a table's columns need distinct names, without the \
             tables they came from); name the columns apart: … AS {twice}2. Nothing was \
             charged."
        );
    }
    Ok(())
}

/// The schema of a table made from a query's result: the query's, widened where its batches
/// differ (the physical plan may type a column more loosely than the logical one, e.g. a CASE
/// under an ORDER BY read as nullable; the fuzzer found `CREATE TABLE … AS … ORDER BY k` failing
/// with "Mismatch between schema and batches" after its charge). Each column keeps the batches'
/// type and metadata, and is nullable if either says so.
fn table_schema(
    logical: &datafusion::arrow::datatypes::SchemaRef,
    batches: &[datafusion::arrow::array::RecordBatch],
) -> datafusion::arrow::datatypes::SchemaRef {
    let mut schema = Arc::clone(logical);
    for b in batches {
        let bs = b.schema();
        if schema.contains(&bs) || bs.fields().len() != schema.fields().len() {
            continue;
        }
        let fields: Vec<_> = bs
            .fields()
            .iter()
            .zip(schema.fields())
            .map(|(b, s)| {
                b.as_ref()
                    .clone()
                    .with_nullable(b.is_nullable() || s.is_nullable())
            })
            .collect();
        schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    }
    schema
}

impl PrivateSession {
    pub(super) async fn create_table_as(
        &self,
        sql: &str,
        state: &SessionState,
        name: &str,
        input: &LogicalPlan,
    ) -> Result<QueryResult> {
        let checked = guard::check(state, input, self.guard_options()).await?;
        // The table's own checks, on the schema the release will have, before the charge.
        check_result_table(name, &checked.schema())?;
        let result = self.execute_guarded(sql, state, checked).await?;
        let receipt = result.receipt;
        let schema = table_schema(&result.schema, &result.batches);
        let provider = Arc::new(MemTable::try_new(schema, vec![result.batches])?);
        // The result of a DP query is public (post-processing).
        self.install(
            name,
            provider,
            TableKey::from(format!("result:{}", name.to_ascii_lowercase())),
            Registration::public(),
            None,
            None,
        )?;
        // A replaced table of files (OR REPLACE over a CREATE EXTERNAL TABLE) reads none now.
        self.fs.retain_table(name, &[]);
        let mut r = QueryResult::empty();
        r.receipt = receipt;
        r.tables = result.tables;
        Ok(r)
    }

    /// Runs an analyst's DDL, DML or other statement (`SET`, transactions, `PREPARE` …): what
    /// is allowed runs, the rest is refused where it is decided.
    pub(super) async fn run_ddl(
        &self,
        sql: &str,
        state: &SessionState,
        plan: LogicalPlan,
    ) -> Result<QueryResult> {
        match &plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) => {
                let name = self.analyst_table(&c.name, "CREATE TABLE")?;
                // What SQL says, before anything is planned or charged (round 50, review
                // "settings" F2: IF NOT EXISTS ran and charged the query again, and a plain
                // CREATE TABLE replaced the table).
                if !self.may_create(&name, "CREATE TABLE", c.if_not_exists, c.or_replace)? {
                    return Ok(QueryResult::empty());
                }
                self.create_table_as(sql, state, &name, &c.input).await
            }
            LogicalPlan::Ddl(DdlStatement::CreateView(v)) => refused!(
                "dpfusion refused the query: CREATE VIEW '{}' is not supported: a view would \
                 stand between the guard and the tables it reads. Write the query with a CTE \
                 (WITH name AS (...) SELECT ...) instead.",
                v.name
            ),
            LogicalPlan::Ddl(DdlStatement::DropTable(d)) => {
                // A bare name, and the session forgets the table (and its files' pins) only
                // when DataFusion dropped it (round 50, review "settings" F3: `DROP TABLE IF
                // EXISTS nosuch.r` dropped nothing, and `r` left SHOW TABLES, the COPY check
                // and the pins while queries still read it).
                let name = self.analyst_table(&d.name, "DROP TABLE")?;
                let existed = self.table_exists(&name)?;
                self.ctx.execute_logical_plan(plan).await?;
                if existed && !self.table_exists(&name)? {
                    self.tables.lock().expect("lock").remove(&name);
                    self.fs.retain_table(&name, &[]);
                }
                Ok(QueryResult::empty())
            }
            LogicalPlan::Ddl(DdlStatement::DropView(_)) => {
                self.ctx.execute_logical_plan(plan).await?;
                Ok(QueryResult::empty())
            }
            LogicalPlan::Ddl(other) => refused!(
                "dpfusion refused the query: {} is not allowed; analyst SQL may CREATE TABLE \
                 name AS SELECT …, CREATE EXTERNAL TABLE over files the data owner lets analysts \
                 read (public, no 'dp.*' options: policy is the owner's), and DROP TABLE",
                other.name()
            ),
            LogicalPlan::Dml(d) => refused!(
                "dpfusion refused the query: {} into '{}' is not allowed: dpfusion tables are \
                 read-only (writing rows could change a private table's contents under its \
                 budget). Use CREATE TABLE name AS SELECT <DP query> to keep DP results.",
                d.op,
                d.table_name
            ),
            LogicalPlan::Statement(s) => self.statement(s),
            other => internal_err!("run_ddl got a {} plan", other.display()),
        }
    }

    pub(super) fn statement(&self, s: &datafusion::logical_expr::Statement) -> Result<QueryResult> {
        use datafusion::logical_expr::Statement as S;
        if let S::SetVariable(v) = s {
            return self.set(&v.variable, &v.value);
        }
        match s {
            S::TransactionEnd(e) if e.conclusion == TransactionConclusion::Rollback => {
                refused!("{ROLLBACK_REFUSED}")
            }
            S::TransactionStart(_) | S::TransactionEnd(_) => refused!(
                "dpfusion refused the statement: {}: dpfusion has no transactions. Each statement \
                 takes effect on its own, and a query's charge is final once it is admitted, so \
                 there is nothing to commit or roll back; run the statement without START \
                 TRANSACTION or COMMIT.",
                if matches!(s, S::TransactionStart(_)) {
                    "START TRANSACTION"
                } else {
                    "COMMIT"
                }
            ),
            _ => refused!("dpfusion refused the query: {} is not allowed", s.name()),
        }
    }

    /// `SET name = value` of one of [`SETTINGS`] (DataFusion planned it: the name in lower
    /// case, the value as text); `DEFAULT` is the session's own value: the one it opened with
    /// for `dpfusion.default_delta` (round 50: it was refused), the tables' own bounds for the
    /// bounds.
    fn set(&self, variable: &str, value: &str) -> Result<QueryResult> {
        let var = variable.to_ascii_lowercase();
        let value = value.trim().trim_matches('\'');
        let default = value.eq_ignore_ascii_case("default");
        if var == "dpfusion.max_groups_contributed" || var == "dpfusion.max_rows_contributed" {
            let bound = if default {
                None
            } else {
                let n: u64 = value.parse().map_err(|_| {
                    DataFusionError::Plan(format!(
                        "{var} must be an integer from 1 to {} (or DEFAULT for the tables' \
                         own), got {value}",
                        PrivacyUnit::MAX_BOUND,
                    ))
                })?;
                Some(PrivacyUnit::check_bound(&var, n).map_err(DataFusionError::Plan)?)
            };
            let mut b = self.bounds.write().expect("lock");
            if var == "dpfusion.max_groups_contributed" {
                b.max_groups_contributed = bound;
            } else {
                b.max_rows_contributed = bound;
            }
            return Ok(QueryResult::empty());
        }
        if var == "dpfusion.default_delta" {
            let d = if default {
                self.options.default_delta
            } else {
                let d: f64 = value.parse().map_err(|_| {
                    DataFusionError::Plan(format!(
                        "dpfusion.default_delta must be a number in (0, 1) (or DEFAULT for the \
                         session's own, {}), got {value}",
                        self.options.default_delta
                    ))
                })?;
                dpfusion_udfs::privacy::error::check_delta("dpfusion.default_delta", d)
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                d
            };
            *self.default_delta.write().expect("lock") = d;
            return Ok(QueryResult::empty());
        }
        Err(set_refused(variable))
    }

    /// The one bare, lower-case name of the analyst's table `reference` names in `what` (`CREATE
    /// TABLE`, `DROP TABLE`), checked as [`Self::analyst_name`] checks it. A qualified name is
    /// refused, as in `CREATE EXTERNAL TABLE` (round 50, review "settings" F3: `DROP TABLE IF
    /// EXISTS nosuch.r` took `r`, and `CREATE TABLE x.r AS …` installed `r`).
    fn analyst_table(&self, reference: &TableReference, what: &str) -> Result<String> {
        match reference {
            TableReference::Bare { table } => self.analyst_name(table, what),
            _ => refused!(
                "dpfusion refused the statement: {what} {reference}: give a bare table name (no \
                 catalog or schema)"
            ),
        }
    }

    /// An analyst's table name as SQL wrote it (unquoted names already in lower case), checked:
    /// plain, not the owner's ([`Self::check_not_owned`]), and lower case. The session names
    /// every table in lower case, the owner's too (`install`), so a quoted name that is not
    /// (`"R4"`) is refused rather than registered as another spelling than it was written
    /// (round 50: it was installed as `r4`, and `SELECT * FROM "R4"` then found no table).
    fn analyst_name(&self, name: &str, what: &str) -> Result<String> {
        self.check_not_owned(name, what)?;
        if crate::guard::checked::is_reserved(name) {
            return refused!(
                "dpfusion refused the statement: {what} {name}: names that start with {} are \
                 those of the tables and columns dpfusion adds to a query (round 51). Choose \
                 another name.",
                crate::guard::checked::RESERVED_PREFIX
            );
        }
        let lower = name.to_ascii_lowercase();
        if name != lower {
            return refused!(
                "dpfusion refused the statement: {what} \"{name}\": table names are lower case in \
                 dpfusion (the data owner's too), and a quoted name keeps its capitals. Write the \
                 name in lower case: {what} {lower}"
            );
        }
        Ok(lower)
    }

    /// Does the session resolve the bare name `name` to a table now?
    fn table_exists(&self, name: &str) -> Result<bool> {
        self.ctx.table_exist(TableReference::bare(name))
    }

    /// Whether `what` (`CREATE TABLE`, `CREATE EXTERNAL TABLE`) of the analyst's table `name`
    /// goes on, as SQL says (round 50, review "settings" F2): when a table of that name exists,
    /// `IF NOT EXISTS` does nothing (false: answered empty, its query not checked, run or
    /// charged), `OR REPLACE` replaces it (true), and without either the statement is refused,
    /// nothing charged. The name is not the owner's ([`Self::analyst_name`]).
    fn may_create(
        &self,
        name: &str,
        what: &str,
        if_not_exists: bool,
        or_replace: bool,
    ) -> Result<bool> {
        if !self.table_exists(name)? || or_replace {
            return Ok(true);
        }
        if if_not_exists {
            return Ok(false);
        }
        refused!(
            "dpfusion refused the statement: {what} {name}: table '{name}' exists. Drop it first \
             (DROP TABLE {name}), replace it ({} {name} …), or keep it: {what} IF NOT EXISTS \
             {name} … does nothing when it exists. Nothing was charged.",
            what.replacen("CREATE", "CREATE OR REPLACE", 1)
        )
    }

    /// Analyst SQL's `CREATE EXTERNAL TABLE`: a public table over files the data owner lets
    /// analysts read ([`crate::session::AnalystFiles`]), never over a private table's files, the
    /// ledger's directory or the owner's files, under any spelling. Policy options (`dp.*`) are
    /// the owner's: refused.
    pub(super) async fn create_external_table(
        &self,
        c: datafusion::sql::parser::CreateExternalTable,
    ) -> Result<QueryResult> {
        use datafusion::sql::sqlparser::ast::ObjectNamePart;
        // An unquoted name in lower case, as DataFusion's planner normalises it; a quoted one
        // as written ([`Self::analyst_name`] refuses it if that is not lower case).
        let bare = match c.name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] if i.quote_style.is_none() => {
                Some(i.value.to_ascii_lowercase())
            }
            [ObjectNamePart::Identifier(i)] => Some(i.value.clone()),
            _ => None,
        };
        let Some(name) = bare else {
            return refused!(
                "dpfusion refused the statement: CREATE EXTERNAL TABLE {}: give a bare table name \
                 (no catalog or schema)",
                c.name
            );
        };
        if let Some((k, _)) = c
            .options
            .iter()
            .find(|(k, _)| k.to_ascii_lowercase().starts_with("dp."))
        {
            return refused!(
                "dpfusion refused the statement: '{k}' is a policy option, and policy (visibility, \
                 budget, neighbours, public columns, filter) is the data owner's, never SQL's. \
                 The data owner declares private and public tables in the catalog (dpfusion \
                 --catalog FILE; docs/CATALOG.md), with --private/--public in single-user mode, \
                 or with the Rust API. CREATE EXTERNAL TABLE registers public tables of the \
                 analyst's own files only, without dp.* options."
            );
        }
        let name = self.analyst_name(&name, "CREATE EXTERNAL TABLE")?;
        if !self.may_create(
            &name,
            "CREATE EXTERNAL TABLE",
            c.if_not_exists,
            c.or_replace,
        )? {
            return Ok(QueryResult::empty());
        }
        let mut sets = Vec::new();
        for location in &c.locations {
            sets.push(self.analyst_file_set(location)?);
        }
        // DataFusion reads the canonical spelling the pins know (crate::files::store), and
        // only what is pinned now.
        let mut c = c;
        for location in c.locations.iter_mut() {
            let canon =
                crate::files::canonical_location(location, Path::new(".")).map_err(|e| {
                    crate::error::Error::refused(format!("dpfusion refused the registration: {e}"))
                })?;
            *location = canon.to_string_lossy().to_string();
        }
        let mut pins = Vec::new();
        for set in &sets {
            match self.fs.pin_rechecked(&name, set) {
                Ok(p) => pins.push(p),
                Err(e) => {
                    pins.iter().for_each(|p| self.fs.unpin(*p));
                    return refused!("dpfusion refused the registration: {e}");
                }
            }
        }
        let registered = async {
            let tmp = self.fs.scratch_context()?;
            let plan = tmp
                .state()
                .statement_to_plan(DFStatement::CreateExternalTable(c.clone()))
                .await?;
            tmp.execute_logical_plan(plan).await?;
            let provider = tmp.table_provider(name.as_str()).await?;
            // The provider lists its files again at every scan: check them again then, so a
            // file that appears later under the location cannot be a private one.
            let protection = self.protection.clone();
            let allowed = self.options.analyst_files.clone();
            let locations = c.locations.clone();
            let recheck: crate::guard::table::Recheck = Arc::new(move || {
                for location in &locations {
                    crate::owner::analyst_file_set(location, &allowed, &protection)?;
                }
                Ok(())
            });
            let key = TableKey::from(format!(
                "analyst:{}",
                sets.iter()
                    .map(|s| s.root.to_string_lossy().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            self.install(
                &name,
                provider,
                key,
                Registration::public(),
                None,
                Some(recheck),
            )
        }
        .await;
        match &registered {
            Ok(_) => self.fs.retain_table(&name, &pins),
            Err(_) => pins.iter().for_each(|p| self.fs.unpin(*p)),
        }
        let policy = registered?;
        let batch = statements::registration_batch(&policy)?;
        Ok(QueryResult::of(vec![batch.clone()], batch.schema()))
    }

    /// The file set of a location analyst SQL names, if the owner allows its files and none is
    /// protected. Outside the allowed directories nothing is resolved in the message: whether a
    /// path exists there is not the analyst's to learn.
    pub(super) fn analyst_file_set(&self, location: &str) -> Result<crate::files::FileSet> {
        crate::owner::analyst_file_set(location, &self.options.analyst_files, &self.protection)
    }
    /// Analyst SQL cannot replace, shadow or drop a table the data owner registered.
    pub(super) fn check_not_owned(&self, name: &str, what: &str) -> Result<()> {
        // A name DataFusion would read again as `schema.table` (`"public.salaries"`) or trim
        // (`" salaries"`) is another table's name once registered: only plain names reach the
        // catalog (round 46: `CREATE TABLE "public.salaries" AS …` replaced the owner's table).
        if !is_plain_name(name) {
            return refused!(
                "dpfusion refused the statement: {what} '{name}': an analyst's table name must \
                 be letters, digits and '_' (not starting with a digit), unqualified. Choose \
                 another name."
            );
        }
        if self
            .owned
            .lock()
            .expect("lock")
            .contains(&name.to_ascii_lowercase())
        {
            return refused!(
                "dpfusion refused the statement: {what} '{name}': '{name}' is a table of the \
                 data owner, which analyst SQL cannot replace, shadow or drop. Choose another \
                 name."
            );
        }
        Ok(())
    }
}

/// A name of letters, digits and `_`, not starting with a digit: one that every part of
/// DataFusion reads as the same bare table name (an analyst's tables, uploads included).
pub fn is_plain_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::sql::parser::DFParser;
    use datafusion::sql::sqlparser::dialect::GenericDialect;

    use super::*;

    fn parsed(sql: &str) -> DFStatement {
        DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
            .unwrap()
            .pop_front()
            .unwrap()
    }

    /// Round 50 (review "settings", minor): every SET that DataFusion's planner cannot plan
    /// gets dpfusion's one SET refusal (or, for one of the three settings, how to write it), never
    /// the planner's debug dump; a plannable `SET name = value` passes on to be planned.
    #[test]
    fn a_set_the_planner_cannot_plan_gets_the_one_set_refusal() {
        for (sql, what) in [
            ("SET TIME ZONE 'UTC'", "SET TIME ZONE is not allowed"),
            ("SET LOCAL TIME ZONE 'UTC'", "SET TIME ZONE is not allowed"),
            ("SET ROLE analyst", "SET ROLE is not allowed"),
            ("SET NAMES 'utf8'", "SET NAMES is not allowed"),
            (
                "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                "SET TRANSACTION is not allowed",
            ),
            ("SET a = 1, b = 2", "SET a, b is not allowed"),
            ("SET (a, b) = (1, 2)", "SET a, b is not allowed"),
            ("SET x = 1 + 1", "SET x is not allowed"),
            ("SET SESSION x = 1", "SET x is not allowed"),
            (
                "EXPLAIN SET TIME ZONE 'UTC'",
                "SET TIME ZONE is not allowed",
            ),
        ] {
            let e = check_set_statement(&parsed(sql)).expect_err(sql);
            let m = e.to_string();
            assert!(
                matches!(crate::Error::of(&e), Some(crate::Error::Refused(_))),
                "{sql}: {m}"
            );
            assert!(m.contains(what), "{sql}: {m}");
            assert!(
                m.contains("the settings are dpfusion.default_delta"),
                "{sql}: {m}"
            );
            assert!(!m.contains("Span") && !m.contains("Value("), "{sql}: {m}");
        }
        for sql in [
            "SET SESSION dpfusion.default_delta = 1e-8",
            "SET dpfusion.default_delta = 1e-8 * 2",
            "SET dpfusion.max_rows_contributed = NULL",
        ] {
            let m = check_set_statement(&parsed(sql))
                .expect_err(sql)
                .to_string();
            assert!(m.contains("write SET dpfusion."), "{sql}: {m}");
            assert!(!m.contains("Span"), "{sql}: {m}");
        }
        for sql in [
            "SET dpfusion.default_delta = 1e-8",
            "SET dpfusion.default_delta = DEFAULT",
            "SET dpfusion.max_groups_contributed = '3'",
            "SET dpfusion.default_delta = -1",
            "SET datafusion.execution.batch_size = 1",
            "SET timezone = 'UTC'",
            "SELECT 1",
        ] {
            check_set_statement(&parsed(sql)).expect(sql);
        }
    }

    /// Round 50 (review "settings" F1): a `CREATE TABLE … AS` result with a column of no type,
    /// or two columns of one name, is refused on its schema, worded for the statement.
    #[test]
    fn a_result_table_needs_typed_columns_with_distinct_names() {
        let schema = |fields: Vec<(&str, DataType)>| {
            Schema::new(
                fields
                    .into_iter()
                    .map(|(n, t)| Field::new(n, t, true))
                    .collect::<Vec<_>>(),
            )
        };
        let e = check_result_table(
            "r",
            &schema(vec![("n", DataType::Int64), ("z", DataType::Null)]),
        )
        .unwrap_err();
        assert!(matches!(
            crate::Error::of(&e),
            Some(crate::Error::Refused(_))
        ));
        let m = e.to_string();
        assert!(
            m.contains("give column z a type: CAST(NULL AS DOUBLE)"),
            "{m}"
        );
        assert!(m.contains("Nothing was charged"), "{m}");
        assert!(!m.contains("catalog"), "{m}");
        let m = check_result_table(
            "r",
            &schema(vec![
                ("job", DataType::Utf8),
                ("job", DataType::Utf8),
                ("n", DataType::Int64),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(m.contains("name the columns apart: … AS job2"), "{m}");
        check_result_table(
            "r",
            &schema(vec![("job", DataType::Utf8), ("Job", DataType::Utf8)]),
        )
        .unwrap();
    }
}
