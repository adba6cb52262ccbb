"""The LFW face recipe: its split is person-disjoint, its preset trains, its export matches."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _load_recipe_module():
    spec = importlib.util.spec_from_file_location(
        "lfw_face_recipe", REPO / "experiments" / "lfw_face_recipe.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


recipe_mod = _load_recipe_module()


# the presets align (MTCNN on every image: minutes) and whiten; tests turn them on when needed
FAST = ("recipe.align=false", "recipe.whiten=false")


def _val_recipe(shared_data: Path, *overrides: str):
    return recipe_mod.load_recipe(
        REPO / "configs" / "lfw_dev_val.yaml",
        [f"recipe.data_root={shared_data / 'lfw_dev'}", *FAST, *overrides],
    )


def test_validation_split_is_person_disjoint(shared_data):
    recipe, _ = _val_recipe(shared_data, "recipe.min_images_per_person=1")
    split = recipe_mod.build_split(recipe)
    train, val = set(split.train_identities), set(split.val_identities)
    pair_people = set(split.pairs.name1) | set(split.pairs.name2)
    assert not train & val and not train & pair_people
    # pair people missing from the grey set have no grey image at all (on neither side)
    dev_people = set(recipe_mod.load_lfw_names(recipe))
    assert not (pair_people - val) & dev_people and len(pair_people - val) < 30
    # folds 1-3 of the grey dev set plus the 1,428 extra (fold 0) people; folds 4-5 validate
    assert split.num_classes == 428 + 402 + 388 + 1428
    assert len(split.train_images) == 1135 + 1164 + 905 + 1505
    assert len(split.val_identities) == 410 + 413 and len(split.val_images) == 1133 + 846
    assert len(split.pairs) == 1200 and set(np.unique(split.pairs.fold)) == {4, 5}
    # labels are contiguous and name the right people
    assert split.train_labels.min() == 0 and split.train_labels.max() == split.num_classes - 1
    assert split.train_identities[split.train_labels[0]] == "Aaron_Sorkin"  # first fold 1-3 person


def test_preset_keeps_people_with_several_images(shared_data):
    recipe, _ = _val_recipe(shared_data)
    assert recipe.min_images_per_person == 2
    split = recipe_mod.build_split(recipe)
    counts = np.bincount(split.train_labels)
    assert counts.min() == 2 and split.num_classes == 164 + 140 + 146 + 48
    assert len(split.train_images) == 871 + 902 + 663 + int(counts[-48:].sum())


def test_colour_views_add_the_training_people_pair_photos(shared_data):
    from partialfc.data import LfwImageArchive

    plain = recipe_mod.build_split(_val_recipe(shared_data)[0])
    recipe, _ = _val_recipe(shared_data, "recipe.train_colour_views=true")
    split = recipe_mod.build_split(recipe)
    # folds 1-3 pair photos of training people; 20 more people reach two distinct photos
    assert split.num_classes == 498 + 20 and len(split.train_images) == 4129
    assert set(plain.train_identities) < set(split.train_identities)
    assert not set(split.train_identities) & set(split.val_identities)
    archive = LfwImageArchive(shared_data / "lfw_dev" / "lfw_color150_dev.zip")
    ids = [i for i in archive.image_ids() if i.rsplit("_", 1)[0] in split.train_identities]
    # 2,561 grey images + one grey image of each of the 20 people + 1,548 colour views
    assert len(ids) == 1548 and len(split.train_images) - len(ids) == 2561 + 20
    # the colour views are appended after the grey images, in archive order, converted
    last = ids[-1]
    name, number = last.rsplit("_", 1)
    expected = recipe_mod.colour_to_grey_crop(archive.read(name, int(number)))
    np.testing.assert_array_equal(split.train_images[-1], expected)
    assert split.train_identities[split.train_labels[-1]] == name
    # a person counts by distinct photos: a photo in both sets is one photo
    counts = np.bincount(split.train_labels)
    assert counts.min() >= 2


def test_alignment_brings_both_renderings_of_a_photo_together(shared_data):
    """The grey crop and the colour photo of the same LFW image, each aligned by its own MTCNN
    landmarks onto the grey frame, agree far better than the centred crop does."""
    from partialfc.data import LfwImageArchive, load_lfw_gray

    grey_set = load_lfw_gray(shared_data / "lfw_dev", part="dev")
    archive = LfwImageArchive(shared_data / "lfw_dev" / "lfw_color150_dev.zip")
    row = {name: i for i, name in enumerate(grey_set.image_names)}
    both = [i for i in archive.image_ids() if i in row][:40]
    grey = np.stack([grey_set.images[row[i]] for i in both])
    photos = [archive.read(*i.rsplit("_", 1)) for i in both]
    centred = recipe_mod.colour_photos_to_grey(photos, align=False)
    aligned_colour = recipe_mod.colour_photos_to_grey(photos, align=True)
    aligned_grey, found = recipe_mod.align_grey_crops(grey)
    assert found == 40
    ncc = recipe_mod.normalised_cross_correlation
    before = [ncc(c, g) for c, g in zip(centred, grey, strict=True)]
    after = [ncc(c, g) for c, g in zip(aligned_colour, aligned_grey, strict=True)]
    assert np.mean(before) < 0.8 and np.mean(after) > 0.93 and min(after) > 0.8
    # re-detected on the aligned crops, the landmarks sit closer to the frame's points
    frame = recipe_mod.GREY_FRAME_LANDMARKS
    raw_points, _ = recipe_mod.face_landmarks(grey, pad=recipe_mod.GREY_DETECT_PAD)
    new_points, ok = recipe_mod.face_landmarks(aligned_grey, pad=recipe_mod.GREY_DETECT_PAD)
    assert ok.all()
    assert np.abs(new_points - frame).mean() < 0.65 * np.abs(raw_points - frame).mean()


def test_overlapping_split_is_refused(shared_data):
    recipe, _ = _val_recipe(shared_data, "recipe.train_folds=[0,1,2,3,4]")
    with pytest.raises(ValueError, match="person-disjoint"):
        recipe_mod.build_split(recipe)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("recipe.whiten_regularization=-1", "whiten_regularization"),
        ("recipe.whiten_regularization=.nan", "whiten_regularization"),
        ("recipe.whiten_regularization=strong", "whiten_regularization"),
        ("recipe.val_folds=[0]", "fold 0"),
        ("recipe.lbp_weight=-1", "lbp_weight"),
        ("recipe.lbp_weight=.nan", "lbp_weight"),
        ("recipe.lbp_weight=much", "lbp_weight"),
        ("recipe.ltp_in_graph=true", "lbp_ternary_threshold > 0"),
        ("recipe.lbp_components=0", "lbp_components"),
        ("recipe.lbp_regularization=-0.5", "lbp_regularization"),
        ("recipe.lbp_ternary_threshold=-2", "lbp_ternary_threshold"),
        ("recipe.lbp_ternary_threshold=.nan", "lbp_ternary_threshold"),
        ("recipe.whitening=true", "unknown recipe key"),
    ],
)
def test_bad_recipe_values_name_the_key_before_training(override, message):
    with pytest.raises(ValueError, match=message):
        recipe_mod.load_recipe(REPO / "configs" / "lfw_dev_val_bf16.yaml", [override])


def test_the_recipe_lbp_keys_set_the_embedder():
    config = REPO / "configs" / "lfw_dev_val_fused.yaml"
    sets = ["recipe.lbp_components=900", "recipe.lbp_regularization=0.7"]
    lbp = recipe_mod.lbp_embedder(recipe_mod.load_recipe(config, sets)[0])
    assert (lbp.num_components, lbp.regularization, lbp.grid.ternary_threshold) == (900, 0.7, 8)
    recipe, _ = recipe_mod.load_recipe(config, [*sets, "recipe.lbp_ternary_threshold=0"])
    assert recipe_mod.lbp_embedder(recipe).grid.ternary_threshold == 0.0


@pytest.mark.parametrize("preset", ["", "_bf16", "_fused", "_onefile"])
def test_each_final_preset_is_its_validation_preset_on_every_development_person(preset):
    """A final model is retrained with the recipe chosen on folds 4-5: only the folds, the
    export, the run name and the thread count (rounding, not the recipe) may differ; a key
    added to one preset alone fails here."""
    from partialfc.train.config import read_config_file

    val = read_config_file(REPO / "configs" / f"lfw_dev_val{preset}.yaml")
    final = read_config_file(REPO / "configs" / f"lfw_dev_final{preset}.yaml")
    assert sorted(final["recipe"]["train_folds"]) == sorted(
        val["recipe"]["train_folds"] + val["recipe"]["val_folds"]
    )
    assert (final["recipe"]["val_folds"], final["recipe"]["export"]) == ([], True)
    assert final["run"]["name"] == f"lfw_dev_final{preset}"
    for config in (val, final):
        for key in ("train_folds", "val_folds", "export"):
            config["recipe"].pop(key, None)
        config["run"].pop("name")
        config["train"].pop("num_threads", None)
    assert final == val


def test_grey_pairs_point_at_the_named_images(shared_data):
    recipe, _ = _val_recipe(shared_data)
    split = recipe_mod.build_split(recipe)
    grey = recipe_mod.pair_images(recipe, split, "grey")
    kept = np.flatnonzero(grey.keep)
    p = split.pairs
    for row, i in enumerate(kept[:50]):
        assert split.val_image_names[grey.first[row]] == f"{p.name1[i]}_{p.number1[i]:04d}"
        assert split.val_image_names[grey.second[row]] == f"{p.name2[i]}_{p.number2[i]:04d}"
    assert 0.85 < grey.keep.mean() < 1.0  # the grey set lacks a few pair images


# a run small enough for a test: 32 images at 32×32, batches of 16
TINY_RUN = (
    "recipe.max_train_images=32",
    "schedule.warmup_epochs=0",
    "data.batch_size=16",
    "data.num_workers=0",
    "data.input_size=32",
    "model.embedding_dim=16",
    "run.progress=false",
)


def test_preset_first_steps_train_on_a_tiny_subset(shared_data, tmp_path):
    recipe, cfg = _val_recipe(shared_data, *TINY_RUN, "train.epochs=2")
    split = recipe_mod.build_split(recipe)
    trainer = recipe_mod.build_trainer(recipe, cfg, split, run_dir=tmp_path / "run")
    # 32 images / 16 = 2 steps per epoch: margin zero for 0.5 epoch, then ramped over 1
    assert (cfg.head.margin.warmup_steps, cfg.head.margin.ramp_steps) == (1, 2)
    result = trainer.fit()
    assert result.steps == 4 and np.isfinite(result.losses).all()
    assert trainer.margin.m2_rad == pytest.approx(0.5)  # the ramp reached the preset's margin
    emb = trainer.embed_fn()(recipe_mod.resize_to(split.val_images[:4], 32))
    assert emb.shape == (4, 16) and np.isfinite(emb).all()


def _tiny_final_run(shared_data: Path, out: Path, *overrides: str):
    """The final preset (export on) for one epoch of TINY_RUN into ``out/lfw_dev_final``."""
    recipe, cfg = recipe_mod.load_recipe(
        REPO / "configs" / "lfw_dev_final.yaml",
        [
            f"recipe.data_root={shared_data / 'lfw_dev'}",
            *FAST,
            *overrides,
            *TINY_RUN,
            "train.epochs=1",
            f"run.output_dir={out}",
        ],
    )
    return recipe, recipe_mod.run(recipe, cfg)


def test_aligned_final_run_exports_its_frame_in_the_spec(shared_data, tmp_path):
    from partialfc.deploy import PreprocessingSpec

    _, result = _tiny_final_run(shared_data, tmp_path, "recipe.align=true")
    assert result["steps"] == 2 and "validation" not in result
    spec = PreprocessingSpec.load(tmp_path / "lfw_dev_final" / "export" / "preprocessing.json")
    expected = recipe_mod.GREY_FRAME_LANDMARKS / 3  # 96×96 frame at the 32×32 input
    np.testing.assert_allclose(spec.alignment_landmarks, expected)
    assert spec.input_size == (32, 32) and spec.colour_order == "GREY"


def test_whitened_run_exports_the_whitened_embedding_and_the_lbp_embedder(
    shared_data, tmp_path, monkeypatch
):
    from partialfc.deploy import Embedder
    from partialfc.models.lbp import LbpWccnEmbedder

    fitted = _small_lbp_fits(monkeypatch)
    recipe, result = _tiny_final_run(
        shared_data,
        tmp_path,
        "recipe.whiten=true",
        "recipe.whiten_regularization=0.5",
        "recipe.lbp_weight=3",
        "recipe.lbp_components=8",
    )
    assert result["whitening"] == {"regularization": 0.5, "fitted_on_images": 32}
    run_dir = tmp_path / "lfw_dev_final"
    # the LBP embedder fitted on the training faces ships beside the ONNX model
    assert result["export"]["lbp"] == str(run_dir / "export" / "lbp_wccn.npz")
    assert result["lbp"]["path"] == result["export"]["lbp"]
    assert not (run_dir / "lbp_wccn.npz").exists()  # moved into the export, not copied
    assert result["lbp"]["weight"] == 3 and len(fitted) == 1
    exported_lbp = LbpWccnEmbedder.load(run_dir / "export" / "lbp_wccn.npz")
    faces = recipe_mod.build_split(recipe).train_images[:4]
    np.testing.assert_array_equal(exported_lbp(faces), fitted[0](faces))
    trained, exported = Embedder.load(run_dir), Embedder.load(run_dir / "export")
    split = recipe_mod.build_split(recipe)
    # independently refitted on the trained (unwhitened) weights: the export is their map
    whitening = recipe_mod.fit_whitening(trained.embed_raw, split, recipe, 32)
    images = recipe_mod.resize_to(split.train_images[:8], 32)
    expected = trained.embed_raw(images) @ whitening.projection
    np.testing.assert_allclose(exported.embed_raw(images), expected, rtol=1e-3, atol=1e-3)
    assert not np.allclose(exported.embed(images), trained.embed(images), atol=1e-2)


def _saved_model(path: Path, seed: int, size: int = 32) -> Path:
    """An untrained ``iresnet_tiny`` (the smallest backbone: these tests embed the 1,979
    validation faces several times) saved as a run folder."""
    from partialfc.backbone.io import save_backbone
    from partialfc.models import build_model

    torch.manual_seed(seed)
    config = {
        "name": "iresnet_tiny",
        "kwargs": {"embedding_dim": 8, "input_size": size, "in_channels": 1},
    }
    save_backbone(build_model(config["name"], **config["kwargs"]).eval(), config, path)
    return path


def test_ensemble_concatenates_normalised_embeddings(tmp_path):
    from partialfc.deploy import Embedder

    a, b = _saved_model(tmp_path / "a", 0), _saved_model(tmp_path / "b", 1)
    images = np.random.default_rng(2).integers(0, 256, (6, 32, 32), dtype=np.uint8)
    embed, size = recipe_mod.ensemble_embed([str(a), str(b)])
    got = embed(images)
    assert size == 32 and got.shape == (6, 16)
    # independently: each model's normalised embedding, side by side
    for part, path in zip((got[:, :8], got[:, 8:]), (a, b), strict=True):
        np.testing.assert_allclose(part, Embedder.load(path).embed(images), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="input size"):
        recipe_mod.ensemble_embed([str(a), str(_saved_model(tmp_path / "c", 0, size=48))])


def test_a_model_twice_scores_as_the_model_alone(shared_data, tmp_path):
    recipe, _ = _val_recipe(shared_data, "recipe.pair_sources=[grey]")
    model = str(_saved_model(tmp_path / "m", 0))
    alone = recipe_mod.evaluate_models(recipe, [model])
    twice = recipe_mod.evaluate_models(recipe, [model, model])
    for metrics in ("pairs_grey", "all_vs_all"):
        assert twice["model"][metrics]["auc"] == pytest.approx(alone["model"][metrics]["auc"])
    assert twice["model"]["pairs_grey"]["accuracy"]["mean"] == pytest.approx(
        alone["model"]["pairs_grey"]["accuracy"]["mean"]
    )
    assert alone["models"] == [model] and 0.5 < alone["model"]["pairs_grey"]["auc"] < 0.8
    recipe.whiten = True  # each model whitened on the training images: the same again
    whitened_alone = recipe_mod.evaluate_models(recipe, [model])["model"]["pairs_grey"]["auc"]
    whitened_twice = recipe_mod.evaluate_models(recipe, [model, model])["model"]["pairs_grey"]
    assert whitened_twice["auc"] == pytest.approx(whitened_alone)
    assert whitened_alone != pytest.approx(alone["model"]["pairs_grey"]["auc"], abs=1e-4)


def test_fused_score_is_the_weighted_mean_of_the_two_cosines(shared_data, tmp_path):
    from sklearn.metrics import roc_auc_score

    from partialfc.deploy import Embedder

    recipe, _ = _val_recipe(shared_data, "recipe.pair_sources=[grey]", "recipe.lbp_weight=3")
    split = recipe_mod.build_split(recipe)
    model = _saved_model(tmp_path / "m", 0)
    descriptor = recipe_mod.raw_pixel_embed(split.val_images)  # stands in for the LBP embedder
    embedder = Embedder.load(model)
    got = recipe_mod.evaluate_fused(embedder.embed_raw, 32, descriptor, split, recipe)
    # independently: each image's two unit vectors, the pair score (cos_m + 3·cos_d) / 4
    pairs = recipe_mod.pair_images(recipe, split, "grey")
    x = recipe_mod.resize_to(split.val_images, 32)
    m = embedder.embed_raw(x) + embedder.embed_raw(np.ascontiguousarray(x[:, :, ::-1]))
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    d = descriptor(split.val_images)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    cos_m = np.sum(m[pairs.first] * m[pairs.second], axis=1)
    cos_d = np.sum(d[pairs.first] * d[pairs.second], axis=1)
    same = split.pairs.issame[pairs.keep]
    for key, scores in (("model_cnn", cos_m), ("lbp", cos_d), ("model_fused", cos_m + 3 * cos_d)):
        # float32 embeddings against float64 recomputation: ties may break differently
        assert got[key]["pairs_grey"]["auc"] == pytest.approx(roc_auc_score(same, scores), abs=1e-4)
    assert got["model_fused"]["pairs_grey"]["auc"] not in (
        pytest.approx(roc_auc_score(same, cos_m)),
        pytest.approx(roc_auc_score(same, cos_d)),
    )
    # templates: a person's images alternate between two templates, each the mean of the
    # images' unit descriptors, renormalised; every pair of templates is scored
    labels = split.val_labels
    template = np.zeros(len(labels), dtype=np.int64)
    for person in np.unique(labels):
        rows = np.flatnonzero(labels == person)
        template[rows] = 2 * person + np.arange(rows.size) % 2
    ids = np.unique(template)
    pooled = np.stack([d[template == t].mean(axis=0) for t in ids])
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    i, j = np.triu_indices(len(ids), k=1)
    scores = (pooled @ pooled.T)[i, j]
    expected = roc_auc_score(ids[i] // 2 == ids[j] // 2, scores)
    assert got["lbp"]["templates"]["auc"] == pytest.approx(expected, abs=1e-4)


def _small_lbp_fits(monkeypatch) -> list:
    """Make the recipe fit its LBP embedder on a grid small enough for a test; returns the
    list the fitted embedders are appended to."""
    from partialfc.models.lbp import LbpGrid, LbpWccnEmbedder

    fitted = []

    def small_fit_lbp(split, recipe):
        embedder = LbpWccnEmbedder(LbpGrid((24,), (1,), 8, 8), recipe.lbp_components)
        fitted.append(embedder.fit(split.train_images, split.train_labels))
        return fitted[-1]

    monkeypatch.setattr(recipe_mod, "fit_lbp", small_fit_lbp)
    return fitted


def test_more_lbp_components_than_training_images_is_refused_before_training(shared_data, tmp_path):
    recipe, cfg = _val_recipe(
        shared_data,
        *TINY_RUN,
        "recipe.lbp_weight=1",
        "recipe.lbp_components=32",  # TINY_RUN keeps 32 training images
        f"run.output_dir={tmp_path}",
    )
    with pytest.raises(ValueError, match=r"recipe.lbp_components \(32\) must be below.*\(32\)"):
        recipe_mod.run(recipe, cfg)
    assert not (tmp_path / "lfw_dev_val").exists()  # nothing trained, nothing written


def test_validation_run_with_lbp_fusion_saves_and_reports_it(shared_data, tmp_path, monkeypatch):
    from partialfc.models.lbp import LbpWccnEmbedder

    fitted = _small_lbp_fits(monkeypatch)
    recipe, cfg = _val_recipe(
        shared_data,
        *TINY_RUN,
        "train.epochs=1",
        "recipe.pair_sources=[grey]",
        "recipe.lbp_weight=2",
        "recipe.lbp_components=8",
        "recipe.whiten=true",  # the fused model is the whitened one, as in "model"
        "model.name=iresnet_tiny",  # the validation images are embedded six times
        f"run.output_dir={tmp_path}",
    )
    result = recipe_mod.run(recipe, cfg)
    assert result["lbp"]["weight"] == 2 and len(fitted) == 1
    saved = LbpWccnEmbedder.load(result["lbp"]["path"])
    images = recipe_mod.build_split(recipe).val_images[:5]
    np.testing.assert_array_equal(saved(images), fitted[0](images))
    validation = result["validation"]
    cnn, model = validation["model_cnn"]["pairs_grey"], validation["model"]["pairs_grey"]
    assert cnn["auc"] == pytest.approx(model["auc"])
    assert cnn["accuracy"]["mean"] == pytest.approx(model["accuracy"]["mean"])
    fused_auc = validation["model_fused"]["pairs_grey"]["auc"]
    assert fused_auc != pytest.approx(validation["model"]["pairs_grey"]["auc"], abs=1e-4)
    assert fused_auc != pytest.approx(validation["lbp"]["pairs_grey"]["auc"], abs=1e-4)


def test_normalised_cross_correlation_is_the_pixels_pearson_r():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 256, (2, 12, 12), dtype=np.uint8)
    ncc = recipe_mod.normalised_cross_correlation
    assert ncc(a, b) == pytest.approx(np.corrcoef(a.ravel(), b.ravel())[0, 1], abs=1e-12)
    brighter = np.clip(a.astype(int) // 2 + 60, 0, 255).astype(np.uint8)  # no uint8 overflow
    assert ncc(a, brighter) > 0.999 and ncc(a, 255 - a) == pytest.approx(-1.0)


def test_two_templates_per_person():
    labels = np.array([0, 0, 0, 1, 2, 2])
    assert recipe_mod.two_templates_per_person(labels).tolist() == [0, 1, 0, 2, 4, 5]


def test_colour_crop_takes_the_centred_square():
    rgb = np.zeros((150, 150, 3), np.uint8)
    rgb[75 - 29 : 75 + 29, 75 - 29 : 75 + 29] = 200  # a square half the crop's side
    crop = recipe_mod.colour_to_grey_crop(rgb, side=116, size=96)
    assert crop.shape == (96, 96)
    assert crop[48, 48] == 200 and crop[2, 2] == 0 and crop[93, 93] == 0
    inside = (crop > 100).sum() / crop.size
    assert inside == pytest.approx(0.25, abs=0.03)


def test_exported_onnx_embedding_equals_pytorch(tmp_path):
    from partialfc.deploy import Embedder, PreprocessingSpec, export_backbone
    from partialfc.models import build_model

    torch.manual_seed(0)
    model_config = {
        "name": "iresnet_small",
        "kwargs": {"embedding_dim": 16, "input_size": 32, "in_channels": 1},
    }
    model = build_model(model_config["name"], **model_config["kwargs"]).eval()
    spec = PreprocessingSpec.from_model_config(model_config)
    export_backbone(model, spec, tmp_path)
    images = np.random.default_rng(1).integers(0, 256, size=(5, 32, 32), dtype=np.uint8)
    onnx_embedder = Embedder.load(tmp_path, backend="onnx")
    x = torch.from_numpy(images).float().div(255).sub(0.5).div(0.5).unsqueeze(1)
    with torch.no_grad():
        expected = model(x).numpy()
    got = onnx_embedder.embed_raw(images)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def _moved(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Images moved ``dy`` rows down and ``dx`` columns right, zeros moved in (by padding)."""
    n, h, w = images.shape
    padded = np.pad(images, ((0, 0), (abs(dy), abs(dy)), (abs(dx), abs(dx))))
    top, left = abs(dy) - dy, abs(dx) - dx
    return padded[:, top : top + h, left : left + w]


