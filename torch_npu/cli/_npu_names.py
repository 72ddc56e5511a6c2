"""What the CUDA constructs map to on the NPU (facts of torch_npu 2.13.0)."""

# torch_npu.npu.__all__ (144 names) plus the submodules a CUDA script reaches through
# torch.cuda.<name>: `torch.cuda.X` -> `torch.npu.X` is a safe rewrite exactly for these.
NPU_NAMES = frozenset("""
    BFloat16Storage BFloat16Tensor BoolStorage BoolTensor ByteStorage ByteTensor CharStorage
    CharTensor CubeMathType DoubleStorage DoubleTensor Event ExternalEvent ExternalStream
    FloatStorage FloatTensor HalfStorage HalfTensor IntStorage IntTensor LongStorage LongTensor
    MemPool NPUGraph NPUPluggableAllocator NpuGraphOpHandler ShortStorage ShortTensor Stream
    StreamContext SyncLaunchStream are_compatible_impl_enabled caching_allocator_alloc
    caching_allocator_delete can_device_access_peer change_current_allocator check_uce_in_memory
    clear_npu_overflow_flag config conv current_blas_handle current_device current_stream
    default_stream device device_count device_of disable_deterministic_with_backward empty_cache
    empty_virt_addr_cache enable_deterministic_with_backward finalize_dump get_allocator_backend
    get_amp_supported_dtype get_autocast_dtype get_device_capability get_device_limit
    get_device_name get_device_properties get_mm_bmm_format_nd get_npu_overflow_flag
    get_per_process_memory_fraction get_rng_state get_rng_state_all get_stream_limit
    get_sync_debug_mode get_task_queue_enable graph graph_pool_handle graph_task_group_begin
    graph_task_group_end graph_task_update_begin graph_task_update_end host_empty_cache
    host_memory_stats host_memory_stats_as_nested_dict init init_dump initial_seed ipc_collect
    is_autocast_enabled is_available is_bf16_supported is_current_stream_capturing is_initialized
    is_jit_compile_false make_graphed_callables manual_seed manual_seed_all matmul
    max_memory_allocated max_memory_cached max_memory_reserved mem_get_info memory_allocated
    memory_cached memory_reserved memory_snapshot memory_stats memory_stats_as_nested_dict
    memory_summary mstx npurt obfuscation_calculate obfuscation_finalize obfuscation_initialize
    register_npu_graph_handler reset_accumulated_host_memory_stats reset_accumulated_memory_stats
    reset_max_memory_allocated reset_max_memory_cached reset_peak_host_memory_stats
    reset_peak_memory_stats reset_stream_limit restart_device seed seed_all set_aoe
    set_autocast_dtype set_autocast_enabled set_compile_mode set_deterministic_level set_device
    set_device_limit set_dump set_mm_bmm_format_nd set_op_timeout_ms set_option
    set_per_process_memory_fraction set_rng_state set_rng_state_all set_stream set_stream_limit
    set_sync_debug_mode set_task_queue_enable stop_device stream stress_detect
    super_kernel_scope_begin super_kernel_scope_end synchronize use_compatible_impl use_mem_pool
    utilization
""".split()) | {"amp", "random", "memory", "streams", "utils", "default_generators"}

# torch.cuda names with a differently named NPU counterpart (still a safe rewrite).
RENAMED = {"CUDAGraph": "NPUGraph", "CUDAPluggableAllocator": "NPUPluggableAllocator"}

# torch.cuda names with no NPU counterpart, and what to do instead.
NO_COUNTERPART = {
    "nvtx": "torch.npu.mstx (mark / range_start / range_end)",
    "jiterator": "a Python/ATen implementation (no runtime kernel compilation on the NPU)",
    "cudart": "no NPU equivalent; use torch.npu APIs",
    "get_arch_list": "no NPU equivalent (use torch.npu.get_device_name)",
    "is_tf32_supported": "torch.npu.matmul.allow_hf32 (HF32, not TF32)",
    "nccl": "torch.distributed with the 'hccl' backend",
    "OutOfMemoryError": "torch.OutOfMemoryError (what the NPU raises too)",
}

# Import roots of CUDA-only libraries -> what to use with torch_npu. Longest match wins.
CUDA_LIBRARIES = {
    "flash_attn": "torch_npu.npu_fusion_attention (or torch.nn.functional.scaled_dot_product_attention)",
    "apex.optimizers.FusedAdam": "torch_npu.optim.NpuFusedAdamW (adam_w_mode=True) / NpuFusedAdam",
    "apex.optimizers.FusedLAMB": "torch_npu.optim.NpuFusedLamb",
    "apex.optimizers.FusedSGD": "torch_npu.optim.NpuFusedSGD",
    "apex.optimizers": "torch_npu.optim.NpuFused* optimizers",
    "apex.normalization.FusedRMSNorm": "torch_npu.npu_rms_norm",
    "apex.normalization.fused_layer_norm": "torch_npu.npu_rms_norm (RMSNorm) / torch.nn.LayerNorm",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization": "torch_npu.npu_rms_norm / torch.nn.LayerNorm",
    "apex.amp": "torch.autocast('npu') with torch.npu.amp.GradScaler",
    "apex": "no apex build for torch_npu: replace each component (torch_npu.optim, torch_npu.npu_rms_norm, "
            "torch.autocast('npu'))",
    "xformers": "torch_npu.npu_fusion_attention (memory-efficient attention)",
    "bitsandbytes": "torch_npu quantization ops (npu_quantize, npu_weight_quant_batchmatmul); manual port",
    "triton": "Triton kernels need an NPU implementation (Ascend C, or triton-ascend); manual port",
    "torch.utils.cpp_extension.CUDAExtension": "an NPU custom op (Ascend C) built with torch.utils.cpp_extension."
                                               "CppExtension + torch.library; manual port",
    "torch.utils.cpp_extension.CUDA_HOME": "ASCEND_HOME_PATH (CANN toolkit); manual port",
    "cupy": "torch tensors on the NPU; manual port",
    "pycuda": "torch.npu runtime APIs; manual port",
    "pynvml": "torch.npu.utilization / torch.npu.mem_get_info (or npu-smi); manual port",
}
