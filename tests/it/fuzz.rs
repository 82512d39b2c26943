//! The differential fuzzer (issue 26): a grammar-based generator of SQL over the private fragment
//! and far beyond it, run against **neighbouring datasets** D and D′ — one planted row added or
//! changed, or one planted unit added, per the table's relation — in two fresh sessions with
//! separate ledgers and the same insecure noise seed. The oracle is "nothing observable differs
//! except the noise":
//!
//! - the same outcome on D and D′: success, the one fixed failure message, or the same refusal
//!   text (error text equality is the strongest general oracle: it covers every refusal, every
//!   planning error and every message that could carry a value);
//! - no panic, no hang;
//! - no planted value (`ZQXPLANT`, `987654.32…`, id 987654) in an output cell or message of D′
//!   that D does not show too (the query text itself may name them), nor in the raw bytes of its
//!   result's arrays (every buffer, at every depth: round 50, [`raw_markers`]);
//! - the same result schema; the same ledger delta (tables, ε, δ, events) on D and D′, equal to
//!   the cost `EXPLAIN PRIVACY` declared; `EXPLAIN PRIVACY` itself identical on D and D′;
//! - the released groups: the same set and order when no partition selection was charged (the
//!   groups are public), and the same relative order of the common groups always (columns the
//!   generator names `k0`, `k1`, …), unless the query itself orders or filters by noisy values;
//! - a result that involved no noise at all (nothing charged) identical cell by cell;
//! - a refused statement charged nothing and planned no scan of a private table; a statement that
//!   scanned a private table and succeeded has a charge; the fixed failure message comes only
//!   with a charge.
//!
//! - in the large-group mode, the class of each released value (NULL, NaN, ±inf, other) where
//!   both sides released the same keys in the same order ([`class_differs`]); a statement whose
//!   success depends on noisy values (a narrowing CAST of a release) may succeed on one side and
//!   give the fixed failure on the other (`Flags::noisy_outcome`).
//!
//! The data (round 52, review "gengaps"): besides `people`, `staff` (Int64, Float64, Utf8,
//! Boolean) and the unit tables `orders`/`visits`, `events` has 300 rows in three groups of 100
//! per key, with Decimal128, Date32, Timestamp and List columns, read as keys (`date_trunc`,
//! decimals, dates) and as DP arguments through casts; its filter is `rdp`, so every mechanism is
//! admitted there. Planted rows and units carry extreme values in every column ([`Extremes`]:
//! NaN, ±inf, -0.0, 1e308, i64 extremes, empty, non-ASCII and long text, NULLs, empty and long
//! lists). A fifth of the cases are the large-group mode (`Gen::big`: ε 8–50, so partition
//! selection keeps the groups on both sides), which mostly combines releases
//! ([`Gen::combine`]: set operations, DISTINCT, key orders with DESC and NULLS FIRST/LAST,
//! LIMIT/OFFSET, joins of two releases, windows with PARTITION BY, chained CTEs, casts); the
//! grammar also writes BigQuery's `SELECT WITH DIFFERENTIAL_PRIVACY` clause ([`Gen::bigquery`]),
//! the DP-SGD fits and the predict functions, over released models and over private rows.
//!
//! Failing cases are shrunk (token-level delta debugging while the same kind of finding
//! persists) and kept in `tests/data/fuzz_regressions.sql`, which [`regressions_replay`] runs
//! under every planted neighbour. Classes known to be open (being fixed on other branches) are
//! listed in [`KNOWN_OPEN`]: their findings are counted and printed, not failed, and the
//! constructs that abort the whole process are not generated while their class is open.
//!
//! Modes: the default (CI) runs a fixed seed and a fixed number of cases (about a minute or two
//! on 2 cores). `scripts/fuzz.sh --minutes N [--seed S]` runs the same test with
//! `DPFUSION_FUZZ_MINUTES` / `DPFUSION_FUZZ_SEED` set, for as long as asked, and writes shrunk
//! findings to `DPFUSION_FUZZ_OUT` (default `target/fuzz-findings.sql`). `DPFUSION_FUZZ_CASES`
//! overrides the number of cases, `DPFUSION_FUZZ_VERBOSE=1` prints every statement, its outcome
//! and time, and each case's time, `DPFUSION_FUZZ_SHRINK_OPEN=1` shrinks the first example of
//! each known open class too. DP-SGD with `noise => 'independent'`, whose σ is calibrated at
//! every planning by a search of seconds in a debug build, is generated in the long mode only.
use crate::common::{TestPath, test_dir_in};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpfusion::accounting::FilterKind;
use dpfusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use dpfusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::arrow::util::display::array_value_to_string;
use dpfusion::session::EXECUTION_FAILED;
use dpfusion::{PrivateSession, Registration, SessionOptions};
use futures::FutureExt;

// ---------------------------------------------------------------------------------------------
// Known open classes
// ---------------------------------------------------------------------------------------------

/// A class of findings known to be open (fixed on another branch): the CI oracle counts its
/// findings instead of failing. The coordinator removes an entry once its fix is merged.
struct Open {
    class: &'static str,
    reason: &'static str,
    /// Whether a finding belongs to the class.
    matches: fn(&Case, &Finding) -> bool,
    /// Constructs of this class abort the process (no catch is possible): they are generated
    /// only once the entry is removed (or with `DPFUSION_FUZZ_ABORTS=1`).
    aborts: bool,
}

// Empty: the five classes this fuzzer found open on the code before issue 26's fixes
// (arrow_cast_alloc, subquery_unseen, outer_join_private_on, unit_join_keys_not_total,
// release_order) are fixed; their shrunk cases stay in tests/data/fuzz_regressions.sql and now
// must pass the oracle like every other case.
const KNOWN_OPEN: &[Open] = &[];

/// The statement a finding is about.
fn last_or<'a>(c: &'a Case, f: &Finding) -> &'a str {
    c.statements
        .get(f.statement)
        .or(c.statements.last())
        .map(String::as_str)
        .unwrap_or("")
}

fn open_class(case: &Case, f: &Finding) -> Option<&'static str> {
    KNOWN_OPEN
        .iter()
        .find(|o| (o.matches)(case, f))
        .map(|o| o.class)
}

fn class_is_open(class: &str) -> bool {
    std::env::var("DPFUSION_FUZZ_ABORTS").is_err()
        && KNOWN_OPEN.iter().any(|o| o.class == class && o.aborts)
}

// ---------------------------------------------------------------------------------------------
// RNG
// ---------------------------------------------------------------------------------------------

/// SplitMix64: small, seeded, good enough to pick grammar branches.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// True with probability `pct` percent.
    fn pct(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

// ---------------------------------------------------------------------------------------------
// Data: D and its neighbours
// ---------------------------------------------------------------------------------------------

const PLANT_ID: i64 = 987_654;
const PLANT_SALARY: f64 = 987_654.321;
/// What, seen in D′'s output or messages and not in D's, shows that a planted value leaked.
const MARKERS: &[&str] = &["zqxplant", "987654.32", "987654"];

/// How D′ differs from D.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plant {
    /// `people` (add_remove): one more row, of an existing department.
    PeopleRow,
    /// `people`: one more row, of a department no other row has (a new group).
    PeopleNewGroup,
    /// `people`: one more row made to fail: age 0 (division by zero), salary and dept NULL.
    PeopleFailing,
    /// `staff` (replace, `dept` public): row 3's private values changed.
    StaffChanged,
    /// `staff`: row 3 changed into a failing one (age 0, salary NULL).
    StaffFailing,
    /// `orders`/`visits` (unit `customer`, one domain): one more unit with rows in both.
    Unit,
    /// One more unit whose rows fail (amount 0, pages 0, NULL item) and that has many rows.
    UnitFailing,
    /// `people`: one more row, first, whose every column holds an extreme value ([`Extremes`]):
    /// NaN, ±inf, -0.0, 1e308, i64 extremes, empty, non-ASCII and long text, NULLs (round 52,
    /// review "gengaps": the planted values were all ordinary).
    PeopleExtreme,
    /// `orders`/`visits`: one more unit of 50 rows of extreme values.
    UnitExtreme,
    /// `events` (the table of typed columns and large groups): one more row, first, of extreme
    /// values in every column, its keys those of an existing group or extreme ones.
    EventsRow,
}

const PLANTS: &[Plant] = &[
    Plant::PeopleRow,
    Plant::PeopleNewGroup,
    Plant::PeopleFailing,
    Plant::StaffChanged,
    Plant::StaffFailing,
    Plant::Unit,
    Plant::UnitFailing,
    Plant::PeopleExtreme,
    Plant::UnitExtreme,
    Plant::EventsRow,
];

impl Plant {
    /// The private table the change is in (the generator prefers it).
    fn table(self) -> &'static str {
        match self {
            Plant::PeopleRow
            | Plant::PeopleNewGroup
            | Plant::PeopleFailing
            | Plant::PeopleExtreme => "people",
            Plant::StaffChanged | Plant::StaffFailing => "staff",
            Plant::Unit | Plant::UnitFailing | Plant::UnitExtreme => "orders",
            Plant::EventsRow => "events",
        }
    }
}

#[derive(Clone)]
struct Person {
    id: Option<i64>,
    age: Option<i64>,
    dept: Option<String>,
    salary: Option<f64>,
    remote: Option<bool>,
    name: Option<String>,
}

const DEPTS: &[&str] = &["eng", "hr", "ops", "sales"];

fn persons(n: i64, mult: i64) -> Vec<Person> {
    (1..=n)
        .map(|i| Person {
            id: Some(i),
            age: Some(20 + (i * mult) % 45),
            dept: Some(DEPTS[((i * mult) % 4) as usize].to_string()),
            salary: Some(30_000.0 + ((i * 7919 * mult) % 90_000) as f64 + 0.25),
            remote: if i % 11 == 0 { None } else { Some(i % 3 == 0) },
            name: Some(format!("n{i}")),
        })
        .collect()
}

fn planted_person(age: Option<i64>, dept: Option<&str>, salary: Option<f64>) -> Person {
    Person {
        id: Some(PLANT_ID),
        age,
        dept: dept.map(str::to_string),
        salary,
        remote: Some(true),
        name: Some("ZQXPLANT".to_string()),
    }
}

fn person_batch(rows: &[Person]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("age", DataType::Int64, true),
        Field::new("dept", DataType::Utf8, true),
        Field::new("salary", DataType::Float64, true),
        Field::new("remote", DataType::Boolean, true),
        Field::new("name", DataType::Utf8, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.age).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.dept.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(Float64Array::from(
            rows.iter().map(|r| r.salary).collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            rows.iter().map(|r| r.remote).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
        )),
    ];
    RecordBatch::try_new(schema, cols).unwrap()
}

/// (customer, number, text) rows of `orders` (amount, item) or `visits` (pages, site).
type UnitRow = (Option<i64>, Option<f64>, Option<String>);

fn unit_batch(rows: &[UnitRow], num: &str, num_type: DataType, text: &str) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("customer", DataType::Int64, true),
        Field::new(num, num_type.clone(), true),
        Field::new(text, DataType::Utf8, true),
    ]));
    let n: ArrayRef = match num_type {
        DataType::Int64 => Arc::new(Int64Array::from(
            rows.iter()
                .map(|r| r.1.map(|x| x as i64))
                .collect::<Vec<_>>(),
        )),
        _ => Arc::new(Float64Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
    };
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            n,
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn orders_rows() -> Vec<UnitRow> {
    let items = ["book", "pen", "cup"];
    let mut v = vec![];
    for c in 1..=20i64 {
        for j in 0..(1 + c % 4) {
            v.push((
                Some(c),
                Some(5.0 + ((c * 13 + j * 7) % 50) as f64),
                Some(items[((c + j) % 3) as usize].to_string()),
            ));
        }
    }
    v
}

fn visits_rows() -> Vec<UnitRow> {
    let sites = ["a.com", "b.com"];
    let mut v = vec![];
    for c in 1..=25i64 {
        for j in 0..(1 + c % 3) {
            v.push((
                Some(c),
                Some((1 + (c * 5 + j) % 9) as f64),
                Some(sites[((c + j) % 2) as usize].to_string()),
            ));
        }
    }
    v
}

/// The extreme values a planted row or unit carries (round 52, review "gengaps": NaN, ±inf,
/// -0.0, 1e308, i64 extremes, empty, non-ASCII and long text were never in the private data).
/// Each planted column picks one from its list by the case's seed, so that a case and its shrunk
/// forms plant the same values.
struct Extremes(Rng);

const X_FLOATS: &[Option<f64>] = &[
    Some(f64::NAN),
    Some(f64::INFINITY),
    Some(f64::NEG_INFINITY),
    Some(-0.0),
    Some(1e308),
    Some(-1e308),
    Some(5e-324),
    None,
    Some(PLANT_SALARY),
];
const X_INTS: &[Option<i64>] = &[
    Some(i64::MIN),
    Some(i64::MAX),
    None,
    Some(0),
    Some(-1),
    Some(PLANT_ID),
];

impl Extremes {
    fn new(seed: u64) -> Self {
        Extremes(Rng(seed ^ 0x5252_5252))
    }
    fn float(&mut self) -> Option<f64> {
        X_FLOATS[self.0.below(X_FLOATS.len())]
    }
    fn int(&mut self) -> Option<i64> {
        X_INTS[self.0.below(X_INTS.len())]
    }
    /// Text: empty, NULL, combining characters and an emoji, quotes and a newline, or a few KB;
    /// most carry the marker.
    fn text(&mut self) -> Option<String> {
        match self.0.below(7) {
            0 => Some(String::new()),
            1 => None,
            2 => Some("e\u{301}\u{1F600}ZQXPLANT\u{200B}".to_string()),
            3 => Some("a\nb,\"c'ZQXPLANT".to_string()),
            4 => Some("ZQXPLANT".repeat(1 + self.0.below(512))),
            5 => Some("\u{0}ZQXPLANT".to_string()),
            _ => Some("ZQXPLANT".to_string()),
        }
    }
    /// `Some(ordinary)` with probability `pct`, else one of `extremes`.
    fn or<T: Clone>(&mut self, pct: u64, ordinary: T, extremes: &[T]) -> T {
        if self.0.pct(pct) {
            ordinary
        } else {
            extremes[self.0.below(extremes.len())].clone()
        }
    }
}

/// A row of `events` (round 52): keys of every type the other tables lack, three groups of 100
/// rows per key, and values of those types, so that keys and DP arguments of decimals, dates,
/// timestamps and lists are read from private rows, and partition selection at a high ε keeps
/// every group on both sides (review "gengaps": 40–60 rows at ε ≤ 1 released nothing).
#[derive(Clone)]
struct Event {
    id: Option<i64>,
    k: Option<String>,
    /// Decimal128(10, 2), in hundredths.
    kdec: Option<i128>,
    /// Date32, days since 1970-01-01.
    kdate: Option<i32>,
    /// Timestamp(Microsecond, None).
    kts: Option<i64>,
    b: Option<bool>,
    x: Option<f64>,
    n: Option<i64>,
    s: Option<String>,
    /// Decimal128(20, 4), in ten-thousandths.
    dx: Option<i128>,
    l: Option<Vec<Option<i64>>>,
}

const EVENT_ROWS: i64 = 300;
const EVENT_KEYS: &[&str] = &["a", "b", "c"];
/// 2020-01-01 in days and in microseconds.
const DAY_2020: i32 = 18_262;
const US_PER_DAY: i64 = 86_400_000_000;

fn event(i: i64) -> Event {
    let j = i % 3;
    Event {
        id: Some(i + 1),
        k: Some(EVENT_KEYS[j as usize].to_string()),
        kdec: Some([100, 250, 375][j as usize]),
        kdate: Some(DAY_2020 + j as i32),
        // Hours within the group's day: `date_trunc('day', kts)` and `CAST(kts AS DATE)` make
        // the three groups.
        kts: Some((DAY_2020 as i64 + j) * US_PER_DAY + (i % 24) * 3_600_000_000),
        b: Some(j == 0),
        x: Some((i % 50) as f64 + 0.5),
        n: Some(i % 40),
        s: Some(format!("v{}", i % 7)),
        dx: Some((i % 50) as i128 * 10_000 + 25),
        l: Some(vec![Some(i % 5), Some(j)]),
    }
}

/// The planted row of `events`: extreme values in every column; its keys those of group `b`, or
/// (each apart) extreme ones.
fn planted_event(x: &mut Extremes) -> Event {
    let b = event(1);
    Event {
        id: Some(PLANT_ID),
        k: x.or(
            60,
            b.k.clone(),
            &[
                None,
                Some(String::new()),
                Some("e\u{301}\u{1F600}ZQXPLANT".into()),
                Some("ZQXPLANT".repeat(300)),
            ],
        ),
        kdec: x.or(
            60,
            b.kdec,
            &[None, Some(9_999_999_999), Some(-9_999_999_999), Some(0)],
        ),
        kdate: x.or(
            60,
            b.kdate,
            &[None, Some(i32::MAX), Some(i32::MIN), Some(0)],
        ),
        kts: x.or(60, b.kts, &[None, Some(i64::MAX), Some(i64::MIN), Some(0)]),
        b: x.or(60, b.b, &[None]),
        x: x.float(),
        n: x.int(),
        s: x.text(),
        dx: x.or(
            0,
            None,
            &[
                None,
                Some(99_999_999_999_999_999_999),
                Some(-99_999_999_999_999_999_999),
                Some(0),
            ],
        ),
        l: x.or(
            0,
            None,
            &[
                None,
                Some(vec![]),
                Some(vec![None]),
                Some((0..1000).map(Some).collect()),
                Some(vec![Some(i64::MAX), Some(i64::MIN)]),
            ],
        ),
    }
}

fn event_batch(rows: &[Event]) -> RecordBatch {
    use dpfusion::arrow::array::{
        Date32Array, Decimal128Array, ListArray, TimestampMicrosecondArray,
    };
    use dpfusion::arrow::datatypes::{Int64Type, TimeUnit};
    let col = |f: fn(&Event) -> Option<i128>, p: u8, s: i8| -> ArrayRef {
        Arc::new(
            Decimal128Array::from(rows.iter().map(f).collect::<Vec<_>>())
                .with_precision_and_scale(p, s)
                .unwrap(),
        )
    };
    let list = ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().map(|r| r.l.clone()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("k", DataType::Utf8, true),
        Field::new("kdec", DataType::Decimal128(10, 2), true),
        Field::new("kdate", DataType::Date32, true),
        Field::new(
            "kts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("b", DataType::Boolean, true),
        Field::new("x", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("dx", DataType::Decimal128(20, 4), true),
        Field::new(
            "l",
            dpfusion::arrow::array::Array::data_type(&list).clone(),
            true,
        ),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.k.clone()).collect::<Vec<_>>(),
        )),
        col(|r| r.kdec, 10, 2),
        Arc::new(Date32Array::from(
            rows.iter().map(|r| r.kdate).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(
            rows.iter().map(|r| r.kts).collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            rows.iter().map(|r| r.b).collect::<Vec<_>>(),
        )),
        Arc::new(Float64Array::from(
            rows.iter().map(|r| r.x).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.n).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.s.clone()).collect::<Vec<_>>(),
        )),
        col(|r| r.dx, 20, 4),
        Arc::new(list),
    ];
    RecordBatch::try_new(schema, cols).unwrap()
}

