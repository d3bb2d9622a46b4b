"""The ``sampler`` application: sampling with tenants' adapters, by ``twinkle://`` checkpoint path."""
