"""The chart checks; see the header of scripts/check-chart.

Run as `python chart.py` from the repository root; importable
(test_chart.py) without running them.
"""
import copy
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

import helm_python
import jsonschema
import yaml
from kubernetes_validate import utils as kv

CHART = "charts/flotilla"
KUBE = "1.30.0"
RELEASE, NAMESPACE = "prod", "flotilla"
CUSTOM_GROUPS = ("monitoring.coreos.com/", "keda.sh/")

started = time.monotonic()
helm_python.disable_logging()

# --- hand-written schemas of the custom resources, for the fields used -------

DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                           "namespace": {"type": "string"}, "labels": STRMAP, "annotations": STRMAP}}
LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": STRMAP,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False,
        "properties": {"key": {"type": "string"},
                       "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                 "properties": {
                     "selector": LABEL_SELECTOR,
                     "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                         "any": {"type": "boolean"},
                         "matchNames": {"type": "array", "items": {"type": "string"}}}},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False,
                         "properties": {"port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                                        "interval": DURATION, "scrapeTimeout": DURATION}}}}}}}
SCALED_OBJECT = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                 "properties": {
                     "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                       "name": {"type": "string"}}},
                     "minReplicaCount": {"type": "integer", "minimum": 0},
                     "maxReplicaCount": {"type": "integer", "minimum": 1},
                     "pollingInterval": {"type": "integer", "minimum": 1},
                     "cooldownPeriod": {"type": "integer", "minimum": 0},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                         "properties": {
                             "type": {"enum": ["kafka", "postgresql"]},
                             # KEDA's metadata is map[string]string: a number here is refused by the CRD.
                             "metadata": STRMAP,
                             "authenticationRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                                   "properties": {"name": {"type": "string"},
                                                                  "kind": {"enum": ["TriggerAuthentication",
                                                                                    "ClusterTriggerAuthentication"]}}}},
                         "allOf": [
                             {"if": {"properties": {"type": {"const": "kafka"}}},
                              "then": {"properties": {"metadata": {
                                  "required": ["bootstrapServers", "consumerGroup", "topic", "lagThreshold"],
                                  "propertyNames": {"enum": ["bootstrapServers", "consumerGroup", "topic", "lagThreshold",
                                                             "activationLagThreshold", "offsetResetPolicy",
                                                             "allowIdleConsumers", "scaleToZeroOnInvalidOffset",
                                                             "limitToPartitionsWithLag"]},
                                  "properties": {"offsetResetPolicy": {"enum": ["earliest", "latest"]},
                                                 "allowIdleConsumers": {"enum": ["true", "false"]}}}}}},
                             {"if": {"properties": {"type": {"const": "postgresql"}}},
                              "then": {"properties": {"metadata": {
                                  "required": ["query", "targetQueryValue"],
                                  "propertyNames": {"enum": ["query", "targetQueryValue", "activationTargetQueryValue",
                                                             "connectionFromEnv", "host", "port", "userName",
                                                             "dbName", "sslmode", "passwordFromEnv"]}}},
                                       "anyOf": [{"required": ["authenticationRef"]},
                                                 {"properties": {"metadata": {"required": ["connectionFromEnv"]}}}]}}]}}}}}}
CUSTOM_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
                  ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT}

# --- what the binaries read --------------------------------------------------

def binary_env_names():
    """Every `env = "NAME"` of a clap argument in the workspace's sources."""
    names = set()
    for path in glob.glob("*/src/**/*.rs", recursive=True):
        with open(path, encoding="utf-8") as f:
            names.update(re.findall(r'\benv\s*=\s*"([A-Z0-9_]+)"', f.read()))
    return names

KNOWN_ENV = binary_env_names()
CHECKED_ENV = re.compile(r"^(FLOTILLA_|KAFKA_|SCHEMA_REGISTRY_|DATABASE_URL$)")
LIBPQ_ENV = {"PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGHOST", "PGPORT", "PGUSER",
             "PGPASSWORD", "PGDATABASE"}

# --- helpers -------------------------------------------------------------------

def seconds(duration):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", duration)
    if not m:
        raise ValueError(f"duration {duration!r}")
    n, unit = int(m.group(1)), m.group(2)
    return {"ms": n / 1000, "s": n, "m": n * 60, "h": n * 3600}[unit]


