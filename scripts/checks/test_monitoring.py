"""Tests of the monitoring checks' PromQL reading, on expressions that have
gone wrong before: a metric no binary serves, a label it does not carry, a
typo in a duration. Run by scripts/check-monitoring before the checks."""

import unittest

import monitoring


def problems_of(expr):
    problems = monitoring.Problems()
    monitoring.check_promql(expr, "test", problems)
    return problems.items


class PromqlTest(unittest.TestCase):
    def test_a_served_metric_with_its_own_labels_passes(self):
        self.assertEqual(problems_of('sum by (workflow) (rate(flotilla_jobs_failed_total[5m]))'), [])

    def test_a_metric_no_binary_serves_is_named(self):
        found = problems_of("rate(flotilla_jobs_vanished_total[5m])")
        self.assertTrue(any("flotilla_jobs_vanished_total" in p for p in found), found)

    def test_a_label_the_metric_does_not_carry_is_named(self):
        found = problems_of('sum by (colour) (rate(flotilla_jobs_failed_total[5m]))')
        self.assertTrue(any("colour" in p for p in found), found)

    def test_an_expression_that_does_not_parse_is_refused(self):
        found = problems_of("rate(flotilla_jobs_failed_total[5m]")
        self.assertTrue(any("does not parse" in p for p in found), found)


class DurationTest(unittest.TestCase):
    def test_prometheus_durations(self):
        self.assertTrue(monitoring.valid_duration("1h30m"))
        self.assertTrue(monitoring.valid_duration("90s"))
        self.assertFalse(monitoring.valid_duration("5 minutes"))
        self.assertFalse(monitoring.valid_duration(""))


if __name__ == "__main__":
    unittest.main()
