//! Output formats for query results: an aligned table, CSV or JSON (an array of objects).
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::pretty::pretty_format_batches;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// An aligned table with borders (the default on a terminal).
    #[default]
    Table,
    /// RFC 4180 CSV with a header line.
    Csv,
    /// A JSON array of objects, one per row.
    Json,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "table" => Ok(OutputFormat::Table),
            "csv" => Ok(OutputFormat::Csv),
            "json" => Ok(OutputFormat::Json),
            other => Err(format!(
                "unknown output format '{other}': expected table, csv or json"
            )),
        }
    }
}

/// Renders `batches` in `format`. An empty result still prints its header (table, CSV) or `[]`.
pub fn render(
    batches: &[RecordBatch],
    schema: &datafusion::arrow::datatypes::SchemaRef,
    format: OutputFormat,
) -> Result<String, ArrowError> {
    match format {
        OutputFormat::Table => {
            if batches.iter().all(|b| b.num_rows() == 0) {
                let empty = RecordBatch::new_empty(schema.clone());
                Ok(pretty_format_batches(&[empty])?.to_string())
            } else {
                Ok(pretty_format_batches(batches)?.to_string())
            }
        }
        OutputFormat::Csv => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                if batches.is_empty() {
                    w.write(&RecordBatch::new_empty(schema.clone()))?;
                }
                for b in batches {
                    w.write(b)?;
                }
            }
            Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
        }
        OutputFormat::Json => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::json::ArrayWriter::new(&mut buf);
                let refs: Vec<&RecordBatch> = batches.iter().collect();
                w.write_batches(&refs)?;
                w.finish()?;
            }
            let s = String::from_utf8_lossy(&buf).to_string();
            Ok(if s.is_empty() { "[]".to_string() } else { s })
        }
    }
}
