-- Shrunk cases of the differential fuzzer (tests/it/fuzz.rs), replayed by `regressions_replay`
-- under every planted neighbour (D and D′ must not differ except in the noise). One case per
-- line; several statements of a case are separated by `;`. A comment above a case names the
-- class it found; classes still open are listed in KNOWN_OPEN in tests/it/fuzz.rs.
--
-- Coverage kept from the older, non-differential fuzzer (issue 10).
SELECT dp_count(age, 0.5) FROM people GROUP BY dept HAVING 1 = 1
SELECT dp_mean(salary, lower => 0, upper => 100000, epsilon => 0.5) FROM people WHERE salary > (SELECT 1)
SELECT dp_count(DISTINCT age, 0.5) FROM people
SELECT dp_count(age, 0.5) OVER () FROM people
SELECT dp_sum(salary, 0, 1e300, 1) FROM staff GROUP BY dept
CREATE TABLE r0 AS SELECT dp_count(id, 0.5) AS v0 FROM people; SELECT * FROM r0
SELECT dp_count(id, 0.5) FROM people p JOIN depts d ON p.dept = d.dept
SELECT dp_count(id, 0.5) FROM (SELECT * FROM people LIMIT 3) t
SELECT dp_count(id, 0.5) FROM people, depts
EXPLAIN ANALYZE SELECT dp_count(id, 0.5) FROM people
--
-- Found by the differential fuzzer on the code of issue 26 (open classes: KNOWN_OPEN).
-- release_order (issue 26 class 6): released groups come in hash aggregation's first-seen order;
-- D′ (one more 'eng' row, first) gives another order.
SELECT dept AS k0, dp_count(id, epsilon => 0.5) AS v0 FROM people GROUP BY dept
SELECT r.dept AS k0, dp_stddev_ci(t.salary, -10, 1000000, epsilon => 0.5)['stddev'] AS v0 FROM staff t JOIN depts r ON t.dept = r.dept AND t.dept <> 'ZQXPLANT' GROUP BY r.dept
-- subquery_unseen (issue 26 class 1): a raw subquery over a private table in a join key runs
-- with the public side before admission; its error (all names) is printed, a scan is planned.
SELECT dp_count(id, epsilon => 0.5) AS v0 FROM people p JOIN (VALUES (1),(2)) v(k) ON p.id = v.k + (SELECT CAST(string_agg(name, ',') AS BIGINT) FROM people)
SELECT t.name AS k0, dp_count(t.name, epsilon => 0.25) AS v0 FROM depts r RIGHT JOIN people t ON t.age = r.floor + (SELECT max(age) FROM staff) GROUP BY t.name
-- (shrunk by the fuzzer from a 300-character case: a raw multi-row subquery runs before admission)
SELECT dp_count_ci(t.id, 1, mechanism => 'gaussian') FROM people t JOIN depts r ON t.age = r.floor + (SELECT 1 /(age) FROM people) ORDER BY 1
-- outer_join_private_on (issue 26 class 3): a private condition in a LEFT JOIN's ON under
-- `replace`: the NULL-extended group set is released without partition selection; D′ (the
-- changed row is 'ZQXPLANT') releases group 'eng', D does not.
SELECT r.dept AS k0, dp_count(t.id, epsilon => 0.5) AS v0 FROM staff t LEFT JOIN depts r ON t.dept = r.dept AND t.name = 'ZQXPLANT' GROUP BY r.dept
--
-- Found by the differential fuzzer on the code of round 43 (seed 1795750114), both fixed.
-- A value the query sizes, evaluated by DataFusion's optimizer before the guard: 16 GiB asked
-- for while planning, the process killed (now refused at planning, fragment.rs).
SELECT dp_linreg_gd(t.age, [t.salary, t.age], epsilon => 0.25, delta => 1e-8) AS v0, dp_count_distinct(arrow_cast(NULL, 'FixedSizeList(2147483647, Int64)'), 1) AS v1 FROM people t
-- The Bonferroni share of the largest confidence below 1 rounds to 1: the interval's half-width
-- overflowed u128 (a panic in a debug build, a width of 0 in a release build; now infinite).
SELECT dp_variance_ci(t.age, 0, 100, epsilon => 1.0, confidence => 0.9999999999999999) AS v0 FROM people t
-- Round 45 (seed 4545): CREATE TABLE AS with a CASE key under ORDER BY failed after its charge
-- ("Mismatch between schema and batches": its batches were typed more loosely than its plan).
CREATE TABLE res AS SELECT CASE WHEN t.age > 50000 THEN 'hi' ELSE 'lo' END AS k0, dp_variance(r.floor, lower => 20, upper => 1000000, epsilon => 1, delta => 1e-7) AS v0 FROM people t LEFT JOIN depts r ON t.dept = r.dept AND t.age > 900000 GROUP BY CASE WHEN t.age > 50000 THEN 'hi' ELSE 'lo' END ORDER BY k0; SELECT * FROM res
-- Round 45: a key carrying a release (a scalar subquery's DP sum) differs with the noise; the
-- oracle counts such keys as noisy (a false GroupsDiffer).
SELECT (SELECT dp_sum(amount, 0, 10, epsilon => 0.1) FROM orders) k1, dp_median(arrow_cast(r.floor, 'Decimal128(3, 2)'), upper => 1000000, epsilon => 0.1, lower => 20), dp_stddev_ci(t.floor, confidence => 0.95, lower => 0, epsilon =>7, upper => 1000000)['confidence'] * ( count()) FROM depts t JOIN (VALUES ('eng', 1), ('hr', 2), ('ops', 3)) r(dept, floor) GROUP BY t.floor
-- Round 45: once CREATE TABLE AS with a private GROUP BY and ORDER BY stopped failing, the
-- groups of the stored table came from its partition selection (noisy: a false GroupsDiffer).
CREATE TABLE res AS SELECT t.dept AS k0, CASE WHEN dp_mean_ci(t.id, 0, 100000, 0.5, 1e-6, confidence => 0.95)['lower'] > 10 THEN 'big' ELSE 'small' END AS v0 FROM people t GROUP BY t.dept ORDER BY k0; SELECT * FROM res
-- Round 46 (seed 4646): a filter on a released string compared with a number was merged by the
-- physical optimizer into the partition selection's filter and ran on unreleased groups: one
-- row made the query fail (OutcomeDiffers under the staff plants).
SELECT * FROM (SELECT t.remote, CASE WHEN dp_stddev_ci(t.age, epsilon => 0.1, lower => 20, upper => 1000000)['confidence'] THEN 'big' END v0,(100, 1000000, 0.5) FROM staff t WHERE t.id > 40 GROUP BY 1 ORDER BY ( CAST(min(name) AS VARCHAR))) r WHERE r.v0 > 0
-- Round 47 (review "fuzzgaps"): the physical optimizer dropped the release's sort under a window,
-- which then broke its noise-free ties in the order the hash aggregate met the groups.
SELECT *, lag(k0) OVER (ORDER BY coalesce(length(CAST(k0 AS VARCHAR)) * 0, 0)) AS ox_w FROM (SELECT t.dept AS k0, dp_count(t.id, epsilon => 8) AS v0 FROM people t GROUP BY t.dept) r
-- Round 47 (seed 4748, a false finding of the new exact comparison: partition selection released
-- the NULL key on one side only, which the control ordered NULLs last could not see).
SELECT coalesce(v0 * 0, 0), first_value(k0) AS ox_a, first_value(k0 ORDER BY k0 NULLS FIRST) AS oc_a, array_agg(k0 ORDER BY k0 NULLS FIRST) AS oc_s FROM (SELECT t.remote AS k0, dp_count(t.id, epsilon => 8) AS v0 FROM people t GROUP BY t.remote) r GROUP BY 1
-- Round 50 (review "metadata" F1, a privacy break): a view key longer than 12 bytes kept, in its
-- buffers, the key of the group partition selection dropped (D′'s new 'ZQXPLANT' group); the
-- oracle now reads the raw bytes of results. Without the fix the struct key shows it (the sort's
-- concatenation of several batches happened to rewrite the plain key's buffers here).
SELECT CAST(concat(t.dept, '-past-twelve-bytes') AS VARCHAR) AS k0, dp_count(t.id, epsilon => 50) AS v0 FROM people t GROUP BY 1
SELECT k0, v0 FROM (SELECT CAST(concat(t.dept, '-past-twelve-bytes') AS VARCHAR) AS k0, dp_count(t.id, epsilon => 50) AS v0 FROM people t GROUP BY 1) r JOIN (VALUES ('eng-past-twelve-bytes')) v(j) ON r.k0 = v.j
SELECT named_struct('k', CAST(concat(t.dept, '-past-twelve-bytes') AS VARCHAR)) AS k0, dp_count(t.id, epsilon => 50) AS v0 FROM people t GROUP BY 1
-- Round 50 (seed 5001, 27,506 cases): a refusal named whichever duplicated public join key the
-- threads met first (1.0 on one run, inf on the next); it names the smallest now.
SELECT * FROM (SELECT t.dept AS k0, dp_sum_ci(coalesce(TRY_CAST(t.dept AS BIGINT), 3), 0, 1000000, 0.25)['upper'] AS v0 FROM staff t LEFT JOIN depts r ON t.dept = r.dept OR 2 IS NOT NULL WHERE power(power(r.floor, 1000), 0.5) = t.salary GROUP BY t.dept) r WHERE r.v0 > 0
