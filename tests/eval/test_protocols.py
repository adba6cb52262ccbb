"""Protocols end to end: tiny hand-made IJB meta files, a .bin set, an LFW pairs folder, and
the bundled/shared real data with a pixel baseline embedding; report files and the command."""

import json
import sys
import types

import cv2
import numpy as np
import pytest

from partialfc.backbone.embedder import PREPROCESSING, PREPROCESSING_HELP
from partialfc.eval import evaluate_model
from partialfc.eval.protocols import (
    Ijb,
    LfwPairs,
    OmniglotOneShot,
    OmniglotOpenSet,
    Orl,
    VerificationBin,
    ijb_one_to_many,
    ijb_one_to_one,
    read_1n_csv,
    read_face_tid_mid,
    read_template_pairs,
)
from partialfc.eval.protocols.omniglot import one_shot_gallery_identification


def pixel_embed(images):
    """Baseline embedding: 16x16 grey thumbnail, mean-centred per image."""
    out = []
    for im in images:
        g = cv2.cvtColor(im, cv2.COLOR_RGB2GRAY) if im.ndim == 3 else im
        v = cv2.resize(g, (16, 16), interpolation=cv2.INTER_AREA).astype(np.float32).ravel()
        out.append(v - v.mean())
    return np.stack(out)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def ijb_root(tmp_path):
    """IJB-style folder: 6 faces in 3 templates; template 1 has two media (frames 1a, 1b)."""
    meta = tmp_path / "meta"
    _write(
        meta / "ijbc_face_tid_mid.txt",
        "1.jpg 1 10\n2.jpg 1 10\n3.jpg 1 11\n4.jpg 2 20\n5.jpg 3 30\n6.jpg 3 31\n",
    )
    _write(meta / "ijbc_template_pair_label.txt", "1 2 1\n1 3 0\n2 3 0\n")
    pts = "30.3 35.5 65.5 35.3 48.0 55.7 33.5 76.0 62.7 76.0"
    _write(
        meta / "ijbc_name_5pts_score.txt",
        "".join(f"{i}.jpg {pts} 0.{90 + i}\n" for i in range(1, 7)),
    )
    _write(meta / "ijbc_1N_gallery_G1.csv", "TEMPLATE_ID,SUBJECT_ID,FILENAME\n1,100,a.jpg\n")
    _write(meta / "ijbc_1N_gallery_G2.csv", "TEMPLATE_ID,SUBJECT_ID,FILENAME\n3,300,b.jpg\n")
    _write(
        meta / "ijbc_1N_probe_mixed.csv",
        "TEMPLATE_ID,SUBJECT_ID,FILENAME\n2,100,c.jpg\n3,300,d.jpg\n",
    )
    rng = np.random.default_rng(0)
    (tmp_path / "loose_crop").mkdir()
    for i in range(1, 7):
        cv2.imwrite(
            str(tmp_path / "loose_crop" / f"{i}.jpg"),
            rng.integers(0, 255, (96, 96, 3), dtype=np.uint8),
        )
    return tmp_path


def test_ijb_parsing_and_media_pooled_scores(ijb_root):
    meta = ijb_root / "meta"
    names, tids, mids = read_face_tid_mid(meta / "ijbc_face_tid_mid.txt")
    assert names[0] == "1.jpg" and tids.tolist() == [1, 1, 1, 2, 3, 3]
    assert mids.tolist() == [10, 10, 11, 20, 30, 30 + 1]
    t1, t2, same = read_template_pairs(meta / "ijbc_template_pair_label.txt")
    assert same.tolist() == [True, False, False]
    assert read_1n_csv(meta / "ijbc_1N_probe_mixed.csv")[1].tolist() == [100, 300]
    # hand-made image embeddings: template 1 = mean(media 10 = x, media 11 = y) -> (x+y)/√2
    e = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1]], np.float32)
    r = ijb_one_to_one(e, tids, mids, (t1, t2, same))
    assert (r.n_genuine, r.n_impostor) == (1, 2)
    assert r.roc.thresholds[1] == pytest.approx(1.0)  # genuine: (x+y)/√2 · (x+y)/√2
    assert r.auc == 1.0
    g1, g2 = ijb_one_to_many(
        e,
        tids,
        mids,
        {
            "G1": read_1n_csv(meta / "ijbc_1N_gallery_G1.csv"),
            "G2": read_1n_csv(meta / "ijbc_1N_gallery_G2.csv"),
        },
        read_1n_csv(meta / "ijbc_1N_probe_mixed.csv"),
        fpirs=(1.0,),
    )
    assert (g1.n_mated_probes, g1.n_nonmated_probes, g1.cmc.rank(1).k) == (1, 1, 1)
    assert g1.open_set[0].fpir.n == 1


