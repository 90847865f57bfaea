"""Tests of the chart checks' own helpers and of refusals that have bitten
before: selectors that match nothing, a grace period below preStop plus
the drain. Run by scripts/check-chart (from the repository root) before the
checks."""

import unittest

import chart


class SelectorTest(unittest.TestCase):
    LABELS = {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "worker"}

    def test_match_labels_and_expressions(self):
        self.assertTrue(chart.selects({"matchLabels": {"app.kubernetes.io/component": "worker"}}, self.LABELS))
        self.assertTrue(chart.selects({"matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker", "relay"]}]}, self.LABELS))

    def test_a_selector_that_matches_nothing_is_told(self):
        self.assertFalse(chart.selects({"matchLabels": {"app.kubernetes.io/component": "relay"}}, self.LABELS))
        self.assertFalse(chart.selects({"matchExpressions": [
            {"key": "tier", "operator": "Exists"}]}, self.LABELS))


class DurationTest(unittest.TestCase):
    def test_units(self):
        self.assertEqual(chart.seconds("250ms"), 0.25)
        self.assertEqual(chart.seconds("90s"), 90)
        self.assertEqual(chart.seconds("2m"), 120)
        with self.assertRaises(ValueError):
            chart.seconds("2 minutes")


class UpgradeOrderTest(unittest.TestCase):
    @staticmethod
    def doc(kind, name, hook=None, weight="0"):
        meta = {"name": name}
        if hook:
            meta["annotations"] = {"helm.sh/hook": hook, "helm.sh/hook-weight": weight}
        return {"kind": kind, "metadata": meta}

    def chart(self, **changes):
        docs = {
            "secret": self.doc("Secret", "db", "pre-install,pre-upgrade", "-10"),
            "migration": self.doc("Job", "migration", "pre-install,pre-upgrade", "0"),
            "relay": self.doc("Deployment", "relay"),
            "worker": self.doc("Deployment", "worker"),
        }
        docs.update(changes)
        return [d for d in docs.values() if d]

    def test_migrate_first_then_roll_is_the_order(self):
        self.assertEqual(chart.upgrade_order(self.chart()), [])

    def test_a_deployment_as_a_hook_or_a_migration_after_the_roll_is_told(self):
        worker_hook = chart.upgrade_order(self.chart(worker=self.doc("Deployment", "worker", "pre-upgrade", "-5")))
        self.assertEqual(len(worker_hook), 1, worker_hook)
        self.assertIn("Deployment worker is a hook", worker_hook[0])
        late = chart.upgrade_order(self.chart(migration=self.doc("Job", "migration", "post-install,post-upgrade")))
        self.assertIn("not the one migration", late[0])
        after = chart.upgrade_order(self.chart(extra=self.doc("ConfigMap", "x", "pre-upgrade", "5")))
        self.assertIn("runs with or after the migration", after[0])


class RefusalTest(unittest.TestCase):
    def test_a_grace_period_below_the_drain_is_refused(self):
        self.assertIsNone(chart.must_refuse(
            "a grace period below preStop + drain",
            {"worker": {"terminationGracePeriodSeconds": 30}}, "terminationGracePeriodSeconds"))

    def test_values_the_chart_accepts_are_reported_as_accepted(self):
        refused = chart.must_refuse("the default values", {}, "anything")
        self.assertEqual(refused, "accepted the default values")


if __name__ == "__main__":
    unittest.main()