def test_shift_averaging_is_the_mean_of_five_moved_copies(tmp_path):
    from partialfc.deploy import Embedder

    a, b = _saved_model(tmp_path / "a", 0), _saved_model(tmp_path / "b", 1)
    images = np.random.default_rng(3).integers(0, 256, (5, 32, 32), dtype=np.uint8)
    embed, _ = recipe_mod.ensemble_embed([str(a), str(b)], shift_average_px=2)
    expected = np.zeros((5, 16))
    for dy, dx in ((0, 0), (-2, 0), (2, 0), (0, -2), (0, 2)):
        copy = _moved(images, dy, dx)
        both = np.concatenate([Embedder.load(p).embed(copy) for p in (a, b)], axis=1)
        expected += both / np.linalg.norm(both, axis=1, keepdims=True) / 5
    np.testing.assert_allclose(embed(images), expected, rtol=1e-4, atol=1e-5)
    plain, _ = recipe_mod.ensemble_embed([str(a), str(b)])
    assert not np.allclose(plain(images), expected, atol=1e-3)  # the copies changed something


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--evaluate", "m", "--shift-average", "-1"], "must be >= 0 pixels"),
        (["--shift-average", "2"], "--evaluate only"),
        (["--evaluate", "m", "--teachers", "t"], "does not combine with --evaluate"),
        (["--teachers", "t", "--relation-weight", "-1"], "--relation-weight must be a finite"),
        (["--teachers", "t", "--kl-weight", "nan"], "--kl-weight must be a finite number >= 0"),
        (["--teacher-descriptor", "d.npz"], "--teacher-descriptor needs --teachers"),
        (
            ["--teachers", "t", "--teacher-descriptor-weight", "-1"],
            "--teacher-descriptor-weight must be a finite number >= 0",
        ),
    ],
)
def test_flags_refuse_bad_use(argv, message, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the flag was accepted")

    monkeypatch.setattr(recipe_mod, "run", must_not_run)  # neither trains nor evaluates
    monkeypatch.setattr(recipe_mod, "evaluate_models", must_not_run)
    with pytest.raises(SystemExit):
        recipe_mod.main(["--config", "configs/lfw_dev_val.yaml", *argv])
    assert message in capsys.readouterr().err


def test_student_of_trained_runs_logs_the_ensemble_terms(shared_data, tmp_path):
    teachers = []
    for seed in (0, 1):
        recipe, cfg = _val_recipe(
            shared_data,
            *TINY_RUN,
            "train.epochs=1",
            f"train.seed={seed}",
            f"run.output_dir={tmp_path}",
            f"run.name=teacher{seed}",
        )
        split = recipe_mod.build_split(recipe)
        recipe_mod.build_trainer(recipe, cfg, split).fit()
        teachers.append(str(tmp_path / f"teacher{seed}"))
    recipe, cfg = _val_recipe(
        shared_data,
        *TINY_RUN,
        "train.epochs=2",
        "train.log_every=1",
        f"run.output_dir={tmp_path}",
        "run.name=student",
    )
    distillation = recipe_mod.Distillation(teachers, relation_weight=50.0, kl_weight=0.5)
    trainer = recipe_mod.build_trainer(recipe, cfg, split, distillation=distillation)
    result = trainer.fit()
    assert result.steps == 4
    records = [json.loads(line) for line in (tmp_path / "student" / "metrics.jsonl").open()]
    terms = [r["terms"] for r in records if r["kind"] == "train"]
    assert len(terms) == 4
    for t in terms:
        part = t["ensemble_distill"]
        assert part["loss"] == pytest.approx(50.0 * part["relation"] + 0.5 * part["kl"], rel=1e-5)
        assert part["relation"] > 0 and part["kl"] > 0
    mismatched = recipe_mod.Distillation(teachers)
    with pytest.raises(ValueError, match="trained at 32x32, the images are 40x40"):
        mismatched.term(recipe_mod.resize_to(split.train_images, 40), split.num_classes)
    with pytest.raises(ValueError, match="classes, the student's split 3"):
        mismatched.term(recipe_mod.resize_to(split.train_images, 32), 3)
    # a fused teacher: the relation targets are the cosines (cos_net + w cos_lbp) / (1 + w)
    from partialfc.models.lbp import LbpGrid, LbpWccnEmbedder
    from partialfc.tools.distillation import ensemble_targets

    grid = LbpGrid((24,), (1,), 8, 8, ternary_threshold=4.0)
    lbp = LbpWccnEmbedder(grid, num_components=8).fit(split.train_images, split.train_labels)
    npz = lbp.save(tmp_path / "lbp_wccn.npz")
    images = recipe_mod.resize_to(split.train_images, 32)
    fused = recipe_mod.Distillation(teachers[:1], descriptor=str(npz), descriptor_weight=3.0)
    term = fused.term(images, split.num_classes, split.train_images)
    net_units = ensemble_targets(teachers[:1], images)[0][0].double()
    lbp_raw = torch.from_numpy(lbp(split.train_images)).double()
    lbp_units = lbp_raw / lbp_raw.norm(dim=1, keepdim=True)
    expected = (net_units @ net_units.T + 3.0 * lbp_units @ lbp_units.T) / 4.0
    got = term.teacher_units[0].double() @ term.teacher_units[0].double().T
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, net_units @ net_units.T, atol=1e-2)  # the descriptor counts
    with pytest.raises(ValueError, match="needs the training crops"):
        fused.term(images, split.num_classes)


