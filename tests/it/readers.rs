//! The readers of private files are total (round 47, review "readers"): a private CSV file is
//! never split at byte offsets (a quoted multi-line value stays one value however large the
//! file and however many partitions); a value the pinned type cannot hold reads as NULL (CSV
//! and Parquet) instead of failing the read; a CSV record the reader cannot split into the
//! table's fields reads as a row of NULLs; a value over the owner's `max_value_bytes` reads as
//! NULL (or its type's default under NOT NULL, round 48). Each query answers on D and on its
//! neighbour D′, with the answers a huge ε makes exact.
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use dpfusion::{PrivateSession, Registration, SessionOptions};

use crate::common::*;

/// A session over a fresh ledger in `dir` (noise from a fixed seed; ε large enough that the
/// rounded counts are exact).
async fn session(dir: &Path, partitions: usize) -> PrivateSession {
    PrivateSession::open(options(dir, partitions))
        .await
        .unwrap()
}

fn options(dir: &Path, partitions: usize) -> SessionOptions {
    SessionOptions::default()
        .with_ledger(dir.join("ledger.jsonl"))
        .with_default_budget(1e6, 1e-3)
        .with_target_partitions(partitions)
        .with_insecure_noise_seed(7)
}

fn private() -> Registration {
    Registration::private().budget(1e6, 1e-5)
}

/// The rows of the first columns of a result, as text.
async fn answer(s: &PrivateSession, sql: &str) -> Vec<Vec<String>> {
    let r = s
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql} failed: {e}"));
    let mut out = vec![];
    for b in &r.batches {
        for i in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| array_value_to_string(c, i).unwrap())
                    .collect(),
            );
        }
    }
    out
}

/// `round(dp_count(col))` over `table` at ε 1e4 (exact).
async fn count(s: &PrivateSession, table: &str, col: &str) -> i64 {
    let v = answer(
        s,
        &format!("SELECT round(dp_count({col}, epsilon => 1e4)) FROM {table}"),
    )
    .await;
    v[0][0].parse::<f64>().unwrap() as i64
}

/// The groups `GROUP BY g` releases.
async fn groups(s: &PrivateSession, table: &str) -> BTreeSet<String> {
    answer(
        s,
        &format!("SELECT g, dp_count(g, epsilon => 1e4) FROM {table} GROUP BY g"),
    )
    .await
    .into_iter()
    .map(|r| r[0].clone())
    .collect()
}

/// `g,v` with `rows` rows `a,zzzzzzzzzz`, and in their middle one row of group `a` whose quoted
/// value holds 1,500 lines `q,r` (each of which, read as a record, is a row of group `q`).
fn multiline_csv(path: &Path, rows: usize) {
    let mut text = String::from("g,v\n");
    for i in 0..rows {
        if i == rows / 2 {
            text.push_str("a,\"");
            text.push_str(&"q,r\n".repeat(1499));
            text.push_str("q,r\"\n");
        }
        text.push_str("a,zzzzzzzzzz\n");
    }
    std::fs::write(path, text).unwrap();
}

/// F1: a private CSV over 1 MiB (DataFusion's `repartition_file_min_size`) with a quoted
/// multi-line value across the middle reads as the same rows as a small file does, at 2 and
/// 16 partitions: one row's value never becomes records (before: +1,500 rows and a group `q`).
#[tokio::test]
async fn a_large_private_csv_is_never_split_inside_a_quoted_value() {
    let dir = temp_dir("readers-split");
    let big = dir.join("big.csv");
    let small = dir.join("small.csv");
    multiline_csv(&big, 100_000);
    multiline_csv(&small, 1_000);
    assert!(std::fs::metadata(&big).unwrap().len() > 1 << 20);
    for partitions in [2, 16] {
        let sdir = dir.join(format!("p{partitions}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let s = session(&sdir, partitions).await;
        s.register_csv("big", &big, private()).await.unwrap();
        s.register_csv("small", &small, private()).await.unwrap();
        assert_eq!(count(&s, "big", "g").await, 100_001, "{partitions}");
        assert_eq!(count(&s, "small", "g").await, 1_001, "{partitions}");
        let expected: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(groups(&s, "big").await, expected, "{partitions}");
        assert_eq!(groups(&s, "small").await, expected, "{partitions}");
    }
}

/// `g,x,d` with 1,000 rows `a,<i>,2024-01-<dd>`, and, with `odd`, one more `a,zz,2024-02-30`.
fn typed_csv(path: &Path, odd: bool) {
    let mut text = String::from("g,x,d\n");
    for i in 0..1000 {
        text.push_str(&format!("a,{i},2024-01-{:02}\n", i % 28 + 1));
    }
    if odd {
        text.push_str("a,zz,2024-02-30\n");
    }
    std::fs::write(path, text).unwrap();
}

/// F2 (a): after the 1,000th record, `zz` in an Int64 column and `2024-02-30` in a Date32 one
/// read as NULL, whether the types were declared or inferred (from every record): the query
/// answers as on the neighbour without the row, the row's own count aside. Before, every read
/// of the column failed after the charge.
#[tokio::test]
async fn a_csv_value_that_does_not_convert_reads_as_null() {
    let dir = temp_dir("readers-convert");
    let declared = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, true),
        Field::new("x", DataType::Int64, true),
        Field::new("d", DataType::Date32, true),
    ]));
    let mut answers = vec![];
    for odd in [false, true] {
        let sdir = dir.join(format!("s{odd}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let f = sdir.join("t.csv");
        typed_csv(&f, odd);
        let s = session(&sdir, 2).await;
        s.register_csv("t", &f, private().schema(declared.clone()))
            .await
            .unwrap();
        // Inferred from every record: x holds `zz`, so it is text; d looks like dates.
        let g = sdir.join("g.csv");
        let dates: String = std::fs::read_to_string(&f)
            .unwrap()
            .lines()
            .map(|l| l.rsplit(',').next().unwrap().to_string() + "\n")
            .collect();
        std::fs::write(&g, dates).unwrap();
        s.register_csv("inferred", &g, private()).await.unwrap();
        let (_, _, inferred) = s.tables().into_iter().find(|t| t.0 == "inferred").unwrap();
        assert_eq!(inferred.field(0).data_type(), &DataType::Date32);
        answers.push((
            count(&s, "t", "g").await,
            count(&s, "t", "x").await,
            count(&s, "t", "d").await,
            count(&s, "inferred", "d").await,
            answer(
                &s,
                "SELECT round(dp_sum(x, 0, 1000, epsilon => 1e4)), \
                 round(dp_count(CAST(d AS VARCHAR), epsilon => 1e4)) FROM t",
            )
            .await,
        ));
    }
    let (without, with) = (&answers[0], &answers[1]);
    assert_eq!(with.0, without.0 + 1, "the row itself counts");
    assert_eq!(with.1, without.1, "zz reads as NULL");
    assert_eq!(with.2, without.2, "2024-02-30 reads as NULL");
    assert_eq!(with.3, without.3, "an inferred Date32 too");
    assert_eq!(with.4, without.4);
    assert_eq!(without.1, 1000);
}

fn write_parquet(path: &Path, values: impl Into<Int64Array>) {
    write_parquet_column(path, "x", values)
}

/// A Parquet file of one nullable Int64 column `name`.
fn write_parquet_column(path: &Path, name: &str, values: impl Into<Int64Array>) {
    use dpfusion::datafusion::parquet::arrow::ArrowWriter;
    let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values.into())]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// F2 (c): a Parquet column declared Int32 over a file's Int64 is adapted with a safe cast:
