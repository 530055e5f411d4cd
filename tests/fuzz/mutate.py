"""Mutations aimed at an image's structures (layout.py), drawn from one `random.Random`: a
case is a seed image and one to three mutations, each a few bytes patched over it, or the
image cut short. The same generator state always makes the same recipe."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from fuzz.layout import Field, Layout, qcow2_layout, vmdk_layout
from fuzz.recipes import Mutation, Recipe
from fuzz.seeds import SEED_FORMATS, SEED_IMAGES, seed_image

# The pieces the judge is fed: odd sizes put structures across their edges (512-byte pieces
# cost about a second an image).
CHUNK_SIZES = (4093, 65536, 1048573, 4 * 1024 * 1024)


@functools.cache
def layout_of(name: str) -> Layout:
    parse = qcow2_layout if SEED_FORMATS[name] == "qcow2" else vmdk_layout
    return parse(seed_image(name))


def random_recipe(chooser: random.Random) -> Recipe:
    name = chooser.choice(sorted(SEED_IMAGES))
    image, layout = seed_image(name), layout_of(name)
    count = chooser.choices((1, 2, 3), weights=(6, 3, 1))[0]
    mutations = []
    for _ in range(count):
        if chooser.random() < 0.08:
            mutations.append(_cut(chooser, image, layout))
        elif chooser.random() < 0.8 or not layout.spans:
            mutations.append(_field_mutation(chooser, image, layout))
        else:
            mutations.append(_span_mutation(chooser, image, layout))
    return Recipe(name, tuple(mutations), chooser.choice(CHUNK_SIZES))


def _field_mutation(chooser: random.Random, image: bytes, layout: Layout) -> Mutation:
    kind = chooser.choice(sorted(layout.fields))
    candidates = layout.fields[kind]
    # Most of a table's entries are unused: aim mostly at the ones that say something.
    used = [field for field in candidates if _current(image, field)]
    target = chooser.choice(used if used and chooser.random() < 0.75 else candidates)
    old = _current(image, target)
    new = _new_value(chooser, old, target, image, layout)
    return Mutation(
        target.kind,
        f"{target.name}: {old:#x} -> {new:#x}",
        target.offset,
        new.to_bytes(target.width, target.order),
    )


def _current(image: bytes, field: Field) -> int:
    return int.from_bytes(image[field.offset : field.offset + field.width], field.order)


def _new_value(chooser: random.Random, old: int, field: Field, image: bytes, layout: Layout) -> int:
    bits = field.width * 8
    top = (1 << bits) - 1
    unit = layout.unit
    choices: list[Callable[[], int]] = [
        lambda: 0,
        lambda: 1,
        lambda: top,
        lambda: 1 << (bits - 1),
        lambda: old + 1,
        lambda: old - 1,
        lambda: old ^ (1 << chooser.randrange(bits)),
        lambda: old ^ (1 << chooser.randrange(bits)) ^ (1 << chooser.randrange(bits)),
        lambda: old * 2,
        lambda: old // 2,
        lambda: old + chooser.choice((-1, 1)) * chooser.choice((8, 512, unit)),
        lambda: chooser.getrandbits(bits),
        # An offset (or a sector, for a vmdk) at another structure, or past the end.
        lambda: chooser.choice(layout.offsets) // (1 if unit > 512 else 512),
        lambda: (
            (len(image) + chooser.choice((0, 1, 512, unit, 1 << 20))) // (1 if unit > 512 else 512)
        ),
        # The same flags, another place: a qcow2 entry's offset bits, a cluster over.
        lambda: old ^ chooser.choice((unit, 2 * unit, unit // 2)),
    ]
    while (new := chooser.choice(choices)() & top) == old:
        pass
    return new


def _span_mutation(chooser: random.Random, image: bytes, layout: Layout) -> Mutation:
    span = chooser.choice(layout.spans)
    at = span.offset + chooser.randrange(max(1, span.length))
    how = chooser.choice(("flip", "zero", "random", "head"))
    if how == "flip":
        data = bytes([image[at] ^ (1 << chooser.randrange(8))])
    elif how == "head":  # the deflate stream's first bytes (its block header)
        at, data = span.offset, chooser.randbytes(chooser.randrange(1, 4))
    else:
        length = min(chooser.choice((1, 4, 64, 512)), span.offset + span.length - at) or 1
        data = bytes(length) if how == "zero" else chooser.randbytes(length)
    return Mutation(span.kind, f"{span.name}: {how} {len(data)} byte(s) at {at}", at, data)


def _cut(chooser: random.Random, image: bytes, layout: Layout) -> Mutation:
    """The image cut inside or at the edge of a structure, or a few bytes short of its end."""
    places = [*layout.offsets, *(span.offset + span.length // 2 for span in layout.spans)]
    at = chooser.choice(places) + chooser.choice((-512, -1, 0, 1, 512))
    if chooser.random() < 0.3:
        at = len(image) - chooser.choice((1, 511, 512, 1024, 1536))
    at = min(max(at, 1), len(image) - 1)
    return Mutation("cut", f"cut to {at} bytes", cut_to=at)
