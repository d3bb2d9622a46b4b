"""The test tree. A package so that pytest puts the checkout, not ``tests/``, on ``sys.path``:
``tests/twinkle`` would otherwise join the ``twinkle`` namespace (``pkgutil.extend_path``)."""
