"""The monitoring checks; see the header of scripts/check-monitoring.

Run as `python monitoring.py RULES DASHBOARD OPERATIONS`; importable
(test_monitoring.py) without running them.
"""
import difflib
import importlib.metadata
import json
import os
import re
import sys

import promql_parser as pp
import yaml

# The operations page whose headings runbook links point at (set by main).
OPERATIONS = "docs/operations.md"

# Every metric the binaries serve at /metrics, with its own labels.
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
METRICS = {
    # worker
    "flotilla_jobs_submitted_total": (COUNTER, {"workflow"}),
    "flotilla_jobs_completed_total": (COUNTER, {"workflow"}),
    "flotilla_jobs_failed_total": (COUNTER, {"workflow"}),
    "flotilla_jobs_dead_total": (COUNTER, {"workflow"}),
    "flotilla_jobs_cancelled_total": (COUNTER, {"workflow"}),
    "flotilla_claims_total": (COUNTER, set()),
    "flotilla_step_retries_total": (COUNTER, {"class"}),
    "flotilla_step_duration_seconds": (HISTOGRAM, {"workflow", "step", "target", "outcome"}),
    "flotilla_queue_to_claim_seconds": (HISTOGRAM, set()),
    "flotilla_job_duration_seconds": (HISTOGRAM, {"workflow", "state"}),
    "flotilla_lease_losses_total": (COUNTER, set()),
    "flotilla_sweeper_requeues_total": (COUNTER, set()),
    "flotilla_requests_dead_lettered_total": (COUNTER, {"code"}),
    "flotilla_request_conflicts_total": (COUNTER, set()),
    "flotilla_signals_received_total": (COUNTER, set()),
    "flotilla_step_requests_total": (COUNTER, set()),
    "flotilla_step_requests_published_total": (COUNTER, set()),
    "flotilla_step_requests_unsendable_total": (COUNTER, set()),
    "flotilla_step_requests_dropped_total": (COUNTER, {"reason"}),
    "flotilla_step_replies_total": (COUNTER, {"outcome"}),
    "flotilla_step_reply_timeouts_total": (COUNTER, set()),
    "flotilla_step_reply_seconds": (HISTOGRAM, set()),
    "flotilla_schedule_ticks_total": (COUNTER, {"outcome"}),
    "flotilla_unreadable_messages_total": (COUNTER, set()),
    "flotilla_kafka_access_refused_total": (COUNTER, set()),
    "flotilla_consumer_lag": (GAUGE, {"topic", "partition"}),
    "flotilla_consumer_assigned_partitions": (GAUGE, {"topic"}),
    "flotilla_target_in_flight": (GAUGE, {"target"}),
    "flotilla_steps_running": (GAUGE, set()),
    "flotilla_items_done_total": (COUNTER, set()),
    "flotilla_timers_pending": (GAUGE, set()),
    "flotilla_timer_oldest_overdue_seconds": (GAUGE, set()),
    "flotilla_db_pool_connections": (GAUGE, {"state"}),
    "flotilla_tasks_dead": (GAUGE, set()),
    "flotilla_task_restarts_total": (COUNTER, {"task"}),
    # relay
    "flotilla_relay_rounds_total": (COUNTER, set()),
    "flotilla_relay_published_total": (COUNTER, set()),
    "flotilla_relay_publish_failures_total": (COUNTER, {"class", "reason"}),
    "flotilla_relay_round_panics_total": (COUNTER, set()),
    "flotilla_relay_buckets_held": (GAUGE, set()),
    "flotilla_relay_oldest_pending_seconds": (GAUGE, set()),
    "flotilla_outbox_pending": (GAUGE, set()),
    "flotilla_relay_publish_duration_seconds": (HISTOGRAM, set()),
}
# Labels Prometheus attaches to every scraped series: `job`, `instance`,
# and in Kubernetes (ServiceMonitor / pod discovery) the rest.
TARGET_LABELS = {"job", "instance", "pod", "namespace", "service", "container", "endpoint"}

SERIES = {}
for name, (kind, labels) in METRICS.items():
    if kind == HISTOGRAM:
        SERIES[name + "_bucket"] = labels | {"le"}
        SERIES[name + "_sum"] = labels
        SERIES[name + "_count"] = labels
    else:
        SERIES[name] = labels
ALL_LABELS = set().union(*SERIES.values()) | TARGET_LABELS
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")


