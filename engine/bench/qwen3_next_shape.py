#!/usr/bin/env python3
"""A Qwen3-Next-shaped random model for engine/bench/qwen3_next_prefill.sh: the release's
linear-attention heads (Hk 16 x dk 128, Hv 32 x dv 128, a 4-tap convolution) and attention
heads (16 / 2 of 256, partial rotary 0.25) at a smaller width and depth (hidden 1024, 8 layers:
6 Gated DeltaNet, 2 gated full attention; 32 experts of 256 top-4 plus a shared expert),
random weights from transformers 5.25's own initialization, saved by `save_pretrained` (the
published per-expert layout). Usage: python qwen3_next_shape.py OUT_DIR"""
import sys

import torch
import transformers

out = sys.argv[1]
torch.manual_seed(0)
cfg = transformers.Qwen3NextConfig(
    vocab_size=8192, hidden_size=1024, intermediate_size=1024, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=32, moe_intermediate_size=256, shared_expert_intermediate_size=256,
    num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=8192,
    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
m = transformers.Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(out)
print("wrote", out, sum(p.numel() for p in m.parameters()) / 1e6, "M parameters")