/// 3,000,000,000 reads as NULL instead of failing the read.
#[tokio::test]
async fn a_parquet_value_that_does_not_fit_the_pinned_type_reads_as_null() {
    let dir = temp_dir("readers-parquet");
    let declared = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)]));
    let mut answers = vec![];
    for big in [false, true] {
        let sdir = dir.join(format!("s{big}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let f = sdir.join("t.parquet");
        let mut values = vec![1, 2, 3];
        if big {
            values.push(3_000_000_000);
        }
        write_parquet(&f, values);
        let s = session(&sdir, 2).await;
        s.register_parquet("t", &f, private().schema(declared.clone()))
            .await
            .unwrap();
        answers.push((
            count(&s, "t", "x").await,
            answer(&s, "SELECT round(dp_sum(x, 0, 10, epsilon => 1e4)) FROM t").await,
        ));
    }
    assert_eq!(answers[0].0, 3);
    assert_eq!(answers[1].0, 3, "the value that does not fit reads as NULL");
    assert_eq!(answers[1].1, answers[0].1);
}

/// F2 (b): a private CSV record with more fields than the table's, and one holding a byte that
/// is not UTF-8, read as rows of NULLs (the file is normalised record by record before
/// DataFusion's reader sees it): the queries answer as on the same file with those records
/// replaced by empty rows, whatever column they read, at the first registration (inference)
/// and with the schema pinned. Before, every query on the table failed after the charge.
#[tokio::test]
async fn a_csv_record_the_reader_cannot_split_reads_as_a_row_of_nulls() {
    let dir = temp_dir("readers-records");
    let file = |bad: bool| {
        let mut text = b"g,x\n".to_vec();
        for i in 0..1200 {
            text.extend_from_slice(format!("{},{i}\n", ["a", "b"][i % 2]).as_bytes());
            if i == 1100 {
                text.extend_from_slice(if bad { b"a,1,2\n" } else { b",\n" });
                text.extend_from_slice(if bad { b"b,\"\xff\"\n" } else { b",\n" });
            }
        }
        text
    };
    let sql = "SELECT round(dp_count(1, epsilon => 1e4)), round(dp_count(g, epsilon => 1e4)), \
               round(dp_count(x, epsilon => 1e4)), \
               round(dp_sum(x, 0, 2000, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for bad in [false, true] {
        let sdir = dir.join(format!("s{bad}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let f = sdir.join("t.csv");
        std::fs::write(&f, file(bad)).unwrap();
        let mut got = vec![];
        // The first registration infers the schema through the normaliser; the second session
        // reads with the schema the ledger pinned.
        for _ in 0..2 {
            let s = session(&sdir, 2).await;
            s.register_csv("t", &f, private()).await.unwrap();
            got.push(answer(&s, sql).await);
            got.push(groups(&s, "t").await.into_iter().map(|g| vec![g]).collect());
        }
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[0][0][0][..3],
        ["1202", "1200", "1200"],
        "the rows stay"
    );
}

/// Round 47: in a private CSV table's columns declared NOT NULL (an Int64 and a Utf8), an empty
/// value, a value that does not convert and a record with three fields among two-column rows
/// read as the type's default (0, ""), at the first registration and with the schema pinned:
/// the queries answer as over the same file with those values written as the defaults (0, and
/// for "" an empty value, the only way a CSV file writes it). Nothing reads as NULL, and the
/// table keeps the declared nullability. Before, every read failed.
#[tokio::test]
async fn a_not_null_csv_column_reads_its_types_default() {
    let dir = temp_dir("readers-not-null");
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, false),
        Field::new("x", DataType::Int64, false),
    ]));
    // `odd`: the values to default; else the defaults written out.
    let file = |odd: bool| {
        let mut text = String::from("g,x\n");
        for i in 0..1200 {
            text.push_str(&format!("{},{i}\n", ["a", "b"][i % 2]));
            if i == 1100 {
                // An empty Utf8 value: "" either way (a CSV file cannot write "" otherwise).
                text.push_str(",5\n");
                text.push_str(if odd { "a,\n" } else { "a,0\n" });
                text.push_str(if odd { "b,zz\n" } else { "b,0\n" });
                text.push_str(if odd { "a,7,8\n" } else { ",0\n" });
            }
        }
        text
    };
    let sql = "SELECT round(dp_count(1, epsilon => 1e4)), round(dp_count(g, epsilon => 1e4)), \
               round(dp_count(x, epsilon => 1e4)), \
               round(dp_sum(x, 0, 2000, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for odd in [true, false] {
        let sdir = dir.join(format!("s{odd}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let f = sdir.join("t.csv");
        std::fs::write(&f, file(odd)).unwrap();
        let reg = private().schema(schema.clone());
        let mut got = vec![];
        // The declared schema, then the one the ledger pinned.
        for again in [false, true] {
            let s = session(&sdir, 2).await;
            let reg = if again {
                let mut r = reg.clone();
                r.schema = None;
                r
            } else {
                reg.clone()
            };
            s.register_csv("t", &f, reg).await.unwrap();
            let (_, _, t) = s.tables().into_iter().find(|t| t.0 == "t").unwrap();
            assert!(
                !t.field(0).is_nullable() && !t.field(1).is_nullable(),
                "{t:?}"
            );
            got.push(answer(&s, sql).await);
            got.push(groups(&s, "t").await.into_iter().map(|g| vec![g]).collect());
        }
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[0][0][0][..3],
        ["1204", "1204", "1204"],
        "no NULL, every row stays"
    );
    assert!(
        answers[0][1].contains(&vec![String::new()]),
        "the group \"\""
    );
}

