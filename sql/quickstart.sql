-- dpfusion quickstart: run with
--     cargo run --release -- -f sql/quickstart.sql
-- With no --private/--public flags, demo tables are registered: `salaries` (60,000 synthetic
-- employees; `job` is a public column; neighbours replace one row), `patients` (20,000
-- synthetic patients), `transactions` (purchases of 5,000 customers; the privacy unit is the
-- customer, with all their rows) and the public `stores`. Each private table has a budget of
-- ε = 5 at δ = 1e-6, kept in ./.dpfusion/ledger.jsonl.

-- 1. What would a query cost? EXPLAIN PRIVACY reads no data and charges nothing.
EXPLAIN PRIVACY
SELECT dp_mean(salary, 0, 300000, epsilon => 0.5) AS mean_salary FROM salaries;

-- 2. A noisy count and a noisy mean (named arguments in any order; delta defaults to 1e-7).
SELECT dp_count(salary, epsilon => 0.25) AS employees,
       dp_mean(salary, lower => 0, upper => 300000, epsilon => 0.5) AS mean_salary
FROM salaries;

-- 3. Row-wise expressions before the aggregate, post-processing after it (free).
SELECT round(dp_sum(CASE WHEN remote THEN 1 ELSE 0 END, 0, 1, 0.25)
             / dp_count(salary, 0.25), 3) AS remote_share
FROM salaries;

-- 4. GROUP BY the public column `job`: no partition selection is needed.
SELECT job, dp_mean(salary, 0, 300000, 0.5) AS mean_salary
FROM salaries GROUP BY job ORDER BY job;

-- 5. GROUP BY a private column of `patients`: groups are kept only when their noisy count passes
--    a threshold (partition selection), whose cost is charged too.
SELECT smoker, dp_mean(cost, 0, 20, 0.5) AS mean_cost
FROM patients GROUP BY smoker ORDER BY smoker;

-- 6. A table whose privacy unit is a customer, not a row: some customers have hundreds of
--    purchases. Each customer counts in at most 2 groups and, per group, with its total clamped
--    to [0, 500] (dp_sum) or at most 5 rows (dp_count); EXPLAIN PRIVACY's `bounds` column shows it.
SELECT dp_count_distinct(customer_id, epsilon => 0.5) AS customers,
       dp_sum(amount, 0, 500, epsilon => 0.5) AS revenue
FROM transactions;

-- 7. Join the public `stores` table (its key `store` is unique there) and group by its region.
SELECT s.region, dp_sum(t.amount, 0, 500, epsilon => 1) AS revenue
FROM transactions t JOIN stores s ON t.store = s.store
GROUP BY s.region ORDER BY s.region;

-- 8. The budget so far.
SHOW BUDGET;

-- 9. What may not be done: raw rows of a private table are refused, and nothing is read.
-- @expect-error
SELECT * FROM patients LIMIT 5;

-- 10. A query that would exceed the remaining budget is refused before it reads anything.
-- @expect-error
SELECT dp_count(salary, epsilon => 10) FROM salaries;

-- 11. Every charge, oldest first: the calls as written and each charge's share of its table's
--     budget (the shares of a table add up to its used_pct in SHOW BUDGET; a charge below a
--     millionth of the budget shows 0.0001 and adds that much more).
SELECT seq, "table", request, cost_pct, query FROM dp_ledger();
