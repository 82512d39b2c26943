//! The data owner's registrations: files (CSV, Parquet), in-memory batches and any provider,
//! each checked (every column typed, declared columns exact, the privacy unit, ratio bounds on
//! the data, one policy for a file however many names the session serves it under) before its
//! policy is recorded in the ledger and the guarded provider installed.
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::datasource::MemTable;

use super::{PrivateSession, Registration};
use crate::accounting::{
    DEFAULT_DELTA_SHARE, FilterChoice, Neighbours, PrivacyUnit, TableKey, TablePolicy, Visibility,
};
use crate::guard::{GuardedTable, TableInfo};
use crate::owner::Role;

impl PrivateSession {
    /// The data owner registers a CSV file, or a directory of `.csv` files, as a table: read
    /// with `reg.csv`, with the schema pinned in the ledger (or `reg.schema`, or, at the first
    /// registration, the one inferred now, which is then pinned).
    pub async fn register_csv(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_file(name, path.as_ref(), reg, FileFormat::Csv)
            .await
    }

    /// The data owner registers a Parquet file, or a directory of `.parquet` files, as a table
    /// (schema pinned as for [`PrivateSession::register_csv`]).
    pub async fn register_parquet(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_file(name, path.as_ref(), reg, FileFormat::Parquet)
            .await
    }

    async fn register_file(
        &self,
        name: &str,
        path: &Path,
        mut reg: Registration,
        format: FileFormat,
    ) -> Result<TablePolicy> {
        let location = path.to_string_lossy().to_string();
        if let Some(why) = crate::files::link_others_control(&location, Path::new(".")) {
            return plan_err!("table '{name}': {why}");
        }
        let set = crate::files::resolve(&location, Path::new("."))
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
        if set.glob.is_some() {
            return plan_err!(
                "table '{name}': '{location}' is a glob; a table is one file or one directory \
                 (every file below it, now and later, belongs to the table)"
            );
        }
        let key = TableKey::from(set.root.to_string_lossy().to_string());
        // One file, one visibility in a session: a private registration of a path this session
        // serves under another name as public would be recorded as a tightening in the ledger
        // while the public name kept reading the rows (review of round 45's fix). The reverse
        // is the ledger's to refuse (private → public).
        if reg.visibility == Visibility::Private
            && let Some((other, _, _)) = self.tables().into_iter().find(|(n, info, _)| {
                info.key == key && !info.private && *n != name.to_ascii_lowercase()
            })
        {
            return Err(crate::error::Error::Policy(format!(
                "table '{name}': '{location}' is registered in this session as public table \
                 '{other}', which would go on reading its rows. Register the file once, as \
                 private (or restart without the public table)"
            ))
            .into());
        }
        // No other private table may share a file with this one (hard links, nested
        // directories), and no table may read the ledger's directory or the owner's files.
        self.protection
            .check_read(&set, Some(key.as_str()), Role::Owner)
            .map_err(|e| {
                DataFusionError::Plan(format!(
                    "table '{name}': '{location}' shares files with another private table, the \
                     ledger or the catalog; a file belongs to one table ({e})"
                ))
            })?;
        // The output directory (where analysts' COPY writes) holds no table's file, and lies
        // in no table's directory.
        if let Some(out) = self.fs.output_dir()
            && set.intersects(&crate::files::FileSet::path_only(&out))
        {
            return plan_err!(
                "table '{name}': '{location}' and the output directory {} overlap; analysts' \
                 COPY writes there, so no table's file may lie in it (choose another output \
                 directory, or move the table's files)",
                out.display()
            );
        }
        // Pinned now: from here on the table reads these files only (crate::files::store).
        let table = name.to_ascii_lowercase();
        let pin = self
            .fs
            .pin(&table, &set, reg.visibility == Visibility::Private)
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
        let registered = async {
            let pinned = self.accountant.policy(&key).and_then(|p| p.schema);
            let schema = match (&reg.schema, &pinned) {
                (Some(s), _) => Some(s.clone()),
                (None, Some(p)) => Some(crate::owner::unpin(p)?),
                (None, None) => None,
            };
            let scratch = self.fs.scratch_context()?;
            // A private table's files are read totally (round 47: crate::owner), a CSV file
            // normalised record by record (crate::files::csv_total) in the table's dialect and
            // number of columns (at the first registration, its first record's until inferred).
            let private = reg.visibility == Visibility::Private;
            let csv_pin = |columns| {
                if private && matches!(format, FileFormat::Csv) {
                    // The owner's bound on a value holds while the file is read (round 51,
                    // review "limits" F1: the reader held a whole value first).
                    let dialect = reg
                        .csv
                        .dialect(columns)
                        .with_max_value_bytes(self.options.max_value_bytes);
                    self.fs.read_csv_as(pin, dialect);
                }
            };
            csv_pin(schema.as_ref().map(|s| s.fields().len()));
            let provider = match format {
                FileFormat::Csv => {
                    crate::owner::csv_provider(
                        &scratch,
                        &set.root,
                        &reg.csv,
                        schema.as_deref(),
                        private,
                    )
                    .await?
                }
                FileFormat::Parquet => {
                    crate::owner::parquet_provider(&scratch, &set.root, schema.as_deref(), private)
                        .await?
                }
            };
            if provider.schema().fields().is_empty() {
                return plan_err!(
                    "table '{name}': '{location}' has no columns (an empty file?). A CSV file \
                     needs a header line, or declare the columns in the catalog \
                     ([[table.columns]])"
                );
            }
            csv_pin(Some(provider.schema().fields().len()));
            // Each file's header has the table's width, or its rows would all read as NULLs
            // (round 47, review "fix-readers" F3). Not under a format the ledger is about to
            // refuse (another delimiter splits the header otherwise): its message says why.
            let refused_format = reg.relax.is_none()
                && self
                    .accountant
                    .policy(&key)
                    .and_then(|p| p.format)
                    .is_some_and(|f| f != reg.csv.describe());
            if private && matches!(format, FileFormat::Csv) && reg.csv.has_header && !refused_format
            {
                crate::owner::check_csv_widths(&self.fs, name, &set, &reg.csv, &provider.schema())?;
            }
            reg.schema = Some(provider.schema());
            let format_text = match format {
                FileFormat::Csv => reg.csv.describe(),
                FileFormat::Parquet => "parquet".to_string(),
            };
            self.register_owned(name, provider, key, reg, Some(format_text))
        }
        .await;
        match &registered {
            Ok(_) => self.fs.retain_table(&table, &[pin]),
            Err(_) => self.fs.unpin(pin),
        }
        registered
    }

