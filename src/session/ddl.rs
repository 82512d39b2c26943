//! What analyst SQL may change in a session, and what it may not: `CREATE TABLE … AS` (a DP
//! result, public), `CREATE EXTERNAL TABLE` (a public table of files the data owner allows),
//! `DROP`, and the `SET` of the session's settings. Views, DML, other DDL and other statements
//! (transactions included: a charge is final once admitted, so there is nothing to roll back)
//! are refused with a typed [`crate::Error::Refused`]. No analyst statement replaces, shadows or
//! drops a table of the data owner.
use std::path::Path;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, TransactionConclusion};
use datafusion::sql::parser::Statement as DFStatement;

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

/// The schema of a table made from a query's result: the query's, widened where its batches
/// differ (the physical plan may type a column more loosely than the logical one, e.g. a CASE
/// under an ORDER BY read as nullable; the fuzzer found `CREATE TABLE … AS … ORDER BY k` failing
/// with "Mismatch between schema and batches" after its charge). Each column keeps the batches'
/// type and metadata, and is nullable if either says so.
fn table_schema(
    logical: &datafusion::arrow::datatypes::SchemaRef,
    batches: &[datafusion::arrow::array::RecordBatch],
) -> datafusion::arrow::datatypes::SchemaRef {
    use datafusion::arrow::datatypes::Schema;
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
                self.check_not_owned(c.name.table(), "CREATE TABLE")?;
                self.create_table_as(sql, state, c.name.table(), &c.input)
                    .await
            }
            LogicalPlan::Ddl(DdlStatement::CreateView(v)) => refused!(
                "dpfusion refused the query: CREATE VIEW '{}' is not supported: a view would \
                 stand between the guard and the tables it reads. Write the query with a CTE \
                 (WITH name AS (...) SELECT ...) instead.",
                v.name
            ),
            LogicalPlan::Ddl(DdlStatement::DropTable(d)) => {
                let name = d.name.table().to_ascii_lowercase();
                self.check_not_owned(&name, "DROP TABLE")?;
                self.ctx.execute_logical_plan(plan).await?;
                self.tables.lock().expect("lock").remove(&name);
                Ok(QueryResult::empty())
            }
            LogicalPlan::Ddl(DdlStatement::DropView(_)) => {
                self.ctx.execute_logical_plan(plan).await?;
                Ok(QueryResult::empty())
            }
            LogicalPlan::Ddl(other) => refused!(
                "dpfusion refused the query: {} is not allowed; register tables with CREATE \
                 EXTERNAL TABLE ... OPTIONS ('dp.visibility' ...)",
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
            let var = v.variable.to_ascii_lowercase();
            if var == "dpfusion.max_groups_contributed" || var == "dpfusion.max_rows_contributed" {
                let value = v.value.trim().trim_matches('\'');
                let bound = if value.eq_ignore_ascii_case("default") {
                    None
                } else {
                    let n: u64 = value.parse().map_err(|_| {
                        DataFusionError::Plan(format!(
                            "{var} must be an integer from 1 to {} (or DEFAULT for the tables' \
                             own), got {}",
                            PrivacyUnit::MAX_BOUND,
                            v.value
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
            if v.variable.eq_ignore_ascii_case("dpfusion.default_delta") {
                let d: f64 = v.value.trim().trim_matches('\'').parse().map_err(|_| {
                    DataFusionError::Plan(format!(
                        "dpfusion.default_delta must be a number in (0, 1), got {}",
                        v.value
                    ))
                })?;
                dpfusion_udfs::privacy::error::check_delta("dpfusion.default_delta", d)
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                *self.default_delta.write().expect("lock") = d;
                return Ok(QueryResult::empty());
            }
            return refused!(
                "dpfusion refused the query: SET {} is not allowed; the settings are \
                 dpfusion.default_delta, dpfusion.max_groups_contributed and \
                 dpfusion.max_rows_contributed",
                v.variable
            );
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

    /// Analyst SQL's `CREATE EXTERNAL TABLE`: a public table over files the data owner lets
    /// analysts read ([`crate::session::AnalystFiles`]), never over a private table's files, the
    /// ledger's directory or the owner's files, under any spelling. Policy options (`dp.*`) are
    /// the owner's: refused.
    pub(super) async fn create_external_table(
        &self,
        c: datafusion::sql::parser::CreateExternalTable,
    ) -> Result<QueryResult> {
        use datafusion::sql::sqlparser::ast::ObjectNamePart;
        let bare = match c.name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] => Some(i.value.to_ascii_lowercase()),
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
        self.check_not_owned(&name, "CREATE EXTERNAL TABLE")?;
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
