"""The README runs as written: every Python block executes, every command line of a bash block runs,
and the command-line synopsis names every option of every command's --help."""

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

import convtune
from convtune.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: lines of bash blocks that the tests do not run, and why
NOT_RUN = {
    "bash scripts/test.sh": "it is this test run's own command",
    "pip install": "the test set-up installs the project; the extras need a GPU or the network",
}


def blocks(language):
    return [(number, body) for number, (lang, body) in enumerate(FENCE.findall(README.read_text()), 1)
            if lang == language]


def test_every_block_is_labelled():
    assert all(lang in ("python", "bash", "text") for lang, _ in FENCE.findall(README.read_text()))
    assert blocks("python") and blocks("bash") and blocks("text")


@pytest.fixture
def in_a_fresh_directory(tmp_path, monkeypatch, fake_default_timer):
    """Each block runs in an empty directory with its own default plan cache (quick fake timings)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVTUNE_DB", str(tmp_path / "default-plans.db"))
    previous = convtune.set_default_runtime(None)
    yield tmp_path
    convtune.set_default_runtime(previous)


@pytest.mark.parametrize("number, body", blocks("python"), ids=lambda v: f"block{v}" if isinstance(v, int) else "")
def test_python_blocks_run_as_written(number, body, in_a_fresh_directory):
    if "import torch" in body:
        pytest.importorskip("torch")
    exec(compile(body, f"README.md code block {number}", "exec"), {"__name__": "__readme__"})


def _commands(body):
    """The command lines of a bash block (comments and blank lines left out)."""
    return [line.split("#")[0].strip() for line in body.splitlines() if line.split("#")[0].strip()]


@pytest.mark.parametrize("number, body", blocks("bash"), ids=lambda v: f"block{v}" if isinstance(v, int) else "")
def test_bash_blocks_run_as_written(number, body, in_a_fresh_directory):
    ran = 0
    for line in _commands(body):
        if any(line.startswith(prefix) for prefix in NOT_RUN):
            continue
        args = shlex.split(line)
        if args[:2] == ["bash", "scripts/convtune.sh"]:  # the script sets up, then runs the CLI with these args
            args = ["convtune", *args[2:]]
        assert args[0] == "convtune", f"README block {number}: {line!r} is neither run nor exempted"
        if args[1] == "report":
            pytest.importorskip("matplotlib")
        result = CliRunner().invoke(main, args[1:])
        assert result.exit_code == 0 and "Traceback" not in result.output, f"{line}\n{result.output}"
        ran += 1
    assert ran or all(any(c.startswith(p) for p in NOT_RUN) for c in _commands(body))


def test_the_synopsis_names_every_option_of_every_command():
    (synopsis,) = [body for _, body in blocks("text") if body.startswith("convtune ")]
    entries = {}
    for line in synopsis.splitlines():
        if line.startswith("convtune "):
            current = line.split()[1]
            entries[current] = line
        else:
            entries[current] += " " + line
    assert set(entries) - {"--version"} == set(main.commands), "a command missing from (or extra in) the synopsis"
    for name, command in main.commands.items():
        for param in command.params:
            opts = [o for o in getattr(param, "opts", []) + getattr(param, "secondary_opts", []) if o.startswith("-")]
            if opts and "--help" not in opts:
                assert any(re.search(re.escape(o) + r"(?![\w-])", entries[name]) for o in opts), \
                    f"convtune {name}: {opts} missing from the README synopsis"
    assert "--version" in synopsis


def test_the_readme_quotes_the_main_jobs_measured_time():
    text = README.read_text()
    assert "MAINJOB_TIME" not in text and re.search(r"the main job takes about \d+ s", text)


def test_the_layer_format_points_into_the_project():
    text = README.read_text()
    for path in re.findall(r"`((?:convtune|benchmarks|scripts|docs|tests)/[\w./-]+)`", text):
        assert (README.parent / path).exists(), f"README names {path}, which is not in the project"
    assert "shared/bench/layers.yaml" not in text
    assert os.path.exists(README.parent / "convtune" / "networks" / "public-suite.yaml")
