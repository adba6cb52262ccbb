"""The training set, its augmentation and its loader, as the engine needs them.

Augmentation randomness is a function of ``(seed, epoch, sample index)`` only
(:class:`EpochSeededDataset`), not of which DataLoader worker or rank happens to load a sample.
That is what makes a resumed run — mid-epoch, with any number of workers or ranks — see exactly
the images the uninterrupted run saw.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from partialfc.train.config import AugmentConfig, DataConfig

_MIX = 0x9E3779B97F4A7C15


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that is a fixed function of ``(seed, epoch, index)``."""
    mixed = 0
    for part in (seed, epoch, index):
        mixed = ((mixed ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * _MIX + 0x2545F491) % (1 << 63)
    return mixed


class EpochSeededDataset(Dataset):
    """Wrap a labelled dataset; run ``transform`` under a per-sample seeded RNG.

    Yields ``(uint8 image, label, index)``. Set :attr:`epoch` before creating each epoch's
    iterator (workers receive a copy of the dataset then). The global RNG of the calling process
    is left untouched (``torch.random.fork_rng``).
    """

    def __init__(self, dataset, transform=None, seed: int = 0):
        self.dataset = dataset
        self.transform = transform
        self.seed = int(seed)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def labels(self):
        return self.dataset.labels

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    def __getitem__(self, index: int):
        image, label = self.dataset[index][:2]
        if self.transform is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sample_seed(self.seed, self.epoch, index))
                image = self.transform(image)
        return image, int(label), int(index)


def build_train_set(cfg: DataConfig):
    """The labelled training set named by ``cfg.source`` (un-augmented), with its rotated
    copies as extra classes when ``cfg.rotation_classes`` > 1."""
    base = _build_source(cfg)
    if cfg.rotation_classes == 1:
        return base
    from partialfc.data.datasets import QuarterTurnClasses

    try:
        return QuarterTurnClasses(base, cfg.rotation_classes)
    except ValueError as err:
        raise ValueError(f"data.rotation_classes: {err}") from None


def holdout_alphabets(cfg: DataConfig) -> list[str]:
    """The Omniglot background alphabets ``data.holdout_background_alphabets`` names (by name
    or as the last N candidates); [] when none are held out."""
    spec = cfg.holdout_background_alphabets
    if spec in (0, []):
        return []
    from partialfc.data.omniglot_holdout import resolve_holdout_alphabets

    try:
        return resolve_holdout_alphabets(spec)
    except ValueError as err:
        raise ValueError(f"data.holdout_background_alphabets: {err}") from None


def _build_source(cfg: DataConfig):
    if cfg.source == "omniglot":
        from partialfc.data.datasets import ArrayDataset
        from partialfc.data.loaders import load_omniglot

        held_out = holdout_alphabets(cfg)
        try:
            split = load_omniglot(
                "background",
                size=cfg.input_size,
                root=cfg.path or None,
                exclude_alphabets=held_out,
            )
        except ValueError as err:
            raise ValueError(f"data.input_size={cfg.input_size}: {err}") from None
        return ArrayDataset(split.images, split.labels)
    if cfg.source == "npz":
        import numpy as np

        from partialfc.data.datasets import ArrayDataset

        with np.load(cfg.path) as arrays:
            missing = {"images", "labels"} - set(arrays.files)
            if missing:
                raise ValueError(f"{cfg.path}: .npz needs arrays 'images' and 'labels'")
            return ArrayDataset(arrays["images"], arrays["labels"])
    if cfg.source == "folder":
        from partialfc.data.datasets import ImageFolderDataset

        return ImageFolderDataset(cfg.path)
    if cfg.source == "recordio":
        from partialfc.data import recordio

        return recordio.RecordIODataset(cfg.path)
    raise ValueError(f"data.source={cfg.source!r} is not supported")


def build_augmentation(cfg: AugmentConfig, input_size: int):
    """The training transform (uint8 C×H×W → uint8 C×H×W), or None when everything is off."""
    from partialfc.data import transforms as T

    steps = []
    if cfg.max_rotation_deg or cfg.max_shift_frac or cfg.max_scale_delta:
        steps.append(
            T.RandomAffine(
                max_rotation_deg=cfg.max_rotation_deg,
                max_shift_frac=cfg.max_shift_frac,
                max_scale_delta=cfg.max_scale_delta,
            )
        )
    if cfg.crop_padding:
        steps.append(T.RandomCrop(input_size, padding=cfg.crop_padding))
    if cfg.hflip:
        steps.append(T.RandomHorizontalFlip())
    if cfg.color_jitter:
        steps.append(T.ColorJitter(cfg.color_jitter))
    if cfg.erase_prob:
        steps.append(T.RandomErasing(cfg.erase_prob))
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else T.Compose(steps)


class ResumablePKBatchSampler:
    """P×K batches (``partialfc.data.pk_sampler.PKSampler``) split over ranks, resumable.

    Each epoch draws ``num_replicas · batches_per_rank`` batches from one seeded P×K stream
    (seed ``seed + epoch``); rank ``r`` takes batches ``r, r + R, ...``. The position is the
    number of samples consumed by all ranks in this epoch, as for
    ``ResumableDistributedSampler`` (``advance`` / ``state_dict`` / ``load_state_dict``);
    ``len()`` is this rank's batches per epoch, :attr:`num_samples` its samples. Use it as a
    DataLoader ``batch_sampler``.
    """

    def __init__(
        self,
        labels,
        identities_per_batch: int,
        samples_per_identity: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
    ):
        from partialfc.data.pk_sampler import PKSampler

        self.batch_size = identities_per_batch * samples_per_identity
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.batches_per_rank = len(labels) // (self.batch_size * self.num_replicas)
        if self.batches_per_rank < 1:
            raise ValueError(
                f"{len(labels)} training samples cannot fill one P×K batch of "
                f"{self.batch_size} on each of {self.num_replicas} ranks"
            )
        self.stream = PKSampler(
            labels,
            identities_per_batch,
            samples_per_identity,
            num_batches=self.batches_per_rank * self.num_replicas,
            seed=seed,
        )
        self.epoch = 0
        self.consumed_samples = 0

    def __len__(self) -> int:
        return self.batches_per_rank

    @property
    def num_samples(self) -> int:
        return self.batches_per_rank * self.batch_size

    def __iter__(self):
        self.stream.set_epoch(self.epoch)
        skip_rounds = self.consumed_samples // (self.batch_size * self.num_replicas)
        for i, batch in enumerate(self.stream):
            if i // self.num_replicas >= skip_rounds and i % self.num_replicas == self.rank:
                yield batch

    def advance(self, num_samples: int) -> None:
        self.consumed_samples += int(num_samples)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.consumed_samples = int(state["consumed_samples"])
