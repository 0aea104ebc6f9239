"""Model FLOPs utilization: the share of a GPU's dense fp16/bf16 tensor peak the training uses.

MFU = model FLOPs per token x tokens/s / peak. Model FLOPs per token (training: forward and backward,
no recomputation) = 6 x parameters (those of matrix products: an embedding that is not also the
output projection is a lookup, lookup_params) + 12 x model dimension x sentence length x attention layers
(attention's score and value products, which the parameter count misses: encoder self-attention,
decoder self- and encoder-attention). NVML's utilization counts a kernel waiting on the network as
busy; MFU does not, which is why the report answers "were the GPUs fully used?" from both.

The peaks are NVIDIA's published dense (no sparsity) fp16/bf16 tensor-core figures, by the name NVML
reports; any other GPU is "peak unknown", never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..recipe.params import ARCH_DIMS, preset_params

# TFLOP/s, dense fp16/bf16 tensor cores (fp32 accumulate), from NVIDIA's data sheets.
PEAK_TFLOPS: dict[str, float] = {
    "Tesla V100-SXM2-16GB": 125.0,
    "Tesla V100-SXM2-32GB": 125.0,
    "Tesla V100-PCIE-16GB": 112.0,
    "Tesla V100-PCIE-32GB": 112.0,
    "Tesla V100S-PCIE-32GB": 130.0,
    "Tesla T4": 65.0,
    "NVIDIA A10": 125.0,
    "NVIDIA A30": 165.0,
    "NVIDIA A40": 149.7,
    "NVIDIA L4": 121.0,
    "NVIDIA L40": 181.05,
    "NVIDIA L40S": 362.05,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 80GB HBM3": 989.4,  # H100 SXM5
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.4,
    "NVIDIA H200 NVL": 835.0,
}


# MiB of GPU memory as NVML reports it (nvidia-smi's memory.total) for the cards above: the lowest
# seen across drivers and ECC settings (an A100 40GB says 40,536 or 40,960). For planning and the
# memory model's tests (train.plan.batch); a run uses what its probe reads on the host.
MEMORY_MIB: dict[str, int] = {
    "Tesla V100-SXM2-16GB": 16160,
    "Tesla V100-SXM2-32GB": 32510,
    "Tesla V100-PCIE-16GB": 16160,
    "Tesla V100-PCIE-32GB": 32510,
    "Tesla V100S-PCIE-32GB": 32510,
    "Tesla T4": 15109,
    "NVIDIA A10": 23028,
    "NVIDIA A30": 24258,
    "NVIDIA A40": 46068,
    "NVIDIA L4": 23034,
    "NVIDIA L40": 46068,
    "NVIDIA L40S": 46068,
    "NVIDIA A100-PCIE-40GB": 40536,
    "NVIDIA A100 80GB PCIe": 81251,
    "NVIDIA A100-SXM4-40GB": 40536,
    "NVIDIA A100-SXM4-80GB": 81251,
    "NVIDIA H100 PCIe": 81559,
    "NVIDIA H100 80GB HBM3": 81559,
    "NVIDIA H100 NVL": 95830,
    "NVIDIA H200": 143771,
    "NVIDIA H200 NVL": 143771,
}


def peak_tflops(gpu_name: str | None) -> float | None:
    """The GPU's dense fp16/bf16 peak, or None ("peak unknown")."""
    return PEAK_TFLOPS.get((gpu_name or "").strip())


def lookup_params(options: Mapping[str, object], vocab: int) -> int:
    """Parameters used only as tables (an embedding lookup multiplies nothing): the source and target
    embeddings where not shared with the output projection, and learned positions. With all
    embeddings shared the one matrix is the output projection's, a matrix product."""
    arch = ARCH_DIMS.get(str(options.get("arch", "transformer")), ARCH_DIMS["transformer"])
    d = int(options.get("encoder_embed_dim") or arch["embed_dim"])  # type: ignore[call-overload]
    tables = 0
    if not options.get("share_all_embeddings"):
        tables += vocab * d  # the encoder's
        if not options.get("share_decoder_input_output_embed"):
            tables += vocab * d  # the decoder's input; its output projection is another matrix
    if options.get("encoder_learned_pos"):
        tables += 2 * (int(options.get("max_source_positions") or 1024) + 2) * d  # type: ignore[call-overload]
    return tables


def flops_per_token(options: Mapping[str, object], vocab: int, sentence_tokens: float = 30.0) -> float:
    """Training FLOPs per (target) token: 6 x the parameters of matrix products (lookup_params left
    out) + 12 x d x length x attention layers."""
    arch = ARCH_DIMS.get(str(options.get("arch", "transformer")), ARCH_DIMS["transformer"])
    d = int(options.get("encoder_embed_dim") or arch["embed_dim"])  # type: ignore[call-overload]
    enc = int(options.get("encoder_layers") or arch["encoder_layers"])  # type: ignore[call-overload]
    dec = int(options.get("decoder_layers") or arch["decoder_layers"])  # type: ignore[call-overload]
    products = preset_params(options, vocab) - lookup_params(options, vocab)
    return 6.0 * products + 12.0 * d * sentence_tokens * (enc + 2 * dec)


def mfu(tokens_per_s: float, flops_token: float, gpus: int, gpu_name: str | None) -> float | None:
    """The fraction of `gpus` GPUs' peak that `tokens_per_s` (the whole run's) uses; None: peak unknown."""
    peak = peak_tflops(gpu_name)
    if peak is None or gpus < 1:
        return None
    return tokens_per_s * flops_token / (gpus * peak * 1e12)


SENTENCE_TOKENS = 27.0  # a WMT16 en-de sentence's target tokens (the attention term's length) when unknown


def of_run(options: Mapping[str, object], vocab: int, tokens_per_s: float | None, gpus: int,
           gpu_name: str | None, sentence_tokens: float = SENTENCE_TOKENS) -> float | None:
    """A run's MFU from its logged words/s (all ranks) over its `gpus` GPUs; None: no figure or peak."""
    if not tokens_per_s or not gpu_name:
        return None
    return mfu(tokens_per_s, flops_per_token(options, vocab, sentence_tokens), gpus, gpu_name)


def mfu_text(value: float | None, gpu_name: str | None = None) -> str:
    """`MFU 41%`, or `MFU: peak unknown (NAME)`."""
    if value is None:
        return f"MFU: peak unknown ({gpu_name})" if gpu_name else "MFU: peak unknown"
    return f"MFU {value:.0%}"


def beside_wps(options: Mapping[str, object], vocab: int, tokens_per_s: float | None, gpus: int,
               gpu_name: str | None) -> str:
    """What a view says beside a run's words/s (all ranks) on `gpus` GPUs: `MFU 24%`, or
    `MFU: peak unknown (NAME)`; nothing on a CPU run (no peak to measure against) or before the
    first logged words/s."""
    if gpus < 1 or not tokens_per_s:
        return ""
    return mfu_text(of_run(options, vocab, tokens_per_s, gpus, gpu_name), gpu_name)