fn strings_batch(cols: &[(&str, Vec<&str>)], ints: &[(&str, Vec<i64>)]) -> RecordBatch {
    let mut fields = vec![];
    let mut arrays: Vec<ArrayRef> = vec![];
    for (n, v) in cols {
        fields.push(Field::new(*n, DataType::Utf8, true));
        arrays.push(Arc::new(StringArray::from(v.clone())));
    }
    for (n, v) in ints {
        fields.push(Field::new(*n, DataType::Int64, true));
        arrays.push(Arc::new(Int64Array::from(v.clone())));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

/// A fresh directory for one session's ledger (on tmpfs when there is one: the ledger syncs).
fn session_dir() -> TestPath {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    test_dir_in(&base, "fuzz")
}

/// Whether a case's `people` is a Parquet file (a third of the cases; the regressions' seed 1
/// reads it from memory).
fn stored_as_parquet(seed: u64) -> bool {
    seed % 3 == 2
}

/// `batch` as a Parquet file of row groups of `rows` rows (so that row-group statistics differ
/// between D and D′).
fn write_parquet(path: &Path, batch: &RecordBatch, rows: usize) {
    use dpfusion::datafusion::parquet::arrow::ArrowWriter;
    use dpfusion::datafusion::parquet::file::properties::WriterProperties;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The private tables (their scan counters are the oracle's "nothing executed").
const PRIVATE: &[&str] = &["people", "staff", "orders", "visits", "events"];

/// Opens a fresh session on D (`neighbour` false) or on D′; `events` (and its public key set
/// `kinds`) only when a statement names it (`with_events`): a private registration writes the
/// ledger, and CI's time is counted (round 52).
async fn open(
    plant: Plant,
    neighbour: bool,
    seed: u64,
    with_events: bool,
) -> (PrivateSession, TestPath) {
    let dir = session_dir();
    let s = PrivateSession::open(
        SessionOptions::default()
            .with_ledger(dir.join("ledger.jsonl"))
            .with_default_budget(1e6, 1e-3)
            .with_target_partitions(2)
            .with_memory_limit(1 << 30)
            .with_insecure_noise_seed(seed),
    )
    .await
    .unwrap();
    let mut people = persons(60, 7);
    let mut staff = persons(40, 11);
    let mut orders = orders_rows();
    let mut visits = visits_rows();
    let mut events: Vec<Event> = (0..EVENT_ROWS).map(event).collect();
    if neighbour {
        match plant {
            // First: hash aggregation's first-seen group order would change.
            Plant::PeopleRow => {
                people.insert(0, planted_person(Some(61), Some("eng"), Some(PLANT_SALARY)))
            }
            Plant::PeopleNewGroup => people.push(planted_person(
                Some(44),
                Some("ZQXPLANT"),
                Some(PLANT_SALARY),
            )),
            Plant::PeopleFailing => people.insert(0, planted_person(Some(0), None, None)),
            Plant::StaffChanged | Plant::StaffFailing => {
                let dept = staff[3].dept.clone();
                let (age, salary) = if plant == Plant::StaffChanged {
                    (Some(63), Some(PLANT_SALARY))
                } else {
                    (Some(0), None)
                };
                staff[3] = Person {
                    dept,
                    ..planted_person(age, None, salary)
                };
            }
            Plant::Unit => {
                for j in 0..3 {
                    orders.insert(
                        5 * j,
                        (Some(PLANT_ID), Some(PLANT_SALARY), Some("ZQXPLANT".into())),
                    );
                }
                visits.push((Some(PLANT_ID), Some(7.0), Some("ZQXPLANT".into())));
            }
            Plant::UnitFailing => {
                for j in 0..40 {
                    orders.insert(j, (Some(PLANT_ID), Some(0.0), None));
                }
                visits.insert(0, (Some(PLANT_ID), Some(0.0), Some("zqxplant.com".into())));
            }
            Plant::PeopleExtreme => {
                let mut x = Extremes::new(seed);
                let p = Person {
                    id: Some(PLANT_ID),
                    age: x.int(),
                    dept: x.or(
                        60,
                        Some("eng".to_string()),
                        &[
                            None,
                            Some(String::new()),
                            Some("e\u{301}\u{1F600}".into()),
                            Some("ZQXPLANT".repeat(300)),
                        ],
                    ),
                    salary: x.float(),
                    remote: x.or(50, Some(true), &[None]),
                    name: x.text(),
                };
                people.insert(0, p);
            }
            Plant::UnitExtreme => {
                // Every row of the unit extreme, each column cycling through its extremes.
                for j in 0..50 {
                    orders.insert(
                        j,
                        (
                            Some(PLANT_ID),
                            X_FLOATS[j % X_FLOATS.len()],
                            Extremes::new(seed + j as u64).text(),
                        ),
                    );
                }
                for (j, pages) in [9.3e18, -9.3e18, 0.0, -1.0].into_iter().enumerate() {
                    visits.insert(
                        j,
                        (Some(PLANT_ID), Some(pages), Some("zqxplant.com".into())),
                    );
                }
                visits.push((Some(PLANT_ID), None, None));
            }
            Plant::EventsRow => events.insert(0, planted_event(&mut Extremes::new(seed))),
        }
    }
    if stored_as_parquet(seed) {
        // A third of the cases read `people` from a Parquet file of small row groups, whose
        // statistics, pages and pruning the in-memory tables do not have (round 46).
        let file = dir.join("people.parquet");
        write_parquet(&file, &person_batch(&people), 8);
        s.register_parquet("people", &file, Registration::private())
            .await
            .unwrap();
    } else {
        s.register_batches(
            "people",
            vec![person_batch(&people)],
            Registration::private(),
        )
        .unwrap();
    }
    // `events` has the rdp filter, which admits every mechanism (Laplace, quantiles, DP-SGD
    // with Poisson sampling), where the others' default (gdp) takes Gaussian events only.
    let events_reg = || Registration::private().filter(FilterKind::Rdp { order: None });
    if with_events {
        if stored_as_parquet(seed) {
            let file = dir.join("events.parquet");
            write_parquet(&file, &event_batch(&events), 64);
            s.register_parquet("events", &file, events_reg())
                .await
                .unwrap();
        } else {
            s.register_batches("events", vec![event_batch(&events)], events_reg())
                .unwrap();
        }
        s.register_batches(
            "kinds",
            vec![strings_batch(
                &[("k", vec!["a", "b", "c", "d"])],
                &[("w", vec![1, 2, 3, 4])],
            )],
            Registration::public(),
        )
        .unwrap();
    }
    s.register_batches(
        "staff",
        vec![person_batch(&staff)],
        Registration::private().replace().public_columns(["dept"]),
    )
    .unwrap();
    let unit = || {
        Registration::private()
            .privacy_unit("customer")
            .unit_domain("cust")
    };
    s.register_batches(
        "orders",
        vec![unit_batch(&orders, "amount", DataType::Float64, "item")],
        unit(),
    )
    .unwrap();
    s.register_batches(
        "visits",
        vec![unit_batch(&visits, "pages", DataType::Int64, "site")],
        unit(),
    )
    .unwrap();
    s.register_batches(
        "depts",
        vec![strings_batch(
            &[("dept", vec!["eng", "hr", "ops", "sales", "legal"])],
            &[("floor", vec![3, 1, 2, 1, 4])],
        )],
        Registration::public(),
    )
    .unwrap();
    s.register_batches(
        "rooms",
        vec![strings_batch(
            &[
                ("dept", vec!["eng", "eng", "hr"]),
                ("room", vec!["r1", "r2", "r3"]),
            ],
            &[],
        )],
        Registration::public(),
    )
    .unwrap();
    s.register_batches(
        "items",
        vec![strings_batch(
            &[("item", vec!["book", "pen", "cup", "lamp"])],
            &[("price", vec![12, 2, 5, 30])],
        )],
        Registration::public(),
    )
    .unwrap();
    (s, dir)
}

// ---------------------------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------------------------

/// One table in scope: its alias and columns by type.
#[derive(Clone)]
struct Tbl {
    name: &'static str,
    nums: &'static [&'static str],
    strs: &'static [&'static str],
    bools: &'static [&'static str],
    /// Keys of the other types (decimals, dates, timestamps, `date_trunc`), `{q}` the qualifier.
    keys: &'static [&'static str],
    /// DP arguments read from those columns through casts and functions (round 52).
    args: &'static [&'static str],
}

const T_PEOPLE: Tbl = Tbl {
    name: "people",
    nums: &["id", "age", "salary"],
    strs: &["dept", "name"],
    bools: &["remote"],
    keys: &[],
    args: &[],
};
const T_STAFF: Tbl = Tbl {
    name: "staff",
    ..T_PEOPLE
};
const T_ORDERS: Tbl = Tbl {
    name: "orders",
    nums: &["customer", "amount"],
    strs: &["item"],
    bools: &[],
    keys: &[],
    args: &[],
};
const T_VISITS: Tbl = Tbl {
    name: "visits",
    nums: &["customer", "pages"],
    strs: &["site"],
    bools: &[],
    keys: &[],
    args: &[],
};
const T_DEPTS: Tbl = Tbl {
    name: "depts",
    nums: &["floor"],
    strs: &["dept"],
    bools: &[],
    keys: &[],
    args: &[],
};
const T_EVENTS: Tbl = Tbl {
    name: "events",
    nums: &["id", "n", "x", "dx"],
    strs: &["k", "s"],
    bools: &["b"],
    keys: &[
        "{q}.kdec",
        "{q}.kdate",
        "{q}.kts",
        "date_trunc('day', {q}.kts)",
        "CAST({q}.kts AS DATE)",
        "({q}.kdec * 2)",
        "date_trunc('month', {q}.kdate)",
        "date_part('day', {q}.kdate)",
        "{q}.k",
    ],
    args: &[
        "CAST({q}.dx AS DOUBLE)",
        "{q}.dx",
        "CAST({q}.kdec AS DOUBLE)",
        "date_part('day', {q}.kdate)",
        "date_part('epoch', {q}.kts)",
        "CAST({q}.kts AS BIGINT)",
        "CAST({q}.kdate AS INT)",
        "cardinality({q}.l)",
        "{q}.l[1]",
        "array_length({q}.l)",
        "length({q}.s)",
        "CAST({q}.n AS DECIMAL(20, 2))",
        "CAST({q}.x AS DECIMAL(10, 2))",
        "coalesce({q}.x, 0)",
        "({q}.dx * 2)",
        "CAST({q}.n AS DOUBLE)",
    ],
};
/// The public key set of `events`' `k` (with one key, `d`, no private row has).
const T_KINDS: Tbl = Tbl {
    name: "kinds",
    nums: &["w"],
    strs: &["k"],
    bools: &[],
    keys: &[],
    args: &[],
};
const T_ITEMS: Tbl = Tbl {
    name: "items",
    nums: &["price"],
    strs: &["item"],
    bools: &[],
    keys: &[],
    args: &[],
};

/// What the generator knows about the released rows of a query.
#[derive(Clone, Copy, Debug, Default)]
struct Flags {
    /// The rows kept depend on noisy values (HAVING/WHERE on a release, LIMIT after a noisy
    /// ORDER BY, …): the set of released keys is not compared.
    noisy_rows: bool,
    /// The rows are ordered by noisy values: their order is not compared.
    noisy_order: bool,
    /// Order-sensitive consumers of a release (windows, aggregates, an inner `ORDER BY … LIMIT`)
    /// over a tie that carries no noise (`v0 * 0`), in columns named `ox_*`: functions of the
    /// released keys alone, compared exactly between D and D′ (round 47, review "fuzzgaps" F1:
    /// they saw the order in which the hash aggregate met the private rows).
    exact: bool,
    /// Whether the statement succeeds or fails (the fixed message, after the charge) depends on
    /// noisy values: a narrowing CAST of a release fits or not by the noise (round 52, review
    /// "gengaps": `CAST(dp_variance(…) AS BIGINT)` failed on D or on D′ by the noise alone).
    /// Success on one side and the fixed failure on the other is then no finding.
    noisy_outcome: bool,
    /// The class of each released value (NULL, NaN, ±inf, other) is compared between D and D′
    /// where both released the same keys in the same order: set in the large-group mode, whose
    /// ε and groups leave the noise no way to make a NaN, an infinity or a NULL, so that one
    /// shown on one side only came from the planted extremes (round 52).
    classes: bool,
}

/// One fuzz case: a plant and a few statements run in order on D and on D′.
#[derive(Clone, Debug)]
struct Case {
    plant: Plant,
    seed: u64,
    statements: Vec<String>,
    flags: Flags,
}

struct Gen<'r> {
    rng: &'r mut Rng,
    /// Tables in scope of the current SELECT: (qualifier, table).
    scope: Vec<(String, Tbl)>,
    flags: Flags,
    /// The planted table (preferred).
    plant: Plant,
    /// Wild cases use every construct and garbage freely; tame ones mostly stay in (or near)
    /// the private fragment, so that many get admitted and run.
    wild: bool,
    /// The next SELECT groups: an order-sensitive consumer of a release needs its keys.
    keyed: bool,
    /// Large groups (round 52, review "gengaps"): a tame case at a high ε, so that partition
    /// selection keeps the groups (of `events`' 100 rows, `people`'s 15) on both sides and the
    /// group-set and order checks bite; it mostly combines releases ([`Gen::combine`]).
    big: bool,
}

