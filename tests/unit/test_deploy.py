"""The Dockerfile and deploy/compose.yaml, checked statically (no container engine runs here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from delayq_server import config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_dependencies_are_a_layer_of_their_own_before_the_sources() -> None:
    steps = _instructions()
    copies = [
        (i, rest) for i, (word, rest) in enumerate(steps) if word == "COPY" and "--from" not in rest
    ]
    pip_deps = next(
        i for i, (w, r) in enumerate(steps) if w == "RUN" and "runtime-requirements.txt" in r
    )
    first_source = next(i for i, r in copies if r.startswith(("server ", "clients/python ")))
    # Only the pyprojects and the requirements script are copied before the dependency install.
    before = [r.split()[0] for i, r in copies if i < pip_deps]
    assert before == [
        "scripts/runtime_requirements.py",
        "clients/python/pyproject.toml",
        "server/pyproject.toml",
    ]
    assert pip_deps < first_source
    for _, rest in copies:  # every source the image copies exists
        assert (ROOT / rest.split()[0]).exists(), rest


def test_image_installs_like_make_run() -> None:
    runs = " ".join(r for w, r in _instructions() if w == "RUN")
    makefile = (ROOT / "Makefile").read_text()
    for step in ("scripts/runtime_requirements.py >", "pip install --no-cache-dir -r", "--no-deps"):
        assert step in runs, step
    assert (
        "scripts/runtime_requirements.py >" in makefile
        and "--no-deps -e clients/python -e server" in makefile
    )
    assert "redis-server" not in runs and "requirements-dev" not in runs


def test_healthcheck_uses_the_probe_shipped_in_the_image() -> None:
    (check,) = [r for w, r in _instructions() if w == "HEALTHCHECK"]
    cmd = check.split("CMD", 1)[1].strip()
    assert shlex.split(cmd.strip("[]").replace(",", " ")) == [
        "python",
        "-m",
        "delayq_server.healthcheck",
    ]
    assert (ROOT / "server/delayq_server/healthcheck.py").exists()
    volumes = [r for w, r in _instructions() if w == "VOLUME"]
    assert volumes == ["/var/lib/delayq"]


def test_image_environment_names_real_settings() -> None:
    env = " ".join(r for w, r in _instructions() if w == "ENV")
    names = set(re.findall(r"(DELAYQ_[A-Z_]+)=", env))
    known = {var for var, *_ in config._FLAGS.values()} | {var for var, _ in config._BOOLS.values()}
    assert names <= known, names - known
    assert "DELAYQ_AUTH" in names


def test_compose_wires_server_redis_and_prometheus() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"redis", "delayq", "prometheus"}
    delayq = services["delayq"]
    assert (DEPLOY / delayq["build"]["context"] / delayq["build"]["dockerfile"]).is_file()
    env = delayq["environment"]
    known = {var for var, *_ in config._FLAGS.values()} | {var for var, _ in config._BOOLS.values()}
    assert set(env) <= known
    redis_host = env["DELAYQ_REDIS_URL"].split("//")[1].split(":")[0]
    assert redis_host in services
    assert delayq["depends_on"]["redis"]["condition"] == "service_healthy"
    http_port = env["DELAYQ_HTTP_LISTEN"].rsplit(":", 1)[1]
    # Prometheus scrapes the port delayq serves /metrics on, by service name.
    prom = services["prometheus"]
    mount = next(v for v in prom["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro"))
    prom_file = DEPLOY / mount.split(":")[0]
    targets = yaml.safe_load(prom_file.read_text())["scrape_configs"][0]["static_configs"][0][
        "targets"
    ]
    assert targets == [f"delayq:{http_port}"]
    for service in services.values():  # named volumes are declared
        for volume in service.get("volumes", []):
            name = volume.split(":")[0]
            if not name.startswith("."):
                assert name in compose["volumes"], name