def test_in_graph_fused_run_exports_one_onnx_of_network_and_descriptor(shared_data, tmp_path):
    from partialfc.deploy import Embedder, PreprocessingSpec
    from partialfc.eval import l2_normalize

    overrides = ("model.name=iresnet_tiny", "recipe.lbp_weight=3", "recipe.lbp_components=8")
    overrides += ("recipe.ltp_in_graph=true", "recipe.lbp_ternary_threshold=8")
    with pytest.raises(ValueError, match="iresnet_tiny_ltp"):  # TINY_RUN's 16-d, 32-px network
        _tiny_final_run(shared_data, tmp_path, *overrides)
    sized = ("model.embedding_dim=256", "data.input_size=64")
    recipe, result = recipe_mod.load_recipe(
        REPO / "configs" / "lfw_dev_final.yaml",
        [
            f"recipe.data_root={shared_data / 'lfw_dev'}",
            *FAST,
            *TINY_RUN,
            *overrides,
            *sized,
            "train.epochs=1",
            f"run.output_dir={tmp_path}",
        ],
    )
    result = recipe_mod.run(recipe, result)
    export = tmp_path / "lfw_dev_final" / "export"
    assert sorted(p.name for p in export.iterdir()) == [
        "backbone.onnx",
        "backbone.safetensors",
        "preprocessing.json",
    ]  # no descriptor file beside the network
    assert result["lbp"]["in_graph"] and result["export"]["max_abs_diff"] < 1e-4
    spec = PreprocessingSpec.load(export / "preprocessing.json")
    assert (spec.model_name, spec.input_size, spec.embedding_dim) == (
        "iresnet_tiny_ltp",
        (96, 96),
        256 + 8,
    )
    faces = recipe_mod.build_split(recipe).train_images[:6]
    one = Embedder.load(export, backend="onnx").embed_raw(faces)
    np.testing.assert_allclose(
        one, Embedder.load(export, backend="torch").embed_raw(faces), atol=1e-4
    )
    # the first 256 dimensions are the trained network's flip-tested embedding, normalised
    trained = Embedder.load(tmp_path / "lfw_dev_final")
    x = recipe_mod.resize_to(faces, 64)
    net = trained.embed_raw(x) + trained.embed_raw(np.ascontiguousarray(x[:, :, ::-1]))
    cosines = np.sum(l2_normalize(net) * one[:, :256], axis=1)
    assert (cosines > 0.99).all()
    np.testing.assert_allclose(np.linalg.norm(one[:, 256:], axis=1), np.sqrt(3), rtol=1e-5)