/// Round 47: a private Parquet column declared NOT NULL over a file's nullable column reads a
/// NULL, and a value that does not fit the declared type, as the type's default (0): the
/// queries answer as over the file with 0 written there.
#[tokio::test]
async fn a_not_null_parquet_column_reads_its_types_default() {
    let dir = temp_dir("readers-parquet-not-null");
    let declared = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
    let sql = "SELECT round(dp_count(x, epsilon => 1e4)), \
               round(dp_sum(x, 0, 10, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for odd in [true, false] {
        let sdir = dir.join(format!("s{odd}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let f = sdir.join("t");
        std::fs::create_dir_all(&f).unwrap();
        if odd {
            write_parquet(
                &f.join("a.parquet"),
                vec![Some(1), None, Some(3_000_000_000), Some(4)],
            );
        } else {
            write_parquet(&f.join("a.parquet"), vec![1, 0, 0, 4]);
        }
        let s = session(&sdir, 2).await;
        s.register_parquet("t", &f, private().schema(declared.clone()))
            .await
            .unwrap();
        answers.push(answer(&s, sql).await);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0][0], "4", "no NULL");
}

/// Round 47 (open): a file of a private Parquet directory that lacks a column declared NOT
/// NULL, or in which it is all NULL, should read the default as well. The adapter does so
/// (`owner::tests::parquet_adaptation_fills_a_not_null_column_with_its_default`), but with
/// `datafusion.execution.collect_statistics` on (DataFusion's default) the Parquet reader
/// replaced a column its file statistics say is constant (all NULL, missing) by a NULL literal
/// before the adapter saw it, and the read failed: sessions set
/// `execution.collect_statistics = false` (src/session/mod.rs).
#[tokio::test]
async fn a_parquet_file_without_a_not_null_column_reads_its_default() {
    let dir = temp_dir("readers-parquet-missing");
    let declared = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
    let sql = "SELECT round(dp_count(x, epsilon => 1e4)), \
               round(dp_sum(x, 0, 10, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for odd in [true, false] {
        let sdir = dir.join(format!("s{odd}"));
        let f = sdir.join("t");
        std::fs::create_dir_all(&f).unwrap();
        write_parquet(&f.join("a.parquet"), vec![1, 4]);
        if odd {
            write_parquet_column(&f.join("b.parquet"), "y", vec![5, 6]);
            write_parquet(&f.join("c.parquet"), vec![None, None]);
        } else {
            write_parquet(&f.join("b.parquet"), vec![0, 0]);
            write_parquet(&f.join("c.parquet"), vec![0, 0]);
        }
        let s = session(&sdir, 2).await;
        s.register_parquet("t", &f, private().schema(declared.clone()))
            .await
            .unwrap();
        answers.push(answer(&s, sql).await);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0][0], "6", "no NULL");
}

/// The error a registration gives (it must fail).
async fn refusal(
    r: impl std::future::Future<Output = datafusion::common::Result<impl Sized>>,
) -> String {
    match r.await {
        Ok(_) => panic!("the registration was accepted"),
        Err(e) => e.to_string(),
    }
}

