"""The data packages' public surfaces are exactly what their ``__init__`` promises."""

import importlib
import inspect

import pytest

DATA_FORMAT = {
    "IGNORE_INDEX",
    "ContentPart",
    "ImagePart",
    "InputFeature",
    "Message",
    "Role",
    "SampleResponse",
    "SampledSequence",
    "SamplingParams",
    "TextPart",
    "Trajectory",
}
SURFACES = {
    "twinkle_client.data_format": DATA_FORMAT,
    "twinkle.data_format": DATA_FORMAT,
    "twinkle.template": {
        "IGNORE_INDEX",
        "TRUNCATION_STRATEGIES",
        "Qwen3Template",
        "Qwen3_5Template",
        "Template",
        "get_template",
        "list_templates",
        "register_template",
    },
    "twinkle.preprocessor": {
        "AlpacaProcessor",
        "CompetitionMathGRPOProcessor",
        "CompetitionMathProcessor",
        "CountdownProcessor",
        "DataFilter",
        "EmojiDPOProcessor",
        "Filter",
        "GSM8KProcessor",
        "Mapper",
        "MessagesProcessor",
        "MissingFieldError",
        "Preprocessor",
        "SelfCognitionProcessor",
        "get_preprocessor",
        "list_preprocessors",
        "register_preprocessor",
    },
    "twinkle.dataset": {
        "BUILTIN_DATASETS",
        "Dataset",
        "DatasetMeta",
        "IterableDataset",
        "IterablePackingDataset",
        "LazyDataset",
        "PackingDataset",
    },
    "twinkle.dataloader": {"DataLoader"},
    "twinkle.processor": {
        "InputProcessor",
        "get_processor",
        "list_processors",
        "register_processor",
    },
}


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_all_is_the_public_surface(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == SURFACES[module]
    for name in mod.__all__:
        assert hasattr(mod, name)


def test_seed_signatures():
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.processor import InputProcessor
    from twinkle.template import Template

    def params(obj):
        return list(inspect.signature(obj).parameters)

    assert params(DatasetMeta)[:5] == ["dataset_id", "subset_name", "split", "data_slice", "data"]
    assert params(Dataset) == ["dataset_meta"]
    assert params(Dataset.map)[1:3] == ["preprocessor", "init_args"]
    # timeout= as the seed writes it for twinkle_client.dataset (a remote call's limit; accepted
    # locally so scripts swap the import both ways).
    assert params(Dataset.encode)[1:] == [
        "batched",
        "num_proc",
        "load_from_cache_file",
        "timeout",
        "add_generation_prompt",
    ]
    assert params(DataLoader) == [
        "dataset",
        "batch_size",
        "shuffle",
        "seed",
        "drop_last",
        "num_workers",
    ]
    assert params(Template)[:3] == ["model_id", "max_length", "truncation_strategy"]
    assert params(InputProcessor) == ["padding_side", "pad_token_id", "return_tensors"]


def test_importing_the_data_packages_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, twinkle.dataset, twinkle.dataloader, twinkle.processor, twinkle.template;"
        "import twinkle_client.data_format;"
        "print('torch' in sys.modules, 'datasets' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
