"""`inference.dedicated_core`: a CPU core for the inference thread alone.

On a small machine running the model on the CPU (ONNX Runtime with one intra-op thread, which runs the
graph on the calling thread), the scheduler puts camera decoding, preprocessing and publishing on the
engine's core now and then, and every batch waits for them. With this on, the inference thread gets the
last core the daemon may use and every other thread of the daemon (those running now, and those they
start, which inherit it) the rest, for the life of the process. Measured in bench/pipeline.py
(docs/benchmarks.md). Off by default: it takes a core from everything else, which only pays where the
engine is the CPU's heaviest work.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PASSES = 20  # listings of the process's threads at most, until one finds no thread not seen before


@dataclass(frozen=True)
class CoreSplit:
    engine: frozenset[int]  # the inference thread's core
    others: frozenset[int]  # every other thread's


def dedicate(enabled: bool, cpu_bound: bool, ort_threads: int) -> CoreSplit | None:
    """Plan the split and move the threads running now onto the other cores; the inference thread, started
    after, moves itself onto its own (`apply_engine`). None: not asked for, or not possible (logged)."""
    split = plan(enabled, cpu_bound, ort_threads)
    if split is not None:
        apply_others(split)
    return split


def plan(enabled: bool, cpu_bound: bool, ort_threads: int) -> CoreSplit | None:
    """The split to apply, or None (with the reason logged when it was asked for and cannot be had)."""
    if not enabled:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    why = ""
    if not cpu_bound:
        why = "the engine does not run on the CPU"
    elif ort_threads != 1:
        why = f"onnxruntime.threads is {ort_threads} (0 = ONNX Runtime's choice); it must be 1"
    elif len(allowed) < 2:
        why = f"the daemon may use {len(allowed)} core(s)"
    if why:
        logger.warning("inference.dedicated_core: not applied: %s", why)
        return None
    return CoreSplit(frozenset(allowed[-1:]), frozenset(allowed[:-1]))


def apply_others(split: CoreSplit) -> None:
    """Move every thread of this process onto the other cores (threads started later inherit their
    creator's set). A thread started by one not yet moved keeps the full set, so the listing repeats
    until a pass finds no thread it has not seen. The inference thread moves itself (`apply_engine`)."""
    seen: set[str] = set()
    for _ in range(PASSES):  # bounded: a thread that keeps starting short-lived ones cannot hold the start up
        fresh = set(os.listdir("/proc/self/task")) - seen
        if not fresh:
            break
        for tid in fresh:
            try:
                os.sched_setaffinity(int(tid), split.others)
            except ProcessLookupError:  # a thread that ended since the listing
                pass
            except OSError as exc:
                logger.warning("inference.dedicated_core: thread %s stays where it was: %s", tid, exc)
        seen |= fresh
    logger.info(
        "inference.dedicated_core: the inference thread on core %s, the daemon's other threads on %s",
        ",".join(map(str, sorted(split.engine))),
        ",".join(map(str, sorted(split.others))),
    )


def apply_engine(split: CoreSplit) -> None:
    """Called by the inference thread itself. Its core gone offline by then (a power mode) leaves it on every
    core the daemon had, with a warning: the daemon serves on, unpinned. (A core taken offline later is the
    kernel's to handle: it moves the thread.)"""
    try:
        os.sched_setaffinity(0, split.engine)
    except OSError as exc:
        logger.warning("inference.dedicated_core: the inference thread runs on every core: %s", exc)
        try:
            os.sched_setaffinity(0, split.engine | split.others)
        except OSError as again:
            logger.warning("inference.dedicated_core: and stays where it was: %s", again)
