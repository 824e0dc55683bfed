"""Hostile specs (security issue 28, item 8): a YAML alias bomb is refused at load, before anything
is created (it passed validate and plan, then grew past 1.7 GB once the spec was dumped into the
ledger), while the aliases PyYAML's own dump writes still load; a reserved #SBATCH option written as a prefix getopt_long would accept is refused like
the option itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.directives import reserved_problem
from orchestrator.campaign.spec import SpecError, load_campaign

pytestmark = pytest.mark.unit

BOMB = """name: bomb
workdir: {workdir}
args:
  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
  g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]
"""


def test_a_yaml_alias_bomb_is_refused_at_load_and_creates_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB.format(workdir=tmp_path / "work"))
    with pytest.raises(SpecError, match="expands to more than 1,000,000 values once its YAML aliases"):
        load_campaign(spec)
    assert not (tmp_path / "work").exists()


def test_a_spec_with_a_few_aliases_loads(tmp_path: Path) -> None:
    """PyYAML's own dump writes a repeated value once and aliases it: a generated spec is no bomb."""
    import yaml

    fault = {"kind": "kill-rank", "after": {"fixed": 1.0}, "rank": 0}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "aliased", "workdir": str(tmp_path / "work"), "faults": [fault] * 3}))
    assert "*id001" in spec.read_text() and len(load_campaign(spec).faults) == 3


@pytest.mark.parametrize("text,read_as", [("--job-n=evil", "--job-name"), ("--requ", "--requeue"),
                                          ("--out=/tmp/x", "--output"), ("--job-name=x", None)])
def test_a_reserved_option_written_as_a_prefix_is_refused(text: str, read_as: str | None) -> None:
    problem = reserved_problem(text, "slurm")
    assert problem is not None and "is set by Faultdrill on slurm" in problem
    assert read_as is None or f"read as {read_as}" in problem


@pytest.mark.parametrize("text", ["--exclusive", "--account=ml", "-A ml", "--mem=4G"])
def test_options_faultdrill_does_not_set_pass(text: str) -> None:
    assert reserved_problem(text, "slurm") is None


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  # the review's: names the first screen let through
                                  "KAGGLE_KEY", "WANDB_KEY", "MY_SECRETS", "GITHUB_PAT", "PASSPHRASE", "DATABASE_URL",
                                  "AZURE_STORAGE_CONNECTION_STRING",
                                  # the re-review's: words glued together, as some tools name them
                                  "PGPASSWORD", "CLIENTSECRET", "GPGPASSPHRASE", "SMTP_PASS", "OPENAI_APIKEY"])
def test_a_secret_in_workload_env_is_refused_naming_where_it_belongs(tmp_path: Path, name: str) -> None:
    """Item 5: workload.env values were stored in the ledger, the report and the ranks' pickles."""
    from orchestrator.campaign.spec import parse_campaign

    raw = {"name": "s", "workdir": str(tmp_path / "work"), "workload": {"command": ["./train"], "env": {name: "x"}}}
    with pytest.raises(SpecError, match=f"{name}: looks like a secret.*export it in the shell you start the drill from"):
        parse_campaign(raw, base_dir=tmp_path)
    raw["workload"]["env"] = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    assert parse_campaign(raw, base_dir=tmp_path).workload.env["OMP_NUM_THREADS"] == "1"


def test_a_sweep_whose_product_is_too_large_is_refused_by_its_count(tmp_path: Path) -> None:
    """Review of item 8: 425 values in a 469-byte spec, accepted, expanded toward 10^8 runs (the
    check counted values, not the grid's product) until the CPU limit killed it."""
    import time

    from orchestrator.campaign.runs import expand_runs

    grid = {f"args.k{index}": list(range(10)) for index in range(8)}  # 10^8 points
    spec = tmp_path / "spec.yaml"
    import yaml

    spec.write_text(yaml.safe_dump({"name": "wide", "workdir": str(tmp_path / "work"), "sweep": {"grid": grid},
                                    "args": {f"k{index}": 0 for index in range(8)}}))
    started = time.monotonic()
    with pytest.raises(SpecError, match="100,000,000 points .* more than 100,000"):
        expand_runs(load_campaign(spec))
    assert time.monotonic() - started < 5