def test_ijb_errors_name_the_file(ijb_root):
    bad = _write(ijb_root / "meta" / "bad_pairs.txt", "1 2 1\n1 x 0\n")
    with pytest.raises(ValueError, match=r"bad_pairs.txt: line 2: field 2 is not an integer"):
        read_template_pairs(bad)
    names, tids, mids = read_face_tid_mid(ijb_root / "meta" / "ijbc_face_tid_mid.txt")
    with pytest.raises(ValueError, match="template id.*have no images.*99"):
        ijb_one_to_one(
            np.eye(6, 3, dtype=np.float32),
            tids,
            mids,
            (np.array([1]), np.array([99]), np.array([True])),
        )


def test_ijb_protocol_end_to_end_with_alignment(ijb_root, tmp_path):
    reports = Ijb(ijb_root, "IJBC", size=32, flip=True).run(pixel_embed)
    assert [r.name for r in reports] == ["ijbc_1to1", "ijbc_1toN_G1", "ijbc_1toN_G2"]
    assert reports[0].n_genuine + reports[0].n_impostor == 3
    raw, tids, _ = Ijb(ijb_root, size=32, flip=True).embed_faces(pixel_embed)
    weighted, _, _ = Ijb(ijb_root, size=32, weight_by_detector_score=True).embed_faces(pixel_embed)
    assert tids.tolist() == [1, 1, 1, 2, 3, 3]
    np.testing.assert_allclose(
        np.linalg.norm(weighted, axis=1) / np.linalg.norm(raw, axis=1),
        [0.91, 0.92, 0.93, 0.94, 0.95, 0.96],
        rtol=1e-5,
    )


def test_verification_bin_protocol(tmp_path):
    from partialfc.data.verification_bin import write_verification_bin

    rng = np.random.default_rng(1)
    faces = [rng.integers(0, 255, (24, 24, 3), dtype=np.uint8) for _ in range(10)]
    images, issame = [], []
    for i in range(10):  # pairs alternate: same image (mirrored) / two different images
        a = faces[i]
        b = a[:, ::-1] if i % 2 == 0 else faces[(i + 3) % 10]
        images += [cv2.imencode(".png", a)[1].tobytes(), cv2.imencode(".png", b)[1].tobytes()]
        issame.append(i % 2 == 0)
    path = tmp_path / "tiny.bin"
    write_verification_bin(path, images, issame)
    (r,) = VerificationBin(path, flip=True, n_folds=5).run(pixel_embed)
    assert r.name == "tiny" and (r.n_genuine, r.n_impostor) == (5, 5)
    # with the flip test a mirrored pair has identical embeddings: score 1, perfect separation
    assert r.auc == 1.0 and r.kfold_accuracy.mean == 1.0
    assert len(r.kfold_accuracy.fold_accuracy) == 5
    assert any("only 5 impostor pairs" in u for u in r.unresolved)


def test_lfw_pairs_over_a_folder(tmp_path):
    rng = np.random.default_rng(2)
    for name, n in [("Ann_A", 2), ("Bob_B", 1), ("Cid_C", 1)]:
        for k in range(1, n + 1):
            p = tmp_path / "img" / name / f"{name}_{k:04d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(p), rng.integers(0, 255, (40, 40, 3), dtype=np.uint8))
    pairs = _write(
        tmp_path / "pairs.txt",
        "2\t1\nAnn_A\t1\t2\nAnn_A\t1\tBob_B\t1\nAnn_A\t2\t2\nBob_B\t1\tCid_C\t1\n",
    )
    (r,) = LfwPairs(pairs, tmp_path / "img", flip=False).run(pixel_embed)
    assert (r.n_genuine, r.n_impostor) == (2, 2)
    assert len(r.kfold_accuracy.fold_accuracy) == 2  # the file's own two folds