const SANE_EPS: &[&str] = &["0.1", "0.5", "1", "0.25"];
/// ε of the large-group mode (round 52).
const BIG_EPS: &[&str] = &["20", "50", "50", "8"];
const SANE_DELTA: &[&str] = &["1e-7", "1e-8", "1e-6"];
const GARBAGE: &[&str] = &[
    "0",
    "-1",
    "NULL",
    "'x'",
    "CAST('NaN' AS DOUBLE)",
    "CAST('inf' AS DOUBLE)",
    "1e300",
    "1e-300",
    "age",
    "(SELECT 1)",
    "(SELECT max(salary) FROM people)",
    "(SELECT dp_count(id, epsilon => 0.1) FROM people)",
    "arrow_cast(1, 'Float16')",
    "99999999999999999999",
    "3",
    "'gaussian'",
    "'laplace'",
    "'units:1:1'",
    "'replace'",
    "'add_remove'",
    "true",
    "[1, 2]",
    "2147483648",
    "0.5 + 0.5",
    "-0.0",
    "1e7",
    "1e-7",
    "0.1 + 0.2",
    "CAST(1 AS DECIMAL(38, 37))",
    "''",
    "now()",
];

impl Gen<'_> {
    /// True with probability `pct` percent in a wild case, never in a tame one.
    fn wild(&mut self, pct: u64) -> bool {
        self.wild && self.rng.pct(pct)
    }

    fn col(&mut self, kind: char) -> String {
        // A column of the other types through a cast or a function (round 52).
        if kind == 'n' && self.rng.pct(25) {
            let typed: Vec<String> = self
                .scope
                .iter()
                .flat_map(|(q, t)| t.args.iter().map(move |a| a.replace("{q}", q)))
                .collect();
            if !typed.is_empty() {
                return typed[self.rng.below(typed.len())].clone();
            }
        }
        let mut cands = vec![];
        for (q, t) in &self.scope {
            let cols = match kind {
                'n' => t.nums,
                's' => t.strs,
                _ => t.bools,
            };
            for c in cols {
                cands.push(format!("{q}.{c}"));
            }
        }
        if cands.is_empty() {
            return match kind {
                'n' => "1".into(),
                's' => "'eng'".into(),
                _ => "true".into(),
            };
        }
        cands.swap_remove(self.rng.below(cands.len()))
    }

    fn scalar_subquery(&mut self) -> String {
        self.rng
            .pick(&[
                "(SELECT 1)",
                "(SELECT count(*) FROM depts)",
                "(SELECT max(floor) FROM depts)",
                "(SELECT min(price) FROM items WHERE item = 'pen')",
                "(SELECT dp_count(id, epsilon => 0.1) FROM people)",
                "(SELECT dp_sum(amount, 0, 10, epsilon => 0.1) FROM orders)",
                "(SELECT max(salary) FROM people)",
                "(SELECT count(*) FROM people WHERE name = 'ZQXPLANT')",
                "(SELECT CAST(string_agg(name, ',') AS BIGINT) FROM people)",
                "(SELECT CAST(min(name) AS BIGINT) FROM staff)",
                "(SELECT sum(amount) FROM orders)",
                "(SELECT count(*) FROM visits WHERE pages = 0)",
                "(SELECT 1 FROM people WHERE age = 0)",
                "(SELECT age FROM people LIMIT 1)",
                "(SELECT floor FROM depts)",
            ])
            .to_string()
    }

    /// An attacker's predicate aimed at the planted row or unit (distinctive values).
    fn targeted(&mut self) -> String {
        let (q, t) = self.scope[self
            .rng
            .below(self.scope.len().max(1))
            .min(self.scope.len().saturating_sub(1))]
        .clone();
        if self.rng.pct(50) && !t.strs.is_empty() {
            let c = t.strs[self.rng.below(t.strs.len())];
            let v = self
                .rng
                .pick(&["= 'ZQXPLANT'", "IS NULL", "LIKE 'zqx%'", "<> 'ZQXPLANT'"]);
            format!("{q}.{c} {v}")
        } else {
            let c = t.nums[self.rng.below(t.nums.len())];
            let v = self
                .rng
                .pick(&["> 900000", "= 0", "= 987654", "= 63", "<> 0"]);
            format!("{q}.{c} {v}")
        }
    }

    /// A scalar subquery that reads a private table raw (an attack on the guard), of a type
    /// that fits the position.
    fn private_probe(&mut self) -> String {
        self.rng
            .pick(&[
                "(SELECT CAST(string_agg(name, ',') AS BIGINT) FROM people)",
                "(SELECT count(*) FROM people WHERE name = 'ZQXPLANT')",
                "(SELECT max(age) FROM staff)",
                "(SELECT CAST(max(item) AS BIGINT) FROM orders)",
                "(SELECT count(*) FROM orders WHERE customer = 987654)",
                "(SELECT min(pages) FROM visits)",
                "(SELECT 1 / min(age) FROM people)",
                "(SELECT CAST(min(name) AS VARCHAR) FROM people)",
            ])
            .to_string()
    }

    fn lit_num(&mut self) -> String {
        self.rng
            .pick(&[
                "0",
                "1",
                "2",
                "-1",
                "0.5",
                "100",
                "1e308",
                "2147483647",
                "9223372036854775807",
                "NULL",
                "1e-300",
                "3",
                "50000",
            ])
            .to_string()
    }

    fn arrow_type(&mut self) -> String {
        let mut types = vec![
            "Int8",
            "Int16",
            "Int64",
            "UInt8",
            "Float16",
            "Float32",
            "Float64",
            "Decimal128(38, 10)",
            "Decimal128(3, 2)",
            "Decimal256(76, 0)",
            "Utf8",
            "LargeUtf8",
            "Utf8View",
            "Boolean",
            "Timestamp(Nanosecond, None)",
            "Duration(Second)",
            "Date32",
            "Dictionary(Int8, Utf8)",
            "Interval(MonthDayNano)",
            "Binary",
            "Null",
            "List(Int64)",
            "FixedSizeBinary(3)",
            "Struct(\"a\": Int64)",
        ];
        if !class_is_open("arrow_cast_alloc") {
            types.extend([
                "FixedSizeList(2147483647, Int64)",
                "FixedSizeBinary(2147483647)",
                "FixedSizeList(100000000, Decimal256(76, 0))",
            ]);
        }
        types[self.rng.below(types.len())].to_string()
    }

    fn num(&mut self, d: u32) -> String {
        if !self.wild && self.rng.pct(55) {
            return self.col('n');
        }
        if d == 0 {
            return match self.rng.below(10) {
                0..=5 => self.col('n'),
                6..=8 => self.lit_num(),
                _ => self.scalar_subquery(),
            };
        }
        let d = d - 1;
        match self.rng.below(31) {
            0..=5 => self.col('n'),
            6 => self.lit_num(),
            7 => {
                let op = self.rng.pick(&["+", "-", "*", "/", "%"]);
                format!("({} {op} {})", self.num(d), self.num(d))
            }
            8 => format!("(1 / {})", self.col('n')),
            9 => format!("-{}", self.num(d)),
            10 => {
                let f = self.rng.pick(&[
                    "abs", "round", "sqrt", "ln", "exp", "floor", "ceil", "signum", "cbrt", "log10",
                ]);
                format!("{f}({})", self.num(d))
            }
            11 => format!(
                "power({}, {})",
                self.num(d),
                self.rng.pick(&["2", "0.5", "1000"])
            ),
            12 => format!("coalesce({}, {})", self.num(d), self.lit_num()),
            13 => format!("nullif({}, {})", self.num(d), self.lit_num()),
            14 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.pred(d),
                self.num(d),
                self.num(d)
            ),
            15 => format!(
                "{}({} AS {})",
                self.rng.pick(&["CAST", "TRY_CAST"]),
                self.str_(d),
                self.rng
                    .pick(&["BIGINT", "DOUBLE", "INT", "DECIMAL(10, 2)", "SMALLINT"])
            ),
            16 => format!(
                "CAST({} AS {})",
                self.num(d),
                self.rng
                    .pick(&["INT", "SMALLINT", "DECIMAL(5, 2)", "DOUBLE", "BIGINT"])
            ),
            17 => format!("arrow_cast({}, '{}')", self.num(d), self.arrow_type()),
            18 => format!(
                "{}({})",
                self.rng.pick(&[
                    "length",
                    "char_length",
                    "ascii",
                    "bit_length",
                    "octet_length"
                ]),
                self.str_(d)
            ),
            19 => format!("strpos({}, 'e')", self.str_(d)),
            20 => self.scalar_subquery(),
            21 => format!(
                "{}({}, {})",
                self.rng.pick(&["greatest", "least"]),
                self.num(d),
                self.num(d)
            ),
            22 => self
                .rng
                .pick(&[
                    "count(*) OVER ()",
                    "row_number() OVER (ORDER BY 1)",
                    "random()",
                    "sum(1) OVER ()",
                ])
                .to_string(),
            23 => format!(
                "CASE {} WHEN 'eng' THEN 1 WHEN 'ZQXPLANT' THEN 2 ELSE 0 END",
                self.str_(d)
            ),
            24 => format!("{} << 2", self.num(d)),
            25 => format!(
                "date_part('year', to_timestamp({}))",
                self.rng.pick(&["0", "1e15", "-1e18"])
            ),
            26 => format!("array_length([{}, 2])", self.num(d)),
            27 => format!("{}({})", self.rng.pick(&["isnan", "iszero"]), self.num(d)),
            // A released or literal model applied to private rows (round 52): free inside a
            // DP argument or FILTER, where the model is a constant.
            28 => format!(
                "{}({}, [{}, {}])",
                self.rng.pick(&["linreg_predict", "logreg_predict_proba"]),
                self.rng.pick(&[
                    "named_struct('coefficients', [1.0, 2.0], 'intercept', 0.5)",
                    "named_struct('coefficients', [1e308, -1e308], 'intercept', 0.0)",
                    "named_struct('coefficients', [0.001], 'intercept', 0.0)",
                    "(SELECT dp_linreg_sgd(e.x, [e.x, CAST(e.n AS DOUBLE)], epsilon => 1, \
                     delta => 1e-6, steps => 3, noise => 'mf') FROM events e)",
                ]),
                self.num(0),
                self.num(0)
            ),
            _ => self.col('n'),
        }
    }

    fn str_(&mut self, d: u32) -> String {
        if !self.wild && self.rng.pct(60) {
            return self.col('s');
        }
        if d == 0 {
            return match self.rng.below(6) {
                0..=3 => self.col('s'),
                _ => self.rng.pick(&["'eng'", "'x'", "''", "'ZQX'"]).to_string(),
            };
        }
        let d = d - 1;
        match self.rng.below(22) {
            0..=5 => self.col('s'),
            6 => self
                .rng
                .pick(&["'eng'", "'x'", "''", "'ZQXPLANT'"])
                .to_string(),
            7 => format!(
                "{}({})",
                self.rng
                    .pick(&["upper", "lower", "trim", "reverse", "md5", "initcap"]),
                self.str_(d)
            ),
            8 => format!("concat({}, {})", self.str_(d), self.str_(d)),
            9 => format!("({} || {})", self.str_(d), self.str_(d)),
            10 => format!("substr({}, 1, 2)", self.str_(d)),
            11 => format!("CAST({} AS VARCHAR)", self.num(d)),
            12 => format!("arrow_cast({}, '{}')", self.str_(d), self.arrow_type()),
            13 => format!("coalesce({}, 'none')", self.str_(d)),
            14 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.pred(d),
                self.str_(d),
                self.str_(d)
            ),
            15 => match self.rng.below(6) {
                0 => format!("repeat({}, 100000)", self.str_(d)),
                1 => format!("lpad({}, 5, 'x')", self.str_(d)),
                2 => format!("regexp_replace({}, 'e', 'E')", self.str_(d)),
                3 => format!("split_part({}, 'e', 1)", self.str_(d)),
                4 => format!("to_hex({})", self.num(d)),
                _ => format!("replace({}, 'e', 'ee')", self.str_(d)),
            },
            16 => "(SELECT max(dept) FROM depts)".to_string(),
            17 => "(SELECT min(name) FROM people)".to_string(),
            18 => format!("left({}, 1)", self.str_(d)),
            19 => format!("arrow_typeof({})", self.num(d)),
            // Longer than the 12 bytes a view holds inline, as a view (`VARCHAR` is `Utf8View`):
            // its bytes sit in the array's shared buffers (round 50, review "metadata" F1).
            20 => format!(
                "CAST(concat({}, '-past-twelve-bytes') AS VARCHAR)",
                self.str_(d)
            ),
            _ => self.col('s'),
        }
    }

    fn pred(&mut self, d: u32) -> String {
        let d = d.saturating_sub(1);
        if !self.wild && self.rng.pct(50) {
            let op = self.rng.pick(&["<", ">", "=", "<>"]);
            return match self.rng.below(4) {
                3 => self.targeted(),
                0 => format!(
                    "{} = {}",
                    self.col('s'),
                    self.rng.pick(&["'eng'", "'hr'", "'book'"])
                ),
                _ => format!(
                    "{} {op} {}",
                    self.col('n'),
                    self.rng.pick(&["30", "40", "50000", "10"])
                ),
            };
        }
        match self.rng.below(24) {
            0..=4 => {
                let op = self.rng.pick(&["<", ">", "=", "<>", "<=", ">="]);
                format!("{} {op} {}", self.num(d), self.num(d))
            }
            5 => format!("{} = {}", self.str_(d), self.str_(d)),
            6 => format!(
                "{} LIKE '{}'",
                self.str_(d),
                self.rng.pick(&["e%", "%Q%", "_", "ZQX%"])
            ),
            7 => format!(
                "{} BETWEEN {} AND {}",
                self.num(d),
                self.lit_num(),
                self.lit_num()
            ),
            8 => format!("({} AND {})", self.pred(d), self.pred(d)),
            9 => format!("({} OR {})", self.pred(d), self.pred(d)),
            10 => format!("NOT ({})", self.pred(d)),
            11 => format!(
                "{} IS {}NULL",
                self.num(d),
                if self.rng.pct(50) { "NOT " } else { "" }
            ),
            12 => format!("{} IN ('eng', 'hr', 'ZQXPLANT')", self.str_(d)),
            13 => {
                if self.scope.iter().any(|(_, t)| !t.bools.is_empty()) {
                    self.col('b')
                } else {
                    "true".into()
                }
            }
            14 => self
                .rng
                .pick(&[
                    "EXISTS (SELECT 1 FROM depts WHERE floor > 2)",
                    "EXISTS (SELECT 1 FROM people WHERE name = 'ZQXPLANT')",
                    "NOT EXISTS (SELECT 1 FROM staff WHERE age = 0)",
                    "EXISTS (SELECT dp_count(id, epsilon => 0.1) FROM people)",
                ])
                .to_string(),
            15 => {
                let sub = self.rng.pick(&[
                    "SELECT dept FROM depts",
                    "SELECT dept FROM depts WHERE floor = 1",
                    "SELECT dept FROM people WHERE salary > 900000",
                    "SELECT dept FROM rooms",
                    "SELECT dept FROM (VALUES ('eng'), ('ops')) v(dept)",
                ]);
                format!(
                    "{} {}IN ({sub})",
                    self.str_(0),
                    if self.rng.pct(30) { "NOT " } else { "" }
                )
            }
            16 => {
                // A correlated subquery over a public table (a semi join).
                match self.scope.iter().find(|(_, t)| t.strs.contains(&"dept")) {
                    Some((q, _)) => format!(
                        "EXISTS (SELECT 1 FROM depts d2 WHERE d2.dept = {q}.dept AND d2.floor > 1)"
                    ),
                    None => "true".into(),
                }
            }
            17 => format!(
                "{} ~ '{}'",
                self.str_(d),
                self.rng.pick(&["^e", "Q.*T", "(a|b)+"])
            ),
            18 => format!("{} > {}", self.num(d), self.scalar_subquery()),
            19 => format!("{} IS NOT DISTINCT FROM {}", self.num(d), self.num(d)),
            20 => format!("{} IN (1, 2, 3, 0)", self.num(d)),
            21 => self.targeted(),
            22 => format!("{} > {}", self.col('n'), self.private_probe()),
            _ => {
                let op = self.rng.pick(&["<", ">", "="]);
                format!("{} {op} {}", self.col('n'), self.lit_num())
            }
        }
    }

    fn param_value(&mut self, name: &str) -> String {
        if self.rng.pct(if self.wild { 12 } else { 1 }) {
            return self.rng.pick(GARBAGE).to_string();
        }
        match name {
            "epsilon" if self.big => self.rng.pick(BIG_EPS),
            "epsilon" => self.rng.pick(SANE_EPS),
            "delta" => self.rng.pick(SANE_DELTA),
            "mechanism" => self.rng.pick(&["'gaussian'", "'laplace'"]),
            "lower" => self.rng.pick(&["0", "-10", "20", "0"]),
            "upper" => self.rng.pick(&["100", "100000", "1000000", "60"]),
            "q" => self.rng.pick(&["0.5", "0.9", "0.1"]),
            "quantiles" => self.rng.pick(&["[0.25, 0.5, 0.75]", "[0.5]"]),
            "bins" => self.rng.pick(&["64", "1024", "8"]),
            "confidence" => self.rng.pick(&["0.9", "0.95", "0.5"]),
            "max_ratio" => "2",
            "min_group_size" => "2",
            "iterations" => "5",
            // DP-SGD, kept to a few steps for CI's time (round 52).
            "steps" => self.rng.pick(&["3", "5"]),
            "sample_rate" => self.rng.pick(&["0.1", "0.5", "1"]),
            "epochs" => "0",
            "clip" => self.rng.pick(&["1", "0.5", "1e100"]),
            "learning_rate" => self.rng.pick(&["0.5", "0.1"]),
            // `'independent'` (the default) calibrates its σ by a search of seconds of CPU in a
            // debug build, at every planning: one case in twenty, for CI's time.
            // Set again in `agg`, by whether a sample rate is given.
            "noise" => "'mf'",
            "hidden" => self.rng.pick(&["2", "3"]),
            "classes" => self.rng.pick(&["2", "3"]),
            _ => "1",
        }
        .to_string()
    }

    /// A call of a DP (or non-DP) aggregate over the scope, and whether it is a number (so
    /// that post-processing arithmetic applies).
    fn agg(&mut self, unit: bool) -> (String, bool) {
        type Spec = (
            &'static str,
            &'static [&'static str],
            &'static [&'static str],
        );
        // name, data kinds ('n' number, 's' text, 'u' unit column, 'f' features), parameters.
        const SPECS: &[Spec] = &[
            ("dp_count", &["n"], &["epsilon", "delta", "mechanism"]),
            ("dp_count", &["s"], &["epsilon", "delta"]),
            ("dp_count_distinct", &["u"], &["epsilon", "delta"]),
            (
                "dp_sum",
                &["n"],
                &["lower", "upper", "epsilon", "delta", "mechanism"],
            ),
            (
                "dp_mean",
                &["n"],
                &["lower", "upper", "epsilon", "delta", "mechanism"],
            ),
            (
                "dp_variance",
                &["n"],
                &["lower", "upper", "epsilon", "delta"],
            ),
            ("dp_stddev", &["n"], &["lower", "upper", "epsilon", "delta"]),
            (
                "dp_quantile",
                &["n"],
                &["lower", "upper", "q", "epsilon", "bins"],
            ),
            ("dp_median", &["n"], &["lower", "upper", "epsilon", "bins"]),
            (
                "dp_quantiles",
                &["n"],
                &["lower", "upper", "quantiles", "epsilon", "bins"],
            ),
            (
                "dp_count_ci",
                &["n"],
                &["epsilon", "delta", "mechanism", "confidence"],
            ),
            (
                "dp_count_distinct_ci",
                &["u"],
                &["epsilon", "delta", "confidence"],
            ),
            (
                "dp_sum_ci",
                &["n"],
                &[
                    "lower",
                    "upper",
                    "epsilon",
                    "delta",
                    "mechanism",
                    "confidence",
                ],
            ),
            (
                "dp_mean_ci",
                &["n"],
                &[
                    "lower",
                    "upper",
                    "epsilon",
                    "delta",
                    "mechanism",
                    "confidence",
                ],
            ),
            (
                "dp_variance_ci",
                &["n"],
                &["lower", "upper", "epsilon", "delta", "confidence"],
            ),
            (
                "dp_stddev_ci",
                &["n"],
                &["lower", "upper", "epsilon", "delta", "confidence"],
            ),
            (
                "rgm_mean_by",
                &["n", "s"],
                &["max_ratio", "epsilon", "delta", "min_group_size"],
            ),
            (
                "dp_linreg_gd",
                &["n", "f"],
                &["epsilon", "delta", "iterations"],
            ),
            ("dp_logreg_agd", &["n", "f"], &["epsilon", "delta"]),
            ("dp_partition_select", &["n"], &["epsilon", "delta"]),
            // DP-SGD (round 52): the parameters in their positional order, `steps` required
            // (CI's time), `epochs` 0 (unset) when given.
            (
                "dp_linreg_sgd",
                &["n", "f"],
                &[
                    "epsilon",
                    "delta",
                    "sample_rate",
                    "steps",
                    "epochs",
                    "clip",
                    "learning_rate",
                    "noise",
                ],
            ),
            (
                "dp_logreg_sgd",
                &["l", "f"],
                &[
                    "epsilon",
                    "delta",
                    "sample_rate",
                    "steps",
                    "epochs",
                    "clip",
                    "learning_rate",
                    "noise",
                ],
            ),
            (
                "dp_mlp_sgd",
                &["l", "f"],
                &[
                    "epsilon",
                    "delta",
                    "hidden",
                    "classes",
                    "sample_rate",
                    "steps",
                    "epochs",
                    "clip",
                    "learning_rate",
                    "noise",
                ],
            ),
        ];
        if self.wild(7) {
            let f = self.rng.pick(&[
                "count",
                "sum",
                "avg",
                "min",
                "max",
                "median",
                "stddev",
                "approx_distinct",
                "bit_xor",
                "array_agg",
                "first_value",
            ]);
            let v = self.num(1);
            return (format!("{f}({v})"), false);
        }
        if self.wild(2) {
            return (format!("string_agg({}, ',')", self.str_(1)), false);
        }
        let (name, data, params) = loop {
            let spec = SPECS[self.rng.below(SPECS.len())];
            let tame_ok = match spec.0 {
                "dp_count_distinct" | "dp_count_distinct_ci" => unit,
                "dp_partition_select" => false,
                "rgm_mean_by" | "dp_linreg_gd" | "dp_logreg_agd" | "dp_linreg_sgd"
                | "dp_logreg_sgd" | "dp_mlp_sgd" => self.rng.pct(30),
                _ => true,
            };
            if self.wild || tame_ok {
                break spec;
            }
        };
        let mut args: Vec<String> = vec![];
        for k in data.iter() {
            args.push(match *k {
                "n" => {
                    let d = self.rng.below(3) as u32;
                    self.num(d)
                }
                "s" => self.str_(1),
                "u" => {
                    if unit && self.rng.pct(80) {
                        self.scope
                            .iter()
                            .find(|(_, t)| t.nums.contains(&"customer"))
                            .map(|(q, _)| format!("{q}.customer"))
                            .unwrap_or_else(|| "customer".into())
                    } else {
                        self.num(1)
                    }
                }
                "l" => match self.rng.below(3) {
                    0 => format!("CASE WHEN {} THEN 1 ELSE 0 END", self.pred(1)),
                    1 => format!("CAST({} AS INT)", self.col('b')),
                    _ => format!("{} % 2", self.col('n')),
                },
                _ => format!("[{}, {}]", self.num(0), self.num(0)),
            });
        }
        // Which parameters are given: all required, optional ones at random, sometimes few.
        let mut given: Vec<(String, String)> = vec![];
        for p in params.iter() {
            let optional = matches!(
                *p,
                "delta"
                    | "mechanism"
                    | "bins"
                    | "confidence"
                    | "min_group_size"
                    | "iterations"
                    | "sample_rate"
                    | "epochs"
                    | "clip"
                    | "learning_rate"
                    | "hidden"
                    | "classes"
            );
            if optional && self.rng.pct(55) {
                continue;
            }
            if !optional && self.wild(2) {
                continue; // a required parameter left out
            }
            given.push((p.to_string(), self.param_value(p)));
        }
        if name.ends_with("_sgd") {
            // `'independent'` (the default) calibrates its σ at every planning by a search that
            // takes seconds in a debug build (up to 18 s for one statement; a few hundred
            // seconds over CI's cases at rates of 0.1 or more): only in the long mode, with a
            // written rate of 0.1 or more; `'mf'` (which refuses a rate) elsewhere.
            let rate = given
                .iter()
                .any(|(n, v)| n == "sample_rate" && matches!(v.as_str(), "0.1" | "0.5" | "1"));
            let independent = rate && long_mode();
            if let Some(noise) = given.iter_mut().find(|(n, _)| n == "noise") {
                noise.1 = if independent { "'independent'" } else { "'mf'" }.to_string();
            }
        }
        // How many given parameters are, from the first, in their positional places.
        let in_place = given
            .iter()
            .zip(params.iter())
            .take_while(|((n, _), p)| n == *p)
            .count();
        if self.wild(4) {
            let extra = self.rng.pick(&[
                "neighbours",
                "foo",
                "epsilon",
                "delta",
                "max_groups_contributed",
                "seed",
            ]);
            let v = self
                .rng
                .pick(&["'replace'", "'units:1:1'", "1", "0.5", "'add_remove'"]);
            given.push((extra.to_string(), v.to_string()));
        }
        // Positional for a prefix, then named (in any order), or all named, or all positional.
        match self.rng.below(4) {
            _ if !self.wild => {
                let cut = self.rng.below(in_place + 1);
                let mut named: Vec<_> = given.split_off(cut);
                for i in (1..named.len()).rev() {
                    let j = self.rng.below(i + 1);
                    named.swap(i, j);
                }
                args.extend(given.into_iter().map(|(_, v)| v));
                args.extend(named.into_iter().map(|(n, v)| format!("{n} => {v}")));
            }
            0 => args.extend(given.into_iter().map(|(_, v)| v)),
            1 => {
                for i in (1..given.len()).rev() {
                    let j = self.rng.below(i + 1);
                    given.swap(i, j);
                }
                args.extend(given.into_iter().map(|(n, v)| format!("{n} => {v}")));
            }
            _ => {
                let cut = self.rng.below(given.len() + 1);
                for (i, (n, v)) in given.into_iter().enumerate() {
                    args.push(if i < cut { v } else { format!("{n} => {v}") });
                }
            }
        }
        let distinct = if self.wild(3) { "DISTINCT " } else { "" };
        let mut call = format!("{name}({distinct}{})", args.join(", "));
        if self.rng.pct(15) {
            call.push_str(&format!(" FILTER (WHERE {})", self.pred(2)));
        }
        if self.wild(3) {
            call.push_str(" OVER ()");
        }
        let model = name.starts_with("dp_linreg") || name.starts_with("dp_logreg");
        if (model || name == "dp_mlp_sgd") && self.rng.pct(50) {
            // A released model, post-processed (round 52).
            let f = if model {
                self.rng.pick(&[
                    "cardinality({m}['coefficients'])",
                    "{m}['intercept'] * 0",
                    "linreg_predict({m}, [1.0, 2.0])",
                    "logreg_predict_proba({m}, [1.0, -2.0])",
                    "linreg_predict({m}, [1.0])",
                ])
            } else {
                self.rng.pick(&[
                    "mlp_predict({m}, [1.0, 2.0])",
                    "cardinality(mlp_predict_proba({m}, [0.5, 2.0]))",
                    "cardinality({m}['weights'])",
                    "{m}['hidden']",
                    "mlp_predict({m}, [1.0])",
                ])
            };
            return (f.replace("{m}", &call), true);
        }
        let mut number = !matches!(
            name,
            "dp_quantiles"
                | "rgm_mean_by"
                | "dp_linreg_gd"
                | "dp_logreg_agd"
                | "dp_linreg_sgd"
                | "dp_logreg_sgd"
                | "dp_mlp_sgd"
        ) && !name.ends_with("_ci");
        if name.ends_with("_ci") && (!self.wild || self.rng.pct(60)) {
            let f = self
                .rng
                .pick(&["value", "lower", "upper", "stddev", "confidence"]);
            call = format!("{call}['{f}']");
            number = true;
        }
        (call, number)
    }

    /// A value over released aggregates (post-processing), named `v{i}`.
    fn value(&mut self, i: usize, unit: bool) -> String {
        let (a, number) = self.agg(unit);
        if !number && !self.wild {
            return format!("{a} AS v{i}");
        }
        let e = match self.rng.below(12) {
            0 => format!("round({a}, 2)"),
            1 => format!("{a} + 1"),
            2 => format!("CASE WHEN {a} > 10 THEN 'big' ELSE 'small' END"),
            3 => format!("{a} * {}", self.scalar_subquery()),
            _ => a,
        };
        format!("{e} AS v{i}")
    }

    /// A FROM clause; sets the scope. Returns (from, private unit tables involved).
    /// The planted table.
    fn planted(&self) -> Tbl {
        match self.plant.table() {
            "people" => T_PEOPLE,
            "staff" => T_STAFF,
            "events" => T_EVENTS,
            _ => T_ORDERS,
        }
    }

    /// A plain private table, the planted one or `events`, most of the time (so that what
    /// combines releases is mostly admitted), else any FROM clause.
    fn plain_from(&mut self) -> (String, bool) {
        if self.rng.pct(30) {
            return self.from();
        }
        let t = if self.rng.pct(50) {
            self.planted()
        } else {
            T_EVENTS
        };
        self.scope = vec![("t".into(), t.clone())];
        (format!("{} t", t.name), t.name == "orders")
    }

    fn from(&mut self) -> (String, bool) {
        let planted = self.planted();
        let base = if self.rng.pct(65) {
            planted
        } else if self.big && self.rng.pct(50) {
            T_EVENTS
        } else {
            [T_PEOPLE, T_STAFF, T_ORDERS, T_VISITS, T_DEPTS, T_EVENTS][self.rng.below(6)].clone()
        };
        let unit = matches!(base.name, "orders" | "visits");
        self.scope = vec![("t".into(), base.clone())];
        let b = base.name;
        // Joins are where the guard's checks meet the most rewrites: more of them.
        let branch = if self.rng.pct(30) {
            9 + self.rng.below(4)
        } else {
            self.rng.below(20)
        };
        let f = match branch {
            0..=7 => format!("{b} t"),
            8 => {
                let p = self.pred(2);
                let tail = self
                    .rng
                    .pick(&["", "", " ORDER BY 1", " LIMIT 3", " OFFSET 1"]);
                format!("(SELECT * FROM {b} t WHERE {p}{tail}) t")
            }
            9..=12 | 17 if b == "events" => {
                // `events` and its public key set (`kinds` has a key no private row has).
                self.scope.push(("r".into(), T_KINDS));
                if branch == 17 || self.rng.pct(40) {
                    if self.rng.pct(50) {
                        "events t RIGHT JOIN kinds r ON t.k = r.k".to_string()
                    } else {
                        "kinds r LEFT JOIN events t ON r.k = t.k".to_string()
                    }
                } else {
                    let kind = self
                        .rng
                        .pick(&["JOIN", "LEFT JOIN", "FULL JOIN", "LEFT SEMI JOIN"]);
                    if kind == "LEFT SEMI JOIN" {
                        self.scope.pop();
                    }
                    let on = match self.rng.below(4) {
                        0 => format!("t.k = r.k AND {}", self.pred(1)),
                        1 => format!("t.k = r.k AND t.n > {}", self.private_probe()),
                        _ => "t.k = r.k".to_string(),
                    };
                    format!("events t {kind} kinds r ON {on}")
                }
            }
            9..=12 if !unit => {
                // A private table joined with a public one.
                let kind = self.rng.pick(&[
                    "JOIN",
                    "INNER JOIN",
                    "LEFT JOIN",
                    "RIGHT JOIN",
                    "FULL JOIN",
                    "LEFT SEMI JOIN",
                    "LEFT ANTI JOIN",
                    "RIGHT SEMI JOIN",
                    "RIGHT ANTI JOIN",
                    "CROSS JOIN",
                    "JOIN",
                    "LEFT JOIN",
                ]);
                let (other, key) = match self.rng.below(5) {
                    0 => ("rooms r", "r"),
                    1 => (
                        "(VALUES ('eng', 1), ('hr', 2), ('ops', 3)) r(dept, floor)",
                        "r",
                    ),
                    _ => ("depts r", "r"),
                };
                let semi_right = kind.starts_with("RIGHT SEMI") || kind.starts_with("RIGHT ANTI");
                let semi_left = kind.starts_with("LEFT SEMI") || kind.starts_with("LEFT ANTI");
                if semi_right {
                    self.scope = vec![];
                }
                if !semi_left {
                    self.scope.push((key.into(), T_DEPTS));
                }
                let on = match self.rng.below(12) {
                    0..=3 => "t.dept = r.dept".to_string(),
                    4 => format!("t.dept = r.dept AND {}", self.pred(1)),
                    9 => format!("t.dept = r.dept AND {}", self.targeted()),
                    10 => format!("t.dept = r.dept || {}", self.private_probe()),
                    11 => format!("t.age = r.floor + {}", self.private_probe()),
                    5 => "upper(t.dept) = upper(r.dept)".to_string(),
                    6 => format!("t.dept = r.dept AND t.age > {}", self.scalar_subquery()),
                    7 => "t.age = r.floor".to_string(),
                    _ => format!("t.dept = r.dept OR {}", self.pred(1)),
                };
                if kind == "CROSS JOIN" {
                    format!("{b} t CROSS JOIN {other}")
                } else if self.rng.pct(20) {
                    // The public side first.
                    format!("{other} {kind} {b} t ON {on}")
                } else {
                    format!("{b} t {kind} {other} ON {on}")
                }
            }
            9..=12 => {
                // Units: two unit tables of one domain, or a unit table and a public one.
                if self.rng.pct(60) {
                    self.scope = vec![("t".into(), T_ORDERS), ("v".into(), T_VISITS)];
                    let kind = self.rng.pick(&[
                        "JOIN",
                        "JOIN",
                        "JOIN",
                        "LEFT JOIN",
                        "RIGHT JOIN",
                        "FULL JOIN",
                        "LEFT SEMI JOIN",
                    ]);
                    let on = match self.rng.below(12) {
                        0..=3 => "t.customer = v.customer".to_string(),
                        8 => "t.customer = v.customer + 0 * (1 / v.pages)".to_string(),
                        9 => "t.customer + CAST(t.item AS BIGINT) * 0 = v.customer".to_string(),
                        10 => format!("t.customer = v.customer AND {}", self.targeted()),
                        11 => format!("t.customer = v.customer + {}", self.private_probe()),
                        4 => "t.customer + 0 = v.customer".to_string(),
                        5 => {
                            "CAST(t.customer AS VARCHAR) = CAST(v.customer AS VARCHAR)".to_string()
                        }
                        6 => format!("t.customer = v.customer AND {}", self.pred(1)),
                        _ => format!("t.customer = v.customer + {}", self.scalar_subquery()),
                    };
                    if kind == "LEFT SEMI JOIN" {
                        self.scope.pop();
                    }
                    format!("orders t {kind} visits v ON {on}")
                } else {
                    self.scope = vec![("t".into(), T_ORDERS), ("i".into(), T_ITEMS)];
                    let kind = self.rng.pick(&["JOIN", "LEFT JOIN", "RIGHT JOIN"]);
                    let on = match self.rng.below(4) {
                        0..=1 => "t.item = i.item".to_string(),
                        2 => format!("t.item = i.item AND {}", self.pred(1)),
                        _ => format!("t.item = i.item AND i.price < {}", self.scalar_subquery()),
                    };
                    format!("orders t {kind} items i ON {on}")
                }
            }
            13 => {
                // Two private tables that are not one unit domain.
                self.scope = vec![("t".into(), T_PEOPLE), ("s".into(), T_STAFF)];
                let on = self
                    .rng
                    .pick(&["t.id = s.id", "t.dept = s.dept", "t.name = s.name"]);
                format!("people t JOIN staff s ON {on}")
            }
            14 if !unit => {
                self.scope = vec![("t".into(), T_PEOPLE)];
                format!(
                    "(SELECT id, age, dept, salary, remote, name FROM people UNION {}SELECT id, \
                     age, dept, salary, remote, name FROM staff) t",
                    if self.rng.pct(70) { "ALL " } else { "" }
                )
            }
            15 => {
                let p = self.pred(1);
                format!(
                    "(SELECT *, {} AS extra FROM {b} t WHERE {p}) t",
                    self.num(1)
                )
            }
            16 => format!("{b} t, depts d2"),
            17 if !unit => {
                // A public key set: the public table's rows, each once.
                self.scope = vec![("t".into(), base.clone()), ("r".into(), T_DEPTS)];
                if self.rng.pct(50) {
                    format!("{b} t RIGHT JOIN depts r ON t.dept = r.dept")
                } else {
                    format!("depts r LEFT JOIN {b} t ON r.dept = t.dept")
                }
            }
            17 if b == "orders" => {
                // A public key set on a unit table: every public row once, whatever the unit
                // bounding keeps (round 48, review "units": groups vanished).
                self.scope = vec![("t".into(), T_ORDERS), ("i".into(), T_ITEMS)];
                if self.rng.pct(50) {
                    "orders t RIGHT JOIN items i ON t.item = i.item".to_string()
                } else {
                    "items i LEFT JOIN orders t ON i.item = t.item".to_string()
                }
            }
            _ => format!("{b} t"),
        };
        let unit = self
            .scope
            .iter()
            .any(|(_, t)| matches!(t.name, "orders" | "visits"));
        (f, unit)
    }

    /// A grouping key expression over the scope.
    fn key(&mut self) -> String {
        // Keys of the other types: decimals, dates, timestamps, `date_trunc` (round 52).
        let typed: Vec<String> = self
            .scope
            .iter()
            .flat_map(|(q, t)| t.keys.iter().map(move |k| k.replace("{q}", q)))
            .collect();
        if !typed.is_empty() && self.rng.pct(50) {
            return typed[self.rng.below(typed.len())].clone();
        }
        if !self.wild && self.rng.pct(60) {
            let kind = if self.rng.pct(85) { 's' } else { 'b' };
            return self.col(kind);
        }
        match self.rng.below(12) {
            0..=5 => self.col('s'),
            6 => self.col('b'),
            7 => format!("{} % 3", self.col('n')),
            8 => format!("upper({})", self.col('s')),
            9 => format!(
                "CASE WHEN {} > 50000 THEN 'hi' ELSE 'lo' END",
                self.col('n')
            ),
            10 => {
                let sub = self.scalar_subquery();
                if sub.contains("dp_") {
                    // A key that carries a release is noisy: which groups and in which order
                    // differ with the noise (fuzz seed 4545 flagged it as GroupsDiffer).
                    self.flags.noisy_rows = true;
                    self.flags.noisy_order = true;
                }
                format!("{} + {sub}", self.col('n'))
            }
            11 if self.rng.pct(50) => {
                // Structs sort by their fields (round 45): a named and an unnamed one.
                if self.rng.pct(50) {
                    format!(
                        "named_struct('d', {}, 'n', {} % 3)",
                        self.col('s'),
                        self.col('n')
                    )
                } else {
                    format!("struct({})", self.col('s'))
                }
            }
            _ => self.str_(1),
        }
    }

    /// A SELECT over the private data (or not), with keys `k*` and releases `v*`.
    fn select(&mut self) -> String {
        let (from, unit) = self.from();
        let grouped = std::mem::take(&mut self.keyed) || self.rng.pct(55);
        let mut items = vec![];
        let mut keys = vec![];
        if grouped {
            for i in 0..1 + self.rng.below(2) {
                let k = self.key();
                items.push(format!("{k} AS k{i}"));
                keys.push(k);
            }
        }
        if self.wild(8) {
            items.push(format!("{} AS raw", self.num(1)));
        }
        for i in 0..1 + self.rng.below(3) {
            items.push(self.value(i, unit));
        }
        let mut q = format!("SELECT {} FROM {from}", items.join(", "));
        if self.rng.pct(35) {
            q.push_str(&format!(" WHERE {}", self.pred(3)));
        }
        if grouped {
            if self.rng.pct(25) {
                let pos: Vec<String> = (1..=keys.len()).map(|i| i.to_string()).collect();
                q.push_str(&format!(" GROUP BY {}", pos.join(", ")));
            } else {
                q.push_str(&format!(" GROUP BY {}", keys.join(", ")));
            }
            if self.rng.pct(8) {
                q.push_str(self.rng.pick(&[
                    " HAVING v0 > 5",
                    " HAVING 1 = 1",
                    " HAVING count(*) > 2",
                ]));
                self.flags.noisy_rows = true;
            }
        } else if self.rng.pct(4) {
            q.push_str(" GROUP BY ()");
        }
        match self.rng.below(10) {
            0 | 1 if grouped => q.push_str(" ORDER BY k0"),
            2 => {
                q.push_str(" ORDER BY v0 DESC");
                self.flags.noisy_order = true;
            }
            3 => q.push_str(" ORDER BY 1"),
            4 if self.rng.pct(30) => {
                let p = self.private_probe();
                q.push_str(&format!(" ORDER BY {p}"));
            }
            _ => {}
        }
        if self.rng.pct(8) {
            q.push_str(self.rng.pick(&[
                " LIMIT 2",
                " LIMIT 1 OFFSET 1",
                " LIMIT 0",
                " LIMIT (SELECT count(*) FROM people WHERE name = 'ZQXPLANT')",
                " LIMIT 1 OFFSET (SELECT min(age) FROM staff)",
            ]));
            self.flags.noisy_rows = true;
        }
        q
    }

    /// An order-sensitive consumer of a release, over a tie that carries no noise: a window
    /// (`row_number`, `lag`, `lead`, `first_value`, `ntile`) ordered by `v0 * 0` or by nothing,
    /// an aggregate (`string_agg`, `array_agg`, `first_value`) of the keys grouped by `v0 * 0`
    /// (with the same aggregate ordered by the keys as a control, `oc_*`), or the keys an inner
    /// `ORDER BY v0 * 0 LIMIT n` keeps. The `ox_*` columns depend on the released keys alone
    /// (Flags::exact; round 47).
    fn order_sensitive(&mut self) -> String {
        const TIES: &[&str] = &[
            "coalesce(v0 * 0, 0)",
            "coalesce(length(CAST(k0 AS VARCHAR)) * 0, 0)",
        ];
        // A tame, grouped release, so that most are admitted and have keys; or a plain count of
        // the planted table by a column with few values, at an ε large enough that partition
        // selection releases its groups (the fuzz tables are small): the neighbour's row at the
        // top of `people` changed the order in which such groups were first met.
        let inner = if self.rng.pct(50) {
            let wild = std::mem::replace(&mut self.wild, false);
            self.keyed = true;
            let inner = self.select();
            self.wild = wild;
            inner
        } else {
            let table = self.plant.table();
            let key = match table {
                "orders" => self.rng.pick(&["t.item", "t.customer % 3"]),
                "events" => self.rng.pick(&[
                    "t.k",
                    "t.kdate",
                    // No space after the comma: the keys are split at ", ".
                    "date_trunc('day',t.kts)",
                    "t.kdec",
                    "t.k, t.b",
                ]),
                _ => self
                    .rng
                    .pick(&["t.dept", "t.remote", "t.age % 3", "t.dept, t.remote"]),
            };
            let keys: Vec<String> = key
                .split(", ")
                .enumerate()
                .map(|(i, k)| format!("{k} AS k{i}"))
                .collect();
            let eps = self.rng.pick(&["4", "8", "20"]);
            let v = match table {
                "orders" => "t.amount",
                "events" => "t.x",
                _ => "t.id",
            };
            format!(
                "SELECT {}, dp_count({v}, epsilon => {eps}) AS v0 FROM {table} t GROUP BY {key}",
                keys.join(", ")
            )
        };
        let clean = !self.flags.noisy_order && !self.flags.noisy_rows;
        let keyed = inner.contains(" AS k0");
        let tie = self.rng.pick(TIES);
        let q = match self.rng.below(3) {
            0 => {
                let order = if self.rng.pct(70) {
                    format!("ORDER BY {tie}")
                } else {
                    String::new()
                };
                let f = if keyed {
                    self.rng.pick(&[
                        "row_number()",
                        "lag(k0)",
                        "lead(k0, 2)",
                        "first_value(k0)",
                        "ntile(3)",
                    ])
                } else {
                    self.rng.pick(&["row_number()", "ntile(3)"])
                };
                let frame = if f.starts_with("first_value") && self.rng.pct(50) {
                    " ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING"
                } else {
                    ""
                };
                format!("SELECT *, {f} OVER ({order}{frame}) AS ox_w FROM ({inner}) r")
            }
            1 => {
                // The controls: the same aggregate in key order (NULLs first, as the guard
                // orders it), and the group set itself, so that a group set partition selection
                // chose differently (a NULL key released on D′ only: seed 4748) gates the
                // comparison.
                let pairs = [
                    (
                        "string_agg(CAST(k0 AS VARCHAR), ',')",
                        "string_agg(CAST(k0 AS VARCHAR), ',' ORDER BY k0 NULLS FIRST)",
                    ),
                    ("array_agg(k0)", "array_agg(k0 ORDER BY k0 NULLS FIRST)"),
                    ("first_value(k0)", "first_value(k0 ORDER BY k0 NULLS FIRST)"),
                ];
                let (f, control) = pairs[self.rng.below(pairs.len())];
                format!(
                    "SELECT {tie} AS z, {f} AS ox_a, {control} AS oc_a, \
                     array_agg(k0 ORDER BY k0 NULLS FIRST) AS oc_s FROM ({inner}) r GROUP BY 1"
                )
            }
            _ => {
                let n = 1 + self.rng.below(3);
                if self.rng.pct(50) {
                    format!(
                        "SELECT string_agg(CAST(k0 AS VARCHAR), ',' ORDER BY k0) AS ox_kept FROM \
                         (SELECT * FROM ({inner}) r ORDER BY {tie} LIMIT {n}) s"
                    )
                } else {
                    format!(
                        "SELECT k0 AS ox_k FROM (SELECT * FROM ({inner}) r ORDER BY {tie} \
                         LIMIT {n}) s WHERE k0 IS NOT NULL"
                    )
                }
            }
        };
        self.flags.exact |= clean;
        q
    }

    /// A tame release grouped by `keys` (named `k0`, …) over `from` (the scope [`Gen::from`]
    /// set), of one value `v0` (every consumer uses it: the guard refuses a DP call whose result
    /// is not used).
    fn release_over(&mut self, from: &str, keys: &[String], unit: bool) -> String {
        let wild = std::mem::replace(&mut self.wild, false);
        let mut items: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} AS k{i}"))
            .collect();
        items.push(self.value(0, unit));
        let mut q = format!("SELECT {} FROM {from}", items.join(", "));
        if self.rng.pct(25) {
            q.push_str(&format!(" WHERE {}", self.pred(2)));
        }
        q.push_str(&format!(" GROUP BY {}", keys.join(", ")));
        self.wild = wild;
        q
    }

    /// What combines or reshapes releases (round 52, review "gengaps": never generated before):
    /// key orders (DESC, NULLS FIRST/LAST), set operations (UNION, INTERSECT, EXCEPT, with and
    /// without ALL), DISTINCT, LIMIT/OFFSET after a key order, a join of two releases, windows
    /// with PARTITION BY, CTEs that refer to one another, casts of released values (narrowing
    /// ones: `Flags::noisy_outcome`), `struct` of a release and UNNEST of `dp_quantiles`.
    fn combine(&mut self) -> String {
        let (from, unit) = self.plain_from();
        let nk = 1 + self.rng.below(2);
        let keys: Vec<String> = (0..nk).map(|_| self.key()).collect();
        let ks = (0..nk)
            .map(|i| format!("k{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let dir = self.rng.pick(&[
            "",
            " DESC",
            " NULLS FIRST",
            " DESC NULLS LAST",
            " ASC NULLS LAST",
            " DESC NULLS FIRST",
        ]);
        let order = (0..nk)
            .map(|i| format!("k{i}{dir}"))
            .collect::<Vec<_>>()
            .join(", ");
        let a = self.release_over(&from, &keys, unit);
        let clean = !self.flags.noisy_order && !self.flags.noisy_rows;
        // A column that uses the release and carries no noise, for the forms that keep only the
        // keys (of any type: the value may be text, a list or a model).
        let z = "coalesce(length(CAST(v0 AS VARCHAR)) * 0, 0) AS z";
        match self.rng.below(12) {
            0 => format!("{a} ORDER BY {order}"),
            1 | 2 => {
                let b = self.release_over(&from, &keys, unit);
                let op = self.rng.pick(&[
                    "UNION",
                    "UNION ALL",
                    "INTERSECT",
                    "INTERSECT ALL",
                    "EXCEPT",
                    "EXCEPT ALL",
                ]);
                let tail = if self.rng.pct(50) {
                    format!(" ORDER BY {order}")
                } else {
                    String::new()
                };
                format!("SELECT {ks}, {z} FROM ({a}) a {op} SELECT {ks}, {z} FROM ({b}) b{tail}")
            }
            3 => format!("SELECT DISTINCT {ks}, {z} FROM ({a}) r ORDER BY {order}"),
            4 => format!(
                "SELECT * FROM ({a}) r ORDER BY {order} LIMIT {} OFFSET {}",
                1 + self.rng.below(3),
                self.rng.below(2)
            ),
            5 => {
                let b = self
                    .release_over(&from, &keys, unit)
                    .replace(" AS v0", " AS u0")
                    .replace(" AS v1", " AS u1");
                let kind = self.rng.pick(&["JOIN", "LEFT JOIN", "FULL JOIN", "JOIN"]);
                let on = (0..nk)
                    .map(|i| format!("(a.k{i} IS NOT DISTINCT FROM b.k{i})"))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                let sel = (0..nk)
                    .map(|i| format!("a.k{i} AS k{i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "SELECT {sel}, a.v0, b.u0 FROM ({a}) a {kind} ({b}) b ON {on} ORDER BY {order}"
                )
            }
            6 => {
                // Windows partitioned by a key: `ox_*` are functions of the released keys alone.
                self.flags.exact |= clean;
                let w = if nk == 2 {
                    format!(
                        "row_number() OVER (PARTITION BY k0 ORDER BY k1{dir}) AS ox_w, count(*) \
                         OVER (PARTITION BY k0) AS ox_c, max(v0) OVER (PARTITION BY k0 ORDER BY \
                         k1 ROWS UNBOUNDED PRECEDING) AS w0"
                    )
                } else {
                    format!(
                        "rank() OVER (PARTITION BY k0 ORDER BY k0) AS ox_w, max(v0) OVER (ORDER \
                         BY k0{dir}) AS w0"
                    )
                };
                format!("SELECT {ks}, {w} FROM ({a}) r")
            }
            7 => format!(
                "WITH a AS ({a}), b AS (SELECT * FROM a WHERE k0 IS NOT NULL), c AS (SELECT {ks}, \
                 {z} FROM b ORDER BY {order} LIMIT {}) SELECT * FROM c ORDER BY {ks}",
                1 + self.rng.below(3)
            ),
            8 => {
                let t = self.rng.pick(&[
                    "BIGINT",
                    "DECIMAL(5, 1)",
                    "SMALLINT",
                    "INT",
                    "VARCHAR",
                    "DOUBLE",
                    "DECIMAL(38, 10)",
                ]);
                // A narrowing cast fits or fails by the noise.
                self.flags.noisy_outcome = true;
                format!("SELECT {ks}, CAST(v0 AS {t}) AS w0 FROM ({a}) r ORDER BY {order}")
            }
            9 => format!("SELECT {ks}, struct(k0, v0) AS w0 FROM ({a}) r ORDER BY {order}"),
            10 => {
                let (lo, hi) = self.bounds();
                format!(
                    "SELECT unnest(dp_quantiles({}, {lo}, {hi}, [0.25, 0.5, 0.75], epsilon => \
                     {})) AS v0 FROM {from}",
                    self.num(1),
                    self.param_value("epsilon")
                )
            }
            _ => format!(
                "SELECT * FROM ({a}) r ORDER BY {order}{}",
                self.rng.pick(&[" LIMIT 0", " OFFSET 1", " LIMIT 100"])
            ),
        }
    }

    /// Contribution bounds for the BigQuery clause and quantiles.
    fn bounds(&mut self) -> (&'static str, &'static str) {
        [("0", "100"), ("0", "100000"), ("-1e9", "1e9"), ("20", "60")][self.rng.below(4)]
    }

    /// BigQuery's `SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (…)` clause (round 52, review
    /// "gengaps": never generated), over the scope's tables, with a unit column where there is
    /// one, and sometimes options or aggregates the clause refuses.
    fn bigquery(&mut self) -> String {
        let (from, unit) = self.plain_from();
        let wild = std::mem::replace(&mut self.wild, false);
        let mut opts = vec![format!("epsilon = {}", self.param_value("epsilon"))];
        if self.rng.pct(70) {
            opts.push(format!("delta = {}", self.rng.pick(SANE_DELTA)));
        }
        if unit && self.rng.pct(70) {
            opts.push("privacy_unit_column = customer".into());
            if self.rng.pct(50) {
                opts.push(format!(
                    "max_groups_contributed = {}",
                    self.rng.pick(&["1", "1", "2"])
                ));
            }
        }
        if wild && self.rng.pct(20) {
            opts.push(
                self.rng
                    .pick(&[
                        "kappa = 2",
                        "group_selection_strategy = PUBLIC_GROUPS",
                        "min_privacy_units_per_group = 3",
                        "privacy_unit_column = id",
                        "epsilon = 1",
                    ])
                    .into(),
            );
        }
        let grouped = self.rng.pct(75);
        let key = self.key();
        let mut items = vec![];
        if grouped {
            items.push(format!("{key} AS k0"));
        }
        for i in 0..1 + self.rng.below(3) {
            let c = self.col('n');
            let (lo, hi) = self.bounds();
            let b = format!("contribution_bounds_per_group => ({lo}, {hi})");
            let f = match self.rng.below(if wild { 9 } else { 7 }) {
                0 => format!("AVG({c}, {b})"),
                1 => format!("SUM({c}, {b})"),
                2 => "COUNT(*)".to_string(),
                3 => format!("COUNT({c})"),
                4 => format!("VAR_POP({c}, {b})"),
                5 => format!("STDDEV_POP({c}, {b})"),
                6 => format!("PERCENTILE_CONT({c}, 0.5, {b})"),
                7 => format!("MAX({c})"),
                _ => format!("COUNT(DISTINCT {c})"),
            };
            items.push(format!("{f} AS v{i}"));
        }
        let mut q = format!(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ({}) {} FROM {from}",
            opts.join(", "),
            items.join(", ")
        );
        if self.rng.pct(25) {
            q.push_str(&format!(" WHERE {}", self.pred(2)));
        }
        if grouped {
            q.push_str(&format!(" GROUP BY {key}"));
            q.push_str(self.rng.pick(&[
                "",
                " ORDER BY k0",
                " ORDER BY k0 DESC NULLS FIRST",
                " ORDER BY k0 NULLS LAST",
            ]));
        }
        self.wild = wild;
        if self.rng.pct(20) {
            self.flags.noisy_rows = true;
            q = format!("SELECT * FROM ({q}) r WHERE r.v0 > 10");
        }
        q
    }

    /// A full query: a SELECT, maybe in a CTE, a wrapper, a union, a window, an order-sensitive
    /// consumer of a release, combined releases, the BigQuery clause.
    fn query(&mut self) -> String {
        if self.big && self.rng.pct(60) {
            return self.combine();
        }
        match self.rng.below(25) {
            0 => {
                let inner = self.select();
                self.flags.noisy_rows = true;
                format!("SELECT * FROM ({inner}) r WHERE r.v0 > 0")
            }
            1 => {
                let inner = self.select();
                format!("SELECT count(*) AS n FROM ({inner}) r")
            }
            2 => {
                let a = self.select();
                let b = self.select();
                self.flags.noisy_order = true;
                self.flags.noisy_rows = true;
                format!("({a}) UNION ALL ({b})")
            }
            3 => {
                let inner = self.select();
                self.flags.noisy_order = true;
                format!("SELECT *, rank() OVER (ORDER BY v0) AS rk FROM ({inner}) r")
            }
            4 => {
                let b = self.rng.pick(&["people", "staff", "orders", "events"]);
                let p = {
                    self.scope = vec![(
                        "c".into(),
                        match b {
                            "people" => T_PEOPLE,
                            "staff" => T_STAFF,
                            "events" => T_EVENTS,
                            _ => T_ORDERS,
                        },
                    )];
                    self.pred(2)
                };
                let v = self.value(0, b == "orders");
                if self.rng.pct(40) {
                    // CTEs that refer to one another (round 52).
                    let p2 = self.pred(1);
                    format!(
                        "WITH c0 AS (SELECT * FROM {b} c WHERE {p}), c AS (SELECT * FROM c0 c \
                         WHERE {p2}) SELECT {v} FROM c"
                    )
                } else {
                    format!("WITH c AS (SELECT * FROM {b} c WHERE {p}) SELECT {v} FROM c")
                }
            }
            5 => {
                let inner = self.select();
                format!("WITH r AS ({inner}) SELECT * FROM r")
            }
            7..=9 => self.order_sensitive(),
            22 | 23 => self.combine(),
            24 => self.bigquery(),
            6 => {
                // Raw rows or a VALUES list.
                let b = self.rng.pick(&["people", "staff", "orders", "depts"]);
                self.rng
                    .pick(&[
                        "SELECT * FROM {b}",
                        "SELECT * FROM {b} LIMIT 1",
                        "SELECT count(*) FROM {b}",
                        "SELECT DISTINCT 1 FROM {b}",
                        "VALUES (1), ((SELECT count(*) FROM {b}))",
                        "SELECT * FROM (VALUES (1, 'a')) v(x, y)",
                        "SELECT 1 WHERE EXISTS (SELECT 1 FROM {b})",
                    ])
                    .replace("{b}", b)
            }
            _ => self.select(),
        }
    }

    /// One case: optional setup statement(s), then the statement under test.
    fn case(&mut self) -> Vec<String> {
        let mut st = vec![];
        match self.rng.below(100) {
            0..=3 => st.push(
                self.rng
                    .pick(&[
                        "SET dpfusion.max_groups_contributed = 3",
                        "SET dpfusion.max_rows_contributed = 2",
                        "SET dpfusion.max_groups_contributed = 0",
                        "SET dpfusion.max_groups_contributed = 1000001",
                        "SET dpfusion.max_rows_contributed = 'x'",
                        "SET dpfusion.max_groups_contributed = DEFAULT",
                    ])
                    .to_string(),
            ),
            4..=5 => st.push(
                self.rng
                    .pick(&[
                        "SET dpfusion.default_delta = 1e-8",
                        "SET dpfusion.default_delta = 0",
                        "SET dpfusion.default_delta = 1",
                        "SET dpfusion.neighbours = 'replace'",
                        "SET datafusion.execution.target_partitions = 1",
                        "SET datafusion.optimizer.enable_dynamic_filter_pushdown = true",
                        "SET datafusion.execution.batch_size = 1",
                    ])
                    .to_string(),
            ),
            6..=7 if self.rng.pct(30) => {
                // A released model stored, then a constant in a later DP query's FILTER over
                // private rows (round 52).
                let (table, tbl) = if self.rng.pct(50) {
                    ("events", T_EVENTS)
                } else {
                    ("people", T_PEOPLE)
                };
                self.scope = vec![("t".into(), tbl)];
                let (y, a, b) = (self.col('n'), self.col('n'), self.col('n'));
                let fit = self.rng.pick(&[
                    "dp_linreg_sgd({y}, [{a}, {b}], epsilon => {e}, delta => 1e-6, steps => 3, \
                     noise => 'mf')",
                    "dp_linreg_sgd({y}, [{a}, {b}], {e}, 1e-6, 0, 3, 0, 1, 0.5, 'mf')",
                    "dp_linreg_gd({y}, [{a}, {b}], epsilon => {e})",
                ]);
                let e = self.param_value("epsilon");
                let fit = fit
                    .replace("{y}", &y)
                    .replace("{a}", &a)
                    .replace("{b}", &b)
                    .replace("{e}", &e);
                st.push(format!(
                    "CREATE TABLE m AS SELECT {fit} AS model FROM {table} t"
                ));
                let (c, d) = (self.col('n'), self.col('n'));
                let e = self.param_value("epsilon");
                st.push(format!(
                    "SELECT dp_count(1, epsilon => {e}) FILTER (WHERE linreg_predict((SELECT \
                     model FROM m), [{c}, {d}]) > 10) AS v0 FROM {table} t"
                ));
                return st;
            }
            6..=7 => {
                let q = self.query();
                st.push(format!("CREATE TABLE res AS {q}"));
                st.push("SELECT * FROM res".to_string());
                return st;
            }
            8 => {
                st.push(
                    self.rng
                        .pick(&[
                            "CREATE VIEW w AS SELECT * FROM people",
                            "CREATE TABLE w AS SELECT * FROM people",
                            "CREATE TABLE w AS SELECT dept FROM staff",
                            "DROP TABLE people",
                            "DESCRIBE people",
                            "SHOW TABLES",
                            "SHOW BUDGET",
                            "COPY (SELECT * FROM people) TO 'x.csv' STORED AS CSV",
                            "INSERT INTO people VALUES (1, 2, 'eng', 3.0, true, 'x')",
                            "CREATE EXTERNAL TABLE w STORED AS CSV LOCATION '/etc/passwd'",
                            "PREPARE p AS SELECT dp_count(id, epsilon => $1) FROM people",
                            "CREATE FUNCTION f(x INT) RETURNS INT RETURN x",
                            "SELECT * FROM dp_ledger()",
                            "SELECT * FROM dp_budget()",
                        ])
                        .to_string(),
                );
                if self.rng.pct(50) {
                    st.push(
                        self.rng
                            .pick(&[
                                "SELECT dp_count(id, epsilon => 0.1) FROM w",
                                "SELECT * FROM w",
                                "EXECUTE p(0.5)",
                                "SELECT * FROM people",
                            ])
                            .to_string(),
                    );
                }
                return st;
            }
            _ => {}
        }
        let q = self.query();
        let prefix = match self.rng.below(100) {
            0..=7 => "EXPLAIN PRIVACY ",
            8..=10 => "EXPLAIN ",
            11..=12 => "EXPLAIN ANALYZE ",
            13 => "EXPLAIN VERBOSE ",
            _ => "",
        };
        st.push(format!("{prefix}{q}"));
        st
    }
}

