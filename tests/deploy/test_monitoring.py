"""deploy/monitoring/: the alert rules pass promtool and their unit tests, the Grafana dashboard
imports, and every metric either of them reads is one a running `pyrigaud serve` exports.

The metrics are scraped from a real server process with the Accept header Prometheus sends: on
the fake backend after real RPCs and a disk export and import through a PVC, and on each
backend (the fake, libvirt's test driver, the vSphere simulator) freshly started, before any
request, where every series a panel or an alert reads must already be there.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from pyrigaud.adapters.staging.registry import STAGING_KINDS
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.e2e import create_vm
from support.kit import Served, served
from support.libvirt import isolated_host_uri
from support.vsphere import shared_simulator

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
DOCS = REPO / "docs" / "monitoring.md"
UNIT_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
ALERTS = {
    "PyrigaudDown",
    "PyrigaudRPCErrors",
    "PyrigaudHypervisorUnreachable",
    "PyrigaudInventoryResyncStorm",
    "PyrigaudTransferFailures",
}
# Series names Prometheus makes of one family, by the family's type.
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
PROMETHEUS_OWN = {"up"}


def load_yaml(name: str) -> dict[str, Any]:
    body = yaml.safe_load((MONITORING / name).read_text())
    assert isinstance(body, dict)
    return body


RULE = load_yaml("prometheus-rule.yaml")
DASHBOARD: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in RULE["spec"]["groups"] for rule in group["rules"]]


def panels(dashboard: dict[str, Any] = DASHBOARD) -> Iterator[dict[str, Any]]:
    """Every panel that shows data; rows only hold panels (and collapsed rows nest theirs)."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panels({"panels": panel.get("panels", [])})
        else:
            yield panel


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    queries = [
        (f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in panels()
        for target in panel["targets"]
    ]
    for variable in DASHBOARD["templating"]["list"]:
        if variable["type"] == "query":
            values_of = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["definition"])
            assert values_of, variable["definition"]
            queries.append((f"variable {variable['name']}", values_of.group(1)))
    return queries