def test_complementary_training_uses_descriptors_fitted_without_each_person(shared_data, tmp_path):
    from partialfc.models.iresnet import iresnet_tiny

    overrides = ("recipe.lbp_components=4", "recipe.complementary_groups=2", "train.epochs=1")
    recipe, cfg = _val_recipe(
        shared_data,
        *TINY_RUN,
        "recipe.pair_sources=[grey]",
        "recipe.lbp_weight=3",
        "recipe.ltp_in_graph=true",
        "recipe.lbp_ternary_threshold=8",
        "recipe.complementary_weight=2",
        *overrides,
        f"run.output_dir={tmp_path}",
    )
    split = recipe_mod.build_split(recipe)
    descriptors = recipe_mod.out_of_fold_descriptors(split, recipe, seed=0)
    # the group of the first image's person, fitted again on everybody else's images only
    order = np.random.default_rng(0).permutation(np.unique(split.train_labels))
    group = {p: i % 2 for i, p in enumerate(order.tolist())}
    own = np.array([group[p] == group[split.train_labels[0]] for p in split.train_labels])
    faces = recipe_mod.normalised_faces(split.train_images)
    refit = recipe_mod.ltp_fused(iresnet_tiny(input_size=64, in_channels=1), recipe)
    refit.fit_texture(faces[~own], split.train_labels[~own], recipe.lbp_regularization)
    with torch.no_grad():
        expected = refit.texture(faces[own]).numpy()
    np.testing.assert_allclose(descriptors[own], expected, rtol=1e-4, atol=1e-4)
    everyone = recipe_mod.ltp_fused(iresnet_tiny(input_size=64, in_channels=1), recipe)
    everyone.fit_texture(faces, split.train_labels, recipe.lbp_regularization)
    with torch.no_grad():
        assert not np.allclose(descriptors[own], everyone.texture(faces[own]).numpy(), atol=1e-2)
    too_many = replace(recipe, complementary_groups=split.num_classes + 1)
    with pytest.raises(ValueError, match=r"complementary_groups \(\d+\) exceeds the \d+ training"):
        recipe_mod.out_of_fold_descriptors(split, too_many)
    trainer = recipe_mod.build_trainer(recipe, cfg, split, run_dir=tmp_path / "run")
    (term,) = trainer.extra_losses
    assert (term.name, term.weight, term.descriptor_weight) == ("complementary", 2.0, 3.0)
    trainer.fit()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("complementary" in r.get("terms", {}) for r in logged if r.get("kind") == "train")


