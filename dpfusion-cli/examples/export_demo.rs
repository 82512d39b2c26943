//! Writes the built-in demo tables to CSV files (for the utility study and for readers who want
//! to look at them): `cargo run --release --example export_demo -- DIR`.
//! The demo data are synthetic and public by construction; inside dpfusion they are registered
//! private only to show the workflow.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".to_string());
    std::fs::create_dir_all(&dir)?;
    for (name, batch) in [
        ("salaries", dpfusion_cli::demo::salaries()?),
        ("patients", dpfusion_cli::demo::patients()?),
    ] {
        let path = std::path::Path::new(&dir).join(format!("{name}.csv"));
        let file = std::fs::File::create(&path)?;
        let mut w = datafusion::arrow::csv::WriterBuilder::new()
            .with_header(true)
            .build(file);
        w.write(&batch)?;
        println!("{}: {} rows", path.display(), batch.num_rows());
    }
    Ok(())
}
