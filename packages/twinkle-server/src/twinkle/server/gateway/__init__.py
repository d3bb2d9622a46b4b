"""The gateway deployment: sessions, runs, checkpoints and the routes of both APIs in front of the model and sampler deployments."""
