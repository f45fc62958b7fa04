#!/usr/bin/env python3
"""A GLM-5.3-Flash-shaped random model for engine/bench/qwen3_next_prefill.sh (SHAPE=glm5_next):
the release's KDA heads (64 x 128, a 4-tap convolution on q, k and v, the -5 safe gate), DSA
dimensions (64 heads, NoPE, nope 256, v 256, q LoRA 1536, kv LoRA 512; the k-pool indexer of 32
heads of 128, pools of 16, top 2048) and 4 residual streams (20 Sinkhorn iterations) at a
smaller width and depth (hidden 1024, 8 layers: KDA, KDA, KDA, DSA, KDA, KDA, KDA, DSA as the
release's pattern; a dense first layer, then 32 experts of 256 top-4 plus a shared expert),
random weights from transformers 5.25's own initialization (the hyper-connection projections
re-drawn at std 0.02 and the indexer's pooling parameters at 0.02 / 0: its `_init_weights`
leaves them as initialized). Written in the names transformers' conversion mapping reads (its
`save_pretrained` output, renamed back: `attn_hc.*` -> `hc_attn_*`, `forget_gate.*` ->
`self_attn.*`, the concatenated `conv1d` split into `{q,k,v}_conv1d`, fused experts split).
Usage: python glm5_next_shape.py OUT_DIR"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

out = sys.argv[1]
torch.manual_seed(0)
layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
text = dict(
    vocab_size=8192, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256, num_hidden_layers=8,
    num_attention_heads=64, num_key_value_heads=64, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=0,
    qk_nope_head_dim=256, v_head_dim=256, n_routed_experts=32, num_experts_per_tok=4, n_shared_experts=1,
    routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True, layer_types=layer_types,
    mlp_layer_types=["dense"] + ["sparse"] * 7, indexer_types=["full"] * 8, index_topk=2048, index_head_dim=128,
    index_n_heads=32, index_kpool=16, swiglu_limit=10.0,
    linear_attn_config={"num_heads": 64, "head_dim": 128, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0},
    hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, max_position_embeddings=8192, tie_word_embeddings=False,
    pad_token_id=0, eos_token_id=2, model_type="glm5_next_text")
vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": 1024,
          "projection_intermediate_size": 32}
cfg = transformers.Glm5NextConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
m = transformers.Glm5NextForConditionalGeneration(cfg).to(torch.bfloat16)
sd = {}
with torch.no_grad():
    for k, v in m.state_dict().items():
        if k.startswith("model.visual."):
            continue
        if k.endswith(("_hc.fn",)):
            v = (torch.randn(v.shape) * 0.02).to(torch.float32)
        elif k.endswith(("_hc.base", "_hc.scale", "A_log", "dt_bias", "e_score_correction_bias", "gate.weight")):
            v = v.to(torch.float32)
        elif k.endswith("index_kpool_compress_gate"):
            v = (torch.randn(v.shape) * 0.02).to(torch.bfloat16)
        for a in ("attn", "ffn"):
            for b in ("fn", "base", "scale"):
                k = k.replace(f"{a}_hc.{b}", f"hc_{a}_{b}")
        k = k.replace("self_attn.forget_gate.", "self_attn.")
        if k.endswith("self_attn.conv1d.weight"):
            p = k[: -len("conv1d.weight")]
            for x, part in zip("qkv", v.float().chunk(3, dim=0)):
                sd[f"{p}{x}_conv1d.weight"] = part.contiguous()
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                sd[f"{p}{e}.gate_proj.weight"] = v[e, :i].contiguous()
                sd[f"{p}{e}.up_proj.weight"] = v[e, i:].contiguous()
            continue
        if k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                sd[f"{p}{e}.down_proj.weight"] = v[e].contiguous()
            continue
        sd[k] = v.contiguous()
os.makedirs(out, exist_ok=True)
save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
c = cfg.to_dict()
c["architectures"] = ["Glm5NextForConditionalGeneration"]
json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)
print("wrote", out, sum(t.numel() for t in sd.values()) / 1e6, "M parameters")