def pod_spec(doc):
    kind = doc.get("kind")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return doc["spec"]["template"]["spec"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if kind == "Pod":
        return doc["spec"]
    return None


def containers(spec):
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])


def hook_of(doc):
    ann = (doc.get("metadata") or {}).get("annotations") or {}
    if "helm.sh/hook" not in ann:
        return None
    return ({h.strip() for h in ann["helm.sh/hook"].split(",")}, int(ann.get("helm.sh/hook-weight", "0")))


def upgrade_order(docs):
    """What breaks the upgrade order docs/upgrading.md gives, one sentence
    each: the migration runs first, as the only pre-install,pre-upgrade
    hook Job, and nothing after the Secrets it reads comes before it; the
    relay and worker Deployments roll after it, in the release's own
    phase (never as hooks); no hook runs after the Deployments roll."""
    problems = []
    jobs = [d for d in docs if d.get("kind") == "Job"]
    migrations = [j for j in jobs if (hook_of(j) or [set()])[0] >= {"pre-install", "pre-upgrade"}]
    if len(migrations) != 1:
        problems.append(f"{len(migrations)} pre-install,pre-upgrade hook Jobs, not the one migration")
        return problems
    weight = hook_of(migrations[0])[1]
    for d in docs:
        hook = hook_of(d)
        name = f"{d.get('kind')} {d.get('metadata', {}).get('name')}"
        if d.get("kind") == "Deployment" and hook:
            problems.append(f"{name} is a hook ({', '.join(sorted(hook[0]))}): it must roll after the migration")
        elif hook and hook[0] & {"post-install", "post-upgrade"}:
            problems.append(f"{name} is a {', '.join(sorted(hook[0]))} hook: nothing runs after the Deployments roll")
        elif hook and d is not migrations[0] and "pre-upgrade" in hook[0] and d.get("kind") != "Secret" \
                and hook[1] >= weight:
            problems.append(f"{name} is a pre-upgrade hook that runs with or after the migration")
    return problems


def selects(selector, labels):
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        have = e["key"] in labels
        if e["operator"] == "In" and labels.get(e["key"]) not in e.get("values", []):
            return False
        if e["operator"] == "NotIn" and labels.get(e["key"]) in e.get("values", []):
            return False
        if e["operator"] == "Exists" and not have:
            return False
        if e["operator"] == "DoesNotExist" and have:
            return False
    return True


def user_named_secrets(values):
    """Secrets named in values: existingSecret (with its key), imagePullSecrets,
    and Secrets referenced by raw Kubernetes objects in values (extraEnv,
    extraVolumes...). Returns {name: set of keys or None for any key}."""
    named = {}

    def add(name, key=None):
        if not name:
            return
        keys = named.setdefault(name, set())
        if keys is not None:
            if key is None:
                named[name] = None
            else:
                keys.add(key)

    def walk(node, parent=None):
        if isinstance(node, dict):
            if node.get("existingSecret"):
                add(node["existingSecret"], node.get("existingSecretKey"))
            if isinstance(node.get("secretName"), str):
                add(node["secretName"])
            if parent in ("secretKeyRef",) and node.get("name"):
                add(node["name"], node.get("key"))
            if parent in ("secretRef", "secret") and node.get("name"):
                add(node["name"])
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for item in node:
                walk(item, parent)

    walk(values)
    for name in values.get("imagePullSecrets") or []:
        add(name)
    return named


def secret_refs(spec):
    """(secret name, key or None, where) of everything a pod spec reads."""
    refs = []
    for c in containers(spec):
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], ref["key"], f"{c['name']} env {e['name']}"))
        for e in c.get("envFrom") or []:
            if e.get("secretRef"):
                refs.append((e["secretRef"]["name"], None, f"{c['name']} envFrom"))
    for v in spec.get("volumes") or []:
        if v.get("secret"):
            items = v["secret"].get("items") or [None]
            for item in items:
                refs.append((v["secret"]["secretName"], item and item["key"], f"volume {v['name']}"))
        for source in (v.get("projected") or {}).get("sources") or []:
            if source.get("secret"):
                for item in source["secret"].get("items") or [None]:
                    refs.append((source["secret"]["name"], item and item["key"], f"volume {v['name']}"))
    for s in spec.get("imagePullSecrets") or []:
        refs.append((s["name"], None, "imagePullSecrets"))
    return refs


