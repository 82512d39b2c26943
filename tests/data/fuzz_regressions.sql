-- Shrunk cases of the differential fuzzer (tests/fuzz.rs), replayed by `regressions_replay`
-- under every planted neighbour (D and D′ must not differ except in the noise). One case per
-- line; several statements of a case are separated by `;`. A comment above a case names the
-- class it found; classes still open are listed in KNOWN_OPEN in tests/fuzz.rs.
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