def test_complementary_training_needs_the_in_graph_descriptor(shared_data):
    with pytest.raises(ValueError, match="complementary_weight trains against the in-graph"):
        _val_recipe(shared_data, "recipe.complementary_weight=1")
    with pytest.raises(ValueError, match="complementary_weight must be finite and >= 0"):
        _val_recipe(
            shared_data,
            "recipe.lbp_weight=3",
            "recipe.ltp_in_graph=true",
            "recipe.lbp_ternary_threshold=8",
            "recipe.complementary_weight=-1",
        )
    with pytest.raises(ValueError, match="complementary_groups must be >= 2"):
        _val_recipe(shared_data, "recipe.complementary_groups=1")


@pytest.mark.parametrize(
    ("flip_test", "name"), [(True, "iresnet_tiny_ltp"), (False, "iresnet_tiny_ltp_noflip")]
)
def test_one_network_export_names_the_model_that_rebuilds_it(flip_test, name):
    from partialfc.models import build_model

    fused = build_model("iresnet_tiny_ltp", embedding_dim=256 + 8, input_size=96, in_channels=1)
    fused.flip_test = flip_test
    spec = recipe_mod.ltp_fused_spec(fused)
    assert spec.model_name == name and spec.embedding_dim == 264
    rebuilt = build_model(spec.model_name, **spec.model_kwargs)
    assert rebuilt.flip_test is flip_test
