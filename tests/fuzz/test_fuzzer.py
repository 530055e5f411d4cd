"""The fuzzer: seeded mutations of valid qcow2 and streamOptimized vmdk images (fuzz/mutate.py),
each judged by pyrigaud's image judge and by qemu-img (fuzz/oracle.py). A run fails on a
disagreement of a kind no regression case keeps open (fuzz/regressions/), naming the case's
recipe; the kinds kept are replayed by test_regressions.py.

PYRIGAUD_FUZZ_CASES sets the number of cases (DEFAULT_CASES by default, about two minutes
on two cores) and PYRIGAUD_FUZZ_SEED the seed; the same seed and count make the same cases.
With PYRIGAUD_FUZZ_FOUND set to a folder, each new kind's regression file is written there,
ready to be moved into fuzz/regressions/."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fuzz.mutate import random_recipe
from fuzz.oracle import classified, outcome
from fuzz.recipes import Recipe, load_regressions, regression_json
from fuzz.seeds import SEED_IMAGES, seed_image

DEFAULT_CASES = 3000
DEFAULT_SEED = 41
BATCH_CASES = 50  # one test per batch: each stays well under the per-test timeout
CASES = int(os.environ.get("PYRIGAUD_FUZZ_CASES", DEFAULT_CASES))
SEED = int(os.environ.get("PYRIGAUD_FUZZ_SEED", DEFAULT_SEED))
BATCHES = max(1, -(-CASES // BATCH_CASES))


@pytest.mark.parametrize("name", sorted(SEED_IMAGES))
def test_every_seed_image_is_accepted_and_read_alike(name: str) -> None:
    """Unmutated, each seed image is accepted by the judge and by qemu-img, and the disk
    pyrigaud lands is the disk qemu-img reads: a disagreement the fuzzer finds is the
    mutation's."""
    found = outcome(Recipe(name, ()))
    assert found.judge_accepted, found
    assert found.disagreement is None, found


def test_a_seed_image_is_the_same_bytes_each_time_it_is_made() -> None:
    """A regression case's patches mean the same thing in every run only if its seed image is
    the same bytes (qemu-img writes a random content ID into a vmdk: it is fixed)."""
    made = {name: seed_image(name) for name in SEED_IMAGES}
    seed_image.cache_clear()
    assert {name: seed_image(name) for name in SEED_IMAGES} == made


def test_a_case_is_the_same_recipe_for_the_same_seed_and_number() -> None:
    first = random_recipe(random.Random(f"{SEED}:3"))
    assert random_recipe(random.Random(f"{SEED}:3")) == first
    assert Recipe.from_json(first.as_json()) == first


@pytest.mark.slow
@pytest.mark.parametrize("batch", range(BATCHES), ids=lambda batch: f"batch{batch}")
def test_the_judge_never_accepts_what_qemu_img_refuses_or_reads_otherwise(batch: int) -> None:
    # Only a kind still open is let pass: a disagreement of a kind once closed fails the run.
    still_open = {kept.signature for kept in load_regressions() if kept.known_open}
    new: dict[str, tuple[str, str]] = {}  # by signature: the file's name and its text
    judged = 0
    for case in range(batch * BATCH_CASES, min(CASES, (batch + 1) * BATCH_CASES)):
        recipe = random_recipe(random.Random(f"{SEED}:{case}"))
        found = classified(recipe)
        judged += 1
        if found.signature is None or found.signature in still_open or found.signature in new:
            continue
        new[found.signature] = (
            found.name,
            regression_json(
                found.signature,
                found.recipe,
                f"qemu-img {found.outcome.qemu}; the judge {found.outcome.judge} "
                f"(PYRIGAUD_FUZZ_SEED={SEED}, case {case})",
            ),
        )
    assert judged
    _write_found(new)
    assert not new, "disagreements of kinds no regression case keeps open:\n" + "\n".join(
        text for _, text in new.values()
    )


def _write_found(new: dict[str, tuple[str, str]]) -> None:
    folder = os.environ.get("PYRIGAUD_FUZZ_FOUND")
    if not folder:
        return
    for name, kept in new.values():
        path = Path(folder) / f"{name}.json"
        if not path.exists():  # the first case of a kind is kept, whatever the batches' order
            path.write_text(kept)