/// Round 47 (review "fix-readers" F1): a type whose safe cast can still fail on one value is
/// refused at the registration of a private file table, naming the column, the type and what
/// to declare: a dictionary with an Int8 key (its key overflows once a batch holds 129
/// distinct values) over CSV, over Parquet declared, and in a Parquet file's own schema
/// (inferred, as pandas writes categoricals); a list with non-null items over CSV (a value that
/// does not convert is a NULL item, which the list refuses). Before, the read failed after the
/// charge on the file with one more distinct value, or with one item `zz`.
#[tokio::test]
async fn a_type_a_safe_cast_can_fail_to_produce_is_refused_at_registration() {
    use datafusion::arrow::array::{DictionaryArray, StringArray};
    use datafusion::arrow::datatypes::Int8Type;
    use dpfusion::datafusion::parquet::arrow::ArrowWriter;
    let dir = temp_dir("readers-partial-types");
    let s = session(&dir, 2).await;
    let dict8 = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
    let csv = dir.join("t.csv");
    let mut text = String::from("g,v\n");
    for i in 0..1000 {
        text.push_str(&format!("v{},{i}\n", i % 128));
    }
    std::fs::write(&csv, text).unwrap();
    let declared = |g: DataType| {
        Arc::new(Schema::new(vec![
            Field::new("g", g, true),
            Field::new("v", DataType::Int64, true),
        ]))
    };
    let e = refusal(s.register_csv("t", &csv, private().schema(declared(dict8.clone())))).await;
    assert!(
        e.contains("column 'g'")
            && e.contains("Dictionary(Int8, Utf8)")
            && e.contains("Dictionary(Int32, Utf8)"),
        "{e}"
    );
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, false)));
    let e = refusal(s.register_csv("t", &csv, private().schema(declared(list)))).await;
    assert!(
        e.contains("column 'g'") && e.contains("List(non-null Int64)") && e.contains("List(Int64)"),
        "{e}"
    );
    // Parquet: a Utf8 file under a declared Int8 dictionary, and a file whose own schema has one.
    let utf8 = dir.join("utf8.parquet");
    let own = dir.join("own.parquet");
    for (path, dict) in [(&utf8, false), (&own, true)] {
        let values: Vec<String> = (0..200).map(|i| format!("v{}", i % 100)).collect();
        let column: datafusion::arrow::array::ArrayRef = if dict {
            Arc::new(
                values
                    .iter()
                    .map(|v| v.as_str())
                    .collect::<DictionaryArray<Int8Type>>(),
            )
        } else {
            Arc::new(StringArray::from(values))
        };
        let schema = Arc::new(Schema::new(vec![Field::new(
            "g",
            column.data_type().clone(),
            true,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![column]).unwrap();
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let pinned = Arc::new(Schema::new(vec![Field::new("g", dict8, true)]));
    for (path, reg) in [(&utf8, private().schema(pinned)), (&own, private())] {
        let e = refusal(s.register_parquet("p", path, reg)).await;
        assert!(
            e.contains("column 'g'")
                && e.contains("Dictionary(Int8, Utf8)")
                && e.contains("32-bit key"),
            "{}: {e}",
            path.display()
        );
    }
    assert!(s.tables().is_empty(), "nothing registered");
}

/// Round 47 (review "fix-readers" F1): a dictionary with a 32-bit key still registers, declared
/// and then pinned in the ledger, and reads 300 distinct values (more than an 8-bit key holds).
#[tokio::test]
async fn a_dictionary_with_a_32_bit_key_still_registers() {
    let dir = temp_dir("readers-dict32");
    let csv = dir.join("t.csv");
    let mut text = String::from("g,v\n");
    for i in 0..3000 {
        text.push_str(&format!("v{},{i}\n", i % 300));
    }
    std::fs::write(&csv, text).unwrap();
    let dict32 = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let declared = Arc::new(Schema::new(vec![
        Field::new("g", dict32.clone(), true),
        Field::new("v", DataType::Int64, true),
    ]));
    for again in [false, true] {
        let s = session(&dir, 2).await;
        let reg = if again {
            private()
        } else {
            private().schema(declared.clone())
        };
        s.register_csv("t", &csv, reg).await.unwrap();
        let (_, _, t) = s.tables().into_iter().find(|t| t.0 == "t").unwrap();
        assert_eq!(t.field(0).data_type(), &dict32, "{again}");
        assert_eq!(count(&s, "t", "g").await, 3000, "{again}");
    }
}

/// Round 47 (review "fix-readers" F3): a private CSV file whose header's width is not the
/// table's is refused at registration, naming the file: declared one column short, the
/// ledger's pin after the owner added a column to the file, and a directory whose second file
/// has another width at the first registration (inferred). Before, every record of that file
/// read as a row of NULLs and queries charged for nothing.
#[tokio::test]
async fn a_csv_header_of_another_width_is_refused_naming_the_file() {
    let dir = temp_dir("readers-width");
    let f = dir.join("t.csv");
    std::fs::write(&f, "g,v\na,1\nb,2\n").unwrap();
    let s = session(&dir, 2).await;
    let one = Arc::new(Schema::new(vec![Field::new("g", DataType::Utf8, true)]));
    let e = refusal(s.register_csv("t", &f, private().schema(one))).await;
    assert!(
        e.contains("t.csv") && e.contains("has 2 column") && e.contains("has 1 (g)"),
        "{e}"
    );
    // Pinned with two columns, then the file gets a third.
    s.register_csv("t", &f, private()).await.unwrap();
    std::fs::write(&f, "g,v,w\na,1,x\nb,2,y\n").unwrap();
    let s = session(&dir, 2).await;
    let e = refusal(s.register_csv("t", &f, private())).await;
    assert!(
        e.contains("t.csv") && e.contains("has 3 column") && e.contains("(g, v)"),
        "{e}"
    );
    // A directory: the second file is narrower.
    let d = dir.join("d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("a.csv"), "g,v\na,1\n").unwrap();
    std::fs::write(d.join("b.csv"), "g\nb\n").unwrap();
    let e = refusal(s.register_csv("d", &d, private())).await;
    assert!(e.contains("b.csv") && e.contains("has 1 column"), "{e}");
    std::fs::write(d.join("b.csv"), "g,v\nb,2\n").unwrap();
    s.register_csv("d", &d, private()).await.unwrap();
    assert_eq!(count(&s, "d", "v").await, 2);
}

/// `g,s,n`: 1,000 rows of short values, one row `b` whose `s` and `n` are exactly 64 KiB (the
/// default cap), and with `big` one more row `a` whose `s` and `n` are 100 KiB.
fn wide_rows(big: bool) -> Vec<[String; 3]> {
    let mut rows: Vec<[String; 3]> = (0..1000)
        .map(|i| {
            [
                ["a", "b"][i % 2].to_string(),
                format!("s{}", i % 3),
                format!("n{}", i % 2),
            ]
        })
        .collect();
    rows.push(["b".into(), "s".repeat(64 << 10), "n".repeat(64 << 10)]);
    if big {
        rows.push(["a".into(), "z".repeat(100 << 10), "y".repeat(100 << 10)]);
    }
    rows
}

/// The counts and clipped sums of lengths over `t(g, s, n)`, and its groups by `g` and by `s`.
async fn wide_answers(
    s: &PrivateSession,
) -> (Vec<Vec<String>>, BTreeSet<String>, BTreeSet<String>) {
    let sql = "SELECT round(dp_count(1, epsilon => 1e4)), round(dp_count(g, epsilon => 1e4)), \
               round(dp_count(s, epsilon => 1e4)), round(dp_count(n, epsilon => 1e4)), \
               round(dp_sum(length(s), 0, 10, epsilon => 1e4)), \
               round(dp_sum(length(n), 0, 10, epsilon => 1e4)) FROM t";
    let by_s = answer(s, "SELECT s, dp_count(s, epsilon => 1e4) FROM t GROUP BY s")
        .await
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    (answer(s, sql).await, groups(s, "t").await, by_s)
}

/// Round 48 (review "resources" §2): in a private CSV table and a private Parquet table, a value
/// over `max_value_bytes` (100 KiB against the default 64 KiB) reads as NULL in a nullable
/// column (`s`) and as "" in a column declared NOT NULL (`n`), while its row's other value (`g`),
/// a value of exactly 64 KiB and every other row read as they are: D′ (with that row) answers as
/// D but for the row's own count. With the cap raised to 256 KiB the value reads whole. Before,
/// nothing bounded a value (so the guard's bound of 32 copies of a row was none in bytes).
#[tokio::test]
async fn a_private_value_over_max_value_bytes_reads_as_null_or_its_default() {
    use dpfusion::datafusion::parquet::arrow::ArrowWriter;
    let dir = temp_dir("readers-value-cap");
    for parquet in [false, true] {
        // Parquet reads strings as views: Utf8View declared, the cap's other layout.
        let text = if parquet {
            DataType::Utf8View
        } else {
            DataType::Utf8
        };
        let declared = Arc::new(Schema::new(vec![
            Field::new("g", text.clone(), true),
            Field::new("s", text.clone(), true),
            Field::new("n", text.clone(), false),
        ]));
        let mut answers = vec![];
        for (big, cap) in [(false, None), (true, None), (true, Some(256 << 10))] {
            let sdir = dir.join(format!("{parquet}-{big}-{cap:?}"));
            std::fs::create_dir_all(&sdir).unwrap();
            let rows = wide_rows(big);
            let f = if parquet {
                let f = sdir.join("t.parquet");
                let column = |k: usize| -> datafusion::arrow::array::ArrayRef {
                    Arc::new(datafusion::arrow::array::StringArray::from_iter_values(
                        rows.iter().map(|r| r[k].as_str()),
                    ))
                };
                let schema = Arc::new(Schema::new(vec![
                    Field::new("g", DataType::Utf8, true),
                    Field::new("s", DataType::Utf8, true),
                    Field::new("n", DataType::Utf8, false),
                ]));
                let batch =
                    RecordBatch::try_new(schema.clone(), vec![column(0), column(1), column(2)])
                        .unwrap();
                let mut w =
                    ArrowWriter::try_new(std::fs::File::create(&f).unwrap(), schema, None).unwrap();
                w.write(&batch).unwrap();
                w.close().unwrap();
                f
            } else {
                let f = sdir.join("t.csv");
                let mut csv = String::from("g,s,n\n");
                for r in &rows {
                    csv.push_str(&r.join(","));
                    csv.push('\n');
                }
                std::fs::write(&f, csv).unwrap();
                f
            };
            let mut o = options(&sdir, 2);
            if let Some(cap) = cap {
                o = o.with_max_value_bytes(cap);
            }
            let s = PrivateSession::open(o).await.unwrap();
            let reg = private().schema(declared.clone());
            if parquet {
                s.register_parquet("t", &f, reg).await.unwrap();
            } else {
                s.register_csv("t", &f, reg).await.unwrap();
            }
            answers.push(wide_answers(&s).await);
        }
        let [d, d1, raised] = &answers[..] else {
            unreachable!()
        };
        let counts = |a: &(Vec<Vec<String>>, _, _)| a.0[0].clone();
        assert_eq!(
            counts(d),
            ["1001", "1001", "1001", "1001", "2010.0", "2010.0"],
            "{parquet}: the 64 KiB values read whole"
        );
        assert_eq!(
            counts(d1),
            ["1002", "1002", "1001", "1002", "2010.0", "2010.0"],
            "{parquet}: s over the cap is NULL, n (NOT NULL) is \"\" (length 0), g stays"
        );
        assert_eq!(
            counts(raised),
            ["1002", "1002", "1002", "1002", "2020.0", "2020.0"],
            "{parquet}: under a cap of 256 KiB the value reads whole"
        );
        let groups_of = |a: &(_, BTreeSet<String>, BTreeSet<String>)| (a.1.clone(), a.2.clone());
        assert_eq!(
            groups_of(d),
            groups_of(d1),
            "{parquet}: every other row as it is"
        );
        assert_eq!(
            d.2.iter().filter(|g| g.len() == 2).count(),
            3,
            "{parquet}: {:?}",
            d.2.iter().map(String::len).collect::<Vec<_>>()
        );
    }
}

/// Round 48: `max_value_bytes` is the owner's. The Rust API refuses a session with a cap
/// outside 1 KiB to 256 MiB, saying so; analyst SQL cannot set it.
#[tokio::test]
async fn max_value_bytes_is_the_owners_and_within_its_range() {
    let dir = temp_dir("readers-value-cap-owner");
    for bad in [0, 1023, (256 << 20) + 1] {
        let e = PrivateSession::open(options(&dir, 2).with_max_value_bytes(bad))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "max_value_bytes must be from 1024 (1 KiB) to 268435456 (256 MiB), got {bad}"
            )),
            "{e}"
        );
    }
    let s = session(&dir, 2).await;
    for sql in [
        "SET dpfusion.max_value_bytes = 268435456",
        "SET datafusion.dpfusion.max_value_bytes = 268435456",
    ] {
        let e = s.sql(sql).await.unwrap_err().to_string();
        assert!(e.contains("is not allowed"), "{sql}: {e}");
    }
}

/// Round 48 (review "resources" §2), the reviewer's attack scaled down: `t(s, x)` of 2,000
/// short rows, and D′ with one more row whose `s` is 4 MiB (one person's free text). A
/// `GROUP BY` of 32 copies of `s` (admitted: the guard bounds an expression by 32 copies of a
/// row) at a memory limit of 64 MiB and 2 partitions answers on both, with the same groups: the
/// value reads as NULL (a group of one row, not released). The control: with the cap at its
/// largest (256 MiB, as before round 48 nothing bounded the value), D′ fails with the fixed
/// message (its key of 128 MiB cannot fit the pool) while D answers: success or failure then
/// told whether the person's row was there.
#[tokio::test]
async fn one_large_private_value_cannot_make_an_admitted_group_by_fail() {
    let dir = temp_dir("readers-value-cap-attack");
    let key = vec!["s"; 32].join(" || ");
    let sql = format!(
        "SELECT k, dp_count(x, epsilon => 1) AS n FROM (SELECT {key} AS k, x FROM t) GROUP BY k"
    );
    let mut outcomes = vec![];
    for cap in [None, Some(256 << 20)] {
        for big in [false, true] {
            let sdir = dir.join(format!("{cap:?}-{big}"));
            std::fs::create_dir_all(&sdir).unwrap();
            let f = sdir.join("t.csv");
            let mut csv = String::from("s,x\n");
            for i in 0..2000 {
                csv.push_str(&format!("job{},{}\n", i % 20, i % 7));
            }
            if big {
                csv.push_str(&"z".repeat(4 << 20));
                csv.push_str(",1\n");
            }
            std::fs::write(&f, csv).unwrap();
            let mut o = options(&sdir, 2).with_memory_limit(64 << 20);
            if let Some(cap) = cap {
                o = o.with_max_value_bytes(cap);
            }
            let s = PrivateSession::open(o).await.unwrap();
            s.register_csv("t", &f, private()).await.unwrap();
            let outcome = match s.sql(&sql).await {
                Ok(r) => Ok(r
                    .batches
                    .iter()
                    .flat_map(|b| {
                        (0..b.num_rows())
                            .map(|i| array_value_to_string(b.column(0), i).unwrap())
                            .collect::<Vec<_>>()
                    })
                    .collect::<BTreeSet<String>>()),
                Err(e) => Err(e.to_string()),
            };
            outcomes.push(((cap, big), outcome));
        }
    }
    let [(_, d), (_, d1), (_, uncapped_d), (_, uncapped_d1)] = &outcomes[..] else {
        unreachable!()
    };
    let d = d.as_ref().expect("D answers");
    assert_eq!(d.len(), 20, "{d:?}");
    assert_eq!(d1.as_ref().expect("D′ answers"), d, "the same groups");
    assert_eq!(uncapped_d.as_ref().expect("D answers, uncapped"), d);
    let e = uncapped_d1
        .as_ref()
        .expect_err("the control: D′ fails without the cap");
    assert!(e.contains(dpfusion::session::EXECUTION_FAILED), "{e}");
}

/// A Parquet file written with parquet's own writer, every column annotated as text and holding
/// `values` (`s`, `v`, `d`, `j` optional, `n` required, `j` annotated JSON; the list `l` holds
/// each value as its one item, the struct `st` as its field `f`). Arrow's writer cannot write
/// such a file (its strings are UTF-8); pyarrow's `binary().view(string())` writes the same.
fn write_text_parquet(path: &Path, values: &[&[u8]], dictionary: bool) {
    use dpfusion::datafusion::parquet::data_type::{ByteArray, ByteArrayType};
    use dpfusion::datafusion::parquet::file::properties::WriterProperties;
    use dpfusion::datafusion::parquet::file::writer::SerializedFileWriter;
    use dpfusion::datafusion::parquet::schema::parser::parse_message_type;
    let message = "message t {
        optional binary s (STRING);
        required binary n (UTF8);
        optional binary v (STRING);
        optional binary d (STRING);
        optional binary j (JSON);
        optional group l (LIST) { repeated group list { optional binary element (STRING); } }
        optional group st { optional binary f (STRING); }
    }";
    let schema = Arc::new(parse_message_type(message).unwrap());
    let props = WriterProperties::builder()
        .set_dictionary_enabled(dictionary)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, Arc::new(props)).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let bytes: Vec<ByteArray> = values.iter().map(|v| ByteArray::from(v.to_vec())).collect();
    let n = values.len();
    // Leaf order: s, n, v, d, j, l.list.element, st.f; each value present at its leaf's
    // definition level (1 for a top-level optional leaf, 0 for n, 3 in the list, 2 in st).
    let levels: [(Option<i16>, bool); 7] = [
        (Some(1), false),
        (None, false),
        (Some(1), false),
        (Some(1), false),
        (Some(1), false),
        (Some(3), true),
        (Some(2), false),
    ];
    for (def, repeated) in levels {
        let mut c = rg.next_column().unwrap().unwrap();
        let defs = def.map(|d| vec![d; n]);
        let reps = repeated.then(|| vec![0i16; n]);
        c.typed::<ByteArrayType>()
            .write_batch(&bytes, defs.as_deref(), reps.as_deref())
            .unwrap();
        c.close().unwrap();
    }
    assert!(rg.next_column().unwrap().is_none());
    rg.close().unwrap();
    w.close().unwrap();
}

