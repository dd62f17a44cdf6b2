"""The deployment docs as a new user meets them: the shipped CI file, docs/deploy.md, README.

The CI example (``docs/ci/github-actions-nightly.yml``) must parse, and every
``parity-tracker ...`` command line in it and in deploy.md's shell blocks must use options the
click commands really have (a renamed or missing option fails here, not in a user's CI). The
pull-request job must survive normal use: a parity failure of the recorded run does not stop
it, it checks out the PR's head, it diffs against the base branch, and it may write comments.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from parity_tracker.cli import cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CI_FILE = ROOT / "docs" / "ci" / "github-actions-nightly.yml"
DEPLOY = ROOT / "docs" / "deploy.md"
SHELL_OPERATORS = {";", "&&", "||", "|", ">", ">>", "<", "2>", "&", ")", "("}


def _workflow() -> dict[str, Any]:
    return yaml.safe_load(CI_FILE.read_text(encoding="utf-8"))


def _steps() -> list[tuple[str, dict[str, Any]]]:
    return [(job, step) for job, spec in _workflow()["jobs"].items() for step in spec["steps"]]


def _logical_lines(script: str) -> list[str]:
    """Shell lines with backslash continuations joined."""
    return re.sub(r"\\\n\s*", " ", script).splitlines()


def _command_lines(text: str) -> list[str]:
    """Each ``parity-tracker ...`` invocation of a shell text, cut at the first shell operator."""
    found = []
    for line in _logical_lines(text):
        stripped = line.strip()
        if stripped.startswith("#") or "parity-tracker " not in stripped:
            continue
        start = stripped.find("parity-tracker ")
        if start > 0 and not re.search(r"(^|[;&|(]|\bthen|\bdo|^- run:)\s*$", stripped[:start]):
            continue  # inside an echo or a comment, not a command
        lex = shlex.shlex(stripped[start:], posix=True, punctuation_chars=";&|<>()")
        lex.whitespace_split = True
        tokens = []
        for tok in lex:
            if tok in SHELL_OPERATORS or tok.startswith("#"):
                break
            tokens.append(tok)
        found.append(tokens)
    return found


def _ci_command_lines() -> list[list[str]]:
    return [cmd for _, step in _steps() if "run" in step for cmd in _command_lines(step["run"])]


def _deploy_command_lines() -> list[list[str]]:
    blocks = re.findall(r"```(?:bash|sh|yaml)\n(.*?)```", DEPLOY.read_text(), flags=re.S)
    return [cmd for block in blocks for cmd in _command_lines(block)]


def _option_of(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def _check(tokens: list[str]) -> list[str]:
    """Problems of one ``parity-tracker ...`` token list against the click commands."""
    assert tokens[0] == "parity-tracker"
    problems, command, i = [], cli, 1
    sub = None
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-"):
            if sub is None:
                sub = cli.commands.get(tok)
                if sub is None:
                    return [f"no command {tok!r}"]
                command = sub
            i += 1
            continue
        name, eq, value = tok.partition("=")
        option = _option_of(command, name)
        if option is None:
            problems.append(f"{command.name or 'parity-tracker'}: no option {name}")
            i += 1
            continue
        if option.is_flag or option.count:
            i += 1
            continue
        if not eq:
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
            i += 1
        i += 1
        choices = option.type.choices if isinstance(option.type, click.Choice) else None
        if choices and "$" not in value and value.lower() not in [str(c).lower() for c in choices]:
            problems.append(f"{command.name}: {name} {value!r} not in {choices}")
    if sub is None:
        problems.append("no command given")
    return problems


def test_ci_file_parses_and_has_shards_merge_and_pr_jobs():
    flow = _workflow()
    assert set(flow["jobs"]) == {"shard", "merge", "pr-comment"}
    assert flow["jobs"]["merge"]["needs"] == "shard"
    shards = flow["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, int(flow["env"]["SHARDS"]) + 1))  # matrix in step with N


def test_every_parity_tracker_command_of_the_ci_file_uses_real_options():
    commands = _ci_command_lines()
    used = {tokens[1] for tokens in commands}
    assert {"nightly", "sync", "nightly-merge", "run", "diff"} <= used
    problems = {" ".join(tokens): _check(tokens) for tokens in commands}
    assert {k: v for k, v in problems.items() if v} == {}


def test_every_parity_tracker_command_of_deploy_md_uses_real_options():
    commands = _deploy_command_lines()
    assert commands
    problems = {" ".join(tokens): _check(tokens) for tokens in commands}
    assert {k: v for k, v in problems.items() if v} == {}


def test_the_checker_itself_rejects_a_missing_option_and_a_bad_choice():
    assert _check(["parity-tracker", "run", "x", "--fail-on", "never"]) == [
        "run: no option --fail-on"
    ]
    assert _check(["parity-tracker", "diff", "--format", "html"])
    assert _check(["parity-tracker", "--store-retry-s", "5", "sync", "--json"]) == []


def _pr_steps() -> list[dict[str, Any]]:
    return [step for job, step in _steps() if job == "pr-comment"]


def test_pr_job_checks_out_the_head_and_may_read_and_comment():
    job = _workflow()["jobs"]["pr-comment"]
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    checkout = next(s for s in _pr_steps() if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"


def test_pr_job_records_its_run_without_stopping_on_a_parity_failure():
    """Run the step's shell with ``parity-tracker`` replaced by a stub exiting 1, then 3."""
    import subprocess

    step = next(s for s in _pr_steps() if "parity-tracker run" in s.get("run", ""))
    script = step["run"]
    for code, want in ((0, 0), (1, 0), (2, 2), (3, 3)):
        stub = f"parity-tracker() {{ return {code}; }}\n"
        done = subprocess.run(["bash", "-e", "-c", stub + script], capture_output=True)
        assert done.returncode == want, (code, done.stderr)


