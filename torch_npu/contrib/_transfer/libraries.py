"""Client-library shims: inside these functions ``torch.cuda.is_available()`` tells the truth.

After ``transfer_to_npu``, ``torch.cuda.is_available()`` answers for the NPU. Some library
functions use it to pick CUDA-only code (bitsandbytes, flash-attn, CUDA RNG state, TF32),
which would then break; while one of them runs, the original (CUDA) answer is restored so
they take their NPU or CPU path. Same libraries, minimum versions and functions as the real
tool's list.
"""
import functools
import importlib
import importlib.metadata

import torch

# package -> (minimum version, [(module, attribute path), ...])
LIBRARY_APIS = {
    "transformers": ("4.32.0", [
        ("transformers.training_args", "TrainingArguments.__post_init__"),
        ("transformers.trainer", "Trainer._load_rng_state"),
        ("transformers.trainer", "Trainer._save_rng_state"),
        ("transformers.trainer_utils", "TrainerMemoryTracker.start"),
        ("transformers.utils.import_utils", "is_torch_cuda_available"),
        ("transformers.utils.import_utils", "is_mamba_ssm_available"),
        ("transformers.utils.import_utils", "is_causal_conv1d_available"),
        ("transformers.utils.import_utils", "is_torch_bf16_gpu_available"),
        ("transformers.utils.import_utils", "is_torch_tf32_available"),
        ("transformers.utils.import_utils", "is_bitsandbytes_available"),
        ("transformers.utils.import_utils", "is_flash_attn_2_available"),
    ]),
    "trl": ("0.7.1", [
        ("trl.import_utils", "is_bitsandbytes_available"),
        ("trl.trainer.utils", "get_kbit_device_map"),
    ]),
    "peft": ("0.5.0", [
        ("peft.utils.other", "infer_device"),
    ]),
    "accelerate": ("0.22.0", [
        ("accelerate.commands.env", "env_command"),
        ("accelerate.launchers", "notebook_launcher"),
        ("accelerate.commands.config.default", "write_basic_config"),
        ("accelerate.utils.environment", "override_numa_affinity"),
        ("accelerate.utils.modeling", "get_max_memory"),
        ("accelerate.utils.megatron_lm", "initialize"),
        ("accelerate.utils.bnb", "load_and_quantize_model"),
        ("accelerate.utils.bnb", "get_quantized_model_device_map"),
        ("accelerate.utils.imports", "is_cuda_available"),
        ("accelerate.test_utils.scripts.test_script", "training_check"),
        ("accelerate.test_utils.scripts.test_cli", "main"),
        ("accelerate.test_utils.scripts.external_deps.test_peak_memory_usage", "TorchTracemalloc.__enter__"),
        ("accelerate.test_utils.scripts.external_deps.test_peak_memory_usage", "TorchTracemalloc.__exit__"),
        ("accelerate.state", "PartialState._prepare_backend"),
    ]),
}


def _version_tuple(text):
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _with_cuda_answer(fn, cuda_is_available):
    @functools.wraps(fn)
    def shim(*args, **kwargs):
        patched = torch.cuda.is_available
        torch.cuda.is_available = cuda_is_available
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.is_available = patched

    return shim


def install(cuda_is_available):
    """Wrap the listed functions of the installed libraries; returns the names wrapped."""
    wrapped = []
    for package, (minimum, apis) in LIBRARY_APIS.items():
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        if _version_tuple(version) < _version_tuple(minimum):
            continue
        for module_name, path in apis:
            try:
                owner = importlib.import_module(module_name)
                *outer, attr = path.split(".")
                for part in outer:
                    owner = getattr(owner, part)
                fn = getattr(owner, attr)
            except Exception:  # an optional module of that library (missing extra, older layout)
                continue
            setattr(owner, attr, _with_cuda_answer(fn, cuda_is_available))
            wrapped.append(f"{module_name}.{path}")
    return wrapped
