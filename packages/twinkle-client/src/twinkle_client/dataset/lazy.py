"""``LazyDataset`` on the server's processor."""

from __future__ import annotations

from twinkle_client.dataset.remote import Dataset


class LazyDataset(Dataset):
    """The remote counterpart of ``twinkle.dataset.LazyDataset``, so a script runs with either
    import.

    A remote dataset only ever runs registered preprocessors on the server, which keeps the rows
    in its own table; when to encode is the server's business, and items arrive encoded either
    way. For a custom (code) preprocessor over a big or image dataset, use
    ``twinkle.dataset.LazyDataset`` locally: its rows are converted and encoded as they are read.
    """
