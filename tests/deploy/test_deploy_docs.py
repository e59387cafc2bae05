"""docs/deploy.md: a newcomer finds every command, file and value it names.

Every shell command in the page's code blocks is checked against what it talks to: `helm
install` lines are rendered with Helm's own engine (their --set/-f values through
values.schema.json), `kubectl` lines name objects those renders produce, `fp8rl` lines use the
CLI's subcommands and options, job specs and their overrides validate as JobSpecs, files exist.
Inline code naming a value (`persistence.existingClaim`) must be a chart value or a JobSpec field.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import types
import typing
from typing import Any

import yaml
from chart_readme import documented_keys
from chartlib import CHART, CRD_FILES, crd, helm, merged, render
from fp8rl_testing import REPO
from pydantic import BaseModel

from fp8rl.protocol import JobSpec, load_job_spec

DOC = REPO / "docs" / "deploy.md"
FP8RL_COMMANDS: dict[tuple[str, ...], set[str]] = {
    ("run",): set(),
    ("validate",): set(),
    ("serve",): {"--host", "--port", "--db", "--token-file"},
    ("runs", "list"): {"--api"},
    ("runs", "show"): {"--api"},
    ("runs", "logs"): {"--api"},
    ("runs", "stop"): {"--api"},
    ("runs", "watch"): {"--api"},
    ("export",): {"--format"},
}
"""The fp8rl CLI as specified (issues 5 and 8); commands already built are also checked for real."""
EXPORT_FORMATS = {"hf-bf16", "hf-fp8"}
API_PATHS = {"/healthz", "/version", "/openapi.json", "/api/v1/runs"}
RAY_JOB_COMMANDS = {"submit", "list", "logs", "stop", "status", "delete"}
DRIVER_MODULE = "fp8rl.services.driver"


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def _commands(block: str) -> list[list[str]]:
    """Shell commands of a bash block: continuations joined, pipelines split, env prefixes dropped.

    ``VAR=$(cmd ...)`` and ``export VAR=$(cmd ...)`` yield ``cmd ...``, so the command inside the
    substitution is checked too.
    """
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*(export\s+)?[A-Z_][A-Z0-9_]*=\$\(", "", line)
        current: list[str] = []
        for token in [*shlex.split(line, comments=True), "|"]:
            if token in ("|", "&&", ";", "&"):
                while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


def _inline_code(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def _values_block(name: str) -> dict[str, Any]:
    for lang, body in _blocks(DOC.read_text()):
        if lang == "yaml" and body.startswith(f"# {name}\n"):
            return yaml.safe_load(body)
    raise AssertionError(f"docs/deploy.md uses -f {name} but has no yaml block starting '# {name}'")


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class Deployment:
    """What the page has installed so far: each release's rendered objects, created Secrets."""

    def __init__(self) -> None:
        self.releases: dict[str, dict[str, set[str]]] = {}
        self.secrets: set[str] = set()

    def install(self, tokens: list[str]) -> None:
        """``helm install|upgrade RELEASE CHART [options]``: render it; an upgrade replaces."""
        args = [t for t in tokens[2:] if t != "--install"]
        positional, values, namespace = [], {}, "default"
        i = 0
        while i < len(args):
            arg = args[i]
            if arg in ("--set", "--set-file", "-f", "--values", "-n", "--namespace"):
                value = args[i + 1]
                i += 2
                if arg == "--set":
                    values = _deep_merge(values, helm.parse_set_string(value))
                elif arg == "--set-file":
                    key, _, path = value.partition("=")
                    assert (REPO / path).is_file(), f"--set-file {path}: no such file"
                    values = _deep_merge(
                        values, helm.parse_set_literal(f"{key}={(REPO / path).read_text()}")
                    )
                elif arg in ("-f", "--values"):
                    values = _deep_merge(values, _values_block(value))
                else:
                    namespace = value
                continue
            if not arg.startswith("-"):
                positional.append(arg)
            i += 1
        release, chart = positional
        if chart.startswith("kuberay/"):
            return
        assert (REPO / chart).resolve() == CHART, f"helm install {chart}: not the chart"
        effective = merged(values)
        for secret in (
            effective["api"]["auth"]["existingSecret"],
            effective["api"]["database"]["existingSecret"],
        ):
            assert not secret or secret in self.secrets, (
                f"release {release} uses Secret {secret!r}, which the page never creates"
            )
        claim = effective["persistence"]["existingClaim"]
        assert not claim or self.has("PersistentVolumeClaim", claim), (
            f"release {release} uses claim {claim!r}, which no earlier release made"
        )
        objects, _ = render(values, release=release, namespace=namespace)
        names: dict[str, set[str]] = {}
        for obj in objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            names.setdefault(kind, set()).add(name)
            if kind == "RayCluster":
                names.setdefault("Service", set()).add(f"{name}-head-svc")
            if kind == "RayJob":  # KubeRay's submitter Job carries the RayJob's name
                names.setdefault("Job", set()).add(name)
        self.releases[release] = names

    def has(self, kind: str, name: str) -> bool:
        """Whether an installed release (as last installed) renders ``kind/name``."""
        return any(name in names.get(kind, set()) for names in self.releases.values())


