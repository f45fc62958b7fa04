#!/usr/bin/env python3
"""A Kimi-Linear-shaped random model for engine/bench/qwen3_next_prefill.sh (SHAPE=kimi_linear):
the release's KDA heads (32 x 128, a 4-tap convolution on q, k and v) and MLA dimensions (32
heads, nope 128, rope 64 (unrotated), v 128, kv_lora 512, no q LoRA) at a smaller width and depth
(hidden 1024, 8 layers: KDA, KDA, KDA, MLA, KDA, KDA, KDA, MLA as the release's pattern; a dense
first layer, then 32 experts of 256 top-4 plus a shared expert), random weights from
transformers 5.25's own initialization. Written in the published names (transformers'
`save_pretrained` names the dense layer's MLP `block_sparse_moe.*`: renamed back to `mlp.*`).
Usage: python kimi_linear_shape.py OUT_DIR"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

out = sys.argv[1]
torch.manual_seed(0)
cfg = transformers.KimiLinearConfig(
    vocab_size=8192, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256, num_hidden_layers=8,
    num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
    qk_nope_head_dim=128, v_head_dim=128, num_experts=32, num_experts_per_token=4, num_shared_experts=1,
    routed_scaling_factor=2.446, moe_renormalize=True, num_expert_group=1, topk_group=1,
    linear_attn_config={"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7], "num_heads": 32,
                        "head_dim": 128, "short_conv_kernel_size": 4},
    first_k_dense_replace=1, model_max_length=8192, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
    eos_token_id=2)
m = transformers.KimiLinearForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(out)
# Published names for the dense layer's MLP.
for f in sorted(os.listdir(out)):
    if f.endswith(".safetensors"):
        p = os.path.join(out, f)
        sd = load_file(p)
        sd = {k.replace("model.layers.0.block_sparse_moe.", "model.layers.0.mlp."): v for k, v in sd.items()}
        save_file(sd, p, metadata={"format": "pt"})
idx = os.path.join(out, "model.safetensors.index.json")
if os.path.exists(idx):
    j = json.load(open(idx))
    j["weight_map"] = {k.replace("model.layers.0.block_sparse_moe.", "model.layers.0.mlp."): v
                       for k, v in j["weight_map"].items()}
    json.dump(j, open(idx, "w"), indent=2)
print("wrote", out, sum(p.numel() for p in m.parameters()) / 1e6, "M parameters")