def _lfw_with_a_broken_image(tmp_path):
    """8 pairs in 2 folds over a folder; the image of one impostor pair is empty."""
    rng = np.random.default_rng(2)
    for name, n in [("Ann_A", 3), ("Bob_B", 2), ("Cid_C", 1)]:
        for k in range(1, n + 1):
            p = tmp_path / "img" / name / f"{name}_{k:04d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(p), rng.integers(0, 255, (40, 40, 3), dtype=np.uint8))
    broken = tmp_path / "img" / "Cid_C" / "Cid_C_0001.jpg"
    broken.write_bytes(b"")
    genuine = ["Ann_A\t1\t2", "Bob_B\t1\t2", "Ann_A\t1\t3", "Ann_A\t2\t3"]
    impostor = ["Ann_A\t1\tBob_B\t1", "Ann_A\t2\tBob_B\t2", "Ann_A\t3\tBob_B\t1"]
    rows = genuine[:2] + impostor[:2] + genuine[2:] + [impostor[2], "Bob_B\t2\tCid_C\t1"]
    text = "2\t2\n" + "\n".join(rows) + "\n"
    pairs = _write(tmp_path / "pairs.txt", text)
    return pairs


def test_lfw_pairs_skip_bad_leaves_out_the_pairs_of_an_unreadable_image(tmp_path):
    pairs = _lfw_with_a_broken_image(tmp_path)
    with pytest.raises(ValueError, match="Cid_C_0001.jpg: not a decodable image"):
        LfwPairs(pairs, tmp_path / "img", flip=False).run(pixel_embed)
    protocol = LfwPairs(pairs, tmp_path / "img", flip=False)
    protocol.skip_bad = True
    (r,) = protocol.run(pixel_embed)
    source = f"{tmp_path / 'img'}:Cid_C/Cid_C_0001.jpg"
    assert protocol.refused == ((source, "not a decodable image (0 bytes)"),)
    assert "1 unreadable image(s) refused (--skip-bad): 1 of 8 pairs left out" in r.notes
    assert (r.n_genuine, r.n_impostor) == (4, 3)  # the impostor pair Bob_B-Cid_C is gone