KUBECTL_KINDS = {
    "svc": "Service",
    "service": "Service",
    "job": "Job",
    "raycluster": "RayCluster",
    "rayjob": "RayJob",
    "secret": "Secret",
    "pvc": "PersistentVolumeClaim",
}


def _check_kubectl(tokens: list[str], state: Deployment) -> None:
    args = tokens[1:]
    while args and args[0] in ("-n", "--namespace"):
        args = args[2:]
    if "--" in args:
        _check_command(args[args.index("--") + 1 :], state)
        args = args[: args.index("--")]
    if args[:3] == ["create", "secret", "generic"]:
        state.secrets.add(args[3])
        return
    if args[:2] == ["get", "crd"]:
        crds = {crd(kind)["metadata"]["name"] for kind in CRD_FILES}
        assert set(args[2:]) <= crds, args
        return
    for i, arg in enumerate(args):
        if "/" in arg and arg.split("/")[0] in KUBECTL_KINDS:
            kind, name = arg.split("/", 1)
            assert state.has(KUBECTL_KINDS[kind], name), f"kubectl {arg}: not rendered"
        if arg in ("get", "delete") and i + 2 < len(args) and args[i + 1] in KUBECTL_KINDS:
            name = args[i + 2]
            if not name.startswith("-"):
                assert state.has(KUBECTL_KINDS[args[i + 1]], name), f"{arg} {args[i + 1]} {name}"
        if arg == "-l":
            for selector in args[i + 1].split(","):
                key, _, value = selector.partition("=")
                if key == "ray.io/cluster":
                    assert state.has("RayCluster", value), selector
                if key == "app.kubernetes.io/instance":
                    assert value in state.releases, selector


def _check_spec(spec: str, overrides: list[str]) -> None:
    assert (REPO / spec).is_file(), f"{spec}: no such job spec"
    load_job_spec(REPO / spec, overrides)


def _check_fp8rl(tokens: list[str]) -> None:
    words = [t for t in tokens[1:] if not t.startswith("-")]
    if len(words) == 1 and any(c[0] == words[0] for c in FP8RL_COMMANDS):
        return  # a command or group named in the prose, e.g. `fp8rl runs`
    command = next(
        (c for c in sorted(FP8RL_COMMANDS, key=len, reverse=True) if tuple(words[: len(c)]) == c),
        None,
    )
    assert command, f"fp8rl {' '.join(tokens[1:])}: no such command"
    options = {t.split("=")[0] for t in tokens if t.startswith("--")}
    assert options <= FP8RL_COMMANDS[command], (command, options - FP8RL_COMMANDS[command])
    if command in (("run",), ("validate",)):
        _check_spec(words[len(command)], words[len(command) + 1 :])
    if command == ("export",):
        export_format = tokens[tokens.index("--format") + 1]
        assert export_format in EXPORT_FORMATS, f"fp8rl export --format {export_format}"
    _check_against_installed_cli(command, options)


