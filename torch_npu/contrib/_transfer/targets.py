"""What ``transfer_to_npu`` rewrites: the real tool's function lists (torch_npu 2.13.0)."""

# torch.<name>: factories and loaders that take a device / map_location.
TORCH_FUNCTIONS = (
    "logspace", "randint", "hann_window", "rand", "full_like", "ones_like", "rand_like", "randperm",
    "arange", "frombuffer", "normal", "_empty_per_channel_affine_quantized", "empty_strided",
    "empty_like", "scalar_tensor", "tril_indices", "bartlett_window", "ones", "sparse_coo_tensor",
    "randn", "kaiser_window", "tensor", "triu_indices", "as_tensor", "zeros", "randint_like", "full",
    "eye", "_sparse_csr_tensor_unsafe", "empty", "_sparse_coo_tensor_unsafe", "blackman_window",
    "zeros_like", "range", "sparse_csr_tensor", "randn_like", "from_file", "_cudnn_init_dropout_state",
    "_empty_affine_quantized", "linspace", "hamming_window", "empty_quantized", "_pin_memory", "load",
    "set_default_device", "get_device_module", "sparse_compressed_tensor",
)

TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros", "to",
                  "pin_memory")

MODULE_METHODS = ("to", "to_empty")

# torch.cuda.<name> (after torch.cuda has become torch.npu's functions).
CUDA_FUNCTIONS = (
    "get_device_properties", "get_device_name", "get_device_capability", "list_gpu_processes", "set_device",
    "synchronize", "mem_get_info", "memory_stats", "memory_summary", "memory_allocated", "max_memory_allocated",
    "reset_max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_max_memory_cached",
    "reset_peak_memory_stats", "default_stream", "can_device_access_peer", "current_stream", "utilization",
    "set_per_process_memory_fraction", "caching_allocator_alloc", "get_rng_state", "set_rng_state",
)

# Modules of torch.cuda that take the attributes of their torch.npu counterparts.
CUDA_MODULES = (
    ("cuda", "torch_npu.npu"),
    ("cuda.amp", "torch_npu.npu.amp"),
    ("cuda.random", "torch_npu.npu.random"),
    ("cuda.amp.autocast_mode", "torch_npu.npu.amp.autocast_mode"),
    ("cuda.amp.common", "torch_npu.npu.amp.common"),
    ("cuda.amp.grad_scaler", "torch_npu.npu.amp.grad_scaler"),
)

# "module:attribute" callables (functions, or a class's __init__ / __new__) whose device
# arguments are rewritten; missing ones (optional subsystems) are skipped.
DEVICE_CALLABLES = (
    "torch.fft:fftfreq",
    "torch.fft:rfftfreq",
    "torch.amp:custom_fwd",
    "torch.amp:custom_bwd",
    "torch:get_autocast_dtype",
    "torch:set_autocast_dtype",
    "torch.amp.autocast_mode:autocast.__init__",
    "torch.utils._device:DeviceContext.__init__",
    "torch.distributed.device_mesh:DeviceMesh.__init__",
    "torch.distributed.device_mesh:init_device_mesh",
    "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.__init__",
    "torch.distributed.pipelining.stage:PipelineStage.__init__",
    "torch.distributed.pipelining.stage:build_stage",
    "torch.nn.parallel:DistributedDataParallel.__init__",
    "torch.distributed:ProcessGroup._get_backend",
    "torch.profiler.profiler:_KinetoProfile.export_memory_timeline",
    "torch.utils.cpp_extension:include_paths",
)

# Collective-group constructors whose backend string goes nccl -> hccl.
BACKEND_CALLABLES = (
    "torch.distributed:init_process_group",
    "torch.distributed.distributed_c10d:init_process_group",
    "torch.distributed.distributed_c10d:_new_group_with_tag",
)

# Modules that may hold their own reference to torch.utils._triton.has_triton or
# to inductor's get_gpu_type (patched only when already imported).
TRITON_HOLDERS = (
    "torch.utils._triton", "torch._inductor.utils", "torch._dynamo.utils", "torch._inductor.codegen.common",
    "torch._inductor.runtime.hints", "torch._inductor.scheduler", "torch._inductor.graph",
)
