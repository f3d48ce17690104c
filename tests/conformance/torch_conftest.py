# pytest's conftest.py for PyTorch's own test files (run_conformance.sh links it into the torch run root).
#
# The carried test files come from PyTorch's repository, which is newer than the installed wheel: a file may
# import names that the wheel's torch.testing._internal does not have yet, and then none of its tests run.
# Before the files are collected, each such name is supplied: from the module of the installed torch that has
# it (a name that moved, e.g. between common_cuda and common_utils), else from NEW_NAMES below (a name added
# upstream: defined as upstream does, or as the neutral value that makes its tests skip). Nothing else in the
# files changes. A test that needs more than the name fails natively too, and the runner compares only tests
# that pass natively. What was supplied, and what is still missing, is printed once per process.
import ast
import importlib
import importlib.util
import os
import pathlib
import sys

import torch

HELPER_MODULES = [
    "torch.testing._internal.common_utils",
    "torch.testing._internal.common_cuda",
    "torch.testing._internal.common_device_type",
    "torch.testing._internal.common_dtype",
]


def _identity_decorator(fn=None, *args, **kwargs):
    return fn if callable(fn) else (lambda f: f)


def _keep_fp32_precision(fn):
    # recover_orig_fp32_precision upstream: the test may change TF32 settings; they are restored after it.
    def run(*args, **kwargs):
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    return run


def _cuda_python_error_check(result):
    # Upstream's helper for cuda-python calls, which answer (error, values...).
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error: {err}")
    return rest[0] if len(rest) == 1 else rest


NEW_NAMES = {
    "TEST_CUDAMALLOCASYNC": lambda: torch.cuda.is_available()
    and torch.cuda.get_allocator_backend() == "cudaMallocAsync",
    "EXPANDABLE_SEGMENTS": lambda: "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "TEST_CUDA_PYTHON_BINDINGS": lambda: torch.cuda.is_available()
    and importlib.util.find_spec("cuda") is not None
    and importlib.util.find_spec("cuda.bindings") is not None,
    "PLATFORM_SUPPORTS_GREEN_CONTEXT": lambda: False,  # no torch.cuda.green_contexts in this wheel
    "IS_JETSON": lambda: False,
    "MI200_ARCH": lambda: ("gfx90a", "gfx942"),
    "MI300_ARCH": lambda: ("gfx942",),
    "skipIfRocmArch": lambda: (lambda arch: (lambda f: f)),  # not ROCm: never skips
    "gcIfJetson": lambda: _identity_decorator,
    "setBlasBackendsToDefaultFinally": lambda: _identity_decorator,
    "recover_orig_fp32_precision": lambda: _keep_fp32_precision,
    "cuda_python_error_check": lambda: _cuda_python_error_check,
}


def _imports(path):
    """(module, name) for every `from torch... import name` of the file."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return []
    return [(node.module, a.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch")
            for a in node.names]


def _targets(args):
    """The carried test files this pytest run collects (its path arguments; all of them when it names none).
    Only their imports are looked at: importing another file's helpers (common_cuda makes a CUDA tensor when
    imported) would initialize CUDA in runs that need a process where it never was."""
    here = pathlib.Path(os.path.abspath(__file__)).parent
    every = sorted((here / "test").glob("test_*.py"))
    paths = [pathlib.Path(os.path.abspath(a.split("::")[0])) for a in args if not a.startswith("-")]
    if not paths:
        return every
    return [f for f in every if any(f == p or p in f.parents for p in paths)]


def _supply(files):
    supplied, missing = [], []
    for path in files:
        for module_name, name in _imports(path):
            try:
                module = importlib.import_module(module_name)
            except Exception:  # a module this wheel lacks: the file fails to import, as it would
                continue
            if hasattr(module, name):
                continue
            try:
                importlib.import_module(f"{module_name}.{name}")  # a submodule
                continue
            except Exception:
                pass
            source = next((m for m in HELPER_MODULES
                           if m != module_name and hasattr(importlib.import_module(m), name)), None)
            if source:
                setattr(module, name, getattr(importlib.import_module(source), name))
                supplied.append(f"{module_name}.{name} (from {source})")
            elif name in NEW_NAMES:
                setattr(module, name, NEW_NAMES[name]())
                supplied.append(f"{module_name}.{name} (defined here)")
            else:
                missing.append(f"{module_name}.{name} ({path.name})")
    return supplied, missing


def pytest_configure(config):
    supplied, missing = _supply(_targets(config.args))
    if supplied or missing:
        print(f"torch_conftest: torch {torch.__version__}; supplied {len(supplied)}: {', '.join(supplied) or '-'};"
              f" still missing {len(missing)}: {', '.join(sorted(set(missing))) or '-'}", file=sys.stderr)
