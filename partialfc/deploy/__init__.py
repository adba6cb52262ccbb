"""Using a trained backbone: export (ONNX + safetensors + preprocessing spec), ``Embedder``,
calibrated 1:1 verification, and a persistent faiss ``Gallery`` for 1:N search."""

from partialfc.backbone.embedder import Embedder
from partialfc.backbone.spec import PreprocessingSpec
from partialfc.deploy.export import (
    ExportCheckError,
    ExportResult,
    export_backbone,
    export_checkpoint,
)
from partialfc.deploy.gallery import Gallery, GalleryFileError, SearchResult
from partialfc.deploy.verify import (
    CalibratedThreshold,
    ModelMismatchError,
    Verification,
    Verifier,
    calibrate,
    check_threshold_model,
    decide,
    threshold_from_impostors,
)

__all__ = [
    "CalibratedThreshold",
    "Embedder",
    "ExportCheckError",
    "ExportResult",
    "Gallery",
    "GalleryFileError",
    "ModelMismatchError",
    "PreprocessingSpec",
    "SearchResult",
    "Verification",
    "Verifier",
    "calibrate",
    "check_threshold_model",
    "decide",
    "export_backbone",
    "export_checkpoint",
    "threshold_from_impostors",
]