def test_eval_command_skip_bad_writes_the_refused_list(tmp_path, capsys):
    """``eval`` on a folder with a broken image used to end in a traceback."""
    import torch

    from partialfc.backbone.io import save_backbone
    from partialfc.cli import main
    from partialfc.models import build_model

    pairs = _lfw_with_a_broken_image(tmp_path)
    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 8, "input_size": 28}}
    torch.manual_seed(0)
    save_backbone(build_model(config["name"], **config["kwargs"]).eval(), config, tmp_path / "m")
    args = ["eval", str(tmp_path / "m"), "--out", str(tmp_path / "o"), "--lfw-pairs", str(pairs)]
    args += ["--lfw-images", str(tmp_path / "img")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("partialfc eval: ") and "Cid_C_0001.jpg: not a decodable image" in err
    assert main([*args, "--skip-bad"]) == 0
    listed = (tmp_path / "o" / "refused.tsv").read_text().splitlines()
    assert listed == [
        "file\treason",
        f"{tmp_path / 'img'}:Cid_C/Cid_C_0001.jpg\tnot a decodable image (0 bytes)",
    ]
    assert (
        f"1 file(s) refused, listed in {tmp_path / 'o' / 'refused.tsv'}" in capsys.readouterr().err
    )
    assert "1 of 8 pairs left out" in (tmp_path / "o" / "report.md").read_text()


def test_eval_skip_bad_needs_a_protocol_that_reads_image_files(tmp_path, capsys):
    from partialfc.cli import main

    args = ["eval", str(tmp_path), "--out", str(tmp_path / "o"), "--omniglot", "--skip-bad"]
    assert main(args) == 2
    assert "--skip-bad applies to --lfw-pairs" in capsys.readouterr().err


def test_orl_protocol_and_report_files(shared_data, tmp_path):
    reports = evaluate_model(pixel_embed, [Orl(shared_data / "orl_faces")], tmp_path, log=None)
    verification, closed, open_set = reports
    assert (verification.n_genuine, verification.n_impostor) == (1800, 78000)
    assert closed.n_mated_probes == 360 and closed.n_gallery_identities == 40
    assert closed.cmc.rank(1).rate > 0.5  # raw pixels already identify most ORL faces
    assert (open_set.n_mated_probes, open_set.n_nonmated_probes) == (180, 200)
    assert [p.target_fpir for p in open_set.open_set] == [1e-2, 1e-1]
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["results"][0]["n_impostor"] == 78000
    md = (tmp_path / "report.md").read_text()
    assert "1800 genuine / 78000 impostor pairs" in md and "not reported: only 78000" in md
    assert (tmp_path / "roc.png").stat().st_size > 0 and (tmp_path / "cmc.png").exists()


def test_omniglot_protocols_on_bundled_data():
    (one_shot,) = OmniglotOneShot().run(pixel_embed)
    assert one_shot.cmc.n_probes == 400 and one_shot.cmc.rank(20).rate == 1.0
    assert one_shot.cmc.rank(1).rate > 3 / 20  # well above 1/20 chance
    pairs, ident = OmniglotOpenSet(max_images=2000, fars=(1e-4, 1e-2)).run(pixel_embed)
    assert pairs.n_genuine == 100 * 190 and pairs.n_genuine + pairs.n_impostor == 2000 * 1999 // 2
    assert [t.allowed_false_accepts for t in pairs.tar_at_far] == [198, 19800]
    assert all(t.far.k <= t.allowed_false_accepts for t in pairs.tar_at_far)
    # identification: 50 of the 100 classes enrolled by their first drawing; the other 19
    # drawings of each are mated probes, the 50 x 20 drawings of the rest non-mated probes
    assert ident.n_gallery_identities == 50
    assert ident.n_mated_probes == 50 * 19 and ident.n_nonmated_probes == 50 * 20


def test_omniglot_one_shot_gallery_rank1_equals_brute_force():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 4)
    emb = rng.normal(size=(labels.size, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    report = one_shot_gallery_identification("toy", emb, labels)
    gallery_idx = [0, 8, 16]  # first image of classes 0, 2, 4
    hits = total = 0
    for i in range(labels.size):
        if i in gallery_idx or labels[i] % 2:
            continue
        best = max(gallery_idx, key=lambda g: float(emb[i] @ emb[g]))
        hits += labels[best] == labels[i]
        total += 1
    assert report.n_mated_probes == total == 9
    assert report.cmc.rank(1).rate == pytest.approx(hits / total)
    assert report.n_nonmated_probes == 12


def test_eval_command_with_a_stand_in_embedder(monkeypatch, tmp_path, shared_data):
    from partialfc.cli import main

    class FakeEmbedder:
        @classmethod
        def load(cls, path, device=None, preprocessing="auto"):
            assert path == "model.onnx" and device == "cpu" and preprocessing == "auto"
            return cls()

        spec = types.SimpleNamespace(input_size=(20, 20))

        def embed_raw(self, images, flip=False):
            assert images.shape[1:3] == (20, 20)  # resized to the model's input size
            return pixel_embed(images)

    module = types.ModuleType("partialfc.backbone.embedder")
    module.Embedder = FakeEmbedder
    module.PREPROCESSING, module.PREPROCESSING_HELP = PREPROCESSING, PREPROCESSING_HELP
    monkeypatch.setitem(sys.modules, "partialfc.backbone.embedder", module)
    out = tmp_path / "report"
    assert (
        main(["eval", "model.onnx", "--orl", str(shared_data / "orl_faces"), "--out", str(out)])
        == 0
    )
    assert json.loads((out / "results.json").read_text())["meta"]["model"] == "model.onnx"
    assert main(["eval", "model.onnx", "--out", str(out)]) == 2  # no protocol chosen


def test_shift_averaging_means_the_normalised_embeddings_of_five_copies():
    from partialfc.eval.embedding import shift_image_batch, with_shift_averaging

    images = np.zeros((2, 5, 5), dtype=np.uint8)
    images[0, 2, 2] = 200
    images[1, 0, 4] = 100
    moved = shift_image_batch(images, 1, -1)  # one row down, one column left
    assert moved[0, 3, 1] == 200 and moved[0].sum() == 200
    assert moved[1, 1, 3] == 100 and moved[1].sum() == 100
    np.testing.assert_array_equal(shift_image_batch(images, 0, -4)[1, 0, 0], 100)
    assert shift_image_batch(images, 0, 4)[1].sum() == 0  # moved out of the frame

    def embed(batch):  # 2-d embedding: ink centre of mass (row, column), plus one
        rows, cols = np.indices(batch.shape[1:])
        mass = batch.reshape(len(batch), -1).astype(np.float64).sum(1) + 1e-9
        r = (batch * rows).reshape(len(batch), -1).sum(1) / mass
        c = (batch * cols).reshape(len(batch), -1).sum(1) / mass
        return np.stack([r + 1, c + 1], 1)

    averaged = with_shift_averaging(embed, 1)(images)
    expected = []
    for image in images:
        total = np.zeros(2)
        for dy, dx in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
            e = embed(shift_image_batch(image[None], dy, dx))[0]
            total += e / np.linalg.norm(e)
        expected.append(total / 5)
    np.testing.assert_allclose(averaged, np.array(expected), rtol=1e-6)
    assert with_shift_averaging(embed, 0) is embed
    with pytest.raises(ValueError, match="shift_px must be >= 0"):
        with_shift_averaging(embed, -1)
    with pytest.raises(ValueError, match="does not fit 5x5"):
        shift_image_batch(images, 5, 0)


def test_an_ensemble_scores_the_mean_of_its_models_cosines():
    from partialfc.eval.embedding import ensemble_embed_fn

    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, size=(7, 4, 4)).astype(np.uint8)
    proj = [rng.normal(size=(16, d)) for d in (3, 5)]  # two "models" of different widths

    def model(p):
        return lambda batch: batch.reshape(len(batch), -1).astype(np.float64) @ p

    fused = ensemble_embed_fn([model(p) for p in proj])(images)
    assert fused.shape == (7, 8) and fused.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(fused, axis=1), 1.0, rtol=1e-6)
    cosines = []
    for p in proj:
        e = model(p)(images)
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        cosines.append(e @ e.T)
    np.testing.assert_allclose(fused @ fused.T, (cosines[0] + cosines[1]) / 2, atol=1e-6)
    alone = model(proj[0])
    assert ensemble_embed_fn([alone]) is alone  # one model: its own raw embeddings
    with pytest.raises(ValueError, match="at least one model"):
        ensemble_embed_fn([])


