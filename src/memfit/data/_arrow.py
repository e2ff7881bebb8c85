"""A folder written by `datasets`' `save_to_disk`, read as a stream of texts.

The Dataset's Arrow files are memory-mapped by `datasets.load_from_disk`, and read here a batch
of rows at a time (`Dataset.iter`), one column only, so the pass never holds the data set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.data._source import ROWS_PER_BATCH, TextSource, _missing_field, rows_of_batches
from memfit.errors import BadInputError


def load_saved(p: Path, split: str | None) -> Any:
    """The `datasets.Dataset` saved in folder `p` (a split of a DatasetDict, named by `split`)."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            "Reading a saved Dataset needs datasets: `pip install memfit[data]`."
        ) from e
    if not ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        raise BadInputError(
            f"The folder {str(p)!r} is not a Dataset saved with save_to_disk (it has no "
            "dataset_info.json or dataset_dict.json). Pass a file, or the folder "
            "Dataset.save_to_disk wrote."
        )
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if split is None or split not in ds:
            given = "No split was named" if split is None else f"There is no split {split!r}"
            raise BadInputError(
                f"{given} for the DatasetDict in {p.name}; its splits are "
                f"{', '.join(repr(s) for s in splits)}. Pick one with split= (--split)."
            )
        return ds[split]
    if split is not None:
        raise BadInputError(
            f"split={split!r} does not apply: {p.name} holds one Dataset, not a DatasetDict. "
            "Leave it out."
        )
    return ds


def open_saved_dataset(p: Path, field: str, split: str | None) -> TextSource:
    ds = load_saved(p, split)
    if field not in ds.column_names:
        raise _missing_field(p, "the Dataset", field, list(ds.column_names))
    src = TextSource(path=p, format="datasets", field=field, unit="row", total=len(ds))
    batches = (b[field] for b in ds.select_columns([field]).iter(batch_size=ROWS_PER_BATCH))
    src._rows = rows_of_batches(p, src, batches, field)
    return src