def configmap_refs(spec):
    refs = []
    for v in spec.get("volumes") or []:
        if v.get("configMap"):
            refs.append(v["configMap"]["name"])
        for source in (v.get("projected") or {}).get("sources") or []:
            if source.get("configMap"):
                refs.append(source["configMap"]["name"])
    return refs


FILE_ENV = re.compile(r"(_FILE|_LOCATION|_DIR|^PGSSLROOTCERT|^PGSSLCERT|^PGSSLKEY)$")


def volume_files(volume, by_kind):
    """File names a volume provides, or None when unknown (an existing Secret)."""
    if volume.get("configMap"):
        if volume["configMap"].get("items"):
            return {i["path"] for i in volume["configMap"]["items"]}
        cm = by_kind.get("ConfigMap", {}).get(volume["configMap"]["name"])
        return set((cm or {}).get("data") or {})
    if volume.get("secret"):
        if volume["secret"].get("items"):
            return {i["path"] for i in volume["secret"]["items"]}
        s = by_kind.get("Secret", {}).get(volume["secret"]["secretName"])
        return None if s is None else set(s.get("data") or {}) | set(s.get("stringData") or {})
    if volume.get("projected"):
        files = set()
        for source in volume["projected"].get("sources") or []:
            for kind in ("secret", "configMap"):
                if source.get(kind):
                    if not source[kind].get("items"):
                        return None
                    files |= {i["path"] for i in source[kind]["items"]}
        return files
    return set()


def env_map(container):
    return {e["name"]: e for e in container.get("env") or []}

# --- the checks of one values file --------------------------------------------