fn generate(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let plant = PLANTS[rng.below(PLANTS.len())];
    let mut g = Gen {
        rng: &mut rng,
        scope: vec![],
        flags: Flags::default(),
        plant,
        wild: false,
        keyed: false,
        big: false,
    };
    g.big = g.rng.pct(20);
    g.wild = !g.big && g.rng.pct(35);
    g.flags.classes = g.big;
    let statements = g.case();
    let flags = g.flags;
    Case {
        plant,
        seed,
        statements,
        flags,
    }
}

// ---------------------------------------------------------------------------------------------
// Observation and oracle
// ---------------------------------------------------------------------------------------------

/// EXPLAIN PRIVACY of a statement: its rendered rows and, per table, (cost ε, admitted); or the
/// error.
type Explained = Result<(Vec<Vec<String>>, BTreeMap<String, (Option<f64>, bool)>), String>;

/// What an analyst observes of one statement.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok,
    /// The one fixed message of a failed admitted query.
    Failed,
    /// Any other error (a refusal, a planning error): its normalised text.
    Error(String),
    Panic(String),
    Timeout,
}

#[derive(Debug, Clone)]
struct Obs {
    outcome: Outcome,
    columns: Vec<(String, String)>,
    rows: Vec<Vec<String>>,
    /// The charges the statement added to the ledger: (table, ε, δ, events).
    charges: Vec<(String, f64, f64, String)>,
    /// Planned scans of private tables.
    scans: u64,
    /// EXPLAIN PRIVACY of the statement, run just before it: per table (cost ε, admitted), or
    /// the error.
    explain: Option<Explained>,
    /// Planted values in the raw bytes of its result ([`raw_markers`]).
    raw: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Panic,
    Timeout,
    OutcomeDiffers,
    MessageDiffers,
    PlantedLeak,
    ExplainDiffers,
    SchemaDiffers,
    ChargeDiffers,
    ChargeNotDeclared,
    RefusedButCharged,
    RefusedButScanned,
    ReleasedUncharged,
    FailedUncharged,
    GroupsDiffer,
    OrderDiffers,
    NoiselessDiffers,
    ExactDiffers,
    ClassDiffers,
}

