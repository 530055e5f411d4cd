"""deploy/ and the Dockerfile, checked without a cluster or a container engine.

Each manifest must be what a VirtRigaud manager and the kubelet accept, and must keep the pod
contract (docs/contract.md): uid 65532, read-only root, /tmp writable, /healthz on 8080,
the TLS and credentials Secrets at their paths, with the keys pyrigaud reads.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.entrypoints.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "virtrigaud-system"
TLS_DIR = "/etc/virtrigaud/tls"
CREDENTIALS_DIR = "/etc/virtrigaud/credentials"
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}
CREDENTIAL_KEYS = {
    "libvirt": {"username", "ssh-privatekey", "known_hosts"},
    "vsphere": {"username", "password"},
}
ENDPOINT_SCHEMES = {"libvirt": "qemu+ssh://", "vsphere": "https://"}
KINDS = {
    "Namespace": "v1",
    "Secret": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "Provider": "infra.virtrigaud.io/v1beta1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
}
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The Provider CRD's validation patterns (infra.virtrigaud.io/v1beta1).
CRD_IMAGE = re.compile(r"^[a-zA-Z0-9._/-]+(:[a-zA-Z0-9._-]+)?(@[a-zA-Z0-9]+:[a-fA-F0-9]{64})?$")
CRD_ENDPOINT = re.compile(
    r"^((https?://[a-zA-Z0-9.-]+(:[0-9]+)?(/.*)?|(tcp|grpc)://[a-zA-Z0-9.-]+:[0-9]+(/.*)?)"
    r"|qemu(\+ssh|\+tcp|\+tls)?://([a-zA-Z0-9@.-]+(:[0-9]+)?)?(/.*))$"
)
COMPILERS = ("gcc", "g++", "clang", "build-essential", "make", "pkg-config")


@dataclass(frozen=True)
class Manifest:
    path: Path
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}: {self.kind}/{self.body['metadata'].get('name')}"


def load_manifests() -> list[Manifest]:
    manifests: list[Manifest] = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        with path.open() as stream:
            manifests.extend(Manifest(path, body) for body in yaml.safe_load_all(stream) if body)
    return manifests


MANIFESTS = load_manifests()


def of_kind(kind: str) -> list[Manifest]:
    found = [manifest for manifest in MANIFESTS if manifest.kind == kind]
    assert found, f"deploy/ has no {kind}"
    return found


def secret(name: str) -> Manifest:
    matches = [m for m in of_kind("Secret") if m.name == name]
    assert len(matches) == 1, f"Secret {name!r} is referenced but defined {len(matches)} times"
    return matches[0]


def secret_keys(manifest: Manifest) -> set[str]:
    return set(manifest.body.get("data") or {}) | set(manifest.body.get("stringData") or {})


def the_deployment() -> dict[str, Any]:
    (deployment,) = of_kind("Deployment")
    return deployment.body


def the_container() -> dict[str, Any]:
    (container,) = the_deployment()["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def container_port(reference: int | str) -> int:
    """A probe's or Service's port, by number or by the container port's name."""
    for port in the_container()["ports"]:
        if reference in (port["containerPort"], port.get("name")):
            return int(port["containerPort"])
    raise AssertionError(f"port {reference!r} is not a container port")


def test_every_file_in_deploy_parses_to_a_known_kind() -> None:
    assert {manifest.kind for manifest in MANIFESTS} == set(KINDS)
    for manifest in MANIFESTS:
        assert manifest.body["apiVersion"] == KINDS[manifest.kind], manifest
        assert DNS_1123.match(manifest.name), manifest
        if manifest.kind != "Namespace":
            assert manifest.body["metadata"].get("namespace") == NAMESPACE, manifest
    identities = [(m.kind, m.name) for m in MANIFESTS]
    assert len(identities) == len(set(identities)), "two manifests define the same object"


def test_placeholders_are_marked_and_no_real_secret_is_committed() -> None:
    for manifest in of_kind("Secret"):
        assert "data" not in manifest.body, f"{manifest}: use stringData placeholders"
        for key, value in manifest.body["stringData"].items():
            assert "REPLACE-ME" in value, f"{manifest}: {key} is not a marked placeholder"


def test_tls_secret_has_the_three_files_pyrigaud_reads() -> None:
    tls = [m for m in of_kind("Secret") if m.body.get("type") == "kubernetes.io/tls"]
    assert [m.name for m in tls] == ["pyrigaud-tls"]
    assert secret_keys(tls[0]) == TLS_KEYS