/// Round 51 (review "limits" F2): a private Parquet table whose text columns hold, on D′, one
/// more row whose value is not UTF-8 (bytes FF FE) answers on D and on D′, charged once a
/// query: the value reads as NULL (one fewer counted than rows), or in the column declared NOT
/// NULL as "" (counted, and found by `= ''`), whatever the declared text type (Utf8, Utf8View,
/// a dictionary), over a JSON column, inside a list and a struct, dictionary-encoded or plain.
/// Before, parquet-rs checked UTF-8 while decoding and every query reading the column failed
/// after its charge on D′ only.
#[tokio::test]
async fn a_parquet_text_value_that_is_not_utf8_reads_as_null() {
    let dir = temp_dir("readers-parquet-utf8");
    let text = |name: &str, t: DataType, nullable: bool| Field::new(name, t, nullable);
    let declared = Arc::new(Schema::new(vec![
        text("s", DataType::Utf8, true),
        text("n", DataType::Utf8, false),
        text("v", DataType::Utf8View, true),
        text(
            "d",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        text("j", DataType::Utf8, true),
        Field::new_list("l", Field::new_list_field(DataType::Utf8, true), true),
        Field::new_struct("st", vec![Field::new("f", DataType::Utf8, true)], true),
    ]));
    let sql = [
        "SELECT round(dp_count(s, epsilon => 1e4)), round(dp_count(n, epsilon => 1e4)), \
         round(dp_count(v, epsilon => 1e4)), round(dp_count(d, epsilon => 1e4)), \
         round(dp_count(j, epsilon => 1e4)) FROM t",
        "SELECT round(dp_count(n, epsilon => 1e4)) FROM t WHERE n = ''",
        "SELECT round(dp_count(l, epsilon => 1e4)), \
         round(dp_count(get_field(st, 'f'), epsilon => 1e4)) FROM t",
    ];
    for dictionary in [true, false] {
        let mut answers = vec![];
        for odd in [false, true] {
            let sdir = dir.join(format!("s{dictionary}-{odd}"));
            std::fs::create_dir_all(&sdir).unwrap();
            let f = sdir.join("t.parquet");
            let mut values: Vec<&[u8]> = vec![b"a", b"b", b"c"];
            if odd {
                values.push(&[0xFF, 0xFE]);
            }
            write_text_parquet(&f, &values, dictionary);
            let s = session(&sdir, 2).await;
            s.register_parquet("t", &f, private().schema(declared.clone()))
                .await
                .unwrap();
            let mut a = vec![];
            for q in sql {
                let charges = s.ledger().unwrap().len();
                a.push(answer(&s, q).await);
                assert_eq!(s.ledger().unwrap().len(), charges + 1, "{q}: charged once");
            }
            answers.push(a);
        }
        let [d, d1] = [&answers[0], &answers[1]];
        assert_eq!(d[0], vec![vec!["3"; 5]], "{dictionary}: D");
        assert_eq!(
            d1[0],
            vec![vec!["3", "4", "3", "3", "3"]],
            "{dictionary}: D′, the value not UTF-8 is NULL, or \"\" under NOT NULL"
        );
        assert_eq!((&d[1][0][0], &d1[1][0][0]), (&"0".into(), &"1".into()));
        assert_eq!(
            d[2],
            vec![vec!["3", "3"]],
            "{dictionary}: D, list and struct"
        );
        assert_eq!(
            d1[2],
            vec![vec!["4", "3"]],
            "{dictionary}: D′, the list read (its item NULL), the struct's field NULL"
        );
    }
}

/// Round 51 (review "limits" F1, CSV): the CSV reader does not hold a value over
/// `max_value_bytes` (crate::files::csv_total drops it as it reads). `t(g, s, n, x)` of 1,000
/// short rows (D), and D′ with one more row whose `s` is 5 MB of quoted text holding quotes,
/// delimiters and line ends, whose `n` (declared NOT NULL) is 5 MB, and whose `x` (Int64) is
/// the number 7 padded with 70,000 zeros: at the default cap (64 KiB) D′ reads the same rows
/// as D plus that row, `s` NULL, `n` "" and `x` NULL (a CSV field over the cap reads as a
/// missing value whatever the column's type), `g` as it is, and every other row as it is.
/// Under the owner's cap raised to 8 MiB the row reads whole (`x` is 7): the cap that bounds
/// the reader is the owner's.
#[tokio::test]
async fn a_csv_value_over_max_value_bytes_is_not_held_by_the_reader() {
    let dir = temp_dir("readers-csv-value-cap");
    let declared = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("n", DataType::Utf8, false),
        Field::new("x", DataType::Int64, true),
    ]));
    let sql = "SELECT round(dp_count(1, epsilon => 1e4)), round(dp_count(g, epsilon => 1e4)), \
               round(dp_count(s, epsilon => 1e4)), round(dp_count(n, epsilon => 1e4)), \
               round(dp_count(x, epsilon => 1e4)), round(dp_sum(x, 0, 10, epsilon => 1e4)), \
               round(dp_sum(length(n), 0, 10, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for (big, cap) in [(false, None), (true, None), (true, Some(8 << 20))] {
        let sdir = dir.join(format!("{big}-{cap:?}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let mut csv = String::from("g,s,n,x\n");
        for i in 0..1000 {
            csv.push_str(&format!(
                "{},s{},n{},{}\n",
                ["a", "b"][i % 2],
                i % 3,
                i % 2,
                i % 5
            ));
        }
        if big {
            csv.push_str("a,\"");
            csv.push_str(&"q,\"\"r\r\n".repeat((5 << 20) / 8));
            csv.push_str("\",");
            csv.push_str(&"y".repeat(5 << 20));
            csv.push(',');
            csv.push_str(&"0".repeat(70_000));
            csv.push_str("7\n");
        }
        let f = sdir.join("t.csv");
        std::fs::write(&f, csv).unwrap();
        let mut o = options(&sdir, 2);
        if let Some(cap) = cap {
            o = o.with_max_value_bytes(cap);
        }
        let s = PrivateSession::open(o).await.unwrap();
        s.register_csv("t", &f, private().schema(declared.clone()))
            .await
            .unwrap();
        answers.push((answer(&s, sql).await, groups(&s, "t").await));
    }
    let [(d, dg), (d1, d1g), (raised, _)] = &answers[..] else {
        unreachable!()
    };
    assert_eq!(
        d[0],
        ["1000", "1000", "1000", "1000", "1000", "2000.0", "2000.0"]
    );
    assert_eq!(
        d1[0],
        ["1001", "1001", "1000", "1001", "1000", "2000.0", "2000.0"],
        "s is NULL, n is \"\" (length 0), x is NULL, g is as it is"
    );
    assert_eq!(dg, d1g, "the same groups");
    assert_eq!(
        raised[0],
        ["1001", "1001", "1001", "1001", "1001", "2007.0", "2010.0"],
        "under the owner's cap of 8 MiB the row reads whole"
    );
}