# ---------------------------------------------------------------- PromQL
# Result types and the labels a result may carry, from the parsed tree.
SCALAR_FUNCS = {"scalar", "time", "pi"}
LABELLESS_FUNCS = {"vector", "time", "scalar", "pi", "day_of_month", "day_of_week", "day_of_year",
                   "days_in_month", "hour", "minute", "month", "year"}


def selector_labels(vs, where, problems):
    """Checks one vector selector; returns the labels its series can carry."""
    name = vs.name
    matchers = list(vs.matchers.matchers) + [m for group in vs.matchers.or_matchers for m in group]
    if name is None:
        names = [m.value for m in matchers if m.name == "__name__" and str(m.op) == "MatchOp.Equal"]
        if len(names) != 1:
            problems.add(where, "a selector without one exact metric name cannot be checked; name the metric")
            return set(ALL_LABELS)
        name = names[0]
    if name not in SERIES:
        hint = [s for s in SERIES if s.startswith(name)] or difflib.get_close_matches(name, SERIES, n=3)
        problems.add(where, f"unknown metric `{name}`" + (f" (did you mean {', '.join(sorted(hint)[:3])}?)" if hint else
                     " (not one that flotilla-worker or flotilla-relay exposes)"))
        return set(ALL_LABELS)
    kind = METRICS.get(name, (None,))[0]
    if kind == HISTOGRAM:
        problems.add(where, f"`{name}` is a histogram: select `{name}_bucket`, `_sum` or `_count`")
    labels = SERIES[name] | TARGET_LABELS
    for m in matchers:
        if m.name == "__name__":
            continue
        if m.name not in labels:
            problems.add(where, f"`{name}` has no label `{m.name}` (it has: {', '.join(sorted(labels))})")
    return labels


def analyse(node, where, problems):
    """Returns (type, labels the result may carry); records problems."""
    t = type(node).__name__
    if t == "VectorSelector":
        return "vector", selector_labels(node, where, problems)
    if t == "MatrixSelector":
        return "matrix", selector_labels(node.vector_selector, where, problems)
    if t == "NumberLiteral":
        return "scalar", set()
    if t == "StringLiteral":
        return "string", set()
    if t in ("ParenExpr", "UnaryExpr"):
        return analyse(node.expr, where, problems)
    if t == "SubqueryExpr":
        _, labels = analyse(node.expr, where, problems)
        return "matrix", labels
    if t == "Call":
        func = node.func
        if func.experimental:
            problems.add(where, f"`{func.name}` is experimental (needs a Prometheus feature flag)")
        args = [analyse(a, where, problems) for a in node.args]
        name = func.name
        if name in SCALAR_FUNCS:
            return "scalar", set()
        if name in LABELLESS_FUNCS and not args:
            return "vector", set()
        if name == "vector":
            return "vector", set()
        if name in ("absent", "absent_over_time"):
            inner = node.args[0]
            while type(inner).__name__ in ("ParenExpr", "MatrixSelector"):
                inner = inner.expr if type(inner).__name__ == "ParenExpr" else inner.vector_selector
            if type(inner).__name__ == "VectorSelector":
                return "vector", {m.name for m in inner.matchers.matchers if str(m.op) == "MatchOp.Equal"} - {"__name__"}
            return "vector", set()
        labels = set()
        for kind, l in args:
            if kind in ("vector", "matrix"):
                labels |= l
        if name == "histogram_quantile":
            if "le" not in args[1][1]:
                problems.add(where, "histogram_quantile over a vector without `le` (aggregate `by (le, ...)`)")
            labels -= {"le"}
        if name in ("label_replace", "label_join"):
            labels |= {node.args[1].val}
        return "vector", labels
    if t == "AggregateExpr":
        kind, inner = analyse(node.expr, where, problems)
        op = str(node.op)
        if node.param is not None:
            analyse(node.param, where, problems)
        mod = node.modifier
        grouping = list(mod.labels) if mod is not None else []
        for label in grouping:
            if label not in inner:
                problems.add(where, f"`{op} {str(mod.type).split('.')[-1].lower()} ({label})`: no series under it has a label `{label}`")
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return "vector", inner
        if mod is None:
            out = set()
        elif str(mod.type).endswith("By"):
            out = set(grouping)
        else:
            out = inner - set(grouping)
        if op == "count_values":
            out |= {node.param.val}
        return "vector", out
    if t == "BinaryExpr":
        lk, ll = analyse(node.lhs, where, problems)
        rk, rl = analyse(node.rhs, where, problems)
        op = str(node.op)
        mod = node.modifier
        if lk != "vector" and rk != "vector":
            return "scalar", set()
        if lk != "vector" or rk != "vector":
            return "vector", ll if lk == "vector" else rl
        matching = mod.matching if mod is not None else None
        on = matching is not None and str(matching.type).endswith("Include")
        mlabels = list(matching.labels) if matching is not None else []
        for label in mlabels:
            if on and (label not in ll or label not in rl):
                side = "left" if label not in ll else "right"
                problems.add(where, f"`on ({label})`: the {side} side of `{op}` has no label `{label}`")
            if not on and label not in ll and label not in rl:
                problems.add(where, f"`ignoring ({label})`: neither side of `{op}` has a label `{label}`")
        card = str(mod.card) if mod is not None else "OneToOne"
        group = list(mod.group_labels) if mod is not None and mod.group_labels else []
        if op in ("and", "unless"):
            return "vector", ll
        if op == "or":
            return "vector", ll | rl
        comparison = op in ("==", "!=", ">", "<", ">=", "<=") and not (mod is not None and mod.return_bool)
        if card.endswith("ManyToOne"):
            for label in group:
                if label not in rl:
                    problems.add(where, f"`group_left ({label})`: the right side has no label `{label}`")
            return "vector", ll | set(group)
        if card.endswith("OneToMany"):
            for label in group:
                if label not in ll:
                    problems.add(where, f"`group_right ({label})`: the left side has no label `{label}`")
            return "vector", rl | set(group)
        if comparison:
            return "vector", ll
        if on:
            return "vector", set(mlabels)
        return "vector", ll - set(mlabels)
    problems.add(where, f"unexpected PromQL node {t}")
    return "vector", set(ALL_LABELS)