def _check_against_installed_cli(command: tuple[str, ...], options: set[str]) -> None:
    """Where the command exists in the installed CLI already, its options must be real ones."""
    import typer

    from fp8rl.services.cli import app

    node: Any = typer.main.get_command(app)  # typer vendors click: duck-type its groups
    for word in command:
        if word not in getattr(node, "commands", {}):
            return  # not built yet: the specification above is the contract
        node = node.commands[word]
    real = {opt for param in node.params for opt in getattr(param, "opts", [])}
    assert options <= real, (command, options - real)


def _check_command(tokens: list[str], state: Deployment) -> None:
    program = tokens[0]
    if program == "helm":
        if tokens[1] in ("install", "upgrade"):
            state.install(tokens)
        elif tokens[1] in ("test", "uninstall"):
            assert tokens[2] in state.releases, f"helm {tokens[1]} {tokens[2]}: never installed"
    elif program == "kubectl":
        _check_kubectl(tokens, state)
    elif program == "fp8rl":
        _check_fp8rl(tokens)
    elif program == "deploy/submit.sh":
        assert (REPO / program).is_file(), program
        _check_spec(tokens[1], tokens[2:])
    elif program == "ray":
        assert tokens[1] == "job" and tokens[2] in RAY_JOB_COMMANDS, f"{' '.join(tokens)}"
        if "--runtime-env" in tokens:
            assert (REPO / tokens[tokens.index("--runtime-env") + 1]).is_file()
        if "--" in tokens:
            _check_command(tokens[tokens.index("--") + 1 :], state)
    elif program == "python" and tokens[1:3] == ["-m", DRIVER_MODULE]:
        _check_spec(tokens[3], tokens[4:])
    elif program == "python" and tokens[1].endswith(".py"):
        _python_block(tokens[1])
    elif program == "docker" and tokens[1] == "build":
        assert (REPO / tokens[tokens.index("-f") + 1]).is_file()
    elif program == "curl":
        url = next(t for t in tokens if t.startswith("http"))
        path = "/" + url.split("/", 3)[3]
        assert path in API_PATHS, f"curl {url}: not an endpoint of the API"
        for token in tokens:
            if token.startswith("@") and token != "@-":
                _check_spec(token[1:], [])  # a job spec posted as the body


def _python_block(name: str) -> str:
    for lang, body in _blocks(DOC.read_text()):
        if lang == "python" and body.startswith(f"# {name}"):
            return body
    raise AssertionError(f"docs/deploy.md runs {name} but has no python block '# {name}'")


INLINE_PROGRAMS = ("fp8rl ", "deploy/submit.sh ", "ray job ", "python -m ")


def test_every_command_in_the_page_names_things_that_exist():
    state = Deployment()
    checked = 0
    for lang, body in _blocks(DOC.read_text()):
        if lang != "bash":
            continue
        for tokens in _commands(body):
            _check_command(tokens, state)
            checked += 1
    assert checked > 20 and {"fp8rl", "qwen-gsm8k"} <= set(state.releases)
    # Commands quoted in the prose, e.g. `deploy/submit.sh SPEC precision.mode=bf16`.
    for code in _inline_code(DOC.read_text()):
        if code.startswith(INLINE_PROGRAMS) and "..." not in code and "SPEC" not in code:
            _check_command(shlex.split(code), state)
            checked += 1


def test_every_value_and_field_named_in_the_prose_exists():
    values_keys = {d.key for d in documented_keys((CHART / "values.yaml").read_text())}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    worker_keys = set(defaults["workerDefaults"]) | {"name"}
    files = {p.name for p in REPO.rglob("*") if ".git" not in p.parts}
    named = 0
    for code in _inline_code(DOC.read_text()):
        token = code.split()[0].split("=")[0].rstrip(":")
        if re.match(r"^(deploy|helm|docs)/", token):
            assert (REPO / token).exists(), f"`{code}`: no such file"
        elif re.match(r"^[\w.-]+\.(yaml|json|md|txt|py|tpl)$", token):
            assert token in files or token == "prepare_gsm8k_math.py", f"`{code}`: no such file"
        elif re.match(r"^[A-Za-z_][\w-]*(\.[\w-]+)+$", token) and token != DRIVER_MODULE:
            named += 1
            head = token.split(".")[0]
            if head in defaults:
                covered = any(token == k or token.startswith(k + ".") for k in values_keys)
                item = token.startswith("workerGroups.") and token.split(".")[1] in worker_keys
                assert covered or item, f"`{code}`: not a value of the chart"
            else:
                assert _is_jobspec_field(token), (
                    f"`{code}`: neither a chart value nor a JobSpec field"
                )
        elif token in defaults or token in worker_keys:
            named += 1
    assert named > 20


