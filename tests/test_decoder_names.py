"""Decoder names have one source, ``edged.models.init.recognise.DECODERS``: the daemon's registry has one row per
name and no other, and ``edged model init --decoder`` offers the same names (issue 28)."""

from __future__ import annotations

import argparse

from edged.cli import build_parser
from edged.daemon.decoders import DECODERS as REGISTRY
from edged.models.init.recognise import DECODERS, PREPROCESS, PREPROCESS_WHY


def test_the_registry_has_one_row_per_decoder_name() -> None:
    assert len(set(DECODERS)) == len(DECODERS)
    assert sorted(REGISTRY) == sorted(DECODERS)


def test_model_init_knows_each_decoders_preprocessing() -> None:
    assert sorted(PREPROCESS) == sorted(DECODERS) == sorted(PREPROCESS_WHY)


def test_model_init_help_names_every_decoder() -> None:
    parser = build_parser()
    for name in ("model", "init"):
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    (decoder,) = [a for a in parser._actions if a.dest == "decoder"]
    assert decoder.help == f"{', '.join(DECODERS[:-1])} or {DECODERS[-1]}"