def check_promql(expr, where, problems):
    """Parses and checks one expression; returns (type, labels) or None."""
    try:
        tree = pp.parse(expr)
    except Exception as e:  # the parser raises ValueError naming the fault
        problems.add(where, f"PromQL does not parse: {e}")
        return None
    return analyse(tree, where, problems)


# ---------------------------------------------------------------- rules
DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")


def valid_duration(value):
    return isinstance(value, str) and value != "" and DURATION.match(value) is not None


class UniqueKeyLoader(yaml.SafeLoader):
    pass


def construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key `{key}`", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)


def github_anchors(markdown_path):
    anchors, counts = set(), {}
    in_code = False
    for line in open(markdown_path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


GROUP_KEYS = {"name", "interval", "query_offset", "limit", "labels", "rules"}
ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
RECORD_KEYS = {"record", "expr", "labels"}
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = {"summary", "description", "runbook"}


def check_template(text, where, labels, problems):
    if text.count("{{") != text.count("}}"):
        problems.add(where, "unbalanced {{ }} in the template")
    for label in re.findall(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)", text):
        if label not in labels:
            problems.add(where, f"`$labels.{label}`: the expression's result has no label `{label}`"
                                f" (it keeps: {', '.join(sorted(labels)) or 'none'})")


def check_rules(path):
    problems = Problems()
    anchors = github_anchors(OPERATIONS)
    try:
        doc = yaml.load(open(path, encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        problems.add(path, f"not valid YAML: {e}")
        return problems, 0, 0
    if not isinstance(doc, dict) or set(doc) != {"groups"}:
        problems.add(path, "the file must be a mapping with exactly one key, `groups`")
        return problems, 0, 0
    groups = doc["groups"]
    if not isinstance(groups, list) or not groups:
        problems.add(path, "`groups` must be a non-empty list")
        return problems, 0, 0
    group_names, alert_names, n_rules, n_exprs = set(), set(), 0, 0
    for gi, group in enumerate(groups):
        gw = f"{path}: groups[{gi}]"
        if not isinstance(group, dict):
            problems.add(gw, "a group must be a mapping")
            continue
        for key in set(group) - GROUP_KEYS:
            problems.add(gw, f"unknown key `{key}` (allowed: {', '.join(sorted(GROUP_KEYS))})")
        name = group.get("name")
        if not isinstance(name, str) or not name:
            problems.add(gw, "`name` is required")
        elif name in group_names:
            problems.add(gw, f"group name `{name}` is repeated")
        else:
            group_names.add(name)
            gw = f"{path}: group {name}"
        for key in ("interval", "query_offset"):
            if key in group and not valid_duration(group[key]):
                problems.add(gw, f"`{key}: {group[key]!r}` is not a Prometheus duration")
        if "limit" in group and (not isinstance(group["limit"], int) or group["limit"] < 0):
            problems.add(gw, "`limit` must be a non-negative integer")
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            problems.add(gw, "`rules` must be a non-empty list")
            continue
        for ri, rule in enumerate(rules):
            rw = f"{gw}: rules[{ri}]"
            n_rules += 1
            if not isinstance(rule, dict):
                problems.add(rw, "a rule must be a mapping")
                continue
            if ("alert" in rule) == ("record" in rule):
                problems.add(rw, "a rule has exactly one of `alert` and `record`")
                continue
            if "record" in rule:
                allowed = RECORD_KEYS
                rname = rule["record"]
                if not isinstance(rname, str) or not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", rname):
                    problems.add(rw, f"`record: {rname!r}` is not a valid metric name")
                rw = f"{gw}: record {rname}"
            else:
                allowed = ALERT_KEYS
                aname = rule["alert"]
                if not isinstance(aname, str) or not LABEL_NAME.match(aname):
                    problems.add(rw, f"`alert: {aname!r}` must be an identifier (letters, digits, _)")
                elif aname in alert_names:
                    problems.add(rw, f"alert `{aname}` is defined twice")
                else:
                    alert_names.add(aname)
                    rw = f"{gw}: alert {aname}"
            for key in set(rule) - allowed:
                problems.add(rw, f"unknown key `{key}` (allowed: {', '.join(sorted(allowed))})")
            expr = rule.get("expr")
            result = None
            if not isinstance(expr, str) or not expr.strip():
                problems.add(rw, "`expr` is required and must be a string")
            else:
                n_exprs += 1
                result = check_promql(expr, f"{rw}: expr", problems)
                if result is not None and result[0] != "vector":
                    problems.add(rw, f"`expr` must yield an instant vector, not a {result[0]}")
            out_labels = result[1] if result is not None else set(ALL_LABELS)
            labels = rule.get("labels", {})
            if not isinstance(labels, dict):
                problems.add(rw, "`labels` must be a mapping")
                labels = {}
            for k, v in labels.items():
                if not isinstance(k, str) or not LABEL_NAME.match(k) or k.startswith("__"):
                    problems.add(rw, f"label name `{k}` is not valid")
                if not isinstance(v, str):
                    problems.add(rw, f"label `{k}` must be a string (quote it)")
                else:
                    check_template(v, f"{rw}: labels.{k}", out_labels, problems)
            if "record" in rule:
                continue
            if "for" not in rule:
                problems.add(rw, "`for` is required here (write `0m` for none)")
            for key in ("for", "keep_firing_for"):
                if key in rule and not valid_duration(rule[key]):
                    problems.add(rw, f"`{key}: {rule[key]!r}` is not a Prometheus duration")
            if labels.get("severity") not in SEVERITIES:
                problems.add(rw, f"`labels.severity` must be one of {', '.join(sorted(SEVERITIES))}")
            annotations = rule.get("annotations")
            if not isinstance(annotations, dict):
                problems.add(rw, "`annotations` with summary, description and runbook is required")
                continue
            for key in ANNOTATIONS - set(annotations):
                problems.add(rw, f"`annotations.{key}` is required")
            for k, v in annotations.items():
                if not isinstance(k, str) or not LABEL_NAME.match(k):
                    problems.add(rw, f"annotation name `{k}` is not valid")
                if not isinstance(v, str) or not v.strip():
                    problems.add(rw, f"annotation `{k}` must be a non-empty string")
                else:
                    check_template(v, f"{rw}: annotations.{k}", out_labels, problems)
            runbook = annotations.get("runbook")
            if isinstance(runbook, str):
                m = re.match(r"^docs/operations\.md#([a-z0-9_-]+)$", runbook)
                if not m:
                    problems.add(rw, f"runbook `{runbook}` must be docs/operations.md#<section anchor>")
                elif m.group(1) not in anchors:
                    problems.add(rw, f"runbook `{runbook}`: docs/operations.md has no section with anchor `{m.group(1)}`")
    # The README beside the rules lists every alert, and no other.
    readme = os.path.join(os.path.dirname(path), "README.md")
    if os.path.exists(readme):
        listed = set(re.findall(r"^\| `([A-Za-z0-9_]+)` \|", open(readme, encoding="utf-8").read(), re.M))
        for name in sorted(alert_names - listed):
            problems.add(readme, f"alert `{name}` is not in the alerts table")
        for name in sorted(listed - alert_names):
            problems.add(readme, f"the alerts table lists `{name}`, which {path} does not define")
    return problems, n_rules, n_exprs


# ---------------------------------------------------------------- dashboard
GRAFANA_BUILTINS = {
    "__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__interval_ms": "60000",
    "__range_s": "3600", "__range_ms": "3600000", "__dashboard": "flotilla", "__org": "1",
    "__user": "admin",
}
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text", "piechart",
               "state-timeline", "status-history", "histogram", "row"}
REQUIRED_ROWS = ["Jobs", "Steps", "Ingestion", "Engine health", "Relay"]
VARIABLE = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[A-Za-z]+)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]")


