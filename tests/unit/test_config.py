"""Config dataclasses on the command line (scheduler/config.py): every field of every config with
a CLI is a flag, typed, with its default and the comment beside it; what the flags set is what
the dataclass holds."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Literal

import pytest

from scheduler import train_ppo, train_tapfinger
from scheduler.config import add_options, field_comments, from_args
from scheduler.eade import ces
from scheduler.eade.__main__ import parse as eade_parse
from scheduler.eade.experiment import ExperimentConfig
from scheduler.env import EnvConfig
from scheduler.ppo import PPOConfig
from scheduler.tapfinger.mappo import Hyper


def flags(base: object, prefix: str = "") -> list[str]:
    """The flag of every field of `base`, nested configs' fields included."""
    out = []
    for f in dataclasses.fields(base):
        value = getattr(base, f.name)
        if dataclasses.is_dataclass(value):
            out += flags(value, prefix + f.name + ".")
        else:
            out.append("--" + (prefix + f.name).replace("_", "-"))
    return out


@pytest.mark.parametrize(
    "main, configs",
    [
        (train_ppo.main, [PPOConfig(), EnvConfig()]),
        (ces.main, [ces.CesEadeConfig()]),
        (lambda argv: eade_parse(argv), [ExperimentConfig()]),
        (lambda argv: train_tapfinger.main(["paper", *argv]), [Hyper()]),
        (lambda argv: train_tapfinger.main(["ces", *argv]), [Hyper()]),
    ],
    ids=["train_ppo", "eade.ces", "eade", "train_tapfinger paper", "train_tapfinger ces"],
)
def test_every_field_of_every_config_with_a_cli_is_a_flag(main, configs, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    expected = [flag for cfg in configs for flag in flags(cfg)]
    assert len(expected) == len(set(expected))
    missing = [flag for flag in expected if not re.search(re.escape(flag) + r"[\s,]", help_text)]
    assert not missing


def test_the_training_cli_gives_the_defaults_and_what_the_flags_set():
    _, cfg, env_cfg = train_ppo.parse_args([])
    assert (cfg, env_cfg) == (PPOConfig(), EnvConfig())  # the committed checkpoint's command
    _, cfg, env_cfg = train_ppo.parse_args(
        ["--lr", "0.5", "--encoder", "mlp", "--guide-prior", "-1", "-2.5", "--validation", "0"]
        + ["--sites", "3", "9", "--small-jobs.cpu-choices", "0.5", "1"]
        + ["--no-gpu-jobs.log-workers", "--cpu-jobs.max-workers", "7"]
    )
    assert cfg == dataclasses.replace(
        PPOConfig(), lr=0.5, encoder="mlp", guide_prior=(-1.0, -2.5), validation=0
    )
    assert env_cfg.sites == (3, 9)
    assert env_cfg.small_jobs.cpu_choices == (0.5, 1.0)
    assert env_cfg.small_jobs.max_workers == EnvConfig().small_jobs.max_workers
    assert env_cfg.gpu_jobs.log_workers is False
    assert env_cfg.cpu_jobs.max_workers == 7
    with pytest.raises(SystemExit) as e:
        train_ppo.parse_args(["--encoder", "cnn"])
    assert e.value.code == 2


@dataclasses.dataclass(frozen=True)
class Inner:
    width: float = 1.0  # beside
    #                     and on


@dataclasses.dataclass(frozen=True)
class Outer:
    # above, one line
    # and another
    name: Literal["a", "b"] = "a"
    sizes: tuple[int, ...] = (1, 2)  # beside only
    # the next field's, not this one's
    inner: Inner = Inner(width=2.0)
    plain: bool = True


def test_help_comes_from_the_comments_and_nested_flags_start_from_the_instance():
    assert field_comments(Outer) == {
        "name": "above, one line and another",
        "sizes": "beside only",
        "inner": "the next field's, not this one's",
    }
    assert field_comments(Inner) == {"width": "beside and on"}
    parser = argparse.ArgumentParser()
    add_options(parser, Outer())
    assert "beside and on (default: 2.0)" in " ".join(parser.format_help().split())
    args = parser.parse_args(["--inner.width", "3", "--no-plain", "--sizes", "4"])
    assert from_args(args, Outer()) == Outer("a", (4,), Inner(3.0), False)
    assert from_args(parser.parse_args([]), Outer()) == Outer()


def test_a_field_of_a_type_without_a_flag_is_refused_when_the_options_are_made():
    @dataclasses.dataclass
    class Odd:
        table: dict = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="config field table"):
        add_options(argparse.ArgumentParser(), Odd())
