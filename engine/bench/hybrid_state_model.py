#!/usr/bin/env python3
"""A random Qwen3-Next checkpoint whose linear-attention layers have the released heads
(Qwen3-Next-80B-A3B / Qwen3.6-35B-A3B: 16 key heads and 32 value heads of 128, a 4-tap
convolution) on a small residual stream, for measuring a sequence's state in resident memory
(`engine/bench/hybrid_state_rss.sh`): 8 layers (6 Gated DeltaNet, 2 gated full attention with 2
KV heads of 256), hidden 256, 8 experts of 64 top-2. Weights from transformers 5.25's own random
initialization (seed 44), saved by `save_pretrained` (BF16; transformers 5's fused expert
layout, which the converter reads). Routing and outputs are meaningless: only the state's size
matters here.

Usage: ``python hybrid_state_model.py OUT_DIR``.
"""

import sys

import torch
import transformers


def main(out):
    torch.manual_seed(44)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=256, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts_per_tok=2,
        num_experts=8, norm_topk_prob=True, mlp_only_layers=[],
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    model = transformers.Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main(sys.argv[1])