def test_eval_command_fuses_several_models(monkeypatch, tmp_path, shared_data):
    from partialfc.cli import main

    rng = np.random.default_rng(1)
    proj = {"a.onnx": rng.normal(size=(400, 6)), "b.onnx": rng.normal(size=(400, 6))}
    loaded = []

    class FakeEmbedder:
        def __init__(self, p):
            self.p = p

        @classmethod
        def load(cls, path, device=None, preprocessing="auto"):
            loaded.append(path)
            return cls(proj[path])

        spec = types.SimpleNamespace(input_size=(20, 20))

        def embed_raw(self, images, flip=False):
            return images.reshape(len(images), -1).astype(np.float64) @ self.p

    module = types.ModuleType("partialfc.backbone.embedder")
    module.Embedder = FakeEmbedder
    module.PREPROCESSING, module.PREPROCESSING_HELP = PREPROCESSING, PREPROCESSING_HELP
    monkeypatch.setitem(sys.modules, "partialfc.backbone.embedder", module)
    orl = ["--orl", str(shared_data / "orl_faces")]
    aucs = {}
    for models in (["a.onnx"], ["b.onnx"], ["a.onnx", "b.onnx"]):
        out = tmp_path / "_".join(models)
        assert main(["eval", *models, *orl, "--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        assert results["meta"]["model"] == (models[0] if len(models) == 1 else models)
        aucs[len(models), models[0]] = [r["auc"] for r in results["results"] if "auc" in r]
    assert loaded == ["a.onnx", "b.onnx", "a.onnx", "b.onnx"]
    fused, a, b = aucs[2, "a.onnx"], aucs[1, "a.onnx"], aucs[1, "b.onnx"]
    assert fused and fused != a and fused != b  # the fused scores are neither model's
