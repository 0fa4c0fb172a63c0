"""Lets SGLang 0.5.23's real `sglang.bench_serving` run on a test host without torch.

Test code only. The load generator itself (`sglang/benchmark/serving.py`: argument
parsing, the random-ids dataset, the request loop against `/generate`, the metrics and
the JSONL result) runs unchanged from the wheel. Only imports change:

- `sglang`, `sglang.srt`, `sglang.srt.utils` and `sglang.srt.disaggregation` are entered
  without running their `__init__.py`, which import torch and the GPU stack;
- two modules the benchmark imports but never calls on that path get stand-ins:
  `sglang.srt.disaggregation.utils` (only `--fake-prefill` reads its constant) and the
  Hugging Face `datasets` package (only the mmmu and longbench datasets load from it).

Installed into the bench venv's site-packages with a `.pth` line that imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

BARE_PACKAGES = {"sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"}
STAND_INS: dict[str, dict[str, object]] = {
    "sglang.srt.disaggregation.utils": {"FAKE_BOOTSTRAP_HOST": "2.2.2.2"},  # 0.5.23's value
    "datasets": {"load_dataset": None},
}


class BareImports(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in STAND_INS:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname not in BARE_PACKAGES:
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None:
            return None
        bare = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        bare.submodule_search_locations = real.submodule_search_locations
        bare.origin = real.origin
        return bare

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        for name, value in STAND_INS.get(module.__name__, {}).items():
            setattr(module, name, value)


sys.meta_path.insert(0, BareImports())
