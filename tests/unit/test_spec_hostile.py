"""Hostile specs (security issue 28, item 8): a YAML alias bomb is refused at load, before anything
is created (it passed validate and plan, then grew past 1.7 GB once the spec was dumped into the
ledger); a reserved #SBATCH option written as a prefix getopt_long would accept is refused like
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
  e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]
"""


def test_a_yaml_alias_bomb_is_refused_at_load_and_creates_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB.format(workdir=tmp_path / "work"))
    with pytest.raises(SpecError, match="aliases .* are not allowed in a spec"):
        load_campaign(spec)
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("text,read_as", [("--job-n=evil", "--job-name"), ("--requ", "--requeue"),
                                          ("--out=/tmp/x", "--output"), ("--job-name=x", None)])
def test_a_reserved_option_written_as_a_prefix_is_refused(text: str, read_as: str | None) -> None:
    problem = reserved_problem(text, "slurm")
    assert problem is not None and "is set by Faultdrill on slurm" in problem
    assert read_as is None or f"read as {read_as}" in problem


@pytest.mark.parametrize("text", ["--exclusive", "--account=ml", "-A ml", "--mem=4G"])
def test_options_faultdrill_does_not_set_pass(text: str) -> None:
    assert reserved_problem(text, "slurm") is None
