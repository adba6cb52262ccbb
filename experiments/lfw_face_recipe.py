"""A face-verification recipe trained only on the LFW development part, on a CPU.

    python experiments/lfw_face_recipe.py --config configs/lfw_dev_val.yaml     # validate
    python experiments/lfw_face_recipe.py --config configs/lfw_dev_final.yaml   # final + export

Data (``../shared/data/lfw_dev``, see its README): greyscale 96×96 face crops of the people of
LFW View 2 folds 1–5 (``lfw_gray96_dev.npz``) and of the people in no View 2 pair ("fold 0",
``lfw_gray96_extra.npz``), plus the 150×150 colour images of the View 2 folds 1–5 pairs.

Split (``recipe.train_folds`` / ``recipe.val_folds``): training uses the grey images of the
people of the training folds (fold 0 = the extra people); validation uses the pairs of the
validation folds of ``pairs_dev.txt`` and all-vs-all pairs of the grey images of the
validation people. LFW folds are person-disjoint; :func:`check_person_disjoint` asserts it for
every split this script builds, by name, before anything is trained.

Validation metrics (:func:`evaluate_validation`), every rate with its counts:

* ``pairs``: the validation folds' pairs; accuracy with the threshold chosen on the other
  fold(s) (LFW's protocol restricted to these folds), ROC AUC, EER;
* ``all_vs_all``: every pair of grey images of the validation people, TAR at FAR = 1e-4, 1e-3,
  1e-2 with ``k`` (the false accepts the threshold admits);
* ``templates``: each validation person with several images split into two templates
  (alternate images, embeddings averaged before normalising, as IJB-C templates), all-vs-all over
  templates;
* the same for the raw-pixel baseline (cosine of mean-centred central 64×64 pixels).

Pair images come from the grey set when both images are there (``recipe.val_images: grey``,
2,791 of the 3,000 dev pairs) or, for every pair, from the colour images converted to grey
and cropped to the grey set's framing (``colour``; :func:`colour_to_grey_crop`).

Alignment (``recipe.align``): every grey crop and colour photo is warped by its five MTCNN
landmarks onto ``GREY_FRAME_LANDMARKS``, the grey crops' mean frame (:func:`align_grey_crops`,
:func:`colour_photos_to_grey`); the export states that frame in its preprocessing spec.
``--evaluate MODEL [MODEL ...]`` validates trained models without training (several: one
ensemble of their normalised, concatenated embeddings, :func:`ensemble_embed`);
``--shift-average PX`` adds shifted copies of every image as test-time augmentation.

LBP fusion (``recipe.lbp_weight`` > 0, ``configs/lfw_dev_val_fused.yaml``): a multi-scale LBP
descriptor (local ternary patterns with ``recipe.lbp_ternary_threshold`` > 0) with PCA and
within-class whitening (:class:`partialfc.models.lbp.LbpWccnEmbedder`) is fitted on the training
crops and fused with the model's cosine (:func:`evaluate_fused`); the validation reports
``model_cnn``, ``lbp`` and ``model_fused``, a final run exports the fitted embedder as
``export/lbp_wccn.npz``.

Margin warm-up (the initialisation blow-up of margin losses: at initialisation θ_y ≈ 90° for every
sample and a full margin adds loss before the model has done anything wrong): zero margin for
``recipe.margin_warmup_epochs``, then a linear ramp to the configured margin over
``recipe.margin_ramp_epochs`` (the engine's margin schedule, given here in epochs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import yaml

GREY_SIZE = 96  # side of the grey crops, pixels
# The grey crops' framing inside the 150×150 colour images: a centred square of this side
# (pixels), found by maximising the mean normalised cross-correlation with the grey crops over
# 150 images present in both sets (:func:`estimate_colour_crop`; side 116 centred: NCC 0.79,
# vs 0.92 when every image gets its own best box: the grey crops are not all framed alike).
COLOUR_CROP_SIDE = 116
COLOUR_CROP_CENTRE = (75.0, 75.0)  # (x, y) in colour-image pixels
# Mean MTCNN landmarks (left eye, right eye, nose tip, left and right mouth corner; x, y in
# 96×96 pixels) over the 4,688 grey crops of the training folds 0-3 where MTCNN finds a face
# (21 of 4,709 without): the frame `recipe.align` maps every face onto. Per image the landmarks
# scatter by 3.8 px per coordinate around it (pose and framing; benchmarks/lfw_alignment.py).
GREY_FRAME_LANDMARKS = np.array(
    [[31.21, 38.43], [65.91, 37.55], [48.59, 58.16], [34.10, 76.21], [64.22, 75.62]]
)
GREY_DETECT_PAD = 24  # replicated border (px) around a tight grey crop so MTCNN sees a face
DEFAULT_FARS = (1e-4, 1e-3, 1e-2)


# ---------------------------------------------------------------------------- configuration


@dataclass
class RecipeConfig:
    """The ``recipe:`` section of a ``configs/lfw_dev_*.yaml`` file (everything else is the
    training engine's :class:`partialfc.train.config.Config`)."""

    data_root: str | None = None  # the lfw_dev folder; None = partialfc's shared data folder
    train_folds: list[int] = field(default_factory=lambda: [0, 1, 2, 3])  # 0 = extra people
    val_folds: list[int] = field(default_factory=lambda: [4, 5])  # [] = no validation
    val_images: str = "grey"  # "grey" (pairs with both grey crops) or "colour" (every pair)
    pair_sources: list[str] = field(default_factory=lambda: ["grey", "colour"])  # evaluated
    flip_test: bool = True  # embedding = normalise(f(x) + f(mirror(x)))
    margin_warmup_epochs: float = 0.0  # zero margin for this long
    margin_ramp_epochs: float = 0.0  # then linear ramp to the configured margin
    # leave out training people with fewer grey images: a person seen once per epoch gets its
    # class center updated once per epoch (1 = keep everyone)
    min_images_per_person: int = 1
    # also train on the colour image of every training-fold pair photo (colour_photos_to_grey):
    # for the validation preset 1,548 views, 57 of them photos the grey set lacks (people are
    # counted by distinct photos for min_images_per_person)
    train_colour_views: bool = False
    # align every image by its five MTCNN landmarks onto GREY_FRAME_LANDMARKS (the grey crops'
    # mean framing): grey crops are re-framed, colour photos cropped from the full 150×150
    align: bool = False
    # within-class whitening (WCCN) of the embeddings, learned on the training images and
    # folded into the backbone's last layer (partialfc.models.whitening); the ridge is in units
    # of the within-class covariance's mean eigenvalue
    whiten: bool = False
    whiten_regularization: float = 1.0
    # fuse the model with a hand-crafted descriptor learned on the same training images:
    # multi-scale uniform-LBP histograms, PCA to lbp_components dimensions and WCCN with ridge
    # lbp_regularization (partialfc.models.lbp); the evaluated score is the cosine of
    # [ê_model, √w·ê_lbp], i.e. (cos_model + w·cos_lbp) / (1 + w) with w = lbp_weight (0 = off)
    lbp_weight: float = 0.0
    lbp_components: int = 1600
    lbp_regularization: float = 0.3
    # grey levels: 0 = LBP codes, t > 0 = local ternary patterns (twice the dimensions)
    lbp_ternary_threshold: float = 0.0
    # with lbp_weight > 0: build the fused model as one network instead of network + lbp_wccn.npz
    # (partialfc.models.ltp_fused): iresnet_tiny and in-graph LTP histograms of the 96×96 crop
    # (sides 96 and 48, radii 1 and 2, 12-px cells every 6 px, each cell of the left half of
    # the grid reduced to 20 numbers by its own basis; lbp_components, lbp_regularization and
    # lbp_ternary_threshold as above), evaluated and exported as one ONNX taking the 96×96 crop
    ltp_in_graph: bool = False
    # with ltp_in_graph: also train the network on the cosine fused with the descriptor
    # (partialfc.tools.complementary, this weight; 0 = off), the descriptor of each training
    # image fitted without its person (complementary_groups groups of people, one left out)
    complementary_weight: float = 0.0
    complementary_groups: int = 4
    max_train_images: int = 0  # keep only the first N training images (0 = all; tests)
    export: bool = False  # export the trained backbone (ONNX + safetensors + spec)


def _recipe_from_dict(data: dict, source: str) -> RecipeConfig:
    names = {f.name for f in fields(RecipeConfig)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(
            f"{source}: unknown recipe key(s) {sorted(unknown)}; valid: {sorted(names)}"
        )
    recipe = RecipeConfig(**data)
    for value in [recipe.val_images, *recipe.pair_sources]:
        if value not in ("grey", "colour"):
            raise ValueError(f"{source}: pair image sources are 'grey' or 'colour', got {value!r}")
    if recipe.val_images not in recipe.pair_sources:
        raise ValueError(f"{source}: recipe.val_images must be one of recipe.pair_sources")
    bad = [f for f in recipe.train_folds + recipe.val_folds if f not in range(6)]
    if bad:
        raise ValueError(f"{source}: folds must be in 0..5 (0 = the extra people), got {bad}")
    if 0 in recipe.val_folds:
        raise ValueError(f"{source}: fold 0 has no pairs; it cannot be a validation fold")
    from partialfc.models.whitening import WithinClassWhitening

    try:  # checked now rather than after training
        WithinClassWhitening(recipe.whiten_regularization)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: recipe.whiten_regularization: {err}") from None
    try:
        lbp_weight = float(recipe.lbp_weight)
    except (TypeError, ValueError):
        lbp_weight = float("nan")
    if not np.isfinite(lbp_weight) or lbp_weight < 0:
        raise ValueError(
            f"{source}: recipe.lbp_weight must be finite and >= 0, got {recipe.lbp_weight}"
        )
    try:
        lbp_embedder(recipe)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{source}: recipe.lbp_components / lbp_regularization / lbp_ternary_threshold: {err}"
        ) from None
    if recipe.ltp_in_graph and recipe.lbp_ternary_threshold <= 0:
        raise ValueError(
            f"{source}: recipe.ltp_in_graph computes ternary codes: it needs "
            f"recipe.lbp_ternary_threshold > 0, got {recipe.lbp_ternary_threshold}"
        )
    if recipe.complementary_weight and not (recipe.ltp_in_graph and lbp_weight > 0):
        raise ValueError(
            f"{source}: recipe.complementary_weight trains against the in-graph descriptor: "
            "it needs recipe.ltp_in_graph and recipe.lbp_weight > 0"
        )
    if not np.isfinite(recipe.complementary_weight) or recipe.complementary_weight < 0:
        raise ValueError(
            f"{source}: recipe.complementary_weight must be finite and >= 0, "
            f"got {recipe.complementary_weight}"
        )
    if recipe.complementary_groups < 2:
        raise ValueError(
            f"{source}: recipe.complementary_groups must be >= 2 (one group is left out of each "
            f"fit), got {recipe.complementary_groups}"
        )
    return recipe


def lbp_embedder(recipe: RecipeConfig):
    """An unfitted :class:`partialfc.models.lbp.LbpWccnEmbedder` with the recipe's ``lbp_*`` keys
    (default grid, LBP or LTP codes)."""
    from partialfc.models.lbp import LbpGrid, LbpWccnEmbedder

    return LbpWccnEmbedder(
        LbpGrid(ternary_threshold=float(recipe.lbp_ternary_threshold)),
        num_components=recipe.lbp_components,
        regularization=recipe.lbp_regularization,
    )


def load_recipe(path: str | Path, overrides: list[str] = ()):
    """``(RecipeConfig, engine Config)`` from a YAML file with a ``recipe:`` section.

    Overrides are ``dotted.key=value`` (``recipe.val_images=colour``, ``train.epochs=2``).
    """
    from partialfc.train.config import (
        apply_overrides,
        config_from_dict,
        read_config_file,
        validate,
    )

    data = read_config_file(path)
    recipe_data = dict(data.pop("recipe", None) or {})
    engine_overrides = []
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.strip().startswith("recipe."):
            recipe_data[key.strip()[len("recipe.") :]] = yaml.safe_load(raw)
        else:
            engine_overrides.append(item)
    apply_overrides(data, engine_overrides)
    return _recipe_from_dict(recipe_data, str(path)), validate(config_from_dict(data, str(path)))


def load_validation_recipe(path: str | Path, overrides: list[str] = ()):
    """:func:`load_recipe` for tools that score on the validation folds: raises ValueError
    when the preset has none, and sets the preset's thread count (face detection and embedding
    run with it; torch's default of one thread per core oversubscribes a shared CPU)."""
    from partialfc.train.threads import apply_num_threads

    recipe, cfg = load_recipe(path, overrides)
    if not recipe.val_folds:
        raise ValueError(f"{path}: needs validation folds (recipe.val_folds)")
    apply_num_threads(cfg.train.num_threads, cfg.data.num_workers)
    return recipe, cfg


# ---------------------------------------------------------------------------- data


@dataclass
class LfwSplit:
    """Training images and the validation material of one split (all uint8 grey 96×96)."""

    train_images: np.ndarray  # (N, 96, 96)
    train_labels: np.ndarray  # (N,) int64, contiguous 0..K-1
    train_identities: list[str]  # K names
    val_images: np.ndarray  # (M, 96, 96): every grey image of the validation people
    val_labels: np.ndarray  # (M,) int64
    val_identities: list[str]
    val_image_names: list[str]  # (M,) LFW image ids ``<Name>_<NNNN>``
    pairs: object | None  # VerificationPairs of the validation folds (None: no validation)

    @property
    def num_classes(self) -> int:
        return len(self.train_identities)


def lfw_root(recipe: RecipeConfig) -> Path:
    from partialfc.data.loaders import shared_data_root

    return Path(recipe.data_root) if recipe.data_root else shared_data_root() / "lfw_dev"


def load_lfw_names(recipe: RecipeConfig) -> list[str]:
    """Names of every person of the grey development set (folds 1-5)."""
    from partialfc.data.loaders import load_lfw_gray

    return load_lfw_gray(lfw_root(recipe), part="dev").identity_names


def _select_people(faces, folds: list[int]):
    """Images, contiguous labels, names and image ids of the people of ``folds`` in a FaceSet."""
    person_fold = np.asarray(faces.identity_fold)
    keep_person = np.isin(person_fold, folds)
    keep = keep_person[faces.labels]
    old = np.flatnonzero(keep_person)
    remap = np.full(len(faces.identity_names), -1, dtype=np.int64)
    remap[old] = np.arange(old.size)
    image_names = [n for n, k in zip(faces.image_names, keep, strict=True) if k]
    names = [faces.identity_names[i] for i in old]
    return faces.images[keep], remap[faces.labels[keep]], names, image_names


def colour_training_views(recipe: RecipeConfig, names: list[str]):
    """``(images, labels, image ids)`` of the colour pair images of the people ``names``
    (labels index ``names``), converted by :func:`colour_photos_to_grey`, in archive order."""
    from partialfc.data.lfw import LfwImageArchive

    archive = LfwImageArchive(lfw_root(recipe) / "lfw_color150_dev.zip")
    label_of = {name: i for i, name in enumerate(names)}
    photos, labels, ids = [], [], []
    for image_id in archive.image_ids():
        person, number = image_id.rsplit("_", 1)
        if person in label_of:
            photos.append(archive.read(person, int(number)))
            labels.append(label_of[person])
            ids.append(image_id)
    images = colour_photos_to_grey(photos, recipe.align)
    return images, np.asarray(labels, np.int64), ids


def build_split(recipe: RecipeConfig) -> LfwSplit:
    """Training set of ``recipe.train_folds`` and validation material of ``recipe.val_folds``.

    Raises ValueError when a person would be on both sides (:func:`check_person_disjoint`).
    """
    from partialfc.data.lfw import read_lfw_pairs
    from partialfc.data.loaders import load_lfw_gray

    root = lfw_root(recipe)
    dev = load_lfw_gray(root, part="dev")
    parts = [_select_people(dev, [f for f in recipe.train_folds if f != 0])]
    if 0 in recipe.train_folds:
        parts.append(_select_people(load_lfw_gray(root, part="extra"), [0]))
    images, labels, names, image_ids, offset = [], [], [], [], 0
    for part_images, part_labels, part_names, part_ids in parts:
        images.append(part_images)
        labels.append(part_labels + offset)
        names += part_names
        image_ids += part_ids
        offset += len(part_names)
    if recipe.train_colour_views:
        part_images, part_labels, part_ids = colour_training_views(recipe, names)
        images.append(part_images)
        labels.append(part_labels)
        image_ids += part_ids
    train_images, train_labels = np.concatenate(images), np.concatenate(labels)
    grey_rows = np.arange(len(train_images)) < sum(len(p[0]) for p in parts)
    if recipe.min_images_per_person > 1:
        photos = np.bincount(
            np.unique(
                np.stack([train_labels, np.unique(image_ids, return_inverse=True)[1]], 1), axis=0
            )[:, 0],
            minlength=len(names),
        )  # distinct photos per person (a photo in both sets counts once)
        keep = photos[train_labels] >= recipe.min_images_per_person
        used, train_labels = np.unique(train_labels[keep], return_inverse=True)
        train_images, names = train_images[keep], [names[i] for i in used]
        grey_rows = grey_rows[keep]
    if recipe.max_train_images:
        train_images = train_images[: recipe.max_train_images]
        grey_rows = grey_rows[: recipe.max_train_images]
        used, train_labels = np.unique(train_labels[: recipe.max_train_images], return_inverse=True)
        names = [names[i] for i in used]
    if recipe.align:  # the colour views were aligned from their photos already
        train_images[grey_rows] = align_grey_crops(train_images[grey_rows])[0]
    val_images, val_labels, val_names, val_image_names = _select_people(dev, recipe.val_folds)
    if recipe.align:
        val_images = align_grey_crops(val_images)[0]
    pairs = None
    if recipe.val_folds:
        all_pairs = read_lfw_pairs(root / "pairs_dev.txt")
        pairs = subset_pairs(all_pairs, np.isin(all_pairs.fold, recipe.val_folds))
    split = LfwSplit(
        train_images, train_labels, names, val_images, val_labels, val_names, val_image_names, pairs
    )
    check_person_disjoint(split)
    return split


def subset_pairs(pairs, keep: np.ndarray):
    """The pairs where ``keep`` is true (a new VerificationPairs)."""
    from partialfc.data.lfw import VerificationPairs

    idx = np.flatnonzero(keep)
    return VerificationPairs(
        name1=[pairs.name1[i] for i in idx],
        number1=pairs.number1[idx],
        name2=[pairs.name2[i] for i in idx],
        number2=pairs.number2[idx],
        issame=pairs.issame[idx],
        fold=pairs.fold[idx],
    )


def check_person_disjoint(split: LfwSplit) -> None:
    """Raise ValueError if any training identity appears among the validation people or in a
    validation pair (names compared exactly)."""
    train = set(split.train_identities)
    val = set(split.val_identities)
    if split.pairs is not None:
        val |= set(split.pairs.name1) | set(split.pairs.name2)
    shared = sorted(train & val)
    if shared:
        raise ValueError(
            f"training and validation share {len(shared)} people (e.g. {shared[:3]}); "
            "the validation split must be person-disjoint"
        )


def resize_to(images: np.ndarray, size: int) -> np.ndarray:
    """Grey crops at the model's input size (area filter when shrinking)."""
    from partialfc.eval import resize_images

    return resize_images(images, (size, size))


def colour_to_grey_crop(
    rgb: np.ndarray,
    side: float = COLOUR_CROP_SIDE,
    centre: tuple[float, float] = COLOUR_CROP_CENTRE,
    size: int = GREY_SIZE,
) -> np.ndarray:
    """A 150×150 RGB LFW pair image → a grey ``size``×``size`` crop framed like the grey set.

    BT.601 luma, then the square of ``side`` pixels centred at ``centre`` resampled to
    ``size`` (area filter).
    """
    import cv2

    grey = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    x0, y0 = centre[0] - side / 2, centre[1] - side / 2
    to_crop = np.array([[side / size, 0, x0], [0, side / size, y0]], dtype=np.float32)
    flags = cv2.INTER_AREA | cv2.WARP_INVERSE_MAP
    return cv2.warpAffine(grey, to_crop, (size, size), flags=flags)


def face_landmarks(images, pad: int = 0, detector=None) -> tuple[np.ndarray, np.ndarray]:
    """``(landmarks (N, 5, 2), found (N,) bool)``: the five MTCNN landmarks of the largest face
    in each uint8 grey or RGB image, detected with a replicated border of ``pad`` pixels (a
    tight crop has no room around the face otherwise); zeros where no face is found."""
    import cv2

    from partialfc.detect import largest_face, load_detector

    detector = detector or load_detector("mtcnn", min_face_size=40)
    landmarks = np.zeros((len(images), 5, 2), np.float32)
    found = np.zeros(len(images), bool)
    for i, image in enumerate(images):
        if pad:
            image = cv2.copyMakeBorder(image, pad, pad, pad, pad, cv2.BORDER_REPLICATE)
        face = largest_face(detector.detect(image))
        if face is not None:
            landmarks[i], found[i] = face.landmarks - pad, True
    return landmarks, found


def align_to_grey_frame(image: np.ndarray, landmarks: np.ndarray, size: int = GREY_SIZE):
    """A grey (or RGB → BT.601 luma) image warped so that its landmarks land on
    ``GREY_FRAME_LANDMARKS`` (similarity, least squares), ``size``×``size`` grey, edge pixels
    repeated where the photo ends."""
    import cv2

    from partialfc.data.align import align_face

    if image.ndim == 3:
        image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    template = GREY_FRAME_LANDMARKS * (size / GREY_SIZE)
    return align_face(image, landmarks, size=size, template=template, border="replicate")


def align_grey_crops(images: np.ndarray) -> tuple[np.ndarray, int]:
    """Grey crops re-framed onto ``GREY_FRAME_LANDMARKS``; a crop without a detected face is
    kept as it is (it is in the grey framing already). Returns ``(images, faces found)``."""
    landmarks, found = face_landmarks(images, pad=GREY_DETECT_PAD)
    out = images.copy()
    for i in np.flatnonzero(found):
        out[i] = align_to_grey_frame(images[i], landmarks[i])
    return out, int(found.sum())


def colour_photos_to_grey(photos: list[np.ndarray], align: bool) -> np.ndarray:
    """150×150 RGB photos → 96×96 grey: landmark-aligned onto ``GREY_FRAME_LANDMARKS``
    (``align``; a photo without a detected face falls back to the centred crop) or the centred
    crop of :func:`colour_to_grey_crop`."""
    if not photos:
        return np.zeros((0, GREY_SIZE, GREY_SIZE), np.uint8)
    if not align:
        return np.stack([colour_to_grey_crop(p) for p in photos])
    landmarks, found = face_landmarks(photos)
    return np.stack(
        [
            align_to_grey_frame(p, lm) if ok else colour_to_grey_crop(p)
            for p, lm, ok in zip(photos, landmarks, found, strict=True)
        ]
    )


def normalised_cross_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of the pixels of two same-size images (1 = identical up to
    brightness and contrast)."""
    a, b = a.astype(np.float64) - a.mean(), b.astype(np.float64) - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def estimate_colour_crop(colour_grey: list[np.ndarray], grey: list[np.ndarray], sides, shifts):
    """``(mean NCC, side, dx, dy)`` of the best centred-square framing, by grid search: the
    colour images (already grey) cropped at each candidate box vs the grey crops."""
    ncc = normalised_cross_correlation
    best = (-2.0, 0, 0, 0)
    for side in sides:
        for dx in shifts:
            for dy in shifts:
                box = (float(side), (75.0 + dx, 75.0 + dy))
                crops = [colour_to_grey_crop(np.dstack([c] * 3), *box) for c in colour_grey]
                score = float(np.mean([ncc(c, g) for c, g in zip(crops, grey, strict=True)]))
                best = max(best, (score, side, dx, dy))
    return best


@dataclass
class PairImages:
    """Where the images of each pair are: rows of ``images`` (the validation people's grey
    crops for the ``grey`` source, the converted colour images for ``colour``)."""

    images: np.ndarray  # (U, 96, 96) uint8 grey
    first: np.ndarray  # (P,) row of each kept pair's first image
    second: np.ndarray
    keep: np.ndarray  # (all pairs,) bool: pairs this source can build


def pair_images(recipe: RecipeConfig, split: LfwSplit, source: str) -> PairImages:
    """Grey images for the validation pairs: ``"grey"`` (the pairs whose two images are in the
    grey set; rows of ``split.val_images``) or ``"colour"`` (every pair, through
    :func:`colour_photos_to_grey`: centred crop, or landmark-aligned with ``recipe.align``)."""
    from partialfc.data.lfw import LfwImageArchive

    pairs = split.pairs
    keys1 = [f"{n}_{int(k):04d}" for n, k in zip(pairs.name1, pairs.number1, strict=True)]
    keys2 = [f"{n}_{int(k):04d}" for n, k in zip(pairs.name2, pairs.number2, strict=True)]
    if source == "grey":
        row = {name: i for i, name in enumerate(split.val_image_names)}
        images = split.val_images
    elif source == "colour":
        archive = LfwImageArchive(lfw_root(recipe) / "lfw_color150_dev.zip")
        wanted = sorted(set(keys1) | set(keys2))
        row = {k: i for i, k in enumerate(wanted)}
        photos = [archive.read(*k.rsplit("_", 1)) for k in wanted]
        images = colour_photos_to_grey(photos, recipe.align)
    else:
        raise ValueError(f"pair image source must be 'grey' or 'colour', got {source!r}")
    keep = np.array([a in row and b in row for a, b in zip(keys1, keys2, strict=True)])
    first = np.array([row[k] for k, ok in zip(keys1, keep, strict=True) if ok], dtype=np.int64)
    second = np.array([row[k] for k, ok in zip(keys2, keep, strict=True) if ok], dtype=np.int64)
    return PairImages(images, first, second, keep)


# ---------------------------------------------------------------------------- evaluation


def _upper_pairs(emb: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Genuine and impostor cosine scores of every unordered pair of rows."""
    scores = emb @ emb.T
    i, j = np.triu_indices(len(emb), k=1)
    same = labels[i] == labels[j]
    s = scores[i, j].astype(np.float64)
    return s[same], s[~same]


def two_templates_per_person(labels: np.ndarray) -> np.ndarray:
    """Template id per image: a person's images alternate between two templates (``2·label``
    and ``2·label + 1``) when the person has several images; a single image is one template."""
    template = np.empty(len(labels), dtype=np.int64)
    for person in np.unique(labels):
        rows = np.flatnonzero(labels == person)
        template[rows] = 2 * person + (np.arange(rows.size) % 2)
    return template


def _report_dict(report) -> dict:
    out = {
        "n_genuine": report.n_genuine,
        "n_impostor": report.n_impostor,
        "auc": report.auc,
        "eer": report.eer.eer,
    }
    for t in report.tar_at_far:
        out[f"tar@far={t.target_far:g}"] = {
            "tar": t.tar.rate,
            "true_accepts": t.tar.k,
            "n_genuine": t.tar.n,
            "k_false_accepts": t.far.k,
            "n_impostor": t.far.n,
            "threshold": t.threshold,
        }
    if report.kfold_accuracy is not None:
        acc = report.kfold_accuracy
        out["accuracy"] = {
            "mean": acc.mean,
            "std": acc.std,
            "per_fold": [a.rate for a in acc.fold_accuracy],
            # each fold at its own best threshold: the gap to per_fold is the carried threshold's
            "per_fold_at_own_threshold": [a.rate for a in acc.fold_best_accuracy],
            "n_pairs": acc.n_pairs,
        }
    return out


@dataclass
class RawEmbeddings:
    """Unnormalised embeddings of the validation images, plain and of the mirrored images."""

    val: np.ndarray  # (M, d) of split.val_images
    colour: np.ndarray  # (U, d) of the colour pair images
    val_flipped: np.ndarray | None = None
    colour_flipped: np.ndarray | None = None

    def combined(self, flip: bool) -> tuple[np.ndarray, np.ndarray]:
        """``f(x)``, or ``f(x) + f(mirror(x))`` for the flip test (summed before normalising)."""
        if not flip:
            return self.val, self.colour
        return self.val + self.val_flipped, self.colour + self.colour_flipped


def embed_raw(embed, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
    from partialfc.eval import embed_images

    return embed_images(embed, images, flip=False, batch_size=batch_size, normalize=False)


def evaluate_embeddings(
    val_raw: np.ndarray, colour_raw: np.ndarray, split: LfwSplit, pair_sets: dict
) -> dict:
    """All validation metrics from raw embeddings of the validation and colour pair images."""
    from partialfc.eval import l2_normalize, pool_templates, verification_report

    out: dict = {}
    for source, pi in pair_sets.items():
        emb = l2_normalize(val_raw if source == "grey" else colour_raw)
        scores = np.sum(emb[pi.first] * emb[pi.second], axis=1)
        report = verification_report(
            f"pairs_{source}",
            scores=scores,
            is_genuine=split.pairs.issame[pi.keep],
            folds=split.pairs.fold[pi.keep],
            fars=(1e-2, 1e-1),
        )
        out[f"pairs_{source}"] = _report_dict(report)
    genuine, impostor = _upper_pairs(l2_normalize(val_raw), split.val_labels)
    out["all_vs_all"] = _report_dict(
        verification_report("all_vs_all", genuine, impostor, fars=DEFAULT_FARS)
    )
    template_ids = two_templates_per_person(split.val_labels)
    ids, templates = pool_templates(val_raw, template_ids)
    genuine, impostor = _upper_pairs(templates, ids // 2)
    out["templates"] = _report_dict(
        verification_report("templates", genuine, impostor, fars=DEFAULT_FARS)
    )
    return out


def raw_pixel_embed(reference: np.ndarray, size: int = 64):
    """Baseline embed function: central ``size``×``size`` pixels minus their mean over
    ``reference`` images (cosine of mean-centred pixels)."""
    lo = (reference.shape[1] - size) // 2
    mean = reference[:, lo : lo + size, lo : lo + size].reshape(len(reference), -1).mean(0)

    def embed(images: np.ndarray) -> np.ndarray:
        x = images[:, lo : lo + size, lo : lo + size].reshape(len(images), -1)
        return x.astype(np.float32) - mean

    return embed


def embed_flip_test(embed_fn, images: np.ndarray, input_size: int, flip: bool) -> np.ndarray:
    """Raw embeddings of ``images`` resized to ``input_size``: ``f(x)``, or ``f(x) + f(mirror(x))``
    with ``flip`` (the recipe's flip test, summed before any normalisation)."""
    from partialfc.eval import flip_horizontal

    x = resize_to(images, input_size)
    raw = embed_raw(embed_fn, x)
    if flip:
        raw = raw + embed_raw(embed_fn, np.ascontiguousarray(flip_horizontal(x)))
    return raw


def fit_whitening(embed_fn, split: LfwSplit, recipe: RecipeConfig, input_size: int):
    """:class:`partialfc.models.whitening.WithinClassWhitening` of ``embed_fn``'s embeddings of
    the training images (``f(x) + f(mirror(x))`` with the flip test, as in evaluation) and
    their identities, with ``recipe.whiten_regularization``."""
    from partialfc.models.whitening import WithinClassWhitening

    raw = embed_flip_test(embed_fn, split.train_images, input_size, recipe.flip_test)
    return WithinClassWhitening(recipe.whiten_regularization).fit(raw, split.train_labels)


def evaluate_validation(
    embed_fn, split: LfwSplit, recipe: RecipeConfig, input_size: int, baseline: bool = True
) -> dict:
    """Model metrics with and without the flip test (and the raw-pixel baseline), for both
    pair image sources."""
    from partialfc.eval import flip_horizontal

    pair_sets = {s: pair_images(recipe, split, s) for s in recipe.pair_sources}
    colour_images = pair_sets["colour"].images if "colour" in pair_sets else split.val_images[:1]

    def model_embed(images):
        return embed_fn(resize_to(images, input_size))

    raw = RawEmbeddings(
        val=embed_raw(model_embed, split.val_images),
        colour=embed_raw(model_embed, colour_images),
        val_flipped=embed_raw(model_embed, np.ascontiguousarray(flip_horizontal(split.val_images))),
        colour_flipped=embed_raw(model_embed, np.ascontiguousarray(flip_horizontal(colour_images))),
    )
    result = {
        "model": evaluate_embeddings(*raw.combined(recipe.flip_test), split, pair_sets),
        "model_no_flip": evaluate_embeddings(*raw.combined(False), split, pair_sets),
        "pair_image_source": recipe.val_images,
    }
    if baseline:
        pixels = raw_pixel_embed(split.val_images)
        result["raw_pixels"] = evaluate_embeddings(
            embed_raw(pixels, split.val_images), embed_raw(pixels, colour_images), split, pair_sets
        )
    return result


def fit_lbp(split: LfwSplit, recipe: RecipeConfig):
    """:class:`partialfc.models.lbp.LbpWccnEmbedder` fitted on the split's training images (the
    96×96 crops, aligned as the recipe says) with the recipe's ``lbp_*`` settings."""
    return lbp_embedder(recipe).fit(split.train_images, split.train_labels)


def evaluate_fused(embed_fn, input_size: int, lbp, split: LfwSplit, recipe: RecipeConfig) -> dict:
    """Validation metrics of the model (``embed_fn`` on images resized to ``input_size``, with
    the recipe's flip test), of the ``lbp`` embedder alone, and of the two fused with weight
    ``recipe.lbp_weight`` (the cosine of ``[ê_model, √w·ê_lbp]``): keys ``model_cnn``, ``lbp``
    and ``model_fused``."""
    from partialfc.eval import l2_normalize
    from partialfc.models.lbp import fuse_embeddings

    pair_sets = {s: pair_images(recipe, split, s) for s in recipe.pair_sources}
    colour_images = pair_sets["colour"].images if "colour" in pair_sets else split.val_images[:1]
    model = [
        l2_normalize(embed_flip_test(embed_fn, images, input_size, recipe.flip_test))
        for images in (split.val_images, colour_images)
    ]
    # unit parts: the templates pool unit vectors of each part (as fuse_embeddings joins them)
    descriptor = [l2_normalize(lbp(split.val_images)), l2_normalize(lbp(colour_images))]
    fused = [
        fuse_embeddings(m, d, recipe.lbp_weight) for m, d in zip(model, descriptor, strict=True)
    ]
    return {
        "model_cnn": evaluate_embeddings(*model, split, pair_sets),
        "lbp": evaluate_embeddings(*descriptor, split, pair_sets),
        "model_fused": evaluate_embeddings(*fused, split, pair_sets),
    }


def normalised_faces(images: np.ndarray):
    """``(N, 1, H, W)`` float32 tensor of uint8 grey crops, as the networks take them:
    ``(x / 255 − 0.5) / 0.5``."""
    import torch

    return torch.from_numpy((np.asarray(images, np.float32) / 255.0 - 0.5) / 0.5).unsqueeze(1)


def ltp_fused(backbone, recipe: RecipeConfig):
    """An unfitted :class:`partialfc.models.ltp_fused.LtpFusedEmbedding` of ``backbone`` and
    :class:`partialfc.models.ltp_layer.LtpHistograms` of the 96×96 crops, with the recipe's
    ``lbp_*`` settings and flip test."""
    from partialfc.models.ltp_fused import LtpFusedEmbedding
    from partialfc.models.ltp_layer import LtpHistograms

    histograms = LtpHistograms(
        GREY_SIZE, (GREY_SIZE, GREY_SIZE // 2), threshold_grey=recipe.lbp_ternary_threshold
    )
    return LtpFusedEmbedding(
        backbone, histograms, recipe.lbp_components, recipe.lbp_weight, recipe.flip_test
    ).eval()


def fit_ltp_fused(backbone, split: LfwSplit, recipe: RecipeConfig):
    """:func:`ltp_fused` of ``backbone`` (already whitened when the recipe whitens), the
    descriptor fitted on the split's training images."""
    import copy

    fused = ltp_fused(copy.deepcopy(backbone).cpu().float().eval(), recipe)
    return fused.fit_texture(
        normalised_faces(split.train_images), split.train_labels, recipe.lbp_regularization
    )


def out_of_fold_descriptors(split: LfwSplit, recipe: RecipeConfig, seed: int = 0) -> np.ndarray:
    """``(N, lbp_components)``: the in-graph descriptor (:meth:`LtpFusedEmbedding.texture`) of
    every training image, fitted as :func:`fit_ltp_fused` fits it but without the image's
    person (:func:`partialfc.tools.complementary.out_of_fold_embeddings`,
    ``recipe.complementary_groups`` groups of people dealt with ``seed``)."""
    import torch

    from partialfc.models.iresnet import iresnet_tiny
    from partialfc.tools.complementary import out_of_fold_embeddings

    labels = split.train_labels
    if recipe.complementary_groups > split.num_classes:
        raise ValueError(
            f"recipe.complementary_groups ({recipe.complementary_groups}) exceeds the "
            f"{split.num_classes} training people: each group needs one"
        )
    faces = normalised_faces(split.train_images)

    def fit_and_embed(train_rows, embed_rows):
        descriptor = ltp_fused(iresnet_tiny(input_size=64, in_channels=1), recipe)
        descriptor.fit_texture(faces[train_rows], labels[train_rows], recipe.lbp_regularization)
        with torch.no_grad():
            rows = torch.from_numpy(embed_rows)
            return torch.cat([descriptor.texture(faces[r]) for r in rows.split(256)]).numpy()

    return out_of_fold_embeddings(fit_and_embed, labels, recipe.complementary_groups, seed)


def evaluate_ltp_fused(fused, split: LfwSplit, recipe: RecipeConfig) -> dict:
    """Validation metrics of the one-network fused model (``model_fused``: exactly what is
    exported, on the 96×96 crops) and of its texture part alone (``lbp``)."""
    import torch

    from partialfc.backbone.embedding import embed_array

    class Texture(torch.nn.Module):
        def forward(self, images):
            return fused.texture(images)

    pair_sets = {s: pair_images(recipe, split, s) for s in recipe.pair_sources}
    colour_images = pair_sets["colour"].images if "colour" in pair_sets else split.val_images[:1]
    out = {}
    for name, module in (("lbp", Texture()), ("model_fused", fused)):
        val, col = (
            embed_array(module, images, 128) for images in (split.val_images, colour_images)
        )
        out[name] = evaluate_embeddings(val, col, split, pair_sets)
    return out


def ltp_fused_spec(fused):
    """The export's :class:`PreprocessingSpec`: grey 96×96 crops in the grey crops' frame,
    rebuilt by ``build_model("iresnet_tiny_ltp", ...)`` (``iresnet_tiny_ltp_noflip`` when the
    network's flip test is off)."""
    from partialfc.deploy import PreprocessingSpec

    return PreprocessingSpec(
        model_name="iresnet_tiny_ltp" if fused.flip_test else "iresnet_tiny_ltp_noflip",
        model_kwargs={
            "embedding_dim": fused.embedding_dim,
            "input_size": GREY_SIZE,
            "in_channels": 1,
        },
        embedding_dim=fused.embedding_dim,
        input_size=(GREY_SIZE, GREY_SIZE),
        in_channels=1,
        colour_order="GREY",
        mean=(0.5,),
        std=(0.5,),
        alignment_landmarks=GREY_FRAME_LANDMARKS,
    )


def headline(metrics: dict, source: str) -> str:
    pairs = metrics[f"pairs_{source}"]
    ava = metrics["all_vs_all"]["tar@far=0.001"]
    tmpl = metrics["templates"]["tar@far=0.001"]
    return (
        f"acc {100 * pairs['accuracy']['mean']:.2f}% ({pairs['accuracy']['n_pairs']} pairs), "
        f"AUC {pairs['auc']:.4f}; all-vs-all TAR@FAR=1e-3 {100 * ava['tar']:.2f}% "
        f"(k={ava['k_false_accepts']} of {ava['n_impostor']}, {ava['n_genuine']} genuine); "
        f"templates {100 * tmpl['tar']:.2f}%"
    )


# ---------------------------------------------------------------------------- driver


def build_trainer(
    recipe: RecipeConfig,
    cfg,
    split: LfwSplit,
    run_dir: Path | None = None,
    distillation: Distillation | None = None,
):
    """A :class:`partialfc.train.engine.Trainer` on the split's training images.

    The margin warm-up given in epochs (``recipe.margin_warmup_epochs`` / ``_ramp_epochs``) is
    turned into the engine's ``head.margin.warmup_steps`` / ``ramp_steps``. With
    ``distillation``, the student also learns the teachers' pairwise cosines and averaged
    class probabilities on the same training images
    (:class:`partialfc.tools.distillation.EnsembleDistillationTerm`). With
    ``recipe.complementary_weight``, the network also learns the margin loss of its cosine fused
    with the out-of-fold in-graph descriptor (:func:`out_of_fold_descriptors`,
    :class:`partialfc.tools.complementary.ComplementaryMarginTerm`).
    """
    from partialfc.data.datasets import ArrayDataset
    from partialfc.train.engine import Trainer, steps_per_epoch

    images = resize_to(split.train_images, cfg.data.input_size)
    train_set = ArrayDataset(images, split.train_labels)
    steps = steps_per_epoch(len(train_set), cfg.data.batch_size, cfg.data.drop_last)  # one rank
    cfg.head.margin.warmup_steps = round(recipe.margin_warmup_epochs * steps)
    cfg.head.margin.ramp_steps = round(recipe.margin_ramp_epochs * steps)
    extra_losses = []
    if distillation is not None:
        extra_losses.append(distillation.term(images, split.num_classes, split.train_images))
    if recipe.complementary_weight > 0:
        from partialfc.tools.complementary import ComplementaryMarginTerm

        extra_losses.append(
            ComplementaryMarginTerm(
                out_of_fold_descriptors(split, recipe, cfg.train.seed),
                split.train_labels,
                split.num_classes,
                recipe.lbp_weight,
                recipe.complementary_weight,
            )
        )
    return Trainer(cfg, train_set=train_set, run_dir=run_dir, extra_losses=extra_losses)


@dataclass
class Distillation:
    """Teachers (run folders or checkpoints trained on the same split and classes) and the
    weights of :class:`partialfc.tools.distillation.EnsembleDistillationTerm`.

    With ``descriptor`` (an ``lbp_wccn.npz`` fitted on the same training images, e.g. the one
    a fused run writes into its folder), the relation targets are those of the fused teacher:
    each network teacher's unit embedding joined with the descriptor's as
    :func:`partialfc.models.lbp.fuse_embeddings` joins them (weight ``descriptor_weight``), so
    the student learns the pairwise cosines ``(cos_net + w·cos_lbp) / (1 + w)`` that the fused
    model scores with. The class probabilities (KL term) stay the networks'."""

    teachers: list[str]
    relation_weight: float = 100.0
    kl_weight: float = 1.0
    descriptor: str | None = None
    descriptor_weight: float = 3.0

    def term(self, images: np.ndarray, num_classes: int, crops: np.ndarray | None = None):
        """The loss term for the training ``images`` (at the student's input size, dataset
        order); ``crops``: the same images as the recipe's 96×96 grey crops (the descriptor's
        input), needed with ``descriptor``."""
        import torch

        from partialfc.tools.distillation import EnsembleDistillationTerm, ensemble_targets

        units, cosines, _ = ensemble_targets(self.teachers, images)
        if cosines[0].shape[1] != num_classes:
            raise ValueError(
                f"teachers {self.teachers} have {cosines[0].shape[1]} classes, the student's "
                f"split {num_classes}: train them on the same recipe folds"
            )
        if self.descriptor is not None:
            from partialfc.models.lbp import LbpWccnEmbedder, fuse_embeddings

            if crops is None or len(crops) != len(images):
                raise ValueError("a descriptor teacher needs the training crops, one per image")
            lbp = LbpWccnEmbedder.load(self.descriptor)(crops)
            units = [
                torch.from_numpy(fuse_embeddings(u.numpy(), lbp, self.descriptor_weight))
                for u in units
            ]
        return EnsembleDistillationTerm(units, cosines, self.relation_weight, self.kl_weight)


def _atomic_write_json(path: Path, data: dict) -> None:
    from partialfc.atomic import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


def run(recipe: RecipeConfig, cfg, distillation: Distillation | None = None) -> dict:
    """Train (with ``distillation``: as the student of its teachers), validate (when there are
    validation folds), export (when asked); returns and writes ``<run>/recipe_result.json``."""
    t0 = time.perf_counter()
    split = build_split(recipe)
    split_seconds = time.perf_counter() - t0  # reading, converting and aligning the images
    print(
        f"train: {len(split.train_images)} images of {split.num_classes} people "
        f"(folds {recipe.train_folds}); validation people: {len(split.val_identities)} "
        f"({len(split.val_images)} images), pairs: {len(split.pairs) if split.pairs else 0}",
        flush=True,
    )
    if recipe.lbp_weight > 0 and recipe.lbp_components >= len(split.train_images):
        raise ValueError(  # checked before training, not after it
            f"recipe.lbp_components ({recipe.lbp_components}) must be below the number of "
            f"training images ({len(split.train_images)})"
        )
    if recipe.ltp_in_graph and recipe.lbp_weight > 0 and recipe.export:
        network = (cfg.model.name, cfg.model.embedding_dim, cfg.data.input_size)
        if network != ("iresnet_tiny", 256, 64):  # what build_model("iresnet_tiny_ltp") rebuilds
            raise ValueError(
                "recipe.ltp_in_graph exports iresnet_tiny_ltp: model.name iresnet_tiny, "
                f"model.embedding_dim 256, data.input_size 64; got {network}"
            )
    trainer = build_trainer(recipe, cfg, split, distillation=distillation)
    t_train = time.perf_counter()
    fit = trainer.fit()
    train_seconds = time.perf_counter() - t_train
    result = {
        "recipe": asdict(recipe),
        "train_images": int(len(split.train_images)),
        "train_identities": split.num_classes,
        "steps": fit.steps,
        "epochs": fit.epochs_completed,
        "split_seconds": split_seconds,
        "train_seconds": train_seconds,
        "final_loss": float(np.nanmean(fit.losses[-20:])) if fit.losses else None,
        "checkpoint": str(fit.last_checkpoint),
    }
    if distillation is not None:
        result["distillation"] = asdict(distillation)
    from partialfc.backbone.embedding import embed_array

    backbone = trainer.backbone
    if recipe.whiten:
        from partialfc.models.common import fold_linear_map

        whitening = fit_whitening(trainer.embed_fn(), split, recipe, cfg.data.input_size)
        backbone = fold_linear_map(trainer.backbone, whitening.projection)
        result["whitening"] = {
            "regularization": recipe.whiten_regularization,
            "fitted_on_images": int(len(split.train_images)),
        }
    lbp = one_network = None
    if recipe.lbp_weight > 0 and recipe.ltp_in_graph:
        t_lbp = time.perf_counter()
        one_network = fit_ltp_fused(backbone, split, recipe)
        result["lbp"] = {"in_graph": True, "fit_seconds": time.perf_counter() - t_lbp}
        result["lbp"]["weight"] = recipe.lbp_weight
    elif recipe.lbp_weight > 0:
        t_lbp = time.perf_counter()
        lbp = fit_lbp(split, recipe)
        result["lbp"] = {
            "path": str(lbp.save(trainer.run_dir / "lbp_wccn.npz")),
            "fit_seconds": time.perf_counter() - t_lbp,
            "weight": recipe.lbp_weight,
        }
    if recipe.val_folds:

        def embed_fn(images):  # what is exported: the whitened backbone when whitening
            return embed_array(backbone, images, 256, trainer.ctx.device, trainer.autocast_dtype)

        metrics = evaluate_validation(embed_fn, split, recipe, cfg.data.input_size)
        if recipe.whiten:
            metrics["model_unwhitened"] = evaluate_validation(
                trainer.embed_fn(), split, recipe, cfg.data.input_size, baseline=False
            )["model"]
        names = ("model", "model_no_flip", "raw_pixels") + ("model_unwhitened",) * recipe.whiten
        if lbp is not None:
            metrics.update(evaluate_fused(embed_fn, cfg.data.input_size, lbp, split, recipe))
            names += ("lbp", "model_fused")
        if one_network is not None:
            metrics.update(evaluate_ltp_fused(one_network, split, recipe))
            names += ("lbp", "model_fused")
        result["validation"] = metrics
        for name in names:
            print(f"{name:16s} {headline(metrics[name], recipe.val_images)}", flush=True)
    if recipe.export:
        from partialfc.deploy import PreprocessingSpec, export_backbone

        spec = PreprocessingSpec.from_model_config(trainer.model_config)
        if recipe.align:  # the frame the crops were aligned to, at the model's input size
            frame = GREY_FRAME_LANDMARKS * (cfg.data.input_size / GREY_SIZE)
            spec = replace(spec, alignment_landmarks=frame)
        if one_network is not None:  # one ONNX: the 96×96 crop in, the fused embedding out
            model_out, spec = one_network, ltp_fused_spec(one_network)
        else:
            model_out = backbone
        exported = export_backbone(model_out, spec, trainer.run_dir / "export")
        result["export"] = exported.to_dict()
        if lbp is not None:  # fused at test time: fuse_embeddings(onnx(x_64), lbp(x_96), w)
            # moved, not copied: 236 MB with LBP codes, 473 MB with LTP codes
            moved = exported.onnx_path.parent / "lbp_wccn.npz"
            Path(result["lbp"]["path"]).replace(moved)
            result["lbp"]["path"] = result["export"]["lbp"] = str(moved)
        print(
            f"exported to {exported.onnx_path} (onnxruntime vs torch: {exported.max_abs_diff:.2g})"
        )
    result["total_seconds"] = time.perf_counter() - t0
    _atomic_write_json(trainer.run_dir / "recipe_result.json", result)
    print(
        f"train {train_seconds / 60:.1f} min; results in {trainer.run_dir / 'recipe_result.json'}"
    )
    return result


def ensemble_embed(
    model_paths: list[str],
    whitening_split: LfwSplit | None = None,
    recipe=None,
    shift_average_px: int = 0,
):
    """``uint8 images → (N, Σ d)``: each model's embedding L2-normalised, then concatenated
    (every model weighs the same in the cosine of two concatenations), and the input size
    all the models share. With ``whitening_split`` (and ``recipe``), each model's embedding is
    first whitened by :func:`fit_whitening` on that split's training images. With
    ``shift_average_px`` > 0 (default 0: off), the result is averaged over the image and its
    four copies moved that many pixels (:func:`partialfc.eval.embedding.with_shift_averaging`)."""
    from partialfc.deploy import Embedder
    from partialfc.eval import l2_normalize
    from partialfc.eval.embedding import with_shift_averaging

    embedders = [Embedder.load(path) for path in model_paths]
    sizes = {tuple(e.spec.input_size) for e in embedders}
    (height, width), *others = sizes
    if others or height != width:
        raise ValueError(f"{model_paths}: the models must share one square input size, got {sizes}")
    maps = [None] * len(embedders)
    if whitening_split is not None:
        maps = [
            fit_whitening(e.embed_raw, whitening_split, recipe, height).projection
            for e in embedders
        ]

    def embed(images: np.ndarray) -> np.ndarray:
        parts = []
        for embedder, projection in zip(embedders, maps, strict=True):
            raw = embedder.embed_raw(images)
            parts.append(l2_normalize(raw if projection is None else raw @ projection))
        return np.concatenate(parts, axis=1).astype(np.float32)

    return with_shift_averaging(embed, shift_average_px), height


def whitened_run(path, split: LfwSplit, recipe: RecipeConfig):
    """The one-network fused model (:func:`fit_ltp_fused`) of a trained run folder's newest
    checkpoint, whitened on the split's training images when ``recipe.whiten``."""
    from partialfc.backbone.embedding import embed_array
    from partialfc.backbone.io import load_backbone_from_checkpoint

    backbone, _ = load_backbone_from_checkpoint(path)
    if recipe.whiten:
        from partialfc.models.common import as_hw, fold_linear_map

        size, _ = as_hw(backbone.input_size)
        whitening = fit_whitening(
            lambda images: embed_array(backbone, images, 256), split, recipe, size
        )
        backbone = fold_linear_map(backbone, whitening.projection)
    return fit_ltp_fused(backbone, split, recipe)


def evaluate_models(
    recipe: RecipeConfig, model_paths: list[str], shift_average_px: int = 0
) -> dict:
    """Validation metrics of trained models (one, or several as an ensemble) without training;
    ``recipe`` supplies the split and the alignment the models were trained with, and with
    ``recipe.whiten`` each model is whitened on the split's training images (do not whiten an
    export of a whitened run twice: ``--set recipe.whiten=false``); ``shift_average_px`` as
    in :func:`ensemble_embed`."""
    if not recipe.val_folds:
        raise ValueError("--evaluate needs validation folds (recipe.val_folds)")
    split = build_split(recipe)
    whitening_split = split if recipe.whiten else None
    embed, size = ensemble_embed(model_paths, whitening_split, recipe, shift_average_px)
    metrics = evaluate_validation(embed, split, recipe, size, baseline=False)
    names = ("model", "model_no_flip")
    if recipe.lbp_weight > 0 and recipe.ltp_in_graph:
        if len(model_paths) != 1:
            raise ValueError("recipe.ltp_in_graph fuses one trained run, not an ensemble")
        metrics.update(
            evaluate_ltp_fused(whitened_run(model_paths[0], split, recipe), split, recipe)
        )
        names += ("lbp", "model_fused")
    elif recipe.lbp_weight > 0:
        metrics.update(evaluate_fused(embed, size, fit_lbp(split, recipe), split, recipe))
        names += ("lbp", "model_fused")
    for name in names:
        print(f"{name:14s} {headline(metrics[name], recipe.val_images)}", flush=True)
    models = [str(p) for p in model_paths]
    return {
        "models": models,
        "shift_average_px": shift_average_px,
        "recipe": asdict(recipe),
        **metrics,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="configs/lfw_dev_val.yaml or _final.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override, e.g. train.epochs=2 or recipe.val_images=colour (repeatable)",
    )
    parser.add_argument(
        "--evaluate",
        nargs="+",
        metavar="MODEL",
        help="validate trained models (run folders or exports; several = an ensemble of "
        "their normalised, concatenated embeddings) instead of training",
    )
    parser.add_argument("--out", help="with --evaluate: write the metrics to this JSON file")
    parser.add_argument(
        "--teachers",
        nargs="+",
        metavar="MODEL",
        help="train as the student of these runs (same recipe folds): their pairwise cosines "
        "and averaged class probabilities on the training images join the loss",
    )
    parser.add_argument(
        "--relation-weight", type=float, default=100.0, help="with --teachers; default 100"
    )
    parser.add_argument("--kl-weight", type=float, default=1.0, help="with --teachers; default 1")
    parser.add_argument(
        "--teacher-descriptor",
        metavar="LBP_WCCN_NPZ",
        help="with --teachers: fuse this descriptor (a fused run's lbp_wccn.npz, fitted on the "
        "same training folds) into the teachers' embeddings for the relation targets",
    )
    parser.add_argument(
        "--teacher-descriptor-weight",
        type=float,
        default=3.0,
        help="with --teacher-descriptor: its weight w in (cos_net + w cos_lbp) / (1 + w); "
        "default 3 (the fused presets')",
    )
    parser.add_argument(
        "--shift-average",
        type=int,
        default=0,
        metavar="PX",
        help="with --evaluate: average each embedding over the image and its four copies "
        "moved PX pixels at the model's input size (test-time augmentation; default 0: off)",
    )
    args = parser.parse_args(argv)
    if args.shift_average < 0:
        parser.error(f"--shift-average must be >= 0 pixels, got {args.shift_average}")
    if args.shift_average and not args.evaluate:
        parser.error("--shift-average applies to --evaluate only")
    if args.teachers and args.evaluate:
        parser.error("--teachers trains a student; it does not combine with --evaluate")
    if args.teacher_descriptor and not args.teachers:
        parser.error("--teacher-descriptor needs --teachers (the networks it is fused with)")
    for name in ("relation_weight", "kl_weight", "teacher_descriptor_weight"):
        value = getattr(args, name)
        if not np.isfinite(value) or value < 0:
            parser.error(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}")
    recipe, cfg = load_recipe(args.config, args.set)
    from partialfc.train.allocator import keep_freed_memory
    from partialfc.train.threads import apply_num_threads

    # face detection for the alignment and the evaluation run with the training's thread count
    # (torch's default, one thread per core, oversubscribes a CPU shared by side-by-side runs)
    apply_num_threads(cfg.train.num_threads, cfg.data.num_workers)
    if cfg.train.keep_freed_memory:  # as `partialfc train` does
        keep_freed_memory()
    if args.evaluate:
        result = evaluate_models(recipe, args.evaluate, args.shift_average)
        if args.out:
            _atomic_write_json(Path(args.out), result)
        return 0
    distillation = None
    if args.teachers:
        distillation = Distillation(
            args.teachers,
            args.relation_weight,
            args.kl_weight,
            args.teacher_descriptor,
            args.teacher_descriptor_weight,
        )
    run(recipe, cfg, distillation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