def test_pr_diff_step_comments_no_baseline_and_passes(tmp_path):
    """The diff step with a stub ``parity-tracker`` that fails as diff does without a baseline."""
    import os
    import subprocess

    step = next(s for s in _pr_steps() if s.get("id") == "diff")
    assert "--base-branch" in step["run"] and "--base-commit" not in step["run"]
    out = tmp_path / "gh_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(out), "BASE_REF": "main", "HEAD_SHA": "f00d",
           "PR_TARGET": "digits-cnn", "PR_SETTING": "quantization=int8"}  # fmt: skip
    stub = (
        "parity-tracker() { echo \"Error: no run of digits-cnn matching {} on branch 'main' "
        '(no baseline yet: run the nightly on main first)" >&2; return 2; }\n'
    )
    done = subprocess.run(["bash", "-e", "-c", stub + step["run"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "code=0\n"
    comment = (tmp_path / "diff.md").read_text()
    assert "no baseline yet" in comment and "`main`" in comment


def test_run_has_the_branch_and_diff_the_base_branch_options():
    assert _option_of(cli.commands["run"], "--branch") is not None
    assert _option_of(cli.commands["diff"], "--base-branch") is not None


def test_deploy_md_installs_torch_first_and_pinned_and_no_pypi_package():
    text = DEPLOY.read_text()
    blocks = "".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    assert not re.search(r"pip install parity-tracker\s*(#|$)", blocks, flags=re.M)
    torch_at = blocks.index('pip install "torch==')
    assert torch_at < blocks.index('pip install "parity-tracker @ git+')
    assert "download.pytorch.org/whl/cpu" in blocks and "whl/cu" in blocks
    pinned = re.search(r"TORCH_SPEC \?= (torch==\S+)", (ROOT / "Makefile").read_text())
    assert pinned and f'"{pinned.group(1)}"' in blocks  # the same pin as the Makefile


def test_readme_cell_count_is_the_matrix_product_of_nightly_toml():
    """Counted by hand from the TOML: each [[matrix]] entry is the product of its list axes."""
    matrix = tomllib.loads((ROOT / "pipelines" / "nightly.toml").read_text())["matrix"]
    total = sum(math.prod(len(v) for v in e.values() if isinstance(v, list)) for e in matrix)
    stated = re.search(r"(\d+)\s+cells over all built-in targets", (ROOT / "README.md").read_text())
    assert stated and int(stated.group(1)) == total


@pytest.mark.parametrize("name", ["nightly", "nightly-merge"])
def test_digest_commands_print_only_the_digest_on_stdout(name, monkeypatch, tmp_path):
    """``nightly ... > digest.md`` holds the digest alone; the browse hint goes to stderr."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    import parity_tracker.pipeline.night as night
    import parity_tracker.pipeline.nightly as nightly

    result = SimpleNamespace(digest="# Parity nightly — PASS\n", parent_run_id=None,
                             missing_shards=[], shard_problems=[], spooled=[], exit_code=0,
                             to_dict=dict)  # fmt: skip
    monkeypatch.setattr(nightly, "run_nightly", lambda *a, **k: result)
    monkeypatch.setattr(night, "merge_night", lambda *a, **k: result)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    args = ["--night", "N1"] if name == "nightly-merge" else ["--commit", "abc"]
    res = CliRunner().invoke(cli, [name, *args, "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    assert res.stdout == "# Parity nightly — PASS\n\n"
    assert "Browse the runs" in res.stderr