@pytest.mark.parametrize("provider", of_kind("Provider"), ids=str)
def test_provider_runs_the_pyrigaud_image_remotely(provider: Manifest) -> None:
    spec = provider.body["spec"]
    runtime = spec["runtime"]
    assert runtime["mode"] == "Remote"
    assert CRD_IMAGE.match(runtime["image"]), runtime["image"]
    assert runtime["image"] == the_container()["image"], "one image for every example"
    assert runtime["service"]["port"] == 9443
    assert 1 <= runtime.get("replicas", 1) <= 10
    assert runtime["resources"]["limits"]["memory"] == "512Mi"
    assert spec["type"] in CREDENTIAL_KEYS
    assert CRD_ENDPOINT.match(spec["endpoint"]), spec["endpoint"]
    assert spec["endpoint"].startswith(ENDPOINT_SCHEMES[spec["type"]])


@pytest.mark.parametrize("provider", of_kind("Provider"), ids=str)
def test_provider_references_secrets_with_the_keys_its_backend_reads(provider: Manifest) -> None:
    spec = provider.body["spec"]
    reference = spec["credentialSecretRef"]
    assert reference.get("namespace", NAMESPACE) == provider.body["metadata"]["namespace"]
    credentials = secret(reference["name"])
    assert secret_keys(credentials) == CREDENTIAL_KEYS[spec["type"]]
    tls = spec["runtime"]["service"]["tls"]
    assert tls["enabled"] is True
    assert secret_keys(secret(tls["secretRef"]["name"])) == TLS_KEYS


def test_deployment_selects_its_own_pods_and_the_service_selects_them_too() -> None:
    deployment = the_deployment()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (service,) = of_kind("Service")
    assert service.body["spec"]["selector"].items() <= labels.items()


def test_service_ports_reach_the_grpc_and_health_container_ports() -> None:
    (service,) = of_kind("Service")
    ports = {
        port["port"]: container_port(port["targetPort"]) for port in service.body["spec"]["ports"]
    }
    assert ports == {9443: 9443, 8080: 8080}