def substitute(expr, variables, where, problems):
    def replace(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        if name in variables:
            return variables[name]
        problems.add(where, f"undefined dashboard variable `${name}`")
        return "undefined"
    return VARIABLE.sub(replace, expr)


def reject_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise ValueError(f"duplicate key(s) {', '.join(sorted(dupes))}")
    return dict(pairs)


def check_dashboard(path):
    problems = Problems()
    try:
        doc = json.load(open(path, encoding="utf-8"), object_pairs_hook=reject_duplicates)
    except ValueError as e:
        problems.add(path, f"not valid JSON: {e}")
        return problems, 0, 0
    if not isinstance(doc, dict):
        problems.add(path, "a dashboard is a JSON object")
        return problems, 0, 0
    if doc.get("schemaVersion") != 39:
        problems.add(path, f"schemaVersion must be 39, not {doc.get('schemaVersion')!r}")
    for key in ("title", "uid"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            problems.add(path, f"`{key}` is required")
    if isinstance(doc.get("uid"), str) and not re.match(r"^[a-zA-Z0-9_-]{1,40}$", doc["uid"]):
        problems.add(path, "`uid` must be at most 40 letters, digits, - or _")

    # Template variables: their values stand in for $name when parsing.
    variables = {}
    tlist = (doc.get("templating") or {}).get("list")
    if not isinstance(tlist, list):
        problems.add(path, "`templating.list` is required")
        tlist = []
    for i, var in enumerate(tlist):
        vw = f"{path}: templating.list[{i}]"
        if not isinstance(var, dict) or not isinstance(var.get("name"), str) or not var.get("type"):
            problems.add(vw, "a variable needs `name` and `type`")
            continue
        name = var["name"]
        if name in variables:
            problems.add(vw, f"variable `{name}` is defined twice")
        vtype = var["type"]
        if vtype == "datasource":
            variables[name] = "datasource"
        elif vtype == "query":
            q = var.get("query")
            qtext = q.get("query") if isinstance(q, dict) else q
            m = re.match(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", qtext or "")
            if not m:
                problems.add(vw, f"`{name}`: expected label_values(<selector>, <label>), got {qtext!r}")
            else:
                result = check_promql(m.group(1), f"{vw} ({name})", problems)
                if result is not None and m.group(2) not in result[1]:
                    problems.add(vw, f"`{name}`: {m.group(1)} has no label `{m.group(2)}`")
            if var.get("definition") not in (None, qtext):
                problems.add(vw, f"`{name}`: `definition` differs from the query")
            # A multi-value or All selection renders as a regex alternation.
            variables[name] = "a|b" if var.get("multi") or var.get("includeAll") else "a"
        else:
            variables[name] = "a"
    ds = [v for v in tlist if isinstance(v, dict) and v.get("name") == "datasource"]
    if not ds or ds[0].get("type") != "datasource" or ds[0].get("query") != "prometheus":
        problems.add(path, "a `datasource` variable of type datasource with query `prometheus` is required")
    wf = [v for v in tlist if isinstance(v, dict) and v.get("name") == "workflow"]
    if not wf or wf[0].get("type") != "query":
        problems.add(path, "a `workflow` query variable (label_values) is required")
    elif (wf[0].get("datasource") or {}).get("uid") != "${datasource}":
        problems.add(path, "the `workflow` variable must use the `${datasource}` variable")

    panels = doc.get("panels")
    if not isinstance(panels, list) or not panels:
        problems.add(path, "`panels` must be a non-empty list")
        return problems, 0, 0
    flat = []
    for p in panels:
        flat.append(p)
        if isinstance(p, dict) and p.get("type") == "row":
            flat.extend(p.get("panels") or [])
    ids, rows, boxes, n_panels, n_exprs = {}, [], [], 0, 0
    for i, p in enumerate(flat):
        pw = f"{path}: panel[{i}]"
        if not isinstance(p, dict):
            problems.add(pw, "a panel is an object")
            continue
        title = p.get("title")
        if isinstance(title, str) and title:
            pw = f"{path}: panel {title!r}"
        else:
            problems.add(pw, "`title` is required")
        pid = p.get("id")
        if not isinstance(pid, int) or isinstance(pid, bool):
            problems.add(pw, "`id` must be an integer")
        elif pid in ids:
            problems.add(pw, f"id {pid} is used by panel {ids[pid]!r} too")
        else:
            ids[pid] = title
        ptype = p.get("type")
        if ptype not in PANEL_TYPES:
            problems.add(pw, f"unknown panel type {ptype!r}")
        g = p.get("gridPos")
        if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in "hwxy"):
            problems.add(pw, "`gridPos` with integer h, w, x, y is required")
        elif g["w"] < 1 or g["h"] < 1 or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
            problems.add(pw, f"gridPos {g} does not fit the 24-column grid")
        else:
            for other, og in boxes:
                if (g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"]
                        and g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]):
                    problems.add(pw, f"overlaps panel {other!r}")
            boxes.append((title, g))
        if ptype == "row":
            rows.append(title)
            continue
        n_panels += 1
        if not isinstance(p.get("description"), str) or not p["description"].strip():
            problems.add(pw, "`description` is required")
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            problems.add(pw, "`datasource.uid` must be `${datasource}`")
        targets = p.get("targets")
        if ptype == "text":
            continue
        if not isinstance(targets, list) or not targets:
            problems.add(pw, "`targets` must be a non-empty list")
            continue
        refids = set()
        for t in targets:
            tw = f"{pw}: target {t.get('refId', '?')}" if isinstance(t, dict) else pw
            if not isinstance(t, dict):
                problems.add(tw, "a target is an object")
                continue
            ref = t.get("refId")
            if not isinstance(ref, str) or not ref:
                problems.add(tw, "`refId` is required")
            elif ref in refids:
                problems.add(tw, f"refId {ref} is repeated")
            refids.add(ref)
            if "datasource" in t and (t["datasource"] or {}).get("uid") != "${datasource}":
                problems.add(tw, "the target's `datasource.uid` must be `${datasource}`")
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                problems.add(tw, "`expr` is required")
                continue
            n_exprs += 1
            result = check_promql(substitute(expr, variables, tw, problems), f"{tw}: expr", problems)
            if result is None:
                continue
            if result[0] not in ("vector", "scalar"):
                problems.add(tw, f"the expr yields a {result[0]}; a panel needs a vector or scalar")
            legend = t.get("legendFormat", "")
            for label in re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend or ""):
                if label not in result[1]:
                    problems.add(tw, f"legend `{{{{{label}}}}}`: the expr's result has no label `{label}`"
                                     f" (it keeps: {', '.join(sorted(result[1])) or 'none'})")
    for want in REQUIRED_ROWS:
        if want not in rows:
            problems.add(path, f"row {want!r} is missing (rows: {', '.join(map(str, rows))})")
    return problems, n_panels, n_exprs



def main(argv):
    global OPERATIONS
    rules, dashboard, OPERATIONS = argv[1:4]
    rp, n_rules, rule_exprs = check_rules(rules)
    for item in rp.items:
        print(f"check-monitoring: {item}", file=sys.stderr)
    parser = f"promql-parser {importlib.metadata.version('promql-parser')}"
    print(f"{rules}: {'FAIL' if rp.items else 'ok'}: {n_rules} rules, {rule_exprs} PromQL exprs parsed by {parser},"
          f" {len(rp.items)} problems")
    dp, n_panels, dash_exprs = check_dashboard(dashboard)
    for item in dp.items:
        print(f"check-monitoring: {item}", file=sys.stderr)
    print(f"{dashboard}: {'FAIL' if dp.items else 'ok'}: {n_panels} panels, {dash_exprs} PromQL exprs parsed by {parser}, {len(dp.items)} problems")
    return (1 if rp.items or dp.items else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
