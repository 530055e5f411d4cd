"""ImagePrepare, only where the backend can import images."""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ports import CapabilitySource, Images
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import PreparedImage, PrepareImageRequest


class PrepareImage:
    def __init__(self, images: Images, capabilities: CapabilitySource) -> None:
        self._images = images
        self._capabilities = capabilities

    def __call__(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        supported = self._capabilities.capabilities().supports_image_import
        return Result.do(
            prepared
            for _ in require(supported, "image import (ImagePrepare)")
            for prepared in self._images.prepare_image(request)
        )
