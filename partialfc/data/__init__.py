"""Data: RecordIO, image folders, list files, verification .bin pairs, .npz set loaders, alignment,
transforms, samplers and controlled corruption. Datasets yield (uint8 C×H×W RGB tensor, label)."""

from partialfc.data.align import ARCFACE_TEMPLATE_112, align_face, umeyama_similarity
from partialfc.data.corruption import (
    CorruptedDataset,
    Corruption,
    flip_labels,
    long_tail,
    split_identities,
)
from partialfc.data.datasets import (
    ArrayDataset,
    FileListDataset,
    ImageFolderDataset,
    ListFileDataset,
    read_list_file,
    scan_image_folder,
)
from partialfc.data.decode import decode_image, encode_image
from partialfc.data.lfw import LfwImageArchive, VerificationPairs, read_lfw_pairs
from partialfc.data.loaders import (
    FaceSet,
    OmniglotSet,
    OneShotRun,
    check_contiguous_labels,
    load_lfw_gray,
    load_omniglot,
    load_omniglot_one_shot_runs,
    load_orl,
)
from partialfc.data.pack import pack_images, read_identity_names, unpack_records
from partialfc.data.recordio import (
    IRHeader,
    RecordIODataset,
    RecordIOError,
    RecordIOReader,
    RecordIOWriter,
    pack_record,
    unpack_record,
)
from partialfc.data.sampler import ResumableDistributedSampler
from partialfc.data.transforms import collate_images
from partialfc.data.verification_bin import (
    UnsafePickleError,
    decode_images,
    load_verification_bin,
    write_verification_bin,
)

__all__ = [
    "ARCFACE_TEMPLATE_112",
    "Corruption",
    "CorruptedDataset",
    "ResumableDistributedSampler",
    "align_face",
    "collate_images",
    "flip_labels",
    "long_tail",
    "pack_images",
    "split_identities",
    "umeyama_similarity",
    "read_identity_names",
    "unpack_records",
    "ArrayDataset",
    "FaceSet",
    "FileListDataset",
    "IRHeader",
    "ImageFolderDataset",
    "LfwImageArchive",
    "ListFileDataset",
    "OmniglotSet",
    "OneShotRun",
    "RecordIODataset",
    "RecordIOError",
    "RecordIOReader",
    "RecordIOWriter",
    "UnsafePickleError",
    "VerificationPairs",
    "check_contiguous_labels",
    "decode_image",
    "decode_images",
    "encode_image",
    "load_lfw_gray",
    "load_omniglot",
    "load_omniglot_one_shot_runs",
    "load_orl",
    "load_verification_bin",
    "pack_record",
    "read_lfw_pairs",
    "read_list_file",
    "scan_image_folder",
    "unpack_record",
    "write_verification_bin",
]