def _is_jobspec_field(dotted: str) -> bool:
    """Whether ``a.b.c`` walks through JobSpec's fields (any variant of a tagged union)."""
    candidates: list[Any] = [JobSpec]
    for part in dotted.split("."):
        candidates = [
            model.model_fields[part].annotation
            for candidate in candidates
            for model in _models(candidate)
            if part in model.model_fields
        ]
        if not candidates:
            return False
    return True


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _cli_envvars() -> set[str]:
    """Environment variables the installed fp8rl CLI reads (typer options with envvar=...)."""
    import typer

    from fp8rl.services.cli import app

    names: set[str] = set()
    stack = [typer.main.get_command(app)]
    while stack:
        command = stack.pop()
        stack.extend(getattr(command, "commands", {}).values())
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or [])
    return names


def test_every_environment_variable_named_exists_in_the_chart_the_scripts_or_the_cli():
    rendered = json.dumps(render()[0]) + json.dumps(
        render({"api": {"database": {"url": "sqlite:///x"}}})[0]
    )
    scripts = (REPO / "deploy" / "submit.sh").read_text() + (
        REPO / "deploy" / "runtime_env.yaml"
    ).read_text()
    cli = _cli_envvars()
    for name in set(re.findall(r"\bFP8RL_[A-Z_]+\b", DOC.read_text())):
        assert name in rendered or name in scripts or name in cli, (
            f"{name} is used by nothing deployed and read by no fp8rl command"
        )


def test_relative_links_resolve():
    for target in re.findall(r"\]\(((?:\.\./|\./)[^)#]+)(?:#[^)]*)?\)", DOC.read_text()):
        assert (DOC.parent / target).resolve().exists(), target


def test_the_dataset_script_writes_question_answer_lines(tmp_path, monkeypatch):
    """Run the page's prepare_gsm8k_math.py on a stand-in for Hugging Face `datasets`."""
    rows = {
        ("openai/gsm8k", "train"): [{"question": "1+1?", "answer": "so\n#### 1,002"}],
        ("openai/gsm8k", "test"): [{"question": "2+2?", "answer": "#### 4"}],
        ("DigitalLearningGmbH/MATH-lighteval", "train"): [
            {"problem": "f?", "solution": r"thus \boxed{\frac{1}{2}} or \boxed{x^{2}}."},
            {"problem": "none?", "solution": "no box"},
        ],
        ("HuggingFaceH4/MATH-500", "test"): [{"problem": "g?", "answer": "3"}],
    }
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, *config, split: rows[(name, split)]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_block("prepare_gsm8k_math.py"), "prepare_gsm8k_math.py", "exec"), {})

    def read(path: str) -> list[dict[str, str]]:
        return [json.loads(line) for line in (tmp_path / path).read_text().splitlines()]

    assert read("datasets/gsm8k-math/train.jsonl") == [
        {"question": "1+1?", "answer": "1002"},
        {"question": "f?", "answer": "x^{2}"},
    ]
    assert read("datasets/gsm8k/test.jsonl") == [{"question": "2+2?", "answer": "4"}]
    assert read("datasets/math500/test.jsonl") == [{"question": "g?", "answer": "3"}]
    # The paths the GPU job specs read are the ones the script writes, under /data.
    spec = load_job_spec(REPO / "deploy" / "jobs" / "qwen2.5-7b-gsm8k-math-8gpu.yaml")
    written = {f"/data/{p.relative_to(tmp_path)}" for p in tmp_path.rglob("*.jsonl")}
    assert {spec.data.train.path, *(d.path for d in spec.eval.datasets)} == written
