"""Everything of the Tinker-compatible API in one place, in four layers.

- routers (:mod:`.routers`): one module per endpoint group (client, training, weights,
  weights_external, sampling, futures, sessions, admin) of module-level FastAPI handlers, each
  taking the caller and its request as the SDK's own type;
- protocol (:mod:`.request_fields`): the SDK request type of each JSON endpoint, and the one
  place where a body is read as it (unknown fields from a newer SDK dropped and logged once);
- service: plain functions over the shared :class:`~.api.TinkerApi` (state, backends,
  :mod:`.futures`): :mod:`.training`, :mod:`.custom_loss`, :mod:`.extensions`,
  :mod:`.optimizers`, :mod:`.stability`, :mod:`.sampling`, :mod:`.session_futures`,
  :mod:`.weights`, :mod:`.weights_external`, :mod:`.inflight`, :mod:`.sessions`, :mod:`.admin`,
  :mod:`.traces`; :mod:`.models` holds the base-model and checkpoint facts they look up;
- wire: :mod:`.wire` (protobuf bodies), :mod:`.wire_json` (the JSON of SDKs before 0.27),
  :mod:`.convert` and :mod:`.sample_fields` (Tinker shapes <-> Twinkle payloads),
  :mod:`.images` (image chunks), :mod:`.datum` (``InputFeature`` <-> ``tinker.types.Datum``).

The model deployment's Tinker-only operations live with that deployment
(:mod:`twinkle.server.model.tinker_ops`, :mod:`twinkle.server.model.tinker_weights_ops`); this
package reaches the model only through its protocol and the gateway's backends.
"""