def test_a_secret_in_args_is_refused_the_ranks_command_line_is_public(tmp_path: Path) -> None:
    """Issue 28's review, item 5: args.wandb_api_key was accepted and became a word of every rank's
    command line, which every user of a node reads in ps."""
    from orchestrator.campaign.spec import parse_campaign

    raw = {"name": "s", "workdir": str(tmp_path / "work"), "args": {"wandb_api_key": "x", "lr": 0.1},
           "workload": {"command": ["./train", "--key", "{wandb_api_key}"]}}
    with pytest.raises(SpecError, match="wandb_api_key: looks like a secret.*command line"):
        parse_campaign(raw, base_dir=tmp_path)


def test_a_credential_in_a_url_value_is_refused(tmp_path: Path) -> None:
    """Re-review: values were never screened: PIP_INDEX_URL=https://user:tok@host/ was stored in clear."""
    from orchestrator.campaign.spec import parse_campaign

    raw = {"name": "s", "workdir": str(tmp_path / "work"),
           "workload": {"command": ["./train"], "env": {"PIP_INDEX_URL": "https://user:tok3n@pypi.example/simple"}}}
    with pytest.raises(SpecError, match="PIP_INDEX_URL: its value holds a password.*export it in the shell"):
        parse_campaign(raw, base_dir=tmp_path)
    raw["workload"]["env"] = {"PIP_INDEX_URL": "https://pypi.example/simple", "HTTP_PROXY": "http://proxy:3128"}
    assert parse_campaign(raw, base_dir=tmp_path).workload.env["HTTP_PROXY"] == "http://proxy:3128"


@pytest.mark.parametrize("field, words", [("command", ["./train", "--hf-token", "hf_abc"]),
                                          ("command", ["./train", "--wandb_api_key=xyz"]),
                                          ("resume_args", ["--api-key=xyz"])])
def test_a_secret_flag_on_the_ranks_command_line_is_refused(tmp_path: Path, field: str, words: list[str]) -> None:
    """Re-review: workload.command and resume_args were not screened, though they are the same public
    command line as args."""
    from orchestrator.campaign.spec import parse_campaign

    workload = {"command": ["./train"], **{field: words}}
    raw = {"name": "s", "workdir": str(tmp_path / "work"), "workload": workload}
    with pytest.raises(SpecError, match="looks like a secret.*command line"):
        parse_campaign(raw, base_dir=tmp_path)


def test_flags_that_name_where_a_secret_is_pass(tmp_path: Path) -> None:
    from orchestrator.campaign.spec import parse_campaign

    command = ["./train", "--token-file", "/run/user/tok", "--api-key-path=~/.key", "--sort-key", "x", "--pwd", "."]
    raw = {"name": "s", "workdir": str(tmp_path / "work"), "workload": {"command": command}}
    assert parse_campaign(raw, base_dir=tmp_path).workload.command == command


def test_a_sweep_of_many_points_over_a_large_spec_is_refused_by_their_product(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-review: each bound held alone (values < 1,000,000 once aliases are written out, points <
    100,000), not together: every point is a copy of the spec, ~1.3 CPU hours and ~1 TB in all.
    Refused before the first point is made (counted: a bound on the time failed on a busy host)."""
    import yaml

    from orchestrator.campaign import runs as runs_module
    from orchestrator.campaign.runs import expand_runs

    points_made: list[object] = []
    apply_point = runs_module._apply_point
    monkeypatch.setattr(runs_module, "_apply_point", lambda *args: points_made.append(args) or apply_point(*args))

    big = {f"k{index}": list(range(100)) for index in range(200)}  # 20,000 values in every point
    grid = {"args.a": list(range(100)), "args.b": list(range(100))}  # 10,000 points
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "heavy", "workdir": str(tmp_path / "work"), "sweep": {"grid": grid},
                                    "args": {"a": 0, "b": 0, "big": big}}))
    with pytest.raises(SpecError, match="10,000 points of a spec of more than .* values"):
        expand_runs(load_campaign(spec))
    assert points_made == []
