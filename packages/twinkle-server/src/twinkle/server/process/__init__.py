"""Process plumbing: the `twinkle-server` command line, launching Ray and Serve from the YAML,
the in-process local server, preflight checks, placement, status and the replica's threads."""
