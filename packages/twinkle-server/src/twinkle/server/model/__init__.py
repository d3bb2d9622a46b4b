"""The model deployment: tenants' adapters on one shared base model (protocol, operations, fair fused scheduling, Ray Serve wiring)."""
