//! SQL tests of the DP aggregates on a plain DataFusion `SessionContext` (no dpfusion session):
//! argument handling, GROUP BY, FILTER, partitioned plans, bad input and planning errors.
//!
//! Values are checked against the exact answer with a tolerance of 8σ, using large ε so that the
//! noise is small; exactness across partitionings is checked bit for bit with seeded UDAFs.

mod aggregates_sql {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
    };
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::ScalarValue;
    use datafusion::datasource::MemTable;
    use datafusion::logical_expr::AggregateUDF;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use dpfusion_udfs::aggregates::{DpCount, DpMean, DpSum};
    use dpfusion_udfs::privacy::gaussian_mu;

    /// ε used where the test checks values: small noise.
    const EPS: f64 = 100.0;
    const DELTA: f64 = 1e-7;

    /// 8σ for a release of sensitivity `sens` at (EPS, DELTA).
    fn tol(sens: f64) -> f64 {
        8.0 * sens / gaussian_mu(EPS, DELTA).unwrap() * 1.001
    }

    /// 8σ (first order) of a dp_count: noise σ plus the rounding to an integer.
    fn count_tol() -> f64 {
        tol(1.0) + 0.5
    }

    /// 8σ (first order) of an add/remove dp_mean over n values with true mean m: the sum and
    /// count releases each get μ/√2, so the error is ≈ (Z_s − (m − c)Z_c)/n.
    fn mean_tol(lower: f64, upper: f64, n: f64, m: f64) -> f64 {
        let mu = gaussian_mu(EPS, DELTA).unwrap() / 2f64.sqrt();
        let (h, c) = ((upper - lower) / 2.0, (upper + lower) / 2.0);
        8.0 * ((h / mu).powi(2) + ((m - c) / mu).powi(2)).sqrt() / n * 1.01
    }

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("g", DataType::Utf8, true),
            Field::new("x", DataType::Float64, true),
            Field::new("i", DataType::Int64, true),
            Field::new("b", DataType::Boolean, true),
        ]))
    }

    fn batch(g: Vec<Option<&str>>, x: Vec<Option<f64>>) -> RecordBatch {
        let n = g.len();
        let i: Vec<Option<i64>> = (0..n as i64).map(Some).collect();
        let b: Vec<Option<bool>> = (0..n).map(|k| Some(k % 2 == 0)).collect();
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(g)) as ArrayRef,
                Arc::new(Float64Array::from(x)),
                Arc::new(Int64Array::from(i)),
                Arc::new(BooleanArray::from(b)),
            ],
        )
        .unwrap()
    }

    fn ctx_with(partitions: usize) -> SessionContext {
        let ctx = SessionContext::new_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        dpfusion_udfs::register_all(&ctx);
        ctx
    }

    fn ctx() -> SessionContext {
        ctx_with(1)
    }

    /// t(g, x, i, b): g = 'a' × 3, 'b' × 2; x has a NULL, a NaN, ±∞ and out-of-range values.
    fn register_t(ctx: &SessionContext) {
        let b = batch(
            vec![
                Some("a"),
                Some("a"),
                Some("a"),
                Some("b"),
                Some("b"),
                Some("b"),
                Some("b"),
            ],
            vec![
                Some(1.0),
                Some(50.0),
                None,
                Some(2.0),
                Some(f64::NAN),
                Some(f64::INFINITY),
                Some(f64::NEG_INFINITY),
            ],
        );
        ctx.register_batch("t", b).unwrap();
    }

    async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
        ctx.sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The single row of a query, as scalars.
    async fn row(ctx: &SessionContext, sql: &str) -> Vec<ScalarValue> {
        let batches = collect(ctx, sql).await;
        let b: Vec<_> = batches.iter().filter(|b| b.num_rows() > 0).collect();
        assert_eq!(b.len(), 1, "{sql}");
        assert_eq!(b[0].num_rows(), 1, "{sql}");
        (0..b[0].num_columns())
            .map(|c| ScalarValue::try_from_array(b[0].column(c), 0).unwrap())
            .collect()
    }

    fn f64_of(v: &ScalarValue) -> f64 {
        match v {
            ScalarValue::Float64(Some(x)) => *x,
            ScalarValue::Int64(Some(x)) => *x as f64,
            other => panic!("not a number: {other:?}"),
        }
    }

    async fn one(ctx: &SessionContext, sql: &str) -> f64 {
        f64_of(&row(ctx, sql).await[0])
    }

    fn near(label: &str, got: f64, want: f64, tol: f64) {
        assert!(
            (got - want).abs() <= tol,
            "{label}: got {got}, want {want} ± {tol}"
        );
    }

    /// The error of a statement, from planning or execution.
    async fn error(ctx: &SessionContext, sql: &str) -> String {
        match ctx.sql(sql).await {
            Err(e) => e.to_string(),
            Ok(df) => match df.collect().await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{sql} should fail"),
            },
        }
    }

    #[tokio::test]
    async fn positional_named_and_default_arguments() {
        let ctx = ctx();
        register_t(&ctx);
        // clamped to [0, 10]: 1 + 10 + 2 + 10 + 0 = 23 (NULL and NaN skipped)
        let t = tol(10.0);
        for sql in [
            format!("SELECT dp_sum(x, 0, 10, {EPS}) FROM t"),
            format!("SELECT dp_sum(x, 0, 10, {EPS}, {DELTA}) FROM t"),
            format!("SELECT dp_sum(x, 0, 10, {EPS}, {DELTA}, 'gaussian', 'add_remove') FROM t"),
            format!(
                "SELECT dp_sum(value => x, lower => 0, upper => 10, epsilon => {EPS}, delta => {DELTA}, \
                 mechanism => 'gaussian', neighbours => 'add_remove') FROM t"
            ),
            format!("SELECT dp_sum(x, epsilon => {EPS}, upper => 10, lower => 0) FROM t"),
            format!("SELECT dp_sum(x, 0, 10, epsilon => {EPS}, delta => {DELTA}) FROM t"),
        ] {
            near(&sql, one(&ctx, &sql).await, 23.0, t);
        }
        // integer column, integer literals
        near(
            "int",
            one(&ctx, &format!("SELECT dp_sum(i, 0, 4, {EPS}) FROM t")).await,
            18.0, // 0 + 1 + 2 + 3 + 4 + 4 + 4
            tol(4.0),
        );
        // count of non-NULL, non-NaN values: 5
        let c = row(&ctx, &format!("SELECT dp_count(x, {EPS}) FROM t")).await;
        assert!(matches!(c[0], ScalarValue::Int64(Some(_))), "{c:?}");
        near("count", f64_of(&c[0]), 5.0, count_tol());
        near(
            "count named",
            one(
                &ctx,
                &format!("SELECT dp_count(value => g, epsilon => {EPS}, delta => {DELTA}) FROM t"),
            )
            .await,
            7.0,
            count_tol(),
        );
        // mean: 23/5
        let m = one(&ctx, &format!("SELECT dp_mean(x, 0, 10, {EPS}) FROM t")).await;
        assert!((0.0..=10.0).contains(&m));
        near("mean", m, 4.6, mean_tol(0.0, 10.0, 5.0, 4.6));
        // a middle optional argument cannot be skipped by name on a plain context
        let e = error(
            &ctx,
            &format!("SELECT dp_sum(x, 0, 10, {EPS}, neighbours => 'replace') FROM t"),
        )
        .await;
        assert!(e.contains("delta"), "{e}");
    }

    #[tokio::test]
    async fn group_by_and_filter_clause() {
        let ctx = ctx();
        register_t(&ctx);
        let sql = format!(
            "SELECT g, dp_sum(x, 0, 10, {EPS}) AS s, dp_count(x, {EPS}) AS c, dp_mean(x, 0, 10, {EPS}) AS m \
             FROM t GROUP BY g ORDER BY g"
        );
        let batches = collect(&ctx, &sql).await;
        let b = &batches[0];
        assert_eq!(b.num_rows(), 2);
        let s = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
        let c = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        let m = b.column(3).as_any().downcast_ref::<Float64Array>().unwrap();
        near("a sum", s.value(0), 11.0, tol(10.0));
        near("b sum", s.value(1), 12.0, tol(10.0));
        near("a count", c.value(0) as f64, 2.0, count_tol());
        near("b count", c.value(1) as f64, 3.0, count_tol());
        near("a mean", m.value(0), 5.5, mean_tol(0.0, 10.0, 2.0, 5.5));
        near("b mean", m.value(1), 4.0, mean_tol(0.0, 10.0, 3.0, 4.0));

        // FILTER, with and without GROUP BY
        let v = one(
            &ctx,
            &format!("SELECT dp_sum(x, 0, 10, {EPS}) FILTER (WHERE g = 'a') FROM t"),
        )
        .await;
        near("filter", v, 11.0, tol(10.0));
        let sql = format!(
            "SELECT g, dp_sum(x, 0, 10, {EPS}) FILTER (WHERE i > 0) FROM t GROUP BY g ORDER BY g"
        );
        let batches = collect(&ctx, &sql).await;
        let s = batches[0]
            .column(1)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        near("a filtered", s.value(0), 10.0, tol(10.0));
        near("b filtered", s.value(1), 12.0, tol(10.0));
        // replace_public_n imputes NULL/NaN with the midpoint and divides by the rows after FILTER
        let sql = format!(
            "SELECT dp_mean(x, 0, 10, {EPS}, {DELTA}, 'gaussian', 'replace_public_n') FILTER (WHERE g = 'b') FROM t"
        );
        // b: 2, NaN→5, +∞→10, −∞→0: 17/4
        near("public n", one(&ctx, &sql).await, 4.25, tol(10.0) / 4.0);
    }

    /// A 4-partition MemTable of 4,000 rows in 8 groups.
    fn partitioned_table(partitions: usize) -> MemTable {
        let all: Vec<(String, Option<f64>)> = (0..4000)
            .map(|k| {
                let v = match k % 17 {
                    0 => None,
                    1 => Some(f64::NAN),
                    _ => Some(((k * 7919) % 1000) as f64 * 0.0137 - 1.0),
                };
                (format!("g{}", k % 8), v)
            })
            .collect();
        let chunk = all.len().div_ceil(partitions);
        let parts = all
            .chunks(chunk)
            .map(|c| {
                vec![batch(
                    c.iter().map(|(g, _)| Some(g.as_str())).collect(),
                    c.iter().map(|(_, x)| *x).collect(),
                )]
            })
            .collect();
        MemTable::try_new(schema(), parts).unwrap()
    }

    #[tokio::test]
    async fn partitioned_plans_release_the_same_exact_totals() {
        let mut results = vec![];
        for partitions in [1, 4] {
            let ctx = ctx_with(partitions);
            ctx.register_udaf(AggregateUDF::from(DpSum::with_insecure_seed(42)));
            ctx.register_udaf(AggregateUDF::from(DpMean::with_insecure_seed(43)));
            ctx.register_udaf(AggregateUDF::from(DpCount::with_insecure_seed(44)));
            ctx.register_table("p", Arc::new(partitioned_table(partitions)))
                .unwrap();
            let plan = ctx
                .sql("EXPLAIN SELECT dp_sum(x, 0, 10, 1.0) FROM p")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            let text = format!("{:?}", plan);
            if partitions == 4 {
                assert!(text.contains("Partial") && text.contains("Final"), "{text}");
            }
            // same seed, same exact totals ⇒ bit-identical releases
            let r = row(
                &ctx,
                "SELECT dp_sum(x, -1, 10, 1.0), dp_mean(x, -1, 10, 1.0), dp_count(x, 1.0) FROM p",
            )
            .await;
            results.push(r);
            // GROUP BY on a partitioned plan: every group, values near the truth
            let sql = format!("SELECT g, dp_sum(x, -1, 10, {EPS}) FROM p GROUP BY g ORDER BY g");
            let batches = collect(&ctx, &sql).await;
            let n: usize = batches.iter().map(|b| b.num_rows()).sum();
            assert_eq!(n, 8);
        }
        assert_eq!(results[0], results[1]);

        // values near the exact totals (unseeded, large ε)
        let ctx = ctx_with(4);
        ctx.register_table("p", Arc::new(partitioned_table(4)))
            .unwrap();
        let truth: f64 = (0..4000)
            .filter(|k| k % 17 > 1)
            .map(|k| ((k * 7919) % 1000) as f64 * 0.0137 - 1.0)
            .sum();
        near(
            "partitioned sum",
            one(&ctx, &format!("SELECT dp_sum(x, -1, 20, {EPS}) FROM p")).await,
            truth,
            tol(20.0),
        );
    }

    #[tokio::test]
    async fn empty_all_null_and_one_row_tables() {
        let ctx = ctx();
        ctx.register_batch("empty", batch(vec![], vec![])).unwrap();
        ctx.register_batch("nulls", batch(vec![Some("a"); 4], vec![None; 4]))
            .unwrap();
        ctx.register_batch("one", batch(vec![Some("a")], vec![Some(7.5)]))
            .unwrap();

        // empty: noise around 0, count ≥ 0, mean within bounds, public-n mean NULL
        let r = row(
            &ctx,
            &format!(
                "SELECT dp_sum(x, 0, 10, {EPS}), dp_count(x, {EPS}), dp_mean(x, 0, 10, {EPS}), \
                 dp_mean(x, 0, 10, {EPS}, {DELTA}, 'gaussian', 'replace_public_n') FROM empty"
            ),
        )
        .await;
        near("empty sum", f64_of(&r[0]), 0.0, tol(10.0));
        assert!(f64_of(&r[1]) >= 0.0);
        assert!((0.0..=10.0).contains(&f64_of(&r[2])));
        assert_eq!(r[3], ScalarValue::Float64(None));
        let n: usize = collect(
            &ctx,
            &format!("SELECT g, dp_sum(x, 0, 1, {EPS}) FROM empty GROUP BY g"),
        )
        .await
        .iter()
        .map(|b| b.num_rows())
        .sum();
        assert_eq!(n, 0);

        // all NULL: sum ≈ 0, count ≈ 0, mean within bounds, public-n mean ≈ midpoint
        let r = row(
            &ctx,
            &format!(
                "SELECT dp_sum(x, 0, 10, {EPS}), dp_count(x, {EPS}), dp_mean(x, 0, 10, {EPS}), \
                 dp_mean(x, 0, 10, {EPS}, {DELTA}, 'gaussian', 'replace_public_n') FROM nulls"
            ),
        )
        .await;
        near("null sum", f64_of(&r[0]), 0.0, tol(10.0));
        near("null count", f64_of(&r[1]), 0.0, count_tol());
        assert!((0.0..=10.0).contains(&f64_of(&r[2])));
        near("null public mean", f64_of(&r[3]), 5.0, tol(10.0) / 4.0);

        // one row
        let r = row(
            &ctx,
            &format!("SELECT dp_sum(x, 0, 10, {EPS}), dp_count(x, {EPS}), dp_mean(x, 0, 10, {EPS}) FROM one"),
        )
        .await;
        near("one sum", f64_of(&r[0]), 7.5, tol(10.0));
        near("one count", f64_of(&r[1]), 1.0, count_tol());
        assert!((0.0..=10.0).contains(&f64_of(&r[2])));
    }

    #[tokio::test]
    async fn lower_equals_upper() {
        let ctx = ctx();
        register_t(&ctx);
        let r = row(
            &ctx,
            "SELECT dp_sum(x, 0, 0, 1.0), dp_mean(x, 3, 3, 1.0), dp_mean(x, -2, -2, 0.1) FROM t",
        )
        .await;
        assert_eq!(r[0], ScalarValue::Float64(Some(0.0)));
        assert_eq!(r[1], ScalarValue::Float64(Some(3.0)));
        assert_eq!(r[2], ScalarValue::Float64(Some(-2.0)));
        // L = U ≠ 0: 3 × 5 non-NULL values, noisy
        near(
            "L=U sum",
            one(&ctx, &format!("SELECT dp_sum(x, 3, 3, {EPS}) FROM t")).await,
            15.0,
            tol(3.0),
        );
    }

    #[tokio::test]
    async fn planning_errors() {
        let ctx = ctx();
        register_t(&ctx);
        // wrong column or parameter types: the message names the argument and the accepted types
        for (sql, needle) in [
            (
                "SELECT dp_sum(g, 0, 10, 1.0) FROM t",
                "dp_sum: `value` must be numeric (integer, float or decimal",
            ),
            (
                "SELECT dp_mean(b, 0, 10, 1.0) FROM t",
                "dp_mean: `value` must be numeric",
            ),
            (
                "SELECT dp_sum(x, 'a', 10, 1.0) FROM t",
                "dp_sum: `lower` must be a number literal, got Utf8",
            ),
            (
                "SELECT dp_count(x, 1.0, 1e-6, 5) FROM t",
                "dp_count: `mechanism` must be a string literal",
            ),
            (
                "SELECT dp_count(x, 1.0, 1e-6, 'laplace', 5) FROM t",
                "dp_count: `neighbours` must be a string literal",
            ),
            (
                "SELECT dp_sum(x, 0, 10) FROM t",
                "dp_sum takes 4 to 7 arguments: dp_sum(value, lower, upper, epsilon[, delta][, mechanism][, neighbours]), got 3",
            ),
            (
                "SELECT dp_count(x) FROM t",
                "dp_count takes 2 to 5 arguments",
            ),
            (
                "SELECT dp_partition_select(x, 1.0, 1e-6, 'replace', 1) FROM t",
                "dp_partition_select takes 2 to 4 arguments",
            ),
        ] {
            let e = ctx.sql(sql).await.expect_err(sql).to_string();
            assert!(
                e.contains(needle) && e.starts_with("Error during planning"),
                "{sql}: {e}"
            );
        }
        // non-literal parameters
        let e = error(&ctx, "SELECT dp_sum(x, 0, 10, x) FROM t").await;
        assert!(e.contains("`epsilon` of dp_sum must be a literal"), "{e}");
        assert!(e.contains("Error during planning"), "{e}");
        let e = error(&ctx, "SELECT dp_mean(x, 0, i, 1.0) FROM t").await;
        assert!(e.contains("`upper` of dp_mean must be a literal"), "{e}");
        let e = error(&ctx, "SELECT g, dp_count(x, i) FROM t GROUP BY g").await;
        assert!(e.contains("`epsilon` of dp_count must be a literal"), "{e}");
        // constant expressions are fine
        near(
            "const",
            one(
                &ctx,
                &format!("SELECT dp_sum(x, 0, 5 + 5, {EPS} * 1) FROM t"),
            )
            .await,
            23.0,
            tol(10.0),
        );
        // out-of-range parameters
        for (sql, needle) in [
            (
                "SELECT dp_sum(x, 10, 0, 1.0) FROM t",
                "invalid argument 'lower'",
            ),
            ("SELECT dp_count(x, 0) FROM t", "invalid argument 'epsilon'"),
            (
                "SELECT dp_count(x, -1.0) FROM t",
                "invalid argument 'epsilon'",
            ),
            (
                "SELECT dp_mean(x, 0, 10, 1.0, 1.0) FROM t",
                "invalid argument 'delta'",
            ),
            (
                "SELECT g, dp_mean(x, 0, 10, 1.0, 1e-6, 'gaussian', 'bogus') FROM t GROUP BY g",
                "invalid argument 'neighbours'",
            ),
            (
                "SELECT g, dp_mean(x, 0, 10, 1.0, 1e-6, 'uniform') FROM t GROUP BY g",
                "invalid argument 'mechanism': got 'uniform', expected 'gaussian' (the default) \
                 or 'laplace'",
            ),
            (
                "SELECT dp_sum(x, 0, CAST('inf' AS DOUBLE), 1.0) FROM t",
                "invalid argument 'upper'",
            ),
        ] {
            let e = error(&ctx, sql).await;
            assert!(
                e.contains(needle) && e.contains("Error during planning"),
                "{sql}: {e}"
            );
        }
        // DISTINCT is refused
        let e = error(&ctx, "SELECT dp_sum(DISTINCT x, 0, 10, 1.0) FROM t").await;
        assert!(e.contains("DISTINCT"), "{e}");
    }

    #[tokio::test]
    async fn partition_selection_keeps_large_groups_only() {
        let ctx = ctx();
        let mut g = vec![Some("big"); 2000];
        g.push(Some("single"));
        let x = vec![None; 2001];
        ctx.register_batch("s", batch(g, x)).unwrap();
        let sql =
            "SELECT g, dp_count(x, 1.0) FROM s GROUP BY g HAVING dp_partition_select(g, 1.0, 1e-6)";
        let batches = collect(&ctx, sql).await;
        let groups: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                (0..a.len())
                    .map(|i| a.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(groups, ["big"]);
        let r = row(&ctx, "SELECT dp_partition_select(x, 1.0) FROM s").await;
        assert_eq!(r[0], ScalarValue::Boolean(Some(true)));
    }
}