def check(label, values, outdir):
    errors = []
    err = errors.append
    chart = helm_python.Chart.load(CHART)

    report = helm_python.lint(CHART, values, strict=True, kube_version="v" + KUBE)
    for message in report.get("messages", []):
        if message["severity"] >= 2:
            err(f"lint: {message['path']}: {message['error']}")
    for e in report.get("errors", []):
        err(f"lint: {e}")
    if errors:
        return errors, None

    merged = chart.merge_values(values)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    notes = ""
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            notes = text
            continue
        try:
            loaded = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as e:
            err(f"{template}: not YAML: {e}")
            continue
        for d in loaded:
            d["_template"] = template
            docs.append(d)
    for i, d in enumerate(docs):
        name = f"{i:02d}-{d.get('kind', 'unknown').lower()}-{d.get('metadata', {}).get('name', 'unnamed')}.yaml"
        with open(os.path.join(outdir, name), "w") as f:
            yaml.safe_dump({k: v for k, v in d.items() if k != "_template"}, f, sort_keys=False)

    # Schemas: Kubernetes (kubernetes-validate, strict) and the custom resources.
    validated, custom = 0, []
    for d in docs:
        plain = {k: v for k, v in d.items() if k != "_template"}
        where = f"{d['_template']}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
        api = d.get("apiVersion", "")
        if api.startswith(CUSTOM_GROUPS):
            schema = CUSTOM_SCHEMAS.get((api, d.get("kind")))
            if schema is None:
                err(f"{where}: a custom resource without a schema here")
                continue
            for e in jsonschema.Draft7Validator(schema).iter_errors(plain):
                err(f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
            custom.append(d["kind"])
            continue
        try:
            kv.validate(plain, KUBE, strict=True)
            validated += 1
        except kv.ValidationError as e:
            err(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
        except kv.SchemaNotFoundError:
            err(f"{where}: no Kubernetes {KUBE} schema for {api} {d.get('kind')}")

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    deployments = by_kind.get("Deployment", {})
    secrets = by_kind.get("Secret", {})
    user_secrets = user_named_secrets(merged)
    full = next((n[: -len("-worker")] for n in deployments if n.endswith("-worker")), None)
    worker = deployments.get(f"{full}-worker")
    relay = deployments.get(f"{full}-relay")
    if worker is None:
        err("no worker Deployment")
        return errors, None
    if merged["relay"]["enabled"] and relay is None:
        err("relay.enabled but no relay Deployment")

    # Autoscaling: the ScaledObject owns the replica count.
    autoscaling = merged["autoscaling"]["enabled"]
    if autoscaling and "replicas" in worker["spec"]:
        err("autoscaling on, yet the worker Deployment sets replicas")
    if not autoscaling and "replicas" not in worker["spec"]:
        err("autoscaling off, yet the worker Deployment sets no replicas")
    scaled = by_kind.get("ScaledObject", {})
    if autoscaling != bool(scaled):
        err(f"autoscaling.enabled is {autoscaling} but {len(scaled)} ScaledObject(s) rendered")
    for so in scaled.values():
        if so["spec"]["scaleTargetRef"]["name"] not in deployments:
            err(f"ScaledObject {so['metadata']['name']} targets a Deployment that is not rendered")
        for trigger in so["spec"]["triggers"]:
            env_name = trigger["metadata"].get("connectionFromEnv")
            if env_name and env_name not in env_map(worker["spec"]["template"]["spec"]["containers"][0]):
                err(f"ScaledObject reads {env_name}, which the worker container does not set")

    workloads = [d for d in docs if pod_spec(d) is not None]
    for d in workloads:
        spec = pod_spec(d)
        where = f"{d['kind']}/{d['metadata']['name']}"
        hook = hook_of(d)

        # Security context of every container (and the pod's).
        psc = spec.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True:
            err(f"{where}: pod securityContext.runAsNonRoot is not true")
        if spec.get("automountServiceAccountToken") is not False:
            err(f"{where}: the service account token is mounted")
        for c in containers(spec):
            sc = c.get("securityContext") or {}
            wrong = []
            if sc.get("runAsNonRoot") is not True:
                wrong.append("runAsNonRoot")
            if sc.get("readOnlyRootFilesystem") is not True:
                wrong.append("readOnlyRootFilesystem")
            if sc.get("allowPrivilegeEscalation") is not False:
                wrong.append("allowPrivilegeEscalation")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                wrong.append("capabilities.drop ALL")
            if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
                wrong.append("seccompProfile RuntimeDefault")
            if sc.get("runAsUser", psc.get("runAsUser")) != 10001:
                wrong.append("runAsUser 10001")
            if wrong:
                err(f"{where}: container {c['name']}: securityContext lacks {', '.join(wrong)}")
            if not (c.get("resources") or {}).get("requests"):
                err(f"{where}: container {c['name']}: no resource requests")
            # Every Flotilla variable is one a binary reads.
            for e in c.get("env") or []:
                n = e["name"]
                if CHECKED_ENV.match(n) and n not in KNOWN_ENV:
                    err(f"{where}: container {c['name']}: {n} is read by no binary")

        # Every Secret (and key) read exists: rendered, or named in values.
        for name, key, what in secret_refs(spec):
            rendered_secret = secrets.get(name)
            if rendered_secret is not None:
                keys = set(rendered_secret.get("data") or {}) | set(rendered_secret.get("stringData") or {})
                if key is not None and key not in keys:
                    err(f"{where}: {what}: Secret {name} has no key {key}")
                if hook and "pre-install" in hook[0]:
                    secret_hook = hook_of(rendered_secret)
                    if not secret_hook or "pre-install" not in secret_hook[0] or secret_hook[1] >= hook[1]:
                        err(f"{where}: {what}: Secret {name} is not a pre-install hook of lower weight, "
                            f"so it does not exist when this hook runs")
            elif name in user_secrets:
                keys = user_secrets[name]
                if key is not None and keys is not None and key not in keys:
                    err(f"{where}: {what}: key {key} of Secret {name} is not the one named in values ({sorted(keys)})")
            else:
                err(f"{where}: {what}: Secret {name} is neither rendered nor named in values")
        for name in configmap_refs(spec):
            cm = by_kind.get("ConfigMap", {}).get(name)
            if cm is None:
                err(f"{where}: ConfigMap {name} is not rendered")
            elif hook and "pre-install" in hook[0] and not hook_of(cm):
                err(f"{where}: ConfigMap {name} does not exist yet when this hook runs")
        sa = spec.get("serviceAccountName", "default")
        rendered_sa = by_kind.get("ServiceAccount", {}).get(sa)
        if rendered_sa is not None and hook and "pre-install" in hook[0] and not hook_of(rendered_sa):
            err(f"{where}: service account {sa} does not exist yet when this hook runs")
        if sa != "default" and rendered_sa is None and not (
                not merged["serviceAccount"]["create"] and merged["serviceAccount"]["name"] == sa):
            err(f"{where}: service account {sa} is neither rendered nor named in values")

        # Every path a variable names is provided by a mounted volume.
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for c in containers(spec):
            mounts = c.get("volumeMounts") or []
            for e in c.get("env") or []:
                path = e.get("value")
                if not (isinstance(path, str) and path.startswith("/") and FILE_ENV.search(e["name"])):
                    continue
                if e["name"].endswith("_DIR"):
                    if not any(m["mountPath"] == path for m in mounts):
                        err(f"{where}: {e['name']}={path}: no volume is mounted there")
                    continue
                directory, file = path.rsplit("/", 1)
                mount = next((m for m in mounts if m["mountPath"] == directory), None)
                if mount is None:
                    err(f"{where}: {e['name']}={path}: no volume is mounted at {directory}")
                    continue
                files = volume_files(volumes.get(mount["name"], {}), by_kind)
                if files is not None and file not in files:
                    err(f"{where}: {e['name']}={path}: volume {mount['name']} holds {sorted(files)}, not {file}")

        # Long-running workloads: grace period above preStop + drain.
        if d["kind"] == "Deployment":
            c = spec["containers"][0]
            env = env_map(c)
            grace = spec.get("terminationGracePeriodSeconds", 30)
            pre = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
            pause = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else None
            if pause is None:
                err(f"{where}: no preStop sleep")
            drain = env.get("FLOTILLA_SHUTDOWN_GRACE", {}).get("value")
            if drain is None:
                err(f"{where}: no FLOTILLA_SHUTDOWN_GRACE")
            # The worker hands back what still runs and leaves the fleet
            # after its drain: 15 s more (half its default lease plus 1 s).
            wind_down = 15 if "FLOTILLA_WORKER_ID" in env else 0
            if pause is not None and not grace > pause + seconds(drain) + wind_down:
                err(f"{where}: terminationGracePeriodSeconds {grace} <= preStop {pause} s + drain {drain} + wind-down {wind_down} s")

    # Worker and relay: identity from the pod name, probes on the listening port.
    for deployment, id_var, addr_var in ((worker, "FLOTILLA_WORKER_ID", "FLOTILLA_HTTP_ADDR"),
                                         (relay, "FLOTILLA_RELAY_ID", "FLOTILLA_RELAY_HTTP_ADDR")):
        if deployment is None:
            continue
        where = f"Deployment/{deployment['metadata']['name']}"
        c = deployment["spec"]["template"]["spec"]["containers"][0]
        env = env_map(c)
        field = ((env.get(id_var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if field != "metadata.name":
            err(f"{where}: {id_var} does not come from the pod name")
        port = int(env.get(addr_var, {}).get("value", ":0").rsplit(":", 1)[1])
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
        if ports.get("http") != port:
            err(f"{where}: container port http {ports.get('http')} is not the port of {addr_var} ({port})")
        # The worker's probes may use the listener of their own.
        allowed = {"http", port}
        health_addr = env.get("FLOTILLA_HEALTH_ADDR", {}).get("value")
        if health_addr is not None:
            health_port = int(health_addr.rsplit(":", 1)[1])
            if ports.get("health") != health_port:
                err(f"{where}: container port health {ports.get('health')} is not the port of FLOTILLA_HEALTH_ADDR ({health_port})")
            allowed |= {"health", health_port}
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = (c.get(probe) or {}).get("httpGet") or {}
            if get.get("path") != path or get.get("port") not in allowed:
                err(f"{where}: {probe} is not GET {path} on port {port} or the health listener")
        if merged["worker"]["consumeRequests"] and deployment is worker and env.get("FLOTILLA_CONSUME_REQUESTS", {}).get("value") != "true":
            err(f"{where}: consumeRequests on but FLOTILLA_CONSUME_REQUESTS is not true")

    # The upgrade order (docs/upgrading.md): migrate first, then roll.
    if merged["migration"]["enabled"]:
        for problem in upgrade_order(docs):
            err(f"upgrade order: {problem}")

    # The migration hook.
    jobs = by_kind.get("Job", {})
    if merged["migration"]["enabled"]:
        migration = [j for j in jobs.values() if (hook_of(j) or [set()])[0] >= {"pre-install", "pre-upgrade"}]
        if len(migration) != 1:
            err("migration.enabled but no pre-install,pre-upgrade hook Job")
        else:
            c = migration[0]["spec"]["template"]["spec"]["containers"][0]
            if (c.get("command") or []) + (c.get("args") or []) != ["/usr/local/bin/flotilla-worker", "migrate"]:
                err("the migration Job does not run `flotilla-worker migrate`")
            if "DATABASE_URL" not in env_map(c):
                err("the migration Job has no DATABASE_URL")
    elif jobs:
        err("migration.enabled is false but a Job is rendered")

    # What the workers read at start-up: the targets file, the definitions
    # (each step's target must be in the targets file, or registration
    # fails), the Kafka properties.
    wspec = worker["spec"]["template"]["spec"]
    wenv = env_map(wspec["containers"][0])

    def mounted_text(path):
        """The content of a file the worker reads from a chart ConfigMap/Secret."""
        directory, file = path.rsplit("/", 1)
        mount = next(m for m in wspec["containers"][0]["volumeMounts"] if m["mountPath"] == directory)
        volume = next(v for v in wspec["volumes"] if v["name"] == mount["name"])
        if volume.get("configMap"):
            return (by_kind["ConfigMap"][volume["configMap"]["name"]].get("data") or {})[file]
        return secrets[volume["secret"]["secretName"]]["stringData"][file]

    targets = {}
    try:
        doc = yaml.safe_load(mounted_text(wenv["FLOTILLA_TARGETS_FILE"]["value"]))
        targets = doc["targets"] or {}
        for name, target in targets.items():
            if target.get("kind") != "http" or not re.match(r"^https?://[^{}\s]+$", str(target.get("base_url"))):
                err(f"targets file: target {name}: kind http with an http(s) base_url expected, got {target}")
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        err(f"targets file: unreadable: {e!r}")
    directory = wenv["FLOTILLA_WORKFLOWS_DIR"]["value"]
    mount = next(m for m in wspec["containers"][0]["volumeMounts"] if m["mountPath"] == directory)
    volume = next(v for v in wspec["volumes"] if v["name"] == mount["name"])
    definitions = by_kind["ConfigMap"][volume["configMap"]["name"]].get("data") or {}
    for file, text in definitions.items():
        try:
            d = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
            if not isinstance(d, dict) or not d.get("name") or not d.get("steps"):
                err(f"workflow {file}: a definition needs a name and steps")
                continue
            for step in d["steps"]:
                if step.get("target") not in targets:
                    err(f"workflow {file}: step {step.get('name')}: target {step.get('target')!r} is not in the targets file")
        except ValueError as e:
            err(f"workflow {file}: not {'JSON' if file.endswith('.json') else 'YAML'}: {e}")
    if "FLOTILLA_KAFKA_PROPERTIES_FILE" in wenv:
        text = mounted_text(wenv["FLOTILLA_KAFKA_PROPERTIES_FILE"]["value"])
        lines = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith(("#", "!"))]
        if len(lines) != len(merged["kafkaProperties"]) or not all(re.match(r"^[a-z0-9._-]+=", l) for l in lines):
            err(f"kafka properties file: one key=value line per kafkaProperties entry expected:\n{text}")

    # Selectors match what is rendered.
    def pod_labels(d):
        return d["spec"]["template"]["metadata"].get("labels") or {}

    for svc in by_kind.get("Service", {}).values():
        matched = [d for d in deployments.values() if selects({"matchLabels": svc["spec"]["selector"]}, pod_labels(d))]
        if len(matched) != 1:
            err(f"Service/{svc['metadata']['name']} selects {len(matched)} Deployments")
            continue
        names = {p.get("name") for c in matched[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports") or []}
        for p in svc["spec"]["ports"]:
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in names:
                err(f"Service/{svc['metadata']['name']}: targetPort {p['targetPort']} is no container port")
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for d in by_kind.get(kind, {}).values():
            selector = d["spec"]["selector"] if kind == "PodDisruptionBudget" else d["spec"]["podSelector"]
            if sum(selects(selector, pod_labels(x)) for x in deployments.values()) != 1:
                err(f"{kind}/{d['metadata']['name']} does not select exactly one Deployment")
    for sm in by_kind.get("ServiceMonitor", {}).values():
        services = [s for s in by_kind.get("Service", {}).values() if selects(sm["spec"]["selector"], s["metadata"].get("labels") or {})]
        want = 1 + bool(relay)
        if len(services) != want:
            err(f"ServiceMonitor/{sm['metadata']['name']} selects {len(services)} Services, not {want}")
        for s in services:
            for e in sm["spec"]["endpoints"]:
                if e["port"] not in {p.get("name") for p in s["spec"]["ports"]}:
                    err(f"ServiceMonitor endpoint port {e['port']} is not a port of Service/{s['metadata']['name']}")
    for key, kind in (("serviceMonitor", "ServiceMonitor"), ("networkPolicy", "NetworkPolicy")):
        if merged[key]["enabled"] != bool(by_kind.get(kind)):
            err(f"{key}.enabled is {merged[key]['enabled']} but {len(by_kind.get(kind, {}))} {kind}(s) rendered")

    # The notes tell how to produce a request and follow the events.
    for needle in ("flotilla produce --workflow", "flotilla tail", "kubectl"):
        if needle not in notes:
            err(f"NOTES.txt does not mention {needle!r}")

    summary = (f"{len(docs)} resources; {validated} validated against Kubernetes {KUBE} (strict); "
               f"{len(custom)} custom ({', '.join(sorted(custom)) or 'none'}) against hand-written schemas")
    return errors, summary


def must_refuse(label, values, needle):
    """Values the chart must refuse, with a message containing needle."""
    try:
        helm_python.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    except helm_python.HelmError as e:
        if needle in str(e):
            return None
        return f"refused {label}, but not for the expected reason: {e}"
    return f"accepted {label}"


def main():
    outroot = tempfile.mkdtemp(prefix="check-chart.")
    failed = False
    cases = [("default values", {})]
    for path in sorted(glob.glob(f"{CHART}/ci/*-values.yaml")):
        with open(path) as f:
            cases.append((path, yaml.safe_load(f) or {}))
    for label, values in cases:
        outdir = os.path.join(outroot, re.sub(r"[^A-Za-z0-9]+", "-", os.path.basename(label)).strip("-"))
        os.makedirs(outdir)
        try:
            errors, summary = check(label, copy.deepcopy(values), outdir)
        except helm_python.HelmError as e:
            errors, summary = [f"{type(e).__name__}: {e}"], None
        if errors:
            failed = True
            for e in errors:
                print(f"check-chart: {label}: {e}", file=sys.stderr)
            print(f"check-chart: {label}: FAILED ({len(errors)} errors; manifests in {outdir})")
        else:
            print(f"check-chart: {label}: ok: lint --strict, {summary}, assertions passed")

    refusals = [
        must_refuse("a top-level typo", {"workerz": {}}, "workerz"),
        must_refuse("a typo inside worker", {"worker": {"replica": 3}}, "replica"),
        must_refuse("a grace period below preStop + drain",
                    {"worker": {"terminationGracePeriodSeconds": 30}}, "terminationGracePeriodSeconds"),
        must_refuse("a worker without API tokens", {"apiTokens": {"generate": False}}, "API tokens"),
        must_refuse("a number in a secret", {"database": {"url": {"value": 5}}}, "value"),
    ]
    refusals = [r for r in refusals if r]
    for r in refusals:
        failed = True
        print(f"check-chart: must refuse: {r}", file=sys.stderr)
    if not refusals:
        print("check-chart: refusals: ok: 5 bad values refused (typos at the top level and in worker, "
              "grace period, missing API tokens, wrong type)")

    if failed or os.environ.get("FLOTILLA_KEEP_MANIFESTS") == "1":
        print(f"check-chart: manifests kept in {outroot}", file=sys.stderr)
    else:
        shutil.rmtree(outroot)
    print(f"check-chart: {'FAILED' if failed else 'passed'} in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