    /// Registers in-memory batches as a table (ledger identity `mem:<name>`).
    pub fn register_batches(
        &self,
        name: &str,
        batches: Vec<RecordBatch>,
        reg: Registration,
    ) -> Result<TablePolicy> {
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return plan_err!("register_batches('{name}'): give at least one batch");
        };
        let provider = Arc::new(MemTable::try_new(schema, vec![batches])?);
        self.register_provider(name, provider, TableKey::from(format!("mem:{name}")), reg)
    }

    /// The data owner registers any provider under `key` (its identity in the ledger). A
    /// provider that reads local files through the session's `file://` object store reads only
    /// files pinned by a registration ([`crate::files::PinnedFs`]): register files with
    /// [`PrivateSession::register_csv`] or [`PrivateSession::register_parquet`].
    pub fn register_provider(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
    ) -> Result<TablePolicy> {
        self.register_owned(name, provider, key, reg, None)
    }

    pub(super) fn register_owned(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
        format: Option<String>,
    ) -> Result<TablePolicy> {
        let policy = self.install(name, provider, key, reg, format, None)?;
        self.owned
            .lock()
            .expect("lock")
            .insert(name.to_ascii_lowercase());
        Ok(policy)
    }

    /// Records the policy (owner registrations) and registers the guarded provider.
    pub(super) fn install(
        &self,
        name: &str,
        provider: Arc<dyn TableProvider>,
        key: TableKey,
        reg: Registration,
        format: Option<String>,
        recheck: Option<crate::guard::table::Recheck>,
    ) -> Result<TablePolicy> {
        let name = name.to_ascii_lowercase();
        let schema = provider.schema();
        check_unreserved(&name, &schema)?;
        check_typed(&name, &schema)?;
        for c in &reg.public_columns {
            check_column(&name, &schema, c, "public column")?;
        }
        check_ratio_bounds(&name, &provider, &reg, &self.fs)?;
        let unit = check_unit(&name, &schema, &reg)?;
        if let Some(u) = &unit {
            self.check_domain_type(&name, &schema, u)?;
        }
        let policy = TablePolicy {
            key: key.clone(),
            name: name.clone(),
            visibility: reg.visibility,
            neighbours: reg.neighbours,
            public_columns: reg.public_columns.clone(),
            budget: reg.budget.unwrap_or(self.options.default_budget),
            filter: reg.filter.unwrap_or_default(),
            delta_share: reg.delta_share.unwrap_or(DEFAULT_DELTA_SHARE),
            schema: Some(crate::owner::pin(&schema)),
            format,
            relaxed: None,
            unit,
        };
        crate::accounting::check_budget(&policy.budget)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let stated = FilterChoice {
            kind: reg.filter.is_some(),
            delta_share: reg.delta_share.is_some(),
            budget: reg.budget.is_some(),
        };
        // The policies this session serves the same file under, by other names: the ledger's
        // policy for it may not change under them (round 46, F2 of the review of its fixes).
        let served: Vec<TablePolicy> = self
            .tables
            .lock()
            .expect("lock")
            .iter()
            .filter(|(n, t)| **n != name && t.info().key == key)
            .filter_map(|(_, t)| t.policy().cloned())
            .collect();
        let policy = self
            .accountant
            .register_table_beside(policy, stated, reg.relax.as_deref(), &served)
            .map_err(crate::error::Error::from_accounting)?;
        let info = TableInfo {
            name: name.clone(),
            key,
            private: policy.visibility == Visibility::Private,
            neighbours: policy.neighbours,
            public_columns: policy.public_columns.clone(),
            ratio_bounds: reg.ratio_bounds.clone(),
            unit: policy.unit.clone(),
            selection_delta: (policy.visibility == Visibility::Private)
                .then(|| policy.compiled_filter().ok().map(|f| f.selection_delta()))
                .flatten(),
        };
        // Its statements are refused once the ledger holds another policy (round 46).
        let mut guarded = GuardedTable::new(provider, info).with_policy(policy.clone());
        if let Some(r) = recheck {
            guarded = guarded.with_recheck(r);
        }
        let guarded = Arc::new(guarded);
        // As a bare name: a string would be parsed again (`"a.b"` as schema `a`, table `b`).
        let reference = datafusion::common::TableReference::bare(name.as_str());
        let _ = self.ctx.deregister_table(reference.clone())?;
        self.ctx.register_table(reference, guarded.clone())?;
        self.tables
            .lock()
            .expect("lock")
            .insert(name.clone(), guarded);
        Ok(policy)
    }

    /// The unit columns of one domain have one type: two tables of a domain are joined on their
    /// unit columns only as they are, of one type (`guard::join`), so a second type (Int32
    /// beside Int64, Utf8View from Parquet beside Utf8 from CSV) would make every such join
    /// fail. Refused when the second table is registered, naming the pin that fixes it (round
    /// 47; before, only the joins were refused).
    fn check_domain_type(&self, name: &str, schema: &Schema, unit: &PrivacyUnit) -> Result<()> {
        let Ok(field) = schema.field_with_name(&unit.column) else {
            return Ok(());
        };
        let tables = self.tables.lock().expect("lock");
        let mut others: Vec<_> = tables
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .filter_map(|(n, t)| {
                let u = t.info().unit.as_ref()?;
                let s = t.schema();
                let f = s.field_with_name(&u.column).ok()?;
                (u.domain == unit.domain && f.data_type() != field.data_type())
                    .then(|| (n.clone(), u.column.clone(), f.data_type().clone()))
            })
            .collect();
        others.sort();
        if let Some((other, column, ty)) = others.into_iter().next() {
            return plan_err!(
                "table '{name}': its privacy unit column '{}' is {}, while table '{other}' of \
                 the same unit domain '{}' has '{column}' as {ty}; the unit columns of one \
                 domain must have one type, or no join could pair them. Declare both with one \
                 type (columns = [...] in the catalog, Registration::schema)",
                unit.column,
                field.data_type(),
                unit.domain
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum FileFormat {
    Csv,
    Parquet,
}

/// A table's name and its columns' may not start with the prefix of the names dpfusion adds to a
/// query (`guard::checked::RESERVED_PREFIX`; round 51, review "names" F3: a column so named
/// beside the guard's made every query that read it fail with DataFusion's "ambiguous" error).
fn check_unreserved(name: &str, schema: &Schema) -> Result<()> {
    use crate::guard::checked::{RESERVED_PREFIX, is_reserved};
    let column = schema.fields().iter().find(|f| is_reserved(f.name()));
    let what = match column {
        Some(f) => format!("its column '{}'", f.name()),
        None if is_reserved(name) => "its name".to_string(),
        None => return Ok(()),
    };
    Err(DataFusionError::Plan(format!(
        "table '{name}': {what} starts with {RESERVED_PREFIX}, the prefix of the columns and \
         tables dpfusion adds to a query. Rename it in the file."
    )))
}

/// `column` must name a column of `schema` exactly (names are case-sensitive); a name that only
/// matches another spelling is refused with the exact name, so that no declaration is ambiguous.
/// The privacy unit of a registration, checked: a private table with `add_remove` neighbours, an
/// existing column, bounds in range; the domain defaults to the table's name.
fn check_unit(name: &str, schema: &Schema, reg: &Registration) -> Result<Option<PrivacyUnit>> {
    let Some(u) = &reg.unit else {
        return Ok(None);
    };
    if reg.visibility != Visibility::Private {
        return plan_err!(
            "table '{name}': a privacy unit is declared on a private table; a public table has \
             none"
        );
    }
    if reg.neighbours != Neighbours::AddRemove {
        return plan_err!(
            "table '{name}': a privacy unit means neighbouring datasets differ by adding or \
             removing all the rows of one unit; it cannot be combined with replace neighbours \
             (remove neighbours = \"replace\", or the unit)"
        );
    }
    check_column(name, schema, &u.column, "privacy unit column")?;
    // Who a row belongs to must be one value: floats are not (NaN payloads, ±0 are equal to
    // some of DataFusion's operators and not to others: review of round 46).
    if let Ok(f) = schema.field_with_name(&u.column)
        && holds_floats(f.data_type())
    {
        return plan_err!(
            "table '{name}': the privacy unit column '{}' is {}; a unit is an identifier, and \
             floats have values that are equal to some operators and not to others (NaN, -0.0). \
             Declare it as an integer or a string (columns = [...] in the catalog, \
             Registration::schema)",
            u.column,
            f.data_type()
        );
    }
    if reg.public_columns.contains(&u.column) {
        return plan_err!(
            "table '{name}': the privacy unit column '{}' cannot also be a public column: who a \
             row belongs to is what the unit protects",
            u.column
        );
    }
    for (what, v) in [
        ("max_groups_contributed", u.max_groups_contributed),
        ("max_rows_contributed", u.max_rows_contributed),
    ] {
        PrivacyUnit::check_bound(what, v as u64)
            .map_err(|e| DataFusionError::Plan(format!("table '{name}': {e}")))?;
    }
    let domain = if u.domain.trim().is_empty() {
        name.to_string()
    } else {
        u.domain.trim().to_string()
    };
    Ok(Some(PrivacyUnit {
        domain,
        ..u.clone()
    }))
}

/// Does a value of type `t` hold a float anywhere (a dictionary's values, a struct's fields, a
/// list's items…)?
fn holds_floats(t: &DataType) -> bool {
    use DataType::*;
    match t {
        Float16 | Float32 | Float64 => true,
        Dictionary(_, v) => holds_floats(v),
        RunEndEncoded(_, v) => holds_floats(v.data_type()),
        List(f)
        | LargeList(f)
        | FixedSizeList(f, _)
        | ListView(f)
        | LargeListView(f)
        | Map(f, _) => holds_floats(f.data_type()),
        Struct(fields) => fields.iter().any(|f| holds_floats(f.data_type())),
        Union(fields, _) => fields.iter().any(|(_, f)| holds_floats(f.data_type())),
        _ => false,
    }
}

fn check_column(table: &str, schema: &Schema, column: &str, what: &str) -> Result<()> {
    if schema.fields().iter().any(|f| f.name() == column) {
        return Ok(());
    }
    let near: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|f| f.eq_ignore_ascii_case(column))
        .collect();
    if !near.is_empty() {
        return plan_err!(
            "{what} '{column}' is not a column of table '{table}': column names are \
             case-sensitive, and the table has {}. Declare the exact name.",
            near.iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    plan_err!(
        "{what} '{column}' is not a column of table '{table}' (columns: {})",
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Every column of a table has a type: a column of Arrow type `Null` (a CSV file with a header
/// and no data row infers one per column) would be pinned in the ledger for good, read every
/// later row as NULL and let DP calls charge for nothing. Refused at registration, with what to
/// declare instead (issue 33).
fn check_typed(table: &str, schema: &Schema) -> Result<()> {
    let untyped = untyped_columns(schema);
    if untyped.is_empty() {
        return Ok(());
    }
    let example = untyped
        .iter()
        .map(|c| format!("{{ name = \"{c}\", type = \"Float64\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    plan_err!(
        "table '{table}': no type could be inferred for column(s) '{}' (a file with a header \
         and no data rows, or only empty values). Declare the columns' types: in the catalog, \
         columns = [{example}] in the table's [[table]] section (docs/CATALOG.md); in the Rust \
         API, Registration::schema; in CREATE EXTERNAL TABLE, a column list (name TYPE, ...)",
        untyped.join("', '")
    )
}

/// The columns of `schema` that have no type (Arrow `Null`): refused in an owner's registration
/// ([`check_typed`]) and, before its charge, in a `CREATE TABLE … AS` (`ddl`, round 50).
pub(super) fn untyped_columns(schema: &Schema) -> Vec<&str> {
    schema
        .fields()
        .iter()
        .filter(|f| f.data_type().is_null())
        .map(|f| f.name().as_str())
        .collect()
}

/// Checks the declared ratio bounds on the data (the owner's registration; the errors may name
/// groups). Runs on its own thread and runtime, so it can be called from sync and async code.
fn check_ratio_bounds(
    table: &str,
    provider: &Arc<dyn TableProvider>,
    reg: &Registration,
    fs: &Arc<crate::files::PinnedFs>,
) -> Result<()> {
    if reg.ratio_bounds.is_empty() {
        return Ok(());
    }
    let schema = provider.schema();
    for b in &reg.ratio_bounds {
        check_column(table, &schema, &b.value, "ratio-bound column")?;
        check_column(table, &schema, &b.by, "ratio-bound `by` column")?;
        if !reg.public_columns.contains(&b.by) {
            return plan_err!(
                "the ratio bound of '{}' by '{}' needs '{}' to be a public column of table \
                 '{table}'",
                b.value,
                b.by,
                b.by
            );
        }
        if !(b.max_ratio.is_finite() && b.max_ratio >= 1.0) {
            return plan_err!(
                "the ratio bound of '{}' by '{}' must be a finite number >= 1, got {}",
                b.value,
                b.by,
                b.max_ratio
            );
        }
    }
    let provider = provider.clone();
    let bounds = reg.ratio_bounds.clone();
    let table = table.to_string();
    let fs = Arc::clone(fs);
    let run = move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        rt.block_on(async move {
            // The files are read through the session's pins, as every scan.
            let ctx = fs.scratch_context()?;
            ctx.register_table("t", provider)?;
            for b in &bounds {
                let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
                let (v, by) = (q(&b.value), q(&b.by));
                let sql = format!(
                    "SELECT CAST({by} AS VARCHAR) AS g, min(CAST({v} AS DOUBLE)) AS lo, \
                     max(CAST({v} AS DOUBLE)) AS hi, count(*) - count({v}) AS nulls \
                     FROM t GROUP BY 1 ORDER BY 1"
                );
                let batches = ctx.sql(&sql).await?.collect().await?;
                let mut bad = Vec::new();
                for batch in &batches {
                    use datafusion::arrow::array::{Array, AsArray};
                    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
                    let g = datafusion::arrow::compute::cast(
                        batch.column(0),
                        &datafusion::arrow::datatypes::DataType::Utf8,
                    )?;
                    let g = g.as_string::<i32>();
                    let lo = batch.column(1).as_primitive::<Float64Type>();
                    let hi = batch.column(2).as_primitive::<Float64Type>();
                    let nulls = batch.column(3).as_primitive::<Int64Type>();
                    for i in 0..batch.num_rows() {
                        let (l, h) = (lo.value(i), hi.value(i));
                        let ok = nulls.value(i) == 0
                            && !lo.is_null(i)
                            && l >= f64::MIN_POSITIVE
                            && l.is_finite()
                            && h <= b.max_ratio * l;
                        if !ok {
                            bad.push(format!(
                                "{} (min {l}, max {h}, {} NULL)",
                                if g.is_null(i) { "NULL" } else { g.value(i) },
                                nulls.value(i)
                            ));
                        }
                    }
                }
                if !bad.is_empty() {
                    return plan_err!(
                        "table '{table}': the data do not satisfy the declared ratio bound of \
                         '{}' by '{}' (every value > 0, no NULL, max <= {} x min in each group); \
                         groups that fail: {}",
                        b.value,
                        b.by,
                        b.max_ratio,
                        bad.join("; ")
                    );
                }
            }
            Ok(())
        })
    };
    std::thread::scope(|s| {
        s.spawn(run)
            .join()
            .unwrap_or_else(|_| plan_err!("checking the ratio bounds of '{}' failed", "table"))
    })
}
