"""Web plumbing every deployment's FastAPI app shares: authentication and request signing,
the error model and request ids, body reading and JSON encoding, the OpenAPI request bodies."""