def test_container_takes_the_managers_arguments_and_probes_healthz_on_8080() -> None:
    container = the_container()
    assert container["image"]
    assert container["args"] == ["--port=9443", "--health-port=8080"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert container_port(get["port"]) == 8080, probe
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["/bin/sh", "-c", "sleep 15"]
    assert container["resources"]["limits"]["memory"] == "512Mi"


def test_pod_runs_unprivileged_on_a_read_only_root_with_tmp_writable() -> None:
    pod = the_deployment()["spec"]["template"]["spec"]
    container = the_container()
    context = container["securityContext"]
    assert context["runAsUser"] == 65532
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsUser"] == 65532
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp"}, "only /tmp may be writable"


def test_pod_mounts_the_tls_and_credentials_secrets_where_pyrigaud_reads_them() -> None:
    pod = the_deployment()["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in the_container()["volumeMounts"]}
    assert secret_keys(secret(mounts[TLS_DIR]["secret"]["secretName"])) == TLS_KEYS
    backend = environment()["PROVIDER_TYPE"]
    credentials = secret(mounts[CREDENTIALS_DIR]["secret"]["secretName"])
    assert secret_keys(credentials) == CREDENTIAL_KEYS[backend]


def environment() -> dict[str, str]:
    """The container's env as pyrigaud would see it (downward-API values stood in for)."""
    return {
        variable["name"]: variable.get("value", "from-downward-api")
        for variable in the_container()["env"]
    }


def test_deployment_environment_is_accepted_by_pyrigauds_settings() -> None:
    settings = load_settings(environment(), staging_types=STAGING_TYPES)
    assert settings.provider_type == "libvirt"
    assert settings.provider_endpoint is not None
    assert settings.provider_endpoint.startswith("qemu+ssh://")
    assert settings.tls_enabled is True
    assert str(settings.tls_dir) == TLS_DIR


# --- Dockerfile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile_sections() -> list[list[Instruction]]:
    """The global ARGs, then the instructions per build stage (continuation lines joined,
    comments dropped)."""
    lines = [
        line
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    sections: list[list[Instruction]] = [[]]
    for line in joined.splitlines():
        if not line.strip():
            continue
        keyword, _, arguments = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            sections.append([])
        sections[-1].append(Instruction(keyword.upper(), arguments.strip()))
    return sections


def dockerfile_stages() -> list[list[Instruction]]:
    return dockerfile_sections()[1:]


def global_arguments() -> dict[str, str]:
    """The ARGs before the first FROM, the only ones a FROM line can use, with their defaults."""
    (global_section, *_) = dockerfile_sections()
    assert {instruction.keyword for instruction in global_section} <= {"ARG"}
    defaults = {}
    for argument in arguments_of(global_section, "ARG"):
        name, _, default = argument.partition("=")
        defaults[name] = default
    return defaults


def arguments_of(stage: list[Instruction], keyword: str) -> list[str]:
    return [instruction.arguments for instruction in stage if instruction.keyword == keyword]


def installed_apt_packages(stage: list[Instruction]) -> set[str]:
    """Every package an `apt-get install` of the stage names, conditional ones included."""
    packages: set[str] = set()
    for command in arguments_of(stage, "RUN"):
        for part in command.split("&&"):
            words = shlex.split(part)
            for start in range(len(words) - 1):
                if words[start : start + 2] != ["apt-get", "install"]:
                    continue
                for word in words[start + 2 :]:
                    if not word.startswith("-"):
                        packages.add(word.rstrip(";"))
                    if word.endswith(";"):  # the end of the shell command
                        break
    return packages


def env_of(stage: list[Instruction]) -> dict[str, str]:
    values: dict[str, str] = {}
    for arguments in arguments_of(stage, "ENV"):
        for word in shlex.split(arguments):
            name, _, value = word.partition("=")
            values[name] = value
    return values


def test_image_is_multi_stage_on_slim_python_311_with_no_compiler_in_the_final_stage() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    # Every stage starts from BASE: the official image by default, or a Debian bookworm root
    # (docs/container.md), which gets Debian's Python 3.11 from apt.
    assert global_arguments()["BASE"] == "python:3.11-slim-bookworm"
    for stage in stages:
        assert arguments_of(stage, "FROM")[0].split()[0] == "${BASE}"
    builder, final = stages[0], stages[-1]
    assert {"gcc", "pkg-config", "libvirt-dev"} <= installed_apt_packages(builder)
    runtime_packages = installed_apt_packages(final)
    assert {"libvirt0", "openssh-client", "$libnfs"} <= runtime_packages
    # libnfs's package is the base release's, named by the helper the install step mounts.
    (install,) = [c for c in arguments_of(final, "RUN") if "$libnfs" in c]
    assert " ".join(install.split()).startswith(
        "--mount=type=bind,source=scripts/libnfs-package.sh,target=/tmp/libnfs-package.sh "
        "libnfs=$(sh /tmp/libnfs-package.sh) && "
    )
    assert not dockerignore_excludes("scripts/libnfs-package.sh")
    assert not {p for p in runtime_packages if p in COMPILERS or p.endswith("-dev")}
    copied = arguments_of(final, "COPY")
    assert copied, "the final stage copies the built venv"
    assert all(arguments.startswith("--from=builder ") for arguments in copied)


def test_image_installs_the_package_with_both_backends_extras_like_the_tests_do() -> None:
    (builder, *_) = dockerfile_stages()
    installs = [command for command in arguments_of(builder, "RUN") if "pip install" in command]
    assert len(installs) == 1
    assert "'.[libvirt,vsphere,s3]'" in installs[0]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"libvirt", "vsphere", "s3"} <= set(extras)


def test_image_runs_pyrigaud_serve_as_uid_65532_with_nothing_to_write_outside_tmp() -> None:
    final = dockerfile_stages()[-1]
    assert arguments_of(final, "USER")[-1].split(":")[0] == "65532"
    (entrypoint,) = arguments_of(final, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["pyrigaud", "serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "pyrigaud" in scripts
    environment = env_of(final)
    assert environment["PYTHONDONTWRITEBYTECODE"] == "1"
    assert environment["HOME"].startswith("/tmp")
    # OpenSSH needs a passwd entry for the uid; its home must be writable, so under /tmp.
    user = next(c for c in arguments_of(final, "RUN") if "useradd" in c)
    assert re.search(r"--uid 65532\b", user)
    assert re.search(r"--home-dir /tmp\b", user)


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parents = [str(Path(*Path(path).parts[:n])) for n in range(1, len(Path(path).parts) + 1)]
    excluded = False
    for line in (REPO / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatchcase(candidate, pattern) for candidate in parents):
            excluded = not negated
    return excluded


def copied_sources() -> Iterator[str]:
    for arguments in arguments_of(dockerfile_stages()[0], "COPY"):
        *sources, _destination = arguments.split()
        yield from sources


def test_build_context_holds_what_the_dockerfile_copies_and_not_the_venv() -> None:
    sources = list(copied_sources())
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignore_excludes(source), source
    assert not dockerignore_excludes("src/entrypoints/grpc/generated/provider/v1/provider_pb2.py")
    for unwanted in (".venv/bin/python", "tests/support/e2e.py", "src/domain/__pycache__/x.pyc"):
        assert dockerignore_excludes(unwanted), unwanted
