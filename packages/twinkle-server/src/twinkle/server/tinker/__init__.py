"""Everything of the Tinker-compatible API in one place.

- ``routes``: the endpoints the unmodified ``tinker`` SDK calls (thin FastAPI routes);
- ``api``: their shared logic (authentication, sequenced calls, checkpoints);
- ``futures``: Tinker's futures (ordered per model, retried, long-polled);
- ``wire``: the protobuf bodies; ``convert``: Tinker shapes <-> Twinkle features and configs;
- ``datum``: ``InputFeature`` <-> ``tinker.types.Datum``;
- ``models``, ``sampling``, ``weights``: model facts, sampling, weights and hub publishing;
- ``model_ops``: the model deployment's Tinker-only operations (registered explicitly by the
  deployment, over the backend protocol; no backend is imported here).
"""
