//! Runs the SQL contract tests in `sql/*.slt` (sqllogictest format, DataFusion's convention).
//! Each file gets a fresh `PrivateSession` on its own empty ledger, opened on the data owner's
//! catalog `sql/NAME.toml` when there is one, else `sql/catalog.toml` (SQL never declares a
//! private table: the owner does). The working directory is the repository root (so analyst
//! SQL's `LOCATION 'tests/data/...'` works).
use std::path::PathBuf;

use async_trait::async_trait;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use dpfusion::PrivateSession;
use dpfusion::catalog::Catalog;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};

struct Db {
    session: PrivateSession,
}

#[derive(Debug)]
struct DbError(String);
impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for DbError {}

fn cell(s: String) -> String {
    // Floats: at most 6 significant decimals, so that outward rounding in the last bits of an ε
    // does not make contract tests brittle.
    if let Ok(x) = s.parse::<f64>()
        && s.contains('.')
    {
        let r = format!("{:.6}", x);
        let r = r.trim_end_matches('0').trim_end_matches('.').to_string();
        return r;
    }
    if s.is_empty() { "(empty)".into() } else { s }
}

#[async_trait]
impl AsyncDB for Db {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DbError> {
        let r = self
            .session
            .sql(sql)
            .await
            .map_err(|e| DbError(e.to_string()))?;
        if r.schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let opts = FormatOptions::default().with_null("NULL");
        let mut rows = Vec::new();
        for b in &r.batches {
            let fmts: Vec<_> = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).expect("formatter"))
                .collect();
            for i in 0..b.num_rows() {
                rows.push(fmts.iter().map(|f| cell(f.value(i).to_string())).collect());
            }
        }
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; r.schema.fields().len()],
            rows,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "dpfusion"
    }
}

#[tokio::test]
async fn sql_contract() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(&root).expect("cd to the repository root");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("sql"))
        .expect("sql/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in sql/");
    let mut failures = Vec::new();
    for file in &files {
        // A fresh ledger per file, removed with its witness at the end of the iteration.
        let dir = crate::common::temp_dir(&format!(
            "slt-{}",
            file.file_stem().unwrap().to_string_lossy()
        ));
        let ledger = dir.join("ledger.jsonl");
        let own = file.with_extension("toml");
        let catalog_path = if own.exists() {
            own
        } else {
            root.join("sql/catalog.toml")
        };
        let catalog = Catalog::load(&catalog_path).expect("the slt catalog");
        let mut runner = sqllogictest::Runner::new(|| {
            let ledger = ledger.clone();
            let catalog = catalog.clone();
            async move {
                let options = catalog
                    .session_options()
                    .with_ledger(ledger)
                    .with_target_partitions(2);
                let session = PrivateSession::open(options)
                    .await
                    .map_err(|e| DbError(e.to_string()))?;
                catalog
                    .register(&session)
                    .await
                    .map_err(|e| DbError(e.to_string()))?;
                Ok::<_, DbError>(Db { session })
            }
        });
        // DPFUSION_SLT_UPDATE=1 rewrites the expected results with what the session returns
        // (review the diff: noisy results must stay deterministic in the files).
        if std::env::var_os("DPFUSION_SLT_UPDATE").is_some() {
            if let Err(e) = runner
                .update_test_file(
                    file,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::default_column_validator,
                )
                .await
            {
                failures.push(format!("{}: {e}", file.display()));
            }
        } else if let Err(e) = runner.run_file_async(file).await {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
