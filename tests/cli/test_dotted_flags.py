"""One flag style: run-configuration options are dotted keys in every command; the older
spellings still parse for one release, with a deprecation line."""

from __future__ import annotations

import pytest

from snip.cli import DOTTED, build_parser, deprecations


def _parse(argv: list[str]):
    return build_parser(load=[argv[0]]).parse_args(argv)


@pytest.mark.parametrize("command", sorted(DOTTED))
def test_help_shows_the_dotted_keys_only(command: str) -> None:
    parser = build_parser(load=[command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    shown = {o for a in sub._actions for o in a.option_strings}
    for old, new in DOTTED[command].items():
        assert new in shown and old not in shown, (old, new)


def test_old_and_new_spellings_set_the_same_option() -> None:
    new = _parse(["audit", "--model.name", "small", "--train.steps", "7", "--train.lr", "0.01",
                  "--train.batch_size", "4", "--train.seq_len", "32"])
    old = _parse(["audit", "--model", "small", "--steps", "7", "--lr", "0.01", "--batch", "4",
                  "--seq-len", "32"])
    keys = ("model", "steps", "lr", "batch", "seq_len")
    assert [getattr(new, k) for k in keys] == [getattr(old, k) for k in keys] == [
        "small", 7, 0.01, 4, 32]
    plan = _parse(["plan", "--precision.budget", "0.5", "--precision.plan_seed", "3"])
    assert (plan.budget, plan.seed) == (0.5, 3) == (
        _parse(["plan", "--budget", "0.5", "--precision.seed", "3"]).budget, 3)
    cmp_new = _parse(["compare", "--train.threads", "2", "--train.eval_batches", "5"])
    assert (cmp_new.threads, cmp_new.eval_batches) == (2, 5)


def test_the_old_spelling_says_it_is_deprecated() -> None:
    lines = deprecations("audit", ["--model", "tiny", "--steps=5", "--model.name", "tiny"])
    assert lines == [
        "snip audit: --model is deprecated, use --model.name (the old spelling goes in the next "
        "release)",
        "snip audit: --steps is deprecated, use --train.steps (the old spelling goes in the "
        "next release)"]
    assert deprecations("plan", ["--precision.budget", "0.5"]) == []


@pytest.mark.parametrize("form", [["bf16", "mxfp4"], ["bf16,mxfp4"], ["bf16,", "mxfp4"]])
def test_a_list_option_takes_names_or_name_comma_name_in_every_command(form: list[str]) -> None:
    from snip.cli.train import config_overrides
    from snip.train import from_sources
    from snip.train.config import split_names

    train = config_overrides(_parse(["train", "--precision.candidates", *form]))
    assert from_sources(overrides=train).precision.candidates == ("bf16", "mxfp4")
    for command in ("plan", "compare"):
        parsed = _parse([command, "--precision.candidates", *form]).candidates
        assert split_names(parsed) == ("bf16", "mxfp4"), command
