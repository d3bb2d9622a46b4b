"""The ``processor`` application: tenants' remote datasets, loaded, preprocessed and encoded on
the server's CPUs (``/api/v1/processor``)."""