def as_plain_promql(expr: str) -> str:
    """A dashboard query as Prometheus gets it: Grafana's intervals and variables filled in."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


# --- PromQL: the metric names an expression reads ------------------------------------------

# Words that stand where a metric name could: binary and set operators, modifiers, literals.
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: strings, label matchers, ranges, groupings
    and offsets are dropped, then an identifier followed by "(" is a function or an
    aggregation, a keyword is a keyword, and every other identifier names a metric."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = GROUPING.sub(" ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[a-zA-Z_:][\w:]*", text):
        if match.group() in PROMQL_WORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(match.group())
    return names


def test_metric_names_are_told_from_functions_labels_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, method) (rate(a_seconds_bucket{code!~"OK|x",'
        ' job="j"}[5m]))) / on (job) group_left(pod) sum(b_total offset 1h) without (x)'
        ' > bool 1e3 unless c_gauge or absent(up{job="pyrigaud"})'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c_gauge", "up"}


# --- promtool --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool from Debian's prometheus package (fetched once by scripts/promtool.sh)."""
    found = subprocess.run(
        ["sh", str(REPO / "scripts" / "promtool.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return found.stdout.strip()


def run_promtool(promtool: str, *arguments: str) -> None:
    run = subprocess.run(
        [promtool, *arguments], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    """The PrometheusRule's groups as a plain Prometheus rules file."""
    path = tmp_path / "pyrigaud.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": RULE["spec"]["groups"]}))
    return path


def test_promtool_accepts_the_alert_rules(promtool: str, rules_file: Path) -> None:
    run_promtool(promtool, "check", "rules", str(rules_file))


def test_alerts_fire_when_their_unit_tests_say(
    promtool: str, rules_file: Path, tmp_path: Path
) -> None:
    cases = yaml.safe_load(UNIT_TESTS.read_text())
    cases["rule_files"] = [str(rules_file)]
    tested = {check["alertname"] for case in cases["tests"] for check in case["alert_rule_test"]}
    assert tested == ALERTS
    path = tmp_path / "alert_rules_test.yaml"
    path.write_text(yaml.safe_dump(cases))
    run_promtool(promtool, "test", "rules", str(path))


def test_dashboard_queries_are_promql_prometheus_accepts(promtool: str, tmp_path: Path) -> None:
    """Each query as a recording rule: promtool parses every expression."""
    recorded = [
        {"record": f"dashboard:query_{index}", "expr": as_plain_promql(expr)}
        for index, (_, expr) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    run_promtool(promtool, "check", "rules", str(path))


# --- the rules -------------------------------------------------------------------------------


def heading_anchors(markdown: str) -> set[str]:
    """The anchors a Markdown renderer gives headings (lower case, punctuation dropped,
    spaces as hyphens)."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    }


def test_each_alert_has_a_summary_a_description_and_a_runbook_section() -> None:
    assert RULE["apiVersion"] == "monitoring.coreos.com/v1"
    assert RULE["kind"] == "PrometheusRule"
    assert {rule["alert"] for rule in rules()} == ALERTS
    anchors = heading_anchors(DOCS.read_text())
    for rule in rules():
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), rule["alert"]
        assert annotations["description"].strip(), rule["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page.endswith("/docs/monitoring.md"), rule["alert"]
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"docs/monitoring.md has no section #{anchor}"
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]


def test_service_monitor_scrapes_metrics_on_the_services_health_port() -> None:
    monitor = load_yaml("service-monitor.yaml")
    service = yaml.safe_load((REPO / "deploy" / "standalone" / "service.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert ports[endpoint["port"]] == 8080
    assert endpoint["path"] == "/metrics"
    # The job Prometheus Operator names after the Service is the one the rules select.
    assert all('job="pyrigaud"' in rule["expr"] for rule in rules())
    assert service["metadata"]["name"] == "pyrigaud"


# --- the dashboard ---------------------------------------------------------------------------


def test_dashboard_panels_each_have_a_datasource_and_a_query() -> None:
    shown = list(panels())
    assert len(shown) >= 20
    for panel in shown:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_error_ratio_leaves_out_the_codes_the_alert_leaves_out() -> None:
    left_out = re.compile(r'code!~"([^"]+)"')
    (alert,) = [rule for rule in rules() if rule["alert"] == "PyrigaudRPCErrors"]
    (panel,) = [panel for panel in panels() if panel["title"] == "Alerting error ratio"]
    (answers,) = left_out.findall(alert["expr"])
    assert left_out.findall(panel["targets"][0]["expr"]) == [answers]
    assert set(answers.split("|")) == {
        "OK",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "UNIMPLEMENTED",
    }


def test_dashboard_picks_its_prometheus_namespace_job_and_replica() -> None:
    variables = {variable["name"]: variable for variable in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for where, expr in dashboard_queries():
        if where.startswith("panel"):
            for name in ("namespace", "job", "instance"):
                assert f"${name}" in expr, f"{where} ignores ${name}"


# --- the metrics a running server exports ----------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Family name -> type on /metrics of `pyrigaud serve` (fake backend) after RPCs of each
    kind: OK and NOT_FOUND, a failed health check, a disk export that leaves a disk behind and
    an import that fails verification, through a mounted PVC."""
    root = tmp_path_factory.mktemp("monitoring")
    (root / "mig").mkdir()
    env = {"PROVIDER_TYPE": "fake", "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root)}
    with served(env, root) as server, grpc.insecure_channel(server.endpoint) as channel:
        stub = pb_grpc.ProviderStub(channel)
        vm_id = create_vm(stub, "watched", disks_json='[{"SizeGiB": 1, "Type": "", "Name": ""}]')
        stub.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
        stub.Validate(pb.ValidateRequest(), timeout=10)
        with pytest.raises(grpc.RpcError):
            stub.Power(pb.PowerRequest(id="missing", op=pb.POWER_OP_ON), timeout=10)
        stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=vm_id,
                destination_url="pvc://mig/watched.qcow2",
                backend_type="pvc",
                transfer_mode="relay",
            ),
            timeout=30,
        )
        with pytest.raises(grpc.RpcError):
            stub.ImportDisk(
                pb.ImportDiskRequest(
                    source_url="pvc://mig/watched.qcow2",
                    target_name="watched-in",
                    verify_checksum=True,
                    expected_checksum="0" * 64,
                    backend_type="pvc",
                    transfer_mode="relay",
                ),
                timeout=30,
            )
        page = scrape(server)
    families = list(text_string_to_metric_families(page))
    sampled = {family.name for family in families if family.samples}
    assert {
        "pyrigaud_transfer_bytes",
        "pyrigaud_transfers_in_flight",
        "pyrigaud_transfer_duration_seconds",
        "pyrigaud_transfer_throughput_bytes_per_second",
        "pyrigaud_transfer_failures",
        "pyrigaud_transfer_left_behind",
    } <= sampled
    return {family.name: family.type for family in families}


def scrape(server: Served) -> str:
    """/metrics as Prometheus asks for it."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.health_port}/metrics",
        headers={"Accept": PROMETHEUS_ACCEPT},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def family_of(series: str, exported: dict[str, str]) -> str | None:
    """The exported family a series name belongs to, by the suffixes of that family's type."""
    for family, kind in exported.items():
        for suffix in SERIES_SUFFIXES.get(kind, ("",)):
            if series == family + suffix:
                return family
    return None


def test_every_metric_the_dashboard_and_the_alerts_read_is_exported(
    exported: dict[str, str],
) -> None:
    read = {
        (where, name)
        for where, expr in [
            *dashboard_queries(),
            *((f"alert {rule['alert']}", rule["expr"]) for rule in rules()),
        ]
        for name in metric_names(expr)
    }
    assert len({name for _, name in read}) >= 15
    missing = sorted(
        (where, name)
        for where, name in read
        if name not in PROMETHEUS_OWN and family_of(name, exported) is None
    )
    assert not missing, f"not on /metrics: {missing}"


def test_docs_list_every_exported_family(exported: dict[str, str]) -> None:
    """By the name a query uses: a counter's `_total` series, a histogram's family name."""
    docs = DOCS.read_text()
    for family, kind in exported.items():
        named = family + "_total" if kind == "counter" else family
        assert f"`{named}`" in docs, f"docs/monitoring.md does not list {named}"


# --- a freshly started server: every series read, before any request ------------------------

# Labels Prometheus adds to each series it scrapes, and a histogram bucket's own.
SCRAPE_LABELS = {"namespace", "job", "instance", "le"}
SELECTOR = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPED_BY = re.compile(r"\bby\s*\(([^)]*)\)")


def series_read(expr: str) -> dict[str, tuple[set[str], set[tuple[str, str]]]]:
    """Per metric name an expression reads: the labels its series must carry (those its
    selectors match on and those the expression groups by) and the (label, value) pairs its
    selectors require exactly (a panel showing one code or one operation)."""
    grouped = {label.strip() for found in GROUPED_BY.findall(expr) for label in found.split(",")}
    read: dict[str, tuple[set[str], set[tuple[str, str]]]] = {
        name: (set(grouped) - SCRAPE_LABELS, set()) for name in metric_names(expr)
    }
    for name, matchers in SELECTOR.findall(expr):
        if name not in read:
            continue  # a function's braces, never a selector's
        labels, values = read[name]
        for label, operator, value in MATCHER.findall(matchers):
            if label in SCRAPE_LABELS:
                continue
            labels.add(label)
            if operator == "=" and "$" not in value:
                values.add((label, value))
    return read


def test_series_read_are_told_with_their_labels_and_values() -> None:
    read = series_read(
        'sum by (instance, outcome) (rate(c_total{job=~"$job", operation="check",'
        ' outcome!="ok"}[5m])) / sum(rate(d_total[5m]))'
    )
    assert read == {
        "c_total": ({"outcome", "operation"}, {("operation", "check")}),
        "d_total": ({"outcome"}, set()),
    }


@pytest.fixture(params=["fake", "libvirt", "vsphere"])
def fresh_samples(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, list[tuple[str, dict[str, str]]]]:
    """(backend, every (series, labels) on /metrics) of `pyrigaud serve` on the backend,
    scraped as soon as it is ready, before any RPC."""
    backend = request.param
    env = {
        "fake": lambda: {"PROVIDER_TYPE": "fake"},
        "libvirt": lambda: {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": isolated_host_uri(tmp_path),
            "LIBVIRT_DOMAIN_TYPE": "test",
        },
        "vsphere": lambda: shared_simulator().serve_environ(),
    }[backend]()
    with served(env, tmp_path) as server:
        page = scrape(server)
    samples = [
        (sample.name, dict(sample.labels))
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    ]
    return backend, samples


def test_a_fresh_server_has_every_series_the_dashboard_and_the_alerts_read(
    fresh_samples: tuple[str, list[tuple[str, dict[str, str]]]],
) -> None:
    backend, samples = fresh_samples
    expressions = [
        *dashboard_queries(),
        *((f"alert {rule['alert']}", rule["expr"]) for rule in rules()),
    ]
    missing = []
    for where, expr in expressions:
        for name, (labels, values) in series_read(expr).items():
            if name in PROMETHEUS_OWN:
                continue
            if not any(
                series == name and labels <= shown.keys() and values <= shown.items()
                for series, shown in samples
            ):
                missing.append((where, name, sorted(labels), sorted(values)))
    assert not missing, f"{backend}: not on a fresh /metrics: {missing}"
    # The label sets an operator's panels and alerts need, each at 0.
    present = {(series, frozenset(shown.items())) for series, shown in samples}
    wanted = [
        (f"pyrigaud_{counter}_total", {"backend": backend})
        for counter in ("inventory_resyncs", "hypervisor_round_trips", "session_reconnects")
    ]
    wanted += [
        ("pyrigaud_hardware_fallbacks_total", {"backend": backend, "device": device})
        for device in ("disk_controller", "nic")
    ]
    for storage in STAGING_KINDS:  # every one: the test command installs what each needs
        for direction in ("export", "import"):
            transfer = {"backend": backend, "storage": storage, "direction": direction}
            wanted += [
                ("pyrigaud_transfer_bytes_total", transfer),
                ("pyrigaud_transfers_in_flight", transfer),
                ("pyrigaud_transfer_duration_seconds_count", transfer),
                ("pyrigaud_transfer_throughput_bytes_per_second_count", transfer),
            ]
            wanted += [
                ("pyrigaud_transfer_failures_total", {**transfer, "phase": phase})
                for phase in ("open", "read", "write", "verify", "commit")
            ]
    absent = [
        (series, labels)
        for series, labels in wanted
        if (series, frozenset(labels.items())) not in present
    ]
    assert not absent, f"{backend}: not on a fresh /metrics: {absent}"