#[derive(Debug, Clone)]
struct Finding {
    kind: Kind,
    /// Which statement of the case (0-based).
    statement: usize,
    detail: String,
}

fn normalise(msg: &str, dirs: &[&Path]) -> String {
    let mut m = msg.to_string();
    for d in dirs {
        m = m.replace(&*d.to_string_lossy(), "<dir>");
    }
    m
}

fn render(batches: &[RecordBatch]) -> (Vec<(String, String)>, Vec<Vec<String>>) {
    let mut columns = vec![];
    let mut rows = vec![];
    if let Some(b) = batches.first() {
        columns = b
            .schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().to_string()))
            .collect();
    }
    for b in batches {
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| array_value_to_string(c, r).unwrap_or_else(|e| format!("<{e}>")))
                    .collect(),
            );
        }
    }
    (columns, rows)
}

/// The long mode (`DPFUSION_FUZZ_MINUTES`): constructs too slow for CI's cases are generated.
fn long_mode() -> bool {
    std::env::var("DPFUSION_FUZZ_MINUTES").is_ok()
}

fn verbose() -> bool {
    std::env::var("DPFUSION_FUZZ_VERBOSE").is_ok()
}

/// Runs one statement, catching panics and hangs.
/// What a statement gave: its outcome, its columns (name, type), its rows as text, and how many
/// planted values its arrays' raw bytes hold ([`raw_markers`]).
type Ran = (Outcome, Vec<(String, String)>, Vec<Vec<String>>, usize);

