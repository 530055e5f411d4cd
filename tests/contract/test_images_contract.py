"""Images (ImagePrepare), on every backend that has the port."""

from __future__ import annotations

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import DiskQuery, ImageSource, OwnerMark, PrepareImageRequest

from contract.harness import Harness
from contract.steps import create, disks
from support import error_kind, ok


def test_prepare_image_is_idempotent_and_usable(images_harness: Harness, owner: OwnerMark) -> None:
    harness = images_harness
    images = harness.backend.images
    assert images is not None
    source = harness.prepare_source or ImageSource(path=harness.image.path)
    request = PrepareImageRequest(source=source, target_name="contract-prepared")
    if not harness.backend.capabilities.capabilities().supports_image_import:
        # The capability is what gates ImagePrepare: a backend without it must refuse.
        assert error_kind(images.prepare_image(request)) is ErrorKind.UNSUPPORTED
        return
    first = ok(images.prepare_image(request))
    assert ok(images.prepare_image(request)) == first
    prepared = harness.image.model_copy(update={"path": first.path})
    vm_id = create(harness, owner, "contract-from-prepared", image=prepared)
    assert ok(disks(harness).disk_details(DiskQuery(vm_id=vm_id))).path != first.path
