-- An analyst's session on the catalog examples/catalog/dpfusion.toml:
--   dpfusion --catalog examples/catalog/dpfusion.toml -f examples/catalog/analyst.sql
-- Statements marked '-- @expect-error' are refusals: their error is printed and the script goes on.

-- The tables and the policy the data owner set.
SHOW TABLES;

-- Mean salary per job (job is public, so the groups need no partition selection).
SELECT job, dp_mean(salary, 0, 400000, epsilon => 0.5) AS mean_salary
FROM salaries GROUP BY job ORDER BY job;

-- Per-job means with noise relative to each mean (the owner declared the ratio bound).
SELECT rgm_mean_by(salary, job, 1.5, 2.0, min_group_size => 100) AS means FROM salaries;

-- A public table is read as usual; a DP result can be joined with it afterwards.
SELECT j.title, s.n
FROM (SELECT job, dp_count(age, epsilon => 0.3) AS n FROM salaries GROUP BY job) s
JOIN jobs j ON j.job = s.job
ORDER BY j.title;

-- Purchases protect each customer with all their purchases. Join the public shops (its key is
-- unique) and group by region; a RIGHT JOIN onto shops releases every region, even one without
-- purchases ('central'), with no partition selection. A noisy sum near zero can come out
-- negative (the noise is what protects each customer); clamping it at 0 afterwards is
-- post-processing: free, and never worse.
SELECT s.region, dp_count_distinct(p.customer, epsilon => 0.5) AS customers,
       GREATEST(dp_sum(p.amount, 0, 300, epsilon => 0.5), 0) AS spent
FROM purchases p RIGHT JOIN shops s ON p.store = s.store
GROUP BY s.region ORDER BY s.region;

-- What the session has spent.
SHOW BUDGET;

-- Refusals. Policy is the owner's: SQL cannot declare a table or weaken a policy …
-- @expect-error
CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION 'examples/catalog/data/salaries.csv'
OPTIONS ('format.has_header' 'true', 'dp.visibility' 'public');

-- … nor register the private file again under another spelling (here its directory) …
-- @expect-error
CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION 'examples/catalog/data/';

-- … nor write over it, or anywhere outside the output directory …
-- @expect-error
COPY (SELECT 1 AS a) TO '../data/salaries.csv' STORED AS CSV;

-- … nor read its rows.
-- @expect-error
SELECT * FROM salaries;
