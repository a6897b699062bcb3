"""TF Serving's session settings mapped onto TensorFlow's own runtime settings.

tensorflow_model_server gives each model a Session built from a ConfigProto (from
--tensorflow_session_config_file, the parallelism flags, --per_process_gpu_memory_fraction
or a --platform_config_file) and rewrites its graph for --mixed_precision=bfloat16. Here
the models share TensorFlow's eager context, so the same settings go to `tf.config` once,
before the first model loads. What has no counterpart is named in one line each.
"""

from __future__ import annotations

from collections.abc import Callable

# RewriterConfig toggles that tf.config.optimizer.set_experimental_options takes by the same name.
_REWRITES = ("layout_optimizer", "constant_folding", "shape_optimization", "remapping", "arithmetic_optimization",
             "dependency_optimization", "loop_optimization", "function_optimization", "debug_stripper",
             "scoped_allocator_optimization", "pin_to_host_optimization", "implementation_selector",
             "auto_mixed_precision", "auto_mixed_precision_onednn_bfloat16", "auto_mixed_precision_mkl",
             "auto_mixed_precision_cpu")
_HANDLED = {"intra_op_parallelism_threads", "inter_op_parallelism_threads", "gpu_options", "device_count",
            "allow_soft_placement", "log_device_placement", "graph_options", "use_per_session_threads"}


def apply(cfg, log: Callable[[str], None]) -> None:
    """Apply a SessionBundleConfig's session_config and mixed_precision to TensorFlow."""
    import tensorflow as tf

    sc = cfg.session_config
    if sc.intra_op_parallelism_threads:
        tf.config.threading.set_intra_op_parallelism_threads(sc.intra_op_parallelism_threads)
    if sc.inter_op_parallelism_threads:
        tf.config.threading.set_inter_op_parallelism_threads(sc.inter_op_parallelism_threads)
    _gpus(tf, sc, log)
    if sc.allow_soft_placement:
        tf.config.set_soft_device_placement(True)
    if sc.log_device_placement:
        tf.debugging.set_log_device_placement(True)
    jit = sc.graph_options.optimizer_options.global_jit_level
    if jit in (1, 2):  # ON_1, ON_2
        tf.config.optimizer.set_jit("autoclustering")
    elif jit == -1:  # OFF
        tf.config.optimizer.set_jit(False)
    rewrites = {}
    ro = sc.graph_options.rewrite_options
    for name in _REWRITES:
        if hasattr(ro, name) and getattr(ro, name):  # 1 ON, 2 OFF (RewriterConfig.Toggle)
            rewrites[name] = getattr(ro, name) in (1, 3)  # ON or AGGRESSIVE
    if ro.disable_meta_optimizer:
        rewrites["disable_meta_optimizer"] = True
    if cfg.mixed_precision:
        if cfg.mixed_precision == "bfloat16":
            rewrites["auto_mixed_precision_onednn_bfloat16"] = True
            log("Running inference with bfloat16 auto mixed precision")
        else:
            log(f"{cfg.mixed_precision} auto mixed precision is not supported. Valid option: bfloat16")
    if rewrites:
        tf.config.optimizer.set_experimental_options(rewrites)
    unused = sorted(f.name for f, _ in sc.ListFields() if f.name not in _HANDLED)
    if unused:
        log(f"session config fields without a TensorFlow runtime setting here, ignored: {', '.join(unused)}")


def _gpus(tf, sc, log: Callable[[str], None]) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    opts = sc.gpu_options
    wants_gpu_setting = (opts.per_process_gpu_memory_fraction > 0 or opts.allow_growth
                         or opts.visible_device_list or "GPU" in sc.device_count)
    if not gpus:
        if wants_gpu_setting:
            log("no GPU is visible to TensorFlow: the GPU settings of the session config have nothing to apply to")
        return
    if "GPU" in sc.device_count:
        gpus = gpus[:sc.device_count["GPU"]]
    if opts.visible_device_list:
        gpus = [gpus[int(i)] for i in opts.visible_device_list.split(",") if i.strip()]
    tf.config.set_visible_devices(gpus, "GPU")
    for i, gpu in enumerate(gpus):
        if opts.per_process_gpu_memory_fraction > 0:
            total = _gpu_memory_mb(i)
            if total:
                limit = int(total * opts.per_process_gpu_memory_fraction)
                tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)])
                log(f"GPU {i}: TensorFlow may use {limit} MiB ({opts.per_process_gpu_memory_fraction:g} of {total} MiB)")
                continue
            log(f"GPU {i}: its memory size is unknown (NVML unavailable); per_process_gpu_memory_fraction not applied")
        if opts.allow_growth:
            tf.config.experimental.set_memory_growth(gpu, True)


def _gpu_memory_mb(index: int) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total // 2**20
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 (no NVML: the caller says so)
        return 0