async fn run_sql(s: &PrivateSession, sql: &str, dirs: &[&Path]) -> Ran {
    let fut = std::panic::AssertUnwindSafe(s.sql(sql)).catch_unwind();
    match tokio::time::timeout(Duration::from_secs(60), fut).await {
        Err(_) => (Outcome::Timeout, vec![], vec![], 0),
        Ok(Err(p)) => {
            let m = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            (Outcome::Panic(m), vec![], vec![], 0)
        }
        Ok(Ok(Ok(r))) => {
            let (c, rows) = render(&r.batches);
            let c = if c.is_empty() {
                r.schema
                    .fields()
                    .iter()
                    .map(|f| (f.name().clone(), f.data_type().to_string()))
                    .collect()
            } else {
                c
            };
            (Outcome::Ok, c, rows, raw_markers(&r.batches))
        }
        Ok(Ok(Err(e))) => {
            let m = e.to_string();
            if m.contains(EXECUTION_FAILED) {
                (Outcome::Failed, vec![], vec![], 0)
            } else {
                (Outcome::Error(normalise(&m, dirs)), vec![], vec![], 0)
            }
        }
    }
}

/// How many planted values (the name's bytes in either case, the id as an `i64`, the salary as
/// an `f64`, little-endian) the raw bytes of `batches` hold: every buffer of every array at every
/// depth, what Arrow IPC writes, not only what the rows show. Round 50 (review "metadata" F1): a
/// released view column's buffers held the keys of groups partition selection dropped, and bytes
/// under a NULL or past a slice are never rendered.
fn raw_markers(batches: &[datafusion::arrow::array::RecordBatch]) -> usize {
    fn bytes(d: &datafusion::arrow::array::ArrayData, out: &mut Vec<u8>) {
        for b in d.buffers() {
            out.extend_from_slice(b.as_slice());
        }
        for c in d.child_data() {
            bytes(c, out);
        }
    }
    let mut raw = vec![];
    for b in batches {
        for c in b.columns() {
            bytes(&c.to_data(), &mut raw);
        }
    }
    let needles: [Vec<u8>; 4] = [
        b"ZQXPLANT".to_vec(),
        b"zqxplant".to_vec(),
        PLANT_ID.to_le_bytes().to_vec(),
        PLANT_SALARY.to_le_bytes().to_vec(),
    ];
    needles
        .iter()
        .map(|n| raw.windows(n.len()).filter(|w| w == n).count())
        .sum()
}

