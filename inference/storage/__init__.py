"""Saving and loading posteriors as data, never code: a manifest, JSON and a tensor file read with
``torch.load(weights_only=True)``, every path confined to the folder, nothing unpickled.

* :mod:`.posterior_io` — ``save_posterior`` / ``load_posterior`` and the registry of posterior kinds;
* :mod:`.save_files` — the file format: manifest, checksums, size limits, clear errors;
* :mod:`.net_spec` — the description of the network that rebuilds it on load.
"""