/// Round 51 (reviews "readers" F1 and "filegen" F1, F2), end to end: a directory table pinned
/// from its first file (`l List(Int64)`, `s Struct(a Int32)`, `d Utf8`), and a second file,
/// one person's record, whose `l` is a list of text, whose `s` has no field `a`, and whose `d`
/// is a date arrow cannot write as text. Each query answers on D and on D′ (D plus that file),
/// charged once: the text in the list is read through text ('7' is 7), the struct without the
/// pinned field reads as NULL, the date as NULL.
#[tokio::test]
async fn a_later_file_whose_columns_do_not_fit_the_pin_reads_as_missing_values() {
    use datafusion::arrow::array::{
        ArrayRef, Date32Array, Int32Array, ListBuilder, StringBuilder, StructArray,
    };
    use dpfusion::datafusion::parquet::arrow::ArrowWriter;
    let write = |path: &Path, batch: RecordBatch| {
        let file = std::fs::File::create(path).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    let dir = temp_dir("readers-parquet-later-file");
    let item = |t: DataType| Arc::new(Field::new("item", t, true));
    let base = || {
        let mut l = ListBuilder::new(datafusion::arrow::array::Int64Builder::new())
            .with_field(item(DataType::Int64));
        for v in [1i64, 2, 3] {
            l.values().append_value(v);
            l.append(true);
        }
        let s = StructArray::new(
            vec![Field::new("a", DataType::Int32, true)].into(),
            vec![Arc::new(Int32Array::from(vec![4, 5, 6])) as ArrayRef],
            None,
        );
        RecordBatch::try_from_iter_with_nullable(vec![
            ("l", Arc::new(l.finish()) as ArrayRef, true),
            ("s", Arc::new(s) as ArrayRef, true),
            (
                "d",
                Arc::new(datafusion::arrow::array::StringArray::from(vec![
                    "x", "y", "z",
                ])) as ArrayRef,
                true,
            ),
        ])
        .unwrap()
    };
    let odd = || {
        let mut l = ListBuilder::new(StringBuilder::new()).with_field(item(DataType::Utf8));
        l.values().append_value("7");
        l.append(true);
        let s = StructArray::new(
            vec![Field::new("b", DataType::Int32, true)].into(),
            vec![Arc::new(Int32Array::from(vec![9])) as ArrayRef],
            None,
        );
        RecordBatch::try_from_iter_with_nullable(vec![
            ("l", Arc::new(l.finish()) as ArrayRef, true),
            ("s", Arc::new(s) as ArrayRef, true),
            (
                "d",
                Arc::new(Date32Array::from(vec![1_000_000_000])) as ArrayRef,
                true,
            ),
        ])
        .unwrap()
    };
    let sql = "SELECT round(dp_count(l, epsilon => 1e4)), round(dp_sum(l[1], 0, 10, epsilon => \
               1e4)), round(dp_count(get_field(s, 'a'), epsilon => 1e4)), \
               round(dp_count(d, epsilon => 1e4)) FROM t";
    let mut answers = vec![];
    for later in [false, true] {
        let sdir = dir.join(format!("s{later}"));
        let data = sdir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        write(&data.join("a.parquet"), base());
        let s = session(&sdir, 2).await;
        s.register_parquet("t", &data, private()).await.unwrap();
        if later {
            write(&data.join("b.parquet"), odd());
        }
        let charges = s.ledger().unwrap().len();
        answers.push(answer(&s, sql).await);
        assert_eq!(s.ledger().unwrap().len(), charges + 1, "charged once");
    }
    assert_eq!(answers[0], vec![vec!["3", "6.0", "3", "3"]]);
    assert_eq!(answers[1], vec![vec!["4", "13.0", "3", "3"]], "D′");
}
