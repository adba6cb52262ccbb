"""The backbone as train, eval, deploy and the tools see it: one place for each job.

* :mod:`partialfc.backbone.io` — the stored forms (``backbone.safetensors`` + ``model.json``
  in checkpoints, + ``preprocessing.json`` in exports), loading without unpickling, the newest
  checkpoint of a run folder;
* :mod:`partialfc.backbone.spec` — :class:`PreprocessingSpec`, how images become input;
* :mod:`partialfc.backbone.pixels` — the pixel normalisation ``(x / 255 - mean) / std``;
* :mod:`partialfc.backbone.embedding` — the embedding loop and the NumPy L2 normalisation;
* :mod:`partialfc.backbone.embedder` — :class:`Embedder`: images in, embeddings out, from any
  stored form (PyTorch or ONNX, an InsightFace model pack folder).
* :mod:`partialfc.backbone.model_zoo` — InsightFace model-zoo recognition ONNX: which graphs,
  with what preprocessing.
* :mod:`partialfc.backbone.fingerprint` — the SHA-256 identifying a backbone's weights, the
  same in every stored form (calibrated thresholds record it).

Imports are lazy (``from partialfc.backbone.io import ...``): nothing heavy loads with the
package.
"""