fn private_scans(s: &PrivateSession) -> u64 {
    PRIVATE.iter().map(|t| s.scans(t)).sum()
}

/// Whether EXPLAIN PRIVACY applies to a statement (a query, not already an EXPLAIN).
fn explainable(sql: &str) -> bool {
    let u = sql.trim_start().to_ascii_uppercase();
    (u.starts_with("SELECT") || u.starts_with("WITH")) && !u.contains("DP_LEDGER")
}

/// Runs every statement of `case` on one fresh session (D or D′).
async fn observe(case: &Case, neighbour: bool) -> Vec<Obs> {
    let opened = Instant::now();
    // D′ differs from D in `events` under its plant, whatever the statements name.
    let with_events = case.plant.table() == "events"
        || case
            .statements
            .iter()
            .any(|s| s.to_ascii_lowercase().contains("events"));
    let (s, dir) = open(case.plant, neighbour, case.seed, with_events).await;
    if verbose() {
        eprintln!("open: {:.3} s", opened.elapsed().as_secs_f64());
    }
    let dirs = [&*dir];
    let mut out = vec![];
    for sql in &case.statements {
        let explain = if explainable(sql) {
            let (o, _, rows, _) = run_sql(&s, &format!("EXPLAIN PRIVACY {sql}"), &dirs).await;
            Some(match o {
                Outcome::Ok => {
                    let mut per_table = BTreeMap::new();
                    for r in &rows {
                        // table, release, epsilon, delta, cost, used %, left %, admitted
                        if r.len() > 7 && r[1].starts_with("total for table") {
                            per_table.insert(r[0].clone(), (r[4].parse().ok(), r[7] == "true"));
                        }
                    }
                    Ok((rows, per_table))
                }
                o => Err(format!("{o:?}")),
            })
        } else {
            None
        };
        let ledger_before = s.ledger().unwrap().len();
        let scans_before = private_scans(&s);
        let started = Instant::now();
        let (outcome, columns, rows, raw) = run_sql(&s, sql, &dirs).await;
        let charges = s.ledger().unwrap()[ledger_before..]
            .iter()
            .flat_map(|e| e.tables.iter())
            .map(|t| {
                (
                    t.name.clone(),
                    // The charge in the filter's unit (EXPLAIN PRIVACY's `cost`, issue 29).
                    t.native.as_ref().map_or(f64::NAN, |n| n.cost),
                    t.delta,
                    format!("{:?}", t.events),
                )
            })
            .collect();
        if verbose() {
            eprintln!(
                "[{}] {sql}\n    -> {outcome:?} {} rows in {:.3} s",
                if neighbour { "D'" } else { "D " },
                rows.len(),
                started.elapsed().as_secs_f64()
            );
        }
        out.push(Obs {
            outcome,
            columns,
            rows,
            charges,
            scans: private_scans(&s) - scans_before,
            explain,
            raw,
        });
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn markers(o: &Obs) -> usize {
    let mut text = String::new();
    if let Outcome::Error(m) | Outcome::Panic(m) = &o.outcome {
        text.push_str(m);
    }
    for r in &o.rows {
        for c in r {
            text.push_str(c);
            text.push('|');
        }
    }
    if let Some(e) = &o.explain {
        match e {
            Ok((rows, _)) => rows.iter().flatten().for_each(|c| {
                text.push_str(c);
                text.push('|');
            }),
            Err(m) => text.push_str(m),
        }
    }
    let text = text.to_ascii_lowercase();
    MARKERS.iter().map(|m| text.matches(m).count()).sum()
}

fn keys(o: &Obs) -> Option<Vec<Vec<String>>> {
    let idx: Vec<usize> = o
        .columns
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| {
            n.len() >= 2 && n.starts_with('k') && n[1..].chars().all(|c| c.is_ascii_digit())
        })
        .map(|(i, _)| i)
        .collect();
    if idx.is_empty() {
        return None;
    }
    Some(
        o.rows
            .iter()
            .map(|r| idx.iter().map(|&i| r[i].clone()).collect())
            .collect(),
    )
}

/// The rows of `o` on its columns named `prefixes` (and its keys, `k0`, `k1`, …), sorted; None
/// if it has no column of the first prefix.
fn view(o: &Obs, prefixes: &[&str]) -> Option<Vec<Vec<String>>> {
    let is_key =
        |n: &str| n.len() >= 2 && n.starts_with('k') && n[1..].chars().all(|c| c.is_ascii_digit());
    if !o.columns.iter().any(|(n, _)| n.starts_with(prefixes[0])) {
        return None;
    }
    let idx: Vec<usize> = (0..o.columns.len())
        .filter(|&i| {
            let n = o.columns[i].0.as_str();
            is_key(n) || prefixes.iter().any(|p| n.starts_with(p))
        })
        .collect();
    let mut rows: Vec<Vec<String>> = o
        .rows
        .iter()
        .map(|r| idx.iter().map(|&i| r[i].clone()).collect())
        .collect();
    rows.sort();
    Some(rows)
}

/// The exact columns (`ox_*`, with the keys and controls) of a result, sorted.
fn exact_view(o: &Obs) -> Option<Vec<Vec<String>>> {
    view(o, &["ox_", "oc_"])
}

/// Round 47: the `ox_*` columns of an order-sensitive consumer of releases differ between D and
/// D′. When partition selection chose the groups (`selected`), the released set may differ by
/// noise: they are compared only if the keys and the controls (`oc_*`: the same aggregate in key
/// order) agree, and not at all without keys or controls.
fn exact_differs(a: &Obs, b: &Obs, selected: bool) -> Option<String> {
    let (xa, xb) = (exact_view(a)?, exact_view(b)?);
    if selected {
        let control = |o: &Obs| {
            view(o, &["oc_"]).or_else(|| {
                keys(o).map(|mut k| {
                    k.sort();
                    k
                })
            })
        };
        match (control(a), control(b)) {
            (Some(ca), Some(cb)) if ca == cb => {}
            _ => return None,
        }
    }
    (xa != xb).then(|| format!("D: {xa:?}\nD': {xb:?}"))
}

fn is_refusal(o: &Outcome) -> bool {
    matches!(o, Outcome::Error(_))
}

/// What earlier statements of the case released (a stored result can carry it).
#[derive(Clone, Copy, Default)]
struct Before {
    /// Noise.
    noise: bool,
    /// Groups chosen by partition selection: the groups of a table made from them are noisy.
    selected: bool,
}

/// Whether `o` was charged a partition selection (its additive δ).
fn selects(o: &Obs) -> bool {
    o.charges.iter().any(|c| c.3.contains("Delta"))
}

/// The oracle for one statement observed on D (`a`) and D′ (`b`); `before`: what the earlier
/// statements of the case released.
fn compare(case: &Case, i: usize, a: &Obs, b: &Obs, before: Before, out: &mut Vec<Finding>) {
    let noise_before = before.noise;
    let mut f = |kind: Kind, detail: String| {
        out.push(Finding {
            kind,
            statement: i,
            detail,
        })
    };
    let sql = &case.statements[i];
    for (side, o) in [("D", a), ("D'", b)] {
        match &o.outcome {
            Outcome::Panic(m) => f(Kind::Panic, format!("{side}: {m}")),
            Outcome::Timeout => f(Kind::Timeout, side.to_string()),
            Outcome::Error(m) if m.contains("panicked") => f(Kind::Panic, format!("{side}: {m}")),
            _ => {}
        }
        if is_refusal(&o.outcome) {
            if !o.charges.is_empty() {
                f(Kind::RefusedButCharged, format!("{side}: {:?}", o.charges));
            }
            if o.scans > 0 {
                f(
                    Kind::RefusedButScanned,
                    format!("{side}: {} scans", o.scans),
                );
            }
        }
        let plain_explain = {
            let u = sql.to_ascii_uppercase();
            u.starts_with("EXPLAIN ") && !u.starts_with("EXPLAIN PRIVACY")
        };
        if o.outcome == Outcome::Ok && o.scans > 0 && o.charges.is_empty() && !plain_explain {
            f(
                Kind::ReleasedUncharged,
                format!("{side}: {} private scans, no charge", o.scans),
            );
        }
        if o.outcome == Outcome::Failed && o.charges.is_empty() {
            f(Kind::FailedUncharged, side.to_string());
        }
        // The charge is the declared cost.
        if !o.charges.is_empty() {
            match &o.explain {
                Some(Ok((_, per_table))) => {
                    for (t, eps, _, _) in &o.charges {
                        match per_table.get(t) {
                            Some((Some(c), admitted)) => {
                                // EXPLAIN PRIVACY gives the cost as shown: six significant
                                // digits, rounded up (never below the charge).
                                let declared =
                                    *c >= eps * (1.0 - 1e-12) && *c <= eps * (1.0 + 1e-5);
                                if !declared || !admitted {
                                    f(
                                        Kind::ChargeNotDeclared,
                                        format!(
                                            "{side}: {t} charged {eps}, declared {c} (admitted {admitted})"
                                        ),
                                    );
                                }
                            }
                            _ => f(
                                Kind::ChargeNotDeclared,
                                format!("{side}: {t} charged {eps}, EXPLAIN PRIVACY names no cost"),
                            ),
                        }
                    }
                }
                Some(Err(e)) => f(
                    Kind::ChargeNotDeclared,
                    format!("{side}: charged, but EXPLAIN PRIVACY gave {e}"),
                ),
                None => {}
            }
        }
    }
    // D against D′.
    let same_kind = std::mem::discriminant(&a.outcome) == std::mem::discriminant(&b.outcome);
    let noisy_outcome = case.flags.noisy_outcome
        && matches!(
            (&a.outcome, &b.outcome),
            (Outcome::Ok, Outcome::Failed) | (Outcome::Failed, Outcome::Ok)
        );
    if !same_kind && !noisy_outcome {
        f(
            Kind::OutcomeDiffers,
            format!("D: {:?}\nD': {:?}", a.outcome, b.outcome),
        );
    } else if let (Outcome::Error(x), Outcome::Error(y)) = (&a.outcome, &b.outcome)
        && x != y
    {
        f(Kind::MessageDiffers, format!("D: {x}\nD': {y}"));
    }
    let (ma, mb) = (markers(a), markers(b));
    if mb > ma {
        f(
            Kind::PlantedLeak,
            format!(
                "D′ shows {mb} planted markers, D {ma}: {:?} {:?}",
                b.outcome,
                b.rows.iter().take(5).collect::<Vec<_>>()
            ),
        );
    }
    if b.raw > a.raw {
        f(
            Kind::PlantedLeak,
            format!(
                "D′'s result holds {} planted values in its arrays' raw bytes, D's {} (not in \
                 the rows shown: buffers, bytes under NULLs, past slices)",
                b.raw, a.raw
            ),
        );
    }
    if let (Some(x), Some(y)) = (&a.explain, &b.explain) {
        let x = x.as_ref().map(|v| &v.0);
        let y = y.as_ref().map(|v| &v.0);
        if x != y {
            f(Kind::ExplainDiffers, format!("D: {x:?}\nD': {y:?}"));
        }
    }
    if a.charges != b.charges {
        f(
            Kind::ChargeDiffers,
            format!("D: {:?}\nD': {:?}", a.charges, b.charges),
        );
    }
    if a.outcome != Outcome::Ok || b.outcome != Outcome::Ok {
        return;
    }
    if a.columns != b.columns {
        f(
            Kind::SchemaDiffers,
            format!("D: {:?}\nD': {:?}", a.columns, b.columns),
        );
        return;
    }
    let noiseless = a.charges.is_empty() && b.charges.is_empty() && !noise_before;
    if noiseless && !sql.to_ascii_uppercase().contains("RANDOM()") {
        // Row order of a result that read no private row is DataFusion's (hash order): compare
        // as multisets. So are the `ox_*` columns' values (an order-sensitive aggregate or window
        // without an order of its own): the guard pins the order of released rows only in a
        // statement that reads a private table, and in one that reads none, DataFusion's threads
        // set it (seed 4949, round 49: `first_value(k0)` over DP calls on the public `depts`
        // named 'eng' in D's four runs and 'ops' in D′'s, where D and D′ differ only in `staff`,
        // which it does not read).
        let plain = |o: &Obs| -> Vec<Vec<String>> {
            let keep: Vec<usize> = (0..o.columns.len())
                .filter(|&i| !o.columns[i].0.starts_with("ox_"))
                .collect();
            let mut rows: Vec<Vec<String>> = o
                .rows
                .iter()
                .map(|r| keep.iter().map(|&i| r[i].clone()).collect())
                .collect();
            rows.sort();
            rows
        };
        let (ra, rb) = (plain(a), plain(b));
        if ra != rb {
            f(
                Kind::NoiselessDiffers,
                format!("D: {:?}\nD': {:?}", a.rows, b.rows),
            );
        }
        return;
    }
    // Round 45: once `CREATE TABLE … AS` with a private GROUP BY and ORDER BY stopped failing,
    // the groups of `SELECT * FROM res` after it came from that statement's partition selection.
    let selected = before.selected || selects(a) || selects(b);
    let mut flags = case.flags;
    if sql.to_ascii_uppercase().contains("RANDOM()") {
        // `random()` is noise the seed does not fix: the rows it keeps, and the order a hash
        // aggregate meets a public table's groups in, differ run to run (seed 4646 flagged a
        // charged query over public tables with `WHERE random() < …` as OrderDiffers).
        flags.noisy_rows = true;
        flags.noisy_order = true;
    }
    if flags.exact
        && !flags.noisy_rows
        && !flags.noisy_order
        && let Some(detail) = exact_differs(a, b, selected)
    {
        f(Kind::ExactDiffers, detail);
    }
    if let (Some(ka), Some(kb)) = (keys(a), keys(b)) {
        if !selected && !flags.noisy_rows {
            let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (ka.iter().collect(), kb.iter().collect());
            if sa != sb {
                f(Kind::GroupsDiffer, format!("D: {ka:?}\nD': {kb:?}"));
                return;
            }
        }
        if !flags.noisy_order {
            let common: BTreeSet<_> = ka.iter().filter(|k| kb.contains(k)).collect();
            let oa: Vec<_> = ka.iter().filter(|k| common.contains(k)).collect();
            let ob: Vec<_> = kb.iter().filter(|k| common.contains(k)).collect();
            if oa != ob {
                f(Kind::OrderDiffers, format!("D: {ka:?}\nD': {kb:?}"));
            }
        }
    } else if !selected && !flags.noisy_rows && a.rows.len() != b.rows.len() {
        f(
            Kind::GroupsDiffer,
            format!("D: {} rows\nD': {} rows", a.rows.len(), b.rows.len()),
        );
    }
    if flags.classes
        && !flags.noisy_rows
        && a.rows.len() == b.rows.len()
        && keys(a) == keys(b)
        && let Some(detail) = class_differs(a, b)
    {
        f(Kind::ClassDiffers, detail);
    }
}

/// The first released value (a column `v0`, `v1`, …) whose class (NULL, NaN, ±inf, other)
/// differs between two results of the same rows (round 52).
fn class_differs(a: &Obs, b: &Obs) -> Option<String> {
    let class = |c: &str| match c {
        "" => "null",
        "NaN" => "nan",
        "inf" | "-inf" => "inf",
        _ => "value",
    };
    let is_value =
        |n: &str| n.len() >= 2 && n.starts_with('v') && n[1..].chars().all(|c| c.is_ascii_digit());
    let idx: Vec<usize> = (0..a.columns.len())
        .filter(|&i| is_value(&a.columns[i].0))
        .collect();
    for (ra, rb) in a.rows.iter().zip(&b.rows) {
        for &i in &idx {
            if class(&ra[i]) != class(&rb[i]) {
                return Some(format!(
                    "{}: D {:?}, D' {:?}\nD: {ra:?}\nD': {rb:?}",
                    a.columns[i].0, ra[i], rb[i]
                ));
            }
        }
    }
    None
}

/// Runs a case on D and D′ and applies the oracle.
async fn check(case: &Case) -> Vec<Finding> {
    check_counting(case, &mut BTreeMap::new()).await
}

/// [`check`], counting the outcomes on D of the last statement (charged, failed, refused…).
async fn check_counting(case: &Case, counts: &mut BTreeMap<&'static str, usize>) -> Vec<Finding> {
    let a = observe(case, false).await;
    let b = observe(case, true).await;
    let mut out = vec![];
    let mut before = Before::default();
    for i in 0..case.statements.len() {
        compare(case, i, &a[i], &b[i], before, &mut out);
        before.noise |= !a[i].charges.is_empty() || !b[i].charges.is_empty();
        before.selected |= selects(&a[i]) || selects(&b[i]);
    }
    // A noiseless result that also differs between runs is DataFusion's nondeterminism (which of
    // rows tied under a LIMIT a parallel join or aggregate yields first), not a neighbour's
    // influence: D and D′ are run up to three more times each, and the finding stays only if D
    // always agrees with itself and D′ never agrees with D (a GROUP BY … LIMIT 2 over a public
    // table gave D's two groups on every rerun of D and the other two on D′: found in long mode).
    // The exact columns of order-sensitive consumers of releases (round 47) are a function of
    // the released keys alone: the pinned order leaves DataFusion no nondeterminism there, and
    // an order that changes from run to run is set by timing, which the private rows sway. Such
    // a finding goes only if every rerun of D and of D′ agrees with D (the difference was not
    // seen again).
    let rerun = |k: Kind| matches!(k, Kind::NoiselessDiffers | Kind::ExactDiffers);
    if out.iter().any(|x| rerun(x.kind)) {
        let sorted = |k: Kind, o: &Obs| match k {
            Kind::ExactDiffers => exact_view(o).unwrap_or_default(),
            _ => {
                let mut r = o.rows.clone();
                r.sort();
                r
            }
        };
        let mut reruns = vec![];
        for _ in 0..3 {
            reruns.push((observe(case, false).await, observe(case, true).await));
        }
        out.retain(|x| {
            let same = |o: Option<&Obs>| {
                o.is_some_and(|o| sorted(x.kind, o) == sorted(x.kind, &a[x.statement]))
            };
            match x.kind {
                Kind::NoiselessDiffers => reruns
                    .iter()
                    .all(|(d, d2)| same(d.get(x.statement)) && !same(d2.get(x.statement))),
                Kind::ExactDiffers => reruns
                    .iter()
                    .any(|(d, d2)| !same(d.get(x.statement)) || !same(d2.get(x.statement))),
                _ => true,
            }
        });
    }
    if let Some(last) = a.last() {
        let k = match &last.outcome {
            Outcome::Ok if !last.charges.is_empty() => "charged",
            Outcome::Ok => "free",
            Outcome::Failed => "failed",
            Outcome::Error(_) => "refused",
            Outcome::Panic(_) => "panic",
            Outcome::Timeout => "timeout",
        };
        *counts.entry(k).or_default() += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Shrinking
// ---------------------------------------------------------------------------------------------

/// Tokens of a statement: quoted strings, words, numbers and single punctuation characters
/// (with the whitespace before each kept).
fn tokens(sql: &str) -> Vec<String> {
    let mut out = vec![];
    let cs: Vec<char> = sql.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let start = i;
        while i < cs.len() && cs[i].is_whitespace() {
            i += 1;
        }
        if i >= cs.len() {
            break;
        }
        if cs[i] == '\'' || cs[i] == '"' {
            let q = cs[i];
            i += 1;
            while i < cs.len() && cs[i] != q {
                i += 1;
            }
            i = (i + 1).min(cs.len());
        } else if cs[i].is_alphanumeric() || cs[i] == '_' || cs[i] == '.' {
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_' || cs[i] == '.') {
                i += 1;
            }
        } else if i + 1 < cs.len()
            && matches!(
                (cs[i], cs[i + 1]),
                ('=', '>') | ('<', '>') | ('<', '=') | ('>', '=') | ('|', '|')
            )
        {
            i += 2;
        } else {
            i += 1;
        }
        out.push(cs[start..i].iter().collect());
    }
    out
}

/// Shrinks the last statement of a failing case by token-level delta debugging (and drops
/// earlier statements) while a finding of the same kind persists. Bounded in tries and time.
async fn shrink(case: &Case, kind: Kind) -> Case {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut best = case.clone();
    let holds = |c: Case| async move { check(&c).await.iter().any(|f| f.kind == kind) };
    // Earlier statements.
    let mut i = 0;
    while i + 1 < best.statements.len() {
        let mut c = best.clone();
        c.statements.remove(i);
        if holds(c.clone()).await {
            best = c;
        } else {
            i += 1;
        }
    }
    let last = best.statements.len() - 1;
    let mut toks = tokens(&best.statements[last]);
    let mut chunk = toks.len() / 2;
    let mut tries = 0;
    while chunk >= 1 && Instant::now() < deadline && tries < 600 {
        let mut start = 0;
        let mut progressed = false;
        while start < toks.len() && Instant::now() < deadline && tries < 600 {
            let end = (start + chunk).min(toks.len());
            let cand: Vec<String> = toks[..start].iter().chain(&toks[end..]).cloned().collect();
            let sql = cand.concat().trim().to_string();
            tries += 1;
            let mut c = best.clone();
            c.statements[last] = sql;
            if !c.statements[last].is_empty() && holds(c.clone()).await {
                best = c;
                toks = cand;
                progressed = true;
            } else {
                start += chunk;
            }
        }
        if !progressed {
            chunk /= 2;
        }
    }
    best
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The default (CI) number of cases.
const CI_CASES: u64 = 1500;
const CI_SEED: u64 = 0x26_f022;

fn report_case(case: &Case, f: &Finding) -> String {
    format!(
        "-- {:?} (plant {:?}, seed {}) at: {}\n--   {}\n{}\n",
        f.kind,
        case.plant,
        case.seed,
        last_or(case, f),
        f.detail.replace('\n', "\n--   "),
        case.statements.join(";\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_fuzz() {
    let minutes = env_u64("DPFUSION_FUZZ_MINUTES");
    let seed = env_u64("DPFUSION_FUZZ_SEED").unwrap_or(CI_SEED);
    let cases = env_u64("DPFUSION_FUZZ_CASES").unwrap_or(if minutes.is_some() {
        u64::MAX
    } else {
        CI_CASES
    });
    let until = minutes.map(|m| Instant::now() + Duration::from_secs(60 * m));
    let current = std::env::var("DPFUSION_FUZZ_CURRENT").ok();
    let shrink_open = std::env::var("DPFUSION_FUZZ_SHRINK_OPEN").is_ok();
    let start = Instant::now();
    let mut rng = Rng(seed);
    let mut new: Vec<String> = vec![];
    let mut new_kinds: BTreeSet<(Kind, usize)> = BTreeSet::new();
    let mut open_counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut open_examples: BTreeMap<&str, String> = BTreeMap::new();
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut n = 0u64;
    while n < cases && until.is_none_or(|u| Instant::now() < u) {
        let case = generate(rng.next());
        n += 1;
        if let Some(p) = &current {
            // The case under way, for a process abort (no catch is possible).
            let _ = std::fs::write(
                p,
                report_case(
                    &case,
                    &Finding {
                        kind: Kind::Panic,
                        statement: 0,
                        detail: "running".into(),
                    },
                ),
            );
        }
        let case_start = Instant::now();
        let findings = check_counting(&case, &mut outcomes).await;
        if verbose() {
            eprintln!(
                "case {n}: plant {:?}, flags {:?}, {:.3} s",
                case.plant,
                case.flags,
                case_start.elapsed().as_secs_f64()
            );
        }
        if !findings.is_empty() {
            *outcomes.entry("with findings").or_default() += 1;
        }
        for f in &findings {
            if let Some(class) = open_class(&case, f) {
                *open_counts.entry(class).or_default() += 1;
                if !open_examples.contains_key(class) {
                    // Long mode: shrink the first example of each open class too.
                    let example = if shrink_open {
                        shrink(&case, f.kind).await
                    } else {
                        case.clone()
                    };
                    open_examples.insert(class, report_case(&example, f));
                }
                continue;
            }
            // One shrunk example per kind and statement shape.
            if !new_kinds.insert((f.kind, case.statements.len())) && new.len() >= 3 {
                continue;
            }
            let small = shrink(&case, f.kind).await;
            let text = report_case(&small, f);
            eprintln!("NEW FINDING\n{text}");
            new.push(text);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: seed {seed}, {n} cases in {elapsed:.1} s ({:.0} cases/min), {outcomes:?}",
        n as f64 * 60.0 / elapsed
    );
    for (class, c) in &open_counts {
        let reason = KNOWN_OPEN
            .iter()
            .find(|o| o.class == *class)
            .map(|o| o.reason)
            .unwrap_or_default();
        eprintln!(
            "known open {class} ({reason}): {c} findings, e.g.\n{}",
            open_examples[class]
        );
    }
    if !new.is_empty() {
        let out = std::env::var("DPFUSION_FUZZ_OUT")
            .unwrap_or_else(|_| format!("{}/target/fuzz-findings.sql", env!("CARGO_MANIFEST_DIR")));
        let _ = std::fs::write(&out, new.join("\n"));
        panic!(
            "{} new findings (written to {out}):\n{}",
            new.len(),
            new.join("\n")
        );
    }
}

/// The flags of a query read back from its text (regression lines carry no generator state).
fn infer_flags(statements: &[String]) -> Flags {
    // The noise-free tie of order-sensitive consumers (round 47) is not noisy.
    let u = statements
        .join(" ")
        .to_ascii_uppercase()
        .replace("ORDER BY COALESCE(V0 * 0, 0)", "ORDER BY TIE")
        .replace(
            "ORDER BY COALESCE(LENGTH(CAST(K0 AS VARCHAR)) * 0, 0)",
            "ORDER BY TIE",
        );
    let noisy_order = u.contains("ORDER BY V")
        || u.contains("OVER (ORDER BY V")
        || u.contains("UNION")
        || u.contains("(SELECT DP_");
    Flags {
        noisy_order,
        noisy_rows: noisy_order
            || u.contains("HAVING")
            || u.matches("LIMIT").count() > u.matches("ORDER BY TIE LIMIT").count()
            || u.contains("OFFSET")
            || u.contains("WHERE R.V"),
        exact: u.contains(" OX_"),
        noisy_outcome: u.contains("CAST(V") || u.contains("CAST(R.V"),
        classes: false,
    }
}

/// Splits a regression line into statements (`;` outside quotes).
fn split_statements(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur.trim().to_string());
    out.retain(|s| !s.is_empty());
    out
}

/// Every shrunk case of `tests/data/fuzz_regressions.sql` (one per line, statements separated by
/// `;`), under every planted neighbour: no finding outside [`KNOWN_OPEN`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regressions_replay() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_regressions.sql");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut failures = vec![];
    let mut open = 0;
    let mut lines = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("--") {
            continue;
        }
        lines += 1;
        for &plant in PLANTS {
            let statements = split_statements(line);
            let case = Case {
                plant,
                seed: 1,
                flags: infer_flags(&statements),
                statements,
            };
            for f in check(&case).await {
                if open_class(&case, &f).is_some() {
                    open += 1;
                } else {
                    failures.push(report_case(&case, &f));
                }
            }
        }
    }
    eprintln!("regressions: {lines} cases, {open} findings of known open classes");
    assert!(lines > 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
