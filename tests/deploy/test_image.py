"""The container image's recipe: it installs with the script CI runs, and keeps to its promises.

The image cannot be built here (no container engine). What can break it is checked instead:
the builder's one install step is ``scripts/install-venv.sh`` (which CI runs into a fresh
virtual environment), the build context holds what that step needs, and the final stage
carries no build tools and runs unprivileged.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field

from tests.deploy.manifests import REPO

DOCKERFILE = REPO / "Dockerfile"
SCRIPT = "scripts/install-venv.sh"


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def stages() -> list[Stage]:
    """The Dockerfile's stages with their instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            parts = rest.split()
            out.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else ""))
        elif out:
            out[-1].instructions.append((instruction, rest.strip()))
    return out


def test_two_stages_on_python_311_slim() -> None:
    builder, final = stages()
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert builder.base == final.base == "${PYTHON_IMAGE}"
    assert builder.name == "builder"


def test_the_builder_installs_with_exactly_the_ci_script() -> None:
    builder, _ = stages()
    assert builder.args("RUN") == [f"bash {SCRIPT} /opt/venv"]
    copied = " ".join(builder.args("COPY"))
    assert SCRIPT in copied and "pyproject.toml" in copied and "scheduler" in copied


def test_the_final_stage_has_only_the_venv_and_an_unprivileged_user() -> None:
    _, final = stages()
    assert final.args("COPY") == ["--from=builder /opt/venv /opt/venv"]
    for run in final.args("RUN"):
        assert not re.search(r"\b(pip|apt-get|apt|gcc|make|curl|wget)\b", run), run
    (user,) = final.args("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    pod = _deployment_pod()
    assert str(pod["securityContext"]["runAsUser"]) == uid
    env = " ".join(final.args("ENV"))
    assert "PATH=/opt/venv/bin:" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    assert "TMPDIR=/tmp" in env and "HOME=/tmp" in env  # with a read-only root, only /tmp is writable


def test_the_image_sets_no_setting_that_would_override_the_config_file() -> None:
    from scheduler.extender.config import ENV_FIELDS, ENV_PREFIX

    _, final = stages()
    env = " ".join(final.args("ENV"))
    names = set(re.findall(r"\b([A-Z_][A-Z0-9_]*)=", env))
    assert names and not names & {ENV_PREFIX + suffix for suffix in ENV_FIELDS}


def test_entrypoint_command_and_healthcheck() -> None:
    _, final = stages()
    assert final.args("ENTRYPOINT") == ['["gpuslice"]']
    (cmd,) = final.args("CMD")
    assert json.loads(cmd) == ["serve", "--host", "0.0.0.0"]
    (check,) = final.args("HEALTHCHECK")
    command = check.split(" CMD ", 1)[1]
    assert "curl" not in command and "wget" not in command
    assert shlex.split(command)[:2] == ["python", "-c"]
    code = shlex.split(command)[2]
    compile(code, "HEALTHCHECK", "exec")  # the one-liner is valid Python
    assert "/healthz" in code and "urllib.request" in code


def test_the_build_context_holds_what_the_install_needs() -> None:
    lines = [
        ln.strip()
        for ln in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # an allow-list
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert {"pyproject.toml", "scheduler", SCRIPT} <= allowed


def test_the_install_script_is_valid_bash_and_checks_its_arguments() -> None:
    script = REPO / SCRIPT
    subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run(["bash", str(script)], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "usage:" in result.stderr
    result = subprocess.run(
        ["bash", str(script), "/nonexistent/venv", "test; rm -rf /"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "EXTRAS" in result.stderr


def _deployment_pod() -> dict[str, object]:
    from tests.deploy.manifests import find

    pod: dict[str, object] = find("Deployment", "gpuslice")["spec"]["template"]["spec"]
    return pod
