"""Honest ``--help``: each default once, choices for enumerated values, only the options a
command uses, train's options grouped by section."""

from __future__ import annotations

import re

import pytest

from snip.cli import build_parser, commands


def _help(command: str) -> str:
    parser = build_parser(load=[command])
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()


def _option_blocks(text: str) -> dict[str, str]:
    """option -> its help text (the lines up to the next option)."""
    blocks, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (-[-\w.]+|--[\w.-]+)", line)
        if m:
            current = m.group(1)
            blocks[current] = line
        elif current and line.startswith("      "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_default_is_printed_once(command: str) -> None:
    for option, block in _option_blocks(_help(command)).items():
        assert block.count("(default") <= 1, (option, block)
        assert "(default: None)" not in block and "==SUPPRESS==" not in block, block


def test_required_and_no_default_options_show_no_default() -> None:
    blocks = _option_blocks(_help("compare"))
    assert blocks["--reference"].count("default") == 1  # "(default: the first arm)" only
    assert "(default: )" not in blocks["--reference"]
    assert "default" not in _option_blocks(_help("export"))["--out"]  # required


def test_enumerated_values_show_their_choices() -> None:
    text = _help("train")
    for flag, choice in (("--train.schedule", "{cosine,linear,constant,wsd}"),
                         ("--precision.mode", "{fixed,adaptive}"),
                         ("--dist.strategy", "{ddp,fsdp}"),
                         ("--precision.method", "layer_type"),
                         ("--writeback.policy", "{none,rne,stochastic,master,")):
        assert re.search(re.escape(flag) + r" \{[^}]*" + re.escape(choice.strip("{")), text), flag


def test_eval_and_sample_list_no_adaptive_training_options() -> None:
    for command in ("eval", "sample"):
        text = _help(command)
        assert "--precision.preset" in text and "--precision.plan" in text
        for flag in ("--precision.every", "--precision.ema_decay", "--precision.budget",
                     "--precision.mode", "--precision.calib_rows"):
            assert flag not in text, (command, flag)
        # their defaults are the run's, not training's (an empty preset is not fp8 there)
        blocks = _option_blocks(text)
        for flag in ("--precision.preset", "--precision.plan", "--precision.accum"):
            assert blocks[flag].endswith("(default: the run's)"), (command, blocks[flag])
        assert "fp8_e4m3_tile128" not in blocks["--precision.preset"]
        assert "re-plans" not in blocks["--precision.accum"]
    assert _option_blocks(_help("eval"))["--data.path"].endswith("(default: the run's)")
    assert _option_blocks(_help("train"))["--precision.preset"].endswith("(default: '')")


@pytest.mark.parametrize(("command", "flag"), [("sample", "--seed"), ("sample", "--top-k"),
                                               ("audit", "--seed"), ("compare", "--units")])
def test_a_default_of_zero_is_shown(command: str, flag: str) -> None:
    assert _option_blocks(_help(command))[flag].endswith("(default: 0)")


def test_train_help_is_grouped_by_section() -> None:
    text = _help("train")
    groups = re.findall(r"^(\w+) options:$", text, flags=re.M)
    assert {"model", "data", "train", "precision", "writeback", "dist", "general"} <= set(groups)
    precision = text.split("precision options:")[1].split("\n\n")[0]
    assert "--precision.budget" in precision and "--train.steps" not in precision
